//! `gpunet bench e2e`: N trivial jobs (`true`) through the whole system, server and agent, on S GPU slots. S
//! submitters each submit a job, wait for it to complete (from the server's event stream), and submit the next: at
//! most S jobs are outstanding, so the start latency measures the system, not a queue. Reports the time from
//! submission to the task's process starting (from the job's own events: `submitted` by the server,
//! `process_started` by the agent, on one machine's clock) and the time to drain them all.

use crate::bench::quantile;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::time::Duration;

/// The server and agents this benchmark started, and how to stop them.
type LocalNet = (gpunet_server::Running, Vec<tokio::sync::oneshot::Sender<()>>, Vec<tokio::task::JoinHandle<()>>);

/// Options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct E2eArgs {
    /// Jobs.
    #[arg(long, default_value_t = 500)]
    pub(crate) jobs: usize,
    /// GPU slots (fake GPUs of the local agent; one GPU per job).
    #[arg(long, default_value_t = 16)]
    pub(crate) slots: usize,
    /// Use a running server instead of starting one (it needs agents with free GPUs).
    #[arg(long)]
    pub(crate) server: Option<String>,
    /// Admin token of `--server`.
    #[arg(long, env = "GPUNET_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// table or json.
    #[arg(long, default_value = "table")]
    pub(crate) output: String,
    /// Measure preemption instead: `--jobs` rounds, each a low-priority job holding every slot (its process exits at
    /// once on SIGTERM) and then a priority-10 job needing them all; reports the time from the preemption decision
    /// to the preemptor's process start (a local server only).
    #[arg(long)]
    pub(crate) preempt: bool,
    /// The local agent runs each tenant's tasks as the tenant's own uid (needs root).
    #[arg(long)]
    pub(crate) tenant_uids: bool,
    /// The local agent runs tasks without a PID namespace of their own.
    #[arg(long)]
    pub(crate) no_pid_namespace: bool,
    /// Also run the jobs in containers of this image (e.g. `dir:tiny`, see `scripts/tiny-image.sh`), after the
    /// process jobs in the same run, and report both side by side. The image must have `true`.
    #[arg(long)]
    pub(crate) image: Option<String>,
    /// The local agent's image directory (`gpunet agent --image-dir`), where `dir:`/`oci:` images are found.
    #[arg(long)]
    pub(crate) image_dir: Option<std::path::PathBuf>,
}

/// What it measured.
#[derive(Debug, Serialize)]
pub(crate) struct E2eReport {
    /// Median submit → process started.
    pub(crate) start_p50_ms: f64,
    /// 99th percentile of the same.
    pub(crate) start_p99_ms: f64,
    /// First submission → last completion.
    pub(crate) drain_s: f64,
    /// Median submit → the scheduler's decision (the server's `started` event): the control plane's share.
    pub(crate) placed_p50_ms: f64,
    /// Median decision → process started: the sync to the agent and the agent's own setup and spawn.
    pub(crate) placed_to_start_p50_ms: f64,
}

async fn json<T: serde::de::DeserializeOwned>(r: reqwest::RequestBuilder) -> Result<T> {
    let resp = r.send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    if !status.is_success() {
        bail!("the server answered {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(serde_json::from_slice(&body)?)
}

pub(crate) async fn run(a: E2eArgs) -> Result<()> {
    if !matches!(a.output.as_str(), "table" | "json") {
        bail!("invalid --output {:?}: allowed are table and json", a.output);
    }
    if a.jobs == 0 || a.slots == 0 || a.slots > 64 * 64 {
        bail!("invalid --jobs/--slots: at least 1 job and 1 to 4096 slots");
    }
    let dir = std::env::temp_dir().join(format!("gpunet-bench-e2e-{}", std::process::id()));
    let mut local: Option<LocalNet> = None;
    let (url, token) = match &a.server {
        Some(u) => (u.trim_end_matches('/').to_string(), a.token.clone().context("--token is required with --server")?),
        None => {
            let (net, url, admin) = local_net(&dir, &a).await?;
            local = Some(net);
            (url, admin)
        }
    };
    if a.preempt {
        if local.is_none() {
            bail!("--preempt runs on a local server only (it needs the priority policy without a minimum run time)");
        }
        let r = preempt_rounds(&url, &token, &a).await;
        stop_local(local, &dir).await;
        return r;
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    // Wait for the GPUs to be there.
    ready(&http, &url, &token, if a.server.is_some() { 1 } else { a.slots }).await?;
    let process = measure(&http, &url, &token, &a, None).await;
    let container = match (&process, &a.image) {
        (Ok(_), Some(image)) => Some(measure(&http, &url, &token, &a, Some(image)).await),
        _ => None,
    };
    stop_local(local, &dir).await;
    let process = process?;
    let container = container.transpose()?;
    if a.output == "json" {
        match &container {
            None => println!("{}", serde_json::to_string(&process)?),
            Some(c) => println!("{}", serde_json::json!({"process": process, "container": c})),
        }
        return Ok(());
    }
    // Name, value, decimals.
    type Row = (&'static str, fn(&E2eReport) -> f64, usize);
    let rows: [Row; 5] = [
        ("start_p50_ms", |r| r.start_p50_ms, 1),
        ("start_p99_ms", |r| r.start_p99_ms, 1),
        ("drain_s", |r| r.drain_s, 2),
        ("placed_p50_ms", |r| r.placed_p50_ms, 1),
        ("placed_to_start_p50_ms", |r| r.placed_to_start_p50_ms, 1),
    ];
    if container.is_some() {
        println!("{:<24} {:>10} {:>10}", "", "process", "container");
    }
    for (name, f, decimals) in rows {
        let cell = |r: &E2eReport| format!("{:.*}", decimals, f(r));
        match &container {
            None => println!("{name:<24} {}", cell(&process)),
            Some(c) => println!("{name:<24} {:>10} {:>10}", cell(&process), cell(c)),
        }
    }
    Ok(())
}

/// Runs the jobs (in containers of `image` when given) and measures them.
async fn measure(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    a: &E2eArgs,
    image: Option<&String>,
) -> Result<E2eReport> {
    let (url, token) = (url.to_string(), token.to_string());
    // Completions from the event stream.
    type Waiters = std::sync::Arc<
        std::sync::Mutex<(
            std::collections::HashMap<u64, tokio::sync::oneshot::Sender<()>>,
            std::collections::HashSet<u64>,
        )>,
    >;
    let waiters: Waiters = Default::default();
    let mut stream = http.get(format!("{url}/v1/events")).bearer_auth(&token).send().await?;
    if !stream.status().is_success() {
        bail!("subscribe to events: {}", stream.status());
    }
    let w = waiters.clone();
    let listener = tokio::spawn(async move {
        let mut buf = String::new();
        while let Ok(Some(chunk)) = stream.chunk().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(i) = buf.find('\n') {
                let line: String = buf.drain(..=i).collect();
                let Some(data) = line.trim().strip_prefix("data:") else { continue };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(data.trim()) else { continue };
                if v["kind"] == "succeeded" || v["kind"] == "failed" {
                    let Some(id) = v["job"].as_u64() else { continue };
                    let mut g = w.lock().expect("waiters lock");
                    match g.0.remove(&id) {
                        Some(tx) => {
                            let _ = tx.send(());
                        }
                        None => {
                            g.1.insert(id);
                        }
                    }
                }
            }
        }
    });
    let mut spec = serde_json::json!({"name": "true", "tenant": "bench-e2e", "gpus": 1, "command": ["true"],
                                      "cpu": "100m", "memory": "64Mi"});
    if let Some(i) = image {
        spec["image"] = serde_json::json!(i);
    }
    let body = spec.to_string();
    let mut handles = Vec::new();
    for c in 0..a.slots {
        let n = a.jobs / a.slots + usize::from(c < a.jobs % a.slots);
        let (http, url, token, waiters, body) =
            (http.clone(), url.clone(), token.clone(), waiters.clone(), body.clone());
        handles.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(n);
            for _ in 0..n {
                let v: serde_json::Value = json(
                    http.post(format!("{url}/v1/jobs"))
                        .bearer_auth(&token)
                        .header("content-type", "application/json")
                        .body(body.clone()),
                )
                .await?;
                let id = v["id"].as_u64().context("an id")?;
                ids.push(id);
                let rx = {
                    let mut g = waiters.lock().expect("waiters lock");
                    if g.1.remove(&id) {
                        None
                    } else {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        g.0.insert(id, tx);
                        Some(rx)
                    }
                };
                if let Some(rx) = rx {
                    tokio::time::timeout(Duration::from_secs(60), rx)
                        .await
                        .context("a job did not finish within 60 s")??;
                }
            }
            Ok::<Vec<u64>, anyhow::Error>(ids)
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.extend(h.await??);
    }
    listener.abort();
    let mut starts = Vec::with_capacity(ids.len());
    let (mut placed, mut to_start) = (Vec::new(), Vec::new());
    let (mut first, mut last) = (u64::MAX, 0u64);
    for id in &ids {
        let ev: Vec<serde_json::Value> =
            json(http.get(format!("{url}/v1/jobs/{id}/events")).bearer_auth(&token)).await?;
        let at = |k: &str| ev.iter().find(|e| e["kind"] == k).and_then(|e| e["at_ms"].as_u64());
        let (Some(sub), Some(st)) = (at("submitted"), at("process_started")) else { continue };
        starts.push(st.saturating_sub(sub) as f64);
        if let Some(p) = at("started") {
            placed.push(p.saturating_sub(sub) as f64);
            to_start.push(st.saturating_sub(p) as f64);
        }
        first = first.min(sub);
        if let Some(end) = ev
            .iter()
            .rev()
            .find(|e| e["kind"] == "succeeded" || e["kind"] == "failed")
            .and_then(|e| e["at_ms"].as_u64())
        {
            last = last.max(end);
        }
    }
    for v in [&mut starts, &mut placed, &mut to_start] {
        v.sort_by(f64::total_cmp);
    }
    let report = E2eReport {
        start_p50_ms: quantile(&starts, 0.5),
        start_p99_ms: quantile(&starts, 0.99),
        drain_s: last.saturating_sub(first) as f64 / 1000.0,
        placed_p50_ms: quantile(&placed, 0.5),
        placed_to_start_p50_ms: quantile(&to_start, 0.5),
    };
    if starts.len() < ids.len() {
        bail!("only {} of {} jobs reported a process start", starts.len(), ids.len());
    }
    Ok(report)
}

/// Starts a server and agents with `slots` fake GPUs on loopback; returns them, the URL and the admin token.
async fn local_net(dir: &std::path::Path, a: &E2eArgs) -> Result<(LocalNet, String, String)> {
    let (slots, preempt) = (a.slots, a.preempt);
    if a.tenant_uids {
        // The tenants' users reach their directories beneath the agents' (the server's stays private).
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let admin = gpunet_server::new_token();
    let join = gpunet_server::new_token();
    let mut cfg = gpunet_server::Config::new(dir.join("server"));
    cfg.listen = "127.0.0.1:0".parse()?;
    cfg.admin_token = Some(admin.clone());
    cfg.join_token = Some(join.clone());
    if preempt {
        cfg.sched.policy = gpunet_core::Policy::Priority;
        cfg.sched.preemption.min_run_time = gpunet_core::Dur::ZERO;
        // Every round preempts once: no rate limit in the way.
        cfg.sched.preemption.max_per_interval = u32::MAX;
    }
    let store = std::sync::Arc::new(gpunet_store::SqliteStore::open(&dir.join("server"))?);
    let running = gpunet_server::start(cfg, store).await?;
    let url = format!("http://{}", running.addr);
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    let mut left = slots;
    let mut i = 0;
    while left > 0 {
        let n = left.min(64);
        left -= n;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(tx);
        let cfg = gpunet_agent::AgentConfig {
            server: url.clone(),
            ca: None,
            join_token: Some(join.clone()),
            name: format!("bench-{i}"),
            labels: std::collections::BTreeMap::from([("zone".to_string(), "local".to_string())]),
            fake_gpus: Some((gpunet_core::GpuModel::A100_80GB, n)),
            fake_mig: Vec::new(),
            real_gpus: Vec::new(),
            data_dir: dir.join(format!("agent-{i}")),
            cpu: None,
            mem: None,
            address: "127.0.0.1".into(),
            run_as: None,
            wrapper: std::env::current_exe().ok(),
            task_path: gpunet_agent::launcher::DEFAULT_TASK_PATH.into(),
            tenant_uid_base: a.tenant_uids.then_some(gpunet_agent::launcher::DEFAULT_TENANT_UID_BASE),
            device_dir: None,
            price_per_gpu_hour: None,
            fake_gpu_samples: false,
            pid_namespace: !a.no_pid_namespace,
            task_pids_max: gpunet_agent::cgroups::TASK_PIDS_MAX,
            task_disk_max: gpunet_agent::disk::DEFAULT_TASK_DISK_MAX,
            task_files_max: gpunet_agent::disk::DEFAULT_TASK_FILES_MAX,
            task_disk_check: gpunet_agent::launcher::DISK_CHECK_EVERY,
            snapshot_max_bytes: gpunet_agent::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
            ended_job_files_keep: gpunet_agent::DEFAULT_ENDED_JOB_FILES_KEEP,
            containers: gpunet_agent::container::Options { image_dir: a.image_dir.clone(), ..Default::default() },
            notice_command: None,
        };
        tasks.push(tokio::spawn(async move {
            let _ = gpunet_agent::run(cfg, async {
                let _ = rx.await;
            })
            .await;
        }));
        i += 1;
    }
    Ok(((running, stops, tasks), url, admin))
}

/// Stops what `local_net` started.
async fn stop_local(local: Option<LocalNet>, dir: &std::path::Path) {
    if let Some((running, stops, tasks)) = local {
        for s in stops {
            let _ = s.send(());
        }
        for t in tasks {
            let _ = t.await;
        }
        running.stop().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// One job's events.
async fn events(http: &reqwest::Client, url: &str, token: &str, id: u64) -> Result<Vec<serde_json::Value>> {
    json(http.get(format!("{url}/v1/jobs/{id}/events")).bearer_auth(token)).await
}

/// When the job's first event of `kind` happened, waiting up to 60 s for it.
async fn wait_event(http: &reqwest::Client, url: &str, token: &str, id: u64, kind: &str, nth: usize) -> Result<u64> {
    let t0 = std::time::Instant::now();
    loop {
        let ev = events(http, url, token, id).await?;
        if let Some(at) = ev.iter().filter(|e| e["kind"] == kind).nth(nth).and_then(|e| e["at_ms"].as_u64()) {
            return Ok(at);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("job {id} had no {kind} event within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `--preempt`: decision → preemptor's process start, over `--jobs` rounds.
async fn preempt_rounds(url: &str, token: &str, a: &E2eArgs) -> Result<()> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(8).build()?;
    ready(&http, url, token, a.slots).await?;
    let submit = |body: serde_json::Value| {
        let http = http.clone();
        async move {
            let v: serde_json::Value = json(
                http.post(format!("{url}/v1/jobs"))
                    .bearer_auth(token)
                    .header("content-type", "application/json")
                    .body(body.to_string()),
            )
            .await?;
            v["id"].as_u64().context("an id")
        }
    };
    let mut lat = Vec::with_capacity(a.jobs);
    for _ in 0..a.jobs {
        // The victim holds every slot; on SIGTERM its process ends at once; its next attempt exits 0.
        let low = submit(serde_json::json!({"name": "victim", "tenant": "bench-e2e", "gpus": a.slots,
            "cpu": "100m", "memory": "64Mi",
            "command": ["sh", "-c", "[ \"$GPUNET_ATTEMPT\" != 0 ] || exec sleep 300"]}))
        .await?;
        wait_event(&http, url, token, low, "process_started", 0).await?;
        // A victim has run a while: a SIGTERM that lands between the wrapper's fork and the task's exec is not seen by
        // the task (it then ends only at SIGKILL, after the grace period) — a known gap, not what this measures.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let high = submit(serde_json::json!({"name": "preemptor", "tenant": "bench-e2e", "gpus": a.slots,
            "priority": 10, "cpu": "100m", "memory": "64Mi", "command": ["true"]}))
        .await?;
        let started = wait_event(&http, url, token, high, "process_started", 0).await?;
        let decided = wait_event(&http, url, token, low, "stopping", 0).await?;
        lat.push(started.saturating_sub(decided) as f64);

        wait_event(&http, url, token, high, "succeeded", 0).await?;
        wait_event(&http, url, token, low, "succeeded", 0).await?;
    }
    lat.sort_by(f64::total_cmp);
    let (p50, p99) = (quantile(&lat, 0.5), quantile(&lat, 0.99));
    if a.output == "json" {
        println!("{}", serde_json::json!({"preempt_to_start_p50_ms": p50, "preempt_to_start_p99_ms": p99}));
    } else {
        println!("preempt_to_start_p50_ms  {p50:.1}");
        println!("preempt_to_start_p99_ms  {p99:.1}");
    }
    Ok(())
}

/// Waits (up to 30 s) until a ready node offers at least `gpus` GPUs, then makes sure tenant `bench-e2e` exists.
async fn ready(http: &reqwest::Client, url: &str, token: &str, gpus: usize) -> Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        let c: serde_json::Value = json(http.get(format!("{url}/v1/cluster")).bearer_auth(token)).await?;
        let have = c["gpus_total"].as_u64().unwrap_or(0) as usize;
        if c["nodes"]["ready"].as_u64().unwrap_or(0) > 0 && have >= gpus.max(1) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("no agent registered its GPUs within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = http
        .post(format!("{url}/v1/tenants"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(r#"{"name":"bench-e2e"}"#)
        .send()
        .await?;
    if !(r.status().is_success() || r.status().as_u16() == 409) {
        bail!("create tenant bench-e2e: {}", r.text().await?);
    }
    Ok(())
}
