//! gpunet's native job spec, in YAML or JSON, and its conversion to the core's `JobSpec`.
//!
//! ```yaml
//! apiVersion: gpunet/v1          # optional
//! kind: Job                      # optional
//! name: resnet50
//! tenant: team-a                 # optional: taken from the token when absent
//! tasks: 2                       # replicas (default 1)
//! gpus: 4                        # whole GPUs per task (or mig: 1g.10gb)
//! gpu_models: [A100-80GB, H100-80GB]
//! cpu: 16                        # per task: cores or 500m (default 1 core per GPU)
//! memory: 64Gi                   # per task (default 4 GiB per GPU)
//! disk: 200Gi                    # per task: the most of its node's disk it may use (default: the node's limit)
//! topology: zone                 # any | zone | rack | node | nvlink (default zone for gangs)
//! selector: {gpu-type: a100}     # node labels that must match
//! affinity: [{key: zone, operator: In, values: [zone-a]}]
//! tolerations: [{key: lifecycle, value: spot}]
//! priority: 0
//! estimated_duration: 2h            # what the scheduler plans with (backfill, ETAs); never enforced
//! time_limit: 4h                    # each attempt is killed after this long (SIGTERM, then SIGKILL after the grace)
//! preemptible: true
//! checkpoint_interval: 10m
//! max_restarts: 3
//! elastic: {min_tasks: 1, max_tasks: 4}
//! command: [python, train.py]
//! env: {EPOCHS: "90"}
//! working_dir: run/out          # relative, beneath the task's own directory (its HOME, the default working
//!                                # directory: DATA_DIR/homes/job-ID/rank-R on the agent's node); with an image
//!                                # also an absolute path inside the container
//! image: localhost/train:1       # run each task in this OCI image (see crate::image for the forms)
//! container: {network: host, shm_size: 8Gi, mounts: [{path: /data, host_path: /srv/data, read_only: true}]}
//! liveness: {command: [nvidia-smi], initial_delay: 30s, period: 10s}
//! array: 0-99%8                  # a job array: elements 0..99, at most 8 live at once
//! dependency: afterok:12,singleton  # start once job-12 succeeded and no earlier job of this name runs
//! hold_never_fits: false         # keep a job no registered node could ever hold (default: refused at submit)
//! hold: false                    # submit held: not scheduled until `gpunet release ID` (Slurm's --hold)
//! ```
//! Unknown fields are errors that name the field.

use crate::error::ApiError;
use crate::units::{parse_cpu, parse_duration, parse_memory};
use gpunet_core::{Elastic, GpuModel, JobSpec, SelectorOp, SelectorTerm, TenantId, Toleration, TopologyScope};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A quantity written as a number or a string (`8`, `"500m"`, `"32Gi"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Quantity {
    /// A number.
    Num(f64),
    /// A string with a unit.
    Str(String),
}

impl Quantity {
    /// The quantity as text.
    pub fn text(&self) -> String {
        match self {
            Quantity::Num(n) => n.to_string(),
            Quantity::Str(s) => s.clone(),
        }
    }
}

/// One required affinity term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AffinityTerm {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In` / `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// A toleration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TolerationSpec {
    /// Taint key.
    pub key: String,
    /// Taint value (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A checkpoint tier: the agent copies what the job writes to `GPUNET_CHECKPOINT_DIR` every `every`, keeping the
/// newest `keep` copies, to `url` (an object-store URL such as `file:///mnt/shared/ckpt`; none: the node's disk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointTierSpec {
    /// Name (`local`, `shared`, `archive`).
    pub name: String,
    /// How often.
    pub every: String,
    /// Copies kept (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
    /// Where; the node's own disk when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Elastic bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ElasticSpec {
    /// Fewest tasks.
    pub min_tasks: u32,
    /// Most tasks.
    pub max_tasks: u32,
}

/// A liveness probe: a command run in the task's environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LivenessSpec {
    /// Command and arguments.
    pub command: Vec<String>,
    /// Wait before the first probe (default 0s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<String>,
    /// Time between probes (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// A job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSubmission {
    /// `gpunet/v1` (optional).
    #[serde(default, rename = "apiVersion", skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `Job` (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Tenant name (optional; the token's tenant when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Priority.
    #[serde(default)]
    pub priority: i32,
    /// Tasks.
    #[serde(default = "one")]
    pub tasks: u32,
    /// Whole GPUs per task.
    #[serde(default)]
    pub gpus: u32,
    /// Allowed GPU models.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// Allow one gang to span models.
    #[serde(default)]
    pub allow_mixed_models: bool,
    /// A MIG slice per task instead of whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// CPU per task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory per task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// The most of its node's disk each task may use: its own directory, its job's checkpoint directory there and
    /// its log (`20Gi`). The agent measures them every few seconds and stops a task past it (SIGTERM, then SIGKILL
    /// after the grace); the attempt fails with the outcome `disk_limit`. The node's own limit (`gpunet agent
    /// --task-disk-max`, 100Gi by default) applies when absent or lower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Quantity>,
    /// All-or-nothing start (default: for multi-task jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<bool>,
    /// `any`, `zone`, `rack`, `node` or `nvlink`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// Node labels that must equal these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Required affinity terms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinity: Vec<AffinityTerm>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<TolerationSpec>,
    /// Estimated run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_duration: Option<String>,
    /// Run-time limit of each attempt: the agent stops the tasks (SIGTERM, then SIGKILL) once it has passed, and the
    /// attempt fails with the outcome `time_limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    /// Keep the job even when no registered node could ever hold it (it waits for such a node); by default such a
    /// job is refused at submit, saying why.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold_never_fits: bool,
    /// May be preempted.
    #[serde(default = "yes")]
    pub preemptible: bool,
    /// Checkpoint interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval: Option<String>,
    /// Restarts after failure (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// Elastic bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticSpec>,
    /// Command and arguments of each task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The OCI image each task runs in (see [`crate::image::ImageRef`]); without one, tasks run as processes on
    /// the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Container options (with `image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::image::ContainerSpec>,
    /// Liveness probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<LivenessSpec>,
    /// Checkpoint tiers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoint_tiers: Vec<CheckpointTierSpec>,
    /// A job array, Slurm's syntax: `0-99`, `0-99:2`, `1,3,7`, with a concurrency limit `%8`
    /// (see [`crate::depsyntax::parse_array`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    /// Dependencies, Slurm's syntax: `afterok:12:13,afterany:14[2],afternotok:15,singleton`
    /// (see [`crate::depsyntax::parse_dependency`]); resolved by the server against the jobs the submitter sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// Submitted held: not scheduled until released (`POST /v1/jobs/{id}/release`, `gpunet release`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Whether the job may run on spot nodes (labelled and tainted `lifecycle=spot`; their provider may reclaim them
    /// with short notice): `never`, `allowed`, or `preferred` (on spot when it fits there, else elsewhere). Absent:
    /// the tenant's default (`never` unless the tenant sets one). Spot GPU-seconds are billed at the spot price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<SpotUse>,
    /// The signal a reclaim notice sends the job's processes to ask for a checkpoint now (with the file named by
    /// `GPUNET_CHECKPOINT_NOW` created): `SIGUSR1` (the default), `SIGUSR2`, `SIGINT`, `SIGHUP`, `SIGTERM`, or
    /// `none` (the file only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_signal: Option<String>,
}

/// Whether a job may run on spot nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpotUse {
    /// Only on nodes that are not spot.
    #[default]
    Never,
    /// On spot nodes as on any other.
    Allowed,
    /// On spot nodes when it fits there, else elsewhere.
    Preferred,
}

impl SpotUse {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            SpotUse::Never => "never",
            SpotUse::Allowed => "allowed",
            SpotUse::Preferred => "preferred",
        }
    }
}

impl std::str::FromStr for SpotUse {
    type Err = ApiError;
    fn from_str(s: &str) -> Result<SpotUse, ApiError> {
        match s {
            "never" => Ok(SpotUse::Never),
            "allowed" => Ok(SpotUse::Allowed),
            "preferred" => Ok(SpotUse::Preferred),
            _ => Err(ApiError::invalid("spot", s, "never, allowed or preferred")),
        }
    }
}

/// The signals a job may choose for a checkpoint request, by name.
pub const CHECKPOINT_SIGNALS: [(&str, i32); 5] =
    [("SIGUSR1", 10), ("SIGUSR2", 12), ("SIGINT", 2), ("SIGHUP", 1), ("SIGTERM", 15)];

/// The signal number of a `checkpoint_signal` (`None`: the default SIGUSR1); `Ok(None)` for `none`.
pub fn checkpoint_signal(v: Option<&str>) -> Result<Option<i32>, ApiError> {
    let Some(v) = v else { return Ok(Some(10)) };
    if v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let up = v.to_ascii_uppercase();
    let name = if up.starts_with("SIG") { up } else { format!("SIG{up}") };
    CHECKPOINT_SIGNALS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| Some(*s))
        .ok_or_else(|| ApiError::invalid("checkpoint_signal", v, "SIGUSR1, SIGUSR2, SIGINT, SIGHUP, SIGTERM or none"))
}

impl JobSubmission {
    /// A submission with defaults.
    pub fn new(name: &str, gpus: u32, tasks: u32) -> JobSubmission {
        JobSubmission {
            api_version: None,
            kind: None,
            name: name.into(),
            tenant: None,
            priority: 0,
            tasks,
            gpus,
            gpu_models: Vec::new(),
            allow_mixed_models: false,
            mig: None,
            cpu: None,
            memory: None,
            disk: None,
            gang: None,
            topology: None,
            selector: BTreeMap::new(),
            affinity: Vec::new(),
            tolerations: Vec::new(),
            estimated_duration: None,
            time_limit: None,
            hold_never_fits: false,
            preemptible: true,
            checkpoint_interval: None,
            max_restarts: None,
            elastic: None,
            command: Vec::new(),
            env: BTreeMap::new(),
            working_dir: None,
            image: None,
            container: None,
            liveness: None,
            checkpoint_tiers: Vec::new(),
            array: None,
            dependency: None,
            hold: false,
            spot: None,
            checkpoint_signal: None,
        }
    }

    /// Validates and converts to the core's spec for `tenant`.
    pub fn to_core(&self, tenant: TenantId) -> Result<JobSpec, ApiError> {
        if let Some(v) = &self.api_version {
            if v != "gpunet/v1" {
                return Err(ApiError::invalid("apiVersion", v, "gpunet/v1 (or a batch/v1 Kubernetes Job)"));
            }
        }
        if let Some(k) = &self.kind {
            if k != "Job" {
                return Err(ApiError::invalid("kind", k, "Job"));
            }
        }
        if let Some(c) = self.name.chars().find(|c| !printable(*c)) {
            return Err(ApiError::invalid(
                "name",
                &self.name,
                &format!(
                    "printable text: no control or bidirectional-override characters (found U+{:04X}), which would \
                     rewrite what other users' terminals show",
                    c as u32
                ),
            ));
        }
        let mut spec = JobSpec::new(tenant, self.name.clone(), self.gpus, self.tasks);
        spec.priority = self.priority;
        spec.hold = self.hold;
        if let Some(a) = &self.array {
            spec.array = Some(Box::new(crate::depsyntax::parse_array("array", a)?));
        }
        if let Some(d) = &self.dependency {
            crate::depsyntax::parse_dependency("dependency", d)?;
        }
        for (i, m) in self.gpu_models.iter().enumerate() {
            let model: GpuModel = m.parse().map_err(|_| {
                ApiError::invalid(&format!("gpu_models[{i}]"), m, &GpuModel::ALL.map(|m| m.name()).join(", "))
            })?;
            spec.gpu_models.push(model);
        }
        spec.allow_mixed_models = self.allow_mixed_models;
        if let Some(p) = &self.mig {
            spec.task.mig = Some(p.parse().map_err(|_| ApiError::invalid("mig", p, "a MIG profile like 1g.10gb"))?);
            if self.cpu.is_none() {
                spec.task.cpu = gpunet_core::MilliCpu::cores(1);
            }
        }
        if let Some(c) = &self.cpu {
            spec.task.cpu = parse_cpu("cpu", &c.text())?;
        }
        if let Some(m) = &self.memory {
            spec.task.mem = parse_memory("memory", &m.text())?;
        }
        if let Some(d) = &self.disk {
            if parse_memory("disk", &d.text())?.0 == 0 {
                return Err(ApiError::invalid("disk", &d.text(), "at least 1Mi"));
            }
        }
        if let Some(g) = self.gang {
            spec.gang = g;
        }
        if let Some(t) = &self.topology {
            spec.topology = match t.as_str() {
                "any" => TopologyScope::Any,
                "zone" => TopologyScope::Zone,
                "rack" => TopologyScope::Rack,
                "node" => TopologyScope::Node,
                "nvlink" => TopologyScope::NvLink,
                _ => return Err(ApiError::invalid("topology", t, "any, zone, rack, node or nvlink")),
            };
        }
        for (k, v) in &self.selector {
            spec.selector.push(SelectorTerm::eq(k, v));
        }
        for (i, a) in self.affinity.iter().enumerate() {
            spec.selector.push(affinity_term(&format!("affinity[{i}]"), a)?);
        }
        spec.tolerations =
            self.tolerations.iter().map(|t| Toleration { key: t.key.clone(), value: t.value.clone() }).collect();
        let spot_toleration = |t: &Toleration| t.key == "lifecycle" && t.value.as_deref().is_none_or(|v| v == "spot");
        match self.spot {
            Some(SpotUse::Never) if spec.tolerations.iter().any(spot_toleration) => {
                return Err(ApiError::invalid(
                    "spot",
                    "never",
                    "allowed or preferred with a toleration of lifecycle=spot (or drop the toleration)",
                ));
            }
            Some(SpotUse::Allowed | SpotUse::Preferred) => {
                if !spec.tolerations.iter().any(spot_toleration) {
                    spec.tolerations.push(Toleration { key: "lifecycle".into(), value: Some("spot".into()) });
                }
                spec.prefer_spot = self.spot == Some(SpotUse::Preferred);
            }
            _ => {}
        }
        checkpoint_signal(self.checkpoint_signal.as_deref())?;
        if let Some(d) = &self.estimated_duration {
            spec.estimated_duration = Some(parse_duration("estimated_duration", d)?);
        }
        if let Some(d) = &self.time_limit {
            if parse_duration("time_limit", d)?.0 < 1000 {
                return Err(ApiError::invalid("time_limit", d, "at least 1s"));
            }
        }
        spec.preemptible = self.preemptible;
        if let Some(d) = &self.checkpoint_interval {
            spec.checkpoint_interval = Some(parse_duration("checkpoint_interval", d)?);
        }
        if let Some(r) = self.max_restarts {
            if r > 100 {
                return Err(ApiError::invalid("max_restarts", &r.to_string(), "0 to 100"));
            }
            spec.max_restarts = r;
        }
        spec.elastic = self.elastic.map(|e| Elastic { min_tasks: e.min_tasks, max_tasks: e.max_tasks });
        if let Some(l) = &self.liveness {
            if l.command.is_empty() {
                return Err(ApiError::invalid("liveness.command", "[]", "a command to run"));
            }
            for (f, v) in [("liveness.initial_delay", &l.initial_delay), ("liveness.period", &l.period)] {
                if let Some(v) = v {
                    parse_duration(f, v)?;
                }
            }
        }
        if self.checkpoint_tiers.len() > 8 {
            return Err(ApiError::invalid(
                "checkpoint_tiers",
                &self.checkpoint_tiers.len().to_string(),
                "at most 8 tiers",
            ));
        }
        for (i, t) in self.checkpoint_tiers.iter().enumerate() {
            let f = format!("checkpoint_tiers[{i}]");
            valid_tier_name(&format!("{f}.name"), &t.name)?;
            let every = parse_duration(&format!("{f}.every"), &t.every)?;
            if every.0 < 100 {
                return Err(ApiError::invalid(&format!("{f}.every"), &t.every, "at least 100ms"));
            }
            if t.keep == Some(0) || t.keep.is_some_and(|k| k > 1000) {
                return Err(ApiError::invalid(&format!("{f}.keep"), &t.keep.unwrap_or(0).to_string(), "1 to 1000"));
            }
            if let Some(u) = &t.url {
                let bucket = u.strip_prefix("s3://").map(|r| r.split('/').next().unwrap_or_default());
                let ok = u.starts_with("file:///")
                    || bucket.is_some_and(|b| {
                        (3..=63).contains(&b.len())
                            && b.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                    });
                if !ok {
                    return Err(ApiError::invalid(
                        &format!("{f}.url"),
                        u,
                        "a file:///path URL (a directory every node mounts) or s3://bucket/prefix (an S3 or \
                         S3-compatible store; the agent's AWS_* environment gives credentials, region and endpoint)",
                    ));
                }
            }
        }
        // A NUL cannot be passed to a program: the task (or probe) could only fail to start.
        let args = self.command.iter().enumerate().map(|(i, a)| (format!("command[{i}]"), a));
        let probe = self.liveness.iter().flat_map(|l| l.command.iter().enumerate());
        for (f, a) in args.chain(probe.map(|(i, a)| (format!("liveness.command[{i}]"), a))) {
            if a.contains('\0') {
                return Err(ApiError::invalid(&f, a, "text without NUL characters"));
            }
        }
        let cmd_bytes: usize = self.command.iter().map(String::len).sum();
        if self.command.len() > 4096 || cmd_bytes > 256 * 1024 {
            return Err(ApiError::invalid(
                "command",
                &format!("{} arguments, {cmd_bytes} bytes", self.command.len()),
                "at most 4096 arguments and 256 KiB",
            ));
        }
        let env_bytes: usize = self.env.iter().map(|(k, v)| k.len() + v.len()).sum();
        if self.env.len() > 1024 || env_bytes > 256 * 1024 {
            return Err(ApiError::invalid(
                "env",
                &format!("{} variables, {env_bytes} bytes", self.env.len()),
                "at most 1024 variables and 256 KiB",
            ));
        }
        if self.working_dir.as_ref().is_some_and(|w| w.len() > 4096) {
            return Err(ApiError::invalid("working_dir", "a path over 4096 bytes", "at most 4096 bytes"));
        }
        if let Some(w) = &self.working_dir {
            let in_image = self.image.is_some() && crate::image::absolute_path(w).is_some();
            if relative_working_dir(w).is_none() && !in_image {
                return Err(ApiError::invalid(
                    "working_dir",
                    w,
                    "a relative path without '..' (it is made beneath the task's own directory, its HOME), or \
                     with an image an absolute path in the container",
                ));
            }
        }
        match (&self.image, &self.container) {
            (Some(i), c) => {
                let image = crate::image::ImageRef::parse("image", i)?;
                if let Some(c) = c {
                    c.validate(spec.task.mem.0)?;
                }
                for label in crate::image::required_labels(&image) {
                    spec.selector.push(SelectorTerm::eq(label, "true"));
                }
            }
            (None, Some(_)) => {
                return Err(ApiError::invalid("container", "options without an image", "set image as well"));
            }
            (None, None) => {}
        }
        if self.selector.len() + self.affinity.len() > 64 || self.tolerations.len() > 64 || self.gpu_models.len() > 32 {
            return Err(ApiError::invalid(
                "selector",
                "too many terms",
                "at most 64 selector/affinity terms, 64 tolerations, 32 models",
            ));
        }
        if self.env.keys().any(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
            return Err(ApiError::invalid("env", "a key with '=', NUL or empty", "names without '=' or NUL"));
        }
        for (k, v) in &self.env {
            if reserved_env(k) {
                return Err(ApiError::invalid(
                    &format!("env.{k}"),
                    v,
                    "a variable gpunet does not set itself (PATH, HOME, GPUNET_*, CUDA_VISIBLE_DEVICES, \
                     CUDA_DEVICE_ORDER, NVIDIA_VISIBLE_DEVICES, NCCL_P2P_LEVEL, NCCL_IB_DISABLE and the rank \
                     variables are the node's)",
                ));
            }
            if v.contains('\0') {
                return Err(ApiError::invalid(&format!("env.{k}"), "a value with NUL", "text without NUL"));
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

/// Variables the node sets for every task (see `gpunet_agent::launcher`); a job may not set them. `LD_PRELOAD` and
/// `LD_LIBRARY_PATH` are allowed: they reach only the task's own process (which runs with the task's identity),
/// never the root-run wrapper that starts it.
pub const RESERVED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "NCCL_P2P_LEVEL",
    "NCCL_IB_DISABLE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// Whether a character may stand in a name shown to other users (a job's name in `gpunet jobs`, the portal, events):
/// not a control character (escape sequences, carriage returns and newlines forge or erase rows on a terminal), not a
/// bidirectional mark, override or isolate (which reorder what is shown), not a line or paragraph separator, and not
/// an invisible zero-width space or byte-order mark (a name that looks like another). The zero-width joiners that
/// scripts and emoji need are allowed.
pub fn printable(c: char) -> bool {
    !c.is_control()
        && !matches!(
            c,
            '\u{061C}'
                | '\u{200B}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `s` with every character that is not [`printable`] written as its escape (`\n`, `\u{1b}`), so that text a job
/// chose (a stored name, a probe's command quoted in a failure) stays one line and cannot move a terminal's cursor,
/// erase or forge rows. The CLI shows other users' text through it; the agent quotes a probe's command with it.
pub fn escape_unprintable(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().all(printable) {
        return s.into();
    }
    s.chars()
        .map(|c| if printable(c) { c.to_string() } else { c.escape_default().to_string() })
        .collect::<String>()
        .into()
}

/// Whether a job may not set `name` in its `env`: one of [`RESERVED_ENV`] or any `GPUNET_*`.
pub fn reserved_env(name: &str) -> bool {
    name.starts_with("GPUNET_") || RESERVED_ENV.contains(&name)
}

/// The components of a job's `working_dir` when it is a relative path of plain names (no `..`, `.`, empty parts or
/// NUL): it is then made beneath the task's own directory. `None` for anything else.
pub fn relative_working_dir(w: &str) -> Option<Vec<&str>> {
    if w.is_empty() || w.starts_with('/') || w.contains('\0') {
        return None;
    }
    let parts: Vec<&str> = w.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    (!parts.is_empty() && parts.iter().all(|p| *p != "..")).then_some(parts)
}

/// The parts of an object-store URL (`file:///a/b` gives `["file:", "a", "b"]`, `s3://bucket/p` gives
/// `["s3:", "bucket", "p"]`) when it has no `.`/`..` part, no percent-escape, query, fragment, backslash or NUL.
fn url_parts(u: &str) -> Option<Vec<&str>> {
    let (scheme, rest) = if let Some(r) = u.strip_prefix("file://") {
        ("file:", r.strip_prefix('/')?)
    } else {
        ("s3:", u.strip_prefix("s3://")?)
    };
    if rest.chars().any(|c| matches!(c, '%' | '?' | '#' | '\\' | '\0')) {
        return None;
    }
    let mut parts = vec![scheme];
    for p in rest.split('/').filter(|p| !p.is_empty()) {
        if p == "." || p == ".." {
            return None;
        }
        parts.push(p);
    }
    Some(parts)
}

/// Checks that every checkpoint tier URL of a job of `tenant` lies beneath one of the roots the admin configured
/// (`file:///srv/ckpt/{tenant}`, `s3://bucket/{tenant}/`; `{tenant}` is replaced by the tenant's name). URLs are
/// compared part by part, after refusing `.`/`..` parts and escapes, so `file:///srv/../etc` never passes. Without
/// roots only tiers without a URL (the node's own disk) are accepted.
pub fn check_checkpoint_roots(job: &JobSubmission, tenant: &str, roots: &[String]) -> Result<(), ApiError> {
    let tenant_ok = !tenant.is_empty()
        && tenant != "."
        && tenant != ".."
        && tenant.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    for (i, t) in job.checkpoint_tiers.iter().enumerate() {
        let Some(u) = &t.url else { continue };
        let beneath = tenant_ok
            && url_parts(u).is_some_and(|parts| {
                roots.iter().any(|r| {
                    url_parts(&r.replace("{tenant}", tenant))
                        .is_some_and(|root| parts.len() >= root.len() && parts[..root.len()] == root[..])
                })
            });
        if !beneath {
            let allowed = if roots.is_empty() {
                "no URL: this server has no checkpoint roots (--checkpoint-root), so tiers live on the nodes' disks"
                    .to_string()
            } else {
                format!(
                    "a URL beneath one of this tenant's checkpoint roots: {}",
                    roots.iter().map(|r| r.replace("{tenant}", tenant)).collect::<Vec<_>>().join(", ")
                )
            };
            return Err(ApiError::invalid(&format!("checkpoint_tiers[{i}].url"), u, &allowed));
        }
    }
    Ok(())
}

fn valid_tier_name(field: &str, n: &str) -> Result<(), ApiError> {
    if n.is_empty() || n.len() > 32 || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(ApiError::invalid(field, n, "1 to 32 letters, digits, '-' or '_'"));
    }
    Ok(())
}

/// Converts one affinity term.
pub fn affinity_term(field: &str, a: &AffinityTerm) -> Result<SelectorTerm, ApiError> {
    let op = match a.operator.as_str() {
        "In" => SelectorOp::In,
        "NotIn" => SelectorOp::NotIn,
        "Exists" => SelectorOp::Exists,
        "DoesNotExist" => SelectorOp::DoesNotExist,
        o => return Err(ApiError::invalid(&format!("{field}.operator"), o, "In, NotIn, Exists or DoesNotExist")),
    };
    if matches!(op, SelectorOp::In | SelectorOp::NotIn) && a.values.is_empty() {
        return Err(ApiError::invalid(&format!("{field}.values"), "[]", "at least one value for In / NotIn"));
    }
    Ok(SelectorTerm { key: a.key.clone(), op, values: a.values.clone() })
}

/// A job spec read from a document, with the warnings of its conversion.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedJob {
    /// The submission.
    pub job: JobSubmission,
    /// Fields accepted with a caveat or not honoured, each named.
    pub warnings: Vec<String>,
}

/// The field and the allowed fields of serde's "unknown field" message, if it is one.
fn unknown_field(msg: &str) -> Option<(String, String)> {
    let rest = msg.split("unknown field `").nth(1)?;
    let field = rest.split('`').next().unwrap_or("").to_string();
    let allowed = msg.split("expected one of ").nth(1).unwrap_or("the documented fields").replace('`', "");
    Some((field, allowed.trim_end_matches(|c: char| !c.is_alphanumeric()).to_string()))
}

fn serde_error(e: &dyn std::fmt::Display) -> ApiError {
    let msg = e.to_string();
    if let Some((field, allowed)) = unknown_field(&msg) {
        return ApiError::unknown(&field, &allowed);
    }
    if let Some(rest) = msg.split("missing field `").nth(1) {
        return ApiError::missing(rest.split('`').next().unwrap_or(""));
    }
    ApiError::parse(format!("parse the job spec: {msg}"))
}

/// Reads a parsed request document (`what`: "tenant", …) into `T`, naming a bad field by its path (`quota.cohort`,
/// with the fields allowed there) rather than by its last name.
pub fn from_document<T: serde::de::DeserializeOwned>(v: serde_norway::Value, what: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        match unknown_field(&msg) {
            Some((field, allowed)) => ApiError::unknown(if path == "." { &field } else { &path }, &allowed),
            None => ApiError {
                field: (path != ".").then(|| path.clone()),
                ..ApiError::parse(format!("parse the {what} at {path}: {msg}"))
            },
        }
    })
}

/// Parses a request document, JSON or YAML, after the checks of [`crate::limits`]: JSON is scanned for its depth and
/// parsed by `serde_json` (linear time); YAML is bounded in size and depth and may not use aliases.
pub fn parse_document(text: &str) -> Result<serde_norway::Value, ApiError> {
    use crate::limits::{check_json_depth, check_yaml, looks_like_json, MAX_YAML_BYTES};
    if looks_like_json(text) {
        check_json_depth(text)?;
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(j) => return serde_norway::to_value(&j).map_err(|e| serde_error(&e)),
            // Not JSON; small documents may still be YAML in flow style (`{name: x}`).
            Err(e) if text.len() > MAX_YAML_BYTES => {
                return Err(ApiError::parse(format!("parse the JSON document: {e}")));
            }
            Err(_) => {}
        }
    }
    check_yaml(text)?;
    serde_norway::from_str(text).map_err(|e| serde_error(&e))
}

/// Checks that a number in `v` at `field` is a whole number in `0..=max`, naming the field otherwise.
fn whole(field: &str, x: &serde_norway::Value, max: u64) -> Result<(), ApiError> {
    if x.as_u64().is_some_and(|n| n <= max) {
        return Ok(());
    }
    let shown = serde_json::to_string(x).unwrap_or_default();
    Err(ApiError::invalid(field, shown.trim_matches('"'), &format!("a whole number from 0 to {max}")))
}

/// Parses a job document: gpunet's native spec or a Kubernetes `batch/v1` Job, in YAML or JSON.
pub fn parse_job(text: &str) -> Result<ParsedJob, ApiError> {
    let v = parse_document(text)?;
    let api = v.get("apiVersion").and_then(|a| a.as_str()).unwrap_or("");
    if api == "batch/v1" {
        return crate::k8s::job_from_k8s(&v);
    }
    if let Some(m) = v.as_mapping() {
        // Name the field when a value has the wrong type (serde's message does not).
        let kinds: [(&str, &str); 9] = [
            ("gpus", "u"),
            ("tasks", "u"),
            ("priority", "i"),
            ("max_restarts", "u"),
            ("preemptible", "b"),
            ("gang", "b"),
            ("allow_mixed_models", "b"),
            ("gpu_models", "s"),
            ("command", "s"),
        ];
        for (f, k) in kinds {
            let Some(x) = m.get(f) else { continue };
            let ok = match k {
                "u" => x.as_u64().is_some_and(|n| n <= u32::MAX as u64),
                "i" => x.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                "b" => x.is_bool(),
                _ => x.is_sequence(),
            };
            if !ok {
                let shown = serde_json::to_string(x).unwrap_or_default();
                let allowed = match k {
                    "u" => "a whole number from 0 to 4294967295",
                    "i" => "a whole number from -2147483648 to 2147483647",
                    "b" => "true or false",
                    _ => "a list",
                };
                return Err(ApiError::invalid(f, shown.trim_matches('"'), allowed));
            }
        }
        // Nested numbers, so that none is truncated or refused without its name.
        if let Some(e) = m.get("elastic").and_then(|e| e.as_mapping()) {
            for f in ["min_tasks", "max_tasks"] {
                if let Some(x) = e.get(f) {
                    whole(&format!("elastic.{f}"), x, u32::MAX as u64)?;
                }
            }
        }
        if let Some(tiers) = m.get("checkpoint_tiers").and_then(|t| t.as_sequence()) {
            for (i, t) in tiers.iter().enumerate() {
                if let Some(x) = t.get("keep") {
                    whole(&format!("checkpoint_tiers[{i}].keep"), x, 1000)?;
                }
            }
        }
    }
    let job: JobSubmission = serde_norway::from_value(v).map_err(|e| serde_error(&e))?;
    Ok(ParsedJob { job, warnings: Vec::new() })
}

#[cfg(test)]
mod tests {

    /// Optional fields left out are left out of the JSON form too: a tier without `keep`, once written as JSON,
    /// read back as `"keep": null`, which the range check refuses (found by the `job_spec` fuzz target; its input is
    /// a seed of `fuzz/seeds/job_spec/`).
    #[test]
    fn spot_use_becomes_a_toleration_and_a_preference_and_bad_values_name_their_field() {
        let t = TenantId(0);
        let mut j = JobSubmission::new("j", 1, 1);
        let never = j.to_core(t).unwrap();
        assert!(never.tolerations.is_empty() && !never.prefer_spot);
        j.spot = Some(SpotUse::Allowed);
        let allowed = j.to_core(t).unwrap();
        assert_eq!(allowed.tolerations.len(), 1);
        assert!(!allowed.prefer_spot);
        j.spot = Some(SpotUse::Preferred);
        assert!(j.to_core(t).unwrap().prefer_spot);
        j.spot = Some(SpotUse::Never);
        j.tolerations = vec![TolerationSpec { key: "lifecycle".into(), value: Some("spot".into()) }];
        assert_eq!(j.to_core(t).unwrap_err().field.as_deref(), Some("spot"));
        let mut k = JobSubmission::new("k", 1, 1);
        k.checkpoint_signal = Some("SIGKILL".into());
        assert_eq!(k.to_core(t).unwrap_err().field.as_deref(), Some("checkpoint_signal"));
        assert_eq!(checkpoint_signal(Some("usr2")).unwrap(), Some(12));
        assert_eq!(checkpoint_signal(Some("none")).unwrap(), None);
        assert_eq!(checkpoint_signal(None).unwrap(), Some(10));
        let y: JobSubmission = serde_json::from_str(r#"{"name": "x", "spot": "preferred"}"#).unwrap();
        assert_eq!(y.spot, Some(SpotUse::Preferred));
        assert!(serde_json::from_str::<JobSubmission>(r#"{"name": "x", "spot": "sometimes"}"#).is_err());
    }

    #[test]
    fn optional_fields_left_out_round_trip_through_json() {
        let text = r#"{"name": "j", "checkpoint_tiers": [{"name": "local", "every": "1m"}],
            "tolerations": [{"key": "spot"}], "liveness": {"command": ["true"]}}"#;
        let job = parse_job(text).unwrap().job;
        let json = serde_json::to_string(&job).unwrap();
        assert!(!json.contains("null"), "{json}");
        assert_eq!(parse_job(&json).unwrap().job, job);
    }

    use super::*;

    #[test]
    fn native_yaml_converts_with_every_field() {
        let p = parse_job(
            "name: bert\ntasks: 2\ngpus: 4\ngpu_models: [A100-80GB]\ncpu: 16\nmemory: 64Gi\ntopology: rack\n\
             selector: {gpu-type: a100}\naffinity: [{key: zone, operator: NotIn, values: [z9]}]\n\
             tolerations: [{key: lifecycle, value: spot}]\npriority: 2\nestimated_duration: 2h\n\
             checkpoint_interval: 10m\nmax_restarts: 5\ncommand: [python, train.py]\nenv: {EPOCHS: \"90\"}\n",
        )
        .unwrap();
        let s = p.job.to_core(TenantId(0)).unwrap();
        assert_eq!((s.tasks, s.task.gpus, s.priority, s.max_restarts), (2, 4, 2, 5));
        assert_eq!(s.task.cpu, gpunet_core::MilliCpu(16_000));
        assert_eq!(s.topology, TopologyScope::Rack);
        assert_eq!(s.selector.len(), 2);
        assert_eq!(s.estimated_duration, Some(gpunet_core::Dur::from_hours(2)));
        assert!(s.gang);
    }

    #[test]
    fn json_works_too_and_errors_name_the_field() {
        let p = parse_job(r#"{"name": "x", "gpus": 1}"#).unwrap();
        assert_eq!(p.job.tasks, 1);
        let e = parse_job("name: x\ngpus: 1\ncolour: red\n").unwrap_err();
        assert_eq!((e.code.as_str(), e.field.as_deref()), ("unknown_field", Some("colour")));
        assert!(e.message.contains("gpu_models"), "{}", e.message);
        let e = parse_job("gpus: 1\n").unwrap_err();
        assert_eq!((e.code.as_str(), e.field.as_deref()), ("missing_field", Some("name")));
        let e = parse_job("name: x\ngpus: [1\n").unwrap_err();
        assert_eq!(e.code, "parse_error");
        let e = parse_job("name: x\ngpus: 1\ngpu_models: [B300]\n").unwrap().job.to_core(TenantId(0)).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("gpu_models[0]"));
        let e = parse_job("name: x\ngpus: 1\ntasks: 0\n").unwrap().job.to_core(TenantId(0)).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tasks"));
        let e = parse_job("name: x\ngpus: 1\ntopology: galaxy\n").unwrap().job.to_core(TenantId(0)).unwrap_err();
        assert!(e.message.contains("nvlink"));
        let e =
            parse_job("name: x\ngpus: 1\ncheckpoint_interval: often\n").unwrap().job.to_core(TenantId(0)).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_interval"));
    }

    /// A hostile tenant's name that would rewrite an admin's terminal (erase a row and print a forged one, set the
    /// window title) or reorder it (a bidirectional override) is refused, naming the field; other scripts are fine.
    #[test]
    fn a_name_with_control_or_bidi_characters_is_refused() {
        let core = |name: &str| {
            let mut s = JobSubmission::new(name, 1, 1);
            s.gpus = 1;
            s.to_core(TenantId(0))
        };
        for bad in [
            "x\u{1b}[1A\r\u{1b}[2Kforged",
            "a\nb",
            "t\u{1b}]0;pwn\u{7}",
            "x\u{9b}2J",
            "abc\u{202E}fdp.exe",
            "\u{2066}x",
            "a\u{061C}b",
            "a\u{2028}b",
            "ad\u{200B}min",
            "\u{FEFF}x",
        ] {
            let e = core(bad).unwrap_err();
            assert_eq!((e.code.as_str(), e.field.as_deref()), ("invalid_field", Some("name")), "{bad:?}");
            assert!(e.message.contains("printable"), "{}", e.message);
        }
        // Zero-width non-joiner and joiner: Persian words and emoji sequences need them.
        for good in
            ["resnet-50 (fine-tune)", "日本語の実験", "Überprüfung", "emoji 🚀", "می\u{200C}خواهم", "👩\u{200D}🔬"]
        {
            core(good).unwrap();
        }
    }

    #[test]
    fn a_job_cannot_set_the_nodes_own_variables() {
        let core = |env: &str| parse_job(&format!("name: x\ngpus: 1\nenv: {env}\n")).unwrap().job.to_core(TenantId(0));
        core("{EPOCHS: \"3\", LD_LIBRARY_PATH: /opt/lib, LANG: de_DE.UTF-8}").unwrap();
        for k in ["GPUNET_CGROUP_PROCS", "GPUNET_CHECKPOINT_DIR", "PATH", "HOME", "CUDA_VISIBLE_DEVICES", "RANK"] {
            let e = core(&format!("{{{k}: x}}")).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(format!("env.{k}").as_str()), "{k}");
        }
        let e = core("{A: \"a\\0b\"}").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("env.A"));
    }

    /// An argument with a NUL was accepted and the task could only fail to start: refused, naming the argument.
    #[test]
    fn a_command_or_probe_argument_with_a_nul_is_refused() {
        let job = |y: &str| parse_job(&format!("name: x\ngpus: 1\n{y}\n")).unwrap().job.to_core(TenantId(0));
        let e = job("command: [sh, \"-c\", \"a\\0b\"]").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("command[2]"));
        let e = job("command: [\"true\"]\nliveness: {command: [\"t\\0\"]}").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("liveness.command[0]"));
        job("command: [sh, \"-c\", \"echo ok\"]").unwrap();
    }

    #[test]
    fn working_dir_is_relative_and_stays_beneath_the_task_directory() {
        let core =
            |w: &str| parse_job(&format!("name: x\ngpus: 1\nworking_dir: {w:?}\n")).unwrap().job.to_core(TenantId(0));
        core("run/out").unwrap();
        core("./run").unwrap();
        for bad in ["../../../../etc", "/etc", "run/../../x", "", "."] {
            let e = core(bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("working_dir"), "{bad}");
        }
    }

    #[test]
    fn tier_urls_must_lie_beneath_the_tenants_checkpoint_root() {
        let job = |u: &str| {
            parse_job(&format!(
                "name: x\ngpus: 1\ncheckpoint_tiers: [{{name: a, every: 1m}}, {{name: s, every: 1h, url: {u:?}}}]\n"
            ))
            .unwrap()
            .job
        };
        let roots = vec!["file:///srv/ckpt/{tenant}".to_string(), "s3://bucket/{tenant}/".to_string()];
        check_checkpoint_roots(&job("file:///srv/ckpt/team-a/run-1"), "team-a", &roots).unwrap();
        check_checkpoint_roots(&job("file:///srv/ckpt/team-a"), "team-a", &roots).unwrap();
        check_checkpoint_roots(&job("s3://bucket/team-a/x"), "team-a", &roots).unwrap();
        for bad in [
            "file:///etc",
            "file:///srv/../etc",
            "file:///srv/ckpt/team-a/../team-b",
            "file:///srv/ckpt/team-b/x",
            "file:///srv/ckpt/team-a%2f..%2fteam-b",
            "file:///srv/ckpt/team-ab",
            "s3://bucket/team-b/x",
            "s3://other/team-a",
        ] {
            let e = check_checkpoint_roots(&job(bad), "team-a", &roots).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("checkpoint_tiers[1].url"), "{bad}");
        }
        let e = check_checkpoint_roots(&job("file:///srv/ckpt/x"), "x", &[]).unwrap_err();
        assert!(e.message.contains("--checkpoint-root"), "{}", e.message);
        assert!(check_checkpoint_roots(&job("file:///srv/ckpt/../x"), "..", &roots).is_err());
    }

    #[test]
    fn checkpoint_tiers_are_checked_field_by_field() {
        let core = |tiers: &str| {
            parse_job(&format!("name: x\ngpus: 1\ncheckpoint_tiers: {tiers}\n")).unwrap().job.to_core(TenantId(0))
        };
        core("[{name: local, every: 5m, keep: 3}, {name: shared, every: 1h, url: \"file:///mnt/ckpt\"}]").unwrap();
        core("[{name: archive, every: 1d, url: \"s3://ckpt-bucket/team-a/run-7\"}]").unwrap();
        let e = core("[{name: shared, every: 1h, url: \"gs://bucket/ckpt\"}]").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_tiers[0].url"));
        assert!(e.message.contains("file:///") && e.message.contains("s3://"), "{}", e.message);
        let e = core("[{name: shared, every: 1h, url: \"s3://Bad_Bucket/x\"}]").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_tiers[0].url"));
        let e = core("[{name: local, every: 5m}, {name: fast, every: 10ms}]").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_tiers[1].every"));
        let e = core("[{name: local, every: 5m, keep: 0}]").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_tiers[0].keep"));
        let e = core("[{name: \"../x\", every: 5m}]").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("checkpoint_tiers[0].name"));
    }
}
