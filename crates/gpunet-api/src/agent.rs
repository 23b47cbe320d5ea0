//! The agent protocol. It is level-triggered: the agent reports what runs and what exited
//! (`POST /v1/agents/{node}/sync`), the server answers with the whole set of tasks that should run on the node. The
//! agent starts what is missing and stops everything else. The server holds the request (up to about a second) while
//! nothing changes, so a new task reaches its node within milliseconds. Reports are idempotent: an exit reported twice
//! counts once.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One task attempt: job, rank and attempt number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskRef {
    /// Job id.
    pub job: u64,
    /// Rank within the job (0..tasks).
    pub rank: u32,
    /// Attempt (restarts + evictions so far): a new attempt is a new process.
    pub attempt: u32,
}

/// How a task attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskExit {
    /// Which.
    pub task: TaskRef,
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Signal, when a signal ended it.
    pub signal: Option<i32>,
    /// The kernel's OOM killer ended it.
    #[serde(default)]
    pub oom: bool,
    /// It was stopped because the server no longer wanted it (cancel, eviction).
    #[serde(default)]
    pub stopped: bool,
    /// Why, when the agent ended it (a failed liveness probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A liveness probe: a command run in the task's environment; a non-zero exit (or a hang past the period) fails it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Liveness {
    /// Command and arguments.
    pub command: Vec<String>,
    /// Wait before the first probe.
    pub initial_delay_ms: u64,
    /// Time between probes (and each probe's time limit).
    pub period_ms: u64,
}

/// The agent's report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentSync {
    /// The version of the task set the agent last applied (0 at first).
    pub known_version: u64,
    /// Tasks running now.
    pub running: Vec<TaskRef>,
    /// Task attempts that ended since the last acknowledged report.
    pub exited: Vec<TaskExit>,
    /// Task attempts whose process started since the last acknowledged report.
    #[serde(default)]
    pub started: Vec<TaskStart>,
    /// New log output of task attempts (at most 256 KiB per report).
    #[serde(default)]
    pub logs: Vec<LogChunk>,
    /// Checkpoints copied to a tier since the last report: the task and when the copy was taken (ms since epoch).
    #[serde(default)]
    pub checkpoints: Vec<(TaskRef, u64)>,
    /// The latest per-GPU samples (NVML); empty for fake GPUs, `None` when the report carries no new sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_samples: Option<Vec<GpuSample>>,
    /// Checkpoint copies to a tier that failed since the agent started (a counter; it restarts at 0 with the agent).
    #[serde(default)]
    pub checkpoint_failures: u64,
    /// Task attempts asked to checkpoint now ([`TaskAssignment::checkpoint_now`]) whose job said it was done and
    /// whose final snapshot is on every tier: the task and when the snapshot was taken (ms since epoch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints_now: Vec<(TaskRef, u64)>,
    /// Jobs whose files this node keeps (their tasks' own, checkpoint and log directories) and that have no task on
    /// it now: the server answers which of them ended for good ([`AgentWork::ended_jobs`]), and the agent removes
    /// those files. At most [`HELD_JOBS_MAX`] per report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_jobs: Vec<u64>,
}

/// The most jobs one report asks about ([`AgentSync::held_jobs`]).
pub const HELD_JOBS_MAX: usize = 1024;

/// One GPU's sample from NVML. Fields NVML could not read are absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GpuSample {
    /// GPU index on the node.
    pub index: u32,
    /// Utilisation in percent over the driver's last sample period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<f64>,
    /// Memory used, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<u64>,
    /// Memory in all, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_mib: Option<u64>,
    /// Power draw, watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<f64>,
    /// Temperature, degrees Celsius.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<f64>,
    /// NVLink bytes sent and received since the agent started, summed over links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_tx_bytes: Option<u64>,
    /// NVLink bytes received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_rx_bytes: Option<u64>,
    /// Corrected ECC errors since the driver loaded (NVML's volatile count; absent where ECC is off or unsupported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected: Option<u64>,
    /// Critical XID errors (NVML's event API) since the agent started watching; absent where NVML cannot deliver
    /// XID events for this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_errors: Option<u64>,
    /// The code of the latest XID error (NVIDIA's XID catalogue, e.g. 79: fallen off the bus; 999: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_last: Option<u64>,
}

/// Log output of a task attempt, from `offset` bytes into its log. The bytes travel exactly as the task wrote them
/// (base64 on the wire, as `data_base64`): a UTF-8 sequence cut between two chunks, or output that is not text at
/// all, arrives unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LogChunk {
    /// Which.
    pub task: TaskRef,
    /// Byte offset of `data` in the log.
    pub offset: u64,
    /// The bytes.
    #[serde(rename = "data_base64", with = "base64_bytes")]
    #[schema(value_type = String, format = Byte)]
    pub data: Vec<u8>,
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let t = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(t).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_chunks_carry_bytes_exactly() {
        let c = LogChunk { task: TaskRef { job: 1, rank: 0, attempt: 0 }, offset: 7, data: vec![0xe2, 0x82, 0xff, 0] };
        let text = serde_json::to_string(&c).unwrap();
        assert!(text.contains("\"data_base64\":\"4oL/AA==\""), "{text}");
        assert_eq!(serde_json::from_str::<LogChunk>(&text).unwrap(), c);
        assert!(serde_json::from_str::<LogChunk>(&text.replace("4oL/AA==", "not base64!")).is_err());
    }
}

/// A task's process started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskStart {
    /// Which.
    pub task: TaskRef,
    /// Process id (and process group).
    pub pid: u32,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
}

/// A task the node should run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskAssignment {
    /// Which.
    pub task: TaskRef,
    /// Command and arguments.
    pub command: Vec<String>,
    /// Environment: the job's, then gpunet's (`CUDA_VISIBLE_DEVICES`, `RANK`, …).
    pub env: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// GPU indexes on the node.
    pub gpus: Vec<u32>,
    /// MIG slices the task holds (a task placed on a slice holds no whole GPU); the agent puts their MIG UUIDs in
    /// `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigSlice>,
    /// CPU millicores (for cgroup limits).
    pub cpu_milli: u64,
    /// Memory MiB (for cgroup limits).
    pub memory_mib: u64,
    /// Time between SIGTERM and SIGKILL when the task is stopped.
    pub grace_ms: u64,
    /// Liveness probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Liveness>,
    /// Checkpoint tiers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<CheckpointTier>,
    /// When the job was submitted, ms since the Unix epoch. With the job id it names the job across servers: a node
    /// never hands the files one job left there to another job of the same id (a server on a new store numbers jobs
    /// from 1 again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_ms: Option<u64>,
    /// The tenant's stable index (its registration order on the server): an agent with per-tenant identities
    /// runs the task as uid and gid `base + tenant_index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_index: Option<u32>,
    /// The attempt's run-time limit, ms from its start: past it the agent stops the task (SIGTERM, then SIGKILL
    /// after `grace_ms`) and reports the exit with the reason `exceeded its time limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    /// The most of the node's disk the task may use, MiB: its own directory, its job's checkpoint directory and its
    /// log (the job's `disk`); the node's own limit applies when absent or lower. Past it the agent stops the task
    /// and reports the exit with the reason `exceeded its disk limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mib: Option<u64>,
    /// The container the task runs in (a job with an `image`); `None`: a process on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::image::ContainerTask>,
    /// The node is being reclaimed: checkpoint now. The agent creates the file named by the task's
    /// `GPUNET_CHECKPOINT_NOW`, sends `signal` to the task's processes, and once the job removes the file (its
    /// checkpoint is written) copies the checkpoint directory to every tier and reports it
    /// ([`AgentSync::checkpoints_now`]); the server then stops the task and the job resumes elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_now: Option<CheckpointNow>,
}

/// A request to checkpoint now, before the node is reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointNow {
    /// When the node goes, ms since the Unix epoch: a checkpoint not done by then is lost.
    pub deadline_ms: u64,
    /// The signal to send (the job's `checkpoint_signal`); `None`: the file only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

/// A MIG slice of a node: the GPU's index and the instance's position among that GPU's MIG instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MigSlice {
    /// GPU index on the node.
    pub gpu: u32,
    /// Instance, in the order the node declared its GPU's MIG instances.
    pub instance: u32,
}

/// A checkpoint tier, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointTier {
    /// Name.
    pub name: String,
    /// Period in ms.
    pub every_ms: u64,
    /// Copies kept.
    pub keep: u32,
    /// Object-store URL; the node's disk when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// The server's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentWork {
    /// Version of this task set.
    pub version: u64,
    /// Every task that should run on the node; anything else must stop.
    pub tasks: Vec<TaskAssignment>,
    /// After how long without a sync the server gives the node's tasks away (it declares a silent node lost, then
    /// takes its tasks as gone once their fence times out): an agent that could not sync for about this long stops
    /// its tasks itself, so that no task runs twice. Absent from older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_after_ms: Option<u64>,
    /// After how long without a sync the server declares the node lost (its tasks are then held, not given away,
    /// until `fence_after_ms`): an agent stops its tasks no earlier than halfway between the two. Absent from older
    /// servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_after_ms: Option<u64>,
    /// Of the report's [`AgentSync::held_jobs`], those that ended for good (succeeded, failed or cancelled) after
    /// running on this node, and those the server does not know: nothing of theirs will run here again, and the
    /// agent removes their files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended_jobs: Vec<u64>,
}
