//! Backfill (EASY): the blocked head's reservation — the earliest estimated time its placement becomes free, from
//! the estimated ends of running jobs and of jobs started in this pass, and the resources it will take then — what
//! that reservation holds back from long jobs, and the jobs tried behind the head: a job starts only if it ends before
//! the reservation or keeps off the reserved resources. The walk stops after `backfill_depth` jobs behind the head
//! that did not start; those that start do not count, so a head that blocks early holds nothing up that fits.

use super::{Decision, Pass, PendingReason};
use crate::alloc::{Free, Hold, Holdback, Request};
use crate::ids::{JobId, NodeId};
use crate::job::{Job, Placement, TaskPlacement, TopologyScope};
use crate::node::labels;
use crate::state::{ClusterState, QueueKey, RunningTasks};
use crate::units::{MiB, MilliCpu, Time};

/// The reservation of the blocked head job.
#[derive(Debug)]
pub(super) struct Res {
    pub(super) head: JobId,
    pub(super) at: Time,
    pub(super) hold: Holdback,
    /// When the reservation time is unknown: classes that backfill jobs may not use at all.
    pub(super) forbid: Vec<u32>,
    pub(super) placement: Option<Placement>,
}

/// A head's reservation as found: when, where, each reserved node's free CPU and memory then, and how many releases
/// it counts.
struct Found {
    at: Time,
    placement: Placement,
    later: Vec<(NodeId, MilliCpu, MiB)>,
    releases: usize,
}

/// Where a placement search meets a node: its model group, free GPUs, class's place among the eligible ones, and
/// place in its bucket.
type MeetOrder = ((u64, usize), u32, u32, usize);

/// Running jobs' releases, earliest estimated end first: the end and the placement freed.
type Releases<'x> = Vec<(Time, &'x [TaskPlacement])>;

/// What the queue key alone says about a job behind the blocked head.
pub(super) enum Behind {
    /// Look at the job.
    Try,
    /// It cannot start now; go on to the next.
    Skip,
    /// No job behind the head may start in this pass.
    Stop,
}

/// Whether a failure to place `spec` in a pass says that every job of its shape fails for the rest of the pass (free
/// resources only shrink): not for an elastic job (tried at several sizes), nor for a gang within one rack, whose
/// search looks only at the 64 racks with the fewest sufficient free GPUs, so that it may fail now and fit once other
/// starts have moved racks out of those 64.
fn memoizable(spec: &crate::job::JobSpec) -> bool {
    spec.elastic.is_none() && !(spec.topology == crate::job::TopologyScope::Rack && spec.tasks > 1)
}

/// Extends `order` to `n` releases, merging running jobs and jobs started in this pass by estimated end; stops at
/// jobs without an estimate.
fn pull_releases<'x>(
    a: &mut std::iter::Peekable<impl Iterator<Item = (&'x (Time, JobId), &'x RunningTasks)>>,
    b: &mut std::iter::Peekable<std::slice::Iter<'x, (Time, JobId, Placement)>>,
    order: &mut Releases<'x>,
    n: usize,
) {
    while order.len() < n {
        let take_a = match (a.peek(), b.peek()) {
            (Some(((ta, ja), _)), Some((tb, jb, _))) => (ta, ja) <= (tb, jb),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return,
        };
        let (end, p) = if take_a {
            let ((end, _), tasks) = a.next().expect("peeked");
            (*end, &tasks[..])
        } else {
            let (end, _, p) = b.next().expect("peeked");
            (*end, &p.tasks[..])
        };
        if end == Time::MAX {
            return;
        }
        order.push((end, p));
    }
}

/// Gives a closure that extends a release order the one lifetime of the releases it pulls.
fn puller<'x, F: FnMut(&mut Releases<'x>, usize)>(f: F) -> F {
    f
}

impl<'a> Pass<'a> {
    /// Behind a blocked head (`tried`: jobs taken from the queue since it blocked that did not start, this one
    /// included): past `backfill_depth` the walk stops; cheap rejections come from the queue key alone (no job lookup). The job
    /// `explain` traces is always tried.
    pub(super) fn behind_head(&self, r: &Res, key: &QueueKey, tried: usize, traced: bool) -> Behind {
        if tried > self.st.cfg.backfill_depth && !traced {
            return Behind::Stop;
        }
        if traced {
            return Behind::Try;
        }
        if key.not_before > self.now {
            self.turns_at(key.not_before);
            return Behind::Skip;
        }
        if key.gpus > self.free.total_gpus {
            if self.free.total_gpus == 0 && self.st.queued_no_gpu == 0 {
                return Behind::Stop; // nothing left that any queued job could use
            }
            return Behind::Skip;
        }
        let long = key.est == u64::MAX || self.now.0.saturating_add(key.est) > r.at.0;
        let probe = (key.shape(), long);
        // Runs of one shape are common in a long queue, and the set only grows within a pass: the last hit stays one.
        if self.failed_hit.get() == Some(probe) {
            return Behind::Skip;
        }
        if self.failed.contains(&probe) {
            self.failed_hit.set(Some(probe));
            return Behind::Skip;
        }
        Behind::Try
    }

    /// Whether the walk would skip every job still in the queue behind the head of reservation `r` without looking
    /// at it (so it may stop here, with the same decisions): each shape of the queue (`ClusterState::queue_shapes`)
    /// needs more GPUs than are free, can never fit, or failed to place in this pass as a job that ends before the
    /// reservation and as one that outlasts it (each only if the shape has such jobs). Free resources only shrink
    /// and failures only grow within a pass, so a shape once skipped stays skipped: the shapes are looked at in
    /// order, each again only when something changed. Never while explaining (that walk goes on to the jobs it
    /// explains).
    ///
    /// A shape that has not failed yet is tried with one of its jobs (as `backfill` would try it, and remembered in
    /// `failed` in the same way) when no tenant has a quota: quota admission comes before the memo in the walk, and a
    /// job the memo skips never reaches it, so with quotas an earlier memo could change which held jobs make room.
    pub(super) fn rest_skipped(&mut self, r: &Res) -> bool {
        if !self.stop_early || self.trace.is_some() || self.noting.is_some() {
            return false;
        }
        let seen = (self.failed.len(), self.never_shapes.len(), self.free.total_gpus);
        if self.skipped_seen == Some(seen) {
            return false;
        }
        let st = self.st;
        let probe = r.at != Time::MAX && st.shape.tenants.iter().all(|(q, _)| q.is_none());
        let now = self.now;
        let long = |est: u64| est == u64::MAX || now.0.saturating_add(est) > r.at.0;
        while let Some(s) = st.queue_shapes.next_after(self.skipped_upto) {
            let skipped = s.gpus > self.free.total_gpus
                || self.never_shapes.contains(&s.shape)
                || ((long(s.min_est) || self.fails(r, &s, false, probe))
                    && (!long(s.max_est) || self.fails(r, &s, true, probe)));
            if !skipped {
                self.skipped_seen = Some((self.failed.len(), self.never_shapes.len(), self.free.total_gpus));
                return false;
            }
            self.skipped_upto = Some(s.shape);
        }
        true
    }

    /// Whether jobs of shape `s` that outlast the reservation (`long`) or end before it fail to place: known from
    /// `failed`, or (`probe`) found by trying one of its jobs and remembered there.
    fn fails(&mut self, r: &Res, s: &crate::park::ShapeSpan, long: bool, probe: bool) -> bool {
        if self.failed.contains(&(s.shape, long)) {
            return true;
        }
        if !probe {
            return false;
        }
        let Some(job) = s.job.and_then(|j| self.st.jobs.get(&j)) else { return false };
        if !memoizable(&job.spec) {
            return false;
        }
        let classes = self.eligible(&job.spec);
        if r.forbid.iter().any(|c| classes.contains(c)) {
            return false;
        }
        if self.try_place(job, &classes, if long { Some(&r.hold) } else { None }).is_some() {
            return false;
        }
        self.failed.insert((s.shape, long));
        true
    }

    /// Tries `job` behind the head's reservation `r` on `classes` (`narrowed`: fewer than its eligible classes,
    /// because of per-model quota; `shape`: its queue-key shape). A job that ends before the reservation may use
    /// anything free; a longer one keeps off what the reservation holds. Returns whether it started.
    pub(super) fn backfill(&mut self, job: &Job, r: &Res, classes: &[u32], narrowed: bool, shape: u64) -> bool {
        let spec = &job.spec;
        let traced = self.trace == Some(job.id);
        if r.forbid.iter().any(|c| classes.contains(c)) && r.at == Time::MAX {
            // No reservation time is known: keep off the head's node classes entirely.
            let allowed: Vec<u32> = classes.iter().copied().filter(|c| !r.forbid.contains(c)).collect();
            if let Some(p) = self.try_place(job, &allowed, None) {
                self.commit_start(job, p, true);
                return true;
            }
            self.note(job.id, |p| PendingReason::Reservation { holder: r.head, until: p.expected_start(r.at) });
            return false;
        }
        let end = ClusterState::est_end(job, self.now);
        let short = end <= r.at;
        let hold = if short { None } else { Some(&r.hold) };
        let memo = memoizable(spec) && !narrowed;
        if let Some(p) = self.try_place(job, classes, hold) {
            self.commit_start(job, p, true);
            return true;
        }
        if memo && !traced {
            self.failed.insert((shape, !short));
        }
        if traced || self.noted(job.id) {
            let reserved = !short && self.try_place(job, classes, None).is_some();
            self.note(job.id, |p| {
                if reserved {
                    PendingReason::Reservation { holder: r.head, until: p.expected_start(r.at) }
                } else {
                    p.capacity_reason(spec, classes, None, Vec::new())
                }
            });
        }
        false
    }

    /// The head's reservation, announced as a [`Decision::Reserve`] when its placement is known.
    pub(super) fn reserve(&mut self, job: &Job, classes: &[u32]) -> Res {
        let r = self.reservation(job, classes);
        if let Some(p) = &r.placement {
            self.decisions.push(Decision::Reserve { job: job.id, at: r.at, placement: p.clone() });
        }
        r
    }

    /// EASY reservation for the head: the earliest count of running jobs' releases, in order of estimated end,
    /// after which it fits, and where.
    ///
    /// A head of one task of whole GPUs fits once one node does: each release's nodes are checked as it comes,
    /// counting what they will have free, and the first release after which one of them can hold the task gives
    /// the count and the node (among several, as a placement search would choose: fastest model, then fewest free
    /// GPUs); nothing else is looked at. Any other head (a gang, an elastic job at several tasks, MIG or CPU-only
    /// tasks): releases are applied to the pass's free pool one at a time, on the head's eligible node classes only
    /// (the only ones a placement search for it reads), up to the first count at which the eligible nodes of one
    /// group the gang may not leave (model group unless models may mix, zone unless it may span zones; for a gang
    /// within one rack, all of them together) could hold its tasks counting whole GPUs only; placement is tried
    /// there, then at doubling counts beyond, and the earliest fitting count is found by binary search. Every
    /// release is undone exactly (the pass's pool logs its changes: [`Free::rollback`]), the order of nodes in the
    /// pool's buckets included.
    ///
    /// Then the nodes that get resources back before the head starts go to the back of their buckets, the earliest
    /// freed last: the jobs placed behind the head take nodes that stay busy first and leave the room that is about
    /// to open as it is (test `backfill_puts_jobs_on_nodes_that_stay_busy`).
    fn reservation(&mut self, job: &Job, classes: &[u32]) -> Res {
        let st: &'a ClusterState = self.st;
        let spec = &job.spec;
        let tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let mut started: Vec<(Time, JobId, Placement)> = std::mem::take(&mut self.started);
        started.sort_by_key(|(t, j, _)| (*t, *j));
        // The release order, pulled lazily: running jobs and those started in this pass, by estimated end.
        let mut order: Releases = Vec::with_capacity(64);
        let preempted = self.preempted.clone();
        let mut a = st.running_by_end.iter().filter(|((_, j), _)| !preempted.contains(j)).peekable();
        let mut b = started.iter().peekable();
        let topo = &st.topo;
        let mut free = std::mem::take(&mut self.free);
        let req =
            Request { spec, tasks, classes, hold: None, per_node: spec.selector.iter().any(|s| s.key == labels::RACK) };
        let g = spec.task.gpus;
        let counted = g > 0 && spec.task.mig.is_none();
        // Each eligible class's position in `classes` (the order placement searches look at them); `u32::MAX`:
        // not eligible.
        let mut class_pos = vec![u32::MAX; topo.classes.len()];
        for (i, &c) in classes.iter().enumerate() {
            class_pos[c as usize] = i as u32;
        }
        let mut pull = puller(|order, n| pull_releases(&mut a, &mut b, order, n));
        let result = if counted && tasks == 1 && self.one_node_res {
            self.reservation_one_node(&free, &req, &class_pos, &mut order, &mut pull)
        } else {
            self.reservation_by_placement(&mut free, &req, &class_pos, &mut order, &mut pull)
        };
        self.stats.reservation_releases += order.len();
        if let Some(hi) = result.as_ref().map(|f| f.releases) {
            // Nodes freed before the head starts to the back, the earliest freed last.
            let mut slot = std::mem::take(&mut self.node_slot);
            slot.resize(free.nodes.len(), u32::MAX);
            let mut soon: Vec<NodeId> = Vec::new();
            for (_, q) in &order[..hi] {
                for t in q.iter() {
                    if slot[t.node.index()] == u32::MAX {
                        slot[t.node.index()] = 0;
                        soon.push(t.node);
                    }
                }
            }
            soon.reverse();
            free.send_to_back(topo, &soon);
            for id in &soon {
                slot[id.index()] = u32::MAX;
            }
            self.node_slot = slot;
        }
        drop(order);
        self.free = free;
        self.started = started;
        match result {
            None => Res {
                head: job.id,
                at: Time::MAX,
                hold: Holdback::default(),
                forbid: classes.to_vec(),
                placement: None,
            },
            Some(Found { at, placement, later, .. }) => {
                let hold = self.hold_from(&placement, &later);
                Res { head: job.id, at, hold, forbid: Vec::new(), placement: Some(placement) }
            }
        }
    }

    /// The reservation of a head of one task of whole GPUs ([`Self::reservation`]): each release's nodes checked as
    /// it comes, with what they will have free then; the first release after which one can hold the task gives the
    /// count and the node. `free` is not changed. `pull(order, n)` extends the release order to `n`.
    fn reservation_one_node<'x>(
        &mut self,
        free: &Free,
        req: &Request<'_>,
        class_pos: &[u32],
        order: &mut Releases<'x>,
        pull: &mut dyn FnMut(&mut Releases<'x>, usize),
    ) -> Option<Found> {
        let st = self.st;
        let topo = &st.topo;
        let spec = req.spec;
        let specs = Some(&st.node_specs[..]);
        let horizon = st.cfg.reservation_horizon;
        let mut found = free.place(topo, req, specs).map(|p| (0usize, p, Vec::new()));
        // What each node touched by a release will have free: (mask, CPU, memory) by `self.node_slot`.
        let mut slot = std::mem::take(&mut self.node_slot);
        slot.resize(free.nodes.len(), u32::MAX);
        let mut touched: Vec<(NodeId, u64, MilliCpu, MiB)> = Vec::new();
        // The nodes of one release, each with the index of its last task there.
        let mut here: Vec<(NodeId, usize)> = Vec::new();
        let model_key =
            |id: NodeId| crate::alloc::model_group(spec, topo.classes[topo.nodes[id.index()].class as usize].model);
        let mut n = 0usize;
        while found.is_none() && n < horizon {
            pull(order, n + 1);
            if order.len() <= n {
                break;
            }
            // All of the release's tasks first (a gang may run several on one node), then each node it touched
            // once, in the order a placement search would meet them: model group, free GPUs, class, then the order
            // the release's gives leave them in within a bucket (by each node's last task).
            here.clear();
            for (k, t) in order[n].1.iter().enumerate() {
                let i = t.node.index();
                if slot[i] == u32::MAX {
                    slot[i] = touched.len() as u32;
                    let f = &free.nodes[i];
                    touched.push((t.node, f.mask, f.cpu, f.mem));
                }
                let e = &mut touched[slot[i] as usize];
                e.1 |= t.gpu_mask;
                e.2 += t.cpu;
                e.3 += t.mem;
                match here.iter_mut().find(|(id, _)| *id == t.node) {
                    Some(h) => h.1 = k,
                    None => here.push((t.node, k)),
                }
            }
            let mut best: Option<(MeetOrder, TaskPlacement)> = None;
            for &(id, last) in &here {
                let pos = class_pos[topo.nodes[id.index()].class as usize];
                if pos == u32::MAX {
                    continue;
                }
                let (_, mask, cpu, mem) = touched[slot[id.index()] as usize];
                if let Some(tp) = free.fit_one_at(topo, req, id, (mask, cpu, mem), specs) {
                    let key = (model_key(id), mask.count_ones(), pos, last);
                    if best.as_ref().is_none_or(|(b, _)| key < *b) {
                        best = Some((key, tp));
                    }
                }
            }
            n += 1;
            if let Some((_, tp)) = best {
                let (_, _, cpu, mem) = touched[slot[tp.node.index()] as usize];
                let node = tp.node;
                found = Some((n, Placement { tasks: vec![tp] }, vec![(node, cpu, mem)]));
            }
        }
        let result = found.map(|(hi, p, later)| {
            let at = if hi == 0 { self.now } else { order[hi - 1].0.max(self.now) };
            let later = if hi == 0 {
                p.tasks
                    .iter()
                    .map(|t| (t.node, free.nodes[t.node.index()].cpu, free.nodes[t.node.index()].mem))
                    .collect()
            } else {
                later
            };
            Found { at, placement: p, later, releases: hi }
        });
        for (id, ..) in &touched {
            slot[id.index()] = u32::MAX;
        }
        self.node_slot = slot;
        result
    }

    /// The reservation of a head other than one task of whole GPUs ([`Self::reservation`]): releases applied to
    /// `free` on the eligible classes up to the first count at which the eligible nodes of one group the tasks may
    /// not leave could hold them counting whole GPUs (or, for MIG and CPU-only tasks, at which enough GPUs are
    /// free), placement tried there and at doubling counts beyond, the earliest fitting count found by binary
    /// search; every release undone exactly. `pull(order, n)` extends the release order to `n`.
    fn reservation_by_placement<'x>(
        &self,
        free: &mut Free,
        req: &Request<'_>,
        class_pos: &[u32],
        order: &mut Releases<'x>,
        pull: &mut dyn FnMut(&mut Releases<'x>, usize),
    ) -> Option<Found> {
        let st = self.st;
        let topo = &st.topo;
        let spec = req.spec;
        let tasks = req.tasks;
        let need = spec.task.gpus as u64 * tasks as u64;
        let g = spec.task.gpus as u64;
        let counted = g > 0 && spec.task.mig.is_none();
        let fits = |free: &Free| -> Option<Placement> { free.place(topo, req, Some(&st.node_specs)) };
        // Releases currently given back, and for each the pool's log mark before it was, for the exact undo.
        let mut applied = 0usize;
        let mut undo: Vec<usize> = Vec::new();
        // A placement search reads only the eligible classes' nodes and buckets, so releases are given back on those
        // nodes only: the search finds what it would with every release given back.
        let narrow = self.narrow_res;
        let eligible = |t: &TaskPlacement| !narrow || class_pos[topo.nodes[t.node.index()].class as usize] != u32::MAX;
        let set_to = |free: &mut Free,
                      applied: &mut usize,
                      undo: &mut Vec<usize>,
                      order: &[(Time, &[TaskPlacement])],
                      n: usize| {
            let n = n.min(order.len());
            while *applied < n {
                undo.push(free.mark());
                for t in order[*applied].1.iter().filter(|t| eligible(t)) {
                    free.give(topo, t);
                }
                *applied += 1;
            }
            while *applied > n {
                *applied -= 1;
                free.rollback(topo, undo.pop().expect("one mark per release given"));
            }
        };
        // Tasks of whole GPUs the eligible nodes of each group a placement may not leave (model group unless models
        // may mix; zone unless the gang may span zones) could hold, counting free GPUs only, kept up to date
        // release by release: `Free::place` cannot succeed while every group is short of the tasks. Not for a gang
        // within one rack: its search looks at 64 racks only, so its success need not grow with the count, and the
        // probes, which start at the first count that may fit, must meet the counts they always met (room counted
        // over all eligible nodes at once).
        let across_zones = tasks > 1 && spec.topology == TopologyScope::Any;
        let grouped = narrow && !(tasks > 1 && spec.topology == TopologyScope::Rack);
        let mut groups: Vec<((u64, usize), u32)> = Vec::new();
        let mut class_group = vec![u32::MAX; topo.classes.len()];
        for &c in req.classes {
            let info = &topo.classes[c as usize];
            let model = crate::alloc::model_group(spec, info.model);
            let key = if grouped { (model, if across_zones { u32::MAX } else { info.zone }) } else { ((0, 0), 0) };
            let i = groups.iter().position(|k| *k == key).unwrap_or_else(|| {
                groups.push(key);
                groups.len() - 1
            });
            class_group[c as usize] = i as u32;
        }
        let mut cap = vec![0u64; groups.len()];
        if counted {
            for &c in req.classes {
                for (f, bucket) in free.classes[c as usize].buckets().iter().enumerate().skip(g as usize) {
                    cap[class_group[c as usize] as usize] += (f as u64 / g) * bucket.len() as u64;
                }
            }
        }
        let mut enough = cap.iter().any(|&c| c >= tasks as u64);
        let short = |free: &Free, enough: bool| if counted { !enough } else { free.free_in(req.classes) < need };
        // The first count that may fit: releases given back one at a time.
        let mut n = 0usize;
        let horizon = st.cfg.reservation_horizon;
        while short(free, enough) {
            if n >= horizon {
                break;
            }
            pull(order, n + 1);
            if order.len() <= n {
                break;
            }
            undo.push(free.mark());
            for t in order[n].1.iter().filter(|t| eligible(t)) {
                let i = t.node.index();
                let group = class_group[topo.nodes[i].class as usize];
                let counts = counted && free.nodes[i].schedulable && group != u32::MAX;
                let before = free.nodes[i].mask.count_ones() as u64;
                free.give(topo, t);
                if counts {
                    let after = free.nodes[i].mask.count_ones() as u64;
                    let c = &mut cap[group as usize];
                    *c += after / g - before / g;
                    enough |= *c >= tasks as u64;
                }
            }
            applied += 1;
            n += 1;
        }
        let mut found: Option<(usize, Placement)> = None;
        // Counts up to `lo` are known not to fit (or, at 0, untested).
        let mut lo = n.saturating_sub(1);
        if !short(free, enough) && n <= horizon {
            let mut step = 1usize;
            let mut attempts = 0;
            loop {
                attempts += 1;
                pull(order, n);
                n = n.min(order.len());
                set_to(free, &mut applied, &mut undo, order, n);
                if let Some(p) = fits(free) {
                    found = Some((n, p));
                    break;
                }
                lo = n;
                pull(order, (n + 1).min(horizon));
                if n >= order.len() || attempts > 40 {
                    break;
                }
                n = (n + step).min(horizon);
                step *= 2;
            }
        }
        let result = found.map(|(mut hi, mut p)| {
            // Earliest fitting count in (lo, hi].
            let mut lo = lo;
            while hi > lo + 1 {
                let mid = lo + (hi - lo) / 2;
                set_to(free, &mut applied, &mut undo, order, mid);
                match fits(free) {
                    Some(q) => {
                        hi = mid;
                        p = q;
                    }
                    None => lo = mid,
                }
            }
            set_to(free, &mut applied, &mut undo, order, hi);
            let at = if hi == 0 { self.now } else { order[hi - 1].0.max(self.now) };
            // Free CPU/memory later on the reserved nodes, before undoing the releases.
            let later = Self::later_on(free, &p);
            Found { at, placement: p, later, releases: hi }
        });
        set_to(free, &mut applied, &mut undo, order, 0);
        debug_assert!(undo.is_empty());
        result
    }

    /// Holds for a future placement given each node's free CPU and memory at that time: long jobs may use
    /// min(free now, free later − needed) and the rest of what is free now is held back.
    pub(super) fn hold_from(&self, p: &Placement, later: &[(NodeId, MilliCpu, MiB)]) -> Holdback {
        let mut hold = Holdback::default();
        for t in &p.tasks {
            let h: &mut Hold = hold.entry(t.node).or_default();
            h.gpus |= t.gpu_mask;
            h.cpu += t.cpu;
            h.mem += t.mem;
            if let Some(s) = t.mig_slot {
                h.mig |= 1 << s;
            }
        }
        for (node, h) in hold.iter_mut() {
            let now_free = &self.free.nodes[node.index()];
            let (_, lcpu, lmem) = later.iter().find(|(n, _, _)| n == node).copied().expect("every node of p");
            let spare_cpu = lcpu - h.cpu;
            let spare_mem = lmem - h.mem;
            h.cpu = now_free.cpu - spare_cpu.min(now_free.cpu);
            h.mem = now_free.mem - spare_mem.min(now_free.mem);
        }
        hold
    }

    /// The free CPU and memory on the pool `fut` of each node of the head's future placement `p`, for
    /// [`Self::hold_from`] on the pass's pool as it is now: what long backfill jobs may not take there is its GPUs,
    /// and CPU/memory beyond what is left over then.
    pub(super) fn later_on(fut: &Free, p: &Placement) -> Vec<(NodeId, MilliCpu, MiB)> {
        p.tasks.iter().map(|t| (t.node, fut.nodes[t.node.index()].cpu, fut.nodes[t.node.index()].mem)).collect()
    }

    /// Takes the currently free part of a reservation's resources out of this pass's free pool, so that no later
    /// job of the pass uses them.
    pub(super) fn claim(&mut self, hold: &Holdback) {
        let st = self.st;
        let mut holds: Vec<_> = hold.iter().collect();
        holds.sort_by_key(|(n, _)| **n);
        for (n, h) in holds {
            let tp = self.free_part(*n, h.gpus, h.cpu, h.mem);
            self.free.take(&st.topo, &tp);
        }
    }

    /// The part of `gpus`, `cpu` and `mem` on node `n` that is free in this pass's pool.
    pub(super) fn free_part(&self, n: NodeId, gpus: u64, cpu: MilliCpu, mem: MiB) -> TaskPlacement {
        let f = &self.free.nodes[n.index()];
        TaskPlacement { node: n, gpu_mask: gpus & f.mask, mig_slot: None, cpu: cpu.min(f.cpu), mem: mem.min(f.mem) }
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    #[test]
    fn easy_backfill_lets_short_jobs_pass_but_protects_the_head() {
        let c = SchedConfig { backfill: true, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "running", 4, 1).estimate(Dur::from_secs(100)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "head", 8, 1).estimate(Dur::from_secs(50)), 1);
        // Ends before the head's reservation (t=100): may run on the free GPUs.
        submit(&mut s, 3, JobSpec::new(t0(), "short", 2, 1).estimate(Dur::from_secs(60)), 2);
        // Would outlast t=100 on GPUs the head needs: must wait.
        submit(&mut s, 4, JobSpec::new(t0(), "long", 2, 1).estimate(Dur::from_secs(500)), 3);
        let now = Time::from_secs(10);
        let ds = s.step(now).unwrap();
        assert_eq!(started(&ds), vec![3]);
        assert!(ds
            .iter()
            .any(|d| matches!(d, Decision::Reserve { job: JobId(2), at, .. } if *at == Time::from_secs(100))));
        match explain(&s, JobId(4), now).unwrap().reason {
            PendingReason::Reservation { holder, until } => {
                assert_eq!(holder, JobId(2));
                assert_eq!(until, Some(Time::from_secs(100)));
            }
            r => panic!("{r:?}"),
        }
        s.check_invariants().unwrap();
    }

    #[test]
    fn backfill_puts_jobs_on_nodes_that_stay_busy() {
        let c = SchedConfig { backfill: true, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n0", GpuModel::V100_16GB, 4), node("n1", GpuModel::V100_16GB, 4)], &["a"]);
        // n0 runs a job that ends at t=100, n1 one that ends at t=10,000: each node has 2 GPUs free, n0 first in
        // their bucket (it got there first).
        submit(&mut s, 1, JobSpec::new(t0(), "soon", 2, 1).estimate(Dur::from_secs(100)), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "late", 2, 1).estimate(Dur::from_secs(10_000)), 0);
        let on = |node: u32| Placement {
            tasks: vec![TaskPlacement {
                node: NodeId(node),
                gpu_mask: 0b0011,
                mig_slot: None,
                cpu: MilliCpu::cores(2),
                mem: MiB::gib(8),
            }],
        };
        s.start(JobId(1), on(0), false, Time::ZERO).unwrap();
        s.start(JobId(2), on(1), false, Time::ZERO).unwrap();
        // The head needs a whole node: n0 at t=100. A 1-GPU job that ends before then may run on either node; it
        // goes to n1, which stays busy, and leaves n0's two free GPUs to join the two freed at t=100.
        submit(&mut s, 3, JobSpec::new(t0(), "head", 4, 1).estimate(Dur::from_secs(50)), 1);
        submit(&mut s, 4, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(60)), 2);
        let ds = s.step(Time::from_secs(10)).unwrap();
        assert!(ds.iter().any(|d| matches!(d, Decision::Reserve { job: JobId(3), at, placement }
            if *at == Time::from_secs(100) && placement.tasks[0].node == NodeId(0))));
        let p = ds.iter().find_map(|d| match d {
            Decision::Start { job: JobId(4), placement, .. } => Some(placement.clone()),
            _ => None,
        });
        assert_eq!(p.expect("the short job starts").tasks[0].node, NodeId(1), "{ds:?}");
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_one_task_head_is_reserved_on_the_first_node_that_can_hold_it() {
        let c = SchedConfig { backfill: true, ..cfg(Policy::Fifo) };
        let nodes = vec![
            node("n0", GpuModel::V100_16GB, 8),
            node("n1", GpuModel::V100_16GB, 8),
            node("n2", GpuModel::V100_16GB, 8),
        ];
        let mut s = cluster(c, nodes, &["a"]);
        let jobs: [(u64, u32, u64, u64); 6] = [
            (1, 0, 0b0011_0000, 300),
            (2, 0, 0b1100_0000, 900),
            (3, 1, 0b0000_0111, 200),
            (4, 1, 0b0000_1000, 5_000),
            (5, 1, 0b1111_0000, 5_000),
            (6, 2, 0xff, 600),
        ];
        for (id, n, mask, end) in jobs {
            let g = mask.count_ones();
            submit(&mut s, id, JobSpec::new(t0(), "r", g, 1).estimate(Dur::from_secs(end)), 0);
            let p = Placement {
                tasks: vec![TaskPlacement {
                    node: NodeId(n),
                    gpu_mask: mask,
                    mig_slot: None,
                    cpu: MilliCpu::cores(g as u64),
                    mem: MiB::gib(4 * g as u64),
                }],
            };
            s.start(JobId(id), p, false, Time::ZERO).unwrap();
        }
        // A 7-GPU head: n0 has 4 free now, 6 at t=300 and 8 only at t=900; n1 has 3 at t=200 and no more before
        // t=5,000; n2 has 8 at t=600. The first release after which one node can hold it is job 6's.
        submit(&mut s, 7, JobSpec::new(t0(), "head", 7, 1).estimate(Dur::from_secs(10)), 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        let r = ds.iter().find_map(|d| match d {
            Decision::Reserve { job: JobId(7), at, placement } => Some((*at, placement.clone())),
            _ => None,
        });
        let (at, p) = r.expect("the head is reserved");
        assert_eq!((at, p.tasks[0].node), (Time::from_secs(600), NodeId(2)));
        assert_eq!(p.tasks[0].gpu_mask.count_ones(), 7);
        // A 6-GPU head fits n0 at t=300 (4 free + 2).
        let mut s2 = s.clone();
        s2.cancel(JobId(7), Time::from_secs(1)).unwrap();
        submit(&mut s2, 8, JobSpec::new(t0(), "head6", 6, 1).estimate(Dur::from_secs(10)), 2);
        let ds = s2.step(Time::from_secs(2)).unwrap();
        assert!(
            ds.iter().any(|d| matches!(d, Decision::Reserve { job: JobId(8), at, placement }
            if *at == Time::from_secs(300) && placement.tasks[0].node == NodeId(0))),
            "{ds:?}"
        );
        s.check_invariants().unwrap();
    }

    #[test]
    fn backfill_may_use_gpus_the_reservation_does_not_need() {
        let c = SchedConfig { backfill: true, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n1", GpuModel::V100_16GB, 8), node("n2", GpuModel::V100_16GB, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "r1", 4, 1).estimate(Dur::from_secs(100)), 0);
        submit(&mut s, 2, JobSpec::new(t0(), "r2", 6, 1).estimate(Dur::from_secs(1000)), 0);
        s.step(Time::ZERO).unwrap();
        // n1: 4 free (r1 ends at 100); n2: 2 free (r2 ends at 1000). The head needs 8 on one node: n1 at t=100.
        submit(&mut s, 3, JobSpec::new(t0(), "head", 8, 1).estimate(Dur::from_secs(10)), 1);
        submit(&mut s, 4, JobSpec::new(t0(), "long", 2, 1).estimate(Dur::from_secs(5000)), 2);
        let ds = s.step(Time::from_secs(5)).unwrap();
        let st = started(&ds);
        assert_eq!(st, vec![4]);
        let p = ds.iter().find_map(|d| match d {
            Decision::Start { job: JobId(4), placement, .. } => Some(placement.clone()),
            _ => None,
        });
        assert_eq!(p.unwrap().tasks[0].node, NodeId(1), "the long job must keep off the reserved node");
    }

    #[test]
    fn backfill_depth_counts_the_jobs_behind_the_head_that_do_not_start() {
        let c = SchedConfig { backfill: true, backfill_depth: 2, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 2)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "head", 4, 1).estimate(Dur::from_secs(10)), 0);
        // The head never fits on 2 GPUs: NeverFits does not block. Use a 2-GPU job running to block a 2-GPU head.
        s.cancel(JobId(1), Time::ZERO).unwrap();
        submit(&mut s, 2, JobSpec::new(t0(), "run", 2, 1).estimate(Dur::from_secs(100)), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "head", 2, 1).estimate(Dur::from_secs(10)), 1);
        for i in 0..3 {
            submit(&mut s, 10 + i, JobSpec::new(t0(), "big", 2, 1).estimate(Dur::from_secs(10)), 2);
        }
        let (_, st) = schedule_with_stats(&s, Time::from_secs(5));
        assert!(st.considered <= 3, "{st:?}");
    }

    #[test]
    fn jobs_that_start_behind_the_head_do_not_count_against_the_depth() {
        // Node a: 2 of its 4 GPUs run a job until t=100; the head wants all 4 (reserved there from t=100). Node b's
        // 8 GPUs are free: the five long 1-GPU jobs behind the head keep off node a and all start, although the depth
        // is 2 (it bounds only the jobs tried in vain).
        let c = SchedConfig { backfill: true, backfill_depth: 2, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("a", GpuModel::T4, 4), node("b", GpuModel::V100_16GB, 8)], &["t"]);
        let mut run = JobSpec::new(t0(), "run", 2, 1).estimate(Dur::from_secs(100));
        run.gpu_models = crate::job::thin_vec![GpuModel::T4];
        submit(&mut s, 1, run, 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1]);
        let mut head = JobSpec::new(t0(), "head", 4, 1).estimate(Dur::from_secs(10));
        head.gpu_models = crate::job::thin_vec![GpuModel::T4];
        submit(&mut s, 2, head, 1);
        for i in 0..5 {
            submit(&mut s, 10 + i, JobSpec::new(t0(), "long", 1, 1).estimate(Dur::from_secs(1000)), 2);
        }
        let ds = s.step(Time::from_secs(5)).unwrap();
        assert_eq!(started(&ds), vec![10, 11, 12, 13, 14]);
        s.check_invariants().unwrap();
    }

    /// The pass's decisions and how many queue entries its walk took, with or without stopping once the rest of
    /// the queue would be skipped.
    fn pass(s: &ClusterState, now: Time, stop_early: bool) -> (Vec<Decision>, usize) {
        let mut p = run_pass(s, now, |p| p.stop_early = stop_early);
        (std::mem::take(&mut p.decisions), p.walked)
    }

    /// One node of 4 GPUs: a job holds 3 until t=100, the head wants all 4 (reserved from t=100). Behind it, 500
    /// 1-GPU jobs of 1,000 s (they would outlast the reservation: none may take the free GPU) and 500 of 2 GPUs (no
    /// room). A 1-GPU job tried on what the reservation leaves fails (the pass tries one such job as the walk would,
    /// no tenant having a quota) and the 2-GPU ones need more GPUs than are free: the walk has nothing left to find
    /// and stops at the first entry behind the head instead of going through the whole queue, deciding the same.
    #[test]
    fn the_walk_stops_once_every_shape_behind_the_head_has_failed() {
        let c = SchedConfig { backfill: true, backfill_depth: 100_000, ..cfg(Policy::Fifo) };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 4)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "run", 3, 1).estimate(Dur::from_secs(100)), 0);
        assert_eq!(started(&s.step(Time::ZERO).unwrap()), vec![1]);
        submit(&mut s, 2, JobSpec::new(t0(), "head", 4, 1).estimate(Dur::from_secs(10)), 1);
        for i in 0..1000 {
            let gpus = 1 + (i % 2) as u32;
            submit(&mut s, 10 + i, JobSpec::new(t0(), "long", gpus, 1).estimate(Dur::from_secs(1000)), 2);
        }
        let now = Time::from_secs(5);
        let (fast, walked) = pass(&s, now, true);
        let (slow, all) = pass(&s, now, false);
        assert_eq!(fast, slow);
        assert!(started(&fast).is_empty(), "{fast:?}");
        assert_eq!((walked, all), (2, 1001), "the head and the next, against the whole queue");
        // A short 1-GPU job at the end may take the free GPU (it ends before t=100): the walk must reach it.
        submit(&mut s, 5000, JobSpec::new(t0(), "short", 1, 1).estimate(Dur::from_secs(20)), 3);
        let (fast, walked) = pass(&s, now, true);
        assert_eq!(started(&fast), vec![5000]);
        assert_eq!((fast, walked), (pass(&s, now, false).0, 1002));
    }

    /// A job that prefers spot searches the spot nodes first, then all of them: not the search a job that does not
    /// prefer spot makes, so the failure of one says nothing of the other (the memo of failed shapes and the walk's
    /// early stop go by shape).
    #[test]
    fn preferring_spot_makes_a_shape_of_its_own() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 4)], &["a"]);
        let plain = JobSpec::new(t0(), "j", 1, 1);
        let spot = JobSpec { prefer_spot: true, ..plain.clone() };
        submit(&mut s, 1, plain, 0);
        submit(&mut s, 2, spot, 0);
        let shape = |id: u64| crate::state::queue_key(&s.cfg, s.job(JobId(id)).unwrap()).shape();
        assert_ne!(shape(1), shape(2));
    }

    /// Stopping the walk once the rest of the queue would be skipped changes no decision: random clusters, queues
    /// (jobs of 1–8 GPUs and rack gangs, with and without estimates) and running jobs, job-ordering and
    /// share-ordering policies, with and without quotas (which turn the shape probe off), four passes each; and
    /// some passes do stop early.
    #[test]
    fn stopping_early_behind_the_head_decides_the_same() {
        use proptest::prelude::*;
        let policies = [Policy::Fifo, Policy::Sjf, Policy::Srtf, Policy::FairShare, Policy::Drf];
        let strategy = (
            proptest::collection::vec((0usize..6, 1u64..20_000, 0u32..3, 0u8..8), 1..400),
            0usize..policies.len(),
            1usize..60,
            any::<bool>(),
            1usize..4,
        );
        let mut runner = det_runner(128);
        let (stopped, passes) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&strategy, |(jobs, policy, depth, quotas, nodes)| {
                let c = SchedConfig { backfill: true, backfill_depth: depth, ..cfg(policies[policy]) };
                let ns = (0..nodes).map(|i| node(&format!("n{i}"), GpuModel::T4, 4 + 2 * i)).collect();
                let mut s = cluster(c, ns, &[]);
                for t in ["a", "b", "c"] {
                    let spec = TenantSpec::new(t);
                    s.add_tenant(if quotas { spec.quota(Quota::gpus(2, 6)) } else { spec }).unwrap();
                }
                for (i, (g, secs, t, est)) in jobs.iter().enumerate() {
                    // The sixth: a gang of two 2-GPU tasks within one rack (never tried ahead by the pass).
                    let mut spec = JobSpec::new(TenantId(*t), "j", [1, 1, 2, 4, 8, 2][*g], 1 + u32::from(*g == 5));
                    if *g == 5 {
                        spec.topology = TopologyScope::Rack;
                    }
                    if *est > 2 {
                        spec = spec.estimate(Dur::from_secs(*secs));
                    }
                    submit(&mut s, i as u64 + 1, spec, i as u64);
                }
                let mut now = Time::from_secs(jobs.len() as u64);
                for round in 0..4u64 {
                    let (fast, walked) = pass(&s, now, true);
                    let (slow, all) = pass(&s, now, false);
                    prop_assert_eq!(&fast, &slow);
                    prop_assert!(walked <= all);
                    stopped.set(stopped.get() + usize::from(walked < all));
                    passes.set(passes.get() + 1);
                    // Some running jobs end.
                    now = apply_and_end_some(&mut s, &fast, now, round, Dur::from_secs(50));
                }
                Ok(())
            })
            .unwrap();
        assert!(stopped.get() >= 5, "{} of {} passes stopped early", stopped.get(), passes.get());
    }

    /// The reservation's shortcuts change no decision: a one-task head reserved by its releases node by node
    /// decides as the search by placement does, and that search, giving releases back on the eligible classes only
    /// and counting room per group a gang may not leave, decides as with every release given back and room counted
    /// over all eligible nodes. Random clusters of two models in two zones, one-task jobs and gangs of 2–4 tasks
    /// (in one zone, anywhere, in one rack), with and without mixed models, five policies, four passes each.
    #[test]
    fn the_reservations_shortcuts_decide_as_the_plain_search() {
        use proptest::prelude::*;
        let policies = [Policy::Fifo, Policy::Sjf, Policy::Srtf, Policy::Las, Policy::FairShare];
        // Jobs: (size index, estimate s, tenant, model wanted): one task of 1-8 GPUs, or a gang (index 5 on: two
        // 2-GPU tasks, often on one node, so that a release may free several GPUs of one node in steps and nodes of
        // two classes and models at once; two of 4, three of 2, four of 1), its scope by its estimate.
        let strategy = (
            proptest::collection::vec((0usize..9, 1u64..20_000, 0u32..3, 0u8..6), 1..300),
            0usize..policies.len(),
            2usize..7,
            any::<bool>(),
        );
        let mut runner = det_runner(128);
        let reserved = std::cell::Cell::new(0usize);
        runner
            .run(&strategy, |(jobs, policy, nodes, mixed)| {
                let c = SchedConfig { backfill: true, ..cfg(policies[policy]) };
                let ns = (0..nodes)
                    .map(|i| {
                        let model = if i % 3 == 1 { GpuModel::V100_16GB } else { GpuModel::T4 };
                        node(&format!("n{i}"), model, [4, 8, 6][i % 3]).label("zone", ["z1", "z2"][i / 2 % 2])
                    })
                    .collect();
                let mut s = cluster(c, ns, &["a", "b", "c"]);
                for (i, (g, secs, t, model)) in jobs.iter().enumerate() {
                    let (gpus, tasks) = [(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 3), (1, 4)][*g];
                    let mut spec = JobSpec::new(TenantId(*t), "j", gpus, tasks).estimate(Dur::from_secs(*secs));
                    if tasks > 1 {
                        spec.topology =
                            [TopologyScope::Zone, TopologyScope::Any, TopologyScope::Rack][*secs as usize % 3];
                    }
                    spec.allow_mixed_models = mixed;
                    if *model == 0 {
                        spec.gpu_models = crate::job::thin_vec![GpuModel::V100_16GB];
                    }
                    submit(&mut s, i as u64 + 1, spec, i as u64);
                }
                let mut now = Time::from_secs(jobs.len() as u64);
                for round in 0..4u64 {
                    let fast = run_pass(&s, now, |_| {}).decisions.clone();
                    let slow = run_pass(&s, now, |p| p.one_node_res = false).decisions.clone();
                    prop_assert_eq!(&fast, &slow);
                    let plain = run_pass(&s, now, |p| {
                        p.one_node_res = false;
                        p.narrow_res = false;
                    })
                    .decisions
                    .clone();
                    prop_assert_eq!(&fast, &plain);
                    reserved
                        .set(reserved.get() + fast.iter().filter(|d| matches!(d, Decision::Reserve { .. })).count());
                    now = apply_and_end_some(&mut s, &fast, now, round, Dur::from_secs(50));
                }
                Ok(())
            })
            .unwrap();
        assert!(reserved.get() >= 100, "only {} reservations", reserved.get());
    }
}
