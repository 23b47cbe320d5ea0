//! The queue view, off the owner: `GET /v1/queue` (the portal's Queue page, refreshed every 2 s by every reader) is
//! answered from a [`QueueSnapshot`] that the owner publishes, never by the owner itself, so that no reader, however
//! many, delays a submission, an agent's sync or a pass.
//!
//! The owner builds a snapshot after a batch of changes (and every [`REFRESH`] to keep relative times fresh): the
//! queue in policy order as far as it takes (at most [`WALK`] positions, unless a job asked about is further back) to
//! find the first [`QUEUE_ROWS`] jobs of it and of each tenant with their places, explained by one pass that notes
//! what it finds about each (`gpunet_core::explain_queue`), and their predicted starts from one replay of a bounded
//! copy of the state (`gpunet_core::predict`). Messages for a tenant are masked when built. A build is at most every
//! ten times the last one's cost (and [`UNWAITED_GAP`]), so that building takes at most about a tenth of the owner's
//! time whatever the depth of the queue; while a reader waits for its own change (below) the next build comes after
//! one cost instead (at most half the owner's time, only while someone waits).
//!
//! Every change the owner makes bumps a sequence number before it is applied (and so before anyone is told of it); a
//! snapshot carries the number it was built at. Each change a token asks for (any request but a read, answered with
//! success) records the number when it is answered ([`Reader::wrote`]); a read with that token waits (at most
//! [`READ_WAIT`]) for a snapshot at least as new: a client that submitted a job and then reads the queue sees its job.
//! Others' changes do not hold a read back (with submissions arriving without pause, a read would otherwise wait for
//! the next build every time): they show in the next build, whose time the view carries (`as_of_ms`).
//!
//! `why` of a queued job is answered from here too ([`Reader::explain`]): the job is noted as asked about, and each
//! build for the next [`ASKED_FOR`] explains every job asked about with the same one pass that explains the queue's
//! first rows, and predicts their starts with the same replay. A read that finds no explanation yet brings the next
//! build forward as a reader of its own change does. So no `why`, however deep its job, runs a pass on the owner.

use super::Owner;
use crate::{now_ms, Principal};
use gpunet_api::types::{Explain, QueueEntry, QueueView};
use gpunet_core::{explain_queue, explain_without_pass, queue_walk, JobId, TenantId, Time};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Rows kept for the whole queue and for each tenant: the API's largest `limit`.
pub(crate) const QUEUE_ROWS: usize = 200;
/// Positions of the queue walked for a snapshot: a tenant's jobs further back are counted in its `visible_length`
/// but not listed.
pub(crate) const WALK: usize = 100_000;
/// A snapshot is rebuilt at least this often while anything is queued, so that its relative times stay true.
pub(crate) const REFRESH: Duration = Duration::from_secs(2);
/// The shortest time between two builds.
const MIN_GAP: Duration = Duration::from_millis(2);
/// The shortest time between two builds that no reader waits for: others' changes show within about this (a build of
/// a shallow queue costs well under a millisecond, and ten times that would rebuild it a few hundred times a second
/// under a stream of submissions, for a view the portal reads every 2 s).
const UNWAITED_GAP: Duration = Duration::from_millis(50);
/// Tokens remembered in [`Reader::wrote`] before those whose changes are all published are forgotten.
const WRITTEN_PRUNE_AT: usize = 4096;
/// How long a reader waits for a snapshot that includes the changes made before it asked.
pub(crate) const READ_WAIT: Duration = Duration::from_secs(2);
/// How long a job `why` was asked about is explained in each build (a client polling `why` finds it at once).
pub(crate) const ASKED_FOR: Duration = Duration::from_secs(60);
/// Most jobs explained on request in one build (the latest requests; older ones beyond it are not explained).
const ASKED_MAX: usize = 1000;
/// Most requests remembered in all.
const ASKED_KEPT: usize = 2 * ASKED_MAX;
/// Most requests remembered per tenant (a tenant asking about many jobs in a loop evicts its own oldest, not others').
const ASKED_PER_TENANT: usize = 100;
/// How long `why` waits for a build that explains its job (a deep job is placed by a walk of the whole queue).
pub(crate) const EXPLAIN_WAIT: Duration = Duration::from_secs(10);

/// The queue as published by the owner.
#[derive(Debug, Default)]
pub(crate) struct QueueSnapshot {
    /// The owner's change number when it was built.
    pub(crate) seq: u64,
    /// When it was built, ms since the Unix epoch.
    pub(crate) at_ms: u64,
    policy: String,
    queue_length: usize,
    /// Jobs waiting (queued, waiting for dependencies or held), all tenants.
    waiting: usize,
    /// The first rows of the whole queue, then jobs in no queue (dependency waits, then held), unmasked.
    all: Vec<QueueEntry>,
    /// Each tenant's jobs waiting, and its first rows (masked for it).
    tenants: HashMap<String, (usize, Vec<QueueEntry>)>,
    /// Queued jobs asked about with `why`: their explanation for an admin, and for their own tenant (masked).
    /// `None`: the job is not queued any more (the owner explains it).
    explained: HashMap<u64, Option<Box<(Explain, Explain)>>>,
}

/// What a build says of a job asked about.
#[derive(Debug)]
pub(crate) enum Explained {
    /// Its explanation.
    Queued(Box<Explain>),
    /// It is not queued (any more): the owner explains it.
    NotQueued,
    /// No build had it within [`EXPLAIN_WAIT`].
    Late,
}

impl QueueSnapshot {
    /// What `who` may see of it, at most `limit` rows.
    pub(crate) fn view(&self, who: &Principal, limit: usize) -> QueueView {
        let (visible_length, rows) = match who {
            Principal::Tenant(t) => self.tenants.get(t).map_or((0, &[][..]), |(n, rows)| (*n, &rows[..])),
            _ => (self.waiting, &self.all[..]),
        };
        QueueView {
            policy: self.policy.clone(),
            queue_length: self.queue_length,
            visible_length,
            entries: rows.iter().take(limit).cloned().collect(),
            as_of_ms: Some(self.at_ms),
        }
    }

    fn explanation(&self, id: u64, admin: bool) -> Option<Explained> {
        Some(match self.explained.get(&id)? {
            None => Explained::NotQueued,
            Some(b) => Explained::Queued(Box::new(if admin { b.0.clone() } else { b.1.clone() })),
        })
    }
}

/// The owner's side: the change number, the channel, and when to build next.
#[derive(Debug)]
pub(crate) struct Publisher {
    pub(crate) seq: Arc<AtomicU64>,
    /// The newest change number a reader waits for, and the owner's wake-up when one starts waiting.
    wanted: Arc<AtomicU64>,
    pub(crate) wake: Arc<tokio::sync::Notify>,
    /// Jobs asked about with `why`, and when last; set when one is not in the published view yet.
    asked: Asked,
    tx: watch::Sender<Arc<QueueSnapshot>>,
    built_seq: u64,
    built_at: Option<Instant>,
    cost: Duration,
}

/// Jobs asked about with `why` (by id: when last, and the job's tenant), and whether one waits for a build.
#[derive(Debug, Clone, Default)]
struct Asked {
    when: Arc<std::sync::Mutex<HashMap<u64, (Instant, String)>>>,
    waiting: Arc<std::sync::atomic::AtomicBool>,
}

/// The readers' side.
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    seq: Arc<AtomicU64>,
    wanted: Arc<AtomicU64>,
    wake: Arc<tokio::sync::Notify>,
    asked: Asked,
    rx: watch::Receiver<Arc<QueueSnapshot>>,
    /// The change number when each token's latest change was answered, by token hash (pruned of entries the published
    /// view already has once there are [`WRITTEN_PRUNE_AT`]).
    written: Arc<std::sync::Mutex<HashMap<String, u64>>>,
}

/// A publisher and its readers, with an empty snapshot.
pub(crate) fn channel() -> (Publisher, Reader) {
    let seq = Arc::new(AtomicU64::new(1));
    let (tx, rx) = watch::channel(Arc::new(QueueSnapshot::default()));
    let (written, wanted, wake): (_, Arc<AtomicU64>, Arc<tokio::sync::Notify>) = Default::default();
    let asked = Asked::default();
    let publisher = Publisher {
        seq: seq.clone(),
        wanted: wanted.clone(),
        wake: wake.clone(),
        asked: asked.clone(),
        tx,
        built_seq: 0,
        built_at: None,
        cost: Duration::ZERO,
    };
    (publisher, Reader { seq, wanted, wake, asked, rx, written })
}

impl Reader {
    /// A change asked for with the token of hash `token` was answered: its reads wait for a snapshot that has it.
    pub(crate) fn wrote(&self, token: &str) {
        let now = self.seq.load(Ordering::Acquire);
        let mut w = self.written.lock().expect("written lock");
        if w.len() >= WRITTEN_PRUNE_AT {
            // Entries already in the published view never make a read wait (revoked tokens' among them).
            let built = self.rx.borrow().seq;
            w.retain(|_, s| *s > built);
        }
        match w.get_mut(token) {
            Some(s) => *s = (*s).max(now),
            None => {
                w.insert(token.to_string(), now);
            }
        }
    }

    /// The latest snapshot once it includes every change answered to the token of hash `token` before this call (or
    /// after [`READ_WAIT`], the latest).
    pub(crate) async fn fresh(&self, token: &str) -> Arc<QueueSnapshot> {
        // At least the first build (the channel starts with an empty placeholder, change number 0).
        let want = self.written_by(token).max(1);
        self.first(want, READ_WAIT, false, |s| Some(s.clone())).await.unwrap_or_else(|latest| latest)
    }

    /// The change number when the token of hash `token` last changed something (0: never).
    fn written_by(&self, token: &str) -> u64 {
        self.written.lock().expect("written lock").get(token).copied().unwrap_or(0)
    }

    /// What `pick` finds in the first snapshot built at or after change number `want` where it finds anything, waiting
    /// at most `wait` (then the latest snapshot, as the error). While it waits it brings the next build forward; with
    /// `asking` (a `why` asked about jobs a build must explain) even when nothing changed.
    async fn first<T>(
        &self,
        want: u64,
        wait: Duration,
        asking: bool,
        pick: impl Fn(&Arc<QueueSnapshot>) -> Option<T>,
    ) -> Result<T, Arc<QueueSnapshot>> {
        let mut rx = self.rx.clone();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let s = rx.borrow_and_update().clone();
            if let Some(t) = Some(&s).filter(|s| s.seq >= want).and_then(&pick) {
                return Ok(t);
            }
            let raised = self.wanted.fetch_max(want, Ordering::AcqRel) < want;
            if asking {
                self.asked.waiting.store(true, Ordering::Release);
            }
            if raised || asking {
                self.wake.notify_one();
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Err(s),
            }
        }
    }

    /// Why queued job `id` (of `tenant`) waits, for an admin or (`admin` false) for its own tenant, from the first
    /// build that explains it, was built at or after change number `at_least`, and has every change answered to the
    /// token of hash `token` before this call; [`Explained::Late`] after [`EXPLAIN_WAIT`].
    pub(crate) async fn explain(&self, token: &str, id: u64, tenant: &str, admin: bool, at_least: u64) -> Explained {
        {
            let mut when = self.asked.when.lock().expect("asked lock");
            if !when.contains_key(&id) {
                // Bounded whatever clients ask: a tenant past its share loses its own oldest request; past the cap in
                // all, the requests older than `ASKED_FOR` go, then the oldest.
                let of_tenant: Vec<(Instant, u64)> =
                    when.iter().filter(|(_, (_, t))| t == tenant).map(|(k, (at, _))| (*at, *k)).collect();
                if of_tenant.len() >= ASKED_PER_TENANT {
                    if let Some((_, oldest)) = of_tenant.iter().min() {
                        when.remove(oldest);
                    }
                }
                if when.len() >= ASKED_KEPT {
                    when.retain(|_, (at, _)| at.elapsed() < ASKED_FOR);
                    while when.len() >= ASKED_KEPT {
                        let Some(oldest) = when.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k) else { break };
                        when.remove(&oldest);
                    }
                }
            }
            when.insert(id, (Instant::now(), tenant.to_string()));
        }
        let want = self.written_by(token).max(at_least).max(1);
        self.first(want, EXPLAIN_WAIT, true, |s| s.explanation(id, admin)).await.unwrap_or(Explained::Late)
    }

    /// The owner's change number now.
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
}

impl Publisher {
    /// A change is about to be made.
    pub(crate) fn bump(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
    }

    /// When the next build is due: `None` when nothing changed and no refresh is due.
    pub(crate) fn due(&self, queued: bool) -> Option<Instant> {
        let Some(at) = self.built_at else { return Some(Instant::now()) };
        if self.asked.waiting.load(Ordering::Acquire) {
            Some(at + self.cost.max(MIN_GAP))
        } else if self.seq.load(Ordering::Acquire) != self.built_seq {
            let waited = self.wanted.load(Ordering::Acquire) > self.built_seq;
            Some(at + if waited { self.cost.max(MIN_GAP) } else { (self.cost * 10).max(UNWAITED_GAP) })
        } else if queued {
            Some(at + REFRESH)
        } else {
            None
        }
    }
}

impl Owner {
    /// Builds and publishes a snapshot if one is due.
    pub(crate) fn publish_queue(&mut self) {
        let queued = self.st.queued_count() > 0;
        if self.queue_pub.due(queued).is_none_or(|d| d > Instant::now()) {
            return;
        }
        let t0 = Instant::now();
        let seq = self.queue_pub.seq.load(Ordering::Acquire);
        // Cleared before the requests are read: one made after this is seen by the next build.
        self.queue_pub.asked.waiting.store(false, Ordering::Release);
        let snap = self.queue_snapshot(seq);
        self.queue_pub.tx.send_replace(Arc::new(snap));
        self.queue_pub.built_seq = seq;
        self.queue_pub.built_at = Some(Instant::now());
        self.queue_pub.cost = t0.elapsed();
        self.metrics.queue_snapshot_seconds.observe(self.queue_pub.cost.as_secs_f64());
    }

    /// The queue now, as [`QueueSnapshot`] describes.
    fn queue_snapshot(&self, seq: u64) -> QueueSnapshot {
        let now = Time(now_ms());
        let tenant_of = |j: &JobId| self.docs.get(&j.0).map(|d| &*d.tenant);
        // Jobs asked about with `why` (the latest ASKED_MAX of the last ASKED_FOR) that a pass explains, with their
        // places, which the walk below finds.
        let requested: Vec<u64> = {
            let mut w = self.queue_pub.asked.when.lock().expect("asked lock");
            w.retain(|_, (t, _)| t.elapsed() < ASKED_FOR);
            let mut v: Vec<(Instant, u64)> = w.iter().map(|(id, (t, _))| (*t, *id)).collect();
            v.sort_unstable_by(|a, b| b.cmp(a));
            v.into_iter().take(ASKED_MAX).map(|(_, id)| id).collect()
        };
        // What the pass explains for each: the job itself, or an array's next element (so that an array costs no
        // pass of its own); a job waiting on dependencies is explained without the pass, but predicted with the rest.
        let mut target: HashMap<JobId, JobId> = HashMap::new();
        let mut place: HashMap<JobId, usize> = HashMap::new();
        for j in requested.iter().map(|id| JobId(*id)) {
            match explain_without_pass(&self.st, j, now) {
                // In no queue: explained at place 0, its start predicted by the replay.
                Ok(None) if self.st.is_dependency_waiting(j) => {
                    target.insert(j, j);
                    place.insert(j, 0);
                }
                Ok(None) => {
                    let t = self.st.array_head(j).unwrap_or(j);
                    target.insert(j, t);
                    place.insert(t, usize::MAX);
                }
                _ => {}
            }
        }
        let mut all: Vec<(usize, JobId)> = Vec::with_capacity(QUEUE_ROWS);
        let mut mine: BTreeMap<&str, Vec<(usize, JobId)>> = BTreeMap::new();
        // `own`: the position a tenant sees, when it differs from the whole queue's.
        let mut take = |position: usize, own: Option<usize>, j: JobId, all: &mut Vec<(usize, JobId)>| {
            if all.len() < QUEUE_ROWS {
                all.push((position, j));
            }
            if let Some(t) = tenant_of(&j) {
                let rows = mine.entry(t).or_default();
                if rows.len() < QUEUE_ROWS {
                    rows.push((own.unwrap_or(position), j));
                }
            }
        };
        // The walk takes the first rows of the whole queue and of each tenant, and finds the places of the jobs asked
        // about; it stops once it has them all (on a deep queue, long before its end), and goes past [`WALK`] only to
        // place a job asked about.
        let mut rows_left: Vec<usize> = (0..self.st.tenant_count())
            .map(|t| self.st.tenant_waiting(TenantId(t as u32)).jobs.min(QUEUE_ROWS))
            .collect();
        let mut tenants_left = rows_left.iter().filter(|n| **n > 0).count();
        let mut unplaced = place.values().filter(|p| **p == usize::MAX).count();
        queue_walk(&self.st, now, usize::MAX, |i, t, j| {
            if i < WALK {
                take(i, None, j, &mut all);
                if let Some(n) = rows_left.get_mut(t.index()).filter(|n| **n > 0) {
                    *n -= 1;
                    tenants_left -= usize::from(*n == 0);
                }
            }
            if let Some(p) = place.get_mut(&j) {
                unplaced -= usize::from(*p == usize::MAX);
                *p = i;
            }
            (i + 1 < WALK && (all.len() < QUEUE_ROWS || tenants_left > 0)) || unplaced > 0
        });
        // Jobs waiting for dependencies, then held jobs: in no queue, they follow it, by id. A tenant's come right
        // after the queue in its view: its places do not count other tenants' jobs outside the queue.
        let queued = self.st.queued_count();
        let outside = self.st.dependency_waiting().chain(self.st.held_jobs());
        let mut outside_of: HashMap<&str, usize> = HashMap::new();
        for (k, j) in outside.take(WALK).enumerate() {
            let own = tenant_of(&j).map(|t| {
                let n = outside_of.entry(t).or_default();
                *n += 1;
                queued + *n - 1
            });
            take(queued + k, own, j, &mut all);
        }
        let mut asked: Vec<(JobId, usize)> = all.iter().map(|(p, j)| (*j, *p)).collect();
        for rows in mine.values() {
            asked.extend(rows.iter().map(|(p, j)| (*j, *p)));
        }
        asked.extend(place.iter().map(|(j, p)| (*j, (*p).min(queued))));
        asked.sort_unstable();
        asked.dedup_by_key(|(j, _)| *j);
        let ids: Vec<JobId> = asked.iter().map(|(j, _)| *j).collect();
        let etas = gpunet_core::predict::predict_starts(&self.st, &ids, now, 2000);
        let explained: HashMap<JobId, gpunet_core::Explanation> =
            explain_queue(&self.st, &asked, now).into_iter().map(|e| (e.job, e)).collect();
        let entry = |position: usize, j: JobId, who: &Principal| -> Option<QueueEntry> {
            let (job, d, e) = (self.st.job(j)?, self.docs.get(&j.0)?, explained.get(&j)?);
            let mut reason = serde_json::to_value(&e.reason).expect("reasons serialise");
            let message = self.mask(who, &e.message, Some(&mut reason));
            Some(QueueEntry {
                position,
                id: j.0,
                name: match job.array_of {
                    Some((_, i)) => format!("{}[{i}]", job.spec.name),
                    None => job.spec.name.clone(),
                },
                tenant: d.tenant.to_string(),
                state: job.state.to_string(),
                priority: job.spec.priority,
                gpus: job.spec.task.gpus * job.spec.tasks,
                submitted_ms: job.submitted.0,
                message,
                reason,
                eta_ms: etas.get(&j).map(|t| t.0),
            })
        };
        let why = |j: JobId, t: JobId| -> Option<Box<(Explain, Explain)>> {
            let (e, d) = (explained.get(&t)?, self.docs.get(&j.0)?);
            let job = d.job(&self.st, j.0)?;
            let message = if t == j { e.message.clone() } else { format!("next element {t}: {}", e.message) };
            let reason = serde_json::to_value(&e.reason).expect("reasons serialise");
            let admin = Explain {
                id: j.0,
                state: self.state_of(j.0)?.to_string(),
                message,
                reason: reason.clone(),
                position: e.position,
                eta_ms: self.st.job(j).and_then(|_| etas.get(&j)).map(|t| t.0),
                estimate: self.estimate_view(job, d),
                as_of_ms: Some(now.0),
            };
            let mut own_reason = reason;
            let message = self.mask(&Principal::Tenant(d.tenant.to_string()), &admin.message, Some(&mut own_reason));
            let own = Explain { message, reason: own_reason, ..admin.clone() };
            Some(Box::new((admin, own)))
        };
        let explained_asked: HashMap<u64, Option<Box<(Explain, Explain)>>> =
            requested.iter().map(|id| (*id, target.get(&JobId(*id)).and_then(|t| why(JobId(*id), *t)))).collect();
        let all = all.iter().filter_map(|(p, j)| entry(*p, *j, &Principal::Admin)).collect();
        let tenants: HashMap<String, (usize, Vec<QueueEntry>)> = self
            .tenants
            .keys()
            .map(|t| {
                let waiting = self.tenant_id(t).map_or(0, |id| self.st.tenant_queued_count(id));
                let who = Principal::Tenant(t.clone());
                let rows = mine
                    .get(t.as_str())
                    .map(|rows| rows.iter().filter_map(|(p, j)| entry(*p, *j, &who)).collect())
                    .unwrap_or_default();
                (t.clone(), (waiting, rows))
            })
            .collect();
        QueueSnapshot {
            seq,
            at_ms: now.0,
            policy: self.st.policy().to_string(),
            queue_length: queued,
            // Every waiting job is a tenant's: the sum of what each tenant has waiting.
            waiting: tenants.values().map(|(n, _)| n).sum(),
            all,
            tenants,
            explained: explained_asked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(p: &Publisher, seq: u64) {
        p.tx.send_replace(Arc::new(QueueSnapshot { seq, ..QueueSnapshot::default() }));
    }

    #[tokio::test]
    async fn a_read_waits_for_its_own_token_s_changes_and_not_for_others() {
        let (p, r) = channel();
        publish(&p, 1);
        // Another token's change, not yet in a snapshot: a read with a token that changed nothing is answered at once.
        p.bump();
        r.wrote("other");
        let t0 = Instant::now();
        let s = tokio::time::timeout(Duration::from_secs(1), r.fresh("reader")).await.expect("answered at once");
        assert_eq!(s.seq, 1);
        assert!(t0.elapsed() < READ_WAIT / 2);
        // The reader's own change: its read waits for a snapshot that has it.
        p.bump();
        r.wrote("reader");
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.fresh("reader").await.seq }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "answered before its change was in a snapshot");
        publish(&p, 2);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "a snapshot older than its change is not enough");
        publish(&p, 3);
        let seq = tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("answered").expect("task");
        assert_eq!(seq, 3);
        // An answer recorded late (a slower request of the same token) never lowers what the token waits for.
        r.written.lock().expect("lock").insert("reader".into(), 100);
        r.wrote("reader");
        assert_eq!(r.written.lock().expect("lock")["reader"], 100);
    }

    #[tokio::test]
    async fn a_waiting_reader_brings_the_next_build_forward_to_one_cost() {
        let (mut p, r) = channel();
        let at = Instant::now();
        p.built_at = Some(at);
        p.cost = Duration::from_millis(50);
        p.built_seq = 1;
        p.bump(); // a change since the last build
        assert_eq!(p.due(true), Some(at + Duration::from_millis(500)), "ten times the cost while nobody waits");
        r.wrote("me");
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.fresh("me").await.seq }
        });
        tokio::time::timeout(Duration::from_secs(5), p.wake.notified()).await.expect("the owner is woken");
        assert_eq!(p.due(true), Some(at + Duration::from_millis(50)), "one cost while a reader waits");
        publish(&p, 2);
        p.built_seq = 2;
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").expect("task"), 2);
        p.bump();
        assert_eq!(p.due(true), Some(at + Duration::from_millis(500)), "back to ten times once nobody waits");
        // A cheap build: not sooner than UNWAITED_GAP while nobody waits, MIN_GAP while one does.
        p.cost = Duration::from_micros(100);
        assert_eq!(p.due(true), Some(at + UNWAITED_GAP));
        r.wrote("me");
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.fresh("me").await.seq }
        });
        tokio::time::timeout(Duration::from_secs(5), p.wake.notified()).await.expect("the owner is woken");
        assert_eq!(p.due(true), Some(at + MIN_GAP));
        publish(&p, 3);
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").expect("task"), 3);
    }
}
