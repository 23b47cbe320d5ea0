//! Explanation: why a queued job is not running ([`explain`]), as a structured [`PendingReason`] with its numbers
//! and one sentence. `explain` runs a pass that traces the job: the pass's steps note what they found about it
//! (`Pass::note`).

use super::Pass;
use crate::config::Policy;
use crate::error::CoreError;
use crate::ids::{JobId, TenantId};
use crate::job::{DepKind, Job, JobSpec, JobState, TopologyScope};
use crate::quota::{Deny, QuotaBlock};
use crate::state::ClusterState;
use crate::units::{Dur, Time};
use serde::{Deserialize, Serialize};

/// Why a queued job is not running, with numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingReason {
    /// It would start in the next pass.
    Starting,
    /// Waiting out the backoff before a restart.
    Backoff {
        /// Earliest restart.
        until: Time,
    },
    /// Its tenant's quota holds it.
    Quota {
        /// Tenant name.
        tenant: String,
        /// The dimension that blocks and its numbers.
        block: QuotaBlock,
    },
    /// No node could ever hold it.
    NeverFits {
        /// What is impossible.
        detail: String,
    },
    /// Not enough free resources in the right shape.
    Capacity {
        /// What it needs.
        needs: String,
        /// Largest free block of whole GPUs on one eligible node.
        largest_free_block: u32,
        /// Largest free block inside one NVLink domain.
        largest_free_nvlink: u32,
        /// Free whole GPUs on eligible nodes.
        free_eligible_gpus: u64,
        /// When it is expected to start (its reservation), if known.
        eta: Option<Time>,
        /// Jobs being evicted to make room for it.
        preempting: Vec<JobId>,
    },
    /// It fits, but only on resources reserved for the head job, and it would outlast the reservation.
    Reservation {
        /// Holder of the reservation.
        holder: JobId,
        /// When the holder is expected to start: none when its reservation counts on a job without estimate ending
        /// ([`Pass::expected_start`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<Time>,
    },
    /// Jobs ahead of it in policy order are waiting and it may not pass them.
    Order {
        /// Queued jobs ahead of it.
        ahead: usize,
        /// Policy.
        policy: Policy,
        /// The first job that does not fit, blocking the rest.
        blocked_by: Option<JobId>,
    },
    /// Waiting for other jobs to end (its dependencies); it is in no queue until they have.
    Dependency {
        /// The jobs it still waits for, with how.
        waiting_for: Vec<DepWait>,
    },
    /// An array at its concurrency limit: its next element is expanded when a live one ends.
    ArrayLimit {
        /// Elements live (expanded, not ended).
        live: u32,
        /// The array's limit.
        limit: u32,
    },
    /// Held (submitted with `--hold`, or `gpunet hold`): in no queue until released.
    Held,
    /// Not queued at all.
    NotQueued {
        /// Its state.
        state: JobState,
    },
}

/// One job a dependency still waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepWait {
    /// How the dependency is satisfied.
    pub kind: DepKind,
    /// The job (or array) waited for.
    pub job: JobId,
    /// Its state now.
    pub state: JobState,
}

/// A pending job's explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Job.
    pub job: JobId,
    /// Structured reason.
    pub reason: PendingReason,
    /// The reason in one sentence with its numbers.
    pub message: String,
    /// Queued jobs ahead of it in policy order.
    pub position: usize,
}

/// Explains why a queued job is not running.
///
/// An array is explained by its waiting head element, or by its limit when its live elements fill it. A job waiting
/// for dependencies is explained by the jobs it waits for; a job that ended because a dependency can never be
/// satisfied says so.
pub fn explain(state: &ClusterState, job: JobId, now: Time) -> Result<Explanation, CoreError> {
    if let Some(e) = explain_outside(state, job, now)? {
        return Ok(e);
    }
    let j = state.job(job).ok_or(CoreError::UnknownJob(job))?;
    let mut p = Pass::new(state, now, Some(job));
    p.run();
    let ahead = p.traced_position.unwrap_or_else(|| p.count_ahead(job));
    let reason = match p.outcome.take() {
        Some(r) => r,
        None => PendingReason::Order { ahead, policy: state.cfg.policy, blocked_by: p.blocked_by },
    };
    let message = describe(j, &reason, now);
    Ok(Explanation { job, reason, message, position: ahead })
}

/// What [`explain`] says of a job that no pass or replay is needed for (held, not queued, never fitting; an array at
/// its limit, or ended), or `None` for one whose answer needs them: a queued job or an array's next element (a pass
/// explains it), or a job waiting on dependencies (a replay predicts its start). A server answers the first at once
/// and the second from its queue view, whose build explains every job asked about with one pass and one replay
/// ([`explain_queue`]).
pub fn explain_without_pass(state: &ClusterState, job: JobId, now: Time) -> Result<Option<Explanation>, CoreError> {
    if state.arrays.get(&job).is_some_and(|r| r.head.is_some()) || state.is_dependency_waiting(job) {
        return Ok(None);
    }
    explain_outside(state, job, now)
}

/// The sentence of a job waiting for its dependencies: "dependency: waits for afterok job-4 (running), …".
pub fn dependency_text(waiting_for: &[DepWait]) -> String {
    let list: Vec<String> = waiting_for.iter().map(|w| format!("{} {} ({})", w.kind, w.job, w.state)).collect();
    format!("dependency: waits for {}", list.join(", "))
}

/// Explains many queued jobs at once, each given with its place in the queue (as [`crate::queue_order`] lists
/// them), from one scheduling pass that notes what it finds about each. A job the pass skips, or meets after its
/// walk behind a reservation ended, is looked at as [`explain`] looks at a traced job; behind a head that blocks
/// without a reservation, the order explains it. The cost is one pass that walks to the last of them, however many
/// are explained; the server builds its queue view with it. Unknown jobs are left out.
pub fn explain_queue(state: &ClusterState, jobs: &[(JobId, usize)], now: Time) -> Vec<Explanation> {
    let mut out: Vec<Option<Explanation>> = Vec::with_capacity(jobs.len());
    let mut noting = crate::fxhash::FxHashSet::default();
    for (id, _) in jobs {
        match explain_outside(state, *id, now) {
            Ok(Some(e)) => out.push(Some(e)),
            Ok(None) => {
                noting.insert(*id);
                out.push(None);
            }
            Err(_) => out.push(None),
        }
    }
    let mut p = Pass::new(state, now, None);
    if !noting.is_empty() {
        p.noting = Some(noting.clone());
        p.run();
    }
    jobs.iter()
        .zip(out)
        .filter_map(|((id, position), e)| {
            if let Some(e) = e {
                return Some(e);
            }
            let j = state.job(*id).filter(|_| noting.contains(id))?;
            let reason = p.notes.remove(id).unwrap_or(PendingReason::Order {
                ahead: *position,
                policy: state.cfg.policy,
                blocked_by: p.blocked_by,
            });
            Some(Explanation { job: *id, message: describe(j, &reason, now), reason, position: *position })
        })
        .collect()
}

/// The explanation of a job that needs no pass: an array, a held job, one waiting for dependencies, one not queued,
/// or one no node could ever hold; `None` for a job in its queue.
fn explain_outside(state: &ClusterState, job: JobId, now: Time) -> Result<Option<Explanation>, CoreError> {
    if let Some(r) = state.arrays.get(&job) {
        if let Some(h) = r.head {
            let mut e = explain(state, h, now)?;
            e.message = format!("next element {h}: {}", e.message);
            e.job = job;
            return Ok(Some(e));
        }
        if r.expands() && r.live >= r.limit() {
            let (live, limit) = (r.live, r.limit());
            let message = format!(
                "array {job} has {live} live elements, its limit (%{limit}); the next element starts when one ends"
            );
            return Ok(Some(Explanation {
                job,
                reason: PendingReason::ArrayLimit { live, limit },
                message,
                position: 0,
            }));
        }
        let s = r.summary_state();
        let reason = PendingReason::NotQueued { state: s };
        return Ok(Some(Explanation { job, message: format!("array {job} is {s}, not queued"), reason, position: 0 }));
    }
    let j = state.job(job).ok_or(CoreError::UnknownJob(job))?;
    if state.held.contains(&job) {
        let reason = PendingReason::Held;
        return Ok(Some(Explanation { job, message: describe(j, &reason, now), reason, position: 0 }));
    }
    if state.dep_waiting.contains(&job) {
        let waiting_for = state.dep_waits(state.waiting_for(job));
        let reason = PendingReason::Dependency { waiting_for };
        return Ok(Some(Explanation { job, message: describe(j, &reason, now), reason, position: 0 }));
    }
    if !j.state.is_queued() {
        let reason = PendingReason::NotQueued { state: j.state };
        let message = match &j.end_reason {
            Some(why) => format!("{job} is {}, not queued: {why}", j.state),
            None => format!("{job} is {}, not queued", j.state),
        };
        return Ok(Some(Explanation { job, message, reason, position: 0 }));
    }
    // A job no node could ever hold is explained by that before anything the pass meets first (its quota, say).
    if let Some(detail) = state.parked_reason(job).or_else(|| super::placement::never_fits(state, &j.spec)) {
        let reason = PendingReason::NeverFits { detail };
        return Ok(Some(Explanation { job, message: describe(j, &reason, now), reason, position: 0 }));
    }
    Ok(None)
}

/// The reason in one sentence. Times are said relative to `now` ("in 2h5m"): the core's clock is an offset that
/// means nothing to a reader (the server's is ms since the Unix epoch); the structured reason keeps the instants.
fn describe(j: &Job, r: &PendingReason, now: Time) -> String {
    let after = |t: &Time| Dur(t.0.saturating_sub(now.0));
    match r {
        PendingReason::Starting => format!("{} fits now and starts in the next scheduling pass", j.id),
        PendingReason::Backoff { until } => {
            format!("restart {} of {} waits for its backoff, {} more", j.restarts, j.spec.max_restarts, after(until))
        }
        PendingReason::Quota { tenant, block } => format!("quota: {tenant} {block}"),
        PendingReason::NeverFits { detail } => format!("never fits: {detail}"),
        PendingReason::Capacity {
            needs,
            largest_free_block,
            largest_free_nvlink,
            free_eligible_gpus,
            eta,
            preempting,
        } => {
            let mut s = format!(
                "capacity: needs {needs}; largest free block is {largest_free_block} GPUs on one node \
                 ({largest_free_nvlink} in one NVLink domain), {free_eligible_gpus} GPUs free on eligible nodes"
            );
            if !preempting.is_empty() {
                s += &format!("; evicting {} job(s) to make room", preempting.len());
            }
            match eta {
                Some(t) if *t != Time::MAX => s += &format!("; expected to start in {}", after(t)),
                _ => {}
            }
            s
        }
        PendingReason::Reservation { holder, until: Some(t) } => {
            format!(
                "waiting for the reservation of {holder} (expected to start in {}); this job would outlast it",
                after(t)
            )
        }
        PendingReason::Reservation { holder, until: None } => {
            format!("waiting for the reservation of {holder}; this job would outlast it")
        }
        PendingReason::Order { ahead, policy, blocked_by } => match blocked_by {
            // The blocker's own tenant is not named: to a tenant reading of its own job, another tenant's name is
            // not its to know (it named the explained job's tenant, as if the blocker's).
            Some(b) => format!("order: {ahead} jobs ahead under {policy}; {b} does not fit and blocks the queue"),
            None => format!("order: {ahead} jobs ahead under {policy}"),
        },
        PendingReason::NotQueued { state } => format!("{} is {state}", j.id),
        PendingReason::Held => {
            let id = j.array_of.map_or(j.id, |(a, _)| a);
            format!("held: it waits in no queue until released (`gpunet release {}`)", id.0)
        }
        PendingReason::Dependency { waiting_for } => dependency_text(waiting_for),
        PendingReason::ArrayLimit { live, limit } => format!("array at its limit: {live} of {limit} elements live"),
    }
}

fn needs_text(spec: &JobSpec) -> String {
    let models = if spec.gpu_models.is_empty() {
        String::new()
    } else {
        spec.gpu_models.iter().map(|m| m.name()).collect::<Vec<_>>().join("|")
    };
    let per = match spec.task.mig {
        Some(p) => format!("MIG {p}"),
        None if spec.task.gpus == 0 => format!("{} and {}", spec.task.cpu, spec.task.mem),
        None => format!("{}×{}", spec.task.gpus, if models.is_empty() { "GPU".into() } else { models }),
    };
    if spec.tasks > 1 {
        format!("{} tasks of {per} in {}", spec.tasks, spec.topology)
    } else if spec.topology == TopologyScope::NvLink {
        format!("{per} in {}", spec.topology)
    } else {
        per
    }
}

impl Pass<'_> {
    /// Records why the traced job (the one `explain` asks about) waits; `reason` is computed only for that job.
    pub(super) fn note(&mut self, job: JobId, reason: impl FnOnce(&Self) -> PendingReason) {
        if self.trace == Some(job) {
            self.outcome = Some(reason(self));
        } else if self.noted(job) {
            let r = reason(self);
            self.notes.insert(job, r);
        }
    }

    /// Forgets what was noted of `job`: it is explained as a job no pass noted (in order behind the head).
    #[cold]
    #[inline(never)]
    pub(super) fn unnote(&mut self, job: JobId) {
        if self.trace == Some(job) {
            self.outcome = None;
        } else {
            self.notes.remove(&job);
        }
    }

    /// A head's reservation at `at` as the start it is expected at: none when there is none (`Time::MAX`), or when a
    /// release it may count on by then is indexed to end where the ETA replay (`predict.rs`, `expected_left`)
    /// expects it not to: a job without an estimate (ranked by its probe; the replay expects no end of it), one within
    /// its probe (indexed to end with it; the replay expects it to run to its estimate), or one past its indexed end
    /// (the replay expects it to run as long again as it has). So `why` names no time the ETA would not.
    /// (Conservative: a release the reservation did not need counts too.)
    pub(super) fn expected_start(&self, at: Time) -> Option<Time> {
        if at == Time::MAX {
            return None;
        }
        let st = self.st;
        let indexed_as_expected = |j: &JobId| {
            if self.preempted.contains(j) {
                return true; // the reservation leaves it out
            }
            match st.jobs.get(j) {
                Some(j) => j.end_as_indexed(),
                // An array's element started in this pass, not expanded yet: as a new job of its array's spec.
                None => st
                    .element_slot(*j)
                    .and_then(|(a, _)| st.array_spec(a))
                    .is_some_and(|s| Job::new(*j, s.clone(), self.now).end_as_indexed()),
            }
        };
        let running = st
            .running_by_end
            .keys()
            .take_while(|(end, _)| *end <= at)
            .all(|(end, j)| *end > self.now && indexed_as_expected(j));
        let real = |j: &JobId| self.walk_starts.as_ref().is_none_or(|w| w.contains(j));
        let started =
            self.started.iter().filter(|(end, j, _)| *end <= at && real(j)).all(|(_, j, _)| indexed_as_expected(j));
        (running && started).then_some(at)
    }

    /// The walk a real pass makes has ended (an explaining pass may go on, starting jobs only to explain them): the
    /// starts it has made are the ones [`Pass::expected_start`] counts from now on, and the starts noted so far are
    /// named again with them: a job started behind a head after its start was worked out may be one the head's
    /// reservation counts on ending (a job within its probe "ends before" it and may use what it holds), and
    /// `expected_start` only takes a start away as the pass starts more jobs. A start now (a job its evictions are
    /// made for) is no reservation's and stays. Nothing to do in a pass that explains nothing.
    pub(super) fn walk_ended(&mut self) {
        if self.trace.is_none() && self.noting.is_none() {
            return;
        }
        self.walk_starts = Some(self.started.iter().map(|(_, j, _)| *j).collect());
        let settle = |p: &Self, r: &mut PendingReason| {
            if let PendingReason::Capacity { eta: at, .. } | PendingReason::Reservation { until: at, .. } = r {
                if *at != Some(p.now) {
                    *at = at.and_then(|t| p.expected_start(t));
                }
            }
        };
        let mut outcome = self.outcome.take();
        if let Some(r) = &mut outcome {
            settle(self, r);
        }
        self.outcome = outcome;
        let mut notes = std::mem::take(&mut self.notes);
        for r in notes.values_mut() {
            settle(self, r);
        }
        self.notes = notes;
    }

    /// Whether the pass notes what it finds about `job` ([`explain_queue`]).
    pub(super) fn noted(&self, job: JobId) -> bool {
        self.noting.as_ref().is_some_and(|n| n.contains(&job))
    }

    /// Why a job waits for capacity: what it needs against what is free on its node classes now.
    pub(super) fn capacity_reason(
        &self,
        spec: &JobSpec,
        classes: &[u32],
        eta: Option<Time>,
        preempting: Vec<JobId>,
    ) -> PendingReason {
        let (largest_free_block, largest_free_nvlink) = self.free.largest_block(&self.st.topo, classes);
        PendingReason::Capacity {
            needs: needs_text(spec),
            largest_free_block,
            largest_free_nvlink,
            free_eligible_gpus: self.free.free_in(classes),
            eta,
            preempting,
        }
    }

    /// Why tenant `t`'s quota holds a job, with the numbers of the dimension that blocks.
    pub(super) fn quota_reason(&self, t: TenantId, block: Deny) -> PendingReason {
        let st = self.st;
        PendingReason::Quota {
            tenant: st.tenants[t.index()].spec.name.clone(),
            block: self.book.explain_deny(&st.shape, t, block),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    #[test]
    fn one_pass_explains_a_queue_as_job_by_job_explains_do() {
        // Backfill on: a blocked head with a reservation, a short job that backfills, a long one kept off the
        // reservation, a quota-held job, a held one, one waiting for a dependency and one no node could hold.
        let mut c = cfg(Policy::Fifo);
        c.backfill = true;
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 4)], &["a", "b"]);
        s.set_quota(TenantId(1), Some(Quota::gpus(0, 1))).unwrap();
        submit(&mut s, 1, JobSpec::new(t0(), "running", 3, 1).estimate(Dur::from_secs(100)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "head", 4, 1).estimate(Dur::from_secs(50)), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(10)), 2);
        submit(&mut s, 4, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(1000)), 3);
        submit(&mut s, 5, JobSpec::new(TenantId(1), "over quota", 2, 1).estimate(Dur::from_secs(5)), 1);
        submit(&mut s, 6, JobSpec::new(t0(), "held", 1, 1), 5);
        s.hold(JobId(6)).unwrap();
        let mut dep = JobSpec::new(t0(), "after", 1, 1);
        dep.dependencies =
            crate::job::thin_vec![crate::job::Dependency { kind: crate::job::DepKind::AfterOk, jobs: vec![JobId(2)] }];
        submit(&mut s, 7, dep, 6);
        submit(&mut s, 8, JobSpec::new(t0(), "huge", 16, 1), 7);
        let now = Time::from_secs(10);
        let order = queue_order(&s, now, 100);
        let mut asked: Vec<(JobId, usize)> = order.iter().enumerate().map(|(i, j)| (*j, i)).collect();
        asked.extend([(JobId(6), order.len()), (JobId(7), order.len() + 1), (JobId(99), 0)]);
        let many = explain_queue(&s, &asked, now);
        assert_eq!(many.len(), asked.len() - 1, "the unknown job is left out");
        for e in &many {
            let one = explain(&s, e.job, now).unwrap();
            assert_eq!(e.reason, one.reason, "{}", e.job);
            assert_eq!(e.message, one.message, "{}", e.job);
        }
        let reason = |id: u64| reason_of(&many, id);
        assert!(matches!(reason(2), PendingReason::Capacity { .. }), "{:?}", reason(2));
        assert_eq!(reason(3), PendingReason::Starting);
        // The short job took the last free GPU: the pass stopped before the long one, then looked at it as a traced
        // explain does.
        assert!(matches!(reason(4), PendingReason::Capacity { free_eligible_gpus: 0, .. }), "{:?}", reason(4));
        assert!(matches!(reason(5), PendingReason::Quota { .. }), "{:?}", reason(5));
        assert_eq!(reason(6), PendingReason::Held);
        assert!(matches!(reason(7), PendingReason::Dependency { .. }));
        assert!(matches!(reason(8), PendingReason::NeverFits { .. }));
    }

    fn reason_of(es: &[Explanation], id: u64) -> PendingReason {
        es.iter().find(|e| e.job == JobId(id)).unwrap().reason.clone()
    }

    /// The time of job `job`'s reservation in a pass at `now`, if it gets one.
    fn reserved(s: &ClusterState, job: u64, now: Time) -> Option<Time> {
        crate::schedule(s, now).into_iter().find_map(|d| match d {
            crate::Decision::Reserve { job: j, at, .. } if j == JobId(job) => Some(at),
            _ => None,
        })
    }

    /// SRTF with backfill and a probe of 900 s.
    fn srtf_with_a_probe() -> SchedConfig {
        let mut c = cfg(Policy::Srtf);
        c.backfill = true;
        c.probe = Some(Dur::from_secs(900));
        c
    }

    /// A head's expected start is its reservation's time, unless a job it may count on ending by then has no estimate
    /// (ranked by its probe, whose end is no prediction): then none, as the ETA replay gives none.
    #[test]
    fn a_reservation_counting_on_a_job_without_estimate_names_no_start() {
        let c = srtf_with_a_probe();
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1), node("m", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "unknown", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "known", 1, 1).estimate(Dur::from_secs(2000)), 0);
        s.step(Time::ZERO).unwrap();
        assert!(s.job(JobId(1)).unwrap().spec.probe().is_some(), "ranked by its probe");
        // A head of two GPUs needs both nodes: its reservation counts on the job without estimate ending at its
        // probe's end (900 s) and on the other at 2,000 s.
        submit(&mut s, 3, JobSpec::new(t0(), "head", 1, 2).estimate(Dur::from_secs(10)), 1);
        assert_eq!(reserved(&s, 3, Time::from_secs(10)), Some(Time::from_secs(2000)));
        let e = explain(&s, JobId(3), Time::from_secs(10)).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: None, .. }), "{:?}", e.reason);
        assert!(!e.message.contains("expected to start"), "{}", e.message);
        // A head of one GPU counts on the first release only; by then only the job without estimate may end.
        submit(&mut s, 4, JobSpec::new(t0(), "one", 1, 1).estimate(Dur::from_secs(5)), 2);
        let e = explain(&s, JobId(4), Time::from_secs(10)).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: None, .. }), "{:?}", e.reason);
        // Once it has ended, the two-GPU head's reservation counts on the estimated job alone, and names its end.
        s.finish(JobId(1), Time::from_secs(20), true).unwrap();
        s.hold(JobId(4)).unwrap();
        assert!(started(&s.step(Time::from_secs(20)).unwrap()).is_empty());
        assert_eq!(reserved(&s, 3, Time::from_secs(30)), Some(Time::from_secs(2000)));
        let e = explain(&s, JobId(3), Time::from_secs(30)).unwrap();
        assert!(
            matches!(e.reason, PendingReason::Capacity { eta: Some(t), .. } if t == Time::from_secs(2000)),
            "{:?}",
            e.reason
        );
        assert!(e.message.contains("expected to start in 32m50s"), "{}", e.message);
    }

    /// A running job past its estimated end is indexed to have ended (its reservation would be now), but the ETA replay
    /// expects it to run as long again as it has: no start is named ("expected to start in 0s" before).
    #[test]
    fn a_reservation_counting_on_an_overrun_job_names_no_start() {
        let mut c = cfg(Policy::Fifo);
        c.backfill = true;
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "overruns", 1, 1).estimate(Dur::from_secs(100)), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1]);
        submit(&mut s, 2, JobSpec::new(t0(), "head", 1, 1).estimate(Dur::from_secs(10)), 1);
        let e = explain(&s, JobId(2), Time::from_secs(50)).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: Some(t), .. } if t == Time::from_secs(100)));
        let e = explain(&s, JobId(2), Time::from_secs(200)).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: None, .. }), "{:?}", e.reason);
        assert!(!e.message.contains("expected to start"), "{}", e.message);
    }

    /// A running job with a learned estimate, within its probe, is indexed to end with its probe, but the ETA replay
    /// expects it to run to its estimate: a reservation counting on it names no start either.
    #[test]
    fn a_reservation_counting_on_a_job_within_its_probe_names_no_start() {
        let c = srtf_with_a_probe();
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1), node("m", GpuModel::T4, 1)], &["a"]);
        let mut learned = JobSpec::new(t0(), "learned", 1, 1).estimate(Dur::from_secs(3000));
        learned.estimate_spread = Some(0.5);
        submit(&mut s, 1, learned, 0);
        submit(&mut s, 2, JobSpec::new(t0(), "given", 1, 1).estimate(Dur::from_secs(2000)), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1, 2]);
        assert!(s.job(JobId(1)).unwrap().probing(), "started within its probe");
        submit(&mut s, 3, JobSpec::new(t0(), "head", 1, 2).estimate(Dur::from_secs(10)), 1);
        assert_eq!(reserved(&s, 3, Time::from_secs(10)), Some(Time::from_secs(2000)), "counting on job 1 at 900 s");
        let e = explain(&s, JobId(3), Time::from_secs(10)).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: None, .. }), "{:?}", e.reason);
    }

    /// A job that starts behind the head later in the same pass, on what the head's reservation holds, because its
    /// probe ends before the reservation (a job within its probe "ends before" it), is one the reservation then counts
    /// on ending: the head names no start, as if that job had been running already. (The head's start was worked out
    /// when it blocked, before that job started, and named the reservation's time; a review found it.)
    #[test]
    fn a_job_backfilled_within_its_probe_after_the_head_blocked_takes_its_start_away() {
        let c = srtf_with_a_probe();
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1), node("m", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "known", 1, 1).estimate(Dur::from_secs(2000)), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1]);
        // The head needs both nodes: its reservation is the known job's end.
        submit(&mut s, 2, JobSpec::new(t0(), "head", 1, 2).estimate(Dur::from_secs(10)), 1);
        let now = Time::from_secs(10);
        let e = explain(&s, JobId(2), now).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: Some(t), .. } if t == Time::from_secs(2000)));
        // A job without estimate, ranked by its probe (900 s, before 2,000 s), starts on the free node behind it.
        submit(&mut s, 3, JobSpec::new(t0(), "unknown", 1, 1), 2);
        assert_eq!(reserved(&s, 2, now), Some(Time::from_secs(2000)));
        let e = explain(&s, JobId(2), now).unwrap();
        assert!(matches!(e.reason, PendingReason::Capacity { eta: None, .. }), "{:?}", e.reason);
        assert!(!e.message.contains("expected to start"), "{}", e.message);
        let queued = explain_queue(&s, &[(JobId(2), 0)], now);
        assert!(matches!(queued[0].reason, PendingReason::Capacity { eta: None, .. }), "{:?}", queued[0].reason);
        assert_eq!(started(&s.step(now).unwrap()), vec![3], "it does start behind the head");
        // Where the walk stops before it (`backfill_depth` 0), a real pass does not start it; the queue view's pass,
        // which goes on to explain it, may, and the starts it names count only what a real pass starts: the head
        // (settled where the walk ends) and a long job kept off the reservation, looked at after it, name 2,000 s.
        let mut c = srtf_with_a_probe();
        c.backfill_depth = 0;
        let ns = ["n", "m", "o"].iter().map(|n| node(n, GpuModel::T4, 1)).collect();
        let mut s = cluster(c, ns, &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "known", 1, 1).estimate(Dur::from_secs(2000)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "head", 1, 3).estimate(Dur::from_secs(10)), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "unknown", 1, 1), 2);
        submit(&mut s, 4, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(5000)), 3);
        let queued = explain_queue(&s, &[(JobId(2), 0), (JobId(3), 1), (JobId(4), 2)], now);
        let eta = |e: &Explanation| match e.reason {
            PendingReason::Capacity { eta, .. } => eta,
            _ => None,
        };
        assert_eq!(eta(&queued[0]), Some(Time::from_secs(2000)), "{:?}", queued[0].reason);
        let kept_off = PendingReason::Reservation { holder: JobId(2), until: Some(Time::from_secs(2000)) };
        assert_eq!(queued[2].reason, kept_off);
        assert_eq!(eta(&explain(&s, JobId(2), now).unwrap()), Some(Time::from_secs(2000)));
        assert!(started(&s.step(now).unwrap()).is_empty());
        // The job the walk does not reach would fit, but no pass starts it: it waits in order behind the head (it
        // said "fits now and starts in the next scheduling pass"), the same alone and in the queue view.
        let order = PendingReason::Order { ahead: 1, policy: Policy::Srtf, blocked_by: Some(JobId(2)) };
        let alone = explain(&s, JobId(3), now).unwrap();
        assert_eq!((&queued[1].reason, &alone.reason), (&order, &order));
        assert_eq!(alone.message, queued[1].message);
        assert!(alone.message.starts_with("order: 1 jobs ahead under srtf; job-2 does not fit"), "{}", alone.message);
    }

    /// Past the walk's end a queue view's pass looks at jobs only to explain them: what one of them would take is not
    /// taken from the next. Two short jobs behind a head that blocks, each fitting the one free GPU: each is told
    /// what it is told alone (the second was told there was no room: the first had "started" on it).
    #[test]
    fn jobs_explained_past_the_walks_end_take_no_room_from_each_other() {
        let mut c = srtf_with_a_probe();
        c.backfill_depth = 0;
        let ns = ["n", "m"].iter().map(|n| node(n, GpuModel::T4, 1)).collect();
        let mut s = cluster(c, ns, &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "known", 1, 1).estimate(Dur::from_secs(2000)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "head", 1, 2).estimate(Dur::from_secs(10)), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(10)), 2);
        submit(&mut s, 4, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(10)), 3);
        let now = Time::from_secs(10);
        let queued = explain_queue(&s, &[(JobId(2), 0), (JobId(3), 1), (JobId(4), 2)], now);
        for (q, id) in queued[1..].iter().zip([3, 4]) {
            let alone = explain(&s, JobId(id), now).unwrap();
            assert_eq!((&q.reason, &q.message), (&alone.reason, &alone.message), "job {id}");
            assert!(matches!(q.reason, PendingReason::Order { blocked_by: Some(JobId(2)), .. }), "{:?}", q.reason);
        }
        assert!(started(&s.step(now).unwrap()).is_empty(), "no pass starts them");
    }

    /// A job kept off a head's reservation names the head's start only when the reservation counts on no job without
    /// estimate.
    #[test]
    fn a_job_kept_off_a_reservation_names_its_start_only_when_known() {
        let c = srtf_with_a_probe();
        let ns = ["a", "b", "c"].iter().map(|n| node(n, GpuModel::T4, 1)).collect();
        let mut s = cluster(c, ns, &["t"]);
        submit(&mut s, 1, JobSpec::new(t0(), "unknown", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "known", 1, 1).estimate(Dur::from_secs(2000)), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1, 2]);
        // The head needs the three nodes; a long job would fit on the free one but outlast the head's reservation,
        // which counts on both running jobs ending.
        submit(&mut s, 3, JobSpec::new(t0(), "head", 1, 3).estimate(Dur::from_secs(10)), 1);
        submit(&mut s, 4, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(5000)), 2);
        let e = explain(&s, JobId(4), Time::from_secs(10)).unwrap();
        assert_eq!(e.reason, PendingReason::Reservation { holder: JobId(3), until: None });
        assert_eq!(e.message, "waiting for the reservation of job-3; this job would outlast it");
        // The job without estimate gone, the reservation counts on the estimated one alone.
        s.finish(JobId(1), Time::from_secs(20), true).unwrap();
        let e = explain(&s, JobId(4), Time::from_secs(30)).unwrap();
        assert_eq!(e.reason, PendingReason::Reservation { holder: JobId(3), until: Some(Time::from_secs(2000)) });
        assert!(e.message.contains("(expected to start in 32m50s)"), "{}", e.message);
    }

    #[test]
    fn jobs_behind_a_blocked_head_are_explained_by_the_order_with_their_places() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "running", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        for i in 2..=5 {
            submit(&mut s, i, JobSpec::new(t0(), "q", 1, 1), i);
        }
        let now = Time::from_secs(9);
        let asked: Vec<(JobId, usize)> =
            queue_order(&s, now, 10).into_iter().enumerate().map(|(i, j)| (j, i)).collect();
        for e in explain_queue(&s, &asked, now) {
            assert_eq!(e, explain(&s, e.job, now).unwrap());
        }
    }

    #[test]
    fn explain_reports_order_position_and_nvlink_block() {
        let mut s = cluster(cfg(Policy::Drf), vec![node("a", GpuModel::A100_80GB, 8)], &["t"]);
        submit(&mut s, 1, JobSpec::new(t0(), "hold", 4, 1), 0);
        s.step(Time::ZERO).unwrap();
        let mut big = JobSpec::new(t0(), "big", 8, 1);
        big.topology = TopologyScope::NvLink;
        big.gpu_models = crate::job::thin_vec![GpuModel::A100_80GB];
        submit(&mut s, 2, big, 1);
        for i in 0..17 {
            submit(&mut s, 10 + i, JobSpec::new(t0(), "w", 1, 1), 2 + i);
        }
        submit(&mut s, 99, JobSpec::new(t0(), "me", 1, 1), 100);
        let e = explain(&s, JobId(99), Time::from_secs(200)).unwrap();
        assert_eq!(e.reason, PendingReason::Order { ahead: 18, policy: Policy::Drf, blocked_by: Some(JobId(2)) });
        assert!(e.message.contains("18 jobs ahead under drf"), "{}", e.message);
        let e = explain(&s, JobId(2), Time::from_secs(200)).unwrap();
        assert!(
            e.message.contains("needs 8×A100-80GB in one NVLink domain")
                && e.message.contains("largest free block is 4"),
            "{}",
            e.message
        );
        let e = explain(&s, JobId(1), Time::from_secs(200)).unwrap();
        assert_eq!(e.reason, PendingReason::NotQueued { state: JobState::Running });
    }

    #[test]
    fn a_job_no_node_could_hold_is_explained_so_even_when_its_quota_would_also_stop_it() {
        let mut s = ClusterState::new(cfg(Policy::Fifo)).unwrap();
        for n in ["a", "b"] {
            s.add_node(node(n, GpuModel::H100_80GB, 8)).unwrap();
        }
        s.add_tenant(TenantSpec::new("t").quota(Quota::gpus(8, 8))).unwrap();
        // One task of 16 GPUs on 8-GPU nodes (kept at submit with hold_never_fits): over quota too, but that is not
        // why it can never run.
        submit(&mut s, 1, JobSpec::new(t0(), "huge", 16, 1), 0);
        s.step(Time::ZERO).unwrap();
        let e = explain(&s, JobId(1), Time::ZERO).unwrap();
        assert!(matches!(e.reason, PendingReason::NeverFits { .. }), "{e:?}");
        assert!(e.message.starts_with("never fits: "), "{}", e.message);
    }
}
