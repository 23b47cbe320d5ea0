//! Runs the real `gpunet` binary.

use std::process::Command;

fn gpunet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpunet")).args(args).output().expect("run gpunet")
}

#[test]
fn bench_sched_json_has_exactly_the_documented_keys() {
    let out = gpunet(&[
        "bench",
        "sched",
        "--nodes",
        "64",
        "--pending",
        "2000",
        "--events",
        "300",
        "--policy",
        "drf",
        "--seed",
        "3",
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "array_elements",
            "arrays",
            "event_p50_us",
            "event_p99_us",
            "full_pass_ms",
            "peak_rss_mib",
            "placeable",
            "placed",
            "policy"
        ]
    );
    assert_eq!(obj["policy"], "drf");
    assert!(obj["placed"].as_u64().unwrap() > 0);
    assert!(obj["placeable"].as_u64().unwrap() > 0, "{obj:?}");
    assert!(obj["event_p99_us"].as_f64().unwrap() >= obj["event_p50_us"].as_f64().unwrap());
    assert!(obj["peak_rss_mib"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_sched_is_deterministic_in_what_it_places() {
    let run = || {
        let out =
            gpunet(&["bench", "sched", "--nodes", "32", "--pending", "800", "--events", "50", "--output", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["placed"].as_u64().unwrap()
    };
    assert_eq!(run(), run());
}

/// `--policy auto` measures the live default (named so in the report), and `--defragment` turns defragmentation on
/// for a named policy: both run and report the same keys.
#[test]
fn bench_sched_measures_auto_and_defragmentation() {
    let run = |args: &[&str]| {
        let mut all = vec!["bench", "sched", "--nodes", "32", "--pending", "800", "--events", "50", "--output", "json"];
        all.extend_from_slice(args);
        let out = gpunet(&all);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let auto = run(&["--policy", "auto"]);
    assert_eq!(auto["policy"], "auto");
    let srgf = run(&["--policy", "srgf", "--backfill", "--defragment"]);
    assert_eq!(srgf["policy"], "srgf");
    for v in [&auto, &srgf] {
        assert!(v["placed"].as_u64().unwrap() > 0 && v["event_p99_us"].as_f64().unwrap() > 0.0, "{v}");
    }
}

#[test]
fn bad_policy_is_a_clear_error() {
    let out = gpunet(&["bench", "sched", "--policy", "lottery"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--policy") && err.contains("lottery") && err.contains("fairshare"), "{err}");
    let out = gpunet(&["bench", "sched", "--output", "yaml"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("table or json"));
}

#[test]
fn bench_e2e_runs_jobs_through_server_and_agent() {
    let out = gpunet(&["bench", "e2e", "--jobs", "40", "--slots", "4", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["drain_s", "placed_p50_ms", "placed_to_start_p50_ms", "start_p50_ms", "start_p99_ms"]);
    assert!(
        v["drain_s"].as_f64().unwrap() > 0.0
            && v["start_p99_ms"].as_f64().unwrap() >= v["start_p50_ms"].as_f64().unwrap()
    );
}

/// `bench e2e --preempt`: the preemptor starts once the victim (which exits at once on SIGTERM) is confirmed gone —
/// well within the 10 s grace period after which the agent would SIGKILL it.
#[test]
fn bench_e2e_preempt_measures_decision_to_preemptor_start() {
    let out = gpunet(&["bench", "e2e", "--preempt", "--jobs", "3", "--slots", "2", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (p50, p99) = (v["preempt_to_start_p50_ms"].as_f64().unwrap(), v["preempt_to_start_p99_ms"].as_f64().unwrap());
    assert!(p50 > 0.0 && p50 <= p99 && p99 < 5_000.0, "{v}");
}

/// `bench depth` at two small depths: one JSON object per depth with the alternating rounds' figures, then the
/// restart's; the pending counts are what was queued before each.
#[test]
fn bench_depth_reports_each_depth_its_rounds_and_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpunet(&[
        "bench",
        "depth",
        "--depths",
        "0,300",
        "--jobs",
        "40",
        "--rounds",
        "2",
        "--clients",
        "2",
        "--readers",
        "2",
        "--data-dir",
        dir.path().join("d").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["pending"], 0);
    // 40 alone and 40 with paced readers over two rounds, then 20 with busy readers: 100 before the fill to 300.
    assert_eq!(lines[1]["pending"], 300);
    for l in &lines[..2] {
        assert!(l["submissions_per_s"].as_f64().unwrap() > 0.0, "{l}");
        let r = &l["with_readers"];
        assert_eq!(r["round_ratios"].as_array().unwrap().len(), 2, "{l}");
        assert!(r["ratio"].as_f64().unwrap() > 0.0 && r["reads_per_s"].as_f64().unwrap() > 0.0, "{l}");
        assert_eq!(l["with_busy_readers"]["round_ratios"].as_array().unwrap().len(), 1, "{l}");
        assert!(l["rss_mib"].as_f64().unwrap() > 1.0, "{l}");
    }
    assert_eq!(lines[2]["pending"], 400, "300 queued, then 100 more measured: {}", lines[2]);
    assert!(lines[2]["restart_s"].as_f64().unwrap() > 0.0);
}

/// `bench elastic`: both clusters run the whole trace (the elastic one growing its spot pool), and a live round
/// measures a new pool node's burst-to-start.
#[test]
fn bench_elastic_compares_a_fixed_and_an_autoscaled_cluster_and_times_a_live_pool() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/traces/examples/tiny.csv");
    let out = gpunet(&["bench", "elastic", "--trace", trace, "--live-runs", "1", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = v["jobs"].as_u64().unwrap();
    let sides = v["sides"].as_array().unwrap();
    assert_eq!(sides.len(), 2);
    assert_eq!(sides[0]["name"], "fixed");
    assert_eq!(sides[1]["name"], "elastic");
    for s in sides {
        assert_eq!(s["completed"].as_u64(), Some(jobs), "{s}");
        assert!(s["cost"].as_f64().unwrap() > 0.0);
    }
    assert!(sides[0]["on_demand_gpus"].as_u64().unwrap() >= v["peak_gpus"].as_u64().unwrap());
    assert!(sides[1]["scaled_out_nodes"].as_u64().unwrap() > 0, "the spot pool grew: {v}");
    let live = v["live_start_ms"].as_array().unwrap();
    assert_eq!(live.len(), 1);
    assert!(live[0].as_f64().unwrap() > 0.0 && v["live_start_p50_ms"].as_f64().unwrap() > 0.0);
}
