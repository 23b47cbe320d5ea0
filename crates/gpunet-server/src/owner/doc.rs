//! A job's document: what the server keeps of a job beside the core's [`Job`], and its stored form.
//!
//! With a million queued jobs every byte a job holds is a megabyte, so a document holds no second copy of what the
//! core holds: the core's `Job` is the only live one (an array's parent, which the core keeps only as a summary, is
//! the exception and keeps its own). The submission, needed only when a task starts and when the job is shown, is
//! kept as its compact JSON text ([`Packed`]) and parsed when used. The stored form is unchanged: one JSON object
//! with the job, the tenant, the submission and the rest, written from the core's job and this document together
//! ([`JobDoc::stored`]) and split again when read ([`JobDoc::load`]).

use super::utilisation;
use gpunet_api::spec::JobSubmission;
use gpunet_api::types::AttemptView;
use gpunet_core::job::RunInfo;
use gpunet_core::{ClusterState, Job, JobId, JobState, Prediction};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::sync::Arc;

/// Tenant and user names, each held once however many documents name it (a million queued jobs of one tenant hold
/// one copy of its name, not a million).
#[derive(Debug, Default)]
pub(crate) struct Names(HashSet<Arc<str>>);

impl Names {
    /// The shared copy of `name`.
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.get(name) {
            return n.clone();
        }
        let n: Arc<str> = name.into();
        self.0.insert(n.clone());
        n
    }

    /// A document's names replaced by the shared copies.
    pub(crate) fn share(&mut self, d: &mut JobDoc) {
        d.tenant = self.get(&d.tenant);
        if let Some(u) = d.submitted_by.take() {
            d.submitted_by = Some(self.get(&u));
        }
    }
}

/// A job's server-side document.
#[derive(Debug, Clone)]
pub(crate) struct JobDoc {
    /// The job itself where the core holds none (an array's parent, see `gpunet_core::array`); every other job's is
    /// the core's, read with [`JobDoc::job`].
    pub(crate) own: Option<Box<Job>>,
    /// The job's state when its document was last brought up to the core's (`Owner::sync_doc`, at start-up and at an
    /// element's expansion): an end is seen by comparing it with the core's. Unused for an array's parent.
    pub(crate) state: JobState,
    /// Its tenant's name, shared by all of the tenant's documents ([`Names`]).
    pub(crate) tenant: Arc<str>,
    pub(crate) submission: Packed,
    /// Who submitted it (the token's user, else its role), shared like the tenant's name.
    pub(crate) submitted_by: Option<Arc<str>>,
    /// What a job gathers as it runs and what few submissions carry: one pointer while it has none of it (most
    /// queued jobs), read with [`JobDoc::more`].
    more: Option<Box<More>>,
}

/// The parts of a document most queued jobs do not have.
#[derive(Debug, Clone, Default)]
pub(crate) struct More {
    pub(crate) warnings: Vec<String>,
    /// The latest attempt's run, kept after the job ends so that its start and placement can still be shown.
    pub(crate) last_run: Option<RunInfo>,
    /// The submission's `Idempotency-Key`, scoped to who sent it (see `Owner::idempotent`): stored with the job, so a
    /// retried submission finds its jobs after a restart or a failover too.
    pub(crate) idempotency_key: Option<String>,
    /// Its attempts, oldest first (the newest `MAX_ATTEMPT_RECORDS`): recorded at each start and completed when
    /// the attempt's end is confirmed.
    pub(crate) attempts: Vec<AttemptView>,
    /// The prediction given to a job submitted without an estimate (see `owner/estimates.rs`).
    pub(crate) learned_estimate: Option<Prediction>,
    /// The running attempt's GPU utilisation so far, stored every `utilisation::FLUSH_EVERY` so that a restart goes on
    /// from it (see `owner/utilisation.rs`).
    pub(crate) util: Option<utilisation::Progress>,
}

static NO_MORE: More = More {
    warnings: Vec::new(),
    last_run: None,
    idempotency_key: None,
    attempts: Vec::new(),
    learned_estimate: None,
    util: None,
};

impl More {
    fn is_empty(&self) -> bool {
        self.warnings.is_empty()
            && self.last_run.is_none()
            && self.idempotency_key.is_none()
            && self.attempts.is_empty()
            && self.learned_estimate.is_none()
            && self.util.is_none()
    }
}

impl JobDoc {
    /// A new job's document (its job is the core's).
    pub(crate) fn new(tenant: Arc<str>, submission: Packed, submitted_by: Option<Arc<str>>, more: More) -> JobDoc {
        JobDoc {
            own: None,
            state: JobState::Pending,
            tenant,
            submission,
            submitted_by,
            more: (!more.is_empty()).then(|| Box::new(more)),
        }
    }

    /// Its warnings, attempts, last run and the rest (empty for most queued jobs).
    pub(crate) fn more(&self) -> &More {
        self.more.as_deref().unwrap_or(&NO_MORE)
    }

    /// The same, to change.
    pub(crate) fn more_mut(&mut self) -> &mut More {
        self.more.get_or_insert_with(Box::default)
    }

    /// The job of document `id`: the core's, else the document's own (an array's parent).
    pub(crate) fn job<'a>(&'a self, st: &'a ClusterState, id: u64) -> Option<&'a Job> {
        st.job(JobId(id)).or(self.own.as_deref())
    }

    /// The state of document `id`'s job now: its job's (the core's, or an array parent's own summary).
    pub(crate) fn live_state(&self, st: &ClusterState, id: u64) -> JobState {
        self.job(st, id).map_or(self.state, |j| j.state)
    }

    /// The stored form of this document with `job` (the core's job, or the document's own).
    pub(crate) fn stored<'a>(&'a self, job: &'a Job) -> StoredRef<'a> {
        let m = self.more();
        StoredRef {
            job,
            tenant: &self.tenant,
            submission: &self.submission.0,
            warnings: &m.warnings,
            last_run: m.last_run.as_ref(),
            submitted_by: self.submitted_by.as_deref(),
            idempotency_key: m.idempotency_key.as_deref(),
            attempts: &m.attempts,
            learned_estimate: m.learned_estimate.as_ref(),
            util: m.util.as_ref(),
        }
    }

    /// Whether a stored document is restored in the first pass at start-up (a running job, or an array), read
    /// without parsing the rest of it.
    pub(crate) fn restored_first(text: &str) -> Result<bool, serde_json::Error> {
        #[derive(Deserialize)]
        struct Peek {
            job: PeekJob,
        }
        #[derive(Deserialize)]
        struct PeekJob {
            state: JobState,
            spec: PeekSpec,
        }
        #[derive(Deserialize)]
        struct PeekSpec {
            #[serde(default)]
            array: Option<serde::de::IgnoredAny>,
        }
        let p: Peek = serde_json::from_str(text)?;
        Ok(p.job.state == JobState::Running || p.job.spec.array.is_some())
    }

    /// Reads a stored document: its job and the rest (which keeps no job).
    pub(crate) fn load(text: &str) -> Result<(Job, JobDoc), serde_json::Error> {
        let s: Stored = serde_json::from_str(text)?;
        let submission = Packed::from_stored(&s.submission)?;
        let more = More {
            warnings: s.warnings,
            last_run: s.last_run,
            idempotency_key: s.idempotency_key,
            attempts: s.attempts,
            learned_estimate: s.learned_estimate,
            util: s.util,
        };
        let mut doc = JobDoc::new(s.tenant.into(), submission, s.submitted_by.map(Into::into), more);
        doc.state = s.job.state;
        Ok((s.job, doc))
    }
}

/// A document as stored, borrowed for writing.
#[derive(Serialize)]
pub(crate) struct StoredRef<'a> {
    job: &'a Job,
    tenant: &'a str,
    submission: &'a RawValue,
    warnings: &'a [String],
    last_run: Option<&'a RunInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    submitted_by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    attempts: &'a [AttemptView],
    #[serde(skip_serializing_if = "Option::is_none")]
    learned_estimate: Option<&'a Prediction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    util: Option<&'a utilisation::Progress>,
}

/// A document as stored, read.
#[derive(Deserialize)]
struct Stored {
    job: Job,
    tenant: String,
    submission: Box<RawValue>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    last_run: Option<RunInfo>,
    #[serde(default)]
    submitted_by: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    attempts: Vec<AttemptView>,
    #[serde(default)]
    learned_estimate: Option<Prediction>,
    #[serde(default)]
    util: Option<utilisation::Progress>,
}

/// A submission kept as its compact JSON text (what `serde_json::to_string` writes of it): a trivial one is about a
/// hundred bytes, against 600 for the parsed struct and its strings. Parsed where it is used ([`Packed::get`]).
#[derive(Debug, Clone)]
pub(crate) struct Packed(Box<RawValue>);

impl Packed {
    pub(crate) fn new(sub: &JobSubmission) -> Packed {
        let text = serde_json::to_string(sub).expect("a submission serialises");
        Packed(RawValue::from_string(text).expect("serde_json writes valid JSON"))
    }

    /// A stored submission, checked (it must parse as one) and made compact again if it is not (a store may keep
    /// JSON in its own layout).
    fn from_stored(raw: &RawValue) -> Result<Packed, serde_json::Error> {
        let sub: JobSubmission = serde_json::from_str(raw.get())?;
        let p = Packed::new(&sub);
        Ok(if p.0.get() == raw.get() { Packed(raw.to_owned()) } else { p })
    }

    /// The submission.
    pub(crate) fn get(&self) -> JobSubmission {
        serde_json::from_str(self.0.get()).expect("a packed submission was written from one")
    }

    /// Its size in bytes as stored (what the per-tenant spec-byte limit counts).
    pub(crate) fn len(&self) -> u64 {
        self.0.get().len() as u64
    }

    /// Whether it is `sub`, as written.
    pub(crate) fn is(&self, sub: &JobSubmission) -> bool {
        serde_json::to_string(sub).is_ok_and(|t| t == self.0.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunet_core::{JobSpec, TenantId, Time};

    fn sub(json: &str) -> JobSubmission {
        serde_json::from_str(json).expect("submission")
    }

    #[test]
    fn a_document_is_stored_as_one_object_and_read_back_whole() {
        let s = sub(r#"{"name":"train","gpus":2,"command":["python","train.py"],"env":{"A":"b c"}}"#);
        let job = Job::new(JobId(7), JobSpec::new(TenantId(0), "train", 2, 1), Time(123));
        let more =
            More { warnings: vec!["w".into()], idempotency_key: Some("tenant:acme:k".into()), ..More::default() };
        let doc = JobDoc::new("acme".into(), Packed::new(&s), Some("ana".into()), more);
        let text = serde_json::to_string(&doc.stored(&job)).expect("serialise");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["job"]["id"], 7);
        assert_eq!(v["tenant"], "acme");
        assert_eq!(v["submission"]["env"]["A"], "b c");
        // Through a generic JSON value too (the store's writes carry one).
        assert_eq!(serde_json::to_value(doc.stored(&job)).expect("value"), v);
        let (j, back) = JobDoc::load(&text).expect("load");
        assert_eq!(j.id, JobId(7));
        assert_eq!(j.spec.name, "train");
        assert_eq!(&*back.tenant, "acme");
        assert_eq!(back.more().warnings, vec!["w".to_string()]);
        assert_eq!(back.submitted_by.as_deref(), Some("ana"));
        assert_eq!(back.more().idempotency_key.as_deref(), Some("tenant:acme:k"));
        // A document with none of the rest keeps one empty pointer for it.
        let plain = JobDoc::new("acme".into(), Packed::new(&s), None, More::default());
        assert!(plain.more.is_none() && plain.more().attempts.is_empty());
        assert!(std::mem::size_of::<JobDoc>() <= 72, "{} bytes", std::mem::size_of::<JobDoc>());
        // Names are held once.
        let mut names = Names::default();
        let (mut a, mut b) = (plain.clone(), back.clone());
        names.share(&mut a);
        names.share(&mut b);
        assert!(Arc::ptr_eq(&a.tenant, &b.tenant));
        assert_eq!(names.0.len(), 2, "acme and ana");
        assert!(back.submission.is(&s));
        assert_eq!(back.submission.get(), s);
        assert!(back.own.is_none());
        // A queued job is restored in the second pass at start-up; a running one or an array in the first.
        assert!(!JobDoc::restored_first(&text).expect("peek"));
        let running = text.replace(r#""state":"pending""#, r#""state":"running""#);
        assert!(JobDoc::restored_first(&running).expect("peek"));
        assert!(JobDoc::restored_first("{\"job\":{}}").is_err(), "a document without a state is refused");
    }

    #[test]
    fn a_stored_submission_in_another_layout_is_made_compact_and_a_broken_one_is_refused() {
        let spaced = r#"{"job":JOB,"tenant":"t","submission":{ "name" : "x", "gpus" : 1 }}"#;
        let job =
            serde_json::to_string(&Job::new(JobId(1), JobSpec::new(TenantId(0), "x", 1, 1), Time(0))).expect("job");
        let (_, d) = JobDoc::load(&spaced.replace("JOB", &job)).expect("load");
        assert_eq!(d.submission.len(), Packed::new(&d.submission.get()).len());
        assert!(!d.submission.0.get().contains(' '));
        let broken = r#"{"job":JOB,"tenant":"t","submission":{"name":"x","gpus":"many"}}"#;
        assert!(JobDoc::load(&broken.replace("JOB", &job)).is_err());
    }

    #[test]
    fn a_packed_submission_is_smaller_than_the_parsed_one() {
        let s = sub(r#"{"name":"fill","gpus":1,"command":["true"],"tenant":"bench"}"#);
        let p = Packed::new(&s);
        assert!(p.len() < 200, "{} bytes", p.len());
        assert!(p.len() < std::mem::size_of::<JobSubmission>() as u64);
        assert_eq!(p.get(), s);
    }

    /// Every field a submission may carry comes back from its packed text as it was (a packed submission that did
    /// not parse again would stop the owner).
    #[test]
    fn a_submission_with_every_field_comes_back_whole() {
        let mut s = gpunet_api::spec::parse_job(include_str!("../../../../fuzz/seeds/job_spec/native-full.yaml"))
            .expect("the full example parses")
            .job;
        s.checkpoint_tiers = vec![gpunet_api::spec::CheckpointTierSpec {
            name: "archive".into(),
            every: "1h".into(),
            keep: Some(3),
            url: Some("s3://bucket/{tenant}/x \"quoted\" é".into()),
        }];
        s.array = Some("0-99:2%8".into());
        s.dependency = Some("afterok:12:13,singleton".into());
        s.hold = true;
        s.hold_never_fits = true;
        s.time_limit = Some("3h".into());
        s.mig = Some("1g.10gb".into());
        s.env.insert("MULTI\nLINE".into(), "a\u{0}b\n\"c\"".into());
        let p = Packed::new(&s);
        assert_eq!(p.get(), s);
        assert!(p.is(&s));
        let mut other = s.clone();
        other.hold = false;
        assert!(!p.is(&other));
    }
}
