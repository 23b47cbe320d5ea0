//! Units in types: points in time, spans of time, CPU millicores, memory in MiB, and resource vectors.
//! All times are milliseconds on a clock chosen by the driver (Unix time live, virtual time in the simulator); the core
//! never reads a clock.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// A point in time, in milliseconds since the driver's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Time(pub u64);

/// A span of time in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Dur(pub u64);

impl Time {
    /// The epoch.
    pub const ZERO: Time = Time(0);
    /// The end of time; used for "never".
    pub const MAX: Time = Time(u64::MAX);
    /// A time `s` seconds after the epoch.
    pub const fn from_secs(s: u64) -> Time {
        Time(s.saturating_mul(1000))
    }
    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
    /// The span from `earlier` to `self`, zero if `earlier` is later.
    pub const fn since(self, earlier: Time) -> Dur {
        Dur(self.0.saturating_sub(earlier.0))
    }
}

impl Dur {
    /// No time.
    pub const ZERO: Dur = Dur(0);
    /// Forever; used for "no estimate".
    pub const MAX: Dur = Dur(u64::MAX);
    /// `s` seconds.
    pub const fn from_secs(s: u64) -> Dur {
        Dur(s.saturating_mul(1000))
    }
    /// `m` minutes.
    pub const fn from_mins(m: u64) -> Dur {
        Dur(m.saturating_mul(60_000))
    }
    /// `h` hours.
    pub const fn from_hours(h: u64) -> Dur {
        Dur(h.saturating_mul(3_600_000))
    }
    /// Milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0
    }
    /// Seconds as a float.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl Add<Dur> for Time {
    type Output = Time;
    fn add(self, d: Dur) -> Time {
        Time(self.0.saturating_add(d.0))
    }
}

impl Sub<Dur> for Time {
    type Output = Time;
    fn sub(self, d: Dur) -> Time {
        Time(self.0.saturating_sub(d.0))
    }
}

impl Add for Dur {
    type Output = Dur;
    fn add(self, d: Dur) -> Dur {
        Dur(self.0.saturating_add(d.0))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0 / 1000;
        if *self == Dur::MAX {
            write!(f, "unknown")
        } else if s >= 3600 {
            write!(f, "{}h{:02}m", s / 3600, (s % 3600) / 60)
        } else if s >= 60 {
            write!(f, "{}m{:02}s", s / 60, s % 60)
        } else {
            write!(f, "{}.{:03}s", s, self.0 % 1000)
        }
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{}", Dur(self.0))
    }
}

/// CPU in thousandths of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MilliCpu(pub u64);

/// Memory in mebibytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MiB(pub u64);

impl MilliCpu {
    /// `n` whole cores.
    pub const fn cores(n: u64) -> MilliCpu {
        MilliCpu(n * 1000)
    }
}

impl MiB {
    /// `n` GiB.
    pub const fn gib(n: u64) -> MiB {
        MiB(n * 1024)
    }
}

macro_rules! unit_ops {
    ($t:ident) => {
        impl Add for $t {
            type Output = $t;
            fn add(self, o: $t) -> $t {
                $t(self.0.saturating_add(o.0))
            }
        }
        impl Sub for $t {
            type Output = $t;
            fn sub(self, o: $t) -> $t {
                $t(self.0.saturating_sub(o.0))
            }
        }
        impl AddAssign for $t {
            fn add_assign(&mut self, o: $t) {
                self.0 = self.0.saturating_add(o.0);
            }
        }
        impl SubAssign for $t {
            fn sub_assign(&mut self, o: $t) {
                self.0 = self.0.saturating_sub(o.0);
            }
        }
    };
}
unit_ops!(MilliCpu);
unit_ops!(MiB);

impl fmt::Display for MilliCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{} CPU", self.0 / 1000)
        } else {
            write!(f, "{}m CPU", self.0)
        }
    }
}

impl fmt::Display for MiB {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1024) {
            write!(f, "{} GiB", self.0 / 1024)
        } else {
            write!(f, "{} MiB", self.0)
        }
    }
}

/// GPUs, CPU and memory together: what a task asks for or what a node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Resources {
    /// Whole GPUs (a MIG slice counts as none here; see `GpuRequest`).
    pub gpus: u32,
    /// CPU millicores.
    pub cpu: MilliCpu,
    /// Memory.
    pub mem: MiB,
}

impl Resources {
    /// Nothing.
    pub const ZERO: Resources = Resources { gpus: 0, cpu: MilliCpu(0), mem: MiB(0) };

    /// `self` scaled by `n` tasks.
    pub fn times(self, n: u32) -> Resources {
        Resources {
            gpus: self.gpus.saturating_mul(n),
            cpu: MilliCpu(self.cpu.0.saturating_mul(n as u64)),
            mem: MiB(self.mem.0.saturating_mul(n as u64)),
        }
    }

    /// Whether `self` fits within `avail` in every dimension.
    pub fn fits_in(&self, avail: &Resources) -> bool {
        self.gpus <= avail.gpus && self.cpu <= avail.cpu && self.mem <= avail.mem
    }
}

impl Add for Resources {
    type Output = Resources;
    fn add(self, o: Resources) -> Resources {
        Resources { gpus: self.gpus.saturating_add(o.gpus), cpu: self.cpu + o.cpu, mem: self.mem + o.mem }
    }
}

impl Sub for Resources {
    type Output = Resources;
    fn sub(self, o: Resources) -> Resources {
        Resources { gpus: self.gpus.saturating_sub(o.gpus), cpu: self.cpu - o.cpu, mem: self.mem - o.mem }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_arithmetic_saturates() {
        assert_eq!(Time(5).since(Time(10)), Dur::ZERO);
        assert_eq!(Time::MAX + Dur(1), Time::MAX);
        assert_eq!(Time::from_secs(3) + Dur::from_secs(2), Time(5000));
    }

    #[test]
    fn durations_print_for_humans() {
        assert_eq!(Dur::from_secs(3725).to_string(), "1h02m");
        assert_eq!(Dur::from_secs(75).to_string(), "1m15s");
        assert_eq!(Dur(1500).to_string(), "1.500s");
        assert_eq!(MiB::gib(32).to_string(), "32 GiB");
        assert_eq!(MilliCpu(1500).to_string(), "1500m CPU");
    }

    #[test]
    fn resources_fit_per_dimension() {
        let a = Resources { gpus: 2, cpu: MilliCpu(100), mem: MiB(10) };
        let b = Resources { gpus: 2, cpu: MilliCpu(99), mem: MiB(10) };
        assert!(!a.fits_in(&b));
        assert!(b.fits_in(&a));
        assert_eq!(a.times(3).gpus, 6);
    }
}
