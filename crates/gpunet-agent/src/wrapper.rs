//! `gpunet task-exec --status FILE [--cgroup PROCS]… [--user UID:GID] [--env-file FILE] [--cwd DIR] -- PROG ARGS…`:
//! the first process of every task the agent starts (and of its liveness probes, with `--status -`). It joins the
//! task's cgroups (writing its pid to each `PROCS` file, as root), then runs PROG as its child with exactly the
//! environment in FILE (`KEY=VALUE` entries separated by NUL), as UID:GID with no supplementary groups, in DIR; it
//! waits for it and writes how it ended to the status file (`exit N` or `signal N`), then ends the same way.
//!
//! The agent starts the wrapper itself with an empty environment (a `PATH` of its own choosing only): nothing a job
//! sets (`LD_PRELOAD`, `PATH`, …) reaches a root process. Only the job's own process gets the job's environment.
//!
//! Why a wrapper: only a parent can learn a process's exit status. When an agent restarts, the tasks its previous
//! run started are no longer its children; it adopts them (they keep running) and reads their status from FILE when
//! they end. And joining the cgroups before the task's first instruction needs a process that runs before it.
//!
//! Signals: the wrapper leads the task's process group, so a SIGTERM to the group reaches the task directly. The
//! wrapper catches SIGTERM, SIGINT, SIGHUP and SIGQUIT with a handler that does nothing (caught, not ignored: the task
//! gets the default dispositions back at exec), so it outlives the task and records its end. SIGKILL to the group
//! kills both; the file then stays empty and the end is known to whoever sent it. The wrapper stays root while the
//! task runs as its user, so the task can neither signal it nor write its status file.

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

/// What the wrapper is asked to do (its command line).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exec {
    /// Where to write how the task ended; `None` (`--status -`): nowhere (a probe).
    pub status: Option<PathBuf>,
    /// `cgroup.procs` files to join before the task starts.
    pub cgroups: Vec<PathBuf>,
    /// Run the task as this uid and gid.
    pub user: Option<(u32, u32)>,
    /// The task's whole environment (see [`write_env_file`]); `None`: the wrapper's own.
    pub env_file: Option<PathBuf>,
    /// The task's working directory.
    pub cwd: Option<PathBuf>,
    /// Program.
    pub prog: String,
    /// Arguments.
    pub args: Vec<String>,
}

impl Exec {
    /// The command line after `task-exec`.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec!["--status".to_string()];
        v.push(self.status.as_ref().map_or("-".into(), |s| s.display().to_string()));
        for c in &self.cgroups {
            v.push("--cgroup".into());
            v.push(c.display().to_string());
        }
        if let Some((u, g)) = self.user {
            v.push("--user".into());
            v.push(format!("{u}:{g}"));
        }
        if let Some(e) = &self.env_file {
            v.push("--env-file".into());
            v.push(e.display().to_string());
        }
        if let Some(d) = &self.cwd {
            v.push("--cwd".into());
            v.push(d.display().to_string());
        }
        v.push("--".into());
        v.push(self.prog.clone());
        v.extend(self.args.iter().cloned());
        v
    }

    /// Reads the command line after `task-exec`.
    pub fn parse(argv: &[String]) -> Result<Exec, String> {
        let mut e = Exec::default();
        let mut it = argv.iter();
        let mut status = None;
        while let Some(a) = it.next() {
            let mut val = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
            match a.as_str() {
                "--status" => status = Some(val("--status")?),
                "--cgroup" => e.cgroups.push(val("--cgroup")?.into()),
                "--user" => {
                    let v = val("--user")?;
                    let (u, g) = v.split_once(':').ok_or("--user is UID:GID")?;
                    e.user = Some((u.parse().map_err(|_| "--user uid")?, g.parse().map_err(|_| "--user gid")?));
                }
                "--env-file" => e.env_file = Some(val("--env-file")?.into()),
                "--cwd" => e.cwd = Some(val("--cwd")?.into()),
                "--" => {
                    e.prog = it.next().cloned().ok_or("no program after --")?;
                    e.args = it.cloned().collect();
                    let status = status.ok_or("--status is required")?;
                    e.status = (status != "-").then(|| status.into());
                    return Ok(e);
                }
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        Err("no -- PROG".into())
    }

    /// Joins the cgroups, runs the task and records how it ended.
    pub fn run(&self) -> Ended {
        let ended = self.start_and_wait();
        if let Some(s) = &self.status {
            write_status(s, ended);
        }
        ended
    }

    fn start_and_wait(&self) -> Ended {
        // Caught into a flag nobody reads: the signal reaches the task (same group) and the wrapper lives on.
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for s in [SIGTERM, SIGINT, SIGHUP, SIGQUIT] {
            let _ = signal_hook::flag::register(s, seen.clone());
        }
        let me = std::process::id().to_string();
        for c in &self.cgroups {
            if let Err(e) = std::fs::write(c, &me) {
                eprintln!("gpunet: join cgroup {}: {e}", c.display());
                return Ended::Exit(125);
            }
        }
        let mut cmd = std::process::Command::new(&self.prog);
        cmd.args(&self.args);
        if let Some(f) = &self.env_file {
            match read_env_file(f) {
                Ok(env) => {
                    cmd.env_clear().envs(env);
                }
                Err(e) => {
                    eprintln!("gpunet: read the task's environment {}: {e}", f.display());
                    return Ended::Exit(125);
                }
            }
        }
        if let Some((u, g)) = self.user {
            // std drops supplementary groups (setgroups(0)) when root changes the uid.
            cmd.uid(u).gid(g);
        }
        if let Some(d) = &self.cwd {
            // Changed into after the uid: the directory is resolved with the task's own rights.
            cmd.current_dir(d);
        }
        match cmd.spawn() {
            Err(e) => {
                eprintln!("gpunet: start {}: {e}", self.prog);
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
                        eprintln!("gpunet: wait for {}: {e}", self.prog);
                        break Ended::Exit(255);
                    }
                }
            },
        }
    }
}

/// `gpunet task-exec …`: runs the wrapper and ends like the task did.
pub fn main(argv: &[String]) -> ! {
    match Exec::parse(argv) {
        Ok(e) => exit_like(e.run()),
        Err(e) => {
            eprintln!("gpunet task-exec: {e}");
            std::process::exit(2);
        }
    }
}

/// Writes a task's environment for [`Exec::env_file`]: `KEY=VALUE` entries separated by NUL, mode 0600 (root's).
pub fn write_env_file(path: &Path, env: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut buf = Vec::new();
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            continue;
        }
        buf.extend_from_slice(k.as_bytes());
        buf.push(b'=');
        buf.extend_from_slice(v.as_bytes());
        buf.push(0);
    }
    // Written aside and renamed over: a wrapper reading the file meanwhile sees the old or the new one, whole.
    let tmp = path.with_extension("env-new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(&buf)?;
    std::fs::rename(&tmp, path)
}

fn read_env_file(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    let data = std::fs::read(path)?;
    Ok(data
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let s = String::from_utf8_lossy(e);
            let (k, v) = s.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect())
}

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
    // The agent created the file; truncate and write it in place. No fsync: the file only has to outlive the agent
    // process, not the machine (whose crash ends the task too).
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(status) {
        let _ = f.write_all(e.to_line().as_bytes());
    }
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

    fn run(status: &Path, prog: &str, args: &[String]) -> Ended {
        Exec { status: Some(status.into()), prog: prog.into(), args: args.to_vec(), ..Exec::default() }.run()
    }

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

    #[test]
    fn the_task_gets_exactly_the_environment_file() {
        let dir = tempfile::tempdir().unwrap();
        let env = dir.path().join("env");
        let out = dir.path().join("out");
        let vars = BTreeMap::from([
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("ODD".to_string(), "a b=c\nd".to_string()),
        ]);
        write_env_file(&env, &vars).unwrap();
        let e = Exec {
            status: None,
            env_file: Some(env),
            cwd: Some(dir.path().into()),
            prog: "sh".into(),
            args: vec!["-c".into(), format!("env > {}; pwd >> {}", out.display(), out.display())],
            ..Exec::default()
        };
        let again = Exec::parse(&e.to_args()).unwrap();
        assert_eq!(again, e);
        assert_eq!(again.run(), Ended::Exit(0));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains("ODD=a b=c\nd\n") && text.contains("PATH=/usr/bin:/bin"), "{text}");
        assert!(!text.contains("CARGO") && !text.contains("HOME="), "nothing of the wrapper's own: {text}");
        assert!(text.ends_with(&format!("{}\n", dir.path().display())), "{text}");
        assert!(Exec::parse(&["--status".into(), "-".into()]).is_err());
        assert!(Exec::parse(&["--bogus".into()]).is_err());
    }
}
