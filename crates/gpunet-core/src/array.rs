//! Job arrays (Slurm's `--array 0-99:2%8`): one submission of many like elements that costs the scheduling pass one
//! queue entry, however many elements it has.
//!
//! An array with id `A` and `n` indices owns the job ids `A+1 ..= A+n` (element `k` — the `k`-th index — is job
//! `A+1+k`; the driver reserves the ids). Elements are *expanded* (made real Pending jobs) one at a time: the array
//! keeps at most one expanded element that has not started (its *head*, which sits in the tenant queue like any job);
//! when the head starts, the next element is expanded, as long as fewer than the array's limit are *live* (expanded
//! and not ended). The pass starts further elements of the same shape right behind a head it placed
//! (`Pass::run`), so an array fills free room in one pass while only its head ever waits in a queue. Once
//! started, an element is an ordinary job (restarts, preemption, cancel).
//!
//! The array itself is not a job of the state: [`ClusterState::array`] summarises it. It ends when every element
//! has ended; a dependency on its id is satisfied by that end (`afterok`: every element succeeded).

use crate::depend::Cascade;
use crate::error::CoreError;
use crate::ids::JobId;
use crate::job::{Job, JobSpec, JobState};
use crate::state::ClusterState;
use crate::units::Time;
use serde::{Deserialize, Serialize};

/// What the state keeps of an array.
#[derive(Debug, Clone)]
pub(crate) struct ArrayRec {
    /// The submitted spec (with `array` set); elements get it without `array`.
    pub(crate) spec: JobSpec,
    pub(crate) submitted: Time,
    /// Elements expanded so far (the next is position `next`).
    pub(crate) next: usize,
    /// Expanded elements that have not ended.
    pub(crate) live: u32,
    /// The expanded element that has not started yet, if any.
    pub(crate) head: Option<JobId>,
    pub(crate) succeeded: u32,
    pub(crate) failed: u32,
    pub(crate) cancelled: u32,
    /// No more elements are expanded (the array was cancelled, or an element's dependency can never be met).
    pub(crate) stopped: bool,
    /// The array was cancelled: its live elements are stopping, and it ends Cancelled once they are gone.
    pub(crate) cancelled_by_request: bool,
    pub(crate) finished: Option<Time>,
    /// Held: each element is expanded held (see [`crate::hold`]).
    pub(crate) held: bool,
}

impl ArrayRec {
    pub(crate) fn len(&self) -> usize {
        self.spec.array.as_ref().map_or(0, |a| a.indices.len())
    }

    pub(crate) fn limit(&self) -> u32 {
        self.spec.array.as_ref().and_then(|a| a.limit).unwrap_or(u32::MAX)
    }

    /// Whether elements may still be expanded.
    pub(crate) fn expands(&self) -> bool {
        !self.stopped && self.next < self.len()
    }

    /// The array's state as one job's: Pending or Running until every element ended, then Succeeded when all
    /// succeeded, Cancelled when it was cancelled, Failed otherwise.
    pub(crate) fn summary_state(&self) -> JobState {
        match self.finished {
            None if self.live > 0 && self.head.is_none() => JobState::Running,
            None => JobState::Pending,
            Some(_) if self.succeeded as usize == self.len() => JobState::Succeeded,
            Some(_) if self.cancelled > 0 && self.failed == 0 => JobState::Cancelled,
            Some(_) => JobState::Failed,
        }
    }
}

/// An array as drivers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayView {
    /// The array's id.
    pub id: JobId,
    /// Summary state (see the module docs).
    pub state: JobState,
    /// Elements in all.
    pub total: usize,
    /// Elements expanded so far.
    pub expanded: usize,
    /// Expanded elements that have not ended.
    pub live: u32,
    /// Most live at once (`None`: no limit).
    pub limit: Option<u32>,
    /// Elements that succeeded.
    pub succeeded: u32,
    /// Elements that failed.
    pub failed: u32,
    /// Elements cancelled (once the array ended, with those never expanded).
    pub cancelled: u32,
    /// When the last element ended.
    pub finished: Option<Time>,
    /// Cancelled while elements still run: they are stopping, and the array ends once they are gone.
    pub cancelling: bool,
}

impl ClusterState {
    /// Submits an array: checks its ids are free and expands its first element.
    pub(crate) fn submit_array(&mut self, id: JobId, spec: JobSpec, now: Time) -> Result<(), CoreError> {
        let n = spec.array.as_ref().map_or(0, |a| a.indices.len()) as u64;
        let last = JobId(id.0.checked_add(n).ok_or(CoreError::DuplicateJob(id))?);
        if (id.0..=last.0).any(|j| self.jobs.contains_key(&JobId(j)))
            || self.arrays.range(..=last).next_back().is_some_and(|(a, r)| a.0 + r.len() as u64 >= id.0)
        {
            return Err(CoreError::DuplicateJob(id));
        }
        let held = spec.hold;
        self.arrays.insert(
            id,
            ArrayRec {
                spec,
                submitted: now,
                next: 0,
                live: 0,
                head: None,
                succeeded: 0,
                failed: 0,
                cancelled: 0,
                stopped: false,
                cancelled_by_request: false,
                finished: None,
                held,
            },
        );
        self.array_advance(id, now);
        Ok(())
    }

    /// The array `id` belongs to as an element, and its position: `(array, k)` for job `array + 1 + k`.
    pub(crate) fn element_slot(&self, id: JobId) -> Option<(JobId, usize)> {
        let (a, r) = self.arrays.range(..id).next_back()?;
        let pos = id.0 - a.0 - 1;
        (pos < r.len() as u64).then_some((*a, pos as usize))
    }

    /// The job an array's element at position `k` would be, expanded or not.
    pub(crate) fn element_job(&self, array: JobId, k: usize) -> Option<Job> {
        let r = self.arrays.get(&array)?;
        let idx = *r.spec.array.as_ref()?.indices.get(k)?;
        let mut spec = r.spec.clone();
        spec.array = None;
        let mut j = Job::new(JobId(array.0 + 1 + k as u64), spec, r.submitted);
        j.array_of = Some((array, idx));
        j.held = r.held;
        Some(j)
    }

    /// Expands the array's next element if it has no head and is below its limit; ends the array when every
    /// element has ended.
    pub(crate) fn array_advance(&mut self, id: JobId, now: Time) {
        let Some(r) = self.arrays.get(&id) else { return };
        if r.head.is_none() && r.expands() && r.live < r.limit() {
            let job = self.element_job(id, r.next).expect("position below len");
            let eid = job.id;
            let r = self.arrays.get_mut(&id).expect("looked up above");
            r.next += 1;
            r.live += 1;
            r.head = Some(eid);
            self.jobs.insert(eid, Box::new(job));
            self.cascades.push(Cascade::Expanded(eid));
            self.queue_or_wait(eid, now);
            return;
        }
        if r.finished.is_none() && r.live == 0 && !r.expands() {
            let r = self.arrays.get_mut(&id).expect("looked up above");
            // Elements never expanded count as cancelled.
            r.cancelled += (r.len() - r.next) as u32;
            r.finished = Some(now);
            self.cascades.push(Cascade::ArrayEnded(id));
            self.job_ended_array(id, now);
        }
    }

    fn job_ended_array(&mut self, id: JobId, now: Time) {
        // The array's own id in the work list: what waits on the array is checked again.
        self.job_ended(id, now);
    }

    /// An element started: the array expands its next element.
    pub(crate) fn element_started(&mut self, array: JobId, id: JobId, now: Time) {
        if let Some(r) = self.arrays.get_mut(&array) {
            if r.head == Some(id) {
                r.head = None;
                self.array_advance(array, now);
            }
        }
    }

    /// An element ended (called from the end work list).
    pub(crate) fn element_ended(&mut self, array: JobId, id: JobId, now: Time) {
        let Some(state) = self.jobs.get(&id).map(|j| (j.state, j.end_reason.is_some())) else { return };
        let Some(r) = self.arrays.get_mut(&array) else { return };
        r.live = r.live.saturating_sub(1);
        if r.head == Some(id) {
            r.head = None;
        }
        match state {
            (JobState::Succeeded, _) => r.succeeded += 1,
            (JobState::Cancelled, _) => r.cancelled += 1,
            (_, dep) => {
                r.failed += 1;
                // An element's dependency can never be met: neither can the next one's.
                r.stopped |= dep;
            }
        }
        self.array_advance(array, now);
    }

    /// Stops an array from expanding more elements and returns its live elements, for the driver to cancel each
    /// (queued ones at once with [`ClusterState::cancel`], running ones through their stop). The array ends when the
    /// last of them has ended.
    pub fn cancel_array(&mut self, id: JobId, now: Time) -> Result<Vec<JobId>, CoreError> {
        let r = self.arrays.get_mut(&id).ok_or(CoreError::UnknownJob(id))?;
        if r.finished.is_some() {
            return Err(CoreError::InvalidTransition { job: id, from: r.summary_state(), to: JobState::Cancelled });
        }
        r.stopped = true;
        r.cancelled_by_request = true;
        let n = r.next as u64;
        let live: Vec<JobId> = (0..n)
            .map(|k| JobId(id.0 + 1 + k))
            .filter(|e| self.jobs.get(e).is_some_and(|j| !j.state.is_terminal()))
            .collect();
        self.array_advance(id, now);
        Ok(live)
    }

    /// An array, summarised.
    pub fn array(&self, id: JobId) -> Option<ArrayView> {
        let r = self.arrays.get(&id)?;
        Some(ArrayView {
            id,
            state: r.summary_state(),
            total: r.len(),
            expanded: r.next,
            live: r.live,
            limit: r.spec.array.as_ref().and_then(|a| a.limit),
            succeeded: r.succeeded,
            failed: r.failed,
            cancelled: r.cancelled,
            finished: r.finished,
            cancelling: r.cancelled_by_request && r.finished.is_none(),
        })
    }

    /// The array a job id belongs to as an element (expanded or not).
    pub fn array_of_element(&self, id: JobId) -> Option<JobId> {
        self.element_slot(id).map(|(a, _)| a)
    }

    /// The array's spec as submitted.
    pub fn array_spec(&self, id: JobId) -> Option<&JobSpec> {
        self.arrays.get(&id).map(|r| &r.spec)
    }

    /// The job id of the array element with index `index` (expanded or not).
    pub fn element_id(&self, array: JobId, index: u32) -> Option<JobId> {
        let r = self.arrays.get(&array)?;
        let k = r.spec.array.as_ref()?.indices.binary_search(&index).ok()?;
        Some(JobId(array.0 + 1 + k as u64))
    }

    /// Restores an array (at recovery, before its elements): `job` is the array's record as the driver stored it.
    pub(crate) fn restore_array(&mut self, job: &Job) {
        self.arrays.insert(
            job.id,
            ArrayRec {
                spec: job.spec.clone(),
                submitted: job.submitted,
                next: 0,
                live: 0,
                head: None,
                succeeded: 0,
                failed: 0,
                cancelled: 0,
                stopped: job.state == JobState::Cancelled || job.state == JobState::Failed,
                cancelled_by_request: job.state == JobState::Cancelled,
                finished: None,
                held: job.held,
            },
        );
    }

    /// Counts a restored element in its array.
    pub(crate) fn restore_element(&mut self, job: &Job) -> Result<(), CoreError> {
        let (parent, pos) = self.element_slot(job.id).ok_or(CoreError::UnknownJob(job.id))?;
        let r = self.arrays.get_mut(&parent).expect("slot found");
        r.next = r.next.max(pos + 1);
        match job.state {
            JobState::Succeeded => r.succeeded += 1,
            JobState::Cancelled => r.cancelled += 1,
            JobState::Failed => {
                r.failed += 1;
                r.stopped |= job.end_reason.is_some();
            }
            s => {
                r.live += 1;
                if s == JobState::Pending && job.attempt() == 0 {
                    r.head = Some(job.id);
                }
            }
        }
        Ok(())
    }

    /// For the pass: the array elements that may start right behind `head` (an array's head placed in this pass),
    /// in order, up to the array's limit, as `(job id, index)`; the head's job with these stands for each.
    pub(crate) fn elements_behind(&self, head: &Job) -> impl Iterator<Item = (JobId, u32)> + '_ {
        let (array, room, from, indices) = match head.array_of.and_then(|(a, _)| self.arrays.get(&a).map(|r| (a, r))) {
            Some((a, r)) if r.head == Some(head.id) && !r.stopped => {
                let room = r.limit().saturating_sub(r.live) as usize;
                let indices: &[u32] = r.spec.array.as_ref().map_or(&[], |x| &x.indices);
                (a, room.min(r.len() - r.next), r.next, indices)
            }
            _ => (head.id, 0, 0, &[][..]),
        };
        (from..from + room).map(move |k| (JobId(array.0 + 1 + k as u64), indices[k]))
    }
}

impl ClusterState {
    /// The arrays' invariants: live elements counted right and within the limit, the head pending, the books
    /// balanced.
    pub(crate) fn check_arrays(&self) -> Result<(), String> {
        for (a, r) in &self.arrays {
            let mut live = 0u32;
            let mut running = 0u32;
            let mut ended = [0u32; 3];
            for k in 0..r.next as u64 {
                let Some(j) = self.jobs.get(&JobId(a.0 + 1 + k)) else { continue };
                match j.state {
                    JobState::Succeeded => ended[0] += 1,
                    JobState::Failed => ended[1] += 1,
                    JobState::Cancelled => ended[2] += 1,
                    JobState::Running => {
                        live += 1;
                        running += 1
                    }
                    _ => live += 1,
                }
            }
            if live != r.live || live > r.limit() || running > r.limit() {
                return Err(format!(
                    "{a}: {live} live elements ({running} running), counted {}, limit {}",
                    r.live,
                    r.limit()
                ));
            }
            if let Some(h) = r.head {
                if self.jobs.get(&h).map(|j| j.state) != Some(JobState::Pending) {
                    return Err(format!("{a}: head {h} is not pending"));
                }
            }
            if r.finished.is_some() && (live > 0 || r.expands()) {
                return Err(format!("{a}: ended with {live} live elements"));
            }
            let _ = ended;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::job::{ArraySpec, DepKind, Dependency};
    use crate::schedule::testkit::*;

    fn array(n: u32, limit: Option<u32>) -> JobSpec {
        let mut s = JobSpec::new(t0(), "sweep", 1, 1);
        s.array = Some(Box::new(ArraySpec { indices: (0..n).collect(), limit }));
        s
    }

    #[test]
    fn one_queue_entry_fills_the_room_in_one_pass_within_its_limit() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 8)], &["a"]);
        submit(&mut s, 10, array(10_000, Some(5)), 0);
        assert_eq!(s.queued_count(), 1, "one queue entry for 10,000 elements");
        assert_eq!(s.jobs().count(), 1, "only the head is expanded");
        let ds = s.step(Time::ZERO).unwrap();
        assert_eq!(started(&ds), vec![11, 12, 13, 14, 15], "the limit of 5 is honoured in one pass");
        s.check_invariants().unwrap();
        assert_eq!(s.queued_count(), 0, "at the limit, no element waits in a queue");
        let e = explain(&s, JobId(10), Time::ZERO).unwrap();
        assert_eq!(e.reason, PendingReason::ArrayLimit { live: 5, limit: 5 });
        s.finish(JobId(12), Time::from_secs(5), true).unwrap();
        assert_eq!(s.job(JobId(16)).unwrap().array_of, Some((JobId(10), 5)));
        assert_eq!(started(&s.step(Time::from_secs(5)).unwrap()), vec![16]);
        s.check_invariants().unwrap();
        let v = s.array(JobId(10)).unwrap();
        assert_eq!((v.state, v.expanded, v.live, v.succeeded), (JobState::Running, 6, 5, 1));
    }

    #[test]
    fn a_waiting_array_of_10000_elements_costs_the_pass_one_job() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "hold", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, array(10_000, None), 1);
        let (ds, stats) = schedule_with_stats(&s, Time::from_secs(2));
        assert!(ds.iter().all(|d| !matches!(d, Decision::Start { .. })));
        assert_eq!((stats.considered, stats.placement_attempts), (1, 1), "{stats:?}");
        assert_eq!(s.jobs().count(), 2, "one running job and the array's head");
    }

    #[test]
    fn an_array_ends_when_its_elements_do_and_releases_its_dependents() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 8)], &["a"]);
        let mut spec = array(3, None);
        spec.array.as_mut().unwrap().indices = vec![1, 3, 7];
        submit(&mut s, 1, spec, 0);
        assert_eq!(s.element_id(JobId(1), 7), Some(JobId(4)));
        let mut after = JobSpec::new(t0(), "reduce", 1, 1);
        after.dependencies = crate::job::thin_vec![Dependency { kind: DepKind::AfterOk, jobs: vec![JobId(1)] }];
        submit(&mut s, 5, after, 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![2, 3, 4]);
        assert_eq!(s.job(JobId(4)).unwrap().array_of, Some((JobId(1), 7)));
        for (i, t) in [(2, 1), (3, 2)] {
            s.finish(JobId(i), Time::from_secs(t), true).unwrap();
        }
        assert!(started(&s.step(Time::from_secs(3)).unwrap()).is_empty(), "one element still runs");
        s.finish(JobId(4), Time::from_secs(4), true).unwrap();
        assert_eq!(s.array(JobId(1)).unwrap().state, JobState::Succeeded);
        assert_eq!(started(&s.step(Time::from_secs(4)).unwrap()), vec![5]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn cancelling_an_array_stops_expansion_and_ends_it() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, array(100, None), 0);
        s.step(Time::ZERO).unwrap();
        let live = s.cancel_array(JobId(1), Time::from_secs(1)).unwrap();
        assert_eq!(live, vec![JobId(2), JobId(3), JobId(4)], "two running and the pending head");
        assert!(s.array(JobId(1)).unwrap().cancelling, "its elements are still to stop");
        for j in live {
            s.cancel(j, Time::from_secs(1)).unwrap();
        }
        let v = s.array(JobId(1)).unwrap();
        assert!(!v.cancelling, "ended");
        assert_eq!((v.state, v.cancelled, v.finished), (JobState::Cancelled, 100, Some(Time::from_secs(1))));
        assert_eq!(s.queued_count(), 0);
        s.check_invariants().unwrap();
        // Its ids stay taken.
        assert!(s.submit(JobId(101), JobSpec::new(t0(), "x", 1, 1), Time::ZERO).is_err());
        assert!(s.submit(JobId(102), JobSpec::new(t0(), "x", 1, 1), Time::ZERO).is_ok());
    }

    /// A running element whose GPUs cannot be taken back is refused before it counts in its array; restored again
    /// as waiting (as the server does), it counts once.
    #[test]
    fn a_running_element_refused_at_restore_counts_once_when_restored_waiting() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, array(10, Some(3)), 0);
        s.step(Time::ZERO).unwrap();
        let mut element = s.job(JobId(2)).unwrap().clone();
        assert_eq!(element.state, JobState::Running);
        let parent = crate::job::Job::new(JobId(1), array(10, Some(3)), Time::ZERO);
        // The node is gone: the element's placement cannot be taken back.
        let mut r = cluster(cfg(Policy::Fifo), vec![], &["a"]);
        r.restore(parent, Time::from_secs(1)).unwrap();
        assert!(r.restore(element.clone(), Time::from_secs(1)).is_err());
        assert_eq!(r.array(JobId(1)).unwrap().live, 0, "a refused element is not counted");
        element.state = JobState::Restarting;
        element.run = None;
        r.restore(element, Time::from_secs(1)).unwrap();
        assert_eq!(r.array(JobId(1)).unwrap().live, 1);
    }

    #[test]
    fn restore_rebuilds_an_array_from_its_elements() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, array(10, Some(3)), 0);
        s.step(Time::ZERO).unwrap();
        s.finish(JobId(2), Time::from_secs(1), true).unwrap();
        let mut parent = crate::job::Job::new(JobId(1), array(10, Some(3)), Time::ZERO);
        parent.state = JobState::Pending;
        let mut r = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        r.restore(parent, Time::from_secs(1)).unwrap();
        let mut jobs: Vec<_> = s.jobs().cloned().collect();
        jobs.sort_by_key(|j| j.id);
        for j in jobs {
            r.restore(j, Time::from_secs(1)).unwrap();
        }
        r.resolve_restored(Time::from_secs(1));
        r.check_invariants().unwrap();
        assert_eq!(r.array(JobId(1)), s.array(JobId(1)));
        assert_eq!(schedule(&r, Time::from_secs(2)), schedule(&s, Time::from_secs(2)));
    }
}
