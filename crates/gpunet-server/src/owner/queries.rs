//! The owner's reads of the cluster: the summary, live usage of running jobs, and the queue in policy order with
//! each entry's reason and predicted start.

use super::{JobDoc, Owner, Reply};
use crate::{now_ms, Principal};
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::{explain, queue_order, JobId, JobState, Time};
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
        for d in self.docs.values() {
            let s = self.st.job(d.job.id).map_or(d.job.state, |j| j.state);
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
            .values()
            .filter(|d| match &who {
                Principal::Tenant(t) => d.tenant == *t,
                _ => true,
            })
            .filter_map(|d| self.st.job(d.job.id).filter(|j| j.state == JobState::Running).map(|j| (d, j)))
            .flat_map(|(d, j)| self.usage_rows(&JobDoc { job: j.clone(), ..d.clone() }, now))
            .collect();
        let _ = reply.send(Ok(rows));
    }

    /// The first `limit` queued jobs in policy order that `who` may see, each with its reason and predicted start.
    pub(super) fn queue(&self, who: &Principal, limit: usize) -> Result<QueueView, ApiError> {
        let now = Time(now_ms());
        // A tenant sees its own jobs with their places in the whole queue: walk far enough to find `limit` of them.
        let walk = if matches!(who, Principal::Tenant(_)) { usize::MAX } else { limit };
        let order = queue_order(&self.st, now, walk);
        let visible = |j: &JobId| match who {
            Principal::Tenant(t) => self.docs.get(&j.0).is_some_and(|d| d.tenant == *t),
            _ => true,
        };
        let all_mine: Vec<(usize, JobId)> =
            order.iter().enumerate().filter(|(_, j)| visible(j)).map(|(i, j)| (i, *j)).collect();
        // Jobs waiting for dependencies, then held jobs: in no queue, they follow it, by id, with their reason.
        let outside = || self.st.dependency_waiting().chain(self.st.held_jobs());
        let waiting_deps = outside().filter(visible).count();
        let visible_length = match who {
            Principal::Tenant(_) => all_mine.len() + waiting_deps,
            _ => self.st.queued_count() + waiting_deps,
        };
        let mut mine: Vec<(usize, JobId)> = all_mine.into_iter().take(limit).collect();
        let room = limit.saturating_sub(mine.len());
        mine.extend(outside().filter(visible).take(room).enumerate().map(|(k, j)| (order.len() + k, j)));
        let ids: Vec<JobId> = mine.iter().map(|(_, j)| *j).collect();
        let etas = gpunet_core::predict::predict_starts(&self.st, &ids, now, 2000);
        let mut entries = Vec::with_capacity(mine.len());
        for (position, j) in mine {
            let (Some(job), Some(d)) = (self.st.job(j), self.docs.get(&j.0)) else { continue };
            let e = explain(&self.st, j, now)?;
            let mut reason = serde_json::to_value(&e.reason).expect("reasons serialise");
            let message = self.mask(who, &e.message, Some(&mut reason));
            entries.push(QueueEntry {
                position,
                id: j.0,
                name: match job.array_of {
                    Some((_, i)) => format!("{}[{i}]", d.submission.name),
                    None => d.submission.name.clone(),
                },
                tenant: d.tenant.clone(),
                state: job.state.to_string(),
                priority: d.submission.priority,
                gpus: job.spec.task.gpus * job.spec.tasks,
                submitted_ms: job.submitted.0,
                message,
                reason,
                eta_ms: etas.get(&j).map(|t| t.0),
            });
        }
        Ok(QueueView {
            policy: self.st.policy().to_string(),
            queue_length: self.st.queued_count(),
            visible_length,
            entries,
        })
    }
}
