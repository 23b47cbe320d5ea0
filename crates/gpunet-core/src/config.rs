//! Scheduler configuration: the queue policy and the knobs of backfill, preemption, fair share and LAS.

use crate::error::CoreError;
use crate::units::Dur;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Queue policy: the order in which pending jobs are considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Submission order.
    Fifo,
    /// Higher priority first, then submission order.
    Priority,
    /// Shortest job first: key = estimated time ÷ GPUs (jobs without estimate last).
    Sjf,
    /// Shortest remaining estimated time first (progress kept by checkpoints counts).
    Srtf,
    /// Weighted Dominant Resource Fairness across tenants.
    Drf,
    /// Fair share on decayed historical GPU usage plus current allocation, divided by weight.
    FairShare,
    /// Discretised least attained GPU-service (Tiresias 2D-LAS).
    Las,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 7] =
        [Policy::Fifo, Policy::Priority, Policy::Sjf, Policy::Srtf, Policy::Drf, Policy::FairShare, Policy::Las];

    /// Name as accepted on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Priority => "priority",
            Policy::Sjf => "sjf",
            Policy::Srtf => "srtf",
            Policy::Drf => "drf",
            Policy::FairShare => "fairshare",
            Policy::Las => "las",
        }
    }

    /// Whether the policy orders tenants (DRF, fair share) rather than jobs.
    pub const fn orders_tenants(self) -> bool {
        matches!(self, Policy::Drf | Policy::FairShare)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Policy, CoreError> {
        Policy::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            CoreError::InvalidField {
                field: "policy",
                value: s.into(),
                allowed: Policy::ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
            }
        })
    }
}

/// Preemption knobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionConfig {
    /// Whether the scheduler preempts at all.
    pub enabled: bool,
    /// A job that has run for less than this in its current attempt is never preempted.
    pub min_run_time: Dur,
    /// At most this many evictions …
    pub max_per_interval: u32,
    /// … in any window of this length.
    pub interval: Dur,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            enabled: true,
            min_run_time: Dur::from_mins(5),
            max_per_interval: 20,
            interval: Dur::from_mins(10),
        }
    }
}

/// Scheduler configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedConfig {
    /// Queue policy.
    pub policy: Policy,
    /// EASY backfill behind the first job that does not fit.
    pub backfill: bool,
    /// Most jobs examined behind a blocked head per pass (like Slurm's `bf_max_job_test`, default 500 there).
    pub backfill_depth: usize,
    /// Most running-job completions the backfill reservation looks ahead (like Slurm's `bf_window`); a head that
    /// cannot start within them gets no reservation time, and backfill then keeps off its node classes.
    pub reservation_horizon: usize,
    /// Half-life of historical usage under fair share.
    pub fairshare_half_life: Dur,
    /// LAS queue thresholds in GPU-seconds of attained service; `n` thresholds make `n + 1` queues.
    pub las_thresholds_gpu_s: Vec<u64>,
    /// Preemption.
    pub preemption: PreemptionConfig,
    /// A tenant whose jobs hit its quota this many times in a row in one pass is skipped for the rest of it.
    pub quota_lookahead: u32,
    /// Backoff before restart `n` (doubling from this, capped at 32×).
    pub restart_backoff: Dur,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            policy: Policy::Fifo,
            backfill: false,
            backfill_depth: 1_000,
            reservation_horizon: 2_048,
            fairshare_half_life: Dur::from_hours(24),
            las_thresholds_gpu_s: vec![3_600, 36_000],
            preemption: PreemptionConfig::default(),
            quota_lookahead: 16,
            restart_backoff: Dur::from_secs(10),
        }
    }
}

impl SchedConfig {
    /// The default configuration with a policy.
    pub fn with_policy(policy: Policy) -> SchedConfig {
        SchedConfig { policy, ..SchedConfig::default() }
    }

    /// The LAS queue of an attained service.
    pub fn las_queue(&self, attained_gpu_ms: u64) -> usize {
        let s = attained_gpu_ms / 1000;
        self.las_thresholds_gpu_s.iter().take_while(|t| s >= **t).count()
    }

    /// Backoff before the `n`-th restart (1-based).
    pub fn backoff(&self, n: u32) -> Dur {
        Dur(self.restart_backoff.0.saturating_mul(1 << n.saturating_sub(1).min(5)))
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.las_thresholds_gpu_s.windows(2).any(|w| w[0] >= w[1]) {
            return Err(CoreError::InvalidField {
                field: "las_thresholds_gpu_s",
                value: format!("{:?}", self.las_thresholds_gpu_s),
                allowed: "strictly increasing thresholds".into(),
            });
        }
        if self.fairshare_half_life == Dur::ZERO {
            return Err(CoreError::InvalidField {
                field: "fairshare_half_life",
                value: "0s".into(),
                allowed: "a positive duration".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_by_name() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        let e = "lottery".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("lottery") && e.contains("fairshare"), "{e}");
    }

    #[test]
    fn las_queues_follow_thresholds() {
        let c = SchedConfig::default();
        assert_eq!(c.las_queue(0), 0);
        assert_eq!(c.las_queue(3_599_999), 0);
        assert_eq!(c.las_queue(3_600_000), 1);
        assert_eq!(c.las_queue(u64::MAX), 2);
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let c = SchedConfig::default();
        assert_eq!(c.backoff(1), Dur::from_secs(10));
        assert_eq!(c.backoff(3), Dur::from_secs(40));
        assert_eq!(c.backoff(30), Dur::from_secs(320));
    }
}
