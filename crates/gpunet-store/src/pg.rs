//! PostgreSQL store: the same contract as SQLite's (a batch is acknowledged only once its transaction committed,
//! batches are applied in the order they were queued), versioned migrations, and group commit.
//!
//! The [`Store`] trait is synchronous and is called from inside the server's tokio runtime, where the synchronous
//! `postgres` client cannot block (it drives its own runtime). So every connection lives on a thread of its own:
//! one **writer** thread takes every batch waiting when it becomes free and writes them in one transaction (job
//! upserts and events of the whole group go in one `unnest` statement each; a group of nothing else — every
//! submission's — is one statement, checked against the fencing epoch, so one round trip), and a small pool of **reader** threads
//! answers queries, each with its own connection, reconnecting when it was lost. Callers block on a channel, as they
//! block on SQLite's disk.
//!
//! After a failed commit the writer refuses every later batch (like SQLite's): what is stored stays an exact prefix
//! of what was acknowledged, and the server goes read-only until it is restarted.
//!
//! The database URL may hold a password: it is never logged nor put in an error; [`PgStore::target`] says where the
//! store is without it. Connections are plain TCP or a Unix socket, or TLS with `sslrootcert=FILE` (verified against
//! that CA and the host name, [`parse`]).

use crate::{
    big, Counts, Done, EventRow, LedgerTotals, SampleRow, Snapshot, Store, StoreError, TokenRole, TokenRow, UsageRow,
    Write,
};
use postgres::{Client, Config, IsolationLevel, NoTls, Statement};
use std::collections::HashMap;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Schema migrations, applied in order in one transaction each; `gpunet_schema.version` records how many ran.
/// The first is SQLite's schema after its 6 migrations. Documents are JSON text (not `jsonb`: stored as given, read
/// back byte for byte, and never queried inside).
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE tenants (seq BIGSERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
     CREATE TABLE tokens (hash TEXT PRIMARY KEY, role TEXT NOT NULL, tenant TEXT);
     CREATE TABLE token_docs (hash TEXT PRIMARY KEY, doc TEXT NOT NULL);
     CREATE TABLE nodes (seq BIGSERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
     CREATE TABLE jobs (id BIGINT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, doc TEXT NOT NULL);
     CREATE INDEX jobs_tenant_state ON jobs (tenant, state);
     CREATE TABLE events (seq BIGSERIAL PRIMARY KEY, job BIGINT NOT NULL, at_ms BIGINT NOT NULL, kind TEXT NOT NULL,
                          message TEXT NOT NULL);
     CREATE INDEX events_job ON events (job, seq);
     CREATE TABLE usage (seq BIGSERIAL PRIMARY KEY, job BIGINT NOT NULL, tenant TEXT NOT NULL, start_ms BIGINT NOT NULL,
                         end_ms BIGINT NOT NULL, gpu_model TEXT NOT NULL, lifecycle TEXT NOT NULL,
                         gpu_seconds DOUBLE PRECISION NOT NULL, cpu_seconds DOUBLE PRECISION NOT NULL,
                         mem_gib_seconds DOUBLE PRECISION NOT NULL, cost DOUBLE PRECISION NOT NULL,
                         gpu_cost DOUBLE PRECISION NOT NULL, cpu_cost DOUBLE PRECISION NOT NULL,
                         mem_cost DOUBLE PRECISION NOT NULL, submitted_by TEXT NOT NULL);
     CREATE INDEX usage_tenant_time ON usage (tenant, start_ms);
     CREATE TABLE samples (at_ms BIGINT PRIMARY KEY, gpus_total BIGINT NOT NULL, gpus_allocated BIGINT NOT NULL,
                           queue_length BIGINT NOT NULL, running BIGINT NOT NULL);",
    // 2: the fencing epoch: each server that opens the store takes the next epoch, and every write checks it.
    "CREATE TABLE gpunet_leader (id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL,
                                 since TIMESTAMPTZ NOT NULL DEFAULT now());
     INSERT INTO gpunet_leader (id, epoch) VALUES (1, 0);",
    // 3: the GPU-seconds the agents' utilisation samples covered, and those weighted by utilisation.
    "ALTER TABLE usage ADD COLUMN sampled_gpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN busy_gpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;",
    // 4: the leader's lease (see `pg_lease`): who holds the epoch, where clients reach it, its session (to see it
    // gone at once when its process dies) and until when it holds it without renewing.
    "ALTER TABLE gpunet_leader ADD COLUMN holder TEXT NOT NULL DEFAULT '',
                               ADD COLUMN address TEXT NOT NULL DEFAULT '',
                               ADD COLUMN holder_pid INTEGER,
                               ADD COLUMN holder_started TIMESTAMPTZ,
                               ADD COLUMN lease_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity';",
];

/// Key of the advisory lock that serialises migrations of servers starting at once ("gpunet" in ASCII).
const MIGRATION_LOCK: i64 = 0x6770_756e_6574;

/// Reader connections (the pool): queries of the portal and the API run beside each other and beside the writer.
const READERS: usize = 4;

/// Most batches in one group commit.
const MAX_GROUP: usize = 4096;

/// Rows per page when exporting.
const PAGE: i64 = 5000;

type Request = (Vec<Write>, Done);
type ReadJob = Box<dyn FnOnce(&Target, &mut Option<Client>) + Send>;

/// The PostgreSQL store.
pub struct PgStore {
    target: String,
    epoch: i64,
    writer: Sender<Request>,
    readers: Sender<ReadJob>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("target", &self.target).finish_non_exhaustive()
    }
}

/// A parsed store URL: where to connect, and how — with `sslrootcert=FILE`, over TLS verified against that CA.
#[derive(Clone)]
pub(crate) struct Target {
    cfg: Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl std::ops::Deref for Target {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.cfg
    }
}

impl std::ops::DerefMut for Target {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.cfg
    }
}

/// Parses a `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?OPTIONS]` URL.
///
/// TLS: `sslrootcert=FILE` (PEM: the CA that signed the database's certificate) turns it on for every connection;
/// the certificate and the host name are always verified (libpq's `verify-full`): `sslmode` may be absent, `require`,
/// `verify-ca` or `verify-full`, all meaning that. `prefer` with `sslrootcert` is refused (a plain answer from
/// anyone in between would turn TLS off), and so is `require` (or `verify-*`) without it: a certificate that nothing
/// verifies protects nothing. Without either, connections are plain (and `prefer` alone is the driver's). A Unix
/// socket host takes no TLS.
pub(crate) fn parse(url: &str) -> Result<Target, StoreError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(StoreError::Url { reason: "it must start with postgres:// or postgresql://".into() });
    }
    // `sslrootcert` is ours, not the parser's; libpq's `verify-ca`/`verify-full` are `require` to it.
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (mut root, mut mode, mut rest) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            // A path may be written with `%2F` for `/`.
            Some(("sslrootcert", v)) => {
                root = Some(percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned())
            }
            Some(("sslmode", v)) => mode = Some(v.to_string()),
            _ => rest.push(pair),
        }
    }
    match (mode.as_deref(), root.is_some()) {
        (None | Some("disable" | "prefer"), false) => {}
        (Some("disable"), true) => {
            return Err(StoreError::Url { reason: "sslmode=disable contradicts sslrootcert".into() });
        }
        (Some("require" | "verify-ca" | "verify-full"), false) => {
            return Err(StoreError::Url {
                reason: "sslmode=require needs sslrootcert=FILE (the CA that signed the database's certificate): \
                         gpunet verifies the certificate"
                    .into(),
            });
        }
        (None | Some("require" | "verify-ca" | "verify-full"), true) => rest.push("sslmode=require"),
        (Some("prefer"), true) => {
            return Err(StoreError::Url {
                reason: "sslmode=prefer with sslrootcert: anyone between may strip TLS off; use sslmode=require".into(),
            });
        }
        (Some(m), _) => {
            return Err(StoreError::Url {
                reason: format!("sslmode={m}: use disable, prefer, require, verify-ca or verify-full"),
            });
        }
    };
    let url = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
    // The parser's message names the option at fault, never the password.
    let mut cfg: Config = url.parse().map_err(|e: postgres::Error| StoreError::Url { reason: e.to_string() })?;
    if cfg.get_hosts().is_empty() {
        return Err(StoreError::Url { reason: "it names no host".into() });
    }
    if cfg.get_dbname().is_none() {
        return Err(StoreError::Url { reason: "it names no database (postgres://USER@HOST/DB)".into() });
    }
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(Duration::from_secs(10));
    }
    cfg.application_name("gpunet");
    let tls = root.as_deref().map(tls_to).transpose()?;
    Ok(Target { cfg, tls })
}

/// A TLS connector that trusts only the CA certificates in the PEM file `file`.
fn tls_to(file: &str) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer};
    let bad = |reason: String| StoreError::Url { reason: format!("sslrootcert {file}: {reason}") };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(file).map_err(|e| bad(e.to_string()))? {
        roots.add(cert.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("holds no certificate".into()));
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Where the store is, without the password: `postgres://USER@HOST:PORT/DB`, and `?sslmode=verify-full` over TLS.
pub(crate) fn describe(t: &Target) -> String {
    let host = match t.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => String::new(),
    };
    let port = t.get_ports().first().map_or(String::new(), |p| format!(":{p}"));
    let user = t.get_user().map_or(String::new(), |u| format!("{u}@"));
    let tls = if t.tls.is_some() { "?sslmode=verify-full" } else { "" };
    format!("postgres://{user}{host}{port}/{}{tls}", t.get_dbname().unwrap_or(""))
}

pub(crate) fn connect(t: &Target) -> Result<Client, StoreError> {
    let mut c = match &t.tls {
        Some(tls) => t.cfg.connect(tls.clone())?,
        None => t.cfg.connect(NoTls)?,
    };
    // Acknowledged means committed on disk: a database whose default is `synchronous_commit = off` gets `on` for
    // our sessions (`local`, `remote_write`, `remote_apply` are kept: they are at least as durable).
    let sc: String = c.query_one("SELECT current_setting('synchronous_commit')", &[])?.get(0);
    if sc == "off" {
        c.batch_execute("SET synchronous_commit TO on")?;
    }
    Ok(c)
}

pub(crate) fn migrate(c: &mut Client) -> Result<(), StoreError> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS gpunet_schema (version INTEGER NOT NULL)")?;
    let v: i32 = match tx.query_opt("SELECT version FROM gpunet_schema", &[])? {
        Some(r) => r.get(0),
        None => {
            tx.execute("INSERT INTO gpunet_schema (version) VALUES (0)", &[])?;
            0
        }
    };
    if v as usize > MIGRATIONS.len() {
        return Err(StoreError::TooNew { found: v as u32, supported: MIGRATIONS.len() as u32 });
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(v as usize) {
        tx.batch_execute(m)?;
        tx.execute("UPDATE gpunet_schema SET version = $1", &[&((i + 1) as i32)])?;
        tracing::info!(version = i + 1, "applied PostgreSQL store migration");
    }
    tx.commit()?;
    Ok(())
}

/// How long the writer's session may sit inside a transaction without sending anything before PostgreSQL ends it. A
/// write group sends its statements back to back; a leader paused in the middle of one (SIGSTOP, a stalled VM) would
/// otherwise hold its share lock on the epoch row for as long as it is paused, and no replica could take over (the
/// takeover updates that row). Ended, the transaction is rolled back, and the leader finds its connection gone when it
/// resumes: it commits nothing.
pub(crate) const WRITER_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// Settings of the writer's session (see [`WRITER_IDLE_IN_TRANSACTION`]).
fn writer_session(c: &mut Client) -> Result<(), StoreError> {
    c.batch_execute(&format!("SET idle_in_transaction_session_timeout = {}", WRITER_IDLE_IN_TRANSACTION.as_millis()))?;
    Ok(())
}

/// Takes the next fencing epoch (waiting for commits in flight under the previous one).
fn take_over(c: &mut Client) -> Result<i64, StoreError> {
    let r =
        c.query_one("UPDATE gpunet_leader SET epoch = epoch + 1, since = now() WHERE id = 1 RETURNING epoch", &[])?;
    Ok(r.get(0))
}

/// The writer's prepared statements.
struct Statements {
    epoch: Statement,
    /// A group of job upserts and events only (every submission's): checked against the epoch and written in one
    /// statement, one round trip ([`write_group`]).
    fenced_jobs_events: Statement,
    jobs: Statement,
    events: Statement,
    tenant: Statement,
    token: Statement,
    token_doc: Statement,
    revoke_token: Statement,
    revoke_doc: Statement,
    node: Statement,
    usage: Statement,
    sample: Statement,
    prune_samples: Statement,
}

impl Statements {
    fn prepare(c: &mut Client) -> Result<Statements, postgres::Error> {
        Ok(Statements {
            epoch: c.prepare("SELECT epoch FROM gpunet_leader WHERE id = 1 FOR SHARE")?,
            // One statement is one transaction. The share lock on the epoch row orders it before any takeover or
            // after it (then, read committed, it reads the row's new version), and the inserts take their rows only
            // when the epoch read is this writer's: a fenced writer inserts nothing and is told by the epoch returned.
            fenced_jobs_events: c.prepare(
                "WITH fence AS (SELECT epoch FROM gpunet_leader WHERE id = 1 FOR SHARE),
                 j AS (INSERT INTO jobs (id, tenant, state, doc)
                       SELECT u.id, u.tenant, u.state, u.doc
                       FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[]) AS u(id, tenant, state, doc), fence
                       WHERE fence.epoch = $1
                       ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, state = excluded.state, doc = excluded.doc),
                 e AS (INSERT INTO events (job, at_ms, kind, message)
                       SELECT u.j, u.a, u.k, u.m
                       FROM unnest($6::bigint[], $7::bigint[], $8::text[], $9::text[]) WITH ORDINALITY AS u(j, a, k, m, n), fence
                       WHERE fence.epoch = $1
                       ORDER BY u.n)
                 SELECT epoch FROM fence",
            )?,
            jobs: c.prepare(
                "INSERT INTO jobs (id, tenant, state, doc)
                 SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[])
                 ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, state = excluded.state, doc = excluded.doc",
            )?,
            // Sequence numbers follow the order of the group (WITH ORDINALITY … ORDER BY).
            events: c.prepare(
                "INSERT INTO events (job, at_ms, kind, message)
                 SELECT j, a, k, m FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[])
                 WITH ORDINALITY AS u(j, a, k, m, n) ORDER BY n",
            )?,
            tenant: c.prepare(
                "INSERT INTO tenants (name, doc) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
            )?,
            token: c.prepare(
                "INSERT INTO tokens (hash, role, tenant) VALUES ($1, $2, $3)
                 ON CONFLICT (hash) DO UPDATE SET role = excluded.role, tenant = excluded.tenant",
            )?,
            token_doc: c.prepare(
                "INSERT INTO token_docs (hash, doc) VALUES ($1, $2) ON CONFLICT (hash) DO UPDATE SET doc = excluded.doc",
            )?,
            revoke_token: c.prepare("DELETE FROM tokens WHERE hash = $1")?,
            revoke_doc: c.prepare("DELETE FROM token_docs WHERE hash = $1")?,
            node: c.prepare(
                "INSERT INTO nodes (name, doc) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
            )?,
            usage: c.prepare(
                "INSERT INTO usage (job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds,
                                    mem_gib_seconds, cost, gpu_cost, cpu_cost, mem_cost, submitted_by,
                                    sampled_gpu_seconds, busy_gpu_seconds)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            )?,
            sample: c.prepare(
                "INSERT INTO samples (at_ms, gpus_total, gpus_allocated, queue_length, running)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (at_ms) DO UPDATE SET gpus_total = excluded.gpus_total,
                     gpus_allocated = excluded.gpus_allocated, queue_length = excluded.queue_length,
                     running = excluded.running",
            )?,
            prune_samples: c.prepare("DELETE FROM samples WHERE at_ms < $1")?,
        })
    }
}

/// Text as PostgreSQL stores it: its `text` cannot hold NUL, which would fail the commit (and turn the server
/// read-only) for one NUL in a job's event or a node's name; NUL becomes U+FFFD. Documents are JSON, where NUL is
/// escaped already.
fn text(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// Writes a group of batches in one transaction, in order. Job upserts and events, the bulk of every group, go in
/// one statement each (a job written twice in the group keeps its last document, as applying in order would).
fn write_group(c: &mut Client, s: &Statements, epoch: i64, group: &[Request]) -> Result<(), StoreError> {
    let mut a = JobsAndEvents::default();
    let others: Vec<&Write> = group.iter().flat_map(|(b, _)| b).filter(|w| !a.add(w)).collect();
    if others.is_empty() {
        return write_jobs_and_events(c, s, epoch, &a);
    }
    let mut tx = c.transaction()?;
    // Fencing: the share lock on the epoch row orders this transaction before any takeover (which updates the row)
    // or after it, and then it is refused. So once another server took over, nothing of this one's commits.
    let now: i64 = tx.query_one(&s.epoch, &[])?.get(0);
    if now != epoch {
        return Err(StoreError::Fenced { epoch: epoch as u64, newer: now as u64 });
    }
    for w in others {
        match w {
            Write::Tenant { name, doc } => {
                tx.execute(&s.tenant, &[&text(name), &doc.to_string()])?;
            }
            Write::Token { hash, role, tenant } => {
                tx.execute(&s.token, &[&text(hash), &role.as_str(), &tenant.as_deref().map(text)])?;
            }
            Write::TokenDoc { hash, doc } => {
                tx.execute(&s.token_doc, &[&text(hash), &doc.to_string()])?;
            }
            Write::RevokeToken { hash } => {
                tx.execute(&s.revoke_token, &[&text(hash)])?;
                tx.execute(&s.revoke_doc, &[&text(hash)])?;
            }
            Write::Node { name, doc } => {
                tx.execute(&s.node, &[&text(name), &doc.to_string()])?;
            }
            Write::Usage(u) => {
                tx.execute(
                    &s.usage,
                    &[
                        &big(u.job),
                        &text(&u.tenant),
                        &big(u.start_ms),
                        &big(u.end_ms),
                        &text(&u.gpu_model),
                        &text(&u.lifecycle),
                        &u.gpu_seconds,
                        &u.cpu_seconds,
                        &u.mem_gib_seconds,
                        &u.cost,
                        &u.gpu_cost,
                        &u.cpu_cost,
                        &u.mem_cost,
                        &text(&u.submitted_by),
                        &u.sampled_gpu_seconds,
                        &u.busy_gpu_seconds,
                    ],
                )?;
            }
            Write::Sample { sample: x, keep_since_ms } => {
                tx.execute(
                    &s.sample,
                    &[&big(x.at_ms), &big(x.gpus_total), &big(x.gpus_allocated), &big(x.queue_length), &big(x.running)],
                )?;
                tx.execute(&s.prune_samples, &[&big(*keep_since_ms)])?;
            }
            Write::Job { .. } | Write::Event { .. } => unreachable!("taken by `JobsAndEvents::add`"),
        }
    }
    if !a.j_id.is_empty() {
        tx.execute(&s.jobs, &[&a.j_id, &a.j_tenant, &a.j_state, &a.j_doc])?;
    }
    if !a.e_job.is_empty() {
        tx.execute(&s.events, &[&a.e_job, &a.e_at, &a.e_kind, &a.e_msg])?;
    }
    Ok(tx.commit()?)
}

/// The writes of job upserts and events (in order: a job written twice in the group keeps its last document), as the
/// arrays of the `unnest` statements.
#[derive(Default)]
struct JobsAndEvents {
    job_at: HashMap<u64, usize>,
    j_id: Vec<i64>,
    j_tenant: Vec<String>,
    j_state: Vec<String>,
    j_doc: Vec<String>,
    e_job: Vec<i64>,
    e_at: Vec<i64>,
    e_kind: Vec<String>,
    e_msg: Vec<String>,
}

impl JobsAndEvents {
    /// Takes a job upsert or an event; false for any other write.
    fn add(&mut self, w: &Write) -> bool {
        match w {
            Write::Job { id, tenant, state, doc } => match self.job_at.get(id) {
                Some(&i) => {
                    self.j_tenant[i] = text(tenant);
                    self.j_state[i] = text(state);
                    self.j_doc[i] = doc.clone();
                }
                None => {
                    self.job_at.insert(*id, self.j_id.len());
                    self.j_id.push(big(*id));
                    self.j_tenant.push(text(tenant));
                    self.j_state.push(text(state));
                    self.j_doc.push(doc.clone());
                }
            },
            Write::Event { job, at_ms, kind, message } => {
                self.e_job.push(big(*job));
                self.e_at.push(big(*at_ms));
                self.e_kind.push(text(kind));
                self.e_msg.push(text(message));
            }
            _ => return false,
        }
        true
    }
}

/// A group of job upserts and events only, in one statement checked against the epoch (one round trip and the
/// commit, instead of a transaction's five).
fn write_jobs_and_events(c: &mut Client, s: &Statements, epoch: i64, a: &JobsAndEvents) -> Result<(), StoreError> {
    let now: i64 = c
        .query_one(
            &s.fenced_jobs_events,
            &[&epoch, &a.j_id, &a.j_tenant, &a.j_state, &a.j_doc, &a.e_job, &a.e_at, &a.e_kind, &a.e_msg],
        )?
        .get(0);
    if now != epoch {
        return Err(StoreError::Fenced { epoch: epoch as u64, newer: now as u64 });
    }
    Ok(())
}

/// The writer thread (see the module's doc).
fn writer(mut c: Client, s: Statements, epoch: i64, rx: Receiver<Request>) {
    let mut refused: Option<String> = None;
    while let Ok(first) = rx.recv() {
        if let Some(e) = &refused {
            let (_, done) = first;
            done(Err(StoreError::Commit(format!(
                "an earlier write was refused ({e}); restart once the cause is fixed"
            ))));
            continue;
        }
        let mut group = vec![first];
        while let Ok(more) = rx.try_recv() {
            group.push(more);
            if group.len() >= MAX_GROUP {
                break;
            }
        }
        let reply = write_group(&mut c, &s, epoch, &group).map_err(|e| e.to_string());
        if let Err(e) = &reply {
            tracing::error!(error = %e, batches = group.len(), "PostgreSQL commit failed; refusing later writes");
            refused = Some(e.clone());
        }
        for (_, done) in group {
            done(reply.clone().map_err(StoreError::Commit));
        }
    }
}

/// A reader thread: runs queries on its connection, opened on first use and again after it was lost.
fn reader(cfg: Target, rx: Arc<Mutex<Receiver<ReadJob>>>) {
    let mut client: Option<Client> = None;
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        job(&cfg, &mut client);
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`), migrates the schema and starts the writer
    /// and the reader pool. Safe to call from inside an async runtime.
    pub fn open(url: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with(url, None)
    }

    /// Like [`PgStore::open`], but writes under `epoch`, which a leader election took (`pg_lease`), instead of
    /// taking the next one: refused at once when the database holds another epoch already.
    pub fn open_at(url: &str, epoch: u64) -> Result<PgStore, StoreError> {
        PgStore::open_with(url, Some(epoch as i64))
    }

    fn open_with(url: &str, at: Option<i64>) -> Result<PgStore, StoreError> {
        let cfg = parse(url)?;
        let target = describe(&cfg);
        let (ready_tx, ready_rx) = sync_channel::<Result<i64, StoreError>>(1);
        let (tx, rx) = channel::<Request>();
        let wcfg = cfg.clone();
        let spawn_err = |e| StoreError::Io { path: target.clone(), source: e };
        std::thread::Builder::new()
            .name("gpunet-pg-writer".into())
            .spawn(move || {
                let opened = connect(&wcfg).and_then(|mut c| {
                    writer_session(&mut c)?;
                    migrate(&mut c)?;
                    let epoch = match at {
                        None => take_over(&mut c)?,
                        Some(e) => {
                            let now: i64 = c.query_one("SELECT epoch FROM gpunet_leader WHERE id = 1", &[])?.get(0);
                            if now != e {
                                return Err(StoreError::Fenced { epoch: e as u64, newer: now as u64 });
                            }
                            e
                        }
                    };
                    let s = Statements::prepare(&mut c)?;
                    Ok((c, s, epoch))
                });
                match opened {
                    Ok((c, s, epoch)) => {
                        let _ = ready_tx.send(Ok(epoch));
                        writer(c, s, epoch, rx);
                    }
                    Err(e) => drop(ready_tx.send(Err(e))),
                }
            })
            .map_err(spawn_err)?;
        let epoch = ready_rx.recv().map_err(|_| StoreError::Closed)??;
        let (rtx, rrx) = channel::<ReadJob>();
        let rrx = Arc::new(Mutex::new(rrx));
        for i in 0..READERS {
            let (cfg, rrx) = (cfg.clone(), rrx.clone());
            std::thread::Builder::new()
                .name(format!("gpunet-pg-reader-{i}"))
                .spawn(move || reader(cfg, rrx))
                .map_err(spawn_err)?;
        }
        tracing::info!(store = %target, epoch, "opened the PostgreSQL store; writes of servers before this one are refused");
        Ok(PgStore { target, epoch, writer: tx, readers: rtx })
    }

    /// This store's fencing epoch: the one it took at open; a store opened later on the same database has a higher
    /// one, and from then on this one's commits are refused.
    pub fn epoch(&self) -> u64 {
        self.epoch as u64
    }

    /// Where the store is, without the password.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Runs `f` on a reader connection and waits for its answer.
    fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = sync_channel(1);
        let job: ReadJob = Box::new(move |cfg, slot| {
            if slot.as_ref().is_some_and(|c| c.is_closed()) {
                *slot = None;
            }
            let r = match slot {
                Some(c) => f(c),
                None => connect(cfg).and_then(|c| f(slot.insert(c))),
            };
            let _ = tx.send(r);
        });
        self.readers.send(job).map_err(|_| StoreError::Closed)?;
        rx.recv().map_err(|_| StoreError::Closed)?
    }

    /// Keyset-paged export of one table: `sql` takes the last key seen as `$1` and returns rows ordered by it.
    fn export_paged(
        &self,
        sql: &'static str,
        row: fn(&postgres::Row) -> Result<(i64, Write), StoreError>,
        each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut after = i64::MIN;
        loop {
            let page =
                self.read(move |c| c.query(sql, &[&after, &PAGE])?.iter().map(row).collect::<Result<Vec<_>, _>>())?;
            let Some((last, _)) = page.last() else { return Ok(()) };
            after = *last;
            let full = page.len() as i64 == PAGE;
            each(page.into_iter().map(|(_, w)| w).collect())?;
            if !full {
                return Ok(());
            }
        }
    }
}

fn decode(what: &'static str, key: String, s: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Decode { what, key, source: e })
}

fn usage_row(r: &postgres::Row) -> UsageRow {
    UsageRow {
        job: r.get::<_, i64>(0) as u64,
        tenant: r.get(1),
        start_ms: r.get::<_, i64>(2) as u64,
        end_ms: r.get::<_, i64>(3) as u64,
        gpu_model: r.get(4),
        lifecycle: r.get(5),
        gpu_seconds: r.get(6),
        cpu_seconds: r.get(7),
        mem_gib_seconds: r.get(8),
        cost: r.get(9),
        gpu_cost: r.get(10),
        cpu_cost: r.get(11),
        mem_cost: r.get(12),
        submitted_by: r.get(13),
        sampled_gpu_seconds: r.get(14),
        busy_gpu_seconds: r.get(15),
    }
}

const USAGE_COLUMNS: &str = "job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds, \
                             mem_gib_seconds, cost, gpu_cost, cpu_cost, mem_cost, submitted_by, \
                             sampled_gpu_seconds, busy_gpu_seconds";

fn sample_row(r: &postgres::Row) -> SampleRow {
    SampleRow {
        at_ms: r.get::<_, i64>(0) as u64,
        gpus_total: r.get::<_, i64>(1) as u64,
        gpus_allocated: r.get::<_, i64>(2) as u64,
        queue_length: r.get::<_, i64>(3) as u64,
        running: r.get::<_, i64>(4) as u64,
    }
}

fn named_docs(
    c: &mut impl postgres::GenericClient,
    what: &'static str,
    sql: &str,
) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
    c.query(sql, &[])?
        .iter()
        .map(|r| {
            let (n, d): (String, String) = (r.get(0), r.get(1));
            let doc = decode(what, if what == "token" { n.chars().take(12).collect() } else { n.clone() }, &d)?;
            Ok((n, doc))
        })
        .collect()
}

fn tokens(c: &mut impl postgres::GenericClient) -> Result<Vec<TokenRow>, StoreError> {
    let mut out = Vec::new();
    for r in c.query("SELECT hash, role, tenant FROM tokens ORDER BY hash", &[])? {
        let role: String = r.get(1);
        // An unknown role grants nothing.
        let Some(role) = TokenRole::parse(&role) else {
            tracing::warn!(role = %role, "stored token with an unknown role ignored");
            continue;
        };
        out.push(TokenRow { hash: r.get(0), role, tenant: r.get(2) });
    }
    Ok(out)
}

impl Store for PgStore {
    fn load_meta(&self) -> Result<Snapshot, StoreError> {
        self.read(|c| {
            // One consistent snapshot of every table but the jobs (read by `jobs_page` at start-up, when no other
            // server writes: the old leader is fenced first, see `gpunet-server`'s `ha.rs`).
            let mut tx =
                c.build_transaction().isolation_level(IsolationLevel::RepeatableRead).read_only(true).start()?;
            let snap = Snapshot {
                tenants: named_docs(&mut tx, "tenant", "SELECT name, doc FROM tenants ORDER BY seq")?,
                tokens: tokens(&mut tx)?,
                token_docs: named_docs(&mut tx, "token", "SELECT hash, doc FROM token_docs ORDER BY hash")?,
                nodes: named_docs(&mut tx, "node", "SELECT name, doc FROM nodes ORDER BY seq")?,
                jobs: Vec::new(),
            };
            tx.commit()?;
            Ok(snap)
        })
    }

    fn jobs_page(&self, after: Option<u64>, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let (after, limit) = (after.map_or(-1, |a| a as i64), limit as i64);
        self.read(move |c| {
            let rows = c.query("SELECT id, doc FROM jobs WHERE id > $1 ORDER BY id LIMIT $2", &[&after, &limit])?;
            Ok(rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, String>(1))).collect())
        })
    }

    fn commit_async(&self, batch: Vec<Write>, done: Done) {
        if let Err(e) = self.writer.send((batch, done)) {
            let (_, done) = e.0;
            done(Err(StoreError::Closed));
        }
    }

    fn events(&self, job: u64) -> Result<Vec<EventRow>, StoreError> {
        self.read(move |c| {
            let rows =
                c.query("SELECT seq, job, at_ms, kind, message FROM events WHERE job = $1 ORDER BY seq", &[&big(job)])?;
            Ok(rows
                .iter()
                .map(|r| EventRow {
                    seq: r.get::<_, i64>(0) as u64,
                    job: r.get::<_, i64>(1) as u64,
                    at_ms: r.get::<_, i64>(2) as u64,
                    kind: r.get(3),
                    message: r.get(4),
                })
                .collect())
        })
    }

    fn ledger_totals(&self) -> Result<std::collections::BTreeMap<String, LedgerTotals>, StoreError> {
        self.read(|c| {
            let rows = c.query(
                "SELECT tenant, SUM(gpu_seconds)::DOUBLE PRECISION, SUM(cost)::DOUBLE PRECISION FROM usage GROUP BY tenant",
                &[],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), LedgerTotals { gpu_seconds: r.get(1), cost: r.get(2) })).collect())
        })
    }

    fn usage(&self, tenant: Option<&str>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>, StoreError> {
        let tenant = tenant.map(String::from);
        self.read(move |c| {
            let sql = format!(
                "SELECT {USAGE_COLUMNS} FROM usage
                 WHERE ($1::text IS NULL OR tenant = $1) AND end_ms > $2 AND start_ms < $3 ORDER BY seq"
            );
            Ok(c.query(&sql, &[&tenant, &big(from_ms), &big(to_ms)])?.iter().map(usage_row).collect())
        })
    }

    fn samples(&self, since_ms: u64) -> Result<Vec<SampleRow>, StoreError> {
        self.read(move |c| {
            let rows = c.query(
                "SELECT at_ms, gpus_total, gpus_allocated, queue_length, running FROM samples
                 WHERE at_ms >= $1 ORDER BY at_ms",
                &[&big(since_ms)],
            )?;
            Ok(rows.iter().map(sample_row).collect())
        })
    }

    fn probe_writable(&self) -> Result<(), StoreError> {
        // A read-only database (a hot standby, or `default_transaction_read_only`) refuses here, not at the first
        // request.
        self.read(|c| {
            let mut tx = c.transaction()?;
            tx.batch_execute("CREATE TEMPORARY TABLE gpunet_probe (x INTEGER) ON COMMIT DROP")?;
            let ro: String = tx.query_one("SELECT current_setting('transaction_read_only')", &[])?.get(0);
            tx.rollback()?;
            if ro == "on" {
                return Err(StoreError::Commit("the database is read-only (a standby?)".into()));
            }
            Ok(())
        })
    }

    fn counts(&self) -> Result<Counts, StoreError> {
        self.read(|c| {
            let r = c.query_one(
                "SELECT (SELECT count(*) FROM tenants), (SELECT count(*) FROM tokens), (SELECT count(*) FROM token_docs),
                        (SELECT count(*) FROM nodes), (SELECT count(*) FROM jobs), (SELECT count(*) FROM events),
                        (SELECT count(*) FROM usage), (SELECT count(*) FROM samples)",
                &[],
            )?;
            let n = |i| r.get::<_, i64>(i) as u64;
            Ok(Counts {
                tenants: n(0),
                tokens: n(1),
                token_docs: n(2),
                nodes: n(3),
                jobs: n(4),
                events: n(5),
                usage: n(6),
                samples: n(7),
            })
        })
    }

    fn export(&self, each: &mut dyn FnMut(Vec<Write>) -> Result<(), StoreError>) -> Result<(), StoreError> {
        let (tenants, toks, docs, nodes, samples) = self.read(|c| {
            Ok((
                named_docs(c, "tenant", "SELECT name, doc FROM tenants ORDER BY seq")?,
                tokens(c)?,
                named_docs(c, "token", "SELECT hash, doc FROM token_docs ORDER BY hash")?,
                named_docs(c, "node", "SELECT name, doc FROM nodes ORDER BY seq")?,
                c.query(
                    "SELECT at_ms, gpus_total, gpus_allocated, queue_length, running FROM samples ORDER BY at_ms",
                    &[],
                )?
                .iter()
                .map(sample_row)
                .collect::<Vec<_>>(),
            ))
        })?;
        each(tenants.into_iter().map(|(name, doc)| Write::Tenant { name, doc }).collect())?;
        each(toks.into_iter().map(|t| Write::Token { hash: t.hash, role: t.role, tenant: t.tenant }).collect())?;
        each(docs.into_iter().map(|(hash, doc)| Write::TokenDoc { hash, doc }).collect())?;
        each(nodes.into_iter().map(|(name, doc)| Write::Node { name, doc }).collect())?;
        self.export_paged(
            "SELECT id, tenant, state, doc FROM jobs WHERE id > $1 ORDER BY id LIMIT $2",
            |r| {
                let id: i64 = r.get(0);
                let doc = decode("job", id.to_string(), r.get(3))?.to_string();
                Ok((id, Write::Job { id: id as u64, tenant: r.get(1), state: r.get(2), doc }))
            },
            each,
        )?;
        self.export_paged(
            "SELECT seq, job, at_ms, kind, message FROM events WHERE seq > $1 ORDER BY seq LIMIT $2",
            |r| {
                let w = Write::Event {
                    job: r.get::<_, i64>(1) as u64,
                    at_ms: r.get::<_, i64>(2) as u64,
                    kind: r.get(3),
                    message: r.get(4),
                };
                Ok((r.get(0), w))
            },
            each,
        )?;
        self.export_paged(
            "SELECT job, tenant, start_ms, end_ms, gpu_model, lifecycle, gpu_seconds, cpu_seconds, mem_gib_seconds,
                    cost, gpu_cost, cpu_cost, mem_cost, submitted_by, sampled_gpu_seconds, busy_gpu_seconds, seq
             FROM usage WHERE seq > $1 ORDER BY seq LIMIT $2",
            |r| Ok((r.get(16), Write::Usage(usage_row(r)))),
            each,
        )?;
        each(samples.into_iter().map(|sample| Write::Sample { sample, keep_since_ms: 0 }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_cluster::PgCluster;

    #[test]
    fn urls_are_checked_and_described_without_the_password() {
        let e = PgStore::open("mysql://u:pw@h/db").unwrap_err().to_string();
        assert!(e.contains("postgres://") && !e.contains("pw"), "{e}");
        let e = PgStore::open("postgres://u:secret@h").unwrap_err().to_string();
        assert!(e.contains("database") && !e.contains("secret"), "{e}");
        let e = PgStore::open("postgres://u:secret@h/db?bogus=1").unwrap_err().to_string();
        assert!(e.contains("invalid") && !e.contains("secret"), "{e}");
        let cfg = parse("postgres://alice:secret@db.example:5433/gpunet").unwrap();
        assert_eq!(describe(&cfg), "postgres://alice@db.example:5433/gpunet");
    }

    #[test]
    fn an_unreachable_database_is_an_error_without_the_password() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = PgStore::open(&format!("postgres://u:hunter2@127.0.0.1:{port}/db?connect_timeout=5"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }

    /// Two servers starting at once on an empty database both migrate it without failing (the advisory lock), a
    /// second open applies nothing, and a schema newer than this binary is refused.
    #[test]
    fn migrations_run_once_and_a_newer_schema_is_refused() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("migrate").unwrap();
        let opens: Vec<_> = (0..3)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || PgStore::open(&url).map(drop))
            })
            .collect();
        for o in opens {
            o.join().unwrap().unwrap();
        }
        let mut c = url.parse::<Config>().unwrap().connect(NoTls).unwrap();
        let v: i32 = c.query_one("SELECT version FROM gpunet_schema", &[]).unwrap().get(0);
        assert_eq!(v as usize, MIGRATIONS.len());
        assert_eq!(c.query("SELECT * FROM gpunet_schema", &[]).unwrap().len(), 1);
        c.execute("UPDATE gpunet_schema SET version = 99", &[]).unwrap();
        let e = PgStore::open(&url).unwrap_err().to_string();
        assert!(e.contains("99") && e.contains("newer"), "{e}");
    }

    /// A leader paused inside a write group's transaction, holding its share lock on the epoch row, keeps no replica
    /// from taking over for longer than [`WRITER_IDLE_IN_TRANSACTION`]: its session is ended, and what it had begun
    /// commits nothing (`ha.rs`'s paused-leader test waited on such a lock once).
    #[test]
    fn a_writer_paused_inside_a_transaction_holds_a_takeover_back_only_briefly() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("paused").unwrap();
        drop(PgStore::open(&url).unwrap());
        let t = parse(&url).unwrap();
        let mut paused = connect(&t).unwrap();
        writer_session(&mut paused).unwrap();
        let mut tx = paused.transaction().unwrap();
        let before: i64 = tx.query_one("SELECT epoch FROM gpunet_leader WHERE id = 1 FOR SHARE", &[]).unwrap().get(0);
        // The transaction stays open and its client sends nothing more, as a paused leader's would.
        let t0 = std::time::Instant::now();
        let mut other = connect(&t).unwrap();
        let (done, took) = channel();
        std::thread::spawn(move || drop(done.send(take_over(&mut other).map_err(|e| e.to_string()))));
        let after = took
            .recv_timeout(WRITER_IDLE_IN_TRANSACTION * 4)
            .expect("the takeover still waits on the paused transaction's lock")
            .unwrap();
        let waited = t0.elapsed();
        assert_eq!(after, before + 1);
        assert!(waited + Duration::from_millis(500) >= WRITER_IDLE_IN_TRANSACTION, "the lock was held: {waited:?}");
        assert!(tx.execute("UPDATE gpunet_leader SET since = now() WHERE id = 1", &[]).is_err());
    }

    /// A write refused by the database fails its batch and every later one: what is stored stays a prefix of what
    /// was acknowledged.
    #[test]
    fn after_a_refused_commit_later_batches_are_refused_too() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("refuse").unwrap();
        let s = PgStore::open(&url).unwrap();
        let job = |id| Write::Job { id, tenant: "t".into(), state: "pending".into(), doc: "{}".into() };
        s.commit(vec![job(1)]).unwrap();
        // The database refuses events of kind `x` from now on.
        let mut admin = url.parse::<Config>().unwrap().connect(NoTls).unwrap();
        admin.batch_execute("ALTER TABLE events ADD CONSTRAINT no_x CHECK (kind <> 'x')").unwrap();
        let bad = Write::Event { job: 1, at_ms: 1, kind: "x".into(), message: String::new() };
        assert!(s.commit(vec![job(2), bad]).is_err());
        let e = s.commit(vec![job(3)]).unwrap_err().to_string();
        assert!(e.contains("earlier write was refused"), "{e}");
        let ids: Vec<u64> = s.load().unwrap().jobs.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![1]);
    }

    #[test]
    fn a_store_url_with_tls_options_is_checked_and_described() {
        let e = |url: &str| parse(url).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e("postgres://u:secret@h/db?sslmode=require").contains("needs sslrootcert"));
        assert!(e("postgres://u:secret@h/db?sslmode=verify-full").contains("needs sslrootcert"));
        assert!(e("postgres://u@h/db?sslmode=sometimes").contains("sslmode=sometimes"));
        assert!(e("postgres://u@h/db?sslmode=disable&sslrootcert=/x").contains("contradicts"));
        assert!(e("postgres://u@h/db?sslmode=prefer&sslrootcert=/x").contains("strip TLS"));
        let missing = e("postgres://u:secret@h/db?sslrootcert=%2Fno%2Fsuch.pem");
        assert!(missing.contains("sslrootcert /no/such.pem"), "{missing}");
        assert!(!missing.contains("secret"));
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(e(&format!("postgres://u@h/db?sslrootcert={}", empty.display())).contains("holds no certificate"));
        // Plain without TLS options; `prefer` without a CA stays plain.
        for url in ["postgres://u@h:5433/db", "postgres://u@h:5433/db?sslmode=prefer&connect_timeout=3"] {
            let t = parse(url).unwrap();
            assert!(t.tls.is_none());
            assert_eq!(describe(&t), "postgres://u@h:5433/db");
        }
        assert_eq!(
            parse("postgres://u@h/db?connect_timeout=3").unwrap().get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
    }

    /// A CA and a certificate signed by it for 127.0.0.1 and localhost: (CA, certificate, key), PEM.
    fn ca_and_server() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        ca.distinguished_name.push(rcgen::DnType::CommonName, "gpunet test CA");
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut p = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, "postgres");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (ca_pem, cert.pem(), key.serialize_pem())
    }

    /// With `sslrootcert`, every connection of the store (the writer's and the readers') is TLS, verified against
    /// that CA; another CA's certificate is refused, and so is a server without TLS when TLS is required.
    #[test]
    fn a_store_connects_over_tls_verified_against_its_ca() {
        let (ca, cert, key) = ca_and_server();
        let Some(pg) = PgCluster::start_tls_for_test(&cert, &key) else { return };
        let url = pg.create_database("tls").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &ca).unwrap();
        let store = PgStore::open(&format!("{url}?sslmode=verify-full&sslrootcert={}", ca_file.display())).unwrap();
        assert!(store.target().ends_with("/tls?sslmode=verify-full"), "{}", store.target());
        store
            .commit(vec![Write::Job { id: 7, tenant: "t".into(), state: "pending".into(), doc: "{}".into() }])
            .unwrap();
        assert_eq!(store.counts().unwrap().jobs, 1);
        let ssl: bool = store
            .read(|c| Ok(c.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])?.get(0)))
            .unwrap();
        assert!(ssl, "the reader's connection is TLS");
        // The writer's too: every session of the database user is.
        let plain: i64 = store
            .read(|c| {
                Ok(c.query_one(
                    "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                     WHERE a.application_name = 'gpunet' AND NOT s.ssl",
                    &[],
                )?
                .get(0))
            })
            .unwrap();
        assert_eq!(plain, 0);
        // Another CA: the certificate does not verify.
        let (other, _, _) = ca_and_server();
        let other_file = dir.path().join("other.pem");
        std::fs::write(&other_file, &other).unwrap();
        let e = PgStore::open(&format!("{url}?sslrootcert={}", other_file.display())).unwrap_err().to_string();
        assert!(e.to_lowercase().contains("certificate") || e.to_lowercase().contains("tls"), "{e}");
        // A server without TLS, when TLS is required.
        let Some(plain_pg) = PgCluster::start_for_test() else { return };
        let plain_url = plain_pg.create_database("plain").unwrap();
        assert!(PgStore::open(&format!("{plain_url}?sslrootcert={}", ca_file.display())).is_err());
    }

    /// A write that is not a job or an event (a tenant, a node, a usage row: the transaction path, not the one fenced
    /// statement of submissions) is refused the same once another store opened the database.
    #[test]
    fn a_fenced_store_commits_no_tenant_node_or_usage_row_either() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("fence_tx").unwrap();
        let old = PgStore::open(&url).unwrap();
        old.commit(vec![Write::Tenant { name: "a".into(), doc: serde_json::json!({"name": "a"}) }]).unwrap();
        let new = PgStore::open(&url).unwrap();
        let e = old
            .commit(vec![
                Write::Tenant { name: "b".into(), doc: serde_json::json!({"name": "b"}) },
                Write::Job { id: 1, tenant: "b".into(), state: "pending".into(), doc: "{}".into() },
            ])
            .unwrap_err()
            .to_string();
        assert!(e.contains("newer server"), "{e}");
        let c = new.counts().unwrap();
        assert_eq!((c.tenants, c.jobs), (1, 0));
    }

    /// A server that was paused (or partitioned) while another opened the database must not commit anything
    /// afterwards: its writes are refused, its acknowledged ones are all there, and the new one writes on.
    #[test]
    fn a_store_opened_later_on_the_database_fences_the_earlier_one() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("fence").unwrap();
        // A submission's batch: the job and its event (written in one fenced statement, `write_jobs_and_events`).
        fn submitted(id: u64) -> Vec<Write> {
            vec![
                Write::Job { id, tenant: "t".into(), state: "pending".into(), doc: "{}".into() },
                Write::Event { job: id, at_ms: 1, kind: "submitted".into(), message: String::new() },
            ]
        }
        let old = Arc::new(PgStore::open(&url).unwrap());
        old.commit(submitted(1)).unwrap();
        // The old server keeps committing from 4 threads while the new one takes over.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let (old, stop) = (old.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut acked = Vec::new();
                    for i in 0.. {
                        let id = 1000 * (t + 1) + i;
                        match old.commit(submitted(id)) {
                            Ok(()) => acked.push(id),
                            Err(e) => return (acked, Some(e.to_string())),
                        }
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                    }
                    (acked, None)
                })
            })
            .collect();
        while old.counts().unwrap().jobs < 50 {
            std::thread::yield_now();
        }
        let new = PgStore::open(&url).unwrap();
        assert!(new.epoch() > old.epoch());
        let e = old.commit(submitted(2)).unwrap_err().to_string();
        assert!(e.contains("newer server") || e.contains("earlier write was refused"), "{e}");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut acked = vec![1];
        for w in writers {
            let (a, err) = w.join().unwrap();
            let err = err.expect("every writer of the old server was refused");
            assert!(err.contains("newer server") || err.contains("earlier write"), "{err}");
            acked.extend(a);
        }
        new.commit(submitted(3)).unwrap();
        let stored: std::collections::BTreeSet<u64> = new.load().unwrap().jobs.iter().map(|(id, _)| *id).collect();
        acked.push(3);
        let acked: std::collections::BTreeSet<u64> = acked.into_iter().collect();
        assert_eq!(stored, acked, "exactly what was acknowledged, nothing the old server wrote after the takeover");
        // And the events of exactly those jobs.
        assert_eq!(new.counts().unwrap().events, acked.len() as u64);
        for id in [2, 999_999] {
            assert!(new.events(id).unwrap().is_empty());
        }
    }
}
