//! An in-memory store with the same behaviour as SQLite's, for tests.

use crate::{Counts, Done, EventRow, SampleRow, Snapshot, Store, StoreError, TokenRole, TokenRow, UsageRow, Write};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
struct Inner {
    tenants: Vec<(String, serde_json::Value)>,
    tokens: BTreeMap<String, (TokenRole, Option<String>)>,
    token_docs: BTreeMap<String, serde_json::Value>,
    nodes: Vec<(String, serde_json::Value)>,
    /// Tenant, state and document by id.
    jobs: BTreeMap<u64, (String, String, String)>,
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
                Write::Job { id, tenant, state, doc } => {
                    i.jobs.insert(id, (tenant, state, doc));
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
    fn load_meta(&self) -> Result<Snapshot, StoreError> {
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
            jobs: Vec::new(),
        })
    }

    fn jobs_page(&self, after: Option<u64>, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        Ok(i.jobs
            .range((from, std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(id, (_, _, d))| (*id, d.clone()))
            .collect())
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

    fn counts(&self) -> Result<Counts, StoreError> {
        let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
        Ok(Counts {
            tenants: i.tenants.len() as u64,
            tokens: i.tokens.len() as u64,
            token_docs: i.token_docs.len() as u64,
            nodes: i.nodes.len() as u64,
            jobs: i.jobs.len() as u64,
            events: i.events.len() as u64,
            usage: i.usage.len() as u64,
            samples: i.samples.len() as u64,
        })
    }

    fn export(&self, each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>) -> Result<(), StoreError> {
        let batch = {
            let i = self.inner.lock().map_err(|_| StoreError::Closed)?;
            let mut b: Vec<Write> =
                i.tenants.iter().map(|(name, doc)| Write::Tenant { name: name.clone(), doc: doc.clone() }).collect();
            b.extend(i.tokens.iter().map(|(hash, (role, tenant))| Write::Token {
                hash: hash.clone(),
                role: *role,
                tenant: tenant.clone(),
            }));
            b.extend(i.token_docs.iter().map(|(hash, doc)| Write::TokenDoc { hash: hash.clone(), doc: doc.clone() }));
            b.extend(i.nodes.iter().map(|(name, doc)| Write::Node { name: name.clone(), doc: doc.clone() }));
            b.extend(i.jobs.iter().map(|(id, (tenant, state, doc))| Write::Job {
                id: *id,
                tenant: tenant.clone(),
                state: state.clone(),
                doc: doc.clone(),
            }));
            b.extend(i.events.iter().map(|e| Write::Event {
                job: e.job,
                at_ms: e.at_ms,
                kind: e.kind.clone(),
                message: e.message.clone(),
            }));
            b.extend(i.usage.iter().cloned().map(Write::Usage));
            b.extend(i.samples.values().map(|s| Write::Sample { sample: *s, keep_since_ms: 0 }));
            b
        };
        each(batch)
    }
}
