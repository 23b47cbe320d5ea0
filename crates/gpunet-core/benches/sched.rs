//! `cargo bench` benches for the scheduler's hot paths: a full pass over a large queue, one event (completion +
//! pass), placement of a single task and of a gang, explain-pending.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use gpunet_core::*;

fn cluster(nodes: u32, policy: Policy, backfill: bool) -> ClusterState {
    let cfg = SchedConfig { backfill, ..SchedConfig::with_policy(policy) };
    let mut s = ClusterState::new(cfg).unwrap();
    let models = [GpuModel::A100_80GB, GpuModel::H100_80GB, GpuModel::V100_32GB];
    for i in 0..nodes {
        let rack = i / 16;
        let spec =
            NodeSpec::with_gpus(format!("n{i}"), models[(rack % 3) as usize], 8, MilliCpu::cores(128), MiB::gib(1024))
                .label("zone", &format!("z{}", rack % 4))
                .label("rack", &format!("r{rack}"));
        s.add_node(spec).unwrap();
    }
    for t in 0..20 {
        s.add_tenant(TenantSpec::new(format!("t{t}"))).unwrap();
    }
    s
}

fn fill(s: &mut ClusterState, jobs: u64) {
    for i in 0..jobs {
        let gpus = match i % 100 {
            0..=92 => 1,
            93..=95 => 2,
            96..=97 => 4,
            _ => 8,
        };
        let spec =
            JobSpec::new(TenantId((i % 20) as u32), "b", gpus, 1).estimate(Dur::from_secs(60 + (i * 7919) % 86_400));
        s.submit(JobId(i + 1), spec, Time(i)).unwrap();
    }
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("sched");
    g.sample_size(20);
    for policy in [Policy::Fifo, Policy::Drf, Policy::Las] {
        let mut s = cluster(1_000, policy, false);
        fill(&mut s, 10_000);
        g.bench_function(format!("full_pass_1k_nodes_10k_jobs_{policy}"), |b| {
            b.iter(|| schedule(&s, Time::from_secs(1)))
        });
    }
    // One event on a full cluster: a completion, a pass, applying its decisions.
    let mut s = cluster(1_000, Policy::Fifo, true);
    fill(&mut s, 20_000);
    s.step(Time::from_secs(1)).unwrap();
    g.bench_function("event_completion_then_pass_backfill", |b| {
        b.iter_batched(
            || s.clone(),
            |mut st| {
                let victim = st.running_ends().next().map(|(_, j)| j).unwrap();
                st.finish(victim, Time::from_secs(2), true).unwrap();
                let ds = st.step(Time::from_secs(2)).unwrap();
                (st, ds) // dropped outside the timing
            },
            BatchSize::LargeInput,
        )
    });
    let empty = cluster(1_000, Policy::Fifo, false);
    let one = JobSpec::new(TenantId(0), "one", 1, 1);
    g.bench_function("dry_run_placement_single_gpu_task_incl_pool_copy", |b| {
        b.iter(|| dry_run_placement(&empty, &one))
    });
    let mut gang = JobSpec::new(TenantId(0), "gang", 8, 8);
    gang.topology = TopologyScope::Zone;
    g.bench_function("dry_run_placement_64_gpu_gang_incl_pool_copy", |b| b.iter(|| dry_run_placement(&empty, &gang)));
    let pending = s.jobs().filter(|j| j.state == JobState::Pending).map(|j| j.id).max().unwrap();
    g.bench_function("explain_pending_last_job", |b| b.iter(|| explain(&s, pending, Time::from_secs(2)).unwrap()));
    g.finish();
}

criterion_group!(sched, benches);
criterion_main!(sched);
