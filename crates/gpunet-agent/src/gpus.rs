//! GPU discovery and sampling through NVML. `nvml-wrapper` opens `libnvidia-ml.so` at run time, so the agent builds
//! and runs without NVIDIA software; [`discover`] then says that NVML is absent and the caller decides (fake GPUs
//! when asked, or none).
//!
//! What NVML gives is turned into the scheduler's [`GpuDevice`]s: the model from the product name and memory, the
//! NUMA node, NVLink domains (connected components of active NVLink links between this node's GPUs), PCIe switches
//! (GPUs whose common ancestor is at most a PCIe switch), and MIG instances where MIG is on.

use gpunet_api::agent::GpuSample;
use gpunet_core::{GpuDevice, GpuModel, MigProfile};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor, TopologyLevel};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;

/// Why no GPUs were discovered.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The NVML library is not installed or did not initialise (no NVIDIA driver).
    #[error("NVML is not available: {0}")]
    NoNvml(String),
    /// NVML failed on a query.
    #[error("NVML {what}: {reason}")]
    Query {
        /// What was asked.
        what: String,
        /// NVML's error.
        reason: String,
    },
    /// A GPU that the scheduler's catalogue does not know.
    #[error("GPU {index} is a {name:?} with {memory_mib} MiB, which is not in gpunet's GPU catalogue ({known}); use --fake-gpus to describe it")]
    UnknownModel {
        /// Index.
        index: u32,
        /// NVML's product name.
        name: String,
        /// Memory.
        memory_mib: u64,
        /// Known models.
        known: String,
    },
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredGpu {
    /// NVML index.
    pub index: u32,
    /// Product name (`NVIDIA H200`).
    pub name: String,
    /// The catalogue model.
    pub model: GpuModel,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// PCI bus id (`00000000:3B:00.0`).
    pub pci_bus_id: String,
    /// NUMA node (0 where the platform does not say).
    pub numa: u8,
    /// MIG mode is on.
    pub mig_enabled: bool,
    /// MIG instances (profiles) when MIG is on.
    pub mig: Vec<MigProfile>,
    /// Their MIG UUIDs, in the same order.
    pub mig_uuids: Vec<String>,
    /// Indexes of this node's GPUs reached over an active NVLink.
    pub nvlink_peers: Vec<u32>,
    /// Indexes of this node's GPUs behind the same PCIe switch.
    pub pcie_peers: Vec<u32>,
}

/// Maps NVML's product name and memory to the catalogue.
pub fn model_from_nvml(name: &str, memory_mib: u64) -> Option<GpuModel> {
    let n = name.to_ascii_uppercase();
    let gib = memory_mib as f64 / 1024.0;
    let has = |s: &str| n.contains(s);
    Some(if has("H200") {
        GpuModel::H200_141GB
    } else if has("H100") {
        GpuModel::H100_80GB
    } else if has("A100") {
        if gib > 48.0 {
            GpuModel::A100_80GB
        } else {
            GpuModel::A100_40GB
        }
    } else if has("L40S") {
        GpuModel::L40S
    } else if has("A10") && !has("A100") {
        GpuModel::A10
    } else if has("V100") {
        if gib > 20.0 {
            GpuModel::V100_32GB
        } else {
            GpuModel::V100_16GB
        }
    } else if has("T4") {
        GpuModel::T4
    } else if has("P100") {
        GpuModel::P100
    } else if has("P40") {
        GpuModel::P40
    } else if has("K80") {
        GpuModel::K80
    } else {
        return None;
    })
}

/// A MIG profile from a MIG device's name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`).
pub fn mig_profile_from_name(name: &str) -> Option<MigProfile> {
    name.split_whitespace().rev().find_map(|w| w.parse::<MigProfile>().ok())
}

/// Connected components of `n` GPUs under the given peer lists, numbered from 0 in index order.
pub fn components(n: usize, peers: impl Fn(usize) -> Vec<usize>) -> Vec<u8> {
    let mut comp = vec![u8::MAX; n];
    let mut next = 0u8;
    for start in 0..n {
        if comp[start] != u8::MAX {
            continue;
        }
        let mut stack = vec![start];
        comp[start] = next;
        while let Some(i) = stack.pop() {
            for j in peers(i) {
                if j < n && comp[j] == u8::MAX {
                    comp[j] = next;
                    stack.push(j);
                }
            }
        }
        next = next.saturating_add(1);
    }
    comp
}

/// The scheduler's view of discovered GPUs (in index order).
pub fn to_devices(gpus: &[DiscoveredGpu]) -> Vec<GpuDevice> {
    let pos = |idx: u32| gpus.iter().position(|g| g.index == idx);
    let nvlink = components(gpus.len(), |i| gpus[i].nvlink_peers.iter().filter_map(|p| pos(*p)).collect());
    let pcie = components(gpus.len(), |i| gpus[i].pcie_peers.iter().filter_map(|p| pos(*p)).collect());
    gpus.iter()
        .enumerate()
        .map(|(i, g)| GpuDevice {
            model: g.model,
            numa: g.numa,
            nvlink_domain: nvlink[i],
            pcie_switch: pcie[i],
            mig: g.mig.clone(),
        })
        .collect()
}

fn q<T>(what: &str, r: Result<T, nvml_wrapper::error::NvmlError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::Query { what: what.to_string(), reason: e.to_string() })
}

/// Opens NVML.
pub fn open() -> Result<Nvml, GpuError> {
    Nvml::init().map_err(|e| GpuError::NoNvml(e.to_string()))
}

fn normal_bus_id(s: &str) -> String {
    // NVML writes an 8-digit PCI domain (`00000000:3B:00.0`); sysfs a 4-digit one (`0000:3b:00.0`).
    let s = s.trim_end_matches('\0').to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => s,
    }
}

fn sysfs_numa(bus_id: &str) -> Option<u8> {
    let v = std::fs::read_to_string(format!("/sys/bus/pci/devices/{}/numa_node", normal_bus_id(bus_id))).ok()?;
    v.trim().parse::<i32>().ok().filter(|n| *n >= 0).map(|n| n.min(255) as u8)
}

/// Every GPU NVML sees, with its topology.
pub fn discover(nvml: &Nvml) -> Result<Vec<DiscoveredGpu>, GpuError> {
    let count = q("device count", nvml.device_count())?;
    let mut out = Vec::new();
    let mut bus_ids = Vec::new();
    for index in 0..count {
        let d = q("device handle", nvml.device_by_index(index))?;
        let name = q("name", d.name())?;
        let mem = q("memory", d.memory_info())?;
        let memory_mib = mem.total / (1024 * 1024);
        let model = model_from_nvml(&name, memory_mib).ok_or_else(|| GpuError::UnknownModel {
            index,
            name: name.clone(),
            memory_mib,
            known: GpuModel::ALL.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
        })?;
        let pci = q("PCI info", d.pci_info())?;
        let numa = d.numa_node_id().ok().map(|n| n.min(255) as u8).or_else(|| sysfs_numa(&pci.bus_id)).unwrap_or(0);
        let mig_enabled = d.mig_mode().is_ok_and(|m| m.current == 1);
        let mut mig = Vec::new();
        let mut mig_uuids = Vec::new();
        if mig_enabled {
            for i in 0..d.mig_device_count().unwrap_or(0) {
                let Ok(m) = d.mig_device_by_index(i) else { continue };
                if let (Some(p), Ok(uuid)) = (m.name().ok().and_then(|n| mig_profile_from_name(&n)), m.uuid()) {
                    mig.push(p);
                    mig_uuids.push(uuid);
                }
            }
        }
        bus_ids.push(normal_bus_id(&pci.bus_id));
        out.push(DiscoveredGpu {
            index,
            name,
            model,
            uuid: q("UUID", d.uuid())?,
            memory_mib,
            pci_bus_id: pci.bus_id,
            numa,
            mig_enabled,
            mig,
            mig_uuids,
            nvlink_peers: Vec::new(),
            pcie_peers: Vec::new(),
        });
    }
    // NVLink: active links whose far end is another GPU of this node.
    for g in out.iter_mut() {
        let d = q("device handle", nvml.device_by_index(g.index))?;
        for link in 0..MAX_NVLINKS {
            let l = d.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            if let Ok(remote) = l.remote_pci_info() {
                let r = normal_bus_id(&remote.bus_id);
                if let Some(p) = bus_ids.iter().position(|b| *b == r) {
                    if p as u32 != g.index && !g.nvlink_peers.contains(&(p as u32)) {
                        g.nvlink_peers.push(p as u32);
                    }
                }
            }
        }
    }
    // PCIe: pairs whose nearest common ancestor is a PCIe switch (or the same board).
    for i in 0..out.len() {
        for j in i + 1..out.len() {
            let a = q("device handle", nvml.device_by_index(out[i].index))?;
            let b = q("device handle", nvml.device_by_index(out[j].index))?;
            let near = matches!(
                a.topology_common_ancestor(b),
                Ok(TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple)
            );
            if near {
                let (x, y) = (out[i].index, out[j].index);
                out[i].pcie_peers.push(y);
                out[j].pcie_peers.push(x);
            }
        }
    }
    Ok(out)
}

/// Links NVML may report per GPU (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;
/// NVLink data counters (KiB, cumulative) of NVML's field-value API.
const NVLINK_TX_KIB: u32 = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
const NVLINK_RX_KIB: u32 = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;

fn as_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U64(x) => Some(x),
        SampleValue::U32(x) => Some(x as u64),
        SampleValue::I64(x) => u64::try_from(x).ok(),
        SampleValue::F64(x) if x >= 0.0 => Some(x as u64),
        SampleValue::F64(_) => None,
    }
}

/// One sample of every GPU, with the XID errors `xid` counted (see [`crate::gpu_errors::watch_xid`]). Values NVML
/// cannot give on this GPU are left out, never made up.
pub fn sample(nvml: &Nvml, xid: &crate::gpu_errors::XidCounts) -> Vec<GpuSample> {
    let count = nvml.device_count().unwrap_or(0);
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count {
        let Ok(d) = nvml.device_by_index(index) else { continue };
        let mem = d.memory_info().ok();
        let mut s = GpuSample {
            index,
            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu as f64),
            memory_used_mib: mem.as_ref().map(|m| m.used / (1024 * 1024)),
            memory_total_mib: mem.as_ref().map(|m| m.total / (1024 * 1024)),
            power_watts: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok().map(|t| t as f64),
            nvlink_tx_bytes: None,
            nvlink_rx_bytes: None,
            // Volatile counts (since the driver loaded): NVML refuses where ECC is off, and then none is sent.
            ecc_corrected: d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile).ok(),
            ecc_uncorrected: d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
            xid_errors: xid.of(index).map(|x| x.count),
            xid_last: xid.of(index).map(|x| x.last),
        };
        if let Ok(vals) = d.field_values_for(&[FieldId(NVLINK_TX_KIB), FieldId(NVLINK_RX_KIB)]) {
            for v in vals.into_iter().flatten() {
                let Some(x) = v.value.as_ref().ok().and_then(as_u64) else { continue };
                match v.field.0 {
                    NVLINK_TX_KIB => s.nvlink_tx_bytes = Some(x * 1024),
                    NVLINK_RX_KIB => s.nvlink_rx_bytes = Some(x * 1024),
                    _ => {}
                }
            }
        }
        out.push(s);
    }
    out
}

/// A synthetic sample of fake GPU `index` (`--fake-gpu-samples`), `secs` seconds after the agent started: the same
/// numbers on every machine — held by a task (`busy`): 50 % utilisation, a quarter of the model's memory in use,
/// 100 W; free: idle, no memory in use, 30 W (so that a free GPU raises no leak alert) — 40 °C, 1 MB/s of NVLink
/// traffic each way, and the errors `errors` lists (from [`crate::gpu_errors::FAKE_ERRORS_FILE`]; none unless a
/// test or a person writes them there). It describes no hardware; the server exports every sample of a fake node
/// with `fake="true"`. It exists so that dashboards and alert rules can be checked end to end without NVIDIA GPUs.
pub fn fake_sample(
    index: u32,
    model: GpuModel,
    secs: u64,
    busy: bool,
    errors: &crate::gpu_errors::FakeErrors,
) -> GpuSample {
    GpuSample {
        index,
        utilization_pct: Some(if busy { 50.0 } else { 0.0 }),
        memory_used_mib: Some(if busy { model.memory_mib() / 4 } else { 0 }),
        memory_total_mib: Some(model.memory_mib()),
        power_watts: Some(if busy { 100.0 } else { 30.0 }),
        temperature_c: Some(40.0),
        nvlink_tx_bytes: Some(secs * 1_000_000),
        nvlink_rx_bytes: Some(secs * 1_000_000),
        ecc_corrected: Some(errors.ecc_corrected),
        ecc_uncorrected: Some(errors.ecc_uncorrected),
        xid_errors: Some(errors.xid.count),
        xid_last: Some(errors.xid.last),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fake_samples_are_fixed_numbers_with_counters_that_grow() {
        let none = crate::gpu_errors::FakeErrors::default();
        let a = super::fake_sample(3, super::GpuModel::A100_80GB, 10, true, &none);
        let b = super::fake_sample(3, super::GpuModel::A100_80GB, 20, true, &none);
        assert_eq!((a.xid_errors, a.ecc_uncorrected), (Some(0), Some(0)), "no errors unless listed");
        let (errs, _) = crate::gpu_errors::parse_fake_errors("3 xid 79\n3 ecc-uncorrected 2\n");
        let c = super::fake_sample(3, super::GpuModel::A100_80GB, 30, true, &errs[&3]);
        assert_eq!((c.xid_errors, c.xid_last, c.ecc_uncorrected), (Some(1), Some(79), Some(2)));
        assert_eq!((a.index, a.utilization_pct, a.memory_total_mib), (3, Some(50.0), Some(81_920)));
        assert_eq!(a.memory_used_mib, Some(20_480));
        assert!(b.nvlink_tx_bytes > a.nvlink_tx_bytes && b.nvlink_rx_bytes > a.nvlink_rx_bytes);
        assert_eq!((a.utilization_pct, a.memory_used_mib), (b.utilization_pct, b.memory_used_mib));
        // A GPU no task holds is idle and holds no memory (no GpuMemoryLeak alert on a free fake GPU).
        let free = super::fake_sample(3, super::GpuModel::A100_80GB, 10, false, &none);
        assert_eq!((free.utilization_pct, free.memory_used_mib), (Some(0.0), Some(0)));
    }

    use super::*;

    #[test]
    fn nvml_product_names_map_to_the_catalogue() {
        let cases = [
            ("NVIDIA H200", 143_771, GpuModel::H200_141GB),
            ("NVIDIA H100 80GB HBM3", 81_559, GpuModel::H100_80GB),
            ("NVIDIA A100-SXM4-80GB", 81_920, GpuModel::A100_80GB),
            ("NVIDIA A100-PCIE-40GB", 40_960, GpuModel::A100_40GB),
            ("Tesla V100-SXM2-32GB", 32_768, GpuModel::V100_32GB),
            ("Tesla V100-PCIE-16GB", 16_160, GpuModel::V100_16GB),
            ("Tesla T4", 15_360, GpuModel::T4),
            ("NVIDIA A10", 23_028, GpuModel::A10),
            ("NVIDIA L40S", 46_068, GpuModel::L40S),
            ("Tesla P100-PCIE-16GB", 16_280, GpuModel::P100),
            ("Tesla K80", 11_441, GpuModel::K80),
        ];
        for (name, mib, want) in cases {
            assert_eq!(model_from_nvml(name, mib), Some(want), "{name}");
        }
        assert_eq!(model_from_nvml("NVIDIA GeForce RTX 4090", 24_564), None);
    }

    #[test]
    fn mig_profiles_come_from_mig_device_names() {
        assert_eq!(
            mig_profile_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb").map(|p| p.to_string()),
            Some("1g.5gb".into())
        );
        assert_eq!(mig_profile_from_name("NVIDIA H200 MIG 3g.71gb").map(|p| p.to_string()), Some("3g.71gb".into()));
        assert_eq!(mig_profile_from_name("NVIDIA H200"), None);
    }

    #[test]
    fn nvlink_and_pcie_groups_are_connected_components() {
        let gpu = |index: u32, nvlink: &[u32], pcie: &[u32]| DiscoveredGpu {
            index,
            name: "NVIDIA H100 80GB HBM3".into(),
            model: GpuModel::H100_80GB,
            uuid: format!("GPU-{index}"),
            memory_mib: 81_559,
            pci_bus_id: format!("00000000:{:02X}:00.0", index + 1),
            numa: (index / 2) as u8,
            mig_enabled: false,
            mig: Vec::new(),
            mig_uuids: Vec::new(),
            nvlink_peers: nvlink.to_vec(),
            pcie_peers: pcie.to_vec(),
        };
        // Two NVLink islands {0,1,2} and {3}; PCIe switches {0,1} and {2,3}.
        let gpus = [gpu(0, &[1], &[1]), gpu(1, &[0, 2], &[0]), gpu(2, &[1], &[3]), gpu(3, &[], &[2])];
        let d = to_devices(&gpus);
        assert_eq!(d.iter().map(|g| g.nvlink_domain).collect::<Vec<_>>(), vec![0, 0, 0, 1]);
        assert_eq!(d.iter().map(|g| g.pcie_switch).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
        assert_eq!(d.iter().map(|g| g.numa).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
    }

    #[test]
    fn bus_ids_are_compared_in_one_form() {
        assert_eq!(normal_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normal_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn without_an_nvidia_driver_discovery_says_so() {
        // On a machine with NVIDIA GPUs this finds them; elsewhere NVML is absent and nothing is invented.
        match open() {
            Ok(nvml) => {
                let gpus = discover(&nvml).unwrap();
                assert!(gpus.iter().all(|g| g.uuid.starts_with("GPU-") && g.memory_mib > 0), "{gpus:?}");
                assert_eq!(sample(&nvml, &crate::gpu_errors::XidCounts::default()).len(), gpus.len());
            }
            Err(e) => assert!(matches!(e, GpuError::NoNvml(_)), "{e}"),
        }
    }
}
