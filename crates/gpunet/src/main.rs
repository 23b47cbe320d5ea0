//! `gpunet`: the one binary of the gpunet compute network.

mod admin;
mod bench;
mod cli;
mod client;
mod config;
mod monitoring;
mod ops;
mod report;
mod server_cmd;
mod sim_cmd;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use client::{Client, Conn};
use gpunet_api::types::*;
use std::path::PathBuf;

/// mimalloc instead of glibc's malloc: the server's request path allocates per request (HTTP, JSON, the store's
/// rows) from several threads, where glibc's arenas spent about an eighth of its CPU (`scripts/bench-api-tls.sh`).
/// Built without transparent huge pages (the `no_thp` feature: no `MADV_HUGEPAGE` on its memory, nothing changed
/// for the tasks this binary starts): with them, every page it gave back and took again came back as a 2 MiB page
/// the kernel zeroed, a fifth of the owner thread's time under a stream of submissions.
/// (`MIMALLOC_ALLOW_THP=0` in the environment would instead switch THP off for the whole process with `prctl`, which
/// children inherit: the agent's tasks too. Leave it unset.) On hosts whose THP setting is `always` the kernel still
/// backs its memory with huge pages.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "gpunet", version, about = "An open-source AI compute network: pooled GPUs, fair scheduling, traces.")]
struct Cli {
    /// Log lines of `up`, `server` and `agent` on standard error: text (colours only on a terminal) or json (one
    /// object per line). `GPUNET_LOG` sets the level, e.g. debug.
    #[arg(long, global = true, value_enum, env = "GPUNET_LOG_FORMAT")]
    log_format: Option<config::LogFormat>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The whole compute network on this machine: server (SQLite), one local agent (real GPUs through NVML, else
    /// fake ones) and the web portal, in one process.
    Up(UpArgs),
    /// Run the control plane.
    Server(Box<server_cmd::ServerArgs>),
    /// Run a node agent: register this machine and run its tasks.
    Agent(Box<AgentArgs>),
    /// Submit a job: `-f spec.yaml` (gpunet spec or Kubernetes Job), or flags and `-- CMD ARGS…`.
    Submit(Box<cli::jobs::SubmitArgs>),
    /// Run a job like `srun`: submit it, wait for its start, stream every rank's output (prefixed with the rank when
    /// there are several), cancel it on Ctrl-C (exit 130), and exit with its exit code as `wait` does.
    Run(Box<cli::run::RunArgs>),
    /// List jobs, newest first (`--all` for every one), with the count of those not shown.
    Jobs(cli::jobs::JobsArgs),
    /// Show one job: its attempts (where, when, how each ended), its events, its estimate against its run time.
    Show(cli::jobs::ShowArgs),
    /// Cancel jobs: ids, or every unfinished job matching `--state`/`--user`/`--tenant`.
    Cancel(cli::jobs::CancelArgs),
    /// Hold queued jobs (or whole arrays): they are not scheduled until released (Slurm's `scontrol hold`).
    Hold(cli::jobs::HoldArgs),
    /// Release held jobs (or arrays): they are scheduled like new ones (Slurm's `scontrol release`).
    Release(cli::jobs::HoldArgs),
    /// Why a job is pending, with numbers and an ETA; for a finished job, how it ended.
    Why(cli::jobs::IdArg),
    /// Wait for jobs (or arrays) to end; exits 0 when all succeeded, else with the first unsuccessful one's exit
    /// code (128+N when killed by signal N; 1 when it has none: cancelled, a dependency never satisfied, an array).
    Wait(cli::jobs::WaitArgs),
    /// A job's output (a rank's latest attempt); `-f` follows it until the job ends and exits with its exit code.
    Logs(cli::jobs::LogsArgs),
    /// Tenants: list (with GPU, CPU and memory quotas), or create with `--create NAME`, or issue a token with
    /// `--token-for NAME`.
    Tenants(cli::tenants::TenantsArgs),
    /// Show a tenant's quota, set some of its fields (the others are kept), replace it from a ResourceQuota
    /// manifest, or `--clear` it.
    Quota(cli::tenants::QuotaArgs),
    /// Tokens: list, create (per user, with a role and an optional expiry) or revoke. The admin manages all; a
    /// tenant's admins manage that tenant's.
    Tokens {
        #[command(subcommand)]
        what: TokensCmd,
    },
    /// List nodes.
    Nodes(cli::tenants::NodesArgs),
    /// Cordon a node (no new tasks).
    Cordon(NodeArg),
    /// Drain a node (evict its jobs, no new tasks).
    Drain(NodeArg),
    /// Uncordon a node.
    Uncordon(NodeArg),
    /// Usage and cost (GPU, CPU and memory apart) per tenant, user or GPU model and lifecycle, over a period
    /// (`--days`, `--month` or `--from`/`--to`).
    Bill(BillArgs),
    /// Accounting per tenant or user over a period: jobs, GPU-hours, cost, waits, failures, preemptions (table, JSON
    /// or CSV); `--statement` prints a tenant's monthly statement as CSV.
    Report(report::ReportArgs),
    /// Print the price catalogue shipped with gpunet (TOML, with where its figures come from): the start of a
    /// `--prices` file.
    Prices,
    /// Print shell completions.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Replay a cluster trace on a virtual clock through the real scheduler.
    Sim(Box<sim_cmd::SimCmd>),
    /// Administration: print the alert rules; migrate SQLite to PostgreSQL; back up SQLite online.
    Admin {
        #[command(subcommand)]
        what: admin::AdminCmd,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// Data directory (database, logs, checkpoints, the admin token).
    #[arg(long, default_value = "gpunet-up")]
    data_dir: PathBuf,
    /// Fake GPUs of the local agent, e.g. 8xA100-80GB. Default: the GPUs NVML finds, or 8xA100-80GB fake ones where
    /// there are none.
    #[arg(long)]
    fake_gpus: Option<String>,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: std::net::SocketAddr,
    /// Scheduling policy: auto (the recommended setting: SRGF with backfill and eviction for much shorter jobs; see
    /// docs/scheduler.md), fifo, priority, sjf, srtf, srgf, drf, fairshare or las [default: the --sched-config
    /// file's, else auto].
    #[arg(long)]
    policy: Option<String>,
    /// Scheduler knobs (TOML), as for `gpunet server --sched-config`.
    #[arg(long, env = "GPUNET_SCHED_CONFIG")]
    sched_config: Option<PathBuf>,
    /// Price catalogue (TOML), as for `gpunet server --prices`; default: the shipped one.
    #[arg(long)]
    prices: Option<PathBuf>,
    /// Also run Prometheus (it must be on PATH) as a child, scraping this server with gpunet's alert rules; its
    /// configuration and data go to DATA_DIR/prometheus.
    #[arg(long)]
    with_prometheus: bool,
    /// Where that Prometheus listens.
    #[arg(long, default_value = "127.0.0.1:9090", requires = "with_prometheus")]
    prometheus_listen: std::net::SocketAddr,
    /// An elastic spot pool of local fake-GPU agents, MIN..MAXxGPUSxMODEL (e.g. 0..4x8xA10): nodes spot-00001, …
    /// are started as jobs that allow spot (`spot: allowed`) wait, and stopped when idle (docs/pools.md).
    #[arg(long)]
    spot_pool: Option<String>,
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// A program run every 5 s that prints the seconds left before this machine's provider takes it back (a cloud's
    /// spot interruption notice; `deploy/pools/spot-notice.sh` reads AWS's), or nothing: the agent then sends its
    /// node's reclaim notice, and its jobs checkpoint and move before the deadline.
    #[arg(long)]
    notice_command: Option<PathBuf>,
    /// Stop (as on SIGTERM) when the process PID, this agent's parent, ends: a node pool's local agents die with
    /// their server.
    #[arg(long, hide = true)]
    exit_with_parent: Option<u32>,
    /// Server URL, or the URLs of several replicas comma-separated (the agent syncs with the leader).
    #[arg(long, env = "GPUNET_SERVER")]
    server: String,
    /// CA certificate (PEM) the server's certificate must chain to (default: the system's roots).
    #[arg(long, env = "GPUNET_CA")]
    ca: Option<PathBuf>,
    /// Join token, for the node's first registration; later starts register with the node's own credential, kept in
    /// the data directory (`node.credential`, mode 0600).
    #[arg(long, env = "GPUNET_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// Node name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// Labels, e.g. zone=a,rack=r1.
    #[arg(long, default_value = "")]
    labels: String,
    /// Fake GPUs, e.g. 8xA100-80GB, instead of the GPUs NVML finds.
    #[arg(long)]
    fake_gpus: Option<String>,
    /// MIG instances of every fake GPU, e.g. 3g.40gb,3g.40gb (tasks see `MIG-fake-…` UUIDs).
    #[arg(long, requires = "fake_gpus", value_delimiter = ',')]
    fake_mig: Vec<String>,
    /// Fake GPUs report a fixed synthetic sample (50 % busy, a quarter of their memory used; exported with
    /// `fake="true"`) instead of none: for trying dashboards and alert rules without NVIDIA GPUs.
    #[arg(long, requires = "fake_gpus")]
    fake_gpu_samples: bool,
    /// Where logs and checkpoints go.
    #[arg(long, default_value = "gpunet-agent")]
    data_dir: PathBuf,
    /// Address other nodes reach this node at (MASTER_ADDR and GPUNET_NODE_ADDRESSES of gangs). Default: 127.0.0.1
    /// when the server is on loopback, else this machine's address on the route to the server (its primary
    /// non-loopback address).
    #[arg(long)]
    address: Option<String>,
    /// Run tasks as this unprivileged user (the agent must run as root).
    #[arg(long)]
    run_as: Option<String>,
    /// `PATH` of every task (jobs cannot set their own; they start from an empty environment).
    #[arg(long, env = "GPUNET_TASK_PATH", default_value = gpunet_agent::launcher::DEFAULT_TASK_PATH)]
    task_path: String,
    /// Run each tenant's tasks as its own uid and gid, `--tenant-uid-base` + the tenant's index. The default when
    /// the agent runs as root and other users can reach the data directory; `--run-as` wins.
    #[arg(long, conflicts_with = "no_tenant_uids")]
    tenant_uids: bool,
    /// Run every task as the agent's own user (or `--run-as`'s) even as root.
    #[arg(long)]
    no_tenant_uids: bool,
    /// First uid (and gid) of the per-tenant range: tenant i runs as base + i.
    #[arg(long, default_value_t = gpunet_agent::launcher::DEFAULT_TENANT_UID_BASE)]
    tenant_uid_base: u32,
    /// Run tasks without a PID and mount namespace of their own (they then see, though cannot signal, the node's
    /// other processes). Without this flag an agent that cannot make namespaces refuses to start when it runs
    /// tasks as other users, and warns otherwise.
    #[arg(long)]
    no_pid_namespace: bool,
    /// The most processes and threads one task attempt may have at once (`pids.max` of its cgroup, where the node
    /// has the pids controller): a fork bomb stops there.
    #[arg(long, default_value_t = gpunet_agent::cgroups::TASK_PIDS_MAX)]
    task_pids_max: u64,
    /// The most of the node's disk one task may use: its own directory, its job's checkpoint directory and its log
    /// (a size like 100Gi; a job's `disk` may ask for less). Measured every `--task-disk-check-s`; a task past it is
    /// stopped and its attempt fails with the outcome `disk_limit`. 0: not measured.
    #[arg(long, default_value = "100Gi")]
    task_disk_max: String,
    /// The most files and directories one task may have in those directories (a tree built to be slow to measure
    /// is over the limit).
    #[arg(long, default_value_t = gpunet_agent::disk::DEFAULT_TASK_FILES_MAX)]
    task_files_max: u64,
    /// Seconds between two measures of a task's disk use (more when measuring is slow: at most about 5% of a core).
    #[arg(long, default_value_t = 5.0)]
    task_disk_check_s: f64,
    /// The most bytes one checkpoint snapshot may write to a tier (data bytes on a filesystem tier, whose copies keep
    /// a file's holes; every byte to an object store). A snapshot over it fails and is removed.
    #[arg(long, default_value_t = gpunet_agent::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES)]
    checkpoint_snapshot_max_bytes: u64,
    /// Seconds an ended job's files (its tasks' own, checkpoint and log directories, and the node's checkpoint tier)
    /// stay on the node after the server said it ended for good (succeeded, failed, cancelled); then they are removed.
    /// A job that may come back (preempted, restarting) keeps them.
    #[arg(long, default_value_t = gpunet_agent::DEFAULT_ENDED_JOB_FILES_KEEP.as_secs_f64())]
    ended_job_files_keep_s: f64,
    /// Where the GPUs' device nodes are (their numbers go into each task's devices cgroup).
    #[arg(long, default_value = "/dev")]
    device_dir: PathBuf,
    /// The OCI runtime of container tasks (jobs with an `image`): runc, crun, a path, or none (default: runc where
    /// installed, else crun). Such a node is labelled gpunet.io/containers=true.
    #[arg(long)]
    container_runtime: Option<String>,
    /// A static init run as each container's PID 1 (default: tini-static, else catatonit, where installed).
    #[arg(long)]
    container_init: Option<PathBuf>,
    /// The directory `dir:NAME`, `oci:NAME` and `oci-archive:NAME` images are named beneath (default
    /// DATA_DIR/images).
    #[arg(long)]
    image_dir: Option<PathBuf>,
    /// A node directory (with everything beneath it) a container job may mount with `host_path`; repeatable.
    /// Without one, no host directory can be mounted.
    #[arg(long)]
    allow_host_path: Vec<PathBuf>,
    /// A directory of CDI specs (repeatable; default /etc/cdi and /var/run/cdi): with an `nvidia.com/gpu` spec, a
    /// container gets its GPUs as the spec says (device nodes, the driver's libraries, environment, hooks).
    #[arg(long)]
    cdi_spec_dir: Vec<PathBuf>,
    /// This node's price per GPU-hour, in the server's currency (default: the server's price catalogue's, by GPU
    /// model and the `lifecycle` label: on-demand, spot or reserved).
    #[arg(long)]
    price_per_gpu_hour: Option<f64>,
}

/// The GPUs NVML finds; none where NVML is absent (no NVIDIA driver).
fn real_gpus() -> Result<Vec<gpunet_agent::gpus::DiscoveredGpu>> {
    use gpunet_agent::gpus;
    match gpus::open() {
        Ok(nvml) => Ok(gpus::discover(&nvml)?),
        Err(e) => {
            tracing::info!(reason = %e, "no NVIDIA GPUs");
            Ok(Vec::new())
        }
    }
}

/// The server's scheduler flags that bear on a `--sched-config` file ([`load_sched`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SchedFlagsGiven {
    /// `--preempt-min-run-s`.
    pub(crate) min_run_time: bool,
    /// `--restart-backoff-s`.
    pub(crate) restart_backoff: bool,
    /// Backfill turned off (`--no-backfill`, or `backfill = false` in the server's file): it wins over the
    /// `--sched-config` file, and the warnings are about the setting with it.
    pub(crate) no_backfill: bool,
}

/// Applies a `--sched-config` file to the server's settings, then an explicit `--policy` and `flags`. Without either
/// naming a policy, or with `--policy auto`, the recommended setting is used (`SchedConfig::recommended`); a policy
/// named in the file or on the command line is used as named, preemptive for shorter jobs only if the file says so.
/// Returns the warnings to log: knobs given that do nothing as the server will run.
fn load_sched(
    cfg: &mut gpunet_server::Config,
    file: Option<&std::path::Path>,
    policy: Option<&str>,
    flags: SchedFlagsGiven,
) -> Result<Vec<String>> {
    let knobs = match file {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("read --sched-config {}", p.display()))?;
            let k = gpunet_core::SchedKnobs::from_toml(&text)
                .with_context(|| format!("load --sched-config {}", p.display()))?;
            Some((p, k))
        }
        None => None,
    };
    use gpunet_core::config::PolicyName;
    let named: Option<PolicyName> = policy.map(str::parse).transpose().map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    // A file naming `auto` names no plain policy: the recommended setting, tuned by its other knobs.
    let file_names_policy = knobs
        .as_ref()
        .is_some_and(|(_, k)| k.policy.is_some_and(|p| p != gpunet_core::config::PolicyName::Recommended));
    let auto = named.map_or(!file_names_policy, |n| n == PolicyName::Recommended);
    // `auto` first, so that the file's knobs (a `shorter_ratio`, `preemptive = false`) tune it.
    if auto {
        cfg.sched.use_recommended_policy();
    } else {
        let p = cfg.sched.policy;
        cfg.sched.use_plain_policy(p);
    }
    let given = knobs.as_ref().map(|(_, k)| k.clone()).unwrap_or_default();
    if let Some((p, k)) = knobs {
        // The file's minimum run time and restart backoff apply over the server's defaults; given on the command
        // line (at any value) or set to another value in the server's file as well, the two disagree and neither
        // is taken quietly.
        let d = gpunet_core::SchedConfig::default();
        let pairs = [
            (
                "min_run_time",
                "--preempt-min-run-s",
                k.min_run_time,
                cfg.sched.preemption.min_run_time,
                d.preemption.min_run_time,
                flags.min_run_time,
            ),
            (
                "restart_backoff",
                "--restart-backoff-s",
                k.restart_backoff,
                cfg.sched.restart_backoff,
                d.restart_backoff,
                flags.restart_backoff,
            ),
        ];
        for (key, flag, file, server, default, flag_given) in pairs {
            if let Some(f) = file.filter(|f| (server != default || flag_given) && f.0 != server) {
                bail!(
                    "invalid --sched-config {}: its {key} ({} ms) disagrees with {flag} ({} ms, from the command line \
                     or the server's file); set it in one place",
                    p.display(),
                    f.0 .0,
                    server.0
                );
            }
        }
        // A policy named on the command line wins over the file's: the file's `"auto"` brings none of its knobs then.
        let k = if named.is_some() { gpunet_core::SchedKnobs { policy: None, ..k } } else { k };
        k.apply(&mut cfg.sched).with_context(|| format!("load --sched-config {}", p.display()))?;
        if let Some(t) = k.tick {
            cfg.tick = std::time::Duration::from_millis(t.0 .0);
        }
        if k.checkpoint_interval.is_some() || k.stop_time.is_some() {
            tracing::warn!(
                file = %p.display(),
                "checkpoint_interval and stop_time are simulator knobs: live jobs checkpoint on their own interval \
                 and stop within the agent's grace period"
            );
        }
    }
    // The command line's policy wins over the file's.
    match named {
        Some(PolicyName::Recommended) => cfg.sched.policy = gpunet_core::SchedConfig::RECOMMENDED_POLICY,
        Some(PolicyName::Plain(p)) => cfg.sched.policy = p,
        None => {}
    }
    if flags.no_backfill {
        cfg.sched.backfill = false;
    }
    // Checked again as the server will run it: the file was checked under its own policy (preemptive SJF at a ratio
    // of 1 passed as SRGF, then ran as SJF under `--policy sjf`).
    cfg.sched.validate().context("invalid scheduler settings (--policy with the --sched-config file)")?;
    // Said by the caller (the server's log at start), of the settings as they will run.
    Ok(cfg.sched.ignored_knobs(&given).into_iter().map(|w| format!("scheduler: {w}")).collect())
}

/// The price catalogue of `--prices FILE`, or the shipped one.
fn load_prices(path: Option<&std::path::Path>) -> Result<gpunet_core::PriceCatalogue> {
    let Some(p) = path else { return Ok(gpunet_core::PriceCatalogue::shipped()) };
    let text = std::fs::read_to_string(p).with_context(|| format!("read --prices {}", p.display()))?;
    gpunet_core::PriceCatalogue::from_toml(&text).with_context(|| format!("load --prices {}", p.display()))
}

/// The address other nodes reach this one at, by default: loopback when the (first) server is on loopback, else
/// the local address of the route to it (no packet is sent: a UDP socket is only connected).
fn default_address(servers: &str) -> String {
    let first = servers.split(',').next().unwrap_or_default();
    let host_port = first.split("://").nth(1).unwrap_or(first).split('/').next().unwrap_or_default();
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            (h.trim_matches(['[', ']']), p.parse().unwrap_or(443))
        }
        _ => (host_port, 443),
    };
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return "127.0.0.1".into();
    }
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect((host, port))?;
            s.local_addr()
        })
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into())
}

fn agent_config(a: &AgentArgs) -> Result<gpunet_agent::AgentConfig> {
    let mut labels = std::collections::BTreeMap::new();
    for kv in a.labels.split(',').filter(|s| !s.trim().is_empty()) {
        let (k, v) =
            kv.split_once('=').with_context(|| format!("invalid --labels entry {kv:?}: allowed is key=value"))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    let name = match &a.name {
        Some(n) => n.clone(),
        None => {
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "node".into())
        }
    };
    // Absolute, so that paths handed to tasks (GPUNET_CHECKPOINT_DIR) work from their working directory.
    let data_dir =
        std::path::absolute(&a.data_dir).with_context(|| format!("resolve --data-dir {}", a.data_dir.display()))?;
    let tenant_uids = if a.tenant_uids {
        true
    } else if a.no_tenant_uids || a.run_as.is_some() || !gpunet_agent::running_as_root() {
        false
    } else {
        let _ = std::fs::create_dir_all(&data_dir);
        let reach = gpunet_agent::others_can_reach(&data_dir);
        if !reach {
            tracing::warn!(data_dir = %data_dir.display(), "other users cannot reach the data directory, so every \
                           tenant's tasks run as root; use a data directory under a path like /srv or /var/lib for \
                           per-tenant users (or --no-tenant-uids to silence this)");
        }
        reach
    };
    let keep = a.ended_job_files_keep_s;
    if !(keep.is_finite() && (0.0..=366.0 * 86_400.0).contains(&keep)) {
        bail!("invalid --ended-job-files-keep-s {keep}: allowed is seconds from 0 to 31622400 (366 days)");
    }
    Ok(gpunet_agent::AgentConfig {
        server: a.server.trim_end_matches('/').to_string(),
        ca: a.ca.clone(),
        join_token: a.join_token.clone(),
        name,
        labels,
        fake_gpus: a.fake_gpus.as_deref().map(gpunet_agent::parse_fake_gpus).transpose()?,
        fake_mig: a
            .fake_mig
            .iter()
            .map(|p| p.parse::<gpunet_core::MigProfile>().with_context(|| format!("invalid --fake-mig {p:?}")))
            .collect::<Result<Vec<_>>>()?,
        real_gpus: if a.fake_gpus.is_some() { Vec::new() } else { real_gpus()? },
        data_dir,
        cpu: None,
        mem: None,
        address: match &a.address {
            Some(x) => x.clone(),
            None => default_address(&a.server),
        },
        run_as: a.run_as.clone(),
        wrapper: std::env::current_exe().ok(),
        task_path: a.task_path.clone(),
        tenant_uid_base: tenant_uids.then_some(a.tenant_uid_base),
        device_dir: Some(a.device_dir.clone()),
        price_per_gpu_hour: match a.price_per_gpu_hour {
            Some(p) => Some(
                gpunet_core::pricing::check_price("--price-per-gpu-hour", p)
                    .map(|_| p)
                    .context("--price-per-gpu-hour")?,
            ),
            None => None,
        },
        fake_gpu_samples: a.fake_gpu_samples,
        pid_namespace: !a.no_pid_namespace,
        task_pids_max: a.task_pids_max,
        task_disk_max: gpunet_api::units::parse_memory("--task-disk-max", &a.task_disk_max)?.0.saturating_mul(1 << 20),
        task_files_max: match a.task_files_max {
            0 => bail!("--task-files-max: at least 1 (a task's log alone is one)"),
            n => n,
        },
        task_disk_check: std::time::Duration::try_from_secs_f64(a.task_disk_check_s)
            .ok()
            .filter(|d| *d >= std::time::Duration::from_millis(100))
            .context("--task-disk-check-s: at least 0.1")?,
        snapshot_max_bytes: a.checkpoint_snapshot_max_bytes,
        ended_job_files_keep: std::time::Duration::from_secs_f64(keep),
        containers: gpunet_agent::container::Options {
            runtime: a.container_runtime.clone(),
            init: a.container_init.clone(),
            image_dir: a.image_dir.clone(),
            host_paths: a.allow_host_path.clone(),
            cdi_dirs: (!a.cdi_spec_dir.is_empty()).then(|| a.cdi_spec_dir.clone()),
        },
        notice_command: a.notice_command.clone(),
    })
}

#[derive(Debug, clap::Args)]
struct NodeArg {
    /// Node name.
    name: String,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, Subcommand)]
enum TokensCmd {
    /// List tokens (ids, roles, tenants, users, expiry; never the secrets).
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Create a token for a user and print it (shown once).
    Create {
        /// admin, tenant-admin, tenant or join.
        #[arg(long)]
        role: String,
        /// Who holds it (recorded on the jobs it submits).
        #[arg(long)]
        user: String,
        /// Tenant of a tenant or tenant-admin token (a tenant admin's own by default).
        #[arg(long)]
        tenant: Option<String>,
        /// Lifetime, e.g. 30d; default: until revoked.
        #[arg(long)]
        expires_in: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Revoke a token by id (from `tokens list`); it stops working at once.
    Revoke {
        /// Token id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Debug, clap::Args)]
struct BillArgs {
    #[command(flatten)]
    period: report::Period,
    /// Only this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// One row per tenant, per user (`tenant/user`: who submitted each job), per GPU model and lifecycle, or per
    /// lifecycle (spot, on-demand, reserved: each billed at its own price).
    #[arg(long, default_value = "tenant", value_parser = ["tenant", "user", "model", "lifecycle"])]
    by: String,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// One full scheduling pass over a synthetic cluster, then a stream of arrival/completion events.
    Sched(bench::sched::SchedArgs),
    /// Durable job submissions per second against a running server.
    Api(bench::api::ApiArgs),
    /// N trivial jobs through server and agent on S GPU slots: submit → process start, and drain time.
    E2e(bench::e2e::E2eArgs),
    /// A server of its own with a deep queue: submissions/s, p99 and memory at each depth, with and without readers.
    Depth(bench::depth::DepthArgs),
    /// A trace on a fixed on-demand cluster sized for its peak against a smaller one plus an autoscaled spot pool
    /// (simulated: wait, cost, GPU-hours lost to reclaims); `--live-runs N`: a live pool's growth, burst to start.
    Elastic(bench::elastic::ElasticArgs),
}

fn read_file(p: &PathBuf) -> Result<String> {
    if p.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
        return Ok(s);
    }
    std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))
}

fn print<T: serde::Serialize>(c: &Client, v: &T, table: impl FnOnce(&T) -> String) -> Result<()> {
    cli::output::emit(c.output, v, |v, _| table(v))
}

async fn run_client(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Submit(a) => cli::jobs::submit(&a).await,
        Cmd::Jobs(a) => cli::jobs::jobs(&a).await,
        Cmd::Show(a) => cli::jobs::show(&a).await,
        Cmd::Cancel(a) => cli::jobs::cancel(&a).await,
        Cmd::Hold(a) => cli::jobs::hold(&a, false).await,
        Cmd::Release(a) => cli::jobs::hold(&a, true).await,
        Cmd::Why(a) => cli::jobs::why(&a).await,
        Cmd::Logs(a) => {
            let code = cli::jobs::logs(&a).await?;
            std::process::exit(code);
        }
        Cmd::Wait(a) => {
            let code = cli::jobs::wait(&a).await?;
            std::process::exit(code);
        }
        Cmd::Run(a) => {
            let code = cli::run::run(&a).await?;
            std::process::exit(code);
        }
        Cmd::Tenants(a) => cli::tenants::tenants(&a).await,
        Cmd::Tokens { what: TokensCmd::List { tenant, conn } } => {
            let c = Client::new(&conn)?;
            let q = tenant.map_or(String::new(), |t| format!("?tenant={t}"));
            let ts: Vec<TokenInfo> = c.get(&format!("/v1/tokens{q}")).await?;
            print(&c, &ts, |ts| {
                client::table(
                    &["ID", "ROLE", "TENANT", "USER", "EXPIRES"],
                    ts.iter()
                        .map(|t| {
                            vec![
                                t.id.clone(),
                                t.role.as_str().to_string(),
                                t.tenant.clone().unwrap_or_else(|| "-".into()),
                                t.user.clone().unwrap_or_else(|| "-".into()),
                                t.expires_ms.map_or("never".into(), |e| {
                                    format!("in {}s", e.saturating_sub(gpunet_server::now_ms()) / 1000)
                                }),
                            ]
                        })
                        .collect(),
                )
            })
        }
        Cmd::Tokens { what: TokensCmd::Create { role, user, tenant, expires_in, conn } } => {
            let c = Client::new(&conn)?;
            let mut body = serde_json::json!({"role": role, "user": user});
            if let Some(t) = tenant {
                body["tenant"] = t.into();
            }
            if let Some(e) = expires_in {
                body["expires_in"] = e.into();
            }
            let t: TokenCreated = c.post("/v1/tokens", Some(body.to_string()), "application/json").await?;
            print(&c, &t, |t| {
                format!(
                    "{} token {} for {} (shown once): {}\n",
                    t.info.role.as_str(),
                    t.info.id,
                    t.info.user.as_deref().unwrap_or("-"),
                    t.token
                )
            })
        }
        Cmd::Tokens { what: TokensCmd::Revoke { id, conn } } => {
            let c = Client::new(&conn)?;
            let t: TokenInfo = c.post(&format!("/v1/tokens/{id}/revoke"), None, "").await?;
            print(&c, &t, |t| format!("token {} revoked\n", t.id))
        }
        Cmd::Quota(a) => cli::tenants::quota(&a).await,
        Cmd::Nodes(a) => cli::tenants::nodes(&a).await,
        Cmd::Cordon(a) | Cmd::Drain(a) | Cmd::Uncordon(a) => unreachable!("handled with the action: {a:?}"),
        Cmd::Report(a) => report::run(a).await,
        Cmd::Bill(a) => {
            let c = Client::new(&a.conn)?;
            let (from, to) = a.period.span(gpunet_server::now_ms())?;
            let mut q = format!("?from_ms={from}&to_ms={to}");
            if let Some(t) = &a.tenant {
                q += &format!("&tenant={t}");
            }
            let r: UsageReport = c.get(&format!("/v1/usage{q}")).await?;
            // Per lifecycle: the model/lifecycle rows summed by their lifecycle.
            let mut by_lifecycle: std::collections::BTreeMap<String, gpunet_api::types::UsageTotals> =
                Default::default();
            for (k, u) in &r.by_model {
                let l = k.rsplit_once('/').map_or("on-demand", |(_, l)| l).to_string();
                *by_lifecycle.entry(l).or_default() += u;
            }
            print(&c, &r, |r| {
                let cost = format!("COST ({})", if r.currency.is_empty() { "?" } else { &r.currency });
                let (key, rows) = match a.by.as_str() {
                    "user" => ("TENANT/USER", &r.by_user),
                    "model" => ("MODEL/LIFECYCLE", &r.by_model),
                    "lifecycle" => ("LIFECYCLE", &by_lifecycle),
                    _ => ("TENANT", &r.tenants),
                };
                client::table(
                    &[key, "GPU-HOURS", "CPU-HOURS", "MEM GIB-HOURS", "GPU COST", "CPU COST", "MEM COST", &cost],
                    rows.iter()
                        .map(|(t, u)| {
                            vec![
                                t.clone(),
                                format!("{:.2}", u.gpu_hours),
                                format!("{:.2}", u.cpu_hours),
                                format!("{:.2}", u.memory_gib_hours),
                                money(u.gpu_cost),
                                money(u.cpu_cost),
                                money(u.mem_cost),
                                money(u.cost),
                            ]
                        })
                        .collect(),
                )
            })
        }
        _ => unreachable!("not a client command"),
    }
}

/// An amount for a table: cents, and the fractions of a cent of amounts below 1 (seconds of use).
fn money(x: f64) -> String {
    if x > 0.0 && x < 1.0 {
        format!("{x:.4}")
    } else {
        format!("{x:.2}")
    }
}

async fn node_action(a: NodeArg, action: &str) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let n: NodeView = c.post(&format!("/v1/nodes/{}/{action}", a.name), None, "").await?;
    print(&c, &n, |n| cli::tenants::nodes_table(std::slice::from_ref(n), false))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// `eprintln!` that never panics: standard error closed early (`gpunet sim … 2>&1 | head -1`) made the process
/// panic and exit 101 instead of 1.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}
pub(crate) use say;

/// Errors end the process with their causes on one line and status 1, never with a backtrace (even where
/// `RUST_BACKTRACE` is set: they are for people, not developers).
fn main() {
    if let Err(e) = real_main() {
        say!("error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    // Before anything else (one thread still): descriptors we inherited (`exec 7<secret; gpunet agent`) reach no task,
    // wrapper, init or copier we start (see `gpunet_agent::fds`).
    gpunet_agent::fds::cloexec_inherited();
    // The task wrapper starts with every task (and probe): skip building the whole command line parser for it. It
    // runs as root with an empty environment (see `gpunet_agent::wrapper`).
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("task-exec") {
        gpunet_agent::wrapper::main(&argv[2..]);
    }
    // The task spawner (see `gpunet_agent::spawner`): started by the agent, it forks every task wrapper, so it must
    // have one thread.
    if argv.get(1).map(String::as_str) == Some(gpunet_agent::spawner::SUBCOMMAND) {
        gpunet_agent::spawner::main(&argv[2..]);
    }
    // The checkpoint copier (see `gpunet_agent::copier`): started by the agent as root, it drops to a job's user,
    // so it must run before any other thread exists.
    if argv.get(1).map(String::as_str) == Some(gpunet_agent::copier::SUBCOMMAND) && argv.len() == 2 {
        gpunet_agent::copier::main();
    }
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Server(a) => server_cmd::run(&a, cli.log_format)?,
        Cmd::Agent(a) => {
            ops::init_logging(cli.log_format.unwrap_or_default(), "info");
            if let Some(parent) = a.exit_with_parent {
                ops::exit_with_parent(parent)?;
            }
            let cfg = agent_config(&a)?;
            let _lock = ops::DataDirLock::acquire(&cfg.data_dir)?;
            runtime()?.block_on(async move {
                gpunet_agent::run(cfg, async {
                    let _ = ops::stop_signal().await;
                })
                .await
            })?;
        }
        Cmd::Up(a) => {
            ops::init_logging(cli.log_format.unwrap_or_default(), "warn");
            let asked = a.fake_gpus.as_deref().map(gpunet_agent::parse_fake_gpus).transpose()?;
            let real = if asked.is_some() { Vec::new() } else { real_gpus()? };
            let fake = match asked {
                Some(f) => Some(f),
                None if real.is_empty() => Some((gpunet_core::GpuModel::A100_80GB, 8)),
                None => None,
            };
            // One `gpunet up` per data directory (it creates the directory).
            let _lock = ops::DataDirLock::acquire(&a.data_dir)?;
            // Single-machine mode keeps the admin and join tokens in the data directory so that they can be shown at
            // every start (and the printed `gpunet agent` command keeps working).
            let token_file = a.data_dir.join("admin.token");
            let admin = ops::token_file(&token_file)?;
            let join = ops::token_file(&a.data_dir.join("join.token"))?;
            // A private CA in the data directory (kept across starts) and a server certificate it signs.
            let ca = gpunet_server::tls::local_ca(&a.data_dir, &gpunet_server::tls::local_names(a.listen))?;
            let mut cfg = gpunet_server::Config::new(a.data_dir.join("server"));
            cfg.listen = a.listen;
            cfg.tls = Some(ca.server.clone());
            cfg.admin_token = Some(admin.clone());
            cfg.join_token = Some(join.clone());
            for w in load_sched(&mut cfg, a.sched_config.as_deref(), a.policy.as_deref(), SchedFlagsGiven::default())? {
                tracing::warn!("{w}");
            }
            cfg.prices = load_prices(a.prices.as_deref())?;
            if let Some(sp) = &a.spot_pool {
                let mut p = gpunet_server::pools::PoolConfig::parse_short("spot", sp)?;
                // A quick loop for trying it: decisions every 2 s, a minute of quiet after each.
                p.interval_s = 2.0;
                p.cooldown_s = 60.0;
                p.boot_timeout_s = 60.0;
                p.zone = "local".into();
                cfg.pools = vec![p];
                cfg.pool_link = gpunet_server::pools::AgentLink {
                    server: None,
                    ca: Some(ca.ca_cert.clone()),
                    exe: None,
                    address: None,
                    reap: Some(crate::ops::local_reaper()),
                };
            }
            // Shared checkpoint tiers go beneath the data directory, one directory per tenant.
            let data =
                std::fs::canonicalize(&a.data_dir).with_context(|| format!("resolve {}", a.data_dir.display()))?;
            cfg.checkpoint_roots = vec![format!("file://{}/tiers/{{tenant}}", data.display())];
            let tenant_uids = gpunet_agent::running_as_root() && gpunet_agent::others_can_reach(&data);
            if gpunet_agent::running_as_root() && !tenant_uids {
                say!(
                    "warning: {} is not reachable by other users, so every tenant's tasks run as root; use a data \
                     directory under a path like /srv or /var/lib for per-tenant users",
                    data.display()
                );
            }
            runtime()?.block_on(async move {
                let store = std::sync::Arc::new(gpunet_store::SqliteStore::open(&a.data_dir.join("server"))?);
                let running = gpunet_server::start(cfg, store).await?;
                let mut local = running.addr;
                if local.ip().is_unspecified() {
                    local.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                let url = format!("https://{local}");
                let prometheus = if a.with_prometheus {
                    let p = monitoring::start(
                        &a.data_dir,
                        &local.to_string(),
                        &ca.ca_cert,
                        &token_file,
                        &a.prometheus_listen.to_string(),
                    )?;
                    Some(p)
                } else {
                    None
                };
                let agent = gpunet_agent::AgentConfig {
                    server: url.clone(),
                    ca: Some(ca.ca_cert.clone()),
                    join_token: Some(join.clone()),
                    name: "local".into(),
                    labels: std::collections::BTreeMap::from([("zone".to_string(), "local".to_string())]),
                    fake_gpus: fake,
                    fake_mig: Vec::new(),
                    real_gpus: real.clone(),
                    data_dir: std::path::absolute(a.data_dir.join("agent")).context("resolve --data-dir")?,
                    cpu: None,
                    mem: None,
                    address: "127.0.0.1".into(),
                    run_as: None,
                    wrapper: std::env::current_exe().ok(),
                    task_path: gpunet_agent::launcher::DEFAULT_TASK_PATH.into(),
                    // Each tenant's tasks as its own user where the agent can switch users.
                    // (where the agent can switch users and they can reach their directories under the data
                    // directory; otherwise tasks run as the agent's user, as `gpunet up` says at start).
                    tenant_uid_base: tenant_uids.then_some(gpunet_agent::launcher::DEFAULT_TENANT_UID_BASE),
                    device_dir: None,
                    price_per_gpu_hour: None,
                    fake_gpu_samples: false,
                    // Each task in its own PID namespace where the machine allows (refused with tenant uids).
                    pid_namespace: true,
                    task_pids_max: gpunet_agent::cgroups::TASK_PIDS_MAX,
                    task_disk_max: gpunet_agent::disk::DEFAULT_TASK_DISK_MAX,
                    task_files_max: gpunet_agent::disk::DEFAULT_TASK_FILES_MAX,
                    task_disk_check: gpunet_agent::launcher::DISK_CHECK_EVERY,
                    snapshot_max_bytes: gpunet_agent::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
                    ended_job_files_keep: gpunet_agent::DEFAULT_ENDED_JOB_FILES_KEEP,
                    containers: Default::default(),
                    notice_command: None,
                };
                let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
                let agent_task = tokio::spawn(gpunet_agent::run(agent, async {
                    let _ = stop_rx.await;
                }));
                // A tenant to start with.
                let _ = client::http_client(Some(&ca.ca_cert), 1)?
                    .post(format!("{url}/v1/tenants"))
                    .bearer_auth(&admin)
                    .header("content-type", "application/json")
                    .body(r#"{"name":"default"}"#)
                    .send()
                    .await;
                println!("gpunet is up at {url}");
                println!("portal: {url}/  (log in with the admin token)");
                println!("admin token: {admin}");
                match fake {
                    Some((m, n)) => println!("node: local with {n}x{m} (fake GPUs)"),
                    None => {
                        for g in &real {
                            println!(
                                "node: local GPU {} {} ({}, {} MiB, NUMA {}, MIG {}{})",
                                g.index,
                                g.name,
                                g.uuid,
                                g.memory_mib,
                                g.numa,
                                if g.mig_enabled { "on" } else { "off" },
                                if g.mig.is_empty() {
                                    String::new()
                                } else {
                                    format!(": {}", g.mig.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "))
                                }
                            );
                        }
                    }
                }
                println!("CA certificate: {}  (clients: --ca or GPUNET_CA; browsers: import it, or accept the warning)", ca.ca_cert.display());
                if let Some(p) = &prometheus {
                    println!(
                        "prometheus: {}  (scraping {url}/metrics with gpunet's alert rules; config in {})",
                        p.url,
                        a.data_dir.join("prometheus").display()
                    );
                }
                print!("{}", ops::join_instructions(running.addr, &ca.ca_cert, &join));
                println!(
                    "try:  GPUNET_SERVER={url} GPUNET_CA={} GPUNET_TOKEN={admin} gpunet submit --tenant default --gpus 1 -- nvidia-smi -L",
                    ca.ca_cert.display()
                );
                use std::io::Write as _;
                std::io::stdout().flush()?;
                ops::stop_signal().await?;
                tracing::info!("stopping");
                let _ = stop_tx.send(());
                let _ = agent_task.await;
                running.stop().await;
                drop(prometheus);
                Ok::<(), anyhow::Error>(())
            })?;
        }
        Cmd::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gpunet", &mut script);
            cli::output::out_bytes(&script);
        }
        Cmd::Prices => cli::output::out(gpunet_core::pricing::SHIPPED_CATALOGUE),
        Cmd::Sim(cmd) => sim_cmd::run(*cmd)?,
        Cmd::Bench { what: BenchCmd::Sched(args) } => {
            if !matches!(args.output.as_str(), "table" | "json") {
                bail!("invalid --output {:?}: allowed is table or json", args.output);
            }
            let r = bench::sched::run(&args)?;
            if args.output == "json" {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("policy          {}", r.policy);
                println!("full_pass_ms    {:.1}", r.full_pass_ms);
                println!("placed          {}", r.placed);
                println!("placeable       {}", r.placeable);
                if r.arrays > 0 {
                    println!("arrays          {} ({} elements)", r.arrays, r.array_elements);
                }
                println!("event_p50_us    {:.1}", r.event_p50_us);
                println!("event_p99_us    {:.1}", r.event_p99_us);
                println!("peak_rss_mib    {:.1}", r.peak_rss_mib);
            }
        }
        Cmd::Admin { what } => admin::run(what)?,
        Cmd::Bench { what: BenchCmd::Api(args) } => runtime()?.block_on(bench::api::run(args))?,
        Cmd::Bench { what: BenchCmd::E2e(args) } => runtime()?.block_on(bench::e2e::run(args))?,
        Cmd::Bench { what: BenchCmd::Elastic(args) } => runtime()?.block_on(bench::elastic::run(&args))?,
        Cmd::Bench { what: BenchCmd::Depth(args) } => runtime()?.block_on(bench::depth::run(args))?,
        Cmd::Cordon(a) => runtime()?.block_on(node_action(a, "cordon"))?,
        Cmd::Drain(a) => runtime()?.block_on(node_action(a, "drain"))?,
        Cmd::Uncordon(a) => runtime()?.block_on(node_action(a, "uncordon"))?,
        other => runtime()?.block_on(run_client(other))?,
    }
    Ok(())
}
