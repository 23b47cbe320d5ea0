//! Quota admission: whether a job's tenant may run it now at its smallest size (the quota book of the pass, with
//! guarantees, limits and borrowing), and on which node classes its per-model quota admits it. A job its own
//! tenant's quota holds does not block others; the tenant's own lower-priority (or demoted) jobs may make room.

use super::Pass;
use crate::gpu::GpuModel;
use crate::ids::TenantId;
use crate::job::{Job, JobSpec};
use crate::quota::{job_qvec, Deny};
use crate::tenant::DIM_GPUS;
use std::collections::BTreeMap;

/// Victim searches a pass makes for jobs their own quota holds, at most.
const MAX_QUOTA_SEARCHES: u32 = 4;

/// What quota admission decided for a job.
pub(super) enum Admission {
    /// Its tenant's quota admits it at its smallest size.
    Admitted,
    /// Its tenant's quota holds it (the reason is noted for `explain`).
    Held,
    /// Held, but evictions of its tenant's own jobs were decided to make room in the quota.
    MakingRoom,
}

impl Pass<'_> {
    /// Admits `job` of tenant `t` at its smallest size. A held job of a tenant with a quota may look for victims
    /// among its tenant's own jobs (at most 4 such searches per pass, never while explaining it).
    pub(super) fn admit(&mut self, t: TenantId, job: &Job, sig: u64, traced: bool) -> Admission {
        let st = self.st;
        let spec = &job.spec;
        let min_tasks = spec.elastic.map_or(spec.tasks, |e| e.min_tasks);
        let Err(block) = self.book.admit(&st.shape, t, &job_qvec(spec, min_tasks, None)) else {
            return Admission::Admitted;
        };
        if block.dim == DIM_GPUS {
            self.note_held_gpus(t, block.requested);
        }
        if st.cfg.preemption.enabled
            && self.quota_searches < MAX_QUOTA_SEARCHES
            && !traced
            && st.tenants[t.index()].spec.quota.is_some()
        {
            self.quota_searches += 1;
            let base = self.eligible_sig(spec, sig);
            if self.make_room_in_quota(job, &base) {
                return Admission::MakingRoom;
            }
        }
        self.note(job.id, |p| p.quota_reason(t, block));
        Admission::Held
    }

    /// Notes that tenant `t`'s GPU quota refused a job asking for `gpus` GPUs.
    fn note_held_gpus(&mut self, t: TenantId, gpus: u64) {
        if self.held_gpus.is_empty() {
            self.held_gpus = vec![u64::MAX; self.st.tenants.len()];
        }
        let least = &mut self.held_gpus[t.index()];
        *least = (*least).min(gpus);
    }

    /// Whether [`Pass::admit`] would hold a job of tenant `t` asking for `gpus` GPUs, known without the job: its
    /// tenant's GPU quota refused a job asking for no more earlier in the pass (the book has only taken since), and
    /// no quota-held victim search is left to make (after which `admit` only asks the book).
    pub(super) fn held_by_gpus(&self, t: TenantId, gpus: u64) -> bool {
        self.held_fast
            && !(self.st.cfg.preemption.enabled && self.quota_searches < MAX_QUOTA_SEARCHES)
            && self.held_gpus.get(t.index()).is_some_and(|&least| gpus >= least)
    }

    /// Classes whose model the tenant's per-model quota admits.
    pub(super) fn quota_classes(
        &self,
        t: TenantId,
        spec: &JobSpec,
        tasks: u32,
        classes: &[u32],
    ) -> Result<Vec<u32>, Deny> {
        let shape = &self.st.shape;
        let per_model = shape.tenants[t.index()].0.as_ref().is_some_and(|q| q.dims[3..].iter().any(Option::is_some));
        if !per_model || spec.task.gpus == 0 {
            return Ok(classes.to_vec());
        }
        let mut out = Vec::with_capacity(classes.len());
        let mut last_err = None;
        let mut verdict: BTreeMap<Option<GpuModel>, bool> = BTreeMap::new();
        for &c in classes {
            let m = self.st.topo.classes[c as usize].model;
            let ok = *verdict.entry(m).or_insert_with(|| match self.book.admit(shape, t, &job_qvec(spec, tasks, m)) {
                Ok(_) => true,
                Err(e) => {
                    last_err = Some(e);
                    false
                }
            });
            if ok {
                out.push(c);
            }
        }
        match (out.is_empty(), last_err) {
            (true, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::testkit::*;

    /// Tenant `a` may hold 4 GPUs and holds 3 (job 1). Its GPU quota refuses job 2 (2 GPUs); jobs 3 (4 GPUs) and
    /// 4 (2) ask for no fewer and are counted held from their keys, without a look at them. Job 5 (1 GPU) asks for
    /// fewer: it is looked at, admitted and started. Job 6 (2 GPUs) is counted held from its key (the book has only
    /// taken since job 2 was refused); job 7 (1 GPU) is looked at and refused (`a` now holds 4), and job 8 (3 GPUs)
    /// is counted held from its key. The pass decides as one that looks at every job.
    #[test]
    fn a_job_asking_for_no_fewer_gpus_than_one_the_quota_held_is_held_unseen() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(4, 4))).unwrap();
        submit(&mut s, 1, JobSpec::new(a, "run", 3, 1), 0);
        assert_eq!(started(&s.step(Time::from_secs(1)).unwrap()), vec![1]);
        for (id, gpus) in [(2, 2), (3, 4), (4, 2), (5, 1), (6, 2), (7, 1), (8, 3)] {
            submit(&mut s, id, JobSpec::new(a, "wait", gpus, 1), id);
        }
        let now = Time::from_secs(10);
        let mut fast = run_pass(&s, now, |_| {});
        let mut slow = run_pass(&s, now, |p| p.held_fast = false);
        assert_eq!(started(&fast.decisions), vec![5]);
        assert_eq!(fast.decisions, slow.decisions);
        assert_eq!((fast.stats.considered, slow.stats.considered), (7, 7));
        assert_eq!((fast.held_fast_hits, slow.held_fast_hits), (4, 0));
        fast.decisions.clear();
        slow.decisions.clear();
    }

    /// With preemption on, the first four jobs a pass finds held by their own quota each look for victims among
    /// their tenant's jobs: none of them is counted held from its key, however many GPUs it asks for.
    #[test]
    fn jobs_held_by_their_quota_look_for_victims_before_any_is_held_unseen() {
        let mut s = cluster(preempting(Policy::Fifo, Dur::from_secs(60)), vec![node("n0", GpuModel::T4, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(4, 4))).unwrap();
        submit(&mut s, 1, JobSpec::new(a, "run", 4, 1), 0);
        assert_eq!(started(&s.step(Time::from_secs(1)).unwrap()), vec![1]);
        for id in 2..=7 {
            submit(&mut s, id, JobSpec::new(a, "wait", 2, 1), id);
        }
        let now = Time::from_secs(10);
        let fast = run_pass(&s, now, |_| {});
        let slow = run_pass(&s, now, |p| p.held_fast = false);
        assert_eq!(fast.decisions, slow.decisions);
        assert!(fast.decisions.is_empty(), "job 1 is of the same priority and not demoted: no victim");
        // Jobs 2-5 looked for victims; 6 and 7 were counted held from their keys.
        assert_eq!((fast.quota_searches, fast.held_fast_hits), (4, 2));
    }

    #[test]
    fn quota_guarantee_limit_and_borrowing() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("team-a").quota(Quota::gpus(4, 6))).unwrap();
        let b = s.add_tenant(TenantSpec::new("team-b").quota(Quota::gpus(8, 8))).unwrap();
        // Unguaranteed capacity: 16 - 12 = 4 GPUs in the root pool.
        submit(&mut s, 1, JobSpec::new(a, "a1", 4, 1), 0);
        submit(&mut s, 2, JobSpec::new(a, "a2", 2, 1), 1); // borrows 2 from the root pool
        submit(&mut s, 3, JobSpec::new(a, "a3", 1, 1), 2); // over the limit of 6
        submit(&mut s, 4, JobSpec::new(b, "b1", 8, 1), 3);
        let ds = s.step(Time::from_secs(5)).unwrap();
        assert_eq!(started(&ds), vec![1, 2, 4], "a quota-held job does not block others");
        assert!(ds.iter().any(|d| matches!(d, Decision::Start { job: JobId(2), borrowed: true, .. })));
        assert!(ds.iter().any(|d| matches!(d, Decision::Start { job: JobId(1), borrowed: false, .. })));
        let e = explain(&s, JobId(3), Time::from_secs(5)).unwrap();
        match &e.reason {
            PendingReason::Quota { tenant, block } => {
                assert_eq!(tenant, "team-a");
                assert_eq!((block.used, block.guarantee, block.limit, block.requested), (6, 4, 6, 1));
            }
            r => panic!("{r:?}"),
        }
        assert!(e.message.contains("team-a uses 6 of 4 guaranteed gpus"), "{}", e.message);
        s.check_invariants().unwrap();
    }

    #[test]
    fn cohort_members_lend_unused_guarantee_and_reclaim_it() {
        let c = preempting(Policy::Fifo, Dur::from_secs(60));
        let mut s = cluster(c, vec![node("n0", GpuModel::T4, 8), node("n1", GpuModel::T4, 8)], &[]);
        let a = s.add_tenant(TenantSpec::new("a").quota(Quota::gpus(8, 16)).cohort("lab")).unwrap();
        let b = s.add_tenant(TenantSpec::new("b").quota(Quota::gpus(8, 16)).cohort("lab")).unwrap();
        for i in 0..4 {
            let mut j = JobSpec::new(b, "b", 4, 1);
            j.checkpoint_interval = Some(Dur::from_secs(30 + i * 10));
            submit(&mut s, 10 + i, j, 0);
        }
        let ds = s.step(Time::ZERO).unwrap();
        assert_eq!(started(&ds).len(), 4, "b borrows a's idle guarantee");
        assert_eq!(ds.iter().filter(|d| matches!(d, Decision::Start { borrowed: true, .. })).count(), 2);
        submit(&mut s, 1, JobSpec::new(a, "owner", 4, 1), 10);
        // Too young to preempt at t=30.
        let ds = s.step(Time::from_secs(30)).unwrap();
        assert!(ds.is_empty(), "{ds:?}");
        // At t=100: reclaim one borrowed job, the one that loses least work since its last checkpoint.
        let ds = schedule(&s, Time::from_secs(100));
        let victims: Vec<JobId> = ds
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { job, reason: PreemptReason::QuotaReclaim { owner }, .. } if *owner == a => {
                    Some(*job)
                }
                _ => None,
            })
            .collect();
        assert_eq!(victims.len(), 1, "{ds:?}");
        let v = s.job(victims[0]).unwrap();
        assert!(v.run.as_ref().unwrap().borrowed);
        s.apply(&ds[0], Time::from_secs(100)).unwrap();
        let ds = s.step(Time::from_secs(101)).unwrap();
        assert_eq!(started(&ds), vec![1]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn elastic_jobs_are_admitted_at_the_size_they_are_placed() {
        let mut s = cluster(cfg(Policy::Fifo), vec![node("n", GpuModel::T4, 8)], &[]);
        let t = s.add_tenant(TenantSpec::new("q").quota(Quota::gpus(2, 3))).unwrap();
        let mut e = JobSpec::new(t, "elastic", 1, 6);
        e.elastic = Some(Elastic { min_tasks: 1, max_tasks: 6 });
        submit(&mut s, 1, e, 0);
        s.step(Time::ZERO).unwrap();
        assert_eq!(s.tenant_usage(t).gpus, 3, "placed at the largest size the limit of 3 GPUs admits");
        s.check_invariants().unwrap();
    }
}
