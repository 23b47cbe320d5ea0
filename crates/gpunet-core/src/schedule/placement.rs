//! Placement: the node classes a job may use (selector, tolerations, GPU models; memoised by signature), whether it
//! can ever fit on them, the placement search on the pass's free pool (elastic jobs at the largest size that fits
//! and is admitted), and committing a start to the pass's copies of the free pool and the quota book.

use super::{Decision, Pass, PendingReason};
use crate::alloc::{Free, Holdback, Request};
use crate::fxhash::FxHasher;
use crate::gpu::GpuModel;
use crate::job::{Job, JobSpec, Placement, TopologyScope};
use crate::node::labels;
use crate::quota::job_qvec;
use crate::state::ClusterState;
use crate::units::Time;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

/// Signature, GPUs per task, tasks, topology, CPU, memory, mixed models: what decides whether a job can ever fit.
pub(super) type ShapeKey = (u64, u32, u32, u32, u64, u64, bool);

/// The placement-constraint signature of a job: jobs with the same one have the same eligible node classes.
pub(crate) fn spec_sig(spec: &JobSpec) -> u64 {
    if spec.gpu_models.is_empty() && spec.task.mig.is_none() && spec.selector.is_empty() && spec.tolerations.is_empty()
    {
        return (spec.task.gpus > 0) as u64; // the common case needs no hashing
    }
    let mut h = FxHasher::default();
    spec.gpu_models.hash(&mut h);
    spec.task.mig.hash(&mut h);
    spec.selector.hash(&mut h);
    spec.tolerations.hash(&mut h);
    (spec.task.gpus > 0).hash(&mut h);
    h.finish() | 2
}

/// Placement helper for tests and tools: where would this job go on the current free resources, ignoring quota and
/// queue order?
pub fn dry_run_placement(state: &ClusterState, spec: &JobSpec) -> Option<Placement> {
    let mut p = Pass::new(state, Time::ZERO, None);
    let classes = p.eligible(spec);
    p.place_on(&p.free, spec, spec.tasks, &classes, None)
}

impl Pass<'_> {
    /// Classes that pass the job's selector, tolerations and model list.
    pub(super) fn eligible(&mut self, spec: &JobSpec) -> Rc<[u32]> {
        self.eligible_sig(spec, spec_sig(spec))
    }

    pub(super) fn eligible_sig(&mut self, spec: &JobSpec, sig: u64) -> Rc<[u32]> {
        if let Some(c) = self.elig.get(&sig) {
            return c.clone();
        }
        let topo = &self.st.topo;
        let v: Rc<[u32]> = topo
            .classes
            .iter()
            .enumerate()
            .filter(|(_, c)| spec.node_eligible(&c.spec))
            .map(|(i, _)| i as u32)
            .collect();
        self.elig.insert(sig, v.clone());
        v
    }

    /// Why no node could ever hold the job, if so.
    fn never_fits(&self, spec: &JobSpec, classes: &[u32]) -> Option<String> {
        never_fits_in(&self.st.topo, spec, classes)
    }

    /// `never_fits`, memoised by everything it depends on.
    pub(super) fn never_fits_memo(&mut self, spec: &JobSpec, sig: u64, min_tasks: u32, base: &[u32]) -> Option<String> {
        let nkey = (
            sig,
            spec.task.gpus,
            min_tasks,
            spec.topology as u32,
            spec.task.cpu.0,
            spec.task.mem.0,
            spec.allow_mixed_models,
        );
        match self.never.get(&nkey) {
            Some(v) => v.clone(),
            None => {
                let v = self.never_fits(spec, base);
                self.never.insert(nkey, v.clone());
                v
            }
        }
    }

    /// The placement request for `tasks` tasks of `spec` on `classes`, keeping off `hold`.
    fn request<'r>(
        &self,
        spec: &'r JobSpec,
        tasks: u32,
        classes: &'r [u32],
        hold: Option<&'r Holdback>,
    ) -> Request<'r> {
        Request { spec, tasks, classes, hold, per_node: spec.selector.iter().any(|s| s.key == labels::RACK) }
    }

    /// One placement search on the pool `free` (counted in the pass's stats).
    pub(super) fn place_on(
        &self,
        free: &Free,
        spec: &JobSpec,
        tasks: u32,
        classes: &[u32],
        hold: Option<&Holdback>,
    ) -> Option<Placement> {
        self.attempts.set(self.attempts.get() + 1);
        let req = self.request(spec, tasks, classes, hold);
        free.place(&self.st.topo, &req, Some(&self.st.node_specs))
    }

    /// Places with the desired number of tasks, or for an elastic job the largest size, down to its minimum, that
    /// both fits and the tenant's quota admits.
    pub(super) fn try_place(&self, job: &Job, classes: &[u32], hold: Option<&Holdback>) -> Option<Placement> {
        if job.spec.prefer_spot {
            // Spot first: the same search on the spot classes alone, then on all.
            let topo = &self.st.topo;
            let spot: Vec<u32> = classes
                .iter()
                .copied()
                .filter(|c| topo.classes[*c as usize].spec.lifecycle() == crate::node::Lifecycle::Spot)
                .collect();
            if !spot.is_empty() && spot.len() < classes.len() {
                if let Some(p) = self.try_place_on(job, &spot, hold) {
                    return Some(p);
                }
            }
        }
        self.try_place_on(job, classes, hold)
    }

    fn try_place_on(&self, job: &Job, classes: &[u32], hold: Option<&Holdback>) -> Option<Placement> {
        let spec = &job.spec;
        let Some(e) = spec.elastic else {
            return self.place_on(&self.free, spec, spec.tasks, classes, hold);
        };
        for n in (e.min_tasks..=spec.tasks).rev() {
            if n > e.min_tasks && self.book.admit(&self.st.shape, spec.tenant, &job_qvec(spec, n, None)).is_err() {
                continue;
            }
            if let Some(p) = self.place_on(&self.free, spec, n, classes, hold) {
                if n == e.min_tasks
                    || self.book.admit(&self.st.shape, spec.tenant, &self.st.placement_qvec(spec, &p)).is_ok()
                {
                    return Some(p);
                }
            }
        }
        None
    }

    /// Starts `job` on `placement` in this pass: takes its resources from the pass's free pool, charges its
    /// tenant's quota (borrowed if beyond the guarantee) and records the start (`backfill`: behind a blocked head).
    pub(super) fn commit_start(&mut self, job: &Job, placement: Placement, backfill: bool) {
        let st = self.st;
        let q = st.placement_qvec(&job.spec, &placement);
        let borrowed = self.book.admit(&st.shape, job.spec.tenant, &q).unwrap_or(true);
        for t in &placement.tasks {
            self.free.take(&st.topo, t);
        }
        self.book.charge(&st.shape, job.spec.tenant, &q, false);
        if st.cfg.backfill {
            self.started.push((ClusterState::est_end(job, self.now), job.id, placement.clone()));
        }
        self.stats.started += 1;
        if backfill {
            self.stats.backfilled += 1;
        }
        self.note(job.id, |_| PendingReason::Starting);
        self.decisions.push(Decision::Start { job: job.id, placement, borrowed });
    }

    /// Undoes the start [`Pass::commit_start`] has just made (`mark`: the pass's pool before it), for a job a queue
    /// view's pass looks at past the walk's end only to explain it. Cold: only explaining passes come here, and the
    /// walk it sits in is the hot loop of every pass.
    #[cold]
    #[inline(never)]
    pub(super) fn undo_start(&mut self, mark: usize) {
        let st = self.st;
        let Some(Decision::Start { job, placement, .. }) = self.decisions.last() else { return };
        if let Some(j) = st.jobs.get(job) {
            let q = st.placement_qvec(&j.spec, placement);
            self.book.charge(&st.shape, j.spec.tenant, &q, true);
        }
        self.decisions.pop();
        self.free.rollback(&st.topo, mark);
        if st.cfg.backfill {
            self.started.pop();
        }
        self.stats.started = self.stats.started.saturating_sub(1);
        self.stats.backfilled = self.stats.backfilled.saturating_sub(1);
    }
}

/// Why no node of the given classes could ever hold the job (whatever runs now), if so.
fn never_fits_in(topo: &crate::alloc::Topology, spec: &JobSpec, classes: &[u32]) -> Option<String> {
    if classes.is_empty() {
        // The node capabilities gpunet itself asks for (a job with a container image needs a node that runs
        // containers) are named: the user did not write them.
        let implied: Vec<String> = spec
            .selector
            .iter()
            .filter(|t| t.key.starts_with("gpunet.io/") && t.values.len() == 1)
            .map(|t| format!("{}={}", t.key, t.values[0]))
            .collect();
        let has_implied = |c: &crate::alloc::ClassInfo| {
            spec.selector.iter().filter(|t| t.key.starts_with("gpunet.io/")).all(|t| t.matches(&c.spec))
        };
        if !implied.is_empty() && !topo.classes.iter().any(has_implied) {
            return Some(format!(
                "no node matches its selector, tolerations and GPU models: its container image needs a node \
                 labelled {} (an agent with an OCI runtime and the image tools)",
                implied.join(", ")
            ));
        }
        return Some("no node matches its selector, tolerations and GPU models".into());
    }
    let ts = &spec.task;
    let fit: Vec<&crate::alloc::ClassInfo> = classes
        .iter()
        .map(|c| &topo.classes[*c as usize])
        .filter(|c| c.max_gpus >= ts.gpus && c.max_cpu >= ts.cpu && c.max_mem >= ts.mem)
        .collect();
    if fit.is_empty() {
        return Some(format!("no eligible node has {} GPUs, {} and {} for one task", ts.gpus, ts.cpu, ts.mem));
    }
    let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
    let total = ts.gpus as u64 * min_tasks as u64;
    if ts.gpus == 0 {
        return None;
    }
    match spec.topology {
        TopologyScope::NvLink if min_tasks > 1 || spec.tasks > 1 => {
            if !fit.iter().any(|c| c.max_domain as u64 >= total) {
                return Some(format!("no node has {total} GPUs in one NVLink domain"));
            }
        }
        TopologyScope::NvLink => {
            if !fit.iter().any(|c| c.max_domain >= ts.gpus) {
                return Some(format!("no node has {} GPUs in one NVLink domain", ts.gpus));
            }
        }
        TopologyScope::Node => {
            if !fit.iter().any(|c| c.max_gpus as u64 >= total) {
                return Some(format!("no node has {total} GPUs"));
            }
        }
        _ => {
            // Per model group (and per zone unless Any), enough GPUs in total.
            let mut groups: BTreeMap<(Option<GpuModel>, Option<u32>), u64> = BTreeMap::new();
            for c in &fit {
                let m = if spec.allow_mixed_models { None } else { c.model };
                let z = if spec.topology == TopologyScope::Any { None } else { Some(c.zone) };
                *groups.entry((m, z)).or_default() += c.total_gpus;
            }
            if !groups.values().any(|g| *g >= total) {
                return Some(format!(
                    "needs {total} GPUs of one model in {}; the largest such group has {}",
                    spec.topology,
                    groups.values().max().copied().unwrap_or(0)
                ));
            }
        }
    }
    None
}

/// Why no node of the cluster could ever hold a job with this spec (however much is free), if so: "never fits" of
/// the scheduling pass, for refusing such a job at submit. `None` on a cluster without nodes (they may come).
pub fn never_fits(state: &ClusterState, spec: &JobSpec) -> Option<String> {
    let topo = &state.topo;
    if topo.classes.is_empty() {
        return None;
    }
    let classes: Vec<u32> =
        topo.classes.iter().enumerate().filter(|(_, c)| spec.node_eligible(&c.spec)).map(|(i, _)| i as u32).collect();
    let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
    if min_tasks == 0 {
        return None;
    }
    never_fits_in(topo, spec, &classes)
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    #[test]
    fn gangs_are_all_or_nothing_and_never_mix_models() {
        let mut s = cluster(
            cfg(Policy::Fifo),
            vec![node("v", GpuModel::V100_16GB, 8), node("a", GpuModel::A100_80GB, 8)],
            &["a"],
        );
        submit(&mut s, 1, JobSpec::new(t0(), "gang", 8, 2), 0);
        let ds = s.step(Time::ZERO).unwrap();
        assert!(started(&ds).is_empty(), "a V100+A100 gang must not be formed");
        match explain(&s, JobId(1), Time::ZERO).unwrap().reason {
            PendingReason::NeverFits { detail } => {
                assert!(detail.contains("16 GPUs of one model"), "{detail}")
            }
            r => panic!("{r:?}"),
        }
        let mut mixed = JobSpec::new(t0(), "mixed", 8, 2);
        mixed.allow_mixed_models = true;
        submit(&mut s, 2, mixed, 1);
        assert_eq!(started(&s.step(Time::from_secs(2)).unwrap()), vec![2]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn best_fit_packs_into_the_fullest_node() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "six", 6, 1), 0);
        s.step(Time::ZERO).unwrap();
        let six_node = s.job(JobId(1)).unwrap().run.as_ref().unwrap().placement.tasks[0].node;
        submit(&mut s, 2, JobSpec::new(t0(), "two", 2, 1), 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        match &ds[0] {
            Decision::Start { placement, .. } => assert_eq!(placement.tasks[0].node, six_node),
            d => panic!("{d:?}"),
        }
        submit(&mut s, 3, JobSpec::new(t0(), "eight", 8, 1), 2);
        assert_eq!(started(&s.step(Time::from_secs(2)).unwrap()), vec![3], "packing kept a whole node free");
    }

    #[test]
    fn gangs_stay_in_one_rack_and_nvlink_domain_when_possible() {
        let mk = |n: &str, rack: &str| {
            NodeSpec::with_gpus(n, GpuModel::A100_80GB, 8, MilliCpu::cores(64), MiB::gib(1024))
                .label("zone", "z")
                .label("rack", rack)
        };
        let mut s =
            cluster(cfg(Policy::Fifo), vec![mk("a1", "ra"), mk("b1", "rb"), mk("b2", "rb"), mk("a2", "ra")], &["t"]);
        submit(&mut s, 1, JobSpec::new(t0(), "fill-a1", 4, 1), 0);
        s.step(Time::ZERO).unwrap();
        let mut g = JobSpec::new(t0(), "gang", 8, 2);
        g.topology = TopologyScope::Rack;
        submit(&mut s, 2, g, 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        let Decision::Start { placement, .. } = &ds[0] else { panic!("{ds:?}") };
        let racks: BTreeSet<&str> = placement.tasks.iter().map(|t| s.node_specs[t.node.index()].rack()).collect();
        assert_eq!(racks.len(), 1);
        // NVLink requirement on PCIe GPUs never fits.
        let mut s2 = cluster(cfg(Policy::Fifo), vec![node("t", GpuModel::T4, 4)], &["a"]);
        let mut nv = JobSpec::new(t0(), "nv", 2, 1);
        nv.topology = TopologyScope::NvLink;
        submit(&mut s2, 1, nv, 0);
        assert!(started(&s2.step(Time::ZERO).unwrap()).is_empty());
        let e = explain(&s2, JobId(1), Time::ZERO).unwrap();
        assert!(e.message.contains("NVLink"), "{}", e.message);
    }

    #[test]
    fn never_fits_names_why_a_job_could_never_run_and_spares_jobs_that_could() {
        let s = cluster(
            cfg(Policy::Fifo),
            vec![node("a", GpuModel::A100_80GB, 8), node("b", GpuModel::A100_80GB, 8)],
            &["t"],
        );
        // 9 GPUs in one task on 8-GPU nodes: never, whatever is free.
        let why = super::never_fits(&s, &JobSpec::new(t0(), "nine", 9, 1)).expect("never fits");
        assert!(why.contains("9 GPUs"), "{why}");
        // Two tasks of 8 fit across the two nodes; one of 8 fits too.
        assert_eq!(super::never_fits(&s, &JobSpec::new(t0(), "two", 8, 2)), None);
        assert_eq!(super::never_fits(&s, &JobSpec::new(t0(), "one", 8, 1)), None);
        let mut h100 = JobSpec::new(t0(), "h100", 1, 1);
        h100.gpu_models = crate::job::thin_vec![GpuModel::H100_80GB];
        assert!(super::never_fits(&s, &h100).is_some_and(|w| w.contains("GPU models")));
        // A job with a container image: the label its image implies is named, since the user did not write it.
        let mut image = JobSpec::new(t0(), "image", 1, 1);
        image.selector = crate::job::thin_vec![SelectorTerm::eq("gpunet.io/containers", "true")];
        let why = super::never_fits(&s, &image).unwrap();
        assert!(why.contains("its container image needs a node labelled gpunet.io/containers=true"), "{why}");
        // A cluster without nodes yet refuses nothing: they may come.
        let empty = cluster(cfg(Policy::Fifo), vec![], &["t"]);
        assert_eq!(super::never_fits(&empty, &JobSpec::new(t0(), "nine", 9, 1)), None);
    }

    #[test]
    fn selectors_and_spot_taints_are_honoured() {
        let spot = node("spot", GpuModel::V100_16GB, 8).label("lifecycle", "spot").taint("lifecycle", "spot");
        let mut s = cluster(cfg(Policy::Fifo), vec![node("a100", GpuModel::A100_80GB, 8), spot], &["a"]);
        let mut v = JobSpec::new(t0(), "v100", 1, 1);
        v.selector = crate::job::thin_vec![SelectorTerm::eq("gpu-type", "v100")];
        submit(&mut s, 1, v.clone(), 0);
        assert!(started(&s.step(Time::ZERO).unwrap()).is_empty(), "the only V100 node is spot");
        v.tolerations = crate::job::thin_vec![Toleration { key: "lifecycle".into(), value: Some("spot".into()) }];
        submit(&mut s, 2, v, 1);
        let ds = s.step(Time::from_secs(1)).unwrap();
        assert_eq!(started(&ds), vec![2]);
        let e = explain(&s, JobId(1), Time::from_secs(1)).unwrap();
        assert!(matches!(e.reason, PendingReason::NeverFits { .. }), "{e:?}");
    }

    #[test]
    fn a_job_preferring_spot_goes_there_first_and_elsewhere_when_spot_is_full() {
        let spot = node("spot", GpuModel::A100_80GB, 1).label("lifecycle", "spot").taint("lifecycle", "spot");
        let mut s = cluster(cfg(Policy::Fifo), vec![node("od", GpuModel::A100_80GB, 1), spot], &["a"]);
        let mut j = JobSpec::new(t0(), "j", 1, 1);
        j.tolerations = crate::job::thin_vec![Toleration { key: "lifecycle".into(), value: Some("spot".into()) }];
        j.prefer_spot = true;
        submit(&mut s, 1, j.clone(), 0);
        submit(&mut s, 2, j, 0);
        let ds = s.step(Time::ZERO).unwrap();
        let node_of = |id: u64| {
            ds.iter().find_map(|d| match d {
                Decision::Start { job, placement, .. } if job.0 == id => {
                    Some(s.node(placement.tasks[0].node).unwrap().spec.name.clone())
                }
                _ => None,
            })
        };
        assert_eq!(node_of(1).as_deref(), Some("spot"), "the first goes to spot although on-demand is as free");
        assert_eq!(node_of(2).as_deref(), Some("od"), "spot is full: the second goes elsewhere");
    }

    #[test]
    fn mig_slices_are_allocated_one_per_task() {
        let mut n = node("mig", GpuModel::A100_80GB, 2);
        n.gpus[0].mig = vec!["3g.40gb".parse().unwrap(), "3g.40gb".parse().unwrap()];
        let mut s = cluster(cfg(Policy::Fifo), vec![n], &["a"]);
        for i in 0..3 {
            let mut j = JobSpec::new(t0(), "m", 0, 1);
            j.task.mig = Some("3g.40gb".parse().unwrap());
            submit(&mut s, i + 1, j, i);
        }
        submit(&mut s, 10, JobSpec::new(t0(), "whole", 1, 1), 10);
        let ds = s.step(Time::from_secs(20)).unwrap();
        assert_eq!(started(&ds), vec![1, 2], "two slices, the third waits (strict FIFO)");
        s.check_invariants().unwrap();
    }

    #[test]
    fn cpu_only_gangs_keep_their_zone() {
        let mk = |n: &str, z: &str| {
            NodeSpec::with_gpus(n, GpuModel::T4, 0, MilliCpu::cores(2), MiB::gib(8)).label("zone", z)
        };
        let mut s = cluster(cfg(Policy::Fifo), vec![mk("a", "z1"), mk("b", "z2")], &["t"]);
        let mut j = JobSpec::new(t0(), "cpu", 0, 2).cpu_mem(MilliCpu::cores(2), MiB::gib(1));
        j.topology = TopologyScope::Zone;
        submit(&mut s, 1, j, 0);
        assert!(started(&s.step(Time::ZERO).unwrap()).is_empty(), "one task per zone fits, the gang does not");
    }
}
