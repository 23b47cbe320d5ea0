//! Tiered checkpoints. Every `every`, if the job's checkpoint directory changed, the agent copies it to each due tier
//! as a snapshot `job-J/rank-R/TIER/TIMESTAMP/…`, then prunes the tier to its newest `keep` snapshots. A new
//! attempt whose checkpoint directory is empty (a restart on another node) gets the newest snapshot of any tier
//! copied back before its process starts. Tiers are object stores (`object_store`): `file:///…` (a directory, e.g.
//! a shared mount) or `s3://bucket/prefix`; a tier without URL lives on the node's disk.

use futures_util::TryStreamExt;
use gpunet_api::agent::{CheckpointTier, TaskRef};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A tier's store and the prefix of a task's snapshots in it.
struct Tier {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    keep: usize,
    /// A `file://` tier: object paths are absolute paths without the leading `/`.
    local: bool,
}

fn open(tier: &CheckpointTier, local_root: &Path, t: &TaskRef) -> Result<Tier, String> {
    let url = match &tier.url {
        Some(u) => u.clone(),
        None => format!("file://{}", local_root.display()),
    };
    let parsed = url::Url::parse(&url).map_err(|e| format!("checkpoint tier {} url {url:?}: {e}", tier.name))?;
    if parsed.scheme() == "file" {
        std::fs::create_dir_all(parsed.path()).map_err(|e| format!("create {}: {e}", parsed.path()))?;
    }
    // S3 (and S3-compatible stores) take credentials, region and endpoint from the agent's AWS_* environment
    // (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT, AWS_ALLOW_HTTP, …).
    let env = std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).map(|(k, v)| (k.to_ascii_lowercase(), v));
    let (store, base) = object_store::parse_url_opts(&parsed, env)
        .map_err(|e| format!("checkpoint tier {} url {url:?}: {e}", tier.name))?;
    let prefix = base.clone().join(format!("job-{}", t.job)).join(format!("rank-{}", t.rank)).join(tier.name.clone());
    Ok(Tier { store: Arc::from(store), prefix, keep: tier.keep.max(1) as usize, local: parsed.scheme() == "file" })
}

/// Files under `dir` with their relative paths.
pub fn files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push((p.clone(), rel.to_string_lossy().into_owned()));
            }
        }
    }
    out.sort();
    out
}

/// A fingerprint of the directory's contents (names, sizes, modification times).
pub fn fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (p, rel) in files(dir) {
        rel.hash(&mut h);
        if let Ok(m) = std::fs::metadata(&p) {
            m.len().hash(&mut h);
            m.modified().ok().hash(&mut h);
        }
    }
    h.finish()
}

/// Snapshot timestamps of a tier, oldest first.
async fn snapshots(t: &Tier) -> Result<Vec<u64>, String> {
    let list = t.store.list_with_delimiter(Some(&t.prefix)).await.map_err(|e| e.to_string())?;
    let mut v: Vec<u64> =
        list.common_prefixes.iter().filter_map(|p| p.filename().and_then(|f| f.parse::<u64>().ok())).collect();
    v.sort_unstable();
    Ok(v)
}

/// Copies `dir` to the tier as a snapshot taken at `at_ms`, then prunes old snapshots.
pub async fn snapshot(
    tier: &CheckpointTier,
    local_root: &Path,
    t: &TaskRef,
    dir: &Path,
    at_ms: u64,
) -> Result<(), String> {
    let tr = open(tier, local_root, t)?;
    let snap = tr.prefix.clone().join(format!("{at_ms:020}"));
    for (p, rel) in files(dir) {
        let data = tokio::fs::read(&p).await.map_err(|e| format!("read {}: {e}", p.display()))?;
        let mut obj = snap.clone();
        for part in rel.split('/') {
            obj = obj.join(part);
        }
        tr.store
            .put(&obj, PutPayload::from(data))
            .await
            .map_err(|e| format!("copy {rel} to tier {}: {e}", tier.name))?;
    }
    let all = snapshots(&tr).await?;
    for old in all.iter().take(all.len().saturating_sub(tr.keep)) {
        let p = tr.prefix.clone().join(format!("{old:020}"));
        let objs: Vec<_> =
            tr.store.list(Some(&p)).map_ok(|m| m.location).try_collect().await.map_err(|e| e.to_string())?;
        for o in objs {
            let _ = tr.store.delete(&o).await;
        }
        if tr.local {
            // The local store leaves the emptied directories; a snapshot is a directory there.
            let _ = std::fs::remove_dir_all(format!("/{p}"));
        }
    }
    Ok(())
}

/// Restores the newest snapshot over all tiers into `dir`; returns its timestamp, or `None` when there is none.
pub async fn restore(
    tiers: &[CheckpointTier],
    local_root: &Path,
    t: &TaskRef,
    dir: &Path,
) -> Result<Option<u64>, String> {
    let mut best: Option<(u64, Tier)> = None;
    for tier in tiers {
        let tr = open(tier, local_root, t)?;
        if let Some(&ts) = snapshots(&tr).await.unwrap_or_default().last() {
            if best.as_ref().is_none_or(|(b, _)| ts > *b) {
                best = Some((ts, tr));
            }
        }
    }
    let Some((ts, tr)) = best else { return Ok(None) };
    let snap = tr.prefix.clone().join(format!("{ts:020}"));
    let objs: Vec<_> =
        tr.store.list(Some(&snap)).map_ok(|m| m.location).try_collect().await.map_err(|e| e.to_string())?;
    for o in objs {
        let rel: Vec<String> =
            o.prefix_match(&snap).map(|parts| parts.map(|p| p.as_ref().to_string()).collect()).unwrap_or_default();
        if rel.is_empty() {
            continue;
        }
        let target = rel.iter().fold(dir.to_path_buf(), |p, r| p.join(r));
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(|e| e.to_string())?;
        }
        let bytes = tr.store.get(&o).await.map_err(|e| e.to_string())?.bytes().await.map_err(|e| e.to_string())?;
        tokio::fs::write(&target, &bytes).await.map_err(|e| format!("write {}: {e}", target.display()))?;
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
                snapshot(tier, &root.path().join("node"), &t, &src, at).await.unwrap();
            }
        }
        let kept = |p: &Path| std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0);
        assert_eq!(kept(&shared.join("job-7/rank-0/shared")), 2, "keep 2");
        assert_eq!(kept(&root.path().join("node/job-7/rank-0/local")), 1, "keep 1");
        let dst = root.path().join("restored");
        std::fs::create_dir_all(&dst).unwrap();
        assert_eq!(restore(&tiers, &root.path().join("elsewhere"), &t, &dst).await.unwrap(), Some(300));
        assert_eq!(std::fs::read_to_string(dst.join("state")).unwrap(), "step-2");
        assert_eq!(std::fs::read(dst.join("sub/w.bin")).unwrap(), vec![2u8; 10]);
        let none = TaskRef { job: 8, rank: 0, attempt: 0 };
        assert_eq!(restore(&tiers, &root.path().join("node"), &none, &dst).await.unwrap(), None);
        let fp = fingerprint(&src);
        assert_eq!(fp, fingerprint(&src));
        std::fs::write(src.join("state"), "changed!").unwrap();
        assert_ne!(fp, fingerprint(&src));
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
            snapshot(&tier, root.path(), &t, &src, at).await.unwrap();
        }
        // The bucket holds the two newest snapshots, under the URL's prefix.
        let list = http.get(format!("{endpoint}/ckpt-bucket?list-type=2")).send().await.unwrap().text().await.unwrap();
        assert!(list.contains("team-a/job-3/rank-1/archive/00000000000000003000/model.pt"), "{list}");
        assert!(list.contains("00000000000000002000/opt/state"), "{list}");
        assert!(!list.contains("00000000000000001000"), "pruned to keep 2: {list}");
        let dst = root.path().join("restored");
        std::fs::create_dir_all(&dst).unwrap();
        assert_eq!(restore(std::slice::from_ref(&tier), root.path(), &t, &dst).await.unwrap(), Some(3_000));
        assert_eq!(std::fs::read_to_string(dst.join("model.pt")).unwrap(), "weights-2");
        assert_eq!(std::fs::read(dst.join("opt/state")).unwrap(), vec![2u8; 1 << 16]);
    }
}
