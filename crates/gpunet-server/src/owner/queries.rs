//! The owner's reads of the cluster: the summary and live usage of running jobs (the queue view is published by the
//! owner instead, see `snapshot`).

use super::{Owner, Reply};
use crate::{now_ms, Principal};
use gpunet_api::types::*;
use gpunet_core::JobState;
use gpunet_store::UsageRow;
use std::collections::BTreeMap;

impl Owner {
    /// Counts of nodes and jobs by state, GPUs and the queue's length. A tenant is told its own jobs' counts by state,
    /// not the cluster's: how many jobs others have, and how they ended, is theirs.
    pub(super) fn summary(&mut self, who: Principal, reply: Reply<ClusterSummary>) {
        let tenant = match &who {
            Principal::Tenant(t) => Some(t.as_str()),
            _ => None,
        };
        let mut nodes = BTreeMap::new();
        for n in self.st.nodes().filter(|n| !self.is_removed(&n.spec.name)) {
            *nodes.entry(n.state.to_string()).or_insert(0) += 1;
        }
        // From the documents' lists by state, not a walk of every job; states without jobs are left out.
        let jobs: BTreeMap<String, usize> = super::doc::STATES
            .iter()
            .zip(self.docs.by_state(tenant))
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| (s.to_string(), n))
            .collect();
        let _ = reply.send(Ok(ClusterSummary {
            policy: self.st.policy().to_string(),
            backfill: self.st.config().backfill,
            nodes,
            gpus_total: self.st.capacity_gpus(),
            gpus_allocated: self.st.allocated_gpus(),
            jobs,
            // The cluster's, as `/v1/cluster/history` shows it over time to every reader: how busy the cluster is.
            queue_length: self.st.queued_count(),
        }));
    }

    /// Usage rows of the running jobs `who` may see, up to now.
    pub(super) fn live_usage(&mut self, who: Principal, reply: Reply<Vec<UsageRow>>) {
        let now = now_ms();
        let tenant = match &who {
            Principal::Tenant(t) => Some(t.as_str()),
            _ => None,
        };
        // The running jobs' list, not a walk of every job.
        let rows = self
            .listed(super::doc::Which { tenant, states: &[JobState::Running], ..Default::default() })
            .flat_map(|(_, d, j)| self.usage_rows(j, d, now))
            .collect();
        // Answered once every write queued before now is durable: the ledger the caller reads next then holds every
        // attempt that ended before these rows were taken (see `http::usage`). A store that refuses writes still
        // gets its report (reads go on), without that promise.
        self.store.commit_async(
            Vec::new(),
            Box::new(move |_| {
                let _ = reply.send(Ok(rows));
            }),
        );
    }
}
