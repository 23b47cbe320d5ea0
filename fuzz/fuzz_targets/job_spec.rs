//! The server's parse of a submitted job (`POST /v1/jobs`): `gpunet_api::parse_job` on gpunet YAML/JSON or a
//! Kubernetes Job, then the conversion to the core's spec. Accepted jobs must round-trip; errors must name fields.
#![no_main]

use gpunet_api::parse_job;
use gpunet_core::TenantId;
use gpunet_fuzz::{check_error, check_round_trip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match parse_job(text) {
        Ok(p) => {
            check_round_trip(&p.job);
            if let Err(e) = p.job.to_core(TenantId::from(1)) {
                check_error(&e);
            }
        }
        Err(e) => check_error(&e),
    }
});
