//! gpunet's scheduling core: the domain model (GPU models, nodes, tenants, jobs), the job state machine, queue
//! policies, topology-aware gang placement, quotas with borrowing and reclaim, preemption, EASY backfill,
//! explain-pending and the autoscaler decision.
//!
//! It is pure: no I/O, no clock reads, no threads, no randomness. The driver (the server or the simulator) owns a
//! [`ClusterState`], feeds it events (`submit`, `finish`, `set_node_state`, …), calls [`schedule`] with the current
//! time and applies the returned [`Decision`]s with [`ClusterState::apply_decision`]; what happens to a job after a
//! decision (starts, stops confirmed by the driver, exits, node loss, restarts) is the shared [`lifecycle`]. The same
//! code therefore runs live and in simulation.
//!
//! ```
//! use gpunet_core::*;
//!
//! let mut state = ClusterState::new(SchedConfig::with_policy(Policy::Drf)).unwrap();
//! state
//!     .add_node(NodeSpec::with_gpus("node-1", GpuModel::H100_80GB, 8, MilliCpu::cores(96), MiB::gib(1024)))
//!     .unwrap();
//! let team = state.add_tenant(TenantSpec::new("team-a").quota(Quota::gpus(8, 8))).unwrap();
//! state.submit(JobId(1), JobSpec::new(team, "train", 4, 2), Time::ZERO).unwrap(); // a 2×4-GPU gang
//!
//! let decisions = schedule(&state, Time::from_secs(1));
//! assert!(matches!(&decisions[0], Decision::Start { job: JobId(1), placement, .. } if placement.gpus() == 8));
//! for d in &decisions {
//!     state.apply(d, Time::from_secs(1)).unwrap();
//! }
//! state.check_invariants().unwrap();
//! ```

pub mod alloc;
pub mod array;
pub mod autoscale;
pub mod chunked;
pub mod config;
pub mod depend;
pub mod error;
pub mod estimate;
pub mod fxhash;
pub mod gittins;
pub mod gpu;
pub mod hold;
pub mod ids;
pub mod job;
pub mod lifecycle;
pub mod node;
pub mod park;
pub mod predict;
pub mod pricing;
pub mod quota;
pub mod schedule;
pub mod state;
pub mod tenant;
pub mod units;

pub use array::ArrayView;
pub use config::{HumanDur, LearnedRank, Policy, PreemptionConfig, SchedConfig, SchedKnobs};
pub use depend::{Cascade, DependencyCheck};
pub use error::CoreError;
pub use estimate::{Basis, JobKey, Prediction, Predictor};
pub use gpu::{GpuModel, MigProfile};
pub use ids::{JobId, NodeId, TenantId};
pub use job::{
    ArraySpec, DepKind, Dependency, Elastic, Job, JobSpec, JobState, Placement, SelectorOp, SelectorTerm,
    TaskPlacement, TaskSpec, ThinVec, Toleration, TopologyScope,
};
pub use lifecycle::{AttemptEnded, RankEnd, StopCause};
pub use node::{GpuDevice, Lifecycle, NodeSpec, NodeState, Taint};
pub use pricing::{Cost, Held, NodeRates, PriceCatalogue, PriceError};
pub use quota::QuotaBlock;
pub use schedule::{
    dependency_text, dry_run_placement, explain, explain_queue, explain_without_pass, never_fits, placeable,
    queue_order, queue_walk, schedule, schedule_with_stats, Decision, DepWait, Explanation, PassStats, PendingReason,
    PreemptReason,
};
pub use state::{ClusterState, NodeView, TenantWaiting};
pub use tenant::{Quota, TenantSpec};
pub use units::{Dur, MiB, MilliCpu, Resources, Time};
