//! What a simulation measured: the summary ([`SimResult`]), its breakdowns by tenant and by job size, and the
//! per-job rows behind them (`--jobs-out`). Every definition is written here and in `docs/scheduler.md` ("Simulator metrics"):
//!
//! - **wait** (`avg_wait_s`, percentiles): a job's total time *not running* between its submission and its end —
//!   the queueing before its first start, every wait after an eviction or a node loss, and every restart backoff.
//!   It is `JCT − time held`, where *time held* sums its attempts from start to confirmed end (a victim still
//!   stopping holds its GPUs, so that time counts as running, as in the live server's
//!   `gpunet_job_not_running_duration_seconds`, which observes every job that ends, not only completed ones).
//! - **first start** (`avg_first_start_s`): submission → first start only (the old `avg_queue_s`, kept as an alias
//!   key for one release). A preemptive policy can keep it tiny while jobs wait long after evictions.
//! - **JCT**: submission → successful end. **Bounded slowdown**: JCT ÷ max(trace duration, 10 s), at least 1.
//! - Averages and percentiles are over completed jobs (failed and unfinished jobs have no JCT).
//! - **Size classes** by GPUs asked: `1`, `2-4`, `5-8` (Philly's 8-GPU jobs; 5–7 are rare), `>8`.
//! - **GPU-hours lost to evictions**: GPU-time of evicted attempts after their last checkpoint (the work redone);
//!   `eviction_lost_fraction` divides it by all GPU-hours allocated.
//! - **Utilisation over the trace's span**: allocated ÷ schedulable GPU-time between the first and the last
//!   submission (the window in which the trace offers its load); `utilization` runs to the last completion.

use crate::error::SimError;

fn is_zero(n: &usize) -> bool {
    *n == 0
}
use serde::Serialize;
use std::io::Write as _;
use std::path::Path;

/// Per-tenant results.
#[derive(Debug, Clone, Serialize)]
pub struct TenantResult {
    /// Name.
    pub tenant: String,
    /// Jobs completed.
    pub jobs: usize,
    /// Mean JCT of its completed jobs.
    pub avg_jct_s: f64,
    /// Mean total time not running of its completed jobs.
    pub avg_wait_s: f64,
    /// Mean bounded slowdown of its completed jobs.
    pub avg_bounded_slowdown: f64,
    /// Its share of all GPU-time used.
    pub gpu_share: f64,
}

/// Results of one job-size class.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// `1`, `2-4`, `5-8` or `>8` GPUs.
    pub class: &'static str,
    /// Jobs completed.
    pub jobs: usize,
    /// Mean JCT.
    pub avg_jct_s: f64,
    /// Mean total time not running.
    pub avg_wait_s: f64,
    /// 99th percentile of the time not running.
    pub p99_wait_s: f64,
    /// Mean bounded slowdown.
    pub avg_bounded_slowdown: f64,
}

/// The size class of a job asking for `gpus`.
pub fn size_class(gpus: u32) -> &'static str {
    match gpus {
        0 | 1 => "1",
        2..=4 => "2-4",
        5..=8 => "5-8",
        _ => ">8",
    }
}

const SIZE_CLASSES: [&str; 4] = ["1", "2-4", "5-8", ">8"];

/// How a job of the trace ended in the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobEnd {
    /// Succeeded.
    Completed,
    /// Failed for good (restart limit, a dependency that cannot be met).
    Failed,
    /// Still waiting or running when nothing more could happen.
    Unfinished,
}

/// One job's row of `--jobs-out`.
#[derive(Debug, Clone, Serialize)]
pub struct JobOutcome {
    /// Id in the trace.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// GPUs asked.
    pub gpus: u32,
    /// Submission, seconds since the first submission.
    pub submit_s: f64,
    /// Run time in the trace.
    pub duration_s: f64,
    /// The estimate the scheduler had at submission (seconds), if any.
    pub estimate_s: Option<f64>,
    /// First start, seconds since the first submission.
    pub first_start_s: Option<f64>,
    /// End, seconds since the first submission.
    pub end_s: Option<f64>,
    /// How it ended.
    pub end: JobEnd,
    /// Time holding resources over all attempts.
    pub held_s: f64,
    /// Time not running (end − submission − held; up to the simulation's end for unfinished jobs).
    pub wait_s: f64,
    /// Evictions it suffered.
    pub evictions: u32,
}

/// What a simulation measured.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    /// Policy.
    pub policy: String,
    /// Backfill on.
    pub backfill: bool,
    /// Preemption by shorter estimated jobs (preemptive SJF/SRTF) on.
    pub preemptive: bool,
    /// With `preemptive`: how much shorter a job must be to evict another ([`gpunet_core::PreemptionConfig::shorter_ratio`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shorter_ratio: Option<u32>,
    /// Defragmentation on (absent from JSON when off).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub defragment: bool,
    /// The setting as named, when it is not the policy alone: `auto` (SRGF with its knobs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// Where estimates came from (`oracle`, `noisy`, `history`).
    pub estimates: String,
    /// How learned estimates were ranked: `gittins` (their Gittins rank, under preemptive SRTF/SRGF) or `median`
    /// ([`gpunet_core::SchedConfig::learned_rule`]).
    pub learned_rank: String,
    /// The first stint of jobs with learned estimates, or (under SRTF and SRGF) none
    /// ([`gpunet_core::SchedConfig::probe`]), seconds; absent from JSON when off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_s: Option<f64>,
    /// Placement was idealised to counting GPUs ([`crate::SimConfig::gpu_counting`]); absent from JSON when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gpu_counting: bool,
    /// Jobs simulated.
    pub jobs: usize,
    /// Jobs that succeeded.
    pub completed: usize,
    /// Jobs that failed for good (restart limit).
    pub failed: usize,
    /// Jobs still waiting when nothing more could happen (e.g. larger than a quota or any node group).
    pub unfinished: usize,
    /// Of those, jobs no node of the cluster could ever hold (more GPUs than any node group has, or no node of
    /// their model), and the first of them with why: `gpunet sim` warns of them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub never_fit: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub never_fit_example: Option<String>,
    /// Mean job completion time (submit → finish) of completed jobs.
    pub avg_jct_s: f64,
    /// Median JCT.
    pub median_jct_s: f64,
    /// 95th percentile JCT.
    pub p95_jct_s: f64,
    /// 99th percentile JCT.
    pub p99_jct_s: f64,
    /// Mean total time not running (queueing, waits after evictions, restart backoffs).
    pub avg_wait_s: f64,
    /// Median time not running.
    pub median_wait_s: f64,
    /// 95th percentile time not running.
    pub p95_wait_s: f64,
    /// 99th percentile time not running.
    pub p99_wait_s: f64,
    /// Mean submission → first start.
    pub avg_first_start_s: f64,
    /// 99th percentile submission → first start.
    pub p99_first_start_s: f64,
    /// Alias of `avg_first_start_s` (the old name; it never counted waits after evictions), kept for one release.
    pub avg_queue_s: f64,
    /// Alias of `p99_first_start_s`, kept for one release.
    pub p99_queue_s: f64,
    /// Mean bounded slowdown: JCT ÷ max(trace duration, 10 s), at least 1.
    pub avg_bounded_slowdown: f64,
    /// Allocated GPU-time ÷ schedulable GPU-time between the first submission and the last completion.
    pub utilization: f64,
    /// Allocated GPU-time ÷ schedulable GPU-time between the first and the last submission (when every job is
    /// submitted at one instant, that span is empty: then as `utilization`).
    pub utilization_span: f64,
    /// Mean fragmentation over the samples taken while jobs waited.
    pub fragmentation: f64,
    /// First submission → last completion.
    pub makespan_s: f64,
    /// Jain's index over tenants of 1 ÷ mean bounded slowdown (1 = all tenants slowed down alike).
    pub jain_fairness: f64,
    /// Evictions.
    pub preemptions: usize,
    /// Restarts after the jobs' own failures.
    pub restarts: usize,
    /// Attempts ended by the loss of their node (requeued without a restart charge).
    pub node_losses: usize,
    /// GPU-hours of work lost to evictions and failures.
    pub lost_gpu_hours: f64,
    /// GPU-hours of work lost to evictions alone.
    pub eviction_lost_gpu_hours: f64,
    /// `eviction_lost_gpu_hours` ÷ `gpu_hours_used`.
    pub eviction_lost_fraction: f64,
    /// Currency of the costs (the cluster's price catalogue's).
    pub currency: String,
    /// Cost of what jobs held on on-demand and reserved nodes (GPUs, CPU, memory), billed per started second by the
    /// server's pricing function (`gpunet_core::pricing::cost`).
    pub cost_on_demand: f64,
    /// Cost of what jobs held on spot nodes.
    pub cost_spot: f64,
    /// Cost of GPUs, on every node.
    pub cost_gpu: f64,
    /// Cost of CPU.
    pub cost_cpu: f64,
    /// Cost of memory.
    pub cost_mem: f64,
    /// Total cost: on-demand + spot = GPU + CPU + memory.
    pub cost: f64,
    /// GPU-hours allocated to jobs (useful work plus work lost).
    pub gpu_hours_used: f64,
    /// Spot nodes added by the autoscaler.
    pub scaled_out_nodes: usize,
    /// Spot nodes released by the autoscaler.
    pub scaled_in_nodes: usize,
    /// Scheduling passes run.
    pub passes: usize,
    /// Passes run for the scheduling tick alone (no arrival, completion or other event at that instant).
    pub tick_passes: usize,
    /// Passes that decided no start, eviction or scaling (a reservation alone counts as nothing).
    pub idle_passes: usize,
    /// Passes for the tick alone that decided nothing: what a pass that knew how long its decisions hold would spare.
    pub idle_tick_passes: usize,
    /// Wall-clock time of those passes, milliseconds (part of `wall_ms`).
    pub idle_tick_pass_ms: f64,
    /// Passes for the tick alone not run: nothing but time had changed since a pass that decided nothing, and too
    /// little of it to turn anything that pass met (`gpunet_core::PassStats::idle_until`).
    pub skipped_passes: usize,
    /// Malformed trace rows skipped.
    pub skipped_rows: usize,
    /// Wall-clock time of the simulation, milliseconds.
    pub wall_ms: f64,
    /// Per tenant.
    pub per_tenant: Vec<TenantResult>,
    /// Per job-size class.
    pub by_size: Vec<SizeResult>,
    /// Time series (for reports; not in JSON output).
    #[serde(skip)]
    pub series: Vec<crate::engine::Sample>,
    /// Completed jobs' JCTs in seconds, sorted (for the CDF).
    #[serde(skip)]
    pub jcts: Vec<f64>,
    /// One row per job in submission order (for `--jobs-out`; not in JSON output).
    #[serde(skip)]
    pub job_rows: Vec<JobOutcome>,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The `p` quantile of sorted values (nearest rank).
fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v[(((v.len() - 1) as f64) * p).round() as usize]
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Latency figures of completed jobs, computed from the rows.
pub(crate) struct Latency {
    pub(crate) jcts: Vec<f64>,
    pub(crate) avg_jct_s: f64,
    pub(crate) waits: Vec<f64>,
    pub(crate) first_starts: Vec<f64>,
    pub(crate) avg_bounded_slowdown: f64,
    pub(crate) per_tenant: Vec<(usize, f64, f64, f64)>,
    pub(crate) by_size: Vec<SizeResult>,
}

/// Sums the completed rows into JCT, wait, first-start and slowdown figures, overall, per tenant (in `tenants`'
/// order) and per size class.
pub(crate) fn latency(rows: &[JobOutcome], tenants: &[String]) -> Latency {
    let index: std::collections::HashMap<&str, usize> =
        tenants.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut jcts = Vec::new();
    let mut waits = Vec::new();
    let mut first = Vec::new();
    let mut slow = Vec::new();
    let mut per = vec![(0usize, 0.0, 0.0, 0.0); tenants.len()];
    let mut sizes: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); SIZE_CLASSES.len()];
    for r in rows.iter().filter(|r| r.end == JobEnd::Completed) {
        let end = r.end_s.expect("a completed job has an end");
        let jct = end - r.submit_s;
        let bs = (jct / r.duration_s.max(10.0)).max(1.0);
        jcts.push(jct);
        waits.push(r.wait_s);
        first.push(r.first_start_s.unwrap_or(end) - r.submit_s);
        slow.push(bs);
        if let Some(&t) = index.get(r.tenant.as_str()) {
            let p = &mut per[t];
            p.0 += 1;
            p.1 += jct;
            p.2 += r.wait_s;
            p.3 += bs;
        }
        let c = SIZE_CLASSES.iter().position(|c| *c == size_class(r.gpus)).expect("a known class");
        sizes[c].0.push(jct);
        sizes[c].1.push(r.wait_s);
        sizes[c].2.push(bs);
    }
    let by_size = SIZE_CLASSES
        .iter()
        .zip(sizes)
        .map(|(class, (j, w, s))| SizeResult {
            class,
            jobs: j.len(),
            avg_jct_s: mean(&j),
            avg_wait_s: mean(&w),
            p99_wait_s: quantile(&sorted(w), 0.99),
            avg_bounded_slowdown: mean(&s),
        })
        .collect();
    Latency {
        avg_jct_s: mean(&jcts),
        jcts: sorted(jcts),
        waits: sorted(waits),
        first_starts: sorted(first),
        avg_bounded_slowdown: mean(&slow),
        per_tenant: per,
        by_size,
    }
}

impl Latency {
    /// Fills the latency fields of a result.
    pub(crate) fn fill(self, r: &mut SimResult, tenant_gpu_share: &[f64]) {
        r.avg_jct_s = self.avg_jct_s;
        r.median_jct_s = quantile(&self.jcts, 0.5);
        r.p95_jct_s = quantile(&self.jcts, 0.95);
        r.p99_jct_s = quantile(&self.jcts, 0.99);
        r.avg_wait_s = mean(&self.waits);
        r.median_wait_s = quantile(&self.waits, 0.5);
        r.p95_wait_s = quantile(&self.waits, 0.95);
        r.p99_wait_s = quantile(&self.waits, 0.99);
        r.avg_first_start_s = mean(&self.first_starts);
        r.p99_first_start_s = quantile(&self.first_starts, 0.99);
        r.avg_queue_s = r.avg_first_start_s;
        r.p99_queue_s = r.p99_first_start_s;
        r.avg_bounded_slowdown = self.avg_bounded_slowdown;
        let avg = |n: usize, s: f64| if n > 0 { s / n as f64 } else { 0.0 };
        r.per_tenant = r
            .per_tenant
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (n, jct, wait, bs) = self.per_tenant[i];
                TenantResult {
                    tenant: t.tenant.clone(),
                    jobs: n,
                    avg_jct_s: avg(n, jct),
                    avg_wait_s: avg(n, wait),
                    avg_bounded_slowdown: avg(n, bs),
                    gpu_share: tenant_gpu_share[i],
                }
            })
            .collect();
        let xs: Vec<f64> = r.per_tenant.iter().filter(|t| t.jobs > 0).map(|t| 1.0 / t.avg_bounded_slowdown).collect();
        r.jain_fairness = jain(&xs);
        r.by_size = self.by_size;
        r.jcts = self.jcts;
    }
}

/// Jain's fairness index of `xs` (1 when all are equal; 1 for no values).
pub fn jain(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 1.0;
    }
    let s: f64 = xs.iter().sum();
    let s2: f64 = xs.iter().map(|x| x * x).sum();
    if s2 == 0.0 {
        1.0
    } else {
        s * s / (xs.len() as f64 * s2)
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.3}"))
}

/// Writes one CSV row per job: `id,tenant,gpus,size_class,submit_s,duration_s,estimate_s,first_start_s,end_s,end,
/// held_s,wait_s,jct_s,evictions` (times in seconds since the first submission; empty cells where a job has none).
pub fn write_jobs_csv(path: &Path, rows: &[JobOutcome]) -> Result<(), SimError> {
    let f = std::fs::File::create(path).map_err(|e| SimError::io_write(path, e))?;
    let mut w = std::io::BufWriter::new(f);
    let mut out = |s: String| w.write_all(s.as_bytes()).map_err(|e| SimError::io_write(path, e));
    out("id,tenant,gpus,size_class,submit_s,duration_s,estimate_s,first_start_s,end_s,end,held_s,wait_s,jct_s,\
         evictions\n"
        .into())?;
    for r in rows {
        let jct = (r.end == JobEnd::Completed).then(|| r.end_s.unwrap_or(r.submit_s) - r.submit_s);
        let end = match r.end {
            JobEnd::Completed => "completed",
            JobEnd::Failed => "failed",
            JobEnd::Unfinished => "unfinished",
        };
        out(format!(
            "{},{},{},{},{:.3},{:.3},{},{},{},{end},{:.3},{:.3},{},{}\n",
            csv_field(&r.id),
            csv_field(&r.tenant),
            r.gpus,
            size_class(r.gpus),
            r.submit_s,
            r.duration_s,
            opt(r.estimate_s),
            opt(r.first_start_s),
            opt(r.end_s),
            r.held_s,
            r.wait_s,
            opt(jct),
            r.evictions
        ))?;
    }
    w.flush().map_err(|e| SimError::io_write(path, e))
}

/// Quotes a CSV field when it holds a separator, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tenant: &str, gpus: u32, submit: f64, end: f64, held: f64, dur: f64) -> JobOutcome {
        JobOutcome {
            id: format!("{tenant}-{submit}"),
            tenant: tenant.into(),
            gpus,
            submit_s: submit,
            duration_s: dur,
            estimate_s: None,
            first_start_s: Some(submit + 1.0),
            end_s: Some(end),
            end: JobEnd::Completed,
            held_s: held,
            wait_s: end - submit - held,
            evictions: 0,
        }
    }

    #[test]
    fn size_classes_cover_every_count() {
        assert_eq!([0, 1, 2, 4, 5, 8, 9, 64].map(size_class), ["1", "1", "2-4", "2-4", "5-8", "5-8", ">8", ">8"]);
    }

    #[test]
    fn breakdowns_by_tenant_and_size_average_their_own_jobs() {
        let rows = vec![
            row("a", 1, 0.0, 100.0, 50.0, 50.0),
            row("a", 8, 0.0, 300.0, 100.0, 100.0),
            row("b", 16, 10.0, 20.0, 10.0, 10.0),
            JobOutcome { end: JobEnd::Unfinished, end_s: None, ..row("b", 1, 0.0, 0.0, 0.0, 5.0) },
        ];
        let l = latency(&rows, &["a".into(), "b".into()]);
        assert_eq!(l.jcts, vec![10.0, 100.0, 300.0]);
        assert_eq!(l.waits, vec![0.0, 50.0, 200.0]);
        assert_eq!(l.per_tenant[0], (2, 400.0, 250.0, 2.0 + 3.0));
        assert_eq!(l.per_tenant[1], (1, 10.0, 0.0, 1.0));
        let by: Vec<(&str, usize, f64)> = l.by_size.iter().map(|s| (s.class, s.jobs, s.avg_wait_s)).collect();
        assert_eq!(by, vec![("1", 1, 50.0), ("2-4", 0, 0.0), ("5-8", 1, 200.0), (">8", 1, 0.0)]);
    }

    #[test]
    fn jain_is_one_for_equal_values_and_falls_with_spread() {
        assert_eq!(jain(&[0.5, 0.5, 0.5]), 1.0);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn jobs_csv_quotes_hostile_ids_and_leaves_missing_cells_empty() {
        let dir = std::env::temp_dir().join(format!("gpunet-jobs-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("jobs.csv");
        let mut r = row("a", 2, 0.0, 30.0, 20.0, 20.0);
        r.id = "x,\"y\"".into();
        let u =
            JobOutcome { end: JobEnd::Unfinished, end_s: None, first_start_s: None, ..row("a", 1, 0.0, 0.0, 0.0, 1.0) };
        write_jobs_csv(&p, &[r, u]).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].starts_with("\"x,\"\"y\"\"\",a,2,2-4,0.000,20.000,,1.000,30.000,completed,20.000,10.000,30.000,0")
        );
        assert!(lines[2].ends_with(",,,,unfinished,0.000,0.000,,0"), "{}", lines[2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
