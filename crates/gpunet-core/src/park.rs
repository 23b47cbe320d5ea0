//! Parked jobs: queued jobs that no node of the cluster could ever hold, kept out of the scheduling pass.
//!
//! A job whose shape (GPUs and tasks at its minimum size, CPU, memory, topology scope, selector, tolerations and
//! GPU models: [`QueueKey::shape`]) fits no node class — every job while the cluster has no node, or a job that asks
//! for more than any node has — cannot start whatever runs or ends. Walking it in every pass made the pass, and so
//! every submission, cost time proportional to the queue (a server with no nodes and 100k submitted jobs spent most
//! of its time on them). Such a job is *parked* when it is queued: it stays queued (its state, its tenant's queued
//! count and the displayed queue order are unchanged) but sits in its tenant's `parked` set, which the pass never
//! walks. Whether a shape fits is decided once per shape and cached; the cache is dropped when a node is added (node
//! classes only grow: a registered node never leaves the topology), and each parked shape is then decided again,
//! its jobs moved back to their queues in one step when it now fits. So a parked job costs O(1) at enqueue and
//! nothing per pass, and a node's arrival costs O(parked shapes) plus the jobs that move.

use crate::fxhash::{FxHashMap, FxHashSet};
use crate::ids::{JobId, TenantId};
use crate::job::JobSpec;
use crate::state::{queue_key, ClusterState, QueueKey};

/// Parked jobs by shape, with the cached fit decisions.
#[derive(Debug, Clone, Default)]
pub(crate) struct Parking {
    /// Parked jobs of each shape.
    by_shape: FxHashMap<u64, FxHashSet<JobId>>,
    /// Whether a shape can never fit the current node classes (`Some(why)`), or may (`None`).
    decided: FxHashMap<u64, Option<String>>,
}

impl Parking {
    /// Parked jobs in all.
    pub(crate) fn len(&self) -> usize {
        self.by_shape.values().map(|s| s.len()).sum()
    }

    pub(crate) fn contains(&self, shape: u64, job: JobId) -> bool {
        self.by_shape.get(&shape).is_some_and(|s| s.contains(&job))
    }
}

/// Why a job of this spec can never run on the node classes of `state`, if so (`None` for a job of no task at its
/// minimum size, which always fits). Unlike [`crate::never_fits`], which is asked at submission and lets a job in
/// while no node is registered, a cluster with no node holds nothing.
pub(crate) fn never_runs(state: &ClusterState, spec: &JobSpec) -> Option<String> {
    let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
    if min_tasks == 0 {
        return None;
    }
    if state.topo.classes.is_empty() {
        return Some("no node is registered yet".into());
    }
    crate::schedule::never_fits(state, spec)
}

/// What a tenant's queued keys (its queue and its parked set together) add up to, kept as keys enter and leave so
/// that `/metrics` reads each tenant's waiting jobs, GPUs and oldest submission (the first key of a map) instead of
/// walking a queue that may hold a million jobs. The submissions are counted per whole second (a key's `minor` is its
/// submission time in ms under every policy; the oldest is reported rounded down to its second), so a burst of
/// submissions (a sweep, a pipeline's stage) costs one entry per second. Every job that starts takes its count out
/// of this map: counted per millisecond, a burst of 100,000 submissions made it as large as the queue, and each
/// start a walk down a cold tree (`docs/scheduler.md`, "Submissions counted per second").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Waiting {
    gpus: u64,
    submitted: std::collections::BTreeMap<u64, u32>,
}

impl Waiting {
    pub(crate) fn add(&mut self, k: &QueueKey) {
        self.gpus += k.gpus;
        *self.submitted.entry(Self::second(k)).or_default() += 1;
    }

    /// The whole second of a key's submission (its `minor`, ms), which the map counts by.
    fn second(k: &QueueKey) -> u64 {
        k.minor / 1000
    }

    fn remove(&mut self, k: &QueueKey) {
        self.gpus -= k.gpus;
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.submitted.entry(Self::second(k)) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    pub(crate) fn gpus(&self) -> u64 {
        self.gpus
    }

    pub(crate) fn oldest(&self) -> Option<crate::units::Time> {
        self.submitted.keys().next().map(|s| crate::units::Time(s * 1000))
    }
}

/// The shapes of the jobs the pass walks (every tenant's queue, not the parked), kept as keys enter and leave the
/// queues: per shape, how many jobs, their GPUs, bounds of their remaining estimates and one of them. Behind a
/// blocked head a pass stops once every shape here is one it would skip (`backfill.rs`, `Pass::rest_skipped`)
/// instead of stepping over the rest of a long queue one key at a time.
///
/// The bounds are kept cheaply and may be loose: the smallest estimate only falls and the largest only rises while
/// the shape has jobs, and the job named is forgotten when it leaves (until another of the shape comes). Loose
/// bounds only make the pass walk further, never stop early.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueShapes {
    by: std::collections::BTreeMap<u64, ShapeSpan>,
}

/// One shape of the queue (see [`QueueShapes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShapeSpan {
    pub(crate) shape: u64,
    pub(crate) jobs: u32,
    pub(crate) gpus: u64,
    /// At most the smallest remaining estimate (ms) of its jobs.
    pub(crate) min_est: u64,
    /// At least the largest.
    pub(crate) max_est: u64,
    /// One of its jobs, when known.
    pub(crate) job: Option<JobId>,
}

impl QueueShapes {
    pub(crate) fn add(&mut self, k: &QueueKey) {
        let s = self.by.entry(k.shape()).or_insert(ShapeSpan {
            shape: k.shape(),
            jobs: 0,
            gpus: k.gpus,
            min_est: k.est,
            max_est: k.est,
            job: None,
        });
        s.jobs += 1;
        s.min_est = s.min_est.min(k.est);
        s.max_est = s.max_est.max(k.est);
        s.job = s.job.or(Some(k.job));
    }

    fn remove(&mut self, k: &QueueKey) {
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.by.entry(k.shape()) {
            let s = e.get_mut();
            s.jobs -= 1;
            if s.job == Some(k.job) {
                s.job = None;
            }
            if s.jobs == 0 {
                e.remove();
            }
        }
    }

    /// The first shape after `after` (all of them from the first with `None`), in the order of their hashes.
    pub(crate) fn next_after(&self, after: Option<u64>) -> Option<ShapeSpan> {
        use std::ops::Bound::{Excluded, Unbounded};
        let mut r = match after {
            None => self.by.range(..),
            Some(s) => self.by.range((Excluded(s), Unbounded)),
        };
        r.next().map(|(_, s)| *s)
    }

    /// Whether `keys` (every key in the queues) agree with these: the same shapes with the same counts and GPUs,
    /// each within its bounds, its job (if named) among them.
    pub(crate) fn check<'k>(&self, keys: impl Iterator<Item = &'k QueueKey>) -> Result<(), String> {
        let mut seen: std::collections::BTreeMap<u64, (u32, bool)> = Default::default();
        for k in keys {
            let s = self.by.get(&k.shape()).ok_or_else(|| format!("{}: its shape is not counted", k.job))?;
            if k.est < s.min_est || k.est > s.max_est || k.gpus != s.gpus {
                return Err(format!("{}: estimate or GPUs outside its shape's", k.job));
            }
            let e = seen.entry(k.shape()).or_default();
            e.0 += 1;
            e.1 |= s.job == Some(k.job);
        }
        for (shape, s) in &self.by {
            let (n, named) = seen.get(shape).copied().unwrap_or_default();
            if n != s.jobs || (s.job.is_some() && !named) {
                return Err(format!(
                    "shape {shape:x}: {} jobs counted, {n} queued, its job named queued: {named}",
                    s.jobs
                ));
            }
        }
        Ok(())
    }
}

impl ClusterState {
    /// Puts a queued job's key in its tenant's queue, or among the parked when its shape can never fit. `spec` is
    /// the job's (`None`: the job's entry in the state holds it).
    pub(crate) fn queue_insert(&mut self, tenant: TenantId, k: QueueKey, spec: Option<&JobSpec>) {
        let shape = k.shape();
        let never = match self.parking.decided.get(&shape) {
            Some(d) => d.is_some(),
            None => match spec.or_else(|| self.jobs.get(&k.job).map(|j| &j.spec)) {
                Some(spec) => {
                    let d = never_runs(self, spec);
                    let never = d.is_some();
                    self.parking.decided.insert(shape, d);
                    never
                }
                None => false,
            },
        };
        let t = &mut self.tenants[tenant.index()];
        // A key already there (never, as `check_invariants` checks) is not counted twice.
        let fresh = if never { t.parked.insert(k) } else { t.queue.insert(k) };
        if fresh && !never {
            self.merged.insert((k, tenant));
            self.queue_shapes.add(&k);
        }
        debug_assert!(fresh, "{} queued twice", k.job);
        if fresh {
            t.waiting.add(&k);
            if never {
                self.parking.by_shape.entry(shape).or_default().insert(k.job);
            }
        }
    }

    /// Takes a queued job's key out of its tenant's queue or the parked; whether it was in either. `k` may be a
    /// [`crate::state::queue_probe`]: what is taken out of the rest is the key found.
    pub(crate) fn queue_remove(&mut self, tenant: TenantId, k: &QueueKey) -> bool {
        let t = &mut self.tenants[tenant.index()];
        if let Some(k) = t.queue.take(k) {
            t.waiting.remove(&k);
            self.merged.remove(&(k, tenant));
            self.queue_shapes.remove(&k);
            return true;
        }
        let Some(k) = t.parked.take(k) else {
            return false;
        };
        t.waiting.remove(&k);
        let shape = k.shape();
        if let Some(s) = self.parking.by_shape.get_mut(&shape) {
            s.remove(&k.job);
            if s.is_empty() {
                self.parking.by_shape.remove(&shape);
            }
        }
        true
    }

    /// The node classes changed (a node was added): every fit decision is made again, and the jobs of each parked
    /// shape that may now fit go back to their queues.
    pub(crate) fn unpark_fitting(&mut self) {
        self.parking.decided.clear();
        let shapes: Vec<u64> = self.parking.by_shape.keys().copied().collect();
        for shape in shapes {
            let Some(one) = self.parking.by_shape[&shape].iter().next().copied() else { continue };
            let d = never_runs(self, &self.jobs[&one].spec);
            let fits = d.is_none();
            self.parking.decided.insert(shape, d);
            if !fits {
                continue;
            }
            let ids = self.parking.by_shape.remove(&shape).unwrap_or_default();
            for id in ids {
                let j = &self.jobs[&id];
                let (t, k) = (j.spec.tenant, queue_key(&self.cfg, j));
                let te = &mut self.tenants[t.index()];
                let was = te.parked.remove(&k);
                debug_assert!(was, "parked job missing from its tenant's parked set");
                te.queue.insert(k);
                self.merged.insert((k, t));
                self.queue_shapes.add(&k);
            }
        }
    }

    /// Why a parked job can never run, or `None` when it is not parked.
    pub(crate) fn parked_reason(&self, id: JobId) -> Option<String> {
        let j = self.jobs.get(&id)?;
        let k = queue_key(&self.cfg, j);
        if !self.parking.contains(k.shape(), id) {
            return None;
        }
        self.parking.decided.get(&k.shape()).cloned().flatten().or_else(|| never_runs(self, &j.spec))
    }

    /// Queued jobs kept out of the scheduling pass because no node could ever hold them.
    pub fn parked_count(&self) -> usize {
        self.parking.len()
    }

    /// Checks the parking: every parked job is queued, in its tenant's parked set, of a shape that never fits.
    pub(crate) fn check_parking(&self) -> Result<(), String> {
        let mut n = 0;
        for (shape, ids) in &self.parking.by_shape {
            if ids.is_empty() {
                return Err(format!("parked shape {shape:x} has no job"));
            }
            for id in ids {
                let j = self.jobs.get(id).ok_or_else(|| format!("parked {id} is unknown"))?;
                let k = queue_key(&self.cfg, j);
                if k.shape() != *shape || !self.tenants[j.spec.tenant.index()].parked.contains(&k) {
                    return Err(format!("parked {id} is not in its tenant's parked set under its shape"));
                }
                if never_runs(self, &j.spec).is_none() {
                    return Err(format!("{id} is parked but could run on the current nodes"));
                }
                n += 1;
            }
        }
        let in_sets: usize = self.tenants.iter().map(|t| t.parked.len()).sum();
        if in_sets != n {
            return Err(format!("{in_sets} keys in the tenants' parked sets but {n} parked jobs"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    /// What a tenant's queue holds is kept as jobs enter and leave it: parked or not, held jobs apart, started and
    /// cancelled jobs gone, a preempted job back with its first submission time.
    #[test]
    fn a_tenants_waiting_jobs_gpus_and_oldest_submission_are_kept_as_its_queue_changes() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a", "b"]);
        let w = |s: &ClusterState, t: u32| {
            let w = s.tenant_waiting(TenantId(t));
            (w.jobs, w.gpus, w.oldest_submitted.map(|t| t.0 / 1000))
        };
        assert_eq!(w(&s, 0), (0, 0, None));
        submit(&mut s, 1, JobSpec::new(t0(), "two", 2, 1), 10);
        submit(&mut s, 2, JobSpec::new(t0(), "big", 8, 1), 20); // parked: no node has 8 GPUs
        submit(&mut s, 3, JobSpec::new(t0(), "one", 1, 1), 30);
        submit(&mut s, 4, JobSpec::new(TenantId(1), "other", 1, 1), 40);
        assert_eq!(s.parked_count(), 1);
        assert_eq!(w(&s, 0), (3, 11, Some(10)));
        assert_eq!(w(&s, 1), (1, 1, Some(40)));
        s.hold(JobId(3)).unwrap();
        assert_eq!(w(&s, 0), (2, 10, Some(10)));
        // Job 1 starts (2 GPUs): the oldest waiting is now the parked one.
        assert_eq!(started(&s.step(Time::from_secs(50)).unwrap()), vec![1]);
        assert_eq!(w(&s, 0), (1, 8, Some(20)));
        s.cancel(JobId(2), Time::from_secs(60)).unwrap();
        s.release_hold(JobId(3), Time::from_secs(61)).unwrap();
        assert_eq!(w(&s, 0), (1, 1, Some(30)));
        s.check_invariants().unwrap();
        // A preempted job waits again under its first submission time.
        s.evict(JobId(1), Time::from_secs(70)).unwrap();
        assert_eq!(w(&s, 0).0, 2);
        assert_eq!(w(&s, 0).2, Some(10));
        s.check_invariants().unwrap();
        // A parked job moved back to the queue by a larger node stays counted once.
        submit(&mut s, 5, JobSpec::new(t0(), "big", 8, 1), 80);
        assert_eq!((s.parked_count(), w(&s, 0)), (1, (3, 11, Some(10))));
        s.add_node(node("large", GpuModel::T4, 8)).unwrap();
        assert_eq!((s.parked_count(), w(&s, 0)), (0, (3, 11, Some(10))));
        s.check_invariants().unwrap();
    }

    /// Submissions are counted per whole second: a burst of a thousand jobs within one second is one entry of the
    /// map, the oldest submission is its second (rounded down), and it stays until the last job of that second
    /// leaves the queue.
    #[test]
    fn a_burst_within_a_second_is_one_entry_and_the_oldest_submission_is_its_second() {
        let mut s = cluster(cfg(Policy::Sjf), vec![node("n", GpuModel::T4, 1)], &["a"]);
        for i in 0..1000u64 {
            // Job 1 at 10.000 s, the longest (SJF starts it last); job 1000 at 10.999 s.
            let spec = JobSpec::new(t0(), "burst", 1, 1).estimate(Dur::from_secs(10_000 - i));
            s.submit(JobId(i + 1), spec, Time(10_000 + i)).unwrap();
        }
        submit(&mut s, 1001, JobSpec::new(t0(), "late", 1, 1).estimate(Dur::from_secs(1)), 12);
        assert_eq!(s.tenants[0].waiting.submitted.len(), 2);
        let oldest = |s: &ClusterState| s.tenant_waiting(t0()).oldest_submitted;
        assert_eq!(oldest(&s), Some(Time::from_secs(10)));
        // The shortest (the late one, then the burst's last) start one by one on the one GPU; the burst's second
        // stays the oldest while any of its jobs waits.
        let mut now = Time::from_secs(20);
        for expect in [1001u64, 1000, 999] {
            assert_eq!(started(&s.step(now).unwrap()), vec![expect]);
            assert_eq!(oldest(&s), Some(Time::from_secs(10)));
            s.finish(JobId(expect), now, true).unwrap();
            now = now + Dur::from_secs(1);
        }
        assert_eq!(s.tenants[0].waiting.submitted.len(), 1);
        for id in 1..=998 {
            s.cancel(JobId(id), now).unwrap();
        }
        assert_eq!((s.tenant_waiting(t0()).jobs, oldest(&s)), (0, None));
        assert!(s.tenants[0].waiting.submitted.is_empty());
        s.check_invariants().unwrap();
    }

    /// A new configuration sorts the queues again from the queued jobs, less the held ones and those waiting for a
    /// dependency (in no queue): a held job stays out of the queue, and is not started, until released.
    #[test]
    fn a_new_configuration_leaves_held_jobs_out_of_the_queues() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "held", 1, 1), 1);
        submit(&mut s, 2, JobSpec::new(t0(), "free", 1, 1), 2);
        s.hold(JobId(1)).unwrap();
        s.set_config(cfg(Policy::Sjf)).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.tenant_waiting(t0()).jobs, 1);
        assert_eq!(started(&s.step(Time::from_secs(3)).unwrap()), vec![2]);
        s.release_hold(JobId(1), Time::from_secs(4)).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(started(&s.step(Time::from_secs(5)).unwrap()), vec![1]);
    }

    #[test]
    fn jobs_of_an_empty_cluster_are_parked_and_start_when_a_node_comes() {
        let mut s = cluster(cfg(Policy::Fifo), vec![], &["a"]);
        for i in 1..=3 {
            submit(&mut s, i, JobSpec::new(t0(), "j", 1, 1), i);
        }
        assert_eq!((s.queued_count(), s.parked_count()), (3, 3));
        let e = explain(&s, JobId(2), Time::from_secs(5)).unwrap();
        assert!(matches!(e.reason, PendingReason::NeverFits { .. }), "{e:?}");
        assert!(e.message.contains("no node is registered"), "{}", e.message);
        assert_eq!(queue_order(&s, Time::from_secs(5), 10), vec![JobId(1), JobId(2), JobId(3)]);
        assert!(s.step(Time::from_secs(5)).unwrap().is_empty());
        s.add_node(node("n", GpuModel::T4, 2)).unwrap();
        assert_eq!(s.parked_count(), 0);
        assert_eq!(started(&s.step(Time::from_secs(6)).unwrap()), vec![1, 2]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn only_shapes_that_never_fit_are_parked_and_a_larger_node_frees_them() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("small", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "big", 4, 1), 1);
        submit(&mut s, 2, JobSpec::new(t0(), "small", 1, 1), 2);
        assert_eq!(s.parked_count(), 1);
        // The big job sits ahead in FIFO order, yet it neither blocks nor is walked: the small one starts.
        assert_eq!(queue_order(&s, Time::from_secs(3), 10), vec![JobId(1), JobId(2)]);
        assert_eq!(started(&s.step(Time::from_secs(3)).unwrap()), vec![2]);
        s.cancel(JobId(1), Time::from_secs(4)).unwrap();
        assert_eq!((s.parked_count(), s.queued_count()), (0, 0));
        submit(&mut s, 3, JobSpec::new(t0(), "big", 4, 1), 5);
        assert_eq!(s.parked_count(), 1);
        s.add_node(node("large", GpuModel::T4, 4)).unwrap();
        assert_eq!(s.parked_count(), 0);
        assert_eq!(started(&s.step(Time::from_secs(6)).unwrap()), vec![3]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_policy_change_keeps_parked_jobs_parked() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("small", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "big", 4, 1), 1);
        submit(&mut s, 2, JobSpec::new(t0(), "big", 8, 1).priority(5), 2);
        s.set_config(cfg(Policy::Priority)).unwrap();
        assert_eq!((s.parked_count(), s.queued_count()), (2, 2));
        assert_eq!(queue_order(&s, Time::from_secs(3), 10), vec![JobId(2), JobId(1)]);
        s.check_invariants().unwrap();
    }
}
