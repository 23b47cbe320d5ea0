//! A researcher's and an operator's day at the command line (issue 16), against the real `gpunet server` and a real
//! agent (fake GPUs, real processes): `run` and its exit codes and Ctrl-C, `logs -f`'s exit code, `show`'s attempts
//! and `why` of a finished job, submit flags and jobs that can never fit, listing and formats, and quotas.

mod common;

use common::{free_port, json, wait_for, Server, BIN};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs the CLI as the admin; returns the exit code, stdout and stderr.
fn cli(s: &Server, args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("GPUNET_SERVER", &s.url)
        .env("GPUNET_TOKEN", "admin-secret")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn server_with_tenant(dir: &std::path::Path) -> Server {
    let s = Server::start(&dir.join("server"), free_port(), &["--restart-backoff-s", "0.2"]);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    s
}

#[test]
fn run_streams_every_rank_and_exits_with_the_job_s_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let _agent = s.agent("a1", "2xT4", dir.path(), "127.0.0.1");
    let (code, out, err) = cli(&s, &["run", "--tenant", "t", "--", "sh", "-c", "echo one line; echo two"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out, "one line\ntwo\n", "{err}");
    let (code, out, err) = cli(
        &s,
        &[
            "run",
            "--tenant",
            "t",
            "--tasks",
            "2",
            "--max-restarts",
            "0",
            "--",
            "sh",
            "-c",
            // Each rank ends only once both have written their line: the first failure stops the job's other
            // rank, and under load that could come before the other had written anything.
            "echo hello from $RANK; touch \"$GPUNET_CHECKPOINT_DIR/said-$RANK\"; \
             until [ -e \"$GPUNET_CHECKPOINT_DIR/said-0\" ] && [ -e \"$GPUNET_CHECKPOINT_DIR/said-1\" ]; do sleep 0.05; done; \
             exit 3",
        ],
    );
    assert_eq!(code, Some(3), "the job's exit code: {out}{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["0: hello from 0", "1: hello from 1"], "{err}");
    // Killed by a signal: 128 + N, as a shell says.
    let (code, _, err) = cli(&s, &["run", "--tenant", "t", "--max-restarts", "0", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(code, Some(137), "{err}");
}

#[test]
fn ctrl_c_cancels_the_run_s_job() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let _agent = s.agent("a1", "1xT4", dir.path(), "127.0.0.1");
    let mut run = Command::new(BIN)
        .args(["run", "--tenant", "t", "--", "sh", "-c", "echo started; sleep 300"])
        .env("GPUNET_SERVER", &s.url)
        .env("GPUNET_TOKEN", "admin-secret")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let _ = Command::new("kill").args(["-INT", &run.id().to_string()]).status();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let (_, listed, _) = cli(&s, &["jobs", "-o", "json"]);
    let v = json(&listed);
    assert_eq!(v["jobs"][0]["state"], "cancelled", "{v}");
}

#[test]
fn logs_follow_show_and_why_tell_how_a_job_ended() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let _agent = s.agent("a1", "2xT4", dir.path(), "127.0.0.1");
    let bad =
        s.submit(&["--max-restarts", "1", "--estimate", "1m", "--", "sh", "-c", "echo trying; sleep 0.3; exit 3"]);
    // `logs -f` follows the job through its restart and exits with its code (it returned 0).
    let (code, out, err) = cli(&s, &["logs", "-f", &bad.to_string()]);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(out.contains("trying"), "{out}");
    // `show` lists both attempts with their ends; the events follow.
    let (code, shown, err) = cli(&s, &["show", &bad.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(shown.contains("attempts:") && shown.matches("failed (exit 3)").count() == 2, "{shown}");
    assert!(shown.contains("a1:[") && shown.contains("estimate 1m, ran "), "{shown}");
    assert!(shown.contains("events:") && shown.contains("submitted"), "{shown}");
    let (_, j, _) = cli(&s, &["show", &bad.to_string(), "-o", "json"]);
    let v = json(&j);
    assert_eq!(v["attempts"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        (v["attempts"][1]["outcome"].as_str(), v["attempts"][1]["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    // `why` of a finished job says how it ended (it said "is failed, not queued").
    let (_, why, _) = cli(&s, &["why", &bad.to_string()]);
    assert!(why.contains(&format!("job-{bad} failed: rank 0 exited with code 3")), "{why}");
    assert!(!why.contains("not queued"), "{why}");
    // A time limit kills (SIGTERM), and says so.
    let slow = s.submit(&["--time", "1s", "--max-restarts", "0", "--", "sleep", "60"]);
    wait_for(Duration::from_secs(30), || s.job_state(slow) == "failed");
    let (_, shown, _) = cli(&s, &["show", &slow.to_string()]);
    assert!(shown.contains("time limit reached (signal 15)") && shown.contains("time limit 1s per attempt"), "{shown}");
    let (code, _, _) = cli(&s, &["wait", &slow.to_string()]);
    assert_eq!(code, Some(143));
}

/// A job submitted without an estimate gets one learned from the runs of jobs like it (same user, name and GPUs),
/// with their spread (which preemptive SRTF/SRGF rank it by with `learned_rank = "gittins"`); `show` and `why` say so,
/// and, with `auto` tuned to a probe of 100 ms (shorter than the learned estimate), that it is ranked by its probe;
/// the first job, with nothing to learn from, is ranked by the probe too.
#[test]
fn a_job_without_an_estimate_gets_one_learned_from_jobs_like_it_with_their_spread() {
    let dir = tempfile::tempdir().unwrap();
    let knobs = dir.path().join("sched.toml");
    std::fs::write(&knobs, "[scheduler]\nprobe = \"100ms\"\n").unwrap();
    let s = Server::start(
        &dir.path().join("server"),
        free_port(),
        &["--restart-backoff-s", "0.2", "--sched-config", knobs.to_str().unwrap()],
    );
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    let _agent = s.agent("a1", "1xT4", dir.path(), "127.0.0.1");
    // Before any job has succeeded there is nothing to learn from: the first job has no estimate and is ranked by
    // the probe (`source` `probe`, and `probe_s` until it has run that long: held, it has not), and `why` and
    // `show` say so.
    let first = s.submit(&["--name", "first", "--gpus", "1", "--hold", "--", "true"]);
    let (_, j, err) = cli(&s, &["show", &first.to_string(), "-o", "json"]);
    let e = &json(&j)["estimate"];
    let view = (e["source"].as_str(), e["seconds"].as_u64(), e["probe_s"].as_u64());
    assert_eq!(view, (Some("probe"), Some(1), Some(1)), "{j}{err}");
    let (_, why, _) = cli(&s, &["why", &first.to_string()]);
    assert!(why.contains("no estimate: ranked as a 1s first stint (probe), then as running as long again"), "{why}");
    let (code, _, err) = cli(&s, &["release", &first.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    wait_for(Duration::from_secs(60), || s.job_state(first) == "succeeded");
    let (_, j, err) = cli(&s, &["show", &first.to_string(), "-o", "json"]);
    let e = &json(&j)["estimate"];
    assert_eq!((e["source"].as_str(), e["seconds"].as_u64()), (Some("probe"), Some(1)), "{j}{err}");
    assert!(e.get("probe_s").is_none(), "ended: no longer within its probe: {j}");
    let (_, shown, _) = cli(&s, &["show", &first.to_string()]);
    assert!(
        shown.contains("no estimate: ranked as a 1s first stint (probe), then as running as long again"),
        "{shown}"
    );
    for secs in ["0.2", "1.5", "4"] {
        let id = s.submit(&["--name", "etl", "--gpus", "1", "--", "sleep", secs]);
        wait_for(Duration::from_secs(60), || s.job_state(id) == "succeeded");
    }
    // The next one runs behind a job that holds the only GPU, so that it is still queued when asked about.
    let hold = s.submit(&["--name", "hold", "--gpus", "1", "--", "sleep", "60"]);
    wait_for(Duration::from_secs(60), || s.job_state(hold) == "running");
    let id = s.submit(&["--name", "etl", "--gpus", "1", "--", "true"]);
    let (_, j, err) = cli(&s, &["show", &id.to_string(), "-o", "json"]);
    let e = &json(&j)["estimate"];
    assert_eq!((e["source"].as_str(), e["samples"].as_u64()), (Some("learned"), Some(3)), "{j}{err}");
    // Three runs of 0.2 to 4 s (as the server times them, a little longer): a spread well above zero (1.2 without
    // the start and report latency, 0.76 with half a second of it).
    let spread = e["spread"].as_f64().unwrap_or(0.0);
    assert!(spread > 0.3 && spread < 2.0, "{j}");
    assert_eq!(e["probe_s"].as_u64(), Some(1), "a probe of 100 ms, in whole seconds: {j}");
    let (_, why, _) = cli(&s, &["why", &id.to_string()]);
    assert!(why.contains("learned from") && why.contains("spread ×"), "{why}");
    assert!(why.contains("ranked as a 1s first stint (probe)"), "{why}");
    // A dry run is scheduled by the estimate a submission would get (learned under the submitting user), and says
    // which; one with an estimate given keeps it.
    let dry = |more: &[&str], json_out: bool| {
        let mut a = vec!["submit", "--dry-run", "--tenant", "t", "--name", "etl", "--gpus", "1"];
        if json_out {
            a.extend_from_slice(&["--output", "json"]);
        }
        a.extend_from_slice(more);
        a.extend_from_slice(&["--", "true"]);
        let (code, out, err) = cli(&s, &a);
        assert_eq!(code, Some(0), "{out}{err}");
        out
    };
    let d = json(&dry(&[], true));
    let e = &d["estimate"];
    let view = (e["source"].as_str(), e["samples"].as_u64(), e["probe_s"].as_u64());
    assert_eq!(view, (Some("learned"), Some(3), Some(1)), "{d}");
    let text = dry(&[], false);
    assert!(text.contains("learned from") && text.contains("ranked as a 1s first stint (probe)"), "{text}");
    // An array's dry run too (its parent is a record, not a job: the estimate is its spec's).
    let d = json(&dry(&["--array", "0-1"], true));
    assert_eq!(
        (d["estimate"]["source"].as_str(), d["estimate"]["samples"].as_u64()),
        (Some("learned"), Some(3)),
        "{d}"
    );
    let d = json(&dry(&["--estimate", "1h"], true));
    assert_eq!(
        (d["estimate"]["source"].as_str(), d["estimate"]["seconds"].as_u64()),
        (Some("given"), Some(3600)),
        "{d}"
    );
    let (_, page, _) = cli(&s, &["jobs", "--tenant", "t", "--output", "json"]);
    assert_eq!(json(&page)["total"].as_u64(), Some(6), "the dry runs queued nothing: {page}");
    // An array of such jobs gets it too, and so do its elements (under SRTF/SRGF, and `auto`, an array without an
    // estimate would queue behind every job with one).
    let array = s.submit(&["--name", "etl", "--gpus", "1", "--array", "0-1", "--", "true"]);
    for target in [array.to_string(), format!("{array}[0]")] {
        let (_, j, err) = cli(&s, &["show", &target, "-o", "json"]);
        let e = &json(&j)["estimate"];
        assert_eq!((e["source"].as_str(), e["samples"].as_u64()), (Some("learned"), Some(3)), "{target}: {j}{err}");
    }
    let (code, _, err) = cli(&s, &["cancel", &hold.to_string()]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn submit_flags_reach_the_task_and_jobs_that_can_never_fit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let _agent = s.agent("a1", "4xT4", dir.path(), "127.0.0.1");
    let (code, out, err) = cli(
        &s,
        &[
            "run",
            "--tenant",
            "t",
            "--env",
            "GREETING=hi there",
            "--env",
            "N=2",
            "--workdir",
            "out/sub",
            "--cpu",
            "2",
            "--memory",
            "1Gi",
            "--gpu-model",
            "T4",
            "--selector",
            "zone=z1",
            "--max-restarts",
            "0",
            "--",
            "sh",
            "-c",
            "echo \"$GREETING $N\"; pwd",
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("hi there 2"));
    assert!(lines.next().is_some_and(|l| l.ends_with("/rank-0/out/sub")), "{out}");
    let (_, j, _) = cli(&s, &["jobs", "-o", "json", "--limit", "1"]);
    let spec = &json(&j)["jobs"][0]["spec"];
    assert_eq!(
        (spec["cpu"].as_str(), spec["memory"].as_str(), spec["max_restarts"].as_u64()),
        (Some("2"), Some("1Gi"), Some(0))
    );
    assert_eq!((spec["gpu_models"][0].as_str(), spec["selector"]["zone"].as_str()), (Some("T4"), Some("z1")));
    // 9 GPUs in one task on 4-GPU nodes can never run: refused with the reason (it was accepted, pending forever).
    let (code, _, err) = cli(&s, &["submit", "--tenant", "t", "--gpus", "9", "--", "true"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("can never run") && err.contains("9 GPUs") && err.contains("(422)"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");
    let (code, out, err) =
        cli(&s, &["submit", "--tenant", "t", "--gpus", "2", "--gpu-model", "H100-80GB", "--", "true"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("no node matches"), "{err}");
    let kept = s.submit(&["--gpus", "9", "--hold-never-fits", "--", "true"]);
    assert_eq!(s.job_state(kept), "pending");
    let (_, why, _) = cli(&s, &["why", &kept.to_string()]);
    assert!(why.contains("never fits"), "{why}");
}

#[test]
fn listing_is_newest_first_with_a_count_filters_and_formats() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "u"]);
    assert!(ok, "{err}");
    // No node yet: the jobs wait.
    let ids: Vec<u64> = (0..5).map(|_| s.submit(&["--", "true"])).collect();
    let (code, out, err) = cli(&s, &["jobs", "--limit", "3"]);
    assert_eq!(code, Some(0), "{err}");
    let shown: Vec<u64> = out
        .lines()
        .filter(|l| l.contains(" pending"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(shown, vec![ids[4], ids[3], ids[2]], "the newest, first: {out}");
    assert!(out.contains("3 of 5 jobs, newest first (2 more: --all, or --limit N)"), "{out}");
    let (_, out, _) = cli(&s, &["jobs", "--all", "-o", "json"]);
    assert_eq!((json(&out)["jobs"].as_array().map(Vec::len), json(&out)["total"].as_u64()), (Some(5), Some(5)));
    // Several states; an unknown tenant is an error, not an empty table.
    let (code, _, err) = cli(&s, &["jobs", "--state", "pending,running"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = cli(&s, &["jobs", "--tenant", "nobody"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nobody") && err.contains("404"), "{err}");
    // Users: the admin token's jobs are the admin's.
    let (_, out, _) = cli(&s, &["jobs", "--user", "someone-else", "-o", "json"]);
    assert_eq!(json(&out)["total"], 0);
    // Cancel several at once (`unexpected argument` before), then by state.
    let (code, out, err) = cli(&s, &["cancel", &ids[0].to_string(), &format!("job-{}", ids[1])]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("job-{} cancelled", ids[0])) && out.contains(&format!("job-{} cancelled", ids[1])));
    let (code, out, err) = cli(&s, &["cancel", "--state", "pending", "--tenant", "t"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let (_, out, _) = cli(&s, &["jobs", "--state", "cancelled", "-o", "json"]);
    assert_eq!(json(&out)["total"], 5);
    // Formats: wide has more columns, yaml parses.
    let (_, out, _) = cli(&s, &["jobs", "-o", "wide"]);
    assert!(out.lines().next().is_some_and(|h| h.contains("USER") && h.contains("PRIORITY")), "{out}");
    let (code, out, _) = cli(&s, &["jobs", "-o", "yaml"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("total: 5") && out.contains("state: cancelled"), "{out}");
    let (code, _, err) = cli(&s, &["jobs", "-o", "xml"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("allowed are table, wide, json and yaml") && !err.contains("Stack backtrace"), "{err}");
    // A closed pipe ends the listing quietly (it panicked with "Broken pipe", exit 101).
    let o = Command::new("sh")
        .args(["-c", &format!("'{BIN}' jobs --all -o json | head -c 1 >/dev/null; sleep 0.2")])
        .env("GPUNET_SERVER", &s.url)
        .env("GPUNET_TOKEN", "admin-secret")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    // Errors carry no backtrace, even with RUST_BACKTRACE=1.
    let (code, _, err) = cli(&s, &["show", "999"]);
    assert_eq!(code, Some(1));
    assert!(err.starts_with("error: ") && err.lines().count() == 1, "{err}");
}

#[test]
fn watch_prints_again_until_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let mut w = Command::new(BIN)
        .args(["nodes", "--watch"])
        .env("GPUNET_SERVER", &s.url)
        .env("GPUNET_TOKEN", "admin-secret")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(w.stdout.take().unwrap());
    let mut renders = 0;
    for line in out.lines() {
        if line.unwrap().starts_with("NAME") {
            renders += 1;
            if renders == 2 {
                break;
            }
        }
    }
    let _ = Command::new("kill").args(["-INT", &w.id().to_string()]).status();
    assert_eq!(w.wait().unwrap().code(), Some(0));
    assert_eq!(renders, 2);
}

#[test]
fn quota_shows_keeps_the_fields_not_set_and_clears_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let q = |args: &[&str]| {
        let mut a = vec!["quota", "t", "-o", "json"];
        a.extend_from_slice(args);
        let (code, out, err) = cli(&s, &a);
        assert_eq!(code, Some(0), "{out}{err}");
        json(&out)["quota"].clone()
    };
    let set = q(&["--gpus", "16", "--limit", "40", "--cpu", "64", "--memory", "256Gi"]);
    assert_eq!(set["guarantee_gpus"], 16);
    // No flags: shown, unchanged (it cleared the quota).
    assert_eq!(q(&[]), set);
    // One field: the others kept (--limit dropped the guarantee and CPU/memory).
    let more = q(&["--limit", "48"]);
    assert_eq!((more["guarantee_gpus"].as_u64(), more["limit_gpus"].as_u64()), (Some(16), Some(48)));
    assert_eq!((more["guarantee_cpu"].as_str(), more["guarantee_memory"].as_str()), (Some("64"), Some("256Gi")));
    // The table shows CPU and memory.
    let (_, table, _) = cli(&s, &["tenants"]);
    let head = table.lines().next().unwrap_or_default();
    assert!(head.contains("CPU GUAR.") && head.contains("MEM LIMIT"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("t ") && l.contains("256Gi")), "{table}");
    // A ResourceQuota of any name in the tenant's namespace (refused before: "allowed is the tenant in the path").
    let f = dir.path().join("rq.yaml");
    std::fs::write(
        &f,
        "apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: t-quota\n  namespace: t\nspec:\n  hard:\n    requests.nvidia.com/gpu: \"8\"\n",
    )
    .unwrap();
    assert_eq!(q(&["-f", f.to_str().unwrap()])["guarantee_gpus"], 8);
    assert_eq!(q(&["--clear"]), serde_json::Value::Null);
}

/// `submit --dry-run` of a Kubernetes Job said nothing of what its conversion left out or changed, which the API's
/// answer lists (a submission printed them): it prints them too, on standard error.
#[test]
fn a_dry_run_prints_the_conversion_warnings_a_submission_would() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with_tenant(dir.path());
    let manifest = dir.path().join("job.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: k}\nspec:\n  parallelism: 2\n  completions: 5\n  \
         template:\n    spec:\n      containers: [{name: c, command: [\"true\"], resources: {limits: {nvidia.com/gpu: 1}}}]\n",
    )
    .unwrap();
    let m = manifest.display().to_string();
    let (code, out, err) = cli(&s, &["submit", "--dry-run", "--tenant", "t", "-f", &m]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(err.contains("warning: spec.completions 5 differs from parallelism 2"), "{err}");
    // Nothing was queued.
    let (_, jobs, _) = cli(&s, &["jobs", "--output", "json"]);
    assert_eq!(json(&jobs)["jobs"].as_array().map(Vec::len), Some(0), "{jobs}");
}
