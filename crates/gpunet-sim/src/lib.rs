//! gpunet's trace-driven simulator: reads real cluster traces, builds a cluster from a spec or preset, and replays
//! the trace on a virtual clock through `gpunet-core` unchanged, so what it predicts is what the live scheduler does.

pub mod cluster;
pub mod engine;
pub mod error;
pub mod pollux;
pub mod report;
pub mod rng;
pub mod trace;

pub use cluster::ClusterSpec;
pub use engine::{
    simulate, AutoscaleSim, EstimateMode, QuotaMode, Sample, SimConfig, SimResult, SpotJobs, TenantResult,
};
pub use error::SimError;
pub use trace::{read_trace, read_trace_from, ReadOptions, Trace, TraceFormat, TraceJob};
