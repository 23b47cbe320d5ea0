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
    // The image is honoured: the job runs in it, so only nodes that run containers and pull images hold it.
    assert_eq!(j.image.as_deref(), Some("pytorch:1.12"));
    let keys: Vec<(&str, &[String])> = spec.selector.iter().map(|t| (t.key.as_str(), &t.values[..])).collect();
    assert_eq!(
        keys,
        [
            ("gpu-type", &["v100".to_string()][..]),
            ("gpunet.io/containers", &["true".to_string()][..]),
            ("gpunet.io/image-pull", &["true".to_string()][..])
        ]
    );
    assert!(spec.selector.iter().all(|t| t.op == SelectorOp::In));
    let w = p.warnings.join("\n");
    assert!(w.contains("spec.template.spec.containers[0].affinity is misplaced"), "{w}");
    assert_eq!(p.warnings.len(), 1, "{w}");
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
        (r#"{"name": "x", "gpus": 1, "disk": 1e30}"#, "disk"),
        (r#"{"name": "x", "gpus": 1, "disk": "0"}"#, "disk"),
        (r#"{"name": "x", "gpus": 1, "disk": "-5Gi"}"#, "disk"),
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

/// A Kubernetes Job's container is honoured: image, workingDir (absolute, in the image) and the volumeMounts of
/// its hostPath and emptyDir volumes; another kind of volume, or a mount of no volume, is refused naming the field.
#[test]
fn a_kubernetes_job_s_container_image_and_volumes_become_the_job_s() {
    let text = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: a}\nspec:\n  template:\n    spec:\n      \
                containers:\n      - name: c\n        image: oci:lay:1\n        workingDir: /work\n        \
                volumeMounts: [{name: data, mountPath: /data, readOnly: true}, {name: s, mountPath: /scratch}]\n      \
                volumes: [{name: data, hostPath: {path: /srv/data, type: Directory}}, {name: s, emptyDir: {}}]\n";
    let p = parse_job(text).unwrap();
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(p.job.image.as_deref(), Some("oci:lay:1"));
    assert_eq!(p.job.working_dir.as_deref(), Some("/work"));
    let m = &p.job.container.as_ref().unwrap().mounts;
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].path.as_str(), m[0].host_path.as_deref(), m[0].read_only), ("/data", Some("/srv/data"), true));
    assert_eq!((m[1].path.as_str(), m[1].host_path.as_deref(), m[1].read_only), ("/scratch", None, false));
    let spec = p.job.to_core(TenantId(0)).unwrap();
    let keys: Vec<&str> = spec.selector.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["gpunet.io/containers", "gpunet.io/image-unpack"], "an OCI layout needs umoci on the node");
    let nfs = text.replace("emptyDir: {}", "nfs: {server: x, path: /}");
    assert_eq!(parse_job(&nfs).unwrap_err().field.as_deref(), Some("spec.template.spec.volumes[1]"));
    let missing = text.replace("name: s, mountPath", "name: nope, mountPath");
    assert_eq!(
        parse_job(&missing).unwrap_err().field.as_deref(),
        Some("spec.template.spec.containers[0].volumeMounts[1].name")
    );
    // Without an image the working directory must be relative (beneath the task's own directory).
    let no_image = text.replace("        image: oci:lay:1\n", "");
    let e = parse_job(&no_image).unwrap().job.to_core(TenantId(0)).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("working_dir"));
}

/// The native spec's `image` and `container`: checked at submission, naming the field; `container` needs `image`.
#[test]
fn image_and_container_options_are_checked_at_submission() {
    let ok = parse_job(
        "name: x\ngpus: 1\nmemory: 4Gi\nimage: nvcr.io/nvidia/pytorch:22.07-py3\n\
         container: {network: none, shm_size: 1Gi}\n",
    )
    .unwrap();
    let spec = ok.job.to_core(TenantId(0)).unwrap();
    assert!(spec.selector.iter().any(|t| t.key == "gpunet.io/image-pull"), "a registry image needs pulling");
    for (bad, field) in [
        ("image: dir:../../etc\n", "image"),
        ("image: 'a b'\n", "image"),
        ("image: dir:x\ncontainer: {shm_size: 8Gi}\n", "container.shm_size"),
        ("image: dir:x\ncontainer: {network: bridge}\n", ""),
        ("image: dir:x\ncontainer: {mounts: [{path: /proc/x}]}\n", "container.mounts[0].path"),
        ("container: {network: none}\n", "container"),
    ] {
        let text = format!("name: x\ngpus: 1\nmemory: 4Gi\n{bad}");
        let e = parse_job(&text).and_then(|p| p.job.to_core(TenantId(0)).map(|_| ())).unwrap_err();
        if !field.is_empty() {
            assert_eq!(e.field.as_deref(), Some(field), "{bad}: {e:?}");
        }
    }
}

/// A container's ephemeral-storage limit (else request) is the job's `disk`: what the node lets each task keep on
/// its disk before it stops it, as Kubernetes evicts a pod past it. A bad quantity is refused naming its path.
#[test]
fn a_kubernetes_ephemeral_storage_limit_becomes_the_job_s_disk() {
    let base = include_str!("fixtures/k8s-job.yaml");
    let with = |extra: &str| {
        base.replace("            nvidia.com/gpu: 2\n", &format!("            nvidia.com/gpu: 2\n{extra}"))
    };
    let p = parse_job(&with("            ephemeral-storage: 50Gi\n")).unwrap();
    assert_eq!(p.job.disk.as_ref().map(|q| q.text()).as_deref(), Some("50Gi"));
    assert_eq!(p.warnings.len(), 1, "nothing new is ignored: {:?}", p.warnings);
    let e = parse_job(&with("            ephemeral-storage: lots\n")).unwrap_err();
    assert_eq!(
        e.field.as_deref(),
        Some("spec.template.spec.containers[0].resources.limits.ephemeral-storage"),
        "{e:?}"
    );
    assert_eq!(parse_job(base).unwrap().job.disk, None);
}
