//! GPU errors that NVML's counters do not hold: critical XID errors, which NVML delivers only as events
//! (`nvmlDeviceRegisterEvents` with `nvmlEventTypeXidCriticalError`, then `nvmlEventSetWait`). [`watch_xid`] runs a
//! thread that registers every GPU supporting them in one event set, waits on it and counts the events per GPU
//! ([`XidCounts`]); [`crate::gpus::sample`] adds the counts to each GPU's sample, so they reach the server with the
//! sync. A GPU whose driver cannot deliver XID events gets no count (absent, not 0).
//!
//! Fake GPUs (`--fake-gpus … --fake-gpu-samples`) have no NVML: their errors come from a file in the agent's data
//! directory, [`FAKE_ERRORS_FILE`], which a test (or someone trying the alert rules) appends to — one error per line,
//! `GPU xid CODE`, `GPU ecc-corrected COUNT` or `GPU ecc-uncorrected COUNT` (see [`parse_fake_errors`]). The file is
//! read at every fake sample; the counts it gives are the totals since it was created.

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};

/// The file in a fake-GPU agent's data directory that lists the errors its fake GPUs report.
pub const FAKE_ERRORS_FILE: &str = "fake-gpu-errors";

/// The code NVML gives an XID error it cannot name.
const XID_UNKNOWN: u64 = 999;

/// How long one wait on the event set lasts; the thread checks between waits whether the agent still wants it.
const WAIT_MS: u32 = 1_000;

/// One GPU's XID errors: how many since the agent started watching, and the latest one's code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XidCount {
    /// Events.
    pub count: u64,
    /// The latest code (0 before the first).
    pub last: u64,
}

/// XID errors per GPU index, shared by the watching thread and the sampler.
#[derive(Debug, Default)]
pub struct XidCounts {
    inner: Mutex<(BTreeSet<u32>, BTreeMap<u32, XidCount>)>,
}

impl XidCounts {
    /// The count of GPU `index`, or `None` when its XID events are not watched.
    pub fn of(&self, index: u32) -> Option<XidCount> {
        let g = self.inner.lock().expect("xid counts");
        g.0.contains(&index).then(|| g.1.get(&index).copied().unwrap_or_default())
    }

    fn watching(&self, indexes: &[u32]) {
        self.inner.lock().expect("xid counts").0 = indexes.iter().copied().collect();
    }

    /// Counts one XID error of GPU `index`.
    pub fn add(&self, index: u32, code: u64) {
        let mut g = self.inner.lock().expect("xid counts");
        let e = g.1.entry(index).or_default();
        e.count += 1;
        e.last = code;
    }
}

/// Starts watching the critical XID errors of every GPU that can report them. The thread ends when the last
/// [`Arc`] of `counts` is dropped (the agent stopped), or when NVML fails in a way waiting again cannot fix.
pub fn watch_xid(nvml: Arc<Nvml>, counts: &Arc<XidCounts>) -> std::io::Result<()> {
    let weak: Weak<XidCounts> = Arc::downgrade(counts);
    std::thread::Builder::new().name("gpunet-xid".into()).spawn(move || watch(&nvml, &weak))?;
    Ok(())
}

/// Registers the GPUs (leaving out any whose registration fails: NVML frees the set when one does, so the set is
/// built again without it), then counts events until the agent drops its counts.
fn watch(nvml: &Nvml, counts: &Weak<XidCounts>) {
    let n = nvml.device_count().unwrap_or(0);
    let mut want: Vec<u32> = (0..n)
        .filter(|i| {
            nvml.device_by_index(*i)
                .and_then(|d| d.supported_event_types())
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
        })
        .collect();
    let set = loop {
        let mut set = match nvml.create_event_set() {
            Ok(s) => Some(s),
            Err(e) => return tracing::warn!(error = %e, "XID errors are not watched: NVML made no event set"),
        };
        let mut failed = None;
        for i in &want {
            let Some(s) = set.take() else { break };
            let registered = match nvml.device_by_index(*i) {
                Ok(d) => d.register_events(EventTypes::CRITICAL_XID_ERROR, s),
                Err(e) => Err(e.into()),
            };
            match registered {
                Ok(s) => set = Some(s),
                Err(e) => {
                    tracing::warn!(gpu = i, error = %e, "XID errors of this GPU are not watched");
                    failed = Some(*i);
                    break;
                }
            }
        }
        match (failed, set) {
            (None, Some(s)) => break s,
            (Some(i), _) => want.retain(|x| *x != i),
            (None, None) => return,
        }
    };
    let Some(c) = counts.upgrade() else { return };
    c.watching(&want);
    drop(c);
    tracing::info!(gpus = ?want, "watching XID errors");
    if want.is_empty() {
        return;
    }
    loop {
        let event = set.wait(WAIT_MS);
        let Some(c) = counts.upgrade() else { return };
        match event {
            Ok(ev) if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) => {
                let code = match ev.event_data {
                    Some(XidError::Value(v)) => v,
                    Some(XidError::Unknown) | None => XID_UNKNOWN,
                };
                match ev.device.index() {
                    Ok(i) => {
                        tracing::error!(gpu = i, xid = code, "GPU reported an XID error");
                        c.add(i, code);
                    }
                    Err(e) => tracing::warn!(xid = code, error = %e, "XID error of a GPU NVML cannot name"),
                }
            }
            Ok(_) | Err(NvmlError::Timeout) => {}
            Err(e) => {
                // A GPU fell off the bus (itself an XID 79 on the driver's side) or NVML failed: say so, and keep
                // waiting after a pause rather than spinning.
                tracing::warn!(error = %e, "waiting for XID events failed");
                drop(c);
                std::thread::sleep(std::time::Duration::from_secs(5));
            }
        }
    }
}

/// The errors of one fake GPU, from [`FAKE_ERRORS_FILE`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeErrors {
    /// XID errors and the latest code.
    pub xid: XidCount,
    /// Corrected ECC errors.
    pub ecc_corrected: u64,
    /// Uncorrected ECC errors.
    pub ecc_uncorrected: u64,
}

/// Why a line of [`FAKE_ERRORS_FILE`] was not understood.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of {FAKE_ERRORS_FILE}: {what}; expected `GPU xid CODE`, `GPU ecc-corrected COUNT` or `GPU ecc-uncorrected COUNT`")]
pub struct FakeErrorsLine {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub what: String,
}

/// Reads the fake GPUs' errors (blank lines and `#` comments allowed). Lines it does not understand are returned
/// apart, and count for nothing.
pub fn parse_fake_errors(text: &str) -> (BTreeMap<u32, FakeErrors>, Vec<FakeErrorsLine>) {
    let mut out: BTreeMap<u32, FakeErrors> = BTreeMap::new();
    let mut bad = Vec::new();
    for (n, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        let err = |what: String| FakeErrorsLine { line: n + 1, what };
        let [gpu, kind, value] = f[..] else {
            bad.push(err(format!("{} fields", f.len())));
            continue;
        };
        let Ok(gpu) = gpu.parse::<u32>() else {
            bad.push(err(format!("GPU {gpu:?} is not an index")));
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            bad.push(err(format!("{value:?} is not a number")));
            continue;
        };
        let e = out.entry(gpu).or_default();
        match kind {
            "xid" => {
                e.xid.count += 1;
                e.xid.last = value;
            }
            "ecc-corrected" => e.ecc_corrected = e.ecc_corrected.saturating_add(value),
            "ecc-uncorrected" => e.ecc_uncorrected = e.ecc_uncorrected.saturating_add(value),
            other => bad.push(err(format!("unknown error kind {other:?}"))),
        }
    }
    (out, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_errors_file_adds_up_per_gpu_and_names_bad_lines() {
        let (errs, bad) = parse_fake_errors(
            "# injected\n0 xid 13\n\n0 xid 79\n1 ecc-corrected 5\n1 ecc-corrected 2\n1 ecc-uncorrected 1\n\
             x xid 1\n0 xid\n0 smoke 1\n0 xid -3\n",
        );
        assert_eq!(errs[&0].xid, XidCount { count: 2, last: 79 });
        assert_eq!((errs[&1].ecc_corrected, errs[&1].ecc_uncorrected, errs[&1].xid.count), (7, 1, 0));
        assert_eq!(bad.iter().map(|b| b.line).collect::<Vec<_>>(), vec![8, 9, 10, 11]);
        assert!(bad[2].to_string().contains("unknown error kind \"smoke\""), "{}", bad[2]);
    }

    #[test]
    fn xid_counts_exist_only_for_watched_gpus() {
        let c = XidCounts::default();
        c.watching(&[0, 2]);
        c.add(2, 48);
        c.add(2, 79);
        assert_eq!(c.of(0), Some(XidCount::default()));
        assert_eq!(c.of(1), None, "a GPU that cannot deliver XID events has no count, not 0");
        assert_eq!(c.of(2), Some(XidCount { count: 2, last: 79 }));
    }
}
