//! The CLI's side of the API: `gpunet submit | jobs | show | cancel | why | tenants | quota | nodes | cordon | drain |
//! uncordon | bill`. The server URL, token and CA come from flags, then `GPUNET_SERVER` / `GPUNET_TOKEN` / `GPUNET_CA`,
//! then the config file (`$GPUNET_CONFIG`, else `~/.config/gpunet/config.toml` with `server = "…"`, `token = "…"` and
//! `ca = "…"`). With a CA file, the server's certificate must chain to it (and nothing else); without one, to the
//! system's roots.

use anyhow::{bail, Context, Result};
use gpunet_api::types::*;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// Connection flags shared by every client command.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Conn {
    /// Server URL (default `GPUNET_SERVER`, the config file, then https://127.0.0.1:7070).
    #[arg(long, global = true)]
    pub(crate) server: Option<String>,
    /// CA certificate (PEM) the server's certificate must chain to (default `GPUNET_CA`, then the config file).
    #[arg(long, global = true)]
    pub(crate) ca: Option<PathBuf>,
    /// Bearer token (default `GPUNET_TOKEN`, then the config file).
    #[arg(long, global = true)]
    pub(crate) token: Option<String>,
    /// table or json.
    #[arg(long, global = true, default_value = "table")]
    pub(crate) output: String,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    server: Option<String>,
    token: Option<String>,
    ca: Option<PathBuf>,
}

fn config_file() -> Result<ConfigFile> {
    let path = std::env::var_os("GPUNET_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/gpunet/config.toml")));
    match path {
        Some(p) if p.exists() => {
            let text = std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("parse {}", p.display()))
        }
        _ => Ok(ConfigFile::default()),
    }
}

/// A connected client.
pub(crate) struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    pub(crate) json: bool,
}

impl Client {
    pub(crate) fn new(c: &Conn) -> Result<Client> {
        let file = config_file()?;
        let base = c
            .server
            .clone()
            .or_else(|| std::env::var("GPUNET_SERVER").ok())
            .or(file.server)
            .unwrap_or_else(|| "https://127.0.0.1:7070".into());
        let token = c.token.clone().or_else(|| std::env::var("GPUNET_TOKEN").ok()).or(file.token);
        let ca = c.ca.clone().or_else(|| std::env::var_os("GPUNET_CA").map(PathBuf::from)).or(file.ca);
        if !matches!(c.output.as_str(), "table" | "json") {
            bail!("invalid --output {:?}: allowed are table and json", c.output);
        }
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            token,
            http: http_client(ca.as_deref(), 64)?,
            json: c.output == "json",
        })
    }

    fn req(&self, m: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(m, format!("{}{}", self.base, path));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn send<T: DeserializeOwned>(&self, r: reqwest::RequestBuilder) -> Result<T> {
        let resp = r.send().await.with_context(|| format!("reach the server at {}", self.base))?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if !status.is_success() {
            if let Ok(e) = serde_json::from_slice::<gpunet_api::ErrorBody>(&body) {
                bail!("{} ({})", e.error.message, status.as_u16());
            }
            bail!("the server answered {status}: {}", String::from_utf8_lossy(&body));
        }
        serde_json::from_slice(&body).context("decode the server's answer")
    }

    /// Copies a streamed text answer to standard output as it arrives.
    pub(crate) async fn stream(&self, path: &str) -> Result<()> {
        use std::io::Write as _;
        let mut resp = self
            .req(reqwest::Method::GET, path)
            .send()
            .await
            .with_context(|| format!("reach the server at {}", self.base))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.bytes().await?;
            if let Ok(e) = serde_json::from_slice::<gpunet_api::ErrorBody>(&body) {
                bail!("{} ({})", e.error.message, status.as_u16());
            }
            bail!("the server answered {status}");
        }
        let mut out = std::io::stdout();
        while let Some(chunk) = resp.chunk().await? {
            out.write_all(&chunk)?;
            out.flush()?;
        }
        Ok(())
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send(self.req(reqwest::Method::GET, path)).await
    }

    pub(crate) async fn post<T: DeserializeOwned>(&self, path: &str, body: Option<String>, ctype: &str) -> Result<T> {
        let mut r = self.req(reqwest::Method::POST, path);
        if let Some(b) = body {
            r = r.header("content-type", ctype).body(b);
        }
        self.send(r).await
    }

    pub(crate) async fn put<T: DeserializeOwned>(&self, path: &str, body: String) -> Result<T> {
        self.send(self.req(reqwest::Method::PUT, path).header("content-type", "application/yaml").body(body)).await
    }
}

/// An HTTP client that trusts only the CA in `ca` when given (else the system's roots).
pub(crate) fn http_client(ca: Option<&std::path::Path>, idle_per_host: usize) -> Result<reqwest::Client> {
    let mut b = reqwest::Client::builder().pool_max_idle_per_host(idle_per_host);
    if let Some(p) = ca {
        let pem = std::fs::read(p).with_context(|| format!("read the CA file {}", p.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parse the CA file {}: allowed is PEM", p.display()))?;
        if certs.is_empty() {
            bail!("invalid CA file {}: no PEM certificate in it", p.display());
        }
        b = b.tls_certs_only(certs);
    }
    Ok(b.build()?)
}

/// Prints a table with a header and right-padded columns.
pub(crate) fn table(head: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(head.to_vec()) + "\n";
    for r in &rows {
        out += &(line(r.iter().map(String::as_str).collect()) + "\n");
    }
    out
}

fn ago(ms: u64) -> String {
    let now = gpunet_server::now_ms();
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

pub(crate) fn jobs_table(jobs: &[JobView]) -> String {
    table(
        &["ID", "TENANT", "NAME", "STATE", "GPUS", "TASKS", "SUBMITTED", "NODES"],
        jobs.iter()
            .map(|j| {
                let mut nodes: Vec<&str> = j.placement.iter().map(|t| t.node.as_str()).collect();
                nodes.dedup();
                vec![
                    match (j.array_job_id, j.array_index) {
                        (Some(a), Some(i)) => format!("{}  ({a}[{i}])", j.id),
                        _ => j.id.to_string(),
                    },
                    j.tenant.clone(),
                    match &j.array {
                        Some(a) => format!("{} [{} elements]", j.name, a.total),
                        None => j.name.clone(),
                    },
                    j.state.clone(),
                    j.gpus.to_string(),
                    j.tasks.to_string(),
                    ago(j.submitted_ms),
                    nodes.join(","),
                ]
            })
            .collect(),
    )
}

pub(crate) fn nodes_table(nodes: &[NodeView]) -> String {
    table(
        &["NAME", "STATE", "MODEL", "GPUS", "FREE", "ZONE", "LIFECYCLE", "PRICE/GPU-H", "JOBS", "FAKE"],
        nodes
            .iter()
            .map(|n| {
                vec![
                    n.name.clone(),
                    n.state.clone(),
                    n.gpu_model.clone().unwrap_or_else(|| "-".into()),
                    n.gpus.to_string(),
                    n.free_gpus.to_string(),
                    n.labels.get("zone").cloned().unwrap_or_default(),
                    n.labels.get("lifecycle").cloned().unwrap_or_default(),
                    format!("{:.2}", n.price_per_gpu_hour),
                    n.jobs.len().to_string(),
                    if n.fake { "yes".into() } else { "no".into() },
                ]
            })
            .collect(),
    )
}

pub(crate) fn tenants_table(ts: &[TenantView]) -> String {
    table(
        &["TENANT", "WEIGHT", "GPUS USED", "GUARANTEE", "LIMIT", "QUEUED", "RUNNING", "COHORT"],
        ts.iter()
            .map(|t| {
                let q = t.quota.clone().unwrap_or_default();
                vec![
                    t.name.clone(),
                    format!("{}", t.weight),
                    t.gpus_used.to_string(),
                    q.guarantee_gpus.map_or("-".into(), |g| g.to_string()),
                    q.limit_gpus.or(q.guarantee_gpus).map_or("-".into(), |g| g.to_string()),
                    t.queued.to_string(),
                    t.running.to_string(),
                    t.cohort.clone().unwrap_or_default(),
                ]
            })
            .collect(),
    )
}

/// A job id as the CLI takes it: `42`, `job-42`, or an array element `42[3]` (`job-42[3]`), which is looked up as the
/// array's element with index 3 (element `k` of array `A`, the `k`-th index, is job `A+1+k`).
pub(crate) async fn resolve_job_id(c: &Client, text: &str) -> Result<u64> {
    let r = gpunet_api::depsyntax::parse_job_ref("id", text).map_err(|e| anyhow::anyhow!(e.message))?;
    let Some(index) = r.index else { return Ok(r.id) };
    let j: JobView = c.get(&format!("/v1/jobs/{}", r.id)).await?;
    let spec = j.spec.array.as_deref().ok_or_else(|| anyhow::anyhow!("job-{} is not an array", r.id))?;
    let a = gpunet_api::depsyntax::parse_array("array", spec).map_err(|e| anyhow::anyhow!(e.message))?;
    let k = a.indices.binary_search(&index).map_err(|_| anyhow::anyhow!("array job-{} has no index {index}", r.id))?;
    Ok(r.id + 1 + k as u64)
}

/// Polls the jobs until every one has ended; returns the exit code `gpunet wait` exits with: 0 when all succeeded,
/// else the first unsuccessful job's (in the order given) — its failing rank's exit code, 128+N for signal N, 1
/// otherwise. Each job's end is printed to standard error.
pub(crate) async fn wait_for_jobs(c: &Client, ids: &[u64]) -> Result<i32> {
    const ENDED: [&str; 3] = ["succeeded", "failed", "cancelled"];
    let mut states: Vec<Option<String>> = vec![None; ids.len()];
    loop {
        for (i, id) in ids.iter().enumerate() {
            if states[i].is_none() {
                let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
                if ENDED.contains(&j.state.as_str()) {
                    eprintln!("job-{id} {}", j.state);
                    states[i] = Some(j.state);
                }
            }
        }
        if states.iter().all(Option::is_some) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let Some(i) = states.iter().position(|s| s.as_deref() != Some("succeeded")) else { return Ok(0) };
    let events: Vec<serde_json::Value> = c.get(&format!("/v1/jobs/{}/events", ids[i])).await?;
    Ok(events.iter().rev().filter_map(|e| e["message"].as_str()).find_map(exit_code_of).unwrap_or(1))
}

/// The exit code an attempt's end event names: "exited with code C" → C (1 to 255), "killed by signal S" → 128+S.
fn exit_code_of(message: &str) -> Option<i32> {
    let num = |after: &str| -> Option<i32> {
        let rest = &message[message.find(after)? + after.len()..];
        rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
    };
    num("exited with code ")
        .map(|c: i32| c.clamp(1, 255))
        .or_else(|| num("killed by signal ").map(|s| 128 + s.min(127)))
}

/// One line describing a job's run-time estimate, given or learned.
pub(crate) fn estimate_line(e: &gpunet_api::types::EstimateView) -> String {
    match (e.source.as_str(), e.confidence, &e.basis, e.samples) {
        ("learned", Some(c), Some(b), Some(n)) => {
            format!("estimated run time {}s, learned from {b} ({n} runs, confidence {c:.2})\n", e.seconds)
        }
        _ => format!("estimated run time {}s ({})\n", e.seconds, e.source),
    }
}

#[cfg(test)]
mod wait_tests {
    #[test]
    fn exit_codes_come_from_the_end_event() {
        assert_eq!(super::exit_code_of("job-4 failed: rank 0 exited with code 3"), Some(3));
        assert_eq!(super::exit_code_of("job-4 failed: rank 1 was killed by signal 9"), Some(137));
        assert_eq!(super::exit_code_of("job-4 failed: rank 0 exited with code 300"), Some(255));
        assert_eq!(super::exit_code_of("job-4 cancelled"), None);
    }
}
