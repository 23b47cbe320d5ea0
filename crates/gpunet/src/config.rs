//! The server's configuration file (`gpunet server --config FILE`): one TOML document with a key for every flag of
//! `gpunet server`, named like the flag (`--node-fence-s` → `node_fence_s`; `--no-backfill` → `backfill = false`).
//! A flag (or its `GPUNET_*` environment variable) wins over the file, the file over the default. Unknown keys are
//! an error naming the key. Relative paths are relative to the server's working directory, as they are on the command
//! line.
//! `gpunet admin config` prints [`template`]: every key with its default.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The only version of the file format so far.
pub(crate) const VERSION: u32 = 1;

/// How log lines are written (to standard error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    /// Human-readable lines; colours only when standard error is a terminal.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// The file's contents: every key optional, each with the default of its flag.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ServerFile {
    /// Format version (1).
    pub(crate) version: u32,
    pub(crate) data_dir: PathBuf,
    pub(crate) store: Option<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) admin_token: Option<String>,
    pub(crate) join_token: Option<String>,
    /// Absent: the `sched_config` file's policy, else auto.
    pub(crate) policy: Option<String>,
    pub(crate) sched_config: Option<PathBuf>,
    pub(crate) backfill: bool,
    pub(crate) node_lost_after_s: f64,
    pub(crate) node_fence_s: f64,
    pub(crate) restart_backoff_s: f64,
    pub(crate) preempt_min_run_s: f64,
    pub(crate) checkpoint_roots: Vec<String>,
    pub(crate) max_queued_jobs_per_tenant: usize,
    pub(crate) max_spec_bytes_per_tenant: u64,
    pub(crate) max_streams_per_token: usize,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) insecure_http: bool,
    pub(crate) max_connections: usize,
    pub(crate) header_timeout_s: f64,
    pub(crate) prices: Option<PathBuf>,
    pub(crate) advertise: Option<String>,
    pub(crate) lease_ttl_s: f64,
    pub(crate) lease_renew_s: f64,
    pub(crate) lease_poll_s: f64,
    pub(crate) log_format: LogFormat,
    /// Node pools the server grows and shrinks (`[[pools]]`; file only).
    pub(crate) pools: Vec<gpunet_server::pools::PoolConfig>,
    /// The URL pool agents reach this server at (default: its own address); file only.
    pub(crate) pool_agent_server: Option<String>,
    /// The CA certificate pool agents verify the server with (default: `tls_cert`); file only.
    pub(crate) pool_agent_ca: Option<PathBuf>,
    /// What to warn about once logging is set up (e.g. a file holding a token that others can read).
    #[serde(skip)]
    pub(crate) warnings: Vec<String>,
    /// Whether `--preempt-min-run-s` and `--restart-backoff-s` were given on the command line: one that was, even at
    /// its default, must agree with a `--sched-config` file's value (set at its default, it was overridden
    /// quietly). Never read from a file.
    #[serde(skip)]
    pub(crate) flags_given: crate::SchedFlagsGiven,
}

impl Default for ServerFile {
    fn default() -> ServerFile {
        ServerFile {
            version: VERSION,
            data_dir: PathBuf::from("gpunet-data"),
            store: None,
            listen: "127.0.0.1:7070".parse().expect("valid address"),
            admin_token: None,
            join_token: None,
            policy: None,
            sched_config: None,
            backfill: true,
            node_lost_after_s: 10.0,
            node_fence_s: 60.0,
            restart_backoff_s: 10.0,
            preempt_min_run_s: 300.0,
            checkpoint_roots: Vec::new(),
            max_queued_jobs_per_tenant: gpunet_server::DEFAULT_MAX_QUEUED_JOBS_PER_TENANT,
            max_spec_bytes_per_tenant: gpunet_server::DEFAULT_MAX_SPEC_BYTES_PER_TENANT,
            max_streams_per_token: gpunet_server::DEFAULT_MAX_STREAMS_PER_TOKEN,
            tls_cert: None,
            tls_key: None,
            insecure_http: false,
            max_connections: 768,
            header_timeout_s: 10.0,
            prices: None,
            advertise: None,
            lease_ttl_s: 4.0,
            lease_renew_s: 1.0,
            lease_poll_s: 0.25,
            log_format: LogFormat::Text,
            pools: Vec::new(),
            pool_agent_server: None,
            pool_agent_ca: None,
            warnings: Vec::new(),
            flags_given: crate::SchedFlagsGiven::default(),
        }
    }
}

impl ServerFile {
    /// Parses a file's text.
    pub(crate) fn parse(text: &str) -> Result<ServerFile> {
        let f: ServerFile = toml::from_str(text)?;
        if f.version != VERSION {
            bail!("invalid version {}: allowed is {VERSION}", f.version);
        }
        if f.tls_cert.is_some() != f.tls_key.is_some() {
            bail!("invalid tls_cert / tls_key: give both or neither");
        }
        Ok(f)
    }

    /// Reads and parses `path`; the error names the file (and, from the parser, the line and the key).
    pub(crate) fn load(path: &Path) -> Result<ServerFile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read --config {}", path.display()))?;
        let mut f = ServerFile::parse(&text).with_context(|| format!("invalid --config {}", path.display()))?;
        f.warnings.extend(readable_secret(path, &text));
        Ok(f)
    }
}

/// A file holding a token should be its owner's alone (like the token files the server writes): the warning if not.
fn readable_secret(path: &Path, text: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let has_secret = text.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with("admin_token") || l.starts_with("join_token") || l.starts_with("store")
    });
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (has_secret && mode & 0o077 != 0)
        .then(|| format!("{} holds a token or store URL and other users can read it (chmod 600 it)", path.display()))
}

/// The configuration file with every key at its default (what `gpunet admin config` prints). Optional keys are
/// commented out.
pub(crate) fn template() -> String {
    let d = ServerFile::default();
    format!(
        r#"# gpunet server configuration (`gpunet server --config FILE`). Every key is optional and has the default shown;
# a command-line flag (or its GPUNET_* environment variable) wins over this file. Keys are named like the flags.
# Relative paths are relative to the server's working directory. Unknown keys are an error.
version = {version}

# Data directory: the SQLite database (unless `store` names another), TLS files, the lock file.
data_dir = "{data_dir}"
# Where the state is kept: "postgres://USER[:PASSWORD]@HOST[:PORT]/DB" or "sqlite://DIR" (default: SQLite in
# data_dir). Env: GPUNET_STORE. A file holding a password or token should be mode 0600.
# store = "postgres://gpunet@db.example/gpunet"
# Listen address.
listen = "{listen}"
# Admin and agent join tokens (env GPUNET_ADMIN_TOKEN, GPUNET_JOIN_TOKEN); generated and printed once if none is
# stored. Giving a new one revokes the old one at start.
# admin_token = "…"
# join_token = "…"

# Scheduling: policy (auto — SRGF with eviction for jobs 8x shorter, defragmentation and a 15-minute probe, see
# docs/scheduler.md —
# or fifo, priority, sjf, srtf, srgf, drf, fairshare, las; default: the sched_config file's, else auto) and EASY
# backfill.
# policy = "auto"
backfill = {backfill}
# Scheduler knobs (a TOML file with a [scheduler] table: policy, backfill, preemptive, defragment, probe, LAS thresholds,
# minimum run time, eviction rate limit, restart backoff, tick; see docs/scheduler.md). policy and backfill = false
# here win over the file; its minimum run time and restart backoff apply over the defaults of preempt_min_run_s and
# restart_backoff_s (set to other values here too, the server refuses to start).
# sched_config = "/etc/gpunet/scheduler.toml"
# Seconds without a sync after which an agent's node is lost and its jobs restart elsewhere.
node_lost_after_s = {node_lost_after_s:?}
# Seconds a lost node's tasks stay fenced waiting for its agent to confirm them killed.
node_fence_s = {node_fence_s:?}
# Seconds before the first restart of a failed job (doubling after each restart).
restart_backoff_s = {restart_backoff_s:?}
# A job that has run less than this many seconds is never preempted.
preempt_min_run_s = {preempt_min_run_s:?}
# Where checkpoint tiers may go: "file:///srv/ckpt/{{tenant}}" or "s3://bucket/{{tenant}}/".
checkpoint_roots = []

# Per-tenant and per-token bounds (more get 429).
max_queued_jobs_per_tenant = {max_queued_jobs_per_tenant}
max_spec_bytes_per_tenant = {max_spec_bytes_per_tenant}
max_streams_per_token = {max_streams_per_token}

# HTTPS: a certificate chain and its key (PEM), both or neither. Without them plain HTTP is served on a loopback
# address only, unless insecure_http = true.
# tls_cert = "/etc/gpunet/tls/server.pem"
# tls_key = "/etc/gpunet/tls/server-key.pem"
insecure_http = {insecure_http}
# Most connections at once, and seconds for the TLS handshake and each request head.
max_connections = {max_connections}
header_timeout_s = {header_timeout_s:?}

# Price catalogue (TOML; `gpunet prices` prints the shipped one, used by default).
# prices = "/etc/gpunet/prices.toml"

# Replicas on PostgreSQL (one leads, the others stand by and redirect to it): the URL clients reach this server at
# (default: this server's scheme and listen address), and the leader's lease: how long it lasts without renewal,
# how often the leader renews it (at most half the lease) and how often a standby tries to take it, in seconds.
# advertise = "https://gpunet-1.example:7070"
lease_ttl_s = {lease_ttl_s:?}
lease_renew_s = {lease_renew_s:?}
lease_poll_s = {lease_poll_s:?}

# Log lines on standard error: "text" (colours only on a terminal) or "json" (one object per line).
log_format = "text"

# Node pools the server grows with demand and shrinks when idle (docs/pools.md). Agents of pool nodes join with their
# node's own token (the resume hook's GPUNET_NODE_TOKENS) at pool_agent_server (default: this server's address),
# verifying it with pool_agent_ca (default: tls_cert).
# pool_agent_server = "https://gpunet.example:7070"
# pool_agent_ca = "/etc/gpunet/ca.pem"
# [[pools]]
# name = "spot"                 # nodes are spot-00001, spot-00002, …
# provider = "exec"             # or "local": `gpunet agent --fake-gpus` processes on this machine
# resume_program = "/etc/gpunet/pools/resume.sh"     # PROGRAM POOL NODE…: create the machines
# suspend_program = "/etc/gpunet/pools/suspend.sh"   # PROGRAM POOL NODE…: delete them
# hook_timeout_s = 300.0
# gpu_model = "A10"
# gpus_per_node = 8
# cpu_cores_per_node = 32       # default 4 per GPU (the shape queued jobs are counted against)
# mem_gib_per_node = 128        # default 16 per GPU
# zone = "us-east-1a"
# lifecycle = "spot"            # or "on-demand"
# min_nodes = 0
# max_nodes = 4
# boot_timeout_s = 300.0
# interval_s = 10.0             # seconds between demand samples and decisions
# window = 5                    # samples in the weighted moving average (weights halving per step)
# high = 0.85                   # grow above this load (forecast ÷ capacity)
# low = 0.4                     # shrink below it
# target = 0.7                  # the load an action aims at
# cooldown_s = 300.0
# max_step = 10
# scale_in = "idle"             # or "checkpointed": drain nodes whose jobs checkpoint to a tier
"#,
        version = d.version,
        data_dir = d.data_dir.display(),
        listen = d.listen,
        backfill = d.backfill,
        node_lost_after_s = d.node_lost_after_s,
        node_fence_s = d.node_fence_s,
        restart_backoff_s = d.restart_backoff_s,
        preempt_min_run_s = d.preempt_min_run_s,
        max_queued_jobs_per_tenant = d.max_queued_jobs_per_tenant,
        max_spec_bytes_per_tenant = d.max_spec_bytes_per_tenant,
        max_streams_per_token = d.max_streams_per_token,
        insecure_http = d.insecure_http,
        max_connections = d.max_connections,
        header_timeout_s = d.header_timeout_s,
        lease_ttl_s = d.lease_ttl_s,
        lease_renew_s = d.lease_renew_s,
        lease_poll_s = d.lease_poll_s,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses_to_the_defaults() {
        assert_eq!(ServerFile::parse(&template()).unwrap(), ServerFile::default());
    }

    #[test]
    fn every_commented_key_of_the_template_parses_when_uncommented() {
        let text: String = template()
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(r) if r.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')) => r.to_string(),
                Some("[[pools]]") => "[[pools]]".to_string(),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        let f = ServerFile::parse(&text).unwrap();
        assert_eq!(f.pools.len(), 1, "the example pool");
        f.pools[0].validate().unwrap();
        assert_eq!(f.tls_key.as_deref(), Some(Path::new("/etc/gpunet/tls/server-key.pem")));
        assert!(f.store.is_some() && f.admin_token.is_some() && f.join_token.is_some() && f.prices.is_some());
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it() {
        let e = ServerFile::parse("lisen = \"0.0.0.0:1\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `lisen`") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_the_key() {
        let e = ServerFile::parse("\n\nmax_connections = \"many\"\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("max_connections"), "{e}");
    }

    #[test]
    fn another_version_and_half_a_tls_pair_are_refused() {
        let e = ServerFile::parse("version = 2\n").unwrap_err().to_string();
        assert!(e.contains("invalid version 2"), "{e}");
        let e = ServerFile::parse("tls_cert = \"a.pem\"\n").unwrap_err().to_string();
        assert!(e.contains("tls_key"), "{e}");
    }
}
