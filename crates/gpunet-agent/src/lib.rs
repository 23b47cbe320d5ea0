//! gpunet's node agent: registers its node (GPUs, CPU, memory, labels) with the server, then keeps the node's processes
//! equal to the task set the server wants (see `gpunet_api::agent`), reporting every exit.
//!
//! Credentials: the join token only registers. Registration returns the node's own credential, bound to its name, which
//! the agent keeps in `DATA_DIR/node.credential` (mode 0600) and syncs with; it registers again with that credential
//! (getting a fresh one) at the next start, so the join token is needed only for the first registration.
//! It reconnects with backoff when the server is away; tasks keep running meanwhile, and once it is back the server's
//! answer decides which of them stay.
//!
//! GPUs: real ones are discovered through NVML ([`gpus`]) and sampled every few seconds for the server's metrics;
//! `--fake-gpus 8xA100-80GB` declares fake GPUs instead (marked `fake` everywhere; they report no samples unless
//! `--fake-gpu-samples` asks for fixed synthetic ones, which the server labels `fake="true"`). Without
//! either the agent registers a node without GPUs.

pub mod beneath;
pub mod cgroups;
pub mod checkpoints;
pub mod container;
pub mod copier;
pub mod devfilter;
pub mod disk;
pub mod fds;
mod forked;
pub mod gpu_errors;
pub mod gpus;
pub mod identity;
pub mod launcher;
pub mod lease;
pub mod spawner;
pub mod wrapper;

use gpunet_api::agent::{AgentSync, AgentWork, TaskAssignment, TaskExit, TaskRef};
use gpunet_api::servers::ServerList;
use gpunet_core::{GpuModel, MiB, MilliCpu, NodeSpec};
use launcher::Launcher;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A flag is invalid.
    #[error("invalid {field} {value:?}: {allowed}")]
    Invalid {
        /// Flag.
        field: &'static str,
        /// Value.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The server refused the registration.
    #[error("register with {server}: {reason}")]
    Register {
        /// Server URL.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server could not be reached (the agent retries).
    #[error("reach {server}: {reason}")]
    Unreachable {
        /// Server URL.
        server: String,
        /// Why.
        reason: String,
    },
    /// The node credential file could not be written or read.
    #[error("keep the node credential in {path}: {source}")]
    Credential {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Most log bytes one sync carries, shared fairly by the tasks with something to ship (see [`fair_shares`]).
const LOG_BUDGET: u64 = 256 * 1024;

/// How long an ended task's log keeps shipping after its exit was reported (the server takes a node's task
/// attempts' logs for 5 minutes after they left it).
const LOG_DRAIN: Duration = Duration::from_secs(240);

/// Splits `budget` among claims `owed` max-min fairly: every claim gets an equal share, and what a small claim does
/// not need is shared by the others (a task with a line to ship gets it, however much another task spams).
pub fn fair_shares(owed: &[u64], budget: u64) -> Vec<u64> {
    let mut out = vec![0u64; owed.len()];
    let mut order: Vec<usize> = (0..owed.len()).collect();
    order.sort_by_key(|&i| owed[i]);
    let mut left = budget;
    for (k, &i) in order.iter().enumerate() {
        let share = left / (order.len() - k) as u64;
        out[i] = owed[i].min(share);
        left -= out[i];
    }
    out
}

/// The longest one sync may wait for the server's answer (its long poll holds a request about a second).
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a sync got no answer.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
}

/// How often real GPUs are sampled.
const GPU_SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Server URL (`https://…`; plain `http://` only to a server on the same machine), or the URLs of several
    /// replicas, comma-separated: the agent syncs with the leader, follows a standby's redirect within the list and
    /// moves to the next when one is unreachable; its tasks run on through a failover.
    pub server: String,
    /// CA certificate (PEM) the server's certificate must chain to; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// Join token: needed for the node's first registration (later ones use the node's own credential).
    pub join_token: Option<String>,
    /// Node name.
    pub name: String,
    /// Labels (zone, rack, …).
    pub labels: BTreeMap<String, String>,
    /// Fake GPUs.
    pub fake_gpus: Option<(GpuModel, usize)>,
    /// MIG instances of every fake GPU (`--fake-mig 3g.40gb,3g.40gb`); their UUIDs are `MIG-fake-NODE-GPU-I`.
    pub fake_mig: Vec<gpunet_core::MigProfile>,
    /// Real GPUs found by NVML (see [`gpus::discover`]); used when `fake_gpus` is `None`.
    pub real_gpus: Vec<gpus::DiscoveredGpu>,
    /// Where logs and checkpoints go.
    pub data_dir: PathBuf,
    /// CPU to offer (default: the machine's, at least 4 cores per fake GPU).
    pub cpu: Option<MilliCpu>,
    /// Memory to offer (default: the machine's, at least 16 GiB per fake GPU).
    pub mem: Option<MiB>,
    /// Address other nodes reach this one at (MASTER_ADDR of gangs).
    pub address: String,
    /// Run tasks as this unprivileged user.
    pub run_as: Option<String>,
    /// The `gpunet` executable, whose `task-exec` wraps every task so that an agent started again on the same data
    /// directory adopts the tasks its previous run left (see [`wrapper`]); `None`: such tasks are killed instead.
    pub wrapper: Option<PathBuf>,
    /// `PATH` of every task ([`launcher::DEFAULT_TASK_PATH`] unless set); a job cannot set its own.
    pub task_path: String,
    /// Per-tenant Unix identities: each tenant's tasks run as uid and gid `base + tenant index` (see
    /// [`launcher::Launcher::tenant_uids`]); `run_as` wins when both are set.
    pub tenant_uid_base: Option<u32>,
    /// Where the GPUs' device nodes are (default `/dev`), for the devices cgroup.
    pub device_dir: Option<PathBuf>,
    /// This node's price per GPU-hour, sent at registration instead of the server's catalogue price.
    pub price_per_gpu_hour: Option<f64>,
    /// Fake GPUs send a fixed synthetic sample ([`gpus::fake_sample`]; the server labels it `fake="true"`) instead of
    /// none, for testing dashboards and alert rules without NVIDIA GPUs.
    pub fake_gpu_samples: bool,
    /// Each task in a PID and mount namespace of its own (needs `wrapper` and root; see [`wrapper`]). Where the
    /// kernel refuses one, an agent that runs tasks as other users (tenant uids, `run_as`) refuses to start (their
    /// tasks could see each other's processes); any other agent warns and runs tasks without.
    pub pid_namespace: bool,
    /// The most processes and threads a task attempt may have at once ([`cgroups::TASK_PIDS_MAX`] by default).
    pub task_pids_max: u64,
    /// The most bytes one task may use on the node's disk: its own directory, its job's checkpoint directory and
    /// its log ([`disk::DEFAULT_TASK_DISK_MAX`] by default; a job's `disk` may ask for less); 0: not measured.
    pub task_disk_max: u64,
    /// The most files and directories one task may have there ([`disk::DEFAULT_TASK_FILES_MAX`] by default).
    pub task_files_max: u64,
    /// How often each task's disk use is measured ([`launcher::DISK_CHECK_EVERY`] by default).
    pub task_disk_check: Duration,
    /// The most bytes one checkpoint snapshot may write ([`checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES`] by default).
    pub snapshot_max_bytes: u64,
    /// How long an ended job's files stay on the node after the server said it ended for good (see `JobFiles`), for
    /// whoever wants to look at them; then they are removed.
    pub ended_job_files_keep: Duration,
    /// How container tasks run (see [`container`]); by default with runc where installed (and the agent is root).
    pub containers: container::Options,
    /// A program run every [`NOTICE_EVERY`] that prints the seconds left before the machine's provider takes it back
    /// (a cloud's spot interruption notice), or nothing: the agent then sends its node's reclaim notice.
    pub notice_command: Option<PathBuf>,
}

/// How often the notice command runs.
pub const NOTICE_EVERY: Duration = Duration::from_secs(5);

/// Runs the notice command every [`NOTICE_EVERY`] (for at most 10 s each time) and sends the first deadline it
/// prints (seconds, a number above 0), then stops.
fn watch_notices(cmd: PathBuf, tx: mpsc::UnboundedSender<f64>) {
    tokio::spawn(async move {
        loop {
            let out = tokio::time::timeout(
                Duration::from_secs(10),
                tokio::process::Command::new(&cmd)
                    .stdin(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .output(),
            )
            .await;
            if let Ok(Ok(o)) = out {
                let text = String::from_utf8_lossy(&o.stdout);
                if let Ok(s) = text.trim().parse::<f64>() {
                    if s.is_finite() && s > 0.0 {
                        tracing::warn!(seconds = s, "the provider's notice: this machine is reclaimed");
                        let _ = tx.send(s.min(86_400.0));
                        return;
                    }
                }
            }
            tokio::time::sleep(NOTICE_EVERY).await;
        }
    });
}

/// The errors fake GPUs report, from the data directory's [`gpu_errors::FAKE_ERRORS_FILE`] (none without one;
/// lines it does not understand are logged and count for nothing).
fn fake_errors(path: &std::path::Path) -> BTreeMap<u32, gpu_errors::FakeErrors> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (errors, bad) = gpu_errors::parse_fake_errors(&text);
    for b in bad {
        tracing::warn!(error = %b, "fake GPU error ignored");
    }
    errors
}

/// Whether this process runs as root (and so can run tasks as other users).
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether users other than the owner can reach `dir` (every directory from `/` down to it has the others'
/// execute bit): per-tenant identities need it, since a task's own directory lies beneath the data directory.
pub fn others_can_reach(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(abs) = std::fs::canonicalize(dir) else { return false };
    abs.ancestors().all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// Parses `8xA100-80GB` (count `x` model).
pub fn parse_fake_gpus(s: &str) -> Result<(GpuModel, usize), AgentError> {
    let bad = || AgentError::Invalid {
        field: "--fake-gpus",
        value: s.into(),
        allowed: "COUNTxMODEL, e.g. 8xA100-80GB, with 1 to 64 GPUs".into(),
    };
    let (n, m) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if n == 0 || n > 64 {
        return Err(bad());
    }
    let model: GpuModel = m.trim().parse().map_err(|e: gpunet_core::CoreError| AgentError::Invalid {
        field: "--fake-gpus",
        value: s.into(),
        allowed: e.to_string(),
    })?;
    Ok((model, n))
}

fn machine_memory() -> MiB {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(MiB::gib(8), |kb| MiB(kb / 1024))
}

/// The node this agent offers.
pub fn node_spec(cfg: &AgentConfig) -> NodeSpec {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let (model, count) = cfg.fake_gpus.unwrap_or((GpuModel::T4, 0));
    let cpu = cfg.cpu.unwrap_or(MilliCpu::cores(cores.max(4 * count as u64)));
    let mem = cfg.mem.unwrap_or(MiB(machine_memory().0.max(16 * 1024 * count as u64)));
    let mut n = NodeSpec::with_gpus(cfg.name.clone(), model, count, cpu, mem);
    if cfg.fake_gpus.is_some() && !cfg.fake_mig.is_empty() {
        for g in &mut n.gpus {
            g.mig = cfg.fake_mig.clone();
        }
        n.labels.insert("mig".into(), "enabled".into());
    }
    if cfg.fake_gpus.is_none() && !cfg.real_gpus.is_empty() {
        n.gpus = gpus::to_devices(&cfg.real_gpus);
        if cfg.real_gpus.iter().any(|g| g.mig_enabled) {
            n.labels.insert("mig".into(), "enabled".into());
        }
    }
    for (k, v) in &cfg.labels {
        n.labels.insert(k.clone(), v.clone());
    }
    n.labels.insert("address".into(), cfg.address.clone());
    n
}

/// The MIG UUIDs of the node's GPUs by GPU index and instance: NVML's for real GPUs, `MIG-fake-NODE-GPU-I` for fake.
pub fn mig_uuids(cfg: &AgentConfig) -> Vec<Vec<String>> {
    if cfg.fake_gpus.is_none() && !cfg.real_gpus.is_empty() {
        return cfg.real_gpus.iter().map(|g| g.mig_uuids.clone()).collect();
    }
    let count = cfg.fake_gpus.map_or(0, |(_, n)| n);
    (0..count).map(|g| (0..cfg.fake_mig.len()).map(|i| format!("MIG-fake-{}-{g}-{i}", cfg.name)).collect()).collect()
}

/// The agent's HTTP client: it trusts only the configured CA when there is one.
fn http_client(cfg: &AgentConfig) -> Result<reqwest::Client, AgentError> {
    // A standby's redirect to the leader is followed by the agent itself, within its list of servers (reqwest would
    // drop the credential on the way, and could follow it anywhere).
    let mut b = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(p) = &cfg.ca {
        let bad =
            |reason: String| AgentError::Invalid { field: "--ca", value: p.display().to_string(), allowed: reason };
        let pem = std::fs::read(p).map_err(|e| bad(format!("a readable PEM file ({e})")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(format!("a PEM file ({e})")))?;
        if certs.is_empty() {
            return Err(bad("a PEM file with at least one certificate".into()));
        }
        b = b.tls_certs_only(certs);
    }
    b.build().map_err(|e| AgentError::Register { server: cfg.server.clone(), reason: e.to_string() })
}

/// Where the node's credential is kept.
pub fn credential_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("node.credential")
}

/// Writes the credential readable by its owner only (0600), replacing the file atomically.
fn save_credential(data_dir: &std::path::Path, credential: &str) -> Result<(), AgentError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let path = credential_path(data_dir);
    let fail = |source| AgentError::Credential { path: path.clone(), source };
    std::fs::create_dir_all(data_dir).map_err(fail)?;
    let tmp = data_dir.join("node.credential.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(fail)?;
    f.write_all(credential.as_bytes()).and_then(|_| f.sync_all()).map_err(fail)?;
    std::fs::rename(&tmp, &path).map_err(fail)
}

/// Registers the node: with its stored credential when it has one, else (or when the server refuses it) with the join
/// token. Returns the node's new credential, already saved.
async fn register(
    http: &reqwest::Client,
    cfg: &AgentConfig,
    servers: &ServerList,
    isolation: &str,
) -> Result<String, AgentError> {
    let mut spec = node_spec(cfg);
    spec.labels.insert("isolation".into(), isolation.to_string());
    let mut body = serde_json::json!({"spec": spec, "fake": cfg.fake_gpus.is_some()});
    if let Some(p) = cfg.price_per_gpu_hour {
        body["price_per_gpu_hour"] = p.into();
    }
    let stored = std::fs::read_to_string(credential_path(&cfg.data_dir)).ok().map(|c| c.trim().to_string());
    let tokens: Vec<&str> = stored.iter().chain(cfg.join_token.iter()).map(String::as_str).collect();
    if tokens.is_empty() {
        return Err(AgentError::Register {
            server: cfg.server.clone(),
            reason: format!(
                "no join token and no node credential in {}: pass --join-token",
                credential_path(&cfg.data_dir).display()
            ),
        });
    }
    let mut refused = String::new();
    for token in tokens {
        let server = servers.current().to_string();
        let r = http.post(format!("{server}/v1/nodes")).bearer_auth(token).json(&body).send().await.map_err(|e| {
            servers.rotate();
            AgentError::Unreachable { server: server.clone(), reason: e.to_string() }
        })?;
        if let Some(why) = not_the_leader(&r, servers) {
            return Err(AgentError::Unreachable { server, reason: why });
        }
        let status = r.status();
        if status.is_success() {
            let reg: gpunet_api::types::NodeRegistered = r
                .json()
                .await
                .map_err(|e| AgentError::Register { server: cfg.server.clone(), reason: e.to_string() })?;
            save_credential(&cfg.data_dir, &reg.credential)?;
            return Ok(reg.credential);
        }
        refused = r.text().await.unwrap_or_default();
        if status.as_u16() != 401 && status.as_u16() != 403 {
            break;
        }
    }
    Err(AgentError::Register { server: cfg.server.clone(), reason: refused })
}

/// Whether a sync answer may be applied: one from an older leader's term (`Gpunet-Epoch` below the newest seen: a
/// leader that was paused and answers after another took over) is not; `newest` follows the newest epoch seen. An
/// answer without the header (a lone server) is applied.
pub fn accept_epoch(newest: &mut u64, header: Option<&str>) -> bool {
    let Some(e) = header.and_then(|h| h.trim().parse::<u64>().ok()) else { return true };
    if e < *newest {
        return false;
    }
    *newest = e;
    true
}

/// When `r` comes from a replica that is not the leader (a standby's 307, or 503 with `Retry-After` while no leader
/// serves), moves `servers` to the leader it names (when one of the list) or to the next server, and says why.
fn not_the_leader(r: &reqwest::Response, servers: &ServerList) -> Option<String> {
    let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(String::from);
    match r.status().as_u16() {
        307 | 308 => {
            let to = header("location").unwrap_or_default();
            if !servers.follow(&to) {
                tracing::warn!(to = %to, "a standby sends this agent to a leader that is not among its --server URLs");
                servers.rotate();
            }
            Some(format!("a standby; the leader is {to}"))
        }
        503 if r.headers().contains_key("retry-after") => {
            let leader = header("gpunet-leader");
            if !leader.as_deref().is_some_and(|l| servers.follow(l)) {
                servers.rotate();
            }
            Some("no leader serves right now".into())
        }
        _ => None,
    }
}

/// The default of [`AgentConfig::ended_job_files_keep`].
pub const DEFAULT_ENDED_JOB_FILES_KEEP: Duration = Duration::from_secs(3600);

/// How often the agent asks again about the jobs whose files it keeps (see [`JobFiles`]); it asks at once when that
/// set changes.
const HELD_ASK_EVERY: Duration = Duration::from_secs(15);

/// The jobs whose files (`homes/job-J`, `checkpoints/job-J`, `logs/job-J` and the node's own checkpoint tier
/// `tiers/job-J`) this node keeps. A job's files stay while it may come back here (a preempted job resumes from its
/// local checkpoint); once the server says it ended for good ([`AgentWork::ended_jobs`]) they are removed after
/// [`AgentConfig::ended_job_files_keep`], so that finished jobs cannot fill the node's disk for the next tenants.
#[derive(Debug, Default)]
struct JobFiles {
    held: std::collections::BTreeSet<u64>,
    /// Jobs the server said ended, since when.
    ended: std::collections::BTreeMap<u64, std::time::Instant>,
    /// The jobs with no task here when last asked about, and when.
    asked: Vec<u64>,
    /// The last job asked about, when there are more than one question holds.
    cursor: u64,
    asked_at: Option<std::time::Instant>,
}

impl JobFiles {
    /// The jobs with files under the data directory `dir`.
    fn scan(dir: &std::path::Path) -> JobFiles {
        let mut held = std::collections::BTreeSet::new();
        for sub in JOB_FILE_DIRS {
            let Ok(rd) = std::fs::read_dir(dir.join(sub)) else { continue };
            held.extend(rd.flatten().filter_map(|e| e.file_name().to_str()?.strip_prefix("job-")?.parse::<u64>().ok()));
        }
        JobFiles { held, ..JobFiles::default() }
    }

    /// What to ask this sync: the held jobs with no task here (`active`), when they changed or the last question is
    /// old; empty otherwise.
    ///
    /// At most [`gpunet_api::agent::HELD_JOBS_MAX`] at a time, the next ones (after `cursor`, wrapping) each time: a
    /// long-lived lot of low ids cannot keep the others from ever being asked about.
    fn question(&mut self, active: &HashSet<u64>) -> Vec<u64> {
        let idle: Vec<u64> = self.held.iter().copied().filter(|j| !active.contains(j)).collect();
        let due = self.asked_at.is_none_or(|t| t.elapsed() >= HELD_ASK_EVERY);
        if idle.is_empty() || (idle == self.asked && !due) {
            return Vec::new();
        }
        let max = gpunet_api::agent::HELD_JOBS_MAX;
        let from = if idle.len() > max { idle.partition_point(|j| *j <= self.cursor) } else { 0 };
        let window: Vec<u64> = idle[from..].iter().chain(&idle[..from]).take(max).copied().collect();
        self.cursor = if idle.len() > max { window.last().copied().unwrap_or(0) } else { 0 };
        self.asked = idle;
        self.asked_at = Some(std::time::Instant::now());
        window
    }

    /// The server's answer: the jobs that ended (and have no task here) wait out `keep` (see [`JobFiles::sweep`]).
    fn answer(&mut self, ended: &[u64], active: &HashSet<u64>) {
        let now = std::time::Instant::now();
        for j in ended {
            if !active.contains(j) && self.held.remove(j) {
                self.ended.insert(*j, now);
            }
        }
    }

    /// A job of the server's task set or being started here is not ended, whatever was said before (an id the server
    /// did not know, used again by a server that started afresh).
    fn in_use(&mut self, jobs: impl IntoIterator<Item = u64>) {
        for j in jobs {
            self.ended.remove(&j);
            self.held.insert(j);
        }
    }

    /// Removes, off the loop, the files of the jobs that ended at least `keep` ago and have no task here (`active`).
    fn sweep(&mut self, dir: &std::path::Path, keep: Duration, active: &HashSet<u64>) {
        let due: Vec<u64> =
            self.ended.iter().filter(|(j, at)| at.elapsed() >= keep && !active.contains(j)).map(|(j, _)| *j).collect();
        if due.is_empty() {
            return;
        }
        for j in &due {
            self.ended.remove(j);
        }
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            for j in due {
                for sub in JOB_FILE_DIRS {
                    // `remove_dir_all` works beneath directory descriptors and never follows a symlink the job
                    // planted.
                    match remove_job_path(&dir.join(sub).join(format!("job-{j}"))) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            tracing::warn!(job = j, dir = sub, error = %e, "remove an ended job's files")
                        }
                        _ => {}
                    }
                }
                tracing::info!(job = j, "an ended job's files removed");
            }
        });
    }
}

/// The data directory's per-job directories (see [`JobFiles`]); `owners` holds which job each `job-J` is, a file
/// (see `launcher::claim_job`).
pub(crate) const JOB_FILE_DIRS: [&str; 5] = ["homes", "checkpoints", "logs", "tiers", "owners"];

/// Removes a job's directory (`remove_dir_all`: beneath directory descriptors, never following a symlink the job
/// planted) or file; a missing one is no error.
pub(crate) fn remove_job_path(p: &std::path::Path) -> std::io::Result<()> {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Takes in a task attempt's end: reported with the next sync.
fn take_exit(launcher: &mut Launcher, ended: &mut HashSet<TaskRef>, pending: &mut Vec<TaskExit>, mut e: TaskExit) {
    e.stopped = launcher.was_stopped(&e.task);
    launcher.reaped(&e.task);
    ended.insert(e.task);
    pending.push(e);
}

/// Takes in a launch that ended (its task's start is reported with the next sync). The server may have changed its
/// mind meanwhile: the task is stopped at once if the server's latest task set `latest` no longer has it (or the
/// node fenced itself), and asked to checkpoint if its node is being reclaimed.
fn take_start(launcher: &mut Launcher, latest: &[TaskAssignment], fenced: bool, b: launcher::Begun) {
    let Some(t) = launcher.take(b) else { return };
    match latest.iter().find(|a| a.task == t) {
        Some(a) if !fenced => {
            if let Some(now) = &a.checkpoint_now {
                launcher.checkpoint_now(a, now);
            }
        }
        _ => launcher.stop(&t, Duration::from_millis(gpunet_core::lifecycle::STOP_GRACE.0)),
    }
}

/// The jobs with a task on this node: running, being started, ended but not yet reported or with log left to ship,
/// or in the server's latest task set.
fn active_jobs(
    launcher: &Launcher,
    starting: &launcher::Starting,
    pending: &[TaskExit],
    draining: &std::collections::HashMap<TaskRef, std::time::Instant>,
    latest: &[TaskAssignment],
) -> HashSet<u64> {
    launcher
        .running()
        .iter()
        .chain(starting.tasks())
        .chain(pending.iter().map(|e| &e.task))
        .chain(draining.keys())
        .chain(latest.iter().map(|a| &a.task))
        .map(|t| t.job)
        .collect()
}

/// Stops every task (SIGTERM, SIGKILL after 5 s), gives them their grace to end, and removes their cgroups (which
/// kills whatever is left in them).
async fn shut_down(
    launcher: &mut Launcher,
    starting: &mut launcher::Starting,
    exits: &mut mpsc::UnboundedReceiver<TaskExit>,
) {
    let grace = Duration::from_secs(5);
    launcher.stop_all(grace);
    // Launches in flight (a checkpoint restore may take minutes) are waited for, after the running tasks were told to
    // stop: their processes may run already, and each is stopped as it is taken in.
    while let Some(b) = starting.next().await {
        if let Some(t) = launcher.take(b) {
            launcher.stop(&t, grace);
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while !launcher.running().is_empty() && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout_at(deadline, exits.recv()).await {
            Ok(Some(e)) => launcher.reaped(&e.task),
            _ => break,
        }
    }
    launcher.remove_cgroups();
}

/// How long after its last sync the agent stops its tasks itself (self-fencing, SIGTERM) when the server gives a
/// silent node's tasks away after `fence_after` (and declares the node lost after `lost_after`, when it says): the
/// stop grace before that (10 s), but never before halfway between the loss and the give-away, so that a task is not
/// stopped while the server may still count its node alive (it notices a loss at its next scheduling pass). Without
/// the loss time, at least half the fence time. The node's lease says the same point to the tasks' wrappers, which
/// kill at `fence_after` (see [`lease`]).
fn fence_point(fence_after: Duration, lost_after: Option<Duration>) -> Duration {
    let grace = Duration::from_millis(gpunet_core::lifecycle::STOP_GRACE.0);
    match lost_after.filter(|l| *l < fence_after) {
        Some(lost) => fence_after - grace.min((fence_after - lost) / 2),
        None => fence_after.saturating_sub(grace).max(fence_after / 2),
    }
}

/// Kills every task an agent named `name` with data directory `data_dir` left running, as if its machine were
/// switched off: each recorded task's process group and every process in its cgroups, then its containers. For
/// machines that are not real — the server's `local` pool provider calls it when it deletes a node whose agent died
/// without stopping its tasks (`kill -9`, or a crash). Call it only once that agent is gone. Returns the tasks killed.
pub fn kill_left_tasks(name: &str, data_dir: &std::path::Path) -> usize {
    if !data_dir.is_dir() {
        return 0;
    }
    let tag = format!("gpunet-{}-{}", name, container::agent_tag(data_dir));
    let cg = cgroups::Cgroups::detect(std::path::Path::new("/sys/fs/cgroup"), &tag);
    let (tx, _rx) = mpsc::unbounded_channel::<TaskExit>();
    let mut launcher = Launcher::new(data_dir.to_path_buf(), tx, cg);
    if let Ok(Some(rt)) = container::Runtime::detect(data_dir, &container::Options::default()) {
        launcher.containers(std::sync::Arc::new(rt));
    }
    let n = launcher.kill_recorded();
    launcher.sweep_containers();
    launcher.remove_cgroups();
    n
}

/// Runs the agent until `shutdown` resolves; then stops its tasks.
pub async fn run(mut cfg: AgentConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<(), AgentError> {
    let servers = ServerList::parse("--server", &cfg.server).map_err(|e| AgentError::Invalid {
        field: "--server",
        value: cfg.server.clone(),
        allowed: e.message,
    })?;
    let http = http_client(&cfg)?;
    // One parent group per agent and data directory: two agents on one machine never share task groups (whose
    // processes are all killed at the end of an attempt), and an agent started again on the same directory finds
    // its groups.
    // (Made first, so that the tag hashes its canonical path on the first start as on every later one.)
    let _ = std::fs::create_dir_all(&cfg.data_dir);
    let tag = format!("gpunet-{}-{}", cfg.name, container::agent_tag(&cfg.data_dir));
    if cfg.tenant_uid_base.is_some() && cfg.run_as.is_none() && !others_can_reach(&cfg.data_dir) {
        tracing::warn!(data_dir = %cfg.data_dir.display(), "per-tenant users cannot reach the data directory \
                       (a parent without the others' x bit): their tasks will fail to start");
    }
    let cg = cgroups::Cgroups::detect(std::path::Path::new("/sys/fs/cgroup"), &tag);
    let isolation = cg.describe();
    tracing::info!(isolation = %isolation, "isolation");
    let (tx, mut exits) = mpsc::unbounded_channel::<TaskExit>();
    let (notice_tx, mut notices) = mpsc::unbounded_channel::<f64>();
    if let Some(c) = cfg.notice_command.clone() {
        watch_notices(c, notice_tx.clone());
    }
    let mut launcher = Launcher::new(cfg.data_dir.clone(), tx, cg);
    launcher.set_mig_uuids(mig_uuids(&cfg));
    if let Some(w) = &cfg.wrapper {
        launcher.wrap_with(w.clone());
    }
    launcher.task_path(cfg.task_path.clone());
    launcher.fence_by_lease(cfg.data_dir.join(lease::FILE));
    launcher.pids_max(cfg.task_pids_max);
    if cfg.task_disk_max > 0 {
        launcher.disk_limits(cfg.task_disk_max, cfg.task_files_max, cfg.task_disk_check);
    }
    launcher.snapshot_max_bytes(cfg.snapshot_max_bytes);
    if let Some(base) = cfg.tenant_uid_base {
        launcher.tenant_uids(base);
    }
    if let Some(d) = &cfg.device_dir {
        launcher.device_dir(d.clone());
    }
    if cfg.pid_namespace {
        let checked = match &cfg.wrapper {
            Some(w) => wrapper::check_pid_namespace(w),
            None => Err("tasks run without the wrapper (task-exec)".into()),
        };
        match checked {
            Ok(()) => launcher.pid_namespaces(true),
            Err(reason) if running_as_root() && (cfg.tenant_uid_base.is_some() || cfg.run_as.is_some()) => {
                return Err(AgentError::Invalid {
                    field: "--pid-namespace",
                    value: "on".into(),
                    allowed: format!(
                        "tasks cannot get a pid namespace here ({reason}); without one tenants see each other's \
                         processes: allow unshare (CAP_SYS_ADMIN) or pass --no-pid-namespace"
                    ),
                });
            }
            Err(reason) => {
                tracing::warn!(reason = %reason, "tasks cannot get a pid namespace here: they run without one and \
                               see the node's processes (--no-pid-namespace silences this)");
            }
        }
    }
    // Containers: only through the wrapper (their parent, which reads their exit), as root.
    let runtime = match &cfg.wrapper {
        Some(_) => {
            container::Runtime::detect(&cfg.data_dir, &cfg.containers).map_err(|reason| AgentError::Invalid {
                field: "--container-runtime",
                value: cfg.containers.runtime.clone().unwrap_or_default(),
                allowed: reason,
            })?
        }
        None => None,
    };
    if let Some(rt) = runtime {
        tracing::info!(runtime = %rt.exe.display(), init = ?rt.init, images = %rt.images.dir.display(), "container tasks");
        for (k, v) in rt.labels() {
            cfg.labels.insert(k, v);
        }
        launcher.containers(std::sync::Arc::new(rt));
    }
    // Tasks a previous run of this agent left: adopted and reported as running; the server's first answer says
    // which of them stay (the others are stopped below like any task the server no longer wants). Containers whose
    // wrapper is gone are deleted.
    let adopted = launcher.adopt();
    launcher.sweep_containers();
    if !adopted.is_empty() {
        tracing::info!(tasks = adopted.len(), "adopted tasks left running by a previous run of this agent");
    }
    let mut backoff = Duration::from_millis(100);
    // A stop asked for while the server cannot be reached yet stops the agent (and what it adopted) too.
    tokio::pin!(shutdown);
    // Tasks being started: the loop goes on meanwhile (see `launcher::Starting`).
    let mut starting = launcher::Starting::default();
    let mut credential = loop {
        let attempt = tokio::select! {
            r = register(&http, &cfg, &servers, &isolation) => r,
            _ = &mut shutdown => {
                shut_down(&mut launcher, &mut starting, &mut exits).await;
                return Ok(());
            }
        };
        match attempt {
            Ok(c) => break c,
            Err(AgentError::Unreachable { server, reason }) => {
                tracing::warn!(server = %server, error = %reason, "server unreachable; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = &mut shutdown => {
                        shut_down(&mut launcher, &mut starting, &mut exits).await;
                        return Ok(());
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    };
    tracing::info!(node = %cfg.name, server = %servers.current(), "agent registered");
    if let Some(u) = &cfg.run_as {
        launcher.run_as(u).map_err(|reason| AgentError::Invalid {
            field: "--run-as",
            value: u.clone(),
            allowed: reason,
        })?;
    }
    let mut pending: Vec<TaskExit> = Vec::new();
    let mut ended: HashSet<TaskRef> = HashSet::new();
    // The jobs whose files this node keeps, from an earlier run of the agent too.
    let mut job_files = JobFiles::scan(&cfg.data_dir);
    // The server's latest task set: a task whose start ends after it was answered is checked against it.
    let mut latest: Vec<TaskAssignment> = Vec::new();
    let mut known = 0u64;
    // GPUs the server's latest assignment gives this node's tasks (fake samples show the others idle).
    let mut assigned_gpus: HashSet<u32> = HashSet::new();
    // The newest leader epoch a sync answer carried (see `accept_epoch`).
    let mut newest_epoch = 0u64;
    // How far each task attempt's log has been shipped.
    let mut shipped: std::collections::HashMap<TaskRef, u64> = std::collections::HashMap::new();
    // Ended task attempts (their exit reported) whose log is not all shipped yet, since when.
    let mut draining: std::collections::HashMap<TaskRef, std::time::Instant> = std::collections::HashMap::new();
    backoff = Duration::from_millis(100);
    // Real GPUs are sampled for the server's metrics; fake ones report nothing.
    let nvml = match (&cfg.fake_gpus, cfg.real_gpus.is_empty()) {
        (None, false) => match gpus::open() {
            Ok(n) => Some(std::sync::Arc::new(n)),
            Err(e) => {
                tracing::warn!(error = %e, "GPU metrics off");
                None
            }
        },
        _ => None,
    };
    // XID errors come from NVML's event API, on a thread of its own that ends when `xid` is dropped with this loop.
    let xid = std::sync::Arc::new(gpu_errors::XidCounts::default());
    if let Some(n) = &nvml {
        if let Err(e) = gpu_errors::watch_xid(n.clone(), &xid) {
            tracing::warn!(error = %e, "XID errors are not watched: no thread");
        }
    }
    let fake_errors_file = cfg.data_dir.join(gpu_errors::FAKE_ERRORS_FILE);
    let mut last_sample: Option<std::time::Instant> = None;
    let fake_samples = cfg.fake_gpus.filter(|_| cfg.fake_gpu_samples);
    let started = std::time::Instant::now();
    // Self-fencing: when the last sync succeeded, and after how long without one the server gives our tasks away.
    let mut last_synced = std::time::Instant::now();
    let mut lease = lease::Writer::new(&cfg.data_dir);
    let mut lease_failing = false;
    let mut fence_after: Option<Duration> = None;
    let mut lost_after: Option<Duration> = None;
    let mut fenced = false;
    loop {
        // What ended and started while the last report was in flight.
        while let Ok(e) = exits.try_recv() {
            take_exit(&mut launcher, &mut ended, &mut pending, e);
        }
        while let Some(b) = futures_util::FutureExt::now_or_never(starting.next()).flatten() {
            take_start(&mut launcher, &latest, fenced, b);
        }
        // The jobs with a task here, once per turn: the sweep and the question both skip them.
        let active = active_jobs(&launcher, &starting, &pending, &draining, &latest);
        job_files.sweep(&cfg.data_dir, cfg.ended_job_files_keep, &active);
        let mut logs = Vec::new();
        let mut tasks: Vec<TaskRef> = launcher.running();
        tasks.extend(pending.iter().map(|e| e.task));
        tasks.extend(draining.keys().copied());
        let mut seen = HashSet::new();
        tasks.retain(|t| seen.insert(*t));
        // What each task has left to ship; the sync's budget is shared fairly (one task's spam cannot starve
        // another's output).
        let owed: Vec<(TaskRef, u64, u64)> = tasks
            .into_iter()
            .map(|t| {
                let from = shipped.get(&t).copied().unwrap_or(0);
                let len = std::fs::metadata(launcher::log_path(&cfg.data_dir, &t)).map_or(0, |m| m.len());
                (t, from, len.saturating_sub(from))
            })
            .filter(|(_, _, n)| *n > 0)
            .collect();
        let shares = fair_shares(&owed.iter().map(|(_, _, n)| *n).collect::<Vec<_>>(), LOG_BUDGET);
        for ((t, from, _), take) in owed.into_iter().zip(shares) {
            if take == 0 {
                continue;
            }
            if let Ok(mut f) = std::fs::File::open(launcher::log_path(&cfg.data_dir, &t)) {
                use std::io::{Read, Seek};
                let mut buf = vec![0u8; take as usize];
                if f.seek(std::io::SeekFrom::Start(from)).is_ok() && f.read_exact(&mut buf).is_ok() {
                    logs.push(gpunet_api::agent::LogChunk { task: t, offset: from, data: buf });
                }
            }
        }
        let gpu_samples = match &nvml {
            Some(n) if last_sample.is_none_or(|t| t.elapsed() >= GPU_SAMPLE_EVERY) => {
                last_sample = Some(std::time::Instant::now());
                let (n, xid) = (n.clone(), xid.clone());
                tokio::task::spawn_blocking(move || gpus::sample(&n, &xid)).await.ok()
            }
            None => match fake_samples {
                Some((model, count)) if last_sample.is_none_or(|t| t.elapsed() >= GPU_SAMPLE_EVERY) => {
                    last_sample = Some(std::time::Instant::now());
                    let secs = started.elapsed().as_secs();
                    let errors = fake_errors(&fake_errors_file);
                    Some(
                        (0..count as u32)
                            .map(|i| {
                                let errs = errors.get(&i).copied().unwrap_or_default();
                                gpus::fake_sample(i, model, secs, assigned_gpus.contains(&i), &errs)
                            })
                            .collect(),
                    )
                }
                _ => None,
            },
            _ => None,
        };
        let sync = AgentSync {
            known_version: known,
            running: launcher.running(),
            exited: pending.clone(),
            started: launcher.started.lock().expect("starts").clone(),
            logs: logs.clone(),
            checkpoints: launcher.checkpointed.lock().expect("checkpoint sink").clone(),
            gpu_samples,
            checkpoint_failures: launcher.checkpoint_failures.load(std::sync::atomic::Ordering::Relaxed),
            checkpoints_now: launcher.checkpointed_now.lock().expect("checkpoint sink").clone(),
            held_jobs: job_files.question(&active),
        };
        let sent_ckpts = sync.checkpoints.len();
        let sent_now = sync.checkpoints_now.len();
        let sent = pending.len();
        let sent_starts = sync.started.len();
        // A report (ends, starts, logs, checkpoints) is answered at once; a sync with none is held by the server until
        // it has news for this node.
        let reporting = sent > 0
            || sent_starts > 0
            || !sync.logs.is_empty()
            || sent_ckpts > 0
            || sent_now > 0
            || !sync.held_jobs.is_empty();
        let (sent_at, sent_ms) = (std::time::Instant::now(), lease::now_ms());
        let req = http
            .post(format!("{}/v1/agents/{}/sync", servers.current(), cfg.name))
            .bearer_auth(&credential)
            .json(&sync)
            .send();
        // A server that stopped answering (frozen, or a network that drops packets) must not hold the loop: a sync
        // gives up after SYNC_TIMEOUT (well above the server's long poll), or a quarter of the fence time.
        let wait = fence_after.map_or(SYNC_TIMEOUT, |f| SYNC_TIMEOUT.min(f / 4).max(Duration::from_millis(500)));
        let req = tokio::time::timeout(wait, req);
        tokio::select! {
            _ = &mut shutdown => {
                shut_down(&mut launcher, &mut starting, &mut exits).await;
                return Ok(());
            }
            Some(seconds) = notices.recv() => {
                // Our own node's reclaim notice, with our own credential; the in-flight sync is sent again.
                let r = http
                    .post(format!("{}/v1/nodes/{}/reclaim", servers.current(), cfg.name))
                    .bearer_auth(&credential)
                    .json(&serde_json::json!({ "deadline_s": seconds }))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => tracing::info!(seconds, "reclaim notice sent"),
                    Ok(r) if r.status().is_client_error() => {
                        tracing::warn!(status = %r.status(), "the reclaim notice was refused")
                    }
                    r => {
                        // The server is away: again in 2 s, with 2 s less.
                        tracing::warn!(result = ?r.map(|r| r.status()), "send the reclaim notice; trying again");
                        let again = notice_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            let _ = again.send((seconds - 2.0).max(0.1));
                        });
                    }
                }
            }
            // A task's process runs, or one ended: the next sync reports it. An idle sync (the server holds it until
            // it has news) is dropped for that; a report in flight is answered at once, and the next one carries
            // what came meanwhile (reports are idempotent).
            Some(b) = starting.next(), if !starting.is_empty() && !reporting => {
                take_start(&mut launcher, &latest, fenced, b);
            }
            Some(e) = exits.recv(), if !reporting => {
                take_exit(&mut launcher, &mut ended, &mut pending, e);
            }
            r = req => {
                let r = match r {
                    Ok(r) => r.map_err(SyncError::from),
                    Err(_) => Err(SyncError::NoAnswer(wait)),
                };
                let work = match r {
                    Ok(resp) if resp.status().is_success() => {
                        let epoch = resp.headers().get("gpunet-epoch").and_then(|v| v.to_str().ok());
                        if accept_epoch(&mut newest_epoch, epoch) {
                            resp.json::<AgentWork>().await.ok()
                        } else {
                            tracing::warn!(server = %servers.current(), "a task set from an older leader's term ignored");
                            servers.rotate();
                            None
                        }
                    }
                    Ok(resp) if not_the_leader(&resp, &servers).is_some() => {
                        // A failover: the tasks run on; the next sync goes to the leader (or the next server), and
                        // tells it what runs here.
                        tracing::info!(status = %resp.status(), server = %servers.current(), "not the leader; moving");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Ok(resp) if matches!(resp.status().as_u16(), 401 | 404) => {
                        // The server does not know this node (a new server) or no longer takes its credential (the
                        // node was registered again elsewhere): register again.
                        tracing::warn!(status = %resp.status(), node = %cfg.name, "sync refused; registering again");
                        match register(&http, &cfg, &servers, &isolation).await {
                            Ok(c) => credential = c,
                            Err(e) => tracing::warn!(error = %e, "register again"),
                        }
                        None
                    }
                    Ok(resp) => {
                        tracing::warn!(status = %resp.status(), "sync refused");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(server = %servers.current(), error = %e, "server unreachable; retrying");
                        servers.rotate();
                        None
                    }
                };
                let Some(work) = work else {
                    if let Some(f) = fence_after {
                        let grace = Duration::from_millis(gpunet_core::lifecycle::STOP_GRACE.0);
                        let at = fence_point(f, lost_after);
                        let running = launcher.running();
                        // Tasks still starting count: each is stopped as it is taken in (`fenced`).
                        if last_synced.elapsed() >= at && !(running.is_empty() && starting.is_empty()) {
                            if !fenced {
                                tracing::error!(
                                    silent_s = last_synced.elapsed().as_secs(),
                                    fence_s = f.as_secs(),
                                    tasks = running.len(),
                                    "no sync with the server for nearly its fence time: it is giving this node's \
                                     tasks away, so they are stopped here (self-fencing)"
                                );
                            }
                            fenced = true;
                            // A task whose wrapper watches the (renewed) lease is stopped by it at this same
                            // point: a second SIGTERM from here could make it skip its shutdown.
                            let own: Vec<TaskRef> = running
                                .into_iter()
                                .filter(|t| lease_failing || !launcher.fenced_by_lease(t))
                                .collect();
                            for t in &own {
                                launcher.stop(t, grace);
                            }
                        }
                    }
                    // A stop asked for while the server is away is not held up by the wait (it was up to 5 s,
                    // and a supervisor that kills after its own timeout then left the tasks running).
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut shutdown => {
                            shut_down(&mut launcher, &mut starting, &mut exits).await;
                            return Ok(());
                        }
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                };
                backoff = Duration::from_millis(100);
                // Counted from when the sync was sent: the server counts from when it arrived.
                last_synced = sent_at;
                fenced = false;
                fence_after = work.fence_after_ms.map(Duration::from_millis);
                lost_after = work.lost_after_ms.map(Duration::from_millis);
                // Before any task of this answer starts: until when the node's tasks may run without another sync,
                // for their wrappers, which stop them themselves if this agent is frozen (see `lease`).
                // They get SIGTERM at the fence point and SIGKILL when the server gives them away.
                let fence = fence_after.map(|f| {
                    let at = fence_point(f, lost_after);
                    (at, f - at)
                });
                match lease.renew(sent_ms, fence) {
                    Ok(()) if lease_failing => {
                        lease_failing = false;
                        tracing::info!(file = %lease.path().display(), "the node's lease is renewed again");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        // A stale lease would stop every task, new ones at once: none is better (the agent, alive,
                        // still fences itself). Said once per failing spell.
                        let removed = std::fs::remove_file(lease.path());
                        if !lease_failing {
                            lease_failing = true;
                            tracing::error!(file = %lease.path().display(), error = %e, removed = removed.is_ok(),
                                            "could not renew the node's lease: it is removed, and tasks are not \
                                             fenced from outside the agent until it can be written again");
                        }
                    }
                }
                for c in &logs {
                    shipped.insert(c.task, c.offset + c.data.len() as u64);
                }
                // Reported exits are done; what is left of their logs keeps shipping (the server takes the logs of
                // a node's task attempts for a while after they left it), for at most LOG_DRAIN.
                for e in pending.drain(..sent.min(pending.len())) {
                    draining.insert(e.task, std::time::Instant::now());
                }
                draining.retain(|t, since| {
                    let len = std::fs::metadata(launcher::log_path(&cfg.data_dir, t)).map_or(0, |m| m.len());
                    let left = shipped.get(t).copied().unwrap_or(0) < len;
                    if left && since.elapsed() >= LOG_DRAIN {
                        tracing::warn!(job = t.job, rank = t.rank, "the end of an ended task's log was not shipped in time");
                    }
                    left && since.elapsed() < LOG_DRAIN
                });
                {
                    let mut st = launcher.started.lock().expect("starts");
                    let n = sent_starts.min(st.len());
                    st.drain(..n);
                }
                {
                    let mut c = launcher.checkpointed.lock().expect("checkpoint sink");
                    let n = sent_ckpts.min(c.len());
                    c.drain(..n);
                }
                {
                    let mut c = launcher.checkpointed_now.lock().expect("checkpoint sink");
                    let n = sent_now.min(c.len());
                    c.drain(..n);
                }
                known = work.version;
                let want: HashSet<TaskRef> = work.tasks.iter().map(|t| t.task).collect();
                assigned_gpus = work.tasks.iter().flat_map(|t| t.gpus.iter().copied()).collect();
                ended.retain(|t| want.contains(t));
                let live: HashSet<TaskRef> = launcher
                    .running()
                    .into_iter()
                    .chain(pending.iter().map(|e| e.task))
                    .chain(draining.keys().copied())
                    .collect();
                shipped.retain(|t, _| live.contains(t));
                for t in launcher.running() {
                    if !want.contains(&t) {
                        let grace = Duration::from_millis(gpunet_core::lifecycle::STOP_GRACE.0);
                        launcher.stop(&t, grace);
                    }
                }
                let mut new = Vec::new();
                for a in &work.tasks {
                    if launcher.is_running(&a.task) {
                        launcher.attach(a); // an adopted task gets its probe and checkpoint copies
                        if let Some(now) = &a.checkpoint_now {
                            launcher.checkpoint_now(a, now); // its node is being reclaimed
                        }
                    } else if !ended.contains(&a.task) && !starting.contains(&a.task) {
                        new.push(a);
                    }
                }
                // Together and in the background: the last of a batch does not wait for the others' directories,
                // cgroups and execs, nor does the next task the server places.
                launcher.begin(&mut starting, &new);
                job_files.in_use(work.tasks.iter().map(|a| a.task.job));
                latest = work.tasks;
                let now_active = active_jobs(&launcher, &starting, &pending, &draining, &latest);
                job_files.answer(&work.ended_jobs, &now_active);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_stopped_a_grace_before_the_give_away_but_never_before_halfway_from_the_loss() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // The defaults: lost after 10 s, given away after 70 s: SIGTERM at 60 s (the 10 s grace).
        assert_eq!(fence_point(s(70), Some(s(10))), s(60));
        // A short fence: halfway between the loss (1 s) and the give-away (2 s), never at the loss itself.
        assert_eq!(fence_point(s(2), Some(s(1))), ms(1500));
        assert_eq!(fence_point(s(5), Some(s(1))), s(3));
        // An older server (no loss time), or a loss time that is not before the give-away: as before.
        assert_eq!(fence_point(s(2), None), s(1));
        assert_eq!(fence_point(s(70), None), s(60));
        assert_eq!(fence_point(s(2), Some(s(2))), s(1));
    }

    #[test]
    fn job_files_are_asked_about_in_turn_and_a_job_back_in_use_is_not_ended() {
        let max = gpunet_api::agent::HELD_JOBS_MAX as u64;
        let mut f = JobFiles { held: (1..=max + 10).collect(), ..JobFiles::default() };
        let active: HashSet<u64> = [3].into();
        let first = f.question(&active);
        assert_eq!(first.len() as u64, max);
        assert!(!first.contains(&3) && first[0] == 1);
        // Unchanged and asked just now: nothing.
        assert!(f.question(&active).is_empty());
        // Due again: the next ones, wrapping round (the first question ended at max + 1, job 3 being left out).
        assert_eq!(first.last(), Some(&(max + 1)));
        f.asked_at = Some(std::time::Instant::now() - HELD_ASK_EVERY);
        let second = f.question(&active);
        assert_eq!(second[..10], (max + 2..=max + 10).chain([1]).collect::<Vec<_>>()[..]);
        assert_eq!(second.len() as u64, max);
        // The server says 1 and 2 ended; 3 still runs here, so it stays whatever the server says.
        f.answer(&[1, 2, 3], &active);
        assert!(f.ended.contains_key(&1) && f.ended.contains_key(&2) && !f.ended.contains_key(&3));
        assert!(!f.held.contains(&1) && f.held.contains(&3));
        // Job 2 is in a task set again (its id reused): not ended any more, held again.
        f.in_use([2]);
        assert!(!f.ended.contains_key(&2) && f.held.contains(&2));
    }

    #[test]
    fn log_budget_shares_are_fair() {
        assert_eq!(fair_shares(&[10_000_000, 20], 1000), vec![980, 20]);
        assert_eq!(fair_shares(&[5000, 5000, 10], 1000), vec![495, 495, 10]);
        assert_eq!(fair_shares(&[1, 2], 1000), vec![1, 2]);
        assert_eq!(fair_shares(&[], 1000), Vec::<u64>::new());
    }

    #[test]
    fn an_older_leaders_task_set_is_not_applied() {
        let mut newest = 0;
        assert!(accept_epoch(&mut newest, None), "a lone server's answer");
        assert!(accept_epoch(&mut newest, Some("7")));
        assert!(accept_epoch(&mut newest, Some("7")));
        assert!(accept_epoch(&mut newest, Some("9")));
        assert!(!accept_epoch(&mut newest, Some("8")), "a paused old leader answering late");
        assert_eq!(newest, 9);
        assert!(accept_epoch(&mut newest, Some("not a number")));
        assert_eq!(newest, 9);
    }

    #[test]
    fn fake_gpu_specs_parse() {
        assert_eq!(parse_fake_gpus("8xA100-80GB").unwrap(), (GpuModel::A100_80GB, 8));
        assert_eq!(parse_fake_gpus("2XT4").unwrap(), (GpuModel::T4, 2));
        for bad in ["8", "0xT4", "65xT4", "8xB300", "xT4"] {
            assert!(parse_fake_gpus(bad).is_err(), "{bad}");
        }
        assert!(parse_fake_gpus("8xB300").unwrap_err().to_string().contains("H100-80GB"));
    }

    #[test]
    fn fake_nodes_offer_enough_cpu_and_memory_per_gpu() {
        let cfg = AgentConfig {
            server: String::new(),
            ca: None,
            join_token: None,
            name: "n".into(),
            labels: BTreeMap::from([("zone".to_string(), "z1".to_string())]),
            fake_gpus: Some((GpuModel::A100_80GB, 8)),
            fake_mig: Vec::new(),
            real_gpus: Vec::new(),
            data_dir: PathBuf::from("/tmp"),
            cpu: None,
            mem: None,
            address: "127.0.0.1".into(),
            run_as: None,
            wrapper: None,
            task_path: launcher::DEFAULT_TASK_PATH.into(),
            tenant_uid_base: None,
            device_dir: None,
            price_per_gpu_hour: None,
            fake_gpu_samples: false,
            pid_namespace: false,
            task_pids_max: cgroups::TASK_PIDS_MAX,
            task_disk_max: disk::DEFAULT_TASK_DISK_MAX,
            task_files_max: disk::DEFAULT_TASK_FILES_MAX,
            task_disk_check: launcher::DISK_CHECK_EVERY,
            snapshot_max_bytes: checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
            ended_job_files_keep: DEFAULT_ENDED_JOB_FILES_KEEP,
            containers: Default::default(),
            notice_command: None,
        };
        let n = node_spec(&cfg);
        assert_eq!(n.gpus.len(), 8);
        assert!(n.cpu >= MilliCpu::cores(32) && n.mem >= MiB::gib(128));
        assert_eq!(n.labels["address"], "127.0.0.1");
    }
}
