//! Leader election among gpunet servers that share one PostgreSQL database: the one row of `gpunet_leader` is a lease
//! that carries the fencing epoch [`PgStore`](crate::PgStore) checks in every group commit.
//!
//! **Why a lease row rather than a session advisory lock.** An advisory lock is held as long as its session lives. A
//! leader that is paused (SIGSTOP, a stalled VM) or cut off from its clients but not from the database keeps its
//! session — its kernel still answers TCP keepalives — and so would keep the lock for ever: no standby could take
//! over. A lease with an expiry in the *database's* clock (one clock for every server, so no skew between them) is
//! taken over once the leader stops renewing it, whatever the reason. Waiting out a whole lease after a crash would be
//! slow, though, so the row also names the leader's session (its backend pid and start time): a standby takes over at
//! once when that session has left `pg_stat_activity` — a killed process's socket is closed by its kernel, and
//! PostgreSQL ends the session at once.
//!
//! **Fencing.** Taking the lease takes the next epoch in the same statement. A group commit reads the epoch `FOR
//! SHARE` and is refused when it is not its own, so once a standby took over, nothing the old leader still sends is
//! committed — a paused leader that wakes up is refused by the database whatever its own clock says. The leader, for
//! its part, counts its lease as held only until `ttl` (less a tenth, for clock-rate differences) after it *sent* its
//! last successful renewal, on its monotonic clock, which runs on while the process is stopped: it stops serving
//! before any standby may take over.
//!
//! Each [`Elector`] runs on a thread of its own with its own connection (the synchronous client cannot run inside the
//! server's async runtime) and reports every change of [`Role`] to a callback.

use crate::pg::{connect, migrate, parse};
use crate::StoreError;
use postgres::Client;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

/// How a server takes part in the election.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// This server's name in the lease row (unique per replica, for the logs).
    pub holder: String,
    /// The URL clients reach this server at; standbys send clients there while it leads.
    pub address: String,
    /// A lease not renewed for this long may be taken over (in the database's clock).
    pub ttl: Duration,
    /// The leader renews this often (well below `ttl`).
    pub renew_every: Duration,
    /// A standby tries to take the lease this often.
    pub poll_every: Duration,
}

/// What a server is in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// No attempt finished yet.
    Starting,
    /// Another server leads, reachable at `leader`; `None` when none holds a live lease, or the database cannot be
    /// reached.
    Standby {
        /// The leader's address.
        leader: Option<String>,
    },
    /// This server leads with fencing epoch `epoch`, until `valid_until` unless the lease is renewed before.
    Leader {
        /// The epoch its writes carry.
        epoch: u64,
        /// When it must stop acting as leader unless renewed (this process's monotonic clock).
        valid_until: Instant,
    },
}

impl Role {
    /// Whether this is a leader whose lease still holds now.
    pub fn leads_now(&self) -> bool {
        matches!(self, Role::Leader { valid_until, .. } if Instant::now() < *valid_until)
    }
}

/// The leader's session, as `pg_stat_activity` shows it while it lives.
const HOLDER_ALIVE: &str =
    "EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.holder_pid AND a.backend_start = l.holder_started)";

/// One attempt to take the lease: the new epoch when the lease was free (expired, released, or its holder's session
/// is gone) and is this connection's now.
pub(crate) fn try_acquire(c: &mut Client, cfg: &LeaseConfig) -> Result<Option<u64>, StoreError> {
    let sql = format!(
        "UPDATE gpunet_leader l
            SET epoch = l.epoch + 1, holder = $1, address = $2, holder_pid = pg_backend_pid(),
                holder_started = (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()),
                lease_until = clock_timestamp() + make_interval(secs => $3), since = now()
          WHERE l.id = 1 AND (l.lease_until < clock_timestamp() OR NOT {HOLDER_ALIVE})
          RETURNING l.epoch"
    );
    let row = c.query_opt(&sql, &[&cfg.holder, &cfg.address, &cfg.ttl.as_secs_f64()])?;
    Ok(row.map(|r| r.get::<_, i64>(0) as u64))
}

/// Renews the lease of `epoch` held by this connection's session; false when it is no longer ours.
pub(crate) fn renew(c: &mut Client, epoch: u64, ttl: Duration) -> Result<bool, StoreError> {
    let n = c.execute(
        "UPDATE gpunet_leader SET lease_until = clock_timestamp() + make_interval(secs => $2)
          WHERE id = 1 AND epoch = $1 AND holder_pid = pg_backend_pid()",
        &[&(epoch as i64), &ttl.as_secs_f64()],
    )?;
    Ok(n == 1)
}

/// Gives the lease of `epoch` up (a clean stop): a standby takes over at its next attempt.
pub(crate) fn release(c: &mut Client, epoch: u64) -> Result<(), StoreError> {
    c.execute("UPDATE gpunet_leader SET lease_until = '-infinity' WHERE id = 1 AND epoch = $1", &[&(epoch as i64)])?;
    Ok(())
}

/// The address of the leader whose lease is live, if any.
pub(crate) fn current_leader(c: &mut Client) -> Result<Option<String>, StoreError> {
    let sql = format!(
        "SELECT address FROM gpunet_leader l WHERE id = 1 AND lease_until > clock_timestamp() AND {HOLDER_ALIVE}"
    );
    Ok(c.query_opt(&sql, &[])?.map(|r| r.get(0)))
}

/// A server's part in the election, running on its own thread until [`Elector::stop`] (or drop), which gives up a
/// lease it holds.
#[derive(Debug)]
pub struct Elector {
    stop: Option<SyncSender<Resign>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Elector {
    /// Connects to `url` (migrating the schema if needed), then takes part in the election, calling `on_role` with
    /// every new role (and with every renewal of its lease while it leads). Fails when the database cannot be
    /// reached at first.
    pub fn start(
        url: &str,
        cfg: LeaseConfig,
        on_role: impl FnMut(Role) + Send + 'static,
    ) -> Result<Elector, StoreError> {
        let mut pg = parse(url)?;
        pg.application_name("gpunet-lease");
        let (ready_tx, ready_rx) = sync_channel::<Result<(), StoreError>>(1);
        let (stop_tx, stop_rx) = sync_channel::<Resign>(4);
        let thread = std::thread::Builder::new()
            .name("gpunet-pg-lease".into())
            .spawn(move || {
                let first = connect(&pg).and_then(|mut c| {
                    migrate(&mut c)?;
                    Ok(c)
                });
                match first {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        campaign(&pg, Some(c), &cfg, &stop_rx, on_role);
                    }
                    Err(e) => drop(ready_tx.send(Err(e))),
                }
            })
            .map_err(|e| StoreError::Io { path: "the lease thread".into(), source: e })?;
        ready_rx.recv().map_err(|_| StoreError::Closed)??;
        Ok(Elector { stop: Some(stop_tx), thread: Some(thread) })
    }

    /// A handle that gives up the lease of a term this server leads ([`Resigner::resign`]).
    pub fn resigner(&self) -> Resigner {
        Resigner(self.stop.clone())
    }

    /// Leaves the election, giving up the lease if this server holds it, and waits for the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        // Resigners hold the channel too: say stop rather than hang up.
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(Resign(None));
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A leader's request to give the lease of a term up (`None`: leave the election).
#[derive(Debug, Clone, Copy)]
pub struct Resign(Option<u64>);

/// Gives up the lease of a term ([`Elector::resigner`]).
#[derive(Debug, Clone)]
pub struct Resigner(Option<SyncSender<Resign>>);

impl Resigner {
    /// Gives up the lease of term `epoch` if this server still holds it, and stays a standby for two polls, so that
    /// another replica takes over first when there is one (a leader whose store refused a write cannot serve:
    /// another one, or this one with a new connection, can).
    pub fn resign(&self, epoch: u64) {
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(Resign(Some(epoch)));
        }
    }
}

/// The election loop (see the module's doc). Returns when told to stop (`Resign(None)`) or `stop` is dropped.
fn campaign(
    pg: &crate::pg::Target,
    mut client: Option<Client>,
    cfg: &LeaseConfig,
    stop: &Receiver<Resign>,
    mut on_role: impl FnMut(Role),
) {
    let mut last = Role::Starting;
    let mut publish = |r: Role, last: &mut Role| {
        if r != *last {
            *last = r.clone();
            on_role(r);
        }
    };
    // The local end of a lease: `ttl` after the renewal was sent, less a tenth for clock-rate differences.
    let hold = cfg.ttl - cfg.ttl / 10;
    let mut epoch: Option<u64> = None;
    loop {
        let t0 = Instant::now();
        if client.as_ref().is_some_and(Client::is_closed) {
            client = None;
        }
        let wait = match (epoch, client.as_mut()) {
            (Some(e), Some(c)) => match renew(c, e, cfg.ttl) {
                Ok(true) => {
                    publish(Role::Leader { epoch: e, valid_until: t0 + hold }, &mut last);
                    cfg.renew_every
                }
                lost => {
                    // Refused (a newer server holds the epoch) or the session failed: a standby may take over at
                    // once (our session is gone, or the lease is another's), so stop leading now.
                    match lost {
                        Err(err) => {
                            tracing::warn!(epoch = e, error = %err, "lease renewal failed; stepping down");
                            client = None;
                        }
                        _ => tracing::warn!(epoch = e, "another server took the lease over; stepping down"),
                    }
                    epoch = None;
                    publish(Role::Standby { leader: None }, &mut last);
                    Duration::ZERO
                }
            },
            (Some(e), None) => {
                tracing::warn!(epoch = e, "lease connection lost; stepping down");
                epoch = None;
                publish(Role::Standby { leader: None }, &mut last);
                Duration::ZERO
            }
            (None, Some(c)) => match try_acquire(c, cfg) {
                Ok(Some(e)) => {
                    tracing::info!(epoch = e, holder = %cfg.holder, "took the leader lease");
                    epoch = Some(e);
                    publish(Role::Leader { epoch: e, valid_until: t0 + hold }, &mut last);
                    cfg.renew_every
                }
                Ok(None) => {
                    let leader = current_leader(c).unwrap_or(None);
                    publish(Role::Standby { leader }, &mut last);
                    cfg.poll_every
                }
                Err(err) => {
                    tracing::warn!(error = %err, "lease attempt failed");
                    client = None;
                    publish(Role::Standby { leader: None }, &mut last);
                    cfg.poll_every
                }
            },
            (None, None) => {
                match connect(pg) {
                    Ok(c) => client = Some(c),
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot reach the database for the lease; retrying");
                        publish(Role::Standby { leader: None }, &mut last);
                    }
                }
                if client.is_some() {
                    continue;
                }
                cfg.poll_every
            }
        };
        match stop.recv_timeout(wait.saturating_sub(t0.elapsed())) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Resign(Some(e))) => {
                if epoch == Some(e) {
                    if let Some(c) = client.as_mut() {
                        match release(c, e) {
                            Ok(()) => tracing::warn!(epoch = e, "gave the leader lease up"),
                            Err(err) => tracing::warn!(epoch = e, error = %err, "give the lease up"),
                        }
                    }
                    epoch = None;
                    publish(Role::Standby { leader: None }, &mut last);
                    // Another replica's turn first (each tries every poll).
                    if matches!(
                        stop.recv_timeout(cfg.poll_every * 2),
                        Ok(Resign(None)) | Err(RecvTimeoutError::Disconnected)
                    ) {
                        return;
                    }
                }
            }
            Ok(Resign(None)) | Err(RecvTimeoutError::Disconnected) => {
                if let (Some(e), Some(c)) = (epoch, client.as_mut()) {
                    match release(c, e) {
                        Ok(()) => tracing::info!(epoch = e, "gave the leader lease up"),
                        Err(err) => tracing::warn!(epoch = e, error = %err, "give the lease up"),
                    }
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_cluster::PgCluster;
    use crate::{PgStore, Store, Write};
    use postgres::NoTls;
    use std::sync::{Arc, Mutex};

    fn cfg(name: &str, ttl: Duration) -> LeaseConfig {
        LeaseConfig {
            holder: name.into(),
            address: format!("http://{name}"),
            ttl,
            renew_every: ttl / 4,
            poll_every: Duration::from_millis(50),
        }
    }

    fn client(url: &str) -> Client {
        let mut c = url.parse::<postgres::Config>().unwrap().connect(NoTls).unwrap();
        migrate(&mut c).unwrap();
        c
    }

    /// The roles an elector reported, newest last.
    fn elect(url: &str, cfg: LeaseConfig) -> (Elector, Arc<Mutex<Vec<Role>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let e = Elector::start(url, cfg, move |r| s.lock().unwrap().push(r)).unwrap();
        (e, seen)
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) -> Duration {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
        t.elapsed()
    }

    fn latest(seen: &Arc<Mutex<Vec<Role>>>) -> Role {
        seen.lock().unwrap().last().cloned().unwrap_or(Role::Starting)
    }

    /// Of two servers one leads and the other names it; when the leader's session dies (its process was killed)
    /// the standby takes over at once — long before the lease's 60 s expiry — with a newer epoch, and the old
    /// leader's store is refused.
    #[test]
    fn a_dead_leaders_session_hands_the_lease_over_at_once() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("lease_dead").unwrap();
        let ttl = Duration::from_secs(60);
        let (a, seen_a) = elect(&url, cfg("a", ttl));
        wait_for("a to lead", || latest(&seen_a).leads_now());
        let Role::Leader { epoch: ea, .. } = latest(&seen_a) else { unreachable!() };
        let store_a = PgStore::open_at(&url, ea).unwrap();
        let job = |id| Write::Job { id, tenant: "t".into(), state: "pending".into(), doc: "{}".into() };
        store_a.commit(vec![job(1)]).unwrap();
        let (b, seen_b) = elect(&url, cfg("b", ttl));
        wait_for("b to name a", || latest(&seen_b) == Role::Standby { leader: Some("http://a".into()) });
        // a's lease session dies.
        let mut admin = client(&url);
        admin
            .execute("SELECT pg_terminate_backend(holder_pid) FROM gpunet_leader WHERE id = 1 AND holder = 'a'", &[])
            .unwrap();
        let took = wait_for("b to lead", || latest(&seen_b).leads_now());
        assert!(took < Duration::from_secs(10), "takeover took {took:?}");
        let Role::Leader { epoch: eb, .. } = latest(&seen_b) else { unreachable!() };
        assert!(eb > ea);
        wait_for("a to step down", || matches!(latest(&seen_a), Role::Standby { .. }));
        let e = store_a.commit(vec![job(2)]).unwrap_err().to_string();
        assert!(e.contains("newer server"), "{e}");
        let store_b = PgStore::open_at(&url, eb).unwrap();
        store_b.commit(vec![job(3)]).unwrap();
        let ids: Vec<u64> = store_b.load().unwrap().jobs.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![1, 3]);
        // a stays a standby naming b; a clean stop of b hands the lease back at once.
        wait_for("a to name b", || latest(&seen_a) == Role::Standby { leader: Some("http://b".into()) });
        b.stop();
        wait_for("a to lead again", || latest(&seen_a).leads_now());
        drop(a);
    }

    /// A leader whose session lives on but that stops renewing (paused) keeps the lease until it expires, then loses
    /// it: its renewal is refused afterwards, and a store opened at its epoch is refused.
    #[test]
    fn a_paused_leader_loses_the_lease_when_it_expires() {
        let Some(pg) = PgCluster::start_for_test() else { return };
        let url = pg.create_database("lease_paused").unwrap();
        let ttl = Duration::from_millis(1500);
        let (mut old, mut new) = (client(&url), client(&url));
        let e1 = try_acquire(&mut old, &cfg("old", ttl)).unwrap().expect("a free lease is taken");
        assert!(renew(&mut old, e1, ttl).unwrap());
        let t = Instant::now();
        assert_eq!(try_acquire(&mut new, &cfg("new", ttl)).unwrap(), None, "a live lease is not taken");
        assert_eq!(current_leader(&mut new).unwrap().as_deref(), Some("http://old"));
        let mut e2 = None;
        wait_for("the lease to expire", || {
            e2 = try_acquire(&mut new, &cfg("new", ttl)).unwrap();
            e2.is_some()
        });
        assert!(t.elapsed() >= ttl - Duration::from_millis(100), "taken after {:?}", t.elapsed());
        assert_eq!(e2, Some(e1 + 1));
        assert!(!renew(&mut old, e1, ttl).unwrap(), "the old leader's renewal is refused");
        let e = PgStore::open_at(&url, e1).unwrap_err().to_string();
        assert!(e.contains("newer server"), "{e}");
        release(&mut new, e1 + 1).unwrap();
        assert_eq!(current_leader(&mut old).unwrap(), None);
    }
}
