//! Trace readers. Every format becomes a list of [`TraceJob`]s.
//!
//! | format | file | mapping |
//! |---|---|---|
//! | `gpunet` | `id,submit_s,duration_s,gpus,tenant` + optional `gpu_model,priority,est_duration_s,tasks,cpu_milli,memory_mib,preemptible,dependency` | as named (`dependency`: Slurm's `afterok:ID[:ID…],afterany:…,afternotok:…,singleton` over earlier rows' ids, the cell quoted when it has commas); other columns are an error |
//! | `philly` | `timestamp,duration,num_gpus,gpu_time,cluster` (Philly via Pollux) | submit = timestamp − earliest; VC (`cluster`) → tenant; no GPU model: durations hold on any model |
//! | `pai2023` | Alibaba PAI `openb_pod_list_*.csv` | submit = `creation_time`; duration = `deletion_time − scheduled_time`; `qos` → tenant; `gpu_spec` → allowed models; a fractional GPU (`gpu_milli` < 1000) takes one whole GPU (gpunet shares GPUs only through MIG); pods never scheduled (`Pending`, no `scheduled_time`) have no run time and are skipped and counted; pods still `Running` at the trace end are censored: their duration is the time observed, a lower bound, and they are flagged |
//! | `tiresias` | `job_id,num_gpu,submit_time,iterations,model_name,duration,interval` | one tenant `default`; durations measured on the testbed's P100s |
//! | `pollux` | Pollux and Sia workloads `name,time,application,num_replicas,batch_size` | duration = iterations to finish at that batch size × measured time per iteration with `num_replicas` GPUs, from the Pollux profiles (T4, `data/traces/pollux/profiles`); one tenant `default` |
//!
//! Files may be gzip-compressed (detected from the magic bytes). A malformed row is an error naming the file, line,
//! field and value, unless `skip_bad_rows` is set; then it is skipped and counted.

use crate::error::SimError;
use gpunet_core::GpuModel;
use serde::Serialize;
use std::fmt;
use std::io::{BufReader, Read};
use std::path::Path;
use std::str::FromStr;

/// One job of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceJob {
    /// Id in the trace.
    pub id: String,
    /// Submission, seconds from the trace start.
    pub submit_s: f64,
    /// Run time in seconds on `gpu_model` (or on any model when `None`).
    pub duration_s: f64,
    /// GPUs in total.
    pub gpus: u32,
    /// Tenant (team, virtual cluster, QoS class).
    pub tenant: String,
    /// The model the duration was measured on.
    pub gpu_model: Option<GpuModel>,
    /// Priority.
    pub priority: i32,
    /// An estimate given by the trace.
    pub est_duration_s: Option<f64>,
    /// Tasks (replicas); `None` lets the simulator split large jobs into node-sized tasks.
    pub tasks: Option<u32>,
    /// CPU per job in millicores.
    pub cpu_milli: Option<u64>,
    /// Memory per job in MiB.
    pub memory_mib: Option<u64>,
    /// May be preempted.
    pub preemptible: bool,
    /// Models the job may run on (empty: any).
    pub allowed_models: Vec<GpuModel>,
    /// The duration is a lower bound (the job was still running when the trace ended).
    pub censored: bool,
    /// Jobs it waits for, by trace id (gpunet format's `dependency` column, Slurm's syntax).
    pub dependency: Vec<(gpunet_core::DepKind, Vec<String>)>,
}

impl TraceJob {
    fn new(id: String, submit_s: f64, duration_s: f64, gpus: u32, tenant: String) -> TraceJob {
        TraceJob {
            id,
            submit_s,
            duration_s,
            gpus,
            tenant,
            gpu_model: None,
            priority: 0,
            est_duration_s: None,
            tasks: None,
            cpu_milli: None,
            memory_mib: None,
            preemptible: true,
            allowed_models: Vec::new(),
            censored: false,
            dependency: Vec::new(),
        }
    }
}

/// A trace format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// gpunet's own CSV.
    Gpunet,
    /// Microsoft Philly (Pollux's job-level form).
    Philly,
    /// Alibaba PAI 2023 pods.
    Pai2023,
    /// Tiresias job trace.
    Tiresias,
    /// Pollux / Sia evaluation workloads.
    Pollux,
}

impl FromStr for TraceFormat {
    type Err = SimError;
    fn from_str(s: &str) -> Result<TraceFormat, SimError> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "gpunet" => TraceFormat::Gpunet,
            "philly" => TraceFormat::Philly,
            "pai2023" | "pai" | "alibaba" => TraceFormat::Pai2023,
            "tiresias" => TraceFormat::Tiresias,
            "pollux" | "sia" => TraceFormat::Pollux,
            other => {
                return Err(SimError::invalid(
                    "--trace-format",
                    format!("unknown format {other:?}; allowed are gpunet, philly, pai2023, tiresias, pollux, sia"),
                ))
            }
        })
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceFormat::Gpunet => "gpunet",
            TraceFormat::Philly => "philly",
            TraceFormat::Pai2023 => "pai2023",
            TraceFormat::Tiresias => "tiresias",
            TraceFormat::Pollux => "pollux",
        })
    }
}

/// A parsed trace.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    /// Where it came from.
    pub source: String,
    /// Its format.
    pub format: TraceFormat,
    /// Jobs, in file order.
    pub jobs: Vec<TraceJob>,
    /// Malformed rows skipped (`--skip-bad-rows`).
    pub skipped_bad_rows: usize,
    /// Rows skipped because they describe no run (PAI pods never scheduled).
    pub skipped_never_ran: usize,
}

/// How to read a trace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Format, or detect from the header.
    pub format: Option<TraceFormat>,
    /// Skip and count malformed rows instead of failing.
    pub skip_bad_rows: bool,
}

/// The largest time a trace may give, in seconds (about 317 years).
pub const MAX_SECONDS: f64 = 1e10;

const GPUNET_REQUIRED: [&str; 5] = ["id", "submit_s", "duration_s", "gpus", "tenant"];
const GPUNET_OPTIONAL: [&str; 8] =
    ["gpu_model", "priority", "est_duration_s", "tasks", "cpu_milli", "memory_mib", "preemptible", "dependency"];

fn detect(header: &[String]) -> Option<TraceFormat> {
    let has = |c: &str| header.iter().any(|h| h == c);
    if GPUNET_REQUIRED.iter().all(|c| has(c)) {
        Some(TraceFormat::Gpunet)
    } else if ["timestamp", "duration", "num_gpus", "cluster"].iter().all(|c| has(c)) {
        Some(TraceFormat::Philly)
    } else if ["name", "num_gpu", "gpu_milli", "creation_time", "scheduled_time"].iter().all(|c| has(c)) {
        Some(TraceFormat::Pai2023)
    } else if ["job_id", "num_gpu", "submit_time", "duration"].iter().all(|c| has(c)) {
        Some(TraceFormat::Tiresias)
    } else if ["name", "time", "application", "num_replicas", "batch_size"].iter().all(|c| has(c)) {
        Some(TraceFormat::Pollux)
    } else {
        None
    }
}

/// Opens a file, decompressing gzip when it starts with the gzip magic bytes.
pub fn open_maybe_gz(path: &Path) -> Result<Box<dyn Read>, SimError> {
    let mut f = std::fs::File::open(path).map_err(|e| SimError::io(path, e))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(|e| SimError::io(path, e))?;
    let head = std::io::Cursor::new(magic[..n].to_vec());
    let chained = head.chain(f);
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(chained))))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, chained)))
    }
}

/// Reads a trace file.
pub fn read_trace(path: &Path, opts: ReadOptions) -> Result<Trace, SimError> {
    let reader = open_maybe_gz(path)?;
    read_trace_from(reader, &path.display().to_string(), opts)
}

struct Row<'a> {
    file: &'a str,
    line: u64,
    rec: &'a csv::StringRecord,
    cols: &'a [(String, usize)],
}

impl Row<'_> {
    fn raw(&self, col: &str) -> &str {
        self.cols.iter().find(|(c, _)| c == col).and_then(|(_, i)| self.rec.get(*i)).unwrap_or("").trim()
    }

    fn bad(&self, field: &str, value: &str, reason: &str) -> SimError {
        SimError::BadRow {
            file: self.file.to_string(),
            line: self.line,
            field: field.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }

    /// A time in seconds, at least `min` and at most [`MAX_SECONDS`] (a larger one saturated the replay's clock in
    /// milliseconds and the replay never ended).
    fn f64(&self, col: &str, min: f64) -> Result<f64, SimError> {
        let v = self.raw(col);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= min && x <= MAX_SECONDS => Ok(x),
            _ => Err(self.bad(col, v, &format!("a number from {min} to {MAX_SECONDS:.0} (seconds)"))),
        }
    }

    fn opt_f64(&self, col: &str, min: f64) -> Result<Option<f64>, SimError> {
        if self.raw(col).is_empty() {
            Ok(None)
        } else {
            self.f64(col, min).map(Some)
        }
    }

    fn u64(&self, col: &str, max: u64) -> Result<u64, SimError> {
        let v = self.raw(col);
        match v.parse::<u64>() {
            Ok(x) if x <= max => Ok(x),
            _ => Err(self.bad(col, v, &format!("a whole number from 0 to {max}"))),
        }
    }

    fn opt_u64(&self, col: &str, max: u64) -> Result<Option<u64>, SimError> {
        if self.raw(col).is_empty() {
            Ok(None)
        } else {
            self.u64(col, max).map(Some)
        }
    }

    fn text(&self, col: &str) -> Result<String, SimError> {
        let v = self.raw(col);
        if v.is_empty() {
            Err(self.bad(col, v, "a non-empty value"))
        } else {
            Ok(v.to_string())
        }
    }
}

/// Reads a trace from any reader; `name` is used in errors.
pub fn read_trace_from(reader: impl Read, name: &str, opts: ReadOptions) -> Result<Trace, SimError> {
    let mut rdr = csv::ReaderBuilder::new().has_headers(true).flexible(false).trim(csv::Trim::All).from_reader(reader);
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| SimError::Csv { file: name.into(), line: 1, reason: e.to_string() })?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    let format = match opts.format {
        Some(f) => f,
        None => {
            detect(&header).ok_or_else(|| SimError::UnknownFormat { file: name.into(), header: header.join(",") })?
        }
    };
    let required: &[&str] = match format {
        TraceFormat::Gpunet => &GPUNET_REQUIRED,
        TraceFormat::Philly => &["timestamp", "duration", "num_gpus", "cluster"],
        TraceFormat::Pai2023 => &[
            "name",
            "cpu_milli",
            "memory_mib",
            "num_gpu",
            "gpu_milli",
            "gpu_spec",
            "qos",
            "pod_phase",
            "creation_time",
            "deletion_time",
            "scheduled_time",
        ],
        TraceFormat::Tiresias => &["job_id", "num_gpu", "submit_time", "duration"],
        TraceFormat::Pollux => &["name", "time", "application", "num_replicas", "batch_size"],
    };
    for c in required {
        if !header.iter().any(|h| h == c) {
            return Err(SimError::MissingColumn {
                file: name.into(),
                column: c.to_string(),
                format: format.to_string(),
            });
        }
    }
    if format == TraceFormat::Gpunet {
        if let Some(c) =
            header.iter().find(|h| !GPUNET_REQUIRED.contains(&h.as_str()) && !GPUNET_OPTIONAL.contains(&h.as_str()))
        {
            return Err(SimError::UnknownColumn {
                file: name.into(),
                column: c.clone(),
                allowed: format!("{} (optional: {})", GPUNET_REQUIRED.join(","), GPUNET_OPTIONAL.join(",")),
            });
        }
    }
    let cols: Vec<(String, usize)> = header.iter().enumerate().map(|(i, h)| (h.clone(), i)).collect();
    let profiles = if format == TraceFormat::Pollux { Some(crate::pollux::Profiles::embedded()) } else { None };
    let mut trace = Trace { source: name.into(), format, jobs: Vec::new(), skipped_bad_rows: 0, skipped_never_ran: 0 };
    let mut philly_times: Vec<i64> = Vec::new();
    let mut rec = csv::StringRecord::new();
    let mut line = 1u64;
    let mut seen_ids: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    loop {
        match rdr.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let l = e.position().map_or(line + 1, |p| p.line());
                if opts.skip_bad_rows {
                    trace.skipped_bad_rows += 1;
                    line = l;
                    continue;
                }
                return Err(SimError::Csv { file: name.into(), line: l, reason: e.to_string() });
            }
        }
        line = rec.position().map_or(line + 1, |p| p.line());
        if rec.iter().all(|f| f.trim().is_empty()) {
            continue; // blank line (Philly's file ends with one)
        }
        let row = Row { file: name, line, rec: &rec, cols: &cols };
        let parsed = match format {
            TraceFormat::Gpunet => parse_gpunet(&row).and_then(|j| {
                check_ids(&j, &seen_ids).map_err(|reason| SimError::Csv { file: name.into(), line, reason })?;
                seen_ids.insert(j.id.clone(), line);
                Ok(Some(j))
            }),
            TraceFormat::Philly => parse_philly(&row).map(|(j, t)| {
                philly_times.push(t);
                Some(j)
            }),
            TraceFormat::Pai2023 => parse_pai(&row),
            TraceFormat::Tiresias => parse_tiresias(&row).map(Some),
            TraceFormat::Pollux => parse_pollux(&row, profiles.as_ref().expect("loaded for pollux")).map(Some),
        };
        match parsed {
            Ok(Some(j)) => trace.jobs.push(j),
            Ok(None) => trace.skipped_never_ran += 1,
            Err(e) if opts.skip_bad_rows => {
                let _ = e;
                trace.skipped_bad_rows += 1;
            }
            Err(e) => return Err(e),
        }
    }
    if format == TraceFormat::Philly {
        let t0 = philly_times.iter().copied().min().unwrap_or(0);
        for (j, t) in trace.jobs.iter_mut().zip(philly_times) {
            j.submit_s = (t - t0) as f64;
        }
    }
    Ok(trace)
}

/// A gpunet-format row's id against the earlier rows' (`seen`: id → line): ids name jobs for dependencies and in
/// `--jobs-out`, so two rows of one id could not be told apart (a dependency named the later one); and its
/// dependencies name earlier rows (a typo was found only in the replay, without its line).
fn check_ids(j: &TraceJob, seen: &std::collections::HashMap<String, u64>) -> Result<(), String> {
    if let Some(first) = seen.get(j.id.as_str()) {
        return Err(format!("duplicate id {:?} (first at line {first}): ids name one job each", j.id));
    }
    match j.dependency.iter().flat_map(|(_, ids)| ids).find(|d| !seen.contains_key(*d)) {
        Some(d) => Err(format!("dependency names {d:?}, the id of no earlier row")),
        None => Ok(()),
    }
}

fn parse_gpunet(r: &Row<'_>) -> Result<TraceJob, SimError> {
    let mut j = TraceJob::new(
        r.text("id")?,
        r.f64("submit_s", 0.0)?,
        r.f64("duration_s", 0.001)?,
        r.u64("gpus", 4096)? as u32,
        r.text("tenant")?,
    );
    let m = r.raw("gpu_model");
    if !m.is_empty() {
        j.gpu_model =
            Some(m.parse().map_err(|_| {
                r.bad("gpu_model", m, &format!("one of {}", GpuModel::ALL.map(|m| m.name()).join(", ")))
            })?);
    }
    let p = r.raw("priority");
    if !p.is_empty() {
        j.priority = p.parse().map_err(|_| r.bad("priority", p, "a whole number"))?;
    }
    j.est_duration_s = r.opt_f64("est_duration_s", 0.001)?;
    j.tasks = r.opt_u64("tasks", 4096)?.map(|t| t as u32);
    if j.tasks == Some(0) {
        return Err(r.bad("tasks", "0", "at least 1"));
    }
    j.cpu_milli = r.opt_u64("cpu_milli", u64::MAX / 2)?;
    j.memory_mib = r.opt_u64("memory_mib", u64::MAX / 2)?;
    let pr = r.raw("preemptible");
    j.preemptible = match pr.to_ascii_lowercase().as_str() {
        "" | "true" | "1" | "yes" => true,
        "false" | "0" | "no" => false,
        _ => return Err(r.bad("preemptible", pr, "true or false")),
    };
    let d = r.raw("dependency");
    if !d.is_empty() {
        j.dependency = parse_dependency(d).ok_or_else(|| {
            r.bad("dependency", d, "afterok:ID[:ID…], afterany:…, afternotok:… or singleton, comma-separated")
        })?;
    }
    if j.gpus == 0 && j.cpu_milli.unwrap_or(0) == 0 && j.memory_mib.unwrap_or(0) == 0 {
        return Err(r.bad("gpus", "0", "at least 1 GPU, or cpu_milli/memory_mib for a CPU-only job"));
    }
    Ok(j)
}

/// A trace's `dependency` cell: Slurm's syntax over the trace's own ids (`afterok:a:b,afterany:c,singleton`).
fn parse_dependency(text: &str) -> Option<Vec<(gpunet_core::DepKind, Vec<String>)>> {
    use gpunet_core::DepKind;
    let mut out = Vec::new();
    for item in text.split(',') {
        let mut parts = item.trim().split(':');
        let kind = match parts.next()? {
            "afterok" => DepKind::AfterOk,
            "afterany" => DepKind::AfterAny,
            "afternotok" => DepKind::AfterNotOk,
            "singleton" => DepKind::Singleton,
            _ => return None,
        };
        let ids: Vec<String> = parts.map(str::to_string).collect();
        if ids.iter().any(String::is_empty) || (kind == DepKind::Singleton) != ids.is_empty() {
            return None;
        }
        out.push((kind, ids));
    }
    Some(out)
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `YYYY-MM-DD HH:MM:SS` to seconds since the Unix epoch. Years are 0 to 9999: a larger one made the day
/// arithmetic overflow (found by the `trace` fuzz target), and a negative hour, minute or second is refused.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next()??);
    let ok = (0..=9999).contains(&y)
        && (1..=12).contains(&mo)
        && (1..=31).contains(&da)
        && (0..=23).contains(&h)
        && (0..=59).contains(&mi)
        && (0..=60).contains(&se);
    if !ok {
        return None;
    }
    Some(days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se)
}

fn parse_philly(r: &Row<'_>) -> Result<(TraceJob, i64), SimError> {
    let ts = r.raw("timestamp");
    let t = parse_timestamp(ts).ok_or_else(|| r.bad("timestamp", ts, "a time like 2017-10-09 07:01:55"))?;
    let g = r.u64("num_gpus", 4096)?;
    if g == 0 {
        return Err(r.bad("num_gpus", "0", "at least 1"));
    }
    let id = format!("philly-{}", r.line - 1);
    Ok((TraceJob::new(id, 0.0, r.f64("duration", 0.001)?, g as u32, r.text("cluster")?), t))
}

fn parse_pai(r: &Row<'_>) -> Result<Option<TraceJob>, SimError> {
    let sched = r.raw("scheduled_time");
    if sched.is_empty() {
        return Ok(None); // never scheduled: no run time
    }
    let created = r.f64("creation_time", 0.0)?;
    let started = r.f64("scheduled_time", 0.0)?;
    let deleted = r.f64("deletion_time", 0.0)?;
    if deleted < started {
        return Err(r.bad("deletion_time", r.raw("deletion_time"), "a time at or after scheduled_time"));
    }
    let num_gpu = r.u64("num_gpu", 64)? as u32;
    let milli = r.u64("gpu_milli", 1_000_000)?;
    let gpus = if num_gpu == 0 && milli > 0 { 1 } else { num_gpu };
    let mut j = TraceJob::new(r.text("name")?, created, (deleted - started).max(1.0), gpus, r.text("qos")?);
    j.cpu_milli = Some(r.u64("cpu_milli", u64::MAX / 2)?);
    j.memory_mib = Some(r.u64("memory_mib", u64::MAX / 2)?);
    let spec = r.raw("gpu_spec");
    if !spec.is_empty() {
        for m in spec.split('|') {
            j.allowed_models.push(m.parse().map_err(|_| r.bad("gpu_spec", spec, "GPU types like V100M16|V100M32"))?);
        }
    }
    j.censored = r.raw("pod_phase").eq_ignore_ascii_case("running");
    Ok(Some(j))
}

fn parse_tiresias(r: &Row<'_>) -> Result<TraceJob, SimError> {
    let g = r.u64("num_gpu", 4096)?;
    if g == 0 {
        return Err(r.bad("num_gpu", "0", "at least 1"));
    }
    let mut j = TraceJob::new(
        format!("tiresias-{}", r.text("job_id")?),
        r.f64("submit_time", 0.0)?,
        r.f64("duration", 0.001)?,
        g as u32,
        "default".into(),
    );
    j.gpu_model = Some(GpuModel::P100);
    Ok(j)
}

fn parse_pollux(r: &Row<'_>, p: &crate::pollux::Profiles) -> Result<TraceJob, SimError> {
    let app = r.text("application")?;
    let replicas = r.u64("num_replicas", 4096)? as u32;
    if replicas == 0 {
        return Err(r.bad("num_replicas", "0", "at least 1"));
    }
    let bsz = r.u64("batch_size", u64::MAX / 2)?;
    let dur = p.duration_s(&app, replicas, bsz).ok_or_else(|| {
        r.bad("application", &app, &format!("an application with a profile: {}", p.apps().join(", ")))
    })?;
    let mut j = TraceJob::new(r.text("name")?, r.f64("time", 0.0)?, dur, replicas, "default".into());
    j.gpu_model = Some(GpuModel::T4);
    Ok(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str, opts: ReadOptions) -> Result<Trace, SimError> {
        read_trace_from(s.as_bytes(), "t.csv", opts)
    }

    #[test]
    fn gpunet_csv_with_optional_columns() {
        let t = read(
            "id,submit_s,duration_s,gpus,tenant,gpu_model,priority,est_duration_s,tasks,preemptible\n\
             a,0,100,2,team-a,V100,3,90,2,false\nb,5.5,10,1,team-b,,,,,\n",
            ReadOptions::default(),
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Gpunet);
        assert_eq!(t.jobs.len(), 2);
        let a = &t.jobs[0];
        assert_eq!((a.gpus, a.priority, a.tasks, a.preemptible), (2, 3, Some(2), false));
        assert_eq!(a.gpu_model, Some(GpuModel::V100_16GB));
        assert_eq!(t.jobs[1].submit_s, 5.5);
    }

    #[test]
    fn bad_rows_name_file_line_field_and_value() {
        let e = read("id,submit_s,duration_s,gpus,tenant\na,0,100,2,t\nb,zero,1,1,t\n", ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "read t.csv:3: invalid submit_s \"zero\": a number from 0 to 10000000000 (seconds)");
        // A time past the bound saturated the replay's clock and the replay never ended (4-5 GB in 10 s).
        for row in ["a,0,1e17,8,t", "a,1e17,100,8,t", "a,0,1e10,1,t\nb,1e10,0.5,1,t\nc,0,10000000001,1,t"] {
            let e = read(&format!("id,submit_s,duration_s,gpus,tenant\n{row}\n"), ReadOptions::default()).unwrap_err();
            assert!(e.to_string().contains("a number from"), "{row}: {e}");
        }
        let t = read(
            "id,submit_s,duration_s,gpus,tenant\na,0,100,2,t\nb,zero,1,1,t\nc,1,-5,1,t\n",
            ReadOptions { skip_bad_rows: true, ..Default::default() },
        )
        .unwrap();
        assert_eq!((t.jobs.len(), t.skipped_bad_rows), (1, 2));
        let e = read("id,submit_s,duration_s,gpus,tenant,colour\n", ReadOptions::default()).unwrap_err().to_string();
        assert!(e.contains("unknown column \"colour\""), "{e}");
        let e = read("foo,bar\n1,2\n", ReadOptions::default()).unwrap_err().to_string();
        assert!(e.contains("--trace-format"), "{e}");
        let e = read("id,submit_s,duration_s,gpus,tenant\na,0,1,1,t,extra\n", ReadOptions::default()).unwrap_err();
        assert!(e.to_string().contains("t.csv:2"), "{e}");
        // One id, two rows: refused where the second is (a dependency named the later one); skipped, the first stays.
        let dup = "id,submit_s,duration_s,gpus,tenant\ng,0,10,1,t\nh,0,10,1,t\ng,5,10,1,t\n";
        let e = read(dup, ReadOptions::default()).unwrap_err().to_string();
        assert_eq!(e, "read t.csv:4: duplicate id \"g\" (first at line 2): ids name one job each");
        let t = read(dup, ReadOptions { skip_bad_rows: true, ..Default::default() }).unwrap();
        assert_eq!((t.jobs.len(), t.skipped_bad_rows, t.jobs[0].submit_s), (2, 1, 0.0));
        // A dependency on an id of no earlier row is refused at its row.
        let head = "id,submit_s,duration_s,gpus,tenant,dependency\n";
        let e = read(&format!("{head}a,0,10,1,t,\nb,0,10,1,t,afterok:a:c\nc,0,10,1,t,\n"), ReadOptions::default());
        assert_eq!(e.unwrap_err().to_string(), "read t.csv:3: dependency names \"c\", the id of no earlier row");
        let t = read(&format!("{head}a,0,10,1,t,\nb,0,10,1,t,afterok:a\n"), ReadOptions::default()).unwrap();
        assert_eq!(t.jobs[1].dependency.len(), 1);
    }

    #[test]
    fn timestamps_parse_to_unix_seconds() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_timestamp("2017-10-09 07:01:55"), Some(1_507_532_515));
        assert_eq!(parse_timestamp("2017-13-09 07:01:55"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn timestamps_with_huge_years_or_negative_times_are_refused_not_overflowed() {
        assert_eq!(parse_timestamp("9223372036854775807-01-01 00:00:00"), None);
        assert_eq!(parse_timestamp("-9223372036854775807-03-01 00:00:00"), None);
        assert_eq!(parse_timestamp("10000-01-01 00:00:00"), None);
        assert_eq!(parse_timestamp("2017-10-09 -1:00:00"), None);
        assert_eq!(parse_timestamp("2017-10-09 07:-5:55"), None);
        assert_eq!(parse_timestamp("9999-12-31 23:59:60"), Some(253_402_300_800));
        let e = read(
            "timestamp,duration,num_gpus,gpu_time,cluster\n99999999999999-01-01 00:00:00,66.0,1,66.0,vc\n",
            ReadOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("invalid timestamp"), "{e}");
    }

    #[test]
    fn philly_rows_become_relative_submissions_per_vc() {
        let t = read(
            "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\
             2017-10-09 06:13:03,2951.0,8,2951.0,6214e9\n\n",
            ReadOptions::default(),
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Philly);
        assert_eq!(t.jobs[0].submit_s, 2932.0);
        assert_eq!(t.jobs[1].submit_s, 0.0);
        assert_eq!((t.jobs[1].gpus, t.jobs[1].tenant.as_str()), (8, "6214e9"));
    }

    #[test]
    fn pai_pods_map_fractions_specs_and_censoring() {
        let t = read(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
             p0,12000,16384,1,460,V100M16|V100M32,LS,Running,0,1000,10\n\
             p1,1000,1024,0,0,,BE,Succeeded,5,50,6\n\
             p2,1000,1024,1,1000,,BE,Pending,5,50,\n",
            ReadOptions::default(),
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Pai2023);
        assert_eq!((t.jobs.len(), t.skipped_never_ran), (2, 1));
        let p0 = &t.jobs[0];
        assert_eq!((p0.gpus, p0.duration_s, p0.censored), (1, 990.0, true));
        assert_eq!(p0.allowed_models, vec![GpuModel::V100_16GB, GpuModel::V100_32GB]);
        assert_eq!((t.jobs[1].gpus, t.jobs[1].cpu_milli), (0, Some(1000)));
    }
}
