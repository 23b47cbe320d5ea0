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
    /// Shortest remaining estimated GPU-work first: remaining estimated time × GPUs (SRPT on GPU-time; a wide job
    /// counts for all the GPUs it holds).
    Srgf,
    /// Weighted Dominant Resource Fairness across tenants.
    Drf,
    /// Fair share on decayed historical GPU usage plus current allocation, divided by weight.
    FairShare,
    /// Discretised least attained GPU-service (Tiresias 2D-LAS).
    Las,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 8] = [
        Policy::Fifo,
        Policy::Priority,
        Policy::Sjf,
        Policy::Srtf,
        Policy::Srgf,
        Policy::Drf,
        Policy::FairShare,
        Policy::Las,
    ];

    /// Name as accepted on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Priority => "priority",
            Policy::Sjf => "sjf",
            Policy::Srtf => "srtf",
            Policy::Srgf => "srgf",
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

/// How SRTF and SRGF rank a job whose estimate was learned (one with a spread, [`crate::JobSpec::estimate_spread`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LearnedRank {
    /// By its Gittins rank under the learned log-normal run time ([`crate::gittins`]) when running jobs may be
    /// evicted for shorter ones (preemptive SRTF/SRGF); without that, by the median ([`SchedConfig::learned_rule`]).
    /// On Philly it waits less than `median` in three of four runs, but not for preemptive SRTF at 82% load, the
    /// lowest wait (docs/scheduler.md), so it is not the default.
    Gittins,
    /// By the remaining time to the learned median, as if it were exact (past it: as long again as it has run).
    #[default]
    Median,
}

impl LearnedRank {
    /// Both, by name.
    pub const ALL: [LearnedRank; 2] = [LearnedRank::Gittins, LearnedRank::Median];

    /// The name used in files and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            LearnedRank::Gittins => "gittins",
            LearnedRank::Median => "median",
        }
    }
}

impl FromStr for LearnedRank {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<LearnedRank, CoreError> {
        LearnedRank::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            CoreError::InvalidField { field: "learned_rank", value: s.into(), allowed: "gittins, median".into() }
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
    /// Preemptive SJF/SRTF: under `sjf`, `srtf` or `srgf`, a waiting job whose policy key (estimate ÷ GPUs,
    /// remaining estimated time, or remaining estimated GPU-time) is at most `1 / shorter_ratio` of a running job's evicts it (same victim choice, minimum run
    /// time and rate limit as every preemption). Off by default.
    #[serde(default)]
    pub shorter_first: bool,
    /// How much shorter the waiting job must be (≥ 1; 2 = half the victim's key or less).
    #[serde(default = "default_shorter_ratio")]
    pub shorter_ratio: u32,
    /// Bounds one victim search (≥ 1): with more running jobs than this, the search looks at a window of this many
    /// rows of the running-job table, wrapping, from a place drawn from the waiting job and the time, so that
    /// successive searches cover the cluster; a job held by its own quota looks at its tenant's jobs, lowest priority
    /// and oldest first, until it has found this many candidates.
    #[serde(default = "default_victim_scan_limit")]
    pub victim_scan_limit: u32,
    /// Defragmentation: a blocked head that needs GPUs on one node (or whole nodes) while enough are free in pieces
    /// has the jobs of the cheapest nodes moved to those pieces (evicted, each only when it can start elsewhere at
    /// once; same minimum run time and rate limit as every preemption). Off by default.
    #[serde(default)]
    pub defragment: bool,
}

fn default_shorter_ratio() -> u32 {
    2
}

fn default_victim_scan_limit() -> u32 {
    512
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            enabled: true,
            min_run_time: Dur::from_mins(5),
            max_per_interval: 20,
            interval: Dur::from_mins(10),
            shorter_first: false,
            shorter_ratio: default_shorter_ratio(),
            victim_scan_limit: default_victim_scan_limit(),
            defragment: false,
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
    /// Most jobs examined in vain behind a blocked head per pass: jobs that start there do not count (Slurm's
    /// `bf_max_job_test`, default 500 there, counts every job tested).
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
    /// How SRTF and SRGF rank jobs with learned estimates.
    #[serde(default)]
    pub learned_rank: LearnedRank,
    /// A first stint for jobs whose run time is learned or unknown: a job submitted with a learned estimate longer
    /// than this, or (under SRTF and SRGF) with no estimate at all, is ranked (SRTF and SRGF keys, victim ranks,
    /// backfill's estimated ends) as one that ends this long after it starts until it is known to have run this long
    /// ([`crate::JobSpec::probe_ms`]), then by its estimate, or without one as a job that runs as long again as it has
    /// run. A learned estimate is a class's (a user's jobs of one GPU count, where names repeat little): a short job in
    /// a class learned as long would otherwise wait behind every shorter estimate; its first stint finds it out. A job
    /// without estimate would otherwise wait behind every job with one, and once started never be evicted for a
    /// shorter one, however long it ran. Off (`None`) by default; a job keeps what it was submitted under.
    #[serde(default)]
    pub probe: Option<Dur>,
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
            learned_rank: LearnedRank::default(),
            probe: None,
        }
    }
}

/// The largest `backfill_depth` and `reservation_horizon`: a pass may walk that many jobs.
pub const MAX_WALK: usize = 1_000_000;

/// The longest scheduling tick a file or flag may set: a pass runs at least this often while jobs wait.
pub const MAX_TICK: Dur = Dur::from_hours(1);

/// The longest stop time a file or flag may set (the simulator's: from asking an evicted job to stop until it is gone).
pub const MAX_STOP_TIME: Dur = Dur::from_hours(24);

/// The longest restart backoff a file or flag may set (it doubles with each restart, up to 32 times this).
pub const MAX_RESTART_BACKOFF: Dur = Dur::from_hours(24);

/// The longest minimum run time a file or flag may set (no running job younger than it is evicted for another).
pub const MAX_MIN_RUN_TIME: Dur = Dur::from_hours(24 * 7);

/// The name of the recommended scheduler setting ([`SchedConfig::recommended`]), accepted by `--policy` and the
/// default of `gpunet up` and `gpunet server`.
pub const RECOMMENDED_POLICY: &str = "auto";

/// How much shorter (in remaining estimated GPU-work) a waiting job must be to evict a running one under the
/// recommended setting.
pub const RECOMMENDED_SHORTER_RATIO: u32 = 8;

/// The first stint of jobs with learned estimates, or none, under the recommended setting ([`SchedConfig::probe`]).
pub const RECOMMENDED_PROBE: Dur = Dur::from_mins(15);

/// A policy as `--policy` names it: the recommended setting ([`RECOMMENDED_POLICY`]) or a policy used as named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyName {
    /// `auto`: [`SchedConfig::recommended`].
    Recommended,
    /// A policy by its name.
    Plain(Policy),
}

impl PolicyName {
    /// The name `--policy` takes for it.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyName::Recommended => RECOMMENDED_POLICY,
            PolicyName::Plain(p) => p.name(),
        }
    }
}

impl FromStr for PolicyName {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<PolicyName, CoreError> {
        if s.trim().eq_ignore_ascii_case(RECOMMENDED_POLICY) {
            return Ok(PolicyName::Recommended);
        }
        s.parse().map(PolicyName::Plain).map_err(|_| CoreError::InvalidField {
            field: "policy",
            value: s.into(),
            allowed: std::iter::once(RECOMMENDED_POLICY)
                .chain(Policy::ALL.iter().map(|p| p.name()))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// In files as in `--policy`: `"auto"` or a policy's name.
impl<'de> Deserialize<'de> for PolicyName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PolicyName, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for PolicyName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl SchedConfig {
    /// The default configuration with a policy.
    pub fn with_policy(policy: Policy) -> SchedConfig {
        SchedConfig { policy, ..SchedConfig::default() }
    }

    /// The recommended setting, `auto`: SRGF (shortest remaining estimated GPU-work first; estimates learned from
    /// the submitter's earlier jobs when a job gives none) with EASY backfill, where a waiting job evicts a running one
    /// whose remaining estimated GPU-work is at least [`RECOMMENDED_SHORTER_RATIO`] times its own, with
    /// defragmentation ([`PreemptionConfig::defragment`]) and a first stint of [`RECOMMENDED_PROBE`] for jobs with
    /// learned estimates or none ([`SchedConfig::probe`]), every other knob at its default. Chosen by
    /// `scripts/choose-default.py` over seven workload families built from the shipped traces (Philly at 82% and 90%
    /// load, PAI 2023, the Pollux and Sia workloads) with learned estimates: chosen on half of them (`--held-out`) as
    /// the lowest average wait of the settings that lose at most 5% of GPU-hours to evictions on every workload, it
    /// waits 0.20 of FIFO's on the other half (geometric mean over the families); docs/scheduler.md has the tables.
    pub fn recommended() -> SchedConfig {
        let mut c = SchedConfig { backfill: true, ..SchedConfig::default() };
        c.use_recommended_policy();
        c
    }

    /// The recommended setting's policy.
    pub const RECOMMENDED_POLICY: Policy = Policy::Srgf;

    /// Sets the recommended setting's policy and preemption for shorter jobs, keeping every other knob.
    pub fn use_recommended_policy(&mut self) {
        self.policy = Self::RECOMMENDED_POLICY;
        self.preemption.shorter_first = true;
        self.preemption.shorter_ratio = RECOMMENDED_SHORTER_RATIO;
        self.preemption.defragment = true;
        self.probe = Some(RECOMMENDED_PROBE);
    }

    /// Sets a policy as named, without preemption for shorter jobs (the knobs `preemptive` and `shorter_ratio` turn
    /// it on), keeping every other knob.
    pub fn use_plain_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.preemption.shorter_first = false;
        self.preemption.shorter_ratio = default_shorter_ratio();
        self.preemption.defragment = false;
        self.probe = None;
    }

    /// How learned run times are ranked: with [`LearnedRank::Gittins`], by their Gittins rank under SRTF/SRGF when
    /// running jobs may be evicted for ones ranked ahead (preemption on, with `shorter_first`), else by the median
    /// as if exact; with [`LearnedRank::Median`], always by the median. (Without preemption a started job runs to
    /// its end; on Philly the median then waits less than the Gittins rank at the start: docs/scheduler.md.)
    pub fn learned_rule(&self) -> crate::gittins::Rule {
        match self.learned_rank {
            LearnedRank::Gittins
                if matches!(self.policy, Policy::Srtf | Policy::Srgf)
                    && self.preemption.enabled
                    && self.preemption.shorter_first =>
            {
                crate::gittins::Rule::Gittins
            }
            _ => crate::gittins::Rule::Median,
        }
    }

    /// The probe ([`SchedConfig::probe`]) a job submitted now with `spec` gets, as the job keeps it
    /// ([`crate::JobSpec::probe_ms`]; `validate` keeps the probe within its 32 bits): the configured one, for a
    /// learned estimate (one with a spread) longer than it, or under SRTF and SRGF (which rank by it) for no estimate.
    pub fn probe_for(&self, spec: &crate::JobSpec) -> Option<std::num::NonZeroU32> {
        self.probe
            .filter(|p| match spec.estimated_duration {
                None => matches!(self.policy, Policy::Srtf | Policy::Srgf),
                Some(e) => spec.estimate_spread.is_some() && e > *p,
            })
            .and_then(|p| u32::try_from(p.0).ok())
            .and_then(std::num::NonZeroU32::new)
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

    /// Whether a running job may be evicted for a much shorter one: preemption on, `preemptive`, and a policy with
    /// a key of remaining work (SJF, SRTF, SRGF).
    pub fn evicts_for_shorter(&self) -> bool {
        let pre = &self.preemption;
        pre.enabled && pre.shorter_first && matches!(self.policy, Policy::Sjf | Policy::Srtf | Policy::Srgf)
    }

    /// Knobs `given` sets (a file's, with the flags given laid over them) to something that has no effect with the
    /// rest of this configuration, each said as a sentence (a server logs them as warnings at start, the simulator
    /// prints them): the configuration is valid, but it is probably not what was meant. What a policy sets by itself
    /// (`auto`'s preemption for shorter jobs and defragmentation) is not named.
    pub fn ignored_knobs(&self, given: &SchedKnobs) -> Vec<String> {
        let pre = &self.preemption;
        let mut out = Vec::new();
        let preemptive = given.preemptive == Some(true) && pre.shorter_first;
        let defragment = given.defragment == Some(true) && pre.defragment;
        if !pre.enabled {
            for (on, knob) in [(preemptive, "preemptive"), (defragment, "defragment")] {
                if on {
                    out.push(format!("{knob} = true does nothing with preemption = false (no job is evicted)"));
                }
            }
        } else if preemptive && !self.evicts_for_shorter() {
            out.push(format!(
                "preemptive = true does nothing under {}: only sjf, srtf and srgf evict for shorter jobs",
                self.policy
            ));
        }
        if given.shorter_ratio.is_some() && !self.evicts_for_shorter() {
            out.push(format!(
                "shorter_ratio does nothing here: no job is evicted for a shorter one under {} (that takes \
                 preemption, preemptive = true and sjf, srtf or srgf)",
                self.policy
            ));
        }
        if given.las_thresholds_gpu_s.is_some() && self.policy != Policy::Las {
            out.push(format!(
                "las_thresholds_gpu_s does nothing under {}: only las queues jobs by their attained service",
                self.policy
            ));
        }
        if given.fairshare_half_life.is_some() && self.policy != Policy::FairShare {
            out.push(format!(
                "fairshare_half_life orders nothing under {}: only fairshare ranks tenants by their decayed usage \
                 (the usage tenants are shown still decays by it)",
                self.policy
            ));
        }
        if given.max_evictions == Some(0) && pre.enabled {
            out.push("max_evictions = 0 allows no eviction at all: preemption = false says so".into());
        }
        if given.probe.is_some_and(|p| p.0 != Dur::ZERO)
            && !matches!(self.policy, Policy::Srtf | Policy::Srgf)
            && !self.backfill
        {
            out.push(format!(
                "probe does nothing under {} without backfill: only srtf and srgf rank jobs by it, and backfill \
                 counts a probing job's end by it",
                self.policy
            ));
        }
        if given.learned_rank == Some(LearnedRank::Gittins) && self.learned_rule() == crate::gittins::Rule::Median {
            out.push(
                "learned_rank = \"gittins\" does nothing here: Gittins ranks are used only under srtf or srgf with \
                 preemption and preemptive = true"
                    .into(),
            );
        }
        out
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
        if self.preemption.shorter_ratio == 0 {
            return Err(CoreError::InvalidField {
                field: "shorter_ratio",
                value: "0".into(),
                allowed: "a ratio of at least 1".into(),
            });
        }
        // SJF's key never changes as a job runs: at a ratio of 1 two jobs of one key would evict each other in turn
        // (each as long as the other), every minimum run time, and neither would reach a checkpoint.
        if self.policy == Policy::Sjf && self.preemption.shorter_first && self.preemption.shorter_ratio < 2 {
            return Err(CoreError::InvalidField {
                field: "shorter_ratio",
                value: self.preemption.shorter_ratio.to_string(),
                allowed:
                    "at least 2 under preemptive sjf (its keys never change: at 1, two jobs of one estimate would \
                          evict each other forever)"
                        .into(),
            });
        }
        // A backoff or minimum run time of years reads as one that never ends: a failed job shown waiting "for
        // 5111999999999h more", preemption quietly off.
        if self.restart_backoff > MAX_RESTART_BACKOFF {
            return Err(CoreError::InvalidField {
                field: "restart_backoff",
                value: human(self.restart_backoff),
                allowed: "at most 1d (86400s): it doubles with each restart, up to 32 times that".into(),
            });
        }
        if self.preemption.min_run_time > MAX_MIN_RUN_TIME {
            return Err(CoreError::InvalidField {
                field: "min_run_time",
                value: human(self.preemption.min_run_time),
                allowed: "at most 7d (604800s); to evict nothing, preemption = false".into(),
            });
        }
        if self.preemption.victim_scan_limit == 0 {
            return Err(CoreError::InvalidField {
                field: "victim_scan_limit",
                value: "0".into(),
                allowed: "at least 1 running job".into(),
            });
        }
        if let Some(p) = self.probe.filter(|p| p.0 > u32::MAX as u64) {
            return Err(CoreError::InvalidField {
                field: "probe",
                value: human(p),
                allowed: "at most 49 days (4294967295ms)".into(),
            });
        }
        for (field, v) in [("backfill_depth", self.backfill_depth), ("reservation_horizon", self.reservation_horizon)] {
            if v > MAX_WALK {
                return Err(CoreError::InvalidField {
                    field,
                    value: v.to_string(),
                    allowed: format!("at most {MAX_WALK} (each pass may look at that many jobs)"),
                });
            }
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

/// A duration as a file would write it: in the largest unit that divides it (`"2d"`, `"90s"`, `"1500ms"`).
fn human(d: Dur) -> String {
    let ms = d.0;
    let units = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    match units.iter().find(|(u, _)| ms > 0 && ms.is_multiple_of(*u)) {
        Some((u, name)) => format!("{}{name}", ms / u),
        None if ms == 0 => "0s".into(),
        None => format!("{ms}ms"),
    }
}

/// A duration written for people: a whole number with a unit — `ms`, `s`, `m`, `h` or `d` (`"90s"`, `"10m"`); a bare
/// number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct HumanDur(pub Dur);

impl From<HumanDur> for String {
    fn from(d: HumanDur) -> String {
        format!("{}ms", d.0 .0)
    }
}

/// A duration unit's name, for messages.
fn unit_name(unit: &str) -> &'static str {
    match unit {
        "d" => "days",
        "h" => "hours",
        "m" => "minutes",
        _ => "seconds",
    }
}

impl FromStr for HumanDur {
    type Err = String;
    fn from_str(s: &str) -> Result<HumanDur, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if unit.starts_with('.') && !num.is_empty() {
            // The same in the next smaller unit ("1.5h": "90m"; "1.5s": "1500ms"), rounded.
            let end = 1 + unit[1..].find(|c: char| !c.is_ascii_digit()).unwrap_or(unit.len() - 1);
            let (frac, u) = unit.split_at(end);
            let x: f64 = format!("{num}{frac}").parse().unwrap_or(0.0);
            let smaller = match u {
                "d" => (24.0, "h"),
                "h" => (60.0, "m"),
                "m" => (60.0, "s"),
                "" | "s" => (1000.0, "ms"),
                "ms" => return Err(format!("{s:?} is not a whole number: ms is the smallest unit")),
                _ => return Err(format!("{s:?} has an unknown unit; allowed are ms, s, m, h, d")),
            };
            let (k, v) = smaller;
            let n = (x * k).round();
            // Only a whole number of that unit that is the same duration is suggested (not "0ms" for "0.0001s").
            return Err(if (1.0..1e12).contains(&n) && (n - x * k).abs() < 1e-9 * n.max(1.0) {
                format!("{s:?} is not a whole number: write e.g. \"{}{v}\"", n as u64)
            } else {
                format!("{s:?} is not a whole number of {}: write a whole number of a smaller unit", unit_name(u))
            });
        }
        let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration such as \"90s\" or \"10m\""))?;
        let ms: u64 = match unit {
            "ms" => 1,
            "" | "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(format!("{s:?} has an unknown unit; allowed are ms, s, m, h, d")),
        };
        n.checked_mul(ms).map(|v| HumanDur(Dur(v))).ok_or_else(|| format!("{s:?} is too long"))
    }
}

impl<'de> Deserialize<'de> for HumanDur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<HumanDur, D::Error> {
        /// A text with its unit, or whole seconds; anything else is refused saying what was expected.
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = HumanDur;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a duration such as \"90s\" or \"10m\" (a whole number with ms, s, m, h or d), or whole seconds",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<HumanDur, E> {
                n.checked_mul(1000)
                    .map(|v| HumanDur(Dur(v)))
                    .ok_or_else(|| E::custom(format!("{n} seconds is too long")))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<HumanDur, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => {
                        Err(E::custom(format!("{n} is negative: a duration is \"90s\", \"10m\" or whole seconds")))
                    }
                }
            }
            fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<HumanDur, E> {
                Err(E::custom(format!("{x} is not a whole number of seconds: write e.g. \"1500ms\" or \"90m\"")))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<HumanDur, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The scheduler's knobs as written in a file: the `[scheduler]` table of the simulator's cluster TOML and of the
/// server's `--sched-config` file. Every field is optional; what is absent keeps its default (or the command line's
/// value). `tick`, `checkpoint_interval` and `stop_time` are the simulator's (the live server has `tick` too; live
/// checkpoints and stops are the jobs' and agents' own).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedKnobs {
    /// Queue policy (`fifo`, `priority`, `sjf`, `srtf`, `srgf`, `drf`, `fairshare`, `las`), or `auto`: the
    /// recommended setting ([`SchedConfig::use_recommended_policy`], with backfill), which the file's other knobs tune.
    pub policy: Option<PolicyName>,
    /// EASY backfill.
    pub backfill: Option<bool>,
    /// Preemption at all.
    pub preemption: Option<bool>,
    /// Preemptive SJF/SRTF ([`PreemptionConfig::shorter_first`]).
    pub preemptive: Option<bool>,
    /// [`PreemptionConfig::shorter_ratio`].
    pub shorter_ratio: Option<u32>,
    /// LAS thresholds in GPU-seconds, strictly increasing; `n` thresholds make `n + 1` queues.
    pub las_thresholds_gpu_s: Option<Vec<u64>>,
    /// A job younger than this in its attempt is never preempted.
    pub min_run_time: Option<HumanDur>,
    /// At most this many evictions …
    pub max_evictions: Option<u32>,
    /// … in any window of this length.
    pub eviction_window: Option<HumanDur>,
    /// [`PreemptionConfig::victim_scan_limit`].
    pub victim_scan_limit: Option<u32>,
    /// [`PreemptionConfig::defragment`].
    pub defragment: Option<bool>,
    /// Backoff before a restart (doubling, capped at 32×).
    pub restart_backoff: Option<HumanDur>,
    /// [`SchedConfig::backfill_depth`]: most jobs tried in vain behind a blocked head per pass.
    pub backfill_depth: Option<usize>,
    /// [`SchedConfig::reservation_horizon`]: most running jobs' ends a reservation looks ahead.
    pub reservation_horizon: Option<usize>,
    /// [`SchedConfig::fairshare_half_life`]: half-life of past usage under fair share.
    pub fairshare_half_life: Option<HumanDur>,
    /// How SRTF/SRGF rank jobs with learned estimates: `median` (default) or `gittins`.
    pub learned_rank: Option<LearnedRank>,
    /// [`SchedConfig::probe`]; `"0s"` turns it off.
    pub probe: Option<HumanDur>,
    /// Scheduling tick (how often a pass runs while jobs wait).
    pub tick: Option<HumanDur>,
    /// How often jobs checkpoint (simulator).
    pub checkpoint_interval: Option<HumanDur>,
    /// Time from asking a job to stop until it is gone (simulator; default: measured stop times).
    pub stop_time: Option<HumanDur>,
}

impl SchedKnobs {
    /// Parses a `[scheduler]` table's text (the table's body, or a whole file holding `[scheduler]`).
    pub fn from_toml(text: &str) -> Result<SchedKnobs, CoreError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            version: Option<u32>,
            scheduler: Option<SchedKnobs>,
        }
        let f: File = toml::from_str(text).map_err(|e| CoreError::InvalidFile {
            what: "the [scheduler] table (docs/scheduler.md, \"Knobs\")",
            message: e.to_string().trim_end().to_string(),
        })?;
        if let Some(v) = f.version.filter(|v| *v != 1) {
            return Err(CoreError::InvalidField { field: "version", value: v.to_string(), allowed: "1".into() });
        }
        Ok(f.scheduler.unwrap_or_default())
    }

    /// Applies the knobs that are set to `cfg` and checks the result; on an error `cfg` is left as it was.
    pub fn apply(&self, cfg: &mut SchedConfig) -> Result<(), CoreError> {
        let mut next = cfg.clone();
        self.apply_unchecked(&mut next)?;
        next.validate()?;
        *cfg = next;
        Ok(())
    }

    fn apply_unchecked(&self, cfg: &mut SchedConfig) -> Result<(), CoreError> {
        match self.policy {
            Some(PolicyName::Plain(p)) => cfg.policy = p,
            Some(PolicyName::Recommended) => {
                cfg.use_recommended_policy();
                cfg.backfill = true;
            }
            None => {}
        }
        if let Some(b) = self.backfill {
            cfg.backfill = b;
        }
        let pre = &mut cfg.preemption;
        if let Some(v) = self.preemption {
            pre.enabled = v;
        }
        if let Some(v) = self.preemptive {
            pre.shorter_first = v;
        }
        if let Some(v) = self.shorter_ratio {
            pre.shorter_ratio = v;
        }
        if let Some(v) = self.min_run_time {
            pre.min_run_time = v.0;
        }
        if let Some(v) = self.max_evictions {
            pre.max_per_interval = v;
        }
        if let Some(v) = self.victim_scan_limit {
            pre.victim_scan_limit = v;
        }
        if let Some(v) = self.defragment {
            pre.defragment = v;
        }
        if let Some(v) = self.eviction_window {
            if v.0 == Dur::ZERO {
                return Err(CoreError::InvalidField {
                    field: "eviction_window",
                    value: "0s".into(),
                    allowed: "a positive duration".into(),
                });
            }
            pre.interval = v.0;
        }
        if let Some(v) = &self.las_thresholds_gpu_s {
            cfg.las_thresholds_gpu_s = v.clone();
        }
        if let Some(v) = self.restart_backoff {
            cfg.restart_backoff = v.0;
        }
        if let Some(v) = self.learned_rank {
            cfg.learned_rank = v;
        }
        if let Some(v) = self.backfill_depth {
            cfg.backfill_depth = v;
        }
        if let Some(v) = self.reservation_horizon {
            cfg.reservation_horizon = v;
        }
        if let Some(v) = self.fairshare_half_life {
            cfg.fairshare_half_life = v.0;
        }
        if let Some(v) = self.probe {
            cfg.probe = (v.0 != Dur::ZERO).then_some(v.0);
        }

        if let Some(t) = self.tick.filter(|t| t.0 == Dur::ZERO || t.0 > MAX_TICK) {
            return Err(CoreError::InvalidField {
                field: "tick",
                value: human(t.0),
                allowed: "a positive duration of at most 1h (a pass runs at least this often while jobs wait: what \
                          time alone changes, a backoff's end, a minimum run time, a LAS demotion, waits for it)"
                    .into(),
            });
        }
        if let Some(t) = self.stop_time.filter(|t| t.0 > MAX_STOP_TIME) {
            return Err(CoreError::InvalidField {
                field: "stop_time",
                value: human(t.0),
                allowed: "at most 1d (86400s), as --stop-time-s".into(),
            });
        }
        if self.checkpoint_interval.is_some_and(|t| t.0 == Dur::ZERO) {
            return Err(CoreError::InvalidField {
                field: "checkpoint_interval",
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
    fn a_policy_name_is_auto_or_a_policy_and_a_bad_one_lists_both() {
        assert_eq!(" AUTO ".parse::<PolicyName>(), Ok(PolicyName::Recommended));
        assert_eq!("srtf".parse::<PolicyName>(), Ok(PolicyName::Plain(Policy::Srtf)));
        let e = "shortest".parse::<PolicyName>().unwrap_err().to_string();
        assert!(e.contains("invalid policy \"shortest\"") && e.contains("auto, fifo, priority"), "{e}");
    }

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

    #[test]
    fn knobs_parse_human_durations_and_apply_only_what_is_set() {
        let k = SchedKnobs::from_toml(
            "version = 1\n[scheduler]\npolicy = \"las\"\nlas_thresholds_gpu_s = [100, 1000, 10000]\nmin_run_time = \"90s\"\n\
             max_evictions = 3\neviction_window = \"1h\"\ntick = 5\ncheckpoint_interval = \"10m\"\nstop_time = \"500ms\"\n\
             learned_rank = \"gittins\"\nvictim_scan_limit = 7\nrestart_backoff = \"30s\"\nbackfill_depth = 50\n\
             reservation_horizon = 9\nfairshare_half_life = \"2h\"\npreemptive = true\nshorter_ratio = 4\ndefragment = true\n\
             preemption = false\n",
        )
        .unwrap();
        let mut c = SchedConfig::default();
        assert_eq!(c.learned_rank, LearnedRank::Median);
        k.apply(&mut c).unwrap();
        assert_eq!(c.policy, Policy::Las);
        assert_eq!(c.learned_rank, LearnedRank::Gittins);
        assert_eq!(c.las_queue(10_000_000), 3, "three thresholds make four queues");
        assert_eq!(c.preemption.min_run_time, Dur::from_secs(90));
        assert_eq!((c.preemption.max_per_interval, c.preemption.interval), (3, Dur::from_hours(1)));
        assert_eq!(c.preemption.victim_scan_limit, 7);
        assert_eq!(c.restart_backoff, Dur::from_secs(30));
        assert_eq!((c.backfill_depth, c.reservation_horizon), (50, 9));
        assert_eq!(c.fairshare_half_life, Dur::from_hours(2));
        let p = &c.preemption;
        assert_eq!((p.enabled, p.shorter_first, p.shorter_ratio, p.defragment), (false, true, 4, true));
        assert_eq!(c.backfill, SchedConfig::default().backfill, "absent knobs keep their value");
        assert_eq!(k.tick, Some(HumanDur(Dur::from_secs(5))));
        assert_eq!(k.checkpoint_interval, Some(HumanDur(Dur::from_mins(10))));
        assert_eq!(k.stop_time, Some(HumanDur(Dur(500))));
    }

    /// `policy = "auto"` in a file is the recommended setting, as `--policy auto` is (it was refused as an unknown
    /// variant), and the file's other knobs tune it; a bad name lists `auto` with the policies.
    #[test]
    fn a_file_may_name_auto() {
        let k = SchedKnobs::from_toml("[scheduler]\npolicy = \"auto\"\nshorter_ratio = 4\n").unwrap();
        assert_eq!(k.policy, Some(PolicyName::Recommended));
        let mut c = SchedConfig::default();
        k.apply(&mut c).unwrap();
        let auto = SchedConfig {
            preemption: PreemptionConfig { shorter_ratio: 4, ..SchedConfig::recommended().preemption },
            ..SchedConfig::recommended()
        };
        assert_eq!(c, auto);
        let k = SchedKnobs::from_toml("[scheduler]\npolicy = \"srtf\"\n").unwrap();
        assert_eq!(k.policy, Some(PolicyName::Plain(Policy::Srtf)));
        let e = SchedKnobs::from_toml("[scheduler]\npolicy = \"lottery\"\n").unwrap_err().to_string();
        assert!(e.contains("lottery") && e.contains("auto, fifo"), "{e}");
    }

    #[test]
    fn the_probe_knob_sets_a_length_or_turns_it_off_and_auto_has_one() {
        let mut c = SchedConfig::recommended();
        assert_eq!(c.probe, Some(RECOMMENDED_PROBE));
        SchedKnobs::from_toml("[scheduler]\nprobe = \"0s\"\n").unwrap().apply(&mut c).unwrap();
        assert_eq!(c.probe, None);
        SchedKnobs::from_toml("[scheduler]\nprobe = \"10m\"\n").unwrap().apply(&mut c).unwrap();
        assert_eq!(c.probe, Some(Dur::from_mins(10)));
        c.use_plain_policy(Policy::Srtf);
        assert_eq!(c.probe, None, "a policy named is used as named");
        let e = SchedKnobs::from_toml("[scheduler]\nprobe = \"10 minutes\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown unit"), "{e}");
        let mut d = SchedConfig::default();
        let e = SchedKnobs::from_toml("[scheduler]\nprobe = \"50d\"\n").unwrap().apply(&mut d).unwrap_err();
        assert!(e.to_string().contains("probe") && e.to_string().contains("49 days"), "{e}");
        assert_eq!(d, SchedConfig::default(), "a refused knob changes nothing");
        // A learned estimate longer than the probe gets it, a given one or a shorter one does not.
        let c = SchedConfig { probe: Some(Dur::from_mins(15)), ..SchedConfig::default() };
        let mut spec = crate::JobSpec::new(crate::TenantId(0), "x", 1, 1).estimate(Dur::from_mins(16));
        assert_eq!(c.probe_for(&spec), None, "a given estimate is taken as exact");
        spec.estimate_spread = Some(0.5);
        assert_eq!(c.probe_for(&spec), std::num::NonZeroU32::new(900_000));
        spec.estimated_duration = Some(Dur::from_mins(15));
        assert_eq!(c.probe_for(&spec), None);
        // A job without estimate gets it too under SRTF and SRGF: it is ranked by it, then as running as long again
        // as it has run. Other policies do not rank by it (and backfill would take it for the job's length).
        spec.estimated_duration = None;
        spec.estimate_spread = None;
        for (policy, probe) in [(Policy::Srgf, Some(900_000)), (Policy::Srtf, Some(900_000)), (Policy::Sjf, None)] {
            let c = SchedConfig { policy, ..c.clone() };
            assert_eq!(c.probe_for(&spec), probe.and_then(std::num::NonZeroU32::new), "{policy:?}");
        }
        assert_eq!(c.probe_for(&spec), None, "FIFO (the default policy)");
        assert_eq!(SchedConfig::recommended().probe_for(&spec), std::num::NonZeroU32::new(900_000), "auto");
        let off = SchedConfig { probe: None, ..SchedConfig::recommended() };
        assert_eq!(off.probe_for(&spec), None, "no probe configured: none");
    }

    #[test]
    fn bad_knobs_name_the_field_and_change_nothing() {
        let e = SchedKnobs::from_toml("[scheduler]\nmin_run_tme = \"5m\"\n").unwrap_err().to_string();
        assert!(e.contains("min_run_tme"), "{e}");
        let e = SchedKnobs::from_toml("[scheduler]\nlearned_rank = \"mean\"\n").unwrap_err().to_string();
        assert!(e.contains("mean") && e.contains("gittins"), "{e}");
        let e = SchedKnobs::from_toml("[scheduler]\ntick = \"5 parsecs\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown unit"), "{e}");
        let k = SchedKnobs::from_toml("[scheduler]\nlas_thresholds_gpu_s = [10, 5]\n").unwrap();
        let mut c = SchedConfig::default();
        let e = k.apply(&mut c).unwrap_err().to_string();
        assert!(e.contains("las_thresholds_gpu_s"), "{e}");
        assert_eq!(c, SchedConfig::default(), "a refused file changes nothing");
        let e = SchedKnobs::from_toml("[scheduler]\neviction_window = \"0s\"\n").unwrap().apply(&mut c).unwrap_err();
        assert!(e.to_string().contains("eviction_window"));
        let e = SchedKnobs::from_toml("[scheduler]\nvictim_scan_limit = 0\n").unwrap().apply(&mut c).unwrap_err();
        assert!(e.to_string().contains("victim_scan_limit"), "{e}");
        assert_eq!(c, SchedConfig::default(), "a refused file changes nothing");
        let mut refused =
            |text: &str| SchedKnobs::from_toml(text).and_then(|k| k.apply(&mut c)).unwrap_err().to_string();
        // Bounds: a tick over an hour, a stop time over a day, a walk over a million jobs.
        assert!(refused("[scheduler]\ntick = \"61m\"\n")
            .starts_with("invalid tick \"61m\": allowed is a positive duration of at most 1h"));
        assert!(refused("[scheduler]\nstop_time = \"2d\"\n").contains("invalid stop_time"));
        assert!(refused("[scheduler]\nreservation_horizon = 2000000\n").contains("invalid reservation_horizon"));
        assert!(refused("[scheduler]\nfairshare_half_life = \"0s\"\n").contains("fairshare_half_life"));
        // A restart backoff over a day, a minimum run time over a week (a failed job waited "5111999999999h more").
        let e = refused("[scheduler]\nrestart_backoff = \"213000000000d\"\n");
        assert!(e.starts_with("invalid restart_backoff \"213000000000d\": allowed is at most 1d"), "{e}");
        let e = refused("[scheduler]\nmin_run_time = \"8d\"\n");
        assert!(
            e.starts_with("invalid min_run_time \"8d\": allowed is at most 7d") && e.contains("preemption = false")
        );
        for ok in ["[scheduler]\nrestart_backoff = \"1d\"\n", "[scheduler]\nmin_run_time = \"7d\"\n"] {
            SchedKnobs::from_toml(ok).unwrap().apply(&mut SchedConfig::default()).unwrap();
        }
        let e = refused("[scheduler]\npolicy = \"sjf\"\npreemptive = true\nshorter_ratio = 1\n");
        assert!(e.contains("invalid shorter_ratio \"1\"") && e.contains("at least 2 under preemptive sjf"), "{e}");
        // At 1 under SRTF and SRGF a job's key falls as it runs: it is not evicted back.
        for policy in ["srtf", "srgf"] {
            let k = SchedKnobs::from_toml(&format!(
                "[scheduler]\npolicy = \"{policy}\"\npreemptive = true\nshorter_ratio = 1\n"
            ));
            assert!(k.unwrap().apply(&mut SchedConfig::default()).is_ok(), "{policy}");
        }
        assert_eq!(c, SchedConfig::default(), "a refused file changes nothing");
    }

    /// A duration of the wrong kind says what a duration is, naming the key and the line (it said "data did not match
    /// any variant of untagged enum Raw"); the file's syntax errors keep the parser's lines.
    #[test]
    fn a_duration_of_the_wrong_kind_says_what_is_expected() {
        let e = |v: &str| SchedKnobs::from_toml(&format!("[scheduler]\ntick = {v}\n")).unwrap_err().to_string();
        for (v, says) in [
            ("-5", "-5 is negative: a duration is \"90s\", \"10m\" or whole seconds"),
            ("1.5", "1.5 is not a whole number of seconds"),
            ("nan", "NaN is not a whole number of seconds"),
            ("\"1.5h\"", "\"1.5h\" is not a whole number: write e.g. \"90m\""),
            ("\"1.5s\"", "\"1.5s\" is not a whole number: write e.g. \"1500ms\""),
            ("\"2.25d\"", "\"2.25d\" is not a whole number: write e.g. \"54h\""),
            ("\"1.5ms\"", "\"1.5ms\" is not a whole number: ms is the smallest unit"),
            ("\"1.5x\"", "\"1.5x\" has an unknown unit; allowed are ms, s, m, h, d"),
            ("\"1.5min\"", "\"1.5min\" has an unknown unit"),
            ("\"0.0001s\"", "\"0.0001s\" is not a whole number of seconds: write a whole number of a smaller unit"),
            ("\"1.2345s\"", "\"1.2345s\" is not a whole number of seconds: write a whole number of a smaller unit"),
            ("\"99999999999999999999.5d\"", "is not a whole number of days"),
            ("true", "expected a duration such as \"90s\""),
        ] {
            let m = e(v);
            assert!(m.contains(says) && m.contains("tick") && m.contains("line 2"), "{v}: {m}");
            assert!(!m.contains("untagged"), "{m}");
        }
        assert_eq!(SchedKnobs::from_toml("[scheduler]\ntick = 90\n").unwrap().tick, Some(HumanDur(Dur::from_secs(90))));
        let m = SchedKnobs::from_toml("[scheduler]\nmin_run_time = -1\n").unwrap_err();
        assert!(matches!(m, CoreError::InvalidFile { .. }), "{m:?}");
        assert!(m.to_string().starts_with("the [scheduler] table") && m.to_string().contains("\n"), "{m}");
        let v = SchedKnobs::from_toml("version = 2\n[scheduler]\n").unwrap_err().to_string();
        assert_eq!(v, "invalid version \"2\": allowed is 1");
    }

    /// Knobs given that do nothing with the rest of the configuration are named (a server warns at start, `sim`
    /// prints them); a configuration where each does something has none, and what a policy sets by itself is not
    /// named (`auto` with `preemption = false` alone warned of `preemptive` and `defragment`, which it set).
    #[test]
    fn knobs_that_do_nothing_are_named() {
        let knobs = |text: &str| SchedKnobs::from_toml(&format!("[scheduler]\n{text}")).unwrap();
        let all = knobs("preemptive = true\ndefragment = true\nlearned_rank = \"gittins\"\n");
        let mut c = SchedConfig::recommended();
        all.apply(&mut c).unwrap();
        assert_eq!(c.ignored_knobs(&all), Vec::<String>::new(), "auto, its Gittins ranks used");
        c.preemption.enabled = false;
        assert_eq!(c.ignored_knobs(&knobs("preemption = false\n")), Vec::<String>::new(), "auto's own are not named");
        let w = c.ignored_knobs(&all);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].starts_with("preemptive = true does nothing with preemption = false"), "{w:?}");
        assert!(w[1].starts_with("defragment = true does nothing with preemption = false"), "{w:?}");
        assert!(w[2].starts_with("learned_rank = \"gittins\" does nothing here"), "{w:?}");
        let c = SchedConfig { policy: Policy::Las, ..SchedConfig::recommended() };
        assert_eq!(c.ignored_knobs(&knobs("")), Vec::<String>::new());
        assert_eq!(
            c.ignored_knobs(&knobs("preemptive = true\n")),
            vec!["preemptive = true does nothing under las: only sjf, srtf and srgf evict for shorter jobs".to_string()]
        );
        assert_eq!(c.ignored_knobs(&all).len(), 2, "and Gittins ranks are not used under las");
        // Knobs of other policies, or of an eviction that never happens.
        let fifo = SchedConfig::with_policy(Policy::Fifo);
        let w = fifo.ignored_knobs(&knobs(
            "shorter_ratio = 4\nlas_thresholds_gpu_s = [60]\nfairshare_half_life = \"1h\"\nmax_evictions = 0\n\
             probe = \"15m\"\n",
        ));
        let starts = [
            "shorter_ratio does nothing here: no job is evicted for a shorter one under fifo",
            "las_thresholds_gpu_s does nothing under fifo",
            "fairshare_half_life orders nothing under fifo",
            "max_evictions = 0 allows no eviction at all",
            "probe does nothing under fifo without backfill",
        ];
        assert_eq!(w.len(), starts.len(), "{w:?}");
        for (w, s) in w.iter().zip(starts) {
            assert!(w.starts_with(s), "{w} / {s}");
        }
        // Where each does something, nothing is said.
        let mut srtf = SchedConfig::with_policy(Policy::Srtf);
        knobs("preemptive = true\n").apply(&mut srtf).unwrap();
        assert!(srtf.ignored_knobs(&knobs("shorter_ratio = 4\nprobe = \"15m\"\n")).is_empty());
        let las = SchedConfig::with_policy(Policy::Las);
        assert!(las.ignored_knobs(&knobs("las_thresholds_gpu_s = [60]\n")).is_empty());
        let fs = SchedConfig::with_policy(Policy::FairShare);
        assert!(fs.ignored_knobs(&knobs("fairshare_half_life = \"1h\"\n")).is_empty());
        let fifo_bf = SchedConfig { backfill: true, ..SchedConfig::with_policy(Policy::Fifo) };
        assert!(fifo_bf.ignored_knobs(&knobs("probe = \"15m\"\n")).is_empty());
        let off = SchedConfig { preemption: PreemptionConfig { enabled: false, ..Default::default() }, ..fifo };
        assert!(off.ignored_knobs(&knobs("max_evictions = 0\n")).iter().all(|w| !w.starts_with("max_evictions")));
    }
}
