//! `gpunet`: the one binary of the gpunet compute network.

mod admin;
mod bench;
mod client;
mod monitoring;
mod report;
mod sim_cmd;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use client::{Client, Conn};
use gpunet_api::spec::JobSubmission;
use gpunet_api::types::*;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "gpunet", version, about = "An open-source AI compute network: pooled GPUs, fair scheduling, traces.")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The whole compute network on this machine: server (SQLite), one local agent (real GPUs through NVML, else
    /// fake ones) and the web portal, in one process.
    Up(UpArgs),
    /// Run the control plane.
    Server(ServerArgs),
    /// Run a node agent: register this machine and run its tasks.
    Agent(AgentArgs),
    /// Submit a job: `-f spec.yaml` (gpunet spec or Kubernetes Job), or flags and `-- CMD ARGS…`.
    Submit(Box<SubmitArgs>),
    /// List jobs.
    Jobs(JobsArgs),
    /// Show one job.
    Show(IdArg),
    /// Cancel a job.
    Cancel(IdArg),
    /// Why a job is pending, with numbers and an ETA.
    Why(IdArg),
    /// Wait for jobs (or arrays) to end; exits 0 when all succeeded, else with the first unsuccessful one's exit
    /// code (128+N when killed by signal N; 1 when it has none: cancelled, a dependency never satisfied, an array).
    Wait(WaitArgs),
    /// A job's output (a rank's latest attempt); `-f` follows it until the job ends.
    Logs(LogsArgs),
    /// Tenants: list, or create with `--create NAME`, or issue a token with `--token-for NAME`.
    Tenants(TenantsArgs),
    /// Set a tenant's quota from flags or a ResourceQuota manifest.
    Quota(QuotaArgs),
    /// Tokens: list, create (per user, with a role and an optional expiry) or revoke. The admin manages all; a
    /// tenant's admins manage that tenant's.
    Tokens {
        #[command(subcommand)]
        what: TokensCmd,
    },
    /// List nodes.
    Nodes(ConnOnly),
    /// Cordon a node (no new tasks).
    Cordon(NodeArg),
    /// Drain a node (evict its jobs, no new tasks).
    Drain(NodeArg),
    /// Uncordon a node.
    Uncordon(NodeArg),
    /// Usage and cost (GPU, CPU and memory apart) per tenant over a period.
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
struct ServerArgs {
    /// Data directory (the SQLite database unless --store names another; TLS files, logs).
    #[arg(long, default_value = "gpunet-data")]
    data_dir: PathBuf,
    /// Where the state is kept: `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`, or `sqlite://DIR` (default: SQLite in
    /// --data-dir). Default GPUNET_STORE.
    #[arg(long, env = "GPUNET_STORE", hide_env_values = true)]
    store: Option<String>,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: std::net::SocketAddr,
    /// Admin token (default GPUNET_ADMIN_TOKEN; generated and printed once if none is stored).
    #[arg(long, env = "GPUNET_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Join token for node agents (default GPUNET_JOIN_TOKEN; generated and printed once if none is stored).
    #[arg(long, env = "GPUNET_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// Queue policy (default: the --sched-config file's, else fifo).
    #[arg(long)]
    policy: Option<String>,
    /// Scheduler knobs (TOML, a `[scheduler]` table: policy, backfill, preemptive, LAS thresholds, minimum run time,
    /// eviction rate limit, restart backoff, tick; see docs/scheduler.md). Flags given explicitly win over the file.
    #[arg(long, env = "GPUNET_SCHED_CONFIG")]
    sched_config: Option<PathBuf>,
    /// Turn EASY backfill off.
    #[arg(long)]
    no_backfill: bool,
    /// Seconds without a sync after which an agent's node is lost and its jobs restart elsewhere.
    #[arg(long, default_value_t = 10.0)]
    node_lost_after_s: f64,
    /// Seconds a lost node's tasks stay fenced (their GPUs held) waiting for its agent to come back and confirm them
    /// killed; after that they are taken as gone and their jobs run again elsewhere.
    #[arg(long, default_value_t = 60.0)]
    node_fence_s: f64,
    /// Seconds before the first restart of a failed job (doubling after each restart).
    #[arg(long, default_value_t = 10.0)]
    restart_backoff_s: f64,
    /// A job that has run less than this many seconds is never preempted.
    #[arg(long, default_value_t = 300.0)]
    preempt_min_run_s: f64,
    /// Where checkpoint tiers may go, repeatable: `file:///srv/ckpt/{tenant}` or `s3://bucket/{tenant}/`
    /// (`{tenant}`: the job's tenant). A tier URL outside every root is refused at submit; without roots, tiers
    /// live only on the nodes' disks.
    #[arg(long = "checkpoint-root")]
    checkpoint_roots: Vec<String>,
    /// Most queued jobs one tenant may have; more submissions get 429.
    #[arg(long, default_value_t = gpunet_server::DEFAULT_MAX_QUEUED_JOBS_PER_TENANT)]
    max_queued_jobs_per_tenant: usize,
    /// Most bytes of job specs one tenant's unfinished jobs may hold (default 64 MiB); more submissions get 429.
    #[arg(long, default_value_t = gpunet_server::DEFAULT_MAX_SPEC_BYTES_PER_TENANT)]
    max_spec_bytes_per_tenant: u64,
    /// Most log and event streams one token may have open at once; more get 429.
    #[arg(long, default_value_t = gpunet_server::DEFAULT_MAX_STREAMS_PER_TOKEN)]
    max_streams_per_token: usize,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Allow plain HTTP on a non-loopback address (tokens and task secrets cross the network in clear text).
    #[arg(long)]
    insecure_http: bool,
    /// Most connections at once (keep it below the open-file limit).
    #[arg(long, default_value_t = 768)]
    max_connections: usize,
    /// Seconds a client has for the TLS handshake and for each request head (and an idle connection is kept).
    #[arg(long, default_value_t = 10.0)]
    header_timeout_s: f64,
    /// Price catalogue (TOML: GPU prices by model and lifecycle, CPU core-hour, memory GiB-hour); default: the one
    /// shipped with gpunet (`gpunet prices` prints it).
    #[arg(long)]
    prices: Option<PathBuf>,
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
    /// Queue policy (default: the --sched-config file's, else fifo).
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
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Server URL.
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
    /// Address other nodes reach this node at (MASTER_ADDR of gangs).
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
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
    /// The most bytes one checkpoint snapshot may write to a tier (data bytes on a filesystem tier, whose copies keep
    /// a file's holes; every byte to an object store). A snapshot over it fails and is removed.
    #[arg(long, default_value_t = gpunet_agent::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES)]
    checkpoint_snapshot_max_bytes: u64,
    /// Where the GPUs' device nodes are (their numbers go into each task's devices cgroup).
    #[arg(long, default_value = "/dev")]
    device_dir: PathBuf,
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

/// The price catalogue of `--prices FILE`, or the shipped one.
/// Applies a `--sched-config` file to the server's settings, then an explicit `--policy`.
fn load_sched(cfg: &mut gpunet_server::Config, file: Option<&std::path::Path>, policy: Option<&str>) -> Result<()> {
    if let Some(p) = file {
        let text = std::fs::read_to_string(p).with_context(|| format!("read --sched-config {}", p.display()))?;
        let k = gpunet_core::SchedKnobs::from_toml(&text)
            .and_then(|k| k.apply(&mut cfg.sched).map(|()| k))
            .with_context(|| format!("load --sched-config {}", p.display()))?;
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
    if let Some(p) = policy {
        cfg.sched.policy = p.parse().context("--policy")?;
    }
    Ok(())
}

fn load_prices(path: Option<&std::path::Path>) -> Result<gpunet_core::PriceCatalogue> {
    let Some(p) = path else { return Ok(gpunet_core::PriceCatalogue::shipped()) };
    let text = std::fs::read_to_string(p).with_context(|| format!("read --prices {}", p.display()))?;
    gpunet_core::PriceCatalogue::from_toml(&text).with_context(|| format!("load --prices {}", p.display()))
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
        address: a.address.clone(),
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
        snapshot_max_bytes: a.checkpoint_snapshot_max_bytes,
    })
}

#[derive(Debug, clap::Args)]
struct SubmitArgs {
    /// A spec file (YAML or JSON; gpunet's or a Kubernetes batch/v1 Job); `-` reads standard input.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Job name (default: the command's name).
    #[arg(long)]
    name: Option<String>,
    /// GPUs per task.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// Tasks (a gang).
    #[arg(long, default_value_t = 1)]
    tasks: u32,
    /// Tenant (admin tokens only; a tenant token submits to its own).
    #[arg(long)]
    tenant: Option<String>,
    /// Priority.
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// Estimated run time, e.g. 2h.
    #[arg(long)]
    estimate: Option<String>,
    /// A job array: indices `0-99`, `0-99:2` (a step) or `1,3,7`, and `%8` to run at most 8 at once. Each element
    /// is a job of its own (`ID[INDEX]`, e.g. `job-12[3]`) whose tasks get `GPUNET_ARRAY_INDEX` and
    /// `GPUNET_ARRAY_JOB_ID`; `show`/`cancel` take the array's id for the whole array.
    #[arg(long)]
    array: Option<String>,
    /// Start only after other jobs: `afterok:ID[:ID…]` (they succeeded), `afterany:…` (they ended),
    /// `afternotok:…` (they failed or were cancelled), `singleton` (no earlier job of this name runs), comma-separated.
    /// IDs may be arrays or elements (`12[3]`). A dependency that can never be satisfied fails the job, saying why.
    #[arg(long)]
    dependency: Option<String>,
    /// Ask where and when it would start, without queuing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    conn: Conn,
    /// Command and arguments.
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct JobsArgs {
    /// Only this tenant's jobs.
    #[arg(long)]
    tenant: Option<String>,
    /// Only jobs in this state.
    #[arg(long)]
    state: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct WaitArgs {
    /// Job ids (42, job-42, or an array element 42[3]).
    #[arg(required = true)]
    ids: Vec<String>,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct IdArg {
    /// Job id (42 or job-42), or an array element (42[3] or job-42[3]).
    id: String,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct LogsArgs {
    /// Job id.
    id: String,
    /// Follow until the job ends.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Task rank.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct ConnOnly {
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct NodeArg {
    /// Node name.
    name: String,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct TenantsArgs {
    /// Create this tenant (admin); prints its token.
    #[arg(long)]
    create: Option<String>,
    /// Weight of the tenant created.
    #[arg(long)]
    weight: Option<f64>,
    /// Cohort of the tenant created.
    #[arg(long)]
    cohort: Option<String>,
    /// Issue another token for this tenant (admin).
    #[arg(long)]
    token_for: Option<String>,
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
struct QuotaArgs {
    /// Tenant.
    tenant: String,
    /// A Kubernetes v1 ResourceQuota manifest.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Guaranteed GPUs.
    #[arg(long)]
    gpus: Option<u64>,
    /// GPU limit with borrowing.
    #[arg(long)]
    limit: Option<u64>,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct BillArgs {
    /// Days back from now.
    #[arg(long, default_value_t = 30)]
    days: u64,
    /// Only this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// One row per tenant, per user (`tenant/user`: who submitted each job) or per GPU model and lifecycle.
    #[arg(long, default_value = "tenant", value_parser = ["tenant", "user", "model"])]
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
    if c.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        print!("{}", table(v));
    }
    Ok(())
}

async fn run_client(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Submit(a) => {
            let c = Client::new(&a.conn)?;
            let body = match &a.file {
                Some(f) => read_file(f)?,
                None => {
                    if a.command.is_empty() {
                        bail!("nothing to run: pass -f SPEC or a command after --");
                    }
                    let name = a.name.clone().unwrap_or_else(|| {
                        std::path::Path::new(&a.command[0])
                            .file_name()
                            .map_or("job".into(), |n| n.to_string_lossy().into_owned())
                    });
                    let mut s = JobSubmission::new(&name, a.gpus, a.tasks);
                    s.tenant = a.tenant.clone();
                    s.priority = a.priority;
                    s.estimated_duration = a.estimate.clone();
                    s.command = a.command.clone();
                    s.array = a.array.clone();
                    s.dependency = a.dependency.clone();
                    serde_json::to_string(&s)?
                }
            };
            let body = if a.file.is_some() && (a.array.is_some() || a.dependency.is_some()) {
                // The flags add to a spec file (a gpunet spec; a Kubernetes Job has no such fields).
                let mut s: JobSubmission = gpunet_api::parse_job(&body).map_err(|e| anyhow::anyhow!(e.message))?.job;
                if a.array.is_some() {
                    s.array = a.array.clone();
                }
                if a.dependency.is_some() {
                    s.dependency = a.dependency.clone();
                }
                serde_json::to_string(&s)?
            } else {
                body
            };
            let q = a.tenant.as_ref().map_or(String::new(), |t| format!("?tenant={t}"));
            if a.dry_run {
                let r: DryRun = c.post(&format!("/v1/jobs/dry-run{q}"), Some(body), "application/yaml").await?;
                return print(&c, &r, |r| {
                    let mut s = String::new();
                    if !r.placement.is_empty() {
                        s += &format!(
                            "would start now on {}\n",
                            r.placement
                                .iter()
                                .map(|t| format!("{}:{:?}", t.node, t.gpus))
                                .collect::<Vec<_>>()
                                .join(" ")
                        );
                    } else {
                        s += &format!("would wait: {}\n", r.message);
                    }
                    if let Some(e) = r.eta_ms {
                        s += &format!("predicted start in {}s\n", e.saturating_sub(gpunet_server::now_ms()) / 1000);
                    }
                    s
                });
            }
            let r: Submitted = c.post(&format!("/v1/jobs{q}"), Some(body), "application/yaml").await?;
            for w in &r.warnings {
                eprintln!("warning: {w}");
            }
            print(&c, &r, |r| format!("job-{} submitted ({})\n", r.id, r.state))
        }
        Cmd::Jobs(a) => {
            let c = Client::new(&a.conn)?;
            let mut q = format!("?limit={}", a.limit.clamp(1, 1000));
            if let Some(t) = &a.tenant {
                q += &format!("&tenant={t}");
            }
            if let Some(s) = &a.state {
                q += &format!("&state={s}");
            }
            let page: JobPage = c.get(&format!("/v1/jobs{q}")).await?;
            print(&c, &page, |p| client::jobs_table(&p.jobs))
        }
        Cmd::Show(a) => {
            let c = Client::new(&a.conn)?;
            let id = client::resolve_job_id(&c, &a.id).await?;
            let j: JobView = c.get(&format!("/v1/jobs/{id}")).await?;
            print(&c, &j, |j| {
                let mut s = client::jobs_table(std::slice::from_ref(j));
                if let Some(by) = &j.submitted_by {
                    s += &format!("  submitted by {by}\n");
                }
                if let Some(x) = &j.array {
                    s += &format!(
                        "  array of {} elements ({}): {} expanded, {} live{}, {} succeeded, {} failed, {} cancelled; \
                         element ids {}..={}\n",
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
                    s += &format!("  dependency {d}\n");
                }
                if let Some(r) = &j.end_reason {
                    s += &format!("  ended: {r}\n");
                }
                if let Some(est) = &j.estimate {
                    s += &format!("  {}", client::estimate_line(est));
                }
                for t in &j.placement {
                    s += &format!("  task on {} GPUs {:?}\n", t.node, t.gpus);
                }
                s
            })
        }
        Cmd::Cancel(a) => {
            let c = Client::new(&a.conn)?;
            let id = client::resolve_job_id(&c, &a.id).await?;
            let j: JobView = c.post(&format!("/v1/jobs/{id}/cancel"), None, "").await?;
            print(&c, &j, |j| match &j.stopping {
                Some(why) if j.state == "running" => {
                    format!("job-{} is being {why}: its tasks are stopping (it ends once they are gone)\n", j.id)
                }
                _ => format!("job-{} {}\n", j.id, j.state),
            })
        }
        Cmd::Logs(a) => {
            let c = Client::new(&a.conn)?;
            c.stream(&format!("/v1/jobs/{}/logs?rank={}&follow={}", a.id, a.rank, a.follow)).await
        }
        Cmd::Wait(a) => {
            let c = Client::new(&a.conn)?;
            let mut ids = Vec::with_capacity(a.ids.len());
            for t in &a.ids {
                ids.push(client::resolve_job_id(&c, t).await?);
            }
            let code = client::wait_for_jobs(&c, &ids).await?;
            std::process::exit(code);
        }
        Cmd::Why(a) => {
            let c = Client::new(&a.conn)?;
            let id = client::resolve_job_id(&c, &a.id).await?;
            let e: Explain = c.get(&format!("/v1/jobs/{id}/explain")).await?;
            print(&c, &e, |e| {
                let mut s = format!("job-{} is {}: {}\n", e.id, e.state, e.message);
                if let Some(t) = e.eta_ms {
                    s += &format!("predicted start in {}s\n", t.saturating_sub(gpunet_server::now_ms()) / 1000);
                }
                if let Some(est) = &e.estimate {
                    s += &client::estimate_line(est);
                }
                s
            })
        }
        Cmd::Tenants(a) => {
            let c = Client::new(&a.conn)?;
            if let Some(name) = &a.create {
                let req = TenantRequest { name: name.clone(), weight: a.weight, cohort: a.cohort.clone(), quota: None };
                let t: TokenIssued =
                    c.post("/v1/tenants", Some(serde_json::to_string(&req)?), "application/json").await?;
                return print(&c, &t, |t| {
                    format!("tenant {} created; its token (shown once): {}\n", t.tenant, t.token)
                });
            }
            if let Some(name) = &a.token_for {
                let t: TokenIssued = c.post(&format!("/v1/tenants/{name}/tokens"), None, "").await?;
                return print(&c, &t, |t| format!("new token for {} (shown once): {}\n", t.tenant, t.token));
            }
            let ts: Vec<TenantView> = c.get("/v1/tenants").await?;
            print(&c, &ts, |t| client::tenants_table(t))
        }
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
        Cmd::Quota(a) => {
            let c = Client::new(&a.conn)?;
            let body = match &a.file {
                Some(f) => read_file(f)?,
                None => serde_json::to_string(&QuotaRequest {
                    guarantee_gpus: a.gpus,
                    limit_gpus: a.limit,
                    ..Default::default()
                })?,
            };
            let t: TenantView = c.put(&format!("/v1/tenants/{}/quota", a.tenant), body).await?;
            print(&c, &t, |t| client::tenants_table(std::slice::from_ref(t)))
        }
        Cmd::Nodes(a) => {
            let c = Client::new(&a.conn)?;
            let ns: Vec<NodeView> = c.get("/v1/nodes").await?;
            print(&c, &ns, |n| client::nodes_table(n))
        }
        Cmd::Cordon(a) | Cmd::Drain(a) | Cmd::Uncordon(a) => unreachable!("handled with the action: {a:?}"),
        Cmd::Report(a) => report::run(a).await,
        Cmd::Bill(a) => {
            let c = Client::new(&a.conn)?;
            let to = gpunet_server::now_ms();
            let from = to.saturating_sub(a.days * 86_400_000);
            let mut q = format!("?from_ms={from}&to_ms={to}");
            if let Some(t) = &a.tenant {
                q += &format!("&tenant={t}");
            }
            let r: UsageReport = c.get(&format!("/v1/usage{q}")).await?;
            print(&c, &r, |r| {
                let cost = format!("COST ({})", if r.currency.is_empty() { "?" } else { &r.currency });
                let (key, rows) = match a.by.as_str() {
                    "user" => ("TENANT/USER", &r.by_user),
                    "model" => ("MODEL/LIFECYCLE", &r.by_model),
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
    print(&c, &n, |n| client::nodes_table(std::slice::from_ref(n)))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn main() -> Result<()> {
    // Before anything else (one thread still): descriptors we inherited (`exec 7<secret; gpunet agent`) reach no task,
    // wrapper, init or copier we start (see `gpunet_agent::fds`).
    gpunet_agent::fds::cloexec_inherited();
    // The task wrapper starts with every task (and probe): skip building the whole command line parser for it. It
    // runs as root with an empty environment (see `gpunet_agent::wrapper`).
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("task-exec") {
        gpunet_agent::wrapper::main(&argv[2..]);
    }
    // The checkpoint copier (see `gpunet_agent::copier`): started by the agent as root, it drops to a job's user,
    // so it must run before any other thread exists.
    if argv.get(1).map(String::as_str) == Some(gpunet_agent::copier::SUBCOMMAND) && argv.len() == 2 {
        gpunet_agent::copier::main();
    }
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Server(a) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("GPUNET_LOG").unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            let mut cfg = gpunet_server::Config::new(a.data_dir.clone());
            cfg.listen = a.listen;
            cfg.admin_token = a.admin_token.clone();
            cfg.join_token = a.join_token.clone();
            if a.no_backfill {
                cfg.sched.backfill = false;
            }
            let lost_ok = a.node_lost_after_s.is_finite() && a.node_lost_after_s > 0.0;
            let backoff_ok = a.restart_backoff_s.is_finite() && a.restart_backoff_s >= 0.0;
            if !lost_ok || !backoff_ok {
                bail!("invalid --node-lost-after-s / --restart-backoff-s: allowed are seconds > 0 and >= 0");
            }
            cfg.node_lost_after = std::time::Duration::from_secs_f64(a.node_lost_after_s);
            if !a.node_fence_s.is_finite() || a.node_fence_s < 0.0 {
                bail!("invalid --node-fence-s {}: allowed is seconds >= 0", a.node_fence_s);
            }
            cfg.node_fence_after = std::time::Duration::from_secs_f64(a.node_fence_s);
            cfg.sched.restart_backoff = gpunet_core::Dur((a.restart_backoff_s * 1000.0) as u64);
            if !a.preempt_min_run_s.is_finite() || a.preempt_min_run_s < 0.0 {
                bail!("invalid --preempt-min-run-s {}: allowed is seconds >= 0", a.preempt_min_run_s);
            }
            cfg.sched.preemption.min_run_time = gpunet_core::Dur((a.preempt_min_run_s * 1000.0) as u64);
            load_sched(&mut cfg, a.sched_config.as_deref(), a.policy.as_deref())?;
            for r in &a.checkpoint_roots {
                if !(r.starts_with("file:///") || r.starts_with("s3://")) || r.contains("..") {
                    bail!(
                        "invalid --checkpoint-root {r:?}: allowed is file:///PATH or s3://BUCKET/PREFIX without '..'"
                    );
                }
            }
            cfg.checkpoint_roots = a.checkpoint_roots.clone();
            if a.max_queued_jobs_per_tenant == 0 || a.max_spec_bytes_per_tenant == 0 || a.max_streams_per_token == 0 {
                bail!(
                    "invalid --max-queued-jobs-per-tenant / --max-spec-bytes-per-tenant / --max-streams-per-token: \
                     allowed are numbers > 0"
                );
            }
            cfg.max_queued_jobs_per_tenant = a.max_queued_jobs_per_tenant;
            cfg.max_spec_bytes_per_tenant = a.max_spec_bytes_per_tenant;
            cfg.max_streams_per_token = a.max_streams_per_token;
            if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
                cfg.tls = Some(gpunet_server::tls::TlsFiles { cert: cert.clone(), key: key.clone() });
            }
            cfg.insecure_http = a.insecure_http;
            if a.insecure_http {
                eprintln!("warning: --insecure-http: tokens and task secrets may cross the network in clear text");
            }
            if a.max_connections == 0 || !a.header_timeout_s.is_finite() || a.header_timeout_s <= 0.0 {
                bail!("invalid --max-connections / --header-timeout-s: allowed are at least 1 and seconds > 0");
            }
            cfg.limits.max_connections = a.max_connections;
            cfg.limits.max_connections_per_ip = a.max_connections.div_ceil(2);
            cfg.limits.header_timeout = std::time::Duration::from_secs_f64(a.header_timeout_s);
            cfg.prices = load_prices(a.prices.as_deref())?;
            let store_url = match &a.store {
                Some(s) => gpunet_store::StoreUrl::parse(s).context("invalid --store")?,
                None => gpunet_store::StoreUrl::Sqlite(a.data_dir.clone()),
            };
            runtime()?.block_on(async move {
                let store = gpunet_store::open(&store_url).context("open the store")?;
                let running = gpunet_server::start(cfg, store).await?;
                println!("gpunet server listening on {}", running.url());
                if let Some(t) = &running.generated_admin_token {
                    println!("admin token (shown once, store it): {t}");
                }
                if let Some(t) = &running.generated_join_token {
                    println!("agent join token (shown once): {t}");
                }
                use std::io::Write as _;
                std::io::stdout().flush()?;
                tokio::signal::ctrl_c().await?;
                eprintln!("stopping");
                running.stop().await;
                Ok::<(), anyhow::Error>(())
            })?;
        }
        Cmd::Agent(a) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("GPUNET_LOG").unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            let cfg = agent_config(&a)?;
            runtime()?.block_on(async move {
                gpunet_agent::run(cfg, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await
            })?;
        }
        Cmd::Up(a) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("GPUNET_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            let asked = a.fake_gpus.as_deref().map(gpunet_agent::parse_fake_gpus).transpose()?;
            let real = if asked.is_some() { Vec::new() } else { real_gpus()? };
            let fake = match asked {
                Some(f) => Some(f),
                None if real.is_empty() => Some((gpunet_core::GpuModel::A100_80GB, 8)),
                None => None,
            };
            std::fs::create_dir_all(&a.data_dir).with_context(|| format!("create {}", a.data_dir.display()))?;
            // Single-machine mode keeps the admin token in the data directory so that it can be shown at every start.
            let token_file = a.data_dir.join("admin.token");
            let admin = match std::fs::read_to_string(&token_file) {
                Ok(t) => t.trim().to_string(),
                Err(_) => {
                    use std::io::Write as _;
                    use std::os::unix::fs::OpenOptionsExt;
                    let t = gpunet_server::new_token();
                    // Created readable by its owner only (never briefly world-readable).
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&token_file)
                        .and_then(|mut f| f.write_all(t.as_bytes()))
                        .with_context(|| format!("write {}", token_file.display()))?;
                    t
                }
            };
            let join = gpunet_server::new_token();
            // A private CA in the data directory (kept across starts) and a server certificate it signs.
            let ca = gpunet_server::tls::local_ca(&a.data_dir, &gpunet_server::tls::local_names(a.listen))?;
            let mut cfg = gpunet_server::Config::new(a.data_dir.join("server"));
            cfg.listen = a.listen;
            cfg.tls = Some(ca.server.clone());
            cfg.admin_token = Some(admin.clone());
            cfg.join_token = Some(join.clone());
            load_sched(&mut cfg, a.sched_config.as_deref(), a.policy.as_deref())?;
            cfg.prices = load_prices(a.prices.as_deref())?;
            // Shared checkpoint tiers go beneath the data directory, one directory per tenant.
            let data =
                std::fs::canonicalize(&a.data_dir).with_context(|| format!("resolve {}", a.data_dir.display()))?;
            cfg.checkpoint_roots = vec![format!("file://{}/tiers/{{tenant}}", data.display())];
            let tenant_uids = gpunet_agent::running_as_root() && gpunet_agent::others_can_reach(&data);
            if gpunet_agent::running_as_root() && !tenant_uids {
                eprintln!(
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
                    join_token: Some(join),
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
                    snapshot_max_bytes: gpunet_agent::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
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
                println!(
                    "try:  GPUNET_SERVER={url} GPUNET_CA={} GPUNET_TOKEN={admin} gpunet submit --tenant default --gpus 1 -- nvidia-smi -L",
                    ca.ca_cert.display()
                );
                use std::io::Write as _;
                std::io::stdout().flush()?;
                tokio::signal::ctrl_c().await?;
                eprintln!("stopping");
                let _ = stop_tx.send(());
                let _ = agent_task.await;
                running.stop().await;
                drop(prometheus);
                Ok::<(), anyhow::Error>(())
            })?;
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "gpunet", &mut std::io::stdout());
        }
        Cmd::Prices => print!("{}", gpunet_core::pricing::SHIPPED_CATALOGUE),
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
        Cmd::Cordon(a) => runtime()?.block_on(node_action(a, "cordon"))?,
        Cmd::Drain(a) => runtime()?.block_on(node_action(a, "drain"))?,
        Cmd::Uncordon(a) => runtime()?.block_on(node_action(a, "uncordon"))?,
        other => runtime()?.block_on(run_client(other))?,
    }
    Ok(())
}
