//! Property tests of the scheduler's guarantees over random clusters and job streams.

use gpunet_core::tenant::DIM_GPUS;
use gpunet_core::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct NodeGen {
    model: u8,
    gpus: u8,
    zone: u8,
    rack: u8,
    spot: bool,
    cpu: u8,
}

#[derive(Debug, Clone)]
struct JobGen {
    tenant: u8,
    gpus: u8,
    tasks: u8,
    topo: u8,
    est_s: u16,
    prio: i8,
    run_s: u16,
    spot_ok: bool,
    v100_only: bool,
    elastic: bool,
}

const MODELS: [GpuModel; 3] = [GpuModel::V100_16GB, GpuModel::A100_80GB, GpuModel::T4];

fn node_gen() -> impl Strategy<Value = NodeGen> {
    (0u8..3, 1u8..=8, 0u8..2, 0u8..3, proptest::bool::weighted(0.2), 4u8..64)
        .prop_map(|(model, gpus, zone, rack, spot, cpu)| NodeGen { model, gpus, zone, rack, spot, cpu })
}

fn job_gen() -> impl Strategy<Value = JobGen> {
    (
        (
            0u8..3,
            prop_oneof![6 => Just(1u8), 2 => Just(2u8), 1 => Just(4u8), 1 => Just(8u8), 1 => Just(0u8)],
            prop_oneof![6 => Just(1u8), 2 => Just(2u8), 1 => Just(3u8)],
        ),
        (0u8..5, 1u16..2000, -2i8..3, 1u16..2000),
        (proptest::bool::weighted(0.3), proptest::bool::weighted(0.1), proptest::bool::weighted(0.1)),
    )
        .prop_map(|((tenant, gpus, tasks), (topo, est_s, prio, run_s), (spot_ok, v100_only, elastic))| JobGen {
            tenant,
            gpus,
            tasks,
            topo,
            est_s,
            prio,
            run_s,
            spot_ok,
            v100_only,
            elastic,
        })
}

fn build(cfg: SchedConfig, nodes: &[NodeGen], quotas: &[(u8, u8)], cohort: bool) -> ClusterState {
    let mut s = ClusterState::new(cfg).unwrap();
    for (i, n) in nodes.iter().enumerate() {
        let mut spec = NodeSpec::with_gpus(
            format!("n{i}"),
            MODELS[n.model as usize],
            n.gpus as usize,
            MilliCpu::cores(n.cpu as u64),
            MiB::gib(256),
        )
        .label("zone", &format!("z{}", n.zone))
        .label("rack", &format!("r{}", n.rack));
        if n.spot {
            spec = spec.label("lifecycle", "spot").taint("lifecycle", "spot");
        }
        s.add_node(spec).unwrap();
    }
    for t in 0..3 {
        let mut ts = TenantSpec::new(format!("t{t}"));
        if let Some((g, extra)) = quotas.get(t) {
            ts = ts.quota(Quota::gpus(*g as u64, *g as u64 + *extra as u64));
            if cohort {
                ts = ts.cohort("c");
            }
        }
        s.add_tenant(ts).unwrap();
    }
    s
}

fn job_spec(j: &JobGen) -> JobSpec {
    let mut spec = JobSpec::new(TenantId(j.tenant as u32), "j", j.gpus as u32, j.tasks as u32)
        .estimate(Dur::from_secs(j.est_s as u64))
        .priority(j.prio as i32);
    spec.topology = match j.topo {
        0 => TopologyScope::Any,
        1 => TopologyScope::Zone,
        2 => TopologyScope::Rack,
        3 => TopologyScope::Node,
        _ => TopologyScope::NvLink,
    };
    if j.gpus == 0 {
        spec.task.cpu = MilliCpu::cores(2);
    }
    if j.spot_ok {
        spec.tolerations = gpunet_core::job::thin_vec![Toleration { key: "lifecycle".into(), value: None }];
    }
    if j.v100_only {
        spec.selector = gpunet_core::job::thin_vec![SelectorTerm::eq("gpu-type", "v100")];
    }
    if j.elastic && j.tasks > 1 {
        spec.elastic = Some(Elastic { min_tasks: 1, max_tasks: j.tasks as u32 + 1 });
        spec.topology = TopologyScope::Any;
    }
    spec.checkpoint_interval = Some(Dur::from_secs(60));
    // A third of the estimates are learned ones with a spread of 0 to 3 (Gittins ranks under SRTF/SRGF).
    if j.est_s.is_multiple_of(3) {
        spec.estimate_spread = Some((j.est_s % 7) as f32 * 0.5);
    }
    spec
}

/// Runs a small event loop: submissions at their times, completions after `run_s`, a pass after each event.
fn drive(s: &mut ClusterState, jobs: &[JobGen], check: &mut dyn FnMut(&ClusterState, &[Decision])) {
    let mut now = Time::ZERO;
    let mut next_id = 1u64;
    let mut ends: Vec<(Time, JobId)> = Vec::new();
    let mut pending = jobs.iter();
    for _ in 0..(jobs.len() * 3 + 10) {
        if let Some(j) = pending.next() {
            s.submit(JobId(next_id), job_spec(j), now).unwrap();
            next_id += 1;
        }
        let ds = s.step(now).unwrap();
        check(s, &ds);
        for d in &ds {
            if let Decision::Start { job, .. } = d {
                let rs = jobs[(job.0 - 1) as usize].run_s as u64;
                ends.push((now + Dur::from_secs(rs), *job));
            }
        }
        ends.sort();
        now = now + Dur::from_secs(30);
        // Completions due by now (preempted jobs may have left already).
        while let Some(&(t, id)) = ends.first() {
            if t > now {
                break;
            }
            ends.remove(0);
            if s.job(id).is_some_and(|j| j.state == JobState::Running) {
                s.finish(id, t, true).unwrap();
            }
        }
    }
}

fn policies() -> impl Strategy<Value = (Policy, bool, bool)> {
    (0usize..Policy::ALL.len(), any::<bool>(), any::<bool>()).prop_map(|(p, bf, pre)| (Policy::ALL[p], bf, pre))
}

fn cfg_of(p: Policy, backfill: bool, preempt: bool) -> SchedConfig {
    SchedConfig {
        backfill,
        // With preemption on, sjf and srtf also preempt for much shorter jobs.
        preemption: PreemptionConfig {
            enabled: preempt,
            min_run_time: Dur::from_secs(60),
            shorter_first: preempt,
            ..Default::default()
        },
        las_thresholds_gpu_s: vec![120, 1200],
        // Learned estimates (a third of the jobs, see `job_spec`) by their Gittins ranks where that applies.
        learned_rank: gpunet_core::LearnedRank::Gittins,
        ..SchedConfig::with_policy(p)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// No GPU, CPU or memory over-allocated; gangs whole; topology and model rules met; usage books exact;
    /// every job in exactly one state; quota limits never exceeded.
    #[test]
    fn invariants_hold_under_random_streams(
        nodes in prop::collection::vec(node_gen(), 1..10),
        jobs in prop::collection::vec(job_gen(), 1..40),
        quotas in prop::collection::vec((0u8..12, 0u8..8), 0..3),
        cohort in any::<bool>(),
        (policy, backfill, preempt) in policies(),
        scan_limit in prop_oneof![Just(1u32), Just(4), Just(u32::MAX)],
    ) {
        let mut cfg = cfg_of(policy, backfill, preempt);
        cfg.preemption.victim_scan_limit = scan_limit;
        let mut s = build(cfg, &nodes, &quotas, cohort);
        let mut failure = None;
        drive(&mut s, &jobs, &mut |s, ds| {
            if failure.is_some() { return; }
            if let Err(e) = s.check_invariants() { failure = Some(e); return; }
            for (t, (g, extra)) in quotas.iter().enumerate() {
                let used = s.tenant_usage(TenantId(t as u32)).gpus as u64;
                if used > *g as u64 + *extra as u64 {
                    failure = Some(format!("tenant {t} uses {used} GPUs over its limit"));
                }
            }
            for d in ds {
                if let Decision::Start { placement, job, .. } = d {
                    let spec = &s.job(*job).unwrap().spec;
                    let (min, max) = spec.elastic.map_or((spec.tasks, spec.tasks), |e| (e.min_tasks, e.max_tasks));
                    let n = placement.tasks.len() as u32;
                    if n < min || n > max {
                        failure = Some(format!("{job} started with {n} tasks, gang needs {min}..={max}"));
                    }
                }
            }
        });
        prop_assert!(failure.is_none(), "{}", failure.unwrap());
    }

    /// The same state and time always give the same decisions.
    #[test]
    fn scheduling_is_deterministic(
        nodes in prop::collection::vec(node_gen(), 1..8),
        jobs in prop::collection::vec(job_gen(), 1..30),
        quotas in prop::collection::vec((0u8..12, 0u8..8), 0..3),
        (policy, backfill, preempt) in policies(),
    ) {
        let mk = || {
            let mut s = build(cfg_of(policy, backfill, preempt), &nodes, &quotas, true);
            for (i, j) in jobs.iter().enumerate() {
                s.submit(JobId(i as u64 + 1), job_spec(j), Time::from_secs(i as u64)).unwrap();
            }
            s
        };
        let (a, b) = (mk(), mk());
        let now = Time::from_secs(1000);
        let da = serde_json::to_string(&schedule(&a, now)).unwrap();
        let db = serde_json::to_string(&schedule(&b, now)).unwrap();
        let da2 = serde_json::to_string(&schedule(&a, now)).unwrap();
        prop_assert_eq!(&da, &db);
        prop_assert_eq!(&da, &da2);
    }

    /// EASY backfill never delays the head job past its reservation when estimates are exact.
    #[test]
    fn backfill_never_delays_the_reserved_head(
        nodes in prop::collection::vec(node_gen(), 1..6),
        running in prop::collection::vec((1u8..=4, 10u16..500), 1..12),
        queue in prop::collection::vec((prop_oneof![Just(1u8), Just(2u8), Just(4u8), Just(8u8)], 5u16..900), 1..25),
    ) {
        let cfg = SchedConfig { backfill: true, preemption: PreemptionConfig { enabled: false, ..Default::default() }, ..SchedConfig::with_policy(Policy::Fifo) };
        let nodes: Vec<NodeGen> = nodes.into_iter().map(|n| NodeGen { spot: false, ..n }).collect();
        let mut s = build(cfg, &nodes, &[], false);
        let mut dur = std::collections::HashMap::new();
        let mut id = 1u64;
        for (g, d) in &running {
            s.submit(JobId(id), JobSpec::new(TenantId(0), "r", *g as u32, 1).estimate(Dur::from_secs(*d as u64)), Time::ZERO).unwrap();
            dur.insert(JobId(id), *d as u64);
            id += 1;
        }
        // Start what fits at t=0 without backfill effects: the running set.
        let mut ends: Vec<(Time, JobId)> = Vec::new();
        for d in s.step(Time::ZERO).unwrap() {
            if let Decision::Start { job, .. } = d { ends.push((Time::from_secs(dur[&job]), job)); }
        }
        for (g, d) in &queue {
            s.submit(JobId(id), JobSpec::new(TenantId(0), "q", *g as u32, 1).estimate(Dur::from_secs(*d as u64)), Time::from_secs(1)).unwrap();
            dur.insert(JobId(id), *d as u64);
            id += 1;
        }
        let mut now = Time::from_secs(1);
        let mut head: Option<(JobId, Time)> = None;
        for _ in 0..200 {
            let ds = s.step(now).unwrap();
            for d in &ds {
                match d {
                    Decision::Start { job, .. } => {
                        ends.push((now + Dur::from_secs(dur[job]), *job));
                        if let Some((h, at)) = head {
                            if h == *job {
                                prop_assert!(now <= at, "head {h} reserved for {at} started at {now}");
                                head = None;
                            }
                        }
                    }
                    Decision::Reserve { job, at, .. } if head.is_none() && *at != Time::MAX => head = Some((*job, *at)),
                    _ => {}
                }
            }
            ends.sort();
            let Some(&(t, j)) = ends.first() else { break };
            ends.remove(0);
            now = t.max(now);
            s.finish(j, now, true).unwrap();
            // Finish everything else ending at the same instant.
            while let Some(&(t2, j2)) = ends.first() {
                if t2 != now { break; }
                ends.remove(0);
                s.finish(j2, now, true).unwrap();
            }
        }
        if let Some((h, at)) = head {
            prop_assert!(s.job(h).unwrap().state != JobState::Pending || now <= at, "head {h} never started (reserved {at})");
        }
    }

    /// A tenant asking for no more than its guarantee gets it back from borrowers.
    #[test]
    fn guarantees_are_reclaimed_from_borrowers(guarantee in 1u64..8, flood in 8u64..24, want in 1u64..8) {
        let want = want.min(guarantee);
        let cfg = SchedConfig {
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(60), max_per_interval: 100, interval: Dur::from_mins(10), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Fifo)
        };
        let mut s = ClusterState::new(cfg).unwrap();
        for i in 0..2 {
            s.add_node(NodeSpec::with_gpus(format!("n{i}"), GpuModel::A100_80GB, 8, MilliCpu::cores(64), MiB::gib(512))).unwrap();
        }
        let a = s.add_tenant(TenantSpec::new("owner").quota(Quota::gpus(guarantee, 16)).cohort("c")).unwrap();
        let b = s.add_tenant(TenantSpec::new("borrower").quota(Quota::gpus(16 - guarantee, 16)).cohort("c")).unwrap();
        for i in 0..flood {
            s.submit(JobId(100 + i), JobSpec::new(b, "b", 1, 1), Time::ZERO).unwrap();
        }
        s.step(Time::ZERO).unwrap();
        prop_assert_eq!(s.tenant_usage(b).gpus as u64, flood.min(16));
        for i in 0..want {
            s.submit(JobId(1 + i), JobSpec::new(a, "a", 1, 1), Time::from_secs(10)).unwrap();
        }
        let mut t = Time::from_secs(100);
        for _ in 0..4 {
            s.step(t).unwrap();
            s.check_invariants().unwrap();
            t = t + Dur::from_secs(1);
        }
        prop_assert_eq!(s.tenant_usage(a).gpus as u64, want);
        let _ = DIM_GPUS;
    }

    /// A held job never starts, holds and releases in any order keep every book exact, and a released job is
    /// scheduled like any other.
    #[test]
    fn a_held_job_never_starts(
        nodes in prop::collection::vec(node_gen(), 1..6),
        jobs in prop::collection::vec(job_gen(), 1..30),
        toggles in prop::collection::vec((1u64..32, any::<bool>()), 0..60),
        (policy, backfill, preempt) in policies(),
    ) {
        let mut s = build(cfg_of(policy, backfill, preempt), &nodes, &[], false);
        let mut now = Time::ZERO;
        for (i, j) in jobs.iter().enumerate() {
            let mut spec = job_spec(j);
            spec.hold = i % 3 == 0;
            s.submit(JobId(i as u64 + 1), spec, now).unwrap();
        }
        let mut ends: Vec<(Time, JobId)> = Vec::new();
        for step in 0..(toggles.len() + jobs.len() * 2 + 40) {
            if let Some(&(id, hold)) = toggles.get(step) {
                // Refusals (a running job, one not held) change nothing; the invariants below say so.
                let _ = if hold { s.hold(JobId(id)) } else { s.release_hold(JobId(id), now) };
            } else {
                let first = s.held_jobs().next();
                if let Some(id) = first {
                    s.release_hold(id, now).unwrap();
                }
            }
            let held: Vec<JobId> = s.held_jobs().collect();
            let ds = s.step(now).unwrap();
            if let Err(e) = s.check_invariants() {
                prop_assert!(false, "{}", e);
            }
            for d in &ds {
                if let Decision::Start { job, .. } = d {
                    prop_assert!(!held.contains(job), "held {} started", job);
                    ends.push((now + Dur::from_secs(jobs[(job.0 - 1) as usize].run_s as u64), *job));
                }
            }
            now = now + Dur::from_secs(30);
            ends.sort();
            while ends.first().is_some_and(|(t, _)| *t <= now) {
                let (t, id) = ends.remove(0);
                if s.job(id).is_some_and(|j| j.state == JobState::Running) {
                    s.finish(id, t, true).unwrap();
                }
            }
        }
        prop_assert_eq!(s.held_jobs().count(), 0, "every hold was released in the end");
    }
}
