//! Predictions from the live state: replay it forward on a virtual clock with the same scheduler and lifecycle,
//! running jobs ending at their estimated ends, stopping attempts confirmed at once, and no new arrivals, to say when a
//! queued job should start. Pure, like the rest of the core: the server answers ETAs with it.

use crate::{schedule, ClusterState, Decision, JobId, JobState, Placement, Time};
use std::collections::{HashMap, HashSet};

/// When `job` is predicted to start, and where, or `None` when that cannot be told (a running job without an
/// estimate stands in the way, or nothing would change within `max_steps` completions).
pub fn predict_start(state: &ClusterState, job: JobId, now: Time, max_steps: usize) -> Option<(Time, Placement)> {
    let j = state.job(job)?;
    if j.state == JobState::Running {
        return j.run.as_ref().map(|r| (now, r.placement.clone()));
    }
    let mut out = None;
    replay(state, now, max_steps, |started, t, p| {
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
    replay(state, now, max_steps, |started, t, _| {
        if want.remove(&started) {
            out.insert(started, t);
        }
        want.is_empty()
    });
    out
}

/// Replays the state forward: each scheduling pass's starts are reported to `seen` (which answers whether to stop),
/// then the clock advances to the next estimated completion or restart backoff. Stops when nothing more can be told.
fn replay(state: &ClusterState, now: Time, max_steps: usize, mut seen: impl FnMut(JobId, Time, &Placement) -> bool) {
    let mut s = state.clone();
    let mut t = now;
    // Attempts being stopped end first (their stop time is not known: the ETA is optimistic by that much).
    let stopping: Vec<JobId> = s.jobs().filter(|j| j.is_stopping()).map(|j| j.id).collect();
    for j in stopping {
        if s.end_attempt(j, t).is_err() {
            return;
        }
    }
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
        }
        // Advance to the next estimated completion (or restart backoff), finishing everything due then.
        let next_end = s.running_ends().next().map(|(e, _)| e);
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
        let due: Vec<JobId> = s.running_ends().take_while(|(e, _)| *e <= t).map(|(_, j)| j).collect();
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
}
