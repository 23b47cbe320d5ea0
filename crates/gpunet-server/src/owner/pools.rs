//! The owner's node pools and spot reclaims.
//!
//! **Pools** (`crate::pools` has their configuration and providers): every `interval_s` the owner samples each
//! pool's demand — GPUs held on its nodes plus GPUs of the queued jobs that could run on one of them
//! (`gpunet_core::autoscale::pool_demands`: each queued job counts in one pool) — and runs the core's autoscaler decision (`autoscale::decide`, the one the
//! simulator runs) against the pool's capacity (its ready and booting nodes). A scale-out names new nodes and asks
//! the provider for them; they count as capacity while they boot, and one that has not registered within the boot
//! timeout is deleted and the pool backs off (5 s, doubling to 5 min) before it asks again. A scale-in cordons idle
//! nodes (or drains checkpointed ones, with `scale_in = "checkpointed"`) and deletes them once empty. Every
//! decision and hook result is an event (`/v1/events`, `GET /v1/pools`) with its numbers.
//!
//! **Reclaims** (`POST /v1/nodes/{node}/reclaim`): the core's three steps (`gpunet_core::lifecycle`), as the
//! simulator takes them. The notice cordons the node and every rank of each job on it gets a checkpoint-now request
//! in its assignment (the agent creates `GPUNET_CHECKPOINT_NOW`, signals, copies the final snapshot to the tiers and
//! reports it); when every rank's snapshot is safe the job is stopped as drained and resumes elsewhere from it. A
//! job without checkpoint tiers is stopped at once. At the deadline the node drains: what still runs keeps only its
//! last tier copy. A pool node is deleted once empty.

use super::{Owner, Reply};
use crate::now_ms;
use crate::pools::{HookOp, PoolConfig, ScaleIn, POOL_LABEL};
use gpunet_api::types::{PoolEventView, PoolNodeView, PoolView};
use gpunet_api::ApiError;
use gpunet_core::autoscale::{self, AutoscaleConfig, ScaleDecision};
use gpunet_core::{JobId, NodeSpec, NodeState, Time};
use gpunet_store::Write;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Pool events kept for `GET /v1/pools`.
const EVENTS_KEPT: usize = 500;
/// First wait after a failed hook or boot; doubles per failure up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Where a pool node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Asked of the provider at `since`; its resume hook ended at `created` (its boot timeout runs from then);
    /// not registered yet.
    Booting { since: Instant, created: Option<Instant> },
    /// Registered.
    Up,
    /// Taken out (scale-in, reclaim, lost, failed boot): deleted once it holds no task.
    Leaving { suspending: bool, retry_at: Option<Instant> },
}

/// One pool's live state.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) cfg: PoolConfig,
    template: NodeSpec,
    auto: AutoscaleConfig,
    nodes: BTreeMap<String, Phase>,
    samples: Vec<f64>,
    last_sample: Option<Instant>,
    last_action: Option<u64>,
    failures: u32,
    retry_at: Option<Instant>,
    /// Failed deletions in a row (their retries back off as failed creations do).
    suspend_failures: u32,
    /// Nodes whose resume hook has not returned yet: none is deleted before it has (a deletion could overtake the
    /// creation at the provider and leave the machine behind).
    resuming: BTreeSet<String>,
    /// When each registered node of the pool was first seen lost (the owner's own record ends with the node's
    /// fence, which may be shorter than the boot timeout).
    lost_at: BTreeMap<String, Instant>,
    next_index: u64,
    forecast: f64,
    load: f64,
    /// A scale-out is held back entirely by nodes being deleted (its event is sent once, as it begins).
    blocked: bool,
    /// Sizing decisions made since the server started (`PoolView::decisions`).
    decisions: u64,
}

/// A reclaim in progress.
#[derive(Debug, Clone)]
pub(crate) struct Reclaim {
    deadline_ms: u64,
    /// Jobs asked to checkpoint: the attempt asked, the ranks whose final snapshot is safe and the earliest
    /// snapshot time.
    jobs: BTreeMap<u64, (u32, BTreeSet<u32>, u64)>,
    deadline_passed: bool,
}

/// Every pool, the reclaims, and the providers.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pub(crate) list: Vec<Pool>,
    pub(crate) providers: Option<crate::pools::Providers>,
    pub(crate) reclaims: BTreeMap<String, Reclaim>,
    events: VecDeque<PoolEventView>,
    /// A cluster of every pool at its largest (at most 64 nodes each), to tell whether a job a pool could hold.
    shadow: Option<gpunet_core::ClusterState>,
    /// Nodes of local pools found at start: their agents died with the server that started them; lost at the first
    /// tick.
    stale: Vec<String>,
    /// The hash of each unregistered pool node's own registration token (kept on its booting record too).
    token_hashes: BTreeMap<String, String>,
}

impl Pools {
    /// Pools from their configuration (checked).
    pub(crate) fn new(cfgs: &[PoolConfig], providers: crate::pools::Providers) -> Pools {
        let list = cfgs
            .iter()
            .map(|c| Pool {
                template: c.template(),
                auto: c.autoscale(),
                cfg: c.clone(),
                nodes: BTreeMap::new(),
                samples: Vec::new(),
                last_sample: None,
                last_action: None,
                failures: 0,
                retry_at: None,
                suspend_failures: 0,
                resuming: BTreeSet::new(),
                lost_at: BTreeMap::new(),
                next_index: 1,
                forecast: 0.0,
                load: 0.0,
                blocked: false,
                decisions: 0,
            })
            .collect();
        let mut shadow = gpunet_core::ClusterState::new(gpunet_core::SchedConfig::default()).ok();
        for c in cfgs {
            for k in 0..c.max_nodes.min(64) {
                let mut n = c.template();
                n.name = format!("{}-{k}", n.name);
                if let Some(s) = shadow.as_mut() {
                    let _ = s.add_node(n);
                }
            }
        }
        Pools {
            list,
            providers: Some(providers),
            reclaims: BTreeMap::new(),
            events: VecDeque::new(),
            shadow: shadow.filter(|_| !cfgs.is_empty()),
            stale: Vec::new(),
            token_hashes: BTreeMap::new(),
        }
    }

    /// Whether a pool at its largest could hold a job (so that it is not refused at submit as never fitting).
    pub(crate) fn could_hold(&self, spec: &gpunet_core::JobSpec) -> bool {
        self.shadow.as_ref().is_some_and(|s| gpunet_core::never_fits(s, spec).is_none())
    }

    /// The pool a node name belongs to.
    pub(crate) fn of_node(&self, name: &str) -> Option<usize> {
        self.list.iter().position(|p| {
            name.strip_prefix(p.cfg.name.as_str())
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|n| n.len() >= 5 && n.chars().all(|c| c.is_ascii_digit()))
        })
    }
}

impl Owner {
    fn pool_event(&mut self, pool: &str, kind: &str, message: String, numbers: serde_json::Value) {
        tracing::info!(pool, kind, %message, "pool");
        let at_ms = now_ms();
        let ev = PoolEventView { pool: pool.to_string(), kind: kind.to_string(), at_ms, message, numbers };
        let _ = self.events.send(
            serde_json::json!({"pool": ev.pool, "kind": format!("pool_{kind}"), "at_ms": at_ms, "message": ev.message,
                "numbers": ev.numbers})
            .to_string(),
        );
        let evs = &mut self.pools.events;
        evs.push_back(ev);
        while evs.len() > EVENTS_KEPT {
            evs.pop_front();
        }
    }

    /// Pools learn their nodes from the store at start: the registered nodes of each pool are up (or leaving when
    /// lost), and new names continue after the highest.
    pub(crate) fn pools_recover(&mut self, booting: &[super::BootingRecord]) {
        // Reclaims in progress go on, with their deadline; their jobs are asked again.
        let reclaiming: Vec<(String, u64)> =
            self.nodes.iter().filter_map(|(n, d)| Some((n.clone(), d.reclaim_deadline_ms?))).collect();
        for (n, deadline_ms) in reclaiming {
            let Some(id) = self.st.node_id(&n) else { continue };
            let mut jobs = BTreeMap::new();
            for j in self.st.node(id).map(|v| v.jobs.iter().copied().collect::<Vec<_>>()).unwrap_or_default() {
                let tiers = self.docs.get(&j.0).is_some_and(|d| !d.submission.get().checkpoint_tiers.is_empty());
                if let (true, Some(x)) = (tiers, self.st.job(j)) {
                    jobs.insert(j.0, (x.attempt(), BTreeSet::new(), u64::MAX));
                }
            }
            self.pools.reclaims.insert(n, Reclaim { deadline_ms, jobs, deadline_passed: false });
        }
        for i in 0..self.pools.list.len() {
            let name = self.pools.list[i].cfg.name.clone();
            let mut next = 1;
            let mut found = Vec::new();
            let mine: Vec<&super::BootingRecord> =
                booting.iter().filter(|b| self.pools.of_node(&b.name) == Some(i)).collect();
            for b in mine {
                let (n, leaving) = (&b.name, &b.leaving);
                // A name once asked for is never asked for again, even when its machine never came.
                if let Some(k) = n.rsplit('-').next().and_then(|k| k.parse::<u64>().ok()) {
                    next = next.max(k + 1);
                }
                if b.removed {
                    continue;
                }
                if let Some(h) = &b.credential {
                    self.pools.token_hashes.insert(n.clone(), h.clone());
                }
                // Asked of the provider before the restart: it may still come (its boot timeout runs from now); a
                // local pool's never will (its agents died with the server); one whose creation had failed is
                // deleted.
                let phase = if *leaving || self.pools.list[i].cfg.provider == crate::pools::ProviderKind::Local {
                    Phase::Leaving { suspending: false, retry_at: None }
                } else {
                    Phase::Booting { since: Instant::now(), created: Some(Instant::now()) }
                };
                found.push((n.clone(), phase));
            }
            for (n, d) in &self.nodes {
                if d.spec.labels.get(POOL_LABEL) != Some(&name) || self.pools.of_node(n) != Some(i) {
                    continue;
                }
                if let Some(k) = n.rsplit('-').next().and_then(|k| k.parse::<u64>().ok()) {
                    next = next.max(k + 1);
                }
                if !d.removed {
                    let local = self.pools.list[i].cfg.provider == crate::pools::ProviderKind::Local;
                    let reclaimed = d.reclaim_deadline_ms.is_some();
                    let phase = if d.leaving
                        || d.state == NodeState::Lost
                        || d.state == NodeState::Draining
                        || local
                        || reclaimed
                    {
                        Phase::Leaving { suspending: false, retry_at: None }
                    } else {
                        Phase::Up
                    };
                    if local && d.state != NodeState::Lost {
                        self.pools.stale.push(n.clone());
                    }
                    found.push((n.clone(), phase));
                }
            }
            // The pool's shape is no larger than its smallest registered machine (as `pool_node_registered` left it).
            let mut shape: Option<(gpunet_core::MilliCpu, gpunet_core::MiB)> = None;
            for (n, d) in &self.nodes {
                if !d.removed && self.pools.of_node(n) == Some(i) {
                    let (c, m) = shape.unwrap_or((d.spec.cpu, d.spec.mem));
                    shape = Some((c.min(d.spec.cpu), m.min(d.spec.mem)));
                }
            }
            let p = &mut self.pools.list[i];
            if let Some((c, m)) = shape {
                p.template.cpu = p.template.cpu.min(c);
                p.template.mem = p.template.mem.min(m);
            }
            p.next_index = next;
            p.nodes.extend(found);
        }
    }

    /// Its pool deletes a node once it holds no task: marked so on its record too when it registered (a restarted
    /// server goes on deleting it).
    fn pool_node_leave(&mut self, i: usize, n: &str) {
        self.pools.list[i].nodes.insert(n.to_string(), Phase::Leaving { suspending: false, retry_at: None });
        if let Some(d) = self.nodes.get_mut(n).filter(|d| !d.leaving && !d.removed) {
            d.leaving = true;
            let w = Write::Node { name: n.to_string(), doc: serde_json::to_value(&*d).expect("serialise") };
            self.persist(vec![w], "pool node leaving");
        }
    }

    /// Whether a node is one its pool is deleting.
    pub(super) fn pool_node_leaving(&self, name: &str) -> bool {
        self.pools
            .of_node(name)
            .is_some_and(|i| matches!(self.pools.list[i].nodes.get(name), Some(Phase::Leaving { .. })))
    }

    /// A node asks to register: a pool's node gets the pool's labels and taint, whatever its agent said. A name of a
    /// pool's form (`POOL-NNNNN`) that the pool never asked for is refused: a join token's holder could otherwise add
    /// nodes the pool adopts, counts as its capacity and prices as its own.
    ///
    /// A pool's node registers with its own registration token (or its credential once registered, or the admin's
    /// token), never the join token: the names are predictable and shown while booting, and whoever took one first
    /// would get the pool's work and price. Its GPUs must be the pool's.
    ///
    /// Only checks (and fills in `spec`): the pool counts the node once it is in the cluster
    /// ([`Owner::pool_node_registered`]), so a registration refused later changes nothing.
    pub(super) fn pool_node_admit(&self, spec: &mut NodeSpec, join: bool) -> Result<(), ApiError> {
        let Some(i) = self.pools.of_node(&spec.name) else { return Ok(()) };
        let p = &self.pools.list[i];
        let conflict = |msg: String| {
            let mut e = ApiError::new("conflict", msg);
            e.field = Some("spec.name".into());
            e
        };
        if join {
            return Err(conflict(format!(
                "node {} is a name of pool {}: its machine registers with the node's own token \
                 (GPUNET_NODE_TOKENS of the resume hook), not the join token",
                spec.name, p.cfg.name
            )));
        }
        let model = p.cfg.model().ok();
        if spec.gpus.len() != p.cfg.gpus_per_node as usize || spec.gpus.iter().any(|g| Some(g.model) != model) {
            let mut models: Vec<String> = spec.gpus.iter().map(|g| g.model.to_string()).collect();
            models.sort();
            models.dedup();
            return Err(ApiError::invalid(
                "spec.gpus",
                &format!("{} GPU(s): {}", spec.gpus.len(), models.join(", ")),
                &format!("pool {}'s nodes have {} {} GPU(s)", p.cfg.name, p.cfg.gpus_per_node, p.cfg.gpu_model),
            ));
        }
        if !p.nodes.contains_key(&spec.name) && !self.nodes.contains_key(&spec.name) {
            return Err(conflict(format!(
                "node {} has a name of pool {}'s form and the pool did not ask for it: pool nodes are named by their \
                 pool (register another name)",
                spec.name, p.cfg.name
            )));
        }
        for (k, v) in p.cfg.node_labels() {
            spec.labels.insert(k, v);
        }
        spec.taints.retain(|t| t.key != "lifecycle");
        if p.cfg.lifecycle == gpunet_core::Lifecycle::Spot {
            spec.taints.push(gpunet_core::node::Taint { key: "lifecycle".into(), value: "spot".into() });
        }
        Ok(())
    }

    /// A node admitted by [`Owner::pool_node_admit`] is in the cluster: its pool counts it (a booting node is up, its
    /// registration token spent) and shrinks its shape to a smaller machine. Returns whether the pool is deleting it
    /// (it then registers cordoned).
    pub(super) fn pool_node_registered(&mut self, spec: &NodeSpec) -> bool {
        let Some(i) = self.pools.of_node(&spec.name) else { return false };
        let p = &mut self.pools.list[i];
        let name = spec.name.clone();
        let pool = p.cfg.name.clone();
        // The machines are smaller than the pool's shape: the autoscaler counts queued jobs against what they have
        // (else it would grow nodes for jobs they cannot hold).
        if spec.cpu < p.template.cpu || spec.mem < p.template.mem {
            let (cpu, mem) = (p.template.cpu.min(spec.cpu), p.template.mem.min(spec.mem));
            p.template.cpu = cpu;
            p.template.mem = mem;
            self.pool_event(
                &pool,
                "shape",
                format!(
                    "node {name} has {} and {} of memory, less than the pool's shape: queued jobs are counted \
                     against {cpu} and {mem} from now on (set cpu_cores_per_node and mem_gib_per_node)",
                    spec.cpu, spec.mem
                ),
                serde_json::json!({"node": name, "cpu_millicores": cpu.0, "mem_mib": mem.0}),
            );
        }
        self.pools.token_hashes.remove(&name);
        let p = &mut self.pools.list[i];
        match p.nodes.get(&name).copied() {
            Some(Phase::Booting { since, .. }) => {
                p.nodes.insert(name.clone(), Phase::Up);
                p.failures = 0;
                let secs = since.elapsed().as_secs_f64();
                self.pool_event(
                    &pool,
                    "node_up",
                    format!("node {name} registered {secs:.1} s after it was asked for"),
                    serde_json::json!({"node": name, "boot_s": secs}),
                );
            }
            Some(Phase::Leaving { .. }) => return true,
            Some(Phase::Up) => {}
            // A node of the cluster before this pool was configured: the pool adopts it.
            None => {
                p.nodes.insert(name.clone(), Phase::Up);
            }
        }
        false
    }

    /// The pool's price for a node, if it sets one.
    pub(super) fn pool_price(&self, name: &str) -> Option<f64> {
        self.pools.of_node(name).and_then(|i| self.pools.list[i].cfg.price_per_gpu_hour)
    }

    /// One step of every pool and reclaim (after each pass).
    pub(super) fn pools_tick(&mut self) {
        if self.pools.providers.as_ref().is_some_and(|p| p.stopping()) {
            return; // the server is stopping: nothing is asked of a provider any more
        }
        for n in std::mem::take(&mut self.pools.stale) {
            // A local pool's agent from before this start: gone with the server that started it.
            let (tx, _rx) = tokio::sync::oneshot::channel();
            self.set_node_state(n, NodeState::Lost, tx);
        }
        self.reclaims_tick();
        for i in 0..self.pools.list.len() {
            self.pool_boot_timeouts(i);
            self.pool_leave(i);
            let due = {
                let p = &self.pools.list[i];
                p.last_sample.is_none_or(|t| t.elapsed().as_secs_f64() >= p.cfg.interval_s)
            };
            if due {
                self.pool_decide(i);
            }
        }
    }

    fn backoff(failures: u32) -> Duration {
        let d = BACKOFF_MIN.saturating_mul(1u32 << failures.saturating_sub(1).min(10));
        d.min(BACKOFF_MAX)
    }

    /// Booting nodes past their timeout are deleted; the pool backs off.
    fn pool_boot_timeouts(&mut self, i: usize) {
        let p = &mut self.pools.list[i];
        let limit = Duration::from_secs_f64(p.cfg.boot_timeout_s);
        let late: Vec<String> = p
            .nodes
            .iter()
            .filter(|(_, ph)| matches!(ph, Phase::Booting { created: Some(t), .. } if t.elapsed() > limit))
            .map(|(n, _)| n.clone())
            .collect();
        if late.is_empty() {
            return;
        }
        p.failures += 1;
        let wait = Self::backoff(p.failures);
        p.retry_at = Some(Instant::now() + wait);
        let mut writes = Vec::new();
        for n in &late {
            p.nodes.insert(n.clone(), Phase::Leaving { suspending: false, retry_at: None });
            writes.push(booting_doc(&p.template, n, Unregistered::Leaving, self.pools.token_hashes.get(n).cloned()));
        }
        let pool = p.cfg.name.clone();
        let failures = p.failures;
        self.persist(writes, "pool nodes that did not boot");
        self.pool_event(
            &pool,
            "boot_timeout",
            format!(
                "{} did not register within {} s: deleted; the pool asks again in {} s",
                late.join(", "),
                limit.as_secs_f64(),
                wait.as_secs()
            ),
            serde_json::json!({"nodes": late, "failures": failures, "retry_in_s": wait.as_secs()}),
        );
    }

    /// Nodes lost for longer than the boot timeout leave; leaving nodes that hold no task are deleted through the
    /// provider.
    fn pool_leave(&mut self, i: usize) {
        let now = Instant::now();
        let limit = Duration::from_secs_f64(self.pools.list[i].cfg.boot_timeout_s);
        let lost: BTreeSet<String> = self.pools.list[i]
            .nodes
            .iter()
            .filter(|(n, ph)| {
                **ph == Phase::Up
                    && self.st.node_id(n).and_then(|id| self.st.node(id)).is_some_and(|v| v.state == NodeState::Lost)
            })
            .map(|(n, _)| n.clone())
            .collect();
        let p = &mut self.pools.list[i];
        p.lost_at.retain(|n, _| lost.contains(n));
        let mut newly = Vec::new();
        for n in lost {
            if !p.lost_at.contains_key(&n) {
                p.lost_at.insert(n.clone(), now);
                newly.push(n);
            }
        }
        if p.cfg.provider == crate::pools::ProviderKind::Local && !newly.is_empty() {
            // A local node's agent that died (or froze) left its tasks running with no one to stop them: the agent and
            // its tasks are killed now, before the fence frees their GPUs for another attempt of the same job.
            if let Some(prov) = self.pools.providers.clone() {
                let pool = p.cfg.name.clone();
                prov.clone().spawn(async move { prov.fence_lost_local(&pool, &newly).await });
            }
        }
        let gone: Vec<String> =
            p.lost_at.iter().filter(|(_, t)| now.duration_since(**t) > limit).map(|(n, _)| n.clone()).collect();
        for n in &gone {
            p.lost_at.remove(n);
        }
        if !gone.is_empty() {
            for n in &gone {
                self.pool_node_leave(i, n);
            }
            let pool = self.pools.list[i].cfg.name.clone();
            self.pool_event(
                &pool,
                "node_lost",
                format!(
                    "{} lost for over {} s: deleted and replaced as the demand needs",
                    gone.join(", "),
                    limit.as_secs_f64()
                ),
                serde_json::json!({"nodes": gone}),
            );
        }
        let mut go = Vec::new();
        for (n, ph) in &self.pools.list[i].nodes {
            let Phase::Leaving { suspending: false, retry_at } = ph else { continue };
            if retry_at.is_some_and(|t| t > now) || self.pools.list[i].resuming.contains(n) {
                continue;
            }
            // Once empty: its jobs' ends are confirmed (a reclaimed node's jobs checkpointed first).
            if self.st.node_id(n).and_then(|id| self.st.node(id)).is_none_or(|v| v.jobs.is_empty()) {
                go.push(n.clone());
            }
        }
        if go.is_empty() {
            return;
        }
        for n in &go {
            self.pools.list[i].nodes.insert(n.clone(), Phase::Leaving { suspending: true, retry_at: None });
        }
        self.pool_hook(i, HookOp::Suspend, go, crate::pools::NodeTokens::new());
    }

    /// Samples the pool's demand and acts on the autoscaler's decision.
    fn pool_decide(&mut self, i: usize) {
        let now_ms = now_ms();
        let (ids, up_or_booting, gpus_per) = {
            let p = &self.pools.list[i];
            let ids: Vec<gpunet_core::NodeId> = p
                .nodes
                .iter()
                .filter(|(_, ph)| !matches!(ph, Phase::Leaving { .. }))
                .filter_map(|(n, _)| self.st.node_id(n))
                .collect();
            let count = p.nodes.values().filter(|ph| !matches!(ph, Phase::Leaving { .. })).count() as u32;
            (ids, count, p.cfg.gpus_per_node)
        };
        // Each queued job counts in one pool only (spot first for jobs that prefer it, then the cheapest).
        let all_ids: Vec<Vec<gpunet_core::NodeId>> = self
            .pools
            .list
            .iter()
            .enumerate()
            .map(|(k, p)| {
                if k == i {
                    return ids.clone();
                }
                p.nodes
                    .iter()
                    .filter(|(_, ph)| !matches!(ph, Phase::Leaving { .. }))
                    .filter_map(|(n, _)| self.st.node_id(n))
                    .collect()
            })
            .collect();
        let shapes: Vec<autoscale::PoolShape<'_>> = self
            .pools
            .list
            .iter()
            .zip(&all_ids)
            .map(|(p, nodes)| autoscale::PoolShape {
                template: &p.template,
                nodes,
                max_gpus: p.cfg.max_nodes as u64 * p.cfg.gpus_per_node as u64,
                price_per_gpu_hour: self.prices.resolve_gpu_hour(&p.template, p.cfg.price_per_gpu_hour),
            })
            .collect();
        let demand = autoscale::pool_demands(&self.st, &shapes)[i] as f64;
        // Idle nodes, newest first; then, with scale_in = checkpointed, nodes whose jobs are all preemptible and
        // checkpoint to a tier, the least loaded first.
        let mut idle: Vec<gpunet_core::NodeId> = Vec::new();
        let mut busy: Vec<(usize, gpunet_core::NodeId)> = Vec::new();
        let policy = self.pools.list[i].cfg.scale_in;
        for id in ids.iter().rev() {
            let Some(v) = self.st.node(*id) else { continue };
            if v.state != NodeState::Ready {
                continue;
            }
            if v.jobs.is_empty() {
                idle.push(*id);
            } else if policy == ScaleIn::Checkpointed
                && v.jobs.iter().all(|j| {
                    self.st.job(*j).is_some_and(|x| x.spec.preemptible)
                        && self.docs.get(&j.0).is_some_and(|d| !d.submission.get().checkpoint_tiers.is_empty())
                })
            {
                busy.push((v.jobs.len(), *id));
            }
        }
        busy.sort_by_key(|(n, _)| *n);
        idle.extend(busy.into_iter().map(|(_, id)| id));
        let p = &mut self.pools.list[i];
        p.last_sample = Some(Instant::now());
        p.decisions += 1;
        p.samples.push(demand);
        let keep = p.auto.window.max(1);
        if p.samples.len() > keep {
            let over = p.samples.len() - keep;
            p.samples.drain(..over);
        }
        let capacity = up_or_booting as u64 * gpus_per as u64;
        if let Some((f, l)) = autoscale::forecast(&p.auto, &p.samples, capacity) {
            p.forecast = f;
            p.load = l;
        }
        let input = autoscale::AutoscaleInput {
            samples: &p.samples,
            capacity_gpus: capacity,
            gpus_per_spot_node: gpus_per,
            spot_nodes: up_or_booting,
            idle_spot: &idle,
            last_action: p.last_action.map(Time),
            now: Time(now_ms),
        };
        let d = autoscale::decide(&p.auto, &input);
        let pool = p.cfg.name.clone();
        if !matches!(d, ScaleDecision::Out { .. }) {
            p.blocked = false; // a later held-back scale-out is news again
        }
        match d {
            ScaleDecision::Out { nodes, load, forecast_gpus } => {
                if p.retry_at.is_some_and(|t| t > Instant::now()) {
                    return; // backing off after a failure
                }
                // A node being deleted is a machine still there (and paid for) until its deletion succeeds: it
                // counts against max_nodes, so that failing deletions cannot grow the pool past it.
                let leaving = p.nodes.values().filter(|ph| matches!(ph, Phase::Leaving { .. })).count() as u32;
                let room = p.cfg.max_nodes.saturating_sub(up_or_booting + leaving);
                let wanted = nodes;
                let nodes = nodes.min(room);
                if nodes == 0 {
                    if !p.blocked {
                        p.blocked = true;
                        self.pool_event(
                            &pool,
                            "scale_out_held",
                            format!(
                                "forecast {forecast_gpus:.1} GPUs on {capacity} (load {}): {wanted} more node(s) \
                                 wanted, but {leaving} node(s) being deleted fill max_nodes ({}) until their deletion \
                                 succeeds",
                                fmt_load(load),
                                self.pools.list[i].cfg.max_nodes
                            ),
                            serde_json::json!({"wanted": wanted, "leaving": leaving, "forecast_gpus": forecast_gpus,
                                "load": finite(load), "capacity_gpus": capacity, "demand_gpus": demand}),
                        );
                    }
                    return;
                }
                p.blocked = false;
                p.retry_at = None;
                p.last_action = Some(now_ms);
                let names: Vec<String> = (0..nodes)
                    .map(|_| {
                        let n = p.cfg.node_name(p.next_index);
                        p.next_index += 1;
                        n
                    })
                    .collect();
                let mut writes = Vec::new();
                // Each node's own registration token: only its machine registers it.
                let mut tokens = crate::pools::NodeTokens::new();
                for n in &names {
                    p.nodes.insert(n.clone(), Phase::Booting { since: Instant::now(), created: None });
                    let token = crate::new_token();
                    let hash = crate::hash_token(&token);
                    writes.push(booting_doc(&p.template, n, Unregistered::Asked, Some(hash.clone())));
                    self.pools.token_hashes.insert(n.clone(), hash.clone());
                    self.auth
                        .write()
                        .expect("auth lock")
                        .insert(hash, crate::tokens::Cred { who: crate::Principal::Node(n.clone()), doc: None });
                    tokens.insert(n.clone(), token);
                }
                let target = up_or_booting + nodes;
                let held = if wanted > nodes {
                    format!(
                        " ({} more wanted: {leaving} node(s) being deleted count against max_nodes)",
                        wanted - nodes
                    )
                } else {
                    String::new()
                };
                self.persist(writes, "pool nodes asked for");
                self.pool_event(
                    &pool,
                    "scale_out",
                    format!(
                        "forecast {forecast_gpus:.1} GPUs on {capacity} (load {}): {nodes} more node(s), to {target}: \
                         {}{held}",
                        fmt_load(load),
                        names.join(", ")
                    ),
                    serde_json::json!({"nodes": names, "forecast_gpus": forecast_gpus, "load": finite(load),
                        "capacity_gpus": capacity, "demand_gpus": demand, "from": up_or_booting, "to": target,
                        "leaving": leaving}),
                );
                self.pool_hook(i, HookOp::Resume, names, tokens);
            }
            ScaleDecision::In { nodes, load, forecast_gpus } => {
                p.last_action = Some(now_ms);
                let names: Vec<String> =
                    nodes.iter().filter_map(|id| self.st.node(*id).map(|v| v.spec.name.clone())).collect();
                let target = up_or_booting - names.len() as u32;
                self.pool_event(
                    &pool,
                    "scale_in",
                    format!(
                        "forecast {forecast_gpus:.1} GPUs on {capacity} (load {}): {} node(s) fewer, to {target}: {}",
                        fmt_load(load),
                        names.len(),
                        names.join(", ")
                    ),
                    serde_json::json!({"nodes": names, "forecast_gpus": forecast_gpus, "load": finite(load),
                        "capacity_gpus": capacity, "demand_gpus": demand, "from": up_or_booting, "to": target}),
                );
                for n in names {
                    // Idle ones take no new work from now on; checkpointed ones drain (their jobs resume elsewhere).
                    let busy = self.st.node_id(&n).and_then(|id| self.st.node(id)).is_some_and(|v| !v.jobs.is_empty());
                    let state = if busy { NodeState::Draining } else { NodeState::Cordoned };
                    let (tx, _rx) = tokio::sync::oneshot::channel();
                    self.set_node_state(n.clone(), state, tx);
                    self.pool_node_leave(i, &n);
                }
            }
            ScaleDecision::Hold { .. } => {}
        }
    }

    /// Runs a provider hook off the owner; its result comes back as a change.
    fn pool_hook(&mut self, i: usize, op: HookOp, nodes: Vec<String>, tokens: crate::pools::NodeTokens) {
        let (Some(prov), Some(tx)) = (self.pools.providers.clone(), self.self_tx.clone()) else { return };
        let cfg = self.pools.list[i].cfg.clone();
        if op == HookOp::Resume {
            self.pools.list[i].resuming.extend(nodes.iter().cloned());
        }
        prov.clone().spawn(async move {
            let t0 = Instant::now();
            let r = prov.run(&cfg, op, &nodes, &tokens).await;
            let secs = t0.elapsed().as_secs_f64();
            let _ = tx.send(super::Applier(Box::new(move |o: &mut Owner| o.pool_hook_done(i, op, nodes, r, secs))));
        });
    }

    fn pool_hook_done(&mut self, i: usize, op: HookOp, nodes: Vec<String>, r: Result<(), String>, secs: f64) {
        let pool = self.pools.list[i].cfg.name.clone();
        if op == HookOp::Resume {
            let p = &mut self.pools.list[i];
            for n in &nodes {
                p.resuming.remove(n);
            }
        }
        match (op, r) {
            (HookOp::Resume, Ok(())) => {
                // The boot timeout runs from now for those not registered yet.
                let now = Instant::now();
                for n in &nodes {
                    if let Some(Phase::Booting { created, .. }) = self.pools.list[i].nodes.get_mut(n) {
                        *created = Some(now);
                    }
                }
                self.pool_event(
                    &pool,
                    "resumed",
                    format!("the provider created {} in {secs:.1} s", nodes.join(", ")),
                    serde_json::json!({"nodes": nodes, "seconds": secs}),
                );
            }
            (HookOp::Resume, Err(e)) => {
                let p = &mut self.pools.list[i];
                p.failures += 1;
                let wait = Self::backoff(p.failures);
                p.retry_at = Some(Instant::now() + wait);
                // Whatever the provider may have half made is deleted (a node that registered meanwhile too).
                let mut registered = Vec::new();
                let mut writes = Vec::new();
                for n in &nodes {
                    match p.nodes.get(n) {
                        Some(Phase::Booting { .. }) => writes.push(booting_doc(
                            &p.template,
                            n,
                            Unregistered::Leaving,
                            self.pools.token_hashes.get(n).cloned(),
                        )),
                        Some(Phase::Up) => registered.push(n.clone()),
                        _ => continue,
                    }
                    p.nodes.insert(n.clone(), Phase::Leaving { suspending: false, retry_at: None });
                }
                let failures = p.failures;
                self.persist(writes, "pool nodes whose creation failed");
                for n in registered {
                    self.pool_node_leave(i, &n);
                    // It registered before the hook failed: it takes no new work; what it runs ends there, then it
                    // is deleted (as a scale-in's idle node).
                    let ready = self
                        .st
                        .node_id(&n)
                        .and_then(|id| self.st.node(id))
                        .is_some_and(|v| v.state == NodeState::Ready);
                    if ready {
                        let (tx, _rx) = tokio::sync::oneshot::channel();
                        self.set_node_state(n, NodeState::Cordoned, tx);
                    }
                }
                self.pool_event(
                    &pool,
                    "resume_failed",
                    format!("creating {} failed: {e}; the pool asks again in {} s", nodes.join(", "), wait.as_secs()),
                    serde_json::json!({"nodes": nodes, "error": e, "failures": failures, "retry_in_s": wait.as_secs()}),
                );
            }
            (HookOp::Suspend, Ok(())) => {
                self.pools.list[i].suspend_failures = 0;
                let mut writes = Vec::new();
                for n in &nodes {
                    self.pools.list[i].nodes.remove(n);
                    self.pools.reclaims.remove(n);
                    self.last_seen.remove(n);
                    let registered = self.st.node_id(n).and_then(|id| self.st.node(id)).map(|v| v.state);
                    if registered.is_some_and(|st| st != NodeState::Lost) {
                        // Lost as any node whose machine is gone: whatever it still held is fenced, then freed.
                        let (tx, _rx) = tokio::sync::oneshot::channel();
                        self.set_node_state(n.clone(), NodeState::Lost, tx);
                    }
                    match self.nodes.get_mut(n) {
                        Some(d) => {
                            d.removed = true;
                            d.state = NodeState::Lost;
                            d.credential = None;
                            d.reclaim_deadline_ms = None;
                            writes.push(Write::Node {
                                name: n.clone(),
                                doc: serde_json::to_value(&*d).expect("serialise"),
                            });
                        }
                        // Never registered: its booting record goes.
                        None => writes.push(booting_doc(&self.pools.list[i].template, n, Unregistered::Deleted, None)),
                    }
                    if self.pools.list[i].cfg.provider == crate::pools::ProviderKind::Local {
                        if let Some(p) = &self.pools.providers {
                            p.forget_local(&self.pools.list[i].cfg.name, n);
                        }
                    }
                    self.auth.write().expect("auth lock").retain(|_, c| c.who != crate::Principal::Node(n.clone()));
                    self.pools.token_hashes.remove(n);
                }
                self.dirty = true;
                self.persist(writes, "pool nodes removed");
                self.pool_event(
                    &pool,
                    "deleted",
                    format!("the provider deleted {} in {secs:.1} s", nodes.join(", ")),
                    serde_json::json!({"nodes": nodes, "seconds": secs}),
                );
            }
            (HookOp::Suspend, Err(e)) => {
                let p = &mut self.pools.list[i];
                p.suspend_failures += 1;
                let wait = Self::backoff(p.suspend_failures);
                let failures = p.suspend_failures;
                for n in &nodes {
                    self.pools.list[i]
                        .nodes
                        .insert(n.clone(), Phase::Leaving { suspending: false, retry_at: Some(Instant::now() + wait) });
                }
                self.pool_event(
                    &pool,
                    "suspend_failed",
                    format!("deleting {} failed: {e}; tried again in {} s", nodes.join(", "), wait.as_secs()),
                    serde_json::json!({"nodes": nodes, "error": e, "failures": failures,
                        "retry_in_s": wait.as_secs()}),
                );
            }
        }
    }

    /// `GET /v1/pools`.
    pub(super) fn pool_views(&self, reply: Reply<Vec<PoolView>>) {
        let v = self
            .pools
            .list
            .iter()
            .map(|p| PoolView {
                name: p.cfg.name.clone(),
                provider: format!("{:?}", p.cfg.provider).to_lowercase(),
                zone: p.cfg.zone.clone(),
                lifecycle: p.cfg.lifecycle.as_str().into(),
                gpu_model: p.cfg.gpu_model.clone(),
                gpus_per_node: p.cfg.gpus_per_node,
                min_nodes: p.cfg.min_nodes,
                max_nodes: p.cfg.max_nodes,
                target_nodes: p.nodes.values().filter(|ph| !matches!(ph, Phase::Leaving { .. })).count() as u32,
                forecast_gpus: p.forecast,
                load: finite(p.load),
                decisions: p.decisions,
                nodes: p
                    .nodes
                    .iter()
                    .map(|(n, ph)| PoolNodeView {
                        name: n.clone(),
                        phase: match ph {
                            Phase::Booting { .. } => "booting",
                            Phase::Up => "up",
                            Phase::Leaving { .. } => "leaving",
                        }
                        .into(),
                        state: self.nodes.get(n).map(|d| d.state.to_string()),
                    })
                    .collect(),
                events: self.pools.events.iter().filter(|e| e.pool == p.cfg.name).cloned().collect(),
            })
            .collect();
        let _ = reply.send(Ok(v));
    }

    /// The pools' gauges for `/metrics`.
    pub(crate) fn pool_gauges(&self) -> Vec<(String, u32, f64, f64, [u32; 3])> {
        self.pools
            .list
            .iter()
            .map(|p| {
                let mut by = [0u32; 3];
                for ph in p.nodes.values() {
                    by[match ph {
                        Phase::Booting { .. } => 0,
                        Phase::Up => 1,
                        Phase::Leaving { .. } => 2,
                    }] += 1;
                }
                (p.cfg.name.clone(), by[0] + by[1], p.forecast, finite(p.load), by)
            })
            .collect()
    }

    // ----- reclaims -----

    /// `POST /v1/nodes/{node}/reclaim`: the notice (see the module docs).
    pub(super) fn reclaim_node(&mut self, name: String, deadline_s: f64, reply: Reply<gpunet_api::types::NodeView>) {
        let Some(id) = self.st.node_id(&name) else {
            let _ = reply.send(Err(super::not_found("node", &name)));
            return;
        };
        if self.nodes.get(&name).is_some_and(|d| d.removed)
            || self.st.node(id).is_some_and(|v| v.state == NodeState::Lost)
        {
            let _ = reply
                .send(Err(ApiError::new("conflict", format!("node {name} is lost or deleted: nothing to reclaim"))));
            return;
        }
        let now = now_ms();
        let deadline_ms = now + (deadline_s * 1000.0) as u64;
        if let Some(r) = self.pools.reclaims.get_mut(&name) {
            // A second notice: the earlier deadline stands unless this one is sooner; what was reported stays.
            r.deadline_ms = r.deadline_ms.min(deadline_ms);
            let deadline_ms = r.deadline_ms;
            let jobs: Vec<u64> = r.jobs.keys().copied().collect();
            let mut writes = Vec::new();
            if let Some(d) = self.nodes.get_mut(&name) {
                d.reclaim_deadline_ms = Some(deadline_ms);
                writes.push(Write::Node { name: name.clone(), doc: serde_json::to_value(&*d).expect("serialise") });
            }
            let mut touched = vec![name.clone()];
            for j in jobs {
                touched.extend(self.nodes_of(JobId(j)));
            }
            touched.sort();
            touched.dedup();
            self.bump_job(touched);
            let v = self.node_view(&name, &crate::Principal::Admin).expect("known");
            self.durable(writes, reply, v);
            return;
        }
        let jobs = match self.st.reclaim_notice(id, Time(now)) {
            Ok(j) => j,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                return;
            }
        };
        let mut writes = Vec::new();
        let mut touched = vec![name.clone()];
        let mut asked = BTreeMap::new();
        for j in &jobs {
            touched.extend(self.nodes_of(*j));
            let tiers = self.docs.get(&j.0).is_some_and(|d| !d.submission.get().checkpoint_tiers.is_empty());
            if tiers {
                let attempt = self.st.job(*j).map_or(0, |x| x.attempt());
                asked.insert(j.0, (attempt, BTreeSet::new(), u64::MAX));
                writes.push(self.event(
                    j.0,
                    "checkpoint_now",
                    format!(
                        "job-{} asked to checkpoint now: node {name} is reclaimed in {deadline_s} s; it resumes \
                         elsewhere from that checkpoint",
                        j.0
                    ),
                ));
            } else {
                // Nothing to save on a tier: it stops now and starts again elsewhere.
                let _ = self.st.request_stop(*j, gpunet_core::StopCause::Drained, Time(now));
                self.sync_doc(j.0);
                writes.push(self.job_doc_write(j.0).expect("present"));
                writes.push(self.event(
                    j.0,
                    "stopping",
                    format!("job-{} stopping: node {name} is reclaimed and the job has no checkpoint tier", j.0),
                ));
                self.confirm_unmanaged(*j, now, &mut writes);
            }
        }
        self.pools.reclaims.insert(name.clone(), Reclaim { deadline_ms, jobs: asked, deadline_passed: false });
        if let Some(i) = self.pools.of_node(&name) {
            if !matches!(self.pools.list[i].nodes.get(&name), Some(Phase::Leaving { .. })) {
                self.pool_node_leave(i, &name);
            }
            let pool = self.pools.list[i].cfg.name.clone();
            self.pool_event(
                &pool,
                "reclaim",
                format!("node {name} is reclaimed by its provider in {deadline_s} s ({} job(s) on it)", jobs.len()),
                serde_json::json!({"node": name, "deadline_s": deadline_s, "jobs": jobs.iter().map(|j| j.0).collect::<Vec<_>>()}),
            );
        }
        let state = self.st.node(id).map_or(NodeState::Cordoned, |v| v.state);
        if let Some(d) = self.nodes.get_mut(&name) {
            d.state = state;
            d.reclaim_deadline_ms = Some(deadline_ms);
            writes.push(Write::Node { name: name.clone(), doc: serde_json::to_value(&*d).expect("serialise") });
        }
        self.node_event(&name, "reclaimed");
        self.dirty = true;
        touched.sort();
        touched.dedup();
        self.bump_job(touched);
        let v = self.node_view(&name, &crate::Principal::Admin).expect("known");
        self.durable(writes, reply, v);
    }

    /// The deadline of a checkpoint-now request for this attempt of a job, if one of its nodes is reclaimed.
    pub(super) fn checkpoint_now_of(&self, job: u64, attempt: u32) -> Option<u64> {
        self.pools
            .reclaims
            .values()
            .filter(|r| r.jobs.get(&job).is_some_and(|(a, _, _)| *a == attempt))
            .map(|r| r.deadline_ms)
            .min()
    }

    /// An agent says a rank's final snapshot is on every tier: once every live rank's is, the job stops to resume
    /// elsewhere from it.
    pub(super) fn checkpoint_now_done(&mut self, t: &gpunet_api::agent::TaskRef, at: u64, writes: &mut Vec<Write>) {
        let jid = JobId(t.job);
        if !self.st.job(jid).is_some_and(|j| j.attempt() == t.attempt && !j.is_stopping()) {
            return;
        }
        let live = self.st.live_ranks(jid);
        let mut complete = None;
        for r in self.pools.reclaims.values_mut() {
            if let Some((_, ranks, first)) = r.jobs.get_mut(&t.job).filter(|(a, _, _)| *a == t.attempt) {
                ranks.insert(t.rank);
                *first = (*first).min(at);
                if live.iter().all(|k| ranks.contains(k)) {
                    complete = Some(*first);
                }
            }
        }
        let Some(at) = complete else { return };
        let now = now_ms();
        let nodes = self.nodes_of(jid);
        if self.st.reclaim_checkpointed(jid, Time(at), Time(now)).unwrap_or(false) {
            self.sync_doc(t.job);
            writes.push(self.job_doc_write(t.job).expect("present"));
            writes.push(self.event(
                t.job,
                "stopping",
                format!("job-{} final checkpoint is on its tiers: stopping to resume elsewhere from it", t.job),
            ));
            self.confirm_unmanaged(jid, now, writes);
            self.bump_job(nodes);
        }
    }

    /// Reclaims past their deadline drain their node.
    fn reclaims_tick(&mut self) {
        let now = now_ms();
        let due: Vec<String> = self
            .pools
            .reclaims
            .iter()
            .filter(|(_, r)| !r.deadline_passed && r.deadline_ms <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            if let Some(r) = self.pools.reclaims.get_mut(&name) {
                r.deadline_passed = true;
            }
            let Some(id) = self.st.node_id(&name) else { continue };
            let late = self.st.node(id).map(|v| v.jobs.iter().map(|j| j.0).collect::<Vec<_>>()).unwrap_or_default();
            if !late.is_empty() {
                tracing::warn!(node = %name, jobs = ?late, "reclaim deadline: draining what still runs");
            }
            let (tx, _rx) = tokio::sync::oneshot::channel();
            self.set_node_state(name.clone(), NodeState::Draining, tx);
            if self.pools.of_node(&name).is_none() {
                // Not a pool's: the node stays (draining, until an admin readies it); its reclaim is over.
                self.end_reclaim(&name);
            }
        }
    }

    /// A reclaim is over: forgotten, and its deadline taken off the node's record (a restart must not drain the
    /// node again).
    fn end_reclaim(&mut self, name: &str) {
        self.pools.reclaims.remove(name);
        if let Some(d) = self.nodes.get_mut(name).filter(|d| d.reclaim_deadline_ms.is_some()) {
            d.reclaim_deadline_ms = None;
            let w = Write::Node { name: name.to_string(), doc: serde_json::to_value(&*d).expect("serialise") };
            self.persist(vec![w], "reclaim ended");
        }
    }

    /// The deadline of a reclaim in progress on this node, if one is.
    pub(super) fn reclaim_deadline_of(&self, name: &str) -> Option<u64> {
        self.pools.reclaims.get(name).map(|r| r.deadline_ms)
    }
}

/// What became of a pool node that has not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unregistered {
    /// Asked of its provider.
    Asked,
    /// Its creation failed or timed out: deleted once its deletion hook has run (a restarted server deletes it too).
    Leaving,
    /// Deleted.
    Deleted,
}

/// The stored record of a pool node asked of its provider and not registered.
fn booting_doc(template: &NodeSpec, name: &str, what: Unregistered, credential: Option<String>) -> Write {
    let mut spec = template.clone();
    spec.name = name.to_string();
    let doc = super::NodeDoc {
        spec,
        state: NodeState::Lost,
        fake: false,
        managed: false,
        // The hash of the node's own registration token (a restarted server still takes it).
        credential,
        price_override: None,
        removed: what == Unregistered::Deleted,
        // A record that never registered stays marked booting, so that a start never takes it for a node.
        booting: true,
        reclaim_deadline_ms: None,
        leaving: what == Unregistered::Leaving,
    };
    Write::Node { name: name.to_string(), doc: serde_json::to_value(&doc).expect("serialise") }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        f64::MAX
    }
}

fn fmt_load(l: f64) -> String {
    if l.is_finite() {
        format!("{l:.2}")
    } else {
        "∞: no capacity".into()
    }
}
