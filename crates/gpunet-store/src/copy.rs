//! Choosing a store from a URL (`--store`, `gpunet admin migrate`) and copying one store into another, verified by
//! counting rows.

use crate::{PgStore, SqliteStore, Store, StoreError};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Tenants.
    pub tenants: u64,
    /// Token hashes.
    pub tokens: u64,
    /// Token records.
    pub token_docs: u64,
    /// Nodes.
    pub nodes: u64,
    /// Jobs.
    pub jobs: u64,
    /// Job events.
    pub events: u64,
    /// Usage-ledger rows.
    pub usage: u64,
    /// Cluster samples.
    pub samples: u64,
}

/// Where a store is.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://DIR`: the data directory holding `gpunet.db` (a path to `gpunet.db` itself names its directory).
    Sqlite(PathBuf),
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (kept whole: the password is needed to connect).
    Postgres(String),
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
            // Never the password.
            StoreUrl::Postgres(_) => f.write_str("postgres://…"),
        }
    }
}

impl StoreUrl {
    /// Reads `sqlite://PATH` or `postgres://…` (`postgresql://…`).
    pub fn parse(s: &str) -> Result<StoreUrl, StoreError> {
        if let Some(p) = s.strip_prefix("sqlite://") {
            if p.is_empty() {
                return Err(StoreError::Url { reason: "sqlite:// names no path (sqlite://DATA_DIR)".into() });
            }
            let p = Path::new(p);
            let dir = if p.file_name().is_some_and(|n| n == "gpunet.db") {
                p.parent().unwrap_or(Path::new(".")).to_path_buf()
            } else {
                p.to_path_buf()
            };
            return Ok(StoreUrl::Sqlite(dir));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(s.to_string()));
        }
        let scheme = s.split_once("://").map_or("", |(a, _)| a);
        Err(StoreUrl::unknown(scheme))
    }

    fn unknown(scheme: &str) -> StoreError {
        StoreError::Url {
            reason: format!("unknown scheme {scheme:?}: allowed are sqlite://DATA_DIR and postgres://USER@HOST/DB"),
        }
    }
}

/// Opens the store a URL names (creating and migrating it if needed).
pub fn open(url: &StoreUrl) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url {
        StoreUrl::Sqlite(dir) => Arc::new(SqliteStore::open(dir)?),
        StoreUrl::Postgres(u) => Arc::new(PgStore::open(u)?),
    })
}

/// Copies everything in `from` into `to`, which must be empty, then checks that both hold as many rows of each
/// kind. Event and ledger sequence numbers are renumbered in the same order.
pub fn copy(from: &dyn Store, to: &dyn Store) -> Result<Counts, StoreError> {
    let found = to.counts()?;
    if found != Counts::default() {
        return Err(StoreError::NotEmpty { found: Box::new(found) });
    }
    from.export(&mut |batch| if batch.is_empty() { Ok(()) } else { to.commit(batch) })?;
    let (a, b) = (from.counts()?, to.counts()?);
    if a != b {
        return Err(StoreError::CountMismatch { from: Box::new(a), to: Box::new(b) });
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_parse_and_never_show_a_password() {
        assert_eq!(StoreUrl::parse("sqlite:///var/lib/gpunet").unwrap(), StoreUrl::Sqlite("/var/lib/gpunet".into()));
        assert_eq!(StoreUrl::parse("sqlite://d/gpunet.db").unwrap(), StoreUrl::Sqlite("d".into()));
        let pg = StoreUrl::parse("postgres://u:hunter2@h/db").unwrap();
        assert!(!format!("{pg:?}").contains("hunter2"));
        let e = StoreUrl::parse("mysql://u:hunter2@h/db").unwrap_err().to_string();
        assert!(e.contains("mysql") && !e.contains("hunter2"), "{e}");
        assert!(StoreUrl::parse("sqlite://").is_err());
    }
}
