//! `--report DIR`: `report.md` with the summary, per-tenant table and SVG charts (utilisation and queue length over
//! time, JCT CDF). The SVGs are written by hand: no plotting dependency, no network.

use crate::error::SimError;
use crate::metrics::SimResult;
use std::fmt::Write as _;
use std::path::Path;

fn svg_line(title: &str, x_label: &str, y_label: &str, pts: &[(f64, f64)], y_max: Option<f64>) -> String {
    let (w, h, l, r, t, b) = (720.0, 320.0, 70.0, 20.0, 36.0, 46.0);
    let xmax = pts.iter().map(|p| p.0).fold(0.0f64, f64::max).max(1e-9);
    let ymax = y_max.unwrap_or_else(|| pts.iter().map(|p| p.1).fold(0.0f64, f64::max)).max(1e-9);
    let sx = |x: f64| l + (w - l - r) * x / xmax;
    let sy = |y: f64| h - b - (h - t - b) * y / ymax;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{title}</text>
<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="#333"/><line x1="{l}" y1="{t}" x2="{l}" y2="{}" stroke="#333"/>
"##,
        w / 2.0,
        h - b,
        w - r,
        h - b,
        h - b
    );
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            sy(y),
            w - r,
            l - 6.0,
            sy(y) + 4.0,
            fmt_num(y)
        );
        let x = xmax * i as f64 / 4.0;
        let _ =
            writeln!(s, r##"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##, sx(x), h - b + 16.0, fmt_num(x));
    }
    let _ = writeln!(s, r##"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"##, (l + w - r) / 2.0, h - 8.0);
    let _ = writeln!(
        s,
        r##"<text x="16" y="{0}" text-anchor="middle" transform="rotate(-90 16 {0})">{y_label}</text>"##,
        (t + h - b) / 2.0
    );
    let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(y.min(ymax)))).collect();
    let _ = writeln!(s, r##"<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{}"/>"##, path.join(" "));
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A figure averaged over the completed jobs (JCT, waits, slowdown, Jain's index), or "n/a" when none completed (a
/// slowdown of 0.00, below the metric's floor of 1, was printed): for the table and the report.
pub fn over_completed(r: &SimResult, figure: String) -> String {
    if r.completed == 0 {
        "n/a".into()
    } else {
        figure
    }
}

/// A tenant's or size class's average over its `jobs` completed jobs with `digits` decimals, or "-" without any.
pub fn row_avg(jobs: usize, v: f64, digits: usize) -> String {
    if jobs == 0 {
        "-".into()
    } else {
        format!("{v:.digits$}")
    }
}

/// Writes `report.md`, `utilization.svg`, `queue.svg` and `jct_cdf.svg` into `dir`; `title` names the run.
pub fn write_report(dir: &Path, title: &str, r: &SimResult) -> Result<(), SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::io_write(dir, e))?;
    let hours: Vec<f64> = r.series.iter().map(|s| s.t_s / 3600.0).collect();
    let util: Vec<(f64, f64)> = hours.iter().zip(&r.series).map(|(h, s)| (*h, s.utilization)).collect();
    let queue: Vec<(f64, f64)> = hours.iter().zip(&r.series).map(|(h, s)| (*h, s.queued as f64)).collect();
    let n = r.jcts.len().max(1) as f64;
    let step = (r.jcts.len() / 500).max(1);
    let mut cdf: Vec<(f64, f64)> =
        r.jcts.iter().enumerate().step_by(step).map(|(i, j)| (j / 3600.0, (i + 1) as f64 / n)).collect();
    if let Some(last) = r.jcts.last() {
        cdf.push((last / 3600.0, 1.0));
    }
    let files = [
        ("utilization.svg", svg_line("GPU utilisation", "hours", "allocated / capacity", &util, Some(1.0))),
        ("queue.svg", svg_line("Queued jobs", "hours", "jobs", &queue, None)),
        ("jct_cdf.svg", svg_line("JCT CDF", "JCT (hours)", "fraction of jobs", &cdf, Some(1.0))),
    ];
    for (name, body) in &files {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(|e| SimError::io_write(&p, e))?;
    }
    let mut md = String::new();
    let _ = writeln!(md, "# gpunet simulation: {title}\n");
    let _ = writeln!(md, "| metric | value |\n|---|---|");
    let done = |figure: String| over_completed(r, figure);
    let rows: [(&str, String); 22] = [
        (
            "policy",
            format!(
                "{}{}{}",
                r.policy,
                if r.preemptive { " (preemptive)" } else { "" },
                if r.backfill { " + backfill" } else { "" }
            ),
        ),
        (
            "jobs (completed / failed / unfinished)",
            format!("{} ({} / {} / {})", r.jobs, r.completed, r.failed, r.unfinished),
        ),
        ("average JCT", done(format!("{:.0} s", r.avg_jct_s))),
        ("median JCT", done(format!("{:.0} s", r.median_jct_s))),
        ("p95 JCT", done(format!("{:.0} s", r.p95_jct_s))),
        ("p99 JCT", done(format!("{:.0} s", r.p99_jct_s))),
        ("average wait (all time not running)", done(format!("{:.0} s", r.avg_wait_s))),
        ("p99 wait", done(format!("{:.0} s", r.p99_wait_s))),
        ("average time to first start", done(format!("{:.0} s", r.avg_first_start_s))),
        ("p99 time to first start", done(format!("{:.0} s", r.p99_first_start_s))),
        ("average bounded slowdown", done(format!("{:.2}", r.avg_bounded_slowdown))),
        ("makespan", format!("{:.0} s", r.makespan_s)),
        ("GPU utilisation", format!("{:.1}%", r.utilization * 100.0)),
        ("fragmentation while jobs wait", format!("{:.1}%", r.fragmentation * 100.0)),
        ("Jain's fairness (tenants)", done(format!("{:.3}", r.jain_fairness))),
        ("preemptions / restarts", format!("{} / {}", r.preemptions, r.restarts)),
        ("lost GPU-hours", format!("{:.1}", r.lost_gpu_hours)),
        (
            "GPU-hours lost to evictions",
            format!("{:.1} ({:.2}% of GPU-hours used)", r.eviction_lost_gpu_hours, r.eviction_lost_fraction * 100.0),
        ),
        ("GPU utilisation over the trace's span", format!("{:.1}%", r.utilization_span * 100.0)),
        (
            "cost (on-demand + spot)",
            format!("{:.2} + {:.2} = {:.2} {}", r.cost_on_demand, r.cost_spot, r.cost, r.currency),
        ),
        (
            "cost (GPU + CPU + memory)",
            format!("{:.2} + {:.2} + {:.2} = {:.2} {}", r.cost_gpu, r.cost_cpu, r.cost_mem, r.cost, r.currency),
        ),
        ("simulation wall time", format!("{:.0} ms", r.wall_ms)),
    ];
    for (k, v) in rows {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let _ = writeln!(md, "\n![utilisation](utilization.svg)\n\n![queue](queue.svg)\n\n![JCT CDF](jct_cdf.svg)\n");
    let _ = writeln!(
        md,
        "## Tenants\n\n| tenant | jobs | avg JCT (s) | avg wait (s) | avg slowdown | GPU share |\n|---|---:|---:|---:|---:|---:|"
    );
    for t in &r.per_tenant {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.1}% |",
            t.tenant,
            t.jobs,
            row_avg(t.jobs, t.avg_jct_s, 0),
            row_avg(t.jobs, t.avg_wait_s, 0),
            row_avg(t.jobs, t.avg_bounded_slowdown, 2),
            t.gpu_share * 100.0
        );
    }
    let _ = writeln!(
        md,
        "\n## Job sizes\n\n| GPUs | jobs | avg JCT (s) | avg wait (s) | p99 wait (s) | avg slowdown |\n|---|---:|---:|---:|---:|---:|"
    );
    for c in &r.by_size {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            c.class,
            c.jobs,
            row_avg(c.jobs, c.avg_jct_s, 0),
            row_avg(c.jobs, c.avg_wait_s, 0),
            row_avg(c.jobs, c.p99_wait_s, 0),
            row_avg(c.jobs, c.avg_bounded_slowdown, 2)
        );
    }
    let p = dir.join("report.md");
    std::fs::write(&p, md).map_err(|e| SimError::io_write(&p, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_a_polyline_with_every_point() {
        let s = svg_line("t", "x", "y", &[(0.0, 0.0), (1.0, 0.5), (2.0, 1.0)], Some(1.0));
        assert!(s.starts_with("<svg"));
        let pts = s.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(pts.split(' ').count(), 3);
        assert!(s.trim_end().ends_with("</svg>"));
    }
}
