//! One scheduling pass: `schedule(&state, now) -> decisions`, pure and deterministic.
//!
//! The pass walks queued jobs in policy order and, for each:
//! 1. skips it while a restart backoff runs;
//! 2. checks its tenant's quota (a quota-held job does not block others: it is not eligible, like a job held by a
//!    Slurm QOS limit or a Kueue ClusterQueue without quota);
//! 3. skips it if it can never fit (no node class could ever hold it);
//! 4. places it (best fit, gang all-or-nothing, topology, one GPU model per gang).
//!
//! The first job that does not fit for capacity is the *head*: the scheduler may preempt for it (quota reclaim,
//! priority, LAS demotion, a much shorter job; or, with defragmentation, move the jobs of a node to GPUs free
//! elsewhere); without backfill it blocks every job behind it. With backfill (EASY) the head gets a
//! reservation: the earliest estimated time its placement becomes free (from running jobs' estimated ends) and the
//! GPUs it will take; later jobs start only if they end before that time or keep off the reserved resources.
//! When every queued job has been placed, elastic jobs grow towards their maximum.
//!
//! This module owns the pass's state (`Pass`), its driver (`Pass::run`, the walk above) and its output
//! ([`Decision`], [`PassStats`]). Each concern lives in its own module, as `impl Pass` blocks over the same state:
//! - `order`: queue order (policy keys merged over tenant queues, or tenants picked by share) and [`queue_order`];
//! - `admission`: quota admission, whole and per GPU model;
//! - `placement`: eligible node classes, "can never fit", placement searches and committing a start;
//! - `backfill`: the head's EASY reservation, what it holds back, and the jobs tried behind it;
//! - `preempt`: victim search ([`PreemptReason`]) and the jobs that evictions were made for;
//! - `defrag`: defragmentation, room made for a blocked job by moving the jobs of a few nodes to GPUs free elsewhere;
//! - `elastic`: growing running elastic jobs when nothing is left waiting;
//! - `explain`: why a queued job waits ([`explain`], [`PendingReason`]) and its sentence.

mod admission;
mod backfill;
mod defrag;
mod elastic;
mod explain;
mod order;
mod placement;
mod preempt;
#[cfg(test)]
pub(crate) mod testkit;

pub use explain::{dependency_text, explain, explain_queue, explain_without_pass, DepWait, Explanation, PendingReason};
pub(crate) use order::queue_prefix;
pub use order::{queue_order, queue_walk};
pub(crate) use placement::spec_sig;
pub use placement::{dry_run_placement, never_fits};
pub use preempt::PreemptReason;

use crate::alloc::Free;
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::ids::{JobId, TenantId};
use crate::job::{JobState, Placement, TaskPlacement};
use crate::quota::QuotaBook;
use crate::state::ClusterState;
use crate::units::Time;
use admission::Admission;
use backfill::{Behind, Res};
use order::Order;
use placement::ShapeKey;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// What the driver should do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decision {
    /// Start a job on this placement.
    Start {
        /// Job.
        job: JobId,
        /// Where.
        placement: Placement,
        /// Admitted beyond its tenant's guarantee.
        borrowed: bool,
    },
    /// Evict a running job (it resumes later from its last checkpoint).
    Preempt {
        /// Victim.
        job: JobId,
        /// Why.
        reason: PreemptReason,
        /// The job the room is made for.
        for_job: JobId,
    },
    /// The head job's reservation: where it is expected to start and when (`None`: waiting for evictions now).
    Reserve {
        /// Job.
        job: JobId,
        /// Expected start; `Time::MAX` if unknown.
        at: Time,
        /// Expected placement.
        placement: Placement,
    },
    /// Grow an elastic running job by these tasks.
    Scale {
        /// Job.
        job: JobId,
        /// New tasks.
        add: Vec<TaskPlacement>,
    },
}

/// Counters of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassStats {
    /// Jobs examined.
    pub considered: usize,
    /// Jobs started.
    pub started: usize,
    /// Jobs started by backfill.
    pub backfilled: usize,
    /// Evictions decided.
    pub preempted: usize,
    /// Placement searches run.
    pub placement_attempts: usize,
    /// Running jobs released (virtually) while computing the backfill reservation.
    pub reservation_releases: usize,
    /// For a pass that decided nothing (no start, eviction or scaling; reservations aside): a pass on the same
    /// state at any time from this pass's up to (not including) this one decides nothing either. It is the earliest
    /// time at which time alone could turn one of the pass's outcomes (a restart backoff's end, a running job
    /// reaching its minimum run time, crossing a LAS threshold or the waiting job's shorter-first bound, an eviction
    /// leaving the rate limit's window); the pass's own time, or earlier, where it cannot tell (fair share, whose
    /// order decays with time; a victim search that ranked candidates or left running jobs out
    /// (`victim_scan_limit`); a job held by its own quota; Gittins ranks).
    /// Drivers may skip such passes (the simulator's ticks: `idle_tick_passes`).
    pub idle_until: Time,
}

/// Runs one scheduling pass and returns its decisions.
pub fn schedule(state: &ClusterState, now: Time) -> Vec<Decision> {
    schedule_with_stats(state, now).0
}

/// Runs one scheduling pass and returns its decisions and counters.
pub fn schedule_with_stats(state: &ClusterState, now: Time) -> (Vec<Decision>, PassStats) {
    let mut p = Pass::new(state, now, None);
    p.run();
    p.stats.placement_attempts = p.attempts.get();
    p.stats.idle_until = p.idle_until.get();
    (std::mem::take(&mut p.decisions), std::mem::take(&mut p.stats))
}

/// How many queued jobs one pass could start if nothing blocked: the jobs in policy order, each admitted by quota and
/// placed if it fits what the earlier ones left, a job that does not fit simply skipped (no head, no reservation, no
/// preemption): what a greedy pass would start. It shows how far a blocked pass is from what the free resources allow
/// (backfill can exceed it by packing differently); `bench sched` reports it next to `placed`.
pub fn placeable(state: &ClusterState, now: Time) -> usize {
    let mut p = Pass::new(state, now, None);
    p.greedy = true;
    p.run();
    p.stats.started
}

/// One pass's working state: copies of the free pool and the quota book that it places jobs on, its memos, its
/// decisions, and (for `explain`) what it found about the traced job.
struct Pass<'a> {
    st: &'a ClusterState,
    now: Time,
    free: Free,
    book: QuotaBook,
    elig: FxHashMap<u64, Rc<[u32]>>,
    never: FxHashMap<ShapeKey, Option<String>>,
    /// Shapes that can never fit (no node class could hold them), by queue-key shape hash.
    never_shapes: FxHashSet<u64>,
    /// Request shapes that failed to place in this pass (free resources only shrink within a pass, so they keep
    /// failing): (shape, held), where held says whether the reservation's hold applied.
    failed: FxHashSet<(u64, bool)>,
    /// The last entry of `failed` a lookup found (`backfill::behind_head`).
    failed_hit: std::cell::Cell<Option<(u64, bool)>>,
    /// [`PassStats::idle_until`] as found so far (`Time::MAX`: time alone turns nothing the pass met).
    idle_until: std::cell::Cell<Time>,
    /// Behind the head: the last of the queue's shapes (`ClusterState::queue_shapes`, in hash order) found to be one
    /// the walk skips, and what that was decided on (`backfill::rest_skipped`).
    skipped_upto: Option<u64>,
    skipped_seen: Option<(usize, usize, u64)>,
    /// Whether the walk behind the head may stop once the rest of the queue would be skipped (off only in tests
    /// that check it decides the same either way).
    stop_early: bool,
    /// Whether a victim search gives up at once when the candidates its budget allows could not free the GPUs the job
    /// lacks (`preempt::most_gpus_freed`), or no node could hold a one-task job even with its candidates gone
    /// (`preempt::one_node_room_possible`); off only in tests that check it decides the same either way.
    room_precheck: bool,
    /// Victim searches that check gave up on.
    prechecked: usize,
    /// Scans of the running jobs that victim searches made (not counting searches that took an earlier one's
    /// candidates, `held_hits`).
    victim_scans: usize,
    /// Whether the reservation of a one-task head walks releases node by node (`backfill::reservation`; off only
    /// in tests that check it decides as the search by placement does).
    one_node_res: bool,
    /// Whether the reservation of any other head gives releases back on its eligible node classes only and counts
    /// room per group its tasks may not leave (`backfill::reservation_by_placement`; off only in tests that check
    /// it decides as with every release given back and room counted over all eligible nodes).
    narrow_res: bool,
    /// Per node, an index into a list the reservation keeps of nodes its releases touched (`u32::MAX`: none);
    /// all `u32::MAX` between uses (`backfill::reservation`).
    node_slot: Vec<u32>,
    /// Queue entries the walk took.
    walked: usize,
    decisions: Vec<Decision>,
    /// Jobs started in this pass with their estimated ends (for the reservation).
    started: Vec<(Time, JobId, Placement)>,
    /// The jobs started before the walk a real pass makes ended, once it has, in a pass that explains jobs (which
    /// goes on past there and may start jobs only to explain them): what [`Pass::expected_start`] counts
    /// ([`Pass::walk_ended`]).
    walk_starts: Option<FxHashSet<JobId>>,
    preempted: FxHashSet<JobId>,
    /// The jobs being evicted (`ClusterState::evicting`, in its order), looked up once per pass on the first
    /// victim search that needs them.
    evicting_jobs: Option<Vec<&'a crate::job::Job>>,
    /// GPUs and MIG slots that evictions will free and that a job of this pass already waits for (CPU and memory
    /// zero): taken again after evictions under way are given back in a later victim search of the pass, so that two
    /// jobs do not wait for the same GPUs (`preempt::find_victims`).
    promised: Vec<TaskPlacement>,
    /// Victim searches for quota-held jobs run in this pass (at most 4).
    quota_searches: u32,
    /// The candidates quota-held victim searches of this pass met, for later searches that would meet the same
    /// (`preempt::HeldCands`); off only in tests that check it decides the same either way.
    held_cands: Vec<preempt::HeldCands>,
    held_memo: bool,
    /// Whether a quota-held search takes what a running job's brief in `tenant_runs` settles without reading its row
    /// (`state::RunBrief`); off only in tests that check it decides the same either way.
    held_brief: bool,
    /// Whether a victim search settles a running job ranked by its Gittins rank from bounds on that rank
    /// (`LogNormal::quick_bounds`) when they put it under the search's bound, or over it (its rank then worked out
    /// only if it is chosen); off only in tests that check it decides the same either way.
    quick_ranks: bool,
    /// Rows so settled.
    quick_settled: usize,
    /// Rows a search made shorter-first candidates by a bound under their Gittins rank, without it, and of them
    /// victims chosen (their rank then worked out for their reason).
    quick_longer: usize,
    unranked_chosen: usize,
    /// Rows a quota-held search left unread, their brief having settled them.
    brief_settled: usize,
    /// Of those, the candidates made from their briefs.
    brief_cands: usize,
    /// Of those, the candidates for a much shorter job, their keys worked out from the briefs.
    brief_keyed: usize,
    /// Quota-held victim searches that took their candidates from `held_cands`.
    held_hits: usize,
    /// Of those, the searches that gave up on the earlier search's ranking (`preempt::HeldCands::reach`).
    reach_hits: usize,
    /// Per tenant, the fewest GPUs a job of it asked for that its GPU quota refused in this pass (`u64::MAX`: none;
    /// empty until one is refused). A job of the tenant asking for at least as many is refused too: `QuotaBook::admit`
    /// refuses more GPUs where it refused fewer, and more usage where it refused less, and a pass's book only takes
    /// (its starts and growth), never gives back. Once no quota-held search is left to make, the walk counts such a
    /// job held from its queue key, without looking it up (`admission.rs`, `Pass::held_by_gpus`).
    held_gpus: Vec<u64>,
    /// Whether the walk may do so (off only in tests that check it decides the same either way).
    held_fast: bool,
    /// Jobs the walk counted held from their queue keys.
    held_fast_hits: usize,
    /// Defragmentation searches made in this pass (`defrag.rs`).
    defrag_searches: u32,
    stats: PassStats,
    attempts: std::cell::Cell<usize>,
    trace: Option<JobId>,
    outcome: Option<PendingReason>,
    traced_position: Option<usize>,
    /// Jobs whose outcome the pass notes, without tracing them ([`explain::explain_queue`]), and what it noted.
    noting: Option<FxHashSet<JobId>>,
    notes: FxHashMap<JobId, PendingReason>,
    blocked_by: Option<JobId>,
    /// [`placeable`]: skip a job that does not fit instead of blocking (no head, no reservation, no preemption).
    greedy: bool,
}

/// A pass hands its free pool back to the state, its changes rolled back (see [`crate::state::PassPool`]); not
/// after a panic, which may have left a change half made.
impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let mut free = std::mem::take(&mut self.free);
        free.rollback_all(&self.st.topo);
        self.st.pass_pool.put(free);
    }
}

/// A job of tenant `t` its quota holds, in the walk: one more of the tenant's in a row (`streak`, reset by a job
/// admitted); at `lookahead` in a row the tenant leaves the walk for the rest of the pass.
fn held_in_a_row(streak: &mut [u32], order: &mut Order<'_>, t: TenantId, lookahead: u32) {
    streak[t.index()] += 1;
    if streak[t.index()] >= lookahead {
        order.drop_tenant(t);
    }
}

impl<'a> Pass<'a> {
    fn new(st: &'a ClusterState, now: Time, trace: Option<JobId>) -> Pass<'a> {
        Pass {
            st,
            now,
            free: {
                let mut free = st.pass_pool.take().unwrap_or_else(|| st.free.clone());
                free.start_log();
                free
            },
            book: st.book.clone(),
            elig: FxHashMap::default(),
            never: FxHashMap::default(),
            failed: FxHashSet::default(),
            failed_hit: std::cell::Cell::new(None),
            idle_until: std::cell::Cell::new(Time::MAX),
            skipped_upto: None,
            skipped_seen: None,
            stop_early: true,
            room_precheck: true,
            prechecked: 0,
            victim_scans: 0,
            node_slot: Vec::new(),
            one_node_res: true,
            narrow_res: true,
            walked: 0,
            never_shapes: FxHashSet::default(),
            decisions: Vec::new(),
            started: Vec::new(),
            walk_starts: None,
            preempted: FxHashSet::default(),
            evicting_jobs: None,
            promised: Vec::new(),
            quota_searches: 0,
            held_cands: Vec::new(),
            held_memo: true,
            held_brief: true,
            quick_ranks: true,
            quick_settled: 0,
            quick_longer: 0,
            unranked_chosen: 0,
            brief_settled: 0,
            brief_cands: 0,
            brief_keyed: 0,
            held_hits: 0,
            reach_hits: 0,
            held_gpus: Vec::new(),
            held_fast: true,
            held_fast_hits: 0,
            defrag_searches: 0,
            stats: PassStats::default(),
            attempts: std::cell::Cell::new(0),
            trace,
            outcome: None,
            traced_position: None,
            noting: None,
            notes: FxHashMap::default(),
            blocked_by: None,
            greedy: false,
        }
    }

    /// Time alone turns an outcome of this pass at `t` (at once, for `t` at or before the pass's time): see
    /// [`PassStats::idle_until`].
    fn turns_at(&self, t: Time) {
        self.idle_until.set(self.idle_until.get().min(t.max(self.now)));
    }

    /// The walk: jobs that evictions were made for, then every queued job in policy order through backoff, quota
    /// admission, "can never fit" and placement; the first that does not fit is the head (room made by preemption,
    /// or a reservation with backfill behind it, or the end of the walk); then elastic growth if nothing waits.
    fn run(&mut self) {
        let st = self.st;
        let cfg = &st.cfg;
        if cfg.policy == crate::config::Policy::FairShare {
            self.turns_at(self.now); // tenants' shares decay with time: the order may change at any moment
        }
        let mut order = Order::new(st, false);
        let mut res: Option<Res> = None;
        let mut after_block = 0usize;
        let mut streak = vec![0u32; st.tenants.len()];
        let mut position = 0usize;
        let mut exhausted = true;
        let served = self.serve_preemptors();
        // Noted jobs not yet met, and whether the walk behind a reservation has stopped: then it goes on only to
        // look at them (see `explain_queue`).
        let mut unseen = self.noting.as_ref().map_or(0, |n| n.len());
        let mut stopped = false;
        loop {
            let next = {
                let this = &*self;
                order.next(|t| this.share(t))
            };
            let Some((t, key)) = next else { break };
            self.walked += 1;
            let (jid, sig) = (key.job, key.sig);
            let mut traced = self.trace == Some(jid);
            let noted = self.noted(jid);
            unseen -= usize::from(noted);
            if stopped {
                // Past the walk's end: a noted job is looked at like a traced one, as a traced job is.
                match (noted, unseen) {
                    (true, _) => traced = true,
                    (false, 0) => break,
                    (false, _) => continue,
                }
            } else if let Some(r) = &res {
                after_block += 1;
                let behind =
                    if self.rest_skipped(r) { Behind::Stop } else { self.behind_head(r, &key, after_block, traced) };
                match behind {
                    Behind::Try => {}
                    // A job the pass skips cannot start now; one whose outcome is noted is looked at like a traced
                    // one, to find why (nothing it finds changes what the pass decides).
                    Behind::Skip if noted => traced = true,
                    Behind::Skip => continue,
                    Behind::Stop => {
                        exhausted = false;
                        self.walk_ended();
                        if !noted && unseen == 0 {
                            break;
                        }
                        stopped = true;
                        if !noted {
                            continue;
                        }
                        traced = true;
                    }
                }
            }
            if served.contains(&jid) || (!traced && self.never_shapes.contains(&key.shape())) {
                continue;
            }
            // Held by its GPU quota as a job of its tenant asking for no more GPUs was (and not in a restart's
            // backoff, which its key would say): counted held as `admit` would, the job not looked up.
            if !traced && !noted && key.not_before <= self.now && self.held_by_gpus(t, key.gpus) {
                position += 1;
                self.stats.considered += 1;
                self.held_fast_hits += 1;
                held_in_a_row(&mut streak, &mut order, t, cfg.quota_lookahead);
                continue;
            }
            let job = &st.jobs[&jid];
            if self.trace == Some(jid) {
                self.traced_position = Some(position);
            }
            position += 1;
            if job.state == JobState::Restarting && job.not_before > self.now {
                self.turns_at(job.not_before);
                self.note(jid, |_| PendingReason::Backoff { until: job.not_before });
                continue;
            }
            self.stats.considered += 1;
            let spec = &job.spec;
            // 1. Quota.
            match self.admit(t, job, sig, traced) {
                Admission::Admitted => streak[t.index()] = 0,
                Admission::MakingRoom => continue,
                Admission::Held => {
                    held_in_a_row(&mut streak, &mut order, t, cfg.quota_lookahead);
                    continue;
                }
            }
            // 2. Eligibility.
            let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
            let base = self.eligible_sig(spec, sig);
            let shape = key.shape();
            if let Some(detail) = self.never_fits_memo(spec, sig, min_tasks, &base) {
                if spec.elastic.is_none() {
                    self.never_shapes.insert(shape);
                }
                self.note(jid, |_| PendingReason::NeverFits { detail });
                continue;
            }
            let classes = match self.quota_classes(t, spec, min_tasks, &base) {
                Ok(c) => c,
                Err(block) => {
                    self.note(jid, |p| p.quota_reason(t, block));
                    continue;
                }
            };
            // 3. Placement.
            match &res {
                None => {
                    if let Some(p) = self.try_place(job, &classes, None) {
                        self.commit_start(job, p, false);
                        if job.array_of.is_some() {
                            self.start_behind(job, min_tasks, &base);
                        }
                        order.touch(t);
                        continue;
                    }
                    if self.greedy {
                        continue;
                    }
                    // The head: blocked for capacity.
                    self.blocked_by = Some(jid);
                    if cfg.preemption.enabled && (self.make_room(job, &classes) || self.defragment(job, &classes)) {
                        // Room is being made: the job no longer blocks; what it will use is claimed.
                        self.blocked_by = None;
                        continue;
                    }
                    let r = if cfg.backfill { Some(self.reserve(job, &classes)) } else { None };
                    let at = r.as_ref().map(|r| r.at);
                    self.note(jid, |p| {
                        p.capacity_reason(spec, &classes, at.and_then(|t| p.expected_start(t)), Vec::new())
                    });
                    match r {
                        Some(r) => res = Some(r),
                        None => {
                            exhausted = false;
                            break;
                        }
                    }
                }
                Some(r) => {
                    // Past the walk's end: stopped there, or (a traced job, which the walk always tries) as far behind
                    // the head as the walk goes.
                    let mark = (stopped || after_block > cfg.backfill_depth).then(|| self.free.mark());
                    if self.backfill(job, r, &classes, classes.len() != base.len(), shape) {
                        if let Some(mark) = mark {
                            // Past the walk's end a real pass does not reach it: it would fit, but waits in order
                            // behind the head (the explanation a job no pass notes gets), and its start is undone, so
                            // that it takes no room from the jobs explained after it. It said "fits now and starts in
                            // the next scheduling pass", which no pass did.
                            self.undo_start(mark);
                            self.unnote(jid);
                            continue;
                        }
                        order.touch(t);
                        // A job that starts is no look in vain: the depth bounds only those (a pass behind a head
                        // that blocks early still starts everything that fits).
                        after_block -= 1;
                    }
                }
            }
        }
        if exhausted && res.is_none() && self.blocked_by.is_none() && self.trace.is_none() {
            // Not while evictions are made or awaited (for a job that has not started in this pass).
            let waiting_on_evictions = self.stats.preempted > 0 || {
                let started = self.started_ids();
                st.preempting_for.iter().any(|j| !started.contains(j))
            };
            if !waiting_on_evictions {
                self.grow_elastic();
            }
        }
        if !stopped {
            self.walk_ended();
        }
    }

    /// An array's head was placed: the array's next elements (the same shape) start right behind it while its
    /// limit, its tenant's quota and the free room allow, so that an array fills the room in one pass although only
    /// its head sits in a queue (see [`crate::array`]). Not behind a blocked head: elements wait for the next pass.
    fn start_behind(&mut self, head: &crate::job::Job, min_tasks: u32, base: &[u32]) {
        let st = self.st;
        let t = head.spec.tenant;
        let mut e = head.clone();
        let q = crate::quota::job_qvec(&e.spec, min_tasks, None);
        for (id, index) in st.elements_behind(head) {
            e.id = id;
            e.array_of = e.array_of.map(|(a, _)| (a, index));
            if self.book.admit(&st.shape, t, &q).is_err() {
                break;
            }
            let Ok(classes) = self.quota_classes(t, &e.spec, min_tasks, base) else { break };
            let Some(p) = self.try_place(&e, &classes, None) else { break };
            self.commit_start(&e, p, false);
        }
    }

    fn started_ids(&self) -> FxHashSet<JobId> {
        self.decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Start { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    /// A pass starts from the state's kept copy of the free pool and hands it back rolled back (`state::PassPool`):
    /// on random clusters over eight rounds of passes, starts, preemptions and ends (FIFO, LAS and preemptive SRTF,
    /// with backfill and without; a node cordoned and made ready again on the way), each pass decides as the same pass
    /// on a clone of the state, which has no copy and copies the pool, and the copy stays equal to the pool (checked
    /// by `check_invariants` after each round).
    #[test]
    fn a_pass_on_the_kept_copy_of_the_pool_decides_as_on_a_fresh_copy() {
        use proptest::prelude::*;
        let policies = [Policy::Fifo, Policy::Las, Policy::Srtf];
        let strategy = (
            proptest::collection::vec((0usize..7, 1u64..20_000, 0u32..3), 1..200),
            0usize..policies.len(),
            any::<bool>(),
            2usize..6,
        );
        let mut runner = det_runner(96);
        let (kept, decided) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
        runner
            .run(&strategy, |(jobs, policy, backfill, nodes)| {
                let mut c = SchedConfig { backfill, ..preempting(policies[policy], Dur::from_secs(30)) };
                c.preemption.shorter_first = policies[policy] == Policy::Srtf;
                let ns = (0..nodes)
                    .map(|i| node(&format!("n{i}"), GpuModel::T4, [4, 8][i % 2]).label("zone", ["z1", "z2"][i % 2]))
                    .collect();
                let mut s = cluster(c, ns, &["a", "b", "c"]);
                for (i, (g, secs, t)) in jobs.iter().enumerate() {
                    let (gpus, tasks) = [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (1, 3)][*g];
                    let mut spec = JobSpec::new(TenantId(*t), "j", gpus, tasks).estimate(Dur::from_secs(*secs));
                    spec.priority = (*secs % 4 == 0) as i32;
                    submit(&mut s, i as u64 + 1, spec, i as u64);
                }
                let mut now = Time::from_secs(jobs.len() as u64);
                for round in 0..8u64 {
                    if round == 3 {
                        s.set_node_state(NodeId(0), NodeState::Cordoned, now).unwrap();
                    }
                    if round == 5 {
                        s.set_node_state(NodeId(0), NodeState::Ready, now).unwrap();
                    }
                    let fresh = schedule(&s.clone(), now);
                    let ds = schedule(&s, now);
                    prop_assert_eq!(&ds, &fresh);
                    // The pass handed the copy back.
                    let copy = s.pass_pool.take();
                    prop_assert!(copy.is_some());
                    s.pass_pool.put(copy.unwrap());
                    kept.set(kept.get() + 1);
                    decided.set(decided.get() + ds.len());
                    now = apply_and_end_some(&mut s, &ds, now, round, Dur::from_secs(40));
                }
                Ok(())
            })
            .unwrap();
        assert!(kept.get() >= 700 && decided.get() >= 2_000, "{} passes, {} decisions", kept.get(), decided.get());
    }

    #[test]
    fn fifo_is_strict_without_backfill() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 4, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 8, 1), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "c", 1, 1), 2);
        let ds = s.step(Time::from_secs(10)).unwrap();
        assert_eq!(started(&ds), vec![1], "job 3 must not pass the blocked job 2");
        s.check_invariants().unwrap();
        let e = explain(&s, JobId(3), Time::from_secs(10)).unwrap();
        assert_eq!(e.reason, PendingReason::Order { ahead: 1, policy: Policy::Fifo, blocked_by: Some(JobId(2)) });
        let e2 = explain(&s, JobId(2), Time::from_secs(10)).unwrap();
        match e2.reason {
            PendingReason::Capacity { largest_free_block, free_eligible_gpus, .. } => {
                assert_eq!((largest_free_block, free_eligible_gpus), (4, 4));
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn failures_restart_with_backoff_then_fail() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 1)], &["a"]);
        let mut j = JobSpec::new(t0(), "flaky", 1, 1);
        j.max_restarts = 1;
        submit(&mut s, 1, j, 0);
        s.step(Time::ZERO).unwrap();
        assert_eq!(s.finish(JobId(1), Time::from_secs(5), false).unwrap(), JobState::Restarting);
        assert!(started(&s.step(Time::from_secs(6)).unwrap()).is_empty(), "backoff of 10 s");
        let e = explain(&s, JobId(1), Time::from_secs(6)).unwrap();
        assert_eq!(e.reason, PendingReason::Backoff { until: Time::from_secs(15) });
        // Said relative to now: the server's clock is ms since the epoch, and `t+498912h` meant nothing.
        assert!(
            e.message.ends_with("waits for its backoff, 9.000s more") && !e.message.contains("t+"),
            "{}",
            e.message
        );
        assert_eq!(started(&s.step(Time::from_secs(15)).unwrap()), vec![1]);
        assert_eq!(s.finish(JobId(1), Time::from_secs(20), false).unwrap(), JobState::Failed);
        s.check_invariants().unwrap();
    }

    #[test]
    fn lost_and_draining_nodes_requeue_their_jobs() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 2), node("n1", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 2, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        let n_of = |s: &ClusterState, j: u64| s.job(JobId(j)).unwrap().run.as_ref().unwrap().placement.tasks[0].node;
        let (n1, n2) = (n_of(&s, 1), n_of(&s, 2));
        assert_eq!(s.set_node_state(n1, NodeState::Lost, Time::from_secs(10)).unwrap(), vec![JobId(1)]);
        assert_eq!(s.set_node_state(n2, NodeState::Draining, Time::from_secs(10)).unwrap(), vec![JobId(2)]);
        // Both are asked to stop and keep their GPUs until that is confirmed (the lost node's by its fence).
        assert!(s.job(JobId(1)).unwrap().is_stopping() && s.job(JobId(2)).unwrap().is_stopping());
        assert_eq!(s.allocated_gpus(), 4);
        s.check_invariants().unwrap();
        assert_eq!(s.fence_expired(n1, Time::from_secs(10)).unwrap()[0].state, JobState::Preempted);
        assert_eq!(s.job(JobId(1)).unwrap().restarts, 0, "a lost node is not the job's failure");
        assert_eq!(s.end_attempt(JobId(2), Time::from_secs(10)).unwrap().state, JobState::Preempted);
        assert_eq!(s.capacity_gpus(), 0);
        s.check_invariants().unwrap();
        s.set_node_state(n1, NodeState::Ready, Time::from_secs(20)).unwrap();
        assert_eq!(started(&s.step(Time::from_secs(30)).unwrap()), vec![1]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn bad_placements_are_errors_not_panics() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 2, 1), 0);
        let bad = Placement {
            tasks: vec![TaskPlacement {
                node: NodeId(0),
                gpu_mask: 0b100,
                mig_slot: None,
                cpu: MilliCpu::cores(2),
                mem: MiB::gib(8),
            }],
        };
        assert!(s.start(JobId(1), bad, false, Time::ZERO).is_err());
        assert!(s.start(JobId(9), Placement::default(), false, Time::ZERO).is_err());
        assert!(s.finish(JobId(1), Time::ZERO, true).is_err());
        s.check_invariants().unwrap();
    }

    #[test]
    fn restore_brings_every_job_back_in_its_state() {
        let build = || {
            let c = preempting(Policy::Priority, Dur::ZERO);
            cluster(c, vec![node("n0", GpuModel::T4, 2), node("n1", GpuModel::T4, 2)], &["a"])
        };
        let mut s = build();
        for i in 0..4 {
            submit(&mut s, i + 1, JobSpec::new(t0(), "j", 1, 1), i);
        }
        s.step(Time::from_secs(5)).unwrap();
        submit(&mut s, 9, JobSpec::new(t0(), "hi", 2, 1).priority(5), 6);
        s.step(Time::from_secs(10)).unwrap(); // evicts two
        submit(&mut s, 10, JobSpec::new(t0(), "late", 1, 1), 11);
        s.finish(JobId(1), Time::from_secs(12), true).ok();
        let docs: Vec<String> = s.jobs().map(|j| serde_json::to_string(j).unwrap()).collect();
        let mut r = build();
        for d in &docs {
            r.restore(serde_json::from_str(d).unwrap(), Time::from_secs(13)).unwrap();
        }
        r.check_invariants().unwrap();
        for j in s.jobs() {
            let k = r.job(j.id).unwrap();
            assert_eq!((k.state, &k.run), (j.state, &j.run), "{}", j.id);
        }
        assert_eq!(schedule(&s, Time::from_secs(20)), schedule(&r, Time::from_secs(20)));
        // A running job whose GPUs are taken cannot be restored twice.
        let running = s.jobs().find(|j| j.state == JobState::Running).unwrap().clone();
        let mut dup = running.clone();
        dup.id = JobId(99);
        assert!(r.restore(dup, Time::from_secs(13)).is_err());
    }

    #[test]
    fn placeable_counts_what_fits_behind_a_blocked_head() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 4, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 8, 1), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "c", 2, 1), 2);
        submit(&mut s, 4, JobSpec::new(t0(), "d", 2, 1), 3);
        submit(&mut s, 5, JobSpec::new(t0(), "e", 1, 1), 4);
        let now = Time::from_secs(10);
        assert_eq!(started(&schedule(&s, now)), vec![1], "strict FIFO stops at job 2");
        assert_eq!(crate::schedule::placeable(&s, now), 3, "jobs 1, 3 and 4 fit; 2 and then 5 do not");
        s.check_invariants().unwrap();
    }
}
