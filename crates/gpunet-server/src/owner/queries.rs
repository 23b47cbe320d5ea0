//! The owner's reads of the cluster: the summary and live usage of running jobs (the queue view is published by the
//! owner instead, see `snapshot`).

use super::{Owner, Reply};
use crate::{now_ms, Principal};
use gpunet_api::types::*;
use gpunet_core::{JobId, JobState};
use gpunet_store::UsageRow;
use std::collections::BTreeMap;

impl Owner {
    /// Counts of nodes and jobs by state, and GPUs.
    pub(super) fn summary(&mut self, reply: Reply<ClusterSummary>) {
        let mut nodes = BTreeMap::new();
        for n in self.st.nodes() {
            *nodes.entry(n.state.to_string()).or_insert(0) += 1;
        }
        let mut jobs = BTreeMap::new();
        for (id, d) in self.docs.iter() {
            let s = d.live_state(&self.st, *id);
            *jobs.entry(s.to_string()).or_insert(0) += 1;
        }
        let _ = reply.send(Ok(ClusterSummary {
            policy: self.st.policy().to_string(),
            backfill: self.st.config().backfill,
            nodes,
            gpus_total: self.st.capacity_gpus(),
            gpus_allocated: self.st.allocated_gpus(),
            jobs,
            queue_length: self.st.queued_count(),
        }));
    }

    /// Usage rows of the running jobs `who` may see, up to now.
    pub(super) fn live_usage(&mut self, who: Principal, reply: Reply<Vec<UsageRow>>) {
        let now = now_ms();
        let rows = self
            .docs
            .iter()
            .filter(|(_, d)| match &who {
                Principal::Tenant(t) => *d.tenant == **t,
                _ => true,
            })
            .filter_map(|(id, d)| self.st.job(JobId(*id)).filter(|j| j.state == JobState::Running).map(|j| (d, j)))
            .flat_map(|(d, j)| self.usage_rows(j, d, now))
            .collect();
        let _ = reply.send(Ok(rows));
    }
}
