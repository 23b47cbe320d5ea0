//! The owner's job commands: submit (a batch, all or nothing, durable before visible), dry run, get, list, cancel and
//! explain; which jobs a principal may see, and how other tenants' jobs are masked in the texts a tenant reads; the
//! per-tenant limits on queued jobs and spec bytes.

use super::doc::{Walk, Which};
use super::{not_found, Applier, JobDoc, JobFilter, More, Owner, Packed, Reply, Unparsed, UnparsedPage, OTHER_JOB};
use crate::{now_ms, Principal};
use gpunet_api::spec::JobSubmission;
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::{explain, explain_without_pass, Job, JobId, JobState, Time};
use gpunet_store::Write;
use std::collections::{BTreeMap, HashMap};

impl Owner {
    /// Submits a batch of jobs, all or nothing; they enter the live state once the store has accepted them.
    pub(super) fn submit(
        &mut self,
        who: Principal,
        by: String,
        subs: Vec<(JobSubmission, Vec<String>)>,
        key: Option<String>,
        reply: Reply<(Vec<Submitted>, bool)>,
    ) {
        // A retried submission (the same key from the same submitter) gets the jobs it made, not new ones.
        let key = key.map(|k| format!("{}/{by}/{k}", idempotency_scope(&who)));
        if let Some(ids) = key.as_ref().and_then(|k| self.idempotent.get(k)) {
            let ids = ids.clone();
            return self.replay(ids, &subs, reply);
        }
        let now = now_ms();
        let mut writes = Vec::with_capacity(subs.len() * 2);
        let mut out = Vec::with_capacity(subs.len());
        // Validate every job first: a batch is all or nothing.
        let mut prepared = Vec::with_capacity(subs.len());
        for (i, (mut sub, warnings)) in subs.into_iter().enumerate() {
            let tenant = match (&who, &sub.tenant) {
                (Principal::Tenant(t), None) => t.clone(),
                (Principal::Tenant(t), Some(s)) if s == t => t.clone(),
                (Principal::Tenant(_), Some(_)) => {
                    let _ =
                        reply.send(Err(ApiError::new("forbidden", "a tenant token submits only to its own tenant")));
                    return;
                }
                (_, Some(s)) => s.clone(),
                (_, None) => {
                    let _ = reply.send(Err(ApiError::missing(if i == 0 { "tenant" } else { "jobs[].tenant" })));
                    return;
                }
            };
            let tid = match self.tenant_id(&tenant) {
                Ok(t) => t,
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return;
                }
            };
            // The tenant's default for spot, recorded in the submission (it decides the job's placement for good).
            if sub.spot.is_none() {
                sub.spot = self.spot_default(&tenant, &sub);
            }
            match sub.to_core(tid).and_then(|mut s| {
                gpunet_api::spec::check_checkpoint_roots(&sub, &tenant, &self.checkpoint_roots)?;
                self.resolve_dependencies(&sub, &tenant, &mut s)?;
                if !sub.hold_never_fits {
                    if let Some(why) = gpunet_core::never_fits(&self.st, &s) {
                        // A node pool may grow a node that holds it.
                        if self.pools.could_hold(&s) {
                            return Ok(s);
                        }
                        return Err(ApiError::never_fits(&why));
                    }
                }
                Ok(s)
            }) {
                Ok(spec) => prepared.push((tenant, Packed::new(&sub), warnings, spec)),
                Err(mut e) => {
                    if i > 0 {
                        e.message = format!("jobs[{i}]: {}", e.message);
                    }
                    let _ = reply.send(Err(e));
                    return;
                }
            }
        }
        if let Some(e) = self.read_only() {
            let _ = reply.send(Err(e));
            return;
        }
        // Per-tenant limits, for every tenant of the batch.
        let sizes: Vec<u64> = prepared.iter().map(|(_, sub, _, _)| sub.len()).collect();
        let mut per: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        for ((tenant, ..), size) in prepared.iter().zip(&sizes) {
            let e = per.entry(tenant.clone()).or_default();
            e.0 += 1;
            e.1 += size;
        }
        for (tenant, (n, bytes)) in per {
            if let Err(e) = self.tenant_limits(&tenant, n, bytes) {
                let _ = reply.send(Err(e));
                return;
            }
        }
        // Durable, then visible: the jobs are written first and enter the live state only once the store
        // has accepted them; a refused write leaves no trace (no job, no start, no event).
        let mut docs = Vec::with_capacity(prepared.len());
        for ((tenant, sub, warnings, mut spec), size) in prepared.into_iter().zip(sizes) {
            let learned = Owner::learned_estimate(&self.predictors, &mut spec, Some(by.as_str()), &tenant);
            // Its probe as the core gives it at submission (the same configuration: the server does not change it
            // while running), so that the stored job (and an array's record, which its elements are made from
            // after a restart) keeps it.
            spec.probe_ms = self.st.config().probe_for(&spec);
            if let Err(e) = spec.validate() {
                let _ = reply.send(Err(e.into()));
                return;
            }
            let id = self.next_id;
            // An array's elements take the ids right after it (see `gpunet_core::array`).
            self.next_id += 1 + spec.array.as_ref().map_or(0, |a| a.indices.len() as u64);
            let job = Job::new(JobId(id), spec, Time(now));
            let more = More {
                warnings: warnings.clone(),
                idempotency_key: key.clone(),
                learned_estimate: learned,
                ..More::default()
            };
            let doc = JobDoc::new(self.names.get(&tenant), sub, Some(self.names.get(&by)), more);
            writes.push(Write::Job {
                id,
                tenant: doc.tenant.to_string(),
                state: JobState::Pending.to_string(),
                doc: serde_json::to_string(&doc.stored(&job)).expect("job documents serialise"),
            });
            writes.push(Write::Event {
                job: id,
                at_ms: now,
                kind: "submitted".into(),
                message: format!("job-{id} submitted"),
            });
            out.push(Submitted { id, state: "pending".into(), warnings });
            docs.push((job, doc, size));
        }
        if let Some(k) = key {
            // From now on (before it is durable: a retry may come while the first try is in flight).
            self.idempotent.insert(k, out.iter().map(|s| s.id).collect());
        }
        let tx = self.self_tx.clone();
        let metrics = self.metrics.clone();
        self.store.commit_async(
            writes,
            Box::new(move |r| {
                if let Err(e) = r {
                    let _ = reply.send(Err(super::store_refused(&metrics, "the jobs", &e)));
                    return;
                }
                let apply = Applier(Box::new(move |o: &mut Owner| {
                    for (job, mut doc, size) in docs {
                        let id = job.id;
                        let array = job.spec.array.is_some().then(|| Box::new(job.clone()));
                        if let Err(e) = o.st.submit(id, job.spec, job.submitted) {
                            tracing::error!(job = %id, error = %e, "a stored job was refused by the core");
                            continue;
                        }
                        if o.st.job(id).is_none() {
                            doc.own = array; // an array is not a job of the core: its document keeps its spec
                        }
                        if let Some(m) = o.unfinished_spec_bytes.as_mut() {
                            *m.entry(doc.tenant.to_string()).or_default() += size;
                        }
                        o.add_doc(id.0, doc);
                        o.event_broadcast(id.0, "submitted", &format!("job-{} submitted", id.0));
                        o.metrics.submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    o.dirty = true;
                    let _ = reply.send(Ok((out, false)));
                }));
                if let Some(tx) = tx {
                    let _ = tx.send(apply);
                }
            }),
        );
    }

    /// Answers a retried submission with the jobs its first try made, once they are durable: the same ids and their
    /// states now. A key reused for other jobs is a conflict (compared with the stored submissions; a first try still
    /// in flight is answered without the comparison).
    /// The `spot` a tenant's submission without one gets: the tenant's default, except that a job tolerating
    /// `lifecycle=spot` itself is not made `never` by it.
    fn spot_default(&self, tenant: &str, sub: &JobSubmission) -> Option<gpunet_api::spec::SpotUse> {
        let d = self.tenants.get(tenant).and_then(|t| t.spot)?;
        let tolerates = sub.tolerations.iter().any(|t| t.key == "lifecycle");
        (d != gpunet_api::spec::SpotUse::Never || !tolerates).then_some(d)
    }

    fn replay(&self, ids: Vec<u64>, subs: &[(JobSubmission, Vec<String>)], reply: Reply<(Vec<Submitted>, bool)>) {
        // The stored submission carries its tenant's `spot` default where it gave none: so does the retry here.
        let same = ids.len() == subs.len()
            && ids.iter().zip(subs).all(|(id, (sub, _))| {
                self.docs.get(id).is_none_or(|d| {
                    if sub.spot.is_none() {
                        if let Some(dflt) = self.spot_default(&d.tenant, sub) {
                            let mut with = sub.clone();
                            with.spot = Some(dflt);
                            return d.submission.is(&with);
                        }
                    }
                    d.submission.is(sub)
                })
            });
        if !same {
            let _ = reply.send(Err(ApiError {
                code: "conflict".into(),
                message: "this Idempotency-Key was used for another submission; send a new key for new jobs".into(),
                field: Some("Idempotency-Key".into()),
            }));
            return;
        }
        let out: Vec<Submitted> = ids
            .iter()
            .map(|id| match self.docs.get(id) {
                Some(d) => Submitted {
                    id: *id,
                    state: d.job(&self.st, *id).map_or(JobState::Pending, |j| j.state).to_string(),
                    warnings: d.more().warnings.clone(),
                },
                None => Submitted { id: *id, state: JobState::Pending.to_string(), warnings: Vec::new() },
            })
            .collect();
        if ids.iter().all(|id| self.docs.contains_key(id)) {
            let _ = reply.send(Ok((out, true)));
        } else {
            // The first try is still in flight: answer once it is durable (batches are durable in order).
            self.durable(Vec::new(), reply, (out, true));
        }
    }

    /// Where and when a job would start: the owner makes a bounded copy of the live state with the job in it
    /// (`ClusterState::probe_copy`: nodes, running jobs and the queue's first jobs, whatever the queue's depth); the
    /// pass and the replay on it run off the owner ([`DryRunWork::answer`]).
    pub(super) fn dry_run(
        &mut self,
        who: Principal,
        by: String,
        mut sub: JobSubmission,
        mut warnings: Vec<String>,
        reply: Reply<DryRunWork>,
    ) {
        let r = (|| {
            // The tenant as a submission would have it: a tenant token naming another tenant is refused, not
            // quietly tried as its own.
            let tenant = match (&who, &sub.tenant) {
                (Principal::Tenant(t), None) => t.clone(),
                (Principal::Tenant(t), Some(s)) if s == t => t.clone(),
                (Principal::Tenant(_), Some(_)) => {
                    return Err(ApiError::new("forbidden", "a tenant token submits only to its own tenant"))
                }
                (_, Some(t)) => t.clone(),
                _ => return Err(ApiError::missing("tenant")),
            };
            let tid = self.tenant_id(&tenant)?;
            // As a submission would be: with its tenant's spot default.
            if sub.spot.is_none() {
                sub.spot = self.spot_default(&tenant, &sub);
            }
            let mut spec = sub.to_core(tid)?;
            // An id no job has, far from the ones submissions get (a dry run takes none of them: submitted ids stay
            // one dense sequence), with room after it for an array's elements (one at the very top left an array
            // none: it was refused as a duplicate). The answer names it and its elements as "this job".
            let elements = spec.array.as_ref().map_or(0, |a| a.indices.len() as u64);
            let id = JobId(DRY_RUN_ID - elements);
            // Its dependencies as a submission's (on the tenant's own jobs), looked at in the whole state: the copy
            // below lacks ended and held jobs. Met, the copy needs none; else they are the answer.
            self.resolve_dependencies(&sub, &tenant, &mut spec)?;
            // A held job goes to the held set first (they are looked at when it is released): the copy answers.
            let deps = match self.st.dependencies_if_submitted(id, &spec)? {
                _ if spec.hold => None,
                gpunet_core::DependencyCheck::Met => None,
                // An array's dependencies are its first element's, and `why` names it so ("next element …").
                gpunet_core::DependencyCheck::Waits(w) => {
                    Some(match spec.array.as_ref().and_then(|a| a.indices.first()) {
                        Some(i) => format!("next element {i}: {}", gpunet_core::dependency_text(&w)),
                        None => gpunet_core::dependency_text(&w),
                    })
                }
                gpunet_core::DependencyCheck::Never(why) => Some(format!("it would fail at once: {why}")),
            };
            spec.dependencies.clear();
            // The estimate a submission would get, learned when none is given (and so the probe, or none).
            let learned = Owner::learned_estimate(&self.predictors, &mut spec, Some(by.as_str()), &tenant);
            gpunet_api::spec::check_checkpoint_roots(&sub, &tenant, &self.checkpoint_roots)?;
            // No node could hold it (none registered yet, or none of its shape), but a pool at its largest could.
            let no_node = self.st.nodes().next().is_none() || gpunet_core::never_fits(&self.st, &spec).is_some();
            if no_node && self.pools.could_hold(&spec) {
                warnings.push(
                    "no node can hold it now: a node pool can grow one for it (its start then waits for that node to \
                     boot; GET /v1/pools)"
                        .into(),
                );
            }
            let now = Time(now_ms());
            let mut probe = self.st.probe_copy(now);
            probe.submit(id, spec, now)?;
            let masked_for = match who {
                Principal::Admin => None,
                _ => Some(tid),
            };
            // An array's parent is a record, not a job: it starts as its first element, expanded at submission.
            let first = if probe.job(id).is_some() { id } else { JobId(id.0 + 1) };
            let estimate = probe.job(first).and_then(|j| super::estimates::estimate_view(j, learned.as_ref(), now));
            Ok(DryRunWork { probe: Box::new(probe), id, first, now, masked_for, warnings, estimate, deps })
        })();
        let _ = reply.send(r);
    }

    /// One job, if `who` may see it.
    pub(super) fn get_job(&mut self, who: Principal, id: u64, reply: Reply<Unparsed>) {
        let r = match self.docs.get(&id) {
            None => Err(not_found("job", &id.to_string())),
            Some(d) => self.visible(&who, id, d).map(|_| self.unparsed(id).expect("present")),
        };
        let _ = reply.send(r);
    }

    /// A page of the jobs `who` may see: by id after `after`, or newest first below `before`; with the count of all
    /// that match.
    pub(super) fn list_jobs(&mut self, who: Principal, f: JobFilter, reply: Reply<UnparsedPage>) {
        let tenant = match (&who, f.tenant) {
            (Principal::Tenant(t), Some(x)) if x != *t => {
                let _ = reply.send(Err(ApiError::new("forbidden", "a tenant token lists only its own jobs")));
                return;
            }
            (Principal::Tenant(t), _) => Some(t.clone()),
            (_, x) => x,
        };
        if let Some(t) = &tenant {
            if let Err(e) = self.tenant_id(t) {
                let _ = reply.send(Err(e));
                return;
            }
        }
        // The lists walked are those of the tenant, the user and the states asked for.
        let walk = if f.newest { Walk::Before(f.before.unwrap_or(u64::MAX)) } else { Walk::After(f.after) };
        let which = Which { tenant: tenant.as_deref(), user: f.user.as_deref(), states: &f.states };
        let mut jobs = Vec::new();
        let mut next = None;
        for id in self.docs.ids(which, walk) {
            if jobs.len() == f.limit {
                next = jobs.last().map(|v: &Unparsed| v.id());
                break;
            }
            jobs.push(self.unparsed(id).expect("present"));
        }
        // Over every page, so that a listing can say how many it does not show: from the lists' sizes.
        let total = self.docs.count(which);
        let _ = reply.send(Ok(UnparsedPage { jobs, next, total }));
    }

    /// Cancels a queued job, or asks a running one to stop.
    pub(super) fn cancel(&mut self, who: Principal, id: u64, reply: Reply<JobView>) {
        let Some(d) = self.docs.get(&id) else {
            let _ = reply.send(Err(not_found("job", &id.to_string())));
            return;
        };
        if let Err(e) = self.visible(&who, id, d) {
            let _ = reply.send(Err(e));
            return;
        }
        // An ended job (or array) is named as such, not as a refused state transition.
        if let Some(state) = self.state_of(id).filter(|s| s.is_terminal()) {
            let _ = reply
                .send(Err(ApiError::new("conflict", format!("job-{id} already ended ({state}): nothing to cancel"))));
            return;
        }
        let now = now_ms();
        let jid = JobId(id);
        let mut writes = Vec::new();
        // A running job is asked to stop; it is cancelled once its agents confirm its processes gone (at once on
        // nodes without an agent). Its resources stay allocated until then. An array cancels every live element.
        let r = if self.st.array(jid).is_some() {
            self.cancel_array(jid, now, &mut writes)
        } else {
            self.cancel_one(jid, now, &mut writes)
        };
        if let Err(e) = r {
            let _ = reply.send(Err(e));
            return;
        }
        self.apply_cascades(&mut writes);
        self.dirty = true;
        let v = self.view(id).expect("present");
        self.durable(writes, reply, v);
    }

    /// Holds a queued job (or an array) or releases a held one (see `gpunet_core::hold`), recorded durably with an
    /// event; a release may fail the job at once when a dependency can no longer be satisfied.
    pub(super) fn set_hold(&mut self, who: Principal, id: u64, hold: bool, reply: Reply<JobView>) {
        let Some(d) = self.docs.get(&id) else {
            let _ = reply.send(Err(not_found("job", &id.to_string())));
            return;
        };
        if let Err(e) = self.visible(&who, id, d) {
            let _ = reply.send(Err(e));
            return;
        }
        let now = now_ms();
        let jid = JobId(id);
        let array = self.st.array(jid).is_some();
        let head_before = self.st.array_head(jid);
        let r = if hold { self.st.hold(jid) } else { self.st.release_hold(jid, Time(now)) };
        if let Err(e) = r {
            let _ = reply.send(Err(e.into()));
            return;
        }
        let mut writes = Vec::new();
        let what = if array { "array job" } else { "job" };
        if array {
            // The array's own record carries its hold, so that a restart restores it.
            if let Some(j) = self.docs.get_mut(&id).and_then(|d| d.own.as_mut()) {
                j.held = hold;
            }
            writes.extend(self.job_doc_write(id));
            // Its waiting element, held or released with it (a new one is written with the cascades).
            if let Some(h) = head_before.filter(|h| self.docs.contains_key(&h.0)) {
                self.sync_doc(h.0);
                writes.extend(self.job_doc_write(h.0));
            }
        } else {
            self.sync_doc(id);
            writes.extend(self.job_doc_write(id));
        }
        let (kind, msg) = if hold {
            ("held", format!("{what}-{id} held: not scheduled until released"))
        } else {
            ("released", format!("{what}-{id} released"))
        };
        writes.push(self.event(id, kind, msg));
        self.apply_cascades(&mut writes);
        self.dirty = true;
        let v = self.view(id).expect("present");
        self.durable(writes, reply, v);
    }

    /// Why a job waits, masked for `who`: what needs no scheduling pass (a held job, one waiting on dependencies, one
    /// that never fits, a running or ended one). `None` for a queued job: the queue view's build explains it, with
    /// its predicted start (`snapshot::Reader::explain`), so that no read runs a pass on the owner.
    pub(super) fn explain_job(&mut self, who: Principal, id: u64, reply: Reply<Why>) {
        let r = (|| {
            let d = self.docs.get(&id).ok_or_else(|| not_found("job", &id.to_string()))?;
            self.visible(&who, id, d)?;
            let now = Time(now_ms());
            let queued = Ok(Why::Queued { tenant: d.tenant.to_string() });
            // A queued job, or one waiting on dependencies, is answered from the queue view: its build explains it.
            let Some(e) = explain_without_pass(&self.st, JobId(id), now)? else { return queued };
            let state = self.state_of(id).unwrap_or(d.state);
            let job = d.job(&self.st, id).ok_or_else(|| not_found("job", &id.to_string()))?;
            let mut reason = serde_json::to_value(&e.reason).expect("reasons serialise");
            let mut message = self.mask(&who, &e.message, Some(&mut reason));
            if state.is_terminal() {
                // How it ended, rather than that it is not queued.
                let j = job;
                let last = d.more().attempts.last().and_then(|a| a.message.clone());
                let how = match (self.st.array(JobId(id)), &j.end_reason, last) {
                    // An array: how its elements ended.
                    (Some(a), _, _) => format!(
                        "array job-{id} {state}: of {} elements {} succeeded, {} failed, {} cancelled ({} of them were \
                         created, the rest never)",
                        a.total, a.succeeded, a.failed, a.cancelled, a.expanded
                    ),
                    (None, Some(r), _) => format!("job-{id} {state}: {r}"),
                    (None, None, Some(m)) => m,
                    (None, None, None) => format!("job-{id} {state} without running"),
                };
                let ran = match (d.more().attempts.first(), j.finished) {
                    (Some(a), Some(f)) => format!(
                        " ({} attempt(s); last ended {} after starting)",
                        d.more().attempts.len(),
                        gpunet_api::units::format_duration_ms(
                            f.0.saturating_sub(d.more().attempts.last().map_or(a.started_ms, |l| l.started_ms))
                        )
                    ),
                    _ => String::new(),
                };
                message = self.mask(&who, &format!("{how}{ran}"), None);
            } else if let Some(why) = self.stopping_of(job) {
                // Asked to stop (an array: its elements): running until its processes are gone.
                let what = if self.st.array(JobId(id)).is_some() { "array job" } else { "job" };
                message = format!("{what}-{id} is being {why}: its tasks are stopping (it ends once they are gone)");
            } else if let Some(deadline) = self.checkpoint_now_of(id, job.attempt()) {
                let left = gpunet_api::units::format_duration_ms(deadline.saturating_sub(now.0));
                message = format!(
                    "job-{id} is checkpointing now: a node of it is reclaimed in {left}; it resumes elsewhere from that \
                     checkpoint"
                );
            } else if job.state == gpunet_core::JobState::Running {
                let zones = self.zones_of(JobId(id));
                if zones.len() > 1 {
                    message = format!(
                        "job-{id} runs across zones {}: no zone had room for all its tasks when it started (topology                          any)",
                        zones.join(", ")
                    );
                }
            }
            let estimate = self.estimate_view(job, d);
            Ok(Why::Now(Box::new(Explain {
                id,
                state: state.to_string(),
                message,
                reason,
                position: e.position,
                eta_ms: None,
                estimate,
                as_of_ms: None,
            })))
        })();
        let _ = reply.send(r);
    }

    /// Another tenant's job is answered like a missing one (404), so that its existence is not revealed.
    fn visible(&self, who: &Principal, id: u64, doc: &JobDoc) -> Result<(), ApiError> {
        match who {
            Principal::Admin => Ok(()),
            Principal::Tenant(t) if **t == *doc.tenant => Ok(()),
            _ => Err(not_found("job", &id.to_string())),
        }
    }

    /// Whether `who` may see job `id` by its id.
    fn owns(&self, who: &Principal, id: u64) -> bool {
        match who {
            Principal::Admin => true,
            // An array's element not expanded yet has no document: it is its array's (a dependency names it).
            Principal::Tenant(t) => {
                let doc = self
                    .docs
                    .get(&id)
                    .or_else(|| self.st.array_of_element(JobId(id)).and_then(|a| self.docs.get(&a.0)));
                doc.is_some_and(|d| *d.tenant == **t)
            }
            Principal::Agent | Principal::Node(_) => false,
        }
    }

    /// Rewrites an explanation for `who`: another tenant's job ids become "another tenant's job" in the message,
    /// and are removed from the structured reason.
    pub(super) fn mask(&self, who: &Principal, message: &str, reason: Option<&mut serde_json::Value>) -> String {
        if matches!(who, Principal::Admin) {
            return message.to_string();
        }
        mask_with(|id| self.owns(who, id), message, reason)
    }

    /// Jobs not finished for good, of one tenant or of all.
    fn unfinished_ids(&self, tenant: Option<&str>) -> Vec<u64> {
        self.docs.ids_unordered(Which { tenant, states: &super::doc::LIVE, ..Which::default() }).collect()
    }

    /// Checks the per-tenant limits for `new` more jobs of `tenant` with `bytes` more spec bytes.
    /// In O(1) per submission (a scan of the tenant's documents only when the running byte count says the limit is
    /// near, or once after a start): the check ran over every job before, and throughput fell with the queue's depth.
    fn tenant_limits(&mut self, tenant: &str, new: usize, bytes: u64) -> Result<(), ApiError> {
        let queued = self.tenant_id(tenant).map_or(0, |t| self.st.tenant_queued_count(t));
        if queued + new > self.max_queued_per_tenant {
            return Err(ApiError::limit(format!(
                "tenant {tenant} has {queued} queued jobs and asked for {new} more; the server allows at most {} \
                 (--max-queued-jobs-per-tenant)",
                self.max_queued_per_tenant
            )));
        }
        let counted = self.unfinished_spec_bytes.as_ref().map(|m| m.get(tenant).copied().unwrap_or(0));
        let held = match counted {
            Some(h) if h + bytes <= self.max_spec_bytes_per_tenant => h,
            // Near the limit, or never counted: count exactly (the running count can only be above the truth).
            _ => {
                if self.unfinished_spec_bytes.is_none() {
                    let mut all: HashMap<String, u64> = HashMap::new();
                    for id in self.unfinished_ids(None) {
                        let t = self.docs[&id].tenant.clone();
                        *all.entry(t.to_string()).or_default() += self.docs.spec_bytes(id);
                    }
                    self.unfinished_spec_bytes = Some(all);
                }
                let exact: u64 = self.unfinished_ids(Some(tenant)).into_iter().map(|id| self.docs.spec_bytes(id)).sum();
                self.unfinished_spec_bytes.as_mut().expect("counted above").insert(tenant.to_string(), exact);
                exact
            }
        };
        if held + bytes > self.max_spec_bytes_per_tenant {
            return Err(ApiError::limit(format!(
                "tenant {tenant}'s unfinished jobs hold {held} bytes of specs and this submission adds {bytes}; the \
                 server allows at most {} (--max-spec-bytes-per-tenant)",
                self.max_spec_bytes_per_tenant
            )));
        }
        Ok(())
    }
}

/// Whose idempotency keys a principal shares: keys of different tenants (or the admin) never meet.
fn idempotency_scope(who: &Principal) -> String {
    match who {
        Principal::Admin => "admin".into(),
        Principal::Tenant(t) => format!("tenant:{t}"),
        Principal::Agent => "agent".into(),
        Principal::Node(n) => format!("node:{n}"),
    }
}

/// The owner's answer to `why`.
#[derive(Debug)]
pub(crate) enum Why {
    /// What needs no pass (a held job, one that never fits, a running or ended one).
    Now(Box<Explain>),
    /// A queued job (or one waiting on dependencies), of this tenant: the queue view's build explains it.
    Queued { tenant: String },
}

/// The highest id a dry run's job takes (an array's parent takes that less its element count; `answer` names them
/// "this job").
const DRY_RUN_ID: u64 = u64::MAX - 1;

/// A dry run's copy of the state with the job in it, answered off the owner.
#[derive(Debug)]
pub(crate) struct DryRunWork {
    probe: Box<gpunet_core::ClusterState>,
    id: JobId,
    /// The job that starts first: `id`, or an array's first element.
    first: JobId,
    now: Time,
    /// The tenant the answer is for (its own jobs are named, others' masked); `None` for an admin.
    masked_for: Option<gpunet_core::TenantId>,
    warnings: Vec<String>,
    /// The estimate the job would be scheduled by (given, learned as a submission would learn it, or its probe).
    estimate: Option<gpunet_api::types::EstimateView>,
    /// What its dependencies say when they are not met (it would wait for them, or fail at once): the answer, with
    /// no placement or start. Every job they name is its tenant's (`Owner::resolve_dependencies`).
    deps: Option<String>,
}

impl DryRunWork {
    /// Why it would wait (one pass on the copy), and where and when it would start (a replay of the copy).
    pub(crate) fn answer(self) -> DryRun {
        let DryRunWork { probe, id, first, now, masked_for, warnings, estimate, deps } = self;
        if let Some(message) = deps {
            return DryRun { placement: Vec::new(), eta_ms: None, message, warnings, estimate };
        }
        let owns = |j: u64| {
            let tenant =
                probe.job(JobId(j)).map(|x| x.spec.tenant).or_else(|| probe.array_spec(JobId(j)).map(|s| s.tenant));
            masked_for.is_none_or(|t| tenant == Some(t))
        };
        let indices = probe.array_spec(id).and_then(|s| s.array.as_ref()).map(|a| a.indices.as_slice());
        let message = explain(&probe, id, now)
            .map(|e| mask_with(owns, &name_dry_run(&e.message, id, indices.unwrap_or_default()), None))
            .unwrap_or_default();
        let pred = gpunet_core::predict::predict_start(&probe, first, now, 2000);
        let placement = match &pred {
            Some((t, p)) if *t == now => super::placement_view(&probe, p),
            _ => Vec::new(),
        };
        DryRun { placement, eta_ms: pred.map(|(t, _)| t.0), message, warnings, estimate }
    }
}

/// A dry run's explanation with its job and its elements named as such: `job-<id>` is "this job", `job-<id+1+k>`
/// "this job's element i" ("next element i" where the explanation says "next element job-…"), `i` the index of the
/// array's `k`-th element (`indices`: the array's, empty for a job that is none), and the id in a command
/// (`gpunet release <id>`) "<id>" (its ids mean nothing to a reader).
fn name_dry_run(message: &str, id: JobId, indices: &[u32]) -> String {
    let out = rewrite_job_ids(message, |out, n, token| match n {
        n if n == id.0 => out.push_str("this job"),
        n if n > id.0 => match indices.get((n - id.0 - 1) as usize) {
            Some(i) if out.ends_with("next element ") => out.push_str(&i.to_string()),
            Some(i) => out.push_str(&format!("this job's element {i}")),
            None => out.push_str(token),
        },
        _ => out.push_str(token),
    });
    out.replace(&format!("gpunet release {}", id.0), "gpunet release <id>")
}

/// [`Owner::mask`] with `owns` saying which job ids the reader may see named.
fn mask_with(owns: impl Fn(u64) -> bool, message: &str, reason: Option<&mut serde_json::Value>) -> String {
    if let Some(serde_json::Value::Object(r)) = reason {
        for k in ["blocked_by", "holder"] {
            if r.get(k).and_then(|v| v.as_u64()).is_some_and(|id| !owns(id)) {
                r.insert(k.into(), serde_json::Value::Null);
            }
        }
        if let Some(serde_json::Value::Array(list)) = r.get_mut("preempting") {
            list.retain(|v| v.as_u64().is_some_and(&owns));
        }
    }
    rewrite_job_ids(message, |out, id, token| out.push_str(if owns(id) { token } else { OTHER_JOB }))
}

/// The text with each `job-<digits>` token that names an id written by `write` (given the text so far, the id and the
/// token); any other text, and `job-` followed by no id, as it is.
fn rewrite_job_ids(message: &str, mut write: impl FnMut(&mut String, u64, &str)) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("job-") {
        out.push_str(&rest[..at]);
        let digits: String = rest[at + 4..].chars().take_while(char::is_ascii_digit).collect();
        match digits.parse::<u64>().ok() {
            Some(id) => write(&mut out, id, &rest[at..at + 4 + digits.len()]),
            None => {
                out.push_str("job-");
                out.push_str(&digits);
            }
        }
        rest = &rest[at + 4 + digits.len()..];
    }
    out.push_str(rest);
    out
}
