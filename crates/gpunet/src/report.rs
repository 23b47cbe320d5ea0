//! `gpunet report`: accounting per tenant and per user over a period (Slurm's `sreport`/`sacct` habit) — jobs
//! submitted, GPU-hours, the allocated GPUs' average utilisation where the agents sample it (NVML), cost (GPU, CPU
//! and memory apart), waits, failures, preemptions and restarts — as a table,
//! JSON or CSV; and `--statement`, a tenant's monthly statement as CSV (one line per job billed in the month, then
//! the total).
//!
//! Usage and cost come from the server's ledger (`GET /v1/usage`, which bills a row crossing the period's edge pro
//! rata); jobs, their states, waits, preemptions and restarts from `GET /v1/jobs` (every page). A tenant's token sees
//! only its own figures: both endpoints answer it with its own jobs and usage only.

use crate::client::{Client, Conn};
use anyhow::{bail, Context, Result};
use gpunet_api::types::{JobPage, JobView, UsageReport, UsageTotals};
use serde::Serialize;
use std::collections::BTreeMap;

/// The period a bill or a report covers: the last `--days`, a calendar `--month`, or any `--from`/`--to`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Period {
    /// Days back from now (or from --to).
    #[arg(long, default_value_t = 30)]
    days: u64,
    /// A calendar month (UTC), e.g. 2026-11, instead of --days.
    #[arg(long, conflicts_with_all = ["from", "to"])]
    month: Option<String>,
    /// Start of the period: a UTC date, e.g. 2026-11-03 (its 00:00).
    #[arg(long)]
    from: Option<String>,
    /// End of the period, not included: a UTC date, e.g. 2026-11-10 (its 00:00); now by default.
    #[arg(long)]
    to: Option<String>,
}

impl Period {
    /// The period in milliseconds since the epoch, `[from, to)`, with `now` for an open end.
    pub(crate) fn span(&self, now: u64) -> Result<(u64, u64)> {
        if let Some(m) = &self.month {
            return month_span(m);
        }
        let to = match &self.to {
            Some(d) => date_ms(d, "--to")?,
            None => now,
        };
        let from = match &self.from {
            Some(d) => date_ms(d, "--from")?,
            None => to.saturating_sub(self.days.saturating_mul(86_400_000)),
        };
        if from >= to {
            bail!(
                "invalid --from {:?}: the period must start before it ends ({})",
                self.from.as_deref().unwrap_or("-"),
                self.to.as_deref().unwrap_or("now")
            );
        }
        Ok((from, to))
    }
}

/// Milliseconds since the epoch of 00:00 UTC on `date` (`YYYY-MM-DD`, from 1970 on); `flag` names it in errors.
pub(crate) fn date_ms(date: &str, flag: &str) -> Result<u64> {
    let bad =
        || anyhow::anyhow!("invalid {flag} {date:?}: expected a UTC date YYYY-MM-DD, e.g. 2026-11-03, from 1970 on");
    let f: Vec<&str> = date.split('-').collect();
    let [y, m, d] = f[..] else { return Err(bad()) };
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return Err(bad());
    }
    let (y, m, d): (i64, u32, u32) =
        (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?, d.parse().map_err(|_| bad())?);
    let month = month_span(&format!("{y:04}-{m:02}")).map_err(|_| bad())?;
    let days_in_month = (month.1 - month.0) / 86_400_000;
    if d == 0 || u64::from(d) > days_in_month {
        return Err(bad());
    }
    Ok(days_from_civil(y, m, d) as u64 * 86_400_000)
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    period: Period,
    /// Only this tenant (a tenant's token sees only its own anyway).
    #[arg(long)]
    tenant: Option<String>,
    /// One row per tenant, or per user within a tenant (`tenant/user`: who submitted each job).
    #[arg(long, default_value = "tenant", value_parser = ["tenant", "user"])]
    by: String,
    /// Print the monthly statement of --tenant for --month as CSV: one line per job billed, then the total.
    #[arg(long, requires_all = ["tenant", "month"])]
    statement: bool,
    #[command(flatten)]
    conn: Conn,
}

/// One row of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ReportRow {
    /// The tenant, or `tenant/user`.
    pub(crate) key: String,
    /// Jobs submitted in the period (an array's elements each, not the array).
    pub(crate) jobs: u64,
    /// Of those, jobs that failed.
    pub(crate) failed: u64,
    /// Of those, jobs cancelled.
    pub(crate) cancelled: u64,
    /// Preemptions of those jobs.
    pub(crate) preemptions: u64,
    /// Restarts of those jobs after failures.
    pub(crate) restarts: u64,
    /// Time not running, in seconds, of those jobs (`wait_s`): queueing before the first start, every wait after an
    /// eviction, a restart or a node loss, up to the job's end — or, for one that has not ended, up to its current
    /// attempt's start or the period's end; as `gpunet sim`'s `avg_wait_s` and the server's
    /// `gpunet_job_not_running_duration_seconds` count it (docs/scheduler.md). 50th, 90th and 99th percentile
    /// (nearest rank), `None` without any.
    pub(crate) wait_p50_s: Option<f64>,
    pub(crate) wait_p90_s: Option<f64>,
    pub(crate) wait_p99_s: Option<f64>,
    /// Average utilisation (0 to 1) of the GPUs allocated, over the GPU-time the agents sampled (NVML, or fake GPUs'
    /// `--fake-gpu-samples`); `None` where no GPU held in the period sent samples.
    pub(crate) gpu_utilization: Option<f64>,
    /// Usage billed in the period (the ledger's; any job, including those submitted before it).
    #[serde(flatten)]
    pub(crate) usage: UsageTotals,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) currency: String,
    pub(crate) from_ms: u64,
    pub(crate) to_ms: u64,
    /// `tenant` or `user`.
    pub(crate) by: String,
    pub(crate) rows: Vec<ReportRow>,
}

/// Milliseconds since the epoch of 00:00 UTC on the first day of `month` (`YYYY-MM`), and of the next month.
pub(crate) fn month_span(month: &str) -> Result<(u64, u64)> {
    let bad = || anyhow::anyhow!("invalid --month {month:?}: expected YYYY-MM, e.g. 2026-11, from 1970 on");
    let (y, m) = month.split_once('-').ok_or_else(bad)?;
    if y.len() != 4 || m.len() != 2 {
        return Err(bad());
    }
    let y: i64 = y.parse().map_err(|_| bad())?;
    let m: u32 = m.parse().map_err(|_| bad())?;
    if !(1..=12).contains(&m) || y < 1970 {
        return Err(bad());
    }
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let ms = |y, m| days_from_civil(y, m, 1) as u64 * 86_400_000;
    Ok((ms(y, m), ms(ny, nm)))
}

/// Days since 1970-01-01 of a date in the proleptic Gregorian calendar (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The nearest-rank `p`-th percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// Who submitted a job, as the ledger's `by_user` keys name it (`-` when not recorded).
fn user_of(j: &JobView) -> &str {
    j.submitted_by.as_deref().filter(|u| !u.is_empty()).unwrap_or("-")
}

/// A job's time not running (seconds) from its view: its life so far (to its end, to its running attempt's start, or
/// to `until` while it waits) less what its ended attempts held (`held_ms`; from a server that does not send it,
/// what its attempts' records say).
fn wait_s(j: &JobView, until: u64) -> f64 {
    let to = match (j.finished_ms, j.state.as_str(), j.started_ms) {
        (Some(f), _, _) => f,
        (None, "running", Some(s)) => s,
        _ => until.max(j.submitted_ms),
    };
    let held = j.held_ms.max(gpunet_api::types::AttemptView::held_ms(&j.attempts));
    to.saturating_sub(j.submitted_ms).saturating_sub(held) as f64 / 1000.0
}

/// Builds the report from the ledger's usage and the jobs (pure: the CLI fetches, this computes).
pub(crate) fn build(usage: &UsageReport, jobs: &[JobView], by_user: bool) -> Report {
    let key = |j: &JobView| if by_user { format!("{}/{}", j.tenant, user_of(j)) } else { j.tenant.clone() };
    let mut rows: BTreeMap<String, (ReportRow, Vec<f64>)> = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.submitted_ms >= usage.from_ms && j.submitted_ms < usage.to_ms) {
        let k = key(j);
        let (r, waits) = rows.entry(k.clone()).or_insert_with(|| (ReportRow { key: k, ..Default::default() }, vec![]));
        // An array counts as its elements: those made into jobs are listed (and counted) themselves, so its own
        // entry counts only those never made (cancelled with the array, or yet to come).
        if let Some(a) = &j.array {
            let unmade = a.total.saturating_sub(a.expanded) as u64;
            r.jobs += unmade;
            if j.state == "cancelled" {
                r.cancelled += unmade;
            }
            // Those never made waited from the array's submission to its end, or to the period's end.
            let to = j.finished_ms.unwrap_or(usage.to_ms).max(j.submitted_ms);
            waits.extend(std::iter::repeat_n(to.saturating_sub(j.submitted_ms) as f64 / 1000.0, unmade as usize));
            continue;
        }
        r.jobs += 1;
        r.failed += u64::from(j.state == "failed");
        r.cancelled += u64::from(j.state == "cancelled");
        r.preemptions += u64::from(j.preemptions);
        r.restarts += u64::from(j.restarts);
        waits.push(wait_s(j, usage.to_ms));
    }
    let totals = if by_user { &usage.by_user } else { &usage.tenants };
    for (k, u) in totals {
        let (r, _) =
            rows.entry(k.clone()).or_insert_with(|| (ReportRow { key: k.clone(), ..Default::default() }, vec![]));
        r.usage += u;
    }
    let rows = rows
        .into_values()
        .map(|(mut r, mut w)| {
            w.sort_by(f64::total_cmp);
            r.wait_p50_s = percentile(&w, 50.0);
            r.wait_p90_s = percentile(&w, 90.0);
            r.wait_p99_s = percentile(&w, 99.0);
            r.gpu_utilization = r.usage.gpu_utilization();
            r
        })
        .collect();
    Report {
        currency: usage.currency.clone(),
        from_ms: usage.from_ms,
        to_ms: usage.to_ms,
        by: if by_user { "user" } else { "tenant" }.into(),
        rows,
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break; a leading `=`, `+`, `-` or `@` is prefixed
/// with `'` so that a spreadsheet does not run a job name as a formula.
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@']) && s != "-" { format!("'{s}") } else { s.to_string() };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.3}"))
}

/// The report as CSV (a header, then one line per row; amounts unrounded).
pub(crate) fn to_csv(r: &Report) -> String {
    let mut s = format!(
        "{},jobs,failed,cancelled,preemptions,restarts,wait_p50_s,wait_p90_s,wait_p99_s,gpu_hours,cpu_hours,\
         memory_gib_hours,gpu_cost,cpu_cost,mem_cost,cost,gpu_utilization,currency\n",
        r.by
    );
    for x in &r.rows {
        s += &format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            csv_field(&x.key),
            x.jobs,
            x.failed,
            x.cancelled,
            x.preemptions,
            x.restarts,
            opt(x.wait_p50_s),
            opt(x.wait_p90_s),
            opt(x.wait_p99_s),
            usage_csv(&x.usage),
            x.gpu_utilization.map_or(String::new(), |u| u.to_string()),
            csv_field(&r.currency)
        );
    }
    s
}

fn to_table(r: &Report) -> String {
    let cost = format!("COST ({})", if r.currency.is_empty() { "?" } else { &r.currency });
    crate::client::table(
        &[
            if r.by == "user" { "TENANT/USER" } else { "TENANT" },
            "JOBS",
            "FAILED",
            "CANCELLED",
            "PREEMPTED",
            "RESTARTS",
            "WAIT P50",
            "WAIT P90",
            "WAIT P99",
            "GPU-HOURS",
            "GPU UTIL",
            "GPU COST",
            "CPU COST",
            "MEM COST",
            &cost,
        ],
        r.rows
            .iter()
            .map(|x| {
                let w = |v: Option<f64>| v.map_or("-".into(), |s| format!("{s:.1}s"));
                vec![
                    x.key.clone(),
                    x.jobs.to_string(),
                    x.failed.to_string(),
                    x.cancelled.to_string(),
                    x.preemptions.to_string(),
                    x.restarts.to_string(),
                    w(x.wait_p50_s),
                    w(x.wait_p90_s),
                    w(x.wait_p99_s),
                    format!("{:.2}", x.usage.gpu_hours),
                    x.gpu_utilization.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
                    crate::money(x.usage.gpu_cost),
                    crate::money(x.usage.cpu_cost),
                    crate::money(x.usage.mem_cost),
                    crate::money(x.usage.cost),
                ]
            })
            .collect(),
    )
}

/// A tenant's statement for a month as CSV: one line per job billed in it (name, user and state from the job list),
/// then a `total` line.
pub(crate) fn statement(tenant: &str, month: &str, usage: &UsageReport, jobs: &[JobView]) -> String {
    let by_id: BTreeMap<u64, &JobView> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut s = String::from(
        "tenant,month,job,name,user,state,gpu_hours,cpu_hours,memory_gib_hours,gpu_cost,cpu_cost,mem_cost,cost,currency\n",
    );
    let mut total = UsageTotals::default();
    let cur = csv_field(&usage.currency);
    for (id, u) in &usage.jobs {
        let j = by_id.get(id);
        s += &format!(
            "{},{month},{id},{},{},{},{},{cur}\n",
            csv_field(tenant),
            csv_field(j.map_or("", |j| j.name.as_str())),
            csv_field(j.map_or("-", |j| user_of(j))),
            j.map_or("", |j| j.state.as_str()),
            usage_csv(u),
        );
        total += u;
    }
    s += &format!("{},{month},total,,,,{},{cur}\n", csv_field(tenant), usage_csv(&total));
    s
}

/// Every job `c` may see (of `tenant`, when given), page by page.
async fn all_jobs(c: &Client, tenant: Option<&str>) -> Result<Vec<JobView>> {
    let mut out = Vec::new();
    let mut after = 0u64;
    loop {
        let mut q = format!("/v1/jobs?limit=1000&after={after}");
        if let Some(t) = tenant {
            q += &format!("&tenant={t}");
        }
        let page: JobPage = c.get(&q).await?;
        out.extend(page.jobs);
        match page.next {
            Some(n) if n > after => after = n,
            _ => return Ok(out),
        }
    }
}

pub(crate) async fn run(a: ReportArgs) -> Result<()> {
    let output = a.conn.output.clone();
    if !matches!(output.as_str(), "table" | "json" | "csv") {
        bail!("invalid --output {output:?}: allowed are table, json and csv");
    }
    let mut conn = a.conn.clone();
    conn.output = "table".into();
    let c = Client::new(&conn)?;
    let (from, to) = a.period.span(gpunet_server::now_ms())?;
    if let Some(t) = &a.tenant {
        if t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            bail!("invalid --tenant {t:?}: a tenant name (letters, digits, '-', '_' or '.')");
        }
    }
    let mut q = format!("?from_ms={from}&to_ms={to}");
    if let Some(t) = &a.tenant {
        q += &format!("&tenant={t}");
    }
    let usage: UsageReport = c.get(&format!("/v1/usage{q}")).await.context("read usage")?;
    let jobs = all_jobs(&c, a.tenant.as_deref()).await.context("read jobs")?;
    if a.statement {
        let (t, m) = (a.tenant.as_deref().unwrap_or_default(), a.period.month.as_deref().unwrap_or_default());
        crate::cli::output::out(&statement(t, m, &usage, &jobs));
        return Ok(());
    }
    let r = build(&usage, &jobs, a.by == "user");
    match output.as_str() {
        "json" => crate::cli::output::out(&(serde_json::to_string_pretty(&r)? + "\n")),
        "csv" => crate::cli::output::out(&to_csv(&r)),
        _ => crate::cli::output::out(&to_table(&r)),
    }
    Ok(())
}

/// The seven usage figures as CSV fields: GPU-, CPU- and memory-hours, GPU, CPU and memory cost, total cost.
fn usage_csv(u: &UsageTotals) -> String {
    format!(
        "{},{},{},{},{},{},{}",
        u.gpu_hours, u.cpu_hours, u.memory_gib_hours, u.gpu_cost, u.cpu_cost, u.mem_cost, u.cost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_span_their_days_in_utc() {
        // 2026-11-01T00:00:00Z and 2026-12-01T00:00:00Z.
        assert_eq!(month_span("2026-11").unwrap(), (1_793_491_200_000, 1_796_083_200_000));
        assert_eq!(month_span("2024-12").unwrap().1, 1_735_689_600_000); // 2025-01-01
        assert_eq!(month_span("2024-02").unwrap().1 - month_span("2024-02").unwrap().0, 29 * 86_400_000);
        for bad in ["2026-13", "2026-1", "26-11", "1969-12", "2026/11", ""] {
            assert!(month_span(bad).unwrap_err().to_string().contains("--month"), "{bad}");
        }
    }

    #[test]
    fn periods_are_days_back_a_month_or_dates() {
        let p = |days, month: Option<&str>, from: Option<&str>, to: Option<&str>| Period {
            days,
            month: month.map(String::from),
            from: from.map(String::from),
            to: to.map(String::from),
        };
        let now = 1_796_083_200_000 + 3_600_000; // 2026-12-01T01:00Z
        assert_eq!(p(1, None, None, None).span(now).unwrap(), (now - 86_400_000, now));
        assert_eq!(p(30, Some("2026-11"), None, None).span(now).unwrap(), (1_793_491_200_000, 1_796_083_200_000));
        assert_eq!(
            p(30, None, Some("2026-11-01"), Some("2026-12-01")).span(now).unwrap(),
            (1_793_491_200_000, 1_796_083_200_000)
        );
        assert_eq!(p(30, None, Some("2026-11-30"), None).span(now).unwrap(), (1_796_083_200_000 - 86_400_000, now));
        assert_eq!(p(2, None, None, Some("2026-12-01")).span(now).unwrap().0, 1_796_083_200_000 - 2 * 86_400_000);
        assert!(p(30, None, Some("2026-12-02"), Some("2026-12-01"))
            .span(now)
            .unwrap_err()
            .to_string()
            .contains("--from"));
        for bad in ["2026-02-30", "2026-13-01", "2026-1-01", "26-11-01", "2026/11/01", "1969-12-31", "2026-11-00", ""] {
            assert!(date_ms(bad, "--from").unwrap_err().to_string().contains("--from"), "{bad}");
        }
        assert_eq!(date_ms("2024-02-29", "--from").unwrap(), 1_709_164_800_000);
    }

    /// A job view as the API gives it, with `extra` fields set.
    fn view(id: u64, state: &str, extra: serde_json::Value) -> JobView {
        let mut v = serde_json::json!({
            "id": id, "name": "j", "tenant": "t", "state": state, "priority": 0, "tasks": 1, "gpus": 1,
            "submitted_ms": 1_000, "restarts": 0, "preemptions": 0, "spec": {"name": "j"},
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    /// An array of 5 counts as 5 jobs: its 3 elements made into jobs (one failed), and the 2 never made (cancelled
    /// with the array); not as its parent plus its elements.
    #[test]
    fn an_array_counts_as_its_elements() {
        let progress =
            serde_json::json!({"total": 5, "expanded": 3, "live": 0, "succeeded": 2, "failed": 1, "cancelled": 2});
        let jobs = vec![
            view(1, "cancelled", serde_json::json!({"array": progress})),
            view(2, "succeeded", serde_json::json!({"array_job_id": 1, "array_index": 0})),
            view(3, "succeeded", serde_json::json!({"array_job_id": 1, "array_index": 1})),
            view(4, "failed", serde_json::json!({"array_job_id": 1, "array_index": 2})),
            view(5, "succeeded", serde_json::json!({})),
        ];
        let usage: UsageReport = serde_json::from_value(serde_json::json!({
            "currency": "USD", "from_ms": 0, "to_ms": 10_000, "tenants": {}, "by_user": {}, "jobs": {}
        }))
        .unwrap();
        let r = build(&usage, &jobs, false);
        let row = &r.rows[0];
        assert_eq!((row.jobs, row.failed, row.cancelled), (6, 1, 2), "{row:?}");
    }

    /// Waits count all time not running, of every job: a job evicted after its first start waited again (it was
    /// left out, as were jobs not started yet), one still waiting has waited to the period's end, one running
    /// waited up to its attempt's start.
    #[test]
    fn waits_count_every_job_and_all_its_time_not_running() {
        let jobs = vec![
            // Waited 1 s, held 7 s, then waited 2 s more after an eviction: 3 s (it was left out).
            view(
                1,
                "succeeded",
                serde_json::json!({"started_ms": 9_000, "finished_ms": 11_000, "held_ms": 7_000, "preemptions": 1}),
            ),
            // Started at once and ran to its end: 0 s.
            view(2, "succeeded", serde_json::json!({"started_ms": 1_000, "finished_ms": 3_000, "held_ms": 2_000})),
            // Never started, still waiting at the period's end (10 s): 9 s.
            view(3, "pending", serde_json::json!({})),
            // Running its second attempt since 8 s, the first held 3 s: 4 s.
            view(4, "running", serde_json::json!({"started_ms": 8_000, "held_ms": 3_000, "restarts": 1})),
        ];
        let usage: UsageReport = serde_json::from_value(serde_json::json!({
            "currency": "USD", "from_ms": 0, "to_ms": 10_000, "tenants": {}, "by_user": {}, "jobs": {}
        }))
        .unwrap();
        let waits: Vec<f64> = jobs.iter().map(|j| wait_s(j, usage.to_ms)).collect();
        assert_eq!(waits, [3.0, 0.0, 9.0, 4.0]);
        let row = &build(&usage, &jobs, false).rows[0];
        assert_eq!((row.wait_p50_s, row.wait_p90_s, row.wait_p99_s), (Some(3.0), Some(9.0), Some(9.0)), "{row:?}");
        // An older server sends no `held_ms`: the attempts' records say what was held.
        let old = view(
            5,
            "succeeded",
            serde_json::json!({"finished_ms": 11_000, "attempts": [
            {"attempt": 0, "placement": [], "started_ms": 2_000, "ended_ms": 4_000},
            {"attempt": 1, "placement": [], "started_ms": 6_000, "ended_ms": 11_000}]}),
        );
        assert_eq!(wait_s(&old, 10_000), 3.0);
        // An array of 4 with 2 elements never made, still waiting at the period's end: 9 s each.
        let progress =
            serde_json::json!({"total": 4, "expanded": 2, "live": 0, "succeeded": 0, "failed": 0, "cancelled": 0});
        let mut with_array = jobs.clone();
        with_array.push(view(6, "pending", serde_json::json!({"array": progress})));
        let row = &build(&usage, &with_array, false).rows[0];
        assert_eq!((row.jobs, row.wait_p50_s, row.wait_p90_s), (6, Some(4.0), Some(9.0)), "{row:?}");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 99.0), Some(10.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn csv_fields_are_quoted_and_formulas_defused() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(csv_field("-"), "-");
    }
}
