//! The queue view, off the owner: `GET /v1/queue` (the portal's Queue page, refreshed every 2 s by every reader) is
//! answered from a [`QueueSnapshot`] that the owner publishes, never by the owner itself, so that no reader, however
//! many, delays a submission, an agent's sync or a pass.
//!
//! The owner builds a snapshot after a batch of changes (and every [`REFRESH`] to keep relative times fresh): the
//! queue in policy order for [`WALK`] positions, the first [`QUEUE_ROWS`] jobs of it and of each tenant with their
//! places, explained by one pass that notes what it finds about each (`gpunet_core::explain_queue`), and their
//! predicted starts from one replay of a bounded copy of the state (`gpunet_core::predict`). Messages for a tenant
//! are masked when built. A build is at most every ten times the last one's cost, so that building takes at most
//! about a tenth of the owner's time whatever the depth of the queue; while a reader waits for its own change (below)
//! the next build comes after one cost instead (at most half the owner's time, only while someone waits).
//!
//! Every change the owner makes bumps a sequence number before it is applied (and so before anyone is told of it); a
//! snapshot carries the number it was built at. Each change a token asks for (any request but a read, answered with
//! success) records the number when it is answered ([`Reader::wrote`]); a read with that token waits (at most
//! [`READ_WAIT`]) for a snapshot at least as new: a client that submitted a job and then reads the queue sees its job.
//! Others' changes do not hold a read back (with submissions arriving without pause, a read would otherwise wait for
//! the next build every time): they show in the next build, whose time the view carries (`as_of_ms`).

use super::Owner;
use crate::{now_ms, Principal};
use gpunet_api::types::{QueueEntry, QueueView};
use gpunet_core::{explain_queue, queue_order, JobId, Time};
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
/// Tokens remembered in [`Reader::wrote`] before those whose changes are all published are forgotten.
const WRITTEN_PRUNE_AT: usize = 4096;
/// How long a reader waits for a snapshot that includes the changes made before it asked.
pub(crate) const READ_WAIT: Duration = Duration::from_secs(2);

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
}

/// The owner's side: the change number, the channel, and when to build next.
#[derive(Debug)]
pub(crate) struct Publisher {
    pub(crate) seq: Arc<AtomicU64>,
    /// The newest change number a reader waits for, and the owner's wake-up when one starts waiting.
    wanted: Arc<AtomicU64>,
    pub(crate) wake: Arc<tokio::sync::Notify>,
    tx: watch::Sender<Arc<QueueSnapshot>>,
    built_seq: u64,
    built_at: Option<Instant>,
    cost: Duration,
}

/// The readers' side.
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    seq: Arc<AtomicU64>,
    wanted: Arc<AtomicU64>,
    wake: Arc<tokio::sync::Notify>,
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
    let publisher = Publisher {
        seq: seq.clone(),
        wanted: wanted.clone(),
        wake: wake.clone(),
        tx,
        built_seq: 0,
        built_at: None,
        cost: Duration::ZERO,
    };
    (publisher, Reader { seq, wanted, wake, rx, written })
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
        let want = self.written.lock().expect("written lock").get(token).copied().unwrap_or(0).max(1);
        let mut rx = self.rx.clone();
        let deadline = tokio::time::Instant::now() + READ_WAIT;
        loop {
            let s = rx.borrow_and_update().clone();
            if s.seq >= want {
                return s;
            }
            if self.wanted.fetch_max(want, Ordering::AcqRel) < want {
                self.wake.notify_one();
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return s,
            }
        }
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
        if self.seq.load(Ordering::Acquire) != self.built_seq {
            let waited = self.wanted.load(Ordering::Acquire) > self.built_seq;
            Some(at + (if waited { self.cost } else { self.cost * 10 }).max(MIN_GAP))
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
        let order = queue_order(&self.st, now, WALK);
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
        for (i, j) in order.iter().enumerate() {
            take(i, None, *j, &mut all);
        }
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
        asked.sort_unstable();
        asked.dedup();
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
    }
}
