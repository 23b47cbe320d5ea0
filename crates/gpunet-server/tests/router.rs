//! Router tests without sockets: the real router and owner task over an in-memory store.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpunet_server::{build, http::router, Config};
use gpunet_store::MemoryStore;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;

struct App {
    router: axum::Router,
}

impl App {
    async fn new() -> App {
        App::on(Path::new("/nonexistent"), Arc::new(MemoryStore::new()))
    }

    /// A server on this data directory (task logs) and store.
    fn on(dir: &Path, store: Arc<MemoryStore>) -> App {
        App::with_tokens(dir, store, "admin", "join")
    }

    /// A server started with these admin and join tokens.
    fn with_tokens(dir: &Path, store: Arc<MemoryStore>, admin: &str, join: &str) -> App {
        App::with_config(dir, store, admin, join, |_| {})
    }

    /// A server started with these tokens and the configuration `edit` makes.
    fn with_config(
        dir: &Path,
        store: Arc<MemoryStore>,
        admin: &str,
        join: &str,
        edit: impl FnOnce(&mut Config),
    ) -> App {
        let mut cfg = Config::new(dir.to_path_buf());
        // These tests are about the API: queue order is submission order (FIFO with backfill, the default before `auto`).
        cfg.sched = gpunet_core::SchedConfig { backfill: true, ..gpunet_core::SchedConfig::default() };
        cfg.admin_token = Some(admin.into());
        cfg.join_token = Some(join.into());
        cfg.max_body_bytes = 64 * 1024;
        edit(&mut cfg);
        let (state, _, _) = build(&cfg, store).unwrap();
        App { router: router(state) }
    }

    async fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<String>) -> (StatusCode, Value) {
        let mut r = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        let req = r.body(body.map(Body::from).unwrap_or_else(Body::empty)).unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, v)
    }

    async fn tenant(&self, name: &str, quota: Option<Value>) -> String {
        let mut body = json!({"name": name});
        if let Some(q) = quota {
            body["quota"] = q;
        }
        let (s, v) = self.call("POST", "/v1/tenants", Some("admin"), Some(body.to_string())).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["token"].as_str().unwrap().to_string()
    }

    /// Submits `body` with `token`, which must be accepted; returns the job's id.
    async fn submit(&self, token: &str, body: &str) -> u64 {
        let (s, v) = self.call("POST", "/v1/jobs", Some(token), Some(body.into())).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_u64().unwrap()
    }

    /// Registers a node with the join token; returns the node's own credential.
    async fn node(&self, name: &str, gpus: usize) -> String {
        self.node_with(name, gpus, "join").await
    }

    async fn node_with(&self, name: &str, gpus: usize, token: &str) -> String {
        let (s, v) = self.call("POST", "/v1/nodes", Some(token), Some(node_body(name, gpus))).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["name"], name, "{v}");
        v["credential"].as_str().unwrap().to_string()
    }

    async fn sync(&self, node: &str, token: &str, report: Value) -> (StatusCode, Value) {
        self.call("POST", &format!("/v1/agents/{node}/sync"), Some(token), Some(report.to_string())).await
    }
}

fn node_body(name: &str, gpus: usize) -> String {
    let g: Vec<Value> =
        (0..gpus).map(|_| json!({"model": "A100-80GB", "numa": 0, "nvlink_domain": 0, "pcie_switch": 0})).collect();
    json!({"spec": {"name": name, "gpus": g, "cpu": 64000, "mem": 524288, "labels": {"zone": "z1"},
                    "price_per_gpu_hour": 2.0}, "fake": true})
    .to_string()
}

/// Polls the job until it is in `state` (generous deadline for a loaded machine).
async fn wait_state(app: &App, id: u64, state: &str) {
    let t = std::time::Instant::now();
    loop {
        let (_, j) = app.call("GET", &format!("/v1/jobs/{id}"), Some("admin"), None).await;
        if j["state"] == state {
            return;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "job-{id} never {state}: {j}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn err(v: &Value) -> (&str, Option<&str>) {
    (v["error"]["code"].as_str().unwrap_or("?"), v["error"]["field"].as_str())
}

#[tokio::test]
async fn submit_schedule_explain_cancel_and_bill() {
    let app = App::new().await;
    let a = app.tenant("team-a", Some(json!({"guarantee_gpus": 2, "limit_gpus": 2}))).await;
    app.node("n1", 4).await;
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some("name: one\ngpus: 2\ncommand: [\"true\"]\n".into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_u64().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (_, j) = app.call("GET", &format!("/v1/jobs/{id}"), Some(&a), None).await;
    assert_eq!(j["state"], "running", "{j}");
    assert_eq!(j["placement"][0]["node"], "n1");
    // A second job exceeds the quota of 2 GPUs: explain names it.
    let (_, v2) = app.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "two", "gpus": 1}"#.into())).await;
    let id2 = v2["id"].as_u64().unwrap();
    let (s, e) = app.call("GET", &format!("/v1/jobs/job-{id2}/explain"), Some(&a), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(e["message"].as_str().unwrap().contains("team-a uses 2 of 2 guaranteed gpus"), "{e}");
    let (_, ev) = app.call("GET", &format!("/v1/jobs/{id}/events"), Some(&a), None).await;
    let kinds: Vec<&str> = ev.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["submitted", "started"]);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (s, c) = app.call("POST", &format!("/v1/jobs/{id}/cancel"), Some(&a), None).await;
    assert_eq!((s, c["state"].as_str()), (StatusCode::OK, Some("cancelled")));
    let (_, bill) = app.call("GET", "/v1/usage", Some(&a), None).await;
    assert!(bill["tenants"]["team-a"]["gpu_hours"].as_f64().unwrap() > 0.0, "{bill}");
    assert!(bill["by_model"]["A100-80GB/on-demand"]["cost"].as_f64().unwrap() > 0.0, "{bill}");
    let (_, sum) = app.call("GET", "/v1/cluster", Some(&a), None).await;
    assert_eq!(sum["gpus_total"], 4);
    let (s, page) = app.call("GET", "/v1/jobs?state=cancelled&limit=10", Some(&a), None).await;
    assert_eq!((s, page["jobs"].as_array().unwrap().len()), (StatusCode::OK, 1));
}

#[tokio::test]
async fn tenants_are_isolated_on_every_endpoint() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let b = app.tenant("team-b", None).await;
    app.node("n1", 8).await;
    let (_, v) = app.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "secret-a", "gpus": 1}"#.into())).await;
    let id = v["id"].as_u64().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for (m, p) in [
        ("GET", format!("/v1/jobs/{id}")),
        ("POST", format!("/v1/jobs/{id}/cancel")),
        ("GET", format!("/v1/jobs/{id}/events")),
        ("GET", format!("/v1/jobs/{id}/explain")),
    ] {
        // Another tenant's job is answered like a missing one: its existence is not revealed.
        let (s, v) = app.call(m, &p, Some(&b), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{m} {p}: {v}");
        assert!(!v.to_string().contains("secret-a"));
    }
    let (_, page) = app.call("GET", "/v1/jobs", Some(&b), None).await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 0);
    let (s, _) = app.call("GET", "/v1/jobs?tenant=team-a", Some(&b), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (_, ts) = app.call("GET", "/v1/tenants", Some(&b), None).await;
    assert_eq!(ts.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect::<Vec<_>>(), ["team-b"]);
    let (_, ns) = app.call("GET", "/v1/nodes", Some(&b), None).await;
    assert_eq!(ns[0]["jobs"].as_array().unwrap().len(), 0, "no other tenant's job ids on nodes");
    let (_, bill) = app.call("GET", "/v1/usage", Some(&b), None).await;
    assert!(bill["tenants"].get("team-a").is_none() && bill["jobs"].as_object().unwrap().is_empty(), "{bill}");
    let (s, _) = app.call("GET", "/v1/usage?tenant=team-a", Some(&b), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) =
        app.call("POST", "/v1/jobs", Some(&b), Some(r#"{"name": "x", "gpus": 1, "tenant": "team-a"}"#.into())).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    for (m, p, body) in [
        ("POST", "/v1/tenants", Some(r#"{"name": "evil"}"#)),
        ("PUT", "/v1/tenants/team-a/quota", Some(r#"{"guarantee_gpus": 99}"#)),
        ("POST", "/v1/tenants/team-a/tokens", None),
        ("POST", "/v1/nodes/n1/drain", None),
        ("GET", "/metrics", None),
    ] {
        let (s, _) = app.call(m, p, Some(&b), body.map(String::from)).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{m} {p}");
    }
    // Missing and wrong tokens.
    for t in [None, Some("nope")] {
        let (s, v) = app.call("GET", "/v1/jobs", t, None).await;
        assert_eq!((s, err(&v).0), (StatusCode::UNAUTHORIZED, "unauthorized"));
    }
    // The join token only registers nodes.
    let (s, _) = app.call("GET", "/v1/jobs", Some("join"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bad_input_is_4xx_with_a_field() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    // method, path, body, status, error code, field
    type Case<'a> = (&'a str, &'a str, String, u16, &'a str, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        ("POST", "/v1/jobs", r#"{"name": "x", "gpus": "many"}"#.into(), 422, "invalid_field", Some("gpus")),
        (
            "POST",
            "/v1/jobs",
            r#"{"name": "x", "gpus": 1, "colour": "red"}"#.into(),
            422,
            "unknown_field",
            Some("colour"),
        ),
        ("POST", "/v1/jobs", r#"{"gpus": 1}"#.into(), 422, "missing_field", Some("name")),
        ("POST", "/v1/jobs", "{not json".into(), 400, "parse_error", None),
        ("POST", "/v1/jobs", r#"{"name": "x", "gpus": 1, "tasks": 0}"#.into(), 422, "invalid_field", Some("tasks")),
        (
            "POST",
            "/v1/jobs",
            r#"{"name": "x", "gpus": 1, "topology": "galaxy"}"#.into(),
            422,
            "invalid_field",
            Some("topology"),
        ),
        ("POST", "/v1/jobs", "x".repeat(70 * 1024), 413, "too_large", None),
        ("POST", "/v1/jobs/batch", r#"{"name": "x"}"#.into(), 422, "invalid_field", Some("body")),
        ("GET", "/v1/jobs?limit=0", String::new(), 422, "invalid_field", Some("limit")),
        ("GET", "/v1/jobs?colour=red", String::new(), 422, "unknown_field", Some("colour")),
        ("GET", "/v1/jobs?state=sleeping", String::new(), 422, "invalid_field", Some("state")),
        ("GET", "/v1/jobs/banana", String::new(), 422, "invalid_field", Some("id")),
        ("GET", "/v1/jobs/999", String::new(), 404, "not_found", None),
        ("GET", "/v1/nowhere", String::new(), 404, "not_found", None),
    ];
    for (m, p, body, status, code, field) in cases {
        let (s, v) = app.call(m, p, Some(&a), if body.is_empty() { None } else { Some(body) }).await;
        assert_eq!(s.as_u16(), status, "{m} {p}: {v}");
        assert_eq!(err(&v), (code, field), "{m} {p}: {v}");
    }
    // Admin-only bad input.
    let (s, v) = app.call("POST", "/v1/tenants", Some("admin"), Some(r#"{"name": "bad name!"}"#.into())).await;
    assert_eq!((s.as_u16(), err(&v)), (422, ("invalid_field", Some("name"))));
    let (s, v) = app
        .call(
            "PUT",
            "/v1/tenants/team-a/quota",
            Some("admin"),
            Some(r#"{"guarantee_gpus": 8, "limit_gpus": 4}"#.into()),
        )
        .await;
    assert_eq!((s.as_u16(), err(&v).0), (422, "invalid_field"), "{v}");
    let (s, v) = app.call("POST", "/v1/nodes", Some("admin"), Some(r#"{"spec": 1}"#.into())).await;
    assert_eq!((s.as_u16(), err(&v).0), (400, "parse_error"), "{v}");
    let (s, _) = app.call("POST", "/v1/nodes/ghost/cordon", Some("admin"), None).await;
    assert_eq!(s.as_u16(), 404);
    let (s, v) = app.call("POST", "/v1/nodes/ghost/explode", Some("admin"), None).await;
    assert_eq!((s.as_u16(), err(&v).1), (422, Some("action")));
}

#[tokio::test]
async fn kubernetes_manifests_are_accepted_unchanged() {
    let app = App::new().await;
    app.tenant("team-a", None).await;
    let quota = include_str!("../../gpunet-api/tests/fixtures/k8s-resourcequota.yaml");
    let (s, v) = app.call("PUT", "/v1/tenants/team-a/quota", Some("admin"), Some(quota.into())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["quota"]["guarantee_gpus"], 16);
    let job = include_str!("../../gpunet-api/tests/fixtures/k8s-job.yaml");
    let (s, v) = app.call("POST", "/v1/jobs?tenant=team-a", Some("admin"), Some(job.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let w = v["warnings"].as_array().unwrap();
    assert!(w.iter().any(|x| x.as_str().unwrap().contains("affinity is misplaced")), "{v}");
    let (_, j) = app.call("GET", &format!("/v1/jobs/{}", v["id"]), Some("admin"), None).await;
    assert_eq!((j["gpus"].as_u64(), j["name"].as_str()), (Some(2), Some("resnet50-train")));
}

#[tokio::test]
async fn the_openapi_document_matches_the_committed_copy() {
    let app = App::new().await;
    let (s, v) = app.call("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let committed: Value = serde_json::from_str(include_str!("../../../openapi.json")).unwrap();
    assert_eq!(v, committed, "the API changed: regenerate openapi.json (cargo run -q -p gpunet-server --example dump_openapi > openapi.json) and review the diff");
    for path in v["paths"].as_object().unwrap().keys() {
        assert!(path.starts_with("/v1/") || path == "/metrics", "{path}");
    }
}

/// Every body in the document has a schema (no untyped bodies), every operation documents its errors, and every
/// documented path is a route of the router (and the reverse for the API's routes, checked by name).
#[tokio::test]
async fn the_openapi_document_types_every_body_and_names_only_real_routes() {
    let app = App::new().await;
    let (_, v) = app.call("GET", "/v1/openapi.json", None, None).await;
    assert!(v["components"]["schemas"].as_object().unwrap().len() >= 40, "schemas generated from the wire types");
    let mut ops = 0;
    for (path, item) in v["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops += 1;
            let what = format!("{method} {path}");
            for (status, r) in op["responses"].as_object().unwrap() {
                for (ct, c) in r["content"].as_object().into_iter().flatten() {
                    assert!(c["schema"].is_object(), "{what}: the {status} {ct} body has no schema");
                }
                if status.starts_with('2') {
                    assert!(r["content"].is_object(), "{what}: the {status} response has no body");
                }
            }
            for (ct, c) in op["requestBody"]["content"].as_object().into_iter().flatten() {
                assert!(c["schema"].is_object(), "{what}: the {ct} request body has no schema");
            }
            let public = path == "/v1/health" || path == "/v1/openapi.json";
            if !public {
                for status in ["401", "403", "404", "413", "422", "429", "503"] {
                    assert!(op["responses"][status].is_object(), "{what}: no {status}");
                }
            }
            // The route exists: a request to it is not answered "no such route" (the event stream never ends).
            if path == "/v1/events" {
                continue;
            }
            let uri = path.replace("{action}", "cordon").replace(['{', '}'], "");
            let (_, body) = app.call(&method.to_uppercase(), &uri, Some("admin"), None).await;
            assert!(!body.to_string().contains("no such route"), "{what} is documented but not routed: {body}");
        }
    }
    assert!(ops >= 29, "{ops} operations");
}

/// `openapi-spec-validator` (PyPI; `.ci/run` installs it into `target/ci-venv`) accepts the document. Where it is
/// missing the test says it skipped, except under CI=true.
#[test]
fn the_openapi_document_passes_openapi_spec_validator() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = root.join("target/ci-venv/bin/openapi-spec-validator");
    let exe = std::env::var_os("OPENAPI_SPEC_VALIDATOR")
        .map(std::path::PathBuf::from)
        .or_else(|| venv.exists().then_some(venv))
        .unwrap_or_else(|| "openapi-spec-validator".into());
    let o = match std::process::Command::new(&exe).arg(root.join("openapi.json")).output() {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "openapi-spec-validator must be installed under CI ({}: {e}); .ci/run installs it",
                exe.display()
            );
            eprintln!("skipped: openapi-spec-validator is not installed (pip install openapi-spec-validator)");
            return;
        }
    };
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("OK"),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test]
async fn no_client_input_gets_a_5xx() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    // A seeded stream of malformed and mutated bodies against every body-taking endpoint.
    let seeds = [
        r#"{"name": "x", "gpus": 1, "tasks": 2, "topology": "rack", "estimated_duration": "1h"}"#,
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: a}\nspec: {template: {spec: {containers: [{name: c}]}}}\n",
        r#"[{"name": "a", "gpus": 1}]"#,
        r#"{"guarantee_gpus": 4, "limit_gpus": 8}"#,
        r#"{"spec": {"name": "n", "gpus": [], "cpu": 1, "mem": 1, "labels": {}, "price_per_gpu_hour": 0}}"#,
    ];
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let endpoints = [
        ("POST", "/v1/jobs", a.as_str()),
        ("POST", "/v1/jobs/batch", a.as_str()),
        ("POST", "/v1/jobs/dry-run", a.as_str()),
        ("PUT", "/v1/tenants/team-a/quota", "admin"),
        ("POST", "/v1/tenants", "admin"),
        ("POST", "/v1/nodes", "admin"),
    ];
    for i in 0..600 {
        let seed = seeds[(rnd() % seeds.len() as u64) as usize];
        let mut b: Vec<u8> = seed.as_bytes().to_vec();
        for _ in 0..(rnd() % 4) {
            let pos = (rnd() as usize) % b.len().max(1);
            match rnd() % 3 {
                0 if !b.is_empty() => b[pos] = (rnd() % 256) as u8,
                0 => {}
                1 => {
                    b.truncate(pos);
                }
                _ => {
                    let alphabet = b"{}[]:,\"-9e99\0";
                    b.insert(pos, alphabet[(rnd() % alphabet.len() as u64) as usize])
                }
            }
        }
        let (m, p, t) = endpoints[i % endpoints.len()];
        let body = String::from_utf8_lossy(&b).into_owned();
        let (s, v) = app.call(m, p, Some(t), Some(body.clone())).await;
        assert!(s.as_u16() < 500, "{m} {p} with {body:?}: {s} {v}");
        if s.is_client_error() {
            assert!(v["error"]["code"].is_string() && v["error"]["message"].is_string(), "{v}");
        }
    }
}

#[tokio::test]
async fn portal_apis_queue_in_policy_order_and_mask_other_tenants() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let b = app.tenant("team-b", None).await;
    app.node("n1", 2).await;
    let (_, who) = app.call("GET", "/v1/whoami", Some("admin"), None).await;
    assert_eq!((&who["role"], who.get("tenant")), (&json!("admin"), None), "{who}");
    let (_, who) = app.call("GET", "/v1/whoami", Some(&b), None).await;
    assert_eq!((&who["role"], &who["tenant"]), (&json!("tenant"), &json!("team-b")), "{who}");
    let (s, v) = app.call("GET", "/v1/whoami", Some("join"), None).await;
    assert_eq!((s, err(&v).0), (StatusCode::FORBIDDEN, "forbidden"));

    let holder = app.submit(&a, r#"{"name": "hold", "gpus": 2, "estimated_duration": "10m"}"#).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let first = app.submit(&a, r#"{"name": "a-next", "gpus": 1, "estimated_duration": "1h"}"#).await;
    let second = app.submit(&b, r#"{"name": "b-next", "gpus": 1, "estimated_duration": "1m"}"#).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;

    // The admin's view has the tenants' submissions from the next build on (a read waits only for its own token's).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let q = loop {
        let (s, q) = app.call("GET", "/v1/queue", Some("admin"), None).await;
        assert_eq!(s, StatusCode::OK, "{q}");
        if q["queue_length"] == 2 || std::time::Instant::now() > deadline {
            break q;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(q["queue_length"], 2, "{q}");
    let ids: Vec<u64> = q["entries"].as_array().unwrap().iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![first, second], "FIFO order: {q}");
    for (i, e) in q["entries"].as_array().unwrap().iter().enumerate() {
        assert_eq!(e["position"], i);
        let eta = e["eta_ms"].as_u64().unwrap_or_else(|| panic!("no ETA: {e}"));
        // Both start when the 10-minute holder ends.
        assert!(eta >= now + 9 * 60_000 && eta <= now + 11 * 60_000, "{e}");
        assert!(e["message"].as_str().unwrap().contains("capacity"), "{e}");
    }
    // A tenant sees its own entries with their places in the whole queue.
    let (_, qb) = app.call("GET", "/v1/queue", Some(&b), None).await;
    assert_eq!(qb["entries"].as_array().unwrap().len(), 1, "{qb}");
    assert_eq!((qb["entries"][0]["id"].as_u64(), qb["entries"][0]["position"].as_u64()), (Some(second), Some(1)));
    let (s, v) = app.call("GET", "/v1/queue?limit=0", Some("admin"), None).await;
    assert_eq!((s, err(&v)), (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_field", Some("limit"))), "{v}");

    // Per-GPU allocation: the owner's tenant sees the job, another tenant only that the GPU is taken.
    let (_, na) = app.call("GET", "/v1/nodes", Some(&a), None).await;
    let (_, nb) = app.call("GET", "/v1/nodes", Some(&b), None).await;
    for i in 0..2 {
        assert_eq!(na[0]["devices"][i]["job"].as_u64(), Some(holder), "{na}");
        assert_eq!(na[0]["devices"][i]["tenant"], "team-a");
        assert_eq!(nb[0]["devices"][i]["allocated"], true, "{nb}");
        assert!(nb[0]["devices"][i].get("job").is_none() && nb[0]["devices"][i].get("tenant").is_none(), "{nb}");
        assert!(na[0]["devices"][i].get("utilization_pct").is_none(), "fake GPUs report no utilisation");
    }

    let (s, h) = app.call("GET", "/v1/cluster/history", Some(&b), None).await;
    assert_eq!(s, StatusCode::OK);
    let p = &h.as_array().unwrap()[0];
    assert!(p["at_ms"].as_u64().unwrap() > 0 && p.get("gpus_allocated").is_some() && p.get("queue_length").is_some());
}

/// A job behind another tenant's blocked head (FIFO without backfill): `why` names the head to the admin and calls it
/// another tenant's job to the tenant, and names no tenant to either (it named the explained job's own tenant, as if
/// the head's, and so told the tenant "another tenant's job … (tenant team-b)" of its own name).
#[tokio::test]
async fn a_blocked_head_of_another_tenant_is_named_to_the_admin_only_and_no_tenant_is() {
    let app = App::with_config(Path::new("/nonexistent"), Arc::new(MemoryStore::new()), "admin", "join", |c| {
        c.sched = gpunet_core::SchedConfig::with_policy(gpunet_core::Policy::Fifo);
    });
    let a = app.tenant("team-a", None).await;
    let b = app.tenant("team-b", None).await;
    app.node("n1", 4).await;
    let holder = app.submit(&a, r#"{"name": "hold", "gpus": 2, "estimated_duration": "1h"}"#).await;
    wait_state(&app, holder, "running").await;
    let head = app.submit(&a, r#"{"name": "wide", "gpus": 4, "estimated_duration": "1h"}"#).await;
    let behind = app.submit(&b, r#"{"name": "narrow", "gpus": 1, "estimated_duration": "1m"}"#).await;
    let why = |tok: String| {
        let app = &app;
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let (s, e) = app.call("GET", &format!("/v1/jobs/{behind}/explain"), Some(&tok), None).await;
                assert_eq!(s, StatusCode::OK, "{e}");
                let m = e["message"].as_str().unwrap().to_string();
                if m.contains("blocks the queue") || std::time::Instant::now() > deadline {
                    return m;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    let admin = why("admin".into()).await;
    assert_eq!(admin, format!("order: 1 jobs ahead under fifo; job-{head} does not fit and blocks the queue"));
    let tenant = why(b.clone()).await;
    assert!(tenant.ends_with("another tenant's job does not fit and blocks the queue"), "{tenant}");
    assert!(!tenant.contains("team-") && !tenant.contains(&format!("job-{head}")), "{tenant}");
}

#[tokio::test]
async fn the_portal_is_served_from_the_binary() {
    let app = App::new().await;
    for (path, ct) in [("/", "text/html"), ("/portal/app.js", "text/javascript"), ("/portal/style.css", "text/css")] {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
        let resp = app.router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with(ct), "{path}");
        assert!(resp.headers().contains_key("content-security-policy"), "{path}");
    }
    let req = Request::builder().uri("/portal/nope.js").body(Body::empty()).unwrap();
    assert_eq!(app.router.clone().oneshot(req).await.unwrap().status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn gpu_samples_from_an_agent_reach_metrics_and_the_node_view() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let g: Vec<Value> =
        (0..2).map(|_| json!({"model": "H200-141GB", "numa": 0, "nvlink_domain": 0, "pcie_switch": 0})).collect();
    let body = json!({"spec": {"name": "gpu1", "gpus": g, "cpu": 64000, "mem": 524288, "labels": {"zone": "z1"},
                               "price_per_gpu_hour": 3.0}, "fake": false});
    let (s, v) = app.call("POST", "/v1/nodes", Some("join"), Some(body.to_string())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let cred = v["credential"].as_str().unwrap().to_string();
    let (_, j) = app.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "t", "gpus": 1}"#.into())).await;
    let job = j["id"].as_u64().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let report = json!({"known_version": 0, "running": [], "exited": [], "checkpoint_failures": 2, "gpu_samples": [
        {"index": 0, "utilization_pct": 87.0, "memory_used_mib": 1024, "memory_total_mib": 143771,
         "power_watts": 412.5, "temperature_c": 61.0, "nvlink_tx_bytes": 2048, "nvlink_rx_bytes": 4096,
         "ecc_corrected": 5, "ecc_uncorrected": 1, "xid_errors": 3, "xid_last": 79},
        {"index": 1, "utilization_pct": 0.0, "memory_used_mib": 0}]});
    let (s, v) = app.call("POST", "/v1/agents/gpu1/sync", Some(&cred), Some(report.to_string())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, m) = app.call("GET", "/metrics", Some("admin"), None).await;
    let m = m.as_str().unwrap().to_string();
    for line in [
        format!("gpunet_gpu_utilization_ratio{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 0.87"),
        "gpunet_gpu_utilization_ratio{node=\"gpu1\",gpu=\"1\",model=\"H200-141GB\",job_id=\"\",fake=\"false\",zone=\"z1\"} 0".to_string(),
        format!(
            "gpunet_gpu_memory_used_bytes{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 1073741824"
        ),
        format!("gpunet_gpu_power_watts{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 412.5"),
        format!("gpunet_gpu_temperature_celsius{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 61"),
        format!("gpunet_gpu_nvlink_rx_bytes_total{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 4096"),
        "gpunet_gpu_allocated{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",fake=\"false\",zone=\"z1\"} 1".to_string(),
        format!(
            "gpunet_gpu_ecc_uncorrected_errors_total{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 1"
        ),
        format!(
            "gpunet_gpu_ecc_corrected_errors_total{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 5"
        ),
        format!("gpunet_gpu_xid_errors_total{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 3"),
        format!("gpunet_gpu_xid_last_code{{node=\"gpu1\",gpu=\"0\",model=\"H200-141GB\",job_id=\"{job}\",fake=\"false\",zone=\"z1\"}} 79"),
        "gpunet_checkpoint_copy_failures_total{node=\"gpu1\"} 2".to_string(),
        "gpunet_node_state{node=\"gpu1\",state=\"ready\"} 1".to_string(),
        "gpunet_tenant_gpus_allocated{tenant=\"team-a\"} 1".to_string(),
    ] {
        assert!(m.contains(&line), "missing {line} in\n{m}");
    }
    // GPU 1 reported no power: nothing is made up for it.
    assert!(!m.contains("gpunet_gpu_power_watts{node=\"gpu1\",gpu=\"1\""), "{m}");
    // Nor XID counts for a GPU whose driver delivers no XID events (absent, not 0).
    assert!(!m.contains("gpunet_gpu_xid_errors_total{node=\"gpu1\",gpu=\"1\""), "{m}");
    let (_, n) = app.call("GET", "/v1/nodes", Some(&a), None).await;
    assert_eq!(n[0]["devices"][0]["utilization_pct"], 87.0, "{n}");
    assert_eq!(n[0]["devices"][0]["memory_used_mib"], 1024);
    assert_eq!(n[0]["fake"], false);
}

/// The join token was the agents' only credential: its holder could sync as any node and read every task's command
/// and environment (other tenants' secrets). Now it only registers.
#[tokio::test]
async fn the_join_token_cannot_sync_or_read_a_nodes_tasks() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let cred = app.node("n1", 2).await;
    let spec = r#"{"name": "s", "gpus": 1, "command": ["true"], "env": {"API_KEY": "sekrit-a"}}"#;
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(spec.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_u64().unwrap();
    wait_state(&app, id, "running").await;
    for token in ["join", "admin", a.as_str()] {
        let (s, v) = app.sync("n1", token, json!({"known_version": 0, "running": [], "exited": []})).await;
        assert_eq!((s, err(&v).0), (StatusCode::FORBIDDEN, "forbidden"), "{token}: {v}");
        assert!(!v.to_string().contains("sekrit-a"), "{v}");
    }
    // The node's own credential gets the task, and nothing user-facing.
    let (s, v) = app.sync("n1", &cred, json!({"known_version": 0, "running": [], "exited": []})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["tasks"][0]["env"]["API_KEY"], "sekrit-a", "{v}");
    for (m, p) in [("GET", "/v1/jobs"), ("GET", "/v1/whoami"), ("GET", "/v1/nodes")] {
        let (s, _) = app.call(m, p, Some(&cred), None).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{m} {p}");
    }
    // Not a tenant either: it cannot register nodes.
    let (s, _) = app.call("POST", "/v1/nodes", Some(&a), Some(node_body("evil", 1))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The join token cannot take a known node's name over (it would get a fresh credential, the node's tasks and
    // their secrets, and could set its price): 409, and the node's own credential keeps working.
    let body = node_body("n1", 1).replace(r#""fake": true"#, r#""fake": true, "price_per_gpu_hour": 0"#);
    let (s, v) = app.call("POST", "/v1/nodes", Some("join"), Some(body)).await;
    assert_eq!((s, err(&v).0), (StatusCode::CONFLICT, "conflict"), "{v}");
    assert!(v.get("credential").is_none() && !v.to_string().contains("sekrit-a"), "{v}");
    let (s, v) = app.sync("n1", &cred, json!({"known_version": 0, "running": [], "exited": []})).await;
    assert_eq!((s, &v["tasks"][0]["env"]["API_KEY"]), (StatusCode::OK, &json!("sekrit-a")), "{v}");
    // Its own credential re-registers it (an agent's restart), and so does the admin (recovery of a lost credential).
    let cred = app.node_with("n1", 2, &cred).await;
    let (s, _) = app.sync("n1", &cred, json!({"known_version": 0, "running": [], "exited": []})).await;
    assert_eq!(s, StatusCode::OK);
    app.node_with("n1", 2, "admin").await;
}

/// With the shared join token, one node could sync as another, forge a task exit for another tenant's job and append
/// lines to another tenant's log, even for a node that does not exist.
#[tokio::test]
async fn a_node_credential_cannot_sync_as_another_node_forge_an_exit_or_append_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::on(dir.path(), Arc::new(MemoryStore::new()));
    let b_tenant = app.tenant("team-b", None).await;
    let cred_b = app.node("node-b", 1).await;
    let (_, v) = app.call("POST", "/v1/jobs", Some(&b_tenant), Some(r#"{"name": "victim", "gpus": 1}"#.into())).await;
    let victim = v["id"].as_u64().unwrap();
    wait_state(&app, victim, "running").await;
    let cred_a = app.node("node-a", 1).await;
    let task = json!({"job": victim, "rank": 0, "attempt": 0});
    let forged = json!({"known_version": 0, "running": [], "exited": [{"task": task, "code": 1, "signal": null}],
        "logs": [{"task": task, "offset": 0, "data_base64": "Rk9SR0VEIExJTkUK"}],
        "started": [{"task": task, "pid": 1, "at_ms": 1}], "checkpoints": [[task, 1]]});
    // As node B, with A's credential: refused.
    let (s, v) = app.sync("node-b", &cred_a, forged.clone()).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    // As a node that does not exist: refused.
    let (s, _) = app.sync("ghost", &cred_a, forged.clone()).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // As itself, reporting on B's task: accepted, and ignored.
    let (s, v) = app.sync("node-a", &cred_a, forged.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["tasks"], json!([]), "nothing of another node's tasks: {v}");
    let (_, j) = app.call("GET", &format!("/v1/jobs/{victim}"), Some("admin"), None).await;
    assert_eq!(j["state"], "running", "the forged exit was applied: {j}");
    let (_, ev) = app.call("GET", &format!("/v1/jobs/{victim}/events"), Some("admin"), None).await;
    let kinds: Vec<&str> = ev.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["submitted", "started"], "forged start or checkpoint events: {ev}");
    let (s, log) = app.call("GET", &format!("/v1/jobs/{victim}/logs"), Some(&b_tenant), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(!log.to_string().contains("FORGED"), "{log}");
    // B's own agent still reports normally: its log line lands and its exit ends the job.
    let own = json!({"known_version": 0, "running": [], "exited": [{"task": task, "code": 0, "signal": null}],
        "logs": [{"task": task, "offset": 0, "data_base64": "cmVhbCBsaW5lCg=="}]});
    let (s, v) = app.sync("node-b", &cred_b, own).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_state(&app, victim, "succeeded").await;
    let (_, log) = app.call("GET", &format!("/v1/jobs/{victim}/logs"), Some(&b_tenant), None).await;
    assert_eq!(log, Value::String("real line\n".into()));
}

/// Registering a node again (an agent coming back, or a new machine with the same name) replaces its credential: the
/// old one stops working at once. The credential survives a server restart (only its hash is stored).
#[tokio::test]
async fn registering_a_node_again_rotates_its_credential_which_survives_a_restart() {
    let store = Arc::new(MemoryStore::new());
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let empty = json!({"known_version": 0, "running": [], "exited": []});
    let first = app.node("n1", 1).await;
    let (s, _) = app.sync("n1", &first, empty.clone()).await;
    assert_eq!(s, StatusCode::OK);
    let second = app.node_with("n1", 1, &first).await;
    assert_ne!(first, second);
    let (s, v) = app.sync("n1", &first, empty.clone()).await;
    assert_eq!((s, err(&v).0), (StatusCode::UNAUTHORIZED, "unauthorized"), "{v}");
    // A node re-registers itself with its own credential, never another node.
    let other = app.node("n2", 1).await;
    let (s, _) = app.call("POST", "/v1/nodes", Some(&other), Some(node_body("n1", 1))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let third = app.node_with("n1", 1, &second).await;
    let (s, _) = app.sync("n1", &second, empty.clone()).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // After a restart on the same store, the current credential works and the old ones do not.
    let again = App::on(Path::new("/nonexistent"), store.clone());
    let (s, v) = again.sync("n1", &third, empty.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    for old in [&first, &second] {
        let (s, _) = again.sync("n1", old, empty.clone()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let stored = format!("{:?}", gpunet_store::Store::load(&*store).unwrap());
    assert!(!stored.contains(&third) && stored.contains(&gpunet_server::hash_token(&third)), "only the hash is stored");
}

/// A node already lost when the server stopped: its running job's tasks are fenced again from the restart, and the
/// fence times out (the job's attempt ends and it waits to run again) — it was never put back in the fence list, and
/// its job stayed running, holding its GPUs, for good.
#[tokio::test]
async fn a_node_lost_before_a_restart_has_its_fence_time_out_after_it() {
    use std::time::Duration;
    let store = Arc::new(MemoryStore::new());
    let first = App::with_config(Path::new("/nonexistent"), store.clone(), "admin", "join", |c| {
        c.node_lost_after = Duration::from_millis(300);
        c.node_fence_after = Duration::from_secs(3600);
    });
    let a = first.tenant("team-a", None).await;
    let cred = first.node("n1", 1).await;
    let (s, v) = first.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "j", "gpus": 1}"#.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_u64().unwrap();
    wait_state(&first, id, "running").await;
    // Its agent syncs once (the node's tasks are real processes from now on), then is never heard of again.
    let (s, v) = first.sync("n1", &cred, json!({"known_version": 0, "running": [], "exited": []})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    async fn n1(app: &App) -> Value {
        let (_, list) = app.call("GET", "/v1/nodes", Some("admin"), None).await;
        list.as_array().and_then(|a| a.iter().find(|n| n["name"] == "n1").cloned()).unwrap_or_default()
    }
    let t = std::time::Instant::now();
    loop {
        let n = n1(&first).await;
        if n["state"] == "lost" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "n1 never lost: {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, j) = first.call("GET", &format!("/v1/jobs/{id}"), Some("admin"), None).await;
    assert_eq!(j["state"], "running", "fenced, not ended: {j}");
    // The restart (the fence now 0.5 s): the fence times out and the job is free to run again.
    let again = App::with_config(Path::new("/nonexistent"), store.clone(), "admin", "join", |c| {
        c.node_lost_after = Duration::from_millis(300);
        c.node_fence_after = Duration::from_millis(500);
    });
    let t = std::time::Instant::now();
    loop {
        let (_, j) = again.call("GET", &format!("/v1/jobs/{id}"), Some("admin"), None).await;
        if j["state"] != "running" {
            assert!(j["attempts"][0]["ended_ms"].is_u64(), "{j}");
            assert_eq!(j["attempts"][0]["outcome"], "node_lost", "{j}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the lost node's fence never timed out: {j}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = n1(&again).await;
    assert_eq!((n["free_gpus"].as_u64(), n["jobs"].as_array().map(Vec::len)), (Some(1), Some(0)), "{n}");
}

/// A restart with a new --admin-token kept the old one working (tokens could not be rotated), and every `gpunet up`
/// start added another join token.
#[tokio::test]
async fn a_new_admin_or_join_token_replaces_the_old_one_after_a_restart() {
    let store = Arc::new(MemoryStore::new());
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let (s, ops) =
        app.call("POST", "/v1/tokens", Some("admin"), Some(json!({"role": "admin", "user": "ops"}).to_string())).await;
    assert_eq!(s, StatusCode::CREATED, "{ops}");
    let ops = ops["token"].as_str().unwrap().to_string();
    let again = App::with_tokens(Path::new("/nonexistent"), store.clone(), "admin-2", "join-2");
    let (s, _) = again.call("GET", "/v1/whoami", Some("admin"), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the replaced admin token still works");
    for t in ["admin-2", ops.as_str()] {
        let (s, v) = again.call("GET", "/v1/whoami", Some(t), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, _) = again.call("POST", "/v1/nodes", Some("join"), Some(node_body("n1", 1))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the replaced join token still registers");
    again.node_with("n1", 1, "join-2").await;
    let (_, list) = again.call("GET", "/v1/tokens", Some("admin-2"), None).await;
    let roles: Vec<(&str, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["role"].as_str().unwrap(), t["user"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(roles.iter().filter(|(r, _)| *r == "join").count(), 1, "{list}");
    assert_eq!(roles.iter().filter(|(r, _)| *r == "admin").count(), 2, "{list}");
    let stored = format!("{:?}", gpunet_store::Store::load(&*store).unwrap());
    assert!(!stored.contains(&gpunet_server::hash_token("admin")), "the old admin token's hash is gone");
    for secret in ["admin-2", "join-2", ops.as_str()] {
        assert!(!stored.contains(secret) && !list.to_string().contains(secret), "a secret is stored or listed");
    }
}

/// Tokens could not be revoked, named a tenant rather than a person, and jobs did not say who submitted them.
#[tokio::test]
async fn tokens_are_per_user_revocable_expiring_and_scoped_to_a_tenant_admin() {
    let app = App::new().await;
    let team_a = app.tenant("team-a", None).await; // the tenant's first token administers it
    let team_b = app.tenant("team-b", None).await;
    app.node("n1", 2).await;
    let create = |token: String, body: Value| {
        let app = &app;
        async move { app.call("POST", "/v1/tokens", Some(&token), Some(body.to_string())).await }
    };
    let (s, alice) = create(team_a.clone(), json!({"role": "tenant", "user": "alice"})).await;
    assert_eq!(s, StatusCode::CREATED, "{alice}");
    assert_eq!((alice["tenant"].as_str(), alice["user"].as_str()), (Some("team-a"), Some("alice")));
    let alice = alice["token"].as_str().unwrap().to_string();
    // alice's job says she submitted it.
    let (s, v) = app.call("POST", "/v1/jobs", Some(&alice), Some(r#"{"name": "x", "gpus": 1}"#.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, j) = app.call("GET", &format!("/v1/jobs/{}", v["id"]), Some(&team_a), None).await;
    assert_eq!(j["submitted_by"], "alice", "{j}");
    // The tenant's own job, and a listing by user finds alice's alone (from its own list, not a walk of every job).
    let (s, mine) = app.call("POST", "/v1/jobs", Some(&team_a), Some(r#"{"name": "y", "gpus": 1}"#.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{mine}");
    let (_, page) = app.call("GET", "/v1/jobs?user=alice", Some(&team_a), None).await;
    let ids: Vec<u64> = page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!((ids, &page["total"]), (vec![v["id"].as_u64().unwrap()], &json!(1)), "{page}");
    let (_, page) = app.call("GET", "/v1/jobs?user=alice&state=succeeded", Some(&team_a), None).await;
    assert_eq!(page["total"], 0, "{page}");
    let (_, page) = app.call("GET", "/v1/jobs?user=nobody", Some("admin"), None).await;
    assert_eq!(page["total"], 0, "{page}");
    // whoami says which token it is: alice, a member of team-a; team-a's first token, its admin.
    let (_, who) = app.call("GET", "/v1/whoami", Some(&alice), None).await;
    assert_eq!(
        (&who["role"], &who["tenant"], &who["token"]["user"]),
        (&json!("tenant"), &json!("team-a"), &json!("alice"))
    );
    assert_eq!(who["token"]["role"], "tenant", "{who}");
    let (_, who) = app.call("GET", "/v1/whoami", Some(&team_a), None).await;
    assert_eq!(who["token"]["role"], "tenant-admin", "{who}");
    assert!(who["token"].get("token").is_none(), "whoami never shows a secret: {who}");
    // A tenant admin manages only its own tenant's tokens, never admin or join ones; a member manages none.
    for (token, body) in [
        (&team_a, json!({"role": "admin", "user": "x"})),
        (&team_a, json!({"role": "join", "user": "x"})),
        (&team_a, json!({"role": "tenant", "user": "x", "tenant": "team-b"})),
        (&alice, json!({"role": "tenant", "user": "x"})),
    ] {
        let (s, v) = create(token.clone(), body.clone()).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}: {v}");
    }
    let (s, _) = app.call("GET", "/v1/tokens?tenant=team-b", Some(&team_a), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = app.call("GET", "/v1/tokens", Some(&alice), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, list) = app.call("GET", "/v1/tokens", Some(&team_a), None).await;
    assert_eq!(s, StatusCode::OK);
    let list = list.as_array().unwrap().clone();
    assert_eq!(list.len(), 2, "{list:?}");
    assert!(list.iter().all(|t| t["tenant"] == "team-a" && t.get("token").is_none()), "{list:?}");
    let alice_id = list.iter().find(|t| t["user"] == "alice").unwrap()["id"].as_str().unwrap().to_string();
    // team-b's admin cannot revoke it; team-a's can, and it stops working at once.
    let (s, _) = app.call("POST", &format!("/v1/tokens/{alice_id}/revoke"), Some(&team_b), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = app.call("POST", &format!("/v1/tokens/{alice_id}/revoke"), Some(&team_a), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) = app.call("GET", "/v1/jobs", Some(&alice), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // An expiring token stops working by itself.
    let (s, short) =
        create("admin".into(), json!({"role": "tenant", "tenant": "team-b", "user": "bob", "expires_in": "1s"})).await;
    assert_eq!(s, StatusCode::CREATED, "{short}");
    let short = short["token"].as_str().unwrap().to_string();
    let t = std::time::Instant::now();
    loop {
        let (s, _) = app.call("GET", "/v1/jobs", Some(&short), None).await;
        if s == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(s, StatusCode::OK);
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "the token never expired");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The last admin token cannot be revoked (no lock-out).
    let (_, all) = app.call("GET", "/v1/tokens", Some("admin"), None).await;
    let admin_id = all.as_array().unwrap().iter().find(|t| t["role"] == "admin").unwrap()["id"].clone();
    let (s, v) =
        app.call("POST", &format!("/v1/tokens/{}/revoke", admin_id.as_str().unwrap()), Some("admin"), None).await;
    assert_eq!((s, err(&v).0), (StatusCode::CONFLICT, "conflict"), "{v}");
}

/// Fair share's decayed usage was kept only in memory: a restart forgot every tenant's history. It is stored with the
/// tenant (at each attempt's end and with every allocation sample) and restored at start.
#[tokio::test]
async fn a_tenants_fair_share_usage_survives_a_restart() {
    let store = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let app = App::on(dir.path(), store.clone());
    let t = app.tenant("team-a", None).await;
    app.node("n1", 4).await;
    let (_, v) = app.call("POST", "/v1/jobs", Some(&t), Some(r#"{"name": "burn", "gpus": 4}"#.into())).await;
    let id = v["id"].as_u64().unwrap();
    wait_state(&app, id, "running").await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await; // accrue some GPU time
    let (s, _) = app.call("POST", &format!("/v1/jobs/{id}/cancel"), Some(&t), None).await;
    assert_eq!(s, StatusCode::OK);
    wait_state(&app, id, "cancelled").await;
    let usage = |v: &Value| v[0]["fair_share_usage_gpu_hours"].as_f64().unwrap();
    let (_, before) = app.call("GET", "/v1/tenants", Some("admin"), None).await;
    let before = usage(&before);
    assert!(before > 0.0, "4 GPUs for 0.4 s: {before}");
    drop(app);
    let app = App::on(dir.path(), store);
    let (_, after) = app.call("GET", "/v1/tenants", Some("admin"), None).await;
    let after = usage(&after);
    // The same, less the decay of a few milliseconds (the half-life is hours).
    assert!((after - before).abs() <= before * 0.01, "before {before} GPU-h, after the restart {after} GPU-h");
}

/// Agents never sent a price, so every node cost 0 and live bills showed 0.00. A node is priced when it registers:
/// by its agent's override, else by the price catalogue for its GPU model and `lifecycle` label (a price in the spec
/// is not the node's to set); the override survives a restart; a bad one is a 422 naming the field.
#[tokio::test]
async fn a_node_is_priced_by_its_agent_s_override_else_by_the_catalogue_and_a_bad_override_is_refused() {
    use gpunet_core::{GpuModel, Lifecycle, PriceCatalogue};
    let store = Arc::new(MemoryStore::new());
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let cat = PriceCatalogue::shipped();
    let a100 = |l| cat.gpu_hour(GpuModel::A100_80GB, l);
    let body = |name: &str, lifecycle: Option<&str>, price: Option<Value>| {
        let mut b: Value = serde_json::from_str(&node_body(name, 2)).unwrap();
        if let Some(l) = lifecycle {
            b["spec"]["labels"]["lifecycle"] = l.into();
        }
        if let Some(p) = price {
            b["price_per_gpu_hour"] = p;
        }
        b.to_string()
    };
    let cases = [
        ("od", None, None, a100(Lifecycle::OnDemand)),
        ("spot", Some("spot"), None, a100(Lifecycle::Spot)),
        ("reserved", Some("reserved"), None, a100(Lifecycle::Reserved)),
        ("own", Some("spot"), Some(json!(5.5)), 5.5),
        ("free", None, Some(json!(0)), 0.0),
    ];
    for (name, lifecycle, price, want) in cases.clone() {
        let (s, v) = app.call("POST", "/v1/nodes", Some("join"), Some(body(name, lifecycle, price))).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["price_per_gpu_hour"].as_f64(), Some(want), "{name}: {v}");
    }
    assert!(a100(Lifecycle::Spot) < a100(Lifecycle::Reserved) && a100(Lifecycle::Reserved) < a100(Lifecycle::OnDemand));
    for bad in [json!(-1.0), json!(1e7)] {
        let (s, v) = app.call("POST", "/v1/nodes", Some("join"), Some(body("bad", None, Some(bad.clone())))).await;
        assert_eq!(
            (s, err(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_field", Some("price_per_gpu_hour"))),
            "{v}"
        );
    }
    let (s, v) = app.call("POST", "/v1/nodes", Some("join"), Some(body("bad", None, Some(json!("cheap"))))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let prices = |v: &Value| -> Vec<(String, f64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|n| (n["name"].as_str().unwrap().to_string(), n["price_per_gpu_hour"].as_f64().unwrap()))
            .collect()
    };
    let (_, nodes) = app.call("GET", "/v1/nodes", Some("admin"), None).await;
    let mut want: Vec<(String, f64)> = cases.iter().map(|c| (c.0.to_string(), c.3)).collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(prices(&nodes), want, "a refused registration registers nothing");
    // Registering again with another override prices the node again.
    let (s, v) = app.call("POST", "/v1/nodes", Some("admin"), Some(body("own", Some("spot"), Some(json!(1.25))))).await;
    assert_eq!((s, v["price_per_gpu_hour"].as_f64()), (StatusCode::CREATED, Some(1.25)), "{v}");
    // After a restart on the same store, overrides hold and the others are the catalogue's.
    let again = App::on(Path::new("/nonexistent"), store);
    let (_, nodes) = again.call("GET", "/v1/nodes", Some("admin"), None).await;
    let own = want.iter_mut().find(|n| n.0 == "own").unwrap();
    own.1 = 1.25;
    assert_eq!(prices(&nodes), want);
}

#[tokio::test]
async fn arrays_expand_within_their_limit_and_dependencies_wait_then_fail_with_a_reason() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let b = app.tenant("team-b", None).await;
    app.node("n1", 4).await;
    let body = r#"{"name": "sweep", "gpus": 1, "array": "0-9:3%2", "command": ["true"]}"#;
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(body.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let arr = v["id"].as_u64().unwrap();
    // Indices 0, 3, 6, 9: elements are jobs arr+1..=arr+4; two run at once, the next ones are not jobs yet.
    wait_state(&app, arr + 2, "running").await;
    let (_, j) = app.call("GET", &format!("/v1/jobs/{arr}"), Some(&a), None).await;
    assert_eq!(j["state"], "running", "{j}");
    assert_eq!((j["array"]["total"].as_u64(), j["array"]["live"].as_u64()), (Some(4), Some(2)), "{j}");
    let (s, _) = app.call("GET", &format!("/v1/jobs/{}", arr + 3), Some(&a), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the third element is not expanded while two are live");
    let (_, e) = app.call("GET", &format!("/v1/jobs/{arr}/explain"), Some(&a), None).await;
    assert!(e["message"].as_str().unwrap().contains("limit (%2)"), "{e}");
    let (_, el) = app.call("GET", &format!("/v1/jobs/{}", arr + 2), Some(&a), None).await;
    assert_eq!((el["array_job_id"].as_u64(), el["array_index"].as_u64()), (Some(arr), Some(3)), "{el}");
    // A dependency on the array: waits, explained; another tenant naming it gets "no such job", like a missing id.
    let dep = format!(r#"{{"name": "reduce", "gpus": 1, "dependency": "afterok:{arr}"}}"#);
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(dep.clone())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let red = v["id"].as_u64().unwrap();
    let (_, e) = app.call("GET", &format!("/v1/jobs/{red}/explain"), Some(&a), None).await;
    assert_eq!(e["reason"]["kind"], "dependency", "{e}");
    assert!(e["message"].as_str().unwrap().contains(&format!("afterok job-{arr} (running)")), "{e}");
    // Its dry run waits for the array too (it was answered as if the job had no dependency: "fits now"); one naming
    // another tenant's job is refused as the submission is.
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(dep.clone())).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["message"], format!("dependency: waits for afterok job-{arr} (running)"), "{d}");
    assert!(d["eta_ms"].is_null() && d.get("placement").is_none_or(|p| p == &json!([])), "{d}");
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&b), Some(dep.clone())).await;
    assert_eq!((s, err(&d)), (StatusCode::NOT_FOUND, ("not_found", Some("dependency"))), "{d}");
    // An array depending on one element (`ID[INDEX]`, index 9: job arr+4, not expanded yet) names its first element
    // by index, as `why` names the submitted array's head; a singleton waits for the running array of its name.
    let el_dep = format!(r#"{{"name": "post", "gpus": 1, "array": "4,8", "dependency": "afterok:{arr}[9]"}}"#);
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(el_dep.clone())).await;
    let waits = format!("dependency: waits for afterok job-{} (pending)", arr + 4);
    assert_eq!((s, d["message"].as_str()), (StatusCode::OK, Some(format!("next element 4: {waits}").as_str())), "{d}");
    assert!(d["eta_ms"].is_null() && d.get("placement").is_none_or(|p| p == &json!([])), "{d}");
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(el_dep)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let post = v["id"].as_u64().unwrap();
    let (_, e) = app.call("GET", &format!("/v1/jobs/{post}/explain"), Some(&a), None).await;
    let m = e["message"].as_str().unwrap();
    assert!(m.starts_with(&format!("next element job-{}: ", post + 1)) && m.ends_with(&waits), "{e}");
    let single = r#"{"name": "sweep", "gpus": 1, "dependency": "singleton"}"#;
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(single.into())).await;
    let running = format!("singleton job-{} (running), singleton job-{} (running)", arr + 1, arr + 2);
    assert_eq!(
        (s, d["message"].as_str()),
        (StatusCode::OK, Some(format!("dependency: waits for {running}").as_str())),
        "{d}"
    );
    // Another tenant's jobs of that name are none of its singleton's.
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&b), Some(single.into())).await;
    assert_eq!(
        (s, d["message"].as_str()),
        (StatusCode::OK, Some("this job fits now and starts in the next scheduling pass")),
        "{d}"
    );
    let (s1, v1) = app.call("POST", "/v1/jobs", Some(&b), Some(dep.clone())).await;
    let (s2, v2) =
        app.call("POST", "/v1/jobs", Some(&b), Some(dep.replace(&format!("afterok:{arr}"), "afterok:99999"))).await;
    assert_eq!((s1, err(&v1)), (StatusCode::NOT_FOUND, ("not_found", Some("dependency"))), "{v1}");
    assert_eq!(
        (s2, v2["error"]["message"].as_str().unwrap().replace("job-99999", &format!("job-{arr}"))),
        (s1, v1["error"]["message"].as_str().unwrap().to_string()),
        "another tenant's job reads exactly like a missing one"
    );
    // Another tenant can neither see nor cancel the array or its elements.
    for path in [format!("/v1/jobs/{arr}"), format!("/v1/jobs/{}", arr + 1), format!("/v1/jobs/{arr}/explain")] {
        let (s, _) = app.call("GET", &path, Some(&b), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _) = app.call("POST", &format!("/v1/jobs/{arr}/cancel"), Some(&b), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Cancelling one element lets the next start; cancelling the array ends it and fails the dependent.
    let (s, _) = app.call("POST", &format!("/v1/jobs/{}/cancel", arr + 1), Some(&a), None).await;
    assert_eq!(s, StatusCode::OK);
    wait_state(&app, arr + 3, "running").await;
    let (s, _) = app.call("POST", &format!("/v1/jobs/{arr}/cancel"), Some(&a), None).await;
    assert_eq!(s, StatusCode::OK);
    wait_state(&app, arr, "cancelled").await;
    wait_state(&app, red, "failed").await;
    let (_, r) = app.call("GET", &format!("/v1/jobs/{red}"), Some(&a), None).await;
    assert_eq!(
        r["end_reason"],
        format!("dependency afterok job-{arr} can never be satisfied: job-{arr} ended cancelled"),
        "{r}"
    );
    let (_, e) = app.call("GET", &format!("/v1/jobs/{red}/explain"), Some(&a), None).await;
    assert!(e["message"].as_str().unwrap().contains("can never be satisfied"), "{e}");
    let (_, ev) = app.call("GET", &format!("/v1/jobs/{red}/events"), Some(&a), None).await;
    assert!(ev.as_array().unwrap().iter().any(|e| e["kind"] == "failed"), "{ev}");
}

#[tokio::test]
async fn array_elements_get_their_index_and_survive_a_restart() {
    let store = Arc::new(MemoryStore::new());
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let a = app.tenant("team-a", None).await;
    let cred = app.node("n1", 2).await;
    let (_, v) = app
        .call(
            "POST",
            "/v1/jobs",
            Some(&a),
            Some(r#"{"name": "s", "gpus": 1, "array": "5,7,9", "command": ["true"]}"#.into()),
        )
        .await;
    let arr = v["id"].as_u64().unwrap();
    wait_state(&app, arr + 2, "running").await;
    let (_, waiting) = app
        .call(
            "POST",
            "/v1/jobs",
            Some(&a),
            Some(format!(r#"{{"name": "after", "gpus": 1, "dependency": "afterany:{arr}[9]"}}"#)),
        )
        .await;
    let after = waiting["id"].as_u64().unwrap();
    let (s, set) = app.sync("n1", &cred, json!({"known_version": 0, "running": [], "exited": []})).await;
    assert_eq!(s, StatusCode::OK, "{set}");
    let tasks = set["tasks"].as_array().unwrap();
    let mut idx: Vec<(String, String)> = tasks
        .iter()
        .map(|t| {
            (
                t["env"]["GPUNET_ARRAY_JOB_ID"].as_str().unwrap().into(),
                t["env"]["GPUNET_ARRAY_INDEX"].as_str().unwrap().into(),
            )
        })
        .collect();
    idx.sort();
    assert_eq!(idx, vec![(arr.to_string(), "5".into()), (arr.to_string(), "7".into())]);
    // After a restart the array, its elements and the waiting dependent come back as they were.
    let again = App::on(Path::new("/nonexistent"), store.clone());
    let (_, j) = again.call("GET", &format!("/v1/jobs/{arr}"), Some("admin"), None).await;
    assert_eq!((j["state"].as_str(), j["array"]["expanded"].as_u64()), (Some("pending"), Some(3)), "{j}");
    let (_, e) = again.call("GET", &format!("/v1/jobs/{after}/explain"), Some("admin"), None).await;
    assert!(e["message"].as_str().unwrap().contains(&format!("afterany job-{} (pending)", arr + 3)), "{e}");
    let (s, v) = again
        .call("POST", "/v1/jobs", Some("admin"), Some(r#"{"name": "x", "tenant": "team-a", "gpus": 1}"#.into()))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert!(v["id"].as_u64().unwrap() > after, "the array's ids stay reserved after a restart: {v}");
}

/// A dry run is answered from a copy of the state, its pass and replay off the owner: where a job would start now
/// on an idle node; on a full one, no placement, a start predicted from the running job's estimate, and a reason;
/// and nothing is queued by it.
#[tokio::test]
async fn a_dry_run_says_where_and_when_a_job_would_start_and_queues_nothing() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let b = app.tenant("team-b", None).await;
    app.node("n1", 4).await;
    let job = r#"{"name": "probe", "gpus": 2, "command": ["true"]}"#;
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(job.into())).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["placement"][0]["node"], "n1", "{d}");
    assert_eq!(d["placement"][0]["gpus"].as_array().unwrap().len(), 2, "{d}");
    // An array starts with its first element: where and when that one would (it said neither).
    let array = r#"{"name": "sweep", "gpus": 2, "array": "0-3", "command": ["true"]}"#;
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(array.into())).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["placement"][0]["node"], "n1", "{d}");
    assert!(d["eta_ms"].as_u64().is_some(), "{d}");
    // team-b fills the node for an hour (its estimate).
    let big = r#"{"name": "big", "gpus": 4, "command": ["sleep", "3600"], "estimated_duration": "1h"}"#;
    let (s, v) = app.call("POST", "/v1/jobs", Some(&b), Some(big.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    wait_state(&app, v["id"].as_u64().unwrap(), "running").await;
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(job.into())).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert!(d.get("placement").is_none_or(|p| p.as_array().unwrap().is_empty()), "{d}");
    let eta = d["eta_ms"].as_u64().unwrap_or_else(|| panic!("no start predicted: {d}"));
    assert!(eta >= before + 3_500_000 && eta <= before + 3_700_000, "start in about an hour: {eta} vs {before}: {d}");
    let msg = d["message"].as_str().unwrap();
    assert!(msg.contains("capacity"), "{d}");
    assert!(!msg.contains(&format!("job-{}", v["id"])), "another tenant's job is never named: {d}");
    let (_, page) = app.call("GET", "/v1/jobs", Some(&a), None).await;
    assert_eq!(page["total"], 0, "a dry run queues nothing: {page}");
}

/// Learned estimates are per tenant: a job that succeeded in one tenant teaches that tenant's dry runs (and
/// submissions) its run time, and nothing to another's, even for the same job name and GPU count.
#[tokio::test]
async fn a_tenant_learns_estimates_from_its_own_runs_only() {
    let app = App::new().await;
    let a = app.tenant("team-a", None).await;
    let b = app.tenant("team-b", None).await;
    let cred = app.node("n1", 1).await;
    let (_, v) = app.call("POST", "/v1/jobs", Some(&b), Some(r#"{"name": "train", "gpus": 1}"#.into())).await;
    let id = v["id"].as_u64().unwrap();
    wait_state(&app, id, "running").await;
    let task = json!({"job": id, "rank": 0, "attempt": 0});
    let (s, v) = app
        .sync(
            "n1",
            &cred,
            json!({"known_version": 0, "running": [], "exited": [{"task": task, "code": 0, "signal": null}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_state(&app, id, "succeeded").await;
    // A dry run depending on the job that succeeded answers as one without (the copy it replays has no ended job: a
    // dependency on one was refused there); `afternotok` on it would fail at once.
    let dep = |kind: &str| format!(r#"{{"name": "next", "gpus": 1, "dependency": "{kind}:{id}"}}"#);
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&b), Some(dep("afterok"))).await;
    assert_eq!(
        (s, d["message"].as_str()),
        (StatusCode::OK, Some("this job fits now and starts in the next scheduling pass")),
        "{d}"
    );
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&b), Some(dep("afternotok"))).await;
    let never = format!(
        "it would fail at once: dependency afternotok job-{id} can never be satisfied: job-{id} ended succeeded"
    );
    assert_eq!((s, d["message"].as_str()), (StatusCode::OK, Some(never.as_str())), "{d}");
    assert!(d["eta_ms"].is_null(), "{d}");
    // Held, it would wait for its release first (its dependencies are looked at then), as a submission would.
    let held = format!(r#"{{"name": "next", "gpus": 1, "hold": true, "dependency": "afternotok:{id}"}}"#);
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&b), Some(held)).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert!(d["message"].as_str().unwrap().starts_with("held: "), "{d}");
    let job = r#"{"name": "train", "gpus": 1}"#;
    let (_, d) = app.call("POST", "/v1/jobs/dry-run", Some(&b), Some(job.into())).await;
    assert_eq!(
        (d["estimate"]["source"].as_str(), d["estimate"]["samples"].as_u64()),
        (Some("learned"), Some(1)),
        "{d}"
    );
    // Each answer is checked to be one (an error would also have no learned estimate).
    let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(job.into())).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_ne!(d["estimate"]["source"].as_str(), Some("learned"), "team-b's run taught team-a: {d}");
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(job.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, j) = app.call("GET", &format!("/v1/jobs/{}", v["id"]), Some(&a), None).await;
    assert_eq!((s, j["name"].as_str()), (StatusCode::OK, Some("train")), "{j}");
    assert_ne!(j["estimate"]["source"].as_str(), Some("learned"), "{j}");
}

/// A job's time not running (`gpunet_job_not_running_duration_seconds`) is its life less what its attempts held,
/// counted from what is stored: an attempt before a restart of the server counted as time not running (the time run
/// was kept in memory only). Also observed: a job failed because its dependency never can be met (it waited too).
#[tokio::test]
async fn time_not_running_counts_attempts_from_before_a_restart() {
    let store = Arc::new(MemoryStore::new());
    let fast = |c: &mut Config| c.sched.restart_backoff = gpunet_core::Dur(1);
    let app = App::with_config(Path::new("/nonexistent"), store.clone(), "admin", "join", fast);
    let a = app.tenant("team-a", None).await;
    let cred = app.node("n1", 1).await;
    let (_, v) =
        app.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "t", "gpus": 1, "max_restarts": 1}"#.into())).await;
    let id = v["id"].as_u64().unwrap();
    let exited = |attempt: u32, code: i32| {
        let task = json!({"job": id, "rank": 0, "attempt": attempt});
        json!({"known_version": 0, "running": [], "exited": [{"task": task, "code": code, "signal": null}]})
    };
    wait_state(&app, id, "running").await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, v) = app.sync("n1", &cred, exited(0, 1)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // A restart of the server between the two attempts. The old server's tasks go on in this runtime after its router
    // is dropped: it is let restart the job first, so that it writes none of it while the new one restores from the
    // same store (two servers never share one; under load the job changed state between the restore's two passes and
    // was restored by neither: "find dependency job-1: no such job").
    drop(app);
    {
        use gpunet_store::Store;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let page = store.jobs_page(None, 10).unwrap();
            let doc: Value = serde_json::from_str(&page[0].1).unwrap();
            if doc["job"]["state"] == "running" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the old server restarts the job: {doc}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    let app = App::with_config(Path::new("/nonexistent"), store.clone(), "admin", "join", fast);
    let dep = format!(r#"{{"name": "d", "gpus": 1, "dependency": "afternotok:{id}"}}"#);
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(dep)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let dependent = v["id"].as_u64().unwrap();
    wait_state(&app, id, "running").await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, v) = app.sync("n1", &cred, exited(1, 0)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_state(&app, id, "succeeded").await;
    wait_state(&app, dependent, "failed").await;
    let (_, j) = app.call("GET", &format!("/v1/jobs/{id}"), Some(&a), None).await;
    let (_, d) = app.call("GET", &format!("/v1/jobs/{dependent}"), Some(&a), None).await;
    let ms = |v: &Value| v.as_u64().unwrap() as f64 / 1000.0;
    let held: f64 = j["attempts"].as_array().unwrap().iter().map(|t| ms(&t["ended_ms"]) - ms(&t["started_ms"])).sum();
    assert!(held >= 0.8, "two attempts of 400 ms or more: {j}");
    let sum: u64 = j["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ended_ms"].as_u64().unwrap() - t["started_ms"].as_u64().unwrap())
        .sum();
    assert_eq!(j["held_ms"].as_u64(), Some(sum), "the view's held_ms is its attempts' sum: {j}");
    let expected =
        ms(&j["finished_ms"]) - ms(&j["submitted_ms"]) - held + ms(&d["finished_ms"]) - ms(&d["submitted_ms"]);
    let (_, m) = app.call("GET", "/metrics", Some("admin"), None).await;
    let m = m.as_str().unwrap();
    let value = |name: &str| -> f64 {
        let line = m.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {m}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("gpunet_job_not_running_duration_seconds_count "), 2.0, "{m}");
    let sum = value("gpunet_job_not_running_duration_seconds_sum ");
    assert!((sum - expected).abs() < 0.01, "observed {sum} s, its attempts say {expected} s");
}

/// A running job whose node does not come back at a restart of the server (here its stored document now says it is
/// still booting, a pool's node not registered) is requeued: its attempt is closed as `interrupted`, counted as held
/// until the restart, and the job stored so — a second restart neither requeues it again nor counts it twice.
#[tokio::test]
async fn a_job_requeued_at_start_closes_its_attempt_once() {
    use gpunet_store::Store;
    let store = Arc::new(MemoryStore::new());
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let a = app.tenant("team-a", None).await;
    app.node("n1", 1).await;
    let (_, v) = app.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "t", "gpus": 1}"#.into())).await;
    let id = v["id"].as_u64().unwrap();
    wait_state(&app, id, "running").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    drop(app);
    let (name, mut doc) = store.load().unwrap().nodes.into_iter().find(|(n, _)| n == "n1").unwrap();
    doc["booting"] = json!(true);
    store.commit(vec![gpunet_store::Write::Node { name, doc }]).unwrap();
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let (_, j) = app.call("GET", &format!("/v1/jobs/{id}"), Some(&a), None).await;
    let t = &j["attempts"][0];
    assert_eq!((j["state"].as_str(), t["outcome"].as_str()), (Some("restarting"), Some("interrupted")), "{j}");
    let held = t["ended_ms"].as_u64().unwrap() - t["started_ms"].as_u64().unwrap();
    assert!(held >= 300 && j["held_ms"].as_u64() == Some(held), "{j}");
    assert!(t["message"].as_str().unwrap().contains("requeued at the server's start"), "{j}");
    drop(app);
    let app = App::on(Path::new("/nonexistent"), store.clone());
    let (_, again) = app.call("GET", &format!("/v1/jobs/{id}"), Some(&a), None).await;
    assert_eq!((&again["held_ms"], &again["attempts"]), (&j["held_ms"], &j["attempts"]), "{again}");
    let (_, ev) = app.call("GET", &format!("/v1/jobs/{id}/events"), Some(&a), None).await;
    let requeued = ev.as_array().unwrap().iter().filter(|e| e["kind"] == "requeued").count();
    assert_eq!(requeued, 1, "{ev}");
}
