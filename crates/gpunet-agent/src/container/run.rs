//! The wrapper's side of a container task (`gpunet task-exec --container ID …`, see [`crate::wrapper`]): it makes
//! the image ready, joins the task's cgroups, mounts the container's root and runs the container as its own child.
//!
//! 0. Before it joins the task's groups, the image: found or unpacked into the node's cache ([`super::images`];
//!    minutes for a first pull, which is why the wrapper does it and not the agent), and the bundle's `plan.json`
//!    completed with the image's command, environment and working directory into the runtime's `config.json`
//!    ([`super::bundle::spec`]). Then, in the groups, with the task's CPU limit lifted while the runtime runs
//!    (`CpuLifted`):
//! 1. In a mount namespace of its own (every mount private), the root: an overlay of the image's root filesystem
//!    (`--lower`, never written) and the bundle's `upper` directory, at the bundle's `rootfs`. The overlay lives in
//!    that namespace only; it goes when the wrapper and the container have ended, and the host never sees it.
//! 2. It becomes a child subreaper, then `RUNTIME run --detach` (spawned with an empty signal mask and default
//!    dispositions, so nothing the wrapper blocks or ignores reaches the container): the container's first process,
//!    orphaned when the runtime exits, becomes the wrapper's child.
//! 3. It forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to that process (the init, which passes them
//!    to the task's process group) — also those that arrived before the container existed, which stayed pending —
//!    and reaps until that process ends: its exit status is the task's, exactly. Once the container runs, it says
//!    so on its standard input (a socket from the agent, which reports the task's start then).
//!
//! The container's runtime state and bundle are removed by the agent once it has read the task's end (OOM included)
//! from the cgroups (`Runtime::remove`).

use super::super::wrapper::{refuse, Ended};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};

/// The container part of the wrapper's command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerExec {
    /// Container id.
    pub id: String,
    /// The OCI runtime.
    pub runtime: PathBuf,
    /// Its state directory.
    pub state: PathBuf,
    /// The bundle (`plan.json`, then `config.json`, `rootfs`, `upper`, `work`).
    pub bundle: PathBuf,
    /// The node's image directory.
    pub image_dir: PathBuf,
    /// The node's image cache.
    pub image_cache: PathBuf,
}

impl ContainerExec {
    /// Its options on the wrapper's command line.
    pub fn to_args(&self, v: &mut Vec<String>) {
        v.push("--container".into());
        v.push(self.id.clone());
        v.push("--runtime".into());
        v.push(self.runtime.display().to_string());
        v.push("--runtime-root".into());
        v.push(self.state.display().to_string());
        v.push("--bundle".into());
        v.push(self.bundle.display().to_string());
        v.push("--image-dir".into());
        v.push(self.image_dir.display().to_string());
        v.push("--image-cache".into());
        v.push(self.image_cache.display().to_string());
    }

    /// Takes option `name` (with `value`) if it is one of its own.
    pub fn take(
        c: &mut Option<ContainerExec>,
        name: &str,
        value: impl FnOnce() -> Result<String, String>,
    ) -> Result<bool, String> {
        let field = match name {
            "--container" | "--runtime" | "--runtime-root" | "--bundle" | "--image-dir" | "--image-cache" => name,
            _ => return Ok(false),
        };
        let v = value()?;
        let c = c.get_or_insert_with(Default::default);
        match field {
            "--container" => c.id = v,
            "--runtime" => c.runtime = v.into(),
            "--runtime-root" => c.state = v.into(),
            "--bundle" => c.bundle = v.into(),
            "--image-dir" => c.image_dir = v.into(),
            _ => c.image_cache = v.into(),
        }
        Ok(true)
    }

    /// Whether every part is there.
    pub fn complete(&self) -> bool {
        !self.id.is_empty()
            && [&self.runtime, &self.state, &self.bundle, &self.image_dir, &self.image_cache]
                .iter()
                .all(|p| !p.as_os_str().is_empty())
    }
}

/// The container's root: a private mount namespace, then the overlay of `lower` (the image's root filesystem).
fn mount_root(c: &ContainerExec, lower: &Path) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare a mount namespace: {e}"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| format!("make the mounts private: {e}"))?;
    let (upper, work, root) = (c.bundle.join("upper"), c.bundle.join("work"), c.bundle.join("rootfs"));
    for d in [&upper, &work, &root] {
        std::fs::create_dir_all(d).map_err(|e| format!("make {}: {e}", d.display()))?;
    }
    if [lower, &upper, &work].iter().any(|p| p.to_string_lossy().contains([',', ':'])) {
        return Err("the image or bundle path holds ',' or ':', which overlay options cannot carry".into());
    }
    let opts = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
    mount(Some("overlay"), &root, Some("overlay"), MsFlags::MS_NODEV, Some(opts.as_str()))
        .map_err(|e| format!("mount the container's root (overlay of {}): {e}", lower.display()))?;
    shared_tmp(&root)
}

/// Makes the image's `/tmp` (when it is a directory) mode 1777 in the container's root, in its upper layer: runc gives
/// the tmpfs it mounts there the mode of the directory beneath, and an image whose `/tmp` is 0755 root's (as a
/// busybox root filesystem's may be) would leave the task no `/tmp` to write to. Opened without following a
/// symlink: an image's `/tmp` that is one is left alone (its target would be resolved on the node).
fn shared_tmp(root: &Path) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags};
    let dir = rustix::fs::open(root, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("open the container's root: {e}"))?;
    match rustix::fs::openat(&dir, "tmp", OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
        Ok(tmp) => rustix::fs::fchmod(&tmp, Mode::from_raw_mode(0o1777)).map_err(|e| format!("chmod /tmp: {e}")),
        // None (runc makes it, and the tmpfs keeps its mode=1777), or not a directory: left as it is.
        Err(_) => Ok(()),
    }
}

/// Mounts each host path the job named at its staged place in the bundle (in the wrapper's private mount namespace),
/// from a descriptor opened beneath its allowed directory (`RESOLVE_BENEATH`) with no symlink followed in any
/// component: the agent checked the path (resolved) against `--allow-host-path`, and a component a job swapped for a
/// symlink since then makes the open fail instead of moving the mount elsewhere. A plain bind, not a recursive one:
/// mounts beneath the directory stay out. The runtime binds the container's mount from the staged one.
fn stage_host_paths(c: &ContainerExec, plan: &super::bundle::Plan) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let confined = plan.binds.iter().enumerate().filter_map(|(i, b)| b.beneath.as_ref().map(|root| (i, b, root)));
    for (i, b, root) in confined {
        let no_links = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let base = rustix::fs::openat2(
            rustix::fs::CWD,
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            no_links,
        )
        .map_err(|e| format!("open the allowed host path {}: {e}", root.display()))?;
        let rel =
            b.host.strip_prefix(root).map_err(|_| format!("{} is not beneath {}", b.host.display(), root.display()))?;
        let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        let fd = rustix::fs::openat2(
            &base,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            no_links | ResolveFlags::BENEATH,
        )
        .map_err(|e| {
            format!("open host path {} beneath {} without following a symlink: {e}", b.host.display(), root.display())
        })?;
        let at = super::bundle::staged(&c.bundle, i);
        std::fs::create_dir_all(at.parent().expect("a parent")).map_err(|e| format!("make {}: {e}", at.display()))?;
        let is_dir = rustix::fs::fstat(&fd).map(|st| st.st_mode & 0o170000 == 0o040000).unwrap_or(false);
        let made = if is_dir { std::fs::create_dir(&at) } else { std::fs::write(&at, b"") };
        made.map_err(|e| format!("make {}: {e}", at.display()))?;
        use std::os::fd::AsRawFd as _;
        let from = format!("/proc/self/fd/{}", fd.as_raw_fd());
        mount(Some(from.as_str()), &at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| format!("mount host path {}: {e}", b.host.display()))?;
    }
    Ok(())
}

/// Gives the task's log (the wrapper's standard output and error) back to whom it belonged: the runtime makes a
/// container's standard streams its user's, which would let the task change its log's mode and rewrite it through
/// `/proc/self/fd/1` (a process task's log is root's, readable by its group).
struct LogOwner(Vec<(std::os::fd::OwnedFd, rustix::fs::Stat)>);

impl LogOwner {
    fn save() -> LogOwner {
        use std::os::fd::AsFd as _;
        let fds = [std::io::stdout().as_fd().try_clone_to_owned(), std::io::stderr().as_fd().try_clone_to_owned()];
        LogOwner(
            fds.into_iter()
                .flatten()
                .filter_map(|f| rustix::fs::fstat(&f).ok().map(|st| (f, st)))
                .filter(|(_, st)| st.st_mode & 0o170000 == 0o100000)
                .collect(),
        )
    }

    fn restore(&self) {
        for (f, st) in &self.0 {
            let owner = (Some(rustix::fs::Uid::from_raw(st.st_uid)), Some(rustix::fs::Gid::from_raw(st.st_gid)));
            if let Err(e) = rustix::fs::fchown(f, owner.0, owner.1)
                .and_then(|()| rustix::fs::fchmod(f, rustix::fs::Mode::from_raw_mode(st.st_mode & 0o7777)))
            {
                eprintln!("gpunet: give the log back to root: {e}");
            }
        }
    }
}

/// Spawns `prog args` with an empty signal mask and default dispositions; returns its pid.
fn spawn_clean(prog: &Path, args: &[&str]) -> Result<Pid, String> {
    use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
    use std::ffi::CString;
    let err = |e: nix::Error| format!("start {}: {e}", prog.display());
    let p = CString::new(prog.as_os_str().as_encoded_bytes()).map_err(|_| "a NUL in the runtime's path".to_string())?;
    let mut argv = vec![p.clone()];
    for a in args {
        argv.push(CString::new(*a).map_err(|_| "a NUL in an argument".to_string())?);
    }
    let env = [CString::new(format!("PATH={}", crate::launcher::DEFAULT_TASK_PATH)).expect("no NUL")];
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("open /dev/null: {e}"))?;
    let mut actions = PosixSpawnFileActions::init().map_err(err)?;
    use std::os::fd::AsRawFd as _;
    actions.add_dup2(null.as_raw_fd(), 0).map_err(err)?;
    let mut attr = PosixSpawnAttr::init().map_err(err)?;
    attr.set_flags(PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF).map_err(err)?;
    attr.set_sigmask(&SigSet::empty()).map_err(err)?;
    let mut defaults = SigSet::empty();
    for s in super::super::wrapper::FORWARDED.iter().copied().chain([Signal::SIGCHLD, Signal::SIGPIPE]) {
        defaults.add(s);
    }
    attr.set_sigdefault(&defaults).map_err(err)?;
    nix::spawn::posix_spawn(p.as_c_str(), &actions, &attr, &argv, &env).map_err(err)
}

/// Runs `RUNTIME --root STATE args…` to its end; `Err` with what went wrong (its own errors are in the log).
fn runtime(c: &ContainerExec, args: &[&str]) -> Result<(), String> {
    let state = c.state.display().to_string();
    let mut all = vec!["--root", state.as_str()];
    all.extend_from_slice(args);
    let pid = spawn_clean(&c.runtime, &all)?;
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, 0)) => return Ok(()),
            Ok(WaitStatus::Exited(_, n)) => return Err(format!("{} {} exited with {n}", c.runtime.display(), args[0])),
            Ok(WaitStatus::Signaled(_, s, _)) => {
                return Err(format!("{} {} was killed by {s}", c.runtime.display(), args[0]))
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("wait for {}: {e}", c.runtime.display())),
        }
    }
}

/// The task's CPU limit, lifted while the runtime makes the container: the wrapper runs the runtime inside the
/// task's groups (so that the container is made beneath them), and a job of 100 millicores would otherwise give
/// `runc create` a tenth of a core (it took 300 ms instead of 30). Restored when dropped, before the task's own
/// code runs for more than the moment between `runc start` and the restore.
struct CpuLifted(Vec<(PathBuf, String)>);

impl CpuLifted {
    /// Lifts the quota of every group among `procs` (its `cgroup.procs` files) that has one.
    fn lift(procs: &[PathBuf]) -> CpuLifted {
        let mut saved = Vec::new();
        for dir in procs.iter().filter_map(|p| p.parent()) {
            for (file, unlimited) in [("cpu.cfs_quota_us", "-1"), ("cpu.max", "max")] {
                let f = dir.join(file);
                if let Ok(old) = std::fs::read_to_string(&f) {
                    if std::fs::write(&f, unlimited).is_ok() {
                        saved.push((f, old.trim().to_string()));
                    }
                }
            }
        }
        CpuLifted(saved)
    }
}

impl Drop for CpuLifted {
    fn drop(&mut self) {
        for (f, old) in &self.0 {
            if let Err(e) = std::fs::write(f, old) {
                eprintln!("gpunet: restore the task's CPU limit {}: {e}", f.display());
            }
        }
    }
}

/// Step 0 (see the module's doc): the image, found or unpacked, and the runtime's configuration written. Called
/// before the wrapper joins the task's groups: an unpack is the node's work, not charged to the task's CPU and
/// memory limits (a 64 MiB task could not unpack a 10 GB image).
pub fn prepare(c: &ContainerExec) -> Result<(super::bundle::Plan, super::images::Prepared), Ended> {
    let prepared = super::bundle::read_plan(&c.bundle).and_then(|plan| {
        let images = super::images::Images::new(c.image_dir.clone(), c.image_cache.clone())?;
        let image = images.prepare(&plan.image)?;
        let spec = super::bundle::spec(&plan, &image.defaults)?;
        super::bundle::write(&c.bundle, "config.json", &spec)?;
        Ok((plan, image))
    });
    prepared.map_err(|e| refuse(127, format_args!("container {}: {e}", c.id)))
}

/// Runs the container of `image` (see the module's doc) and says how its first process ended. Called with the
/// forwarded signals blocked (they stay pending until the container exists), in the task's groups (their
/// `cgroup.procs` files: `procs`).
pub fn run(
    c: &ContainerExec,
    (plan, image): &(super::bundle::Plan, super::images::Prepared),
    procs: &[PathBuf],
    lease: Option<&Path>,
) -> Ended {
    let mut set = SigSet::empty();
    for s in super::super::wrapper::FORWARDED.iter().copied().chain([Signal::SIGCHLD]) {
        set.add(s);
    }
    if let Err(e) = set.thread_block() {
        return refuse(125, format_args!("block signals: {e}"));
    }
    if let Err(e) = mount_root(c, &image.rootfs).and_then(|()| stage_host_paths(c, plan)) {
        return refuse(125, format_args!("container {}: {e}", c.id));
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        return refuse(125, format_args!("become a child subreaper: {e}"));
    }
    let lifted = CpuLifted::lift(procs);
    let bundle = c.bundle.display().to_string();
    let pid_file = c.bundle.join("init.pid");
    let pid_path = pid_file.display().to_string();
    // `run --detach`: create and start in one runtime process (each is a Go program's start, the most of what a
    // container start costs).
    let log = LogOwner::save();
    let ran = runtime(c, &["run", "--detach", "--bundle", &bundle, "--pid-file", &pid_path, &c.id]);
    log.restore();
    if let Err(e) = ran {
        return refuse(127, format_args!("could not start container {}: {e}", c.id));
    }
    let init = match std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
        Some(p) if p > 1 => Pid::from_raw(p),
        _ => return refuse(127, format_args!("container {}: no pid of its first process", c.id)),
    };
    drop(lifted);
    // The node's lease is looked at between signals (see `crate::lease`): its SIGTERM to our group is one of them,
    // passed on below like any other.
    // (The container's first process is PID 1 of its own namespace.)
    let mut fence = lease.map(|l| crate::lease::Fence::new(l.to_path_buf(), init, procs.to_vec(), true));
    // The signals blocked above, read through a descriptor (those already pending too), waited for with a timeout.
    let signals = match nix::sys::signalfd::SignalFd::with_flags(
        &set,
        nix::sys::signalfd::SfdFlags::SFD_NONBLOCK | nix::sys::signalfd::SfdFlags::SFD_CLOEXEC,
    ) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = kill(init, Signal::SIGKILL);
            return refuse(125, format_args!("container {}: read signals: {e}", c.id));
        }
    };
    // The agent learns that the container runs (when its standard input is the agent's socket; ignored otherwise).
    {
        use std::io::Write as _;
        use std::os::fd::AsFd as _;
        if let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() {
            let mut s = std::fs::File::from(fd);
            let _ = s.write_all(b"s");
        }
    }
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    loop {
        // Reap first: the container may have ended before we wait (its SIGCHLD is pending, and seen again below).
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, code)) if p == init => return Ended::Exit(code),
                Ok(WaitStatus::Signaled(p, s, _)) if p == init => return Ended::Signal(s as i32),
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let timeout = fence.as_mut().map(|f| f.tick()).and_then(|d| rustix::event::Timespec::try_from(d).ok());
        let mut fds = [rustix::event::PollFd::new(&signals, rustix::event::PollFlags::IN)];
        let _ = rustix::event::poll(&mut fds, timeout.as_ref());
        while let Ok(Some(si)) = signals.read_signal() {
            match Signal::try_from(si.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) | Err(_) => {}
                // The init is our child and not yet reaped: its pid is still its own.
                Ok(sig) => {
                    if sig == Signal::SIGTERM {
                        if let Some(f) = fence.as_mut() {
                            f.asked_to_stop();
                        }
                    }
                    let _ = kill(init, sig);
                }
            }
        }
    }
}
