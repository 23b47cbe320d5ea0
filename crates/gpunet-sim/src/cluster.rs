//! Cluster specs: a versioned TOML file of node groups (and optionally tenants), or a preset built into the binary.
//!
//! ```toml
//! version = 1
//! [[node_group]]
//! count = 16
//! gpus_per_node = 8
//! gpu_model = "A100-80GB"
//! cpu_milli = 128000        # default 16 cores per GPU
//! memory_mib = 1048576      # default 128 GiB per GPU
//! zone = "zone-a"           # default "zone-1"
//! rack_size = 8             # nodes per rack; default 16
//! lifecycle = "on-demand"   # or "spot" (tainted lifecycle=spot), or "reserved"
//! price_per_gpu_hour = 2.5  # default: the price catalogue's for the model and lifecycle
//!
//! [prices]                  # optional; default: the catalogue shipped with gpunet (`gpunet prices`)
//! currency = "USD"          # the same schema as `gpunet server --prices FILE`, see gpunet_core::pricing
//! cpu_core_hour = 0.031611
//! mem_gib_hour = 0.004237
//! [prices.gpu.default]
//! on_demand = 2.48
//! spot = 0.74
//!
//! [[tenant]]
//! name = "team-a"
//! weight = 2.0
//! guarantee_gpus = 64
//! limit_gpus = 96
//! cohort = "research"
//! ```
//!
//! Presets: `philly` (the Philly machine list as revised by the Helios authors: GPUs per machine, with each machine's
//! GPU memory from the official list, 12 GB → K80, 24 GB → P40; racks of 16 machines), `pai2023` (the PAI 2023
//! node list), `tiresias-n1g4`, `tiresias-n32g4`, `tiresias-n160g8`, `tiresias-n256g8`, `tiresias-cluster-spec`
//! (Tiresias cluster shapes: switches × nodes per switch × GPUs per node, P100, one rack per switch) and `pollux`
//! (16 nodes × 4 T4, the Pollux testbed).

use crate::error::SimError;
use gpunet_core::{GpuModel, MiB, MilliCpu, NodeSpec, PriceCatalogue};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

/// A group of identical nodes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    /// Nodes in the group.
    pub count: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// GPU model name.
    pub gpu_model: String,
    /// CPU per node in millicores (default 16 cores per GPU, at least 8 cores).
    pub cpu_milli: Option<u64>,
    /// Memory per node in MiB (default 128 GiB per GPU, at least 64 GiB).
    pub memory_mib: Option<u64>,
    /// Zone (default `zone-1`).
    pub zone: Option<String>,
    /// Nodes per rack (default 16).
    pub rack_size: Option<u32>,
    /// `on-demand` (default), `spot` or `reserved`.
    pub lifecycle: Option<String>,
    /// Price of a GPU-hour (default: the price catalogue's for the model and lifecycle).
    pub price_per_gpu_hour: Option<f64>,
    /// Name prefix of the nodes (default `g<index>`).
    pub name: Option<String>,
}

/// A tenant defined in the spec.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantDef {
    /// Name as in the trace.
    pub name: String,
    /// Fair-share weight (default 1).
    pub weight: Option<f64>,
    /// Guaranteed GPUs.
    pub guarantee_gpus: Option<u64>,
    /// Most GPUs with borrowing (default: the guarantee).
    pub limit_gpus: Option<u64>,
    /// Cohort.
    pub cohort: Option<String>,
}

/// The most nodes a cluster spec may hold in all (`gpunet bench sched` models 10,000).
pub const MAX_NODES: u64 = 100_000;

/// A cluster spec.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Spec version; only 1 exists.
    pub version: Option<u32>,
    /// Node groups.
    pub node_group: Vec<NodeGroup>,
    /// Tenants and quotas (optional).
    #[serde(default)]
    pub tenant: Vec<TenantDef>,
    /// Prices (optional; default: the catalogue shipped with gpunet), as the server's `--prices` file.
    #[serde(default)]
    pub prices: Option<PriceCatalogue>,
    /// The scheduler's knobs (optional `[scheduler]` table: LAS thresholds, minimum run time, eviction rate limit,
    /// tick, checkpoint interval, stop time, …; see `docs/scheduler.md`). Flags given on the command line win.
    #[serde(default)]
    pub scheduler: Option<gpunet_core::SchedKnobs>,
    /// Explicit nodes (presets built from machine lists); not part of the TOML format.
    #[serde(skip)]
    pub nodes: Vec<NodeSpec>,
}

const PHILLY_REVISED: &str = include_str!("../../../data/traces/philly/revised_machine_list.csv");
const PHILLY_OFFICIAL: &str = include_str!("../../../data/traces/philly/cluster_machine_list.csv");
const PAI_NODES: &str = include_str!("../../../data/traces/pai2023/openb_node_list_gpu_node.csv");
const TIRESIAS: [(&str, &str); 5] = [
    ("tiresias-n1g4", include_str!("../../../data/traces/tiresias/n1g4.csv")),
    ("tiresias-n32g4", include_str!("../../../data/traces/tiresias/n32g4.csv")),
    ("tiresias-n160g8", include_str!("../../../data/traces/tiresias/n160g8.csv")),
    ("tiresias-n256g8", include_str!("../../../data/traces/tiresias/n256g8.csv")),
    ("tiresias-cluster-spec", include_str!("../../../data/traces/tiresias/cluster_spec.csv")),
];

/// Names of the built-in presets.
pub const PRESETS: [&str; 8] = [
    "philly",
    "pai2023",
    "pollux",
    "tiresias-n1g4",
    "tiresias-n32g4",
    "tiresias-n160g8",
    "tiresias-n256g8",
    "tiresias-cluster-spec",
];

impl ClusterSpec {
    /// A preset by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<ClusterSpec, SimError> {
        if let Some(p) = Self::preset(name_or_path) {
            return p;
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            return Err(SimError::invalid(
                "--cluster",
                format!("{name_or_path:?} is neither a preset ({}) nor a file", PRESETS.join(", ")),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        Self::from_toml(&text, name_or_path)
    }

    /// Parses and validates a TOML spec (at most [`MAX_NODES`] nodes).
    pub fn from_toml(text: &str, name: &str) -> Result<ClusterSpec, SimError> {
        let what = format!("cluster spec {name}");
        let spec: ClusterSpec = toml::from_str(text).map_err(|e| SimError::invalid(&what, e.to_string()))?;
        if let Some(v) = spec.version {
            if v != 1 {
                return Err(SimError::invalid(&what, format!("version {v} is unknown; allowed is 1")));
            }
        }
        if let Some(p) = &spec.prices {
            p.validate().map_err(|e| SimError::invalid(&what, e.to_string()))?;
        }
        if let Some(k) = &spec.scheduler {
            let mut c = crate::SimConfig::default();
            c.apply_knobs(k).map_err(|e| SimError::invalid(format!("{what}: [scheduler]"), e.to_string()))?;
        }
        if spec.node_group.is_empty() {
            return Err(SimError::invalid(&what, "no [[node_group]]; at least one is required"));
        }
        for (i, g) in spec.node_group.iter().enumerate() {
            let at = format!("{what}: node_group[{i}]");
            g.gpu_model.parse::<GpuModel>().map_err(|e| SimError::invalid(&at, e.to_string()))?;
            if g.count == 0 || g.gpus_per_node > 64 {
                return Err(SimError::invalid(&at, "count must be at least 1 and gpus_per_node at most 64"));
            }
            if let Some(l) = &g.lifecycle {
                if l != "spot" && l != "on-demand" && l != "reserved" {
                    return Err(SimError::invalid(
                        &at,
                        format!("lifecycle {l:?}; allowed are on-demand, spot and reserved"),
                    ));
                }
            }
            if g.rack_size == Some(0) {
                return Err(SimError::invalid(&at, "rack_size must be at least 1"));
            }
            if let Some(p) = g.price_per_gpu_hour {
                gpunet_core::pricing::check_price("price_per_gpu_hour", p)
                    .map_err(|e| SimError::invalid(&at, e.to_string()))?;
            }
        }
        // A spec of a hundred million nodes aborted the process allocating them; a million ran for minutes.
        let nodes: u64 = spec.node_group.iter().map(|g| u64::from(g.count)).sum();
        if nodes > MAX_NODES {
            return Err(SimError::invalid(
                &what,
                format!("its node groups hold {nodes} nodes in all; allowed is at most {MAX_NODES}"),
            ));
        }
        for t in &spec.tenant {
            if let (Some(g), Some(l)) = (t.guarantee_gpus, t.limit_gpus) {
                if l < g {
                    return Err(SimError::invalid(
                        format!("{what}: tenant {}", t.name),
                        format!("limit_gpus {l} is below guarantee_gpus {g}"),
                    ));
                }
            }
        }
        Ok(spec)
    }

    fn preset(name: &str) -> Option<Result<ClusterSpec, SimError>> {
        let spec = |groups: Vec<NodeGroup>| ClusterSpec {
            version: Some(1),
            node_group: groups,
            tenant: Vec::new(),
            prices: None,
            scheduler: None,
            nodes: Vec::new(),
        };
        let group = |count, gpus, model: &str, cpu: u64, mem_gib: u64, rack| NodeGroup {
            count,
            gpus_per_node: gpus,
            gpu_model: model.into(),
            cpu_milli: Some(cpu * 1000),
            memory_mib: Some(mem_gib * 1024),
            zone: None,
            rack_size: Some(rack),
            lifecycle: None,
            price_per_gpu_hour: None,
            name: None,
        };
        match name {
            "philly" => Some(Ok(ClusterSpec { nodes: philly_nodes(), ..spec(Vec::new()) })),
            "pai2023" => Some(pai_nodes().map(|nodes| ClusterSpec { nodes, ..spec(Vec::new()) })),
            "pollux" => Some(Ok(spec(vec![group(16, 4, "T4", 48, 192, 16)]))),
            _ => TIRESIAS.iter().find(|(n, _)| *n == name).map(|(_, csv)| {
                // num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node
                let v: Vec<u64> =
                    csv.lines().nth(1).unwrap_or("").split(',').filter_map(|x| x.trim().parse().ok()).collect();
                if v.len() < 5 {
                    return Err(SimError::invalid(format!("preset {name}"), "malformed embedded cluster shape"));
                }
                let nodes = (v[0] * v[1]) as u32;
                Ok(spec(vec![group(nodes, v[2] as u32, "P100", v[3], v[4], v[1] as u32)]))
            }),
        }
    }

    /// The spec's price catalogue: its `[prices]`, else the shipped one.
    pub fn prices(&self) -> PriceCatalogue {
        self.prices.clone().unwrap_or_else(PriceCatalogue::shipped)
    }

    /// The nodes of the spec, priced: a group's `price_per_gpu_hour`, else the catalogue's for the node's GPU model and
    /// lifecycle (as the server prices a node that registers without an override).
    pub fn build_nodes(&self) -> Vec<NodeSpec> {
        let prices = self.prices();
        let mut out = self.nodes.clone();
        for n in &mut out {
            n.price_per_gpu_hour = prices.resolve_gpu_hour(n, None);
        }
        for (gi, g) in self.node_group.iter().enumerate() {
            let model: GpuModel = g.gpu_model.parse().expect("validated");
            let zone = g.zone.clone().unwrap_or_else(|| "zone-1".into());
            let rack = g.rack_size.unwrap_or(16).max(1);
            let prefix = g.name.clone().unwrap_or_else(|| format!("g{gi}"));
            for i in 0..g.count {
                let gpus = g.gpus_per_node as u64;
                let cpu = g.cpu_milli.unwrap_or(16_000 * gpus.max(1)).max(1);
                let mem = g.memory_mib.unwrap_or(128 * 1024 * gpus.max(1)).max(1);
                let mut n = NodeSpec::with_gpus(
                    format!("{prefix}-{i:05}"),
                    model,
                    g.gpus_per_node as usize,
                    MilliCpu(cpu),
                    MiB(mem),
                )
                .label("zone", &zone)
                .label("rack", &format!("{prefix}-rack-{:04}", i / rack));
                match g.lifecycle.as_deref() {
                    Some("spot") => n = n.label("lifecycle", "spot").taint("lifecycle", "spot"),
                    Some("reserved") => n = n.label("lifecycle", "reserved"),
                    _ => {}
                }
                n.price_per_gpu_hour = prices.resolve_gpu_hour(&n, g.price_per_gpu_hour);
                out.push(n);
            }
        }
        out
    }
}

fn philly_nodes() -> Vec<NodeSpec> {
    let mem: HashMap<&str, &str> = PHILLY_OFFICIAL
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() >= 3).then(|| (f[0], f[2]))
        })
        .collect();
    let mut out = Vec::new();
    let mut idx = 0usize;
    for l in PHILLY_REVISED.lines().skip(1) {
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() < 3 {
            continue;
        }
        let gpus: usize = f[2].parse().unwrap_or(0);
        if gpus == 0 {
            continue;
        }
        let model = match mem.get(f[1]) {
            Some(m) if m.starts_with("12") => GpuModel::K80,
            _ => GpuModel::P40,
        };
        let n = NodeSpec::with_gpus(f[1], model, gpus, MilliCpu::cores(4 * gpus as u64), MiB::gib(32 * gpus as u64))
            .label("zone", "philly")
            .label("rack", &format!("philly-rack-{:03}", idx / 16));
        out.push(n);
        idx += 1;
    }
    out
}

fn pai_nodes() -> Result<Vec<NodeSpec>, SimError> {
    let mut out = Vec::new();
    for (i, l) in PAI_NODES.lines().skip(1).enumerate() {
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        let bad = || SimError::invalid("preset pai2023", format!("malformed node line {}", i + 2));
        if f.len() < 5 {
            return Err(bad());
        }
        let gpus: usize = f[3].parse().map_err(|_| bad())?;
        let model: GpuModel = f[4].parse().map_err(|_| bad())?;
        let cpu: u64 = f[1].parse().map_err(|_| bad())?;
        let mem: u64 = f[2].parse().map_err(|_| bad())?;
        out.push(
            NodeSpec::with_gpus(f[0], model, gpus, MilliCpu(cpu), MiB(mem))
                .label("zone", "pai")
                .label("rack", &format!("pai-rack-{:03}", i / 16)),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(spec: &ClusterSpec) -> usize {
        spec.build_nodes().iter().map(|n| n.gpus.len()).sum()
    }

    #[test]
    fn presets_have_the_published_sizes() {
        assert_eq!(gpus(&ClusterSpec::load("philly").unwrap()), 3205);
        assert_eq!(gpus(&ClusterSpec::load("pai2023").unwrap()), 6212);
        assert_eq!(gpus(&ClusterSpec::load("tiresias-n32g4").unwrap()), 128);
        assert_eq!(gpus(&ClusterSpec::load("tiresias-n256g8").unwrap()), 2048);
        assert_eq!(gpus(&ClusterSpec::load("pollux").unwrap()), 64);
        let philly = ClusterSpec::load("philly").unwrap().build_nodes();
        assert!(philly.iter().any(|n| n.gpu_model() == Some(GpuModel::K80)));
        assert!(philly.iter().any(|n| n.gpu_model() == Some(GpuModel::P40)));
    }

    #[test]
    fn toml_specs_are_validated_with_clear_errors() {
        let ok = ClusterSpec::from_toml(
            "version = 1\n[[node_group]]\ncount = 2\ngpus_per_node = 8\ngpu_model = \"A100-80GB\"\nlifecycle = \"spot\"\n",
            "c.toml",
        )
        .unwrap();
        let nodes = ok.build_nodes();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].taints.len(), 1);
        let e =
            ClusterSpec::from_toml("[[node_group]]\ncount = 2\ngpus_per_node = 8\ngpu_model = \"B300\"\n", "c.toml")
                .unwrap_err()
                .to_string();
        assert!(e.contains("node_group[0]") && e.contains("B300"), "{e}");
        let e = ClusterSpec::from_toml(
            "[[node_group]]\ncount = 2\ngpus_per_node = 8\ngpu_model = \"T4\"\ncolour = 1\n",
            "c.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("colour"), "{e}");
        let e = ClusterSpec::load("nonexistent-preset").unwrap_err().to_string();
        assert!(e.contains("philly") && e.contains("pai2023"), "{e}");
        // At most 100,000 nodes in all (a hundred million aborted the process as it allocated them).
        let groups = |a: u32, b: u32| {
            let g = |n: u32| format!("[[node_group]]\ncount = {n}\ngpus_per_node = 8\ngpu_model = \"T4\"\n");
            ClusterSpec::from_toml(&format!("{}{}", g(a), g(b)), "c.toml")
        };
        assert!(groups(60_000, 40_000).is_ok());
        let e = groups(60_000, 40_001).unwrap_err().to_string();
        assert!(e.contains("its node groups hold 100001 nodes in all; allowed is at most 100000"), "{e}");
        let e = ClusterSpec::from_toml(
            "version = 2\n[[node_group]]\ncount = 1\ngpus_per_node = 8\ngpu_model = \"T4\"\n",
            "c",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("version 2 is unknown; allowed is 1"), "{e}");
    }
}
