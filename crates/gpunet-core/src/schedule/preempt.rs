//! Victim search: which running jobs to evict so that a job can start (quota reclaim from borrowers, priority, LAS
//! demotion, a much shorter job under preemptive SJF/SRTF; fewest lost GPU-time, then fewest jobs, within the preemption rate limit), evictions already under way
//! counted first, each freed GPU for one waiting job only (`Pass::promised`); and the jobs that evictions were made
//! for, which go first in the next passes so that the victims do not take their room back.

use super::{Decision, Pass, Res};
use crate::config::Policy;
use crate::ids::{JobId, TenantId};
use crate::job::{Job, JobState};
use crate::quota::{job_qvec, QuotaBook};
use crate::units::Time;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

mod per_node;

/// Why a job is evicted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreemptReason {
    /// The owner of a guarantee needs it back from a borrower.
    QuotaReclaim {
        /// Tenant reclaiming.
        owner: TenantId,
    },
    /// A higher-priority job needs the resources.
    Priority {
        /// Victim's priority.
        victim: i32,
        /// Preemptor's priority.
        preemptor: i32,
    },
    /// LAS: the victim was demoted to a lower queue than a waiting job's.
    LasDemotion {
        /// Victim's queue.
        victim_queue: usize,
        /// Waiting job's queue.
        waiting_queue: usize,
    },
    /// Preemptive SJF/SRTF: the waiting job's key (remaining estimated time, or estimate ÷ GPUs) is at most
    /// `1 / shorter_ratio` of the victim's.
    ShorterJob {
        /// Victim's key, seconds.
        victim_s: u64,
        /// Waiting job's key, seconds.
        waiting_s: u64,
    },
    /// Defragmentation: the victim is moved off a node that the waiting job needs whole, to GPUs free elsewhere
    /// (`PreemptionConfig::defragment`).
    Defragment {
        /// GPUs the waiting job needs.
        waiting_gpus: u32,
        /// Where the victim starts again (free when it was chosen, and kept for it until then).
        to: crate::job::Placement,
        /// Where the waiting job starts once the victims are gone (kept for it until then).
        room: crate::job::Placement,
    },
}

/// What a victim search found: the victims, the head's placement once they are gone, and the free CPU and memory
/// then on its nodes.
pub(super) type Found =
    (Vec<JobId>, crate::job::Placement, Vec<(crate::ids::NodeId, crate::units::MilliCpu, crate::units::MiB)>);

impl Pass<'_> {
    /// Jobs that evictions were made for go first, so the victims do not take their resources back. Each starts if
    /// its room is free; otherwise what it will use is kept off-limits for the others. Jobs moved by defragmentation
    /// (`ClusterState::moving`) and the jobs they were moved for (`moving_for`) go before them, each where it was
    /// moved to, or where its room was cleared, if that is all free; and where the moved jobs still stopping go is
    /// kept for them. Returns the jobs served.
    pub(super) fn serve_preemptors(&mut self) -> HashSet<JobId> {
        let st = self.st;
        let mut served: HashSet<JobId> = HashSet::new();
        let mut moved_left: Vec<JobId> = Vec::new();
        for (&jid, to) in st.moving.iter().chain(&st.moving_for) {
            let Some(job) = st.jobs.get(&jid) else {
                continue;
            };
            if !job.state.is_queued() || !st.preempting_for.contains(&jid) {
                continue;
            }
            served.insert(jid);
            if self.free_exactly(job, to) {
                self.commit_start(job, to.clone(), false);
            } else {
                moved_left.push(jid);
            }
        }
        // Kept for their jobs: where the moved jobs still stopping go, and the rooms of the jobs they were moved for
        // that did not start above.
        let stopping = st.moving.iter().filter(|(j, _)| st.jobs.get(j).is_some_and(|j| j.state == JobState::Running));
        let rooms = st.moving_for.iter().filter(|(j, _)| moved_left.contains(j));
        for tp in stopping.chain(rooms).flat_map(|(_, to)| &to.tasks) {
            let part = self.free_part(tp.node, tp.gpu_mask, tp.cpu, tp.mem);
            if part.gpu_mask != 0 || part.cpu.0 > 0 || part.mem.0 > 0 {
                self.free.take(&st.topo, &part);
            }
        }
        let mut order: Vec<JobId> = st.preempting_for.iter().copied().filter(|j| !served.contains(j)).collect();
        order.extend(moved_left);
        for jid in order {
            let Some(job) = st.jobs.get(&jid) else {
                continue;
            };
            if !job.state.is_queued() {
                continue;
            }
            served.insert(jid);
            let spec = &job.spec;
            let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
            if self.book.admit(&st.shape, spec.tenant, &job_qvec(spec, min_tasks, None)).is_err() {
                continue;
            }
            let base = self.eligible(spec);
            let Ok(classes) = self.quota_classes(spec.tenant, spec, min_tasks, &base) else {
                continue;
            };
            match self.try_place(job, &classes, None) {
                Some(p) => self.commit_start(job, p, false),
                None => {
                    // Still waiting for its victims to exit: keep what it will use off-limits for the others.
                    if let Some((_, r)) = self.find_victims(job, &classes, false) {
                        self.claim(&r.hold);
                    } else if self.defragment(job, &classes) {
                        continue; // room is being made again, elsewhere
                    }
                    self.note(jid, |p| {
                        p.capacity_reason(spec, &classes, Some(p.now), st.evicting.iter().copied().collect())
                    });
                }
            }
        }
        served
    }

    /// Whether a moved job can start exactly where it was moved to: every task's node schedulable and one the job
    /// may use, its resources free (tasks on one node counted together), and its tenant's quota admitting it.
    fn free_exactly(&mut self, job: &Job, to: &crate::job::Placement) -> bool {
        let st = self.st;
        let mark = self.free.mark();
        let mut fits = !to.tasks.is_empty();
        for tp in &to.tasks {
            let ok = self.free.nodes[tp.node.index()].schedulable
                && job.spec.node_eligible(&st.node_specs[tp.node.index()])
                && self.free.can_take(&st.topo, tp).is_ok();
            if !ok {
                fits = false;
                break;
            }
            self.free.take(&st.topo, tp);
        }
        self.free.rollback(&st.topo, mark);
        fits && self.book.admit(&st.shape, job.spec.tenant, &st.placement_qvec(&job.spec, to)).is_ok()
    }

    /// Makes room for the blocked head by evicting victims; what it will use is claimed. Returns whether room is
    /// being made.
    pub(super) fn make_room(&mut self, job: &Job, classes: &[u32]) -> bool {
        let Some((victims, reservation)) = self.find_victims(job, classes, false) else {
            return false;
        };
        self.claim(&reservation.hold);
        self.note(job.id, |p| p.capacity_reason(&job.spec, classes, Some(p.now), victims));
        true
    }

    /// Makes room in its tenant's quota for a quota-held job by evicting the tenant's own lower-priority (or
    /// demoted) jobs; what it will use is claimed. Returns whether room is being made.
    pub(super) fn make_room_in_quota(&mut self, job: &Job, classes: &[u32]) -> bool {
        let Some((_, r)) = self.find_victims(job, classes, true) else {
            return false;
        };
        self.claim(&r.hold);
        true
    }

    /// Victims whose eviction lets the head start, with fewest lost GPU-time then fewest jobs, within the rate limit.
    /// With `quota_blocked`, the job is held by its own tenant's quota: only that tenant's lower-priority (or, under
    /// LAS, demoted) jobs are candidates, and the victims must free both the quota and the room.
    fn find_victims(&mut self, job: &Job, classes: &[u32], quota_blocked: bool) -> Option<(Vec<JobId>, Res)> {
        // What is free once evictions are made is worked out on the pass's own pool, whose changes are logged, and
        // rolled back afterwards (instead of a copy of the pool for each search); the reservation's hold is then
        // worked out against the pool as it is now.
        let mark = self.free.mark();
        let found = self.search_victims(job, classes, quota_blocked);
        self.free.rollback(&self.st.topo, mark);
        let (victims, placement, later) = found?;
        let res = self.room_made(job, &placement, &later, quota_blocked);
        Some((victims, res))
    }

    /// Room is being made for `job` on `placement` (by victims chosen or evictions under way; `later`: the free CPU
    /// and memory on its nodes once they are gone): the reservation that keeps it for the job.
    pub(super) fn room_made(
        &mut self,
        job: &Job,
        placement: &crate::job::Placement,
        later: &[(crate::ids::NodeId, crate::units::MilliCpu, crate::units::MiB)],
        quota_blocked: bool,
    ) -> Res {
        let hold = self.hold_from(placement, later);
        // The GPUs and MIG slots of the placement that are not free now come from evictions: promised to this job for
        // the rest of the pass (not for a job its own quota holds: its wait is for its quota as much as for room, and
        // it neither makes nor counts promises). CPU and memory are not promised: what of them comes from evictions
        // under way rather than from victims chosen in this pass is not known per task, and promising too much would
        // make later searches evict for nothing.
        if !quota_blocked {
            for tp in &placement.tasks {
                let f = &self.free.nodes[tp.node.index()];
                let gpu_mask = tp.gpu_mask & !f.mask;
                let mig_slot = tp.mig_slot.filter(|s| f.mig & (1 << s) == 0);
                if gpu_mask != 0 || mig_slot.is_some() {
                    let (cpu, mem) = (crate::units::MilliCpu(0), crate::units::MiB(0));
                    self.promised.push(crate::job::TaskPlacement { node: tp.node, gpu_mask, mig_slot, cpu, mem });
                }
            }
        }
        Res { head: job.id, at: self.now, hold, forbid: Vec::new(), placement: None }
    }

    /// [`Self::find_victims`], working on the pass's pool (`self.free`), which the caller rolls back: the victims,
    /// the head's placement once they are gone, and the free CPU and memory then on its nodes
    /// ([`Self::later_on`]).
    fn search_victims(&mut self, job: &Job, classes: &[u32], quota_blocked: bool) -> Option<Found> {
        let st = self.st;
        let cfg = &st.cfg.preemption;
        let spec = &job.spec;
        let tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let need = spec.task.gpus as u64 * tasks as u64;
        let t = spec.tenant;
        let shape = &st.shape;
        let las = st.cfg.policy == Policy::Las;
        // Preemptive SJF/SRTF: the waiting job's key, when it has one.
        let my_key = match st.cfg.policy {
            Policy::Srtf => crate::state::srtf_key(&st.cfg, job),
            Policy::Srgf => crate::state::srgf_key(&st.cfg, job),
            Policy::Sjf => crate::state::sjf_key(job),
            _ => u64::MAX,
        };
        let shorter = cfg.shorter_first && my_key != u64::MAX;
        let gittins = st.cfg.learned_rule() == crate::gittins::Rule::Gittins;
        // LAS evicts jobs demoted to a later queue than the waiting job's: none can be, when the job is in the last
        // queue already (then no scan of the running jobs is made for LAS's sake).
        let my_queue = st.cfg.las_queue(job.attained_gpu_ms);
        let demote_possible = las && my_queue < st.cfg.las_thresholds_gpu_s.len();
        // Held by its own quota, a job can only evict its own tenant's jobs: of lower priority and past their
        // minimum run time, those (or, with LAS or shorter-first, what a scan finds).
        let prio_possible = if quota_blocked {
            self.turns_at(self.now); // which of its tenant's jobs are old enough is not bounded here
            st.runs_older_lower_priority(t, spec.priority, Time(self.now.0.saturating_sub(cfg.min_run_time.0)))
        } else {
            st.prio_counts.range(..spec.priority).next().is_some()
        };
        if quota_blocked && !prio_possible && !demote_possible && !shorter && st.evicting.is_empty() {
            return None;
        }
        let budget = cfg.max_per_interval.saturating_sub(st.recent_preemptions(self.now) + self.stats.preempted as u32);
        // The budget grows when an eviction leaves the window: that counts wherever the budget decides.
        let budget_grows_at = st.preemption_window_turns(self.now).unwrap_or(Time::MAX);
        if budget == 0 && st.evicting.is_empty() {
            self.turns_at(budget_grows_at);
            return None; // no eviction under way to wait for, and none may be made
        }
        let within_guarantee = shape.tenants[t.index()].0.is_some()
            && self.book.admit(shape, t, &job_qvec(spec, tasks, None)) == Ok(false);
        // Class indexes below 64 are looked up in a bit mask, others in a set (made only when there are such).
        let mut class_mask = 0u64;
        for c in classes {
            class_mask |= if *c < 64 { 1u64 << c } else { u64::MAX };
        }
        let exact_mask = classes.iter().all(|c| *c < 64);
        let class_set: HashSet<u32> = if exact_mask { HashSet::new() } else { classes.iter().copied().collect() };
        let eligible_class =
            |c: u32| if exact_mask { c < 64 && class_mask & (1u64 << c) != 0 } else { class_set.contains(&c) };
        let on_eligible = |j: &Job| {
            j.run.as_ref().is_some_and(|r| {
                r.placement.tasks.iter().any(|tp| eligible_class(st.topo.nodes[tp.node.index()].class))
            })
        };
        let req = job_qvec(spec, tasks, None);
        // Evictions already under way count first: if they make room, wait for them. (The free pool and the quota
        // book are copied only when an eviction under way is there to count.)
        let mut fut_book: Option<QuotaBook> = None;
        let mut pending_evictions = false;
        let evicting = self.evicting_jobs.get_or_insert_with(|| st.evicting.iter().map(|id| &*st.jobs[id]).collect());
        for &j in evicting.iter() {
            if on_eligible(j) || (quota_blocked && j.spec.tenant == t) {
                let run = j.run.as_ref().expect("evicting job runs");
                for tp in &run.placement.tasks {
                    self.free.give(&st.topo, tp);
                }
                if quota_blocked {
                    fut_book.get_or_insert_with(|| self.book.clone()).charge(
                        shape,
                        j.spec.tenant,
                        &st.placement_qvec(&j.spec, &run.placement),
                        true,
                    );
                }
                pending_evictions = true;
            }
        }
        // Room already promised to a job of this pass that waits for evictions is not free for this one. (What is not
        // free here, as GPUs of victims chosen in this pass, which are not given back, is not taken; nor is a node
        // touched where nothing is to be taken: a take moves the node within its bucket.)
        if pending_evictions && !quota_blocked {
            for k in 0..self.promised.len() {
                let p = &self.promised[k];
                let f = &self.free.nodes[p.node.index()];
                let gpu_mask = p.gpu_mask & f.mask;
                let mig_slot = p.mig_slot.filter(|s| f.mig & (1 << s) != 0);
                if gpu_mask != 0 || mig_slot.is_some() {
                    let tp = crate::job::TaskPlacement { node: p.node, gpu_mask, mig_slot, cpu: p.cpu, mem: p.mem };
                    self.free.take(&st.topo, &tp);
                }
            }
        }
        // Held by its own quota: the evictions must free that quota too.
        let quota_ok =
            |b: &Option<QuotaBook>| !quota_blocked || b.as_ref().is_some_and(|b| b.admit(shape, t, &req).is_ok());
        if pending_evictions && quota_ok(&fut_book) {
            if let Some(p) = self.place_on(&self.free, spec, tasks, classes, None) {
                let later = Self::later_on(&self.free, &p);
                return Some((Vec::new(), p, later));
            }
        }
        if budget == 0 {
            self.turns_at(budget_grows_at);
            return None;
        }
        // Candidates: one linear scan over the compact running rows, cheapest checks first.
        let no_quota: Vec<bool> = shape.tenants.iter().map(|(q, _)| q.is_none()).collect();
        // Over its guarantee: a tenant with a quota holding more GPUs than it guarantees, or a tenant without a quota
        // holding any (it has no guarantee: all it holds is lent by the tenants that have one, and theirs to reclaim).
        let over: Vec<bool> = (0..st.tenants.len())
            .map(|i| {
                self.book.over_guarantee(shape, TenantId(i as u32))
                    || (no_quota[i] && self.book.usage[i][crate::tenant::DIM_GPUS] > 0)
            })
            .collect();
        let mut cands: Vec<(u64, u32, JobId, PreemptReason)> = Vec::with_capacity(64);
        let mut cand_nodes: Vec<Option<crate::ids::NodeId>> = Vec::with_capacity(64);
        let mut cand_lost: Vec<crate::state::LostWork> = Vec::with_capacity(64);
        let reclaim_possible = within_guarantee && over.iter().enumerate().any(|(i, o)| *o && i != t.index());
        let parts: &[Vec<crate::state::RunRow>] = if demote_possible || prio_possible || shorter {
            &st.run_rows[..]
        } else if quota_blocked {
            return None;
        } else if reclaim_possible {
            // Borrowed rows only, unless a tenant without a quota is to give back: its jobs sit in the rows of those
            // within their guarantee.
            let no_quota_over = (0..st.tenants.len()).any(|i| no_quota[i] && over[i] && i != t.index());
            if no_quota_over {
                &st.run_rows[..]
            } else {
                &st.run_rows[1..]
            }
        } else {
            return None;
        };
        // What a running job of each tenant may be evicted for, worked out once per tenant instead of once per row:
        // lent (it is the waiting job's tenant's, or neither has a quota; a borrowed row is lent whatever its
        // tenant), or reclaimable (another tenant's, over its guarantee, while the waiting job is within its own
        // and not held by its own quota: from borrowed rows, or from any row of a tenant without a quota).
        const LENT: u8 = 1;
        const RECLAIM_BORROWED: u8 = 2;
        const RECLAIM_ANY: u8 = 4;
        let tenant_flags: Vec<u8> = (0..st.tenants.len())
            .map(|i| {
                let mut f = 0;
                if i == t.index() || (no_quota[i] && no_quota[t.index()]) {
                    f |= LENT;
                }
                if !quota_blocked && within_guarantee && i != t.index() && over[i] {
                    f |= RECLAIM_BORROWED | if no_quota[i] { RECLAIM_ANY } else { 0 };
                }
                f
            })
            .collect();
        // The shorter-first bound, and the same divided by a victim's GPUs (rounded up) for the usual GPU counts:
        // when a victim's key crosses it (`shorter_turns_at`) is worked out per row without a division.
        let bound = my_key.saturating_mul(cfg.shorter_ratio as u64);
        let per_gpus: [u64; 9] = std::array::from_fn(|g| bound.div_ceil(g.max(1) as u64));
        let policy = st.cfg.policy;
        let now = self.now;
        // A victim's key by its median (or a given estimate): what is left of it, times its GPUs under SRGF; past
        // its estimated end a job is expected to run about as long again as this attempt has.
        let scale =
            |left: u64, gpus: u32| if policy == Policy::Srgf { left.saturating_mul(gpus.max(1) as u64) } else { left };
        let median_key = |est_end: Time, started: Time, gpus: u32| {
            scale(crate::ClusterState::expected_end(est_end, started, now).since(now).0, gpus)
        };
        // What a victim's time-based key (before `scale`) must reach to be at or above the bound.
        let per_g = |gpus: u32| {
            let g = if policy == Policy::Srgf { gpus.max(1) as usize } else { 1 };
            per_gpus.get(g).copied().unwrap_or_else(|| bound.div_ceil(g as u64))
        };
        // Under SRTF and SRGF a victim's key moves with time, SJF's does not. By its median: when it first crosses
        // the bound, from its estimated end, start and GPUs, whether it is at or above it now, and its key. A key that
        // saturated (an SRGF key past u64::MAX) is not followed.
        let key_turns_at = |vk: u64, gpus: u32, est_end: Time, started: Time, longer: bool| {
            if vk == u64::MAX {
                return now;
            }
            shorter_turns_at(est_end, started, now, per_g(gpus), longer)
        };
        // By a Gittins rank it moves with the service the job gets, and not along a line. Its service passing its
        // median (`pos`: how far it is known to run, `at`: its service now), its rank may jump up to the time it has
        // run (`LogNormal::rank`): the turn so far (`turn`), no later than then.
        let median_turn = |turn: Time, pos: u64, at: u64, median: u64| {
            if pos <= median {
                turn.min(now + crate::units::Dur(median - at))
            } else {
                turn
            }
        };
        // And from `rank` (the rank now, or a bound over it when the key is under the bound, or under it when over)
        // and `slope` (how fast it can move, `LogNormal::quick_bounds`; ranked from how far a job is known to run, it
        // first falls at one ms per ms): the earliest time the key may cross the bound (fall below it when at or above
        // it now, reach it when below). Given the earliest such time over the rows so far and the median's
        // (`turn`, from `median_turn`), the earlier of the two: a row whose gap is at least its slope times what is
        // left until then needs no division.
        let gittins_turn = |turn: Time, rank: u64, slope: f64, gpus: u32, longer: bool| {
            let per_g = per_g(gpus);
            // Below `per_g` the key is under the bound; at or above it, at or above.
            let gap = if longer { rank.saturating_sub(per_g).saturating_add(1) } else { per_g.saturating_sub(rank) };
            // Two ms of the gap are left for the rank's rounding to whole milliseconds, and more for the rounding of
            // its logarithm at huge ranks (steps of about 10^-14 of the rank: 7 ms at 4·10^14 ms).
            let slack = 2 + (rank >> 40);
            let (gap, slope) = (gap.saturating_sub(slack) as f64, slope * (1.0 + 1e-9));
            if gap < slope * turn.since(now).0 as f64 {
                turn.min(now + crate::units::Dur((gap / slope) as u64))
            } else {
                turn
            }
        };
        // Every tenant's rows lent and none reclaimable (no quotas, as in most replays): no lookup per row. No running
        // job of lower priority: no comparison per row.
        let all_lent = tenant_flags.iter().all(|f| *f == LENT);
        let lower_priority_runs = st.prio_counts.range(..spec.priority).next().is_some();
        // The earliest time at which time alone makes a row a candidate (or changes its reason), over the rows: one
        // `turns_at` for the scan.
        let mut turn = Time::MAX;
        // A job with a reason to be evicted, from its row or its brief: a candidate once old enough (else the time at
        // which it will be), unless already a victim of this pass; skipped (`continue`) otherwise.
        macro_rules! candidate {
            ($started:expr, $id:expr, $gpus:expr, $node:expr, $lost:expr, $reason:expr) => {{
                let (started, id): (Time, JobId) = ($started, $id);
                if now.since(started) < cfg.min_run_time {
                    turn = turn.min(started + cfg.min_run_time); // too young: a candidate once old enough
                    continue;
                }
                if !self.preempted.is_empty() && self.preempted.contains(&id) {
                    continue;
                }
                cands.push((0, $gpus, id, $reason)); // the work it would lose: below, once it counts
                cand_nodes.push($node);
                cand_lost.push($lost);
            }};
        }
        // Each row: a candidate if it may be evicted now (old enough, not already a victim of this pass); otherwise
        // the time at which time alone may make it one (`turns_at`). A macro, not a closure, so that both loops below
        // have it inline.
        macro_rules! visit {
            ($r:expr) => {{
                let r: &crate::state::RunRow = $r;
                if no_candidate(r.preemptible, r.evicting, r.classes, class_mask, r.id == job.id) {
                    continue;
                }
                // A job on a node class of 64 or more matches every mask: with an exact mask, it is a candidate only
                // when it runs on an eligible class too (else ranking it would crowd out one the walk could take).
                if exact_mask && r.classes == u64::MAX && !on_eligible(&st.jobs[&r.id]) {
                    continue;
                }
                let (lendable, reclaimable) = if all_lent {
                    (true, false)
                } else {
                    let flags = tenant_flags[r.tenant.index()];
                    (
                        r.borrowed || flags & LENT != 0,
                        flags & if r.borrowed { RECLAIM_BORROWED } else { RECLAIM_ANY } != 0,
                    )
                };
                let reason = if reclaimable {
                    PreemptReason::QuotaReclaim { owner: t }
                } else if lower_priority_runs && r.priority < spec.priority && lendable {
                    PreemptReason::Priority { victim: r.priority, preemptor: spec.priority }
                } else if las && lendable {
                    match las_past(&st.cfg, r.attained_before, r.started, r.gpus, now, my_queue) {
                        Ok(vq) => PreemptReason::LasDemotion { victim_queue: vq, waiting_queue: my_queue },
                        Err(at) => {
                            turn = turn.min(at);
                            continue;
                        }
                    }
                } else if shorter && lendable {
                    // A victim with neither an estimate nor a probe (`JobSpec::ranked`; its estimated end is
                    // `Time::MAX`) is not known to be longer: it is left alone. One with a learned
                    // estimate ranks by its Gittins rank at its attained time (when so configured), else by its
                    // median.
                    let (mut ranked, mut unranked) = (None, false);
                    let vk = match policy {
                        Policy::Srtf | Policy::Srgf if r.est_end != Time::MAX => match r.learned {
                            Some(dist) if gittins => {
                                let at = attained(r, now);
                                // Ranked from how far it is known to run, plus the work up to there
                                // (`rank_from_known`). Most rows are under the bound: a bound over the rank, which
                                // takes no logarithm, settles them, and when they may first reach it.
                                let pos = r.known.max(at);
                                let (up, slope) = dist.quick_bounds(crate::units::Dur(pos));
                                let up = up.saturating_add(pos - at);
                                let kept = median_turn(turn, pos, at, dist.median().0);
                                if self.quick_ranks && scale(up, r.gpus) < bound {
                                    self.quick_settled += 1;
                                    turn = gittins_turn(kept, up, slope, r.gpus, false);
                                    continue;
                                }
                                // Most of the others are surely at or over it, by a bound under the rank (and one
                                // over it that does not saturate): a candidate without its rank, unless its fall
                                // below the bound, counted from that bound, could come before the turn so far (the
                                // rank is then worked out, and the turn is the same either way). A victim chosen
                                // gets its rank for its reason (`UNRANKED`).
                                let low = dist.quick_low(crate::units::Dur(pos)).saturating_add(pos - at);
                                if self.quick_ranks
                                    && scale(low, r.gpus) >= bound
                                    && scale(up, r.gpus) != u64::MAX
                                    && gittins_turn(kept, low, slope, r.gpus, true) == kept
                                {
                                    self.quick_longer += 1;
                                    turn = kept;
                                    unranked = true;
                                    scale(low, r.gpus)
                                } else {
                                    let rank = gittins_rank(r, dist, at);
                                    ranked = Some((rank, slope, kept));
                                    scale(rank, r.gpus)
                                }
                            }
                            _ => median_key(r.est_end, r.started, r.gpus),
                        },
                        Policy::Sjf => r.sjf_key,
                        _ => continue,
                    };
                    let longer = vk != u64::MAX && vk >= bound;
                    if policy != Policy::Sjf && !unranked {
                        turn = match ranked {
                            Some(_) if vk == u64::MAX => now, // a saturated key is not followed
                            Some((rank, slope, kept)) => gittins_turn(kept, rank, slope, r.gpus, longer),
                            None => turn.min(key_turns_at(vk, r.gpus, r.est_end, r.started, longer)),
                        };
                    }
                    if !longer {
                        continue;
                    }
                    let victim_s = if unranked { UNRANKED } else { vk / 1000 };
                    PreemptReason::ShorterJob { victim_s, waiting_s: my_key / 1000 }
                } else {
                    continue;
                };
                candidate!(r.started, r.id, r.gpus, r.node, r.lost(), reason);
            }};
        }
        // The search is bounded by `PreemptionConfig::victim_scan_limit`; what it leaves out may be a candidate now,
        // so whether a later pass finds victims is not bounded by time alone.
        let limit = cfg.victim_scan_limit.max(1) as usize;
        let mut truncated = false;
        // What the rows a quota-held search meets make of them depends on the tenant, the job's priority, LAS queue,
        // eligible classes and shorter-first key, and the victims chosen in the pass so far: a search that shares
        // the first with an earlier one of the pass, no victim chosen since, takes its candidates as that one found
        // them. (Only with every class below 64, where the class mask stands for the classes.)
        let memo_key = (quota_blocked && exact_mask && self.held_memo).then_some(HeldKey {
            tenant: t,
            priority: spec.priority,
            queue: if demote_possible { my_queue } else { usize::MAX },
            class_mask,
            shorter: if shorter { my_key } else { u64::MAX },
        });
        // What the job lacks: GPUs free on its classes (the pool does not change before the walk below), and, held
        // by its own quota, what its tenant must give back before that quota admits it (`QuotaBook::gpu_shortfall`:
        // the victims are all the tenant's own, evictions under way counted), whichever is more.
        let lacking = need.saturating_sub(self.free.free_in(classes));
        let lacking = if quota_blocked {
            lacking.max(fut_book.as_ref().unwrap_or(&self.book).gpu_shortfall(shape, t, &req))
        } else {
            lacking
        };
        let hit =
            memo_key.and_then(|k| self.held_cands.iter().find(|h| h.key == k && h.preempted == self.preempted.len()));
        if let Some(h) = hit {
            // The candidates are ranked as the earlier search ranked them (the same time, the same budget): when
            // those its walk can reach could not free what this job lacks, it gives up at once, as its ranking
            // would have it (every check before that one gives up too, or passes), without copying or ranking them.
            // (A quota-held search has turned the pass at its own time already: no time to note.)
            let gives_up = h.reach.is_some_and(|(b, reach)| self.room_precheck && b == budget && reach < lacking);
            if gives_up && !h.cands.is_empty() {
                self.held_hits += 1;
                self.reach_hits += 1;
                self.prechecked += 1;
                return None;
            }
            cands.extend_from_slice(&h.cands);
            cand_nodes.extend_from_slice(&h.nodes);
            cand_lost.extend_from_slice(&h.lost);
            (turn, truncated) = (h.turn, h.truncated);
            self.held_hits += 1;
        } else if quota_blocked {
            self.victim_scans += 1;
            // Held by its own quota, only the tenant's own jobs are candidates: its rows through its index of running
            // jobs (by priority: below the job's, unless LAS or shorter-first may evict any of them) instead of a
            // scan of every running job, lowest priority and oldest first, until `limit` candidates are found (rows
            // that are no candidate do not count: a job is not kept from the victim behind them). Candidates are
            // ranked by a key unique to each below, so the order they are met in is not used.
            let any_priority = demote_possible || shorter;
            // Shorter-first keys a brief can work out: SRTF's and SRGF's, with learned estimates ranked by their
            // median (as if exact).
            let brief_keys = shorter && !gittins && matches!(policy, Policy::Srtf | Policy::Srgf);
            let rows = st
                .tenant_runs
                .range_from(&(t, i32::MIN, Time(0), JobId(0)))
                .take_while(|((tt, p, _, _), _)| *tt == t && (any_priority || *p < spec.priority));
            for (&(_, priority, started, id), b) in rows {
                if cands.len() >= limit {
                    truncated = true;
                    break;
                }
                // What the row's brief settles, as `visit!` would, without reading the row: no candidate at all, or
                // (the row not one by priority) under LAS not past the job's queue yet, and when it will be.
                if self.held_brief {
                    if no_candidate(b.preemptible, b.evicting, b.classes, class_mask, id == job.id) {
                        self.brief_settled += 1;
                        continue;
                    }
                    let by_priority = lower_priority_runs && priority < spec.priority;
                    let briefed = !(exact_mask && b.classes == u64::MAX);
                    let mut queue = None;
                    if las && !by_priority && briefed {
                        match las_past(&st.cfg, b.attained_before, started, b.gpus, now, my_queue) {
                            Ok(vq) => queue = Some(vq),
                            Err(at) => {
                                turn = turn.min(at);
                                self.brief_settled += 1;
                                continue;
                            }
                        }
                    }
                    // The brief settles the rest as `visit!` would (every row here is the tenant's own: lent, not
                    // reclaimable), and the candidate is made from it: by priority, LAS, or shorter-first under
                    // SRTF or SRGF ranking by medians, whose key it works out from the row's estimated end (SJF's
                    // key and Gittins ranks are in the row only).
                    if briefed && (!shorter || by_priority || brief_keys) {
                        self.brief_settled += 1;
                        let reason = if by_priority {
                            PreemptReason::Priority { victim: priority, preemptor: spec.priority }
                        } else if let Some(vq) = queue {
                            PreemptReason::LasDemotion { victim_queue: vq, waiting_queue: my_queue }
                        } else if shorter && b.est_end != Time::MAX {
                            let vk = median_key(b.est_end, started, b.gpus);
                            let longer = vk != u64::MAX && vk >= bound;
                            turn = turn.min(key_turns_at(vk, b.gpus, b.est_end, started, longer));
                            if !longer {
                                continue;
                            }
                            self.brief_keyed += 1;
                            PreemptReason::ShorterJob { victim_s: vk / 1000, waiting_s: my_key / 1000 }
                        } else {
                            continue;
                        };
                        candidate!(started, id, b.gpus, b.node, b.lost(started), reason);
                        self.brief_cands += 1;
                        continue;
                    }
                }
                let (part, i) = b.place();
                visit!(&st.run_rows[part][i]);
            }
            if let Some(key) = memo_key {
                let h = HeldCands {
                    key,
                    preempted: self.preempted.len(),
                    cands: cands.clone(),
                    nodes: cand_nodes.clone(),
                    lost: cand_lost.clone(),
                    turn,
                    truncated,
                    reach: None,
                };
                match self.held_cands.iter_mut().find(|h| h.key == key) {
                    Some(old) => *old = h,
                    None => self.held_cands.push(h),
                }
            }
        } else {
            self.victim_scans += 1;
            let total: usize = parts.iter().map(Vec::len).sum();
            // Over the limit, a window of `limit` rows in a row, wrapping, from a place drawn from the job and the
            // time: each search of a long-blocked job looks at another part of the cluster.
            let (mut pos, mut left) = if total > limit {
                truncated = true;
                (scan_start(job.id, now, total), limit)
            } else {
                (0, total)
            };
            while left > 0 {
                let (part, at) = if pos < parts[0].len() { (0, pos) } else { (1, pos - parts[0].len()) };
                let rows = &parts[part][at..];
                let n = rows.len().min(left);
                for r in &rows[..n] {
                    visit!(r);
                }
                left -= n;
                pos = (pos + n) % total;
            }
        }
        if truncated {
            turn = now;
        }
        self.turns_at(turn);
        if cands.is_empty() {
            return None; // whatever the budget
        }
        self.turns_at(budget_grows_at);
        // Whichever victims the budget allows, they free at most the GPUs of the `budget` candidates holding the most:
        // when that is less than the job lacks (`lacking`, above), no placement can follow, so the search is not made.
        if self.room_precheck && lacking > 0 && most_gpus_freed(cands.iter().map(|c| c.1), budget) < lacking {
            self.prechecked += 1;
            return None;
        }
        // A one-task job needs its GPUs on one node: unless some eligible node can have them free once at most
        // `budget` of the candidates on it are gone, the search below cannot succeed (its every result is such a
        // node and victims), so it is not made.
        if self.room_precheck
            && tasks == 1
            && spec.task.gpus > 0
            && !self.one_node_room_possible(&cands, &cand_nodes, spec.task.gpus, classes, budget)
        {
            self.prechecked += 1;
            return None;
        }
        for (c, l) in cands.iter_mut().zip(&cand_lost) {
            c.0 = l.at(now);
        }
        // The candidates in cost order; `cands` itself keeps every one, for the search per node below.
        let key = |i: &usize| {
            let c = &cands[*i];
            (c.0, c.1, c.2)
        };
        let mut ranked: Vec<usize> = (0..cands.len()).collect();
        const KEEP: usize = 512;
        // With every eligible class below 64 every candidate is on an eligible class (a job on a class of 64 or more,
        // which matches every mask, was checked above), and the walk below gives up once it holds budget + 33 of
        // them, so no more are worth ordering.
        let keep = if exact_mask { KEEP.min(budget as usize + 33) } else { KEEP };
        if ranked.len() > keep {
            ranked.select_nth_unstable_by_key(keep - 1, key);
            ranked.truncate(keep);
        }
        ranked.sort_unstable_by_key(key);
        // Candidates are ranked by the work they would lose, which grows with time at a rate of their GPUs: what
        // the search below finds may change when their order does (`order_turns_at`: two neighbours in it meet, or
        // one checkpoints). With some left unsorted (over `keep`), at any moment.
        self.turns_at(if ranked.len() == cands.len() {
            let line = |i: usize| (cands[i].0, cand_lost[i].rate(), cand_lost[i].resets_after(now));
            crate::state::order_turns_at(now, ranked.iter().map(|&i| line(i)))
        } else {
            now
        });
        // The walk below chooses from the first `budget + 33` ranked candidates only, and keeps at most `budget` of
        // them: when the `budget` of those holding the most GPUs could not free what the job lacks (as above),
        // and no search per node (which takes from every candidate) follows a failed walk, the walk cannot place the
        // job, so it is not made.
        let per_node_follows = tasks == 1 && spec.task.gpus >= 2 && !quota_blocked && !pending_evictions;
        if self.room_precheck && exact_mask && !per_node_follows && (lacking > 0 || memo_key.is_some()) {
            let reach = most_gpus_freed(ranked.iter().take(budget as usize + 33).map(|&i| cands[i].1), budget);
            if let Some(key) = memo_key {
                let n = self.preempted.len();
                if let Some(h) = self.held_cands.iter_mut().find(|h| h.key == key && h.preempted == n) {
                    h.reach = Some((budget, reach));
                }
            }
            if reach < lacking {
                self.prechecked += 1;
                return None;
            }
        }
        if quota_blocked && fut_book.is_none() {
            fut_book = Some(self.book.clone());
        }
        let tasks_of = |i: usize| &st.jobs[&cands[i].2].run.as_ref().expect("running").placement.tasks;
        let mut chosen: Vec<usize> = Vec::new();
        let mut placed = None;
        let mut next_try = 1usize;
        let walk = self.free.mark();
        for (pos, &i) in ranked.iter().enumerate() {
            let v = &st.jobs[&cands[i].2];
            if !on_eligible(v) {
                continue;
            }
            let run = v.run.as_ref().expect("running");
            for tp in &run.placement.tasks {
                self.free.give(&st.topo, tp);
            }
            if let Some(b) = fut_book.as_mut() {
                b.charge(shape, t, &st.placement_qvec(&v.spec, &run.placement), true);
            }
            chosen.push(i);
            if chosen.len() > budget as usize + 32 {
                break; // pruning removes at most 32: the rate limit could not be met
            }
            let last = pos + 1 == ranked.len();
            if self.free.free_in(classes) < need || (chosen.len() < next_try && !last) || !quota_ok(&fut_book) {
                continue;
            }
            if let Some(p) = self.place_on(&self.free, spec, tasks, classes, None) {
                placed = Some(p);
                break;
            }
            // Probe placement at doubling victim counts: each attempt can cost a scan of racks.
            next_try = chosen.len() * 2;
        }
        if placed.is_none() {
            // A one-task job needs its GPUs on one node, and the cheapest victims anywhere may be spread over many:
            // the fewest victims on one node instead, if it has them.
            if tasks != 1 || spec.task.gpus < 2 || quota_blocked || pending_evictions {
                return None;
            }
            // The node is chosen by the sum of its victims' lost work, and two nodes' sums may cross where no two
            // candidates do (a review found it): what it finds may change at any moment.
            self.turns_at(self.now);
            // The victims tried are taken back first: what one node has free is then the pass's again.
            self.free.rollback(&st.topo, walk);
            let picked = self.one_node_victims(&cands, &cand_nodes, spec.task.gpus, classes, budget)?;
            for &i in &picked {
                tasks_of(i).iter().for_each(|tp| self.free.give(&st.topo, tp));
            }
            placed = Some(self.place_on(&self.free, spec, tasks, classes, None)?);
            chosen = picked;
        }
        // Drop victims that turn out not to be needed, most expensive first (at most 32 tries).
        let mut i = chosen.len();
        let floor = chosen.len().saturating_sub(32);
        while i > floor {
            i -= 1;
            let id = cands[chosen[i]].2;
            let vj = &st.jobs[&id];
            let tasks_v = &vj.run.as_ref().expect("running").placement.tasks;
            let vq = st.placement_qvec(&vj.spec, &vj.run.as_ref().expect("running").placement);
            for tp in tasks_v {
                self.free.take(&st.topo, tp);
            }
            if let Some(b) = fut_book.as_mut() {
                b.charge(shape, t, &vq, false);
            }
            let fits = if quota_ok(&fut_book) { self.place_on(&self.free, spec, tasks, classes, None) } else { None };
            if let Some(p) = fits {
                placed = Some(p);
                chosen.remove(i);
            } else {
                for tp in tasks_v {
                    self.free.give(&st.topo, tp);
                }
                if let Some(b) = fut_book.as_mut() {
                    b.charge(shape, t, &vq, true);
                }
            }
        }
        if chosen.len() as u32 > budget {
            return None;
        }
        let p = placed.expect("checked above");
        let later = Self::later_on(&self.free, &p);
        let mut victims = Vec::new();
        for i in chosen {
            let (_, _, id, mut reason) = cands[i].clone();
            if let PreemptReason::ShorterJob { victim_s, .. } = &mut reason {
                if *victim_s == UNRANKED {
                    // Made a candidate by a bound under its rank (`visit!`): its key as a search that ranked it has it.
                    let &(part, at) = st.run_row_of.get(&id).expect("a candidate runs");
                    let r = &st.run_rows[part][at];
                    let dist = r.learned.expect("ranked by a Gittins rank");
                    *victim_s = scale(gittins_rank(r, dist, attained(r, now)), r.gpus) / 1000;
                    self.unranked_chosen += 1;
                }
            }
            self.preempted.insert(id);
            self.stats.preempted += 1;
            victims.push(id);
            self.decisions.push(Decision::Preempt { job: id, reason, for_job: job.id });
        }
        self.decisions.push(Decision::Reserve { job: job.id, at: self.now, placement: p.clone() });
        Some((victims, p, later))
    }
}

/// A shorter-first candidate's `victim_s` before its rank is worked out: made a candidate by a bound under its
/// Gittins rank, it gets it once chosen (`Pass::search_victims`). No key in seconds reaches it (`u64::MAX / 1000`
/// at most).
const UNRANKED: u64 = u64::MAX;

/// A running job's service (ms): the progress it kept and this attempt's run.
#[inline]
fn attained(r: &crate::state::RunRow, now: Time) -> u64 {
    r.progress.saturating_add(now.since(r.started).0)
}

/// A running job's Gittins rank (ms) at `at` of service (its kept progress and this attempt's run), ranked from how
/// far it is known to run (`Job::rank_from`), as a victim search ranks it.
#[inline]
fn gittins_rank(r: &crate::state::RunRow, dist: crate::gittins::LogNormal, at: u64) -> u64 {
    crate::job::rank_from_known(r.known, at, |k| dist.rank(crate::units::Dur(k)).0)
}

/// What a quota-held victim search's candidates depend on besides the pass's victims (`Pass::search_victims`): the
/// tenant, the job's priority, its LAS queue (`usize::MAX` where no job can be demoted past it), the class mask of its
/// eligible classes (all below 64) and its shorter-first key (`u64::MAX` without).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HeldKey {
    tenant: TenantId,
    priority: i32,
    queue: usize,
    class_mask: u64,
    shorter: u64,
}

/// The candidates a quota-held victim search found (kept by the pass, `Pass::held_cands`), with the count of victims
/// chosen in the pass when it was made, the time from which time alone may change what it finds, and whether it
/// left rows out (`victim_scan_limit`).
pub(super) struct HeldCands {
    key: HeldKey,
    preempted: usize,
    cands: Vec<(u64, u32, JobId, PreemptReason)>,
    nodes: Vec<Option<crate::ids::NodeId>>,
    lost: Vec<crate::state::LostWork>,
    turn: Time,
    truncated: bool,
    /// Once a search with these candidates has ranked them: the eviction budget then, and the most GPUs that budget
    /// of them frees among the candidates its walk can reach (`budget + 33` cheapest).
    reach: Option<(u32, u64)>,
}

/// The most whole GPUs that evicting at most `budget` of the candidates can free: the sum of the largest GPU counts.
/// (A candidate frees no more whole GPUs than its placement holds; a MIG slice holds none.)
fn most_gpus_freed(cands: impl ExactSizeIterator<Item = u32>, budget: u32) -> u64 {
    let budget = budget as usize;
    if cands.len() <= budget {
        return cands.map(|g| g as u64).sum();
    }
    let mut gpus: Vec<u32> = cands.collect();
    gpus.select_nth_unstable_by(budget - 1, |a, b| b.cmp(a));
    gpus[..budget].iter().map(|&g| g as u64).sum()
}

/// Whether a running job is no victim for any job (not preemptible, being evicted already), for this one (on none of
/// its classes, `class_mask`), or is the job itself: what a victim search checks first, on a row or on its brief.
#[inline(always)]
fn no_candidate(preemptible: bool, evicting: bool, classes: u64, class_mask: u64, itself: bool) -> bool {
    !preemptible || evicting || classes & class_mask == 0 || itself
}

/// Under LAS, a running job that had attained `before` GPU-ms when it started at `started`, on `gpus` GPUs, at `now`:
/// `Ok` with its queue when that is past `my_queue` (the waiting job's), else `Err` with the time at which it will be
/// (attained service only grows: once it reaches the threshold that ends `my_queue`; `Time::MAX`: never).
#[inline(always)]
fn las_past(
    cfg: &crate::config::SchedConfig,
    before: u64,
    started: Time,
    gpus: u32,
    now: Time,
    my_queue: usize,
) -> Result<usize, Time> {
    let vq = cfg.las_queue(before + now.since(started).0 * gpus as u64);
    if vq > my_queue {
        return Ok(vq);
    }
    match (cfg.las_thresholds_gpu_s.get(my_queue), gpus > 0) {
        (Some(&thr_s), true) => {
            let short = thr_s.saturating_mul(1000).saturating_sub(before);
            Err(started + crate::units::Dur(short.div_ceil(gpus as u64)))
        }
        _ => Err(Time::MAX),
    }
}

/// Where a victim search that looks at only part of the `total` running rows starts: a mix of the waiting job and the
/// pass's time, so that the same state searched again gives the same window and a search at another time another.
fn scan_start(job: JobId, now: Time, total: usize) -> usize {
    use std::hash::Hasher;
    let mut h = crate::fxhash::FxHasher::default();
    h.write_u64(job.0);
    h.write_u64(now.0);
    // The high bits of an Fx hash are the mixed ones.
    ((h.finish() >> 32) % total as u64) as usize
}

/// When a running job's key under preemptive SRTF (`g` = 1) or SRGF (`g` = its GPUs) first moves across the caller's
/// shorter-first `bound` as time passes from `now`, where `longer` says whether it is at or above it now and `per_g`
/// is `⌈bound / g⌉` (the caller divides, once per GPU count): the key is the remaining estimated time (times `g`), `est_end − t` before the estimated end and as long again as it has
/// run (`t − started`, at least 1 ms) from then on ([`crate::ClusterState::expected_end`]). Falling before the end,
/// it crosses below the bound once `(est_end − t)·g < bound`; it jumps at the end; rising after it, it reaches the
/// bound at `started + ⌈bound / g⌉`. `Time::MAX`: never. The time returned may be earlier than the crossing, never
/// later.
#[inline]
pub(super) fn shorter_turns_at(est_end: Time, started: Time, now: Time, per_g: u64, longer: bool) -> Time {
    let rising_at = || Time(started.0.saturating_add(per_g.max(1)));
    if est_end > now {
        if longer {
            // (est_end − t)·g ≥ bound holds up to t = est_end − ⌈bound / g⌉; then, or at the end, it may turn.
            let last = est_end.0.saturating_sub(per_g);
            Time(last.saturating_add(1)).min(est_end)
        } else {
            // Below the bound while it falls; at the end it jumps, then rises.
            est_end.max(rising_at())
        }
    } else if longer {
        Time::MAX
    } else {
        rising_at()
    }
}

#[cfg(test)]
mod tests;
