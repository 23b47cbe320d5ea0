//! SQLite store: WAL journal, `synchronous=FULL` (a commit is on disk when it returns), versioned migrations, and a
//! single writer thread doing group commit. Reads use their own connection.

use crate::{
    big, Counts, EventRow, LedgerTotals, SampleRow, Snapshot, Store, StoreError, TokenRole, TokenRow, UsageRow, Write,
};
use rusqlite::{params, Connection};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

/// Schema migrations, applied in order; `user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE tenants (seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
     CREATE TABLE tokens (hash TEXT PRIMARY KEY, tenant TEXT);
     CREATE TABLE nodes (seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
     CREATE TABLE jobs (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, doc TEXT NOT NULL);
     CREATE INDEX jobs_tenant_state ON jobs (tenant, state);
     CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL, at_ms INTEGER NOT NULL,
                          kind TEXT NOT NULL, message TEXT NOT NULL);
     CREATE INDEX events_job ON events (job, seq);
     CREATE TABLE usage (seq INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL, tenant TEXT NOT NULL,
                         start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL, gpu_model TEXT NOT NULL,
                         lifecycle TEXT NOT NULL, gpu_seconds REAL NOT NULL, cpu_seconds REAL NOT NULL,
                         mem_gib_seconds REAL NOT NULL, cost REAL NOT NULL);
     CREATE INDEX usage_tenant_time ON usage (tenant, start_ms);",
    // 2: cluster samples for the portal's charts.
    "CREATE TABLE samples (at_ms INTEGER PRIMARY KEY, gpus_total INTEGER NOT NULL, gpus_allocated INTEGER NOT NULL,
                           queue_length INTEGER NOT NULL, running INTEGER NOT NULL);",
    // 3: a token's role is stored with it. Before, the tenant column held `__admin__` or `__agent__` for those roles,
    // so a tenant created with such a name became an admin (or agent) at the next start. Where a tenant of a
    // reserved name exists, its tokens cannot be told apart from the role's: all of them are revoked (a new admin
    // token is generated at start unless one is configured; agents need a configured join token again).
    "ALTER TABLE tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'tenant';
     DELETE FROM tokens WHERE tenant IN ('__admin__', '__agent__') AND tenant IN (SELECT name FROM tenants);
     UPDATE tokens SET role = 'admin', tenant = NULL WHERE tenant IS NULL OR tenant = '__admin__';
     UPDATE tokens SET role = 'agent', tenant = NULL WHERE tenant = '__agent__';",
    // 4: token records (role, tenant, user, expiry) beside the token hashes.
    "CREATE TABLE token_docs (hash TEXT PRIMARY KEY, doc TEXT NOT NULL);",
    // 5: usage rows price GPUs, CPU and memory apart. Older rows priced only GPUs: their cost is their GPU cost.
    "ALTER TABLE usage ADD COLUMN gpu_cost REAL NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN cpu_cost REAL NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN mem_cost REAL NOT NULL DEFAULT 0;
     UPDATE usage SET gpu_cost = cost;",
    // 6: who submitted each billed job (per-user accounting); older rows have none.
    "ALTER TABLE usage ADD COLUMN submitted_by TEXT NOT NULL DEFAULT '';",
    // 7: the GPU-seconds the agents' utilisation samples covered, and those weighted by utilisation.
    "ALTER TABLE usage ADD COLUMN sampled_gpu_seconds REAL NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN busy_gpu_seconds REAL NOT NULL DEFAULT 0;",
];

type Request = (Vec<Write>, crate::Done);

/// The SQLite store.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    tx: Mutex<Sender<Request>>,
    read: Mutex<Connection>,
}

fn open(path: &Path) -> Result<Connection, StoreError> {
    let c = Connection::open(path)?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "FULL")?;
    c.pragma_update(None, "foreign_keys", "ON")?;
    c.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(c)
}

fn migrate(c: &mut Connection) -> Result<(), StoreError> {
    let v: u32 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if v as usize > MIGRATIONS.len() {
        return Err(StoreError::TooNew { found: v, supported: MIGRATIONS.len() as u32 });
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(v as usize) {
        let tx = c.transaction()?;
        tx.execute_batch(m)?;
        tx.pragma_update(None, "user_version", (i + 1) as u32)?;
        tx.commit()?;
        tracing::info!(version = i + 1, "applied store migration");
    }
    Ok(())
}

fn apply(tx: &rusqlite::Transaction<'_>, w: &Write) -> rusqlite::Result<()> {
    match w {
        Write::Tenant { name, doc } => {
            tx.execute(
                "INSERT INTO tenants (name, doc) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET doc = excluded.doc",
                params![name, doc.to_string()],
            )?;
        }
        Write::Token { hash, role, tenant } => {
            tx.execute(
                "INSERT OR REPLACE INTO tokens (hash, role, tenant) VALUES (?1, ?2, ?3)",
                params![hash, role.as_str(), tenant],
            )?;
        }
        Write::TokenDoc { hash, doc } => {
            tx.execute(
                "INSERT OR REPLACE INTO token_docs (hash, doc) VALUES (?1, ?2)",
                params![hash, doc.to_string()],
            )?;
        }
        Write::RevokeToken { hash } => {
            tx.execute("DELETE FROM tokens WHERE hash = ?1", params![hash])?;
            tx.execute("DELETE FROM token_docs WHERE hash = ?1", params![hash])?;
        }
        Write::Node { name, doc } => {
            tx.execute(
                "INSERT INTO nodes (name, doc) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET doc = excluded.doc",
                params![name, doc.to_string()],
            )?;
        }
        Write::Job { id, tenant, state, doc } => {
            tx.prepare_cached(
                "INSERT INTO jobs (id, tenant, state, doc) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(id) DO UPDATE SET tenant = excluded.tenant, state = excluded.state, doc = excluded.doc",
            )?
            .execute(params![*id as i64, tenant, state, doc])?;
        }
        Write::Event { job, at_ms, kind, message } => {
            tx.prepare_cached("INSERT INTO events (job, at_ms, kind, message) VALUES (?1, ?2, ?3, ?4)")?
                .execute(params![*job as i64, *at_ms as i64, kind, message])?;
        }
        Write::Sample { sample: x, keep_since_ms } => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO samples (at_ms, gpus_total, gpus_allocated, queue_length, running)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                x.at_ms as i64,
                x.gpus_total as i64,
                x.gpus_allocated as i64,
                x.queue_length as i64,
                x.running as i64
            ])?;
            tx.prepare_cached("DELETE FROM samples WHERE at_ms < ?1")?.execute(params![*keep_since_ms as i64])?;
        }
        Write::Usage(u) => {
            tx.prepare_cached(
                "INSERT INTO usage (job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds,
                                    mem_gib_seconds, cost, gpu_cost, cpu_cost, mem_cost, submitted_by,
                                    sampled_gpu_seconds, busy_gpu_seconds)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?
            .execute(params![
                u.job as i64,
                u.tenant,
                u.start_ms as i64,
                u.end_ms as i64,
                u.gpu_model,
                u.lifecycle,
                u.gpu_seconds,
                u.cpu_seconds,
                u.mem_gib_seconds,
                u.cost,
                u.gpu_cost,
                u.cpu_cost,
                u.mem_cost,
                u.submitted_by,
                u.sampled_gpu_seconds,
                u.busy_gpu_seconds
            ])?;
        }
    }
    Ok(())
}

/// The writer thread. After a failed commit it refuses every later batch: what is on disk stays an exact prefix of
/// what was acknowledged, so that a restart recovers a state the server really had (the server goes read-only on the
/// first refusal; see `gpunet-server`'s owner).
fn writer(mut c: Connection, rx: Receiver<Request>) {
    let mut refused: Option<String> = None;
    while let Ok(first) = rx.recv() {
        if let Some(e) = &refused {
            let (_, done) = first;
            done(Err(StoreError::Commit(format!(
                "an earlier write was refused ({e}); restart once the cause is fixed"
            ))));
            continue;
        }
        // Group commit: everything that queued up while the last transaction was being written goes in this one.
        let mut group = vec![first];
        while let Ok(more) = rx.try_recv() {
            group.push(more);
            if group.len() >= 4096 {
                break;
            }
        }
        let result = (|| -> rusqlite::Result<()> {
            let tx = c.transaction()?;
            for (batch, _) in &group {
                for w in batch {
                    apply(&tx, w)?;
                }
            }
            tx.commit()
        })();
        let reply = result.map_err(|e| e.to_string());
        if let Err(e) = &reply {
            tracing::error!(error = %e, batches = group.len(), "store commit failed; refusing later writes");
            refused = Some(e.clone());
        }
        for (_, done) in group {
            done(reply.clone().map_err(StoreError::Commit));
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) `DIR/gpunet.db` and migrates it.
    pub fn open(dir: &Path) -> Result<SqliteStore, StoreError> {
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e| StoreError::Io { path: p, source: e }
        };
        private_dir(dir).map_err(io(dir))?;
        let path = dir.join("gpunet.db");
        // SQLite gives the WAL and shared-memory files the database file's mode: create it 0600 first.
        private_file(&path).map_err(io(&path))?;
        for suffix in ["-wal", "-shm"] {
            let p = dir.join(format!("gpunet.db{suffix}"));
            if p.exists() {
                narrow(&p).map_err(io(&p))?;
            }
        }
        let mut w = open(&path)?;
        migrate(&mut w)?;
        let read = open(&path)?;
        let (tx, rx) = channel::<Request>();
        std::thread::Builder::new()
            .name("gpunet-store-writer".into())
            .spawn(move || writer(w, rx))
            .map_err(|e| StoreError::Io { path: path.display().to_string(), source: e })?;
        Ok(SqliteStore { path, tx: Mutex::new(tx), read: Mutex::new(read) })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with_read<T>(&self, f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let c = self.read.lock().map_err(|_| StoreError::Closed)?;
        f(&c)
    }
}

/// Creates `dir` (and its parents) `0700` when missing. An existing directory keeps its mode: it may be one the
/// operator chose; the files in it are private anyway.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Creates `path` empty with mode `0600` when missing, or narrows an existing file to `0600`.
pub fn private_file(path: &Path) -> std::io::Result<()> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    drop(o.open(path)?);
    narrow(path)
}

fn narrow(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
        if mode != 0o600 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// Copies the SQLite database of data directory `dir` to the file `to` (created `0600`; it must not exist) with
/// SQLite's online backup API: a consistent copy while a server keeps writing. Returns the copy's size in bytes.
pub fn backup(dir: &Path, to: &Path) -> Result<u64, StoreError> {
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| StoreError::Io { path: p, source: e }
    };
    let db = dir.join("gpunet.db");
    if !db.is_file() {
        return Err(StoreError::Io {
            path: db.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no gpunet.db there"),
        });
    }
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    drop(o.open(to).map_err(io(to))?);
    let src = Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    src.busy_timeout(std::time::Duration::from_secs(10))?;
    let mut dst = Connection::open(to)?;
    rusqlite::backup::Backup::new(&src, &mut dst)?.run_to_completion(
        1024,
        std::time::Duration::from_millis(5),
        None,
    )?;
    drop(dst);
    Ok(std::fs::metadata(to).map_err(io(to))?.len())
}

/// Rows per page when exporting.
const PAGE: i64 = 5000;

/// Keyset-paged export of one table: `sql` takes the last key seen as `?1` and a limit as `?2`.
fn export_paged(
    c: &Connection,
    sql: &str,
    row: impl Fn(&rusqlite::Row<'_>) -> Result<(i64, Write), StoreError>,
    each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut after = i64::MIN;
    let mut q = c.prepare(sql)?;
    loop {
        let mut page = Vec::new();
        let mut rows = q.query(params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            page.push(row(r)?);
        }
        let Some((last, _)) = page.last() else { return Ok(()) };
        after = *last;
        let full = page.len() as i64 == PAGE;
        each(page.into_iter().map(|(_, w)| w).collect())?;
        if !full {
            return Ok(());
        }
    }
}

fn decode(what: &'static str, key: String, s: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Decode { what, key, source: e })
}

impl Store for SqliteStore {
    fn probe_writable(&self) -> Result<(), StoreError> {
        use std::io::Write as _;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let p = dir.join(".write-probe");
        let io = |e: std::io::Error| StoreError::Io { path: p.display().to_string(), source: e };
        // A page's worth, synced: a full disk or a read-only file system fails here. The database file itself must
        // be writable too (a read-only file refuses the open for writing).
        let mut f = std::fs::File::create(&p).map_err(io)?;
        f.write_all(&[0u8; 8192]).and_then(|_| f.sync_all()).map_err(io)?;
        std::fs::remove_file(&p).map_err(io)?;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| StoreError::Io { path: self.path.display().to_string(), source: e })?;
        Ok(())
    }

    fn load_meta(&self) -> Result<Snapshot, StoreError> {
        self.with_read(|c| {
            let mut snap = Snapshot::default();
            let mut q = c.prepare("SELECT name, doc FROM tenants ORDER BY seq")?;
            for r in q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
                let (n, d) = r?;
                let doc = decode("tenant", n.clone(), &d)?;
                snap.tenants.push((n, doc));
            }
            let mut q = c.prepare("SELECT hash, role, tenant FROM tokens")?;
            for r in q.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<String>>(2)?))
            })? {
                let (hash, role, tenant) = r?;
                // An unknown role grants nothing.
                let Some(role) = TokenRole::parse(&role) else {
                    tracing::warn!(role = %role, "stored token with an unknown role ignored");
                    continue;
                };
                snap.tokens.push(TokenRow { hash, role, tenant });
            }
            let mut q = c.prepare("SELECT hash, doc FROM token_docs")?;
            for r in q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
                let (h, d) = r?;
                let doc = decode("token", h.chars().take(12).collect(), &d)?;
                snap.token_docs.push((h, doc));
            }
            let mut q = c.prepare("SELECT name, doc FROM nodes ORDER BY seq")?;
            for r in q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
                let (n, d) = r?;
                let doc = decode("node", n.clone(), &d)?;
                snap.nodes.push((n, doc));
            }
            Ok(snap)
        })
    }

    fn jobs_page(&self, after: Option<u64>, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        self.with_read(|c| {
            let mut q = c.prepare_cached("SELECT id, doc FROM jobs WHERE id > ?1 ORDER BY id LIMIT ?2")?;
            let after = after.map_or(-1, |a| a as i64);
            let rows = q.query_map(params![after, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?))
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    fn commit_async(&self, batch: Vec<Write>, done: crate::Done) {
        let sent = self.tx.lock().map_err(|_| ()).and_then(|tx| {
            tx.send((batch, done)).map_err(|e| {
                let (_, done) = e.0;
                done(Err(StoreError::Closed));
            })
        });
        let _ = sent;
    }

    fn events(&self, job: u64) -> Result<Vec<EventRow>, StoreError> {
        self.with_read(|c| {
            let mut q =
                c.prepare_cached("SELECT seq, job, at_ms, kind, message FROM events WHERE job = ?1 ORDER BY seq")?;
            let rows = q.query_map(params![job as i64], |r| {
                Ok(EventRow {
                    seq: r.get::<_, i64>(0)? as u64,
                    job: r.get::<_, i64>(1)? as u64,
                    at_ms: r.get::<_, i64>(2)? as u64,
                    kind: r.get(3)?,
                    message: r.get(4)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    fn usage(&self, tenant: Option<&str>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>, StoreError> {
        self.with_read(|c| {
            let mut q = c.prepare_cached(
                "SELECT job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds, mem_gib_seconds, cost,
                        gpu_cost, cpu_cost, mem_cost, submitted_by, sampled_gpu_seconds, busy_gpu_seconds
                 FROM usage WHERE (?1 IS NULL OR tenant = ?1) AND end_ms > ?2 AND start_ms < ?3 ORDER BY seq",
            )?;
            let rows = q.query_map(params![tenant, big(from_ms), big(to_ms)], |r| {
                Ok(UsageRow {
                    job: r.get::<_, i64>(0)? as u64,
                    tenant: r.get(1)?,
                    start_ms: r.get::<_, i64>(2)? as u64,
                    end_ms: r.get::<_, i64>(3)? as u64,
                    gpu_model: r.get(4)?,
                    lifecycle: r.get(5)?,
                    gpu_seconds: r.get(6)?,
                    cpu_seconds: r.get(7)?,
                    mem_gib_seconds: r.get(8)?,
                    cost: r.get(9)?,
                    gpu_cost: r.get(10)?,
                    cpu_cost: r.get(11)?,
                    mem_cost: r.get(12)?,
                    submitted_by: r.get(13)?,
                    sampled_gpu_seconds: r.get(14)?,
                    busy_gpu_seconds: r.get(15)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    fn ledger_totals(&self) -> Result<BTreeMap<String, LedgerTotals>, StoreError> {
        self.with_read(|c| {
            let mut q = c.prepare_cached("SELECT tenant, SUM(gpu_seconds), SUM(cost) FROM usage GROUP BY tenant")?;
            let rows =
                q.query_map([], |r| Ok((r.get(0)?, LedgerTotals { gpu_seconds: r.get(1)?, cost: r.get(2)? })))?;
            Ok(rows.collect::<Result<BTreeMap<_, _>, _>>()?)
        })
    }

    fn counts(&self) -> Result<Counts, StoreError> {
        self.with_read(|c| {
            let n = |t: &str| -> Result<u64, StoreError> {
                Ok(c.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get::<_, i64>(0))? as u64)
            };
            Ok(Counts {
                tenants: n("tenants")?,
                tokens: n("tokens")?,
                token_docs: n("token_docs")?,
                nodes: n("nodes")?,
                jobs: n("jobs")?,
                events: n("events")?,
                usage: n("usage")?,
                samples: n("samples")?,
            })
        })
    }

    fn export(&self, each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>) -> Result<(), StoreError> {
        self.export_all(each)
    }

    fn samples(&self, since_ms: u64) -> Result<Vec<SampleRow>, StoreError> {
        self.with_read(|c| {
            let mut q = c.prepare_cached(
                "SELECT at_ms, gpus_total, gpus_allocated, queue_length, running FROM samples
                 WHERE at_ms >= ?1 ORDER BY at_ms",
            )?;
            let rows = q.query_map(params![big(since_ms)], |r| {
                Ok(SampleRow {
                    at_ms: r.get::<_, i64>(0)? as u64,
                    gpus_total: r.get::<_, i64>(1)? as u64,
                    gpus_allocated: r.get::<_, i64>(2)? as u64,
                    queue_length: r.get::<_, i64>(3)? as u64,
                    running: r.get::<_, i64>(4)? as u64,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }
}

impl SqliteStore {
    fn export_all(&self, each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>) -> Result<(), StoreError> {
        let snap = self.load_meta()?;
        each(snap.tenants.into_iter().map(|(name, doc)| Write::Tenant { name, doc }).collect())?;
        each(snap.tokens.into_iter().map(|t| Write::Token { hash: t.hash, role: t.role, tenant: t.tenant }).collect())?;
        each(snap.token_docs.into_iter().map(|(hash, doc)| Write::TokenDoc { hash, doc }).collect())?;
        each(snap.nodes.into_iter().map(|(name, doc)| Write::Node { name, doc }).collect())?;
        self.with_read(|c| {
            export_paged(
                c,
                "SELECT id, tenant, state, doc FROM jobs WHERE id > ?1 ORDER BY id LIMIT ?2",
                |r| {
                    let id: i64 = r.get(0)?;
                    let doc = decode("job", id.to_string(), &r.get::<_, String>(3)?)?.to_string();
                    Ok((id, Write::Job { id: id as u64, tenant: r.get(1)?, state: r.get(2)?, doc }))
                },
                each,
            )?;
            export_paged(
                c,
                "SELECT seq, job, at_ms, kind, message FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                |r| {
                    let w = Write::Event {
                        job: r.get::<_, i64>(1)? as u64,
                        at_ms: r.get::<_, i64>(2)? as u64,
                        kind: r.get(3)?,
                        message: r.get(4)?,
                    };
                    Ok((r.get(0)?, w))
                },
                each,
            )?;
            export_paged(
                c,
                "SELECT seq, job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds,
                        mem_gib_seconds, cost, gpu_cost, cpu_cost, mem_cost, submitted_by, sampled_gpu_seconds,
                        busy_gpu_seconds
                 FROM usage WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                |r| {
                    let u = UsageRow {
                        job: r.get::<_, i64>(1)? as u64,
                        tenant: r.get(2)?,
                        start_ms: r.get::<_, i64>(3)? as u64,
                        end_ms: r.get::<_, i64>(4)? as u64,
                        gpu_model: r.get(5)?,
                        lifecycle: r.get(6)?,
                        gpu_seconds: r.get(7)?,
                        cpu_seconds: r.get(8)?,
                        mem_gib_seconds: r.get(9)?,
                        cost: r.get(10)?,
                        gpu_cost: r.get(11)?,
                        cpu_cost: r.get(12)?,
                        mem_cost: r.get(13)?,
                        submitted_by: r.get(14)?,
                        sampled_gpu_seconds: r.get(15)?,
                        busy_gpu_seconds: r.get(16)?,
                    };
                    Ok((r.get(0)?, Write::Usage(u)))
                },
                each,
            )
        })?;
        each(self.samples(0)?.into_iter().map(|sample| Write::Sample { sample, keep_since_ms: 0 }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(id: u64, state: &str) -> Write {
        Write::Job { id, tenant: "t".into(), state: state.into(), doc: json!({"id": id, "state": state}).to_string() }
    }

    #[test]
    fn old_usage_rows_get_their_cost_as_gpu_cost_and_new_rows_keep_three_parts() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut c = Connection::open(dir.path().join("gpunet.db")).unwrap();
            for m in &MIGRATIONS[..4] {
                c.execute_batch(m).unwrap();
            }
            c.pragma_update(None, "user_version", 4).unwrap();
            let tx = c.transaction().unwrap();
            tx.execute_batch(
                "INSERT INTO usage (job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds,
                                    mem_gib_seconds, cost)
                 VALUES (7, 'team-a', 1000, 4601000, 'A100-80GB', 'spot', 3600.0, 7200.0, 3600.0, 2.5);",
            )
            .unwrap();
            tx.commit().unwrap();
        }
        let s = SqliteStore::open(dir.path()).unwrap();
        let old = s.usage(None, 0, u64::MAX / 2).unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!((old[0].gpu_cost, old[0].cpu_cost, old[0].mem_cost, old[0].cost), (2.5, 0.0, 0.0, 2.5));
        assert_eq!((old[0].job, old[0].lifecycle.as_str(), old[0].gpu_seconds), (7, "spot", 3600.0));
        assert_eq!(old[0].submitted_by, "", "rows from before who-submitted was recorded have no one");
        assert_eq!((old[0].sampled_gpu_seconds, old[0].busy_gpu_seconds), (0.0, 0.0), "old rows were not sampled");
        let new = UsageRow {
            job: 8,
            sampled_gpu_seconds: 3000.0,
            busy_gpu_seconds: 1500.0,
            gpu_cost: 1.0,
            cpu_cost: 0.25,
            mem_cost: 0.125,
            cost: 1.375,
            submitted_by: "bob".into(),
            ..old[0].clone()
        };
        s.commit(vec![Write::Usage(new.clone())]).unwrap();
        drop(s);
        let rows = SqliteStore::open(dir.path()).unwrap().usage(None, 0, u64::MAX / 2).unwrap();
        assert_eq!(rows, vec![old[0].clone(), new]);
    }

    /// The database, its WAL and shared-memory files were world-readable (0644).
    #[cfg(unix)]
    #[test]
    fn database_wal_and_shm_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let s = SqliteStore::open(&dir).unwrap();
        s.commit(vec![job(1, "pending")]).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for f in ["gpunet.db", "gpunet.db-wal", "gpunet.db-shm"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
        drop(s);
        // An older install's files are narrowed when opened.
        std::fs::set_permissions(dir.join("gpunet.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(SqliteStore::open(&dir).unwrap());
        assert_eq!(mode(&dir.join("gpunet.db")), 0o600);
    }

    /// Tokens of schema 2 stored their role as a tenant name; a tenant named `__admin__` became an admin. The
    /// migration stores roles, and revokes tokens that cannot be told apart.
    #[test]
    fn old_token_rows_get_roles_and_reserved_tenant_names_lose_their_tokens() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut c = Connection::open(dir.path().join("gpunet.db")).unwrap();
            for m in &MIGRATIONS[..2] {
                c.execute_batch(m).unwrap();
            }
            c.pragma_update(None, "user_version", 2).unwrap();
            let tx = c.transaction().unwrap();
            tx.execute_batch(
                "INSERT INTO tokens VALUES ('admin-hash', '__admin__'), ('legacy-admin', NULL),
                                           ('join-hash', '__agent__'), ('team-hash', 'team-a'),
                                           ('evil-hash', '__agent__');
                 INSERT INTO tenants (name, doc) VALUES ('__agent__', '{}'), ('team-a', '{}');",
            )
            .unwrap();
            tx.commit().unwrap();
        }
        let s = SqliteStore::open(dir.path()).unwrap();
        let mut toks = s.load().unwrap().tokens;
        toks.sort_by(|a, b| a.hash.cmp(&b.hash));
        let row = |h: &str, role, t: Option<&str>| TokenRow { hash: h.into(), role, tenant: t.map(String::from) };
        assert_eq!(
            toks,
            vec![
                row("admin-hash", TokenRole::Admin, None),
                row("legacy-admin", TokenRole::Admin, None),
                row("team-hash", TokenRole::Tenant, Some("team-a")),
            ],
            "a tenant named __agent__ existed: every __agent__ token is revoked"
        );
    }

    /// The behaviour shared with the other stores is tested in `tests/contract.rs`; here, what is SQLite's own.
    #[test]
    fn a_backup_is_a_private_consistent_copy_taken_while_the_store_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).unwrap();
        s.commit((1..=50).map(|i| job(i, "pending")).collect()).unwrap();
        let to = dir.path().join("copy.db");
        assert!(backup(dir.path(), &to).unwrap() > 0);
        s.commit(vec![job(51, "pending")]).unwrap();
        let copy = dir.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        std::fs::rename(&to, copy.join("gpunet.db")).unwrap();
        assert_eq!(SqliteStore::open(&copy).unwrap().load().unwrap().jobs.len(), 50, "the copy is of when it ran");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(copy.join("gpunet.db")).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let e = backup(dir.path(), &dir.path().join("gpunet.db")).unwrap_err().to_string();
        assert!(e.contains("exists"), "an existing file is never overwritten: {e}");
        assert!(backup(&dir.path().join("nowhere"), &dir.path().join("x.db")).is_err());
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(SqliteStore::open(dir.path()).unwrap());
        let c = Connection::open(dir.path().join("gpunet.db")).unwrap();
        c.pragma_update(None, "user_version", 99).unwrap();
        drop(c);
        let e = SqliteStore::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("99") && e.contains("newer"), "{e}");
    }
}
