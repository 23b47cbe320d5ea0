//! A private PostgreSQL cluster for tests and benchmarks: `initdb` and `pg_ctl` (Debian's `postgresql` package,
//! `/usr/lib/postgresql/*/bin`, or `GPUNET_PG_BIN`) in a temporary directory, listening on a free loopback port,
//! stopped and removed when the [`PgCluster`] is dropped (on a panic too).
//!
//! PostgreSQL refuses to run as root: as root, the cluster runs as `nobody` (uid and gid 65534) and its directory is
//! given to that user. Authentication is `trust` on loopback: for tests only.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Errors of a test cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No PostgreSQL server binaries were found.
    #[error("start PostgreSQL: no initdb in GPUNET_PG_BIN or /usr/lib/postgresql/*/bin (apt-get install postgresql)")]
    NotInstalled,
    /// A file operation failed.
    #[error("start PostgreSQL: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A PostgreSQL program failed.
    #[error("start PostgreSQL: {what} failed: {output}")]
    Failed {
        /// The program.
        what: String,
        /// What it printed (and the server log's end).
        output: String,
    },
    /// Creating a database failed.
    #[error("create database {name}: {source}")]
    CreateDb {
        /// The database.
        name: String,
        /// The cause.
        #[source]
        source: postgres::Error,
    },
}

/// The uid and gid the cluster runs as when we are root (Debian's `nobody`/`nogroup`).
const NOBODY: u32 = 65534;

/// A running private cluster; dropped, it is stopped and its directory removed.
#[derive(Debug)]
pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    run_as: Option<u32>,
}

/// The directory of the newest installed PostgreSQL's programs.
pub fn find_bin() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("GPUNET_PG_BIN") {
        let b = PathBuf::from(b);
        return b.join("initdb").is_file().then_some(b);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

fn is_root() -> bool {
    // The owner of a file we just created is our effective uid; std has no geteuid.
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false)
}

impl PgCluster {
    /// Starts a cluster.
    pub fn start() -> Result<PgCluster, ClusterError> {
        PgCluster::start_with(None)
    }

    /// Starts a cluster that also accepts TLS, with certificate `cert` and key `key` (PEM).
    pub fn start_tls(cert: &str, key: &str) -> Result<PgCluster, ClusterError> {
        PgCluster::start_with(Some((cert, key)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> Result<PgCluster, ClusterError> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let bin = find_bin().ok_or(ClusterError::NotInstalled)?;
        let io = |what: &str| {
            let what = what.to_string();
            move |source| ClusterError::Io { what, source }
        };
        let run_as = is_root().then_some(NOBODY);
        // `nobody` must reach the directory: under root, /tmp rather than a TMPDIR that may be private to root.
        let base = if run_as.is_some() { PathBuf::from("/tmp") } else { std::env::temp_dir() };
        let dir = base.join(format!("gpunet-pg-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir).map_err(io("create its directory"))?;
        // From here on, Drop stops the server (if it started) and removes the directory.
        let free_port = || {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(io("find a free port"))
        };
        let mut c = PgCluster { dir, bin, port: free_port()?, run_as };
        if let Some(uid) = run_as {
            std::os::unix::fs::chown(&c.dir, Some(uid), Some(uid)).map_err(io("give its directory to nobody"))?;
        }
        c.run("initdb", &["-D", &c.data(), "-U", "gpunet", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])?;
        let mut opts = format!("-k {} -c listen_addresses=127.0.0.1 -c max_connections=100", c.dir.display());
        if let Some((cert, key)) = tls {
            use std::os::unix::fs::PermissionsExt;
            for (name, pem, mode) in [("server.crt", cert, 0o644), ("server.key", key, 0o600)] {
                let path = c.dir.join("data").join(name);
                std::fs::write(&path, pem).map_err(io("write its TLS files"))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(io("write its TLS files"))?;
                if let Some(uid) = run_as {
                    std::os::unix::fs::chown(&path, Some(uid), Some(uid))
                        .map_err(io("give its TLS files to nobody"))?;
                }
            }
            opts.push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        }
        let log = c.dir.join("server.log");
        let log_name = log.display().to_string();
        // The port was free when asked for, but another process may take it before the server binds it (tests
        // start clusters in parallel): then the server logs "Address already in use" and a fresh port is tried.
        for attempt in 1.. {
            let seen = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
            let with_port = format!("-p {} {opts}", c.port);
            match c.run("pg_ctl", &["-D", &c.data(), "-l", &log_name, "-o", &with_port, "-w", "-t", "120", "start"]) {
                Ok(()) => break,
                Err(e) => {
                    let text = std::fs::read(&log).unwrap_or_default();
                    let clash =
                        String::from_utf8_lossy(&text[seen.min(text.len())..]).contains("Address already in use");
                    if !clash || attempt == 5 {
                        return Err(e);
                    }
                    tracing::warn!(
                        port = c.port,
                        attempt,
                        "the port was taken before the server bound it; trying another"
                    );
                    c.port = free_port()?;
                }
            }
        }
        tracing::info!(port = c.port, dir = %c.dir.display(), "started a private PostgreSQL cluster");
        Ok(c)
    }

    /// Starts a cluster for a test, or returns `None` (printing that the test skipped) where PostgreSQL is not
    /// installed, outside CI. Under `CI=true` a missing PostgreSQL fails the test.
    pub fn start_for_test() -> Option<PgCluster> {
        PgCluster::for_test(PgCluster::start())
    }

    /// [`PgCluster::start_tls`] for a test, skipped as [`PgCluster::start_for_test`] is.
    pub fn start_tls_for_test(cert: &str, key: &str) -> Option<PgCluster> {
        PgCluster::for_test(PgCluster::start_tls(cert, key))
    }

    fn for_test(started: Result<PgCluster, ClusterError>) -> Option<PgCluster> {
        match started {
            Ok(c) => Some(c),
            Err(ClusterError::NotInstalled) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipped: PostgreSQL is not installed (apt-get install postgresql); CI=true requires it");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, prog: &str, args: &[&str]) -> Result<(), ClusterError> {
        let mut cmd = Command::new(self.bin.join(prog));
        cmd.args(args).stdin(Stdio::null()).current_dir(&self.dir);
        if let Some(uid) = self.run_as {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, uid);
        }
        let out = cmd.output().map_err(|source| ClusterError::Io { what: format!("run {prog}"), source })?;
        if !out.status.success() {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            let tail: String =
                log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            return Err(ClusterError::Failed {
                what: prog.into(),
                output: format!(
                    "{}{}{tail}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The URL of database `db` (superuser `gpunet`, no password).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://gpunet@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String, ClusterError> {
        let admin = self.url("postgres");
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', ""));
        // Its own thread: the synchronous client cannot run inside an async runtime.
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut c = postgres::Client::connect(&admin, postgres::NoTls)?;
                c.batch_execute(&sql)
            })
            .join()
            .expect("the connecting thread does not panic")
        })
        .map_err(|source| ClusterError::CreateDb { name: name.into(), source })?;
        Ok(self.url(name))
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.dir.join("data").join("postmaster.pid").exists() {
            if let Err(e) = self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "-t", "60", "stop"]) {
                tracing::warn!(error = %e, "stopping the private PostgreSQL cluster failed");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
