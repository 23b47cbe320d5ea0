//! `gpunet report` end to end: jobs of two tenants and three users run on a fake-GPU agent (some succeed, one fails,
//! one is cancelled while waiting); the report's figures per tenant and per user — jobs, failures, GPU-hours and
//! cost — equal the sums computed here from the ledger the server wrote (read from its store after it stopped); the
//! CSV carries the same numbers, the monthly statement's total equals the ledger's, and a tenant's token sees only
//! its own rows.

mod common;

use common::{free_port, json, wait_for, Server};
use std::collections::BTreeMap;
use std::time::Duration;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn report_figures_equal_sums_from_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), free_port(), &[]);
    let _agent = s.agent("n1", "2xT4", dir.path(), "127.0.0.1");
    let mut tokens = BTreeMap::new();
    for (tenant, user) in [("ta", "alice"), ("ta", "bob"), ("tb", "carol")] {
        let _ = s.cli("admin-secret", &["tenants", "--create", tenant]);
        let (ok, out, err) = s.cli(
            "admin-secret",
            &["tokens", "create", "--role", "tenant", "--user", user, "--tenant", tenant, "--output", "json"],
        );
        assert!(ok, "{out}{err}");
        tokens.insert(user, json(&out)["token"].as_str().unwrap().to_string());
    }
    let submit = |user: &str, args: &[&str]| {
        let mut a = vec!["submit", "--output", "json"];
        a.extend_from_slice(args);
        let (ok, out, err) = s.cli(&tokens[user], &a);
        assert!(ok, "{out}{err}");
        json(&out)["id"].as_u64().unwrap()
    };
    let mut ids = vec![
        submit("alice", &["--gpus", "1", "--", "sleep", "1"]),
        submit("alice", &["--gpus", "2", "--", "sleep", "1"]),
        {
            let spec = dir.path().join("fails.yaml");
            std::fs::write(&spec, "name: fails\ntenant: ta\ngpus: 1\nmax_restarts: 0\ncommand: [\"false\"]\n").unwrap();
            submit("bob", &["-f", spec.to_str().unwrap()])
        },
        submit("carol", &["--gpus", "1", "--", "sleep", "2"]),
    ];
    // One more of carol's that waits behind the others for all 2 GPUs and is cancelled before it starts.
    let waiting = submit("carol", &["--gpus", "2", "--", "sleep", "600"]);
    let (ok, out, err) = s.cli(&tokens["carol"], &["cancel", &waiting.to_string()]);
    assert!(ok, "{out}{err}");
    ids.push(waiting);
    wait_for(Duration::from_secs(60), || {
        ids.iter().all(|id| ["succeeded", "failed", "cancelled"].contains(&s.job_state(*id).as_str()))
    });
    assert_eq!(s.job_state(ids[2]), "failed");

    let by_tenant = json(&s.cli("admin-secret", &["report", "--output", "json"]).1);
    let by_user = json(&s.cli("admin-secret", &["report", "--by", "user", "--output", "json"]).1);
    let (ok, csv, err) = s.cli("admin-secret", &["report", "--by", "user", "--output", "csv"]);
    assert!(ok, "{err}");
    let (ok, table, err) = s.cli("admin-secret", &["report"]);
    assert!(ok && table.starts_with("TENANT") && table.contains("WAIT P50"), "{table}{err}");
    // TENANT JOBS FAILED CANCELLED …: carol's cancelled job shows in the table too.
    let tb: Vec<&str> = table.lines().find(|l| l.starts_with("tb ")).unwrap_or_default().split_whitespace().collect();
    assert_eq!(tb.get(1..4), Some(&["2", "0", "1"][..]), "{table}");
    let month = String::from_utf8(std::process::Command::new("date").args(["-u", "+%Y-%m"]).output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let (ok, statement, err) = s.cli("admin-secret", &["report", "--statement", "--tenant", "ta", "--month", &month]);
    assert!(ok, "{err}");
    // A tenant's token: its own tenant only, and never another's.
    let (ok, mine, err) = s.cli(&tokens["carol"], &["report", "--by", "user", "--output", "json"]);
    assert!(ok, "{err}");
    let mine = json(&mine);
    let keys: Vec<&str> = mine["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["tb/carol"], "{mine}");
    let (ok, _, err) = s.cli(&tokens["carol"], &["report", "--tenant", "ta"]);
    assert!(!ok && err.contains("403"), "{err}");
    let (ok, _, err) = s.cli("admin-secret", &["report", "--month", "2026-13"]);
    assert!(!ok && err.contains("--month"), "{err}");

    // The ledger, read from the store once the server is gone.
    drop(s);
    let store = gpunet_store::SqliteStore::open(dir.path()).unwrap();
    let rows = gpunet_store::Store::usage(&store, None, 0, gpunet_server::now_ms() + 3_600_000).unwrap();
    assert!(rows.len() >= 4, "{rows:?}");
    let mut want: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for r in &rows {
        for key in [r.tenant.clone(), format!("{}/{}", r.tenant, r.submitted_by)] {
            let e = want.entry(key).or_default();
            e.0 += r.gpu_seconds / 3600.0;
            e.1 += r.gpu_cost;
            e.2 += r.cost;
        }
    }
    assert!(want["ta"].2 > 0.0 && want["tb"].2 > 0.0, "{want:?}");
    // Jobs and failures per key, as submitted above.
    let jobs: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::from([
        ("ta", (3, 1, 0)),
        ("tb", (2, 0, 1)),
        ("ta/alice", (2, 0, 0)),
        ("ta/bob", (1, 1, 0)),
        ("tb/carol", (2, 0, 1)),
    ]);
    for report in [&by_tenant, &by_user] {
        let got = report["rows"].as_array().unwrap();
        assert_eq!(got.len(), if report["by"] == "user" { 3 } else { 2 }, "{report}");
        for r in got {
            let k = r["key"].as_str().unwrap();
            let (gh, gc, c) = want[k];
            assert!(close(r["gpu_hours"].as_f64().unwrap(), gh), "{k}: {r} vs ledger {gh}");
            assert!(close(r["gpu_cost"].as_f64().unwrap(), gc), "{k}: {r} vs ledger {gc}");
            assert!(close(r["cost"].as_f64().unwrap(), c), "{k}: {r} vs ledger {c}");
            let (n, failed, cancelled) = jobs[k];
            assert_eq!(
                (r["jobs"].as_u64(), r["failed"].as_u64(), r["cancelled"].as_u64()),
                (Some(n), Some(failed), Some(cancelled)),
                "{k}: {r}"
            );
            // Every job submitted has a wait (its time not running), ended or not.
            assert!(r["wait_p50_s"].as_f64().is_some_and(|w| w >= 0.0), "{k}: {r}");
        }
    }
    // The CSV: a header and the same figures.
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(head[0], "user");
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let mut seen = 0;
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        let (gh, _, c) = want[f[0]];
        assert!(close(f[col("gpu_hours")].parse().unwrap(), gh), "{l}");
        assert!(close(f[col("cost")].parse().unwrap(), c), "{l}");
        assert_eq!(f[col("jobs")].parse::<u64>().unwrap(), jobs[f[0]].0, "{l}");
        seen += 1;
    }
    assert_eq!(seen, 3, "{csv}");
    // The statement: one line per job of ta billed this month, then the total, equal to the ledger's.
    let lines: Vec<&str> = statement.lines().collect();
    assert!(lines[0].starts_with("tenant,month,job,"), "{statement}");
    let total: Vec<&str> = lines.last().unwrap().split(',').collect();
    assert_eq!(&total[..3], ["ta", month.as_str(), "total"], "{statement}");
    let head: Vec<&str> = lines[0].split(',').collect();
    let cost = head.iter().position(|h| *h == "cost").unwrap();
    assert!(close(total[cost].parse().unwrap(), want["ta"].2), "{statement}");
    assert_eq!(lines.len(), 2 + 3, "three jobs of ta ran: {statement}");
}

/// Allocated-GPU utilisation: one node's fake GPU sends samples (`--fake-gpu-samples`: a GPU a task holds is always 50 % busy), another's
/// sends none. The tenant whose job ran on the sampled GPU reads 50 % in every format, equal to the ledger's busy over
/// sampled GPU-seconds; the other reads "no samples", never 0 %.
#[test]
fn report_shows_allocated_gpu_utilisation_where_the_agents_sample_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), free_port(), &[]);
    let _sampled = s.agent_with("n1", "1xT4", dir.path(), "127.0.0.1", &["--fake-gpu-samples"]);
    let _silent = s.agent("n2", "1xA10", dir.path(), "127.0.0.1");
    let mut ids = Vec::new();
    for (tenant, model, secs) in [("ta", "T4", 12), ("tb", "A10", 2)] {
        let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", tenant]);
        assert!(ok, "{err}");
        let spec =
            format!("name: busy\ntenant: {tenant}\ngpus: 1\ngpu_models: [{model}]\ncommand: [sleep, \"{secs}\"]\n");
        ids.push(common::submit_yaml(&s, dir.path(), &spec));
    }
    wait_for(Duration::from_secs(60), || ids.iter().all(|id| s.job_state(*id) == "succeeded"));

    let report = json(&s.cli("admin-secret", &["report", "--output", "json"]).1);
    let row = |k: &str| report["rows"].as_array().unwrap().iter().find(|r| r["key"] == k).cloned().unwrap();
    let (ta, tb) = (row("ta"), row("tb"));
    assert!(close(ta["gpu_utilization"].as_f64().unwrap(), 0.5), "{ta}");
    assert!(ta["sampled_gpu_hours"].as_f64().unwrap() > 0.0, "{ta}");
    assert!(tb["gpu_utilization"].is_null() && tb["sampled_gpu_hours"] == 0.0, "no samples is not idle: {tb}");
    assert!(tb["gpu_hours"].as_f64().unwrap() > 0.0, "{tb}");
    let (ok, table, err) = s.cli("admin-secret", &["report"]);
    assert!(ok && table.contains("GPU UTIL"), "{table}{err}");
    let line = |k: &str| table.lines().find(|l| l.starts_with(k)).unwrap().split_whitespace().collect::<Vec<_>>();
    assert!(line("ta").contains(&"50%"), "{table}");
    assert!(!line("tb").iter().any(|c| c.ends_with('%')), "no samples reads '-': {table}");
    let (ok, csv, err) = s.cli("admin-secret", &["report", "--output", "csv"]);
    assert!(ok, "{err}");
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = head.iter().position(|h| *h == "gpu_utilization").unwrap();
    let cells: BTreeMap<String, String> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[col].to_string())
        })
        .collect();
    // The ratio of two sums of floating-point GPU-seconds: 0.5 up to rounding (0.49999999999999994 is seen).
    assert!(cells["ta"].parse::<f64>().is_ok_and(|u| close(u, 0.5)) && cells["tb"].is_empty(), "{csv}");

    // The ledger holds the figures the report shows.
    drop(s);
    let store = gpunet_store::SqliteStore::open(dir.path()).unwrap();
    let rows = gpunet_store::Store::usage(&store, None, 0, gpunet_server::now_ms() + 3_600_000).unwrap();
    let (sampled, busy) = rows
        .iter()
        .filter(|r| r.tenant == "ta")
        .fold((0.0, 0.0), |a, r| (a.0 + r.sampled_gpu_seconds, a.1 + r.busy_gpu_seconds));
    assert!(sampled >= 5.0 && close(busy / sampled, 0.5), "{rows:?}");
    assert!(close(ta["sampled_gpu_hours"].as_f64().unwrap(), sampled / 3600.0), "{ta} vs ledger {sampled}");
    // A sample never covers more than the GPU-time billed.
    let billed: f64 = rows.iter().filter(|r| r.tenant == "ta").map(|r| r.gpu_seconds).sum();
    assert!(sampled <= billed, "{sampled} sampled of {billed} billed");
    assert!(rows.iter().filter(|r| r.tenant == "tb").all(|r| r.sampled_gpu_seconds == 0.0), "{rows:?}");
}

/// A running attempt's utilisation survives a restart of the server: its figures are stored with its job every 15 s,
/// and the server that comes back goes on from them. The job runs 25 s sampled before the server is killed and is
/// cancelled right after the restart, so its ledger row covers well over the few seconds sampled after it (without
/// the stored figures it would cover those only).
#[test]
fn a_running_attempt_s_utilisation_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let port = free_port();
    let mut s = Server::start(&data, port, &[]);
    let _agent = s.agent_with("n1", "1xT4", dir.path(), "127.0.0.1", &["--fake-gpu-samples"]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let id = s.submit(&["--gpus", "1", "--", "sleep", "300"]);
    wait_for(Duration::from_secs(60), || s.job_state(id) == "running");
    let started =
        json(&s.cli("admin-secret", &["show", &id.to_string(), "--output", "json"]).1)["started_ms"].as_u64().unwrap();
    wait_for(Duration::from_secs(90), || gpunet_server::now_ms() >= started + 25_000);
    s.proc.kill9();
    drop(s);
    let s = Server::start(&data, port, &[]);
    let (ok, out, err) = s.cli("admin-secret", &["cancel", &id.to_string()]);
    assert!(ok, "{out}{err}");
    wait_for(Duration::from_secs(60), || s.job_state(id) == "cancelled");
    drop(s);
    let store = gpunet_store::SqliteStore::open(&data).unwrap();
    let rows = gpunet_store::Store::usage(&store, None, 0, gpunet_server::now_ms() + 3_600_000).unwrap();
    let sampled: f64 = rows.iter().filter(|r| r.job == id).map(|r| r.sampled_gpu_seconds).sum();
    let busy: f64 = rows.iter().filter(|r| r.job == id).map(|r| r.busy_gpu_seconds).sum();
    let billed: f64 = rows.iter().filter(|r| r.job == id).map(|r| r.gpu_seconds).sum();
    assert!(sampled >= 9.0, "only {sampled} GPU-seconds sampled of {billed} billed: the restart lost them ({rows:?})");
    assert!(sampled <= billed && close(busy / sampled, 0.5), "{rows:?}");
}

/// Preemptions in the report: a low-priority job evicted for a high-priority one counts once for its tenant, in every
/// format, equal to the jobs' own counts.
#[test]
fn a_preempted_job_counts_in_its_tenant_s_report() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), free_port(), &["--policy", "priority", "--preempt-min-run-s", "0"]);
    let _agent = s.agent("n1", "1xT4", dir.path(), "127.0.0.1");
    assert!(s.cli("admin-secret", &["tenants", "--create", "t"]).0);
    let low = s.submit(&["--gpus", "1", "--", "sleep", "600"]);
    wait_for(Duration::from_secs(30), || s.job_state(low) == "running");
    let high = s.submit(&["--gpus", "1", "--priority", "10", "--", "sleep", "1"]);
    wait_for(Duration::from_secs(60), || s.job_state(high) == "succeeded" && s.job_state(low) == "running");
    let (ok, out, err) = s.cli("admin-secret", &["cancel", &low.to_string()]);
    assert!(ok, "{out}{err}");
    wait_for(Duration::from_secs(30), || s.job_state(low) == "cancelled");
    let (_, jobs, _) = s.cli("admin-secret", &["jobs", "--all", "--output", "json"]);
    let counted: u64 = json(&jobs)["jobs"].as_array().unwrap().iter().map(|j| j["preemptions"].as_u64().unwrap()).sum();
    assert_eq!(counted, 1, "{jobs}");
    let report = json(&s.cli("admin-secret", &["report", "--output", "json"]).1);
    let row = report["rows"].as_array().unwrap().iter().find(|r| r["key"] == "t").cloned().unwrap();
    assert_eq!((row["jobs"].as_u64(), row["preemptions"].as_u64()), (Some(2), Some(1)), "{report}");
    let (ok, csv, err) = s.cli("admin-secret", &["report", "--output", "csv"]);
    assert!(ok, "{err}");
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = head.iter().position(|h| *h == "preemptions").unwrap();
    let line: Vec<&str> =
        csv.lines().find(|l| l.starts_with("t,")).unwrap_or_else(|| panic!("{csv}")).split(',').collect();
    assert_eq!(line[col], "1", "{csv}");
}
