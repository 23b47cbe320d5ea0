//! The read lane: where a read turns what it gathered into its answer (parses the jobs' packed submissions,
//! serialises the JSON), on threads of lower CPU priority than the rest of the server.
//!
//! Reads never run a pass on the owner, and never walk its state: the queue view comes from the snapshot the owner
//! publishes, and a page of jobs is gathered by the owner in a walk of at most one page of its lists, each job's
//! submission left packed. But on a small machine the rest of a read's CPU — parsing those submissions and writing
//! the JSON, most of its cost — is still taken from the owner, the store's commits and the submissions' handlers. So
//! it runs here, on [`THREADS`] threads whose nice value is [`NICE`] more than the server's: when the CPU is busy
//! with writes a read waits for it, and when it is idle reads take all they need. A read first takes one of
//! [`ADMITTED`] places, at most [`PER_PRINCIPAL`] of them per tenant (or the admin), held until the lane has
//! answered, even if its client has gone ([`Lane::admit`]): the owner gathers no faster than the lane answers, the
//! lane's backlog is bounded, and one tenant polling large pages cannot take every place. A reader polling without
//! pause slows itself, not the writers (`gpunet bench depth`'s readers without pause). Where the priority cannot be
//! lowered, the lane still runs, at the server's priority, and says so once in the log.

use crate::Principal;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Threads of the lane (reads at once).
pub(crate) const THREADS: usize = 2;
/// How much nicer than the server they are (each step is about 1.25× less CPU share under contention; 19 at most).
pub(crate) const NICE: i32 = 10;

type Work = Box<dyn FnOnce() + Send>;

/// Reads admitted at once ([`Lane::admit`]): those being gathered by the owner or answered on the lane.
pub(crate) const ADMITTED: usize = 2 * THREADS;
/// Of which one tenant's (or the admin's) at most.
pub(crate) const PER_PRINCIPAL: usize = 2;
/// Principals remembered before those with no read in flight are forgotten.
const PRINCIPALS_PRUNE_AT: usize = 1024;

/// A handle on the lane's threads.
#[derive(Debug, Clone)]
pub(crate) struct Lane {
    tx: mpsc::Sender<Work>,
    admitted: Arc<Semaphore>,
    per_principal: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

/// A read's place on the lane ([`Lane::admit`]), given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    _principal: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

impl Lane {
    /// Starts the lane's threads (they end when the last handle is dropped).
    pub(crate) fn start() -> Lane {
        let (tx, rx) = mpsc::channel::<Work>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..THREADS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new().name(format!("gpunet-read-{i}")).spawn(move || {
                if let Err(e) = lower_priority() {
                    if i == 0 {
                        tracing::warn!(error = %e, "reads run at the server's priority: the read lane's cannot be lowered");
                    }
                }
                loop {
                    let work = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    match work {
                        // A read that panics fails alone (its caller gets an error); the thread goes on.
                        Ok(work) => drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))),
                        Err(_) => return,
                    }
                }
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "a read-lane thread could not start");
            }
        }
        Lane { tx, admitted: Arc::new(Semaphore::new(ADMITTED)), per_principal: Default::default() }
    }

    /// Waits for a place on the lane: one of [`PER_PRINCIPAL`] of `who`'s, then one of [`ADMITTED`] in all. A read
    /// takes it before it asks the owner to gather anything and holds it until the lane has answered, so readers
    /// asking faster than the lane answers wait here, where waiting costs nothing, and one tenant's readers wait in
    /// their own line.
    pub(crate) async fn admit(&self, who: &Principal) -> Admitted {
        let key = match who {
            Principal::Tenant(t) => t.as_str(),
            _ => "",
        };
        let mine = {
            let mut m = self.per_principal.lock().expect("read lane lock");
            if m.len() >= PRINCIPALS_PRUNE_AT {
                // Only the map holds those with no read in flight.
                m.retain(|_, s| Arc::strong_count(s) > 1);
            }
            m.entry(key.to_string()).or_insert_with(|| Arc::new(Semaphore::new(PER_PRINCIPAL))).clone()
        };
        let principal = mine.acquire_owned().await.expect("a read lane semaphore is never closed");
        let all = self.admitted.clone().acquire_owned().await.expect("a read lane semaphore is never closed");
        Admitted { _principal: principal, _all: all }
    }

    /// `f`'s result, computed on the lane (inline when the lane has no thread left); an error when `f` panicked.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, gpunet_api::ApiError> {
        let (done, result) = tokio::sync::oneshot::channel();
        let work: Work = Box::new(move || {
            let _ = done.send(f());
        });
        if let Err(mpsc::SendError(work)) = self.tx.send(work) {
            drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
        }
        result.await.map_err(|_| gpunet_api::ApiError::new("internal", "the read failed"))
    }

    /// A JSON response of `status` with what `f` makes, made and serialised on the lane; the read's place there
    /// (`admitted`) is given back when it is done, whether its client still waits or not.
    pub(crate) async fn json<T: Serialize>(
        &self,
        status: axum::http::StatusCode,
        admitted: Admitted,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Response, gpunet_api::ApiError> {
        let body = self
            .run(move || {
                let body = serde_json::to_vec(&f());
                drop(admitted);
                body
            })
            .await?
            .map_err(|e| gpunet_api::ApiError::new("internal", format!("the answer could not be written: {e}")))?;
        Ok((status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
    }
}

/// Lowers the calling thread's priority by [`NICE`] (to 19 at most). Linux: a thread's nice value, set with its id
/// as the process id, is that thread's alone.
#[cfg(target_os = "linux")]
fn lower_priority() -> std::io::Result<()> {
    let me = Some(rustix::thread::gettid());
    let now = rustix::process::getpriority_process(me)?;
    Ok(rustix::process::setpriority_process(me, (now + NICE).min(19))?)
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() -> std::io::Result<()> {
    Err(std::io::Error::other("per-thread priorities are set on Linux only"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_lane_threads_at_lower_priority() {
        let base = rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("getpriority");
        let lane = Lane::start();
        let (name, nice) = lane
            .run(|| {
                let name = std::thread::current().name().map(str::to_string);
                (name, rustix::process::getpriority_process(Some(rustix::thread::gettid())))
            })
            .await
            .expect("ran");
        assert!(name.is_some_and(|n| n.starts_with("gpunet-read-")));
        // Lowering one's priority needs no permission.
        assert_eq!(nice.expect("getpriority"), (base + NICE).min(19));
        // Many at once all come back, each with its own answer.
        let answers = futures_util::future::join_all((0..64u64).map(|i| lane.run(move || i * 2))).await;
        assert_eq!(
            answers.into_iter().map(|a| a.expect("ran")).collect::<Vec<_>>(),
            (0..64u64).map(|i| i * 2).collect::<Vec<_>>()
        );
        // A read that panics fails alone; the lane goes on answering.
        assert!(lane.run(|| panic!("a broken read")).await.is_err());
        for _ in 0..THREADS * 2 {
            assert_eq!(lane.run(|| 7).await.expect("the lane still answers"), 7);
        }
    }

    #[tokio::test]
    async fn a_json_answer_is_made_on_the_lane() {
        let lane = Lane::start();
        let admitted = lane.admit(&Principal::Admin).await;
        let r = lane
            .json(axum::http::StatusCode::OK, admitted, || serde_json::json!({"a": [1, 2]}))
            .await
            .expect("answered");
        assert_eq!(r.status(), axum::http::StatusCode::OK);
        assert_eq!(r.headers()[axum::http::header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(r.into_body(), 1024).await.expect("body");
        assert_eq!(&body[..], br#"{"a":[1,2]}"#);
        // Its place was given back.
        assert_eq!(lane.admitted.available_permits(), ADMITTED);
    }

    /// A tenant's reads take at most its own places; another tenant's read is admitted while the first waits, and a
    /// place comes back when its read is answered.
    #[tokio::test]
    async fn one_tenant_cannot_take_every_place() {
        let lane = Lane::start();
        let a = Principal::Tenant("a".into());
        let held: Vec<Admitted> = futures_util::future::join_all((0..PER_PRINCIPAL).map(|_| lane.admit(&a))).await;
        let third = tokio::time::timeout(std::time::Duration::from_millis(200), lane.admit(&a)).await;
        assert!(third.is_err(), "a tenant got more than {PER_PRINCIPAL} places");
        let b = tokio::time::timeout(std::time::Duration::from_secs(10), lane.admit(&Principal::Tenant("b".into())))
            .await
            .expect("another tenant is admitted");
        drop(b);
        let waiting = tokio::spawn({
            let (lane, a) = (lane.clone(), a.clone());
            async move { lane.admit(&a).await }
        });
        drop(held);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("admitted once a place came back")
            .expect("joined");
    }
}
