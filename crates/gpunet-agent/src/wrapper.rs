//! `gpunet task-exec --status FILE [--cgroup PROCS]… [--user UID:GID] [--env-file FILE] [--cwd DIR]
//! [--pid-namespace] -- PROG ARGS…`: the first process of every task the agent starts (and of its liveness probes,
//! with `--status -`). It joins the task's cgroups (writing its pid to each `PROCS` file, as root), then runs PROG as
//! its child with exactly the environment in FILE (`KEY=VALUE` entries separated by NUL; `-`: read from standard
//! input, which is how the agent passes a task's, so that no file is created and deleted per task), as UID:GID with
//! no supplementary groups, in DIR; it waits for it and writes how it ended to the status file (`exit N` or
//! `signal N`), then ends the same way.
//!
//! The agent's task spawner forks the wrapper (see `crate::spawner`; without one the agent executes it) with an
//! empty environment (a `PATH` of the agent's choosing only): nothing a job sets (`LD_PRELOAD`, `PATH`, …) reaches a
//! root process. Only the job's own process gets the job's environment.
//!
//! Why a wrapper: only a parent can learn a process's exit status. When an agent restarts, the tasks its previous
//! run started are no longer its children; it adopts them (they keep running) and reads their status from FILE when
//! they end. And joining the cgroups before the task's first instruction needs a process that runs before it.
//!
//! **The init.** After joining the cgroups the wrapper forks the init (one thread, so a fork is safe: see
//! `crate::forked`; executing this program again cost a few milliseconds of CPU per task, mostly the dynamic
//! loader's), and the init starts the task. With `--pid-namespace` (the agent's default) the wrapper first
//! unshares a PID namespace, so the init is PID 1 there; still root, it unshares a mount and an IPC namespace, makes
//! every mount private and mounts a fresh `/proc`, so the task lists only its own namespace's processes, and private
//! tmpfs on `/tmp`, `/dev/shm`, `/var/tmp` and `/run/lock` (`--tmp-size-mib`), gone with the namespace, and hides
//! every cgroup but the task's own under `/sys/fs/cgroup` (see `private_mounts`). The init then drops to
//! the task's uid/gid for good (no supplementary groups; a process that changed its uid is not dumpable, so the task
//! cannot ptrace it, and a PID 1 ignores SIGKILL from inside its namespace), changes into DIR and starts the task
//! with `posix_spawn` — in a process group of its own in a namespace — and forwards SIGTERM, SIGINT, SIGHUP,
//! SIGQUIT, SIGUSR1 and SIGUSR2 to that group (a PID 1 gets no signal it has no handler for, so the task must not be
//! PID 1: a Python task without a SIGTERM handler would never stop). It reaps orphans and tells the wrapper how the
//! task ended (a line on their socket pair) before it exits; the kernel then kills whatever is left in
//! the namespace. A task therefore cannot name — so cannot signal, ptrace or read `/proc` of — any process outside
//! its namespace: not another tenant's, not another task's of its own tenant. The pid the agent records (and
//! signals, and adopts after a restart) is the wrapper's, outside the namespace; the status file is the wrapper's.
//!
//! **Signals are never lost.** The wrapper and the init block the forwarded signals before anything else, so a
//! signal that arrives while there is no task yet (joining the cgroups, starting the init, spawning) stays pending
//! and is delivered once the task exists: the init gets the group's signals directly once it has blocked them, and
//! the ones that reached only the wrapper before are handed over (the init waits for that hand-over before it starts
//! the task, so nothing is passed twice). `posix_spawn` gives the task an empty mask and default dispositions at its
//! exec (`std::process::Command` would hand the blocked mask on); one that lands in between ends it the default way,
//! never silently. Without a PID namespace (`--no-pid-namespace`) the task runs in the wrapper's own process group
//! (SIGKILL to the group must reach it with no namespace to end), so the group's signals reach it directly and the
//! init passes on only those that arrived before the task existed (one that lands in the microseconds between the
//! task's exec and the init's check may arrive twice). SIGKILL to the group kills the wrapper and the init (and with
//! it the namespace); the status file then stays empty and the end is known to whoever sent it. The wrapper stays
//! root while the task runs as its user, so the task can neither signal it nor write its status file.

use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// The signals passed on to the task (SIGKILL and SIGSTOP cannot be caught; they reach everyone directly).
pub(crate) const FORWARDED: [Signal; 6] =
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2];

/// The signals the wrapper forwards to the task (see the module's doc).
pub(crate) fn forwarded() -> SigSet {
    signal_set(None)
}

fn signal_set(extra: Option<Signal>) -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED.iter().copied().chain(extra) {
        set.add(s);
    }
    set
}

/// What the wrapper is asked to do (its command line).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exec {
    /// Where to write how the task ended; `None` (`--status -`): nowhere (a probe).
    pub status: Option<PathBuf>,
    /// `cgroup.procs` files to join before the task starts.
    pub cgroups: Vec<PathBuf>,
    /// Run the task as this uid and gid.
    pub user: Option<(u32, u32)>,
    /// The task's whole environment (see [`write_env_file`]); `None`: the wrapper's own.
    pub env_file: Option<PathBuf>,
    /// The task's working directory.
    pub cwd: Option<PathBuf>,
    /// Run the task in a PID and mount namespace of its own, under an init (see the module's doc).
    pub pid_namespace: bool,
    /// The size bound (MiB) of each of the task's private tmpfs ([`PRIVATE_TMP`]: `--tmp-size-mib`; with
    /// `pid_namespace`);
    /// `None`: tmpfs's default, half the RAM. Either way the pages count against the task's memory limit.
    pub tmp_mib: Option<u64>,
    /// The node's lease (`--lease FILE`, see [`crate::lease`]): once it runs out (the agent was not heard from by the
    /// server for its fence time) the wrapper stops the task itself. `None`: never (probes, direct runs).
    pub lease: Option<PathBuf>,
    /// Run a container instead of `prog` (see [`crate::container::run`]): its id, runtime, bundle and image.
    pub container: Option<crate::container::run::ContainerExec>,
    /// Program.
    pub prog: String,
    /// Arguments.
    pub args: Vec<String>,
}

/// Why the wrapper could not start the task: said on stderr (the task's log), the task ends with `code`.
pub(crate) fn refuse(code: i32, what: std::fmt::Arguments<'_>) -> Ended {
    eprintln!("gpunet: {what}");
    Ended::Exit(code)
}

impl Exec {
    /// The command line after `task-exec`.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec!["--status".to_string()];
        v.push(self.status.as_ref().map_or("-".into(), |s| s.display().to_string()));
        for c in &self.cgroups {
            v.push("--cgroup".into());
            v.push(c.display().to_string());
        }
        if let Some((u, g)) = self.user {
            v.push("--user".into());
            v.push(format!("{u}:{g}"));
        }
        if let Some(e) = &self.env_file {
            v.push("--env-file".into());
            v.push(e.display().to_string());
        }
        if let Some(d) = &self.cwd {
            v.push("--cwd".into());
            v.push(d.display().to_string());
        }
        if self.pid_namespace {
            v.push("--pid-namespace".into());
        }
        if let Some(m) = self.tmp_mib {
            v.push("--tmp-size-mib".into());
            v.push(m.to_string());
        }
        if let Some(l) = &self.lease {
            v.push("--lease".into());
            v.push(l.display().to_string());
        }
        if let Some(c) = &self.container {
            c.to_args(&mut v);
        }
        v.push("--".into());
        v.push(self.prog.clone());
        v.extend(self.args.iter().cloned());
        v
    }

    /// Reads the command line after `task-exec`.
    pub fn parse(argv: &[String]) -> Result<Exec, String> {
        let mut e = Exec::default();
        let mut it = argv.iter();
        let mut status = None;
        while let Some(a) = it.next() {
            let mut val = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
            match a.as_str() {
                "--status" => status = Some(val("--status")?),
                "--cgroup" => e.cgroups.push(val("--cgroup")?.into()),
                "--user" => {
                    let v = val("--user")?;
                    let (u, g) = v.split_once(':').ok_or("--user is UID:GID")?;
                    e.user = Some((u.parse().map_err(|_| "--user uid")?, g.parse().map_err(|_| "--user gid")?));
                }
                "--env-file" => e.env_file = Some(val("--env-file")?.into()),
                "--cwd" => e.cwd = Some(val("--cwd")?.into()),
                "--pid-namespace" => e.pid_namespace = true,
                "--lease" => e.lease = Some(val("--lease")?.into()),
                "--tmp-size-mib" => {
                    e.tmp_mib = Some(val("--tmp-size-mib")?.parse().map_err(|_| "--tmp-size-mib is a number")?)
                }
                other if crate::container::run::ContainerExec::take(&mut e.container, other, || val(other))? => {}
                "--" => {
                    if e.container.as_ref().is_some_and(|c| !c.complete()) {
                        return Err(
                            "--container needs --runtime, --runtime-root, --bundle, --image-dir and --image-cache"
                                .into(),
                        );
                    }
                    e.prog = it.next().cloned().ok_or("no program after --")?;
                    e.args = it.cloned().collect();
                    let status = status.ok_or("--status is required")?;
                    e.status = (status != "-").then(|| status.into());
                    return Ok(e);
                }
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        Err("no -- PROG".into())
    }

    /// Joins the cgroups, runs the task and records how it ended.
    pub fn run(&self) -> Ended {
        let ended = self.start_and_wait();
        if let Some(s) = &self.status {
            write_status(s, ended);
        }
        ended
    }

    fn start_and_wait(&self) -> Ended {
        // Before anything else: a stop that arrives from now on waits, pending, until there is a task to deliver it
        // to (read back through a descriptor that no child inherits).
        let set = signal_set(None);
        let pending = match set
            .thread_block()
            .and_then(|()| SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC))
        {
            Ok(fd) => fd,
            Err(e) => return refuse(125, format_args!("block signals: {e}")),
        };
        // `--env-file -`: the agent writes the environment to our standard input (no file to create and delete per
        // task) and closes it; it reaches the init over the socket.
        let env = match self.env_file.as_deref() {
            Some(f) if f == Path::new("-") => {
                let mut data = Vec::new();
                if let Err(e) = std::io::stdin().take(ENV_MAX).read_to_end(&mut data) {
                    return refuse(125, format_args!("read the task's environment from standard input: {e}"));
                }
                Some(data)
            }
            _ => None,
        };
        // A container's image is made ready first, outside the task's groups (see `container::run::prepare`).
        let image = match &self.container {
            Some(c) => match crate::container::run::prepare(c) {
                Ok(i) => Some(i),
                Err(e) => return e,
            },
            None => None,
        };
        let me = std::process::id().to_string();
        for c in &self.cgroups {
            if let Err(e) = std::fs::write(c, &me) {
                return refuse(125, format_args!("join cgroup {}: {e}", c.display()));
            }
        }
        if let (Some(c), Some(image)) = (&self.container, &image) {
            // The runtime makes the container's namespaces; the wrapper is its parent (see `container::run`).
            return crate::container::run::run(c, image, &self.cgroups, self.lease.as_deref());
        }
        if self.pid_namespace {
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID) {
                return refuse(
                    125,
                    format_args!("unshare a pid namespace: {e} (the agent's --no-pid-namespace runs tasks without)"),
                );
            }
        }
        self.through_init(&pending, env.as_deref())
    }

    /// The wrapper's side of the init: starts it (PID 1 of the new namespace, or just a child without one), hands
    /// it the signals that reached only the wrapper, and learns from it how the task ended.
    fn through_init(&self, pending: &SignalFd, env: Option<&[u8]>) -> Ended {
        let (mut ours, theirs) = match std::os::unix::net::UnixStream::pair() {
            Ok(p) => p,
            Err(e) => return refuse(125, format_args!("make a socket pair: {e}")),
        };
        // The init is this process forked, not this program executed again: an exec of this (large) program costs a
        // few milliseconds of CPU per task, mostly the dynamic loader's. It tells the wrapper how the task ended on
        // the socket and exits 0 (a PID 1 cannot end by a signal), as the init always did.
        let pid = match crate::forked::fork_init(&ours) {
            Ok(None) => {
                self.init(theirs);
                std::process::exit(0)
            }
            Ok(Some(pid)) => pid,
            Err(e) => return refuse(125, format_args!("start the task's init: {e}")),
        };
        // The node's lease is looked at while we wait for the init's word (no thread: after unsharing a PID
        // namespace this process cannot start one).
        let mut fence = self
            .lease
            .as_ref()
            .map(|l| crate::lease::Fence::new(l.clone(), pid, self.cgroups.clone(), self.pid_namespace));
        drop(theirs); // our copy of the init's end of the socket: EOF once the init is gone
        let mut first = [0u8; 1];
        let mut text = String::new();
        if matches!(ours.read(&mut first), Ok(1)) {
            if first[0] == b'r' {
                // The init has blocked the signals: what reached only us goes to it, before it starts the task.
                while let Ok(Some(si)) = pending.read_signal() {
                    if let Ok(s) = Signal::try_from(si.ssi_signo as i32) {
                        let _ = kill(pid, s);
                    }
                }
                // Go, with the environment read from our standard input: its length (8 bytes, little-endian),
                // then the bytes.
                let mut go = b"g".to_vec();
                if let Some(env) = env {
                    go.extend_from_slice(&(env.len() as u64).to_le_bytes());
                    go.extend_from_slice(env);
                }
                let _ = ours.write_all(&go);
            } else {
                text.push(first[0] as char);
            }
            read_to_end(&mut ours, &mut text, fence.as_mut());
        }
        use nix::sys::wait::{waitpid, WaitStatus};
        let status = loop {
            match waitpid(pid, None) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other,
            }
        };
        match (Ended::parse(&text), status) {
            (Some(e), _) => e,
            // No word from the init: it was killed (SIGKILL to the group) or failed before it could say.
            (None, Ok(WaitStatus::Exited(_, c))) => Ended::Exit(c),
            (None, Ok(WaitStatus::Signaled(_, s, _))) => Ended::Signal(s as i32),
            (None, Ok(_)) => Ended::Exit(255),
            (None, Err(e)) => refuse(255, format_args!("wait for the task's init: {e}")),
        }
    }

    /// The init (the wrapper's forked child; `wrapper` is its socket to the wrapper): PID 1 of the task's namespace
    /// with `--pid-namespace`, else a plain parent in the wrapper's process group.
    fn init(&self, mut wrapper: std::os::unix::net::UnixStream) -> Ended {
        let e = self.init_run(&mut wrapper);
        // The init's own exit status could not carry a signal (a PID 1 cannot kill itself): a line says it.
        let _ = wrapper.write_all(e.to_line().as_bytes());
        e
    }

    fn init_run(&self, wrapper: &mut std::os::unix::net::UnixStream) -> Ended {
        let set = signal_set(Some(Signal::SIGCHLD));
        if let Err(e) = set.thread_block() {
            return refuse(125, format_args!("block signals: {e}"));
        }
        // Signals that reach us before the task exists (without a namespace: all of them, the task is in our group
        // and gets later ones itself).
        let early = match SignalFd::with_flags(&signal_set(None), SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC) {
            Ok(fd) => fd,
            Err(e) => return refuse(125, format_args!("read signals: {e}")),
        };
        if self.pid_namespace {
            if let Err(e) = private_mounts(self.cwd.as_deref(), self.tmp_mib, &self.cgroups) {
                return refuse(125, format_args!("{e}"));
            }
        }
        // Ready: the wrapper hands over what reached only it; nothing is consumed here before its go.
        let mut go = [0u8; 1];
        if wrapper.write_all(b"r").is_err() || !matches!(wrapper.read(&mut go), Ok(1)) {
            return Ended::Exit(125); // the wrapper is gone
        }
        let env = match self.env_file.as_deref() {
            Some(f) if f == Path::new("-") => {
                let mut len = [0u8; 8];
                let mut data = Vec::new();
                let read = wrapper.read_exact(&mut len).and_then(|()| {
                    let n = u64::from_le_bytes(len).min(ENV_MAX);
                    (&mut *wrapper).take(n).read_to_end(&mut data)
                });
                if let Err(e) = read {
                    return refuse(125, format_args!("read the task's environment from the wrapper: {e}"));
                }
                Some(parse_env(&data))
            }
            _ => None,
        };
        let task = match self.spawn_task(env) {
            Ok(p) => p,
            Err(e) => return e,
        };
        if !self.pid_namespace {
            // The task shares the wrapper's group: it got what came after its start itself, so only what came before
            // is passed on (a signal in the microseconds between its exec and this read may arrive twice).
            while let Ok(Some(si)) = early.read_signal() {
                if let Ok(s) = Signal::try_from(si.ssi_signo as i32) {
                    let _ = kill(task, s);
                }
            }
        }
        loop {
            let Ok(sig) = set.wait() else { continue };
            if sig != Signal::SIGCHLD {
                if self.pid_namespace {
                    // The task leads its own group in the namespace: every signal reaches it through us, once.
                    let _ = killpg(task, sig);
                }
                // Without a namespace the group's signal reached the task directly (and is dropped here, with any
                // other the group got meanwhile). In a namespace every other pending signal is the task's still: the
                // next wait passes it on (draining them here lost a SIGTERM that came with a SIGUSR1).
                if !self.pid_namespace {
                    while let Ok(Some(_)) = early.read_signal() {}
                }
                continue;
            }
            // Reap every child that ended: the task, and the orphans the namespace hands to its PID 1.
            use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
            let mut task_ended = None;
            loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(p, c)) if p == task => task_ended = Some(Ended::Exit(c)),
                    Ok(WaitStatus::Signaled(p, s, _)) if p == task => task_ended = Some(Ended::Signal(s as i32)),
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            if let Some(e) = task_ended {
                // Exiting kills whatever is left in the namespace.
                return e;
            }
        }
    }

    /// Drops to the task's user, changes into its directory (with its rights) and starts it with `posix_spawn`,
    /// which gives the child an empty signal mask and default dispositions at its exec (the init keeps its own
    /// blocked; `std::process::Command` would hand the mask on) and, in a namespace, a process group of its own.
    fn spawn_task(&self, env: Option<Vec<(String, String)>>) -> Result<Pid, Ended> {
        use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
        use std::ffi::CString;
        let cstr = |s: &[u8], what: &str| {
            CString::new(s).map_err(|_| refuse(127, format_args!("start {}: a NUL byte in the {what}", self.prog)))
        };
        let env = match (env, &self.env_file) {
            (Some(env), _) => Some(env),
            (None, Some(f)) => Some(
                read_env_file(f)
                    .map_err(|e| refuse(125, format_args!("read the task's environment {}: {e}", f.display())))?,
            ),
            (None, None) => None,
        };
        let env: Vec<CString> = match env {
            Some(env) => env
                .into_iter()
                .map(|(k, v)| cstr(format!("{k}={v}").as_bytes(), "environment"))
                .collect::<Result<_, _>>()?,
            None => std::env::vars()
                .map(|(k, v)| cstr(format!("{k}={v}").as_bytes(), "environment"))
                .collect::<Result<_, _>>()?,
        };
        let prog = cstr(self.prog.as_bytes(), "program")?;
        let mut argv = vec![prog.clone()];
        for a in &self.args {
            argv.push(cstr(a.as_bytes(), "arguments")?);
        }
        if let Some((u, g)) = self.user {
            use nix::unistd::{setgid, setgroups, setuid, Gid, Uid};
            // For good: the init keeps nothing of root's (no supplementary groups either) once the task runs.
            setgroups(&[])
                .and_then(|()| setgid(Gid::from_raw(g)))
                .and_then(|()| setuid(Uid::from_raw(u)))
                .map_err(|e| refuse(125, format_args!("switch to uid {u} gid {g}: {e}")))?;
            // The kernel makes a process that changed its uid non-dumpable, unless `fs.suid_dumpable` says
            // otherwise: said here, so that the task can never read the init's memory (`/proc/1/mem`).
            crate::identity::non_dumpable().map_err(|e| refuse(125, format_args!("{e}")))?;
        }
        if let Some(d) = &self.cwd {
            // After the uid: the directory is resolved with the task's own rights.
            std::env::set_current_dir(d).map_err(|e| {
                refuse(127, format_args!("start {}: working directory {}: {e}", self.prog, d.display()))
            })?;
        }
        let spawn_err = |e: nix::Error| refuse(127, format_args!("start {}: {e}", self.prog));
        let null = std::fs::File::open("/dev/null").map_err(|e| refuse(125, format_args!("open /dev/null: {e}")))?;
        let mut actions = PosixSpawnFileActions::init().map_err(spawn_err)?;
        use std::os::fd::AsRawFd as _;
        actions.add_dup2(null.as_raw_fd(), 0).map_err(spawn_err)?;
        let mut attr = PosixSpawnAttr::init().map_err(spawn_err)?;
        let mut flags = PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF;
        if self.pid_namespace {
            flags |= PosixSpawnFlags::POSIX_SPAWN_SETPGROUP;
            attr.set_pgroup(Pid::from_raw(0)).map_err(spawn_err)?;
        }
        attr.set_flags(flags).map_err(spawn_err)?;
        attr.set_sigmask(&SigSet::empty()).map_err(spawn_err)?;
        // Rust programs ignore SIGPIPE; the task gets the default back, and of everything it could be sent.
        let mut defaults = signal_set(Some(Signal::SIGCHLD));
        defaults.add(Signal::SIGPIPE);
        attr.set_sigdefault(&defaults).map_err(spawn_err)?;
        nix::spawn::posix_spawnp(&prog, &actions, &attr, &argv, &env).map_err(spawn_err)
    }
}

/// Reads what the init says until it closes the socket, looking at the node's lease (`fence`) in between.
fn read_to_end(s: &mut std::os::unix::net::UnixStream, text: &mut String, mut fence: Option<&mut crate::lease::Fence>) {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        if s.set_read_timeout(fence.as_mut().map(|f| f.tick())).is_err() {
            fence = None;
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    text.push_str(&String::from_utf8_lossy(&bytes));
}

/// The host's directories every user may write to (mode 1777) that a task gets a fresh tmpfs on: what one tenant's
/// task leaves in the host's would outlive the job, fill the node's disk and be there for every later task.
pub const PRIVATE_TMP: [&str; 4] = ["/dev/shm", "/tmp", "/var/tmp", "/run/lock"];

/// The init's mounts: its own mount namespace, every mount private (nothing propagates back to the host), a
/// `/proc` of the task's PID namespace, and a System V IPC namespace of its own. `/tmp`, `/dev/shm`, `/var/tmp` and
/// `/run/lock` ([`PRIVATE_TMP`]) are fresh tmpfs (mode 1777, `size=` `tmp_mib` MiB), the task's alone: no other tenant's task sees what it leaves there, and
/// it all goes with the namespace when the task ends (a tmpfs lives as long as its last mount). Their pages are
/// charged to the memory cgroup of the process that writes them, the task's, so its memory limit bounds them too.
///
/// The agent's data directory may lie under one of them (the task's working directory `cwd` is in it): the
/// host's directory directly under it that holds it stays visible at its path (bind-mounted into the private one).
///
/// `/sys/fs/cgroup` shows only the task's own cgroups (`own_cgroups`, their `cgroup.procs` files), see
/// [`own_cgroups_only`].
fn private_mounts(cwd: Option<&Path>, tmp_mib: Option<u64>, own_cgroups: &[PathBuf]) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::CloneFlags;
    nix::sched::unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC)
        .map_err(|e| format!("unshare a mount and IPC namespace: {e}"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| format!("make the mounts private: {e}"))?;
    let safe = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("proc"), "/proc", Some("proc"), safe | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(|e| format!("mount /proc for the task's pid namespace: {e}"))?;
    let opts = match tmp_mib {
        Some(m) => format!("mode=1777,size={}m", m.max(1)),
        None => "mode=1777".to_string(),
    };
    // Each becomes a fresh tmpfs. Where the task's working directory lies under one (the agent's data directory on
    // `/tmp` or `/var/tmp`), the host's directory directly under it that holds the working directory stays visible at
    // its path: reached through a descriptor opened before the private tmpfs hides it, and bind-mounted into it.
    for dir in PRIVATE_TMP {
        let at = Path::new(dir);
        // A link (`/var/tmp` → `/tmp` on some systems) is not mounted over: that would stack a second tmpfs on the
        // private one it names, hiding what was kept there.
        if !std::fs::symlink_metadata(at).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let keep = cwd.and_then(|d| d.strip_prefix(at).ok()).and_then(|r| r.components().next()).map(|c| {
            let name = PathBuf::from(c.as_os_str());
            (std::fs::File::open(at), name)
        });
        mount(Some("tmpfs"), at, Some("tmpfs"), safe, Some(opts.as_str()))
            .map_err(|e| format!("mount the task's {dir}: {e}"))?;
        if let Some((Ok(old), name)) = keep {
            use std::os::fd::AsRawFd as _;
            let from = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd())).join(&name);
            let to = at.join(&name);
            std::fs::create_dir(&to).map_err(|e| format!("keep {}: {e}", to.display()))?;
            mount(Some(&from), &to, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
                .map_err(|e| format!("keep {} in the task's {dir}: {e}", to.display()))?;
        }
    }
    own_cgroups_only(Path::new(CGROUP_ROOT), own_cgroups)
}

/// Where the node's cgroup file systems are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Hides every cgroup but the task's own under `root` (in the task's mount namespace): the host's cgroup tree named
/// every task on the node (`…/job-J-rank-R-attempt-A`, other tenants' job ids), their memory and process counts,
/// and in each `devices.list` the GPU it holds. `root` becomes a small tmpfs holding the links it had at its top
/// (`cpu` → `cpu,cpuacct`) and, at their own paths, the task's cgroup directories bind-mounted, so that what a
/// program reads of its own limits through `/proc/self/cgroup` is where it was. Nothing is done where `root` is not
/// a directory.
fn own_cgroups_only(root: &Path, own: &[PathBuf]) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use std::os::fd::AsRawFd as _;
    if !std::fs::symlink_metadata(root).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    // Reached before the tmpfs hides them: the task's directories (opened) and the top's links.
    let mut keep = Vec::new();
    for procs in own {
        let Some(dir) = procs.parent() else { continue };
        let Ok(rel) = dir.strip_prefix(root) else { continue };
        let f = std::fs::File::open(dir).map_err(|e| format!("open the task's cgroup {}: {e}", dir.display()))?;
        keep.push((f, rel.to_path_buf()));
    }
    let links: Vec<(std::ffi::OsString, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| format!("list {}: {e}", root.display()))?
        .flatten()
        .filter_map(|e| Some((e.file_name(), std::fs::read_link(e.path()).ok()?)))
        .collect();
    let safe = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), root, Some("tmpfs"), safe, Some("mode=0755,size=1m"))
        .map_err(|e| format!("hide the node's cgroups ({}): {e}", root.display()))?;
    for (name, target) in links {
        std::os::unix::fs::symlink(&target, root.join(&name))
            .map_err(|e| format!("keep the link {}: {e}", root.join(&name).display()))?;
    }
    for (f, rel) in keep {
        let to = root.join(&rel);
        std::fs::create_dir_all(&to).map_err(|e| format!("make {}: {e}", to.display()))?;
        let from = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        mount(Some(&from), &to, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| format!("show the task's cgroup {}: {e}", to.display()))?;
    }
    Ok(())
}

/// Whether tasks can run in PID namespaces here: runs `sh -c 'test $$ = 2'` (the task is PID 2, after the init) through `exe task-exec --pid-namespace`. `Err` says why not (e.g. `EPERM` in an unprivileged container).
pub fn check_pid_namespace(exe: &Path) -> Result<(), String> {
    // And its /proc is the namespace's: the caller's pid (above 2 outside a container's init) is not in it.
    let me = std::process::id();
    let script = if me > 2 { format!("test $$ = 2 && test ! -d /proc/{me}") } else { "test $$ = 2".into() };
    let e = Exec { pid_namespace: true, prog: "/bin/sh".into(), args: vec!["-c".into(), script], ..Exec::default() };
    let out = std::process::Command::new(exe)
        .arg("task-exec")
        .args(e.to_args())
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("run {} task-exec: {e}", exe.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().trim_start_matches("gpunet: ").to_string();
    Err(if why.is_empty() { format!("the check task ended with {}", out.status) } else { why })
}

/// `gpunet task-exec …`: runs the wrapper and ends like the task did.
pub fn main(argv: &[String]) -> ! {
    match Exec::parse(argv) {
        Ok(e) => exit_like(e.run()),
        Err(e) => {
            eprintln!("gpunet task-exec: {e}");
            std::process::exit(2);
        }
    }
}

/// Writes a task's environment for [`Exec::env_file`]: `KEY=VALUE` entries separated by NUL, mode 0600 (root's).
pub fn write_env_file(path: &Path, env: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let buf = env_bytes(env);
    // Written aside and renamed over: a wrapper reading the file meanwhile sees the old or the new one, whole.
    let tmp = path.with_extension("env-new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(&buf)?;
    std::fs::rename(&tmp, path)
}

/// A task's environment as the wrapper reads it (an env file's contents, or its standard input with
/// `--env-file -`): `KEY=VALUE` entries separated by NUL; entries that cannot be variables are left out.
pub fn env_bytes(env: &BTreeMap<String, String>) -> Vec<u8> {
    let mut buf = Vec::new();
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            continue;
        }
        buf.extend_from_slice(k.as_bytes());
        buf.push(b'=');
        buf.extend_from_slice(v.as_bytes());
        buf.push(0);
    }
    buf
}

/// The most a task's environment may hold (`--env-file -`).
const ENV_MAX: u64 = 16 << 20;

fn read_env_file(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    Ok(parse_env(&std::fs::read(path)?))
}

fn parse_env(data: &[u8]) -> Vec<(String, String)> {
    data.split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let s = String::from_utf8_lossy(e);
            let (k, v) = s.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// How the task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exit code.
    Exit(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Ended {
    /// The status file's text.
    pub fn to_line(self) -> String {
        match self {
            Ended::Exit(c) => format!("exit {c}\n"),
            Ended::Signal(s) => format!("signal {s}\n"),
        }
    }

    /// Reads a status file's text; `None` when it is empty or not a status.
    pub fn parse(text: &str) -> Option<Ended> {
        let mut it = text.split_whitespace();
        let (kind, n) = (it.next()?, it.next()?.parse().ok()?);
        match kind {
            "exit" => Some(Ended::Exit(n)),
            "signal" => Some(Ended::Signal(n)),
            _ => None,
        }
    }
}

fn write_status(status: &Path, e: Ended) {
    // In the agent's own directory (root's, 0700): made here, 0600, never through a symlink. No fsync: the file only
    // has to outlive the agent process, not the machine (whose crash ends the task too).
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true).mode(0o600).custom_flags(nix::libc::O_NOFOLLOW);
    if let Ok(mut f) = o.open(status) {
        let _ = f.write_all(e.to_line().as_bytes());
    }
}

/// Ends this process the way the task ended: the same exit code, or the same signal.
pub fn exit_like(e: Ended) -> ! {
    if let Ended::Signal(s) = e {
        // The default action of the signal (termination, with a core where that is the default).
        let _ = signal_hook::low_level::emulate_default_handler(s);
        std::process::exit(128 + s);
    }
    match e {
        Ended::Exit(c) => std::process::exit(c),
        Ended::Signal(_) => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    //! Running the wrapper needs the `gpunet` binary (`gpunet task-exec`): see
    //! `crates/gpunet/tests/task_exec.rs`.
    use super::*;

    #[test]
    fn the_command_line_round_trips_and_bad_ones_are_refused() {
        let e = Exec {
            status: Some("/d/running/job-1.status".into()),
            cgroups: vec!["/sys/fs/cgroup/memory/x/cgroup.procs".into()],
            user: Some((200_001, 200_001)),
            env_file: Some("/d/running/job-1.env".into()),
            cwd: Some("/d/homes/job-1/rank-0".into()),
            pid_namespace: true,
            tmp_mib: Some(512),
            lease: Some("/d/lease".into()),
            container: None,
            prog: "sh".into(),
            args: vec!["-c".into(), "--pid-namespace".into()],
        };
        assert_eq!(Exec::parse(&e.to_args()).unwrap(), e, "a program's own arguments stay its own");
        let c = Exec {
            container: Some(crate::container::run::ContainerExec {
                id: "gpunet-job-1-rank-0-attempt-0".into(),
                runtime: "/usr/sbin/runc".into(),
                state: "/d/containers/state".into(),
                bundle: "/d/containers/bundles/gpunet-job-1-rank-0-attempt-0".into(),
                image_dir: "/d/images".into(),
                image_cache: "/d/containers/images".into(),
            }),
            ..e
        };
        assert_eq!(Exec::parse(&c.to_args()).unwrap(), c);
        let mut half = c.to_args();
        let at = half.iter().position(|a| a == "--image-cache").unwrap();
        half.drain(at..at + 2);
        assert!(Exec::parse(&half).is_err(), "a container needs all its parts");
        assert!(Exec::parse(&["--status".into(), "-".into()]).is_err());
        assert!(Exec::parse(&["--bogus".into()]).is_err());
        assert!(Exec::parse(&["--user".into(), "1".into(), "--status".into(), "-".into(), "--".into(), "x".into()])
            .is_err());
    }

    #[test]
    fn the_environment_file_round_trips_and_skips_what_cannot_be_a_variable() {
        let dir = tempfile::tempdir().unwrap();
        let env = dir.path().join("env");
        let vars = BTreeMap::from([
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("ODD".to_string(), "a b=c\nd".to_string()),
            ("BAD=KEY".to_string(), "x".to_string()),
            ("NUL".to_string(), "a\0b".to_string()),
        ]);
        write_env_file(&env, &vars).unwrap();
        let back = read_env_file(&env).unwrap();
        assert_eq!(
            back,
            vec![("ODD".to_string(), "a b=c\nd".to_string()), ("PATH".to_string(), "/usr/bin:/bin".to_string())]
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&env).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn status_lines_parse() {
        for e in [Ended::Exit(3), Ended::Signal(15)] {
            assert_eq!(Ended::parse(&e.to_line()), Some(e));
        }
        assert_eq!(Ended::parse(""), None);
        assert_eq!(Ended::parse("exit x"), None);
        assert_eq!(Ended::parse("r"), None);
    }
}
