//! Submissions with an `Idempotency-Key`: a retry gets the jobs the first try made (after a restart too: the key is
//! stored with the jobs), never new ones; keys are scoped to who sends them; a key reused for another job, or one
//! that is not a key, is refused naming the header. The real router and owner over an in-memory store.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpunet_server::{build, http::router, Config};
use gpunet_store::MemoryStore;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;

fn app(store: Arc<MemoryStore>) -> axum::Router {
    let mut cfg = Config::new(Path::new("/nonexistent").to_path_buf());
    cfg.admin_token = Some("admin".into());
    cfg.join_token = Some("join".into());
    let (state, _, _) = build(&cfg, store).unwrap();
    router(state)
}

/// The status, whether the answer is a replay, and the body.
async fn call(
    app: &axum::Router,
    path: &str,
    token: &str,
    key: Option<&[u8]>,
    body: &Value,
) -> (StatusCode, bool, Value) {
    let mut r = Request::builder().method("POST").uri(path).header("authorization", format!("Bearer {token}"));
    if let Some(k) = key {
        r = r.header("idempotency-key", axum::http::HeaderValue::from_bytes(k).unwrap());
    }
    let resp = app.clone().oneshot(r.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let (status, replayed) = (resp.status(), resp.headers().get("idempotent-replayed").is_some());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, replayed, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn jobs(app: &axum::Router) -> usize {
    let req = Request::builder().uri("/v1/jobs?limit=1000").header("authorization", "Bearer admin").body(Body::empty());
    let resp = app.clone().oneshot(req.unwrap()).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 22).await.unwrap();
    serde_json::from_slice::<Value>(&bytes).unwrap()["jobs"].as_array().unwrap().len()
}

fn spec(name: &str) -> Value {
    json!({"name": name, "tenant": "t", "gpus": 1, "command": ["true"]})
}

#[tokio::test]
async fn a_retried_submission_gets_the_same_job_also_after_a_restart() {
    let store = Arc::new(MemoryStore::new());
    let a = app(store.clone());
    for t in ["t", "u"] {
        let (s, _, v) = call(&a, "/v1/tenants", "admin", None, &json!({"name": t})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (s, replayed, first) = call(&a, "/v1/jobs", "admin", Some(b"k-1"), &spec("a")).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{first}");
    let (s, replayed, again) = call(&a, "/v1/jobs", "admin", Some(b"k-1"), &spec("a")).await;
    assert_eq!((s, replayed, &again["id"]), (StatusCode::OK, true, &first["id"]), "{again}");
    // Without a key, or with another, a submission makes a new job.
    let (s, _, other) = call(&a, "/v1/jobs", "admin", Some(b"k-2"), &spec("a")).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_ne!(other["id"], first["id"]);
    // A batch with a key: replayed whole.
    let batch = json!([spec("b0"), spec("b1")]);
    let (s, _, b1) = call(&a, "/v1/jobs/batch", "admin", Some(b"batch-1"), &batch).await;
    assert_eq!(s, StatusCode::CREATED, "{b1}");
    let (s, replayed, b2) = call(&a, "/v1/jobs/batch", "admin", Some(b"batch-1"), &batch).await;
    assert_eq!((s, replayed, &b2), (StatusCode::OK, true, &b1));
    assert_eq!(jobs(&a).await, 4);

    // A new server on the same store (a restart, or a new leader) knows the keys.
    let b = app(store);
    let (s, replayed, again) = call(&b, "/v1/jobs", "admin", Some(b"k-1"), &spec("a")).await;
    assert_eq!((s, replayed, &again["id"]), (StatusCode::OK, true, &first["id"]), "{again}");
    let (s, _, b3) = call(&b, "/v1/jobs/batch", "admin", Some(b"batch-1"), &batch).await;
    assert_eq!((s, b3), (StatusCode::OK, b1));
    // The key used for another job: a conflict naming the header, and nothing made.
    let (s, _, v) = call(&b, "/v1/jobs", "admin", Some(b"k-1"), &spec("something-else")).await;
    assert_eq!((s, v["error"]["field"].as_str()), (StatusCode::CONFLICT, Some("Idempotency-Key")), "{v}");
    assert_eq!(jobs(&b).await, 4);
}

#[tokio::test]
async fn keys_are_scoped_to_their_sender_and_bad_keys_are_refused() {
    let a = app(Arc::new(MemoryStore::new()));
    let mut tokens = Vec::new();
    for t in ["t", "u"] {
        let (s, _, v) = call(&a, "/v1/tenants", "admin", None, &json!({"name": t})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        tokens.push(v["token"].as_str().unwrap().to_string());
    }
    let mine = json!({"name": "x", "gpus": 1, "command": ["true"]});
    let (s, _, t_job) = call(&a, "/v1/jobs", &tokens[0], Some(b"same"), &mine).await;
    assert_eq!(s, StatusCode::CREATED, "{t_job}");
    // Another tenant with the same key gets its own job, never tenant t's.
    let (s, replayed, u_job) = call(&a, "/v1/jobs", &tokens[1], Some(b"same"), &mine).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{u_job}");
    assert_ne!(u_job["id"], t_job["id"]);
    for bad in [&b""[..], &[b'k'; 256][..], b"with space", "kl\u{e9}".as_bytes()] {
        let (s, _, v) = call(&a, "/v1/jobs", "admin", Some(bad), &spec("a")).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert_eq!(v["error"]["field"], "Idempotency-Key", "{v}");
    }
    assert_eq!(jobs(&a).await, 2);
}
