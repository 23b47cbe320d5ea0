//! Kubernetes `batch/v1` Job manifests: `job_from_k8s` on any parsed document (so inputs need not keep the
//! `apiVersion` that routes `parse_job` there). A converted job must be a valid native submission that round-trips,
//! its warnings bounded; `parse_job` must agree when the document does say `batch/v1`.
#![no_main]

use gpunet_api::limits::{MAX_WARNINGS, MAX_WARNING_BYTES};
use gpunet_api::spec::parse_document;
use gpunet_api::{job_from_k8s, parse_job};
use gpunet_core::TenantId;
use gpunet_fuzz::{check_error, check_round_trip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let doc = match parse_document(text) {
        Ok(d) => d,
        Err(e) => return check_error(&e),
    };
    let converted = job_from_k8s(&doc);
    match &converted {
        Ok(p) => {
            assert!(p.warnings.len() <= MAX_WARNINGS + 1, "{} warnings", p.warnings.len());
            for w in &p.warnings {
                assert!(w.len() <= MAX_WARNING_BYTES + 100, "warning of {} bytes", w.len());
            }
            check_round_trip(&p.job);
            if let Err(e) = p.job.to_core(TenantId::from(1)) {
                check_error(&e);
            }
        }
        Err(e) => check_error(e),
    }
    if doc.get("apiVersion").and_then(|a| a.as_str()) == Some("batch/v1") {
        assert_eq!(parse_job(text), converted, "parse_job and job_from_k8s disagree");
    }
});
