//! `roadkeeper ingress`: wiring the cluster state ([`Feed`]) to the route table, the TLS
//! certificates, the HTTP(S) reverse proxy and the Ingresses' status.

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use metrics::{Unit, describe_counter, describe_histogram};
use metrics_exporter_prometheus::PrometheusHandle;
use roadkeeper_cluster::{Feed, Interest, Kind, NamespacedName, Store};
use roadkeeper_ingress::Router;
use roadkeeper_ingress::decision::{Decision, Request};
use roadkeeper_ingress::proxy::{self, Proxy};
use roadkeeper_ingress::routes::{ClassConfig, RouteTable};
use roadkeeper_ingress::tls::{self, Certificates};

use crate::cli::IngressArgs;
use crate::ingress_status::StatusPublisher;
use crate::serve;

/// The current route table, replaced as a whole on every change (requests never lock).
struct SharedRoutes(ArcSwap<RouteTable>);

impl Router for SharedRoutes {
    fn route(&self, request: &Request<'_>) -> Option<Decision> {
        self.0.load().route(request)
    }
}

/// `roadkeeper ingress`: loads the cluster state, serves HTTP and HTTPS, follows changes until
/// SIGTERM/SIGINT.
///
/// The cluster state, route updates and metrics run on the main thread's runtime; requests are
/// served by one worker thread per CPU this process may run on (its affinity mask), each with a
/// single-threaded runtime and its own `SO_REUSEPORT` listeners, among which the kernel spreads
/// connections: a request, its backend connection and their wake-ups stay on one thread, without
/// a work-stealing scheduler's cross-thread traffic.
pub fn run(args: IngressArgs) -> anyhow::Result<()> {
    let class = ClassConfig { name: args.class.clone(), ..ClassConfig::default() };
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
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
        load_certificates(&certificates, &table, feed.store(), args.default_ssl_certificate.as_ref());
        let mut status = StatusPublisher::start(&args, &spec, feed.store()).await?;
        if let Some(status) = &mut status {
            status.publish_all(feed.store(), &table);
        }
        let routes = Arc::new(SharedRoutes(ArcSwap::from_pointee(table.clone())));
        let proxy = Proxy::new(routes.clone(), args.proxy.proxy_config());
        let http = bind_workers("--http", &args.http, workers)?;
        let https = bind_workers("--https", &args.https, workers)?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let (drained, mut draining) = tokio::sync::mpsc::unbounded_channel();
        for (index, (http, https)) in http.into_iter().zip(https).enumerate() {
            let (proxy, tls, stopping, drained) = (proxy.clone(), certificates.clone(), stopping.clone(), drained.clone());
            std::thread::Builder::new().name(format!("ingress-{index}")).spawn(move || {
                serve_worker(proxy, http, https, tls, stopping);
                let _ = drained.send(());
            })?;
        }
        drop(drained);
        tracing::info!(http = ?args.http, https = ?args.https, workers, class = %class.name, source = feed.describe(), "serving");
        loop {
            tokio::select! {
                changes = feed.changed() => {
                    table.apply(feed.store(), &changes, &class).iter().for_each(|w| tracing::warn!("{w}"));
                    if !changes.secrets.is_empty() || !changes.ingresses.is_empty() {
                        load_certificates(&certificates, &table, feed.store(), args.default_ssl_certificate.as_ref());
                    }
                    routes.0.store(Arc::new(table.clone()));
                    if let Some(status) = &mut status {
                        status.publish(feed.store(), &table, &changes);
                    }
                }
                _ = sigterm.recv() => break,
                _ = sigint.recv() => break,
            }
        }
        // Stop accepting; let requests in flight finish, within the shutdown timeout.
        stop.send_replace(true);
        let drain = async { while draining.recv().await.is_some() {} };
        if tokio::time::timeout(*args.proxy.shutdown_timeout, drain).await.is_err() {
            tracing::warn!("requests still in flight after --shutdown-timeout {}: closing them", args.proxy.shutdown_timeout);
        }
        Ok(())
    })
}

/// `count` listeners on `address` (`IP:PORT`) with `SO_REUSEPORT`, one per worker, or one `None`
/// per worker when the address is empty (server disabled). Port 0 is chosen once, for all.
fn bind_workers(flag: &str, address: &str, count: usize) -> anyhow::Result<Vec<Option<std::net::TcpListener>>> {
    let Some(addr) = serve::listen_address(flag, address)? else {
        return Ok((0..count).map(|_| None).collect());
    };
    let sockets = serve::reuseport_sockets(addr, socket2::Type::STREAM, count)
        .with_context(|| format!("{flag}: cannot listen on {addr}"))?;
    sockets
        .into_iter()
        .map(|socket| {
            socket.listen(4096)?;
            Ok(Some(std::net::TcpListener::from(socket)))
        })
        .collect()
}

/// One worker thread: serves its listeners on a single-threaded runtime until `stopping` turns
/// true, then drains its connections.
fn serve_worker(
    proxy: Arc<Proxy>,
    http: Option<std::net::TcpListener>,
    https: Option<std::net::TcpListener>,
    tls: Arc<Certificates>,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    let stop = move || {
        let mut stopping = stopping.clone();
        async move {
            // An error means the sender is gone: the process is ending anyway.
            let _ = stopping.wait_for(|stop| *stop).await;
        }
    };
    let serve = async move {
        let http = http.map(tokio::net::TcpListener::from_std).transpose()?;
        let https = https.map(tokio::net::TcpListener::from_std).transpose()?;
        let http = async {
            if let Some(listener) = http {
                proxy::serve_http(proxy.clone(), listener, stop()).await;
            }
        };
        let https = async {
            if let Some(listener) = https {
                proxy::serve_https(proxy.clone(), listener, tls, stop()).await;
            }
        };
        tokio::join!(http, https);
        std::io::Result::Ok(())
    };
    serve::run_worker("ingress worker", serve);
}

/// Loads the certificates of the table's TLS hosts, and the default one of `default`, from
/// their `kubernetes.io/tls` Secrets; a missing or malformed Secret is logged, naming it.
fn load_certificates(certificates: &Certificates, table: &RouteTable, store: &Store, default: Option<&NamespacedName>) {
    let mut entries = Vec::new();
    let default = default.map(|secret| (tls::DEFAULT_HOST.to_owned(), secret.clone()));
    for (host, secret) in default.into_iter().chain(table.tls_hosts()) {
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
pub(crate) fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = serve::install_recorder(&serve::doubling_buckets(0.000_1, 16))?;
    describe_counter!(proxy::REQUESTS_TOTAL, "Requests by Ingress, Service and status code");
    describe_histogram!(proxy::REQUEST_DURATION_SECONDS, Unit::Seconds, "Time to the response head, by Ingress");
    describe_counter!(proxy::UPSTREAM_ERRORS_TOTAL, "Backend errors by Service and kind (connect, timeout, reset)");
    describe_counter!(
        proxy::MIRRORS_DROPPED_TOTAL,
        "Request mirrors dropped for too many in flight, by route and Service"
    );
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use roadkeeper_ingress::proxy::ProxyConfig;

    use crate::cli::IngressArgs;

    #[test]
    fn flag_defaults_are_the_proxy_defaults() {
        let config = IngressArgs::parse_for_test(&[]).unwrap().proxy.proxy_config();
        assert_eq!(format!("{config:?}"), format!("{:?}", ProxyConfig::default()));
    }

    #[test]
    fn flags_set_the_proxy_limits_and_timeouts() {
        let flags = ["--upstream-response-timeout", "300ms", "--idle-timeout", "2m", "--max-request-body", "0"];
        let config = IngressArgs::parse_for_test(&flags).unwrap().proxy.proxy_config();
        assert_eq!(config.response_timeout, Duration::from_millis(300));
        assert_eq!(config.idle_timeout, Duration::from_secs(120));
        assert_eq!(config.max_request_body, None, "0 is unlimited");
        let error = IngressArgs::parse_for_test(&["--upstream-connect-timeout", "soon"]).unwrap_err();
        assert!(error.contains("--upstream-connect-timeout"), "{error}");
    }

    #[test]
    fn flags_set_the_request_limits_and_trusted_proxies() {
        let flags = [
            ["--max-request-head", "65536"],
            ["--http2-max-concurrent-streams", "8"],
            ["--upstream-max-connections", "4"],
            ["--trusted-proxy-cidrs", "10.0.0.0/8,fd00::/8"],
        ];
        let config = IngressArgs::parse_for_test(&flags.concat()).unwrap().proxy.proxy_config();
        assert_eq!(
            (config.max_request_head, config.max_concurrent_streams, config.max_upstream_connections),
            (65536, 8, 4)
        );
        assert_eq!(config.trusted_proxies, ["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()]);
        for (flag, bad) in [
            ("--max-request-head", "8191"),
            ("--http2-max-concurrent-streams", "0"),
            ("--upstream-max-connections", "0"),
            ("--trusted-proxy-cidrs", "10.0.0.1"),
        ] {
            let error = IngressArgs::parse_for_test(&[flag, bad]).unwrap_err();
            assert!(error.contains(flag), "{error}");
        }
    }

    #[test]
    fn default_ssl_certificate_is_a_namespaced_name() {
        let args = IngressArgs::parse_for_test(&["--default-ssl-certificate", "ingress/wildcard-tls"]).unwrap();
        assert_eq!(args.default_ssl_certificate.unwrap().to_string(), "ingress/wildcard-tls");
        for bad in ["wildcard-tls", "/x", "x/", "a/b/c"] {
            let error = IngressArgs::parse_for_test(&["--default-ssl-certificate", bad]).unwrap_err();
            assert!(error.contains("--default-ssl-certificate") && error.contains("NAMESPACE/NAME"), "{error}");
        }
    }
}
