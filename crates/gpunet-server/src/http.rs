//! The HTTP API under `/v1`, `/metrics` and the OpenAPI document. Handlers authenticate, parse and validate, then ask
//! the owner task. Every error is `{"error": {"code", "message", "field"}}` with a 4xx status for client input.
//!
//! Hostile input is bounded before it costs anything: the token is checked before the body is read (a middleware on
//! every authenticated route); each route has its own body limit ([`SMALL_BODY`] for most, [`SPEC_BODY`] for a job,
//! the configured maximum for batches and agent reports); documents are scanned for depth before a parser sees them
//! and are parsed on the blocking pool, two at a time, so a slow parse never stalls other requests; a token may hold
//! at most `max_streams_per_token` log and event streams, and a tenant's tokens together [`TENANT_STREAMS_PER_TOKEN`]
//! times that (a tenant admin may make any number of tokens); logs are read from files by offset.

use crate::owner::{quota_from_request, valid_name, Cmd};
use crate::{hash_token, Principal};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use gpunet_api::spec::parse_job;
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::{NodeSpec, NodeState};
use gpunet_store::Store;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot};

/// What handlers share: one allocation, so that the clone each request's extractors and middlewares make is one
/// reference count, not one per field (it was about 5% of the server's CPU per submission).
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub(crate) fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }

    /// Mutable access while building, before anything holds a clone (a change after that would reach one copy only).
    pub(crate) fn shared_mut(&mut self) -> &mut Shared {
        Arc::get_mut(&mut self.0).expect("the state is changed only before the router holds clones of it")
    }
}

/// The fields of [`AppState`].
pub struct Shared {
    pub(crate) tx: mpsc::Sender<Cmd>,
    pub(crate) auth: crate::tokens::Auth,
    pub(crate) metrics: Arc<crate::metrics::ServerMetrics>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) events: broadcast::Sender<String>,
    pub(crate) max_body: usize,
    pub(crate) notifies: crate::owner::Notifies,
    /// Where task logs shipped by agents are kept.
    pub(crate) logs_dir: std::path::PathBuf,
    /// Open log and event streams per token hash.
    pub(crate) streams: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    /// Most open streams per token.
    pub(crate) max_streams_per_token: usize,
    /// Documents parsed at once (on the blocking pool).
    pub(crate) parse_slots: Arc<tokio::sync::Semaphore>,
    /// Dry runs at once (each holds a copy of the state, and its pass and replay run on the blocking pool).
    pub(crate) dry_run_slots: Arc<tokio::sync::Semaphore>,
    /// Currency of the price catalogue, for usage reports.
    pub(crate) currency: String,
    /// The owner task (ended when a leader's term ends, see `ha`).
    pub(crate) owner: tokio::task::AbortHandle,
    /// As one of several replicas (`ha`): this leader's fencing epoch and the address clients reach it at.
    pub(crate) leader: Option<(u64, String)>,
    /// The queue view the owner publishes (`owner/snapshot.rs`).
    pub(crate) queue: crate::owner::snapshot::Reader,
    /// Where reads make their answers, at lower CPU priority (`reads.rs`).
    pub(crate) reads: crate::reads::Lane,
    /// The node pools' providers, when there are pools.
    pub(crate) pools: Option<crate::pools::Providers>,
}

/// Body limit of routes that take a small document (tenants, quotas, node registration).
pub const SMALL_BODY: usize = 64 * 1024;
/// Body limit of one job document (submit, dry run).
pub const SPEC_BODY: usize = 1 << 20;

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// An error response.
#[derive(Debug)]
pub struct Fail(pub ApiError);

impl From<ApiError> for Fail {
    fn from(e: ApiError) -> Fail {
        Fail(e)
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(self.0.body())).into_response();
        // 503 `unavailable` (a store that refused an earlier write, an explanation not ready yet: nothing was
        // changed) is worth another try: clients retry it, with the same idempotency key for a submission (`gpunet`'s
        // client does so for up to 30 s, on the next replica when several are named). `interrupted` (the owner ended
        // before answering, or the store refused this very write) may or may not have taken effect: [`observe`] adds
        // `Retry-After` only where sending it again is safe.
        if self.0.code == "interrupted" {
            r.headers_mut().insert(OUTCOME, axum::http::HeaderValue::from_static("unknown"));
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

type R<T> = Result<T, Fail>;

/// The header of an answer whose request may or may not have taken effect (`interrupted`, see [`ask`]).
const OUTCOME: &str = "gpunet-outcome";

fn bearer(h: &HeaderMap) -> R<&str> {
    Ok(h.get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::new("unauthorized", "missing bearer token: send Authorization: Bearer <token>"))?)
}

fn who(st: &AppState, h: &HeaderMap) -> R<Principal> {
    Ok(cred(st, h)?.who)
}

/// The bearer token's credential; an expired token is refused like an unknown one.
fn cred(st: &AppState, h: &HeaderMap) -> R<crate::tokens::Cred> {
    cred_of(st, &hash_token(bearer(h)?))
}

/// The credential of the token whose hash is `hash`; an expired token is refused like an unknown one.
fn cred_of(st: &AppState, hash: &str) -> R<crate::tokens::Cred> {
    let c = st
        .auth
        .read()
        .expect("auth lock")
        .get(hash)
        .cloned()
        .ok_or_else(|| Fail(ApiError::new("unauthorized", "unknown token")))?;
    if c.expired(crate::now_ms()) {
        return Err(Fail(ApiError::new("unauthorized", "the token has expired")));
    }
    Ok(c)
}

/// A user's credential (not the join token, not a node's).
fn user_cred(st: &AppState, h: &HeaderMap) -> R<crate::tokens::Cred> {
    let c = cred(st, h)?;
    user_of(c.who.clone())?;
    Ok(c)
}

fn user_of(p: Principal) -> R<Principal> {
    match p {
        Principal::Agent => Err(Fail(ApiError::new("forbidden", "the join token only registers nodes"))),
        Principal::Node(_) => Err(Fail(ApiError::new("forbidden", "a node credential only syncs its node"))),
        p => Ok(p),
    }
}

fn user(st: &AppState, h: &HeaderMap) -> R<Principal> {
    user_of(who(st, h)?)
}

fn admin(st: &AppState, h: &HeaderMap) -> R<()> {
    match who(st, h)? {
        Principal::Admin => Ok(()),
        _ => Err(Fail(ApiError::new("forbidden", "this needs the admin token"))),
    }
}

/// Asks the owner. An owner that ended before answering (a leader whose term ended, `ha.rs`, or a server shutting
/// down) gives 503 `interrupted`: whether a change was made is not known. [`observe`] adds `Retry-After` only where
/// sending the request again is safe (a read, or a submission with an `Idempotency-Key`: the next leader has the job
/// or not), so no client is told to retry, say, a token's creation that may have happened.
async fn ask<T>(st: &AppState, make: impl FnOnce(oneshot::Sender<Result<T, ApiError>>) -> Cmd) -> R<T> {
    let gone = || {
        ApiError::new(
            "interrupted",
            "the server's control loop ended before answering (a leader stepping down, or a server shutting down): \
             whether the change was made is not known; read it back, or send a submission again with the same \
             Idempotency-Key",
        )
    };
    let (tx, rx) = oneshot::channel();
    st.tx.send(make(tx)).await.map_err(|_| gone())?;
    rx.await.map_err(|_| gone())?.map_err(Fail)
}

fn body_text(b: &Bytes) -> Result<&str, ApiError> {
    std::str::from_utf8(b).map_err(|_| ApiError::parse("the body is not UTF-8 text"))
}

/// Bodies up to this size are parsed where they arrive: their parse is bounded (the linear pre-parse scan of
/// `gpunet_api::limits` comes first) and takes microseconds, less than a hand-off to the blocking pool.
const PARSE_INLINE_MAX: usize = 16 * 1024;

/// Parses a body; larger ones on the blocking pool, at most two at a time, so that parsing never holds up the async
/// workers.
async fn parse_off_thread<T: Send + 'static>(
    st: &AppState,
    body: Bytes,
    f: impl FnOnce(&str) -> Result<T, ApiError> + Send + 'static,
) -> R<T> {
    if body.len() <= PARSE_INLINE_MAX {
        return f(body_text(&body)?).map_err(Fail);
    }
    let _slot = st.parse_slots.acquire().await.map_err(|_| ApiError::new("internal", "the server is shutting down"))?;
    tokio::task::spawn_blocking(move || f(body_text(&body)?))
        .await
        .map_err(|_| ApiError::new("internal", "parse the body"))?
        .map_err(Fail)
}

/// How many times `max_streams_per_token` the tokens of one tenant may hold together.
pub(crate) const TENANT_STREAMS_PER_TOKEN: usize = 4;

/// One open log or event stream of a token (and of its tenant); the counts drop when the stream ends.
struct StreamSlot {
    streams: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    keys: Vec<String>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut m = self.streams.lock().expect("streams lock");
        for key in &self.keys {
            if let Some(n) = m.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    m.remove(key);
                }
            }
        }
    }
}

fn stream_slot(st: &AppState, h: &HeaderMap) -> R<StreamSlot> {
    let token = hash_token(bearer(h)?);
    // A tenant's tokens share a bound too (tokens are hashes; a tenant's key cannot be one: it has a colon).
    let tenant = match cred_of(st, &token)?.who {
        Principal::Tenant(t) => Some(format!("tenant:{t}")),
        _ => None,
    };
    let per_tenant = st.max_streams_per_token.saturating_mul(TENANT_STREAMS_PER_TOKEN);
    let mut m = st.streams.lock().expect("streams lock");
    let n = m.get(&token).copied().unwrap_or(0);
    if n >= st.max_streams_per_token {
        return Err(Fail(ApiError::limit(format!(
            "this token has {n} log or event streams open; the server allows at most {} per token \
             (--max-streams-per-token)",
            st.max_streams_per_token
        ))));
    }
    if let Some(t) = &tenant {
        let n = m.get(t).copied().unwrap_or(0);
        if n >= per_tenant {
            return Err(Fail(ApiError::limit(format!(
                "this tenant's tokens have {n} log or event streams open; the server allows at most {per_tenant} \
                 per tenant ({TENANT_STREAMS_PER_TOKEN} times --max-streams-per-token)"
            ))));
        }
    }
    let keys: Vec<String> = std::iter::once(token).chain(tenant).collect();
    for k in &keys {
        *m.entry(k.clone()).or_default() += 1;
    }
    Ok(StreamSlot { streams: st.streams.clone(), keys })
}
fn json<T: Serialize>(status: StatusCode, v: T) -> Response {
    (status, Json(v)).into_response()
}

fn parse_id(s: &str) -> R<u64> {
    let t = s.strip_prefix("job-").unwrap_or(s);
    t.parse().map_err(|_| Fail(ApiError::invalid("id", s, "a job id like 42 or job-42")))
}

fn query(q: &Option<String>, allowed: &[&str]) -> R<HashMap<String, String>> {
    let mut out = HashMap::new();
    for pair in q.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = v.replace('+', " ");
        let v = percent_decode(&v);
        if !allowed.contains(&k) {
            return Err(Fail(ApiError::unknown(k, &allowed.join(", "))));
        }
        // A repeated parameter is refused, not resolved by whichever value comes last.
        if out.contains_key(k) {
            return Err(Fail(ApiError::invalid(k, &v, "the parameter once")));
        }
        out.insert(k.to_string(), v);
    }
    Ok(out)
}

/// The `limit` query parameter: 1 to `max`, `default` when absent.
fn limit_param(q: &HashMap<String, String>, max: usize, default: usize) -> R<usize> {
    match q.get("limit") {
        Some(l) => Ok(l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=max).contains(l))
            .ok_or_else(|| ApiError::invalid("limit", l, &format!("1 to {max}")))?),
        None => Ok(default),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let Some(x) = std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn with_tenant(mut job: gpunet_api::spec::JobSubmission, q: &Option<String>) -> R<gpunet_api::spec::JobSubmission> {
    let q = query(q, &["tenant"])?;
    if job.tenant.is_none() {
        job.tenant = q.get("tenant").cloned();
    }
    Ok(job)
}

/// The `Idempotency-Key` header: 1 to 255 visible ASCII characters.
fn idempotency_key(h: &HeaderMap) -> R<Option<String>> {
    let Some(v) = h.get("idempotency-key") else { return Ok(None) };
    match v.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()) => Ok(Some(k.to_string())),
        _ => Err(Fail(ApiError::invalid(
            "Idempotency-Key",
            &String::from_utf8_lossy(v.as_bytes()),
            "1 to 255 visible ASCII characters",
        ))),
    }
}

/// A submission's answer: 201 with the new jobs, or 200 with `Idempotent-Replayed: true` and the jobs an earlier try
/// with the same `Idempotency-Key` made.
fn submitted<T: Serialize>(v: T, replayed: bool) -> Response {
    if replayed {
        let mut r = json(StatusCode::OK, v);
        r.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
        r
    } else {
        json(StatusCode::CREATED, v)
    }
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", summary = "Submit a job (durable when acknowledged)", params(("tenant" = Option<String>, Query, description = "The tenant to submit to (admin tokens; a tenant token submits to its own)"), ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters; a retry with the same key from the same submitter gets the jobs the first try made (200, header Idempotent-Replayed: true)")), request_body(description = "A gpunet job spec (JSON or YAML) or a Kubernetes batch/v1 Job (YAML or JSON)", content((gpunet_api::spec::JobSubmission = "application/json"), (gpunet_api::spec::JobSubmission = "application/yaml"))), responses((status = 201, description = "Submitted", body = Submitted), (status = 200, description = "A replay: the job an earlier try with this Idempotency-Key made", body = Submitted)))]
async fn submit(State(st): State<AppState>, h: HeaderMap, RawQuery(q): RawQuery, body: Bytes) -> R<Response> {
    let c = user_cred(&st, &h)?;
    let key = idempotency_key(&h)?;
    let mut parsed = parse_off_thread(&st, body, parse_job).await?;
    parsed.job = with_tenant(parsed.job, &q)?;
    let (p, by) = (c.who.clone(), c.submitter());
    let subs = vec![(parsed.job, parsed.warnings)];
    let (mut out, replayed) = ask(&st, |reply| Cmd::Submit { who: p, by, subs, key, reply }).await?;
    Ok(submitted(out.remove(0), replayed))
}

#[utoipa::path(post, path = "/v1/jobs/batch", tag = "jobs", summary = "Submit up to 10000 jobs at once, all or none", params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters; a retry with the same key from the same submitter gets the jobs the first try made (200, header Idempotent-Replayed: true)")), request_body(description = "A JSON array of gpunet job specs", content = Vec<gpunet_api::spec::JobSubmission>, content_type = "application/json"), responses((status = 201, description = "Submitted, in the order given", body = Vec<Submitted>), (status = 200, description = "A replay: the jobs an earlier try with this Idempotency-Key made", body = Vec<Submitted>)))]
async fn submit_batch(State(st): State<AppState>, h: HeaderMap, body: Bytes) -> R<Response> {
    let c = user_cred(&st, &h)?;
    let key = idempotency_key(&h)?;
    let (p, by) = (c.who.clone(), c.submitter());
    let subs = parse_off_thread(&st, body, |text| {
        gpunet_api::limits::check_json_depth(text)?;
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ApiError::parse(format!("parse the batch: {e}")))?;
        let arr = v.as_array().ok_or_else(|| ApiError::invalid("body", "not an array", "a JSON array of job specs"))?;
        if arr.is_empty() || arr.len() > 10_000 {
            return Err(ApiError::invalid("body", &format!("{} jobs", arr.len()), "1 to 10000 jobs"));
        }
        let mut subs = Vec::with_capacity(arr.len());
        for (i, x) in arr.iter().enumerate() {
            let p = parse_job(&x.to_string()).map_err(|mut e| {
                e.message = format!("jobs[{i}]: {}", e.message);
                e
            })?;
            subs.push((p.job, p.warnings));
        }
        Ok(subs)
    })
    .await?;
    let (out, replayed) = ask(&st, |reply| Cmd::Submit { who: p, by, subs, key, reply }).await?;
    Ok(submitted(out, replayed))
}

#[utoipa::path(post, path = "/v1/jobs/dry-run", tag = "jobs", summary = "Where and when a job would start, without queuing it", params(("tenant" = Option<String>, Query, description = "The tenant to submit to (admin tokens; a tenant token submits to its own)")), request_body(description = "A gpunet job spec (JSON or YAML) or a Kubernetes batch/v1 Job (YAML or JSON)", content((gpunet_api::spec::JobSubmission = "application/json"), (gpunet_api::spec::JobSubmission = "application/yaml"))), responses((status = 200, description = "Placement and predicted start", body = DryRun)))]
async fn dry_run(State(st): State<AppState>, h: HeaderMap, RawQuery(q): RawQuery, body: Bytes) -> R<Response> {
    let c = user_cred(&st, &h)?;
    let (p, by) = (c.who.clone(), c.submitter());
    let mut parsed = parse_off_thread(&st, body, parse_job).await?;
    parsed.job = with_tenant(parsed.job, &q)?;
    // Two at a time: the others wait their turn before the owner copies the state for them.
    let _slot =
        st.dry_run_slots.acquire().await.map_err(|_| ApiError::new("internal", "the server is shutting down"))?;
    let work =
        ask(&st, |reply| Cmd::DryRun { who: p, by, sub: Box::new(parsed.job), warnings: parsed.warnings, reply })
            .await?;
    // The pass and the replay run on the blocking pool, not on the owner.
    let r = tokio::task::spawn_blocking(move || work.answer())
        .await
        .map_err(|e| Fail(ApiError::new("internal", format!("dry run: {e}"))))?;
    Ok(json(StatusCode::OK, r))
}

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", summary = "List jobs, by id (a tenant sees its own)", params(("tenant" = Option<String>, Query, description = "Only this tenant's"), ("state" = Option<String>, Query, description = "Only jobs in one of these states, comma-separated: pending, running, preempted, restarting, succeeded, failed or cancelled"), ("user" = Option<String>, Query, description = "Only jobs this user submitted"), ("order" = Option<String>, Query, description = "oldest (by id, the default) or newest"), ("before" = Option<u64>, Query, description = "Only jobs with a smaller id (paging newest first)"), ("after" = Option<u64>, Query, description = "Only jobs with a larger id (paging: the previous page's `next`)"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "At most this many (default 100)")), responses((status = 200, description = "A page of jobs", body = JobPage)))]
async fn list_jobs(State(st): State<AppState>, h: HeaderMap, RawQuery(q): RawQuery) -> R<Response> {
    let p = user(&st, &h)?;
    let q = query(&q, &["tenant", "state", "user", "after", "before", "order", "limit"])?;
    let mut states = Vec::new();
    if let Some(s) = q.get("state") {
        // One state or several, comma-separated: `pending,running`.
        for x in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let Some(state) = crate::owner::STATES.into_iter().find(|k| k.as_str() == x) else {
                let known: Vec<&str> = crate::owner::STATES.iter().map(|k| k.as_str()).collect();
                return Err(Fail(ApiError::invalid("state", x, &known.join(", "))));
            };
            states.push(state);
        }
    }
    let after = match q.get("after") {
        Some(a) => parse_id(a)?,
        None => 0,
    };
    let before = q.get("before").map(|b| parse_id(b)).transpose()?;
    let newest = match q.get("order").map(String::as_str) {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(o) => return Err(Fail(ApiError::invalid("order", o, "oldest or newest"))),
    };
    if before.is_some() && !newest {
        return Err(Fail(ApiError::invalid("before", &before.unwrap_or(0).to_string(), "only with order=newest")));
    }
    let filter = crate::owner::JobFilter {
        tenant: q.get("tenant").cloned(),
        states,
        user: q.get("user").cloned(),
        after,
        before,
        newest,
        limit: limit_param(&q, 1000, 100)?,
    };
    // The owner gathers the page; its submissions are parsed, and the page written, on the read lane. The read's
    // place there is held until the lane has answered, even if the client has gone.
    let admitted = st.reads.admit(&p).await;
    let page = ask(&st, |reply| Cmd::List { who: p, filter, reply }).await?;
    Ok(st.reads.json(StatusCode::OK, admitted, move || page.parse()).await?)
}

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", summary = "A job", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]")), responses((status = 200, description = "The job", body = JobView)))]
async fn get_job(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    let p = user(&st, &h)?;
    let id = parse_id(&id)?;
    let admitted = st.reads.admit(&p).await;
    let job = ask(&st, |reply| Cmd::Get { who: p, id, reply }).await?;
    Ok(st.reads.json(StatusCode::OK, admitted, move || job.parse()).await?)
}

#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", summary = "Cancel a job (or a whole array)", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]")), responses((status = 200, description = "The job after the cancel", body = JobView)))]
async fn cancel_job(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    let p = user(&st, &h)?;
    let id = parse_id(&id)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Cancel { who: p, id, reply }).await?))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/hold", tag = "jobs", summary = "Hold a queued job (or a whole array): it is not scheduled until released", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]")), responses((status = 200, description = "The job, held", body = JobView)))]
async fn hold_job(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    let p = user(&st, &h)?;
    let id = parse_id(&id)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Hold { who: p, id, hold: true, reply }).await?))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/release", tag = "jobs", summary = "Release a held job (or array): it is scheduled like a new one", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]")), responses((status = 200, description = "The job, released", body = JobView)))]
async fn release_job(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    let p = user(&st, &h)?;
    let id = parse_id(&id)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Hold { who: p, id, hold: false, reply }).await?))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/explain", tag = "jobs", summary = "Why a job is pending, with numbers and an ETA", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]")), responses((status = 200, description = "The explanation", body = Explain)))]
async fn explain_job(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    use crate::owner::snapshot::Explained;
    let token = hash_token(bearer(&h)?);
    let p = user_of(cred_of(&st, &token)?.who)?;
    let id = parse_id(&id)?;
    // The owner checks that `p` may see the job and explains what needs no pass; a queued job is explained by the
    // queue view's build. A job the view says is not queued (any more) is asked about once more, then from a view
    // built after that answer.
    let mut at_least = 0;
    for _ in 0..2 {
        let who = p.clone();
        let tenant = match ask(&st, |reply| Cmd::Explain { who, id, reply }).await? {
            crate::owner::Why::Now(e) => return Ok(json(StatusCode::OK, e)),
            crate::owner::Why::Queued { tenant } => tenant,
        };
        match st.queue.explain(&token, id, &tenant, matches!(p, Principal::Admin), at_least).await {
            Explained::Queued(e) => return Ok(json(StatusCode::OK, e)),
            Explained::NotQueued => at_least = st.queue.seq(),
            Explained::Late => break,
        }
    }
    Err(Fail(ApiError::new("unavailable", format!("job-{id} could not be explained in time: ask again"))))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", summary = "A job's events, oldest first", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]")), responses((status = 200, description = "Events", body = Vec<gpunet_store::EventRow>)))]
async fn job_events(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    let p = user(&st, &h)?;
    let id = parse_id(&id)?;
    ask(&st, |reply| Cmd::Get { who: p, id, reply }).await?; // existence and access
    let store = st.store.clone();
    let rows = tokio::task::spawn_blocking(move || store.events(id))
        .await
        .map_err(|_| ApiError::new("internal", "read events"))?
        .map_err(|e| ApiError::new("internal", e.to_string()))?;
    Ok(json(StatusCode::OK, rows))
}

#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", summary = "Create a tenant (admin); returns its first token (its tenant admin)", request_body(content = TenantRequest, content_type = "application/json"), responses((status = 201, description = "Created", body = TokenIssued)))]
async fn create_tenant(State(st): State<AppState>, h: HeaderMap, body: Bytes) -> R<Response> {
    admin(&st, &h)?;
    let req: TenantRequest = parse_off_thread(&st, body, |text| {
        gpunet_api::spec::from_document(gpunet_api::spec::parse_document(text)?, "tenant")
    })
    .await?;
    Ok(json(StatusCode::CREATED, ask(&st, |reply| Cmd::CreateTenant { req, reply }).await?))
}

#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", summary = "Tenants with their quota use (a tenant sees itself)", responses((status = 200, description = "Tenants", body = Vec<TenantView>)))]
async fn list_tenants(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    let p = user(&st, &h)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Tenants { who: p, reply }).await?))
}

#[utoipa::path(put, path = "/v1/tenants/{name}/quota", tag = "tenants", summary = "Set a tenant's quota (admin): a QuotaRequest, or a Kubernetes v1 ResourceQuota (YAML or JSON)", params(("name" = String, Path, description = "Tenant")), request_body(content((QuotaRequest = "application/json"), (QuotaRequest = "application/yaml"))), responses((status = 200, description = "The tenant", body = TenantView)))]
async fn set_quota(State(st): State<AppState>, h: HeaderMap, Path(name): Path<String>, body: Bytes) -> R<Response> {
    admin(&st, &h)?;
    valid_name("tenant", &name)?;
    let (v, k8s) = parse_off_thread(&st, body, |text| {
        let v = gpunet_api::spec::parse_document(text)?;
        let k8s = if v.get("kind").and_then(|k| k.as_str()) == Some("ResourceQuota") {
            Some(gpunet_api::quota_from_k8s(text)?)
        } else {
            None
        };
        Ok((v, k8s))
    })
    .await?;
    let quota = if let Some((q, warnings)) = k8s {
        if q.tenant != name {
            return Err(Fail(ApiError::invalid(
                "metadata.namespace",
                &q.tenant,
                &format!("the tenant in the path ({name}); a quota without a namespace is named after its tenant"),
            )));
        }
        for w in &warnings {
            tracing::warn!(tenant = %name, warning = %w, "quota conversion");
        }
        let req = QuotaRequest {
            guarantee_gpus: q.gpus,
            limit_gpus: q.gpus,
            guarantee_cpu: q.cpu.map(|c| format!("{}m", c.0)),
            limit_cpu: q.cpu.map(|c| format!("{}m", c.0)),
            guarantee_memory: q.memory.map(|m| format!("{}Mi", m.0)),
            limit_memory: q.memory.map(|m| format!("{}Mi", m.0)),
            per_model_gpus: BTreeMap::new(),
        };
        Some((q.to_core(), req))
    } else if v.is_null() {
        None
    } else {
        let req: QuotaRequest = serde_norway::from_value(v).map_err(|e| {
            let m = e.to_string();
            match m.split("unknown field `").nth(1) {
                Some(r) => ApiError::unknown(r.split('`').next().unwrap_or(""), "guarantee_gpus, limit_gpus, guarantee_cpu, limit_cpu, guarantee_memory, limit_memory, per_model_gpus"),
                None => ApiError::parse(format!("parse the quota: {m}")),
            }
        })?;
        Some((quota_from_request(&req)?, req))
    };
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::SetQuota { tenant: name, quota: quota.map(Box::new), reply }).await?))
}

#[utoipa::path(post, path = "/v1/tenants/{name}/tokens", tag = "tenants", summary = "Issue another token for a tenant (admin)", params(("name" = String, Path, description = "Tenant")), responses((status = 201, description = "The token, shown once", body = TokenIssued)))]
async fn issue_token(State(st): State<AppState>, h: HeaderMap, Path(name): Path<String>) -> R<Response> {
    admin(&st, &h)?;
    Ok(json(StatusCode::CREATED, ask(&st, |reply| Cmd::IssueToken { tenant: name, reply }).await?))
}

/// The tenant a token-managing credential may act for: `None` for the admin (every tenant), its own for a tenant admin.
fn token_scope(c: &crate::tokens::Cred) -> R<Option<String>> {
    match &c.who {
        Principal::Admin => Ok(None),
        Principal::Tenant(t) if c.tenant_admin() => Ok(Some(t.clone())),
        _ => Err(Fail(ApiError::new("forbidden", "tokens are managed by the admin and by a tenant's admins"))),
    }
}

/// `GET /v1/tokens?tenant=T`: tokens, never their secrets (a tenant admin sees its tenant's).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", summary = "Tokens, never their secrets (admin: all; a tenant admin: its tenant's)", params(("tenant" = Option<String>, Query, description = "Only this tenant's")), responses((status = 200, description = "Tokens", body = Vec<TokenInfo>)))]
async fn list_tokens(State(st): State<AppState>, h: HeaderMap, RawQuery(q): RawQuery) -> R<Response> {
    let scope = token_scope(&cred(&st, &h)?)?;
    let q = query(&q, &["tenant"])?;
    let tenant = match (scope, q.get("tenant")) {
        (Some(own), Some(t)) if *t != own => {
            return Err(Fail(ApiError::new("forbidden", "a tenant admin sees only its tenant's tokens")))
        }
        (Some(own), _) => Some(own),
        (None, t) => t.cloned(),
    };
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Tokens { tenant, reply }).await?))
}

/// `POST /v1/tokens`: a new token for a user (shown once).
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", summary = "Create a token for a user (shown once)", request_body(content = TokenRequest, content_type = "application/json"), responses((status = 201, description = "The token", body = TokenCreated)))]
async fn create_token(State(st): State<AppState>, h: HeaderMap, body: Bytes) -> R<Response> {
    let scope = token_scope(&cred(&st, &h)?)?;
    let req: TokenRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::parse(format!("parse the token request: {e}")))?;
    valid_name("user", &req.user)?;
    let tenant = match (req.role, &scope, &req.tenant) {
        (TokenRole::Admin | TokenRole::Join, None, None) => None,
        (TokenRole::Admin | TokenRole::Join, _, Some(t)) => {
            return Err(Fail(ApiError::invalid("tenant", t, "no tenant for admin and join tokens")))
        }
        (TokenRole::Admin | TokenRole::Join, Some(_), None) => {
            return Err(Fail(ApiError::new("forbidden", "a tenant admin makes only its tenant's tokens")))
        }
        (_, Some(own), Some(t)) if t != own => {
            return Err(Fail(ApiError::new("forbidden", "a tenant admin makes only its tenant's tokens")))
        }
        (_, Some(own), _) => Some(own.clone()),
        (_, None, Some(t)) => Some(t.clone()),
        (_, None, None) => {
            return Err(Fail(ApiError::invalid("tenant", "", "the tenant of a tenant or tenant-admin token")))
        }
    };
    let now = crate::now_ms();
    let expires_ms = match &req.expires_in {
        Some(d) => {
            let d = gpunet_api::units::parse_duration("expires_in", d)?;
            if d.0 == 0 || d.0 > 10 * 365 * 86_400_000 {
                return Err(Fail(ApiError::invalid(
                    "expires_in",
                    &req.expires_in.clone().unwrap_or_default(),
                    "1s to 3650d",
                )));
            }
            Some(now + d.0)
        }
        None => None,
    };
    let doc = crate::tokens::TokenDoc {
        role: req.role,
        tenant,
        user: Some(req.user),
        created_ms: now,
        expires_ms,
        bootstrap: false,
    };
    Ok(json(StatusCode::CREATED, ask(&st, |reply| Cmd::CreateToken { doc, reply }).await?))
}

/// `POST /v1/tokens/{id}/revoke`: the token stops working at once.
#[utoipa::path(post, path = "/v1/tokens/{id}/revoke", tag = "tokens", summary = "Revoke a token; it stops working at once", params(("id" = String, Path, description = "Token id (from GET /v1/tokens)")), responses((status = 200, description = "The revoked token", body = TokenInfo)))]
async fn revoke_token(State(st): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> R<Response> {
    let tenant = token_scope(&cred(&st, &h)?)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::RevokeToken { id, tenant, reply }).await?))
}

/// A node's registration (by its agent, with the join token).
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeRegistration {
    /// The node: name, GPUs (model, NUMA node, NVLink domain, PCIe switch, MIG), CPU (millicores), memory (MiB),
    /// labels, taints.
    #[schema(value_type = Object)]
    spec: NodeSpec,
    #[serde(default)]
    fake: bool,
    /// The agent's price per GPU-hour (`--price-per-gpu-hour`), instead of the price catalogue's.
    #[serde(default)]
    price_per_gpu_hour: Option<f64>,
}

/// Bounds a node's numbers, so that cluster totals cannot overflow, and its labels and taints.
fn check_node(n: &NodeSpec) -> Result<(), ApiError> {
    use gpunet_api::units::{MAX_MIB, MAX_MILLI_CPU};
    if n.cpu.0 > MAX_MILLI_CPU {
        return Err(ApiError::invalid("spec.cpu", &n.cpu.0.to_string(), "at most 1000000000000 millicores"));
    }
    if n.mem.0 > MAX_MIB {
        return Err(ApiError::invalid("spec.mem", &n.mem.0.to_string(), "at most 1099511627776 MiB"));
    }
    if n.price_per_gpu_hour > 1e6 {
        return Err(ApiError::invalid("spec.price_per_gpu_hour", &n.price_per_gpu_hour.to_string(), "0 to 1000000"));
    }
    let long = |s: &String| s.len() > 253;
    if n.labels.len() > 64 || n.labels.iter().any(|(k, v)| long(k) || long(v)) {
        return Err(ApiError::invalid("spec.labels", "too many or too long", "at most 64 labels of 253 bytes"));
    }
    if n.taints.len() > 64 {
        return Err(ApiError::invalid("spec.taints", &n.taints.len().to_string(), "at most 64 taints"));
    }
    Ok(())
}

#[utoipa::path(post, path = "/v1/nodes", tag = "nodes", summary = "Register a node (join token); returns the node's own credential", request_body(content = NodeRegistration, content_type = "application/json"), responses((status = 201, description = "Registered", body = NodeRegistered)))]
async fn register_node(State(st): State<AppState>, h: HeaderMap, body: Bytes) -> R<Response> {
    let p = who(&st, &h)?;
    if matches!(p, Principal::Tenant(_)) {
        return Err(Fail(ApiError::new(
            "forbidden",
            "nodes register with the join token, the admin token or their own credential",
        )));
    }
    let reg: NodeRegistration =
        serde_json::from_slice(&body).map_err(|e| ApiError::parse(format!("parse the node registration: {e}")))?;
    if let Principal::Node(n) = &p {
        if *n != reg.spec.name {
            return Err(Fail(ApiError::new("forbidden", "a node credential registers only its own node")));
        }
    }
    check_node(&reg.spec)?;
    if let Some(p) = reg.price_per_gpu_hour {
        gpunet_core::pricing::check_price("price_per_gpu_hour", p).map_err(|_| {
            ApiError::invalid("price_per_gpu_hour", &p.to_string(), "a number from 0 to 1000000 (per GPU-hour)")
        })?;
    }
    let (spec, fake, price) = (reg.spec, reg.fake, reg.price_per_gpu_hour);
    let join = matches!(p, Principal::Agent);
    let node_token = matches!(p, Principal::Node(_)).then(|| hash_token(bearer(&h).unwrap_or_default()));
    Ok(json(
        StatusCode::CREATED,
        ask(&st, |reply| Cmd::RegisterNode { spec, fake, price, join, node_token, reply }).await?,
    ))
}

#[utoipa::path(get, path = "/v1/nodes", tag = "nodes", summary = "Nodes with their GPUs", responses((status = 200, description = "Nodes", body = Vec<NodeView>)))]
async fn list_nodes(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    let p = user(&st, &h)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Nodes { who: p, reply }).await?))
}

#[utoipa::path(post, path = "/v1/nodes/{name}/{action}", tag = "nodes", summary = "Cordon, drain or uncordon a node (admin), or reclaim it (admin, or the node's own credential: its provider's notice)", description = "`reclaim` takes `{\"deadline_s\": N}`: the node takes no new work; each job on it is asked to checkpoint now (its `checkpoint_signal` and the `GPUNET_CHECKPOINT_NOW` file), its final snapshot is copied to its tiers and it resumes elsewhere from it; at the deadline whatever still runs there is stopped. A pool's node is deleted once empty.", params(("name" = String, Path, description = "Node"), ("action" = String, Path, description = "cordon, drain, uncordon or reclaim")), request_body(content = Option<ReclaimRequest>, content_type = "application/json"), responses((status = 200, description = "The node", body = NodeView)))]
async fn node_action(
    State(st): State<AppState>,
    h: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    body: Bytes,
) -> R<Response> {
    if action == "reclaim" {
        // The provider's notice: the admin, or the node's own agent (its notice command).
        match who(&st, &h)? {
            Principal::Admin => {}
            Principal::Node(n) if n == name => {}
            _ => {
                return Err(Fail(ApiError::new(
                    "forbidden",
                    "a reclaim notice comes from an admin or from the node's own credential",
                )))
            }
        }
        let req: ReclaimRequest =
            serde_json::from_slice(&body).map_err(|e| ApiError::parse(format!("parse the reclaim notice: {e}")))?;
        if !req.deadline_s.is_finite() || !(0.1..=86_400.0).contains(&req.deadline_s) {
            return Err(Fail(ApiError::invalid("deadline_s", &req.deadline_s.to_string(), "0.1 to 86400 seconds")));
        }
        let deadline_s = req.deadline_s;
        return Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Reclaim { name, deadline_s, reply }).await?));
    }
    admin(&st, &h)?;
    let state = match action.as_str() {
        "cordon" => NodeState::Cordoned,
        "drain" => NodeState::Draining,
        "uncordon" => NodeState::Ready,
        a => return Err(Fail(ApiError::invalid("action", a, "cordon, drain, uncordon or reclaim"))),
    };
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::SetNodeState { name, state, reply }).await?))
}

#[utoipa::path(get, path = "/v1/pools", tag = "nodes", summary = "Node pools: their nodes, forecast and latest events (admin)", responses((status = 200, description = "Pools", body = Vec<PoolView>)))]
async fn list_pools(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    admin(&st, &h)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Pools { reply }).await?))
}

#[utoipa::path(get, path = "/v1/cluster", tag = "cluster", summary = "Cluster totals (a tenant token: its own jobs' counts by state)", responses((status = 200, description = "Summary", body = ClusterSummary)))]
async fn cluster(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    let who = user(&st, &h)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::Summary { who, reply }).await?))
}

#[utoipa::path(get, path = "/v1/usage", tag = "cluster", summary = "Usage and cost per tenant, user and GPU model over a period", params(("from_ms" = Option<u64>, Query, description = "Start, ms since the Unix epoch (default 30 days ago)"), ("to_ms" = Option<u64>, Query, description = "End (default now)"), ("tenant" = Option<String>, Query, description = "Only this tenant")), responses((status = 200, description = "The report", body = UsageReport)))]
async fn usage(State(st): State<AppState>, h: HeaderMap, RawQuery(q): RawQuery) -> R<Response> {
    let p = user(&st, &h)?;
    let q = query(&q, &["from_ms", "to_ms", "tenant"])?;
    let now = crate::now_ms();
    let num = |k: &str, d: u64| -> R<u64> {
        match q.get(k) {
            Some(v) => v.parse().map_err(|_| Fail(ApiError::invalid(k, v, "milliseconds since the Unix epoch"))),
            None => Ok(d),
        }
    };
    let from = num("from_ms", now.saturating_sub(30 * 86_400_000))?;
    let to = num("to_ms", now)?;
    if to < from {
        return Err(Fail(ApiError::invalid("to_ms", &to.to_string(), "a time at or after from_ms")));
    }
    let tenant = match (&p, q.get("tenant")) {
        (Principal::Tenant(t), Some(x)) if x != t => {
            return Err(Fail(ApiError::new("forbidden", "a tenant token sees only its own usage")))
        }
        (Principal::Tenant(t), _) => Some(t.clone()),
        (_, x) => x.cloned(),
    };
    // The running attempts first, answered once every write queued before them is durable; then the ledger. An
    // attempt that ended before the live rows were taken is in the ledger; one running then is in the live rows, and
    // if it ended since, in the ledger too, whole: its live rows are dropped. (Read the other way round, an attempt
    // ending between the two reads was in neither.)
    let live = ask(&st, |reply| Cmd::LiveUsage { who: p, reply }).await?;
    let store = st.store.clone();
    let t2 = tenant.clone();
    let mut rows = tokio::task::spawn_blocking(move || store.usage(t2.as_deref(), from, to))
        .await
        .map_err(|_| ApiError::new("internal", "read usage"))?
        .map_err(|e| ApiError::new("internal", e.to_string()))?;
    let ended: std::collections::HashSet<(u64, u64)> = rows.iter().map(|r| (r.job, r.start_ms)).collect();
    rows.extend(
        live.into_iter()
            .filter(|r| tenant.as_ref().is_none_or(|t| *t == r.tenant))
            .filter(|r| !ended.contains(&(r.job, r.start_ms))),
    );
    let mut report = UsageReport {
        currency: st.currency.clone(),
        from_ms: from,
        to_ms: to,
        tenants: BTreeMap::new(),
        jobs: BTreeMap::new(),
        by_model: BTreeMap::new(),
        by_user: BTreeMap::new(),
    };
    for r in rows {
        // Bill only the part of each interval inside [from, to), per second.
        let span = (r.end_ms.saturating_sub(r.start_ms)).max(1) as f64;
        let inside = (r.end_ms.min(to).saturating_sub(r.start_ms.max(from))) as f64 / span;
        let model = format!("{}/{}", if r.gpu_model.is_empty() { "cpu" } else { &r.gpu_model }, r.lifecycle);
        let by = if r.submitted_by.is_empty() { "-" } else { &r.submitted_by };
        let user = format!("{}/{by}", r.tenant);
        let part = UsageTotals {
            gpu_hours: r.gpu_seconds * inside / 3600.0,
            cpu_hours: r.cpu_seconds * inside / 3600.0,
            memory_gib_hours: r.mem_gib_seconds * inside / 3600.0,
            gpu_cost: r.gpu_cost * inside,
            cpu_cost: r.cpu_cost * inside,
            mem_cost: r.mem_cost * inside,
            cost: r.cost * inside,
            sampled_gpu_hours: r.sampled_gpu_seconds * inside / 3600.0,
            busy_gpu_hours: r.busy_gpu_seconds * inside / 3600.0,
        };
        *report.tenants.entry(r.tenant.clone()).or_default() += &part;
        *report.jobs.entry(r.job).or_default() += &part;
        *report.by_model.entry(model).or_default() += &part;
        *report.by_user.entry(user).or_default() += &part;
    }
    Ok(json(StatusCode::OK, report))
}

#[utoipa::path(get, path = "/v1/events", tag = "cluster", summary = "Server-sent events: every job event (a tenant sees its own)", responses((status = 200, description = "An event stream; each data line is a JSON event", body = String, content_type = "text/event-stream")))]
async fn events(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    let p = user(&st, &h)?;
    let slot = stream_slot(&st, &h)?;
    let rx = st.events.subscribe();
    let stream = futures_util::stream::unfold((rx, p, slot), |(mut rx, p, slot)| async move {
        loop {
            match rx.recv().await {
                Ok(msg) => {
                    if let Principal::Tenant(t) = &p {
                        let v: serde_json::Value = serde_json::from_str(&msg).unwrap_or_default();
                        if v.get("tenant").and_then(|x| x.as_str()) != Some(t.as_str()) {
                            continue;
                        }
                    }
                    return Some((Ok::<Event, std::convert::Infallible>(Event::default().data(msg)), (rx, p, slot)));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// `POST /v1/agents/{node}/sync`: apply the agent's report; answer with the node's task set, holding the request up to
/// a second (a quarter of the node's loss time, when that is shorter) while it does not change.
#[utoipa::path(post, path = "/v1/agents/{node}/sync", tag = "agents", summary = "An agent's report; the answer is its node's task set (the node's own credential)", params(("node" = String, Path, description = "Node")), request_body(content = gpunet_api::agent::AgentSync, content_type = "application/json"), responses((status = 200, description = "The node's work", body = gpunet_api::agent::AgentWork)))]
async fn agent_sync(State(st): State<AppState>, h: HeaderMap, Path(node): Path<String>, body: Bytes) -> R<Response> {
    match who(&st, &h)? {
        Principal::Node(n) if n == node => {}
        _ => {
            return Err(Fail(ApiError::new(
                "forbidden",
                "a node syncs only with its own credential (from its registration)",
            )))
        }
    }
    let sync: gpunet_api::agent::AgentSync =
        serde_json::from_slice(&body).map_err(|e| ApiError::parse(format!("parse the agent report: {e}")))?;
    if sync.held_jobs.len() > gpunet_api::agent::HELD_JOBS_MAX {
        return Err(Fail(ApiError::invalid(
            "held_jobs",
            &sync.held_jobs.len().to_string(),
            &format!("at most {} jobs per report", gpunet_api::agent::HELD_JOBS_MAX),
        )));
    }
    let known = sync.known_version;
    let sync_failures = sync.checkpoint_failures;
    // A report (or a question: which of its jobs ended) is answered at once (its agent holds what happens meanwhile
    // for the next one); a sync with none waits for news for the node.
    let reported = !sync.exited.is_empty()
        || !sync.started.is_empty()
        || !sync.logs.is_empty()
        || !sync.checkpoints.is_empty()
        || !sync.checkpoints_now.is_empty()
        || !sync.held_jobs.is_empty();
    if !sync.logs.is_empty() {
        // Only the node's own task attempts' logs are kept.
        let asked = sync.logs.iter().map(|c| c.task).collect();
        let n = node.clone();
        let mine = ask(&st, |reply| Cmd::NodeTasks { node: n, asked, reply }).await?;
        let dir = st.logs_dir.clone();
        let chunks: Vec<_> = sync.logs.iter().filter(|c| mine.contains(&c.task)).cloned().collect();
        tokio::task::spawn_blocking(move || append_logs(&dir, &chunks))
            .await
            .map_err(|_| ApiError::new("internal", "store logs"))?
            .map_err(|e| ApiError::new("internal", format!("store logs: {e}")))?;
    }
    let notify = crate::owner::notify_of(&st.notifies, &node);
    let woken = notify.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    let n = node.clone();
    let work = ask(&st, |reply| Cmd::AgentSync { node: n, sync, reply }).await?;
    if work.version != known || reported {
        return Ok(with_epoch(&st, json(StatusCode::OK, work)));
    }
    // A held sync must never make its node look silent, nor outlast the agent's wait for an answer (a quarter of
    // its fence time at least).
    let hold = work.lost_after_ms.map_or(1000, |l| (l / 4).clamp(10, 1000));
    let _ = tokio::time::timeout(std::time::Duration::from_millis(hold), woken).await;
    let again =
        gpunet_api::agent::AgentSync { known_version: known, checkpoint_failures: sync_failures, ..Default::default() };
    let work = ask(&st, |reply| Cmd::AgentSync { node, sync: again, reply }).await?;
    Ok(with_epoch(&st, json(StatusCode::OK, work)))
}

/// A leader among replicas marks its agents' task sets with its fencing epoch (`Gpunet-Epoch`): an agent that has
/// seen a newer leader's answer ignores an older one's (a leader that was paused and answers late).
fn with_epoch(st: &AppState, mut r: Response) -> Response {
    if let Some((epoch, _)) = &st.leader {
        r.headers_mut().insert("gpunet-epoch", axum::http::HeaderValue::from(*epoch));
    }
    r
}

fn log_file(dir: &std::path::Path, job: u64, rank: u32, attempt: u32) -> std::path::PathBuf {
    dir.join(format!("job-{job}")).join(format!("rank-{rank}-attempt-{attempt}.log"))
}

/// Appends shipped log chunks, byte for byte; a chunk that starts before the file's end was shipped before and is
/// skipped in part. Directories are created `0700`, files `0600`.
fn append_logs(dir: &std::path::Path, chunks: &[gpunet_api::agent::LogChunk]) -> std::io::Result<()> {
    use std::io::Write as _;
    for c in chunks {
        let p = log_file(dir, c.task.job, c.task.rank, c.task.attempt);
        gpunet_store::private_dir(dir)?;
        gpunet_store::private_dir(p.parent().expect("has a parent"))?;
        let len = std::fs::metadata(&p).map_or(0, |m| m.len());
        let end = c.offset + c.data.len() as u64;
        if end <= len || c.offset > len {
            continue;
        }
        let skip = (len - c.offset) as usize;
        let mut o = std::fs::OpenOptions::new();
        o.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let mut f = o.open(&p)?;
        f.write_all(&c.data[skip.min(c.data.len())..])?;
    }
    Ok(())
}

/// How much of a log one read takes (a stream sends it as one chunk).
const LOG_READ: u64 = 64 * 1024;

/// Reads at most [`LOG_READ`] bytes of `path` from `offset` (nothing when the file is shorter or missing).
fn read_log_at(path: &std::path::Path, offset: u64) -> Vec<u8> {
    use std::io::{Read, Seek};
    let Ok(mut f) = std::fs::File::open(path) else { return Vec::new() };
    let mut buf = Vec::new();
    if f.seek(std::io::SeekFrom::Start(offset)).is_ok() {
        let _ = f.take(LOG_READ).read_to_end(&mut buf);
    }
    buf
}

/// `GET /v1/jobs/{id}/logs?rank=R&follow=true`: the latest attempt's log of a rank; with `follow`, streamed until the
/// job ends.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs", summary = "A rank's output (latest attempt); follow=true streams it until the job ends", params(("id" = String, Path, description = "A job: 42, job-42, or an array element 42[3]"), ("rank" = Option<u32>, Query, description = "Task rank (default 0)"), ("follow" = Option<bool>, Query, description = "Stream until the job ends")), responses((status = 200, description = "The log", body = String, content_type = "text/plain")))]
async fn job_logs(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> R<Response> {
    let p = user(&st, &h)?;
    let id = parse_id(&id)?;
    let q = query(&q, &["rank", "follow"])?;
    let rank: u32 = match q.get("rank") {
        Some(r) => r.parse().map_err(|_| ApiError::invalid("rank", r, "a task rank like 0"))?,
        None => 0,
    };
    let follow = match q.get("follow").map(String::as_str) {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") | Some("") => true,
        Some(v) => return Err(Fail(ApiError::invalid("follow", v, "true or false"))),
    };
    let tasks = ask(&st, |reply| Cmd::Get { who: p.clone(), id, reply }).await?.tasks();
    if rank >= tasks.max(1) {
        return Err(Fail(ApiError::invalid("rank", &rank.to_string(), &format!("0 to {}", tasks.max(1) - 1))));
    }
    let dir = st.logs_dir.join(format!("job-{id}"));
    // The latest attempt of the rank that has a log.
    let latest = move |dir: &std::path::Path| -> Option<std::path::PathBuf> {
        let prefix = format!("rank-{rank}-attempt-");
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_prefix(&prefix)?.strip_suffix(".log")?.parse::<u32>().ok().map(|a| (a, e.path()))
            })
            .max_by_key(|(a, _)| *a)
            .map(|(_, p)| p)
    };
    let slot = stream_slot(&st, &h)?;
    // Read by offset, a bounded chunk at a time: the log is never read whole, and a follower reads only what is new.
    struct Follow {
        off: u64,
        path: Option<std::path::PathBuf>,
        /// The job ended: send what is left, then stop.
        ending: bool,
        st: AppState,
        p: Principal,
        dir: std::path::PathBuf,
        _slot: StreamSlot,
    }
    let start = Follow { off: 0, path: latest(&dir), ending: !follow, st, p, dir, _slot: slot };
    let stream = futures_util::stream::unfold(start, move |mut f| async move {
        loop {
            if !f.ending {
                if let Some(now) = latest(&f.dir) {
                    if f.path.as_ref() != Some(&now) {
                        f.path = Some(now);
                        f.off = 0;
                    }
                }
            }
            if let Some(pth) = f.path.clone() {
                let (off, chunk) = (f.off, pth);
                let data = tokio::task::spawn_blocking(move || read_log_at(&chunk, off)).await.unwrap_or_default();
                if !data.is_empty() {
                    f.off += data.len() as u64;
                    return Some((Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(data)), f));
                }
            }
            if f.ending {
                return None;
            }
            let state = ask(&f.st, |reply| Cmd::Get { who: f.p.clone(), id, reply })
                .await
                .map(|j| j.state().to_string())
                .unwrap_or_default();
            if ["succeeded", "failed", "cancelled", ""].contains(&state.as_str()) {
                // One last look for output shipped with the exit.
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                f.ending = true;
                continue;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    Ok(([("content-type", "text/plain; charset=utf-8")], axum::body::Body::from_stream(stream)).into_response())
}

#[utoipa::path(get, path = "/v1/whoami", tag = "tokens", summary = "Who this token is", responses((status = 200, description = "Role, tenant and token", body = WhoAmI)))]
async fn whoami(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    let c = user_cred(&st, &h)?;
    let token = Some(crate::tokens::info(&hash_token(bearer(&h)?), &c));
    let v = match c.who {
        Principal::Tenant(t) => WhoAmI { role: "tenant".into(), tenant: Some(t), token },
        _ => WhoAmI { role: "admin".into(), tenant: None, token },
    };
    Ok(json(StatusCode::OK, v))
}

/// `GET /v1/queue?limit=N`: queued jobs in policy order with their reasons and predicted starts.
#[utoipa::path(get, path = "/v1/queue", tag = "cluster", summary = "Queued jobs in policy order with their reasons and predicted starts", params(("limit" = Option<u32>, Query, minimum = 1, maximum = 200, description = "At most this many (default 50)")), responses((status = 200, description = "The queue", body = QueueView)))]
async fn queue_view(State(st): State<AppState>, h: HeaderMap, RawQuery(q): RawQuery) -> R<Response> {
    let token = hash_token(bearer(&h)?);
    let p = user_of(cred_of(&st, &token)?.who)?;
    let q = query(&q, &["limit"])?;
    let limit = limit_param(&q, crate::owner::snapshot::QUEUE_ROWS, 50)?;
    let snapshot = st.queue.fresh(&token).await;
    let admitted = st.reads.admit(&p).await;
    Ok(st.reads.json(StatusCode::OK, admitted, move || snapshot.view(&p, limit)).await?)
}

/// `GET /v1/cluster/history`: allocation and queue length sampled every 15 s over the last 12 hours.
#[utoipa::path(get, path = "/v1/cluster/history", tag = "cluster", summary = "Allocation and queue length every 15 s over the last 12 hours", responses((status = 200, description = "Samples, oldest first", body = Vec<HistoryPoint>)))]
async fn history(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    user(&st, &h)?;
    Ok(json(StatusCode::OK, ask(&st, |reply| Cmd::History { reply }).await?))
}

#[utoipa::path(get, path = "/metrics", tag = "cluster", summary = "Prometheus metrics (admin)", responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
async fn metrics(State(st): State<AppState>, h: HeaderMap) -> R<Response> {
    admin(&st, &h)?;
    let gauges = ask(&st, |reply| Cmd::Gauges { reply }).await?;
    Ok(([("content-type", "text/plain; version=0.0.4")], st.metrics.render(&gauges)).into_response())
}

/// `GET /v1/health` (no token): 200 when the control plane accepts changes, 503 when its store refused a write (it is
/// read-only until the cause is fixed and it restarts).
/// Its `role` is `leader` (a lone server leads too); a leader among replicas also names its `epoch` and its address
/// (`leader`); standbys answer `/v1/health` themselves (see `ha`).
#[utoipa::path(get, path = "/v1/health", tag = "cluster", summary = "Whether the control plane accepts changes (no token)", security(()), responses((status = 200, description = "Accepting changes", body = Health), (status = 503, description = "The store refused a write: read-only until restarted", body = Health)))]
async fn health(State(st): State<AppState>) -> Response {
    let writable = st.metrics.store_writable();
    let body = Health {
        status: if writable { "ok" } else { "degraded" }.into(),
        store: if writable { "writable" } else { "refused a write: read-only until restarted" }.into(),
        role: "leader".into(),
        epoch: st.leader.as_ref().map(|(e, _)| *e),
        leader: st.leader.as_ref().map(|(_, a)| a.clone()),
    };
    json(if writable { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body)
}

/// The answer of `GET /v1/health`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    /// `ok` or `degraded`.
    status: String,
    /// The store's state: `writable`, or why it is not.
    store: String,
    /// `leader`, or `standby` (a replica waiting for the lease; see `ha`).
    role: String,
    /// The leader's fencing epoch, among replicas sharing PostgreSQL.
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    /// The leader's address, among replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    leader: Option<String>,
}

#[utoipa::path(get, path = "/v1/openapi.json", tag = "cluster", summary = "This document (no token)", security(()), responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
async fn openapi() -> Response {
    json(StatusCode::OK, crate::openapi::document())
}

async fn not_found_route() -> Fail {
    Fail(ApiError::new("not_found", "no such route; see /v1/openapi.json"))
}

async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    // A metrics label: the standard methods by name, any other (a client may send any token as its method) as
    // "other", so that requests cannot grow the metrics without bound.
    let method = {
        use axum::http::Method as M;
        let m = req.method();
        if [M::GET, M::HEAD, M::POST, M::PUT, M::PATCH, M::DELETE, M::OPTIONS].contains(m) {
            m.as_str().to_string()
        } else {
            "other".to_string()
        }
    };
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    // Safe to send again whatever happened the first time: a read, a submission with an idempotency key, and an
    // agent's registration and sync (an agent sends them again after any failure anyway: a sync reports its node's
    // whole state, and a registration hands the node a credential again).
    let resendable = matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD)
        || req.headers().contains_key("idempotency-key")
        || matches!(route.as_str(), "/v1/nodes" | "/v1/agents/{node}/sync");
    let t = std::time::Instant::now();
    let mut resp = next.run(req).await;
    st.metrics.observe_api(&method, &route, resp.status().as_u16(), t.elapsed().as_secs_f64());
    if resendable && resp.headers().contains_key(OUTCOME) {
        resp.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
    }
    resp
}

async fn too_large(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return Fail(ApiError::new("too_large", "the request body is larger than the server accepts")).into_response();
    }
    resp
}

/// Checks the token before anything else (the body is not read for a request without a valid token).
async fn authenticate(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let token = match bearer(req.headers()).map(hash_token).and_then(|t| cred_of(&st, &t).map(|_| t)) {
        Ok(t) => t,
        Err(f) => return f.into_response(),
    };
    // A change answered with success: this token's reads of the queue view wait for a view that has it. A dry run
    // changes nothing, and agents do not read the queue.
    let path = req.uri().path();
    let changes = !matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD)
        && path != "/v1/jobs/dry-run"
        && !path.starts_with("/v1/agents/");
    let r = next.run(req).await;
    if changes && r.status().is_success() {
        st.queue.wrote(&token);
    }
    r
}

/// The router.
pub fn router(st: AppState) -> Router {
    let max = st.max_body;
    let small = DefaultBodyLimit::max(SMALL_BODY.min(max));
    let spec = DefaultBodyLimit::max(SPEC_BODY.min(max));
    let large = DefaultBodyLimit::max(max);
    let authenticated = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/jobs", post(submit).layer(spec).get(list_jobs))
        .route("/v1/jobs/batch", post(submit_batch).layer(large))
        .route("/v1/jobs/dry-run", post(dry_run).layer(spec))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/jobs/{id}/cancel", post(cancel_job).layer(small))
        .route("/v1/jobs/{id}/hold", post(hold_job).layer(small))
        .route("/v1/jobs/{id}/release", post(release_job).layer(small))
        .route("/v1/jobs/{id}/events", get(job_events))
        .route("/v1/jobs/{id}/explain", get(explain_job))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/tenants", post(create_tenant).layer(small).get(list_tenants))
        .route("/v1/tenants/{name}/quota", put(set_quota).layer(small))
        .route("/v1/tenants/{name}/tokens", post(issue_token).layer(small))
        .route("/v1/tokens", get(list_tokens).post(create_token).layer(small))
        .route("/v1/tokens/{id}/revoke", post(revoke_token).layer(small))
        .route("/v1/nodes", post(register_node).layer(small).get(list_nodes))
        .route("/v1/nodes/{name}/{action}", post(node_action).layer(small))
        .route("/v1/pools", get(list_pools))
        .route("/v1/agents/{node}/sync", post(agent_sync).layer(large))
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/history", get(history))
        .route("/v1/queue", get(queue_view))
        .route("/v1/whoami", get(whoami))
        .route("/v1/usage", get(usage))
        .route("/v1/events", get(events))
        .route_layer(axum::middleware::from_fn_with_state(st.clone(), authenticate));
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/health", get(health))
        .route("/", get(crate::portal::index))
        .route("/portal/{file}", get(crate::portal::asset))
        .merge(authenticated)
        .fallback(not_found_route)
        .layer(axum::middleware::from_fn_with_state(st.clone(), observe))
        .layer(axum::middleware::from_fn(too_large))
        .layer(DefaultBodyLimit::max(SMALL_BODY.min(max)))
        .with_state(st)
}
