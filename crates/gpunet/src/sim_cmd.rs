//! `gpunet sim` and `gpunet sim compare`.

use anyhow::{bail, Context, Result};
use gpunet_core::config::PolicyName;
use gpunet_core::{Dur, Policy};
use gpunet_sim::report::{over_completed, row_avg};
use gpunet_sim::{read_trace, report, simulate, ClusterSpec, ReadOptions, SimConfig, SimResult, Trace};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Options shared by `sim` and `sim compare`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SimOpts {
    /// Trace file (CSV, gzip accepted).
    #[arg(long)]
    pub(crate) trace: PathBuf,
    /// gpunet, philly, pai2023, tiresias, pollux or sia; detected from the header when omitted.
    #[arg(long)]
    pub(crate) trace_format: Option<String>,
    /// Skip and count malformed rows instead of stopping at the first.
    #[arg(long)]
    pub(crate) skip_bad_rows: bool,
    /// A preset (philly, pai2023, pollux, tiresias-n32g4, …) or a cluster spec TOML file.
    #[arg(long, default_value = "philly")]
    pub(crate) cluster: String,
    /// EASY backfill.
    #[arg(long)]
    pub(crate) backfill: bool,
    /// Tenant quotas: none, equal, proportional or philly-vc.
    #[arg(long, default_value = "none")]
    pub(crate) quotas: String,
    /// on: guarantees form a shared pool with borrowing and reclaim; off: islands.
    #[arg(long, default_value = "off")]
    pub(crate) borrowing: String,
    /// oracle, noisy:SIGMA or history.
    #[arg(long, default_value = "oracle")]
    pub(crate) estimates: String,
    /// Seed for estimate noise, failures and reclaims.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Mean time between failures of a node, in hours (failures off when omitted).
    #[arg(long)]
    pub(crate) mtbf_hours: Option<f64>,
    /// Hours a failed node (or a reclaimed spot node) stays away.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) mttr_hours: f64,
    /// Spot reclaims per spot node per hour (off when omitted).
    #[arg(long)]
    pub(crate) spot_reclaims_per_hour: Option<f64>,
    /// Seconds of notice before a spot node goes.
    #[arg(long, default_value_t = 120)]
    pub(crate) spot_notice_s: u64,
    /// Minutes between job checkpoints (default: the cluster's `[scheduler] checkpoint_interval`, else 30).
    #[arg(long)]
    pub(crate) checkpoint_mins: Option<u64>,
    /// LAS queue thresholds in GPU-seconds, comma-separated and increasing (default 3600,36000: three queues).
    #[arg(long)]
    pub(crate) las_thresholds: Option<String>,
    /// A job younger than this (seconds, in its attempt) is never preempted (default 300).
    #[arg(long)]
    pub(crate) min_run_time_s: Option<u64>,
    /// At most this many evictions per eviction window (default 20).
    #[arg(long)]
    pub(crate) max_evictions: Option<u32>,
    /// The eviction rate limit's window in seconds (default 600).
    #[arg(long)]
    pub(crate) eviction_window_s: Option<u64>,
    /// Seconds between scheduling passes while jobs wait (default 60).
    #[arg(long)]
    pub(crate) tick_s: Option<u64>,
    /// Seconds from asking a preempted or drained job to stop until its processes are gone (its GPUs stay held
    /// meanwhile, as live), the same for every stop. Default: each stop draws one of the times measured on real
    /// processes writing a checkpoint on SIGTERM (data/stop-times/README.md), at most the agent's 10 s grace period.
    #[arg(long, conflicts_with = "stop_times")]
    pub(crate) stop_time_s: Option<f64>,
    /// Measured stop times to draw from instead: a CSV with a header and a `seconds` column, one row per stop
    /// (scripts/measure-stop-times.py writes one).
    #[arg(long)]
    pub(crate) stop_times: Option<std::path::PathBuf>,
    /// Turn preemption off.
    #[arg(long)]
    pub(crate) no_preemption: bool,
    /// Preemptive SJF/SRTF/SRGF: under sjf, srtf or srgf a waiting job whose key is at most 1/`shorter_ratio` of a
    /// running one's (default: half or less; the cluster's `[scheduler] shorter_ratio`) evicts it, with the same
    /// victim choice, minimum run time and rate limit as other preemption.
    #[arg(long)]
    pub(crate) preemptive: bool,
    /// Defragmentation: a blocked job that needs GPUs on one node (or whole nodes) while enough are free in pieces
    /// has the jobs of the cheapest nodes moved to those pieces (on in `auto`; docs/scheduler.md).
    #[arg(long)]
    pub(crate) defragment: bool,
    /// A first stint, in seconds, for jobs with learned estimates longer than it, or none: ranked as jobs that end
    /// then until they have run it, so that short jobs in classes learned as long are found out (0: off;
    /// docs/scheduler.md).
    #[arg(long)]
    pub(crate) probe_s: Option<u64>,
    /// Write one CSV row per job (times, wait, evictions) to this file (`sim compare`: one file per policy, the
    /// policy's name inserted before the extension).
    #[arg(long)]
    pub(crate) jobs_out: Option<PathBuf>,
    /// Idealised placement for bounds: every job becomes one-GPU tasks that may sit on any GPU of any node, so the
    /// scheduler only counts free GPUs (no node boundaries or topology), as scheduling papers' models do.
    #[arg(long)]
    pub(crate) gpu_counting: bool,
    /// Which jobs may run on spot nodes: none, preemptible or all.
    #[arg(long, default_value = "preemptible")]
    pub(crate) spot_jobs: String,
    /// Autoscale the spot pool up to this many spot nodes (copies of the cluster's first spot node group).
    #[arg(long)]
    pub(crate) autoscale_max_nodes: Option<u32>,
    /// Simulate only the first N jobs (by submission time).
    #[arg(long)]
    pub(crate) max_jobs: Option<usize>,
    /// table or json.
    #[arg(long, default_value = "table")]
    pub(crate) output: String,
    /// Write report.md and SVG charts into this directory.
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
}

/// `gpunet sim`.
#[derive(Debug, clap::Args)]
#[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
pub(crate) struct SimCmd {
    #[command(subcommand)]
    pub(crate) sub: Option<SimSub>,
    /// Queue policy: fifo, priority, sjf, srtf, srgf, drf, fairshare or las (default: the cluster's `[scheduler] policy`,
    /// else fifo); or auto, the live default (SRGF with backfill, eviction for jobs 8× shorter, defragmentation and a
    /// probe of 15 minutes; docs/scheduler.md).
    #[arg(long)]
    pub(crate) policy: Option<String>,
    #[command(flatten)]
    pub(crate) opts: Option<SimOpts>,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SimSub {
    /// Run the same trace under several policies in parallel threads and print them side by side.
    Compare {
        /// Comma-separated policies (`auto`: the live default, as `gpunet sim --policy auto`).
        #[arg(long, default_value = "fifo,sjf,drf,fairshare,las,priority")]
        policies: String,
        #[command(flatten)]
        opts: SimOpts,
    },
}

/// `warnings`: what is given but does nothing, each a sentence (printed by the caller: once per text in `sim
/// compare`, naming the policies it applies to).
fn config(
    o: &SimOpts,
    policy: Policy,
    recommended: bool,
    cluster: &ClusterSpec,
    warnings: &mut Vec<String>,
) -> Result<SimConfig> {
    let borrowing = match o.borrowing.as_str() {
        "on" => true,
        "off" => false,
        b => bail!("invalid --borrowing {b:?}: allowed are on and off"),
    };
    for (name, v) in [("--mttr-hours", Some(o.mttr_hours)), ("--mtbf-hours", o.mtbf_hours)] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                bail!("invalid {name} {v}: allowed is a number of hours > 0");
            }
        }
    }
    if o.spot_reclaims_per_hour.is_some_and(|r| !(r.is_finite() && r >= 0.0)) {
        bail!("invalid --spot-reclaims-per-hour: allowed is a number >= 0");
    }
    let autoscale = match o.autoscale_max_nodes {
        None => None,
        Some(max) => {
            let template = cluster
                .build_nodes()
                .into_iter()
                .find(|n| n.lifecycle() == gpunet_core::Lifecycle::Spot)
                .context("--autoscale-max-nodes: the cluster has no spot node group to copy")?;
            Some(gpunet_sim::engine::AutoscaleSim {
                cfg: gpunet_core::autoscale::AutoscaleConfig { max_nodes: max, ..Default::default() },
                template,
                interval: Dur::from_secs(60),
                boot: Dur::from_secs(120),
            })
        }
    };
    // `auto`'s setting first, then the cluster's [scheduler] table (which tunes it, as the server's file does), then
    // the flags given.
    let mut base = SimConfig::default();
    if recommended {
        base.sched.use_recommended_policy();
        base.sched.backfill = true;
    }
    if let Some(k) = &cluster.scheduler {
        // Its policy is in `policy` and `recommended` already (`named_config`), unless the command line named
        // another, which wins: a file's `"auto"` would otherwise bring its knobs to `--policy fifo`.
        let k = gpunet_core::SchedKnobs { policy: None, ..k.clone() };
        base.apply_knobs(&k).context("the cluster's [scheduler]")?;
    }
    let sched = &mut base.sched;
    sched.policy = policy;
    if o.backfill {
        sched.backfill = true;
    }
    if o.no_preemption {
        sched.preemption.enabled = false;
    }
    if o.preemptive {
        sched.preemption.shorter_first = true;
    }
    if o.defragment {
        sched.preemption.defragment = true;
    }
    if let Some(s) = o.probe_s {
        sched.probe = (s > 0).then(|| Dur::from_secs(s));
    }
    if let Some(t) = &o.las_thresholds {
        sched.las_thresholds_gpu_s =
            t.split(',').map(|x| x.trim().parse::<u64>()).collect::<Result<_, _>>().map_err(|_| {
                anyhow::anyhow!("invalid --las-thresholds {t:?}: allowed are GPU-seconds such as 3600,36000")
            })?;
    }
    if let Some(s) = o.min_run_time_s {
        sched.preemption.min_run_time = Dur::from_secs(s);
    }
    if let Some(n) = o.max_evictions {
        sched.preemption.max_per_interval = n;
    }
    match o.eviction_window_s {
        Some(0) => bail!("invalid --eviction-window-s 0: allowed is at least 1"),
        Some(s) => sched.preemption.interval = Dur::from_secs(s),
        None => {}
    }
    sched.validate().context("invalid scheduler settings")?;
    // The file's knobs with the flags given laid over them: what a policy sets by itself is not warned about.
    let mut given = cluster.scheduler.clone().unwrap_or_default();
    given.preemptive = given.preemptive.filter(|_| !o.preemptive).or(o.preemptive.then_some(true));
    given.defragment = given.defragment.filter(|_| !o.defragment).or(o.defragment.then_some(true));
    if o.las_thresholds.is_some() {
        given.las_thresholds_gpu_s = Some(sched.las_thresholds_gpu_s.clone());
    }
    if let Some(s) = o.probe_s {
        given.probe = Some(gpunet_core::HumanDur(Dur::from_secs(s)));
    }
    if let Some(n) = o.max_evictions {
        given.max_evictions = Some(n);
    }
    warnings.extend(sched.ignored_knobs(&given));
    // A probe given applies to learned estimates (and, under SRTF and SRGF, to none): with given ones it does nothing.
    let probe_given = o.probe_s.is_some_and(|s| s > 0) || given.probe.is_some_and(|p| p.0 > Dur::ZERO);
    if probe_given && o.estimates != "history" {
        warnings.push(format!(
            "the probe does nothing with --estimates {}: every job's run time is given (it applies to learned \
             estimates, --estimates history)",
            o.estimates
        ));
    }
    match o.checkpoint_mins {
        Some(0) => bail!("invalid --checkpoint-mins 0: allowed is at least 1"),
        Some(m) => base.checkpoint_interval = Dur::from_mins(m),
        None => {}
    }
    match o.tick_s {
        Some(t) if t == 0 || Dur::from_secs(t) > gpunet_core::config::MAX_TICK => {
            bail!("invalid --tick-s {t}: allowed are 1 to 3600 seconds")
        }
        Some(t) => base.tick = Dur::from_secs(t),
        None => {}
    }
    let stop_time = match (o.stop_time_s, &o.stop_times) {
        (Some(s), _) if !s.is_finite() || !(0.0..=86_400.0).contains(&s) => {
            bail!("invalid --stop-time-s {s}: allowed are 0 to 86400 seconds")
        }
        (Some(s), _) => gpunet_sim::StopTime::Fixed(Dur((s * 1000.0).round() as u64)),
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("read --stop-times {}", f.display()))?;
            gpunet_sim::StopTime::from_csv(&f.display().to_string(), &text)
                .with_context(|| format!("invalid --stop-times {}", f.display()))?
        }
        (None, None) => base.stop_time.clone(),
    };
    if o.max_jobs == Some(0) {
        bail!("invalid --max-jobs 0: allowed is at least 1 (leave it out for the whole trace)");
    }
    Ok(SimConfig {
        quotas: o.quotas.parse()?,
        borrowing,
        estimates: o.estimates.parse()?,
        seed: o.seed,
        mtbf: o.mtbf_hours.map(|h| Dur((h * 3_600_000.0) as u64)),
        mttr: Dur((o.mttr_hours * 3_600_000.0) as u64),
        spot_reclaims_per_hour: o.spot_reclaims_per_hour,
        spot_notice: Dur::from_secs(o.spot_notice_s),
        max_jobs: o.max_jobs,
        autoscale,
        spot_jobs: o.spot_jobs.parse()?,
        stop_time,
        gpu_counting: o.gpu_counting,
        ..base
    })
}

fn load(o: &SimOpts) -> Result<(Trace, ClusterSpec)> {
    if !matches!(o.output.as_str(), "table" | "json") {
        bail!("invalid --output {:?}: allowed are table and json", o.output);
    }
    let format = o.trace_format.as_deref().map(str::parse).transpose()?;
    let trace = read_trace(&o.trace, ReadOptions { format, skip_bad_rows: o.skip_bad_rows })?;
    if trace.jobs.is_empty() {
        let skipped = match trace.skipped_bad_rows + trace.skipped_never_ran {
            0 => String::new(),
            _ => format!(
                " ({} malformed rows skipped under --skip-bad-rows, {} that never ran)",
                trace.skipped_bad_rows, trace.skipped_never_ran
            ),
        };
        bail!("read {}: the trace has no jobs{skipped}", o.trace.display());
    }
    let cluster = ClusterSpec::load(&o.cluster)?;
    Ok((trace, cluster))
}

fn progress_bar(enabled: bool) -> impl FnMut(usize, usize) {
    move |done, total| {
        if enabled {
            let pct = done * 100 / total.max(1);
            let bar = "#".repeat(pct / 4);
            let _ = write!(std::io::stderr(), "\r[{bar:<25}] {pct:>3}% {done}/{total} jobs");
            if done >= total {
                crate::say!();
            }
            let _ = std::io::stderr().flush();
        }
    }
}

/// A table row: its label and how to print it.
type Row = (&'static str, fn(&SimResult) -> String);

const ROWS: [Row; 23] = [
    ("jobs", |r| r.jobs.to_string()),
    ("completed / unfinished", |r| format!("{} / {}", r.completed, r.unfinished)),
    ("avg JCT (s)", |r| over_completed(r, format!("{:.0}", r.avg_jct_s))),
    ("median JCT (s)", |r| over_completed(r, format!("{:.0}", r.median_jct_s))),
    ("p95 JCT (s)", |r| over_completed(r, format!("{:.0}", r.p95_jct_s))),
    ("p99 JCT (s)", |r| over_completed(r, format!("{:.0}", r.p99_jct_s))),
    ("avg wait, all not running (s)", |r| over_completed(r, format!("{:.0}", r.avg_wait_s))),
    ("p50 / p99 wait (s)", |r| over_completed(r, format!("{:.0} / {:.0}", r.median_wait_s, r.p99_wait_s))),
    ("avg to first start (s)", |r| over_completed(r, format!("{:.0}", r.avg_first_start_s))),
    ("p99 to first start (s)", |r| over_completed(r, format!("{:.0}", r.p99_first_start_s))),
    ("avg bounded slowdown", |r| over_completed(r, format!("{:.2}", r.avg_bounded_slowdown))),
    ("avg wait by size 1|2-4|5-8|>8 (s)", |r| {
        r.by_size.iter().map(|c| row_avg(c.jobs, c.avg_wait_s, 0)).collect::<Vec<_>>().join("|")
    }),
    ("utilization (to last end)", |r| format!("{:.1}%", r.utilization * 100.0)),
    ("utilization (trace span)", |r| format!("{:.1}%", r.utilization_span * 100.0)),
    ("fragmentation", |r| format!("{:.1}%", r.fragmentation * 100.0)),
    ("makespan (s)", |r| format!("{:.0}", r.makespan_s)),
    ("Jain fairness", |r| over_completed(r, format!("{:.3}", r.jain_fairness))),
    ("preemptions / restarts", |r| format!("{} / {}", r.preemptions, r.restarts)),
    ("lost GPU-hours", |r| format!("{:.1}", r.lost_gpu_hours)),
    ("lost to evictions (GPU-h)", |r| {
        format!("{:.1} ({:.2}%)", r.eviction_lost_gpu_hours, r.eviction_lost_fraction * 100.0)
    }),
    ("estimates", |r| r.estimates.clone()),
    ("probe (s)", |r| r.probe_s.map_or_else(|| "off".into(), |p| format!("{p:.0}"))),
    ("wall (ms)", |r| format!("{:.0}", r.wall_ms)),
];

fn table(results: &[SimResult]) -> String {
    let heads: Vec<String> = results
        .iter()
        .map(|r| {
            let name = r.setting.as_deref().unwrap_or(&r.policy);
            format!("{name}{}{}", if r.preemptive { "+pre" } else { "" }, if r.backfill { "+bf" } else { "" })
        })
        .collect();
    let w0 = ROWS.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let cells: Vec<Vec<String>> = ROWS.iter().map(|(_, f)| results.iter().map(f).collect()).collect();
    let ws: Vec<usize> = (0..results.len())
        .map(|i| cells.iter().map(|row| row[i].len()).chain([heads[i].len()]).max().unwrap_or(0))
        .collect();
    let mut out = format!("{:w0$}", "");
    for (h, w) in heads.iter().zip(&ws) {
        out += &format!("  {h:>w$}");
    }
    out.push('\n');
    for ((name, _), row) in ROWS.iter().zip(&cells) {
        out += &format!("{name:w0$}");
        for (c, w) in row.iter().zip(&ws) {
            out += &format!("  {c:>w$}");
        }
        out.push('\n');
    }
    out
}

/// Writes to standard output; a reader that went away (`| head`) ends it quietly, as other tools do, instead of a
/// panic.
fn print_out(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("write the results to standard output"),
    }
}

/// Checks before a simulation that its files can be written where asked (`--jobs-out`'s folder exists, `--report`
/// is a folder or nothing yet): they were written after it, and a wrong path lost the whole run. `names`: `sim
/// compare`'s policies, whose files are named after them.
fn check_outputs(o: &SimOpts, names: &[&str]) -> Result<()> {
    if let Some(p) = &o.jobs_out {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            bail!("invalid --jobs-out {}: the folder {} does not exist", p.display(), dir.display());
        }
        let paths: Vec<PathBuf> =
            if names.is_empty() { vec![p.clone()] } else { names.iter().map(|n| per_policy_path(p, n)).collect() };
        if let Some(d) = paths.iter().find(|p| p.is_dir()) {
            bail!("invalid --jobs-out {}: {} is a folder", p.display(), d.display());
        }
    }
    if let Some(d) = &o.report {
        if d.exists() && !d.is_dir() {
            bail!("invalid --report {}: it exists and is not a folder", d.display());
        }
    }
    Ok(())
}

/// Warns of jobs no node of the cluster could ever hold: they are left unfinished, and the averages (over completed
/// jobs) leave them out.
fn warn_never_fit(r: &SimResult) {
    if r.never_fit > 0 {
        crate::say!(
            "warning: {}: {} of {} jobs can never run on this cluster and are left unfinished (first: {}); the \
             averages are over completed jobs",
            r.setting.as_deref().unwrap_or(&r.policy),
            r.never_fit,
            r.jobs,
            r.never_fit_example.as_deref().unwrap_or("?")
        );
    }
}

/// `jobs.csv` for policy `las` → `jobs.las.csv` (beside the given path).
fn per_policy_path(p: &std::path::Path, policy: &str) -> PathBuf {
    let stem = p.file_stem().map_or_else(|| "jobs".into(), |s| s.to_string_lossy().into_owned());
    let name = match p.extension() {
        Some(e) => format!("{stem}.{policy}.{}", e.to_string_lossy()),
        None => format!("{stem}.{policy}"),
    };
    p.with_file_name(name)
}

/// The simulation's configuration for a policy named on the command line (`None`: the cluster file's, else FIFO):
/// `auto` is the live default, `SchedConfig::recommended` (SRGF, backfill, eviction for jobs 8× shorter,
/// defragmentation, a probe of 15 minutes), tuned by the cluster file's `[scheduler]` knobs as the server's file tunes it.
fn named_config(
    o: &SimOpts,
    named: Option<PolicyName>,
    cluster: &ClusterSpec,
    warnings: &mut Vec<String>,
) -> Result<SimConfig> {
    // Named on the command line, else by the cluster's `[scheduler] policy` (`auto` too), else FIFO.
    let named = named.or_else(|| cluster.scheduler.as_ref().and_then(|k| k.policy));
    let policy = match named {
        Some(PolicyName::Recommended) => gpunet_core::SchedConfig::RECOMMENDED_POLICY,
        Some(PolicyName::Plain(p)) => p,
        None => Policy::Fifo,
    };
    config(o, policy, named == Some(PolicyName::Recommended), cluster, warnings)
}

/// Runs `gpunet sim …`.
pub(crate) fn run(cmd: SimCmd) -> Result<()> {
    match cmd.sub {
        None => {
            let o = cmd.opts.context("--trace is required")?;
            let (trace, cluster) = load(&o)?;
            let named: Option<PolicyName> =
                cmd.policy.as_deref().map(str::parse).transpose().map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
            let named = named.or_else(|| cluster.scheduler.as_ref().and_then(|k| k.policy));
            let mut warnings = Vec::new();
            let cfg = named_config(&o, named, &cluster, &mut warnings)?;
            for w in warnings {
                crate::say!("warning: {w}");
            }
            check_outputs(&o, &[])?;
            let mut bar = progress_bar(std::io::stderr().is_terminal() && o.output == "table");
            let mut r = simulate(&trace, &cluster, &cfg, &mut bar)?;
            if named == Some(PolicyName::Recommended) {
                r.setting = Some(PolicyName::Recommended.name().to_string());
            }
            warn_never_fit(&r);
            // The results first: a file that cannot be written then loses none of them.
            if o.output == "json" {
                print_out(&format!("{}\n", serde_json::to_string(&r)?))?;
            } else {
                let mut out = table(std::slice::from_ref(&r));
                if trace.skipped_bad_rows + trace.skipped_never_ran > 0 {
                    out += &format!(
                        "skipped rows: {} malformed, {} that never ran\n",
                        trace.skipped_bad_rows, trace.skipped_never_ran
                    );
                }
                print_out(&out)?;
            }
            if let Some(dir) = &o.report {
                report::write_report(dir, &format!("{} on {}", o.trace.display(), o.cluster), &r)?;
            }
            if let Some(p) = &o.jobs_out {
                gpunet_sim::write_jobs_csv(p, &r.job_rows)?;
            }
        }
        Some(SimSub::Compare { policies, opts: o }) => {
            let policies: Vec<PolicyName> = policies
                .split(',')
                .map(|p| p.trim().parse::<PolicyName>().map_err(anyhow::Error::from))
                .collect::<Result<_>>()
                .context("--policies")?;
            let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
            if let Some(twice) = names.iter().enumerate().find_map(|(i, n)| names[..i].contains(n).then_some(n)) {
                bail!("invalid --policies: {twice} is named twice");
            }
            if policies.is_empty() {
                bail!("invalid --policies: name at least one policy");
            }
            let (trace, cluster) = load(&o)?;
            // Each warning once, naming the policies it applies to (it was printed once per policy, unnamed).
            let mut said: Vec<(String, Vec<&str>)> = Vec::new();
            let mut cfgs: Vec<SimConfig> = Vec::with_capacity(policies.len());
            for (p, name) in policies.iter().zip(&names) {
                let mut warnings = Vec::new();
                cfgs.push(named_config(&o, Some(*p), &cluster, &mut warnings)?);
                for w in warnings {
                    match said.iter_mut().find(|(t, _)| *t == w) {
                        Some((_, who)) => who.push(name),
                        None => said.push((w, vec![name])),
                    }
                }
            }
            for (w, who) in said {
                crate::say!("warning ({}): {w}", who.join(", "));
            }
            check_outputs(&o, &names)?;
            let tty = std::io::stderr().is_terminal() && o.output == "table";
            let results: Vec<SimResult> = std::thread::scope(|s| {
                let handles: Vec<_> = cfgs
                    .iter()
                    .map(|cfg| {
                        let (trace, cluster) = (&trace, &cluster);
                        s.spawn(move || simulate(trace, cluster, cfg, &mut |_, _| {}))
                    })
                    .collect();
                handles
                    .into_iter()
                    .zip(&names)
                    .map(|(h, name)| {
                        let r = h.join().map_err(|_| anyhow::anyhow!("a simulation thread panicked"))??;
                        if tty {
                            crate::say!("done: {name} ({:.0} ms)", r.wall_ms);
                        }
                        Ok(r)
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            let mut results = results;
            for (r, p) in results.iter_mut().zip(&policies) {
                if *p == PolicyName::Recommended {
                    r.setting = Some(p.name().to_string());
                }
                warn_never_fit(r);
            }
            if o.output == "json" {
                print_out(&format!("{}\n", serde_json::to_string(&results)?))?;
            } else {
                print_out(&table(&results))?;
            }
            // Files and reports are named by policy, `auto` apart from a plain `srgf` (both run SRGF).
            if let Some(p) = &o.jobs_out {
                for (r, name) in results.iter().zip(&names) {
                    gpunet_sim::write_jobs_csv(&per_policy_path(p, name), &r.job_rows)?;
                }
            }
            if let Some(dir) = &o.report {
                for (r, name) in results.iter().zip(&names) {
                    report::write_report(&dir.join(name), &format!("{} under {name}", o.trace.display()), r)?;
                }
            }
        }
    }
    Ok(())
}
