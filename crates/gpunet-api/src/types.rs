//! Request and response bodies of the `/v1` API.

use crate::spec::JobSubmission;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Answer to a submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Submitted {
    /// Job id.
    pub id: u64,
    /// Its state when acknowledged (durable).
    pub state: String,
    /// Fields accepted with a caveat or not honoured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Where one task runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskView {
    /// Node name.
    pub node: String,
    /// GPU indexes on the node.
    pub gpus: Vec<u32>,
    /// MIG slot, for a MIG task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_slot: Option<u16>,
}

/// A job as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobView {
    /// Id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Tenant.
    pub tenant: String,
    /// Who submitted it: the token's user, else its role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// State.
    pub state: String,
    /// Priority.
    pub priority: i32,
    /// Tasks.
    pub tasks: u32,
    /// GPUs in total.
    pub gpus: u32,
    /// Submitted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// Start of the current or last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// Restarts after failure.
    pub restarts: u32,
    /// Evictions.
    pub preemptions: u32,
    /// Attempts ended by the loss of a node (not counted as restarts).
    #[serde(default)]
    pub losses: u32,
    /// Milliseconds its ended attempts held their resources (each from its start to its confirmed end), summed over
    /// every one. Its time not running is `finished_ms − submitted_ms − held_ms` once it has ended, `started_ms −
    /// submitted_ms − held_ms` while it runs, and up to now less `held_ms` while it waits.
    #[serde(default)]
    pub held_ms: u64,
    /// While the end of its current attempt is under way: why (`preempted`, `cancelled`, `failed`, `drained`,
    /// `node_lost`, `interrupted`). The job keeps its GPUs until its processes are confirmed gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<String>,
    /// Where it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<TaskView>,
    /// Warnings from its submission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The spec as submitted.
    pub spec: JobSubmission,
    /// For a job array: its elements' progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayProgress>,
    /// For an array element: the array's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_job_id: Option<u64>,
    /// For an array element: its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u32>,
    /// Why it ended without running to its end on its own (a dependency that can never be satisfied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// Held (submitted with `hold`, or `POST /v1/jobs/{id}/hold`): it is not scheduled until released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// Its attempts, oldest first: where each ran, when, and how it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptView>,
    /// The run-time estimate the scheduler uses (given in the spec, or learned from history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<EstimateView>,
}

/// One attempt of a job: a start and, once confirmed, its end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptView {
    /// Attempt number (0 first; restarts, preemptions and node losses each begin another).
    pub attempt: u32,
    /// Where its tasks ran.
    pub placement: Vec<TaskView>,
    /// Started, ms since the Unix epoch.
    pub started_ms: u64,
    /// Its end confirmed, ms since the Unix epoch; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// How it ended: `succeeded`, `failed`, `oom`, `liveness`, `time_limit`, `start_failed` (the agent could not
    /// start it), `preempted`, `drained`, `cancelled`, `node_lost` or `interrupted`; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The exit code of the rank that ended it (0 when every rank exited 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that killed the rank that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The end in one sentence (which rank, why; for a preemption, the job it made room for when it is the same
    /// tenant's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl AttemptView {
    /// Milliseconds these attempts held their resources, each ended one from its start to its confirmed end (one that
    /// runs is not counted).
    pub fn held_ms(attempts: &[AttemptView]) -> u64 {
        attempts.iter().filter_map(|a| a.ended_ms.map(|e| e.saturating_sub(a.started_ms))).sum()
    }
}

/// A job's run-time estimate as the scheduler uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EstimateView {
    /// Estimated run time, seconds.
    pub seconds: u64,
    /// `given` (in the job's spec), `learned` (predicted from the history of jobs like it) or `probe` (neither: the
    /// job was submitted under the scheduler's probe, and `seconds` is that probe; SRTF and SRGF rank it as a job that
    /// ends when it has run that long, and past it as one that runs as long again as it has run).
    pub source: String,
    /// For a learned estimate: confidence in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// For a learned estimate: the history it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
    /// For a learned estimate: the runs behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u32>,
    /// For a learned estimate: the spread of those runs, the standard deviation of the log of their run times (two
    /// in three within a factor `e^spread` of the estimate). SRTF and SRGF take the run time as log-normal with this
    /// spread and rank the job by its Gittins rank (docs/scheduler.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// For a learned estimate longer than the scheduler's probe when the job was submitted, or none (`source`
    /// `probe`), while the job has not ended nor yet run that long: the probe, seconds. Until then SRTF and SRGF rank it (and backfill counts it) as a
    /// job that ends this long after it starts, so that a short job among runs learned as long is found out
    /// (docs/scheduler.md, "Probes").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_s: Option<u64>,
}

/// A job array's progress. Element `k` (the `k`-th index, ascending) has job id `array id + 1 + k`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ArrayProgress {
    /// Elements in all.
    pub total: usize,
    /// Elements made into jobs so far (as they start, up to the limit).
    pub expanded: usize,
    /// Elements expanded and not ended.
    pub live: u32,
    /// Most live at once (`%N`), if limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Elements that succeeded.
    pub succeeded: u32,
    /// Elements that failed.
    pub failed: u32,
    /// Elements cancelled (with those never expanded of a cancelled array).
    pub cancelled: u32,
}

/// A page of jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobPage {
    /// Jobs, by id.
    pub jobs: Vec<JobView>,
    /// Pass as `after` (or, newest first, as `before`) to get the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
    /// Jobs matching the filters in all, over every page.
    #[serde(default)]
    pub total: usize,
}

/// Why a job waits, with an ETA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Explain {
    /// Job.
    pub id: u64,
    /// State.
    pub state: String,
    /// The reason with its numbers, in one sentence.
    pub message: String,
    /// The structured reason (`kind` and its fields).
    #[schema(value_type = Object)]
    pub reason: serde_json::Value,
    /// Queued jobs ahead in policy order.
    pub position: usize,
    /// Predicted start (ms since the Unix epoch), from replaying the live state forward on estimates; absent when it
    /// cannot be predicted (e.g. running jobs without estimates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_ms: Option<u64>,
    /// The run-time estimate the scheduler uses for the job (given or learned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<EstimateView>,
    /// For a queued job: when the explanation was computed (ms since the Unix epoch). A queued job is explained by
    /// the queue view's build (one pass for every job asked about, never a pass per request), so this may be a few
    /// seconds old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of_ms: Option<u64>,
}

/// The answer to a dry run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DryRun {
    /// Where it would start now, if it fits now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<TaskView>,
    /// Predicted start, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_ms: Option<u64>,
    /// Why it would wait.
    pub message: String,
    /// Conversion warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The run-time estimate it would be scheduled by: given, learned from jobs like it as a submission would be, or
    /// the scheduler's probe when there is neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<EstimateView>,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TokenRole {
    /// Everything.
    Admin,
    /// A tenant's jobs, and its tokens.
    TenantAdmin,
    /// A tenant's jobs.
    Tenant,
    /// Registers nodes (agents' join token), nothing else.
    Join,
}

impl TokenRole {
    /// The role's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Admin => "admin",
            TokenRole::TenantAdmin => "tenant-admin",
            TokenRole::Tenant => "tenant",
            TokenRole::Join => "join",
        }
    }
}

/// A token to create: `POST /v1/tokens` (admin: any; a tenant admin: its tenant's `tenant` and `tenant-admin` tokens).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Role.
    pub role: TokenRole,
    /// Tenant, for `tenant` and `tenant-admin` (a tenant admin's own by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The person or service holding it (recorded on the jobs it submits).
    pub user: String,
    /// Lifetime, e.g. `30d`; none: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<String>,
}

/// A token as listed (never the secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenInfo {
    /// Id (the start of the token's hash): what `revoke` takes.
    pub id: String,
    /// Role.
    pub role: TokenRole,
    /// Tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// User.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Created, ms since the Unix epoch (0: before token records).
    pub created_ms: u64,
    /// Expiry, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

/// A new token (the secret is shown once; only its hash is stored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenCreated {
    /// The token's record.
    #[serde(flatten)]
    pub info: TokenInfo,
    /// The bearer token.
    pub token: String,
}

/// A tenant to create (admin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantRequest {
    /// Name (letters, digits, `-`, `_`, `.`; 1 to 63 characters).
    pub name: String,
    /// Fair-share weight (default 1).
    #[serde(default)]
    pub weight: Option<f64>,
    /// Cohort.
    #[serde(default)]
    pub cohort: Option<String>,
    /// Quota.
    #[serde(default)]
    pub quota: Option<QuotaRequest>,
    /// Whether the tenant's jobs may run on spot nodes when they do not say (`spot` of a job): `never` (the
    /// default), `allowed` or `preferred`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<crate::spec::SpotUse>,
}

/// A quota in API form; absent dimensions are not constrained. Limits default to the guarantees.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaRequest {
    /// Guaranteed GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee_gpus: Option<u64>,
    /// Most GPUs with borrowing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_gpus: Option<u64>,
    /// Guaranteed CPU (cores or millicores, `64` or `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee_cpu: Option<String>,
    /// CPU limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_cpu: Option<String>,
    /// Guaranteed memory (`256Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee_memory: Option<String>,
    /// Memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_memory: Option<String>,
    /// Per GPU model: model name → guaranteed GPUs (limit equal).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_model_gpus: BTreeMap<String, u64>,
}

/// A tenant as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantView {
    /// Name.
    pub name: String,
    /// Weight.
    pub weight: f64,
    /// Cohort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// Quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaRequest>,
    /// GPUs in use.
    pub gpus_used: u64,
    /// CPU millicores in use.
    pub cpu_milli_used: u64,
    /// Memory MiB in use.
    pub memory_mib_used: u64,
    /// Jobs waiting.
    pub queued: usize,
    /// Jobs running.
    pub running: usize,
    /// Decayed GPU-hours of past usage (fair share).
    pub fair_share_usage_gpu_hours: f64,
    /// Its jobs' default `spot` (`never` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<crate::spec::SpotUse>,
}

/// A new token (shown once).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenIssued {
    /// Tenant.
    pub tenant: String,
    /// The bearer token; only its hash is stored.
    pub token: String,
}

/// A node as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeView {
    /// Name.
    pub name: String,
    /// `ready`, `cordoned`, `draining` or `lost`.
    pub state: String,
    /// GPU model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// GPUs.
    pub gpus: u32,
    /// Free GPUs.
    pub free_gpus: u32,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Fake GPUs (no NVIDIA device behind them).
    pub fake: bool,
    /// Price of a GPU-hour on the node: its agent's, else the server's price catalogue's.
    #[serde(default)]
    pub price_per_gpu_hour: f64,
    /// Jobs with a task on the node (a tenant sees only its own).
    pub jobs: Vec<u64>,
    /// Each whole GPU with what holds it.
    #[serde(default)]
    pub devices: Vec<GpuView>,
    /// Under a reclaim notice (`POST /v1/nodes/{node}/reclaim`): when its provider takes it back (ms since the
    /// epoch). Absent once the reclaim is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_deadline_ms: Option<u64>,
}

/// A node pool (`GET /v1/pools`): its settings, its nodes, what its autoscaler forecasts, and its latest events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolView {
    /// Name (its nodes are `NAME-00001`, …).
    pub name: String,
    /// `local` or `exec`.
    pub provider: String,
    /// Zone of its nodes.
    pub zone: String,
    /// `spot` or `on-demand`.
    pub lifecycle: String,
    /// GPU model of its nodes.
    pub gpu_model: String,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Fewest nodes.
    pub min_nodes: u32,
    /// Most nodes.
    pub max_nodes: u32,
    /// Nodes it is sized to now (booting and up).
    pub target_nodes: u32,
    /// Forecast demand in GPUs (weighted moving average of the window).
    pub forecast_gpus: f64,
    /// Forecast ÷ capacity (a very large number when it has none and there is demand).
    pub load: f64,
    /// Sizing decisions made since the server started: one per `interval_s` at most, each on a new demand sample.
    #[serde(default)]
    pub decisions: u64,
    /// Its nodes.
    pub nodes: Vec<PoolNodeView>,
    /// Its latest events, oldest first (scale-outs and -ins with their numbers, hook results, boot timeouts,
    /// reclaims).
    pub events: Vec<PoolEventView>,
}

/// A node of a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolNodeView {
    /// Name.
    pub name: String,
    /// `booting` (asked of the provider, not registered), `up`, or `leaving` (being deleted).
    pub phase: String,
    /// Its node state once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// An event of a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolEventView {
    /// The pool.
    pub pool: String,
    /// `scale_out`, `scale_in`, `resumed`, `resume_failed`, `node_up`, `boot_timeout`, `deleted`,
    /// `suspend_failed` or `reclaim`.
    pub kind: String,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// In words.
    pub message: String,
    /// Its numbers (forecast, load, capacity, nodes, …).
    #[schema(value_type = Object)]
    pub numbers: serde_json::Value,
}

/// A reclaim notice for a node (`POST /v1/nodes/{node}/reclaim`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReclaimRequest {
    /// Seconds until the provider takes the node (0.1 to 86400).
    pub deadline_s: f64,
}

/// The answer to a node's registration: the node, and its own credential (shown once; only its hash is stored). The
/// agent syncs with this credential, which is bound to the node's name; registering the node again replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeRegistered {
    /// The node.
    #[serde(flatten)]
    pub node: NodeView,
    /// The node's bearer credential for `POST /v1/agents/{node}/sync`.
    pub credential: String,
}

/// One whole GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GpuView {
    /// Index on the node.
    pub index: u32,
    /// Model.
    pub model: String,
    /// NUMA node.
    pub numa: u8,
    /// NVLink domain on the node.
    pub nvlink_domain: u8,
    /// MIG instances (0 when MIG is off).
    pub mig_instances: u32,
    /// Held by a running job (or by one of its MIG slices).
    pub allocated: bool,
    /// The job holding it; shown to the admin and to the job's own tenant only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<u64>,
    /// That job's tenant, under the same rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Latest utilisation sample in percent (NVML); absent for fake GPUs and before the first sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<f64>,
    /// Latest memory-used sample in MiB (NVML), under the same rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<u64>,
}

/// Who a token belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// `admin` or `tenant`.
    pub role: String,
    /// The tenant, for a tenant token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The token itself, as `gpunet tokens list` shows it: its id, exact role (a tenant admin manages its
    /// tenant's tokens), user and expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<TokenInfo>,
}

/// One queued job in policy order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueEntry {
    /// Queued jobs ahead of it.
    pub position: usize,
    /// Job id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Tenant.
    pub tenant: String,
    /// State (`pending`, `preempted` or `restarting`).
    pub state: String,
    /// Priority.
    pub priority: i32,
    /// GPUs in total.
    pub gpus: u32,
    /// Submitted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// Why it waits, in one sentence with numbers.
    pub message: String,
    /// The structured reason.
    #[schema(value_type = Object)]
    pub reason: serde_json::Value,
    /// Predicted start, ms since the Unix epoch; absent when it cannot be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_ms: Option<u64>,
}

/// The queue as the policy will consider it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueView {
    /// Policy.
    pub policy: String,
    /// Jobs waiting in all (all tenants).
    pub queue_length: usize,
    /// Jobs waiting that the caller may see (a tenant: its own), dependency waits included: what `entries` would
    /// hold without the limit.
    #[serde(default)]
    pub visible_length: usize,
    /// The first queued jobs in policy order (a tenant sees only its own, with their positions in the whole queue).
    pub entries: Vec<QueueEntry>,
    /// When this view was computed, ms since the Unix epoch: the server computes it after changes, not per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of_ms: Option<u64>,
}

/// One sample of the cluster's allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HistoryPoint {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// Schedulable GPUs.
    pub gpus_total: u64,
    /// GPUs held by running jobs.
    pub gpus_allocated: u64,
    /// Jobs waiting.
    pub queue_length: usize,
    /// Jobs running.
    pub running: usize,
}

/// The cluster at a glance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterSummary {
    /// Policy.
    pub policy: String,
    /// Backfill on.
    pub backfill: bool,
    /// Nodes by state.
    pub nodes: BTreeMap<String, usize>,
    /// Schedulable GPUs.
    pub gpus_total: u64,
    /// GPUs held by running jobs.
    pub gpus_allocated: u64,
    /// Jobs by state (asked with a tenant token: the tenant's own).
    pub jobs: BTreeMap<String, usize>,
    /// Jobs waiting in the queue, the cluster's (as `/v1/cluster/history` shows it).
    pub queue_length: usize,
}

/// Usage over a period, billed per second (see `gpunet_core::pricing`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageReport {
    /// Currency of every cost (the server's price catalogue's).
    #[serde(default)]
    pub currency: String,
    /// Start, ms since the Unix epoch.
    pub from_ms: u64,
    /// End.
    pub to_ms: u64,
    /// Per tenant: GPU-hours, CPU core-hours, memory GiB-hours, cost.
    pub tenants: BTreeMap<String, UsageTotals>,
    /// Per job.
    /// (JSON object keys are strings: the job ids in decimal.)
    #[schema(value_type = BTreeMap<String, UsageTotals>)]
    pub jobs: BTreeMap<u64, UsageTotals>,
    /// Per GPU model and lifecycle (`A100-80GB/spot`).
    #[serde(default)]
    pub by_model: BTreeMap<String, UsageTotals>,
    /// Per user within a tenant (`team-a/alice`; the user who submitted each job, `team-a/-` for rows from before
    /// that was recorded).
    #[serde(default)]
    pub by_user: BTreeMap<String, UsageTotals>,
}

/// Totals of usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageTotals {
    /// GPU-hours.
    pub gpu_hours: f64,
    /// CPU core-hours.
    pub cpu_hours: f64,
    /// Memory GiB-hours.
    pub memory_gib_hours: f64,
    /// Cost of GPUs.
    #[serde(default)]
    pub gpu_cost: f64,
    /// Cost of CPU.
    #[serde(default)]
    pub cpu_cost: f64,
    /// Cost of memory.
    #[serde(default)]
    pub mem_cost: f64,
    /// Total cost: `gpu_cost + cpu_cost + mem_cost`.
    pub cost: f64,
    /// GPU-hours covered by the agents' utilisation samples (NVML; 0 where GPUs send none).
    #[serde(default)]
    pub sampled_gpu_hours: f64,
    /// Those GPU-hours weighted by utilisation: `busy_gpu_hours / sampled_gpu_hours` is the average utilisation of
    /// the GPUs allocated (see [`UsageTotals::gpu_utilization`]).
    #[serde(default)]
    pub busy_gpu_hours: f64,
}

impl UsageTotals {
    /// The average utilisation (0 to 1) of the GPUs allocated, over the time samples covered; `None` without any.
    pub fn gpu_utilization(&self) -> Option<f64> {
        (self.sampled_gpu_hours > 0.0).then(|| self.busy_gpu_hours / self.sampled_gpu_hours)
    }
}

impl std::ops::AddAssign<&UsageTotals> for UsageTotals {
    fn add_assign(&mut self, o: &UsageTotals) {
        self.gpu_hours += o.gpu_hours;
        self.cpu_hours += o.cpu_hours;
        self.memory_gib_hours += o.memory_gib_hours;
        self.gpu_cost += o.gpu_cost;
        self.cpu_cost += o.cpu_cost;
        self.mem_cost += o.mem_cost;
        self.cost += o.cost;
        self.sampled_gpu_hours += o.sampled_gpu_hours;
        self.busy_gpu_hours += o.busy_gpu_hours;
    }
}
