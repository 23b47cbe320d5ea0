//! The autoscaler decision: a pure function over a sliding window of demand samples (GPUs wanted: held plus
//! queued), run by both drivers — the server for each node pool (`gpunet-server`'s `owner/pools.rs`) and the
//! simulator for its spot pool.
//!
//! The forecast is a weighted moving average of the window with decay 0.5 per step: the newest sample has weight 1,
//! the one before 0.5, then 0.25, …, normalised by the sum of the weights. The load is the forecast ÷ the capacity
//! (infinite when there is demand and no capacity). Above `high` the pool grows to bring the load to `target`;
//! below `low` idle nodes are released; never outside `[min_nodes, max_nodes]`, at most `max_step` nodes per action,
//! and no action within `cooldown` of the previous one.

use crate::ids::NodeId;
use crate::units::{Dur, Time};
use serde::{Deserialize, Serialize};

/// Autoscaler settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleConfig {
    /// Samples kept in the window (5 by default).
    pub window: usize,
    /// Scale out above this load.
    pub high: f64,
    /// Scale in below this load.
    pub low: f64,
    /// Load aimed at after an action.
    pub target: f64,
    /// Fewest spot nodes.
    pub min_nodes: u32,
    /// Most spot nodes.
    pub max_nodes: u32,
    /// Most nodes added or removed in one action.
    pub max_step: u32,
    /// Quiet time after an action.
    pub cooldown: Dur,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            window: 5,
            high: 0.85,
            low: 0.4,
            target: 0.7,
            min_nodes: 0,
            max_nodes: 100,
            max_step: 10,
            cooldown: Dur::from_mins(5),
        }
    }
}

/// What the autoscaler decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScaleDecision {
    /// Add this many nodes.
    Out {
        /// Nodes to add.
        nodes: u32,
        /// The load that triggered it (forecast ÷ capacity; infinite with no capacity).
        load: f64,
        /// The forecast demand in GPUs (the window's weighted moving average).
        forecast_gpus: f64,
    },
    /// Release these idle nodes.
    In {
        /// Nodes to release.
        nodes: Vec<NodeId>,
        /// The load that triggered it.
        load: f64,
        /// The forecast demand in GPUs.
        forecast_gpus: f64,
    },
    /// Do nothing.
    Hold {
        /// Why.
        reason: String,
    },
}

/// The weighted moving average of a window (oldest first), decay 0.5 per step; `None` when empty.
pub fn weighted_load(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut num = 0.0;
    let mut den = 0.0;
    let mut w = 1.0;
    for s in samples.iter().rev() {
        num += w * s;
        den += w;
        w *= 0.5;
    }
    Some(num / den)
}

/// Inputs of one decision.
#[derive(Debug, Clone)]
pub struct AutoscaleInput<'a> {
    /// Demand samples in GPUs (held plus queued, of the jobs that may use the pool), oldest first; only the last
    /// `window` count.
    pub samples: &'a [f64],
    /// GPUs of the capacity the demand is measured against now (the pool's nodes, booting ones included; the
    /// simulator: every schedulable node).
    pub capacity_gpus: u64,
    /// GPUs of one spot node.
    pub gpus_per_spot_node: u32,
    /// Spot nodes in the pool now.
    pub spot_nodes: u32,
    /// Idle spot nodes (no tasks), in the order they should be released.
    pub idle_spot: &'a [NodeId],
    /// Time of the last action, if any.
    pub last_action: Option<Time>,
    /// Now.
    pub now: Time,
}

/// One demand sample of a pool whose nodes look like `template`: the GPUs held on the pool's nodes `pool` plus the
/// GPUs of the queued jobs that could run on such a node (its labels, taints and GPU model; a task no larger than
/// the node) and that their tenants' quotas would let start (a job over its tenant's GPU limit waits for the tenant,
/// not for nodes). [`pool_demands`] for one pool.
pub fn pool_demand(st: &crate::ClusterState, template: &crate::NodeSpec, pool: &[NodeId]) -> u64 {
    pool_demands(st, &[PoolShape { template, nodes: pool, max_gpus: u64::MAX, price_per_gpu_hour: 0.0 }])[0]
}

/// A pool as the demand split sees it.
#[derive(Debug, Clone, Copy)]
pub struct PoolShape<'a> {
    /// What its nodes look like.
    pub template: &'a crate::NodeSpec,
    /// Its nodes now.
    pub nodes: &'a [NodeId],
    /// Its GPUs at its largest.
    pub max_gpus: u64,
    /// What a GPU-hour on it costs.
    pub price_per_gpu_hour: f64,
}

/// One demand sample of each pool (what the server samples for its pools, `owner/pools.rs`): the GPUs held on the
/// pool's nodes plus the GPUs of the queued jobs counted for it. Each queued job that could run on a pool's node
/// (labels, taints, GPU model; a task no larger than the node) and that its tenant's quota lets start is counted
/// in **one** pool — so that two pools able to run it do not both grow for it: a job that prefers spot goes to a
/// spot pool first, then to the cheapest pool per GPU-hour (the first configured on a tie) with room left at its
/// largest, else to the cheapest pool that could hold it; the oldest jobs are counted first.
pub fn pool_demands(st: &crate::ClusterState, pools: &[PoolShape<'_>]) -> Vec<u64> {
    let held: Vec<u64> = pools
        .iter()
        .map(|p| {
            p.nodes
                .iter()
                .filter_map(|id| st.node(*id))
                .flat_map(|n| n.jobs.iter().filter_map(|j| st.job(*j)?.run.as_ref()).map(move |r| (n.id, r)))
                .flat_map(|(id, r)| r.placement.tasks.iter().filter(move |t| t.node == id))
                .map(|t| t.gpu_mask.count_ones() as u64)
                .sum()
        })
        .collect();
    let mut counted = vec![0u64; pools.len()];
    // Pools by price, then by their order.
    let mut by_price: Vec<usize> = (0..pools.len()).collect();
    by_price.sort_by(|a, b| pools[*a].price_per_gpu_hour.total_cmp(&pools[*b].price_per_gpu_hour).then(a.cmp(b)));
    let mut room: std::collections::HashMap<crate::TenantId, Option<u64>> = std::collections::HashMap::new();
    // Oldest first (the order the queue is in; the job table has none).
    let mut waiting: Vec<&crate::Job> = st.waiting_jobs().collect();
    waiting.sort_unstable_by_key(|j| j.id);
    for j in waiting {
        let t = &j.spec.task;
        let fits = |p: &PoolShape<'_>| {
            let per_node = p.template.gpus.len() as u32;
            t.gpus > 0
                && t.gpus <= per_node
                && t.cpu <= p.template.cpu
                && t.mem <= p.template.mem
                && j.spec.node_eligible(p.template)
        };
        let mut eligible: Vec<usize> = by_price.iter().copied().filter(|i| fits(&pools[*i])).collect();
        if eligible.is_empty() {
            continue;
        }
        if j.spec.prefer_spot {
            // Stable: spot pools first, each group still by price.
            eligible.sort_by_key(|i| pools[*i].template.lifecycle() != crate::Lifecycle::Spot);
        }
        let gpus = j.spec.tasks as u64 * t.gpus as u64;
        let r = room.entry(j.spec.tenant).or_insert_with(|| st.tenant_gpu_room(j.spec.tenant));
        match r {
            Some(left) if *left < gpus => continue,
            Some(left) => *left -= gpus,
            None => {}
        }
        let i = eligible
            .iter()
            .copied()
            .find(|i| held[*i].saturating_add(counted[*i]).saturating_add(gpus) <= pools[*i].max_gpus)
            .unwrap_or(eligible[0]);
        counted[i] += gpus;
    }
    held.iter().zip(&counted).map(|(h, c)| h + c).collect()
}

/// The forecast (GPUs) and the load (forecast ÷ capacity) of a window; `None` when empty.
pub fn forecast(cfg: &AutoscaleConfig, samples: &[f64], capacity_gpus: u64) -> Option<(f64, f64)> {
    let w = &samples[samples.len().saturating_sub(cfg.window.max(1))..];
    let f = weighted_load(w)?;
    let load = match capacity_gpus {
        0 if f > 0.0 => f64::INFINITY,
        0 => 0.0,
        c => f / c as f64,
    };
    Some((f, load))
}

/// Decides whether to grow or shrink the pool.
pub fn decide(cfg: &AutoscaleConfig, input: &AutoscaleInput<'_>) -> ScaleDecision {
    let Some((forecast_gpus, load)) = forecast(cfg, input.samples, input.capacity_gpus) else {
        return ScaleDecision::Hold { reason: "no demand samples yet".into() };
    };
    if let Some(t) = input.last_action {
        if input.now.since(t) < cfg.cooldown {
            return ScaleDecision::Hold { reason: format!("cooling down until {}", t + cfg.cooldown) };
        }
    }
    let per = input.gpus_per_spot_node.max(1) as f64;
    let cap = input.capacity_gpus as f64;
    let target = if cfg.target > 0.0 { cfg.target } else { 1.0 };
    if input.spot_nodes < cfg.min_nodes {
        let add = (cfg.min_nodes - input.spot_nodes).min(cfg.max_step.max(1));
        return ScaleDecision::Out { nodes: add, load, forecast_gpus };
    }
    if load > cfg.high {
        let room = cfg.max_nodes.saturating_sub(input.spot_nodes);
        if room == 0 {
            return ScaleDecision::Hold {
                reason: format!("load {load:.2} but the pool is at its maximum of {} nodes", cfg.max_nodes),
            };
        }
        // Capacity that brings the forecast to the target load.
        let want_cap = forecast_gpus / target;
        let add = ((want_cap - cap) / per).ceil().max(1.0) as u32;
        return ScaleDecision::Out { nodes: add.min(room).min(cfg.max_step.max(1)), load, forecast_gpus };
    }
    if load < cfg.low {
        let spare = input.spot_nodes.saturating_sub(cfg.min_nodes);
        let want_cap = forecast_gpus / target;
        let excess = ((cap - want_cap) / per).floor().max(0.0) as u32;
        let n = excess.min(spare).min(cfg.max_step.max(1)) as usize;
        let nodes: Vec<NodeId> = input.idle_spot.iter().take(n).copied().collect();
        if nodes.is_empty() {
            return ScaleDecision::Hold { reason: format!("load {load:.2} is low but no idle node can go") };
        }
        return ScaleDecision::In { nodes, load, forecast_gpus };
    }
    ScaleDecision::Hold { reason: format!("load {load:.2} within [{:.2}, {:.2}]", cfg.low, cfg.high) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_halve_per_step_and_are_normalised() {
        // Newest 1.0 (w 1), then 0.0 (w .5), then 0.0 (w .25): 1 / 1.75.
        let l = weighted_load(&[0.0, 0.0, 1.0]).unwrap();
        assert!((l - 1.0 / 1.75).abs() < 1e-12);
        assert_eq!(weighted_load(&[0.6]), Some(0.6));
        assert_eq!(weighted_load(&[]), None);
    }

    fn input<'a>(samples: &'a [f64], idle: &'a [NodeId], spot: u32, last: Option<Time>) -> AutoscaleInput<'a> {
        AutoscaleInput {
            samples,
            capacity_gpus: 80,
            gpus_per_spot_node: 8,
            spot_nodes: spot,
            idle_spot: idle,
            last_action: last,
            now: Time::from_secs(1000),
        }
    }

    #[test]
    fn scales_out_to_reach_the_target() {
        let cfg = AutoscaleConfig::default();
        // 112 GPUs of demand on 80 (load 1.4); at target .7 that needs 160 GPUs: 80 more = 10 nodes.
        match decide(&cfg, &input(&[112.0, 112.0, 112.0], &[], 2, None)) {
            ScaleDecision::Out { nodes, .. } => assert_eq!(nodes, 10),
            d => panic!("{d:?}"),
        }
        let capped = AutoscaleConfig { max_nodes: 5, ..cfg.clone() };
        match decide(&capped, &input(&[112.0], &[], 2, None)) {
            ScaleDecision::Out { nodes, .. } => assert_eq!(nodes, 3),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn scales_in_only_idle_spot_nodes_and_respects_min_and_cooldown() {
        let cfg = AutoscaleConfig { min_nodes: 1, ..AutoscaleConfig::default() };
        let idle = [NodeId(7), NodeId(9), NodeId(3)];
        match decide(&cfg, &input(&[0.0, 0.0], &idle, 3, None)) {
            ScaleDecision::In { nodes, .. } => assert_eq!(nodes, vec![NodeId(7), NodeId(9)]),
            d => panic!("{d:?}"),
        }
        let recent = Some(Time::from_secs(900));
        assert!(matches!(decide(&cfg, &input(&[0.0], &idle, 3, recent)), ScaleDecision::Hold { .. }));
        assert!(matches!(decide(&cfg, &input(&[0.0], &[], 3, None)), ScaleDecision::Hold { .. }));
        assert!(matches!(decide(&cfg, &input(&[48.0], &idle, 3, None)), ScaleDecision::Hold { .. }));
    }

    #[test]
    fn a_spike_is_damped_by_the_window() {
        let cfg = AutoscaleConfig::default();
        // One spike of 80 GPUs after samples of 24: WMA is (80 + .5·24 + .25·24 + .125·24)/1.875 ≈ 52 (load .65),
        // below high.
        assert!(matches!(decide(&cfg, &input(&[24.0, 24.0, 24.0, 80.0], &[], 0, None)), ScaleDecision::Hold { .. }));
    }

    #[test]
    fn a_pool_s_demand_counts_jobs_that_could_run_there_and_that_their_quota_lets_start() {
        use crate::*;
        let mut s = ClusterState::new(SchedConfig::default()).unwrap();
        let capped = s.add_tenant(TenantSpec::new("capped").quota(Quota::gpus(1, 1))).unwrap();
        let free = s.add_tenant(TenantSpec::new("free")).unwrap();
        let spot = |name: &str| {
            NodeSpec::with_gpus(name, GpuModel::A10, 4, MilliCpu::cores(16), MiB::gib(64))
                .label("lifecycle", "spot")
                .taint("lifecycle", "spot")
        };
        let tolerant = |t, name: &str, gpus| {
            let mut j = JobSpec::new(t, name, gpus, 1);
            j.tolerations =
                crate::job::thin_vec![crate::job::Toleration { key: "lifecycle".into(), value: Some("spot".into()) }];
            j
        };
        let mut id = 0;
        let mut submit = |s: &mut ClusterState, j: JobSpec| {
            id += 1;
            s.submit(JobId(id), j, Time::ZERO).unwrap();
        };
        // The capped tenant's four 1-GPU jobs: only one fits its quota of 1 GPU.
        for k in 0..4 {
            submit(&mut s, tolerant(capped, &format!("c{k}"), 1));
        }
        // The free tenant: a 2-GPU job that may use spot, one that may not (no toleration), one too big for a node.
        submit(&mut s, tolerant(free, "two", 2));
        submit(&mut s, JobSpec::new(free, "never", 1, 1));
        submit(&mut s, tolerant(free, "huge", 8));
        assert_eq!(pool_demand(&s, &spot("template"), &[]), 1 + 2);
    }

    #[test]
    fn a_queued_job_is_counted_in_one_pool_spot_first_when_it_prefers_it_then_the_cheapest_with_room() {
        use crate::*;
        let mut s = ClusterState::new(SchedConfig::default()).unwrap();
        let t = s.add_tenant(TenantSpec::new("t")).unwrap();
        let spot = NodeSpec::with_gpus("spot", GpuModel::A10, 4, MilliCpu::cores(16), MiB::gib(64))
            .label("lifecycle", "spot")
            .taint("lifecycle", "spot");
        let od = NodeSpec::with_gpus("od", GpuModel::A10, 4, MilliCpu::cores(16), MiB::gib(64))
            .label("lifecycle", "on-demand");
        let tolerant = |name: &str, gpus, prefer| {
            let mut j = JobSpec::new(t, name, gpus, 1);
            j.tolerations =
                crate::job::thin_vec![crate::job::Toleration { key: "lifecycle".into(), value: Some("spot".into()) }];
            j.prefer_spot = prefer;
            j
        };
        s.submit(JobId(1), tolerant("prefers", 2, true), Time::ZERO).unwrap();
        s.submit(JobId(2), tolerant("allows", 3, false), Time::ZERO).unwrap();
        s.submit(JobId(3), JobSpec::new(t, "never", 1, 1), Time::ZERO).unwrap();
        let shape =
            |template, max_gpus, price_per_gpu_hour| PoolShape { template, nodes: &[], max_gpus, price_per_gpu_hour };
        // Spot is cheaper: both jobs that may use spot count there, the one that may not on the on-demand pool.
        let d = pool_demands(&s, &[shape(&od, 64, 3.0), shape(&spot, 64, 1.0)]);
        assert_eq!(d, vec![1, 2 + 3]);
        // On-demand cheaper (odd, but priced so): the job that only allows spot goes there; the one preferring spot
        // stays on spot.
        let d = pool_demands(&s, &[shape(&od, 64, 1.0), shape(&spot, 64, 3.0)]);
        assert_eq!(d, vec![3 + 1, 2]);
        // The spot pool holds 4 GPUs at its largest: the 3-GPU job no longer fits beside the first (2 + 3 > 4) and
        // goes on-demand; the last 2-GPU job fills the spot pool. Every job is counted once.
        s.submit(JobId(4), tolerant("more", 2, true), Time::ZERO).unwrap();
        let d = pool_demands(&s, &[shape(&od, 64, 3.0), shape(&spot, 4, 1.0)]);
        assert_eq!(d, vec![3 + 1, 2 + 2]);
        // One pool alone counts whatever could run on it.
        assert_eq!(pool_demand(&s, &spot, &[]), 2 + 3 + 2);
    }

    #[test]
    fn an_empty_pool_grows_to_the_demand_in_one_step_and_to_its_minimum_first() {
        let cfg = AutoscaleConfig { max_nodes: 4, max_step: 10, ..AutoscaleConfig::default() };
        let empty = AutoscaleInput { capacity_gpus: 0, gpus_per_spot_node: 4, ..input(&[20.0], &[], 0, None) };
        // 20 GPUs at target .7 want 28.6 GPUs: 8 nodes of 4, capped at the pool's 4.
        match decide(&cfg, &empty) {
            ScaleDecision::Out { nodes, load, forecast_gpus } => {
                assert_eq!(nodes, 4);
                assert!(load.is_infinite());
                assert_eq!(forecast_gpus, 20.0);
            }
            d => panic!("{d:?}"),
        }
        // No demand and no capacity: load 0, nothing to release, hold.
        let idle = AutoscaleInput { capacity_gpus: 0, gpus_per_spot_node: 4, ..input(&[0.0], &[], 0, None) };
        assert!(matches!(decide(&cfg, &idle), ScaleDecision::Hold { .. }));
        // Below its minimum the pool grows to it whatever the demand.
        let min2 = AutoscaleConfig { min_nodes: 2, ..cfg };
        assert!(matches!(decide(&min2, &idle), ScaleDecision::Out { nodes: 2, .. }));
    }
}
