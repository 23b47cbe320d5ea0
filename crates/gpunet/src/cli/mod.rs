//! The CLI's job, tenant and node commands, one module per family: `jobs` (submit, jobs, show, cancel, why, wait,
//! logs), `run` (srun-like), `tenants` (tenants, quota, nodes), and `output` (formats, times, `--watch`).

pub(crate) mod jobs;
pub(crate) mod output;
pub(crate) mod run;
pub(crate) mod tenants;
