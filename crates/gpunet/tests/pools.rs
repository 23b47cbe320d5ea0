//! Node pools and spot reclaims, live: the real server with pools of real agent processes (the `local` provider, and
//! an `exec` provider whose hooks start agents), reclaim notices, and gangs stitched across zones.

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path, body: &str) -> String {
    let p = dir.join("server.toml");
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

fn pools(s: &Server) -> serde_json::Value {
    serde_json::from_str(&s.get("/v1/pools")).unwrap_or(serde_json::Value::Null)
}

/// The sizing decisions the first pool has made.
fn decisions(s: &Server) -> u64 {
    pools(s)[0]["decisions"].as_u64().unwrap_or(0)
}

/// Waits until the first pool has made `n` more sizing decisions than now: each after anything this test asked of
/// the server before the call, whose answer came back first (the owner handles requests and decisions in turn).
fn wait_decisions(s: &Server, n: u64) {
    let from = decisions(s);
    wait_for(Duration::from_secs(60), || decisions(s) >= from + n);
}

fn pool_events(s: &Server, kind: &str) -> Vec<serde_json::Value> {
    pools(s)[0]["events"].as_array().cloned().unwrap_or_default().into_iter().filter(|e| e["kind"] == kind).collect()
}

fn nodes_up(s: &Server) -> usize {
    pools(s)[0]["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["phase"] == "up").count())
}

fn show(s: &Server, id: u64) -> serde_json::Value {
    let (_, out, _) = s.cli("admin-secret", &["show", &id.to_string(), "--output", "json"]);
    serde_json::from_str(&out).unwrap_or(serde_json::Value::Null)
}

fn tenant(s: &Server) {
    let (ok, o, e) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{o}{e}");
}

/// The agents an exec hook started (not the server's children): stopped at the end of the test, whatever happens.
struct HookAgents(std::path::PathBuf);

impl Drop for HookAgents {
    fn drop(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.0) else { return };
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "pid") {
                let pid = read(&e.path());
                let _ = std::process::Command::new("kill").args(["-INT", &pid]).status();
                let t = Instant::now();
                while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(15) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

#[test]
fn a_burst_grows_the_spot_pool_to_its_max_and_an_empty_queue_shrinks_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "[[pools]]\nname = \"spot\"\nprovider = \"local\"\ngpu_model = \"A10\"\ngpus_per_node = 4\nzone = \"zs\"\n\
         min_nodes = 0\nmax_nodes = 3\ninterval_s = 0.3\nwindow = 5\ncooldown_s = 4.0\nboot_timeout_s = 60.0\n",
    );
    let s = Server::start(&dir.path().join("data"), free_port(), &["--config", &cfg]);
    tenant(&s);
    assert_eq!(pools(&s)[0]["target_nodes"], 0, "{}", pools(&s));
    // A dry run says that the pool can grow a node for a job that may use spot (no node holds it yet), and not for
    // one that may not.
    let dry = |spot: &str| {
        let body = format!(r#"{{"name": "d", "gpus": 1, "command": ["true"]{spot}}}"#);
        let o = std::process::Command::new("curl")
            .args(["-sf", "-XPOST", "-H", "Authorization: Bearer admin-secret", "-H", "Content-Type: application/json"])
            .args(["-d", &body])
            .arg(format!("{}/v1/jobs/dry-run?tenant=t", s.url))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        json(&String::from_utf8_lossy(&o.stdout))["warnings"].to_string()
    };
    let w = dry(r#", "spot": "allowed""#);
    assert!(w.contains("a node pool can grow one"), "{w}");
    assert!(!dry("").contains("node pool"));
    let t0 = Instant::now();
    let ids: Vec<u64> = (0..20).map(|_| s.submit(&["--gpus", "1", "--spot", "allowed", "--", "sleep", "3"])).collect();
    // Within the window (a few samples) the pool is sized to its max, and its nodes register.
    wait_for(Duration::from_secs(60), || nodes_up(&s) == 3);
    let grew = t0.elapsed();
    let outs = pool_events(&s, "scale_out");
    assert!(!outs.is_empty());
    for e in &outs {
        assert!(e["numbers"]["forecast_gpus"].as_f64().unwrap() > 0.0, "{e}");
        assert!(e["numbers"]["capacity_gpus"].is_u64(), "{e}");
    }
    assert_eq!(outs.iter().map(|e| e["numbers"]["nodes"].as_array().unwrap().len()).sum::<usize>(), 3, "{outs:?}");
    let m = s.get("/metrics");
    assert!(m.contains("gpunet_pool_target_nodes{pool=\"spot\"} 3"), "{m}");
    assert!(m.contains("gpunet_pool_forecast_gpus{pool=\"spot\"}"), "{m}");
    // Every job runs, on the pool's nodes, billed as spot.
    wait_for(Duration::from_secs(120), || ids.iter().all(|id| s.job_state(*id) == "succeeded"));
    for id in &ids {
        let node = show(&s, *id)["attempts"][0]["placement"][0]["node"].as_str().unwrap_or_default().to_string();
        assert!(node.starts_with("spot-"), "job {id} ran on {node:?}");
    }
    // An empty queue: after the cooldown the pool shrinks back to its minimum, and its nodes are deleted.
    wait_for(Duration::from_secs(90), || {
        let p = pools(&s);
        p[0]["target_nodes"] == 0 && p[0]["nodes"].as_array().is_some_and(|n| n.is_empty())
    });
    let ins = pool_events(&s, "scale_in");
    assert!(!ins.is_empty());
    for e in &ins {
        assert!(e["numbers"]["forecast_gpus"].is_number() && e["numbers"]["load"].is_number(), "{e}");
    }
    assert_eq!(
        pool_events(&s, "deleted").iter().map(|e| e["numbers"]["nodes"].as_array().unwrap().len()).sum::<usize>(),
        3
    );
    let (_, nodes, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
    assert!(!nodes.contains("spot-0000"), "deleted nodes are not listed: {nodes}");
    eprintln!("grew 0 → 3 nodes (registered) in {grew:?}");
}

#[test]
fn a_reclaimed_job_checkpoints_and_resumes_on_another_node_billed_at_the_spot_price() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let tiers = dir.path().join("tiers");
    let cfg = config(
        dir.path(),
        &format!(
            "checkpoint_roots = [\"file://{}/{{tenant}}\"]\n[[pools]]\nname = \"spot\"\ngpu_model = \"A10\"\n\
             gpus_per_node = 1\nmin_nodes = 2\nmax_nodes = 2\ninterval_s = 0.3\ncooldown_s = 1.0\n",
            tiers.display()
        ),
    );
    let s = Server::start(&data, free_port(), &["--config", &cfg]);
    tenant(&s);
    wait_for(Duration::from_secs(60), || nodes_up(&s) == 2);
    // A step counter kept in the checkpoint directory; the tier is copied only hourly, so the job resumes from the
    // snapshot the reclaim takes.
    let script = r#"d="$GPUNET_CHECKPOINT_DIR"; s=$(cat "$d/step" 2>/dev/null || echo 0); echo "resumed at $s"
trap 'echo $s > "$d/step"; echo "checkpointed at $s"; rm -f "$GPUNET_CHECKPOINT_NOW"' USR1
while true; do s=$((s+1)); [ $s = 10 ] && echo "step 10"; sleep 0.1; done"#;
    let yaml = format!(
        "name: steps\ntenant: t\ngpus: 1\nspot: allowed\ncheckpoint_tiers: [{{name: shared, every: 1h, url: \
         \"file://{}/t/steps\"}}]\ncommand: [\"sh\", \"-c\", {}]\n",
        tiers.display(),
        serde_json::to_string(script).unwrap()
    );
    let id = submit_yaml(&s, dir.path(), &yaml);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "running");
    let first = show(&s, id)["attempts"][0]["placement"][0]["node"].as_str().unwrap().to_string();
    // The server's copy of each attempt's log (a deleted node's own goes with it).
    let log0 = data.join(format!("logs/job-{id}/rank-0-attempt-0.log"));
    wait_for(Duration::from_secs(30), || read(&log0).contains("resumed at 0"));
    wait_for(Duration::from_secs(60), || read(&log0).contains("step 10")); // some steps
    let notice = Instant::now();
    let notice_ms = gpunet_now();
    let o = std::process::Command::new("curl")
        .args(["-sf", "-XPOST", "-H", "Authorization: Bearer admin-secret", "-d", r#"{"deadline_s": 10}"#])
        .arg(format!("{}/v1/nodes/{first}/reclaim", s.url))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // A bad notice is refused, naming the field.
    let bad = std::process::Command::new("curl")
        .args(["-s", "-XPOST", "-H", "Authorization: Bearer admin-secret", "-d", r#"{"deadline_s": -1}"#])
        .arg(format!("{}/v1/nodes/{first}/reclaim", s.url))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stdout).contains("deadline_s"));
    // The job checkpoints, stops before the deadline, and runs again on the other node from that checkpoint.
    wait_for(Duration::from_secs(30), || show(&s, id)["attempts"].as_array().is_some_and(|a| a.len() == 2));
    let j = show(&s, id);
    let ended = j["attempts"][0]["ended_ms"].as_u64().unwrap();
    let second = j["attempts"][1]["placement"][0]["node"].as_str().unwrap().to_string();
    assert_ne!(second, first, "it resumed on another node");
    assert!(notice.elapsed() < Duration::from_secs(30));
    assert!((ended as i64) - notice_ms < 10_000, "the first attempt ended before the 10 s deadline");
    wait_for(Duration::from_secs(30), || read(&log0).contains("checkpointed at"));
    let saved: u64 = read(&log0)
        .lines()
        .find_map(|l| l.strip_prefix("checkpointed at "))
        .unwrap_or_else(|| panic!("no checkpoint in {}", read(&log0)))
        .parse()
        .unwrap();
    assert!(saved > 5, "it had made progress: {saved}");
    let log1 = data.join(format!("logs/job-{id}/rank-0-attempt-1.log"));
    wait_for(Duration::from_secs(30), || read(&log1).contains("resumed at"));
    assert!(read(&log1).contains(&format!("resumed at {saved}")), "{}", read(&log1));
    let (_, ev, _) = s.cli("admin-secret", &["show", &id.to_string()]);
    assert!(ev.contains("checkpoint_now") || ev.contains("asked to checkpoint now"), "{ev}");
    assert!(j["attempts"][0]["outcome"].as_str().is_some_and(|o| o != "failed"), "{j}");
    // The reclaimed node is deleted once empty; the pool is back to its two nodes.
    wait_for(Duration::from_secs(60), || {
        pool_events(&s, "deleted").iter().any(|e| e["numbers"]["nodes"].to_string().contains(&first))
    });
    wait_for(Duration::from_secs(60), || nodes_up(&s) == 2);
    let (ok, _, e) = s.cli("admin-secret", &["cancel", &id.to_string()]);
    assert!(ok, "{e}");
    wait_for(Duration::from_secs(30), || s.job_state(id) == "cancelled");
    // Spot GPU-seconds at the catalogue's spot price of an A10 ($0.24 per GPU-hour).
    let u = json(&s.get("/v1/usage?tenant=t"));
    let spot = &u["by_model"]["A10/spot"];
    let (h, c) = (spot["gpu_hours"].as_f64().unwrap(), spot["gpu_cost"].as_f64().unwrap());
    assert!(h > 0.0 && (c / h - 0.24).abs() < 1e-6, "{u}");
    let (ok, bill, _) = s.cli("admin-secret", &["bill", "--by", "lifecycle"]);
    assert!(ok && bill.contains("spot"), "{bill}");
    eprintln!("notice to the first attempt's end: {} ms", ended as i64 - notice_ms);
}

/// Writes an executable script.
fn script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// An exec pool of 0..1 on-demand T4 nodes with these hooks and boot timeout, deciding every 0.3 s.
fn exec_pool(name: &str, resume: &Path, suspend: &Path, boot_timeout_s: f64) -> String {
    format!(
        "[[pools]]\nname = \"{name}\"\nprovider = \"exec\"\nresume_program = \"{}\"\nsuspend_program = \"{}\"\n\
         hook_timeout_s = 30.0\ngpu_model = \"T4\"\ngpus_per_node = 1\nlifecycle = \"on-demand\"\nmin_nodes = 0\n\
         max_nodes = 1\nboot_timeout_s = {boot_timeout_s:?}\ninterval_s = 0.3\ncooldown_s = 0.5\n",
        resume.display(),
        suspend.display()
    )
}

/// The part of an exec resume hook that starts a detached agent for each node it is given (after `shift`), its pid in
/// `STATE/NODE.pid` for the suspend hook and [`HookAgents`].
fn start_agents(state: &Path) -> String {
    let st = state.display();
    format!(
        "for node in \"$@\"; do\n\
           tok=$(printf '%s\\n' $GPUNET_NODE_TOKENS | sed -n \"s/^$node=//p\")\n\
           GPUNET_JOIN_TOKEN=$tok setsid {BIN} agent --server \"$GPUNET_SERVER\" --name \"$node\" --labels \"$GPUNET_POOL_LABELS\" \
         --fake-gpus \"${{GPUNET_POOL_GPUS}}x$GPUNET_POOL_GPU_MODEL\" --data-dir {st}/$node --no-tenant-uids \
         > {st}/$node.log 2>&1 < /dev/null &\n  echo $! > {st}/$node.pid\ndone\n"
    )
}

fn gpunet_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn failed_hooks_and_a_node_that_never_registers_are_retried_with_backoff_and_no_job_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("hook");
    std::fs::create_dir_all(&state).unwrap();
    let _agents = HookAgents(state.clone());
    let st = state.display();
    let resume = dir.path().join("resume.sh");
    let suspend = dir.path().join("suspend.sh");
    script(
        &resume,
        &format!(
            "#!/bin/sh\nn=$(cat {st}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {st}/count\n\
             echo \"resume $n $*\" >> {st}/calls\n\
             [ $n -eq 1 ] && {{ echo 'quota exceeded' >&2; exit 1; }}\n\
             [ $n -eq 2 ] && exit 0\n\
             shift\n{agents}",
            agents = start_agents(&state)
        ),
    );
    script(
        &suspend,
        &format!(
            "#!/bin/sh\necho \"suspend $*\" >> {st}/calls\nshift\nfor node in \"$@\"; do\n\
             [ -f {st}/$node.pid ] && kill -INT $(cat {st}/$node.pid) && rm {st}/$node.pid\ndone\nexit 0\n"
        ),
    );
    let cfg = config(dir.path(), &exec_pool("cloud", &resume, &suspend, 10.0));
    let s = Server::start(&dir.path().join("data"), free_port(), &["--config", &cfg]);
    tenant(&s);
    let id = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "sh", "-c", "echo ran"]);
    wait_for(Duration::from_secs(90), || s.job_state(id) == "succeeded");
    let calls = read(&state.join("calls"));
    let lines: Vec<&str> = calls.lines().collect();
    assert!(lines.first().is_some_and(|l| l.starts_with("resume 1 cloud cloud-00001")), "{calls}");
    assert!(lines.iter().any(|l| l.starts_with("resume 2 cloud cloud-00002")), "{calls}");
    assert!(lines.iter().any(|l| l.starts_with("suspend cloud cloud-00002")), "the node that never came: {calls}");
    assert!(lines.iter().any(|l| l.starts_with("resume 3 cloud cloud-00003")), "{calls}");
    let failed = pool_events(&s, "resume_failed");
    assert!(failed.first().is_some_and(|e| e["message"].as_str().unwrap().contains("quota exceeded")), "{failed:?}");
    let late = pool_events(&s, "boot_timeout");
    assert!(late.first().is_some_and(|e| e["message"].as_str().unwrap().contains("cloud-00002")), "{late:?}");
    // Backoff: 5 s after the first failure, 10 s after the second.
    let outs = pool_events(&s, "scale_out");
    let at: Vec<u64> = outs.iter().map(|e| e["at_ms"].as_u64().unwrap()).collect();
    assert!(at.len() >= 3, "{outs:?}");
    assert!(at[1] - at[0] >= 4_900, "{at:?}");
    assert!(at[2] - at[1] >= 9_900, "{at:?}");
    assert_eq!(show(&s, id)["attempts"][0]["placement"][0]["node"], "cloud-00003");
}

#[test]
fn a_gang_is_stitched_across_zones_only_when_no_zone_has_room() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), free_port(), &[]);
    tenant(&s);
    let _a = s.agent_with("n1", "1xT4", dir.path(), "10.0.0.1", &["--labels", "zone=z1"]);
    let _b = s.agent_with("n2", "1xT4", dir.path(), "10.0.0.2", &["--labels", "zone=z2"]);
    let gang = "name: gang\ntenant: t\ntasks: 2\ngpus: 1\ntopology: any\ncommand: [\"sh\", \"-c\", \
                \"echo zones=$GPUNET_ZONES addresses=$GPUNET_NODE_ADDRESSES ib=$NCCL_IB_DISABLE\"]\n";
    // It runs long enough to be explained while it runs.
    let a = submit_yaml(&s, dir.path(), &gang.replace("ib=$NCCL_IB_DISABLE", "ib=$NCCL_IB_DISABLE; sleep 2"));
    wait_for(Duration::from_secs(30), || s.job_state(a) == "running");
    let (_, why, _) = s.cli("admin-secret", &["why", &a.to_string()]);
    assert!(why.contains("runs across zones z1, z2"), "{why}");
    wait_for(Duration::from_secs(30), || s.job_state(a) == "succeeded");
    let (_, ev, _) = s.cli("admin-secret", &["show", &a.to_string()]);
    assert!(ev.contains("across zones z1, z2"), "{ev}");
    let (_, log, _) = s.cli("admin-secret", &["logs", &a.to_string()]);
    assert!(log.contains("zones=z1,z2 addresses=10.0.0.1,10.0.0.2 ib=1"), "{log}");
    // A zone with room for the whole gang: it stays there, though the two zones' nodes are free too.
    let _c = s.agent_with("n3", "1xT4", dir.path(), "10.0.0.3", &["--labels", "zone=z3"]);
    let _d = s.agent_with("n4", "1xT4", dir.path(), "10.0.0.4", &["--labels", "zone=z3"]);
    let b = submit_yaml(&s, dir.path(), gang);
    wait_for(Duration::from_secs(30), || s.job_state(b) == "succeeded");
    let j = show(&s, b);
    let mut nodes: Vec<String> = j["attempts"][0]["placement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["node"].as_str().unwrap().to_string())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["n3", "n4"]);
    let (_, ev, _) = s.cli("admin-secret", &["show", &b.to_string()]);
    assert!(!ev.contains("across zones"), "{ev}");
}

#[test]
fn an_agents_notice_command_reclaims_its_own_node() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), free_port(), &[]);
    tenant(&s);
    let trigger = dir.path().join("notice");
    let notice = dir.path().join("notice.sh");
    script(&notice, &format!("#!/bin/sh\n[ -f {} ] && echo 30\nexit 0\n", trigger.display()));
    let _a = s.agent_with("n1", "1xT4", dir.path(), "127.0.0.1", &["--notice-command", notice.to_str().unwrap()]);
    let id = s.submit(&["--gpus", "1", "--", "sleep", "300"]);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "running");
    std::fs::write(&trigger, "").unwrap();
    // The agent's next run of the command (every 5 s) sends its node's notice: the node takes no new work, and the
    // job, which has no checkpoint tier, stops at once and waits for another node.
    wait_for(Duration::from_secs(30), || {
        let (_, out, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        out.contains("\"cordoned\"") || out.contains("\"draining\"")
    });
    wait_for(Duration::from_secs(30), || s.job_state(id) == "preempted");
    let (_, ev, _) = s.cli("admin-secret", &["show", &id.to_string()]);
    assert!(ev.contains("node n1 is reclaimed"), "{ev}");
    let (ok, _, e) = s.cli("admin-secret", &["cancel", &id.to_string()]);
    assert!(ok, "{e}");
}

/// A job that does not answer the notice is stopped at the deadline and resumes elsewhere from its last tier copy.
#[test]
fn a_job_that_ignores_the_notice_is_stopped_at_the_deadline_and_resumes_from_its_last_copy() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let tiers = dir.path().join("tiers");
    let cfg = config(
        dir.path(),
        &format!(
            "checkpoint_roots = [\"file://{}/{{tenant}}\"]\n[[pools]]\nname = \"spot\"\ngpu_model = \"A10\"\n\
             gpus_per_node = 1\nmin_nodes = 3\nmax_nodes = 3\ninterval_s = 0.3\ncooldown_s = 1.0\n",
            tiers.display()
        ),
    );
    let s = Server::start(&data, free_port(), &["--config", &cfg]);
    tenant(&s);
    wait_for(Duration::from_secs(60), || nodes_up(&s) == 3);
    // A job with a tier and no handler for SIGUSR1 (the notice's signal kills it): not its failure, it moves.
    let plain = submit_yaml(
        &s,
        dir.path(),
        &format!(
            "name: plain\ntenant: t\ngpus: 1\nspot: allowed\nmax_restarts: 0\ncheckpoint_tiers: [{{name: shared, \
             every: 1h, url: \"file://{}/t/plain\"}}]\ncommand: [\"sleep\", \"1000\"]\n",
            tiers.display()
        ),
    );
    wait_for(Duration::from_secs(30), || s.job_state(plain) == "running");
    // It writes its step every tenth of a second (copied to the tier every second) and ignores SIGUSR1.
    let script = r#"d="$GPUNET_CHECKPOINT_DIR"; s=$(cat "$d/step" 2>/dev/null || echo 0); echo "resumed at $s"
trap '' USR1
while true; do s=$((s+1)); echo $s > "$d/step"; [ $s = 40 ] && echo "step 40"; sleep 0.1; done"#;
    let yaml = format!(
        "name: stubborn\ntenant: t\ngpus: 1\nspot: allowed\ncheckpoint_tiers: [{{name: shared, every: 1s, url: \
         \"file://{}/t/stubborn\"}}]\ncommand: [\"sh\", \"-c\", {}]\n",
        tiers.display(),
        serde_json::to_string(script).unwrap()
    );
    let id = submit_yaml(&s, dir.path(), &yaml);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "running");
    let first = show(&s, id)["attempts"][0]["placement"][0]["node"].as_str().unwrap().to_string();
    // Past step 40, the tier (copied every second) holds step 20 or later: its copy made at least a second of steps
    // after step 20.
    let log0 = data.join(format!("logs/job-{id}/rank-0-attempt-0.log"));
    wait_for(Duration::from_secs(60), || read(&log0).contains("step 40"));
    let notice_ms = gpunet_now();
    let o = std::process::Command::new("curl")
        .args(["-sf", "-XPOST", "-H", "Authorization: Bearer admin-secret", "-d", r#"{"deadline_s": 3}"#])
        .arg(format!("{}/v1/nodes/{first}/reclaim", s.url))
        .output()
        .unwrap();
    assert!(o.status.success());
    wait_for(Duration::from_secs(30), || show(&s, id)["attempts"].as_array().is_some_and(|a| a.len() == 2));
    let j = show(&s, id);
    let ended = j["attempts"][0]["ended_ms"].as_u64().unwrap() as i64;
    assert!(ended - notice_ms >= 2_900, "it ran until the deadline: {} ms", ended - notice_ms);
    let second = j["attempts"][1]["placement"][0]["node"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    let log1 = data.join(format!("logs/job-{id}/rank-0-attempt-1.log"));
    wait_for(Duration::from_secs(30), || read(&log1).contains("resumed at"));
    let resumed: u64 = read(&log1).lines().find_map(|l| l.strip_prefix("resumed at ")).unwrap().parse().unwrap();
    assert!(resumed >= 20, "it resumed from a tier copy of its progress (40 steps and more): {resumed}");
    // The plain job's node is reclaimed too: SIGUSR1 ends it, and it runs again elsewhere, not failed (it has no
    // restart left to spend).
    let plain_node = show(&s, plain)["attempts"][0]["placement"][0]["node"].as_str().unwrap().to_string();
    let o = std::process::Command::new("curl")
        .args(["-sf", "-XPOST", "-H", "Authorization: Bearer admin-secret", "-d", r#"{"deadline_s": 30}"#])
        .arg(format!("{}/v1/nodes/{plain_node}/reclaim", s.url))
        .output()
        .unwrap();
    assert!(o.status.success());
    wait_for(Duration::from_secs(60), || {
        let j = show(&s, plain);
        j["attempts"].as_array().is_some_and(|a| a.len() == 2) && j["state"] == "running"
    });
    let j = show(&s, plain);
    assert_eq!(j["restarts"], 0, "{j}");
    assert_ne!(j["attempts"][0]["outcome"], "failed", "{j}");
    for job in [id, plain] {
        let (ok, _, e) = s.cli("admin-secret", &["cancel", &job.to_string()]);
        assert!(ok, "{e}");
        wait_for(Duration::from_secs(30), || s.job_state(job) == "cancelled");
    }
}

/// A restarted server: its local pool's agents died with it; their nodes are deleted and new ones (named after the
/// highest) replace them, and no agent of the old server is left running.
#[test]
fn a_restarted_server_replaces_its_local_pool_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(
        dir.path(),
        "[[pools]]\nname = \"spot\"\ngpu_model = \"A10\"\ngpus_per_node = 1\nmin_nodes = 1\nmax_nodes = 1\n\
         interval_s = 0.3\ncooldown_s = 0.5\n",
    );
    let s = Server::start(&data, free_port(), &["--config", &cfg]);
    wait_for(Duration::from_secs(60), || nodes_up(&s) == 1);
    let agent_pid = |node: &str| {
        // This test's agent only: its data directory is beneath this test's.
        let pattern = format!("--data-dir {}/pools/spot/{node}", data.display());
        let out = std::process::Command::new("pgrep").args(["-f", "--", &pattern]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(!agent_pid("spot-00001").is_empty(), "the local agent runs");
    drop(s);
    wait_for(Duration::from_secs(30), || agent_pid("spot-00001").is_empty());
    let s = Server::start(&data, free_port(), &["--config", &cfg]);
    wait_for(Duration::from_secs(60), || {
        let p = pools(&s);
        p[0]["nodes"].as_array().is_some_and(|n| n.len() == 1 && n[0]["name"] == "spot-00002" && n[0]["phase"] == "up")
    });
    assert!(pool_events(&s, "deleted").iter().any(|e| e["numbers"]["nodes"].to_string().contains("spot-00001")));
    let (_, nodes, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
    assert!(!nodes.contains("spot-00001"), "{nodes}");
}

/// A machine that comes up after its pool gave up on it (boot timeout) registers cordoned: no job starts on a node
/// that is being deleted.
#[test]
fn a_node_registering_while_its_pool_deletes_it_takes_no_work() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("hook");
    std::fs::create_dir_all(&state).unwrap();
    let _agents = HookAgents(state.clone());
    let st = state.display();
    let resume = dir.path().join("resume.sh");
    let suspend = dir.path().join("suspend.sh");
    // The first machine's agent starts only once its pool gave up on it (the suspend hook was called: its boot timeout
    // passed); later ones at once. Deleting it ends only once the test saw the late agent registered: no sleeps, so a
    // loaded machine cannot reorder them. The boot timeout is long enough for the next machine's agent to register on
    // a loaded machine.
    script(
        &resume,
        &format!(
            "#!/bin/sh\nn=$(cat {st}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {st}/count\n\
             wait=true; [ $n -eq 1 ] && wait='until [ -f {st}/calls ]; do sleep 0.1; done'\nshift\n\
             for node in \"$@\"; do\n\
               tok=$(printf '%s\\n' $GPUNET_NODE_TOKENS | sed -n \"s/^$node=//p\")\n\
               GPUNET_JOIN_TOKEN=$tok setsid sh -c \"$wait; exec {BIN} agent --server $GPUNET_SERVER --name $node --labels \
             $GPUNET_POOL_LABELS --fake-gpus ${{GPUNET_POOL_GPUS}}x$GPUNET_POOL_GPU_MODEL --data-dir {st}/$node \
             --no-tenant-uids\" > {st}/$node.log 2>&1 < /dev/null &\n  echo $! > {st}/$node.pid\ndone\n"
        ),
    );
    script(
        &suspend,
        &format!(
            "#!/bin/sh\necho \"suspend $*\" >> {st}/calls\n\
             i=0; until [ -f {st}/go ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done\nshift\n\
             for node in \"$@\"; do\n\
             [ -f {st}/$node.pid ] && kill -INT $(cat {st}/$node.pid) && rm {st}/$node.pid\ndone\nexit 0\n"
        ),
    );
    // Long enough for the next machine's agent to register on a loaded CI machine (a miss there starts a chain of
    // backoffs): the first one waits for its deletion anyway.
    let cfg = config(dir.path(), &exec_pool("late", &resume, &suspend, 20.0));
    let s = Server::start(&dir.path().join("data"), free_port(), &["--config", &cfg]);
    tenant(&s);
    let id = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "sh", "-c", "echo ran"]);
    // The late agent registers while its node is being deleted: cordoned.
    wait_for(Duration::from_secs(90), || {
        let (_, out, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .is_some_and(|a| a.iter().any(|n| n["name"] == "late-00001"))
    });
    let (_, out, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
    let nodes = json(&out);
    let late = nodes.as_array().unwrap().iter().find(|n| n["name"] == "late-00001").unwrap();
    assert_eq!(late["state"], "cordoned", "{late}");
    // An admin cannot put it back to work either.
    let (ok, _, err) = s.cli("admin-secret", &["uncordon", "late-00001"]);
    assert!(!ok && err.contains("being deleted"), "{err}");
    std::fs::write(state.join("go"), "").unwrap();
    // The job runs on the next machine, never on the one being deleted (what the pool did, should it not).
    let t = std::time::Instant::now();
    while s.job_state(id) != "succeeded" {
        if t.elapsed() > Duration::from_secs(90) {
            let (_, nodes, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
            let (_, why, _) = s.cli("admin-secret", &["why", &id.to_string()]);
            panic!(
                "the job did not succeed within 90 s; job: {}\nwhy: {why}\nevents: {}\npool: {}\nnodes: {nodes}\n\
                 hook calls: {}",
                show(&s, id),
                s.get(&format!("/v1/jobs/{id}/events")),
                pools(&s),
                read(&state.join("calls"))
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(show(&s, id)["attempts"][0]["placement"][0]["node"], "late-00002");
    assert!(read(&state.join("calls")).contains("suspend late late-00001"));
}

/// A restart in the middle: a machine asked for and not registered keeps its name (a new one is asked for under
/// the next name) and its boot timeout; a reclaim keeps its deadline.
#[test]
fn booting_nodes_and_reclaims_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let calls = dir.path().join("calls");
    let hook = dir.path().join("hook.sh");
    // Machines that never come up.
    script(&hook, &format!("#!/bin/sh\necho \"$(basename $0) $*\" >> {}\nexit 0\n", calls.display()));
    let cfg = config(
        dir.path(),
        &format!(
            "[[pools]]\nname = \"cloud\"\nprovider = \"exec\"\nresume_program = \"{h}\"\nsuspend_program = \"{h}\"\n\
             gpu_model = \"T4\"\ngpus_per_node = 1\nlifecycle = \"on-demand\"\nmin_nodes = 1\nmax_nodes = 1\n\
             boot_timeout_s = 4.0\ninterval_s = 0.3\ncooldown_s = 0.5\n",
            h = hook.display()
        ),
    );
    let port = free_port();
    let s = Server::start(&data, port, &["--config", &cfg]);
    let _n = s.agent("n1", "1xT4", dir.path(), "127.0.0.1");
    wait_for(Duration::from_secs(30), || read(&calls).contains("cloud cloud-00001"));
    let o = std::process::Command::new("curl")
        .args(["-sf", "-XPOST", "-H", "Authorization: Bearer admin-secret", "-d", r#"{"deadline_s": 12}"#])
        .arg(format!("{}/v1/nodes/n1/reclaim", s.url))
        .output()
        .unwrap();
    assert!(o.status.success());
    let deadline = json(&String::from_utf8_lossy(&o.stdout))["reclaim_deadline_ms"].as_u64().expect("deadline shown");
    let node = |s: &Server| {
        let (_, out, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .and_then(|a| a.iter().find(|n| n["name"] == "n1").cloned())
            .unwrap_or_default()
    };
    let node_state = |s: &Server| node(s)["state"].as_str().unwrap_or("").to_string();
    assert_eq!(node_state(&s), "cordoned");
    drop(s);
    let s = Server::start(&data, port, &["--config", &cfg]);
    // The booting machine is followed again (booting, not asked for anew), then given up at its boot timeout.
    let p = pools(&s);
    assert_eq!(p[0]["nodes"][0]["name"], "cloud-00001", "{p}");
    assert_eq!(p[0]["nodes"][0]["phase"], "booting", "{p}");
    wait_for(Duration::from_secs(30), || read(&calls).contains("cloud-00002"));
    let c = read(&calls);
    assert_eq!(c.matches("cloud cloud-00001").count(), 2, "asked for once, deleted once: {c}");
    assert!(
        c.lines().position(|l| l.contains("cloud cloud-00001") && l.starts_with("hook.sh"))
            < c.lines().position(|l| l.contains("cloud-00002")),
        "{c}"
    );
    // The reclaim's deadline still holds, through the agent's re-registration with the new server (still
    // cordoned): the node drains.
    let v = node(&s);
    if v["state"] == "cordoned" {
        assert_eq!(v["reclaim_deadline_ms"], deadline, "{v}");
    } else {
        assert_eq!(v["state"], "draining", "a slow restart: the deadline passed already: {v}");
    }
    wait_for(Duration::from_secs(30), || node_state(&s) == "draining");
    // Over: the deadline is off the node's record. An admin puts the node back to work and a restart leaves it so
    // (the finished reclaim is not taken up again: the first boot timeout after the start shows the pools' ticks ran).
    wait_for(Duration::from_secs(10), || node(&s).get("reclaim_deadline_ms").is_none());
    let (ok, o, e) = s.cli("admin-secret", &["uncordon", "n1"]);
    assert!(ok, "{o}{e}");
    drop(s);
    let s = Server::start(&data, port, &["--config", &cfg]);
    wait_for(Duration::from_secs(30), || !pool_events(&s, "boot_timeout").is_empty());
    assert_eq!(node_state(&s), "ready", "{}", node(&s));
}

/// `scale_in = "checkpointed"`: with no idle node to give back, a node whose jobs all checkpoint to a tier is drained
/// (its job queued again, to resume from its checkpoint) and deleted.
#[test]
fn checkpointed_scale_in_drains_a_busy_node_when_none_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let (resume, tokens) = (dir.path().join("resume.sh"), dir.path().join("tokens"));
    script(&resume, &format!("#!/bin/sh\necho \"$GPUNET_NODE_TOKENS\" >> {}\n", tokens.display()));
    let cfg = config(
        dir.path(),
        &format!(
            "[[pools]]\nname = \"pool\"\nprovider = \"exec\"\nresume_program = \"{}\"\n\
         suspend_program = \"/bin/true\"\ngpu_model = \"T4\"\ngpus_per_node = 4\nlifecycle = \"on-demand\"\n\
         min_nodes = 0\nmax_nodes = 2\ninterval_s = 0.3\ncooldown_s = 0.5\nwindow = 1\nlow = 0.8\nhigh = 2.0\n\
         target = 1.5\nscale_in = \"checkpointed\"\n",
            resume.display()
        ),
    );
    let s = Server::start(&dir.path().join("data"), free_port(), &["--config", &cfg]);
    tenant(&s);
    // Three 3-GPU jobs grow the pool to its two nodes (9 GPUs at target 1.5: 6, two 4-GPU nodes), which register as
    // the pool asks for them (without agents: their tasks' ends are confirmed at once); a job runs on each.
    let spec = "tenant: t\ngpus: 3\ncheckpoint_tiers: [{name: local, every: 1h}]\ncommand: [\"sleep\", \"1000\"]\n";
    let a = submit_yaml(&s, dir.path(), &format!("name: a\n{spec}"));
    let b = submit_yaml(&s, dir.path(), &format!("name: b\n{spec}"));
    let c = submit_yaml(&s, dir.path(), &format!("name: c\n{spec}"));
    let asked = |s: &Server, n: &str| {
        pools(s)[0]["nodes"].as_array().is_some_and(|v| v.iter().any(|x| x["name"] == n && x["phase"] == "booting"))
    };
    wait_for(Duration::from_secs(30), || asked(&s, "pool-00001") && asked(&s, "pool-00002"));
    for n in ["pool-00001", "pool-00002"] {
        let (code, body) = call(&s, &node_token(&tokens, n), "POST", "/v1/nodes", &node_json_of(n, 4, "T4"));
        assert_eq!(code, 201, "{body}");
    }
    wait_for(Duration::from_secs(30), || s.job_state(a) == "running" && s.job_state(b) == "running");
    // The third goes: neither node is idle, and 6 GPUs of demand on 8 is a load of .75, below low (.8); at target 1.5
    // the pool wants 4 GPUs: one node fewer.
    let (ok, o, e) = s.cli("admin-secret", &["cancel", &c.to_string()]);
    assert!(ok, "{o}{e}");
    wait_for(Duration::from_secs(30), || {
        pool_events(&s, "deleted").iter().any(|e| e["numbers"]["nodes"].as_array().is_some_and(|n| n.len() == 1))
    });
    let ins = pool_events(&s, "scale_in");
    let gone = ins[0]["numbers"]["nodes"][0].as_str().unwrap().to_string();
    // The drained node's job was stopped and waits again; the other runs on.
    let (moved, stayed) =
        if show(&s, a)["attempts"][0]["placement"][0]["node"] == gone.as_str() { (a, b) } else { (b, a) };
    let m = show(&s, moved);
    assert!(m["attempts"][0]["ended_ms"].is_u64(), "{m}");
    assert_ne!(m["attempts"][0]["outcome"], "failed", "{m}");
    assert_eq!(s.job_state(stayed), "running");
    // One node left (the drained job's demand may grow the pool again after the cooldown: a booting node).
    let p = pools(&s);
    assert_eq!(p[0]["nodes"].as_array().unwrap().iter().filter(|n| n["phase"] != "booting").count(), 1, "{p}");
    for j in [a, b] {
        let _ = s.cli("admin-secret", &["cancel", &j.to_string()]);
    }
}

/// The pids of the processes whose command line contains `pattern`.
fn pids_of(pattern: &str) -> Vec<String> {
    let out = std::process::Command::new("pgrep").args(["-f", "--", pattern]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

/// Whether process `pid` runs (a zombie does not).
fn alive(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).is_some_and(|st| st != "Z")
}

/// A local spot pool of 1-GPU A10 nodes (`max_nodes`, boot timeout `boot_s`; nodes lost after 1 s, fenced for
/// `fence_s`) with one job running `sleep <marker>` on its first node. Returns the server, its data directory, the
/// job, the task's command-line marker, its pids and the first node's agent pid.
fn local_pool_with_a_job(
    dir: &Path,
    max_nodes: u32,
    boot_s: f64,
    fence_s: &str,
    marker_digit: u32,
) -> (Server, std::path::PathBuf, u64, String, Vec<String>, String) {
    let data = dir.join("data");
    let cfg = config(
        dir,
        &format!(
            "[[pools]]\nname = \"spot\"\ngpu_model = \"A10\"\ngpus_per_node = 1\nmin_nodes = 1\n\
             max_nodes = {max_nodes}\nboot_timeout_s = {boot_s:?}\ninterval_s = 0.3\ncooldown_s = 0.5\n"
        ),
    );
    let s =
        Server::start(&data, free_port(), &["--config", &cfg, "--node-lost-after-s", "1", "--node-fence-s", fence_s]);
    tenant(&s);
    wait_for(Duration::from_secs(60), || nodes_up(&s) == 1);
    // A command line no other test runs.
    let marker = format!("sleep {marker_digit}{:03}", std::process::id() % 1000);
    let id = s.submit(&["--gpus", "1", "--spot", "allowed", "--", "sh", "-c", &format!("{marker}; true")]);
    wait_for(Duration::from_secs(60), || s.job_state(id) == "running" && !pids_of(&marker).is_empty());
    let first: Vec<String> = pids_of(&marker);
    let agent = pids_of(&format!("--data-dir {}/pools/spot/spot-00001", data.display()));
    assert_eq!(agent.len(), 1, "{agent:?}");
    (s, data, id, marker, first, agent[0].clone())
}

/// A local pool node whose agent is killed (`kill -9`: it stops nothing) is lost; once lost for longer than the boot
/// timeout — here longer than the lost node's fence, after which the server no longer counts it as lost — it is
/// deleted, its "machine" switched off (the task its agent left is killed), and replaced.
#[test]
fn a_pool_node_whose_agent_dies_is_deleted_with_its_tasks_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (s, data, id, marker, first, agent) = local_pool_with_a_job(dir.path(), 1, 10.0, "1", 3);
    assert!(std::process::Command::new("kill").args(["-9", &agent]).status().unwrap().success());
    // Deleted (its task killed with it) and replaced; the job runs again on the new node.
    wait_for(Duration::from_secs(60), || {
        pool_events(&s, "node_lost").iter().any(|e| e["numbers"]["nodes"].to_string().contains("spot-00001"))
    });
    wait_for(Duration::from_secs(60), || {
        pool_events(&s, "deleted").iter().any(|e| e["numbers"]["nodes"].to_string().contains("spot-00001"))
    });
    wait_for(Duration::from_secs(30), || first.iter().all(|p| !alive(p)));
    wait_for(Duration::from_secs(60), || {
        let p = pools(&s);
        p[0]["nodes"].as_array().is_some_and(|n| n.len() == 1 && n[0]["name"] == "spot-00002" && n[0]["phase"] == "up")
    });
    wait_for(Duration::from_secs(60), || {
        s.job_state(id) == "running" && show(&s, id)["attempts"].as_array().is_some_and(|a| a.len() >= 2)
    });
    let attempts = show(&s, id)["attempts"].clone();
    assert_eq!(attempts.as_array().unwrap().last().unwrap()["placement"][0]["node"], "spot-00002", "{attempts}");
    assert!(!Path::new(&data.join("pools/spot/spot-00001")).exists(), "the deleted node's directory goes");
    drop(s);
    // The server's agents stop their tasks as it stops.
    wait_for(Duration::from_secs(30), || pids_of(&marker).is_empty());
}

/// A resume hook that fails after its machine's agent registered: the node is cordoned (no new work; what runs
/// there ends there), then deleted. And a node is never deleted while its resume hook still runs: a deletion could
/// overtake the creation at the provider.
#[test]
fn a_node_is_deleted_only_after_its_resume_hook_ended_and_cordoned_if_that_hook_failed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("hook");
    std::fs::create_dir_all(&state).unwrap();
    let _agents = HookAgents(state.clone());
    let st = state.display();
    let resume = dir.path().join("resume.sh");
    let suspend = dir.path().join("suspend.sh");
    // The first creation starts its agent, then fails 3 s after it registered; the second succeeds, 6 s after
    // starting its agent.
    script(
        &resume,
        &format!(
            "#!/bin/sh\nn=$(cat {st}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {st}/count\n\
             echo \"resume-begin $n $*\" >> {st}/calls\nshift\n{agents}\
             if [ $n -eq 1 ]; then
  while [ ! -f {st}/$node/node.credential ]; do sleep 0.1; done
  sleep 3; echo \"resume-end $n\" >> {st}/calls; echo 'capacity error' >&2; exit 1; fi\n\
             sleep 6; echo \"resume-end $n\" >> {st}/calls; exit 0\n",
            agents = start_agents(&state)
        ),
    );
    script(
        &suspend,
        &format!(
            "#!/bin/sh\necho \"suspend $*\" >> {st}/calls\nshift\nfor node in \"$@\"; do\n\
             [ -f {st}/$node.pid ] && kill -INT $(cat {st}/$node.pid) && rm {st}/$node.pid\ndone\nexit 0\n"
        ),
    );
    let cfg =
        config(dir.path(), &exec_pool("flaky", &resume, &suspend, 30.0).replace("max_nodes = 1", "max_nodes = 2"));
    let s = Server::start(&dir.path().join("data"), free_port(), &["--config", &cfg]);
    tenant(&s);
    let nodes = |s: &Server| {
        let (_, out, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
        serde_json::from_str::<serde_json::Value>(&out).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
    };
    let state_of = |s: &Server, n: &str| {
        nodes(s).iter().find(|v| v["name"] == n).map(|v| v["state"].as_str().unwrap_or("").to_string())
    };
    // Job A starts on the first machine while its creation is still under way.
    let a = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "sleep", "8"]);
    wait_for(Duration::from_secs(60), || s.job_state(a) == "running");
    assert_eq!(show(&s, a)["attempts"][0]["placement"][0]["node"], "flaky-00001");
    // The creation fails: the node takes no new work, job A goes on.
    wait_for(Duration::from_secs(30), || !pool_events(&s, "resume_failed").is_empty());
    assert!(pool_events(&s, "resume_failed")[0]["message"].as_str().unwrap().contains("capacity error"));
    assert_eq!(state_of(&s, "flaky-00001").as_deref(), Some("cordoned"), "{:?}", nodes(&s));
    assert_eq!(s.job_state(a), "running");
    // Job B waits for the next machine (after the backoff), and runs there; once idle, that node is given back — but
    // only after its creation (still sleeping) returned.
    let b = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "true"]);
    wait_for(Duration::from_secs(60), || s.job_state(b) == "succeeded");
    assert_eq!(show(&s, b)["attempts"][0]["placement"][0]["node"], "flaky-00002");
    wait_for(Duration::from_secs(60), || s.job_state(a) == "succeeded");
    assert_eq!(show(&s, a)["attempts"].as_array().unwrap().len(), 1, "job A was never stopped");
    wait_for(Duration::from_secs(60), || {
        let c = read(&state.join("calls"));
        c.contains("suspend flaky flaky-00001") && c.contains("suspend flaky flaky-00002")
    });
    let c = read(&state.join("calls"));
    let pos = |what: &str| c.lines().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("{what}: {c}"));
    assert!(pos("resume-end 1") < pos("suspend flaky flaky-00001"), "{c}");
    assert!(pos("resume-end 2") < pos("suspend flaky flaky-00002"), "{c}");
    assert!(pool_events(&s, "scale_in").iter().any(|e| e["numbers"]["nodes"].to_string().contains("flaky-00002")));
}

/// `curl` as `token` with this method, path and body: (HTTP status, body).
fn call(s: &Server, token: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let o = std::process::Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, "-H", &format!("Authorization: Bearer {token}")])
        .args(["-d", body])
        .arg(format!("{}{path}", s.url))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let (b, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), b.to_string())
}

/// A node registration of `gpus` GPUs of `model`, asking for a price of its own.
fn node_json_of(name: &str, gpus: usize, model: &str) -> String {
    let g = vec![format!(r#"{{"model":"{model}","numa":0,"nvlink_domain":0,"pcie_switch":0}}"#); gpus].join(",");
    format!(
        r#"{{"spec":{{"name":"{name}","gpus":[{g}],"cpu":32000,"mem":131072,"labels":{{}}}},"fake":true,"price_per_gpu_hour":0.0001}}"#
    )
}

fn node_json(name: &str) -> String {
    node_json_of(name, 1, "T4")
}

/// The registration token the pool gave node `name`, from the lines of `GPUNET_NODE_TOKENS` a resume hook saved.
fn node_token(saved: &Path, name: &str) -> String {
    read(saved)
        .split_whitespace()
        .find_map(|p| p.strip_prefix(&format!("{name}=")).map(str::to_string))
        .unwrap_or_else(|| panic!("no token for {name} in {}", read(saved)))
}

/// A pool's node names are its own: a join token's holder cannot register a name of the pool's form the pool never
/// asked for, nor a node the pool deleted. A node the pool is deleting stays so across a restart (it came back as
/// capacity, never to be deleted), and while its deletion keeps failing it counts against max_nodes (a failing
/// deletion grew the pool past its max, one paid machine after another).
#[test]
fn pool_nodes_being_deleted_stay_so_across_a_restart_count_against_max_and_their_names_stay_the_pools() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let st = dir.path().display().to_string();
    let (resume, suspend) = (dir.path().join("resume.sh"), dir.path().join("suspend.sh"));
    script(
        &resume,
        &format!("#!/bin/sh\necho \"$GPUNET_NODE_TOKENS\" >> {st}/tokens\necho \"resume $*\" >> {st}/calls\nexit 0\n"),
    );
    let tokens = dir.path().join("tokens");
    // Deleting fails until the file `ok` exists.
    script(
        &suspend,
        &format!(
            "#!/bin/sh\necho \"suspend $*\" >> {st}/calls\n[ -f {st}/ok ] || {{ echo 'api down' >&2; exit 1; }}\n"
        ),
    );
    let cfg = config(dir.path(), &exec_pool("cloud", &resume, &suspend, 60.0));
    let port = free_port();
    let s = Server::start(&data, port, &["--config", &cfg]);
    tenant(&s);
    let calls = dir.path().join("calls");
    // A name of the pool's form: never with the join token; not even the admin's when the pool did not ask for it.
    let (code, body) = call(&s, "join-secret", "POST", "/v1/nodes", &node_json("cloud-00007"));
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("not the join token") && body.contains("spec.name"), "{body}");
    let (code, body) = call(&s, "admin-secret", "POST", "/v1/nodes", &node_json("cloud-00007"));
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("did not ask for it") && body.contains("spec.name"), "{body}");
    // A job grows the pool. While its machine boots, its name (shown as booting) cannot be taken with the join token;
    // the node's own token registers it, with the pool's GPUs only, and at the pool's price whatever it asks.
    let a = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "sleep", "300"]);
    wait_for(Duration::from_secs(30), || read(&calls).contains("resume cloud cloud-00001"));
    let (code, body) = call(&s, "join-secret", "POST", "/v1/nodes", &node_json("cloud-00001"));
    assert_eq!(code, 409, "{body}");
    let own = node_token(&tokens, "cloud-00001");
    let (code, body) = call(&s, &own, "POST", "/v1/nodes", &node_json_of("cloud-00001", 4, "A100-80GB"));
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("spec.gpus"), "{body}");
    // The token works once, even for registrations racing each other.
    let answers: Vec<(u16, String)> = std::thread::scope(|sc| {
        let hs: Vec<_> =
            (0..8).map(|_| sc.spawn(|| call(&s, &own, "POST", "/v1/nodes", &node_json("cloud-00001")))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: Vec<&String> = answers.iter().filter(|(c, _)| *c == 201).map(|(_, b)| b).collect();
    assert_eq!(ok.len(), 1, "{answers:?}");
    assert!(answers.iter().all(|(c, _)| *c == 201 || *c == 401), "{answers:?}");
    let price = json(ok[0])["price_per_gpu_hour"].as_f64().unwrap();
    assert!(price > 0.1, "the registrant set its own price: {}", ok[0]);
    wait_for(Duration::from_secs(30), || s.job_state(a) == "running");
    // Once idle the node is scaled in; its deletion fails, again and again.
    let (ok, o, e) = s.cli("admin-secret", &["cancel", &a.to_string()]);
    assert!(ok, "{o}{e}");
    wait_for(Duration::from_secs(30), || !pool_events(&s, "suspend_failed").is_empty());
    assert!(pool_events(&s, "suspend_failed")[0]["message"].as_str().unwrap().contains("api down"));
    // Another job: the node being deleted still fills max_nodes (1), so no second machine is asked for (in four
    // more decisions), and an event says why, once.
    let b = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "true"]);
    wait_for(Duration::from_secs(30), || !pool_events(&s, "scale_out_held").is_empty());
    wait_decisions(&s, 4);
    assert!(!read(&calls).contains("cloud-00002"), "{}", read(&calls));
    let held = pool_events(&s, "scale_out_held");
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0]["message"].as_str().unwrap().contains("being deleted fill max_nodes"), "{held:?}");
    // Once nothing is wanted, a later held-back scale-out is news again.
    let (ok, o, e) = s.cli("admin-secret", &["cancel", &b.to_string()]);
    assert!(ok, "{o}{e}");
    // (the forecast window of 5 samples empties of it: six decisions)
    wait_decisions(&s, 6);
    let b = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "true"]);
    wait_for(Duration::from_secs(30), || pool_events(&s, "scale_out_held").len() == 2);
    assert_eq!(s.job_state(b), "pending");
    // A restart: the node is still being deleted (not capacity again), and still fills max_nodes.
    drop(s);
    let s = Server::start(&data, port, &["--config", &cfg]);
    let p = pools(&s);
    let first = &p[0]["nodes"][0];
    assert_eq!((first["name"].as_str(), first["phase"].as_str()), (Some("cloud-00001"), Some("leaving")), "{p}");
    assert_eq!(p[0]["target_nodes"], 0, "{p}");
    // Deleting works again: the node goes, the next machine comes for job b.
    std::fs::write(dir.path().join("ok"), "").unwrap();
    wait_for(Duration::from_secs(60), || {
        pool_events(&s, "deleted").iter().any(|e| e["numbers"]["nodes"].to_string().contains("cloud-00001"))
    });
    wait_for(Duration::from_secs(30), || read(&calls).contains("resume cloud cloud-00002"));
    // The deleted node's name cannot come back, whoever asks.
    for token in ["join-secret", "admin-secret"] {
        let (code, body) = call(&s, token, "POST", "/v1/nodes", &node_json("cloud-00001"));
        assert_eq!(code, 409, "{token}: {body}");
        assert!(body.contains("deleted by its pool"), "{body}");
    }
    let (code, body) = call(&s, &node_token(&tokens, "cloud-00002"), "POST", "/v1/nodes", &node_json("cloud-00002"));
    assert_eq!(code, 201, "{body}");
    wait_for(Duration::from_secs(30), || s.job_state(b) == "running");
    assert_eq!(show(&s, b)["attempts"][0]["placement"][0]["node"], "cloud-00002");
}

/// Machines smaller than the pool's shape (here 2 cores, against 4 per GPU): the pool counts queued jobs against what
/// they have, so a job that no such machine holds grows no node (it grew nodes that stayed idle, paid for, for good).
/// And a name is never asked for twice, even one whose machine never came, across a restart.
#[test]
fn a_pool_counts_jobs_against_its_real_machines_and_never_reuses_a_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let st = dir.path().display().to_string();
    let resume = dir.path().join("resume.sh");
    script(
        &resume,
        &format!("#!/bin/sh\necho \"$GPUNET_NODE_TOKENS\" >> {st}/tokens\necho \"resume $*\" >> {st}/calls\nexit 0\n"),
    );
    let cfg = config(
        dir.path(),
        // high = target = 1.0: one busy 1-GPU node alone is no reason to grow, and one more job one more node.
        &(exec_pool("cloud", &resume, Path::new("/bin/true"), 3.0).replace("max_nodes = 1", "max_nodes = 3")
            + "high = 1.0\ntarget = 1.0\n"),
    );
    let port = free_port();
    let s = Server::start(&data, port, &["--config", &cfg]);
    tenant(&s);
    let (calls, tokens) = (dir.path().join("calls"), dir.path().join("tokens"));
    let a = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--cpu", "1", "--", "sleep", "300"]);
    wait_for(Duration::from_secs(30), || read(&calls).contains("resume cloud cloud-00001"));
    let small = node_json("cloud-00001").replace(r#""cpu":32000"#, r#""cpu":2000"#);
    let (code, body) = call(&s, &node_token(&tokens, "cloud-00001"), "POST", "/v1/nodes", &small);
    assert_eq!(code, 201, "{body}");
    wait_for(Duration::from_secs(30), || s.job_state(a) == "running");
    let shape = pool_events(&s, "shape");
    assert!(shape.first().is_some_and(|e| e["numbers"]["cpu_millicores"] == 2000), "{shape:?}");
    // A job needing 3 cores: no machine of this pool holds it, so it grows none (in four decisions).
    let b = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--cpu", "3", "--", "true"]);
    wait_decisions(&s, 4);
    assert!(!read(&calls).contains("cloud-00002"), "{}", read(&calls));
    assert_eq!(s.job_state(b), "pending");
    // A job that fits grows a node; it never registers (boot timeout 3 s) and is deleted. A restart before the next
    // try: the next name is asked for, not the deleted one again.
    let (ok, o, e) = s.cli("admin-secret", &["cancel", &b.to_string()]);
    assert!(ok, "{o}{e}");
    let c = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--cpu", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || {
        pool_events(&s, "deleted").iter().any(|e| e["numbers"]["nodes"].to_string().contains("cloud-00002"))
    });
    drop(s);
    let s = Server::start(&data, port, &["--config", &cfg]);
    // The last name asked for (names are zero-padded: they order as strings).
    let last_asked = || read(&calls).lines().rev().find_map(|l| l.strip_prefix("resume cloud ")).map(str::to_string);
    // A name after cloud-00002: cloud-00003, or a later one where the stopping server had asked for cloud-00003 but
    // its hook never ran (the restarted server waits that node's boot out, deletes it and asks for the next).
    wait_for(Duration::from_secs(60), || last_asked().is_some_and(|n| n.as_str() > "cloud-00002"));
    assert_eq!(read(&calls).matches("resume cloud cloud-00002").count(), 1, "{}", read(&calls));
    let next = last_asked().unwrap();
    let (code, body) = call(&s, &node_token(&tokens, &next), "POST", "/v1/nodes", &node_json(&next));
    assert_eq!(code, 201, "{body}");
    wait_for(Duration::from_secs(30), || s.job_state(c) == "succeeded" || s.job_state(c) == "running");
    // The restarted server still counts jobs against its smallest machine: a 3-core job grows nothing.
    let asked = read(&calls).matches("resume ").count();
    let d = s.submit(&["--gpus", "1", "--gpu-model", "T4", "--cpu", "3", "--", "true"]);
    wait_decisions(&s, 4);
    assert_eq!(read(&calls).matches("resume ").count(), asked, "{}", read(&calls));
    assert_eq!(s.job_state(d), "pending");
}

/// A local pool node whose agent is frozen (SIGSTOP): it cannot fence its own task, so when its node is lost the
/// server kills the agent and the task before the fence lets the job run again elsewhere (the job ran twice for
/// half a minute).
#[test]
fn a_frozen_local_agent_and_its_task_are_killed_before_the_job_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _data, id, marker, first, agent) = local_pool_with_a_job(dir.path(), 2, 30.0, "3", 4);
    assert!(std::process::Command::new("kill").args(["-STOP", &agent]).status().unwrap().success());
    // The job runs again (on the second node) only once the frozen agent and its task are gone.
    wait_for(Duration::from_secs(60), || show(&s, id)["attempts"].as_array().is_some_and(|a| a.len() >= 2));
    assert!(first.iter().all(|p| !alive(p)), "the first attempt's task still runs: {first:?}");
    wait_for(Duration::from_secs(10), || !alive(&agent));
    drop(s);
    wait_for(Duration::from_secs(30), || pids_of(&marker).is_empty());
}

/// A server stopped (SIGINT) while an exec hook runs: the hook gets its grace, then is killed with everything in its
/// process group — nothing of it outlives the server (a late creation could make a machine nobody follows).
#[test]
fn a_stopping_server_ends_its_hooks_with_their_process_groups() {
    let dir = tempfile::tempdir().unwrap();
    let resume = dir.path().join("resume.sh");
    let (inner, outer) =
        (format!("sleep 5{:03}", std::process::id() % 1000), format!("sleep 6{:03}", std::process::id() % 1000));
    script(&resume, &format!("#!/bin/sh\n{inner} &\nexec {outer}\n"));
    let cfg = config(dir.path(), &exec_pool("cloud", &resume, Path::new("/bin/true"), 60.0));
    let s = Server::start(&dir.path().join("data"), free_port(), &["--config", &cfg]);
    tenant(&s);
    s.submit(&["--gpus", "1", "--gpu-model", "T4", "--", "true"]);
    wait_for(Duration::from_secs(30), || !pids_of(&outer).is_empty() && !pids_of(&inner).is_empty());
    let pid = s.proc.0.id().to_string();
    let t0 = Instant::now();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    wait_for(Duration::from_secs(60), || !alive(&pid));
    assert!(t0.elapsed() >= Duration::from_secs(9), "no grace for the hook: {:?}", t0.elapsed());
    wait_for(Duration::from_secs(10), || pids_of(&outer).is_empty() && pids_of(&inner).is_empty());
}
