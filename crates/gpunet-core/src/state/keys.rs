//! Queue keys: a queued job's place in its tenant's queue under the configured policy ([`QueueKey`], [`queue_key`])
//! and the policies' keys it is made from.

use crate::config::{Policy, SchedConfig};
use crate::ids::JobId;
use crate::job::{Job, JobState};
use crate::units::Time;

/// Order of a queued job within its tenant's queue (and across tenants for job-ordering policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QueueKey {
    pub(crate) major: u64,
    pub(crate) minor: u64,
    pub(crate) job: JobId,
    /// The job's placement-constraint signature (never decides order: `job` is unique).
    pub(crate) sig: u64,
    /// Whole GPUs of the job at its minimum size.
    pub(crate) gpus: u64,
    /// Remaining estimate in ms (`u64::MAX` without).
    pub(crate) est: u64,
    /// Earliest start (restart backoff).
    pub(crate) not_before: Time,
    pub(crate) shape_hash: u64,
}

impl QueueKey {
    /// Everything placement depends on besides the free resources, hashed: signature, GPUs, tasks, topology, CPU,
    /// memory. Filled at enqueue time into `shape_hash`.
    pub(crate) fn shape(&self) -> u64 {
        self.shape_hash
    }
}

/// A job's key under SJF: its estimate ÷ its GPUs (ms), `u64::MAX` without estimate.
pub(crate) fn sjf_key(j: &Job) -> u64 {
    match j.spec.estimated_duration {
        Some(e) => e.0 / j.spec.total_gpus().max(1) as u64,
        None => u64::MAX,
    }
}

/// A queued job's key under SRTF: its rank from its kept progress ([`Job::rank_from`] under
/// [`SchedConfig::learned_rule`]: the remaining estimated time, or for a learned estimate its rank under the
/// learned distribution, counting how far it is known to run and the lost work up to there), `u64::MAX` without
/// estimate.
pub(crate) fn srtf_key(cfg: &SchedConfig, j: &Job) -> u64 {
    j.rank_from(j.progress, cfg.learned_rule())
}

/// A job's key under SRGF: its SRTF key × GPUs at its minimum size (ms), `u64::MAX` without estimate.
pub(crate) fn srgf_key(cfg: &SchedConfig, j: &Job) -> u64 {
    match j.spec.estimated_duration {
        Some(_) => {
            let tasks = j.spec.elastic.map_or(j.spec.tasks, |e| e.min_tasks);
            srtf_key(cfg, j).saturating_mul((j.spec.task.gpus as u64 * tasks as u64).max(1))
        }
        None => u64::MAX,
    }
}

/// The queue key of a job under the configured policy.
pub(crate) fn queue_key(cfg: &SchedConfig, j: &Job) -> QueueKey {
    let prio = (i32::MAX as i64 - j.spec.priority as i64) as u64;
    let major = match cfg.policy {
        Policy::Fifo => 0,
        Policy::Priority | Policy::Drf | Policy::FairShare => prio,
        Policy::Sjf => sjf_key(j),
        Policy::Srtf => srtf_key(cfg, j),
        Policy::Srgf => srgf_key(cfg, j),
        Policy::Las => cfg.las_queue(j.attained_gpu_ms) as u64,
    };
    let min_tasks = j.spec.elastic.map_or(j.spec.tasks, |e| e.min_tasks);
    let sig = crate::schedule::spec_sig(&j.spec);
    QueueKey {
        major,
        minor: j.submitted.0,
        job: j.id,
        sig,
        gpus: j.spec.task.gpus as u64 * min_tasks as u64,
        est: j.spec.estimated_duration.map_or(u64::MAX, |_| j.remaining_estimate().0),
        not_before: if j.state == JobState::Restarting { j.not_before } else { Time::ZERO },
        shape_hash: {
            use std::hash::{Hash, Hasher};
            let mut h = crate::fxhash::FxHasher::default();
            (
                sig,
                j.spec.task.gpus,
                min_tasks,
                j.spec.topology as u32,
                j.spec.task.cpu.0,
                j.spec.task.mem.0,
                j.spec.allow_mixed_models,
                j.spec.elastic.is_some(),
                // Spot first, then anywhere: a search of its own (`Pass::try_place`).
                j.spec.prefer_spot,
            )
                .hash(&mut h);
            h.finish()
        },
    }
}
