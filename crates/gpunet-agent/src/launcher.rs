//! Runs tasks as real processes: each in its own process group (so the whole tree is signalled), with its
//! environment (GPUs, ranks, checkpoint directory), stdout and stderr appended to one log file per attempt.
//! Stopping sends SIGTERM to the group, then SIGKILL after the grace period.

use crate::cgroups::Cgroups;
use gpunet_api::agent::{TaskAssignment, TaskExit, TaskRef, TaskStart};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

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
    dir: PathBuf,
    procs: HashMap<TaskRef, Proc>,
    exits: mpsc::UnboundedSender<TaskExit>,
    /// Starts not yet reported.
    pub started: Vec<TaskStart>,
    cgroups: Cgroups,
    /// Run tasks as this user (uid, gid) instead of the agent's.
    run_as: Option<(u32, u32)>,
    /// Checkpoints copied to a tier, not yet reported: (task, when).
    pub checkpointed: std::sync::Arc<std::sync::Mutex<Vec<(TaskRef, u64)>>>,
    /// `gpunet task-exec`, which records each task's end so that a restarted agent can adopt it (see
    /// [`crate::wrapper`]); without it tasks run directly and a restarted agent kills them.
    wrapper: Option<PathBuf>,
}

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
    /// Copies not yet reported to the server.
    sink: std::sync::Arc<std::sync::Mutex<Vec<(TaskRef, u64)>>>,
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
            match crate::checkpoints::snapshot(tier, &self.root, &t, &self.dir, at).await {
                Ok(()) => {
                    *last = (std::time::Instant::now(), fp);
                    self.sink.lock().expect("checkpoint sink").push((t, at));
                }
                Err(e) => tracing::warn!(job = t.job, tier = %tier.name, error = %e, "checkpoint copy failed"),
            }
        }
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
fn proc_identity(pid: i32) -> Option<(i32, u64)> {
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

/// A job's checkpoint directory on this node.
pub fn checkpoint_dir(dir: &Path, job: u64) -> PathBuf {
    dir.join("checkpoints").join(format!("job-{job}"))
}

/// The end of a task attempt: OOM check, cgroup removal, the final checkpoint copy, then the report.
async fn finish(
    t: TaskRef,
    code: Option<i32>,
    signal: Option<i32>,
    group: Option<crate::cgroups::TaskCgroup>,
    extras: Extras,
    exits: mpsc::UnboundedSender<TaskExit>,
) {
    let oom = extras.oom.load(std::sync::atomic::Ordering::SeqCst) || group.as_ref().is_some_and(|g| g.oom_killed());
    if let Some(g) = &group {
        // The group empties once the killed processes are reaped.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        g.remove();
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
            started: Vec::new(),
            cgroups,
            run_as: None,
            checkpointed: Default::default(),
            wrapper: None,
        }
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

    /// Whether a task is running here.
    pub fn is_running(&self, t: &TaskRef) -> bool {
        self.procs.contains_key(t)
    }

    /// Forgets a task that ended (its exit was reported).
    pub fn reaped(&mut self, t: &TaskRef) {
        self.procs.remove(t);
    }

    /// Starts a task. A task that cannot start (no command, a missing program) ends at once with code 127. With
    /// checkpoint tiers, an empty checkpoint directory first gets the newest snapshot of any tier.
    pub async fn start(&mut self, a: &TaskAssignment) {
        let t = a.task;
        let fail = |msg: String, exits: &mpsc::UnboundedSender<TaskExit>| {
            tracing::warn!(job = t.job, rank = t.rank, error = %msg, "task could not start");
            let _ = exits.send(TaskExit {
                task: t,
                code: Some(127),
                signal: None,
                oom: false,
                stopped: false,
                reason: None,
            });
        };
        let Some((prog, args)) = a.command.split_first() else {
            return fail("the job has no command".into(), &self.exits);
        };
        let log = log_path(&self.dir, &t);
        let ckpt = checkpoint_dir(&self.dir, t.job);
        let files = (|| -> std::io::Result<(std::fs::File, std::fs::File)> {
            std::fs::create_dir_all(log.parent().expect("log has a parent"))?;
            std::fs::create_dir_all(&ckpt)?;
            let f = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
            if let Some((uid, gid)) = self.run_as {
                // The task's user owns its checkpoint directory.
                let owner = (Some(nix::unistd::Uid::from_raw(uid)), Some(nix::unistd::Gid::from_raw(gid)));
                nix::unistd::chown(&ckpt, owner.0, owner.1).map_err(std::io::Error::from)?;
            }
            let g = f.try_clone()?;
            Ok((f, g))
        })();
        let (out, err) = match files {
            Ok(f) => f,
            Err(e) => return fail(format!("prepare {}: {e}", log.display()), &self.exits),
        };
        let tier_root = self.dir.join("tiers");
        if !a.tiers.is_empty() && std::fs::read_dir(&ckpt).map_or(true, |mut d| d.next().is_none()) {
            match crate::checkpoints::restore(&a.tiers, &tier_root, &t, &ckpt).await {
                Ok(Some(ts)) => tracing::info!(job = t.job, rank = t.rank, snapshot = ts, "checkpoint restored"),
                Ok(None) => {}
                Err(e) => tracing::warn!(job = t.job, error = %e, "checkpoint restore failed; starting without"),
            }
            if let Some((uid, gid)) = self.run_as {
                for (p, _) in crate::checkpoints::files(&ckpt) {
                    let _ = nix::unistd::chown(
                        &p,
                        Some(nix::unistd::Uid::from_raw(uid)),
                        Some(nix::unistd::Gid::from_raw(gid)),
                    );
                }
            }
        }
        // Limits: the task joins its cgroups from a tiny shell before it becomes the command (no pre-exec hook).
        let group = match self.cgroups.create(
            &format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt),
            a.memory_mib,
            a.cpu_milli,
        ) {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(job = t.job, error = %e, "could not create the task's cgroups; running without limits");
                None
            }
        };
        // Through the wrapper where there is one: it records how the task ends (see `crate::wrapper`).
        let status = status_path(&self.dir, &t);
        let (exe, argv): (String, Vec<String>) = match &self.wrapper {
            Some(w) => {
                if let Err(e) = std::fs::create_dir_all(status.parent().expect("status dir"))
                    .and_then(|_| std::fs::write(&status, b""))
                {
                    return fail(format!("prepare {}: {e}", status.display()), &self.exits);
                }
                if let Some((uid, gid)) = self.run_as {
                    let _ = nix::unistd::chown(
                        &status,
                        Some(nix::unistd::Uid::from_raw(uid)),
                        Some(nix::unistd::Gid::from_raw(gid)),
                    );
                }
                let mut v = vec!["task-exec".to_string(), "--status".into(), status.display().to_string(), "--".into()];
                v.push(prog.clone());
                v.extend(args.iter().cloned());
                (w.display().to_string(), v)
            }
            None => (prog.clone(), args.to_vec()),
        };
        let mut cmd = match &group {
            Some(g) => {
                let mut c = tokio::process::Command::new("sh");
                c.arg("-c")
                    .arg("for f in $GPUNET_CGROUP_PROCS; do echo $$ > \"$f\" || exit 125; done; exec \"$0\" \"$@\"")
                    .arg(&exe)
                    .args(&argv)
                    .env(
                        "GPUNET_CGROUP_PROCS",
                        g.procs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "),
                    );
                c
            }
            None => {
                let mut c = tokio::process::Command::new(&exe);
                c.args(&argv);
                c
            }
        };
        cmd.envs(&a.env)
            .env("GPUNET_CHECKPOINT_DIR", &ckpt)
            .env("GPUNET_LOG_FILE", &log)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(wd) = &a.working_dir {
            cmd.current_dir(wd);
        } else {
            cmd.current_dir(&ckpt);
        }
        if let Some((uid, gid)) = self.run_as {
            // The task, its cgroup wrapper included, runs as the user: hand it its groups' cgroup.procs files.
            cmd.uid(uid).gid(gid);
            if let Some(g) = &group {
                for p in &g.procs {
                    let _ = nix::unistd::chown(
                        p,
                        Some(nix::unistd::Uid::from_raw(uid)),
                        Some(nix::unistd::Gid::from_raw(gid)),
                    );
                }
            }
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return fail(format!("start {prog}: {e}"), &self.exits),
        };
        let Some(pid) = child.id().map(|p| p as i32).filter(|p| *p > 1) else {
            return fail(format!("start {prog}: no process id"), &self.exits);
        };
        tracing::info!(job = t.job, rank = t.rank, attempt = t.attempt, pid, gpus = ?a.gpus, "task started");
        if let Some((_, start)) = proc_identity(pid) {
            let rec = record_path(&self.dir, &t);
            let _ = std::fs::create_dir_all(rec.parent().expect("record dir"));
            let _ = std::fs::write(&rec, format!("{pid} {start} {}\n", u8::from(self.wrapper.is_some())));
        }
        let alive = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        self.procs.insert(t, Proc { pgid: pid, stopping: false, alive: alive.clone(), adopted: None });
        self.started.push(TaskStart { task: t, pid: pid as u32, at_ms: now_ms() });
        let extras = Extras::default();
        self.attach_extras(a, pid, None, &alive, &extras);
        if let Some(g) = &group {
            watch_oom(g, pid, None, alive.clone(), extras.oom.clone());
        }
        let exits = self.exits.clone();
        let record = record_path(&self.dir, &t);
        tokio::spawn(async move {
            let status_now = child.wait().await;
            alive.store(false, std::sync::atomic::Ordering::SeqCst);
            let _ = std::fs::remove_file(&record);
            let _ = std::fs::remove_file(&status);
            let (code, signal) = match status_now {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            // Take down anything the task left behind in its group (pid > 1 checked at spawn).
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            finish(t, code, signal, group, extras, exits).await;
        });
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
    ) {
        if extras.attached.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let t = a.task;
        let ckpt = checkpoint_dir(&self.dir, t.job);
        let log = log_path(&self.dir, &t);
        // Signals go to the group only while it is ours: reaped children and adopted processes that ended (or whose
        // id now names another process) are never signalled.
        let may_signal = {
            let alive = alive.clone();
            move || alive.load(std::sync::atomic::Ordering::SeqCst) && adopted_start.is_none_or(|s| same_leader(pid, s))
        };
        if let Some(l) = a.liveness.clone() {
            let failed = extras.probe_failed.clone();
            let env = a.env.clone();
            let dir = ckpt.clone();
            let run_as = self.run_as;
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
                    let mut c = tokio::process::Command::new(p);
                    c.args(args).envs(&env).current_dir(&dir).stdin(std::process::Stdio::null()).kill_on_drop(true);
                    if let Ok(f) = std::fs::OpenOptions::new().append(true).open(&log) {
                        if let Ok(g) = f.try_clone() {
                            c.stdout(f).stderr(g);
                        }
                    }
                    if let Some((uid, gid)) = run_as {
                        c.uid(uid).gid(gid);
                    }
                    let ok = match tokio::time::timeout(period, c.status()).await {
                        Ok(Ok(s)) => s.success(),
                        _ => false,
                    };
                    if !ok {
                        tracing::warn!(job = t.job, rank = t.rank, "liveness probe failed");
                        *failed.lock().expect("probe lock") =
                            Some(format!("failed its liveness probe ({})", l.command.join(" ")));
                        if may_signal() {
                            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                        }
                        return;
                    }
                    tokio::time::sleep(period).await;
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
            sink: self.checkpointed.clone(),
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
                // Gone (or the id names another process now): nothing to adopt or kill.
                let _ = std::fs::remove_file(e.path());
                let _ = std::fs::remove_file(status_path(&self.dir, &t));
                continue;
            }
            if !wrapped {
                tracing::warn!(pid, task = ?t, "killing a task a previous agent run started without the wrapper");
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            tracing::info!(pid, job = t.job, rank = t.rank, attempt = t.attempt, "adopted a running task");
            let alive = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
            let extras = Extras::default();
            self.procs.insert(
                t,
                Proc { pgid: pid, stopping: false, alive: alive.clone(), adopted: Some((start, extras.clone())) },
            );
            adopted.push(t);
            let exits = self.exits.clone();
            let record = e.path();
            let status = status_path(&self.dir, &t);
            let group = self.cgroups.open(&format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt));
            if let Some(g) = &group {
                watch_oom(g, pid, Some(start), alive.clone(), extras.oom.clone());
            }
            tokio::spawn(async move {
                // Not our child: watch /proc until the wrapper is gone.
                while same_leader(pid, start) {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                alive.store(false, std::sync::atomic::Ordering::SeqCst);
                let ended = crate::wrapper::Ended::parse(&std::fs::read_to_string(&status).unwrap_or_default());
                let _ = std::fs::remove_file(&record);
                let _ = std::fs::remove_file(&status);
                for p in group_members(pid, start) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
                }
                let (code, signal) = match ended {
                    Some(crate::wrapper::Ended::Exit(c)) => (Some(c), None),
                    Some(crate::wrapper::Ended::Signal(s)) => (None, Some(s)),
                    // An empty file: the wrapper itself was killed (SIGKILL to the group).
                    None => (None, Some(9)),
                };
                finish(t, code, signal, group, extras, exits).await;
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
        self.attach_extras(a, pid, Some(start), &alive, &extras);
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
        let adopted = p.adopted.as_ref().map(|(s, _)| *s);
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

    /// Whether the end of `t` was asked for.
    pub fn was_stopped(&self, t: &TaskRef) -> bool {
        self.procs.get(t).is_some_and(|p| p.stopping)
    }

    /// Stops everything (agent shutdown).
    pub fn stop_all(&mut self, grace: std::time::Duration) {
        let all: Vec<TaskRef> = self.procs.keys().copied().collect();
        for t in all {
            self.stop(&t, grace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

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
