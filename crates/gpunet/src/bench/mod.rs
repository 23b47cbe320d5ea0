//! `gpunet bench …`: benchmarks whose figures go into issue notes.

pub(crate) mod api;
pub(crate) mod depth;
pub(crate) mod e2e;
pub(crate) mod elastic;
pub(crate) mod sched;

/// Peak resident set size of this process in MiB (VmHWM), or 0 where /proc is not there.
pub(crate) fn peak_rss_mib() -> f64 {
    status_mib("/proc/self/status", "VmHWM:")
}

/// A memory figure (`VmRSS:`, `VmHWM:`, …) of a `/proc/…/status` file in MiB, or 0 where it cannot be read.
pub(crate) fn status_mib(path: &str, key: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The `q`-quantile (0..=1) of sorted samples.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
