//! `gpunet task-exec --status FILE -- PROG ARGS…`: the first process of every task the agent starts. It runs PROG as
//! its child, waits for it and writes how it ended to FILE (`exit N` or `signal N`), then ends the same way.
//!
//! Why: only a parent can learn a process's exit status. When an agent restarts, the tasks its previous run started
//! are no longer its children; it adopts them (they keep running) and reads their status from FILE when they end.
//!
//! Signals: the wrapper leads the task's process group, so a SIGTERM to the group reaches the task directly. The
//! wrapper catches SIGTERM, SIGINT, SIGHUP and SIGQUIT with a handler that does nothing (caught, not ignored: the task
//! gets the default dispositions back at exec), so it outlives the task and records its end. SIGKILL to the group
//! kills both; the file then stays empty and the end is known to whoever sent it.

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

/// How the task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exit code.
    Exit(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Ended {
    /// The status file's text.
    pub fn to_line(self) -> String {
        match self {
            Ended::Exit(c) => format!("exit {c}\n"),
            Ended::Signal(s) => format!("signal {s}\n"),
        }
    }

    /// Reads a status file's text; `None` when it is empty or not a status.
    pub fn parse(text: &str) -> Option<Ended> {
        let mut it = text.split_whitespace();
        let (kind, n) = (it.next()?, it.next()?.parse().ok()?);
        match kind {
            "exit" => Some(Ended::Exit(n)),
            "signal" => Some(Ended::Signal(n)),
            _ => None,
        }
    }
}

fn write_status(status: &Path, e: Ended) {
    // The agent created the file (owned by the task's user); truncate and write it in place. No fsync: the file
    // only has to outlive the agent process, not the machine (whose crash ends the task too).
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(status) {
        let _ = f.write_all(e.to_line().as_bytes());
    }
}

/// Runs `prog args` as a child and records its end in `status`; returns how it ended.
pub fn run(status: &Path, prog: &str, args: &[String]) -> Ended {
    // Caught into a flag nobody reads: the signal reaches the task (same group) and the wrapper lives on.
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for s in [SIGTERM, SIGINT, SIGHUP, SIGQUIT] {
        let _ = signal_hook::flag::register(s, seen.clone());
    }
    let ended = match std::process::Command::new(prog).args(args).spawn() {
        Err(e) => {
            eprintln!("gpunet: start {prog}: {e}");
            Ended::Exit(127)
        }
        Ok(mut child) => loop {
            match child.wait() {
                Ok(s) => {
                    break match (s.code(), s.signal()) {
                        (Some(c), _) => Ended::Exit(c),
                        (None, Some(sig)) => Ended::Signal(sig),
                        _ => Ended::Exit(255),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("gpunet: wait for {prog}: {e}");
                    break Ended::Exit(255);
                }
            }
        },
    };
    write_status(status, ended);
    ended
}

/// Ends this process the way the task ended: the same exit code, or the same signal.
pub fn exit_like(e: Ended) -> ! {
    if let Ended::Signal(s) = e {
        // The default action of the signal (termination, with a core where that is the default).
        let _ = signal_hook::low_level::emulate_default_handler(s);
        std::process::exit(128 + s);
    }
    match e {
        Ended::Exit(c) => std::process::exit(c),
        Ended::Signal(_) => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_says_how_the_task_ended() {
        let dir = tempfile::tempdir().unwrap();
        let st = dir.path().join("status");
        let sh = |script: &str| vec!["-c".to_string(), script.to_string()];
        assert_eq!(run(&st, "sh", &sh("exit 3")), Ended::Exit(3));
        assert_eq!(std::fs::read_to_string(&st).unwrap(), "exit 3\n");
        // The task killed by a signal; the wrapper (caught handlers) is not.
        assert_eq!(run(&st, "sh", &sh("kill -TERM $$")), Ended::Signal(15));
        assert_eq!(Ended::parse(&std::fs::read_to_string(&st).unwrap()), Some(Ended::Signal(15)));
        assert_eq!(run(&st, "/nonexistent/program", &[]), Ended::Exit(127));
        assert_eq!(Ended::parse(""), None);
        assert_eq!(Ended::parse("exit x"), None);
    }
}
