//! Victim search: which running jobs to evict so that a job can start (quota reclaim from borrowers, priority, LAS
//! demotion, a much shorter job under preemptive SJF/SRTF; fewest lost GPU-time, then fewest jobs, within the preemption rate limit), evictions already under way
//! counted first, each freed GPU for one waiting job only (`Pass::promised`); and the jobs that evictions were made
//! for, which go first in the next passes so that the victims do not take their room back.

use super::{Decision, Pass, Res};
use crate::config::Policy;
use crate::ids::{JobId, TenantId};
use crate::job::Job;
use crate::quota::{job_qvec, QuotaBook};
use crate::units::Time;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

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
}

/// What a victim search found: the victims, the head's placement once they are gone, and the free CPU and memory
/// then on its nodes.
type Found = (Vec<JobId>, crate::job::Placement, Vec<(crate::ids::NodeId, crate::units::MilliCpu, crate::units::MiB)>);

impl Pass<'_> {
    /// Jobs that evictions were made for go first, so the victims do not take their resources back. Each starts if
    /// its room is free; otherwise what it will use is kept off-limits for the others. Returns the jobs served.
    pub(super) fn serve_preemptors(&mut self) -> HashSet<JobId> {
        let st = self.st;
        let mut served: HashSet<JobId> = HashSet::new();
        for &jid in &st.preempting_for {
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
                    }
                    self.note(jid, |p| {
                        p.capacity_reason(spec, &classes, Some(p.now), st.evicting.iter().copied().collect())
                    });
                }
            }
        }
        served
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

    /// For a one-task job needing `gpus` GPUs: candidates (`cands`, on the nodes `nodes`) on one eligible node that
    /// free enough of it, cheapest first, within `budget`. The node is the one needing the fewest victims (then the
    /// cheapest); only victims running on that node alone count. Returned as indexes into `cands`, cheapest first.
    fn one_node_victims(
        &self,
        cands: &[(u64, u32, JobId, PreemptReason)],
        nodes: &[Option<crate::ids::NodeId>],
        gpus: u32,
        classes: &[u32],
        budget: u32,
    ) -> Option<Vec<usize>> {
        let st = self.st;
        let key = |i: usize| (cands[i].0, cands[i].1, cands[i].2);
        // Candidates grouped by node, each group cheapest first.
        let mut idx: Vec<(crate::ids::NodeId, usize)> =
            nodes.iter().enumerate().filter_map(|(i, n)| n.map(|n| (n, i))).collect();
        idx.sort_unstable_by_key(|&(n, i)| (n, key(i)));
        let mut best: Option<(usize, u64, Vec<usize>)> = None;
        for group in idx.chunk_by(|a, b| a.0 == b.0) {
            let n = group[0].0;
            let f = &self.free.nodes[n.index()];
            if !f.schedulable || !classes.contains(&st.topo.nodes[n.index()].class) {
                continue;
            }
            let free = f.mask.count_ones();
            let (mut got, mut cost, mut take) = (free, 0u64, Vec::new());
            for &(_, i) in group {
                if got >= gpus || take.len() > budget as usize {
                    break;
                }
                got += cands[i].1;
                cost = cost.saturating_add(cands[i].0);
                take.push(i);
            }
            if got < gpus || take.is_empty() || take.len() > budget as usize {
                continue;
            }
            if best.as_ref().is_none_or(|b| (take.len(), cost) < (b.0, b.1)) {
                best = Some((take.len(), cost, take));
            }
        }
        best.map(|(_, _, take)| take)
    }

    /// Whether a one-task job of `gpus` GPUs could find them free on one eligible node of the pass's pool as it
    /// stands (evictions under way given back) once at most `budget` of the candidates (`cands` on `nodes`, `None`
    /// for a job on several nodes) are evicted, counting GPUs only: a necessary condition for
    /// [`Self::find_victims`] to succeed.
    fn one_node_room_possible(
        &mut self,
        cands: &[(u64, u32, JobId, PreemptReason)],
        nodes: &[Option<crate::ids::NodeId>],
        gpus: u32,
        classes: &[u32],
        budget: u32,
    ) -> bool {
        let st = self.st;
        // A node free enough already (its search may still fail on CPU, memory or a holdback): possible.
        for &c in classes {
            if self.free.classes.get(c as usize).is_some_and(|cf| cf.largest() >= gpus) {
                return true;
            }
        }
        // GPUs each candidate frees per node.
        let mut per: Vec<(crate::ids::NodeId, std::cmp::Reverse<u32>)> = Vec::with_capacity(cands.len());
        for (c, n) in cands.iter().zip(nodes) {
            match n {
                Some(n) => per.push((*n, std::cmp::Reverse(c.1))),
                None => {
                    let run = st.jobs[&c.2].run.as_ref().expect("candidate runs");
                    for tp in &run.placement.tasks {
                        per.push((tp.node, std::cmp::Reverse(tp.gpu_mask.count_ones())));
                    }
                }
            }
        }
        let eligible = |n: crate::ids::NodeId| {
            self.free.nodes[n.index()].schedulable && classes.contains(&st.topo.nodes[n.index()].class)
        };
        // Per node, how many candidates and the GPUs they free (`self.node_slot` indexes the nodes met): a node
        // with at most `budget` of them may lose them all, and needs no sorting.
        let mut slot = std::mem::take(&mut self.node_slot);
        slot.resize(self.free.nodes.len(), u32::MAX);
        let mut sums: Vec<(crate::ids::NodeId, u32, u32)> = Vec::new();
        for &(n, g) in &per {
            let i = n.index();
            if slot[i] == u32::MAX {
                slot[i] = sums.len() as u32;
                sums.push((n, 0, 0));
            }
            let e = &mut sums[slot[i] as usize];
            e.1 += 1;
            e.2 += g.0;
        }
        let room = |n: crate::ids::NodeId, freed: u32| self.free.nodes[n.index()].mask.count_ones() + freed >= gpus;
        let possible = if sums.iter().any(|&(n, count, freed)| count <= budget && eligible(n) && room(n, freed)) {
            Some(true)
        } else if sums.iter().all(|&(_, count, _)| count <= budget) {
            Some(false)
        } else {
            // Nodes with more candidates than the budget are left: looked at below.
            per.retain(|(n, _)| sums[slot[n.index()] as usize].1 > budget);
            None
        };
        for (n, ..) in &sums {
            slot[n.index()] = u32::MAX;
        }
        self.node_slot = slot;
        if let Some(p) = possible {
            return p;
        }
        // Nodes with more candidates than the budget: their largest `budget`, largest first within a node.
        per.sort_unstable();
        per.chunk_by(|a, b| a.0 == b.0).any(|group| {
            let n = group[0].0;
            eligible(n) && room(n, group.iter().take(budget as usize).map(|g| g.1 .0).sum::<u32>())
        })
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
        let hold = self.hold_from(&placement, &later);
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
        Some((victims, Res { head: job.id, at: self.now, hold, forbid: Vec::new(), placement: None }))
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
                    // A victim without an estimate is not known to be longer: it is left alone. One with a learned
                    // estimate ranks by its Gittins rank at its attained time; past a given estimate's end a victim is
                    // expected to run about as long again as this attempt has.
                    let left = || match r.learned {
                        Some(dist) if gittins => {
                            let at = r.progress.saturating_add(now.since(r.started).0);
                            crate::job::rank_from_known(r.known, at, |k| dist.rank(crate::units::Dur(k)).0)
                        }
                        _ => crate::ClusterState::expected_end(r.est_end, r.started, now).since(now).0,
                    };
                    let vk = match policy {
                        Policy::Srtf if r.est_end != Time::MAX => left(),
                        Policy::Srgf if r.est_end != Time::MAX => left().saturating_mul(r.gpus.max(1) as u64),
                        Policy::Sjf => r.sjf_key,
                        _ => continue,
                    };
                    let longer = vk != u64::MAX && vk >= bound;
                    if policy != Policy::Sjf {
                        // The victim's key moves with time (SJF's does not): when it first crosses the bound. A key that
                        // saturated (an SRGF key past u64::MAX) is not followed.
                        if vk == u64::MAX || (gittins && r.learned.is_some()) {
                            turn = now;
                        } else {
                            let g = if policy == Policy::Srgf { r.gpus.max(1) as usize } else { 1 };
                            let per_g = per_gpus.get(g).copied().unwrap_or_else(|| bound.div_ceil(g as u64));
                            turn = turn.min(shorter_turns_at(r.est_end, r.started, now, per_g, longer));
                        }
                    }
                    if !longer {
                        continue;
                    }
                    PreemptReason::ShorterJob { victim_s: vk / 1000, waiting_s: my_key / 1000 }
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
            if gives_up && lacking > 0 && !h.cands.is_empty() {
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
                    // Not shorter-first (whose keys are in the row only): the brief settles the rest as `visit!`
                    // would (every row here is the tenant's own: lent, not reclaimable), and the candidate is made
                    // from it.
                    if briefed && !shorter {
                        self.brief_settled += 1;
                        let reason = if by_priority {
                            PreemptReason::Priority { victim: priority, preemptor: spec.priority }
                        } else if let Some(vq) = queue {
                            PreemptReason::LasDemotion { victim_queue: vq, waiting_queue: my_queue }
                        } else {
                            continue;
                        };
                        let lost = crate::state::LostWork {
                            started,
                            last_ckpt: b.last_ckpt,
                            ckpt_interval: b.ckpt_interval,
                            gpus: b.gpus,
                        };
                        candidate!(started, id, b.gpus, b.node, lost, reason);
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
        // Candidates are ranked by the work they would lose, which grows with time at a rate of their GPUs: their
        // order, and so what the search below finds, may change at any moment.
        self.turns_at(self.now);
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
            if lacking > 0 && reach < lacking {
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
            let (_, _, id, reason) = cands[i].clone();
            self.preempted.insert(id);
            self.stats.preempted += 1;
            victims.push(id);
            self.decisions.push(Decision::Preempt { job: id, reason, for_job: job.id });
        }
        self.decisions.push(Decision::Reserve { job: job.id, at: self.now, placement: p.clone() });
        Some((victims, p, later))
    }
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
mod tests {
    use crate::schedule::testkit::*;

    /// LAS with one threshold (100 GPU-s), preemption after 10 s, on one 1-GPU node of tenant `a`.
    fn las_one_gpu() -> ClusterState {
        let c = SchedConfig {
            las_thresholds_gpu_s: vec![100],
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(10), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Las)
        };
        cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"])
    }

    #[test]
    fn las_serves_least_attained_first_and_preempts_demoted_jobs() {
        let mut s = las_one_gpu();
        let mut old = JobSpec::new(t0(), "old", 1, 1);
        old.checkpoint_interval = Some(Dur::from_secs(60));
        submit(&mut s, 1, old, 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "new", 1, 1), 50);
        // At t=60 job 1 has 60 GPU-s: same queue as job 2, no preemption.
        let ds = s.step(Time::from_secs(60)).unwrap();
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{ds:?}");
        // At t=130 job 1 has crossed 100 GPU-s: demoted, preempted for job 2.
        let ds = s.step(Time::from_secs(130)).unwrap();
        assert!(
            ds.iter().any(|d| matches!(
                d,
                Decision::Preempt {
                    job: JobId(1),
                    reason: PreemptReason::LasDemotion { victim_queue: 1, waiting_queue: 0 },
                    ..
                }
            )),
            "{ds:?}"
        );
        let ds = s.step(Time::from_secs(131)).unwrap();
        assert_eq!(started(&ds), vec![2]);
        let j1 = s.job(JobId(1)).unwrap();
        assert_eq!(j1.state, JobState::Preempted);
        assert_eq!(j1.progress, Dur::from_secs(120), "work up to the last checkpoint is kept");
        assert_eq!(j1.attained_gpu_ms, 130_000);
        s.check_invariants().unwrap();
    }

    /// Under LAS a job already in the last queue has no demoted job to evict: its victim search makes no scan of
    /// the running jobs (nor any eviction, as before). One 1-GPU node, thresholds [100 GPU-s]: job 1 runs from 0,
    /// is demoted at 100 s and evicted at 130 s for job 2 (a scan). Job 1 waits with 130 GPU-s, in the last queue;
    /// at 300 s job 2 has 169 GPU-s, in the same queue: nothing is evicted, and no scan is made.
    #[test]
    fn las_makes_no_victim_scan_for_a_job_in_the_last_queue() {
        let mut s = las_one_gpu();
        submit(&mut s, 1, JobSpec::new(t0(), "first", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "second", 1, 1), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1]);
        let scans = |s: &ClusterState, now: Time| {
            let mut p = run_pass(s, now, |_| {});
            (std::mem::take(&mut p.decisions), p.victim_scans)
        };
        let (ds, n) = scans(&s, Time::from_secs(130));
        assert_eq!(n, 1);
        assert!(ds.iter().any(|d| matches!(d, Decision::Preempt { job: JobId(1), .. })), "{ds:?}");
        s.step(Time::from_secs(130)).unwrap();
        assert_eq!(started(&s.step(Time::from_secs(131)).unwrap()), vec![2]);
        assert_eq!(s.job(JobId(1)).unwrap().attained_gpu_ms, 130_000);
        assert_eq!(s.config().las_queue(130_000), 1, "job 1 is in the last queue");
        let (ds, n) = scans(&s, Time::from_secs(300));
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{ds:?}");
        assert_eq!(n, 0, "no scan for a job in the last queue");
        s.check_invariants().unwrap();
    }

    /// The room evictions make is held back from the rest of the pass only as far as the head needs it: of the CPU
    /// free now on its node, what the victims' end does not cover. The victim (4 GPUs, 60 of 64 cores) is evicted for
    /// a head of 8 GPUs and 8 cores; once it is gone 64 cores are free, 56 more than the head needs, so none of the 4
    /// cores free now is held and a CPU-only job behind the head starts in the same pass; a job that needs 5 cores
    /// does not (4 are free). (The victim search works on the pass's pool; the hold is worked out against the pool
    /// as it is before the evictions.)
    #[test]
    fn evictions_hold_back_only_the_cpu_their_victims_do_not_give_back() {
        let c = SchedConfig { backfill: true, ..preempting(Policy::Priority, Dur::from_secs(10)) };
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 8)], &["a"]);
        let mut victim = JobSpec::new(t0(), "victim", 4, 1);
        victim.task.cpu = MilliCpu::cores(60);
        submit(&mut s, 1, victim, 0);
        s.step(Time::ZERO).unwrap();
        let mut head = JobSpec::new(t0(), "head", 8, 1).priority(5);
        head.task.cpu = MilliCpu::cores(8);
        submit(&mut s, 2, head, 50);
        let cpu_job = |cores: u64| {
            let mut j = JobSpec::new(t0(), "cpu", 0, 1).priority(1);
            j.task.cpu = MilliCpu::cores(cores);
            j.task.mem = MiB::gib(1);
            j
        };
        submit(&mut s, 3, cpu_job(1), 51);
        submit(&mut s, 4, cpu_job(5), 52);
        let ds = schedule(&s, Time::from_secs(60));
        assert!(ds.iter().any(|d| matches!(d, Decision::Preempt { job: JobId(1), for_job: JobId(2), .. })), "{ds:?}");
        assert_eq!(started(&ds), vec![3], "{ds:?}");
    }

    #[test]
    fn priority_preemption_minimises_lost_work_and_is_rate_limited() {
        let c = SchedConfig {
            preemption: PreemptionConfig {
                enabled: true,
                min_run_time: Dur::from_secs(10),
                max_per_interval: 1,
                interval: Dur::from_mins(10),
                ..Default::default()
            },
            ..SchedConfig::with_policy(Policy::Priority)
        };
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 4)], &["a"]);
        let mut recent_ck = JobSpec::new(t0(), "ck", 2, 1);
        recent_ck.checkpoint_interval = Some(Dur::from_secs(50));
        submit(&mut s, 1, JobSpec::new(t0(), "no-ck", 2, 1), 0);
        submit(&mut s, 2, recent_ck, 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "urgent", 2, 1).priority(5), 50);
        let ds = schedule(&s, Time::from_secs(60));
        // Job 1 would lose 60 s × 2 GPUs; job 2 only 10 s × 2 GPUs since its checkpoint at 50 s.
        assert!(
            ds.iter().any(|d| matches!(
                d,
                Decision::Preempt {
                    job: JobId(2),
                    reason: PreemptReason::Priority { victim: 0, preemptor: 5 },
                    for_job: JobId(3)
                }
            )),
            "{ds:?}"
        );
        assert_eq!(ds.iter().filter(|d| matches!(d, Decision::Preempt { .. })).count(), 1);
        s.apply(&ds[0], Time::from_secs(60)).unwrap();
        s.step(Time::from_secs(61)).unwrap();
        submit(&mut s, 4, JobSpec::new(t0(), "urgent2", 2, 1).priority(5), 62);
        let ds = s.step(Time::from_secs(120)).unwrap();
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "rate limit: 1 per 10 min: {ds:?}");
        let ds = s.step(Time::from_secs(700)).unwrap();
        assert!(ds.iter().any(|d| matches!(d, Decision::Preempt { .. })), "{ds:?}");
    }

    #[test]
    fn evictions_under_way_are_waited_for_not_repeated() {
        let c = preempting(Policy::Priority, Dur::ZERO);
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "a", 1, 1), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "b", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "hi", 1, 1).priority(9), 1);
        let ds = crate::schedule::schedule(&s, Time::from_secs(2));
        let victim = ds.iter().find_map(|d| match d {
            Decision::Preempt { job, .. } => Some(*job),
            _ => None,
        });
        s.begin_eviction(victim.unwrap()).unwrap();
        let ds = crate::schedule::schedule(&s, Time::from_secs(3));
        assert!(ds.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{ds:?}");
    }

    #[test]
    fn min_run_time_holds_while_the_clock_is_young() {
        let c = preempting(Policy::Priority, Dur::from_secs(60));
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "low", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "high", 1, 1).priority(5), 1);
        // now − min_run_time would underflow at t=30: the 30 s old job must still be safe.
        assert!(schedule(&s, Time::from_secs(30)).is_empty());
        assert!(schedule(&s, Time::from_secs(60)).iter().any(|d| matches!(d, Decision::Preempt { .. })));
    }

    /// A tenant without a quota has no guarantee: what it holds is lent by the tenants that have one, and a
    /// tenant within its guarantee takes it back, as from a borrower. Another tenant without a quota cannot.
    #[test]
    fn a_tenant_without_a_quota_gives_back_what_a_guarantee_needs() {
        let c = preempting(Policy::Fifo, Dur::ZERO);
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 2)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(1, 2))).unwrap();
        let b = s.add_tenant(TenantSpec::new("b")).unwrap();
        let c2 = s.add_tenant(TenantSpec::new("c")).unwrap();
        submit(&mut s, 10, JobSpec::new(b, "b1", 1, 1), 0);
        submit(&mut s, 11, JobSpec::new(b, "b2", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        // Another tenant without a quota waits: it has no guarantee to claim.
        submit(&mut s, 20, JobSpec::new(c2, "c", 1, 1), 1);
        assert!(schedule(&s, Time::from_secs(2)).is_empty());
        s.cancel(JobId(20), Time::from_secs(3)).unwrap();
        // The owner of a guarantee of 1 GPU gets one back.
        submit(&mut s, 1, JobSpec::new(a, "owner", 1, 1), 5);
        let ds = schedule(&s, Time::from_secs(10));
        let reclaimed: Vec<_> = ds
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, reason: PreemptReason::QuotaReclaim { owner }, .. } => Some((*job, *owner)),
                _ => None,
            })
            .collect();
        assert_eq!(reclaimed.len(), 1, "{ds:?}");
        assert!(matches!(reclaimed[0], (JobId(10 | 11), o) if o == a), "{ds:?}");
        for d in &ds {
            s.apply(d, Time::from_secs(10)).unwrap();
        }
        assert_eq!(started(&s.step(Time::from_secs(11)).unwrap()), vec![1], "the owner gets the GPU");
        // Within its guarantee now: a second job of the owner (beyond it) takes nothing more.
        submit(&mut s, 2, JobSpec::new(a, "more", 1, 1), 12);
        assert!(schedule(&s, Time::from_secs(13)).iter().all(|d| !matches!(d, Decision::Preempt { .. })));
        s.check_invariants().unwrap();
    }

    #[test]
    fn evicted_borrowers_do_not_take_back_reclaimed_gpus() {
        let c = preempting(Policy::Fifo, Dur::ZERO);
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 2)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(1, 2)).cohort("c")).unwrap();
        let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(1, 2)).cohort("c")).unwrap();
        submit(&mut s, 10, JobSpec::new(b, "b1", 1, 1), 0);
        submit(&mut s, 11, JobSpec::new(b, "b2", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 1, JobSpec::new(a, "owner", 1, 1), 5);
        s.step(Time::from_secs(10)).unwrap(); // evicts one of b's jobs (older submit than the owner's)
        let ds = s.step(Time::from_secs(11)).unwrap();
        assert_eq!(started(&ds), vec![1], "the owner, not the evicted borrower, gets the GPU");
        s.check_invariants().unwrap();
    }

    /// Reclaim for a one-task job: the cheapest borrowed jobs are spread one or two per node, so the cheapest
    /// victims anywhere (within the eviction budget) never free one node; the victims are then chosen on one node —
    /// the fewest that make room there.
    #[test]
    fn a_one_node_job_reclaims_its_guarantee_from_victims_on_one_node() {
        use crate::job::{SelectorOp, SelectorTerm};
        let mut c = preempting(Policy::Fifo, Dur::ZERO);
        c.preemption.max_per_interval = 4;
        let nodes = (0..20).map(|k| node(&format!("n{k}"), GpuModel::T4, 4).label("slot", &k.to_string())).collect();
        let mut s = cluster(c, nodes, &[]);
        let own = s.add_tenant(TenantSpec::new("own").quota(Quota::gpus(4, 4))).unwrap();
        let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(0, 76))).unwrap();
        // Waves of one borrowed 1-GPU job per node, 10 s apart: nodes 0-3 get three (one GPU left free on each),
        // the others four. The cheapest victims are the latest waves: at most two per node among the cheapest 37.
        let mut id = 1;
        for wave in 0..4u64 {
            for k in 0..20 {
                if wave == 3 && k < 4 {
                    continue;
                }
                let mut spec = JobSpec::new(b, "b", 1, 1);
                spec.selector = crate::job::thin_vec![SelectorTerm {
                    key: "slot".into(),
                    op: SelectorOp::In,
                    values: vec![k.to_string()]
                }];
                submit(&mut s, id, spec, wave * 10);
                id += 1;
            }
            s.step(Time::from_secs(wave * 10)).unwrap();
        }
        assert_eq!(s.tenant_usage(b).gpus, 76);
        submit(&mut s, 100, JobSpec::new(own, "mine", 4, 1), 100);
        let ds = schedule(&s, Time::from_secs(100));
        let victims: Vec<JobId> = ds
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, .. } => Some(*job),
                _ => None,
            })
            .collect();
        assert_eq!(victims.len(), 3, "three victims free the node with one GPU left: {ds:?}");
        let on: std::collections::BTreeSet<_> =
            victims.iter().map(|v| s.job(*v).unwrap().run.as_ref().unwrap().placement.tasks[0].node).collect();
        assert_eq!(on.len(), 1, "all on one node: {ds:?}");
        for d in &ds {
            s.apply(d, Time::from_secs(100)).unwrap();
        }
        assert_eq!(started(&s.step(Time::from_secs(101)).unwrap()), vec![100]);
        s.check_invariants().unwrap();
    }

    /// A job its own quota holds waits, without a victim search, while its tenant's lower-priority jobs are younger
    /// than the minimum run time; past it, one of them makes room.
    #[test]
    fn a_quota_held_job_evicts_its_own_lower_priority_job_only_past_its_minimum_run_time() {
        let c = preempting(Policy::Priority, Dur::from_secs(60));
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("vc").quota(Quota::gpus(2, 2))).unwrap();
        submit(&mut s, 1, JobSpec::new(t, "low", 2, 1).priority(1), 0);
        s.step(Time::from_secs(10)).unwrap();
        // Started at 10 s: younger than 60 s until 70 s.
        assert!(!s.runs_older_lower_priority(t, 2, Time::from_secs(9)));
        assert!(s.runs_older_lower_priority(t, 2, Time::from_secs(10)));
        assert!(!s.runs_older_lower_priority(t, 1, Time::from_secs(10)), "same priority is no victim");
        submit(&mut s, 2, JobSpec::new(t, "high", 2, 1).priority(5), 20);
        let preempted = |ds: &[Decision]| ds.iter().filter(|d| matches!(d, Decision::Preempt { .. })).count();
        assert_eq!(preempted(&schedule(&s, Time::from_secs(30))), 0, "too young to evict");
        let ds = schedule(&s, Time::from_secs(70));
        assert_eq!(preempted(&ds), 1, "{ds:?}");
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_tenant_at_its_quota_preempts_its_own_lower_priority_or_demoted_jobs() {
        let c = preempting(Policy::Priority, Dur::from_secs(10));
        // Plenty of GPUs, but the tenant may hold 2.
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("vc").quota(Quota::gpus(2, 2))).unwrap();
        let other = s.add_tenant(TenantSpec::new("other").quota(Quota::gpus(2, 2))).unwrap();
        submit(&mut s, 1, JobSpec::new(t, "low", 2, 1), 0);
        submit(&mut s, 2, JobSpec::new(other, "theirs", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t, "high", 2, 1).priority(5), 20);
        let ds = schedule(&s, Time::from_secs(30));
        assert_eq!(
            ds.iter()
                .filter_map(|d| match d {
                    Decision::Preempt { job, .. } => Some(*job),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            vec![JobId(1)],
            "only the tenant's own lower-priority job: {ds:?}"
        );
        for d in &ds {
            s.apply(d, Time::from_secs(30)).unwrap();
        }
        assert_eq!(started(&s.step(Time::from_secs(31)).unwrap()), vec![3]);
        s.check_invariants().unwrap();

        // LAS: a demoted job of the same tenant makes room under the tenant's quota.
        let c = SchedConfig {
            las_thresholds_gpu_s: vec![100],
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::from_secs(10), ..Default::default() },
            ..SchedConfig::with_policy(Policy::Las)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("vc").quota(Quota::gpus(1, 1))).unwrap();
        submit(&mut s, 1, JobSpec::new(t, "old", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t, "new", 1, 1), 50);
        assert!(schedule(&s, Time::from_secs(60)).is_empty(), "not yet demoted");
        let ds = schedule(&s, Time::from_secs(150));
        assert!(
            ds.iter().any(|d| matches!(
                d,
                Decision::Preempt { job: JobId(1), reason: PreemptReason::LasDemotion { .. }, .. }
            )),
            "{ds:?}"
        );
    }

    fn preemptive(policy: Policy, min_run: u64) -> SchedConfig {
        SchedConfig {
            preemption: PreemptionConfig {
                enabled: true,
                min_run_time: Dur::from_secs(min_run),
                shorter_first: true,
                ..Default::default()
            },
            ..SchedConfig::with_policy(policy)
        }
    }

    fn preempts(ds: &[Decision]) -> Vec<(u64, PreemptReason)> {
        ds.iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, reason, .. } => Some((job.0, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// Hand-computed: job 1 (estimate 1,000 s, checkpoints every 100 s) runs from 0. At 360 s it has 640 s left;
    /// job 2 (200 s) waits: 640 ≥ 2 × 200, so job 1 is evicted, keeping 300 s, and job 2 runs 360–560. A job of
    /// 400 s (640 < 800) would not have evicted it; nor would job 2 with preemptive mode off, nor before the
    /// minimum run time.
    #[test]
    fn preemptive_srtf_evicts_a_job_with_twice_the_remaining_time() {
        let long = || {
            let mut j = JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(1000));
            j.checkpoint_interval = Some(Dur::from_secs(100));
            j
        };
        let at = Time::from_secs(360);
        // Off: plain SRTF never preempts.
        let mut c = preemptive(Policy::Srtf, 60);
        c.preemption.shorter_first = false;
        let mut off = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut off, 1, long(), 0);
        off.step(Time::ZERO).unwrap();
        submit(&mut off, 2, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(200)), 350);
        assert!(preempts(&schedule(&off, at)).is_empty());
        // Minimum run time of 600 s: too young at 360 s.
        let mut young = cluster(preemptive(Policy::Srtf, 600), vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut young, 1, long(), 0);
        young.step(Time::ZERO).unwrap();
        submit(&mut young, 2, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(200)), 350);
        assert!(preempts(&schedule(&young, at)).is_empty());
        // Not short enough: 400 s × 2 > 640 s.
        let mut s = cluster(preemptive(Policy::Srtf, 60), vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, long(), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "mid", 1, 1).estimate(Dur::from_secs(400)), 340);
        assert!(preempts(&schedule(&s, at)).is_empty());
        // Short enough.
        submit(&mut s, 2, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(200)), 350);
        let ds = s.step(at).unwrap();
        assert_eq!(preempts(&ds), vec![(1, PreemptReason::ShorterJob { victim_s: 640, waiting_s: 200 })]);
        let j1 = s.job(JobId(1)).unwrap();
        assert_eq!((j1.state, j1.progress), (JobState::Preempted, Dur::from_secs(300)));
        assert_eq!(started(&s.step(at).unwrap()), vec![2]);
        s.finish(JobId(2), Time::from_secs(560), true).unwrap();
        // Job 1 now has 700 s left, job 3 400 s: SRTF order starts job 3 first.
        assert_eq!(s.job(JobId(1)).unwrap().remaining_estimate(), Dur::from_secs(700));
        assert_eq!(started(&s.step(Time::from_secs(560)).unwrap()), vec![3]);
        s.check_invariants().unwrap();
    }

    /// A job evicted after it ran past its estimate is queued again ranked from how far it is known to run, not as
    /// short as it started. Job 1 (estimated 100 s, no checkpoint) has run 400 s when job 2 (100 s) comes: as long
    /// again as it has run, 400 s ≥ 2 × 100 s, so it is evicted and keeps nothing. It is known to run at least
    /// 400 s: as long again from there, plus the 400 s to do again, 800 s. At 700 s job 2 has run 300 s (its victim
    /// rank): 300 s < 2 × 800 s, so job 1 waits. Ranked at its kept progress alone (100 s, as before), it evicted job 2
    /// (300 ≥ 200), which evicted it in turn once it had run 200 s, and so on with nothing ever kept.
    #[test]
    fn an_evicted_job_that_overran_its_estimate_ranks_from_how_far_it_ran() {
        let mut s = cluster(preemptive(Policy::Srtf, 60), vec![node("n", GpuModel::T4, 1)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "overran", 1, 1).estimate(Dur::from_secs(100)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "newcomer", 1, 1).estimate(Dur::from_secs(100)), 390);
        let at = Time::from_secs(400);
        let ds = s.step(at).unwrap();
        assert_eq!(preempts(&ds), vec![(1, PreemptReason::ShorterJob { victim_s: 400, waiting_s: 100 })]);
        let j1 = s.job(JobId(1)).unwrap();
        assert_eq!((j1.state, j1.progress, j1.known), (JobState::Preempted, Dur::ZERO, Dur::from_secs(400)));
        assert_eq!(j1.remaining_estimate(), Dur::from_secs(800));
        assert_eq!(started(&s.step(at).unwrap()), vec![2]);
        assert!(preempts(&schedule(&s, Time::from_secs(700))).is_empty(), "800 s does not evict 300 s");
        // Job 2 ends at 900 s; job 1 starts again, expected to end 800 s later.
        s.finish(JobId(2), Time::from_secs(900), true).unwrap();
        assert_eq!(started(&s.step(Time::from_secs(900)).unwrap()), vec![1]);
        s.check_invariants().unwrap();
    }

    /// A running job with a learned estimate is ranked as a victim by its Gittins rank at its attained time. Job 1
    /// was learned as 3,600 s with a log-spread of 1; at 360 s it has attained a tenth of its median, where the
    /// log-normal's rank is 1.342 × 3,600 s = 4,831 s (the Gittins rank: it may well be one of its class's long runs).
    /// Job 2, given as 1,800 s, waits: 4,831 ≥ 2 × 1,800, so job 1 is evicted. Ranked by its median as if exact, job
    /// 1 has 3,240 s left, less than 2 × 1,800: it is not.
    #[test]
    fn preemptive_srtf_ranks_a_learned_victim_by_its_gittins_rank() {
        for (rank, evicted) in [(crate::LearnedRank::Gittins, true), (crate::LearnedRank::Median, false)] {
            let c = SchedConfig { learned_rank: rank, ..preemptive(Policy::Srtf, 60) };
            let mut s = cluster(c, vec![node("n", GpuModel::T4, 1)], &["a"]);
            let mut learned = JobSpec::new(t0(), "learned", 1, 1).estimate(Dur::from_secs(3600));
            learned.estimate_spread = Some(1.0);
            submit(&mut s, 1, learned, 0);
            s.step(Time::ZERO).unwrap();
            submit(&mut s, 2, JobSpec::new(t0(), "given", 1, 1).estimate(Dur::from_secs(1800)), 300);
            let got = preempts(&schedule(&s, Time::from_secs(360)));
            if evicted {
                let [(1, PreemptReason::ShorterJob { victim_s, waiting_s: 1800 })] = got[..] else { panic!("{got:?}") };
                assert!((4_800..=4_860).contains(&victim_s), "{victim_s}");
            } else {
                assert!(got.is_empty(), "{got:?}");
            }
        }
    }

    /// Preemptive SJF compares the SJF key (estimate ÷ GPUs): a running 2-GPU job of 1,000 s has key 500 s; a
    /// 2-GPU job of 600 s (key 300 > 500 ÷ 2) does not evict it, one of 500 s (key 250) does. A running job without estimate
    /// is never a victim for being long.
    #[test]
    fn preemptive_sjf_compares_estimate_per_gpu_and_spares_jobs_without_estimate() {
        let mut s = cluster(preemptive(Policy::Sjf, 0), vec![node("n", GpuModel::T4, 3)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "wide", 2, 1).estimate(Dur::from_secs(1000)), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "unknown", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "x", 2, 1).estimate(Dur::from_secs(600)), 10);
        assert!(preempts(&schedule(&s, Time::from_secs(20))).is_empty(), "key 300 > 500 / 2");
        let mut s = cluster(preemptive(Policy::Sjf, 0), vec![node("n", GpuModel::T4, 3)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "wide", 2, 1).estimate(Dur::from_secs(1000)), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "unknown", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "x", 2, 1).estimate(Dur::from_secs(500)), 10);
        let ds = schedule(&s, Time::from_secs(20));
        assert_eq!(preempts(&ds), vec![(1, PreemptReason::ShorterJob { victim_s: 500, waiting_s: 250 })]);
    }

    /// SRGF orders and preempts by remaining GPU-time: a running 4-GPU job with 100 s left (400 GPU-s) is evicted for
    /// a waiting 4-GPU job of 50 s (200 GPU-s), where SRTF compares 100 s with 50 s alike; but a waiting 1-GPU job of
    /// 300 s (300 GPU-s) goes before a 4-GPU job of 100 s (400 GPU-s), which SRTF orders the other way.
    #[test]
    fn srgf_orders_and_preempts_by_remaining_gpu_time() {
        let mut s = cluster(cfg(Policy::Srgf), vec![node("n", GpuModel::T4, 4)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "fill", 4, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "wide", 4, 1).estimate(Dur::from_secs(100)), 1);
        submit(&mut s, 3, JobSpec::new(t0(), "narrow", 1, 1).estimate(Dur::from_secs(300)), 2);
        assert_eq!(queue_order(&s, Time::from_secs(3), 10), vec![JobId(3), JobId(2)]);
        let mut t = cluster(cfg(Policy::Srtf), vec![node("n", GpuModel::T4, 4)], &["a"]);
        submit(&mut t, 2, JobSpec::new(t0(), "wide", 4, 1).estimate(Dur::from_secs(100)), 1);
        submit(&mut t, 3, JobSpec::new(t0(), "narrow", 1, 1).estimate(Dur::from_secs(300)), 2);
        assert_eq!(queue_order(&t, Time::from_secs(3), 10), vec![JobId(2), JobId(3)]);

        let mut s = cluster(preemptive(Policy::Srgf, 0), vec![node("n", GpuModel::T4, 4)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "running", 4, 1).estimate(Dur::from_secs(110)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "short", 4, 1).estimate(Dur::from_secs(50)), 5);
        let ds = schedule(&s, Time::from_secs(10));
        assert_eq!(preempts(&ds), vec![(1, PreemptReason::ShorterJob { victim_s: 400, waiting_s: 200 })]);
    }

    /// The pass's decisions and how many victim searches the one-node check gave up on, with or without it.
    fn pass_with(s: &ClusterState, now: Time, precheck: bool) -> (Vec<Decision>, usize) {
        let mut p = run_pass(s, now, |p| p.room_precheck = precheck);
        (std::mem::take(&mut p.decisions), p.prechecked)
    }

    /// Evictions under way are counted once: the room they free goes to the job they were made for, then what is
    /// left to the others. Preemptive SRTF, two 8-GPU nodes, each running a long 8-GPU job (1,000 s) from 0. At 10 s
    /// a short 8-GPU job (10 s) evicts one of them; the eviction is still under way when another short 8-GPU job
    /// waits at 12 s. Its room cannot be the room being freed (all 8 GPUs go to the first short job): it evicts the
    /// other long job. With 4-GPU short jobs instead, the second fits in what the first leaves of the freed node: it
    /// waits for that, and nothing more is evicted.
    #[test]
    fn two_jobs_do_not_wait_for_the_same_room_being_freed() {
        let run = |short_gpus: u32| {
            let nodes = vec![node("n0", GpuModel::A100_80GB, 8), node("n1", GpuModel::A100_80GB, 8)];
            second_short_job_while_the_first_evicts(nodes, |name, secs| {
                JobSpec::new(t0(), name, if name == "long" { 8 } else { short_gpus }, 1).estimate(Dur::from_secs(secs))
            })
        };
        let (victim, ds) = run(8);
        let other = if victim == JobId(1) { 2 } else { 1 };
        assert_eq!(
            preempts(&ds),
            vec![(other, PreemptReason::ShorterJob { victim_s: 988, waiting_s: 10 })],
            "the second short job evicts the other long job: {ds:?}"
        );
        assert!(ds.iter().any(|d| matches!(d, Decision::Preempt { for_job: JobId(4), .. })), "{ds:?}");
        let (_, ds) = run(4);
        assert!(preempts(&ds).is_empty(), "the second 4-GPU job waits for the rest of the freed node: {ds:?}");
    }

    /// Preemptive SRTF on `nodes`: long jobs 1 and 2 (1,000 s, `spec("long", 1000)`) start at 0; short job 3
    /// (`spec("short", 10)`) evicts one of them at 10 s, and that eviction begins (its job has not stopped yet);
    /// short job 4 comes at 11 s. Returns the victim and the decisions of the pass at 12 s.
    fn second_short_job_while_the_first_evicts(
        nodes: Vec<NodeSpec>,
        spec: impl Fn(&str, u64) -> JobSpec,
    ) -> (JobId, Vec<Decision>) {
        use crate::lifecycle::StopCause;
        let mut c = preemptive(Policy::Srtf, 0);
        c.preemption.max_per_interval = 100;
        let mut s = cluster(c, nodes, &["a"]);
        submit(&mut s, 1, spec("long", 1000), 0);
        submit(&mut s, 2, spec("long", 1000), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1, 2]);
        submit(&mut s, 3, spec("short", 10), 10);
        let ds = schedule(&s, Time::from_secs(10));
        let first = preempts(&ds);
        assert_eq!(first.len(), 1, "{ds:?}");
        let victim = JobId(first[0].0);
        s.request_stop(victim, StopCause::Preempted { for_job: Some(JobId(3)) }, Time::from_secs(10)).unwrap();
        s.note_preemption_for(JobId(3));
        submit(&mut s, 4, spec("short", 10), 11);
        let ds = schedule(&s, Time::from_secs(12));
        s.check_invariants().unwrap();
        (victim, ds)
    }

    /// MIG slots are promised as GPUs are. One A100 split into two MIG slices, each running a long MIG job (1,000 s)
    /// from 0; a short MIG job (10 s) evicts one at 10 s, and while that eviction is under way a second short MIG
    /// job waits at 12 s: the slice being freed is the first's, so the second evicts the other long job.
    #[test]
    fn a_mig_slice_being_freed_is_promised_too() {
        let mut n = node("mig", GpuModel::A100_80GB, 1);
        n.gpus[0].mig = vec!["3g.40gb".parse().unwrap(), "3g.40gb".parse().unwrap()];
        let (victim, ds) = second_short_job_while_the_first_evicts(vec![n], |name, secs| {
            let mut j = JobSpec::new(t0(), name, 0, 1).estimate(Dur::from_secs(secs));
            j.task.mig = Some("3g.40gb".parse().unwrap());
            j
        });
        let other = if victim == JobId(1) { 2 } else { 1 };
        assert_eq!(preempts(&ds).iter().map(|p| p.0).collect::<Vec<_>>(), vec![other], "{ds:?}");
        assert!(ds.iter().any(|d| matches!(d, Decision::Preempt { for_job: JobId(4), .. })), "{ds:?}");
    }

    /// A job its own quota holds neither makes nor counts promises: its wait is for its quota as much as for room.
    /// Two 8-GPU nodes; tenant a may hold 4 GPUs, b 16. Job 1 (a, 4 GPUs) and job 2 (b, 4 GPUs, priority 9) run on
    /// n0. Job 3 (a, priority 5) is held by a's quota and evicts job 1, whose stop is under way at 110 s when jobs 4
    /// and 5 (a, priority 5, also quota-held) and job 6 (b, 8 GPUs) wait. Jobs 4 and 5 wait for job 1's room, as job
    /// 3 does, and claim nothing: job 6 starts at once on n1. (Had job 5 counted a promise of job 1's room to job 4,
    /// it would have found room on n1 and claimed half of it: job 6 would have waited.)
    #[test]
    fn a_quota_held_job_makes_and_counts_no_promise() {
        use crate::lifecycle::StopCause;
        let c = preempting(Policy::Priority, Dur::ZERO);
        let mut s = cluster(c, vec![node("n0", GpuModel::A100_80GB, 8), node("n1", GpuModel::A100_80GB, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(4, 4))).unwrap();
        let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(16, 16))).unwrap();
        submit(&mut s, 1, JobSpec::new(a, "low", 4, 1), 0);
        submit(&mut s, 2, JobSpec::new(b, "theirs", 4, 1).priority(9), 1);
        s.step(Time::ZERO).unwrap();
        s.step(Time::from_secs(1)).unwrap();
        let on = |s: &ClusterState, id: u64| s.job(JobId(id)).unwrap().run.as_ref().unwrap().placement.tasks[0].node;
        assert_eq!(on(&s, 1), on(&s, 2), "both on one node");
        submit(&mut s, 3, JobSpec::new(a, "high", 4, 1).priority(5), 100);
        let ds = schedule(&s, Time::from_secs(100));
        assert_eq!(preempts(&ds).iter().map(|p| p.0).collect::<Vec<_>>(), vec![1], "{ds:?}");
        s.request_stop(JobId(1), StopCause::Preempted { for_job: Some(JobId(3)) }, Time::from_secs(100)).unwrap();
        s.note_preemption_for(JobId(3));
        submit(&mut s, 4, JobSpec::new(a, "high", 4, 1).priority(5), 110);
        submit(&mut s, 5, JobSpec::new(a, "high", 4, 1).priority(5), 110);
        submit(&mut s, 6, JobSpec::new(b, "wide", 8, 1).priority(1), 110);
        let ds = schedule(&s, Time::from_secs(110));
        assert_eq!(started(&ds), vec![6], "{ds:?}");
        assert!(preempts(&ds).is_empty(), "{ds:?}");
    }

    /// By hand: two 4-GPU nodes, each running a long 2-GPU job (a candidate: 10,000 s left) and a short one (100 s
    /// left, not 8× longer than anything). A 4-GPU job of 1,000 s waits: evicting both long jobs frees 2 GPUs on
    /// each node, never 4 on one, so the search gives up before ranking candidates, as the full search would.
    /// A 2-GPU job of 500 s (ahead of it: shorter) has room on a long job's node once that job goes: that search
    /// is made and evicts one long job.
    #[test]
    fn a_victim_search_gives_up_when_no_node_can_hold_the_job() {
        let mut c = preemptive(Policy::Srtf, 60);
        c.preemption.shorter_ratio = 8;
        c.backfill = true;
        let ns = vec![node("n0", GpuModel::T4, 4), node("n1", GpuModel::T4, 4)];
        let mut s = cluster(c, ns, &["a"]);
        // One at a time: each long job, then a short one beside it (the fullest node that fits).
        for (id, name, secs) in [(1, "long", 10_500), (3, "short", 600), (2, "long", 10_500), (4, "short", 600)] {
            submit(&mut s, id, JobSpec::new(t0(), name, 2, 1).estimate(Dur::from_secs(secs)), 0);
            assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![id]);
        }
        let on = |id: u64| s.job(JobId(id)).unwrap().run.as_ref().unwrap().placement.tasks[0].node;
        assert_ne!(on(1), on(2), "the long jobs share no node");
        submit(&mut s, 5, JobSpec::new(t0(), "wide", 4, 1).estimate(Dur::from_secs(1000)), 400);
        let now = Time::from_secs(500);
        let (fast, gave_up) = pass_with(&s, now, true);
        let (slow, _) = pass_with(&s, now, false);
        assert_eq!(fast, slow);
        assert!(preempts(&fast).is_empty(), "{fast:?}");
        assert_eq!(gave_up, 1);
        submit(&mut s, 6, JobSpec::new(t0(), "narrow", 2, 1).estimate(Dur::from_secs(500)), 450);
        let (fast, _) = pass_with(&s, now, true);
        assert_eq!(fast, pass_with(&s, now, false).0);
        let victims: Vec<u64> = preempts(&fast).into_iter().map(|(j, _)| j).collect();
        assert!(victims == [1] || victims == [2], "{fast:?}");
    }

    /// Over `victim_scan_limit`, a search looks at a window of that many running jobs, from a place drawn from the
    /// waiting job and the time. Four 1-GPU nodes run four jobs; only job 3 has a lower priority than the waiting job
    /// 9. With a limit of 1 the window is one job: a pass evicts job 3 when its window holds it and decides nothing
    /// otherwise, and such a pass is idle only at its own time (a later pass looks elsewhere). Over 40 passes, one a
    /// second, both happen; with a limit of 4 every pass evicts job 3.
    #[test]
    fn a_victim_search_over_its_limit_looks_at_a_window_that_moves() {
        let build = |limit: u32| {
            let mut c = preempting(Policy::Priority, Dur::ZERO);
            c.preemption.victim_scan_limit = limit;
            let ns = (0..4).map(|i| node(&format!("n{i}"), GpuModel::T4, 1)).collect();
            let mut s = cluster(c, ns, &["a"]);
            for id in 1..=4u64 {
                submit(&mut s, id, JobSpec::new(t0(), "run", 1, 1).priority(if id == 3 { 0 } else { 1 }), 0);
            }
            assert_eq!(started(&s.step(Time::ZERO).unwrap()).len(), 4);
            submit(&mut s, 9, JobSpec::new(t0(), "urgent", 1, 1).priority(1), 5);
            s
        };
        let (narrow, wide) = (build(1), build(4));
        let (mut evicted, mut idle) = (0, 0);
        for k in 10..50u64 {
            let now = Time::from_secs(k);
            assert_eq!(preempts(&schedule(&wide, now)), vec![(3, PreemptReason::Priority { victim: 0, preemptor: 1 })]);
            let (ds, stats) = schedule_with_stats(&narrow, now);
            match preempts(&ds).as_slice() {
                [] => {
                    assert!(ds.is_empty(), "{ds:?}");
                    assert_eq!(stats.idle_until, now, "what the window left out may be a victim at any time");
                    idle += 1;
                }
                [(3, _)] => evicted += 1,
                other => panic!("at {now}: {other:?}"),
            }
        }
        assert!(evicted >= 3 && idle >= 3, "{evicted} passes evicted, {idle} found nothing");
    }

    /// Held by its own quota, a job looks at its tenant's jobs lowest priority and oldest first until it has found
    /// `victim_scan_limit` candidates; jobs that are none do not count. The tenant (3 GPUs) runs job 1 (from 0 s, not
    /// preemptible), job 2 (from 100 s) and job 3 (from 900 s), all of priority 0 and never checkpointed. Job 3
    /// loses less work (100 s against 900 s at 1,000 s), and a search of all evicts it; with a limit of 1 the search
    /// passes job 1, which is no candidate, and stops at job 2, the oldest candidate, which it evicts.
    #[test]
    fn a_quota_held_search_over_its_limit_looks_at_the_oldest_lowest_priority_candidates() {
        let build = |limit: u32| {
            let mut c = preempting(Policy::Priority, Dur::ZERO);
            c.preemption.victim_scan_limit = limit;
            let mut s = cluster(c, vec![node("n", GpuModel::T4, 8)], &[]);
            let t = s.add_tenant(TenantSpec::new("vc").quota(Quota::gpus(3, 3))).unwrap();
            let mut pinned = JobSpec::new(t, "pinned", 1, 1);
            pinned.preemptible = false;
            for (id, spec, at) in
                [(1, pinned, 0), (2, JobSpec::new(t, "old", 1, 1), 100), (3, JobSpec::new(t, "young", 1, 1), 900)]
            {
                submit(&mut s, id, spec, at);
                assert_eq!(started(&s.step(Time::from_secs(at)).unwrap()), vec![id]);
            }
            submit(&mut s, 4, JobSpec::new(t, "urgent", 1, 1).priority(1), 950);
            s
        };
        let victims = |s: &ClusterState| preempts(&schedule(s, Time::from_secs(1000)));
        let reason = PreemptReason::Priority { victim: 0, preemptor: 1 };
        assert_eq!(victims(&build(3)), vec![(3, reason.clone())]);
        assert_eq!(victims(&build(1)), vec![(2, reason)]);
    }

    /// A gang of two 4-GPU tasks waits on two 4-GPU nodes, each running four 1-GPU jobs far longer than it: it lacks
    /// 8 GPUs. With a budget of 7 evictions no choice of victims frees them, and the search gives up before ranking
    /// any (deciding as the full search does: nothing); with a budget of 8 it evicts all eight.
    #[test]
    fn a_victim_search_gives_up_when_its_budget_cannot_free_the_gpus_the_job_lacks() {
        let build = |budget: u32| {
            let mut c = preemptive(Policy::Srtf, 60);
            c.preemption.max_per_interval = budget;
            let mut s = cluster(c, vec![node("n0", GpuModel::T4, 4), node("n1", GpuModel::T4, 4)], &["a"]);
            for id in 1..=8 {
                submit(&mut s, id, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(100_000)), 0);
            }
            assert_eq!(started(&s.step(Time::ZERO).unwrap()).len(), 8);
            submit(&mut s, 9, JobSpec::new(t0(), "gang", 4, 2).estimate(Dur::from_secs(600)), 100);
            s
        };
        gives_up_only_below(build, 7, 8);
    }

    /// The pass at 200 s on `build(budget)`: with a budget of `short` evictions its one victim search gives up and
    /// decides as the full search (nothing); with `enough` it gives up on none and evicts that many.
    fn gives_up_only_below(build: impl Fn(u32) -> ClusterState, short: u32, enough: u32) {
        let now = Time::from_secs(200);
        let s = build(short);
        let (fast, gave_up) = pass_with(&s, now, true);
        assert_eq!((fast.clone(), gave_up), (pass_with(&s, now, false).0, 1));
        assert!(preempts(&fast).is_empty(), "{fast:?}");
        let s = build(enough);
        let (fast, gave_up) = pass_with(&s, now, true);
        assert_eq!((preempts(&fast).len(), gave_up), (enough as usize, 0), "{fast:?}");
    }

    /// A job its own quota holds must have its victims give back what its GPU quota lacks, not only the room. Tenant a
    /// (guarantee 4, limit 8 GPUs) runs eight 1-GPU jobs; its 4-GPU job of higher priority waits, with room for it
    /// free on the second node: a's quota lacks 4 GPUs. With a budget of 3 evictions no choice of its jobs gives them
    /// back, and the search gives up before ranking any (deciding as the full search does: nothing); with a budget
    /// of 4 it evicts four.
    #[test]
    fn a_quota_held_search_gives_up_when_its_budget_cannot_give_back_what_the_quota_lacks() {
        let build = |budget: u32| {
            let mut c = preempting(Policy::Priority, Dur::from_secs(60));
            c.preemption.max_per_interval = budget;
            let mut s = cluster(c, vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &[]);
            let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(4, 8))).unwrap();
            for id in 1..=8 {
                submit(&mut s, id, JobSpec::new(a, "low", 1, 1), 0);
            }
            assert_eq!(started(&s.step(Time::ZERO).unwrap()).len(), 8);
            submit(&mut s, 9, JobSpec::new(a, "high", 4, 1).priority(1), 100);
            s
        };
        gives_up_only_below(build, 3, 4);
    }

    /// A quota-held search that takes an earlier one's candidates gives up on that one's ranking when the candidates
    /// its walk can reach could not free what it lacks, and only then. Priority, two evictions allowed; seven 8-GPU
    /// nodes; tenant a (limit 52 GPUs) runs two 8-GPU jobs from 0 and 36 one-GPU jobs from 100 s, all of priority 0,
    /// and is at its limit. At 200 s two jobs of priority 1 wait, both held by a's quota, with the same candidates
    /// (the 38 running jobs): first a gang of two 8-GPU tasks (a's quota lacks 16 GPUs; the two 8-GPU jobs could
    /// free them, but the 35 cheapest candidates, which its walk can reach, are 1-GPU jobs: it gives up after
    /// ranking), then `second`. A second gang gives up on the first one's ranking, without ranking again; a 2-GPU job
    /// does not (two 1-GPU jobs among those 35 give back its quota) and evicts two. Each pass decides as with neither
    /// the shared candidates nor the checks.
    #[test]
    fn a_search_with_an_earlier_ones_candidates_gives_up_on_its_ranking_only_when_it_must() {
        let run = |second: JobSpec| {
            let mut c = preempting(Policy::Priority, Dur::from_secs(60));
            c.preemption.max_per_interval = 2;
            let ns = (0..7).map(|i| node(&format!("n{i}"), GpuModel::T4, 8)).collect();
            let mut s = cluster(c, ns, &[]);
            let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(8, 52))).unwrap();
            for id in 1..=2 {
                submit(&mut s, id, JobSpec::new(a, "wide", 8, 1), 0);
            }
            assert_eq!(started(&s.step(Time::ZERO).unwrap()).len(), 2);
            for id in 3..=38 {
                submit(&mut s, id, JobSpec::new(a, "narrow", 1, 1), 100);
            }
            assert_eq!(started(&s.step(Time::from_secs(100)).unwrap()).len(), 36);
            submit(&mut s, 100, JobSpec::new(a, "gang", 8, 2).priority(1), 150);
            let mut second = second;
            second.tenant = a;
            submit(&mut s, 101, second.priority(1), 151);
            let now = Time::from_secs(200);
            let mut fast = run_pass(&s, now, |_| {});
            let slow = run_pass(&s, now, |p| {
                p.held_memo = false;
                p.room_precheck = false;
            });
            assert_eq!(fast.decisions, slow.decisions);
            assert_eq!(fast.held_hits, 1, "the second search takes the first one's candidates");
            (std::mem::take(&mut fast.decisions), fast.reach_hits)
        };
        let (ds, reach_hits) = run(JobSpec::new(t0(), "gang", 8, 2));
        assert_eq!((preempts(&ds).len(), reach_hits), (0, 1), "{ds:?}");
        let (ds, reach_hits) = run(JobSpec::new(t0(), "pair", 2, 1));
        assert_eq!((preempts(&ds).len(), reach_hits), (2, 0), "{ds:?}");
    }

    /// Preemptive SRTF with one eviction allowed: a node of `wide` GPUs runs a long job of as many (job 1), and
    /// `small_nodes` nodes of `small` GPUs run long 1-GPU jobs, all from 0; `waiting` (short) comes at 100 s. The
    /// pass at 200 s decides the same with the checks as without them, and evicts job 1 alone.
    fn only_the_wide_job_is_evicted(wide: usize, small_nodes: usize, small: usize, waiting: JobSpec) {
        let mut c = preemptive(Policy::Srtf, 0);
        c.preemption.max_per_interval = 1;
        let mut ns = vec![node("wide", GpuModel::T4, wide)];
        ns.extend((0..small_nodes).map(|i| node(&format!("small{i}"), GpuModel::T4, small)));
        let mut s = cluster(c, ns, &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "wide", wide as u32, 1).estimate(Dur::from_secs(10_000)), 0);
        let narrow = small_nodes * small;
        for id in 2..2 + narrow as u64 {
            submit(&mut s, id, JobSpec::new(t0(), "narrow", 1, 1).estimate(Dur::from_secs(10_000)), 0);
        }
        assert_eq!(started(&s.step(Time::ZERO).unwrap()).len(), 1 + narrow);
        submit(&mut s, 100, waiting.estimate(Dur::from_secs(100)), 100);
        let now = Time::from_secs(200);
        let (fast, _) = pass_with(&s, now, true);
        assert_eq!(fast, pass_with(&s, now, false).0);
        assert_eq!(preempts(&fast).iter().map(|p| p.0).collect::<Vec<_>>(), vec![1], "{fast:?}");
    }

    /// The give-up after ranking looks at every candidate the walk can reach (the first `budget + 33`), not fewer.
    /// One 8-GPU node runs a long 8-GPU job; six 2-GPU nodes run twelve long 1-GPU jobs. A short gang of two 4-GPU
    /// tasks fits only where the 8-GPU job runs, and that job ranks last of the 13 candidates (it would lose the most
    /// work): the walk reaches it and evicts it alone, with the check as without it.
    #[test]
    fn the_give_up_after_ranking_counts_every_candidate_the_walk_reaches() {
        only_the_wide_job_is_evicted(8, 6, 2, JobSpec::new(t0(), "gang", 4, 2));
    }

    /// The give-up after ranking is not made for a one-task job of 2 GPUs or more that no eviction under way or quota
    /// holds: a search per node follows its failed walk, and that one takes from every candidate, not only those the
    /// walk reaches. Seventeen 2-GPU nodes run 34 long 1-GPU jobs, one 4-GPU node a long 4-GPU job. A short 4-GPU job
    /// waits: the walk reaches the 34 cheapest candidates (the 1-GPU jobs), which free no node, and the search per
    /// node evicts the 4-GPU job alone.
    #[test]
    fn a_search_per_node_after_the_walk_keeps_the_give_up_after_ranking_away() {
        only_the_wide_job_is_evicted(4, 17, 2, JobSpec::new(t0(), "short", 4, 1));
    }

    /// A running job on a node class of 64 or more matches every class mask, but is a candidate only where it runs on
    /// one of the waiting job's classes. 100 one-GPU nodes, each its own class (a label per node): nodes 0–63 in pool
    /// x, nodes 64–99 in pool y. A long job runs on each, pool x's from 0 and pool y's from 50 s (they would lose less
    /// work). One eviction allowed (preemptive SRTF); at 100 s a short job that may run in pool x only waits. The
    /// search ranks the 34 cheapest candidates: were pool y's jobs among them, none would be on the job's classes and
    /// nothing would be evicted. It evicts one job of pool x.
    #[test]
    fn a_job_on_a_class_past_64_is_no_candidate_off_the_waiting_jobs_classes() {
        use crate::job::SelectorTerm;
        let mut c = preemptive(Policy::Srtf, 0);
        c.preemption.max_per_interval = 1;
        let pool = |k: usize| if k < 64 { "x" } else { "y" };
        let ns = (0..100)
            .map(|k| node(&format!("n{k}"), GpuModel::T4, 1).label("slot", &k.to_string()).label("pool", pool(k)));
        let mut s = cluster(c, ns.collect(), &["a"]);
        for k in 0..100usize {
            let mut spec = JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(10_000));
            spec.selector = crate::job::thin_vec![SelectorTerm::eq("slot", &k.to_string())];
            let at = if k < 64 { 0 } else { 50 };
            submit(&mut s, k as u64 + 1, spec, at);
            assert_eq!(started(&s.step(Time::from_secs(at)).unwrap()), vec![k as u64 + 1]);
        }
        let mut short = JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(100));
        short.selector = crate::job::thin_vec![SelectorTerm::eq("pool", "x")];
        submit(&mut s, 200, short, 100);
        let ds = schedule(&s, Time::from_secs(100));
        let victims = preempts(&ds).iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(victims.len(), 1, "{ds:?}");
        assert!(victims[0] <= 64, "a job of pool x: {ds:?}");
    }

    /// A job of the random clusters: a shape of [`SHAPES`], an estimate in seconds, a priority.
    type RandomJob = (usize, u64, i32);

    /// (GPUs per task, tasks) of the random clusters' jobs: the sixth runs on two nodes.
    const SHAPES: [(u32, u32); 6] = [(1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (4, 2)];

    /// The random clusters' running jobs, queued jobs and nodes (8 GPUs or 4).
    fn random_jobs_and_nodes() -> impl proptest::strategy::Strategy<Value = (Vec<RandomJob>, Vec<RandomJob>, Vec<bool>)>
    {
        use proptest::prelude::*;
        (
            proptest::collection::vec((0usize..6, 100u64..100_000, 0i32..3), 1..24),
            proptest::collection::vec((0usize..6, 10u64..20_000, 0i32..3), 1..40),
            proptest::collection::vec(any::<bool>(), 1..5),
        )
    }

    /// A random cluster under `c`: its nodes, its running jobs started at 0, its queued jobs submitted at 100 s.
    fn random_cluster(
        c: SchedConfig,
        (running, queued, big): &(Vec<RandomJob>, Vec<RandomJob>, Vec<bool>),
    ) -> ClusterState {
        let ns = big.iter().enumerate().map(|(i, b)| node(&format!("n{i}"), GpuModel::T4, if *b { 8 } else { 4 }));
        let mut s = cluster(c, ns.collect(), &["a"]);
        for (i, (k, secs, prio)) in running.iter().enumerate() {
            let (g, tasks) = SHAPES[*k];
            let spec = JobSpec::new(t0(), "run", g, tasks).estimate(Dur::from_secs(*secs)).priority(*prio);
            submit(&mut s, i as u64 + 1, spec, 0);
        }
        s.step(Time::ZERO).unwrap();
        for (i, (k, secs, prio)) in queued.iter().enumerate() {
            let (g, tasks) = SHAPES[*k];
            let spec = JobSpec::new(t0(), "wait", g, tasks).estimate(Dur::from_secs(*secs)).priority(*prio);
            submit(&mut s, 1000 + i as u64, spec, 100);
        }
        s
    }

    /// The one-node check changes no decision: random clusters of 4- and 8-GPU nodes running jobs of 1–8 GPUs (some
    /// on two nodes), queues of shorter and longer jobs of 1–8 GPUs, preemptive SRTF, SRGF, SJF, priority and LAS,
    /// with and without backfill, a tight or loose eviction budget; three passes each, some jobs ending between
    /// them. And the check does give up on some searches.
    #[test]
    fn giving_up_on_a_victim_search_decides_the_same() {
        use proptest::prelude::*;
        let policies = [Policy::Srtf, Policy::Srgf, Policy::Sjf, Policy::Priority, Policy::Las];
        let strategy = (random_jobs_and_nodes(), 0usize..policies.len(), any::<bool>(), 1u32..30);
        let mut runner = det_runner(256);
        let (gave_up, preempted) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&strategy, |(jobs, policy, backfill, budget)| {
                let mut c = preemptive(policies[policy], 60);
                c.backfill = backfill;
                c.preemption.max_per_interval = budget;
                let mut s = random_cluster(c, &jobs);
                let mut now = Time::from_secs(600);
                for round in 0..3u64 {
                    let (fast, n) = pass_with(&s, now, true);
                    let (slow, _) = pass_with(&s, now, false);
                    prop_assert_eq!(&fast, &slow);
                    gave_up.set(gave_up.get() + n);
                    preempted.set(preempted.get() + preempts(&fast).len());
                    now = apply_and_end_some(&mut s, &fast, now, round, Dur::from_secs(300));
                }
                Ok(())
            })
            .unwrap();
        assert!(gave_up.get() >= 20, "the check gave up on {} searches", gave_up.get());
        assert!(preempted.get() >= 20, "{} evictions", preempted.get());
    }

    /// A quota-held victim search that takes its candidates from an earlier one of the pass (`HeldCands`), and one
    /// that gives up because the candidates its walk can reach could not free the GPUs the job lacks, decide as the
    /// full searches: random clusters as above (T4 and A100 nodes in turn, queued jobs asking for either model or
    /// taking both) shared by tenant a, whose quota (4–24 GPUs, half guaranteed) holds
    /// many of its queued jobs, and tenant b (8 GPUs guaranteed, 64 at most); preemptive LAS (thresholds 300 and
    /// 3,000 GPU-s), priority, SRTF and SJF; with and without backfill; a tight or loose eviction budget; three
    /// passes each, some jobs ending between them. Each search that takes an earlier one's candidates is one scan
    /// fewer. Searches do take earlier ones' candidates, and quota-held jobs do evict. A pass that reads every row
    /// a quota-held search meets (`held_brief` off) decides the same and turns at the same time as one that leaves
    /// the rows its briefs settle unread (`state::RunBrief`), and the briefs do settle rows and make candidates.
    #[test]
    fn a_quota_held_search_with_an_earlier_ones_candidates_decides_the_same() {
        use proptest::prelude::*;
        let policies = [Policy::Las, Policy::Priority, Policy::Srtf, Policy::Sjf];
        let strategy = (random_jobs_and_nodes(), 0usize..policies.len(), any::<bool>(), 1u32..30, 2u64..12);
        let mut runner = det_runner(256);
        let (hits, held_evictions) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let (settled, made) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&strategy, |((running, queued, big), policy, backfill, budget, half)| {
                let mut c = preemptive(policies[policy], 60);
                c.backfill = backfill;
                c.preemption.max_per_interval = budget;
                c.las_thresholds_gpu_s = vec![300, 3000];
                // Two node classes (T4 and A100 in turn), and queued jobs that ask for one of them or take either.
                let models = [GpuModel::T4, GpuModel::A100_80GB];
                let ns =
                    big.iter().enumerate().map(|(i, b)| node(&format!("n{i}"), models[i % 2], [4, 8][*b as usize]));
                let mut s = cluster(c, ns.collect(), &[]);
                let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(half, 2 * half))).unwrap();
                let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(8, 64))).unwrap();
                // Running jobs of a come first (a may run up to its limit), then b's; two queued jobs in three are a's.
                for (i, (k, secs, prio)) in running.iter().enumerate() {
                    let (g, tasks) = SHAPES[*k];
                    let t = if i % 2 == 0 { a } else { b };
                    submit(
                        &mut s,
                        i as u64 + 1,
                        JobSpec::new(t, "run", g, tasks).estimate(Dur::from_secs(*secs)).priority(*prio),
                        0,
                    );
                }
                s.step(Time::ZERO).unwrap();
                for (i, (k, secs, prio)) in queued.iter().enumerate() {
                    let (g, tasks) = SHAPES[*k];
                    let t = if i % 3 == 2 { b } else { a };
                    let mut spec = JobSpec::new(t, "wait", g, tasks).estimate(Dur::from_secs(*secs)).priority(*prio);
                    if secs % 3 > 0 {
                        spec.gpu_models.push(models[(secs % 3 - 1) as usize]);
                    }
                    submit(&mut s, 1000 + i as u64, spec, 100);
                }
                let mut now = Time::from_secs(600);
                for round in 0..3u64 {
                    let mut fast = run_pass(&s, now, |_| {});
                    let mut slow_pass = run_pass(&s, now, |p| {
                        p.held_memo = false;
                        p.room_precheck = false;
                    });
                    let slow = std::mem::take(&mut slow_pass.decisions);
                    let slow_scans = slow_pass.victim_scans;
                    drop(slow_pass);
                    prop_assert_eq!(&fast.decisions, &slow);
                    // Each search that took an earlier one's candidates is a scan the pass did not make.
                    prop_assert_eq!(fast.victim_scans + fast.held_hits, slow_scans);
                    hits.set(hits.get() + fast.held_hits);
                    // What the rows' briefs settle is what reading the rows settles, to the time at which the pass's
                    // outcome may change.
                    let mut unbriefed = run_pass(&s, now, |p| p.held_brief = false);
                    prop_assert_eq!(&fast.decisions, &unbriefed.decisions);
                    prop_assert_eq!(fast.idle_until.get(), unbriefed.idle_until.get());
                    prop_assert_eq!(unbriefed.brief_settled, 0);
                    unbriefed.decisions.clear();
                    drop(unbriefed);
                    settled.set(settled.get() + fast.brief_settled);
                    made.set(made.get() + fast.brief_cands);
                    let ds = std::mem::take(&mut fast.decisions);
                    drop(fast);
                    // Evictions for a job of a that a's quota holds (it would pass a's limit).
                    let held = |id: &JobId| {
                        let j = s.job(*id).expect("queued");
                        let gpus = j.spec.task.gpus as u64 * j.spec.tasks as u64;
                        j.spec.tenant == a && s.tenant_usage(a).gpus as u64 + gpus > 2 * half
                    };
                    let n =
                        ds.iter().filter(|d| matches!(d, Decision::Preempt { for_job, .. } if held(for_job))).count();
                    held_evictions.set(held_evictions.get() + n);
                    now = apply_and_end_some(&mut s, &ds, now, round, Dur::from_secs(300));
                }
                Ok(())
            })
            .unwrap();
        assert!(hits.get() >= 20, "{} searches took an earlier one's candidates", hits.get());
        assert!(settled.get() >= 200, "the briefs settled {} rows", settled.get());
        assert!(made.get() >= 50, "{} candidates made from briefs", made.get());
        assert!(held_evictions.get() >= 10, "{} evictions for quota-held jobs", held_evictions.get());
    }

    /// A pass that decides nothing decides nothing at any time before its `idle_until` on the same state: random
    /// clusters as above (running jobs past their estimates among them), preemptive SRTF, SRGF, SJF, priority and LAS
    /// (thresholds 300 and 3,000 GPU-s), and FIFO; with and without backfill; minimum run time 60 s; a tight or loose
    /// eviction budget; victim searches looking at 3, 10 or all running jobs (`victim_scan_limit`); the cluster moved
    /// on by 30–900 s between rounds. Each idle pass with a bound is checked at
    /// six times up to it (the last a millisecond before; a bound of `Time::MAX` up to 30 days), and at the bound
    /// some passes do decide: the bounds are not only safe but reached.
    #[test]
    fn an_idle_pass_stays_idle_until_its_bound() {
        use proptest::prelude::*;
        let policies = [Policy::Srtf, Policy::Srgf, Policy::Sjf, Policy::Priority, Policy::Las, Policy::Fifo];
        let strategy =
            (random_jobs_and_nodes(), 0usize..policies.len(), any::<bool>(), 1u32..30, 30u64..900, 0usize..3);
        let mut runner = det_runner(1024);
        let (checked, reached) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let idle = |ds: &[Decision]| ds.iter().all(|d| matches!(d, Decision::Reserve { .. }));
        runner
            .run(&strategy, |(jobs, policy, backfill, budget, step, limit)| {
                let mut c = preemptive(policies[policy], 60);
                c.backfill = backfill;
                c.preemption.max_per_interval = budget;
                c.preemption.victim_scan_limit = [3, 10, u32::MAX][limit];
                c.las_thresholds_gpu_s = vec![300, 3000];
                let mut s = random_cluster(c, &jobs);
                let mut now = Time::from_secs(600);
                for round in 0..4u64 {
                    let (ds, stats) = crate::schedule::schedule_with_stats(&s, now);
                    if idle(&ds) && stats.idle_until > now {
                        checked.set(checked.get() + 1);
                        let end = stats.idle_until.min(now + Dur::from_secs(30 * 86_400));
                        let span = end.0 - now.0;
                        for k in (1..=6u64).filter(|_| span >= 2) {
                            let t = Time(now.0 + (span * k / 6).clamp(1, span - 1));
                            let later = schedule(&s, t);
                            prop_assert!(idle(&later), "{:?} at {} (bound {}): {:?}", policies[policy], t, end, later);
                        }
                        if stats.idle_until != Time::MAX && !idle(&schedule(&s, stats.idle_until)) {
                            reached.set(reached.get() + 1);
                        }
                    }
                    now = apply_and_end_some(&mut s, &ds, now, round, Dur::from_secs(step));
                }
                Ok(())
            })
            .unwrap();
        assert!(checked.get() >= 100, "{} idle passes checked", checked.get());
        assert!(reached.get() >= 10, "{} passes decide at their bound", reached.get());
    }

    /// By hand, the rate limit's window: at most one eviction per 10 minutes, two 1-GPU nodes running long jobs 1
    /// and 2 (10,000 s). Job 3 (100 s) evicts one at t=100 and starts; job 4 (100 s) comes at t=110, and the
    /// budget is spent: the pass decides nothing, and holds so until the eviction leaves the window, a millisecond
    /// after t=700. Then it evicts.
    #[test]
    fn an_idle_pass_held_by_the_rate_limit_holds_until_the_window_frees() {
        let mut c = preemptive(Policy::Srtf, 0);
        c.preemption.max_per_interval = 1;
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 1), node("n1", GpuModel::T4, 1)], &["a"]);
        for id in [1, 2] {
            submit(&mut s, id, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(10_000)), 0);
        }
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(100)), 100);
        let t = Time::from_secs(100);
        assert_eq!(preempts(&s.step(t).unwrap()).len(), 1);
        assert_eq!(started(&s.step(t).unwrap()), vec![3]);
        submit(&mut s, 4, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(100)), 110);
        let (ds, stats) = crate::schedule::schedule_with_stats(&s, Time::from_secs(110));
        assert!(ds.is_empty(), "{ds:?}");
        let bound = Time::from_secs(700) + Dur(1);
        assert_eq!(stats.idle_until, bound);
        assert!(schedule(&s, Time::from_secs(700)).is_empty());
        assert_eq!(preempts(&schedule(&s, bound)).len(), 1);
    }
}
