//! Kubernetes `v1` ResourceQuota (`PUT /v1/tenants/{name}/quota`): `quota_from_k8s`. An accepted quota converts to
//! the core's quota and reads back unchanged from a ResourceQuota written with its own values.
#![no_main]

use gpunet_api::quota_from_k8s;
use gpunet_fuzz::check_error;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match quota_from_k8s(text) {
        Ok((q, warnings)) => {
            assert!(warnings.len() <= gpunet_api::limits::MAX_WARNINGS + 1);
            let _ = q.to_core();
            let mut hard = serde_json::Map::new();
            if let Some(g) = q.gpus {
                hard.insert("requests.nvidia.com/gpu".into(), g.to_string().into());
            }
            if let Some(c) = q.cpu {
                hard.insert("limits.cpu".into(), format!("{}m", c.0).into());
            }
            if let Some(m) = q.memory {
                hard.insert("limits.memory".into(), format!("{}Mi", m.0).into());
            }
            let doc = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": q.tenant},
                "spec": {"hard": hard},
            });
            let again = doc.to_string();
            match quota_from_k8s(&again) {
                Ok((back, w)) => {
                    assert_eq!(back, q, "round trip changed the quota: {again}");
                    assert!(w.is_empty(), "warnings on a clean quota: {w:?}");
                }
                Err(e) => panic!("the quota's own ResourceQuota is refused: {e:?}; {again}"),
            }
        }
        Err(e) => check_error(&e),
    }
});
