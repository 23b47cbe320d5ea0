//! Billing end to end: a job run live on a fake-GPU agent costs what the simulator charges for the same job (the same
//! GPUs, CPU and memory for the same run time), GPU, CPU and memory apart, to the cent; a spot node bills the
//! catalogue's spot price; and `gpunet bill` shows a live job's cost.

mod common;

use common::{free_port, json, submit_yaml, wait_for, Proc, Server};
use gpunet_sim::{read_trace_from, simulate, ClusterSpec, ReadOptions, SimConfig, SpotJobs};
use std::path::Path;
use std::time::Duration;

/// Prices large enough that a few seconds cost dollars, so that cents tell them apart: per second, 10 per on-demand
/// A100, 4 per spot A100, 1 per CPU core, 0.1 per GiB of memory.
const OD_A100_HOUR: f64 = 36_000.0;
const SPOT_A100_HOUR: f64 = 14_400.0;

/// The catalogue as a `--prices` file (`table` = "") or as a cluster spec's `[prices]` table (`table` = "prices.").
fn catalogue(table: &str) -> String {
    let head = if table.is_empty() { String::new() } else { "[prices]\n".to_string() };
    format!(
        "{head}currency = \"EUR\"\ncpu_core_hour = 3600.0\nmem_gib_hour = 360.0\n\
         [{table}gpu.default]\non_demand = 1.0\n\
         [{table}gpu.\"A100-80GB\"]\non_demand = {OD_A100_HOUR:?}\nspot = {SPOT_A100_HOUR:?}\n"
    )
}

/// An agent with one fake A100 and these labels.
fn agent(s: &Server, dir: &Path, name: &str, labels: &str) -> Proc {
    s.agent_with(name, "1xA100-80GB", dir, "127.0.0.1", &["--labels", labels])
}

fn usage(s: &Server) -> serde_json::Value {
    json(&s.get(&format!("/v1/usage?from_ms=0&to_ms={}", gpunet_server::now_ms() + 60_000)))
}

fn cents(x: f64) -> i64 {
    (x * 100.0).round() as i64
}

/// What the simulator charges for one job of 1 GPU, 2 cores and 8 GiB that runs `secs` seconds on one A100 node of
/// `lifecycle`, priced by the same catalogue: (GPU, CPU, memory) cost.
fn simulated(lifecycle: &str, secs: u64) -> (f64, f64, f64, String) {
    let spec = format!(
        "version = 1\n[[node_group]]\ncount = 1\ngpus_per_node = 1\ngpu_model = \"A100-80GB\"\n\
         lifecycle = \"{lifecycle}\"\n{}",
        catalogue("prices.")
    );
    let cluster = ClusterSpec::from_toml(&spec, "billing").unwrap();
    let csv = format!("id,submit_s,duration_s,gpus,tenant,cpu_milli,memory_mib\nj1,0,{secs},1,t,2000,8192\n");
    let trace = read_trace_from(csv.as_bytes(), "billing.csv", ReadOptions::default()).unwrap();
    let cfg = SimConfig { spot_jobs: SpotJobs::All, ..SimConfig::default() };
    let r = simulate(&trace, &cluster, &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(r.completed, 1, "{r:?}");
    assert_eq!(cents(r.cost), cents(r.cost_gpu + r.cost_cpu + r.cost_mem));
    let (od, spot) = if lifecycle == "spot" { (0.0, r.cost) } else { (r.cost, 0.0) };
    assert_eq!((cents(r.cost_on_demand), cents(r.cost_spot)), (cents(od), cents(spot)), "{lifecycle}");
    (r.cost_gpu, r.cost_cpu, r.cost_mem, r.currency)
}

#[test]
fn a_live_job_costs_what_the_simulator_charges_to_the_cent_and_a_spot_node_bills_the_spot_price() {
    let dir = tempfile::tempdir().unwrap();
    let prices = dir.path().join("prices.toml");
    std::fs::write(&prices, catalogue("")).unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &["--prices", prices.to_str().unwrap()]);
    assert!(s.cli("admin-secret", &["tenants", "--create", "t"]).0);
    let _od = agent(&s, dir.path(), "n-od", "zone=z1");
    let _spot = agent(&s, dir.path(), "n-spot", "zone=z1,lifecycle=spot");
    let (_, nodes, _) = s.cli("admin-secret", &["nodes", "--output", "json"]);
    let price = |name: &str| {
        json(&nodes).as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["price_per_gpu_hour"].as_f64()
    };
    assert_eq!((price("n-od"), price("n-spot")), (Some(OD_A100_HOUR), Some(SPOT_A100_HOUR)), "{nodes}");
    let mut jobs = Vec::new();
    for lifecycle in ["on-demand", "spot"] {
        let yaml = format!(
            "name: bill-{lifecycle}\ntenant: t\ngpus: 1\ncpu: 2\nmemory: 8Gi\nselector: {{lifecycle: {lifecycle}}}\n\
             command: [sh, -c, 'sleep 2']\n"
        );
        jobs.push((lifecycle, submit_yaml(&s, dir.path(), &yaml)));
    }
    wait_for(Duration::from_secs(60), || jobs.iter().all(|(_, id)| s.job_state(*id) == "succeeded"));
    let report = usage(&s);
    assert_eq!(report["currency"], "EUR", "{report}");
    for (lifecycle, id) in jobs {
        let u = &report["jobs"][id.to_string()];
        let f = |k: &str| u[k].as_f64().unwrap_or_else(|| panic!("{k} of job {id}: {report}"));
        // The run time the live ledger billed: whole seconds of one GPU.
        let secs = (f("gpu_hours") * 3600.0).round() as u64;
        assert!((2..=10).contains(&secs), "{lifecycle}: billed {secs} s for a 2 s job: {u}");
        assert!((f("cpu_hours") * 3600.0 - 2.0 * secs as f64).abs() < 1e-6, "2 cores: {u}");
        let (gpu, cpu, mem, currency) = simulated(lifecycle, secs);
        assert_eq!(currency, "EUR");
        assert_eq!(
            (cents(f("gpu_cost")), cents(f("cpu_cost")), cents(f("mem_cost"))),
            (cents(gpu), cents(cpu), cents(mem)),
            "{lifecycle}: live {u} vs simulated {gpu} {cpu} {mem}"
        );
        assert_eq!(cents(f("cost")), cents(gpu + cpu + mem));
        // Per second: a GPU at its lifecycle's catalogue price, 2 cores at 1, 8 GiB at 0.1.
        let gpu_hour = if lifecycle == "spot" { SPOT_A100_HOUR } else { OD_A100_HOUR };
        assert_eq!(cents(f("gpu_cost")), cents(gpu_hour / 3600.0 * secs as f64), "{lifecycle}: {u}");
        assert_eq!((cents(f("cpu_cost")), cents(f("mem_cost"))), (200 * secs as i64, 80 * secs as i64), "{u}");
    }
    let by_model = &report["by_model"];
    assert!(by_model["A100-80GB/spot"]["gpu_cost"].as_f64() < by_model["A100-80GB/on-demand"]["gpu_cost"].as_f64());
    // `gpunet bill --by model`: a row per model and lifecycle with the ledger's figures, to the cent.
    let (ok, table, err) = s.cli("admin-secret", &["bill", "--by", "model"]);
    assert!(ok, "{err}");
    let mut lines = table.lines();
    let head = lines.next().unwrap();
    assert!(head.starts_with("MODEL/LIFECYCLE") && head.ends_with("COST (EUR)"), "{table}");
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "{table}");
    for key in ["A100-80GB/on-demand", "A100-80GB/spot"] {
        let row = rows.iter().find(|r| r[0] == key).unwrap_or_else(|| panic!("{key} missing: {table}"));
        let want = &by_model[key];
        let money = |k: &str| format!("{:.2}", want[k].as_f64().unwrap());
        assert_eq!(
            row[4..8],
            [money("gpu_cost"), money("cpu_cost"), money("mem_cost"), money("cost")],
            "{key}: {table}"
        );
    }
}

/// Live billing was always 0: agents never sent a price, and the server priced nodes by what they sent.
#[test]
fn gpunet_bill_shows_a_live_job_s_cost_priced_by_the_shipped_catalogue() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    assert!(s.cli("admin-secret", &["tenants", "--create", "t"]).0);
    let _a = agent(&s, dir.path(), "n1", "zone=z1");
    let id = s.submit(&["--gpus", "1", "--", "sh", "-c", "sleep 1"]);
    wait_for(Duration::from_secs(30), || s.job_state(id) == "succeeded");
    let (ok, table, err) = s.cli("admin-secret", &["bill"]);
    assert!(ok, "{err}");
    let mut lines = table.lines();
    let head: Vec<&str> = lines.next().unwrap().split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        head,
        ["TENANT", "GPU-HOURS", "CPU-HOURS", "MEM GIB-HOURS", "GPU COST", "CPU COST", "MEM COST", "COST (USD)"]
    );
    let row: Vec<&str> =
        lines.find(|l| l.starts_with("t ")).unwrap_or_else(|| panic!("{table}")).split_whitespace().collect();
    let cost = |i: usize| row[i].parse::<f64>().unwrap();
    // At least a second of one A100 at the shipped on-demand price (3.93 per hour).
    assert!(cost(4) >= 3.93 / 3600.0 - 1e-4 && cost(7) >= cost(4), "{table}");
    let (_, out, _) = s.cli("admin-secret", &["bill", "--output", "json"]);
    let t = &json(&out)["tenants"]["t"];
    assert!(t["cpu_cost"].as_f64().unwrap() > 0.0 && t["mem_cost"].as_f64().unwrap() > 0.0, "{out}");
    // The ledger keeps who submitted the job: `--by user` bills it to them.
    let (_, shown, _) = s.cli("admin-secret", &["show", &id.to_string(), "--output", "json"]);
    let by = json(&shown)["submitted_by"].as_str().unwrap_or_else(|| panic!("{shown}")).to_string();
    let (ok, table, err) = s.cli("admin-secret", &["bill", "--by", "user"]);
    assert!(ok, "{err}");
    assert!(table.starts_with("TENANT/USER"), "{table}");
    let row = table.lines().find(|l| l.starts_with(&format!("t/{by} "))).unwrap_or_else(|| panic!("{by}: {table}"));
    assert_eq!(row.split_whitespace().last().unwrap().parse::<f64>().unwrap(), cost(7), "{table}");
    // Any period: this month and today's dates hold the job's whole cost; a month long past holds nothing.
    let day = |fmt: &str| {
        let o = std::process::Command::new("date").args(["-u", fmt]).output().unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let (today, month) = (day("+%Y-%m-%d"), day("+%Y-%m"));
    let total = |args: &[&str]| {
        let mut a = vec!["bill", "--output", "json"];
        a.extend_from_slice(args);
        let (ok, out, err) = s.cli("admin-secret", &a);
        assert!(ok, "{args:?}: {err}");
        json(&out)["tenants"]["t"]["cost"].as_f64().unwrap_or(0.0)
    };
    let all = total(&[]);
    assert!(all > 0.0);
    assert_eq!(total(&["--month", &month]), all, "--month {month}");
    assert_eq!(total(&["--from", &today]), all, "--from {today}");
    assert_eq!(total(&["--from", "2020-01-01", "--to", "2020-02-01"]), 0.0);
    let (ok, _, err) = s.cli("admin-secret", &["bill", "--from", "2026-02-30"]);
    assert!(!ok && err.contains("invalid --from"), "{err}");
}
