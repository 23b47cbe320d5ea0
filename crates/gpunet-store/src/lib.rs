//! gpunet's persistence behind one trait: [`SqliteStore`] (the embedded default: WAL, `synchronous=FULL`,
//! versioned migrations, group commit), [`PgStore`] (PostgreSQL: versioned migrations, group commit, a reader
//! pool; [`pg_lease`] elects one leader among servers sharing the database) and [`MemoryStore`] for tests. [`open`] picks one from a `--store` value; [`copy`] moves everything from
//! one store to another (`gpunet admin migrate`).
//!
//! The store keeps documents, not the scheduler's internals: tenants, tokens (hashed), nodes and jobs as JSON
//! documents with a few indexed columns, job events, and usage-ledger rows. **Durable before acknowledged**:
//! [`Store::commit`] returns only after the batch is on disk. [`SqliteStore`] runs one writer thread that takes every
//! batch waiting when it becomes free and writes them in one transaction (group commit), so many concurrent
//! submissions share one fsync.
//!
//! Files are private: the SQLite database, its WAL and shared-memory files are created `0600` in a directory created
//! `0700` (files of an older install are narrowed to `0600` when opened).

mod copy;
mod memory;
mod pg;
pub mod pg_cluster;
pub mod pg_lease;
mod sqlite;

pub use copy::{copy, open, Counts, StoreUrl};
pub use memory::MemoryStore;
pub use pg::PgStore;
pub use sqlite::{backup, private_dir, private_file, SqliteStore};

use serde::{Deserialize, Serialize};

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused.
    #[error("write the store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL refused (or could not be reached).
    #[error("use the PostgreSQL store: {0}")]
    Postgres(#[from] postgres::Error),
    /// A `--store` value is not one gpunet can use (the message never holds a password).
    #[error("invalid store URL: {reason}")]
    Url {
        /// What is wrong.
        reason: String,
    },
    /// `gpunet admin migrate` found rows in the store it should fill.
    #[error("copy into the store: it is not empty ({found:?}); migrate into an empty database")]
    NotEmpty {
        /// What the target holds.
        found: Box<Counts>,
    },
    /// After a copy, the two stores do not hold the same number of rows.
    #[error("verify the copy: the source holds {from:?} but the target {to:?} (was a server writing to the source?)")]
    CountMismatch {
        /// Rows in the source.
        from: Box<Counts>,
        /// Rows in the target.
        to: Box<Counts>,
    },
    /// Another server opened the PostgreSQL store after this one: this one's writes are refused from then on.
    #[error("write the store: a newer server (epoch {newer}) took this database over from this one (epoch {epoch})")]
    Fenced {
        /// This store's epoch.
        epoch: u64,
        /// The epoch in the database.
        newer: u64,
    },
    /// A stored document does not decode.
    #[error("decode stored {what} {key}: {source}")]
    Decode {
        /// Table.
        what: &'static str,
        /// Row key.
        key: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The database is newer than this binary.
    #[error("open the store: its schema version {found} is newer than this gpunet's {supported}")]
    TooNew {
        /// Version found.
        found: u32,
        /// Newest known.
        supported: u32,
    },
    /// The group commit that carried this batch failed.
    #[error("write the store: {0}")]
    Commit(String),
    /// The writer thread is gone.
    #[error("write the store: the writer stopped")]
    Closed,
    /// The data directory could not be used.
    #[error("open the store at {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// One stored change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Write {
    /// Create or replace a tenant document.
    Tenant {
        /// Name.
        name: String,
        /// Document.
        doc: serde_json::Value,
    },
    /// Store a token hash with its role (and, for a tenant token, its tenant).
    Token {
        /// SHA-256 of the token, hex.
        hash: String,
        /// What the token may do; stored, never inferred from a name.
        role: TokenRole,
        /// Tenant name, for a tenant token.
        tenant: Option<String>,
    },
    /// Create or replace a token's record (role, tenant, user, expiry) as a document, by the token's hash.
    TokenDoc {
        /// SHA-256 of the token, hex.
        hash: String,
        /// The record.
        doc: serde_json::Value,
    },
    /// Forget a token (revoked or replaced): its hash and its record.
    RevokeToken {
        /// SHA-256 of the token, hex.
        hash: String,
    },
    /// Create or replace a node document.
    Node {
        /// Name.
        name: String,
        /// Document.
        doc: serde_json::Value,
    },
    /// Create or replace a job document.
    Job {
        /// Id.
        id: u64,
        /// Tenant name.
        tenant: String,
        /// State name.
        state: String,
        /// Document, as JSON text (written as it is: the owner serialises it once, straight from its structs).
        doc: String,
    },
    /// Append a job event.
    Event {
        /// Job.
        job: u64,
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// Kind (`submitted`, `started`, …).
        kind: String,
        /// Human text.
        message: String,
    },
    /// Append a usage-ledger row.
    Usage(UsageRow),
    /// Record a cluster sample and forget the samples older than `keep_since_ms`.
    Sample {
        /// The sample.
        sample: SampleRow,
        /// Samples before this time are deleted.
        keep_since_ms: u64,
    },
}

/// What a token may do. Stored with the token: a tenant's name never decides its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenRole {
    /// The admin.
    Admin,
    /// Node agents (the join token).
    Agent,
    /// One tenant.
    Tenant,
}

impl TokenRole {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Admin => "admin",
            TokenRole::Agent => "agent",
            TokenRole::Tenant => "tenant",
        }
    }

    /// Reads the stored form.
    pub fn parse(s: &str) -> Option<TokenRole> {
        match s {
            "admin" => Some(TokenRole::Admin),
            "agent" => Some(TokenRole::Agent),
            "tenant" => Some(TokenRole::Tenant),
            _ => None,
        }
    }
}

/// A stored token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// SHA-256 of the token, hex.
    pub hash: String,
    /// Its role.
    pub role: TokenRole,
    /// Its tenant, for a tenant token.
    pub tenant: Option<String>,
}

/// One sample of the cluster's allocation (for the portal's charts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRow {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// Schedulable GPUs.
    pub gpus_total: u64,
    /// GPUs held by running jobs.
    pub gpus_allocated: u64,
    /// Jobs waiting.
    pub queue_length: u64,
    /// Jobs running.
    pub running: u64,
}

/// One usage-ledger row: a job's resources over an interval, priced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    /// Job.
    pub job: u64,
    /// Tenant.
    pub tenant: String,
    /// Start of the interval, ms since the Unix epoch.
    pub start_ms: u64,
    /// End of the interval.
    pub end_ms: u64,
    /// GPU model of the GPUs billed (empty for CPU-only).
    pub gpu_model: String,
    /// `on-demand`, `spot` or `reserved`.
    pub lifecycle: String,
    /// GPU-seconds.
    pub gpu_seconds: f64,
    /// CPU core-seconds.
    pub cpu_seconds: f64,
    /// Memory GiB-seconds.
    pub mem_gib_seconds: f64,
    /// Cost of the GPUs over the interval.
    #[serde(default)]
    pub gpu_cost: f64,
    /// Cost of the CPU.
    #[serde(default)]
    pub cpu_cost: f64,
    /// Cost of the memory.
    #[serde(default)]
    pub mem_cost: f64,
    /// Cost of the interval: `gpu_cost + cpu_cost + mem_cost`.
    pub cost: f64,
    /// Who submitted the job (the token's user, else its role); empty in rows written before it was recorded.
    #[serde(default)]
    pub submitted_by: String,
    /// GPU-seconds of the interval covered by the agents' utilisation samples (NVML; 0 where none came).
    #[serde(default)]
    pub sampled_gpu_seconds: f64,
    /// Those GPU-seconds weighted by the sampled utilisation (0 to 1): `busy / sampled` is the average utilisation
    /// of the GPUs the job held.
    #[serde(default)]
    pub busy_gpu_seconds: f64,
}

/// A tenant's sums over the whole usage ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LedgerTotals {
    /// GPU-seconds.
    pub gpu_seconds: f64,
    /// Cost.
    pub cost: f64,
}

/// One stored job event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventRow {
    /// Sequence number (increasing).
    pub seq: u64,
    /// Job.
    pub job: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Kind.
    pub kind: String,
    /// Human text.
    pub message: String,
}

/// Everything a server needs to recover.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Tenants in creation order.
    pub tenants: Vec<(String, serde_json::Value)>,
    /// Token hashes with their roles.
    pub tokens: Vec<TokenRow>,
    /// Token records by hash (role, tenant, user, expiry); a token in `tokens` without one is from before records.
    pub token_docs: Vec<(String, serde_json::Value)>,
    /// Nodes in registration order.
    pub nodes: Vec<(String, serde_json::Value)>,
    /// Jobs by id, each document as the JSON text stored (filled by [`Store::load`]; empty from
    /// [`Store::load_meta`]: a starting server reads them with [`Store::jobs_page`], a page at a time).
    pub jobs: Vec<(u64, String)>,
}

/// A `u64` as SQL's 64-bit signed integer: times and ids beyond `i64::MAX` are clamped (a cast made `u64::MAX`,
/// an open end of a time range, negative, and the range empty).
pub(crate) fn big(x: u64) -> i64 {
    x.min(i64::MAX as u64) as i64
}

/// Called once a batch is durable (or failed).
pub type Done = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// Job documents read per page at start-up.
pub const JOBS_PAGE: usize = 10_000;

/// A store.
pub trait Store: Send + Sync + 'static {
    /// Reads everything back: [`Store::load_meta`] and every page of jobs. A server starting reads the jobs page by
    /// page instead, so that a million stored documents are never held as text at once.
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut snap = self.load_meta()?;
        let mut after = None;
        loop {
            let page = self.jobs_page(after, JOBS_PAGE)?;
            let Some(last) = page.last().map(|(id, _)| *id) else { break };
            after = Some(last);
            snap.jobs.extend(page);
        }
        Ok(snap)
    }
    /// Reads back everything but the jobs (`jobs` is left empty).
    fn load_meta(&self) -> Result<Snapshot, StoreError>;
    /// At most `limit` job documents with ids above `after` (all ids without it), in id order, as stored.
    fn jobs_page(&self, after: Option<u64>, limit: usize) -> Result<Vec<(u64, String)>, StoreError>;
    /// Queues a batch to be written atomically, in order after every batch queued before it, and calls `done` once
    /// it is durable. Never blocks on the disk.
    fn commit_async(&self, batch: Vec<Write>, done: Done);
    /// Writes a batch atomically and returns once it is durable.
    fn commit(&self, batch: Vec<Write>) -> Result<(), StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.commit_async(batch, Box::new(move |r| drop(tx.send(r))));
        rx.recv().map_err(|_| StoreError::Closed)?
    }
    /// Events of a job, oldest first.
    fn events(&self, job: u64) -> Result<Vec<EventRow>, StoreError>;
    /// Usage rows overlapping `[from_ms, to_ms)`, of one tenant or all.
    fn usage(&self, tenant: Option<&str>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>, StoreError>;
    /// Per tenant, the sums of every usage row (at start-up: the server's cumulative counters continue from them).
    fn ledger_totals(&self) -> Result<std::collections::BTreeMap<String, LedgerTotals>, StoreError> {
        let mut out = std::collections::BTreeMap::<String, LedgerTotals>::new();
        for r in self.usage(None, 0, u64::MAX)? {
            let e = out.entry(r.tenant).or_default();
            e.gpu_seconds += r.gpu_seconds;
            e.cost += r.cost;
        }
        Ok(out)
    }
    /// Cluster samples taken at or after `since_ms`, oldest first.
    fn samples(&self, since_ms: u64) -> Result<Vec<SampleRow>, StoreError>;
    /// Checks that the store's medium accepts writes now (at start-up: a full disk or a read-only file is reported
    /// before the first request).
    fn probe_writable(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// How many rows each table holds.
    fn counts(&self) -> Result<Counts, StoreError>;
    /// Reads everything stored, as batches of writes that recreate it in an empty store when committed in the
    /// order given (events and ledger rows in their order; for `gpunet admin migrate`, with the server stopped).
    fn export(&self, each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>) -> Result<(), StoreError>;
}
