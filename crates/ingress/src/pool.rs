//! Keep-alive HTTP/1.1 connections to endpoints, one pool per worker thread and kind of
//! connection ([`Upstream`]): hyper client connections for the general path, bare sockets
//! ([`Wire`]) for the HTTP/1 fast path (`crate::fast`).
//!
//! The general path uses hyper's connection-level client rather than hyper-util's pooled
//! `Client`, which costs a shared pool behind a lock, a hashed pool key and an absolute URI per
//! request; here a request takes an idle connection from its worker's own list (an uncontended
//! lock), is sent in origin form, and the connection comes back when its response body has been
//! read to the end. Each endpoint has at most `max_connections` open connections of a kind, busy
//! or idle; a request that finds them all busy waits, up to the connect timeout, for one to come
//! back or close.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::future::Future;
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

/// Why a request could not be sent or answered; a request that was not sent comes back, so that
/// it can be sent elsewhere without having been copied.
pub(crate) enum SendError<B> {
    /// No connection to the endpoint within the connect timeout, or it was refused.
    Connect(Request<B>),
    /// All `max_connections` connections to the endpoint stayed busy for the connect timeout.
    Busy(Request<B>),
    /// The connection failed after the request was (at least partly) sent, or its handshake did.
    Upstream(hyper::Error),
}

/// Why no connection could be had for a request.
pub(crate) enum NoConnection {
    Connect,
    Busy,
    Handshake(hyper::Error),
}

/// A kind of pooled connection to an endpoint.
pub(crate) trait Upstream: Send + Sized + 'static {
    /// Makes a connection of this kind on `tcp`, a new connection to `endpoint`, which keeps
    /// `slot` until it closes.
    fn open(
        tcp: TcpStream,
        endpoint: SocketAddr,
        slot: OwnedSemaphorePermit,
    ) -> impl Future<Output = Result<Self, hyper::Error>> + Send;
    /// Whether the connection can no longer take a request: known to be closed, or (a bare
    /// connection) holding bytes or an end that no request asked for.
    fn is_closed(&self) -> bool;
    /// Whether the connection can take a request at once.
    fn is_ready(&self) -> bool;
    /// Waits until the connection can take a request; false if it closed instead.
    fn ready(&mut self) -> impl Future<Output = bool> + Send;
}

impl<B> Upstream for SendRequest<B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Makes the HTTP/1 handshake and runs the connection on its own task, which holds `slot`
    /// until the connection closes (or is upgraded).
    async fn open(tcp: TcpStream, endpoint: SocketAddr, slot: OwnedSemaphorePermit) -> Result<Self, hyper::Error> {
        let (sender, connection) = http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.with_upgrades().await {
                debug!(%endpoint, "backend connection: {err}");
            }
            drop(slot);
        });
        Ok(sender)
    }

    fn is_closed(&self) -> bool {
        SendRequest::is_closed(self)
    }

    fn is_ready(&self) -> bool {
        SendRequest::is_ready(self)
    }

    async fn ready(&mut self) -> bool {
        SendRequest::ready(self).await.is_ok()
    }
}

/// A bare keep-alive connection to an endpoint, which the HTTP/1 fast path writes requests to
/// and reads responses from itself; it holds its endpoint slot until dropped. A connection goes
/// back to the pool only after a whole response, with nothing read past it, and is handed out
/// again only while nothing is readable on it: bytes an endpoint sends after a response (an
/// unasked second response, a body to HEAD or 204) would otherwise be read by the next request,
/// another client's, as its answer.
pub(crate) struct Wire {
    pub(crate) tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Upstream for Wire {
    async fn open(tcp: TcpStream, _: SocketAddr, slot: OwnedSemaphorePermit) -> Result<Self, hyper::Error> {
        Ok(Self { tcp, _slot: slot })
    }

    /// Asks the socket itself (`recv` with `MSG_PEEK`), not tokio's readiness, which may not
    /// yet know of bytes that have arrived: anything readable, bytes or the endpoint's end, or
    /// an error, makes the connection unusable.
    fn is_closed(&self) -> bool {
        let mut byte = [std::mem::MaybeUninit::uninit(); 1];
        !matches!(
            socket2::SockRef::from(&self.tcp).peek(&mut byte),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock
        )
    }

    fn is_ready(&self) -> bool {
        true
    }

    async fn ready(&mut self) -> bool {
        true
    }
}

/// Connections by endpoint. Idle connections older than the idle timeout are closed by a reaper
/// task, which also forgets endpoints without connections; connections the endpoint closed are
/// dropped when next looked at.
pub(crate) struct Pool<C> {
    endpoints: Mutex<HashMap<SocketAddr, Endpoint<C>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
}

/// The connections to one endpoint.
struct Endpoint<C> {
    idle: Vec<Idle<C>>,
    /// One permit per open connection, held by its connection task.
    slots: Arc<Semaphore>,
    /// Woken when a connection becomes idle.
    returned: Arc<Notify>,
}

/// A connection waiting for its next request.
struct Idle<C> {
    connection: C,
    since: Instant,
}

impl<B> Pool<SendRequest<B>>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Sends `request` (origin-form URI, `Host` set) to `endpoint` on an idle connection, else
    /// on a new one, else on the first that comes back. A request that an idle connection
    /// refused before writing it (the endpoint closed it meanwhile) is sent again on another.
    pub(crate) async fn send(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        mut request: Request<B>,
    ) -> Result<Response<PooledBody<B>>, SendError<B>> {
        loop {
            let (mut sender, reused) = match self.checkout(endpoint).await {
                Ok(connection) => connection,
                Err(NoConnection::Connect) => return Err(SendError::Connect(request)),
                Err(NoConnection::Busy) => return Err(SendError::Busy(request)),
                Err(NoConnection::Handshake(err)) => return Err(SendError::Upstream(err)),
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    // A 101 hands the connection over to the upgrade: it is not reused.
                    let keep = (response.status() != StatusCode::SWITCHING_PROTOCOLS).then(|| Keep {
                        sender,
                        endpoint,
                        pool: self.clone(),
                    });
                    return Ok(response.map(|body| PooledBody { body, done: false, keep }));
                }
                Err(mut err) => match err.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(SendError::Upstream(err.into_error())),
                },
            }
        }
    }
}

impl<C: Upstream> Pool<C> {
    /// A pool on the current tokio runtime, with a reaper task that ends with the pool.
    pub(crate) fn new(connect_timeout: Duration, idle_timeout: Duration, max_connections: usize) -> Arc<Self> {
        let max_connections = max_connections.clamp(1, Semaphore::MAX_PERMITS);
        let pool = Arc::new(Self { endpoints: Mutex::default(), connect_timeout, idle_timeout, max_connections });
        tokio::spawn(reap(Arc::downgrade(&pool)));
        pool
    }

    /// An idle connection to `endpoint` (reused: true), else a new one if the endpoint has fewer
    /// than `max_connections`, else the first that becomes idle or room for a new one, waiting
    /// up to the connect timeout for either.
    pub(crate) async fn checkout(&self, endpoint: SocketAddr) -> Result<(C, bool), NoConnection> {
        // The common case first: an idle connection, with no timer or wake-up to set up.
        if let Some(sender) = self.take(endpoint).await {
            return Ok((sender, true));
        }
        let (slots, returned) = {
            let mut endpoints = self.endpoints.lock().expect("pool lock");
            let state = endpoints.entry(endpoint).or_insert_with(|| Endpoint {
                idle: Vec::new(),
                slots: Arc::new(Semaphore::new(self.max_connections)),
                returned: Arc::default(),
            });
            (state.slots.clone(), state.returned.clone())
        };
        let deadline = tokio::time::sleep(self.connect_timeout);
        tokio::pin!(deadline);
        loop {
            // Registered before looking, so that a connection put back meanwhile wakes it.
            let notified = returned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(sender) = self.take(endpoint).await {
                return Ok((sender, true));
            }
            tokio::select! {
                biased;
                permit = slots.clone().acquire_owned() => {
                    let permit = permit.expect("the semaphore is never closed");
                    return Ok((self.connect(endpoint, permit).await?, false));
                }
                () = &mut notified => {}
                () = &mut deadline => return Err(NoConnection::Busy),
            }
        }
    }

    /// The most recently used idle connection to `endpoint` that is ready for a request, else
    /// the most recent one that is still open, once it is ready.
    async fn take(&self, endpoint: SocketAddr) -> Option<C> {
        loop {
            let mut connection = {
                let mut endpoints = self.endpoints.lock().expect("pool lock");
                let list = &mut endpoints.get_mut(&endpoint)?.idle;
                // One whose connection task has already taken in the end of its last exchange
                // saves waiting for that task to run; looking at the few most recent is enough.
                let last = list.len().checked_sub(1)?;
                let index =
                    (last.saturating_sub(7)..=last).rev().find(|&i| list[i].connection.is_ready()).unwrap_or(last);
                list.remove(index).connection
            };
            // Returned when its last response body ended; it is ready, or about to be once its
            // connection task has run.
            if !connection.is_closed() && connection.ready().await {
                return Some(connection);
            }
        }
    }

    /// Opens a connection to `endpoint`, which holds `slot` until it closes.
    async fn connect(&self, endpoint: SocketAddr, slot: OwnedSemaphorePermit) -> Result<C, NoConnection> {
        let tcp = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(endpoint)).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(err)) => {
                debug!(%endpoint, "connect: {err}");
                return Err(NoConnection::Connect);
            }
            Err(_elapsed) => {
                debug!(%endpoint, "connect: timed out");
                return Err(NoConnection::Connect);
            }
        };
        if let Err(err) = tcp.set_nodelay(true) {
            debug!(%endpoint, "TCP_NODELAY: {err}");
        }
        C::open(tcp, endpoint, slot).await.map_err(NoConnection::Handshake)
    }
}

/// Reaps `pool` every half idle timeout until it is dropped.
async fn reap<C: Upstream>(pool: Weak<Pool<C>>) {
    let period = match pool.upgrade() {
        Some(pool) => (pool.idle_timeout / 2).max(Duration::from_millis(10)),
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        match pool.upgrade() {
            Some(pool) => pool.reap_idle(),
            None => return,
        }
    }
}

/// What goes back to the pool when a response body has been read to its end.
struct Keep<B> {
    sender: SendRequest<B>,
    endpoint: SocketAddr,
    pool: Arc<Pool<SendRequest<B>>>,
}

/// An endpoint's response body. When it is dropped after its end, its connection goes back to
/// the pool; dropped earlier (the client went away), the connection is closed with it.
pub(crate) struct PooledBody<B> {
    body: Incoming,
    done: bool,
    keep: Option<Keep<B>>,
}

impl<B> Body for PooledBody<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let poll = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = poll {
            self.done = true;
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for PooledBody<B> {
    fn drop(&mut self) {
        if let Some(keep) = self.keep.take()
            && (self.done || self.body.is_end_stream())
            && !keep.sender.is_closed()
        {
            keep.pool.put(keep.endpoint, keep.sender);
        }
    }
}

impl<C> Pool<C> {
    /// Makes `connection`, which has not closed, the most recently used idle connection to
    /// `endpoint`, and wakes a request waiting for one.
    pub(crate) fn put(&self, endpoint: SocketAddr, connection: C) {
        let mut endpoints = self.endpoints.lock().expect("pool lock");
        if let Some(state) = endpoints.get_mut(&endpoint) {
            state.idle.push(Idle { connection, since: Instant::now() });
            state.returned.notify_one();
        }
    }
}

impl Pool<Wire> {
    /// Puts `wire` back after a response that ended exactly where its framing said, unless
    /// something is readable on it already (then it is closed).
    pub(crate) fn put_back(&self, endpoint: SocketAddr, wire: Wire) {
        if !wire.is_closed() {
            self.put(endpoint, wire);
        }
    }
}

impl<C: Upstream> Pool<C> {
    /// Closes connections idle for longer than the idle timeout, forgets closed ones, and
    /// forgets endpoints that have no connection and no request waiting.
    fn reap_idle(&self) {
        let now = Instant::now();
        self.endpoints.lock().expect("pool lock").retain(|_, state| {
            state
                .idle
                .retain(|idle| !idle.connection.is_closed() && now.duration_since(idle.since) < self.idle_timeout);
            // Permits, waiting requests and their wake-ups each hold a reference.
            !state.idle.is_empty() || Arc::strong_count(&state.slots) > 1 || Arc::strong_count(&state.returned) > 1
        });
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
