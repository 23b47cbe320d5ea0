//! Starting task attempts. The tasks of one answer of the server are started together: each one's directories,
//! cgroups and process are made on the blocking pool, several at once, and only then registered with the launcher
//! in the answer's order. A start is mostly system calls that wait (directory and file creation on the node's disk,
//! cgroup directories, the spawner's answer — see `crate::spawner` — or the `execve` of the wrapper without one), so
//! started one after the other the last task of a batch of 16 waited for 15 others; now they overlap.
//!
//! The agent does not wait for them either ([`Starting`]): its sync loop goes on (new tasks, ends, stops) while
//! tasks start, and takes each in ([`Launcher::take`]) as soon as its process runs. Waiting for a whole batch held
//! every task the server placed meanwhile until the slowest start of the batch had ended.

use super::{
    checkpoint_dir, claim_job, env_path, finish, group_dir, log_path, now_ms, own_dir, proc_identity, record_path,
    running_dir, status_path, watch_oom, work_dir, wrapper_command, write_private, Extras, Launcher, Proc,
};
use gpunet_api::agent::{TaskAssignment, TaskExit, TaskRef, TaskStart};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

/// A task attempt whose process runs, ready to be registered.
struct Launched {
    waiter: Waiter,
    pid: i32,
    /// Its start time (`/proc/PID/stat`), where it could be read.
    start: Option<u64>,
    group: Option<crate::cgroups::TaskCgroup>,
    status: PathBuf,
    env_file: PathBuf,
    /// When its process was started, ms since the Unix epoch.
    at_ms: u64,
    /// A container task's: the socket on which its wrapper says that the container runs.
    started: Option<std::os::unix::net::UnixStream>,
    /// Its wrapper watches the node's lease (see [`crate::lease`]): it stops the task itself when the lease runs out.
    leased: bool,
}

/// How the end of a task attempt's first process is learned.
enum Waiter {
    /// Our child (the wrapper executed, or a task without one).
    Child(tokio::process::Child),
    /// Forked by the spawner, which reports its end and reaps it when told (see [`crate::spawner`]); its start time
    /// as the spawner read it.
    Spawned(tokio::sync::oneshot::Receiver<crate::spawner::Exit>, std::sync::Arc<crate::spawner::Spawner>, u64),
}

/// Task attempts being started in the background ([`Launcher::begin`], each a tokio task of its own), each taken in
/// by [`Launcher::take`] once it ended. A launch is never abandoned: its process may already run, so whoever stops
/// the agent waits for every launch ([`Starting::next`]) and stops what they started.
#[derive(Default)]
pub struct Starting {
    launches: futures_util::stream::FuturesUnordered<futures_util::future::BoxFuture<'static, Begun>>,
    tasks: std::collections::HashSet<TaskRef>,
}

/// A launch that ended: its task runs (or it could not start, which is reported already).
pub struct Begun {
    assignment: TaskAssignment,
    launched: Option<Launched>,
}

impl std::fmt::Debug for Starting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Starting").field("tasks", &self.tasks).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Begun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Begun")
            .field("task", &self.assignment.task)
            .field("started", &self.launched.as_ref().map(|l| l.pid))
            .finish()
    }
}

impl Starting {
    /// Whether this task attempt is being started.
    pub fn contains(&self, t: &TaskRef) -> bool {
        self.tasks.contains(t)
    }

    /// The task attempts being started.
    pub fn tasks(&self) -> impl Iterator<Item = &TaskRef> {
        self.tasks.iter()
    }

    /// Whether no launch is in flight.
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// The next launch to end; `None` when none is in flight.
    pub async fn next(&mut self) -> Option<Begun> {
        use futures_util::StreamExt as _;
        let b = self.launches.next().await?;
        self.tasks.remove(&b.assignment.task);
        Some(b)
    }
}

/// Reports a task attempt that could not start: it ends at once with code 127.
fn report_start_failure(exits: &tokio::sync::mpsc::UnboundedSender<TaskExit>, t: TaskRef, msg: &str) {
    tracing::warn!(job = t.job, rank = t.rank, error = %msg, "task could not start");
    let _ = exits.send(TaskExit {
        task: t,
        code: Some(127),
        signal: None,
        oom: false,
        stopped: false,
        reason: Some(format!("could not start: {msg}")),
    });
}

/// Spawns `cmd` as our child leading a process group of its own (the wrapper executed, or a task without one).
fn spawn_child(cmd: &mut tokio::process::Command, prog: &str) -> Result<(Waiter, i32), String> {
    let c = cmd.process_group(0).kill_on_drop(false).spawn().map_err(|e| format!("start {prog}: {e}"))?;
    match c.id().map(|p| p as i32).filter(|p| *p > 1) {
        Some(pid) => Ok((Waiter::Child(c), pid)),
        None => Err(format!("start {prog}: no process id")),
    }
}

/// Runs `f` on the blocking pool; a panic there becomes an error.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(format!("the start's thread failed: {e}")))
}

/// Makes the task's log directory and file (root's, readable by the tenant's group), its checkpoint and own
/// directories (the task user's, 0700) and its working directory beneath its own; returns the log twice (stdout and
/// stderr) and the working directory.
fn prepare_files(
    log: &Path,
    ckpt: &Path,
    home: &Path,
    user: Option<(u32, u32)>,
    working_dir: Option<&str>,
) -> Result<(std::fs::File, std::fs::File, PathBuf), String> {
    let files = (|| -> std::io::Result<(std::fs::File, std::fs::File)> {
        // Logs stay root's: the agent reads them back by name, so the task must not be able to swap them.
        // The tenant's group may read them (its task reads `GPUNET_LOG_FILE`), nobody else.
        let gid = user.map(|(_, g)| g);
        group_dir(log.parent().expect("log has a parent"), gid)?;
        own_dir(ckpt, user)?;
        own_dir(home, user)?;
        let f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o640)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(log)?
        };
        if let Some(g) = gid {
            rustix::fs::fchown(&f, None, Some(rustix::fs::Gid::from_raw(g)))?;
        }
        rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(0o640))?;
        let g = f.try_clone()?;
        Ok((f, g))
    })();
    let (out, err) = files.map_err(|e| format!("prepare the task's directories: {e}"))?;
    // The working directory: relative, beneath the task's own directory, made without following symlinks.
    let cwd = match working_dir {
        None => home.to_path_buf(),
        Some(w) => match gpunet_api::spec::relative_working_dir(w) {
            None => return Err(format!("invalid working_dir {w:?}: allowed is a relative path without '..'")),
            Some(parts) => {
                crate::beneath::open_trusted(home)
                    .and_then(|h| crate::beneath::make_dirs(&h, &parts, user))
                    .map_err(|e| format!("make working_dir {w:?}: {e}"))?;
                parts.iter().fold(home.to_path_buf(), |p, x| p.join(x))
            }
        },
    };
    Ok((out, err, cwd))
}

impl Launcher {
    /// Starts a task. A task that cannot start (no command, a missing program, a bad working directory) ends at once
    /// with code 127. With checkpoint tiers, an empty checkpoint directory first gets the newest snapshot of any tier.
    pub async fn start(&mut self, a: &TaskAssignment) {
        self.start_all(&[a]).await;
    }

    /// Starts tasks together (see the module's documentation), each as [`Launcher::start`] does.
    pub async fn start_all(&mut self, tasks: &[&TaskAssignment]) {
        let launched = futures_util::future::join_all(tasks.iter().map(|a| self.launch(a))).await;
        for (a, l) in tasks.iter().zip(launched) {
            if let Some(l) = l {
                self.register(a, l);
            }
        }
    }

    /// Starts tasks in the background (see [`Starting`]); each is taken in by [`Launcher::take`]. Tasks already being
    /// started are skipped.
    pub fn begin(&self, starting: &mut Starting, tasks: &[&TaskAssignment]) {
        let tasks: Vec<TaskAssignment> =
            tasks.iter().filter(|a| starting.tasks.insert(a.task)).map(|a| (*a).clone()).collect();
        if tasks.is_empty() {
            return;
        }
        // What a launch reads of the launcher (its configuration), owned by the launches: the launcher itself goes
        // on changing meanwhile.
        let me = std::sync::Arc::new(self.for_launches());
        for assignment in tasks {
            let me = me.clone();
            // A task of its own: it makes progress whatever the sync loop waits for, and is never cancelled half-way
            // (its process may run already).
            let a = assignment.clone();
            let launch = tokio::spawn(async move {
                let launched = me.launch(&a).await;
                Begun { assignment: a, launched }
            });
            let exits = self.exits.clone();
            starting.launches.push(Box::pin(async move {
                launch.await.unwrap_or_else(|e| {
                    // A panic in the start: the task did not start (reported like any start that failed).
                    report_start_failure(&exits, assignment.task, &e.to_string());
                    Begun { assignment, launched: None }
                })
            }));
        }
    }

    /// Takes in a launch that ended: a task whose process runs is registered (as [`Launcher::start_all`] does) and
    /// returned.
    pub fn take(&mut self, b: Begun) -> Option<TaskRef> {
        let Begun { assignment, launched } = b;
        let l = launched?;
        self.register(&assignment, l);
        Some(assignment.task)
    }

    /// Reports a task that could not start: it ends at once with code 127.
    fn fail_start(&self, t: TaskRef, msg: String) -> Option<Launched> {
        report_start_failure(&self.exits, t, &msg);
        None
    }

    /// Makes everything a task attempt needs and starts its process; `None` when it could not start (reported).
    async fn launch(&self, a: &TaskAssignment) -> Option<Launched> {
        let t = a.task;
        let (prog, args) = match (a.command.split_first(), &a.container, &self.containers) {
            // A container task: the wrapper runs the runtime (the command may come from the image).
            (_, Some(_), Some(rt)) if self.wrapper.is_some() => (rt.exe.display().to_string(), Vec::new()),
            (_, Some(_), _) => {
                return self.fail_start(t, "this node runs no containers (no OCI runtime, or no task wrapper)".into())
            }
            (Some((prog, args)), None, _) => (prog.clone(), args.to_vec()),
            (None, None, _) => return self.fail_start(t, "the job has no command".into()),
        };
        let user = self.identity(a);
        let ckpt = checkpoint_dir(&self.dir, t.job);
        let home = work_dir(&self.dir, &t);
        let prepared = {
            let (log, ckpt, home) = (log_path(&self.dir, &t), ckpt.clone(), home.clone());
            // An absolute working directory of a container task is in its image, not on the node.
            let wd = a.working_dir.clone().filter(|w| a.container.is_none() || !w.starts_with('/'));
            let (dir, job, submitted) = (self.dir.clone(), t.job, a.submitted_ms);
            blocking(move || {
                claim_job(&dir, job, submitted).map_err(|e| format!("prepare the job's directories: {e}"))?;
                prepare_files(&log, &ckpt, &home, user, wd.as_deref())
            })
            .await
        };
        let (out, err, cwd) = match prepared {
            Ok(p) => p,
            Err(msg) => return self.fail_start(t, msg),
        };
        let tier_root = self.dir.join("tiers");
        if !a.tiers.is_empty() && std::fs::read_dir(&ckpt).map_or(true, |mut d| d.next().is_none()) {
            match crate::copier::restore(&self.copy_how(user), &a.tiers, &tier_root, &t, &ckpt).await {
                Ok(Some(ts)) => tracing::info!(job = t.job, rank = t.rank, snapshot = ts, "checkpoint restored"),
                Ok(None) => {}
                Err(e) => tracing::warn!(job = t.job, error = %e, "checkpoint restore failed; starting without"),
            }
        }
        let env = self.task_env(a, &home);
        let container = match (&a.container, &self.containers) {
            (Some(_), Some(rt)) => {
                let log = log_path(&self.dir, &t);
                let dirs = crate::container::TaskDirs {
                    home: &home,
                    cwd: &cwd,
                    checkpoint: &ckpt,
                    log: &log,
                    env: &env,
                    user,
                    dev_dir: &self.dev_dir,
                };
                match rt.plan(a, dirs) {
                    Ok(p) => Some(p),
                    Err(msg) => {
                        rt.remove(&t);
                        return self.fail_start(t, msg);
                    }
                }
            }
            _ => None,
        };
        let status = status_path(&self.dir, &t);
        let env_file = env_path(&self.dir, &t);
        let record = record_path(&self.dir, &t);
        let mut devices = crate::cgroups::device_rules(&self.dev_dir, &a.gpus);
        if a.container.is_some() {
            // What the runtime allows the container's groups beneath (its defaults) must be allowed here first.
            devices.extend(crate::container::RUNTIME_DEVICE_RULES.iter().map(|r| r.to_string()));
        }
        let cgroups = self.cgroups.clone();
        let group_name = format!("job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt);
        let (memory_mib, cpu_milli, pids_max) = (a.memory_mib, a.cpu_milli, self.pids_max);
        let (wrapper, task_path, pid_namespace) = (self.wrapper.clone(), self.task_path.clone(), self.pid_namespace);
        let env_for_direct = env.clone();
        let status_for_spawn = status.clone();
        let is_container = container.is_some();
        let spawner = self.spawner.clone();
        let lease = self.lease.clone();
        // Through the wrapper, the task gets the lease (see `crate::lease`).
        let leased = wrapper.is_some() && lease.is_some();
        let spawned = blocking(move || {
            let status = status_for_spawn;
            let group = cgroups
                .create(&group_name, memory_mib, cpu_milli, pids_max, Some(&devices))
                // A node that has cgroups never runs a task outside them: without its group the task would have no
                // memory or CPU limit, no device restriction, and could leave children behind. It fails to start
                // instead.
                .map_err(|e| format!("create the task's cgroups: {e}"))?;
            let unmade = |group: &Option<crate::cgroups::TaskCgroup>| {
                if let Some(g) = group {
                    g.remove();
                }
            };
            // A container task's wrapper gets a socket as its standard input: it says there when the container runs.
            // A process task's wrapper reads the task's environment from a pipe.
            let mut started = None;
            let mut env_pipe = None;
            let (waiter, pid) = match &wrapper {
                // Through the wrapper: it joins the cgroups as root, drops to the task's user and records how the
                // task ends (see `crate::wrapper`). It starts with an empty environment; only the task gets `env`.
                Some(w) => {
                    running_dir(status.parent().expect("status dir"))
                        .map_err(|e| format!("prepare {}: {e}", status.display()))?;
                    let mut exec = crate::wrapper::Exec {
                        status: Some(status.clone()),
                        cgroups: group.as_ref().map(|g| g.procs.clone()).unwrap_or_default(),
                        user,
                        // Through its standard input: one file fewer to create and delete per task (creating files
                        // is what a task start spends most on where the filesystem has no journal).
                        env_file: Some("-".into()),
                        cwd: Some(cwd.clone()),
                        pid_namespace,
                        // Its private /tmp and /dev/shm: no bigger than its memory limit, which bounds them anyway.
                        tmp_mib: Some(memory_mib.max(4)),
                        lease,
                        container: None,
                        prog: prog.clone(),
                        args: args.clone(),
                    };
                    if let Some((plan, c)) = container {
                        // The plan carries the environment (the wrapper reads none from its input), root's alone in
                        // the bundle; the wrapper turns it into the runtime's configuration.
                        let written = crate::container::bundle::write(&c.bundle, "plan.json", &plan);
                        if let Err(e) = written {
                            unmade(&group);
                            return Err(e);
                        }
                        exec = crate::wrapper::Exec {
                            env_file: None,
                            cwd: None,
                            pid_namespace: false,
                            tmp_mib: None,
                            container: Some(c),
                            ..exec
                        };
                    }
                    let stdin: std::os::fd::OwnedFd = if is_container {
                        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
                            .map_err(|e| format!("make the start socket: {e}"))?;
                        started = Some(ours);
                        theirs.into()
                    } else {
                        let (r, w) = std::io::pipe().map_err(|e| format!("make the environment's pipe: {e}"))?;
                        env_pipe = Some(std::os::fd::OwnedFd::from(w));
                        r.into()
                    };
                    let (out, err): (std::os::fd::OwnedFd, std::os::fd::OwnedFd) = (out.into(), err.into());
                    let mut forked = None;
                    // Forked by the spawner (see `crate::spawner`); a spawner found dead (no wrapper runs then) is
                    // started again once, and without one the agent executes the wrapper itself.
                    for _ in 0..2 {
                        let Some(sp) = spawner.get(w, &task_path) else { break };
                        let dup = |f: &std::os::fd::OwnedFd| f.try_clone().map_err(|e| format!("start {prog}: {e}"));
                        let fds = match (dup(&stdin), dup(&out), dup(&err)) {
                            (Ok(i), Ok(o), Ok(e)) => [i, o, e],
                            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                                unmade(&group);
                                return Err(e);
                            }
                        };
                        match sp.spawn(&exec.to_args(), fds) {
                            Ok((pid, start, exit)) => {
                                forked = Some((Waiter::Spawned(exit, sp, start), pid));
                                break;
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                                tracing::warn!(error = %e, "the task spawner is gone; starting another");
                            }
                            Err(e) => {
                                // A wrapper that answered too late was killed; what it put in the groups goes.
                                if let Some(g) = &group {
                                    g.kill_all();
                                    g.remove();
                                }
                                return Err(format!("start {prog}: {e}"));
                            }
                        }
                    }
                    match forked {
                        Some(f) => f,
                        None => {
                            let mut cmd = wrapper_command(w, &exec, &task_path);
                            cmd.stdin(stdin).stdout(out).stderr(err);
                            spawn_child(&mut cmd, &prog).inspect_err(|_| unmade(&group))?
                        }
                    }
                }
                // No wrapper (library use and unit tests): the task is spawned directly and joins no cgroup.
                None => {
                    if group.is_some() {
                        tracing::warn!(job = t.job, "no task wrapper: the task runs outside its cgroups");
                    }
                    let mut c = tokio::process::Command::new(&prog);
                    c.args(&args).env_clear().envs(&env_for_direct).current_dir(&cwd);
                    if let Some((uid, gid)) = user {
                        c.uid(uid).gid(gid);
                    }
                    c.stdin(std::process::Stdio::null()).stdout(out).stderr(err);
                    spawn_child(&mut c, &prog).inspect_err(|_| unmade(&group))?
                }
            };
            let at_ms = now_ms();
            // A spawned wrapper's start time is the spawner's reading (its child, surely not reaped yet).
            let start = match &waiter {
                Waiter::Spawned(_, _, s) => Some(*s),
                Waiter::Child(_) => proc_identity(pid).map(|(_, start)| start),
            };
            if let Some(start) = start {
                let _ = running_dir(record.parent().expect("record dir"));
                let wrapped = u8::from(wrapper.is_some());
                let _ = write_private(&record, format!("{pid} {start} {wrapped}\n").as_bytes());
            }
            Ok((waiter, pid, start, group, at_ms, started, env_pipe))
        })
        .await;
        let (waiter, pid, start, group, at_ms, started, env_pipe) = match spawned {
            Ok(s) => s,
            Err(msg) => return self.fail_start(t, msg),
        };
        if let Some(pipe) = env_pipe {
            let bytes = crate::wrapper::env_bytes(&env);
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt as _;
                // Dropped at the end: the wrapper reads to the end of its input.
                if let Ok(mut pipe) = tokio::net::unix::pipe::Sender::from_owned_fd(pipe) {
                    let _ = pipe.write_all(&bytes).await;
                }
            });
        }
        Some(Launched { waiter, pid, start, group, status, env_file, at_ms, started, leased })
    }

    /// Takes a started task attempt into the launcher: its start is reported, its probe and checkpoint copies run,
    /// and its end is watched.
    fn register(&mut self, a: &TaskAssignment, l: Launched) {
        let t = a.task;
        let Launched { waiter, pid, start, group, status, env_file, at_ms, started, leased } = l;
        // A wrapper the spawner forked is not our child: like an adopted task's, its identity (the start time) is
        // checked before every signal, since the spawner may die and its pid be reaped and reused unseen.
        let leader_start = match &waiter {
            Waiter::Spawned(_, _, s) => Some(*s),
            Waiter::Child(_) => None,
        };
        tracing::info!(job = t.job, rank = t.rank, attempt = t.attempt, pid, gpus = ?a.gpus, "task started");
        let alive = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let extras = Extras::default();
        self.procs.insert(
            t,
            Proc {
                pgid: pid,
                stopping: false,
                alive: alive.clone(),
                adopted: None,
                leader_start,
                extras: extras.clone(),
                asked: false,
                leased,
            },
        );
        match started {
            None => self.started.lock().expect("starts").push(TaskStart { task: t, pid: pid as u32, at_ms }),
            // A container task started when its container runs (after the image and the runtime's create and
            // start), which its wrapper says on the socket; a container that never ran reports no start, only its end.
            Some(sock) => {
                let sink = self.started.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncReadExt as _;
                    let Ok(()) = sock.set_nonblocking(true) else { return };
                    let Ok(mut sock) = tokio::net::UnixStream::from_std(sock) else { return };
                    let mut b = [0u8; 1];
                    if matches!(sock.read(&mut b).await, Ok(1)) && b[0] == b's' {
                        tracing::info!(job = t.job, rank = t.rank, attempt = t.attempt, "container running");
                        sink.lock().expect("starts").push(TaskStart { task: t, pid: pid as u32, at_ms: now_ms() });
                    }
                });
            }
        }
        self.attach_extras(a, pid, leader_start, &alive, &extras, group.as_ref());
        if let Some(g) = &group {
            watch_oom(g, pid, leader_start, alive.clone(), extras.oom.clone());
        }
        let exits = self.exits.clone();
        let record = record_path(&self.dir, &t);
        let containers = self.containers.clone();
        tokio::spawn(async move {
            // How it ended; whether its pid is still its own (our child not yet reaped, or the spawner's zombie);
            // the spawner to tell to reap it.
            let (code, signal, held, reap) = match waiter {
                Waiter::Child(mut child) => match child.wait().await {
                    Ok(s) => (s.code(), s.signal(), true, None),
                    Err(_) => (None, None, true, None),
                },
                Waiter::Spawned(exit, spawner, _) => match exit.await {
                    // Not reaped yet: its pid is still its own until the spawner is told below.
                    Ok(crate::spawner::Exit::Ended { code, signal }) => (code, signal, true, Some(spawner)),
                    // The spawner died first: the wrapper is watched as an adopted one (its status file, once its
                    // pid is gone).
                    _ => {
                        while start.is_some_and(|s| super::same_leader(pid, s)) {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                        match crate::wrapper::Ended::parse(&std::fs::read_to_string(&status).unwrap_or_default()) {
                            Some(crate::wrapper::Ended::Exit(c)) => (Some(c), None, false, None),
                            Some(crate::wrapper::Ended::Signal(s)) => (None, Some(s), false, None),
                            None => (None, Some(Signal::SIGKILL as i32), false, None),
                        }
                    }
                },
            };
            alive.store(false, std::sync::atomic::Ordering::SeqCst);
            let _ = std::fs::remove_file(&record);
            let _ = std::fs::remove_file(&status);
            let _ = std::fs::remove_file(&env_file);
            // Take down anything the task left behind in its group (pid > 1 checked at spawn and by the spawner's
            // reader); the rest of its cgroup goes in `finish`. A pid no longer held may lead another group now:
            // only the processes of the group that started no earlier than the wrapper are killed then.
            // The spawner's zombie keeps its pid unless the spawner died meanwhile (checked: still that process).
            let held = held && start.is_none_or(|s| proc_identity(pid).is_some_and(|(_, st)| st == s));
            if held {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            } else if let Some(s) = start {
                for p in super::group_members(pid, s) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            if let Some(sp) = reap {
                sp.reap(pid);
            }
            finish(t, code, signal, group, extras, exits, containers).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_made_beneath_the_tasks_own_directory() {
        let d = tempfile::tempdir().unwrap();
        let t = TaskRef { job: 7, rank: 1, attempt: 0 };
        let (log, ckpt, home) = (log_path(d.path(), &t), checkpoint_dir(d.path(), 7), work_dir(d.path(), &t));
        let (_, _, cwd) = prepare_files(&log, &ckpt, &home, None, Some("a/b")).unwrap();
        assert_eq!(cwd, home.join("a").join("b"));
        assert!(cwd.is_dir() && log.is_file() && ckpt.is_dir());
        let e = prepare_files(&log, &ckpt, &home, None, Some("../x")).unwrap_err();
        assert!(e.contains("invalid working_dir"), "{e}");
    }

    #[tokio::test]
    async fn several_tasks_start_together_and_each_failure_is_its_own() {
        let d = tempfile::tempdir().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut l = Launcher::new(d.path().to_path_buf(), tx, crate::cgroups::Cgroups::None);
        let mk = |job: u64, command: Vec<&str>| TaskAssignment {
            task: TaskRef { job, rank: 0, attempt: 0 },
            command: command.into_iter().map(String::from).collect(),
            env: Default::default(),
            working_dir: None,
            container: None,
            checkpoint_now: None,
            gpus: vec![],
            mig: vec![],
            cpu_milli: 100,
            memory_mib: 64,
            grace_ms: 1000,
            liveness: None,
            tiers: vec![],
            tenant_index: None,
            submitted_ms: None,
            time_limit_ms: None,
            disk_mib: None,
        };
        let (ok1, bad, ok2) = (mk(1, vec!["true"]), mk(2, vec!["/nonexistent/program"]), mk(3, vec!["true"]));
        l.start_all(&[&ok1, &bad, &ok2]).await;
        // The two good ones started, in the answer's order; the bad one ended at once with 127.
        let started: Vec<u64> = l.started.lock().unwrap().iter().map(|s| s.task.job).collect();
        assert_eq!(started, vec![1, 3]);
        let mut ends = std::collections::BTreeMap::new();
        while ends.len() < 3 {
            let e = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv()).await.unwrap().unwrap();
            ends.insert(e.task.job, e);
        }
        assert_eq!(ends[&2].code, Some(127));
        assert!(ends[&2].reason.as_deref().unwrap_or_default().contains("/nonexistent/program"));
        assert_eq!((ends[&1].code, ends[&3].code), (Some(0), Some(0)));
    }
}
