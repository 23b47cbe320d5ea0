//! Container images: the job's `image` reference and `container` options, checked the same way by the server (at
//! submission) and by the agent (before it touches anything on its node).
//!
//! | `image:` | what the agent runs |
//! |---|---|
//! | `dir:NAME` | the unpacked root filesystem `IMAGES/NAME` (or `IMAGES/NAME/rootfs`) |
//! | `oci:NAME[:TAG]` | the OCI image layout directory `IMAGES/NAME`, unpacked by `umoci` |
//! | `oci-archive:NAME[:TAG]` | the OCI archive file `IMAGES/NAME`, copied to a layout by `skopeo`, unpacked by `umoci` |
//! | `containers-storage:REF` | the node's local image store (podman's, buildah's), through `skopeo` |
//! | anything else, e.g. `nvcr.io/nvidia/pytorch:22.07-py3` | pulled from its registry by `skopeo` (`docker://REF`) |
//!
//! `IMAGES` is the agent's image directory (`--image-dir`): a job names files only beneath it, by a relative path of
//! plain names, so it can never make the node read another directory as an image.

use crate::error::ApiError;
use serde::{Deserialize, Serialize};

/// The longest image reference accepted.
pub const IMAGE_REF_MAX: usize = 512;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// An unpacked root filesystem beneath the node's image directory.
    Rootfs(String),
    /// An OCI image layout directory beneath the node's image directory, and the tag in it.
    OciLayout { path: String, tag: String },
    /// An OCI archive file beneath the node's image directory, and the tag in it.
    OciArchive { path: String, tag: String },
    /// The node's local image store (`containers-storage:` in skopeo's terms).
    LocalStore(String),
    /// A registry reference (`docker://` in skopeo's terms).
    Registry(String),
}

fn plain_path(field: &str, s: &str, what: &str) -> Result<String, ApiError> {
    match crate::spec::relative_working_dir(s) {
        Some(parts) => Ok(parts.join("/")),
        None => Err(ApiError::invalid(
            field,
            s,
            &format!("{what}: a relative path of plain names beneath the node's image directory (no '..')"),
        )),
    }
}

/// `NAME[:TAG]` of a layout or archive (the tag defaults to `latest`).
fn with_tag(field: &str, s: &str, what: &str) -> Result<(String, String), ApiError> {
    let (path, tag) = match s.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, t),
        _ => (s, "latest"),
    };
    if tag.is_empty() || !tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) || tag.len() > 128 {
        return Err(ApiError::invalid(field, s, &format!("{what} with a tag of letters, digits, '.', '_' or '-'")));
    }
    Ok((plain_path(field, path, what)?, tag.to_string()))
}

/// A registry or store reference: `[HOST[:PORT]/]NAME[:TAG][@DIGEST]` in the characters references use.
fn reference(field: &str, s: &str) -> Result<String, ApiError> {
    let ok = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@+".contains(c))
        && !s.starts_with(['-', '/', '.', ':', '@'])
        && !s.split('/').any(|p| p.is_empty() || p == "." || p == "..");
    if !ok {
        return Err(ApiError::invalid(
            field,
            s,
            "an image reference ([host/]name[:tag][@digest]), dir:NAME, oci:NAME[:TAG], oci-archive:NAME[:TAG] \
             or containers-storage:REF",
        ));
    }
    Ok(s.to_string())
}

impl ImageRef {
    /// Parses a job's `image` (`field` names it in errors).
    pub fn parse(field: &str, s: &str) -> Result<ImageRef, ApiError> {
        if s.len() > IMAGE_REF_MAX {
            return Err(ApiError::invalid(field, &s[..64.min(s.len())], "at most 512 bytes"));
        }
        if let Some(p) = s.strip_prefix("dir:") {
            return Ok(ImageRef::Rootfs(plain_path(field, p, "dir:NAME")?));
        }
        if let Some(p) = s.strip_prefix("oci:") {
            let (path, tag) = with_tag(field, p, "oci:NAME[:TAG]")?;
            return Ok(ImageRef::OciLayout { path, tag });
        }
        if let Some(p) = s.strip_prefix("oci-archive:") {
            let (path, tag) = with_tag(field, p, "oci-archive:NAME[:TAG]")?;
            return Ok(ImageRef::OciArchive { path, tag });
        }
        if let Some(r) = s.strip_prefix("containers-storage:") {
            return Ok(ImageRef::LocalStore(reference(field, r)?));
        }
        if let Some(r) = s.strip_prefix("docker://") {
            return Ok(ImageRef::Registry(reference(field, r)?));
        }
        Ok(ImageRef::Registry(reference(field, s)?))
    }
}

/// The node label an agent sets when it runs container tasks (an OCI runtime was found); a job with an image is
/// placed only on such nodes.
pub const CONTAINERS_LABEL: &str = "gpunet.io/containers";
/// The node label an agent sets when it can copy images from registries and its local store (`skopeo`, `umoci`).
pub const IMAGE_PULL_LABEL: &str = "gpunet.io/image-pull";
/// The node label an agent sets when it can unpack OCI layouts (`umoci`).
pub const IMAGE_UNPACK_LABEL: &str = "gpunet.io/image-unpack";

/// The node labels a job with this image needs (each with the value `true`).
pub fn required_labels(image: &ImageRef) -> Vec<&'static str> {
    let mut v = vec![CONTAINERS_LABEL];
    match image {
        ImageRef::Rootfs(_) => {}
        ImageRef::OciLayout { .. } => v.push(IMAGE_UNPACK_LABEL),
        _ => v.push(IMAGE_PULL_LABEL),
    }
    v
}

/// A container's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// The node's own network namespace (what NCCL across nodes needs; the default).
    #[default]
    Host,
    /// A network namespace of its own with only a loopback device.
    None,
}

/// A directory mounted into a job's containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContainerMount {
    /// Where it appears in the container (absolute, no `..`).
    pub path: String,
    /// A directory of the node (Kubernetes' hostPath); the agent mounts it only beneath the directories its operator
    /// allowed (`--allow-host-path`). Absent: an empty directory of the task's own (emptyDir), gone with the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Mounted read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Container options of a job with an `image`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    /// `host` (the default: NCCL needs the node's network) or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Size of the container's `/dev/shm` (PyTorch data loaders share batches through it), e.g. `8Gi`; default
    /// 64Mi, at most the task's memory (its pages count against the memory limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,
    /// Directories mounted into the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<ContainerMount>,
}

/// The default size of a container's `/dev/shm`, MiB (Docker's).
pub const DEFAULT_SHM_MIB: u64 = 64;

/// Container paths a mount may not cover: what the runtime itself provides, and the task's own directories.
const RESERVED_PATHS: &[&str] = &["/proc", "/sys", "/dev", "/.gpunet"];

/// An absolute path of plain names (no `.`, `..`, empty parts or NUL), normalised.
pub fn absolute_path(p: &str) -> Option<String> {
    let rest = p.strip_prefix('/')?;
    if p.contains('\0') || p.len() > 4096 {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').filter(|x| !x.is_empty()).collect();
    if parts.iter().any(|x| *x == "." || *x == "..") {
        return None;
    }
    Some(format!("/{}", parts.join("/")))
}

impl ContainerSpec {
    /// Checks the options; `memory_mib` is the task's memory.
    pub fn validate(&self, memory_mib: u64) -> Result<(), ApiError> {
        if let Some(s) = &self.shm_size {
            let m = crate::units::parse_memory("container.shm_size", s)?.0;
            if m == 0 || m > memory_mib {
                return Err(ApiError::invalid(
                    "container.shm_size",
                    s,
                    &format!("from 1Mi up to the task's memory ({memory_mib}Mi)"),
                ));
            }
        }
        if self.mounts.len() > 32 {
            return Err(ApiError::invalid("container.mounts", "too many", "at most 32 mounts"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, m) in self.mounts.iter().enumerate() {
            let f = format!("container.mounts[{i}].path");
            let p = absolute_path(&m.path)
                .filter(|p| p != "/")
                .ok_or_else(|| ApiError::invalid(&f, &m.path, "an absolute path without '.' or '..', not /"))?;
            if p == "/dev/shm" {
                return Err(ApiError::invalid(&f, &m.path, "a path other than /dev/shm (set container.shm_size)"));
            }
            if RESERVED_PATHS.iter().any(|r| p == *r || p.starts_with(&format!("{r}/"))) {
                return Err(ApiError::invalid(&f, &m.path, "a path outside /proc, /sys, /dev and /.gpunet"));
            }
            if !seen.insert(p) {
                return Err(ApiError::invalid(&f, &m.path, "a path no other mount uses"));
            }
            if let Some(h) = &m.host_path {
                if absolute_path(h).is_none() {
                    return Err(ApiError::invalid(
                        &format!("container.mounts[{i}].host_path"),
                        h,
                        "an absolute path without '.' or '..'",
                    ));
                }
            }
        }
        Ok(())
    }

    /// `/dev/shm`'s size in MiB.
    pub fn shm_mib(&self) -> u64 {
        self.shm_size
            .as_deref()
            .and_then(|s| crate::units::parse_memory("container.shm_size", s).ok())
            .map_or(DEFAULT_SHM_MIB, |m| m.0)
    }
}

/// What the agent is told about a container task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContainerTask {
    /// The image reference (see [`ImageRef`]).
    pub image: String,
    /// Its network.
    #[serde(default)]
    pub network: Network,
    /// `/dev/shm`'s size, MiB.
    pub shm_mib: u64,
    /// Directories mounted into it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<ContainerMount>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_name_their_source_and_never_leave_the_image_directory() {
        let p = |s: &str| ImageRef::parse("image", s);
        assert_eq!(p("dir:tiny").unwrap(), ImageRef::Rootfs("tiny".into()));
        assert_eq!(p("dir:a/./b/").unwrap(), ImageRef::Rootfs("a/b".into()));
        assert_eq!(p("oci:lay").unwrap(), ImageRef::OciLayout { path: "lay".into(), tag: "latest".into() });
        assert_eq!(p("oci-archive:x.tar:v1").unwrap(), ImageRef::OciArchive { path: "x.tar".into(), tag: "v1".into() });
        assert_eq!(p("containers-storage:localhost/tiny:1").unwrap(), ImageRef::LocalStore("localhost/tiny:1".into()));
        assert_eq!(
            p("nvcr.io/nvidia/pytorch:22.07-py3").unwrap(),
            ImageRef::Registry("nvcr.io/nvidia/pytorch:22.07-py3".into())
        );
        assert_eq!(p("docker://busybox").unwrap(), ImageRef::Registry("busybox".into()));
        for bad in [
            "dir:../etc",
            "dir:/etc",
            "dir:",
            "oci:a/../../b",
            "oci-archive:/x.tar",
            "",
            "a b",
            "-v",
            "x//y",
            "x/../y",
            "containers-storage:",
            "x\ny",
        ] {
            let e = p(bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("image"), "{bad:?}");
        }
        assert!(p(&"a".repeat(600)).is_err());
        assert_eq!(required_labels(&p("dir:x").unwrap()), vec![CONTAINERS_LABEL]);
        assert_eq!(required_labels(&p("busybox").unwrap()), vec![CONTAINERS_LABEL, IMAGE_PULL_LABEL]);
    }

    #[test]
    fn container_options_are_checked_naming_the_field() {
        let ok = ContainerSpec {
            network: Some(Network::None),
            shm_size: Some("1Gi".into()),
            mounts: vec![ContainerMount {
                path: "/data/".into(),
                host_path: Some("/srv/data".into()),
                read_only: true,
            }],
        };
        ok.validate(4096).unwrap();
        assert_eq!(ok.shm_mib(), 1024);
        let e = ContainerSpec { shm_size: Some("8Gi".into()), ..Default::default() }.validate(4096).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("container.shm_size"));
        for (path, host) in [("/proc/x", None), ("rel", None), ("/a/../b", None), ("/", None), ("/dev/shm", None)] {
            let c = ContainerSpec {
                mounts: vec![ContainerMount { path: path.into(), host_path: host, read_only: false }],
                ..Default::default()
            };
            assert_eq!(c.validate(4096).unwrap_err().field.as_deref(), Some("container.mounts[0].path"), "{path}");
        }
        let c = ContainerSpec {
            mounts: vec![ContainerMount { path: "/d".into(), host_path: Some("srv/../x".into()), read_only: false }],
            ..Default::default()
        };
        assert_eq!(c.validate(4096).unwrap_err().field.as_deref(), Some("container.mounts[0].host_path"));
        assert_eq!(ContainerSpec::default().shm_mib(), DEFAULT_SHM_MIB);
    }
}
