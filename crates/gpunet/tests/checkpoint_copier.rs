//! The checkpoint copier runs as the job's user (issue 11): `gpunet checkpoint-copy` started as a real process the
//! way the agent starts it, and a real agent with `--tenant-uids`. These need root (to drop to another user); they
//! skip elsewhere, except under CI, which runs as root.

mod common;

use common::{read, submit_yaml, wait_for, Server, BIN};
use gpunet_agent::copier::{Reply, Request, Work};
use gpunet_api::agent::{CheckpointTier, TaskRef};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The job's user in the direct tests (no such account is needed).
const UID: u32 = 200_321;

fn root() -> bool {
    let me = gpunet_agent::running_as_root();
    if !me {
        assert!(std::env::var_os("CI").is_none(), "CI runs these as root");
        eprintln!("SKIPPED: not root");
    }
    me
}

/// A temporary directory other users can reach (tempdir makes it 0700).
fn reachable_tempdir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// `path`, owned by `uid`, mode `mode`.
fn own(path: &Path, uid: u32, mode: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Everything beneath `dir` (directories included), not `dir` itself.
fn everything(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// Starts the copier as the agent does (empty environment, request on stdin).
fn start_copier(req: &Request) -> std::process::Child {
    let mut child = Command::new(BIN)
        .arg("checkpoint-copy")
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&serde_json::to_vec(req).unwrap()).unwrap();
    child
}

fn reply(child: std::process::Child) -> (bool, Reply) {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let r = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} / {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.success(), r)
}

/// A job's checkpoint directory as the agent makes it (the job's user's, 0700) with the job's `state` and a
/// root-only file placed in it (as a bind mount or a careless admin would).
fn checkpoint_dir(base: &Path) -> PathBuf {
    let ckpt = base.join("ckpt");
    std::fs::create_dir_all(ckpt.join("sub")).unwrap();
    std::fs::write(ckpt.join("state"), "step-1").unwrap();
    std::fs::write(ckpt.join("sub/w.bin"), [7u8; 100]).unwrap();
    for p in [ckpt.join("state"), ckpt.join("sub/w.bin")] {
        own(&p, UID, 0o600);
    }
    own(&ckpt.join("sub"), UID, 0o700);
    own(&ckpt, UID, 0o700);
    std::fs::write(ckpt.join("root-only"), "ROOT-ONLY-SECRET").unwrap();
    own(&ckpt.join("root-only"), 0, 0o600);
    ckpt
}

fn request(work: Work, dir: &Path, local_root: &Path, aws: Vec<(String, String)>, timeout_ms: u64) -> Request {
    Request {
        work,
        task: TaskRef { job: 1, rank: 0, attempt: 0 },
        dir: dir.to_path_buf(),
        local_root: local_root.to_path_buf(),
        user: (UID, UID),
        aws,
        timeout_ms,
        max_bytes: gpunet_agent::checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
    }
}

#[test]
fn the_copier_writes_a_snapshot_and_restores_it_as_the_jobs_user_and_skips_what_the_job_cannot_read() {
    if !root() {
        return;
    }
    let dir = reachable_tempdir();
    let ckpt = checkpoint_dir(dir.path());
    // The tier's directory does not exist yet; its parent is root's 0700 (the job's user reaches its own part
    // through the descriptor the copier opened as root).
    let tiers = dir.path().join("tiers");
    std::fs::create_dir_all(&tiers).unwrap();
    own(&tiers, 0, 0o700);
    let tier = CheckpointTier {
        name: "shared".into(),
        every_ms: 100,
        keep: 1,
        url: Some(format!("file://{}/t", tiers.display())),
    };
    let local = dir.path().join("node-tiers");
    let node = CheckpointTier { name: "local".into(), every_ms: 100, keep: 1, url: None };
    for (i, t) in [&tier, &node].into_iter().enumerate() {
        let work = Work::Snapshot { tier: t.clone(), at_ms: 100 + i as u64 };
        let (ok, r) = reply(start_copier(&request(work, &ckpt, &local, vec![], 60_000)));
        assert!(ok, "{r:?}");
        assert!(
            matches!(&r, Reply::Copied { skipped, .. } if skipped == &["root-only (not readable by the copier)"]),
            "{r:?}"
        );
    }
    // The tier's own directory is root's 0700; everything beneath it the job's user's, 0700 and 0600.
    let m = std::fs::metadata(tiers.join("t")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700));
    for base in [tiers.join("t"), local.clone()] {
        let all = everything(&base);
        assert!(all.iter().any(|p| p.ends_with("state")) && all.iter().any(|p| p.ends_with("sub/w.bin")), "{all:?}");
        assert!(!all.iter().any(|p| p.ends_with("root-only")), "a file the job cannot read was copied: {all:?}");
        for p in &all {
            let m = std::fs::symlink_metadata(p).unwrap();
            let want = if m.is_dir() { 0o700 } else { 0o600 };
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (UID, UID, want), "{}", p.display());
        }
    }
    // Restore into an empty checkpoint directory (another node's): written as the job's user.
    let dst = dir.path().join("restored");
    std::fs::create_dir_all(&dst).unwrap();
    own(&dst, UID, 0o700);
    let work = Work::Restore { tiers: vec![tier.clone()] };
    let (ok, r) = reply(start_copier(&request(work, &dst, &dir.path().join("elsewhere"), vec![], 60_000)));
    assert!(ok, "{r:?}");
    assert_eq!(r, Reply::Restored { snapshot: Some(100) });
    assert_eq!(std::fs::read_to_string(dst.join("state")).unwrap(), "step-1");
    let all = everything(&dst);
    assert_eq!(all.len(), 3, "{all:?}");
    for p in &all {
        let m = std::fs::symlink_metadata(p).unwrap();
        let want = if m.is_dir() { 0o700 } else { 0o600 };
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (UID, UID, want), "{}", p.display());
    }
    // A `job-J` directory of another user's in the tier is not written into.
    let other = dir.path().join("other-tier");
    std::fs::create_dir_all(other.join("job-1")).unwrap();
    own(&other.join("job-1"), UID + 1, 0o700);
    let t2 = CheckpointTier { url: Some(format!("file://{}", other.display())), ..tier };
    let (ok, r) = reply(start_copier(&request(Work::Snapshot { tier: t2, at_ms: 300 }, &ckpt, &local, vec![], 60_000)));
    assert!(!ok, "{r:?}");
    assert!(matches!(&r, Reply::Failed { error } if error.contains("belongs to uid")), "{r:?}");
    assert!(everything(&other.join("job-1")).is_empty());
}

/// The status line `key` of `/proc/PID/status` (e.g. `Uid`).
fn status_line(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// An S3 endpoint that accepts connections and never answers: its URL, and a channel that gets one message per
/// connection (the copier reached it).
fn silent_s3() -> (String, std::sync::mpsc::Receiver<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
            let _ = tx.send(());
        }
    });
    (endpoint, rx)
}

#[test]
fn the_copiers_credentials_are_out_of_reach_of_the_jobs_own_processes_and_it_stops_at_its_deadline() {
    if !root() {
        return;
    }
    let dir = reachable_tempdir();
    let ckpt = checkpoint_dir(dir.path());
    // An S3 endpoint that accepts connections and never answers: the copier waits there, as the job's user.
    let (endpoint, rx) = silent_s3();
    let aws = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "copier-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "COPIER-SECRET-KEY"),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let tier = CheckpointTier { name: "s3".into(), every_ms: 100, keep: 1, url: Some("s3://bucket/t".into()) };
    let work = Work::Snapshot { tier, at_ms: 100 };
    let started = Instant::now();
    let child = start_copier(&request(work, &ckpt, &dir.path().join("node"), aws, 6_000));
    let pid = child.id();
    rx.recv_timeout(Duration::from_secs(30)).expect("the copier reached the S3 endpoint");
    // It runs as the job's user, with no supplementary group, and no secret of it is on its command line.
    assert_eq!(status_line(pid, "Uid"), format!("{UID} {UID} {UID} {UID}"));
    assert_eq!(status_line(pid, "Gid"), format!("{UID} {UID} {UID} {UID}"));
    assert_eq!(status_line(pid, "Groups"), "");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("SECRET"));
    // A process of the job's own user can read neither its environment nor its memory nor its descriptors.
    let probe = format!(
        "cat /proc/{pid}/environ >/dev/null 2>&1 && echo environ-read || echo environ-denied; \
         (exec 3</proc/{pid}/mem) 2>/dev/null && echo mem-opened || echo mem-denied; \
         ls /proc/{pid}/fd >/dev/null 2>&1 && echo fds-listed || echo fds-denied; \
         grep -c COPIER-SECRET /proc/{pid}/mem 2>/dev/null || true"
    );
    let out = Command::new("sh").args(["-c", &probe]).uid(UID).gid(UID).env_clear().output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().take(3).collect::<Vec<_>>(), ["environ-denied", "mem-denied", "fds-denied"], "{text}");
    // The control: a dumpable process of that user (a plain `sleep`) exposes all three to the same probe.
    let mut plain = Command::new("sleep").arg("30").uid(UID).gid(UID).spawn().unwrap();
    let control = probe.replace(&pid.to_string(), &plain.id().to_string());
    let out = Command::new("sh").args(["-c", &control]).uid(UID).gid(UID).env_clear().output().unwrap();
    let _ = plain.kill();
    let _ = plain.wait();
    let ctext = String::from_utf8_lossy(&out.stdout);
    assert_eq!(ctext.lines().take(3).collect::<Vec<_>>(), ["environ-read", "mem-opened", "fds-listed"], "{ctext}");
    // The copier's own deadline ends it.
    let (ok, r) = reply(child);
    assert!(!ok);
    assert!(matches!(&r, Reply::Failed { error } if error.contains("deadline")), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}

#[test]
fn an_agent_with_tenant_uids_copies_checkpoints_as_the_tenants_user() {
    if !root() {
        return;
    }
    let dir = reachable_tempdir();
    let root = format!("file://{}/tiers/{{tenant}}", dir.path().display());
    let s = Server::start(&dir.path().join("server"), common::free_port(), &["--checkpoint-root", &root]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let _a = s.agent_with("a1", "1xT4", dir.path(), "127.0.0.1", &["--tenant-uids"]);
    let tier = dir.path().join("tiers/t");
    // The job waits for a root-only file to be placed in its checkpoint directory, then writes its state and ends
    // (the final copy takes it).
    let cmd = "cd $GPUNET_CHECKPOINT_DIR; while [ ! -e planted ]; do sleep 0.1; done; echo step-1 > state; \
               id -u > uid; mkdir -p sub; echo w > sub/w; ln -s /etc/shadow leak; ln -s / rootdir";
    let id = submit_yaml(
        &s,
        dir.path(),
        &format!(
            "name: ck\ntenant: t\ngpus: 1\nmax_restarts: 0\ncommand: [sh, -c, {cmd:?}]\ncheckpoint_tiers:\n\
             - {{name: shared, every: 200ms, keep: 2, url: \"file://{}\"}}\n- {{name: local, every: 200ms, keep: 1}}\n",
            tier.display()
        ),
    );
    let ckpt = dir.path().join(format!("a1/checkpoints/job-{id}"));
    wait_for(Duration::from_secs(30), || ckpt.is_dir());
    let planted = ckpt.join("planted");
    std::fs::write(&planted, "ROOT-ONLY-SECRET").unwrap();
    own(&planted, 0, 0o600);
    wait_for(Duration::from_secs(60), || s.job_state(id) == "succeeded");
    assert_eq!(read(&ckpt.join("uid")), "200000", "the task ran as the tenant's user");
    let local = dir.path().join("a1/tiers");
    for base in [tier.join(format!("job-{id}")), local.join(format!("job-{id}"))] {
        let m = std::fs::metadata(&base).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (200_000, 200_000, 0o700), "{}", base.display());
        let all = everything(&base);
        assert!(all.iter().any(|p| p.ends_with("state")) && all.iter().any(|p| p.ends_with("sub/w")), "{all:?}");
        for p in &all {
            assert!(!p.ends_with("planted"), "a file the job cannot read was copied: {all:?}");
            assert!(!p.ends_with("leak") && !p.ends_with("rootdir"), "a symlink was copied: {all:?}");
            let m = std::fs::symlink_metadata(p).unwrap();
            let want = if m.is_dir() { 0o700 } else { 0o600 };
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (200_000, 200_000, want), "{}", p.display());
        }
    }
}

/// A real S3 endpoint on loopback (moto's server, from PyPI): `$MOTO_SERVER` or `moto_server` on the PATH.
fn moto() -> Option<String> {
    let exe = std::env::var("MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
    Command::new(&exe).arg("--help").output().ok().filter(|o| o.status.success()).map(|_| exe)
}

fn curl(args: &[&str]) -> (bool, String) {
    let o = Command::new("curl").args(["-s", "-f"]).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn an_s3_tier_is_written_and_restored_by_the_copier_with_the_credentials_it_read_on_stdin() {
    if !root() {
        return;
    }
    let Some(exe) = moto() else {
        assert!(std::env::var_os("CI").is_none(), "the S3 tier test needs moto_server under CI");
        eprintln!("SKIPPED: no moto_server (pip install 'moto[server]', or set MOTO_SERVER)");
        return;
    };
    let port = common::free_port();
    let _server = common::Proc(
        Command::new(exe)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let endpoint = format!("http://127.0.0.1:{port}");
    wait_for(Duration::from_secs(30), || curl(&["-X", "PUT", &format!("{endpoint}/ckpt-bucket")]).0);
    let aws: Vec<(String, String)> = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "gpunet-test"),
        ("AWS_SECRET_ACCESS_KEY", "gpunet-test-secret"),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let dir = reachable_tempdir();
    let ckpt = checkpoint_dir(dir.path());
    // Over one upload part: a multipart upload, streamed (the copier holds at most two parts of it).
    let big: Vec<u8> = (0..20u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(ckpt.join("big.bin"), &big).unwrap();
    own(&ckpt.join("big.bin"), UID, 0o600);
    let tier =
        CheckpointTier { name: "archive".into(), every_ms: 100, keep: 1, url: Some("s3://ckpt-bucket/t".into()) };
    let node = dir.path().join("node");
    for at in [1_000, 2_000] {
        let work = Work::Snapshot { tier: tier.clone(), at_ms: at };
        let (ok, r) = reply(start_copier(&request(work, &ckpt, &node, aws.clone(), 60_000)));
        assert!(ok, "{r:?}");
        assert!(
            matches!(&r, Reply::Copied { skipped, peak_rss_kib } if skipped == &["root-only (not readable by the copier)"]
                && *peak_rss_kib < 64 << 10),
            "{r:?}"
        );
    }
    let (_, list) = curl(&[&format!("{endpoint}/ckpt-bucket?list-type=2")]);
    assert!(list.contains("t/job-1/rank-0/archive/00000000000000002000/state"), "{list}");
    assert!(list.contains("00000000000000002000/sub/w.bin") && !list.contains("root-only"), "{list}");
    assert!(!list.contains("00000000000000001000"), "pruned to keep 1: {list}");
    let dst = dir.path().join("restored");
    std::fs::create_dir_all(&dst).unwrap();
    own(&dst, UID, 0o700);
    let (ok, r) = reply(start_copier(&request(Work::Restore { tiers: vec![tier] }, &dst, &node, aws, 60_000)));
    assert!(ok, "{r:?}");
    assert_eq!(r, Reply::Restored { snapshot: Some(2_000) });
    assert_eq!(std::fs::read_to_string(dst.join("state")).unwrap(), "step-1");
    assert!(std::fs::read(dst.join("big.bin")).unwrap() == big, "the multipart object restored whole");
    for p in everything(&dst) {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (UID, UID), "{}", p.display());
    }
}

#[test]
fn a_restart_on_another_node_gets_the_checkpoint_restored_as_the_tenants_user() {
    if !root() {
        return;
    }
    let dir = reachable_tempdir();
    let root = format!("file://{}/tiers/{{tenant}}", dir.path().display());
    let s = Server::start(&dir.path().join("server"), common::free_port(), &["--checkpoint-root", &root]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let _a1 = s.agent_with("a1", "1xT4", dir.path(), "127.0.0.1", &["--tenant-uids"]);
    let _a2 = s.agent_with("a2", "1xT4", dir.path(), "127.0.0.1", &["--tenant-uids"]);
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let tier = dir.path().join("tiers/t");
    // Attempt 0 writes its state, says where it runs and fails once told to; attempt 1 (on the other node) reports
    // what it found in its checkpoint directory.
    let cmd = format!(
        "cd $GPUNET_CHECKPOINT_DIR; S={0}; \
         if [ -e state ]; then echo \"$(cat state) $(stat -c '%u %a' state)\" > $S/result; exit 0; fi; \
         echo step-1 > state; echo $GPUNET_CHECKPOINT_DIR > $S/where; \
         while [ ! -e $S/go ]; do sleep 0.1; done; exit 1",
        shared.display()
    );
    let id = submit_yaml(
        &s,
        dir.path(),
        &format!(
            "name: rs\ntenant: t\ngpus: 1\nmax_restarts: 1\ncommand: [sh, -c, {cmd:?}]\ncheckpoint_tiers:\n\
             - {{name: shared, every: 200ms, keep: 2, url: \"file://{}\"}}\n",
            tier.display()
        ),
    );
    // Generous deadlines: on a loaded 2-core machine this job once had not started after 30 s (a fresh clone's full
    // run, beside the other tests of this binary); alone the whole test takes about 11 s.
    wait_for(Duration::from_secs(90), || !read(&shared.join("where")).is_empty());
    let first = if read(&shared.join("where")).contains("/a1/") { "a1" } else { "a2" };
    let other = if first == "a1" { "a2" } else { "a1" };
    wait_for(Duration::from_secs(60), || {
        everything(&tier.join(format!("job-{id}"))).iter().any(|p| p.ends_with("state"))
    });
    let (ok, _, err) = s.cli("admin-secret", &["cordon", first]);
    assert!(ok, "{err}");
    std::fs::write(shared.join("go"), "").unwrap();
    wait_for(Duration::from_secs(90), || s.job_state(id) == "succeeded");
    assert_eq!(read(&shared.join("result")), "step-1 200000 600", "restored on {other}");
    let restored = dir.path().join(format!("{other}/checkpoints/job-{id}/state"));
    let m = std::fs::metadata(&restored).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (200_000, 200_000, 0o600));
}

#[test]
fn a_copier_dies_with_the_agent_that_started_it() {
    if !root() {
        return;
    }
    let dir = reachable_tempdir();
    let ckpt = checkpoint_dir(dir.path());
    let (endpoint, rx) = silent_s3();
    let aws = [("AWS_ENDPOINT", endpoint.as_str()), ("AWS_ALLOW_HTTP", "true"), ("AWS_ACCESS_KEY_ID", "k")]
        .into_iter()
        .chain([("AWS_SECRET_ACCESS_KEY", "s"), ("AWS_REGION", "us-east-1")])
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let tier = CheckpointTier { name: "s3".into(), every_ms: 100, keep: 1, url: Some("s3://bucket/t".into()) };
    let req = request(Work::Snapshot { tier, at_ms: 1 }, &ckpt, &dir.path().join("node"), aws, 120_000);
    let req_file = dir.path().join("req.json");
    std::fs::write(&req_file, serde_json::to_vec(&req).unwrap()).unwrap();
    // A stand-in for the agent: starts the copier and is then killed.
    let pid_file = dir.path().join("copier.pid");
    let script = format!(
        "{BIN} checkpoint-copy < {} > /dev/null 2>&1 & echo $! > {}; exec sleep 120",
        req_file.display(),
        pid_file.display()
    );
    let mut agent = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    rx.recv_timeout(Duration::from_secs(30)).expect("the copier reached the S3 endpoint");
    let pid = read(&pid_file);
    assert!(pid.parse::<u32>().is_ok_and(|p| p > 1), "{pid:?}");
    /// Kills the copier should the test fail before it is gone (disarmed then: its id may be reused).
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-9", &self.0]).status();
        }
    }
    let cleanup = Kill(pid.clone());
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let _ = agent.kill();
    let _ = agent.wait();
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) == Some("Z"))
            .unwrap_or(true)
    };
    wait_for(Duration::from_secs(10), gone);
    std::mem::forget(cleanup);
}

/// The hostile-tenant probe, finding 3: a 64Mi job's `truncate -s 1500M $GPUNET_CHECKPOINT_DIR/sparse` made the
/// copier (outside the job's memory cgroup) read the whole claimed size into memory (1.5 GB RSS), and each snapshot
/// wrote 1.5 GB of real disk from an 8 KB source. Now a copy streams through a bounded buffer and keeps the holes,
/// and a snapshot that would write over its byte limit fails and leaves nothing behind.
#[test]
fn a_sparse_file_costs_the_copier_neither_memory_nor_disk_and_a_snapshot_is_bounded() {
    use std::os::unix::fs::FileExt as _;
    if !root() {
        return;
    }
    let dir = reachable_tempdir();
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    own(&ckpt, UID, 0o700);
    let sparse = ckpt.join("sparse");
    let f = std::fs::File::create(&sparse).unwrap();
    f.write_all_at(&[1u8; 4096], 0).unwrap();
    f.set_len(1500 << 20).unwrap();
    f.write_all_at(&[2u8; 4096], (1500 << 20) - 4096).unwrap();
    drop(f);
    own(&sparse, UID, 0o600);
    let local = dir.path().join("node-tiers");
    let node = CheckpointTier { name: "local".into(), every_ms: 100, keep: 2, url: None };
    let work = Work::Snapshot { tier: node.clone(), at_ms: 100 };
    let (ok, r) = reply(start_copier(&request(work, &ckpt, &local, vec![], 60_000)));
    assert!(ok, "{r:?}");
    let Reply::Copied { skipped, peak_rss_kib } = r else { panic!("{r:?}") };
    assert!(skipped.is_empty(), "{skipped:?}");
    assert!(peak_rss_kib > 0 && peak_rss_kib < 64 << 10, "the copier's peak RSS: {peak_rss_kib} KiB");
    let copy = local.join(format!("job-1/rank-0/local/{:020}/sparse", 100));
    let m = std::fs::metadata(&copy).unwrap();
    assert_eq!(m.len(), 1500 << 20);
    assert!(m.blocks() * 512 < 1 << 20, "the copy is sparse: {} bytes on disk", m.blocks() * 512);
    let mut tail = [0u8; 4096];
    std::fs::File::open(&copy).unwrap().read_exact_at(&mut tail, (1500 << 20) - 4096).unwrap();
    assert_eq!(tail, [2u8; 4096]);
    // A snapshot over the limit (here 4 KiB of data too many) is refused, and none of it stays in the tier.
    let work = Work::Snapshot { tier: node, at_ms: 200 };
    let req = Request { max_bytes: 4096, ..request(work, &ckpt, &local, vec![], 60_000) };
    let (ok, r) = reply(start_copier(&req));
    assert!(!ok && matches!(&r, Reply::Failed { error } if error.contains("over 4096 bytes")), "{r:?}");
    assert!(!local.join(format!("job-1/rank-0/local/{:020}", 200)).exists());
}
