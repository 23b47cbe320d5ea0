//! The task that owns the live cluster: every change goes through it as a [`Cmd`], in order. It applies the change to
//! the core state, queues the write to the store, and replies only once the store says the write is durable. After
//! each batch of commands (and on a periodic tick) it runs a scheduling pass and persists what changed.

use crate::metrics::ServerMetrics;
use crate::tokens::TokenDoc;
use crate::{now_ms, Principal};
use gpunet_api::spec::JobSubmission;
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::tenant::{dim_model, Quota, DIM_CPU, DIM_GPUS, DIM_MEM};
use gpunet_core::{
    explain, queue_order, schedule, AttemptEnded, ClusterState, Decision, GpuModel, Job, JobId, JobState, NodeSpec,
    NodeState, Placement, RankEnd, StopCause, TenantId, TenantSpec, Time,
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
        reply: Reply<Vec<Submitted>>,
    },
    DryRun {
        who: Principal,
        sub: JobSubmission,
        warnings: Vec<String>,
        reply: Reply<DryRun>,
    },
    Get {
        who: Principal,
        id: u64,
        reply: Reply<JobView>,
    },
    List {
        who: Principal,
        tenant: Option<String>,
        state: Option<String>,
        after: u64,
        limit: usize,
        reply: Reply<JobPage>,
    },
    Cancel {
        who: Principal,
        id: u64,
        reply: Reply<JobView>,
    },
    Explain {
        who: Principal,
        id: u64,
        reply: Reply<Explain>,
    },
    CreateTenant {
        req: TenantRequest,
        reply: Reply<TokenIssued>,
    },
    SetQuota {
        tenant: String,
        quota: Option<(Quota, QuotaRequest)>,
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
        reply: Reply<ClusterSummary>,
    },
    LiveUsage {
        who: Principal,
        reply: Reply<Vec<UsageRow>>,
    },
    Gauges {
        reply: Reply<String>,
    },
    Queue {
        who: Principal,
        limit: usize,
        reply: Reply<QueueView>,
    },
    History {
        reply: Reply<Vec<HistoryPoint>>,
    },
    AgentSync {
        node: String,
        sync: gpunet_api::agent::AgentSync,
        reply: Reply<gpunet_api::agent::AgentWork>,
    },
}

/// Applies a durable change to the owner's state.
pub(crate) struct Applier(pub(crate) Box<dyn FnOnce(&mut Owner) + Send>);

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

/// A job as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JobDoc {
    pub(crate) job: Job,
    pub(crate) tenant: String,
    pub(crate) submission: JobSubmission,
    #[serde(default)]
    pub(crate) warnings: Vec<String>,
    /// The latest attempt's run, kept after the job ends so that its start and placement can still be shown.
    #[serde(default)]
    pub(crate) last_run: Option<gpunet_core::job::RunInfo>,
    /// Who submitted it (the token's user, else its role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) submitted_by: Option<String>,
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
}

pub(crate) struct Owner {
    pub(crate) st: ClusterState,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) auth: crate::tokens::Auth,
    pub(crate) docs: BTreeMap<u64, JobDoc>,
    pub(crate) tenants: BTreeMap<String, TenantDoc>,
    pub(crate) nodes: BTreeMap<String, NodeDoc>,
    pub(crate) next_id: u64,
    pub(crate) metrics: Arc<ServerMetrics>,
    pub(crate) events: broadcast::Sender<String>,
    dirty: bool,
    /// Version of each node's task set.
    versions: HashMap<String, u64>,
    /// Last sync of each agent-managed node.
    last_seen: HashMap<String, std::time::Instant>,
    /// How the first failed rank of a job's current attempt ended, for the event at the attempt's end.
    fail_how: HashMap<u64, (String, bool)>,
    /// When each lost node was lost (its tasks are fenced until its agent confirms them gone or `fence_after`).
    lost_since: HashMap<String, std::time::Instant>,
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
    /// The latest per-GPU samples each agent sent (real GPUs only).
    pub(crate) gpu_samples: HashMap<String, Vec<gpunet_api::agent::GpuSample>>,
    /// The owner's own queue, for changes applied once durable.
    pub(crate) self_tx: Option<mpsc::UnboundedSender<Applier>>,
    /// Most queued jobs per tenant.
    pub(crate) max_queued_per_tenant: usize,
    /// Most spec bytes of a tenant's unfinished jobs.
    pub(crate) max_spec_bytes_per_tenant: u64,
    /// The size of each job's stored spec (filled as jobs are submitted, and on demand for recovered ones).
    spec_sizes: HashMap<u64, u64>,
    /// Task attempts handed to each node, with when they were last in its task set: a task the server stopped still
    /// ships its last lines and its exit for a while after it left the set.
    handed: HashMap<String, HashMap<gpunet_api::agent::TaskRef, std::time::Instant>>,
}

/// How long a node may still report on a task attempt after it left the node's task set.
const HANDED_KEEP: std::time::Duration = std::time::Duration::from_secs(300);

/// How often the allocation history is sampled, and how long samples are kept (12 hours, in the store too).
const HISTORY_EVERY: std::time::Duration = std::time::Duration::from_secs(15);
pub(crate) const HISTORY_SPAN_MS: u64 = 12 * 3600 * 1000;
const HISTORY_KEEP: usize = (HISTORY_SPAN_MS / 15_000) as usize;

fn not_found(what: &str, key: &str) -> ApiError {
    ApiError::new("not_found", format!("find {what} {key}: no such {what}"))
}

/// Tenant, cohort and node names: 1–63 of letters, digits, `-`, `_`, `.`, not starting with `__` (reserved for
/// gpunet; older versions stored roles under such names).
pub(crate) fn valid_name(field: &str, n: &str) -> Result<(), ApiError> {
    if n.is_empty() || n.len() > 63 || !n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(ApiError::invalid(field, n, "1 to 63 letters, digits, '-', '_' or '.'"));
    }
    if n.starts_with("__") {
        return Err(ApiError::invalid(field, n, "a name not starting with '__' (reserved)"));
    }
    Ok(())
}

/// What another tenant's job is called in texts a tenant reads.
const OTHER_JOB: &str = "another tenant's job";

/// Converts an API quota into the core's.
pub(crate) fn quota_from_request(q: &QuotaRequest) -> Result<Quota, ApiError> {
    let mut out = Quota::default();
    let gpus = |f: &str, v: Option<u64>| match v {
        Some(g) if g > gpunet_api::units::MAX_GPUS => Err(ApiError::invalid(f, &g.to_string(), "0 to 1000000 GPUs")),
        _ => Ok(()),
    };
    gpus("guarantee_gpus", q.guarantee_gpus)?;
    gpus("limit_gpus", q.limit_gpus)?;
    for (m, g) in &q.per_model_gpus {
        gpus(&format!("per_model_gpus.{m}"), Some(*g))?;
    }
    if let Some(g) = q.guarantee_gpus {
        out = out.with(DIM_GPUS, g, q.limit_gpus.unwrap_or(g));
    } else if let Some(l) = q.limit_gpus {
        out = out.with(DIM_GPUS, 0, l);
    }
    let cpu = |f: &str, v: &Option<String>| v.as_deref().map(|s| gpunet_api::units::parse_cpu(f, s)).transpose();
    let mem = |f: &str, v: &Option<String>| v.as_deref().map(|s| gpunet_api::units::parse_memory(f, s)).transpose();
    let (gc, lc) = (cpu("guarantee_cpu", &q.guarantee_cpu)?, cpu("limit_cpu", &q.limit_cpu)?);
    if gc.is_some() || lc.is_some() {
        let g = gc.unwrap_or_default();
        out = out.with(DIM_CPU, g.0, lc.unwrap_or(g).0.max(if lc.is_none() { g.0 } else { 0 }));
    }
    let (gm, lm) = (mem("guarantee_memory", &q.guarantee_memory)?, mem("limit_memory", &q.limit_memory)?);
    if gm.is_some() || lm.is_some() {
        let g = gm.unwrap_or_default();
        out = out.with(DIM_MEM, g.0, lm.unwrap_or(g).0);
    }
    for (m, g) in &q.per_model_gpus {
        let model: GpuModel = m.parse().map_err(|_| {
            ApiError::invalid(&format!("per_model_gpus.{m}"), m, &GpuModel::ALL.map(|m| m.name()).join(", "))
        })?;
        out = out.with(dim_model(model), *g, *g);
    }
    out.validate()?;
    Ok(out)
}

impl Owner {
    pub(crate) fn new(
        st: ClusterState,
        store: Arc<dyn Store>,
        auth: crate::tokens::Auth,
        metrics: Arc<ServerMetrics>,
        events: broadcast::Sender<String>,
    ) -> Owner {
        Owner {
            st,
            store,
            auth,
            docs: BTreeMap::new(),
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
            lost_after: std::time::Duration::from_secs(10),
            fence_after: std::time::Duration::from_secs(60),
            checkpoint_roots: Vec::new(),
            prices: gpunet_core::PriceCatalogue::shipped(),
            history: std::collections::VecDeque::new(),
            last_sample: None,
            gpu_samples: HashMap::new(),
            self_tx: None,
            max_queued_per_tenant: crate::DEFAULT_MAX_QUEUED_JOBS_PER_TENANT,
            max_spec_bytes_per_tenant: crate::DEFAULT_MAX_SPEC_BYTES_PER_TENANT,
            spec_sizes: HashMap::new(),
            handed: HashMap::new(),
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
        self.persist(writes, "cluster sample and fair-share usage");
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

    /// Every task that should run on a node, with its environment.
    fn assignments(&self, node: gpunet_core::NodeId) -> Vec<gpunet_api::agent::TaskAssignment> {
        let mut out = Vec::new();
        let Some(n) = self.st.node(node) else { return out };
        for jid in n.jobs.iter() {
            let (Some(j), Some(doc)) = (self.st.job(*jid), self.docs.get(&jid.0)) else { continue };
            let Some(run) = j.run.as_ref() else { continue };
            if run.stop.is_some() {
                continue; // its end was asked for: the agent stops its tasks and confirms
            }
            let attempt = j.attempt();
            // Node order of the gang (first appearance by rank) for NODE_RANK; rank 0's node is the master.
            let mut node_order: Vec<gpunet_core::NodeId> = Vec::new();
            for t in &run.placement.tasks {
                if !node_order.contains(&t.node) {
                    node_order.push(t.node);
                }
            }
            let master = run.placement.tasks.first().and_then(|t| self.st.node(t.node));
            let master_addr = master
                .map(|m| m.spec.labels.get("address").cloned().unwrap_or_else(|| m.spec.name.clone()))
                .unwrap_or_default();
            let one_node = node_order.len() == 1;
            let all_mask: u64 = run.placement.tasks.iter().fold(0, |a, t| a | t.gpu_mask);
            let nvlink =
                one_node && all_mask != 0 && self.st.scope_met(gpunet_core::TopologyScope::NvLink, &run.placement);
            let local_world = run.placement.tasks.iter().filter(|t| t.node == node).count();
            let mut local_rank = 0u32;
            for (rank, t) in run.placement.tasks.iter().enumerate() {
                if t.node != node {
                    continue;
                }
                let rank = rank as u32;
                if run.ended.binary_search(&rank).is_ok() {
                    local_rank += 1;
                    continue;
                }
                let gpus = t.gpu_indexes();
                // A MIG slot numbers the node's MIG instances GPU by GPU: find its GPU and instance.
                let mig: Vec<gpunet_api::agent::MigSlice> = t
                    .mig_slot
                    .and_then(|s| {
                        let spec = &self.st.node(node)?.spec;
                        let mut k = 0u32;
                        for (g, d) in spec.gpus.iter().enumerate() {
                            for i in 0..d.mig.len() as u32 {
                                if k == s as u32 {
                                    return Some(gpunet_api::agent::MigSlice { gpu: g as u32, instance: i });
                                }
                                k += 1;
                            }
                        }
                        None
                    })
                    .into_iter()
                    .collect();
                let visible = gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                let mut env = doc.submission.env.clone();
                let mut set = |k: &str, v: String| {
                    env.insert(k.to_string(), v);
                };
                // NVML numbers GPUs in PCI bus order; CUDA's default order is fastest first.
                set("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into());
                set("CUDA_VISIBLE_DEVICES", visible.clone());
                set("NVIDIA_VISIBLE_DEVICES", if visible.is_empty() { "void".into() } else { visible });
                set("GPUNET_JOB_ID", jid.0.to_string());
                set("GPUNET_TENANT", doc.tenant.clone());
                set("GPUNET_RESTART_COUNT", j.restarts.to_string());
                set("GPUNET_ATTEMPT", attempt.to_string());
                set("RANK", rank.to_string());
                set("WORLD_SIZE", run.placement.tasks.len().to_string());
                set("LOCAL_RANK", local_rank.to_string());
                set("LOCAL_WORLD_SIZE", local_world.to_string());
                set("NODE_RANK", node_order.iter().position(|x| *x == node).unwrap_or(0).to_string());
                set("NNODES", node_order.len().to_string());
                set("MASTER_ADDR", master_addr.clone());
                set("MASTER_PORT", (29_500 + (jid.0 % 10_000)).to_string());
                // NCCL hints from the placement's topology.
                set(
                    "NCCL_P2P_LEVEL",
                    if nvlink {
                        "NVL".into()
                    } else if one_node {
                        "PXB".into()
                    } else {
                        "SYS".into()
                    },
                );
                if one_node {
                    set("NCCL_IB_DISABLE", "1".into());
                }
                local_rank += 1;
                out.push(gpunet_api::agent::TaskAssignment {
                    task: gpunet_api::agent::TaskRef { job: jid.0, rank, attempt },
                    command: doc.submission.command.clone(),
                    env,
                    working_dir: doc.submission.working_dir.clone(),
                    gpus,
                    mig,
                    cpu_milli: t.cpu.0,
                    memory_mib: t.mem.0,
                    grace_ms: 10_000,
                    tenant_index: Some(j.spec.tenant.0),
                    tiers: doc
                        .submission
                        .checkpoint_tiers
                        .iter()
                        .map(|t| gpunet_api::agent::CheckpointTier {
                            name: t.name.clone(),
                            every_ms: gpunet_api::units::parse_duration("every", &t.every)
                                .map_or(600_000, |d| d.0.max(100)),
                            keep: t.keep.unwrap_or(2),
                            url: t.url.clone(),
                        })
                        .collect(),
                    liveness: doc.submission.liveness.as_ref().map(|l| gpunet_api::agent::Liveness {
                        command: l.command.clone(),
                        initial_delay_ms: l
                            .initial_delay
                            .as_deref()
                            .and_then(|d| gpunet_api::units::parse_duration("liveness.initial_delay", d).ok())
                            .map_or(0, |d| d.0),
                        period_ms: l
                            .period
                            .as_deref()
                            .and_then(|d| gpunet_api::units::parse_duration("liveness.period", d).ok())
                            .map_or(10_000, |d| d.0.max(100)),
                    }),
                });
            }
        }
        out
    }

    /// Applies an agent's report and answers with its node's task set, with the writes to make durable before the
    /// answer is sent (the answer waits for them and for every write queued before: an agent never sees a start the
    /// store has not accepted).
    fn agent_sync(
        &mut self,
        node: &str,
        mut sync: gpunet_api::agent::AgentSync,
    ) -> Result<(Vec<Write>, gpunet_api::agent::AgentWork), ApiError> {
        if let Some(e) = self.read_only() {
            return Err(e);
        }
        let id = self.st.node_id(node).ok_or_else(|| not_found("node", node))?;
        let now = now_ms();
        // A node reports only on its own task attempts; anything else in the report is ignored.
        sync.started.retain(|s| self.task_of_node(id, node, &s.task));
        sync.checkpoints.retain(|(t, _)| self.task_of_node(id, node, t));
        sync.exited.retain(|e| self.task_of_node(id, node, &e.task));
        self.last_seen.insert(node.to_string(), std::time::Instant::now());
        if let Some(samples) = sync.gpu_samples.take() {
            self.gpu_samples.insert(node.to_string(), samples);
        }
        let mut writes = Vec::new();
        if self.nodes.get(node).is_some_and(|d| !d.managed) {
            // From now on this node's tasks are real processes: their ends must be confirmed by its agent.
            let d = self.nodes.get_mut(node).expect("checked above");
            d.managed = true;
            writes.push(Write::Node { name: node.to_string(), doc: serde_json::to_value(&*d).expect("serialise") });
        }
        if self.st.node(id).is_some_and(|n| n.state == NodeState::Lost) {
            // The agent is back: its node is ready again. Its fenced tasks are not in its task set, so the agent
            // kills them and confirms; until then their GPUs stay allocated to the old attempts.
            self.st.set_node_state(id, NodeState::Ready, Time(now))?;
            self.lost_since.remove(node);
            if let Some(d) = self.nodes.get_mut(node) {
                d.state = NodeState::Ready;
                writes.push(Write::Node { name: node.to_string(), doc: serde_json::to_value(&*d).expect("serialise") });
            }
            self.node_event(node, "ready");
            self.dirty = true;
        }
        for s in &sync.started {
            let jid = JobId(s.task.job);
            if self.st.job(jid).is_some_and(|j| j.state == JobState::Running && j.attempt() == s.task.attempt) {
                let _ = self.events.send(
                    serde_json::json!({"job": jid.0, "kind": "process_started", "at_ms": s.at_ms, "node": node,
                        "tenant": self.docs.get(&jid.0).map(|d| d.tenant.clone())})
                    .to_string(),
                );
                writes.push(Write::Event {
                    job: jid.0,
                    at_ms: s.at_ms,
                    kind: "process_started".into(),
                    message: format!("rank {} started on {node} as pid {}", s.task.rank, s.pid),
                });
            }
        }
        for (t, at) in &sync.checkpoints {
            let jid = JobId(t.job);
            if self.st.job(jid).is_some_and(|j| j.state == JobState::Running && j.attempt() == t.attempt) {
                let _ = self.st.record_checkpoint(jid, Time(*at));
                self.sync_doc(jid.0);
                writes.push(self.event(
                    jid.0,
                    "checkpoint",
                    format!("job-{} rank {} checkpoint of attempt {} copied to its tiers", t.job, t.rank, t.attempt),
                ));
            }
        }
        for e in sync.exited {
            let jid = JobId(e.task.job);
            let Some(j) = self.st.job(jid) else { continue };
            let Some(run) = j.run.as_ref() else { continue };
            if j.state != JobState::Running || j.attempt() != e.task.attempt {
                continue; // stale or duplicate
            }
            if run.placement.tasks.get(e.task.rank as usize).is_none_or(|t| t.node != id) {
                continue; // not this node's task
            }
            let was_stopping = run.stop.is_some();
            let nodes = self.nodes_of(jid);
            let before = self.docs.get(&jid.0).map(|d| JobDoc { job: j.clone(), ..d.clone() });
            let end = if e.stopped { RankEnd::Stopped } else { RankEnd::Exited { success: e.code == Some(0) } };
            if !e.stopped && e.code != Some(0) && !was_stopping {
                let how = match (e.code, e.signal, e.oom) {
                    _ if e.reason.is_some() => {
                        format!("rank {} {}", e.task.rank, e.reason.as_deref().unwrap_or_default())
                    }
                    (_, _, true) => format!("rank {} was killed for exceeding its memory limit (OOM)", e.task.rank),
                    (Some(c), _, _) => format!("rank {} exited with code {c}", e.task.rank),
                    (None, Some(sig), _) => format!("rank {} was killed by signal {sig}", e.task.rank),
                    _ => format!("rank {} ended", e.task.rank),
                };
                self.fail_how.insert(jid.0, (how, e.oom));
            }
            let ended = self.st.rank_ended(jid, e.task.attempt, e.task.rank, end, Time(now))?;
            match ended {
                Some(x) => self.attempt_ended(x, before, nodes, now, &mut writes),
                None => {
                    if !was_stopping && self.st.job(jid).is_some_and(|j| j.is_stopping()) {
                        // A rank failed: the others are stopped before the job restarts.
                        let how = self.fail_how.get(&jid.0).map(|h| h.0.clone()).unwrap_or_default();
                        writes.push(self.event(
                            jid.0,
                            "stopping",
                            format!("job-{} attempt {} stopping its other ranks: {how}", jid.0, e.task.attempt),
                        ));
                    }
                    self.bump_job(nodes);
                }
            }
        }
        let tasks = self.assignments(id);
        let handed = self.handed.entry(node.to_string()).or_default();
        let at = std::time::Instant::now();
        handed.retain(|_, t| at.duration_since(*t) < HANDED_KEEP);
        handed.extend(tasks.iter().map(|a| (a.task, at)));
        let work = gpunet_api::agent::AgentWork { version: self.versions.get(node).copied().unwrap_or(0), tasks };
        Ok((writes, work))
    }

    /// An attempt's end was confirmed: bill it, persist the job, say what it became, and wake the agents of its nodes.
    /// `before` is the job as it was while the attempt ran (for its usage rows).
    fn attempt_ended(
        &mut self,
        e: AttemptEnded,
        before: Option<JobDoc>,
        nodes: Vec<String>,
        now: u64,
        writes: &mut Vec<Write>,
    ) {
        let id = e.job.0;
        if let Some(b) = before {
            writes.extend(self.usage_rows(&b, now).into_iter().map(Write::Usage));
        }
        // Fair share's usage changed with the attempt's end: store it with the rest.
        if let Some(t) = self.docs.get(&id).map(|d| d.tenant.clone()) {
            writes.extend(self.usage_writes(now, Some(&t)));
        }
        self.sync_doc(id);
        if let Some(w) = self.job_doc_write(id) {
            writes.push(w);
        }
        let how = self.fail_how.remove(&id);
        let state = e.state;
        let (kind, message) = match e.cause {
            None => ("succeeded".to_string(), format!("job-{id} succeeded: every rank exited 0")),
            Some(StopCause::Failed { rank }) => {
                let (how, oom) = how.unwrap_or_else(|| (format!("rank {rank} failed"), false));
                let kind = if oom { "oom".to_string() } else { state.to_string() };
                (kind, format!("job-{id} {state}: {how}"))
            }
            Some(StopCause::Preempted { for_job }) => (
                "preempted".into(),
                match for_job {
                    // The event is the evicted job's tenant's to read: another tenant's job is not named.
                    Some(f) if self.docs.get(&f.0).map(|d| &d.tenant) == self.docs.get(&id).map(|d| &d.tenant) => {
                        format!("job-{id} preempted for {f}: attempt {} ended", e.attempt)
                    }
                    Some(_) => format!("job-{id} preempted for {OTHER_JOB}: attempt {} ended", e.attempt),
                    None => format!("job-{id} preempted: attempt {} ended", e.attempt),
                },
            ),
            Some(StopCause::Drained) => {
                ("preempted".into(), format!("job-{id} preempted: its node is draining (attempt {} ended)", e.attempt))
            }
            Some(StopCause::Cancelled) => ("cancelled".into(), format!("job-{id} cancelled")),
            Some(StopCause::NodeLost { node }) => {
                let name = self.st.node(node).map(|n| n.spec.name.clone()).unwrap_or_default();
                (
                    "requeued".into(),
                    format!(
                        "job-{id} requeued: node {name} was lost and attempt {} is confirmed ended (not a restart)",
                        e.attempt
                    ),
                )
            }
            Some(StopCause::Interrupted) => (
                "requeued".into(),
                format!("job-{id} requeued: its node stopped attempt {} (not a restart)", e.attempt),
            ),
        };
        if state == JobState::Restarting {
            self.metrics.restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        writes.push(self.event(id, &kind, message));
        self.dirty = true;
        self.bump_job(nodes);
    }

    /// Confirms at once the stops of attempts whose tasks are all on nodes without an agent (no process runs there).
    fn confirm_unmanaged(&mut self, id: JobId, now: u64, writes: &mut Vec<Write>) {
        let Some(j) = self.st.job(id) else { return };
        let Some(run) = j.run.as_ref().filter(|r| r.stop.is_some()) else { return };
        let managed = run
            .placement
            .tasks
            .iter()
            .any(|t| self.st.node(t.node).and_then(|n| self.nodes.get(&n.spec.name)).is_some_and(|d| d.managed));
        if managed {
            return;
        }
        let nodes = self.nodes_of(id);
        let before = self.docs.get(&id.0).map(|d| JobDoc { job: j.clone(), ..d.clone() });
        match self.st.end_attempt(id, Time(now)) {
            Ok(e) => self.attempt_ended(e, before, nodes, now, writes),
            Err(err) => tracing::error!(job = %id, error = %err, "end an attempt on agentless nodes"),
        }
    }

    /// Lost nodes whose fence timed out: their tasks are taken as gone.
    fn expire_fences(&mut self, writes: &mut Vec<Write>) {
        let due: Vec<String> =
            self.lost_since.iter().filter(|(_, t)| t.elapsed() >= self.fence_after).map(|(n, _)| n.clone()).collect();
        let now = now_ms();
        for name in due {
            self.lost_since.remove(&name);
            let Some(id) = self.st.node_id(&name) else { continue };
            let jobs: Vec<(JobId, Option<JobDoc>, Vec<String>)> = self
                .st
                .node(id)
                .map(|n| n.jobs.iter().copied().collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|j| {
                    let before = self
                        .docs
                        .get(&j.0)
                        .map(|d| JobDoc { job: self.st.job(j).cloned().unwrap_or(d.job.clone()), ..d.clone() });
                    (j, before, self.nodes_of(j))
                })
                .collect();
            tracing::warn!(node = %name, jobs = jobs.len(), "fence of a lost node timed out: its tasks are taken as gone");
            match self.st.fence_expired(id, Time(now)) {
                Ok(ended) => {
                    for e in ended {
                        if let Some((_, before, nodes)) = jobs.iter().find(|(j, _, _)| *j == e.job).cloned() {
                            self.attempt_ended(e, before, nodes, now, writes);
                        }
                    }
                }
                Err(e) => tracing::error!(node = %name, error = %e, "expire a node's fence"),
            }
            for (j, _, nodes) in jobs {
                if self.st.job(j).is_some_and(|x| x.is_stopping()) {
                    self.bump_job(nodes);
                }
            }
        }
    }

    /// A new token for `doc`: usable at once; returns the secret and the writes that store its hash and record.
    fn new_token(&self, doc: TokenDoc) -> (String, Vec<Write>) {
        let token = crate::new_token();
        let hash = crate::hash_token(&token);
        let writes = crate::tokens::writes(&hash, &doc);
        self.auth.write().expect("auth lock").insert(hash, crate::tokens::Cred::of(doc));
        (token, writes)
    }

    /// Whether a task attempt is the node's: placed on it now, or in its task set within the last [`HANDED_KEEP`].
    fn task_of_node(&self, id: gpunet_core::NodeId, node: &str, t: &gpunet_api::agent::TaskRef) -> bool {
        let now = self.st.job(JobId(t.job)).is_some_and(|j| {
            j.attempt() == t.attempt
                && j.run.as_ref().and_then(|r| r.placement.tasks.get(t.rank as usize)).is_some_and(|p| p.node == id)
        });
        now || self.handed.get(node).and_then(|h| h.get(t)).is_some_and(|at| at.elapsed() < HANDED_KEEP)
    }

    /// The first `limit` queued jobs in policy order that `who` may see, each with its reason and predicted start.
    fn queue(&self, who: &Principal, limit: usize) -> Result<QueueView, ApiError> {
        let now = Time(now_ms());
        // A tenant sees its own jobs with their places in the whole queue: walk far enough to find `limit` of them.
        let walk = if matches!(who, Principal::Tenant(_)) { usize::MAX } else { limit };
        let order = queue_order(&self.st, now, walk);
        let mine: Vec<(usize, JobId)> = order
            .iter()
            .enumerate()
            .filter(|(_, j)| match who {
                Principal::Tenant(t) => self.docs.get(&j.0).is_some_and(|d| d.tenant == *t),
                _ => true,
            })
            .take(limit)
            .map(|(i, j)| (i, *j))
            .collect();
        let ids: Vec<JobId> = mine.iter().map(|(_, j)| *j).collect();
        let etas = gpunet_core::predict::predict_starts(&self.st, &ids, now, 2000);
        let mut entries = Vec::with_capacity(mine.len());
        for (position, j) in mine {
            let (Some(job), Some(d)) = (self.st.job(j), self.docs.get(&j.0)) else { continue };
            let e = explain(&self.st, j, now)?;
            let mut reason = serde_json::to_value(&e.reason).expect("reasons serialise");
            let message = self.mask(who, &e.message, Some(&mut reason));
            entries.push(QueueEntry {
                position,
                id: j.0,
                name: d.submission.name.clone(),
                tenant: d.tenant.clone(),
                state: job.state.to_string(),
                priority: d.submission.priority,
                gpus: job.spec.task.gpus * job.spec.tasks,
                submitted_ms: job.submitted.0,
                message,
                reason,
                eta_ms: etas.get(&j).map(|t| t.0),
            });
        }
        Ok(QueueView { policy: self.st.policy().to_string(), queue_length: self.st.queued_count(), entries })
    }

    /// Agents that stopped syncing lose their nodes; their jobs restart elsewhere under their restart policy.
    fn lose_silent_nodes(&mut self) {
        let silent: Vec<String> =
            self.last_seen.iter().filter(|(_, t)| t.elapsed() > self.lost_after).map(|(n, _)| n.clone()).collect();
        for name in silent {
            self.last_seen.remove(&name);
            let Some(id) = self.st.node_id(&name) else { continue };
            if self.st.node(id).is_some_and(|n| n.state == NodeState::Lost) {
                continue;
            }
            tracing::warn!(node = %name, "agent silent: node lost");
            let (tx, _rx) = oneshot::channel();
            self.handle(Cmd::SetNodeState { name, state: NodeState::Lost, reply: tx });
        }
    }

    fn tenant_id(&self, name: &str) -> Result<TenantId, ApiError> {
        self.st.tenant_id(name).ok_or_else(|| not_found("tenant", name))
    }

    /// Another tenant's job is answered like a missing one (404), so that its existence is not revealed.
    fn visible(&self, who: &Principal, doc: &JobDoc) -> Result<(), ApiError> {
        match who {
            Principal::Admin => Ok(()),
            Principal::Tenant(t) if *t == doc.tenant => Ok(()),
            _ => Err(not_found("job", &doc.job.id.0.to_string())),
        }
    }

    /// Whether `who` may see job `id` by its id.
    fn owns(&self, who: &Principal, id: u64) -> bool {
        match who {
            Principal::Admin => true,
            Principal::Tenant(t) => self.docs.get(&id).is_some_and(|d| d.tenant == *t),
            Principal::Agent | Principal::Node(_) => false,
        }
    }

    /// Rewrites an explanation for `who`: another tenant's job ids become "another tenant's job" in the message,
    /// and are removed from the structured reason.
    fn mask(&self, who: &Principal, message: &str, reason: Option<&mut serde_json::Value>) -> String {
        if matches!(who, Principal::Admin) {
            return message.to_string();
        }
        if let Some(serde_json::Value::Object(r)) = reason {
            for k in ["blocked_by", "holder"] {
                if r.get(k).and_then(|v| v.as_u64()).is_some_and(|id| !self.owns(who, id)) {
                    r.insert(k.into(), serde_json::Value::Null);
                }
            }
            if let Some(serde_json::Value::Array(list)) = r.get_mut("preempting") {
                list.retain(|v| v.as_u64().is_some_and(|id| self.owns(who, id)));
            }
        }
        // "job-<digits>" tokens in the text.
        let mut out = String::with_capacity(message.len());
        let mut rest = message;
        while let Some(at) = rest.find("job-") {
            out.push_str(&rest[..at]);
            let digits: String = rest[at + 4..].chars().take_while(char::is_ascii_digit).collect();
            let named = digits.parse::<u64>().ok();
            match named {
                Some(id) if !self.owns(who, id) => out.push_str(OTHER_JOB),
                _ => {
                    out.push_str("job-");
                    out.push_str(&digits);
                }
            }
            rest = &rest[at + 4 + digits.len()..];
        }
        out.push_str(rest);
        out
    }

    /// The stored size of a job's spec.
    fn spec_size(&mut self, id: u64) -> u64 {
        if let Some(n) = self.spec_sizes.get(&id) {
            return *n;
        }
        let n = self.docs.get(&id).map_or(0, |d| serde_json::to_vec(&d.submission).map_or(0, |v| v.len() as u64));
        self.spec_sizes.insert(id, n);
        n
    }

    /// Checks the per-tenant limits for `new` more jobs of `tenant` with `bytes` more spec bytes.
    fn tenant_limits(&mut self, tenant: &str, new: usize, bytes: u64) -> Result<(), ApiError> {
        let mine: Vec<u64> = self
            .docs
            .iter()
            .filter(|(_, d)| d.tenant == tenant)
            .filter(|(id, d)| !self.st.job(JobId(**id)).map_or(d.job.state, |j| j.state).is_terminal())
            .map(|(id, _)| *id)
            .collect();
        let queued = mine.iter().filter(|id| self.st.job(JobId(**id)).is_some_and(|j| j.state.is_queued())).count();
        if queued + new > self.max_queued_per_tenant {
            return Err(ApiError::limit(format!(
                "tenant {tenant} has {queued} queued jobs and asked for {new} more; the server allows at most {} \
                 (--max-queued-jobs-per-tenant)",
                self.max_queued_per_tenant
            )));
        }
        let held: u64 = mine.iter().map(|id| self.spec_size(*id)).sum();
        if held + bytes > self.max_spec_bytes_per_tenant {
            return Err(ApiError::limit(format!(
                "tenant {tenant}'s unfinished jobs hold {held} bytes of specs and this submission adds {bytes}; the \
                 server allows at most {} (--max-spec-bytes-per-tenant)",
                self.max_spec_bytes_per_tenant
            )));
        }
        Ok(())
    }

    fn job_doc_write(&self, id: u64) -> Option<Write> {
        let d = self.docs.get(&id)?;
        Some(Write::Job {
            id,
            tenant: d.tenant.clone(),
            state: d.job.state.to_string(),
            doc: serde_json::to_value(d).expect("job documents serialise"),
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
                "tenant": self.docs.get(&job).map(|d| d.tenant.clone())})
            .to_string(),
        );
    }

    fn node_event(&self, name: &str, state: &str) {
        let _ = self
            .events
            .send(serde_json::json!({"node": name, "kind": format!("node_{state}"), "at_ms": now_ms()}).to_string());
    }

    /// Persists `writes` and replies with `value` once they are durable.
    fn durable<T: Send + 'static>(&self, writes: Vec<Write>, reply: Reply<T>, value: T) {
        let metrics = self.metrics.clone();
        self.store.commit_async(
            writes,
            Box::new(move |r| {
                let _ = reply.send(match r {
                    Ok(()) => Ok(value),
                    Err(e) => {
                        metrics.store_refused(&e.to_string());
                        Err(ApiError::new("internal", format!("persist the change: {e}")))
                    }
                });
            }),
        );
    }

    /// Persists `writes` in the background; a refusal makes the control plane read-only.
    fn persist(&self, writes: Vec<Write>, what: &'static str) {
        let metrics = self.metrics.clone();
        self.store.commit_async(
            writes,
            Box::new(move |r| {
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

    fn placement_view(&self, p: &Placement) -> Vec<TaskView> {
        p.tasks
            .iter()
            .map(|t| TaskView {
                node: self.st.node(t.node).map(|n| n.spec.name.clone()).unwrap_or_default(),
                gpus: t.gpu_indexes(),
                mig_slot: t.mig_slot,
            })
            .collect()
    }

    fn view(&self, id: u64) -> Option<JobView> {
        let d = self.docs.get(&id)?;
        let j = self.st.job(JobId(id)).unwrap_or(&d.job);
        // A finished job shows where and when its last attempt ran; a queued one, nothing.
        let last = j.run.as_ref().or(if j.state.is_terminal() { d.last_run.as_ref() } else { None });
        Some(JobView {
            id,
            name: j.spec.name.clone(),
            tenant: d.tenant.clone(),
            submitted_by: d.submitted_by.clone(),
            state: j.state.to_string(),
            priority: j.spec.priority,
            tasks: j.spec.tasks,
            gpus: j.spec.total_gpus(),
            submitted_ms: j.submitted.0,
            started_ms: last.map(|r| r.started.0),
            finished_ms: j.finished.map(|t| t.0),
            restarts: j.restarts,
            preemptions: j.preemptions,
            losses: j.losses,
            stopping: j.run.as_ref().and_then(|r| r.stop).map(|c| c.to_string()),
            placement: last.map(|r| self.placement_view(&r.placement)).unwrap_or_default(),
            warnings: d.warnings.clone(),
            spec: d.submission.clone(),
        })
    }

    fn sync_doc(&mut self, id: u64) {
        if let (Some(j), Some(d)) = (self.st.job(JobId(id)), self.docs.get_mut(&id)) {
            d.job = j.clone();
            if j.run.is_some() {
                d.last_run = j.run.clone();
            }
        }
    }

    /// The job holding each whole GPU of a node, by GPU index.
    pub(crate) fn gpu_holders(&self, id: gpunet_core::NodeId) -> BTreeMap<u32, u64> {
        let mut holder = BTreeMap::new();
        let Some(n) = self.st.node(id) else { return holder };
        for j in n.jobs.iter() {
            let Some(run) = self.st.job(*j).and_then(|x| x.run.as_ref()) else { continue };
            for t in run.placement.tasks.iter().filter(|t| t.node == id) {
                for i in t.gpu_indexes() {
                    holder.insert(i, j.0);
                }
            }
        }
        holder
    }

    fn node_view(&self, name: &str, who: &Principal) -> Option<NodeView> {
        let id = self.st.node_id(name)?;
        let n = self.st.node(id)?;
        let fake = self.nodes.get(name).is_some_and(|d| d.fake);
        let jobs = n
            .jobs
            .iter()
            .filter(|j| match who {
                Principal::Tenant(t) => self.docs.get(&j.0).is_some_and(|d| d.tenant == *t),
                _ => true,
            })
            .map(|j| j.0)
            .collect();
        let holder = self.gpu_holders(id);
        let devices = n
            .spec
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let i = i as u32;
                let job = holder.get(&i).copied();
                let tenant = job.and_then(|j| self.docs.get(&j)).map(|d| d.tenant.clone());
                let shown = match who {
                    Principal::Tenant(t) => tenant.as_ref() == Some(t),
                    _ => true,
                };
                let sample = self.gpu_samples.get(name).and_then(|v| v.iter().find(|s| s.index == i));
                GpuView {
                    index: i,
                    model: g.model.to_string(),
                    numa: g.numa,
                    nvlink_domain: g.nvlink_domain,
                    mig_instances: g.mig.len() as u32,
                    allocated: job.is_some(),
                    job: job.filter(|_| shown),
                    tenant: tenant.filter(|_| shown),
                    utilization_pct: sample.and_then(|s| s.utilization_pct),
                    memory_used_mib: sample.and_then(|s| s.memory_used_mib),
                }
            })
            .collect();
        Some(NodeView {
            name: name.to_string(),
            state: n.state.to_string(),
            gpu_model: n.spec.gpu_model().map(|m| m.to_string()),
            gpus: n.spec.gpus.iter().filter(|g| g.mig.is_empty()).count() as u32,
            free_gpus: n.free_gpu_mask.count_ones(),
            labels: n.spec.labels.clone(),
            fake,
            price_per_gpu_hour: n.spec.price_per_gpu_hour,
            jobs,
            devices,
        })
    }

    fn tenant_view(&self, name: &str) -> Option<TenantView> {
        let d = self.tenants.get(name)?;
        let id = self.st.tenant_id(name)?;
        let u = self.st.tenant_usage(id);
        let (mut queued, mut running) = (0, 0);
        for doc in self.docs.values().filter(|x| x.tenant == name) {
            let s = self.st.job(doc.job.id).map_or(doc.job.state, |j| j.state);
            if s.is_queued() {
                queued += 1;
            } else if s == JobState::Running {
                running += 1;
            }
        }
        Some(TenantView {
            name: name.to_string(),
            weight: d.spec.weight,
            cohort: d.spec.cohort.clone(),
            quota: d.quota.clone(),
            gpus_used: u.gpus as u64,
            cpu_milli_used: u.cpu.0,
            memory_mib_used: u.mem.0,
            queued,
            running,
            fair_share_usage_gpu_hours: self.st.tenant_decayed_usage_gpu_s(id, Time(now_ms())) / 3600.0,
        })
    }

    /// Usage rows of a run that ends at `end`: one per node the job ran on, billed per started second by the one
    /// pricing function (`gpunet_core::pricing::cost`, which the simulator uses too).
    fn usage_rows(&self, doc: &JobDoc, end: u64) -> Vec<UsageRow> {
        use gpunet_core::pricing;
        let Some(run) = doc.job.run.as_ref() else { return Vec::new() };
        let ms = end.saturating_sub(run.started.0);
        let secs = pricing::billed_seconds(ms) as f64;
        pricing::held_per_node(&run.placement)
            .into_iter()
            .filter_map(|(n, held)| {
                let node = self.st.node(n)?;
                let c = pricing::cost(held, &self.prices.node_rates(node.spec), ms);
                Some(UsageRow {
                    job: doc.job.id.0,
                    tenant: doc.tenant.clone(),
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
                })
            })
            .collect()
    }

    pub(crate) fn handle(&mut self, cmd: Cmd) {
        // While the store refuses writes, nothing may change.
        if let Some(e) = self.read_only() {
            match cmd {
                Cmd::Cancel { reply, .. } => return drop(reply.send(Err(e))),
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
        match cmd {
            Cmd::Submit { who, by, subs, reply } => {
                let now = now_ms();
                let mut writes = Vec::with_capacity(subs.len() * 2);
                let mut out = Vec::with_capacity(subs.len());
                // Validate every job first: a batch is all or nothing.
                let mut prepared = Vec::with_capacity(subs.len());
                for (i, (sub, warnings)) in subs.into_iter().enumerate() {
                    let tenant = match (&who, &sub.tenant) {
                        (Principal::Tenant(t), None) => t.clone(),
                        (Principal::Tenant(t), Some(s)) if s == t => t.clone(),
                        (Principal::Tenant(_), Some(_)) => {
                            let _ = reply
                                .send(Err(ApiError::new("forbidden", "a tenant token submits only to its own tenant")));
                            return;
                        }
                        (_, Some(s)) => s.clone(),
                        (_, None) => {
                            let _ = reply.send(Err(ApiError::missing(if i == 0 { "tenant" } else { "jobs[].tenant" })));
                            return;
                        }
                    };
                    let tid = match self.tenant_id(&tenant) {
                        Ok(t) => t,
                        Err(e) => {
                            let _ = reply.send(Err(e));
                            return;
                        }
                    };
                    match sub.to_core(tid).and_then(|s| {
                        gpunet_api::spec::check_checkpoint_roots(&sub, &tenant, &self.checkpoint_roots).map(|_| s)
                    }) {
                        Ok(spec) => prepared.push((tenant, sub, warnings, spec)),
                        Err(mut e) => {
                            if i > 0 {
                                e.message = format!("jobs[{i}]: {}", e.message);
                            }
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
                if let Some(e) = self.read_only() {
                    let _ = reply.send(Err(e));
                    return;
                }
                // Per-tenant limits, for every tenant of the batch.
                let mut per: BTreeMap<String, (usize, u64)> = BTreeMap::new();
                for (tenant, sub, _, _) in &prepared {
                    let e = per.entry(tenant.clone()).or_default();
                    e.0 += 1;
                    e.1 += serde_json::to_vec(sub).map_or(0, |v| v.len() as u64);
                }
                for (tenant, (n, bytes)) in per {
                    if let Err(e) = self.tenant_limits(&tenant, n, bytes) {
                        let _ = reply.send(Err(e));
                        return;
                    }
                }
                // Durable, then visible: the jobs are written first and enter the live state only once the store
                // has accepted them; a refused write leaves no trace (no job, no start, no event).
                let mut docs = Vec::with_capacity(prepared.len());
                for (tenant, sub, warnings, spec) in prepared {
                    if let Err(e) = spec.validate() {
                        let _ = reply.send(Err(e.into()));
                        return;
                    }
                    let id = self.next_id;
                    self.next_id += 1;
                    let doc = JobDoc {
                        job: Job::new(JobId(id), spec, Time(now)),
                        tenant,
                        submission: sub,
                        warnings: warnings.clone(),
                        last_run: None,
                        submitted_by: Some(by.clone()),
                    };
                    writes.push(Write::Job {
                        id,
                        tenant: doc.tenant.clone(),
                        state: JobState::Pending.to_string(),
                        doc: serde_json::to_value(&doc).expect("job documents serialise"),
                    });
                    writes.push(Write::Event {
                        job: id,
                        at_ms: now,
                        kind: "submitted".into(),
                        message: format!("job-{id} submitted"),
                    });
                    out.push(Submitted { id, state: "pending".into(), warnings });
                    docs.push(doc);
                }
                let tx = self.self_tx.clone();
                let metrics = self.metrics.clone();
                self.store.commit_async(
                    writes,
                    Box::new(move |r| {
                        if let Err(e) = r {
                            metrics.store_refused(&e.to_string());
                            let _ = reply.send(Err(ApiError::new("internal", format!("persist the jobs: {e}"))));
                            return;
                        }
                        let apply = Applier(Box::new(move |o: &mut Owner| {
                            for mut doc in docs {
                                let id = doc.job.id;
                                if let Err(e) = o.st.submit(id, doc.job.spec.clone(), doc.job.submitted) {
                                    tracing::error!(job = %id, error = %e, "a stored job was refused by the core");
                                    continue;
                                }
                                doc.job = o.st.job(id).expect("just submitted").clone();
                                o.spec_sizes
                                    .insert(id.0, serde_json::to_vec(&doc.submission).map_or(0, |v| v.len() as u64));
                                o.docs.insert(id.0, doc);
                                o.event_broadcast(id.0, "submitted", &format!("job-{} submitted", id.0));
                                o.metrics.submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            o.dirty = true;
                            let _ = reply.send(Ok(out));
                        }));
                        if let Some(tx) = tx {
                            let _ = tx.send(apply);
                        }
                    }),
                );
            }
            Cmd::DryRun { who, sub, warnings, reply } => {
                let r = (|| {
                    let tenant = match (&who, &sub.tenant) {
                        (Principal::Tenant(t), _) => t.clone(),
                        (_, Some(t)) => t.clone(),
                        _ => return Err(ApiError::missing("tenant")),
                    };
                    let spec = sub.to_core(self.tenant_id(&tenant)?)?;
                    gpunet_api::spec::check_checkpoint_roots(&sub, &tenant, &self.checkpoint_roots)?;
                    let mut probe = self.st.clone();
                    let id = JobId(u64::MAX - 1);
                    let now = Time(now_ms());
                    probe.submit(id, spec, now)?;
                    let message = explain(&probe, id, now)
                        .map(|e| self.mask(&who, &e.message.replace(&id.to_string(), "this job"), None))
                        .unwrap_or_default();
                    let pred = gpunet_core::predict::predict_start(&probe, id, now, 2000);
                    let placement = match &pred {
                        Some((t, p)) if *t == now => self.placement_view(p),
                        _ => Vec::new(),
                    };
                    Ok(DryRun { placement, eta_ms: pred.map(|(t, _)| t.0), message, warnings })
                })();
                let _ = reply.send(r);
            }
            Cmd::Get { who, id, reply } => {
                let r = match self.docs.get(&id) {
                    None => Err(not_found("job", &id.to_string())),
                    Some(d) => self.visible(&who, d).map(|_| self.view(id).expect("present")),
                };
                let _ = reply.send(r);
            }
            Cmd::List { who, tenant, state, after, limit, reply } => {
                let tenant = match (&who, tenant) {
                    (Principal::Tenant(t), Some(x)) if x != *t => {
                        let _ = reply.send(Err(ApiError::new("forbidden", "a tenant token lists only its own jobs")));
                        return;
                    }
                    (Principal::Tenant(t), _) => Some(t.clone()),
                    (_, x) => x,
                };
                let mut jobs = Vec::new();
                let mut next = None;
                for (id, d) in self.docs.range(after + 1..) {
                    if tenant.as_ref().is_some_and(|t| *t != d.tenant) {
                        continue;
                    }
                    let s = self.st.job(JobId(*id)).map_or(d.job.state, |j| j.state);
                    if state.as_ref().is_some_and(|x| x != s.as_str()) {
                        continue;
                    }
                    if jobs.len() == limit {
                        next = jobs.last().map(|v: &JobView| v.id);
                        break;
                    }
                    jobs.push(self.view(*id).expect("present"));
                }
                let _ = reply.send(Ok(JobPage { jobs, next }));
            }
            Cmd::Cancel { who, id, reply } => {
                let Some(d) = self.docs.get(&id) else {
                    let _ = reply.send(Err(not_found("job", &id.to_string())));
                    return;
                };
                if let Err(e) = self.visible(&who, d) {
                    let _ = reply.send(Err(e));
                    return;
                }
                let now = now_ms();
                let jid = JobId(id);
                let running = self.st.job(jid).is_some_and(|j| j.state == JobState::Running);
                let mut writes = Vec::new();
                if running {
                    // A running job is asked to stop; it is cancelled once its agents confirm its processes gone
                    // (at once on nodes without an agent). Its resources stay allocated until then.
                    if let Err(e) = self.st.request_stop(jid, StopCause::Cancelled, Time(now)) {
                        let _ = reply.send(Err(e.into()));
                        return;
                    }
                    self.sync_doc(id);
                    writes.push(self.job_doc_write(id).expect("present"));
                    writes.push(self.event(id, "stopping", format!("job-{id} cancel requested: stopping its tasks")));
                    let nodes = self.nodes_of(jid);
                    self.bump_job(nodes);
                    self.confirm_unmanaged(jid, now, &mut writes);
                } else {
                    if let Err(e) = self.st.cancel(jid, Time(now)) {
                        let _ = reply.send(Err(e.into()));
                        return;
                    }
                    self.sync_doc(id);
                    writes.push(self.job_doc_write(id).expect("present"));
                    writes.push(self.event(id, "cancelled", format!("job-{id} cancelled")));
                }
                self.dirty = true;
                let v = self.view(id).expect("present");
                self.durable(writes, reply, v);
            }
            Cmd::Explain { who, id, reply } => {
                let r = (|| {
                    let d = self.docs.get(&id).ok_or_else(|| not_found("job", &id.to_string()))?;
                    self.visible(&who, d)?;
                    let now = Time(now_ms());
                    let e = explain(&self.st, JobId(id), now)?;
                    let state = self.st.job(JobId(id)).map_or(d.job.state, |j| j.state);
                    let eta = if state.is_queued() {
                        gpunet_core::predict::predict_start(&self.st, JobId(id), now, 2000).map(|(t, _)| t.0)
                    } else {
                        None
                    };
                    let mut reason = serde_json::to_value(&e.reason).expect("reasons serialise");
                    let message = self.mask(&who, &e.message, Some(&mut reason));
                    Ok(Explain { id, state: state.to_string(), message, reason, position: e.position, eta_ms: eta })
                })();
                let _ = reply.send(r);
            }
            Cmd::CreateTenant { req, reply } => {
                let r = (|| {
                    valid_name("name", &req.name)?;
                    if let Some(c) = &req.cohort {
                        valid_name("cohort", c)?;
                    }
                    let mut spec = TenantSpec::new(req.name.clone());
                    spec.weight = req.weight.unwrap_or(1.0);
                    if !(spec.weight > 0.0 && spec.weight <= 1e6) {
                        return Err(ApiError::invalid(
                            "weight",
                            &spec.weight.to_string(),
                            "a number > 0 and <= 1000000",
                        ));
                    }
                    spec.cohort = req.cohort.clone();
                    spec.quota = req.quota.as_ref().map(quota_from_request).transpose()?;
                    self.st.add_tenant(spec.clone())?;
                    Ok(spec)
                })();
                match r {
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                    Ok(spec) => {
                        // The tenant's first token administers the tenant (its jobs and tokens).
                        let (token, mut writes) = self.new_token(TokenDoc {
                            role: TokenRole::TenantAdmin,
                            tenant: Some(req.name.clone()),
                            user: None,
                            created_ms: now_ms(),
                            expires_ms: None,
                            bootstrap: false,
                        });
                        let doc = TenantDoc { spec, quota: req.quota.clone(), usage: None };
                        writes.push(Write::Tenant {
                            name: req.name.clone(),
                            doc: serde_json::to_value(&doc).expect("serialise"),
                        });
                        self.tenants.insert(req.name.clone(), doc);
                        self.dirty = true;
                        self.durable(writes, reply, TokenIssued { tenant: req.name, token });
                    }
                }
            }
            Cmd::SetQuota { tenant, quota, reply } => {
                let r = (|| {
                    let id = self.tenant_id(&tenant)?;
                    self.st.set_quota(id, quota.as_ref().map(|q| q.0.clone()))?;
                    Ok(())
                })();
                if let Err(e) = r {
                    let _ = reply.send(Err(e));
                    return;
                }
                let doc = self.tenants.get_mut(&tenant).expect("tenant exists");
                doc.spec.quota = quota.as_ref().map(|q| q.0.clone());
                doc.quota = quota.map(|q| q.1);
                let w = Write::Tenant { name: tenant.clone(), doc: serde_json::to_value(&*doc).expect("serialise") };
                self.dirty = true;
                let v = self.tenant_view(&tenant).expect("exists");
                self.durable(vec![w], reply, v);
            }
            Cmd::IssueToken { tenant, reply } => {
                if !self.tenants.contains_key(&tenant) {
                    let _ = reply.send(Err(not_found("tenant", &tenant)));
                    return;
                }
                let (token, writes) = self.new_token(TokenDoc {
                    role: TokenRole::Tenant,
                    tenant: Some(tenant.clone()),
                    user: None,
                    created_ms: now_ms(),
                    expires_ms: None,
                    bootstrap: false,
                });
                self.durable(writes, reply, TokenIssued { tenant, token });
            }
            Cmd::CreateToken { doc, reply } => {
                if let Some(t) = doc.tenant.as_ref().filter(|t| !self.tenants.contains_key(*t)) {
                    let _ = reply.send(Err(not_found("tenant", t)));
                    return;
                }
                let (token, writes) = self.new_token(doc.clone());
                let info = crate::tokens::info(&crate::hash_token(&token), &crate::tokens::Cred::of(doc));
                self.durable(writes, reply, TokenCreated { info, token });
            }
            Cmd::Tokens { tenant, reply } => {
                let a = self.auth.read().expect("auth lock");
                let mut v: Vec<TokenInfo> = a
                    .iter()
                    .filter(|(_, c)| !matches!(c.who, Principal::Node(_)))
                    .map(|(h, c)| crate::tokens::info(h, c))
                    .filter(|i| tenant.is_none() || i.tenant == tenant)
                    .collect();
                v.sort_by(|x, y| (x.created_ms, &x.id).cmp(&(y.created_ms, &y.id)));
                let _ = reply.send(Ok(v));
            }
            Cmd::RevokeToken { id, tenant, reply } => {
                let r = (|| {
                    let a = self.auth.read().expect("auth lock");
                    let found: Vec<(&String, &crate::tokens::Cred)> = a
                        .iter()
                        .filter(|(h, c)| crate::tokens::id_of(h) == id && !matches!(c.who, Principal::Node(_)))
                        .collect();
                    let [(hash, cred)] = found[..] else { return Err(not_found("token", &id)) };
                    let info = crate::tokens::info(hash, cred);
                    if tenant.is_some() && info.tenant != tenant {
                        return Err(not_found("token", &id));
                    }
                    let admins = a.values().filter(|c| c.who == Principal::Admin).count();
                    if cred.who == Principal::Admin && admins == 1 {
                        return Err(ApiError::new("conflict", "revoke the last admin token: create another first"));
                    }
                    Ok((hash.clone(), info))
                })();
                match r {
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                    Ok((hash, info)) => {
                        self.auth.write().expect("auth lock").remove(&hash);
                        self.durable(vec![Write::RevokeToken { hash }], reply, info);
                    }
                }
            }
            Cmd::Tenants { who, reply } => {
                let v = self
                    .tenants
                    .keys()
                    .filter(|n| match &who {
                        Principal::Tenant(t) => *t == **n,
                        _ => true,
                    })
                    .filter_map(|n| self.tenant_view(n))
                    .collect();
                let _ = reply.send(Ok(v));
            }
            Cmd::RegisterNode { mut spec, fake, price, reply } => {
                let name = spec.name.clone();
                let r = if let Some(id) = self.st.node_id(&name) {
                    // Re-registration of a known node (an agent coming back): it becomes ready again, priced again.
                    let known = self.st.node(id).expect("known").spec;
                    let per_gpu_hour = self.prices.resolve_gpu_hour(known, price);
                    self.st
                        .set_node_state(id, NodeState::Ready, Time(now_ms()))
                        .and_then(|_| self.st.set_node_price(id, per_gpu_hour))
                        .map_err(ApiError::from)
                } else {
                    // Priced by the agent's override, else the catalogue, by GPU model and lifecycle label.
                    spec.price_per_gpu_hour = self.prices.resolve_gpu_hour(&spec, price);
                    valid_name("name", &name)
                        .and_then(|_| self.st.add_node(spec.clone()).map(|_| ()).map_err(ApiError::from))
                };
                if let Err(e) = r {
                    let _ = reply.send(Err(e));
                    return;
                }
                let id = self.st.node_id(&name).expect("registered");
                let full = self.st.node(id).expect("registered").spec.clone();
                // A fresh credential for the node; the one it replaces stops working now.
                let credential = crate::new_token();
                let hash = crate::hash_token(&credential);
                {
                    let mut auth = self.auth.write().expect("auth lock");
                    if let Some(old) = self.nodes.get(&name).and_then(|d| d.credential.as_ref()) {
                        auth.remove(old);
                    }
                    auth.insert(hash.clone(), crate::tokens::Cred { who: Principal::Node(name.clone()), doc: None });
                }
                let managed = self.nodes.get(&name).is_some_and(|d| d.managed);
                self.lost_since.remove(&name);
                let doc = NodeDoc {
                    spec: full,
                    state: NodeState::Ready,
                    fake,
                    managed,
                    credential: Some(hash),
                    price_override: price,
                };
                let w = Write::Node { name: name.clone(), doc: serde_json::to_value(&doc).expect("serialise") };
                self.nodes.insert(name.clone(), doc);
                self.dirty = true;
                self.node_event(&name, "ready");
                let node = self.node_view(&name, &Principal::Admin).expect("registered");
                self.durable(vec![w], reply, NodeRegistered { node, credential });
            }
            Cmd::Nodes { who, reply } => {
                let v = self.nodes.keys().filter_map(|n| self.node_view(n, &who)).collect();
                let _ = reply.send(Ok(v));
            }
            Cmd::SetNodeState { name, state, reply } => {
                let Some(id) = self.st.node_id(&name) else {
                    let _ = reply.send(Err(not_found("node", &name)));
                    return;
                };
                let now = now_ms();
                // The nodes of the jobs asked to stop: their agents stop those tasks.
                let mut touched: Vec<String> = vec![name.clone()];
                for j in self.st.node(id).map(|n| n.jobs.iter().copied().collect::<Vec<_>>()).unwrap_or_default() {
                    touched.extend(self.nodes_of(j));
                }
                let moved = match self.st.set_node_state(id, state, Time(now)) {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = reply.send(Err(e.into()));
                        return;
                    }
                };
                let mut writes = Vec::new();
                if state == NodeState::Lost {
                    self.lost_since.insert(name.clone(), std::time::Instant::now());
                } else {
                    self.lost_since.remove(&name);
                }
                for j in &moved {
                    // Asked to stop: the agents stop the tasks and confirm; a lost node's tasks are fenced until its
                    // agent returns and confirms, or the fence times out.
                    self.sync_doc(j.0);
                    writes.push(self.job_doc_write(j.0).expect("present"));
                    writes.push(self.event(
                        j.0,
                        "stopping",
                        format!(
                            "job-{} stopping: node {name} is {state}; its GPUs stay held until its end is confirmed",
                            j.0
                        ),
                    ));
                    if state != NodeState::Lost {
                        self.confirm_unmanaged(*j, now, &mut writes);
                    }
                }
                let doc = self.nodes.get_mut(&name).expect("known node");
                doc.state = state;
                writes.push(Write::Node { name: name.clone(), doc: serde_json::to_value(&*doc).expect("serialise") });
                self.dirty = true;
                self.node_event(&name, state.to_string().as_str());
                touched.sort();
                touched.dedup();
                self.bump_job(touched);
                let v = self.node_view(&name, &Principal::Admin).expect("known");
                self.durable(writes, reply, v);
            }
            Cmd::Summary { reply } => {
                let mut nodes = BTreeMap::new();
                for n in self.st.nodes() {
                    *nodes.entry(n.state.to_string()).or_insert(0) += 1;
                }
                let mut jobs = BTreeMap::new();
                for d in self.docs.values() {
                    let s = self.st.job(d.job.id).map_or(d.job.state, |j| j.state);
                    *jobs.entry(s.to_string()).or_insert(0) += 1;
                }
                let _ = reply.send(Ok(ClusterSummary {
                    policy: self.st.policy().to_string(),
                    backfill: self.st.config().backfill,
                    nodes,
                    gpus_total: self.st.capacity_gpus(),
                    gpus_allocated: self.st.allocated_gpus(),
                    jobs,
                    queue_length: self.st.queued_count(),
                }));
            }
            Cmd::LiveUsage { who, reply } => {
                let now = now_ms();
                let rows = self
                    .docs
                    .values()
                    .filter(|d| match &who {
                        Principal::Tenant(t) => d.tenant == *t,
                        _ => true,
                    })
                    .filter_map(|d| self.st.job(d.job.id).filter(|j| j.state == JobState::Running).map(|j| (d, j)))
                    .flat_map(|(d, j)| self.usage_rows(&JobDoc { job: j.clone(), ..d.clone() }, now))
                    .collect();
                let _ = reply.send(Ok(rows));
            }
            Cmd::Gauges { reply } => {
                let _ = reply.send(Ok(crate::metrics::gauges(self)));
            }
            Cmd::Queue { who, limit, reply } => {
                let _ = reply.send(self.queue(&who, limit));
            }
            Cmd::History { reply } => {
                let _ = reply.send(Ok(self.history.iter().cloned().collect()));
            }
            Cmd::NodeTasks { node, asked, reply } => {
                let r = match self.st.node_id(&node) {
                    Some(id) => Ok(asked.into_iter().filter(|t| self.task_of_node(id, &node, t)).collect()),
                    None => Err(not_found("node", &node)),
                };
                let _ = reply.send(r);
            }
            Cmd::AgentSync { node, sync, reply } => match self.agent_sync(&node, sync) {
                Ok((writes, work)) => self.durable(writes, reply, work),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
        }
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
                    let waited = now.saturating_sub(self.docs[&job.0].job.submitted.0);
                    self.metrics.pending_seconds.observe(waited as f64 / 1000.0);
                    writes.push(self.job_doc_write(job.0).expect("present"));
                    writes.push(self.event(job.0, "started", format!("job-{} started", job.0)));
                }
                Decision::Preempt { job, reason, for_job } => {
                    self.sync_doc(job.0);
                    self.metrics.preemptions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            self.persist(writes, "scheduling decisions");
        }
        self.metrics.pass_seconds.observe(t0.elapsed().as_secs_f64());
        self.dirty = false;
        self.sample_history(now);
    }

    /// Runs until the channel closes. A pass follows a batch of commands at most every 5 ms (so a burst of
    /// submissions is scheduled in a few passes, not one per request), and runs at least every `tick`.
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Cmd>,
        mut applied: mpsc::UnboundedReceiver<Applier>,
        tick: std::time::Duration,
    ) {
        let min_gap = std::time::Duration::from_millis(5);
        let mut ticker = tokio::time::interval(min_gap);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_pass = std::time::Instant::now() - tick;
        loop {
            tokio::select! {
                Some(f) = applied.recv() => {
                    (f.0)(&mut self);
                    while let Ok(f) = applied.try_recv() {
                        (f.0)(&mut self);
                    }
                    if self.dirty && last_pass.elapsed() >= min_gap {
                        self.pass();
                        last_pass = std::time::Instant::now();
                    }
                }
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { break };
                    self.handle(cmd);
                    // Take what else is waiting.
                    let mut n = 0;
                    while n < 4096 {
                        match rx.try_recv() {
                            Ok(c) => self.handle(c),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                    if self.dirty && last_pass.elapsed() >= min_gap {
                        self.pass();
                        last_pass = std::time::Instant::now();
                    }
                }
                _ = ticker.tick() => {
                    if (self.dirty && last_pass.elapsed() >= min_gap) || last_pass.elapsed() >= tick {
                        self.pass();
                        last_pass = std::time::Instant::now();
                    }
                }
            }
        }
    }
}
