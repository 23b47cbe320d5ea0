//! Tenants (teams, virtual clusters): a fair-share weight, an optional quota, and an optional cohort.
//!
//! A quota is per dimension (GPUs in total, CPU, memory, and GPUs of each model) a *guarantee* plus a *limit*
//! (`limit >= guarantee`; what the tenant may reach by borrowing). Borrowing is hierarchical, in two levels:
//! tenants of a cohort lend each other their unused guarantees; what a cohort as a whole uses beyond the sum of its
//! members' guarantees (and what a tenant without cohort uses beyond its own) is borrowed from the *root pool*, the
//! cluster capacity that no tenant is guaranteed. Work admitted beyond its tenant's guarantee is marked borrowed and
//! may be reclaimed when an owner needs its guarantee back.

use crate::error::CoreError;
use crate::gpu::GpuModel;
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};

/// Number of quota dimensions: GPUs, CPU, memory, then GPUs of each model in catalogue order.
pub const QDIMS: usize = 3 + GpuModel::ALL.len();
/// Dimension of GPUs in total.
pub const DIM_GPUS: usize = 0;
/// Dimension of CPU millicores.
pub const DIM_CPU: usize = 1;
/// Dimension of memory MiB.
pub const DIM_MEM: usize = 2;

/// The dimension of GPUs of one model.
pub const fn dim_model(m: GpuModel) -> usize {
    3 + m.index()
}

/// Human name of a quota dimension.
pub fn dim_name(d: usize) -> String {
    match d {
        DIM_GPUS => "gpus".into(),
        DIM_CPU => "cpu_milli".into(),
        DIM_MEM => "memory_mib".into(),
        _ => format!("gpus/{}", GpuModel::ALL[d - 3]),
    }
}

/// A vector over the quota dimensions.
pub type QVec = [u64; QDIMS];

/// Guarantee and limit of one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QLimit {
    /// Always available to the tenant (reclaimed from borrowers if need be).
    pub guarantee: u64,
    /// Most the tenant may use, borrowing included.
    pub limit: u64,
}

/// A tenant's quota; a dimension set to `None` is not constrained.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Quota {
    /// Per-dimension guarantee and limit.
    pub dims: [Option<QLimit>; QDIMS],
}

impl Quota {
    /// A quota on GPUs only.
    pub fn gpus(guarantee: u64, limit: u64) -> Quota {
        Quota::default().with(DIM_GPUS, guarantee, limit)
    }

    /// Sets one dimension.
    pub fn with(mut self, dim: usize, guarantee: u64, limit: u64) -> Quota {
        self.dims[dim] = Some(QLimit { guarantee, limit });
        self
    }

    /// Sets the CPU dimension.
    pub fn cpu(self, guarantee: MilliCpu, limit: MilliCpu) -> Quota {
        self.with(DIM_CPU, guarantee.0, limit.0)
    }

    /// Sets the memory dimension.
    pub fn mem(self, guarantee: MiB, limit: MiB) -> Quota {
        self.with(DIM_MEM, guarantee.0, limit.0)
    }

    /// Sets the GPUs of one model.
    pub fn model(self, m: GpuModel, guarantee: u64, limit: u64) -> Quota {
        self.with(dim_model(m), guarantee, limit)
    }

    /// The guarantee vector (0 where unconstrained).
    pub fn guarantee_vec(&self) -> QVec {
        let mut v = [0; QDIMS];
        for (d, l) in self.dims.iter().enumerate() {
            if let Some(l) = l {
                v[d] = l.guarantee;
            }
        }
        v
    }

    /// Checks `limit >= guarantee` everywhere.
    pub fn validate(&self) -> Result<(), CoreError> {
        for (d, l) in self.dims.iter().enumerate() {
            if let Some(l) = l {
                if l.limit < l.guarantee {
                    return Err(CoreError::InvalidField {
                        field: "quota.limit",
                        value: format!("{}: limit {} < guarantee {}", dim_name(d), l.limit, l.guarantee),
                        allowed: "a limit at least as large as the guarantee".into(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A tenant as registered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantSpec {
    /// Unique name.
    pub name: String,
    /// Fair-share weight (> 0); DRF and fair share divide by it.
    pub weight: f64,
    /// Quota; `None` means unlimited (still subject to physical capacity).
    pub quota: Option<Quota>,
    /// Cohort whose members lend each other unused guarantee.
    pub cohort: Option<String>,
}

impl TenantSpec {
    /// A tenant of weight 1 without quota or cohort.
    pub fn new(name: impl Into<String>) -> TenantSpec {
        TenantSpec { name: name.into(), weight: 1.0, quota: None, cohort: None }
    }

    /// Sets the quota.
    pub fn quota(mut self, q: Quota) -> TenantSpec {
        self.quota = Some(q);
        self
    }

    /// Sets the cohort.
    pub fn cohort(mut self, c: &str) -> TenantSpec {
        self.cohort = Some(c.into());
        self
    }

    /// Sets the weight.
    pub fn weight(mut self, w: f64) -> TenantSpec {
        self.weight = w;
        self
    }

    /// Checks the spec.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.name.trim().is_empty() {
            return Err(CoreError::InvalidField {
                field: "tenant.name",
                value: self.name.clone(),
                allowed: "a non-empty name".into(),
            });
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(CoreError::InvalidField {
                field: "tenant.weight",
                value: self.weight.to_string(),
                allowed: "a finite number > 0".into(),
            });
        }
        if let Some(q) = &self.quota {
            q.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_limit_below_guarantee_is_rejected_with_the_dimension() {
        let e = Quota::gpus(16, 8).validate().unwrap_err().to_string();
        assert!(e.contains("gpus") && e.contains("16"), "{e}");
        assert!(Quota::gpus(8, 16).validate().is_ok());
    }

    #[test]
    fn tenant_weight_must_be_positive() {
        assert!(TenantSpec::new("a").weight(0.0).validate().is_err());
        assert!(TenantSpec::new("").validate().is_err());
        assert!(TenantSpec::new("a").weight(2.5).validate().is_ok());
    }

    #[test]
    fn dimension_names_are_readable() {
        assert_eq!(dim_name(DIM_GPUS), "gpus");
        assert_eq!(dim_name(dim_model(GpuModel::A100_80GB)), "gpus/A100-80GB");
    }
}
