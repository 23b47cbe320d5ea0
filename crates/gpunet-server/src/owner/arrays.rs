//! The owner's side of job arrays and dependencies: resolving a submission's dependencies against the jobs its
//! tenant owns (another tenant's job is answered like a missing one), recording what the core did to other jobs as a
//! side effect (`gpunet_core::Cascade`: an array element expanded gets its own document, a job released or failed by
//! its dependencies, an array ended), and cancelling a whole array.

use super::{JobDoc, More, Owner};
use gpunet_api::depsyntax::parse_dependency;
use gpunet_api::spec::JobSubmission;
use gpunet_api::ApiError;
use gpunet_core::{Cascade, Dependency, JobId, JobSpec, JobState, StopCause, Time};
use gpunet_store::Write;

impl Owner {
    /// Fills `spec.dependencies` from the submission's `dependency` text: every job named must be one of `tenant`'s
    /// (an array, a job, or an array element by id or by `ID[INDEX]`); anything else is "no such job".
    pub(super) fn resolve_dependencies(
        &self,
        sub: &JobSubmission,
        tenant: &str,
        spec: &mut JobSpec,
    ) -> Result<(), ApiError> {
        let Some(text) = &sub.dependency else { return Ok(()) };
        for (kind, refs) in parse_dependency("dependency", text)? {
            let mut jobs = Vec::with_capacity(refs.len());
            for r in refs {
                let missing = || ApiError {
                    code: "not_found".into(),
                    message: format!("find dependency {r}: no such job"),
                    field: Some("dependency".into()),
                };
                let base = JobId(r.id);
                let owner = self.st.array_of_element(base).unwrap_or(base);
                if self.docs.get(&owner.0).is_none_or(|d| *d.tenant != *tenant) {
                    return Err(missing());
                }
                jobs.push(match r.index {
                    Some(i) => self.st.element_id(base, i).ok_or_else(missing)?,
                    None => base,
                });
            }
            spec.dependencies.push(Dependency { kind, jobs });
        }
        Ok(())
    }

    /// Records the core's side effects on other jobs since the last call: documents, writes and events.
    pub(super) fn apply_cascades(&mut self, writes: &mut Vec<Write>) {
        for c in self.st.take_cascades() {
            match c {
                Cascade::Expanded(e) => {
                    let Some(job) = self.st.job(e) else { continue };
                    let Some(p) = job.array_of.and_then(|(a, _)| self.docs.get(&a.0)) else { continue };
                    // An element carries the array's learned estimate, if it got one (it is in its spec too).
                    let more = More { learned_estimate: p.more().learned_estimate, ..More::default() };
                    let mut doc = JobDoc::new(p.tenant.clone(), p.submission.clone(), p.submitted_by.clone(), more);
                    doc.state = job.state;
                    // An element counts its (the array's) spec bytes until it ends, as the exact count does.
                    if let Some(m) = self.unfinished_spec_bytes.as_mut() {
                        *m.entry(doc.tenant.to_string()).or_default() += doc.submission.len();
                    }
                    self.add_doc(e.0, doc);
                    writes.extend(self.job_doc_write(e.0));
                }
                Cascade::Released(j) => {
                    self.sync_doc(j.0);
                    writes.extend(self.job_doc_write(j.0));
                    writes.push(self.event(j.0, "released", format!("job-{} dependencies satisfied: queued", j.0)));
                }
                Cascade::DependencyFailed(j) => {
                    // It waited from its submission until now, as a job cancelled while queued did.
                    if let Some(x) = self.st.job(j) {
                        let ended = x.finished.unwrap_or(x.submitted);
                        self.metrics.job_ended(self.life(j.0, x.submitted, ended.0));
                    }
                    self.sync_doc(j.0);
                    writes.extend(self.job_doc_write(j.0));
                    let why = self.st.job(j).and_then(|x| x.end_reason.clone()).unwrap_or_default();
                    writes.push(self.event(j.0, "failed", format!("job-{} failed: {why}", j.0)));
                }
                Cascade::ArrayEnded(a) => {
                    let Some(v) = self.st.array(a) else { continue };
                    if let Some(j) = self.docs.get_mut(&a.0).and_then(|d| d.own.as_mut()) {
                        j.state = v.state;
                        j.finished = v.finished;
                    }
                    self.relist(a.0);
                    writes.extend(self.job_doc_write(a.0));
                    writes.push(self.event(
                        a.0,
                        "array_ended",
                        format!(
                            "array job-{} ended {}: {} succeeded, {} failed, {} cancelled",
                            a.0, v.state, v.succeeded, v.failed, v.cancelled
                        ),
                    ));
                }
            }
        }
    }

    /// A job's life for the metrics, as it ends at `ended` (ms): its attempts' time held, from its document.
    pub(super) fn life(&self, id: u64, submitted: Time, ended: u64) -> crate::metrics::Life {
        let held = self.docs.get(&id).map_or(0, |d| d.more().held_ms);
        crate::metrics::Life { submitted: submitted.0, ended, held }
    }

    /// Cancels one job: a queued one at once, a running one by asking it to stop (it is cancelled once its agents
    /// confirm its processes gone).
    pub(super) fn cancel_one(&mut self, jid: JobId, now: u64, writes: &mut Vec<Write>) -> Result<(), ApiError> {
        let id = jid.0;
        let running = self.st.job(jid).is_some_and(|j| j.state == JobState::Running);
        if running {
            self.st.request_stop(jid, StopCause::Cancelled, Time(now))?;
            self.sync_doc(id);
            writes.extend(self.job_doc_write(id));
            writes.push(self.event(id, "stopping", format!("job-{id} cancel requested: stopping its tasks")));
            let nodes = self.nodes_of(jid);
            self.bump_job(nodes);
            self.confirm_unmanaged(jid, now, writes);
        } else {
            self.st.cancel(jid, Time(now))?;
            self.sync_doc(id);
            if let Some(j) = self.st.job(jid) {
                self.metrics.job_ended(self.life(id, j.submitted, now));
            }
            writes.extend(self.job_doc_write(id));
            writes.push(self.event(id, "cancelled", format!("job-{id} cancelled")));
        }
        Ok(())
    }

    /// Cancels a whole array: no element is expanded any more, and each live one is cancelled.
    pub(super) fn cancel_array(&mut self, a: JobId, now: u64, writes: &mut Vec<Write>) -> Result<(), ApiError> {
        let live = self.st.cancel_array(a, Time(now))?;
        // Recorded at once, so that a restart does not expand the array again.
        if let Some(j) = self.docs.get_mut(&a.0).and_then(|d| d.own.as_mut()) {
            j.state = JobState::Cancelled;
        }
        self.relist(a.0);
        writes.extend(self.job_doc_write(a.0));
        writes.push(self.event(a.0, "cancelled", format!("array job-{} cancelled: {} live elements", a.0, live.len())));
        for e in live {
            if self.st.job(e).is_some_and(|j| !j.state.is_terminal() && !j.is_stopping()) {
                self.cancel_one(e, now, writes)?;
            }
        }
        self.apply_cascades(writes);
        Ok(())
    }

    /// Brings an array's document up to its summary (its state is the array's, see `gpunet_core::array`).
    pub(super) fn sync_array_doc(&mut self, a: u64) {
        if let (Some(v), Some(j)) = (self.st.array(JobId(a)), self.docs.get_mut(&a).and_then(|d| d.own.as_mut())) {
            j.state = v.state;
            j.finished = v.finished;
        }
    }
}

impl Owner {
    /// After recovery: records what resolving the restored jobs changed (durably, in the background).
    pub(crate) fn restored_cascades(&mut self) {
        let mut writes = Vec::new();
        self.apply_cascades(&mut writes);
        let arrays: Vec<u64> = self
            .docs
            .iter()
            .filter(|(_, d)| d.own.as_ref().is_some_and(|j| j.spec.array.is_some()))
            .map(|(i, _)| *i)
            .collect();
        for a in arrays {
            self.sync_array_doc(a);
        }
        if !writes.is_empty() {
            self.persist(writes, "recovered dependencies and arrays");
        }
    }
}
