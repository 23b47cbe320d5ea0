//! The autoscaler decision: a pure function over a sliding window of load samples (demand ÷ capacity).
//!
//! The signal is a weighted moving average with decay 0.5 per step: the newest sample has weight 1, the one before
//! 0.5, then 0.25, …, normalised by the sum of the weights. Above `high` the spot pool grows to bring the load back
//! to `target`; below `low` idle spot nodes are released; never outside `[min_nodes, max_nodes]`, and no action
//! within `cooldown` of the previous one.

use crate::ids::NodeId;
use crate::units::{Dur, Time};
use serde::{Deserialize, Serialize};

/// Autoscaler settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleConfig {
    /// Samples kept in the window.
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
            window: 10,
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
    /// Add this many spot nodes.
    Out {
        /// Nodes to add.
        nodes: u32,
        /// The smoothed load that triggered it.
        load: f64,
    },
    /// Release these idle spot nodes.
    In {
        /// Nodes to release.
        nodes: Vec<NodeId>,
        /// The smoothed load that triggered it.
        load: f64,
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
    /// Load samples, oldest first; only the last `window` count.
    pub samples: &'a [f64],
    /// GPUs of all schedulable nodes now.
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

/// Decides whether to grow or shrink the spot pool.
pub fn decide(cfg: &AutoscaleConfig, input: &AutoscaleInput<'_>) -> ScaleDecision {
    let w = &input.samples[input.samples.len().saturating_sub(cfg.window.max(1))..];
    let Some(load) = weighted_load(w) else {
        return ScaleDecision::Hold { reason: "no load samples yet".into() };
    };
    if let Some(t) = input.last_action {
        if input.now.since(t) < cfg.cooldown {
            return ScaleDecision::Hold { reason: format!("cooling down until {}", t + cfg.cooldown) };
        }
    }
    let per = input.gpus_per_spot_node.max(1) as f64;
    let cap = input.capacity_gpus as f64;
    if load > cfg.high {
        let room = cfg.max_nodes.saturating_sub(input.spot_nodes);
        if room == 0 {
            return ScaleDecision::Hold {
                reason: format!("load {load:.2} but the pool is at its maximum of {}", cfg.max_nodes),
            };
        }
        // Demand in GPUs is load × capacity; capacity needed to bring it to target.
        let want_cap = load * cap / cfg.target;
        let add = ((want_cap - cap) / per).ceil().max(1.0) as u32;
        return ScaleOut(add.min(room).min(cfg.max_step), load).into();
    }
    if load < cfg.low {
        let spare = input.spot_nodes.saturating_sub(cfg.min_nodes);
        let want_cap = if cfg.target > 0.0 { load * cap / cfg.target } else { 0.0 };
        let excess = ((cap - want_cap) / per).floor().max(0.0) as u32;
        let n = excess.min(spare).min(cfg.max_step) as usize;
        let nodes: Vec<NodeId> = input.idle_spot.iter().take(n).copied().collect();
        if nodes.is_empty() {
            return ScaleDecision::Hold { reason: format!("load {load:.2} is low but no idle spot node can go") };
        }
        return ScaleDecision::In { nodes, load };
    }
    ScaleDecision::Hold { reason: format!("load {load:.2} within [{:.2}, {:.2}]", cfg.low, cfg.high) }
}

struct ScaleOut(u32, f64);

impl From<ScaleOut> for ScaleDecision {
    fn from(s: ScaleOut) -> ScaleDecision {
        ScaleDecision::Out { nodes: s.0, load: s.1 }
    }
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
        // load 1.4 on 80 GPUs = 112 GPUs of demand; at target .7 that needs 160 GPUs: 80 more = 10 nodes.
        match decide(&cfg, &input(&[1.4, 1.4, 1.4], &[], 2, None)) {
            ScaleDecision::Out { nodes, .. } => assert_eq!(nodes, 10),
            d => panic!("{d:?}"),
        }
        let capped = AutoscaleConfig { max_nodes: 5, ..cfg.clone() };
        match decide(&capped, &input(&[1.4], &[], 2, None)) {
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
        assert!(matches!(decide(&cfg, &input(&[0.6], &idle, 3, None)), ScaleDecision::Hold { .. }));
    }

    #[test]
    fn a_spike_is_damped_by_the_window() {
        let cfg = AutoscaleConfig::default();
        // One spike of 1.0 after low samples: WMA is (1 + .5·.3 + .25·.3 + .125·.3)/1.875 ≈ .65, below high.
        assert!(matches!(decide(&cfg, &input(&[0.3, 0.3, 0.3, 1.0], &[], 0, None)), ScaleDecision::Hold { .. }));
    }
}
