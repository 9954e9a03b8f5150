//! kube-proxy's health and metrics endpoints for `roadkeeper proxy` in watch mode: `/healthz` and
//! `/livez` (JSON, 200 or 503) on `--healthz-bind-address`, Prometheus text at `/metrics` on
//! `--metrics-bind-address`. Both are served by hyper on the sync loop's tokio runtime; the sync
//! loop feeds them through [`SharedHealth`] and [`record_sync`].

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use roadkeeper_proxy::health::ProxyHealth;
use roadkeeper_proxy::proxier::SyncReport;

/// The proxier's health, shared by the sync loop (writer) and the health server (reader).
pub type SharedHealth = Arc<Mutex<ProxyHealth>>;

/// A response body.
type Body = Full<Bytes>;

const SYNC_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
const SYNC_FULL_DURATION: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
const SYNC_PARTIAL_DURATION: &str = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
const SYNC_LAST_TIMESTAMP: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const SERVICE_CHANGES: &str = "kubeproxy_sync_proxy_rules_service_changes_total";
const ENDPOINT_CHANGES: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
const CONNTRACK_DELETED: &str = "kubeproxy_conntrack_reconciler_deleted_entries_total";
const HEALTHZ: &str = "kubeproxy_proxy_healthz_total";
const LIVEZ: &str = "kubeproxy_proxy_livez_total";
const KERNEL_DURATION: &str = "roadkeeper_sync_kernel_seconds";

/// Binds `address` (`IP:PORT`) for the server of `flag`; `None` when the address is empty
/// (server disabled). Called before the first sync so that a bad address fails at start.
pub fn bind(flag: &str, address: &str) -> anyhow::Result<Option<TcpListener>> {
    if address.is_empty() {
        return Ok(None);
    }
    let addr: SocketAddr = address.parse().with_context(|| format!("{flag}: {address:?} is not an IP:PORT address"))?;
    let listener = TcpListener::bind(addr).with_context(|| format!("{flag}: cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    Ok(Some(listener))
}

/// Installs the global Prometheus recorder (histogram buckets as kube-proxy's: 1 ms doubling
/// to about 16 s) and describes every metric, so that they are listed from the start.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let buckets: Vec<f64> = (0..15).map(|i| 0.001 * f64::from(1u32 << i)).collect();
    let handle = PrometheusBuilder::new()
        .set_buckets(&buckets)?
        .install_recorder()
        .context("installing the metrics recorder")?;
    describe_histogram!(SYNC_DURATION, Unit::Seconds, "SyncProxyRules latency in seconds");
    describe_histogram!(SYNC_FULL_DURATION, Unit::Seconds, "SyncProxyRules latency in seconds for full resyncs");
    describe_histogram!(SYNC_PARTIAL_DURATION, Unit::Seconds, "SyncProxyRules latency in seconds for partial resyncs");
    describe_gauge!(SYNC_LAST_TIMESTAMP, Unit::Seconds, "The last time proxy rules were successfully synced");
    describe_counter!(
        SERVICE_CHANGES,
        "Cumulative proxy rules Service changes; roadkeeper counts the Services whose rules changed, per sync"
    );
    describe_counter!(
        ENDPOINT_CHANGES,
        "Cumulative proxy rules EndpointSlice changes; roadkeeper counts the Services whose rules changed, per sync \
         (it does not tell Service from EndpointSlice changes)"
    );
    describe_counter!(CONNTRACK_DELETED, "Cumulative conntrack flows deleted by conntrack reconciliation");
    describe_counter!(HEALTHZ, "Cumulative proxy healthz HTTP status");
    describe_counter!(LIVEZ, "Cumulative proxy livez HTTP status");
    describe_histogram!(KERNEL_DURATION, Unit::Seconds, "Part of each sync spent in the kernel and its tools");
    for name in [SERVICE_CHANGES, ENDPOINT_CHANGES, CONNTRACK_DELETED] {
        counter!(name).absolute(0);
    }
    Ok(handle)
}

/// Records one successful sync into the metrics (no-ops without an installed recorder).
pub fn record_sync(report: &SyncReport) {
    let seconds = report.duration.as_secs_f64();
    histogram!(SYNC_DURATION).record(seconds);
    histogram!(if report.full { SYNC_FULL_DURATION } else { SYNC_PARTIAL_DURATION }).record(seconds);
    histogram!(KERNEL_DURATION).record(report.kernel.as_secs_f64());
    gauge!(SYNC_LAST_TIMESTAMP).set(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64());
    counter!(SERVICE_CHANGES).increment(report.services_changed as u64);
    counter!(ENDPOINT_CHANGES).increment(report.services_changed as u64);
    counter!(CONNTRACK_DELETED).increment(report.conntrack_deleted);
}

/// Serves `/healthz` and `/livez` on `listener` (a task on the current runtime).
pub fn spawn_health(listener: TcpListener, health: SharedHealth) -> anyhow::Result<()> {
    spawn_server(listener, move |req| health_response(req, &health)).map(drop)
}

/// Serves `/metrics` on `listener` (a task on the current runtime).
pub fn spawn_metrics(listener: TcpListener, handle: PrometheusHandle) -> anyhow::Result<()> {
    spawn_server(listener, move |req| match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            handle.run_upkeep();
            respond(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", handle.render())
        }
        _ => not_found(),
    })
    .map(drop)
}

/// kube-proxy's health answers: 200 when healthy else 503, with its JSON body; `/livez` leaves
/// out node eligibility (always true here: without an API source no node is ever being deleted).
fn health_response(req: &Request<Incoming>, health: &SharedHealth) -> Response<Body> {
    let (counter_name, with_node) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => (HEALTHZ, true),
        (&Method::GET | &Method::HEAD, "/livez") => (LIVEZ, false),
        _ => return not_found(),
    };
    let (healthy, last_updated) = {
        let health = health.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (health.healthy(Instant::now()), health.last_updated())
    };
    let node_eligible = true;
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

fn not_found() -> Response<Body> {
    respond(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "404 page not found\n".into())
}

/// Accepts connections on `listener` and answers each request with `handler`, HTTP/1; aborting
/// the returned handle stops accepting (and closes the listener).
pub(crate) fn spawn_server<H>(listener: TcpListener, handler: H) -> anyhow::Result<tokio::task::AbortHandle>
where
    H: Fn(&Request<Incoming>) -> Response<Body> + Clone + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let task = tokio::spawn(async move {
        loop {
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
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = handler(&req);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(err) =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await
                {
                    tracing::debug!("serving a connection: {err}");
                }
            });
        }
    });
    Ok(task.abort_handle())
}
