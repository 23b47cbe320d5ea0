//! `gpunet submit | jobs | show | cancel | why | wait | logs`: a job's life from the command line.

use super::output::{ago, emit, local, out, out_bytes, when};
use crate::client::{self, Client, Conn};
use anyhow::{bail, Context, Result};
use gpunet_api::spec::JobSubmission;
use gpunet_api::types::*;
use gpunet_api::units::format_duration_ms;
use std::path::PathBuf;

/// The states a job ends in.
pub(crate) const ENDED: [&str; 3] = ["succeeded", "failed", "cancelled"];

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SubmitArgs {
    /// A spec file (YAML or JSON; gpunet's or a Kubernetes batch/v1 Job); `-` reads standard input. Flags given
    /// with it override its fields (a gpunet spec; a Kubernetes Job takes none).
    #[arg(short = 'f', long)]
    pub(crate) file: Option<PathBuf>,
    /// Job name (default: the command's name).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// GPUs per task (default 1).
    #[arg(long)]
    pub(crate) gpus: Option<u32>,
    /// Tasks, a gang: they start together or not at all (default 1).
    #[arg(long)]
    pub(crate) tasks: Option<u32>,
    /// CPU per task: cores (`8`, `1.5`) or millicores (`500m`). Default: one core per GPU.
    #[arg(long)]
    pub(crate) cpu: Option<String>,
    /// Memory per task: `64Gi`, `512Mi`. Default: 4 GiB per GPU.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// Allowed GPU models, repeatable or comma-separated: `--gpu-model A100-80GB,H100-80GB`. Default: any.
    #[arg(long = "gpu-model", value_delimiter = ',')]
    pub(crate) gpu_models: Vec<String>,
    /// Node labels that must match, repeatable or comma-separated: `--selector zone=a,lifecycle=on-demand`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) selector: Vec<String>,
    /// Environment variables of every task, repeatable: `--env EPOCHS=90 --env LR=0.1`. Tasks start from an empty
    /// environment plus gpunet's own variables (`GPUNET_*`, `CUDA_VISIBLE_DEVICES`, `RANK`, …).
    #[arg(long)]
    pub(crate) env: Vec<String>,
    /// Working directory of every task: a relative path, made beneath the task's own directory on its node. Default:
    /// that directory itself (the task's `HOME`, `DATA_DIR/homes/job-ID/rank-R` under the agent's data directory).
    #[arg(long)]
    pub(crate) workdir: Option<String>,
    /// Run every task in this OCI image: a registry reference (`nvcr.io/nvidia/pytorch:22.07-py3`),
    /// `containers-storage:REF` (the node's local store), or beneath the node's image directory `dir:NAME` (an unpacked
    /// root filesystem), `oci:NAME[:TAG]` (an OCI layout), `oci-archive:NAME[:TAG]`. Without a command the image's
    /// own runs. Such jobs go only to nodes that run containers (label gpunet.io/containers=true).
    #[arg(long)]
    pub(crate) image: Option<String>,
    /// The container's /dev/shm size (with --image), e.g. 8Gi; default 64Mi.
    #[arg(long)]
    pub(crate) shm_size: Option<String>,
    /// The container's network (with --image): host (the default; NCCL across nodes needs it) or none.
    #[arg(long)]
    pub(crate) network: Option<String>,
    /// Tenant (admin tokens only; a tenant token submits to its own).
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// Priority (default 0).
    #[arg(long)]
    pub(crate) priority: Option<i32>,
    /// Estimated run time, e.g. 2h: what the scheduler plans with (backfill, ETAs). Never enforced; see --time.
    #[arg(long)]
    pub(crate) estimate: Option<String>,
    /// Run-time limit of each attempt, e.g. 4h: past it the tasks get SIGTERM, then SIGKILL 10 s later, and the
    /// attempt fails (`time_limit`), restarting under --max-restarts.
    #[arg(long)]
    pub(crate) time: Option<String>,
    /// Restarts after a failure before the job is failed (default 3; 0: never restart).
    #[arg(long)]
    pub(crate) max_restarts: Option<u32>,
    /// Keep a job that no registered node could ever hold (it waits for such a node); without it such a job is
    /// refused, saying why.
    #[arg(long)]
    pub(crate) hold_never_fits: bool,
    /// Submit held (Slurm's `--hold`): it waits, unscheduled, until `gpunet release ID`.
    #[arg(long)]
    pub(crate) hold: bool,
    /// A job array: indices `0-99`, `0-99:2` (a step) or `1,3,7`, and `%8` to run at most 8 at once. Each element
    /// is a job of its own (`ID[INDEX]`, e.g. `job-12[3]`) whose tasks get `GPUNET_ARRAY_INDEX` and
    /// `GPUNET_ARRAY_JOB_ID`; `show`/`cancel` take the array's id for the whole array.
    #[arg(long)]
    pub(crate) array: Option<String>,
    /// Start only after other jobs: `afterok:ID[:ID…]` (they succeeded), `afterany:…` (they ended),
    /// `afternotok:…` (they failed or were cancelled), `singleton` (no earlier job of this name runs), comma-separated.
    /// IDs may be arrays or elements (`12[3]`). A dependency that can never be satisfied fails the job, saying why.
    #[arg(long)]
    pub(crate) dependency: Option<String>,
    /// Ask where and when it would start, without queuing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Whether the job may run on spot nodes: never, allowed or preferred (default: its tenant's, else never).
    #[arg(long, value_parser = |s: &str| s.parse::<gpunet_api::spec::SpotUse>())]
    pub(crate) spot: Option<gpunet_api::spec::SpotUse>,
    #[command(flatten)]
    pub(crate) conn: Conn,
    /// Command and arguments.
    #[arg(last = true)]
    pub(crate) command: Vec<String>,
}

impl SubmitArgs {
    /// Whether a flag that sets a spec field was given (beyond the file).
    fn overrides(&self) -> bool {
        self.name.is_some()
            || self.gpus.is_some()
            || self.tasks.is_some()
            || self.cpu.is_some()
            || self.memory.is_some()
            || !self.gpu_models.is_empty()
            || !self.selector.is_empty()
            || !self.env.is_empty()
            || self.workdir.is_some()
            || self.image.is_some()
            || self.spot.is_some()
            || self.shm_size.is_some()
            || self.network.is_some()
            || self.priority.is_some()
            || self.estimate.is_some()
            || self.time.is_some()
            || self.max_restarts.is_some()
            || self.hold_never_fits
            || self.hold
            || self.array.is_some()
            || self.dependency.is_some()
            || !self.command.is_empty()
    }

    /// The flags written onto `s`.
    fn apply(&self, s: &mut JobSubmission) -> Result<()> {
        let pair = |flag: &str, kv: &str| -> Result<(String, String)> {
            let (k, v) = kv.split_once('=').with_context(|| format!("invalid {flag} {kv:?}: allowed is KEY=VALUE"))?;
            if k.is_empty() {
                bail!("invalid {flag} {kv:?}: allowed is KEY=VALUE with a non-empty KEY");
            }
            Ok((k.to_string(), v.to_string()))
        };
        if let Some(n) = &self.name {
            s.name = n.clone();
        }
        if let Some(g) = self.gpus {
            s.gpus = g;
        }
        if let Some(t) = self.tasks {
            s.tasks = t;
        }
        if let Some(c) = &self.cpu {
            s.cpu = Some(gpunet_api::spec::Quantity::Str(c.clone()));
        }
        if let Some(m) = &self.memory {
            s.memory = Some(gpunet_api::spec::Quantity::Str(m.clone()));
        }
        if !self.gpu_models.is_empty() {
            s.gpu_models = self.gpu_models.iter().map(|m| m.trim().to_string()).collect();
        }
        for kv in &self.selector {
            let (k, v) = pair("--selector", kv)?;
            s.selector.insert(k, v);
        }
        for kv in &self.env {
            let (k, v) = pair("--env", kv)?;
            s.env.insert(k, v);
        }
        if let Some(w) = &self.workdir {
            s.working_dir = Some(w.clone());
        }
        if let Some(i) = &self.image {
            s.image = Some(i.clone());
        }
        if let Some(sp) = self.spot {
            s.spot = Some(sp);
        }
        if let Some(m) = &self.shm_size {
            s.container.get_or_insert_with(Default::default).shm_size = Some(m.clone());
        }
        if let Some(n) = &self.network {
            let net = match n.as_str() {
                "host" => gpunet_api::image::Network::Host,
                "none" => gpunet_api::image::Network::None,
                _ => bail!("invalid --network {n:?}: allowed is host or none"),
            };
            s.container.get_or_insert_with(Default::default).network = Some(net);
        }
        if self.tenant.is_some() {
            s.tenant = self.tenant.clone();
        }
        if let Some(p) = self.priority {
            s.priority = p;
        }
        if self.estimate.is_some() {
            s.estimated_duration = self.estimate.clone();
        }
        if self.time.is_some() {
            s.time_limit = self.time.clone();
        }
        if self.max_restarts.is_some() {
            s.max_restarts = self.max_restarts;
        }
        s.hold_never_fits |= self.hold_never_fits;
        s.hold |= self.hold;
        if self.array.is_some() {
            s.array = self.array.clone();
        }
        if self.dependency.is_some() {
            s.dependency = self.dependency.clone();
        }
        if !self.command.is_empty() {
            s.command = self.command.clone();
        }
        Ok(())
    }

    /// The request body: the file as written, or the submission the flags make (over the file's).
    pub(crate) fn body(&self) -> Result<String> {
        match &self.file {
            Some(f) => {
                let text = crate::read_file(f)?;
                if !self.overrides() {
                    return Ok(text);
                }
                let mut s = gpunet_api::parse_job(&text).map_err(|e| anyhow::anyhow!(e.message))?.job;
                self.apply(&mut s)?;
                Ok(serde_json::to_string(&s)?)
            }
            None => {
                if self.command.is_empty() && self.image.is_none() {
                    bail!("nothing to run: pass -f SPEC, --image IMAGE or a command after --");
                }
                let name = self.name.clone().unwrap_or_else(|| {
                    let first = self.command.first().or(self.image.as_ref()).expect("checked above").as_str();
                    let first = ["docker://", "dir:", "oci-archive:", "oci:", "containers-storage:"]
                        .iter()
                        .find_map(|p| first.strip_prefix(p))
                        .unwrap_or(first);
                    let base = first.rsplit('/').next().unwrap_or(first);
                    let base = base.split([':', '@']).next().filter(|b| !b.is_empty()).unwrap_or("job");
                    base.to_string()
                });
                let mut s = JobSubmission::new(&name, 1, 1);
                self.apply(&mut s)?;
                Ok(serde_json::to_string(&s)?)
            }
        }
    }
}

/// `gpunet submit`.
pub(crate) async fn submit(a: &SubmitArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let body = a.body()?;
    let q = a.tenant.as_ref().map_or(String::new(), |t| format!("?tenant={t}"));
    if a.dry_run {
        let r: DryRun = c.post(&format!("/v1/jobs/dry-run{q}"), Some(body), "application/yaml").await?;
        // As a submission's: what the conversion of a Kubernetes Job left out or changed.
        for w in &r.warnings {
            crate::say!("warning: {}", client::printable(w));
        }
        return emit(c.output, &r, |r, _| {
            let mut s = String::new();
            if !r.placement.is_empty() {
                s += &format!("would start now on {}\n", placement_text(&r.placement));
            } else {
                s += &format!("would wait: {}\n", client::printable(&r.message));
            }
            if let Some(e) = r.eta_ms {
                s += &format!("predicted start {}\n", when(e));
            }
            if let Some(e) = &r.estimate {
                s += &client::estimate_line(e);
            }
            s
        });
    }
    let r: Submitted = c.submit(&format!("/v1/jobs{q}"), body, "application/yaml").await?;
    for w in &r.warnings {
        crate::say!("warning: {}", client::printable(w));
    }
    emit(c.output, &r, |r, _| format!("job-{} submitted ({})\n", r.id, r.state))
}

fn placement_text(p: &[TaskView]) -> String {
    p.iter().map(|t| format!("{}:{:?}", t.node, t.gpus)).collect::<Vec<_>>().join(" ")
}

/// Filters shared by `jobs` and `cancel`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct JobFilter {
    /// Only this tenant's jobs (it must exist).
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// Only jobs in these states, comma-separated: pending, running, preempted, restarting, succeeded, failed,
    /// cancelled.
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// Only jobs this user submitted (the user of the token that submitted them).
    #[arg(long)]
    pub(crate) user: Option<String>,
}

impl JobFilter {
    fn is_empty(&self) -> bool {
        self.tenant.is_none() && self.state.is_none() && self.user.is_none()
    }

    fn query(&self) -> String {
        let mut q = String::new();
        for (k, v) in [("tenant", &self.tenant), ("state", &self.state), ("user", &self.user)] {
            if let Some(v) = v {
                q += &format!("&{k}={}", encode(v));
            }
        }
        q
    }
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b',' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Debug, clap::Args)]
pub(crate) struct JobsArgs {
    /// Only these jobs (42, job-42, an array element 42[3]).
    pub(crate) ids: Vec<String>,
    #[command(flatten)]
    pub(crate) filter: JobFilter,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
    /// Every matching job (all pages), newest first.
    #[arg(long, conflicts_with = "limit")]
    pub(crate) all: bool,
    /// Print again every 2 seconds until Ctrl-C.
    #[arg(short = 'w', long)]
    pub(crate) watch: bool,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// Every job matching `f`, newest first, at most `limit` (all with `None`), and how many match in all.
async fn list(c: &Client, f: &JobFilter, limit: Option<usize>) -> Result<(Vec<JobView>, usize)> {
    let mut jobs = Vec::new();
    let mut before: Option<u64> = None;
    let mut total;
    loop {
        let want = limit.map_or(1000, |l| (l - jobs.len()).clamp(1, 1000));
        let mut q = format!("/v1/jobs?order=newest&limit={want}{}", f.query());
        if let Some(b) = before {
            q += &format!("&before={b}");
        }
        let page: JobPage = c.get(&q).await?;
        total = page.total;
        jobs.extend(page.jobs);
        match page.next {
            Some(n) if limit.is_none_or(|l| jobs.len() < l) => before = Some(n),
            _ => break,
        }
    }
    Ok((jobs, total))
}

/// `gpunet jobs`.
pub(crate) async fn jobs(a: &JobsArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    if a.limit == 0 {
        bail!("invalid --limit 0: allowed is at least 1 (--all for every job)");
    }
    super::output::watching(a.watch, || async {
        let (jobs, total) = if a.ids.is_empty() {
            list(&c, &a.filter, (!a.all).then_some(a.limit)).await?
        } else {
            let mut v = Vec::new();
            for t in &a.ids {
                let id = client::resolve_job_id(&c, t).await?;
                v.push(c.get::<JobView>(&format!("/v1/jobs/{id}")).await?);
            }
            let n = v.len();
            (v, n)
        };
        let page = JobPage { total, next: None, jobs };
        emit(c.output, &page, |p, wide| {
            let mut s = jobs_table(&p.jobs, wide);
            if a.ids.is_empty() {
                s += &if p.jobs.len() < p.total {
                    format!(
                        "{} of {} jobs, newest first ({} more: --all, or --limit N)\n",
                        p.jobs.len(),
                        p.total,
                        p.total - p.jobs.len()
                    )
                } else {
                    format!("{} job(s), newest first\n", p.total)
                };
            }
            s
        })
    })
    .await
}

/// The jobs table; `wide` adds who submitted, priority, start and end, restarts and preemptions.
pub(crate) fn jobs_table(jobs: &[JobView], wide: bool) -> String {
    let mut head = vec!["ID", "TENANT", "NAME", "STATE", "GPUS", "TASKS", "SUBMITTED", "NODES"];
    if wide {
        head.extend(["USER", "PRIORITY", "STARTED", "FINISHED", "RESTARTS", "PREEMPTED"]);
    }
    client::table(
        &head,
        jobs.iter()
            .map(|j| {
                let mut nodes: Vec<&str> = j.placement.iter().map(|t| t.node.as_str()).collect();
                nodes.dedup();
                let mut row = vec![
                    match (j.array_job_id, j.array_index) {
                        (Some(a), Some(i)) => format!("{}  ({a}[{i}])", j.id),
                        _ => j.id.to_string(),
                    },
                    j.tenant.clone(),
                    match &j.array {
                        Some(a) => format!("{} [{} elements]", j.name, a.total),
                        None => j.name.clone(),
                    },
                    if j.held { format!("{} (held)", j.state) } else { j.state.clone() },
                    j.gpus.to_string(),
                    j.tasks.to_string(),
                    ago(j.submitted_ms),
                    nodes.join(","),
                ];
                if wide {
                    row.extend([
                        j.submitted_by.clone().unwrap_or_else(|| "-".into()),
                        j.priority.to_string(),
                        j.started_ms.map_or("-".into(), local),
                        j.finished_ms.map_or("-".into(), local),
                        j.restarts.to_string(),
                        j.preemptions.to_string(),
                    ]);
                }
                row
            })
            .collect(),
    )
}

#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
    /// Job id (42 or job-42), or an array element (42[3] or job-42[3]).
    pub(crate) id: String,
    /// Print again every 2 seconds until Ctrl-C.
    #[arg(short = 'w', long)]
    pub(crate) watch: bool,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// A job's events as the API returns them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Event {
    /// When, ms since the Unix epoch.
    pub(crate) at_ms: u64,
    /// Kind.
    pub(crate) kind: String,
    /// In words.
    pub(crate) message: String,
}

/// `show`'s JSON and YAML: the job and its events.
#[derive(Debug, serde::Serialize)]
struct Shown {
    #[serde(flatten)]
    job: JobView,
    events: Vec<Event>,
}

/// `gpunet show`.
pub(crate) async fn show(a: &ShowArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let id = client::resolve_job_id(&c, &a.id).await?;
    super::output::watching(a.watch, || async {
        let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
        if c.output.is_document() {
            // The job as the API has it (`show -o json` stays the job view), events under their own key.
            let events: Vec<Event> = c.get(&format!("/v1/jobs/{id}/events")).await?;
            return emit(c.output, &Shown { job: j, events }, |_, _| String::new());
        }
        let events: Vec<Event> = c.get(&format!("/v1/jobs/{id}/events")).await?;
        emit(c.output, &j, |j, wide| show_text(j, &events, wide))
    })
    .await
}

/// One attempt's end in words: `exit 3`, `signal 9`, `OOM`, …
fn attempt_end(a: &AttemptView) -> String {
    let code = match (a.exit_code, a.signal) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "-".into(),
    };
    match a.outcome.as_deref() {
        None => "running".into(),
        Some("succeeded") => "succeeded (exit 0)".into(),
        Some("oom") => format!("OOM: killed at its memory limit ({code})"),
        Some("liveness") => format!("liveness probe failed ({code})"),
        Some("time_limit") => format!("time limit reached ({code})"),
        Some("disk_limit") => format!("disk limit reached ({code})"),
        Some("failed") => format!("failed ({code})"),
        Some("node_lost") => "node lost".into(),
        Some(o) => o.replace('_', " "),
    }
}

/// `show`'s text.
pub(crate) fn show_text(j: &JobView, events: &[Event], wide: bool) -> String {
    let mut s = jobs_table(std::slice::from_ref(j), wide);
    match &j.submitted_by {
        Some(by) => s += &format!("  submitted by {by}, {}\n", when(j.submitted_ms)),
        None => s += &format!("  submitted {}\n", when(j.submitted_ms)),
    }
    if let Some(x) = &j.array {
        s += &format!(
            "  array of {} elements ({}): {} expanded, {} live{}, {} succeeded, {} failed, {} cancelled; elements job-{} \
             to job-{}\n",
            x.total,
            j.spec.array.as_deref().unwrap_or(""),
            x.expanded,
            x.live,
            x.limit.map_or(String::new(), |l| format!(" (limit {l})")),
            x.succeeded,
            x.failed,
            x.cancelled,
            j.id + 1,
            j.id + x.total as u64
        );
    }
    if let (Some(a), Some(i)) = (j.array_job_id, j.array_index) {
        s += &format!("  element job-{a}[{i}] of array job-{a}\n");
    }
    if let Some(d) = &j.spec.dependency {
        s += &format!("  dependency {}\n", client::printable(d));
    }
    if let Some(r) = &j.end_reason {
        s += &format!("  ended: {}\n", client::printable(r));
    }
    if let Some(est) = &j.estimate {
        s += &format!("  {}", client::estimate_line(est));
    }
    // Estimate against what it took: the latest attempt's run time (or the time so far).
    let ran = j.attempts.last().map(|a| a.ended_ms.unwrap_or_else(super::output::now_ms).saturating_sub(a.started_ms));
    match (&j.spec.estimated_duration, ran) {
        (Some(e), Some(r)) => s += &format!("  estimate {e}, ran {}\n", format_duration_ms(r)),
        (Some(e), None) => s += &format!("  estimate {e}, not started\n"),
        // A learned (or default) estimate was printed above: only the run time is left to say.
        (None, Some(r)) if j.estimate.is_some() => s += &format!("  ran {}\n", format_duration_ms(r)),
        (None, Some(r)) => s += &format!("  no estimate, ran {}\n", format_duration_ms(r)),
        (None, None) => {}
    }
    if let Some(t) = &j.spec.time_limit {
        s += &format!("  time limit {t} per attempt\n");
    }
    if j.attempts.is_empty() {
        for t in &j.placement {
            s += &format!("  task on {} GPUs {:?}\n", t.node, t.gpus);
        }
    } else {
        s += "attempts:\n";
        let rows = j
            .attempts
            .iter()
            .map(|a| {
                vec![
                    a.attempt.to_string(),
                    placement_text(&a.placement),
                    local(a.started_ms),
                    a.ended_ms.map_or("-".into(), local),
                    a.ended_ms.map_or_else(
                        || format_duration_ms(super::output::now_ms().saturating_sub(a.started_ms)),
                        |e| format_duration_ms(e.saturating_sub(a.started_ms)),
                    ),
                    attempt_end(a),
                ]
            })
            .collect();
        for l in client::table(&["#", "NODE:GPUS", "STARTED", "ENDED", "RAN", "END"], rows).lines() {
            s += &format!("  {l}\n");
        }
        if let Some(m) = j.attempts.last().and_then(|a| a.message.as_ref()) {
            s += &format!("  last end: {}\n", client::printable(m));
        }
    }
    if !events.is_empty() {
        s += "events:\n";
        for e in events {
            // One line each, whatever the message holds (a probe's command is the job's text).
            s += &format!(
                "  {}  {:<16} {}\n",
                local(e.at_ms),
                client::printable(&e.kind),
                client::printable(&e.message)
            );
        }
    }
    s
}

#[derive(Debug, clap::Args)]
pub(crate) struct CancelArgs {
    /// Jobs (42, job-42, an array element 42[3]; an array's id cancels the whole array).
    pub(crate) ids: Vec<String>,
    /// With no ids: every unfinished job that matches these filters.
    #[command(flatten)]
    pub(crate) filter: JobFilter,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet cancel`: each id, or every unfinished job that the filters match. Exits 1 if any cancel failed.
pub(crate) async fn cancel(a: &CancelArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let mut ids = Vec::new();
    for t in &a.ids {
        ids.push(client::resolve_job_id(&c, t).await?);
    }
    if !a.filter.is_empty() {
        let mut f = a.filter.clone();
        if f.state.is_none() {
            f.state = Some("pending,running,preempted,restarting".into());
        }
        let (jobs, _) = list(&c, &f, None).await?;
        let listed: Vec<u64> = jobs.iter().map(|j| j.id).collect();
        if a.ids.is_empty() {
            ids = listed;
        } else {
            // Ids and filters: the ids that match.
            ids.retain(|i| listed.contains(i));
        }
        if ids.is_empty() {
            crate::say!("no unfinished job matches");
            return Ok(());
        }
    } else if ids.is_empty() {
        bail!("name the jobs to cancel: IDs, or --state/--user/--tenant filters");
    }
    let mut done = Vec::new();
    let mut failed = 0;
    for id in ids {
        match c.post::<JobView>(&format!("/v1/jobs/{id}/cancel"), None, "").await {
            Ok(j) => {
                if !c.output.is_document() {
                    out(&match &j.stopping {
                        Some(why) if j.state == "running" => format!(
                            "job-{} is being {why}: its tasks are stopping (it ends once they are gone)\n",
                            j.id
                        ),
                        _ => format!("job-{} {}\n", j.id, j.state),
                    });
                }
                done.push(j);
            }
            Err(e) => {
                crate::say!("error: cancel job-{id}: {e:#}");
                failed += 1;
            }
        }
    }
    if c.output.is_document() {
        // One job's view as before; several as a list.
        if done.len() == 1 && a.ids.len() == 1 && a.filter.is_empty() {
            emit(c.output, &done[0], |_, _| String::new())?;
        } else {
            emit(c.output, &done, |_, _| String::new())?;
        }
    }
    if failed > 0 {
        bail!("{failed} of the jobs could not be cancelled");
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub(crate) struct HoldArgs {
    /// Jobs (42, job-42, an array element 42[3]; an array's id holds or releases the whole array).
    #[arg(required = true)]
    pub(crate) ids: Vec<String>,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet hold` (`release` when `release`): each job in turn. Exits 1 if any could not be held (released).
pub(crate) async fn hold(a: &HoldArgs, release: bool) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let (action, done_word) = if release { ("release", "released") } else { ("hold", "held") };
    let mut done = Vec::new();
    let mut failed = 0;
    for t in &a.ids {
        let r = async {
            let id = client::resolve_job_id(&c, t).await?;
            c.post::<JobView>(&format!("/v1/jobs/{id}/{action}"), None, "").await
        };
        match r.await {
            Ok(j) => {
                if !c.output.is_document() {
                    out(&format!("job-{} {done_word} ({})\n", j.id, j.state));
                }
                done.push(j);
            }
            Err(e) => {
                crate::say!("error: {action} {t}: {e:#}");
                failed += 1;
            }
        }
    }
    if c.output.is_document() {
        emit(c.output, &done, |_, _| String::new())?;
    }
    if failed > 0 {
        bail!("{failed} of the jobs could not be {done_word}");
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub(crate) struct IdArg {
    /// Job id (42 or job-42), or an array element (42[3] or job-42[3]).
    pub(crate) id: String,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet why`.
pub(crate) async fn why(a: &IdArg) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let id = client::resolve_job_id(&c, &a.id).await?;
    let e: Explain = c.get(&format!("/v1/jobs/{id}/explain")).await?;
    emit(c.output, &e, |e, _| {
        // A message that names the job already says what it is; others get the job and its state first.
        let named =
            e.message.starts_with(&format!("job-{} ", e.id)) || e.message.starts_with(&format!("array job-{} ", e.id));
        let m = client::printable(&e.message);
        let mut s = if named { format!("{m}\n") } else { format!("job-{} is {}: {m}\n", e.id, e.state) };
        if let Some(t) = e.eta_ms {
            s += &format!("predicted start {}\n", when(t));
        }
        if let Some(est) = &e.estimate {
            s += &client::estimate_line(est);
        }
        // A queued job is explained by the server's queue view: say how fresh it is once that is worth saying.
        if let Some(at) = e.as_of_ms.filter(|at| at + 1_000 < super::output::now_ms()) {
            s += &format!("as of {}\n", ago(at));
        }
        s
    })
}

#[derive(Debug, clap::Args)]
pub(crate) struct WaitArgs {
    /// Job ids (42, job-42, or an array element 42[3]).
    #[arg(required = true)]
    pub(crate) ids: Vec<String>,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet wait`: exits with the jobs' code.
pub(crate) async fn wait(a: &WaitArgs) -> Result<i32> {
    let c = Client::new(&a.conn)?;
    let mut ids = Vec::with_capacity(a.ids.len());
    for t in &a.ids {
        ids.push(client::resolve_job_id(&c, t).await?);
    }
    client::wait_for_jobs(&c, &ids).await
}

#[derive(Debug, clap::Args)]
pub(crate) struct LogsArgs {
    /// Job id.
    pub(crate) id: String,
    /// Follow until the job ends, then exit with its code as `gpunet wait` does.
    #[arg(short = 'f', long)]
    pub(crate) follow: bool,
    /// Task rank.
    #[arg(long, default_value_t = 0)]
    pub(crate) rank: u32,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet logs`: the exit code (with `-f`, the job's).
pub(crate) async fn logs(a: &LogsArgs) -> Result<i32> {
    let c = Client::new(&a.conn)?;
    let id = client::resolve_job_id(&c, &a.id).await?;
    c.stream(&format!("/v1/jobs/{id}/logs?rank={}&follow={}", a.rank, a.follow), out_bytes).await?;
    if !a.follow {
        return Ok(0);
    }
    client::job_exit_code(&c, id).await
}
