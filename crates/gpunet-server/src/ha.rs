//! Several `gpunet server` replicas on one PostgreSQL database, one leader.
//!
//! Every replica listens from the start; who leads is decided by the lease in the database
//! ([`gpunet_store::pg_lease`]). A **gate** in front of the API looks at the replica's role for each request:
//!
//! - the **leader** (while its lease holds on its own clock) passes the request to its term's router — the ordinary
//!   API, over an owner built by [`build`](crate::build) from the store, writing under the term's fencing epoch;
//! - a **standby** answers `GET /v1/health` itself (200, `role: standby` and the leader's address) and every other
//!   request with `307 Temporary Redirect` to the same path on the leader (`Location`, and `Gpunet-Leader`), so a
//!   client may resend it there; `/metrics` gets 503 naming the leader instead (a scraper that follows the redirect
//!   would count the leader twice);
//! - with no leader known (a takeover under way, the database unreachable) or while the new leader recovers, every
//!   request gets 503 with `code: unavailable`, which clients retry.
//!
//! A **term** begins when the election makes this replica leader: the store is opened at the term's epoch and the
//! whole state recovered from it (jobs, nodes, tenants, tokens, idempotency keys); a standby keeps nothing in memory.
//! It ends when the lease is lost (another replica took over, or this one could not renew in time): the gate stops
//! passing requests at once, the owner task is ended, and anything it still sends to the database is refused by the
//! epoch. It ends too when its store refused a write (after which it refuses every later one): the lease is given up
//! so that another replica, or this one with new connections, takes over. Agents keep their tasks running meanwhile
//! and tell the new leader what runs (their sync is level-triggered), so a failover restarts nothing.

use crate::{acceptor, bind, build, http, listen, Config, Running, ServerError};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use gpunet_store::pg_lease::{Elector, LeaseConfig, Role};
use gpunet_store::PgStore;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tower::ServiceExt;

/// Tokens a term generated because the store had none (`(admin, join)`); the binary prints them once.
pub type OnGenerated = Arc<dyn Fn(Option<String>, Option<String>) + Send + Sync>;

/// How a replica takes part.
#[derive(Clone)]
pub struct HaConfig {
    /// The database (`postgres://…`; it may hold a password, never logged).
    pub store_url: String,
    /// Name, address and timings of the lease.
    pub lease: LeaseConfig,
    /// Called with the tokens a term generated.
    pub on_generated: Option<OnGenerated>,
}

impl std::fmt::Debug for HaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaConfig").field("lease", &self.lease).finish_non_exhaustive()
    }
}

/// A leader's term: its epoch and the API over its owner.
struct Term {
    epoch: u64,
    router: Router,
    app: http::AppState,
}

/// What the gate decides from.
struct Gate {
    role: watch::Receiver<Role>,
    term: Mutex<Option<Term>>,
    /// This replica's own address (a standby never redirects to itself).
    me: String,
}

impl Gate {
    fn end_term(&self, why: &str) {
        let term = self.term.lock().expect("term lock").take();
        if let Some(t) = term {
            t.app.owner.abort();
            tracing::warn!(epoch = t.epoch, why, "leader term ended: serving as a standby");
        }
    }
}

/// A replica's part in the election, kept by [`Running`].
pub struct Replica {
    elector: Option<Elector>,
    gate: Arc<Gate>,
    supervisor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("role", &*self.gate.role.borrow()).finish_non_exhaustive()
    }
}

impl Replica {
    /// Its role now.
    pub fn role(&self) -> Role {
        self.gate.role.borrow().clone()
    }

    /// Leaves the election: gives the lease up if it holds it (a standby takes over at its next attempt) and ends
    /// its term.
    pub(crate) async fn leave(mut self) {
        self.supervisor.abort();
        if let Some(e) = self.elector.take() {
            let _ = tokio::task::spawn_blocking(move || e.stop()).await;
        }
        self.gate.end_term("stopping");
    }
}

/// Starts a replica: listens at once, takes part in the election, and returns once its first role is known (as
/// leader: once its state is recovered and it serves).
pub async fn start_ha(cfg: Config, ha: HaConfig) -> Result<Running, ServerError> {
    let acceptor = acceptor(&cfg)?;
    let (listener, addr) = bind(&cfg).await?;
    let (role_tx, role_rx) = watch::channel(Role::Starting);
    let (url, lease) = (ha.store_url.clone(), ha.lease.clone());
    let elector = tokio::task::spawn_blocking(move || {
        Elector::start(&url, lease, move |r| {
            let _ = role_tx.send(r);
        })
    })
    .await
    .map_err(|e| ServerError::Recover { what: "the leader election".into(), reason: e.to_string() })??;
    let gate = Arc::new(Gate { role: role_rx.clone(), term: Mutex::new(None), me: ha.lease.address.clone() });
    let supervisor =
        tokio::spawn(supervise(cfg.clone(), ha.clone(), gate.clone(), role_rx.clone(), elector.resigner()));
    let (stx, srx) = tokio::sync::oneshot::channel::<()>();
    let router = Router::new().fallback(gate_request).with_state(gate.clone());
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    let task = tokio::spawn(listen::serve(listener, router, acceptor, cfg.limits, async {
        let _ = srx.await;
    }));
    tracing::info!(%addr, scheme, holder = %ha.lease.holder, "gpunet server replica listening");
    // The first role, and as leader the first term.
    let mut rx = role_rx;
    let t = Instant::now();
    loop {
        let role = rx.borrow_and_update().clone();
        let ready = match role {
            Role::Starting => false,
            Role::Standby { .. } => true,
            Role::Leader { epoch, .. } => {
                gate.term.lock().expect("term lock").as_ref().is_some_and(|t| t.epoch == epoch)
            }
        };
        if ready || t.elapsed() > Duration::from_secs(300) {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
    }
    Ok(Running {
        addr,
        scheme,
        generated_admin_token: None,
        generated_join_token: None,
        shutdown: stx,
        task,
        ha: Some(Replica { elector: Some(elector), gate, supervisor }),
        pools: None,
    })
}

/// Follows the role: begins a term when elected (recovering the state from the store at the term's epoch), ends it
/// when the lease is lost. A term whose store refused a write (its connection to the database broke mid-commit, say:
/// the store then refuses every later write, so that what is stored stays an exact prefix of what was acknowledged)
/// cannot change anything any more: it is ended and its lease given up, so that another replica — or this one, with
/// new connections, after two polls — takes over and serves.
async fn supervise(
    cfg: Config,
    ha: HaConfig,
    gate: Arc<Gate>,
    mut role: watch::Receiver<Role>,
    resigner: gpunet_store::pg_lease::Resigner,
) {
    let mut resigned = None;
    // Not a sleep restarted by every role change: a leader's lease renewals are role changes too.
    let mut check = tokio::time::interval(STORE_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = role.borrow_and_update().clone();
        match now {
            Role::Leader { epoch, .. } if resigned == Some(epoch) => {}
            Role::Leader { epoch, .. } => {
                let current = gate.term.lock().expect("term lock").as_ref().map(|t| t.epoch);
                if current != Some(epoch) {
                    gate.end_term("a newer term begins");
                    let t0 = Instant::now();
                    let (c, url) = (cfg.clone(), ha.store_url.clone());
                    let built = tokio::task::spawn_blocking(move || {
                        let store = Arc::new(PgStore::open_at(&url, epoch)?);
                        build(&c, store)
                    })
                    .await;
                    match built {
                        Ok(Ok((mut app, admin, join))) => {
                            app.shared_mut().leader = Some((epoch, ha.lease.address.clone()));
                            // Pool agents join the leader's advertised address unless told another.
                            if let Some(p) = &app.pools {
                                p.set_url(ha.lease.address.clone());
                            }
                            let router = http::router(app.clone());
                            let still = matches!(&*role.borrow(), Role::Leader { epoch: e, .. } if *e == epoch);
                            if still {
                                *gate.term.lock().expect("term lock") = Some(Term { epoch, router, app });
                                tracing::info!(
                                    epoch,
                                    recovered_ms = t0.elapsed().as_millis() as u64,
                                    "leading: state recovered from the store; serving"
                                );
                                if admin.is_some() || join.is_some() {
                                    if let Some(f) = &ha.on_generated {
                                        f(admin, join);
                                    }
                                }
                            } else {
                                app.owner.abort();
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::error!(epoch, error = %e, "could not recover the state as leader; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                        Err(e) => {
                            tracing::error!(epoch, error = %e, "recovering the state as leader failed; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                }
            }
            Role::Standby { .. } | Role::Starting => gate.end_term("the lease is lost"),
        }
        tokio::select! {
            changed = role.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = check.tick() => {
                let broken = gate
                    .term
                    .lock()
                    .expect("term lock")
                    .as_ref()
                    .filter(|t| !t.app.metrics.store_writable())
                    .map(|t| t.epoch);
                if let Some(epoch) = broken {
                    tracing::error!(epoch, "the store refused a write: giving the lead up to a replica that can write");
                    gate.end_term("the store refused a write");
                    resigned = Some(epoch);
                    resigner.resign(epoch);
                }
            }
        }
    }
}

/// How often a leader checks that its store still takes writes.
const STORE_CHECK: Duration = Duration::from_millis(250);

/// Every request: to the leader's API, or answered here (see the module's doc).
async fn gate_request(State(g): State<Arc<Gate>>, req: Request) -> Response {
    let role = g.role.borrow().clone();
    let term = g.term.lock().expect("term lock").as_ref().map(|t| (t.epoch, t.router.clone()));
    let path = req.uri().path().to_string();
    match (&role, term) {
        (Role::Leader { epoch, .. }, Some((te, router))) if *epoch == te && role.leads_now() => {
            match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            }
        }
        (Role::Leader { .. }, _) if role.leads_now() => unavailable(
            &path,
            "leader",
            None,
            "this server was just elected leader and is recovering the state; retry in a moment",
        ),
        (Role::Standby { leader: Some(l) }, _) if *l != g.me => {
            if path == "/v1/health" {
                return health(StatusCode::OK, "standby", Some(l));
            }
            if path == "/metrics" {
                return unavailable(&path, "standby", Some(l), &format!("this server is a standby; the leader is {l}"));
            }
            let to = format!("{}{}", l.trim_end_matches('/'), req.uri().path_and_query().map_or("", |p| p.as_str()));
            let mut r = (
                StatusCode::TEMPORARY_REDIRECT,
                axum::Json(
                    gpunet_api::ApiError::new("not_leader", format!("this server is a standby; the leader is {l}"))
                        .body(),
                ),
            )
                .into_response();
            if let Ok(v) = HeaderValue::from_str(&to) {
                r.headers_mut().insert("location", v);
            }
            if let Ok(v) = HeaderValue::from_str(l) {
                r.headers_mut().insert("gpunet-leader", v);
            }
            r
        }
        _ => unavailable(&path, "standby", None, "no leader is elected right now (a takeover is under way); retry"),
    }
}

fn health(status: StatusCode, role: &str, leader: Option<&String>) -> Response {
    let body = serde_json::json!({
        "status": if status == StatusCode::OK { role } else { "unavailable" },
        "role": role,
        "leader": leader,
    });
    (status, axum::Json(body)).into_response()
}

/// 503 (`code: unavailable`), naming the leader when one is known; `/v1/health` gets the health document.
fn unavailable(path: &str, role: &str, leader: Option<&String>, message: &str) -> Response {
    if path == "/v1/health" {
        return health(StatusCode::SERVICE_UNAVAILABLE, role, leader);
    }
    let mut r = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(gpunet_api::ApiError::new("unavailable", message).body()))
        .into_response();
    r.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
    // The gate answered: the request reached no owner, so a client may send any request again.
    if let Ok(v) = HeaderValue::from_str(role) {
        r.headers_mut().insert("gpunet-role", v);
    }
    if let Some(v) = leader.and_then(|l| HeaderValue::from_str(l).ok()) {
        r.headers_mut().insert("gpunet-leader", v);
    }
    r
}
