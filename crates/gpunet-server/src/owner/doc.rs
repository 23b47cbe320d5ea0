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
use gpunet_api::types::{AttemptView, JobPage, JobView};
use gpunet_core::job::RunInfo;
use gpunet_core::{ClusterState, Job, JobId, JobState, Prediction};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// A tenant's or user's name as documents hold it: one pointer (a document is kept per job, so its size counts a
/// million times at depth).
pub(crate) type Name = Arc<String>;

/// Tenant and user names, each held once however many documents name it (a million queued jobs of one tenant hold
/// one copy of its name, not a million).
#[derive(Debug, Default)]
pub(crate) struct Names(HashMap<Box<str>, Name>);

impl Names {
    /// The shared copy of `name`.
    pub(crate) fn get(&mut self, name: &str) -> Name {
        if let Some(n) = self.0.get(name) {
            return n.clone();
        }
        let n = Arc::new(name.to_string());
        self.0.insert(name.into(), n.clone());
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

/// The job states, in the order of [`Docs`]' lists.
pub(crate) const STATES: [JobState; 7] = [
    JobState::Pending,
    JobState::Running,
    JobState::Preempted,
    JobState::Restarting,
    JobState::Succeeded,
    JobState::Failed,
    JobState::Cancelled,
];

/// The states of jobs waiting in a queue ([`JobState::is_queued`]).
pub(crate) const QUEUED: [JobState; 3] = [JobState::Pending, JobState::Preempted, JobState::Restarting];
/// The states of jobs not finished for good.
pub(crate) const LIVE: [JobState; 4] =
    [JobState::Pending, JobState::Running, JobState::Preempted, JobState::Restarting];

fn slot(s: JobState) -> usize {
    STATES.iter().position(|x| *x == s).expect("every state is listed")
}

/// The job documents by id, with their ids listed by tenant, submitter and state: a listing of a tenant's jobs, of a
/// user's, or of jobs in some states walks only those and counts them from the lists' sizes, however many other jobs
/// there are; so do the job counts by state that the cluster summary, the tenants' view and the metrics show. A
/// document's listed state is the job's state now (`Owner::state_of`: an array's is its summary), kept so by
/// `Owner::relist` for every job whose state the core reports changed (`ClusterState::take_changed`). Documents are
/// never removed; a document's tenant and submitter never change.
#[derive(Debug, Default)]
pub(crate) struct Docs {
    all: BTreeMap<u64, JobDoc>,
    /// By tenant, then submitter (the documents' shared names: a lookup allocates nothing): one ordered id set per
    /// state.
    lists: HashMap<String, HashMap<Option<Name>, [BTreeSet<u64>; 7]>>,
}

impl std::ops::Deref for Docs {
    type Target = BTreeMap<u64, JobDoc>;

    fn deref(&self) -> &BTreeMap<u64, JobDoc> {
        &self.all
    }
}

/// Where a listing starts, and which way it goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Walk {
    /// Ids above this, ascending.
    After(u64),
    /// Ids below this, descending.
    Before(u64),
}

/// Which jobs a listing or a count takes: a tenant's (all: `None`), a submitter's (all: `None`), in some states (any:
/// empty).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Which<'a> {
    pub(crate) tenant: Option<&'a str>,
    pub(crate) user: Option<&'a str>,
    pub(crate) states: &'a [JobState],
}

impl Docs {
    fn list_mut(&mut self, d: &JobDoc) -> &mut [BTreeSet<u64>; 7] {
        if !self.lists.contains_key(d.tenant.as_str()) {
            self.lists.insert(d.tenant.to_string(), HashMap::new());
        }
        let by_user = self.lists.get_mut(d.tenant.as_str()).expect("inserted above");
        by_user.entry(d.submitted_by.clone()).or_default()
    }

    /// Adds a document, listed in `state`.
    pub(crate) fn insert(&mut self, id: u64, mut doc: JobDoc, state: JobState) {
        if let Some(old) = self.all.remove(&id) {
            // A document replaced (never with another tenant or submitter): its id is listed once.
            self.list_mut(&old)[slot(old.listed)].remove(&id);
        }
        doc.listed = state;
        self.list_mut(&doc)[slot(state)].insert(id);
        self.all.insert(id, doc);
    }

    /// The bytes of job `id`'s submission, as the per-tenant limit counts them (0 for an unknown job).
    pub(crate) fn spec_bytes(&self, id: u64) -> u64 {
        self.all.get(&id).map_or(0, |d| d.submission.len())
    }

    /// A document to change (never its tenant or submitter).
    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut JobDoc> {
        self.all.get_mut(id)
    }

    /// Lists document `id` in `state`.
    pub(crate) fn set_state(&mut self, id: u64, state: JobState) {
        let Some(d) = self.all.get_mut(&id) else { return };
        let old = std::mem::replace(&mut d.listed, state);
        if old == state {
            return;
        }
        if let Some(l) = self.lists.get_mut(d.tenant.as_str()).and_then(|u| u.get_mut(&d.submitted_by)) {
            l[slot(old)].remove(&id);
            l[slot(state)].insert(id);
        }
    }

    /// The lists that hold what `w` takes.
    fn chosen<'a>(&'a self, w: Which<'a>) -> impl Iterator<Item = &'a BTreeSet<u64>> + 'a {
        let tenants: Vec<&HashMap<Option<Name>, [BTreeSet<u64>; 7]>> = match w.tenant {
            Some(t) => self.lists.get(t).into_iter().collect(),
            None => self.lists.values().collect(),
        };
        tenants
            .into_iter()
            .flat_map(move |by_user| {
                by_user
                    .iter()
                    .filter(move |(u, _)| w.user.is_none() || u.as_deref().map(String::as_str) == w.user)
                    .map(|(_, l)| l)
            })
            .flat_map(move |l| {
                l.iter()
                    .enumerate()
                    .filter(move |(i, _)| w.states.is_empty() || w.states.contains(&STATES[*i]))
                    .map(|(_, s)| s)
            })
    }

    /// How many jobs `w` takes.
    pub(crate) fn count(&self, w: Which<'_>) -> usize {
        if w.tenant.is_none() && w.user.is_none() && w.states.is_empty() {
            return self.all.len();
        }
        self.chosen(w).map(BTreeSet::len).sum()
    }

    /// Jobs by state, of `tenant` (all: `None`).
    pub(crate) fn by_state(&self, tenant: Option<&str>) -> [usize; 7] {
        let mut n = [0; 7];
        for (i, s) in STATES.iter().enumerate() {
            n[i] = self.count(Which { tenant, states: std::slice::from_ref(s), ..Which::default() });
        }
        n
    }

    /// The ids of the jobs `w` takes, from `walk` on: one merge of the lists that hold them, each step O(lists).
    pub(crate) fn ids<'a>(&'a self, w: Which<'a>, walk: Walk) -> Box<dyn Iterator<Item = u64> + 'a> {
        if w.tenant.is_none() && w.user.is_none() && w.states.is_empty() {
            return match walk {
                Walk::After(a) => Box::new(self.all.range(a.saturating_add(1)..).map(|(id, _)| *id)),
                Walk::Before(b) => Box::new(self.all.range(..b).rev().map(|(id, _)| *id)),
            };
        }
        let mut heads: Vec<Box<dyn Iterator<Item = &u64> + 'a>> = self
            .chosen(w)
            .filter(|s| !s.is_empty())
            .map(|s| {
                let it: Box<dyn Iterator<Item = &u64> + 'a> = match walk {
                    Walk::After(a) => Box::new(s.range(a.saturating_add(1)..)),
                    Walk::Before(b) => Box::new(s.range(..b).rev()),
                };
                it
            })
            .collect();
        // A max-heap of each list's next id (ascending: of its complement), so each step is O(log lists).
        let up = matches!(walk, Walk::After(_));
        let key = move |id: u64| if up { u64::MAX - id } else { id };
        let mut heap: std::collections::BinaryHeap<(u64, usize)> =
            heads.iter_mut().enumerate().filter_map(|(i, h)| h.next().map(|id| (key(*id), i))).collect();
        Box::new(std::iter::from_fn(move || {
            let (k, i) = heap.pop()?;
            if let Some(id) = heads[i].next() {
                heap.push((key(*id), i));
            }
            Some(key(k))
        }))
    }

    /// The ids of the jobs `w` takes, in no particular order.
    pub(crate) fn ids_unordered<'a>(&'a self, w: Which<'a>) -> impl Iterator<Item = u64> + 'a {
        self.chosen(w).flat_map(|s| s.iter().copied())
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
    /// The state it is listed in ([`Docs`]).
    listed: JobState,
    /// Its tenant's name, shared by all of the tenant's documents ([`Names`]).
    pub(crate) tenant: Name,
    pub(crate) submission: Packed,
    /// Who submitted it (the token's user, else its role), shared like the tenant's name.
    pub(crate) submitted_by: Option<Name>,
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
    /// Milliseconds its ended attempts held their resources, from start to confirmed end, summed over every attempt
    /// (`attempts` keeps the newest only): what its time not running is counted from when it ends, after a restart of
    /// the server too.
    pub(crate) held_ms: u64,
}

static NO_MORE: More = More {
    warnings: Vec::new(),
    last_run: None,
    idempotency_key: None,
    attempts: Vec::new(),
    learned_estimate: None,
    util: None,
    held_ms: 0,
};

impl More {
    fn is_empty(&self) -> bool {
        self.warnings.is_empty()
            && self.last_run.is_none()
            && self.idempotency_key.is_none()
            && self.attempts.is_empty()
            && self.learned_estimate.is_none()
            && self.util.is_none()
            && self.held_ms == 0
    }
}

impl JobDoc {
    /// A new job's document (its job is the core's).
    pub(crate) fn new(tenant: Name, submission: Packed, submitted_by: Option<Name>, more: More) -> JobDoc {
        JobDoc {
            own: None,
            state: JobState::Pending,
            listed: JobState::Pending,
            tenant,
            submission,
            submitted_by,
            more: (!more.is_empty()).then(|| Box::new(more)),
        }
    }

    /// The state it is listed in ([`Docs`]).
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn listed(&self) -> JobState {
        self.listed
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
            submitted_by: self.submitted_by.as_deref().map(String::as_str),
            idempotency_key: m.idempotency_key.as_deref(),
            attempts: &m.attempts,
            learned_estimate: m.learned_estimate.as_ref(),
            util: m.util.as_ref(),
            held_ms: m.held_ms,
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
            held_ms: s.held_ms,
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
    #[serde(skip_serializing_if = "is_zero")]
    held_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    #[serde(default)]
    held_ms: u64,
}

/// A submission kept as its compact JSON text, without the fields that hold their default value (what
/// `serde_json::to_string` writes of it, less those): a trivial one is about sixty bytes, against 600 for the parsed
/// struct and its strings. Parsed where it is used ([`Packed::get`]): an absent field reads as its default again.
/// The stored documents carry the same text, so a default changed in a later version applies to jobs already
/// submitted that left the field out, as it would had they been sent without it.
#[derive(Debug, Clone)]
pub(crate) struct Packed(Box<RawValue>);

/// Every field of a submission at its default, as JSON (the one required field, `name`, left out).
static DEFAULTS: std::sync::LazyLock<serde_json::Map<String, serde_json::Value>> = std::sync::LazyLock::new(|| {
    let base: JobSubmission = serde_json::from_str(r#"{"name":""}"#).expect("a submission needs only a name");
    match serde_json::to_value(base).expect("a submission serialises") {
        serde_json::Value::Object(mut m) => {
            m.remove("name");
            m
        }
        _ => unreachable!("a submission serialises as an object"),
    }
});

/// A submission with only an empty name: what a view holds until its packed submission is parsed ([`Unparsed`]);
/// cloning it allocates nothing.
static EMPTY: std::sync::LazyLock<JobSubmission> =
    std::sync::LazyLock::new(|| serde_json::from_str(r#"{"name":""}"#).expect("a submission needs only a name"));

/// A job's view as the owner gathers it, with its submission still packed: parsing the submission is most of what a
/// view costs, so the reader parses it ([`Unparsed::parse`]), off the owner (`GET /v1/jobs` and `GET /v1/jobs/{id}`).
#[derive(Debug)]
pub(crate) struct Unparsed {
    view: JobView,
    spec: Packed,
}

impl Unparsed {
    /// `view` (whose `spec`, [`Unparsed::empty`] until parsed, is replaced when parsed) with the packed submission
    /// `spec`. The view is never handed out before [`Unparsed::parse`].
    pub(crate) fn new(view: JobView, spec: Packed) -> Unparsed {
        Unparsed { view, spec }
    }

    /// What a view's `spec` holds until it is parsed.
    pub(crate) fn empty() -> JobSubmission {
        EMPTY.clone()
    }

    pub(crate) fn id(&self) -> u64 {
        self.view.id
    }

    /// Its tasks (known without parsing the submission).
    pub(crate) fn tasks(&self) -> u32 {
        self.view.tasks
    }

    /// Its state.
    pub(crate) fn state(&self) -> &str {
        &self.view.state
    }

    /// The view, its submission parsed.
    pub(crate) fn parse(self) -> JobView {
        let Unparsed { mut view, spec } = self;
        view.spec = spec.get();
        view
    }
}

/// A page of [`Unparsed`] views.
#[derive(Debug)]
pub(crate) struct UnparsedPage {
    pub(crate) jobs: Vec<Unparsed>,
    pub(crate) next: Option<u64>,
    pub(crate) total: usize,
}

impl UnparsedPage {
    pub(crate) fn parse(self) -> JobPage {
        JobPage { jobs: self.jobs.into_iter().map(Unparsed::parse).collect(), next: self.next, total: self.total }
    }
}

impl Packed {
    pub(crate) fn new(sub: &JobSubmission) -> Packed {
        Packed(RawValue::from_string(Packed::text(sub)).expect("serde_json writes valid JSON"))
    }

    /// The text kept of `sub`.
    fn text(sub: &JobSubmission) -> String {
        let mut v = serde_json::to_value(sub).expect("a submission serialises");
        if let serde_json::Value::Object(m) = &mut v {
            m.retain(|k, x| DEFAULTS.get(k) != Some(x));
        }
        serde_json::to_string(&v).expect("a JSON value serialises")
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
        Packed::text(sub) == self.0.get()
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
    fn the_state_subsets_are_those_of_the_core() {
        let queued: Vec<JobState> = STATES.into_iter().filter(|s| s.is_queued()).collect();
        let live: Vec<JobState> = STATES.into_iter().filter(|s| !s.is_terminal()).collect();
        assert_eq!((&queued[..], &live[..]), (&QUEUED[..], &LIVE[..]));
    }

    #[test]
    fn a_document_is_stored_as_one_object_and_read_back_whole() {
        let s = sub(r#"{"name":"train","gpus":2,"command":["python","train.py"],"env":{"A":"b c"}}"#);
        let job = Job::new(JobId(7), JobSpec::new(TenantId(0), "train", 2, 1), Time(123));
        let more =
            More { warnings: vec!["w".into()], idempotency_key: Some("tenant:acme:k".into()), ..More::default() };
        let doc = JobDoc::new(Arc::new("acme".into()), Packed::new(&s), Some(Arc::new("ana".into())), more);
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
        assert_eq!(back.submitted_by.as_deref().map(String::as_str), Some("ana"));
        assert_eq!(back.more().idempotency_key.as_deref(), Some("tenant:acme:k"));
        // A document with none of the rest keeps one empty pointer for it.
        let plain = JobDoc::new(Arc::new("acme".into()), Packed::new(&s), None, More::default());
        assert!(plain.more.is_none() && plain.more().attempts.is_empty());
        assert!(std::mem::size_of::<JobDoc>() <= 56, "{} bytes", std::mem::size_of::<JobDoc>());
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
        // Fields at their default are left out: only what the submission said is kept.
        assert_eq!(p.0.get(), r#"{"command":["true"],"gpus":1,"name":"fill","tenant":"bench"}"#);
        assert!(p.len() < 64, "{} bytes", p.len());
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
#[cfg(test)]
mod lists {
    use super::*;
    use proptest::prelude::*;

    fn doc(tenant: &str, user: Option<&str>) -> JobDoc {
        let s: JobSubmission = serde_json::from_str(r#"{"name":"x"}"#).expect("submission");
        JobDoc::new(
            Arc::new(tenant.to_string()),
            Packed::new(&s),
            user.map(|u| Arc::new(u.to_string())),
            More::default(),
        )
    }

    proptest! {
        /// The lists by tenant, submitter and state answer what a walk of every document would: the same ids in the
        /// same order, from any start, both ways, and the same counts, after any inserts and state changes.
        #[test]
        fn the_lists_answer_what_a_walk_of_every_document_would(
            ops in prop::collection::vec((0u64..60, 0usize..3, 0usize..3, 0usize..7, any::<bool>()), 1..120),
            tenant in prop::option::of(0usize..4),
            user in prop::option::of(0usize..4),
            states in prop::collection::vec(0usize..7, 0..3),
            from in 0u64..70,
            down in any::<bool>(),
        ) {
            let names = ["a", "b", "c", "nobody"];
            // Submitters: none (a document without one), or one of three.
            let users = [None, Some("ana"), Some("bo"), Some("cy")];
            let mut docs = Docs::default();
            let mut truth: BTreeMap<u64, (usize, usize, JobState)> = BTreeMap::new();
            for (id, t, u, s, change) in ops {
                match truth.get_mut(&id) {
                    Some((_, _, st)) if change => {
                        docs.set_state(id, STATES[s]);
                        *st = STATES[s];
                    }
                    Some(_) => {}
                    None => {
                        docs.insert(id, doc(names[t], users[u]), STATES[s]);
                        truth.insert(id, (t, u, STATES[s]));
                    }
                }
            }
            let states: Vec<JobState> = states.into_iter().map(|i| STATES[i]).collect();
            // A user filter names a user (`None` here: no filter).
            let user = user.and_then(|u| users[u]);
            let want = |id: &u64| {
                let (t, u, s) = truth[id];
                tenant.is_none_or(|x| x == t)
                    && user.is_none_or(|x| users[u] == Some(x))
                    && (states.is_empty() || states.contains(&s))
            };
            let walk = if down { Walk::Before(from) } else { Walk::After(from) };
            let mut expect: Vec<u64> = truth.keys().copied().filter(want).collect();
            if down {
                expect.retain(|id| *id < from);
                expect.reverse();
            } else {
                expect.retain(|id| *id > from);
            }
            let w = Which { tenant: tenant.map(|i| names[i]), user, states: &states };
            prop_assert_eq!(docs.ids(w, walk).collect::<Vec<_>>(), expect);
            prop_assert_eq!(docs.count(w), truth.keys().filter(|id| want(id)).count());
            let mut all: Vec<u64> = docs.ids_unordered(w).collect();
            all.sort_unstable();
            prop_assert_eq!(all, truth.keys().copied().filter(want).collect::<Vec<_>>());
            let by = docs.by_state(w.tenant);
            for (i, s) in STATES.iter().enumerate() {
                let n = truth.values().filter(|(x, _, y)| tenant.is_none_or(|w| w == *x) && y == s).count();
                prop_assert_eq!(by[i], n);
            }
            for (id, (_, _, s)) in &truth {
                prop_assert_eq!(docs[id].listed(), *s);
            }
        }
    }
}
