//! `gpunet run`, like Slurm's `srun`: submit a job, wait for it to start, stream every rank's output as it comes
//! (each line prefixed with its rank when there are several), cancel the job on Ctrl-C, and exit with the job's exit
//! code (see [`crate::client::job_exit_code`]; 130 when it was cancelled from here).

use super::jobs::{SubmitArgs, ENDED};
use super::output::{out, out_bytes};
use crate::client::{self, Client};
use anyhow::{bail, Result};
use gpunet_api::types::{JobView, Submitted};
use std::time::Duration;

/// The exit code of a run cancelled with Ctrl-C (a shell's for SIGINT).
pub(crate) const INTERRUPTED: i32 = 130;

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) submit: SubmitArgs,
    /// Never prefix lines with their rank (the default prefixes them when the job has several tasks).
    #[arg(long)]
    pub(crate) no_label: bool,
}

/// What happened while waiting.
enum Waited {
    Job(Box<JobView>),
    Interrupted,
}

/// Polls the job until it runs or ends, or Ctrl-C.
async fn until_started(c: &Client, id: u64) -> Result<Waited> {
    let mut said = String::new();
    loop {
        let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
        if j.state == "running" || ENDED.contains(&j.state.as_str()) {
            return Ok(Waited::Job(Box::new(j)));
        }
        if said != j.state {
            crate::say!("job-{id} {} (gpunet why {id} says why)", j.state);
            said = j.state.clone();
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(Waited::Interrupted),
        }
    }
}

/// Cancels the job after Ctrl-C and says so.
async fn cancel(c: &Client, id: u64) {
    crate::say!("interrupted: cancelling job-{id}");
    if let Err(e) = c.post::<JobView>(&format!("/v1/jobs/{id}/cancel"), None, "").await {
        crate::say!("error: cancel job-{id}: {e:#}");
    }
}

/// Streams one rank's output (following it across attempts until the job ends), line by line with `label` in front.
async fn stream_rank(c: &Client, id: u64, rank: u32, label: Option<String>) -> Result<()> {
    let mut pending: Vec<u8> = Vec::new();
    let path = format!("/v1/jobs/{id}/logs?rank={rank}&follow=true");
    match &label {
        None => c.stream(&path, out_bytes).await?,
        Some(l) => {
            c.stream(&path, |chunk| {
                pending.extend_from_slice(chunk);
                // Whole lines only, each written at once, so that ranks' lines never interleave mid-line.
                if let Some(end) = pending.iter().rposition(|b| *b == b'\n') {
                    let mut text = Vec::with_capacity(end + 1 + l.len() * 4);
                    for line in pending[..=end].split_inclusive(|b| *b == b'\n') {
                        text.extend_from_slice(l.as_bytes());
                        text.extend_from_slice(line);
                    }
                    out_bytes(&text);
                    pending.drain(..=end);
                }
            })
            .await?;
            if !pending.is_empty() {
                out(&format!("{l}{}\n", String::from_utf8_lossy(&pending)));
            }
        }
    }
    Ok(())
}

/// `gpunet run`: the exit code.
pub(crate) async fn run(a: &RunArgs) -> Result<i32> {
    if a.submit.array.is_some() {
        bail!("invalid --array with run: run streams one job; submit an array with `gpunet submit --array`");
    }
    if a.submit.dry_run {
        super::jobs::submit(&a.submit).await?;
        return Ok(0);
    }
    let c = Client::new(&a.submit.conn)?;
    let body = a.submit.body()?;
    let q = a.submit.tenant.as_ref().map_or(String::new(), |t| format!("?tenant={t}"));
    // With an idempotency key, as `gpunet submit`'s: retried through a failover, it never makes a second job.
    let r: Submitted = c.submit(&format!("/v1/jobs{q}"), body, "application/yaml").await?;
    for w in &r.warnings {
        crate::say!("warning: {w}");
    }
    let id = r.id;
    crate::say!("job-{id} submitted");
    let j = match until_started(&c, id).await? {
        Waited::Job(j) => *j,
        Waited::Interrupted => {
            cancel(&c, id).await;
            return Ok(INTERRUPTED);
        }
    };
    if j.state == "running" {
        let nodes: Vec<String> = j.placement.iter().map(|t| format!("{}:{:?}", t.node, t.gpus)).collect();
        crate::say!("job-{id} running on {}", nodes.join(" "));
    }
    let tasks = j.tasks.max(1);
    let c = std::sync::Arc::new(c);
    let mut streams = tokio::task::JoinSet::new();
    for rank in 0..tasks {
        let label = (tasks > 1 && !a.no_label).then(|| format!("{rank}: "));
        let c = c.clone();
        streams.spawn(async move { stream_rank(&c, id, rank, label).await });
    }
    let mut interrupted = false;
    loop {
        tokio::select! {
            r = streams.join_next() => match r {
                None => break,
                Some(r) => r??,
            },
            _ = tokio::signal::ctrl_c() => {
                if interrupted {
                    // A second Ctrl-C: stop waiting for the tasks to go.
                    return Ok(INTERRUPTED);
                }
                interrupted = true;
                cancel(&c, id).await;
            }
        }
    }
    // The streams end with the job; its end is recorded with them.
    let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
    if !ENDED.contains(&j.state.as_str()) {
        let code = client::wait_for_jobs(&c, &[id]).await?;
        return Ok(if interrupted { INTERRUPTED } else { code });
    }
    crate::say!("job-{id} {}", j.state);
    if interrupted {
        return Ok(INTERRUPTED);
    }
    client::job_exit_code(&c, id).await
}
