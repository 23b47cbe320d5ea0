//! Quota accounting: usage per tenant, per cohort and of the root pool, and admission.
//!
//! See [`crate::tenant`] for the model. Only the dimensions a tenant's quota constrains count towards its cohort and
//! the root pool. The book is small (one vector per tenant and cohort) so a scheduling pass clones it.

use crate::gpu::GpuModel;
use crate::ids::TenantId;
use crate::job::JobSpec;
use crate::tenant::{dim_model, dim_name, QVec, Quota, DIM_CPU, DIM_GPUS, DIM_MEM, QDIMS};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Static quota facts: who is in which cohort and what they are guaranteed.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuotaShape {
    /// Per tenant: its quota and cohort index.
    pub(crate) tenants: Vec<(Option<Quota>, Option<u32>)>,
    /// Per cohort: name and summed guarantee of members.
    pub(crate) cohorts: Vec<(String, QVec)>,
    /// Cluster capacity (schedulable nodes) minus all guarantees, floored at 0.
    pub(crate) unguaranteed: QVec,
}

/// Dynamic usage.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuotaBook {
    /// Every dimension, constrained or not.
    pub(crate) usage: Vec<QVec>,
    /// Per cohort: members' usage in dimensions they constrain.
    pub(crate) cohort_usage: Vec<QVec>,
    /// What groups (cohorts, and tenants without cohort) borrow from the root pool.
    pub(crate) root_borrowed: QVec,
}

/// A quota refusal: the dimension and what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deny {
    pub(crate) dim: usize,
    pub(crate) requested: u64,
}

/// Why a job is held by quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaBlock {
    /// Dimension name (`gpus`, `cpu_milli`, `memory_mib`, `gpus/A100-80GB`).
    pub resource: String,
    /// Tenant's current use.
    pub used: u64,
    /// What the job asks for.
    pub requested: u64,
    /// Tenant's guarantee.
    pub guarantee: u64,
    /// Tenant's limit.
    pub limit: u64,
    /// What could be borrowed now (from the cohort and the root pool).
    pub borrowable: u64,
    /// Cohort name, if any.
    pub cohort: Option<String>,
}

impl fmt::Display for QuotaBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let src = match &self.cohort {
            Some(c) => format!("cohort {c} and the shared pool have {} idle to lend", self.borrowable),
            None => format!("the shared pool has {} idle to lend", self.borrowable),
        };
        if self.used + self.requested > self.limit {
            write!(
                f,
                "uses {} of {} guaranteed {} (limit {}); this job needs {} more, over the limit",
                self.used, self.guarantee, self.resource, self.limit, self.requested
            )
        } else {
            write!(
                f,
                "uses {} of {} guaranteed {} (limit {}); this job needs {} more; {}",
                self.used, self.guarantee, self.resource, self.limit, self.requested, src
            )
        }
    }
}

/// The quota request vector of a job placed on `model` (None: model not known yet, per-model dimension not set).
pub(crate) fn job_qvec(spec: &JobSpec, tasks: u32, model: Option<GpuModel>) -> QVec {
    let mut v = [0u64; QDIMS];
    let r = spec.task.resources().times(tasks);
    v[DIM_GPUS] = r.gpus as u64;
    v[DIM_CPU] = r.cpu.0;
    v[DIM_MEM] = r.mem.0;
    if let Some(m) = model {
        v[dim_model(m)] = r.gpus as u64;
    }
    v
}

impl QuotaBook {
    fn excess(used: u64, guarantee: u64) -> u64 {
        used.saturating_sub(guarantee)
    }

    /// Checks whether tenant `t` may take `req`; `Ok(borrowed)` says whether it goes beyond its guarantee. A refusal
    /// is a plain value; [`QuotaBook::explain_deny`] turns it into a [`QuotaBlock`] with names when someone asks.
    pub(crate) fn admit(&self, shape: &QuotaShape, t: TenantId, req: &QVec) -> Result<bool, Deny> {
        let (quota, cohort) = &shape.tenants[t.index()];
        let Some(q) = quota else { return Ok(false) };
        let mut borrowed = false;
        for (d, lim) in q.dims.iter().enumerate() {
            let Some(lim) = lim else { continue };
            let r = req[d];
            if r == 0 {
                continue;
            }
            let used = self.usage[t.index()][d];
            let new = used.saturating_add(r);
            if new > lim.limit {
                return Err(Deny { dim: d, requested: r });
            }
            if new <= lim.guarantee {
                continue;
            }
            borrowed = true;
            let (old_ex, new_ex) = match cohort {
                Some(c) => {
                    let cu = self.cohort_usage[*c as usize][d];
                    let cg = shape.cohorts[*c as usize].1[d];
                    (Self::excess(cu, cg), Self::excess(cu + r, cg))
                }
                None => (Self::excess(used, lim.guarantee), Self::excess(new, lim.guarantee)),
            };
            let root_new = self.root_borrowed[d] - old_ex + new_ex;
            if root_new > shape.unguaranteed[d] {
                return Err(Deny { dim: d, requested: r });
            }
        }
        Ok(borrowed)
    }

    /// The fewest GPUs tenant `t` must give back (its own running jobs evicted) before its GPU dimension admits `req`
    /// (`u64::MAX`: no number will do; 0 for a tenant whose quota sets no GPU limit). Only that dimension is looked
    /// at, so it is a lower bound on what any eviction that lets [`QuotaBook::admit`] take `req` gives back.
    pub(crate) fn gpu_shortfall(&self, shape: &QuotaShape, t: TenantId, req: &QVec) -> u64 {
        let (quota, cohort) = &shape.tenants[t.index()];
        let Some(lim) = quota.as_ref().and_then(|q| q.dims[DIM_GPUS]) else { return 0 };
        let (d, r) = (DIM_GPUS, req[DIM_GPUS]);
        if r == 0 {
            return 0;
        }
        let used = self.usage[t.index()][d];
        if r > lim.limit {
            return u64::MAX;
        }
        // Within the limit: `used − x + r ≤ limit`.
        let for_limit = (used + r).saturating_sub(lim.limit);
        // Then within the guarantee (nothing borrowed) …
        let within = (used + r).saturating_sub(lim.guarantee);
        // … or borrowing what the root pool can lend once the group's excess over its guarantee shrinks by what is
        // given back: `excess(u − x + r) ≤ unguaranteed − (what other groups borrow)`, `u` the group's usage.
        let (u, g) = match cohort {
            Some(c) => (self.cohort_usage[*c as usize][d], shape.cohorts[*c as usize].1[d]),
            None => (used, lim.guarantee),
        };
        let others = self.root_borrowed[d].saturating_sub(Self::excess(u, g));
        let for_root = match shape.unguaranteed[d].checked_sub(others) {
            Some(room) => (u + r).saturating_sub(g.saturating_add(room)),
            None => u64::MAX,
        };
        let x = for_limit.max(within.min(for_root));
        // What the tenant holds is all it can give back.
        if x > used {
            u64::MAX
        } else {
            x
        }
    }

    /// The numbers and names behind a refusal.
    pub(crate) fn explain_deny(&self, shape: &QuotaShape, t: TenantId, deny: Deny) -> QuotaBlock {
        let (quota, cohort) = &shape.tenants[t.index()];
        let lim = quota.as_ref().and_then(|q| q.dims[deny.dim]).map_or((0, 0), |l| (l.guarantee, l.limit));
        QuotaBlock {
            resource: dim_name(deny.dim),
            used: self.usage[t.index()][deny.dim],
            requested: deny.requested,
            guarantee: lim.0,
            limit: lim.1,
            borrowable: self.borrowable(shape, t, deny.dim),
            cohort: cohort.map(|c| shape.cohorts[c as usize].0.clone()),
        }
    }

    /// What tenant `t` could borrow now in dimension `d` beyond its guarantee.
    pub(crate) fn borrowable(&self, shape: &QuotaShape, t: TenantId, d: usize) -> u64 {
        let root_idle = shape.unguaranteed[d].saturating_sub(self.root_borrowed[d]);
        match shape.tenants[t.index()].1 {
            Some(c) => {
                let cu = self.cohort_usage[c as usize][d];
                let cg = shape.cohorts[c as usize].1[d];
                cg.saturating_sub(cu) + root_idle
            }
            None => root_idle,
        }
    }

    /// Adds (or with `sub`, removes) a usage vector for tenant `t`.
    pub(crate) fn charge(&mut self, shape: &QuotaShape, t: TenantId, req: &QVec, sub: bool) {
        let (quota, cohort) = &shape.tenants[t.index()];
        for d in 0..QDIMS {
            let r = req[d];
            if r == 0 {
                continue;
            }
            let used = self.usage[t.index()][d];
            let new = if sub { used.saturating_sub(r) } else { used.saturating_add(r) };
            self.usage[t.index()][d] = new;
            let Some(q) = quota else { continue };
            let Some(lim) = q.dims[d] else { continue };
            let (old_ex, new_ex) = match cohort {
                Some(c) => {
                    let cu = &mut self.cohort_usage[*c as usize][d];
                    let old = *cu;
                    *cu = if sub { old.saturating_sub(r) } else { old.saturating_add(r) };
                    let cg = shape.cohorts[*c as usize].1[d];
                    (Self::excess(old, cg), Self::excess(*cu, cg))
                }
                None => (Self::excess(used, lim.guarantee), Self::excess(new, lim.guarantee)),
            };
            self.root_borrowed[d] = self.root_borrowed[d].saturating_sub(old_ex).saturating_add(new_ex);
        }
    }

    /// Whether tenant `t` uses more GPUs than its guarantee (its borrowed work is reclaimable).
    pub(crate) fn over_guarantee(&self, shape: &QuotaShape, t: TenantId) -> bool {
        match &shape.tenants[t.index()].0 {
            Some(q) => q.dims[DIM_GPUS].is_some_and(|l| self.usage[t.index()][DIM_GPUS] > l.guarantee),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::QLimit;
    use proptest::prelude::*;

    /// `gpu_shortfall` is the least number of GPUs a tenant gives back (as its evicted jobs would, through
    /// [`QuotaBook::charge`]) after which [`QuotaBook::admit`] takes the request: on random books of three tenants with
    /// GPU quotas (two in a cohort, one alone), giving back that many admits it and one fewer does not.
    #[test]
    fn the_gpu_shortfall_is_the_least_given_back_that_admits() {
        let strategy = (proptest::collection::vec((0u64..8, 0u64..8, 0u64..12), 3), 0u64..10, 0usize..3, 1u64..9);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 2_000,
            rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
            ..Default::default()
        });
        let (admitted_after, never) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&strategy, |(tenants, spare, who, r)| {
                let gpus = |n: u64| {
                    let mut v = [0u64; QDIMS];
                    v[DIM_GPUS] = n;
                    v
                };
                let quota = |g: u64, extra: u64| {
                    let mut q = Quota::default();
                    q.dims[DIM_GPUS] = Some(QLimit { guarantee: g, limit: g + extra });
                    q
                };
                let cohort_g: u64 = tenants[..2].iter().map(|t| t.0).sum();
                let shape = QuotaShape {
                    tenants: tenants
                        .iter()
                        .enumerate()
                        .map(|(i, t)| (Some(quota(t.0, t.1)), (i < 2).then_some(0)))
                        .collect(),
                    cohorts: vec![("c".into(), gpus(cohort_g))],
                    unguaranteed: gpus(spare),
                };
                let mut book =
                    QuotaBook { usage: vec![[0; QDIMS]; 3], cohort_usage: vec![[0; QDIMS]], ..Default::default() };
                // Usage as admissions made it: each tenant takes GPUs one at a time while admitted, up to its wish.
                for (i, t) in tenants.iter().enumerate() {
                    for _ in 0..t.2 {
                        if book.admit(&shape, TenantId(i as u32), &gpus(1)).is_err() {
                            break;
                        }
                        book.charge(&shape, TenantId(i as u32), &gpus(1), false);
                    }
                }
                let t = TenantId(who as u32);
                let x = book.gpu_shortfall(&shape, t, &gpus(r));
                let after = |x: u64| {
                    let mut b = book.clone();
                    b.charge(&shape, t, &gpus(x), true);
                    b.admit(&shape, t, &gpus(r)).is_ok()
                };
                let used = book.usage[who][DIM_GPUS];
                if x == u64::MAX {
                    prop_assert!(!after(used), "giving back all {used} admits {r}");
                    never.set(never.get() + 1);
                } else {
                    prop_assert!(x <= used);
                    prop_assert!(after(x), "giving back {x} of {used} does not admit {r}");
                    prop_assert!(x == 0 || !after(x - 1), "giving back {} admits {r} already", x - 1);
                    admitted_after.set(admitted_after.get() + usize::from(x > 0));
                }
                Ok(())
            })
            .unwrap();
        let (admitted_after, never) = (admitted_after.get(), never.get());
        assert!(admitted_after >= 200 && never >= 50, "{admitted_after} admitted after giving back, {never} never");
    }
}
