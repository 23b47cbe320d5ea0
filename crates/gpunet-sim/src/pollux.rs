//! Fixed-allocation durations for Pollux and Sia workload jobs.
//!
//! Those workloads give each job an application, a replica count and a batch size, not a duration: their own
//! simulators replay measured profiles. gpunet schedules fixed allocations, so a job's duration is
//! `iterations(app, batch size) × (step_time + sync_time)(app, replicas, batch size ÷ replicas)`: the iterations to the
//! end of the application's validation curve at that batch size, times the measured time of one iteration with that
//! many replicas on T4 GPUs (the Pollux testbed). Nearest measured values are used where the exact ones were not
//! measured. The tables are derived from the Pollux artifact (see `data/traces/README.md`).

use std::collections::BTreeMap;

const ITERATIONS: &str = include_str!("../../../data/traces/pollux/profiles/iterations.csv");
const SCALABILITY: &str = include_str!("../../../data/traces/pollux/profiles/scalability.csv");

/// The profile tables.
#[derive(Debug, Clone)]
pub struct Profiles {
    /// app → (batch size, iterations).
    iterations: BTreeMap<String, Vec<(u64, u64)>>,
    /// app → (nodes, replicas, local batch size, seconds per iteration).
    steps: BTreeMap<String, Vec<(u32, u32, u64, f64)>>,
}

impl Profiles {
    /// The tables shipped with gpunet.
    pub fn embedded() -> Profiles {
        let mut iterations: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        for l in ITERATIONS.lines().skip(1) {
            let f: Vec<&str> = l.split(',').collect();
            if let [app, bsz, it] = f[..] {
                if let (Ok(b), Ok(i)) = (bsz.parse(), it.parse()) {
                    iterations.entry(app.to_string()).or_default().push((b, i));
                }
            }
        }
        let mut steps: BTreeMap<String, Vec<(u32, u32, u64, f64)>> = BTreeMap::new();
        for l in SCALABILITY.lines().skip(1) {
            let f: Vec<&str> = l.split(',').collect();
            if let [app, nodes, reps, lbsz, step, sync] = f[..] {
                if let (Ok(n), Ok(r), Ok(b), Ok(s), Ok(y)) =
                    (nodes.parse(), reps.parse(), lbsz.parse::<f64>(), step.parse::<f64>(), sync.parse::<f64>())
                {
                    steps.entry(app.to_string()).or_default().push((n, r, b as u64, s + y));
                }
            }
        }
        Profiles { iterations, steps }
    }

    /// Applications with a profile.
    pub fn apps(&self) -> Vec<&str> {
        self.iterations.keys().map(String::as_str).collect()
    }

    /// Duration in seconds of `app` with `replicas` GPUs at global batch size `bsz`.
    pub fn duration_s(&self, app: &str, replicas: u32, bsz: u64) -> Option<f64> {
        let its = self.iterations.get(app)?;
        let (_, iterations) = its.iter().min_by_key(|(b, _)| b.abs_diff(bsz))?;
        let steps = self.steps.get(app)?;
        let rep = steps.iter().map(|s| s.1).min_by_key(|r| r.abs_diff(replicas))?;
        let local = bsz / replicas.max(1) as u64;
        let (_, _, _, t) = steps
            .iter()
            .filter(|s| s.1 == rep)
            .min_by(|a, b| (a.2.abs_diff(local), a.0).cmp(&(b.2.abs_diff(local), b.0)))?;
        Some(*iterations as f64 * t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pollux_application_has_a_positive_duration() {
        let p = Profiles::embedded();
        assert_eq!(p.apps(), vec!["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]);
        for app in p.apps() {
            let d = p.duration_s(app, 4, 512).unwrap();
            assert!(d > 1.0 && d < 30.0 * 86_400.0, "{app}: {d}");
        }
        assert!(p.duration_s("gpt5", 1, 1).is_none());
        // ImageNet runs far longer than CIFAR-10 (Pollux buckets them by GPU-time: >100 h vs <1 h).
        assert!(p.duration_s("imagenet", 8, 3200).unwrap() > 10.0 * p.duration_s("cifar10", 8, 2048).unwrap());
    }
}
