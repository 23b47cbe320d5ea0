//! `gpunet task-exec`, the task wrapper, run directly (as the agent runs it: root, an empty environment), with and
//! without its PID namespace.

mod common;

use std::path::Path;
use std::process::Command;

fn task_exec(args: &[&str]) -> std::process::Output {
    Command::new(common::BIN).arg("task-exec").args(args).env_clear().env("PATH", "/usr/bin:/bin").output().unwrap()
}

fn modes() -> [&'static [&'static str]; 2] {
    [&[], &["--pid-namespace"]]
}

#[test]
fn the_status_file_says_how_the_task_ended() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("status");
    let st = st.to_str().unwrap();
    for ns in modes() {
        let run = |prog: &[&str]| {
            let mut a = vec!["--status", st];
            a.extend(ns);
            a.push("--");
            a.extend(prog);
            let o = task_exec(&a);
            (o.status, common::read(Path::new(st)), String::from_utf8_lossy(&o.stderr).into_owned())
        };
        use std::os::unix::process::ExitStatusExt;
        let (s, line, _) = run(&["sh", "-c", "exit 3"]);
        assert_eq!((s.code(), line.as_str()), (Some(3), "exit 3"), "{ns:?}");
        // Killed by a signal: the wrapper ends the same way (the init, a PID 1, only says so).
        let (s, line, _) = run(&["sh", "-c", "kill -TERM $$"]);
        assert_eq!((s.signal(), line.as_str()), (Some(15), "signal 15"), "{ns:?}");
        let (s, line, err) = run(&["/nonexistent/program"]);
        assert_eq!((s.code(), line.as_str()), (Some(127), "exit 127"), "{ns:?}");
        assert!(err.contains("/nonexistent/program"), "{err}");
    }
    // The wrapper makes the file (the agent no longer does before the start): root's alone, and never through a
    // symlink planted where it goes.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::remove_file(st).unwrap();
    assert!(task_exec(&["--status", st, "--", "true"]).status.success());
    assert_eq!(std::fs::metadata(st).unwrap().permissions().mode() & 0o777, 0o600);
    std::fs::remove_file(st).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&elsewhere, "kept").unwrap();
    std::os::unix::fs::symlink(&elsewhere, st).unwrap();
    assert!(task_exec(&["--status", st, "--", "true"]).status.success());
    assert_eq!(common::read(&elsewhere), "kept");
}

#[test]
fn the_task_gets_exactly_its_environment_user_and_directory_and_no_blocked_or_ignored_signal() {
    let dir = tempfile::tempdir().unwrap();
    let env = dir.path().join("env");
    std::fs::write(&env, b"PATH=/usr/bin:/bin\0ODD=a b=c\nd\0").unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::os::unix::fs::chown(&work, Some(200_002), Some(200_002)).unwrap();
    std::os::unix::fs::chown(dir.path(), Some(200_002), Some(200_002)).unwrap();
    for ns in modes() {
        let run = |prog: &[&str]| {
            let mut a = vec!["--status", "-", "--user", "200002:200002", "--env-file", env.to_str().unwrap()];
            a.extend(["--cwd", work.to_str().unwrap()]);
            a.extend(ns);
            a.push("--");
            a.extend(prog);
            let o = task_exec(&a);
            assert!(o.status.success(), "{ns:?}: {}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        // The task's own state as it starts (grep itself is the task: a shell blocks signals around its forks).
        let out = run(&["sh", "-c", "env; pwd; id -u; id -G; echo $$"])
            + &run(&["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"]);
        assert!(out.contains("ODD=a b=c\nd\n") && out.contains("PATH=/usr/bin:/bin"), "{out}");
        assert!(!out.contains("HOME=") && !out.contains("CARGO"), "nothing of the wrapper's own: {out}");
        assert!(
            out.contains(&format!("{}\n200002\n200002\n", work.display())),
            "directory, uid, only its group: {out}"
        );
        assert!(out.contains("SigBlk:\t0000000000000000\n"), "nothing blocked: {out}");
        // SIGPIPE (ignored by Rust programs) and the forwarded signals are back to their defaults.
        let ign = out.lines().find_map(|l| l.strip_prefix("SigIgn:\t")).unwrap();
        let ign = u64::from_str_radix(ign, 16).unwrap();
        for sig in [1, 2, 3, 10, 12, 13, 15] {
            assert_eq!(ign & (1 << (sig - 1)), 0, "signal {sig} ignored: {out}");
        }
        let pid = out.lines().rev().nth(2).unwrap();
        assert_eq!(pid == "2", !ns.is_empty(), "PID 2 (after its init) in a namespace: {out}");
    }
}

#[test]
fn a_namespace_s_leftovers_die_with_its_task() {
    // A task that leaves a daemon behind: without a cgroup, only the namespace's end takes it.
    let marker = format!("300.9{}", std::process::id());
    let o = task_exec(&[
        "--status",
        "-",
        "--pid-namespace",
        "--",
        "sh",
        "-c",
        &format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo started"),
    ]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("started"));
    let left = Command::new("pgrep").args(["-f", &format!("sleep {marker}")]).output().unwrap();
    assert!(left.stdout.is_empty(), "left running: {}", String::from_utf8_lossy(&left.stdout));
}

#[test]
fn the_environment_can_come_through_standard_input() {
    use std::io::Write as _;
    for ns in modes() {
        let mut args = vec!["task-exec", "--status", "-", "--env-file", "-", "--user", "200002:200002"];
        args.extend(ns);
        args.extend(["--", "sh", "-c", "env"]);
        let mut child = Command::new(common::BIN)
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"PATH=/usr/bin:/bin\0ODD=a b=c\nd\0").unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{ns:?}");
        let out = String::from_utf8_lossy(&o.stdout);
        let mut vars: Vec<&str> = out.split_inclusive('\n').filter(|l| !l.starts_with("PWD=")).collect();
        vars.sort();
        assert_eq!(vars, ["ODD=a b=c\n", "PATH=/usr/bin:/bin\n", "d\n"], "{ns:?}: {out}");
    }
}

/// The task's `/tmp` and `/dev/shm` are private tmpfs; a working directory under either (an agent whose data directory
/// is there, e.g. with `TMPDIR=/dev/shm`) stays reachable at its path, and what the task writes there reaches the host.
#[test]
fn a_working_directory_under_tmp_or_dev_shm_stays_reachable_in_the_tasks_namespace() {
    for parent in ["/tmp", "/dev/shm"] {
        if !Path::new(parent).is_dir() {
            continue;
        }
        let dir = tempfile::tempdir_in(parent).unwrap();
        let work = dir.path().join("agent").join("homes");
        std::fs::create_dir_all(&work).unwrap();
        let out = task_exec(&[
            "--status",
            "-",
            "--cwd",
            work.to_str().unwrap(),
            "--pid-namespace",
            "--",
            "sh",
            "-c",
            "pwd && echo kept > here && ls -a /tmp /dev/shm | wc -l",
        ]);
        assert!(out.status.success(), "{parent}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with(&format!("{}\n", work.display())), "{parent}: {text}");
        assert_eq!(std::fs::read_to_string(work.join("here")).unwrap(), "kept\n", "{parent}");
    }
}

/// Two signals pending at once in the init of a PID namespace both reach the task: the init passed the first on and
/// threw the others away (a SIGTERM that came with a SIGUSR1 never arrived). Made deterministic by stopping the init
/// while both are sent.
#[test]
fn every_signal_pending_in_the_namespace_init_reaches_the_task() {
    use std::io::BufRead as _;
    // The task says it is ready on its output (a file would not do: its /tmp is its own, and a test's directory may
    // be beneath /tmp).
    let script = "trap 'echo usr1' USR1; trap 'echo term; exit 0' TERM; echo ready; i=0; \
                  while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; echo timeout";
    let mut child = Command::new(common::BIN)
        .args(["task-exec", "--status", "-", "--pid-namespace", "--", "sh", "-c", script])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let wrapper = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // The init: the wrapper's child.
    let o = Command::new("pgrep").args(["-P", &wrapper.to_string()]).output().unwrap();
    let init = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(init.parse::<u32>().is_ok(), "one init: {init:?}");
    let kill = |sig: &str| assert!(Command::new("kill").args([sig, &init]).status().unwrap().success());
    kill("-STOP");
    kill("-USR1");
    kill("-TERM");
    kill("-CONT");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    let status = child.wait().unwrap();
    assert!(text.contains("usr1") && text.contains("term"), "{text}");
    assert!(status.success(), "{status:?} {text}");
}
