//! A container task's OCI runtime configuration (`config.json` of its bundle), generated with the `oci-spec` crate
//! from the runtime's defaults (namespaces, masked and read-only paths), then narrowed: see [`spec`].

use gpunet_api::image::Network;
use oci_spec::runtime::{
    LinuxBuilder, LinuxCapabilitiesBuilder, LinuxDeviceBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder,
    PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the init is bind-mounted in every container.
pub const INIT_PATH: &str = "/.gpunet/init";

/// A device node the container gets: its path there and its numbers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Device {
    /// Path in the container (`/dev/nvidia0`).
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// The node's GPU device nodes of a task given `gpus`: its own `/dev/nvidiaN` and the driver's control devices, as
/// far as they exist in `dev_dir` (`/dev`, or a directory of fake nodes in tests).
pub fn gpu_devices(dev_dir: &Path, gpus: &[u32]) -> Vec<Device> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let mut names: Vec<String> = gpus.iter().map(|g| format!("nvidia{g}")).collect();
    if !gpus.is_empty() {
        names.extend(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"].map(String::from));
    }
    names
        .into_iter()
        .filter_map(|n| {
            let m = std::fs::metadata(dev_dir.join(&n)).ok().filter(|m| m.file_type().is_char_device())?;
            Some(Device {
                path: format!("/dev/{n}"),
                major: rustix::fs::major(m.rdev()),
                minor: rustix::fs::minor(m.rdev()),
            })
        })
        .collect()
}

/// A directory bind-mounted into the container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bind {
    /// On the node.
    pub host: PathBuf,
    /// In the container.
    pub path: String,
    /// Read-only.
    pub read_only: bool,
    /// For a node directory the job named (`host_path`), the allowed directory (`--allow-host-path`) it lies
    /// beneath: the wrapper opens the path from that directory with no symlink followed and no way above it, and
    /// mounts it from that descriptor (see [`staged`]), so a path changed after the agent's check (a component
    /// swapped for a symlink by a job that can write there) cannot move the mount anywhere else.
    #[serde(default)]
    pub beneath: Option<PathBuf>,
}

/// Where the wrapper mounts confined bind `i` (from its descriptor) for the runtime to bind from: in the bundle,
/// root's alone.
pub fn staged(bundle: &Path, i: usize) -> PathBuf {
    bundle.join("binds").join(i.to_string())
}

/// Everything a container task's configuration says but what its image adds: the agent writes it to the bundle
/// (`plan.json`, root's alone) and the wrapper completes it once the image is there ([`spec`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// The task (the container's annotations).
    pub task: gpunet_api::agent::TaskRef,
    /// The image reference.
    pub image: String,
    /// The job's command and arguments; empty: the image's.
    pub args: Vec<String>,
    /// The task's environment (a process task's); the image's own comes first, and its `PATH` wins.
    pub env: std::collections::BTreeMap<String, String>,
    /// The working directory in the container; `None`: the image's (unless `/`), else `home`.
    pub cwd: Option<String>,
    /// The task's own directory (bind-mounted at the same path).
    pub home: PathBuf,
    /// Its uid and gid; `None`: root in the container, still without capabilities.
    pub user: Option<(u32, u32)>,
    /// The init on the node, bind-mounted at [`INIT_PATH`] and started as PID 1.
    pub init: Option<PathBuf>,
    /// The root filesystem (the overlay's mount point in the bundle).
    pub rootfs: PathBuf,
    /// Bind mounts: the task's own directory, the checkpoint directory, the log, the job's volumes.
    pub binds: Vec<Bind>,
    /// The network.
    pub network: Network,
    /// `/dev/shm`'s size, MiB.
    pub shm_mib: u64,
    /// `/tmp`'s size, MiB.
    pub tmp_mib: u64,
    /// Device nodes.
    pub devices: Vec<Device>,
    /// The node's CDI edits for the task's GPUs (its device nodes are in `devices` already).
    #[serde(default)]
    pub cdi: Option<super::cdi::Edits>,
}

/// A device cgroup rule allowing a character device (every minor without one).
fn allow_char(major: i64, minor: Option<i64>) -> Result<oci_spec::runtime::LinuxDeviceCgroup, oci_spec::OciSpecError> {
    let b = LinuxDeviceCgroupBuilder::default().allow(true).typ(LinuxDeviceType::C).major(major).access("rwm");
    match minor {
        Some(m) => b.minor(m).build(),
        None => b.build(),
    }
}

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, String> {
    MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(|e| format!("mount {dest}: {e}"))
}

/// The container's configuration:
/// - the process: the command under the init (`/.gpunet/init -g -- …`: signals go to the task's whole group), the
///   environment, the working directory, the tenant's uid and gid with no supplementary groups, **no capabilities**
///   (every set empty), `noNewPrivileges`, the agent's open-files limit;
/// - the root: the overlay mount point, writable (its upper directory is the container's own);
/// - namespaces: PID, mount, IPC and UTS of its own, and network with `network: none`;
/// - mounts: `/proc`, `/dev` (runc's minimal set of device nodes), `/dev/pts`, `/dev/mqueue`, `/dev/shm` (its
///   size), `/tmp` (bounded by memory), `/sys` and its cgroups read-only, then the binds: the task's own directory and
///   the job's checkpoint directory read-write at their host paths, the log read-only, the init, the node's
///   `/etc/resolv.conf` and `/etc/hosts` read-only with the host network, and the job's volumes;
/// - devices: only the task's GPUs' nodes and the driver's control devices; the device cgroup denies everything but
///   them, runc's defaults (null, zero, random, tty, pts…) and InfiniBand verbs (major 231, NCCL over RDMA);
/// - no `cgroupsPath`: the runtime makes the container's groups beneath its own, which are the task's (the wrapper
///   joined them), so the task's memory, CPU and pids limits hold for the container and the agent reads its OOM
///   and kills what is left there as for a process task;
/// - the runtime's default masked and read-only paths (`/proc/kcore`, `/proc/sys`, …);
/// - annotations naming the job, rank and attempt.
pub fn spec(p: &Plan, image: &super::images::Defaults) -> Result<Spec, String> {
    fn e(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> String {
        move |err| format!("{what}: {err}")
    }
    let command = if p.args.is_empty() { &image.args } else { &p.args };
    if command.is_empty() {
        return Err(format!("the job has no command and image {:?} names none", p.image));
    }
    let mut args = Vec::new();
    if p.init.is_some() {
        args.extend([INIT_PATH.to_string(), "-g".into(), "--".into()]);
    }
    args.extend(command.iter().cloned());
    let mut env: std::collections::BTreeMap<String, String> = image.env.iter().cloned().collect();
    let path = env.get("PATH").cloned().unwrap_or_else(|| crate::launcher::DEFAULT_TASK_PATH.to_string());
    // The CDI spec's environment over the image's; the task's over both.
    for kv in p.cdi.iter().flat_map(|c| c.env.iter()) {
        if let Some((k, v)) = kv.split_once('=') {
            env.insert(k.to_string(), v.to_string());
        }
    }
    env.extend(p.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert("PATH".into(), path);
    let env: Vec<String> = env
        .into_iter()
        .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let cwd = match (&p.cwd, &image.cwd) {
        (Some(c), _) => c.clone(),
        (None, Some(c)) if c != "/" => c.clone(),
        _ => p.home.display().to_string(),
    };
    let (uid, gid) = p.user.unwrap_or((0, 0));
    let user =
        UserBuilder::default().uid(uid).gid(gid).additional_gids(Vec::<u32>::new()).build().map_err(e("user"))?;
    let none = || Vec::<oci_spec::runtime::Capability>::new().into_iter().collect::<oci_spec::runtime::Capabilities>();
    let caps = LinuxCapabilitiesBuilder::default()
        .bounding(none())
        .effective(none())
        .inheritable(none())
        .permitted(none())
        .ambient(none())
        .build()
        .map_err(e("capabilities"))?;
    let (soft, hard) = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .zip(rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum)
        .unwrap_or((1024, 4096));
    let nofile = PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .soft(soft)
        .hard(hard)
        .build()
        .map_err(e("rlimit"))?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(user)
        .args(args)
        .env(env)
        .cwd(&cwd)
        .capabilities(caps)
        .no_new_privileges(true)
        .rlimits(vec![nofile])
        .build()
        .map_err(e("process"))?;
    let root = RootBuilder::default().path(&p.rootfs).readonly(false).build().map_err(e("root"))?;
    let shm = format!("size={}m", p.shm_mib.max(1));
    let tmp = format!("size={}m", p.tmp_mib.max(4));
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount("/dev", "tmpfs", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"])?,
        mount("/dev/pts", "devpts", "devpts", &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"])?,
        mount("/dev/shm", "tmpfs", "shm", &["nosuid", "noexec", "nodev", "mode=1777", &shm])?,
        mount("/dev/mqueue", "mqueue", "mqueue", &["nosuid", "noexec", "nodev"])?,
        mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", "ro"])?,
        mount("/sys/fs/cgroup", "cgroup", "cgroup", &["nosuid", "noexec", "nodev", "relatime", "ro"])?,
        mount("/tmp", "tmpfs", "tmpfs", &["nosuid", "nodev", "mode=1777", &tmp])?,
    ];
    if let Some(init) = &p.init {
        mounts.push(mount(INIT_PATH, "bind", &init.display().to_string(), &["bind", "ro", "nosuid", "nodev"])?);
    }
    let mut binds = p.binds.clone();
    if p.network == Network::Host {
        for f in ["/etc/resolv.conf", "/etc/hosts"] {
            if Path::new(f).is_file() {
                binds.push(Bind { host: f.into(), path: f.into(), read_only: true, beneath: None });
            }
        }
    }
    let bundle = p.rootfs.parent().unwrap_or(Path::new("/"));
    for (i, b) in binds.iter().enumerate() {
        let mode = if b.read_only { "ro" } else { "rw" };
        let source = if b.beneath.is_some() { staged(bundle, i) } else { b.host.clone() };
        mounts.push(mount(&b.path, "bind", &source.display().to_string(), &["rbind", mode, "nosuid", "nodev"])?);
    }
    // The CDI spec's mounts (the driver's libraries and tools), read-only unless it says otherwise.
    for m in p.cdi.iter().flat_map(|c| c.mounts.iter()) {
        let mut opts: Vec<&str> = m.options.iter().map(String::as_str).collect();
        if !opts.iter().any(|o| *o == "bind" || *o == "rbind") {
            opts.push("rbind");
        }
        if !opts.contains(&"rw") && !opts.contains(&"ro") {
            opts.push("ro");
        }
        opts.extend(["nosuid", "nodev"]);
        mounts.push(mount(&m.container_path, "bind", &m.host_path, &opts)?);
    }
    let mut namespaces = Vec::new();
    let mut kinds =
        vec![LinuxNamespaceType::Pid, LinuxNamespaceType::Mount, LinuxNamespaceType::Ipc, LinuxNamespaceType::Uts];
    if p.network == Network::None {
        kinds.push(LinuxNamespaceType::Network);
    }
    for k in kinds {
        namespaces.push(LinuxNamespaceBuilder::default().typ(k).build().map_err(e("namespace"))?);
    }
    let mut devices = Vec::new();
    let mut rules =
        vec![LinuxDeviceCgroupBuilder::default().allow(false).access("rwm").build().map_err(e("devices"))?];
    for d in &p.devices {
        devices.push(
            LinuxDeviceBuilder::default()
                .path(&d.path)
                .typ(LinuxDeviceType::C)
                .major(d.major as i64)
                .minor(d.minor as i64)
                .file_mode(0o666u32)
                .uid(0u32)
                .gid(0u32)
                .build()
                .map_err(e("device"))?,
        );
        rules.push(allow_char(d.major as i64, Some(d.minor as i64)).map_err(e("devices"))?);
    }
    rules.push(allow_char(231, None).map_err(e("devices"))?);
    // Only the device rules: memory, CPU and pids are limited by the task's groups, which the container's groups
    // are made beneath (no `cgroupsPath`: the runtime nests them under the wrapper's own, the task's). A limit of
    // its own would let the kernel kill inside the child group, where the agent does not look for the OOM.
    let resources = LinuxResourcesBuilder::default().devices(rules).build().map_err(e("resources"))?;
    let defaults = oci_spec::runtime::Linux::default();
    let linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .devices(devices)
        .resources(resources)
        .masked_paths(defaults.masked_paths().clone().unwrap_or_default())
        .readonly_paths(defaults.readonly_paths().clone().unwrap_or_default());
    let linux = linux.build().map_err(e("linux"))?;
    let t = p.task;
    let annotations = HashMap::from([
        ("io.gpunet.job".to_string(), t.job.to_string()),
        ("io.gpunet.rank".to_string(), t.rank.to_string()),
        ("io.gpunet.attempt".to_string(), t.attempt.to_string()),
    ]);
    let hooks = match p.cdi.as_ref().filter(|c| !c.hooks.is_empty()) {
        None => None,
        Some(c) => {
            let mut by_name: HashMap<&str, Vec<oci_spec::runtime::Hook>> = HashMap::new();
            for h in &c.hooks {
                let hook = oci_spec::runtime::HookBuilder::default()
                    .path(&h.path)
                    .args(h.args.clone())
                    .env(h.env.clone())
                    .build()
                    .map_err(e("hook"))?;
                by_name.entry(h.hook_name.as_str()).or_default().push(hook);
            }
            let mut b = oci_spec::runtime::HooksBuilder::default();
            for (name, list) in by_name {
                b = match name {
                    "prestart" => b.prestart(list),
                    "createRuntime" => b.create_runtime(list),
                    "createContainer" => b.create_container(list),
                    "startContainer" => b.start_container(list),
                    "poststart" => b.poststart(list),
                    "poststop" => b.poststop(list),
                    other => return Err(format!("CDI hook {other:?}: not an OCI hook")),
                };
            }
            Some(b.build().map_err(e("hooks"))?)
        }
    };
    let mut spec = SpecBuilder::default();
    if let Some(h) = hooks {
        spec = spec.hooks(h);
    }
    spec.version("1.0.2")
        .root(root)
        .process(process)
        .hostname(format!("job-{}-rank-{}", t.job, t.rank))
        .mounts(mounts)
        .linux(linux)
        .annotations(annotations)
        .build()
        .map_err(e("spec"))
}

/// Writes `value` as `bundle/NAME` (`plan.json`, `config.json`), root's alone (0600: it holds the task's
/// environment).
pub fn write(bundle: &Path, name: &str, value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_vec(value).map_err(|e| format!("{name}: {e}"))?;
    crate::launcher::write_private(&bundle.join(name), &text)
        .map_err(|e| format!("write {}/{name}: {e}", bundle.display()))
}

/// Reads `bundle/plan.json`.
pub fn read_plan(bundle: &Path) -> Result<Plan, String> {
    let f = bundle.join("plan.json");
    let bytes = std::fs::read(&f).map_err(|e| format!("read {}: {e}", f.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("read {}: {e}", f.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_drops_every_capability_and_names_only_the_tasks_gpus() {
        let d = tempfile::tempdir().unwrap();
        let t = gpunet_api::agent::TaskRef { job: 5, rank: 1, attempt: 2 };
        let p = Plan {
            task: t,
            image: "dir:x".into(),
            args: vec!["python".into(), "train.py".into()],
            env: [("RANK".to_string(), "1".to_string()), ("PATH".to_string(), "/node/bin".to_string())].into(),
            cwd: Some("/work".into()),
            home: d.path().join("home"),
            user: Some((200_001, 200_001)),
            init: Some("/usr/bin/tini-static".into()),
            rootfs: d.path().join("rootfs"),
            binds: vec![
                Bind { host: d.path().join("home"), path: "/data/home".into(), read_only: false, beneath: None },
                Bind {
                    host: "/srv/data".into(),
                    path: "/data/set".into(),
                    read_only: true,
                    beneath: Some("/srv".into()),
                },
            ],
            network: Network::None,
            shm_mib: 256,
            tmp_mib: 1024,
            devices: vec![Device { path: "/dev/nvidia1".into(), major: 195, minor: 1 }],
            cdi: None,
        };
        let image = super::super::images::Defaults {
            args: vec!["sh".into()],
            env: vec![("PATH".into(), "/opt/bin".into()), ("LANG".into(), "C".into()), ("RANK".into(), "9".into())],
            cwd: Some("/srv".into()),
        };
        let s = spec(&p, &image).unwrap();
        let v = serde_json::to_value(&s).unwrap();
        // The image's PATH, the task's variables over the image's.
        assert_eq!(v["process"]["env"], serde_json::json!(["LANG=C", "PATH=/opt/bin", "RANK=1"]));
        assert_eq!(v["process"]["cwd"], "/work");
        // Without a command or working directory of the job's: the image's.
        let bare = spec(&Plan { args: Vec::new(), cwd: None, ..p.clone() }, &image).unwrap();
        let b = serde_json::to_value(&bare).unwrap();
        assert_eq!(b["process"]["args"], serde_json::json!(["/.gpunet/init", "-g", "--", "sh"]));
        assert_eq!(b["process"]["cwd"], "/srv");
        let none = super::super::images::Defaults::default();
        assert!(spec(&Plan { args: Vec::new(), ..p.clone() }, &none).unwrap_err().contains("no command"));
        assert_eq!(v["process"]["args"], serde_json::json!(["/.gpunet/init", "-g", "--", "python", "train.py"]));
        assert_eq!(v["process"]["user"]["uid"], 200_001);
        assert_eq!(v["process"]["noNewPrivileges"], true);
        for set in ["bounding", "effective", "inheritable", "permitted", "ambient"] {
            assert_eq!(v["process"]["capabilities"][set], serde_json::json!([]), "{set}");
        }
        let ns: Vec<&str> =
            v["linux"]["namespaces"].as_array().unwrap().iter().map(|n| n["type"].as_str().unwrap()).collect();
        assert!(ns.contains(&"network") && ns.contains(&"pid") && ns.contains(&"mount"), "{ns:?}");
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 1);
        assert_eq!(v["linux"]["devices"][0]["path"], "/dev/nvidia1");
        let rules = v["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!((rules[0]["allow"].as_bool(), rules[0]["access"].as_str()), (Some(false), Some("rwm")));
        // The limits are the task's groups', which the container's are made beneath.
        assert!(v["linux"]["resources"]["memory"].is_null() && v["linux"]["cgroupsPath"].is_null());
        let mounts = v["mounts"].as_array().unwrap();
        let shm = mounts.iter().find(|m| m["destination"] == "/dev/shm").unwrap();
        assert!(shm["options"].as_array().unwrap().iter().any(|o| o == "size=256m"));
        assert!(mounts.iter().any(|m| m["destination"] == "/data/home" && m["options"][1] == "rw"));
        // A job's host path is mounted from the wrapper's staged mount, never from its path on the node.
        let set = mounts.iter().find(|m| m["destination"] == "/data/set").unwrap();
        assert_eq!(set["source"], d.path().join("binds/1").display().to_string());
        assert_eq!(set["options"][1], "ro");
        // No host network: the node's resolver files are not mounted.
        assert!(!mounts.iter().any(|m| m["destination"] == "/etc/hosts"));
        assert_eq!(v["annotations"]["io.gpunet.attempt"], "2");
        assert!(v["linux"]["maskedPaths"].as_array().unwrap().iter().any(|m| m == "/proc/kcore"));
        // CDI: its environment between the image's and the task's, its mounts read-only, its hooks.
        let cdi = super::super::cdi::Edits {
            env: vec!["NVIDIA_CTK=1".into(), "RANK=7".into()],
            mounts: vec![super::super::cdi::Mount {
                host_path: "/usr/lib/libcuda.so.1".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                options: Vec::new(),
            }],
            hooks: vec![super::super::cdi::Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvidia-ctk".into(),
                args: vec!["nvidia-ctk".into(), "hook".into(), "update-ldcache".into()],
                env: Vec::new(),
            }],
            ..Default::default()
        };
        let c = serde_json::to_value(spec(&Plan { cdi: Some(cdi), ..p.clone() }, &image).unwrap()).unwrap();
        let env = c["process"]["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e == "NVIDIA_CTK=1") && env.iter().any(|e| e == "RANK=1"), "{env:?}");
        let lib = c["mounts"].as_array().unwrap().iter().find(|m| m["source"] == "/usr/lib/libcuda.so.1").unwrap();
        assert_eq!(lib["options"], serde_json::json!(["rbind", "ro", "nosuid", "nodev"]));
        assert_eq!(c["hooks"]["createContainer"][0]["args"][2], "update-ldcache");
    }
}
