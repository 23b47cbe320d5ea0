//! Prometheus metrics in the text exposition format: counters and histograms updated in place, and gauges computed
//! from the owner's state when `/metrics` is read.
//!
//! Families (every one is listed in README's "Monitoring"; the alert rules and dashboards in `deploy/` use them):
//! per tenant — GPUs allocated, guarantee, limit, borrowed, pending jobs and GPUs, the oldest pending job's age and
//! GPU-seconds used (a counter: every run in the ledger, plus running jobs so far, billed as the ledger bills; it
//! continues across restarts, as do the counters of preemptions, restarts and submissions); per node — state and agent sync age; jobs by tenant and state; GPUs by model and zone; per GPU —
//! allocation and the agents' samples (NVML, or `--fake-gpu-samples`, labelled `fake="true"`) with ECC and XID error
//! counters; checkpoint copy failures per node; histograms of the scheduling pass, the wait from submission to first
//! start, the time a job spent not running over its life, eviction latency, store commit latency and API requests.

use crate::owner::{Owner, Which};
use gpunet_core::JobState;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A histogram with fixed buckets.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, inner: Mutex::new((vec![0; bounds.len()], 0.0, 0)) }
    }

    pub(crate) fn observe(&self, v: f64) {
        let mut g = self.inner.lock().expect("histogram lock");
        for (i, b) in self.bounds.iter().enumerate() {
            if v <= *b {
                g.0[i] += 1;
            }
        }
        g.1 += v;
        g.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let g = self.inner.lock().expect("histogram lock");
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in self.bounds.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {}", g.0[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", g.2);
        let lb = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{lb} {}", g.1);
        let _ = writeln!(out, "{name}_count{lb} {}", g.2);
    }
}

const PASS: &[f64] = &[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];
const PENDING: &[f64] = &[1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0];
const API: &[f64] = &[0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];
const COMMIT: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const EVICT: &[f64] = &[0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// A job's life when it ends, in ms: submitted and ended (since the Unix epoch), and how long its attempts held their
/// resources in all (the job document's `held_ms`, stored: a restart of the server loses none of it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Life {
    pub(crate) submitted: u64,
    pub(crate) ended: u64,
    pub(crate) held: u64,
}

/// Metrics the server updates as it works.
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    pub(crate) pass_seconds: Histogram,
    /// Building the queue view the API serves (`owner/snapshot.rs`).
    pub(crate) queue_snapshot_seconds: Histogram,
    pub(crate) pending_seconds: Histogram,
    pub(crate) preemptions: AtomicU64,
    pub(crate) restarts: AtomicU64,
    pub(crate) submitted: AtomicU64,
    /// Writes the store refused (the control plane is read-only from the first one until restarted).
    pub(crate) store_write_failures: AtomicU64,
    /// Why the store cannot be written, once it refused a write (or failed the start-up probe).
    pub(crate) store_refused: Mutex<Option<String>>,
    pub(crate) api: Mutex<BTreeMap<(String, String, u16), Histogram>>,
    /// From a store commit's submission to its durable callback.
    pub(crate) commit_seconds: Histogram,
    /// From a preemption or a drain asking a job to stop to its end being confirmed.
    pub(crate) eviction_seconds: Histogram,
    /// Over a job's life (observed when it ends): time from submission to end not spent running.
    pub(crate) not_running_seconds: Histogram,
    /// Per job: when the scheduler asked it to stop (until its attempt ends).
    jobs: Mutex<HashMap<u64, std::time::Instant>>,
    /// Per tenant: GPU-seconds and cost of runs that ended (the ledger's sums at start, then each run as it ends).
    tenant_used: Mutex<BTreeMap<String, (f64, f64)>>,
    /// Per node: checkpoint copies that failed, as its agent last reported (a counter restarting with the agent).
    checkpoint_failures: Mutex<BTreeMap<String, u64>>,
}

impl ServerMetrics {
    pub(crate) fn new() -> ServerMetrics {
        ServerMetrics {
            pass_seconds: Histogram::new(PASS),
            queue_snapshot_seconds: Histogram::new(PASS),
            pending_seconds: Histogram::new(PENDING),
            preemptions: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            store_write_failures: AtomicU64::new(0),
            store_refused: Mutex::new(None),
            api: Mutex::new(BTreeMap::new()),
            commit_seconds: Histogram::new(COMMIT),
            eviction_seconds: Histogram::new(EVICT),
            not_running_seconds: Histogram::new(PENDING),
            jobs: Mutex::new(HashMap::new()),
            tenant_used: Mutex::new(BTreeMap::new()),
            checkpoint_failures: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts the cumulative counters from what the store holds: per tenant the ledger's sums (every run that ended,
    /// before this start too), and the jobs' preemptions, restarts and submissions. Counters of the process itself
    /// (refused writes, histograms, API requests) start again at 0, as a restarted process's do.
    pub(crate) fn restore_totals(
        &self,
        ledger: BTreeMap<String, gpunet_store::LedgerTotals>,
        preemptions: u64,
        restarts: u64,
        submitted: u64,
    ) {
        *self.tenant_used.lock().expect("tenant usage") =
            ledger.into_iter().map(|(t, l)| (t, (l.gpu_seconds, l.cost))).collect();
        self.preemptions.store(preemptions, Ordering::Relaxed);
        self.restarts.store(restarts, Ordering::Relaxed);
        self.submitted.store(submitted, Ordering::Relaxed);
    }

    /// `job` was asked to stop by a preemption or a drain: the eviction latency runs until its attempt ends.
    pub(crate) fn stop_asked(&self, job: u64) {
        self.jobs.lock().expect("job clocks").insert(job, std::time::Instant::now());
    }

    /// An attempt of `job` (of `tenant`) that used `used` (GPU-seconds, cost) ended; `life` is, when the job has
    /// ended for good, its [`Life`].
    pub(crate) fn attempt_ended(&self, job: u64, tenant: &str, used: (f64, f64), life: Option<Life>) {
        let mut u = self.tenant_used.lock().expect("tenant usage");
        let e = u.entry(tenant.to_string()).or_default();
        e.0 += used.0;
        e.1 += used.1;
        drop(u);
        if let Some(t) = self.jobs.lock().expect("job clocks").remove(&job) {
            self.eviction_seconds.observe(t.elapsed().as_secs_f64());
        }
        if let Some(l) = life {
            self.job_ended(l);
        }
    }

    /// A job ended for good (after its last attempt, or while it waited: cancelled, or failed because a dependency
    /// can never be met): its time not running is observed.
    pub(crate) fn job_ended(&self, life: Life) {
        let Life { submitted, ended, held } = life;
        self.not_running_seconds.observe(ended.saturating_sub(submitted).saturating_sub(held) as f64 / 1000.0);
    }

    /// A node's agent reported its count of failed checkpoint copies.
    pub(crate) fn checkpoint_failures(&self, node: &str, count: u64) {
        self.checkpoint_failures.lock().expect("checkpoint failures").insert(node.to_string(), count);
    }

    /// Records a write the store refused: from now on the control plane is read-only.
    pub(crate) fn store_refused(&self, why: &str) {
        self.store_write_failures.fetch_add(1, Ordering::Relaxed);
        let mut g = self.store_refused.lock().expect("store health lock");
        if g.is_none() {
            tracing::error!(error = %why, "the store refused a write: the control plane is read-only until restarted");
            *g = Some(why.to_string());
        }
    }

    /// Whether the store accepts writes.
    pub(crate) fn store_writable(&self) -> bool {
        self.store_refused.lock().expect("store health lock").is_none()
    }

    pub(crate) fn observe_api(&self, method: &str, route: &str, status: u16, secs: f64) {
        let mut m = self.api.lock().expect("api metrics lock");
        m.entry((method.to_string(), route.to_string(), status)).or_insert_with(|| Histogram::new(API)).observe(secs);
    }

    /// Renders counters and histograms.
    pub(crate) fn render(&self, gauges: &str) -> String {
        let mut s = String::from(gauges);
        let _ = writeln!(s, "# HELP gpunet_scheduling_pass_duration_seconds Duration of one scheduling pass.");
        let _ = writeln!(s, "# TYPE gpunet_scheduling_pass_duration_seconds histogram");
        self.pass_seconds.render(&mut s, "gpunet_scheduling_pass_duration_seconds", "");
        let _ = writeln!(
            s,
            "# HELP gpunet_queue_snapshot_duration_seconds Building the queue view the API serves (order, reasons, ETAs)."
        );
        let _ = writeln!(s, "# TYPE gpunet_queue_snapshot_duration_seconds histogram");
        self.queue_snapshot_seconds.render(&mut s, "gpunet_queue_snapshot_duration_seconds", "");
        let _ = writeln!(
            s,
            "# HELP gpunet_job_pending_duration_seconds Time from submission to first start of jobs that started."
        );
        let _ = writeln!(s, "# TYPE gpunet_job_pending_duration_seconds histogram");
        self.pending_seconds.render(&mut s, "gpunet_job_pending_duration_seconds", "");
        for (name, help, h) in [
            (
                "gpunet_job_not_running_duration_seconds",
                "Time a job spent not running between its submission and its end (observed when it ends).",
                &self.not_running_seconds,
            ),
            (
                "gpunet_eviction_duration_seconds",
                "Time from a preemption or a drain asking a job to stop to its end being confirmed.",
                &self.eviction_seconds,
            ),
            (
                "gpunet_store_commit_duration_seconds",
                "Time from a store commit's submission to its durable (or refused) callback.",
                &self.commit_seconds,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
            h.render(&mut s, name, "");
        }
        let _ = writeln!(
            s,
            "# HELP gpunet_checkpoint_copy_failures_total Checkpoint copies to a tier that failed, as each node's agent \
             reports them (restarts with the agent).\n# TYPE gpunet_checkpoint_copy_failures_total counter"
        );
        for (n, v) in self.checkpoint_failures.lock().expect("checkpoint failures").iter() {
            let _ = writeln!(s, "gpunet_checkpoint_copy_failures_total{{node=\"{}\"}} {v}", esc(n));
        }
        for (name, help, v) in [
            ("gpunet_preemptions_total", "Jobs evicted by the scheduler.", &self.preemptions),
            ("gpunet_restarts_total", "Job restarts after failures.", &self.restarts),
            ("gpunet_jobs_submitted_total", "Jobs accepted.", &self.submitted),
            ("gpunet_store_write_failures_total", "Writes the store refused.", &self.store_write_failures),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            s,
            "# HELP gpunet_store_writable Whether the store accepts writes (0: read-only until restarted).\n\
             # TYPE gpunet_store_writable gauge\ngpunet_store_writable {}",
            self.store_writable() as u8
        );
        let _ = writeln!(s, "# HELP gpunet_api_request_duration_seconds Duration of API requests.");
        let _ = writeln!(s, "# TYPE gpunet_api_request_duration_seconds histogram");
        for ((m, r, st), h) in self.api.lock().expect("api metrics lock").iter() {
            h.render(
                &mut s,
                "gpunet_api_request_duration_seconds",
                &format!("method=\"{m}\",route=\"{r}\",status=\"{st}\""),
            );
        }
        s
    }
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Gauges from the live state.
/// Each node pool's size by phase, its target (booting and up), forecast and load.
fn pool_gauges(o: &Owner, s: &mut String) {
    let pools = o.pool_gauges();
    if pools.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_pool_nodes Nodes of a pool by phase (booting, up, leaving).\n# TYPE gpunet_pool_nodes gauge"
    );
    for (name, _, _, _, by) in &pools {
        for (phase, n) in ["booting", "up", "leaving"].iter().zip(by) {
            let _ = writeln!(s, "gpunet_pool_nodes{{pool=\"{}\",phase=\"{phase}\"}} {n}", esc(name));
        }
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_pool_target_nodes Nodes a pool is sized to (booting and up).\n# TYPE gpunet_pool_target_nodes gauge"
    );
    for (name, target, _, _, _) in &pools {
        let _ = writeln!(s, "gpunet_pool_target_nodes{{pool=\"{}\"}} {target}", esc(name));
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_pool_forecast_gpus A pool's forecast demand in GPUs (weighted moving average).\n# TYPE \
         gpunet_pool_forecast_gpus gauge"
    );
    for (name, _, f, _, _) in &pools {
        let _ = writeln!(s, "gpunet_pool_forecast_gpus{{pool=\"{}\"}} {f}", esc(name));
    }
    let _ = writeln!(s, "# HELP gpunet_pool_load A pool's forecast over its capacity.\n# TYPE gpunet_pool_load gauge");
    for (name, _, _, l, _) in &pools {
        let _ = writeln!(s, "gpunet_pool_load{{pool=\"{}\"}} {l}", esc(name));
    }
}

pub(crate) fn gauges(o: &Owner) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# HELP gpunet_jobs Jobs by tenant and state.\n# TYPE gpunet_jobs gauge");
    for t in o.tenants.keys() {
        // From the documents' lists by state: O(states) per tenant, not a walk of every job.
        let by = o.docs.by_state(Some(t));
        for (st, n) in crate::owner::STATES.iter().zip(by) {
            let _ = writeln!(s, "gpunet_jobs{{tenant=\"{}\",state=\"{}\"}} {n}", esc(t), st.as_str());
        }
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_queue_length Jobs waiting.\n# TYPE gpunet_queue_length gauge\ngpunet_queue_length {}",
        o.st.queued_count()
    );
    tenant_gauges(o, &mut s);
    node_gauges(o, &mut s);
    pool_gauges(o, &mut s);
    let mut total: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for n in o.st.nodes().filter(|n| !o.is_removed(&n.spec.name)) {
        let model = n.spec.gpu_model().map(|m| m.to_string()).unwrap_or_else(|| "none".into());
        let e = total.entry((model, n.spec.zone().to_string())).or_default();
        let whole = n.spec.gpus.iter().filter(|g| g.mig.is_empty()).count() as u64;
        if n.state == gpunet_core::NodeState::Ready {
            e.0 += whole;
        }
        e.1 += whole - n.free_gpu_mask.count_ones() as u64;
    }
    let _ = writeln!(s, "# HELP gpunet_gpus Schedulable GPUs by model and zone.\n# TYPE gpunet_gpus gauge");
    for ((m, z), (t, _)) in &total {
        let _ = writeln!(s, "gpunet_gpus{{model=\"{}\",zone=\"{}\"}} {t}", esc(m), esc(z));
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_gpus_allocated GPUs held by running jobs by model and zone.\n# TYPE gpunet_gpus_allocated gauge"
    );
    for ((m, z), (_, a)) in &total {
        let _ = writeln!(s, "gpunet_gpus_allocated{{model=\"{}\",zone=\"{}\"}} {a}", esc(m), esc(z));
    }
    // Per GPU: allocated or not, with `fake="true"` on GPUs an agent pretends to have (no NVML behind them).
    let _ = writeln!(
        s,
        "# HELP gpunet_gpu_allocated Whether a whole GPU is held by a running job (1) or free (0).\n\
         # TYPE gpunet_gpu_allocated gauge"
    );
    for n in o.st.nodes().filter(|n| !o.is_removed(&n.spec.name)) {
        let fake = o.nodes.get(&n.spec.name).is_some_and(|d| d.fake);
        for (i, g) in n.spec.gpus.iter().enumerate().filter(|(_, g)| g.mig.is_empty()) {
            let held = u64::from(n.free_gpu_mask & (1u64 << i) == 0);
            let _ = writeln!(
                s,
                "gpunet_gpu_allocated{{node=\"{}\",gpu=\"{i}\",model=\"{}\",fake=\"{fake}\",zone=\"{}\"}} {held}",
                esc(&n.spec.name),
                esc(&g.model.to_string()),
                esc(n.spec.zone())
            );
        }
    }
    // Agents' samples, by node, GPU and the job holding it (`job_id=""` when free; not `job`, which Prometheus
    // gives the scrape job): NVML's on real GPUs; on fake GPUs
    // the agent's fixed synthetic ones (`--fake-gpu-samples`), labelled `fake="true"`, or none.
    type Read = fn(&gpunet_api::agent::GpuSample) -> Option<f64>;
    let families: [(&str, &str, &str, Read); 11] = [
        ("gpunet_gpu_utilization_ratio", "gauge", "GPU utilisation over NVML's last sample period (0 to 1).", |g| {
            g.utilization_pct.map(|p| p / 100.0)
        }),
        ("gpunet_gpu_memory_used_bytes", "gauge", "GPU memory in use.", |g| {
            g.memory_used_mib.map(|m| (m * 1024 * 1024) as f64)
        }),
        ("gpunet_gpu_memory_total_bytes", "gauge", "GPU memory in all.", |g| {
            g.memory_total_mib.map(|m| (m * 1024 * 1024) as f64)
        }),
        ("gpunet_gpu_power_watts", "gauge", "GPU power draw.", |g| g.power_watts),
        ("gpunet_gpu_temperature_celsius", "gauge", "GPU temperature.", |g| g.temperature_c),
        ("gpunet_gpu_nvlink_tx_bytes_total", "counter", "NVLink data sent, all links.", |g| {
            g.nvlink_tx_bytes.map(|b| b as f64)
        }),
        ("gpunet_gpu_nvlink_rx_bytes_total", "counter", "NVLink data received, all links.", |g| {
            g.nvlink_rx_bytes.map(|b| b as f64)
        }),
        (
            "gpunet_gpu_ecc_corrected_errors_total",
            "counter",
            "Corrected ECC errors since the driver loaded (NVML, where ECC is on).",
            |g| g.ecc_corrected.map(|b| b as f64),
        ),
        (
            "gpunet_gpu_ecc_uncorrected_errors_total",
            "counter",
            "Uncorrected ECC errors since the driver loaded (NVML, where ECC is on).",
            |g| g.ecc_uncorrected.map(|b| b as f64),
        ),
        (
            "gpunet_gpu_xid_errors_total",
            "counter",
            "Critical XID errors NVML reported as events since the node's agent started (where the driver delivers them).",
            |g| g.xid_errors.map(|b| b as f64),
        ),
        (
            "gpunet_gpu_xid_last_code",
            "gauge",
            "Code of the latest XID error in NVIDIA's catalogue (0 before the first; 999 unknown).",
            |g| g.xid_last.map(|b| b as f64),
        ),
    ];
    // Each sampled GPU's labels, worked out once for all the families.
    let mut gpus: Vec<(String, &gpunet_api::agent::GpuSample)> = Vec::new();
    for (node, samples) in &o.gpu_samples {
        let Some(id) = o.st.node_id(node) else { continue };
        let Some(n) = o.st.node(id) else { continue };
        let holders = o.gpu_holders(id);
        let fake = o.nodes.get(node).is_some_and(|d| d.fake);
        for g in samples {
            let model = n.spec.gpus.get(g.index as usize).map(|d| d.model.to_string()).unwrap_or_default();
            let job = holders.get(&g.index).map(|j| j.to_string()).unwrap_or_default();
            // `zone` too, so that a dashboard's zone filter reaches the per-GPU series.
            let labels = format!(
                "node=\"{}\",gpu=\"{}\",model=\"{}\",job_id=\"{job}\",fake=\"{fake}\",zone=\"{}\"",
                esc(node),
                g.index,
                esc(&model),
                esc(n.spec.zone())
            );
            gpus.push((labels, g));
        }
    }
    for (name, kind, help, get) in families {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, g) in &gpus {
            if let Some(v) = get(g) {
                let _ = writeln!(s, "{name}{{{labels}}} {v}");
            }
        }
    }
    s
}

/// Per tenant: allocation against quota, pending work, the oldest pending job's age, and GPU-seconds used.
fn tenant_gauges(o: &Owner, s: &mut String) {
    let now = crate::now_ms();
    // GPU-seconds and cost: ended runs (kept by the metrics) plus running jobs so far, as `/v1/usage` bills them.
    let mut used = o.metrics.tenant_used.lock().expect("tenant usage").clone();
    for (_, d, j) in o.listed(Which { states: &[JobState::Running], ..Default::default() }) {
        let e = used.entry(d.tenant.to_string()).or_default();
        for r in o.usage_rows(j, d, now) {
            e.0 += r.gpu_seconds;
            e.1 += r.cost;
        }
    }
    type Row<'a> = (&'a str, u64, Option<(u64, u64)>, (u64, u64, u64), (f64, f64), (usize, usize));
    let rows: Vec<Row<'_>> = o
        .tenants
        .iter()
        .filter_map(|(name, doc)| {
            let id = o.st.tenant_id(name)?;
            let alloc = u64::from(o.st.tenant_usage(id).gpus);
            let q = doc
                .spec
                .quota
                .as_ref()
                .and_then(|q| q.dims[gpunet_core::tenant::DIM_GPUS])
                .map(|l| (l.guarantee, l.limit));
            // Pending jobs, their GPUs and the oldest submission, as the core keeps them per tenant (O(1), not a walk of
            // the queue). A held job, or one waiting for a dependency, is in no queue: it is not starving, and it is
            // counted apart.
            let w = o.st.tenant_waiting(id);
            let p = (w.jobs as u64, w.gpus, w.oldest_submitted.map_or(now, |t| t.0));
            let parked = (o.st.tenant_held(id), o.st.tenant_dependency_waiting(id));
            Some((name.as_str(), alloc, q, p, used.get(name).copied().unwrap_or_default(), parked))
        })
        .collect();
    type Get = fn(&Row<'_>) -> Option<f64>;
    let families: [(&str, &str, &str, Get); 11] = [
        ("gpunet_tenant_gpus_allocated", "gauge", "GPUs held by the tenant's running jobs.", |r| Some(r.1 as f64)),
        ("gpunet_tenant_gpu_guarantee", "gauge", "The tenant's guaranteed GPUs (tenants with a GPU quota).", |r| {
            r.2.map(|q| q.0 as f64)
        }),
        ("gpunet_tenant_gpu_limit", "gauge", "The most GPUs the tenant may hold, borrowing included (with a GPU quota).", |r| {
            r.2.map(|q| q.1 as f64)
        }),
        ("gpunet_tenant_gpus_borrowed", "gauge", "GPUs held beyond the tenant's guarantee (with a GPU quota).", |r| {
            r.2.map(|q| r.1.saturating_sub(q.0) as f64)
        }),
        (
            "gpunet_tenant_pending_jobs",
            "gauge",
            "The tenant's jobs waiting in a queue (pending, preempted or restarting; not held, not waiting for a dependency).",
            |r| Some(r.3 .0 as f64),
        ),
        ("gpunet_tenant_held_jobs", "gauge", "The tenant's held jobs (in no queue until released).", |r| {
            Some(r.5 .0 as f64)
        }),
        ("gpunet_tenant_dependency_waiting_jobs", "gauge", "The tenant's jobs waiting for their dependencies.", |r| {
            Some(r.5 .1 as f64)
        }),
        ("gpunet_tenant_pending_gpus", "gauge", "GPUs the tenant's waiting jobs ask for (each at its minimum size).", |r| Some(r.3 .1 as f64)),
        (
            "gpunet_tenant_oldest_pending_seconds",
            "gauge",
            "Age of the tenant's oldest waiting job since its submission (0 when none waits).",
            |r| Some(if r.3 .0 == 0 { 0.0 } else { crate::now_ms().saturating_sub(r.3 .2) as f64 / 1000.0 }),
        ),
        (
            "gpunet_tenant_gpu_seconds_total",
            "counter",
            "GPU-seconds used: every run in the ledger, plus running jobs so far (per started second, as the ledger bills).",
            |r| Some(r.4 .0),
        ),
        (
            "gpunet_tenant_cost_total",
            "counter",
            "Cost of what the tenant used, in the price catalogue's currency: every run in the ledger, plus running jobs so far.",
            |r| Some(r.4 .1),
        ),
    ];
    for (name, kind, help, get) in families {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for r in &rows {
            if let Some(v) = get(r) {
                let _ = writeln!(s, "{name}{{tenant=\"{}\"}} {v}", esc(r.0));
            }
        }
    }
}

/// Per node: its state (one series per state, 1 for the current one) and how long ago its agent last synced.
fn node_gauges(o: &Owner, s: &mut String) {
    use gpunet_core::NodeState;
    let _ = writeln!(
        s,
        "# HELP gpunet_node_state The node's state (1 for the current one).\n# TYPE gpunet_node_state gauge"
    );
    for n in o.st.nodes().filter(|n| !o.is_removed(&n.spec.name)) {
        for st in [NodeState::Ready, NodeState::Cordoned, NodeState::Draining, NodeState::Lost] {
            let v = u8::from(n.state == st);
            let _ = writeln!(s, "gpunet_node_state{{node=\"{}\",state=\"{st}\"}} {v}", esc(&n.spec.name));
        }
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_node_sync_age_seconds Time since the node's agent last synced (nodes with an agent that is not \
         lost).\n# TYPE gpunet_node_sync_age_seconds gauge"
    );
    let mut ages: Vec<(&String, f64)> = o.last_seen.iter().map(|(n, t)| (n, t.elapsed().as_secs_f64())).collect();
    ages.sort_by(|a, b| a.0.cmp(b.0));
    for (n, age) in ages {
        let _ = writeln!(s, "gpunet_node_sync_age_seconds{{node=\"{}\"}} {age}", esc(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(h: &Histogram) -> (u64, f64) {
        let g = h.inner.lock().unwrap();
        (g.2, g.1)
    }

    #[test]
    fn an_eviction_is_timed_once_and_a_life_counts_only_time_not_running() {
        let m = ServerMetrics::new();
        m.stop_asked(7);
        // First attempt: evicted after running 30 s; the job goes back to the queue.
        m.attempt_ended(7, "ta", (60.0, 1.5), None);
        assert_eq!(count(&m.eviction_seconds).0, 1);
        assert_eq!(count(&m.not_running_seconds).0, 0);
        // Second attempt runs 50 s and ends the job 100 s after its submission, its attempts having held 80 s: 20 s
        // not running.
        m.attempt_ended(7, "ta", (100.0, 2.5), Some(Life { submitted: 1_000, ended: 101_000, held: 80_000 }));
        assert_eq!(count(&m.eviction_seconds).0, 1, "no stop was asked of the second attempt");
        assert_eq!(count(&m.not_running_seconds), (1, 20.0));
        assert_eq!(m.tenant_used.lock().unwrap()["ta"], (160.0, 4.0));
        assert!(m.jobs.lock().unwrap().is_empty(), "an ended job's clock is dropped");
        // A job cancelled while queued: its whole life was waiting.
        m.job_ended(Life { submitted: 0, ended: 5_000, held: 0 });
        assert_eq!(count(&m.not_running_seconds), (2, 25.0));
    }

    #[test]
    fn histograms_render_cumulative_buckets() {
        let h = Histogram::new(&[1.0, 10.0]);
        h.observe(0.5);
        h.observe(5.0);
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "");
        assert!(
            s.contains("x_seconds_bucket{le=\"1\"} 1\nx_seconds_bucket{le=\"10\"} 2\nx_seconds_bucket{le=\"+Inf\"} 2"),
            "{s}"
        );
    }
}
