//! Runs tasks as real processes: each in its own process group (so the whole tree is signalled) and cgroups, as its
//! tenant's user where configured, with an environment built from nothing ([`Launcher::task_env`]), in its own
//! directory (`HOME`; `working_dir` beneath it), stdout and stderr appended to one log file per attempt.
//! Stopping sends SIGTERM to the group, then SIGKILL after the grace period; when the attempt ends, everything left
//! in its cgroups is killed (see [`crate::cgroups::TaskCgroup::kill_all`]).

use crate::cgroups::Cgroups;
use gpunet_api::agent::{TaskAssignment, TaskExit, TaskRef, TaskStart};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

mod start;

pub use start::{Begun, Starting};

/// A running task.
#[derive(Debug)]
struct Proc {
    pgid: i32,
    stopping: bool,
    /// Cleared the moment the process is reaped: after that its id may belong to someone else, so no signal may be
    /// sent to it (PIDs wrap quickly on busy machines).
    alive: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// For a task adopted from a previous run of the agent (not our child): its start time, checked before every
    /// signal, and the slots its liveness probe and checkpoint copier go into once the server's assignment is known.
    adopted: Option<(u64, Extras)>,
    /// For a task whose wrapper the spawner forked (not our child either): its start time, checked before every
    /// signal (see [`crate::spawner`]).
    leader_start: Option<u64>,
    /// The slots of its checkpoint copier and probe (the same as the exit watcher's).
    extras: Extras,
    /// A checkpoint-now request was acted on.
    asked: bool,
    /// Its wrapper was started watching the node's lease (an adopted task's is not known to).
    leased: bool,
}

/// What a task's exit watcher reads at the end: the checkpoint copier (for the final copy) and a failed probe.
#[derive(Debug, Clone, Default)]
struct Extras {
    copier: std::sync::Arc<std::sync::Mutex<Option<std::sync::Arc<TierCopier>>>>,
    probe_failed: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    attached: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The agent killed the task at its memory limit.
    oom: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Where the kernel holds a task at its memory limit (v1 `oom_kill_disable`), kills the task's group and marks the
/// end as OOM. `adopted_start`: the leader's start time when it is not our child (checked before the signal).
fn watch_oom(
    group: &crate::cgroups::TaskCgroup,
    pid: i32,
    adopted_start: Option<u64>,
    alive: std::sync::Arc<std::sync::atomic::AtomicBool>,
    oom: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    if !group.holds_at_limit() {
        return;
    }
    let g = group.clone();
    tokio::spawn(async move {
        while alive.load(std::sync::atomic::Ordering::SeqCst) {
            if g.under_oom() {
                oom.store(true, std::sync::atomic::Ordering::SeqCst);
                if alive.load(std::sync::atomic::Ordering::SeqCst) && adopted_start.is_none_or(|s| same_leader(pid, s))
                {
                    tracing::warn!(pid, "task at its memory limit: killed (OOM)");
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
}

/// The launcher: spawns tasks and reports their ends on a channel.
#[derive(Debug)]
pub struct Launcher {
    /// MIG UUIDs by GPU index and instance (empty: no MIG).
    mig_uuids: Vec<Vec<String>>,
    dir: PathBuf,
    procs: HashMap<TaskRef, Proc>,
    exits: mpsc::UnboundedSender<TaskExit>,
    /// Starts not yet reported (a container task's once its container runs).
    pub started: std::sync::Arc<std::sync::Mutex<Vec<TaskStart>>>,
    cgroups: Cgroups,
    /// Run tasks as this user (uid, gid) instead of the agent's.
    run_as: Option<(u32, u32)>,
    /// Checkpoints copied to a tier, not yet reported: (task, when).
    pub checkpointed: std::sync::Arc<std::sync::Mutex<Vec<(TaskRef, u64)>>>,
    /// Checkpoint copies to a tier that failed since the agent started (reported to the server's metrics).
    pub checkpoint_failures: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Final snapshots taken on a checkpoint-now request, on every tier, not yet reported: (task, when).
    pub checkpointed_now: std::sync::Arc<std::sync::Mutex<Vec<(TaskRef, u64)>>>,
    /// `gpunet task-exec`, which records each task's end so that a restarted agent can adopt it (see
    /// [`crate::wrapper`]); without it tasks run directly and a restarted agent kills them.
    wrapper: Option<PathBuf>,
    /// `PATH` of every task (and of the wrapper).
    task_path: String,
    /// Per-tenant identities: uid and gid `base + tenant index`.
    tenant_uid_base: Option<u32>,
    /// Where the GPUs' device nodes are (`/dev`; another directory in tests with fake device nodes).
    dev_dir: PathBuf,
    /// Each task (and probe) in a PID and mount namespace of its own (see [`crate::wrapper`]).
    pid_namespace: bool,
    /// The most processes a task attempt may have (`pids.max` of its cgroup, where the pids controller is there).
    pids_max: u64,
    /// The most bytes one checkpoint snapshot may write to a tier.
    snapshot_max_bytes: u64,
    /// How the node runs container tasks (jobs with an image); `None`: it does not.
    containers: Option<std::sync::Arc<crate::container::Runtime>>,
    /// The task spawner, which forks the wrappers of tasks (see [`crate::spawner`]); shared with the launches.
    spawner: std::sync::Arc<crate::spawner::Slot>,
    /// The node's lease, watched by every task's wrapper (see [`crate::lease`]); `None`: tasks are not fenced by it.
    lease: Option<PathBuf>,
    /// The most disk one task may use on the node (see [`crate::disk`]); `None`: not measured.
    disk: Option<crate::disk::Limits>,
    /// How often each task's disk use is measured (at least; see [`crate::disk::next_check`]).
    disk_every: std::time::Duration,
}

/// How often a task's disk use is measured by default (`gpunet agent --task-disk-check-s`).
pub const DISK_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The first uid (and gid) of the per-tenant identities (`--tenant-uids`): tenant `i` runs as `200000 + i`, above
/// the ranges distributions give to users and subordinate ids of the first users.
pub const DEFAULT_TENANT_UID_BASE: u32 = 200_000;

/// The `PATH` tasks get unless the agent is told otherwise (`--task-path`).
pub const DEFAULT_TASK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Copies a task's checkpoint directory to its tiers.
#[derive(Debug)]
struct TierCopier {
    tiers: Vec<gpunet_api::agent::CheckpointTier>,
    /// Where tiers without a URL live on this node.
    root: PathBuf,
    dir: PathBuf,
    task: TaskRef,
    /// In a copier process as the task's user, or in the agent.
    how: crate::copier::How,
    /// The most bytes one snapshot may write.
    max_bytes: u64,
    /// Copies not yet reported to the server.
    sink: std::sync::Arc<std::sync::Mutex<Vec<(TaskRef, u64)>>>,
    /// Copies that failed (the launcher's count).
    failures: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Per tier: when it was last copied and the directory's fingerprint then. Held during a copy, so the periodic
    /// and the final copy never run at once.
    last: tokio::sync::Mutex<Vec<(std::time::Instant, u64)>>,
}

impl TierCopier {
    /// Copies the directory to every tier that is due (all of them when `at_exit`) and whose copy differs from it.
    async fn copy(&self, at_exit: bool) {
        let t = self.task;
        let mut last = self.last.lock().await;
        let fp = crate::checkpoints::fingerprint(&self.dir);
        for (tier, last) in self.tiers.iter().zip(last.iter_mut()) {
            let due = at_exit || last.0.elapsed().as_millis() as u64 + 5 >= tier.every_ms;
            if !due || last.1 == fp {
                continue;
            }
            let at = now_ms();
            match crate::copier::snapshot(&self.how, tier, &self.root, &t, &self.dir, at, self.max_bytes).await {
                Ok(skipped) => {
                    if !skipped.is_empty() {
                        tracing::warn!(job = t.job, tier = %tier.name, skipped = ?skipped, "checkpoint copy skipped \
                                       what is not a regular file of the job's own");
                    }
                    *last = (std::time::Instant::now(), fp);
                    self.sink.lock().expect("checkpoint sink").push((t, at));
                }
                Err(e) => {
                    self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(job = t.job, tier = %tier.name, error = %e, "checkpoint copy failed")
                }
            }
        }
    }
}

impl TierCopier {
    /// Copies the directory to every tier now, due or not (a tier that already holds this very content is left as
    /// it is). Returns when the snapshot was taken if every tier now holds it.
    async fn copy_now(&self) -> Option<u64> {
        let t = self.task;
        let mut last = self.last.lock().await;
        let fp = crate::checkpoints::fingerprint(&self.dir);
        let at = now_ms();
        let mut all = true;
        for (tier, last) in self.tiers.iter().zip(last.iter_mut()) {
            if last.1 == fp {
                continue;
            }
            match crate::copier::snapshot(&self.how, tier, &self.root, &t, &self.dir, at, self.max_bytes).await {
                Ok(_) => {
                    *last = (std::time::Instant::now(), fp);
                    self.sink.lock().expect("checkpoint sink").push((t, at));
                }
                Err(e) => {
                    all = false;
                    self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(job = t.job, tier = %tier.name, error = %e, "final checkpoint copy failed")
                }
            }
        }
        all.then_some(at)
    }
}

/// The file a task is asked to checkpoint through (`GPUNET_CHECKPOINT_NOW`): created by the agent on a reclaim
/// notice, removed by the job once its checkpoint is written. In the task's own directory.
pub fn checkpoint_now_path(dir: &Path, t: &TaskRef) -> PathBuf {
    work_dir(dir, t).join(".gpunet-checkpoint-now")
}

/// Creates the checkpoint-now file in a task's own directory (which its user owns) without following a symlink
/// there: the directory is opened without following one and the file is made exclusively beneath it. An existing
/// file is left as it is. Owned by `owner` so that the job may also rewrite it.
fn create_checkpoint_now(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let parent = path.parent().ok_or_else(|| std::io::Error::other("no parent"))?;
    let name = path.file_name().ok_or_else(|| std::io::Error::other("no name"))?;
    let dir = rustix::fs::open(parent, OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    match rustix::fs::openat(
        &dir,
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    ) {
        Ok(f) => {
            if let Some((u, g)) = owner {
                rustix::fs::fchown(&f, Some(rustix::fs::Uid::from_raw(u)), Some(rustix::fs::Gid::from_raw(g)))?;
            }
            Ok(())
        }
        Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Where a task attempt's log goes.
pub fn log_path(dir: &Path, t: &TaskRef) -> PathBuf {
    dir.join("logs").join(format!("job-{}", t.job)).join(format!("rank-{}-attempt-{}.log", t.rank, t.attempt))
}

/// Where the launcher records the processes it runs, so that an agent started again on the same data directory can
/// find the ones its previous life left behind.
fn record_path(dir: &Path, t: &TaskRef) -> PathBuf {
    dir.join("running").join(format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt))
}

/// `DATA/running`: root's alone (0700), like the records, status and environment files in it (0600).
fn running_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes a file under `DATA/running`, mode 0600 (also when it existed with another).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(0o600))?;
    std::io::Write::write_all(&mut f, bytes)
}

/// Where the wrapper writes how a task attempt ended.
fn status_path(dir: &Path, t: &TaskRef) -> PathBuf {
    dir.join("running").join(format!("job-{}-rank-{}-attempt-{}.status", t.job, t.rank, t.attempt))
}

/// The task of a record's file name (`job-J-rank-R-attempt-A`).
fn task_of_record(name: &str) -> Option<TaskRef> {
    let rest = name.strip_prefix("job-")?;
    let (job, rest) = rest.split_once("-rank-")?;
    let (rank, attempt) = rest.split_once("-attempt-")?;
    Some(TaskRef { job: job.parse().ok()?, rank: rank.parse().ok()?, attempt: attempt.parse().ok()? })
}

/// A process's group, start time (clock ticks since boot) and state letter from `/proc/PID/stat`; `None` when it
/// is gone.
fn proc_stat(pid: i32) -> Option<(i32, u64, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields are counted after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) ... starttime(22).
    let state = f.first()?.chars().next()?;
    let pgrp = f.get(2)?.parse().ok()?;
    let start = f.get(19)?.parse().ok()?;
    Some((pgrp, start, state))
}

/// A process's group and start time; `None` when it is gone.
pub(crate) fn proc_identity(pid: i32) -> Option<(i32, u64)> {
    proc_stat(pid).map(|(g, s, _)| (g, s))
}

/// Whether `pid` is still the live (not zombie) leader of its group that started at `start`.
fn same_leader(pid: i32, start: u64) -> bool {
    matches!(proc_stat(pid), Some((g, s, st)) if g == pid && s == start && st != 'Z')
}

/// Processes left in group `pgid` that started no earlier than its leader did.
fn group_members(pgid: i32, since: u64) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| *p > 1)
        .filter(|p| matches!(proc_stat(*p), Some((g, s, st)) if g == pgid && s >= since && st != 'Z'))
        .collect()
}

/// Where the wrapper finds a task attempt's environment.
fn env_path(dir: &Path, t: &TaskRef) -> PathBuf {
    dir.join("running").join(format!("job-{}-rank-{}-attempt-{}.env", t.job, t.rank, t.attempt))
}

/// A task's own directory on this node: its `HOME` and default working directory (`working_dir` is beneath it).
pub fn work_dir(dir: &Path, t: &TaskRef) -> PathBuf {
    dir.join("homes").join(format!("job-{}", t.job)).join(format!("rank-{}", t.rank))
}

/// Makes `path` (its parents root's), mode 0700, owned by `owner` when given. The last component is opened without
/// following a symlink and changed through its descriptor. One that exists already but is not `owner`'s is
/// another identity's (see [`replace_foreign`]): it is made again, empty.
pub(crate) fn own_dir(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::create_dir_all(path.parent().expect("a parent"))?;
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Some((u, _)) = owner {
                replace_foreign(path, |m| m.uid() == u)?;
            }
        }
        Err(e) => return Err(e),
    }
    let fd = crate::beneath::open_trusted(path)?;
    if let Some((u, g)) = owner {
        rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(u)), Some(rustix::fs::Gid::from_raw(g)))?;
    }
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o700))?;
    Ok(())
}

/// Makes `path` (its parents root's), owned by the agent's user and group `gid` when given, mode 0750: the group
/// reads, only the agent writes. Changed through a descriptor opened without following a symlink. One that exists
/// already with another group is another identity's (see [`replace_foreign`]): it is made again, empty.
fn group_dir(path: &Path, gid: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::create_dir_all(path.parent().expect("a parent"))?;
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Some(g) = gid {
                replace_foreign(path, |m| m.gid() == g)?;
            }
        }
        Err(e) => return Err(e),
    }
    let fd = crate::beneath::open_trusted(path)?;
    if let Some(g) = gid {
        rustix::fs::fchown(&fd, None, Some(rustix::fs::Gid::from_raw(g)))?;
    }
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o750))?;
    Ok(())
}

/// Serializes [`claim_job`]: two ranks of a job starting at once must not remove each other's new directories.
static CLAIMS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes sure the node's `job-J` directories (homes, checkpoints, logs, the node-disk tier) are this job's, the one
/// submitted at `submitted_ms`: job ids start again at 1 when a server starts on a new store (and tenants' indexes,
/// hence their uids, too), so files another job J left here must not reach this one. The agent records each job's
/// submission time in `DATA/owners/job-J` (a file; root's, 0700/0600); a job J with another one finds the
/// previous job's directories removed (never through a symlink) before its task starts. Without a time (an older
/// server) nothing is checked here; [`replace_foreign`] still catches another uid's directories.
pub(crate) fn claim_job(dir: &Path, job: u64, submitted_ms: Option<u64>) -> std::io::Result<()> {
    let Some(submitted) = submitted_ms else { return Ok(()) };
    let _one = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    let marker = dir.join("owners").join(format!("job-{job}"));
    let want = submitted.to_string();
    match std::fs::read_to_string(&marker) {
        Ok(have) if have.trim() == want => return Ok(()),
        Ok(_) => {
            tracing::warn!(job, "the node's files of another job with this id (a server on a new store): removed");
            for sub in crate::JOB_FILE_DIRS {
                crate::remove_job_path(&dir.join(sub).join(format!("job-{job}")))?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    running_dir(&dir.join("owners"))?;
    write_private(&marker, want.as_bytes())
}

/// A job's directory (`job-J`, or a rank's beneath) that exists already is handed to the task only if it is the
/// task's identity's (`ours`): job ids start again when a server starts on a new store, while a node keeps an ended
/// job's files for `--ended-job-files-keep-s` (and files of jobs its agent never heard ended), so job 7 of one
/// tenant could otherwise get the home, checkpoints and logs that job 7 of another tenant left. A foreign one is
/// removed (never through a symlink) and made again, empty.
fn replace_foreign(path: &Path, ours: impl Fn(&std::fs::Metadata) -> bool) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(path)?;
    if m.is_dir() && ours(&m) {
        return Ok(());
    }
    tracing::warn!(dir = %path.display(), "a directory left by another identity's job of the same id: removed");
    if m.is_dir() {
        std::fs::remove_dir_all(path)?;
    } else {
        std::fs::remove_file(path)?;
    }
    std::fs::create_dir(path)
}

/// A job's checkpoint directory on this node.
pub fn checkpoint_dir(dir: &Path, job: u64) -> PathBuf {
    dir.join("checkpoints").join(format!("job-{job}"))
}

/// `gpunet task-exec` for `exec`, started as root with nothing of the agent's environment but `PATH` (the wrapper
/// gives the task its own environment from the env file).
fn wrapper_command(w: &Path, exec: &crate::wrapper::Exec, task_path: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(w);
    c.arg("task-exec").args(exec.to_args()).env_clear().env("PATH", task_path).current_dir("/");
    c
}

/// The end of a task attempt: OOM check, cgroup removal, the final checkpoint copy, then the report.
async fn finish(
    t: TaskRef,
    code: Option<i32>,
    signal: Option<i32>,
    group: Option<crate::cgroups::TaskCgroup>,
    extras: Extras,
    exits: mpsc::UnboundedSender<TaskExit>,
    containers: Option<std::sync::Arc<crate::container::Runtime>>,
) {
    let oom = extras.oom.load(std::sync::atomic::Ordering::SeqCst) || group.as_ref().is_some_and(|g| g.oom_killed());
    if let Some(g) = group.clone() {
        // Everything the attempt started (setsid, double forks, probes) dies with it.
        let job = t.job;
        let _ = tokio::task::spawn_blocking(move || {
            let n = g.kill_all();
            if n > 0 {
                tracing::info!(job, processes = n, "killed what the task left in its cgroup");
            }
            g.remove();
        })
        .await;
    }
    // A container task's container (its runtime state and the runtime's groups outside the task's) and bundle.
    if let Some(rt) = containers.filter(|rt| rt.bundle_dir(&t).exists()) {
        let _ = tokio::task::spawn_blocking(move || rt.remove(&t)).await;
    }
    // A last copy of what the job wrote since (e.g. on SIGTERM) before the exit is reported.
    let copier = extras.copier.lock().expect("copier slot").clone();
    if let Some(c) = copier {
        c.copy(true).await;
    }
    let reason = extras.probe_failed.lock().expect("probe lock").clone();
    let _ = exits.send(TaskExit { task: t, code, signal, oom, stopped: false, reason });
}

impl Launcher {
    /// A launcher keeping logs and checkpoints under `dir`; ends are sent to `exits`.
    pub fn new(dir: PathBuf, exits: mpsc::UnboundedSender<TaskExit>, cgroups: Cgroups) -> Launcher {
        Launcher {
            dir,
            procs: HashMap::new(),
            exits,
            started: Default::default(),
            cgroups,
            run_as: None,
            checkpointed: Default::default(),
            checkpoint_failures: Default::default(),
            checkpointed_now: Default::default(),
            wrapper: None,
            task_path: DEFAULT_TASK_PATH.into(),
            tenant_uid_base: None,
            dev_dir: PathBuf::from("/dev"),
            mig_uuids: Vec::new(),
            pid_namespace: false,
            pids_max: crate::cgroups::TASK_PIDS_MAX,
            snapshot_max_bytes: crate::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
            containers: None,
            spawner: Default::default(),
            lease: None,
            disk: None,
            disk_every: DISK_CHECK_EVERY,
        }
    }

    /// A copy of this launcher's configuration with no task of its own, for launches that run while the launcher
    /// goes on (see [`start::Starting`]).
    fn for_launches(&self) -> Launcher {
        Launcher {
            mig_uuids: self.mig_uuids.clone(),
            dir: self.dir.clone(),
            procs: HashMap::new(),
            exits: self.exits.clone(),
            started: self.started.clone(),
            cgroups: self.cgroups.clone(),
            run_as: self.run_as,
            checkpointed: self.checkpointed.clone(),
            checkpoint_failures: self.checkpoint_failures.clone(),
            checkpointed_now: self.checkpointed_now.clone(),
            wrapper: self.wrapper.clone(),
            task_path: self.task_path.clone(),
            tenant_uid_base: self.tenant_uid_base,
            dev_dir: self.dev_dir.clone(),
            pid_namespace: self.pid_namespace,
            pids_max: self.pids_max,
            snapshot_max_bytes: self.snapshot_max_bytes,
            containers: self.containers.clone(),
            spawner: self.spawner.clone(),
            lease: self.lease.clone(),
            disk: self.disk,
            disk_every: self.disk_every,
        }
    }

    /// Every task's wrapper stops its task once the lease at `path` runs out (see [`crate::lease`]).
    pub fn fence_by_lease(&mut self, path: PathBuf) {
        self.lease = Some(path);
    }

    /// Each task may use at most `bytes` of the node's disk (less when its job's `disk` says so) and `entries` files
    /// and directories, measured every `every` (see [`crate::disk`]); past either it is stopped.
    pub fn disk_limits(&mut self, bytes: u64, entries: u64, every: std::time::Duration) {
        self.disk = Some(crate::disk::Limits { bytes, entries });
        self.disk_every = every;
    }

    /// Runs the tasks of jobs with an image in containers through `rt` (see [`crate::container`]).
    pub fn containers(&mut self, rt: std::sync::Arc<crate::container::Runtime>) {
        self.containers = Some(rt);
    }

    /// Deletes every container a previous run of the agent left that it did not adopt (call after
    /// [`Launcher::adopt`]).
    pub fn sweep_containers(&self) {
        if let Some(rt) = &self.containers {
            rt.sweep(&self.running());
        }
    }

    /// The most bytes one checkpoint snapshot may write to a tier (default
    /// [`crate::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES`]).
    pub fn snapshot_max_bytes(&mut self, n: u64) {
        self.snapshot_max_bytes = n;
    }

    /// The most processes and threads each task attempt may have at once (default
    /// [`crate::cgroups::TASK_PIDS_MAX`]; where the node has the pids controller).
    pub fn pids_max(&mut self, n: u64) {
        self.pids_max = n.max(1);
    }

    /// Runs each task and each liveness probe (through the wrapper) in a PID and mount namespace of its own, where
    /// it sees and can signal only its own processes (see [`crate::wrapper`]; check first with
    /// [`crate::wrapper::check_pid_namespace`]). A probe gets a namespace of its own rather than joining its task's:
    /// it talks to the task through files and the network like any client, and entering a namespace named by a pid
    /// would let a recycled pid put root-started code into someone else's.
    pub fn pid_namespaces(&mut self, on: bool) {
        self.pid_namespace = on;
    }

    /// Reads the GPUs' device numbers from `dir` instead of `/dev`.
    pub fn device_dir(&mut self, dir: PathBuf) {
        self.dev_dir = dir;
    }

    /// Sets the `PATH` of every task.
    pub fn task_path(&mut self, path: String) {
        self.task_path = path;
    }

    /// Starts tasks through `gpunet task-exec` at `exe`, so that they can be adopted by a restarted agent.
    pub fn wrap_with(&mut self, exe: PathBuf) {
        self.wrapper = Some(exe);
    }

    /// Runs tasks as `user` (the agent must be root for that). Errors name the user when it does not exist.
    pub fn run_as(&mut self, user: &str) -> Result<(), String> {
        let u = nix::unistd::User::from_name(user)
            .map_err(|e| format!("look up user {user:?}: {e}"))?
            .ok_or_else(|| format!("invalid --run-as {user:?}: no such user"))?;
        self.run_as = Some((u.uid.as_raw(), u.gid.as_raw()));
        Ok(())
    }

    /// Tasks running now.
    pub fn running(&self) -> Vec<TaskRef> {
        let mut v: Vec<TaskRef> = self.procs.keys().copied().collect();
        v.sort();
        v
    }

    /// Whether a running task's wrapper stops it itself once the node's lease runs out (see [`crate::lease`]).
    pub fn fenced_by_lease(&self, t: &TaskRef) -> bool {
        self.procs.get(t).is_some_and(|p| p.leased)
    }

    /// Whether a task is running here.
    pub fn is_running(&self, t: &TaskRef) -> bool {
        self.procs.contains_key(t)
    }

    /// Forgets a task that ended (its exit was reported).
    pub fn reaped(&mut self, t: &TaskRef) {
        self.procs.remove(t);
    }

    /// Runs each tenant's tasks as its own uid and gid, `base + the tenant's index` (the server's stable
    /// registration order, sent in every assignment). Tenants then cannot read each other's files (their task and
    /// checkpoint directories are 0700 and theirs, their logs root's and readable by their group only),
    /// `/proc/PID/environ`, memory or file descriptors, nor signal each other's processes: the kernel checks these
    /// against the uid. The process list and command lines would stay visible in the host's `/proc`; each task's
    /// PID namespace ([`Launcher::pid_namespaces`], the agent's default) hides them, and also keeps two tasks of
    /// the same tenant apart. `hidepid=2` on the host's `/proc` was the other way: host-wide, it also hides
    /// processes from the node's own tools, and does nothing between tasks of one uid.
    pub fn tenant_uids(&mut self, base: u32) {
        self.tenant_uid_base = Some(base);
    }

    /// The uid and gid a task runs as: `--run-as`'s user, else the tenant's own identity (with
    /// [`Launcher::tenant_uids`]), else the agent's own.
    fn identity(&self, a: &TaskAssignment) -> Option<(u32, u32)> {
        if self.run_as.is_some() {
            return self.run_as;
        }
        let base = self.tenant_uid_base?;
        let id = base.checked_add(a.tenant_index?)?;
        Some((id, id))
    }

    /// Where a task's checkpoint copies run: as the task's user `user` in a copier process when there is one (and
    /// the agent's binary to start it), else in the agent (see [`crate::copier`]).
    fn copy_how(&self, user: Option<(u32, u32)>) -> crate::copier::How {
        match (user, &self.wrapper) {
            (Some(user), Some(exe)) => crate::copier::How::Child { exe: exe.clone(), user },
            _ => crate::copier::How::InProcess { owner: user },
        }
    }

    /// The task's environment. It starts empty (nothing of the agent's own environment: no credentials, no join
    /// token, no `HOME=/root`) and gets, in this order, each later one winning:
    /// 1. the agent's own `CUDA_*`, `NVIDIA_*` and `NCCL_*` (the node's driver and fabric settings);
    /// 2. `LANG=C.UTF-8`;
    /// 3. the assignment's (the job's `env`, then what the server sets: `CUDA_VISIBLE_DEVICES`, `RANK`,
    ///    `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `NODE_RANK`, `NNODES`, `MASTER_ADDR`, `MASTER_PORT`,
    ///    `GPUNET_JOB_ID`, …; the server refuses a job that sets any of those, see `gpunet_api::spec::reserved_env`);
    /// 4. the agent's: `PATH` (`--task-path`), `HOME` (the task's own directory), `GPUNET_CHECKPOINT_DIR`,
    ///    `GPUNET_LOG_FILE`, `GPUNET_WORK_DIR`.
    pub fn task_env(&self, a: &TaskAssignment, home: &Path) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> =
            std::env::vars().filter(|(k, _)| ["CUDA_", "NVIDIA_", "NCCL_"].iter().any(|p| k.starts_with(p))).collect();
        env.insert("LANG".into(), "C.UTF-8".into());
        env.extend(a.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let t = a.task;
        env.insert("PATH".into(), self.task_path.clone());
        env.insert("HOME".into(), home.display().to_string());
        env.insert("GPUNET_CHECKPOINT_DIR".into(), checkpoint_dir(&self.dir, t.job).display().to_string());
        env.insert("GPUNET_LOG_FILE".into(), log_path(&self.dir, &t).display().to_string());
        env.insert("GPUNET_WORK_DIR".into(), home.display().to_string());
        // Created when the node is reclaimed (with the job's checkpoint signal): checkpoint, then remove it.
        env.insert("GPUNET_CHECKPOINT_NOW".into(), checkpoint_now_path(&self.dir, &t).display().to_string());
        if !a.mig.is_empty() {
            // A MIG slice is addressed by its MIG UUID (NVML's, or `MIG-fake-…` on fake GPUs).
            let ids: Vec<String> = a
                .mig
                .iter()
                .map(|m| {
                    self.mig_uuids
                        .get(m.gpu as usize)
                        .and_then(|g| g.get(m.instance as usize))
                        .cloned()
                        .unwrap_or_else(|| format!("MIG-unknown-{}-{}", m.gpu, m.instance))
                })
                .collect();
            env.insert("CUDA_VISIBLE_DEVICES".into(), ids.join(","));
            env.insert("NVIDIA_VISIBLE_DEVICES".into(), ids.join(","));
        }
        env
    }

    /// The MIG UUIDs of the node's GPUs, by GPU index and instance.
    pub fn set_mig_uuids(&mut self, uuids: Vec<Vec<String>>) {
        self.mig_uuids = uuids;
    }

    /// Starts the liveness probe and the periodic checkpoint copies of a task (our child, or an adopted one once its
    /// assignment is known), putting the copier and the probe's verdict where the exit watcher finds them.
    fn attach_extras(
        &self,
        a: &TaskAssignment,
        pid: i32,
        adopted_start: Option<u64>,
        alive: &std::sync::Arc<std::sync::atomic::AtomicBool>,
        extras: &Extras,
        group: Option<&crate::cgroups::TaskCgroup>,
    ) {
        if extras.attached.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let t = a.task;
        let ckpt = checkpoint_dir(&self.dir, t.job);
        let log = log_path(&self.dir, &t);
        // The job's checkpoint directory is shared by its tasks on this node (the server's LOCAL_WORLD_SIZE).
        let share = a.env.get("LOCAL_WORLD_SIZE").and_then(|n| n.parse().ok()).unwrap_or(1);
        let mut disk_paths = crate::disk::task_paths(
            &work_dir(&self.dir, &t),
            &ckpt,
            &log,
            share,
            group.map(|g| g.procs.clone()).unwrap_or_default(),
        );
        if let Some(rt) = self.containers.as_ref().filter(|_| a.container.is_some()) {
            // What the container wrote to its own root (the overlay's upper directory) and to its volumes.
            let bundle = rt.bundle_dir(&t);
            disk_paths.dirs.extend([bundle.join("upper"), bundle.join("volumes")]);
        }
        // Signals go to the group only while it is ours: reaped children and adopted processes that ended (or whose
        // id now names another process) are never signalled.
        let may_signal = {
            let alive = alive.clone();
            move || alive.load(std::sync::atomic::Ordering::SeqCst) && adopted_start.is_none_or(|s| same_leader(pid, s))
        };
        if let Some(l) = a.liveness.clone() {
            // The probe runs like the task: through the wrapper, in the task's cgroups (so whatever it leaves
            // behind dies with the attempt), as the task's user, with the task's environment, in its directory.
            let home = work_dir(&self.dir, &t);
            let env_file = env_path(&self.dir, &t);
            let container = self.containers.clone().filter(|_| a.container.is_some());
            let env = self.task_env(a, &home);
            // A container's probe gets the container's environment from the runtime; no file is written for it.
            if container.is_none() {
                if let Err(e) = crate::wrapper::write_env_file(&env_file, &env) {
                    tracing::warn!(job = t.job, error = %e, "could not write the probe's environment");
                }
            }
            let failed = extras.probe_failed.clone();
            let user = self.identity(a);
            let wrapper = self.wrapper.clone();
            let task_path = self.task_path.clone();
            let pid_namespace = self.pid_namespace;
            let tmp_mib = a.memory_mib.max(4);
            let cgroups = group.map(|g| g.procs.clone()).unwrap_or_default();
            let alive = alive.clone();
            let may_signal = may_signal.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(l.initial_delay_ms)).await;
                let period = std::time::Duration::from_millis(l.period_ms.max(100));
                loop {
                    if !alive.load(std::sync::atomic::Ordering::SeqCst) {
                        return; // the task is gone
                    }
                    let Some((p, args)) = l.command.split_first() else { return };
                    let mut c = match (&container, &wrapper) {
                        // In the container: the runtime runs it there with the task's environment, directory and
                        // (no) capabilities, as the task's user.
                        (Some(rt), _) => {
                            let (u, g) = user.unwrap_or((0, 0));
                            let id = rt.container_id(&t);
                            let mut c = tokio::process::Command::from(rt.command(&[
                                "exec",
                                "--user",
                                &format!("{u}:{g}"),
                                &id,
                                p,
                            ]));
                            c.args(args);
                            c
                        }
                        (None, _) => match &wrapper {
                            Some(w) => {
                                let exec = crate::wrapper::Exec {
                                    status: None,
                                    cgroups: cgroups.clone(),
                                    user,
                                    env_file: Some(env_file.clone()),
                                    cwd: Some(home.clone()),
                                    pid_namespace,
                                    tmp_mib: Some(tmp_mib),
                                    lease: None,
                                    container: None,
                                    prog: p.clone(),
                                    args: args.to_vec(),
                                };
                                wrapper_command(w, &exec, &task_path)
                            }
                            None => {
                                let mut c = tokio::process::Command::new(p);
                                c.args(args).env_clear().envs(&env).current_dir(&home);
                                if let Some((uid, gid)) = user {
                                    c.uid(uid).gid(gid);
                                }
                                c
                            }
                        },
                    };
                    c.stdin(std::process::Stdio::null()).process_group(0).kill_on_drop(true);
                    if let Ok(f) = std::fs::OpenOptions::new().append(true).open(&log) {
                        if let Ok(g) = f.try_clone() {
                            c.stdout(f).stderr(g);
                        }
                    }
                    let ok = match c.spawn() {
                        Err(_) => false,
                        Ok(mut child) => {
                            let probe = child.id().map(|p| p as i32).filter(|p| *p > 1);
                            match tokio::time::timeout(period, child.wait()).await {
                                Ok(Ok(s)) => s.success(),
                                _ => {
                                    // A hung probe: its whole group goes (the child is not reaped yet, so the id
                                    // is still its group's).
                                    if let Some(p) = probe {
                                        let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
                                    }
                                    let _ = child.wait().await;
                                    false
                                }
                            }
                        }
                    };
                    if !ok {
                        tracing::warn!(job = t.job, rank = t.rank, "liveness probe failed");
                        *failed.lock().expect("probe lock") =
                            Some(format!("failed its liveness probe ({})", shown_command(&l.command)));
                        if may_signal() {
                            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                        }
                        return;
                    }
                    tokio::time::sleep(period).await;
                }
            });
        }
        if let Some(limit) = a.time_limit_ms {
            // The run-time limit: counted from the process's start (from now for an adopted task, whose start the
            // agent did not see), then SIGTERM to the group, and SIGKILL after the grace period.
            let failed = extras.probe_failed.clone();
            let alive = alive.clone();
            let may_signal = may_signal.clone();
            let grace = std::time::Duration::from_millis(a.grace_ms);
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(limit)).await;
                if !alive.load(std::sync::atomic::Ordering::SeqCst) || !may_signal() {
                    return;
                }
                tracing::warn!(job = t.job, rank = t.rank, limit_ms = limit, "time limit reached: stopping the task");
                *failed.lock().expect("probe lock") =
                    Some(format!("exceeded its time limit of {}", gpunet_api::units::format_duration_ms(limit)));
                let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
                tokio::time::sleep(grace).await;
                if may_signal() {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
            });
        }
        if let Some(node) = self.disk {
            // The disk limit: the task's own directory, its job's checkpoint directory and its log, measured every
            // few seconds (see `crate::disk`); past it SIGTERM to the group, and SIGKILL after the grace period.
            let limits = crate::disk::Limits {
                bytes: a.disk_mib.map_or(node.bytes, |m| m.saturating_mul(1 << 20).min(node.bytes)),
                entries: node.entries,
            };
            let paths = std::sync::Arc::new(disk_paths);
            let failed = extras.probe_failed.clone();
            let alive = alive.clone();
            let may_signal = may_signal.clone();
            let grace = std::time::Duration::from_millis(a.grace_ms);
            let every = self.disk_every;
            tokio::spawn(async move {
                let mut wait = every;
                let why = loop {
                    tokio::time::sleep(wait).await;
                    if !alive.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    let paths = paths.clone();
                    let t0 = std::time::Instant::now();
                    let u = match tokio::task::spawn_blocking(move || crate::disk::measure(&paths, &limits)).await {
                        Ok(Ok(u)) => u,
                        Ok(Err(e)) => {
                            // Not measured this time (out of descriptors, say): tried again at the next check.
                            tracing::warn!(job = t.job, rank = t.rank, error = %e, "could not measure the task's disk use");
                            wait = every;
                            continue;
                        }
                        Err(_) => return,
                    };
                    if let Some(why) = u.over(&limits) {
                        break why;
                    }
                    wait = crate::disk::next_check(every, t0.elapsed());
                };
                if !alive.load(std::sync::atomic::Ordering::SeqCst) || !may_signal() {
                    return;
                }
                tracing::warn!(job = t.job, rank = t.rank, why = %why, "disk limit reached: stopping the task");
                *failed.lock().expect("probe lock") = Some(why);
                let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
                tokio::time::sleep(grace).await;
                if may_signal() {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
            });
        }
        if a.tiers.is_empty() {
            return;
        }
        let c = std::sync::Arc::new(TierCopier {
            tiers: a.tiers.clone(),
            root: self.dir.join("tiers"),
            dir: ckpt.clone(),
            task: t,
            how: self.copy_how(self.identity(a)),
            max_bytes: self.snapshot_max_bytes,
            sink: self.checkpointed.clone(),
            failures: self.checkpoint_failures.clone(),
            last: tokio::sync::Mutex::new(vec![
                (std::time::Instant::now(), crate::checkpoints::fingerprint(&ckpt));
                a.tiers.len()
            ]),
        });
        *extras.copier.lock().expect("copier slot") = Some(c.clone());
        let alive = alive.clone();
        tokio::spawn(async move {
            let tick =
                std::time::Duration::from_millis(c.tiers.iter().map(|t| t.every_ms).min().unwrap_or(600_000).max(100));
            loop {
                tokio::time::sleep(tick).await;
                if !alive.load(std::sync::atomic::Ordering::SeqCst) {
                    return; // ended: the final copy is taken after the exit
                }
                c.copy(false).await;
            }
        });
    }

    /// Kills the tasks a previous run of the agent recorded as running, whatever they are: each one's process group
    /// (only while the record's process still has the recorded start time) and every process left in its cgroups;
    /// their records go. For a machine that is gone ([`crate::kill_left_tasks`]). Returns how many still ran.
    pub fn kill_recorded(&mut self) -> usize {
        let mut killed = 0;
        let Ok(rd) = std::fs::read_dir(self.dir.join("running")) else { return 0 };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(t) = task_of_record(&name) else { continue };
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            if let [p, s, ..] = f[..] {
                let pid = p as i32;
                if pid > 1 && same_leader(pid, s) {
                    // SIGKILL to the wrapper's group kills the wrapper and the namespace's init (and with it the
                    // namespace); what left the group is in the cgroups, below.
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                    killed += 1;
                    let t0 = std::time::Instant::now();
                    while same_leader(pid, s) && t0.elapsed() < std::time::Duration::from_secs(5) {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
            if let Some(g) = self.cgroups.open(&format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt)) {
                g.kill_all();
                g.remove();
            }
            let _ = std::fs::remove_file(e.path());
            let _ = std::fs::remove_file(status_path(&self.dir, &t));
            let _ = std::fs::remove_file(env_path(&self.dir, &t));
        }
        killed
    }

    /// Adopts the tasks a previous run of the agent started through the wrapper and that still run: they are
    /// reported as running and watched until they end (their status comes from the wrapper's file). Tasks started
    /// without the wrapper are killed (their exit could not be learned). A record is trusted only while its process still
    /// has the recorded start time and leads its own group: a reused process id is never signalled. Returns the
    /// adopted tasks.
    pub fn adopt(&mut self) -> Vec<TaskRef> {
        let mut adopted = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.dir.join("running")) else { return adopted };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(t) = task_of_record(&name) else { continue };
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            let (pid, start, wrapped) = match f[..] {
                [p, s, w] => (p as i32, s, w == 1),
                [p, s] => (p as i32, s, false),
                _ => (0, 0, false),
            };
            if pid <= 1 || !same_leader(pid, start) {
                // Gone (or the id names another process now): nothing to adopt. Whatever the attempt left in its
                // cgroup (a process that left the group with setsid) goes with it.
                let _ = std::fs::remove_file(e.path());
                let _ = std::fs::remove_file(status_path(&self.dir, &t));
                let _ = std::fs::remove_file(env_path(&self.dir, &t));
                if let Some(g) = self.cgroups.open(&format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt)) {
                    g.kill_all();
                    g.remove();
                }
                continue;
            }
            if !wrapped {
                tracing::warn!(pid, task = ?t, "killing a task a previous agent run started without the wrapper");
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                if let Some(g) = self.cgroups.open(&format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt)) {
                    g.kill_all();
                    g.remove();
                }
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            tracing::info!(pid, job = t.job, rank = t.rank, attempt = t.attempt, "adopted a running task");
            let alive = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
            let extras = Extras::default();
            self.procs.insert(
                t,
                Proc {
                    pgid: pid,
                    stopping: false,
                    alive: alive.clone(),
                    adopted: Some((start, extras.clone())),
                    leader_start: None,
                    extras: extras.clone(),
                    asked: false,
                    leased: false,
                },
            );
            adopted.push(t);
            let exits = self.exits.clone();
            let record = e.path();
            let status = status_path(&self.dir, &t);
            let env_file = env_path(&self.dir, &t);
            let group = self.cgroups.open(&format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt));
            if let Some(g) = &group {
                watch_oom(g, pid, Some(start), alive.clone(), extras.oom.clone());
            }
            let containers = self.containers.clone();
            tokio::spawn(async move {
                // Not our child: watch /proc until the wrapper is gone.
                while same_leader(pid, start) {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                alive.store(false, std::sync::atomic::Ordering::SeqCst);
                let ended = crate::wrapper::Ended::parse(&std::fs::read_to_string(&status).unwrap_or_default());
                let _ = std::fs::remove_file(&record);
                let _ = std::fs::remove_file(&status);
                let _ = std::fs::remove_file(&env_file);
                for p in group_members(pid, start) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
                }
                let (code, signal) = match ended {
                    Some(crate::wrapper::Ended::Exit(c)) => (Some(c), None),
                    Some(crate::wrapper::Ended::Signal(s)) => (None, Some(s)),
                    // An empty file: the wrapper itself was killed (SIGKILL to the group).
                    None => (None, Some(9)),
                };
                finish(t, code, signal, group, extras, exits, containers).await;
            });
        }
        adopted.sort();
        adopted
    }

    /// Gives an adopted task its liveness probe and checkpoint copies once the server's assignment for it is known.
    pub fn attach(&mut self, a: &TaskAssignment) {
        let Some(p) = self.procs.get(&a.task) else { return };
        let Some((start, extras)) = p.adopted.clone() else { return };
        let (pid, alive) = (p.pgid, p.alive.clone());
        let t = a.task;
        let group = self.cgroups.open(&format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt));
        self.attach_extras(a, pid, Some(start), &alive, &extras, group.as_ref());
    }

    /// Stops a task: SIGTERM to its process group, SIGKILL after `grace`.
    pub fn stop(&mut self, t: &TaskRef, grace: std::time::Duration) {
        let Some(p) = self.procs.get_mut(t) else { return };
        if p.stopping || p.pgid <= 1 {
            return;
        }
        p.stopping = true;
        let raw = p.pgid;
        let pgid = Pid::from_raw(raw);
        let alive = p.alive.clone();
        let adopted = p.adopted.as_ref().map(|(s, _)| *s).or(p.leader_start);
        let ours =
            move || alive.load(std::sync::atomic::Ordering::SeqCst) && adopted.is_none_or(|s| same_leader(raw, s));
        tracing::info!(job = t.job, rank = t.rank, "stopping task");
        if ours() {
            let _ = killpg(pgid, Signal::SIGTERM);
        }
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            // Only if the task is still there: once reaped, its id may belong to another process.
            if ours() {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
        });
    }

    /// Acts on a checkpoint-now request for a running task (once per attempt): creates its `GPUNET_CHECKPOINT_NOW`
    /// file, sends the job's signal to its processes, and waits (until the deadline) for the job to remove the file;
    /// then copies the checkpoint directory to every tier and reports the final snapshot
    /// ([`Launcher::checkpointed_now`]). A job that does not finish by the deadline keeps its last tier copy.
    pub fn checkpoint_now(&mut self, a: &TaskAssignment, now: &gpunet_api::agent::CheckpointNow) {
        let t = a.task;
        let identity = self.identity(a);
        let path = checkpoint_now_path(&self.dir, &t);
        let Some(p) = self.procs.get_mut(&t) else { return };
        if p.asked || p.stopping {
            return;
        }
        p.asked = true;
        if let Err(e) = create_checkpoint_now(&path, identity) {
            tracing::warn!(job = t.job, rank = t.rank, error = %e, "create the checkpoint-now file");
            return;
        }
        let raw = p.pgid;
        let alive = p.alive.clone();
        let adopted = p.adopted.as_ref().map(|(s, _)| *s).or(p.leader_start);
        let ours =
            move || alive.load(std::sync::atomic::Ordering::SeqCst) && adopted.is_none_or(|s| same_leader(raw, s));
        if let Some(sig) = now.signal.and_then(|s| Signal::try_from(s).ok()) {
            if raw > 1 && ours() {
                let _ = killpg(Pid::from_raw(raw), sig);
            }
        }
        tracing::info!(job = t.job, rank = t.rank, deadline_ms = now.deadline_ms, "asked the task to checkpoint now");
        let copier = p.extras.copier.clone();
        let sink = self.checkpointed_now.clone();
        let alive = p.alive.clone();
        let deadline = now.deadline_ms;
        tokio::spawn(async move {
            loop {
                if !alive.load(std::sync::atomic::Ordering::SeqCst) {
                    return; // it ended: its exit's final copy and report take over
                }
                if now_ms() >= deadline {
                    tracing::warn!(job = t.job, rank = t.rank, "no checkpoint by the reclaim deadline");
                    return;
                }
                if !path.exists() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let c = copier.lock().expect("copier slot").clone();
            // Without a tier there is nothing safe to report (the server asks only jobs with tiers).
            let at = match c {
                Some(c) => c.copy_now().await,
                None => None,
            };
            if let Some(at) = at {
                tracing::info!(job = t.job, rank = t.rank, "final checkpoint on every tier");
                sink.lock().expect("checkpoint sink").push((t, at));
            }
        });
    }

    /// Whether the end of `t` was asked for.
    pub fn was_stopped(&self, t: &TaskRef) -> bool {
        self.procs.get(t).is_some_and(|p| p.stopping)
    }

    /// Removes the agent's parent cgroups (shutdown, after the tasks ended).
    pub fn remove_cgroups(&self) {
        if self.procs.is_empty() {
            self.cgroups.remove_parents();
        }
    }

    /// Stops everything (agent shutdown).
    pub fn stop_all(&mut self, grace: std::time::Duration) {
        let all: Vec<TaskRef> = self.procs.keys().copied().collect();
        for t in all {
            self.stop(&t, grace);
        }
    }
}

/// A probe's command as the reason of a failure shows it (to the job's users, an admin's terminal, the events): its
/// arguments joined by spaces, each escaped ([`gpunet_api::spec::escape_unprintable`]), so that it stays one line.
fn shown_command(args: &[String]) -> String {
    args.iter().map(|a| gpunet_api::spec::escape_unprintable(a)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe's command that holds a line break (the job's own text) stays one line in the failure's reason.
    #[test]
    fn a_probe_command_is_shown_on_one_line() {
        let args = vec!["sh".to_string(), "-c".into(), "x)\n  forged row\u{1b}[2J".into(), "\"quoted\"".into()];
        assert_eq!(shown_command(&args), "sh -c x)\\n  forged row\\u{1b}[2J \"quoted\"");
    }

    #[test]
    fn a_job_of_the_same_id_submitted_at_another_time_finds_none_of_the_previous_ones_files() {
        let d = tempfile::tempdir().unwrap();
        let dirs = ["homes/job-7/rank-0", "checkpoints/job-7", "logs/job-7", "tiers/job-7/local"];
        claim_job(d.path(), 7, Some(1_000)).unwrap();
        for x in dirs {
            std::fs::create_dir_all(d.path().join(x)).unwrap();
            std::fs::write(d.path().join(x).join("f"), "first job's").unwrap();
        }
        // The same job again (a restart): everything stays.
        claim_job(d.path(), 7, Some(1_000)).unwrap();
        assert!(dirs.iter().all(|x| d.path().join(x).join("f").exists()));
        // No submission time (an older server): nothing is checked.
        claim_job(d.path(), 7, None).unwrap();
        assert!(dirs.iter().all(|x| d.path().join(x).join("f").exists()));
        // Another job 7 (a server on a new store): none of it is left.
        claim_job(d.path(), 7, Some(2_000)).unwrap();
        assert!(dirs.iter().all(|x| !d.path().join(x).exists()), "the first job's directories are gone");
        assert_eq!(std::fs::read_to_string(d.path().join("owners/job-7")).unwrap(), "2000");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &str| std::fs::metadata(d.path().join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode("owners"), mode("owners/job-7")), (0o700, 0o600));
        // Another job's files are untouched.
        std::fs::create_dir_all(d.path().join("homes/job-8")).unwrap();
        claim_job(d.path(), 7, Some(3_000)).unwrap();
        assert!(d.path().join("homes/job-8").exists());
    }

    #[test]
    fn a_job_directory_left_by_another_identity_is_made_again_empty() {
        use std::os::unix::fs::MetadataExt as _;
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("skipped: changing owners needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let (home, logs) = (d.path().join("homes/job-7/rank-0"), d.path().join("logs/job-7"));
        // Job 7 of tenant A (uid 200001) left files, readable by anyone who reaches them.
        own_dir(&home, Some((200_001, 200_001))).unwrap();
        group_dir(&logs, Some(200_001)).unwrap();
        std::fs::write(home.join("weights"), "A's").unwrap();
        std::fs::write(logs.join("rank-0-attempt-0.log"), "A's log").unwrap();
        // Job 7 of the same identity again (a restart): its files stay.
        own_dir(&home, Some((200_001, 200_001))).unwrap();
        group_dir(&logs, Some(200_001)).unwrap();
        assert!(home.join("weights").exists() && logs.join("rank-0-attempt-0.log").exists());
        // Job 7 of tenant B (a new server numbering from 1 again): nothing of A's.
        own_dir(&home, Some((200_002, 200_002))).unwrap();
        group_dir(&logs, Some(200_002)).unwrap();
        assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(&logs).unwrap().count(), 0);
        assert_eq!(std::fs::metadata(&home).unwrap().uid(), 200_002);
        assert_eq!(std::fs::metadata(&logs).unwrap().gid(), 200_002);
        // A symlink where the directory goes is replaced, not followed.
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("keep"), "x").unwrap();
        let ck = d.path().join("checkpoints/job-8");
        std::fs::create_dir_all(ck.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &ck).unwrap();
        own_dir(&ck, Some((200_002, 200_002))).unwrap();
        assert!(std::fs::symlink_metadata(&ck).unwrap().is_dir() && elsewhere.join("keep").exists());
    }
    use std::os::unix::process::CommandExt;
    use std::os::unix::process::ExitStatusExt;

    #[tokio::test]
    async fn left_tasks_are_adopted_or_killed_only_when_the_record_matches_the_live_process() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut exits) = mpsc::unbounded_channel();
        let mut l = Launcher::new(dir.path().to_path_buf(), tx, Cgroups::None);
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let pid = child.id() as i32;
        let (pgrp, start) = proc_identity(pid).expect("the child is running");
        assert_eq!(pgrp, pid, "the child leads its own group");
        let t = TaskRef { job: 1, rank: 0, attempt: 0 };
        let rec = record_path(dir.path(), &t);
        std::fs::create_dir_all(rec.parent().unwrap()).unwrap();
        // A record whose start time differs describes another process that had this id: left alone.
        std::fs::write(&rec, format!("{pid} {} 1\n", start + 1)).unwrap();
        assert!(l.adopt().is_empty());
        assert!(!rec.exists(), "a stale record is dropped");
        assert!(child.try_wait().unwrap().is_none(), "the process was not signalled");
        // Garbage and pid 1 are never signalled.
        std::fs::write(&rec, "1 0 1\n").unwrap();
        assert!(l.adopt().is_empty());
        // Started through the wrapper and still there: adopted, and its end is reported when it goes.
        std::fs::write(&rec, format!("{pid} {start} 1\n")).unwrap();
        assert_eq!(l.adopt(), vec![t]);
        assert!(l.is_running(&t) && child.try_wait().unwrap().is_none());
        nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(9));
        let e = tokio::time::timeout(std::time::Duration::from_secs(10), exits.recv()).await.unwrap().unwrap();
        assert_eq!((e.task, e.code, e.signal), (t, None, Some(9)), "no status file: killed");
        // Started without the wrapper: its exit could not be learned, so it is killed.
        let mut other = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let opid = other.id() as i32;
        let (_, ostart) = proc_identity(opid).unwrap();
        std::fs::write(&rec, format!("{opid} {ostart}\n")).unwrap();
        assert!(l.adopt().is_empty());
        assert_eq!(other.wait().unwrap().signal(), Some(9));
        assert!(!rec.exists());
    }
}
