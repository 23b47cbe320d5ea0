//! Utilisation of the GPUs each attempt holds, from the agents' per-GPU samples (NVML, or `--fake-gpu-samples`).
//!
//! Each sample a node sends stands for the time since that node's previous sample (at most [`MAX_GAP_MS`], and never
//! before the attempt started): every GPU an attempt holds adds that time to the attempt's *sampled* GPU-seconds,
//! and that time times its utilisation (0 to 1) to its *busy* GPU-seconds, per node. When the attempt ends, its
//! ledger rows (one per node) carry both, so `busy / sampled` over any set of rows is the average utilisation of the
//! GPUs allocated, weighted by time and GPUs — what `gpunet report` shows. GPUs that send no samples (fake GPUs
//! without `--fake-gpu-samples`, NVML that cannot read utilisation) add nothing, so their rows read "no samples"
//! rather than idle.
//!
//! What a running attempt has gathered is kept in memory and, every [`FLUSH_EVERY`], in its job's document
//! ([`Progress`], written by the owner with the cluster sample): a server restarted while the attempt runs goes on
//! from the figures last stored ([`Utilisation::restore`]), so at most that long of samples is lost, plus the gap
//! until the node's first sample after the restart (which covers nothing).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The longest time one sample stands for: after a longer silence (an agent that was away) the gap is not
/// credited to anything.
pub(crate) const MAX_GAP_MS: u64 = 30_000;

/// How often the figures of running attempts are stored in their job documents.
pub(crate) const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// An attempt's sampled and busy GPU-seconds on one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Busy {
    /// GPU-seconds covered by samples.
    pub(crate) sampled: f64,
    /// Those weighted by utilisation.
    pub(crate) busy: f64,
}

/// The attempt holding a GPU: job, attempt number and when the attempt started (ms since the epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Holder {
    pub(crate) job: u64,
    pub(crate) attempt: u32,
    pub(crate) started_ms: u64,
}

/// What a running attempt has gathered so far, as its job document stores it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// The attempt (figures of another attempt are not this one's).
    pub(crate) attempt: u32,
    /// Node → figures.
    pub(crate) nodes: BTreeMap<String, Busy>,
}

/// Sampled and busy GPU-seconds per running attempt and node.
#[derive(Debug, Default)]
pub(crate) struct Utilisation {
    /// (job, attempt) → node → figures.
    runs: HashMap<(u64, u32), BTreeMap<String, Busy>>,
    /// Attempts whose figures changed since they were last taken by [`Utilisation::take_changed`].
    changed: HashSet<(u64, u32)>,
    /// When each node's previous sample came.
    last_at: HashMap<String, u64>,
}

impl Utilisation {
    /// A node sent `samples` at `now`; `holders` says which attempt holds each of its GPUs (by index).
    pub(crate) fn record(
        &mut self,
        node: &str,
        samples: &[gpunet_api::agent::GpuSample],
        holders: &BTreeMap<u32, Holder>,
        now: u64,
    ) {
        let prev = self.last_at.insert(node.to_string(), now);
        let since = prev.unwrap_or(now).max(now.saturating_sub(MAX_GAP_MS));
        // One sample per GPU index counts, whatever the node sent.
        let mut seen = std::collections::BTreeSet::new();
        for s in samples {
            let Some(h) = holders.get(&s.index) else { continue };
            // An agent's numbers are not trusted: a utilisation that is not a number between 0 and 100 is no sample.
            let Some(pct) = s.utilization_pct.filter(|p| p.is_finite() && (0.0..=100.0).contains(p)) else { continue };
            if !seen.insert(s.index) {
                continue;
            }
            let secs = now.saturating_sub(since.max(h.started_ms)) as f64 / 1000.0;
            if secs <= 0.0 {
                continue;
            }
            let e = self.runs.entry((h.job, h.attempt)).or_default().entry(node.to_string()).or_default();
            e.sampled += secs;
            e.busy += secs * pct / 100.0;
            self.changed.insert((h.job, h.attempt));
        }
    }

    /// What attempt `attempt` of `job` gathered on `node` so far.
    pub(crate) fn of(&self, job: u64, attempt: u32, node: &str) -> Busy {
        self.runs.get(&(job, attempt)).and_then(|m| m.get(node)).copied().unwrap_or_default()
    }

    /// The attempt ended and its rows are written: its figures are dropped.
    pub(crate) fn ended(&mut self, job: u64, attempt: u32) {
        self.runs.remove(&(job, attempt));
        self.changed.remove(&(job, attempt));
    }

    /// The running attempts whose figures changed since the last call, each with its figures now (to store).
    pub(crate) fn take_changed(&mut self) -> Vec<(u64, Progress)> {
        let mut out: Vec<(u64, Progress)> = self
            .changed
            .drain()
            .filter_map(|(job, attempt)| {
                let nodes = self.runs.get(&(job, attempt))?.clone();
                Some((job, Progress { attempt, nodes }))
            })
            .collect();
        out.sort_by_key(|(j, _)| *j);
        out
    }

    /// At start-up: a running attempt goes on from the figures its document stored.
    pub(crate) fn restore(&mut self, job: u64, p: &Progress) {
        self.runs.insert((job, p.attempt), p.nodes.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunet_api::agent::GpuSample;

    fn at(index: u32, pct: f64) -> GpuSample {
        GpuSample { index, utilization_pct: Some(pct), ..Default::default() }
    }

    #[test]
    fn samples_credit_the_time_since_the_previous_one_to_the_gpus_holders() {
        let mut u = Utilisation::default();
        let holders = BTreeMap::from([
            (0, Holder { job: 7, attempt: 0, started_ms: 0 }),
            (1, Holder { job: 7, attempt: 0, started_ms: 0 }),
        ]);
        // The node's first sample covers nothing (no previous one); the next ones 5 s each.
        u.record("n1", &[at(0, 50.0), at(1, 100.0), at(2, 100.0)], &holders, 10_000);
        assert_eq!(u.of(7, 0, "n1"), Busy::default());
        u.record("n1", &[at(0, 50.0), at(1, 100.0), at(2, 100.0)], &holders, 15_000);
        u.record("n1", &[at(0, 50.0), at(1, 0.0)], &holders, 20_000);
        // Two GPUs × 10 s sampled; busy 2.5 + 5 + 2.5 + 0 GPU-seconds. GPU 2 is free and counts for no one.
        assert_eq!(u.of(7, 0, "n1"), Busy { sampled: 20.0, busy: 10.0 });
        assert_eq!(u.of(7, 1, "n1"), Busy::default(), "another attempt has its own figures");
        u.ended(7, 0);
        assert_eq!(u.of(7, 0, "n1"), Busy::default());
    }

    #[test]
    fn stored_progress_restores_a_running_attempt_s_figures() {
        let mut u = Utilisation::default();
        let h = BTreeMap::from([(0, Holder { job: 3, attempt: 1, started_ms: 0 })]);
        u.record("n1", &[at(0, 40.0)], &h, 1_000);
        u.record("n1", &[at(0, 40.0)], &h, 6_000);
        let changed = u.take_changed();
        assert_eq!(changed.len(), 1);
        assert!(u.take_changed().is_empty(), "taken once until it changes again");
        let (job, p) = &changed[0];
        let stored: Progress = serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap();
        // A new server (no samples yet) goes on from what was stored.
        let mut again = Utilisation::default();
        again.restore(*job, &stored);
        assert_eq!(again.of(3, 1, "n1"), Busy { sampled: 5.0, busy: 2.0 });
        again.record("n1", &[at(0, 100.0)], &h, 60_000);
        again.record("n1", &[at(0, 100.0)], &h, 65_000);
        assert_eq!(again.of(3, 1, "n1"), Busy { sampled: 10.0, busy: 7.0 });
    }

    #[test]
    fn a_sample_never_counts_before_the_attempt_started_nor_over_a_long_silence() {
        let mut u = Utilisation::default();
        let h = BTreeMap::from([(0, Holder { job: 1, attempt: 2, started_ms: 12_000 })]);
        u.record("n1", &[at(0, 100.0)], &h, 10_000);
        u.record("n1", &[at(0, 100.0)], &h, 15_000);
        assert_eq!(u.of(1, 2, "n1"), Busy { sampled: 3.0, busy: 3.0 }, "from the start at 12 s, not 10 s");
        // The agent was away for 10 minutes: the sample stands for MAX_GAP_MS at most.
        u.record("n1", &[at(0, 100.0)], &h, 615_000);
        assert_eq!(u.of(1, 2, "n1").sampled, 3.0 + MAX_GAP_MS as f64 / 1000.0);
    }

    #[test]
    fn hostile_samples_add_nothing() {
        let mut u = Utilisation::default();
        let h = BTreeMap::from([(0, Holder { job: 1, attempt: 0, started_ms: 0 })]);
        u.record("n1", &[], &h, 1_000);
        let bad = [at(0, f64::NAN), at(0, -5.0), at(0, 250.0), GpuSample { index: 0, ..Default::default() }];
        u.record("n1", &bad, &h, 6_000);
        assert_eq!(u.of(1, 0, "n1"), Busy::default());
        // The same GPU sent twice in one report counts once.
        u.record("n1", &[at(0, 100.0), at(0, 100.0)], &h, 11_000);
        assert_eq!(u.of(1, 0, "n1"), Busy { sampled: 5.0, busy: 5.0 });
    }
}
