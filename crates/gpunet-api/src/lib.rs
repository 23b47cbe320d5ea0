//! gpunet's wire types, shared by the server, the agent, the CLI and the portal: job specs in gpunet's native form
//! and in the Kubernetes forms (`batch/v1` Job, `v1` ResourceQuota), human quantities, and API errors.

pub mod agent;
pub mod depsyntax;
pub mod error;
pub mod image;
pub mod k8s;
pub mod limits;
pub mod servers;
pub mod spec;
pub mod types;
pub mod units;

pub use error::{ApiError, ErrorBody};
pub use k8s::{job_from_k8s, quota_from_k8s, QuotaSubmission};
pub use spec::{parse_job, JobSubmission, ParsedJob};
