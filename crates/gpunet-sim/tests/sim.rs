//! Simulator tests: hand-computed traces with exact JCTs, conservation invariants, and a reader test per real file.

use gpunet_core::{Dur, Policy, SchedConfig};
use gpunet_sim::*;
use std::path::PathBuf;

fn data(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces").join(p)
}

fn one_node(gpus: u32) -> ClusterSpec {
    ClusterSpec::from_toml(
        &format!("version = 1\n[[node_group]]\ncount = 1\ngpus_per_node = {gpus}\ngpu_model = \"T4\"\n"),
        "tiny",
    )
    .unwrap()
}

fn csv(body: &str) -> Trace {
    read_trace_from(
        format!("id,submit_s,duration_s,gpus,tenant\n{body}").as_bytes(),
        "tiny.csv",
        ReadOptions::default(),
    )
    .unwrap()
}

fn cfg(policy: Policy) -> SimConfig {
    let mut sched = SchedConfig::with_policy(policy);
    sched.preemption.min_run_time = Dur::ZERO;
    sched.las_thresholds_gpu_s = vec![30];
    SimConfig {
        sched,
        checkpoint_interval: Dur::from_secs(10),
        tick: Dur::from_secs(10),
        check_invariants: true,
        stop_time: gpunet_sim::StopTime::Fixed(Dur::ZERO),
        ..SimConfig::default()
    }
}

fn jcts_by_id(trace: &Trace, cluster: &ClusterSpec, c: &SimConfig) -> SimResult {
    simulate(trace, cluster, c, &mut |_, _| {}).unwrap()
}

const THREE_JOBS: &str = "a,0,100,1,t\nb,10,50,1,t\nc,20,10,1,t\n";

#[test]
fn fifo_sjf_and_las_give_the_hand_computed_jcts() {
    let trace = csv(THREE_JOBS);
    let cluster = one_node(1);
    // FIFO: a 0–100, b 100–150, c 150–160 → JCTs 100, 140, 140.
    let r = jcts_by_id(&trace, &cluster, &cfg(Policy::Fifo));
    assert_eq!(r.jcts, vec![100.0, 140.0, 140.0]);
    assert!((r.avg_jct_s - 380.0 / 3.0).abs() < 1e-9);
    assert_eq!((r.makespan_s, r.preemptions), (160.0, 0));
    // SJF (estimate ÷ GPUs): at t=100 c (10 s) goes before b (50 s): a 100, c 90, b 150.
    let r = jcts_by_id(&trace, &cluster, &cfg(Policy::Sjf));
    assert_eq!(r.jcts, vec![90.0, 100.0, 150.0]);
    // LAS with one threshold at 30 GPU-s, ticks every 10 s, checkpoints every 10 s:
    // t=30 a is demoted and evicted (keeps 30 s), b runs 30–60 and is demoted and evicted (keeps 30 s),
    // c runs 60–70; then a (submitted first) 70–140, b 140–160. JCTs: c 50, a 140, b 150.
    let r = jcts_by_id(&trace, &cluster, &cfg(Policy::Las));
    assert_eq!(r.jcts, vec![50.0, 140.0, 150.0]);
    assert_eq!(r.preemptions, 2);
    assert_eq!(r.lost_gpu_hours, 0.0, "evictions at checkpoint boundaries lose nothing");
}

/// With a modelled stop time, a victim keeps its GPU until it is confirmed gone (5 s here), computing meanwhile:
/// a is demoted at t=30 and holds the GPU to 35 (its checkpoint at 30 keeps 30 s: 5 s lost); b runs from 35, is
/// demoted at the tick at 70 and holds the GPU to 75 (its checkpoint at 75, every 10 s from its start, keeps all);
/// c runs 75–85, a 85–155, b 155–165. JCTs: c 65, a 155, b 155.
#[test]
fn a_victim_holds_its_gpu_for_the_modelled_stop_time() {
    let trace = csv(THREE_JOBS);
    let c = SimConfig { stop_time: gpunet_sim::StopTime::Fixed(Dur::from_secs(5)), ..cfg(Policy::Las) };
    let r = jcts_by_id(&trace, &one_node(1), &c);
    assert_eq!(r.jcts, vec![65.0, 155.0, 155.0]);
    assert_eq!((r.preemptions, r.makespan_s), (2, 165.0));
    assert!((r.lost_gpu_hours - 5.0 / 3600.0).abs() < 1e-9, "{}", r.lost_gpu_hours);
    assert!((r.utilization - 1.0).abs() < 1e-9, "the GPU is never idle nor shared");
}

/// Measured stop times drive the same lifecycle: one measurement of 5 s gives the fixed 5 s run's results; the
/// shipped measurements (the default) give a seeded, repeatable run whose victims hold their GPU for a while.
#[test]
fn measured_stop_times_are_drawn_for_each_stop() {
    let trace = csv(THREE_JOBS);
    let measured = gpunet_sim::StopTime::from_csv("five", "model,seconds\nx,5.0\n").unwrap();
    let r = jcts_by_id(&trace, &one_node(1), &SimConfig { stop_time: measured, ..cfg(Policy::Las) });
    assert_eq!(r.jcts, vec![65.0, 155.0, 155.0]);
    let default = SimConfig { stop_time: gpunet_sim::StopTime::default(), ..cfg(Policy::Las) };
    let a = jcts_by_id(&trace, &one_node(1), &default);
    let b = jcts_by_id(&trace, &one_node(1), &default);
    assert_eq!((&a.jcts, a.makespan_s), (&b.jcts, b.makespan_s), "one seed, one result");
    assert!(a.makespan_s > 160.0 && a.makespan_s <= 180.0, "two stops of 0–10 s each: {}", a.makespan_s);
}

#[test]
fn queueing_delay_and_slowdown_are_measured() {
    let trace = csv(THREE_JOBS);
    let r = jcts_by_id(&trace, &one_node(1), &cfg(Policy::Fifo));
    // Queueing: a 0, b 90, c 130.
    assert!((r.avg_queue_s - 220.0 / 3.0).abs() < 1e-9);
    assert_eq!(r.p99_queue_s, 130.0);
    // Utilisation: 1 GPU busy for all 160 s.
    assert!((r.utilization - 1.0).abs() < 1e-9);
    assert!((r.gpu_hours_used - 160.0 / 3600.0).abs() < 1e-9);
}

/// Total wait counts every wait, not only the first: under LAS (the hand-computed run above) a runs 0–30 and
/// 70–140 (held 100 s of a 140 s life: waits 40 s), b runs 30–60 and 140–160 (submitted at 10: waits 100 s), c
/// runs 60–70 (submitted at 20: waits 40 s). Average wait 60 s; average time to first start (a 0, b 20, c 40) 20 s.
#[test]
fn avg_wait_counts_waits_after_preemption_and_first_start_does_not() {
    let r = jcts_by_id(&csv(THREE_JOBS), &one_node(1), &cfg(Policy::Las));
    assert_eq!(r.jcts, vec![50.0, 140.0, 150.0]);
    assert!((r.avg_wait_s - 60.0).abs() < 1e-9, "{}", r.avg_wait_s);
    assert!((r.avg_first_start_s - 20.0).abs() < 1e-9, "{}", r.avg_first_start_s);
    assert_eq!(r.avg_queue_s, r.avg_first_start_s, "the old key is an alias");
    assert_eq!((r.median_wait_s, r.p99_wait_s), (40.0, 100.0));
    let waits: Vec<(String, f64, u32)> = r.job_rows.iter().map(|j| (j.id.clone(), j.wait_s, j.evictions)).collect();
    assert_eq!(waits, vec![("a".into(), 40.0, 1), ("b".into(), 100.0, 1), ("c".into(), 40.0, 0)]);
    assert_eq!(r.eviction_lost_gpu_hours, 0.0, "both evictions fell on checkpoints");
    assert_eq!(r.by_size[0].jobs, 3);
    assert!((r.by_size[0].avg_wait_s - 60.0).abs() < 1e-9);
    assert!((r.per_tenant[0].avg_wait_s - 60.0).abs() < 1e-9);
}

/// Preemptive SRTF, hand-computed: a (100 s) runs from 0; b (20 s) arrives at 10 when a has 90 s left (≥ 2 × 20):
/// a is evicted at its checkpoint at 10 s, b runs 10–30, a resumes with 90 s left and ends at 120. JCTs b 20,
/// a 120; waits a 20 (120 − 100 held), b 0. Without preemption: a 0–100, b 100–120 (waits 0 and 90).
#[test]
fn preemptive_srtf_gives_the_hand_computed_jcts_and_waits() {
    let trace = csv("a,0,100,1,t\nb,10,20,1,t\n");
    let mut c = cfg(Policy::Srtf);
    c.sched.preemption.shorter_first = true;
    let r = jcts_by_id(&trace, &one_node(1), &c);
    assert_eq!(r.jcts, vec![20.0, 120.0]);
    assert_eq!(r.preemptions, 1);
    assert!((r.avg_wait_s - 10.0).abs() < 1e-9, "{}", r.avg_wait_s);
    assert_eq!(r.avg_first_start_s, 0.0);
    assert!(r.preemptive);
    let plain = jcts_by_id(&trace, &one_node(1), &cfg(Policy::Srtf));
    assert_eq!(plain.jcts, vec![100.0, 110.0]);
    assert_eq!(plain.preemptions, 0);
    assert!((plain.avg_wait_s - 45.0).abs() < 1e-9);
}

/// An eviction between checkpoints loses the work since the last one; the loss is counted as lost to evictions.
#[test]
fn work_lost_to_evictions_is_counted_apart() {
    // a (100 s, checkpoints every 10 s) is evicted at 15 s by b (20 s): 5 GPU-s lost.
    let trace = csv("a,0,100,1,t\nb,15,20,1,t\n");
    let mut c = cfg(Policy::Srtf);
    c.sched.preemption.shorter_first = true;
    let r = jcts_by_id(&trace, &one_node(1), &c);
    assert_eq!(r.preemptions, 1);
    assert!((r.eviction_lost_gpu_hours - 5.0 / 3600.0).abs() < 1e-12, "{}", r.eviction_lost_gpu_hours);
    assert!((r.eviction_lost_fraction - 5.0 / 125.0).abs() < 1e-9, "{}", r.eviction_lost_fraction);
    // b 15–35; a resumes at 35 with 90 s left, ends at 125: held 15 + 90 = 105, waits 20.
    assert_eq!(r.jcts, vec![20.0, 125.0]);
    assert!((r.avg_wait_s - 10.0).abs() < 1e-9, "{}", r.avg_wait_s);
}

#[test]
fn jobs_out_writes_a_row_per_job() {
    let r = jcts_by_id(&csv(THREE_JOBS), &one_node(1), &cfg(Policy::Fifo));
    let dir = std::env::temp_dir().join(format!("gpunet-sim-jobs-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("jobs.csv");
    write_jobs_csv(&p, &r.job_rows).unwrap();
    let text = std::fs::read_to_string(&p).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].starts_with("id,tenant,gpus,size_class,submit_s"));
    // b: submitted 10, started 100, ended 150: waited 90.
    assert_eq!(lines[2], "b,t,1,1,10.000,50.000,50.000,100.000,150.000,completed,50.000,90.000,140.000,0");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One node of `gpus` GPUs with a `[scheduler]` table, and the test configuration with the table applied.
fn knobbed(policy: Policy, gpus: u32, knobs: &str) -> (ClusterSpec, SimConfig) {
    let cluster = ClusterSpec::from_toml(
        &format!(
            "version = 1\n[[node_group]]\ncount = 1\ngpus_per_node = {gpus}\ngpu_model = \"T4\"\n[scheduler]\n{knobs}"
        ),
        "knobbed",
    )
    .unwrap();
    let mut c = cfg(policy);
    c.apply_knobs(cluster.scheduler.as_ref().unwrap()).unwrap();
    (cluster, c)
}

fn run_knobbed(trace: &str, policy: Policy, gpus: u32, knobs: &str) -> SimResult {
    let (cluster, c) = knobbed(policy, gpus, knobs);
    jcts_by_id(&csv(trace), &cluster, &c)
}

#[test]
fn knob_las_thresholds_decide_demotion() {
    let r = run_knobbed(THREE_JOBS, Policy::Las, 1, "las_thresholds_gpu_s = [30]\n");
    assert_eq!((r.preemptions, r.jcts.clone()), (2, vec![50.0, 140.0, 150.0]));
    // One queue below 1,000 GPU-s: nobody is demoted; LAS serves in submission order.
    let r = run_knobbed(THREE_JOBS, Policy::Las, 1, "las_thresholds_gpu_s = [1000]\n");
    assert_eq!((r.preemptions, r.jcts), (0, vec![100.0, 140.0, 140.0]));
}

#[test]
fn knob_min_run_time_holds_a_young_victim() {
    let t = "a,0,1000,1,t\nb,10,20,1,t\n";
    let r = run_knobbed(t, Policy::Srtf, 1, "preemptive = true\nmin_run_time = \"0s\"\n");
    assert_eq!(r.jcts, vec![20.0, 1020.0]);
    // a may be evicted only from 30 s on (the tick at 30): b runs 30–50.
    let r = run_knobbed(t, Policy::Srtf, 1, "preemptive = true\nmin_run_time = \"30s\"\n");
    assert_eq!(r.jcts, vec![40.0, 1020.0]);
}

#[test]
fn knob_eviction_rate_limit_caps_evictions() {
    let t = "a1,0,1000,1,t\na2,0,1000,1,t\nb1,10,20,1,t\nb2,10,20,1,t\n";
    let r = run_knobbed(t, Policy::Srtf, 2, "preemptive = true\n");
    assert_eq!(r.preemptions, 2);
    let r = run_knobbed(t, Policy::Srtf, 2, "preemptive = true\nmax_evictions = 1\neviction_window = \"1h\"\n");
    assert_eq!(r.preemptions, 1, "b2 waits for b1 instead of evicting a second job");
}

/// The trace of the two tests below, replayed under preemptive SRTF on one GPU with learned estimates and `knobs`.
fn learned_newcomer(knobs: &str) -> SimResult {
    let t = "w1,0,10,1,t\nw2,20,1000,1,t\nL,1100,10000,1,t\nG,1250,20,1,t\n";
    let (cluster, mut c) = knobbed(Policy::Srtf, 1, &format!("preemptive = true\n{knobs}"));
    c.estimates = EstimateMode::History;
    jcts_by_id(&csv(t), &cluster, &c)
}

/// `learned_rank` with learned estimates, preemptive SRTF on one GPU, by hand. w1 (10 s) and w2 (1,000 s) teach the
/// predictor tenant t's one-GPU jobs: a median of 100 s and a log-spread of 2.30 (ln 100 apart). L (10,000 s) starts
/// at 1,100 s; G (20 s) arrives at 1,250 s. Both are learned as median 100 s, spread 2.30.
/// - `gittins`: G's rank as a new job is 0.434 × 100 = 43 s; L's after 150 s (1.5 medians) is 3.78 × 100 = 378 s
///   (values from `gpunet_core::gittins`, checked there against a numerical computation): 378 ≥ 2 × 43, so G
///   evicts L at once and ends at 1,270 s: JCT 20 s.
/// - `median`: G counts 100 s; L, past its median, as long again as it has run (150 s < 2 × 100): G waits until
///   the tick at 1,300 s, when L's 200 s reach twice G's: JCT 70 s.
#[test]
fn knob_learned_rank_decides_how_a_learned_victim_and_a_learned_newcomer_compare() {
    for (rank, g_jct) in [("gittins", 20.0), ("median", 70.0)] {
        let r = learned_newcomer(&format!("learned_rank = \"{rank}\"\n"));
        // JCTs in ascending order: w1 10, G, w2 1,000, and L 10,020 either way (it loses nothing: checkpoints every
        // 10 s, stops at once; it ends at 11,120 s).
        assert_eq!(
            (r.learned_rank.as_str(), r.preemptions, r.jcts.clone()),
            (rank, 1, vec![10.0, g_jct, 1000.0, 10020.0]),
            "{rank}"
        );
    }
}

/// `probe`, on the same trace as the test above, ranking by the median: L and G are learned as 100 s (median),
/// longer than a probe of 30 s, so each is ranked as a job of 30 s until it has run that long. L started at 1,100 s
/// and has run 150 s when G arrives: past its probe it counts as long again as it has run (150 s ≥ 2 × 30 s), so G
/// evicts it at once and ends at 1,270 s (JCT 20 s, against 70 s without a probe). w2 was learned from w1 alone
/// (10 s, shorter than the probe): no probe.
#[test]
fn knob_probe_gives_a_learned_newcomer_a_first_stint() {
    for (knob, g_jct) in [("probe = \"30s\"\n", 20.0), ("", 70.0)] {
        let r = learned_newcomer(knob);
        assert_eq!(r.probe_s, (!knob.is_empty()).then_some(30.0));
        assert_eq!((r.preemptions, r.jcts.clone()), (1, vec![10.0, g_jct, 1000.0, 10020.0]), "{knob}");
    }
}

/// `probe` for jobs without estimate, preemptive SRTF on one GPU with learned estimates, by hand: nothing has ended
/// when `first` (10,000 s) starts at 0 or when `short` (20 s) arrives at 100 s, so neither has an estimate. With a
/// probe of 30 s each is ranked as a 30-s job until it has run that long, then as one that runs as long again as it
/// has: `first`, 100 s in, counts 100 s ≥ 2 × 30 s, so `short` evicts it at once (JCT 20 s) and `first` ends at
/// 10,020 s (it loses nothing: checkpoints every 10 s). Without a probe neither has a rank and `first` is never
/// evicted: `short` waits for it (JCT 9,920 s).
#[test]
fn knob_probe_ranks_jobs_without_estimate_and_lets_them_evict_a_long_one() {
    for (knob, jcts, evictions) in [("probe = \"30s\"\n", vec![20.0, 10020.0], 1), ("", vec![9920.0, 10000.0], 0)] {
        let (cluster, mut c) = knobbed(Policy::Srtf, 1, &format!("preemptive = true\n{knob}"));
        c.estimates = EstimateMode::History;
        let r = jcts_by_id(&csv("first,0,10000,1,t\nshort,100,20,1,t\n"), &cluster, &c);
        assert_eq!((r.preemptions, r.jcts.clone()), (evictions, jcts), "{knob}");
    }
}

#[test]
fn knob_tick_paces_las_demotion() {
    assert_eq!(run_knobbed(THREE_JOBS, Policy::Las, 1, "tick = \"10s\"\n").preemptions, 2);
    // With a tick of 1,000 s no pass runs while a crosses 30 GPU-s: it is never demoted.
    let r = run_knobbed(THREE_JOBS, Policy::Las, 1, "tick = \"1000s\"\n");
    assert_eq!((r.preemptions, r.jcts), (0, vec![100.0, 140.0, 140.0]));
}

#[test]
fn knob_checkpoint_interval_sets_the_work_an_eviction_loses() {
    let t = "a,0,100,1,t\nb,15,20,1,t\n";
    let r = run_knobbed(t, Policy::Srtf, 1, "preemptive = true\ncheckpoint_interval = \"10s\"\n");
    assert!((r.eviction_lost_gpu_hours * 3600.0 - 5.0).abs() < 1e-9);
    let r = run_knobbed(t, Policy::Srtf, 1, "preemptive = true\ncheckpoint_interval = \"15s\"\n");
    assert_eq!(r.eviction_lost_gpu_hours, 0.0, "a checkpoint at 15 s keeps all");
}

#[test]
fn knob_stop_time_keeps_a_victims_gpu_while_it_stops() {
    assert_eq!(run_knobbed(THREE_JOBS, Policy::Las, 1, "stop_time = \"0s\"\n").makespan_s, 160.0);
    assert_eq!(run_knobbed(THREE_JOBS, Policy::Las, 1, "stop_time = \"5s\"\n").makespan_s, 165.0);
}

/// On 2 GPUs under FIFO: x (1 GPU, 100 s) runs from 0; y (2 GPUs) arrives at 1 and blocks until x ends at 100;
/// z (1 GPU, 50 s) arrives at 2. Backfilled, z runs 2–52, before y's reservation at 100 (JCT 50); else it waits
/// for y (150–200: JCT 198).
const BACKFILLABLE: &str = "x,0,100,1,t\ny,1,50,2,t\nz,2,50,1,t\n";

#[test]
fn knob_backfill_from_the_file_turns_backfill_on_and_off() {
    assert_eq!(run_knobbed(BACKFILLABLE, Policy::Fifo, 2, "backfill = true\n").jcts, vec![50.0, 100.0, 149.0]);
    assert_eq!(run_knobbed(BACKFILLABLE, Policy::Fifo, 2, "backfill = false\n").jcts, vec![100.0, 149.0, 198.0]);
}

/// `backfill_depth = 0`: no job behind the blocked head is tried, z waits as without backfill.
#[test]
fn knob_backfill_depth_bounds_the_jobs_tried_behind_a_blocked_head() {
    let r = run_knobbed(BACKFILLABLE, Policy::Fifo, 2, "backfill = true\nbackfill_depth = 0\n");
    assert_eq!(r.jcts, vec![100.0, 149.0, 198.0]);
}

/// `reservation_horizon = 0`: the head's reservation looks at no running job's end, so it has no time, and backfill
/// keeps off the node it needs: z waits.
#[test]
fn knob_reservation_horizon_bounds_what_a_reservation_looks_ahead() {
    let r = run_knobbed(BACKFILLABLE, Policy::Fifo, 2, "backfill = true\nreservation_horizon = 0\n");
    assert_eq!(r.jcts, vec![100.0, 149.0, 198.0]);
    let r = run_knobbed(BACKFILLABLE, Policy::Fifo, 2, "backfill = true\nreservation_horizon = 1\n");
    assert_eq!(r.jcts, vec![50.0, 100.0, 149.0]);
}

/// A replay whose jobs are evicted past `eviction_loop_limit` stops with an error naming the job (a loop of
/// evictions ran for ever, its memory growing, before knobs that allow one were refused).
#[test]
fn a_loop_of_evictions_stops_the_replay_with_an_error() {
    let (cluster, mut c) = knobbed(Policy::Srtf, 1, "preemptive = true\n");
    c.eviction_loop_limit = 0;
    let e = simulate(&csv("a,0,1000,1,t\nb,10,20,1,t\n"), &cluster, &c, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("replay at t=10 s") && e.contains("job-1 was evicted more than 0 times"), "{e}");
    c.eviction_loop_limit = 1;
    assert_eq!(jcts_by_id(&csv("a,0,1000,1,t\nb,10,20,1,t\n"), &cluster, &c).preemptions, 1);
}

/// Nodes that fail far more often than a job checkpoints: the job never keeps any work, and past the loop limit the
/// replay stops with an error naming it (a replay with `--mtbf-hours 0.3` on the Pollux workloads ran for ever).
#[test]
fn a_job_whose_node_fails_faster_than_it_checkpoints_stops_the_replay_with_an_error() {
    let mut c = cfg(Policy::Fifo);
    c.mtbf = Some(Dur::from_secs(60));
    c.mttr = Dur::from_secs(1);
    c.checkpoint_interval = Dur::from_hours(1);
    c.eviction_loop_limit = 50;
    let e = simulate(&csv("long,0,100000,1,t\n"), &one_node(1), &c, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("job-1 lost its node more than 50 times in a row without keeping any work"), "{e}");
    // With checkpoints every 10 s it keeps its work between failures and finishes.
    c.checkpoint_interval = Dur::from_secs(10);
    let r = jcts_by_id(&csv("long,0,100000,1,t\n"), &one_node(1), &c);
    assert_eq!(r.completed, 1);
    assert!(r.node_losses > 50, "{}", r.node_losses);
}

/// One job of 317 years among short ones: the samples thin out as the run goes on (every 60 s of it, they grew to
/// gigabytes), and the series stays within 8 times the samples asked for.
#[test]
fn a_run_far_longer_than_its_trace_keeps_a_bounded_series() {
    let r = jcts_by_id(&csv("a,0,1,1,t\nb,0,1,1,t\nc,0,10000000000,1,t\n"), &one_node(1), &cfg(Policy::Fifo));
    assert_eq!(r.completed, 3);
    let asked = SimConfig::default().samples;
    assert!(r.series.len() <= 8 * asked && r.series.len() >= asked, "{}", r.series.len());
    assert!(r.series.windows(2).all(|w| w[0].t_s < w[1].t_s), "in time order");
}

/// A sample falls at the instants where a job ends and the waiting one starts (samples every 100 s on one node of 8
/// GPUs; two jobs of 6 GPUs and 100 s submitted at 0): it is taken after that instant's pass, so it shows the GPUs
/// the pass gave out and the job it left waiting, not the state before the instant (it showed nothing used and both
/// jobs queued at 0 s, a still running and b queued at 100 s, b still running at 200 s).
#[test]
fn a_sample_at_an_event_shows_the_cluster_after_its_pass() {
    let mut c = cfg(Policy::Fifo);
    c.samples = 1;
    let r = jcts_by_id(&csv("a,0,100,6,t\nb,0,100,6,t\n"), &one_node(8), &c);
    let got: Vec<(f64, f64, usize, f64)> =
        r.series.iter().map(|s| (s.t_s, s.utilization, s.queued, s.fragmentation)).collect();
    // At 0 s: a runs on 6 of 8 GPUs, b waits for 6 and the 2 left free cannot serve it. At 100 s: b runs, nothing
    // waits. At 200 s b has ended and the replay ends with this sample.
    assert_eq!(got, vec![(0.0, 0.75, 1, 0.25), (100.0, 0.75, 0, 0.0), (200.0, 0.0, 0, 0.0)]);
    // The run's fragmentation is the mean over samples with jobs waiting: the one at 0 s.
    assert!((r.fragmentation - 0.25).abs() < 1e-9, "{}", r.fragmentation);
}

/// A job no node could ever hold (one task of 8 GPUs on a node of 4) is no measure of fragmentation: the free GPUs
/// are counted against the smallest waiting task a node could hold, and only samples where such a task waits count
/// (the job alone made the node's free GPUs all stranded: 75% here, 100% on an idle cluster). The table reads "n/a"
/// for averages over completed jobs when none completed.
#[test]
fn a_job_that_never_fits_is_no_measure_of_fragmentation() {
    let trace = |rows: &str| {
        let body = format!("id,submit_s,duration_s,gpus,tenant,tasks\n{rows}");
        read_trace_from(body.as_bytes(), "t.csv", ReadOptions::default()).unwrap()
    };
    let mut c = cfg(Policy::Fifo);
    c.samples = 1;
    let r = jcts_by_id(&trace("a,0,100,2,t,1\nnf,0,100,8,t,1\n"), &one_node(4), &c);
    assert_eq!((r.completed, r.never_fit), (1, 1));
    assert_eq!(r.fragmentation, 0.0);
    // Beside it, a job of 4 GPUs waits at 0 s while a holds 2 of the 4: those 2 are stranded; at 100 s and 200 s
    // only the job that never fits waits, and those samples do not count.
    let r = jcts_by_id(&trace("a,0,100,2,t,1\nw,0,100,4,t,1\nnf,0,100,8,t,1\n"), &one_node(4), &c);
    let waiting: Vec<(f64, usize, f64)> = r.series.iter().map(|s| (s.t_s, s.queued, s.fragmentation)).collect();
    assert_eq!(waiting, vec![(0.0, 2, 0.5), (100.0, 1, 0.0), (200.0, 1, 0.0)]);
    assert_eq!(r.fragmentation, 0.5);
    // A job split into tasks of a node's size that still never fits (64 GPUs on one node of 4) is no measure either.
    let r = jcts_by_id(&trace("a,0,100,2,t,\nwide,0,100,64,t,\n"), &one_node(4), &c);
    assert_eq!((r.never_fit, r.fragmentation), (1, 0.0));
}

/// The run's fragmentation weighs each sample by the time it stands for: as a long run thins its samples and doubles
/// their step, late samples stand for more (an average over samples taken counted the first hours most). One node
/// of 4 GPUs: x (2 GPUs) for 192,000 s and y (1 GPU) for 10^7 s hold it while w (4 GPUs) waits: 1 GPU stranded (0.25)
/// until x ends, then 3 (0.75) — 0.7404 over the time w waits.
#[test]
fn fragmentation_is_weighed_by_the_time_each_sample_stands_for() {
    let mut rows = "x,0,192000,2,t\ny,0,10000000,1,t\n".to_string();
    for k in 0..10 {
        rows += &format!("k{k},0,1,1,t\n");
    }
    rows += "w,0,100,4,t\n";
    let r = jcts_by_id(&csv(&rows), &one_node(4), &cfg(Policy::Fifo));
    let expected = (0.25 * 192_000.0 + 0.75 * (10_000_000.0 - 192_000.0)) / 10_000_000.0;
    assert!((r.fragmentation - expected).abs() < 0.01, "{} against {expected}", r.fragmentation);
}

/// `preemption = false`: the newcomer 50 times shorter waits for the long job instead of evicting it.
#[test]
fn knob_preemption_off_evicts_nothing() {
    let t = "a,0,1000,1,t\nb,10,20,1,t\n";
    let r = run_knobbed(t, Policy::Srtf, 1, "preemptive = true\n");
    assert_eq!((r.preemptions, r.jcts), (1, vec![20.0, 1020.0]));
    let r = run_knobbed(t, Policy::Srtf, 1, "preemptive = true\npreemption = false\n");
    assert_eq!((r.preemptions, r.jcts), (0, vec![1000.0, 1010.0]));
}

/// `fairshare_half_life` on 1 GPU, two tenants of equal weight: A's a1 runs 0–1000 (1,000 GPU-s), B's b1 1000–1300
/// (300 GPU-s); a2 (100 s) and b2 (200 s) arrive at 1,100 and are ordered at 1,300 by decayed usage. With a day's
/// half-life A has used more: b2 runs first (1300–1500, JCT 400; a2 1500–1600, JCT 500). With a minute's, A's
/// usage, 300 s older, has halved five more times than B's: a2 first (1300–1400, JCT 300; b2 JCT 500).
#[test]
fn knob_fairshare_half_life_decides_whose_old_usage_still_counts() {
    let t = "a1,0,1000,1,A\nb1,0,300,1,B\na2,1100,100,1,A\nb2,1100,200,1,B\n";
    let r = run_knobbed(t, Policy::FairShare, 1, "fairshare_half_life = \"1d\"\n");
    assert_eq!(r.jcts, vec![400.0, 500.0, 1000.0, 1300.0]);
    let r = run_knobbed(t, Policy::FairShare, 1, "fairshare_half_life = \"1m\"\n");
    assert_eq!(r.jcts, vec![300.0, 500.0, 1000.0, 1300.0]);
}

/// The table's `policy` is the replay's over the configuration it is applied to (here FIFO's); `gpunet sim` without
/// `--policy` takes it as named (`sim_cmd::named_config`, `sim_cli.rs`).
#[test]
fn knob_policy_from_the_file_orders_the_queue() {
    // One GPU: a runs 0–100; at 100, b (50 s, submitted at 10) and c (10 s, at 20) wait. FIFO runs b first, SJF c.
    let (cluster, c) = knobbed(Policy::Fifo, 1, "policy = \"sjf\"\n");
    assert_eq!(c.sched.policy, Policy::Sjf);
    assert_eq!(jcts_by_id(&csv(THREE_JOBS), &cluster, &c).jcts, vec![90.0, 100.0, 150.0]);
    assert_eq!(run_knobbed(THREE_JOBS, Policy::Fifo, 1, "").jcts, vec![100.0, 140.0, 140.0]);
}

#[test]
fn a_bad_scheduler_table_names_the_field() {
    let bad = |knobs: &str| {
        ClusterSpec::from_toml(
            &format!("[[node_group]]\ncount = 1\ngpus_per_node = 1\ngpu_model = \"T4\"\n[scheduler]\n{knobs}"),
            "bad",
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad("min_run = 5\n").contains("min_run"));
    assert!(bad("las_thresholds_gpu_s = [5, 5]\n").contains("las_thresholds_gpu_s"));
    assert!(bad("tick = \"0s\"\n").contains("tick"));
    assert!(bad("tick = \"2h\"\n").contains("invalid tick"));
    // A stop time past a day replayed for ever while its victims stopped (the flag was bounded, the file not).
    assert!(bad("stop_time = \"100000d\"\n").contains("invalid stop_time"));
    assert!(bad("backfill_depth = 1000001\n").contains("invalid backfill_depth"));
    // Preemptive SJF at a ratio of 1: two jobs of one estimate evicted each other for ever.
    let e = bad("policy = \"sjf\"\npreemptive = true\nshorter_ratio = 1\n");
    assert!(e.contains("shorter_ratio") && e.contains("at least 2"), "{e}");
}

fn synthetic(n: usize, seed: u64) -> Trace {
    let mut r = rng::Rng::new(seed);
    let mut body = String::new();
    let mut t = 0.0;
    for i in 0..n {
        t += r.exp(30.0);
        let gpus = [1, 1, 1, 2, 4, 8][r.below(6) as usize];
        let dur = 10.0 + r.exp(600.0);
        body += &format!("j{i},{t:.3},{dur:.3},{gpus},team-{}\n", r.below(3));
    }
    csv(&body)
}

fn spec4x8() -> ClusterSpec {
    ClusterSpec::from_toml(
        "version = 1\n[[node_group]]\ncount = 3\ngpus_per_node = 8\ngpu_model = \"T4\"\nprice_per_gpu_hour = 1.0\n\
         [[node_group]]\ncount = 1\ngpus_per_node = 8\ngpu_model = \"T4\"\nlifecycle = \"spot\"\nprice_per_gpu_hour = 0.3\n",
        "spec",
    )
    .unwrap()
}

#[test]
fn every_job_completes_once_and_gpu_time_is_conserved() {
    let trace = synthetic(300, 7);
    let demand: f64 = trace.jobs.iter().map(|j| j.duration_s * j.gpus as f64).sum::<f64>() / 3600.0;
    for policy in Policy::ALL {
        for (backfill, preemptive) in [(false, false), (true, false), (true, true)] {
            let mut c = cfg(policy);
            c.sched.backfill = backfill;
            c.sched.preemption.shorter_first = preemptive;
            let r = simulate(&trace, &spec4x8(), &c, &mut |_, _| {}).unwrap();
            assert_eq!(r.completed + r.failed + r.unfinished, r.jobs, "{policy}");
            assert_eq!((r.completed, r.unfinished), (300, 0), "{policy}: every job completes exactly once");
            assert!(r.utilization <= 1.0 + 1e-9 && r.series.iter().all(|s| s.utilization <= 1.0 + 1e-9));
            // Allocated GPU-time = useful work + work lost to evictions (all GPUs are the same model).
            let expect = demand + r.lost_gpu_hours;
            assert!(
                (r.gpu_hours_used - expect).abs() < 1e-3 * expect,
                "{policy}: used {} vs {}",
                r.gpu_hours_used,
                expect
            );
        }
    }
}

#[test]
fn failures_and_spot_reclaims_are_survived_and_conserve_work() {
    let trace = synthetic(200, 11);
    let demand: f64 = trace.jobs.iter().map(|j| j.duration_s * j.gpus as f64).sum::<f64>() / 3600.0;
    let c = SimConfig {
        mtbf: Some(Dur::from_hours(2)),
        mttr: Dur::from_mins(10),
        spot_reclaims_per_hour: Some(1.0),
        max_restarts: 100,
        ..cfg(Policy::Fifo)
    };
    let mut tolerant = trace.clone();
    for j in &mut tolerant.jobs {
        j.preemptible = true;
    }
    let r = simulate(&tolerant, &spec4x8(), &c, &mut |_, _| {}).unwrap();
    assert_eq!(r.completed + r.failed, 200);
    assert!(r.node_losses > 0, "failures happened: {r:?}");
    assert_eq!(r.restarts, 0, "a lost node is not the job's own failure");
    let expect = demand + r.lost_gpu_hours;
    assert!((r.gpu_hours_used - expect).abs() < 1e-3 * expect, "used {} vs {}", r.gpu_hours_used, expect);
    assert!(r.cost > 0.0 && r.cost_on_demand > 0.0);
}

#[test]
fn philly_vc_islands_queue_more_than_a_borrowing_pool() {
    let trace = read_trace(&data("philly/philly_pollux.csv.gz"), ReadOptions::default()).unwrap();
    let cluster = ClusterSpec::load("philly").unwrap();
    let base = SimConfig { quotas: QuotaMode::PhillyVc, max_jobs: Some(20_000), ..SimConfig::default() };
    let islands = simulate(&trace, &cluster, &base, &mut |_, _| {}).unwrap();
    let pooled = simulate(&trace, &cluster, &SimConfig { borrowing: true, ..base.clone() }, &mut |_, _| {}).unwrap();
    assert_eq!(islands.completed, 20_000);
    assert!(islands.avg_queue_s > pooled.avg_queue_s, "{} vs {}", islands.avg_queue_s, pooled.avg_queue_s);
}

#[test]
fn readers_parse_every_shipped_trace() {
    let read = |p: &str| read_trace(&data(p), ReadOptions::default()).unwrap();
    let philly = read("philly/philly_pollux.csv.gz");
    assert_eq!((philly.format, philly.jobs.len()), (TraceFormat::Philly, 82_247));
    assert_eq!(philly.jobs.iter().map(|j| j.tenant.as_str()).collect::<std::collections::BTreeSet<_>>().len(), 15);
    assert_eq!(philly.jobs.iter().filter(|j| j.gpus == 128).count(), 3);
    let pai = read("pai2023/openb_pod_list_default.csv.gz");
    assert_eq!(pai.format, TraceFormat::Pai2023);
    assert_eq!((pai.jobs.len(), pai.skipped_never_ran), (8152 - 897, 897));
    assert!(pai.jobs.iter().any(|j| j.censored), "pods still running at the trace end are flagged");
    assert!(pai.jobs.iter().any(|j| j.gpus == 0) && pai.jobs.iter().any(|j| j.gpus == 8));
    let tiresias = read("tiresias/60_job.csv");
    assert_eq!((tiresias.format, tiresias.jobs.len()), (TraceFormat::Tiresias, 60));
    for w in [
        "pollux/workloads/workload-6.csv",
        "sia/philly/workload-1.csv",
        "sia/saturn/workload-1.csv",
        "sia/newtrace/workload-1.csv",
    ] {
        let t = read(w);
        assert_eq!(t.format, TraceFormat::Pollux, "{w}");
        assert!(t.jobs.len() >= 160 && t.jobs.iter().all(|j| j.duration_s > 0.0), "{w}");
    }
    let own = read("examples/tiny.csv");
    assert_eq!((own.format, own.jobs.len()), (TraceFormat::Gpunet, 6));
}

#[test]
fn every_shipped_trace_runs_on_its_preset() {
    for (trace, cluster, jobs) in [
        ("tiresias/60_job.csv", "tiresias-n32g4", 60),
        ("pollux/workloads/workload-6.csv", "pollux", 160),
        ("pai2023/openb_pod_list_default.csv.gz", "pai2023", 1000),
    ] {
        let t = read_trace(&data(trace), ReadOptions::default()).unwrap();
        let c = SimConfig { max_jobs: Some(jobs), check_invariants: jobs <= 160, ..SimConfig::default() };
        let r = simulate(&t, &ClusterSpec::load(cluster).unwrap(), &c, &mut |_, _| {}).unwrap();
        assert_eq!(r.completed + r.unfinished + r.failed, jobs, "{trace}");
        assert!(r.completed > 0 && r.avg_jct_s > 0.0, "{trace}");
    }
}

#[test]
fn estimates_modes_change_sjf_but_not_fifo() {
    let trace = synthetic(200, 3);
    let cluster = one_node(8);
    let run =
        |p, e| simulate(&trace, &cluster, &SimConfig { estimates: e, ..cfg(p) }, &mut |_, _| {}).unwrap().avg_jct_s;
    let fifo = run(Policy::Fifo, EstimateMode::Oracle);
    assert_eq!(fifo, run(Policy::Fifo, EstimateMode::Noisy { sigma: 1.0 }));
    let oracle = run(Policy::Sjf, EstimateMode::Oracle);
    let noisy = run(Policy::Sjf, EstimateMode::Noisy { sigma: 2.0 });
    let history = run(Policy::Sjf, EstimateMode::History);
    assert!(oracle < fifo, "SJF with true estimates beats FIFO: {oracle} vs {fifo}");
    assert!(noisy != oracle && history != oracle);
    assert!("noisy:x".parse::<EstimateMode>().is_err() && "noisy:0.5".parse::<EstimateMode>().is_ok());
}

/// A burst of 40 one-hour 8-GPU jobs, ten seconds apart, and a cluster of one on-demand node and one spot node (the
/// autoscaler's template).
fn burst_on_one_node_and_a_spot_group() -> (Trace, ClusterSpec) {
    let mut body = String::new();
    for i in 0..40 {
        body += &format!("j{i},{},3600,8,t\n", i * 10);
    }
    let trace = csv(&body);
    let cluster = ClusterSpec::from_toml(
        "[[node_group]]\ncount = 1\ngpus_per_node = 8\ngpu_model = \"A100-80GB\"\n\
         [[node_group]]\ncount = 1\ngpus_per_node = 8\ngpu_model = \"A100-80GB\"\nlifecycle = \"spot\"\n",
        "auto",
    )
    .unwrap();
    (trace, cluster)
}

#[test]
fn the_autoscaler_grows_the_spot_pool_under_load_and_releases_it_when_idle() {
    // A burst of 40 one-hour 8-GPU jobs onto 1 on-demand node, then nothing.
    let (trace, cluster) = burst_on_one_node_and_a_spot_group();
    let template = cluster.build_nodes().into_iter().find(|n| n.lifecycle() == gpunet_core::Lifecycle::Spot).unwrap();
    let auto = engine::AutoscaleSim {
        cfg: gpunet_core::autoscale::AutoscaleConfig { max_nodes: 20, ..Default::default() },
        template,
        interval: Dur::from_secs(60),
        boot: Dur::from_secs(120),
    };
    let base = SimConfig { check_invariants: true, ..cfg(Policy::Fifo) };
    let fixed = simulate(&trace, &cluster, &base, &mut |_, _| {}).unwrap();
    let scaled = simulate(&trace, &cluster, &SimConfig { autoscale: Some(auto), ..base }, &mut |_, _| {}).unwrap();
    assert_eq!(fixed.completed, 40);
    assert_eq!(scaled.completed, 40);
    assert!(scaled.scaled_out_nodes > 0 && scaled.scaled_in_nodes > 0, "{scaled:?}");
    assert!(scaled.avg_jct_s < fixed.avg_jct_s / 2.0, "{} vs {}", scaled.avg_jct_s, fixed.avg_jct_s);
}

/// New nodes take work only once booted (live: the provider's machine starts and its agent registers): the same
/// burst waits longer behind a slow boot, and the autoscaler does not add nodes for demand that booting ones cover.
#[test]
fn autoscaled_nodes_take_work_only_after_their_boot_time() {
    let (trace, cluster) = burst_on_one_node_and_a_spot_group();
    let template = cluster.build_nodes().into_iter().find(|n| n.lifecycle() == gpunet_core::Lifecycle::Spot).unwrap();
    let run = |boot: Dur| {
        let auto = engine::AutoscaleSim {
            cfg: gpunet_core::autoscale::AutoscaleConfig { max_nodes: 20, ..Default::default() },
            template: template.clone(),
            interval: Dur::from_secs(60),
            boot,
        };
        let c = SimConfig { check_invariants: true, autoscale: Some(auto), ..cfg(Policy::Fifo) };
        simulate(&trace, &cluster, &c, &mut |_, _| {}).unwrap()
    };
    let instant = run(Dur::ZERO);
    let slow = run(Dur::from_mins(30));
    assert_eq!((instant.completed, slow.completed), (40, 40));
    // Every job that ran on a new node waited at least its boot: half an hour more on average, give or take the
    // jobs the first nodes held.
    assert!(slow.avg_wait_s > instant.avg_wait_s + 900.0, "{} vs {}", slow.avg_wait_s, instant.avg_wait_s);
    // Booting nodes count as capacity: no more nodes are asked for while they boot than without a boot.
    assert!(
        slow.scaled_out_nodes <= instant.scaled_out_nodes + 2,
        "{} vs {}",
        slow.scaled_out_nodes,
        instant.scaled_out_nodes
    );
}

/// The simulator priced only GPUs, with its own arithmetic. A cluster's `[prices]` table (the server's catalogue
/// schema) prices GPUs by model and lifecycle, CPU and memory, billed per started second by the server's function;
/// a node group's `price_per_gpu_hour` still overrides the GPU price.
#[test]
fn a_cluster_s_prices_table_bills_gpu_cpu_and_memory_per_started_second() {
    let spec = |extra: &str| {
        format!(
            "version = 1\n[[node_group]]\ncount = 1\ngpus_per_node = 2\ngpu_model = \"T4\"\nlifecycle = \"reserved\"\n\
             {extra}\n[prices]\ncurrency = \"CHF\"\ncpu_core_hour = 0.36\nmem_gib_hour = 0.036\n\
             [prices.gpu.default]\non_demand = 1.0\n[prices.gpu.T4]\non_demand = 7.2\nreserved = 3.6\n"
        )
    };
    let cluster = ClusterSpec::from_toml(&spec(""), "priced").unwrap();
    assert_eq!(cluster.build_nodes()[0].price_per_gpu_hour, 3.6, "the catalogue's reserved T4 price");
    // 2 GPUs with the default 1 core and 4 GiB each, 99.5 s billed as 100 s.
    let r = simulate(&csv("j1,0,99.5,2,a\n"), &cluster, &cfg(Policy::Fifo), &mut |_, _| {}).unwrap();
    let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(near(r.cost_gpu, 2.0 * 3.6 * 100.0 / 3600.0), "{r:?}");
    assert!(near(r.cost_cpu, 2.0 * 0.36 * 100.0 / 3600.0) && near(r.cost_mem, 8.0 * 0.036 * 100.0 / 3600.0), "{r:?}");
    assert!(near(r.cost, r.cost_gpu + r.cost_cpu + r.cost_mem) && near(r.cost_on_demand, r.cost) && r.cost_spot == 0.0);
    assert_eq!(r.currency, "CHF");
    let own = ClusterSpec::from_toml(&spec("price_per_gpu_hour = 0.5"), "own").unwrap();
    assert_eq!(own.build_nodes()[0].price_per_gpu_hour, 0.5, "a group's own price wins");
    let e = ClusterSpec::from_toml(&spec("").replace("cpu_core_hour = 0.36", "cpu_core_hour = -1"), "bad").unwrap_err();
    assert!(e.to_string().contains("prices.cpu_core_hour"), "{e}");
    // Without a table, the shipped catalogue prices the nodes.
    assert_eq!(
        one_node(1).build_nodes()[0].price_per_gpu_hour,
        gpunet_core::PriceCatalogue::shipped().gpu_hour(gpunet_core::GpuModel::T4, gpunet_core::Lifecycle::OnDemand)
    );
}

#[test]
fn a_trace_with_dependencies_starts_each_dependent_after_its_dependency_ends() {
    let read = |body: &str| {
        read_trace_from(
            format!("id,submit_s,duration_s,gpus,tenant,dependency\n{body}").as_bytes(),
            "deps.csv",
            ReadOptions::default(),
        )
        .unwrap()
    };
    // Room for all three at once; b waits for a (100 s), c for a and b ("afterany" of both), d never runs.
    let with =
        read("a,0,100,1,t,\nb,0,10,1,t,afterok:a\nc,0,10,1,t,\"afterok:a,afterany:b\"\nd,0,10,1,t,afternotok:a\n");
    let without = read("a,0,100,1,t,\nb,0,10,1,t,\nc,0,10,1,t,\nd,0,10,1,t,\n");
    assert_eq!(with.jobs[2].dependency.len(), 2);
    let r = jcts_by_id(&with, &one_node(4), &cfg(Policy::Fifo));
    let base = jcts_by_id(&without, &one_node(4), &cfg(Policy::Fifo));
    assert_eq!((base.completed, base.avg_jct_s), (4, (100.0 + 10.0 * 3.0) / 4.0));
    // a: 100; b: 100 + 10; c: after b, 110 + 10; d failed (a succeeded): not completed.
    assert_eq!((r.completed, r.failed), (3, 1), "{r:?}");
    assert!((r.avg_jct_s - (100.0 + 110.0 + 120.0) / 3.0).abs() < 1e-6, "{}", r.avg_jct_s);
    // A dependency on a later or unknown row is an error naming the file and line; on an earlier row submitted
    // later, the replay's error names the job.
    let body = "id,submit_s,duration_s,gpus,tenant,dependency\na,0,10,1,t,afterok:b\nb,5,10,1,t,\n";
    let e = read_trace_from(body.as_bytes(), "deps.csv", ReadOptions::default()).unwrap_err().to_string();
    assert_eq!(e, "read deps.csv:2: dependency names \"b\", the id of no earlier row");
    let bad = read("b,5,10,1,t,\na,0,10,1,t,afterok:b\n");
    let e = simulate(&bad, &one_node(4), &cfg(Policy::Fifo), &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("job \"a\": dependency afterok:b names no job submitted before it"), "{e}");
    let e = read_trace_from(
        "id,submit_s,duration_s,gpus,tenant,dependency\na,0,1,1,t,afterfoo:b\n".as_bytes(),
        "deps.csv",
        ReadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("invalid dependency \"afterfoo:b\""), "{e}");
}

/// Preemptive SRTF with learned estimates never ended on the Pollux workloads (found replaying them for the choice
/// of a default policy): a job evicted after running past its too-short learned estimate, before any checkpoint,
/// was queued again as short as it started, evicted the job that had evicted it, and so on, each stint shorter than
/// the 30-minute checkpoint interval (the first 14 jobs of workload 1 already looped). Now an evicted job ranks from
/// how far it is known to run (`Job::known`), and the replay ends with every job done. It runs in a thread so that
/// a regression fails the test instead of hanging it.
#[test]
fn preemptive_srtf_with_learned_estimates_finishes_every_pollux_job() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = read_trace(&data("pollux/workloads/workload-1.csv"), ReadOptions::default()).unwrap();
        let mut sched = SchedConfig { backfill: true, ..SchedConfig::with_policy(Policy::Srtf) };
        sched.preemption.shorter_first = true;
        let c = SimConfig { sched, estimates: EstimateMode::History, check_invariants: true, ..SimConfig::default() };
        let r = simulate(&t, &ClusterSpec::load("pollux").unwrap(), &c, &mut |_, _| {});
        let _ = tx.send(r);
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the replay ends").unwrap();
    assert_eq!((r.completed, r.failed, r.unfinished), (160, 0, 0));
    assert!(r.preemptions > 0, "it preempts");
    assert!(r.eviction_lost_fraction < 0.2, "{}", r.eviction_lost_fraction);
}

/// `gpu_counting`, by hand: two nodes of 4 GPUs. A and B (3 GPUs each) start at 0 on one node each, leaving one GPU
/// free on each; C (2 GPUs) arrives at 10. On nodes C needs two free GPUs on one node: it waits for A's end at 100
/// (JCT 140). Counting GPUs, C becomes two one-GPU tasks, one on each node's free GPU: it starts at once (JCT 50).
#[test]
fn gpu_counting_places_a_job_on_gpus_of_several_nodes() {
    let cluster = ClusterSpec::from_toml(
        "version = 1\n[[node_group]]\ncount = 2\ngpus_per_node = 4\ngpu_model = \"T4\"\n",
        "two",
    )
    .unwrap();
    let trace = csv("a,0,100,3,t\nb,0,100,3,t\nc,10,50,2,t\n");
    let r = jcts_by_id(&trace, &cluster, &cfg(Policy::Fifo));
    assert_eq!((r.jcts.clone(), r.gpu_counting), (vec![100.0, 100.0, 140.0], false));
    let r = jcts_by_id(&trace, &cluster, &SimConfig { gpu_counting: true, ..cfg(Policy::Fifo) });
    assert_eq!((r.jcts.clone(), r.gpu_counting), (vec![50.0, 100.0, 100.0], true));
    assert_eq!(r.avg_wait_s, 0.0);
}

/// Passes are counted by cause. Fair share (whose order moves with time: every tick makes a pass), ticks every
/// 10 s, one 1-GPU node; a (31 s) at t=0, b (10 s) at t=1. Passes at 0 (a starts), 1 (b waits), the ticks at 11
/// and 21 (b still waits), 31 (the tick and a's end together: b starts) and 41 (b ends): 6 passes, 2 for a tick
/// alone, 4 deciding nothing (both ticks' among them). Under LAS (one threshold at 3,600 GPU-s) the pass at 1 finds
/// that nothing turns before a reaches 3,600 GPU-s (`PassStats::idle_until`), so the ticks at 11 and 21 make no
/// pass: 4 passes, 2 skipped, the JCTs unchanged.
#[test]
fn passes_for_a_tick_alone_and_passes_that_decide_nothing_are_counted() {
    let trace = csv("a,0,31,1,t\nb,1,10,1,t\n");
    let r = jcts_by_id(&trace, &one_node(1), &cfg(Policy::FairShare));
    assert_eq!(r.jcts, vec![31.0, 40.0]);
    let counts = |r: &SimResult| (r.passes, r.tick_passes, r.idle_passes, r.idle_tick_passes, r.skipped_passes);
    assert_eq!(counts(&r), (6, 2, 4, 2, 0));
    let mut c = cfg(Policy::Las);
    c.sched.las_thresholds_gpu_s = vec![3600];
    let r = jcts_by_id(&trace, &one_node(1), &c);
    assert_eq!(r.jcts, vec![31.0, 40.0]);
    assert_eq!(counts(&r), (4, 0, 2, 0, 2));
    // FIFO needs no tick: the same trace makes passes at 0, 1, 31 and 41 only.
    let r = jcts_by_id(&trace, &one_node(1), &cfg(Policy::Fifo));
    assert_eq!(counts(&r), (4, 0, 2, 0, 0));
}

/// A tick that comes once time has turned what the last idle pass met makes its pass: LAS with one threshold at 15
/// GPU-s, ticks every 10 s, checkpoints every 10 s, one 1-GPU node; a (40 s) at t=0, b (10 s) at t=1. The pass at
/// 1 holds until a has 15 GPU-s (t=15): the tick at 11 makes no pass, the one at 21 does and evicts a (demoted at
/// 15; its checkpoint at 20 keeps 20 s); b runs 21–31, a 31–51. JCTs (sorted): b 30, a 51.
#[test]
fn a_tick_after_the_idle_bound_makes_its_pass() {
    let trace = csv("a,0,40,1,t\nb,1,10,1,t\n");
    let mut c = cfg(Policy::Las);
    c.sched.las_thresholds_gpu_s = vec![15];
    let r = jcts_by_id(&trace, &one_node(1), &c);
    assert_eq!(r.jcts, vec![30.0, 51.0]);
    assert_eq!((r.preemptions, r.skipped_passes), (1, 1));
}
