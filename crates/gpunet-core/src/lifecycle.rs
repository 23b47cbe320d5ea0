//! The job lifecycle after a scheduling decision, shared by both drivers (the server and the simulator).
//!
//! The rule: **resources are released only when the attempt holding them is confirmed ended**, on every path —
//! preemption, cancellation, a rank's failure, node drain, node loss. A decision only *asks* for the end.
//!
//! ```text
//! attempt:  Running ──rank exits 0 (all ranks)──────────────────────────────► ended: Succeeded
//!              │
//!              ├─ stop asked (preempt, cancel, drain, a rank failed) ─► Stopping ─ every rank confirmed gone ─► ended
//!              └─ node lost ─► Stopping (fenced) ─ agent back and confirms, or fence timeout ─────────────────► ended
//! ```
//! While an attempt is stopping, the job stays `Running` and keeps its GPUs, CPU and memory: the pass neither places
//! on them nor counts them as free (it may reserve them for the job the eviction is made for, which starts the
//! moment they are confirmed free). A job therefore has at most one live attempt: attempt N+1 is never started
//! before attempt N is confirmed ended. What the job becomes is chosen when its attempt ends, from why it was
//! stopped ([`StopCause`]): preempted or drained → `Preempted` (queued, progress kept to the last checkpoint),
//! cancelled → `Cancelled`, a rank's own failure → `Restarting` with backoff while restarts are left (only these
//! count against `max_restarts`), else `Failed`; node lost or interrupted → queued again as `Preempted` without a
//! restart charge.
//!
//! Who confirms: live, the agent reports each rank's process group (and cgroup) gone; for a lost node, its return
//! with the old tasks killed, or the fence timeout ([`ClusterState::fence_expired`]). In simulation, the engine
//! confirms after a modelled stop time. The functions here are the same for both; only the clock differs.

use crate::error::CoreError;
use crate::ids::{JobId, NodeId};
use crate::job::JobState;
use crate::node::NodeState;
use crate::schedule::Decision;
use crate::state::ClusterState;
use crate::units::{Dur, Time};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How long a stopping attempt's processes have between SIGTERM and SIGKILL: the longest a stop takes, live (the
/// agent) and in simulation (the simulator's stop times are capped at it).
pub const STOP_GRACE: Dur = Dur::from_secs(10);

/// Why the end of an attempt was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StopCause {
    /// Evicted, for the waiting job `for_job` when there is one: it resumes later from its last checkpoint.
    Preempted {
        /// The job the room is made for.
        for_job: Option<JobId>,
    },
    /// Its node is draining: it resumes later elsewhere from its last checkpoint.
    Drained,
    /// Cancelled by a user or admin.
    Cancelled,
    /// One of its ranks failed (non-zero exit, signal, OOM, failed probe): the other ranks are stopped, then the job
    /// restarts under its restart policy. The only cause that counts against `max_restarts`.
    Failed {
        /// The first rank that failed.
        rank: u32,
    },
    /// A node of the attempt was lost: its tasks there are fenced until the agent confirms them gone or the fence
    /// times out; then the job is queued again without a restart charge.
    NodeLost {
        /// The lost node.
        node: NodeId,
    },
    /// A rank was stopped by its node without being asked (agent shut down): queued again without a restart charge.
    Interrupted,
}

impl StopCause {
    /// Short lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            StopCause::Preempted { .. } => "preempted",
            StopCause::Drained => "drained",
            StopCause::Cancelled => "cancelled",
            StopCause::Failed { .. } => "failed",
            StopCause::NodeLost { .. } => "node_lost",
            StopCause::Interrupted => "interrupted",
        }
    }

    /// Whether a later cause replaces this one while the attempt is stopping. A user's cancel wins over every other
    /// cause; otherwise the first cause decides what the job becomes.
    fn yields_to(self, later: StopCause) -> bool {
        later == StopCause::Cancelled && self != StopCause::Cancelled
    }
}

impl fmt::Display for StopCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one rank of an attempt ended, as its driver confirms it: every process of the rank is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankEnd {
    /// It exited of its own accord; `success` means exit code 0.
    Exited {
        /// Exit code 0.
        success: bool,
    },
    /// It was stopped (its end was asked for, or its node stopped it) and is gone.
    Stopped,
}

/// The confirmed end of an attempt and what the job became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptEnded {
    /// The job.
    pub job: JobId,
    /// The attempt that ended.
    pub attempt: u32,
    /// Why it was stopped; `None` when every rank exited 0 of its own accord.
    pub cause: Option<StopCause>,
    /// The job's state now.
    pub state: JobState,
}

impl ClusterState {
    /// Applies a scheduling decision the way both drivers do: a start takes its resources at once; a preemption only
    /// *asks* for the victim's end ([`ClusterState::request_stop`]) — the victim keeps its resources until its end is
    /// confirmed, and the job the room is made for gets the first claim on them.
    pub fn apply_decision(&mut self, d: &Decision, now: Time) -> Result<(), CoreError> {
        match d {
            Decision::Preempt { job, for_job, reason } => {
                self.request_stop(*job, StopCause::Preempted { for_job: Some(*for_job) }, now)?;
                self.note_moving(*job, *for_job, reason);
                self.note_preemption_for(*for_job);
                Ok(())
            }
            _ => self.apply(d, now),
        }
    }

    /// A job evicted to be moved (defragmentation) is noted with where it goes, so that its room is kept while it
    /// stops and it gets the first claim on it once its attempt ends (`ClusterState::moving`).
    pub(crate) fn note_moving(&mut self, job: JobId, for_job: JobId, reason: &crate::PreemptReason) {
        if let crate::PreemptReason::Defragment { to, room, .. } = reason {
            self.moving.insert(job, to.clone());
            if self.jobs.get(&for_job).is_some_and(|j| j.state.is_queued()) {
                self.moving_for.insert(for_job, room.clone());
            }
        }
    }

    /// Asks for the end of a running job's current attempt. Its resources stay allocated until every rank is
    /// confirmed ended; it is no longer a preemption victim. Returns whether the cause was recorded (a second request
    /// keeps the first cause, except that a cancel replaces any other).
    pub fn request_stop(&mut self, id: JobId, cause: StopCause, now: Time) -> Result<bool, CoreError> {
        let j = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?;
        if j.state != JobState::Running {
            let to = match cause {
                StopCause::Cancelled => JobState::Cancelled,
                StopCause::Failed { .. } => JobState::Failed,
                _ => JobState::Preempted,
            };
            return Err(CoreError::InvalidTransition { job: id, from: j.state, to });
        }
        let run = self.jobs.get_mut(&id).and_then(|j| j.run.as_mut()).expect("running job has a run");
        let recorded = match run.stop {
            None => {
                run.stop = Some(cause);
                true
            }
            Some(old) if old.yields_to(cause) => {
                run.stop = Some(cause);
                true
            }
            Some(_) => false,
        };
        if !self.evicting.contains(&id) {
            self.begin_eviction(id)?;
            if matches!(cause, StopCause::Preempted { .. }) {
                self.note_preemption(now);
            }
        }
        Ok(recorded)
    }

    /// Confirms that one rank of attempt `attempt` ended (all its processes are gone). A failed rank asks for the end
    /// of the others. When every rank is confirmed ended, the attempt ends: its resources are released and the job
    /// moves on (see the module docs). Reports for another attempt, an unknown rank or a rank already ended change
    /// nothing and return `Ok(None)`, so drivers may repeat them.
    pub fn rank_ended(
        &mut self,
        id: JobId,
        attempt: u32,
        rank: u32,
        end: RankEnd,
        now: Time,
    ) -> Result<Option<AttemptEnded>, CoreError> {
        let j = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?;
        if j.state != JobState::Running || j.attempt() != attempt {
            return Ok(None);
        }
        let run = j.run.as_ref().expect("running job has a run");
        let tasks = run.placement.tasks.len();
        if rank as usize >= tasks || run.ended.binary_search(&rank).is_ok() {
            return Ok(None);
        }
        let stopping = run.stop.is_some();
        let cause = match end {
            RankEnd::Exited { success: false } if !stopping => Some(StopCause::Failed { rank }),
            RankEnd::Stopped if !stopping => Some(StopCause::Interrupted),
            _ => None,
        };
        let run = self.jobs.get_mut(&id).and_then(|j| j.run.as_mut()).expect("running job has a run");
        let at = run.ended.binary_search(&rank).unwrap_err();
        run.ended.insert(at, rank);
        run.all_ok &= end == RankEnd::Exited { success: true };
        let all = run.ended.len() == tasks;
        if let Some(c) = cause {
            self.request_stop(id, c, now)?;
        }
        if all {
            return self.end_attempt(id, now).map(Some);
        }
        Ok(None)
    }

    /// Ends a running job's current attempt: every rank is confirmed ended (ranks not reported through
    /// [`ClusterState::rank_ended`] count as stopped). Releases its resources and moves the job on according to why
    /// it was stopped; when every rank exited 0 of its own accord it `Succeeded` (unless it was cancelled).
    pub fn end_attempt(&mut self, id: JobId, now: Time) -> Result<AttemptEnded, CoreError> {
        let j = self.jobs.get(&id).ok_or(CoreError::UnknownJob(id))?;
        let run = j.run.as_ref().filter(|_| j.state == JobState::Running).ok_or(CoreError::InvalidTransition {
            job: id,
            from: j.state,
            to: JobState::Succeeded,
        })?;
        let attempt = j.attempt();
        // Every rank exited 0 of its own accord: the job is done, even if a stop (other than a cancel) was asked for
        // meanwhile.
        let completed = run.all_ok && run.ended.len() == run.placement.tasks.len();
        let cause = match run.stop {
            Some(StopCause::Cancelled) => Some(StopCause::Cancelled),
            _ if completed => None,
            None => Some(StopCause::Failed { rank: 0 }),
            c => c,
        };
        let state = match cause {
            None => self.finish_released(id, now, true)?,
            Some(StopCause::Failed { .. }) => self.finish_released(id, now, false)?,
            Some(StopCause::Preempted { .. } | StopCause::Drained) => self.requeue_released(id, now, false)?,
            Some(StopCause::NodeLost { .. } | StopCause::Interrupted) => self.requeue_released(id, now, true)?,
            Some(StopCause::Cancelled) => {
                self.release(id, now)?;
                let j = self.jobs.get_mut(&id).expect("released above");
                j.transition(JobState::Cancelled)?;
                j.run = None;
                j.finished = Some(now);
                self.job_ended(id, now);
                JobState::Cancelled
            }
        };
        if self.moving.contains_key(&id) {
            if state.is_queued() {
                self.note_preemption_for(id);
            } else {
                self.moving.remove(&id);
            }
        }
        Ok(AttemptEnded { job: id, attempt, cause, state })
    }

    /// A node is lost: the attempts with a task there are asked to end, and their tasks on it are fenced — their
    /// resources stay allocated until the node's agent confirms them gone ([`ClusterState::rank_ended`]) or the fence
    /// times out ([`ClusterState::fence_expired`]). Returns the jobs affected.
    pub fn node_lost(&mut self, node: NodeId, now: Time) -> Result<Vec<JobId>, CoreError> {
        self.set_node_state(node, NodeState::Lost, now)
    }

    /// The fence of a lost node timed out: its tasks are taken as gone (their ranks end as stopped). Returns the
    /// attempts that ended.
    pub fn fence_expired(&mut self, node: NodeId, now: Time) -> Result<Vec<AttemptEnded>, CoreError> {
        if self.node_states.get(node.index()) != Some(&NodeState::Lost) {
            return Err(CoreError::InvalidField {
                field: "node",
                value: node.to_string(),
                allowed: "a lost node".into(),
            });
        }
        let jobs: Vec<JobId> = self.node_jobs[node.index()].iter().copied().collect();
        let mut out = Vec::new();
        for id in jobs {
            let j = &self.jobs[&id];
            let attempt = j.attempt();
            let ranks: Vec<u32> = j.run.as_ref().map_or(Vec::new(), |r| {
                r.placement.tasks.iter().enumerate().filter(|(_, t)| t.node == node).map(|(i, _)| i as u32).collect()
            });
            for r in ranks {
                if let Some(e) = self.rank_ended(id, attempt, r, RankEnd::Stopped, now)? {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }

    /// A reclaim notice for a node (its provider takes it back at a deadline), the first of three steps both drivers
    /// take — the server on `POST /v1/nodes/{node}/reclaim` (`gpunet-server`'s `owner/pools.rs`), the simulator on
    /// a modelled spot notice: the node takes no new work (a ready node is cordoned; running attempts go on) and
    /// the jobs returned are to checkpoint now. Then [`ClusterState::reclaim_checkpointed`] for each job whose
    /// final checkpoint is safe, and at the deadline [`ClusterState::reclaim_deadline`].
    pub fn reclaim_notice(&mut self, node: NodeId, now: Time) -> Result<Vec<JobId>, CoreError> {
        let state = *self.node_states.get(node.index()).ok_or(CoreError::UnknownNode(node))?;
        if state == NodeState::Ready {
            self.set_node_state(node, NodeState::Cordoned, now)?;
        }
        let jobs = self.node_jobs[node.index()]
            .iter()
            .copied()
            .filter(|j| self.jobs.get(j).is_some_and(|j| j.state == JobState::Running && !j.is_stopping()))
            .collect();
        Ok(jobs)
    }

    /// A job on a reclaimed node has its final checkpoint of time `at` safe on its tiers: it is recorded (the job
    /// resumes from it) and the end of the attempt is asked for, as a drain (queued again without a restart
    /// charge). Returns whether the stop was recorded (false when it was already stopping).
    pub fn reclaim_checkpointed(&mut self, job: JobId, at: Time, now: Time) -> Result<bool, CoreError> {
        if !self.jobs.get(&job).is_some_and(|j| j.state == JobState::Running) {
            return Ok(false);
        }
        self.record_checkpoint(job, at)?;
        self.request_stop(job, StopCause::Drained, now)
    }

    /// The reclaim's deadline: the node drains, so whatever still runs there is asked to stop (it keeps only its
    /// work up to its last checkpoint). Returns the jobs asked to stop now.
    pub fn reclaim_deadline(&mut self, node: NodeId, now: Time) -> Result<Vec<JobId>, CoreError> {
        let before: Vec<JobId> =
            self.node_jobs.get(node.index()).ok_or(CoreError::UnknownNode(node))?.iter().copied().collect();
        let stopping: Vec<JobId> =
            before.iter().copied().filter(|j| self.jobs.get(j).is_some_and(|j| j.is_stopping())).collect();
        if self.node_states[node.index()] != NodeState::Lost {
            self.set_node_state(node, NodeState::Draining, now)?;
        }
        Ok(before.into_iter().filter(|j| !stopping.contains(j)).collect())
    }

    /// Ranks of a running job's current attempt that are not confirmed ended.
    pub fn live_ranks(&self, id: JobId) -> Vec<u32> {
        match self.jobs.get(&id).and_then(|j| j.run.as_ref()) {
            Some(r) => (0..r.placement.tasks.len() as u32).filter(|k| r.ended.binary_search(k).is_err()).collect(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    #[test]
    fn a_reclaim_cordons_then_drains_and_keeps_the_final_checkpoint() {
        let (mut s, t, n) = one_gpu_cluster();
        let a = JobId(1);
        s.submit(a, JobSpec::new(t, "a", 1, 1), Time::ZERO).unwrap();
        for d in crate::schedule(&s, Time::ZERO) {
            s.apply_decision(&d, Time::ZERO).unwrap();
        }
        assert_eq!(s.job(a).unwrap().state, JobState::Running);
        let jobs = s.reclaim_notice(n, Time::from_secs(10)).unwrap();
        assert_eq!(jobs, vec![a]);
        assert_eq!(s.node(n).unwrap().state, NodeState::Cordoned, "no new work, the job goes on");
        assert!(!s.job(a).unwrap().is_stopping());
        assert!(s.reclaim_checkpointed(a, Time::from_secs(12), Time::from_secs(12)).unwrap());
        assert_eq!(s.job(a).unwrap().run.as_ref().unwrap().stop, Some(StopCause::Drained));
        assert_eq!(s.job(a).unwrap().last_checkpoint_at(Time::from_secs(13)), Some(Time::from_secs(12)));
        // The deadline asks nothing more of a job already stopping; the node drains.
        assert!(s.reclaim_deadline(n, Time::from_secs(20)).unwrap().is_empty());
        assert_eq!(s.node(n).unwrap().state, NodeState::Draining);
        let e = s.rank_ended(a, 0, 0, RankEnd::Stopped, Time::from_secs(21)).unwrap().unwrap();
        assert_eq!(e.state, JobState::Preempted);
        assert_eq!(e.cause, Some(StopCause::Drained));
        assert_eq!(s.job(a).unwrap().restarts, 0, "a reclaim is not the job's failure");
        assert_eq!(s.job(a).unwrap().progress, Dur::from_secs(12), "it resumes from the final checkpoint");
    }

    fn one_gpu_cluster() -> (ClusterState, TenantId, NodeId) {
        let mut cfg = SchedConfig::with_policy(Policy::Priority);
        cfg.preemption.min_run_time = Dur::ZERO;
        let mut s = ClusterState::new(cfg).unwrap();
        let n = s.add_node(NodeSpec::with_gpus("n", GpuModel::A100_80GB, 1, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        (s, t, n)
    }

    fn pass(s: &mut ClusterState, now: Time) -> Vec<Decision> {
        let ds = schedule(s, now);
        for d in &ds {
            s.apply_decision(d, now).unwrap();
        }
        s.check_invariants().unwrap();
        ds
    }

    #[test]
    fn a_victim_keeps_its_gpu_until_its_end_is_confirmed() {
        let (mut s, t, _) = one_gpu_cluster();
        s.submit(JobId(1), JobSpec::new(t, "low", 1, 1), Time::ZERO).unwrap();
        pass(&mut s, Time::ZERO);
        s.submit(JobId(2), JobSpec::new(t, "high", 1, 1).priority(10), Time::from_secs(1)).unwrap();
        let ds = pass(&mut s, Time::from_secs(1));
        assert!(matches!(ds[0], Decision::Preempt { job: JobId(1), .. }), "{ds:?}");
        // The victim is stopping: still running, still holding the GPU; the preemptor cannot start.
        assert!(s.job(JobId(1)).unwrap().is_stopping());
        assert_eq!(s.allocated_gpus(), 1);
        for k in 2..5 {
            let ds = pass(&mut s, Time::from_secs(k));
            assert!(!ds.iter().any(|d| matches!(d, Decision::Start { .. } | Decision::Preempt { .. })), "{ds:?}");
        }
        // Confirmed gone: the victim is queued as preempted, and the preemptor starts on the next pass.
        let e = s.rank_ended(JobId(1), 0, 0, RankEnd::Stopped, Time::from_secs(5)).unwrap().unwrap();
        assert_eq!(e.state, JobState::Preempted);
        assert_eq!(e.cause, Some(StopCause::Preempted { for_job: Some(JobId(2)) }));
        let ds = pass(&mut s, Time::from_secs(5));
        assert!(matches!(&ds[..], [Decision::Start { job: JobId(2), .. }]), "{ds:?}");
        // A repeated or stale report changes nothing.
        assert_eq!(s.rank_ended(JobId(1), 0, 0, RankEnd::Stopped, Time::from_secs(6)).unwrap(), None);
        assert_eq!(s.job(JobId(1)).unwrap().attempt(), 1);
    }

    #[test]
    fn a_failed_rank_stops_the_gang_and_the_job_restarts_only_after_every_rank_ended() {
        let mut s = ClusterState::new(SchedConfig::default()).unwrap();
        s.add_node(NodeSpec::with_gpus("n", GpuModel::A100_80GB, 4, MilliCpu::cores(8), MiB::gib(64))).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        let mut spec = JobSpec::new(t, "gang", 1, 3);
        spec.max_restarts = 1;
        s.submit(JobId(1), spec, Time::ZERO).unwrap();
        pass(&mut s, Time::ZERO);
        assert_eq!(s.rank_ended(JobId(1), 0, 1, RankEnd::Exited { success: false }, Time::from_secs(1)).unwrap(), None);
        assert_eq!(s.job(JobId(1)).unwrap().run.as_ref().unwrap().stop, Some(StopCause::Failed { rank: 1 }));
        assert_eq!(s.live_ranks(JobId(1)), vec![0, 2]);
        assert_eq!(s.allocated_gpus(), 3, "the other ranks still run: nothing is released");
        s.rank_ended(JobId(1), 0, 0, RankEnd::Stopped, Time::from_secs(2)).unwrap();
        let e = s.rank_ended(JobId(1), 0, 2, RankEnd::Stopped, Time::from_secs(2)).unwrap().unwrap();
        assert_eq!(e.state, JobState::Restarting);
        assert_eq!(s.job(JobId(1)).unwrap().restarts, 1);
        assert_eq!(s.allocated_gpus(), 0);
    }

    #[test]
    fn a_lost_node_fences_its_tasks_and_the_loss_is_not_a_restart() {
        let (mut s, t, n) = one_gpu_cluster();
        let mut spec = JobSpec::new(t, "j", 1, 1);
        spec.max_restarts = 0;
        s.submit(JobId(1), spec, Time::ZERO).unwrap();
        pass(&mut s, Time::ZERO);
        assert_eq!(s.node_lost(n, Time::from_secs(10)).unwrap(), vec![JobId(1)]);
        // Back before the fence timed out: the GPU is still fenced for the old attempt.
        s.set_node_state(n, NodeState::Ready, Time::from_secs(11)).unwrap();
        assert!(pass(&mut s, Time::from_secs(11)).is_empty());
        assert_eq!(s.allocated_gpus(), 1);
        // The agent killed the old copy and says so: queued again, no restart charged, then started again.
        let e = s.rank_ended(JobId(1), 0, 0, RankEnd::Stopped, Time::from_secs(12)).unwrap().unwrap();
        assert_eq!((e.state, e.cause), (JobState::Preempted, Some(StopCause::NodeLost { node: n })));
        let j = s.job(JobId(1)).unwrap();
        assert_eq!((j.restarts, j.losses, j.attempt()), (0, 1, 1));
        assert!(matches!(&pass(&mut s, Time::from_secs(12))[..], [Decision::Start { job: JobId(1), .. }]));
    }

    #[test]
    fn a_fence_timeout_ends_the_lost_attempt() {
        let (mut s, t, n) = one_gpu_cluster();
        s.submit(JobId(1), JobSpec::new(t, "j", 1, 1), Time::ZERO).unwrap();
        pass(&mut s, Time::ZERO);
        s.node_lost(n, Time::from_secs(10)).unwrap();
        let ended = s.fence_expired(n, Time::from_secs(70)).unwrap();
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].state, JobState::Preempted);
        assert_eq!(s.allocated_gpus(), 0);
        s.check_invariants().unwrap();
        assert!(s.fence_expired(NodeId(0), Time::from_secs(71)).unwrap().is_empty());
    }

    #[test]
    fn a_cancel_during_an_eviction_wins() {
        let (mut s, t, _) = one_gpu_cluster();
        s.submit(JobId(1), JobSpec::new(t, "low", 1, 1), Time::ZERO).unwrap();
        pass(&mut s, Time::ZERO);
        s.submit(JobId(2), JobSpec::new(t, "high", 1, 1).priority(10), Time::from_secs(1)).unwrap();
        pass(&mut s, Time::from_secs(1));
        assert!(s.request_stop(JobId(1), StopCause::Cancelled, Time::from_secs(2)).unwrap());
        assert!(!s.request_stop(JobId(1), StopCause::Drained, Time::from_secs(2)).unwrap());
        let e = s.rank_ended(JobId(1), 0, 0, RankEnd::Exited { success: true }, Time::from_secs(3)).unwrap();
        assert_eq!(e.unwrap().state, JobState::Cancelled);
        assert!(matches!(&pass(&mut s, Time::from_secs(3))[..], [Decision::Start { job: JobId(2), .. }]));
    }
}
