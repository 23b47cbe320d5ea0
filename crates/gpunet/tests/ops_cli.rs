//! Day-one operations with the real binary: the server's configuration file (flags win, unknown keys named), the
//! data directory's lock (a second `gpunet server` or `gpunet up` on it fails), plain and JSON log files, `gpunet up`
//! printing the `gpunet agent` command that really adds a machine, and man pages.

mod common;

use common::{free_port, json, wait_for, Proc, BIN};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `gpunet ARGS…` (stderr to `log`), waits for a stdout line containing `until`; returns the process and the
/// stdout lines read so far.
fn start(args: &[&str], log: &Path, until: &str) -> (Proc, Vec<String>) {
    let mut child = Command::new(BIN)
        .args(args)
        .env("GPUNET_LOG", "info")
        .env_remove("GPUNET_ADMIN_TOKEN")
        .env_remove("GPUNET_JOIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let proc = Proc(child);
    let mut lines = Vec::new();
    let t = Instant::now();
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "gpunet {args:?} exited early: {lines:?} {}", std::fs::read_to_string(log).unwrap_or_default());
        lines.push(line.trim_end().to_string());
        if line.contains(until) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "gpunet {args:?} did not print {until:?}: {lines:?}");
    }
    std::thread::spawn(move || for _ in out.lines() {});
    (proc, lines)
}

fn run(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN).args(args).env_remove("GPUNET_ADMIN_TOKEN").output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn server_reads_its_configuration_file_flags_win_and_unknown_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (port, flag_port) = (free_port(), free_port());
    let cfg = dir.path().join("server.toml");
    // `gpunet admin config` is a valid file: start from it and change two keys.
    let (ok, template, err) = run(&["admin", "config"]);
    assert!(ok, "{err}");
    let text = template
        .replace("listen = \"127.0.0.1:7070\"", &format!("listen = \"127.0.0.1:{port}\""))
        .replace("data_dir = \"gpunet-data\"", &format!("data_dir = {:?}", data.to_str().unwrap()))
        .replace("# admin_token = \"…\"", "admin_token = \"from-the-file\"")
        .replace("log_format = \"text\"", "log_format = \"json\"");
    assert_ne!(text, template);
    std::fs::write(&cfg, &text).unwrap();
    let log = dir.path().join("server.log");
    let (s, lines) = start(&["server", "--config", cfg.to_str().unwrap()], &log, "listening");
    assert!(lines.iter().any(|l| l.contains(&format!("http://127.0.0.1:{port}"))), "{lines:?}");
    // The admin token of the file works (the server took it rather than generating one).
    let (ok, out, err) = Command::new(BIN)
        .args(["nodes", "--output", "json"])
        .env("GPUNET_SERVER", format!("http://127.0.0.1:{port}"))
        .env("GPUNET_TOKEN", "from-the-file")
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert!(ok && json(&out).is_array(), "{out}{err}");
    // The file's log_format = "json": every log line is a JSON object, among them the warning that others can read
    // the file's token.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("other users can read it (chmod 600 it)"), "{logged}");
    for l in logged.lines() {
        assert!(serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["level"].is_string()), "not JSON: {l}");
    }
    // A second server on the same data directory (another port, by flag) is refused while the first runs.
    let (ok, _, err) =
        run(&["server", "--config", cfg.to_str().unwrap(), "--listen", &format!("127.0.0.1:{flag_port}")]);
    assert!(!ok && err.contains("in use by another gpunet process") && err.contains("gpunet.lock"), "{err}");
    drop(s);
    // Once the first is gone, the same command starts, on the port of the flag (flags win over the file).
    let (s, lines) = start(
        &["server", "--config", cfg.to_str().unwrap(), "--listen", &format!("127.0.0.1:{flag_port}")],
        &log,
        "listening",
    );
    assert!(lines.iter().any(|l| l.contains(&format!("127.0.0.1:{flag_port}"))), "{lines:?}");
    drop(s);
    // An unknown key is an error naming it (and the line), before anything starts.
    std::fs::write(&cfg, format!("{text}\nlisten_adress = \"0.0.0.0:1\"\n")).unwrap();
    let (ok, _, err) = run(&["server", "--config", cfg.to_str().unwrap()]);
    assert!(!ok && err.contains("unknown field `listen_adress`") && err.contains("server.toml"), "{err}");
}

#[test]
fn text_logs_written_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let listen = format!("127.0.0.1:{}", free_port());
    let data = dir.path().join("data");
    let (s, _) = start(&["server", "--data-dir", data.to_str().unwrap(), "--listen", &listen], &log, "listening");
    drop(s);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("INFO") && logged.contains("listening"), "{logged}");
    assert!(!logged.contains('\u{1b}'), "ANSI escape codes in a log file: {logged:?}");
}

#[test]
fn up_prints_the_agent_command_that_adds_a_machine_and_holds_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("up");
    let log = dir.path().join("up.log");
    let (up, lines) = start(
        &["up", "--data-dir", data.to_str().unwrap(), "--listen", "127.0.0.1:0", "--fake-gpus", "2xT4"],
        &log,
        "try:",
    );
    let url = lines.iter().find_map(|l| l.strip_prefix("gpunet is up at ")).expect("url").to_string();
    let token = lines.iter().find_map(|l| l.strip_prefix("join token: ")).expect("join token line").to_string();
    assert_eq!(token, std::fs::read_to_string(data.join("join.token")).unwrap().trim());
    let cmd = lines.iter().find_map(|l| l.trim().strip_prefix("gpunet agent ")).expect("agent command").to_string();
    assert!(cmd.contains(&format!("--server {url} ")) && cmd.contains(&format!("--join-token {token}")), "{cmd}");
    // Run exactly that command (another data directory, name and fake GPUs, as a second machine would have).
    let mut args: Vec<String> = cmd.split_whitespace().map(String::from).collect();
    let at = args.iter().position(|a| a == "--data-dir").expect("--data-dir in the command");
    args[at + 1] = dir.path().join("second").to_str().unwrap().to_string();
    args.extend(["--name", "second", "--fake-gpus", "1xT4"].map(String::from));
    let agent = Proc(
        Command::new(BIN)
            .arg("agent")
            .args(&args)
            .env_remove("GPUNET_JOIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let admin = std::fs::read_to_string(data.join("admin.token")).unwrap();
    let ca = data.join("tls/ca.pem");
    wait_for(Duration::from_secs(60), || {
        let o = Command::new(BIN)
            .args(["nodes", "--output", "json", "--server", &url, "--token", admin.trim()])
            .arg("--ca")
            .arg(&ca)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).contains("\"second\"")
    });
    // A second `gpunet up` on the same data directory fails at once, saying why.
    let (ok, _, err) = run(&["up", "--data-dir", data.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert!(!ok && err.contains("in use by another gpunet process"), "{err}");
    drop(agent);
    drop(up);
    // No ANSI colour codes in the log file either.
    assert!(!std::fs::read_to_string(&log).unwrap().contains('\u{1b}'));
}

#[test]
fn man_pages_are_written_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = run(&["admin", "man", dir.path().to_str().unwrap()]);
    assert!(ok && out.contains("man pages"), "{err}");
    let server = std::fs::read_to_string(dir.path().join("gpunet-server.1")).unwrap();
    assert!(server.starts_with(".ie") || server.contains(".TH gpunet-server"), "{}", &server[..200.min(server.len())]);
    assert!(server.contains("config") && server.contains("tls"), "the flags are described");
    for page in ["gpunet.1", "gpunet-up.1", "gpunet-agent.1", "gpunet-submit.1", "gpunet-admin-backup.1"] {
        assert!(dir.path().join(page).is_file(), "{page} missing");
    }
    let (ok, out, _) = run(&["completions", "bash"]);
    assert!(ok && out.contains("gpunet__server") || out.contains("server"), "completions");
}

/// The systemd units' command lines are ones this binary accepts: the server's starts a server (its paths moved into
/// a temporary directory), the agent's parses. Where `systemd-analyze` is installed, it verifies both units too.
#[test]
fn the_systemd_units_run_this_binary_with_flags_it_accepts() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd");
    let dir = tempfile::tempdir().unwrap();
    let exec = |unit: &str| -> Vec<String> {
        let text = std::fs::read_to_string(units.join(unit)).unwrap();
        let line = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
        let mut words: Vec<String> = line.split_whitespace().map(String::from).collect();
        assert_eq!(words.remove(0), "/usr/local/bin/gpunet", "{unit} runs the installed binary");
        words
    };
    let cfg = dir.path().join("server.toml");
    let (ok, template, _) = run(&["admin", "config"]);
    assert!(ok);
    std::fs::write(&cfg, template.replace("127.0.0.1:7070", &format!("127.0.0.1:{}", free_port()))).unwrap();
    let args: Vec<String> = exec("gpunet-server.service")
        .into_iter()
        .map(|w| match w.as_str() {
            "/etc/gpunet/server.toml" => cfg.to_str().unwrap().to_string(),
            "/var/lib/gpunet" => dir.path().join("data").to_str().unwrap().to_string(),
            _ => w,
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (s, _) = start(&args, &dir.path().join("log"), "listening");
    drop(s);
    assert!(dir.path().join("data/gpunet.db").is_file(), "the unit's --data-dir holds the database");
    // The agent's: the flags parse (the server comes from GPUNET_SERVER in its environment file).
    let mut agent = exec("gpunet-agent.service");
    agent.push("--help".into());
    let o = Command::new(BIN).args(&agent).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if analyze.is_err() {
        eprintln!("skipped: systemd-analyze verify (systemd-analyze is not installed)");
        return;
    }
    for unit in ["gpunet-server.service", "gpunet-agent.service"] {
        let text = std::fs::read_to_string(units.join(unit))
            .unwrap()
            .replace("/usr/local/bin/gpunet", BIN)
            .lines()
            .filter(|l| !l.starts_with("Documentation="))
            .collect::<Vec<_>>()
            .join("\n");
        let path = dir.path().join(unit);
        std::fs::write(&path, text).unwrap();
        let o = Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !err.contains(unit), "systemd-analyze verify {unit}: {err}");
    }
}

/// Commands that print a document (`completions`, `prices`, `admin alert-rules`, `admin config`) end quietly with
/// status 0 when their reader has gone (`gpunet completions bash | head -1`), not with a panic.
#[test]
fn printing_into_a_closed_pipe_ends_quietly() {
    for args in [&["completions", "bash"][..], &["prices"], &["admin", "alert-rules"], &["admin", "config"]] {
        let mut child = Command::new(BIN).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // The reader goes away before the first byte is written: every write meets EPIPE.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !err.contains("panicked"), "gpunet {args:?}: {:?} {err}", o.status);
    }
}
