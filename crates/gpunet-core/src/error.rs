//! The core's one error type. Messages are lowercase fragments that read after "failed to …" and name the field and
//! value at fault.

use crate::ids::{JobId, NodeId, TenantId};
use crate::job::JobState;

/// Everything the core can refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// A field of an input has a value outside what is allowed.
    #[error("invalid {field} {value:?}: allowed is {allowed}")]
    InvalidField {
        /// The field's name, as it appears in specs.
        field: &'static str,
        /// The rejected value, printed.
        value: String,
        /// What would have been accepted.
        allowed: String,
    },
    /// A configuration file that is not what its reader expects (TOML syntax, an unknown key, a wrong type): the
    /// parser's own message, which names the line and the key.
    #[error("{what}: {message}")]
    InvalidFile {
        /// What was read (e.g. "the [scheduler] table").
        what: &'static str,
        /// The parser's message.
        message: String,
    },
    /// No job with this id exists.
    #[error("find {0}: no such job")]
    UnknownJob(JobId),
    /// A dependency names a job that does not exist (or that the submitter may not see: drivers treat another
    /// tenant's job as missing).
    #[error("find dependency {0}: no such job")]
    UnknownDependency(JobId),
    /// No node with this id exists.
    #[error("find {0}: no such node")]
    UnknownNode(NodeId),
    /// No tenant with this id exists.
    #[error("find {0}: no such tenant")]
    UnknownTenant(TenantId),
    /// A job id was submitted twice.
    #[error("submit {0}: a job with this id already exists")]
    DuplicateJob(JobId),
    /// A node or tenant name was registered twice.
    #[error("register {kind} {name:?}: the name is taken")]
    DuplicateName {
        /// "node" or "tenant".
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A job state transition that the state machine does not allow.
    #[error("move {job} from {from} to {to}: not a valid transition")]
    InvalidTransition {
        /// The job.
        job: JobId,
        /// Its current state.
        from: JobState,
        /// The requested state.
        to: JobState,
    },
    /// A hold or release that does not apply to the job as it is (see [`crate::hold`]).
    #[error("{action} {job}: {why}")]
    NotHoldable {
        /// "hold" or "release".
        action: &'static str,
        /// The job (or array).
        job: JobId,
        /// Why not.
        why: String,
    },
    /// A placement handed to the state does not fit what is free.
    #[error("place {job}: {reason}")]
    InvalidPlacement {
        /// The job.
        job: JobId,
        /// What did not fit.
        reason: String,
    },
}
