//! The node's images: where a job's `image` comes from and how it becomes a root filesystem.
//!
//! - `dir:NAME`: `IMAGES/NAME/rootfs` when there is one (an unpacked bundle; its `config.json` gives the image's
//!   defaults), else `IMAGES/NAME` itself; used in place, never written (it is an overlay's lower layer).
//! - `oci:NAME[:TAG]`: the OCI layout `IMAGES/NAME`, unpacked by `umoci unpack`.
//! - `oci-archive:NAME[:TAG]`, `containers-storage:REF` and registry references: copied into a private layout by
//!   `skopeo copy`, then unpacked by `umoci unpack`.
//!
//! Unpacked images are kept in the cache (`DATA/containers/images/KEY/{rootfs,config.json}`), one per reference,
//! as Kubernetes' `IfNotPresent` does: a moving tag is not pulled again while its copy is cached (delete the
//! directory to refresh it; an OCI layout is keyed by the manifest its tag names, so a rebuilt one is unpacked
//! again). Two tasks that need the same image at once wait for one unpack (a lock file per entry: they unpack in
//! their wrappers, separate processes, so that a long pull never holds up the agent). `IMAGES` names files
//! only by a job's relative plain path (see `gpunet_api::image`), resolved here once more with symlinks followed and
//! checked to stay beneath it.

use gpunet_api::image::ImageRef;
use std::path::{Path, PathBuf};

/// The image cache and its tools.
#[derive(Debug)]
pub struct Images {
    /// The operator's image directory (canonical when it exists).
    pub dir: PathBuf,
    /// Unpacked images.
    pub cache: PathBuf,
    /// `umoci`, where installed.
    pub umoci: Option<PathBuf>,
    /// `skopeo`, where installed.
    pub skopeo: Option<PathBuf>,
}

/// What an image says about running it (from its OCI config).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Defaults {
    /// Entrypoint and command.
    pub args: Vec<String>,
    /// Environment (`PATH` above all).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// An image ready to run.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Its root filesystem (an overlay's lower layer).
    pub rootfs: PathBuf,
    /// Its defaults.
    pub defaults: Defaults,
}

/// The longest an image copy or unpack may take.
const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// A cache key of a reference: its readable part and a hash (distinct references never share an entry).
fn cache_key(reference: &str) -> String {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    reference.hash(&mut h);
    let readable: String = reference
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
        .take(80)
        .collect();
    format!("{readable}-{:016x}", h.finish())
}

/// The digest of the manifest tagged `tag` in the OCI layout `dir` (its `index.json`).
fn layout_digest(dir: &Path, tag: &str) -> Option<String> {
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).ok()?).ok()?;
    index["manifests"].as_array()?.iter().find_map(|m| {
        (m["annotations"]["org.opencontainers.image.ref.name"].as_str() == Some(tag))
            .then(|| m["digest"].as_str().map(String::from))
            .flatten()
    })
}

/// The image's defaults from an OCI runtime `config.json` (what `umoci unpack` writes).
fn read_defaults(config: &Path) -> Defaults {
    let Ok(text) = std::fs::read_to_string(config) else { return Defaults::default() };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let p = &v["process"];
    let strs = |x: &serde_json::Value| -> Vec<String> {
        x.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
    };
    Defaults {
        args: strs(&p["args"]),
        env: strs(&p["env"])
            .into_iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect(),
        cwd: p["cwd"].as_str().filter(|c| c.starts_with('/')).map(String::from),
    }
}

/// Runs a tool to the end (at most [`FETCH_TIMEOUT`], then it is killed); its error output becomes the error.
fn run_tool(what: &str, cmd: &mut std::process::Command) -> Result<(), String> {
    use std::io::Read as _;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let t = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t.elapsed() > FETCH_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: gave up after {} s", FETCH_TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    };
    let err = reader.join().unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    let err: String = err.trim().chars().take(2000).collect();
    Err(format!("{what} failed ({status}): {err}"))
}

impl Images {
    /// The images of `dir` (the operator's image directory) unpacked into `cache`.
    pub fn new(dir: PathBuf, cache: PathBuf) -> Result<Images, String> {
        std::fs::create_dir_all(&cache).map_err(|e| format!("make {}: {e}", cache.display()))?;
        let dir = dir.canonicalize().unwrap_or(dir);
        Ok(Images { dir, cache, umoci: super::find_program("umoci"), skopeo: super::find_program("skopeo") })
    }

    /// `IMAGES/name`, checked to stay beneath `IMAGES` once symlinks are followed.
    fn beneath(&self, name: &str) -> Result<PathBuf, String> {
        let p = self.dir.join(name);
        let real = p.canonicalize().map_err(|e| format!("image {name:?}: {} : {e}", p.display()))?;
        if !real.starts_with(&self.dir) || real == self.dir {
            return Err(format!("image {name:?} leads outside the node's image directory {}", self.dir.display()));
        }
        Ok(real)
    }

    /// Makes `image` ready to run: unpacked (or found) and its defaults read. Blocking (an unpack may take minutes):
    /// the wrapper calls it, never the agent's loop.
    pub fn prepare(&self, reference: &str) -> Result<Prepared, String> {
        let image = ImageRef::parse("image", reference).map_err(|e| e.to_string())?;
        if let ImageRef::Rootfs(name) = &image {
            let dir = self.beneath(name)?;
            let (rootfs, defaults) = if dir.join("rootfs").is_dir() {
                (dir.join("rootfs"), read_defaults(&dir.join("config.json")))
            } else {
                (dir, Defaults::default())
            };
            if !rootfs.is_dir() {
                return Err(format!("image {reference:?}: {} is not a directory", rootfs.display()));
            }
            return Ok(Prepared { rootfs, defaults });
        }
        // A layout is keyed by the manifest its tag names now: a layout rebuilt under the same tag is unpacked again.
        let key = match &image {
            ImageRef::OciLayout { path, tag } => {
                let digest = layout_digest(&self.beneath(path)?, tag)
                    .ok_or_else(|| format!("image {reference:?}: no manifest tagged {tag:?} in its layout"))?;
                cache_key(&format!("{reference}@{digest}"))
            }
            _ => cache_key(reference),
        };
        let entry = self.cache.join(&key);
        let ready = |e: &Path| e.join("rootfs").is_dir() && e.join("config.json").is_file();
        if ready(&entry) {
            return Ok(Prepared { rootfs: entry.join("rootfs"), defaults: read_defaults(&entry.join("config.json")) });
        }
        // One unpack of an entry at a time, across the wrappers of all tasks (the lock goes with the descriptor).
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.cache.join(format!("{key}.lock")))
            .map_err(|e| format!("image {reference:?}: lock the cache: {e}"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| format!("image {reference:?}: lock the cache: {e}"))?;
        if !ready(&entry) {
            self.unpack(&image, reference, &entry)?;
        }
        Ok(Prepared { rootfs: entry.join("rootfs"), defaults: read_defaults(&entry.join("config.json")) })
    }

    /// Copies (where needed) and unpacks an image into `entry`, through a temporary directory renamed at the end.
    fn unpack(&self, image: &ImageRef, reference: &str, entry: &Path) -> Result<(), String> {
        let umoci = self.umoci.as_ref().ok_or_else(|| format!("image {reference:?}: umoci is not installed"))?;
        let tmp = entry.with_extension(format!("tmp-{}", std::process::id()));
        let layout_tmp = entry.with_extension(format!("layout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let _ = std::fs::remove_dir_all(&layout_tmp);
        let started = std::time::Instant::now();
        let result = (|| {
            let (layout, tag) = match image {
                ImageRef::OciLayout { path, tag } => (self.beneath(path)?, tag.clone()),
                other => {
                    let skopeo =
                        self.skopeo.as_ref().ok_or_else(|| format!("image {reference:?}: skopeo is not installed"))?;
                    let src = match other {
                        ImageRef::OciArchive { path, tag } => {
                            format!("oci-archive:{}:{tag}", self.beneath(path)?.display())
                        }
                        ImageRef::LocalStore(r) => format!("containers-storage:{r}"),
                        ImageRef::Registry(r) => format!("docker://{r}"),
                        _ => unreachable!("handled above"),
                    };
                    let dst = format!("oci:{}:img", layout_tmp.display());
                    run_tool(
                        &format!("skopeo copy {src}"),
                        std::process::Command::new(skopeo).args(["copy", "--quiet", &src, &dst]),
                    )?;
                    (layout_tmp.clone(), "img".to_string())
                }
            };
            let from = format!("{}:{tag}", layout.display());
            run_tool(
                &format!("umoci unpack {from}"),
                std::process::Command::new(umoci).arg("unpack").arg("--image").arg(&from).arg(&tmp),
            )?;
            std::fs::rename(&tmp, entry).map_err(|e| format!("keep the unpacked image: {e}"))
        })();
        let _ = std::fs::remove_dir_all(&layout_tmp);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        } else {
            tracing::info!(image = reference, ms = started.elapsed().as_millis() as u64, "image unpacked");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_readable_distinct_and_plain_names() {
        let a = cache_key("nvcr.io/nvidia/pytorch:22.07-py3");
        assert!(a.starts_with("nvcr.io_nvidia_pytorch_22.07-py3-"), "{a}");
        assert_ne!(a, cache_key("nvcr.io/nvidia/pytorch_22.07-py3"));
        assert!(!a.contains('/') && a.len() < 120);
    }

    #[test]
    fn a_rootfs_image_is_found_only_beneath_the_image_directory() {
        let d = tempfile::tempdir().unwrap();
        let images = d.path().join("images");
        std::fs::create_dir_all(images.join("tiny/bin")).unwrap();
        std::fs::create_dir_all(images.join("bundle/rootfs")).unwrap();
        std::fs::write(
            images.join("bundle/config.json"),
            r#"{"process": {"args": ["/bin/sh"], "env": ["PATH=/opt/bin:/bin"], "cwd": "/work"}}"#,
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("secret")).unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), images.join("escape")).unwrap();
        let i = Images::new(images.clone(), d.path().join("cache")).unwrap();
        let p = i.prepare("dir:tiny").unwrap();
        assert_eq!(p.rootfs, images.canonicalize().unwrap().join("tiny"));
        assert_eq!(p.defaults, Defaults::default());
        let p = i.prepare("dir:bundle").unwrap();
        assert!(p.rootfs.ends_with("bundle/rootfs"));
        assert_eq!(p.defaults.args, ["/bin/sh"]);
        assert_eq!(p.defaults.env, [("PATH".to_string(), "/opt/bin:/bin".to_string())]);
        assert_eq!(p.defaults.cwd.as_deref(), Some("/work"));
        let e = i.prepare("dir:escape").unwrap_err();
        assert!(e.contains("outside the node's image directory"), "{e}");
        assert!(i.prepare("dir:../secret").is_err());
        assert!(i.prepare("dir:missing").is_err());
    }
}
