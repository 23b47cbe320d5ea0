//! Monitoring that ships with the binary: the alert rules (`deploy/prometheus/gpunet-rules.yml`, compiled in and
//! printed by `gpunet admin alert-rules`) and `gpunet up --with-prometheus`, which writes a Prometheus configuration
//! scraping the local server with those rules and runs Prometheus as a child of `gpunet up`.

use anyhow::{bail, Context, Result};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// gpunet's alert rules (Prometheus 2.x rule file), as shipped in `deploy/prometheus/gpunet-rules.yml`.
pub(crate) const ALERT_RULES: &str = include_str!("../../../deploy/prometheus/gpunet-rules.yml");

/// The scrape job's name: the rules (`up{job="gpunet"}`) and dashboards expect it.
pub(crate) const SCRAPE_JOB: &str = "gpunet";

/// A Prometheus configuration scraping gpunet's `/metrics` at `target` (`host:port`) over HTTPS, trusting `ca`,
/// with the admin token read from `token_file`, and loading `rules`.
pub(crate) fn scrape_config(target: &str, ca: &Path, token_file: &Path, rules: &Path) -> String {
    // Paths are written as YAML double-quoted strings (JSON strings are valid YAML).
    let q = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("a string serialises");
    format!(
        "# Written by `gpunet up --with-prometheus`; rewritten at every start.\n\
         global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: {SCRAPE_JOB}\n    scheme: https\n    metrics_path: /metrics\n\
         \x20   authorization:\n      credentials_file: {token}\n\
         \x20   tls_config:\n      ca_file: {ca}\n\
         \x20   static_configs:\n      - targets: [{target}]\n",
        rules = q(rules),
        token = q(token_file),
        ca = q(ca),
        target = serde_json::to_string(target).expect("a string serialises"),
    )
}

/// Prometheus running as a child; stopped (SIGTERM, then SIGKILL after 10 s) when dropped.
pub(crate) struct Prometheus {
    child: Child,
    /// Where it answers, e.g. `http://127.0.0.1:9090`.
    pub(crate) url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_secs(10) {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `prometheus` executable on `PATH`, if any.
pub(crate) fn find_prometheus() -> Option<PathBuf> {
    gpunet_agent::container::find_program("prometheus")
}

/// Writes `DIR/prometheus/{prometheus.yml, gpunet-rules.yml}` (DIR: `gpunet up`'s data directory) and starts
/// Prometheus on `listen` with its data in `DIR/prometheus/data`; its output goes to `DIR/prometheus/prometheus.log`.
pub(crate) fn start(data_dir: &Path, target: &str, ca: &Path, token_file: &Path, listen: &str) -> Result<Prometheus> {
    let Some(bin) = find_prometheus() else {
        bail!("--with-prometheus: no `prometheus` on PATH; install it (Debian and Ubuntu: apt-get install prometheus)")
    };
    let dir = std::path::absolute(data_dir.join("prometheus")).context("resolve the Prometheus directory")?;
    std::fs::create_dir_all(dir.join("data")).with_context(|| format!("create {}", dir.display()))?;
    let rules = dir.join("gpunet-rules.yml");
    std::fs::write(&rules, ALERT_RULES).with_context(|| format!("write {}", rules.display()))?;
    let config = dir.join("prometheus.yml");
    let token_file = std::path::absolute(token_file).context("resolve the admin token file")?;
    let ca = std::path::absolute(ca).context("resolve the CA certificate")?;
    std::fs::write(&config, scrape_config(target, &ca, &token_file, &rules))
        .with_context(|| format!("write {}", config.display()))?;
    let log_path = dir.join("prometheus.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("open {}", log_path.display()))?;
    let mut err = log.try_clone()?;
    let _ = writeln!(err, "--- gpunet up starts {}", bin.display());
    let child = Command::new(&bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={listen}"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))?;
    Ok(Prometheus { child, url: format!("http://{listen}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrape_config_names_the_job_the_rules_expect_and_quotes_paths() {
        let c = scrape_config(
            "127.0.0.1:7070",
            Path::new("/d/ca.pem"),
            Path::new("/d/admin \"x\".token"),
            Path::new("/d/r.yml"),
        );
        assert!(c.contains("job_name: gpunet") && ALERT_RULES.contains("up{job=\"gpunet\"}"), "{c}");
        assert!(c.contains(r#"credentials_file: "/d/admin \"x\".token""#), "{c}");
        assert!(c.contains(r#"targets: ["127.0.0.1:7070"]"#) && c.contains("scheme: https"), "{c}");
    }

    #[test]
    fn every_alert_has_a_severity_summary_and_description() {
        let alerts = ALERT_RULES.matches("- alert: ").count();
        assert!(alerts >= 13, "{alerts}");
        assert_eq!(ALERT_RULES.matches("severity: ").count(), alerts);
        assert_eq!(ALERT_RULES.matches("summary: ").count(), alerts);
        assert_eq!(ALERT_RULES.matches("description: ").count(), alerts);
    }
}
