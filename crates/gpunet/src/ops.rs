//! Day-one operations shared by `gpunet up`, `server` and `agent`: logging (plain text off a terminal, or JSON), the
//! data directory's lock, token files, the stop signal, what `gpunet up` prints to add a machine, and man pages.

use crate::config::LogFormat;
use anyhow::{bail, Context, Result};
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

/// Sets up `tracing` on standard error: `GPUNET_LOG` (an env-filter, e.g. `debug` or `gpunet_server=debug`) or
/// `default_level`. Text has ANSI colours only when standard error is a terminal (log files stay plain).
pub(crate) fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUNET_LOG").unwrap_or_else(|_| default_level.into());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => b.json().with_ansi(false).init(),
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM (what systemd and `kill` send), so both stop gracefully.
pub(crate) async fn stop_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// What the server's local pool provider kills a deleted node's leftover tasks with
/// (`gpunet_agent::kill_left_tasks`).
pub(crate) fn local_reaper() -> gpunet_server::pools::Reaper {
    gpunet_server::pools::Reaper(std::sync::Arc::new(gpunet_agent::kill_left_tasks))
}

/// Asks the kernel for SIGTERM when this process's parent ends (`PR_SET_PDEATHSIG`), and fails if the parent
/// `parent` is already gone (it could have ended before the request).
pub(crate) fn exit_with_parent(parent: u32) -> Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).context("ask for the parent's death signal")?;
    if nix::unistd::getppid().as_raw() as u32 != parent {
        bail!("the parent process {parent} is gone");
    }
    Ok(())
}

/// An exclusive lock on a data directory (`DIR/gpunet.lock`, `flock(2)`), held while this value lives: a second
/// `gpunet up`, `server` or `agent` on the same directory fails at once, saying which process holds it. The kernel
/// drops the lock when the process ends, however it ends, so a stale lock file never blocks a restart.
#[derive(Debug)]
pub(crate) struct DataDirLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl DataDirLock {
    /// The name of the lock file inside the data directory.
    pub(crate) const FILE: &'static str = "gpunet.lock";

    /// Creates `dir` if needed and takes its lock, or fails naming the directory and the holder's pid.
    pub(crate) fn acquire(dir: &Path) -> Result<DataDirLock> {
        use std::io::{Read as _, Seek as _, Write as _};
        std::fs::create_dir_all(dir).with_context(|| format!("create data directory {}", dir.display()))?;
        let path = dir.join(Self::FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("open lock file {}", path.display()))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                lock.set_len(0)?;
                lock.rewind()?;
                writeln!(lock, "{}", std::process::id())?;
                Ok(DataDirLock { _lock: lock })
            }
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let holder = match pid.trim() {
                    "" => String::new(),
                    p => format!(" (pid {p})"),
                };
                bail!(
                    "data directory {} is in use by another gpunet process{holder}: it holds {}; stop it or use \
                     another --data-dir",
                    dir.display(),
                    path.display()
                )
            }
            Err((_, e)) => Err(e).with_context(|| format!("lock {}", path.display())),
        }
    }
}

/// The token kept in `path` (trimmed), or a new one written there first, readable by its owner only (never briefly
/// readable by others).
pub(crate) fn token_file(path: &Path) -> Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Ok(t) = std::fs::read_to_string(path) {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    let t = gpunet_server::new_token();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(t.as_bytes()))
        .with_context(|| format!("write {}", path.display()))?;
    Ok(t)
}

/// The exact command that adds another machine to the network `gpunet up` runs, and what must be true for it to work.
pub(crate) fn join_instructions(listen: std::net::SocketAddr, ca: &Path, join_token: &str) -> String {
    let port = listen.port();
    let host = if listen.ip().is_unspecified() {
        std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "HOST".into())
    } else {
        listen.ip().to_string()
    };
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    let ca = std::path::absolute(ca).unwrap_or_else(|_| PathBuf::from(ca));
    let mut s = format!("join token: {join_token}\n");
    s += &format!(
        "add a machine (copy {ca} there first; run as root):\n  gpunet agent --server https://{host}:{port} --ca \
         {ca} --join-token {join_token} --data-dir /var/lib/gpunet-agent\n",
        ca = ca.display()
    );
    if listen.ip().is_loopback() {
        s +=
            "  (this server listens on loopback only: restart with --listen 0.0.0.0:PORT so other machines reach it)\n";
    }
    s
}

/// Writes a man page for `cmd` and one for each of its subcommands (`gpunet.1`, `gpunet-server.1`,
/// `gpunet-admin-backup.1`, …) into `dir`; returns the files written.
pub(crate) fn write_man_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = Vec::new();
    fn walk(cmd: clap::Command, prefix: &str, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
        let name = if prefix.is_empty() { cmd.get_name().to_string() } else { format!("{prefix}-{}", cmd.get_name()) };
        // The page's title is the whole command (`gpunet-admin-backup`), as man(1) looks it up.
        let cmd = cmd.display_name(name.clone());
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone()).title(name.clone()).render(&mut out)?;
        std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
        written.push(path);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            walk(sub.clone(), &name, dir, written)?;
        }
        Ok(())
    }
    let mut cmd = cmd;
    cmd.build();
    walk(cmd, "", dir, &mut written)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_data_directory_fails_naming_it_and_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let e = DataDirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(e.contains("in use by another gpunet process") && e.contains(&format!("pid {}", std::process::id())));
        assert!(e.contains(&dir.path().display().to_string()), "{e}");
        drop(first);
        DataDirLock::acquire(dir.path()).expect("free again once the holder is gone");
    }

    #[test]
    fn a_token_file_is_created_once_owner_only_and_then_read_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("join.token");
        let t = token_file(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(token_file(&p).unwrap(), t);
    }

    #[test]
    fn join_instructions_name_the_url_ca_and_token_and_warn_about_loopback() {
        let s = join_instructions("127.0.0.1:7070".parse().unwrap(), Path::new("/d/tls/ca.pem"), "tok");
        assert!(s.contains("gpunet agent --server https://127.0.0.1:7070 --ca /d/tls/ca.pem --join-token tok"), "{s}");
        assert!(s.contains("loopback only"));
        let s = join_instructions("10.0.0.5:7443".parse().unwrap(), Path::new("/d/ca.pem"), "tok");
        assert!(s.contains("--server https://10.0.0.5:7443") && !s.contains("loopback"), "{s}");
    }
}
