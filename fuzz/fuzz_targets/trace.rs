//! Every trace reader (`gpunet_sim::trace::read_trace_from`): the first byte picks the format (detected, gpunet,
//! philly, pai2023, tiresias, pollux) and whether bad rows are skipped; the rest is the CSV. Accepted jobs hold the
//! values the simulator relies on (finite, non-negative times), and reading is deterministic.
#![no_main]

use gpunet_sim::trace::{read_trace_from, ReadOptions, TraceFormat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, csv)) = data.split_first() else { return };
    let format = match sel % 6 {
        0 => None,
        1 => Some(TraceFormat::Gpunet),
        2 => Some(TraceFormat::Philly),
        3 => Some(TraceFormat::Pai2023),
        4 => Some(TraceFormat::Tiresias),
        _ => Some(TraceFormat::Pollux),
    };
    let opts = ReadOptions { format, skip_bad_rows: sel & 0x80 != 0 };
    let first = read_trace_from(csv, "fuzz.csv", opts);
    let again = read_trace_from(csv, "fuzz.csv", opts);
    match (&first, &again) {
        (Ok(t), Ok(u)) => {
            assert_eq!(t.jobs, u.jobs, "reading twice differs");
            if let Some(f) = format {
                assert_eq!(t.format, f);
            }
            for j in &t.jobs {
                assert!(j.submit_s.is_finite() && j.submit_s >= 0.0, "submit_s {} of {}", j.submit_s, j.id);
                assert!(j.duration_s.is_finite() && j.duration_s >= 0.0, "duration_s {} of {}", j.duration_s, j.id);
                if let Some(e) = j.est_duration_s {
                    assert!(e.is_finite() && e >= 0.0, "est_duration_s {e} of {}", j.id);
                }
                assert!(j.tasks != Some(0), "zero tasks in {}", j.id);
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "reading twice differs"),
        _ => panic!("reading twice differs: {first:?} / {again:?}"),
    }
});
