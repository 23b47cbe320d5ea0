//! `gpunet bench sched`: one full scheduling pass over a synthetic cluster and queue, then a stream of
//! arrival/completion events, each followed by a pass.
//!
//! The cluster mixes GPU models (A100-80GB 40%, H100-80GB 30%, V100-32GB 20%, T4 10%) in racks of 16 nodes, each rack
//! of one model in one of 4 zones, and 10% of the racks spot (tainted). Jobs follow the Philly size mix (≈93% 1 GPU, then 2, 4, 8, 16, 32, 64
//! GPUs; jobs above 8 GPUs are gangs of 8-GPU tasks within a zone), 20% ask for one model, 30% tolerate spot, with
//! log-uniform estimates from 1 minute to 1 day, checkpoints every 10 minutes, 5% of them at a higher priority
//! class (Philly itself has no priorities; production clusters use a few classes sparingly), across 20 tenants
//! whose guarantees share 90% of the GPUs (limit 2×, one cohort). Next to the jobs the full pass places it reports
//! how many were placeable (a pass that skips what does not fit instead of blocking).

use crate::bench::{peak_rss_mib, quantile};
use anyhow::{Context, Result};
use gpunet_core::tenant::Quota;
use gpunet_core::*;
use gpunet_sim::rng::Rng;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SchedArgs {
    /// Nodes in the synthetic cluster.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub(crate) gpus_per_node: u32,
    /// Pending jobs before the full pass.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) pending: u32,
    /// Queue policy: fifo, priority, sjf, srtf, srgf, drf, fairshare, las; or auto, the live default (SRGF with
    /// backfill, eviction for jobs 8× shorter, defragmentation and a probe of 15 minutes for learned estimates, which
    /// this bench's jobs do not have).
    #[arg(long, default_value = "fifo")]
    pub(crate) policy: String,
    /// Turn EASY backfill on.
    #[arg(long)]
    pub(crate) backfill: bool,
    /// Turn preemption off (it is on by default, as in `SchedConfig`).
    #[arg(long)]
    pub(crate) no_preemption: bool,
    /// Turn defragmentation on (a blocked job that needs GPUs on one node has the jobs of a node moved to GPUs free
    /// elsewhere; on in `auto`).
    #[arg(long)]
    pub(crate) defragment: bool,
    /// Most running jobs one victim search looks at (`victim_scan_limit`; default the scheduler's).
    #[arg(long)]
    pub(crate) victim_scan_limit: Option<u32>,
    /// Job arrays queued among the pending jobs (each one queue entry, see `gpunet_core::array`).
    #[arg(long, default_value_t = 0)]
    pub(crate) arrays: u32,
    /// Elements of each array (1-GPU tasks).
    #[arg(long, default_value_t = 1_000)]
    pub(crate) array_size: u32,
    /// Arrival/completion events after the full pass.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) events: u32,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// `table` or `json`.
    #[arg(long, default_value = "table")]
    pub(crate) output: String,
}

/// What the benchmark reports.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SchedReport {
    /// Policy.
    pub(crate) policy: String,
    /// Milliseconds of the full pass (computing its decisions).
    pub(crate) full_pass_ms: f64,
    /// Jobs the full pass started.
    pub(crate) placed: usize,
    /// Jobs a greedy pass would start (`gpunet_core::placeable`: policy order, quota admission, a job that does not
    /// fit skipped instead of blocking): how far `placed` is from what the free GPUs allow.
    pub(crate) placeable: usize,
    /// Job arrays queued (and elements in all).
    pub(crate) arrays: u32,
    /// Array elements in all.
    pub(crate) array_elements: u64,
    /// Median time of one event: the event, a pass and applying its decisions.
    pub event_p50_us: f64,
    /// 99th percentile of the same.
    pub event_p99_us: f64,
    /// Peak resident memory of the process.
    pub(crate) peak_rss_mib: f64,
}

/// GPU models of the synthetic cluster and the share of racks of each.
const MODELS: [(GpuModel, f64); 4] =
    [(GpuModel::A100_80GB, 0.4), (GpuModel::H100_80GB, 0.3), (GpuModel::V100_32GB, 0.2), (GpuModel::T4, 0.1)];

fn pick_model(r: &mut Rng) -> usize {
    let x = r.f64();
    let mut acc = 0.0;
    for (i, (_, p)) in MODELS.iter().enumerate() {
        acc += p;
        if x < acc {
            return i;
        }
    }
    MODELS.len() - 1
}

/// Builds the synthetic cluster with its tenants.
pub(crate) fn build_cluster(cfg: SchedConfig, nodes: u32, gpus: u32, seed: u64) -> Result<ClusterState> {
    let mut r = Rng::new(seed);
    let mut s = ClusterState::new(cfg)?;
    let gpus = gpus.clamp(1, 64) as usize;
    // Racks of 16 nodes, each of one GPU model in one zone (as datacenters are built); 10% of racks are spot.
    let mut rack_model = GpuModel::T4;
    let mut rack_spot = false;
    let prices = gpunet_core::PriceCatalogue::shipped();
    for i in 0..nodes {
        let rack = i / 16;
        if i % 16 == 0 {
            rack_model = MODELS[pick_model(&mut r)].0;
            rack_spot = r.f64() < 0.1;
        }
        let zone = rack % 4;
        let mut n = NodeSpec::with_gpus(
            format!("node-{i:05}"),
            rack_model,
            gpus,
            MilliCpu::cores(16 * gpus as u64),
            MiB::gib(128 * gpus as u64),
        )
        .label("zone", &format!("zone-{zone}"))
        .label("region", "r1")
        .label("rack", &format!("rack-{rack:04}"));
        if rack_spot {
            n = n.label("lifecycle", "spot").taint("lifecycle", "spot");
        }
        n.price_per_gpu_hour = prices.resolve_gpu_hour(&n, None);
        s.add_node(n)?;
    }
    let cap = s.capacity_gpus();
    // 20 tenants, guarantees sharing 90% of the GPUs with unequal weights.
    let weights: Vec<f64> = (0..20).map(|i| 1.0 + (i % 5) as f64).collect();
    let total: f64 = weights.iter().sum();
    for (i, w) in weights.iter().enumerate() {
        let g = (cap as f64 * 0.9 * w / total).floor() as u64;
        s.add_tenant(
            TenantSpec::new(format!("tenant-{i:02}")).weight(*w).quota(Quota::gpus(g, (2 * g).min(cap))).cohort("org"),
        )?;
    }
    Ok(s)
}

/// One synthetic job with the Philly size mix.
pub(crate) fn synth_job(r: &mut Rng, tenants: u32) -> JobSpec {
    let x = r.f64();
    let gpus = match x {
        x if x < 0.93 => 1,
        x if x < 0.955 => 2,
        x if x < 0.975 => 4,
        x if x < 0.99 => 8,
        x if x < 0.996 => 16,
        x if x < 0.999 => 32,
        _ => 64,
    };
    let (per, tasks) = if gpus > 8 { (8, gpus / 8) } else { (gpus, 1) };
    let tenant = TenantId(r.below(tenants as u64) as u32);
    let est = (60.0 * (1440f64).powf(r.f64())) as u64; // 1 min .. 1 day, log-uniform
    let mut spec = JobSpec::new(tenant, "synthetic", per, tasks)
        .estimate(Dur::from_secs(est))
        .priority(if r.f64() < 0.05 { 1 } else { 0 });
    spec.checkpoint_interval = Some(Dur::from_mins(10));
    if r.f64() < 0.2 {
        spec.gpu_models = gpunet_core::job::thin_vec![MODELS[pick_model(r)].0];
    }
    if r.f64() < 0.3 {
        spec.tolerations =
            gpunet_core::job::thin_vec![Toleration { key: "lifecycle".into(), value: Some("spot".into()) }];
    }
    spec
}

/// Runs the benchmark.
pub(crate) fn run(args: &SchedArgs) -> Result<SchedReport> {
    let named: gpunet_core::config::PolicyName = args.policy.parse().context("--policy")?;
    let mut cfg = match named {
        gpunet_core::config::PolicyName::Recommended => SchedConfig::recommended(),
        gpunet_core::config::PolicyName::Plain(policy) => SchedConfig::with_policy(policy),
    };
    cfg.backfill |= args.backfill;
    cfg.preemption.defragment |= args.defragment;
    cfg.preemption.enabled = !args.no_preemption;
    if let Some(n) = args.victim_scan_limit {
        cfg.preemption.victim_scan_limit = n;
    }
    cfg.validate().context("--victim-scan-limit")?;
    let mut s = build_cluster(cfg, args.nodes, args.gpus_per_node, args.seed)?;
    let tenants = s.tenant_count() as u32;
    let mut r = Rng::new(args.seed.wrapping_add(1));
    let mut next_id = 1u64;
    // Arrays are spread evenly through the pending jobs' submissions.
    let every = args.pending.checked_div(args.arrays).map_or(u32::MAX, |n| n.max(1));
    let mut arrays = 0u32;
    for i in 0..args.pending {
        if i % every == 0 && arrays < args.arrays {
            let mut spec = synth_job(&mut r, tenants);
            spec.tasks = 1;
            spec.task = JobSpec::new(spec.tenant, "array", 1, 1).task;
            spec.gang = false;
            spec.topology = TopologyScope::Any;
            spec.array = Some(Box::new(ArraySpec { indices: (0..args.array_size).collect(), limit: None }));
            s.submit(JobId(next_id), spec, Time(i as u64))?;
            next_id += 1 + args.array_size as u64;
            arrays += 1;
        }
        s.submit(JobId(next_id), synth_job(&mut r, tenants), Time(i as u64))?;
        next_id += 1;
    }
    let mut now = Time::from_secs(3600);
    let placeable = gpunet_core::placeable(&s, now);
    let t0 = Instant::now();
    let decisions = schedule(&s, now);
    let full_pass_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut running: Vec<JobId> = Vec::new();
    let mut pos: HashMap<JobId, usize> = HashMap::new();
    let track = |ds: &[Decision], running: &mut Vec<JobId>, pos: &mut HashMap<JobId, usize>| {
        for d in ds {
            match d {
                Decision::Start { job, .. } => {
                    pos.insert(*job, running.len());
                    running.push(*job);
                }
                Decision::Preempt { job, .. } => {
                    if let Some(i) = pos.remove(job) {
                        running.swap_remove(i);
                        if let Some(m) = running.get(i) {
                            pos.insert(*m, i);
                        }
                    }
                }
                _ => {}
            }
        }
    };
    let placed = decisions.iter().filter(|d| matches!(d, Decision::Start { .. })).count();
    for d in &decisions {
        s.apply(d, now)?;
    }
    track(&decisions, &mut running, &mut pos);
    let mut samples = Vec::with_capacity(args.events as usize);
    let debug = std::env::var_os("GPUNET_BENCH_DEBUG").is_some();
    for _ in 0..args.events {
        now = now + Dur::from_secs(1);
        let complete = !running.is_empty() && r.f64() < 0.5;
        let victim = if complete {
            let i = r.below(running.len() as u64) as usize;
            let id = running.swap_remove(i);
            pos.remove(&id);
            if let Some(m) = running.get(i) {
                pos.insert(*m, i);
            }
            Some(id)
        } else {
            None
        };
        let spec = synth_job(&mut r, tenants);
        let t = Instant::now();
        match victim {
            Some(id) => {
                s.finish(id, now, true)?;
            }
            None => {
                s.submit(JobId(next_id), spec, now)?;
                next_id += 1;
            }
        }
        let t_pass = Instant::now();
        let (ds, st) = schedule_with_stats(&s, now);
        let t_apply = Instant::now();
        for d in &ds {
            s.apply(d, now)?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        if debug {
            // One line per event: considered, started, backfilled, preempted, the event's µs, placement searches,
            // reservation releases, and of the event's time the pass's and the decisions' application's µs.
            crate::say!(
                "{} {} {} {} {:.0} {} {} {:.0} {:.0}",
                st.considered,
                st.started,
                st.backfilled,
                st.preempted,
                samples.last().unwrap(),
                st.placement_attempts,
                st.reservation_releases,
                (t_apply - t_pass).as_secs_f64() * 1e6,
                t_apply.elapsed().as_secs_f64() * 1e6,
            );
        }
        track(&ds, &mut running, &mut pos);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    debug_assert!(s.check_invariants().is_ok());
    Ok(SchedReport {
        policy: named.name().to_string(),
        full_pass_ms,
        placed,
        placeable,
        arrays,
        array_elements: arrays as u64 * args.array_size as u64,
        event_p50_us: quantile(&samples, 0.5),
        event_p99_us: quantile(&samples, 0.99),
        peak_rss_mib: peak_rss_mib(),
    })
}
