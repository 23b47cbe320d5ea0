//! Two real `gpunet server` replicas on one private PostgreSQL (started by the test; skipped with a message where
//! PostgreSQL is not installed, unless `CI=true`) and an agent with fake GPUs: the leader is killed (SIGKILL) and the
//! standby takes over — nothing acknowledged is lost, a retried submission is not duplicated, the running task is
//! not restarted —; then the new leader is paused (SIGSTOP) until a restarted replica takes over, and once resumed
//! it commits nothing. And failover under load: `bench api` against both replicas while the leader is killed, five
//! times, every acknowledged job there exactly once.

mod common;

use common::{free_port, json, wait_for, Proc, BIN};
use gpunet_store::pg_cluster::PgCluster;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Lease timings of the test's replicas: a paused leader loses its lease after 3 s.
const LEASE: [&str; 6] = ["--lease-ttl-s", "3", "--lease-renew-s", "0.5", "--lease-poll-s", "0.1"];

struct Replica {
    proc: Proc,
    url: String,
}

/// Starts `gpunet server` on the database `store` at `port`, its log in `dir/server.log`; returns once it printed
/// its role.
fn replica(dir: &Path, port: u16, store: &str) -> Replica {
    std::fs::create_dir_all(dir).unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(["server", "--data-dir", dir.to_str().unwrap(), "--listen", &format!("127.0.0.1:{port}")])
        .args(["--store", store, "--advertise", &url])
        .args(LEASE)
        .env("GPUNET_ADMIN_TOKEN", "admin-secret")
        .env("GPUNET_JOIN_TOKEN", "join-secret")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let t = Instant::now();
    while !line.starts_with("role:") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the server exited: {}", log(dir));
        assert!(t.elapsed() < Duration::from_secs(60), "the server did not start");
    }
    std::thread::spawn(move || for _ in out.lines() {});
    Replica { proc: Proc(child), url }
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
}

/// `GET /v1/health` (no token): the status code and the document.
fn health(url: &str) -> (u16, serde_json::Value) {
    let (code, body) = curl(&["-s", "-w", "\n%{http_code}", &format!("{url}/v1/health")]);
    (code, serde_json::from_str(&body).unwrap_or_default())
}

/// curl with `args` (the last line of whose output is the status code, `-w "\n%{http_code}"`).
fn curl(args: &[&str]) -> (u16, String) {
    let o = Command::new("curl").args(["--max-time", "20"]).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// POSTs a job to `url` as the admin with an idempotency key; the status and the body.
fn submit(url: &str, key: &str, command: &str) -> (u16, serde_json::Value) {
    let body = format!(r#"{{"name":"j","tenant":"t","gpus":1,"command":["sh","-c","{command}"]}}"#);
    let (code, body) = curl(&[
        "-s",
        "-w",
        "\n%{http_code}",
        "-XPOST",
        "-H",
        "Authorization: Bearer admin-secret",
        "-H",
        "content-type: application/json",
        "-H",
        &format!("Idempotency-Key: {key}"),
        "-d",
        &body,
        &format!("{url}/v1/jobs"),
    ]);
    (code, serde_json::from_str(&body).unwrap_or_default())
}

/// The CLI against several replicas.
fn cli(servers: &str, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("GPUNET_SERVER", servers)
        .env("GPUNET_TOKEN", "admin-secret")
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Every job id the leader knows, through the CLI.
fn job_ids(servers: &str) -> BTreeSet<u64> {
    let (ok, out, err) = cli(servers, &["jobs", "--limit", "1000", "--output", "json"]);
    assert!(ok, "{out}{err}");
    let page = json(&out);
    assert!(page["next"].is_null(), "more than one page");
    page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect()
}

fn job(servers: &str, id: u64) -> serde_json::Value {
    let (ok, out, err) = cli(servers, &["show", &id.to_string(), "--output", "json"]);
    assert!(ok, "{out}{err}");
    json(&out)
}

fn started_events(servers: &str, id: u64) -> usize {
    let (code, body) = curl(&[
        "-s",
        "-w",
        "\n%{http_code}",
        "-H",
        "Authorization: Bearer admin-secret",
        &format!("{}/v1/jobs/{id}/events", servers.split(',').next().unwrap()),
    ]);
    assert_eq!(code, 200, "{body}");
    json(&body).as_array().unwrap().iter().filter(|e| e["kind"] == "started").count()
}

/// Host pids of the `sleep 3000` processes under `ancestor`.
fn sleepers(ancestor: u32) -> BTreeSet<u32> {
    let mut parent = std::collections::HashMap::new();
    let mut sleeping = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        parent.insert(pid, ppid.unwrap_or(0u32));
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmd == b"sleep\x003000\x00" {
            sleeping.push(pid);
        }
    }
    sleeping
        .into_iter()
        .filter(|p| {
            let mut h = *p;
            while h > 1 {
                h = parent.get(&h).copied().unwrap_or(0);
                if h == ancestor {
                    return true;
                }
            }
            false
        })
        .collect()
}

#[test]
fn a_standby_takes_over_from_a_killed_leader_and_a_resumed_old_leader_commits_nothing() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let store = pg.create_database("ha").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (free_port(), free_port());
    let mut a = replica(&dir.path().join("a"), pa, &store);
    let (code, h) = health(&a.url);
    assert_eq!((code, h["role"].as_str()), (200, Some("leader")), "{h}");
    let b = replica(&dir.path().join("b"), pb, &store);
    let (code, h) = health(&b.url);
    assert_eq!((code, h["role"].as_str(), h["leader"].as_str()), (200, Some("standby"), Some(a.url.as_str())), "{h}");
    // A standby sends API calls to the leader.
    let (code, to) =
        curl(&["-s", "-o", "/dev/null", "-w", "%{redirect_url}\n%{http_code}", &format!("{}/v1/jobs?limit=5", b.url)]);
    assert_eq!((code, to.as_str()), (307, format!("{}/v1/jobs?limit=5", a.url).as_str()));

    // Clients name both replicas, the standby first: they follow its redirect.
    let both = format!("{},{}", b.url, a.url);
    let (ok, out, err) = cli(&both, &["tenants", "--create", "t"]);
    assert!(ok, "{out}{err}");
    let agent_dir = dir.path().join("agent");
    let agent = Proc(
        Command::new(BIN)
            .args(["agent", "--server", &both, "--join-token", "join-secret", "--name", "n1"])
            .args(["--fake-gpus", "2xA100-80GB", "--data-dir", agent_dir.to_str().unwrap(), "--no-tenant-uids"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("agent.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let agent_pid = agent.0.id();
    let (ok, out, err) =
        cli(&both, &["submit", "--tenant", "t", "--gpus", "1", "--output", "json", "--", "sleep", "3000"]);
    assert!(ok, "{out}{err}");
    let long = json(&out)["id"].as_u64().unwrap();
    wait_for(Duration::from_secs(60), || job(&both, long)["state"] == "running" && sleepers(agent_pid).len() == 1);
    let task = sleepers(agent_pid);

    // Acknowledged submissions, each with its key; a retry of the first gets the same job back.
    let mut acked: BTreeSet<u64> = BTreeSet::from([long]);
    for i in 0..20 {
        let (code, r) = submit(&a.url, &format!("before-{i}"), "true");
        assert_eq!(code, 201, "{r}");
        acked.insert(r["id"].as_u64().unwrap());
    }
    let (code, first) = submit(&a.url, "before-0", "true");
    assert_eq!(code, 200, "a retry is answered as a replay: {first}");
    assert!(acked.contains(&first["id"].as_u64().unwrap()));

    // The leader dies. The standby takes over and serves submissions.
    let killed = Instant::now();
    a.proc.kill9();
    let mut after = None;
    while after.is_none() {
        assert!(killed.elapsed() < Duration::from_secs(30), "no takeover: {}", log(&dir.path().join("b")));
        let (code, r) = submit(&b.url, "after-kill", "true");
        if code == 201 {
            after = r["id"].as_u64();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let failover = killed.elapsed();
    eprintln!("failover (SIGKILL of the leader to the first acknowledged submission on the new leader): {failover:?}");
    assert!(failover < Duration::from_secs(10), "takeover took {failover:?}");
    acked.insert(after.unwrap());
    let (code, h) = health(&b.url);
    assert_eq!((code, h["role"].as_str()), (200, Some("leader")), "{h}");
    // The key of a submission acknowledged by the old leader is known to the new one: no duplicate.
    let (code, again) = submit(&b.url, "before-0", "true");
    assert_eq!((code, &again["id"]), (200, &first["id"]), "{again}");
    let (code, again) = submit(&b.url, "after-kill", "true");
    assert_eq!((code, again["id"].as_u64()), (200, after), "{again}");
    // The CLI, given both URLs, reaches the new leader; every acknowledged job is there, and nothing else.
    assert_eq!(job_ids(&both), acked);
    // The agent re-syncs with the new leader (it runs the job submitted after the takeover) and its task ran on.
    wait_for(Duration::from_secs(60), || job(&both, after.unwrap())["state"] == "succeeded");
    assert_eq!(sleepers(agent_pid), task, "the running task was restarted");
    assert_eq!(job(&both, long)["state"], "running");
    assert_eq!(started_events(&b.url, long), 1, "the long job started more than once");

    // The old leader comes back: it stands by. Then the new leader is paused until it loses its lease.
    let a2 = replica(&dir.path().join("a2"), pa, &store);
    let (_, h) = health(&a2.url);
    assert_eq!((h["role"].as_str(), h["leader"].as_str()), (Some("standby"), Some(b.url.as_str())), "{h}");
    let (_, h) = health(&b.url);
    let old_epoch = h["epoch"].as_u64().unwrap();
    let _ = Command::new("kill").args(["-STOP", &b.proc.0.id().to_string()]).status();
    let paused = Instant::now();
    // A submission sent to the paused leader waits in its socket.
    let b_url = b.url.clone();
    let late = std::thread::spawn(move || submit(&b_url, "sent-to-paused", "true"));
    wait_for(Duration::from_secs(30), || {
        let (code, h) = health(&a2.url);
        code == 200 && h["role"] == "leader"
    });
    eprintln!("takeover from a paused leader (SIGSTOP to the new leader serving): {:?}", paused.elapsed());
    let (code, x) = submit(&a2.url, "on-a2", "true");
    assert_eq!(code, 201, "{x}");
    acked.insert(x["id"].as_u64().unwrap());
    let _ = Command::new("kill").args(["-CONT", &b.proc.0.id().to_string()]).status();
    // Resumed, it serves nothing as leader: the waiting submission is not acknowledged, and it steps down.
    let (code, r) = late.join().unwrap();
    assert!(code == 307 || code == 503, "the resumed old leader answered {code}: {r}");
    wait_for(Duration::from_secs(30), || {
        let (_, h) = health(&b.url);
        h["role"] == "standby" && h["leader"] == a2.url.as_str()
    });
    // What it sent was never committed: the key it was given is new to the new leader.
    let (code, r) = submit(&a2.url, "sent-to-paused", "true");
    assert_eq!(code, 201, "the paused leader committed a submission after the takeover: {r}");
    acked.insert(r["id"].as_u64().unwrap());
    let (_, h) = health(&a2.url);
    assert!(h["epoch"].as_u64().unwrap() > old_epoch, "{h}");
    assert_eq!(job_ids(&format!("{},{}", a2.url, b.url)), acked);
    assert!(log(&dir.path().join("b")).contains("took the lease over"), "{}", log(&dir.path().join("b")));
    drop(agent);
}

/// Failover under load, five times: `bench api` (8 clients, idempotency keys, both URLs) while the leader is killed
/// (SIGKILL) mid-run and the killed one comes back as a standby. Every acknowledged job exists exactly once, and the
/// longest stall of acknowledgements (the failover as clients see it) is measured; its median is printed.
#[test]
fn failover_under_load_loses_and_duplicates_nothing() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let store = pg.create_database("load").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let mut replicas = [Some(replica(&dir.path().join("r0"), ports[0], &store)), None];
    replicas[1] = Some(replica(&dir.path().join("r1"), ports[1], &store));
    let both = format!("http://127.0.0.1:{},http://127.0.0.1:{}", ports[0], ports[1]);
    let mut acked = BTreeSet::new();
    let mut gaps = Vec::new();
    for round in 0..5 {
        let leader = (0..2)
            .find(|i| health(&format!("http://127.0.0.1:{}", ports[*i])).1["role"] == "leader")
            .expect("a leader");
        let ids = dir.path().join(format!("ids-{round}.txt"));
        let bench = Command::new(BIN)
            .args(["bench", "api", "--server", &both, "--token", "admin-secret", "--clients", "8", "--jobs", "1500"])
            .args(["--ids-file", ids.to_str().unwrap(), "--output", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(Duration::from_secs(60), || std::fs::read_to_string(&ids).map_or(0, |s| s.lines().count()) >= 300);
        replicas[leader].as_mut().unwrap().proc.kill9();
        let out = bench.wait_with_output().unwrap();
        let report = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(report["acknowledged"], 1500, "every submission was acknowledged in the end: {report}");
        gaps.push(report["longest_gap_ms"].as_f64().unwrap());
        acked.extend(std::fs::read_to_string(&ids).unwrap().lines().map(|l| l.trim().parse::<u64>().unwrap()));
        replicas[leader] = Some(replica(&dir.path().join(format!("r{leader}-{round}")), ports[leader], &store));
    }
    let stored = job_ids_all(&both);
    assert_eq!(stored.len(), 5 * 1500, "one job per submission, none duplicated");
    assert_eq!(stored, acked, "every acknowledged job exists");
    gaps.sort_by(f64::total_cmp);
    eprintln!("failover under load, longest stall of acknowledgements per run (ms): {gaps:?}; median {}", gaps[2]);
    assert!(gaps[2] < 10_000.0, "{gaps:?}");
}

/// Every job id the leader among `servers` knows, page by page.
fn job_ids_all(servers: &str) -> BTreeSet<u64> {
    let leader = servers.split(',').find(|u| health(u).1["role"] == "leader").expect("a leader").to_string();
    let mut out = BTreeSet::new();
    let mut after = 0u64;
    loop {
        let (code, body) = curl(&[
            "-s",
            "-w",
            "\n%{http_code}",
            "-H",
            "Authorization: Bearer admin-secret",
            &format!("{leader}/v1/jobs?limit=1000&after={after}"),
        ]);
        assert_eq!(code, 200, "{body}");
        let page = json(&body);
        out.extend(page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
        match page["next"].as_u64() {
            Some(n) => after = n,
            None => return out,
        }
    }
}

/// The leader's connections to the database break (its writer and readers are terminated by the database; its lease
/// has a connection of its own and lives on): its next commit fails, after which its store refuses every write, so it
/// gives the lead up instead of staying a leader that can change nothing; a replica takes over at a new epoch and
/// the submissions, retried by the CLI with their idempotency keys, are each stored once.
#[test]
fn a_leader_whose_store_connection_broke_gives_the_lead_up_and_submissions_go_on() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let store = pg.create_database("broken").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (free_port(), free_port());
    let a = replica(&dir.path().join("a"), pa, &store);
    let b = replica(&dir.path().join("b"), pb, &store);
    let both = format!("{},{}", a.url, b.url);
    let (ok, out, err) = cli(&both, &["tenants", "--create", "t"]);
    assert!(ok, "{out}{err}");
    let leader_epoch = || {
        [&a.url, &b.url].iter().map(|u| health(u).1).find(|h| h["role"] == "leader").and_then(|h| h["epoch"].as_u64())
    };
    let before = leader_epoch().expect("a leader");
    let psql = gpunet_store::pg_cluster::find_bin().unwrap().join("psql");
    let cut = Command::new(psql)
        .args(["-h", "127.0.0.1", "-p", &pg.port().to_string(), "-U", "gpunet", "-d", "postgres", "-Atc"])
        .arg("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'gpunet'")
        .output()
        .unwrap();
    let cut = String::from_utf8_lossy(&cut.stdout).trim().to_string();
    assert!(cut.parse::<u32>().unwrap_or(0) >= 1, "the leader's store connections were cut: {cut}");
    for i in 0..3 {
        let (ok, out, err) =
            cli(&both, &["submit", "--tenant", "t", "--name", &format!("after-{i}"), "--output", "json", "--", "true"]);
        assert!(
            ok,
            "submission {i} after the cut: {out}{err}\n{}\n{}",
            log(&dir.path().join("a")),
            log(&dir.path().join("b"))
        );
    }
    wait_for(Duration::from_secs(30), || leader_epoch().is_some_and(|e| e > before));
    let mut names: Vec<String> = {
        let (ok, out, err) = cli(&both, &["jobs", "--limit", "1000", "--output", "json"]);
        assert!(ok, "{out}{err}");
        json(&out)["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap().to_string()).collect()
    };
    names.sort();
    assert_eq!(names, ["after-0", "after-1", "after-2"], "each submission stored once");
    let logs = format!("{}{}", log(&dir.path().join("a")), log(&dir.path().join("b")));
    assert!(logs.contains("giving the lead up"), "{logs}");
    // The client's config file names both replicas too (a dead address first, then both): the CLI moves on to the
    // next and follows a standby's redirect.
    let config = dir.path().join("config.toml");
    let dead = format!("http://127.0.0.1:{}", free_port());
    std::fs::write(&config, format!("server = \"{dead},{},{}\"\ntoken = \"admin-secret\"\n", b.url, a.url)).unwrap();
    let o = Command::new(BIN)
        .args(["jobs", "--output", "json"])
        .env("GPUNET_CONFIG", &config)
        .env_remove("GPUNET_SERVER")
        .env_remove("GPUNET_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json(&String::from_utf8_lossy(&o.stdout))["jobs"].as_array().map(Vec::len), Some(3));
}
