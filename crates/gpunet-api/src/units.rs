//! Parsing of human quantities: durations (`90s`, `10m`, `1h30m`, `2d`), CPU (`8`, `500m`, `1.5`) and memory (`32Gi`,
//! `512Mi`, `1G`, plain bytes), as Kubernetes and gpunet specs write them.

use crate::error::ApiError;
use gpunet_core::{Dur, MiB, MilliCpu};

/// The longest duration accepted (10 years, in ms): nothing is saturated or wrapped silently.
pub const MAX_DURATION_MS: u64 = 10 * 365 * 86_400_000;
/// The most CPU accepted, in millicores (a billion cores; quotas of whole clusters fit).
pub const MAX_MILLI_CPU: u64 = 1_000_000_000_000;
/// The most memory accepted, in MiB (1 EiB).
pub const MAX_MIB: u64 = 1 << 40;
/// The most GPUs a quota may name.
pub const MAX_GPUS: u64 = 1_000_000;

/// Parses a duration: a sequence of number+unit (`ms`, `s`, `m`, `h`, `d`), e.g. `1h30m`; a bare number is seconds.
pub fn parse_duration(field: &str, s: &str) -> Result<Dur, ApiError> {
    let bad = || ApiError::invalid(field, s, "a duration like 90s, 10m, 1h30m or 2d, at most 3650d");
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let bounded = |ms: f64| {
        if ms.is_finite() && ms >= 0.0 && ms.round() <= MAX_DURATION_MS as f64 {
            Ok(Dur(ms.round() as u64))
        } else {
            Err(bad())
        }
    };
    if let Ok(secs) = t.parse::<f64>() {
        return bounded(secs * 1000.0);
    }
    let mut total: f64 = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        if n_end == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..n_end].parse().map_err(|_| bad())?;
        rest = &rest[n_end..];
        let u_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let mult = match &rest[..u_end] {
            "ms" => 1.0,
            "s" => 1000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            _ => return Err(bad()),
        };
        total += n * mult;
        if !total.is_finite() || total > MAX_DURATION_MS as f64 {
            return Err(bad());
        }
        rest = &rest[u_end..];
    }
    bounded(total)
}

/// A duration in ms as people write it, the two largest units: `1d4h`, `2h5m`, `3m20s`, `45s`, `250ms`; what
/// [`parse_duration`] reads back (to within the dropped smaller units).
pub fn format_duration_ms(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let parts = [(d, "d"), (h, "h"), (m, "m"), (sec, "s")];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut out = format!("{}{}", parts[first].0, parts[first].1);
    if let Some((n, u)) = parts.get(first + 1).filter(|(n, _)| *n > 0) {
        out += &format!("{n}{u}");
    }
    out
}

/// Parses CPU: cores (`8`, `1.5`) or millicores (`500m`), to the nearest millicore; a request above zero but below
/// half a millicore, which would become none, is refused.
pub fn parse_cpu(field: &str, s: &str) -> Result<MilliCpu, ApiError> {
    let bad = || {
        ApiError::invalid(field, s, "cores like 8 or 1.5, or millicores like 500m: 0, or from 1m to 1000000000 cores")
    };
    let t = s.trim();
    let m = if let Some(m) = t.strip_suffix('m') {
        m.parse::<f64>().map_err(|_| bad())?
    } else {
        t.parse::<f64>().map_err(|_| bad())? * 1000.0
    };
    if !m.is_finite() || m < 0.0 || m.round() > MAX_MILLI_CPU as f64 || (m > 0.0 && m.round() == 0.0) {
        return Err(bad());
    }
    Ok(MilliCpu(m.round() as u64))
}

/// Parses memory: `Ki`, `Mi`, `Gi`, `Ti` (binary), `k`, `M`, `G`, `T` (decimal) or bytes; rounded up to MiB.
pub fn parse_memory(field: &str, s: &str) -> Result<MiB, ApiError> {
    let bad = || ApiError::invalid(field, s, "a size like 32Gi, 512Mi, 1G or a number of bytes, at most 1048576Ti");
    let t = s.trim();
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024f64.powi(4)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (num, mult) = units.iter().find_map(|(u, m)| t.strip_suffix(u).map(|n| (n, *m))).unwrap_or((t, 1.0));
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mib = (v * mult / (1024.0 * 1024.0)).ceil();
    if !v.is_finite() || v < 0.0 || !mib.is_finite() || mib > MAX_MIB as f64 {
        return Err(bad());
    }
    Ok(MiB(mib as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_formatted_with_their_two_largest_units() {
        assert_eq!(format_duration_ms(250), "250ms");
        assert_eq!(format_duration_ms(45_000), "45s");
        assert_eq!(format_duration_ms(200_000), "3m20s");
        assert_eq!(format_duration_ms(7_500_000), "2h5m");
        assert_eq!(format_duration_ms(3_600_000), "1h");
        assert_eq!(format_duration_ms(100_800_000 + 59_000), "1d4h");
        let back = parse_duration("d", &format_duration_ms(7_500_000)).unwrap();
        assert_eq!(back.0, 7_500_000);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("d", "90s").unwrap(), Dur::from_secs(90));
        assert_eq!(parse_duration("d", "1h30m").unwrap(), Dur::from_mins(90));
        assert_eq!(parse_duration("d", "2d").unwrap(), Dur::from_hours(48));
        assert_eq!(parse_duration("d", "30").unwrap(), Dur::from_secs(30));
        assert_eq!(parse_duration("d", "250ms").unwrap(), Dur(250));
        let e = parse_duration("checkpoint_interval", "ten minutes").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_interval"));
        assert!(e.message.contains("1h30m"), "{}", e.message);
        assert!(
            parse_duration("d", "5x").is_err() && parse_duration("d", "").is_err() && parse_duration("d", "m").is_err()
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu("c", "8").unwrap(), MilliCpu(8000));
        assert_eq!(parse_cpu("c", "500m").unwrap(), MilliCpu(500));
        assert_eq!(parse_cpu("c", "1.5").unwrap(), MilliCpu(1500));
        // Not silently none: a positive request below half a millicore is refused; zero stays zero.
        for tiny in ["1e-7", "0.0004", "0.4m"] {
            assert_eq!(parse_cpu("cpu", tiny).unwrap_err().field.as_deref(), Some("cpu"), "{tiny}");
        }
        assert_eq!(parse_cpu("c", "0").unwrap(), MilliCpu(0));
        assert_eq!(parse_cpu("c", "0.0006").unwrap(), MilliCpu(1));
        assert!(parse_cpu("c", "-1").is_err() && parse_cpu("c", "lots").is_err());
        assert_eq!(parse_memory("m", "32Gi").unwrap(), MiB(32 * 1024));
        assert_eq!(parse_memory("m", "512Mi").unwrap(), MiB(512));
        assert_eq!(parse_memory("m", "1G").unwrap(), MiB(954));
        assert_eq!(parse_memory("m", "1048576").unwrap(), MiB(1));
        assert!(parse_memory("m", "32Gb").is_err());
    }

    #[test]
    fn huge_quantities_are_refused_not_saturated() {
        let e = parse_cpu("cpu", "1e30").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("cpu"));
        assert!(parse_cpu("cpu", "1e9").is_ok() && parse_cpu("cpu", "1000000001").is_err());
        assert!(parse_memory("memory", "1e30").is_err() && parse_memory("memory", "2Ei").is_err());
        assert_eq!(parse_memory("memory", "1024Ti").unwrap(), MiB(1 << 30));
        let e = parse_duration("estimated_duration", "100000000000000000000h").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("estimated_duration"));
        assert!(parse_duration("d", "1e300").is_err() && parse_duration("d", "3651d").is_err());
        assert!(parse_duration("d", "3650d").is_ok());
    }
}
