//! The task spawner (`gpunet task-spawner`, see `gpunet_agent::spawner`) driven as the agent drives it: the wrappers it
//! forks get their standard descriptors, lead their own group, end with their task's status, and keep their pid
//! (a zombie) until the agent says reap; a spawner that dies leaves its wrappers running.

mod common;

use gpunet_agent::spawner::{Exit, Spawner};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

const PATH: &str = "/usr/bin:/bin";

fn null() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

/// `task-exec` arguments running `script` with the environment read from standard input.
fn wrapper_args(script: &str) -> Vec<String> {
    ["--status", "-", "--env-file", "-", "--", "sh", "-c", script].iter().map(|s| s.to_string()).collect()
}

/// (process group, state) of `pid`.
fn stat(pid: i32) -> Option<(i32, char)> {
    stat3(pid).map(|(_, g, s)| (g, s))
}

/// (parent, process group, state) of `pid`.
fn stat3(pid: i32) -> Option<(i32, i32, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f[1].parse().ok()?, f[2].parse().ok()?, f[0].chars().next()?))
}

/// Whether some process has `pid` as its parent.
fn has_child(pid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(stat3)
            .is_some_and(|(parent, _, _)| parent == pid)
    })
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_forked_wrapper_gets_its_descriptors_and_group_and_keeps_its_pid_until_reaped() {
    let dir = tempfile::tempdir().unwrap();
    // A descriptor the agent leaked (no close-on-exec) reaches the spawner, which closes it: its wrappers are forks,
    // which close-on-exec would not keep it from.
    let leaked = dir.path().join("leaked");
    let leak = std::fs::File::create(&leaked).unwrap();
    nix::fcntl::fcntl(&leak, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
    let sp = Spawner::start(Path::new(common::BIN), PATH).unwrap();
    drop(leak);
    // Its standard input (the task's environment), output and error are the ones passed.
    let out = dir.path().join("out");
    let f = std::fs::File::create(&out).unwrap();
    let (r, mut w) = std::io::pipe().unwrap();
    let (pid, start, exit) = sp
        .spawn(
            &wrapper_args("echo \"$GREETING\"; echo oops >&2; exit 3"),
            [r.into(), f.try_clone().unwrap().into(), f.into()],
        )
        .unwrap();
    // It leads its own group from the moment its pid is known (the agent signals the group); its parent is the
    // spawner, a child of this process.
    let (spawner, group, _) = stat3(pid).unwrap();
    assert_eq!(group, pid);
    // Its start time as the spawner read it (the agent checks it before every signal).
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = st[st.rfind(')').unwrap() + 2..].split_whitespace().collect();
    assert_eq!(fields[19].parse::<u64>().unwrap(), start);
    assert_eq!(stat3(spawner).map(|s| s.0), Some(std::process::id() as i32));
    assert!(
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{spawner}/cmdline")).unwrap()).contains("task-spawner")
    );
    let held: Vec<_> = std::fs::read_dir(format!("/proc/{spawner}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    assert!(!held.contains(&leaked), "the spawner closed what it inherited: {held:?}");
    std::io::Write::write_all(&mut w, b"PATH=/usr/bin:/bin\0GREETING=hello there\0").unwrap();
    drop(w);
    assert_eq!(exit.blocking_recv().unwrap(), Exit::Ended { code: Some(3), signal: None });
    assert_eq!(common::read(&out), "hello there\noops");
    // Ended but not reaped: the pid is still the zombie's, so no other process can have it yet.
    assert_eq!(stat(pid).map(|s| s.1), Some('Z'));
    sp.reap(pid);
    wait_until("the wrapper is reaped", || stat(pid).is_none());
    // A task killed by a signal: the wrapper ends the same way.
    let (r, w) = std::io::pipe().unwrap();
    drop(w);
    let (pid, _, exit) = sp.spawn(&wrapper_args("kill -TERM $$"), [r.into(), null(), null()]).unwrap();
    assert_eq!(exit.blocking_recv().unwrap(), Exit::Ended { code: None, signal: Some(15) });
    sp.reap(pid);
    wait_until("the second wrapper is reaped", || stat(pid).is_none());
    // Several at once, answered in order.
    let mut running = Vec::new();
    for i in 0..8 {
        let (r, w) = std::io::pipe().unwrap();
        drop(w);
        running.push((i, sp.spawn(&wrapper_args(&format!("exit {i}")), [r.into(), null(), null()]).unwrap()));
    }
    for (i, (pid, _, exit)) in running {
        assert_eq!(exit.blocking_recv().unwrap(), Exit::Ended { code: Some(i), signal: None });
        sp.reap(pid);
    }
    // Dropped, the spawner goes.
    drop(sp);
    wait_until("the spawner ends with its agent side", || stat(spawner).is_none_or(|s| s.1 == 'Z'));
}

#[test]
fn a_wrapper_outlives_its_spawner_which_is_started_again() {
    let slot = gpunet_agent::spawner::Slot::default();
    let sp = slot.get(Path::new(common::BIN), PATH).unwrap();
    let (r, w) = std::io::pipe().unwrap();
    drop(w);
    let (pid, _, exit) = sp.spawn(&wrapper_args("sleep 300"), [r.into(), null(), null()]).unwrap();
    let spawner = stat3(pid).unwrap().0;
    assert!(
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{spawner}/cmdline")).unwrap()).contains("task-spawner")
    );
    // The spawner tells the agent a pid before it tells the child to go: killed in between, the child ends without
    // running anything (by design). The wrapper is past that once it has started its task.
    wait_until("the wrapper has started its task", || has_child(pid));
    let _ = std::process::Command::new("kill").args(["-9", &spawner.to_string()]).status();
    // Its end will never be told: the agent watches it as an adopted task.
    assert_eq!(exit.blocking_recv().unwrap(), Exit::Lost);
    assert!(stat(pid).is_some_and(|s| s.0 == pid && s.1 != 'Z'), "the wrapper runs on");
    wait_until("the spawner is dead", || sp.is_dead());
    // The next start gets a new spawner.
    let again = slot.get(Path::new(common::BIN), PATH).unwrap();
    assert!(!again.is_dead());
    let (r, w) = std::io::pipe().unwrap();
    drop(w);
    let (p2, _, exit2) = again.spawn(&wrapper_args("exit 0"), [r.into(), null(), null()]).unwrap();
    assert_eq!(exit2.blocking_recv().unwrap(), Exit::Ended { code: Some(0), signal: None });
    again.reap(p2);
    // Nothing left behind: the orphaned wrapper's group goes.
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    wait_until("the orphaned wrapper is gone", || stat(pid).is_none_or(|s| s.1 == 'Z'));
}
