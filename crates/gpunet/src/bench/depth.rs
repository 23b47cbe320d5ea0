//! `gpunet bench depth`: the control plane with a deep queue. It starts its own `gpunet server` (this binary, a
//! child process on loopback, SQLite store, no node: nothing can start), fills the queue to each depth with batch
//! submissions, and at each depth measures durable submissions per second and their latency from concurrent clients,
//! alone and while readers poll `GET /v1/queue?limit=50` and `GET /v1/jobs?limit=50`, each reader every
//! `--read-every-ms` (a busy portal page: the portal itself refreshes every 2 s). The two alternate over `--rounds`
//! rounds, so that the machine's drift over time falls on both alike, and the ratio reported is the median of the
//! rounds'. Then one round with the readers reading without pause (a stress figure: on a small machine such readers
//! take their share of the CPU from everything else). The readers are other people than the submitter: an admin
//! token of their own (a token's reads wait for its own changes to be in the queue view, see `gpunet_server`'s
//! `owner/snapshot.rs`, not for others'). Then one `GET /v1/queue?limit=50` on its own, and the server's resident
//! memory. One JSON object per depth; then the server is restarted with everything queued and the time until it
//! answers the queue again is reported.

use crate::bench::api::{ApiReport, Load};
use crate::bench::quantile;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DepthArgs {
    /// Queue depths to measure at, ascending, comma-separated.
    #[arg(long, default_value = "0,100000,500000,1000000", value_delimiter = ',')]
    pub(crate) depths: Vec<usize>,
    /// Submissions measured at each depth without readers (and as many with paced readers), over `--rounds`.
    #[arg(long, default_value_t = 30_000)]
    pub(crate) jobs: usize,
    /// Rounds at each depth, each of `jobs / rounds` submissions alone then as many with paced readers, so that the
    /// machine's drift over time falls on both alike; the ratio is the median of the rounds' ratios.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Concurrent submitting clients.
    #[arg(long, default_value_t = 16)]
    pub(crate) clients: usize,
    /// Concurrent readers (half poll the queue, half the job list).
    #[arg(long, default_value_t = 10)]
    pub(crate) readers: usize,
    /// How often each reader reads in the paced measurement, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub(crate) read_every_ms: u64,
    /// Where the server keeps its data (default: a new directory under `TMPDIR`, removed at the end).
    #[arg(long)]
    pub(crate) data_dir: Option<std::path::PathBuf>,
    /// Skip the restart at the end.
    #[arg(long)]
    pub(crate) no_restart: bool,
}

/// Figures at one depth.
#[derive(Debug, Serialize)]
struct DepthReport {
    /// Jobs pending when the measurement began.
    pending: usize,
    submissions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// With the readers polling, each every `read_every_ms`.
    with_readers: ReadersReport,
    /// With the readers polling without pause.
    with_busy_readers: ReadersReport,
    /// Median and slowest of 21 `GET /v1/queue?limit=50` alone.
    queue_get_p50_ms: f64,
    queue_get_max_ms: f64,
    /// The server's resident memory after the measurement, and per pending job.
    rss_mib: f64,
    rss_per_pending_kib: f64,
}

#[derive(Debug, Serialize)]
struct ReadersReport {
    readers: usize,
    /// Each reader's pause between reads (none: without pause).
    read_every_ms: Option<u64>,
    submissions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Reads answered per second, and their latency.
    reads_per_s: f64,
    read_p50_ms: f64,
    read_p99_ms: f64,
    /// Submissions per second with readers ÷ without: the median of the rounds' (busy readers: one round).
    ratio: f64,
    /// Each round's ratio.
    round_ratios: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct RestartReport {
    /// Jobs pending across the restart.
    pending: usize,
    /// From starting the server process to its first answer of `GET /v1/queue`.
    restart_s: f64,
    /// Its resident memory then.
    rss_mib: f64,
}

/// The server child, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(dir: &std::path::Path, admin: &str) -> Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("server.log"))?;
        let child = Command::new(std::env::current_exe()?)
            .args(["server", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin-token", admin])
            .args(["--join-token", &format!("join-{admin}"), "--max-queued-jobs-per-tenant", "100000000"])
            .args(["--max-spec-bytes-per-tenant", "1000000000000"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start gpunet server")?;
        Ok(Server { child, url: format!("http://127.0.0.1:{port}") })
    }

    /// Resident memory in MiB (VmRSS).
    fn rss_mib(&self) -> f64 {
        crate::bench::status_mib(&format!("/proc/{}/status", self.child.id()), "VmRSS:")
    }

    /// Waits until `GET /v1/queue` answers.
    async fn ready(&mut self, http: &reqwest::Client, admin: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Some(st) = self.child.try_wait()? {
                bail!("the server exited ({st}) before it answered");
            }
            let r = http.get(format!("{}/v1/queue?limit=1", self.url)).bearer_auth(admin).send().await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the server did not answer within 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub(crate) async fn run(a: DepthArgs) -> Result<()> {
    if a.depths.windows(2).any(|w| w[1] < w[0]) {
        bail!("invalid --depths: give them ascending");
    }
    if a.clients == 0 || a.jobs == 0 {
        bail!("invalid --clients/--jobs: both must be at least 1");
    }
    let (dir, remove) = match &a.data_dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("gpunet-bench-depth-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let r = measure(&a, &dir).await;
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r
}

async fn measure(a: &DepthArgs, dir: &std::path::Path) -> Result<()> {
    let admin = gpunet_server::new_token();
    let http = crate::client::http_client(None, a.clients * 2 + a.readers * 2)?;
    let mut server = Server::start(dir, &admin)?;
    server.ready(&http, &admin).await?;
    let r = http
        .post(format!("{}/v1/tenants", server.url))
        .bearer_auth(&admin)
        .header("content-type", "application/json")
        .body(r#"{"name":"bench"}"#)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("create tenant bench: {}", r.text().await?);
    }
    // The readers' own token: an operator watching the queue, not the pipeline that submits.
    let r = http
        .post(format!("{}/v1/tokens", server.url))
        .bearer_auth(&admin)
        .header("content-type", "application/json")
        .body(r#"{"role":"admin","user":"portal-viewer"}"#)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("create the readers' token: {}", r.text().await?);
    }
    let viewer = r.json::<gpunet_api::types::TokenCreated>().await?.token;
    let servers =
        gpunet_api::servers::ServerList::parse("--server", &server.url).map_err(|e| anyhow::anyhow!(e.message))?;
    let load = Load {
        http: http.clone(),
        servers,
        token: admin.clone(),
        tenant_field: r#","tenant":"bench""#.into(),
        ids: None,
    };
    let mut pending = 0usize;
    for &depth in &a.depths {
        pending += prefill(&http, &server.url, &admin, depth.saturating_sub(pending)).await?;
        let at = pending;
        let per = (a.jobs / a.rounds.max(1)).max(1);
        let (mut alone, mut with, mut reads) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.rounds.max(1) {
            let r = load.submit(a.clients, per).await?;
            pending += r.acknowledged;
            alone.push(r);
            let (r, rd) = with_readers(&load, a, &server.url, &viewer, Some(a.read_every_ms), per).await?;
            pending += r.acknowledged;
            with.push(r);
            reads.push(rd);
        }
        let (busy, busy_reads) = with_readers(&load, a, &server.url, &viewer, None, per).await?;
        pending += busy.acknowledged;
        let (get_p50, get_max) = queue_gets(&http, &server.url, &admin).await?;
        let rss = server.rss_mib();
        let alone_rate: Vec<f64> = alone.iter().map(|r| r.submissions_per_s).collect();
        let report = DepthReport {
            pending: at,
            submissions_per_s: median(alone_rate.clone()),
            p50_ms: median(alone.iter().map(|r| r.p50_ms).collect()),
            p99_ms: alone.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
            with_readers: ReadersReport::new(a, Some(a.read_every_ms), &with, &reads, &alone_rate),
            with_busy_readers: ReadersReport::new(a, None, &[busy], &[busy_reads], &alone_rate),
            queue_get_p50_ms: get_p50,
            queue_get_max_ms: get_max,
            rss_mib: rss,
            rss_per_pending_kib: if pending > 0 { rss * 1024.0 / pending as f64 } else { 0.0 },
        };
        println!("{}", serde_json::to_string(&report)?);
    }
    if !a.no_restart {
        drop(server);
        let t0 = Instant::now();
        let mut server = Server::start(dir, &admin)?;
        server.ready(&http, &admin).await?;
        let restart_s = t0.elapsed().as_secs_f64();
        let r = RestartReport { pending, restart_s, rss_mib: server.rss_mib() };
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

/// Queues `n` jobs in batches of 5,000 from two clients; returns how many were acknowledged.
async fn prefill(http: &reqwest::Client, url: &str, admin: &str, n: usize) -> Result<usize> {
    const BATCH: usize = 5_000;
    let one = r#"{"name":"fill","gpus":1,"command":["true"],"tenant":"bench"}"#;
    let batches: Vec<usize> = (0..n.div_ceil(BATCH)).map(|i| BATCH.min(n - i * BATCH)).collect();
    let queue = Arc::new(Mutex::new(batches));
    let mut handles = Vec::new();
    for _ in 0..2 {
        let (http, url, admin, queue) = (http.clone(), url.to_string(), admin.to_string(), queue.clone());
        handles.push(tokio::spawn(async move {
            let mut done = 0usize;
            loop {
                let Some(k) = queue.lock().expect("batches").pop() else { break };
                let body = format!("[{}]", vec![one; k].join(","));
                let r = http
                    .post(format!("{url}/v1/jobs/batch"))
                    .bearer_auth(&admin)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await?;
                if !r.status().is_success() {
                    bail!("prefill batch: {} {}", r.status(), r.text().await.unwrap_or_default());
                }
                done += k;
            }
            Ok(done)
        }));
    }
    let mut done = 0;
    for h in handles {
        done += h.await??;
    }
    Ok(done)
}

/// The median of `v` (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl ReadersReport {
    /// From rounds with readers, each against the round without them at the same index (the last, for one busy round).
    fn new(a: &DepthArgs, every: Option<u64>, with: &[ApiReport], reads: &[(f64, f64, f64)], alone: &[f64]) -> Self {
        let round_ratios: Vec<f64> = with
            .iter()
            .enumerate()
            .map(|(i, w)| w.submissions_per_s / alone.get(i).or(alone.last()).copied().unwrap_or(f64::NAN))
            .collect();
        ReadersReport {
            readers: a.readers,
            read_every_ms: every,
            submissions_per_s: median(with.iter().map(|r| r.submissions_per_s).collect()),
            p50_ms: median(with.iter().map(|r| r.p50_ms).collect()),
            p99_ms: with.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
            reads_per_s: median(reads.iter().map(|r| r.0).collect()),
            read_p50_ms: median(reads.iter().map(|r| r.1).collect()),
            read_p99_ms: reads.iter().map(|r| r.2).fold(0.0, f64::max),
            ratio: median(round_ratios.clone()),
            round_ratios,
        }
    }
}

/// Submissions measured while `readers` clients read, each every `every` milliseconds (without pause: `None`);
/// returns them with the reads' rate, p50, p99.
async fn with_readers(
    load: &Load,
    a: &DepthArgs,
    url: &str,
    token: &str,
    every: Option<u64>,
    jobs: usize,
) -> Result<(ApiReport, (f64, f64, f64))> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for i in 0..a.readers {
        let (http, token, stop) = (load.http.clone(), token.to_string(), stop.clone());
        let path = if i % 2 == 0 { "/v1/queue?limit=50" } else { "/v1/jobs?limit=50" };
        let target = format!("{url}{path}");
        // Paced readers start spread over one period, as independent pages would.
        let offset = every.map(|ms| Duration::from_millis(ms * i as u64 / a.readers.max(1) as u64));
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut tick = every.map(|ms| {
                let mut t = tokio::time::interval_at(
                    tokio::time::Instant::now() + offset.unwrap_or_default(),
                    Duration::from_millis(ms.max(1)),
                );
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t
            });
            while !stop.load(Ordering::Relaxed) {
                if let Some(t) = tick.as_mut() {
                    t.tick().await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                let t = Instant::now();
                let r = http.get(&target).bearer_auth(&token).send().await?;
                if !r.status().is_success() {
                    bail!("GET {target}: {}", r.status());
                }
                r.bytes().await?;
                lat.push(t.elapsed().as_secs_f64() * 1e3);
            }
            Ok(lat)
        }));
    }
    let t0 = Instant::now();
    let report = load.submit(a.clients, jobs).await;
    stop.store(true, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await??);
    }
    lat.sort_by(f64::total_cmp);
    Ok((report?, (lat.len() as f64 / secs, quantile(&lat, 0.5), quantile(&lat, 0.99))))
}

/// Median and slowest of 21 `GET /v1/queue?limit=50`, one at a time.
async fn queue_gets(http: &reqwest::Client, url: &str, admin: &str) -> Result<(f64, f64)> {
    let mut lat = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let r = http.get(format!("{url}/v1/queue?limit=50")).bearer_auth(admin).send().await?;
        if !r.status().is_success() {
            bail!("GET /v1/queue: {}", r.status());
        }
        r.bytes().await?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(f64::total_cmp);
    Ok((quantile(&lat, 0.5), lat[lat.len() - 1]))
}
