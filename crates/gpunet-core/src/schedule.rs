//! One scheduling pass: `schedule(&state, now) -> decisions`, pure and deterministic.
//!
//! The pass walks queued jobs in policy order and, for each:
//! 1. skips it while a restart backoff runs;
//! 2. checks its tenant's quota (a quota-held job does not block others: it is not eligible, like a job held by a
//!    Slurm QOS limit or a Kueue ClusterQueue without quota);
//! 3. skips it if it can never fit (no node class could ever hold it);
//! 4. places it (best fit, gang all-or-nothing, topology, one GPU model per gang).
//!
//! The first job that does not fit for capacity is the *head*: the scheduler may preempt for it (quota reclaim,
//! priority, LAS demotion); without backfill it blocks every job behind it. With backfill (EASY) the head gets a
//! reservation: the earliest estimated time its placement becomes free (from running jobs' estimated ends) and the
//! GPUs it will take; later jobs start only if they end before that time or keep off the reserved resources.
//! When every queued job has been placed, elastic jobs grow towards their maximum.

use crate::alloc::{Free, Hold, Holdback, Request};
use crate::config::Policy;
use crate::error::CoreError;
use crate::fxhash::{FxHashMap, FxHashSet, FxHasher};
use crate::gpu::GpuModel;
use crate::ids::{JobId, NodeId, TenantId};
use crate::job::{Job, JobSpec, JobState, Placement, TaskPlacement, TopologyScope};
use crate::node::labels;
use crate::quota::{job_qvec, Deny, QuotaBlock, QuotaBook};
use crate::state::{ClusterState, QueueKey};
use crate::tenant::{DIM_CPU, DIM_GPUS, DIM_MEM};
use crate::units::{MiB, MilliCpu, Time};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::hash::{Hash, Hasher};
use std::iter::Peekable;
use std::rc::Rc;

/// Why a job is evicted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreemptReason {
    /// The owner of a guarantee needs it back from a borrower.
    QuotaReclaim {
        /// Tenant reclaiming.
        owner: TenantId,
    },
    /// A higher-priority job needs the resources.
    Priority {
        /// Victim's priority.
        victim: i32,
        /// Preemptor's priority.
        preemptor: i32,
    },
    /// LAS: the victim was demoted to a lower queue than a waiting job's.
    LasDemotion {
        /// Victim's queue.
        victim_queue: usize,
        /// Waiting job's queue.
        waiting_queue: usize,
    },
}

/// What the driver should do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decision {
    /// Start a job on this placement.
    Start {
        /// Job.
        job: JobId,
        /// Where.
        placement: Placement,
        /// Admitted beyond its tenant's guarantee.
        borrowed: bool,
    },
    /// Evict a running job (it resumes later from its last checkpoint).
    Preempt {
        /// Victim.
        job: JobId,
        /// Why.
        reason: PreemptReason,
        /// The job the room is made for.
        for_job: JobId,
    },
    /// The head job's reservation: where it is expected to start and when (`None`: waiting for evictions now).
    Reserve {
        /// Job.
        job: JobId,
        /// Expected start; `Time::MAX` if unknown.
        at: Time,
        /// Expected placement.
        placement: Placement,
    },
    /// Grow an elastic running job by these tasks.
    Scale {
        /// Job.
        job: JobId,
        /// New tasks.
        add: Vec<TaskPlacement>,
    },
}

/// Why a queued job is not running, with numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingReason {
    /// It would start in the next pass.
    Starting,
    /// Waiting out the backoff before a restart.
    Backoff {
        /// Earliest restart.
        until: Time,
    },
    /// Its tenant's quota holds it.
    Quota {
        /// Tenant name.
        tenant: String,
        /// The dimension that blocks and its numbers.
        block: QuotaBlock,
    },
    /// No node could ever hold it.
    NeverFits {
        /// What is impossible.
        detail: String,
    },
    /// Not enough free resources in the right shape.
    Capacity {
        /// What it needs.
        needs: String,
        /// Largest free block of whole GPUs on one eligible node.
        largest_free_block: u32,
        /// Largest free block inside one NVLink domain.
        largest_free_nvlink: u32,
        /// Free whole GPUs on eligible nodes.
        free_eligible_gpus: u64,
        /// When it is expected to start (its reservation), if known.
        eta: Option<Time>,
        /// Jobs being evicted to make room for it.
        preempting: Vec<JobId>,
    },
    /// It fits, but only on resources reserved for the head job, and it would outlast the reservation.
    Reservation {
        /// Holder of the reservation.
        holder: JobId,
        /// When the holder is expected to start.
        until: Time,
    },
    /// Jobs ahead of it in policy order are waiting and it may not pass them.
    Order {
        /// Queued jobs ahead of it.
        ahead: usize,
        /// Policy.
        policy: Policy,
        /// The first job that does not fit, blocking the rest.
        blocked_by: Option<JobId>,
    },
    /// Not queued at all.
    NotQueued {
        /// Its state.
        state: JobState,
    },
}

/// A pending job's explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Job.
    pub job: JobId,
    /// Structured reason.
    pub reason: PendingReason,
    /// The reason in one sentence with its numbers.
    pub message: String,
    /// Queued jobs ahead of it in policy order.
    pub position: usize,
}

/// Counters of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassStats {
    /// Jobs examined.
    pub considered: usize,
    /// Jobs started.
    pub started: usize,
    /// Jobs started by backfill.
    pub backfilled: usize,
    /// Evictions decided.
    pub preempted: usize,
    /// Placement searches run.
    pub placement_attempts: usize,
    /// Running jobs released (virtually) while computing the backfill reservation.
    pub reservation_releases: usize,
}

/// Runs one scheduling pass and returns its decisions.
pub fn schedule(state: &ClusterState, now: Time) -> Vec<Decision> {
    schedule_with_stats(state, now).0
}

/// Runs one scheduling pass and returns its decisions and counters.
pub fn schedule_with_stats(state: &ClusterState, now: Time) -> (Vec<Decision>, PassStats) {
    let mut p = Pass::new(state, now, None);
    p.run();
    p.stats.placement_attempts = p.attempts.get();
    (p.decisions, p.stats)
}

/// Queued jobs in the order the policy considers them now (at most `limit`). Shares are those of the current
/// allocation; a pass reorders tenants as it places jobs, so under share-ordering policies later positions can move.
pub fn queue_order(state: &ClusterState, now: Time, limit: usize) -> Vec<JobId> {
    let p = Pass::new(state, now, None);
    let mut order = Order::new(state);
    let mut out = Vec::new();
    while out.len() < limit {
        let Some((_, k)) = order.next(|t| p.share(t)) else { break };
        out.push(k.job);
    }
    out
}

/// Explains why a queued job is not running.
pub fn explain(state: &ClusterState, job: JobId, now: Time) -> Result<Explanation, CoreError> {
    let j = state.job(job).ok_or(CoreError::UnknownJob(job))?;
    if !j.state.is_queued() {
        let reason = PendingReason::NotQueued { state: j.state };
        return Ok(Explanation { job, message: format!("{job} is {}, not queued", j.state), reason, position: 0 });
    }
    let mut p = Pass::new(state, now, Some(job));
    p.run();
    let ahead = p.traced_position.unwrap_or_else(|| p.count_ahead(job));
    let reason = match p.outcome.take() {
        Some(r) => r,
        None => PendingReason::Order { ahead, policy: state.cfg.policy, blocked_by: p.blocked_by },
    };
    let message = describe(state, j, &reason);
    Ok(Explanation { job, reason, message, position: ahead })
}

fn describe(state: &ClusterState, j: &Job, r: &PendingReason) -> String {
    let tenant = state.tenant(j.spec.tenant).map_or("?", |t| t.name.as_str());
    match r {
        PendingReason::Starting => format!("{} fits now and starts in the next scheduling pass", j.id),
        PendingReason::Backoff { until } => {
            format!("restart {} of {} waits for its backoff until {until}", j.restarts, j.spec.max_restarts)
        }
        PendingReason::Quota { tenant, block } => format!("quota: {tenant} {block}"),
        PendingReason::NeverFits { detail } => format!("never fits: {detail}"),
        PendingReason::Capacity {
            needs,
            largest_free_block,
            largest_free_nvlink,
            free_eligible_gpus,
            eta,
            preempting,
        } => {
            let mut s = format!(
                "capacity: needs {needs}; largest free block is {largest_free_block} GPUs on one node \
                 ({largest_free_nvlink} in one NVLink domain), {free_eligible_gpus} GPUs free on eligible nodes"
            );
            if !preempting.is_empty() {
                s += &format!("; evicting {} job(s) to make room", preempting.len());
            }
            match eta {
                Some(t) if *t != Time::MAX => s += &format!("; expected to start at {t}"),
                _ => {}
            }
            s
        }
        PendingReason::Reservation { holder, until } => {
            format!("waiting for the reservation of {holder} (expected to start at {until}); this job would outlast it")
        }
        PendingReason::Order { ahead, policy, blocked_by } => match blocked_by {
            Some(b) => format!(
                "order: {ahead} jobs ahead under {policy}; {b} does not fit and blocks the queue (tenant {tenant})"
            ),
            None => format!("order: {ahead} jobs ahead under {policy}"),
        },
        PendingReason::NotQueued { state } => format!("{} is {state}", j.id),
    }
}

fn needs_text(spec: &JobSpec) -> String {
    let models = if spec.gpu_models.is_empty() {
        String::new()
    } else {
        spec.gpu_models.iter().map(|m| m.name()).collect::<Vec<_>>().join("|")
    };
    let per = match spec.task.mig {
        Some(p) => format!("MIG {p}"),
        None if spec.task.gpus == 0 => format!("{} and {}", spec.task.cpu, spec.task.mem),
        None => format!("{}×{}", spec.task.gpus, if models.is_empty() { "GPU".into() } else { models }),
    };
    if spec.tasks > 1 {
        format!("{} tasks of {per} in {}", spec.tasks, spec.topology)
    } else if spec.topology == TopologyScope::NvLink {
        format!("{per} in {}", spec.topology)
    } else {
        per
    }
}

/// Extends `order` to `n` releases, merging running jobs and jobs started in this pass by estimated end; stops at
/// jobs without an estimate.
fn pull_releases<'x>(
    a: &mut std::iter::Peekable<impl Iterator<Item = &'x (Time, JobId)>>,
    b: &mut std::iter::Peekable<std::slice::Iter<'x, (Time, JobId, Placement)>>,
    st: &'x ClusterState,
    order: &mut Vec<(Time, &'x Placement)>,
    n: usize,
) {
    while order.len() < n {
        let take_a = match (a.peek(), b.peek()) {
            (Some((ta, ja)), Some((tb, jb, _))) => (ta, ja) <= (tb, jb),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return,
        };
        let (end, p) = if take_a {
            let (end, id) = a.next().expect("peeked");
            (*end, &st.jobs[id].run.as_ref().expect("running job has a run").placement)
        } else {
            let (end, _, p) = b.next().expect("peeked");
            (*end, p)
        };
        if end == Time::MAX {
            return;
        }
        order.push((end, p));
    }
}

/// Signature, GPUs per task, tasks, topology, CPU, memory, mixed models: what decides whether a job can ever fit.
type ShapeKey = (u64, u32, u32, u32, u64, u64, bool);

/// The reservation of the blocked head job.
#[derive(Debug)]
struct Res {
    head: JobId,
    at: Time,
    hold: Holdback,
    /// When the reservation time is unknown: classes that backfill jobs may not use at all.
    forbid: Vec<u32>,
    placement: Option<Placement>,
}

enum Order<'a> {
    Jobs {
        heap: BinaryHeap<Reverse<(u64, u64, JobId, u32)>>,
        iters: Vec<Peekable<std::collections::btree_set::Iter<'a, QueueKey>>>,
        dropped: Vec<bool>,
    },
    Tenants {
        iters: Vec<Peekable<std::collections::btree_set::Iter<'a, QueueKey>>>,
        dropped: Vec<bool>,
        /// Cached shares; `None` when the tenant's allocation changed since they were computed.
        shares: Vec<Option<f64>>,
    },
}

impl<'a> Order<'a> {
    fn new(st: &'a ClusterState) -> Order<'a> {
        let mut iters: Vec<_> = (0..st.tenants.len()).map(|t| st.tenant_queue(TenantId(t as u32)).peekable()).collect();
        let dropped = vec![false; iters.len()];
        if st.cfg.policy.orders_tenants() {
            let shares = vec![None; iters.len()];
            Order::Tenants { iters, dropped, shares }
        } else {
            let mut heap = BinaryHeap::with_capacity(iters.len());
            for (t, it) in iters.iter_mut().enumerate() {
                if let Some(k) = it.peek() {
                    heap.push(Reverse((k.major, k.minor, k.job, t as u32)));
                }
            }
            Order::Jobs { heap, iters, dropped }
        }
    }

    /// The tenant's allocation changed: its share is recomputed at the next pick.
    fn touch(&mut self, t: TenantId) {
        if let Order::Tenants { shares, .. } = self {
            shares[t.index()] = None;
        }
    }

    fn drop_tenant(&mut self, t: TenantId) {
        match self {
            Order::Jobs { dropped, .. } | Order::Tenants { dropped, .. } => dropped[t.index()] = true,
        }
    }

    fn next(&mut self, share: impl Fn(usize) -> f64) -> Option<(TenantId, QueueKey)> {
        match self {
            Order::Jobs { heap, iters, dropped } => loop {
                let Reverse((_, _, _, t)) = heap.pop()?;
                if dropped[t as usize] {
                    continue;
                }
                let it = &mut iters[t as usize];
                let k = *it.next().expect("the heap holds the head of this queue");
                if let Some(n) = it.peek() {
                    heap.push(Reverse((n.major, n.minor, n.job, t)));
                }
                return Some((TenantId(t), k));
            },
            Order::Tenants { iters, dropped, shares } => {
                let mut best: Option<(f64, usize)> = None;
                for (t, it) in iters.iter_mut().enumerate() {
                    if dropped[t] || it.peek().is_none() {
                        continue;
                    }
                    let s = *shares[t].get_or_insert_with(|| share(t));
                    if best.is_none_or(|(bs, _)| s < bs) {
                        best = Some((s, t));
                    }
                }
                let (_, t) = best?;
                let k = iters[t].next()?;
                Some((TenantId(t as u32), *k))
            }
        }
    }
}

struct Pass<'a> {
    st: &'a ClusterState,
    now: Time,
    free: Free,
    book: QuotaBook,
    elig: FxHashMap<u64, Rc<[u32]>>,
    never: FxHashMap<ShapeKey, Option<String>>,
    /// Shapes that can never fit (no node class could hold them), by queue-key shape hash.
    never_shapes: FxHashSet<u64>,
    /// Request shapes that failed to place in this pass (free resources only shrink within a pass, so they keep
    /// failing): (shape, held), where held says whether the reservation's hold applied.
    failed: FxHashSet<(u64, bool)>,
    decisions: Vec<Decision>,
    /// Jobs started in this pass with their estimated ends (for the reservation).
    started: Vec<(Time, JobId, Placement)>,
    preempted: HashSet<JobId>,
    stats: PassStats,
    attempts: std::cell::Cell<usize>,
    trace: Option<JobId>,
    outcome: Option<PendingReason>,
    traced_position: Option<usize>,
    blocked_by: Option<JobId>,
}

pub(crate) fn spec_sig(spec: &JobSpec) -> u64 {
    if spec.gpu_models.is_empty() && spec.task.mig.is_none() && spec.selector.is_empty() && spec.tolerations.is_empty()
    {
        return (spec.task.gpus > 0) as u64; // the common case needs no hashing
    }
    let mut h = FxHasher::default();
    spec.gpu_models.hash(&mut h);
    spec.task.mig.hash(&mut h);
    spec.selector.hash(&mut h);
    spec.tolerations.hash(&mut h);
    (spec.task.gpus > 0).hash(&mut h);
    h.finish() | 2
}

impl<'a> Pass<'a> {
    /// Why a job waits for capacity: what it needs against what is free on its node classes now.
    fn capacity_reason(
        &self,
        spec: &JobSpec,
        classes: &[u32],
        eta: Option<Time>,
        preempting: Vec<JobId>,
    ) -> PendingReason {
        let (largest_free_block, largest_free_nvlink) = self.free.largest_block(&self.st.topo, classes);
        PendingReason::Capacity {
            needs: needs_text(spec),
            largest_free_block,
            largest_free_nvlink,
            free_eligible_gpus: self.free.free_in(classes),
            eta,
            preempting,
        }
    }

    fn new(st: &'a ClusterState, now: Time, trace: Option<JobId>) -> Pass<'a> {
        Pass {
            st,
            now,
            free: st.free.clone(),
            book: st.book.clone(),
            elig: FxHashMap::default(),
            never: FxHashMap::default(),
            failed: FxHashSet::default(),
            never_shapes: FxHashSet::default(),
            decisions: Vec::new(),
            started: Vec::new(),
            preempted: HashSet::new(),
            stats: PassStats::default(),
            attempts: std::cell::Cell::new(0),
            trace,
            outcome: None,
            traced_position: None,
            blocked_by: None,
        }
    }

    fn share(&self, t: usize) -> f64 {
        let st = self.st;
        let w = st.tenants[t].spec.weight;
        let u = &self.book.usage[t];
        match st.cfg.policy {
            Policy::Drf => {
                let mut s: f64 = 0.0;
                for d in [DIM_GPUS, DIM_CPU, DIM_MEM] {
                    if st.capacity[d] > 0 {
                        s = s.max(u[d] as f64 / st.capacity[d] as f64);
                    }
                }
                s / w
            }
            _ => {
                let h = st.cfg.fairshare_half_life.0 as f64;
                (st.decayed_usage(TenantId(t as u32), self.now) + u[DIM_GPUS] as f64 * h / std::f64::consts::LN_2) / w
            }
        }
    }

    /// Classes that pass the job's selector, tolerations and model list.
    fn eligible(&mut self, spec: &JobSpec) -> Rc<[u32]> {
        self.eligible_sig(spec, spec_sig(spec))
    }

    fn eligible_sig(&mut self, spec: &JobSpec, sig: u64) -> Rc<[u32]> {
        if let Some(c) = self.elig.get(&sig) {
            return c.clone();
        }
        let topo = &self.st.topo;
        let v: Rc<[u32]> = topo
            .classes
            .iter()
            .enumerate()
            .filter(|(_, c)| spec.node_eligible(&c.spec))
            .map(|(i, _)| i as u32)
            .collect();
        self.elig.insert(sig, v.clone());
        v
    }

    /// Why no node could ever hold the job, if so.
    fn never_fits(&self, spec: &JobSpec, classes: &[u32]) -> Option<String> {
        let topo = &self.st.topo;
        if classes.is_empty() {
            return Some("no node matches its selector, tolerations and GPU models".into());
        }
        let ts = &spec.task;
        let fit: Vec<&crate::alloc::ClassInfo> = classes
            .iter()
            .map(|c| &topo.classes[*c as usize])
            .filter(|c| c.max_gpus >= ts.gpus && c.max_cpu >= ts.cpu && c.max_mem >= ts.mem)
            .collect();
        if fit.is_empty() {
            return Some(format!("no eligible node has {} GPUs, {} and {} for one task", ts.gpus, ts.cpu, ts.mem));
        }
        let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let total = ts.gpus as u64 * min_tasks as u64;
        if ts.gpus == 0 {
            return None;
        }
        match spec.topology {
            TopologyScope::NvLink if min_tasks > 1 || spec.tasks > 1 => {
                if !fit.iter().any(|c| c.max_domain as u64 >= total) {
                    return Some(format!("no node has {total} GPUs in one NVLink domain"));
                }
            }
            TopologyScope::NvLink => {
                if !fit.iter().any(|c| c.max_domain >= ts.gpus) {
                    return Some(format!("no node has {} GPUs in one NVLink domain", ts.gpus));
                }
            }
            TopologyScope::Node => {
                if !fit.iter().any(|c| c.max_gpus as u64 >= total) {
                    return Some(format!("no node has {total} GPUs"));
                }
            }
            _ => {
                // Per model group (and per zone unless Any), enough GPUs in total.
                let mut groups: BTreeMap<(Option<GpuModel>, Option<u32>), u64> = BTreeMap::new();
                for c in &fit {
                    let m = if spec.allow_mixed_models { None } else { c.model };
                    let z = if spec.topology == TopologyScope::Any { None } else { Some(c.zone) };
                    *groups.entry((m, z)).or_default() += c.total_gpus;
                }
                if !groups.values().any(|g| *g >= total) {
                    return Some(format!(
                        "needs {total} GPUs of one model in {}; the largest such group has {}",
                        spec.topology,
                        groups.values().max().copied().unwrap_or(0)
                    ));
                }
            }
        }
        None
    }

    /// Classes whose model the tenant's per-model quota admits.
    fn quota_classes(&self, t: TenantId, spec: &JobSpec, tasks: u32, classes: &[u32]) -> Result<Vec<u32>, Deny> {
        let shape = &self.st.shape;
        let per_model = shape.tenants[t.index()].0.as_ref().is_some_and(|q| q.dims[3..].iter().any(Option::is_some));
        if !per_model || spec.task.gpus == 0 {
            return Ok(classes.to_vec());
        }
        let mut out = Vec::with_capacity(classes.len());
        let mut last_err = None;
        let mut verdict: BTreeMap<Option<GpuModel>, bool> = BTreeMap::new();
        for &c in classes {
            let m = self.st.topo.classes[c as usize].model;
            let ok = *verdict.entry(m).or_insert_with(|| match self.book.admit(shape, t, &job_qvec(spec, tasks, m)) {
                Ok(_) => true,
                Err(e) => {
                    last_err = Some(e);
                    false
                }
            });
            if ok {
                out.push(c);
            }
        }
        match (out.is_empty(), last_err) {
            (true, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }

    fn request<'r>(
        &self,
        spec: &'r JobSpec,
        tasks: u32,
        classes: &'r [u32],
        hold: Option<&'r Holdback>,
    ) -> Request<'r> {
        Request { spec, tasks, classes, hold, per_node: spec.selector.iter().any(|s| s.key == labels::RACK) }
    }

    fn place_on(
        &self,
        free: &Free,
        spec: &JobSpec,
        tasks: u32,
        classes: &[u32],
        hold: Option<&Holdback>,
    ) -> Option<Placement> {
        self.attempts.set(self.attempts.get() + 1);
        let req = self.request(spec, tasks, classes, hold);
        free.place(&self.st.topo, &req, Some(&self.st.node_specs))
    }

    /// Places with the desired number of tasks, or for an elastic job the largest size, down to its minimum, that
    /// both fits and the tenant's quota admits.
    fn try_place(&self, job: &Job, classes: &[u32], hold: Option<&Holdback>) -> Option<Placement> {
        let spec = &job.spec;
        let Some(e) = spec.elastic else {
            return self.place_on(&self.free, spec, spec.tasks, classes, hold);
        };
        for n in (e.min_tasks..=spec.tasks).rev() {
            if n > e.min_tasks && self.book.admit(&self.st.shape, spec.tenant, &job_qvec(spec, n, None)).is_err() {
                continue;
            }
            if let Some(p) = self.place_on(&self.free, spec, n, classes, hold) {
                if n == e.min_tasks
                    || self.book.admit(&self.st.shape, spec.tenant, &self.st.placement_qvec(spec, &p)).is_ok()
                {
                    return Some(p);
                }
            }
        }
        None
    }

    /// Takes the currently free part of a reservation's resources out of this pass's free pool, so that no later
    /// job of the pass uses them.
    fn claim(&mut self, hold: &Holdback) {
        let st = self.st;
        let mut holds: Vec<_> = hold.iter().collect();
        holds.sort_by_key(|(n, _)| **n);
        for (n, h) in holds {
            let f = self.free.nodes[n.index()];
            let tp = TaskPlacement {
                node: *n,
                gpu_mask: h.gpus & f.mask,
                mig_slot: None,
                cpu: h.cpu.min(f.cpu),
                mem: h.mem.min(f.mem),
            };
            self.free.take(&st.topo, &tp);
        }
    }

    fn commit_start(&mut self, job: &Job, placement: Placement, backfill: bool) {
        let st = self.st;
        let q = st.placement_qvec(&job.spec, &placement);
        let borrowed = self.book.admit(&st.shape, job.spec.tenant, &q).unwrap_or(true);
        for t in &placement.tasks {
            self.free.take(&st.topo, t);
        }
        self.book.charge(&st.shape, job.spec.tenant, &q, false);
        if st.cfg.backfill {
            self.started.push((ClusterState::est_end(job, self.now), job.id, placement.clone()));
        }
        self.stats.started += 1;
        if backfill {
            self.stats.backfilled += 1;
        }
        if self.trace == Some(job.id) {
            self.outcome = Some(PendingReason::Starting);
        }
        self.decisions.push(Decision::Start { job: job.id, placement, borrowed });
    }

    fn run(&mut self) {
        let st = self.st;
        let cfg = &st.cfg;
        let mut order = Order::new(st);
        let mut res: Option<Res> = None;
        let mut after_block = 0usize;
        let mut streak = vec![0u32; st.tenants.len()];
        let mut position = 0usize;
        let mut exhausted = true;
        let mut quota_searches = 0u32;
        // Jobs that evictions were made for go first, so the victims do not take their resources back.
        let mut served: HashSet<JobId> = HashSet::new();
        for &jid in &st.preempting_for {
            let Some(job) = st.jobs.get(&jid) else {
                continue;
            };
            if !job.state.is_queued() {
                continue;
            }
            served.insert(jid);
            let spec = &job.spec;
            let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
            if self.book.admit(&st.shape, spec.tenant, &job_qvec(spec, min_tasks, None)).is_err() {
                continue;
            }
            let base = self.eligible(spec);
            let Ok(classes) = self.quota_classes(spec.tenant, spec, min_tasks, &base) else {
                continue;
            };
            match self.try_place(job, &classes, None) {
                Some(p) => self.commit_start(job, p, false),
                None => {
                    // Still waiting for its victims to exit: keep what it will use off-limits for the others.
                    if let Some((_, r)) = self.find_victims(job, &classes, false) {
                        self.claim(&r.hold);
                    }
                    if self.trace == Some(jid) {
                        self.outcome = Some(self.capacity_reason(
                            spec,
                            &classes,
                            Some(self.now),
                            st.evicting.iter().copied().collect(),
                        ));
                    }
                }
            }
        }
        loop {
            let next = {
                let this = &*self;
                order.next(|t| this.share(t))
            };
            let Some((t, key)) = next else { break };
            let (jid, sig) = (key.job, key.sig);
            let traced = self.trace == Some(jid);
            if res.is_some() {
                after_block += 1;
                if after_block > cfg.backfill_depth && !traced {
                    exhausted = false;
                    break;
                }
            }
            // Behind a blocked head, cheap rejections from the queue key alone (no job lookup).
            if let (Some(r), false) = (&res, traced) {
                if key.not_before > self.now {
                    continue;
                }
                if key.gpus > self.free.total_gpus {
                    if self.free.total_gpus == 0 && st.queued_no_gpu == 0 {
                        exhausted = false;
                        break; // nothing left that any queued job could use
                    }
                    continue;
                }
                let long = key.est == u64::MAX || self.now.0.saturating_add(key.est) > r.at.0;
                if self.failed.contains(&(key.shape(), long)) {
                    continue;
                }
            }
            if served.contains(&jid) || (!traced && self.never_shapes.contains(&key.shape())) {
                continue;
            }
            let job = &st.jobs[&jid];
            if traced {
                self.traced_position = Some(position);
            }
            position += 1;
            if job.state == JobState::Restarting && job.not_before > self.now {
                if traced {
                    self.outcome = Some(PendingReason::Backoff { until: job.not_before });
                }
                continue;
            }
            self.stats.considered += 1;
            let spec = &job.spec;
            // 1. Quota.
            let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
            let admit = self.book.admit(&st.shape, t, &job_qvec(spec, min_tasks, None));
            if let Err(block) = admit {
                // Held by its own tenant's quota: the tenant's lower-priority (or demoted) jobs may make room.
                if cfg.preemption.enabled && quota_searches < 4 && !traced && st.tenants[t.index()].spec.quota.is_some()
                {
                    quota_searches += 1;
                    let base = self.eligible_sig(spec, sig);
                    if let Some((_, r)) = self.find_victims(job, &base, true) {
                        self.claim(&r.hold);
                        continue;
                    }
                }
                if traced {
                    self.outcome = Some(PendingReason::Quota {
                        tenant: st.tenants[t.index()].spec.name.clone(),
                        block: self.book.explain_deny(&st.shape, t, block),
                    });
                }
                streak[t.index()] += 1;
                if streak[t.index()] >= cfg.quota_lookahead {
                    order.drop_tenant(t);
                }
                continue;
            }
            streak[t.index()] = 0;
            // 2. Eligibility.
            let base = self.eligible_sig(spec, sig);
            let nkey = (
                sig,
                spec.task.gpus,
                min_tasks,
                spec.topology as u32,
                spec.task.cpu.0,
                spec.task.mem.0,
                spec.allow_mixed_models,
            );
            let shape = key.shape();
            let never = match self.never.get(&nkey) {
                Some(v) => v.clone(),
                None => {
                    let v = self.never_fits(spec, &base);
                    self.never.insert(nkey, v.clone());
                    v
                }
            };
            if let Some(detail) = never {
                if spec.elastic.is_none() {
                    self.never_shapes.insert(shape);
                }
                if traced {
                    self.outcome = Some(PendingReason::NeverFits { detail });
                }
                continue;
            }
            let classes = match self.quota_classes(t, spec, min_tasks, &base) {
                Ok(c) => c,
                Err(block) => {
                    if traced {
                        self.outcome = Some(PendingReason::Quota {
                            tenant: st.tenants[t.index()].spec.name.clone(),
                            block: self.book.explain_deny(&st.shape, t, block),
                        });
                    }
                    continue;
                }
            };
            // 3. Placement.
            match &res {
                None => {
                    if let Some(p) = self.try_place(job, &classes, None) {
                        self.commit_start(job, p, false);
                        order.touch(t);
                        continue;
                    }
                    // The head: blocked for capacity.
                    self.blocked_by = Some(jid);
                    if cfg.preemption.enabled {
                        if let Some((victims, reservation)) = self.find_victims(job, &classes, false) {
                            // Room is being made: the job no longer blocks; what it will use is claimed.
                            self.claim(&reservation.hold);
                            if traced {
                                self.outcome = Some(self.capacity_reason(spec, &classes, Some(self.now), victims));
                            }
                            self.blocked_by = None;
                            continue;
                        }
                    }
                    let r = if cfg.backfill {
                        let rr = self.reservation(job, &classes);
                        if let Some(p) = &rr.placement {
                            self.decisions.push(Decision::Reserve { job: jid, at: rr.at, placement: p.clone() });
                        }
                        Some(rr)
                    } else {
                        None
                    };
                    if traced {
                        self.outcome = Some(self.capacity_reason(spec, &classes, r.as_ref().map(|r| r.at), Vec::new()));
                    }
                    if !cfg.backfill {
                        exhausted = false;
                        break;
                    }
                    res = r;
                }
                Some(r) => {
                    if r.forbid.iter().any(|c| classes.contains(c)) && r.at == Time::MAX {
                        // No reservation time is known: keep off the head's node classes entirely.
                        let allowed: Vec<u32> = classes.iter().copied().filter(|c| !r.forbid.contains(c)).collect();
                        if let Some(p) = self.try_place(job, &allowed, None) {
                            self.commit_start(job, p, true);
                            order.touch(t);
                        } else if traced {
                            self.outcome = Some(PendingReason::Reservation { holder: r.head, until: r.at });
                        }
                        continue;
                    }
                    let end = ClusterState::est_end(job, self.now);
                    let short = end <= r.at;
                    let hold = if short { None } else { Some(&r.hold) };
                    let memo = spec.elastic.is_none() && classes.len() == base.len();
                    if let Some(p) = self.try_place(job, &classes, hold) {
                        self.commit_start(job, p, true);
                        order.touch(t);
                    } else if memo && !traced {
                        self.failed.insert((shape, !short));
                    } else if traced {
                        if !short && self.try_place(job, &classes, None).is_some() {
                            self.outcome = Some(PendingReason::Reservation { holder: r.head, until: r.at });
                        } else {
                            self.outcome = Some(self.capacity_reason(spec, &classes, None, Vec::new()));
                        }
                    }
                }
            }
            if traced && self.outcome.is_some() && self.trace.is_some() && res.is_none() && !cfg.backfill {
                break;
            }
        }
        let waiting_on_evictions =
            self.stats.preempted > 0 || st.preempting_for.iter().any(|j| !self.started_ids().contains(j));
        if exhausted && res.is_none() && self.blocked_by.is_none() && self.trace.is_none() && !waiting_on_evictions {
            self.grow_elastic();
        }
    }

    fn started_ids(&self) -> HashSet<JobId> {
        self.decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Start { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    }

    /// Counts queued jobs ahead of `job` in policy order (for explain when the pass stopped before it).
    fn count_ahead(&self, job: JobId) -> usize {
        let mut order = Order::new(self.st);
        let mut n = 0;
        while let Some((_, k)) = order.next(|t| self.share(t)) {
            let j = k.job;
            if j == job {
                break;
            }
            n += 1;
        }
        n
    }

    /// EASY reservation for the head: release running jobs in order of estimated end until it fits. Releases are
    /// applied to the pass's free pool in place and undone afterwards; placement is probed at doubling release
    /// counts, then the earliest fitting count is found by binary search.
    fn reservation(&mut self, job: &Job, classes: &[u32]) -> Res {
        let st: &'a ClusterState = self.st;
        let spec = &job.spec;
        let tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let need = spec.task.gpus as u64 * tasks as u64;
        let unknown =
            Res { head: job.id, at: Time::MAX, hold: Holdback::new(), forbid: classes.to_vec(), placement: None };
        let mut started: Vec<(Time, JobId, Placement)> = std::mem::take(&mut self.started);
        started.sort_by_key(|(t, j, _)| (*t, *j));
        // The release order, pulled lazily: running jobs and those started in this pass, by estimated end.
        let mut order: Vec<(Time, &Placement)> = Vec::new();
        let preempted = self.preempted.clone();
        let mut a = st.running_by_end.iter().filter(|(_, j)| !preempted.contains(j)).peekable();
        let mut b = started.iter().peekable();
        let topo = &st.topo;
        let mut applied = 0usize; // releases currently given back
        let mut free = std::mem::take(&mut self.free);
        let set_to = |free: &mut Free, applied: &mut usize, order: &[(Time, &Placement)], n: usize| {
            let n = n.min(order.len());
            while *applied < n {
                for t in &order[*applied].1.tasks {
                    free.give(topo, t);
                }
                *applied += 1;
            }
            while *applied > n {
                *applied -= 1;
                for t in &order[*applied].1.tasks {
                    free.take(topo, t);
                }
            }
        };
        let fits = |free: &Free| -> Option<Placement> {
            let req = Request {
                spec,
                tasks,
                classes,
                hold: None,
                per_node: spec.selector.iter().any(|s| s.key == labels::RACK),
            };
            free.place(topo, &req, Some(&st.node_specs))
        };
        // Smallest count with enough free GPUs in total.
        let mut lo = 0usize; // known not to fit (or untested 0)
        let mut n = 0usize;
        let horizon = st.cfg.reservation_horizon;
        while free.free_in(classes) < need {
            if n >= horizon {
                break;
            }
            pull_releases(&mut a, &mut b, st, &mut order, n + 1);
            if order.len() <= n {
                break;
            }
            set_to(&mut free, &mut applied, &order, n + 1);
            n += 1;
        }
        let mut found: Option<(usize, Placement)> = None;
        if free.free_in(classes) >= need && n <= horizon {
            let mut step = 1usize;
            let mut attempts = 0;
            loop {
                attempts += 1;
                pull_releases(&mut a, &mut b, st, &mut order, n);
                n = n.min(order.len());
                set_to(&mut free, &mut applied, &order, n);
                if let Some(p) = fits(&free) {
                    found = Some((n, p));
                    break;
                }
                lo = n;
                pull_releases(&mut a, &mut b, st, &mut order, (n + 1).min(horizon));
                if n >= order.len() || attempts > 40 {
                    break;
                }
                n = (n + step).min(horizon);
                step *= 2;
            }
        }
        let result = match found {
            None => None,
            Some((mut hi, mut p)) => {
                // Earliest fitting count in (lo, hi].
                let mut lo = lo;
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    set_to(&mut free, &mut applied, &order, mid);
                    match fits(&free) {
                        Some(q) => {
                            hi = mid;
                            p = q;
                        }
                        None => lo = mid,
                    }
                }
                set_to(&mut free, &mut applied, &order, hi);
                let at = if hi == 0 { self.now } else { order[hi - 1].0.max(self.now) };
                // Free CPU/memory later on the reserved nodes, before undoing the releases.
                let later: Vec<(NodeId, MilliCpu, MiB)> = p
                    .tasks
                    .iter()
                    .map(|t| (t.node, free.nodes[t.node.index()].cpu, free.nodes[t.node.index()].mem))
                    .collect();
                Some((at, p, later))
            }
        };
        self.stats.reservation_releases += order.len();
        set_to(&mut free, &mut applied, &order, 0);
        drop(order);
        self.free = free;
        self.started = started;
        match result {
            None => unknown,
            Some((at, p, later)) => {
                let hold = self.hold_from(&p, &later);
                Res { head: job.id, at, hold, forbid: Vec::new(), placement: Some(p) }
            }
        }
    }

    /// Holds for a future placement given each node's free CPU and memory at that time: long jobs may use
    /// min(free now, free later − needed) and the rest of what is free now is held back.
    fn hold_from(&self, p: &Placement, later: &[(NodeId, MilliCpu, MiB)]) -> Holdback {
        let mut hold = Holdback::new();
        for t in &p.tasks {
            let h: &mut Hold = hold.entry(t.node).or_default();
            h.gpus |= t.gpu_mask;
            h.cpu += t.cpu;
            h.mem += t.mem;
            if let Some(s) = t.mig_slot {
                h.mig |= 1 << s;
            }
        }
        for (node, h) in hold.iter_mut() {
            let now_free = &self.free.nodes[node.index()];
            let (_, lcpu, lmem) = later.iter().find(|(n, _, _)| n == node).copied().expect("every node of p");
            let spare_cpu = lcpu - h.cpu;
            let spare_mem = lmem - h.mem;
            h.cpu = now_free.cpu - spare_cpu.min(now_free.cpu);
            h.mem = now_free.mem - spare_mem.min(now_free.mem);
        }
        hold
    }

    /// What long backfill jobs may not take on each node of the head's future placement `p` on the pool `fut`: its
    /// GPUs, and CPU/memory beyond what is left over then.
    fn hold_for(&self, fut: &Free, p: &Placement) -> Holdback {
        let later: Vec<(NodeId, MilliCpu, MiB)> =
            p.tasks.iter().map(|t| (t.node, fut.nodes[t.node.index()].cpu, fut.nodes[t.node.index()].mem)).collect();
        self.hold_from(p, &later)
    }

    /// Victims whose eviction lets the head start, with fewest lost GPU-time then fewest jobs, within the rate limit.
    /// With `quota_blocked`, the job is held by its own tenant's quota: only that tenant's lower-priority (or, under
    /// LAS, demoted) jobs are candidates, and the victims must free both the quota and the room.
    fn find_victims(&mut self, job: &Job, classes: &[u32], quota_blocked: bool) -> Option<(Vec<JobId>, Res)> {
        let st = self.st;
        let cfg = &st.cfg.preemption;
        let spec = &job.spec;
        let tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let need = spec.task.gpus as u64 * tasks as u64;
        let t = spec.tenant;
        let shape = &st.shape;
        let within_guarantee = shape.tenants[t.index()].0.is_some()
            && self.book.admit(shape, t, &job_qvec(spec, tasks, None)) == Ok(false);
        let my_queue = st.cfg.las_queue(job.attained_gpu_ms);
        let class_set: HashSet<u32> = classes.iter().copied().collect();
        let on_eligible = |j: &Job| {
            j.run.as_ref().is_some_and(|r| {
                r.placement.tasks.iter().any(|tp| class_set.contains(&st.topo.nodes[tp.node.index()].class))
            })
        };
        let req = job_qvec(spec, tasks, None);
        // Evictions already under way count first: if they make room, wait for them. (The free pool is copied only
        // when there is something to try on the copy.)
        let mut fut = if st.evicting.is_empty() { Free::default() } else { self.free.clone() };
        let mut fut_book = if quota_blocked { Some(self.book.clone()) } else { None };
        let mut pending_evictions = false;
        for id in &st.evicting {
            let j = &st.jobs[id];
            if on_eligible(j) || (quota_blocked && j.spec.tenant == t) {
                let run = j.run.as_ref().expect("evicting job runs");
                for tp in &run.placement.tasks {
                    fut.give(&st.topo, tp);
                }
                if let Some(b) = fut_book.as_mut() {
                    b.charge(shape, j.spec.tenant, &st.placement_qvec(&j.spec, &run.placement), true);
                }
                pending_evictions = true;
            }
        }
        let quota_ok = |b: &Option<QuotaBook>| b.as_ref().is_none_or(|b| b.admit(shape, t, &req).is_ok());
        if pending_evictions && quota_ok(&fut_book) {
            if let Some(p) = self.place_on(&fut, spec, tasks, classes, None) {
                let hold = self.hold_for(&fut, &p);
                return Some((
                    Vec::new(),
                    Res { head: job.id, at: self.now, hold, forbid: Vec::new(), placement: None },
                ));
            }
        }
        let budget = cfg.max_per_interval.saturating_sub(st.recent_preemptions(self.now) + self.stats.preempted as u32);
        if budget == 0 {
            return None;
        }
        // Candidates: one linear scan over the compact running rows, cheapest checks first.
        let mut class_mask = 0u64;
        for c in classes {
            class_mask |= if *c < 64 { 1u64 << c } else { u64::MAX };
        }
        let over: Vec<bool> =
            (0..st.tenants.len()).map(|i| self.book.over_guarantee(shape, TenantId(i as u32))).collect();
        let no_quota: Vec<bool> = shape.tenants.iter().map(|(q, _)| q.is_none()).collect();
        let las = st.cfg.policy == Policy::Las;
        let mut cands: Vec<(u64, u32, JobId, PreemptReason)> = Vec::new();
        let prio_possible = st.prio_counts.range(..spec.priority).next().is_some();
        let reclaim_possible = within_guarantee && over.iter().enumerate().any(|(i, o)| *o && i != t.index());
        let parts: &[Vec<crate::state::RunRow>] = if las || prio_possible {
            &st.run_rows[..]
        } else if quota_blocked {
            return None;
        } else if reclaim_possible {
            &st.run_rows[1..]
        } else {
            return None;
        };
        for r in parts.iter().flatten() {
            if !r.preemptible
                || r.evicting
                || self.now.since(r.started) < cfg.min_run_time
                || r.classes & class_mask == 0
                || r.id == job.id
                || (quota_blocked && r.tenant != t)
            {
                continue;
            }
            let lendable = r.tenant == t || r.borrowed || (no_quota[r.tenant.index()] && no_quota[t.index()]);
            let reason = if !quota_blocked && within_guarantee && r.tenant != t && r.borrowed && over[r.tenant.index()]
            {
                PreemptReason::QuotaReclaim { owner: t }
            } else if r.priority < spec.priority && lendable {
                PreemptReason::Priority { victim: r.priority, preemptor: spec.priority }
            } else if las && lendable {
                let attained = r.attained_before + self.now.since(r.started).0 * r.gpus as u64;
                let vq = st.cfg.las_queue(attained);
                if vq <= my_queue {
                    continue;
                }
                PreemptReason::LasDemotion { victim_queue: vq, waiting_queue: my_queue }
            } else {
                continue;
            };
            if self.preempted.contains(&r.id) {
                continue;
            }
            cands.push((r.lost_work(self.now), r.gpus, r.id, reason));
        }
        if cands.is_empty() {
            return None;
        }
        let key = |c: &(u64, u32, JobId, PreemptReason)| (c.0, c.1, c.2);
        const KEEP: usize = 512;
        if cands.len() > KEEP {
            cands.select_nth_unstable_by_key(KEEP - 1, key);
            cands.truncate(KEEP);
        }
        cands.sort_unstable_by_key(key);
        if st.evicting.is_empty() {
            fut = self.free.clone();
        }
        let mut chosen: Vec<usize> = Vec::new();
        let mut placed = None;
        let mut next_try = 1usize;
        for (i, c) in cands.iter().enumerate() {
            let v = &st.jobs[&c.2];
            if !on_eligible(v) {
                continue;
            }
            let run = v.run.as_ref().expect("running");
            for tp in &run.placement.tasks {
                fut.give(&st.topo, tp);
            }
            if let Some(b) = fut_book.as_mut() {
                b.charge(shape, t, &st.placement_qvec(&v.spec, &run.placement), true);
            }
            chosen.push(i);
            if chosen.len() > budget as usize + 32 {
                return None; // pruning removes at most 32: the rate limit could not be met
            }
            let last = i + 1 == cands.len();
            if fut.free_in(classes) < need || (chosen.len() < next_try && !last) || !quota_ok(&fut_book) {
                continue;
            }
            if let Some(p) = self.place_on(&fut, spec, tasks, classes, None) {
                placed = Some(p);
                break;
            }
            // Probe placement at doubling victim counts: each attempt can cost a scan of racks.
            next_try = chosen.len() * 2;
        }
        placed.as_ref()?;
        // Drop victims that turn out not to be needed, most expensive first (at most 32 tries).
        let mut i = chosen.len();
        let floor = chosen.len().saturating_sub(32);
        while i > floor {
            i -= 1;
            let id = cands[chosen[i]].2;
            let vj = &st.jobs[&id];
            let tasks_v = &vj.run.as_ref().expect("running").placement.tasks;
            let vq = st.placement_qvec(&vj.spec, &vj.run.as_ref().expect("running").placement);
            for tp in tasks_v {
                fut.take(&st.topo, tp);
            }
            if let Some(b) = fut_book.as_mut() {
                b.charge(shape, t, &vq, false);
            }
            let fits = if quota_ok(&fut_book) { self.place_on(&fut, spec, tasks, classes, None) } else { None };
            if let Some(p) = fits {
                placed = Some(p);
                chosen.remove(i);
            } else {
                for tp in tasks_v {
                    fut.give(&st.topo, tp);
                }
                if let Some(b) = fut_book.as_mut() {
                    b.charge(shape, t, &vq, true);
                }
            }
        }
        if chosen.len() as u32 > budget {
            return None;
        }
        let p = placed.expect("checked above");
        let hold = self.hold_for(&fut, &p);
        let mut victims = Vec::new();
        for i in chosen {
            let (_, _, id, reason) = cands[i].clone();
            self.preempted.insert(id);
            self.stats.preempted += 1;
            victims.push(id);
            self.decisions.push(Decision::Preempt { job: id, reason, for_job: job.id });
        }
        self.decisions.push(Decision::Reserve { job: job.id, at: self.now, placement: p });
        Some((victims, Res { head: job.id, at: self.now, hold, forbid: Vec::new(), placement: None }))
    }

    /// With nothing left waiting, grows running elastic jobs towards their maximum, one task at a time.
    fn grow_elastic(&mut self) {
        let st = self.st;
        let mut elastic: Vec<&Job> = st
            .running_elastic
            .iter()
            .map(|id| &st.jobs[id])
            .filter(|j| {
                j.spec
                    .elastic
                    .is_some_and(|e| (j.run.as_ref().map_or(0, |r| r.placement.tasks.len()) as u32) < e.max_tasks)
            })
            .collect();
        if elastic.is_empty() {
            return;
        }
        elastic.sort_by_key(|j| j.id);
        for j in elastic {
            let e = j.spec.elastic.expect("filtered");
            let run = j.run.as_ref().expect("running");
            let have = run.placement.tasks.len() as u32;
            let model = run.placement.tasks.first().and_then(|tp| st.node_specs[tp.node.index()].gpu_model());
            let mut spec = j.spec.clone();
            if let Some(m) = model {
                spec.gpu_models = vec![m];
            }
            spec.topology = TopologyScope::Any;
            let zone = run.placement.tasks.first().map(|tp| st.node_specs[tp.node.index()].zone().to_string());
            let classes: Vec<u32> = self
                .eligible(&spec)
                .iter()
                .copied()
                .filter(|c| {
                    j.spec.topology == TopologyScope::Any
                        || zone.as_deref() == Some(st.topo.zone_name(st.topo.classes[*c as usize].zone))
                })
                .collect();
            if matches!(j.spec.topology, TopologyScope::Node | TopologyScope::NvLink | TopologyScope::Rack) {
                continue; // growing would break the required scope; such jobs stay at their size
            }
            let mut add: Vec<TaskPlacement> = Vec::new();
            for _ in have..e.max_tasks {
                if self.book.admit(&st.shape, spec.tenant, &job_qvec(&spec, 1, model)).is_err() {
                    break;
                }
                let Some(p) = self.place_on(&self.free, &spec, 1, &classes, None) else {
                    break;
                };
                let q = st.placement_qvec(&spec, &p);
                for tp in &p.tasks {
                    self.free.take(&st.topo, tp);
                }
                self.book.charge(&st.shape, spec.tenant, &q, false);
                add.extend(p.tasks);
            }
            if !add.is_empty() {
                self.decisions.push(Decision::Scale { job: j.id, add });
            }
        }
    }
}

/// Placement helper for tests and tools: where would this job go on the current free resources, ignoring quota and
/// queue order?
pub fn dry_run_placement(state: &ClusterState, spec: &JobSpec) -> Option<Placement> {
    let mut p = Pass::new(state, Time::ZERO, None);
    let classes = p.eligible(spec);
    p.place_on(&p.free, spec, spec.tasks, &classes, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PreemptionConfig, SchedConfig};
    use crate::ids::NodeId;
    use crate::job::{Elastic, SelectorTerm, Toleration};
    use crate::node::{NodeSpec, NodeState};
    use crate::tenant::{Quota, TenantSpec};
    use crate::units::{Dur, MiB, MilliCpu};
    use std::collections::BTreeSet;

    fn cfg(policy: Policy) -> SchedConfig {
        SchedConfig {
            preemption: PreemptionConfig { enabled: false, ..Default::default() },
            ..SchedConfig::with_policy(policy)
        }
    }

    fn node(name: &str, model: GpuModel, gpus: usize) -> NodeSpec {
        NodeSpec::with_gpus(name, model, gpus, MilliCpu::cores(64), MiB::gib(1024))
            .label("zone", "z1")
            .label("rack", "r1")
    }

    fn cluster(c: SchedConfig, nodes: Vec<NodeSpec>, tenants: &[&str]) -> ClusterState {
        let mut s = ClusterState::new(c).unwrap();
        for n in nodes {
            s.add_node(n).unwrap();
        }
        for t in tenants {
            s.add_tenant(TenantSpec::new(*t)).unwrap();
        }
        s
    }

    fn started(ds: &[Decision]) -> Vec<u64> {
        ds.iter()
            .filter_map(|d| match d {
                Decision::Start { job, .. } => Some(job.0),
                _ => None,
            })
            .collect()
    }

    fn t0() -> TenantId {
        TenantId(0)
    }

    fn submit(s: &mut ClusterState, id: u64, spec: JobSpec, at: u64) {
        s.submit(JobId(id), spec, Time::from_secs(at)).unwrap();
    }

    #[test]
    fn fifo_is_strict_without_backfill() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 4, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 8, 1), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "c", 1, 1), 2);
        let ds = s.step(Time::from_secs(10)).unwrap();
        assert_eq!(started(&ds), vec![1], "job 3 must not pass the blocked job 2");
        s.check_invariants().unwrap();
        let e = explain(&s, JobId(3), Time::from_secs(10)).unwrap();
        assert_eq!(e.reason, PendingReason::Order { ahead: 1, policy: Policy::Fifo, blocked_by: Some(JobId(2)) });
        let e2 = explain(&s, JobId(2), Time::from_secs(10)).unwrap();
        match e2.reason {
            PendingReason::Capacity { largest_free_block, free_eligible_gpus, .. } => {
                assert_eq!((largest_free_block, free_eligible_gpus), (4, 4));
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn easy_backfill_lets_short_jobs_pass_but_protects_the_head() {
        let c = SchedConfig { backfill: true, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "running", 4, 1).estimate(Dur::from_secs(100)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "head", 8, 1).estimate(Dur::from_secs(50)), 1);
        // Ends before the head's reservation (t=100): may run on the free GPUs.
        submit(&mut s, 3, JobSpec::new(t0(), "short", 2, 1).estimate(Dur::from_secs(60)), 2);
        // Would outlast t=100 on GPUs the head needs: must wait.
        submit(&mut s, 4, JobSpec::new(t0(), "long", 2, 1).estimate(Dur::from_secs(500)), 3);
        let now = Time::from_secs(10);
        let ds = s.step(now).unwrap();
        assert_eq!(started(&ds), vec![3]);
        assert!(ds
            .iter()
            .any(|d| matches!(d, Decision::Reserve { job: JobId(2), at, .. } if *at == Time::from_secs(100))));
        match explain(&s, JobId(4), now).unwrap().reason {
            PendingReason::Reservation { holder, until } => {
                assert_eq!(holder, JobId(2));
                assert_eq!(until, Time::from_secs(100));
            }
            r => panic!("{r:?}"),
        }
        s.check_invariants().unwrap();
    }

    #[test]
    fn backfill_may_use_gpus_the_reservation_does_not_need() {
        let c = SchedConfig { backfill: true, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n1", GpuModel::V100_16GB, 8), node("n2", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "r1", 4, 1).estimate(Dur::from_secs(100)), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "r2", 6, 1).estimate(Dur::from_secs(1000)), 0);
        s.step(Time::ZERO).unwrap();
        // n1: 4 free (r1 ends at 100); n2: 2 free (r2 ends at 1000). The head needs 8 on one node: n1 at t=100.
        submit(&mut s, 3, JobSpec::new(t0(), "head", 8, 1).estimate(Dur::from_secs(10)), 1);
        submit(&mut s, 4, JobSpec::new(t0(), "long", 2, 1).estimate(Dur::from_secs(5000)), 2);
        let ds = s.step(Time::from_secs(5)).unwrap();
        let st = started(&ds);
        assert_eq!(st, vec![4]);
        let p = ds.iter().find_map(|d| match d {
            Decision::Start { job: JobId(4), placement, .. } => Some(placement.clone()),
            _ => None,
        });
        assert_eq!(p.unwrap().tasks[0].node, NodeId(1), "the long job must keep off the reserved node");
    }

    #[test]
    fn priority_orders_by_priority_then_submission() {
        let mut s = cluster(cfg(Policy::Priority), vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "low", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "high", 1, 1).priority(10), 5);
        assert_eq!(started(&s.step(Time::from_secs(6)).unwrap()), vec![2]);
    }

    #[test]
    fn sjf_orders_by_estimate_per_gpu() {
        let mut s = cluster(cfg(Policy::Sjf), vec![node("n", GpuModel::T4, 4)], &["a"]);
        // keys: job1 400s/1 = 400; job2 800s/4 = 200; job3 300s/1 = 300; job4 no estimate = last.
        submit(&mut s, 1, JobSpec::new(t0(), "j1", 1, 1).estimate(Dur::from_secs(400)), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "j2", 4, 1).estimate(Dur::from_secs(800)), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "j3", 1, 1).estimate(Dur::from_secs(300)), 2);
        submit(&mut s, 4, JobSpec::new(t0(), "j4", 1, 1), 3);
        let mut order = Vec::new();
        let mut now = Time::from_secs(10);
        for _ in 0..4 {
            let ds = s.step(now).unwrap();
            for id in started(&ds) {
                order.push(id);
                now = now + Dur::from_secs(1);
                s.finish(JobId(id), now, true).unwrap();
            }
        }
        assert_eq!(order, vec![2, 3, 1, 4]);
    }

    #[test]
    fn srtf_counts_progress_kept_by_checkpoints() {
        let mut s = cluster(cfg(Policy::Srtf), vec![node("n", GpuModel::T4, 1)], &["a"]);
        let mut long = JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(1000));
        long.checkpoint_interval = Some(Dur::from_secs(100));
        submit(&mut s, 1, long, 0);
        s.step(Time::ZERO).unwrap();
        s.evict(JobId(1), Time::from_secs(950)).unwrap(); // 900 s kept: 100 s remain
        submit(&mut s, 2, JobSpec::new(t0(), "mid", 1, 1).estimate(Dur::from_secs(200)), 951);
        assert_eq!(s.job(JobId(1)).unwrap().remaining_estimate(), Dur::from_secs(100));
        assert_eq!(started(&s.step(Time::from_secs(960)).unwrap()), vec![1]);
    }

    #[test]
    fn drf_paper_example_gives_a_three_tasks_and_b_two() {
        // DRF paper (Ghodsi et al., NSDI'11): 9 CPUs, 18 GB; A tasks <1 CPU, 4 GB>, B tasks <3 CPU, 1 GB>.
        let n =
            NodeSpec { gpus: vec![], ..NodeSpec::with_gpus("n", GpuModel::T4, 0, MilliCpu::cores(9), MiB::gib(18)) };
        let mut s = cluster(cfg(Policy::Drf), vec![n], &["A", "B"]);
        for i in 0..10u64 {
            let a = JobSpec::new(TenantId(0), "a", 0, 1).cpu_mem(MilliCpu::cores(1), MiB::gib(4));
            let b = JobSpec::new(TenantId(1), "b", 0, 1).cpu_mem(MilliCpu::cores(3), MiB::gib(1));
            submit(&mut s, 100 + i, a, i);
            submit(&mut s, 200 + i, b, i);
        }
        s.step(Time::from_secs(100)).unwrap();
        s.check_invariants().unwrap();
        let count = |t: u32| s.jobs().filter(|j| j.state == JobState::Running && j.spec.tenant == TenantId(t)).count();
        assert_eq!((count(0), count(1)), (3, 2));
        assert_eq!(s.tenant_usage(TenantId(0)).cpu, MilliCpu::cores(3));
        assert_eq!(s.tenant_usage(TenantId(1)).cpu, MilliCpu::cores(6));
    }

    #[test]
    fn drf_weights_divide_the_dominant_share() {
        let mut s = cluster(cfg(Policy::Drf), vec![node("n", GpuModel::T4, 6)], &[]);
        s.add_tenant(TenantSpec::new("heavy").weight(2.0)).unwrap();
        s.add_tenant(TenantSpec::new("light")).unwrap();
        for i in 0..6u64 {
            submit(&mut s, 10 + i, JobSpec::new(TenantId(0), "h", 1, 1), 0);
            submit(&mut s, 20 + i, JobSpec::new(TenantId(1), "l", 1, 1), 0);
        }
        s.step(Time::from_secs(1)).unwrap();
        assert_eq!(s.tenant_usage(TenantId(0)).gpus, 4);
        assert_eq!(s.tenant_usage(TenantId(1)).gpus, 2);
    }

    #[test]
    fn fairshare_prefers_the_tenant_with_less_decayed_usage() {
        let c = SchedConfig { fairshare_half_life: Dur::from_hours(1), ..cfg(Policy::FairShare) };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["used", "fresh"]);
        submit(&mut s, 1, JobSpec::new(TenantId(0), "old", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        s.finish(JobId(1), Time::from_secs(3600), true).unwrap();
        s.accrue_usage(Time::from_secs(3600));
        let u = s.tenant_decayed_usage_gpu_s(TenantId(0), Time::from_secs(3600));
        // One GPU for one half-life: h/ln2·(1 − 1/2) = 3600/0.693·0.5 ≈ 2597 GPU-s.
        assert!((u - 3600.0 / std::f64::consts::LN_2 * 0.5).abs() < 1.0, "{u}");
        let later = Time::from_secs(7200);
        assert!((s.tenant_decayed_usage_gpu_s(TenantId(0), later) - u / 2.0).abs() < 1.0);
        submit(&mut s, 2, JobSpec::new(TenantId(0), "again", 1, 1), 3601);
        submit(&mut s, 3, JobSpec::new(TenantId(1), "first", 1, 1), 3602);
        assert_eq!(started(&s.step(Time::from_secs(3700)).unwrap()), vec![3]);
    }

    #[test]
    fn las_serves_least_attained_first_and_preempts_demoted_jobs() {
        let c = SchedConfig {
            las_thresholds_gpu_s: vec![100],
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(10), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Las)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
        let mut old = JobSpec::new(t0(), "old", 1, 1);
        old.checkpoint_interval = Some(Dur::from_secs(60));
        submit(&mut s, 1, old, 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "new", 1, 1), 50);
        // At t=60 job 1 has 60 GPU-s: same queue as job 2, no preemption.
        let ds = s.step(Time::from_secs(60)).unwrap();
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{ds:?}");
        // At t=130 job 1 has crossed 100 GPU-s: demoted, preempted for job 2.
        let ds = s.step(Time::from_secs(130)).unwrap();
        assert!(
            ds.iter().any(|d| matches!(
                d,
                Decision::Preempt {
                    job: JobId(1),
                    reason: PreemptReason::LasDemotion { victim_queue: 1, waiting_queue: 0 },
                    ..
                }
            )),
            "{ds:?}"
        );
        let ds = s.step(Time::from_secs(131)).unwrap();
        assert_eq!(started(&ds), vec![2]);
        let j1 = s.job(JobId(1)).unwrap();
        assert_eq!(j1.state, JobState::Preempted);
        assert_eq!(j1.progress, Dur::from_secs(120), "work up to the last checkpoint is kept");
        assert_eq!(j1.attained_gpu_ms, 130_000);
        s.check_invariants().unwrap();
    }

    #[test]
    fn gangs_are_all_or_nothing_and_never_mix_models() {
        let mut s = cluster(
            cfg(Policy::Fifo),
            vec![node("v", GpuModel::V100_16GB, 8), node("a", GpuModel::A100_80GB, 8)],
            &["a"],
        );
        submit(&mut s, 1, JobSpec::new(t0(), "gang", 8, 2), 0);
        let ds = s.step(Time::ZERO).unwrap();
        assert!(started(&ds).is_empty(), "a V100+A100 gang must not be formed");
        match explain(&s, JobId(1), Time::ZERO).unwrap().reason {
            PendingReason::NeverFits { detail } => {
                assert!(detail.contains("16 GPUs of one model"), "{detail}")
            }
            r => panic!("{r:?}"),
        }
        let mut mixed = JobSpec::new(t0(), "mixed", 8, 2);
        mixed.allow_mixed_models = true;
        submit(&mut s, 2, mixed, 1);
        assert_eq!(started(&s.step(Time::from_secs(2)).unwrap()), vec![2]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn best_fit_packs_into_the_fullest_node() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "six", 6, 1), 0);
        s.step(Time::ZERO).unwrap();
        let six_node = s.job(JobId(1)).unwrap().run.as_ref().unwrap().placement.tasks[0].node;
        submit(&mut s, 2, JobSpec::new(t0(), "two", 2, 1), 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        match &ds[0] {
            Decision::Start { placement, .. } => assert_eq!(placement.tasks[0].node, six_node),
            d => panic!("{d:?}"),
        }
        submit(&mut s, 3, JobSpec::new(t0(), "eight", 8, 1), 2);
        assert_eq!(started(&s.step(Time::from_secs(2)).unwrap()), vec![3], "packing kept a whole node free");
    }

    #[test]
    fn gangs_stay_in_one_rack_and_nvlink_domain_when_possible() {
        let mk = |n: &str, rack: &str| {
            NodeSpec::with_gpus(n, GpuModel::A100_80GB, 8, MilliCpu::cores(64), MiB::gib(1024))
                .label("zone", "z")
                .label("rack", rack)
        };
        let mut s =
            cluster(cfg(Policy::Fifo), vec![mk("a1", "ra"), mk("b1", "rb"), mk("b2", "rb"), mk("a2", "ra")], &["t"]);
        submit(&mut s, 1, JobSpec::new(t0(), "fill-a1", 4, 1), 0);
        s.step(Time::ZERO).unwrap();
        let mut g = JobSpec::new(t0(), "gang", 8, 2);
        g.topology = TopologyScope::Rack;
        submit(&mut s, 2, g, 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        let Decision::Start { placement, .. } = &ds[0] else { panic!("{ds:?}") };
        let racks: BTreeSet<&str> = placement.tasks.iter().map(|t| s.node_specs[t.node.index()].rack()).collect();
        assert_eq!(racks.len(), 1);
        // NVLink requirement on PCIe GPUs never fits.
        let mut s2 = cluster(cfg(Policy::Fifo), vec![node("t", GpuModel::T4, 4)], &["a"]);
        let mut nv = JobSpec::new(t0(), "nv", 2, 1);
        nv.topology = TopologyScope::NvLink;
        submit(&mut s2, 1, nv, 0);
        assert!(started(&s2.step(Time::ZERO).unwrap()).is_empty());
        let e = explain(&s2, JobId(1), Time::ZERO).unwrap();
        assert!(e.message.contains("NVLink"), "{}", e.message);
    }

    #[test]
    fn selectors_and_spot_taints_are_honoured() {
        let spot = node("spot", GpuModel::V100_16GB, 8).label("lifecycle", "spot").taint("lifecycle", "spot");
        let mut s = cluster(cfg(Policy::Fifo), vec![node("a100", GpuModel::A100_80GB, 8), spot], &["a"]);
        let mut v = JobSpec::new(t0(), "v100", 1, 1);
        v.selector = vec![SelectorTerm::eq("gpu-type", "v100")];
        submit(&mut s, 1, v.clone(), 0);
        assert!(started(&s.step(Time::ZERO).unwrap()).is_empty(), "the only V100 node is spot");
        v.tolerations = vec![Toleration { key: "lifecycle".into(), value: Some("spot".into()) }];
        submit(&mut s, 2, v, 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        assert_eq!(started(&ds), vec![2]);
        let e = explain(&s, JobId(1), Time::from_secs(1)).unwrap();
        assert!(matches!(e.reason, PendingReason::NeverFits { .. }), "{e:?}");
    }

    #[test]
    fn quota_guarantee_limit_and_borrowing() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("team-a").quota(Quota::gpus(4, 6))).unwrap();
        let b = s.add_tenant(TenantSpec::new("team-b").quota(Quota::gpus(8, 8))).unwrap();
        // Unguaranteed capacity: 16 - 12 = 4 GPUs in the root pool.
        submit(&mut s, 1, JobSpec::new(a, "a1", 4, 1), 0);
        submit(&mut s, 2, JobSpec::new(a, "a2", 2, 1), 1); // borrows 2 from the root pool
        submit(&mut s, 3, JobSpec::new(a, "a3", 1, 1), 2); // over the limit of 6
        submit(&mut s, 4, JobSpec::new(b, "b1", 8, 1), 3);
        let ds = s.step(Time::from_secs(5)).unwrap();
        assert_eq!(started(&ds), vec![1, 2, 4], "a quota-held job does not block others");
        assert!(ds.iter().any(|d| matches!(d, Decision::Start { job: JobId(2), borrowed: true, .. })));
        assert!(ds.iter().any(|d| matches!(d, Decision::Start { job: JobId(1), borrowed: false, .. })));
        let e = explain(&s, JobId(3), Time::from_secs(5)).unwrap();
        match &e.reason {
            PendingReason::Quota { tenant, block } => {
                assert_eq!(tenant, "team-a");
                assert_eq!((block.used, block.guarantee, block.limit, block.requested), (6, 4, 6, 1));
            }
            r => panic!("{r:?}"),
        }
        assert!(e.message.contains("team-a uses 6 of 4 guaranteed gpus"), "{}", e.message);
        s.check_invariants().unwrap();
    }

    #[test]
    fn cohort_members_lend_unused_guarantee_and_reclaim_it() {
        let c = SchedConfig {
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(60), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Fifo)
        };
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(8, 16)).cohort("lab")).unwrap();
        let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(8, 16)).cohort("lab")).unwrap();
        for i in 0..4 {
            let mut j = JobSpec::new(b, "b", 4, 1);
            j.checkpoint_interval = Some(Dur::from_secs(30 + i * 10));
            submit(&mut s, 10 + i, j, 0);
        }
        let ds = s.step(Time::ZERO).unwrap();
        assert_eq!(started(&ds).len(), 4, "b borrows a's idle guarantee");
        assert_eq!(ds.iter().filter(|d| matches!(d, Decision::Start { borrowed: true, .. })).count(), 2);
        submit(&mut s, 1, JobSpec::new(a, "owner", 4, 1), 10);
        // Too young to preempt at t=30.
        let ds = s.step(Time::from_secs(30)).unwrap();
        assert!(ds.is_empty(), "{ds:?}");
        // At t=100: reclaim one borrowed job, the one that loses least work since its last checkpoint.
        let ds = schedule(&s, Time::from_secs(100));
        let victims: Vec<JobId> = ds
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, reason: PreemptReason::QuotaReclaim { owner }, .. } if *owner == a => {
                    Some(*job)
                }
                _ => None,
            })
            .collect();
        assert_eq!(victims.len(), 1, "{ds:?}");
        let v = s.job(victims[0]).unwrap();
        assert!(v.run.as_ref().unwrap().borrowed);
        s.apply(&ds[0], Time::from_secs(100)).unwrap();
        let ds = s.step(Time::from_secs(101)).unwrap();
        assert_eq!(started(&ds), vec![1]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn priority_preemption_minimises_lost_work_and_is_rate_limited() {
        let c = SchedConfig {
            preemption: PreemptionConfig {
                enabled: true,
                min_run_time: Dur::from_secs(10),
                max_per_interval: 1,
                interval: Dur::from_mins(10),
            },
            ..SchedConfig::with_policy(Policy::Priority)
        };
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 4)], &["a"]);
        let mut recent_ck = JobSpec::new(t0(), "ck", 2, 1);
        recent_ck.checkpoint_interval = Some(Dur::from_secs(50));
        submit(&mut s, 1, JobSpec::new(t0(), "no-ck", 2, 1), 0);
        submit(&mut s, 2, recent_ck, 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "urgent", 2, 1).priority(5), 50);
        let ds = schedule(&s, Time::from_secs(60));
        // Job 1 would lose 60 s × 2 GPUs; job 2 only 10 s × 2 GPUs since its checkpoint at 50 s.
        assert!(
            ds.iter().any(|d| matches!(
                d,
                Decision::Preempt {
                    job: JobId(2),
                    reason: PreemptReason::Priority { victim: 0, preemptor: 5 },
                    for_job: JobId(3)
                }
            )),
            "{ds:?}"
        );
        assert_eq!(ds.iter().filter(|d| matches!(d, Decision::Preempt { .. })).count(), 1);
        s.apply(&ds[0], Time::from_secs(60)).unwrap();
        s.step(Time::from_secs(61)).unwrap();
        submit(&mut s, 4, JobSpec::new(t0(), "urgent2", 2, 1).priority(5), 62);
        let ds = s.step(Time::from_secs(120)).unwrap();
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "rate limit: 1 per 10 min: {ds:?}");
        let ds = s.step(Time::from_secs(700)).unwrap();
        assert!(ds.iter().any(|d| matches!(d, Decision::Preempt { .. })), "{ds:?}");
    }

    #[test]
    fn evictions_under_way_are_waited_for_not_repeated() {
        let c = SchedConfig {
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::ZERO, ..Default::default() },
            ..SchedConfig::with_policy(Policy::Priority)
        };
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "hi", 1, 1).priority(9), 1);
        let ds = crate::schedule::schedule(&s, Time::from_secs(2));
        let victim = ds.iter().find_map(|d| match d {
            Decision::Preempt { job, .. } => Some(*job),
            _ => None,
        });
        s.begin_eviction(victim.unwrap()).unwrap();
        let ds = crate::schedule::schedule(&s, Time::from_secs(3));
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{ds:?}");
    }

    #[test]
    fn explain_reports_order_position_and_nvlink_block() {
        let mut s = cluster(cfg(Policy::Drf), vec![node("a", GpuModel::A100_80GB, 8)], &["t"]);
        submit(&mut s, 1, JobSpec::new(t0(), "hold", 4, 1), 0);
        s.step(Time::ZERO).unwrap();
        let mut big = JobSpec::new(t0(), "big", 8, 1);
        big.topology = TopologyScope::NvLink;
        big.gpu_models = vec![GpuModel::A100_80GB];
        submit(&mut s, 2, big, 1);
        for i in 0..17 {
            submit(&mut s, 10 + i, JobSpec::new(t0(), "w", 1, 1), 2 + i);
        }
        submit(&mut s, 99, JobSpec::new(t0(), "me", 1, 1), 100);
        let e = explain(&s, JobId(99), Time::from_secs(200)).unwrap();
        assert_eq!(e.reason, PendingReason::Order { ahead: 18, policy: Policy::Drf, blocked_by: Some(JobId(2)) });
        assert!(e.message.contains("18 jobs ahead under drf"), "{}", e.message);
        let e = explain(&s, JobId(2), Time::from_secs(200)).unwrap();
        assert!(
            e.message.contains("needs 8×A100-80GB in one NVLink domain")
                && e.message.contains("largest free block is 4"),
            "{}",
            e.message
        );
        let e = explain(&s, JobId(1), Time::from_secs(200)).unwrap();
        assert_eq!(e.reason, PendingReason::NotQueued { state: JobState::Running });
    }

    #[test]
    fn queue_order_matches_policy_and_explain_positions() {
        let mut s = cluster(cfg(Policy::Sjf), vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "fill", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(900)), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(10)), 2);
        submit(&mut s, 4, JobSpec::new(t0(), "mid", 1, 1).estimate(Dur::from_secs(100)), 3);
        let now = Time::from_secs(5);
        let order = queue_order(&s, now, 10);
        assert_eq!(
            order,
            vec![JobId(3), JobId(4), JobId(2)],
            "shortest estimated GPU-time first; running job 1 absent"
        );
        for (i, j) in order.iter().enumerate() {
            assert_eq!(explain(&s, *j, now).unwrap().position, i, "{j}");
        }
        assert_eq!(queue_order(&s, now, 2), vec![JobId(3), JobId(4)]);
    }

    #[test]
    fn elastic_jobs_start_small_and_grow_when_the_queue_is_empty() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 4)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "fill", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        let mut e = JobSpec::new(t0(), "elastic", 1, 4);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 4 });
        submit(&mut s, 2, e, 1);
        s.step(Time::from_secs(1)).unwrap();
        let tasks = |s: &ClusterState| s.job(JobId(2)).unwrap().run.as_ref().map_or(0, |r| r.placement.tasks.len());
        assert_eq!(tasks(&s), 2, "starts with the largest size that fits (>= min): the 2 free GPUs");
        s.finish(JobId(1), Time::from_secs(5), true).unwrap();
        let ds = s.step(Time::from_secs(6)).unwrap();
        assert!(ds.iter().any(|d| matches!(d, Decision::Scale { job: JobId(2), add } if add.len() == 2)), "{ds:?}");
        assert_eq!(tasks(&s), 4);
        s.check_invariants().unwrap();
    }

    #[test]
    fn failures_restart_with_backoff_then_fail() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 1)], &["a"]);
        let mut j = JobSpec::new(t0(), "flaky", 1, 1);
        j.max_restarts = 1;
        submit(&mut s, 1, j, 0);
        s.step(Time::ZERO).unwrap();
        assert_eq!(s.finish(JobId(1), Time::from_secs(5), false).unwrap(), JobState::Restarting);
        assert!(started(&s.step(Time::from_secs(6)).unwrap()).is_empty(), "backoff of 10 s");
        let e = explain(&s, JobId(1), Time::from_secs(6)).unwrap();
        assert_eq!(e.reason, PendingReason::Backoff { until: Time::from_secs(15) });
        assert_eq!(started(&s.step(Time::from_secs(15)).unwrap()), vec![1]);
        assert_eq!(s.finish(JobId(1), Time::from_secs(20), false).unwrap(), JobState::Failed);
        s.check_invariants().unwrap();
    }

    #[test]
    fn lost_and_draining_nodes_requeue_their_jobs() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 2), node("n1", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 2, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        let n_of = |s: &ClusterState, j: u64| s.job(JobId(j)).unwrap().run.as_ref().unwrap().placement.tasks[0].node;
        let (n1, n2) = (n_of(&s, 1), n_of(&s, 2));
        assert_eq!(s.set_node_state(n1, NodeState::Lost, Time::from_secs(10)).unwrap(), vec![JobId(1)]);
        assert_eq!(s.set_node_state(n2, NodeState::Draining, Time::from_secs(10)).unwrap(), vec![JobId(2)]);
        // Both are asked to stop and keep their GPUs until that is confirmed (the lost node's by its fence).
        assert!(s.job(JobId(1)).unwrap().is_stopping() && s.job(JobId(2)).unwrap().is_stopping());
        assert_eq!(s.allocated_gpus(), 4);
        s.check_invariants().unwrap();
        assert_eq!(s.fence_expired(n1, Time::from_secs(10)).unwrap()[0].state, JobState::Preempted);
        assert_eq!(s.job(JobId(1)).unwrap().restarts, 0, "a lost node is not the job's failure");
        assert_eq!(s.end_attempt(JobId(2), Time::from_secs(10)).unwrap().state, JobState::Preempted);
        assert_eq!(s.capacity_gpus(), 0);
        s.check_invariants().unwrap();
        s.set_node_state(n1, NodeState::Ready, Time::from_secs(20)).unwrap();
        assert_eq!(started(&s.step(Time::from_secs(30)).unwrap()), vec![1]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn mig_slices_are_allocated_one_per_task() {
        let mut n = node("mig", GpuModel::A100_80GB, 2);
        n.gpus[0].mig = vec!["3g.40gb".parse().unwrap(), "3g.40gb".parse().unwrap()];
        let mut s = cluster(cfg(Policy::Fifo), vec![n], &["a"]);
        for i in 0..3 {
            let mut j = JobSpec::new(t0(), "m", 0, 1);
            j.task.mig = Some("3g.40gb".parse().unwrap());
            submit(&mut s, i + 1, j, i);
        }
        submit(&mut s, 10, JobSpec::new(t0(), "whole", 1, 1), 10);
        let ds = s.step(Time::from_secs(20)).unwrap();
        assert_eq!(started(&ds), vec![1, 2], "two slices, the third waits (strict FIFO)");
        s.check_invariants().unwrap();
    }

    #[test]
    fn bad_placements_are_errors_not_panics() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 2, 1), 0);
        let bad = Placement {
            tasks: vec![TaskPlacement {
                node: NodeId(0),
                gpu_mask: 0b100,
                mig_slot: None,
                cpu: MilliCpu::cores(2),
                mem: MiB::gib(8),
            }],
        };
        assert!(s.start(JobId(1), bad, false, Time::ZERO).is_err());
        assert!(s.start(JobId(9), Placement::default(), false, Time::ZERO).is_err());
        assert!(s.finish(JobId(1), Time::ZERO, true).is_err());
        s.check_invariants().unwrap();
    }

    // ----- regressions: each named after what broke -----

    #[test]
    fn elastic_jobs_are_admitted_at_the_size_they_are_placed() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("q").quota(Quota::gpus(2, 3))).unwrap();
        let mut e = JobSpec::new(t, "elastic", 1, 6);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 6 });
        submit(&mut s, 1, e, 0);
        s.step(Time::ZERO).unwrap();
        assert_eq!(s.tenant_usage(t).gpus, 3, "placed at the largest size the limit of 3 GPUs admits");
        s.check_invariants().unwrap();
    }

    #[test]
    fn cpu_only_gangs_keep_their_zone() {
        let mk = |n: &str, z: &str| {
            NodeSpec::with_gpus(n, GpuModel::T4, 0, MilliCpu::cores(2), MiB::gib(8)).label("zone", z)
        };
        let mut s = cluster(cfg(Policy::Fifo), vec![mk("a", "z1"), mk("b", "z2")], &["t"]);
        let mut j = JobSpec::new(t0(), "cpu", 0, 2).cpu_mem(MilliCpu::cores(2), MiB::gib(1));
        j.topology = TopologyScope::Zone;
        submit(&mut s, 1, j, 0);
        assert!(started(&s.step(Time::ZERO).unwrap()).is_empty(), "one task per zone fits, the gang does not");
    }

    #[test]
    fn min_run_time_holds_while_the_clock_is_young() {
        let c = SchedConfig {
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(60), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Priority)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "low", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "high", 1, 1).priority(5), 1);
        // now − min_run_time would underflow at t=30: the 30 s old job must still be safe.
        assert!(schedule(&s, Time::from_secs(30)).is_empty());
        assert!(schedule(&s, Time::from_secs(60)).iter().any(|d| matches!(d, Decision::Preempt { .. })));
    }

    #[test]
    fn evicted_borrowers_do_not_take_back_reclaimed_gpus() {
        let c = SchedConfig {
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::ZERO, ..Default::default() },
            ..SchedConfig::with_policy(Policy::Fifo)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 2)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(1, 2)).cohort("c")).unwrap();
        let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(1, 2)).cohort("c")).unwrap();
        submit(&mut s, 10, JobSpec::new(b, "b1", 1, 1), 0);
        submit(&mut s, 11, JobSpec::new(b, "b2", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 1, JobSpec::new(a, "owner", 1, 1), 5);
        s.step(Time::from_secs(10)).unwrap(); // evicts one of b's jobs (older submit than the owner's)
        let ds = s.step(Time::from_secs(11)).unwrap();
        assert_eq!(started(&ds), vec![1], "the owner, not the evicted borrower, gets the GPU");
        s.check_invariants().unwrap();
    }

    #[test]
    fn elastic_job_is_not_grown_in_the_pass_that_evicts_it() {
        let c = SchedConfig {
            las_thresholds_gpu_s: vec![10],
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::ZERO, ..Default::default() },
            ..SchedConfig::with_policy(Policy::Las)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 3)], &["a"]);
        let mut e = JobSpec::new(t0(), "elastic", 1, 2);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 3 });
        e.topology = TopologyScope::Any;
        submit(&mut s, 1, e, 0);
        submit(&mut s, 2, JobSpec::new(t0(), "filler", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "new", 2, 1), 100);
        // Must not panic applying a Scale of an evicted job.
        s.step(Time::from_secs(100)).unwrap();
        s.check_invariants().unwrap();
    }

    #[test]
    fn backfill_depth_counts_every_job_behind_the_head() {
        let c = SchedConfig { backfill: true, backfill_depth: 2, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "head", 4, 1).estimate(Dur::from_secs(10)), 0);
        // The head never fits on 2 GPUs: NeverFits does not block. Use a 2-GPU job running to block a 2-GPU head.
        s.cancel(JobId(1), Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "run", 2, 1).estimate(Dur::from_secs(100)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "head", 2, 1).estimate(Dur::from_secs(10)), 1);
        for i in 0..3 {
            submit(&mut s, 10 + i, JobSpec::new(t0(), "big", 2, 1).estimate(Dur::from_secs(10)), 2);
        }
        let (_, st) = schedule_with_stats(&s, Time::from_secs(5));
        assert!(st.considered <= 3, "{st:?}");
    }

    #[test]
    fn a_tenant_at_its_quota_preempts_its_own_lower_priority_or_demoted_jobs() {
        let c = SchedConfig {
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(10), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Priority)
        };
        // Plenty of GPUs, but the tenant may hold 2.
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("vc").quota(Quota::gpus(2, 2))).unwrap();
        let other = s.add_tenant(TenantSpec::new("other").quota(Quota::gpus(2, 2))).unwrap();
        submit(&mut s, 1, JobSpec::new(t, "low", 2, 1), 0);
        submit(&mut s, 2, JobSpec::new(other, "theirs", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t, "high", 2, 1).priority(5), 20);
        let ds = schedule(&s, Time::from_secs(30));
        assert_eq!(
            ds.iter()
                .filter_map(|d| match d {
                    Decision::Preempt { job, .. } => Some(*job),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            vec![JobId(1)],
            "only the tenant's own lower-priority job: {ds:?}"
        );
        for d in &ds {
            s.apply(d, Time::from_secs(30)).unwrap();
        }
        assert_eq!(started(&s.step(Time::from_secs(31)).unwrap()), vec![3]);
        s.check_invariants().unwrap();

        // LAS: a demoted job of the same tenant makes room under the tenant's quota.
        let c = SchedConfig {
            las_thresholds_gpu_s: vec![100],
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(10), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Las)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("vc").quota(Quota::gpus(1, 1))).unwrap();
        submit(&mut s, 1, JobSpec::new(t, "old", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t, "new", 1, 1), 50);
        assert!(schedule(&s, Time::from_secs(60)).is_empty(), "not yet demoted");
        let ds = schedule(&s, Time::from_secs(150));
        assert!(
            ds.iter().any(|d| matches!(
                d,
                Decision::Preempt { job: JobId(1), reason: PreemptReason::LasDemotion { .. }, .. }
            )),
            "{ds:?}"
        );
    }

    #[test]
    fn restore_brings_every_job_back_in_its_state() {
        let build = || {
            let c = SchedConfig {
                preemption: PreemptionConfig { enabled: true, min_run_time: Dur::ZERO, ..Default::default() },
                ..SchedConfig::with_policy(Policy::Priority)
            };
            cluster(c, vec![node("n0", GpuModel::T4, 2), node("n1", GpuModel::T4, 2)], &["a"])
        };
        let mut s = build();
        for i in 0..4 {
            submit(&mut s, i + 1, JobSpec::new(t0(), "j", 1, 1), i);
        }
        s.step(Time::from_secs(5)).unwrap();
        submit(&mut s, 9, JobSpec::new(t0(), "hi", 2, 1).priority(5), 6);
        s.step(Time::from_secs(10)).unwrap(); // evicts two
        submit(&mut s, 10, JobSpec::new(t0(), "late", 1, 1), 11);
        s.finish(JobId(1), Time::from_secs(12), true).ok();
        let docs: Vec<String> = s.jobs().map(|j| serde_json::to_string(j).unwrap()).collect();
        let mut r = build();
        for d in &docs {
            r.restore(serde_json::from_str(d).unwrap(), Time::from_secs(13)).unwrap();
        }
        r.check_invariants().unwrap();
        for j in s.jobs() {
            let k = r.job(j.id).unwrap();
            assert_eq!((k.state, &k.run), (j.state, &j.run), "{}", j.id);
        }
        assert_eq!(schedule(&s, Time::from_secs(20)), schedule(&r, Time::from_secs(20)));
        // A running job whose GPUs are taken cannot be restored twice.
        let running = s.jobs().find(|j| j.state == JobState::Running).unwrap().clone();
        let mut dup = running.clone();
        dup.id = JobId(99);
        assert!(r.restore(dup, Time::from_secs(13)).is_err());
    }
}
