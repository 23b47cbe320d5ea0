//! An in-memory store with the same behaviour as SQLite's, for tests.

use crate::{Done, EventRow, SampleRow, Snapshot, Store, StoreError, TokenRole, TokenRow, UsageRow, Write};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
struct Inner {
    tenants: Vec<(String, serde_json::Value)>,
    tokens: BTreeMap<String, (TokenRole, Option<String>)>,
    token_docs: BTreeMap<String, serde_json::Value>,
    nodes: Vec<(String, serde_json::Value)>,
    jobs: BTreeMap<u64, serde_json::Value>,
    events: Vec<EventRow>,
    usage: Vec<UsageRow>,
    samples: BTreeMap<u64, SampleRow>,
}

/// An in-memory store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn apply(&self, batch: Vec<Write>) -> Result<(), StoreError> {
        let mut i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        for w in batch {
            match w {
                Write::Tenant { name, doc } => upsert(&mut i.tenants, name, doc),
                Write::Token { hash, role, tenant } => {
                    i.tokens.insert(hash, (role, tenant));
                }
                Write::TokenDoc { hash, doc } => {
                    i.token_docs.insert(hash, doc);
                }
                Write::RevokeToken { hash } => {
                    i.tokens.remove(&hash);
                    i.token_docs.remove(&hash);
                }
                Write::Node { name, doc } => upsert(&mut i.nodes, name, doc),
                Write::Job { id, doc, .. } => {
                    i.jobs.insert(id, doc);
                }
                Write::Event { job, at_ms, kind, message } => {
                    let seq = i.events.len() as u64 + 1;
                    i.events.push(EventRow { seq, job, at_ms, kind, message });
                }
                Write::Usage(u) => i.usage.push(u),
                Write::Sample { sample, keep_since_ms } => {
                    i.samples.insert(sample.at_ms, sample);
                    i.samples = i.samples.split_off(&keep_since_ms);
                }
            }
        }
        Ok(())
    }
}

fn upsert(v: &mut Vec<(String, serde_json::Value)>, name: String, doc: serde_json::Value) {
    match v.iter_mut().find(|(n, _)| *n == name) {
        Some(e) => e.1 = doc,
        None => v.push((name, doc)),
    }
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        Ok(Snapshot {
            tenants: i.tenants.clone(),
            tokens: i
                .tokens
                .iter()
                .map(|(h, (role, tenant))| TokenRow { hash: h.clone(), role: *role, tenant: tenant.clone() })
                .collect(),
            token_docs: i.token_docs.iter().map(|(h, d)| (h.clone(), d.clone())).collect(),
            nodes: i.nodes.clone(),
            jobs: i.jobs.iter().map(|(id, d)| (*id, d.clone())).collect(),
        })
    }

    fn commit_async(&self, batch: Vec<Write>, done: Done) {
        done(self.apply(batch));
    }

    fn events(&self, job: u64) -> Result<Vec<EventRow>, StoreError> {
        let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        Ok(i.events.iter().filter(|e| e.job == job).cloned().collect())
    }

    fn usage(&self, tenant: Option<&str>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>, StoreError> {
        let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        Ok(i.usage
            .iter()
            .filter(|u| tenant.is_none_or(|t| u.tenant == t) && u.end_ms > from_ms && u.start_ms < to_ms)
            .cloned()
            .collect())
    }

    fn samples(&self, since_ms: u64) -> Result<Vec<SampleRow>, StoreError> {
        let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        Ok(i.samples.range(since_ms..).map(|(_, s)| *s).collect())
    }
}
