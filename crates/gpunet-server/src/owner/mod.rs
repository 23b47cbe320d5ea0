//! The task that owns the live cluster: every change goes through it as a [`Cmd`], in order. It applies the change to
//! the core state, queues the write to the store, and replies only once the store says the write is durable. After
//! each batch of commands (and on a periodic tick) it runs a scheduling pass and persists what changed.
//!
//! This module owns the [`Owner`] and its documents, the command set ([`Cmd`]) and its dispatch (`Owner::handle`,
//! where the read-only guard refuses changes while the store refuses writes), the run loop, the scheduling pass,
//! persistence (durable replies, background writes, events) and the views shared by several families. The
//! handlers live with their command family:
//! - `jobs`: submit, dry run, get, list, cancel, explain; who may see which job, and masking other tenants' jobs;
//! - `tenants`: tenants, quotas and tokens;
//! - `nodes`: node registration and states, the agents' sync (task sets, exits, checkpoints, samples) and fencing;
//! - `queries`: reads of the cluster (summary, live usage, the queue with reasons and ETAs);
//! - `utilisation`: the agents' GPU samples accumulated per running attempt, for its ledger rows.

mod arrays;
mod doc;
mod estimates;
mod jobs;
mod nodes;
pub(crate) mod pools;
mod queries;
pub(crate) mod snapshot;
mod tenants;
mod utilisation;

pub(crate) use doc::{JobDoc, More, Packed, Unparsed, UnparsedPage, Which, STATES};
pub(crate) use jobs::Why;
pub(crate) use tenants::quota_from_request;

use crate::metrics::ServerMetrics;
use crate::tokens::TokenDoc;
use crate::{now_ms, Principal};
use gpunet_api::spec::JobSubmission;
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::tenant::Quota;
use gpunet_core::{
    schedule, ClusterState, Decision, Job, JobId, NodeSpec, NodeState, Placement, StopCause, TenantSpec, Time,
};
use gpunet_store::{Store, UsageRow, Write};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot};

type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// A request to the owner.
#[derive(Debug)]
pub(crate) enum Cmd {
    Submit {
        who: Principal,
        /// The submitting token's user (or role), recorded on the jobs.
        by: String,
        subs: Vec<(JobSubmission, Vec<String>)>,
        /// The request's `Idempotency-Key`, checked: a submission with a key already used by the same submitter is
        /// answered with the jobs it made (`true`: a replay), not made again.
        key: Option<String>,
        reply: Reply<(Vec<Submitted>, bool)>,
    },
    /// A dry run's copy of the state (answered off the owner: `DryRunWork::answer`).
    DryRun {
        who: Principal,
        /// The token's user (or role), as a submission records it: whose runs its estimate is learned from.
        by: String,
        sub: Box<JobSubmission>,
        warnings: Vec<String>,
        reply: Reply<jobs::DryRunWork>,
    },
    /// One job's view, its submission left for the reader to parse.
    Get {
        who: Principal,
        id: u64,
        reply: Reply<Unparsed>,
    },
    /// A page of views, their submissions left for the reader to parse.
    List {
        who: Principal,
        filter: JobFilter,
        reply: Reply<UnparsedPage>,
    },
    Cancel {
        who: Principal,
        id: u64,
        reply: Reply<JobView>,
    },
    /// Holds (`hold`) or releases a job or array.
    Hold {
        who: Principal,
        id: u64,
        hold: bool,
        reply: Reply<JobView>,
    },
    /// What needs no pass to explain, or that the queue view explains it (see `Owner::explain_job`).
    Explain {
        who: Principal,
        id: u64,
        reply: Reply<jobs::Why>,
    },
    CreateTenant {
        req: TenantRequest,
        reply: Reply<TokenIssued>,
    },
    SetQuota {
        tenant: String,
        quota: Option<Box<(Quota, QuotaRequest)>>,
        reply: Reply<TenantView>,
    },
    IssueToken {
        tenant: String,
        reply: Reply<TokenIssued>,
    },
    CreateToken {
        doc: TokenDoc,
        reply: Reply<TokenCreated>,
    },
    /// Tokens (of one tenant).
    Tokens {
        tenant: Option<String>,
        reply: Reply<Vec<TokenInfo>>,
    },
    /// Revokes a token by id (only one of `tenant`'s, when given).
    RevokeToken {
        id: String,
        tenant: Option<String>,
        reply: Reply<TokenInfo>,
    },
    Tenants {
        who: Principal,
        reply: Reply<Vec<TenantView>>,
    },
    RegisterNode {
        spec: NodeSpec,
        fake: bool,
        /// The agent's price per GPU-hour, instead of the catalogue's.
        price: Option<f64>,
        /// Sent with the join token (not the node's own credential nor the admin's): it may only add a new node.
        join: bool,
        /// The hash of the node's own token it was sent with: still valid when the owner takes it up (a node's
        /// registration replaces its tokens, so a second registration racing the first with the same token fails).
        node_token: Option<String>,
        reply: Reply<NodeRegistered>,
    },
    /// Which of these task attempts belong to the node (now, or handed to it lately): only their logs are kept.
    NodeTasks {
        node: String,
        asked: Vec<gpunet_api::agent::TaskRef>,
        reply: Reply<HashSet<gpunet_api::agent::TaskRef>>,
    },
    Nodes {
        who: Principal,
        reply: Reply<Vec<NodeView>>,
    },
    SetNodeState {
        name: String,
        state: NodeState,
        reply: Reply<NodeView>,
    },
    Summary {
        who: Principal,
        reply: Reply<ClusterSummary>,
    },
    LiveUsage {
        who: Principal,
        reply: Reply<Vec<UsageRow>>,
    },
    Gauges {
        reply: Reply<String>,
    },
    History {
        reply: Reply<Vec<HistoryPoint>>,
    },
    AgentSync {
        node: String,
        sync: gpunet_api::agent::AgentSync,
        reply: Reply<gpunet_api::agent::AgentWork>,
    },
    /// A reclaim notice for a node (`owner/pools.rs`).
    Reclaim {
        name: String,
        deadline_s: f64,
        reply: Reply<NodeView>,
    },
    /// The node pools.
    Pools {
        reply: Reply<Vec<PoolView>>,
    },
}

/// Where a placement's tasks are, by node name.
pub(crate) fn placement_view(st: &ClusterState, p: &Placement) -> Vec<TaskView> {
    p.tasks
        .iter()
        .map(|t| TaskView {
            node: st.node(t.node).map(|n| n.spec.name.clone()).unwrap_or_default(),
            gpus: t.gpu_indexes(),
            mig_slot: t.mig_slot,
        })
        .collect()
}

/// The least time between two scheduling passes after a change (see [`Owner::run`]).
const PASS_GAP_MIN: std::time::Duration = std::time::Duration::from_micros(200);
/// The most time between two scheduling passes after a change: a submission waits no longer for its pass.
const PASS_GAP_MAX: std::time::Duration = std::time::Duration::from_millis(5);

/// The gap before the next pass after one that cost `cost`: four times that, within [`PASS_GAP_MIN`, `PASS_GAP_MAX`].
fn pass_gap(cost: std::time::Duration) -> std::time::Duration {
    (cost * 4).clamp(PASS_GAP_MIN, PASS_GAP_MAX)
}

/// Applies a durable change to the owner's state.
pub(crate) struct Applier(pub(crate) Box<dyn FnOnce(&mut Owner) + Send>);

impl Cmd {
    /// Whether the command only reads (changes nothing the queue view shows).
    fn is_read(&self) -> bool {
        matches!(
            self,
            Cmd::DryRun { .. }
                | Cmd::Get { .. }
                | Cmd::List { .. }
                | Cmd::Explain { .. }
                | Cmd::Tokens { .. }
                | Cmd::Tenants { .. }
                | Cmd::Nodes { .. }
                | Cmd::Summary { .. }
                | Cmd::LiveUsage { .. }
                | Cmd::Gauges { .. }
                | Cmd::History { .. }
                | Cmd::Pools { .. }
        )
    }
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Applier")
    }
}

/// Per-node wake-ups for agents waiting on their task set.
pub(crate) type Notifies = Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>;

/// The wake-up of a node's long poll.
pub(crate) fn notify_of(n: &Notifies, node: &str) -> Arc<tokio::sync::Notify> {
    n.lock().expect("notify lock").entry(node.to_string()).or_default().clone()
}

/// Which jobs a listing returns, and in which order.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobFilter {
    /// Only this tenant's (must exist).
    pub(crate) tenant: Option<String>,
    /// Only jobs in one of these states (none: any).
    pub(crate) states: Vec<gpunet_core::JobState>,
    /// Only jobs this user submitted.
    pub(crate) user: Option<String>,
    /// Ids above this (oldest first).
    pub(crate) after: u64,
    /// Ids below this (newest first).
    pub(crate) before: Option<u64>,
    /// Newest first.
    pub(crate) newest: bool,
    /// Most jobs on the page.
    pub(crate) limit: usize,
}

/// Most attempts a job document keeps (a job preempted over and over keeps its newest ones).
pub(crate) const MAX_ATTEMPT_RECORDS: usize = 100;

/// How a rank's failure ended an attempt, as its agent reported it: kept until the attempt's end is confirmed.
#[derive(Debug, Clone)]
pub(crate) struct FailHow {
    /// In words: "rank 0 exited with code 3".
    pub(crate) how: String,
    /// `failed`, `oom`, `liveness`, `time_limit`, `disk_limit` or `start_failed`.
    pub(crate) outcome: &'static str,
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
}

/// A tenant as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TenantDoc {
    pub(crate) spec: TenantSpec,
    #[serde(default)]
    pub(crate) quota: Option<QuotaRequest>,
    /// Fair share's decayed GPU usage as last stored (GPU-ms as of a time), restored at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<UsageRecord>,
    /// Its jobs' default `spot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spot: Option<gpunet_api::spec::SpotUse>,
}

/// A tenant's decayed GPU usage at a time.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct UsageRecord {
    pub(crate) gpu_ms: f64,
    pub(crate) as_of_ms: u64,
}

/// A node as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NodeDoc {
    pub(crate) spec: NodeSpec,
    pub(crate) state: NodeState,
    pub(crate) fake: bool,
    /// An agent has synced for this node, so its tasks are real processes: their ends must be confirmed by that
    /// agent. A node that never had an agent runs no process, and stops there are confirmed at once.
    #[serde(default)]
    pub(crate) managed: bool,
    /// Hash of the node's own credential (see [`crate::Principal::Node`]); replaced at every registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) credential: Option<String>,
    /// The agent's own price per GPU-hour; `None`: the price catalogue's (priced again at every start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) price_override: Option<f64>,
    /// A pool's node that its provider deleted: no longer listed, and not loaded at the next start (its name may be
    /// used again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) removed: bool,
    /// A pool's node asked of its provider and not registered yet (not a node of the cluster until it registers):
    /// kept so that a restarted server neither loses track of the machine nor gives its name to another.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) booting: bool,
    /// The deadline of a reclaim notice in progress (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reclaim_deadline_ms: Option<u64>,
    /// A pool's node its pool is deleting (scale-in, failed creation, lost, reclaimed): a restarted server goes on
    /// deleting it rather than taking it back as capacity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) leaving: bool,
}

/// A stored record of a pool node that never registered (see [`NodeDoc::booting`]), for `pools_recover`.
pub(crate) struct BootingRecord {
    pub(crate) name: String,
    /// Its creation had failed or timed out: it is being deleted.
    pub(crate) leaving: bool,
    /// Deleted: only its name counts (never asked for again).
    pub(crate) removed: bool,
    /// The hash of its own registration token.
    pub(crate) credential: Option<String>,
}

impl Owner {
    /// A node its pool's provider deleted.
    pub(crate) fn is_removed(&self, name: &str) -> bool {
        self.nodes.get(name).is_some_and(|d| d.removed)
    }
}

pub(crate) struct Owner {
    pub(crate) st: ClusterState,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) auth: crate::tokens::Auth,
    pub(crate) docs: doc::Docs,
    /// The tenant and user names the documents share.
    pub(crate) names: doc::Names,
    pub(crate) tenants: BTreeMap<String, TenantDoc>,
    pub(crate) nodes: BTreeMap<String, NodeDoc>,
    pub(crate) next_id: u64,
    pub(crate) metrics: Arc<ServerMetrics>,
    pub(crate) events: broadcast::Sender<String>,
    dirty: bool,
    /// Version of each node's task set.
    versions: HashMap<String, u64>,
    /// Last sync of each agent-managed node.
    pub(crate) last_seen: HashMap<String, std::time::Instant>,
    /// How the first failed rank of a job's current attempt ended, for the event at the attempt's end.
    fail_how: HashMap<u64, FailHow>,
    /// When each lost node was lost (its tasks are fenced until its agent confirms them gone or `fence_after`).
    pub(crate) lost_since: HashMap<String, std::time::Instant>,
    pub(crate) notifies: Notifies,
    /// An agent that has not synced for this long loses its node.
    pub(crate) lost_after: std::time::Duration,
    /// A lost node's tasks are taken as gone after this long if its agent has not confirmed it.
    pub(crate) fence_after: std::time::Duration,
    /// Where checkpoint tier URLs may point (`{tenant}` replaced); see `gpunet_api::spec::check_checkpoint_roots`.
    pub(crate) checkpoint_roots: Vec<String>,
    /// Prices of nodes (resolved at registration) and of CPU and memory (see `gpunet_core::pricing`).
    pub(crate) prices: gpunet_core::PriceCatalogue,
    /// Allocation samples for the portal's charts, oldest first.
    history: std::collections::VecDeque<HistoryPoint>,
    last_sample: Option<std::time::Instant>,
    /// When running attempts' utilisation was last stored.
    last_util_flush: Option<std::time::Instant>,
    /// The latest per-GPU samples each agent sent (real GPUs only).
    pub(crate) gpu_samples: HashMap<String, Vec<gpunet_api::agent::GpuSample>>,
    /// Sampled and busy GPU-seconds of each running attempt, per node (see `utilisation`).
    pub(crate) util: utilisation::Utilisation,
    /// The owner's own queue, for changes applied once durable.
    pub(crate) self_tx: Option<mpsc::UnboundedSender<Applier>>,
    /// Most queued jobs per tenant.
    pub(crate) max_queued_per_tenant: usize,
    /// Most spec bytes of a tenant's unfinished jobs.
    pub(crate) max_spec_bytes_per_tenant: u64,
    /// Spec bytes of each tenant's unfinished jobs: added at submit, taken off when a job ends (`sync_doc`), so never
    /// below the truth; `None` until the first check counts them from the documents (after a start).
    unfinished_spec_bytes: Option<HashMap<String, u64>>,
    /// Task attempts handed to each node, with when they were last in its task set: a task the server stopped still
    /// ships its last lines and its exit for a while after it left the set.
    handed: HashMap<String, HashMap<gpunet_api::agent::TaskRef, std::time::Instant>>,
    /// Jobs by the scoped idempotency key of the submission that made them (from the time it was accepted, before it
    /// is durable; rebuilt from the documents at start).
    pub(crate) idempotent: HashMap<String, Vec<u64>>,
    /// Learned run-time estimates, one predictor per tenant (`owner/estimates.rs`).
    pub(crate) predictors: estimates::Predictors,
    /// The queue view the API serves, published after changes (`owner/snapshot.rs`), and its readers' side.
    pub(crate) queue_pub: snapshot::Publisher,
    pub(crate) queue_reader: snapshot::Reader,
    /// Node pools, their providers, and reclaims in progress (`owner/pools.rs`).
    pub(crate) pools: pools::Pools,
}

/// How often the allocation history is sampled, and how long samples are kept (12 hours, in the store too).
const HISTORY_EVERY: std::time::Duration = std::time::Duration::from_secs(15);
pub(crate) const HISTORY_SPAN_MS: u64 = 12 * 3600 * 1000;
const HISTORY_KEEP: usize = (HISTORY_SPAN_MS / 15_000) as usize;

/// The answer to a change the store refused: 503 `interrupted`, as the control plane takes no change from then on (on
/// PostgreSQL another replica takes over, `ha.rs`). Whether the write reached the disk is not known (the connection
/// broke during the commit, an fsync failed after the write): like a request whose owner stopped before answering, it
/// gets `Gpunet-Outcome: unknown`, and `Retry-After` only where sending it again is safe (`http.rs::observe`): a
/// retry with the same `Idempotency-Key` gets the same job either way.
/// The refusal is recorded in `metrics` (the control plane is read-only from then on).
fn store_refused(metrics: &crate::metrics::ServerMetrics, what: &str, e: &gpunet_store::StoreError) -> ApiError {
    metrics.store_refused(&e.to_string());
    ApiError::new(
        "interrupted",
        format!(
            "the store refused to persist {what} ({e}): whether it was persisted is not known; read it back, or send \
             a submission again later with the same Idempotency-Key"
        ),
    )
}

fn not_found(what: &str, key: &str) -> ApiError {
    ApiError::new("not_found", format!("find {what} {key}: no such {what}"))
}

/// Tenant, cohort and node names: 1–63 of letters, digits, `-`, `_`, `.`, starting with a letter or digit (so never
/// `.` or `..`, which would name a directory's parent in paths such as a tier root `file:///srv/ckpt/{tenant}`), not
/// starting with `__` (reserved for gpunet; older versions stored roles under such names).
pub(crate) fn valid_name(field: &str, n: &str) -> Result<(), ApiError> {
    if n.is_empty() || n.len() > 63 || !n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(ApiError::invalid(field, n, "1 to 63 letters, digits, '-', '_' or '.'"));
    }
    if n.starts_with('.') || n.starts_with('-') {
        return Err(ApiError::invalid(field, n, "a name starting with a letter, a digit or '_' (not '.' or '-')"));
    }
    if n.starts_with("__") {
        return Err(ApiError::invalid(field, n, "a name not starting with '__' (reserved)"));
    }
    Ok(())
}

/// What another tenant's job is called in texts a tenant reads.
const OTHER_JOB: &str = "another tenant's job";

impl Owner {
    pub(crate) fn new(
        st: ClusterState,
        store: Arc<dyn Store>,
        auth: crate::tokens::Auth,
        metrics: Arc<ServerMetrics>,
        events: broadcast::Sender<String>,
    ) -> Owner {
        let (queue_pub, queue_reader) = snapshot::channel();
        let mut st = st;
        st.track_changes();
        Owner {
            st,
            store,
            auth,
            docs: doc::Docs::default(),
            names: doc::Names::default(),
            tenants: BTreeMap::new(),
            nodes: BTreeMap::new(),
            next_id: 1,
            metrics,
            events,
            dirty: false,
            versions: HashMap::new(),
            last_seen: HashMap::new(),
            fail_how: HashMap::new(),
            lost_since: HashMap::new(),
            notifies: Arc::new(std::sync::Mutex::new(HashMap::new())),
            queue_pub,
            queue_reader,
            pools: pools::Pools::default(),
            lost_after: std::time::Duration::from_secs(10),
            fence_after: std::time::Duration::from_secs(60),
            checkpoint_roots: Vec::new(),
            prices: gpunet_core::PriceCatalogue::shipped(),
            history: std::collections::VecDeque::new(),
            last_sample: None,
            last_util_flush: None,
            gpu_samples: HashMap::new(),
            util: utilisation::Utilisation::default(),
            self_tx: None,
            max_queued_per_tenant: crate::DEFAULT_MAX_QUEUED_JOBS_PER_TENANT,
            max_spec_bytes_per_tenant: crate::DEFAULT_MAX_SPEC_BYTES_PER_TENANT,
            unfinished_spec_bytes: None,
            handed: HashMap::new(),
            idempotent: HashMap::new(),
            predictors: estimates::Predictors::default(),
        }
    }

    /// The samples a previous run of the server stored (at start-up).
    pub(crate) fn load_history(&mut self, rows: &[gpunet_store::SampleRow]) {
        self.history = rows
            .iter()
            .map(|r| HistoryPoint {
                at_ms: r.at_ms,
                gpus_total: r.gpus_total,
                gpus_allocated: r.gpus_allocated,
                queue_length: r.queue_length as usize,
                running: r.running as usize,
            })
            .collect();
        while self.history.len() > HISTORY_KEEP {
            self.history.pop_front();
        }
    }

    /// Records an allocation sample when one is due, in memory and in the store.
    fn sample_history(&mut self, now: u64) {
        if self.last_sample.is_some_and(|t| t.elapsed() < HISTORY_EVERY) {
            return;
        }
        self.last_sample = Some(std::time::Instant::now());
        if self.history.len() >= HISTORY_KEEP {
            self.history.pop_front();
        }
        let p = HistoryPoint {
            at_ms: now,
            gpus_total: self.st.capacity_gpus(),
            gpus_allocated: self.st.allocated_gpus(),
            queue_length: self.st.queued_count(),
            running: self.st.running_count(),
        };
        let row = gpunet_store::SampleRow {
            at_ms: p.at_ms,
            gpus_total: p.gpus_total,
            gpus_allocated: p.gpus_allocated,
            queue_length: p.queue_length as u64,
            running: p.running as u64,
        };
        self.history.push_back(p);
        let mut writes = self.usage_writes(now, None);
        writes.push(Write::Sample { sample: row, keep_since_ms: now.saturating_sub(HISTORY_SPAN_MS) });
        if self.last_util_flush.is_none_or(|t| t.elapsed() >= utilisation::FLUSH_EVERY) {
            self.last_util_flush = Some(std::time::Instant::now());
            writes.extend(self.util_writes());
        }
        self.persist(writes, "cluster sample and fair-share usage");
    }

    /// Stores the utilisation figures of running attempts that changed, in their job documents.
    fn util_writes(&mut self) -> Vec<Write> {
        let mut out = Vec::new();
        for (id, p) in self.util.take_changed() {
            let running = self
                .st
                .job(JobId(id))
                .is_some_and(|j| j.state == gpunet_core::JobState::Running && j.attempt() == p.attempt);
            match self.docs.get_mut(&id) {
                Some(d) if running => d.more_mut().util = Some(p),
                _ => continue,
            }
            out.extend(self.job_doc_write(id));
        }
        out
    }

    /// Brings fair share's decayed usage up to `now` and returns the writes that store it, for every tenant or one.
    fn usage_writes(&mut self, now: u64, only: Option<&str>) -> Vec<Write> {
        self.st.accrue_usage(Time(now));
        let mut out = Vec::new();
        for (name, doc) in self.tenants.iter_mut() {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            let Some((gpu_ms, as_of)) = self.st.tenant_id(name).and_then(|t| self.st.tenant_usage_record(t)) else {
                continue;
            };
            doc.usage = Some(UsageRecord { gpu_ms, as_of_ms: as_of.0 });
            out.push(Write::Tenant { name: name.clone(), doc: serde_json::to_value(&*doc).expect("serialise") });
        }
        out
    }

    /// The task sets of these nodes changed: bump their versions and wake their agents.
    fn bump_job(&mut self, nodes: Vec<String>) {
        for n in nodes {
            *self.versions.entry(n.clone()).or_default() += 1;
            notify_of(&self.notifies, &n).notify_waiters();
        }
    }

    fn nodes_of(&self, job: JobId) -> Vec<String> {
        let mut v: Vec<String> = self
            .st
            .job(job)
            .and_then(|j| j.run.as_ref())
            .map(|r| {
                r.placement.tasks.iter().filter_map(|t| self.st.node(t.node).map(|n| n.spec.name.clone())).collect()
            })
            .unwrap_or_default();
        v.sort();
        v.dedup();
        v
    }

    fn job_doc_write(&self, id: u64) -> Option<Write> {
        let d = self.docs.get(&id)?;
        let job = d.job(&self.st, id)?;
        Some(Write::Job {
            id,
            tenant: d.tenant.to_string(),
            state: job.state.to_string(),
            doc: serde_json::to_string(&d.stored(job)).expect("job documents serialise"),
        })
    }

    fn event(&self, job: u64, kind: &str, message: String) -> Write {
        self.event_broadcast(job, kind, &message);
        Write::Event { job, at_ms: now_ms(), kind: kind.into(), message }
    }

    /// Sends a job event to the live event stream.
    fn event_broadcast(&self, job: u64, kind: &str, message: &str) {
        let _ = self.events.send(
            serde_json::json!({"job": job, "kind": kind, "message": message, "at_ms": now_ms(),
                "tenant": self.docs.get(&job).map(|d| d.tenant.to_string())})
            .to_string(),
        );
    }

    fn node_event(&self, name: &str, state: &str) {
        let _ = self
            .events
            .send(serde_json::json!({"node": name, "kind": format!("node_{state}"), "at_ms": now_ms()}).to_string());
    }

    /// Persists `writes` and replies with `value` once they are durable (503 when the store refused them: see
    /// [`store_refused`]).
    fn durable<T: Send + 'static>(&self, writes: Vec<Write>, reply: Reply<T>, value: T) {
        let metrics = self.metrics.clone();
        let t0 = std::time::Instant::now();
        self.store.commit_async(
            writes,
            Box::new(move |r| {
                metrics.commit_seconds.observe(t0.elapsed().as_secs_f64());
                let _ = reply.send(match r {
                    Ok(()) => Ok(value),
                    Err(e) => Err(store_refused(&metrics, "the change", &e)),
                });
            }),
        );
    }

    /// Persists `writes` in the background; a refusal makes the control plane read-only.
    fn persist(&self, writes: Vec<Write>, what: &'static str) {
        let metrics = self.metrics.clone();
        let t0 = std::time::Instant::now();
        self.store.commit_async(
            writes,
            Box::new(move |r| {
                metrics.commit_seconds.observe(t0.elapsed().as_secs_f64());
                if let Err(e) = r {
                    tracing::error!(error = %e, what, "persist");
                    metrics.store_refused(&e.to_string());
                }
            }),
        );
    }

    /// Refuses a change while the store is read-only.
    fn read_only(&self) -> Option<ApiError> {
        (!self.metrics.store_writable()).then(|| {
            ApiError::new(
                "unavailable",
                "the store refused a write: the control plane is read-only until the cause is fixed and it restarts",
            )
        })
    }

    fn view(&self, id: u64) -> Option<JobView> {
        self.unparsed(id).map(Unparsed::parse)
    }

    /// A job's view with its submission still packed (the reader parses it, off the owner).
    fn unparsed(&self, id: u64) -> Option<Unparsed> {
        let d = self.docs.get(&id)?;
        let j = d.job(&self.st, id)?;
        // A finished job shows where and when its last attempt ran; a queued one, nothing.
        let last = j.run.as_deref().or(if j.state.is_terminal() { d.more().last_run.as_ref() } else { None });
        let view = JobView {
            id,
            name: j.spec.name.clone(),
            tenant: d.tenant.to_string(),
            submitted_by: d.submitted_by.as_deref().map(String::as_str).map(str::to_string),
            state: self.state_of(id).unwrap_or(j.state).to_string(),
            priority: j.spec.priority,
            tasks: j.spec.tasks,
            gpus: j.spec.total_gpus(),
            submitted_ms: j.submitted.0,
            started_ms: last.map(|r| r.started.0),
            finished_ms: j.finished.map(|t| t.0),
            restarts: j.restarts,
            preemptions: j.preemptions,
            losses: j.losses,
            // Stored; seeded at start from the attempts' records for a document older than it (lib.rs `restore_job`),
            // so never below their sum.
            held_ms: d.more().held_ms,
            stopping: self.stopping_of(j),
            placement: last.map(|r| placement_view(&self.st, &r.placement)).unwrap_or_default(),
            warnings: d.more().warnings.clone(),
            spec: Unparsed::empty(),
            array: self.st.array(JobId(id)).map(|a| ArrayProgress {
                total: a.total,
                expanded: a.expanded,
                live: a.live,
                limit: a.limit,
                succeeded: a.succeeded,
                failed: a.failed,
                cancelled: a.cancelled,
            }),
            array_job_id: j.array_of.map(|(a, _)| a.0),
            array_index: j.array_of.map(|(_, i)| i),
            end_reason: j.end_reason.clone(),
            held: self.st.is_held(JobId(id)),
            attempts: d.more().attempts.clone(),
            estimate: self.estimate_view(j, d),
        };
        Some(Unparsed::new(view, d.submission.clone()))
    }

    /// Why a running job is being stopped, if it is. An array being cancelled is stopping as a job is:
    /// "cancelled" until its last element is gone.
    pub(crate) fn stopping_of(&self, j: &Job) -> Option<String> {
        j.run
            .as_ref()
            .and_then(|r| r.stop)
            .map(|c| c.to_string())
            .or_else(|| self.st.array(j.id).filter(|a| a.cancelling).map(|_| StopCause::Cancelled.to_string()))
    }

    /// A document's job state now, whether it is added yet or not ([`Owner::state_of`] of an added one).
    pub(crate) fn live_of(&self, id: u64, d: &JobDoc) -> gpunet_core::JobState {
        self.st.array(JobId(id)).map_or_else(|| d.live_state(&self.st, id), |a| a.state)
    }

    /// Adds a job's document, listed in its state now; an element's array is listed again (an element added changes
    /// what its summary may say).
    pub(crate) fn add_doc(&mut self, id: u64, d: JobDoc) {
        let state = self.live_of(id, &d);
        let array = self.st.job(JobId(id)).and_then(|j| j.array_of).map(|(a, _)| a.0);
        self.docs.insert(id, d, state);
        if let Some(a) = array {
            self.relist(a);
        }
    }

    /// Lists job `id` (and an element's array) in its state now.
    pub(crate) fn relist(&mut self, id: u64) {
        self.relist_one(id);
        if let Some((a, _)) = self.st.job(JobId(id)).and_then(|j| j.array_of) {
            self.relist_one(a.0);
        }
    }

    fn relist_one(&mut self, id: u64) {
        if let Some(s) = self.state_of(id) {
            self.docs.set_state(id, s);
        }
    }

    /// Lists again every job whose state the core reports changed.
    pub(crate) fn relist_changed(&mut self) {
        for id in self.st.take_changed() {
            self.relist(id.0);
        }
    }

    /// In debug builds (the tests), with few jobs, checks each document's listed state against its state now, once
    /// per turn of the owner's loop: a change the core did not report fails the test that made it.
    fn check_listed(&self) {
        #[cfg(debug_assertions)]
        if self.docs.len() <= 2000 {
            for (id, d) in self.docs.iter() {
                let s = self.state_of(*id).expect("present");
                assert_eq!(d.listed(), s, "job-{id} is listed as {} but is {s}", d.listed());
            }
        }
    }

    /// Lists every job again (after a restore, whose arrays' summaries are known only once all is read).
    pub(crate) fn relist_all(&mut self) {
        let _ = self.st.take_changed();
        let ids: Vec<u64> = self.docs.keys().copied().collect();
        for id in ids {
            self.relist_one(id);
        }
    }

    /// The core's jobs `w` takes, by id, with their documents (an array's parent, not the core's, is left out; so is
    /// a job whose state the core changed since it was listed, until it is listed again).
    pub(crate) fn listed<'a>(&'a self, w: Which<'a>) -> impl Iterator<Item = (u64, &'a JobDoc, &'a Job)> + 'a {
        self.docs.ids(w, doc::Walk::After(0)).filter_map(move |id| {
            let (d, j) = (self.docs.get(&id)?, self.st.job(JobId(id))?);
            (w.states.is_empty() || w.states.contains(&j.state)).then_some((id, d, j))
        })
    }

    /// A job's state now: the core's, an array's summary, else the document's.
    pub(crate) fn state_of(&self, id: u64) -> Option<gpunet_core::JobState> {
        self.docs.get(&id).map(|d| self.live_of(id, d))
    }

    fn sync_doc(&mut self, id: u64) {
        let mut ended = None;
        if let (Some(j), Some(d)) = (self.st.job(JobId(id)), self.docs.get_mut(&id)) {
            if !d.state.is_terminal() && j.state.is_terminal() {
                ended = Some((d.tenant.to_string(), d.submission.len()));
            }
            d.state = j.state;
            if let Some(run) = &j.run {
                d.more_mut().last_run = Some(gpunet_core::job::RunInfo::clone(run));
            }
        }
        if let Some((tenant, size)) = ended {
            if let Some(held) = self.unfinished_spec_bytes.as_mut().and_then(|m| m.get_mut(&tenant)) {
                *held = held.saturating_sub(size);
            }
        }
    }

    /// Usage rows of a run that ends at `end`: one per node the job ran on, billed per started second by the one
    /// pricing function (`gpunet_core::pricing::cost`, which the simulator uses too).
    pub(crate) fn usage_rows(&self, job: &Job, doc: &JobDoc, end: u64) -> Vec<UsageRow> {
        use gpunet_core::pricing;
        let Some(run) = job.run.as_ref() else { return Vec::new() };
        let ms = end.saturating_sub(run.started.0);
        let secs = pricing::billed_seconds(ms) as f64;
        pricing::held_per_node(&run.placement)
            .into_iter()
            .filter_map(|(n, held)| {
                let node = self.st.node(n)?;
                let c = pricing::cost(held, &self.prices.node_rates(node.spec), ms);
                let u = self.util.of(job.id.0, job.attempt(), &node.spec.name);
                Some(UsageRow {
                    job: job.id.0,
                    tenant: doc.tenant.to_string(),
                    start_ms: run.started.0,
                    end_ms: end,
                    gpu_model: node.spec.gpu_model().map(|m| m.to_string()).unwrap_or_default(),
                    lifecycle: node.spec.lifecycle().as_str().into(),
                    gpu_seconds: held.gpus as f64 * secs,
                    cpu_seconds: held.cpu.0 as f64 / 1000.0 * secs,
                    mem_gib_seconds: held.mem.0 as f64 / 1024.0 * secs,
                    gpu_cost: c.gpu,
                    cpu_cost: c.cpu,
                    mem_cost: c.mem,
                    cost: c.total(),
                    submitted_by: doc.submitted_by.as_deref().map(String::as_str).unwrap_or_default().to_string(),
                    sampled_gpu_seconds: u.sampled,
                    busy_gpu_seconds: u.busy,
                })
            })
            .collect()
    }

    /// Takes one command from the channel: a change bumps the queue view's change number first (see `snapshot`).
    fn take(&mut self, cmd: Cmd) {
        if !cmd.is_read() {
            self.queue_pub.bump();
        }
        self.handle(cmd)
    }

    /// Applies one command. While the store refuses writes, changes are refused here, in one place; the rest is a
    /// dispatch to the handlers of each command family (`jobs`, `tenants`, `nodes`, `queries`).
    pub(crate) fn handle(&mut self, cmd: Cmd) {
        // While the store refuses writes, nothing may change.
        if let Some(e) = self.read_only() {
            match cmd {
                Cmd::Cancel { reply, .. } | Cmd::Hold { reply, .. } => return drop(reply.send(Err(e))),
                Cmd::CreateTenant { reply, .. } | Cmd::IssueToken { reply, .. } => return drop(reply.send(Err(e))),
                Cmd::CreateToken { reply, .. } => return drop(reply.send(Err(e))),
                Cmd::RevokeToken { reply, .. } => return drop(reply.send(Err(e))),
                Cmd::SetQuota { reply, .. } => return drop(reply.send(Err(e))),
                Cmd::RegisterNode { reply, .. } => return drop(reply.send(Err(e))),
                Cmd::SetNodeState { reply, .. } => return drop(reply.send(Err(e))),
                other => return self.handle_cmd(other),
            }
        }
        self.handle_cmd(cmd)
    }

    fn handle_cmd(&mut self, cmd: Cmd) {
        self.dispatch(cmd);
        self.relist_changed();
    }

    fn dispatch(&mut self, cmd: Cmd) {
        match cmd {
            // Jobs (`jobs`).
            Cmd::Submit { who, by, subs, key, reply } => self.submit(who, by, subs, key, reply),
            Cmd::DryRun { who, by, sub, warnings, reply } => self.dry_run(who, by, *sub, warnings, reply),
            Cmd::Get { who, id, reply } => self.get_job(who, id, reply),
            Cmd::List { who, filter, reply } => self.list_jobs(who, filter, reply),
            Cmd::Cancel { who, id, reply } => self.cancel(who, id, reply),
            Cmd::Hold { who, id, hold, reply } => self.set_hold(who, id, hold, reply),
            Cmd::Explain { who, id, reply } => self.explain_job(who, id, reply),
            // Tenants, quotas and tokens (`tenants`).
            Cmd::CreateTenant { req, reply } => self.create_tenant(req, reply),
            Cmd::SetQuota { tenant, quota, reply } => self.set_quota(tenant, quota.map(|q| *q), reply),
            Cmd::IssueToken { tenant, reply } => self.issue_token(tenant, reply),
            Cmd::CreateToken { doc, reply } => self.create_token(doc, reply),
            Cmd::Tokens { tenant, reply } => self.list_tokens(tenant, reply),
            Cmd::RevokeToken { id, tenant, reply } => self.revoke_token(id, tenant, reply),
            Cmd::Tenants { who, reply } => self.list_tenants(who, reply),
            // Nodes and their agents (`nodes`).
            Cmd::RegisterNode { spec, fake, price, join, node_token, reply } => {
                self.register_node(spec, fake, price, join, node_token, reply)
            }
            Cmd::NodeTasks { node, asked, reply } => self.node_tasks(node, asked, reply),
            Cmd::Nodes { who, reply } => self.list_nodes(who, reply),
            Cmd::SetNodeState { name, state, reply } => self.set_node_state(name, state, reply),
            Cmd::AgentSync { node, sync, reply } => match self.agent_sync(&node, sync) {
                Ok((writes, work)) => self.durable(writes, reply, work),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            // Reads of the cluster (`queries`).
            Cmd::Summary { who, reply } => self.summary(who, reply),
            Cmd::LiveUsage { who, reply } => self.live_usage(who, reply),
            Cmd::Gauges { reply } => {
                let _ = reply.send(Ok(crate::metrics::gauges(self)));
            }
            Cmd::Reclaim { name, deadline_s, reply } => self.reclaim_node(name, deadline_s, reply),
            Cmd::Pools { reply } => self.pool_views(reply),
            Cmd::History { reply } => {
                let _ = reply.send(Ok(self.history.iter().cloned().collect()));
            }
        }
    }

    /// The zones a running job's tasks are in.
    fn zones_of(&self, job: JobId) -> Vec<String> {
        let mut z: Vec<String> = self
            .st
            .job(job)
            .and_then(|j| j.run.as_ref())
            .map(|r| {
                r.placement
                    .tasks
                    .iter()
                    .filter_map(|t| self.st.node(t.node))
                    .map(|n| n.spec.zone().to_string())
                    .collect()
            })
            .unwrap_or_default();
        z.sort();
        z.dedup();
        z
    }

    /// One scheduling pass; persists what changed.
    pub(crate) fn pass(&mut self) {
        if !self.metrics.store_writable() {
            return; // read-only: nothing changes until the server restarts on a store that accepts writes
        }
        self.lose_silent_nodes();
        let t0 = std::time::Instant::now();
        let mut writes = Vec::new();
        self.expire_fences(&mut writes);
        self.apply_cascades(&mut writes);
        let now = now_ms();
        self.st.accrue_usage(Time(now));
        let ds = schedule(&self.st, Time(now));
        for d in &ds {
            let prior_nodes = match d {
                Decision::Preempt { job, .. } | Decision::Scale { job, .. } => self.nodes_of(*job),
                _ => Vec::new(),
            };
            if let Err(e) = self.st.apply_decision(d, Time(now)) {
                tracing::error!(error = %e, "apply a scheduling decision");
                continue;
            }
            // A started array element expands the next: its document exists before its own start is recorded.
            self.apply_cascades(&mut writes);
            match d {
                Decision::Start { job, .. } | Decision::Scale { job, .. } => {
                    let mut n = self.nodes_of(*job);
                    n.extend(prior_nodes);
                    self.bump_job(n);
                }
                Decision::Preempt { .. } => {
                    self.bump_job(prior_nodes);
                }
                Decision::Reserve { .. } => {}
            }
            match d {
                Decision::Start { job, .. } => {
                    self.sync_doc(job.0);
                    // Submission to first start; later starts' waits count in the time not running.
                    let j = self.st.job(*job).expect("a started job is the core's");
                    if j.attempt() == 0 {
                        self.metrics.pending_seconds.observe(now.saturating_sub(j.submitted.0) as f64 / 1000.0);
                    }
                    if let Some(run) = self.st.job(*job).and_then(|j| j.run.clone().map(|r| (j.attempt(), r))) {
                        let placement = placement_view(&self.st, &run.1.placement);
                        if let Some(d) = self.docs.get_mut(&job.0) {
                            let attempts = &mut d.more_mut().attempts;
                            attempts.push(AttemptView {
                                attempt: run.0,
                                placement,
                                started_ms: run.1.started.0,
                                ended_ms: None,
                                outcome: None,
                                exit_code: None,
                                signal: None,
                                message: None,
                            });
                            let over = attempts.len().saturating_sub(MAX_ATTEMPT_RECORDS);
                            attempts.drain(..over);
                        }
                    }
                    writes.push(self.job_doc_write(job.0).expect("present"));
                    let text = match self.zones_of(*job) {
                        z if z.len() > 1 => format!(
                            "job-{} started across zones {}: no zone had room for all its tasks (topology any)",
                            job.0,
                            z.join(", ")
                        ),
                        _ => format!("job-{} started", job.0),
                    };
                    writes.push(self.event(job.0, "started", text));
                }
                Decision::Preempt { job, reason, for_job } => {
                    self.sync_doc(job.0);
                    self.metrics.preemptions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.metrics.stop_asked(job.0);
                    writes.push(self.job_doc_write(job.0).expect("present"));
                    // The event is the evicted job's tenant's to read: another tenant's job is not named.
                    let same = self.docs.get(&job.0).map(|d| &d.tenant) == self.docs.get(&for_job.0).map(|d| &d.tenant);
                    let for_text = if same { for_job.to_string() } else { OTHER_JOB.to_string() };
                    writes.push(self.event(
                        job.0,
                        "stopping",
                        format!(
                            "job-{} asked to stop for {for_text}: {}; its GPUs stay held until its end is confirmed",
                            job.0,
                            serde_json::to_string(reason).unwrap_or_default()
                        ),
                    ));
                    self.confirm_unmanaged(*job, now, &mut writes);
                }
                Decision::Scale { job, .. } => {
                    self.sync_doc(job.0);
                    writes.push(self.job_doc_write(job.0).expect("present"));
                }
                Decision::Reserve { .. } => {}
            }
        }
        if !writes.is_empty() {
            self.queue_pub.bump();
            self.persist(writes, "scheduling decisions");
        }
        self.metrics.pass_seconds.observe(t0.elapsed().as_secs_f64());
        self.dirty = false;
        self.sample_history(now);
        if !self.pools.list.is_empty() || !self.pools.reclaims.is_empty() {
            self.pools_tick();
        }
    }

    /// Runs until the channel closes. A pass follows a batch of commands, and runs at least every `tick`. Passes
    /// after a change are spaced by four times what the last one cost, between [`PASS_GAP_MIN`] and
    /// [`PASS_GAP_MAX`]: on a small queue (a pass of tens of microseconds) a submission is placed within a fraction of
    /// a millisecond, and however long the queue, passes take at most a fifth of the owner's time, so a burst of
    /// submissions is scheduled in a few passes, not one per request. A change that comes within the gap is scheduled
    /// exactly when it is over (not at the next tick of a free-running timer, which could come up to twice as late).
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Cmd>,
        mut applied: mpsc::UnboundedReceiver<Applier>,
        tick: std::time::Duration,
    ) {
        let mut min_gap = PASS_GAP_MAX;
        let mut last_pass = tokio::time::Instant::now() - tick;
        loop {
            // The next pass: the gap after the last one when something changed, else a tick after it; or the next build
            // of the queue view, if sooner.
            let mut due = last_pass + if self.dirty { min_gap } else { tick };
            if let Some(d) = self.queue_pub.due(self.st.queued_count() > 0) {
                due = due.min(tokio::time::Instant::from_std(d));
            }
            let wake = self.queue_pub.wake.clone();
            tokio::select! {
                // A reader waits for its own change: the next build may come sooner (`snapshot::Publisher::due`).
                _ = wake.notified() => {}
                Some(f) = applied.recv() => {
                    self.queue_pub.bump();
                    (f.0)(&mut self);
                    while let Ok(f) = applied.try_recv() {
                        (f.0)(&mut self);
                    }
                    self.relist_changed();
                }
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { break };
                    self.take(cmd);
                    // Take what else is waiting.
                    let mut n = 0;
                    while n < 4096 {
                        match rx.try_recv() {
                            Ok(c) => self.take(c),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                }
                _ = tokio::time::sleep_until(due) => {}
            }
            let gap = last_pass.elapsed();
            if (self.dirty && gap >= min_gap) || gap >= tick {
                let t0 = tokio::time::Instant::now();
                self.pass();
                self.relist_changed();
                last_pass = tokio::time::Instant::now();
                min_gap = pass_gap(last_pass - t0);
            }
            self.check_listed();
            self.publish_queue();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn passes_are_spaced_by_four_times_their_cost_within_bounds() {
        // A cheap pass (a small queue): the next one soon.
        assert_eq!(pass_gap(Duration::from_micros(10)), PASS_GAP_MIN);
        assert_eq!(pass_gap(Duration::from_micros(300)), Duration::from_micros(1200));
        // A costly one (a long queue): no more than a fifth of the owner's time, and never more than the bound.
        assert_eq!(pass_gap(Duration::from_millis(1)), Duration::from_millis(4));
        assert_eq!(pass_gap(Duration::from_millis(40)), PASS_GAP_MAX);
    }
}
