//! Elastic growth: when nothing is left waiting, running elastic jobs grow towards their maximum, one task at a
//! time, on the same GPU model (and zone, unless they allow any placement), as their tenants' quotas admit.

use super::{Decision, Pass};
use crate::job::{Job, TaskPlacement, TopologyScope};
use crate::quota::job_qvec;

impl Pass<'_> {
    /// With nothing left waiting, grows running elastic jobs towards their maximum, one task at a time.
    pub(super) fn grow_elastic(&mut self) {
        let st = self.st;
        let mut elastic: Vec<&Job> = st
            .running_elastic
            .iter()
            .map(|id| &*st.jobs[id])
            .filter(|j| {
                j.spec
                    .elastic
                    .is_some_and(|e| (j.run.as_ref().map_or(0, |r| r.placement.tasks.len()) as u32) < e.max_tasks)
            })
            .collect();
        if elastic.is_empty() {
            return;
        }
        elastic.sort_by_key(|j| j.id);
        for j in elastic {
            let e = j.spec.elastic.expect("filtered");
            let run = j.run.as_ref().expect("running");
            let have = run.placement.tasks.len() as u32;
            let model = run.placement.tasks.first().and_then(|tp| st.node_specs[tp.node.index()].gpu_model());
            let mut spec = j.spec.clone();
            if let Some(m) = model {
                spec.gpu_models = crate::job::thin_vec![m];
            }
            spec.topology = TopologyScope::Any;
            let zone = run.placement.tasks.first().map(|tp| st.node_specs[tp.node.index()].zone().to_string());
            let classes: Vec<u32> = self
                .eligible(&spec)
                .iter()
                .copied()
                .filter(|c| {
                    j.spec.topology == TopologyScope::Any
                        || zone.as_deref() == Some(st.topo.zone_name(st.topo.classes[*c as usize].zone))
                })
                .collect();
            if matches!(j.spec.topology, TopologyScope::Node | TopologyScope::NvLink | TopologyScope::Rack) {
                continue; // growing would break the required scope; such jobs stay at their size
            }
            let mut add: Vec<TaskPlacement> = Vec::new();
            for _ in have..e.max_tasks {
                if self.book.admit(&st.shape, spec.tenant, &job_qvec(&spec, 1, model)).is_err() {
                    break;
                }
                let Some(p) = self.place_on(&self.free, &spec, 1, &classes, None) else {
                    break;
                };
                let q = st.placement_qvec(&spec, &p);
                for tp in &p.tasks {
                    self.free.take(&st.topo, tp);
                }
                self.book.charge(&st.shape, spec.tenant, &q, false);
                add.extend(p.tasks);
            }
            if !add.is_empty() {
                self.decisions.push(Decision::Scale { job: j.id, add });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    /// An elastic job that grows onto another node keeps its running row (what victim searches and defragmentation
    /// read) in step with its placement: 3 GPUs on two nodes, no longer 1 GPU on one (found by a review: the row
    /// kept its size at start). `check_invariants` now compares every row with its job's placement.
    #[test]
    fn an_elastic_job_that_grows_keeps_its_running_row_in_step() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 1), node("n1", GpuModel::T4, 2)], &["a"]);
        let mut e = JobSpec::new(t0(), "e", 1, 4);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 4 });
        e.topology = TopologyScope::Any;
        let (cpu, mem) = (e.task.cpu, e.task.mem);
        submit(&mut s, 1, e, 0);
        let tp = |n: u32, mask: u64| TaskPlacement { node: NodeId(n), gpu_mask: mask, mig_slot: None, cpu, mem };
        s.start(JobId(1), Placement { tasks: vec![tp(0, 0b1)] }, false, Time::from_secs(1)).unwrap();
        s.apply(&Decision::Scale { job: JobId(1), add: vec![tp(1, 0b1), tp(1, 0b10)] }, Time::from_secs(2)).unwrap();
        s.check_invariants().unwrap();
        let &(p, i) = s.run_row_of.get(&JobId(1)).unwrap();
        let r = &s.run_rows[p][i];
        assert_eq!((r.gpus, r.node), (3, None));
    }

    #[test]
    fn elastic_jobs_start_small_and_grow_when_the_queue_is_empty() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 4)], &["a"]);
        submit(&mut s, 1, JobSpec::new(t0(), "fill", 2, 1), 0);
        s.step(Time::ZERO).unwrap();
        let mut e = JobSpec::new(t0(), "elastic", 1, 4);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 4 });
        submit(&mut s, 2, e, 1);
        s.step(Time::from_secs(1)).unwrap();
        let tasks = |s: &ClusterState| s.job(JobId(2)).unwrap().run.as_ref().map_or(0, |r| r.placement.tasks.len());
        assert_eq!(tasks(&s), 2, "starts with the largest size that fits (>= min): the 2 free GPUs");
        s.finish(JobId(1), Time::from_secs(5), true).unwrap();
        let ds = s.step(Time::from_secs(6)).unwrap();
        assert!(ds.iter().any(|d| matches!(d, Decision::Scale { job: JobId(2), add } if add.len() == 2)), "{ds:?}");
        assert_eq!(tasks(&s), 4);
        s.check_invariants().unwrap();
    }

    #[test]
    fn elastic_job_is_not_grown_in_the_pass_that_evicts_it() {
        let c = SchedConfig {
            las_thresholds_gpu_s: vec![10],
            preemption: PreemptionConfig { enabled: true, min_run_time: Dur::ZERO, ..Default::default() },
            ..SchedConfig::with_policy(Policy::Las)
        };
        let mut s = cluster(c, vec![node("n", GpuModel::T4, 3)], &["a"]);
        let mut e = JobSpec::new(t0(), "elastic", 1, 2);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 3 });
        e.topology = TopologyScope::Any;
        submit(&mut s, 1, e, 0);
        submit(&mut s, 2, JobSpec::new(t0(), "filler", 1, 1), 0);
        s.step(Time::ZERO).unwrap();
        submit(&mut s, 3, JobSpec::new(t0(), "new", 2, 1), 100);
        // Must not panic applying a Scale of an evicted job.
        s.step(Time::from_secs(100)).unwrap();
        s.check_invariants().unwrap();
    }
}
