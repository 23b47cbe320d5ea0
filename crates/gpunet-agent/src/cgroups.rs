//! CPU and memory limits through cgroups: v2 where the unified hierarchy has the controllers, else v1 (the memory
//! and cpu hierarchies, and the freezer), else none. Each task attempt gets its own group; the OOM killer's verdict
//! is read back from it when the task ends, and at the end of the attempt every process still in it is killed
//! ([`TaskCgroup::kill_all`]: v2 `cgroup.kill`; v1 freeze, SIGKILL each, thaw, until empty), so nothing a job starts
//! (`setsid`, double forks, probes) outlives it. The task joins its groups as root (the wrapper, before it drops to
//! the task's user), so the groups' files stay root's and a job cannot leave its group.

use std::io;
use std::path::{Path, PathBuf};

/// The default of the most processes and threads one task attempt may have at once (`pids.max`, where the pids
/// controller is there; the agent's `--task-pids-max`): a fork bomb stops at it (its `fork` fails with `EAGAIN`)
/// instead of filling the node's process table.
pub const TASK_PIDS_MAX: u64 = 4096;

/// What isolation this machine offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// The unified hierarchy; `base` is where task groups are made.
    V2 {
        /// Parent of the task groups.
        base: PathBuf,
        /// Controllers enabled for them.
        controllers: Vec<String>,
        /// Whether device filters ([`crate::devfilter`], eBPF) can be attached: a task then opens only the devices
        /// it was given, as with v1's devices hierarchy.
        devices: bool,
    },
    /// v1 hierarchies.
    V1 {
        /// Parent of task groups in the memory hierarchy.
        memory: Option<PathBuf>,
        /// Parent of task groups in the cpu hierarchy.
        cpu: Option<PathBuf>,
        /// Parent of task groups in the freezer hierarchy (stops a group so that all of it can be killed).
        freezer: Option<PathBuf>,
        /// Parent of task groups in the devices hierarchy (a task opens only the devices it was given).
        devices: Option<PathBuf>,
        /// Parent of task groups in the pids hierarchy (a task has at most `pids_max` processes, [`TASK_PIDS_MAX`] by default).
        pids: Option<PathBuf>,
    },
    /// No usable cgroups: tasks run without limits.
    None,
}

/// One task's groups.
#[derive(Debug, Clone)]
pub struct TaskCgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` files the task must join.
    pub procs: Vec<PathBuf>,
    oom: Option<(PathBuf, bool)>,
    /// v1 with `oom_kill_disable` set: a task at its memory limit is held (not killed by the kernel) and the agent
    /// kills it and reports the OOM (see [`TaskCgroup::under_oom`]).
    held: bool,
    /// v1 freezer group.
    freezer: Option<PathBuf>,
    /// v2: the group has `cgroup.kill`.
    v2: bool,
}

fn own_path(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = if controller.is_empty() { ctrls.is_empty() } else { ctrls.split(',').any(|c| c == controller) };
        hit.then(|| path.to_string())
    })
}

fn writable_dir(p: &Path) -> bool {
    std::fs::create_dir_all(p).is_ok() && std::fs::metadata(p).is_ok_and(|m| !m.permissions().readonly())
}

impl Cgroups {
    /// Detects what the machine offers under `root` (normally `/sys/fs/cgroup`); `tag` names this agent's parent group.
    pub fn detect(root: &Path, tag: &str) -> Cgroups {
        // v2: a unified hierarchy at the root with controllers that can be delegated to children.
        if let Ok(ctrls) = std::fs::read_to_string(root.join("cgroup.controllers")) {
            let own = own_path("").unwrap_or_else(|| "/".into());
            let base = root.join(own.trim_start_matches('/')).join(tag);
            let wanted: Vec<String> =
                ctrls.split_whitespace().filter(|c| ["memory", "cpu", "pids"].contains(c)).map(String::from).collect();
            if wanted.iter().any(|c| c != "pids") && writable_dir(&base) {
                let enable = wanted.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
                if std::fs::write(base.join("cgroup.subtree_control"), enable).is_ok() {
                    return Cgroups::V2 { base, controllers: wanted, devices: crate::devfilter::available() };
                }
            }
        }
        let v1 = |ctrl: &str| -> Option<PathBuf> {
            let mount = root.join(ctrl);
            if !mount.join("cgroup.procs").exists() {
                return None;
            }
            let own = own_path(ctrl).unwrap_or_else(|| "/".into());
            let base = mount.join(own.trim_start_matches('/')).join(tag);
            writable_dir(&base).then_some(base)
        };
        let (memory, cpu) = (v1("memory"), v1("cpu"));
        if memory.is_some() || cpu.is_some() {
            return Cgroups::V1 { memory, cpu, freezer: v1("freezer"), devices: v1("devices"), pids: v1("pids") };
        }
        Cgroups::None
    }

    /// For the node's status, e.g. `cgroup-v1: memory, cpu`.
    pub fn describe(&self) -> String {
        match self {
            Cgroups::V2 { controllers, devices, .. } => {
                let mut v: Vec<&str> = controllers.iter().map(String::as_str).collect();
                if *devices {
                    v.push("devices");
                }
                format!("cgroup-v2: {}", v.join(", "))
            }
            Cgroups::V1 { memory, cpu, freezer, devices, pids } => {
                let mut v = Vec::new();
                if memory.is_some() {
                    v.push("memory");
                }
                if cpu.is_some() {
                    v.push("cpu");
                }
                if freezer.is_some() {
                    v.push("freezer");
                }
                if devices.is_some() {
                    v.push("devices");
                }
                if pids.is_some() {
                    v.push("pids");
                }
                format!("cgroup-v1: {}", v.join(", "))
            }
            Cgroups::None => "none".into(),
        }
    }

    /// Makes the groups of one task with its limits. `devices`: the v1 device rules (`c MAJOR:MINOR rwm`) the task
    /// may use, all others denied (see [`device_rules`]); `None` leaves devices alone. On cgroup v2 the same rules
    /// become an eBPF device filter ([`crate::devfilter`]) attached to the group before any process joins it.
    pub fn create(
        &self,
        name: &str,
        memory_mib: u64,
        cpu_milli: u64,
        pids_max: u64,
        devices: Option<&[String]>,
    ) -> io::Result<Option<TaskCgroup>> {
        let bytes = memory_mib.max(4) * 1024 * 1024;
        // CFS: quota per 100 ms period; 1000 millicores = one full period.
        let quota = (cpu_milli.max(10) * 100).to_string();
        match self {
            Cgroups::None => Ok(None),
            Cgroups::V2 { base, controllers, devices: filters } => {
                let d = base.join(name);
                std::fs::create_dir_all(&d)?;
                if let (true, Some(rules)) = (*filters, devices) {
                    let rules = rules
                        .iter()
                        .map(|r| crate::devfilter::Rule::parse(r))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    crate::devfilter::attach(&d, &rules)?;
                }
                if controllers.iter().any(|c| c == "memory") {
                    std::fs::write(d.join("memory.max"), bytes.to_string())?;
                    let _ = std::fs::write(d.join("memory.swap.max"), "0");
                }
                if controllers.iter().any(|c| c == "cpu") {
                    std::fs::write(d.join("cpu.max"), format!("{quota} 100000"))?;
                }
                if controllers.iter().any(|c| c == "pids") {
                    std::fs::write(d.join("pids.max"), pids_max.max(1).to_string())?;
                }
                Ok(Some(TaskCgroup::v2(d)))
            }
            Cgroups::V1 { memory, cpu, freezer, devices: dev_parent, pids } => {
                let mut t = TaskCgroup::empty();
                if let (Some(p), Some(rules)) = (dev_parent, devices) {
                    let d = p.join(name);
                    std::fs::create_dir_all(&d)?;
                    // Deny everything, then allow the task's own; written before any process joins.
                    std::fs::write(d.join("devices.deny"), "a")?;
                    for r in rules {
                        std::fs::write(d.join("devices.allow"), r)?;
                    }
                    t.procs.push(d.join("cgroup.procs"));
                    t.dirs.push(d);
                }
                if let Some(f) = freezer {
                    let d = f.join(name);
                    std::fs::create_dir_all(&d)?;
                    t.procs.push(d.join("cgroup.procs"));
                    t.freezer = Some(d.clone());
                    t.dirs.push(d);
                }
                if let Some(m) = memory {
                    let d = m.join(name);
                    std::fs::create_dir_all(&d)?;
                    std::fs::write(d.join("memory.limit_in_bytes"), bytes.to_string())?;
                    let _ = std::fs::write(d.join("memory.memsw.limit_in_bytes"), bytes.to_string());
                    // The agent, not the kernel's OOM killer, ends a task at its limit: the end is then certain to be
                    // reported as OOM, and no kernel OOM kill is logged for the machine.
                    t.held = std::fs::write(d.join("memory.oom_control"), "1").is_ok();
                    t.procs.push(d.join("cgroup.procs"));
                    t.oom = Some((d.join("memory.oom_control"), false));
                    t.dirs.push(d);
                }
                if let Some(c) = cpu {
                    let d = c.join(name);
                    std::fs::create_dir_all(&d)?;
                    std::fs::write(d.join("cpu.cfs_period_us"), "100000")?;
                    std::fs::write(d.join("cpu.cfs_quota_us"), &quota)?;
                    t.procs.push(d.join("cgroup.procs"));
                    t.dirs.push(d);
                }
                if let Some(p) = pids {
                    let d = p.join(name);
                    std::fs::create_dir_all(&d)?;
                    std::fs::write(d.join("pids.max"), pids_max.max(1).to_string())?;
                    t.procs.push(d.join("cgroup.procs"));
                    t.dirs.push(d);
                }
                Ok(Some(t))
            }
        }
    }
}

impl Cgroups {
    /// Removes this agent's parent groups (at shutdown, once its tasks are gone; a group still in use stays).
    pub fn remove_parents(&self) {
        let dirs: Vec<&PathBuf> = match self {
            Cgroups::V2 { base, .. } => vec![base],
            Cgroups::V1 { memory, cpu, freezer, devices, pids } => {
                [memory, cpu, freezer, devices, pids].into_iter().flatten().collect()
            }
            Cgroups::None => Vec::new(),
        };
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
    }

    /// The groups of a task made earlier (by a previous run of the agent), if they are there.
    pub fn open(&self, name: &str) -> Option<TaskCgroup> {
        match self {
            Cgroups::None => None,
            Cgroups::V2 { base, .. } => {
                let d = base.join(name);
                d.is_dir().then(|| TaskCgroup::v2(d))
            }
            Cgroups::V1 { memory, cpu, freezer, devices, pids } => {
                let mut t = TaskCgroup::empty();
                if let Some(d) = devices.as_ref().map(|p| p.join(name)).filter(|d| d.is_dir()) {
                    t.procs.push(d.join("cgroup.procs"));
                    t.dirs.push(d);
                }
                if let Some(d) = freezer.as_ref().map(|f| f.join(name)).filter(|d| d.is_dir()) {
                    t.procs.push(d.join("cgroup.procs"));
                    t.freezer = Some(d.clone());
                    t.dirs.push(d);
                }
                if let Some(d) = memory.as_ref().map(|m| m.join(name)).filter(|d| d.is_dir()) {
                    t.procs.push(d.join("cgroup.procs"));
                    t.held = std::fs::read_to_string(d.join("memory.oom_control"))
                        .is_ok_and(|c| c.lines().any(|l| l.trim() == "oom_kill_disable 1"));
                    t.oom = Some((d.join("memory.oom_control"), false));
                    t.dirs.push(d);
                }
                if let Some(d) = cpu.as_ref().map(|c| c.join(name)).filter(|d| d.is_dir()) {
                    t.procs.push(d.join("cgroup.procs"));
                    t.dirs.push(d);
                }
                if let Some(d) = pids.as_ref().map(|c| c.join(name)).filter(|d| d.is_dir()) {
                    t.procs.push(d.join("cgroup.procs"));
                    t.dirs.push(d);
                }
                (!t.dirs.is_empty()).then_some(t)
            }
        }
    }
}

/// The device rules of a task given GPUs `gpus`, for a v1 devices group: its own `/dev/nvidiaN` and the driver's
/// control devices (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`; their numbers read from
/// `dev_dir`, normally `/dev`, with the driver's fixed numbers where absent), the usual `null`, `zero`, `full`,
/// `random`, `urandom`, `tty`, `ptmx` and pseudo-terminals, and InfiniBand verbs (major 231, for NCCL over RDMA).
/// Other GPUs, disks and everything else are denied.
pub fn device_rules(dev_dir: &Path, gpus: &[u32]) -> Vec<String> {
    let number = |p: &Path| -> Option<(u32, u32)> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::metadata(p).ok().filter(|m| m.file_type().is_char_device())?;
        Some((rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev())))
    };
    let mut v: Vec<String> = ["1:3", "1:5", "1:7", "1:8", "1:9", "5:0", "5:2", "136:*", "231:*"]
        .iter()
        .map(|d| format!("c {d} rwm"))
        .collect();
    for g in gpus {
        let (ma, mi) = number(&dev_dir.join(format!("nvidia{g}"))).unwrap_or((195, *g));
        v.push(format!("c {ma}:{mi} rwm"));
    }
    for (name, fixed) in [
        ("nvidiactl", Some((195, 255))),
        ("nvidia-modeset", Some((195, 254))),
        ("nvidia-uvm", None),
        ("nvidia-uvm-tools", None),
    ] {
        if let Some((ma, mi)) = number(&dev_dir.join(name)).or(fixed) {
            v.push(format!("c {ma}:{mi} rwm"));
        }
    }
    v
}

impl TaskCgroup {
    /// A v2 group: one directory for every controller.
    fn v2(d: PathBuf) -> TaskCgroup {
        TaskCgroup {
            procs: vec![d.join("cgroup.procs")],
            oom: Some((d.join("memory.events"), true)),
            v2: d.join("cgroup.kill").exists(),
            dirs: vec![d],
            held: false,
            freezer: None,
        }
    }

    fn empty() -> TaskCgroup {
        TaskCgroup { dirs: Vec::new(), procs: Vec::new(), oom: None, held: false, freezer: None, v2: false }
    }

    /// Processes in the group now, its child groups included (a container task's runtime makes one beneath it).
    pub fn pids(&self) -> Vec<i32> {
        pids_in(&self.procs)
    }

    /// Kills every process in the group and waits (up to about five seconds) until it is empty; returns how many
    /// processes were killed. v2: `cgroup.kill`. v1 with the freezer: the group is frozen first, so no process can
    /// fork or exit (and so free its id for reuse) between the read of `cgroup.procs` and the signal; then each gets
    /// SIGKILL and the group thaws. Without either, `cgroup.procs` is read and killed repeatedly until empty.
    /// Blocking: call it off the async threads.
    pub fn kill_all(&self) -> usize {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let mut killed = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let pids = self.pids();
            if pids.is_empty() || std::time::Instant::now() > deadline {
                return killed;
            }
            if self.v2 {
                let _ = std::fs::write(self.dirs[0].join("cgroup.kill"), "1");
                killed += pids.len();
            } else if let Some(f) = &self.freezer {
                let state = f.join("freezer.state");
                let _ = std::fs::write(&state, "FROZEN");
                let frozen_by = std::time::Instant::now() + std::time::Duration::from_millis(500);
                while std::fs::read_to_string(&state).is_ok_and(|s| s.trim() != "FROZEN")
                    && std::time::Instant::now() < frozen_by
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                for p in self.pids() {
                    killed += usize::from(kill(Pid::from_raw(p), Signal::SIGKILL).is_ok());
                }
                let _ = std::fs::write(&state, "THAWED");
            } else {
                for p in pids {
                    killed += usize::from(kill(Pid::from_raw(p), Signal::SIGKILL).is_ok());
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Whether tasks at the memory limit are held for the agent to kill (v1 `oom_kill_disable`).
    pub fn holds_at_limit(&self) -> bool {
        self.held
    }

    /// Whether the group is at its memory limit with the kernel's OOM killer held back (v1 `under_oom 1`).
    pub fn under_oom(&self) -> bool {
        let Some((file, false)) = &self.oom else { return false };
        std::fs::read_to_string(file).is_ok_and(|c| c.lines().any(|l| l.trim() == "under_oom 1"))
    }

    /// Whether the OOM killer killed something in the group.
    pub fn oom_killed(&self) -> bool {
        let Some((file, _v2)) = &self.oom else { return false };
        let text = std::fs::read_to_string(file).unwrap_or_default();
        text.lines().any(|l| {
            let mut it = l.split_whitespace();
            it.next() == Some("oom_kill") && it.next().and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n > 0)
        }) || {
            // Older v1 kernels have no oom_kill counter: a hit limit shows in the fail count.
            let failcnt = file.with_file_name("memory.failcnt");
            std::fs::read_to_string(failcnt).ok().and_then(|s| s.trim().parse::<u64>().ok()).is_some_and(|n| n > 0)
                && !text.contains("oom_kill ")
        }
    }

    /// Removes the groups, child groups first (after the task's processes are gone).
    pub fn remove(&self) {
        for d in &self.dirs {
            for sub in descendants(d).into_iter().rev() {
                let _ = std::fs::remove_dir(sub);
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The processes (above 1, sorted, once each) listed in the `cgroup.procs` files `procs` and in those of the groups
/// beneath them.
pub(crate) fn pids_in(procs: &[PathBuf]) -> Vec<i32> {
    let mut files = procs.to_vec();
    for f in procs {
        if let Some(d) = f.parent() {
            files.extend(descendants(d).into_iter().map(|sub| sub.join("cgroup.procs")));
        }
    }
    let mut v: Vec<i32> = files
        .iter()
        .flat_map(|f| std::fs::read_to_string(f).unwrap_or_default().lines().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|l| l.trim().parse().ok())
        .filter(|p| *p > 1)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The child groups beneath `dir`, parents before their children (symlinks are not followed; cgroupfs has none).
fn descendants(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
                todo.push(e.path());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_hierarchies_are_detected_and_limits_written() {
        let root = std::env::temp_dir().join(format!("gpunet-cg-{}", std::process::id()));
        for c in ["memory", "cpu"] {
            std::fs::create_dir_all(root.join(c)).unwrap();
            std::fs::write(root.join(c).join("cgroup.procs"), "").unwrap();
        }
        let cg = Cgroups::detect(&root, "gpunet-test");
        match &cg {
            Cgroups::V1 { memory: Some(_), cpu: Some(_), freezer: None, devices: None, pids: None } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(cg.describe(), "cgroup-v1: memory, cpu");
        let t = cg.create("job-1-rank-0-attempt-0", 512, 1500, TASK_PIDS_MAX, None).unwrap().unwrap();
        assert_eq!(t.procs.len(), 2);
        let mem = t.procs[0].with_file_name("memory.limit_in_bytes");
        assert_eq!(std::fs::read_to_string(mem).unwrap(), (512u64 * 1024 * 1024).to_string());
        let quota = t.procs[1].with_file_name("cpu.cfs_quota_us");
        assert_eq!(std::fs::read_to_string(quota).unwrap(), "150000");
        std::fs::write(
            t.procs[0].with_file_name("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        assert!(t.oom_killed());
        assert!(t.holds_at_limit(), "oom_kill_disable was written");
        assert!(!t.under_oom());
        std::fs::write(t.procs[0].with_file_name("memory.oom_control"), "oom_kill_disable 1\nunder_oom 1\n").unwrap();
        assert!(t.under_oom());
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(Cgroups::detect(Path::new("/nonexistent-cgroup-root"), "x"), Cgroups::None);
    }

    /// Where a cgroup v2 hierarchy is mounted (the whole tree on a v2 host, `/sys/fs/cgroup/unified` on a hybrid one).
    fn cgroup2_mount() -> Option<PathBuf> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        info.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let at = pre.split_whitespace().nth(4)?;
            (post.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(at))
        })
    }

    /// cgroup v2: the task group's eBPF filter lets a process open its own GPU's device node and `/dev/null`, and
    /// refuses another GPU's with EPERM (fake device nodes with the NVIDIA major: an allowed open reaches the missing
    /// driver and fails with ENXIO instead).
    #[test]
    fn on_cgroup_v2_a_task_opens_only_its_own_gpu() {
        let Some(mount) = cgroup2_mount().filter(|_| crate::running_as_root() && crate::devfilter::available()) else {
            eprintln!("skipped: needs root, a cgroup2 mount and bpf(2)");
            return;
        };
        let dev = tempfile::tempdir().unwrap();
        for (name, minor) in [("nvidia0", 0), ("nvidia1", 1)] {
            nix::sys::stat::mknod(
                &dev.path().join(name),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(195, minor),
            )
            .unwrap();
        }
        let base = mount.join(format!("gpunet-devfilter-test-{}", std::process::id()));
        let cg = Cgroups::V2 { base: base.clone(), controllers: Vec::new(), devices: true };
        let rules = device_rules(dev.path(), &[0]);
        let t = cg.create("job-1-rank-0-attempt-0", 64, 1000, TASK_PIDS_MAX, Some(&rules)).unwrap().unwrap();
        let script = format!(
            "echo $$ > {procs} || exit 9; for d in /dev/null {dev}/nvidia0 {dev}/nvidia1; do \
             if cat $d >/dev/null 2>&1; then echo \"$d ok\"; else cat $d 2>&1 >/dev/null | sed \"s|^|$d |\"; fi; done",
            procs = t.procs[0].display(),
            dev = dev.path().display()
        );
        let out = std::process::Command::new("/bin/sh").arg("-c").arg(&script).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        t.remove();
        let _ = std::fs::remove_dir(&base);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("/dev/null ok"), "{text}");
        let line = |n: &str| text.lines().find(|l| l.contains(n)).unwrap_or_default().to_string();
        assert!(line("nvidia0").contains("No such device"), "its own GPU reaches the (missing) driver: {text}");
        assert!(line("nvidia1").contains("Operation not permitted"), "another GPU is refused: {text}");
    }
}
