//! CDI (the Container Device Interface): where the node has a CDI spec for `nvidia.com/gpu` (written by the NVIDIA
//! container toolkit, `nvidia-ctk cdi generate`, in `/etc/cdi` or `/var/run/cdi`), a container task gets its GPUs
//! the way the toolkit says: the spec's own edits (the driver's control devices, its user-space libraries and tools
//! mounted from the node, environment, hooks such as `update-ldcache`) and each of its GPUs' device edits, by the
//! device's name (`0`, `1`, … — the GPU's index, as `nvidia-ctk` names them). Without a spec it gets the device
//! nodes alone ([`super::bundle::gpu_devices`]).
//!
//! A spec is the operator's file (root's directories); it is read once when the agent starts. Specs of other kinds
//! are ignored, as are devices the spec does not name (such a task's GPU is missing from its container, and the
//! agent logs it).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The kind of device gpunet asks CDI for.
pub const GPU_KIND: &str = "nvidia.com/gpu";

/// The directories CDI specs are read from by default (CDI's own defaults).
pub const DEFAULT_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the node (default: `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
}

/// A mount from the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// On the node.
    pub host_path: String,
    /// In the container.
    pub container_path: String,
    /// Mount options (`ro`, `nosuid`, `nodev`, `bind`, …).
    #[serde(default)]
    pub options: Vec<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `createRuntime`, `createContainer`, `startContainer`, `poststart`, `poststop` or `prestart`.
    pub hook_name: String,
    /// Program.
    pub path: String,
    /// Arguments (with the program's name first, as OCI hooks have them).
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment.
    #[serde(default)]
    pub env: Vec<String>,
}

/// What CDI adds to a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    /// Environment (`KEY=VALUE`).
    #[serde(default)]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Hooks.
    #[serde(default)]
    pub hooks: Vec<Hook>,
}

impl Edits {
    fn extend(&mut self, o: &Edits) {
        self.env.extend(o.env.iter().cloned());
        self.device_nodes.extend(o.device_nodes.iter().cloned());
        self.mounts.extend(o.mounts.iter().cloned());
        self.hooks.extend(o.hooks.iter().cloned());
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecFile {
    #[allow(dead_code)]
    cdi_version: String,
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: Edits,
}

/// The node's `nvidia.com/gpu` CDI spec.
#[derive(Debug, Clone)]
pub struct GpuSpec {
    /// The file it came from.
    pub file: PathBuf,
    common: Edits,
    devices: Vec<Device>,
}

/// Reads the first `nvidia.com/gpu` spec in `dirs` (files `*.json`, `*.yaml`, `*.yml`, by name); a file that does
/// not parse is skipped with a warning.
pub fn load(dirs: &[PathBuf]) -> Option<GpuSpec> {
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else { continue };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else { continue };
            // JSON is YAML too.
            match serde_norway::from_str::<SpecFile>(&text) {
                Ok(s) if s.kind == GPU_KIND => {
                    return Some(GpuSpec { file: f, common: s.container_edits, devices: s.devices });
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(file = %f.display(), error = %e, "a CDI spec that does not parse is skipped"),
            }
        }
    }
    None
}

impl GpuSpec {
    /// The edits for a task given `gpus` (indexes): the spec's own, then each GPU's device's. `None` for a task
    /// without GPUs (it gets nothing of the driver's).
    pub fn edits(&self, gpus: &[u32]) -> Option<Edits> {
        if gpus.is_empty() {
            return None;
        }
        let mut e = self.common.clone();
        for g in gpus {
            match self.devices.iter().find(|d| d.name == g.to_string()) {
                Some(d) => e.extend(&d.container_edits),
                None => {
                    tracing::warn!(file = %self.file.display(), gpu = g, "the CDI spec names no device for this GPU")
                }
            }
        }
        Some(e)
    }

    /// The names of its devices.
    pub fn device_names(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.name.clone()).collect()
    }
}

/// A device node's numbers on the node.
pub fn numbers(host: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let m = std::fs::metadata(host).ok().filter(|m| m.file_type().is_char_device())?;
    Some((rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_spec_gives_the_common_edits_and_each_gpu_s_own() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("other.yaml"), "cdiVersion: 0.5.0\nkind: example.com/net\ndevices: []\n").unwrap();
        std::fs::write(d.path().join("broken.json"), "{").unwrap();
        std::fs::write(
            d.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n\
             - name: '0'\n  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}\n\
             - name: '1'\n  containerEdits: {deviceNodes: [{path: /dev/nvidia1, hostPath: /x/nvidia1}]}\n\
             containerEdits:\n  env: [NVIDIA_CTK=1]\n  deviceNodes: [{path: /dev/nvidiactl}]\n\
             \x20 mounts: [{hostPath: /usr/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1, options: [ro, bind]}]\n\
             \x20 hooks: [{hookName: createContainer, path: /usr/bin/nvidia-ctk, args: [nvidia-ctk, hook, update-ldcache]}]\n",
        )
        .unwrap();
        let s = load(&[d.path().join("missing"), d.path().to_path_buf()]).unwrap();
        assert!(s.file.ends_with("nvidia.yaml"));
        assert_eq!(s.device_names(), ["0", "1"]);
        let e = s.edits(&[1]).unwrap();
        let nodes: Vec<&str> = e.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(nodes, ["/dev/nvidiactl", "/dev/nvidia1"], "the common ones and GPU 1's only");
        assert_eq!(e.device_nodes[1].host_path.as_deref(), Some("/x/nvidia1"));
        assert_eq!(e.env, ["NVIDIA_CTK=1"]);
        assert_eq!(e.mounts[0].container_path, "/usr/lib/libcuda.so.1");
        assert_eq!(e.hooks[0].hook_name, "createContainer");
        assert_eq!(s.edits(&[]), None, "a task without GPUs gets nothing of the driver's");
        assert!(load(&[d.path().join("missing")]).is_none());
    }
}
