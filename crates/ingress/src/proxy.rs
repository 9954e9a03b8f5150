//! The reverse proxy: HTTP/1.1 and HTTP/2 from clients (HTTP/2 over TLS by ALPN), HTTP/1.1 over
//! pooled keep-alive connections to the endpoints of the Service that the [`Router`] picks.
//!
//! One [`Proxy`] holds what every worker shares; each `serve_*` call is one worker's server, with
//! its own backend connection [`Pool`], meant to run on its own single-threaded runtime (one per
//! CPU, each with its own `SO_REUSEPORT` listener), so that a request and its backend connection
//! never leave one thread. [`serve_http`] and [`serve_https`] serve one kind of listener (the
//! Ingress ports); [`serve_listeners`] serves a port that many Gateways share, asking a
//! [`Listeners`] per connection what its local address serves (plain HTTP, TLS with a given
//! configuration, or nothing).
//!
//! Per request the router sees a [`decision::Request`] (local address, TLS or not, checked host,
//! normalised path, query, method, header fields) and answers a [`Decision`]:
//!
//! - [`Decision::Respond`]: the proxy answers itself (a redirect with its `Location`, a CORS
//!   preflight's `204` with its `Access-Control-*` fields, or an error status) with a short
//!   plain-text body (none for 204), counted and logged under the route's name.
//! - [`Decision::Forward`]: the request goes to an endpoint of its target, with the forwarded path
//!   replaced by [`Forward::path`] (a decoded path, as routers see paths: percent-encoded where a
//!   path needs it; the query kept) and the forwarded `Host` by [`Forward::host`]
//!   (`X-Forwarded-Host` keeps the client's). Then its [`Actions`](decision::Actions), if any:
//!   - request header edits, applied to the client's fields before hop-by-hop fields are dropped
//!     and ours (`Host`, `X-Forwarded-*`, `X-Real-IP`) are set, so edits of those, and of
//!     `Content-Length` (the framing is the body's), have no effect;
//!   - response header edits, applied likewise to an endpoint's response (not to the proxy's own
//!     errors);
//!   - mirrors: a copy of the head as forwarded, with an empty body, sent to one endpoint of each
//!     mirror target from a task of its own on the worker's runtime, whose answer is read and
//!     dropped; a mirror never delays nor fails its request, and a worker has at most
//!     [`ProxyConfig::max_mirrors_in_flight`] (more are dropped and counted in
//!     [`MIRRORS_DROPPED_TOTAL`]);
//!   - a request timeout bounding the whole forward, retries included, and a backend timeout
//!     replacing [`ProxyConfig::response_timeout`] for each attempt, both answering 504.
//!
//! The hot path takes no shared lock: the route, per-target state and endpoint health are read
//! from immutable snapshots (`ArcSwap`), round robin is one atomic increment, and metric handles
//! are registered once per target and status. A decision without actions costs nothing more than
//! the choice of its target: nothing is copied or allocated for rewrites, edits or mirrors that
//! are not there.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::error::Error;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http_body_util::{BodyExt, Either, Empty, Full, LengthLimitError, Limited};
use hyper::body::{Body, Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::PathAndQuery;
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use ipnet::IpNet;
use metrics::{Counter, Histogram, counter, histogram};
use roadkeeper_cluster::NamespacedName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::decision::{self, Actions, Decision, Forward, HeaderEdits, Listener, Listeners};
use crate::drain::{Drain, DrainWatch};
use crate::flood::FrameBudget;
use crate::h1::parse::FinalResponse;
use crate::host::request_host;
use crate::path::normalize;
use crate::pool::{Pool, PooledBody, SendError, Wire};
use crate::tls::Certificates;
use crate::{Router, Target, forwarded};
use wire_body::WireBody;

/// `roadkeeper_ingress_requests_total{ingress, service, status}`: requests answered, by status
/// code; `ingress` is the Ingress or route that decided (its target's, or a
/// [`Decision::Respond`]'s route) and `service` the backend (empty for a `Respond`); both are
/// empty when no rule matched (404).
pub const REQUESTS_TOTAL: &str = "roadkeeper_ingress_requests_total";
/// `roadkeeper_ingress_request_duration_seconds{ingress}`: from the request head to the response
/// head (the body streams afterwards).
pub const REQUEST_DURATION_SECONDS: &str = "roadkeeper_ingress_request_duration_seconds";
/// `roadkeeper_ingress_upstream_errors_total{service, kind}`: failed attempts to forward (mirrors
/// included), by kind: `connect` (no connection within the connect timeout), `busy` (the endpoint
/// had `max_upstream_connections` busy connections for as long), `timeout` (no response head
/// within the response or backend timeout, or the request timeout ran out), `reset` (the
/// connection failed after it was made).
pub const UPSTREAM_ERRORS_TOTAL: &str = "roadkeeper_ingress_upstream_errors_total";
/// `roadkeeper_ingress_mirrors_dropped_total{ingress, service}`: request mirrors not sent because
/// their worker had [`ProxyConfig::max_mirrors_in_flight`] in flight; `service` is the mirror's.
pub const MIRRORS_DROPPED_TOTAL: &str = "roadkeeper_ingress_mirrors_dropped_total";

/// hyper's own limit of HTTP/1 request header fields.
const HYPER_MAX_HEADERS: usize = 100;
/// hyper's smallest HTTP/1 buffer, and so the smallest `max_request_head`.
pub const MIN_REQUEST_HEAD: usize = 8192;
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
/// `X-Forwarded-Proto` of plain and TLS connections.
const PROTO: [HeaderValue; 2] = [HeaderValue::from_static("http"), HeaderValue::from_static("https")];

/// Limits and timeouts of the proxy; [`Default`] gives the values in parentheses.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Time to open a TCP connection to an endpoint (2 s); a failure is retried on another one.
    pub connect_timeout: Duration,
    /// Time from sending a request (its body included) to an endpoint until its response head
    /// (60 s); then 504.
    pub response_timeout: Duration,
    /// Time a client has for the TLS handshake, for its first request (a connection that sends
    /// none is closed, whatever its protocol), and on HTTP/1 for each request head, counted from
    /// the connection's start or its previous response (10 s). hyper counts the wait for the next
    /// request too, so this also closes idle HTTP/1 keep-alive connections.
    pub client_header_timeout: Duration,
    /// A client connection or upgraded tunnel on which no byte moved for this long (up to a
    /// quarter more), with no request waiting for its endpoint, is closed (60 s); idle pooled
    /// backend connections are closed after the same time.
    pub idle_timeout: Duration,
    /// Largest request body in bytes (10 MiB): 413 when Content-Length says more, or as soon as
    /// more has been streamed; `None`: unlimited.
    pub max_request_body: Option<usize>,
    /// Most request header fields (100); more is 431 (on HTTP/1 answered by hyper's parser).
    pub max_headers: usize,
    /// Largest request head in bytes (32 KiB; at least [`MIN_REQUEST_HEAD`]): on HTTP/1 the
    /// request line and header fields, buffered until complete (431 beyond), on HTTP/2 the header
    /// list as `SETTINGS_MAX_HEADER_LIST_SIZE` counts it (32 bytes more per field).
    pub max_request_head: usize,
    /// Concurrent HTTP/2 streams per client connection (100); more are refused (REFUSED_STREAM).
    pub max_concurrent_streams: u32,
    /// Open connections to one endpoint per worker, busy or idle (512); a request that finds them
    /// all busy waits for one up to `connect_timeout`, then goes to another endpoint, else 503.
    pub max_upstream_connections: usize,
    /// Clients (proxies in front) whose `X-Forwarded-For`, `-Proto` and `-Host` are believed (none).
    pub trusted_proxies: Vec<IpNet>,
    /// Connect failures in a row that eject an endpoint (3).
    pub eject_after: u32,
    /// How long an ejected endpoint is skipped (10 s); one more failure after that ejects it again.
    pub eject_for: Duration,
    /// Request mirrors in flight per worker server (each `serve_*` call) (128): a mirror beyond is
    /// dropped (and counted in [`MIRRORS_DROPPED_TOTAL`]).
    pub max_mirrors_in_flight: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(60),
            client_header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_request_body: Some(10 << 20),
            max_headers: HYPER_MAX_HEADERS,
            max_request_head: 32 << 10,
            max_concurrent_streams: 100,
            max_upstream_connections: 512,
            trusted_proxies: Vec::new(),
            eject_after: 3,
            eject_for: Duration::from_secs(10),
            max_mirrors_in_flight: 128,
        }
    }
}

/// Serves plain HTTP (HTTP/1.1, and HTTP/2 with prior knowledge) on `listener` as one worker of
/// `proxy`, until `stop` completes: then it stops accepting, asks every connection to close after
/// its requests in progress (HTTP/2 with GOAWAY), and returns once all have closed; the caller
/// bounds that wait.
pub async fn serve_http(proxy: Arc<Proxy>, listener: TcpListener, stop: impl Future<Output = ()>) {
    let worker = Arc::new(Worker::new(proxy, None));
    accept(listener, stop, move |tcp, peer, local, watcher| {
        worker.clone().serve_connection(tcp, peer, local, None, watcher)
    })
    .await
}

/// Serves HTTPS on `listener` as [`serve_http`] serves HTTP: the certificate is chosen by SNI
/// from `tls`, and ALPN picks HTTP/2 or HTTP/1.1. A request whose host has a certificate of its
/// own, other than the one its connection's SNI got, is 421 (RFC 9110 §15.5.20).
pub async fn serve_https(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    tls: Arc<Certificates>,
    stop: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls.server_config());
    let worker = Arc::new(Worker::new(proxy, Some(tls)));
    accept(listener, stop, move |tcp, peer, local, watcher| {
        worker.clone().serve_tls(acceptor.clone(), tcp, peer, local, watcher)
    })
    .await
}

/// Serves a port shared by many Gateways on `listener` (typically bound to the wildcard address)
/// as one worker of `proxy`, until `stop` completes, then drains as [`serve_http`] does. Each
/// connection gets what `listeners` says its local address serves (an IPv4-mapped address asked
/// as IPv4): `None` closes it at once; [`Listener::Http`] serves it as [`serve_http`] does;
/// [`Listener::Https`] makes the TLS handshake with that configuration within
/// `client_header_timeout`, then serves HTTP/2 or HTTP/1.1 (whichever the client speaks; the
/// configuration's ALPN protocols are what clients are offered, so build it with
/// [`crate::tls::server_config`] to offer `h2` and `http/1.1`). Its requests are `tls` for the
/// router and `X-Forwarded-Proto: https` for the endpoints. There is no 421 check here: the
/// certificates are the configuration's, unknown to the proxy.
pub async fn serve_listeners(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    listeners: Arc<dyn Listeners>,
    stop: impl Future<Output = ()>,
) {
    let worker = Arc::new(Worker::new(proxy, None));
    accept(listener, stop, move |tcp, peer, local, watcher| {
        let (worker, chosen) = (worker.clone(), listeners.listener(local));
        async move {
            match chosen {
                None => debug!(%peer, %local, "no listener on this address: closed"),
                Some(Listener::Http) => worker.serve_connection(tcp, peer, local, None, watcher).await,
                Some(Listener::Https(config)) => {
                    worker.serve_tls(TlsAcceptor::from(config), tcp, peer, local, watcher).await
                }
            }
        }
    })
    .await
}

/// Body of the requests sent to endpoints: the client's, or nothing (an empty body can be sent
/// again to another endpoint).
type UpstreamBody = Either<Limited<Incoming>, Empty<Bytes>>;
/// Body of the responses sent to clients: the endpoint's (through hyper's client or from a bare
/// connection), or one of our plain-text errors.
type ProxyBody = Either<PooledBody<UpstreamBody>, Either<WireBody, Full<Bytes>>>;

/// What all workers share: routes, limits, round robin positions, endpoint health.
pub struct Proxy {
    router: Arc<dyn Router>,
    config: ProxyConfig,
    targets: Targets,
    health: Health,
    /// Metrics of requests that no rule matched.
    unrouted: Labels,
}

impl Proxy {
    /// A proxy routing by `router`; serve it with [`serve_http`], [`serve_https`] and
    /// [`serve_listeners`].
    pub fn new(router: Arc<dyn Router>, config: ProxyConfig) -> Arc<Self> {
        Arc::new(Self {
            router,
            targets: Targets::default(),
            health: Health::new(&config),
            unrouted: Labels::new(String::new(), String::new()),
            config,
        })
    }
}

/// One listener's server on one worker runtime, with that worker's backend connections.
struct Worker {
    proxy: Arc<Proxy>,
    /// The certificates of an HTTPS listener, for the 421 check.
    certificates: Option<Arc<Certificates>>,
    server: auto::Builder<TokioExecutor>,
    pool: Arc<Pool<SendRequest<UpstreamBody>>>,
    /// Bare endpoint connections of the HTTP/1 fast path.
    wires: Arc<Pool<Wire>>,
    /// Request mirrors in flight.
    mirrors: AtomicUsize,
}

impl Worker {
    fn new(proxy: Arc<Proxy>, certificates: Option<Arc<Certificates>>) -> Self {
        let config = &proxy.config;
        let mut server = auto::Builder::new(TokioExecutor::new());
        let mut http1 = server.http1();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(config.client_header_timeout)
            .max_buf_size(config.max_request_head.max(MIN_REQUEST_HEAD));
        // hyper's default limit parses into a stack array; another limit costs a zeroed vector
        // per request.
        if config.max_headers != HYPER_MAX_HEADERS {
            http1.max_headers(config.max_headers);
        }
        server
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.max_concurrent_streams)
            .max_header_list_size(u32::try_from(config.max_request_head).unwrap_or(u32::MAX));
        let pool = Pool::new(config.connect_timeout, config.idle_timeout, config.max_upstream_connections);
        let wires = Pool::new(config.connect_timeout, config.idle_timeout, config.max_upstream_connections);
        Self { certificates, server, pool, wires, proxy, mirrors: AtomicUsize::new(0) }
    }

    /// Makes the TLS handshake of `tcp` with `acceptor` within `client_header_timeout`, then
    /// serves the connection.
    async fn serve_tls(
        self: Arc<Self>,
        acceptor: TlsAcceptor,
        tcp: TcpStream,
        peer: SocketAddr,
        local: SocketAddr,
        watcher: DrainWatch,
    ) {
        match tokio::time::timeout(self.proxy.config.client_header_timeout, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => {
                let sni = tls.get_ref().1.server_name().map(Box::from);
                let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                self.serve_connection(tls, peer, local, Some(Tls { sni, http2 }), watcher).await
            }
            Ok(Err(err)) => debug!(%peer, "TLS handshake failed: {err}"),
            Err(_) => debug!(%peer, "TLS handshake timed out"),
        }
    }

    /// Serves one client connection to `local` (over TLS as `tls` says) until it ends, sends no
    /// request within `client_header_timeout` (nor, on HTTP/1, a whole request head within as
    /// long), stays idle for `idle_timeout`, floods control frames, or is closed gracefully
    /// through `drain`. HTTP/1 starts on the fast path, HTTP/2 goes to hyper at once.
    async fn serve_connection<IO>(
        self: Arc<Self>,
        io: IO,
        peer: SocketAddr,
        local: SocketAddr,
        tls: Option<Tls>,
        mut drain: DrainWatch,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::default());
        let client_ip = peer.ip().to_canonical().to_string();
        let http2 = tls.as_ref().is_some_and(|tls| tls.http2);
        let conn = Arc::new(Conn {
            worker: self.clone(),
            peer,
            local,
            tls: tls.is_some(),
            client_ip: HeaderValue::try_from(client_ip).expect("an IP address is a valid header value"),
            trusted: forwarded::is_trusted(peer.ip(), &self.proxy.config.trusted_proxies),
            sni: tls.and_then(|tls| tls.sni),
            activity: activity.clone(),
        });
        let mut io = Tracked { io, activity: activity.clone(), frames: FrameBudget::new(), unread: Bytes::new() };
        let served = async {
            let handoff = if http2 { Some(Vec::new()) } else { fast::serve(&conn, &mut io, &mut drain).await };
            let Some(read) = handoff else { return };
            io.unread = Bytes::from(read);
            let service = hyper::service::service_fn(move |request| {
                let conn = conn.clone();
                async move { Ok::<_, Infallible>(conn.handle(request).await) }
            });
            let connection = self.server.serve_connection_with_upgrades(TokioIo::new(io), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = drain.signalled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(err) = result {
                debug!(%peer, "connection: {err}");
            }
        };
        let config = &self.proxy.config;
        tokio::select! {
            biased;
            () = served => {}
            closing = activity.closing(config.idle_timeout, config.client_header_timeout) => match closing {
                Closing::Idle => debug!(%peer, "idle connection closed"),
                Closing::NoRequest => debug!(%peer, "no request within the client header timeout: closed"),
                Closing::HeadStalled => {
                    debug!(%peer, "no whole request head within the client header timeout: closed");
                }
            },
        }
    }

    /// Sends `request` to `endpoint` within `timeout` (to its response head); counts upstream
    /// errors. A request the endpoint saw nothing of (`Connect`, `Busy`) comes back with the
    /// failure.
    async fn send(
        &self,
        endpoint: SocketAddr,
        request: Request<UpstreamBody>,
        labels: &Labels,
        timeout: Duration,
    ) -> Result<Response<PooledBody<UpstreamBody>>, (Failure, Option<Request<UpstreamBody>>)> {
        let sent = tokio::time::timeout(timeout, self.pool.send(endpoint, request)).await;
        let (failure, unsent) = match sent {
            Ok(Ok(response)) => return Ok(response),
            Err(_elapsed) => (Failure::Timeout, None),
            Ok(Err(SendError::Connect(unsent))) => (Failure::Connect, Some(unsent)),
            Ok(Err(SendError::Busy(unsent))) => (Failure::Busy, Some(unsent)),
            Ok(Err(SendError::Upstream(err))) if caused_by::<LengthLimitError>(&err) => (Failure::BodyTooLarge, None),
            Ok(Err(SendError::Upstream(err))) => {
                debug!(service = %labels.service, "upstream: {err:?}");
                (Failure::Reset, None)
            }
        };
        failure.count(labels);
        Err((failure, unsent))
    }

    /// A place for one more mirror in flight, if there is one.
    fn mirror_slot(self: &Arc<Self>) -> Option<MirrorSlot> {
        let max = self.proxy.config.max_mirrors_in_flight;
        self.mirrors.fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1)).ok()?;
        Some(MirrorSlot(self.clone()))
    }
}

/// One mirror in flight on its worker, until dropped.
struct MirrorSlot(Arc<Worker>);

impl Drop for MirrorSlot {
    fn drop(&mut self) {
        self.0.mirrors.fetch_sub(1, Relaxed);
    }
}

/// Whether `E` is somewhere in the chain of `err`'s sources.
fn caused_by<E: Error + 'static>(err: &(dyn Error + 'static)) -> bool {
    std::iter::successors(Some(err), |&err| err.source()).any(|err| err.is::<E>())
}

/// Accepts connections until `stop` completes, with TCP_NODELAY, and runs `serve` for each (with
/// its peer and local address, an IPv4-mapped one as IPv4) on its own task; then closes the
/// listener and shuts the connections down gracefully.
async fn accept<F, Fut>(listener: TcpListener, stop: impl Future<Output = ()>, serve: F)
where
    F: Fn(TcpStream, SocketAddr, SocketAddr, DrainWatch) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let graceful = Drain::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let local = match tcp.local_addr() {
                    Ok(local) => SocketAddr::new(local.ip().to_canonical(), local.port()),
                    Err(err) => {
                        debug!(%peer, "local address: {err}");
                        continue;
                    }
                };
                if let Err(err) = tcp.set_nodelay(true) {
                    debug!(%peer, "TCP_NODELAY: {err}");
                }
                tokio::spawn(serve(tcp, peer, local, graceful.watch()));
            }
            Err(err) => {
                // Out of file descriptors, most likely: give connections time to close.
                warn!("accept: {err}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    drop(listener);
    debug!(connections = graceful.count(), "draining");
    graceful.shutdown().await;
}

/// Why forwarding to an endpoint failed.
enum Failure {
    Connect,
    /// Every connection to the endpoint stayed busy: it saw nothing of the request.
    Busy,
    Timeout,
    Reset,
    /// The client's body outgrew `max_request_body` while streaming: not the endpoint's fault.
    BodyTooLarge,
}

impl Failure {
    /// The `kind` label of [`UPSTREAM_ERRORS_TOTAL`], for failures that are the endpoint's.
    fn upstream_kind(&self) -> Option<&'static str> {
        match self {
            Failure::Connect => Some("connect"),
            Failure::Busy => Some("busy"),
            Failure::Timeout => Some("timeout"),
            Failure::Reset => Some("reset"),
            Failure::BodyTooLarge => None,
        }
    }

    /// Counts the failure in [`UPSTREAM_ERRORS_TOTAL`] of `labels`' service, if it is the
    /// endpoint's.
    fn count(&self, labels: &Labels) {
        if let Some(kind) = self.upstream_kind() {
            counter!(UPSTREAM_ERRORS_TOTAL, "service" => labels.service.clone(), "kind" => kind).increment(1);
        }
    }

    fn answer(&self) -> Answer {
        match self {
            Failure::Connect => text(StatusCode::BAD_GATEWAY, "upstream connect error\n"),
            Failure::Busy => text(StatusCode::SERVICE_UNAVAILABLE, "upstream connection limit reached\n"),
            Failure::Timeout => text(StatusCode::GATEWAY_TIMEOUT, "upstream response timeout\n"),
            Failure::Reset => text(StatusCode::BAD_GATEWAY, "upstream connection reset before response\n"),
            Failure::BodyTooLarge => text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"),
        }
    }
}

/// What a TLS client connection's handshake settled.
struct Tls {
    /// The server name the client asked for.
    sni: Option<Box<str>>,
    /// ALPN chose HTTP/2.
    http2: bool,
}

/// One client connection, shared by its requests.
struct Conn {
    worker: Arc<Worker>,
    peer: SocketAddr,
    /// The address the client connected to.
    local: SocketAddr,
    /// Whether the connection is TLS: the router's `tls`, and `X-Forwarded-Proto`.
    tls: bool,
    /// The client's address as a header value, for `X-Forwarded-For` and `X-Real-IP`.
    client_ip: HeaderValue,
    /// Whether the client is one of `trusted_proxies`.
    trusted: bool,
    /// The server name of the TLS handshake.
    sni: Option<Box<str>>,
    activity: Arc<Activity>,
}

/// What decided a request, for its metrics and access log.
enum Decided {
    /// It was forwarded to this target.
    Target(Arc<TargetState>),
    /// The proxy answered it for this route.
    Route(Arc<str>, Arc<Labels>),
}

/// What routing made of a request.
struct Routed {
    /// The request's URI as received, for the access log.
    uri: Uri,
    /// The host routed on, for the access log.
    host: Box<str>,
    decided: Option<Decided>,
    next: Next,
}

/// What comes after routing.
// One per request, taken apart at once: boxing would cost an allocation.
#[allow(clippy::large_enum_variant)]
enum Next {
    Answer(Answer),
    Forward(Forwarding),
}

/// A request on its way to an endpoint.
struct Forwarding {
    parts: Parts,
    /// The `Host` routed on: the authority, else the `Host` field.
    host: Option<HeaderValue>,
    /// The normalised path, when it differs from the received one.
    path: Option<String>,
    forward: Forward,
    state: Arc<TargetState>,
}

impl Conn {
    /// Answers one request: checks it, routes it, forwards it or answers it as the router
    /// decided, and logs and counts the outcome.
    async fn handle(&self, request: Request<Incoming>) -> Response<ProxyBody> {
        let started = Instant::now();
        let _waiting = self.activity.wait();
        let (parts, body) = request.into_parts();
        let method = parts.method.clone();
        let Routed { uri, host, decided, next } = self.route(parts);
        let (response, endpoint) = match next {
            Next::Answer(answer) => (answer.into_response(), None),
            Next::Forward(forwarding) => self.forward(forwarding, body).await,
        };
        self.record(&method, &uri, &host, decided.as_ref(), response.status(), endpoint, started.elapsed());
        response
    }

    /// Checks a request and asks the router where it goes.
    fn route(&self, mut parts: Parts) -> Routed {
        let proxy = &*self.worker.proxy;
        // The Host fields leave the request; the one routed on goes back when it is forwarded.
        let mut drain = match parts.headers.entry(header::HOST) {
            header::Entry::Occupied(fields) => Some(fields.remove_entry_mult().1),
            header::Entry::Vacant(_) => None,
        };
        let fields = [(); 2].map(|()| drain.as_mut().and_then(Iterator::next));
        drop(drain);
        // The host and path are read from a copy, the request moves on.
        let uri = parts.uri.clone();
        let authority = uri.authority().map(|authority| authority.as_str());
        let host = request_host(
            authority,
            fields.iter().flatten().map(HeaderValue::as_bytes),
            parts.version == Version::HTTP_11,
        );
        let path = normalize(uri.path());
        let host_name = host.as_ref().map_or("", |host| &host.name);
        let answered = |answer| (None, Next::Answer(answer));
        let (decided, next) = match (&parts.method.clone(), &host, &path) {
            (&Method::CONNECT | &Method::TRACE, _, _) => answered(not_allowed()),
            (_, Err(err), _) => answered(text(StatusCode::BAD_REQUEST, format!("invalid host: {err}\n"))),
            (_, _, Err(err)) => answered(text(StatusCode::BAD_REQUEST, format!("invalid path: {err}\n"))),
            (_, Ok(_), Ok(_)) if self.misdirected(host_name) => {
                answered(text(StatusCode::MISDIRECTED_REQUEST, "misdirected request\n"))
            }
            (_, Ok(host), Ok(path)) => {
                let request = decision::Request {
                    local: self.local,
                    tls: self.tls,
                    host: &host.name,
                    path: &path.matched,
                    query: uri.query(),
                    method: &parts.method,
                    headers: &parts.headers,
                };
                match proxy.router.route(&request) {
                    None => answered(text(StatusCode::NOT_FOUND, "no route for this host and path\n")),
                    Some(Decision::Respond { route, status, headers }) => {
                        let labels = proxy.targets.route_labels(&route);
                        (Some(Decided::Route(route, labels)), Next::Answer(answer(status, headers)))
                    }
                    Some(Decision::Forward(forward)) => {
                        let state = proxy.targets.get(&forward.target);
                        // The authority replaces any Host field (RFC 9112 §3.2.2, RFC 9113 §8.3.1).
                        let forwarded_host = match authority {
                            Some(authority) => HeaderValue::from_str(authority).ok(),
                            None => fields[0].clone(),
                        };
                        let forwarded_path = match &path.forwarded {
                            Cow::Owned(forwarded) => Some(forwarded.clone()),
                            Cow::Borrowed(_) => None,
                        };
                        (
                            Some(Decided::Target(state.clone())),
                            Next::Forward(Forwarding {
                                parts,
                                host: forwarded_host,
                                path: forwarded_path,
                                forward,
                                state,
                            }),
                        )
                    }
                }
            }
        };
        Routed { host: host_name.into(), decided, next, uri }
    }

    /// Counts a request's outcome and writes its access log line.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        method: &Method,
        uri: &Uri,
        host: &str,
        decided: Option<&Decided>,
        status: StatusCode,
        endpoint: Option<SocketAddr>,
        elapsed: Duration,
    ) {
        let (labels, ingress, service): (_, Option<&dyn fmt::Display>, Option<&dyn fmt::Display>) = match decided {
            Some(Decided::Target(state)) => (&state.labels, Some(&state.ingress), Some(&state.service)),
            Some(Decided::Route(route, labels)) => (&**labels, Some(route), None),
            None => (&self.worker.proxy.unrouted, None, None),
        };
        labels.record(status, elapsed);
        tracing::info!(
            target: "access",
            client = %self.peer.ip().to_canonical(),
            %method,
            host = %host,
            path = uri.path(),
            status = status.as_u16(),
            ingress = ingress.map(tracing::field::display),
            service = service.map(tracing::field::display),
            endpoint = endpoint.map(tracing::field::display),
            duration = ?elapsed,
        );
    }

    /// Whether this is a TLS connection whose SNI got another certificate than `host` has of its
    /// own (RFC 9110 §15.5.20: 421).
    fn misdirected(&self, host: &str) -> bool {
        let Some(certificates) = &self.worker.certificates else { return false };
        self.sni.as_deref() != Some(host) && certificates.misdirected(self.sni.as_deref(), host)
    }

    /// Forwards a request ([`Conn::prepare`]), then sends it to an endpoint within the request
    /// timeout, if there is one: an HTTP/2 request without a body on a bare connection
    /// ([`Conn::forward_bare`]); others through hyper's client ([`Conn::attempts`]), so that an
    /// HTTP/1 connection the fast path handed over keeps to one pool of endpoint connections.
    /// Returns the response and the endpoint.
    async fn forward(&self, mut forwarding: Forwarding, body: Incoming) -> (Response<ProxyBody>, Option<SocketAddr>) {
        let http2 = forwarding.parts.version == Version::HTTP_2;
        let upgrade = match self.prepare(&mut forwarding, body.size_hint().lower()) {
            Ok(upgrade) => upgrade,
            Err(answer) => return (answer.into_response(), None),
        };
        if http2 && !upgrade && body.is_end_stream() {
            return self.forward_bare(forwarding).await;
        }
        let Forwarding { mut parts, forward, state, .. } = forwarding;
        let client_upgrade = if upgrade { parts.extensions.remove::<OnUpgrade>() } else { None };
        let mut tried = None;
        let attempts = self.attempts(parts, body, client_upgrade, &forward, &state, &mut tried);
        let Some(limit) = forward.actions.as_ref().and_then(|actions| actions.request_timeout) else {
            return attempts.await;
        };
        match tokio::time::timeout(limit, attempts).await {
            Ok(answered) => answered,
            Err(_elapsed) => (request_timed_out(&state).into_response(), tried),
        }
    }

    /// Checks the limits of a request to forward with a body of at least `body` bytes, applies
    /// its header edits and sets the forwarded fields, rewrites the path and `Host` as its
    /// [`Forward`] says, and sends its mirrors; returns whether it asks for an upgrade, or the
    /// answer to a request that cannot be forwarded.
    #[allow(clippy::result_large_err)] // as `Next`: no allocation per request
    fn prepare(&self, forwarding: &mut Forwarding, body: u64) -> Result<bool, Answer> {
        let proxy = &*self.worker.proxy;
        let Forwarding { parts, host, path, forward, .. } = forwarding;
        let (target, actions) = (&*forward.target, forward.actions.as_deref());
        let limit = proxy.config.max_request_body.unwrap_or(usize::MAX);
        if parts.headers.len() > proxy.config.max_headers {
            return Err(text(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "too many request header fields\n"));
        }
        if body > limit as u64 {
            return Err(text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"));
        }
        if target.endpoints.is_empty() {
            return Err(text(StatusCode::SERVICE_UNAVAILABLE, format!("no ready endpoints for {}\n", target.service)));
        }

        if let Some(actions) = actions {
            edit(&actions.request_headers, &mut parts.headers);
        }
        let upgrade = strip_hop_by_hop(&mut parts.headers, true);
        self.add_forwarded(&mut parts.headers, host.take(), forward.host.clone());
        parts.version = Version::HTTP_11;
        // Origin form: the connection already goes to the endpoint.
        parts.uri = match (&forward.path, path.as_deref(), parts.uri.path_and_query()) {
            (Some(rewritten), _, received) => rewritten_uri(rewritten, received.and_then(PathAndQuery::query)),
            (None, None, Some(received)) => Uri::from(received.clone()),
            (None, None, None) => Uri::from(PathAndQuery::from_static("/")),
            (None, Some(path), received) => {
                let forwarded = match received.and_then(PathAndQuery::query) {
                    Some(query) => PathAndQuery::try_from(format!("{path}?{query}")),
                    None => PathAndQuery::try_from(path),
                };
                // Received characters and slashes: always valid.
                Uri::from(forwarded.expect("a normalised path is a valid path"))
            }
        };
        if let Some(actions) = actions
            && !actions.mirrors.is_empty()
        {
            let timeout = self.backend_timeout(Some(actions));
            self.mirror(parts, &actions.mirrors, actions.request_timeout.map_or(timeout, |limit| limit.min(timeout)));
        }
        Ok(upgrade)
    }

    /// Sends the request to an endpoint of `forward`'s target, each attempt within the backend
    /// timeout (else the response timeout), retrying a connect failure once on another endpoint
    /// when the body is empty; notes each endpoint tried in `tried`.
    async fn attempts(
        &self,
        parts: Parts,
        body: Incoming,
        client_upgrade: Option<OnUpgrade>,
        forward: &Forward,
        state: &TargetState,
        tried: &mut Option<SocketAddr>,
    ) -> (Response<ProxyBody>, Option<SocketAddr>) {
        let (worker, proxy) = (&*self.worker, &*self.worker.proxy);
        let (target, actions) = (&*forward.target, forward.actions.as_deref());
        let timeout = self.backend_timeout(actions);
        let limit = proxy.config.max_request_body.unwrap_or(usize::MAX);
        // Only an empty body can be sent twice: a body streams through without buffering, so a
        // request with one is not retried. A connect failure means the endpoint saw nothing,
        // so retrying is safe for every method; the request comes back from the pool unsent.
        let empty = body.is_end_stream();
        let mut retry = empty && target.endpoints.len() > 1;
        let body = if empty { Either::Right(Empty::new()) } else { Either::Left(Limited::new(body, limit)) };
        let mut request = Request::from_parts(parts, body);
        // An HTTP/1.0 client may send no `Host`; HTTP/1.1 requires one: the endpoint's address.
        let host_of_endpoint = !request.headers().contains_key(header::HOST);

        let endpoints = &target.endpoints[..];
        let mut index = proxy.health.pick(endpoints, state.next.fetch_add(1, Relaxed), None).expect("endpoints");
        loop {
            let endpoint = endpoints[index];
            *tried = Some(endpoint);
            if host_of_endpoint {
                request.headers_mut().insert(header::HOST, endpoint_host(endpoint));
            }
            let (failure, unsent) = match worker.send(endpoint, request, &state.labels, timeout).await {
                Ok(response) => {
                    proxy.health.succeeded(endpoint);
                    let edits = actions.map(|actions| &actions.response_headers);
                    return (self.respond(response, client_upgrade, edits), Some(endpoint));
                }
                Err(failed) => failed,
            };
            if let Some(next) = proxy.health.next_after(&failure, endpoints, index)
                && retry
                && let Some(unsent) = unsent
            {
                (retry, request, index) = (false, unsent, next);
                continue;
            }
            return (failure.answer().into_response(), Some(endpoint));
        }
    }

    /// The time an endpoint has for its response head: the route's backend timeout, else
    /// [`ProxyConfig::response_timeout`].
    fn backend_timeout(&self, actions: Option<&Actions>) -> Duration {
        actions.and_then(|actions| actions.backend_timeout).unwrap_or(self.worker.proxy.config.response_timeout)
    }

    /// Sends a copy of `parts` (the head as forwarded) with an empty body to one endpoint of each
    /// of `mirrors`, each from a task of its own that reads the answer and drops it, all within
    /// `timeout`; a mirror finding its worker's `max_mirrors_in_flight` taken is dropped and
    /// counted. Mirrors do not count towards endpoint health.
    fn mirror(&self, parts: &Parts, mirrors: &[Arc<Target>], timeout: Duration) {
        let proxy = &*self.worker.proxy;
        for target in mirrors.iter().filter(|target| !target.endpoints.is_empty()) {
            let state = proxy.targets.get(target);
            let Some(slot) = self.worker.mirror_slot() else {
                state.labels.mirror_dropped();
                continue;
            };
            let index = proxy.health.pick(&target.endpoints, state.next.fetch_add(1, Relaxed), None);
            let endpoint = target.endpoints[index.expect("endpoints")];
            let mut request = Request::new(Either::Right(Empty::new()));
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = parts.uri.clone();
            let headers = request.headers_mut();
            *headers = parts.headers.clone();
            // The body is not sent, nor is an upgrade asked for.
            for name in [header::CONTENT_LENGTH, header::EXPECT, header::CONNECTION, header::UPGRADE] {
                headers.remove(name);
            }
            if !headers.contains_key(header::HOST) {
                headers.insert(header::HOST, endpoint_host(endpoint));
            }
            tokio::spawn(async move {
                let MirrorSlot(worker) = &slot;
                let drained = async {
                    let response = worker.send(endpoint, request, &state.labels, timeout).await.ok()?;
                    let mut body = response.into_body();
                    while body.frame().await?.is_ok() {}
                    Some(())
                };
                if tokio::time::timeout(timeout, drained).await.is_err() {
                    debug!(%endpoint, "mirror timed out");
                }
            });
        }
    }

    /// Sets `Host` to `rewritten`, else to `host`, and the forwarded fields: from a client that
    /// is not a trusted proxy, `X-Forwarded-For` and `X-Real-IP` are its address,
    /// `X-Forwarded-Proto` our scheme and `X-Forwarded-Host` `host`, whatever it sent; a trusted
    /// proxy's `X-Forwarded-For` is appended to, `X-Real-IP` is the client it names, and its
    /// `-Proto` and `-Host` are kept.
    fn add_forwarded(&self, headers: &mut HeaderMap, host: Option<HeaderValue>, rewritten: Option<HeaderValue>) {
        let proto = PROTO[usize::from(self.tls)].clone();
        let mut real_ip = self.client_ip.clone();
        if self.trusted {
            let mut forwarded_for = Vec::new();
            for previous in headers.get_all(X_FORWARDED_FOR) {
                forwarded_for.extend_from_slice(previous.as_bytes());
                forwarded_for.extend_from_slice(b", ");
            }
            forwarded_for.extend_from_slice(self.client_ip.as_bytes());
            let trusted = &self.worker.proxy.config.trusted_proxies;
            if let Some(client) = forwarded::real_client(&forwarded_for, trusted) {
                real_ip = HeaderValue::try_from(client.to_string()).expect("an IP address is a valid header value");
            }
            let forwarded_for = HeaderValue::from_maybe_shared(Bytes::from(forwarded_for));
            headers.insert(X_FORWARDED_FOR, forwarded_for.expect("joined valid header values"));
            if !headers.contains_key(X_FORWARDED_PROTO) {
                headers.insert(X_FORWARDED_PROTO, proto);
            }
            if let Some(host) = &host
                && !headers.contains_key(X_FORWARDED_HOST)
            {
                headers.insert(X_FORWARDED_HOST, host.clone());
            }
        } else {
            headers.insert(X_FORWARDED_FOR, self.client_ip.clone());
            headers.insert(X_FORWARDED_PROTO, proto);
            match &host {
                Some(host) => headers.insert(X_FORWARDED_HOST, host.clone()),
                None => headers.remove(X_FORWARDED_HOST),
            };
        }
        headers.insert(X_REAL_IP, real_ip);
        if let Some(host) = rewritten.or(host) {
            headers.insert(header::HOST, host);
        }
    }

    /// Turns the endpoint's response into ours: applies `edits`, strips hop-by-hop fields, and
    /// for a `101` to an upgrade request joins the two upgraded connections.
    fn respond(
        &self,
        mut response: Response<PooledBody<UpstreamBody>>,
        client_upgrade: Option<OnUpgrade>,
        edits: Option<&HeaderEdits>,
    ) -> Response<ProxyBody> {
        if let Some(edits) = edits {
            edit(edits, response.headers_mut());
        }
        let switching = client_upgrade.is_some() && response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if strip_hop_by_hop(response.headers_mut(), switching)
            && let Some(client) = client_upgrade
        {
            let backend = hyper::upgrade::on(&mut response);
            tokio::spawn(tunnel(client, backend, self.activity.clone(), self.worker.proxy.config.idle_timeout));
        }
        response.map(Either::Left)
    }
}

/// The header fields of an endpoint's response head (`response`, parsed from `head`) as a map,
/// with the route's `edits` applied and the hop-by-hop fields dropped.
fn edited_headers(response: &FinalResponse, head: &[u8], edits: Option<&HeaderEdits>) -> HeaderMap {
    let mut headers = response.header_map(head);
    if let Some(edits) = edits {
        edit(edits, &mut headers);
    }
    strip_hop_by_hop(&mut headers, false);
    headers
}

/// Applies header `edits` to a message's `headers`, but keeps its `Content-Length` (or its
/// absence): the framing is the body's, not a rule's. The hop-by-hop fields are dropped after.
fn edit(edits: &HeaderEdits, headers: &mut HeaderMap) {
    if edits.is_empty() {
        return;
    }
    let length = headers.get(header::CONTENT_LENGTH).cloned();
    edits.apply(headers);
    match length {
        Some(length) => headers.insert(header::CONTENT_LENGTH, length),
        None => headers.remove(header::CONTENT_LENGTH),
    };
}

/// The origin-form target for a rewritten `path` (decoded, as routers see paths) and the
/// received `query`: the bytes that a path cannot carry as they are (`%`, `?`, `#`, spaces,
/// controls, non-ASCII, ...) percent-encoded, and a leading `/` added if missing.
fn rewritten_uri(path: &str, query: Option<&str>) -> Uri {
    let mut target = String::with_capacity(path.len() + 1 + query.map_or(0, |query| query.len() + 1));
    if !path.starts_with('/') {
        target.push('/');
    }
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => target.push(char::from(byte)),
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@' => {
                target.push(char::from(byte))
            }
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                target.extend(['%', char::from(HEX[usize::from(byte >> 4)]), char::from(HEX[usize::from(byte & 15)])]);
            }
        }
    }
    if let Some(query) = query {
        target.push('?');
        target.push_str(query);
    }
    // Path characters as RFC 3986 allows them, and a query as received.
    Uri::from(PathAndQuery::try_from(target).expect("an encoded path and a received query are valid"))
}

/// The proxy's own answer to a [`Decision::Respond`]: `status` with its reason as a plain-text
/// body (none for 204), and `headers`.
fn answer(status: StatusCode, headers: Vec<(HeaderName, HeaderValue)>) -> Answer {
    let mut answer = if status == StatusCode::NO_CONTENT {
        Answer { status, headers: HeaderMap::new(), body: Bytes::new() }
    } else {
        let reason = status.canonical_reason().unwrap_or("no reason").to_ascii_lowercase();
        text(status, format!("{reason}\n"))
    };
    for (name, value) in headers {
        answer.headers.append(name, value);
    }
    answer
}

/// Copies bytes both ways between an upgraded client and endpoint connection until either side
/// closes or nothing moves for `idle`.
async fn tunnel(client: OnUpgrade, backend: OnUpgrade, activity: Arc<Activity>, idle: Duration) {
    let (client, backend) = match tokio::join!(client, backend) {
        (Ok(client), Ok(backend)) => (client, backend),
        (Err(err), _) | (_, Err(err)) => return debug!("upgrade failed: {err}"),
    };
    let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
    tokio::select! {
        result = tokio::io::copy_bidirectional(&mut client, &mut backend) => {
            if let Err(err) = result {
                debug!("upgraded connection: {err}");
            }
        }
        // A request came on this connection: only the idle timeout applies.
        _ = activity.closing(idle, Duration::MAX) => debug!("idle upgraded connection closed"),
    }
}

/// Removes hop-by-hop fields: the fixed ones and those the `Connection` field names. With
/// `allow_upgrade`, a message with `Upgrade` whose `Connection` names `upgrade` keeps `Upgrade`
/// and gets `Connection: upgrade`; returns whether that happened.
fn strip_hop_by_hop(headers: &mut HeaderMap, allow_upgrade: bool) -> bool {
    let mut upgrade = false;
    if let header::Entry::Occupied(connection) = headers.entry(header::CONNECTION) {
        let (_, values) = connection.remove_entry_mult();
        let values: Vec<HeaderValue> = values.collect();
        for token in values.iter().filter_map(|value| value.to_str().ok()).flat_map(|value| value.split(',')) {
            let token = token.trim();
            if token.eq_ignore_ascii_case("upgrade") {
                upgrade = allow_upgrade;
            } else {
                headers.remove(token);
            }
        }
    }
    for name in &crate::h1::encode::HOP_BY_HOP {
        headers.remove(name);
    }
    let upgrade = upgrade && headers.contains_key(header::UPGRADE);
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
    upgrade
}

/// An answer of the proxy's own: a status, header fields and a short body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn into_response(self) -> Response<ProxyBody> {
        let mut response = Response::new(Either::Right(Either::Right(Full::new(self.body))));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

/// A plain-text answer.
fn text(status: StatusCode, message: impl Into<Bytes>) -> Answer {
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    Answer { status, headers, body: message.into() }
}

/// 405 for `CONNECT` (no tunnels to arbitrary hosts) and `TRACE` (nginx refuses it too), with
/// the methods that are forwarded.
fn not_allowed() -> Answer {
    let mut answer = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    answer.headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"));
    answer
}

/// The `Host` of a request that came without one (HTTP/1.0): the endpoint's address.
fn endpoint_host(endpoint: SocketAddr) -> HeaderValue {
    HeaderValue::try_from(endpoint.to_string()).expect("an address is a valid header value")
}

/// 504 for a request whose request timeout ran out, counted as an upstream timeout.
fn request_timed_out(state: &TargetState) -> Answer {
    counter!(UPSTREAM_ERRORS_TOTAL, "service" => state.labels.service.clone(), "kind" => "timeout").increment(1);
    text(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout\n")
}

/// Milliseconds since the first call: a cheap monotonic clock that fits an atomic.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// State per target, keyed by a hash of (ingress, service, endpoint port), and metric handles
/// per route that answers itself ([`Decision::Respond`]), created on first use.
#[derive(Default)]
struct Targets {
    hasher: RandomState,
    states: ArcSwap<HashMap<u64, Arc<TargetState>>>,
    routes: ArcSwap<HashMap<Arc<str>, Arc<Labels>>>,
}

impl Targets {
    /// The metric handles of `route`'s own answers.
    fn route_labels(&self, route: &Arc<str>) -> Arc<Labels> {
        if let Some(labels) = self.routes.load().get(&**route) {
            return labels.clone();
        }
        let labels = Arc::new(Labels::new(route.to_string(), String::new()));
        self.routes.rcu(|routes| {
            let mut routes = HashMap::clone(routes);
            routes.entry(route.clone()).or_insert_with(|| labels.clone());
            routes
        });
        // Another request may have added it first.
        self.routes.load().get(&**route).cloned().unwrap_or(labels)
    }

    fn get(&self, target: &Target) -> Arc<TargetState> {
        let port = target.endpoints.first().map_or(0, SocketAddr::port);
        let key = self.hasher.hash_one((&target.ingress, &target.service, port));
        let known =
            |states: &HashMap<u64, Arc<TargetState>>| states.get(&key).filter(|state| state.is(target, port)).cloned();
        if let Some(state) = known(&self.states.load()) {
            return state;
        }
        let state = Arc::new(TargetState {
            ingress: target.ingress.clone(),
            service: target.service.clone(),
            port,
            next: AtomicUsize::new(0),
            labels: Labels::new(target.ingress.to_string(), target.service.to_string()),
        });
        self.states.rcu(|states| {
            let mut states = HashMap::clone(states);
            states.entry(key).or_insert_with(|| state.clone());
            states
        });
        // Another request may have added it first; on a (2^-64) hash collision, use it unshared.
        known(&self.states.load()).unwrap_or(state)
    }
}

/// Round robin position and metric handles of one target.
///
/// Round robin rather than least-requests: the endpoints of a Service are alike, requests
/// through an Ingress are mostly short, and round robin costs one shared atomic increment per
/// request and spreads evenly from the first request, where least-requests needs an in-flight
/// counter per endpoint that every request updates twice (and a random pick of two to stay
/// cheap), which pays off only for very uneven request costs.
struct TargetState {
    ingress: NamespacedName,
    service: NamespacedName,
    port: u16,
    next: AtomicUsize,
    labels: Labels,
}

impl TargetState {
    fn is(&self, target: &Target, port: u16) -> bool {
        self.port == port && self.ingress == target.ingress && self.service == target.service
    }
}

/// Metric handles of one (ingress, service), registered with the recorder installed at first use,
/// so that counting a request is atomic increments, not a registry lookup.
struct Labels {
    ingress: String,
    service: String,
    duration: Histogram,
    /// Request counters by status code, added as codes appear.
    requests: ArcSwap<Vec<(StatusCode, Counter)>>,
    /// Mirrors to this target dropped, registered at the first.
    mirrors_dropped: OnceLock<Counter>,
}

impl Labels {
    fn new(ingress: String, service: String) -> Self {
        Self {
            duration: histogram!(REQUEST_DURATION_SECONDS, "ingress" => ingress.clone()),
            requests: ArcSwap::default(),
            mirrors_dropped: OnceLock::new(),
            ingress,
            service,
        }
    }

    fn mirror_dropped(&self) {
        let counter = self.mirrors_dropped.get_or_init(
            || counter!(MIRRORS_DROPPED_TOTAL, "ingress" => self.ingress.clone(), "service" => self.service.clone()),
        );
        counter.increment(1);
    }

    fn record(&self, status: StatusCode, elapsed: Duration) {
        self.duration.record(elapsed);
        if let Some((_, counter)) = self.requests.load().iter().find(|(code, _)| *code == status) {
            return counter.increment(1);
        }
        let counter = counter!(REQUESTS_TOTAL, "ingress" => self.ingress.clone(),
            "service" => self.service.clone(), "status" => status.as_str().to_owned());
        counter.increment(1);
        self.requests.rcu(|requests| {
            let mut requests = Vec::clone(requests);
            if !requests.iter().any(|(code, _)| *code == status) {
                requests.push((status, counter.clone()));
            }
            requests
        });
    }
}

/// Passive health: endpoints with recent connect failures. Empty while all is well, so that
/// checking costs one atomic load. `eject_after` failures in a row eject an endpoint for
/// `eject_for`; a success forgets its failures, and failures older than `eject_for` are dropped
/// when the table changes.
struct Health {
    failing: ArcSwap<HashMap<SocketAddr, Arc<Failures>>>,
    eject_after: u32,
    eject_for_ms: u64,
}

/// Connect failures in a row of one endpoint, and when the last one happened.
#[derive(Default)]
struct Failures {
    count: AtomicU32,
    last_ms: AtomicU64,
}

impl Health {
    fn new(config: &ProxyConfig) -> Self {
        Self {
            failing: ArcSwap::default(),
            eject_after: config.eject_after,
            eject_for_ms: config.eject_for.as_millis() as u64,
        }
    }

    /// The index of the first endpoint from `from` on (wrapping around) that is not `skip` and
    /// not ejected; when all are ejected, the first that is not `skip` (trying beats failing).
    fn pick(&self, endpoints: &[SocketAddr], from: usize, skip: Option<usize>) -> Option<usize> {
        let n = endpoints.len();
        let mut candidates = (0..n).map(|i| (from % n + i) % n).filter(|&i| Some(i) != skip);
        let failing = self.failing.load();
        if failing.is_empty() {
            return candidates.next();
        }
        let now = now_ms();
        candidates.clone().find(|&i| !self.ejected(failing.get(&endpoints[i]), now)).or_else(|| candidates.next())
    }

    /// After `failure` at `endpoints[index]`: notes a connect failure, and for a failure the
    /// endpoint saw nothing of (connect, busy) gives the endpoint to retry on, if there is one.
    fn next_after(&self, failure: &Failure, endpoints: &[SocketAddr], index: usize) -> Option<usize> {
        match failure {
            Failure::Connect => self.failed(endpoints[index]),
            Failure::Busy => {}
            _ => return None,
        }
        self.pick(endpoints, index + 1, Some(index))
    }

    fn ejected(&self, failures: Option<&Arc<Failures>>, now: u64) -> bool {
        failures.is_some_and(|failures| {
            failures.count.load(Relaxed) >= self.eject_after && now < failures.last_ms.load(Relaxed) + self.eject_for_ms
        })
    }

    fn failed(&self, endpoint: SocketAddr) {
        let now = now_ms();
        let failures = match self.failing.load().get(&endpoint) {
            Some(failures) => failures.clone(),
            None => {
                let mut added = None;
                self.failing.rcu(|failing| {
                    let mut failing: HashMap<_, _> = failing
                        .iter()
                        .filter(|(_, failures)| now < failures.last_ms.load(Relaxed) + self.eject_for_ms)
                        .map(|(endpoint, failures)| (*endpoint, failures.clone()))
                        .collect();
                    added = Some(failing.entry(endpoint).or_default().clone());
                    failing
                });
                added.expect("rcu ran")
            }
        };
        failures.last_ms.store(now, Relaxed);
        failures.count.fetch_add(1, Relaxed);
    }

    fn succeeded(&self, endpoint: SocketAddr) {
        if self.failing.load().contains_key(&endpoint) {
            self.failing.rcu(|failing| {
                let mut failing = HashMap::clone(failing);
                failing.remove(&endpoint);
                failing
            });
        }
    }
}

/// Whether a client connection moved bytes lately, and how many of its requests wait for an
/// endpoint's response head: together they tell when it is idle. Moving bytes only sets a flag
/// (no clock read on the data path), which [`Activity::closing`] samples.
#[derive(Default)]
struct Activity {
    moved: AtomicBool,
    waiting: AtomicU32,
    /// Whether a request came.
    requested: AtomicBool,
    /// Whether the HTTP/1 fast path waits for (the rest of) a request head.
    reading: AtomicBool,
    /// Bumped each time `reading` changes: the head watchdog sees progress by it.
    heads: AtomicU32,
}

/// Why [`Activity::closing`] closes a connection.
#[derive(Debug)]
enum Closing {
    Idle,
    NoRequest,
    HeadStalled,
}

impl Activity {
    /// Counts a request as waiting until the returned guard is dropped.
    fn wait(&self) -> Waiting<'_> {
        self.requested.store(true, Relaxed);
        self.waiting.fetch_add(1, Relaxed);
        Waiting(self)
    }

    /// Notes that the fast path starts (`true`) or stops waiting for a request head.
    fn reading(&self, reading: bool) {
        self.reading.store(reading, Relaxed);
        self.heads.fetch_add(1, Relaxed);
    }

    /// Returns why the connection is to be closed, once: no byte has moved and no request has
    /// waited for `idle`; no request came within `header`; or the fast path has waited for one
    /// request head for `header` (a slow client's trickle of bytes does not reset that, only a
    /// whole head). Sampled every quarter of the shorter timeout (so each may run over by as
    /// much): the hot path only stores and bumps, and a connection's task polls one timer for
    /// all three.
    async fn closing(&self, idle: Duration, header: Duration) -> Closing {
        let step = (idle.min(header) / 4).max(Duration::from_millis(1));
        let (mut elapsed, mut quiet, mut stalled) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let mut last_heads = self.heads.load(Relaxed);
        loop {
            tokio::time::sleep(step).await;
            elapsed += step;
            let active = self.moved.swap(false, Relaxed) || self.waiting.load(Relaxed) > 0;
            quiet = if active { Duration::ZERO } else { quiet + step };
            let heads = self.heads.load(Relaxed);
            stalled = if heads == last_heads && self.reading.load(Relaxed) { stalled + step } else { Duration::ZERO };
            last_heads = heads;
            if quiet >= idle {
                return Closing::Idle;
            }
            if elapsed >= header && !self.requested.load(Relaxed) {
                return Closing::NoRequest;
            }
            if stalled >= header {
                return Closing::HeadStalled;
            }
        }
    }
}

/// A request waiting for its response head; see [`Activity::wait`].
struct Waiting<'a>(&'a Activity);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

/// A client connection that notes in its [`Activity`] when bytes move, and fails its reads when
/// the client floods HTTP/2 control frames (hyper then closes it). Reads give `unread` first:
/// what the fast path read before handing the connection to hyper (already counted).
struct Tracked<IO> {
    io: IO,
    activity: Arc<Activity>,
    frames: FrameBudget,
    unread: Bytes,
}

impl<IO> Tracked<IO> {
    fn note<T>(&self, poll: Poll<T>) -> Poll<T> {
        if poll.is_ready() {
            self.activity.moved.store(true, Relaxed);
        }
        poll
    }

    /// [`Tracked::note`] for a write, which also earns control-frame credit.
    fn wrote(&mut self, poll: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = poll {
            self.frames.wrote(n);
        }
        self.note(poll)
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.unread.is_empty() {
            let n = buf.remaining().min(self.unread.len());
            buf.put_slice(&self.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll
            && let Err(flood) = self.frames.read(&buf.filled()[before..])
        {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, flood)));
        }
        self.note(poll)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

mod fast;
mod wire_body;

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
