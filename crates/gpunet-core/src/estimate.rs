//! Learned runtime estimates: a predictor of a job's run time from the history of jobs like it, learned online as
//! jobs finish (the idea of Helios's QSSF, with a geometric rather than arithmetic mean and a confidence).
//!
//! A job is known by its user, its name and its GPU count. The prediction comes from the most specific level with
//! history: the same user, name and GPUs; else the same user and GPUs; else the user; else every job. At each level
//! the predictor keeps an exponentially weighted mean of the log of run times (weight `max(1/n, 1/8)`: the plain
//! mean of the first eight runs, then recent runs count more, so a job that drifts is followed) and its spread, and
//! the prediction is `exp(mean)`. The confidence in `[0, 1]` falls with fewer samples, a wider spread and a coarser
//! level: `n/(n+2) · exp(−spread) · level factor` (1, 0.7, 0.5, 0.3).
//!
//! It is pure and deterministic; the simulator feeds it the trace's past only (`--estimates history`) and the
//! server feeds it the jobs that succeeded. Each level is bounded ([`Predictor::MAX_KEYS`] keys; a new key past it is
//! not learned at that level nor the finer ones) so that hostile names cannot grow it without limit.

use crate::fxhash::FxHashMap;
use crate::units::Dur;
use serde::{Deserialize, Serialize};

/// The level of history a prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The same user, job name and GPU count.
    UserNameGpus,
    /// The same user and GPU count.
    UserGpus,
    /// The same user.
    User,
    /// Every job.
    All,
}

impl Basis {
    const fn factor(self) -> f64 {
        match self {
            Basis::UserNameGpus => 1.0,
            Basis::UserGpus => 0.7,
            Basis::User => 0.5,
            Basis::All => 0.3,
        }
    }

    /// A short description.
    pub const fn describe(self) -> &'static str {
        match self {
            Basis::UserNameGpus => "runs of the same user, name and GPU count",
            Basis::UserGpus => "the user's runs with the same GPU count",
            Basis::User => "the user's runs",
            Basis::All => "all runs",
        }
    }
}

/// A predicted run time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Predicted run time.
    pub duration: Dur,
    /// Confidence in `[0, 1]`.
    pub confidence: f64,
    /// Where it came from.
    pub basis: Basis,
    /// Runs behind it.
    pub samples: u32,
    /// The spread of those runs: the standard deviation of the log of their run times (0 for runs of one length).
    /// Schedulers may take the run time as log-normal with `duration` as median and this spread ([`crate::gittins`]).
    /// `None` in predictions recorded before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    n: u32,
    mean: f64,
    var: f64,
}

impl Stats {
    fn add(&mut self, x: f64) {
        self.n = self.n.saturating_add(1);
        let a = (1.0 / self.n as f64).max(1.0 / 8.0);
        let d = x - self.mean;
        self.mean += a * d;
        // Exponentially weighted variance (West's update).
        self.var = (1.0 - a) * (self.var + a * d * d);
    }

    fn predict(&self, basis: Basis) -> Option<Prediction> {
        if self.n == 0 {
            return None;
        }
        let spread = self.var.max(0.0).sqrt();
        let n = self.n as f64;
        Some(Prediction {
            duration: Dur((self.mean.exp() * 1000.0).round().clamp(1.0, 1e15) as u64),
            confidence: n / (n + 2.0) * (-spread).exp() * basis.factor(),
            basis,
            samples: self.n,
            spread: Some(spread),
        })
    }
}

/// What a job is known by.
#[derive(Debug, Clone, Copy)]
pub struct JobKey<'a> {
    /// The submitting user (or the tenant where users are not known).
    pub user: &'a str,
    /// The job's name.
    pub name: &'a str,
    /// Its GPUs in all.
    pub gpus: u32,
}

/// The online predictor.
#[derive(Debug, Clone, Default)]
pub struct Predictor {
    /// Each user's history, and within it by GPU count, and within that by name: a lookup borrows the key's parts
    /// (a map keyed by owned tuples made three strings for every prediction and every run learned).
    users: FxHashMap<String, UserHistory>,
    all: Stats,
    /// Keys held at the levels of the same user and GPUs, and of the same user, name and GPUs.
    user_gpus_keys: usize,
    exact_keys: usize,
}

#[derive(Debug, Clone, Default)]
struct UserHistory {
    stats: Stats,
    by_gpus: FxHashMap<u32, GpuHistory>,
}

#[derive(Debug, Clone, Default)]
struct GpuHistory {
    stats: Stats,
    by_name: FxHashMap<String, Stats>,
}

impl Predictor {
    /// Most keys of each level (user, user and GPUs, user, name and GPUs). A run of a key new past its level's
    /// bound is not learned at that level nor at the finer ones below it (a user's names sit within the user's
    /// GPU counts, which sit within the user).
    pub const MAX_KEYS: usize = 200_000;

    /// An empty predictor.
    pub fn new() -> Predictor {
        Predictor::default()
    }

    /// Learns that a job like `key` ran for `ran` (a successful run's length).
    pub fn observe(&mut self, key: JobKey<'_>, ran: Dur) {
        let x = (ran.0.max(1) as f64 / 1000.0).ln();
        self.all.add(x);
        let users = self.users.len();
        let user = match self.users.get_mut(key.user) {
            Some(u) => u,
            None if users < Predictor::MAX_KEYS => self.users.entry(key.user.to_string()).or_default(),
            None => return,
        };
        user.stats.add(x);
        let gpus = match user.by_gpus.get_mut(&key.gpus) {
            Some(g) => g,
            None if self.user_gpus_keys < Predictor::MAX_KEYS => {
                self.user_gpus_keys += 1;
                user.by_gpus.entry(key.gpus).or_default()
            }
            None => return,
        };
        gpus.stats.add(x);
        match gpus.by_name.get_mut(key.name) {
            Some(s) => s.add(x),
            None if self.exact_keys < Predictor::MAX_KEYS => {
                self.exact_keys += 1;
                gpus.by_name.entry(key.name.to_string()).or_default().add(x);
            }
            None => {}
        }
    }

    /// The prediction for a job like `key`, from the most specific level with history; `None` before any run.
    pub fn predict(&self, key: JobKey<'_>) -> Option<Prediction> {
        let user = self.users.get(key.user);
        let gpus = user.and_then(|u| u.by_gpus.get(&key.gpus));
        gpus.and_then(|g| g.by_name.get(key.name))
            .and_then(|s| s.predict(Basis::UserNameGpus))
            .or_else(|| gpus.and_then(|g| g.stats.predict(Basis::UserGpus)))
            .or_else(|| user.and_then(|u| u.stats.predict(Basis::User)))
            .or_else(|| self.all.predict(Basis::All))
    }

    /// Runs learned in all.
    pub fn samples(&self) -> u32 {
        self.all.n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(user: &'a str, name: &'a str, gpus: u32) -> JobKey<'a> {
        JobKey { user, name, gpus }
    }

    #[test]
    fn learns_a_repeated_jobs_duration_within_ten_percent_after_three_runs() {
        let mut p = Predictor::new();
        // Other work first, so that the coarser levels would predict something else.
        for i in 0..20 {
            p.observe(key("ana", &format!("sweep-{i}"), 1), Dur::from_secs(60));
            p.observe(key("bo", "train", 8), Dur::from_hours(10));
        }
        let runs = [Dur::from_secs(3_500), Dur::from_secs(3_700), Dur::from_secs(3_600)];
        for r in runs {
            p.observe(key("ana", "resnet", 4), r);
        }
        let got = p.predict(key("ana", "resnet", 4)).unwrap();
        assert_eq!((got.basis, got.samples), (Basis::UserNameGpus, 3));
        let err = (got.duration.0 as f64 - 3_600_000.0).abs() / 3_600_000.0;
        assert!(err < 0.10, "{:?} is {:.1}% off", got.duration, err * 100.0);
        assert!(got.confidence > 0.5, "{}", got.confidence);
    }

    #[test]
    fn falls_back_from_specific_to_general_history() {
        let mut p = Predictor::new();
        assert_eq!(p.predict(key("a", "x", 1)), None, "nothing before the first run");
        p.observe(key("a", "x", 2), Dur::from_secs(100));
        let by = |p: &Predictor, k| p.predict(k).map(|x: Prediction| (x.basis, x.duration));
        assert_eq!(by(&p, key("a", "x", 2)), Some((Basis::UserNameGpus, Dur::from_secs(100))));
        assert_eq!(by(&p, key("a", "y", 2)), Some((Basis::UserGpus, Dur::from_secs(100))));
        assert_eq!(by(&p, key("a", "y", 4)), Some((Basis::User, Dur::from_secs(100))));
        assert_eq!(by(&p, key("b", "x", 2)), Some((Basis::All, Dur::from_secs(100))));
        let c = |b| p.predict(b).unwrap().confidence;
        assert!(c(key("a", "x", 2)) > c(key("a", "y", 2)) && c(key("a", "y", 4)) > c(key("b", "x", 2)));
    }

    #[test]
    fn follows_a_job_whose_run_time_drifts() {
        let mut p = Predictor::new();
        for _ in 0..20 {
            p.observe(key("a", "etl", 1), Dur::from_secs(100));
        }
        for _ in 0..30 {
            p.observe(key("a", "etl", 1), Dur::from_secs(400));
        }
        let d = p.predict(key("a", "etl", 1)).unwrap().duration;
        assert!(d > Dur::from_secs(360) && d <= Dur::from_secs(400), "{d:?}");
        let steady = p.predict(key("a", "etl", 1)).unwrap().confidence;
        let mut q = Predictor::new();
        for i in 0..40 {
            q.observe(key("a", "etl", 1), Dur::from_secs(if i % 2 == 0 { 10 } else { 1000 }));
        }
        assert!(q.predict(key("a", "etl", 1)).unwrap().confidence < steady, "a wide spread lowers the confidence");
    }

    #[test]
    fn the_exact_level_is_bounded() {
        let mut p = Predictor::new();
        p.exact_keys = Predictor::MAX_KEYS - 1;
        p.observe(key("u", "last", 1), Dur::from_secs(50));
        assert_eq!(p.exact_keys, Predictor::MAX_KEYS);
        p.observe(key("u", "one-more", 1), Dur::from_secs(5));
        assert_eq!(p.exact_keys, Predictor::MAX_KEYS, "a new name past the bound is not kept");
        assert_eq!(p.predict(key("u", "one-more", 1)).unwrap().basis, Basis::UserGpus);
        // A name already kept still learns.
        p.observe(key("u", "last", 1), Dur::from_secs(50));
        let last = p.predict(key("u", "last", 1)).unwrap();
        assert_eq!((last.basis, last.samples, last.duration), (Basis::UserNameGpus, 2, Dur::from_secs(50)));
        // Past the bound of GPU counts, a new count is learned at the user's level only.
        p.user_gpus_keys = Predictor::MAX_KEYS;
        p.observe(key("u", "wide", 8), Dur::from_secs(500));
        assert_eq!(p.predict(key("u", "wide", 8)).unwrap().basis, Basis::User);
        assert_eq!(p.predict(key("u", "last", 1)).unwrap().basis, Basis::UserNameGpus, "known keys unaffected");
    }

    /// Many users, names and GPU counts: every key predicts from its own runs, and the counts of keys held are
    /// those of the distinct keys learned.
    #[test]
    fn every_level_keeps_its_own_history() {
        let mut p = Predictor::new();
        for u in 0..30u64 {
            for g in [1, 2, 8] {
                for n in 0..5u64 {
                    let secs = 10 + u * 1000 + u64::from(g) * 100 + n;
                    p.observe(key(&format!("u{u}"), &format!("n{n}"), g), Dur::from_secs(secs));
                }
            }
        }
        assert_eq!((p.users.len(), p.user_gpus_keys, p.exact_keys), (30, 90, 450));
        let e = p.predict(key("u7", "n3", 2)).unwrap();
        assert_eq!((e.basis, e.samples, e.duration), (Basis::UserNameGpus, 1, Dur::from_secs(10 + 7000 + 200 + 3)));
        let g = p.predict(key("u7", "new", 2)).unwrap();
        assert_eq!((g.basis, g.samples), (Basis::UserGpus, 5));
        let u = p.predict(key("u7", "new", 4)).unwrap();
        assert_eq!((u.basis, u.samples), (Basis::User, 15));
        let a = p.predict(key("nobody", "new", 4)).unwrap();
        assert_eq!((a.basis, a.samples), (Basis::All, 450));
    }
}
