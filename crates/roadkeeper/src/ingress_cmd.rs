//! `roadkeeper ingress`: wiring the cluster state ([`Feed`]) to the route table, the TLS
//! certificates and the HTTP(S) reverse proxy.

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use metrics::{Unit, describe_counter, describe_histogram};
use metrics_exporter_prometheus::PrometheusHandle;
use roadkeeper_cluster::{Feed, Interest, Kind, Store};
use roadkeeper_ingress::proxy::{self, ProxyConfig};
use roadkeeper_ingress::routes::{ClassConfig, RouteTable};
use roadkeeper_ingress::tls::Certificates;
use roadkeeper_ingress::{Router, Target};

use crate::cli::IngressArgs;
use crate::serve;

/// The current route table, replaced as a whole on every change (requests never lock).
struct SharedRoutes(ArcSwap<RouteTable>);

impl Router for SharedRoutes {
    fn route(&self, host: &str, path: &str) -> Option<Arc<Target>> {
        self.0.load().route(host, path)
    }
}

/// `roadkeeper ingress`: loads the cluster state, serves HTTP and HTTPS, follows changes until
/// SIGTERM/SIGINT.
pub fn run(args: IngressArgs) -> anyhow::Result<()> {
    let class = ClassConfig { name: args.class.clone(), ..ClassConfig::default() };
    // One worker per CPU this process may run on (its affinity mask): two workers sharing one
    // pinned CPU lose a third of the throughput at 256 connections to switching (measured).
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut sigterm, mut sigint) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        // Installed before serving: the proxy binds its metric handles on first use.
        if let Some(listener) = serve::bind("--metrics-bind-address", &args.metrics_bind_address)? {
            serve::spawn_metrics(listener, install_metrics()?)?;
        }
        let spec = args.source.spec(None);
        let kinds = [Kind::Ingress, Kind::IngressClass, Kind::Service, Kind::EndpointSlice, Kind::Secret];
        let interest = Interest { kinds: kinds.into_iter().collect(), node: None };
        let mut feed = tokio::select! {
            feed = Feed::open(&spec, &interest, true) => feed.context("reading the cluster state")?,
            _ = sigterm.recv() => return Ok(()),
            _ = sigint.recv() => return Ok(()),
        };
        let (mut table, warnings) = RouteTable::build(feed.store(), &class);
        warnings.iter().for_each(|w| tracing::warn!("{w}"));
        let certificates = Arc::new(Certificates::default());
        load_certificates(&certificates, &table, feed.store());
        let routes = Arc::new(SharedRoutes(ArcSwap::from_pointee(table.clone())));
        let config = ProxyConfig::default();
        let mut servers = Vec::new();
        if let Some(listener) = serve::bind("--http", &args.http)? {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            servers.push(tokio::spawn(proxy::serve_http(listener, routes.clone(), config.clone())));
        }
        if let Some(listener) = serve::bind("--https", &args.https)? {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let tls = certificates.clone();
            servers.push(tokio::spawn(proxy::serve_https(listener, routes.clone(), tls, config.clone())));
        }
        tracing::info!(http = ?args.http, https = ?args.https, class = %class.name, source = feed.describe(), "serving");
        loop {
            tokio::select! {
                changes = feed.changed() => {
                    table.apply(feed.store(), &changes, &class).iter().for_each(|w| tracing::warn!("{w}"));
                    if !changes.secrets.is_empty() || !changes.ingresses.is_empty() {
                        load_certificates(&certificates, &table, feed.store());
                    }
                    routes.0.store(Arc::new(table.clone()));
                }
                _ = sigterm.recv() => break,
                _ = sigint.recv() => break,
            }
        }
        servers.iter().for_each(tokio::task::JoinHandle::abort);
        Ok(())
    })
}

/// Loads the certificates of the table's TLS hosts from their `kubernetes.io/tls` Secrets; a
/// missing or malformed Secret is logged, naming it.
fn load_certificates(certificates: &Certificates, table: &RouteTable, store: &Store) {
    let mut entries = Vec::new();
    for (host, secret) in table.tls_hosts() {
        let data = store.secret(&secret).and_then(|s| s.data.as_ref());
        let pem = |key: &str| data.and_then(|d| d.get(key)).map(|b| b.0.clone());
        match (pem("tls.crt"), pem("tls.key")) {
            (Some(cert), Some(key)) => entries.push((host, cert, key)),
            _ => tracing::warn!("Secret {secret}: no tls.crt and tls.key for host {host}"),
        }
    }
    for error in certificates.update(entries) {
        tracing::warn!("{error}");
    }
}

/// Installs the Prometheus recorder (latency buckets 100 µs doubling to about 3 s) and describes
/// the proxy's metrics.
fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = serve::install_recorder(&serve::doubling_buckets(0.000_1, 16))?;
    describe_counter!(proxy::REQUESTS_TOTAL, "Requests by Ingress, Service and status code");
    describe_histogram!(proxy::REQUEST_DURATION_SECONDS, Unit::Seconds, "Time to the response head, by Ingress");
    describe_counter!(proxy::UPSTREAM_ERRORS_TOTAL, "Backend errors by Service and kind (connect, timeout, reset)");
    Ok(handle)
}
