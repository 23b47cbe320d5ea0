//! The web portal end to end: `gpunet up` on loopback driven by headless Chromium (Playwright through
//! `playwright-core`, `e2e/portal.mjs`). Screenshots of every page land in `target/portal-screenshots/`.
//!
//! Needs Node.js, `npm ci --prefix e2e` and Debian's `chromium` (`.ci/run` installs them). Where they are missing the
//! test says so and passes, except under CI (`CI` set), where it fails.

mod common;

use common::{Proc, BIN};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn missing_tools() -> Option<String> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        return Some(format!("{chromium} is missing (apt-get install chromium)"));
    }
    if Command::new("node").arg("--version").output().map_or(true, |o| !o.status.success()) {
        return Some("node is missing".into());
    }
    if !repo().join("e2e/node_modules/playwright-core").exists() {
        return Some("e2e/node_modules is missing (npm ci --prefix e2e)".into());
    }
    None
}

#[test]
fn portal_end_to_end_in_headless_chromium() {
    if let Some(why) = missing_tools() {
        assert!(std::env::var_os("CI").is_none(), "the portal test cannot run under CI: {why}");
        eprintln!("SKIPPED portal end-to-end test: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        // A spot pool that stays empty (no job here allows spot): its card is on the overview.
        .args([
            "up",
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--spot-pool",
            "0..2x1xA10",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let up = Proc(child);
    let mut line = String::new();
    let t = Instant::now();
    let url = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "gpunet up exited before it was up");
        if let Some(u) = line.trim().strip_prefix("gpunet is up at ") {
            break u.to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "gpunet up did not start");
    };
    std::thread::spawn(move || for _ in out.lines() {});
    let token = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    let ca = dir.path().join("tls/ca.pem");
    assert!(url.starts_with("https://"), "{url}");
    // The page is served with its assets, from the binary, over TLS with the data directory's CA.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (status, csp, body) = rt.block_on(async {
        let roots = reqwest::Certificate::from_pem_bundle(&std::fs::read(&ca).unwrap()).unwrap();
        let http = reqwest::Client::builder().tls_certs_only(roots).build().unwrap();
        let r = http.get(format!("{url}/")).send().await.unwrap();
        let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
        (r.status().as_u16(), csp, r.text().await.unwrap())
    });
    assert_eq!(status, 200);
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(body.contains("/portal/app.js"));
    let shots = repo().join("target/portal-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let o = Command::new("node")
        .arg("portal.mjs")
        .current_dir(repo().join("e2e"))
        .env("GPUNET_URL", &url)
        .env("GPUNET_TOKEN", token.trim())
        .env("NODE_EXTRA_CA_CERTS", &ca)
        .env("GPUNET_SCREENSHOTS", &shots)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the browser test failed (see above)");
    for page in ["overview", "queue", "jobs", "job-succeeded", "submit-dry-run", "tenants", "nodes", "login"] {
        assert!(
            std::fs::read_dir(&shots).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains(page)),
            "no screenshot of {page}"
        );
    }
    // The portal's statement is the CLI's: the same header and, for every job whose figures are final (it ended),
    // the same line. (A running job's figures grow between the two reads.)
    let portal = std::fs::read_to_string(shots.join("statement-default.csv")).expect("the portal's statement");
    let month = portal.lines().last().and_then(|l| l.split(',').nth(1)).expect("a month").to_string();
    let cli = Command::new(BIN)
        .args(["report", "--statement", "--tenant", "default", "--month", &month, "--server", &url])
        .args(["--token", token.trim(), "--ca", ca.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let cli = String::from_utf8(cli.stdout).unwrap();
    assert_eq!(portal.lines().next(), cli.lines().next(), "the header");
    let ended = |l: &&str| matches!(l.split(',').nth(5), Some("succeeded" | "failed" | "cancelled"));
    let finished: Vec<&str> = portal.lines().filter(ended).collect();
    assert!(!finished.is_empty(), "no ended job in the statement:\n{portal}");
    // Text fields equal; figures equal up to the last bits of an f64 (the two sum the ledger's rows apart).
    let same = |a: &str, b: &str| {
        let (a, b): (Vec<&str>, Vec<&str>) = (a.split(',').collect(), b.split(',').collect());
        a.len() == b.len()
            && a.iter().zip(&b).all(|(x, y)| match (x.parse::<f64>(), y.parse::<f64>()) {
                (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-12),
                _ => x == y,
            })
    };
    for l in &finished {
        assert!(cli.lines().any(|c| same(c, l)), "the portal's line {l:?} is not the CLI's:\n{cli}");
    }
    drop(up);
}
