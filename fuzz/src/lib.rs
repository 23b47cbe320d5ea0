//! Checks shared by gpunet's fuzz targets (`fuzz_targets/`): what every API error and every accepted job spec must
//! satisfy, whatever the input. Run with `scripts/fuzz.sh`.

use gpunet_api::spec::{parse_job, JobSubmission, Quantity};
use gpunet_api::ApiError;

/// The longest error message a parser may return: values and fields are cut (`ApiError::invalid`), parse errors
/// too, so a huge input never makes a huge error.
pub const MAX_ERROR_BYTES: usize = 2048;

/// An error names its field when its code says a field is at fault, the message mentions that field, and the
/// message is bounded.
pub fn check_error(e: &ApiError) {
    assert!(e.message.len() <= MAX_ERROR_BYTES, "error message of {} bytes: {:.200}", e.message.len(), e.message);
    assert!(!e.message.is_empty(), "empty error message: {e:?}");
    if matches!(e.code.as_str(), "invalid_field" | "unknown_field" | "missing_field") {
        let field = e.field.as_deref().unwrap_or_else(|| panic!("{} error without a field: {e:?}", e.code));
        assert!(e.message.contains(field), "message does not name its field {field:?}: {e:?}");
    } else {
        assert!(
            matches!(e.code.as_str(), "parse_error" | "too_large" | "limit_exceeded"),
            "unexpected error code for a parse: {e:?}"
        );
    }
}

fn finite(q: &Option<Quantity>) -> bool {
    !matches!(q, Some(Quantity::Num(n)) if !n.is_finite())
}

/// An accepted submission reads back unchanged after writing it as JSON (how the CLI and the portal send it) and as
/// YAML (how users keep it). Non-finite numbers have no JSON form and are left out of the JSON round trip (the
/// conversion to the core refuses them).
pub fn check_round_trip(job: &JobSubmission) {
    if finite(&job.cpu) && finite(&job.memory) {
        let json = serde_json::to_string(job).expect("a submission serialises to JSON");
        match parse_job(&json) {
            Ok(back) => assert_eq!(&back.job, job, "JSON round trip changed the job; JSON: {json}"),
            Err(e) => panic!("JSON form of an accepted job is refused: {e:?}; JSON: {json}"),
        }
    }
    let yaml = serde_norway::to_string(job).expect("a submission serialises to YAML");
    match parse_job(&yaml) {
        Ok(back) => {
            // NaN is not equal to itself; compare its text.
            if finite(&job.cpu) && finite(&job.memory) {
                assert_eq!(&back.job, job, "YAML round trip changed the job; YAML: {yaml}");
            }
        }
        // A re-serialised document may exceed the YAML size or depth bounds the original (JSON) did not meet.
        Err(e) if e.code == "parse_error" && e.message.contains("document") => {}
        Err(e) => panic!("YAML form of an accepted job is refused: {e:?}; YAML: {yaml}"),
    }
}
