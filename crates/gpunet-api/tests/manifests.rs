//! The two Kubernetes manifests platform teams already have are accepted unchanged.

use gpunet_api::*;
use gpunet_core::{MiB, MilliCpu, SelectorOp, TenantId};

#[test]
fn the_k8s_job_fixture_converts_with_warnings_for_what_gpunet_cannot_honour() {
    let text = include_str!("fixtures/k8s-job.yaml");
    let p = parse_job(text).unwrap();
    let j = &p.job;
    assert_eq!((j.name.as_str(), j.gpus, j.tasks), ("resnet50-train", 2, 1));
    assert_eq!(j.liveness.as_ref().unwrap().command, ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv"]);
    assert_eq!(j.liveness.as_ref().unwrap().initial_delay.as_deref(), Some("30s"));
    let spec = j.to_core(TenantId(0)).unwrap();
    assert_eq!(spec.task.cpu, MilliCpu(8000));
    assert_eq!(spec.task.mem, MiB(32 * 1024));
    assert_eq!(spec.selector.len(), 1);
    assert_eq!((spec.selector[0].key.as_str(), spec.selector[0].op), ("gpu-type", SelectorOp::In));
    assert_eq!(spec.selector[0].values, ["v100"]);
    let w = p.warnings.join("\n");
    assert!(w.contains("spec.template.spec.containers[0].affinity is misplaced"), "{w}");
    assert!(w.contains("containers[0].image \"pytorch:1.12\" is not pulled"), "{w}");
    assert_eq!(p.warnings.len(), 2, "{w}");
}

#[test]
fn the_k8s_resource_quota_fixture_converts() {
    let (q, warnings) = quota_from_k8s(include_str!("fixtures/k8s-resourcequota.yaml")).unwrap();
    assert_eq!(q.tenant, "team-a");
    assert_eq!((q.gpus, q.cpu, q.memory), (Some(16), Some(MilliCpu(64_000)), Some(MiB(256 * 1024))));
    assert!(warnings.is_empty(), "{warnings:?}");
    let core = q.to_core();
    core.validate().unwrap();
    assert_eq!(core.guarantee_vec()[0], 16);
}

#[test]
fn unknown_kubernetes_fields_are_named_never_ignored() {
    let text = include_str!("fixtures/k8s-job.yaml")
        .replace("  template:\n", "  ttlSecondsAfterFinished: 100\n  template:\n")
        .replace("        image: pytorch:1.12\n", "        image: pytorch:1.12\n        imagePullPolicy: Always\n");
    let p = parse_job(&text).unwrap();
    let w = p.warnings.join("\n");
    assert!(w.contains("spec.ttlSecondsAfterFinished is not used by gpunet"), "{w}");
    assert!(w.contains("spec.template.spec.containers[0].imagePullPolicy is not used by gpunet"), "{w}");
    let (_, w) = quota_from_k8s(
        &include_str!("fixtures/k8s-resourcequota.yaml")
            .replace("limits.cpu: \"64\"", "limits.cpu: \"64\"\n    pods: \"10\""),
    )
    .unwrap();
    assert_eq!(w, ["spec.hard.pods is not used by gpunet and was ignored"]);
}

#[test]
fn bad_kubernetes_values_are_errors_naming_the_path() {
    let text = include_str!("fixtures/k8s-job.yaml").replace("nvidia.com/gpu: 2", "nvidia.com/gpu: two");
    let e = parse_job(&text).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("spec.template.spec.containers[0].resources.limits.nvidia.com/gpu"));
    let text = include_str!("fixtures/k8s-job.yaml").replace("operator: In", "operator: Near");
    let e = parse_job(&text).unwrap_err();
    assert!(e.message.contains("Near") && e.message.contains("NotIn"), "{}", e.message);
    let text = include_str!("fixtures/k8s-job.yaml").replace("memory: 32Gi", "memory: 32 gigs");
    let e = parse_job(&text).unwrap_err();
    assert_eq!(e.status(), 422);
    assert!(quota_from_k8s("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").is_err());
}
