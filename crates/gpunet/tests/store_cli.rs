//! The real binary on PostgreSQL (a private cluster started by the test; skipped with a message where PostgreSQL is
//! not installed, unless `CI=true`): `gpunet server --store postgres://…` under `kill -9`, `gpunet admin migrate`
//! from SQLite and `gpunet admin backup` of a running server.

mod common;

use common::{free_port, json, register_node, Server, BIN};
use gpunet_store::pg_cluster::PgCluster;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn job_events(s: &Server, token: &str, id: u64) -> serde_json::Value {
    let o = Command::new("curl")
        .args(["-sf", "-H", &format!("Authorization: Bearer {token}"), &format!("{}/v1/jobs/{id}/events", s.url)])
        .output()
        .unwrap();
    json(&String::from_utf8_lossy(&o.stdout))
}

/// Every job's id, page by page.
fn job_ids(s: &Server, token: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut after = 0u64;
    loop {
        let o = Command::new("curl")
            .args(["-sf", "-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("{}/v1/jobs?limit=1000&after={after}", s.url))
            .output()
            .unwrap();
        let page = json(&String::from_utf8_lossy(&o.stdout));
        out.extend(page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
        match page["next"].as_u64() {
            Some(n) => after = n,
            None => return out,
        }
    }
}

#[test]
fn every_job_acknowledged_by_a_server_on_postgres_survives_kill_9() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let url = pg.create_database("crash").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut s = Server::start(&dir.path().join("a"), port, &["--store", &url]);
    register_node(&s.url, "n1", 2);
    let ids = dir.path().join("ids.txt");
    let mut bench = Command::new(BIN)
        .args(["bench", "api", "--server", &s.url, "--token", "admin-secret", "--clients", "8", "--jobs", "200000"])
        .args(["--ids-file", ids.to_str().unwrap(), "--output", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::fs::read_to_string(&ids).map_or(0, |s| s.lines().count()) < 1000 {
        assert!(t.elapsed() < Duration::from_secs(120), "bench made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.proc.kill9();
    let _ = bench.kill();
    let _ = bench.wait();
    let acked: Vec<u64> =
        std::fs::read_to_string(&ids).unwrap().lines().filter_map(|l| l.trim().parse().ok()).collect();
    // Another data directory: everything must come from PostgreSQL.
    let s = Server::start(&dir.path().join("b"), port, &["--store", &url]);
    let stored: std::collections::HashSet<u64> = job_ids(&s, "admin-secret").into_iter().collect();
    for id in &acked {
        assert!(stored.contains(id), "acknowledged job {id} was lost");
    }
    let (ok, out, _) = s.cli("admin-secret", &["show", &acked[0].to_string(), "--output", "json"]);
    assert!(ok && json(&out)["id"].as_u64() == Some(acked[0]), "{out}");
}

#[test]
fn admin_backup_of_a_running_server_and_migrate_from_sqlite_to_postgres_keep_everything() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sqlite_dir = dir.path().join("sqlite");
    let s = Server::start(&sqlite_dir, free_port(), &[]);
    register_node(&s.url, "n1", 2);
    let (ok, out, err) = s.cli("admin-secret", &["tenants", "--create", "team-a", "--output", "json"]);
    assert!(ok, "{err}");
    let token = json(&out)["token"].as_str().unwrap().to_string();
    for _ in 0..3 {
        let (ok, out, err) = s.cli(&token, &["submit", "--gpus", "1", "--", "sleep", "1000"]);
        assert!(ok, "{out}{err}");
    }
    let before = job_ids(&s, &token);
    assert_eq!(before.len(), 3);
    let events_before = job_events(&s, &token, before[0]);
    assert!(events_before.to_string().contains("submitted"), "{events_before}");

    // An online backup while the server runs, then a server on the copy.
    let copy_dir = dir.path().join("copy");
    std::fs::create_dir(&copy_dir).unwrap();
    let o = Command::new(BIN)
        .args(["admin", "backup", "--data-dir", sqlite_dir.to_str().unwrap(), "--to"])
        .arg(copy_dir.join("gpunet.db"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(s);
    let copy_url = format!("sqlite://{}", copy_dir.display());
    let c = Server::start(&dir.path().join("copy-data"), free_port(), &["--store", &copy_url]);
    assert_eq!(job_ids(&c, &token), before, "the backup holds the jobs, and the tenant token works");
    drop(c);

    // Migrate the original to PostgreSQL and run a server on it.
    let url = pg.create_database("migrated").unwrap();
    let migrate = || {
        Command::new(BIN)
            .args(["admin", "migrate", "--from", &format!("sqlite://{}", sqlite_dir.display()), "--output", "json"])
            .args(["--to", &url])
            .output()
            .unwrap()
    };
    let o = migrate();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let counts = json(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(counts["jobs"], 3);
    assert_eq!(counts["nodes"], 1);
    assert!(counts["events"].as_u64().unwrap() >= 3 && counts["tokens"].as_u64().unwrap() >= 2, "{counts}");
    let o = migrate();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("not empty"), "a second migration is refused: {err}");

    let p = Server::start(&dir.path().join("pg-data"), free_port(), &["--store", &url]);
    assert_eq!(job_ids(&p, &token), before, "every job, and the tenant's token");
    assert_eq!(job_events(&p, &token, before[0]), events_before, "the job's events");
    let (ok, out, err) = p.cli(&token, &["submit", "--gpus", "1", "--", "true"]);
    assert!(ok && out.contains("job-4"), "ids continue after the migrated ones: {out}{err}");
}

#[test]
fn a_bad_store_url_is_refused_naming_the_flag_and_never_the_password() {
    let dir = tempfile::tempdir().unwrap();
    for (url, says) in
        [("mysql://u:hunter2@h/db", "mysql"), ("postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=3", "PostgreSQL")]
    {
        let o = Command::new(BIN)
            .args(["server", "--data-dir", dir.path().to_str().unwrap(), "--listen", "127.0.0.1:0", "--store", url])
            .env("GPUNET_ADMIN_TOKEN", "admin-secret")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says) && !err.contains("hunter2"), "{err}");
    }
}

/// Two servers on one database (a replica, or a second one started by mistake): the first keeps leading and
/// writing, the second stands by — it sends clients to the leader and writes nothing — until the leader stops, and
/// then takes over with everything the first acknowledged. (A leader that was only paused is fenced: `tests/ha.rs`.)
#[test]
fn a_second_server_on_the_database_stands_by_until_the_first_stops() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let url = pg.create_database("two").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), free_port(), &["--store", &url]);
    let (ok, out, err) = a.cli("admin-secret", &["tenants", "--create", "t", "--output", "json"]);
    assert!(ok, "{out}{err}");
    let first = a.submit(&["--", "true"]);
    let b = Server::start(&dir.path().join("b"), free_port(), &["--store", &url]);
    let second = a.submit(&["--", "true"]);
    let health = |s: &Server| {
        let o = Command::new("curl").args(["-s", &format!("{}/v1/health", s.url)]).output().unwrap();
        json(&String::from_utf8_lossy(&o.stdout))
    };
    let h = health(&b);
    assert_eq!((h["role"].as_str(), h["leader"].as_str()), (Some("standby"), Some(a.url.as_str())), "{h}");
    // A client that knows only the standby is told where the leader is.
    let (ok, out, err) = b.cli("admin-secret", &["submit", "--tenant", "t", "--", "true"]);
    assert!(!ok && err.contains(&a.url) && err.contains("standby"), "{out}{err}");
    drop(a);
    common::wait_for(Duration::from_secs(30), || health(&b)["role"] == "leader" && health(&b)["status"] == "ok");
    assert_eq!(job_ids(&b, "admin-secret"), vec![first, second], "the new leader has every job, and only those");
}
