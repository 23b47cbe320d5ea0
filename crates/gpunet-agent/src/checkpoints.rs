//! Tiered checkpoints. Every `every`, if the job's checkpoint directory changed, the agent copies it to each due tier
//! as a snapshot `job-J/rank-R/TIER/TIMESTAMP/…`, then prunes the tier to its newest `keep` snapshots. A new
//! attempt whose checkpoint directory is empty (a restart on another node) gets the newest snapshot of any tier
//! copied back before its process starts. Tiers are `file:///…` (a directory, e.g. a shared mount) or
//! `s3://bucket/prefix` (`object_store`); a tier without URL lives on the node's disk.
//!
//! The checkpoint directory belongs to the job. Directories are read, and `file://` tiers written and pruned, only
//! through [`crate::beneath`] (openat2 beneath a directory descriptor, no symlink ever followed). Symlinks, devices,
//! fifos, sockets, hard links and files the copier may not read are skipped and reported; tier files are 0600 and
//! directories 0700.
//!
//! The work comes in two steps so that the copier can drop privileges between them (see [`crate::copier`]):
//! [`open_tier`] (and opening the checkpoint directory) is done by root — it makes the tier's directory and, beneath
//! it, the job's own `job-J` directory owned by the job's user, and holds both open; [`snapshot_to`] and
//! [`restore_from`] then work beneath those descriptors and can run as the job's user. [`snapshot`] and [`restore`]
//! do both steps in one process (the agent without per-tenant identities).

use crate::beneath;
use futures_util::TryStreamExt;
use gpunet_api::agent::{CheckpointTier, TaskRef};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

/// Where a tier keeps a task's snapshots.
enum Where {
    /// A directory on this machine (`file:///…` or the node's disk): the descriptor of the job's directory
    /// (`…/job-J`) and the parts of the task's prefix beneath it (`rank-R/TIER`). Everything in it is done through
    /// [`beneath`]: no symlink is followed.
    Local { root: Arc<OwnedFd>, prefix: Vec<String> },
    /// An object store (S3).
    Object { store: Arc<dyn ObjectStore>, prefix: ObjPath },
}

/// A tier opened for one task (see [`open_tier`]).
pub struct Tier {
    name: String,
    at: Where,
    keep: usize,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier").field("name", &self.name).field("keep", &self.keep).finish_non_exhaustive()
    }
}

fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The agent's S3 settings: its `AWS_*` environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
/// `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, …).
pub fn aws_env() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).collect()
}

/// Makes (0700, owned by `owner` when given) and opens the job's directory `job-J` beneath a tier's directory. An
/// existing one must belong to `owner`: a job never writes into a directory of another user's.
fn job_dir(base: &OwnedFd, t: &TaskRef, tier: &str, owner: Option<(u32, u32)>) -> Result<OwnedFd, String> {
    let name = format!("job-{}", t.job);
    let d = beneath::make_dirs(base, &[&name], owner)
        .map_err(|e| err(format_args!("checkpoint tier {tier}: make {name} (symlinks are not followed)"), e))?;
    if let Some((u, _)) = owner {
        let st = rustix::fs::fstat(&d).map_err(|e| err(format_args!("checkpoint tier {tier}: stat {name}"), e))?;
        if st.st_uid != u {
            return Err(format!("checkpoint tier {tier}: {name} belongs to uid {}, not the job's uid {u}", st.st_uid));
        }
    }
    Ok(d)
}

/// Opens a tier for task `t`. For a tier on this machine (`file://` or the node's disk under `local_root`) the
/// tier's directory is made where missing (root's, 0700) and the job's directory `job-J` beneath it (0700, owned by
/// `owner`, the job's user, when given), and the latter is held open: whoever uses the [`Tier`] afterwards (the job's
/// user) works beneath that descriptor and needs no right on the directories above it. `aws` configures S3 tiers
/// (see [`aws_env`]). Needs root when `owner` is given.
pub fn open_tier(
    tier: &CheckpointTier,
    local_root: &Path,
    t: &TaskRef,
    aws: &[(String, String)],
    owner: Option<(u32, u32)>,
) -> Result<Tier, String> {
    let keep = tier.keep.max(1) as usize;
    if !beneath::plain_name(&tier.name) {
        return Err(format!("checkpoint tier name {:?}: not a plain name", tier.name));
    }
    let prefix = vec![format!("rank-{}", t.rank), tier.name.clone()];
    let name = tier.name.clone();
    let Some(url) = &tier.url else {
        std::fs::create_dir_all(local_root).map_err(|e| err(format_args!("create {}", local_root.display()), e))?;
        let base =
            beneath::open_trusted(local_root).map_err(|e| err(format_args!("open {}", local_root.display()), e))?;
        let root = job_dir(&base, t, &tier.name, owner)?;
        return Ok(Tier { name, at: Where::Local { root: Arc::new(root), prefix }, keep });
    };
    if let Some(path) = url.strip_prefix("file://") {
        // The server confined the URL beneath an admin's root; here no part may be `..` or a symlink either (the
        // admin's root must be a path without symlinks).
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if !path.starts_with('/') || parts.iter().any(|p| !beneath::plain_name(p) || p.contains('%')) {
            return Err(format!("checkpoint tier {} url {url:?}: not a plain absolute path", tier.name));
        }
        let slash = beneath::open_trusted(Path::new("/")).map_err(|e| err("open /", e))?;
        let base = beneath::make_dirs(&slash, &parts, None).map_err(|e| {
            err(format_args!("checkpoint tier {} url {url:?} (symlinks are not followed)", tier.name), e)
        })?;
        let root = job_dir(&base, t, &tier.name, owner)?;
        return Ok(Tier { name, at: Where::Local { root: Arc::new(root), prefix }, keep });
    }
    let parsed = url::Url::parse(url).map_err(|e| format!("checkpoint tier {} url {url:?}: {e}", tier.name))?;
    if parsed.scheme() != "s3" {
        return Err(format!("checkpoint tier {} url {url:?}: only file:// and s3:// tiers", tier.name));
    }
    let env = aws.iter().filter(|(k, _)| k.starts_with("AWS_")).map(|(k, v)| (k.to_ascii_lowercase(), v.clone()));
    let (store, base) = object_store::parse_url_opts(&parsed, env)
        .map_err(|e| format!("checkpoint tier {} url {url:?}: {e}", tier.name))?;
    let prefix = [format!("job-{}", t.job)].iter().chain(&prefix).fold(base, |p, part| p.join(part.as_str()));
    Ok(Tier { name, at: Where::Object { store: Arc::from(store), prefix }, keep })
}

/// Opens a directory (the job's checkpoint directory): only its last component must not be a symlink.
pub fn open_dir(dir: &Path) -> Result<OwnedFd, String> {
    beneath::open_trusted(dir).map_err(|e| err(format_args!("open {}", dir.display()), e))
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| err("file work", e))?
}

/// The regular files under `dir` (see [`beneath::walk`]: symlinks, devices, fifos and hard links are skipped and
/// listed in `skipped`).
pub fn walk(dir: &Path) -> std::io::Result<beneath::Walk> {
    beneath::walk(&beneath::open_trusted(dir)?)
}

/// A fingerprint of the directory's contents (names, sizes, modification times).
pub fn fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for e in walk(dir).map(|w| w.files).unwrap_or_default() {
        e.hash(&mut h);
    }
    h.finish()
}

/// Snapshot timestamps of a tier, oldest first.
async fn snapshots(t: &Tier) -> Result<Vec<u64>, String> {
    let mut v: Vec<u64> = match &t.at {
        Where::Local { root, prefix } => {
            let (root, prefix) = (root.clone(), prefix.clone());
            blocking(move || {
                let parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
                match beneath::open_dir(&root, &parts) {
                    Ok(d) => beneath::names(&d).map_err(|e| err("list snapshots", e)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                    Err(e) => Err(err("open the tier", e)),
                }
            })
            .await?
            .iter()
            .filter_map(|n| n.parse::<u64>().ok())
            .collect()
        }
        Where::Object { store, prefix } => {
            let list = store.list_with_delimiter(Some(prefix)).await.map_err(|e| e.to_string())?;
            list.common_prefixes.iter().filter_map(|p| p.filename().and_then(|f| f.parse::<u64>().ok())).collect()
        }
    };
    v.sort_unstable();
    Ok(v)
}

/// The default of the most bytes one snapshot may write to a tier (the agent's `--checkpoint-snapshot-max-bytes`):
/// data bytes for a tier on a filesystem (holes are kept and cost nothing), every byte for an object store. A
/// snapshot over it fails (and what it wrote is removed), so a job cannot fill a tier, or the node's disk, with
/// copies of a file it made huge.
pub const DEFAULT_SNAPSHOT_MAX_BYTES: u64 = 64 << 30;

/// Parts of an object-store upload: a file up to one part is one `put`, a longer one a multipart upload with at
/// most two parts in flight (the copier's memory holds no more of it).
const UPLOAD_PART: usize = 8 << 20;

/// Opens a file of the checkpoint directory: `Ok(None)` when it is gone meanwhile or may not be read (a file of
/// another user's placed there: the copier runs as the job's user, so that fails with EACCES, and it is skipped).
fn open_source(src: &OwnedFd, rel: &str) -> Result<Option<std::fs::File>, String> {
    match beneath::open_file(src, rel) {
        Ok(f) => Ok(Some(f)),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => Ok(None),
        Err(e) => Err(err(format_args!("read {rel}"), e)),
    }
}

/// Uploads the file `f` to `obj`, streaming (see [`UPLOAD_PART`]); every byte is taken from `budget`.
async fn upload(store: &Arc<dyn ObjectStore>, obj: &ObjPath, f: std::fs::File, budget: &mut u64) -> Result<(), String> {
    use std::io::Read as _;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len > *budget {
        return Err(beneath::over_budget(obj.as_ref()).to_string());
    }
    *budget -= len;
    let read_part = |mut f: std::fs::File| {
        blocking(move || {
            // One part's size (or the file's) at once: grown by doubling, each part would leave a trail of freed
            // smaller buffers that an allocator may keep (the copier's peak memory is bounded,
            // `tests/checkpoint_copier.rs`).
            let mut part = Vec::with_capacity(UPLOAD_PART.min(usize::try_from(len).unwrap_or(UPLOAD_PART)));
            (&mut f).take(UPLOAD_PART as u64).read_to_end(&mut part).map_err(|e| e.to_string())?;
            Ok((f, part))
        })
    };
    let (f, first) = read_part(f).await?;
    if first.len() < UPLOAD_PART {
        store.put(obj, PutPayload::from(first)).await.map_err(|e| e.to_string())?;
        return Ok(());
    }
    let up = store.put_multipart(obj).await.map_err(|e| e.to_string())?;
    let mut w = object_store::WriteMultipart::new_with_chunk_size(up, UPLOAD_PART);
    let (mut f, mut part) = (f, first);
    let mut sent = 0u64;
    loop {
        if part.is_empty() {
            break;
        }
        sent += part.len() as u64;
        if sent > len {
            // Grew while copied: only what the budget was charged for.
            let _ = w.abort().await;
            return Err(format!("{obj}: grew while copied"));
        }
        if let Err(e) = w.wait_for_capacity(2).await {
            let _ = w.abort().await;
            return Err(e.to_string());
        }
        w.put(part.into());
        (f, part) = read_part(f).await?;
    }
    w.finish().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Copies `dir` to the tier as a snapshot taken at `at_ms`, then prunes old snapshots, in this process (see
/// [`snapshot_to`]).
pub async fn snapshot(
    tier: &CheckpointTier,
    local_root: &Path,
    t: &TaskRef,
    dir: &Path,
    at_ms: u64,
    max_bytes: u64,
) -> Result<Vec<String>, String> {
    let tr = open_tier(tier, local_root, t, &aws_env(), None)?;
    snapshot_to(&tr, Arc::new(open_dir(dir)?), at_ms, max_bytes).await
}

/// Copies the directory `src` to the tier as a snapshot taken at `at_ms`, then prunes old snapshots. Files are read
/// without following symlinks; what was skipped (symlinks, devices, fifos, hard links, files that may not be read)
/// is returned. Files are read and written with this process's rights, streamed (never a whole file in memory),
/// holes kept on a filesystem tier; a snapshot that would write more than `max_bytes` fails and is removed.
pub async fn snapshot_to(tr: &Tier, src: Arc<OwnedFd>, at_ms: u64, max_bytes: u64) -> Result<Vec<String>, String> {
    let mut found = {
        let src = src.clone();
        blocking(move || beneath::walk(&src).map_err(|e| err("list the checkpoint directory", e))).await?
    };
    let ts = format!("{at_ms:020}");
    let unreadable = |rel: &str| format!("{rel} (not readable by the copier)");
    match &tr.at {
        Where::Local { root, prefix } => {
            let (root, prefix, files, src, ts) = (root.clone(), prefix.clone(), found.files.clone(), src.clone(), ts);
            let name = tr.name.clone();
            let skipped = blocking(move || {
                let mut parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
                parts.push(&ts);
                let snap = beneath::make_dirs(&root, &parts, None).map_err(|e| err("make the snapshot", e))?;
                let mut skipped = Vec::new();
                let mut budget = max_bytes;
                for f in &files {
                    let Some(from) = open_source(&src, &f.rel)? else {
                        skipped.push(unreadable(&f.rel));
                        continue;
                    };
                    let copied = beneath::create_file(&snap, &f.rel, None)
                        .and_then(|to| beneath::copy_sparse(&from, &to, &mut budget));
                    if let Err(e) = copied {
                        // Nothing half-written stays in the tier.
                        drop(snap);
                        let tier_dir = beneath::open_dir(&root, &parts[..parts.len() - 1]);
                        if let Ok(d) = tier_dir {
                            let _ = beneath::remove(&d, &ts);
                        }
                        let why = if e.kind() == std::io::ErrorKind::FileTooLarge {
                            format!("the snapshot would write over {max_bytes} bytes")
                        } else {
                            e.to_string()
                        };
                        return Err(format!("copy {} to tier {name}: {why}", f.rel));
                    }
                }
                Ok(skipped)
            })
            .await?;
            found.skipped.extend(skipped);
        }
        Where::Object { store, prefix } => {
            let snap = prefix.clone().join(ts.as_str());
            let mut budget = max_bytes;
            for f in &found.files {
                let (src2, rel) = (src.clone(), f.rel.clone());
                let Some(from) = blocking(move || open_source(&src2, &rel)).await? else {
                    found.skipped.push(unreadable(&f.rel));
                    continue;
                };
                let obj = f.rel.split('/').fold(snap.clone(), |o, part| o.join(part));
                if let Err(e) = upload(store, &obj, from, &mut budget).await {
                    // Nothing half-written stays in the tier.
                    if let Ok(objs) = store.list(Some(&snap)).map_ok(|m| m.location).try_collect::<Vec<_>>().await {
                        for o in objs {
                            let _ = store.delete(&o).await;
                        }
                    }
                    return Err(format!("copy {} to tier {}: {e}", f.rel, tr.name));
                }
            }
        }
    }
    let all = snapshots(tr).await?;
    for old in all.iter().take(all.len().saturating_sub(tr.keep)) {
        let old = format!("{old:020}");
        match &tr.at {
            Where::Local { root, prefix } => {
                let (root, prefix) = (root.clone(), prefix.clone());
                blocking(move || {
                    let parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
                    let d = beneath::open_dir(&root, &parts).map_err(|e| err("open the tier", e))?;
                    beneath::remove(&d, &old).map_err(|e| err(format_args!("prune {old}"), e))
                })
                .await?;
            }
            Where::Object { store, prefix } => {
                let p = prefix.clone().join(old.as_str());
                let objs: Vec<_> =
                    store.list(Some(&p)).map_ok(|m| m.location).try_collect().await.map_err(|e| e.to_string())?;
                for o in objs {
                    let _ = store.delete(&o).await;
                }
            }
        }
    }
    Ok(found.skipped)
}

/// Restores the newest snapshot over all tiers into `dir`, in this process (files 0600 owned by `owner` when given,
/// never written through a symlink); returns its timestamp, or `None` when there is none.
pub async fn restore(
    tiers: &[CheckpointTier],
    local_root: &Path,
    t: &TaskRef,
    dir: &Path,
    owner: Option<(u32, u32)>,
) -> Result<Option<u64>, String> {
    let aws = aws_env();
    let opened = tiers.iter().map(|tier| open_tier(tier, local_root, t, &aws, None)).collect::<Result<Vec<_>, _>>()?;
    restore_from(opened, Arc::new(open_dir(dir)?), owner).await
}

/// Restores the newest snapshot over all `tiers` into the directory `dst` (files 0600, owned by `owner` when given,
/// else by this process's user; never written through a symlink); returns its timestamp, or `None` when there is
/// none.
pub async fn restore_from(
    tiers: Vec<Tier>,
    dst: Arc<OwnedFd>,
    owner: Option<(u32, u32)>,
) -> Result<Option<u64>, String> {
    let mut best: Option<(u64, Tier)> = None;
    for tr in tiers {
        if let Some(&ts) = snapshots(&tr).await.unwrap_or_default().last() {
            if best.as_ref().is_none_or(|(b, _)| ts > *b) {
                best = Some((ts, tr));
            }
        }
    }
    let Some((ts, tr)) = best else { return Ok(None) };
    let name = format!("{ts:020}");
    match &tr.at {
        Where::Local { root, prefix } => {
            let (root, prefix) = (root.clone(), prefix.clone());
            blocking(move || {
                let mut parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
                parts.push(&name);
                let snap = beneath::open_dir(&root, &parts).map_err(|e| err("open the snapshot", e))?;
                for f in beneath::walk(&snap).map_err(|e| err("list the snapshot", e))?.files {
                    // The tier's snapshots were bounded when written; streamed and sparse all the same.
                    let mut unbounded = u64::MAX;
                    beneath::copy_file(&snap, &f.rel, &dst, &f.rel, owner, &mut unbounded)
                        .map_err(|e| err(format_args!("restore {}", f.rel), e))?;
                }
                Ok(())
            })
            .await?;
        }
        Where::Object { store, prefix } => {
            let snap = prefix.clone().join(name.as_str());
            let objs: Vec<_> =
                store.list(Some(&snap)).map_ok(|m| m.location).try_collect().await.map_err(|e| e.to_string())?;
            for o in objs {
                let rel: Vec<String> = o
                    .prefix_match(&snap)
                    .map(|parts| parts.map(|p| p.as_ref().to_string()).collect())
                    .unwrap_or_default();
                if rel.is_empty() {
                    continue;
                }
                let (dst2, rel) = (dst.clone(), rel.join("/"));
                let mut to = blocking(move || {
                    beneath::create_file(&dst2, &rel, owner).map_err(|e| err(format_args!("restore {rel}"), e))
                })
                .await?;
                // Streamed: one chunk of the object in memory at a time.
                let mut chunks = store.get(&o).await.map_err(|e| e.to_string())?.into_stream();
                while let Some(chunk) = chunks.try_next().await.map_err(|e| e.to_string())? {
                    to = blocking(move || {
                        use std::io::Write as _;
                        to.write_all(&chunk).map_err(|e| err("restore", e))?;
                        Ok(to)
                    })
                    .await?;
                }
            }
        }
    }
    Ok(Some(ts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn snapshots_are_pruned_and_the_newest_is_restored() {
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        let tiers = vec![
            CheckpointTier { name: "local".into(), every_ms: 100, keep: 1, url: None },
            CheckpointTier {
                name: "shared".into(),
                every_ms: 100,
                keep: 2,
                url: Some(format!("file://{}", shared.display())),
            },
        ];
        let t = TaskRef { job: 7, rank: 0, attempt: 0 };
        let src = root.path().join("ckpt");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        for (i, at) in [100u64, 200, 300].into_iter().enumerate() {
            std::fs::write(src.join("state"), format!("step-{i}")).unwrap();
            std::fs::write(src.join("sub/w.bin"), vec![i as u8; 10]).unwrap();
            for tier in &tiers {
                snapshot(tier, &root.path().join("node"), &t, &src, at, DEFAULT_SNAPSHOT_MAX_BYTES).await.unwrap();
            }
        }
        let kept = |p: &Path| std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0);
        assert_eq!(kept(&shared.join("job-7/rank-0/shared")), 2, "keep 2");
        assert_eq!(kept(&root.path().join("node/job-7/rank-0/local")), 1, "keep 1");
        let dst = root.path().join("restored");
        std::fs::create_dir_all(&dst).unwrap();
        assert_eq!(restore(&tiers, &root.path().join("elsewhere"), &t, &dst, None).await.unwrap(), Some(300));
        assert_eq!(std::fs::read_to_string(dst.join("state")).unwrap(), "step-2");
        assert_eq!(std::fs::read(dst.join("sub/w.bin")).unwrap(), vec![2u8; 10]);
        let none = TaskRef { job: 8, rank: 0, attempt: 0 };
        assert_eq!(restore(&tiers, &root.path().join("node"), &none, &dst, None).await.unwrap(), None);
        let fp = fingerprint(&src);
        assert_eq!(fp, fingerprint(&src));
        std::fs::write(src.join("state"), "changed!").unwrap();
        assert_ne!(fp, fingerprint(&src));
    }

    #[tokio::test]
    async fn copies_and_pruning_never_follow_symlinks_a_job_planted() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        let outside = root.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "root only").unwrap();
        std::fs::set_permissions(outside.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(outside.join("victim"), "keep me").unwrap();
        let tier = CheckpointTier {
            name: "shared".into(),
            every_ms: 100,
            keep: 1,
            url: Some(format!("file://{}", shared.display())),
        };
        let t = TaskRef { job: 7, rank: 0, attempt: 0 };
        let src = root.path().join("ckpt");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("state"), "step-1").unwrap();
        symlink(outside.join("secret"), src.join("leak")).unwrap();
        symlink(&outside, src.join("dir")).unwrap();
        let skipped = snapshot(&tier, root.path(), &t, &src, 100, DEFAULT_SNAPSHOT_MAX_BYTES).await.unwrap();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        let snaps = shared.join("job-7/rank-0/shared");
        let first = snaps.join(format!("{:020}", 100));
        assert_eq!(std::fs::read_to_string(first.join("state")).unwrap(), "step-1");
        assert!(!first.join("leak").exists() && !first.join("dir").exists(), "symlinks are not copied");
        let m = std::fs::metadata(first.join("state")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&first).unwrap().permissions().mode() & 0o777, 0o700);
        // Symlinks planted in the tier: an old "snapshot" that points elsewhere, and a link inside a snapshot.
        symlink(&outside, snaps.join(format!("{:020}", 50))).unwrap();
        symlink(outside.join("victim"), first.join("victim")).unwrap();
        snapshot(&tier, root.path(), &t, &src, 200, DEFAULT_SNAPSHOT_MAX_BYTES).await.unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("victim")).unwrap(), "keep me", "pruning followed a link");
        assert!(outside.join("secret").exists());
        let left: Vec<String> =
            std::fs::read_dir(&snaps).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(left, [format!("{:020}", 200)], "pruned to keep 1, links removed as links");
        // A tier URL with a symlink or a `..` part is refused.
        symlink(&outside, root.path().join("link")).unwrap();
        for url in
            [format!("file://{}/link/x", root.path().display()), format!("file://{}/../x", root.path().display())]
        {
            let bad = CheckpointTier { url: Some(url.clone()), ..tier.clone() };
            assert!(snapshot(&bad, root.path(), &t, &src, 300, DEFAULT_SNAPSHOT_MAX_BYTES).await.is_err(), "{url}");
        }
        assert!(!outside.join("x").exists() && !outside.join("job-7").exists());
    }

    /// A real S3 endpoint on loopback (moto's server, from PyPI): `$MOTO_SERVER` or `moto_server` on the PATH.
    fn moto() -> Option<String> {
        let exe = std::env::var("MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        std::process::Command::new(&exe).arg("--help").output().ok().filter(|o| o.status.success()).map(|_| exe)
    }

    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::test]
    async fn an_s3_tier_keeps_and_restores_snapshots() {
        let Some(exe) = moto() else {
            assert!(std::env::var_os("CI").is_none(), "the S3 tier test needs moto_server under CI");
            eprintln!("SKIPPED: no moto_server (pip install 'moto[server]', or set MOTO_SERVER)");
            return;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let _server = Kill(
            std::process::Command::new(exe)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let endpoint = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let t0 = std::time::Instant::now();
        // Create the bucket once the server answers.
        loop {
            if let Ok(r) = http.put(format!("{endpoint}/ckpt-bucket")).send().await {
                assert!(r.status().is_success(), "create bucket: {}", r.status());
                break;
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "moto_server did not start");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // The agent's environment configures S3 (this test binary reads no other AWS_* variable).
        for (k, v) in [
            ("AWS_ENDPOINT", endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "gpunet-test"),
            ("AWS_SECRET_ACCESS_KEY", "gpunet-test-secret"),
            ("AWS_REGION", "us-east-1"),
        ] {
            std::env::set_var(k, v);
        }
        let tier = CheckpointTier {
            name: "archive".into(),
            every_ms: 100,
            keep: 2,
            url: Some("s3://ckpt-bucket/team-a".into()),
        };
        let root = tempfile::tempdir().unwrap();
        let t = TaskRef { job: 3, rank: 1, attempt: 0 };
        let src = root.path().join("ckpt");
        std::fs::create_dir_all(src.join("opt")).unwrap();
        for (i, at) in [1_000u64, 2_000, 3_000].into_iter().enumerate() {
            std::fs::write(src.join("model.pt"), format!("weights-{i}")).unwrap();
            std::fs::write(src.join("opt/state"), vec![i as u8; 1 << 16]).unwrap();
            snapshot(&tier, root.path(), &t, &src, at, DEFAULT_SNAPSHOT_MAX_BYTES).await.unwrap();
        }
        // The bucket holds the two newest snapshots, under the URL's prefix.
        let list = http.get(format!("{endpoint}/ckpt-bucket?list-type=2")).send().await.unwrap().text().await.unwrap();
        assert!(list.contains("team-a/job-3/rank-1/archive/00000000000000003000/model.pt"), "{list}");
        assert!(list.contains("00000000000000002000/opt/state"), "{list}");
        assert!(!list.contains("00000000000000001000"), "pruned to keep 2: {list}");
        let dst = root.path().join("restored");
        std::fs::create_dir_all(&dst).unwrap();
        assert_eq!(restore(std::slice::from_ref(&tier), root.path(), &t, &dst, None).await.unwrap(), Some(3_000));
        assert_eq!(std::fs::read_to_string(dst.join("model.pt")).unwrap(), "weights-2");
        assert_eq!(std::fs::read(dst.join("opt/state")).unwrap(), vec![2u8; 1 << 16]);
    }
}
