//! Prometheus metrics in the text exposition format: counters and histograms updated in place, and gauges computed
//! from the owner's state when `/metrics` is read.

use crate::owner::Owner;
use gpunet_core::JobState;
use std::collections::BTreeMap;
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

/// Metrics the server updates as it works.
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    pub(crate) pass_seconds: Histogram,
    pub(crate) pending_seconds: Histogram,
    pub(crate) preemptions: AtomicU64,
    pub(crate) restarts: AtomicU64,
    pub(crate) submitted: AtomicU64,
    /// Writes the store refused (the control plane is read-only from the first one until restarted).
    pub(crate) store_write_failures: AtomicU64,
    /// Why the store cannot be written, once it refused a write (or failed the start-up probe).
    pub(crate) store_refused: Mutex<Option<String>>,
    pub(crate) api: Mutex<BTreeMap<(String, String, u16), Histogram>>,
}

impl ServerMetrics {
    pub(crate) fn new() -> ServerMetrics {
        ServerMetrics {
            pass_seconds: Histogram::new(PASS),
            pending_seconds: Histogram::new(PENDING),
            preemptions: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            store_write_failures: AtomicU64::new(0),
            store_refused: Mutex::new(None),
            api: Mutex::new(BTreeMap::new()),
        }
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
            "# HELP gpunet_job_pending_duration_seconds Time from submission to start of jobs that started."
        );
        let _ = writeln!(s, "# TYPE gpunet_job_pending_duration_seconds histogram");
        self.pending_seconds.render(&mut s, "gpunet_job_pending_duration_seconds", "");
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
pub(crate) fn gauges(o: &Owner) -> String {
    let mut s = String::new();
    let mut by: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    for d in o.docs.values() {
        let state = o.st.job(d.job.id).map_or(d.job.state, |j| j.state);
        *by.entry((d.tenant.clone(), state.as_str())).or_default() += 1;
    }
    let _ = writeln!(s, "# HELP gpunet_jobs Jobs by tenant and state.\n# TYPE gpunet_jobs gauge");
    for t in o.tenants.keys() {
        for st in [
            JobState::Pending,
            JobState::Running,
            JobState::Preempted,
            JobState::Restarting,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
        ] {
            let n = by.get(&(t.clone(), st.as_str())).copied().unwrap_or(0);
            let _ = writeln!(s, "gpunet_jobs{{tenant=\"{}\",state=\"{}\"}} {n}", esc(t), st.as_str());
        }
    }
    let _ = writeln!(
        s,
        "# HELP gpunet_queue_length Jobs waiting.\n# TYPE gpunet_queue_length gauge\ngpunet_queue_length {}",
        o.st.queued_count()
    );
    let mut total: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for n in o.st.nodes() {
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
    for n in o.st.nodes() {
        let fake = o.nodes.get(&n.spec.name).is_some_and(|d| d.fake);
        for (i, g) in n.spec.gpus.iter().enumerate().filter(|(_, g)| g.mig.is_empty()) {
            let held = u64::from(n.free_gpu_mask & (1u64 << i) == 0);
            let _ = writeln!(
                s,
                "gpunet_gpu_allocated{{node=\"{}\",gpu=\"{i}\",model=\"{}\",fake=\"{fake}\"}} {held}",
                esc(&n.spec.name),
                esc(&g.model.to_string())
            );
        }
    }
    // NVML samples of real GPUs, by node, GPU and the job holding it (`job=""` when free). Fake GPUs have none.
    type Read = fn(&gpunet_api::agent::GpuSample) -> Option<f64>;
    let families: [(&str, &str, &str, Read); 7] = [
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
    ];
    // Each sampled GPU's labels, worked out once for all the families.
    let mut gpus: Vec<(String, &gpunet_api::agent::GpuSample)> = Vec::new();
    for (node, samples) in &o.gpu_samples {
        let Some(id) = o.st.node_id(node) else { continue };
        let Some(n) = o.st.node(id) else { continue };
        let holders = o.gpu_holders(id);
        for g in samples {
            let model = n.spec.gpus.get(g.index as usize).map(|d| d.model.to_string()).unwrap_or_default();
            let job = holders.get(&g.index).map(|j| j.to_string()).unwrap_or_default();
            let labels = format!("node=\"{}\",gpu=\"{}\",model=\"{}\",job=\"{job}\"", esc(node), g.index, esc(&model));
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
