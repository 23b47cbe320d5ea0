//! Free resources and placement.
//!
//! Nodes are grouped into *classes*: nodes with the same GPU model, MIG layout, labels (all but `rack`) and taints.
//! A job's selector, tolerations and model list are checked once per class, not per node. Inside a class, schedulable
//! nodes sit in *buckets* by free whole-GPU count, so best-fit ("the node whose free GPUs match the request") is a
//! walk up from bucket `need`, usually one step. Racks are tracked per class with their free GPU counts.
//!
//! [`Topology`] is static between node changes; [`Free`] is the dynamic part, cheap to clone: a scheduling pass clones
//! it and places jobs one by one on its copy.

use crate::gpu::{GpuModel, MigProfile};
use crate::ids::NodeId;
use crate::job::{JobSpec, Placement, TaskPlacement, TopologyScope};
use crate::node::{labels, NodeSpec};
use crate::units::{MiB, MilliCpu};
use smallvec::SmallVec;
use std::collections::{BTreeMap, HashMap};

/// Static facts of one node that placement needs.
#[derive(Debug, Clone)]
pub(crate) struct NodeTopo {
    /// Whole (non-MIG) GPUs.
    pub(crate) gpu_mask: u64,
    /// Masks of whole GPUs per NVLink domain.
    pub(crate) domains: Vec<u64>,
    /// MIG slots: (GPU index, profile).
    pub(crate) mig_slots: Vec<(u8, MigProfile)>,
    pub(crate) cpu: MilliCpu,
    pub(crate) mem: MiB,
    pub(crate) class: u32,
    /// Index of the node's rack within its class.
    pub(crate) rack: u32,
    pub(crate) present: bool,
}

/// A class of interchangeable nodes.
#[derive(Debug, Clone)]
pub(crate) struct ClassInfo {
    /// A representative spec: labels without `rack`; used for eligibility checks.
    pub(crate) spec: NodeSpec,
    pub(crate) model: Option<GpuModel>,
    pub(crate) zone: u32,
    pub(crate) max_gpus: u32,
    /// Largest NVLink domain of a node (whole GPUs).
    pub(crate) max_domain: u32,
    pub(crate) max_cpu: MilliCpu,
    pub(crate) max_mem: MiB,
    /// Whole GPUs over all nodes of the class.
    pub(crate) total_gpus: u64,
    pub(crate) has_mig: bool,
    /// Racks of the class: their nodes.
    pub(crate) racks: Vec<Vec<NodeId>>,
    pub(crate) rack_names: Vec<String>,
    pub(crate) nodes: Vec<NodeId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ClassKey {
    labels: Vec<(String, String)>,
    taints: Vec<(String, String)>,
    mig: Vec<Vec<MigProfile>>,
}

/// Static placement topology.
#[derive(Debug, Clone, Default)]
pub(crate) struct Topology {
    pub(crate) nodes: Vec<NodeTopo>,
    pub(crate) classes: Vec<ClassInfo>,
    class_by_key: HashMap<ClassKey, u32>,
    zones: Vec<String>,
}

/// Free resources of one node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NodeFree {
    pub(crate) mask: u64,
    pub(crate) cpu: MilliCpu,
    pub(crate) mem: MiB,
    /// Free MIG slots (bit per slot).
    pub(crate) mig: u64,
    pub(crate) schedulable: bool,
    pos: u32,
}

impl NodeFree {
    /// Takes a task's resources off the node's free ones (buckets aside).
    fn sub(&mut self, t: &TaskPlacement) {
        self.mask &= !t.gpu_mask;
        self.cpu -= t.cpu;
        self.mem -= t.mem;
        if let Some(s) = t.mig_slot {
            self.mig &= !(1 << s);
        }
    }

    /// Adds a task's resources to the node's free ones (buckets aside).
    fn add(&mut self, t: &TaskPlacement) {
        debug_assert_eq!(self.mask & t.gpu_mask, 0, "GPU freed twice");
        self.mask |= t.gpu_mask;
        self.cpu += t.cpu;
        self.mem += t.mem;
        if let Some(s) = t.mig_slot {
            self.mig |= 1 << s;
        }
    }
}

/// Dynamic per-class index.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ClassFree {
    buckets: Vec<Vec<NodeId>>,
    /// Free whole GPUs on schedulable nodes.
    pub(crate) free_gpus: u64,
    /// Free whole GPUs per rack (schedulable nodes).
    pub(crate) rack_free: Vec<u32>,
}

/// The dynamic free-resource state.
///
/// A pool may keep a log of its changes ([`Free::start_log`]) and undo them all ([`Free::rollback`]), the order of
/// nodes within buckets included: a scheduling pass works on such a pool and hands it back as it found it, so that
/// the next pass need not copy the cluster's pool (`state::PassPool`), and a victim search works on the pass's pool and
/// rolls back to a mark instead of working on a copy.
#[derive(Debug, Default)]
pub(crate) struct Free {
    pub(crate) nodes: Vec<NodeFree>,
    pub(crate) classes: Vec<ClassFree>,
    /// Free whole GPUs on all schedulable nodes.
    pub(crate) total_gpus: u64,
    /// Whether changes are logged in `log`.
    logging: bool,
    /// The changes made since [`Free::start_log`], oldest first (its buffer kept between logs).
    log: Vec<Undo>,
}

/// One logged change of a pool, with what undoing it needs.
#[derive(Debug)]
enum Undo {
    /// A task taken or given on a node: the node as it was (its place in its bucket included) and how many buckets
    /// its class had.
    Move { id: NodeId, before: NodeFree, buckets: u32 },
    /// A bucket reordered ([`Free::send_to_back`]): its order before.
    Order { class: u32, f: u32, before: Vec<NodeId> },
}

/// What a backfill job that outlasts the reservation may not touch on a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) gpus: u64,
    pub(crate) cpu: MilliCpu,
    pub(crate) mem: MiB,
    pub(crate) mig: u64,
}

/// Per-node holds of a reservation.
pub(crate) type Holdback = crate::fxhash::FxHashMap<NodeId, Hold>;

/// One placement request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) spec: &'a JobSpec,
    pub(crate) tasks: u32,
    /// Eligible classes (selector, tolerations, models and quota already applied).
    pub(crate) classes: &'a [u32],
    pub(crate) hold: Option<&'a Holdback>,
    /// The selector names `rack`, which classes do not capture: check nodes one by one.
    pub(crate) per_node: bool,
}

/// Where a GPU model's nodes come in a placement search's order of model groups: fastest model first.
pub(crate) fn model_rank(m: Option<GpuModel>) -> (u64, usize) {
    let speed = m.map_or(0, |m| (m.relative_speed() * 1000.0) as u64);
    (u64::MAX - speed, m.map_or(0, |m| m.index()))
}

/// The model group a placement search for `spec` puts nodes of model `m` in: one group for all when the job may
/// mix models, else [`model_rank`].
pub(crate) fn model_group(spec: &JobSpec, m: Option<GpuModel>) -> (u64, usize) {
    if spec.allow_mixed_models {
        (0, 0)
    } else {
        model_rank(m)
    }
}

fn low_bits(mask: u64, n: u32) -> Option<u64> {
    if mask.count_ones() < n {
        return None;
    }
    let mut out = 0u64;
    let mut m = mask;
    for _ in 0..n {
        let b = m & m.wrapping_neg();
        out |= b;
        m &= !b;
    }
    Some(out)
}

impl Topology {
    /// Registers a node: finds or makes its class. Returns (class, rack-in-class).
    pub(crate) fn add_node(&mut self, id: NodeId, spec: &NodeSpec) {
        let mut labels: Vec<(String, String)> = spec
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != labels::RACK)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.sort();
        let mut taints: Vec<(String, String)> = spec.taints.iter().map(|t| (t.key.clone(), t.value.clone())).collect();
        taints.sort();
        let mig: Vec<Vec<MigProfile>> = spec.gpus.iter().map(|g| g.mig.clone()).collect();
        let has_mig = mig.iter().any(|m| !m.is_empty());
        let key = ClassKey { labels, taints, mig };
        let zone_name = spec.zone().to_string();
        let zone = match self.zones.iter().position(|z| *z == zone_name) {
            Some(z) => z as u32,
            None => {
                self.zones.push(zone_name);
                (self.zones.len() - 1) as u32
            }
        };
        let class = *self.class_by_key.entry(key).or_insert_with(|| {
            let mut rep = spec.clone();
            rep.labels.remove(labels::RACK);
            self.classes.push(ClassInfo {
                spec: rep,
                model: spec.gpu_model(),
                zone,
                max_gpus: 0,
                max_domain: 0,
                max_cpu: MilliCpu(0),
                max_mem: MiB(0),
                total_gpus: 0,
                has_mig,
                racks: Vec::new(),
                rack_names: Vec::new(),
                nodes: Vec::new(),
            });
            (self.classes.len() - 1) as u32
        });
        let c = &mut self.classes[class as usize];
        let rack_name = spec.rack().to_string();
        let rack = match c.rack_names.iter().position(|r| *r == rack_name) {
            Some(r) => r,
            None => {
                c.rack_names.push(rack_name);
                c.racks.push(Vec::new());
                c.racks.len() - 1
            }
        };
        c.racks[rack].push(id);
        c.nodes.push(id);
        let mut gpu_mask = 0u64;
        let mut dom: BTreeMap<u8, u64> = BTreeMap::new();
        let mut mig_slots = Vec::new();
        for (i, g) in spec.gpus.iter().enumerate() {
            if g.mig.is_empty() {
                gpu_mask |= 1 << i;
                *dom.entry(g.nvlink_domain).or_default() |= 1 << i;
            } else {
                for p in &g.mig {
                    mig_slots.push((i as u8, *p));
                }
            }
        }
        c.max_gpus = c.max_gpus.max(gpu_mask.count_ones());
        c.max_domain = c.max_domain.max(dom.values().map(|d| d.count_ones()).max().unwrap_or(0));
        c.max_cpu = c.max_cpu.max(spec.cpu);
        c.max_mem = c.max_mem.max(spec.mem);
        c.total_gpus += gpu_mask.count_ones() as u64;
        let topo = NodeTopo {
            gpu_mask,
            domains: dom.into_values().collect(),
            mig_slots,
            cpu: spec.cpu,
            mem: spec.mem,
            class,
            rack: rack as u32,
            present: true,
        };
        let idx = id.index();
        if self.nodes.len() <= idx {
            self.nodes.resize(idx + 1, topo.clone());
        }
        self.nodes[idx] = topo;
    }

    /// Zone name of an index.
    pub(crate) fn zone_name(&self, z: u32) -> &str {
        &self.zones[z as usize]
    }
}

impl ClassFree {
    /// The class's schedulable nodes by free whole-GPU count.
    pub(crate) fn buckets(&self) -> &[Vec<NodeId>] {
        &self.buckets
    }

    /// The most free whole GPUs on one schedulable node of the class.
    pub(crate) fn largest(&self) -> u32 {
        self.buckets.iter().rposition(|b| !b.is_empty()).unwrap_or(0) as u32
    }
}

/// A clone copies the resources, not the log: it does not log.
impl Clone for Free {
    fn clone(&self) -> Self {
        Free {
            nodes: self.nodes.clone(),
            classes: self.classes.clone(),
            total_gpus: self.total_gpus,
            logging: false,
            log: Vec::new(),
        }
    }
}

impl Free {
    /// Starts logging changes (a log started before is dropped).
    pub(crate) fn start_log(&mut self) {
        self.logging = true;
        self.log.clear();
    }

    /// Where the log stands, for [`Free::rollback`] (on a pool that logs).
    pub(crate) fn mark(&self) -> usize {
        debug_assert!(self.logging, "a mark on a pool that does not log");
        self.log.len()
    }

    /// Undoes the logged changes made since `mark`, last first: the pool is exactly as it was at the mark, the order
    /// of nodes within buckets and the buckets' count included.
    pub(crate) fn rollback(&mut self, topo: &Topology, mark: usize) {
        while self.log.len() > mark {
            self.undo_last(topo);
        }
    }

    /// Undoes every logged change and stops logging.
    pub(crate) fn rollback_all(&mut self, topo: &Topology) {
        self.rollback(topo, 0);
        self.logging = false;
    }

    /// Whether the resources equal `other`'s, the order of nodes within buckets included (logs aside).
    pub(crate) fn same_as(&self, other: &Free) -> bool {
        self.total_gpus == other.total_gpus && self.nodes == other.nodes && self.classes == other.classes
    }

    fn undo_last(&mut self, topo: &Topology) {
        match self.log.pop().expect("a change to undo") {
            Undo::Move { id, before, buckets } => {
                let t = &topo.nodes[id.index()];
                let now = self.nodes[id.index()];
                let cf = &mut self.classes[t.class as usize];
                if now.schedulable {
                    // Every change made since was undone: the node is still last in the bucket it was pushed onto.
                    let f = now.mask.count_ones() as usize;
                    let popped = cf.buckets[f].pop();
                    debug_assert_eq!(popped, Some(id), "undo out of order");
                    cf.free_gpus -= f as u64;
                    cf.rack_free[t.rack as usize] -= f as u32;
                    self.total_gpus -= f as u64;
                    debug_assert!(cf.buckets[buckets as usize..].iter().all(|b| b.is_empty()));
                    cf.buckets.truncate(buckets as usize);
                }
                if before.schedulable {
                    self.unremove(topo, id, before.mask.count_ones() as usize, before.pos);
                }
                self.nodes[id.index()] = before;
            }
            Undo::Order { class, f, before } => {
                for (p, id) in before.iter().enumerate() {
                    self.nodes[id.index()].pos = p as u32;
                }
                self.classes[class as usize].buckets[f as usize] = before;
            }
        }
    }

    /// Logs a task's move on node `id`, before it is made.
    fn log_move(&mut self, topo: &Topology, id: NodeId) {
        if self.logging {
            let buckets = self.classes[topo.nodes[id.index()].class as usize].buckets.len() as u32;
            self.log.push(Undo::Move { id, before: self.nodes[id.index()], buckets });
        }
    }
}

impl Free {
    /// Makes room for a node added to `topo` (not yet schedulable).
    pub(crate) fn add_node(&mut self, topo: &Topology, id: NodeId) {
        debug_assert!(!self.logging, "add_node is not logged");
        let t = &topo.nodes[id.index()];
        while self.classes.len() < topo.classes.len() {
            self.classes.push(ClassFree::default());
        }
        let cf = &mut self.classes[t.class as usize];
        let racks = topo.classes[t.class as usize].racks.len();
        if cf.rack_free.len() < racks {
            cf.rack_free.resize(racks, 0);
        }
        let nf = NodeFree {
            mask: t.gpu_mask,
            cpu: t.cpu,
            mem: t.mem,
            mig: if t.mig_slots.is_empty() { 0 } else { u64::MAX >> (64 - t.mig_slots.len()) },
            schedulable: false,
            pos: u32::MAX,
        };
        if self.nodes.len() <= id.index() {
            self.nodes.resize(id.index() + 1, nf);
        }
        self.nodes[id.index()] = nf;
    }

    fn bucket_insert(&mut self, topo: &Topology, id: NodeId) {
        let t = &topo.nodes[id.index()];
        let n = &self.nodes[id.index()];
        let f = n.mask.count_ones() as usize;
        let cf = &mut self.classes[t.class as usize];
        if cf.buckets.len() <= f {
            cf.buckets.resize(f + 1, Vec::new());
        }
        cf.buckets[f].push(id);
        let pos = (cf.buckets[f].len() - 1) as u32;
        cf.free_gpus += f as u64;
        cf.rack_free[t.rack as usize] += f as u32;
        self.total_gpus += f as u64;
        self.nodes[id.index()].pos = pos;
    }

    fn bucket_remove(&mut self, topo: &Topology, id: NodeId) {
        let t = &topo.nodes[id.index()];
        let n = self.nodes[id.index()];
        let f = n.mask.count_ones() as usize;
        let cf = &mut self.classes[t.class as usize];
        let b = &mut cf.buckets[f];
        let pos = n.pos as usize;
        debug_assert_eq!(b[pos], id, "bucket position out of sync");
        b.swap_remove(pos);
        if pos < b.len() {
            let moved = b[pos];
            self.nodes[moved.index()].pos = pos as u32;
        }
        cf.free_gpus -= f as u64;
        cf.rack_free[t.rack as usize] -= f as u32;
        self.total_gpus -= f as u64;
        self.nodes[id.index()].pos = u32::MAX;
    }

    /// Makes a node (un)schedulable.
    pub(crate) fn set_schedulable(&mut self, topo: &Topology, id: NodeId, on: bool) {
        debug_assert!(!self.logging, "set_schedulable is not logged");
        let cur = self.nodes[id.index()].schedulable;
        if cur == on {
            return;
        }
        if on {
            self.nodes[id.index()].schedulable = true;
            self.bucket_insert(topo, id);
        } else {
            self.bucket_remove(topo, id);
            self.nodes[id.index()].schedulable = false;
        }
    }

    /// Whether the task's resources are free on its node.
    pub(crate) fn can_take(&self, topo: &Topology, t: &TaskPlacement) -> Result<(), String> {
        let Some(n) = self.nodes.get(t.node.index()) else {
            return Err(format!("{} does not exist", t.node));
        };
        if t.gpu_mask & !n.mask != 0 {
            return Err(format!("GPUs {:#x} of {} are not free", t.gpu_mask & !n.mask, t.node));
        }
        if t.cpu > n.cpu || t.mem > n.mem {
            return Err(format!("{} lacks CPU or memory", t.node));
        }
        if let Some(s) = t.mig_slot {
            if s as usize >= topo.nodes[t.node.index()].mig_slots.len() || n.mig & (1 << s) == 0 {
                return Err(format!("MIG slot {s} of {} is not free", t.node));
            }
        }
        Ok(())
    }

    /// Takes a task's resources. The caller has checked `can_take`.
    pub(crate) fn take(&mut self, topo: &Topology, t: &TaskPlacement) {
        self.log_move(topo, t.node);
        let sched = self.nodes[t.node.index()].schedulable;
        if sched {
            self.bucket_remove(topo, t.node);
        }
        self.nodes[t.node.index()].sub(t);
        if sched {
            self.bucket_insert(topo, t.node);
        }
    }

    /// Gives a task's resources back.
    pub(crate) fn give(&mut self, topo: &Topology, t: &TaskPlacement) {
        self.log_move(topo, t.node);
        let sched = self.nodes[t.node.index()].schedulable;
        if sched {
            self.bucket_remove(topo, t.node);
        }
        self.nodes[t.node.index()].add(t);
        if sched {
            self.bucket_insert(topo, t.node);
        }
    }

    /// Puts node `id` back at `pos` in its class's bucket `f`, the inverse of the `swap_remove` that took it out of
    /// there (the node moved into its place goes back to the end), and counts its `f` free GPUs again.
    fn unremove(&mut self, topo: &Topology, id: NodeId, f: usize, pos: u32) {
        let t = &topo.nodes[id.index()];
        let cf = &mut self.classes[t.class as usize];
        let b = &mut cf.buckets[f];
        let p = pos as usize;
        if p < b.len() {
            let moved = b[p];
            b.push(moved);
            b[p] = id;
            self.nodes[moved.index()].pos = (b.len() - 1) as u32;
        } else {
            debug_assert_eq!(p, b.len(), "undo position out of range");
            b.push(id);
        }
        cf.free_gpus += f as u64;
        cf.rack_free[t.rack as usize] += f as u32;
        self.total_gpus += f as u64;
        self.nodes[id.index()].pos = pos;
    }

    /// Moves the schedulable nodes of `ids` (distinct) to the back of their free-count buckets, in the order given
    /// (the last at the very back), keeping the order of the other nodes: the placement searches, which take the
    /// first node that fits in a bucket, come to them last among nodes with as many free GPUs.
    ///
    /// Nodes with no free GPU stay where they are: no search reads the order of that bucket (searches for GPUs
    /// start at one free GPU; CPU-only and MIG tasks look at nodes in topology order; [`Free::largest_block`] finds
    /// nothing free there in any order), and a node leaving it is pushed onto its new bucket wherever it sat. On a
    /// full cluster that bucket holds most nodes, and rebuilding it cost more than the rest of the reservation.
    pub(crate) fn send_to_back(&mut self, topo: &Topology, ids: &[NodeId]) {
        // (class, bucket, place in `ids`, node), grouped by bucket in the order given.
        let mut moving: Vec<(u32, usize, usize, NodeId)> = ids
            .iter()
            .enumerate()
            .filter(|(_, id)| self.nodes[id.index()].schedulable && self.nodes[id.index()].mask != 0)
            .map(|(k, id)| (topo.nodes[id.index()].class, self.nodes[id.index()].mask.count_ones() as usize, k, *id))
            .collect();
        moving.sort_unstable();
        for group in moving.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (c, f) = (group[0].0, group[0].1);
            // The nodes moving are marked by the position u32::MAX while their bucket is rebuilt.
            for m in group {
                self.nodes[m.3.index()].pos = u32::MAX;
            }
            if self.logging {
                let before = self.classes[c as usize].buckets[f].clone();
                self.log.push(Undo::Order { class: c, f: f as u32, before });
            }
            let nodes = &self.nodes;
            let b = &mut self.classes[c as usize].buckets[f];
            b.retain(|id| nodes[id.index()].pos != u32::MAX);
            b.extend(group.iter().map(|m| m.3));
            for (p, id) in self.classes[c as usize].buckets[f].iter().enumerate() {
                self.nodes[id.index()].pos = p as u32;
            }
        }
    }

    /// One task of `req` on node `id` as if the node had `mask`, `cpu` and `mem` free (a state the pool reaches once
    /// running jobs end): the checks and the GPU choice a placement search makes on that node (the node's class is
    /// the caller's to check), or `None`.
    pub(crate) fn fit_one_at(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        id: NodeId,
        free: (u64, MilliCpu, MiB),
        specs: Option<&[NodeSpec]>,
    ) -> Option<TaskPlacement> {
        let ts = &req.spec.task;
        debug_assert!(req.hold.is_none() && ts.mig.is_none(), "fit_one_at checks neither holds nor MIG slots");
        let (mask, cpu, mem) = free;
        if !self.nodes[id.index()].schedulable || cpu.0 < ts.cpu.0 || mem.0 < ts.mem.0 {
            return None;
        }
        if !self.node_ok(topo, req, id, specs) {
            return None;
        }
        let nvlink = req.spec.topology == TopologyScope::NvLink;
        let gpu_mask = Self::pick_gpus(&topo.nodes[id.index()], mask, ts.gpus, nvlink)?;
        Some(TaskPlacement { node: id, gpu_mask, mig_slot: None, cpu: ts.cpu, mem: ts.mem })
    }

    /// Free whole GPUs in the given classes.
    pub(crate) fn free_in(&self, classes: &[u32]) -> u64 {
        classes.iter().map(|c| self.classes.get(*c as usize).map_or(0, |cf| cf.free_gpus)).sum()
    }

    /// Largest number of free whole GPUs on one schedulable node of the classes, and in one NVLink domain.
    pub(crate) fn largest_block(&self, topo: &Topology, classes: &[u32]) -> (u32, u32) {
        let mut node_best = 0;
        let mut dom_best = 0;
        for c in classes {
            let Some(cf) = self.classes.get(*c as usize) else {
                continue;
            };
            let f = cf.largest();
            if let Some(b) = cf.buckets.get(f as usize).filter(|b| !b.is_empty()) {
                node_best = node_best.max(f);
                for id in b.iter().take(64) {
                    let free = self.nodes[id.index()].mask;
                    for d in &topo.nodes[id.index()].domains {
                        dom_best = dom_best.max((free & d).count_ones());
                    }
                }
            }
        }
        (node_best, dom_best)
    }

    /// Available resources of a node for a request, with the reservation hold and what this placement already took.
    fn avail(&self, id: NodeId, hold: Option<&Holdback>, used: &[TaskPlacement]) -> (u64, MilliCpu, MiB, u64) {
        let n = &self.nodes[id.index()];
        let (mut mask, mut cpu, mut mem, mut mig) = (n.mask, n.cpu, n.mem, n.mig);
        if let Some(h) = hold.and_then(|h| h.get(&id)) {
            mask &= !h.gpus;
            cpu -= h.cpu;
            mem -= h.mem;
            mig &= !h.mig;
        }
        for u in used.iter().filter(|u| u.node == id) {
            mask &= !u.gpu_mask;
            cpu -= u.cpu;
            mem -= u.mem;
            if let Some(s) = u.mig_slot {
                mig &= !(1 << s);
            }
        }
        (mask, cpu, mem, mig)
    }

    /// Picks `g` GPUs of a free mask: inside one NVLink domain when any fits (best fit: the fullest such domain),
    /// else (unless `nvlink` is required) from the domains with most free GPUs first.
    fn pick_gpus(topo: &NodeTopo, free: u64, g: u32, nvlink: bool) -> Option<u64> {
        if g == 0 {
            return Some(0);
        }
        if free.count_ones() < g {
            return None;
        }
        let mut best: Option<(u32, u64)> = None;
        for d in &topo.domains {
            let f = (free & d).count_ones();
            if f >= g && best.is_none_or(|(bf, _)| f < bf) {
                best = Some((f, free & d));
            }
        }
        if let Some((_, m)) = best {
            return low_bits(m, g);
        }
        if nvlink {
            return None;
        }
        let mut doms: Vec<u64> = topo.domains.iter().map(|d| free & d).filter(|m| *m != 0).collect();
        doms.sort_by_key(|m| std::cmp::Reverse(m.count_ones()));
        let mut out = 0u64;
        let mut left = g;
        for m in doms {
            let take = left.min(m.count_ones());
            out |= low_bits(m, take)?;
            left -= take;
            if left == 0 {
                return Some(out);
            }
        }
        None
    }

    /// Tries to put `k` more tasks of the request on node `id`; on success appends them to `out`.
    fn fit_on_node(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        id: NodeId,
        k: u32,
        out: &mut Vec<TaskPlacement>,
    ) -> bool {
        let nt = &topo.nodes[id.index()];
        let ts = &req.spec.task;
        let (mut mask, mut cpu, mut mem, mut mig) = self.avail(id, req.hold, out);
        let kk = k as u64;
        if cpu.0 < ts.cpu.0.saturating_mul(kk) || mem.0 < ts.mem.0.saturating_mul(kk) {
            return false;
        }
        let nvlink = req.spec.topology == TopologyScope::NvLink;
        if nvlink && k > 1 {
            // The whole set must sit in one domain.
            let total = ts.gpus * k;
            if !nt.domains.iter().any(|d| (mask & d).count_ones() >= total) {
                return false;
            }
        }
        let start = out.len();
        for _ in 0..k {
            let mut tp = TaskPlacement { node: id, gpu_mask: 0, mig_slot: None, cpu: ts.cpu, mem: ts.mem };
            if let Some(p) = ts.mig {
                let slot = nt.mig_slots.iter().enumerate().find(|(i, (_, sp))| *sp == p && mig & (1 << i) != 0);
                match slot {
                    Some((i, _)) => {
                        tp.mig_slot = Some(i as u16);
                        mig &= !(1 << i);
                    }
                    None => {
                        out.truncate(start);
                        return false;
                    }
                }
            } else {
                match Self::pick_gpus(nt, mask, ts.gpus, nvlink) {
                    Some(m) => {
                        tp.gpu_mask = m;
                        mask &= !m;
                    }
                    None => {
                        out.truncate(start);
                        return false;
                    }
                }
            }
            cpu -= ts.cpu;
            mem -= ts.mem;
            out.push(tp);
        }
        true
    }

    fn node_ok(&self, topo: &Topology, req: &Request<'_>, id: NodeId, nodes_spec: Option<&[NodeSpec]>) -> bool {
        if !req.per_node {
            return true;
        }
        let _ = topo;
        match nodes_spec {
            Some(specs) => req.spec.node_eligible(&specs[id.index()]),
            None => true,
        }
    }

    /// Finds a placement for the request, or `None`. Pure: `self` is not changed.
    pub(crate) fn place(&self, topo: &Topology, req: &Request<'_>, specs: Option<&[NodeSpec]>) -> Option<Placement> {
        let ts = &req.spec.task;
        let total_g = ts.gpus as u64 * req.tasks as u64;
        if req.classes.is_empty() || self.free_in(req.classes) < total_g {
            return None;
        }
        // Upper bound from the buckets: how many tasks of `g` GPUs the eligible nodes could hold at most.
        if ts.gpus > 0 && req.hold.is_none() {
            let g = ts.gpus as usize;
            let mut cap = 0u64;
            'classes: for &c in req.classes {
                for (f, b) in self.classes[c as usize].buckets.iter().enumerate().skip(g) {
                    cap += (f / g) as u64 * b.len() as u64;
                    if cap >= req.tasks as u64 {
                        break 'classes;
                    }
                }
            }
            if cap < req.tasks as u64 {
                return None;
            }
        }
        // MIG tasks and CPU-only tasks: first fit over the classes' nodes (rare; no buckets for them).
        if ts.mig.is_some() || ts.gpus == 0 {
            return self.place_first_fit(topo, req, specs);
        }
        // Model groups: one gang never spans two models unless allowed. Classes of one model (the common case) are
        // one group as they are, without building the map.
        let by_model: Vec<Vec<u32>>;
        let groups: SmallVec<[&[u32]; 2]> = match req.classes.split_first() {
            Some((first, rest))
                if req.spec.allow_mixed_models
                    || rest.iter().all(|c| topo.classes[*c as usize].model == topo.classes[*first as usize].model) =>
            {
                smallvec::smallvec![req.classes]
            }
            _ => {
                let mut m: BTreeMap<(u64, usize), Vec<u32>> = BTreeMap::new();
                for &c in req.classes {
                    m.entry(model_rank(topo.classes[c as usize].model)).or_default().push(c);
                }
                by_model = m.into_values().collect();
                by_model.iter().map(Vec::as_slice).collect()
            }
        };
        let scope = if req.tasks <= 1 { TopologyScope::Node } else { req.spec.topology };
        // Tightest level first: one node, one rack, one zone, anywhere; stop at the required scope.
        let single_node_possible = total_g <= 64;
        if single_node_possible {
            for g in &groups {
                if let Some(id) = self.best_fit_node(topo, req, g, req.tasks, specs) {
                    let mut out = Vec::with_capacity(req.tasks as usize);
                    if self.fit_on_node(topo, req, id, req.tasks, &mut out) {
                        return Some(Placement { tasks: out });
                    }
                }
            }
        }
        if matches!(scope, TopologyScope::Node | TopologyScope::NvLink) {
            return None;
        }
        for g in &groups {
            if let Some(p) = self.place_in_racks(topo, req, g, specs) {
                return Some(p);
            }
        }
        if scope == TopologyScope::Rack {
            return None;
        }
        for g in &groups {
            // Zones of this model group, smallest sufficient free first.
            let mut zones: BTreeMap<u32, (u64, Vec<u32>)> = BTreeMap::new();
            for &c in *g {
                let e = zones.entry(topo.classes[c as usize].zone).or_default();
                e.0 += self.classes[c as usize].free_gpus;
                e.1.push(c);
            }
            let mut zl: Vec<(u64, u32, Vec<u32>)> =
                zones.into_iter().filter(|(_, (f, _))| *f >= total_g).map(|(z, (f, cs))| (f, z, cs)).collect();
            zl.sort();
            for (_, _, cs) in &zl {
                if let Some(p) = self.place_spread(topo, req, cs, specs) {
                    return Some(p);
                }
            }
        }
        if scope == TopologyScope::Zone {
            return None;
        }
        for g in &groups {
            if let Some(p) = self.place_spread(topo, req, g, specs) {
                return Some(p);
            }
        }
        None
    }

    /// The schedulable node with the fewest free GPUs that still holds `k` tasks (best fit), over `classes`.
    fn best_fit_node(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        classes: &[u32],
        k: u32,
        specs: Option<&[NodeSpec]>,
    ) -> Option<NodeId> {
        let ts = &req.spec.task;
        let need = (ts.gpus * k) as usize;
        let max = classes.iter().map(|c| self.classes[*c as usize].buckets.len()).max().unwrap_or(0);
        let mut scratch = Vec::new();
        for f in need..max {
            for &c in classes {
                let Some(b) = self.classes[c as usize].buckets.get(f) else {
                    continue;
                };
                for &id in b {
                    let n = &self.nodes[id.index()];
                    if n.cpu.0 < ts.cpu.0 * k as u64 || n.mem.0 < ts.mem.0 * k as u64 {
                        continue;
                    }
                    if !self.node_ok(topo, req, id, specs) {
                        continue;
                    }
                    let held = req.hold.is_some_and(|h| h.contains_key(&id));
                    let nvlink = req.spec.topology == TopologyScope::NvLink;
                    if held || nvlink {
                        scratch.clear();
                        if !self.fit_on_node(topo, req, id, k, &mut scratch) {
                            continue;
                        }
                    }
                    return Some(id);
                }
            }
        }
        None
    }

    /// Gang over several nodes of one rack: the racks with the fewest sufficient free GPUs first; inside a rack the
    /// nodes with most free GPUs first (fewest nodes per gang).
    fn place_in_racks(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        classes: &[u32],
        specs: Option<&[NodeSpec]>,
    ) -> Option<Placement> {
        let need = req.spec.task.gpus as u64 * req.tasks as u64;
        let mut cands: Vec<(u32, u32, u32)> = Vec::new();
        for &c in classes {
            let info = &topo.classes[c as usize];
            if info.rack_names.len() == 1 && info.rack_names[0].is_empty() {
                continue; // nodes without a rack label are not a rack
            }
            for (r, &f) in self.classes[c as usize].rack_free.iter().enumerate() {
                if f as u64 >= need {
                    cands.push((f, c, r as u32));
                }
            }
        }
        cands.sort_unstable();
        let mut out = Vec::with_capacity(req.tasks as usize);
        for (_, c, r) in cands.into_iter().take(64) {
            let mut nodes: Vec<(u32, NodeId)> = topo.classes[c as usize].racks[r as usize]
                .iter()
                .filter(|id| self.nodes[id.index()].schedulable)
                .map(|id| (self.nodes[id.index()].mask.count_ones(), *id))
                .collect();
            // Whole tasks the rack could hold at most; fragmented free GPUs do not make a gang.
            let g = req.spec.task.gpus.max(1);
            if nodes.iter().map(|(f, _)| (f / g) as u64).sum::<u64>() < req.tasks as u64 {
                continue;
            }
            nodes.sort_unstable_by_key(|(f, id)| (std::cmp::Reverse(*f), *id));
            out.clear();
            if self.fill(topo, req, nodes.into_iter().map(|(_, id)| id), &mut out, specs) {
                return Some(Placement { tasks: out });
            }
        }
        None
    }

    /// Gang spread over the classes' nodes, most free GPUs first.
    fn place_spread(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        classes: &[u32],
        specs: Option<&[NodeSpec]>,
    ) -> Option<Placement> {
        let g = req.spec.task.gpus as usize;
        let max = classes.iter().map(|c| self.classes[*c as usize].buckets.len()).max().unwrap_or(0);
        let iter = (g.max(1)..max)
            .rev()
            .flat_map(move |f| {
                classes.iter().flat_map(move |c| self.classes[*c as usize].buckets.get(f).into_iter().flatten())
            })
            .copied();
        let mut out = Vec::with_capacity(req.tasks as usize);
        if self.fill(topo, req, iter, &mut out, specs) {
            Some(Placement { tasks: out })
        } else {
            None
        }
    }

    fn fill(
        &self,
        topo: &Topology,
        req: &Request<'_>,
        nodes: impl Iterator<Item = NodeId>,
        out: &mut Vec<TaskPlacement>,
        specs: Option<&[NodeSpec]>,
    ) -> bool {
        let mut left = req.tasks;
        for id in nodes {
            if !self.node_ok(topo, req, id, specs) {
                continue;
            }
            while left > 0 && self.fit_on_node(topo, req, id, 1, out) {
                left -= 1;
            }
            if left == 0 {
                return true;
            }
        }
        false
    }

    fn place_first_fit(&self, topo: &Topology, req: &Request<'_>, specs: Option<&[NodeSpec]>) -> Option<Placement> {
        let single = req.tasks <= 1 || matches!(req.spec.topology, TopologyScope::Node | TopologyScope::NvLink);
        // Groups that a gang may not leave: model (unless mixing is allowed), then zone / rack by scope.
        let mut groups: BTreeMap<(usize, u32, &str), Vec<NodeId>> = BTreeMap::new();
        for &c in req.classes {
            let info = &topo.classes[c as usize];
            if req.spec.task.mig.is_some() && !info.has_mig {
                continue;
            }
            let model = if req.spec.allow_mixed_models { 0 } else { info.model.map_or(0, |m| m.index() + 1) };
            let zone = if req.spec.topology == TopologyScope::Any { u32::MAX } else { info.zone };
            for (r, nodes) in info.racks.iter().enumerate() {
                let rack = if req.spec.topology == TopologyScope::Rack { info.rack_names[r].as_str() } else { "" };
                groups.entry((model, zone, rack)).or_default().extend(nodes.iter().copied());
            }
        }
        let mut out = Vec::new();
        for nodes in groups.values_mut() {
            nodes.sort_unstable();
            out.clear();
            for &id in nodes.iter() {
                if !self.nodes[id.index()].schedulable || !self.node_ok(topo, req, id, specs) {
                    continue;
                }
                if single {
                    out.clear();
                    if self.fit_on_node(topo, req, id, req.tasks, &mut out) {
                        return Some(Placement { tasks: out });
                    }
                    continue;
                }
                while (out.len() as u32) < req.tasks && self.fit_on_node(topo, req, id, 1, &mut out) {}
                if out.len() as u32 == req.tasks {
                    return Some(Placement { tasks: out });
                }
            }
        }
        None
    }

    /// Checks the bucket index against the node table (for `check_invariants`).
    pub(crate) fn check(&self, topo: &Topology) -> Result<(), String> {
        let mut class_free = vec![0u64; self.classes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if !topo.nodes[i].present {
                continue;
            }
            let t = &topo.nodes[i];
            if n.mask & !t.gpu_mask != 0 {
                return Err(format!("node-{i}: free mask has GPUs the node does not have"));
            }
            if n.schedulable {
                let f = n.mask.count_ones() as usize;
                let cf = &self.classes[t.class as usize];
                if cf.buckets.get(f).and_then(|b| b.get(n.pos as usize)) != Some(&NodeId(i as u32)) {
                    return Err(format!("node-{i}: not in bucket {f} at its position"));
                }
                class_free[t.class as usize] += f as u64;
            }
        }
        for (c, cf) in self.classes.iter().enumerate() {
            if cf.free_gpus != class_free[c] {
                return Err(format!("class {c}: free count {} but nodes hold {}", cf.free_gpus, class_free[c]));
            }
            let total: u64 = cf.buckets.iter().map(|b| b.len() as u64).sum();
            let sched = topo.classes[c].nodes.iter().filter(|id| self.nodes[id.index()].schedulable).count() as u64;
            if total != sched {
                return Err(format!("class {c}: {total} nodes in buckets, {sched} schedulable"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_bits_takes_the_lowest() {
        assert_eq!(low_bits(0b1011_0100, 2), Some(0b0001_0100));
        assert_eq!(low_bits(0b1, 2), None);
    }

    #[test]
    fn gpus_are_picked_inside_one_nvlink_domain_when_possible() {
        let t = NodeTopo {
            gpu_mask: 0xff,
            domains: vec![0x0f, 0xf0],
            mig_slots: vec![],
            cpu: MilliCpu(0),
            mem: MiB(0),
            class: 0,
            rack: 0,
            present: true,
        };
        // Domain 0 has 1 free, domain 1 has 3 free: a 2-GPU task goes to domain 1, a 1-GPU task to domain 0 (best fit).
        let free = 0b0111_0001;
        assert_eq!(Free::pick_gpus(&t, free, 2, true), Some(0b0011_0000));
        assert_eq!(Free::pick_gpus(&t, free, 1, true), Some(0b0000_0001));
        assert_eq!(Free::pick_gpus(&t, free, 4, true), None);
        assert_eq!(Free::pick_gpus(&t, free, 4, false).map(u64::count_ones), Some(4));
    }

    /// `n` schedulable 8-GPU nodes in two classes (T4 and V100) and two racks.
    fn pool(n: u32) -> (Topology, Free) {
        let mut topo = Topology::default();
        let mut free = Free::default();
        for i in 0..n {
            let model = if i % 3 == 0 { GpuModel::T4 } else { GpuModel::V100_16GB };
            let spec = NodeSpec::with_gpus(format!("n{i}"), model, 8, MilliCpu::cores(64), MiB::gib(256))
                .label("rack", &format!("r{}", i % 2));
            topo.add_node(NodeId(i), &spec);
            free.add_node(&topo, NodeId(i));
            free.set_schedulable(&topo, NodeId(i), true);
        }
        (topo, free)
    }

    /// A deterministic pseudo-random source for the tests' rounds: `next(m)` is in `0..m`.
    fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |m| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        }
    }

    fn task(node: u32, gpu_mask: u64, cores: u64) -> TaskPlacement {
        TaskPlacement {
            node: NodeId(node),
            gpu_mask,
            mig_slot: None,
            cpu: MilliCpu::cores(cores),
            mem: MiB::gib(cores),
        }
    }

    /// A pool that logs its changes rolls back to exactly what it was at any mark, bucket order included, whatever
    /// was done since: takes, gives, gives undone to nested marks (last first) and nodes sent to the back of their
    /// buckets; then to what it was when the log started.
    #[test]
    fn a_logged_pool_rolls_back_exactly_to_a_mark() {
        let (topo, mut free) = pool(12);
        free.set_schedulable(&topo, NodeId(5), false);
        let mut next = xorshift(0x853c_49e6_748f_ea9b);
        let mut marks_checked = 0;
        for round in 0..200 {
            // Unlogged changes between rounds scramble the buckets, as the cluster's own starts and ends do.
            for _ in 0..4 {
                let node = next(12) as u32;
                let avail = free.nodes[node as usize].mask;
                if let Some(mask) = low_bits(avail, next(3) as u32 + 1) {
                    free.take(&topo, &task(node, mask, 1));
                } else {
                    let used = topo.nodes[node as usize].gpu_mask & !avail;
                    free.give(&topo, &task(node, low_bits(used, used.count_ones()).unwrap(), 0));
                }
            }
            let start = free.clone();
            free.start_log();
            let ops = 1 + next(40) as usize;
            let at = next(ops as u64) as usize;
            let mut at_mark: Option<(usize, Free)> = None;
            for op in 0..ops {
                if op == at {
                    at_mark = Some((free.mark(), free.clone()));
                }
                let node = next(12) as u32;
                let avail = free.nodes[node as usize].mask;
                let used = topo.nodes[node as usize].gpu_mask & !avail;
                match next(4) {
                    0 => {
                        if let Some(mask) = low_bits(avail, next(4) as u32 + 1) {
                            free.take(&topo, &task(node, mask, next(2)));
                        }
                    }
                    1 => {
                        if let Some(mask) = low_bits(used, 1) {
                            free.give(&topo, &task(node, mask, 0));
                        }
                    }
                    2 => {
                        // Releases given back one by one and undone last first to the marks before each, as the
                        // reservation makes them.
                        let before = free.clone();
                        let mut marks = Vec::new();
                        for k in 0..3 {
                            let n = (node + k * 5) % 12;
                            let used = topo.nodes[n as usize].gpu_mask & !free.nodes[n as usize].mask;
                            marks.push((free.mark(), free.clone()));
                            if let Some(mask) = low_bits(used, 1) {
                                free.give(&topo, &task(n, mask, 0));
                            }
                        }
                        while let Some((mark, then)) = marks.pop() {
                            free.rollback(&topo, mark);
                            assert!(free.same_as(&then), "round {round}: not as before the give");
                        }
                        assert!(free.same_as(&before), "round {round}: the gives left the pool changed");
                    }
                    _ => {
                        let ids: Vec<NodeId> = (0..12).filter(|_| next(3) == 0).map(NodeId).collect();
                        free.send_to_back(&topo, &ids);
                    }
                }
                free.check(&topo).unwrap();
            }
            if let Some((mark, then)) = at_mark {
                free.rollback(&topo, mark);
                free.check(&topo).unwrap();
                assert!(free.same_as(&then), "round {round}: not as at the mark");
                marks_checked += 1;
            }
            free.rollback_all(&topo);
            free.check(&topo).unwrap();
            assert!(free.same_as(&start), "round {round}: not as when the log started");
            assert!(free.log.is_empty() && !free.logging);
        }
        assert!(marks_checked > 150, "{marks_checked}");
    }

    /// A logged give that grows a class's buckets (a node freer than any of its class has been) is rolled back to
    /// the buckets' count before.
    #[test]
    fn rolling_back_a_give_that_grew_the_buckets_shrinks_them_again() {
        let mut topo = Topology::default();
        let mut free = Free::default();
        let spec = NodeSpec::with_gpus("n0", GpuModel::T4, 8, MilliCpu::cores(64), MiB::gib(256));
        topo.add_node(NodeId(0), &spec);
        free.add_node(&topo, NodeId(0));
        // Six GPUs taken before the node becomes schedulable: its class has buckets for 0 to 2 free GPUs only.
        free.take(&topo, &task(0, 0b1111_1100, 1));
        free.set_schedulable(&topo, NodeId(0), true);
        assert_eq!(free.classes[0].buckets().len(), 3);
        let before = free.clone();
        free.start_log();
        free.give(&topo, &task(0, 0b1111_1100, 1));
        assert_eq!(free.classes[0].buckets().len(), 9);
        free.rollback_all(&topo);
        free.check(&topo).unwrap();
        assert_eq!(free.classes[0].buckets().len(), 3);
        assert!(free.same_as(&before));
    }

    #[test]
    fn a_node_moved_to_the_back_is_found_last_among_equals() {
        let (topo, mut free) = pool(6);
        // Nodes 1, 2 and 4 (V100) keep 6 free GPUs each: one bucket, in the order they got there.
        for n in [1, 2, 4] {
            free.take(&topo, &task(n, 0b11, 2));
        }
        let v100 = topo.nodes[1].class as usize;
        assert_eq!(free.classes[v100].buckets()[6], vec![NodeId(1), NodeId(2), NodeId(4)]);
        free.send_to_back(&topo, &[NodeId(1)]);
        assert_eq!(free.classes[v100].buckets()[6], vec![NodeId(2), NodeId(4), NodeId(1)]);
        free.check(&topo).unwrap();
        // Several at once, in the order given (the last at the very back); the others keep their order, and a node
        // of another bucket moves within its own.
        free.take(&topo, &task(5, 0b1111, 4));
        free.send_to_back(&topo, &[NodeId(4), NodeId(5), NodeId(2)]);
        assert_eq!(free.classes[v100].buckets()[6], vec![NodeId(1), NodeId(4), NodeId(2)]);
        assert_eq!(free.classes[v100].buckets()[4], vec![NodeId(5)]);
        free.check(&topo).unwrap();
        // An unschedulable node is in no bucket and stays out of them.
        free.set_schedulable(&topo, NodeId(2), false);
        free.send_to_back(&topo, &[NodeId(2), NodeId(1)]);
        assert_eq!(free.classes[v100].buckets()[6], vec![NodeId(4), NodeId(1)]);
        free.check(&topo).unwrap();
        // A node with no free GPU stays where it is among the full nodes.
        free.take(&topo, &task(5, 0xf0, 4));
        free.take(&topo, &task(1, 0xfc, 6));
        assert_eq!(free.classes[v100].buckets()[0], vec![NodeId(5), NodeId(1)]);
        free.send_to_back(&topo, &[NodeId(5), NodeId(4)]);
        assert_eq!(free.classes[v100].buckets()[0], vec![NodeId(5), NodeId(1)]);
        assert_eq!(free.classes[v100].buckets()[6], vec![NodeId(4)]);
        free.check(&topo).unwrap();
    }

    /// The order of the nodes with no free GPU, which [`Free::send_to_back`] leaves as it is, is read by no search:
    /// pools that differ only in that order place every request alike (whole-GPU tasks and gangs in every scope,
    /// CPU-only tasks), compared after each of 300 rounds of takes and gives.
    #[test]
    fn no_search_reads_the_order_of_nodes_with_no_free_gpu() {
        let (topo, mut a) = pool(12);
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let scopes = [TopologyScope::Any, TopologyScope::Zone, TopologyScope::Rack, TopologyScope::Node];
        let classes: Vec<u32> = (0..topo.classes.len() as u32).collect();
        let mut compared = 0;
        for round in 0..300 {
            // Fill some nodes completely and others in part, so that several nodes share the full bucket.
            let node = next(12) as u32;
            let avail = a.nodes[node as usize].mask;
            let want = if next(2) == 0 { avail.count_ones() } else { next(4) as u32 + 1 };
            if let Some(mask) = low_bits(avail, want).filter(|m| *m != 0) {
                a.take(&topo, &task(node, mask, 1));
            }
            if next(4) == 0 {
                let node = next(12) as u32;
                let used = topo.nodes[node as usize].gpu_mask & !a.nodes[node as usize].mask;
                if let Some(mask) = low_bits(used, 1) {
                    a.give(&topo, &task(node, mask, 1));
                }
            }
            // `b`: the same pool with each class's full bucket reversed.
            let mut b = a.clone();
            for cf in &mut b.classes {
                if let Some(full) = cf.buckets.first_mut() {
                    full.reverse();
                    for (p, id) in full.iter().enumerate() {
                        b.nodes[id.index()].pos = p as u32;
                    }
                }
            }
            b.check(&topo).unwrap();
            for gpus in [0u32, 1, 2, 4, 8] {
                for tasks in [1u32, 2, 3] {
                    for scope in scopes {
                        let mut spec = crate::job::JobSpec::new(crate::ids::TenantId(0), "t", gpus, tasks);
                        spec.topology = scope;
                        spec.task.cpu = MilliCpu::cores(1);
                        spec.task.mem = MiB::gib(1);
                        let req = Request { spec: &spec, tasks, classes: &classes, hold: None, per_node: false };
                        let (pa, pb) = (a.place(&topo, &req, None), b.place(&topo, &req, None));
                        assert_eq!(pa, pb, "round {round}: {gpus} GPUs × {tasks} tasks, {scope}");
                        compared += usize::from(pa.is_some());
                    }
                }
            }
            assert_eq!(a.largest_block(&topo, &classes), b.largest_block(&topo, &classes));
        }
        assert!(compared > 1000, "too few requests placed to compare: {compared}");
    }
}
