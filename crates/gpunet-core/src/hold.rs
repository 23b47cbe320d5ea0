//! Holds (Slurm's `sbatch --hold`, `scontrol hold` and `release`): a queued job that is kept out of scheduling until
//! it is released.
//!
//! A held job keeps its state (Pending, Preempted or Restarting) but sits in no tenant queue and is not waiting for
//! its dependencies: it is in `ClusterState::held`, so it costs the scheduling pass nothing and is never started
//! (`ClusterState::start` refuses it). It still counts against its tenant's queued-job limit. Releasing it puts it
//! where a new job would go: its queue, or the dependency wait — or Failed, when a dependency can no longer be
//! satisfied (the same cascade as at submit, [`crate::depend`]).
//!
//! A job submitted with `JobSpec::hold` starts held. Holding an array holds its waiting head and every element it
//! expands until released (`ArrayRec::held`); releasing the array releases its head. A running job cannot be held:
//! cancel or preempt it instead.

use crate::error::CoreError;
use crate::ids::{JobId, TenantId};
use crate::job::JobState;
use crate::state::ClusterState;
use crate::units::Time;

impl ClusterState {
    /// Holds a queued job (Pending, Preempted or Restarting, in its queue or waiting for dependencies), or an array
    /// that has not ended. Holding a held job is refused, so that a caller learns it changed nothing.
    pub fn hold(&mut self, id: JobId) -> Result<(), CoreError> {
        let refuse = |why: String| CoreError::NotHoldable { action: "hold", job: id, why };
        if let Some(r) = self.arrays.get_mut(&id) {
            if r.finished.is_some() || r.stopped {
                return Err(refuse(format!("the array is {}; only one with elements still to run", r.summary_state())));
            }
            if r.held {
                return Err(refuse("the array is held already".into()));
            }
            r.held = true;
            if let Some(h) = r.head {
                self.hold_job(h).map_err(|_| refuse("its waiting element could not be held".into()))?;
            }
            return Ok(());
        }
        let j = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?;
        if j.held {
            return Err(refuse("the job is held already".into()));
        }
        if !j.state.is_queued() {
            return Err(refuse(format!(
                "the job is {}; only a queued job (pending, preempted or restarting) can be held",
                j.state
            )));
        }
        self.hold_job(id)
    }

    /// Releases a held job (or array): it goes where a new job would, its queue or the dependency wait, or fails at
    /// once when a dependency can never be satisfied any more (see [`ClusterState::take_cascades`]).
    pub fn release_hold(&mut self, id: JobId, now: Time) -> Result<(), CoreError> {
        let refuse = |why: &str| CoreError::NotHoldable { action: "release", job: id, why: why.into() };
        if let Some(r) = self.arrays.get_mut(&id) {
            if !r.held {
                return Err(refuse("the array is not held"));
            }
            r.held = false;
            let head = r.head;
            if let Some(h) = head.filter(|h| self.held.contains(h)) {
                self.release_job(h, now);
            }
            self.array_advance(id, now);
            return Ok(());
        }
        let j = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?;
        if !j.held {
            return Err(refuse("the job is not held"));
        }
        self.release_job(id, now);
        Ok(())
    }

    /// Whether a job (or an array) is held.
    pub fn is_held(&self, id: JobId) -> bool {
        self.held.contains(&id) || self.arrays.get(&id).is_some_and(|r| r.held)
    }

    /// An array's expanded element that has not started yet (its *head*, see [`crate::array`]), if any.
    pub fn array_head(&self, id: JobId) -> Option<JobId> {
        self.arrays.get(&id)?.head
    }

    /// Held jobs, by id.
    pub fn held_jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        self.held.iter().copied()
    }

    /// A tenant's held jobs, in O(1).
    pub fn tenant_held(&self, tenant: TenantId) -> usize {
        self.held_per_tenant.get(&tenant).copied().unwrap_or(0)
    }

    /// Moves a queued, unheld job out of its queue (or the dependency wait) into the held set.
    fn hold_job(&mut self, id: JobId) -> Result<(), CoreError> {
        let j = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?.clone();
        if j.held || !j.state.is_queued() {
            return Err(CoreError::NotHoldable { action: "hold", job: id, why: format!("it is {}", j.state) });
        }
        if !self.dep_wait_remove(id) {
            self.dequeue(&j);
        }
        self.forget_claims(id);
        self.jobs.get_mut(&id).expect("looked up above").held = true;
        self.hold_insert(id);
        Ok(())
    }

    /// Takes a held job out of the held set and puts it where a new one would go.
    fn release_job(&mut self, id: JobId, now: Time) {
        self.held_remove(id);
        let j = self.jobs.get_mut(&id).expect("a held job exists");
        j.held = false;
        if j.state == JobState::Pending {
            self.queue_or_wait(id, now);
        } else {
            // Preempted or Restarting: it ran, so its dependencies were met.
            let j = j.clone();
            self.enqueue(&j);
        }
    }

    /// Records a job (marked held) in the held set.
    pub(crate) fn hold_insert(&mut self, id: JobId) {
        if self.held.insert(id) {
            *self.held_per_tenant.entry(self.jobs[&id].spec.tenant).or_default() += 1;
        }
    }

    /// Takes a job out of the held set (its mark is the caller's); whether it was there.
    pub(crate) fn held_remove(&mut self, id: JobId) -> bool {
        if !self.held.remove(&id) {
            return false;
        }
        if let Some(n) = self.jobs.get(&id).and_then(|j| self.held_per_tenant.get_mut(&j.spec.tenant)) {
            *n -= 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::depend::Cascade;
    use crate::job::{DepKind, Dependency};
    use crate::schedule::testkit::*;

    fn one_node() -> ClusterState {
        cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 8)], &["a"])
    }

    fn pass(s: &mut ClusterState, now: u64) {
        s.step(Time(now)).unwrap();
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_job_submitted_held_never_starts_until_released() {
        let mut s = one_node();
        let mut spec = JobSpec::new(t0(), "held", 1, 1);
        spec.hold = true;
        s.submit(JobId(1), spec, Time(0)).unwrap();
        pass(&mut s, 1);
        assert_eq!(s.job(JobId(1)).unwrap().state, JobState::Pending);
        assert!(s.is_held(JobId(1)));
        assert_eq!(s.queued_count(), 0, "a held job is in no queue");
        assert_eq!(s.tenant_queued_count(t0()), 1, "but counts against the tenant's queued-job limit");
        let e = explain(&s, JobId(1), Time(1)).unwrap();
        assert_eq!(e.reason, PendingReason::Held);
        assert!(e.message.contains("gpunet release"), "{}", e.message);
        s.release_hold(JobId(1), Time(2)).unwrap();
        pass(&mut s, 3);
        assert_eq!(s.job(JobId(1)).unwrap().state, JobState::Running);
        assert!(!s.is_held(JobId(1)));
    }

    #[test]
    fn hold_and_release_a_queued_job_and_refuse_what_does_not_apply() {
        let mut s = one_node();
        s.submit(JobId(1), JobSpec::new(t0(), "big", 8, 1), Time(0)).unwrap();
        s.submit(JobId(2), JobSpec::new(t0(), "next", 8, 1), Time(0)).unwrap();
        pass(&mut s, 1);
        assert!(s.hold(JobId(1)).unwrap_err().to_string().contains("is running"));
        s.hold(JobId(2)).unwrap();
        assert!(s.hold(JobId(2)).unwrap_err().to_string().contains("held already"));
        assert!(s.release_hold(JobId(1), Time(2)).unwrap_err().to_string().contains("not held"));
        assert!(s.hold(JobId(9)).is_err());
        s.check_invariants().unwrap();
        s.finish(JobId(1), Time(5), true).unwrap();
        pass(&mut s, 6);
        assert_eq!(s.job(JobId(2)).unwrap().state, JobState::Pending, "held while the node is free");
        s.release_hold(JobId(2), Time(7)).unwrap();
        pass(&mut s, 8);
        assert_eq!(s.job(JobId(2)).unwrap().state, JobState::Running);
    }

    #[test]
    fn cancelling_and_restoring_a_held_job_keep_the_books() {
        let mut s = one_node();
        let mut spec = JobSpec::new(t0(), "held", 1, 1);
        spec.hold = true;
        s.submit(JobId(1), spec.clone(), Time(0)).unwrap();
        s.submit(JobId(2), spec, Time(0)).unwrap();
        s.cancel(JobId(1), Time(1)).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.tenant_held(t0()), 1);
        // Restored as stored, the job is held again.
        let mut r = one_node();
        for j in s.jobs() {
            r.restore(j.clone(), Time(2)).unwrap();
        }
        r.check_invariants().unwrap();
        assert!(r.is_held(JobId(2)));
        pass(&mut r, 3);
        assert_eq!(r.job(JobId(2)).unwrap().state, JobState::Pending);
    }

    #[test]
    fn a_released_job_whose_dependency_failed_meanwhile_fails_with_the_reason() {
        let mut s = one_node();
        let mut first = JobSpec::new(t0(), "first", 1, 1);
        first.max_restarts = 0;
        s.submit(JobId(1), first, Time(0)).unwrap();
        let mut dep = JobSpec::new(t0(), "second", 1, 1);
        dep.dependencies = crate::job::thin_vec![Dependency { kind: DepKind::AfterOk, jobs: vec![JobId(1)] }];
        s.submit(JobId(2), dep, Time(0)).unwrap();
        s.hold(JobId(2)).unwrap();
        assert!(s.dependency_waiting().next().is_none(), "a held job does not wait on its dependencies");
        pass(&mut s, 1);
        s.finish(JobId(1), Time(2), false).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.job(JobId(2)).unwrap().state, JobState::Pending, "held, it is not failed meanwhile");
        s.release_hold(JobId(2), Time(3)).unwrap();
        let j = s.job(JobId(2)).unwrap();
        assert_eq!(j.state, JobState::Failed);
        assert!(j.end_reason.as_deref().unwrap_or("").contains("job-1"), "{:?}", j.end_reason);
        assert!(s.take_cascades().contains(&Cascade::DependencyFailed(JobId(2))));
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_held_array_expands_nothing_until_released() {
        let mut s = one_node();
        let mut spec = JobSpec::new(t0(), "sweep", 1, 1);
        spec.array = Some(Box::new(crate::job::ArraySpec { indices: (0..4).collect(), limit: Some(2) }));
        s.submit(JobId(10), spec, Time(0)).unwrap();
        s.hold(JobId(10)).unwrap();
        pass(&mut s, 1);
        assert_eq!(s.running_count(), 0);
        assert!(s.is_held(JobId(10)) && s.is_held(JobId(11)), "the array and its waiting head");
        assert_eq!(explain(&s, JobId(10), Time(1)).unwrap().reason, PendingReason::Held);
        s.release_hold(JobId(10), Time(2)).unwrap();
        pass(&mut s, 3);
        assert_eq!(s.running_count(), 2, "released, it runs up to its limit");
        // Held again while elements run: the running ones go on, the next is expanded held.
        s.hold(JobId(10)).unwrap();
        s.finish(JobId(11), Time(4), true).unwrap();
        pass(&mut s, 5);
        assert_eq!(s.running_count(), 1);
        assert!(s.is_held(JobId(13)), "the element expanded while the array is held is held");
        s.release_hold(JobId(10), Time(6)).unwrap();
        pass(&mut s, 7);
        assert_eq!(s.running_count(), 2);
    }
}
