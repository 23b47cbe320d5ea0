//! Human quantities (`gpunet_api::units`): the first byte picks durations, CPU or memory; the rest is the text.
//! Accepted values are within the documented maxima and read back unchanged from their canonical form; errors name
//! the field.
#![no_main]

use gpunet_api::units::{parse_cpu, parse_duration, parse_memory, MAX_DURATION_MS, MAX_MIB, MAX_MILLI_CPU};
use gpunet_api::ApiError;
use libfuzzer_sys::fuzz_target;

fn named(e: ApiError, field: &str) {
    assert_eq!(e.field.as_deref(), Some(field), "{e:?}");
    assert_eq!(e.code, "invalid_field", "{e:?}");
    assert!(e.message.len() <= gpunet_fuzz::MAX_ERROR_BYTES, "{e:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let Ok(s) = std::str::from_utf8(rest) else { return };
    match which % 3 {
        0 => match parse_duration("d", s) {
            Ok(d) => {
                assert!(d.0 <= MAX_DURATION_MS, "{s:?} gave {} ms", d.0);
                assert_eq!(parse_duration("d", &format!("{}ms", d.0)).unwrap(), d);
            }
            Err(e) => named(e, "d"),
        },
        1 => match parse_cpu("c", s) {
            Ok(c) => {
                assert!(c.0 <= MAX_MILLI_CPU, "{s:?} gave {} m", c.0);
                assert_eq!(parse_cpu("c", &format!("{}m", c.0)).unwrap(), c);
            }
            Err(e) => named(e, "c"),
        },
        _ => match parse_memory("m", s) {
            Ok(m) => {
                assert!(m.0 <= MAX_MIB, "{s:?} gave {} MiB", m.0);
                assert_eq!(parse_memory("m", &format!("{}Mi", m.0)).unwrap(), m);
            }
            Err(e) => named(e, "m"),
        },
    }
});
