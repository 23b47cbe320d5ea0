//! The victims for a one-task job on one node: when the cheapest victims anywhere free no node whole enough for it,
//! the fewest victims on one node instead (`Pass::one_node_victims`), and whether any eligible node could have the
//! room at all once at most the budget's candidates on it are gone (`Pass::one_node_room_possible`, a check made
//! before the candidates are ranked).

use super::PreemptReason;
use crate::ids::JobId;
use crate::schedule::Pass;

impl Pass<'_> {
    /// For a one-task job needing `gpus` GPUs: candidates (`cands`, on the nodes `nodes`) on one eligible node that
    /// free enough of it, cheapest first, within `budget`. The node is the one needing the fewest victims (then the
    /// cheapest); only victims running on that node alone count. Returned as indexes into `cands`, cheapest first.
    pub(super) fn one_node_victims(
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
    pub(super) fn one_node_room_possible(
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
}
