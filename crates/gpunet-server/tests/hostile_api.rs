//! Hostile requests against the real router and owner task (and, where concurrency matters, a real listener on
//! loopback). Each test is an attack that worked before it was fixed, named after what broke.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpunet_server::{build, http::router, Config};
use gpunet_store::{MemoryStore, SqliteStore, Store, TokenRole, Write};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

struct App {
    router: axum::Router,
}

fn config(dir: &std::path::Path) -> Config {
    let mut cfg = Config::new(dir.to_path_buf());
    // These tests are about the API: queue order is submission order (FIFO with backfill, the default before `auto`).
    cfg.sched = gpunet_core::SchedConfig { backfill: true, ..gpunet_core::SchedConfig::default() };
    cfg.admin_token = Some("admin".into());
    cfg.join_token = Some("join".into());
    cfg
}

impl App {
    fn with(cfg: &Config, store: Arc<dyn Store>) -> App {
        let (state, _, _) = build(cfg, store).unwrap();
        App { router: router(state) }
    }

    fn new() -> App {
        App::with(&config("/nonexistent".as_ref()), Arc::new(MemoryStore::new()))
    }

    async fn raw(&self, method: &str, path: &str, token: Option<&str>, body: Body) -> (StatusCode, Vec<u8>) {
        let mut r = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        let resp = self.router.clone().oneshot(r.body(body).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 30).await.unwrap();
        (status, bytes.to_vec())
    }

    async fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<String>) -> (StatusCode, Value) {
        let (s, b) = self.raw(method, path, token, body.map(Body::from).unwrap_or_else(Body::empty)).await;
        (s, serde_json::from_slice(&b).unwrap_or(Value::String(String::from_utf8_lossy(&b).into_owned())))
    }

    async fn tenant(&self, name: &str) -> String {
        let (s, v) = self.call("POST", "/v1/tenants", Some("admin"), Some(json!({"name": name}).to_string())).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["token"].as_str().unwrap().to_string()
    }

    /// Registers a node; returns its own credential (what its agent syncs with).
    async fn node(&self, name: &str, gpus: usize) -> String {
        let g: Vec<Value> =
            (0..gpus).map(|_| json!({"model": "A100-80GB", "numa": 0, "nvlink_domain": 0, "pcie_switch": 0})).collect();
        let body = json!({"spec": {"name": name, "gpus": g, "cpu": 64000, "mem": 524288, "labels": {"zone": "z1"},
                                   "price_per_gpu_hour": 2.0}, "fake": true});
        let (s, v) = self.call("POST", "/v1/nodes", Some("join"), Some(body.to_string())).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["credential"].as_str().unwrap().to_string()
    }

    async fn submit(&self, token: &str, body: Value) -> u64 {
        let (s, v) = self.call("POST", "/v1/jobs", Some(token), Some(body.to_string())).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_u64().unwrap()
    }

    /// Waits (generously) until job `id` is in `state`.
    async fn wait_state(&self, id: u64, state: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, j) = self.call("GET", &format!("/v1/jobs/{id}"), Some("admin"), None).await;
            if j["state"] == state {
                return;
            }
            assert!(Instant::now() < deadline, "job {id} never became {state}: {j}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn err(v: &Value) -> (&str, Option<&str>) {
    (v["error"]["code"].as_str().unwrap_or("?"), v["error"]["field"].as_str())
}

/// `{"a":{"a":…1}}` nested `n` deep.
fn nested(n: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n))
}

/// A tenant named `__admin__` became an admin after a restart, and `__agent__` a join token: roles were inferred from
/// the tenant column. Reserved names are refused, and roles are stored with the token.
#[tokio::test]
async fn a_tenant_named_admin_or_agent_never_gets_that_role_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let app = App::with(&cfg, store.clone());
    // Nor `.` or `..`, which would name a parent directory in a tier root such as `file:///srv/ckpt/{tenant}`.
    for name in ["__admin__", "__agent__", "__anything", ".", "..", ".hidden", "-rf"] {
        let (s, v) = app.call("POST", "/v1/tenants", Some("admin"), Some(json!({"name": name}).to_string())).await;
        assert_eq!((s, err(&v)), (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_field", Some("name"))), "{name}: {v}");
    }
    let a = app.tenant("team-a").await;
    // A token row an older version could have written for a tenant of a reserved name: it stays a tenant token.
    store
        .commit(vec![Write::Token {
            hash: gpunet_server::hash_token("sneaky"),
            role: TokenRole::Tenant,
            tenant: Some("__admin__".into()),
        }])
        .unwrap();
    // Restart: a new owner over the same database.
    let app = App::with(&cfg, store);
    let (_, who) = app.call("GET", "/v1/whoami", Some(&a), None).await;
    assert_eq!((&who["role"], &who["tenant"]), (&json!("tenant"), &json!("team-a")), "{who}");
    let (_, who) = app.call("GET", "/v1/whoami", Some("sneaky"), None).await;
    assert_eq!(
        (&who["role"], &who["tenant"]),
        (&json!("tenant"), &json!("__admin__")),
        "the name makes no admin: {who}"
    );
    assert_eq!(who["token"]["role"], "tenant", "{who}");
    let (s, _) = app.call("GET", "/metrics", Some("sneaky"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (_, who) = app.call("GET", "/v1/whoami", Some("admin"), None).await;
    assert_eq!((&who["role"], &who["token"]["role"]), (&json!("admin"), &json!("admin")), "{who}");
    let (s, _) = app.call("GET", "/v1/jobs", Some("join"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "the join token is still only an agent's");
}

/// Two concurrent 350 KB bodies of nested `{"a":` stalled the whole server for 25 s (parse time grew with the square
/// of the depth) and every agent was declared lost. Deep documents are now refused by a linear scan before parsing,
/// and parsing runs off the async workers: `whoami` stays fast meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_documents_are_refused_fast_and_do_not_stall_other_requests() {
    let mut cfg = config("/nonexistent".as_ref());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    let running = gpunet_server::start(cfg, Arc::new(MemoryStore::new())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let a: Value = http
        .post(format!("{url}/v1/tenants"))
        .bearer_auth("admin")
        .body(r#"{"name": "team-a"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let a = a["token"].as_str().unwrap().to_string();
    let deep_json = nested(70_000); // about 350 KB
                                    // 100 KB of `[` took libyaml 33 s in a release build.
    let deep_yaml_flow = format!("x: {}", "[".repeat(100_000));
    let bodies = [
        ("/v1/jobs", a.clone(), deep_json.clone()),
        ("/v1/jobs/dry-run", a.clone(), deep_json.clone()),
        ("/v1/jobs", a.clone(), deep_yaml_flow.clone()),
        ("/v1/jobs/batch", a.clone(), format!("[{deep_json}]")),
        ("/v1/tenants", "admin".to_string(), nested(10_000)),
    ];
    let mut attacks = Vec::new();
    for round in 0..2 {
        for (path, token, body) in bodies.clone() {
            let (http, url) = (http.clone(), url.clone());
            attacks.push(tokio::spawn(async move {
                let t = Instant::now();
                let r = http.post(format!("{url}{path}")).bearer_auth(token).body(body).send().await.unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or_default();
                (round, path, status, v, t.elapsed())
            }));
        }
    }
    let mut lat = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        let r = http.get(format!("{url}/v1/whoami")).bearer_auth(&a).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        lat.push(t.elapsed());
    }
    for h in attacks {
        let (round, path, status, v, took) = h.await.unwrap();
        assert!((400..500).contains(&status), "{round} {path}: {status} {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("deeper than") || msg.contains("'[' or '{'"), "{path}: {v}");
        assert!(took < Duration::from_secs(3), "{path}: refused only after {took:?}");
    }
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100 - 1];
    assert!(p99 < Duration::from_millis(50), "whoami p99 {p99:?} while deep documents were posted");
    running.stop().await;
}

/// A 150 KB Kubernetes Job with one long unused key and 3,000 children produced a 300 MB dry-run answer (600 MiB of
/// server memory). Warnings are bounded in number and size.
#[tokio::test]
async fn a_kubernetes_job_with_a_huge_unused_key_gets_a_small_answer() {
    let app = App::new();
    app.tenant("team-a").await;
    app.node("n1", 4).await;
    let key = "k".repeat(50_000);
    let children: String = (0..3000).map(|i| format!("\"c{i}\": 1,")).collect();
    let job = format!(
        r#"{{"apiVersion": "batch/v1", "kind": "Job", "metadata": {{"name": "big", "namespace": "team-a"}},
            "spec": {{"{key}": {{{children} "last": 2}},
                      "template": {{"spec": {{"containers": [{{"name": "c", "command": ["true"],
                          "resources": {{"limits": {{"nvidia.com/gpu": 1}}}}}}]}}}}}}}}"#
    );
    for path in ["/v1/jobs/dry-run", "/v1/jobs"] {
        let (s, b) = app.raw("POST", path, Some("admin"), Body::from(job.clone())).await;
        assert!(s.is_success(), "{path}: {s} {}", String::from_utf8_lossy(&b[..b.len().min(500)]));
        assert!(b.len() < 32 * 1024, "{path}: a {} byte answer", b.len());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert!(v["warnings"].as_array().unwrap().len() <= 51, "{v}");
    }
    let quota = format!(
        r#"{{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {{"name": "team-a"}},
            "spec": {{"hard": {{"nvidia.com/gpu": "4", "{key}": {{{children} "last": 2}}}}}}}}"#
    );
    let app2 = App::with(
        &{
            let mut c = config("/nonexistent".as_ref());
            c.max_body_bytes = 4 << 20;
            c
        },
        Arc::new(MemoryStore::new()),
    );
    app2.tenant("team-a").await;
    // The quota route takes small documents only: this one is refused by size, before it is parsed.
    let (s, v) = app2.call("PUT", "/v1/tenants/team-a/quota", Some("admin"), Some(quota)).await;
    assert_eq!((s, err(&v).0), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"), "{v}");
}

/// 100 anonymous 4 MiB bodies cost the server 340 MiB: the body was read before the token was checked. Now a request
/// without a valid token is refused without reading its body, and each route has its own body limit.
#[tokio::test]
async fn the_body_is_not_read_before_the_token_is_checked_and_limits_are_per_route() {
    let app = App::new();
    let a = app.tenant("team-a").await;
    for (path, token) in [("/v1/jobs", None), ("/v1/jobs/batch", Some("wrong")), ("/v1/agents/n1/sync", None)] {
        let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let p2 = polled.clone();
        // A body that records being read (and would never end).
        let body = futures_util::stream::poll_fn(move |_| {
            p2.store(true, std::sync::atomic::Ordering::SeqCst);
            std::task::Poll::Ready(Some(Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 1 << 20]))))
        });
        let (s, b) = app.raw("POST", path, token, Body::from_stream(body)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}: {}", String::from_utf8_lossy(&b));
        assert!(!polled.load(std::sync::atomic::Ordering::SeqCst), "{path}: the body was read before the token check");
    }
    // Per-route limits: small documents for tenants, 1 MiB for a job, the configured maximum for a batch.
    let big = |n: usize| format!("{{\"name\": \"x\", \"gpus\": 1, \"command\": [\"{}\"]}}", "x".repeat(n));
    let (s, v) =
        app.call("POST", "/v1/tenants", Some("admin"), Some(format!("{{\"name\": \"{}\"}}", "x".repeat(70_000)))).await;
    assert_eq!((s, err(&v).0), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(big(1_100_000))).await;
    assert_eq!((s, err(&v).0), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(big(200_000))).await;
    assert_eq!(s, StatusCode::CREATED, "a job of 200 KB fits: {v}");
    let (s, v) =
        app.call("POST", "/v1/jobs/batch", Some(&a), Some(format!("[{}, {}]", big(200_000), big(1_000_000)))).await;
    assert_eq!(
        s,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a 1.2 MB batch is read, and its second job's command refused: {v}"
    );
    assert!(v["error"]["message"].as_str().unwrap().contains("jobs[1]"), "{v}");
}

/// A tenant could open any number of log and event streams (each re-read the whole log every 200 ms).
#[tokio::test]
async fn streams_are_capped_per_token() {
    let mut cfg = config("/nonexistent".as_ref());
    cfg.max_streams_per_token = 2;
    let app = App::with(&cfg, Arc::new(MemoryStore::new()));
    let a = app.tenant("team-a").await;
    let b = app.tenant("team-b").await;
    let open = |t: &str| {
        let r = Request::builder().uri("/v1/events").header("authorization", format!("Bearer {t}"));
        app.router.clone().oneshot(r.body(Body::empty()).unwrap())
    };
    let s1 = open(&a).await.unwrap();
    let s2 = open(&a).await.unwrap();
    assert_eq!((s1.status(), s2.status()), (StatusCode::OK, StatusCode::OK));
    let s3 = open(&a).await.unwrap();
    assert_eq!(s3.status(), StatusCode::TOO_MANY_REQUESTS);
    let v: Value = serde_json::from_slice(&axum::body::to_bytes(s3.into_body(), 1 << 20).await.unwrap()).unwrap();
    assert_eq!(err(&v).0, "limit_exceeded");
    assert!(v["error"]["message"].as_str().unwrap().contains("--max-streams-per-token"), "{v}");
    assert_eq!(open(&b).await.unwrap().status(), StatusCode::OK, "another token has its own streams");
    drop(s1);
    assert_eq!(open(&a).await.unwrap().status(), StatusCode::OK, "a closed stream frees its slot");
    drop(s2);
    // A tenant admin can make any number of tokens: together they hold at most four times a token's share.
    let mut held = Vec::new();
    for i in 0..5 {
        let body = json!({"role": "tenant", "user": format!("u{i}")}).to_string();
        let (s, v) = app.call("POST", "/v1/tokens", Some(&b), Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let t = v["token"].as_str().unwrap().to_string();
        for _ in 0..2 {
            let r = open(&t).await.unwrap();
            if r.status() == StatusCode::OK {
                held.push(r);
                continue;
            }
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            let v: Value =
                serde_json::from_slice(&axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap()).unwrap();
            assert!(v["error"]["message"].as_str().unwrap().contains("per tenant"), "{v}");
        }
    }
    // Ten asked for by five tokens, each within its own two: eight open, the last two refused for the tenant.
    assert_eq!(held.len(), 8, "a tenant's tokens together held other than 4 x 2 streams");
    assert_eq!(open(&a).await.unwrap().status(), StatusCode::OK, "another tenant is not held back");
}

/// A job name with an escape sequence reached an admin's terminal raw through `gpunet jobs`: it erased the row above
/// and printed a forged one of another tenant. Such names are refused, in a job, a batch and a Kubernetes Job, and
/// nothing is queued.
#[tokio::test]
async fn a_job_name_that_would_rewrite_a_terminal_is_refused() {
    let app = App::new();
    let a = app.tenant("team-a").await;
    let forged = "x\u{1b}[1A\r\u{1b}[2K999999  teamb  steal-weights  running";
    for (path, body, field) in [
        ("/v1/jobs", json!({"name": forged, "gpus": 1}).to_string(), "name"),
        ("/v1/jobs", json!({"name": "a\nb", "gpus": 1}).to_string(), "name"),
        ("/v1/jobs", json!({"name": "abc\u{202e}fdp", "gpus": 1}).to_string(), "name"),
        ("/v1/jobs/batch", json!([{"name": "ok", "gpus": 1}, {"name": forged, "gpus": 1}]).to_string(), "name"),
        (
            "/v1/jobs",
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: \"a\\e[2J\"}\nspec:\n  template:\n    spec: {containers: \
             [{name: c}]}\n"
                .to_string(),
            "name",
        ),
    ] {
        let (s, v) = app.call("POST", path, Some(&a), Some(body.clone())).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert!(err(&v).1.is_some_and(|f| f.ends_with(field)), "{body}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("printable")), "{body}: {v}");
    }
    let (_, v) = app.call("GET", "/v1/jobs", Some(&a), None).await;
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(0), "{v}");
}

/// `cpu: 1e30` was accepted as 18446744073709551615m, Kubernetes `parallelism: 4294967297` became 1 task, and a
/// tenant could queue any number of jobs of any size.
#[tokio::test]
async fn numbers_are_range_checked_and_tenants_have_limits() {
    let mut cfg = config("/nonexistent".as_ref());
    cfg.max_queued_jobs_per_tenant = 3;
    cfg.max_spec_bytes_per_tenant = 8 * 1024;
    let app = App::with(&cfg, Arc::new(MemoryStore::new()));
    let a = app.tenant("team-a").await;
    for (body, field) in [
        (r#"{"name": "x", "cpu": 1e30}"#.to_string(), "cpu"),
        (r#"{"name": "x", "gpus": 1, "estimated_duration": "100000000000000000000h"}"#.into(), "estimated_duration"),
        (
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: a}\nspec:\n  parallelism: 4294967297\n  template:\n    \
             spec: {containers: [{name: c}]}\n"
                .into(),
            "spec.parallelism",
        ),
    ] {
        let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(body.clone())).await;
        assert_eq!((s, err(&v)), (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_field", Some(field))), "{body}: {v}");
    }
    // No node: jobs stay queued. Three fit, the fourth is refused naming the limit; a cancel makes room.
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(app.submit(&a, json!({"name": format!("j{i}"), "gpus": 1})).await);
    }
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(r#"{"name": "j4", "gpus": 1}"#.into())).await;
    assert_eq!((s, err(&v).0), (StatusCode::TOO_MANY_REQUESTS, "limit_exceeded"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--max-queued-jobs-per-tenant"), "{v}");
    let (s, _) = app.call("POST", &format!("/v1/jobs/{}/cancel", ids[0]), Some(&a), None).await;
    assert_eq!(s, StatusCode::OK);
    // Room for one job again, but not for 8 KiB of spec.
    let env: serde_json::Map<String, Value> = (0..100).map(|i| (format!("V{i}"), json!("x".repeat(100)))).collect();
    let (s, v) =
        app.call("POST", "/v1/jobs", Some(&a), Some(json!({"name": "fat", "gpus": 1, "env": env}).to_string())).await;
    assert_eq!((s, err(&v).0), (StatusCode::TOO_MANY_REQUESTS, "limit_exceeded"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--max-spec-bytes-per-tenant"), "{v}");
    let thin = app.submit(&a, json!({"name": "thin", "gpus": 1})).await;
    // Ended jobs give their bytes back (the count is kept as jobs come and go, not recounted per submission).
    for id in [ids[1], ids[2], thin] {
        let (s, _) = app.call("POST", &format!("/v1/jobs/{id}/cancel"), Some(&a), None).await;
        assert_eq!(s, StatusCode::OK);
    }
    let big: serde_json::Map<String, Value> = (0..60).map(|i| (format!("V{i}"), json!("x".repeat(100)))).collect();
    let big = json!({"name": "big", "gpus": 1, "env": big}).to_string();
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(big.clone())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = app.call("POST", "/v1/jobs", Some(&a), Some(big)).await;
    assert_eq!((s, err(&v).0), (StatusCode::TOO_MANY_REQUESTS, "limit_exceeded"), "the first big job counts: {v}");
}

/// A tenant's explain and dry run named another tenant's job ids, and its jobs answered 403 (revealing that they
/// exist) rather than 404.
#[tokio::test]
async fn explanations_never_name_another_tenants_job() {
    let app = App::new();
    let a = app.tenant("team-a").await;
    let b = app.tenant("team-b").await;
    app.node("n1", 4).await;
    let holder = app.submit(&a, json!({"name": "hold", "gpus": 2, "estimated_duration": "10m"})).await;
    app.wait_state(holder, "running").await;
    // B's big job waits for the holder and gets the reservation; A's long job would outlast it.
    let head = app.submit(&b, json!({"name": "b-head", "gpus": 4, "estimated_duration": "1h"})).await;
    let mine = app.submit(&a, json!({"name": "a-long", "gpus": 1, "estimated_duration": "2h"})).await;
    let named = format!("job-{head}");
    let (_, e) = app.call("GET", &format!("/v1/jobs/{mine}/explain"), Some("admin"), None).await;
    assert!(e["message"].as_str().unwrap().contains(&named), "the admin sees the id: {e}");
    let (s, e) = app.call("GET", &format!("/v1/jobs/{mine}/explain"), Some(&a), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(!e.to_string().contains(&named) && e["reason"]["holder"].is_null(), "{e}");
    assert!(e["message"].as_str().unwrap().contains("another tenant's job"), "{e}");
    let (_, d) = app
        .call(
            "POST",
            "/v1/jobs/dry-run",
            Some(&a),
            Some(r#"{"name": "probe", "gpus": 1, "estimated_duration": "2h"}"#.into()),
        )
        .await;
    assert!(!d.to_string().contains(&named), "{d}");
    // It is named, as another tenant's (the dry run masks its own copy's answer, off the owner).
    assert!(d["message"].as_str().unwrap().contains("another tenant's job"), "{d}");
    // A dry run's own ids say nothing of the jobs submitted (they were the next id once: a count of every tenant's
    // submissions, free to read): a held job, an array and its next element are named as this job's.
    let (_, d) =
        app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(r#"{"name": "p", "gpus": 1, "hold": true}"#.into())).await;
    let msg = d["message"].as_str().unwrap();
    assert!(msg.contains("`gpunet release <id>`") && !msg.chars().any(|c| c.is_ascii_digit()), "{d}");
    let (_, d) = app
        .call("POST", "/v1/jobs/dry-run", Some(&a), Some(r#"{"name": "p", "gpus": 1, "array": "0-3"}"#.into()))
        .await;
    let msg = d["message"].as_str().unwrap();
    assert!(msg.starts_with("next element 0: ") && !msg.contains("job-"), "{d}");
    // An element is named by its index in the array, not by its place; a held array's command names "<id>" too.
    for (body, held) in [(r#""array": "5,7,9""#, false), (r#""array": "5,7,9", "hold": true"#, true)] {
        let body = format!(r#"{{"name": "p", "gpus": 1, {body}}}"#);
        let (s, d) = app.call("POST", "/v1/jobs/dry-run", Some(&a), Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{d}");
        let msg = d["message"].as_str().unwrap();
        let rest = msg.strip_prefix("next element 5: ").unwrap_or_else(|| panic!("{d}"));
        // No id (durations such as "9m59s" have digits, no id fewer than six: the dry run's are near 2^64).
        let longest = rest.split(|c: char| !c.is_ascii_digit()).map(str::len).max().unwrap_or(0);
        assert!(longest < 6 && !rest.contains("job-"), "{d}");
        assert_eq!(rest.contains("`gpunet release <id>`"), held, "{d}");
    }
    // A dry run in another tenant's name is refused as a submission is (it was quietly tried as A's own).
    let (s, d) = app
        .call("POST", "/v1/jobs/dry-run", Some(&a), Some(r#"{"name": "p", "tenant": "team-b", "gpus": 1}"#.into()))
        .await;
    assert_eq!((s, err(&d).0), (StatusCode::FORBIDDEN, "forbidden"), "{d}");
    let (_, q) = app.call("GET", "/v1/queue", Some(&a), None).await;
    assert!(!q.to_string().contains(&named) && q["entries"][0]["reason"]["holder"].is_null(), "{q}");
    assert!(q["entries"][0]["message"].as_str().unwrap().contains("another tenant's job"), "{q}");
    // B's job, its logs and explain are 404 to A, as for a job that does not exist.
    for p in [format!("/v1/jobs/{head}/logs"), format!("/v1/jobs/{head}/explain"), "/v1/jobs/99999/logs".into()] {
        let (s, v) = app.call("GET", &p, Some(&a), None).await;
        assert_eq!((s, err(&v).0), (StatusCode::NOT_FOUND, "not_found"), "{p}: {v}");
    }
}

/// Logs fetched through the API differed from the job's output after 256 KiB: the agent shipped text, so a UTF-8
/// sequence cut between two chunks became U+FFFD. Bytes now travel exactly; the log files are private.
#[tokio::test]
async fn logs_are_byte_exact_end_to_end_and_private() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::with(&config(dir.path()), Arc::new(MemoryStore::new()));
    let a = app.tenant("team-a").await;
    let node = app.node("n1", 1).await;
    let id = app.submit(&a, json!({"name": "talk", "gpus": 1})).await;
    app.wait_state(id, "running").await;
    // Output with a 3-byte character cut across chunks, and bytes that are not UTF-8 at all.
    let mut out: Vec<u8> = Vec::new();
    for i in 0..40_000u32 {
        out.extend_from_slice(format!("line {i} €\n").as_bytes());
    }
    out.extend_from_slice(&[0xff, 0xfe, 0x00, b'\n']);
    let task = gpunet_api::agent::TaskRef { job: id, rank: 0, attempt: 0 };
    // The agent ships at most 256 KiB per report: cut there, inside a character.
    let cut = (256 * 1024..).find(|&c| std::str::from_utf8(&out[..c]).is_err()).unwrap();
    // A follower started before the output arrives sees the same bytes.
    let follower = {
        let r = Request::builder()
            .uri(format!("/v1/jobs/{id}/logs?follow=true"))
            .header("authorization", format!("Bearer {a}"));
        app.router.clone().oneshot(r.body(Body::empty()).unwrap())
    };
    let follower = tokio::spawn(async move {
        let resp = follower.await.unwrap();
        axum::body::to_bytes(resp.into_body(), 1 << 30).await.unwrap().to_vec()
    });
    for (offset, data) in [(0usize, &out[..cut]), (cut, &out[cut..])] {
        let chunk = gpunet_api::agent::LogChunk { task, offset: offset as u64, data: data.to_vec() };
        let sync = gpunet_api::agent::AgentSync {
            known_version: 0,
            running: vec![task],
            logs: vec![chunk],
            ..Default::default()
        };
        let (s, v) =
            app.call("POST", "/v1/agents/n1/sync", Some(&node), Some(serde_json::to_string(&sync).unwrap())).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, got) = app.raw("GET", &format!("/v1/jobs/{id}/logs"), Some(&a), Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got.len(), out.len());
    assert!(got == out, "the log differs from the output");
    let (s, _) = app.call("POST", &format!("/v1/jobs/{id}/cancel"), Some(&a), None).await;
    assert_eq!(s, StatusCode::OK);
    // The node's agent confirms the task gone; then the job is cancelled and the follower ends.
    let exit =
        gpunet_api::agent::TaskExit { task, code: None, signal: Some(15), oom: false, stopped: true, reason: None };
    let sync = gpunet_api::agent::AgentSync { known_version: 0, exited: vec![exit], ..Default::default() };
    let (s, v) = app.call("POST", "/v1/agents/n1/sync", Some(&node), Some(serde_json::to_string(&sync).unwrap())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let followed = tokio::time::timeout(Duration::from_secs(30), follower).await.expect("the follower ends").unwrap();
    assert!(followed == out, "the followed log differs ({} of {} bytes)", followed.len(), out.len());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("logs")), 0o700);
        assert_eq!(mode(&dir.path().join(format!("logs/job-{id}"))), 0o700);
        assert_eq!(mode(&dir.path().join(format!("logs/job-{id}/rank-0-attempt-0.log"))), 0o600);
    }
}

/// A node asks which of the jobs it keeps files for ended: it learns only of jobs that ran on it (and of ids the
/// server does not know), and a list longer than the limit is refused naming the field.
#[tokio::test]
async fn a_node_learns_which_of_its_own_jobs_ended_and_nothing_of_others() {
    let app = App::new();
    let a = app.tenant("team-a").await;
    let n1 = app.node("n1", 1).await;
    let n2 = app.node("n2", 1).await;
    let done = app.submit(&a, json!({"name": "done", "gpus": 1})).await;
    let other = app.submit(&a, json!({"name": "other", "gpus": 1})).await;
    app.wait_state(done, "running").await;
    app.wait_state(other, "running").await;
    let (nd, no) = {
        let (_, v) = app.call("GET", &format!("/v1/jobs/{done}"), Some(&a), None).await;
        let on = v["attempts"][0]["placement"][0]["node"].as_str().unwrap().to_string();
        if on == "n1" {
            ((&n1, "n1"), (&n2, "n2"))
        } else {
            ((&n2, "n2"), (&n1, "n1"))
        }
    };
    let sync = |node: &str, cred: &str, body: gpunet_api::agent::AgentSync| {
        let (node, cred) = (node.to_string(), cred.to_string());
        let app = &app;
        async move {
            app.call(
                "POST",
                &format!("/v1/agents/{node}/sync"),
                Some(&cred),
                Some(serde_json::to_string(&body).unwrap()),
            )
            .await
        }
    };
    let task = gpunet_api::agent::TaskRef { job: done, rank: 0, attempt: 0 };
    let exit =
        gpunet_api::agent::TaskExit { task, code: Some(0), signal: None, oom: false, stopped: false, reason: None };
    let (s, v) = sync(nd.1, nd.0, gpunet_api::agent::AgentSync { exited: vec![exit], ..Default::default() }).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    app.wait_state(done, "succeeded").await;
    let ask = |held: Vec<u64>| gpunet_api::agent::AgentSync { held_jobs: held, ..Default::default() };
    // Its own ended job and an unknown id; not the job still running (on the other node).
    let (s, v) = sync(nd.1, nd.0, ask(vec![done, other, 999_999, done])).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["ended_jobs"], json!([done, 999_999]), "{v}");
    // The other node never ran it: nothing.
    let (s, v) = sync(no.1, no.0, ask(vec![done])).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v.get("ended_jobs").is_none(), "{v}");
    let (s, v) = sync(nd.1, nd.0, ask((0..=gpunet_api::agent::HELD_JOBS_MAX as u64).collect())).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v.to_string().contains("held_jobs"), "{v}");
}

/// A node registered with `cpu: 18446744073709551615` would overflow the cluster's totals (a panic in the task that
/// owns the state). Node numbers are bounded at registration.
#[tokio::test]
async fn a_node_with_absurd_capacity_is_refused() {
    let app = App::new();
    for (field, value) in [("cpu", json!(u64::MAX)), ("mem", json!(u64::MAX)), ("price_per_gpu_hour", json!(1e300))] {
        let mut spec =
            json!({"name": "n1", "gpus": [], "cpu": 1000, "mem": 1024, "labels": {}, "price_per_gpu_hour": 1.0});
        spec[field] = value;
        let (s, v) = app.call("POST", "/v1/nodes", Some("join"), Some(json!({"spec": spec}).to_string())).await;
        assert_eq!((s, err(&v).0), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"), "{field}: {v}");
        assert_eq!(err(&v).1, Some(format!("spec.{field}").as_str()));
    }
    app.node("n1", 2).await;
    let (s, _) = app.call("GET", "/v1/cluster", Some("admin"), None).await;
    assert_eq!(s, StatusCode::OK);
}

/// The event of a job preempted for another tenant's job named that job ("preempted for job-7"), in the evicted
/// tenant's events and event stream.
#[tokio::test]
async fn a_preemption_event_does_not_name_another_tenants_job() {
    let mut cfg = config("/nonexistent".as_ref());
    cfg.sched.policy = gpunet_core::Policy::Priority;
    cfg.sched.preemption.min_run_time = gpunet_core::Dur(0);
    let app = App::with(&cfg, Arc::new(MemoryStore::new()));
    let a = app.tenant("team-a").await;
    let b = app.tenant("team-b").await;
    app.node("n1", 2).await;
    let victim = app.submit(&a, json!({"name": "low", "gpus": 2, "priority": 0})).await;
    app.wait_state(victim, "running").await;
    let urgent = app.submit(&b, json!({"name": "urgent", "gpus": 2, "priority": 5})).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let (_, ev) = app.call("GET", &format!("/v1/jobs/{victim}/events"), Some(&a), None).await;
        if ev.to_string().contains("preempted") {
            break ev;
        }
        assert!(Instant::now() < deadline, "no preemption: {ev}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!events.to_string().contains(&format!("job-{urgent}")), "{events}");
    assert!(events.to_string().contains("preempted for another tenant's job"), "{events}");
}

/// A bad field inside a tenant's quota is named with its path and the quota's own fields, and creates nothing.
#[tokio::test]
async fn a_bad_quota_field_is_named_by_its_path() {
    let app = App::new();
    for (body, code, field) in [
        (r#"{"name":"ta","quota":{"guarantee_gpus":1,"cohort":"c1"}}"#, "unknown_field", "quota.cohort"),
        (r#"{"name":"ta","colour":"red"}"#, "unknown_field", "colour"),
        (r#"{"name":"ta","quota":{"guarantee_gpus":"x"}}"#, "parse_error", "quota.guarantee_gpus"),
    ] {
        let (s, v) = app.call("POST", "/v1/tenants", Some("admin"), Some(body.into())).await;
        assert_eq!((s.is_client_error(), err(&v)), (true, (code, Some(field))), "{body}: {v}");
    }
    // No refused try created `ta`: creating it now succeeds (a second tenant of that name would be a conflict).
    let (s, v) = app.call("POST", "/v1/tenants", Some("admin"), Some(r#"{"name":"ta","cohort":"c1"}"#.into())).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// A request's method was a label of the API metrics as sent: any client, without a token, could add series without
/// bound (612 for 50 made-up methods, 12 for one of 6,000 characters), each kept for ever. Now only the standard
/// methods are named and every other counts as "other".
#[tokio::test]
async fn made_up_methods_do_not_grow_the_metrics() {
    let app = App::new();
    let long = "A".repeat(6_000);
    for m in (0..50).map(|i| format!("EVIL{i}")).chain([long]) {
        let (s, _) = app.raw(&m, "/v1/health", None, Body::empty()).await;
        assert!(s.is_client_error(), "{m:.20}: {s}");
    }
    let (s, _) = app.raw("GET", "/v1/health", None, Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    let (s, m) = app.raw("GET", "/metrics", Some("admin"), Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    let m = String::from_utf8(m).unwrap();
    let series = |method: &str| {
        m.lines().filter(|l| l.starts_with("gpunet_api_request_duration_seconds_count") && l.contains(method)).count()
    };
    assert_eq!(series("EVIL") + series("AAAA"), 0, "{m}");
    assert!(series("method=\"other\"") >= 1 && series("method=\"GET\"") >= 1, "{m}");
    assert!(m.len() < 100_000, "{}", m.len());
}

/// `GET /v1/cluster` told any tenant how many jobs the whole cluster had in each state (another tenant's five
/// successes read as "succeeded": 5): a tenant now gets its own jobs' counts, an admin the cluster's (the queue's
/// length is the cluster's for both, as the history shows it).
#[tokio::test]
async fn the_cluster_summary_counts_a_tenants_own_jobs_only() {
    let app = App::new();
    let a = app.tenant("team-a").await;
    let b = app.tenant("team-b").await;
    app.node("n1", 1).await;
    let first = app.submit(&a, json!({"name": "x", "gpus": 1})).await;
    app.wait_state(first, "running").await;
    for _ in 0..2 {
        app.submit(&a, json!({"name": "x", "gpus": 1})).await;
    }
    app.submit(&b, json!({"name": "y", "gpus": 1})).await;
    let summary = |token: &str| {
        let token = token.to_string();
        let app = &app;
        async move {
            let (s, v) = app.call("GET", "/v1/cluster", Some(&token), None).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            (v["jobs"].clone(), v["queue_length"].as_u64().unwrap(), v["gpus_total"].as_u64().unwrap())
        }
    };
    assert_eq!(summary(&a).await, (json!({"pending": 2, "running": 1}), 3, 1));
    assert_eq!(summary(&b).await, (json!({"pending": 1}), 3, 1));
    assert_eq!(summary("admin").await, (json!({"pending": 3, "running": 1}), 3, 1));
}
