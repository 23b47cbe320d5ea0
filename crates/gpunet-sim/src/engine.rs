//! The discrete-event engine: replays a trace on a virtual clock through `gpunet-core`, unchanged.
//!
//! **Run-time model.** A job's remaining work is kept in seconds on the GPU model its trace duration was measured on
//! (any model when the trace names none). On a node of model `m` it progresses at `speed(m) ÷ speed(measured)` (the
//! catalogue's relative speeds; a gang spanning models runs at its slowest member's pace). Evicted or failed jobs keep
//! the work up to their last checkpoint (jobs checkpoint every `checkpoint_interval`; a spot-reclaim notice lets them
//! checkpoint before they go), lose the rest, and restart, failures counting against their restart limit.
//!
//! **Events.** Arrivals come from the trace in submission order; completions, restart back-offs, node failures and
//! recoveries (MTBF/MTTR, exponential), spot reclaims with notice, periodic scheduling ticks (for LAS demotion,
//! fair-share decay and preemption when those can change the outcome) and metric samples come from a heap. All
//! events at one instant are applied, then one scheduling pass runs and its decisions are applied.

use crate::cluster::ClusterSpec;
use crate::error::SimError;
use crate::metrics::{JobEnd, JobOutcome};
pub use crate::metrics::{SimResult, TenantResult};
use crate::rng::Rng;
use crate::trace::{Trace, TraceJob};
use gpunet_core::pricing::{self, Cost, Held, NodeRates, PriceCatalogue};
use gpunet_core::tenant::Quota;
use gpunet_core::{
    schedule_with_stats, ClusterState, Decision, Dur, GpuModel, JobId, JobSpec, JobState, NodeId, NodeState, Policy,
    SchedConfig, TenantId, TenantSpec, Time,
};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::str::FromStr;

/// How tenants get quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuotaMode {
    /// No quotas.
    None,
    /// Each tenant is guaranteed an equal share of the GPUs.
    Equal,
    /// Guarantees proportional to each tenant's GPU-time in the trace.
    Proportional,
    /// Philly's virtual clusters: fixed partitions (nodes per VC from Helios, 8 GPUs a node); VCs not listed share
    /// the rest.
    PhillyVc,
}

impl FromStr for QuotaMode {
    type Err = SimError;
    fn from_str(s: &str) -> Result<QuotaMode, SimError> {
        Ok(match s {
            "none" => QuotaMode::None,
            "equal" => QuotaMode::Equal,
            "proportional" => QuotaMode::Proportional,
            "philly-vc" => QuotaMode::PhillyVc,
            _ => {
                return Err(SimError::invalid(
                    "--quotas",
                    format!("unknown mode {s:?}; allowed are none, equal, proportional, philly-vc"),
                ))
            }
        })
    }
}

/// Where job estimates come from (an estimate given in the trace is always used as is).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum EstimateMode {
    /// The true duration.
    Oracle,
    /// The true duration times a log-normal error: `d · exp(σ·N(0,1))`.
    Noisy {
        /// σ of the log error.
        sigma: f64,
    },
    /// Learned online from completed jobs by the core's predictor ([`gpunet_core::Predictor`]: the same tenant, job
    /// name and GPUs, else the tenant's jobs of the same size, else the tenant's, else all jobs); the past only; no
    /// estimate before the first completion.
    History,
}

impl FromStr for EstimateMode {
    type Err = SimError;
    fn from_str(s: &str) -> Result<EstimateMode, SimError> {
        let bad = || {
            SimError::invalid(
                "--estimates",
                format!("{s:?}; allowed are oracle, noisy:SIGMA (e.g. noisy:0.5), history"),
            )
        };
        match s {
            "oracle" => Ok(EstimateMode::Oracle),
            "history" => Ok(EstimateMode::History),
            _ => {
                let sigma: f64 = s.strip_prefix("noisy:").ok_or_else(bad)?.parse().map_err(|_| bad())?;
                if !(sigma.is_finite() && sigma >= 0.0) {
                    return Err(bad());
                }
                Ok(EstimateMode::Noisy { sigma })
            }
        }
    }
}

/// Simulation settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Scheduler configuration (policy, backfill, preemption, …).
    pub sched: SchedConfig,
    /// Quota mode for tenants the cluster spec does not define.
    pub quotas: QuotaMode,
    /// Turn guarantees into a shared pool with borrowing and reclaim.
    pub borrowing: bool,
    /// Estimates.
    pub estimates: EstimateMode,
    /// Seed for noise, failures and reclaims.
    pub seed: u64,
    /// Mean time between failures of one node, if failures are simulated.
    pub mtbf: Option<Dur>,
    /// Time a failed node stays down (and a reclaimed spot node stays away).
    pub mttr: Dur,
    /// Reclaims per spot node per hour, if spot reclaim is simulated.
    pub spot_reclaims_per_hour: Option<f64>,
    /// Notice before a spot node goes.
    pub spot_notice: Dur,
    /// How often jobs checkpoint.
    pub checkpoint_interval: Dur,
    /// Restarts after failure.
    pub max_restarts: u32,
    /// Scheduling tick while jobs wait and time alone can change decisions.
    pub tick: Dur,
    /// Metric samples over the run.
    pub samples: usize,
    /// Stop after this many jobs of the trace (in submission order).
    pub max_jobs: Option<usize>,
    /// Check the core's invariants after every pass (slow; for tests).
    pub check_invariants: bool,
    /// The most evictions of one job before the replay stops as a loop of evictions, with an error (default
    /// 100,000; Philly's most evicted job under `auto` is evicted 362 times); and the most attempts of one job in a
    /// row cut by the loss of their node without keeping work, past which the replay stops too (failures faster than
    /// its checkpoints).
    pub eviction_loop_limit: u32,
    /// Grow and shrink a spot pool with the core's autoscaler decision.
    pub autoscale: Option<AutoscaleSim>,
    /// Which jobs may run on spot nodes (they tolerate the `lifecycle=spot` taint).
    pub spot_jobs: SpotJobs,
    /// Modelled time from asking a preempted or drained job to stop until its processes are gone (its SIGTERM handler
    /// writing a checkpoint); its GPUs stay allocated meanwhile, as live. Default: drawn from stop times measured on
    /// real processes (see [`crate::stop`]), at most the agent's grace period before SIGKILL.
    pub stop_time: crate::stop::StopTime,
    /// The idealised placement of a bound: every job becomes one-GPU tasks that may sit on any GPU of any node (a
    /// gang, no topology), so that the scheduler only counts free GPUs, as the models of scheduling papers do.
    /// Not a cluster that exists: node boundaries, which strand GPUs and hold whole-node jobs back, are gone.
    pub gpu_counting: bool,
}

impl SimConfig {
    /// Applies a `[scheduler]` table: the core's knobs, and the tick, checkpoint interval and stop time of the
    /// simulation. On an error nothing changes.
    pub fn apply_knobs(&mut self, k: &gpunet_core::SchedKnobs) -> Result<(), gpunet_core::CoreError> {
        k.apply(&mut self.sched)?;
        if let Some(t) = k.tick {
            self.tick = t.0;
        }
        if let Some(c) = k.checkpoint_interval {
            self.checkpoint_interval = c.0;
        }
        if let Some(s) = k.stop_time {
            self.stop_time = crate::stop::StopTime::Fixed(s.0);
        }
        Ok(())
    }
}

/// Which jobs tolerate spot nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpotJobs {
    /// None.
    None,
    /// Preemptible jobs (the default): they survive reclaim through their checkpoints.
    Preemptible,
    /// All jobs.
    All,
}

impl FromStr for SpotJobs {
    type Err = SimError;
    fn from_str(s: &str) -> Result<SpotJobs, SimError> {
        match s {
            "none" => Ok(SpotJobs::None),
            "preemptible" => Ok(SpotJobs::Preemptible),
            "all" => Ok(SpotJobs::All),
            _ => Err(SimError::invalid("--spot-jobs", format!("{s:?}; allowed are none, preemptible, all"))),
        }
    }
}

/// Autoscaling in the simulation: new spot nodes are copies of `template`.
#[derive(Debug, Clone)]
pub struct AutoscaleSim {
    /// The autoscaler settings (window, thresholds, pool bounds, cooldown).
    pub cfg: gpunet_core::autoscale::AutoscaleConfig,
    /// What a new spot node looks like.
    pub template: gpunet_core::NodeSpec,
    /// Time between load samples and decisions.
    pub interval: Dur,
    /// Time from the decision to a new node taking work (boot and registration).
    pub boot: Dur,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            sched: SchedConfig::default(),
            quotas: QuotaMode::None,
            borrowing: false,
            estimates: EstimateMode::Oracle,
            seed: 1,
            mtbf: None,
            mttr: Dur::from_hours(1),
            spot_reclaims_per_hour: None,
            spot_notice: Dur::from_secs(120),
            checkpoint_interval: Dur::from_mins(30),
            max_restarts: 3,
            tick: Dur::from_secs(60),
            samples: 400,
            max_jobs: None,
            check_invariants: false,
            eviction_loop_limit: 100_000,
            autoscale: None,
            spot_jobs: SpotJobs::Preemptible,
            stop_time: crate::stop::StopTime::default(),
            gpu_counting: false,
        }
    }
}

/// One point of the time series.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the first submission.
    pub t_s: f64,
    /// Allocated ÷ schedulable GPUs.
    pub utilization: f64,
    /// Queued jobs.
    pub queued: usize,
    /// Free GPUs on nodes with fewer free GPUs than the smallest queued task asks, ÷ schedulable GPUs.
    pub fragmentation: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Completion {
        job: u32,
        attempt: u32,
    },
    /// The modelled stop time of an attempt asked to end has passed: its processes are gone.
    StopConfirmed {
        job: u32,
        attempt: u32,
    },
    Wake,
    Tick,
    Sample,
    Autoscale,
    NodeFail(u32),
    NodeRecover(u32),
    SpotNotice(u32),
    SpotGone(u32),
    /// An autoscaled node finished booting: it becomes ready.
    Booted(u32),
}

#[derive(Debug, Clone, Default)]
struct JobRec {
    tenant: u32,
    gpus: u32,
    per_task: u32,
    duration_ms: f64,
    remaining_ms: f64,
    measured: Option<GpuModel>,
    first_start: Option<u64>,
    finish: Option<u64>,
    failed: bool,
    attempt: u32,
    run_start: u64,
    run_factor: f64,
    run_gpus: u32,
    /// What the current run holds on each of its nodes (billed at its end).
    run_held: Vec<(NodeId, Held)>,
    /// Time held over all attempts (start to confirmed end), ms.
    held_ms: u64,
    /// Evictions suffered.
    evictions: u32,
    /// No node of the cluster could hold it when it was submitted (`gpunet_core::never_fits`).
    never_fits: bool,
    /// Attempts in a row ended by the loss of their node without the job keeping more work than at the last one.
    losses: u32,
    /// The job's kept work (ms) when an attempt of it last ended with its node and kept more than the one before.
    progress_at_loss: u64,
    /// The current attempt is being evicted.
    evicting: bool,
    /// The estimate given at submission, seconds.
    estimate_s: Option<f64>,
}

const PHILLY_VC: &str = include_str!("../../../data/traces/philly/philly_vc_from_helios_qssf.csv");

struct Engine<'a> {
    cfg: &'a SimConfig,
    st: ClusterState,
    jobs: Vec<JobRec>,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    rng: Rng,
    /// Draws stop times; a stream of its own, so that the stop-time model does not move the other draws.
    stop_rng: Rng,
    alloc_gpus: u64,
    last_t: u64,
    alloc_area: f64,
    cap_area: f64,
    queued_sizes: BTreeMap<u32, u32>,
    /// Fragmentation times the time each sample stands for, summed over the samples where a job some node could
    /// hold waits, and that time.
    frag_sum: f64,
    frag_weight: f64,
    preemptions: usize,
    restarts: usize,
    node_losses: usize,
    lost_gpu_ms: f64,
    /// GPU-ms lost by evicted attempts.
    evict_lost_gpu_ms: f64,
    /// Allocated and schedulable GPU-ms up to the last submission.
    span_area: Option<(f64, f64)>,
    cost_od: f64,
    cost_spot: f64,
    cost: Cost,
    passes: usize,
    /// Passes run at an instant where the scheduling tick was the only event, and passes that decided nothing
    /// (no start, eviction or scaling; a reservation does not count).
    tick_passes: usize,
    idle_passes: usize,
    /// Passes for a tick alone that decided nothing.
    idle_tick_passes: usize,
    /// Wall-clock time of those passes (the scheduling pass alone), ms.
    idle_tick_pass_ms: f64,
    /// Whether the tick is the only event at the instant being processed.
    tick_alone: bool,
    /// After a pass that decided nothing, while nothing but time has changed since: until when a pass would decide
    /// nothing either ([`gpunet_core::PassStats::idle_until`], ms). A tick before then makes no pass.
    idle_until: Option<u64>,
    /// Passes not run for that reason.
    skipped_passes: usize,
    tick_pending: bool,
    needs_tick: bool,
    /// Learned estimates (`--estimates history`), fed with completions as they happen.
    predictor: gpunet_core::Predictor,
    tenant_names: Vec<String>,
    job_names: Vec<String>,
    series: Vec<Sample>,
    t0: u64,
    node_spot: Vec<bool>,
    prices: PriceCatalogue,
    node_rates: Vec<NodeRates>,
    gpu_time_by_tenant: Vec<f64>,
    queued_gpus: u64,
    load_window: Vec<f64>,
    last_scale: Option<Time>,
    spot_added: u32,
    /// Autoscaled nodes still booting, and their GPUs (counted as the pool's capacity, as the server counts them).
    booting: u32,
    booting_gpus: u64,
    scale_outs: usize,
    scale_ins: usize,
}

fn ms(s: f64) -> u64 {
    (s * 1000.0).round().max(0.0) as u64
}

impl Engine<'_> {
    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn advance(&mut self, t: u64) {
        if t > self.last_t {
            let dt = (t - self.last_t) as f64;
            self.alloc_area += self.alloc_gpus as f64 * dt;
            self.cap_area += self.st.capacity_gpus() as f64 * dt;
            self.last_t = t;
        }
    }

    fn queued_add(&mut self, idx: usize, delta: i32) {
        let g = self.jobs[idx].gpus as u64;
        if delta > 0 {
            self.queued_gpus += g;
        } else {
            self.queued_gpus -= g;
        }
        if self.jobs[idx].never_fits {
            return;
        }
        let k = self.jobs[idx].per_task;
        let e = self.queued_sizes.entry(k).or_default();
        if delta > 0 {
            *e += 1;
        } else {
            *e -= 1;
            if *e == 0 {
                self.queued_sizes.remove(&k);
            }
        }
    }

    /// Ends the current run of a job at `now`: cost, allocation, and the work kept up to `kept_until`. Returns the
    /// GPU-ms lost.
    fn end_run(&mut self, idx: usize, now: u64, kept_until: u64) -> f64 {
        let j = &mut self.jobs[idx];
        let ran = now.saturating_sub(j.run_start) as f64;
        let kept = kept_until.saturating_sub(j.run_start).min(now - j.run_start) as f64;
        j.remaining_ms = (j.remaining_ms - kept * j.run_factor).max(0.0);
        let lost = (ran - kept) * j.run_gpus as f64;
        self.lost_gpu_ms += lost;
        j.held_ms += now.saturating_sub(j.run_start);
        // Billed like the server's usage ledger: one row per node, per started second.
        let held = std::mem::take(&mut j.run_held);
        let ran_ms = now.saturating_sub(j.run_start);
        for (n, h) in held {
            let c = pricing::cost(h, &self.node_rates[n.index()], ran_ms);
            if self.node_spot[n.index()] {
                self.cost_spot += c.total();
            } else {
                self.cost_od += c.total();
            }
            self.cost += c;
        }
        let j = &self.jobs[idx];
        self.gpu_time_by_tenant[j.tenant as usize] += ran * j.run_gpus as f64;
        self.alloc_gpus -= j.run_gpus as u64;
        lost
    }

    /// The job's estimate, and with a learned one its spread.
    fn estimate(&mut self, job: &TraceJob, tenant: u32, gpus: u32) -> (Option<Dur>, Option<f32>) {
        if let Some(e) = job.est_duration_s {
            return (Some(Dur(ms(e).max(1))), None);
        }
        let s = match self.cfg.estimates {
            EstimateMode::Oracle => Some(job.duration_s),
            EstimateMode::Noisy { sigma } => Some(job.duration_s * (sigma * self.rng.normal()).exp()),
            EstimateMode::History => {
                let key = gpunet_core::JobKey { user: &self.tenant_names[tenant as usize], name: &job.id, gpus };
                return match self.predictor.predict(key) {
                    Some(p) => (Some(p.duration), p.spread.map(|s| s as f32)),
                    None => (None, None),
                };
            }
        };
        (s.map(|s| Dur(ms(s).max(1))), None)
    }

    fn learn(&mut self, idx: usize) {
        if self.cfg.estimates != EstimateMode::History {
            return;
        }
        let j = &self.jobs[idx];
        let key = gpunet_core::JobKey {
            user: &self.tenant_names[j.tenant as usize],
            name: &self.job_names[idx],
            gpus: j.gpus,
        };
        self.predictor.observe(key, Dur(j.duration_ms.round().max(1.0) as u64));
    }

    fn run_jobs_on(&self, node: NodeId) -> Vec<JobId> {
        self.st.node(node).map(|n| n.jobs.iter().copied().collect()).unwrap_or_default()
    }

    /// Applies one pass's decisions; returns whether it evicted anything.
    fn pass(&mut self, now: u64) -> Result<bool, SimError> {
        let mut evicted = false;
        self.passes += 1;
        let t = Time(now);
        // Jobs failed because a dependency can never be satisfied leave the queue as failed.
        for c in self.st.take_cascades() {
            if let gpunet_core::Cascade::DependencyFailed(j) = c {
                let idx = (j.0 - 1) as usize;
                self.jobs[idx].failed = true;
                self.jobs[idx].finish = Some(now);
                self.queued_add(idx, -1);
            }
        }
        let started = self.tick_alone.then(std::time::Instant::now);
        let (ds, stats) = schedule_with_stats(&self.st, t);
        let idle = ds.iter().all(|d| matches!(d, Decision::Reserve { .. }));
        self.idle_until = idle.then_some(stats.idle_until.0);
        self.tick_passes += usize::from(self.tick_alone);
        self.idle_passes += usize::from(idle);
        self.idle_tick_passes += usize::from(idle && self.tick_alone);
        if let Some(s) = started.filter(|_| idle) {
            self.idle_tick_pass_ms += s.elapsed().as_secs_f64() * 1e3;
        }
        for d in &ds {
            match d {
                Decision::Start { job, placement, .. } => {
                    let idx = (job.0 - 1) as usize;
                    self.st.apply(d, t)?;
                    let mut factor = f64::INFINITY;
                    for tp in &placement.tasks {
                        let n = self.st.node(tp.node).expect("placed node exists");
                        if let Some(m) = n.spec.gpu_model() {
                            let f = match self.jobs[idx].measured {
                                Some(r) => m.relative_speed() / r.relative_speed(),
                                None => 1.0,
                            };
                            factor = factor.min(f);
                        }
                    }
                    if !factor.is_finite() {
                        factor = 1.0;
                    }
                    self.queued_add(idx, -1);
                    let gpus = placement.gpus();
                    let j = &mut self.jobs[idx];
                    j.first_start.get_or_insert(now);
                    j.run_start = now;
                    j.run_factor = factor;
                    j.run_gpus = gpus;
                    j.run_held = pricing::held_per_node(placement);
                    j.attempt += 1;
                    let runtime = (j.remaining_ms / factor).ceil().max(1.0) as u64;
                    let attempt = j.attempt;
                    self.alloc_gpus += gpus as u64;
                    self.push(now + runtime, Ev::Completion { job: idx as u32, attempt });
                }
                Decision::Preempt { job, .. } => {
                    // The victim is asked to stop and keeps its GPUs until its modelled stop time has passed.
                    let idx = (job.0 - 1) as usize;
                    self.st.apply_decision(d, t)?;
                    self.preemptions += 1;
                    self.jobs[idx].evicting = true;
                    self.jobs[idx].evictions += 1;
                    // A job evicted this often is in a loop of evictions that no schedule needs
                    // (`SimConfig::eviction_loop_limit`): the replay stops and says so instead of running on.
                    let limit = self.cfg.eviction_loop_limit;
                    if self.jobs[idx].evictions > limit {
                        return Err(SimError::invalid(
                            format!("replay at t={} s", (now - self.t0) / 1000),
                            format!(
                                "{job} was evicted more than {limit} times: a loop of evictions (the scheduler's \
                                 knobs let jobs evict each other for ever)"
                            ),
                        ));
                    }
                    let stop = self.cfg.stop_time.draw(&mut self.stop_rng);
                    if stop.0 == 0 {
                        self.confirm_end(idx, now)?;
                        evicted = true;
                    } else {
                        let attempt = self.jobs[idx].attempt;
                        self.push(now + stop.0, Ev::StopConfirmed { job: idx as u32, attempt });
                    }
                }
                Decision::Scale { .. } | Decision::Reserve { .. } => self.st.apply(d, t)?,
            }
        }
        if self.cfg.check_invariants {
            self.st.check_invariants().map_err(|e| SimError::invalid(format!("invariant at t={now} ms"), e))?;
        }
        Ok(evicted)
    }

    /// A node goes away. `Lost`: the machine died with its processes, so its jobs' attempts end at once (their
    /// other ranks crash with it) and they are queued again without a restart charge. `Draining` (spot notice): its
    /// jobs checkpoint now and are asked to stop; they end after the modelled stop time.
    fn node_down(&mut self, node: NodeId, now: u64, state: NodeState) -> Result<(), SimError> {
        let t = Time(now);
        let jobs = if state == NodeState::Draining {
            // The core's reclaim steps, as the server takes them: the node takes no new work, each job checkpoints
            // now (modelled as instant) and is asked to stop; the deadline (`Ev::SpotGone`) drains what is left.
            let jobs = self.st.reclaim_notice(node, t)?;
            for id in &jobs {
                self.st.reclaim_checkpointed(*id, t, t)?;
            }
            jobs
        } else {
            let jobs = self.run_jobs_on(node);
            self.st.set_node_state(node, state, t)?;
            jobs
        };
        for id in &jobs {
            let idx = (id.0 - 1) as usize;
            let stop = if state == NodeState::Lost { Dur::ZERO } else { self.cfg.stop_time.draw(&mut self.stop_rng) };
            if stop.0 == 0 {
                if state == NodeState::Lost && self.st.job(*id).is_some_and(|j| j.is_stopping()) {
                    self.node_losses += 1;
                }
                self.confirm_end(idx, now)?;
                if state == NodeState::Lost {
                    self.lost_without_progress(idx, now)?;
                }
            } else {
                let attempt = self.jobs[idx].attempt;
                self.push(now + stop.0, Ev::StopConfirmed { job: idx as u32, attempt });
            }
        }
        Ok(())
    }

    /// Counts an attempt of the job cut by the loss of its node that kept no work over the last one so cut. A job
    /// whose node fails more often than it checkpoints may never finish (nodes failing every 18 minutes under jobs of
    /// several nodes that checkpoint every 30 ran for ever): past the same limit as a loop of evictions, that many
    /// such losses in a row stop the replay with an error.
    fn lost_without_progress(&mut self, idx: usize, now: u64) -> Result<(), SimError> {
        let id = JobId(idx as u64 + 1);
        let progress = self.st.job(id).map_or(0, |j| j.progress.0);
        let rec = &mut self.jobs[idx];
        if progress > rec.progress_at_loss {
            rec.progress_at_loss = progress;
            rec.losses = 0;
            return Ok(());
        }
        rec.losses += 1;
        let limit = self.cfg.eviction_loop_limit;
        if rec.losses > limit {
            return Err(SimError::invalid(
                format!("replay at t={} s", (now - self.t0) / 1000),
                format!(
                    "{id} lost its node more than {limit} times in a row without keeping any work: failures come \
                     faster than it checkpoints and it may never finish (a longer --mtbf-hours or a shorter \
                     --checkpoint-mins)"
                ),
            ));
        }
        Ok(())
    }

    /// The end of a stopping attempt is confirmed: its work up to the last checkpoint is kept, its GPUs are released
    /// (through the core's lifecycle) and the job waits again, or fails for good.
    fn confirm_end(&mut self, idx: usize, now: u64) -> Result<(), SimError> {
        let t = Time(now);
        let id = JobId(idx as u64 + 1);
        if !self.st.job(id).is_some_and(|j| j.is_stopping()) {
            return Ok(());
        }
        let ck = self.st.job(id).and_then(|j| j.last_checkpoint_at(t)).map_or(now, |c| c.0);
        let lost = self.end_run(idx, now, ck);
        if std::mem::take(&mut self.jobs[idx].evicting) {
            self.evict_lost_gpu_ms += lost;
        }
        let ended = self.st.end_attempt(id, t)?;
        self.jobs[idx].attempt += 1;
        match ended.state {
            JobState::Restarting => {
                self.restarts += 1;
                self.queued_add(idx, 1);
                let nb = self.st.job(id).map_or(t, |j| j.not_before);
                self.push(nb.0, Ev::Wake);
            }
            JobState::Preempted => self.queued_add(idx, 1),
            JobState::Failed | JobState::Cancelled => {
                self.jobs[idx].failed = true;
                self.jobs[idx].finish = Some(now);
            }
            _ => {}
        }
        Ok(())
    }

    /// One autoscaler step: sample the load, decide, add or release spot nodes.
    fn autoscale(&mut self, now: u64) -> Result<bool, SimError> {
        let Some(a) = self.cfg.autoscale.as_ref() else { return Ok(false) };
        // The same demand signal as the server's pools: GPUs held plus GPUs queued.
        self.load_window.push((self.alloc_gpus + self.queued_gpus) as f64);
        if self.load_window.len() > a.cfg.window.max(1) {
            self.load_window.remove(0);
        }
        let spot: Vec<(NodeId, bool)> = self
            .st
            .nodes()
            .filter(|n| n.state == NodeState::Ready && self.node_spot[n.id.index()])
            .map(|n| (n.id, n.jobs.is_empty()))
            .collect();
        let idle: Vec<NodeId> = spot.iter().rev().filter(|(_, idle)| *idle).map(|(id, _)| *id).collect();
        let input = gpunet_core::autoscale::AutoscaleInput {
            samples: &self.load_window,
            capacity_gpus: self.st.capacity_gpus() + self.booting_gpus,
            gpus_per_spot_node: a.template.gpus.len() as u32,
            spot_nodes: spot.len() as u32 + self.booting,
            idle_spot: &idle,
            last_action: self.last_scale,
            now: Time(now),
        };
        match gpunet_core::autoscale::decide(&a.cfg, &input) {
            gpunet_core::autoscale::ScaleDecision::Out { nodes, .. } => {
                let template = a.template.clone();
                for _ in 0..nodes {
                    self.spot_added += 1;
                    let mut n = template.clone();
                    n.name = format!("{}-auto-{:05}", template.name, self.spot_added);
                    let rates = self.prices.node_rates(&n);
                    let id = self.st.add_node(n)?;
                    if self.node_spot.len() <= id.index() {
                        self.node_spot.resize(id.index() + 1, true);
                        self.node_rates.resize(id.index() + 1, rates);
                    }
                    if a.boot.0 > 0 {
                        // Not schedulable until it has booted (and registered, live).
                        self.st.set_node_state(id, NodeState::Lost, Time(now))?;
                        self.booting += 1;
                        self.booting_gpus += template.gpus.len() as u64;
                        self.push(now + a.boot.0, Ev::Booted(id.0));
                    } else if let Some(rate) = self.cfg.spot_reclaims_per_hour.filter(|r| *r > 0.0) {
                        let dt = self.rng.exp(3_600_000.0 / rate) as u64;
                        self.push(now + dt.max(1), Ev::SpotNotice(id.0));
                    }
                }
                self.scale_outs += nodes as usize;
                self.last_scale = Some(Time(now));
                Ok(true)
            }
            gpunet_core::autoscale::ScaleDecision::In { nodes, .. } => {
                for id in &nodes {
                    self.st.set_node_state(*id, NodeState::Lost, Time(now))?;
                }
                self.scale_ins += nodes.len();
                self.last_scale = Some(Time(now));
                Ok(true)
            }
            gpunet_core::autoscale::ScaleDecision::Hold { .. } => Ok(false),
        }
    }

    /// Takes a load sample; `step`: the time it stands for (ms), its weight in the run's fragmentation.
    fn sample(&mut self, now: u64, step: u64) {
        let cap = self.st.capacity_gpus().max(1) as f64;
        let queued = self.st.queued_count();
        // The smallest waiting task some ready node could hold: a job no node could ever hold would count every free
        // GPU as stranded (one such job made an idle cluster 100% fragmented).
        let smallest = if queued == 0 {
            None
        } else {
            let largest =
                self.st.nodes().filter(|n| n.state == NodeState::Ready).map(|n| n.spec.gpus.len() as u32).max();
            self.queued_sizes.keys().copied().find(|k| largest.is_some_and(|l| *k <= l))
        };
        let frag = match smallest {
            Some(min) if min > 0 => {
                let stranded: u64 = self
                    .st
                    .nodes()
                    .filter(|n| n.state == NodeState::Ready)
                    .map(|n| n.free_gpu_mask.count_ones())
                    .filter(|f| *f < min)
                    .map(u64::from)
                    .sum();
                stranded as f64 / cap
            }
            _ => 0.0,
        };
        // The run's figure is over the samples where a job some node could hold waits, each weighed by the time it
        // stands for (all of them, thinned from the series or not: as the step doubles, a sample stands for more).
        if smallest.is_some() {
            self.frag_sum += frag * step as f64;
            self.frag_weight += step as f64;
        }
        self.series.push(Sample {
            t_s: (now - self.t0) as f64 / 1000.0,
            utilization: self.alloc_gpus as f64 / cap,
            queued,
            fragmentation: frag,
        });
    }
}

fn tenant_quotas(
    cfg: &SimConfig,
    spec: &ClusterSpec,
    names: &[String],
    demand: &[f64],
    capacity: u64,
) -> Result<Vec<TenantSpec>, SimError> {
    let mut out: Vec<TenantSpec> = names.iter().map(|n| TenantSpec::new(n.clone())).collect();
    let defined: HashMap<&str, &crate::cluster::TenantDef> = spec.tenant.iter().map(|t| (t.name.as_str(), t)).collect();
    let n = names.len().max(1) as u64;
    let total_demand: f64 = demand.iter().sum::<f64>().max(1e-9);
    let vc: HashMap<String, u64> = PHILLY_VC
        .lines()
        .skip(1)
        .filter_map(|l| {
            l.split_once(',').and_then(|(v, n)| n.trim().parse::<u64>().ok().map(|n| (v.trim().to_string(), n * 8)))
        })
        .collect();
    let listed: u64 = names.iter().filter_map(|n| vc.get(n)).sum();
    if cfg.quotas == QuotaMode::PhillyVc && listed > capacity {
        return Err(SimError::invalid(
            "--quotas philly-vc",
            format!("the VC partitions need {listed} GPUs but the cluster has {capacity}; use --cluster philly"),
        ));
    }
    for (i, t) in out.iter_mut().enumerate() {
        if let Some(d) = defined.get(t.name.as_str()) {
            t.weight = d.weight.unwrap_or(1.0);
            t.cohort = d.cohort.clone();
            if let Some(g) = d.guarantee_gpus {
                t.quota = Some(Quota::gpus(g, d.limit_gpus.unwrap_or(g)));
            }
            continue;
        }
        let g = match cfg.quotas {
            QuotaMode::None => continue,
            QuotaMode::Equal => capacity / n,
            QuotaMode::Proportional => (capacity as f64 * demand[i] / total_demand).floor() as u64,
            QuotaMode::PhillyVc => vc.get(&t.name).copied().unwrap_or(0),
        };
        let limit = if cfg.borrowing {
            capacity
        } else if cfg.quotas == QuotaMode::PhillyVc && !vc.contains_key(&t.name) {
            capacity - listed // the VCs not listed share what the partitions leave
        } else {
            g
        };
        t.quota = Some(Quota::gpus(g, limit.max(g)));
        if cfg.borrowing {
            t.cohort = Some("shared".into());
        }
    }
    Ok(out)
}

/// Runs one simulation.
pub fn simulate(
    trace: &Trace,
    cluster: &ClusterSpec,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult, SimError> {
    let wall = std::time::Instant::now();
    let mut order: Vec<usize> = (0..trace.jobs.len()).collect();
    order.sort_by(|a, b| trace.jobs[*a].submit_s.total_cmp(&trace.jobs[*b].submit_s).then(a.cmp(b)));
    if let Some(m) = cfg.max_jobs {
        order.truncate(m);
    }
    // Trace ids to submission positions, for dependencies.
    let pos_of: HashMap<&str, usize> = order.iter().enumerate().map(|(p, i)| (trace.jobs[*i].id.as_str(), p)).collect();
    let mut st = ClusterState::new(cfg.sched.clone())?;
    let nodes = cluster.build_nodes();
    if nodes.is_empty() {
        return Err(SimError::invalid("cluster", "it has no nodes"));
    }
    let max_gpus = nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(1).max(1);
    let prices = cluster.prices();
    let mut node_spot = Vec::new();
    let mut node_rates = Vec::new();
    for n in nodes {
        node_spot.push(n.lifecycle() == gpunet_core::Lifecycle::Spot);
        node_rates.push(prices.node_rates(&n));
        st.add_node(n)?;
    }
    // Tenants, in order of first appearance.
    let mut tenant_of: HashMap<&str, u32> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut demand: Vec<f64> = Vec::new();
    for &i in &order {
        let j = &trace.jobs[i];
        let t = *tenant_of.entry(j.tenant.as_str()).or_insert_with(|| {
            names.push(j.tenant.clone());
            demand.push(0.0);
            (names.len() - 1) as u32
        });
        demand[t as usize] += j.duration_s * j.gpus as f64;
    }
    for t in tenant_quotas(cfg, cluster, &names, &demand, st.capacity_gpus())? {
        st.add_tenant(t)?;
    }
    let pre = &cfg.sched.preemption;
    let needs_tick = matches!(cfg.sched.policy, Policy::Las | Policy::FairShare)
        || (pre.enabled && (cfg.borrowing || order.iter().any(|i| trace.jobs[*i].priority != 0)))
        || cfg.sched.evicts_for_shorter();
    let t0 = order.first().map_or(0, |i| ms(trace.jobs[*i].submit_s));
    let mut e = Engine {
        cfg,
        st,
        jobs: vec![JobRec::default(); order.len()],
        heap: BinaryHeap::new(),
        seq: 0,
        rng: Rng::new(cfg.seed),
        stop_rng: Rng::new(cfg.seed ^ 0x5354_4f50_5449_4d45),
        alloc_gpus: 0,
        last_t: t0,
        alloc_area: 0.0,
        cap_area: 0.0,
        queued_sizes: BTreeMap::new(),
        frag_sum: 0.0,
        frag_weight: 0.0,
        preemptions: 0,
        restarts: 0,
        node_losses: 0,
        lost_gpu_ms: 0.0,
        evict_lost_gpu_ms: 0.0,
        span_area: None,
        cost_od: 0.0,
        cost_spot: 0.0,
        cost: Cost::default(),
        passes: 0,
        tick_passes: 0,
        idle_passes: 0,
        idle_tick_passes: 0,
        idle_tick_pass_ms: 0.0,
        tick_alone: false,
        idle_until: None,
        skipped_passes: 0,
        tick_pending: false,
        needs_tick,
        predictor: gpunet_core::Predictor::new(),
        tenant_names: names.clone(),
        job_names: Vec::new(),
        series: Vec::new(),
        t0,
        node_spot,
        prices,
        node_rates,
        gpu_time_by_tenant: vec![0.0; names.len()],
        queued_gpus: 0,
        load_window: Vec::new(),
        last_scale: None,
        spot_added: 0,
        booting: 0,
        booting_gpus: 0,
        scale_outs: 0,
        scale_ins: 0,
    };
    if let Some(a) = &cfg.autoscale {
        if a.template.lifecycle() != gpunet_core::Lifecycle::Spot {
            return Err(SimError::invalid("autoscale", "the node template must be a spot node (lifecycle=spot)"));
        }
        e.push(t0 + a.interval.0, Ev::Autoscale);
    }
    // Sampling step: the submission span plus the median duration, over the sample count.
    let last_submit = order.last().map_or(0, |i| ms(trace.jobs[*i].submit_s));
    let mut durs: Vec<f64> = order.iter().map(|i| trace.jobs[*i].duration_s).collect();
    durs.sort_by(f64::total_cmp);
    let median = durs.get(durs.len() / 2).copied().unwrap_or(0.0);
    let sample_dt = ((last_submit - t0) as f64 + median * 1000.0) / cfg.samples.max(1) as f64;
    let mut sample_dt = (sample_dt as u64).max(60_000);
    e.push(t0, Ev::Sample);
    // Failures and spot reclaims.
    let node_count = e.st.nodes().count();
    if let Some(mtbf) = cfg.mtbf {
        for n in 0..node_count {
            let dt = e.rng.exp(mtbf.0 as f64) as u64;
            e.push(t0 + dt, Ev::NodeFail(n as u32));
        }
    }
    if let Some(rate) = cfg.spot_reclaims_per_hour.filter(|r| *r > 0.0) {
        for n in 0..node_count {
            if e.node_spot[n] {
                let dt = e.rng.exp(3_600_000.0 / rate) as u64;
                e.push(t0 + dt, Ev::SpotNotice(n as u32));
            }
        }
    }
    let total = order.len();
    let mut next = 0usize;
    let mut done = 0usize;
    let report_every = (total / 100).max(1);
    loop {
        let next_arrival = order.get(next).map(|i| ms(trace.jobs[*i].submit_s));
        let next_event = e.heap.peek().map(|Reverse((t, _, _))| *t);
        let now = match (next_arrival, next_event) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (Some(a), Some(b)) => a.min(b),
        };
        // Nothing left but samples, failures and reclaims: stop.
        if next_arrival.is_none() && e.st.running_count() == 0 && e.st.queued_count() == 0 {
            break;
        }
        if next_arrival.is_none()
            && e.st.running_count() == 0
            && !e.heap.iter().any(|Reverse((_, _, ev))| {
                matches!(ev, Ev::Wake | Ev::NodeRecover(_) | Ev::Completion { .. } | Ev::StopConfirmed { .. })
            })
        {
            break; // only jobs that can never be placed are left
        }
        e.advance(now);
        let mut changed = false;
        // A sample due at this instant is taken after its pass: before it, a job ended or submitted at this instant
        // would show as GPUs idle and a job waiting that the pass is about to start.
        let mut sample_due: Option<u64> = None;
        // Events at this instant, and of them scheduling ticks (a pass for a tick alone: `tick_passes`).
        let (mut events, mut ticks) = (0u32, 0u32);
        while next < order.len() && ms(trace.jobs[order[next]].submit_s) == now {
            let tj = &trace.jobs[order[next]];
            let idx = next;
            let tenant = tenant_of[tj.tenant.as_str()];
            let gpus = tj.gpus;
            let tasks = match tj.tasks {
                _ if cfg.gpu_counting && gpus > 0 => gpus,
                Some(t) => t.max(1),
                None if gpus > max_gpus => gpus.div_ceil(max_gpus),
                None => 1,
            };
            let per = gpus.div_ceil(tasks);
            let mut spec = JobSpec::new(TenantId(tenant), tj.id.clone(), per, tasks);
            if let Some(c) = tj.cpu_milli {
                spec.task.cpu = gpunet_core::MilliCpu((c / tasks as u64).max(1));
            }
            if let Some(m) = tj.memory_mib {
                spec.task.mem = gpunet_core::MiB((m / tasks as u64).max(1));
            }
            if cfg.gpu_counting && tasks > 1 {
                spec.topology = gpunet_core::TopologyScope::Any;
            }
            spec.priority = tj.priority;
            spec.preemptible = tj.preemptible;
            if cfg.spot_jobs == SpotJobs::All || (cfg.spot_jobs == SpotJobs::Preemptible && tj.preemptible) {
                spec.tolerations = gpunet_core::job::thin_vec![gpunet_core::Toleration {
                    key: "lifecycle".into(),
                    value: Some("spot".into())
                }];
            }
            spec.gpu_models = tj.allowed_models.as_slice().into();
            spec.checkpoint_interval = Some(cfg.checkpoint_interval);
            spec.max_restarts = cfg.max_restarts;
            (spec.estimated_duration, spec.estimate_spread) = e.estimate(tj, tenant, gpus);
            let estimate_s = spec.estimated_duration.map(|d| d.0 as f64 / 1000.0);
            for (kind, ids) in &tj.dependency {
                let mut jobs = Vec::with_capacity(ids.len());
                for d in ids {
                    match pos_of.get(d.as_str()) {
                        Some(&p) if p < idx => jobs.push(JobId(p as u64 + 1)),
                        _ => {
                            return Err(SimError::invalid(
                                "trace",
                                format!("job {:?}: dependency {kind}:{d} names no job submitted before it", tj.id),
                            ))
                        }
                    }
                }
                spec.dependencies.push(gpunet_core::Dependency { kind: *kind, jobs });
            }
            e.jobs[idx] = JobRec {
                tenant,
                gpus,
                per_task: per,
                duration_ms: tj.duration_s * 1000.0,
                remaining_ms: tj.duration_s * 1000.0,
                measured: tj.gpu_model,
                estimate_s,
                ..JobRec::default()
            };
            if cfg.estimates == EstimateMode::History {
                e.job_names.push(tj.id.clone());
            }
            // A job no node could ever hold is left out of the waiting tasks fragmentation is measured against.
            e.jobs[idx].never_fits = gpunet_core::never_fits(&e.st, &spec).is_some();
            e.st.submit(JobId(idx as u64 + 1), spec, Time(now))?;
            e.queued_add(idx, 1);
            next += 1;
            events += 1;
            changed = true;
            if next == order.len() {
                e.span_area = Some((e.alloc_area, e.cap_area));
            }
        }
        while let Some(Reverse((t, _, _))) = e.heap.peek() {
            if *t != now {
                break;
            }
            let Reverse((_, _, ev)) = e.heap.pop().expect("peeked");
            events += u32::from(!matches!(ev, Ev::Sample));
            match ev {
                Ev::Completion { job, attempt } => {
                    let idx = job as usize;
                    if e.jobs[idx].attempt != attempt {
                        continue; // a stale completion of an evicted attempt
                    }
                    e.end_run(idx, now, now);
                    e.st.finish(JobId(idx as u64 + 1), Time(now), true)?;
                    e.jobs[idx].finish = Some(now);
                    e.learn(idx);
                    done += 1;
                    if done.is_multiple_of(report_every) {
                        progress(done, total);
                    }
                    changed = true;
                }
                Ev::StopConfirmed { job, attempt } => {
                    if e.jobs[job as usize].attempt == attempt {
                        e.confirm_end(job as usize, now)?;
                        changed = true;
                    }
                }
                Ev::Wake => changed = true,
                Ev::Tick => {
                    e.tick_pending = false;
                    ticks += 1;
                    changed = true;
                }
                Ev::Sample => {
                    // A run far longer than its submissions and median job (one job of years among short ones) would
                    // sample for ever at the same step: past 8 times the samples asked for, every other one is
                    // dropped and the step doubled, so the series stays bounded (it grew to gigabytes).
                    if e.series.len() >= 8 * cfg.samples.max(1) {
                        let mut k = 0;
                        e.series.retain(|_| {
                            k += 1;
                            k % 2 == 1
                        });
                        sample_dt = sample_dt.saturating_mul(2);
                    }
                    // It stands for the time until the next one.
                    sample_due = Some(sample_dt);
                    e.push(now + sample_dt, Ev::Sample);
                }
                Ev::Autoscale => {
                    changed |= e.autoscale(now)?;
                    let iv = cfg.autoscale.as_ref().map_or(60_000, |a| a.interval.0.max(1));
                    e.push(now + iv, Ev::Autoscale);
                }
                Ev::NodeFail(n) => {
                    let id = NodeId(n);
                    if e.st.node(id).is_some_and(|v| v.state == NodeState::Ready) {
                        e.node_down(id, now, NodeState::Lost)?;
                        e.push(now + cfg.mttr.0, Ev::NodeRecover(n));
                        changed = true;
                    }
                }
                Ev::NodeRecover(n) => {
                    if e.st.node(NodeId(n)).is_some_and(|v| v.spec.name.contains("-auto-")) {
                        continue; // an autoscaled spot node that was reclaimed is not replaced by itself
                    }
                    e.st.set_node_state(NodeId(n), NodeState::Ready, Time(now))?;
                    if let Some(mtbf) = cfg.mtbf {
                        let dt = e.rng.exp(mtbf.0 as f64) as u64;
                        e.push(now + dt.max(1), Ev::NodeFail(n));
                    }
                    if let Some(rate) = cfg.spot_reclaims_per_hour.filter(|r| *r > 0.0 && e.node_spot[n as usize]) {
                        let dt = e.rng.exp(3_600_000.0 / rate) as u64;
                        e.push(now + dt.max(1), Ev::SpotNotice(n));
                    }
                    changed = true;
                }
                Ev::SpotNotice(n) => {
                    let id = NodeId(n);
                    if e.st.node(id).is_some_and(|v| v.state == NodeState::Ready) {
                        e.node_down(id, now, NodeState::Draining)?;
                        e.push(now + cfg.spot_notice.0, Ev::SpotGone(n));
                        changed = true;
                    }
                }
                Ev::Booted(n) => {
                    e.booting -= 1;
                    e.booting_gpus -= e.st.node(NodeId(n)).map_or(0, |v| v.spec.gpus.len() as u64);
                    e.st.set_node_state(NodeId(n), NodeState::Ready, Time(now))?;
                    if let Some(rate) = cfg.spot_reclaims_per_hour.filter(|r| *r > 0.0) {
                        let dt = e.rng.exp(3_600_000.0 / rate) as u64;
                        e.push(now + dt.max(1), Ev::SpotNotice(n));
                    }
                    changed = true;
                }
                Ev::SpotGone(n) => {
                    // Jobs still stopping when the node goes (stop time longer than the notice) end with it.
                    e.st.reclaim_deadline(NodeId(n), Time(now))?;
                    e.node_down(NodeId(n), now, NodeState::Lost)?;
                    changed = true;
                    e.push(now + cfg.mttr.0, Ev::NodeRecover(n));
                }
            }
        }
        e.tick_alone = ticks > 0 && events == ticks;
        if events > ticks {
            e.idle_until = None; // something besides time may have changed
        }
        if changed {
            e.st.accrue_usage(Time(now));
            if e.tick_alone && e.idle_until.is_some_and(|u| now < u) {
                // Only time has changed since a pass that decided nothing, and not enough of it to turn anything
                // that pass met: this one would decide nothing either.
                e.skipped_passes += 1;
            } else {
                // Evictions take effect at once here: a second pass uses what they freed.
                let mut rounds = 0;
                while e.pass(now)? && rounds < 4 {
                    rounds += 1;
                }
            }
            if e.needs_tick && !e.tick_pending && e.st.queued_count() > 0 {
                e.tick_pending = true;
                e.push(now + cfg.tick.0, Ev::Tick);
            }
        }
        if let Some(step) = sample_due {
            e.sample(now, step);
        }
    }
    progress(total, total);
    let end = e.last_t;
    let sec = |t: u64| t.saturating_sub(t0) as f64 / 1000.0;
    let mut rows = Vec::with_capacity(order.len());
    let (mut completed, mut failed, mut unfinished, mut never_fit) = (0, 0, 0, 0);
    let mut never_fit_example = None;
    let mut last_finish = t0;
    for (k, &i) in order.iter().enumerate() {
        let j = &e.jobs[k];
        let tj = &trace.jobs[i];
        let submit = ms(tj.submit_s);
        let state = match (j.finish, j.failed) {
            (Some(f), failed_for_good) => {
                last_finish = last_finish.max(f);
                if failed_for_good {
                    failed += 1;
                    JobEnd::Failed
                } else {
                    completed += 1;
                    JobEnd::Completed
                }
            }
            (None, _) => {
                unfinished += 1;
                if let Some(why) = e.st.job(JobId(k as u64 + 1)).and_then(|x| gpunet_core::never_fits(&e.st, &x.spec)) {
                    never_fit += 1;
                    never_fit_example.get_or_insert_with(|| format!("{}: {why}", tj.id));
                }
                JobEnd::Unfinished
            }
        };
        let until = j.finish.unwrap_or(end).max(submit);
        rows.push(JobOutcome {
            id: tj.id.clone(),
            tenant: names[j.tenant as usize].clone(),
            gpus: j.gpus,
            submit_s: sec(submit),
            duration_s: tj.duration_s,
            estimate_s: j.estimate_s,
            first_start_s: j.first_start.map(sec),
            end_s: j.finish.map(sec),
            end: state,
            held_s: j.held_ms as f64 / 1000.0,
            wait_s: (until - submit).saturating_sub(j.held_ms) as f64 / 1000.0,
            evictions: j.evictions,
        });
    }
    let total_gpu_time: f64 = e.gpu_time_by_tenant.iter().sum::<f64>().max(1e-9);
    let shares: Vec<f64> = e.gpu_time_by_tenant.iter().map(|g| g / total_gpu_time).collect();
    let fragmentation = if e.frag_weight == 0.0 { 0.0 } else { e.frag_sum / e.frag_weight };
    let ratio = |a: f64, c: f64| if c > 0.0 { (a / c).min(1.0) } else { 0.0 };
    // Every job submitted at one instant leaves no span: the whole run's figure is given instead.
    let (span_alloc, span_cap) = e.span_area.filter(|(_, c)| *c > 0.0).unwrap_or((e.alloc_area, e.cap_area));
    let gpu_hours_used = e.alloc_area / 3_600_000.0;
    let eviction_lost_gpu_hours = e.evict_lost_gpu_ms / 3_600_000.0;
    let latency = crate::metrics::latency(&rows, &names);
    let shorter_in_effect = cfg.sched.evicts_for_shorter();
    let mut r = SimResult {
        policy: cfg.sched.policy.name().to_string(),
        backfill: cfg.sched.backfill,
        // In effect: preemptive = true under a policy that does not evict for shorter jobs reads false (and gives no
        // ratio).
        preemptive: shorter_in_effect,
        shorter_ratio: shorter_in_effect.then_some(cfg.sched.preemption.shorter_ratio),
        defragment: cfg.sched.preemption.enabled && cfg.sched.preemption.defragment,
        setting: None,
        estimates: match cfg.estimates {
            EstimateMode::Oracle => "oracle",
            EstimateMode::Noisy { .. } => "noisy",
            EstimateMode::History => "history",
        }
        .to_string(),
        learned_rank: match cfg.sched.learned_rule() {
            gpunet_core::gittins::Rule::Gittins => "gittins",
            gpunet_core::gittins::Rule::Median => "median",
        }
        .to_string(),
        probe_s: cfg.sched.probe.map(|p| p.0 as f64 / 1000.0),
        gpu_counting: cfg.gpu_counting,
        jobs: total,
        completed,
        failed,
        unfinished,
        never_fit,
        never_fit_example,
        avg_jct_s: 0.0,
        median_jct_s: 0.0,
        p95_jct_s: 0.0,
        p99_jct_s: 0.0,
        avg_wait_s: 0.0,
        median_wait_s: 0.0,
        p95_wait_s: 0.0,
        p99_wait_s: 0.0,
        avg_first_start_s: 0.0,
        p99_first_start_s: 0.0,
        avg_queue_s: 0.0,
        p99_queue_s: 0.0,
        avg_bounded_slowdown: 0.0,
        utilization: ratio(e.alloc_area, e.cap_area),
        utilization_span: ratio(span_alloc, span_cap),
        fragmentation,
        makespan_s: (last_finish - t0) as f64 / 1000.0,
        jain_fairness: 1.0,
        preemptions: e.preemptions,
        restarts: e.restarts,
        node_losses: e.node_losses,
        lost_gpu_hours: e.lost_gpu_ms / 3_600_000.0,
        eviction_lost_gpu_hours,
        eviction_lost_fraction: if gpu_hours_used > 0.0 { eviction_lost_gpu_hours / gpu_hours_used } else { 0.0 },
        currency: e.prices.currency.clone(),
        cost_on_demand: e.cost_od,
        cost_spot: e.cost_spot,
        cost_gpu: e.cost.gpu,
        cost_cpu: e.cost.cpu,
        cost_mem: e.cost.mem,
        cost: e.cost_od + e.cost_spot,
        gpu_hours_used,
        scaled_out_nodes: e.scale_outs,
        scaled_in_nodes: e.scale_ins,
        passes: e.passes,
        tick_passes: e.tick_passes,
        idle_passes: e.idle_passes,
        idle_tick_passes: e.idle_tick_passes,
        idle_tick_pass_ms: e.idle_tick_pass_ms,
        skipped_passes: e.skipped_passes,
        skipped_rows: trace.skipped_bad_rows,
        wall_ms: 0.0,
        per_tenant: names
            .iter()
            .map(|n| TenantResult {
                tenant: n.clone(),
                jobs: 0,
                avg_jct_s: 0.0,
                avg_wait_s: 0.0,
                avg_bounded_slowdown: 0.0,
                gpu_share: 0.0,
            })
            .collect(),
        by_size: Vec::new(),
        series: e.series,
        jcts: Vec::new(),
        job_rows: Vec::new(),
    };
    latency.fill(&mut r, &shares);
    r.job_rows = rows;
    r.wall_ms = wall.elapsed().as_secs_f64() * 1000.0;
    Ok(r)
}
