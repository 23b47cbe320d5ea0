//! The shared job lifecycle, live: real processes through real agents (fake GPUs) on loopback. What is checked comes
//! from the processes themselves (each writes a nanosecond timestamp when it starts and as its last act before it
//! exits), not from the server's events.

mod common;

use common::{free_port, wait_for, Server};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn setup(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), extra);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    (dir, s)
}

/// `(what, job, attempt, nanoseconds)` lines written by the tasks.
fn marks(p: &Path) -> Vec<(String, String, u32, u128)> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            Some((v.first()?.to_string(), v.get(1)?.to_string(), v.get(2)?.parse().ok()?, v.get(3)?.parse().ok()?))
        })
        .collect()
}

fn mark(marks: &[(String, String, u32, u128)], what: &str, job: &str, attempt: u32) -> Option<u128> {
    marks.iter().find(|m| m.0 == what && m.1 == job && m.2 == attempt).map(|m| m.3)
}

fn view(s: &Server, id: u64) -> serde_json::Value {
    let (_, o, _) = s.cli("admin-secret", &["show", &id.to_string(), "--output", "json"]);
    common::json(&o)
}

/// A victim whose SIGTERM handler takes 4 s (writing its checkpoint) keeps its GPU until it is gone: the preemptor's
/// process starts only after the victim's last process ended, and the victim's next attempt only after that.
#[test]
fn a_preempted_job_keeps_its_gpu_until_its_processes_are_gone() {
    let (dir, s) = setup(&["--policy", "priority", "--preempt-min-run-s", "0"]);
    let _a = s.agent("a1", "1xA100-80GB", dir.path(), "127.0.0.1");
    let log = dir.path().join("marks");
    let low = format!(
        "L={0}; a=$GPUNET_ATTEMPT; echo \"start low $a $(date +%s%N)\" >> $L; \
         if [ \"$a\" != 0 ]; then echo \"end low $a $(date +%s%N)\" >> $L; exit 0; fi; \
         trap 'sleep 4; echo \"end low $a $(date +%s%N)\" >> $L; exit 0' TERM; \
         sleep 300 & wait",
        log.display()
    );
    let lo = s.submit(&["--gpus", "1", "--", "sh", "-c", &low]);
    wait_for(Duration::from_secs(30), || mark(&marks(&log), "start", "low", 0).is_some());
    let high = format!(
        "L={0}; echo \"start high $GPUNET_ATTEMPT $(date +%s%N)\" >> $L; sleep 1; \
         echo \"end high $GPUNET_ATTEMPT $(date +%s%N)\" >> $L",
        log.display()
    );
    let hi = s.submit(&["--gpus", "1", "--priority", "10", "--", "sh", "-c", &high]);
    // While the victim writes its checkpoint, it still holds the GPU and is shown as stopping.
    wait_for(Duration::from_secs(30), || view(&s, lo)["stopping"] == "preempted");
    assert_eq!(view(&s, hi)["state"], "pending", "the preemptor waits for the victim's end");
    wait_for(Duration::from_secs(60), || s.job_state(hi) == "succeeded" && s.job_state(lo) == "succeeded");
    let m = marks(&log);
    let low0_end = mark(&m, "end", "low", 0).expect("the victim's first attempt recorded its end");
    let high_start = mark(&m, "start", "high", 0).expect("the preemptor started");
    let high_end = mark(&m, "end", "high", 0).expect("the preemptor ended");
    let low1_start = mark(&m, "start", "low", 1).expect("the victim resumed as attempt 1");
    assert!(
        high_start > low0_end,
        "preemptor started {} ms before the victim ended",
        (low0_end - high_start) / 1_000_000
    );
    assert!(low1_start > low0_end, "the victim's next attempt overlapped its previous one");
    assert!(low1_start > high_end, "the victim's next attempt shared the GPU with the preemptor");
    assert_eq!(m.iter().filter(|x| x.0 == "start").count(), 3, "{m:?}");
    let v = view(&s, lo);
    assert_eq!((v["preemptions"].as_u64(), v["restarts"].as_u64()), (Some(1), Some(0)), "{v}");
}

/// An agent frozen (SIGSTOP) past the loss timeout, then resumed: its node is lost, the job's task there is fenced
/// (its GPU is not given away, the job does not start elsewhere), the agent kills the old copy on its return, the job
/// then runs exactly once more, and the loss is not counted as a restart.
#[test]
fn a_frozen_agent_s_old_copy_is_killed_on_its_return_and_the_job_runs_once_more() {
    let (dir, s) = setup(&["--node-lost-after-s", "1", "--node-fence-s", "600", "--restart-backoff-s", "0"]);
    let mut a = s.agent("a1", "1xT4", dir.path(), "127.0.0.1");
    let log = dir.path().join("marks");
    let cmd = format!(
        "L={0}; a=$GPUNET_ATTEMPT; echo \"start j $a $(date +%s%N)\" >> $L; \
         if [ \"$a\" != 0 ]; then echo \"end j $a $(date +%s%N)\" >> $L; exit 0; fi; \
         echo $$ > {0}.pid; trap 'echo \"end j $a $(date +%s%N)\" >> $L; exit 0' TERM; sleep 300 & wait",
        log.display()
    );
    let id = s.submit(&["--gpus", "1", "--", "sh", "-c", &cmd]);
    wait_for(Duration::from_secs(30), || mark(&marks(&log), "start", "j", 0).is_some());
    let pidfile = format!("{}.pid", log.display());
    wait_for(Duration::from_secs(30), || !common::read(Path::new(&pidfile)).is_empty());
    let pid = common::host_pid(a.0.id(), &common::read(Path::new(&pidfile)));
    let agent_pid = a.0.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &agent_pid]).status().unwrap().success());
    let nodes_state = |name: &str| {
        let (_, o, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        common::json(&o).as_array().unwrap().iter().find(|n| n["name"] == name).map(|n| n["state"].clone())
    };
    wait_for(Duration::from_secs(30), || nodes_state("a1").is_some_and(|x| x == "lost"));
    // Another node is free, but the job is fenced: it must not start twice.
    let _b = s.agent("a2", "1xT4", dir.path(), "127.0.0.2");
    std::thread::sleep(Duration::from_secs(3)); // a negative check: give a wrong start the time to happen
    assert_eq!(marks(&log).iter().filter(|x| x.0 == "start").count(), 1, "started again while fenced");
    assert_eq!(view(&s, id)["stopping"], "node_lost");
    assert!(Command::new("kill").args(["-CONT", &agent_pid]).status().unwrap().success());
    wait_for(Duration::from_secs(60), || s.job_state(id) == "succeeded");
    let m = marks(&log);
    let old_end = mark(&m, "end", "j", 0).expect("the old copy was stopped on the agent's return");
    let new_start = mark(&m, "start", "j", 1).expect("the job ran again");
    assert!(new_start > old_end, "the new attempt started before the old copy ended");
    assert_eq!(m.iter().filter(|x| x.0 == "start").count(), 2, "exactly once more: {m:?}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the old copy is gone");
    let v = view(&s, id);
    assert_eq!((v["restarts"].as_u64(), v["losses"].as_u64()), (Some(0), Some(1)), "{v}");
    a.kill9();
}

/// Defragmentation, live, under the default policy (`auto`): two nodes of 2 GPUs with one long job each leave 2 GPUs
/// free in pieces; a 2-GPU job then gets a node whole. One of the two long jobs is moved: its first attempt ends
/// (its SIGTERM handler writes the mark) before the 2-GPU job's process starts, and it runs again on the other node,
/// beside the job that stayed. Both nodes end full.
#[test]
fn a_job_that_needs_a_whole_node_gets_one_by_moving_a_job_to_free_gpus_elsewhere() {
    let (dir, s) = setup(&["--preempt-min-run-s", "0"]);
    let _a1 = s.agent("a1", "2xA100-80GB", dir.path(), "127.0.0.1");
    let _a2 = s.agent("a2", "2xA100-80GB", dir.path(), "127.0.0.2");
    let nodes_ready = || {
        let (_, o, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        common::json(&o).as_array().is_some_and(|n| n.iter().filter(|n| n["state"] == "ready").count() == 2)
    };
    wait_for(Duration::from_secs(30), nodes_ready);
    let log = dir.path().join("marks");
    let long = |name: &str| {
        format!(
            "L={0}; a=$GPUNET_ATTEMPT; echo \"start {name} $a $(date +%s%N)\" >> $L; \
             trap 'echo \"end {name} $a $(date +%s%N)\" >> $L; exit 0' TERM; sleep 300 & wait",
            log.display()
        )
    };
    let ids: Vec<u64> = ["x", "y", "z"]
        .iter()
        .map(|n| {
            let id = s.submit(&["--gpus", "1", "--", "sh", "-c", &long(n)]);
            wait_for(Duration::from_secs(30), || s.job_state(id) == "running");
            id
        })
        .collect();
    let node_of = |id: u64| view(&s, id)["placement"][0]["node"].as_str().unwrap_or("").to_string();
    // Of the two jobs that share a node, one is cancelled: each node then runs one job and has one GPU free.
    let nodes: Vec<String> = ids.iter().map(|&id| node_of(id)).collect();
    let (i, j) = [(0, 1), (0, 2), (1, 2)].into_iter().find(|&(i, j)| nodes[i] == nodes[j]).expect("best fit");
    let (ok, _, err) = s.cli("admin-secret", &["cancel", &ids[j].to_string()]);
    assert!(ok, "{err}");
    wait_for(Duration::from_secs(30), || s.job_state(ids[j]) == "cancelled");
    let k = 3 - i - j;
    let stay_or_move = [ids[i], ids[k]];
    assert_ne!(node_of(ids[i]), node_of(ids[k]));
    let wide = format!(
        "L={0}; echo \"start wide $GPUNET_ATTEMPT $(date +%s%N)\" >> $L; trap 'exit 0' TERM; sleep 300 & wait",
        log.display()
    );
    let w = s.submit(&["--gpus", "2", "--", "sh", "-c", &wide]);
    wait_for(Duration::from_secs(60), || {
        s.job_state(w) == "running" && stay_or_move.iter().all(|&id| s.job_state(id) == "running")
    });
    let moved: Vec<u64> = stay_or_move.iter().copied().filter(|&id| view(&s, id)["preemptions"] == 1).collect();
    assert_eq!(moved.len(), 1, "exactly one job moved: {:?}", stay_or_move.map(|id| view(&s, id)));
    let m = moved[0];
    let stayed = stay_or_move.into_iter().find(|&id| id != m).unwrap();
    assert_eq!(view(&s, stayed)["preemptions"], 0);
    assert_eq!(node_of(m), node_of(stayed), "the moved job runs beside the one that stayed");
    assert_ne!(node_of(w), node_of(m));
    let name = ["x", "y", "z"][ids.iter().position(|&id| id == m).unwrap()];
    wait_for(Duration::from_secs(30), || mark(&marks(&log), "start", name, 1).is_some());
    let mk = marks(&log);
    let end0 = mark(&mk, "end", name, 0).expect("the moved job's first attempt ended");
    let wide_start = mark(&mk, "start", "wide", 0).expect("the wide job started");
    assert!(wide_start > end0, "the wide job started before the moved job's first attempt ended");
    for id in [w, stayed, m] {
        let (ok, _, err) = s.cli("admin-secret", &["cancel", &id.to_string()]);
        assert!(ok, "{err}");
    }
    for id in [w, stayed, m] {
        wait_for(Duration::from_secs(30), || s.job_state(id) == "cancelled");
    }
}

/// Unmounts a test file system when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn curl(args: &[&str]) -> (u16, String) {
    let o = Command::new("curl").args(["-s", "-w", "\n%{http_code}"]).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Durable, then visible: with the data directory on a full disk, a submit is refused and leaves no trace — not in
/// the API, not on an agent, not after a restart — and the server says it is read-only (health, metrics, at start).
#[test]
fn a_submit_the_store_refuses_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    std::fs::create_dir_all(&data).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&data)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root and can mount a tmpfs");
        eprintln!("SKIPPED: cannot mount a small tmpfs here (needs root)");
        return;
    }
    let _m = Mounted(data.clone());
    let port = free_port();
    let s = Server::start(&data, port, &[]);
    assert!(s.cli("admin-secret", &["tenants", "--create", "t"]).0);
    let _a = s.agent("a1", "1xT4", dir.path(), "127.0.0.1");
    // Fill the disk to the last byte.
    let _ = Command::new("dd").arg("if=/dev/zero").arg(format!("of={}/fill", data.display())).arg("bs=64k").output();
    // A batch big enough that SQLite must grow its files.
    let arg = "x".repeat(20_000);
    let jobs: Vec<serde_json::Value> = (0..40)
        .map(|i| serde_json::json!({"name": format!("j{i}"), "tenant": "t", "gpus": 1, "command": ["echo", arg]}))
        .collect();
    let body = dir.path().join("batch.json");
    std::fs::write(&body, serde_json::Value::Array(jobs).to_string()).unwrap();
    let body = format!("@{}", body.display());
    let auth = "Authorization: Bearer admin-secret";
    let head = dir.path().join("head");
    let head_arg = head.display().to_string();
    let url = format!("{}/v1/jobs/batch", s.url);
    let (code, out) = curl(&["-XPOST", "-H", auth, "--data-binary", &body, "-D", &head_arg, &url]);
    assert_eq!(code, 503, "the store must refuse on a full disk: {out}");
    assert!(out.contains("the store refused to persist the jobs"), "{out}");
    // Whether a refused commit reached the disk is not known: the answer says so, and does not invite a generic
    // client to send an unkeyed batch again.
    let head = std::fs::read_to_string(&head).unwrap().to_ascii_lowercase();
    assert!(out.contains("\"interrupted\""), "{out}");
    assert!(head.contains("gpunet-outcome: unknown") && !head.contains("retry-after"), "{head}");
    let (code, out) = curl(&[&format!("{}/v1/health", s.url)]);
    assert!(code == 503 && out.contains("degraded"), "{code} {out}");
    let (_, metrics) = curl(&["-H", auth, &format!("{}/metrics", s.url)]);
    assert!(metrics.contains("gpunet_store_writable 0"), "{metrics}");
    let (ok, out, err) = s.cli("admin-secret", &["jobs", "--output", "json"]);
    assert!(ok, "{err}");
    assert_eq!(common::json(&out)["jobs"].as_array().map(Vec::len), Some(0), "a refused job is listed: {out}");
    // Read-only: a later submit is refused too, rather than applied in memory.
    let (code, _) = curl(&[
        "-XPOST",
        "-H",
        auth,
        "-d",
        r#"{"name":"x","tenant":"t","gpus":1,"command":["true"]}"#,
        &format!("{}/v1/jobs", s.url),
    ]);
    assert_eq!(code, 503);
    assert!(!dir.path().join("a1/logs/job-1").exists(), "no agent ran a refused job");
    // Started on the full disk, the server says so at once.
    drop(s);
    let s = Server::start(&data, port, &[]);
    let (code, _) = curl(&[&format!("{}/v1/health", s.url)]);
    assert_eq!(code, 503, "a store that cannot be written is reported at start");
    // Space again: after a restart the refused jobs are absent, and new work runs.
    drop(s);
    std::fs::remove_file(data.join("fill")).unwrap();
    let s = Server::start(&data, port, &[]);
    let (code, _) = curl(&[&format!("{}/v1/health", s.url)]);
    assert_eq!(code, 200);
    let (_, out, _) = s.cli("admin-secret", &["jobs", "--output", "json"]);
    assert_eq!(common::json(&out)["jobs"].as_array().map(Vec::len), Some(0), "a refused job came back: {out}");
    let id = s.submit(&["--gpus", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "succeeded");
}
