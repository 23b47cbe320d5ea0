//! Jobs: what is asked for (`JobSpec`), where it runs (`Placement`), and the job state machine.
//!
//! ```text
//!            start                 exit 0
//! Pending ─────────────► Running ───────────► Succeeded
//!   ▲  │                 │  │  │  exit≠0, restarts left
//!   │  │ cancel          │  │  └──────────────► Restarting ──(start)──► Running
//!   │  ▼                 │  │ evict                 │
//!   │ Cancelled ◄────────┘  └──────────► Preempted ──(start)──► Running
//!   │                      exit≠0, no restarts left ──► Failed
//! ```
//! Preempted and Restarting jobs wait in the queue like Pending ones (Restarting only after its backoff).
//! Succeeded, Failed and Cancelled are terminal.

use crate::error::CoreError;
use crate::gpu::{GpuModel, MigProfile};
use crate::ids::{JobId, NodeId, TenantId};
use crate::node::{NodeSpec, MAX_GPUS_PER_NODE};
use crate::units::{Dur, MiB, MilliCpu, Resources, Time};
use serde::{Deserialize, Serialize};
use std::fmt;
pub use thin_vec::{thin_vec, ThinVec};

/// What one task (replica) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Whole GPUs.
    pub gpus: u32,
    /// A MIG slice instead of whole GPUs.
    pub mig: Option<MigProfile>,
    /// CPU.
    pub cpu: MilliCpu,
    /// Memory.
    pub mem: MiB,
}

impl TaskSpec {
    /// The task's resources as a vector (a MIG slice counts as no whole GPU).
    pub fn resources(&self) -> Resources {
        Resources { gpus: self.gpus, cpu: self.cpu, mem: self.mem }
    }
}

/// How tightly a multi-task job's tasks must be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyScope {
    /// Anywhere, across zones too.
    Any,
    /// Within one zone (no cross-zone traffic).
    Zone,
    /// Within one rack.
    Rack,
    /// On one node.
    Node,
    /// On one node, within one NVLink domain.
    NvLink,
}

impl fmt::Display for TopologyScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyScope::Any => "anywhere",
            TopologyScope::Zone => "one zone",
            TopologyScope::Rack => "one rack",
            TopologyScope::Node => "one node",
            TopologyScope::NvLink => "one NVLink domain",
        })
    }
}

/// Operator of a node-selector term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SelectorOp {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// One required node-affinity term; all terms of a job must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SelectorTerm {
    /// Label key.
    pub key: String,
    /// Operator.
    pub op: SelectorOp,
    /// Values for `In` / `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

impl SelectorTerm {
    /// `key in (value)`.
    pub fn eq(key: &str, value: &str) -> SelectorTerm {
        SelectorTerm { key: key.into(), op: SelectorOp::In, values: vec![value.into()] }
    }

    /// Whether the node's labels satisfy the term.
    pub fn matches(&self, node: &NodeSpec) -> bool {
        let v = node.labels.get(&self.key);
        match self.op {
            SelectorOp::In => v.is_some_and(|v| self.values.iter().any(|x| x.eq_ignore_ascii_case(v))),
            SelectorOp::NotIn => v.is_none_or(|v| !self.values.iter().any(|x| x.eq_ignore_ascii_case(v))),
            SelectorOp::Exists => v.is_some(),
            SelectorOp::DoesNotExist => v.is_none(),
        }
    }
}

/// Lets a job onto nodes with a matching taint (`value: None` tolerates any value of the key).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Toleration {
    /// Taint key.
    pub key: String,
    /// Taint value, or any.
    #[serde(default)]
    pub value: Option<String>,
}

/// Elastic bounds: the job runs with between `min` and `max` tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Elastic {
    /// Fewest tasks the job runs with.
    pub min_tasks: u32,
    /// Most tasks the job can use.
    pub max_tasks: u32,
}

/// Everything a job asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Owner.
    pub tenant: TenantId,
    /// Human name.
    pub name: String,
    /// Higher runs first under the `priority` policy and may preempt lower.
    pub priority: i32,
    /// Number of tasks (replicas) wanted.
    pub tasks: u32,
    /// What each task needs.
    pub task: TaskSpec,
    /// Allowed GPU models (empty: any).
    pub gpu_models: ThinVec<GpuModel>,
    /// Allow one gang to span GPU models (mixed gangs lose AllReduce efficiency).
    pub allow_mixed_models: bool,
    /// All tasks start together or none does.
    pub gang: bool,
    /// Required placement scope for the tasks.
    pub topology: TopologyScope,
    /// Node selector / required affinity.
    pub selector: ThinVec<SelectorTerm>,
    /// Tolerations (spot nodes carry the taint `lifecycle=spot`).
    pub tolerations: ThinVec<Toleration>,
    /// Estimated run time, if known.
    pub estimated_duration: Option<Dur>,
    /// The spread (standard deviation of the log of run times) of a learned estimate: the run time is then taken as
    /// log-normal with `estimated_duration` as its median, and SRTF/SRGF rank the job by its Gittins rank
    /// ([`crate::gittins`]) rather than the point estimate. `None` for an estimate given as such (taken as exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_spread: Option<f32>,
    /// A first stint in ms ([`crate::SchedConfig::probe`], [`JobSpec::probe`]): until the job is known to have run
    /// this long it is ranked as one that ends then. The core sets it at submission
    /// ([`crate::SchedConfig::probe_for`]: for a learned estimate longer than the configured probe, or under SRTF and
    /// SRGF no estimate; whatever a caller put here is replaced), so that a job keeps what it was submitted under.
    /// (32 bits of milliseconds, at most 49 days: a queued job stays small.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ms: Option<std::num::NonZeroU32>,
    /// May be evicted (and resumed from its checkpoint).
    pub preemptible: bool,
    /// How often the job checkpoints.
    pub checkpoint_interval: Option<Dur>,
    /// Restarts after failure before the job is Failed.
    pub max_restarts: u32,
    /// Elastic bounds.
    pub elastic: Option<Elastic>,
    /// Jobs this one waits for (Slurm's `--dependency`); all must be satisfied before it is queued.
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub dependencies: ThinVec<Dependency>,
    /// A job array: one queued entry whose elements are expanded as they start (see [`crate::array`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<Box<ArraySpec>>,
    /// Submitted held (Slurm's `--hold`): it waits outside the queues until released (see [`crate::hold`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Placed on spot nodes (`lifecycle=spot`) when it fits there, else anywhere it is eligible.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefer_spot: bool,
}

/// How a dependency is satisfied by the end of the jobs it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DepKind {
    /// Each named job succeeded (never satisfiable once one failed or was cancelled).
    AfterOk,
    /// Each named job ended, however.
    AfterAny,
    /// Each named job failed or was cancelled (never satisfiable once one succeeded).
    AfterNotOk,
    /// Every earlier unfinished job of the same name and tenant ended, however (the core fills `jobs` at submit).
    Singleton,
}

impl DepKind {
    /// Slurm's name: `afterok`, `afterany`, `afternotok`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DepKind::AfterOk => "afterok",
            DepKind::AfterAny => "afterany",
            DepKind::AfterNotOk => "afternotok",
            DepKind::Singleton => "singleton",
        }
    }

    /// Whether a dependency on a job that ended in `end` is satisfied (`Some(true)`), never satisfiable
    /// (`Some(false)`), or not decided yet (`None`, the job has not ended).
    pub const fn outcome(self, end: JobState) -> Option<bool> {
        if !end.is_terminal() {
            return None;
        }
        let ok = matches!(end, JobState::Succeeded);
        Some(match self {
            DepKind::AfterOk => ok,
            DepKind::AfterAny | DepKind::Singleton => true,
            DepKind::AfterNotOk => !ok,
        })
    }
}

impl fmt::Display for DepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One dependency: `kind` on each of `jobs` (an array's id stands for all its elements).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dependency {
    /// How it is satisfied.
    pub kind: DepKind,
    /// The jobs waited for.
    pub jobs: Vec<JobId>,
}

/// Most jobs one job may depend on, over all its dependencies.
pub const MAX_DEPENDENCIES: usize = 256;
/// Most elements of one job array.
pub const MAX_ARRAY_ELEMENTS: usize = 100_000;
/// Largest array index.
pub const MAX_ARRAY_INDEX: u32 = 9_999_999;

/// A job array: the element indices (ascending, distinct) and how many elements may be live at once.
///
/// Element `k` (the `k`-th index in `indices`) has job id `array id + 1 + k`: the driver reserves those ids when it
/// submits the array. An element is *live* from when it is expanded until it ends; at most `limit` are live at once,
/// so at most `limit` run at once (Slurm's `%N`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArraySpec {
    /// Element indices, ascending and distinct.
    pub indices: Vec<u32>,
    /// Most elements live at once (`None`: no limit).
    #[serde(default)]
    pub limit: Option<u32>,
}

impl JobSpec {
    /// A job of `tasks` tasks of `gpus` GPUs each, with defaults: priority 0, 1 CPU and 4 GiB per GPU (at least one of
    /// each), gang when it has several tasks and then no cross-zone placement, preemptible, 3 restarts.
    pub fn new(tenant: TenantId, name: impl Into<String>, gpus: u32, tasks: u32) -> JobSpec {
        let per = gpus.max(1) as u64;
        JobSpec {
            tenant,
            name: name.into(),
            priority: 0,
            tasks,
            task: TaskSpec { gpus, mig: None, cpu: MilliCpu::cores(per), mem: MiB::gib(4 * per) },
            gpu_models: ThinVec::new(),
            allow_mixed_models: false,
            gang: tasks > 1,
            topology: if tasks > 1 { TopologyScope::Zone } else { TopologyScope::Any },
            selector: ThinVec::new(),
            tolerations: ThinVec::new(),
            estimated_duration: None,
            estimate_spread: None,
            probe_ms: None,
            preemptible: true,
            checkpoint_interval: None,
            max_restarts: 3,
            elastic: None,
            dependencies: ThinVec::new(),
            array: None,
            hold: false,
            prefer_spot: false,
        }
    }

    /// Sets the estimate.
    pub fn estimate(mut self, d: Dur) -> JobSpec {
        self.estimated_duration = Some(d);
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, p: i32) -> JobSpec {
        self.priority = p;
        self
    }

    /// Sets CPU and memory per task.
    pub fn cpu_mem(mut self, cpu: MilliCpu, mem: MiB) -> JobSpec {
        self.task.cpu = cpu;
        self.task.mem = mem;
        self
    }

    /// The job's probe ([`JobSpec::probe_ms`]).
    pub fn probe(&self) -> Option<Dur> {
        self.probe_ms.map(|p| Dur(p.get() as u64))
    }

    /// Whether the job has a rank under SRTF/SRGF: an estimate, or a probe (a job without estimate gets one when a
    /// probe is configured, [`crate::SchedConfig::probe_for`]).
    pub fn ranked(&self) -> bool {
        self.estimated_duration.is_some() || self.probe_ms.is_some()
    }

    /// Whole GPUs over all tasks.
    pub fn total_gpus(&self) -> u32 {
        self.task.gpus.saturating_mul(self.tasks)
    }

    /// Resources over all tasks.
    pub fn total_resources(&self) -> Resources {
        self.task.resources().times(self.tasks)
    }

    /// Whether a node's taints are all tolerated.
    pub fn tolerates(&self, node: &NodeSpec) -> bool {
        node.taints.iter().all(|t| {
            self.tolerations.iter().any(|tol| tol.key == t.key && tol.value.as_ref().is_none_or(|v| *v == t.value))
        })
    }

    /// Whether the node passes selector, tolerations and model restrictions (not capacity).
    pub fn node_eligible(&self, node: &NodeSpec) -> bool {
        if (self.task.gpus > 0 || self.task.mig.is_some()) && node.gpus.is_empty() {
            return false;
        }
        if let Some(m) = node.gpu_model() {
            if !self.gpu_models.is_empty()
                && !self.gpu_models.contains(&m)
                && self.task.gpus + self.task.mig.is_some() as u32 > 0
            {
                return false;
            }
            if let Some(p) = self.task.mig {
                if !node.gpus.iter().any(|g| g.mig.contains(&p)) {
                    return false;
                }
            }
        }
        self.tolerates(node) && self.selector.iter().all(|t| t.matches(node))
    }

    /// Checks the spec; errors name the field.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |field: &'static str, value: String, allowed: &str| {
            Err(CoreError::InvalidField { field, value, allowed: allowed.into() })
        };
        if self.name.trim().is_empty() || self.name.len() > 253 {
            return bad("name", self.name.clone(), "1 to 253 characters");
        }
        if self.tasks == 0 || self.tasks > 4096 {
            return bad("tasks", self.tasks.to_string(), "1 to 4096");
        }
        if self.task.gpus as usize > MAX_GPUS_PER_NODE {
            return bad("task.gpus", self.task.gpus.to_string(), "0 to 64 GPUs per task");
        }
        if let Some(p) = self.task.mig {
            if self.task.gpus > 0 {
                return bad("task.mig", p.to_string(), "either whole GPUs or a MIG slice, not both");
            }
            let models: Vec<GpuModel> =
                if self.gpu_models.is_empty() { GpuModel::ALL.to_vec() } else { self.gpu_models.to_vec() };
            if !models.iter().any(|m| m.supports_mig(p)) {
                return bad("task.mig", p.to_string(), "a MIG profile of an allowed model (A100, H100, H200)");
            }
        }
        if self.task.cpu.0 == 0 && self.task.mem.0 == 0 && self.task.gpus == 0 && self.task.mig.is_none() {
            return bad("task", "no resources".into(), "a task asking for at least one GPU, CPU or memory");
        }
        if let Some(e) = self.elastic {
            if e.min_tasks == 0 || e.min_tasks > e.max_tasks || self.tasks < e.min_tasks || self.tasks > e.max_tasks {
                return bad(
                    "elastic",
                    format!("min {} max {} tasks {}", e.min_tasks, e.max_tasks, self.tasks),
                    "1 <= min_tasks <= tasks <= max_tasks",
                );
            }
        }
        if matches!(self.topology, TopologyScope::NvLink | TopologyScope::Node)
            && self.total_gpus() as usize > MAX_GPUS_PER_NODE
        {
            return bad("topology", self.topology.to_string(), "one node holds at most 64 GPUs; use rack or zone");
        }
        if self.estimated_duration == Some(Dur::ZERO) {
            return bad("estimated_duration", "0s".into(), "a positive duration, or none");
        }
        if self.checkpoint_interval == Some(Dur::ZERO) {
            return bad("checkpoint_interval", "0s".into(), "a positive duration, or none");
        }
        let named: usize = self.dependencies.iter().map(|d| d.jobs.len()).sum();
        if named > MAX_DEPENDENCIES
            || self.dependencies.iter().any(|d| d.jobs.is_empty() && d.kind != DepKind::Singleton)
        {
            return bad(
                "dependency",
                format!("{named} jobs in {} dependencies", self.dependencies.len()),
                "1 to 256 jobs, each dependency naming at least one",
            );
        }
        if let Some(a) = &self.array {
            if a.indices.is_empty() || a.indices.len() > MAX_ARRAY_ELEMENTS {
                return bad("array", format!("{} elements", a.indices.len()), "1 to 100000 elements");
            }
            if a.indices.windows(2).any(|w| w[0] >= w[1]) || a.indices.last().is_some_and(|i| *i > MAX_ARRAY_INDEX) {
                return bad(
                    "array",
                    "unordered, repeated or too large indices".into(),
                    "distinct indices 0 to 9999999",
                );
            }
            if a.limit == Some(0) {
                return bad("array", "%0".into(), "a concurrency limit of at least 1");
            }
        }
        Ok(())
    }
}

/// Where one task runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskPlacement {
    /// Node.
    pub node: NodeId,
    /// Bit `i` set: GPU index `i` of the node.
    pub gpu_mask: u64,
    /// MIG slot of the node (index into its MIG slot list), for a MIG task.
    pub mig_slot: Option<u16>,
    /// CPU held.
    pub cpu: MilliCpu,
    /// Memory held.
    pub mem: MiB,
}

impl TaskPlacement {
    /// GPU indexes on the node.
    pub fn gpu_indexes(&self) -> Vec<u32> {
        (0..64).filter(|i| self.gpu_mask & (1u64 << i) != 0).collect()
    }
}

/// Where all tasks of a job run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Placement {
    /// One entry per task, in rank order.
    pub tasks: Vec<TaskPlacement>,
}

impl Placement {
    /// Whole GPUs held.
    pub fn gpus(&self) -> u32 {
        self.tasks.iter().map(|t| t.gpu_mask.count_ones()).sum()
    }
}

/// A job's state. See the module docs for the transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting to start for the first time.
    Pending,
    /// Holding resources.
    Running,
    /// Evicted; waiting to resume from its last checkpoint.
    Preempted,
    /// Failed with restarts left; waiting out its backoff, then to restart from its last checkpoint.
    Restarting,
    /// Exited 0.
    Succeeded,
    /// Failed with no restarts left, or could never run.
    Failed,
    /// Cancelled by a user or admin.
    Cancelled,
}

impl JobState {
    /// Whether the job is waiting in the queue.
    pub const fn is_queued(self) -> bool {
        matches!(self, JobState::Pending | JobState::Preempted | JobState::Restarting)
    }

    /// Whether the job is finished for good.
    pub const fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }

    /// Whether the state machine allows `self → to`.
    pub const fn can_become(self, to: JobState) -> bool {
        use JobState::*;
        matches!(
            (self, to),
            (Pending | Preempted | Restarting, Running)
                | (Pending | Preempted | Restarting, Cancelled)
                | (Pending, Failed)
                | (Running, Succeeded | Failed | Cancelled | Preempted | Restarting)
        )
    }

    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Preempted => "preempted",
            JobState::Restarting => "restarting",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a running job holds and since when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Start of this attempt.
    pub started: Time,
    /// Where it runs.
    pub placement: Placement,
    /// Admitted beyond its tenant's guarantee: reclaimable.
    pub borrowed: bool,
    /// Last checkpoint reported in this attempt.
    pub last_checkpoint: Option<Time>,
    /// An eviction was decided and is under way; not a victim candidate again.
    pub evicting: bool,
    /// Why the end of this attempt was asked for (preemption, cancel, a rank's failure, node loss or drain). While
    /// set, the attempt still holds its resources: they are released only once every rank is confirmed ended (see
    /// [`crate::lifecycle`]).
    #[serde(default)]
    pub stop: Option<crate::lifecycle::StopCause>,
    /// Ranks of this attempt confirmed ended (exited, or stopped and gone), in ascending order.
    #[serde(default)]
    pub ended: Vec<u32>,
    /// Whether every rank that ended so far exited 0 of its own accord.
    #[serde(default = "yes")]
    pub all_ok: bool,
}

fn yes() -> bool {
    true
}

/// A job as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Id.
    pub id: JobId,
    /// What it asks for.
    pub spec: JobSpec,
    /// State.
    pub state: JobState,
    /// Submission time.
    pub submitted: Time,
    /// Restarts after failure so far.
    pub restarts: u32,
    /// Evictions so far.
    pub preemptions: u32,
    /// Attempts ended by the loss of a node (they do not count against `max_restarts`).
    #[serde(default)]
    pub losses: u32,
    /// GPU-milliseconds of service received in earlier attempts (for LAS).
    pub attained_gpu_ms: u64,
    /// Work kept by checkpoints from earlier attempts (counts towards the estimate for SRTF).
    pub progress: Dur,
    /// How far the job is known to run: the furthest point (kept progress at an attempt's start plus that attempt's
    /// run) an ended attempt reached without the job finishing. Work past `progress` up to it was lost and must be
    /// done again; and a job known to run that long ranks as one that has (see [`Job::rank_from`]), so that an
    /// evicted job that had overrun its estimate is not queued again as if it had not.
    #[serde(default)]
    pub known: Dur,
    /// Earliest time a Restarting job may start again.
    pub not_before: Time,
    /// When running: where and since when.
    pub run: Option<Box<RunInfo>>,
    /// When it reached a terminal state.
    pub finished: Option<Time>,
    /// For an array element: the array's id and this element's index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_of: Option<(JobId, u32)>,
    /// Why the job ended without running to its end on its own (a dependency that can never be satisfied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// Held: queued, but in no queue and never started until released (see [`crate::hold`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

impl Job {
    /// A new pending job (held when its spec says `hold`).
    pub fn new(id: JobId, spec: JobSpec, submitted: Time) -> Job {
        Job {
            held: spec.hold,
            id,
            spec,
            state: JobState::Pending,
            submitted,
            restarts: 0,
            preemptions: 0,
            losses: 0,
            attained_gpu_ms: 0,
            progress: Dur::ZERO,
            known: Dur::ZERO,
            not_before: Time::ZERO,
            run: None,
            finished: None,
            array_of: None,
            end_reason: None,
        }
    }

    /// Moves to `to` if the state machine allows it.
    pub fn transition(&mut self, to: JobState) -> Result<(), CoreError> {
        if !self.state.can_become(to) {
            return Err(CoreError::InvalidTransition { job: self.id, from: self.state, to });
        }
        self.state = to;
        Ok(())
    }

    /// The number of the current (or next) attempt: every start after the first follows the confirmed end of the
    /// previous attempt, by failure, preemption or node loss.
    pub fn attempt(&self) -> u32 {
        self.restarts + self.preemptions + self.losses
    }

    /// Whether the end of the current attempt was asked for and is not confirmed yet.
    pub fn is_stopping(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.stop.is_some())
    }

    /// GPUs held now (0 when not running).
    pub fn held_gpus(&self) -> u32 {
        self.run.as_ref().map_or(0, |r| r.placement.gpus())
    }

    /// GPU-ms of service including the current attempt up to `now`.
    pub fn attained_at(&self, now: Time) -> u64 {
        let cur = self.run.as_ref().map_or(0, |r| now.since(r.started).0.saturating_mul(r.placement.gpus() as u64));
        self.attained_gpu_ms.saturating_add(cur)
    }

    /// Remaining estimated time given kept progress (`Dur::MAX` without estimate). A job that has run past its
    /// estimate is expected to run about as long again as it has (run times are heavy-tailed: the longer a job has
    /// run, the longer it is likely to run), not to end at once. A job not yet known to have run its probe
    /// ([`JobSpec::probe_ms`]) is estimated to end at the probe's end: an attempt it starts then counts as one that
    /// ends there (its estimated end, its rank as a victim), and past it as one that overran its estimate.
    pub fn remaining_estimate(&self) -> Dur {
        Dur(self.rank_from(self.progress, crate::gittins::Rule::Median))
    }

    /// The job's rank under SRTF from `position` (kept progress, or kept progress plus the current attempt's run),
    /// given how far it is known to run ([`Job::known`]): its rank at that point, plus the lost work between
    /// `position` and it, to be done again. (Ranked at its kept progress alone, a job evicted after it had run past
    /// its estimate came back as short as it started, evicted the job that had evicted it, and so on: with learned
    /// estimates that were too short, jobs evicted each other before any checkpoint and none finished.)
    pub fn rank_from(&self, position: Dur, rule: crate::gittins::Rule) -> u64 {
        rank_from_known(self.known.0, position.0, |k| self.rank_at(Dur(k), rule))
    }

    /// Whether the job is not yet known to have run its probe ([`JobSpec::probe_ms`]): an attempt it starts now is
    /// its probe.
    pub fn probing(&self) -> bool {
        self.within_probe(self.progress)
    }

    /// Whether an attempt started now (or running, from its kept progress) is indexed to end where it is expected to:
    /// the job has an estimate and is not within its probe. A job without one is indexed to end with its probe but
    /// not expected to end at all; one within its probe is expected to run to its estimate (the ETA replay,
    /// `predict.rs`, and the start `why` names, `Pass::expected_start`).
    pub fn end_as_indexed(&self) -> bool {
        self.spec.estimated_duration.is_some() && !self.probing()
    }

    /// Whether the job is within its probe at `now`: not ended, and not yet run its probe counting the current
    /// attempt (what `show` and `why` say while it is so).
    pub fn in_probe(&self, now: Time) -> bool {
        let run = self.run.as_ref().map_or(Dur::ZERO, |r| now.since(r.started));
        !self.state.is_terminal() && self.within_probe(self.progress + run)
    }

    /// Whether neither `position` nor how far the job is known to run reaches its probe.
    fn within_probe(&self, position: Dur) -> bool {
        self.spec.probe().is_some_and(|p| self.known.max(position) < p)
    }

    /// Records that the attempt started at `started` ran until `now` (it ended without the job finishing): how far
    /// the job is known to run. Call before `progress` takes the attempt's kept work.
    pub fn note_run(&mut self, started: Time, now: Time) {
        self.known = self.known.max(self.progress + now.since(started));
    }

    /// The job's rank under SRTF after `attained` of service (kept progress plus the current attempt's run), in ms:
    /// within its probe ([`JobSpec::probe_ms`]) the time left to the probe's end; else without estimate (past its
    /// probe) `attained`, as a job that runs as long again as it has; else for a learned estimate (one with a
    /// spread), as `rule` says ([`crate::gittins::Rule`]); else the remaining estimated time as
    /// [`Job::remaining_estimate`] counts it. `u64::MAX` without estimate nor probe.
    pub fn rank_at(&self, attained: Dur, rule: crate::gittins::Rule) -> u64 {
        match (self.spec.probe(), self.spec.estimated_duration) {
            // Within its probe: as a job that ends at the probe's end.
            (Some(p), _) if attained < p => p.0 - attained.0,
            // Past it without an estimate: as a job that runs as long again as it has run.
            (Some(p), None) => crate::gittins::exact_rank(p, attained).0,
            _ => self.estimate_rank(attained, rule),
        }
    }

    /// The remaining estimated time from kept progress as if the job's probe were run (its estimate alone): what an
    /// attempt started within its probe is expected to run ([`Job::probing`]; the ETA replay expects it).
    pub fn remaining_past_probe(&self) -> Dur {
        let rank = |k: u64| self.estimate_rank(Dur(k), crate::gittins::Rule::Median);
        Dur(rank_from_known(self.known.0, self.progress.0, rank))
    }

    /// [`Job::rank_at`] without the probe.
    fn estimate_rank(&self, attained: Dur, rule: crate::gittins::Rule) -> u64 {
        use crate::gittins::{exact_rank, LogNormal, Rule};
        match (self.spec.estimated_duration, self.spec.estimate_spread) {
            (None, _) => u64::MAX,
            (Some(e), Some(sigma)) if rule == Rule::Gittins => LogNormal::new(e, sigma as f64).rank(attained).0,
            (Some(e), _) => exact_rank(e, attained).0,
        }
    }

    /// When the last checkpoint of the current attempt was taken: the reported one, else the last multiple of the
    /// checkpoint interval since start, else the start (all work since then would be lost).
    pub fn last_checkpoint_at(&self, now: Time) -> Option<Time> {
        let run = self.run.as_ref()?;
        if let Some(t) = run.last_checkpoint {
            return Some(t);
        }
        Some(match self.spec.checkpoint_interval {
            Some(iv) if iv.0 > 0 => {
                let elapsed = now.since(run.started).0;
                run.started + Dur(elapsed / iv.0 * iv.0)
            }
            _ => run.started,
        })
    }

    /// GPU-ms of work that evicting the job at `now` would lose.
    pub fn lost_work_if_evicted(&self, now: Time) -> u64 {
        match (&self.run, self.last_checkpoint_at(now)) {
            (Some(r), Some(ck)) => now.since(ck).0.saturating_mul(r.placement.gpus().max(1) as u64),
            _ => 0,
        }
    }
}

/// [`Job::rank_from`]'s rule (ms), for a running job's victim rank too: `rank_at` of the furthest point the job is
/// known to reach from `position`, plus the work between the two.
pub(crate) fn rank_from_known(known: u64, position: u64, rank_at: impl FnOnce(u64) -> u64) -> u64 {
    let k = known.max(position);
    rank_at(k).saturating_add(k - position)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server keeps one `Job` per queued job (a million at depth): its rarely used parts are thin pointers (an empty
    /// `ThinVec` allocates nothing), so that it fits in 312 bytes (a learned estimate's spread added 8 to it and to its
    /// spec, `known` 8 more).
    #[test]
    fn a_job_stays_small() {
        assert!(std::mem::size_of::<Job>() <= 312, "{} bytes", std::mem::size_of::<Job>());
        assert!(std::mem::size_of::<JobSpec>() <= 176, "{} bytes", std::mem::size_of::<JobSpec>());
    }

    #[test]
    fn every_transition_is_checked() {
        use JobState::*;
        let all = [Pending, Running, Preempted, Restarting, Succeeded, Failed, Cancelled];
        let allowed = [
            (Pending, Running),
            (Pending, Cancelled),
            (Pending, Failed),
            (Preempted, Running),
            (Preempted, Cancelled),
            (Restarting, Running),
            (Restarting, Cancelled),
            (Running, Succeeded),
            (Running, Failed),
            (Running, Cancelled),
            (Running, Preempted),
            (Running, Restarting),
        ];
        for from in all {
            for to in all {
                assert_eq!(from.can_become(to), allowed.contains(&(from, to)), "{from} -> {to}");
            }
        }
        let mut j = Job::new(JobId(1), JobSpec::new(TenantId(0), "x", 1, 1), Time::ZERO);
        j.transition(Succeeded).unwrap_err();
        j.transition(Running).unwrap();
        j.transition(Succeeded).unwrap();
        let e = j.transition(Running).unwrap_err().to_string();
        assert_eq!(e, "move job-1 from succeeded to running: not a valid transition");
    }

    #[test]
    fn validation_names_the_field() {
        let mut s = JobSpec::new(TenantId(0), "x", 1, 0);
        assert!(s.validate().unwrap_err().to_string().contains("tasks"));
        s.tasks = 2;
        s.elastic = Some(Elastic { min_tasks: 3, max_tasks: 4 });
        assert!(s.validate().unwrap_err().to_string().contains("elastic"));
        s.elastic = None;
        s.task.mig = Some("1g.10gb".parse().unwrap());
        assert!(s.validate().unwrap_err().to_string().contains("task.mig"));
        s.task.gpus = 0;
        s.validate().unwrap();
        s.gpu_models = crate::job::thin_vec![GpuModel::V100_16GB];
        assert!(s.validate().is_err());
    }

    #[test]
    fn lost_work_counts_from_the_last_checkpoint() {
        let mut spec = JobSpec::new(TenantId(0), "x", 2, 1);
        spec.checkpoint_interval = Some(Dur::from_mins(10));
        let mut j = Job::new(JobId(1), spec, Time::ZERO);
        j.state = JobState::Running;
        j.run = Some(Box::new(RunInfo {
            started: Time::ZERO,
            placement: Placement {
                tasks: vec![TaskPlacement {
                    node: NodeId(0),
                    gpu_mask: 0b11,
                    mig_slot: None,
                    cpu: MilliCpu(0),
                    mem: MiB(0),
                }],
            },
            borrowed: false,
            last_checkpoint: None,
            evicting: false,
            stop: None,
            ended: Vec::new(),
            all_ok: true,
        }));
        let now = Time::ZERO + Dur::from_mins(25);
        assert_eq!(j.last_checkpoint_at(now), Some(Time::ZERO + Dur::from_mins(20)));
        assert_eq!(j.lost_work_if_evicted(now), 2 * Dur::from_mins(5).0);
        j.run.as_mut().unwrap().last_checkpoint = Some(Time::ZERO + Dur::from_mins(24));
        assert_eq!(j.lost_work_if_evicted(now), 2 * Dur::from_mins(1).0);
        assert_eq!(j.attained_at(now), 2 * Dur::from_mins(25).0);
    }

    #[test]
    fn past_its_estimate_a_job_is_expected_to_run_as_long_again() {
        let mut j = Job::new(JobId(1), JobSpec::new(TenantId(0), "x", 1, 1).estimate(Dur::from_secs(100)), Time::ZERO);
        j.progress = Dur::from_secs(60);
        assert_eq!(j.remaining_estimate(), Dur::from_secs(40));
        j.progress = Dur::from_secs(250);
        assert_eq!(j.remaining_estimate(), Dur::from_secs(250));
        j.spec.estimated_duration = None;
        assert_eq!(j.remaining_estimate(), Dur::MAX);
    }
}
