//! `gpunet server`: the control plane's flags, merged over the configuration file (`--config`, see [`crate::config`])
//! and checked into a [`gpunet_server::Config`], then the server itself, holding the data directory's lock.

use crate::config::{LogFormat, ServerFile};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// Every flag but `--config` has a key of the same name in the configuration file; a flag given wins over the file.
/// The defaults shown are those of the file (`gpunet admin config` prints them all).
#[derive(Debug, clap::Args)]
pub(crate) struct ServerArgs {
    /// Configuration file (TOML; `gpunet admin config` prints one with every key at its default). Flags win over it.
    #[arg(long, env = "GPUNET_SERVER_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (the SQLite database unless --store names another; TLS files, the lock file) [default:
    /// gpunet-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where the state is kept: `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`, or `sqlite://DIR` (default: SQLite in
    /// --data-dir). Default GPUNET_STORE.
    #[arg(long, env = "GPUNET_STORE", hide_env_values = true)]
    store: Option<String>,
    /// Listen address [default: 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Admin token (default GPUNET_ADMIN_TOKEN; generated and printed once if none is stored).
    #[arg(long, env = "GPUNET_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Join token for node agents (default GPUNET_JOIN_TOKEN; generated and printed once if none is stored).
    #[arg(long, env = "GPUNET_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// Scheduling policy: auto (the recommended setting: SRGF with backfill and eviction for much shorter jobs; see
    /// docs/scheduler.md), fifo, priority, sjf, srtf, srgf, drf, fairshare or las [default: the --sched-config
    /// file's, else auto].
    #[arg(long)]
    policy: Option<String>,
    /// Scheduler knobs (TOML, a `[scheduler]` table: policy, backfill, preemptive, LAS thresholds, minimum run time,
    /// eviction rate limit, restart backoff, tick; see docs/scheduler.md). `--policy` and `--no-backfill` win over
    /// it; its minimum run time and restart backoff, when it sets them, apply over the defaults of
    /// `--preempt-min-run-s` and `--restart-backoff-s` (given on the command line at another value, even the
    /// default, or set to another value in the server's file, the server refuses to start).
    #[arg(long, env = "GPUNET_SCHED_CONFIG")]
    sched_config: Option<PathBuf>,
    /// Turn EASY backfill off (file: `backfill = false`).
    #[arg(long)]
    no_backfill: bool,
    /// Seconds without a sync after which an agent's node is lost and its jobs restart elsewhere [default: 10].
    #[arg(long)]
    node_lost_after_s: Option<f64>,
    /// Seconds a lost node's tasks stay fenced (their GPUs held) waiting for its agent to come back and confirm them
    /// killed; after that they are taken as gone and their jobs run again elsewhere [default: 60].
    #[arg(long)]
    node_fence_s: Option<f64>,
    /// Seconds before the first restart of a failed job (doubling after each restart) [default: 10].
    #[arg(long)]
    restart_backoff_s: Option<f64>,
    /// A job that has run less than this many seconds is never preempted [default: 300].
    #[arg(long)]
    preempt_min_run_s: Option<f64>,
    /// Where checkpoint tiers may go, repeatable: `file:///srv/ckpt/{tenant}` or `s3://bucket/{tenant}/`
    /// (`{tenant}`: the job's tenant). A tier URL outside every root is refused at submit; without roots, tiers
    /// live only on the nodes' disks. Given on the command line, they replace the file's.
    #[arg(long = "checkpoint-root")]
    checkpoint_roots: Vec<String>,
    /// Most queued jobs one tenant may have; more submissions get 429 [default: 10000].
    #[arg(long)]
    max_queued_jobs_per_tenant: Option<usize>,
    /// Most bytes of job specs one tenant's unfinished jobs may hold; more submissions get 429 [default: 64 MiB].
    #[arg(long)]
    max_spec_bytes_per_tenant: Option<u64>,
    /// Most log and event streams one token may have open at once; more get 429 [default: 16].
    #[arg(long)]
    max_streams_per_token: Option<usize>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Allow plain HTTP on a non-loopback address (tokens and task secrets cross the network in clear text).
    #[arg(long)]
    insecure_http: bool,
    /// Most connections at once (keep it below the open-file limit) [default: 768].
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a client has for the TLS handshake and for each request head (and an idle connection is kept)
    /// [default: 10].
    #[arg(long)]
    header_timeout_s: Option<f64>,
    /// Price catalogue (TOML: GPU prices by model and lifecycle, CPU core-hour, memory GiB-hour); default: the one
    /// shipped with gpunet (`gpunet prices` prints it).
    #[arg(long)]
    prices: Option<PathBuf>,
    /// With a PostgreSQL store (where servers run as replicas, one leading): the URL clients reach this server at,
    /// to which standbys redirect while it leads. Default: this server's scheme and --listen address.
    #[arg(long)]
    advertise: Option<String>,
    /// With a PostgreSQL store: seconds the leader's lease lasts without renewal; a standby takes over once it
    /// expires (at once when the leader's process died and its database session ended) [default: 4].
    #[arg(long)]
    lease_ttl_s: Option<f64>,
    /// Seconds between the leader's lease renewals (at most half the lease) [default: 1].
    #[arg(long)]
    lease_renew_s: Option<f64>,
    /// Seconds between a standby's attempts to take the lease [default: 0.25].
    #[arg(long)]
    lease_poll_s: Option<f64>,
}

impl ServerArgs {
    /// The file's settings (defaults without `--config`) with every flag given laid over them.
    pub(crate) fn merged(&self) -> Result<ServerFile> {
        let mut f = match &self.config {
            Some(p) => ServerFile::load(p)?,
            None => ServerFile::default(),
        };
        fn over<T: Clone>(flag: &Option<T>, file: &mut T) {
            if let Some(v) = flag {
                *file = v.clone();
            }
        }
        fn over_opt<T: Clone>(flag: &Option<T>, file: &mut Option<T>) {
            if flag.is_some() {
                file.clone_from(flag);
            }
        }
        over(&self.data_dir, &mut f.data_dir);
        over_opt(&self.store, &mut f.store);
        over(&self.listen, &mut f.listen);
        over_opt(&self.admin_token, &mut f.admin_token);
        over_opt(&self.join_token, &mut f.join_token);
        over_opt(&self.policy, &mut f.policy);
        over_opt(&self.sched_config, &mut f.sched_config);
        f.backfill &= !self.no_backfill;
        over(&self.node_lost_after_s, &mut f.node_lost_after_s);
        over(&self.node_fence_s, &mut f.node_fence_s);
        over(&self.restart_backoff_s, &mut f.restart_backoff_s);
        over(&self.preempt_min_run_s, &mut f.preempt_min_run_s);
        f.flags_given = crate::SchedFlagsGiven {
            min_run_time: self.preempt_min_run_s.is_some(),
            restart_backoff: self.restart_backoff_s.is_some(),
            no_backfill: false,
        };
        if !self.checkpoint_roots.is_empty() {
            f.checkpoint_roots.clone_from(&self.checkpoint_roots);
        }
        over(&self.max_queued_jobs_per_tenant, &mut f.max_queued_jobs_per_tenant);
        over(&self.max_spec_bytes_per_tenant, &mut f.max_spec_bytes_per_tenant);
        over(&self.max_streams_per_token, &mut f.max_streams_per_token);
        // The certificate and its key come as a pair, from the flags or from the file.
        if self.tls_cert.is_some() {
            f.tls_cert.clone_from(&self.tls_cert);
            f.tls_key.clone_from(&self.tls_key);
        }
        f.insecure_http |= self.insecure_http;
        over(&self.max_connections, &mut f.max_connections);
        over(&self.header_timeout_s, &mut f.header_timeout_s);
        over_opt(&self.prices, &mut f.prices);
        over_opt(&self.advertise, &mut f.advertise);
        over(&self.lease_ttl_s, &mut f.lease_ttl_s);
        over(&self.lease_renew_s, &mut f.lease_renew_s);
        over(&self.lease_poll_s, &mut f.lease_poll_s);
        Ok(f)
    }
}

/// Checks the merged settings into the server's configuration; errors name the flag (= the file's key). With it, the
/// warnings to log at start: scheduler knobs given that do nothing as the server will run.
fn server_config(a: &ServerFile) -> Result<(gpunet_server::Config, Vec<String>)> {
    let mut cfg = gpunet_server::Config::new(a.data_dir.clone());
    cfg.listen = a.listen;
    cfg.admin_token.clone_from(&a.admin_token);
    cfg.join_token.clone_from(&a.join_token);
    let lost_ok = a.node_lost_after_s.is_finite() && a.node_lost_after_s > 0.0;
    let backoff_ok = a.restart_backoff_s.is_finite() && a.restart_backoff_s >= 0.0;
    if !lost_ok || !backoff_ok {
        bail!("invalid --node-lost-after-s / --restart-backoff-s: allowed are seconds > 0 and >= 0");
    }
    cfg.node_lost_after = std::time::Duration::from_secs_f64(a.node_lost_after_s);
    if !a.node_fence_s.is_finite() || a.node_fence_s < 0.0 {
        bail!("invalid --node-fence-s {}: allowed is seconds >= 0", a.node_fence_s);
    }
    cfg.node_fence_after = std::time::Duration::from_secs_f64(a.node_fence_s);
    cfg.sched.restart_backoff = gpunet_core::Dur((a.restart_backoff_s * 1000.0) as u64);
    if !a.preempt_min_run_s.is_finite() || a.preempt_min_run_s < 0.0 {
        bail!("invalid --preempt-min-run-s {}: allowed is seconds >= 0", a.preempt_min_run_s);
    }
    cfg.sched.preemption.min_run_time = gpunet_core::Dur((a.preempt_min_run_s * 1000.0) as u64);
    // The scheduler's bounds, said of the flags (the check of the settings together names the file's keys).
    let (max_backoff, max_min_run) = (gpunet_core::config::MAX_RESTART_BACKOFF, gpunet_core::config::MAX_MIN_RUN_TIME);
    if cfg.sched.restart_backoff > max_backoff {
        bail!(
            "invalid --restart-backoff-s {}: allowed is at most {} (a day)",
            a.restart_backoff_s,
            max_backoff.0 / 1000
        );
    }
    if cfg.sched.preemption.min_run_time > max_min_run {
        bail!(
            "invalid --preempt-min-run-s {}: allowed is at most {} (a week; to evict nothing, --sched-config with \
             preemption = false)",
            a.preempt_min_run_s,
            max_min_run.0 / 1000
        );
    }
    let flags = crate::SchedFlagsGiven { no_backfill: !a.backfill, ..a.flags_given };
    let warnings = crate::load_sched(&mut cfg, a.sched_config.as_deref(), a.policy.as_deref(), flags)?;
    for r in &a.checkpoint_roots {
        if !(r.starts_with("file:///") || r.starts_with("s3://")) || r.contains("..") {
            bail!("invalid --checkpoint-root {r:?}: allowed is file:///PATH or s3://BUCKET/PREFIX without '..'");
        }
    }
    cfg.checkpoint_roots.clone_from(&a.checkpoint_roots);
    if a.max_queued_jobs_per_tenant == 0 || a.max_spec_bytes_per_tenant == 0 || a.max_streams_per_token == 0 {
        bail!(
            "invalid --max-queued-jobs-per-tenant / --max-spec-bytes-per-tenant / --max-streams-per-token: allowed \
             are numbers > 0"
        );
    }
    cfg.max_queued_jobs_per_tenant = a.max_queued_jobs_per_tenant;
    cfg.max_spec_bytes_per_tenant = a.max_spec_bytes_per_tenant;
    cfg.max_streams_per_token = a.max_streams_per_token;
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        cfg.tls = Some(gpunet_server::tls::TlsFiles { cert: cert.clone(), key: key.clone() });
    }
    cfg.insecure_http = a.insecure_http;
    if a.insecure_http {
        tracing::warn!("--insecure-http: tokens and task secrets may cross the network in clear text");
    }
    if a.max_connections == 0 || !a.header_timeout_s.is_finite() || a.header_timeout_s <= 0.0 {
        bail!("invalid --max-connections / --header-timeout-s: allowed are at least 1 and seconds > 0");
    }
    cfg.limits.max_connections = a.max_connections;
    cfg.limits.max_connections_per_ip = a.max_connections.div_ceil(2);
    cfg.limits.header_timeout = std::time::Duration::from_secs_f64(a.header_timeout_s);
    cfg.prices = crate::load_prices(a.prices.as_deref())?;
    let mut names = std::collections::HashSet::new();
    for p in &a.pools {
        p.validate()?;
        if !names.insert(p.name.clone()) {
            bail!("invalid pools: the name {:?} is used twice", p.name);
        }
    }
    cfg.pools.clone_from(&a.pools);
    cfg.pool_link = gpunet_server::pools::AgentLink {
        server: a.pool_agent_server.clone(),
        ca: a.pool_agent_ca.clone().or_else(|| a.tls_cert.clone()),
        exe: None,
        address: None,
        reap: Some(crate::ops::local_reaper()),
    };
    Ok((cfg, warnings))
}

/// The lease of a replica on PostgreSQL, from the merged settings.
fn lease_config(a: &ServerFile, tls: bool) -> Result<gpunet_store::pg_lease::LeaseConfig> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    if !ok(a.lease_ttl_s) || !ok(a.lease_renew_s) || !ok(a.lease_poll_s) {
        bail!("invalid --lease-ttl-s / --lease-renew-s / --lease-poll-s: allowed are seconds > 0");
    }
    if a.lease_renew_s * 2.0 > a.lease_ttl_s || a.lease_poll_s > a.lease_ttl_s {
        bail!(
            "invalid --lease-renew-s {} / --lease-poll-s {}: allowed are at most half of --lease-ttl-s {} and at most \
             --lease-ttl-s",
            a.lease_renew_s,
            a.lease_poll_s,
            a.lease_ttl_s
        );
    }
    let address = match &a.advertise {
        Some(u) => {
            let l = gpunet_api::servers::ServerList::parse("--advertise", u).map_err(|e| anyhow::anyhow!(e.message))?;
            if l.all().len() != 1 {
                bail!("invalid --advertise {u:?}: allowed is one URL");
            }
            l.current().to_string()
        }
        None if a.listen.ip().is_unspecified() => {
            bail!("missing --advertise: with --listen {} give the URL clients reach this server at", a.listen)
        }
        None => format!("{}://{}", if tls { "https" } else { "http" }, a.listen),
    };
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    Ok(gpunet_store::pg_lease::LeaseConfig {
        holder: format!("{host}/{}/{address}", std::process::id()),
        address,
        ttl: std::time::Duration::from_secs_f64(a.lease_ttl_s),
        renew_every: std::time::Duration::from_secs_f64(a.lease_renew_s),
        poll_every: std::time::Duration::from_secs_f64(a.lease_poll_s),
    })
}

/// Runs the server until Ctrl-C (or SIGTERM).
pub(crate) fn run(a: &ServerArgs, log_format: Option<LogFormat>) -> Result<()> {
    let f = a.merged()?;
    crate::ops::init_logging(log_format.unwrap_or(f.log_format), "info");
    for w in &f.warnings {
        tracing::warn!("{w}");
    }
    let (cfg, sched_warnings) = server_config(&f)?;
    for w in &sched_warnings {
        tracing::warn!("{w}");
    }
    let store_url = match &f.store {
        Some(s) => gpunet_store::StoreUrl::parse(s).context("invalid --store")?,
        None => gpunet_store::StoreUrl::Sqlite(f.data_dir.clone()),
    };
    let lease = match &store_url {
        gpunet_store::StoreUrl::Postgres(_) => Some(lease_config(&f, cfg.tls.is_some())?),
        gpunet_store::StoreUrl::Sqlite(_) => None,
    };
    // One server per data directory: its files (database, TLS, tokens) are not made to be shared.
    let _lock = crate::ops::DataDirLock::acquire(&f.data_dir)?;
    crate::runtime()?.block_on(async move {
        let running = match (store_url, lease) {
            // On PostgreSQL, servers are replicas: one leads, the others stand by (`gpunet_server::ha`).
            (gpunet_store::StoreUrl::Postgres(url), Some(lease)) => {
                let on_generated: gpunet_server::ha::OnGenerated = std::sync::Arc::new(|admin, join| {
                    if let Some(t) = admin {
                        println!("admin token (shown once, store it): {t}");
                    }
                    if let Some(t) = join {
                        println!("agent join token (shown once): {t}");
                    }
                });
                let ha = gpunet_server::ha::HaConfig { store_url: url, lease, on_generated: Some(on_generated) };
                gpunet_server::ha::start_ha(cfg, ha).await?
            }
            (url, _) => {
                let store = gpunet_store::open(&url).context("open the store")?;
                gpunet_server::start(cfg, store).await?
            }
        };
        println!("gpunet server listening on {}", running.url());
        if let Some(t) = &running.generated_admin_token {
            println!("admin token (shown once, store it): {t}");
        }
        if let Some(t) = &running.generated_join_token {
            println!("agent join token (shown once): {t}");
        }
        if let Some(r) = &running.ha {
            match r.role() {
                gpunet_store::pg_lease::Role::Leader { epoch, .. } => println!("role: leader (epoch {epoch})"),
                gpunet_store::pg_lease::Role::Standby { leader } => {
                    println!("role: standby (leader: {})", leader.as_deref().unwrap_or("none yet"))
                }
                gpunet_store::pg_lease::Role::Starting => println!("role: starting"),
            }
        }
        use std::io::Write as _;
        std::io::stdout().flush()?;
        crate::ops::stop_signal().await?;
        tracing::info!("stopping");
        running.stop().await;
        Ok::<(), anyhow::Error>(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// Every flag of `gpunet server` has its key in the file and in `gpunet admin config`'s template.
    #[test]
    fn every_server_flag_has_a_key_in_the_configuration_file() {
        let cmd = crate::Cli::command();
        let server = cmd.find_subcommand("server").unwrap();
        let template = crate::config::template();
        let mut n = 0;
        for arg in server.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "config" | "help" | "log-format") {
                continue;
            }
            let key = match long {
                "no-backfill" => "backfill".to_string(),
                "checkpoint-root" => "checkpoint_roots".to_string(),
                l => l.replace('-', "_"),
            };
            let line = format!("{key} = ");
            assert!(
                template.lines().any(|l| l.trim_start_matches("# ").starts_with(&line)),
                "no key {key} for --{long}"
            );
            // The key parses (deny_unknown_fields would refuse it otherwise) with the template's value.
            let probe = template
                .lines()
                .find(|l| l.trim_start_matches("# ").starts_with(&line))
                .unwrap()
                .trim_start_matches("# ")
                .to_string();
            toml::from_str::<ServerFile>(&probe).unwrap_or_else(|e| panic!("{probe}: {e}"));
            n += 1;
        }
        assert!(n >= 20, "only {n} flags found");
    }

    /// The scheduler a server starts with: `auto` (SRGF, backfill, eviction for jobs 8× shorter, defragmentation, a
    /// probe of 15 minutes) unless a policy is named; a named policy is plain (not preemptive for shorter jobs, no
    /// defragmentation, no probe) unless
    /// the `--sched-config` file says so;
    /// `--policy auto` wins over the file's policy, and the file's other knobs tune it; a bad name lists `auto` with
    /// the others.
    #[test]
    fn the_recommended_setting_is_the_default_and_a_named_policy_is_used_as_named() {
        use gpunet_core::{Policy, SchedConfig};
        let dir = tempfile::tempdir().unwrap();
        // The scheduler settings a server started so would run, and the warnings it would log.
        let warned = |args: &[&str], knobs: Option<&str>| -> anyhow::Result<(SchedConfig, Vec<String>)> {
            let mut argv = vec!["gpunet".to_string(), "server".into()];
            if let Some(k) = knobs {
                let path = dir.path().join("sched.toml");
                std::fs::write(&path, format!("[scheduler]\n{k}")).unwrap();
                argv.extend(["--sched-config".into(), path.display().to_string()]);
            }
            argv.extend(args.iter().map(|a| a.to_string()));
            let crate::Cmd::Server(a) = crate::Cli::try_parse_from(argv).unwrap().cmd else { panic!() };
            let (cfg, warnings) = server_config(&a.merged()?)?;
            Ok((cfg.sched, warnings))
        };
        let sched = |args: &[&str], knobs: Option<&str>| warned(args, knobs).map(|(c, _)| c);
        let shape = |c: &SchedConfig| (c.policy, c.backfill, c.preemption.shorter_first, c.preemption.shorter_ratio);
        let auto = (Policy::Srgf, true, true, 8);
        assert_eq!(shape(&sched(&[], None).unwrap()), auto);
        assert_eq!(shape(&SchedConfig::recommended()), auto);
        assert_eq!(shape(&sched(&["--policy", "AUTO"], None).unwrap()), auto);
        assert_eq!(shape(&sched(&["--policy", "sjf"], None).unwrap()), (Policy::Sjf, true, false, 2));
        assert_eq!(shape(&sched(&["--policy", "srgf"], None).unwrap()), (Policy::Srgf, true, false, 2));
        assert_eq!(shape(&sched(&[], Some("policy = \"las\"\n")).unwrap()), (Policy::Las, true, false, 2));
        assert_eq!(
            shape(&sched(&[], Some("policy = \"srtf\"\npreemptive = true\n")).unwrap()),
            (Policy::Srtf, true, true, 2)
        );
        // A file that names no policy tunes the recommended one; one that names `auto` likewise.
        assert_eq!(shape(&sched(&[], Some("shorter_ratio = 4\n")).unwrap()), (Policy::Srgf, true, true, 4));
        let named_auto = sched(&[], Some("policy = \"auto\"\nshorter_ratio = 4\n")).unwrap();
        assert_eq!((shape(&named_auto), named_auto.probe.is_some()), ((Policy::Srgf, true, true, 4), true));
        // A plain policy on the command line wins over the file's `auto`, whose knobs it does not take.
        let fifo = sched(&["--policy", "fifo"], Some("policy = \"auto\"\n")).unwrap();
        assert_eq!(
            (shape(&fifo), fifo.probe, fifo.preemption.defragment),
            ((Policy::Fifo, true, false, 2), None, false)
        );
        assert_eq!(shape(&sched(&["--policy", "auto"], Some("policy = \"drf\"\n")).unwrap()), auto);
        assert_eq!(
            shape(&sched(&["--policy", "auto"], Some("shorter_ratio = 4\n")).unwrap()),
            (Policy::Srgf, true, true, 4),
            "named or not, auto is tuned by the file"
        );
        assert_eq!(shape(&sched(&[], Some("preemptive = false\n")).unwrap()), (Policy::Srgf, true, false, 8));
        assert_eq!(shape(&sched(&["--no-backfill"], None).unwrap()), (Policy::Srgf, false, true, 8));
        // Defragmentation: on in auto (and off by the file), off for a named policy (and on by the file).
        let defrag = |c: SchedConfig| c.preemption.defragment;
        assert!(defrag(SchedConfig::recommended()) && defrag(sched(&[], None).unwrap()));
        assert!(!defrag(sched(&[], Some("defragment = false\n")).unwrap()));
        assert!(!defrag(sched(&["--policy", "srgf"], None).unwrap()));
        assert!(defrag(sched(&[], Some("policy = \"las\"\ndefragment = true\n")).unwrap()));
        // The probe likewise: 15 minutes in auto (another length or off by the file), none for a named policy.
        let probe = |c: SchedConfig| c.probe.map(|p| p.0 / 60_000);
        assert_eq!((probe(SchedConfig::recommended()), probe(sched(&[], None).unwrap())), (Some(15), Some(15)));
        assert_eq!(probe(sched(&[], Some("probe = \"0s\"\n")).unwrap()), None);
        assert_eq!(probe(sched(&[], Some("probe = \"30m\"\n")).unwrap()), Some(30));
        assert_eq!(probe(sched(&["--policy", "srgf"], None).unwrap()), None);
        assert_eq!(probe(sched(&[], Some("policy = \"srtf\"\nprobe = \"10m\"\n")).unwrap()), Some(10));
        let e = sched(&["--policy", "shortest"], None).unwrap_err().to_string();
        assert!(e.contains("--policy") && e.contains("auto, fifo"), "{e}");
        // The file's minimum run time and restart backoff apply over the flags' defaults; a flag set to another
        // value as well disagrees with it, and the server refuses to start rather than take one quietly.
        let min_run = |c: SchedConfig| (c.preemption.min_run_time.0, c.restart_backoff.0);
        assert_eq!(min_run(sched(&[], Some("min_run_time = \"10m\"\n")).unwrap()), (600_000, 10_000));
        assert_eq!(min_run(sched(&["--preempt-min-run-s", "60"], None).unwrap()), (60_000, 10_000));
        let both = ["--preempt-min-run-s", "600", "--restart-backoff-s", "30"];
        let agreeing = "min_run_time = \"10m\"\nrestart_backoff = \"30s\"\n";
        assert_eq!(min_run(sched(&both, Some(agreeing)).unwrap()), (600_000, 30_000));
        let e = sched(&["--preempt-min-run-s", "60"], Some("min_run_time = \"10m\"\n")).unwrap_err().to_string();
        assert!(e.contains("min_run_time (600000 ms) disagrees with --preempt-min-run-s (60000 ms"), "{e}");
        let e = sched(&["--restart-backoff-s", "1"], Some("restart_backoff = \"20s\"\n")).unwrap_err().to_string();
        assert!(e.contains("restart_backoff (20000 ms) disagrees with --restart-backoff-s"), "{e}");
        // The bounds are said of the flags when the flags set them.
        let e = sched(&["--restart-backoff-s", "90000"], None).unwrap_err().to_string();
        assert!(e.starts_with("invalid --restart-backoff-s 90000: allowed is at most 86400"), "{e}");
        let e = sched(&["--preempt-min-run-s", "700000"], None).unwrap_err().to_string();
        assert!(e.starts_with("invalid --preempt-min-run-s 700000: allowed is at most 604800"), "{e}");
        // Warnings are of the settings as the server runs them: `--no-backfill` applied first (a probe under FIFO
        // without backfill does nothing; the warning was missed when backfill went off after the check).
        let (c, w) = warned(&["--policy", "fifo", "--no-backfill"], Some("probe = \"15m\"\n")).unwrap();
        assert!(!c.backfill && w.len() == 1 && w[0].starts_with("scheduler: probe does nothing under fifo"), "{w:?}");
        assert_eq!(warned(&["--policy", "fifo"], Some("probe = \"15m\"\n")).unwrap().1, Vec::<String>::new());
        // A flag given at its default disagrees as well (it was overridden by the file without a word); a file's
        // default (one `gpunet admin config` writes) is no flag given.
        let e = sched(&["--restart-backoff-s", "10"], Some("restart_backoff = \"30s\"\n")).unwrap_err().to_string();
        assert!(e.contains("restart_backoff (30000 ms) disagrees with --restart-backoff-s (10000 ms"), "{e}");
        let e = sched(&["--preempt-min-run-s", "300"], Some("min_run_time = \"1m\"\n")).unwrap_err().to_string();
        assert!(e.contains("min_run_time (60000 ms) disagrees with --preempt-min-run-s (300000 ms"), "{e}");
        // The file and `--policy` together are checked as the server runs them.
        let e = sched(&["--policy", "sjf"], Some("preemptive = true\nshorter_ratio = 1\n")).unwrap_err();
        assert!(format!("{e:#}").contains("at least 2 under preemptive sjf"), "{e:#}");
        // A file that is no TOML keeps the parser's lines (it was one escaped line).
        let e = format!("{:#}", sched(&[], Some("min_run_time = -1\n")).unwrap_err());
        assert!(e.contains("the [scheduler] table") && e.contains("-1 is negative") && e.contains('\n'), "{e}");
        assert!(!e.contains("\\n"), "{e}");
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:9999\"\npolicy = \"drf\"\nbackfill = false\nnode_fence_s = 5.0\n")
            .unwrap();
        let cli = crate::Cli::try_parse_from([
            "gpunet",
            "server",
            "--config",
            path.to_str().unwrap(),
            "--policy",
            "las",
            "--max-connections",
            "9",
        ])
        .unwrap();
        let crate::Cmd::Server(a) = cli.cmd else { panic!() };
        let f = a.merged().unwrap();
        assert_eq!(f.listen.port(), 9999, "from the file");
        assert_eq!((f.policy.as_deref(), f.max_connections), (Some("las"), 9), "flags win");
        assert!(!f.backfill && f.node_fence_s == 5.0);
        assert_eq!(f.header_timeout_s, 10.0, "the default where neither says");
        let (cfg, _) = server_config(&f).unwrap();
        assert_eq!(cfg.node_fence_after, std::time::Duration::from_secs(5));
        assert!(!cfg.sched.backfill);
    }

    #[test]
    fn a_bad_value_in_the_file_is_refused_naming_its_key() {
        let f = ServerFile::parse("node_fence_s = -1.0\n").unwrap();
        let e = server_config(&f).unwrap_err().to_string();
        assert!(e.contains("node-fence-s"), "{e}");
    }
}
