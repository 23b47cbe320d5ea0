//! `gpunet tenants | quota | nodes`: tenants with their quotas, and the nodes.

use super::output::{emit, watching};
use crate::client::{self, Client, Conn};
use anyhow::{bail, Result};
use gpunet_api::types::*;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(crate) struct TenantsArgs {
    /// Create this tenant (admin); prints its token.
    #[arg(long)]
    pub(crate) create: Option<String>,
    /// Weight of the tenant created.
    #[arg(long)]
    pub(crate) weight: Option<f64>,
    /// Cohort of the tenant created.
    #[arg(long)]
    pub(crate) cohort: Option<String>,
    /// Whether the created tenant's jobs may run on spot nodes when they do not say: never (the default), allowed
    /// or preferred.
    #[arg(long, value_parser = |s: &str| s.parse::<gpunet_api::spec::SpotUse>())]
    pub(crate) spot: Option<gpunet_api::spec::SpotUse>,
    /// Issue another token for this tenant (admin).
    #[arg(long)]
    pub(crate) token_for: Option<String>,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet tenants`.
pub(crate) async fn tenants(a: &TenantsArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    if let Some(name) = &a.create {
        let req =
            TenantRequest { name: name.clone(), weight: a.weight, cohort: a.cohort.clone(), quota: None, spot: a.spot };
        let t: TokenIssued = c.post("/v1/tenants", Some(serde_json::to_string(&req)?), "application/json").await?;
        return emit(c.output, &t, |t, _| {
            format!("tenant {} created; its token (shown once): {}\n", t.tenant, t.token)
        });
    }
    if let Some(name) = &a.token_for {
        let t: TokenIssued = c.post(&format!("/v1/tenants/{name}/tokens"), None, "").await?;
        return emit(c.output, &t, |t, _| format!("new token for {} (shown once): {}\n", t.tenant, t.token));
    }
    let ts: Vec<TenantView> = c.get("/v1/tenants").await?;
    emit(c.output, &ts, |t, wide| tenants_table(t, wide))
}

/// The tenants table: GPU, CPU and memory guarantee and limit (a limit defaults to its guarantee; `-` unlimited).
pub(crate) fn tenants_table(ts: &[TenantView], wide: bool) -> String {
    let mut head = vec![
        "TENANT",
        "WEIGHT",
        "GPUS USED",
        "GUARANTEE",
        "LIMIT",
        "CPU GUAR.",
        "CPU LIMIT",
        "MEM GUAR.",
        "MEM LIMIT",
        "QUEUED",
        "RUNNING",
        "COHORT",
    ];
    if wide {
        head.extend(["CPU USED", "MEM USED", "PER MODEL", "FAIR-SHARE GPU-H"]);
    }
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    client::table(
        &head,
        ts.iter()
            .map(|t| {
                let q = t.quota.clone().unwrap_or_default();
                let mut row = vec![
                    t.name.clone(),
                    format!("{}", t.weight),
                    t.gpus_used.to_string(),
                    or_dash(q.guarantee_gpus.map(|g| g.to_string())),
                    or_dash(q.limit_gpus.or(q.guarantee_gpus).map(|g| g.to_string())),
                    or_dash(q.guarantee_cpu.as_deref().map(cpu_text)),
                    or_dash(q.limit_cpu.as_deref().or(q.guarantee_cpu.as_deref()).map(cpu_text)),
                    or_dash(q.guarantee_memory.as_deref().map(memory_text)),
                    or_dash(q.limit_memory.as_deref().or(q.guarantee_memory.as_deref()).map(memory_text)),
                    t.queued.to_string(),
                    t.running.to_string(),
                    t.cohort.clone().unwrap_or_default(),
                ];
                if wide {
                    row.extend([
                        cpu_text(&format!("{}m", t.cpu_milli_used)),
                        memory_text(&format!("{}Mi", t.memory_mib_used)),
                        q.per_model_gpus.iter().map(|(m, n)| format!("{m}={n}")).collect::<Vec<_>>().join(","),
                        format!("{:.2}", t.fair_share_usage_gpu_hours),
                    ]);
                }
                row
            })
            .collect(),
    )
}

#[derive(Debug, clap::Args)]
pub(crate) struct QuotaArgs {
    /// Tenant. Without flags, its quota is shown.
    pub(crate) tenant: String,
    /// A Kubernetes v1 ResourceQuota manifest (its namespace is the tenant; any name): replaces the whole quota.
    #[arg(short = 'f', long, conflicts_with_all = ["gpus", "limit", "cpu", "cpu_limit", "memory", "memory_limit", "model", "clear"])]
    pub(crate) file: Option<PathBuf>,
    /// Guaranteed GPUs.
    #[arg(long)]
    pub(crate) gpus: Option<u64>,
    /// GPU limit with borrowing (default: the guarantee).
    #[arg(long)]
    pub(crate) limit: Option<u64>,
    /// Guaranteed CPU: cores (`64`) or millicores (`500m`).
    #[arg(long)]
    pub(crate) cpu: Option<String>,
    /// CPU limit (default: the CPU guarantee).
    #[arg(long)]
    pub(crate) cpu_limit: Option<String>,
    /// Guaranteed memory: `256Gi`.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// Memory limit (default: the memory guarantee).
    #[arg(long)]
    pub(crate) memory_limit: Option<String>,
    /// Guaranteed GPUs of one model, repeatable: `--model A100-80GB=8`; `--model A100-80GB=` removes it.
    #[arg(long)]
    pub(crate) model: Vec<String>,
    /// Remove the quota: the tenant is no longer constrained (nor guaranteed anything).
    #[arg(long, conflicts_with_all = ["gpus", "limit", "cpu", "cpu_limit", "memory", "memory_limit", "model"])]
    pub(crate) clear: bool,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

impl QuotaArgs {
    fn sets_fields(&self) -> bool {
        self.gpus.is_some()
            || self.limit.is_some()
            || self.cpu.is_some()
            || self.cpu_limit.is_some()
            || self.memory.is_some()
            || self.memory_limit.is_some()
            || !self.model.is_empty()
    }

    /// `q` with the fields the flags set; the others as they were.
    fn merged(&self, mut q: QuotaRequest) -> Result<QuotaRequest> {
        if let Some(g) = self.gpus {
            q.guarantee_gpus = Some(g);
        }
        if let Some(l) = self.limit {
            q.limit_gpus = Some(l);
        }
        if let Some(c) = &self.cpu {
            q.guarantee_cpu = Some(c.clone());
        }
        if let Some(c) = &self.cpu_limit {
            q.limit_cpu = Some(c.clone());
        }
        if let Some(m) = &self.memory {
            q.guarantee_memory = Some(m.clone());
        }
        if let Some(m) = &self.memory_limit {
            q.limit_memory = Some(m.clone());
        }
        for m in &self.model {
            let Some((model, n)) = m.split_once('=') else {
                bail!("invalid --model {m:?}: allowed is MODEL=GPUS, e.g. A100-80GB=8 (MODEL= removes it)");
            };
            if n.is_empty() {
                q.per_model_gpus.remove(model);
            } else {
                let n: u64 = n
                    .parse()
                    .map_err(|_| anyhow::anyhow!("invalid --model {m:?}: allowed is a whole number of GPUs"))?;
                q.per_model_gpus.insert(model.to_string(), n);
            }
        }
        Ok(q)
    }
}

/// One tenant as the admin lists it.
async fn tenant(c: &Client, name: &str) -> Result<TenantView> {
    let ts: Vec<TenantView> = c.get("/v1/tenants").await?;
    ts.into_iter().find(|t| t.name == name).ok_or_else(|| anyhow::anyhow!("no tenant {name:?} (404)"))
}

/// `gpunet quota`: shows, sets (keeping the fields not named), replaces from a manifest, or clears.
pub(crate) async fn quota(a: &QuotaArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    let body = if let Some(f) = &a.file {
        crate::read_file(f)?
    } else if a.clear {
        "null".to_string()
    } else if a.sets_fields() {
        let current = tenant(&c, &a.tenant).await?.quota.unwrap_or_default();
        serde_json::to_string(&a.merged(current)?)?
    } else {
        let t = tenant(&c, &a.tenant).await?;
        return emit(c.output, &t, |t, wide| tenants_table(std::slice::from_ref(t), wide));
    };
    let t: TenantView = c.put(&format!("/v1/tenants/{}/quota", a.tenant), body).await?;
    emit(c.output, &t, |t, wide| tenants_table(std::slice::from_ref(t), wide))
}

#[derive(Debug, clap::Args)]
pub(crate) struct NodesArgs {
    /// Print again every 2 seconds until Ctrl-C.
    #[arg(short = 'w', long)]
    pub(crate) watch: bool,
    #[command(flatten)]
    pub(crate) conn: Conn,
}

/// `gpunet nodes`.
pub(crate) async fn nodes(a: &NodesArgs) -> Result<()> {
    let c = Client::new(&a.conn)?;
    watching(a.watch, || async {
        let ns: Vec<NodeView> = c.get("/v1/nodes").await?;
        emit(c.output, &ns, |n, wide| nodes_table(n, wide))
    })
    .await
}

/// The nodes table; `wide` adds the other labels and the jobs.
pub(crate) fn nodes_table(nodes: &[NodeView], wide: bool) -> String {
    let mut head = vec!["NAME", "STATE", "MODEL", "GPUS", "FREE", "ZONE", "LIFECYCLE", "PRICE/GPU-H", "JOBS", "FAKE"];
    if wide {
        head.extend(["LABELS", "JOB IDS"]);
    }
    client::table(
        &head,
        nodes
            .iter()
            .map(|n| {
                let mut row = vec![
                    n.name.clone(),
                    n.state.clone(),
                    n.gpu_model.clone().unwrap_or_else(|| "-".into()),
                    n.gpus.to_string(),
                    n.free_gpus.to_string(),
                    n.labels.get("zone").cloned().unwrap_or_default(),
                    n.labels.get("lifecycle").cloned().unwrap_or_default(),
                    format!("{:.2}", n.price_per_gpu_hour),
                    n.jobs.len().to_string(),
                    if n.fake { "yes".into() } else { "no".into() },
                ];
                if wide {
                    row.push(
                        n.labels
                            .iter()
                            .filter(|(k, _)| !matches!(k.as_str(), "zone" | "lifecycle"))
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(","),
                    );
                    row.push(n.jobs.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
                }
                row
            })
            .collect(),
    )
}

/// CPU as a person writes it: whole cores as `32`, else millicores (`1500m`); text it cannot read is shown as is.
fn cpu_text(s: &str) -> String {
    match gpunet_api::units::parse_cpu("cpu", s) {
        Ok(m) if m.0 % 1000 == 0 => (m.0 / 1000).to_string(),
        Ok(m) => format!("{}m", m.0),
        Err(_) => s.to_string(),
    }
}

/// Memory in the largest binary unit that divides it (`128Gi`, `1536Mi`); text it cannot read is shown as is.
fn memory_text(s: &str) -> String {
    match gpunet_api::units::parse_memory("memory", s) {
        Ok(m) if m.0 > 0 && m.0 % (1024 * 1024) == 0 => format!("{}Ti", m.0 / (1024 * 1024)),
        Ok(m) if m.0 > 0 && m.0 % 1024 == 0 => format!("{}Gi", m.0 / 1024),
        Ok(m) => format!("{}Mi", m.0),
        Err(_) => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotas_are_shown_in_the_units_people_write() {
        assert_eq!(super::cpu_text("32000m"), "32");
        assert_eq!(super::cpu_text("1500m"), "1500m");
        assert_eq!(super::cpu_text("0m"), "0");
        assert_eq!(super::memory_text("131072Mi"), "128Gi");
        assert_eq!(super::memory_text("1536Mi"), "1536Mi");
        assert_eq!(super::memory_text("2097152Mi"), "2Ti");
        assert_eq!(super::memory_text("0Mi"), "0Mi");
        assert_eq!(super::memory_text("??"), "??");
    }
}
