//! The Kubernetes forms platform teams already have: a `batch/v1` Job becomes a job submission, a `v1`
//! ResourceQuota becomes a tenant quota.
//!
//! The converter removes every field it uses from the document; whatever is left is named in a warning, so no field is
//! ever ignored silently. A field gpunet accepts with a caveat (an `affinity` misplaced inside a container, which
//! Kubernetes itself would reject) gets a warning that says so.
//!
//! | Job field | becomes |
//! |---|---|
//! | `metadata.name`, `metadata.namespace` | `name`, `tenant` |
//! | `spec.parallelism` | `tasks` (gang) |
//! | `spec.backoffLimit` | `max_restarts` |
//! | `…containers[0].resources.limits/requests["nvidia.com/gpu"]` | `gpus` per task |
//! | `…containers[0].resources.requests.cpu/memory` (else `limits`) | `cpu`, `memory` per task |
//! | `…containers[0].resources.limits["ephemeral-storage"]` (else `requests`) | `disk` per task |
//! | `…containers[0].command` + `args`, `env`, `workingDir` | `command`, `env`, `working_dir` |
//! | `…containers[0].image` | `image` (the tasks run in it) |
//! | `…containers[0].volumeMounts` of `spec.template.spec.volumes` (`hostPath`, `emptyDir`) | `container.mounts` |
//! | `…containers[0].livenessProbe.exec` with `initialDelaySeconds`, `periodSeconds` | `liveness` |
//! | `spec.template.spec.nodeSelector`, `affinity.nodeAffinity.required…` (pod or, with a warning, container) | `selector`, `affinity` |
//! | `spec.template.spec.tolerations` | `tolerations` |
//!
//! | ResourceQuota `spec.hard` | becomes (guarantee = limit) |
//! |---|---|
//! | `requests.nvidia.com/gpu` (or `nvidia.com/gpu`) | GPUs |
//! | `limits.cpu` / `requests.cpu` | CPU |
//! | `limits.memory` / `requests.memory` | memory |

use crate::error::ApiError;
use crate::limits::{truncate, Warnings};
use crate::spec::{AffinityTerm, JobSubmission, LivenessSpec, ParsedJob, Quantity, TolerationSpec};
use crate::units::{parse_cpu, parse_memory};
use gpunet_core::tenant::Quota;
use gpunet_core::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};
use serde_norway::{Mapping, Value};

fn take(v: &mut Value, key: &str) -> Option<Value> {
    v.as_mapping_mut().and_then(|m| m.remove(key))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A value as shown in an error (cut by [`ApiError::invalid`]).
fn shown(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| format!("{v:?}"))
}

/// The pod's volumes by name: a hostPath's path, or `None` for an emptyDir; other kinds are refused.
fn volumes(
    v: Option<Value>,
    warnings: &mut Warnings,
) -> Result<std::collections::BTreeMap<String, Option<String>>, ApiError> {
    let mut out = std::collections::BTreeMap::new();
    let Some(v) = v else { return Ok(out) };
    let Value::Sequence(list) = v else {
        return Err(ApiError::invalid("spec.template.spec.volumes", &shown(&v), "a list"));
    };
    for (i, mut vol) in list.into_iter().enumerate() {
        let f = format!("spec.template.spec.volumes[{i}]");
        let name = req_str(take(&mut vol, "name"), &format!("{f}.name"))?
            .ok_or_else(|| ApiError::missing(&format!("{f}.name")))?;
        let source = if let Some(mut h) = take(&mut vol, "hostPath") {
            let p = req_str(take(&mut h, "path"), &format!("{f}.hostPath.path"))?
                .ok_or_else(|| ApiError::missing(&format!("{f}.hostPath.path")))?;
            take(&mut h, "type");
            leftovers(&h, &format!("{f}.hostPath"), warnings);
            Some(p)
        } else if let Some(e) = take(&mut vol, "emptyDir") {
            if let Value::Mapping(m) = &e {
                if !m.is_empty() {
                    warnings.push(format!(
                        "{f}.emptyDir's medium and sizeLimit are not used: an emptyDir is a directory on the node's disk"
                    ));
                }
            }
            None
        } else {
            return Err(ApiError::invalid(&f, &shown(&vol), "a hostPath or emptyDir volume"));
        };
        leftovers(&vol, &f, warnings);
        out.insert(name, source);
    }
    Ok(out)
}

fn req_str(v: Option<Value>, field: &str) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => text(&x).map(Some).ok_or_else(|| ApiError::invalid(field, &shown(&x), "a scalar")),
    }
}

fn strings(v: Option<Value>, field: &str) -> Result<Vec<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Sequence(s)) => s
            .iter()
            .enumerate()
            .map(|(i, x)| text(x).ok_or_else(|| ApiError::invalid(&format!("{field}[{i}]"), &shown(x), "a string")))
            .collect(),
        Some(x) => Err(ApiError::invalid(field, &shown(&x), "a list of strings")),
    }
}

/// Names every scalar left in `v` (a field gpunet did not use) in a warning: at most [`crate::limits::MAX_WARNINGS`]
/// warnings, each key cut to a few dozen bytes, so a document with thousands of unused fields or one enormous key
/// gets a small answer.
fn leftovers(v: &Value, path: &str, out: &mut Warnings) {
    match v {
        Value::Mapping(m) => {
            for (k, x) in m {
                if out.full() {
                    count_leaves(x, out);
                    continue;
                }
                let key = truncate(&text(k).unwrap_or_default(), 64);
                leftovers(x, &if path.is_empty() { key } else { truncate(&format!("{path}.{key}"), 256) }, out);
            }
        }
        Value::Sequence(s) if !s.is_empty() => {
            for (i, x) in s.iter().enumerate() {
                if out.full() {
                    count_leaves(x, out);
                    continue;
                }
                leftovers(x, &truncate(&format!("{path}[{i}]"), 256), out);
            }
        }
        Value::Null => {}
        Value::Sequence(_) => {}
        _ if out.full() => out.count_dropped(),
        _ => out.push(format!("{path} is not used by gpunet and was ignored")),
    }
}

/// Counts the warnings `v` would give without building them.
fn count_leaves(v: &Value, out: &mut Warnings) {
    match v {
        Value::Mapping(m) => m.iter().for_each(|(_, x)| count_leaves(x, out)),
        Value::Sequence(s) => s.iter().for_each(|x| count_leaves(x, out)),
        Value::Null => {}
        _ => out.count_dropped(),
    }
}

fn node_affinity(mut aff: Value, path: &str, out: &mut Vec<AffinityTerm>) -> Result<(), ApiError> {
    let Some(mut na) = take(&mut aff, "nodeAffinity") else { return leftover_err(&aff, path) };
    if let Some(mut req) = take(&mut na, "requiredDuringSchedulingIgnoredDuringExecution") {
        let terms = take(&mut req, "nodeSelectorTerms").unwrap_or(Value::Null);
        let terms = match terms {
            Value::Sequence(s) => s,
            Value::Null => Vec::new(),
            _ => return Err(ApiError::invalid(&format!("{path}.nodeAffinity…nodeSelectorTerms"), "?", "a list")),
        };
        if terms.len() > 1 {
            return Err(ApiError::invalid(
                &format!("{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"),
                &format!("{} terms", terms.len()),
                "one term (gpunet does not OR several terms)",
            ));
        }
        for mut t in terms {
            let exprs = match take(&mut t, "matchExpressions") {
                Some(Value::Sequence(s)) => s,
                _ => Vec::new(),
            };
            for (i, mut e) in exprs.into_iter().enumerate() {
                let f = format!("{path}.nodeAffinity…matchExpressions[{i}]");
                let key = req_str(take(&mut e, "key"), &format!("{f}.key"))?
                    .ok_or_else(|| ApiError::missing(&format!("{f}.key")))?;
                let operator = req_str(take(&mut e, "operator"), &format!("{f}.operator"))?
                    .ok_or_else(|| ApiError::missing(&format!("{f}.operator")))?;
                let values = strings(take(&mut e, "values"), &format!("{f}.values"))?;
                let term = AffinityTerm { key, operator, values };
                crate::spec::affinity_term(&f, &term)?;
                out.push(term);
            }
        }
    }
    if let Some(p) = take(&mut na, "preferredDuringSchedulingIgnoredDuringExecution") {
        let _ = p;
        return Err(ApiError::invalid(
            &format!("{path}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"),
            "preferences",
            "required terms only; gpunet has no soft node affinity",
        ));
    }
    Ok(())
}

fn leftover_err(v: &Value, path: &str) -> Result<(), ApiError> {
    let mut w = Warnings::default();
    leftovers(v, path, &mut w);
    match w.finish().first() {
        Some(f) => Err(ApiError::invalid(path, f, "nodeAffinity")),
        None => Ok(()),
    }
}

/// Converts a parsed `batch/v1` Job.
pub fn job_from_k8s(doc: &Value) -> Result<ParsedJob, ApiError> {
    let mut v = doc.clone();
    let mut warnings = Warnings::default();
    take(&mut v, "apiVersion");
    let kind = req_str(take(&mut v, "kind"), "kind")?.unwrap_or_default();
    if kind != "Job" {
        return Err(ApiError::invalid("kind", &kind, "Job (with apiVersion batch/v1)"));
    }
    let mut meta = take(&mut v, "metadata").unwrap_or(Value::Null);
    let name = req_str(take(&mut meta, "name"), "metadata.name")?.ok_or_else(|| ApiError::missing("metadata.name"))?;
    let tenant = req_str(take(&mut meta, "namespace"), "metadata.namespace")?;
    let mut job = JobSubmission::new(&name, 0, 1);
    job.tenant = tenant;
    let mut spec = take(&mut v, "spec").ok_or_else(|| ApiError::missing("spec"))?;
    if let Some(p) = take(&mut spec, "parallelism") {
        job.tasks = p
            .as_u64()
            .filter(|n| (1..=4096).contains(n))
            .ok_or_else(|| ApiError::invalid("spec.parallelism", &shown(&p), "a whole number from 1 to 4096"))?
            as u32;
    }
    if let Some(c) = take(&mut spec, "completions") {
        if c.as_u64() != Some(job.tasks as u64) {
            warnings.push(format!(
                "spec.completions {} differs from parallelism {}: gpunet runs one gang of {} tasks that completes together",
                text(&c).unwrap_or_default(),
                job.tasks,
                job.tasks
            ));
        }
    }
    if let Some(b) = take(&mut spec, "backoffLimit") {
        job.max_restarts = Some(
            b.as_u64()
                .filter(|n| *n <= 100)
                .ok_or_else(|| ApiError::invalid("spec.backoffLimit", &shown(&b), "a whole number from 0 to 100"))?
                as u32,
        );
    }
    let mut template = take(&mut spec, "template").ok_or_else(|| ApiError::missing("spec.template"))?;
    if let Some(m) = take(&mut template, "metadata") {
        leftovers(&m, "spec.template.metadata", &mut warnings);
    }
    let mut pod = take(&mut template, "spec").ok_or_else(|| ApiError::missing("spec.template.spec"))?;
    if let Some(Value::Mapping(sel)) = take(&mut pod, "nodeSelector") {
        for (k, x) in sel {
            job.selector.insert(text(&k).unwrap_or_default(), text(&x).unwrap_or_default());
        }
    }
    if let Some(a) = take(&mut pod, "affinity") {
        node_affinity(a, "spec.template.spec.affinity", &mut job.affinity)?;
    }
    if let Some(Value::Sequence(tols)) = take(&mut pod, "tolerations") {
        for (i, mut t) in tols.into_iter().enumerate() {
            let f = format!("spec.template.spec.tolerations[{i}]");
            let key = req_str(take(&mut t, "key"), &format!("{f}.key"))?
                .ok_or_else(|| ApiError::missing(&format!("{f}.key")))?;
            let op = req_str(take(&mut t, "operator"), &format!("{f}.operator"))?.unwrap_or_else(|| "Equal".into());
            let value = req_str(take(&mut t, "value"), &format!("{f}.value"))?;
            take(&mut t, "effect");
            job.tolerations.push(TolerationSpec { key, value: if op == "Exists" { None } else { value } });
            leftovers(&t, &f, &mut warnings);
        }
    }
    if let Some(r) = take(&mut pod, "restartPolicy") {
        let r = text(&r).unwrap_or_default();
        if r != "Never" && r != "OnFailure" {
            return Err(ApiError::invalid("spec.template.spec.restartPolicy", &r, "Never or OnFailure"));
        }
    }
    let containers = match take(&mut pod, "containers") {
        Some(Value::Sequence(c)) if !c.is_empty() => c,
        _ => return Err(ApiError::missing("spec.template.spec.containers")),
    };
    if containers.len() > 1 {
        return Err(ApiError::invalid(
            "spec.template.spec.containers",
            &format!("{} containers", containers.len()),
            "one container per task",
        ));
    }
    let mut c = containers.into_iter().next().expect("checked non-empty");
    let cp = "spec.template.spec.containers[0]";
    take(&mut c, "name");
    job.image = req_str(take(&mut c, "image"), &format!("{cp}.image"))?;
    let volumes = volumes(take(&mut pod, "volumes"), &mut warnings)?;
    if let Some(v) = take(&mut c, "volumeMounts") {
        let Value::Sequence(mounts) = v else {
            return Err(ApiError::invalid(&format!("{cp}.volumeMounts"), &shown(&v), "a list"));
        };
        let mut out = Vec::new();
        for (i, mut m) in mounts.into_iter().enumerate() {
            let f = format!("{cp}.volumeMounts[{i}]");
            let name = req_str(take(&mut m, "name"), &format!("{f}.name"))?
                .ok_or_else(|| ApiError::missing(&format!("{f}.name")))?;
            let path = req_str(take(&mut m, "mountPath"), &format!("{f}.mountPath"))?
                .ok_or_else(|| ApiError::missing(&format!("{f}.mountPath")))?;
            let read_only = matches!(take(&mut m, "readOnly"), Some(Value::Bool(true)));
            let host_path = volumes.get(&name).cloned().ok_or_else(|| {
                ApiError::invalid(&format!("{f}.name"), &name, "the name of a hostPath or emptyDir volume of the pod")
            })?;
            out.push(crate::image::ContainerMount { path, host_path, read_only });
            leftovers(&m, &f, &mut warnings);
        }
        if !out.is_empty() {
            job.container.get_or_insert_with(Default::default).mounts = out;
        }
    }
    let mut command = strings(take(&mut c, "command"), &format!("{cp}.command"))?;
    command.extend(strings(take(&mut c, "args"), &format!("{cp}.args"))?);
    job.command = command;
    if let Some(Value::Sequence(env)) = take(&mut c, "env") {
        for (i, mut e) in env.into_iter().enumerate() {
            let f = format!("{cp}.env[{i}]");
            let n = req_str(take(&mut e, "name"), &format!("{f}.name"))?
                .ok_or_else(|| ApiError::missing(&format!("{f}.name")))?;
            let val = req_str(take(&mut e, "value"), &format!("{f}.value"))?.unwrap_or_default();
            job.env.insert(n, val);
            leftovers(&e, &f, &mut warnings);
        }
    }
    job.working_dir = req_str(take(&mut c, "workingDir"), &format!("{cp}.workingDir"))?;
    if let Some(mut res) = take(&mut c, "resources") {
        let mut limits = take(&mut res, "limits").unwrap_or(Value::Mapping(Mapping::new()));
        let mut requests = take(&mut res, "requests").unwrap_or(Value::Mapping(Mapping::new()));
        let gpu_l = req_str(take(&mut limits, "nvidia.com/gpu"), &format!("{cp}.resources.limits.nvidia.com/gpu"))?;
        let gpu_r = req_str(take(&mut requests, "nvidia.com/gpu"), &format!("{cp}.resources.requests.nvidia.com/gpu"))?;
        if let Some(g) = gpu_l.or(gpu_r) {
            job.gpus = g.parse().map_err(|_| {
                ApiError::invalid(&format!("{cp}.resources.limits.nvidia.com/gpu"), &g, "a whole number of GPUs")
            })?;
        }
        for (key, slot) in [("cpu", 0), ("memory", 1)] {
            let r = req_str(take(&mut requests, key), &format!("{cp}.resources.requests.{key}"))?;
            let l = req_str(take(&mut limits, key), &format!("{cp}.resources.limits.{key}"))?;
            if let Some(q) = r.or(l) {
                let field = format!("{cp}.resources.requests.{key}");
                if slot == 0 {
                    parse_cpu(&field, &q)?;
                    job.cpu = Some(Quantity::Str(q));
                } else {
                    parse_memory(&field, &q)?;
                    job.memory = Some(Quantity::Str(q));
                }
            }
        }
        // Kubernetes evicts a pod past its ephemeral-storage limit (else request); gpunet's `disk` is that bound.
        let l = req_str(take(&mut limits, "ephemeral-storage"), &format!("{cp}.resources.limits.ephemeral-storage"))?;
        let r =
            req_str(take(&mut requests, "ephemeral-storage"), &format!("{cp}.resources.requests.ephemeral-storage"))?;
        if let Some((q, kind)) = l.map(|q| (q, "limits")).or(r.map(|q| (q, "requests"))) {
            parse_memory(&format!("{cp}.resources.{kind}.ephemeral-storage"), &q)?;
            job.disk = Some(Quantity::Str(q));
        }
        leftovers(&limits, &format!("{cp}.resources.limits"), &mut warnings);
        leftovers(&requests, &format!("{cp}.resources.requests"), &mut warnings);
        leftovers(&res, &format!("{cp}.resources"), &mut warnings);
    }
    if let Some(a) = take(&mut c, "affinity") {
        warnings.push(format!(
            "{cp}.affinity is misplaced (Kubernetes expects it at spec.template.spec.affinity); gpunet applies it to the job"
        ));
        node_affinity(a, &format!("{cp}.affinity"), &mut job.affinity)?;
    }
    if let Some(mut probe) = take(&mut c, "livenessProbe") {
        let mut exec = take(&mut probe, "exec").ok_or_else(|| {
            ApiError::invalid(&format!("{cp}.livenessProbe"), "httpGet/tcpSocket", "an exec probe (a command)")
        })?;
        let command = strings(take(&mut exec, "command"), &format!("{cp}.livenessProbe.exec.command"))?;
        let secs = |x: Option<Value>, f: &str| -> Result<Option<String>, ApiError> {
            match x {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|s| *s <= 31_536_000)
                    .map(|s| Some(format!("{s}s")))
                    .ok_or_else(|| ApiError::invalid(f, &shown(&v), "whole seconds from 0 to 31536000")),
            }
        };
        let initial_delay =
            secs(take(&mut probe, "initialDelaySeconds"), &format!("{cp}.livenessProbe.initialDelaySeconds"))?;
        let period = secs(take(&mut probe, "periodSeconds"), &format!("{cp}.livenessProbe.periodSeconds"))?;
        job.liveness = Some(LivenessSpec { command, initial_delay, period });
        leftovers(&probe, &format!("{cp}.livenessProbe"), &mut warnings);
    }
    leftovers(&c, cp, &mut warnings);
    leftovers(&pod, "spec.template.spec", &mut warnings);
    leftovers(&template, "spec.template", &mut warnings);
    leftovers(&spec, "spec", &mut warnings);
    leftovers(&meta, "metadata", &mut warnings);
    leftovers(&v, "", &mut warnings);
    Ok(ParsedJob { job, warnings: warnings.finish() })
}

/// A tenant quota from a ResourceQuota: guarantee and limit alike (a ResourceQuota is a hard cap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaSubmission {
    /// Tenant: the quota's namespace (Kubernetes applies a ResourceQuota of any name to its namespace), else its name.
    pub tenant: String,
    /// GPUs.
    pub gpus: Option<u64>,
    /// CPU.
    pub cpu: Option<MilliCpu>,
    /// Memory.
    pub memory: Option<MiB>,
}

impl QuotaSubmission {
    /// The core quota.
    pub fn to_core(&self) -> Quota {
        let mut q = Quota::default();
        if let Some(g) = self.gpus {
            q = q.with(gpunet_core::tenant::DIM_GPUS, g, g);
        }
        if let Some(c) = self.cpu {
            q = q.cpu(c, c);
        }
        if let Some(m) = self.memory {
            q = q.mem(m, m);
        }
        q
    }
}

/// Parses a `v1` ResourceQuota (YAML or JSON).
pub fn quota_from_k8s(text_doc: &str) -> Result<(QuotaSubmission, Vec<String>), ApiError> {
    let mut v: Value = crate::spec::parse_document(text_doc)?;
    let mut warnings = Warnings::default();
    let api = req_str(take(&mut v, "apiVersion"), "apiVersion")?.unwrap_or_default();
    let kind = req_str(take(&mut v, "kind"), "kind")?.unwrap_or_default();
    if api != "v1" || kind != "ResourceQuota" {
        return Err(ApiError::invalid("kind", &format!("{api}/{kind}"), "v1/ResourceQuota"));
    }
    let mut meta = take(&mut v, "metadata").unwrap_or(Value::Null);
    let name = req_str(take(&mut meta, "name"), "metadata.name")?;
    let ns = req_str(take(&mut meta, "namespace"), "metadata.namespace")?;
    let tenant = ns.or(name).ok_or_else(|| ApiError::missing("metadata.namespace"))?;
    let mut spec = take(&mut v, "spec").ok_or_else(|| ApiError::missing("spec"))?;
    let mut hard = take(&mut spec, "hard").ok_or_else(|| ApiError::missing("spec.hard"))?;
    let mut q = QuotaSubmission { tenant, gpus: None, cpu: None, memory: None };
    for key in ["requests.nvidia.com/gpu", "nvidia.com/gpu", "limits.nvidia.com/gpu"] {
        if let Some(g) = req_str(take(&mut hard, key), &format!("spec.hard.{key}"))? {
            q.gpus = Some(g.parse::<u64>().ok().filter(|n| *n <= crate::units::MAX_GPUS).ok_or_else(|| {
                ApiError::invalid(&format!("spec.hard.{key}"), &g, "a whole number from 0 to 1000000")
            })?);
        }
    }
    for key in ["limits.cpu", "requests.cpu", "cpu"] {
        if let Some(c) = req_str(take(&mut hard, key), &format!("spec.hard.{key}"))? {
            q.cpu = Some(parse_cpu(&format!("spec.hard.{key}"), &c)?);
        }
    }
    for key in ["limits.memory", "requests.memory", "memory"] {
        if let Some(m) = req_str(take(&mut hard, key), &format!("spec.hard.{key}"))? {
            q.memory = Some(parse_memory(&format!("spec.hard.{key}"), &m)?);
        }
    }
    leftovers(&hard, "spec.hard", &mut warnings);
    leftovers(&spec, "spec", &mut warnings);
    leftovers(&meta, "metadata", &mut warnings);
    leftovers(&v, "", &mut warnings);
    Ok((q, warnings.finish()))
}
