//! Shared fixtures of the pass's unit tests: a small cluster builder and the names the tests use.

pub(crate) use super::{
    explain, explain_queue, queue_order, schedule, schedule_with_stats, Decision, Explanation, PendingReason,
    PreemptReason,
};
pub(crate) use crate::config::{Policy, PreemptionConfig, SchedConfig};
pub(crate) use crate::gpu::GpuModel;
pub(crate) use crate::ids::{JobId, NodeId, TenantId};
pub(crate) use crate::job::{
    Elastic, JobSpec, JobState, Placement, SelectorTerm, TaskPlacement, Toleration, TopologyScope,
};
pub(crate) use crate::node::{NodeSpec, NodeState};
pub(crate) use crate::state::ClusterState;
pub(crate) use crate::tenant::{Quota, TenantSpec};
pub(crate) use crate::units::{Dur, MiB, MilliCpu, Time};
pub(crate) use std::collections::BTreeSet;

pub(crate) fn cfg(policy: Policy) -> SchedConfig {
    SchedConfig {
        preemption: PreemptionConfig { enabled: false, ..Default::default() },
        ..SchedConfig::with_policy(policy)
    }
}

/// `policy` with preemption on, victims protected for `min_run_time`.
pub(crate) fn preempting(policy: Policy, min_run_time: Dur) -> SchedConfig {
    SchedConfig {
        preemption: PreemptionConfig { enabled: true, min_run_time, ..Default::default() },
        ..SchedConfig::with_policy(policy)
    }
}

pub(crate) fn node(name: &str, model: GpuModel, gpus: usize) -> NodeSpec {
    NodeSpec::with_gpus(name, model, gpus, MilliCpu::cores(64), MiB::gib(1024)).label("zone", "z1").label("rack", "r1")
}

pub(crate) fn cluster(c: SchedConfig, nodes: Vec<NodeSpec>, tenants: &[&str]) -> ClusterState {
    let mut s = ClusterState::new(c).unwrap();
    for n in nodes {
        s.add_node(n).unwrap();
    }
    for t in tenants {
        s.add_tenant(TenantSpec::new(*t)).unwrap();
    }
    s
}

pub(crate) fn started(ds: &[Decision]) -> Vec<u64> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Start { job, .. } => Some(job.0),
            _ => None,
        })
        .collect()
}

/// The jobs a pass evicts, in its order.
pub(crate) fn preempted(ds: &[Decision]) -> Vec<JobId> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Preempt { job, .. } => Some(*job),
            _ => None,
        })
        .collect()
}

pub(crate) fn t0() -> TenantId {
    TenantId(0)
}

pub(crate) fn submit(s: &mut ClusterState, id: u64, spec: JobSpec, at: u64) {
    s.submit(JobId(id), spec, Time::from_secs(at)).unwrap();
}

/// Applies a pass's decisions at `now` and checks the invariants; then the running jobs whose id is `round` modulo 3
/// end `step` later, which is returned as the next pass's time (the property tests' way of moving a cluster on).
pub(crate) fn apply_and_end_some(s: &mut ClusterState, ds: &[Decision], now: Time, round: u64, step: Dur) -> Time {
    for d in ds {
        s.apply(d, now).unwrap();
    }
    s.check_invariants().unwrap();
    let ending: Vec<JobId> =
        s.jobs().filter(|j| j.state == JobState::Running && j.id.0 % 3 == round % 3).map(|j| j.id).collect();
    let then = now + step;
    for id in ending {
        s.finish(id, then, true).unwrap();
    }
    then
}

/// Runs one pass at `now` with `set` applied to it first (tests turn a shortcut off with it), and returns the pass to
/// read what it decided and counted.
pub(super) fn run_pass<'a>(s: &'a ClusterState, now: Time, set: impl FnOnce(&mut super::Pass<'a>)) -> super::Pass<'a> {
    let mut p = super::Pass::new(s, now, None);
    set(&mut p);
    p.run();
    p
}

/// A property-test runner with a fixed seed (the same cases on every run), for `cases` cases.
pub(crate) fn det_runner(cases: u32) -> proptest::test_runner::TestRunner {
    let config = proptest::test_runner::Config { cases, ..Default::default() };
    let rng = proptest::test_runner::TestRng::deterministic_rng(config.rng_algorithm);
    proptest::test_runner::TestRunner::new_with_rng(config, rng)
}
