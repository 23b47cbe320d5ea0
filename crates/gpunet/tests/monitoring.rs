//! Monitoring end to end: the alert rules pass `promtool check rules` and their unit tests (`promtool test rules`),
//! `gpunet admin alert-rules` prints them; and a real Prometheus (Debian's `prometheus`) scrapes a live gpunet (a
//! server and an agent whose fake GPUs send `--fake-gpu-samples`), loads the rules, and answers every query of every
//! Grafana dashboard in `deploy/grafana/dashboards` with data, template variables substituted from what Prometheus
//! holds. `/metrics` carries every family the rules and dashboards use and passes `promtool check metrics`.
//!
//! Without `promtool` or `prometheus` the tests say they skip; under `CI=true` they fail instead.

mod common;

use common::{free_port, json, wait_for, Proc, Server, BIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Whether `tool` can run; when it cannot, the test skips (prints why) unless `CI=true`, where it fails.
fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} (Debian package prometheus) must be installed under CI; .ci/run installs it"
        );
        eprintln!("skipped: {tool} is not installed (Debian package prometheus)");
    }
    ok
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests_and_the_cli_prints_them() {
    let dir = deploy().join("prometheus");
    let o = Command::new(BIN).args(["admin", "alert-rules"]).output().unwrap();
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        std::fs::read_to_string(dir.join("gpunet-rules.yml")).unwrap(),
        "gpunet admin alert-rules prints the shipped file"
    );
    if !have("promtool") {
        return;
    }
    let o = Command::new("promtool").args(["check", "rules", "gpunet-rules.yml"]).current_dir(&dir).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && out.contains("SUCCESS"), "{out}");
    let o =
        Command::new("promtool").args(["test", "rules", "gpunet-rules.test.yml"]).current_dir(&dir).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && out.contains("SUCCESS"), "{out}");
    // Every rule has a test case: each alert name appears in the tests, with a firing and a quiet evaluation.
    let rules = std::fs::read_to_string(dir.join("gpunet-rules.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("gpunet-rules.test.yml")).unwrap();
    let names: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(names.len() >= 13, "{names:?}");
    for n in names {
        let cases = tests.matches(&format!("alertname: {n}\n")).count();
        assert!(cases >= 2, "{n}: {cases} evaluations in the tests (one firing, one not, at least)");
    }
}

/// GET `path` of Prometheus with URL-encoded parameters; the JSON answer.
fn prom(url: &str, path: &str, params: &[(&str, &str)]) -> serde_json::Value {
    let mut c = Command::new("curl");
    c.args(["-s", "-G", &format!("{url}{path}")]);
    for (k, v) in params {
        c.args(["--data-urlencode", &format!("{k}={v}")]);
    }
    let o = c.output().unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// Escapes a label value for a PromQL regular expression.
fn regex_escape(v: &str) -> String {
    v.chars().fold(String::new(), |mut s, c| {
        if "\\.+*?()|[]{}^$".contains(c) {
            s.push('\\');
        }
        s.push(c);
        s
    })
}

/// Every panel's queries (nested rows included): (panel title, expression).
fn panel_queries(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
    for p in panels.as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((p["title"].as_str().unwrap_or("").to_string(), e.to_string()));
            }
        }
        panel_queries(&p["panels"], out);
    }
}

#[test]
fn prometheus_scrapes_a_live_gpunet_and_every_dashboard_query_returns_data() {
    if !have("prometheus") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), free_port(), &[]);
    let _agent = s.agent_with("n1", "2xT4", dir.path(), "127.0.0.1", &["--fake-gpu-samples"]);
    // A tenant with a quota, a job that ended, one running and one held by the quota's limit.
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "ta"]);
    assert!(ok, "{err}");
    let (ok, _, err) = s.cli("admin-secret", &["quota", "ta", "--gpus", "1", "--limit", "2"]);
    assert!(ok, "{err}");
    let submit = |args: &[&str]| {
        let mut a = vec!["submit", "--tenant", "ta", "--output", "json"];
        a.extend_from_slice(args);
        let (ok, out, err) = s.cli("admin-secret", &a);
        assert!(ok, "{out}{err}");
        json(&out)["id"].as_u64().unwrap()
    };
    let done = submit(&["--gpus", "1", "--", "true"]);
    wait_for(Duration::from_secs(30), || s.job_state(done) == "succeeded");
    let running = submit(&["--gpus", "1", "--", "sleep", "600"]);
    let held = submit(&["--gpus", "2", "--", "sleep", "600"]);
    wait_for(Duration::from_secs(30), || s.job_state(running) == "running");
    assert_eq!(s.job_state(held), "pending");
    // A job held by its user and one waiting for `running` to succeed are in no queue: neither counts as pending
    // (no starvation or quota alert for them); each has its own gauge.
    let _on_hold = submit(&["--gpus", "1", "--hold", "--", "true"]);
    let _after = submit(&["--gpus", "1", "--dependency", &format!("afterok:{running}"), "--", "true"]);

    // /metrics: every family the rules and dashboards use, and promtool's check. The held GPU reads busy from the
    // first sample its agent takes after starting the job (every 5 s).
    let busy =
        "gpunet_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",model=\"T4\",job_id=\"2\",fake=\"true\",zone=\"z1\"} 0.5";
    wait_for(Duration::from_secs(30), || s.get("/metrics").contains(busy));
    let text = s.get("/metrics");
    for family in [
        "gpunet_tenant_gpus_allocated{tenant=\"ta\"} 1",
        "gpunet_tenant_gpu_guarantee{tenant=\"ta\"} 1",
        "gpunet_tenant_gpu_limit{tenant=\"ta\"} 2",
        "gpunet_tenant_gpus_borrowed{tenant=\"ta\"} 0",
        "gpunet_tenant_pending_jobs{tenant=\"ta\"} 1",
        "gpunet_tenant_pending_gpus{tenant=\"ta\"} 2",
        "gpunet_tenant_held_jobs{tenant=\"ta\"} 1",
        "gpunet_tenant_dependency_waiting_jobs{tenant=\"ta\"} 1",
        "gpunet_tenant_oldest_pending_seconds{tenant=\"ta\"}",
        "gpunet_tenant_gpu_seconds_total{tenant=\"ta\"}",
        "gpunet_tenant_cost_total{tenant=\"ta\"}",
        "gpunet_node_state{node=\"n1\",state=\"ready\"} 1",
        "gpunet_node_state{node=\"n1\",state=\"lost\"} 0",
        "gpunet_node_sync_age_seconds{node=\"n1\"}",
        "gpunet_jobs{tenant=\"ta\",state=\"succeeded\"} 1",
        "gpunet_job_pending_duration_seconds_bucket",
        "gpunet_job_not_running_duration_seconds_count 1",
        "gpunet_eviction_duration_seconds_bucket",
        "gpunet_store_commit_duration_seconds_bucket",
        "gpunet_scheduling_pass_duration_seconds_bucket",
        "gpunet_checkpoint_copy_failures_total{node=\"n1\"} 0",
        "gpunet_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",model=\"T4\",job_id=\"2\",fake=\"true\",zone=\"z1\"} 0.5",
        "gpunet_gpu_memory_used_bytes{node=\"n1\",gpu=\"1\",model=\"T4\",job_id=\"\",fake=\"true\",zone=\"z1\"} 0\n",
        "gpunet_gpu_nvlink_tx_bytes_total{",
        "gpunet_gpu_ecc_corrected_errors_total{",
        "gpunet_gpu_ecc_uncorrected_errors_total{",
        "gpunet_gpu_xid_errors_total{node=\"n1\",gpu=\"1\",model=\"T4\",job_id=\"\",fake=\"true\",zone=\"z1\"} 0",
        "gpunet_gpu_xid_last_code{",
    ] {
        assert!(text.contains(family), "{family} missing from /metrics:\n{text}");
    }
    if have("promtool") {
        let mut p = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut p.stdin.take().unwrap(), text.as_bytes()).unwrap();
        let o = p.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    // A real Prometheus scraping it every second with the shipped rules.
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "admin-secret").unwrap();
    let rules = deploy().join("prometheus/gpunet-rules.yml").canonicalize().unwrap();
    let target = s.url.trim_start_matches("http://");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: gpunet\n    authorization:\n      credentials_file: {}\n\
             \x20   static_configs:\n      - targets: [\"{target}\"]\n",
            rules.display(),
            token.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prom = Proc(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let log_text = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    // Enough scrapes for rates over 30 s windows.
    let t = Instant::now();
    while prom(&url, "/api/v1/query", &[("query", "count_over_time(up{job=\"gpunet\"}[1m]) >= 5 and up == 1")])["data"]
        ["result"]
        .as_array()
        .is_none_or(|r| r.is_empty())
    {
        assert!(t.elapsed() < Duration::from_secs(90), "Prometheus did not scrape gpunet:\n{}", log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every rule loaded and evaluated without error.
    wait_for(Duration::from_secs(30), || {
        let r = prom(&url, "/api/v1/rules", &[]);
        let rules: Vec<&serde_json::Value> = r["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        rules.len() >= 13 && rules.iter().all(|x| x["health"] == "ok")
    });

    // Every dashboard panel's query, with its variables' values from Prometheus.
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("grafana/dashboards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for f in files {
        let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let mut vars: Vec<(String, String)> = Vec::new();
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] != "query" {
                continue;
            }
            let def = v["definition"].as_str().unwrap();
            let inner = def.strip_prefix("label_values(").and_then(|x| x.strip_suffix(')')).unwrap();
            let (metric, label) = inner.split_once(',').unwrap();
            let (metric, label) = (metric.trim(), label.trim());
            let series = prom(&url, "/api/v1/series", &[("match[]", metric)]);
            let mut values: Vec<String> = series["data"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s[label].as_str().map(regex_escape))
                .collect();
            values.sort();
            values.dedup();
            if values.is_empty() {
                failures.push(format!("{name}: variable {} ({def}) has no values", v["name"]));
                continue;
            }
            vars.push((format!("${}", v["name"].as_str().unwrap()), format!("({})", values.join("|"))));
        }
        vars.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        let mut queries = Vec::new();
        panel_queries(&d["panels"], &mut queries);
        for (title, expr) in queries {
            let mut q = expr.replace("$__rate_interval", "30s").replace("$__range", "5m").replace("$__interval", "5s");
            for (k, v) in &vars {
                q = q.replace(k, v);
            }
            checked += 1;
            // Data may need a few more scrapes (rates); a query that does not parse fails at once.
            let t = Instant::now();
            loop {
                let r = prom(&url, "/api/v1/query", &[("query", &q)]);
                if r["status"] != "success" {
                    failures.push(format!("{name} / {title}: {q}: {}", r["error"]));
                    break;
                }
                if r["data"]["result"].as_array().is_some_and(|a| !a.is_empty()) {
                    break;
                }
                if t.elapsed() > Duration::from_secs(20) {
                    failures.push(format!("{name} / {title}: {q}: no data"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    assert!(checked >= 40, "only {checked} queries");
    assert!(failures.is_empty(), "{} of {checked} dashboard queries failed:\n{}", failures.len(), failures.join("\n"));

    let metrics = || s.get("/metrics");
    // An XID error on fake GPU 1 (listed in the agent's fake-errors file): the agent reports it with its next sample,
    // /metrics counts it, and the shipped GpuErrors rule fires for that GPU, saying it is an XID error.
    std::fs::write(dir.path().join("n1/fake-gpu-errors"), "1 xid 79\n").unwrap();
    wait_for(Duration::from_secs(30), || {
        metrics().contains(
            "gpunet_gpu_xid_errors_total{node=\"n1\",gpu=\"1\",model=\"T4\",job_id=\"\",fake=\"true\",zone=\"z1\"} 1",
        )
    });
    assert!(metrics().contains(
        "gpunet_gpu_xid_last_code{node=\"n1\",gpu=\"1\",model=\"T4\",job_id=\"\",fake=\"true\",zone=\"z1\"} 79"
    ));
    let t = Instant::now();
    loop {
        let r = prom(&url, "/api/v1/query", &[("query", "ALERTS{alertname=\"GpuErrors\",alertstate=\"firing\"}")]);
        let firing = r["data"]["result"].as_array().cloned().unwrap_or_default();
        if !firing.is_empty() {
            assert_eq!(firing.len(), 1, "only GPU 1 had an error: {r}");
            let l = &firing[0]["metric"];
            assert_eq!(
                (l["node"].as_str(), l["gpu"].as_str(), l["error"].as_str()),
                (Some("n1"), Some("1"), Some("XID"))
            );
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "GpuErrors did not fire: {r}\n{}", log_text());
        std::thread::sleep(Duration::from_millis(250));
    }

    // Draining the node evicts the running job: its agent stops it, and the eviction's latency is observed once.
    assert!(metrics().contains("gpunet_eviction_duration_seconds_count 0"));
    let (ok, out, err) = s.cli("admin-secret", &["drain", "n1"]);
    assert!(ok, "{out}{err}");
    wait_for(Duration::from_secs(30), || metrics().contains("gpunet_eviction_duration_seconds_count 1"));
    assert!(metrics().contains("gpunet_node_state{node=\"n1\",state=\"draining\"} 1"));
}

/// Starts `gpunet up` with `extra` flags; returns the process and its stdout lines up to "gpunet is up" (or its end).
fn up(dir: &Path, extra: &[&str], path: Option<&str>) -> (Proc, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut c = Command::new(BIN);
    c.args(["up", "--data-dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0", "--fake-gpus", "1xT4"]).args(extra);
    if let Some(p) = path {
        c.env("PATH", p);
    }
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    let t = Instant::now();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        lines.push(line.trim().to_string());
        if lines.iter().any(|l| l.starts_with("prometheus: ")) || (extra.is_empty() && line.contains("gpunet is up")) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "gpunet up did not start: {lines:?}");
    }
    std::thread::spawn(move || for _ in out.lines() {});
    (Proc(child), lines)
}

#[test]
fn up_with_prometheus_runs_it_scraping_the_server_with_the_rules_and_stops_it() {
    if !have("prometheus") {
        return;
    }
    // Without Prometheus on PATH, a clear refusal.
    let dir = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let (mut p, _) = up(dir.path(), &["--with-prometheus"], Some(empty.path().to_str().unwrap()));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!p.0.wait().unwrap().success() && err.contains("no `prometheus` on PATH"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (p, lines) = up(dir.path(), &["--with-prometheus", "--prometheus-listen", &listen], None);
    let url = format!("http://{listen}");
    assert!(lines.iter().any(|l| l.starts_with(&format!("prometheus: {url}"))), "{lines:?}");
    let config = std::fs::read_to_string(dir.path().join("prometheus/prometheus.yml")).unwrap();
    assert!(config.contains("credentials_file") && config.contains("scheme: https"), "{config}");
    // It scrapes the server over TLS with the admin token, and loads every rule.
    let log = || std::fs::read_to_string(dir.path().join("prometheus/prometheus.log")).unwrap_or_default();
    let t = Instant::now();
    loop {
        let r =
            prom(&url, "/api/v1/query", &[("query", "up{job=\"gpunet\"} == 1 and on() gpunet_store_writable == 1")]);
        if r["data"]["result"].as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(90), "Prometheus did not scrape gpunet up: {r}\n{}", log());
        std::thread::sleep(Duration::from_millis(250));
    }
    let rules = prom(&url, "/api/v1/rules", &[]);
    let n: usize =
        rules["data"]["groups"].as_array().unwrap().iter().map(|g| g["rules"].as_array().unwrap().len()).sum();
    assert!(n >= 13, "{rules}");
    // Stopping `gpunet up` stops its Prometheus.
    drop(p);
    wait_for(Duration::from_secs(20), || {
        !Command::new("curl").args(["-sf", &format!("{url}/-/ready")]).status().unwrap().success()
    });
}

/// The value of the sample `series` (name and labels, exactly as `/metrics` writes them) in a scrape.
fn sample_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from /metrics:\n{text}"))
}

/// Cumulative counters continue when the server restarts on the same data directory: a tenant's GPU-seconds and
/// cost start from the ledger (before, they started from 0 plus running jobs, which Prometheus read as a reset and
/// then counted the running jobs' usage again), and so do the counts of submissions, preemptions and restarts.
#[test]
fn cumulative_counters_continue_when_the_server_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let s = Server::start(dir.path(), port, &[]);
    let _agent = s.agent("n1", "2xT4", dir.path(), "127.0.0.1");
    for t in ["ta", "tb"] {
        let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", t]);
        assert!(ok, "{err}");
    }
    let submit = |tenant: &str, args: &[&str]| {
        let mut a = vec!["submit", "--tenant", tenant, "--output", "json"];
        a.extend_from_slice(args);
        let (ok, out, err) = s.cli("admin-secret", &a);
        assert!(ok, "{out}{err}");
        json(&out)["id"].as_u64().unwrap()
    };
    let done = submit("ta", &["--gpus", "1", "--", "sleep", "2"]);
    wait_for(Duration::from_secs(30), || s.job_state(done) == "succeeded");
    let running = submit("tb", &["--gpus", "1", "--", "sleep", "600"]);
    wait_for(Duration::from_secs(30), || s.job_state(running) == "running");
    let before = s.get("/metrics");
    let ended = "gpunet_tenant_gpu_seconds_total{tenant=\"ta\"}";
    assert!(sample_value(&before, ended) >= 2.0, "{before}");
    assert!(sample_value(&before, "gpunet_tenant_cost_total{tenant=\"ta\"}") > 0.0, "{before}");
    assert_eq!(sample_value(&before, "gpunet_jobs_submitted_total"), 2.0);

    // The same server again, on the same data directory and port (the agent keeps its task running meanwhile).
    drop(s);
    let s = Server::start(dir.path(), port, &[]);
    let after = s.get("/metrics");
    for series in [
        ended,
        "gpunet_tenant_cost_total{tenant=\"ta\"}",
        "gpunet_jobs_submitted_total",
        "gpunet_preemptions_total",
        "gpunet_restarts_total",
    ] {
        assert_eq!(sample_value(&after, series), sample_value(&before, series), "{series}");
    }
    // The running job's usage so far is counted once: at least what it was, not reset to less.
    for series in ["gpunet_tenant_gpu_seconds_total{tenant=\"tb\"}", "gpunet_tenant_cost_total{tenant=\"tb\"}"] {
        assert!(sample_value(&after, series) >= sample_value(&before, series), "{series}: {before}\n{after}");
    }
    assert_eq!(s.job_state(running), "running");
}
