//! The CLI's side of the API: `gpunet submit | jobs | show | cancel | why | tenants | quota | nodes | cordon | drain |
//! uncordon | bill`. The server URL, token and CA come from flags, then `GPUNET_SERVER` / `GPUNET_TOKEN` / `GPUNET_CA`,
//! then the config file (`$GPUNET_CONFIG`, else `~/.config/gpunet/config.toml` with `server = "…"`, `token = "…"` and
//! `ca = "…"`). With a CA file, the server's certificate must chain to it (and nothing else); without one, to the
//! system's roots.
//!
//! The server may be several replicas (`--server URL,URL`, see `gpunet_api::servers`): requests go to the leader — a
//! standby's redirect is followed to the replica it names when that one is in the list, and an unreachable or
//! leaderless replica makes the client try the next — for up to [`FAILOVER_WAIT`]. A request that may have reached
//! a server is sent again only when that is safe: reads, and submissions, which carry an `Idempotency-Key` (one per
//! `gpunet submit`, the same on every try) so that a retry after a failover returns the job the first try made.

use crate::cli::output::Output;
use anyhow::{bail, Context, Result};
use gpunet_api::types::*;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// Connection flags shared by every client command.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Conn {
    /// Server URL, or the URLs of several replicas comma-separated (default `GPUNET_SERVER`, the config file, then
    /// https://127.0.0.1:7070).
    #[arg(long, global = true)]
    pub(crate) server: Option<String>,
    /// CA certificate (PEM) the server's certificate must chain to (default `GPUNET_CA`, then the config file).
    #[arg(long, global = true)]
    pub(crate) ca: Option<PathBuf>,
    /// Bearer token (default `GPUNET_TOKEN`, then the config file).
    #[arg(long, global = true)]
    pub(crate) token: Option<String>,
    /// table, wide (more columns), json or yaml; `gpunet report` takes table, json or csv.
    #[arg(short = 'o', long, global = true, default_value = "table")]
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

/// How long a request keeps trying the replicas (a failover takes a few seconds).
pub(crate) const FAILOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A connected client.
pub(crate) struct Client {
    servers: gpunet_api::servers::ServerList,
    token: Option<String>,
    http: reqwest::Client,
    pub(crate) output: Output,
}

/// A fresh idempotency key: 128 random bits, hex.
pub(crate) fn new_idempotency_key() -> String {
    gpunet_server::new_token()[4..36].to_string()
}

/// Sends what `make` builds to the leader among `servers` (see the module's doc): follows a standby's redirect within
/// the list, moves to the next server when one is unreachable or answers 503 with `Retry-After` (no leader yet, or
/// one recovering), until [`FAILOVER_WAIT`]. After an error that may have reached the server — a 503 of the leader
/// itself among them — it sends again only when `resend` (a read, or a submission with an idempotency key).
pub(crate) async fn send_to_leader(
    servers: &gpunet_api::servers::ServerList,
    resend: bool,
    make: impl Fn(&str) -> reqwest::RequestBuilder,
) -> Result<reqwest::Response> {
    let deadline = std::time::Instant::now() + FAILOVER_WAIT;
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        let base = servers.current().to_string();
        let last_try = std::time::Instant::now() >= deadline;
        match make(&base).send().await {
            Ok(r) if matches!(r.status().as_u16(), 307 | 308) => {
                let to = r.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                if !servers.follow(&to) {
                    bail!(
                        "the server at {base} is a standby and sends clients to {to:?}, which is not among the servers                          given (--server / GPUNET_SERVER): add it to the list"
                    );
                }
                if last_try {
                    bail!("no leader answered within {}s (last: {base} redirected to {to})", FAILOVER_WAIT.as_secs());
                }
                continue;
            }
            // A 503 with `Retry-After`: the replicas' gate (`Gpunet-Role`: no leader yet, or one recovering) never
            // let the request through, so any request goes again; the leader's own (its store refused a write, whose
            // outcome is unknown) only a request that may be sent twice.
            Ok(r)
                if r.status().as_u16() == 503
                    && r.headers().contains_key("retry-after")
                    && (resend || r.headers().contains_key("gpunet-role"))
                    && !last_try =>
            {
                let leader = r.headers().get("gpunet-leader").and_then(|v| v.to_str().ok()).map(String::from);
                if !leader.is_some_and(|l| servers.follow(&l) && servers.current() != base) {
                    servers.rotate();
                }
            }
            Ok(r) => return Ok(r),
            Err(e) if (e.is_connect() || resend) && !last_try => {
                tracing::debug!(server = %base, error = %e, "server unreachable; trying the next");
                servers.rotate();
            }
            Err(e) => return Err(e).with_context(|| format!("reach the server at {base}")),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(500));
    }
}

impl Client {
    pub(crate) fn new(c: &Conn) -> Result<Client> {
        let file = config_file()?;
        let list = c
            .server
            .clone()
            .or_else(|| std::env::var("GPUNET_SERVER").ok())
            .or(file.server)
            .unwrap_or_else(|| "https://127.0.0.1:7070".into());
        let servers =
            gpunet_api::servers::ServerList::parse("--server", &list).map_err(|e| anyhow::anyhow!(e.message))?;
        let token = c.token.clone().or_else(|| std::env::var("GPUNET_TOKEN").ok()).or(file.token);
        let ca = c.ca.clone().or_else(|| std::env::var_os("GPUNET_CA").map(PathBuf::from)).or(file.ca);
        let output = Output::parse(&c.output)?;
        Ok(Client { servers, token, http: http_client(ca.as_deref(), 64)?, output })
    }

    /// A request to `base`, with the token.
    fn req(&self, base: &str, m: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(m, format!("{base}{path}"));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends to the leader (see [`send_to_leader`]); a request whose body is `Some((content type, body))`.
    async fn call(
        &self,
        m: reqwest::Method,
        path: &str,
        body: Option<(&str, String)>,
        key: Option<&str>,
    ) -> Result<reqwest::Response> {
        let resend = m == reqwest::Method::GET || key.is_some();
        send_to_leader(&self.servers, resend, |base| {
            let mut r = self.req(base, m.clone(), path);
            if let Some((ctype, b)) = &body {
                r = r.header("content-type", *ctype).body(b.clone());
            }
            if let Some(k) = key {
                r = r.header("idempotency-key", k);
            }
            r
        })
        .await
    }

    async fn answer<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T> {
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

    /// Hands a streamed answer to `sink` as it arrives.
    pub(crate) async fn stream(&self, path: &str, mut sink: impl FnMut(&[u8])) -> Result<()> {
        let mut resp = self.call(reqwest::Method::GET, path, None, None).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.bytes().await?;
            if let Ok(e) = serde_json::from_slice::<gpunet_api::ErrorBody>(&body) {
                bail!("{} ({})", e.error.message, status.as_u16());
            }
            bail!("the server answered {status}");
        }
        while let Some(chunk) = resp.chunk().await? {
            sink(&chunk);
        }
        Ok(())
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Client::answer(self.call(reqwest::Method::GET, path, None, None).await?).await
    }

    pub(crate) async fn post<T: DeserializeOwned>(&self, path: &str, body: Option<String>, ctype: &str) -> Result<T> {
        Client::answer(self.call(reqwest::Method::POST, path, body.map(|b| (ctype, b)), None).await?).await
    }

    /// A submission: sent with an idempotency key, the same on every try (a retry after a failover returns the job
    /// the first try made).
    pub(crate) async fn submit<T: DeserializeOwned>(&self, path: &str, body: String, ctype: &str) -> Result<T> {
        let key = new_idempotency_key();
        Client::answer(self.call(reqwest::Method::POST, path, Some((ctype, body)), Some(&key)).await?).await
    }

    pub(crate) async fn put<T: DeserializeOwned>(&self, path: &str, body: String) -> Result<T> {
        Client::answer(self.call(reqwest::Method::PUT, path, Some(("application/yaml", body)), None).await?).await
    }
}

/// An HTTP client that trusts only the CA in `ca` when given (else the system's roots).
pub(crate) fn http_client(ca: Option<&std::path::Path>, idle_per_host: usize) -> Result<reqwest::Client> {
    // Redirects are the replicas' (a standby's 307 to the leader): followed by `send_to_leader`, within the list.
    let mut b =
        reqwest::Client::builder().pool_max_idle_per_host(idle_per_host).redirect(reqwest::redirect::Policy::none());
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

/// Text another user chose (a job's name, stored before the API refused such names; a message quoting a job's
/// text), as a terminal may show it: [`gpunet_api::spec::escape_unprintable`].
pub(crate) use gpunet_api::spec::escape_unprintable as printable;

/// Prints a table with a header and right-padded columns; cells are made [`printable`].
pub(crate) fn table(head: &[&str], rows: Vec<Vec<String>>) -> String {
    let rows: Vec<Vec<String>> =
        rows.into_iter().map(|r| r.into_iter().map(|c| printable(&c).into_owned()).collect()).collect();
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
/// else the first unsuccessful job's (in the order given), see [`job_exit_code`]. Each job's end is printed to
/// standard error.
pub(crate) async fn wait_for_jobs(c: &Client, ids: &[u64]) -> Result<i32> {
    const ENDED: [&str; 3] = ["succeeded", "failed", "cancelled"];
    let mut states: Vec<Option<String>> = vec![None; ids.len()];
    loop {
        for (i, id) in ids.iter().enumerate() {
            if states[i].is_none() {
                let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
                if ENDED.contains(&j.state.as_str()) {
                    crate::say!("job-{id} {}", j.state);
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
    job_exit_code(c, ids[i]).await
}

/// The exit code that stands for an ended job: 0 when it succeeded; else its last attempt's failing rank's exit
/// code (1 to 255), 128+N when a signal N killed it; 1 when it has none (cancelled, a dependency never satisfied,
/// an array, an OOM or a failed probe without a code).
pub(crate) async fn job_exit_code(c: &Client, id: u64) -> Result<i32> {
    let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
    if j.state == "succeeded" {
        return Ok(0);
    }
    if j.state == "failed" {
        if let Some(a) = j.attempts.iter().rev().find(|a| a.outcome.as_deref().is_some_and(|o| o != "succeeded")) {
            match (a.exit_code, a.signal) {
                (Some(code), _) if code != 0 => return Ok(code.clamp(1, 255)),
                (_, Some(sig)) => return Ok(128 + sig.clamp(1, 127)),
                _ => {}
            }
        }
    }
    if j.state == "cancelled" || !j.attempts.is_empty() {
        return Ok(1);
    }
    // A job from before attempts were recorded: its end event.
    let events: Vec<serde_json::Value> = c.get(&format!("/v1/jobs/{id}/events")).await?;
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
            let runs = if n == 1 { "run" } else { "runs" };
            let spread = e.spread.map(|s| format!(", spread ×{:.1}", s.exp())).unwrap_or_default();
            let probe = e
                .probe_s
                .map(|p| format!("; ranked as a {p}s first stint (probe) until it has run that long"))
                .unwrap_or_default();
            format!(
                "estimated run time {}s, learned from {b} ({n} {runs}, confidence {c:.2}{spread}){probe}\n",
                e.seconds
            )
        }
        ("probe", ..) => format!(
            "no estimate: ranked as a {}s first stint (probe), then as running as long again as it has run\n",
            e.seconds
        ),
        _ => format!("estimated run time {}s ({})\n", e.seconds, e.source),
    }
}

#[cfg(test)]
mod estimate_tests {
    #[test]
    fn a_learned_estimate_says_where_it_came_from_and_its_probe() {
        let mut e = gpunet_api::types::EstimateView {
            seconds: 3600,
            source: "learned".into(),
            confidence: Some(0.5),
            basis: Some("the user's runs".into()),
            samples: Some(4),
            spread: Some(1.0),
            probe_s: None,
        };
        let line = super::estimate_line(&e);
        assert_eq!(
            line,
            "estimated run time 3600s, learned from the user's runs (4 runs, confidence 0.50, spread ×2.7)\n"
        );
        e.probe_s = Some(900);
        assert!(
            super::estimate_line(&e).ends_with("; ranked as a 900s first stint (probe) until it has run that long\n")
        );
        let none = gpunet_api::types::EstimateView { seconds: 900, source: "probe".into(), ..e };
        assert_eq!(
            super::estimate_line(&none),
            "no estimate: ranked as a 900s first stint (probe), then as running as long again as it has run\n"
        );
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

    /// A stored name with an escape sequence (from before the API refused them) is shown escaped: the row it
    /// tried to erase stays, and no forged row appears.
    #[test]
    fn a_table_shows_control_characters_escaped() {
        let forged = "x\u{1b}[1A\r\u{1b}[2K999  teamb  steal\nrow".to_string();
        let out = super::table(&["ID", "NAME"], vec![vec!["7".into(), forged], vec!["8".into(), "日本".into()]]);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(out.contains(r"x\u{1b}[1A\r\u{1b}[2K999  teamb  steal\nrow"), "{out}");
        assert!(out.contains("8   日本"), "{out}");
    }
}

#[cfg(test)]
mod resend_tests {
    use super::send_to_leader;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every request with 503 and `Retry-After` (with `Gpunet-Role` when `gate`), counting them.
    async fn unavailable(gate: bool) -> (String, Arc<AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let n = Arc::new(AtomicUsize::new(0));
        let count = n.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(k) = s.read(&mut buf).await {
                        if k == 0 {
                            return;
                        }
                        count.fetch_add(1, Ordering::SeqCst);
                        let role = if gate { "gpunet-role: standby\r\n" } else { "" };
                        let body = r#"{"error":{"code":"unavailable","message":"no"}}"#;
                        let head = format!(
                            "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n{role}content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        if s.write_all(format!("{head}{body}").as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, n)
    }

    /// The leader's own 503 (its store refused a write whose outcome is unknown) is not resent for a request that
    /// must not be sent twice (a token's creation, a tenant's): it is returned at once. A read or a keyed submission
    /// is resent, and so is anything after the gate's 503 (`Gpunet-Role`), which reached no owner.
    #[tokio::test]
    async fn a_leaders_503_is_resent_only_for_what_may_be_sent_twice() {
        let http = reqwest::Client::new();
        let (url, n) = unavailable(false).await;
        let servers = gpunet_api::servers::ServerList::parse("server", &url).unwrap();
        let r = send_to_leader(&servers, false, |b| http.post(format!("{b}/v1/tokens"))).await.unwrap();
        assert_eq!((r.status().as_u16(), n.load(Ordering::SeqCst)), (503, 1));
        for (gate, resend) in [(false, true), (true, false)] {
            let (url, n) = unavailable(gate).await;
            let servers = gpunet_api::servers::ServerList::parse("server", &url).unwrap();
            let sent = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                send_to_leader(&servers, resend, |b| http.post(format!("{b}/v1/jobs"))),
            )
            .await;
            assert!(sent.is_err(), "still retrying after 2 s");
            assert!(n.load(Ordering::SeqCst) >= 2, "gate {gate}, resend {resend}: sent {}", n.load(Ordering::SeqCst));
        }
    }
}
