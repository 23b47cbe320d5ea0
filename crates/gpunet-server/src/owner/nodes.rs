//! The owner's node commands and the agent protocol: node registration (with each node's own credential) and
//! states (cordon, drain, lost), the agents' sync (each node's task set with its environment, the starts, exits and
//! checkpoints it reports on its own task attempts), attempt ends and their billing, and fencing of lost nodes.

use super::{not_found, valid_name, Cmd, JobDoc, NodeDoc, Owner, Reply, OTHER_JOB};
use crate::{now_ms, Principal};
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::{AttemptEnded, Job, JobId, JobState, NodeSpec, NodeState, RankEnd, StopCause, Time};
use gpunet_store::Write;
use std::collections::{BTreeMap, HashSet};
use tokio::sync::oneshot;

/// A job and its document as they were while an attempt ran (for the attempt's usage rows once it ended).
type Before = (Job, JobDoc);

/// How long a node may still report on a task attempt after it left the node's task set.
const HANDED_KEEP: std::time::Duration = std::time::Duration::from_secs(300);

impl Owner {
    /// Registers a node (or a known node coming back, which becomes ready) and issues its own credential.
    pub(super) fn register_node(
        &mut self,
        mut spec: NodeSpec,
        fake: bool,
        price: Option<f64>,
        join: bool,
        node_token: Option<String>,
        reply: Reply<NodeRegistered>,
    ) {
        let name = spec.name.clone();
        // A node's token checked by the HTTP worker may have been replaced since, by a registration taken up first
        // (a pool node's registration token works once).
        if node_token.is_some_and(|h| !self.auth.read().expect("auth lock").contains_key(&h)) {
            let _ = reply.send(Err(ApiError::new("unauthorized", "unknown token")));
            return;
        }
        // The join token only adds nodes: a known node re-registers with its own credential (or the admin's token), else
        // whoever holds the join token could take its name over — its tasks (other tenants' commands and secrets),
        // their exits and its price. Nodes stored before credentials existed have none and may still use it once.
        if join && self.nodes.get(&name).is_some_and(|d| d.credential.is_some()) {
            let _ = reply.send(Err(ApiError::new(
                "conflict",
                format!(
                    "node {name} is already registered: its agent re-registers with its own credential \
                     (DATA_DIR/node.credential), or an admin token registers it again"
                ),
            )));
            return;
        }
        // A node its pool deleted is gone for good (its machine was switched off): whoever registers its name again
        // is not that machine, and could take work that its pool no longer counts or pays for.
        if self.is_removed(&name) {
            let _ = reply.send(Err(ApiError::new(
                "conflict",
                format!("node {name} was deleted by its pool: it cannot register again (a new node gets a new name)"),
            )));
            return;
        }
        // A pool's node: the pool's labels and taint, whatever the agent said. A name of a pool's form that the pool
        // did not ask for is refused.
        if let Err(e) = self.pool_node_admit(&mut spec, join) {
            let _ = reply.send(Err(e));
            return;
        }
        // A pool's node is priced by its pool (else the catalogue), whatever its agent said: whoever registers it does
        // not set what tenants are billed.
        let price = if self.pools.of_node(&name).is_some() { self.pool_price(&name) } else { price };
        let r = if let Some(id) = self.st.node_id(&name) {
            // Re-registration of a known node (an agent coming back): it becomes ready again, priced again.
            let known = self.st.node(id).expect("known").spec;
            let per_gpu_hour = self.prices.resolve_gpu_hour(known, price);
            self.st
                .set_node_state(id, NodeState::Ready, Time(now_ms()))
                .and_then(|_| self.st.set_node_price(id, per_gpu_hour))
                .map_err(ApiError::from)
        } else {
            // Priced by the agent's override, else the catalogue, by GPU model and lifecycle label.
            spec.price_per_gpu_hour = self.prices.resolve_gpu_hour(&spec, price);
            valid_name("name", &name).and_then(|_| self.st.add_node(spec.clone()).map(|_| ()).map_err(ApiError::from))
        };
        if let Err(e) = r {
            let _ = reply.send(Err(e));
            return;
        }
        // In the cluster now: its pool counts it; one the pool is deleting registers cordoned (it takes no work). A
        // node under a reclaim notice stays cordoned through a re-registration (its machine is going), and its
        // deadline stays on its record.
        let leaving = self.pool_node_registered(&spec);
        let reclaim_deadline_ms = self.reclaim_deadline_of(&name);
        let leaving = leaving || reclaim_deadline_ms.is_some();
        let id = self.st.node_id(&name).expect("registered");
        if leaving {
            let _ = self.st.set_node_state(id, NodeState::Cordoned, Time(now_ms()));
        }
        let full = self.st.node(id).expect("registered").spec.clone();
        // A fresh credential for the node; the one it replaces stops working now.
        let credential = crate::new_token();
        let hash = crate::hash_token(&credential);
        {
            // Every earlier credential of the node stops working (a pool node's registration token too: it is used
            // once).
            let mut auth = self.auth.write().expect("auth lock");
            auth.retain(|_, c| c.who != Principal::Node(name.clone()));
            auth.insert(hash.clone(), crate::tokens::Cred { who: Principal::Node(name.clone()), doc: None });
        }
        let managed = self.nodes.get(&name).is_some_and(|d| d.managed);
        self.lost_since.remove(&name);
        let doc = NodeDoc {
            spec: full,
            state: if leaving { NodeState::Cordoned } else { NodeState::Ready },
            fake,
            managed,
            credential: Some(hash),
            price_override: price,
            removed: false,
            booting: false,
            reclaim_deadline_ms,
            leaving: self.pool_node_leaving(&name),
        };
        let w = Write::Node { name: name.clone(), doc: serde_json::to_value(&doc).expect("serialise") };
        self.nodes.insert(name.clone(), doc);
        self.dirty = true;
        self.node_event(&name, if leaving { "cordoned" } else { "ready" });
        let node = self.node_view(&name, &Principal::Admin).expect("registered");
        self.durable(vec![w], reply, NodeRegistered { node, credential });
    }

    /// Which of these task attempts are the node's (only their logs are kept).
    pub(super) fn node_tasks(
        &mut self,
        node: String,
        asked: Vec<gpunet_api::agent::TaskRef>,
        reply: Reply<HashSet<gpunet_api::agent::TaskRef>>,
    ) {
        let r = match self.st.node_id(&node) {
            Some(id) => Ok(asked.into_iter().filter(|t| self.task_of_node(id, &node, t)).collect()),
            None => Err(not_found("node", &node)),
        };
        let _ = reply.send(r);
    }

    /// The nodes, as `who` may see them.
    pub(super) fn list_nodes(&mut self, who: Principal, reply: Reply<Vec<NodeView>>) {
        let v = self.nodes.iter().filter(|(_, d)| !d.removed).filter_map(|(n, _)| self.node_view(n, &who)).collect();
        let _ = reply.send(Ok(v));
    }

    /// Cordons, drains, readies or loses a node; its jobs are asked to stop where the state requires it.
    pub(super) fn set_node_state(&mut self, name: String, state: NodeState, reply: Reply<NodeView>) {
        let Some(id) = self.st.node_id(&name).filter(|_| !self.is_removed(&name)) else {
            let _ = reply.send(Err(not_found("node", &name)));
            return;
        };
        if state == NodeState::Ready && self.pool_node_leaving(&name) {
            let _ = reply.send(Err(ApiError::new(
                "conflict",
                format!("node {name} is being deleted by its pool: it cannot take work again"),
            )));
            return;
        }
        let now = now_ms();
        // The nodes of the jobs asked to stop: their agents stop those tasks.
        let mut touched: Vec<String> = vec![name.clone()];
        for j in self.st.node(id).map(|n| n.jobs.iter().copied().collect::<Vec<_>>()).unwrap_or_default() {
            touched.extend(self.nodes_of(j));
        }
        let moved = match self.st.set_node_state(id, state, Time(now)) {
            Ok(m) => m,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                return;
            }
        };
        let mut writes = Vec::new();
        if state == NodeState::Lost {
            self.lost_since.insert(name.clone(), std::time::Instant::now());
        } else {
            self.lost_since.remove(&name);
        }
        for j in &moved {
            // Asked to stop: the agents stop the tasks and confirm; a lost node's tasks are fenced until its
            // agent returns and confirms, or the fence times out.
            self.sync_doc(j.0);
            writes.push(self.job_doc_write(j.0).expect("present"));
            writes.push(self.event(
                j.0,
                "stopping",
                format!("job-{} stopping: node {name} is {state}; its GPUs stay held until its end is confirmed", j.0),
            ));
            if state == NodeState::Draining {
                self.metrics.stop_asked(j.0); // an eviction, timed until its end is confirmed
            }
            if state != NodeState::Lost {
                self.confirm_unmanaged(*j, now, &mut writes);
            }
        }
        let doc = self.nodes.get_mut(&name).expect("known node");
        doc.state = state;
        writes.push(Write::Node { name: name.clone(), doc: serde_json::to_value(&*doc).expect("serialise") });
        self.dirty = true;
        self.node_event(&name, state.to_string().as_str());
        touched.sort();
        touched.dedup();
        self.bump_job(touched);
        let v = self.node_view(&name, &Principal::Admin).expect("known");
        self.durable(writes, reply, v);
    }

    /// Applies an agent's report and answers with its node's task set, with the writes to make durable before the
    /// answer is sent (the answer waits for them and for every write queued before: an agent never sees a start the
    /// store has not accepted).
    pub(super) fn agent_sync(
        &mut self,
        node: &str,
        mut sync: gpunet_api::agent::AgentSync,
    ) -> Result<(Vec<Write>, gpunet_api::agent::AgentWork), ApiError> {
        if let Some(e) = self.read_only() {
            return Err(e);
        }
        let id = self.st.node_id(node).ok_or_else(|| not_found("node", node))?;
        // A node its pool deleted is gone for good. A sync of its agent's that was on its way (the HTTP worker checked
        // the credential before the deletion; a long poll asks again after its wait) must not bring it back: it made
        // the deleted node ready again, the scheduler placed a job on it, and that job sat on a machine that was gone.
        if self.is_removed(node) {
            return Err(ApiError::new(
                "conflict",
                format!("node {node} was deleted by its pool: it takes no more work (a new node gets a new name)"),
            ));
        }
        let now = now_ms();
        // A node reports only on its own task attempts; anything else in the report is ignored.
        sync.started.retain(|s| self.task_of_node(id, node, &s.task));
        sync.checkpoints.retain(|(t, _)| self.task_of_node(id, node, t));
        sync.checkpoints_now.retain(|(t, _)| self.task_of_node(id, node, t));
        sync.exited.retain(|e| self.task_of_node(id, node, &e.task));
        self.last_seen.insert(node.to_string(), std::time::Instant::now());
        self.metrics.checkpoint_failures(node, sync.checkpoint_failures);
        if let Some(samples) = sync.gpu_samples.take() {
            // Samples count for the attempts holding the GPUs only when the agent took them knowing the node's
            // current task set: one taken before it heard of a just-placed task would charge that task's attempt
            // with the GPU's idle time before it started.
            if sync.known_version == self.versions.get(node).copied().unwrap_or(0) {
                let holders = self.gpu_attempts(id);
                self.util.record(node, &samples, &holders, now);
            }
            self.gpu_samples.insert(node.to_string(), samples);
        }
        let mut writes = Vec::new();
        if self.nodes.get(node).is_some_and(|d| !d.managed) {
            // From now on this node's tasks are real processes: their ends must be confirmed by its agent.
            let d = self.nodes.get_mut(node).expect("checked above");
            d.managed = true;
            writes.push(Write::Node { name: node.to_string(), doc: serde_json::to_value(&*d).expect("serialise") });
        }
        if self.st.node(id).is_some_and(|n| n.state == NodeState::Lost) {
            // The agent is back: its node is ready again (cordoned if its pool is deleting it). Its fenced tasks
            // are not in its task set, so the agent kills them and confirms; until then their GPUs stay allocated to
            // the old attempts.
            let back = if self.pool_node_leaving(node) { NodeState::Cordoned } else { NodeState::Ready };
            self.st.set_node_state(id, back, Time(now))?;
            self.lost_since.remove(node);
            if let Some(d) = self.nodes.get_mut(node) {
                d.state = back;
                writes.push(Write::Node { name: node.to_string(), doc: serde_json::to_value(&*d).expect("serialise") });
            }
            self.node_event(node, "ready");
            self.dirty = true;
        }
        for s in &sync.started {
            let jid = JobId(s.task.job);
            if self.st.job(jid).is_some_and(|j| j.state == JobState::Running && j.attempt() == s.task.attempt) {
                let _ = self.events.send(
                    serde_json::json!({"job": jid.0, "kind": "process_started", "at_ms": s.at_ms, "node": node,
                        "tenant": self.docs.get(&jid.0).map(|d| d.tenant.to_string())})
                    .to_string(),
                );
                writes.push(Write::Event {
                    job: jid.0,
                    at_ms: s.at_ms,
                    kind: "process_started".into(),
                    message: format!("rank {} started on {node} as pid {}", s.task.rank, s.pid),
                });
            }
        }
        for (t, at) in &sync.checkpoints {
            let jid = JobId(t.job);
            if self.st.job(jid).is_some_and(|j| j.state == JobState::Running && j.attempt() == t.attempt) {
                let _ = self.st.record_checkpoint(jid, Time(*at));
                self.sync_doc(jid.0);
                writes.push(self.event(
                    jid.0,
                    "checkpoint",
                    format!("job-{} rank {} checkpoint of attempt {} copied to its tiers", t.job, t.rank, t.attempt),
                ));
            }
        }
        for (t, at) in &sync.checkpoints_now {
            self.checkpoint_now_done(t, *at, &mut writes);
        }
        for e in sync.exited {
            let jid = JobId(e.task.job);
            let Some(j) = self.st.job(jid) else { continue };
            let Some(run) = j.run.as_ref() else { continue };
            if j.state != JobState::Running || j.attempt() != e.task.attempt {
                continue; // stale or duplicate
            }
            if run.placement.tasks.get(e.task.rank as usize).is_none_or(|t| t.node != id) {
                continue; // not this node's task
            }
            let mut was_stopping = run.stop.is_some();
            let nodes = self.nodes_of(jid);
            let before = self.docs.get(&jid.0).map(|d| (j.clone(), d.clone()));
            // An exit the agent caused (a failed probe, the time limit) is a failure whatever the code.
            let success = e.code == Some(0) && e.reason.is_none();
            if !success && !was_stopping && !e.stopped && self.checkpoint_now_of(jid.0, e.task.attempt).is_some() {
                // Asked to checkpoint for a reclaim, the rank ended (the signal's default action, say): not the
                // job's failure. The attempt ends as drained and the job resumes from its last tier copy.
                self.st.request_stop(jid, gpunet_core::StopCause::Drained, Time(now))?;
                was_stopping = true;
                writes.push(self.event(
                    jid.0,
                    "stopping",
                    format!(
                        "job-{} rank {} ended while asked to checkpoint for a reclaim: it resumes elsewhere from its \
                         last tier copy",
                        jid.0, e.task.rank
                    ),
                ));
            }
            let end = if e.stopped { RankEnd::Stopped } else { RankEnd::Exited { success } };
            if !e.stopped && !success && !was_stopping {
                let rank = e.task.rank;
                let (how, outcome) = match (e.code, e.signal, e.oom) {
                    _ if e.reason.is_some() => {
                        let r = e.reason.as_deref().unwrap_or_default();
                        let outcome = if r.contains("time limit") {
                            "time_limit"
                        } else if r.contains("disk limit") {
                            "disk_limit"
                        } else if r.starts_with("could not start") {
                            // The agent could not start it (a missing program, a refused mount, an image it could
                            // not get): not a failed probe.
                            "start_failed"
                        } else {
                            "liveness"
                        };
                        (format!("rank {rank} {r}"), outcome)
                    }
                    (_, _, true) => (format!("rank {rank} was killed for exceeding its memory limit (OOM)"), "oom"),
                    (Some(c), _, _) => (format!("rank {rank} exited with code {c}"), "failed"),
                    (None, Some(sig), _) => (format!("rank {rank} was killed by signal {sig}"), "failed"),
                    _ => (format!("rank {rank} ended"), "failed"),
                };
                self.fail_how.insert(jid.0, super::FailHow { how, outcome, code: e.code, signal: e.signal });
            }
            let ended = self.st.rank_ended(jid, e.task.attempt, e.task.rank, end, Time(now))?;
            match ended {
                Some(x) => self.attempt_ended(x, before, nodes, now, &mut writes),
                None => {
                    if !was_stopping && self.st.job(jid).is_some_and(|j| j.is_stopping()) {
                        // A rank failed: the others are stopped before the job restarts.
                        let how = self.fail_how.get(&jid.0).map(|h| h.how.clone()).unwrap_or_default();
                        writes.push(self.event(
                            jid.0,
                            "stopping",
                            format!("job-{} attempt {} stopping its other ranks: {how}", jid.0, e.task.attempt),
                        ));
                    }
                    self.bump_job(nodes);
                }
            }
        }
        let ended_jobs = self.ended_jobs_of(node, &sync.held_jobs);
        let tasks = self.assignments(id);
        let handed = self.handed.entry(node.to_string()).or_default();
        let at = std::time::Instant::now();
        handed.retain(|_, t| at.duration_since(*t) < HANDED_KEEP);
        handed.extend(tasks.iter().map(|a| (a.task, at)));
        let work = gpunet_api::agent::AgentWork {
            version: self.versions.get(node).copied().unwrap_or(0),
            tasks,
            // The agent fences itself when it cannot sync this long (see `AgentWork::fence_after_ms`).
            fence_after_ms: Some((self.lost_after + self.fence_after).as_millis() as u64),
            lost_after_ms: Some(self.lost_after.as_millis() as u64),
            ended_jobs,
        };
        Ok((writes, work))
    }

    /// Of the jobs whose files a node keeps (`held`), those it may remove: ended for good after an attempt on this
    /// node (its kept attempt records say so; a node learns nothing of other nodes' jobs), or unknown here. At most
    /// [`gpunet_api::agent::HELD_JOBS_MAX`] are looked at.
    fn ended_jobs_of(&self, node: &str, held: &[u64]) -> Vec<u64> {
        let held: std::collections::BTreeSet<u64> =
            held.iter().take(gpunet_api::agent::HELD_JOBS_MAX).copied().collect();
        held.into_iter()
            .filter(|id| match self.docs.get(id) {
                None => self.st.job(JobId(*id)).is_none(),
                Some(d) => {
                    self.live_of(*id, d).is_terminal()
                        && d.more().attempts.iter().any(|a| a.placement.iter().any(|t| t.node == node))
                }
            })
            .collect()
    }

    /// Every task that should run on a node, with its environment.
    fn assignments(&self, node: gpunet_core::NodeId) -> Vec<gpunet_api::agent::TaskAssignment> {
        let mut out = Vec::new();
        let Some(n) = self.st.node(node) else { return out };
        for jid in n.jobs.iter() {
            let (Some(j), Some(doc)) = (self.st.job(*jid), self.docs.get(&jid.0)) else { continue };
            let Some(run) = j.run.as_ref() else { continue };
            if run.stop.is_some() {
                continue; // its end was asked for: the agent stops its tasks and confirms
            }
            let sub = doc.submission.get();
            let attempt = j.attempt();
            // Node order of the gang (first appearance by rank) for NODE_RANK; rank 0's node is the master.
            let mut node_order: Vec<gpunet_core::NodeId> = Vec::new();
            for t in &run.placement.tasks {
                if !node_order.contains(&t.node) {
                    node_order.push(t.node);
                }
            }
            let master = run.placement.tasks.first().and_then(|t| self.st.node(t.node));
            let master_addr = master
                .map(|m| m.spec.labels.get("address").cloned().unwrap_or_else(|| m.spec.name.clone()))
                .unwrap_or_default();
            let one_node = node_order.len() == 1;
            // Each node's reachable address (its agent's `--address`), by node rank, and the zones the gang spans.
            let addresses: Vec<String> = node_order
                .iter()
                .filter_map(|n| self.st.node(*n))
                .map(|v| v.spec.labels.get("address").cloned().unwrap_or_else(|| v.spec.name.clone()))
                .collect();
            let mut zones: Vec<String> =
                node_order.iter().filter_map(|n| self.st.node(*n)).map(|v| v.spec.zone().to_string()).collect();
            zones.sort();
            zones.dedup();
            let all_mask: u64 = run.placement.tasks.iter().fold(0, |a, t| a | t.gpu_mask);
            let nvlink =
                one_node && all_mask != 0 && self.st.scope_met(gpunet_core::TopologyScope::NvLink, &run.placement);
            let local_world = run.placement.tasks.iter().filter(|t| t.node == node).count();
            let mut local_rank = 0u32;
            for (rank, t) in run.placement.tasks.iter().enumerate() {
                if t.node != node {
                    continue;
                }
                let rank = rank as u32;
                if run.ended.binary_search(&rank).is_ok() {
                    local_rank += 1;
                    continue;
                }
                let gpus = t.gpu_indexes();
                // A MIG slot numbers the node's MIG instances GPU by GPU: find its GPU and instance.
                let mig: Vec<gpunet_api::agent::MigSlice> = t
                    .mig_slot
                    .and_then(|s| {
                        let spec = &self.st.node(node)?.spec;
                        let mut k = 0u32;
                        for (g, d) in spec.gpus.iter().enumerate() {
                            for i in 0..d.mig.len() as u32 {
                                if k == s as u32 {
                                    return Some(gpunet_api::agent::MigSlice { gpu: g as u32, instance: i });
                                }
                                k += 1;
                            }
                        }
                        None
                    })
                    .into_iter()
                    .collect();
                let visible = gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                let mut env = sub.env.clone();
                let mut set = |k: &str, v: String| {
                    env.insert(k.to_string(), v);
                };
                // NVML numbers GPUs in PCI bus order; CUDA's default order is fastest first.
                set("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into());
                set("CUDA_VISIBLE_DEVICES", visible.clone());
                set("NVIDIA_VISIBLE_DEVICES", if visible.is_empty() { "void".into() } else { visible });
                set("GPUNET_JOB_ID", jid.0.to_string());
                set("GPUNET_TENANT", doc.tenant.to_string());
                if let Some((array, index)) = j.array_of {
                    set("GPUNET_ARRAY_JOB_ID", array.0.to_string());
                    set("GPUNET_ARRAY_INDEX", index.to_string());
                }
                set("GPUNET_RESTART_COUNT", j.restarts.to_string());
                set("GPUNET_ATTEMPT", attempt.to_string());
                set("RANK", rank.to_string());
                set("WORLD_SIZE", run.placement.tasks.len().to_string());
                set("LOCAL_RANK", local_rank.to_string());
                set("LOCAL_WORLD_SIZE", local_world.to_string());
                set("NODE_RANK", node_order.iter().position(|x| *x == node).unwrap_or(0).to_string());
                set("NNODES", node_order.len().to_string());
                set("MASTER_ADDR", master_addr.clone());
                set("MASTER_PORT", (29_500 + (jid.0 % 10_000)).to_string());
                // NCCL hints from the placement's topology.
                set(
                    "NCCL_P2P_LEVEL",
                    if nvlink {
                        "NVL".into()
                    } else if one_node {
                        "PXB".into()
                    } else {
                        "SYS".into()
                    },
                );
                set("GPUNET_NODE_ADDRESSES", addresses.join(","));
                if one_node {
                    set("NCCL_IB_DISABLE", "1".into());
                }
                if zones.len() > 1 {
                    // Stitched across zones: no InfiniBand or NVLink between them, only IP (sockets), on every NIC.
                    set("GPUNET_ZONES", zones.join(","));
                    set("NCCL_IB_DISABLE", "1".into());
                    set("NCCL_CROSS_NIC", "1".into());
                }
                local_rank += 1;
                out.push(gpunet_api::agent::TaskAssignment {
                    task: gpunet_api::agent::TaskRef { job: jid.0, rank, attempt },
                    command: sub.command.clone(),
                    env,
                    working_dir: sub.working_dir.clone(),
                    gpus,
                    mig,
                    cpu_milli: t.cpu.0,
                    memory_mib: t.mem.0,
                    grace_ms: 10_000,
                    tenant_index: Some(j.spec.tenant.0),
                    submitted_ms: Some(j.submitted.0),
                    checkpoint_now: self.checkpoint_now_of(jid.0, attempt).map(|deadline_ms| {
                        gpunet_api::agent::CheckpointNow {
                            deadline_ms,
                            signal: gpunet_api::spec::checkpoint_signal(sub.checkpoint_signal.as_deref())
                                .ok()
                                .flatten(),
                        }
                    }),
                    container: sub.image.as_ref().map(|image| {
                        let c = sub.container.clone().unwrap_or_default();
                        gpunet_api::image::ContainerTask {
                            image: image.clone(),
                            network: c.network.unwrap_or_default(),
                            shm_mib: c.shm_mib(),
                            mounts: c.mounts,
                        }
                    }),
                    disk_mib: sub
                        .disk
                        .as_ref()
                        .and_then(|d| gpunet_api::units::parse_memory("disk", &d.text()).ok())
                        .map(|m| m.0),
                    time_limit_ms: sub
                        .time_limit
                        .as_deref()
                        .and_then(|d| gpunet_api::units::parse_duration("time_limit", d).ok())
                        .map(|d| d.0),
                    tiers: sub
                        .checkpoint_tiers
                        .iter()
                        .map(|t| gpunet_api::agent::CheckpointTier {
                            name: t.name.clone(),
                            every_ms: gpunet_api::units::parse_duration("every", &t.every)
                                .map_or(600_000, |d| d.0.max(100)),
                            keep: t.keep.unwrap_or(2),
                            url: t.url.clone(),
                        })
                        .collect(),
                    liveness: sub.liveness.as_ref().map(|l| gpunet_api::agent::Liveness {
                        command: l.command.clone(),
                        initial_delay_ms: l
                            .initial_delay
                            .as_deref()
                            .and_then(|d| gpunet_api::units::parse_duration("liveness.initial_delay", d).ok())
                            .map_or(0, |d| d.0),
                        period_ms: l
                            .period
                            .as_deref()
                            .and_then(|d| gpunet_api::units::parse_duration("liveness.period", d).ok())
                            .map_or(10_000, |d| d.0.max(100)),
                    }),
                });
            }
        }
        out
    }

    /// An attempt's end was confirmed: bill it, persist the job, say what it became, and wake the agents of its nodes.
    /// `before` is the job and its document as they were while the attempt ran (for its usage rows).
    fn attempt_ended(
        &mut self,
        e: AttemptEnded,
        before: Option<Before>,
        nodes: Vec<String>,
        now: u64,
        writes: &mut Vec<Write>,
    ) {
        let id = e.job.0;
        if let Some((j, b)) =
            before.as_ref().filter(|_| e.cause.is_none() && e.state == gpunet_core::JobState::Succeeded)
        {
            self.learn_success(j, b, now);
        }
        if let Some((bj, b)) = before {
            let rows = self.usage_rows(&bj, &b, now);
            let ran = bj.run.as_ref().map_or(0, |r| now.saturating_sub(r.started.0));
            // Held in all, stored with the job (written below with its document), so that a restart loses none.
            if let Some(d) = self.docs.get_mut(&id) {
                let m = d.more_mut();
                m.held_ms = m.held_ms.saturating_add(ran);
            }
            let life = self.st.job(e.job).filter(|j| j.state.is_terminal()).map(|j| self.life(id, j.submitted, now));
            let used = rows.iter().fold((0.0, 0.0), |a, r| (a.0 + r.gpu_seconds, a.1 + r.cost));
            self.metrics.attempt_ended(id, &b.tenant, used, life);
            writes.extend(rows.into_iter().map(Write::Usage));
            self.util.ended(id, bj.attempt());
            if let Some(d) = self.docs.get_mut(&id).filter(|d| d.more().util.is_some()) {
                d.more_mut().util = None;
            }
        }
        // Fair share's usage changed with the attempt's end: store it with the rest.
        if let Some(t) = self.docs.get(&id).map(|d| d.tenant.to_string()) {
            writes.extend(self.usage_writes(now, Some(&t)));
        }
        self.sync_doc(id);
        let how = self.fail_how.remove(&id);
        let state = e.state;
        // (event kind, outcome of the attempt, exit code, signal, message)
        let (kind, outcome, code, signal, message) = match e.cause {
            None => (
                "succeeded".to_string(),
                "succeeded",
                Some(0),
                None,
                format!("job-{id} succeeded: every rank exited 0"),
            ),
            Some(StopCause::Failed { rank }) => {
                let h = how.unwrap_or_else(|| super::FailHow {
                    how: format!("rank {rank} failed"),
                    outcome: "failed",
                    code: None,
                    signal: None,
                });
                let kind = if h.outcome == "oom" { "oom".to_string() } else { state.to_string() };
                (kind, h.outcome, h.code, h.signal, format!("job-{id} {state}: {}", h.how))
            }
            Some(StopCause::Preempted { for_job }) => (
                "preempted".into(),
                "preempted",
                None,
                None,
                match for_job {
                    // The event is the evicted job's tenant's to read: another tenant's job is not named.
                    Some(f) if self.docs.get(&f.0).map(|d| &d.tenant) == self.docs.get(&id).map(|d| &d.tenant) => {
                        format!("job-{id} preempted for {f}: attempt {} ended", e.attempt)
                    }
                    Some(_) => format!("job-{id} preempted for {OTHER_JOB}: attempt {} ended", e.attempt),
                    None => format!("job-{id} preempted: attempt {} ended", e.attempt),
                },
            ),
            Some(StopCause::Drained) => (
                "preempted".into(),
                "drained",
                None,
                None,
                format!("job-{id} preempted: its node is draining (attempt {} ended)", e.attempt),
            ),
            Some(StopCause::Cancelled) => ("cancelled".into(), "cancelled", None, None, format!("job-{id} cancelled")),
            Some(StopCause::NodeLost { node }) => {
                let name = self.st.node(node).map(|n| n.spec.name.clone()).unwrap_or_default();
                (
                    "requeued".into(),
                    "node_lost",
                    None,
                    None,
                    format!(
                        "job-{id} requeued: node {name} was lost and attempt {} is confirmed ended (not a restart)",
                        e.attempt
                    ),
                )
            }
            Some(StopCause::Interrupted) => (
                "requeued".into(),
                "interrupted",
                None,
                None,
                format!("job-{id} requeued: its node stopped attempt {} (not a restart)", e.attempt),
            ),
        };
        if let Some(a) =
            self.docs.get_mut(&id).and_then(|d| d.more_mut().attempts.iter_mut().rev().find(|a| a.attempt == e.attempt))
        {
            a.ended_ms = Some(now);
            a.outcome = Some(outcome.to_string());
            a.exit_code = code;
            a.signal = signal;
            a.message = Some(message.clone());
        }
        if let Some(w) = self.job_doc_write(id) {
            writes.push(w);
        }
        if state == JobState::Restarting {
            self.metrics.restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        writes.push(self.event(id, &kind, message));
        self.dirty = true;
        self.bump_job(nodes);
    }

    /// At start, a running job whose GPUs could not be taken back (its node is gone) was requeued: its attempt is
    /// taken to have held them until now (when it ended while the server was down is not known), its record closed
    /// as `interrupted`, and the job stored so (else the next start would requeue, and count, it again).
    pub(crate) fn requeued_at_start(&mut self, id: u64, attempt: u32, started: Time, why: &str) {
        let now = now_ms();
        let Some(d) = self.docs.get_mut(&id) else { return };
        let m = d.more_mut();
        m.held_ms = m.held_ms.saturating_add(now.saturating_sub(started.0));
        let message =
            format!("job-{id} requeued at the server's start: attempt {attempt} could not keep its GPUs ({why})");
        if let Some(a) = m.attempts.iter_mut().rev().find(|a| a.attempt == attempt && a.ended_ms.is_none()) {
            a.ended_ms = Some(now);
            a.outcome = Some("interrupted".into());
            a.message = Some(message.clone());
        }
        let mut writes: Vec<Write> = self.job_doc_write(id).into_iter().collect();
        writes.push(self.event(id, "requeued", message));
        self.persist(writes, "a running job requeued at start");
    }

    /// Confirms at once the stops of attempts whose tasks are all on nodes without an agent (no process runs there).
    pub(super) fn confirm_unmanaged(&mut self, id: JobId, now: u64, writes: &mut Vec<Write>) {
        let Some(j) = self.st.job(id) else { return };
        let Some(run) = j.run.as_ref().filter(|r| r.stop.is_some()) else { return };
        let managed = run
            .placement
            .tasks
            .iter()
            .any(|t| self.st.node(t.node).and_then(|n| self.nodes.get(&n.spec.name)).is_some_and(|d| d.managed));
        if managed {
            return;
        }
        let nodes = self.nodes_of(id);
        let before = self.docs.get(&id.0).map(|d| (j.clone(), d.clone()));
        match self.st.end_attempt(id, Time(now)) {
            Ok(e) => self.attempt_ended(e, before, nodes, now, writes),
            Err(err) => tracing::error!(job = %id, error = %err, "end an attempt on agentless nodes"),
        }
    }

    /// Lost nodes whose fence timed out: their tasks are taken as gone.
    pub(super) fn expire_fences(&mut self, writes: &mut Vec<Write>) {
        let due: Vec<String> =
            self.lost_since.iter().filter(|(_, t)| t.elapsed() >= self.fence_after).map(|(n, _)| n.clone()).collect();
        let now = now_ms();
        for name in due {
            self.lost_since.remove(&name);
            let Some(id) = self.st.node_id(&name) else { continue };
            let jobs: Vec<(JobId, Option<Before>, Vec<String>)> = self
                .st
                .node(id)
                .map(|n| n.jobs.iter().copied().collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|j| {
                    let before = self.docs.get(&j.0).and_then(|d| Some((d.job(&self.st, j.0)?.clone(), d.clone())));
                    (j, before, self.nodes_of(j))
                })
                .collect();
            tracing::warn!(node = %name, jobs = jobs.len(), "fence of a lost node timed out: its tasks are taken as gone");
            match self.st.fence_expired(id, Time(now)) {
                Ok(ended) => {
                    for e in ended {
                        if let Some((_, before, nodes)) = jobs.iter().find(|(j, _, _)| *j == e.job).cloned() {
                            self.attempt_ended(e, before, nodes, now, writes);
                        }
                    }
                }
                Err(e) => tracing::error!(node = %name, error = %e, "expire a node's fence"),
            }
            for (j, _, nodes) in jobs {
                if self.st.job(j).is_some_and(|x| x.is_stopping()) {
                    self.bump_job(nodes);
                }
            }
        }
    }

    /// Whether a task attempt is the node's: placed on it now, or in its task set within the last [`HANDED_KEEP`].
    fn task_of_node(&self, id: gpunet_core::NodeId, node: &str, t: &gpunet_api::agent::TaskRef) -> bool {
        let now = self.st.job(JobId(t.job)).is_some_and(|j| {
            j.attempt() == t.attempt
                && j.run.as_ref().and_then(|r| r.placement.tasks.get(t.rank as usize)).is_some_and(|p| p.node == id)
        });
        now || self.handed.get(node).and_then(|h| h.get(t)).is_some_and(|at| at.elapsed() < HANDED_KEEP)
    }

    /// Agents that stopped syncing lose their nodes; their jobs restart elsewhere under their restart policy.
    pub(super) fn lose_silent_nodes(&mut self) {
        let silent: Vec<String> =
            self.last_seen.iter().filter(|(_, t)| t.elapsed() > self.lost_after).map(|(n, _)| n.clone()).collect();
        for name in silent {
            self.last_seen.remove(&name);
            let Some(id) = self.st.node_id(&name) else { continue };
            if self.st.node(id).is_some_and(|n| n.state == NodeState::Lost) {
                continue;
            }
            tracing::warn!(node = %name, "agent silent: node lost");
            let (tx, _rx) = oneshot::channel();
            self.handle(Cmd::SetNodeState { name, state: NodeState::Lost, reply: tx });
        }
    }

    /// The job holding each whole GPU of a node, by GPU index.
    pub(crate) fn gpu_holders(&self, id: gpunet_core::NodeId) -> BTreeMap<u32, u64> {
        let mut holder = BTreeMap::new();
        let Some(n) = self.st.node(id) else { return holder };
        for j in n.jobs.iter() {
            let Some(run) = self.st.job(*j).and_then(|x| x.run.as_ref()) else { continue };
            for t in run.placement.tasks.iter().filter(|t| t.node == id) {
                for i in t.gpu_indexes() {
                    holder.insert(i, j.0);
                }
            }
        }
        holder
    }

    /// The attempt holding each GPU of node `id` (by index), for the utilisation figures.
    fn gpu_attempts(&self, id: gpunet_core::NodeId) -> BTreeMap<u32, super::utilisation::Holder> {
        self.gpu_holders(id)
            .into_iter()
            .filter_map(|(i, job)| {
                let j = self.st.job(JobId(job))?;
                let started_ms = j.run.as_ref()?.started.0;
                Some((i, super::utilisation::Holder { job, attempt: j.attempt(), started_ms }))
            })
            .collect()
    }

    pub(super) fn node_view(&self, name: &str, who: &Principal) -> Option<NodeView> {
        let id = self.st.node_id(name)?;
        let n = self.st.node(id)?;
        let fake = self.nodes.get(name).is_some_and(|d| d.fake);
        let jobs = n
            .jobs
            .iter()
            .filter(|j| match who {
                Principal::Tenant(t) => self.docs.get(&j.0).is_some_and(|d| *d.tenant == **t),
                _ => true,
            })
            .map(|j| j.0)
            .collect();
        let holder = self.gpu_holders(id);
        let devices = n
            .spec
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let i = i as u32;
                let job = holder.get(&i).copied();
                let tenant = job.and_then(|j| self.docs.get(&j)).map(|d| d.tenant.to_string());
                let shown = match who {
                    Principal::Tenant(t) => tenant.as_ref() == Some(t),
                    _ => true,
                };
                let sample = self.gpu_samples.get(name).and_then(|v| v.iter().find(|s| s.index == i));
                GpuView {
                    index: i,
                    model: g.model.to_string(),
                    numa: g.numa,
                    nvlink_domain: g.nvlink_domain,
                    mig_instances: g.mig.len() as u32,
                    allocated: job.is_some(),
                    job: job.filter(|_| shown),
                    tenant: tenant.filter(|_| shown),
                    utilization_pct: sample.and_then(|s| s.utilization_pct),
                    memory_used_mib: sample.and_then(|s| s.memory_used_mib),
                }
            })
            .collect();
        Some(NodeView {
            name: name.to_string(),
            state: n.state.to_string(),
            gpu_model: n.spec.gpu_model().map(|m| m.to_string()),
            gpus: n.spec.gpus.iter().filter(|g| g.mig.is_empty()).count() as u32,
            free_gpus: n.free_gpu_mask.count_ones(),
            labels: n.spec.labels.clone(),
            fake,
            price_per_gpu_hour: n.spec.price_per_gpu_hour,
            jobs,
            devices,
            reclaim_deadline_ms: self.reclaim_deadline_of(name),
        })
    }
}
