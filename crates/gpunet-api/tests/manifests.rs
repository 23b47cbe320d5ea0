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
fn a_resource_quota_of_any_name_belongs_to_its_namespace() {
    // Kubernetes applies a ResourceQuota to its namespace whatever its name; `team-a-quota` was refused.
    let text = include_str!("fixtures/k8s-resourcequota.yaml")
        .replace("  name: team-a\n", "  name: team-a-quota\n  namespace: team-a\n");
    let (q, _) = quota_from_k8s(&text).unwrap();
    assert_eq!(q.tenant, "team-a");
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

/// A 150 KB Job with one long unused key and 3,000 children once produced a 300 MB dry-run answer: every child's
/// warning repeated the long key. Warnings are now at most 50, each cut to a few hundred bytes.
#[test]
fn warnings_of_a_job_with_a_huge_unused_key_and_thousands_of_children_stay_small() {
    let key = "k".repeat(50_000);
    let children: String = (0..3000).map(|i| format!("\"c{i}\": 1,")).collect();
    let text = format!(
        r#"{{"apiVersion": "batch/v1", "kind": "Job", "metadata": {{"name": "big"}},
            "spec": {{"{key}": {{{children} "last": 2}},
                      "template": {{"spec": {{"containers": [{{"name": "c", "command": ["true"]}}]}}}}}}}}"#
    );
    let p = parse_job(&text).unwrap();
    let total: usize = p.warnings.iter().map(String::len).sum();
    assert!(p.warnings.len() <= limits::MAX_WARNINGS + 1, "{} warnings", p.warnings.len());
    assert!(total < 32 * 1024, "{total} bytes of warnings");
    assert!(p.warnings.last().unwrap().contains("2951 more warnings"), "{:?}", p.warnings.last());
    // The same for a ResourceQuota.
    let q = format!(
        r#"{{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {{"name": "t"}},
            "spec": {{"hard": {{"nvidia.com/gpu": "4", "{key}": {{{children} "last": 2}}}}}}}}"#
    );
    let (_, w) = quota_from_k8s(&q).unwrap();
    assert!(w.len() <= limits::MAX_WARNINGS + 1 && w.iter().map(String::len).sum::<usize>() < 32 * 1024);
}

/// `parallelism: 4294967297` became 1 task and `backoffLimit: 4294967296` became 0 (truncated to 32 bits).
#[test]
fn kubernetes_counts_beyond_their_range_are_refused_not_truncated() {
    let job = |spec: &str| {
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: a}}\nspec:\n  {spec}\n  template:\n    spec:\n      \
             containers: [{{name: c, command: [\"true\"]}}]\n"
        )
    };
    for (spec, field) in [
        ("parallelism: 4294967297", "spec.parallelism"),
        ("parallelism: 0", "spec.parallelism"),
        ("backoffLimit: 4294967296", "spec.backoffLimit"),
        ("backoffLimit: -1", "spec.backoffLimit"),
    ] {
        let e = parse_job(&job(spec)).unwrap_err();
        assert_eq!((e.code.as_str(), e.field.as_deref()), ("invalid_field", Some(field)), "{spec}: {e:?}");
    }
    assert_eq!(parse_job(&job("parallelism: 4")).unwrap().job.tasks, 4);
}

/// `cpu: 1e30` was accepted as 18446744073709551615m and `estimated_duration: 100000000000000000000h` as the longest
/// duration: every number is now range-checked and refused with its field.
#[test]
fn native_numbers_beyond_their_range_are_refused_with_the_field() {
    for (body, field) in [
        (r#"{"name": "x", "cpu": 1e30}"#, "cpu"),
        (r#"{"name": "x", "memory": 1e30}"#, "memory"),
        (r#"{"name": "x", "gpus": 1, "estimated_duration": "100000000000000000000h"}"#, "estimated_duration"),
        (r#"{"name": "x", "gpus": 1, "checkpoint_interval": "1e400"}"#, "checkpoint_interval"),
        (r#"{"name": "x", "gpus": 4294967297}"#, "gpus"),
        (r#"{"name": "x", "gpus": 1, "priority": 1e30}"#, "priority"),
        (r#"{"name": "x", "gpus": 1, "elastic": {"min_tasks": 1, "max_tasks": 4294967297}}"#, "elastic.max_tasks"),
        (
            r#"{"name": "x", "gpus": 1, "checkpoint_tiers": [{"name": "l", "every": "1m", "keep": 1e10}]}"#,
            "checkpoint_tiers[0].keep",
        ),
    ] {
        let e = parse_job(body).and_then(|p| p.job.to_core(TenantId(0))).unwrap_err();
        assert_eq!((e.code.as_str(), e.field.as_deref()), ("invalid_field", Some(field)), "{body}: {e:?}");
    }
}
