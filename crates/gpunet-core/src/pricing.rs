//! Prices and the one pricing function that the server's usage ledger and the simulator both use.
//!
//! A [`PriceCatalogue`] holds prices per hour: per GPU by model and node [`Lifecycle`] (on-demand, spot, reserved),
//! per CPU core and per GiB of memory. A default catalogue ships with gpunet ([`PriceCatalogue::shipped`], from
//! `crates/gpunet-core/prices.toml`, which says where its figures come from); the server reads another with
//! `--prices FILE` and a cluster spec with a `[prices]` table, both in the same TOML schema:
//!
//! ```toml
//! version = 1                 # optional; only 1 exists
//! currency = "USD"
//! cpu_core_hour = 0.031611    # per CPU core held, per hour
//! mem_gib_hour = 0.004237     # per GiB of memory held, per hour
//! [gpu.default]               # required: models without a row of their own
//! on_demand = 2.48
//! spot = 0.74                 # optional: falls back to on_demand
//! reserved = 1.56             # optional: falls back to on_demand
//! [gpu."A100-80GB"]           # a canonical model name (`gpunet_core::GpuModel`)
//! on_demand = 3.93
//! ```
//!
//! **A node's GPU price** ([`PriceCatalogue::resolve_gpu_hour`]) is fixed when the node is registered (server) or
//! built (simulator): the agent's `--price-per-gpu-hour` (a node group's `price_per_gpu_hour` in the simulator) when
//! given, else the catalogue's row for the node's GPU model — the `default` row when the model has none — at the
//! node's `lifecycle` label. A row without a spot or reserved price charges its on-demand price there: a node is
//! never billed below a price someone wrote down. CPU and memory are priced by the catalogue alike on every node.
//!
//! **Billing** ([`cost`]): one ledger row is what one run of a job held on one node — GPUs, CPU, memory — between two
//! instants. It is billed per second: its length is rounded *up* to whole seconds (a started second counts, as in
//! per-second cloud billing, without a minimum), and each part costs `units × price per hour × seconds ÷ 3600`. The
//! GPU, CPU and memory parts are kept apart ([`Cost`]); the total is their sum.

use crate::gpu::GpuModel;
use crate::ids::NodeId;
use crate::job::Placement;
use crate::node::{Lifecycle, NodeSpec};
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::{Add, AddAssign};

/// The catalogue shipped with gpunet (TOML).
pub const SHIPPED_CATALOGUE: &str = include_str!("../prices.toml");

/// Highest price per hour of anything in a catalogue (and of an agent's override): far above any real GPU, low enough
/// that a year of a full cluster stays a finite, exact-enough `f64`.
pub const MAX_PRICE_PER_HOUR: f64 = 1_000_000.0;

/// The row every model without its own falls back to.
pub const DEFAULT_ROW: &str = "default";

/// A catalogue or price that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PriceError {
    /// A field has a value outside what is allowed.
    #[error("invalid {field} {value:?}: allowed is {allowed}")]
    Invalid {
        /// The field, as written in the catalogue (`prices.gpu."A100-80GB".spot`).
        field: String,
        /// The rejected value.
        value: String,
        /// What would have been accepted.
        allowed: String,
    },
    /// The TOML does not parse or does not have the catalogue's shape.
    #[error("parse the price catalogue: {0}")]
    Parse(String),
}

fn invalid(field: impl Into<String>, value: impl ToString, allowed: impl Into<String>) -> PriceError {
    PriceError::Invalid { field: field.into(), value: value.to_string(), allowed: allowed.into() }
}

/// Checks one price per hour: finite, at least 0, at most [`MAX_PRICE_PER_HOUR`].
pub fn check_price(field: &str, p: f64) -> Result<(), PriceError> {
    if p.is_finite() && (0.0..=MAX_PRICE_PER_HOUR).contains(&p) {
        Ok(())
    } else {
        Err(invalid(field, p, format!("a number from 0 to {MAX_PRICE_PER_HOUR}")))
    }
}

/// One GPU's price per hour by node lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPrices {
    /// On an on-demand node.
    pub on_demand: f64,
    /// On a spot node; `None`: the on-demand price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<f64>,
    /// On a reserved node; `None`: the on-demand price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<f64>,
}

impl GpuPrices {
    /// The price per GPU-hour on a node of `lifecycle`.
    pub fn per_hour(&self, lifecycle: Lifecycle) -> f64 {
        match lifecycle {
            Lifecycle::OnDemand => self.on_demand,
            Lifecycle::Spot => self.spot.unwrap_or(self.on_demand),
            Lifecycle::Reserved => self.reserved.unwrap_or(self.on_demand),
        }
    }
}

/// Prices per hour of GPUs (by model and lifecycle), CPU cores and memory. Build it with
/// [`PriceCatalogue::from_toml`] or [`PriceCatalogue::shipped`], or deserialise it and call
/// [`PriceCatalogue::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceCatalogue {
    /// Schema version; only 1 exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Currency of every price (`USD`); printed with bills.
    pub currency: String,
    /// Per CPU core held, per hour.
    pub cpu_core_hour: f64,
    /// Per GiB of memory held, per hour.
    pub mem_gib_hour: f64,
    /// Per GPU-hour, by canonical model name, plus the [`DEFAULT_ROW`].
    pub gpu: BTreeMap<String, GpuPrices>,
}

impl PriceCatalogue {
    /// The catalogue shipped with gpunet ([`SHIPPED_CATALOGUE`]).
    pub fn shipped() -> PriceCatalogue {
        PriceCatalogue::from_toml(SHIPPED_CATALOGUE).expect("the shipped catalogue is valid (tested)")
    }

    /// Parses and validates a catalogue in TOML.
    pub fn from_toml(text: &str) -> Result<PriceCatalogue, PriceError> {
        let c: PriceCatalogue = toml::from_str(text).map_err(|e| PriceError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Checks every field; errors name it as written in a catalogue file (`prices.…`).
    pub fn validate(&self) -> Result<(), PriceError> {
        if let Some(v) = self.version.filter(|v| *v != 1) {
            return Err(invalid("prices.version", v, "1"));
        }
        let c = &self.currency;
        if c.is_empty() || c.len() > 16 || !c.chars().all(|ch| ch.is_ascii_alphanumeric()) {
            return Err(invalid("prices.currency", c, "1 to 16 letters or digits, e.g. USD"));
        }
        check_price("prices.cpu_core_hour", self.cpu_core_hour)?;
        check_price("prices.mem_gib_hour", self.mem_gib_hour)?;
        if !self.gpu.contains_key(DEFAULT_ROW) {
            return Err(invalid("prices.gpu", "no default row", "a [gpu.default] row for models without their own"));
        }
        for (name, p) in &self.gpu {
            if name != DEFAULT_ROW {
                let canonical = name.parse::<GpuModel>().ok().map(GpuModel::name);
                if canonical != Some(name.as_str()) {
                    let names: Vec<&str> = GpuModel::ALL.iter().map(|m| m.name()).collect();
                    let allowed = format!("{DEFAULT_ROW} or a canonical model name: {}", names.join(", "));
                    return Err(invalid("prices.gpu", name, allowed));
                }
            }
            check_price(&format!("prices.gpu.{name:?}.on_demand"), p.on_demand)?;
            if let Some(s) = p.spot {
                check_price(&format!("prices.gpu.{name:?}.spot"), s)?;
            }
            if let Some(r) = p.reserved {
                check_price(&format!("prices.gpu.{name:?}.reserved"), r)?;
            }
        }
        Ok(())
    }

    /// The catalogue's price per GPU-hour of `model` (its row, else the default row) on a node of `lifecycle`.
    pub fn gpu_hour(&self, model: GpuModel, lifecycle: Lifecycle) -> f64 {
        self.gpu.get(model.name()).or_else(|| self.gpu.get(DEFAULT_ROW)).map_or(0.0, |p| p.per_hour(lifecycle))
    }

    /// A node's price per GPU-hour: `override_price` when given, else the catalogue's for its GPU model and
    /// `lifecycle` label; 0 for a node without GPUs.
    pub fn resolve_gpu_hour(&self, node: &NodeSpec, override_price: Option<f64>) -> f64 {
        match (override_price, node.gpu_model()) {
            (Some(p), _) => p,
            (None, Some(m)) => self.gpu_hour(m, node.lifecycle()),
            (None, None) => 0.0,
        }
    }

    /// What holding resources on `node` costs per hour: its own GPU price (resolved when it joined) and the
    /// catalogue's CPU and memory prices.
    pub fn node_rates(&self, node: &NodeSpec) -> NodeRates {
        NodeRates {
            gpu_hour: node.price_per_gpu_hour,
            cpu_core_hour: self.cpu_core_hour,
            mem_gib_hour: self.mem_gib_hour,
        }
    }
}

/// Prices per hour that apply on one node.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeRates {
    /// Per GPU.
    pub gpu_hour: f64,
    /// Per CPU core.
    pub cpu_core_hour: f64,
    /// Per GiB of memory.
    pub mem_gib_hour: f64,
}

/// What a run holds on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// GPUs (a MIG instance counts as one GPU).
    pub gpus: u32,
    /// CPU.
    pub cpu: MilliCpu,
    /// Memory.
    pub mem: MiB,
}

/// What a placement holds on each of its nodes, by node id: one ledger row each.
pub fn held_per_node(placement: &Placement) -> Vec<(NodeId, Held)> {
    let mut out: Vec<(NodeId, Held)> = Vec::new();
    for t in &placement.tasks {
        let i = match out.iter().position(|(n, _)| *n == t.node) {
            Some(i) => i,
            None => {
                out.push((t.node, Held::default()));
                out.len() - 1
            }
        };
        let h = &mut out[i].1;
        h.gpus += t.gpu_mask.count_ones() + u32::from(t.mig_slot.is_some() && t.gpu_mask == 0);
        h.cpu = MilliCpu(h.cpu.0 + t.cpu.0);
        h.mem = MiB(h.mem.0 + t.mem.0);
    }
    out.sort_by_key(|(n, _)| *n);
    out
}

/// A cost, by part, in the catalogue's currency.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Cost {
    /// Of GPUs.
    pub gpu: f64,
    /// Of CPU.
    pub cpu: f64,
    /// Of memory.
    pub mem: f64,
}

impl Cost {
    /// GPU + CPU + memory.
    pub fn total(&self) -> f64 {
        self.gpu + self.cpu + self.mem
    }
}

impl Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost { gpu: self.gpu + o.gpu, cpu: self.cpu + o.cpu, mem: self.mem + o.mem }
    }
}

impl AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        *self = *self + o;
    }
}

/// The seconds billed for `duration_ms`: rounded up to whole seconds.
pub const fn billed_seconds(duration_ms: u64) -> u64 {
    duration_ms.div_ceil(1000)
}

/// The cost of holding `held` at `rates` for `duration_ms`, billed per second ([`billed_seconds`]): the one pricing
/// function of the usage ledger and the simulator.
pub fn cost(held: Held, rates: &NodeRates, duration_ms: u64) -> Cost {
    let hours = billed_seconds(duration_ms) as f64 / 3600.0;
    Cost {
        gpu: held.gpus as f64 * rates.gpu_hour * hours,
        cpu: held.cpu.0 as f64 / 1000.0 * rates.cpu_core_hour * hours,
        mem: held.mem.0 as f64 / 1024.0 * rates.mem_gib_hour * hours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
        currency = "EUR"
        cpu_core_hour = 0.04
        mem_gib_hour = 0.005
        [gpu.default]
        on_demand = 1.0
        [gpu."A100-80GB"]
        on_demand = 4.0
        spot = 1.5
    "#;

    fn node(model: GpuModel, lifecycle: Option<&str>) -> NodeSpec {
        let n = NodeSpec::with_gpus("n", model, 8, MilliCpu::cores(64), MiB::gib(512));
        match lifecycle {
            Some(l) => n.label("lifecycle", l),
            None => n,
        }
    }

    #[test]
    fn the_shipped_catalogue_is_valid_and_prices_every_model_and_lifecycle() {
        let c = PriceCatalogue::shipped();
        assert_eq!(c.currency, "USD");
        for m in GpuModel::ALL {
            let (od, spot, res) = (
                c.gpu_hour(m, Lifecycle::OnDemand),
                c.gpu_hour(m, Lifecycle::Spot),
                c.gpu_hour(m, Lifecycle::Reserved),
            );
            assert!(od > 0.0 && spot > 0.0 && spot < od && res > spot && res < od, "{m}: {od} {spot} {res}");
        }
        assert_eq!(c.gpu_hour(GpuModel::A100_80GB, Lifecycle::Spot), 1.57);
        assert!(c.cpu_core_hour > 0.0 && c.mem_gib_hour > 0.0);
    }

    #[test]
    fn a_missing_spot_or_reserved_price_is_the_on_demand_one_and_unknown_models_take_the_default_row() {
        let c = PriceCatalogue::from_toml(SMALL).unwrap();
        assert_eq!(c.gpu_hour(GpuModel::A100_80GB, Lifecycle::Spot), 1.5);
        assert_eq!(c.gpu_hour(GpuModel::A100_80GB, Lifecycle::Reserved), 4.0, "no reserved price: on-demand");
        assert_eq!(c.gpu_hour(GpuModel::T4, Lifecycle::Spot), 1.0, "no T4 row: the default row");
    }

    #[test]
    fn an_override_wins_over_the_catalogue_which_follows_the_lifecycle_label() {
        let c = PriceCatalogue::from_toml(SMALL).unwrap();
        assert_eq!(c.resolve_gpu_hour(&node(GpuModel::A100_80GB, None), None), 4.0);
        assert_eq!(c.resolve_gpu_hour(&node(GpuModel::A100_80GB, Some("spot")), None), 1.5);
        assert_eq!(c.resolve_gpu_hour(&node(GpuModel::A100_80GB, Some("spot")), Some(0.7)), 0.7);
        assert_eq!(c.resolve_gpu_hour(&node(GpuModel::A100_80GB, None), Some(0.0)), 0.0, "free is a price");
        let cpu_only = NodeSpec::with_gpus("c", GpuModel::T4, 0, MilliCpu::cores(8), MiB::gib(32));
        assert_eq!(c.resolve_gpu_hour(&cpu_only, None), 0.0);
        let n = node(GpuModel::T4, None).price(2.5);
        assert_eq!(c.node_rates(&n), NodeRates { gpu_hour: 2.5, cpu_core_hour: 0.04, mem_gib_hour: 0.005 });
    }

    #[test]
    fn bad_catalogues_are_refused_with_the_field_named() {
        let bad = |from: &str, to: &str| {
            let text = SMALL.replace(from, to);
            assert_ne!(text, SMALL, "{from}");
            PriceCatalogue::from_toml(&text).unwrap_err().to_string()
        };
        let e = bad("spot = 1.5", "spot = -1.5");
        assert!(e.contains(r#"prices.gpu."A100-80GB".spot"#) && e.contains("-1.5"), "{e}");
        let e = bad("spot = 1.5", "spot = nan");
        assert!(e.contains("spot") && e.contains("NaN"), "{e}");
        let e = bad("cpu_core_hour = 0.04", "cpu_core_hour = 1e7");
        assert!(e.contains("prices.cpu_core_hour") && e.contains("10000000"), "{e}");
        let e = bad("mem_gib_hour = 0.005", "mem_gib_hour = inf");
        assert!(e.contains("prices.mem_gib_hour"), "{e}");
        let e = bad("[gpu.default]", "[gpu.other]");
        assert!(e.contains("prices.gpu") && e.contains("default"), "{e}");
        let e = bad(r#"[gpu."A100-80GB"]"#, "[gpu.a100]");
        assert!(e.contains("prices.gpu") && e.contains("\"a100\"") && e.contains("A100-80GB"), "aliases: {e}");
        let e = bad(r#"currency = "EUR""#, r#"currency = "€""#);
        assert!(e.contains("prices.currency"), "{e}");
        let e = bad(r#"currency = "EUR""#, "version = 2\ncurrency = \"EUR\"");
        assert!(e.contains("prices.version"), "{e}");
        let e = bad("spot = 1.5", "spot = 1.5\nspto = 1");
        assert!(e.contains("spto"), "unknown fields are refused: {e}");
        assert!(PriceCatalogue::from_toml("currency = 1").is_err());
    }

    #[test]
    fn a_placement_holds_per_node_the_sum_of_its_tasks_and_a_mig_instance_is_one_gpu() {
        use crate::job::TaskPlacement;
        let t = |node, gpu_mask, mig_slot, cpu| TaskPlacement {
            node: NodeId(node),
            gpu_mask,
            mig_slot,
            cpu: MilliCpu(cpu),
            mem: MiB(cpu * 2),
        };
        let p = Placement { tasks: vec![t(3, 0b11, None, 1000), t(1, 0, Some(2), 500), t(3, 0b1100, None, 1000)] };
        let h = held_per_node(&p);
        assert_eq!(
            h,
            vec![
                (NodeId(1), Held { gpus: 1, cpu: MilliCpu(500), mem: MiB(1000) }),
                (NodeId(3), Held { gpus: 4, cpu: MilliCpu(2000), mem: MiB(4000) }),
            ]
        );
    }

    #[test]
    fn billing_is_per_started_second_and_splits_gpu_cpu_and_memory() {
        assert_eq!((billed_seconds(0), billed_seconds(1), billed_seconds(1000), billed_seconds(1001)), (0, 1, 1, 2));
        let rates = NodeRates { gpu_hour: 3.6, cpu_core_hour: 0.36, mem_gib_hour: 0.036 };
        let held = Held { gpus: 2, cpu: MilliCpu(1500), mem: MiB(2048) };
        // 59.001 s is billed as 60 s: 2 GPUs × 3.6/h × 60/3600 h = 0.12.
        let c = cost(held, &rates, 59_001);
        assert!(
            (c.gpu - 0.12).abs() < 1e-12 && (c.cpu - 0.009).abs() < 1e-12 && (c.mem - 0.0012).abs() < 1e-12,
            "{c:?}"
        );
        assert_eq!(c.total(), c.gpu + c.cpu + c.mem);
        assert_eq!(cost(held, &rates, 60_000), c, "the same whole seconds cost the same");
        assert_eq!(cost(held, &rates, 0), Cost::default());
        // An hour of one A100 on an on-demand node of the shipped catalogue costs its listed price.
        let cat = PriceCatalogue::shipped();
        let n = node(GpuModel::A100_80GB, None);
        let n = n.clone().price(cat.resolve_gpu_hour(&n, None));
        let c = cost(Held { gpus: 1, ..Held::default() }, &cat.node_rates(&n), 3_600_000);
        assert_eq!(c.gpu, 3.93);
    }
}
