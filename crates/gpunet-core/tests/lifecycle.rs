//! Property test of the shared job lifecycle. A model driver keeps the set of processes that really run on each GPU:
//! a start launches one process per rank on its GPUs; a process ends only when it exits of its own accord, when a
//! stop asked for it is carried out after a random delay, or when its lost node comes back (its agent kills it) or
//! dies for good (fence timeout); the driver confirms a rank's end to the core only after its process is gone. Over
//! random submissions, passes, exits, cancels during eviction, node losses and returns, it checks that no GPU ever
//! runs processes of two jobs (or of two attempts of one job), that no job ever has two live attempts, and that the
//! core's invariants (resources conserved, nothing allocated twice) hold after every step. Commands the core must
//! refuse (a report of an attempt that is not the live one, a stale start, a cancel of an unknown job) are refused and
//! change nothing.

use gpunet_core::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone)]
enum Op {
    Submit {
        gpus: u8,
        tasks: u8,
        prio: i8,
        restarts: u8,
    },
    Pass,
    /// A live process exits on its own (`ok`: code 0).
    Exit {
        pick: u16,
        ok: bool,
    },
    /// A process whose stop was asked ends (its SIGTERM handler finished).
    StopDone {
        pick: u16,
    },
    Cancel {
        pick: u16,
    },
    Lose {
        node: u8,
    },
    /// The lost node's agent returns: it kills the processes the server no longer wants, then confirms.
    Return {
        node: u8,
    },
    /// The lost node died for good: its processes are gone; the fence times out.
    FenceTimeout {
        node: u8,
    },
    /// A command the core must refuse (or ignore) arrives — a report of an attempt that is not the live one (late or
    /// forged), a start of a job that runs or has ended, a cancel of an unknown job — and must change nothing.
    Refused {
        pick: u16,
        kind: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..=2, 1u8..=2, 0i8..4, 0u8..2).prop_map(|(gpus, tasks, prio, restarts)| Op::Submit {
            gpus,
            tasks,
            prio,
            restarts
        }),
        4 => Just(Op::Pass),
        2 => (any::<u16>(), proptest::bool::weighted(0.6)).prop_map(|(pick, ok)| Op::Exit { pick, ok }),
        3 => any::<u16>().prop_map(|pick| Op::StopDone { pick }),
        1 => any::<u16>().prop_map(|pick| Op::Cancel { pick }),
        1 => (0u8..3).prop_map(|node| Op::Lose { node }),
        1 => (0u8..3).prop_map(|node| Op::Return { node }),
        1 => (0u8..3).prop_map(|node| Op::FenceTimeout { node }),
        2 => (any::<u16>(), 0u8..4).prop_map(|(pick, kind)| Op::Refused { pick, kind }),
    ]
}

/// One process: a rank of an attempt, on its node's GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Proc {
    job: JobId,
    attempt: u32,
    rank: u32,
    node: NodeId,
    mask: u64,
}

struct Model {
    s: ClusterState,
    procs: BTreeSet<Proc>,
    now: Time,
    next: u64,
    /// Start decisions already applied: applying one again is a stale decision.
    started: Vec<Decision>,
}

impl Model {
    fn check(&self) -> Result<(), TestCaseError> {
        self.s.check_invariants().map_err(TestCaseError::fail)?;
        let mut on_gpu: BTreeMap<(NodeId, u32), (JobId, u32)> = BTreeMap::new();
        let mut attempts: BTreeMap<JobId, u32> = BTreeMap::new();
        for p in &self.procs {
            for g in 0..64 {
                if p.mask & (1 << g) == 0 {
                    continue;
                }
                if let Some(o) = on_gpu.insert((p.node, g), (p.job, p.attempt)) {
                    prop_assert_eq!(o, (p.job, p.attempt), "GPU {} of {} runs two jobs' processes", g, p.node);
                }
            }
            if let Some(a) = attempts.insert(p.job, p.attempt) {
                prop_assert_eq!(a, p.attempt, "{} has two live attempts", p.job);
            }
        }
        Ok(())
    }

    /// Launches the processes of the decisions' starts (the agents do that once they see the task set).
    fn launch(&mut self, ds: &[Decision]) {
        for d in ds {
            if let Decision::Start { job, placement, .. } = d {
                let attempt = self.s.job(*job).unwrap().attempt();
                for (rank, t) in placement.tasks.iter().enumerate() {
                    self.procs.insert(Proc { job: *job, attempt, rank: rank as u32, node: t.node, mask: t.gpu_mask });
                }
            }
        }
    }

    /// A process is gone: the driver confirms its rank's end.
    fn gone(&mut self, p: Proc, end: RankEnd) -> Result<(), TestCaseError> {
        self.procs.remove(&p);
        self.s.rank_ended(p.job, p.attempt, p.rank, end, self.now).map_err(|e| TestCaseError::fail(e.to_string()))?;
        Ok(())
    }

    fn pick(&self, pick: u16, stopping: bool) -> Option<Proc> {
        let v: Vec<Proc> = self
            .procs
            .iter()
            .copied()
            .filter(|p| {
                let j = self.s.job(p.job).unwrap();
                let lost = self.s.node(p.node).unwrap().state == NodeState::Lost;
                !lost && j.is_stopping() == stopping
            })
            .collect();
        (!v.is_empty()).then(|| v[pick as usize % v.len()])
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_gpu_never_runs_two_jobs_and_a_job_never_has_two_live_attempts(ops in proptest::collection::vec(op(), 1..120)) {
        let mut cfg = SchedConfig::with_policy(Policy::Priority);
        cfg.preemption.min_run_time = Dur::ZERO;
        cfg.preemption.max_per_interval = 1000;
        cfg.restart_backoff = Dur::ZERO;
        let mut s = ClusterState::new(cfg).unwrap();
        for n in 0..3 {
            s.add_node(NodeSpec::with_gpus(format!("n{n}"), GpuModel::A100_80GB, 2, MilliCpu::cores(16), MiB::gib(128)))
                .unwrap();
        }
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        let mut m = Model { s, procs: BTreeSet::new(), now: Time::ZERO, next: 1, started: Vec::new() };
        for op in ops {
            m.now = m.now + Dur::from_secs(1);
            match op {
                Op::Submit { gpus, tasks, prio, restarts } => {
                    let mut spec = JobSpec::new(t, "j", gpus as u32, tasks as u32).priority(prio as i32);
                    spec.max_restarts = restarts as u32;
                    spec.topology = TopologyScope::Any;
                    m.s.submit(JobId(m.next), spec, m.now).unwrap();
                    m.next += 1;
                }
                Op::Pass => {
                    let ds = schedule(&m.s, m.now);
                    for d in &ds {
                        m.s.apply_decision(d, m.now).unwrap();
                    }
                    m.launch(&ds);
                    m.started.extend(ds.into_iter().filter(|d| matches!(d, Decision::Start { .. })));
                }
                Op::Exit { pick, ok } => {
                    if let Some(p) = m.pick(pick, false) {
                        m.gone(p, RankEnd::Exited { success: ok })?;
                    }
                }
                Op::StopDone { pick } => {
                    if let Some(p) = m.pick(pick, true) {
                        m.gone(p, RankEnd::Stopped)?;
                    }
                }
                Op::Cancel { pick } => {
                    let ids: Vec<JobId> = m.s.jobs().filter(|j| !j.state.is_terminal()).map(|j| j.id).collect();
                    if !ids.is_empty() {
                        let id = ids[pick as usize % ids.len()];
                        if m.s.job(id).unwrap().state == JobState::Running {
                            m.s.request_stop(id, StopCause::Cancelled, m.now).unwrap();
                        } else {
                            m.s.cancel(id, m.now).unwrap();
                        }
                    }
                }
                Op::Lose { node } => {
                    let id = NodeId(node as u32);
                    if m.s.node(id).unwrap().state == NodeState::Ready {
                        m.s.node_lost(id, m.now).unwrap();
                    }
                }
                Op::Return { node } => {
                    let id = NodeId(node as u32);
                    if m.s.node(id).unwrap().state == NodeState::Lost {
                        m.s.set_node_state(id, NodeState::Ready, m.now).unwrap();
                        // Every process there belongs to an attempt asked to stop: the agent kills it, then says so.
                        let there: Vec<Proc> = m.procs.iter().copied().filter(|p| p.node == id).collect();
                        for p in there {
                            prop_assert!(m.s.job(p.job).unwrap().is_stopping());
                            m.gone(p, RankEnd::Stopped)?;
                        }
                    }
                }
                Op::Refused { pick, kind } => {
                    let before = format!("{:?}", m.s);
                    let refused = match kind {
                        // The rank's end, reported for an attempt other than its live one.
                        0 | 1 => match m.procs.iter().nth(pick as usize % m.procs.len().max(1)).copied() {
                            Some(p) => {
                                let wrong = if kind == 0 { p.attempt + 1 } else { p.attempt.wrapping_sub(1) };
                                // Refused as `Ok(None)` ("not the live attempt; nothing to do"), so agents may repeat.
                                let r = m.s.rank_ended(p.job, wrong, p.rank, RankEnd::Exited { success: true }, m.now);
                                matches!(r, Err(_) | Ok(None))
                            }
                            None => true,
                        },
                        // A start decided earlier, applied again while its job runs or has ended. (A queued job
                        // may be started by any placement that fits: that is a new decision, not a stale one.)
                        2 => {
                            let stale: Vec<Decision> = m
                                .started
                                .iter()
                                .filter(|d| match d {
                                    Decision::Start { job, .. } => {
                                        !m.s.job(*job).unwrap().state.can_become(JobState::Running)
                                    }
                                    _ => false,
                                })
                                .cloned()
                                .collect();
                            match stale.get(pick as usize % stale.len().max(1)) {
                                Some(d) => m.s.apply_decision(d, m.now).is_err(),
                                None => true,
                            }
                        }
                        _ => m.s.cancel(JobId(u64::from(pick) + 1_000_000), m.now).is_err(),
                    };
                    prop_assert!(refused, "the core accepted a command it must refuse ({:?})", op);
                    prop_assert_eq!(before, format!("{:?}", m.s), "a refused command changed the state");
                }
                Op::FenceTimeout { node } => {
                    let id = NodeId(node as u32);
                    if m.s.node(id).unwrap().state == NodeState::Lost {
                        // The fence may only expire once the machine's processes are really gone.
                        m.procs.retain(|p| p.node != id);
                        m.s.fence_expired(id, m.now).unwrap();
                    }
                }
            }
            m.check()?;
            // Conservation: every running job's live ranks have their processes, and nothing else runs.
            for j in m.s.jobs().filter(|j| j.state == JobState::Running) {
                let live = m.s.live_ranks(j.id);
                let procs: Vec<u32> = m.procs.iter().filter(|p| p.job == j.id).map(|p| p.rank).collect();
                let lost: Vec<u32> = j.run.as_ref().unwrap().placement.tasks.iter().enumerate()
                    .filter(|(_, t)| m.s.node(t.node).unwrap().state == NodeState::Lost)
                    .map(|(i, _)| i as u32).collect();
                for r in &procs {
                    prop_assert!(live.contains(r), "{} rank {} runs but was confirmed ended", j.id, r);
                }
                for r in &live {
                    prop_assert!(procs.contains(r) || lost.contains(r), "{} rank {} is live without a process", j.id, r);
                }
            }
            for p in &m.procs {
                prop_assert_eq!(m.s.job(p.job).unwrap().state, JobState::Running, "a process of a job not running");
            }
        }
    }
}
