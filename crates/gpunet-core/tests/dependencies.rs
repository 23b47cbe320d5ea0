//! Property tests of job dependencies and arrays over random job streams: a dependent never starts before its
//! dependencies ended (and, for `afterok`, succeeded), arrays never run more elements than their limit, and the
//! state's invariants hold after every step.

use gpunet_core::*;
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct Gen {
    gpus: u32,
    run_s: u64,
    fail: bool,
    /// (kind, how far back) of a dependency on an earlier submission.
    dep: Option<(u8, u8)>,
    /// (elements, limit) of an array.
    array: Option<(u32, u32)>,
}

fn gen() -> impl Strategy<Value = Gen> {
    (
        1u32..=4,
        1u64..300,
        proptest::bool::weighted(0.25),
        proptest::option::weighted(0.5, (0u8..4, 1u8..6)),
        proptest::option::weighted(0.3, (1u32..40, 1u32..6)),
    )
        .prop_map(|(gpus, run_s, fail, dep, array)| Gen { gpus, run_s, fail, dep, array })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn dependents_start_after_their_dependencies_and_arrays_keep_their_limit(
        jobs in proptest::collection::vec(gen(), 1..25),
        backfill in any::<bool>(),
    ) {
        let mut cfg = SchedConfig::with_policy(Policy::Fifo);
        cfg.backfill = backfill;
        cfg.preemption.enabled = false;
        let mut s = ClusterState::new(cfg).unwrap();
        for i in 0..2 {
            s.add_node(NodeSpec::with_gpus(format!("n{i}"), GpuModel::T4, 8, MilliCpu::cores(64), MiB::gib(512)))
                .unwrap();
        }
        let t = s.add_tenant(TenantSpec::new("a")).unwrap();
        let mut next = 1u64;
        let mut ids: Vec<JobId> = Vec::new();
        let mut gens: HashMap<JobId, Gen> = HashMap::new();
        let mut now = Time::ZERO;
        let mut ends: Vec<(Time, JobId, bool)> = Vec::new();
        let mut subs = jobs.iter();
        for step in 0..5000 {
            if step > jobs.len() && ends.is_empty() && s.running_count() == 0 && s.queued_count() == 0 {
                break;
            }
            if let Some(g) = subs.next() {
                let mut spec = JobSpec::new(t, "j", g.gpus, 1).estimate(Dur::from_secs(g.run_s));
                spec.max_restarts = 0;
                if let Some((kind, back)) = g.dep {
                    if let Some(target) = ids.len().checked_sub(back as usize).map(|i| ids[i]) {
                        let kind = [DepKind::AfterOk, DepKind::AfterAny, DepKind::AfterNotOk, DepKind::Singleton]
                            [kind as usize];
                        let jobs = if kind == DepKind::Singleton { vec![] } else { vec![target] };
                        spec.dependencies = gpunet_core::job::thin_vec![Dependency { kind, jobs }];
                    }
                }
                let id = JobId(next);
                next += 1;
                if let Some((n, limit)) = g.array {
                    spec.array = Some(Box::new(ArraySpec { indices: (0..n).collect(), limit: Some(limit) }));
                    for k in 0..n as u64 {
                        gens.insert(JobId(id.0 + 1 + k), g.clone());
                    }
                    next += n as u64;
                }
                s.submit(id, spec, now).unwrap();
                gens.insert(id, g.clone());
                ids.push(id);
            }
            let ds = s.step(now).unwrap();
            s.check_invariants().unwrap();
            for d in &ds {
                if let Decision::Start { job, .. } = d {
                    let j = s.job(*job).unwrap();
                    for dep in &j.spec.dependencies {
                        for target in &dep.jobs {
                            let end = s.job(*target).map(|x| (x.state, x.finished)).or_else(|| {
                                s.array(*target).map(|a| (a.state, a.finished))
                            });
                            let (state, finished) = end.unwrap();
                            prop_assert!(state.is_terminal() && finished.unwrap() <= now,
                                "{job} started at {now} before {target} ended ({state})");
                            if dep.kind == DepKind::AfterOk {
                                prop_assert_eq!(state, JobState::Succeeded);
                            }
                            if dep.kind == DepKind::AfterNotOk {
                                prop_assert_ne!(state, JobState::Succeeded);
                            }
                        }
                    }
                    let g = &gens[job];
                    ends.push((now + Dur::from_secs(g.run_s), *job, !g.fail));
                }
            }
            // Arrays never run more elements than their limit.
            let mut running: HashMap<JobId, u32> = HashMap::new();
            for j in s.jobs().filter(|j| j.state == JobState::Running) {
                if let Some((a, _)) = j.array_of {
                    *running.entry(a).or_default() += 1;
                }
            }
            for (a, n) in running {
                let limit = s.array(a).unwrap().limit.unwrap();
                prop_assert!(n <= limit, "{a} runs {n} elements, limit {limit}");
            }
            ends.sort();
            now = now + Dur::from_secs(30);
            while ends.first().is_some_and(|e| e.0 <= now) {
                let (at, j, ok) = ends.remove(0);
                s.finish(j, at, ok).unwrap();
                s.check_invariants().unwrap();
            }
        }
        // Everything ends: nothing waits for ever on a job that ended.
        for j in s.jobs() {
            prop_assert!(j.state.is_terminal(), "{} is {} at the end", j.id, j.state);
        }
    }
}
