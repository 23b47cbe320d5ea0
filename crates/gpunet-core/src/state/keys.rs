//! Queue keys: a queued job's place in its tenant's queue under the configured policy ([`QueueKey`], [`queue_key`])
//! and the policies' keys it is made from.

use crate::config::{Policy, SchedConfig};
use crate::ids::JobId;
use crate::job::{Job, JobState};
use crate::units::Time;

/// Order of a queued job within its tenant's queue (and across tenants for job-ordering policies).
///
/// A key's order and identity are its `(major, minor, job)` alone (`job` is unique): the other fields ride along
/// with it, so that a queued job's key is found in the queues from those three ([`queue_probe`], which skips the
/// hashing of the job's placement constraints that [`queue_key`] does), and the key found carries the rest.
/// `check_invariants` checks that every key in the queues has all its fields as [`queue_key`] makes them now.
#[derive(Debug, Clone, Copy)]
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

    /// Whether every field is the same (`==` compares the order's fields only). Every field is named, so that one
    /// added to the key is compared here too.
    pub(crate) fn same_fields(&self, o: &QueueKey) -> bool {
        let QueueKey { major, minor, job, sig, gpus, est, not_before, shape_hash } = *self;
        (major, minor, job, sig, gpus, est, not_before, shape_hash)
            == (o.major, o.minor, o.job, o.sig, o.gpus, o.est, o.not_before, o.shape_hash)
    }
}

impl PartialEq for QueueKey {
    fn eq(&self, o: &QueueKey) -> bool {
        (self.major, self.minor, self.job) == (o.major, o.minor, o.job)
    }
}

impl Eq for QueueKey {}

impl PartialOrd for QueueKey {
    fn partial_cmp(&self, o: &QueueKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for QueueKey {
    fn cmp(&self, o: &QueueKey) -> std::cmp::Ordering {
        (self.major, self.minor, self.job).cmp(&(o.major, o.minor, o.job))
    }
}

impl std::hash::Hash for QueueKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.major, self.minor, self.job).hash(h);
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
/// learned distribution, counting how far it is known to run and the lost work up to there; without estimate, by its
/// probe), `u64::MAX` without estimate nor probe.
pub(crate) fn srtf_key(cfg: &SchedConfig, j: &Job) -> u64 {
    j.rank_from(j.progress, cfg.learned_rule())
}

/// A job's key under SRGF: its SRTF key × GPUs at its minimum size (ms), `u64::MAX` without estimate nor probe
/// ([`crate::JobSpec::ranked`]).
pub(crate) fn srgf_key(cfg: &SchedConfig, j: &Job) -> u64 {
    if !j.spec.ranked() {
        return u64::MAX;
    }
    let tasks = j.spec.elastic.map_or(j.spec.tasks, |e| e.min_tasks);
    srtf_key(cfg, j).saturating_mul((j.spec.task.gpus as u64 * tasks as u64).max(1))
}

/// A key equal to the job's [`queue_key`] (the same order and identity) with nothing else filled in: what finds the
/// job's key in the queues, whose fields are then the ones to use.
pub(crate) fn queue_probe(cfg: &SchedConfig, j: &Job) -> QueueKey {
    QueueKey {
        major: match cfg.policy {
            Policy::Fifo => 0,
            Policy::Priority | Policy::Drf | Policy::FairShare => (i32::MAX as i64 - j.spec.priority as i64) as u64,
            Policy::Sjf => sjf_key(j),
            Policy::Srtf => srtf_key(cfg, j),
            Policy::Srgf => srgf_key(cfg, j),
            Policy::Las => cfg.las_queue(j.attained_gpu_ms) as u64,
        },
        minor: j.submitted.0,
        job: j.id,
        sig: 0,
        gpus: 0,
        est: 0,
        not_before: Time::ZERO,
        shape_hash: 0,
    }
}

/// The queue key of a job under the configured policy: its [`queue_probe`] (its order and identity) with the rest.
pub(crate) fn queue_key(cfg: &SchedConfig, j: &Job) -> QueueKey {
    let min_tasks = j.spec.elastic.map_or(j.spec.tasks, |e| e.min_tasks);
    let sig = crate::schedule::spec_sig(&j.spec);
    QueueKey {
        sig,
        gpus: j.spec.task.gpus as u64 * min_tasks as u64,
        est: if j.spec.ranked() { j.remaining_estimate().0 } else { u64::MAX },
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
        ..queue_probe(cfg, j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::testkit::*;

    /// A key is found by its order's fields alone, and the invariants hold every other field of it, in the tenant's
    /// queue and in the merged queue, to what the job makes now.
    #[test]
    fn a_key_is_found_by_its_order_and_a_stale_field_breaks_the_invariants() {
        let mut s = cluster(cfg(Policy::Sjf), vec![node("n", GpuModel::T4, 1)], &["a"]);
        let spec = |e| JobSpec::new(t0(), "j", 1, 1).estimate(Dur::from_secs(e));
        submit(&mut s, 1, spec(10), 1);
        submit(&mut s, 2, spec(20), 2);
        let j2 = s.job(JobId(2)).unwrap().clone();
        let (probe, key) = (queue_probe(&s.cfg, &j2), queue_key(&s.cfg, &j2));
        assert!(probe == key && !probe.same_fields(&key) && key.sig == 1 && probe.sig == 0);
        assert!(s.tenants[0].queue.get(&probe).is_some_and(|k| k.same_fields(&key)));
        s.check_invariants().unwrap();
        // A stale copy in the merged queue, which the pass reads.
        let mut bad = s.clone();
        let stale = QueueKey { gpus: 99, not_before: Time::MAX, ..key };
        assert!(bad.merged.remove(&(key, t0())) && bad.merged.insert((stale, t0())));
        assert!(bad.check_invariants().unwrap_err().contains("merged queue's key of job-2"));
        // A stale key in the tenant's queue.
        let mut bad = s.clone();
        assert!(bad.tenants[0].queue.remove(&key) && bad.tenants[0].queue.insert(stale));
        assert!(bad.check_invariants().unwrap_err().contains("queued key of job-2 is not the one its job makes"));
        // Started and dequeued through the probe: every copy of its key is gone.
        s.step(Time::from_secs(3)).unwrap();
        s.finish(JobId(1), Time::from_secs(4), true).unwrap();
        assert_eq!(started(&s.step(Time::from_secs(5)).unwrap()), vec![2]);
        assert!(s.tenants[0].queue.is_empty() && s.merged.is_empty());
        s.check_invariants().unwrap();
    }
}
