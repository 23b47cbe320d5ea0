//! `gpunet bench elastic`: what an autoscaled spot pool buys, in the simulator, and how fast a pool grows, live.
//!
//! **Simulated** (the core's autoscaler and reclaim steps, as the server runs them): a trace (Philly's by default,
//! whose submissions follow the day: busy days, quiet nights) on two clusters of V100 nodes of 8 GPUs —
//! `fixed`, on-demand nodes sized for the trace's peak demand, and `elastic`, on-demand nodes sized for its average
//! demand plus a spot pool grown and shrunk by the autoscaler up to the peak, whose nodes boot in 2 minutes and are
//! reclaimed at random with 2 minutes' notice. Side by side: average wait, cost (on-demand and spot apart), GPU-hours
//! lost to reclaims.
//!
//! **Live** (`--live-runs N`): N rounds, each a server of its own with an empty `local` pool (0..1 nodes) and one
//! spot job: the time from its submission to its process start on the new node (the pool decides, the provider
//! starts the agent, it registers, the job is placed and its process started).

use crate::bench::quantile;
use anyhow::{bail, Context, Result};
use gpunet_core::Dur;
use gpunet_sim::{simulate, ClusterSpec, SimConfig};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ElasticArgs {
    /// The trace (any format `gpunet sim` reads).
    #[arg(long, default_value = "data/traces/philly/philly_pollux.csv.gz")]
    pub(crate) trace: PathBuf,
    /// Reclaims per spot node per hour.
    #[arg(long, default_value_t = 0.05)]
    pub(crate) reclaims_per_hour: f64,
    /// Also measure a live pool's growth this many times (0: only the simulation).
    #[arg(long, default_value_t = 0)]
    pub(crate) live_runs: usize,
    /// table or json.
    #[arg(long, default_value = "table")]
    pub(crate) output: String,
}

/// One cluster's figures.
#[derive(Debug, Serialize)]
pub(crate) struct Side {
    name: &'static str,
    on_demand_gpus: u64,
    spot_max_gpus: u64,
    avg_wait_s: f64,
    avg_jct_s: f64,
    cost: f64,
    cost_on_demand: f64,
    cost_spot: f64,
    eviction_lost_gpu_hours: f64,
    scaled_out_nodes: usize,
    scaled_in_nodes: usize,
    completed: usize,
}

/// What it measured.
#[derive(Debug, Serialize)]
pub(crate) struct ElasticReport {
    jobs: usize,
    peak_gpus: u64,
    average_gpus: f64,
    sides: Vec<Side>,
    /// Submission → process started on a new pool node, each live round (ms).
    live_start_ms: Vec<f64>,
    live_start_p50_ms: Option<f64>,
}

/// The trace's peak and average GPU demand if every job started on submission.
fn demand(trace: &gpunet_sim::Trace) -> (u64, f64) {
    let mut ev: Vec<(f64, i64)> = Vec::with_capacity(trace.jobs.len() * 2);
    for j in &trace.jobs {
        ev.push((j.submit_s, j.gpus as i64));
        ev.push((j.submit_s + j.duration_s.max(0.0), -(j.gpus as i64)));
    }
    ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut peak, mut area) = (0i64, 0i64, 0.0);
    let start = ev.first().map_or(0.0, |e| e.0);
    let mut last = start;
    for (t, d) in &ev {
        area += cur as f64 * (t - last);
        last = *t;
        cur += d;
        peak = peak.max(cur);
    }
    let span = (last - start).max(1.0);
    (peak as u64, area / span)
}

fn group(count: u32, lifecycle: &str) -> gpunet_sim::cluster::NodeGroup {
    gpunet_sim::cluster::NodeGroup {
        count,
        gpus_per_node: 8,
        gpu_model: "V100-16GB".into(),
        cpu_milli: None,
        memory_mib: None,
        zone: None,
        rack_size: Some(8),
        lifecycle: Some(lifecycle.into()),
        price_per_gpu_hour: None,
        name: Some(lifecycle.into()),
    }
}

fn side(name: &'static str, r: &gpunet_sim::SimResult, od: u64, spot: u64) -> Side {
    Side {
        name,
        on_demand_gpus: od,
        spot_max_gpus: spot,
        avg_wait_s: r.avg_wait_s,
        avg_jct_s: r.avg_jct_s,
        cost: r.cost,
        cost_on_demand: r.cost_on_demand,
        cost_spot: r.cost_spot,
        eviction_lost_gpu_hours: r.eviction_lost_gpu_hours,
        scaled_out_nodes: r.scaled_out_nodes,
        scaled_in_nodes: r.scaled_in_nodes,
        completed: r.completed,
    }
}

/// Runs it.
pub(crate) async fn run(a: &ElasticArgs) -> Result<()> {
    if !matches!(a.output.as_str(), "table" | "json") {
        bail!("invalid --output {:?}: allowed are table and json", a.output);
    }
    if !(a.reclaims_per_hour.is_finite() && a.reclaims_per_hour >= 0.0) {
        bail!("invalid --reclaims-per-hour {}: allowed is a number >= 0", a.reclaims_per_hour);
    }
    let trace = gpunet_sim::read_trace(&a.trace, Default::default())
        .with_context(|| format!("read the trace {}", a.trace.display()))?;
    let (peak, avg) = demand(&trace);
    let per = 8u64;
    let peak_nodes = peak.div_ceil(per) as u32;
    let base_nodes = (avg.ceil() as u64).div_ceil(per).max(1) as u32;
    let spot_max = peak_nodes.saturating_sub(base_nodes).max(1);
    let spec = |node_group| ClusterSpec {
        version: Some(1),
        node_group,
        tenant: Vec::new(),
        prices: None,
        scheduler: None,
        nodes: Vec::new(),
    };
    let fixed = spec(vec![group(peak_nodes, "on-demand")]);
    let elastic = spec(vec![group(base_nodes, "on-demand"), group(1, "spot")]);
    let template = elastic
        .build_nodes()
        .into_iter()
        .find(|n| n.lifecycle() == gpunet_core::Lifecycle::Spot)
        .context("the elastic cluster's spot node")?;
    let base = SimConfig { spot_notice: Dur::from_secs(120), ..SimConfig::default() };
    let auto = SimConfig {
        autoscale: Some(gpunet_sim::engine::AutoscaleSim {
            cfg: gpunet_core::autoscale::AutoscaleConfig { max_nodes: spot_max, ..Default::default() },
            template,
            interval: Dur::from_secs(60),
            boot: Dur::from_secs(120),
        }),
        spot_reclaims_per_hour: Some(a.reclaims_per_hour),
        ..base.clone()
    };
    let (rf, re) = std::thread::scope(|s| {
        let f = s.spawn(|| simulate(&trace, &fixed, &base, &mut |_, _| {}));
        let e = s.spawn(|| simulate(&trace, &elastic, &auto, &mut |_, _| {}));
        (f.join(), e.join())
    });
    let rf = rf.map_err(|_| anyhow::anyhow!("the fixed simulation panicked"))??;
    let re = re.map_err(|_| anyhow::anyhow!("the elastic simulation panicked"))??;
    let mut live = Vec::new();
    for i in 0..a.live_runs {
        live.push(live_round(i).await?);
    }
    let mut sorted = live.clone();
    sorted.sort_by(f64::total_cmp);
    let report = ElasticReport {
        jobs: trace.jobs.len(),
        peak_gpus: peak,
        average_gpus: avg,
        sides: vec![
            side("fixed", &rf, peak_nodes as u64 * per, 0),
            side("elastic", &re, base_nodes as u64 * per, spot_max as u64 * per),
        ],
        live_start_p50_ms: (!sorted.is_empty()).then(|| quantile(&sorted, 0.5)),
        live_start_ms: live,
    };
    if a.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{} jobs; demand if every job started at once: peak {} GPUs, average {:.0} GPUs",
        report.jobs, report.peak_gpus, report.average_gpus
    );
    let rows: Vec<Vec<String>> = report
        .sides
        .iter()
        .map(|s| {
            vec![
                s.name.to_string(),
                s.on_demand_gpus.to_string(),
                s.spot_max_gpus.to_string(),
                format!("{:.0}", s.avg_wait_s),
                format!("{:.0}", s.avg_jct_s),
                format!("{:.0}", s.cost_on_demand),
                format!("{:.0}", s.cost_spot),
                format!("{:.0}", s.cost),
                format!("{:.1}", s.eviction_lost_gpu_hours),
                format!("{}/{}", s.scaled_out_nodes, s.scaled_in_nodes),
                s.completed.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        crate::client::table(
            &[
                "CLUSTER",
                "ON-DEMAND GPUS",
                "SPOT MAX GPUS",
                "AVG WAIT S",
                "AVG JCT S",
                "ON-DEMAND COST",
                "SPOT COST",
                "COST",
                "GPU-H LOST",
                "NODES OUT/IN",
                "COMPLETED",
            ],
            rows
        )
    );
    if let Some(p) = report.live_start_p50_ms {
        println!(
            "live: submission → process start on a new pool node, p50 of {}: {p:.0} ms (each: {:?})",
            report.live_start_ms.len(),
            report.live_start_ms.iter().map(|x| x.round() as u64).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One live round in a server of its own: an empty local pool, one spot job; submission → process start (ms).
async fn live_round(round: usize) -> Result<f64> {
    let dir = Scratch(std::env::temp_dir().join(format!("gpunet-bench-elastic-{}-{round}", std::process::id())));
    let _ = std::fs::remove_dir_all(dir.path());
    std::fs::create_dir_all(dir.path())?;
    let admin = gpunet_server::new_token();
    let join = gpunet_server::new_token();
    let mut cfg = gpunet_server::Config::new(dir.path().join("server"));
    cfg.listen = "127.0.0.1:0".parse()?;
    cfg.admin_token = Some(admin.clone());
    cfg.join_token = Some(join);
    let mut pool = gpunet_server::pools::PoolConfig::local("spot", "A10", 1, 0, 1);
    pool.interval_s = 0.05;
    pool.cooldown_s = 0.0;
    cfg.pools = vec![pool];
    let store = std::sync::Arc::new(gpunet_store::SqliteStore::open(&dir.path().join("server"))?);
    let running = gpunet_server::start(cfg, store).await?;
    let url = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let r = async {
        http.post(format!("{url}/v1/tenants"))
            .bearer_auth(&admin)
            .json(&serde_json::json!({"name": "bench"}))
            .send()
            .await?
            .error_for_status()?;
        let t0 = Instant::now();
        let submitted_ms = gpunet_server::now_ms();
        let sub: serde_json::Value = http
            .post(format!("{url}/v1/jobs"))
            .bearer_auth(&admin)
            .json(&serde_json::json!({"name": "burst", "tenant": "bench", "gpus": 1, "spot": "allowed",
                "command": ["true"]}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let id = sub["id"].as_u64().context("the job's id")?;
        loop {
            let ev: Vec<serde_json::Value> = http
                .get(format!("{url}/v1/jobs/{id}/events"))
                .bearer_auth(&admin)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            if let Some(at) = ev.iter().find(|e| e["kind"] == "process_started").and_then(|e| e["at_ms"].as_u64()) {
                return Ok::<f64, anyhow::Error>(at.saturating_sub(submitted_ms) as f64);
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("round {round}: the job did not start on a new node within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    .await;
    running.stop().await;
    r
}
