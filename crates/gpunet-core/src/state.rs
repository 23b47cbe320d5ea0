//! The cluster state: nodes, tenants, jobs, free resources, queues and usage. It is changed only through the methods
//! here (events from the driver and the decisions of [`crate::schedule`]), each of which keeps the invariants that
//! [`ClusterState::check_invariants`] verifies.

use crate::alloc::{Free, Topology};
use crate::config::{Policy, SchedConfig};
use crate::error::CoreError;
use crate::fxhash::FxHashMap;
use crate::gpu::GpuModel;
use crate::ids::{JobId, NodeId, TenantId};
use crate::job::{Job, JobSpec, JobState, Placement, RunInfo, TopologyScope};
use crate::lifecycle::StopCause;
use crate::node::{NodeSpec, NodeState};
use crate::quota::{QuotaBook, QuotaShape};
use crate::schedule::Decision;
use crate::tenant::{dim_model, QVec, Quota, TenantSpec, DIM_CPU, DIM_GPUS, DIM_MEM, QDIMS};
use crate::units::{MiB, MilliCpu, Resources, Time};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

mod invariants;
mod keys;
mod pass_pool;
mod runs;

pub(crate) use keys::{queue_key, queue_probe, sjf_key, srgf_key, srtf_key, QueueKey};
pub(crate) use pass_pool::PassPool;
pub(crate) use runs::{order_turns_at, LostWork, RunBrief, RunRow, RunningTasks};

/// A tenant and what the scheduler tracks for it.
#[derive(Debug, Clone)]
pub(crate) struct TenantEntry {
    pub(crate) spec: TenantSpec,
    pub(crate) queue: BTreeSet<QueueKey>,
    /// Queued jobs no node could ever hold, out of the pass's walk (see [`crate::park`]).
    pub(crate) parked: BTreeSet<QueueKey>,
    /// What `queue` and `parked` hold together, kept as keys enter and leave them (see [`crate::park::Waiting`]).
    pub(crate) waiting: crate::park::Waiting,
    /// Decayed GPU-ms of past usage as of `usage_as_of`.
    pub(crate) decayed_gpu_ms: f64,
    pub(crate) usage_as_of: Time,
}

/// What a tenant's queue holds ([`ClusterState::tenant_waiting`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantWaiting {
    /// Jobs in its queue (pending, preempted, restarting; not held, not waiting for a dependency).
    pub jobs: usize,
    /// Whole GPUs those jobs ask for, each at its minimum size.
    pub gpus: u64,
    /// The earliest submission among them, to the whole second (rounded down).
    pub oldest_submitted: Option<Time>,
}

/// A read-only view of a node.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Id.
    pub id: NodeId,
    /// Spec.
    pub spec: &'a NodeSpec,
    /// State.
    pub state: NodeState,
    /// Free whole GPUs (bit per index).
    pub free_gpu_mask: u64,
    /// Free CPU.
    pub free_cpu: MilliCpu,
    /// Free memory.
    pub free_mem: MiB,
    /// Jobs with a task on the node.
    pub jobs: &'a BTreeSet<JobId>,
}

/// The whole cluster as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct ClusterState {
    pub(crate) cfg: SchedConfig,
    pub(crate) topo: Topology,
    pub(crate) free: Free,
    pub(crate) node_specs: Vec<NodeSpec>,
    pub(crate) node_states: Vec<NodeState>,
    pub(crate) node_jobs: Vec<BTreeSet<JobId>>,
    pub(crate) node_names: HashMap<String, NodeId>,
    pub(crate) tenants: Vec<TenantEntry>,
    /// Every tenant's queue (not the parked) merged in key order, with each key's tenant: policies that order jobs
    /// walk this one set instead of merging the tenants' queues through a heap (`schedule/order.rs`). Kept equal to
    /// the union of the queues by `park.rs::queue_insert`, `queue_remove` and `unpark_fitting`.
    pub(crate) merged: BTreeSet<(QueueKey, TenantId)>,
    /// The shapes and estimates of the jobs in the tenants' queues (see [`crate::park::QueueShapes`]).
    pub(crate) queue_shapes: crate::park::QueueShapes,
    pub(crate) tenant_names: HashMap<String, TenantId>,
    pub(crate) shape: QuotaShape,
    pub(crate) book: QuotaBook,
    pub(crate) jobs: FxHashMap<JobId, Box<Job>>,
    /// Running jobs by estimated end (`Time::MAX` without estimate), each with a copy of its tasks' placements: the
    /// backfill reservation walks this index in order, and reading placements here, most of one task and kept
    /// inline, spares it a lookup of the job, its run and its task list for each release.
    pub(crate) running_by_end: BTreeMap<(Time, JobId), RunningTasks>,
    /// Compact rows of running jobs, scanned when looking for preemption victims: `[0]` within guarantee (or
    /// without quota), `[1]` borrowed.
    pub(crate) run_rows: [Vec<RunRow>; 2],
    pub(crate) run_row_of: FxHashMap<JobId, (usize, usize)>,
    /// Running jobs per priority.
    pub(crate) prio_counts: std::collections::BTreeMap<i32, u32>,
    /// Running jobs by tenant, priority and start: a job its own quota holds can only evict its tenant's
    /// lower-priority jobs past their minimum run time, which this tells without a scan of every running job.
    /// Each with its row's place in `run_rows` (as `run_row_of` has it) and what of the row a quota-held search
    /// looks at first ([`RunBrief`]), so that it reads no other index, and the row itself only when the brief does
    /// not settle it.
    pub(crate) tenant_runs: crate::chunked::ChunkedMap<(TenantId, i32, Time, JobId), RunBrief>,
    /// Running jobs whose eviction is under way.
    pub(crate) evicting: BTreeSet<JobId>,
    /// Running elastic jobs.
    pub(crate) running_elastic: BTreeSet<JobId>,
    /// Queued jobs that evictions were made for: they get the first claim on what is freed.
    pub(crate) preempting_for: BTreeSet<JobId>,
    /// Jobs being moved off a node for defragmentation (`PreemptReason::Defragment`), with where they go: while
    /// they stop, each pass keeps that room for them; once their attempt ends they are queued with the first claim
    /// (`preempting_for`) and start there if it is still free (`schedule::preempt::serve_preemptors`). A job leaves
    /// the map when it starts, ends, is cancelled or held.
    pub(crate) moving: BTreeMap<JobId, Placement>,
    /// The jobs those were moved for, with the room they were moved for: kept for them while the moved jobs stop,
    /// and where they start if it is all free. A job leaves the map when it starts, ends, is cancelled or held.
    pub(crate) moving_for: BTreeMap<JobId, Placement>,
    pub(crate) preemption_log: VecDeque<Time>,
    /// Capacity of schedulable nodes, per quota dimension.
    pub(crate) capacity: QVec,
    pub(crate) queued: usize,
    /// Queued jobs whose tasks hold no whole GPU (CPU-only or MIG).
    pub(crate) queued_no_gpu: usize,
    /// Job arrays by id (see [`crate::array`]).
    pub(crate) arrays: std::collections::BTreeMap<JobId, crate::array::ArrayRec>,
    /// Pending jobs waiting for dependencies, in no queue (see [`crate::depend`]).
    pub(crate) dep_waiting: BTreeSet<JobId>,
    /// How many of them each tenant has.
    pub(crate) dep_waiting_per_tenant: FxHashMap<TenantId, usize>,
    /// Held jobs: queued, in no queue, until released (see [`crate::hold`]).
    pub(crate) held: BTreeSet<JobId>,
    /// How many of them each tenant has.
    pub(crate) held_per_tenant: FxHashMap<TenantId, usize>,
    /// The jobs waiting on each job (or array).
    pub(crate) dependents: FxHashMap<JobId, Vec<JobId>>,
    /// Side effects not yet taken by the driver.
    pub(crate) cascades: Vec<crate::depend::Cascade>,
    /// Ended jobs whose dependents and arrays are still to be updated, and whether that work list is being run.
    pub(crate) ended_work: Vec<JobId>,
    pub(crate) ending: bool,
    /// Parked jobs by shape and the shapes' fit decisions (see [`crate::park`]).
    pub(crate) parking: crate::park::Parking,
    /// Jobs whose state changed since [`ClusterState::take_changed`], when a driver asked for them
    /// ([`ClusterState::track_changes`]).
    pub(crate) changed: Option<Vec<JobId>>,
    /// A copy of `free` a scheduling pass starts from instead of copying `free` (see [`PassPool`]).
    pub(crate) pass_pool: PassPool,
}

impl ClusterState {
    /// Records from now on which jobs change state, for [`ClusterState::take_changed`] (a driver that keeps its own
    /// index of jobs by state, such as the server's, asks for it; the simulator does not, and pays nothing).
    pub fn track_changes(&mut self) {
        self.changed.get_or_insert_with(Vec::new);
    }

    /// The jobs whose state changed (started, preempted, restarting, ended; an array when it ended) since the last
    /// call, each possibly more than once. A job added by a driver's own call (a submission, an array element
    /// expanded, a restore) is not reported: the driver knows it.
    pub fn take_changed(&mut self) -> Vec<JobId> {
        self.changed.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub(crate) fn note_changed(&mut self, id: JobId) {
        if let Some(c) = self.changed.as_mut() {
            c.push(id);
        }
    }
}

impl ClusterState {
    /// An empty cluster.
    pub fn new(cfg: SchedConfig) -> Result<ClusterState, CoreError> {
        cfg.validate()?;
        Ok(ClusterState {
            cfg,
            topo: Topology::default(),
            free: Free::default(),
            pass_pool: PassPool::default(),
            node_specs: Vec::new(),
            node_states: Vec::new(),
            node_jobs: Vec::new(),
            node_names: HashMap::new(),
            tenants: Vec::new(),
            merged: BTreeSet::new(),
            queue_shapes: Default::default(),
            tenant_names: HashMap::new(),
            shape: QuotaShape::default(),
            book: QuotaBook::default(),
            jobs: FxHashMap::default(),
            running_by_end: BTreeMap::new(),
            run_rows: [Vec::new(), Vec::new()],
            run_row_of: FxHashMap::default(),
            prio_counts: std::collections::BTreeMap::new(),
            tenant_runs: Default::default(),
            evicting: BTreeSet::new(),
            running_elastic: BTreeSet::new(),
            preempting_for: BTreeSet::new(),
            moving: BTreeMap::new(),
            moving_for: BTreeMap::new(),
            preemption_log: VecDeque::new(),
            capacity: [0; QDIMS],
            queued: 0,
            queued_no_gpu: 0,
            arrays: std::collections::BTreeMap::new(),
            dep_waiting: BTreeSet::new(),
            dep_waiting_per_tenant: FxHashMap::default(),
            held: BTreeSet::new(),
            held_per_tenant: FxHashMap::default(),
            dependents: FxHashMap::default(),
            cascades: Vec::new(),
            ended_work: Vec::new(),
            ending: false,
            parking: Default::default(),
            changed: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Changes the configuration; queues are re-sorted when the policy or LAS thresholds change.
    pub fn set_config(&mut self, cfg: SchedConfig) -> Result<(), CoreError> {
        cfg.validate()?;
        self.cfg = cfg;
        for t in &mut self.tenants {
            t.queue.clear();
            t.parked.clear();
            t.waiting = Default::default();
        }
        self.merged.clear();
        self.queue_shapes = Default::default();
        self.parking = Default::default();
        // The jobs in a queue: queued ones, less the held and those waiting for a dependency (in no queue).
        let keys: Vec<(TenantId, QueueKey)> = self
            .jobs
            .values()
            .filter(|j| j.state.is_queued() && !self.held.contains(&j.id) && !self.dep_waiting.contains(&j.id))
            .map(|j| (j.spec.tenant, queue_key(&self.cfg, j)))
            .collect();
        for (t, k) in keys {
            self.queue_insert(t, k, None);
        }
        Ok(())
    }

    // ----- nodes -----

    /// Registers a node (state Ready).
    pub fn add_node(&mut self, mut spec: NodeSpec) -> Result<NodeId, CoreError> {
        spec.validate()?;
        if self.node_names.contains_key(&spec.name) {
            return Err(CoreError::DuplicateName { kind: "node", name: spec.name });
        }
        let id = NodeId(self.node_specs.len() as u32);
        self.topo.add_node(id, &spec);
        self.free.add_node(&self.topo, id);
        self.pass_pool.drop_copy();
        self.node_names.insert(spec.name.clone(), id);
        self.node_specs.push(spec);
        self.node_states.push(NodeState::Lost);
        self.node_jobs.push(BTreeSet::new());
        self.set_node_state(id, NodeState::Ready, Time::ZERO)?;
        self.unpark_fitting();
        Ok(id)
    }

    /// Sets a node's price per GPU-hour (no scheduling decision depends on it): the server prices a node again when
    /// its agent registers again or the server starts with another catalogue.
    pub fn set_node_price(&mut self, id: NodeId, per_gpu_hour: f64) -> Result<(), CoreError> {
        if !per_gpu_hour.is_finite() || per_gpu_hour < 0.0 {
            return Err(CoreError::InvalidField {
                field: "node.price_per_gpu_hour",
                value: per_gpu_hour.to_string(),
                allowed: "a finite number >= 0".into(),
            });
        }
        let spec = self.node_specs.get_mut(id.index()).ok_or(CoreError::UnknownNode(id))?;
        spec.price_per_gpu_hour = per_gpu_hour;
        Ok(())
    }

    /// Looks a node up by name.
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_names.get(name).copied()
    }

    /// A node.
    pub fn node(&self, id: NodeId) -> Option<NodeView<'_>> {
        let spec = self.node_specs.get(id.index())?;
        let f = &self.free.nodes[id.index()];
        Some(NodeView {
            id,
            spec,
            state: self.node_states[id.index()],
            free_gpu_mask: f.mask,
            free_cpu: f.cpu,
            free_mem: f.mem,
            jobs: &self.node_jobs[id.index()],
        })
    }

    /// All nodes.
    pub fn nodes(&self) -> impl Iterator<Item = NodeView<'_>> {
        (0..self.node_specs.len()).filter_map(|i| self.node(NodeId(i as u32)))
    }

    fn node_capacity(&self, id: NodeId) -> QVec {
        let s = &self.node_specs[id.index()];
        let t = &self.topo.nodes[id.index()];
        let mut v = [0; QDIMS];
        let g = t.gpu_mask.count_ones() as u64;
        v[DIM_GPUS] = g;
        v[DIM_CPU] = s.cpu.0;
        v[DIM_MEM] = s.mem.0;
        if let Some(m) = s.gpu_model() {
            v[dim_model(m)] = g;
        }
        v
    }

    /// Changes a node's state. Draining asks for the end of its jobs' attempts (they resume from their checkpoints);
    /// Lost asks the same and fences their tasks there (see [`crate::lifecycle`]): in both cases their resources stay
    /// allocated until the ends are confirmed. Returns the jobs asked to stop.
    pub fn set_node_state(&mut self, id: NodeId, state: NodeState, now: Time) -> Result<Vec<JobId>, CoreError> {
        let old = *self.node_states.get(id.index()).ok_or(CoreError::UnknownNode(id))?;
        if old == state {
            return Ok(Vec::new());
        }
        let cap = self.node_capacity(id);
        if old == NodeState::Ready {
            for d in 0..QDIMS {
                self.capacity[d] -= cap[d];
            }
        }
        if state == NodeState::Ready {
            for d in 0..QDIMS {
                self.capacity[d] += cap[d];
            }
        }
        self.node_states[id.index()] = state;
        self.free.set_schedulable(&self.topo, id, state == NodeState::Ready);
        self.pass_pool.drop_copy();
        self.refresh_shape();
        let affected: Vec<JobId> = self.node_jobs[id.index()].iter().copied().collect();
        let cause = match state {
            NodeState::Draining => StopCause::Drained,
            NodeState::Lost => StopCause::NodeLost { node: id },
            _ => return Ok(Vec::new()),
        };
        for j in &affected {
            self.request_stop(*j, cause, now)?;
        }
        Ok(affected)
    }

    // ----- tenants -----

    /// Registers a tenant.
    pub fn add_tenant(&mut self, spec: TenantSpec) -> Result<TenantId, CoreError> {
        spec.validate()?;
        if self.tenant_names.contains_key(&spec.name) {
            return Err(CoreError::DuplicateName { kind: "tenant", name: spec.name });
        }
        let id = TenantId(self.tenants.len() as u32);
        self.tenant_names.insert(spec.name.clone(), id);
        self.tenants.push(TenantEntry {
            spec,
            queue: BTreeSet::new(),
            parked: BTreeSet::new(),
            waiting: Default::default(),
            decayed_gpu_ms: 0.0,
            usage_as_of: Time::ZERO,
        });
        self.book.usage.push([0; QDIMS]);
        self.rebuild_quota();
        Ok(id)
    }

    /// Changes a tenant's quota (running work is not evicted; new admissions follow the new quota).
    pub fn set_quota(&mut self, t: TenantId, quota: Option<Quota>) -> Result<(), CoreError> {
        if let Some(q) = &quota {
            q.validate()?;
        }
        self.tenants.get_mut(t.index()).ok_or(CoreError::UnknownTenant(t))?.spec.quota = quota;
        self.rebuild_quota();
        Ok(())
    }

    /// Looks a tenant up by name.
    pub fn tenant_id(&self, name: &str) -> Option<TenantId> {
        self.tenant_names.get(name).copied()
    }

    /// A tenant's spec.
    pub fn tenant(&self, t: TenantId) -> Option<&TenantSpec> {
        self.tenants.get(t.index()).map(|e| &e.spec)
    }

    /// Number of tenants.
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// A tenant's current usage: whole GPUs, CPU, memory.
    pub fn tenant_usage(&self, t: TenantId) -> Resources {
        let u = &self.book.usage[t.index()];
        Resources { gpus: u[DIM_GPUS] as u32, cpu: MilliCpu(u[DIM_CPU]), mem: MiB(u[DIM_MEM]) }
    }

    /// A tenant's decayed historical GPU usage in GPU-seconds at `now` (fair share's measure).
    pub fn tenant_decayed_usage_gpu_s(&self, t: TenantId, now: Time) -> f64 {
        self.decayed_usage(t, now) / 1000.0
    }

    /// A tenant's decayed GPU usage as recorded: GPU-ms as of a time (what a driver stores to keep fair share across
    /// restarts). Call [`ClusterState::accrue_usage`] first for a current value.
    pub fn tenant_usage_record(&self, t: TenantId) -> Option<(f64, Time)> {
        self.tenants.get(t.index()).map(|e| (e.decayed_gpu_ms, e.usage_as_of))
    }

    /// Restores a tenant's recorded decayed usage (at recovery, before its running jobs are restored); it decays
    /// from `as_of` on like any other.
    pub fn restore_tenant_usage(&mut self, t: TenantId, decayed_gpu_ms: f64, as_of: Time) -> Result<(), CoreError> {
        if !decayed_gpu_ms.is_finite() || decayed_gpu_ms < 0.0 {
            return Err(CoreError::InvalidField {
                field: "usage",
                value: decayed_gpu_ms.to_string(),
                allowed: "a finite number of GPU-ms >= 0".into(),
            });
        }
        let e = self.tenants.get_mut(t.index()).ok_or(CoreError::UnknownTenant(t))?;
        e.decayed_gpu_ms = decayed_gpu_ms;
        e.usage_as_of = as_of;
        Ok(())
    }

    pub(crate) fn decayed_usage(&self, t: TenantId, now: Time) -> f64 {
        self.decayed_usage_by(t, self.decay_over(now.since(self.tenants[t.index()].usage_as_of).0))
    }

    /// The factor fair share's usage decays by over `dt_ms`: `2^(−dt/h)` for the half-life `h`.
    fn decay_over(&self, dt_ms: u64) -> f64 {
        (-(dt_ms as f64) / self.cfg.fairshare_half_life.0 as f64).exp2()
    }

    /// A tenant's decayed usage once its record has decayed by `decay` (`decay_over` the time since it was made).
    fn decayed_usage_by(&self, t: TenantId, decay: f64) -> f64 {
        let e = &self.tenants[t.index()];
        let h = self.cfg.fairshare_half_life.0 as f64;
        let a = self.book.usage[t.index()][DIM_GPUS] as f64;
        // Integral of a constant allocation `a` over dt with decay: a·h/ln2·(1 − 2^(−dt/h)).
        e.decayed_gpu_ms * decay + a * h / std::f64::consts::LN_2 * (1.0 - decay)
    }

    fn accrue_tenant(&mut self, t: TenantId, now: Time) {
        let u = self.decayed_usage(t, now);
        let e = &mut self.tenants[t.index()];
        if now > e.usage_as_of {
            e.decayed_gpu_ms = u;
            e.usage_as_of = now;
        }
    }

    /// Brings the decayed usage of every tenant up to `now` (call periodically; fair share reads it).
    pub fn accrue_usage(&mut self, now: Time) {
        // Tenants brought up to the same time decay by the same factor: it is worked out once for them.
        let mut last: Option<(u64, f64)> = None;
        for i in 0..self.tenants.len() {
            let dt = now.since(self.tenants[i].usage_as_of).0;
            let decay = match last {
                Some((d, f)) if d == dt => f,
                _ => {
                    let f = self.decay_over(dt);
                    last = Some((dt, f));
                    f
                }
            };
            let u = self.decayed_usage_by(TenantId(i as u32), decay);
            let e = &mut self.tenants[i];
            if now > e.usage_as_of {
                e.decayed_gpu_ms = u;
                e.usage_as_of = now;
            }
        }
    }

    fn rebuild_quota(&mut self) {
        let mut cohort_names: Vec<String> = Vec::new();
        let mut tenants = Vec::with_capacity(self.tenants.len());
        for t in &self.tenants {
            let c = t.spec.cohort.as_ref().map(|c| match cohort_names.iter().position(|n| n == c) {
                Some(i) => i as u32,
                None => {
                    cohort_names.push(c.clone());
                    (cohort_names.len() - 1) as u32
                }
            });
            tenants.push((t.spec.quota.clone(), c));
        }
        let mut cohorts: Vec<(String, QVec)> = cohort_names.into_iter().map(|n| (n, [0; QDIMS])).collect();
        for (q, c) in &tenants {
            if let (Some(q), Some(c)) = (q, c) {
                let g = q.guarantee_vec();
                for d in 0..QDIMS {
                    cohorts[*c as usize].1[d] += g[d];
                }
            }
        }
        self.shape.tenants = tenants;
        self.shape.cohorts = cohorts;
        self.refresh_shape();
        // Recompute the book from the tenants' usage.
        let usage = std::mem::take(&mut self.book.usage);
        self.book = QuotaBook {
            usage: vec![[0; QDIMS]; usage.len()],
            cohort_usage: vec![[0; QDIMS]; self.shape.cohorts.len()],
            root_borrowed: [0; QDIMS],
        };
        for (i, u) in usage.iter().enumerate() {
            self.book.charge(&self.shape, TenantId(i as u32), u, false);
        }
    }

    fn refresh_shape(&mut self) {
        let mut g = [0u64; QDIMS];
        for (q, _) in &self.shape.tenants {
            if let Some(q) = q {
                let v = q.guarantee_vec();
                for d in 0..QDIMS {
                    g[d] = g[d].saturating_add(v[d]);
                }
            }
        }
        for d in 0..QDIMS {
            self.shape.unguaranteed[d] = self.capacity[d].saturating_sub(g[d]);
        }
    }

    // ----- jobs -----

    /// Submits a job at `now`. A job with dependencies waits for them outside the queues (see [`crate::depend`]); an
    /// array (`spec.array`) takes the ids after `id` for its elements (see [`crate::array`]).
    pub fn submit(&mut self, id: JobId, mut spec: JobSpec, now: Time) -> Result<(), CoreError> {
        spec.validate()?;
        if spec.tenant.index() >= self.tenants.len() {
            return Err(CoreError::UnknownTenant(spec.tenant));
        }
        if self.jobs.contains_key(&id) || self.arrays.contains_key(&id) || self.element_slot(id).is_some() {
            return Err(CoreError::DuplicateJob(id));
        }
        self.resolve_new_deps(id, &mut spec)?;
        spec.probe_ms = self.cfg.probe_for(&spec);
        if spec.array.is_some() {
            return self.submit_array(id, spec, now);
        }
        let job = Job::new(id, spec, now);
        self.jobs.insert(id, Box::new(job));
        self.queue_or_wait(id, now);
        Ok(())
    }

    pub(crate) fn enqueue(&mut self, job: &Job) {
        let k = queue_key(&self.cfg, job);
        self.queue_insert(job.spec.tenant, k, Some(&job.spec));
        self.queued += 1;
        if job.spec.task.gpus == 0 {
            self.queued_no_gpu += 1;
        }
    }

    pub(crate) fn dequeue(&mut self, job: &Job) {
        let k = queue_probe(&self.cfg, job);
        self.dequeue_key(job.spec.tenant, k, job.spec.task.gpus == 0);
    }

    fn dequeue_key(&mut self, tenant: TenantId, k: QueueKey, no_gpu: bool) {
        let removed = self.queue_remove(tenant, &k);
        debug_assert!(removed, "queued job missing from its queue");
        self.queued -= 1;
        if no_gpu {
            self.queued_no_gpu -= 1;
        }
    }

    /// A job.
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id).map(|j| &**j)
    }

    /// All jobs, in no particular order.
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values().map(|j| &**j)
    }

    /// Jobs waiting in queues.
    pub fn queued_count(&self) -> usize {
        self.queued
    }

    /// GPUs tenant `t` may still take under its quota's limit (borrowing included); `None`: no GPU limit.
    pub fn tenant_gpu_room(&self, t: TenantId) -> Option<u64> {
        let (quota, _) = self.shape.tenants.get(t.index())?;
        let lim = quota.as_ref()?.dims[crate::tenant::DIM_GPUS].as_ref()?;
        let used = self.book.usage.get(t.index()).map_or(0, |u| u[crate::tenant::DIM_GPUS]);
        Some(lim.limit.saturating_sub(used))
    }

    /// The jobs in the queues (pending, preempted, restarting; not held, not waiting for a dependency).
    pub fn waiting_jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs
            .values()
            .filter(|j| j.state.is_queued() && !self.held.contains(&j.id) && !self.dep_waiting.contains(&j.id))
            .map(|j| &**j)
    }

    /// A tenant's queued jobs, in O(1): in its queue (pending, preempted, restarting), waiting for dependencies or
    /// held (what its queued-job limit counts).
    pub fn tenant_queued_count(&self, tenant: TenantId) -> usize {
        self.tenant_waiting(tenant).jobs + self.tenant_dependency_waiting(tenant) + self.tenant_held(tenant)
    }

    /// What a tenant's queue holds (pending, preempted and restarting jobs; not held ones, nor those waiting for a
    /// dependency), without walking it: the figures `/metrics` shows for each tenant at every scrape, whatever the depth.
    pub fn tenant_waiting(&self, tenant: TenantId) -> TenantWaiting {
        self.tenants.get(tenant.index()).map_or_else(TenantWaiting::default, |t| TenantWaiting {
            jobs: t.queue.len() + t.parked.len(),
            gpus: t.waiting.gpus(),
            oldest_submitted: t.waiting.oldest(),
        })
    }

    /// Running jobs.
    pub fn running_count(&self) -> usize {
        self.running_by_end.len()
    }

    /// Total whole GPUs on schedulable nodes.
    pub fn capacity_gpus(&self) -> u64 {
        self.capacity[DIM_GPUS]
    }

    /// Total whole GPUs held by running jobs.
    pub fn allocated_gpus(&self) -> u64 {
        self.book.usage.iter().map(|u| u[DIM_GPUS]).sum()
    }

    pub(crate) fn placement_qvec(&self, spec: &JobSpec, p: &Placement) -> QVec {
        let mut v = [0u64; QDIMS];
        for t in &p.tasks {
            let g = t.gpu_mask.count_ones() as u64;
            v[DIM_GPUS] += g;
            v[DIM_CPU] += t.cpu.0;
            v[DIM_MEM] += t.mem.0;
            if let Some(m) = self.node_specs[t.node.index()].gpu_model() {
                v[dim_model(m)] += g;
            }
        }
        let _ = spec;
        v
    }

    /// Whether tenant `t` runs a job of priority below `below` that started at or before `cutoff` (a possible
    /// victim for its own quota-held job): one range step per priority level, not a scan.
    pub(crate) fn runs_older_lower_priority(&self, t: TenantId, below: i32, cutoff: Time) -> bool {
        let mut from = (t, i32::MIN, Time(0), JobId(0));
        while let Some((&(tt, p, started, _), _)) = self.tenant_runs.range_from(&from).next() {
            if tt != t || p >= below {
                return false;
            }
            if started <= cutoff {
                return true;
            }
            // Every job of priority `p` started after the cutoff: the next level.
            match p.checked_add(1) {
                Some(next) => from = (t, next, Time(0), JobId(0)),
                None => return false,
            }
        }
        false
    }

    /// When a running attempt is expected to end, seen at `now`: its estimated end `est_end`, or, once past it, as
    /// long again as it has run since `started` (at least a millisecond more). Victim choice under preemptive
    /// SRTF/SRGF and the ETA replay both expect this of an overrun.
    pub(crate) fn expected_end(est_end: Time, started: Time, now: Time) -> Time {
        if est_end > now {
            est_end
        } else {
            now + crate::units::Dur(now.since(started).0.max(1))
        }
    }

    /// Estimated end of a job started at `start`. Without an estimate a job is expected to end only when it has a
    /// probe (`JobSpec::ranked`): at the probe's end, and past it as long again as it is known to run.
    pub(crate) fn est_end(job: &Job, start: Time) -> Time {
        if job.spec.ranked() {
            start + job.remaining_estimate()
        } else {
            Time::MAX
        }
    }

    /// Applies a scheduling decision with stops confirmed at once: a preempted victim releases its resources in the
    /// same step (the instant-stop model that unit tests and the ETA replay use). Drivers use
    /// [`ClusterState::apply_decision`], which keeps a victim's resources until its end is confirmed.
    pub fn apply(&mut self, d: &Decision, now: Time) -> Result<(), CoreError> {
        match d {
            Decision::Start { job, placement, borrowed } => self.start(*job, placement.clone(), *borrowed, now),
            Decision::Preempt { job, for_job, reason } => {
                self.request_stop(*job, StopCause::Preempted { for_job: Some(*for_job) }, now)?;
                self.note_moving(*job, *for_job, reason);
                self.end_attempt(*job, now)?;
                self.note_preemption_for(*for_job);
                Ok(())
            }
            Decision::Reserve { .. } => Ok(()),
            Decision::Scale { job, add } => {
                let j = self.jobs.get(job).ok_or(CoreError::UnknownJob(*job))?;
                if j.state != JobState::Running {
                    return Err(CoreError::InvalidPlacement {
                        job: *job,
                        reason: "scale of a job that is not running".into(),
                    });
                }
                for t in add {
                    self.free
                        .can_take(&self.topo, t)
                        .map_err(|reason| CoreError::InvalidPlacement { job: *job, reason })?;
                }
                let spec = j.spec.clone();
                let extra = Placement { tasks: add.clone() };
                let q = self.placement_qvec(&spec, &extra);
                for t in add {
                    self.take_task(t);
                    self.node_jobs[t.node.index()].insert(*job);
                }
                self.accrue_tenant(spec.tenant, now);
                self.book.charge(&self.shape, spec.tenant, &q, false);
                let j = self.jobs.get_mut(job).expect("checked above");
                let key = (Self::est_end(j, j.run.as_ref().expect("running job has a run").started), *job);
                j.run.as_mut().expect("running job has a run").placement.tasks.extend(add.iter().cloned());
                let index = self.running_by_end.get_mut(&key).expect("a running job is in the running index");
                index.extend(add.iter().cloned());
                // Its row and brief take its GPUs, classes and node again (victim searches read them).
                let summary =
                    placement_summary(&self.topo, &self.jobs[job].run.as_ref().expect("running").placement.tasks);
                if let Some(&(part, i)) = self.run_row_of.get(job) {
                    let row = &mut self.run_rows[part][i];
                    (row.gpus, row.classes, row.node) = summary;
                    let row = *row;
                    if let Some(b) = self.tenant_runs.get_mut(&row.tenant_key()) {
                        *b = RunBrief::of(&row, (part, i));
                    }
                }
                Ok(())
            }
        }
    }

    /// Runs one scheduling pass at `now` and applies all its decisions with stops confirmed at once (see
    /// [`ClusterState::apply`]). Returns the decisions.
    pub fn step(&mut self, now: Time) -> Result<Vec<Decision>, CoreError> {
        let decisions = crate::schedule::schedule(self, now);
        for d in &decisions {
            self.apply(d, now)?;
        }
        Ok(decisions)
    }

    /// Starts a queued job on a placement.
    pub fn start(&mut self, id: JobId, placement: Placement, borrowed: bool, now: Time) -> Result<(), CoreError> {
        let job = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?;
        if !job.state.can_become(JobState::Running) || self.dep_waiting.contains(&id) || self.held.contains(&id) {
            return Err(CoreError::InvalidTransition { job: id, from: job.state, to: JobState::Running });
        }
        self.validate_placement(job, &placement)?;
        let key = queue_probe(&self.cfg, job);
        let (tenant, no_gpu) = (job.spec.tenant, job.spec.task.gpus == 0);
        self.dequeue_key(tenant, key, no_gpu);
        self.forget_claims(id);
        let j = self.jobs.get_mut(&id).expect("looked up above");
        j.transition(JobState::Running)?;
        let array = j.array_of.map(|(a, _)| a);
        self.note_changed(id);
        self.occupy(
            id,
            RunInfo {
                started: now,
                placement,
                borrowed,
                last_checkpoint: None,
                evicting: false,
                stop: None,
                ended: Vec::new(),
                all_ok: true,
            },
            now,
        );
        if let Some(a) = array {
            self.element_started(a, id, now);
        }
        Ok(())
    }

    /// Takes a task's resources from the pool, and from the passes' copy of it ([`PassPool`]).
    fn take_task(&mut self, t: &crate::job::TaskPlacement) {
        self.free.take(&self.topo, t);
        self.pass_pool.apply(|c| c.take(&self.topo, t));
    }

    /// Gives a task's resources back to the pool, and to the passes' copy of it ([`PassPool`]).
    fn give_task(&mut self, t: &crate::job::TaskPlacement) {
        self.free.give(&self.topo, t);
        self.pass_pool.apply(|c| c.give(&self.topo, t));
    }

    /// Takes a running job's resources and indexes it (the job is already in state Running).
    fn occupy(&mut self, id: JobId, run: RunInfo, now: Time) {
        let j = self.jobs.get(&id).expect("caller inserted the job");
        let tenant = j.spec.tenant;
        let q = self.placement_qvec(&j.spec, &run.placement);
        for t in &run.placement.tasks {
            self.take_task(t);
            self.node_jobs[t.node.index()].insert(id);
        }
        self.accrue_tenant(tenant, now);
        self.book.charge(&self.shape, tenant, &q, false);
        let j = self.jobs.get_mut(&id).expect("caller inserted the job");
        let started = run.started;
        let borrowed = run.borrowed;
        let last_ckpt = run.last_checkpoint.unwrap_or(Time::MAX);
        j.run = Some(Box::new(run));
        let end = Self::est_end(j, started);
        self.running_by_end
            .insert((end, id), j.run.as_ref().expect("just set").placement.tasks.iter().cloned().collect());
        if j.spec.elastic.is_some() {
            self.running_elastic.insert(id);
        }
        let (gpus, classes, node) = placement_summary(&self.topo, &j.run.as_ref().expect("just set").placement.tasks);
        let row = RunRow {
            id,
            tenant: j.spec.tenant,
            priority: j.spec.priority,
            started,
            borrowed,
            preemptible: j.spec.preemptible,
            evicting: false,
            gpus,
            ckpt_interval: j.spec.checkpoint_interval.map_or(0, |d| d.0),
            last_ckpt,
            attained_before: j.attained_gpu_ms,
            est_end: end,
            sjf_key: sjf_key(j),
            // An attempt started within the job's probe is ranked as one that ends at the probe's end (its
            // estimated end), not by the learned distribution.
            learned: j
                .spec
                .estimated_duration
                .zip(j.spec.estimate_spread)
                .filter(|_| !j.probing())
                .map(|(e, sigma)| crate::gittins::LogNormal::new(e, sigma as f64)),
            progress: j.progress.0,
            known: j.known.0,
            classes,
            node,
        };
        let part = borrowed as usize;
        let place = (part, self.run_rows[part].len());
        self.run_row_of.insert(id, place);
        self.run_rows[part].push(row);
        *self.prio_counts.entry(row.priority).or_default() += 1;
        self.tenant_runs.insert(row.tenant_key(), RunBrief::of(&row, place));
    }

    /// Restores a job exactly as it was, for recovery after a restart: a queued job goes back to its queue, a
    /// running job takes its placement again (its GPUs must still be free; its nodes may be cordoned or draining),
    /// a finished job is kept for the record.
    pub fn restore(&mut self, mut job: Job, now: Time) -> Result<(), CoreError> {
        job.spec.validate()?;
        if job.spec.tenant.index() >= self.tenants.len() {
            return Err(CoreError::UnknownTenant(job.spec.tenant));
        }
        if self.jobs.contains_key(&job.id) {
            return Err(CoreError::DuplicateJob(job.id));
        }
        let id = job.id;
        if job.spec.array.is_some() {
            // An array's own record: its elements are restored after it.
            if self.arrays.contains_key(&id) {
                return Err(CoreError::DuplicateJob(id));
            }
            self.restore_array(&job);
            return Ok(());
        }
        // A running job's placement is checked before anything changes: a refused one is restored again as waiting
        // (the server does so), and an array's element must not count in its array twice.
        if job.state == JobState::Running {
            let run = job.run.as_ref().ok_or_else(|| CoreError::InvalidPlacement {
                job: id,
                reason: "a running job without a placement".into(),
            })?;
            for (seen, t) in run.placement.tasks.iter().enumerate() {
                self.free.can_take(&self.topo, t).map_err(|reason| CoreError::InvalidPlacement { job: id, reason })?;
                // Tasks of one job on one node must not overlap either.
                if run.placement.tasks[..seen].iter().any(|o| o.node == t.node && o.gpu_mask & t.gpu_mask != 0) {
                    return Err(CoreError::InvalidPlacement { job: id, reason: "two tasks share a GPU".into() });
                }
            }
        }
        if job.array_of.is_some() {
            self.restore_element(&job)?;
        }
        if job.state.is_queued() {
            job.run = None;
            let waits = job.state == JobState::Pending && !job.spec.dependencies.is_empty();
            let held = job.held;
            self.jobs.insert(id, Box::new(job.clone()));
            if held {
                self.hold_insert(id);
            } else if waits {
                self.restore_waiting(id);
            } else {
                self.enqueue(&job);
            }
        } else if job.state == JobState::Running {
            let run = job.run.take().expect("checked above");
            let stopping = run.stop.is_some();
            self.jobs.insert(id, Box::new(job));
            self.occupy(id, *run, now);
            if stopping {
                self.begin_eviction(id)?;
            }
        } else {
            job.run = None;
            self.jobs.insert(id, Box::new(job));
        }
        Ok(())
    }

    fn validate_placement(&self, job: &Job, p: &Placement) -> Result<(), CoreError> {
        let err = |reason: String| CoreError::InvalidPlacement { job: job.id, reason };
        let spec = &job.spec;
        let n = p.tasks.len() as u32;
        let (min, max) = spec.elastic.map_or((spec.tasks, spec.tasks), |e| (e.min_tasks, e.max_tasks));
        if n < min || n > max {
            return Err(err(format!("{n} tasks placed, the job needs {min} to {max}")));
        }
        let mut models: smallvec::SmallVec<[Option<GpuModel>; 2]> = smallvec::SmallVec::new();
        let mut seen: smallvec::SmallVec<[(NodeId, (u64, u64)); 4]> = smallvec::SmallVec::new();
        for t in &p.tasks {
            self.free.can_take(&self.topo, t).map_err(err)?;
            if self.node_states.get(t.node.index()) != Some(&NodeState::Ready) {
                return Err(err(format!("{} is not ready", t.node)));
            }
            if t.gpu_mask.count_ones() != spec.task.gpus || t.cpu != spec.task.cpu || t.mem != spec.task.mem {
                return Err(err(format!("a task on {} does not hold what the task spec asks", t.node)));
            }
            if spec.task.mig.is_some() != t.mig_slot.is_some() {
                return Err(err("MIG slot mismatch".into()));
            }
            let i = match seen.iter().position(|(n, _)| *n == t.node) {
                Some(i) => i,
                None => {
                    seen.push((t.node, (0, 0)));
                    seen.len() - 1
                }
            };
            let e = &mut seen[i].1;
            if e.0 & t.gpu_mask != 0 || t.mig_slot.is_some_and(|s| e.1 & (1 << s) != 0) {
                return Err(err(format!("two tasks share a GPU on {}", t.node)));
            }
            e.0 |= t.gpu_mask;
            if let Some(s) = t.mig_slot {
                e.1 |= 1 << s;
            }
            if !spec.node_eligible(&self.node_specs[t.node.index()]) {
                return Err(err(format!("{} does not match the job's selector, tolerations or models", t.node)));
            }
            let m = self.node_specs[t.node.index()].gpu_model();
            if !models.contains(&m) {
                models.push(m);
            }
        }
        let total_cpu: u64 = p.tasks.iter().map(|t| t.cpu.0).sum();
        let _ = total_cpu;
        for (node, (mask, _)) in &seen {
            let f = &self.free.nodes[node.index()];
            if mask & !f.mask != 0 {
                return Err(err(format!("GPUs of {node} are not free")));
            }
            let cpu: u64 = p.tasks.iter().filter(|t| t.node == *node).map(|t| t.cpu.0).sum();
            let mem: u64 = p.tasks.iter().filter(|t| t.node == *node).map(|t| t.mem.0).sum();
            if cpu > f.cpu.0 || mem > f.mem.0 {
                return Err(err(format!("{node} lacks CPU or memory for the tasks placed on it")));
            }
        }
        if spec.task.gpus > 0 && models.len() > 1 && !spec.allow_mixed_models {
            return Err(err("the gang spans GPU models and the job does not allow it".into()));
        }
        if !self.scope_met(spec.topology, p) {
            return Err(err(format!("tasks are not within {}", spec.topology)));
        }
        Ok(())
    }

    /// Whether a placement satisfies a topology scope.
    pub fn scope_met(&self, scope: TopologyScope, p: &Placement) -> bool {
        let Some(first) = p.tasks.first() else {
            return true;
        };
        let s0 = &self.node_specs[first.node.index()];
        match scope {
            TopologyScope::Any => true,
            TopologyScope::Zone => p.tasks.iter().all(|t| self.node_specs[t.node.index()].zone() == s0.zone()),
            TopologyScope::Rack => p.tasks.iter().all(|t| {
                let s = &self.node_specs[t.node.index()];
                s.zone() == s0.zone() && s.rack() == s0.rack()
            }),
            TopologyScope::Node => p.tasks.iter().all(|t| t.node == first.node),
            TopologyScope::NvLink => {
                if !p.tasks.iter().all(|t| t.node == first.node) {
                    return false;
                }
                let all: u64 = p.tasks.iter().fold(0, |a, t| a | t.gpu_mask);
                all == 0 || self.topo.nodes[first.node.index()].domains.iter().any(|d| all & !d == 0)
            }
        }
    }

    pub(crate) fn release(&mut self, id: JobId, now: Time) -> Result<Job, CoreError> {
        let job = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?.clone();
        let run = job.run.as_ref().ok_or(CoreError::InvalidTransition {
            job: id,
            from: job.state,
            to: JobState::Preempted,
        })?;
        let q = self.placement_qvec(&job.spec, &run.placement);
        for t in &run.placement.tasks {
            self.give_task(t);
            self.node_jobs[t.node.index()].remove(&id);
        }
        self.accrue_tenant(job.spec.tenant, now);
        self.book.charge(&self.shape, job.spec.tenant, &q, true);
        self.running_by_end.remove(&(Self::est_end(&job, run.started), id));
        if let Some((part, i)) = self.run_row_of.remove(&id) {
            let row = self.run_rows[part].swap_remove(i);
            if let Some(moved) = self.run_rows[part].get(i) {
                self.run_row_of.insert(moved.id, (part, i));
                if let Some(b) = self.tenant_runs.get_mut(&moved.tenant_key()) {
                    b.set_place((part, i));
                }
            }
            if let Some(c) = self.prio_counts.get_mut(&row.priority) {
                *c -= 1;
                if *c == 0 {
                    self.prio_counts.remove(&row.priority);
                }
            }
            self.tenant_runs.remove(&row.tenant_key());
        }
        self.evicting.remove(&id);
        self.running_elastic.remove(&id);
        let j = self.jobs.get_mut(&id).expect("looked up above");
        j.attained_gpu_ms = j.attained_at(now);
        Ok(*job)
    }

    /// A running job's attempt ended with every rank gone at once: `success` means every rank exited 0 (a stopping
    /// job ends according to why it was stopped). A failure with restarts left goes to Restarting (after a backoff,
    /// from its last checkpoint), otherwise to Failed. Returns the new state. See [`crate::lifecycle`].
    pub fn finish(&mut self, id: JobId, now: Time, success: bool) -> Result<JobState, CoreError> {
        let j = self.jobs.get_mut(&id).ok_or(CoreError::UnknownJob(id))?;
        match j.run.as_mut().filter(|_| j.state == JobState::Running) {
            Some(r) => {
                r.all_ok &= success;
                r.ended = (0..r.placement.tasks.len() as u32).collect();
            }
            None => {
                let to = if success { JobState::Succeeded } else { JobState::Failed };
                return Err(CoreError::InvalidTransition { job: id, from: j.state, to });
            }
        }
        Ok(self.end_attempt(id, now)?.state)
    }

    /// Releases an ended attempt and finishes the job: Succeeded, or after a failure Restarting (restarts left) or
    /// Failed.
    pub(crate) fn finish_released(&mut self, id: JobId, now: Time, success: bool) -> Result<JobState, CoreError> {
        let old = self.release(id, now)?;
        let restartable = !success && old.restarts < old.spec.max_restarts;
        let j = self.jobs.get_mut(&id).expect("released above");
        if success {
            j.transition(JobState::Succeeded)?;
            j.finished = Some(now);
            j.run = None;
            self.job_ended(id, now);
        } else if restartable {
            let ck = j.last_checkpoint_at(now).unwrap_or(now);
            let started = j.run.as_ref().map_or(now, |r| r.started);
            j.note_run(started, now);
            j.progress = j.progress + ck.since(started);
            j.transition(JobState::Restarting)?;
            j.restarts += 1;
            j.not_before = now + self.cfg.backoff(j.restarts);
            j.run = None;
            let j = j.clone();
            self.note_changed(id);
            self.enqueue(&j);
        } else {
            j.transition(JobState::Failed)?;
            j.finished = Some(now);
            j.run = None;
            self.job_ended(id, now);
        }
        Ok(self.jobs[&id].state)
    }

    /// Releases an ended attempt and queues the job again as Preempted, keeping its work up to the last checkpoint;
    /// `lost` counts the attempt as lost with its node rather than as a preemption. Neither counts as a restart.
    pub(crate) fn requeue_released(&mut self, id: JobId, now: Time, lost: bool) -> Result<JobState, CoreError> {
        self.release(id, now)?;
        let j = self.jobs.get_mut(&id).expect("released above");
        let ck = j.last_checkpoint_at(now).unwrap_or(now);
        let started = j.run.as_ref().map_or(now, |r| r.started);
        j.note_run(started, now);
        j.progress = j.progress + ck.since(started);
        j.transition(JobState::Preempted)?;
        if lost {
            j.losses += 1;
        } else {
            j.preemptions += 1;
        }
        j.run = None;
        let j = j.clone();
        self.note_changed(id);
        self.enqueue(&j);
        Ok(JobState::Preempted)
    }

    /// Counts an eviction in the preemption rate limit's window.
    pub(crate) fn note_preemption(&mut self, now: Time) {
        self.preemption_log.push_back(now);
        let horizon = now - self.cfg.preemption.interval;
        while self.preemption_log.front().is_some_and(|t| *t < horizon) {
            self.preemption_log.pop_front();
        }
    }

    /// A queued job starts, is cancelled or held: it has no claim left on room being made (`preempting_for`), nor a
    /// room or a destination kept for it (`moving_for`, `moving`).
    pub(crate) fn forget_claims(&mut self, id: JobId) {
        self.preempting_for.remove(&id);
        self.moving.remove(&id);
        self.moving_for.remove(&id);
    }

    /// Records that evictions are made for a queued job, so that it has the first claim on what they free.
    pub fn note_preemption_for(&mut self, job: JobId) {
        if self.jobs.get(&job).is_some_and(|j| j.state.is_queued()) {
            self.preempting_for.insert(job);
        }
    }

    /// Marks a running job as being evicted (its processes are being stopped); it is not picked as a victim again.
    pub fn begin_eviction(&mut self, id: JobId) -> Result<(), CoreError> {
        let j = self.jobs.get_mut(&id).ok_or(CoreError::UnknownJob(id))?;
        match j.run.as_mut() {
            Some(r) => {
                r.evicting = true;
                self.evicting.insert(id);
                if let Some(&(p, i)) = self.run_row_of.get(&id) {
                    let row = &mut self.run_rows[p][i];
                    row.evicting = true;
                    if let Some(b) = self.tenant_runs.get_mut(&row.tenant_key()) {
                        b.evicting = true;
                    }
                }
                Ok(())
            }
            None => Err(CoreError::InvalidTransition { job: id, from: j.state, to: JobState::Preempted }),
        }
    }

    /// Evicts a running job with its stop confirmed at once: resources are freed, work since its last checkpoint is
    /// lost, and it waits in the queue as Preempted.
    pub fn evict(&mut self, id: JobId, now: Time) -> Result<(), CoreError> {
        self.request_stop(id, StopCause::Preempted { for_job: None }, now)?;
        self.end_attempt(id, now)?;
        Ok(())
    }

    /// Cancels a queued job, or a running one with its stop confirmed at once (drivers ask for a running job's end
    /// with [`ClusterState::request_stop`] and release on confirmation).
    pub fn cancel(&mut self, id: JobId, now: Time) -> Result<(), CoreError> {
        let job = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?.clone();
        if !job.state.can_become(JobState::Cancelled) {
            return Err(CoreError::InvalidTransition { job: id, from: job.state, to: JobState::Cancelled });
        }
        if job.state == JobState::Running {
            self.request_stop(id, StopCause::Cancelled, now)?;
            self.end_attempt(id, now)?;
            return Ok(());
        }
        if !self.dep_wait_remove(id) && !self.held_remove(id) {
            self.dequeue(&job);
        }
        self.forget_claims(id);
        let j = self.jobs.get_mut(&id).expect("looked up above");
        j.transition(JobState::Cancelled)?;
        j.run = None;
        j.held = false;
        j.finished = Some(now);
        self.job_ended(id, now);
        Ok(())
    }

    /// Records a checkpoint of a running job taken at `at`.
    pub fn record_checkpoint(&mut self, id: JobId, at: Time) -> Result<(), CoreError> {
        let j = self.jobs.get_mut(&id).ok_or(CoreError::UnknownJob(id))?;
        match j.run.as_mut() {
            Some(r) => {
                r.last_checkpoint = Some(at.max(r.started));
                if let Some(&(p, i)) = self.run_row_of.get(&id) {
                    let row = &mut self.run_rows[p][i];
                    row.last_ckpt = r.last_checkpoint.unwrap_or(Time::MAX);
                    if let Some(b) = self.tenant_runs.get_mut(&row.tenant_key()) {
                        b.last_ckpt = row.last_ckpt;
                    }
                }
                Ok(())
            }
            None => Err(CoreError::InvalidField {
                field: "checkpoint",
                value: id.to_string(),
                allowed: "a checkpoint of a running job".into(),
            }),
        }
    }

    /// Drops terminal jobs that finished before `before` (the driver keeps its own history), and ended arrays whose
    /// elements are all dropped.
    pub fn forget_finished(&mut self, before: Time) {
        self.jobs.retain(|_, j| !(j.state.is_terminal() && j.finished.is_some_and(|f| f < before)));
        let jobs = &self.jobs;
        self.arrays.retain(|a, r| {
            !(r.finished.is_some_and(|f| f < before)
                && (0..r.len() as u64).all(|k| !jobs.contains_key(&JobId(a.0 + 1 + k))))
        });
    }

    /// Evictions in the current rate-limit window ending at `now`.
    pub(crate) fn recent_preemptions(&self, now: Time) -> u32 {
        let horizon = now - self.cfg.preemption.interval;
        self.preemption_log.iter().filter(|t| **t >= horizon).count() as u32
    }

    /// When [`Self::recent_preemptions`] seen from `now` first falls as time passes alone: the earliest eviction in
    /// the window leaves it (`None`: the window holds none). The log is in time order.
    pub(crate) fn preemption_window_turns(&self, now: Time) -> Option<Time> {
        let iv = self.cfg.preemption.interval;
        self.preemption_log.iter().find(|t| **t >= now - iv).map(|t| *t + iv + crate::units::Dur(1))
    }

    /// Policy in force.
    pub fn policy(&self) -> Policy {
        self.cfg.policy
    }

    /// The estimated end times of running jobs (for ETA predictions).
    pub fn running_ends(&self) -> impl Iterator<Item = (Time, JobId)> + '_ {
        self.running_by_end.keys().copied()
    }
}

/// What a running job's row keeps of its placement: its whole GPUs, a bit per node class its tasks touch (all bits
/// for a class index of 64 or more), and its node when every task is on one.
pub(crate) fn placement_summary(topo: &Topology, tasks: &[crate::job::TaskPlacement]) -> (u32, u64, Option<NodeId>) {
    let mut classes = 0u64;
    for t in tasks {
        let c = topo.nodes[t.node.index()].class;
        classes |= if c < 64 { 1u64 << c } else { u64::MAX };
    }
    let node = tasks.first().map(|t| t.node).filter(|n| tasks.iter().all(|t| t.node == *n));
    (tasks.iter().map(|t| t.gpu_mask.count_ones()).sum(), classes, node)
}
