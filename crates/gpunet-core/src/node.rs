//! Nodes: their GPUs with topology (NUMA node, NVLink domain, PCIe switch, optional MIG partitioning), CPU, memory,
//! labels, taints, price and state.
//!
//! A node holds GPUs of one model (mixed-model machines are registered as one node per model group). NVLink domains
//! are numbered per node: GPUs that share a domain number are connected by NVLink / NVSwitch.

use crate::error::CoreError;
use crate::gpu::{GpuModel, MigProfile};
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Most GPUs one node may hold (the allocator tracks them in a 64-bit mask).
pub const MAX_GPUS_PER_NODE: usize = 64;

/// Well-known label keys.
pub mod labels {
    /// Availability zone.
    pub const ZONE: &str = "zone";
    /// Region.
    pub const REGION: &str = "region";
    /// Rack.
    pub const RACK: &str = "rack";
    /// `on-demand`, `spot` or `reserved` (prices differ; spot nodes may be reclaimed).
    pub const LIFECYCLE: &str = "lifecycle";
    /// GPU family (`v100`, `a100`, …), set automatically.
    pub const GPU_TYPE: &str = "gpu-type";
    /// GPU model (`A100-80GB`, …), set automatically.
    pub const GPU_MODEL: &str = "gpu-model";
}

/// One physical GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// Model.
    pub model: GpuModel,
    /// NUMA node the GPU is attached to.
    pub numa: u8,
    /// NVLink domain within the node; GPUs with the same number talk over NVLink.
    pub nvlink_domain: u8,
    /// PCIe switch (common ancestor) within the node.
    pub pcie_switch: u8,
    /// MIG instances when MIG is enabled on this GPU; empty when MIG is off.
    #[serde(default)]
    pub mig: Vec<MigProfile>,
}

/// Whether a node may be reclaimed by its provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lifecycle {
    /// On-demand capacity.
    OnDemand,
    /// Spot / preemptible capacity: may be reclaimed with short notice.
    Spot,
    /// Reserved (committed) capacity: scheduled like on-demand, priced at the reserved price.
    Reserved,
}

impl Lifecycle {
    /// Label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Lifecycle::OnDemand => "on-demand",
            Lifecycle::Spot => "spot",
            Lifecycle::Reserved => "reserved",
        }
    }
}

/// A node's scheduling state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Accepts new tasks.
    Ready,
    /// Accepts no new tasks; running ones continue.
    Cordoned,
    /// Accepts no new tasks; running ones are being moved off.
    Draining,
    /// The agent stopped answering; its tasks are requeued.
    Lost,
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeState::Ready => "ready",
            NodeState::Cordoned => "cordoned",
            NodeState::Draining => "draining",
            NodeState::Lost => "lost",
        })
    }
}

/// A taint keeps tasks off a node unless they tolerate it (effect: NoSchedule).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    #[serde(default)]
    pub value: String,
}

/// What a node is: registered once, changed only by re-registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Unique name.
    pub name: String,
    /// GPUs, by index.
    pub gpus: Vec<GpuDevice>,
    /// Allocatable CPU.
    pub cpu: MilliCpu,
    /// Allocatable memory.
    pub mem: MiB,
    /// Labels (zone, region, rack, lifecycle, free-form).
    pub labels: BTreeMap<String, String>,
    /// Taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Price of one GPU-hour on this node, in the billing currency. The server sets it at registration (the agent's
    /// override, else the price catalogue's; see [`crate::pricing`]): what a registration's spec says is ignored.
    #[serde(default)]
    pub price_per_gpu_hour: f64,
}

impl NodeSpec {
    /// A node of `count` GPUs of `model` with the usual topology for it: SXM parts (V100, A100, H100, H200) share one
    /// NVLink domain per 8 GPUs, PCIe parts have no NVLink (one domain per GPU); the first half of the GPUs sit on
    /// NUMA node 0, the second on 1; two GPUs per PCIe switch.
    pub fn with_gpus(name: impl Into<String>, model: GpuModel, count: usize, cpu: MilliCpu, mem: MiB) -> NodeSpec {
        let nvlinked = matches!(
            model,
            GpuModel::V100_16GB
                | GpuModel::V100_32GB
                | GpuModel::A100_40GB
                | GpuModel::A100_80GB
                | GpuModel::H100_80GB
                | GpuModel::H200_141GB
        );
        let gpus = (0..count)
            .map(|i| GpuDevice {
                model,
                numa: if count > 1 && i >= count / 2 { 1 } else { 0 },
                nvlink_domain: if nvlinked { (i / 8) as u8 } else { i as u8 },
                pcie_switch: (i / 2) as u8,
                mig: Vec::new(),
            })
            .collect();
        NodeSpec {
            name: name.into(),
            gpus,
            cpu,
            mem,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            price_per_gpu_hour: 0.0,
        }
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> NodeSpec {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, key: &str, value: &str) -> NodeSpec {
        self.taints.push(Taint { key: key.into(), value: value.into() });
        self
    }

    /// Sets the GPU-hour price.
    pub fn price(mut self, per_gpu_hour: f64) -> NodeSpec {
        self.price_per_gpu_hour = per_gpu_hour;
        self
    }

    /// Zone label, or "" when unset.
    pub fn zone(&self) -> &str {
        self.labels.get(labels::ZONE).map(String::as_str).unwrap_or("")
    }

    /// Rack label, or "" when unset.
    pub fn rack(&self) -> &str {
        self.labels.get(labels::RACK).map(String::as_str).unwrap_or("")
    }

    /// Lifecycle from the `lifecycle` label (default on-demand).
    pub fn lifecycle(&self) -> Lifecycle {
        match self.labels.get(labels::LIFECYCLE).map(String::as_str) {
            Some("spot") => Lifecycle::Spot,
            Some("reserved") => Lifecycle::Reserved,
            _ => Lifecycle::OnDemand,
        }
    }

    /// The node's GPU model, if it has GPUs.
    pub fn gpu_model(&self) -> Option<GpuModel> {
        self.gpus.first().map(|g| g.model)
    }

    /// Checks the node and fills the automatic labels (`gpu-type`, `gpu-model`, `lifecycle`).
    pub fn validate(&mut self) -> Result<(), CoreError> {
        if self.name.trim().is_empty() {
            return Err(CoreError::InvalidField {
                field: "node.name",
                value: self.name.clone(),
                allowed: "a non-empty name".into(),
            });
        }
        if self.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(CoreError::InvalidField {
                field: "node.gpus",
                value: self.gpus.len().to_string(),
                allowed: format!("at most {MAX_GPUS_PER_NODE} GPUs per node"),
            });
        }
        if let Some(first) = self.gpu_model() {
            if let Some(other) = self.gpus.iter().find(|g| g.model != first) {
                return Err(CoreError::InvalidField {
                    field: "node.gpus.model",
                    value: other.model.to_string(),
                    allowed: format!("one model per node ({first}); register mixed machines as one node per model"),
                });
            }
            for g in &self.gpus {
                let compute: u32 = g.mig.iter().map(|p| p.compute as u32).sum();
                if let Some(p) = g.mig.iter().find(|p| !g.model.supports_mig(**p)) {
                    return Err(CoreError::InvalidField {
                        field: "node.gpus.mig",
                        value: p.to_string(),
                        allowed: format!(
                            "profiles of {}: {}",
                            g.model,
                            g.model.mig_profiles().iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
                        ),
                    });
                }
                if compute > 7 {
                    return Err(CoreError::InvalidField {
                        field: "node.gpus.mig",
                        value: format!("{compute} compute slices"),
                        allowed: "at most 7 compute slices per GPU".into(),
                    });
                }
            }
            self.labels.insert(labels::GPU_TYPE.into(), first.family().into());
            self.labels.insert(labels::GPU_MODEL.into(), first.name().into());
        }
        if !self.price_per_gpu_hour.is_finite() || self.price_per_gpu_hour < 0.0 {
            return Err(CoreError::InvalidField {
                field: "node.price_per_gpu_hour",
                value: self.price_per_gpu_hour.to_string(),
                allowed: "a finite number >= 0".into(),
            });
        }
        match self.labels.get(labels::LIFECYCLE).map(String::as_str) {
            None => {
                self.labels.insert(labels::LIFECYCLE.into(), "on-demand".into());
            }
            Some("spot") | Some("on-demand") | Some("reserved") => {}
            Some(other) => {
                return Err(CoreError::InvalidField {
                    field: "node.labels.lifecycle",
                    value: other.into(),
                    allowed: "on-demand, spot or reserved".into(),
                })
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sxm_nodes_share_nvlink_and_pcie_nodes_do_not() {
        let n = NodeSpec::with_gpus("a", GpuModel::A100_80GB, 8, MilliCpu::cores(64), MiB::gib(512));
        assert!(n.gpus.iter().all(|g| g.nvlink_domain == 0));
        assert_eq!(n.gpus[5].numa, 1);
        let t = NodeSpec::with_gpus("t", GpuModel::T4, 4, MilliCpu::cores(32), MiB::gib(128));
        let doms: Vec<u8> = t.gpus.iter().map(|g| g.nvlink_domain).collect();
        assert_eq!(doms, vec![0, 1, 2, 3]);
    }

    #[test]
    fn validate_sets_labels_and_rejects_bad_values() {
        let mut n = NodeSpec::with_gpus("a", GpuModel::V100_32GB, 4, MilliCpu::cores(8), MiB::gib(64));
        n.validate().unwrap();
        assert_eq!(n.labels["gpu-type"], "v100");
        assert_eq!(n.lifecycle(), Lifecycle::OnDemand);
        let mut reserved = n.clone().label("lifecycle", "reserved");
        reserved.validate().unwrap();
        assert_eq!(reserved.lifecycle(), Lifecycle::Reserved);
        let mut bad = n.clone().label("lifecycle", "cheap");
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("lifecycle") && e.contains("cheap") && e.contains("spot"), "{e}");
        let mut mixed = n.clone();
        mixed.gpus[1].model = GpuModel::T4;
        assert!(mixed.validate().is_err());
        let mut mig = NodeSpec::with_gpus("m", GpuModel::V100_16GB, 1, MilliCpu::cores(8), MiB::gib(64));
        mig.gpus[0].mig = vec!["1g.10gb".parse().unwrap()];
        assert!(mig.validate().unwrap_err().to_string().contains("mig"));
    }
}
