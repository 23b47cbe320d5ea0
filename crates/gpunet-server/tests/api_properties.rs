//! Property tests of the whole API: generated bodies (random JSON, YAML-like text, raw bytes, deep nesting, huge
//! numbers, mutated valid documents) posted to every route with valid tokens never get a 5xx or a panic, every 4xx
//! has the error body, and the server still answers afterwards.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpunet_server::{build, http::router, Config};
use gpunet_store::MemoryStore;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

async fn call(r: &axum::Router, method: &str, path: &str, token: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::from(body))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let s = resp.status();
    let b = axum::body::to_bytes(resp.into_body(), 1 << 26).await.unwrap();
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// Any JSON value, nested a few levels, with numbers at and beyond every integer range.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        prop::sample::select(vec![
            json!(4294967296u64),
            json!(4294967297u64),
            json!(-1),
            json!(1e30),
            json!(1e308),
            json!(18446744073709551615u64),
            json!("1e30"),
            json!("100000000000000000000h"),
            json!("-5m"),
            json!("NaN"),
            json!("inf"),
        ]),
        "[a-zA-Z0-9_./:*&|>!%@ -]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "name",
                    "gpus",
                    "tasks",
                    "cpu",
                    "memory",
                    "priority",
                    "elastic",
                    "min_tasks",
                    "max_tasks",
                    "checkpoint_tiers",
                    "keep",
                    "every",
                    "estimated_duration",
                    "apiVersion",
                    "kind",
                    "metadata",
                    "spec",
                    "template",
                    "containers",
                    "parallelism",
                    "backoffLimit",
                    "resources",
                    "limits",
                    "nvidia.com/gpu",
                    "hard",
                    "weight",
                    "quota",
                    "guarantee_gpus",
                    "limit_gpus",
                    "per_model_gpus",
                    "known_version",
                    "running",
                    "exited",
                    "logs",
                    "data_base64",
                    "offset",
                    "task",
                    "job",
                    "rank",
                    "attempt",
                    "env",
                    "command",
                    "x",
                ])
                .prop_map(String::from),
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies: JSON, valid documents with one field replaced, YAML-like token soup, deep nesting, raw bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let seeds = vec![
        json!({"name": "x", "gpus": 1}),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "a"},
               "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}),
        json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team-a"},
               "spec": {"hard": {"nvidia.com/gpu": "4"}}}),
        json!({"name": "t2"}),
        json!({"known_version": 0, "running": [], "exited": []}),
        json!({"spec": {"name": "n2", "gpus": [], "cpu": 1, "mem": 1, "labels": {}, "price_per_gpu_hour": 0}}),
    ];
    let yaml_token = prop::sample::select(vec![
        "\n",
        "  ",
        "- ",
        ": ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "'",
        "\"",
        "*a",
        "&a ",
        "|\n",
        ">-\n",
        "# c\n",
        "name",
        "x",
        "gpus",
        "1e30",
        "4294967297",
        "!!binary ",
        "? ",
        "---\n",
        "<<: ",
        "\\",
        "\t",
    ]);
    prop_oneof![
        json_value().prop_map(|v| v.to_string().into_bytes()),
        (prop::sample::select(seeds), "[a-zA-Z_.]{1,12}", json_value()).prop_map(|(mut s, k, v)| {
            if let Some(o) = s.as_object_mut() {
                o.insert(k, v);
            }
            s.to_string().into_bytes()
        }),
        prop::collection::vec(yaml_token, 0..80).prop_map(|t| t.concat().into_bytes()),
        (prop::sample::select(vec!["{\"a\":", "[", "- ", "a:\n ", "{a: "]), 0usize..3000)
            .prop_map(|(open, n)| open.repeat(n).into_bytes()),
        prop::collection::vec(any::<u8>(), 0..512),
    ]
}

const ROUTES: &[(&str, &str, &str)] = &[
    ("POST", "/v1/jobs", "tenant"),
    ("POST", "/v1/jobs/batch", "tenant"),
    ("POST", "/v1/jobs/dry-run", "tenant"),
    ("POST", "/v1/jobs/1/cancel", "tenant"),
    ("GET", "/v1/jobs?limit=5", "tenant"),
    ("GET", "/v1/jobs/1/explain", "tenant"),
    ("GET", "/v1/jobs/1/events", "tenant"),
    ("GET", "/v1/jobs/1/logs", "tenant"),
    ("GET", "/v1/queue", "tenant"),
    ("GET", "/v1/usage", "tenant"),
    ("GET", "/v1/cluster", "tenant"),
    ("GET", "/v1/nodes", "tenant"),
    ("GET", "/v1/tenants", "tenant"),
    ("POST", "/v1/tenants", "admin"),
    ("PUT", "/v1/tenants/team-a/quota", "admin"),
    ("POST", "/v1/tenants/team-a/tokens", "admin"),
    ("POST", "/v1/nodes", "admin"),
    ("POST", "/v1/nodes/n1/cordon", "admin"),
    ("POST", "/v1/agents/n1/sync", "join"),
    ("POST", "/v1/jobs", "admin"),
    ("POST", "/metrics", "admin"),
];

#[test]
fn generated_bodies_on_every_route_never_get_a_5xx() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (app, tenant) = rt.block_on(async {
        let mut cfg = Config::new(dir.path().to_path_buf());
        cfg.admin_token = Some("admin".into());
        cfg.join_token = Some("join".into());
        let (state, _, _) = build(&cfg, Arc::new(MemoryStore::new())).unwrap();
        let app = router(state);
        let (s, v) = call(&app, "POST", "/v1/tenants", "admin", br#"{"name": "team-a"}"#.to_vec()).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let node = json!({"spec": {"name": "n1", "gpus": [{"model": "A100-80GB", "numa": 0, "nvlink_domain": 0,
                          "pcie_switch": 0}], "cpu": 64000, "mem": 524288, "labels": {}, "price_per_gpu_hour": 1.0},
                          "fake": true});
        let (s, _) = call(&app, "POST", "/v1/nodes", "join", node.to_string().into_bytes()).await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, _) =
            call(&app, "POST", "/v1/jobs", v["token"].as_str().unwrap(), br#"{"name": "j", "gpus": 1}"#.to_vec()).await;
        assert_eq!(s, StatusCode::CREATED);
        (app, v["token"].as_str().unwrap().to_string())
    });
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(400);
    let mut runner = TestRunner::new(PropConfig { cases, failure_persistence: None, ..PropConfig::default() });
    runner
        .run(&(0..ROUTES.len(), body()), |(r, body)| {
            let (method, path, who) = ROUTES[r];
            let token = match who {
                "tenant" => tenant.as_str(),
                other => other,
            };
            let (s, v) = rt.block_on(call(&app, method, path, token, body.clone()));
            prop_assert!(s.as_u16() < 500, "{method} {path} with {:?}: {s} {v}", String::from_utf8_lossy(&body));
            if s.is_client_error() && s != StatusCode::METHOD_NOT_ALLOWED {
                prop_assert!(v["error"]["code"].is_string() && v["error"]["message"].is_string(), "{path}: {s} {v}");
            }
            Ok(())
        })
        .unwrap();
    // The server still answers.
    let (s, v) = rt.block_on(call(&app, "GET", "/v1/whoami", &tenant, Vec::new()));
    assert_eq!((s, &v["role"], &v["tenant"]), (StatusCode::OK, &json!("tenant"), &json!("team-a")), "{v}");
}
