//! The small HTTP servers of every command: kube-proxy's `/healthz` and `/livez` (JSON, 200 or 503)
//! and its metrics server (Prometheus text at `/metrics`, `/proxyMode`) for `roadkeeper proxy` in
//! watch mode, the DNS server's health and metrics, the ingress metrics and the health-check
//! NodePorts, all through [`spawn_server`], which bounds what a client can hold: a request head
//! must arrive within [`HEADER_READ_TIMEOUT`] (also between requests of a kept-alive connection),
//! a connection lasts at most [`CONNECTION_TIMEOUT`], and at most [`MAX_CONNECTIONS`] are served
//! at once (the rest wait in the kernel's backlog, holding no file descriptor). The Prometheus recorder folds its
//! samples on a timer ([`install`]), so memory stays flat when nobody scrapes.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics::counter;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use roadkeeper_proxy::health::ProxyHealth;
use roadkeeper_rules::config::ProxyMode;

/// The proxier's health, shared by the sync loop (writer) and the health server (reader).
pub type SharedHealth = Arc<Mutex<ProxyHealth>>;

/// A response body.
type Body = Full<Bytes>;

/// How long a client may take to send a request head, or stay silent between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may last at all (a client that never reads its answer, say).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one server handles at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How often the Prometheus recorder folds histogram samples into buckets (without it they pile
/// up until a scrape).
const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

pub(crate) const HEALTHZ: &str = "kubeproxy_proxy_healthz_total";
pub(crate) const LIVEZ: &str = "kubeproxy_proxy_livez_total";

/// Histogram buckets from `first` doubling `count` times (Prometheus' exponential buckets).
pub fn doubling_buckets(first: f64, count: u32) -> Vec<f64> {
    (0..count).map(|i| first * f64::from(1u32 << i)).collect()
}

/// Installs the global Prometheus recorder with `buckets` for every histogram (see [`install`]).
pub fn install_recorder(buckets: &[f64]) -> anyhow::Result<PrometheusHandle> {
    install(PrometheusBuilder::new().set_buckets(buckets)?)
}

/// Installs `builder`'s recorder as the global one, with a thread running its upkeep every
/// [`UPKEEP_PERIOD`].
pub fn install(builder: PrometheusBuilder) -> anyhow::Result<PrometheusHandle> {
    let handle = builder.install_recorder().context("installing the metrics recorder")?;
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_PERIOD);
                upkeep.run_upkeep();
            }
        })
        .context("starting the metrics upkeep")?;
    Ok(handle)
}

/// Binds `address` (`IP:PORT`) for the server of `flag`; `None` when the address is empty
/// (server disabled). Called before the first sync so that a bad address fails at start.
pub fn bind(flag: &str, address: &str) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = listen_address(flag, address)? else { return Ok(None) };
    let listener = TcpListener::bind(addr).with_context(|| format!("{flag}: cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    Ok(Some(listener))
}

/// `address` (`IP:PORT`) of the server of `flag`; `None` when it is empty (server disabled).
pub fn listen_address(flag: &str, address: &str) -> anyhow::Result<Option<SocketAddr>> {
    if address.is_empty() {
        return Ok(None);
    }
    let addr = address.parse().with_context(|| format!("{flag}: {address:?} is not an IP:PORT address"))?;
    Ok(Some(addr))
}

/// `count` sockets of `kind` (`STREAM` or `DGRAM`) bound to `addr` with `SO_REUSEPORT`, one per
/// worker of a server (the ingress's and the DNS server's), among which the kernel spreads
/// connections and datagrams; non-blocking, not yet listening. Port 0 is chosen once, for all.
pub fn reuseport_sockets(
    mut addr: SocketAddr,
    kind: socket2::Type,
    count: usize,
) -> std::io::Result<Vec<socket2::Socket>> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = socket2::Socket::new(socket2::Domain::for_address(addr), kind, None)?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        addr = socket.local_addr()?.as_socket().ok_or_else(|| std::io::Error::other("not an IP socket"))?;
        sockets.push(socket);
    }
    Ok(sockets)
}

/// Runs `work` on a single-threaded tokio runtime on the calling thread: the worker model of the
/// ingress and DNS servers. An error, or a runtime that cannot be built, is logged as `what`'s and
/// ends the process.
pub fn run_worker(what: &str, work: impl std::future::Future<Output = std::io::Result<()>>) {
    let result = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|rt| rt.block_on(work));
    if let Err(err) = result {
        tracing::error!("{what}: {err}");
        std::process::exit(1);
    }
}

/// Serves `/healthz` and `/livez` on `listener` (a task on the current runtime).
pub fn spawn_health(listener: TcpListener, health: SharedHealth) -> anyhow::Result<()> {
    spawn_server(listener, move |req| health_response(req, &health)).map(drop)
}

/// Serves `/metrics` on `listener` (a task on the current runtime).
pub fn spawn_metrics(listener: TcpListener, handle: PrometheusHandle) -> anyhow::Result<()> {
    spawn_server(listener, move |req| metrics_response(req, &handle).unwrap_or_else(not_found)).map(drop)
}

/// kube-proxy's metrics server on `listener`: `/metrics`, the proxy mode as plain text at
/// `/proxyMode`, and `/healthz` answering `ok` while the process serves.
pub fn spawn_proxy_metrics(listener: TcpListener, handle: PrometheusHandle, mode: ProxyMode) -> anyhow::Result<()> {
    spawn_server(listener, move |req| {
        metrics_response(req, &handle).unwrap_or_else(|| match (req.method(), req.uri().path()) {
            (&Method::GET | &Method::HEAD, "/proxyMode") => plain(mode.to_string()),
            (&Method::GET | &Method::HEAD, "/healthz") => plain("ok".into()),
            _ => not_found(),
        })
    })
    .map(drop)
}

/// The answer to `GET /metrics`: Prometheus text; `None` for any other request.
fn metrics_response(req: &Request<Incoming>, handle: &PrometheusHandle) -> Option<Response<Body>> {
    matches!((req.method(), req.uri().path()), (&Method::GET | &Method::HEAD, "/metrics")).then(|| {
        handle.run_upkeep();
        respond(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", handle.render())
    })
}

/// A 200 with `body` as plain text, as Go's servers answer (`nosniff` included).
fn plain(body: String) -> Response<Body> {
    let mut response = respond(StatusCode::OK, "text/plain; charset=utf-8", body);
    response.headers_mut().insert("x-content-type-options", hyper::header::HeaderValue::from_static("nosniff"));
    response
}

/// kube-proxy's health answers: 200 when healthy (and, for `/healthz`, the node is not being
/// deleted) else 503, with its JSON body.
fn health_response(req: &Request<Incoming>, health: &SharedHealth) -> Response<Body> {
    let (counter_name, with_node) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => (HEALTHZ, true),
        (&Method::GET | &Method::HEAD, "/livez") => (LIVEZ, false),
        _ => return not_found(),
    };
    let (healthy, last_updated, node_eligible) = {
        let health = health.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (health.healthy(Instant::now()), health.last_updated(), health.node_eligible())
    };
    let status =
        if healthy && (node_eligible || !with_node) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    counter!(counter_name, "code" => status.as_u16().to_string()).increment(1);
    let mut body = serde_json::json!({
        "lastUpdated": last_updated.map_or_else(|| "0001-01-01T00:00:00Z".to_string(), rfc3339),
        "currentTime": rfc3339(SystemTime::now()),
    });
    if with_node {
        body["nodeEligible"] = node_eligible.into();
    }
    respond(status, "application/json", body.to_string())
}

/// `time` as RFC 3339 in UTC, to the second (Go's `time.RFC3339`).
fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

pub(crate) fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, content_type.parse().expect("valid content type"));
    response
}

/// The 404 answer of every server here.
pub(crate) fn not_found() -> Response<Body> {
    respond(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "404 page not found\n".into())
}

/// Accepts connections on `listener` and answers each request with `handler`, HTTP/1, within the
/// bounds of this module; aborting the returned handle stops accepting (and closes the listener).
pub(crate) fn spawn_server<H>(listener: TcpListener, handler: H) -> anyhow::Result<tokio::task::AbortHandle>
where
    H: Fn(&Request<Incoming>) -> Response<Body> + Clone + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let task = tokio::spawn(async move {
        loop {
            // A connection is accepted only when it can be served.
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!("accepting a connection: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handler = handler.clone();
            let connection = http.serve_connection(
                TokioIo::new(stream),
                hyper::service::service_fn(move |req| {
                    let response = handler(&req);
                    async move { Ok::<_, Infallible>(response) }
                }),
            );
            tokio::spawn(async move {
                match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                    Ok(Err(err)) => tracing::debug!("serving a connection: {err}"),
                    Err(_) => tracing::debug!("closing a connection open for {CONNECTION_TIMEOUT:?}"),
                    Ok(Ok(())) => {}
                }
                drop(slot);
            });
        }
    });
    Ok(task.abort_handle())
}
