//! Job arrays and dependencies end to end: the real `gpunet server`, a real agent (fake GPUs) running the elements as
//! processes, and the CLI's `submit --array/--dependency`, `show ID[INDEX]`, `why` and `cancel`.

mod common;

use common::{free_port, json, read, wait_for, Server};
use std::time::Duration;

#[test]
fn an_array_runs_every_element_with_its_index_and_dependencies_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Held back by a job that waits for a file, so that the dependents are seen waiting first.
    let gate = dir.path().join("gate");
    let hold = format!("while [ ! -e {} ]; do sleep 0.1; done", gate.display());
    let first = s.submit(&["--gpus", "1", "--name", "gate", "--", "sh", "-c", &hold]);
    let cmd = format!("echo $GPUNET_ARRAY_JOB_ID $GPUNET_ARRAY_INDEX > {}/$GPUNET_ARRAY_INDEX", out.display());
    let dep = format!("afterok:{first}");
    let arr = s.submit(&["--gpus", "1", "--array", "0-10:2%2", "--dependency", &dep, "--", "sh", "-c", &cmd]);
    let count = format!("ls {} | wc -l > {}/count", out.display(), dir.path().display());
    let after = s.submit(&["--gpus", "1", "--dependency", &format!("afterok:{arr}"), "--", "sh", "-c", &count]);
    let never = s.submit(&["--gpus", "1", "--dependency", &format!("afternotok:{arr}"), "--", "true"]);
    let _agent = s.agent("a1", "4xT4", dir.path(), "127.0.0.1");
    wait_for(Duration::from_secs(20), || s.job_state(first) == "running");
    let (ok, why, err) = s.cli("admin-secret", &["why", &after.to_string()]);
    assert!(ok, "{err}");
    assert!(why.contains(&format!("dependency: waits for afterok job-{arr} (pending)")), "{why}");
    let (_, why, _) = s.cli("admin-secret", &["why", &arr.to_string()]);
    assert!(why.contains(&format!("afterok job-{first} (running)")), "{why}");
    std::fs::write(&gate, "").unwrap();
    wait_for(Duration::from_secs(60), || s.job_state(after) == "succeeded");
    // Six elements (0, 2, …, 10), each with its own index and the array's id.
    for i in (0..=10).step_by(2) {
        assert_eq!(read(&out.join(i.to_string())).trim(), format!("{arr} {i}"));
    }
    assert_eq!(read(&dir.path().join("count")).trim(), "6", "the dependent ran after every element");
    assert_eq!(s.job_state(arr), "succeeded");
    let (ok, shown, err) = s.cli("admin-secret", &["show", &format!("job-{arr}[4]"), "--output", "json"]);
    assert!(ok, "{err}");
    let v = json(&shown);
    assert_eq!((v["id"].as_u64(), v["array_index"].as_u64()), (Some(arr + 3), Some(4)), "{v}");
    let (_, shown, _) = s.cli("admin-secret", &["show", &arr.to_string()]);
    assert!(shown.contains("array of 6 elements (0-10:2%2)") && shown.contains("6 succeeded"), "{shown}");
    // afternotok on an array that succeeded can never be satisfied: the job failed, saying why.
    wait_for(Duration::from_secs(10), || s.job_state(never) == "failed");
    let (_, why, _) = s.cli("admin-secret", &["why", &never.to_string()]);
    assert!(why.contains(&format!("dependency afternotok job-{arr} can never be satisfied")), "{why}");
    let (ok, _, err) = s.cli("admin-secret", &["show", &format!("{arr}[5]")]);
    assert!(!ok && err.contains("has no index 5"), "{err}");
    let (ok, _, err) = s.cli("admin-secret", &["submit", "--tenant", "t", "--array", "9-1", "--", "true"]);
    assert!(!ok && err.contains("array"), "{err}");
}

#[test]
fn cancelling_an_array_stops_its_running_elements_and_the_rest_never_start() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let _agent = s.agent("a1", "2xT4", dir.path(), "127.0.0.1");
    let arr = s.submit(&["--gpus", "1", "--array", "1-1000", "--", "sleep", "300"]);
    wait_for(Duration::from_secs(20), || s.job_state(arr + 1) == "running" && s.job_state(arr + 2) == "running");
    let (ok, out, err) = s.cli("admin-secret", &["cancel", &format!("{arr}[1]")]);
    assert!(ok, "{out}{err}");
    wait_for(Duration::from_secs(20), || s.job_state(arr + 1) == "cancelled" && s.job_state(arr + 3) == "running");
    let (ok, out, err) = s.cli("admin-secret", &["cancel", &arr.to_string()]);
    // Its elements still run while they stop: the array says it is being cancelled, not its old state alone.
    assert!(ok && out.contains(&format!("job-{arr} is being cancelled")), "{out}{err}");
    // Until they are gone, `why` says so too (unless they are gone already).
    let (_, why, _) = s.cli("admin-secret", &["why", &arr.to_string()]);
    assert!(why.contains(&format!("array job-{arr} is being cancelled")) || s.job_state(arr) == "cancelled", "{why}");
    wait_for(Duration::from_secs(20), || s.job_state(arr) == "cancelled");
    let (_, shown, _) = s.cli("admin-secret", &["show", &arr.to_string(), "--output", "json"]);
    let v = json(&shown);
    assert_eq!((v["array"]["cancelled"].as_u64(), v["array"]["expanded"].as_u64()), (Some(1000), Some(4)), "{v}");
    assert!(v["stopping"].is_null(), "an ended array is no longer stopping: {v}");
    // `why` tells how its elements ended; cancelling it again says it has ended.
    let (_, why, _) = s.cli("admin-secret", &["why", &arr.to_string()]);
    assert!(why.contains("of 1000 elements 0 succeeded, 0 failed, 1000 cancelled"), "{why}");
    let (ok, out, err) = s.cli("admin-secret", &["cancel", &arr.to_string()]);
    assert!(!ok && err.contains("already ended (cancelled)") && !err.contains("transition"), "{out}{err}");
}

#[test]
fn wait_exits_with_the_job_s_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let _agent = s.agent("a1", "2xT4", dir.path(), "127.0.0.1");
    let good = s.submit(&["--gpus", "1", "--", "sh", "-c", "sleep 0.5"]);
    let bad = common::submit_yaml(
        &s,
        dir.path(),
        "name: three\ntenant: t\ngpus: 1\nmax_restarts: 0\ncommand: [sh, -c, 'sleep 0.5; exit 3']\n",
    );
    let (ok, _, err) = s.cli("admin-secret", &["wait", &good.to_string()]);
    assert!(ok, "{err}");
    assert!(err.contains(&format!("job-{good} succeeded")), "{err}");
    let o = std::process::Command::new(common::BIN)
        .args(["wait", &good.to_string(), &format!("job-{bad}")])
        .env("GPUNET_SERVER", &s.url)
        .env("GPUNET_TOKEN", "admin-secret")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_held_job_waits_across_a_restart_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let port = free_port();
    let mut s = Server::start(&data, port, &[]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let (ok, other, err) = s.cli("admin-secret", &["tenants", "--create", "other", "--output", "json"]);
    assert!(ok, "{err}");
    let other_token = json(&other)["token"].as_str().unwrap().to_string();
    let out = dir.path().join("ran");
    let touch = format!("touch {}", out.display());
    let held = s.submit(&["--gpus", "1", "--hold", "--name", "held", "--", "sh", "-c", &touch]);
    let arr = s.submit(&["--gpus", "1", "--array", "0-3%2", "--", "true"]);
    let (ok, o, err) = s.cli("admin-secret", &["hold", &arr.to_string()]);
    assert!(ok && o.contains(&format!("job-{arr} held")), "{o}{err}");
    let agent = s.agent("a1", "4xT4", dir.path(), "127.0.0.1");
    // A job that runs shows the agent works; the held ones stay pending.
    let free = s.submit(&["--gpus", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || s.job_state(free) == "succeeded");
    assert_eq!(s.job_state(held), "pending");
    assert_eq!(s.job_state(arr), "pending");
    assert!(!out.exists(), "a held job ran");
    let (ok, why, err) = s.cli("admin-secret", &["why", &held.to_string()]);
    assert!(
        ok && why.contains(&format!("held: it waits in no queue until released (`gpunet release {held}`)")),
        "{why}{err}"
    );
    assert!(!why.contains("predicted start"), "a held job has no ETA: {why}");
    let (_, why, _) = s.cli("admin-secret", &["why", &arr.to_string()]);
    assert!(why.contains(&format!("gpunet release {arr}")), "{why}");
    let (_, table, _) = s.cli("admin-secret", &["jobs"]);
    assert!(table.lines().any(|l| l.starts_with(&held.to_string()) && l.contains("pending (held)")), "{table}");
    // Refusals change nothing and say why; another tenant cannot even see the job.
    let (ok, _, err) = s.cli("admin-secret", &["hold", &held.to_string()]);
    assert!(!ok && err.contains("held already"), "{err}");
    let (ok, _, err) = s.cli("admin-secret", &["release", &free.to_string()]);
    assert!(!ok && err.contains("not held"), "{err}");
    let (ok, _, err) = s.cli(&other_token, &["release", &held.to_string()]);
    assert!(!ok && err.contains("no such job"), "{err}");
    // Held across a restart of the server.
    drop(agent);
    s.proc.kill9();
    drop(s);
    let s = Server::start(&data, port, &[]);
    let _agent = s.agent("a1", "4xT4", dir.path(), "127.0.0.1");
    let again = s.submit(&["--gpus", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || s.job_state(again) == "succeeded");
    assert_eq!(s.job_state(held), "pending");
    assert!(!out.exists(), "a held job ran after the restart");
    let (_, shown, _) = s.cli("admin-secret", &["show", &arr.to_string(), "--output", "json"]);
    assert_eq!(json(&shown)["held"], true, "{shown}");
    let (ok, o, err) = s.cli("admin-secret", &["release", &held.to_string(), &arr.to_string()]);
    assert!(ok && o.contains(&format!("job-{held} released")), "{o}{err}");
    wait_for(Duration::from_secs(30), || s.job_state(held) == "succeeded" && s.job_state(arr) == "succeeded");
    assert!(out.exists());
    let (_, events, _) = s.cli("admin-secret", &["show", &held.to_string()]);
    assert!(events.contains("held") && events.contains("released"), "{events}");
}
