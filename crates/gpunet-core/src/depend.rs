//! Job dependencies (Slurm's `--dependency afterok|afterany|afternotok|singleton`): which jobs a job waits for, and
//! what happens when those end.
//!
//! A job whose dependencies are not all satisfied is Pending but sits in no tenant queue: it waits in
//! `ClusterState::dep_waiting`, indexed under each job it waits for (`ClusterState::dependents`), so that it costs the
//! scheduling pass nothing. When a job (or a whole array) ends, the jobs waiting on it are checked again: all
//! satisfied, the job enters its queue ([`Cascade::Released`]); one that can never be satisfied (`afterok` on a job
//! that failed or was cancelled, `afternotok` on one that succeeded) fails the job with a reason naming it
//! ([`Cascade::DependencyFailed`], `Job::end_reason`), which may in turn end jobs that wait on it. The driver takes
//! these side effects with [`ClusterState::take_cascades`]. Ends are processed from a work list, so a long chain
//! costs no stack.
//!
//! A dependency must name jobs that exist when it is submitted (so there are no cycles); an array's id stands for all
//! its elements, and one element may be named by its own id.

use crate::error::CoreError;
use crate::ids::JobId;
use crate::job::{DepKind, JobSpec, JobState};
use crate::state::ClusterState;
use crate::units::Time;
use serde::{Deserialize, Serialize};

/// A side effect of an event on jobs other than the one the event was about, for the driver to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "job", rename_all = "snake_case")]
pub enum Cascade {
    /// An array element was expanded: a new Pending job (see [`crate::array`]).
    Expanded(JobId),
    /// Its dependencies are satisfied: the job entered its queue.
    Released(JobId),
    /// One of its dependencies can never be satisfied: the job failed (`Job::end_reason` says which).
    DependencyFailed(JobId),
    /// Every element of this array ended.
    ArrayEnded(JobId),
}

/// What a job's dependencies would come to were it submitted now ([`ClusterState::dependencies_if_submitted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyCheck {
    /// All satisfied (or none): it would be queued.
    Met,
    /// It would wait for these jobs, in these states now.
    Waits(Vec<crate::schedule::DepWait>),
    /// It would fail at once: why.
    Never(String),
}

/// What a job's dependencies come to now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DepOutcome {
    /// All satisfied.
    Met,
    /// Not yet: these jobs have not ended.
    Wait(Vec<(DepKind, JobId)>),
    /// Never: the reason.
    Never(String),
}

impl ClusterState {
    /// The state a dependency sees for `target`: a job's, an array's summary, or an element's not yet expanded
    /// (Pending, or Cancelled once its array expands no more). `None` when no such job exists.
    pub(crate) fn dep_state(&self, target: JobId) -> Option<JobState> {
        if let Some(j) = self.jobs.get(&target) {
            return Some(j.state);
        }
        if let Some(a) = self.arrays.get(&target) {
            return Some(a.summary_state());
        }
        let (parent, pos) = self.element_slot(target)?;
        let a = &self.arrays[&parent];
        Some(if pos < a.next || !a.expands() { JobState::Cancelled } else { JobState::Pending })
    }

    /// Whether `id` names a job, an array, or an element of an array.
    pub(crate) fn job_known(&self, id: JobId) -> bool {
        self.jobs.contains_key(&id) || self.arrays.contains_key(&id) || self.element_slot(id).is_some()
    }

    /// What `spec`'s dependencies come to now.
    pub(crate) fn deps_outcome(&self, spec: &JobSpec) -> DepOutcome {
        let mut wait = Vec::new();
        for d in &spec.dependencies {
            for t in &d.jobs {
                let Some(s) = self.dep_state(*t) else {
                    return DepOutcome::Never(format!("dependency {} {t}: the job no longer exists", d.kind));
                };
                match d.kind.outcome(s) {
                    Some(true) => {}
                    Some(false) => {
                        return DepOutcome::Never(format!(
                            "dependency {} {t} can never be satisfied: {t} ended {s}",
                            d.kind
                        ))
                    }
                    None => wait.push((d.kind, *t)),
                }
            }
        }
        if wait.is_empty() {
            DepOutcome::Met
        } else {
            DepOutcome::Wait(wait)
        }
    }

    /// What `spec`'s dependencies would come to were it submitted now as `id`, checked as [`ClusterState::submit`]
    /// checks them (a job named that does not exist is an error; `singleton` names the earlier unfinished jobs of its
    /// name and tenant): what a dry run answers from the whole state, whose copy for a replay lacks the jobs that
    /// ended, the held ones and the queue past its first jobs.
    pub fn dependencies_if_submitted(&self, id: JobId, spec: &JobSpec) -> Result<DependencyCheck, CoreError> {
        let mut spec = spec.clone();
        self.resolve_new_deps(id, &mut spec)?;
        Ok(match self.deps_outcome(&spec) {
            DepOutcome::Met => DependencyCheck::Met,
            DepOutcome::Never(why) => DependencyCheck::Never(why),
            DepOutcome::Wait(w) => DependencyCheck::Waits(self.dep_waits(w)),
        })
    }

    /// The jobs waited for, each with the state a dependency sees of it now (`why`'s and a dry run's list).
    pub(crate) fn dep_waits(&self, waits: Vec<(DepKind, JobId)>) -> Vec<crate::schedule::DepWait> {
        waits
            .into_iter()
            .map(|(kind, job)| crate::schedule::DepWait {
                kind,
                job,
                state: self.dep_state(job).unwrap_or(JobState::Pending),
            })
            .collect()
    }

    /// Checks a new job's dependencies against what exists: each named job must exist (a job is never its own
    /// dependency), and `singleton` becomes the earlier unfinished jobs of the same name and tenant.
    pub(crate) fn resolve_new_deps(&self, id: JobId, spec: &mut JobSpec) -> Result<(), CoreError> {
        for d in &mut spec.dependencies {
            if d.kind == DepKind::Singleton {
                let mut same: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.id < id && !j.state.is_terminal())
                    .filter(|j| j.spec.tenant == spec.tenant && j.spec.name == spec.name)
                    .map(|j| j.id)
                    .collect();
                same.sort();
                d.jobs = same;
                continue;
            }
            for t in &d.jobs {
                if *t == id || !self.job_known(*t) {
                    return Err(CoreError::UnknownDependency(*t));
                }
            }
        }
        Ok(())
    }

    /// Puts a new Pending job where its dependencies say: its queue, the dependency wait, or Failed at once.
    /// A held job goes to the held set instead (its dependencies are looked at once it is released).
    pub(crate) fn queue_or_wait(&mut self, id: JobId, now: Time) {
        let job = &self.jobs[&id];
        if job.held {
            self.hold_insert(id);
            return;
        }
        if job.spec.dependencies.is_empty() {
            let j = job.clone();
            self.enqueue(&j);
            return;
        }
        match self.deps_outcome(&job.spec) {
            DepOutcome::Met => {
                let j = job.clone();
                self.enqueue(&j);
            }
            DepOutcome::Wait(targets) => self.wait_on(id, targets.iter().map(|(_, t)| *t)),
            DepOutcome::Never(reason) => self.fail_dependency(id, reason, now),
        }
    }

    fn wait_on(&mut self, id: JobId, targets: impl Iterator<Item = JobId>) {
        if self.dep_waiting.insert(id) {
            *self.dep_waiting_per_tenant.entry(self.jobs[&id].spec.tenant).or_default() += 1;
        }
        for t in targets {
            self.dependents.entry(t).or_default().push(id);
        }
    }

    /// A Pending job waiting on dependencies is restored (at recovery): it waits on every job it names until
    /// [`ClusterState::resolve_restored`] checks them all.
    pub(crate) fn restore_waiting(&mut self, id: JobId) {
        let targets: Vec<JobId> = self.jobs[&id].spec.dependencies.iter().flat_map(|d| d.jobs.clone()).collect();
        self.wait_on(id, targets.into_iter());
    }

    /// Fails a job waiting on dependencies with `reason`, and lets what waits on it know.
    fn fail_dependency(&mut self, id: JobId, reason: String, now: Time) {
        self.dep_wait_remove(id);
        let j = self.jobs.get_mut(&id).expect("caller checked");
        if j.transition(JobState::Failed).is_err() {
            return;
        }
        j.finished = Some(now);
        j.end_reason = Some(reason);
        self.cascades.push(Cascade::DependencyFailed(id));
        self.job_ended(id, now);
    }

    /// A job reached a terminal state: its array counts it, and what waits on it (or on its array) is checked again.
    /// Every path to a terminal state calls this once.
    pub(crate) fn job_ended(&mut self, id: JobId, now: Time) {
        self.note_changed(id);
        self.ended_work.push(id);
        if self.ending {
            return;
        }
        self.ending = true;
        while let Some(id) = self.ended_work.pop() {
            if let Some((parent, _)) = self.jobs.get(&id).and_then(|j| j.array_of) {
                self.element_ended(parent, id, now);
            }
            let Some(waiters) = self.dependents.remove(&id) else { continue };
            for w in waiters {
                self.recheck(w, now);
            }
        }
        self.ending = false;
    }

    /// Checks a waiting job's dependencies again.
    fn recheck(&mut self, w: JobId, now: Time) {
        if !self.dep_waiting.contains(&w) {
            return;
        }
        match self.deps_outcome(&self.jobs[&w].spec) {
            DepOutcome::Met => {
                self.dep_wait_remove(w);
                let j = self.jobs[&w].clone();
                self.enqueue(&j);
                self.cascades.push(Cascade::Released(w));
            }
            DepOutcome::Wait(_) => {}
            DepOutcome::Never(reason) => self.fail_dependency(w, reason, now),
        }
    }

    /// After recovery: every restored job waiting on dependencies is checked, and every array expands what it may.
    pub fn resolve_restored(&mut self, now: Time) {
        let waiting: Vec<JobId> = self.dep_waiting.iter().copied().collect();
        for w in waiting {
            self.recheck(w, now);
        }
        let arrays: Vec<JobId> = self.arrays.keys().copied().collect();
        for a in arrays {
            self.array_advance(a, now);
        }
    }

    /// The jobs that `job` still waits for, with how (empty when it waits for none).
    pub fn waiting_for(&self, job: JobId) -> Vec<(DepKind, JobId)> {
        if !self.dep_waiting.contains(&job) {
            return Vec::new();
        }
        match self.deps_outcome(&self.jobs[&job].spec) {
            DepOutcome::Wait(w) => w,
            _ => Vec::new(),
        }
    }

    /// Takes a job out of the dependency wait; whether it was there.
    pub(crate) fn dep_wait_remove(&mut self, id: JobId) -> bool {
        if !self.dep_waiting.remove(&id) {
            return false;
        }
        if let Some(n) = self.jobs.get(&id).and_then(|j| self.dep_waiting_per_tenant.get_mut(&j.spec.tenant)) {
            *n -= 1;
        }
        true
    }

    /// A tenant's jobs waiting for dependencies (they count against its queued-job limits like queued ones).
    pub fn tenant_dependency_waiting(&self, tenant: crate::ids::TenantId) -> usize {
        self.dep_waiting_per_tenant.get(&tenant).copied().unwrap_or(0)
    }

    /// Whether `id` waits for a dependency (Pending, in no queue).
    pub fn is_dependency_waiting(&self, id: JobId) -> bool {
        self.dep_waiting.contains(&id)
    }

    /// Jobs waiting for dependencies (Pending, in no queue), by id.
    pub fn dependency_waiting(&self) -> impl Iterator<Item = JobId> + '_ {
        self.dep_waiting.iter().copied()
    }

    /// Takes the side effects recorded since the last call (see [`Cascade`]), in order.
    pub fn take_cascades(&mut self) -> Vec<Cascade> {
        std::mem::take(&mut self.cascades)
    }
}

#[cfg(test)]
mod tests {
    use crate::job::{DepKind, Dependency};
    use crate::schedule::testkit::*;

    fn after(kind: DepKind, ids: &[u64]) -> crate::job::ThinVec<Dependency> {
        crate::job::thin_vec![Dependency { kind, jobs: ids.iter().map(|i| JobId(*i)).collect() }]
    }

    fn one_node() -> ClusterState {
        cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 4)], &["a"])
    }

    #[test]
    fn afterok_waits_outside_the_queue_then_starts_after_success() {
        let mut s = one_node();
        submit(&mut s, 1, JobSpec::new(t0(), "first", 1, 1), 0);
        let mut dep = JobSpec::new(t0(), "second", 1, 1);
        dep.dependencies = after(DepKind::AfterOk, &[1]);
        submit(&mut s, 2, dep, 0);
        assert_eq!(s.queued_count(), 1, "the dependent is in no queue");
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1], "room for both, yet only the first starts");
        let e = explain(&s, JobId(2), Time::ZERO).unwrap();
        assert!(matches!(&e.reason, PendingReason::Dependency { waiting_for } if waiting_for[0].job == JobId(1)));
        assert_eq!(e.message, "dependency: waits for afterok job-1 (running)");
        s.check_invariants().unwrap();
        s.finish(JobId(1), Time::from_secs(5), true).unwrap();
        assert_eq!(s.take_cascades(), vec![crate::depend::Cascade::Released(JobId(2))]);
        assert_eq!(started(&s.step(Time::from_secs(5)).unwrap()), vec![2]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_never_satisfiable_dependency_fails_the_chain_with_a_reason() {
        let mut s = one_node();
        let mut first = JobSpec::new(t0(), "first", 1, 1);
        first.max_restarts = 0;
        submit(&mut s, 1, first, 0);
        let mut b = JobSpec::new(t0(), "b", 1, 1);
        b.dependencies = after(DepKind::AfterOk, &[1]);
        submit(&mut s, 2, b, 0);
        let mut c = JobSpec::new(t0(), "c", 1, 1);
        c.dependencies = after(DepKind::AfterAny, &[2]);
        submit(&mut s, 3, c, 0);
        let mut d = JobSpec::new(t0(), "d", 1, 1);
        d.dependencies = after(DepKind::AfterNotOk, &[1]);
        submit(&mut s, 4, d, 0);
        s.step(Time::ZERO).unwrap();
        assert_eq!(s.finish(JobId(1), Time::from_secs(3), false).unwrap(), JobState::Failed);
        let b = s.job(JobId(2)).unwrap();
        assert_eq!(b.state, JobState::Failed);
        assert_eq!(
            b.end_reason.as_deref(),
            Some("dependency afterok job-1 can never be satisfied: job-1 ended failed")
        );
        assert_eq!(s.job(JobId(3)).unwrap().state, JobState::Pending, "afterany of a failed job is satisfied");
        assert_eq!(started(&s.step(Time::from_secs(3)).unwrap()), vec![3, 4]);
        let e = explain(&s, JobId(2), Time::from_secs(3)).unwrap();
        assert!(e.message.contains("can never be satisfied"), "{}", e.message);
        s.check_invariants().unwrap();
    }

    #[test]
    fn unknown_and_self_dependencies_are_refused_without_a_trace() {
        let mut s = one_node();
        let mut spec = JobSpec::new(t0(), "x", 1, 1);
        spec.dependencies = after(DepKind::AfterOk, &[7]);
        assert_eq!(
            s.submit(JobId(7), spec.clone(), Time::ZERO).unwrap_err().to_string(),
            "find dependency job-7: no such job"
        );
        assert!(s.job(JobId(7)).is_none());
        spec.dependencies = after(DepKind::AfterOk, &[]);
        assert!(s.submit(JobId(8), spec, Time::ZERO).unwrap_err().to_string().contains("dependency"));
        s.check_invariants().unwrap();
    }

    /// What a dry run asks: a job's dependencies, were it submitted now, as the submission would see them; the state
    /// is not changed.
    #[test]
    fn dependencies_if_submitted_say_met_waits_or_never_as_a_submission_would() {
        use crate::depend::DependencyCheck::{Met, Never, Waits};
        use crate::schedule::DepWait;
        let mut s = one_node();
        submit(&mut s, 1, JobSpec::new(t0(), "done", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "running", 1, 1), 0);
        submit(&mut s, 3, JobSpec::new(t0(), "nightly", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        s.finish(JobId(1), Time::from_secs(1), true).unwrap();
        let check = |kind, ids: &[u64]| {
            let mut spec = JobSpec::new(t0(), "nightly", 1, 1);
            spec.dependencies = after(kind, ids);
            s.dependencies_if_submitted(JobId(99), &spec)
        };
        assert_eq!(check(DepKind::AfterOk, &[1]).unwrap(), Met);
        let running = DepWait { kind: DepKind::AfterOk, job: JobId(2), state: JobState::Running };
        assert_eq!(check(DepKind::AfterOk, &[1, 2]).unwrap(), Waits(vec![running]));
        assert_eq!(
            check(DepKind::AfterNotOk, &[1]).unwrap(),
            Never("dependency afternotok job-1 can never be satisfied: job-1 ended succeeded".into())
        );
        let single = DepWait { kind: DepKind::Singleton, job: JobId(3), state: JobState::Running };
        assert_eq!(check(DepKind::Singleton, &[]).unwrap(), Waits(vec![single]));
        assert_eq!(check(DepKind::AfterOk, &[7]).unwrap_err().to_string(), "find dependency job-7: no such job");
        assert!(s.job(JobId(99)).is_none() && s.waiting_for(JobId(99)).is_empty());
        s.check_invariants().unwrap();
    }

    #[test]
    fn singleton_waits_for_earlier_jobs_of_its_name_and_tenant_only() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 4)], &["a", "b"]);
        submit(&mut s, 1, JobSpec::new(t0(), "nightly", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(TenantId(1), "nightly", 1, 1), 0);
        let mut single = JobSpec::new(t0(), "nightly", 1, 1);
        single.dependencies = crate::job::thin_vec![Dependency { kind: DepKind::Singleton, jobs: vec![] }];
        submit(&mut s, 3, single, 0);
        assert_eq!(s.waiting_for(JobId(3)), vec![(DepKind::Singleton, JobId(1))]);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1, 2]);
        s.cancel(JobId(1), Time::from_secs(1)).unwrap();
        assert_eq!(started(&s.step(Time::from_secs(1)).unwrap()), vec![3]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn cancelling_a_waiting_job_and_restoring_one_keep_the_books() {
        let mut s = one_node();
        submit(&mut s, 1, JobSpec::new(t0(), "a", 1, 1), 0);
        let mut b = JobSpec::new(t0(), "b", 1, 1);
        b.dependencies = after(DepKind::AfterOk, &[1]);
        submit(&mut s, 2, b.clone(), 0);
        submit(&mut s, 3, b, 0);
        assert_eq!(s.tenant_queued_count(t0()), 3, "waiting jobs count against the tenant's queued-job limit");
        s.cancel(JobId(3), Time::ZERO).unwrap();
        assert_eq!(s.tenant_queued_count(t0()), 2);
        s.check_invariants().unwrap();
        // Restored in any order, the waiting job waits again until resolved.
        let docs: Vec<_> = s.jobs().cloned().collect();
        let mut r = one_node();
        for j in docs.into_iter().rev() {
            r.restore(j, Time::ZERO).unwrap();
        }
        r.resolve_restored(Time::ZERO);
        r.check_invariants().unwrap();
        assert_eq!(r.waiting_for(JobId(2)), vec![(DepKind::AfterOk, JobId(1))]);
        r.step(Time::ZERO).unwrap();
        r.finish(JobId(1), Time::from_secs(1), true).unwrap();
        assert_eq!(started(&r.step(Time::from_secs(1)).unwrap()), vec![2]);
    }
}
