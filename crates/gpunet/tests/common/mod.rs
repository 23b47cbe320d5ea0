//! Helpers shared by the integration tests: the real binary on loopback.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_gpunet");

/// A loopback port free when asked for, and one nothing else on the machine takes meanwhile as a rule: it lies
/// below the kernel's ephemeral range (`ip_local_port_range`), from which outgoing connections (curl, agents,
/// store clients) and `bind(:0)` (PostgreSQL clusters, the bench) take theirs, so only another explicit bind can take
/// it. (A port from `bind(:0)` was taken once by such a connection between the test's ask and the server's bind:
/// "Address already in use".) A counter keeps two tests of one binary from the same port, a start from the pid keeps
/// concurrent test processes apart, and the bind check skips ports held.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()))
        .unwrap_or(32_768);
    let low = ephemeral_low.saturating_sub(12_000).max(10_000);
    let span = ephemeral_low.saturating_sub(low);
    if span < 1_000 {
        return TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    }
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let port = low + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if let Ok(port) = u16::try_from(port) {
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    panic!("no free loopback port in {low}..{ephemeral_low}")
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

/// The agents these helpers started and that run, by pid: name and data directory.
static AGENTS: std::sync::Mutex<std::collections::BTreeMap<u32, (String, std::path::PathBuf)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

impl Proc {
    /// Kills the process with SIGKILL. An agent killed so leaves its tasks and their cgroups, as a machine that died
    /// would (a test may start the agent again, which adopts them); they go when this `Proc` is dropped.
    pub fn kill9(&mut self) {
        let _ = Command::new("kill").args(["-9", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    /// Asks the process to stop (SIGINT: an agent then stops its tasks, so a test leaves none behind), and kills it
    /// when it is still there after 15 s.
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = Command::new("kill").args(["-INT", &self.0.id().to_string()]).status();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(15) {
                if !matches!(self.0.try_wait(), Ok(None)) {
                    // It stopped (an agent: with its tasks).
                    AGENTS.lock().unwrap().remove(&self.0.id());
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        self.machine_gone();
    }
}

impl Proc {
    /// An agent that did not stop its tasks (killed, or not stopped within 15 s): what it left goes as it would with
    /// its machine — its tasks and their cgroups — unless another agent of these helpers runs on its data directory
    /// (started again, it adopted them).
    fn machine_gone(&self) {
        let mut agents = AGENTS.lock().unwrap();
        let Some((name, dir)) = agents.remove(&self.0.id()) else { return };
        if agents.values().any(|(_, d)| *d == dir) {
            return;
        }
        drop(agents);
        gpunet_agent::kill_left_tasks(&name, &dir);
    }
}

pub struct Server {
    pub proc: Proc,
    pub url: String,
}

impl Server {
    pub fn start(dir: &Path, port: u16, extra: &[&str]) -> Server {
        let mut args = vec!["server", "--data-dir", dir.to_str().unwrap(), "--listen"];
        let listen = format!("127.0.0.1:{port}");
        args.push(&listen);
        args.extend_from_slice(extra);
        let mut child = Command::new(BIN)
            .args(&args)
            .env("GPUNET_ADMIN_TOKEN", "admin-secret")
            .env("GPUNET_JOIN_TOKEN", "join-secret")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let t = Instant::now();
        while !line.contains("listening") {
            line.clear();
            // End of output: the server exited (a port taken meanwhile by another test's process, say).
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("the server exited before listening on {port}: {:?}", child.wait());
            }
            assert!(t.elapsed() < Duration::from_secs(60), "server did not start within 60 s");
        }
        std::thread::spawn(move || for _ in out.lines() {});
        Server { proc: Proc(child), url: format!("http://127.0.0.1:{port}") }
    }

    /// The body of an admin `GET` of `path` (e.g. `/metrics`), empty when it fails.
    pub fn get(&self, path: &str) -> String {
        let o = Command::new("curl")
            .args(["-sf", "-H", "Authorization: Bearer admin-secret", &format!("{}{path}", self.url)])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn cli(&self, token: &str, args: &[&str]) -> (bool, String, String) {
        let o =
            Command::new(BIN).args(args).env("GPUNET_SERVER", &self.url).env("GPUNET_TOKEN", token).output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// Starts an agent with fake GPUs.
    pub fn agent(&self, name: &str, gpus: &str, dir: &Path, address: &str) -> Proc {
        self.agent_with(name, gpus, dir, address, &[])
    }

    /// Starts an agent with fake GPUs and extra flags.
    pub fn agent_with(&self, name: &str, gpus: &str, dir: &Path, address: &str, extra: &[&str]) -> Proc {
        self.agent_with_env(name, gpus, dir, address, extra, &[])
    }

    /// Starts an agent with fake GPUs, extra flags and extra environment variables.
    pub fn agent_with_env(
        &self,
        name: &str,
        gpus: &str,
        dir: &Path,
        address: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        self.agent_through(&[], name, gpus, dir, address, extra, env)
    }

    /// Starts an agent like [`Server::agent_with_env`], through `launch` (a program and its arguments that end by
    /// running the agent's command line given after them, e.g. `sh -c 'exec 7<secret; exec "$@"' sh`).
    #[allow(clippy::too_many_arguments)]
    pub fn agent_through(
        &self,
        launch: &[&str],
        name: &str,
        gpus: &str,
        dir: &Path,
        address: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        use std::os::unix::process::CommandExt;
        // The tests' temporary directories are reachable by other users, so a root agent would run each tenant's
        // tasks as its own user by default; tests whose tasks write into them run tasks as root unless they pass a
        // `--tenant-uid…` flag.
        let mut extra = extra.to_vec();
        if !extra.iter().any(|a| a.starts_with("--tenant-uid")) {
            extra.push("--no-tenant-uids");
        }
        let mut cmd = match launch.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .envs(env.iter().copied())
            .process_group(0)
            .args([
                "agent",
                "--server",
                &self.url,
                "--join-token",
                "join-secret",
                "--name",
                name,
                "--fake-gpus",
                gpus,
                "--data-dir",
                dir.join(name).to_str().unwrap(),
                "--address",
                address,
            ])
            // `zone=z1` unless the test gives its own labels.
            .args(if extra.contains(&"--labels") { &[][..] } else { &["--labels", "zone=z1"][..] })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        AGENTS.lock().unwrap().insert(child.id(), (name.to_string(), dir.join(name)));
        let p = Proc(child);
        wait_for(Duration::from_secs(20), || {
            let (_, out, _) = self.cli("admin-secret", &["nodes", "--output", "json"]);
            serde_json::from_str::<serde_json::Value>(&out)
                .ok()
                .and_then(|v| v.as_array().cloned())
                .is_some_and(|a| a.iter().any(|n| n["name"] == name && n["state"] == "ready"))
        });
        p
    }

    pub fn job_state(&self, id: u64) -> String {
        let (_, out, _) = self.cli("admin-secret", &["show", &id.to_string(), "--output", "json"]);
        json(&out)["state"].as_str().unwrap_or("").to_string()
    }

    pub fn submit(&self, args: &[&str]) -> u64 {
        let mut a = vec!["submit", "--tenant", "t", "--output", "json"];
        a.extend_from_slice(args);
        let (ok, out, err) = self.cli("admin-secret", &a);
        assert!(ok, "{out}{err}");
        json(&out)["id"].as_u64().unwrap()
    }
}

/// SIGKILL to the process group that `pid` (a decimal string) belongs to, e.g. a task whose agent is gone.
pub fn kill_group_of(pid: &str) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let pgrp = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(2)).and_then(|g| g.parse::<i32>().ok());
    match pgrp {
        Some(g) if g > 1 => {
            let _ = Command::new("kill").args(["-9", "--", &format!("-{g}")]).status();
        }
        _ => {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
}

pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// POSTs a job (JSON) as the admin; returns the HTTP status and the body.
pub fn post_job(url: &str, body: &str) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "-XPOST", "-H", "Authorization: Bearer admin-secret"])
        .args(["-H", "content-type: application/json", "-d", body, &format!("{url}/v1/jobs")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Polls `f` every 50 ms until it holds, failing after `limit`.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "condition not met within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn register_node(url: &str, name: &str, gpus: usize) {
    let g: Vec<String> =
        (0..gpus).map(|_| r#"{"model":"T4","numa":0,"nvlink_domain":0,"pcie_switch":0}"#.to_string()).collect();
    let body = format!(
        r#"{{"spec":{{"name":"{name}","gpus":[{}],"cpu":32000,"mem":131072,"labels":{{"zone":"z1"}},"price_per_gpu_hour":1.0}},"fake":true}}"#,
        g.join(",")
    );
    let o = Command::new("curl")
        .args(["-sf", "-XPOST", "-H", "Authorization: Bearer join-secret", "-d", &body, &format!("{url}/v1/nodes")])
        .output()
        .unwrap();
    assert!(o.status.success(), "register node: {}", String::from_utf8_lossy(&o.stderr));
}

/// A file's text, trimmed; empty when it cannot be read.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default().trim().to_string()
}

/// Submits a job spec file (YAML) written under `dir` with the admin token; returns the job id.
pub fn submit_yaml(s: &Server, dir: &Path, yaml: &str) -> u64 {
    let spec = dir.join("job.yaml");
    std::fs::write(&spec, yaml).unwrap();
    let (ok, o, e) = s.cli("admin-secret", &["submit", "-f", spec.to_str().unwrap(), "--output", "json"]);
    assert!(ok, "{o}{e}");
    json(&o)["id"].as_u64().unwrap()
}

/// The host's pid of the process a task knows as `pid` (its `$$` or `$!`: a task runs in a PID namespace of its
/// own, where pids are small and repeat from task to task), found among the descendants of `ancestor` (the agent's
/// pid; call it while both run). `pid` itself where tasks run without a namespace. Panics when two processes under
/// `ancestor` match (two tasks' namespaces both have it): the test must tell them apart another way.
pub fn host_pid(ancestor: u32, pid: &str) -> String {
    let mut procs = Vec::new(); // (host pid, parent, pids in each namespace from the host's down)
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(h) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{h}/status")) else { continue };
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.split_whitespace().map(String::from).collect())
        };
        let ppid: Vec<String> = field("PPid:").unwrap_or_default();
        let ns: Vec<String> = field("NSpid:").unwrap_or_default();
        procs.push((h, ppid.first().and_then(|p| p.parse::<u32>().ok()).unwrap_or(0), ns));
    }
    let parent: std::collections::HashMap<u32, u32> = procs.iter().map(|(h, p, _)| (*h, *p)).collect();
    let under = |mut h: u32| {
        while h > 1 {
            h = parent.get(&h).copied().unwrap_or(0);
            if h == ancestor {
                return true;
            }
        }
        false
    };
    let hits: Vec<u32> = procs
        .iter()
        .filter(|(h, _, ns)| ns.len() > 1 && ns.last().map(String::as_str) == Some(pid) && under(*h))
        .map(|(h, _, _)| *h)
        .collect();
    match hits[..] {
        [] => pid.to_string(),
        [h] => h.to_string(),
        _ => panic!("pid {pid} names {hits:?} in several tasks' namespaces"),
    }
}

/// A process stopped with SIGSTOP (a frozen agent or server) for as long as this lives; continued when dropped, also
/// when the test fails.
pub struct Frozen(String);

impl Frozen {
    pub fn stop(pid: u32) -> Frozen {
        let pid = pid.to_string();
        assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success(), "SIGSTOP {pid}");
        Frozen(pid)
    }

    /// Whether it is still stopped (`T` in `/proc/PID/stat`).
    pub fn still_stopped(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()) == Some("T")
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}
