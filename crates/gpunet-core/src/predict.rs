//! Predictions from the live state: replay it forward on a virtual clock with the same scheduler and lifecycle,
//! running jobs ending at their estimated ends, stopping attempts confirmed at once, and no new arrivals, to say when a
//! queued job should start. Pure, like the rest of the core: the server answers ETAs with it.

use crate::fxhash::FxHashMap;
use crate::state::TenantEntry;
use crate::{schedule, ClusterState, Decision, Dur, JobId, JobState, Placement, Time};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The most queued jobs a replay carries: a job further back in the queue gets no prediction. It bounds the cost of
/// an ETA by the cluster's running jobs and this, whatever the depth of the queue (see [`ClusterState::replay_base`]).
pub const REPLAY_QUEUE_CAP: usize = 10_000;

impl ClusterState {
    /// A copy of the state to try a submission on (a dry run): [`ClusterState::replay_base`] with the first
    /// [`REPLAY_QUEUE_CAP`] queued jobs, so that its cost does not grow with the queue.
    pub fn probe_copy(&self, now: Time) -> ClusterState {
        self.replay_base(None, now)
    }

    /// What a replay needs of the state, copied: nodes, tenants, quotas and running jobs, jobs waiting for
    /// dependencies (with the jobs they depend on), and the queue's first jobs in policy order up to the last of
    /// `want` (at most [`REPLAY_QUEUE_CAP`]; all of those without `want`). Jobs further back cannot start before the wanted ones under job-ordering
    /// policies, held jobs never start, and parked jobs never fit, so a replay of this copy predicts the wanted
    /// jobs' starts as one of the whole state would (short jobs further back that backfill can only be missed), at a
    /// cost independent of the queue's depth.
    pub(crate) fn replay_base(&self, want: Option<&HashSet<JobId>>, now: Time) -> ClusterState {
        let mut left = want.map_or(usize::MAX, |want| {
            want.iter()
                .filter(|id| {
                    self.jobs.get(id).is_some_and(|j| {
                        j.state.is_queued()
                            && !j.held
                            && !self.dep_waiting.contains(id)
                            && self.parked_reason(**id).is_none()
                    })
                })
                .count()
        });
        let prefix = crate::schedule::queue_prefix(self, now, REPLAY_QUEUE_CAP, |id| {
            if want.is_some_and(|w| w.contains(&id)) {
                left -= 1;
            }
            left > 0
        });
        let mut jobs = FxHashMap::default();
        let mut keep = |id: &JobId| {
            if let Some(j) = self.jobs.get(id) {
                jobs.entry(*id).or_insert_with(|| j.clone());
            }
        };
        for (_, id) in self.running_by_end.keys() {
            keep(id);
        }
        for on_node in &self.node_jobs {
            on_node.iter().for_each(&mut keep);
        }
        for id in &self.dep_waiting {
            keep(id);
            if let Some(j) = self.jobs.get(id) {
                j.spec.dependencies.iter().flat_map(|d| &d.jobs).for_each(&mut keep);
            }
        }
        let mut tenants: Vec<TenantEntry> = self
            .tenants
            .iter()
            .map(|t| TenantEntry {
                spec: t.spec.clone(),
                queue: BTreeSet::new(),
                parked: BTreeSet::new(),
                waiting: Default::default(),
                decayed_gpu_ms: t.decayed_gpu_ms,
                usage_as_of: t.usage_as_of,
            })
            .collect();
        let mut queued_no_gpu = 0;
        let mut merged = BTreeSet::new();
        let mut queue_shapes = crate::park::QueueShapes::default();
        for (t, k) in &prefix {
            keep(&k.job);
            tenants[t.index()].queue.insert(*k);
            merged.insert((*k, *t));
            queue_shapes.add(k);
            tenants[t.index()].waiting.add(k);
            queued_no_gpu += usize::from(self.jobs[&k.job].spec.task.gpus == 0);
        }
        let preempting_for = self.preempting_for.iter().copied().filter(|id| jobs.contains_key(id)).collect();
        ClusterState {
            cfg: self.cfg.clone(),
            topo: self.topo.clone(),
            free: self.free.clone(),
            pass_pool: Default::default(),
            node_specs: self.node_specs.clone(),
            node_states: self.node_states.clone(),
            node_jobs: self.node_jobs.clone(),
            node_names: self.node_names.clone(),
            tenants,
            merged,
            queue_shapes,
            tenant_names: self.tenant_names.clone(),
            shape: self.shape.clone(),
            book: self.book.clone(),
            jobs,
            running_by_end: self.running_by_end.clone(),
            run_rows: self.run_rows.clone(),
            run_row_of: self.run_row_of.clone(),
            prio_counts: self.prio_counts.clone(),
            tenant_runs: self.tenant_runs.clone(),
            evicting: self.evicting.clone(),
            running_elastic: self.running_elastic.clone(),
            preempting_for,
            moving: self.moving.clone(),
            moving_for: self.moving_for.clone(),
            preemption_log: self.preemption_log.clone(),
            capacity: self.capacity,
            queued: prefix.len(),
            queued_no_gpu,
            arrays: self.arrays.clone(),
            dep_waiting: self.dep_waiting.clone(),
            dep_waiting_per_tenant: self.dep_waiting_per_tenant.clone(),
            held: BTreeSet::new(),
            held_per_tenant: FxHashMap::default(),
            dependents: self.dependents.clone(),
            cascades: Vec::new(),
            ended_work: Vec::new(),
            ending: false,
            parking: Default::default(),
            changed: None,
        }
    }
}

/// When `job` is predicted to start, and where, or `None` when that cannot be told (a running job without an
/// estimate stands in the way, or nothing would change within `max_steps` completions).
pub fn predict_start(state: &ClusterState, job: JobId, now: Time, max_steps: usize) -> Option<(Time, Placement)> {
    let j = state.job(job)?;
    if j.state == JobState::Running {
        return j.run.as_ref().map(|r| (now, r.placement.clone()));
    }
    let mut out = None;
    replay(state, &HashSet::from([job]), now, max_steps, |started, t, p| {
        if started == job {
            out = Some((t, p.clone()));
        }
        out.is_some()
    });
    out
}

/// Predicted starts of several queued jobs from one replay; jobs whose start cannot be told are absent.
pub fn predict_starts(state: &ClusterState, jobs: &[JobId], now: Time, max_steps: usize) -> HashMap<JobId, Time> {
    let mut want: HashSet<JobId> = jobs.iter().copied().collect();
    let mut out = HashMap::new();
    if want.is_empty() {
        return out;
    }
    replay(state, &want.clone(), now, max_steps, |started, t, _| {
        if want.remove(&started) {
            out.insert(started, t);
        }
        want.is_empty()
    });
    out
}

/// Replays the state forward: each scheduling pass's starts are reported to `seen` (which answers whether to stop),
/// then the clock advances to the next estimated completion or restart backoff. Stops when nothing more can be told.
fn replay(
    state: &ClusterState,
    want: &HashSet<JobId>,
    now: Time,
    max_steps: usize,
    seen: impl FnMut(JobId, Time, &Placement) -> bool,
) {
    replay_on(state.replay_base(Some(want), now), now, max_steps, seen)
}

/// [`replay`] of the given copy.
fn replay_on(mut s: ClusterState, now: Time, max_steps: usize, mut seen: impl FnMut(JobId, Time, &Placement) -> bool) {
    let mut t = now;
    // Attempts being stopped end first (their stop time is not known: the ETA is optimistic by that much).
    let stopping: Vec<JobId> = s.jobs().filter(|j| j.is_stopping()).map(|j| j.id).collect();
    for j in stopping {
        if s.end_attempt(j, t).is_err() {
            return;
        }
    }
    // A running job already past its estimated end is expected to run as long again as it has
    // (`ClusterState::expected_end`, as preemptive SRTF expects), not to end now: what waits for it does not "start
    // now". Such jobs lead the index of estimated ends; their expected ends are kept here instead.
    // So is an attempt started within its probe (`Job::probing`: indexed to end with its probe): it is expected to
    // run to its estimate (`Job::remaining_past_probe`), and so is one the replay starts within its probe.
    // A job without an estimate (ranked by its probe, `JobSpec::ranked`) is not expected to end at all: the replay
    // makes no guess of when what waits for it starts. `expected_left`: what such an attempt is expected to run from
    // its start (`Dur::MAX`: no end), `None` for the others.
    // `expect` holds each such running job's expected end; `late`, the same ordered by time (an entry leaves both
    // when its job is evicted or started again in the replay).
    let expected_left =
        |s: &ClusterState, j: JobId| s.job(j).filter(|j| !j.end_as_indexed()).map(|j| j.remaining_past_probe());
    let mut late: BTreeSet<(Time, JobId)> = s
        .running_ends()
        .filter_map(|(e, j)| {
            let started = s.job(j)?.run.as_ref()?.started;
            match expected_left(&s, j) {
                Some(left) if left == Dur::MAX => Some((Time::MAX, j)),
                _ if e <= now => Some((ClusterState::expected_end(e, started, now), j)),
                Some(left) => Some(((started + left).max(now), j)),
                None => None,
            }
        })
        .collect();
    let mut expect: HashMap<JobId, Time> = late.iter().map(|(e, j)| (*j, *e)).collect();
    for _ in 0..max_steps {
        let ds = schedule(&s, t);
        for d in &ds {
            if let Decision::Start { job, placement, .. } = d {
                if seen(*job, t, placement) {
                    return;
                }
            }
            if s.apply(d, t).is_err() {
                return;
            }
            if let Decision::Start { job, .. } | Decision::Preempt { job, .. } = d {
                if let Some(e) = expect.remove(job) {
                    late.remove(&(e, *job));
                }
                let started = matches!(d, Decision::Start { .. });
                if let Some(left) = started.then(|| expected_left(&s, *job)).flatten() {
                    late.insert((t + left, *job));
                    expect.insert(*job, t + left);
                }
            }
        }
        // Advance to the next estimated completion (or restart backoff), finishing everything due then.
        let on_time =
            |s: &ClusterState| s.running_ends().filter(|(_, j)| !expect.contains_key(j)).map(|(e, _)| e).next();
        let next_end = match (on_time(&s), late.first().map(|(e, _)| *e)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next_wake =
            s.jobs().filter(|j| j.state == JobState::Restarting && j.not_before > t).map(|j| j.not_before).min();
        let next = match (next_end, next_wake) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => return,
        };
        if next == Time::MAX {
            return;
        }
        t = t.max(next);
        let mut due: Vec<JobId> = s
            .running_ends()
            .filter(|(_, j)| !expect.contains_key(j))
            .take_while(|(e, _)| *e <= t)
            .map(|(_, j)| j)
            .collect();
        while late.first().is_some_and(|(e, _)| *e <= t) {
            let (_, j) = late.pop_first().expect("a first entry");
            expect.remove(&j);
            due.push(j);
        }
        for j in due {
            if s.finish(j, t, true).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
    use proptest::prelude::*;

    /// Starts seen by a replay of `s` (the whole state) for the queued jobs.
    fn starts_on(s: ClusterState, now: Time) -> HashMap<JobId, Time> {
        let mut out = HashMap::new();
        replay_on(s, now, 2000, |j, t, _| {
            out.insert(j, t);
            false
        });
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The copy a replay runs on predicts what a replay of the whole state predicts: for every queued job at
        /// once, under each job-ordering policy, with backfill, dependencies, holds and jobs no node holds.
        #[test]
        fn a_replay_of_the_bounded_copy_predicts_what_the_whole_state_does(
            jobs in proptest::collection::vec((1u32..=9, 1u64..500, 0i32..3, 0u8..10), 1..40),
            policy in prop_oneof![Just(Policy::Fifo), Just(Policy::Priority), Just(Policy::Sjf)],
            backfill in any::<bool>(),
            running in 0usize..8,
        ) {
            let mut cfg = SchedConfig::with_policy(policy);
            cfg.backfill = backfill;
            cfg.preemption.enabled = false;
            let mut s = ClusterState::new(cfg).unwrap();
            for n in 0..2 {
                s.add_node(NodeSpec::with_gpus(format!("n{n}"), GpuModel::T4, 4, MilliCpu::cores(32), MiB::gib(256)))
                    .unwrap();
            }
            let ts = [s.add_tenant(TenantSpec::new("a")).unwrap(), s.add_tenant(TenantSpec::new("b")).unwrap()];
            for (i, (gpus, secs, prio, extra)) in jobs.iter().enumerate() {
                let id = JobId(i as u64 + 1);
                let mut spec = JobSpec::new(ts[i % 2], "j", *gpus, 1).estimate(Dur::from_secs(*secs)).priority(*prio);
                spec.topology = TopologyScope::Node;
                if *extra == 0 && i > 0 {
                    spec.dependencies = crate::job::thin_vec![Dependency { kind: DepKind::AfterAny, jobs: vec![JobId(i as u64)] }];
                }
                s.submit(id, spec, Time::from_secs(i as u64)).unwrap();
                if *extra == 1 {
                    s.hold(id).unwrap();
                }
                if i < running {
                    s.step(Time::from_secs(i as u64)).unwrap();
                }
            }
            let now = Time::from_secs(100);
            let queued: HashSet<JobId> = s.jobs().filter(|j| j.state.is_queued()).map(|j| j.id).collect();
            let whole = starts_on(s.clone(), now);
            let bounded = starts_on(s.replay_base(Some(&queued), now), now);
            prop_assert_eq!(&whole, &bounded);
            // The 9-GPU jobs fit no node: parked, never predicted.
            for (i, (gpus, ..)) in jobs.iter().enumerate() {
                if *gpus == 9 {
                    prop_assert!(!whole.contains_key(&JobId(i as u64 + 1)));
                }
            }
        }
    }

    #[test]
    fn a_prediction_costs_the_same_behind_a_deep_queue() {
        let mut s = ClusterState::new(SchedConfig::default()).unwrap();
        s.add_node(NodeSpec::with_gpus("n", GpuModel::T4, 2, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        s.submit(JobId(1), JobSpec::new(t, "a", 2, 1).estimate(Dur::from_secs(100)), Time::ZERO).unwrap();
        s.step(Time::ZERO).unwrap();
        for i in 2..50_000u64 {
            s.submit(JobId(i), JobSpec::new(t, "q", 1, 1).estimate(Dur::from_secs(10)), Time::from_secs(1)).unwrap();
        }
        // Only what is ahead of job 3 is copied: the prediction does not walk or copy the 50,000 queued jobs.
        let base = s.replay_base(Some(&HashSet::from([JobId(3)])), Time::from_secs(2));
        assert_eq!(base.queued_count(), 2);
        assert_eq!(predict_start(&s, JobId(3), Time::from_secs(2), 100).unwrap().0, Time::from_secs(100));
        // A job beyond the cap gets no prediction rather than a replay of the whole queue.
        assert!(predict_start(&s, JobId(REPLAY_QUEUE_CAP as u64 + 10), Time::from_secs(2), 100).is_none());
        assert_eq!(s.probe_copy(Time::from_secs(2)).queued_count(), REPLAY_QUEUE_CAP);
    }

    /// SRTF without preemption, a probe of 900 s, one node of one GPU and one tenant (the probe tests below).
    fn one_gpu_srtf_with_a_probe() -> (ClusterState, TenantId) {
        let mut cfg = SchedConfig { probe: Some(Dur::from_secs(900)), ..SchedConfig::with_policy(Policy::Srtf) };
        cfg.preemption.enabled = false;
        let mut s = ClusterState::new(cfg).unwrap();
        s.add_node(NodeSpec::with_gpus("n", GpuModel::T4, 1, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        (s, t)
    }

    /// A job within its probe is indexed to end with it, but the replay expects it to run to its estimate. By hand,
    /// SRTF without preemption, a probe of 900 s, one GPU: job 1, learned as 36,000 s, runs from 0; job 3, learned
    /// as 36,000 s too, waits ranked at its probe (900 s), ahead of job 4 (given 1,000 s). Job 3 starts when job 1
    /// ends at 36,000 s and is expected to run until 72,000 s: job 4's ETA (36,900 s if the replay took the probe of
    /// the job it starts as its end, 1,800 s if it took both).
    #[test]
    fn eta_expects_a_job_within_its_probe_to_run_to_its_estimate() {
        let (mut s, t) = one_gpu_srtf_with_a_probe();
        let learned = |name: &str| {
            let mut j = JobSpec::new(t, name, 1, 1).estimate(Dur::from_secs(36_000));
            j.estimate_spread = Some(1.0);
            j
        };
        s.submit(JobId(1), learned("a"), Time::ZERO).unwrap();
        s.step(Time::ZERO).unwrap();
        assert!(s.job(JobId(1)).unwrap().probing());
        s.submit(JobId(3), learned("b"), Time::from_secs(10)).unwrap();
        s.submit(JobId(4), JobSpec::new(t, "c", 1, 1).estimate(Dur::from_secs(1_000)), Time::from_secs(10)).unwrap();
        let now = Time::from_secs(100);
        assert_eq!(predict_start(&s, JobId(3), now, 100).unwrap().0, Time::from_secs(36_000));
        assert_eq!(predict_start(&s, JobId(4), now, 100).unwrap().0, Time::from_secs(72_000));
    }

    /// A job without an estimate is ranked by its probe (`JobSpec::ranked`), and indexed to end with it, but the replay
    /// makes no guess of when it ends. By hand, SRTF without preemption, a probe of 900 s, one GPU: job 1, without
    /// estimate, runs from 0 (indexed to end at 900 s); job 2 (given 100 s) has no ETA, nor has job 3 without estimate,
    /// which waits ranked at its probe; job 4 (given 100 s) has none either (it would have 1,000 s if the replay took
    /// the probes as ends). With a second GPU, job 2 starts on it at once, job 4 once job 2 ends and job 3 (ranked at
    /// 900 s, after 100 s) once job 4 ends.
    #[test]
    fn eta_does_not_expect_a_job_without_estimate_to_end_with_its_probe() {
        let (mut s, t) = one_gpu_srtf_with_a_probe();
        s.submit(JobId(1), JobSpec::new(t, "a", 1, 1), Time::ZERO).unwrap();
        s.step(Time::ZERO).unwrap();
        let j1 = s.job(JobId(1)).unwrap();
        assert_eq!((j1.spec.probe(), j1.probing()), (Some(Dur::from_secs(900)), true));
        assert_eq!(ClusterState::est_end(j1, Time::ZERO), Time::from_secs(900));
        s.submit(JobId(2), JobSpec::new(t, "b", 1, 1).estimate(Dur::from_secs(100)), Time::from_secs(10)).unwrap();
        s.submit(JobId(3), JobSpec::new(t, "c", 1, 1), Time::from_secs(10)).unwrap();
        s.submit(JobId(4), JobSpec::new(t, "d", 1, 1).estimate(Dur::from_secs(100)), Time::from_secs(20)).unwrap();
        // Within its probe (at 100 s), and past it (at 1,000 s: as an overrun it would end at 2,000 s).
        for now in [Time::from_secs(100), Time::from_secs(1_000)] {
            for j in 2..=4 {
                assert_eq!(predict_start(&s, JobId(j), now, 100), None, "job {j} at {now:?}");
            }
        }
        let now = Time::from_secs(100);
        s.add_node(NodeSpec::with_gpus("m", GpuModel::T4, 1, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        assert_eq!(predict_start(&s, JobId(2), now, 100).unwrap().0, now);
        assert_eq!(predict_start(&s, JobId(4), now, 100).unwrap().0, Time::from_secs(200));
        assert_eq!(predict_start(&s, JobId(3), now, 100).unwrap().0, Time::from_secs(300), "ranked after job 4");
        // Evicted at 1,000 s and started again, job 1 is past its probe (no longer probing), indexed to end at
        // 3,000 s (as long again as the 1,000 s it is known to run, plus those lost): still no ETA behind it.
        let (mut s, t) = one_gpu_srtf_with_a_probe();
        s.submit(JobId(1), JobSpec::new(t, "a", 1, 1), Time::ZERO).unwrap();
        s.step(Time::ZERO).unwrap();
        s.evict(JobId(1), Time::from_secs(1_000)).unwrap();
        s.step(Time::from_secs(1_000)).unwrap();
        let j1 = s.job(JobId(1)).unwrap();
        assert_eq!((j1.state, j1.probing()), (JobState::Running, false));
        assert_eq!(ClusterState::est_end(j1, Time::from_secs(1_000)), Time::from_secs(3_000));
        s.submit(JobId(2), JobSpec::new(t, "b", 1, 1).estimate(Dur::from_secs(100)), Time::from_secs(1_010)).unwrap();
        assert_eq!(predict_start(&s, JobId(2), Time::from_secs(1_100), 100), None);
    }

    #[test]
    fn eta_follows_the_estimated_ends_of_running_jobs() {
        let mut s = ClusterState::new(SchedConfig::default()).unwrap();
        s.add_node(NodeSpec::with_gpus("n", GpuModel::T4, 2, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        s.submit(JobId(1), JobSpec::new(t, "a", 1, 1).estimate(Dur::from_secs(100)), Time::ZERO).unwrap();
        s.submit(JobId(2), JobSpec::new(t, "b", 1, 1).estimate(Dur::from_secs(300)), Time::ZERO).unwrap();
        s.step(Time::ZERO).unwrap();
        s.submit(JobId(3), JobSpec::new(t, "c", 2, 1).estimate(Dur::from_secs(10)), Time::from_secs(1)).unwrap();
        s.submit(JobId(4), JobSpec::new(t, "d", 1, 1).estimate(Dur::from_secs(10)), Time::from_secs(2)).unwrap();
        let (eta, p) = predict_start(&s, JobId(3), Time::from_secs(5), 100).unwrap();
        assert_eq!(eta, Time::from_secs(300), "needs both GPUs: after b ends");
        assert_eq!(p.gpus(), 2);
        // d is behind c (FIFO): it starts when c ends.
        assert_eq!(predict_start(&s, JobId(4), Time::from_secs(5), 100).unwrap().0, Time::from_secs(310));
        // One replay answers for both.
        let all = predict_starts(&s, &[JobId(3), JobId(4)], Time::from_secs(5), 100);
        assert_eq!(all, HashMap::from([(JobId(3), Time::from_secs(300)), (JobId(4), Time::from_secs(310))]));
        // Without estimates there is nothing to predict from.
        let mut u = s.clone();
        u.submit(JobId(5), JobSpec::new(t, "e", 2, 1), Time::from_secs(3)).unwrap();
        let mut v = ClusterState::new(SchedConfig::default()).unwrap();
        v.add_node(NodeSpec::with_gpus("n", GpuModel::T4, 1, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t2 = v.add_tenant(TenantSpec::new("t")).unwrap();
        v.submit(JobId(1), JobSpec::new(t2, "forever", 1, 1), Time::ZERO).unwrap();
        v.step(Time::ZERO).unwrap();
        v.submit(JobId(2), JobSpec::new(t2, "next", 1, 1), Time::ZERO).unwrap();
        assert!(predict_start(&v, JobId(2), Time::from_secs(1), 100).is_none());
        let _ = u;
    }

    /// A running job past its estimated end is expected to run as long again as it has: what waits for it is
    /// predicted to start then, not now.
    #[test]
    fn a_job_past_its_estimate_is_expected_to_run_as_long_again() {
        let mut s = ClusterState::new(SchedConfig::default()).unwrap();
        s.add_node(NodeSpec::with_gpus("n", GpuModel::T4, 1, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        s.submit(JobId(1), JobSpec::new(t, "a", 1, 1).estimate(Dur::from_secs(100)), Time::ZERO).unwrap();
        s.step(Time::ZERO).unwrap();
        s.submit(JobId(2), JobSpec::new(t, "b", 1, 1).estimate(Dur::from_secs(10)), Time::from_secs(1)).unwrap();
        s.submit(JobId(3), JobSpec::new(t, "c", 1, 1).estimate(Dur::from_secs(10)), Time::from_secs(2)).unwrap();
        // Before its estimated end: b at 100 s.
        assert_eq!(predict_start(&s, JobId(2), Time::from_secs(50), 100).unwrap().0, Time::from_secs(100));
        // At 250 s, a has run 150 s past its 100: expected at 250 + 250 = 500 s; then c after b.
        assert_eq!(predict_start(&s, JobId(2), Time::from_secs(250), 100).unwrap().0, Time::from_secs(500));
        let all = predict_starts(&s, &[JobId(2), JobId(3)], Time::from_secs(250), 100);
        assert_eq!(all, HashMap::from([(JobId(2), Time::from_secs(500)), (JobId(3), Time::from_secs(510))]));
    }
}
