//! Runs the real `gpunet sim` binary.

use std::path::PathBuf;
use std::process::Command;

fn data(p: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces").join(p).display().to_string()
}

fn gpunet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpunet")).args(args).output().expect("run gpunet")
}

#[test]
fn sim_json_has_the_documented_keys() {
    let trace = data("philly/philly_pollux.csv.gz");
    let out = gpunet(&["sim", "--trace", &trace, "--cluster", "philly", "--max-jobs", "3000", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "jobs",
        "avg_jct_s",
        "median_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "p99_queue_s",
        "avg_wait_s",
        "median_wait_s",
        "p99_wait_s",
        "avg_first_start_s",
        "eviction_lost_gpu_hours",
        "eviction_lost_fraction",
        "utilization_span",
        "by_size",
        "utilization",
        "makespan_s",
        "jain_fairness",
        "preemptions",
        "passes",
        "tick_passes",
        "idle_passes",
        "idle_tick_passes",
        "idle_tick_pass_ms",
        "skipped_passes",
        "wall_ms",
    ] {
        assert!(v.get(k).is_some(), "missing {k} in {v}");
    }
    assert_eq!(v["jobs"], 3000);
    assert_eq!(v["avg_queue_s"], v["avg_first_start_s"], "the old key is an alias");
    assert!(v["avg_wait_s"].as_f64().unwrap() >= v["avg_first_start_s"].as_f64().unwrap());
    let classes: Vec<&str> = v["by_size"].as_array().unwrap().iter().map(|c| c["class"].as_str().unwrap()).collect();
    assert_eq!(classes, ["1", "2-4", "5-8", ">8"]);
    let n = |k: &str| v[k].as_u64().unwrap();
    assert!(n("idle_tick_passes") <= n("tick_passes").min(n("idle_passes")) && n("idle_passes") < n("passes"));
    assert!(v["idle_tick_pass_ms"].as_f64().unwrap() <= v["wall_ms"].as_f64().unwrap());
    assert!(v["utilization"].as_f64().unwrap() > 0.0 && v["utilization"].as_f64().unwrap() <= 1.0);
}

#[test]
fn sim_compare_runs_each_policy_and_writes_reports() {
    let dir = std::env::temp_dir().join(format!("gpunet-sim-cli-{}", std::process::id()));
    let trace = data("tiresias/60_job.csv");
    let out = gpunet(&[
        "sim",
        "compare",
        "--policies",
        "fifo,sjf,las",
        "--backfill",
        "--trace",
        &trace,
        "--cluster",
        "tiresias-n1g4",
        "--output",
        "json",
        "--report",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.iter().map(|r| r["policy"].as_str().unwrap()).collect::<Vec<_>>(), ["fifo", "sjf", "las"]);
    assert!(arr.iter().all(|r| r["backfill"] == true && r["jobs"] == 60));
    for p in ["fifo", "sjf", "las"] {
        for f in ["report.md", "utilization.svg", "queue.svg", "jct_cdf.svg"] {
            let path = dir.join(p).join(f);
            let body = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!body.is_empty());
        }
    }
    let md = std::fs::read_to_string(dir.join("sjf/report.md")).unwrap();
    assert!(md.contains("average JCT") && md.contains("![JCT CDF](jct_cdf.svg)"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
    // Table output names every policy in its header.
    let out = gpunet(&["sim", "compare", "--policies", "fifo,drf", "--trace", &trace, "--cluster", "tiresias-n32g4"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().next().unwrap().contains("fifo") && text.contains("drf") && text.contains("avg JCT"),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("probe (s)") && l.matches("off").count() == 2), "{text}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("gpunet-sim-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "id,submit_s,duration_s,gpus,tenant\na,0,10,1,t\nb,5,ten,1,t\n").unwrap();
    let out = gpunet(&["sim", "--trace", bad.to_str().unwrap(), "--cluster", "pollux"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.csv:3") && err.contains("duration_s") && err.contains("\"ten\""), "{err}");
    let out = gpunet(&["sim", "--trace", bad.to_str().unwrap(), "--cluster", "pollux", "--skip-bad-rows"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 malformed"));
    for (args, needle) in [
        (vec!["--cluster", "moon"], "neither a preset"),
        (vec!["--quotas", "lots"], "philly-vc"),
        (vec!["--estimates", "psychic"], "noisy:SIGMA"),
        (vec!["--borrowing", "maybe"], "on and off"),
        (vec!["--trace-format", "slurm"], "pai2023"),
    ] {
        let mut a = vec!["sim", "--trace", bad.to_str().unwrap(), "--skip-bad-rows"];
        a.extend(args);
        let out = gpunet(&a);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stop-time model: the shipped measurements by default, a file of one's own, or a fixed time — and a bad file is
/// refused naming its line, before anything runs.
#[test]
fn stop_times_come_from_measurements_a_file_or_a_fixed_value() {
    let trace = data("philly/philly_pollux.csv.gz");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("stops.csv");
    std::fs::write(&good, "model,seconds\na,1.5\nb,3\n").unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "model,seconds\na,1.5\nb,soon\n").unwrap();
    let base = ["sim", "--trace", &trace, "--cluster", "philly", "--max-jobs", "300", "--output", "json"];
    for extra in [&[][..], &["--stop-times", good.to_str().unwrap()][..], &["--stop-time-s", "2"][..]] {
        let out = gpunet(&[&base[..], extra].concat());
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = gpunet(&[&base[..], &["--stop-times", bad.to_str().unwrap()]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("bad.csv:3") && err.contains("soon"), "{err}");
    let out = gpunet(&[&base[..], &["--stop-time-s", "2", "--stop-times", good.to_str().unwrap()]].concat());
    assert!(!out.status.success(), "--stop-time-s and --stop-times together are refused");
}

/// `--jobs-out` writes a row per job (one file per policy under `compare`); the cluster file's `[scheduler]` table
/// changes the run, and a flag given wins over it; a bad `--sched-config` stops the server before it starts.
#[test]
fn jobs_out_and_scheduler_tables_reach_the_simulator_and_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let trace = data("tiresias/60_job.csv");
    let jobs = dir.path().join("jobs.csv");
    let out = gpunet(&[
        "sim",
        "compare",
        "--policies",
        "fifo,srtf",
        "--preemptive",
        "--trace",
        &trace,
        "--cluster",
        "tiresias-n1g4",
        "--jobs-out",
        jobs.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for p in ["fifo", "srtf"] {
        let text = std::fs::read_to_string(dir.path().join(format!("jobs.{p}.csv"))).unwrap();
        assert_eq!(text.lines().count(), 61, "{p}: a header and 60 jobs");
        assert!(text.starts_with("id,tenant,gpus,size_class,submit_s"));
    }
    let spec = |knobs: &str| {
        let f = dir.path().join(format!("c{}.toml", knobs.len()));
        std::fs::write(
            &f,
            format!("version = 1\n[[node_group]]\ncount = 1\ngpus_per_node = 4\ngpu_model = \"V100-16GB\"\n[scheduler]\n{knobs}"),
        )
        .unwrap();
        f
    };
    let run = |cluster: &std::path::Path, extra: &[&str]| {
        let mut a = vec!["sim", "--trace", &trace, "--cluster", cluster.to_str().unwrap(), "--output", "json"];
        a.extend(extra);
        let out = gpunet(&a);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let las_low = spec("policy = \"las\"\nlas_thresholds_gpu_s = [60]\nmin_run_time = \"0s\"\n");
    let las_high = spec("policy = \"las\"\nlas_thresholds_gpu_s = [100000000]\n");
    let (a, b) = (run(&las_low, &[]), run(&las_high, &[]));
    assert_eq!((a["policy"].as_str(), b["policy"].as_str()), (Some("las"), Some("las")), "the table names the policy");
    assert!(
        a["preemptions"].as_u64().unwrap() > 0 && b["preemptions"] == 0,
        "{} vs {}",
        a["preemptions"],
        b["preemptions"]
    );
    assert_eq!(run(&las_low, &["--policy", "fifo"])["preemptions"], 0, "--policy wins over the table");
    let bad = spec("min_run_tme = \"5m\"\n");
    let out = gpunet(&["sim", "--trace", &trace, "--cluster", bad.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("min_run_tme"));
    let sched = dir.path().join("sched.toml");
    std::fs::write(&sched, "[scheduler]\nmax_evictions = \"many\"\n").unwrap();
    let data_dir = dir.path().join("server");
    let out = gpunet(&[
        "server",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sched-config",
        sched.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--sched-config") && err.contains("max_evictions"), "{err}");
}

/// `--policy auto` replays the live default (SRGF, backfill, eviction for jobs 8× shorter, defragmentation, a probe of
/// 15 minutes): the same figures as the explicit setting, a cluster file with `shorter_ratio = 8` and `--probe-s 900`
/// (without the probe this workload replays otherwise). The cluster file's `[scheduler]` tunes `auto` as the server's
/// `--sched-config` does: with `shorter_ratio = 2`, `defragment = false` and `probe = "0s"` it replays as plain
/// preemptive SRGF.
#[test]
fn sim_policy_auto_is_the_recommended_setting() {
    let trace = data("pollux/workloads/workload-1.csv");
    let run = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["sim", "--trace", &trace, "--estimates", "history", "--output", "json"];
        all.extend_from_slice(args);
        let out = gpunet(&all);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("pollux-8.toml");
    std::fs::write(
        &cluster,
        "version = 1\n[[node_group]]\ncount = 16\ngpus_per_node = 4\ngpu_model = \"T4\"\ncpu_milli = 48000\n\
         memory_mib = 196608\nrack_size = 16\n[scheduler]\nshorter_ratio = 8\n",
    )
    .unwrap();
    let auto = run(&["--policy", "auto", "--cluster", "pollux"]);
    let explicit = |probe: &str| {
        let c = cluster.to_str().unwrap();
        run(&["--policy", "srgf", "--preemptive", "--backfill", "--defragment", "--probe-s", probe, "--cluster", c])
    };
    assert_eq!((&auto["policy"], &auto["preemptive"], &auto["backfill"]), (&"srgf".into(), &true.into(), &true.into()));
    assert_eq!(auto["probe_s"], 900.0);
    let (with_probe, without) = (explicit("900"), explicit("0"));
    for k in ["avg_wait_s", "preemptions", "completed", "eviction_lost_gpu_hours"] {
        assert_eq!(auto[k], with_probe[k], "{k}");
    }
    assert!(without.get("probe_s").is_none());
    assert_ne!(auto["avg_wait_s"], without["avg_wait_s"], "the probe changes this replay");
    let tuned = dir.path().join("pollux-tuned.toml");
    std::fs::write(
        &tuned,
        "version = 1\n[[node_group]]\ncount = 16\ngpus_per_node = 4\ngpu_model = \"T4\"\ncpu_milli = 48000\n\
         memory_mib = 196608\nrack_size = 16\n[scheduler]\nshorter_ratio = 2\ndefragment = false\nprobe = \"0s\"\n",
    )
    .unwrap();
    let auto_tuned = run(&["--policy", "auto", "--cluster", tuned.to_str().unwrap()]);
    let plain_preemptive = run(&["--policy", "srgf", "--preemptive", "--backfill", "--cluster", "pollux"]);
    for k in ["avg_wait_s", "preemptions", "completed", "eviction_lost_gpu_hours"] {
        assert_eq!(auto_tuned[k], plain_preemptive[k], "{k}");
    }
    assert_ne!(auto_tuned["preemptions"], auto["preemptions"], "the file's knobs changed the replay");
    assert!(auto["preemptions"].as_u64().unwrap() > 0);
    // `sim compare` takes `auto` too, beside the plain policy it runs; files are named by policy, `auto` apart.
    let jobs = dir.path().join("jobs.csv");
    let out = gpunet(&[
        "sim",
        "compare",
        "--policies",
        "auto,srgf",
        "--trace",
        &trace,
        "--estimates",
        "history",
        "--cluster",
        "pollux",
        "--output",
        "json",
        "--jobs-out",
        jobs.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let both: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (a, plain) = (&both[0], &both[1]);
    for k in ["avg_wait_s", "preemptions", "completed", "eviction_lost_gpu_hours"] {
        assert_eq!(a[k], auto[k], "{k}");
    }
    assert_eq!(
        (&plain["policy"], &plain["preemptive"], &plain["preemptions"]),
        (&"srgf".into(), &false.into(), &0.into())
    );
    assert!(dir.path().join("jobs.auto.csv").is_file() && dir.path().join("jobs.srgf.csv").is_file());
    // A policy named twice (in any spelling) would write the same files twice: refused.
    let out = gpunet(&["sim", "compare", "--policies", "fifo,FIFO", "--trace", &trace, "--cluster", "pollux"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("fifo is named twice"), "{err}");
}

/// What a researcher met (a read of the simulator's docs): a run whose output files cannot be written is refused
/// before it replays (it ran, then lost everything); results are printed before the files are written; a reader that
/// goes away (`| head`) ends it quietly (it panicked); `--max-jobs 0` is refused (it "succeeded" with nothing); a job
/// no node could hold is named in a warning (averages over completed jobs silently left it out); `auto` is named as
/// such next to a plain `srgf`; a trace submitted at one instant has a span utilisation (it said 0%).
#[test]
fn sim_output_is_checked_first_and_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "id,submit_s,duration_s,gpus,tenant\na,0,100,1,t\nb,0,100,1,t\nwide,0,100,64,t\n").unwrap();
    let cluster = dir.path().join("c.toml");
    std::fs::write(&cluster, "version = 1\n[[node_group]]\ncount = 2\ngpus_per_node = 4\ngpu_model = \"T4\"\n")
        .unwrap();
    let (t, c) = (trace.to_str().unwrap(), cluster.to_str().unwrap());
    let missing = dir.path().join("no/such/jobs.csv");
    let out = gpunet(&["sim", "--trace", t, "--cluster", c, "--jobs-out", missing.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("invalid --jobs-out") && err.contains("does not exist"), "{err}");
    assert!(out.stdout.is_empty(), "refused before any replay");
    let out = gpunet(&["sim", "--trace", t, "--cluster", c, "--report", t]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid --report"), "{out:?}");
    let out = gpunet(&["sim", "--trace", t, "--cluster", c, "--max-jobs", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid --max-jobs 0"), "{out:?}");
    // A trace of bad rows only, skipped: the error says they were skipped.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "id,submit_s,duration_s,gpus,tenant\na,x,1,1,t\n").unwrap();
    let out = gpunet(&["sim", "--trace", bad.to_str().unwrap(), "--cluster", c, "--skip-bad-rows"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no jobs (1 malformed rows skipped"), "{out:?}");
    // A probe with given estimates does nothing, and says so.
    let out = gpunet(&["sim", "--trace", t, "--cluster", c, "--policy", "srtf", "--probe-s", "60"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the probe does nothing with --estimates oracle"), "{out:?}");
    // Flags of other policies say so too, as the file's knobs do; the JSON's `preemptive` is what is in effect.
    let out = gpunet(&[
        "sim",
        "--trace",
        t,
        "--cluster",
        c,
        "--policy",
        "fifo",
        "--las-thresholds",
        "60",
        "--max-evictions",
        "0",
        "--preemptive",
        "--output",
        "json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    for w in
        ["las_thresholds_gpu_s does nothing under fifo", "max_evictions = 0 allows no eviction", "preemptive = true"]
    {
        assert!(err.contains(w), "{w}: {err}");
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["preemptive"], false, "not in effect under fifo");
    // The wide job can never run here: a warning names it; the rest replays.
    let out = gpunet(&["sim", "--trace", t, "--cluster", c, "--output", "json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("1 of 3 jobs can never run on this cluster") && err.contains("(first: wide:"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["completed"].as_u64(), v["unfinished"].as_u64(), v["never_fit"].as_u64()),
        (Some(2), Some(1), Some(1))
    );
    // Submitted at one instant: the span is empty, and its utilisation is the whole run's (2 of 8 GPUs busy).
    assert_eq!((v["utilization_span"].as_f64(), v["utilization"].as_f64()), (Some(0.25), Some(0.25)), "{v}");
    // Standard error closed before anything is written: the error still ends the process with 1, not a panic's 101
    // (`gpunet sim … 2>&1 >/dev/null | head -1` got 101 one time in five).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_gpunet"))
        .args(["sim", "--trace", t, "--cluster", t])
        .stdout(std::process::Stdio::null())
        .stderr(writer)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
    // A trace whose only job never runs has no averages over completed jobs: the table says "n/a" (its bounded
    // slowdown read 0.00, below the metric's floor of 1), and the class without jobs "-".
    let lone = dir.path().join("lone.csv");
    std::fs::write(&lone, "id,submit_s,duration_s,gpus,tenant\nwide,0,100,64,t\n").unwrap();
    let out = gpunet(&["sim", "--trace", lone.to_str().unwrap(), "--cluster", c]);
    let table = String::from_utf8_lossy(&out.stdout);
    let row = |label: &str| table.lines().find(|l| l.starts_with(label)).unwrap_or_default().to_string();
    for label in ["avg JCT (s)", "avg wait, all not running (s)", "avg bounded slowdown"] {
        assert!(row(label).trim_end().ends_with("n/a"), "{label}: {table}");
    }
    assert!(row("avg wait by size").trim_end().ends_with("-|-|-|-"), "{table}");
    assert!(row("Jain fairness").trim_end().ends_with("n/a"), "{table}");
    let rep = dir.path().join("rep");
    let out = gpunet(&["sim", "--trace", lone.to_str().unwrap(), "--cluster", c, "--report", rep.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let md = std::fs::read_to_string(rep.join("report.md")).unwrap();
    for line in
        ["| average bounded slowdown | n/a |", "| Jain's fairness (tenants) | n/a |", "| >8 | 0 | - | - | - | - |"]
    {
        assert!(md.contains(line), "{line}: {md}");
    }
    // `auto` and a plain `srgf` told apart, in the table's heads and the JSON.
    let compare = |output: &str| {
        gpunet(&["sim", "compare", "--policies", "auto,srgf", "--trace", t, "--cluster", c, "--output", output])
    };
    // A warning of several policies is said once, naming them (it was said once per policy, naming none).
    let out = gpunet(&[
        "sim",
        "compare",
        "--policies",
        "fifo,las,srtf",
        "--trace",
        t,
        "--cluster",
        c,
        "--max-evictions",
        "0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("max_evictions = 0").count(), 1, "{err}");
    assert!(err.contains("warning (fifo, las, srtf): max_evictions = 0 allows no eviction at all"), "{err}");
    let out = compare("json");
    let both: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&both[0]["setting"], both[1].get("setting")), (&serde_json::json!("auto"), None), "{both}");
    assert_eq!((&both[0]["shorter_ratio"], &both[0]["defragment"]), (&serde_json::json!(8), &serde_json::json!(true)));
    let head = String::from_utf8_lossy(&compare("table").stdout).lines().next().unwrap_or_default().to_string();
    assert!(head.contains("auto+pre+bf") && head.contains("srgf"), "{head}");
    // A cluster file naming `auto` is the recommended setting; a plain policy on the command line wins over it and
    // takes none of its knobs (it ran FIFO with preemption, defragmentation and a probe).
    let auto_file = dir.path().join("auto.toml");
    std::fs::write(
        &auto_file,
        "version = 1\n[[node_group]]\ncount = 2\ngpus_per_node = 4\ngpu_model = \"T4\"\n[scheduler]\npolicy = \"auto\"\n",
    )
    .unwrap();
    let a = auto_file.to_str().unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["sim", "--trace", t, "--cluster", a, "--output", "json"];
        all.extend_from_slice(args);
        serde_json::from_slice(&gpunet(&all).stdout).unwrap()
    };
    let by_file = json(&[]);
    assert_eq!(
        (&by_file["setting"], &by_file["defragment"], &by_file["probe_s"]),
        (&"auto".into(), &true.into(), &900.0.into())
    );
    let fifo = json(&["--policy", "fifo"]);
    assert_eq!(
        (&fifo["policy"], &fifo["preemptive"], fifo.get("defragment"), fifo.get("probe_s")),
        (&"fifo".into(), &false.into(), None, None),
        "{fifo}"
    );
    // A reader that closes its end before the results come: no panic, a clean exit.
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpunet"))
        .args(["sim", "--trace", &data("philly/philly_pollux.csv.gz"), "--cluster", "philly", "--max-jobs", "2000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{:?} {err}", out.status);
}
