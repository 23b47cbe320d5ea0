//! The simulator's error type. Messages read after "failed to …" and name the file, line, field and value at fault.

use std::path::PathBuf;

/// Everything the simulator can refuse.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read or written (the cause is in the message, once: it is not also the error's source,
    /// which a printed chain repeated).
    #[error("{action} {}: {cause}", path.display())]
    Io {
        /// "read" or "write".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A row of a trace is malformed.
    #[error("read {file}:{line}: invalid {field} {value:?}: {reason}")]
    BadRow {
        /// The file.
        file: String,
        /// 1-based line number (the header is line 1).
        line: u64,
        /// The column.
        field: String,
        /// The value found.
        value: String,
        /// What was expected.
        reason: String,
    },
    /// The CSV layer failed (bad quoting, wrong field count).
    #[error("read {file}:{line}: {reason}")]
    Csv {
        /// The file.
        file: String,
        /// 1-based line number.
        line: u64,
        /// What went wrong.
        reason: String,
    },
    /// The trace format could not be told from the header.
    #[error(
        "read {file}: cannot tell the trace format from its header {header:?}; pass --trace-format with one of \
         gpunet, philly, pai2023, tiresias, pollux (also for Sia workloads)"
    )]
    UnknownFormat {
        /// The file.
        file: String,
        /// Its header.
        header: String,
    },
    /// A required column is missing.
    #[error("read {file}: missing column {column:?} that the {format} format requires")]
    MissingColumn {
        /// The file.
        file: String,
        /// The column.
        column: String,
        /// The format.
        format: String,
    },
    /// A column that the format does not define.
    #[error("read {file}: unknown column {column:?}; allowed are {allowed}")]
    UnknownColumn {
        /// The file.
        file: String,
        /// The column.
        column: String,
        /// The allowed columns.
        allowed: String,
    },
    /// A cluster spec or option is invalid.
    #[error("{what}: {reason}")]
    Invalid {
        /// What was being read (`cluster spec x.toml`, `--quotas`).
        what: String,
        /// What was wrong and what is allowed.
        reason: String,
    },
    /// The core refused something.
    #[error(transparent)]
    Core(#[from] gpunet_core::CoreError),
}

impl SimError {
    pub(crate) fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> SimError {
        SimError::Io { action: "read", path: path.into(), cause }
    }

    pub(crate) fn io_write(path: impl Into<PathBuf>, cause: std::io::Error) -> SimError {
        SimError::Io { action: "write", path: path.into(), cause }
    }

    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> SimError {
        SimError::Invalid { what: what.into(), reason: reason.into() }
    }
}
