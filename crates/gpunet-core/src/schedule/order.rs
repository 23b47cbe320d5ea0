//! Queue order: which queued job the pass considers next. Policies that order jobs (fifo, priority, sjf, srtf, srgf, las)
//! merge the tenant queues by key through a heap of tenant heads; policies that order tenants (DRF, fair share) pick
//! the tenant with the lowest weighted share each time and take its next job.

use super::Pass;
use crate::config::Policy;
use crate::ids::{JobId, TenantId};
use crate::state::{ClusterState, QueueKey};
use crate::tenant::{DIM_CPU, DIM_GPUS, DIM_MEM};
use crate::units::Time;
use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::BinaryHeap;
use std::iter::Peekable;

/// Keys of dropped tenants one call of [`Order::next`] skips in a row before the merged walk turns into a heap merge
/// of the other tenants' queues (`Order::leave_merged`).
const MERGED_SKIP: u32 = 16;

/// Queued jobs in the order the policy considers them now (at most `limit`). Shares are those of the current
/// allocation; a pass reorders tenants as it places jobs, so under share-ordering policies later positions can move.
pub fn queue_order(state: &ClusterState, now: Time, limit: usize) -> Vec<JobId> {
    let mut out = Vec::with_capacity(limit.min(state.queued_count()));
    queue_walk(state, now, limit, |_, _, j| {
        out.push(j);
        true
    });
    out
}

/// The jobs [`queue_order`] lists, given one at a time with their places and tenants to `each` until it returns false
/// (that job included) or `limit` were given: a reader that needs only part of the queue stops there, and nothing the
/// length of the queue is allocated.
pub fn queue_walk(state: &ClusterState, now: Time, limit: usize, mut each: impl FnMut(usize, TenantId, JobId) -> bool) {
    walk(state, now, true, limit, |i, t, k| each(i, t, k.job));
}

/// The queued jobs the pass walks (not the parked), in policy order, up to and including the last for which
/// `more` says more are wanted, at most `cap` of them, with their tenants and keys.
pub(crate) fn queue_prefix(
    state: &ClusterState,
    now: Time,
    cap: usize,
    mut more: impl FnMut(JobId) -> bool,
) -> Vec<(TenantId, QueueKey)> {
    let mut out = Vec::new();
    walk(state, now, false, cap, |_, t, k| {
        out.push((t, *k));
        more(k.job)
    });
    out
}

/// The queue in policy order (`with_parked`: as shown, see [`Order::new`]), each job given to `each` with its place
/// until it says no more are wanted (that job included), at most `cap` of them.
fn walk(
    state: &ClusterState,
    now: Time,
    with_parked: bool,
    cap: usize,
    mut each: impl FnMut(usize, TenantId, &QueueKey) -> bool,
) {
    let p = Pass::new(state, now, None);
    let mut order = Order::new(state, with_parked);
    for i in 0..cap {
        let Some((t, k)) = order.next(|t| p.share(t)) else { break };
        if !each(i, t, &k) {
            break;
        }
    }
}

/// A tenant's queued jobs in key order: its queue, merged with its parked jobs when they are shown too.
pub(super) struct TenantJobs<'a> {
    queue: Peekable<std::collections::btree_set::Range<'a, QueueKey>>,
    parked: Option<Peekable<std::collections::btree_set::Range<'a, QueueKey>>>,
}

impl<'a> Iterator for TenantJobs<'a> {
    type Item = &'a QueueKey;

    fn next(&mut self) -> Option<&'a QueueKey> {
        let Some(parked) = &mut self.parked else { return self.queue.next() };
        match (self.queue.peek(), parked.peek()) {
            (Some(a), Some(b)) if b < a => parked.next(),
            (Some(_), _) => self.queue.next(),
            (None, _) => parked.next(),
        }
    }
}

/// The merge of the tenant queues in policy order, pulled one job at a time.
pub(super) enum Order<'a> {
    /// Policies that order jobs, as the pass walks them: the state's merged queue, one ordered set (no heap). Once
    /// a call has skipped [`MERGED_SKIP`] keys of dropped tenants in a row, the walk goes on as [`Order::Jobs`] over
    /// the other tenants' queues from where it stood (the same order): a dropped tenant's keys are then not walked
    /// at all, and a walk whose every tenant is dropped ends at once instead of running through the rest of the queue.
    Merged {
        st: &'a ClusterState,
        iter: std::collections::btree_set::Iter<'a, (QueueKey, TenantId)>,
        dropped: Vec<bool>,
    },
    /// The tenants' queues merged by a heap: with the parked jobs in their places (as the queue is shown), or the
    /// merged walk's rest once it has left dropped tenants behind (`Order::leave_merged`).
    Jobs { heap: BinaryHeap<Reverse<(u64, u64, JobId, u32)>>, iters: Vec<Peekable<TenantJobs<'a>>>, dropped: Vec<bool> },
    Tenants {
        iters: Vec<Peekable<TenantJobs<'a>>>,
        dropped: Vec<bool>,
        /// Cached shares; `None` when the tenant's allocation changed since they were computed.
        shares: Vec<Option<f64>>,
        /// The tenant the last pick chose, while no share changed and no tenant was dropped: it stays the one with
        /// the lowest share as long as it has jobs, so the next pick needs no look at the others.
        best: Option<usize>,
    },
}

impl<'a> Order<'a> {
    /// The order of the tenants' queues; `with_parked`: with the jobs no node could ever hold (which the pass
    /// never walks, see [`crate::park`]) in their places, as the queue is shown.
    pub(super) fn new(st: &'a ClusterState, with_parked: bool) -> Order<'a> {
        if !st.cfg.policy.orders_tenants() && !with_parked {
            return Order::Merged { st, iter: st.merged.iter(), dropped: vec![false; st.tenants.len()] };
        }
        let iters: Vec<_> = st
            .tenants
            .iter()
            .map(|t| {
                let parked = (with_parked && !t.parked.is_empty()).then(|| t.parked.range(..).peekable());
                TenantJobs { queue: t.queue.range(..).peekable(), parked }.peekable()
            })
            .collect();
        let dropped = vec![false; iters.len()];
        if st.cfg.policy.orders_tenants() {
            let shares = vec![None; iters.len()];
            Order::Tenants { iters, dropped, shares, best: None }
        } else {
            Self::jobs(iters, dropped)
        }
    }

    /// The heap merge of the tenants' queues (`Order::Jobs`) over `iters`, skipping the dropped tenants.
    fn jobs(mut iters: Vec<Peekable<TenantJobs<'a>>>, dropped: Vec<bool>) -> Order<'a> {
        let mut heap = BinaryHeap::with_capacity(iters.len());
        for (t, it) in iters.iter_mut().enumerate() {
            if dropped[t] {
                continue;
            }
            if let Some(k) = it.peek() {
                heap.push(Reverse((k.major, k.minor, k.job, t as u32)));
            }
        }
        Order::Jobs { heap, iters, dropped }
    }

    /// [`Order::Merged`] after a run of dropped tenants' keys, the last of them `after`: the same walk as
    /// [`Order::Jobs`] over each tenant's queue past that key. (A tenant's queue holds the merged set's keys of that
    /// tenant, and both order by the key, whose job is unique.)
    #[cold]
    #[inline(never)]
    fn leave_merged(&mut self, after: QueueKey) {
        use std::ops::Bound::{Excluded, Unbounded};
        let Order::Merged { st, dropped, .. } = self else { return };
        let st: &'a ClusterState = st;
        let dropped = std::mem::take(dropped);
        let iters = st
            .tenants
            .iter()
            .enumerate()
            .map(|(t, e)| {
                // A dropped tenant's queue is not walked: an empty range.
                let queue =
                    if dropped[t] { e.queue.range(after..after) } else { e.queue.range((Excluded(after), Unbounded)) };
                TenantJobs { queue: queue.peekable(), parked: None }.peekable()
            })
            .collect();
        *self = Self::jobs(iters, dropped);
    }

    /// The tenant's allocation changed: its share is recomputed at the next pick.
    pub(super) fn touch(&mut self, t: TenantId) {
        if let Order::Tenants { shares, best, .. } = self {
            shares[t.index()] = None;
            *best = None;
        }
    }

    pub(super) fn drop_tenant(&mut self, t: TenantId) {
        match self {
            Order::Merged { dropped, .. } | Order::Jobs { dropped, .. } => dropped[t.index()] = true,
            Order::Tenants { dropped, best, .. } => {
                dropped[t.index()] = true;
                *best = None;
            }
        }
    }

    /// The next queued job and its tenant. Inlined: the walk calls it for every entry it takes, and whether the
    /// compiler inlined it on its own changed with unrelated edits (1.4 G instructions of `auto`'s Philly replay).
    #[inline(always)]
    pub(super) fn next(&mut self, share: impl Fn(usize) -> f64) -> Option<(TenantId, QueueKey)> {
        if let Order::Merged { iter, dropped, .. } = self {
            let mut skipped = 0;
            let after = loop {
                let (k, t) = iter.next()?;
                if !dropped[t.index()] {
                    return Some((*t, *k));
                }
                skipped += 1;
                if skipped == MERGED_SKIP {
                    break *k;
                }
            };
            self.leave_merged(after);
        }
        match self {
            Order::Merged { .. } => unreachable!("left above"),
            Order::Jobs { heap, iters, dropped } => loop {
                // The top tenant's next key replaces its last in place: one sift-down, which stops at once while
                // that tenant stays first (a long run of one tenant's jobs), instead of a pop and a push.
                let mut top = heap.peek_mut()?;
                let Reverse((_, _, _, t)) = *top;
                if dropped[t as usize] {
                    PeekMut::pop(top);
                    continue;
                }
                let it = &mut iters[t as usize];
                let k = *it.next().expect("the heap holds the head of this queue");
                match it.peek() {
                    Some(n) => *top = Reverse((n.major, n.minor, n.job, t)),
                    None => {
                        PeekMut::pop(top);
                    }
                }
                return Some((TenantId(t), k));
            },
            Order::Tenants { iters, dropped, shares, best } => {
                if let Some(t) = *best {
                    if let Some(k) = iters[t].next() {
                        return Some((TenantId(t as u32), *k));
                    }
                    *best = None;
                }
                let mut pick: Option<(f64, usize)> = None;
                for (t, it) in iters.iter_mut().enumerate() {
                    if dropped[t] || it.peek().is_none() {
                        continue;
                    }
                    let s = *shares[t].get_or_insert_with(|| share(t));
                    if pick.is_none_or(|(bs, _)| s < bs) {
                        pick = Some((s, t));
                    }
                }
                let (_, t) = pick?;
                *best = Some(t);
                let k = iters[t].next()?;
                Some((TenantId(t as u32), *k))
            }
        }
    }
}

impl Pass<'_> {
    /// A tenant's weighted share under the policy: dominant share (DRF) or decayed usage plus current use (fair
    /// share and the rest).
    pub(super) fn share(&self, t: usize) -> f64 {
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

    /// Counts queued jobs ahead of `job` in policy order (for explain when the pass stopped before it).
    pub(super) fn count_ahead(&self, job: JobId) -> usize {
        let mut order = Order::new(self.st, true);
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
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

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

    /// A learned estimate is a distribution: job 1 was learned as 1,000 s with a log-spread of 2 (its class's run
    /// times span orders of magnitude), job 2 was given as exactly 900 s. Under preemptive SRTF, taking job 1's run
    /// time as log-normal, a new job of its class ranks at about 0.72 × 1,000 s = 720 s (the Gittins rank; `gittins.rs`
    /// tests the value against a numerical computation): it goes first. Ranked by its median as if exact
    /// (`learned_rank = "median"`), or without preemption for shorter jobs (a started job then runs to its end),
    /// 1,000 s > 900 s: job 2 goes first.
    #[test]
    fn preemptive_srtf_ranks_a_learned_estimate_by_its_gittins_rank_unless_told_to_use_the_median() {
        use crate::LearnedRank::{Gittins, Median};
        for (rank, preemptive, first) in [(Gittins, true, 1), (Median, true, 2), (Gittins, false, 2)] {
            let mut c = SchedConfig { learned_rank: rank, ..cfg(Policy::Srtf) };
            c.preemption.enabled = preemptive;
            c.preemption.shorter_first = preemptive;
            let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
            submit(&mut s, 9, JobSpec::new(t0(), "fill", 1, 1), 0);
            s.step(Time::ZERO).unwrap();
            let mut learned = JobSpec::new(t0(), "learned", 1, 1).estimate(Dur::from_secs(1000));
            learned.estimate_spread = Some(2.0);
            submit(&mut s, 1, learned, 1);
            submit(&mut s, 2, JobSpec::new(t0(), "given", 1, 1).estimate(Dur::from_secs(900)), 2);
            let order = vec![JobId(first), JobId(3 - first)];
            assert_eq!(queue_order(&s, Time::from_secs(3), 10), order, "{rank:?} {preemptive}");
            s.finish(JobId(9), Time::from_secs(4), true).unwrap();
            assert_eq!(started(&s.step(Time::from_secs(4)).unwrap()), vec![first], "{rank:?} {preemptive}");
        }
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

    /// The merged walk skips a dropped tenant's keys, and after [`super::MERGED_SKIP`] of them in a row goes on as a
    /// heap merge of the other tenants' queues (`Order::leave_merged`): on random queues (most of each tenant's jobs
    /// in a block of the SJF order, two tenants with a third of the jobs each, so that long runs of one tenant
    /// occur) and tenants dropped at random points, it gives exactly the merged queue's keys of the tenants not
    /// dropped when each is reached, in order, and ends once every tenant with keys left is dropped. Fails if the
    /// heap merge starts before the last key the walk gave (a start within the run skipped gives the same keys,
    /// which are all dropped tenants'); the cases that left the merged walk are counted, so that the test cannot
    /// pass without them.
    #[test]
    fn the_merged_walk_with_dropped_tenants_gives_the_queue_in_order() {
        use super::{Order, MERGED_SKIP};
        use proptest::prelude::*;
        let strategy = (
            proptest::collection::vec((0u32..6, 0u32..8, 1u64..10_000), 1..600),
            proptest::collection::vec((0usize..120, 0u32..4), 0..6),
        );
        let left = std::cell::Cell::new(0u32);
        det_runner(128)
            .run(&strategy, |(jobs, drops)| {
                let mut s = cluster(cfg(Policy::Sjf), vec![node("n", GpuModel::T4, 1)], &["a", "b", "c", "d"]);
                for (i, (t, block, r)) in jobs.iter().enumerate() {
                    let t = t % 4; // tenants "a" and "b" have a third of the jobs each
                    let est = if *block > 0 { t as u64 * 10_000 + r } else { r * 4 };
                    let spec = JobSpec::new(TenantId(t), "j", 1, 1).estimate(Dur::from_secs(est));
                    submit(&mut s, i as u64 + 1, spec, i as u64);
                }
                let reference: Vec<_> = s.merged.iter().map(|(k, t)| (*t, k.job)).collect();
                prop_assert_eq!(reference.len(), jobs.len());
                let mut order = Order::new(&s, false);
                let mut dropped = [false; 4];
                let (mut at, mut given) = (0usize, 0usize);
                loop {
                    for (_, t) in drops.iter().filter(|(pos, _)| *pos == given) {
                        order.drop_tenant(TenantId(*t));
                        dropped[*t as usize] = true;
                    }
                    while at < reference.len() && dropped[reference[at].0.index()] {
                        at += 1;
                    }
                    let want = reference.get(at).copied();
                    at += 1;
                    let got = order.next(|_| 0.0).map(|(t, k)| (t, k.job));
                    prop_assert_eq!(got, want, "after {} keys", given);
                    if got.is_none() {
                        break;
                    }
                    given += 1;
                }
                // Nothing more once done.
                prop_assert_eq!(order.next(|_| 0.0), None);
                if matches!(order, Order::Jobs { .. }) {
                    left.set(left.get() + 1);
                }
                Ok(())
            })
            .unwrap();
        assert!(left.get() >= 10, "only {} cases skipped {MERGED_SKIP} keys in a row", left.get());
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
}
