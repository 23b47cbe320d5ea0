//! Hostile-environment regressions against the real binary: paths handed to tasks and the modes of the files
//! `gpunet up` writes.

mod common;

use common::{free_port, wait_for, Proc, Server, BIN};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// With a relative `--data-dir`, a job's `GPUNET_CHECKPOINT_DIR` was relative too, so a task with another working
/// directory could not use it. The agent now resolves its data directory to an absolute path.
#[test]
fn an_agent_with_a_relative_data_dir_gives_tasks_an_absolute_checkpoint_dir() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    use std::os::unix::process::CommandExt;
    let child = Command::new(BIN)
        .process_group(0)
        .current_dir(dir.path())
        .args(["agent", "--server", &s.url, "--join-token", "join-secret", "--name", "rel", "--fake-gpus"])
        .args(["1xA100-80GB", "--data-dir", "relative-agent", "--labels", "zone=z1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _agent = Proc(child);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // The task may run as its tenant's own user (a root agent's default): it must reach `out` to report.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The task runs elsewhere, writes into its checkpoint directory, and records the path it was given.
    let cmd = format!(
        "echo \"$GPUNET_CHECKPOINT_DIR\" > {o}/path && mkdir -p \"$GPUNET_CHECKPOINT_DIR\" && \
         touch \"$GPUNET_CHECKPOINT_DIR/written\"",
        o = out.display()
    );
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, format!("name: ckpt\ntenant: t\ngpus: 1\ncommand: [sh, -c, {cmd:?}]\n")).unwrap();
    let (ok, o, e) = s.cli("admin-secret", &["submit", "-f", spec.to_str().unwrap(), "--output", "json"]);
    assert!(ok, "{o}{e}");
    let id = common::json(&o)["id"].as_u64().unwrap();
    wait_for(Duration::from_secs(30), || ["succeeded", "failed"].contains(&s.job_state(id).as_str()));
    let path = std::fs::read_to_string(out.join("path")).unwrap_or_default().trim().to_string();
    assert!(path.starts_with('/'), "GPUNET_CHECKPOINT_DIR is {path:?}");
    assert!(path.starts_with(dir.path().join("relative-agent").to_str().unwrap()), "{path}");
    assert!(std::path::Path::new(&path).join("written").exists(), "{path}");
    assert_eq!(s.job_state(id), "succeeded");
}

/// The database, WAL and log files were world-readable (0644). `gpunet up`'s admin token, database files and
/// directory are private.
#[test]
fn up_keeps_its_admin_token_and_database_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("up");
    let port = free_port();
    let mut child = Command::new(BIN)
        .args(["up", "--data-dir", data.to_str().unwrap(), "--fake-gpus", "1xA100-80GB", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let _up = Proc(child);
    let t = Instant::now();
    let mut line = String::new();
    while !line.contains("gpunet is up") {
        line.clear();
        assert!(lines.read_line(&mut line).unwrap() > 0, "gpunet up ended early");
        assert!(t.elapsed() < Duration::from_secs(30), "gpunet up did not start");
    }
    std::thread::spawn(move || for _ in lines.lines() {});
    let mode = |p: &str| std::fs::metadata(data.join(p)).map(|m| m.permissions().mode() & 0o777).ok();
    assert_eq!(mode("admin.token"), Some(0o600));
    assert_eq!(mode("server"), Some(0o700));
    // The WAL appears with the first write; the tenant `up` creates is one.
    wait_for(Duration::from_secs(20), || mode("server/gpunet.db-wal").is_some());
    for f in ["server/gpunet.db", "server/gpunet.db-wal", "server/gpunet.db-shm"] {
        assert_eq!(mode(f), Some(0o600), "{f}");
    }
}
