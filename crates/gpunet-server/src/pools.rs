//! Node pools: groups of like nodes that the server grows and shrinks itself (the owner's decisions are in
//! `owner/pools.rs`), and the providers that create and delete their machines.
//!
//! A pool is configured in the server's configuration file (`[[pools]]`, see [`PoolConfig`]) or with
//! `gpunet up --spot-pool MIN..MAXxGPUSxMODEL`. Its provider is either
//! - `exec`: two programs, as Slurm's `ResumeProgram` and `SuspendProgram`: `resume_program POOL NODE…` creates the
//!   machines and starts an agent on each, named `NODE`, that joins this server; `suspend_program POOL NODE…` deletes
//!   them. Each runs with an empty environment but for `PATH` and the `GPUNET_*` variables of [`hook_env`], for at
//!   most `hook_timeout_s` (then it is killed). Exit 0 is success; anything else (or the timeout) is a failure that
//!   the server reports as an event and retries with backoff. Examples for a cloud CLI are in `deploy/pools/`.
//! - `local`: the server starts `gpunet agent --fake-gpus …` processes on its own machine (one per node, each with
//!   its own data directory under the server's), so that elasticity can be tried and tested with no cloud account.
//!   They die with the server.
//!
//! A node that does not register within `boot_timeout_s` of its resume is deleted (the suspend program) and the
//! pool waits, doubling the wait after each failure (from 5 s to at most 5 minutes), before it asks again.

use gpunet_core::autoscale::AutoscaleConfig;
use gpunet_core::{GpuModel, Lifecycle, MiB, MilliCpu, NodeSpec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Label every pool node carries: its pool's name.
pub const POOL_LABEL: &str = "gpunet.io/pool";

/// A pool's provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// `gpunet agent --fake-gpus` processes on this machine.
    #[default]
    Local,
    /// The pool's `resume_program` and `suspend_program`.
    Exec,
}

/// Which nodes the autoscaler may take away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ScaleIn {
    /// Only nodes without tasks.
    #[default]
    Idle,
    /// Also nodes whose jobs are all preemptible and checkpoint to a tier: they are drained first (the jobs resume
    /// elsewhere from their checkpoints).
    Checkpointed,
}

/// One pool, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Name (a node name's prefix: nodes are `NAME-00001`, …).
    pub name: String,
    /// `local` or `exec`.
    #[serde(default)]
    pub provider: ProviderKind,
    /// With `exec`: creates machines (`PROGRAM POOL NODE…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_program: Option<PathBuf>,
    /// With `exec`: deletes machines (`PROGRAM POOL NODE…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_program: Option<PathBuf>,
    /// Longest a hook may run, seconds (default 300).
    #[serde(default = "default_hook_timeout")]
    pub hook_timeout_s: f64,
    /// GPU model of every node (`A10`, `A100-80GB`, …).
    pub gpu_model: String,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// CPU cores per node (default 4 per GPU): with the memory, what the autoscaler counts a queued job against. A
    /// registering node smaller than this shrinks the pool's shape to its own (an event says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores_per_node: Option<u32>,
    /// Memory per node, GiB (default 16 per GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_gib_per_node: Option<u32>,
    /// Zone label of the nodes (default `default`).
    #[serde(default = "default_zone")]
    pub zone: String,
    /// `spot` (the default: the nodes are tainted `lifecycle=spot`, so only jobs that allow spot go there) or
    /// `on-demand`.
    #[serde(default = "default_lifecycle")]
    pub lifecycle: Lifecycle,
    /// Fewest nodes.
    #[serde(default)]
    pub min_nodes: u32,
    /// Most nodes.
    pub max_nodes: u32,
    /// A node must register within this long of its resume, seconds (default 300).
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_s: f64,
    /// GPU price per hour; absent: the price catalogue's for the model and lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour: Option<f64>,
    /// More labels of the nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Seconds between demand samples (and decisions; default 10).
    #[serde(default = "default_interval")]
    pub interval_s: f64,
    /// Samples in the forecast's window (default 5).
    #[serde(default = "default_window")]
    pub window: usize,
    /// Grow above this load (forecast ÷ capacity; default 0.85).
    #[serde(default = "default_high")]
    pub high: f64,
    /// Shrink below this load (default 0.4).
    #[serde(default = "default_low")]
    pub low: f64,
    /// The load an action aims at (default 0.7).
    #[serde(default = "default_target")]
    pub target: f64,
    /// Quiet time after an action, seconds (default 300).
    #[serde(default = "default_cooldown")]
    pub cooldown_s: f64,
    /// Most nodes added or removed at once (default 10).
    #[serde(default = "default_max_step")]
    pub max_step: u32,
    /// `idle` (the default) or `checkpointed`.
    #[serde(default)]
    pub scale_in: ScaleIn,
}

fn default_hook_timeout() -> f64 {
    300.0
}
fn default_zone() -> String {
    "default".into()
}
fn default_lifecycle() -> Lifecycle {
    Lifecycle::Spot
}
fn default_boot_timeout() -> f64 {
    300.0
}
fn default_interval() -> f64 {
    10.0
}
fn default_window() -> usize {
    5
}
fn default_high() -> f64 {
    0.85
}
fn default_low() -> f64 {
    0.4
}
fn default_target() -> f64 {
    0.7
}
fn default_cooldown() -> f64 {
    300.0
}
fn default_max_step() -> u32 {
    10
}

/// A pool configuration that cannot be used; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("pools.{pool}.{field}: {problem}")]
pub struct PoolError {
    /// The pool's name (or its index).
    pub pool: String,
    /// The field.
    pub field: &'static str,
    /// What is wrong and what is allowed.
    pub problem: String,
}

impl PoolConfig {
    /// A pool of `min..=max` nodes of `gpus` GPUs of `model`, local, spot, with the defaults.
    pub fn local(name: &str, model: &str, gpus: u32, min: u32, max: u32) -> PoolConfig {
        PoolConfig {
            name: name.into(),
            provider: ProviderKind::Local,
            resume_program: None,
            suspend_program: None,
            hook_timeout_s: default_hook_timeout(),
            gpu_model: model.into(),
            gpus_per_node: gpus,
            cpu_cores_per_node: None,
            mem_gib_per_node: None,
            zone: default_zone(),
            lifecycle: Lifecycle::Spot,
            min_nodes: min,
            max_nodes: max,
            boot_timeout_s: default_boot_timeout(),
            price_per_gpu_hour: None,
            labels: BTreeMap::new(),
            interval_s: default_interval(),
            window: default_window(),
            high: default_high(),
            low: default_low(),
            target: default_target(),
            cooldown_s: default_cooldown(),
            max_step: default_max_step(),
            scale_in: ScaleIn::Idle,
        }
    }

    /// Parses `MIN..MAXxGPUSxMODEL` (`0..4x8xA10`), the form of `gpunet up --spot-pool`.
    pub fn parse_short(name: &str, s: &str) -> Result<PoolConfig, PoolError> {
        let bad = |p: &str| PoolError { pool: name.into(), field: "spec", problem: format!("{s:?}: {p}") };
        let (range, rest) = s.split_once('x').ok_or_else(|| bad("expected MIN..MAXxGPUSxMODEL, e.g. 0..4x8xA10"))?;
        let (gpus, model) = rest.split_once('x').ok_or_else(|| bad("expected MIN..MAXxGPUSxMODEL, e.g. 0..4x8xA10"))?;
        let (min, max) = range.split_once("..").ok_or_else(|| bad("the node count is MIN..MAX, e.g. 0..4"))?;
        let num =
            |v: &str, what: &str| v.trim().parse::<u32>().map_err(|_| bad(&format!("{what} {v:?} is not a number")));
        let p = PoolConfig::local(name, model, num(gpus, "GPUs per node")?, num(min, "MIN")?, num(max, "MAX")?);
        p.validate()?;
        Ok(p)
    }

    /// The GPU model.
    pub fn model(&self) -> Result<GpuModel, PoolError> {
        self.gpu_model.parse::<GpuModel>().map_err(|e| PoolError {
            pool: self.name.clone(),
            field: "gpu_model",
            problem: format!("{:?}: {e}", self.gpu_model),
        })
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), PoolError> {
        let err = |field: &'static str, problem: String| PoolError { pool: self.name.clone(), field, problem };
        let n = &self.name;
        if n.is_empty()
            || n.len() > 40
            || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            || n.starts_with('-')
        {
            return Err(err("name", format!("{n:?}: 1 to 40 letters, digits or '-', not starting with '-'")));
        }
        self.model()?;
        if self.gpus_per_node == 0 || self.gpus_per_node > 64 {
            return Err(err("gpus_per_node", format!("{}: 1 to 64", self.gpus_per_node)));
        }
        if self.max_nodes == 0 || self.max_nodes > 10_000 || self.min_nodes > self.max_nodes {
            return Err(err(
                "max_nodes",
                format!("{}..{}: 1 to 10000, at least min_nodes", self.min_nodes, self.max_nodes),
            ));
        }
        if self.lifecycle == Lifecycle::Reserved {
            return Err(err("lifecycle", "reserved: a pool is spot or on-demand".into()));
        }
        for (field, v, lo, hi) in [
            ("hook_timeout_s", self.hook_timeout_s, 0.1, 86_400.0),
            ("boot_timeout_s", self.boot_timeout_s, 0.1, 86_400.0),
            ("interval_s", self.interval_s, 0.05, 3_600.0),
            ("cooldown_s", self.cooldown_s, 0.0, 86_400.0),
            ("high", self.high, 0.0, 100.0),
            ("low", self.low, 0.0, 100.0),
            ("target", self.target, 0.01, 100.0),
        ] {
            if !v.is_finite() || v < lo || v > hi {
                return Err(err(field, format!("{v}: a number from {lo} to {hi}")));
            }
        }
        if self.low >= self.high {
            return Err(err("low", format!("{}: below high ({})", self.low, self.high)));
        }
        if !(self.low..=self.high).contains(&self.target) {
            return Err(err("target", format!("{}: from low ({}) to high ({})", self.target, self.low, self.high)));
        }
        let word = |v: &str| {
            !v.is_empty() && v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        };
        if !word(&self.zone) {
            return Err(err("zone", format!("{:?}: 1 to 63 letters, digits, '-', '_', '.' or '/'", self.zone)));
        }
        if self.window == 0 || self.window > 1000 {
            return Err(err("window", format!("{}: 1 to 1000 samples", self.window)));
        }
        if self.max_step == 0 {
            return Err(err("max_step", "0: at least 1".into()));
        }
        if self.cpu_cores_per_node.is_some_and(|c| c == 0 || c > 100_000) {
            return Err(err("cpu_cores_per_node", format!("{:?}: 1 to 100000", self.cpu_cores_per_node)));
        }
        if self.mem_gib_per_node.is_some_and(|m| m == 0 || m > 1_000_000) {
            return Err(err("mem_gib_per_node", format!("{:?}: 1 to 1000000", self.mem_gib_per_node)));
        }
        if let Some(p) = self.price_per_gpu_hour {
            gpunet_core::pricing::check_price("price_per_gpu_hour", p)
                .map_err(|e| err("price_per_gpu_hour", e.to_string()))?;
        }
        for (k, v) in &self.labels {
            if matches!(k.as_str(), "zone" | "lifecycle" | "address" | POOL_LABEL) {
                return Err(err("labels", format!("{k:?} is set by the pool itself")));
            }
            if !word(k) || !word(v) {
                return Err(err(
                    "labels",
                    format!("{k}={v}: keys and values of 1 to 63 letters, digits, '-', '_', '.', '/'"),
                ));
            }
        }
        match self.provider {
            ProviderKind::Exec => {
                for (field, p) in [("resume_program", &self.resume_program), ("suspend_program", &self.suspend_program)]
                {
                    match p {
                        Some(p) if p.is_absolute() => {}
                        Some(p) => return Err(err(field, format!("{}: an absolute path", p.display()))),
                        None => return Err(err(field, "missing: an exec provider needs both programs".into())),
                    }
                }
            }
            ProviderKind::Local => {
                if self.resume_program.is_some() || self.suspend_program.is_some() {
                    return Err(err("provider", "local: the programs are for provider = \"exec\"".into()));
                }
            }
        }
        Ok(())
    }

    /// The autoscaler's settings.
    pub fn autoscale(&self) -> AutoscaleConfig {
        AutoscaleConfig {
            window: self.window,
            high: self.high,
            low: self.low,
            target: self.target,
            min_nodes: self.min_nodes,
            max_nodes: self.max_nodes,
            max_step: self.max_step,
            cooldown: gpunet_core::Dur((self.cooldown_s * 1000.0) as u64),
        }
    }

    /// The labels every node of the pool has (the server sets them at registration, whatever the agent says).
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        let mut l = self.labels.clone();
        l.insert("zone".into(), self.zone.clone());
        l.insert("lifecycle".into(), self.lifecycle.as_str().into());
        l.insert(POOL_LABEL.into(), self.name.clone());
        l
    }

    /// What a node of the pool looks like (a fake agent's CPU and memory: 4 cores and 16 GiB per GPU), for the
    /// demand it sees and for refusing at submit only jobs that no pool node could ever hold either.
    pub fn template(&self) -> NodeSpec {
        let model = self.model().unwrap_or(GpuModel::T4);
        let g = self.gpus_per_node as u64;
        let mut n = NodeSpec::with_gpus(
            format!("{}-template", self.name),
            model,
            g as usize,
            MilliCpu::cores(self.cpu_cores_per_node.map_or(4 * g, u64::from)),
            MiB::gib(self.mem_gib_per_node.map_or(16 * g, u64::from)),
        );
        n.labels.extend(self.node_labels());
        if self.lifecycle == Lifecycle::Spot {
            n = n.taint("lifecycle", "spot");
        }
        n
    }

    /// The name of the pool's `i`-th node.
    pub fn node_name(&self, i: u64) -> String {
        format!("{}-{i:05}", self.name)
    }
}

/// Where pool agents find the server, for the providers.
#[derive(Debug, Clone, Default)]
pub struct AgentLink {
    /// The URL agents use; absent: the server's own address (loopback when it listens on every address), set when
    /// it is bound.
    pub server: Option<String>,
    /// The CA certificate agents verify the server with.
    pub ca: Option<PathBuf>,
    /// The `gpunet` executable the local provider runs (default: this one).
    pub exe: Option<PathBuf>,
    /// The labels' address of local agents (default 127.0.0.1).
    pub address: Option<String>,
    /// Kills what a deleted local node's agent left running (its "machine" is switched off).
    pub reap: Option<Reaper>,
}

/// What kills the tasks a local node's agent left running, given the node's name and the agent's data directory
/// (the binary passes `gpunet_agent::kill_left_tasks`; it blocks). Returns how many it killed.
#[derive(Clone)]
pub struct Reaper(pub Arc<ReapFn>);

/// See [`Reaper`].
pub type ReapFn = dyn Fn(&str, &std::path::Path) -> usize + Send + Sync;

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reaper")
    }
}

/// The environment of a hook: who the agents join and what the pool's nodes are.
pub fn hook_env(pool: &PoolConfig, link: &AgentLink, server: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("GPUNET_SERVER".to_string(), server.to_string()),
        ("GPUNET_POOL".into(), pool.name.clone()),
        ("GPUNET_POOL_ZONE".into(), pool.zone.clone()),
        ("GPUNET_POOL_LIFECYCLE".into(), pool.lifecycle.as_str().into()),
        ("GPUNET_POOL_GPU_MODEL".into(), pool.gpu_model.clone()),
        ("GPUNET_POOL_GPUS".into(), pool.gpus_per_node.to_string()),
        (
            "GPUNET_POOL_LABELS".into(),
            pool.node_labels().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
        ),
    ];
    if let Some(ca) = &link.ca {
        env.push(("GPUNET_CA".into(), ca.display().to_string()));
    }
    env
}

/// What a provider is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookOp {
    /// Create the machines.
    Resume,
    /// Delete them.
    Suspend,
}

impl HookOp {
    /// `resume` or `suspend`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookOp::Resume => "resume",
            HookOp::Suspend => "suspend",
        }
    }
}

/// Runs the providers' work off the owner: hooks are processes that may take minutes.
#[derive(Debug, Clone)]
pub struct Providers {
    link: AgentLink,
    /// The server's own URL, once bound.
    url: Arc<OnceLock<String>>,
    /// Where local agents keep their data (`DATA_DIR/pools`).
    dir: PathBuf,
    /// The local provider's agents, by node name.
    local: Arc<Mutex<HashMap<String, (String, tokio::process::Child)>>>,
    /// The server is stopping: no hook starts any more (and no pool acts).
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// The process groups of the exec hooks under way (a stopping server waits for them, then kills them).
    hooks: Arc<Mutex<std::collections::HashSet<i32>>>,
    /// The runtime hooks run on: the server's, which outlives the owner's (a hook's task dropped with the owner's
    /// runtime would leave its processes behind unwaited).
    rt: Option<tokio::runtime::Handle>,
}

/// Each node's own registration token, for the nodes a resume hook creates: the only token that registers that node
/// (the join token cannot), so that nobody but the machine the pool created takes its name.
pub type NodeTokens = BTreeMap<String, String>;

impl Providers {
    /// Providers for a server whose data directory is `data_dir`.
    pub fn new(link: AgentLink, data_dir: &std::path::Path) -> Providers {
        Providers {
            link,
            url: Arc::new(OnceLock::new()),
            dir: data_dir.join("pools"),
            local: Arc::new(Mutex::new(HashMap::new())),
            stopping: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            hooks: Arc::new(Mutex::new(std::collections::HashSet::new())),
            rt: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Runs a hook's task on the server's runtime.
    pub fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, f: F) {
        match &self.rt {
            Some(h) => drop(h.spawn(f)),
            None => drop(tokio::spawn(f)),
        }
    }

    /// Waits up to `grace` for the exec hooks under way, then kills each with its whole process group (a hook left
    /// running past its server would create or delete machines nobody follows). Their nodes are followed from the
    /// store at the next start: one asked for and not registered times out and is deleted.
    pub async fn end_hooks(&self, grace: std::time::Duration) {
        let t0 = std::time::Instant::now();
        while !self.hooks.lock().expect("hooks").is_empty() && t0.elapsed() < grace {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let left: Vec<i32> = self.hooks.lock().expect("hooks").drain().collect();
        for g in left {
            tracing::warn!(pgid = g, "a pool hook still ran as the server stopped: killed with its process group");
            if let Some(pid) = rustix::process::Pid::from_raw(g) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        }
    }

    /// The server is stopping: from now on no hook starts and the pools stand still.
    pub fn stop_hooks(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the server is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sets the server's own URL (the agents' default).
    pub fn set_url(&self, url: String) {
        let _ = self.url.set(url);
    }

    fn server(&self) -> Result<String, String> {
        self.link
            .server
            .clone()
            .or_else(|| self.url.get().cloned())
            .ok_or_else(|| "the server's address is not known yet".to_string())
    }

    /// Runs `op` for `nodes` of `pool` (a resume with each node's registration token); `Err` says why it failed.
    pub async fn run(
        &self,
        pool: &PoolConfig,
        op: HookOp,
        nodes: &[String],
        tokens: &NodeTokens,
    ) -> Result<(), String> {
        if self.stopping() {
            return Err("the server is stopping".into());
        }
        match pool.provider {
            ProviderKind::Exec => self.exec(pool, op, nodes, tokens).await,
            ProviderKind::Local => match op {
                HookOp::Resume => self.local_resume(pool, nodes, tokens),
                HookOp::Suspend => {
                    self.local_suspend(&pool.name, nodes).await;
                    Ok(())
                }
            },
        }
    }

    async fn exec(&self, pool: &PoolConfig, op: HookOp, nodes: &[String], tokens: &NodeTokens) -> Result<(), String> {
        let prog = match op {
            HookOp::Resume => pool.resume_program.as_ref(),
            HookOp::Suspend => pool.suspend_program.as_ref(),
        }
        .ok_or_else(|| format!("no {}_program", op.as_str()))?;
        let server = self.server()?;
        // The hook's standard error goes to a file (a pipe would be held open by whatever it leaves running, and
        // its end would never come); its last lines are in the failure's report.
        let logs = self.dir.join("hooks");
        std::fs::create_dir_all(&logs).map_err(|e| format!("create {}: {e}", logs.display()))?;
        let err_path = logs.join(format!("{}-{}.stderr", pool.name, op.as_str()));
        let err = std::fs::File::create(&err_path).map_err(|e| format!("create {}: {e}", err_path.display()))?;
        let mut c = tokio::process::Command::new(prog);
        c.arg(&pool.name)
            .args(nodes)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(hook_env(pool, &self.link, &server))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(err)
            .kill_on_drop(true)
            .process_group(0);
        if op == HookOp::Resume {
            // `NODE=TOKEN` for each node, space-separated: the token its agent registers with (as its join token).
            let pairs: Vec<String> = nodes.iter().filter_map(|n| tokens.get(n).map(|t| format!("{n}={t}"))).collect();
            c.env("GPUNET_NODE_TOKENS", pairs.join(" "));
        }
        let mut child = {
            // Under the lock `end_hooks` takes: a hook started as the server stops would outlive it.
            let mut hooks = self.hooks.lock().expect("hooks");
            if self.stopping() {
                return Err("the server is stopping".into());
            }
            let child = c.spawn().map_err(|e| format!("start {}: {e}", prog.display()))?;
            if let Some(p) = child.id() {
                hooks.insert(p as i32);
            }
            child
        };
        let pgid = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32));
        let mut running = RunningHook { hooks: self.hooks.clone(), pgid, ended: false };
        let limit = std::time::Duration::from_secs_f64(pool.hook_timeout_s);
        let tail = || {
            let text = std::fs::read_to_string(&err_path).unwrap_or_default();
            let t: String = text.chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
            t.trim().to_string()
        };
        let waited = tokio::time::timeout(limit, child.wait()).await;
        running.ended = true;
        match waited {
            Err(_) => {
                // The hook and everything it started in its process group.
                if let Some(g) = pgid {
                    let _ = rustix::process::kill_process_group(g, rustix::process::Signal::KILL);
                }
                let _ = child.kill().await;
                let said = tail();
                let said = if said.is_empty() { String::new() } else { format!(" (it said: {said})") };
                Err(format!("{} did not finish within {} s: killed{said}", prog.display(), pool.hook_timeout_s))
            }
            Ok(Err(e)) => Err(format!("wait for {}: {e}", prog.display())),
            Ok(Ok(st)) if st.success() => Ok(()),
            Ok(Ok(st)) => Err(format!("{} exited with {st}: {}", prog.display(), tail())),
        }
    }

    fn local_resume(&self, pool: &PoolConfig, nodes: &[String], tokens: &NodeTokens) -> Result<(), String> {
        let server = self.server()?;
        let exe = match &self.link.exe {
            Some(e) => e.clone(),
            None => std::env::current_exe().map_err(|e| format!("find the gpunet executable: {e}"))?,
        };
        let labels = pool.node_labels().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        for node in nodes {
            let token = tokens.get(node).ok_or_else(|| format!("no registration token for {node}"))?;
            let dir = self.dir.join(&pool.name).join(node);
            std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let log = std::fs::File::create(dir.with_extension("log")).map_err(|e| format!("agent log: {e}"))?;
            let mut c = tokio::process::Command::new(&exe);
            c.arg("agent")
                .arg("--server")
                .arg(&server)
                .arg("--name")
                .arg(node)
                .arg("--labels")
                .arg(&labels)
                .arg("--fake-gpus")
                .arg(format!("{}x{}", pool.gpus_per_node, pool.gpu_model))
                .arg("--data-dir")
                .arg(&dir)
                .arg("--address")
                .arg(self.link.address.as_deref().unwrap_or("127.0.0.1"))
                .env("GPUNET_JOIN_TOKEN", token)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .kill_on_drop(true);
            if let Some(ca) = &self.link.ca {
                c.arg("--ca").arg(ca);
            }
            // The agents die with the server however it ends (the agent asks the kernel for a signal when its
            // parent goes: `gpunet agent --exit-with-parent PID`).
            c.arg("--exit-with-parent").arg(std::process::id().to_string());
            // Under the lock `stop_local` takes: an agent started as the server stops would outlive it.
            let mut local = self.local.lock().expect("local agents");
            if self.stopping() {
                return Err("the server is stopping".into());
            }
            let child = c.spawn().map_err(|e| format!("start {}: {e}", exe.display()))?;
            local.insert(node.clone(), (pool.name.clone(), child));
        }
        Ok(())
    }

    /// Stops the agents of `nodes` of `pool` (each stops its tasks, within their grace), then kills whatever a node's
    /// agent left running (one killed with SIGKILL stops nothing): the node's "machine" is switched off.
    async fn local_suspend(&self, pool: &str, nodes: &[String]) {
        for node in nodes {
            let child = self.local.lock().expect("local agents").remove(node);
            if let Some((_, mut child)) = child {
                if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
                // The agent stops its tasks (their grace) and leaves. Polled: the child may belong to another
                // runtime.
                let t0 = std::time::Instant::now();
                while !matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
                    if t0.elapsed() > std::time::Duration::from_secs(30) {
                        let _ = child.start_kill();
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
            self.reap(pool, node).await;
        }
    }

    /// Switches off lost local nodes: an agent process still there (frozen, or too slow to sync) is killed, and the
    /// tasks it left running with it, before the lost node's fence frees their GPUs for another attempt of the same
    /// job. A local agent cannot fence its tasks while it is frozen; its node is deleted anyway.
    pub async fn fence_lost_local(&self, pool: &str, nodes: &[String]) {
        for node in nodes {
            // The agent's pid while it still runs (one that died is only reaped below).
            let running = match self.local.lock().expect("local agents").get_mut(node) {
                Some((_, c)) => matches!(c.try_wait(), Ok(None)).then(|| c.id()).flatten(),
                None => None,
            };
            if let Some(pid) = running.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                tracing::warn!(pool, node = %node, "a lost local node's agent still runs: killed");
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                let t0 = std::time::Instant::now();
                while t0.elapsed() < std::time::Duration::from_secs(10) {
                    let done = match self.local.lock().expect("local agents").get_mut(node) {
                        Some((_, c)) => !matches!(c.try_wait(), Ok(None)),
                        None => true,
                    };
                    if done {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
            self.reap(pool, node).await;
        }
    }

    async fn reap(&self, pool: &str, node: &str) {
        if let Some(reap) = self.link.reap.clone() {
            let dir = self.dir.join(pool).join(node);
            let name = node.to_string();
            let killed = tokio::task::spawn_blocking(move || (reap.0)(&name, &dir)).await.unwrap_or(0);
            if killed > 0 {
                tracing::warn!(pool, node = %node, tasks = killed, "killed the tasks a dead local agent left running");
            }
        }
    }

    /// Removes a deleted local node's data directory (the machine is gone).
    pub fn forget_local(&self, pool: &str, node: &str) {
        let dir = self.dir.join(pool).join(node);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(dir.with_extension("log"));
    }

    /// Stops every local agent (the server is stopping).
    pub async fn stop_local(&self) {
        self.stop_hooks();
        let nodes: Vec<(String, String)> =
            self.local.lock().expect("local agents").iter().map(|(n, (p, _))| (p.clone(), n.clone())).collect();
        for (pool, node) in nodes {
            self.local_suspend(&pool, &[node]).await;
        }
    }
}

/// An exec hook under way. However its wait ends, it leaves [`Providers`]' list; one dropped before it ended (its
/// task's runtime went) is killed with its process group, not left running unwaited.
struct RunningHook {
    hooks: Arc<Mutex<std::collections::HashSet<i32>>>,
    pgid: Option<rustix::process::Pid>,
    ended: bool,
}

impl Drop for RunningHook {
    fn drop(&mut self) {
        if let Some(g) = self.pgid {
            self.hooks.lock().expect("hooks").remove(&g.as_raw_nonzero().get());
            if !self.ended {
                let _ = rustix::process::kill_process_group(g, rustix::process::Signal::KILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_short_form_parses_and_bad_fields_are_named() {
        let p = PoolConfig::parse_short("spot", "0..4x8xA10").unwrap();
        assert_eq!((p.min_nodes, p.max_nodes, p.gpus_per_node, p.gpu_model.as_str()), (0, 4, 8, "A10"));
        assert_eq!(p.lifecycle, Lifecycle::Spot);
        let t = p.template();
        assert_eq!(t.lifecycle(), Lifecycle::Spot);
        assert!(t.taints.iter().any(|t| t.key == "lifecycle" && t.value == "spot"));
        assert_eq!(t.labels.get(POOL_LABEL).map(String::as_str), Some("spot"));
        let e = PoolConfig::parse_short("spot", "4..2x8xA10").unwrap_err();
        assert_eq!(e.field, "max_nodes", "{e}");
        let e = PoolConfig::parse_short("spot", "0..2x8xQ9000").unwrap_err();
        assert_eq!(e.field, "gpu_model", "{e}");
        let e = PoolConfig::parse_short("spot", "0..2x8").unwrap_err();
        assert!(e.to_string().contains("MIN..MAXxGPUSxMODEL"), "{e}");
        let mut x = PoolConfig::local("x", "A10", 1, 0, 1);
        x.provider = ProviderKind::Exec;
        x.resume_program = Some("relative".into());
        assert_eq!(x.validate().unwrap_err().field, "resume_program");
        x.labels.insert("zone".into(), "z".into());
        x.resume_program = Some("/bin/true".into());
        x.suspend_program = Some("/bin/true".into());
        assert_eq!(x.validate().unwrap_err().field, "labels");
    }

    #[test]
    fn a_pool_s_node_shape_is_configurable_and_checked() {
        let mut p = PoolConfig::local("cloud", "A10", 2, 0, 3);
        let t = p.template();
        assert_eq!((t.cpu, t.mem), (MilliCpu::cores(8), MiB::gib(32)), "4 cores and 16 GiB per GPU by default");
        p.cpu_cores_per_node = Some(3);
        p.mem_gib_per_node = Some(20);
        let t = p.template();
        assert_eq!((t.cpu, t.mem), (MilliCpu::cores(3), MiB::gib(20)));
        p.cpu_cores_per_node = Some(0);
        assert_eq!(p.validate().unwrap_err().field, "cpu_cores_per_node");
        p.cpu_cores_per_node = None;
        p.mem_gib_per_node = Some(0);
        assert_eq!(p.validate().unwrap_err().field, "mem_gib_per_node");
    }

    #[tokio::test]
    async fn an_exec_hook_gets_its_arguments_and_environment_and_a_failure_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let script = dir.path().join("hook.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$@|$GPUNET_POOL|$GPUNET_POOL_GPUS|$GPUNET_JOIN_TOKEN|$GPUNET_NODE_TOKENS|$GPUNET_POOL_LABELS\" > {}\n[ \"$2\" = bad ] && {{ echo broken >&2; exit 3; }}\nexit 0\n", out.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut p = PoolConfig::local("cloud", "A10", 2, 0, 3);
        p.provider = ProviderKind::Exec;
        p.resume_program = Some(script.clone());
        p.suspend_program = Some(script.clone());
        p.hook_timeout_s = 5.0;
        p.validate().unwrap();
        let link = AgentLink { server: Some("https://s:1".into()), ..Default::default() };
        let prov = Providers::new(link, dir.path());
        let tokens: NodeTokens =
            [("cloud-00001".to_string(), "t1".to_string()), ("cloud-00002".into(), "t2".into())].into();
        prov.run(&p, HookOp::Resume, &["cloud-00001".into(), "cloud-00002".into()], &tokens).await.unwrap();
        let got = std::fs::read_to_string(&out).unwrap();
        // Each node's own registration token; never the server's join token.
        assert_eq!(
            got.trim(),
            "cloud cloud-00001 cloud-00002|cloud|2||cloud-00001=t1 cloud-00002=t2|gpunet.io/pool=cloud,lifecycle=spot,\
             zone=default"
        );
        let e = prov.run(&p, HookOp::Suspend, &["bad".into()], &NodeTokens::new()).await.unwrap_err();
        assert!(e.contains("exited with") && e.contains("broken"), "{e}");
        // A hook past its timeout is killed and reported.
        let slow = dir.path().join("slow.sh");
        std::fs::write(&slow, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.resume_program = Some(slow);
        p.hook_timeout_s = 0.3;
        let e = prov.run(&p, HookOp::Resume, &["cloud-00003".into()], &NodeTokens::new()).await.unwrap_err();
        assert!(e.contains("did not finish within"), "{e}");
        // A stopping server waits for the hooks under way, then kills them with their process groups.
        let marker = dir.path().join("child-ran");
        let stuck = dir.path().join("stuck.sh");
        std::fs::write(
            &stuck,
            format!(
                "#!/bin/sh
(sleep 2; touch {}) &
exec sleep 30
",
                marker.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&stuck, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.resume_program = Some(stuck);
        p.hook_timeout_s = 60.0;
        let (prov2, p2) = (prov.clone(), p.clone());
        let hook =
            tokio::spawn(
                async move { prov2.run(&p2, HookOp::Resume, &["cloud-00004".into()], &NodeTokens::new()).await },
            );
        let t = std::time::Instant::now();
        while prov.hooks.lock().unwrap().is_empty() {
            assert!(t.elapsed() < std::time::Duration::from_secs(30), "the hook never started");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        prov.stop_hooks();
        prov.end_hooks(std::time::Duration::from_millis(300)).await;
        let r = tokio::time::timeout(std::time::Duration::from_secs(30), hook).await.expect("the hook ended").unwrap();
        assert!(r.is_err(), "{r:?}");
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        assert!(!marker.exists(), "what the hook started in its group outlived the server");
        // And none starts any more.
        let e = prov.run(&p, HookOp::Suspend, &["cloud-00004".into()], &NodeTokens::new()).await.unwrap_err();
        assert!(e.contains("stopping"), "{e}");
    }
}
