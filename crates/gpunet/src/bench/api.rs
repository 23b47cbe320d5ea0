//! `gpunet bench api`: durable job submissions per second from concurrent clients against a running server.

use crate::bench::quantile;
use crate::client::send_to_leader;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ApiArgs {
    /// Server URL, or the URLs of several replicas comma-separated: each submission goes to the leader with its own
    /// idempotency key, retried with the same key through a failover.
    #[arg(long, default_value = "https://127.0.0.1:7070", env = "GPUNET_SERVER")]
    pub(crate) server: String,
    /// CA certificate (PEM) the server's certificate must chain to (default `GPUNET_CA`; else the system's roots).
    #[arg(long, env = "GPUNET_CA")]
    pub(crate) ca: Option<std::path::PathBuf>,
    /// Token: a tenant's, or the admin's (then jobs go to a tenant `bench`, created if missing).
    #[arg(long, env = "GPUNET_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
    /// Concurrent clients, each sending one submission at a time. Each waits for its submission's commit (about
    /// 1.5 ms on ext4 here), so a few clients measure the commit latency rather than the server: 16 cap near 10,000/s
    /// on that alone, while the server's group commit takes many more at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) clients: usize,
    /// Jobs in total.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) jobs: usize,
    /// Append each acknowledged job id to this file as soon as it is acknowledged.
    #[arg(long)]
    pub(crate) ids_file: Option<std::path::PathBuf>,
    /// table or json.
    #[arg(long, default_value = "table")]
    pub(crate) output: String,
}

/// What it measured.
#[derive(Debug, Serialize)]
pub(crate) struct ApiReport {
    /// Submissions acknowledged (durable).
    pub(crate) acknowledged: usize,
    /// Acknowledged submissions per second.
    pub(crate) submissions_per_s: f64,
    /// Median latency.
    pub(crate) p50_ms: f64,
    /// 99th percentile latency.
    pub(crate) p99_ms: f64,
    /// Submissions answered as replays of an earlier try (the same idempotency key: the first try was durable but
    /// its answer was lost, e.g. in a failover).
    pub(crate) replayed: usize,
    /// The longest time between two acknowledgements (across a failover: how long submissions stalled).
    pub(crate) longest_gap_ms: f64,
}

pub(crate) async fn run(a: ApiArgs) -> Result<()> {
    if !matches!(a.output.as_str(), "table" | "json") {
        bail!("invalid --output {:?}: allowed are table and json", a.output);
    }
    if a.clients == 0 || a.jobs == 0 {
        bail!("invalid --clients/--jobs: both must be at least 1");
    }
    let servers =
        gpunet_api::servers::ServerList::parse("--server", &a.server).map_err(|e| anyhow::anyhow!(e.message))?;
    let http = crate::client::http_client(a.ca.as_deref(), a.clients * 2)?;
    // An admin token submits for tenant `bench`.
    let who = send_to_leader(&servers, true, |base| http.get(format!("{base}/metrics")).bearer_auth(&a.token))
        .await
        .context("reach the server")?;
    let tenant_field = if who.status().is_success() {
        let r = send_to_leader(&servers, false, |base| {
            http.post(format!("{base}/v1/tenants"))
                .bearer_auth(&a.token)
                .header("content-type", "application/json")
                .body(r#"{"name":"bench"}"#)
        })
        .await?;
        if !(r.status().is_success() || r.status().as_u16() == 409) {
            bail!("create tenant bench: {}", r.text().await?);
        }
        r#","tenant":"bench""#
    } else {
        ""
    };
    let ids = match &a.ids_file {
        Some(p) => Some(Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("open {}", p.display()))?,
        ))),
        None => None,
    };
    let load = Load { http, servers, token: a.token.clone(), tenant_field: tenant_field.into(), ids };
    let r = load.submit(a.clients, a.jobs).await?;
    if a.output == "json" {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("acknowledged       {}", r.acknowledged);
        println!("submissions_per_s  {:.0}", r.submissions_per_s);
        println!("p50_ms             {:.2}", r.p50_ms);
        println!("p99_ms             {:.2}", r.p99_ms);
        println!("replayed           {}", r.replayed);
        println!("longest_gap_ms     {:.0}", r.longest_gap_ms);
    }
    Ok(())
}

/// Where and as whom submissions go.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) http: reqwest::Client,
    pub(crate) servers: gpunet_api::servers::ServerList,
    pub(crate) token: String,
    /// `,"tenant":"…"` for an admin token, else empty.
    pub(crate) tenant_field: String,
    pub(crate) ids: Option<Arc<Mutex<std::fs::File>>>,
}

impl Load {
    /// Submits `jobs` trivial one-GPU jobs from `clients` concurrent clients, one at a time each, with an idempotency
    /// key each; measures until the last is acknowledged.
    pub(crate) async fn submit(&self, clients: usize, jobs: usize) -> Result<ApiReport> {
        let tenant_field = &self.tenant_field;
        let t0 = Instant::now();
        let mut handles = Vec::new();
        for c in 0..clients {
            let n = jobs / clients + usize::from(c < jobs % clients);
            let (http, servers, token, ids) =
                (self.http.clone(), self.servers.clone(), self.token.clone(), self.ids.clone());
            let body = format!(r#"{{"name":"bench-{c}","gpus":1,"command":["true"]{tenant_field}}}"#);
            handles.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(n);
                let mut acks = Vec::with_capacity(n);
                let mut replayed = 0usize;
                for _ in 0..n {
                    let t = Instant::now();
                    let key = crate::client::new_idempotency_key();
                    let r = send_to_leader(&servers, true, |base| {
                        http.post(format!("{base}/v1/jobs"))
                            .bearer_auth(&token)
                            .header("content-type", "application/json")
                            .header("idempotency-key", &key)
                            .body(body.clone())
                    })
                    .await;
                    let Ok(r) = r else { break };
                    match r.status().as_u16() {
                        201 => {}
                        200 if r.headers().contains_key("idempotent-replayed") => replayed += 1,
                        _ => break,
                    }
                    let v: serde_json::Value = r.json().await.unwrap_or_default();
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    acks.push(t0.elapsed().as_secs_f64() * 1e3);
                    if let (Some(ids), Some(id)) = (&ids, v["id"].as_u64()) {
                        let mut f = ids.lock().expect("ids file lock");
                        let _ = writeln!(f, "{id}");
                        let _ = f.flush();
                    }
                }
                (lat, acks, replayed)
            }));
        }
        let (mut lat, mut acks, mut replayed) = (Vec::new(), vec![0.0], 0);
        for h in handles {
            let (l, a, r) = h.await?;
            lat.extend(l);
            acks.extend(a);
            replayed += r;
        }
        acks.sort_by(f64::total_cmp);
        let longest_gap_ms = acks.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        let secs = t0.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        let r = ApiReport {
            acknowledged: lat.len(),
            submissions_per_s: lat.len() as f64 / secs,
            p50_ms: quantile(&lat, 0.5),
            p99_ms: quantile(&lat, 0.99),
            replayed,
            longest_gap_ms,
        };
        Ok(r)
    }
}
