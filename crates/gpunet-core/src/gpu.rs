//! The GPU model catalogue: memory, a relative-speed figure, family name for selectors, and MIG profiles.
//!
//! Relative speed is a rough training-throughput factor with the V100 as 1.0, taken from published mixed-precision
//! training benchmarks (ResNet-50 / BERT class models); the simulator uses it to scale a job's measured duration when it
//! runs on a model other than the one it was measured on. It is a model of "typical" jobs, not a promise for any one.

use crate::error::CoreError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A GPU model known to gpunet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuModel {
    /// NVIDIA K80 (12 GB per GPU die).
    K80,
    /// NVIDIA P100 16 GB.
    P100,
    /// NVIDIA P40 24 GB (Philly's 8-GPU machines).
    P40,
    /// NVIDIA T4 16 GB.
    T4,
    /// NVIDIA V100 16 GB.
    #[serde(rename = "V100-16GB")]
    V100_16GB,
    /// NVIDIA V100 32 GB.
    #[serde(rename = "V100-32GB")]
    V100_32GB,
    /// NVIDIA A10 24 GB.
    A10,
    /// NVIDIA L40S 48 GB.
    L40S,
    /// NVIDIA A100 40 GB.
    #[serde(rename = "A100-40GB")]
    A100_40GB,
    /// NVIDIA A100 80 GB.
    #[serde(rename = "A100-80GB")]
    A100_80GB,
    /// NVIDIA H100 80 GB.
    #[serde(rename = "H100-80GB")]
    H100_80GB,
    /// NVIDIA H200 141 GB.
    #[serde(rename = "H200-141GB")]
    H200_141GB,
    /// Undisclosed GPU type `G1` of the Alibaba PAI 2023 trace (memory and speed unknown; speed taken as 1.0).
    G1,
    /// Undisclosed GPU type `G2` of the Alibaba PAI 2023 trace.
    G2,
    /// Undisclosed GPU type `G3` of the Alibaba PAI 2023 trace.
    G3,
}

/// A MIG profile: `Ng.Mgb` (N compute slices of 7, M GB of memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MigProfile {
    /// Compute slices (1..=7).
    pub compute: u8,
    /// Memory in GB.
    pub memory_gb: u16,
}

impl MigProfile {
    const fn new(compute: u8, memory_gb: u16) -> MigProfile {
        MigProfile { compute, memory_gb }
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb", self.compute, self.memory_gb)
    }
}

impl FromStr for MigProfile {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let bad = || CoreError::InvalidField {
            field: "mig_profile",
            value: s.to_string(),
            allowed: "a profile like 1g.10gb, 3g.40gb or 7g.80gb".into(),
        };
        let lower = s.trim().to_ascii_lowercase();
        let (c, m) = lower.split_once("g.").ok_or_else(bad)?;
        let m = m.strip_suffix("gb").ok_or_else(bad)?;
        let compute: u8 = c.parse().map_err(|_| bad())?;
        let memory_gb: u16 = m.parse().map_err(|_| bad())?;
        if !(1..=7).contains(&compute) {
            return Err(bad());
        }
        Ok(MigProfile { compute, memory_gb })
    }
}

const A100_40_MIG: &[MigProfile] = &[
    MigProfile::new(1, 5),
    MigProfile::new(1, 10),
    MigProfile::new(2, 10),
    MigProfile::new(3, 20),
    MigProfile::new(4, 20),
    MigProfile::new(7, 40),
];
const A100_80_MIG: &[MigProfile] = &[
    MigProfile::new(1, 10),
    MigProfile::new(1, 20),
    MigProfile::new(2, 20),
    MigProfile::new(3, 40),
    MigProfile::new(4, 40),
    MigProfile::new(7, 80),
];
const H200_MIG: &[MigProfile] = &[
    MigProfile::new(1, 18),
    MigProfile::new(1, 35),
    MigProfile::new(2, 35),
    MigProfile::new(3, 71),
    MigProfile::new(4, 71),
    MigProfile::new(7, 141),
];

impl GpuModel {
    /// Every model, in catalogue order.
    pub const ALL: [GpuModel; 15] = [
        GpuModel::K80,
        GpuModel::P100,
        GpuModel::P40,
        GpuModel::T4,
        GpuModel::V100_16GB,
        GpuModel::V100_32GB,
        GpuModel::A10,
        GpuModel::L40S,
        GpuModel::A100_40GB,
        GpuModel::A100_80GB,
        GpuModel::H100_80GB,
        GpuModel::H200_141GB,
        GpuModel::G1,
        GpuModel::G2,
        GpuModel::G3,
    ];

    /// Dense index of the model in [`GpuModel::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Canonical name, as accepted by [`FromStr`] and printed by [`fmt::Display`].
    pub const fn name(self) -> &'static str {
        match self {
            GpuModel::K80 => "K80",
            GpuModel::P100 => "P100",
            GpuModel::P40 => "P40",
            GpuModel::T4 => "T4",
            GpuModel::V100_16GB => "V100-16GB",
            GpuModel::V100_32GB => "V100-32GB",
            GpuModel::A10 => "A10",
            GpuModel::L40S => "L40S",
            GpuModel::A100_40GB => "A100-40GB",
            GpuModel::A100_80GB => "A100-80GB",
            GpuModel::H100_80GB => "H100-80GB",
            GpuModel::H200_141GB => "H200-141GB",
            GpuModel::G1 => "G1",
            GpuModel::G2 => "G2",
            GpuModel::G3 => "G3",
        }
    }

    /// Family name in lower case, used for the `gpu-type` node label (`gpu-type=v100` matches both V100 sizes).
    pub const fn family(self) -> &'static str {
        match self {
            GpuModel::K80 => "k80",
            GpuModel::P100 => "p100",
            GpuModel::P40 => "p40",
            GpuModel::T4 => "t4",
            GpuModel::V100_16GB | GpuModel::V100_32GB => "v100",
            GpuModel::A10 => "a10",
            GpuModel::L40S => "l40s",
            GpuModel::A100_40GB | GpuModel::A100_80GB => "a100",
            GpuModel::H100_80GB => "h100",
            GpuModel::H200_141GB => "h200",
            GpuModel::G1 => "g1",
            GpuModel::G2 => "g2",
            GpuModel::G3 => "g3",
        }
    }

    /// Memory per GPU in MiB (0 where unknown).
    pub const fn memory_mib(self) -> u64 {
        let gb = match self {
            GpuModel::K80 => 12,
            GpuModel::P100 | GpuModel::T4 | GpuModel::V100_16GB => 16,
            GpuModel::V100_32GB => 32,
            GpuModel::A10 | GpuModel::P40 => 24,
            GpuModel::G1 | GpuModel::G2 | GpuModel::G3 => 0,
            GpuModel::L40S => 48,
            GpuModel::A100_40GB => 40,
            GpuModel::A100_80GB | GpuModel::H100_80GB => 80,
            GpuModel::H200_141GB => 141,
        };
        gb * 1024
    }

    /// Training throughput relative to a V100 (1.0). See the module docs for what this models.
    pub const fn relative_speed(self) -> f64 {
        match self {
            GpuModel::K80 => 0.2,
            GpuModel::P100 => 0.5,
            GpuModel::P40 => 0.45,
            GpuModel::G1 | GpuModel::G2 | GpuModel::G3 => 1.0,
            GpuModel::T4 => 0.4,
            GpuModel::V100_16GB => 1.0,
            GpuModel::V100_32GB => 1.05,
            GpuModel::A10 => 0.8,
            GpuModel::L40S => 1.6,
            GpuModel::A100_40GB => 2.2,
            GpuModel::A100_80GB => 2.4,
            GpuModel::H100_80GB => 4.0,
            GpuModel::H200_141GB => 4.6,
        }
    }

    /// MIG profiles this model supports; empty when it has no MIG.
    pub const fn mig_profiles(self) -> &'static [MigProfile] {
        match self {
            GpuModel::A100_40GB => A100_40_MIG,
            GpuModel::A100_80GB | GpuModel::H100_80GB => A100_80_MIG,
            GpuModel::H200_141GB => H200_MIG,
            _ => &[],
        }
    }

    /// Whether `profile` is a MIG profile of this model.
    pub fn supports_mig(self, profile: MigProfile) -> bool {
        self.mig_profiles().contains(&profile)
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GpuModel {
    type Err = CoreError;
    /// Accepts canonical names case-insensitively, with `_`, `-` or nothing between model and size, plus the common
    /// aliases of trace files (`V100` is the 16 GB part, `A100` the 40 GB part, `H100` the 80 GB part,
    /// `H200` the 141 GB part, `A100-SXM4-80GB` style names).
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let norm: String = s.trim().to_ascii_uppercase().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        let m = match norm.as_str() {
            "K80" | "TESLAK80" => GpuModel::K80,
            "P100" | "TESLAP100" | "P10016GB" => GpuModel::P100,
            "P40" | "TESLAP40" | "P4024GB" => GpuModel::P40,
            "G1" => GpuModel::G1,
            "G2" => GpuModel::G2,
            "G3" => GpuModel::G3,
            "T4" | "TESLAT4" | "T416GB" => GpuModel::T4,
            "V100" | "V10016GB" | "TESLAV100" | "V100SXM216GB" | "V100PCIE16GB" => GpuModel::V100_16GB,
            "V10032GB" | "V100M32" | "V100SXM232GB" | "V100PCIE32GB" => GpuModel::V100_32GB,
            "V100M16" => GpuModel::V100_16GB,
            "A10" | "A1024GB" => GpuModel::A10,
            "L40S" | "L40S48GB" => GpuModel::L40S,
            "A100" | "A10040GB" | "A100SXM440GB" | "A100PCIE40GB" => GpuModel::A100_40GB,
            "A10080GB" | "A100SXM480GB" | "A100PCIE80GB" => GpuModel::A100_80GB,
            "H100" | "H10080GB" | "H100SXM580GB" | "H100PCIE80GB" | "H10080GBHBM3" => GpuModel::H100_80GB,
            "H200" | "H200141GB" | "H200SXM141GB" => GpuModel::H200_141GB,
            _ => {
                return Err(CoreError::InvalidField {
                    field: "gpu_model",
                    value: s.to_string(),
                    allowed: GpuModel::ALL.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
                })
            }
        };
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_for_every_model() {
        for m in GpuModel::ALL {
            assert_eq!(m.name().parse::<GpuModel>().unwrap(), m);
            assert_eq!(GpuModel::ALL[m.index()], m);
        }
    }

    #[test]
    fn aliases_and_case_are_accepted() {
        assert_eq!("v100".parse::<GpuModel>().unwrap(), GpuModel::V100_16GB);
        assert_eq!("A100-SXM4-80GB".parse::<GpuModel>().unwrap(), GpuModel::A100_80GB);
        assert_eq!("h200".parse::<GpuModel>().unwrap(), GpuModel::H200_141GB);
    }

    #[test]
    fn unknown_model_error_lists_what_is_allowed() {
        let e = "B300".parse::<GpuModel>().unwrap_err().to_string();
        assert!(e.contains("gpu_model"), "{e}");
        assert!(e.contains("B300"), "{e}");
        assert!(e.contains("H100-80GB"), "{e}");
    }

    #[test]
    fn mig_profiles_parse_and_belong_to_models() {
        let p: MigProfile = "1g.10gb".parse().unwrap();
        assert_eq!(p, MigProfile { compute: 1, memory_gb: 10 });
        assert!(GpuModel::A100_80GB.supports_mig(p));
        assert!(GpuModel::H100_80GB.supports_mig("7g.80gb".parse().unwrap()));
        assert!(GpuModel::H200_141GB.supports_mig("3g.71gb".parse().unwrap()));
        assert!(!GpuModel::V100_16GB.supports_mig(p));
        assert!("8g.10gb".parse::<MigProfile>().is_err());
        assert!("1g10gb".parse::<MigProfile>().is_err());
    }

    #[test]
    fn memory_and_speed_are_ordered_sensibly() {
        assert!(GpuModel::H200_141GB.memory_mib() > GpuModel::H100_80GB.memory_mib());
        assert!(GpuModel::H100_80GB.relative_speed() > GpuModel::A100_80GB.relative_speed());
        assert!(GpuModel::K80.relative_speed() < GpuModel::V100_16GB.relative_speed());
    }
}
