//! `roadkeeper gateway`: wiring the cluster state ([`Feed`]) to the Gateway API compiler, the
//! reverse proxy (the one of `roadkeeper ingress`), the listening ports and the statuses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use roadkeeper_cluster::{Feed, Interest, Kind};
use roadkeeper_ingress::Router;
use roadkeeper_ingress::decision::{Decision, Listener, Listeners, Request};
use roadkeeper_ingress::gateway::{GatewayConfig, GatewayTable, ServeTable, Touched};
use roadkeeper_ingress::proxy::{self, Proxy};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::cli::GatewayArgs;
use crate::gateway_status::StatusPublisher;
use crate::{ingress_cmd, serve};

/// The current serving table, replaced as a whole on every change (requests never lock).
struct Shared(ArcSwap<ServeTable>);

impl Router for Shared {
    fn route(&self, request: &Request<'_>) -> Option<Decision> {
        self.0.load().route(request)
    }
}

impl Listeners for Shared {
    fn listener(&self, local: SocketAddr) -> Option<Listener> {
        self.0.load().listener(local)
    }
}

/// What a worker thread is asked to serve: one port's listener, until its stop turns true.
struct Serve {
    listener: std::net::TcpListener,
    stop: watch::Receiver<bool>,
}

/// `roadkeeper gateway`: loads the cluster state, serves the ports of the Gateways' listeners,
/// follows changes until SIGTERM/SIGINT. Workers as `roadkeeper ingress`'s: one thread per CPU,
/// each with a single-threaded runtime and its own `SO_REUSEPORT` socket per port.
pub fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let config = GatewayConfig { controller: args.controller_name.clone(), pool: args.address_pool };
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut sigterm, mut sigint) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        // Installed before serving (the proxy binds its metric handles on first use); served once
        // the listeners are up, so that a probe of it tells when the Gateways are served.
        let metrics = serve::bind("--metrics-bind-address", &args.metrics_bind_address)?
            .map(|listener| Ok::<_, anyhow::Error>((listener, ingress_cmd::install_metrics()?)))
            .transpose()?;
        let spec = args.source.spec(None);
        let kinds = [
            Kind::GatewayClass,
            Kind::Gateway,
            Kind::HttpRoute,
            Kind::ReferenceGrant,
            Kind::Service,
            Kind::EndpointSlice,
            Kind::Secret,
            Kind::Namespace,
        ];
        let interest = Interest { kinds: kinds.into_iter().collect(), node: None };
        let mut feed = tokio::select! {
            feed = Feed::open(&spec, &interest, true) => feed.context("reading the cluster state")?,
            _ = sigterm.recv() => return Ok(()),
            _ = sigint.recv() => return Ok(()),
        };
        let mut table = GatewayTable::build(feed.store(), &config);
        let status = StatusPublisher::start(&config.controller, &spec).await?;
        status.publish(feed.store(), table.statuses(), &Touched::all(feed.store(), table.statuses()));
        let shared = Arc::new(Shared(ArcSwap::from_pointee(table.serve().clone())));
        let proxy = Proxy::new(shared.clone(), args.proxy.proxy_config());
        let (stop, stopping) = watch::channel(false);
        let mut ports = Ports::start(workers, proxy, shared.clone(), stopping, bind_address(&config))?;
        ports.update(&shared.0.load());
        if let Some((listener, handle)) = metrics {
            serve::spawn_metrics(listener, handle)?;
        }
        tracing::info!(pool = %config.pool, controller = %config.controller, workers, source = feed.describe(), "serving");
        loop {
            tokio::select! {
                changes = feed.changed() => {
                    let touched = table.apply(feed.store(), &changes);
                    shared.0.store(Arc::new(table.serve().clone()));
                    ports.update(&shared.0.load());
                    status.publish(feed.store(), table.statuses(), &touched);
                }
                _ = sigterm.recv() => break,
                _ = sigint.recv() => break,
            }
        }
        // Stop accepting; let requests in flight finish, within the shutdown timeout.
        stop.send_replace(true);
        if tokio::time::timeout(*args.proxy.shutdown_timeout, ports.drained()).await.is_err() {
            tracing::warn!("requests still in flight after --shutdown-timeout {}: closing them", args.proxy.shutdown_timeout);
        }
        Ok(())
    })
}

/// The wildcard address of the pool's family: one socket per port serves every Gateway address.
fn bind_address(config: &GatewayConfig) -> IpAddr {
    match config.pool {
        ipnet::IpNet::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        ipnet::IpNet::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// The listening ports: one `SO_REUSEPORT` socket per worker for every port a Gateway listener
/// uses, opened when a port appears and closed (gracefully) when none uses it any more.
struct Ports {
    address: IpAddr,
    /// One queue per worker thread.
    workers: Vec<mpsc::UnboundedSender<Serve>>,
    /// Each open port's stop.
    open: BTreeMap<u16, watch::Sender<bool>>,
    /// Ends when every worker thread has drained.
    drained: mpsc::UnboundedReceiver<()>,
}

impl Ports {
    /// Starts `count` worker threads serving `proxy`, which stop when `stopping` turns true.
    fn start(
        count: usize,
        proxy: Arc<Proxy>,
        listeners: Arc<Shared>,
        stopping: watch::Receiver<bool>,
        address: IpAddr,
    ) -> anyhow::Result<Self> {
        let (done, drained) = mpsc::unbounded_channel();
        let mut workers = Vec::with_capacity(count);
        for index in 0..count {
            let (queue, serves) = mpsc::unbounded_channel();
            workers.push(queue);
            let (proxy, listeners, stopping, done) = (proxy.clone(), listeners.clone(), stopping.clone(), done.clone());
            std::thread::Builder::new().name(format!("gateway-{index}")).spawn(move || {
                serve::run_worker("gateway worker", worker(proxy, listeners, serves, stopping));
                let _ = done.send(());
            })?;
        }
        Ok(Self { address, workers, open: BTreeMap::new(), drained })
    }

    /// Opens the ports `table` uses that are not open, and closes those it no longer uses. A port
    /// that cannot be opened is logged and tried again on the next update.
    fn update(&mut self, table: &ServeTable) {
        let wanted: BTreeSet<u16> = table.ports().collect();
        self.open.retain(|port, stop| {
            let keep = wanted.contains(port);
            if !keep {
                tracing::info!(port, "closing: no Gateway listener uses it");
                stop.send_replace(true);
            }
            keep
        });
        let new: Vec<u16> = wanted.into_iter().filter(|port| !self.open.contains_key(port)).collect();
        for port in new {
            let addr = SocketAddr::new(self.address, port);
            let sockets =
                serve::reuseport_sockets(addr, socket2::Type::STREAM, self.workers.len()).and_then(|sockets| {
                    sockets.into_iter().map(|s| s.listen(4096).map(|()| s)).collect::<Result<Vec<_>, _>>()
                });
            match sockets {
                Ok(sockets) => {
                    let (stop, stopped) = watch::channel(false);
                    for (queue, socket) in self.workers.iter().zip(sockets) {
                        let _ = queue.send(Serve { listener: socket.into(), stop: stopped.clone() });
                    }
                    tracing::info!(port, "listening");
                    self.open.insert(port, stop);
                }
                Err(err) => tracing::error!(port, "cannot listen on {addr}: {err}"),
            }
        }
    }

    /// Waits until every worker has drained its connections (after the global stop).
    async fn drained(&mut self) {
        self.workers.clear();
        while self.drained.recv().await.is_some() {}
    }
}

/// One worker thread: serves the ports it is given, each until its stop or the global one, then
/// drains their connections.
async fn worker(
    proxy: Arc<Proxy>,
    listeners: Arc<Shared>,
    mut serves: mpsc::UnboundedReceiver<Serve>,
    mut stopping: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut tasks = JoinSet::new();
    let global = stopping.clone();
    loop {
        tokio::select! {
            serve = serves.recv() => {
                let Some(Serve { listener, mut stop }) = serve else { break };
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let mut global = global.clone();
                let until = async move {
                    tokio::select! {
                        _ = stop.wait_for(|stop| *stop) => {}
                        _ = global.wait_for(|stop| *stop) => {}
                    }
                };
                let listeners: Arc<dyn Listeners> = listeners.clone();
                tasks.spawn(proxy::serve_listeners(proxy.clone(), listener, listeners, until));
            }
            _ = stopping.wait_for(|stop| *stop) => break,
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}
