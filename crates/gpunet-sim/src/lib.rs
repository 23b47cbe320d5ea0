//! gpunet's trace-driven simulator: reads real cluster traces, builds a cluster from a spec or preset, and replays
//! the trace on a virtual clock through `gpunet-core` unchanged, so what it predicts is what the live scheduler does.
//!
//! ```
//! use gpunet_sim::*;
//!
//! let trace = read_trace_from(
//!     "id,submit_s,duration_s,gpus,tenant\na,0,100,1,t\nb,10,50,1,t\n".as_bytes(),
//!     "inline.csv",
//!     ReadOptions::default(),
//! )
//! .unwrap();
//! let cluster =
//!     ClusterSpec::from_toml("[[node_group]]\ncount = 1\ngpus_per_node = 1\ngpu_model = \"T4\"\n", "inline").unwrap();
//! let result = simulate(&trace, &cluster, &SimConfig::default(), &mut |_, _| {}).unwrap();
//! assert_eq!(result.completed, 2);
//! assert_eq!(result.jcts, vec![100.0, 140.0]); // b waits for a
//! ```

pub mod cluster;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod pollux;
/// ETA prediction lives in the core (a forward replay of its own lifecycle); re-exported for callers of the simulator.
pub use gpunet_core::predict;
pub mod report;
pub mod rng;
pub mod stop;
pub mod trace;

pub use cluster::ClusterSpec;
pub use engine::{
    simulate, AutoscaleSim, EstimateMode, QuotaMode, Sample, SimConfig, SimResult, SpotJobs, TenantResult,
};
pub use error::SimError;
pub use metrics::{write_jobs_csv, JobEnd, JobOutcome, SizeResult};
pub use stop::StopTime;
pub use trace::{read_trace, read_trace_from, ReadOptions, Trace, TraceFormat, TraceJob};
