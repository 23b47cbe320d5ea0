//! Container tasks: a job with an `image` runs each task in an OCI container.
//!
//! **Why an OCI bundle run by runc, not podman.** On this kind of node (Debian 12, hybrid cgroups) `runc run` of a
//! bundle starts in 15–17 ms, podman in 140–330 ms; podman 4.3 reports `OOMKilled=false` on cgroup v1 when the kernel
//! killed the task, leaves the container running when its client is killed, and is not the task's parent. With a
//! bundle the agent stays in charge of everything it already does for process tasks: the task's cgroups (memory,
//! CPU, pids and device limits, OOM read back from the group), its Unix identity, its directories, its log, its exit
//! status and adoption after an agent restart (all through the wrapper, see [`crate::wrapper`]). crun runs the same
//! bundles (`--container-runtime crun`); crun 1.8 refuses hybrid cgroup hierarchies, so runc is the default.
//!
//! **Images** are unpacked by existing tools into a per-node cache (see [`images`]), by the task's wrapper (a long
//! pull never holds up the agent's loop): `umoci` for OCI layouts,
//! `skopeo` to copy from a registry, the local image store or an OCI archive into a layout first. An unpacked root
//! filesystem (`dir:NAME`) is used as it is. Each container's root is an overlay of the cached image (read-only,
//! shared) and an upper directory of its own, mounted by the wrapper in a mount namespace of its own: the mount
//! exists only as long as the container does, and nothing of it is ever visible on the host.
//!
//! **The bundle** (see [`bundle`]): the job's command under an init (`tini`, bind-mounted at `/.gpunet/init`; PID 1
//! forwards SIGTERM and reaps), as the tenant's uid with no capabilities and `no_new_privileges`, the same
//! environment as a process task, the task's own directory and the job's checkpoint directory bind-mounted at their
//! host paths, `/dev/shm` of the job's size, the node's network (or none), only the task's GPUs' device nodes (plus
//! the driver's control devices), and its cgroups beneath the task's (whose limits hold for it).
//!
//! **Lifecycle.** The wrapper creates and starts the container (`runc create`, `runc start`) as a child subreaper,
//! so the container's first process becomes its child: the wrapper forwards signals to it and reads its exact exit
//! status. When the attempt ends the agent reads the OOM verdict from the cgroups, kills what is left in them,
//! deletes the container (`runc delete --force`) and its bundle. Containers are named
//! `gpunet-job-J-rank-R-attempt-A` and carry the job, rank and attempt as annotations; an agent that starts again
//! adopts those whose wrapper still runs (like process tasks) and deletes every other one ([`Runtime::sweep`]).

pub mod bundle;
pub mod cdi;
pub mod images;
pub mod run;

use std::path::{Path, PathBuf};

/// Device rules runc 1.1 writes into every container's devices group besides the spec's, which the task's group
/// above it must allow (a child group may not allow more): mknod of any node (opening one is what the rules guard;
/// the task has no CAP_MKNOD anyway), and `/dev/net/tun` (creating a tunnel needs CAP_NET_ADMIN, which it lacks).
/// The rest of runc's defaults (null, zero, full, random, urandom, tty, ptmx, pts) are the agent's own.
pub const RUNTIME_DEVICE_RULES: &[&str] = &["c *:* m", "b *:* m", "c 10:200 rwm"];

/// The prefix of every container id an agent makes; its own tag follows (see [`agent_tag`]).
pub const ID_PREFIX: &str = "gpunet-";

/// An agent's tag: 8 hex digits of its data directory, in its parent cgroup's name and its container ids. The runtime
/// makes groups named after the container at the root of the hierarchies the wrapper is in no group of (cpuset,
/// blkio, …), so two agents on one machine (one server's job 1 and another's) must not share a name.
pub fn agent_tag(data: &Path) -> String {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.canonicalize().unwrap_or_else(|_| data.to_path_buf()).hash(&mut h);
    format!("{:08x}", h.finish() as u32)
}

/// A task attempt's container id for the agent tagged `tag`.
pub fn container_id(tag: &str, t: &gpunet_api::agent::TaskRef) -> String {
    format!("{ID_PREFIX}{tag}-job-{}-rank-{}-attempt-{}", t.job, t.rank, t.attempt)
}

/// The task of a container id, if the agent tagged `tag` made it.
pub fn task_of_id(tag: &str, id: &str) -> Option<gpunet_api::agent::TaskRef> {
    let rest = id.strip_prefix(ID_PREFIX)?.strip_prefix(tag)?.strip_prefix("-job-")?;
    let (job, rest) = rest.split_once("-rank-")?;
    let (rank, attempt) = rest.split_once("-attempt-")?;
    Some(gpunet_api::agent::TaskRef {
        job: job.parse().ok()?,
        rank: rank.parse().ok()?,
        attempt: attempt.parse().ok()?,
    })
}

/// How the node runs containers.
#[derive(Debug)]
pub struct Runtime {
    /// The OCI runtime (`runc` or `crun`).
    pub exe: PathBuf,
    /// Its name, for the node's labels.
    pub name: String,
    /// Its state directory (`--root`), under the agent's data directory.
    pub state: PathBuf,
    /// Where bundles are made: `bundles/ID/{config.json,rootfs,upper,work,volumes}`.
    pub bundles: PathBuf,
    /// A static init run as every container's PID 1 (`tini-static`); `None`: the task itself is PID 1.
    pub init: Option<PathBuf>,
    /// The image cache and the tools that fill it.
    pub images: images::Images,
    /// Node directories a job's `host_path` mount may name (each with everything beneath it).
    pub host_paths: Vec<PathBuf>,
    /// The node's `nvidia.com/gpu` CDI spec, if it has one (see [`cdi`]).
    pub cdi: Option<cdi::GpuSpec>,
    /// This agent's tag in its container ids.
    pub tag: String,
}

/// Finds a program on `PATH` (or takes a path as it is).
pub fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A task's directories and settings on the node, for [`Runtime::plan`].
#[derive(Debug, Clone, Copy)]
pub struct TaskDirs<'a> {
    /// Its own directory (`HOME`).
    pub home: &'a Path,
    /// Its working directory on the node.
    pub cwd: &'a Path,
    /// The job's checkpoint directory.
    pub checkpoint: &'a Path,
    /// Its log file.
    pub log: &'a Path,
    /// Its environment as a process task's.
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// Its uid and gid.
    pub user: Option<(u32, u32)>,
    /// Where the GPUs' device nodes are.
    pub dev_dir: &'a Path,
}

/// What the operator asked for (`gpunet agent --container-runtime …`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `runc`, `crun`, a path, or `none`; `None`: runc where installed, else crun.
    pub runtime: Option<String>,
    /// The init's path; `None`: `tini-static`, else `catatonit`, where installed.
    pub init: Option<PathBuf>,
    /// The image directory `dir:`, `oci:` and `oci-archive:` images are named beneath; `None`: `DATA/images`.
    pub image_dir: Option<PathBuf>,
    /// Node directories a job may mount (`--allow-host-path`).
    pub host_paths: Vec<PathBuf>,
    /// Where CDI specs are read from (`--cdi-spec-dir`); `None`: `/etc/cdi` and `/var/run/cdi`.
    pub cdi_dirs: Option<Vec<PathBuf>>,
}

impl Runtime {
    /// The node's container runtime under data directory `data`, if it has one (the agent must be root: the
    /// runtime makes namespaces, mounts and device nodes).
    pub fn detect(data: &Path, o: &Options) -> Result<Option<Runtime>, String> {
        let exe = match o.runtime.as_deref() {
            Some("none") => return Ok(None),
            Some(r) => Some(find_program(r).ok_or_else(|| format!("--container-runtime {r:?}: not found"))?),
            None => find_program("runc").or_else(|| find_program("crun")),
        };
        let Some(exe) = exe else { return Ok(None) };
        if !crate::running_as_root() {
            if o.runtime.is_some() {
                return Err("containers need the agent to run as root".into());
            }
            return Ok(None);
        }
        let name = exe.file_name().map_or("runc".into(), |n| n.to_string_lossy().into_owned());
        let init = match &o.init {
            Some(p) if p.is_file() => Some(p.clone()),
            Some(p) => return Err(format!("--container-init {}: not a file", p.display())),
            None => find_program("tini-static").or_else(|| find_program("catatonit")),
        };
        if init.is_none() {
            tracing::warn!(
                "no container init (tini-static or catatonit): a container's task is its PID 1, which gets no \
                 SIGTERM it has no handler for (the grace period then ends in SIGKILL)"
            );
        }
        let root = data.join("containers");
        // Root's alone: runtime state and bundles hold tasks' environments, and the image cache may hold a tenant's
        // private image (a container reaches its files through its overlay, never through these paths).
        let mk = |p: &Path| -> Result<(), String> {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::create_dir_all(p).map_err(|e| format!("make {}: {e}", p.display()))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("chmod {}: {e}", p.display()))
        };
        for d in [&root, &root.join("state"), &root.join("bundles"), &root.join("images")] {
            mk(d)?;
        }
        let image_dir = o.image_dir.clone().unwrap_or_else(|| data.join("images"));
        let images = images::Images::new(image_dir, root.join("images"))?;
        let host_paths = o
            .host_paths
            .iter()
            .map(|p| p.canonicalize().map_err(|e| format!("--allow-host-path {}: {e}", p.display())))
            .collect::<Result<_, _>>()?;
        let cdi_dirs = o.cdi_dirs.clone().unwrap_or_else(|| cdi::DEFAULT_DIRS.iter().map(PathBuf::from).collect());
        let cdi = cdi::load(&cdi_dirs);
        if let Some(s) = &cdi {
            tracing::info!(file = %s.file.display(), devices = ?s.device_names(), "container GPUs through CDI");
        }
        Ok(Some(Runtime {
            exe,
            name,
            state: root.join("state"),
            bundles: root.join("bundles"),
            init,
            images,
            host_paths,
            cdi,
            tag: agent_tag(data),
        }))
    }

    /// The node labels that say what it runs (see `gpunet_api::image::required_labels`).
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut v = vec![
            (gpunet_api::image::CONTAINERS_LABEL.to_string(), "true".to_string()),
            ("gpunet.io/container-runtime".to_string(), self.name.clone()),
        ];
        if self.cdi.is_some() {
            v.push(("gpunet.io/cdi".to_string(), "true".to_string()));
        }
        if self.images.umoci.is_some() {
            v.push((gpunet_api::image::IMAGE_UNPACK_LABEL.to_string(), "true".to_string()));
            if self.images.skopeo.is_some() {
                v.push((gpunet_api::image::IMAGE_PULL_LABEL.to_string(), "true".to_string()));
            }
        }
        v
    }

    /// `RUNTIME --root STATE ARGS…` with no environment but `PATH`.
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(&self.exe);
        c.env_clear().env("PATH", crate::launcher::DEFAULT_TASK_PATH).arg("--root").arg(&self.state).args(args);
        c
    }

    /// A task attempt's container id.
    pub fn container_id(&self, t: &gpunet_api::agent::TaskRef) -> String {
        container_id(&self.tag, t)
    }

    /// A task attempt's bundle directory.
    pub fn bundle_dir(&self, t: &gpunet_api::agent::TaskRef) -> PathBuf {
        self.bundles.join(self.container_id(t))
    }

    /// Deletes a task attempt's container (killing what is left of it) and its bundle; quiet when there is none.
    pub fn remove(&self, t: &gpunet_api::agent::TaskRef) {
        let id = self.container_id(t);
        let out = self.command(&["delete", "--force", &id]).stdin(std::process::Stdio::null()).output();
        if let Ok(o) = &out {
            let err = String::from_utf8_lossy(&o.stderr);
            if !o.status.success() && !err.contains("does not exist") && !err.contains("not exist") {
                tracing::warn!(container = %id, error = %err.trim(), "runtime delete failed");
            }
        }
        let dir = self.bundle_dir(t);
        if dir.exists() {
            // Whatever the task left in its upper directory or volumes goes too (symlinks are removed, not followed).
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(bundle = %dir.display(), error = %e, "could not remove a container's bundle");
            }
        }
    }

    /// Prepares a container task: its bundle directory and volumes, and its [`bundle::Plan`] (which the caller
    /// writes to the bundle; the wrapper completes it with the image's defaults once the image is unpacked, so that a
    /// long pull never holds up the agent). `task.cwd` is its working directory on the node (its own directory or
    /// beneath it), used unless the job names an absolute one in the container.
    pub fn plan(
        &self,
        a: &gpunet_api::agent::TaskAssignment,
        task: TaskDirs<'_>,
    ) -> Result<(bundle::Plan, run::ContainerExec), String> {
        let t = a.task;
        let c = a.container.as_ref().ok_or("not a container task")?;
        gpunet_api::image::ImageRef::parse("image", &c.image).map_err(|e| e.to_string())?;
        let cwd = match a.working_dir.as_deref() {
            Some(w) if w.starts_with('/') => Some(gpunet_api::image::absolute_path(w).ok_or("invalid working_dir")?),
            Some(_) => Some(task.cwd.display().to_string()),
            None => None,
        };
        let bundle = self.bundle_dir(&t);
        if bundle.exists() {
            let _ = std::fs::remove_dir_all(&bundle);
        }
        crate::launcher::own_dir(&bundle, None).map_err(|e| format!("make {}: {e}", bundle.display()))?;
        let same = |p: &Path, ro: bool| bundle::Bind {
            host: p.to_path_buf(),
            path: p.display().to_string(),
            read_only: ro,
            beneath: None,
        };
        let mut binds = vec![same(task.home, false), same(task.checkpoint, false), same(task.log, true)];
        for (i, m) in c.mounts.iter().enumerate() {
            let path =
                gpunet_api::image::absolute_path(&m.path).ok_or_else(|| format!("container.mounts[{i}].path"))?;
            let (host, beneath) = match &m.host_path {
                Some(h) => {
                    let real = Path::new(h)
                        .canonicalize()
                        .map_err(|e| format!("container.mounts[{i}].host_path {h:?}: {e}"))?;
                    let Some(allowed) = self.host_paths.iter().find(|allowed| real.starts_with(allowed)) else {
                        return Err(format!(
                            "container.mounts[{i}].host_path {h:?} is not allowed on this node (its agent's \
                             --allow-host-path names the directories jobs may mount)"
                        ));
                    };
                    (real, Some(allowed.clone()))
                }
                None => {
                    let d = bundle.join("volumes").join(i.to_string());
                    crate::launcher::own_dir(&d, task.user).map_err(|e| format!("make {}: {e}", d.display()))?;
                    (d, None)
                }
            };
            binds.push(bundle::Bind { host, path, read_only: m.read_only, beneath });
        }
        let plan = bundle::Plan {
            task: t,
            image: c.image.clone(),
            args: a.command.clone(),
            env: task.env.clone(),
            cwd,
            home: task.home.to_path_buf(),
            user: task.user,
            init: self.init.clone(),
            rootfs: bundle.join("rootfs"),
            binds,
            network: c.network,
            shm_mib: c.shm_mib.clamp(1, a.memory_mib.max(4)),
            tmp_mib: a.memory_mib.max(4),
            devices: bundle::gpu_devices(task.dev_dir, &a.gpus),
            cdi: None,
        };
        // With a CDI spec, the GPUs come as it says (device nodes, driver libraries, environment, hooks).
        let plan = match self.cdi.as_ref().and_then(|s| s.edits(&a.gpus)) {
            None => plan,
            Some(edits) => {
                let devices = edits
                    .device_nodes
                    .iter()
                    .filter_map(|n| {
                        let host = n.host_path.as_deref().unwrap_or(&n.path);
                        let (major, minor) = cdi::numbers(Path::new(host))?;
                        Some(bundle::Device { path: n.path.clone(), major, minor })
                    })
                    .collect();
                bundle::Plan { devices, cdi: Some(edits), ..plan }
            }
        };
        let exec = run::ContainerExec {
            id: self.container_id(&t),
            runtime: self.exe.clone(),
            state: self.state.clone(),
            bundle,
            image_dir: self.images.dir.clone(),
            image_cache: self.images.cache.clone(),
        };
        Ok((plan, exec))
    }

    /// The containers the runtime knows, by id.
    pub fn list(&self) -> Vec<String> {
        let Ok(o) = self.command(&["list", "--format", "json"]).stdin(std::process::Stdio::null()).output() else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
        v.as_array().map(|a| a.iter().filter_map(|c| c["id"].as_str().map(String::from)).collect()).unwrap_or_default()
    }

    /// After an agent start: deletes every container and bundle of the agent's that is not one of `adopted`'s
    /// (their wrapper is gone, so nobody would learn how they end). Returns the tasks whose containers went.
    pub fn sweep(&self, adopted: &[gpunet_api::agent::TaskRef]) -> Vec<gpunet_api::agent::TaskRef> {
        let mut gone = Vec::new();
        let mut seen: Vec<String> = self.list();
        if let Ok(rd) = std::fs::read_dir(&self.bundles) {
            seen.extend(rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()));
        }
        seen.sort();
        seen.dedup();
        for id in seen {
            let Some(t) = task_of_id(&self.tag, &id) else { continue };
            if adopted.contains(&t) {
                continue;
            }
            tracing::info!(container = %id, "removing a container a previous agent run left");
            self.remove(&t);
            gone.push(t);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_name_the_job_rank_and_attempt_and_read_back() {
        let t = gpunet_api::agent::TaskRef { job: 12, rank: 3, attempt: 4 };
        assert_eq!(container_id("0a1b2c3d", &t), "gpunet-0a1b2c3d-job-12-rank-3-attempt-4");
        assert_eq!(task_of_id("0a1b2c3d", &container_id("0a1b2c3d", &t)), Some(t));
        for other in [
            "job-1-rank-0-attempt-0",
            "gpunet-0a1b2c3d-job-x-rank-0-attempt-0",
            "podman-abc",
            "gpunet-0a1b2c3d-job-1",
            // Another agent's on the same machine: never touched.
            "gpunet-ffffffff-job-12-rank-3-attempt-4",
        ] {
            assert_eq!(task_of_id("0a1b2c3d", other), None, "{other}");
        }
        let d = tempfile::tempdir().unwrap();
        assert_eq!(agent_tag(d.path()), agent_tag(&d.path().join(".")), "one tag per directory");
        assert_ne!(agent_tag(d.path()), agent_tag(&d.path().join("x")));
    }
}
