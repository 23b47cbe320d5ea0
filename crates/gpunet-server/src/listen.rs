//! The serve loop: accepts connections (TLS when configured) and serves the router over HTTP/1.1 with bounds on every
//! connection-level resource, so that slow or idle peers cannot hold the server:
//! - at most `max_connections_per_ip` connections from one address; past that, the address's connection that has
//!   waited longest for a request head (a slow or idle peer) is closed to make room, and only when every one of them is
//!   busy with a request is the new connection closed at once — so a peer holding half-sent requests cannot lock out
//!   others who share its address (every local client of `gpunet up` is 127.0.0.1);
//! - at most `max_connections` at once (below the usual 1,024-file limit); when a new connection finds them all taken,
//!   the connection of any address that has waited longest for a request head is closed to make room, and only when
//!   every one is busy with a request does the new one wait for a slot — so peers at several addresses holding
//!   half-sent requests cannot stall everyone else until their header timeouts;
//! - the TLS handshake and every request head must arrive within `header_timeout` (an idle keep-alive connection waits
//!   for its next request head, so it is closed after the same time);
//! - a request body must arrive within `body_timeout`; while it comes the connection waits on its peer, like one
//!   waiting for a head (a candidate to close at a cap), and is the server's from then until its answer is sent —
//!   a streamed answer (events, followed logs) for as long as it streams.
//!
//! Responses (long polls, server-sent events, followed logs) are not bounded here: the handlers bound them.

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

/// Connection-level bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time for the TLS handshake, and for each request head (also how long an idle connection is kept).
    pub header_timeout: Duration,
    /// Time for a request body.
    pub body_timeout: Duration,
    /// Connections at once.
    pub max_connections: usize,
    /// Connections at once from one IP address.
    pub max_connections_per_ip: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 768,
            max_connections_per_ip: 384,
        }
    }
}

/// One open connection, as its address's book sees it.
#[derive(Debug)]
struct Conn {
    id: u64,
    /// Since when (ms on a monotonic clock, +1) it waits for a request head; 0 while a request is being served.
    waiting_since: Arc<std::sync::atomic::AtomicU64>,
    /// Closes it.
    close: Arc<tokio::sync::Notify>,
}

/// The open connections of each address; an entry goes when its last connection does.
#[derive(Debug, Default)]
struct PerIp(Mutex<(u64, HashMap<IpAddr, Vec<Conn>>)>);

struct PerIpGuard(Arc<PerIp>, IpAddr, u64);

/// What a connection gets when it is admitted.
struct Admitted {
    guard: PerIpGuard,
    waiting_since: Arc<std::sync::atomic::AtomicU64>,
    close: Arc<tokio::sync::Notify>,
}

fn clock_ms(origin: std::time::Instant) -> u64 {
    origin.elapsed().as_millis() as u64 + 1
}

impl PerIp {
    /// Admits a connection from `ip`; at the address's cap, closes the one that has waited longest for a request
    /// head to make room, and refuses the new one only when all of them are serving requests.
    fn enter(this: &Arc<PerIp>, ip: IpAddr, max: usize, now_ms: u64) -> Option<Admitted> {
        let mut g = this.0.lock().expect("per-ip lock");
        let (next, m) = &mut *g;
        let conns = m.entry(ip).or_default();
        if conns.len() >= max {
            use std::sync::atomic::Ordering;
            let oldest = conns
                .iter()
                .enumerate()
                .filter_map(|(i, c)| match c.waiting_since.load(Ordering::Relaxed) {
                    0 => None,
                    t => Some((t, i)),
                })
                .min()?;
            let evicted = conns.swap_remove(oldest.1);
            evicted.close.notify_one();
            tracing::debug!(%ip, "connection cap of the address: the longest-waiting connection closed for a new one");
        }
        *next += 1;
        let c = Conn {
            id: *next,
            waiting_since: Arc::new(std::sync::atomic::AtomicU64::new(now_ms)),
            close: Arc::new(tokio::sync::Notify::new()),
        };
        let admitted = Admitted {
            guard: PerIpGuard(this.clone(), ip, c.id),
            waiting_since: c.waiting_since.clone(),
            close: c.close.clone(),
        };
        conns.push(c);
        Some(admitted)
    }
}

impl PerIp {
    /// Closes the connection, of any address, that has waited longest for a request head; whether there was one.
    fn evict_oldest(&self) -> bool {
        use std::sync::atomic::Ordering;
        let mut g = self.0.lock().expect("per-ip lock");
        let oldest =
            g.1.iter()
                .flat_map(|(ip, conns)| conns.iter().enumerate().map(move |(i, c)| (c, *ip, i)))
                .filter_map(|(c, ip, i)| match c.waiting_since.load(Ordering::Relaxed) {
                    0 => None,
                    t => Some((t, ip, i)),
                })
                .min();
        let Some((_, ip, i)) = oldest else { return false };
        let conns = g.1.get_mut(&ip).expect("found above");
        let evicted = conns.swap_remove(i);
        if conns.is_empty() {
            g.1.remove(&ip);
        }
        evicted.close.notify_one();
        tracing::debug!(%ip, "connection cap of the server: the longest-waiting connection closed for a new one");
        true
    }
}

impl Drop for PerIpGuard {
    fn drop(&mut self) {
        let mut g = self.0 .0.lock().expect("per-ip lock");
        if let Some(conns) = g.1.get_mut(&self.1) {
            conns.retain(|c| c.id != self.2);
            if conns.is_empty() {
                g.1.remove(&self.1);
            }
        }
    }
}

/// A request body that fails once its deadline passes. While it is still coming the connection waits on its peer
/// (a candidate to close at a cap, like one waiting for a head); once it is whole, or failed, the server's turn.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    waiting_since: Arc<std::sync::atomic::AtomicU64>,
}

impl http_body::Body for TimedBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::sync::atomic::Ordering;
        let this = self.get_mut();
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_frame(cx) {
            if !matches!(r, Some(Ok(_))) || this.inner.is_end_stream() {
                this.waiting_since.store(0, Ordering::Relaxed);
            }
            return Poll::Ready(r.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.waiting_since.store(0, Ordering::Relaxed);
            return Poll::Ready(Some(Err("the request body did not arrive in time".into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body: the connection is the server's (not a candidate to close) until the body is sent or dropped,
/// then it waits for its peer's next request head. A streamed answer (events, followed logs) is the server's for as
/// long as it streams: a flood of idle connections cannot close it.
struct AnswerBody {
    inner: Body,
    waiting_since: Arc<std::sync::atomic::AtomicU64>,
    origin: std::time::Instant,
}

impl AnswerBody {
    fn done(&self) {
        use std::sync::atomic::Ordering;
        let _ = self.waiting_since.compare_exchange(0, clock_ms(self.origin), Ordering::Relaxed, Ordering::Relaxed);
    }
}

impl http_body::Body for AnswerBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.done();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AnswerBody {
    fn drop(&mut self) {
        self.done();
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish for up to five seconds.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_ip = Arc::new(PerIp::default());
    let origin = std::time::Instant::now();
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of files or a connection reset before it was accepted: wait a little, do not spin.
                    tracing::warn!(error = %e, "accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Every slot taken: the longest-waiting idle or half-sent connection makes room; when all are busy with
        // requests, this one waits for a slot (and no other is accepted meanwhile).
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                per_ip.evict_oldest();
                tokio::select! {
                    p = slots.clone().acquire_owned() => p.expect("never closed"),
                    _ = &mut shutdown => break,
                }
            }
        };
        let Some(admitted) = PerIp::enter(&per_ip, peer.ip(), limits.max_connections_per_ip, clock_ms(origin)) else {
            tracing::debug!(%peer, "too many busy connections from one address; closed");
            continue;
        };
        let Admitted { guard, waiting_since, close } = admitted;
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _held = (permit, guard);
            let serve = async move {
                match tls {
                    Some(acceptor) => match tokio::time::timeout(limits.header_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => connection(stream, router, limits, watcher, waiting_since, origin).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    },
                    None => connection(tcp, router, limits, watcher, waiting_since, origin).await,
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = close.notified() => tracing::debug!(%peer, "closed to make room for another connection"),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await.is_err() {
        tracing::warn!("open requests did not finish within 5 s of the shutdown; dropped");
    }
}

async fn connection<I>(
    io: I,
    router: Router,
    limits: Limits,
    watcher: hyper_util::server::graceful::Watcher,
    waiting_since: Arc<std::sync::atomic::AtomicU64>,
    origin: std::time::Instant,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use std::sync::atomic::Ordering;
    let body_timeout = limits.body_timeout;
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let router = router.clone();
        let waiting_since = waiting_since.clone();
        // A request head arrived. With a body to come, the connection still waits on its peer (since now: a slow
        // body is a candidate to close at a cap, as a slow head is); without one, or once the body is whole, it is
        // the server's until its answer is sent (`AnswerBody`).
        let body_due = !http_body::Body::is_end_stream(req.body());
        waiting_since.store(if body_due { clock_ms(origin) } else { 0 }, Ordering::Relaxed);
        let timed = waiting_since.clone();
        let req = req.map(|inner| {
            Body::new(TimedBody { inner, deadline: Box::pin(tokio::time::sleep(body_timeout)), waiting_since: timed })
        });
        async move {
            let r = tower::ServiceExt::oneshot(router, req).await;
            // The handler answered (perhaps without reading the body: 401 before it): the server's turn.
            waiting_since.store(0, Ordering::Relaxed);
            r.map(|resp| resp.map(|inner| Body::new(AnswerBody { inner, waiting_since, origin })))
        }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(64 * 1024);
    let conn = b.serve_connection(TokioIo::new(io), svc);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended");
    }
}
