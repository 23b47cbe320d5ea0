//! Defragmentation: a job that waits for room on one node (or on whole nodes) while enough GPUs are free in pieces
//! over many has its room made by moving the jobs of a few nodes to those pieces. The jobs moved are evicted (they
//! resume from their last checkpoint, at once, on the free pieces the search found for them), and the nodes they
//! leave are the waiting job's (`PreemptionConfig::defragment`).
//!
//! Why: on Philly at 82% load, one-GPU jobs scattered over every node kept a quarter of the GPUs free in pieces while
//! jobs of a whole node waited for days (docs/scheduler.md, "Defragmentation"). A job moved loses at most the work
//! since its last checkpoint and its stop and restart, and only jobs that can start elsewhere at once are moved.

use super::{Decision, Pass, PreemptReason};
use crate::alloc::Holdback;
use crate::ids::{JobId, NodeId};
use crate::job::{Job, TaskPlacement};
use crate::units::Time;

/// Most nodes a search looks at (those with the most free GPUs first); beyond them, time alone may change what it
/// finds (which nodes are cheapest to clear).
const MAX_NODES_LOOKED_AT: usize = 64;

/// Most defragmentation searches in one pass (the head's and those of jobs behind it).
const MAX_SEARCHES: u32 = 4;

/// One node's residents as a search weighs them: the node, the work they would lose, their GPUs and ids.
struct Clearable {
    node: NodeId,
    lost: u64,
    moved_gpus: u32,
    jobs: Vec<JobId>,
}

impl Pass<'_> {
    /// Makes room for the blocked `job` by moving the jobs on the cheapest nodes to free GPUs elsewhere; what it
    /// will use is claimed. Returns whether room is being made.
    /// Behind a blocked head, `hold` is what its reservation holds: no node of it is cleared, and neither the jobs
    /// moved nor the job itself are placed on it. At most [`MAX_SEARCHES`] searches are made in a pass.
    pub(super) fn defragment(&mut self, job: &Job, classes: &[u32], hold: Option<&Holdback>) -> bool {
        if !self.st.cfg.preemption.defragment || self.defrag_searches >= MAX_SEARCHES {
            return false;
        }
        self.defrag_searches += 1;
        let mark = self.free.mark();
        let found = self.search_moves(job, classes, hold);
        self.free.rollback(&self.st.topo, mark);
        let Some(((victims, placement, later), moved_to)) = found else {
            return false;
        };
        // Where the jobs moved will go is theirs for the rest of the pass: no later search counts on it, and no later
        // job of the pass starts there (in the next passes they have the first claim, `ClusterState::moving`).
        for tp in &moved_to {
            self.free.take(&self.st.topo, tp);
        }
        let waiting_gpus = job.spec.task.gpus * job.spec.elastic.map_or(job.spec.tasks, |e| e.min_tasks);
        for &id in &victims {
            self.preempted.insert(id);
            self.stats.preempted += 1;
            let reason = PreemptReason::Defragment { waiting_gpus };
            self.decisions.push(Decision::Preempt { job: id, reason, for_job: job.id });
        }
        self.decisions.push(Decision::Reserve { job: job.id, at: self.now, placement: placement.clone() });
        let res = self.room_made(job, &placement, &later, false);
        self.claim(&res.hold);
        self.note(job.id, |p| p.capacity_reason(&job.spec, classes, Some(p.now), victims));
        true
    }

    /// [`Self::defragment`]'s search, on the pass's pool (which the caller rolls back): the jobs to move, the waiting
    /// job's placement once they are gone, and the free CPU and memory then on its nodes; and the tasks of the jobs
    /// moved where they will go.
    fn search_moves(
        &mut self,
        job: &Job,
        classes: &[u32],
        hold: Option<&Holdback>,
    ) -> Option<(super::preempt::Found, Vec<TaskPlacement>)> {
        let st = self.st;
        let cfg = &st.cfg.preemption;
        let spec = &job.spec;
        if !cfg.enabled || !cfg.defragment || spec.task.gpus == 0 || spec.task.mig.is_some() {
            return None;
        }
        let tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let g = spec.task.gpus;
        let need = g as u64 * tasks as u64;
        // Not fragmentation: too few GPUs are free at all (moving jobs frees none).
        if self.free.free_in(classes) < need {
            return None;
        }
        let budget = cfg.max_per_interval.saturating_sub(st.recent_preemptions(self.now) + self.stats.preempted as u32);
        if budget == 0 {
            self.turns_at(st.preemption_window_turns(self.now).unwrap_or(Time::MAX));
            return None;
        }
        let now = self.now;
        let mut turn = Time::MAX;
        // Nodes that could hold a task of the job once cleared, most free GPUs first (fewest jobs to move), each
        // with its residents when every one of them may be moved.
        let mut nodes: Vec<Clearable> = Vec::new();
        let mut looked_at = 0usize;
        let max_f = classes.iter().map(|&c| self.free.classes[c as usize].buckets().len()).max().unwrap_or(0);
        'found: for f in (0..max_f.min(g as usize)).rev() {
            for &c in classes {
                let Some(bucket) = self.free.classes[c as usize].buckets().get(f) else { continue };
                for &n in bucket {
                    if looked_at == MAX_NODES_LOOKED_AT {
                        turn = now; // nodes left unseen: which are cheapest may change at any moment
                        break 'found;
                    }
                    looked_at += 1;
                    if st.topo.nodes[n.index()].gpu_mask.count_ones() < g || hold.is_some_and(|h| h.contains_key(&n)) {
                        continue;
                    }
                    if let Some(cl) = self.clearable(job, n, &mut turn) {
                        nodes.push(cl);
                    }
                }
            }
        }
        if nodes.is_empty() {
            self.turns_at(turn);
            return None;
        }
        // Cheapest first: least work lost, then fewest GPUs moved (work lost grows with time: the order may change).
        self.turns_at(now);
        nodes.sort_by_key(|c| (c.lost, c.moved_gpus, c.node));
        let mut cleared: Vec<NodeId> = Vec::new();
        let mut victims: Vec<JobId> = Vec::new();
        let mut moved_to: Vec<TaskPlacement> = Vec::new();
        for cl in &nodes {
            if victims.len() + cl.jobs.len() > budget as usize {
                continue;
            }
            let node_mark = self.free.mark();
            // The cleared nodes, and this one, are kept out of reach of the jobs moved.
            let block = |free: &crate::alloc::Free, n: NodeId| {
                let f = &free.nodes[n.index()];
                TaskPlacement { node: n, gpu_mask: f.mask, mig_slot: None, cpu: f.cpu, mem: f.mem }
            };
            let mut blocks: Vec<TaskPlacement> = Vec::with_capacity(cleared.len() + 1);
            for &n in cleared.iter().chain(std::iter::once(&cl.node)) {
                let b = block(&self.free, n);
                self.free.take(&st.topo, &b);
                blocks.push(b);
            }
            let mut moved = true;
            let dest_from = moved_to.len();
            for id in &cl.jobs {
                let r = &st.jobs[id];
                let run = r.run.as_ref().expect("a resident runs");
                let base = self.eligible(&r.spec);
                let Ok(rc) = self.quota_classes(r.spec.tenant, &r.spec, run.placement.tasks.len() as u32, &base) else {
                    moved = false;
                    break;
                };
                match self.place_on(&self.free, &r.spec, run.placement.tasks.len() as u32, &rc, hold) {
                    Some(p) => {
                        p.tasks.iter().for_each(|tp| self.free.take(&st.topo, tp));
                        moved_to.extend_from_slice(&p.tasks);
                    }
                    None => {
                        moved = false;
                        break;
                    }
                }
            }
            if !moved {
                self.free.rollback(&st.topo, node_mark);
                moved_to.truncate(dest_from);
                continue;
            }
            // The node's residents gone, its GPUs are free, and so are the cleared nodes'.
            for b in blocks.iter().rev() {
                self.free.give(&st.topo, b);
            }
            for id in &cl.jobs {
                let run = st.jobs[id].run.as_ref().expect("a resident runs");
                run.placement.tasks.iter().for_each(|tp| self.free.give(&st.topo, tp));
            }
            victims.extend_from_slice(&cl.jobs);
            cleared.push(cl.node);
            if let Some(p) = self.place_on(&self.free, spec, tasks, classes, hold) {
                let later = Self::later_on(&self.free, &p);
                return Some(((victims, p, later), moved_to));
            }
        }
        None
    }

    /// Node `n`'s residents, when each may be moved for `job`: preemptible, not being evicted or already a victim,
    /// on this node alone, of no higher priority, fewer GPUs than the job's task, and past the minimum run time (the
    /// earliest time a too-young one will be is noted in `turn`).
    fn clearable(&self, job: &Job, n: NodeId, turn: &mut Time) -> Option<Clearable> {
        let st = self.st;
        let cfg = &st.cfg.preemption;
        let mut cl = Clearable { node: n, lost: 0, moved_gpus: 0, jobs: Vec::new() };
        for &id in &st.node_jobs[n.index()] {
            let &(part, i) = st.run_row_of.get(&id)?;
            let r = &st.run_rows[part][i];
            if !r.preemptible
                || r.evicting
                || r.node != Some(n)
                || r.priority > job.spec.priority
                || r.gpus >= job.spec.task.gpus
                || self.preempted.contains(&id)
            {
                return None;
            }
            if self.now.since(r.started) < cfg.min_run_time {
                *turn = (*turn).min(r.started + cfg.min_run_time);
                return None;
            }
            if st.jobs[&id].run.as_ref().is_some_and(|run| run.placement.tasks.iter().any(|t| t.mig_slot.is_some())) {
                return None;
            }
            cl.lost += r.lost().at(self.now);
            cl.moved_gpus += r.gpus;
            cl.jobs.push(id);
        }
        (!cl.jobs.is_empty()).then_some(cl)
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    /// Three nodes of 4 GPUs with two one-GPU jobs left on each (jobs started at 1 s, a minimum run time of 60 s).
    fn fragmented(defragment: bool) -> ClusterState {
        fragmented_with(defragment, |_| 0)
    }

    /// As [`fragmented`], job `id` of priority `priority(id)`.
    fn fragmented_with(defragment: bool, priority: impl Fn(u64) -> i32) -> ClusterState {
        let mut c = preempting(Policy::Fifo, Dur::from_secs(60));
        c.preemption.defragment = defragment;
        let ns = (0..3).map(|i| node(&format!("n{i}"), GpuModel::T4, 4)).collect();
        let mut s = cluster(c, ns, &["a"]);
        for id in 1..=12 {
            submit(&mut s, id, JobSpec::new(t0(), "one", 1, 1).priority(priority(id)), 0);
        }
        assert_eq!(started(&s.step(Time::from_secs(1)).unwrap()).len(), 12);
        // On each node, the two jobs of the lowest ids end.
        for n in 0..3u32 {
            let mut on: Vec<JobId> = s.node_jobs[n as usize].iter().copied().collect();
            on.sort();
            for id in &on[..2] {
                s.finish(*id, Time::from_secs(2), true).unwrap();
            }
        }
        s
    }

    fn node_of(s: &ClusterState, id: u64) -> NodeId {
        s.job(JobId(id)).unwrap().run.as_ref().unwrap().placement.tasks[0].node
    }

    /// By hand: a 4-GPU job waits while 6 GPUs are free, 2 on each node. The two jobs of the cheapest node (all lose
    /// the same work: the lowest node) are moved to the free GPUs of the other two, and the job gets that node. Once
    /// their stops are confirmed, the next pass starts the job on the node cleared and the two moved jobs elsewhere.
    /// Without defragmentation the pass decides nothing.
    #[test]
    fn a_job_waiting_for_a_whole_node_gets_one_cleared_of_jobs_that_fit_elsewhere() {
        let now = Time::from_secs(120);
        let mut plain = fragmented(false);
        submit(&mut plain, 20, JobSpec::new(t0(), "four", 4, 1), 3);
        assert!(schedule(&plain, now).is_empty());

        let mut s = fragmented(true);
        submit(&mut s, 20, JobSpec::new(t0(), "four", 4, 1), 3);
        let n0: Vec<u64> = s.node_jobs[0].iter().map(|j| j.0).collect();
        assert_eq!(n0.len(), 2);
        let ds = schedule(&s, now);
        let moved: Vec<u64> = ds
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt {
                    job,
                    reason: PreemptReason::Defragment { waiting_gpus: 4 },
                    for_job: JobId(20),
                } => Some(job.0),
                _ => None,
            })
            .collect();
        assert_eq!(moved, n0, "{ds:?}");
        assert!(
            ds.iter().any(|d| matches!(d, Decision::Reserve { job: JobId(20), placement, .. }
                if placement.tasks[0].node == NodeId(0))),
            "{ds:?}"
        );
        for d in &ds {
            s.apply(d, now).unwrap();
        }
        s.check_invariants().unwrap();
        let next = s.step(now + Dur::from_secs(1)).unwrap();
        let mut got = started(&next);
        got.sort();
        let mut want = n0.clone();
        want.push(20);
        assert_eq!(got, want, "{next:?}");
        assert_eq!(node_of(&s, 20), NodeId(0));
        assert!(n0.iter().all(|&j| node_of(&s, j) != NodeId(0)));
        s.check_invariants().unwrap();
    }

    /// What keeps a node from being cleared: jobs younger than the minimum run time (the pass notes when the first
    /// is old enough, and then it is cleared); too few GPUs free in all (moving frees none); a resident of higher
    /// priority than the waiting job (its node is passed over for another); the eviction rate limit.
    #[test]
    fn young_jobs_higher_priority_jobs_and_too_few_free_gpus_keep_a_node() {
        // Young: at 30 s the residents (started at 1 s) are protected until 61 s.
        let mut s = fragmented(true);
        submit(&mut s, 20, JobSpec::new(t0(), "four", 4, 1), 3);
        let (ds, stats) = schedule_with_stats(&s, Time::from_secs(30));
        assert!(ds.is_empty(), "{ds:?}");
        assert_eq!(stats.idle_until, Time::from_secs(61));
        assert!(!schedule(&s, Time::from_secs(61)).is_empty());

        // Too few free: a 2-GPU job takes one node's pair and a one-GPU job another node's piece; 3 GPUs are left
        // free, fewer than the 4 the job needs.
        let mut s = fragmented(true);
        submit(&mut s, 13, JobSpec::new(t0(), "two", 2, 1), 2);
        submit(&mut s, 14, JobSpec::new(t0(), "one", 1, 1), 2);
        assert_eq!(started(&s.step(Time::from_secs(3)).unwrap()), vec![13, 14]);
        submit(&mut s, 20, JobSpec::new(t0(), "four", 4, 1), 3);
        assert!(schedule(&s, Time::from_secs(120)).is_empty());

        // Higher priority on node 0 (job 4): its residents stay; node 1's are moved.
        let mut s = fragmented_with(true, |id| if id == 4 { 5 } else { 0 });
        assert!(s.node_jobs[0].contains(&JobId(4)), "{:?}", s.node_jobs[0]);
        submit(&mut s, 20, JobSpec::new(t0(), "four", 4, 1), 3);
        let ds = schedule(&s, Time::from_secs(120));
        let n1: Vec<JobId> = s.node_jobs[1].iter().copied().collect();
        let moved: Vec<JobId> = ds
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, .. } => Some(*job),
                _ => None,
            })
            .collect();
        assert_eq!(moved, n1, "{ds:?}");

        // The rate limit: one eviction left in the window, two needed.
        let mut s = fragmented(true);
        for k in 0..19 {
            s.note_preemption(Time::from_secs(100 + k));
        }
        submit(&mut s, 20, JobSpec::new(t0(), "four", 4, 1), 3);
        assert!(schedule(&s, Time::from_secs(120)).is_empty());
    }

    /// Random clusters of 4- and 8-GPU nodes under FIFO and SRTF, with backfill and without, jobs of 1, 2, 4 and 8
    /// GPUs: every pass that moves jobs keeps its promise. Its decisions applied (stops confirmed at once), the next
    /// pass at the same time starts every job it moved and every job it moved them for; no job is moved twice in a
    /// pass, none for a job with no more GPUs per task than its own, and the invariants hold throughout.
    #[test]
    fn the_next_pass_starts_the_jobs_moved_and_the_jobs_they_were_moved_for() {
        use proptest::prelude::*;
        let strategy =
            (proptest::collection::vec((0usize..4, 60u64..20_000), 4..80), any::<bool>(), any::<bool>(), 2usize..6);
        let mut runner = det_runner(128);
        let moves = std::cell::Cell::new(0usize);
        runner
            .run(&strategy, |(jobs, srtf, backfill, nodes)| {
                let policy = if srtf { Policy::Srtf } else { Policy::Fifo };
                let mut c = SchedConfig { backfill, ..preempting(policy, Dur::from_secs(30)) };
                c.preemption.defragment = true;
                let ns = (0..nodes).map(|i| node(&format!("n{i}"), GpuModel::T4, [4, 8][i % 2])).collect();
                let mut s = cluster(c, ns, &["a", "b"]);
                for (i, (g, secs)) in jobs.iter().enumerate() {
                    let gpus = [1, 1, 2, 4][*g] * if *secs % 5 == 0 { 2 } else { 1 };
                    let spec = JobSpec::new(TenantId((i % 2) as u32), "j", gpus, 1).estimate(Dur::from_secs(*secs));
                    submit(&mut s, i as u64 + 1, spec, i as u64);
                }
                let mut now = Time::from_secs(jobs.len() as u64);
                for round in 0..10u64 {
                    let ds = schedule(&s, now);
                    let mut moved: Vec<(JobId, JobId)> = Vec::new();
                    for d in &ds {
                        if let Decision::Preempt { job, reason: PreemptReason::Defragment { waiting_gpus }, for_job } =
                            d
                        {
                            let v = s.job(*job).unwrap();
                            let w = s.job(*for_job).unwrap();
                            prop_assert!(v.spec.task.gpus * v.spec.tasks < w.spec.task.gpus);
                            prop_assert_eq!(*waiting_gpus, w.spec.task.gpus * w.spec.tasks);
                            prop_assert!(!moved.iter().any(|(m, _)| m == job));
                            moved.push((*job, *for_job));
                        }
                    }
                    now = if moved.is_empty() {
                        apply_and_end_some(&mut s, &ds, now, round, Dur::from_secs(40))
                    } else {
                        moves.set(moves.get() + moved.len());
                        for d in &ds {
                            s.apply(d, now).unwrap();
                        }
                        s.check_invariants().unwrap();
                        let next = started(&s.step(now).unwrap());
                        s.check_invariants().unwrap();
                        for (m, w) in &moved {
                            prop_assert!(next.contains(&m.0) && next.contains(&w.0), "{:?} {:?}", moved, next);
                        }
                        now + Dur::from_secs(40)
                    };
                }
                Ok(())
            })
            .unwrap();
        assert!(moves.get() >= 100, "{} jobs moved", moves.get());
    }
}
