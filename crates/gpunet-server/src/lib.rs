//! gpunet's control plane: `gpunet server`.
//!
//! One task ([`owner`]) owns the live cluster state; HTTP handlers ([`http`]) authenticate, parse and validate
//! requests, send them to the owner as messages and await its reply. The owner acknowledges a change only after the
//! store reports it durable (the SQLite store group-commits concurrent writes). On start the server recovers tenants,
//! tokens, nodes and jobs from the store, each job in its state (running jobs keep their GPUs).
//!
//! It serves HTTPS ([`tls`]) with connection-level bounds ([`listen`]); plain HTTP only on a loopback address unless
//! `insecure_http` is set.

pub mod ha;
pub mod http;
pub mod listen;
pub mod metrics;
pub mod openapi;
pub mod owner;
pub mod pools;
pub mod portal;
mod reads;
pub mod tls;
pub mod tokens;

use gpunet_core::{ClusterState, JobId, SchedConfig, Time};
use gpunet_store::{Store, TokenRole};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::sync::{broadcast, mpsc};

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The admin token.
    Admin,
    /// A tenant's token.
    Tenant(String),
    /// The join token of node agents: it only registers nodes.
    Agent,
    /// A node's own credential (issued at registration): it syncs that node and nothing else.
    Node(String),
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the database lives.
    pub data_dir: PathBuf,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Admin token; when `None` and none is stored, one is generated and returned once.
    pub admin_token: Option<String>,
    /// Join token for agents; generated like the admin token.
    pub join_token: Option<String>,
    /// Scheduler configuration.
    pub sched: SchedConfig,
    /// Scheduling tick.
    pub tick: std::time::Duration,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// An agent that has not synced for this long loses its node (its jobs restart elsewhere).
    pub node_lost_after: std::time::Duration,
    /// A lost node's tasks stay fenced (their resources allocated) until its agent confirms them gone, or this long.
    pub node_fence_after: std::time::Duration,
    /// Roots checkpoint tier URLs must lie beneath, e.g. `file:///srv/ckpt/{tenant}` or `s3://bucket/{tenant}/`
    /// (`{tenant}`: the job's tenant). Empty: tiers only on the nodes' own disks.
    pub checkpoint_roots: Vec<String>,
    /// Most queued jobs (pending, preempted, restarting) a tenant may have; a submission beyond it gets 429.
    pub max_queued_jobs_per_tenant: usize,
    /// Most bytes of job specs a tenant's unfinished jobs may hold; a submission beyond it gets 429.
    pub max_spec_bytes_per_tenant: u64,
    /// Most log and event streams one token may have open at once; one more gets 429.
    pub max_streams_per_token: usize,
    /// Serve HTTPS with this certificate and key; `None`: plain HTTP (loopback only unless `insecure_http`).
    pub tls: Option<tls::TlsFiles>,
    /// Allow plain HTTP on a non-loopback address (tokens travel in clear text).
    pub insecure_http: bool,
    /// Connection-level bounds.
    pub limits: listen::Limits,
    /// Prices of GPUs (by model and lifecycle), CPU and memory: nodes are priced by it at registration (unless their
    /// agent names its own GPU price) and again at every start.
    pub prices: gpunet_core::PriceCatalogue,
    /// Node pools the server grows and shrinks (see [`pools`]).
    pub pools: Vec<pools::PoolConfig>,
    /// Where pool agents find this server (the providers' settings).
    pub pool_link: pools::AgentLink,
}

/// Default of [`Config::max_queued_jobs_per_tenant`].
pub const DEFAULT_MAX_QUEUED_JOBS_PER_TENANT: usize = 10_000;
/// Default of [`Config::max_spec_bytes_per_tenant`] (64 MiB).
pub const DEFAULT_MAX_SPEC_BYTES_PER_TENANT: u64 = 64 << 20;
/// Default of [`Config::max_streams_per_token`].
pub const DEFAULT_MAX_STREAMS_PER_TOKEN: usize = 16;

impl Config {
    /// Defaults for a data directory.
    pub fn new(data_dir: PathBuf) -> Config {
        Config {
            data_dir,
            listen: "127.0.0.1:7070".parse().expect("valid address"),
            admin_token: None,
            join_token: None,
            sched: SchedConfig::recommended(),
            tick: std::time::Duration::from_secs(1),
            max_body_bytes: 4 << 20,
            node_lost_after: std::time::Duration::from_secs(10),
            node_fence_after: std::time::Duration::from_secs(60),
            checkpoint_roots: Vec::new(),
            max_queued_jobs_per_tenant: DEFAULT_MAX_QUEUED_JOBS_PER_TENANT,
            max_spec_bytes_per_tenant: DEFAULT_MAX_SPEC_BYTES_PER_TENANT,
            max_streams_per_token: DEFAULT_MAX_STREAMS_PER_TOKEN,
            tls: None,
            insecure_http: false,
            limits: listen::Limits::default(),
            prices: gpunet_core::PriceCatalogue::shipped(),
            pools: Vec::new(),
            pool_link: pools::AgentLink::default(),
        }
    }
}

/// Errors of starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] gpunet_store::StoreError),
    /// A stored document or the core refused recovery.
    #[error("recover {what}: {reason}")]
    Recover {
        /// What.
        what: String,
        /// Why.
        reason: String,
    },
    /// The certificate or key.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Plain HTTP on an address other machines reach, without `insecure_http`.
    #[error("listen on {addr}: plain HTTP is allowed only on a loopback address; give a certificate (--tls-cert, --tls-key) or --insecure-http")]
    PlainHttp {
        /// Address.
        addr: SocketAddr,
    },
    /// The socket.
    #[error("listen on {addr}: {source}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A new random token (`gpn_` + 64 hex digits from the OS's random source).
pub fn new_token() -> String {
    use std::io::Read;
    let mut b = [0u8; 32];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        // No /dev/urandom: fall back to hashing time and address entropy (still unguessable in practice).
        let seed = format!("{:?}{}{:p}", std::time::SystemTime::now(), std::process::id(), &b);
        b.copy_from_slice(&Sha256::digest(seed.as_bytes()));
    }
    format!("gpn_{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

/// The stored form of a token.
pub fn hash_token(t: &str) -> String {
    Sha256::digest(t.as_bytes()).iter().map(|x| format!("{x:02x}")).collect()
}

/// A running server.
#[derive(Debug)]
pub struct Running {
    /// Bound address.
    pub addr: SocketAddr,
    /// `https` or `http`.
    pub scheme: &'static str,
    /// The admin token, when generated by this start (print it once).
    pub generated_admin_token: Option<String>,
    /// The join token, when generated by this start.
    pub generated_join_token: Option<String>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    /// As one of several replicas: its part in the election.
    pub ha: Option<ha::Replica>,
    /// The pools' providers (their local agents stop with the server).
    pools: Option<pools::Providers>,
}

impl Running {
    /// The base URL clients use (`https://…` when serving TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Stops accepting requests and waits for in-flight ones (a leader among replicas first gives its lease up, so
    /// that a standby takes over at once).
    pub async fn stop(self) {
        if let Some(p) = &self.pools {
            // No pool acts from now on; hooks under way get a little time to end (their results recorded by the
            // owner, still running), then are killed with their process groups.
            p.stop_hooks();
            p.end_hooks(std::time::Duration::from_secs(10)).await;
        }
        if let Some(r) = self.ha {
            r.leave().await;
        }
        let _ = self.shutdown.send(());
        let _ = self.task.await;
        if let Some(p) = self.pools {
            p.stop_local().await;
        }
    }
}

/// Builds the owner from the store, recovering everything; returns the app state and the owner's task input.
pub fn build(
    cfg: &Config,
    store: Arc<dyn Store>,
) -> Result<(http::AppState, Option<String>, Option<String>), ServerError> {
    let snap = store.load_meta()?;
    let st = ClusterState::new(cfg.sched.clone())
        .map_err(|e| ServerError::Recover { what: "config".into(), reason: e.to_string() })?;
    let auth: tokens::Auth = Arc::new(RwLock::new(HashMap::new()));
    let metrics = Arc::new(metrics::ServerMetrics::new());
    let (events, _) = broadcast::channel(1024);
    let mut o = owner::Owner::new(st, store.clone(), auth.clone(), metrics.clone(), events.clone());
    o.load_history(&store.samples(now_ms().saturating_sub(owner::HISTORY_SPAN_MS))?);
    o.lost_after = cfg.node_lost_after;
    o.fence_after = cfg.node_fence_after;
    o.checkpoint_roots = cfg.checkpoint_roots.clone();
    o.max_queued_per_tenant = cfg.max_queued_jobs_per_tenant;
    o.max_spec_bytes_per_tenant = cfg.max_spec_bytes_per_tenant;
    o.prices = cfg.prices.clone();
    let notifies = o.notifies.clone();
    let queue = o.queue_reader.clone();
    let mut writes = Vec::new();
    let recover = |what: String, e: String| ServerError::Recover { what, reason: e };
    for (name, doc) in &snap.tenants {
        let d: owner::TenantDoc =
            serde_json::from_value(doc.clone()).map_err(|e| recover(format!("tenant {name}"), e.to_string()))?;
        let t = o.st.add_tenant(d.spec.clone()).map_err(|e| recover(format!("tenant {name}"), e.to_string()))?;
        // Fair share remembers past usage across restarts.
        if let Some(u) = d.usage {
            o.st.restore_tenant_usage(t, u.gpu_ms, Time(u.as_of_ms))
                .map_err(|e| recover(format!("tenant {name}"), e.to_string()))?;
        }
        o.tenants.insert(name.clone(), d);
    }
    let (have_admin, have_agent);
    {
        let mut a = auth.write().expect("auth lock");
        // Roles are stored with the tokens; a tenant's name never makes it an admin or an agent.
        for t in &snap.tokens {
            let p = match (t.role, &t.tenant) {
                (TokenRole::Admin, _) => Principal::Admin,
                (TokenRole::Agent, _) => Principal::Agent,
                (TokenRole::Tenant, Some(name)) => Principal::Tenant(name.clone()),
                (TokenRole::Tenant, None) => {
                    tracing::warn!("stored tenant token without a tenant ignored");
                    continue;
                }
            };
            a.insert(t.hash.clone(), tokens::Cred { who: p, doc: None });
        }
        for (hash, doc) in &snap.token_docs {
            let d: tokens::TokenDoc = serde_json::from_value(doc.clone())
                .map_err(|e| recover(format!("token {}", tokens::id_of(hash)), e.to_string()))?;
            a.insert(hash.clone(), tokens::Cred::of(d));
        }
        have_admin = a.values().any(|c| c.who == Principal::Admin);
        have_agent = a.values().any(|c| c.who == Principal::Agent);
    }
    let mut booting = Vec::new();
    for (name, doc) in &snap.nodes {
        let mut d: owner::NodeDoc =
            serde_json::from_value(doc.clone()).map_err(|e| recover(format!("node {name}"), e.to_string()))?;
        // A pool's node asked for and not registered is its pool's to follow.
        // (Never in the cluster before the restart, so not now either: nodes keep their positions, which running
        // jobs' placements refer to. A deleted node that had registered stays, lost, for the same reason.)
        if d.booting {
            // Its machine registers with its own token (kept as a hash), which works again from this start.
            if let (false, Some(h)) = (d.removed, &d.credential) {
                auth.write()
                    .expect("auth lock")
                    .insert(h.clone(), tokens::Cred { who: Principal::Node(name.clone()), doc: None });
            }
            booting.push(owner::BootingRecord {
                name: name.clone(),
                leaving: d.leaving,
                removed: d.removed,
                credential: d.credential.clone(),
            });
            continue;
        }
        // Priced by this start's catalogue (unless its agent named its own price).
        d.spec.price_per_gpu_hour = o.prices.resolve_gpu_hour(&d.spec, d.price_override);
        let id = o.st.add_node(d.spec.clone()).map_err(|e| recover(format!("node {name}"), e.to_string()))?;
        o.st.set_node_state(id, d.state, Time(now_ms())).map_err(|e| recover(format!("node {name}"), e.to_string()))?;
        if let Some(h) = &d.credential {
            auth.write()
                .expect("auth lock")
                .insert(h.clone(), tokens::Cred { who: Principal::Node(name.clone()), doc: None });
        }
        // An agent that does not sync again within node_lost_after loses its node, as if the server had never
        // stopped.
        if d.managed && d.state != gpunet_core::NodeState::Lost && !d.removed {
            o.last_seen.insert(name.clone(), std::time::Instant::now());
        }
        // A node lost before the restart: its tasks stay fenced until its agent comes back and confirms them gone,
        // or the fence times out, counted from this start (the jobs it held are restored on it below).
        if d.state == gpunet_core::NodeState::Lost {
            o.lost_since.insert(name.clone(), std::time::Instant::now());
        }
        o.nodes.insert(name.clone(), d);
    }
    let providers = pools::Providers::new(cfg.pool_link.clone(), &cfg.data_dir);
    for p in &cfg.pools {
        p.validate().map_err(|e| recover("pools".into(), e.to_string()))?;
    }
    o.pools = owner::pools::Pools::new(&cfg.pools, providers.clone());
    // Running jobs first, so their GPUs are theirs again, and arrays, before their elements (see
    // `gpunet_core::array`); then the rest, each in id order (an array's elements come after it). The documents are
    // read a page at a time in two passes, each parsed and dropped at once, so that neither their text nor a second
    // copy of their jobs is ever held all together: the first pass looks only at each job's state and kind.
    let mut totals = RestoredTotals::default();
    // Running jobs requeued (their GPUs could not be taken back): stored once both passes are over (a document
    // written now would be read again by the second pass).
    let mut requeued = Vec::new();
    for first in [true, false] {
        let mut after = None;
        loop {
            let page = store.jobs_page(after, gpunet_store::JOBS_PAGE)?;
            let Some(last) = page.last().map(|(id, _)| *id) else { break };
            after = Some(last);
            for (id, text) in page {
                let err = |e: serde_json::Error| recover(format!("job {id}"), e.to_string());
                if owner::JobDoc::restored_first(&text).map_err(err)? != first {
                    continue;
                }
                let (job, d) = owner::JobDoc::load(&text).map_err(err)?;
                requeued.extend(restore_job(&mut o, job, d, &mut totals)?);
            }
        }
    }
    for (id, attempt, started, why) in requeued {
        o.requeued_at_start(id, attempt, started, &why);
    }
    let RestoredTotals { preemptions, restarts, submitted } = totals;
    // Cumulative counters continue where the last run left them (a counter that starts again at 0 reads as a reset to
    // Prometheus, and its running jobs' usage so far would be counted twice): usage from the ledger, preemptions,
    // restarts and submissions from the jobs.
    metrics.restore_totals(store.ledger_totals()?, preemptions, restarts, submitted);
    // A batch's jobs in the order it listed them.
    for ids in o.idempotent.values_mut() {
        ids.sort_unstable();
    }
    // Pools learn their nodes (and reclaims in progress their jobs) once the jobs are back.
    o.pools_recover(&booting);
    // Learned estimates start from the succeeded jobs in the store.
    o.relearn();
    // Jobs waiting on dependencies are checked again, and arrays expand what they may.
    o.st.resolve_restored(Time(now_ms()));
    o.restored_cascades();
    o.relist_all();
    let mut gen_admin = None;
    let admin = match (&cfg.admin_token, have_admin) {
        (Some(t), _) => Some(t.clone()),
        (None, false) => {
            let t = new_token();
            gen_admin = Some(t.clone());
            Some(t)
        }
        (None, true) => None,
    };
    if let Some(t) = admin {
        writes.extend(tokens::bootstrap(&auth, gpunet_api::types::TokenRole::Admin, &t, now_ms()));
    }
    let mut gen_join = None;
    let join = match (&cfg.join_token, have_agent) {
        (Some(t), _) => Some(t.clone()),
        (None, false) => {
            let t = new_token();
            gen_join = Some(t.clone());
            Some(t)
        }
        (None, true) => None,
    };
    if let Some(t) = join {
        writes.extend(tokens::bootstrap(&auth, gpunet_api::types::TokenRole::Join, &t, now_ms()));
    }
    if !writes.is_empty() {
        if let Err(e) = store.commit(writes) {
            // Serve read-only rather than not at all: health and metrics say why.
            tracing::error!(error = %e, "the store refused the start-up write: starting read-only");
            o.metrics.store_refused(&e.to_string());
        }
    }
    // A data directory that cannot be written is reported at start: the control plane starts read-only.
    if let Err(e) = store.probe_writable() {
        o.metrics.store_refused(&e.to_string());
    }
    let (tx, rx) = mpsc::channel(65_536);
    let (atx, arx) = mpsc::unbounded_channel();
    o.self_tx = Some(atx);
    let tick = cfg.tick;
    // The owner runs on a thread of its own (one task on a one-thread runtime): however much work the HTTP workers
    // have (serialising large reads, parsing bodies), they cannot hold it up between its awaits; the OS shares the
    // cores between them.
    let (htx, hrx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gpunet-owner".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!(error = %e, "start the owner's runtime"),
            };
            rt.block_on(async move {
                let h = tokio::spawn(o.run(rx, arx, tick));
                let _ = htx.send(h.abort_handle());
                let _ = h.await;
            });
        })
        .map_err(|e| ServerError::Recover { what: "owner thread".into(), reason: e.to_string() })?;
    let owner = hrx.recv().map_err(|e| ServerError::Recover { what: "owner thread".into(), reason: e.to_string() })?;
    let logs_dir = cfg.data_dir.join("logs");
    let app = http::AppState::new(http::Shared {
        tx,
        auth,
        metrics,
        store,
        events,
        max_body: cfg.max_body_bytes,
        notifies,
        logs_dir,
        streams: Arc::new(std::sync::Mutex::new(HashMap::new())),
        max_streams_per_token: cfg.max_streams_per_token,
        parse_slots: Arc::new(tokio::sync::Semaphore::new(2)),
        dry_run_slots: Arc::new(tokio::sync::Semaphore::new(2)),
        currency: cfg.prices.currency.clone(),
        owner,
        leader: None,
        queue,
        reads: reads::Lane::start(),
        pools: (!cfg.pools.is_empty()).then_some(providers),
    });
    Ok((app, gen_admin, gen_join))
}

/// The TLS acceptor of `cfg` (`None`: plain HTTP, allowed on loopback or with `insecure_http`).
fn acceptor(cfg: &Config) -> Result<Option<tokio_rustls::TlsAcceptor>, ServerError> {
    Ok(match &cfg.tls {
        Some(files) => Some(tokio_rustls::TlsAcceptor::from(tls::server_config(files)?)),
        None if cfg.listen.ip().is_loopback() => None,
        None if cfg.insecure_http => {
            tracing::warn!(addr = %cfg.listen, "serving plain HTTP on a non-loopback address (--insecure-http): tokens and task secrets cross the network in clear text");
            None
        }
        None => return Err(ServerError::PlainHttp { addr: cfg.listen }),
    })
}

/// Binds the listening socket; returns it with its address.
async fn bind(cfg: &Config) -> Result<(tokio::net::TcpListener, SocketAddr), ServerError> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| ServerError::Listen { addr: cfg.listen, source: e })?;
    let addr = listener.local_addr().map_err(|e| ServerError::Listen { addr: cfg.listen, source: e })?;
    Ok((listener, addr))
}

/// Starts the server: recovers, listens, serves until stopped.
pub async fn start(cfg: Config, store: Arc<dyn Store>) -> Result<Running, ServerError> {
    let acceptor = acceptor(&cfg)?;
    let (app, gen_admin, gen_join) = build(&cfg, store)?;
    let (listener, addr) = bind(&cfg).await?;
    let (stx, srx) = tokio::sync::oneshot::channel::<()>();
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    let pools = app.pools.clone();
    if let Some(p) = &pools {
        let mut local = addr;
        if local.ip().is_unspecified() {
            local.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        p.set_url(format!("{scheme}://{local}"));
    }
    let router = http::router(app);
    let task = tokio::spawn(listen::serve(listener, router, acceptor, cfg.limits, async {
        let _ = srx.await;
    }));
    let sched = &cfg.sched;
    tracing::info!(
        %addr,
        scheme,
        policy = %sched.policy,
        backfill = sched.backfill,
        preemption = sched.preemption.enabled,
        preemptive = sched.preemption.enabled && sched.preemption.shorter_first,
        shorter_ratio = sched.preemption.shorter_ratio,
        defragment = sched.preemption.enabled && sched.preemption.defragment,
        probe_s = sched.probe.map_or(0, |p| p.0 / 1000),
        min_run_time_s = sched.preemption.min_run_time.0 / 1000,
        max_evictions = sched.preemption.max_per_interval,
        eviction_window_s = sched.preemption.interval.0 / 1000,
        tick_ms = cfg.tick.as_millis() as u64,
        victim_scan_limit = sched.preemption.victim_scan_limit,
        restart_backoff_ms = sched.restart_backoff.0,
        learned_rank = sched.learned_rank.name(),
        backfill_depth = sched.backfill_depth,
        reservation_horizon = sched.reservation_horizon,
        fairshare_half_life_s = sched.fairshare_half_life.0 / 1000,
        las_thresholds_gpu_s = ?sched.las_thresholds_gpu_s,
        "gpunet server listening"
    );
    Ok(Running {
        addr,
        scheme,
        generated_admin_token: gen_admin,
        generated_join_token: gen_join,
        shutdown: stx,
        task,
        ha: None,
        pools,
    })
}

/// Counters summed over the restored jobs.
#[derive(Default)]
struct RestoredTotals {
    preemptions: u64,
    restarts: u64,
    submitted: u64,
}

/// Restores one stored job into the core and its document into the owner; a running job that could not keep its
/// placement is requeued, and returned (its id, attempt, start and why) for `Owner::requeued_at_start`.
fn restore_job(
    o: &mut owner::Owner,
    job: gpunet_core::Job,
    mut d: owner::JobDoc,
    totals: &mut RestoredTotals,
) -> Result<Option<(u64, u32, Time, String)>, ServerError> {
    let id = job.id.0;
    let recover = |reason: String| ServerError::Recover { what: format!("job {id}"), reason };
    o.names.share(&mut d);
    // Stored by a version that kept no `held_ms`: seeded from its attempts' records (the newest of them).
    if d.more().held_ms == 0 {
        let held = gpunet_api::types::AttemptView::held_ms(&d.more().attempts);
        if held > 0 {
            d.more_mut().held_ms = held;
        }
    }
    o.next_id = o.next_id.max(id + 1 + job.spec.array.as_ref().map_or(0, |a| a.indices.len() as u64));
    totals.preemptions += u64::from(job.preemptions);
    totals.restarts += u64::from(job.restarts);
    totals.submitted += u64::from(job.array_of.is_none());
    let array = job.spec.array.is_some().then(|| Box::new(job.clone()));
    let mut requeued = None;
    if let Err(e) = o.st.restore(job.clone(), Time(now_ms())) {
        // A running job whose GPUs cannot be taken back (its node is gone): it waits again, as after a failure.
        tracing::warn!(job = id, error = %e, "running job could not keep its placement; requeued");
        let mut j = job;
        requeued = j.run.as_ref().map(|r| (j.attempt(), r.started, e.to_string()));
        j.state = gpunet_core::JobState::Restarting;
        j.run = None;
        o.st.restore(j, Time(now_ms())).map_err(|e| recover(e.to_string()))?;
    }
    // An array is not a job of the core: its document keeps its own.
    if o.st.job(JobId(id)).is_none() {
        d.own = array;
    }
    let Some((state, attempt)) = d.job(&o.st, id).map(|j| (j.state, j.attempt())) else {
        return Err(recover("the core kept no job and it is no array".into()));
    };
    d.state = state;
    // A running attempt's utilisation goes on from what its document stored.
    if let Some(p) = d.more().util.as_ref().filter(|p| state == gpunet_core::JobState::Running && attempt == p.attempt)
    {
        o.util.restore(id, p);
    }
    if let Some(k) = &d.more().idempotency_key {
        o.idempotent.entry(k.clone()).or_default().push(id);
    }
    o.add_doc(id, d);
    Ok(requeued.map(|(attempt, started, why)| (id, attempt, started, why)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    /// A request whose owner ended before answering (a leader's term ended under it) is a 503 `interrupted`: whether
    /// it took effect is not known, so `Retry-After` (which clients follow, on the next leader) comes only with a
    /// request that is safe to send again, a read or a keyed submission, not with a tenant's or token's creation.
    #[tokio::test]
    async fn a_request_its_owner_never_answers_is_a_503_retried_only_where_safe() {
        let mut cfg = Config::new(PathBuf::from("/nonexistent"));
        cfg.admin_token = Some("admin".into());
        cfg.join_token = Some("join".into());
        let (app, _, _) = build(&cfg, Arc::new(gpunet_store::MemoryStore::new())).unwrap();
        app.owner.abort();
        let router = http::router(app);
        let call = |method: &str, path: &str, key: Option<&str>, body: &str| {
            let mut r = Request::builder()
                .method(method)
                .uri(path)
                .header("authorization", "Bearer admin")
                .header("content-type", "application/json");
            if let Some(k) = key {
                r = r.header("idempotency-key", k);
            }
            let r = r.body(Body::from(body.to_string())).unwrap();
            let router = router.clone();
            async move {
                let resp = router.oneshot(r).await.unwrap();
                let (status, h) = (resp.status(), resp.headers().clone());
                let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
                (status, h, serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default())
            }
        };
        // The abort takes effect at the owner's next turn: until then it answers.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while call("GET", "/v1/tenants", None, "").await.0 != StatusCode::SERVICE_UNAVAILABLE {
            assert!(std::time::Instant::now() < deadline, "the owner still answers after it was stopped");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let job = r#"{"tenant":"t","name":"j","gpus":1,"command":["true"]}"#;
        const NODE: &str = r#"{"spec": {"name": "n1", "gpus": [], "cpu": 1000, "mem": 1024, "labels": {}}}"#;
        for (method, path, key, body, retry) in [
            ("GET", "/v1/tenants", None, "", true),
            ("POST", "/v1/jobs", Some("k-1"), job, true),
            ("POST", "/v1/jobs", None, job, false),
            ("POST", "/v1/tenants", None, r#"{"name":"u"}"#, false),
            // An agent's registration: agents retry it after any failure (`gpunet_agent`'s `not_the_leader`).
            ("POST", "/v1/nodes", None, NODE, true),
        ] {
            let (status, h, v) = call(method, path, key, body).await;
            assert_eq!((status, &v["error"]["code"]), (StatusCode::SERVICE_UNAVAILABLE, &"interrupted".into()), "{v}");
            assert_eq!(h["gpunet-outcome"], "unknown");
            assert_eq!(h.contains_key("retry-after"), retry, "{method} {path} {key:?}");
        }
    }
}
