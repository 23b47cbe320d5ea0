//! Node credentials through the real binary: the agent registers with the join token, keeps its node's own credential
//! (0600) in its data directory and syncs with it; a later start needs no join token.

mod common;

use common::{free_port, wait_for, Proc, Server};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn agent(s: &Server, dir: &std::path::Path, join: Option<&str>) -> Proc {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(common::BIN);
    c.process_group(0)
        .args(["agent", "--server", &s.url, "--name", "a1", "--fake-gpus", "1xT4", "--data-dir"])
        .arg(dir)
        .env_remove("GPUNET_JOIN_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(j) = join {
        c.args(["--join-token", j]);
    }
    Proc(c.spawn().unwrap())
}

fn sync_with(s: &Server, token: &str) -> String {
    let o = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-XPOST",
            "-H",
            &format!("Authorization: Bearer {token}"),
        ])
        .args(["-d", r#"{"known_version":0,"running":[],"exited":[]}"#, &format!("{}/v1/agents/a1/sync", s.url)])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn an_agent_keeps_its_node_credential_0600_and_restarts_without_the_join_token() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let data = dir.path().join("a1");
    let cred_file = data.join("node.credential");
    let ready = || {
        let (_, out, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .is_some_and(|a| a.iter().any(|n| n["name"] == "a1" && n["state"] == "ready"))
    };

    let mut first = agent(&s, &data, Some("join-secret"));
    wait_for(Duration::from_secs(30), || ready() && cred_file.exists());
    let mode = std::fs::metadata(&cred_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the credential file is the owner's only");
    let cred = std::fs::read_to_string(&cred_file).unwrap();
    assert!(cred.starts_with("gpn_"), "{cred}");
    let id = s.submit(&["--gpus", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "succeeded");
    // The join token cannot sync; the node's credential can.
    assert_eq!(sync_with(&s, "join-secret"), "403");
    assert_eq!(sync_with(&s, &cred), "200");
    first.kill9();

    // Started again without a join token: it registers with its credential and gets a new one.
    let _second = agent(&s, &data, None);
    wait_for(Duration::from_secs(30), || std::fs::read_to_string(&cred_file).is_ok_and(|c| c != cred));
    let id = s.submit(&["--gpus", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "succeeded");
    assert_eq!(sync_with(&s, &cred), "401", "the replaced credential no longer works");
}
