//! `roadkeeper dns`: wiring the cluster state ([`Feed`]) to the DNS zone snapshot and the
//! server, with health and metrics endpoints.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use hickory_proto::rr::Name;
use hyper::{Method, StatusCode};
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use roadkeeper_cluster::{Feed, Interest, Kind};
use roadkeeper_dns::answer::Zones;
use roadkeeper_dns::forward::{self, Forwarder};
use roadkeeper_dns::server::{self, Handler};
use roadkeeper_dns::tcp::{self, TcpLimits};
use roadkeeper_dns::zone::{PodMode, ZoneData, ZoneOptions};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cli::DnsArgs;
use crate::serve;

/// Where upstream resolvers are read from when `--upstream` is not given.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// `roadkeeper dns`: loads the cluster state, serves DNS, follows changes until SIGTERM/SIGINT
/// (and for `--lameduck` after it).
///
/// The cluster state, zone updates, health and metrics run on the main thread's runtime; DNS is
/// served by one worker thread per CPU this process may run on, each with a single-threaded
/// runtime, its own `SO_REUSEPORT` UDP socket and TCP listener on every `--listen` address (the
/// kernel spreads clients among them), its share of the TCP connections and its own upstream
/// sockets, as the ingress's workers. The zone snapshot, the cache and the bound on questions in
/// flight are shared.
pub fn run(args: DnsArgs) -> anyhow::Result<()> {
    let zones = zones(&args)?;
    let options = ZoneOptions { endpoint_pod_names: args.endpoint_pod_names, pods: zones.pods };
    let upstreams = upstreams(&args.upstream)?;
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let tcp_limits = tcp_limits(&args, workers, upstreams.len());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let threads = runtime.block_on(async move {
        let (mut sigterm, mut sigint) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        let ready = Arc::new(AtomicBool::new(false));
        if let Some(listener) = serve::bind("--health-bind-address", &args.health_bind_address)? {
            let ready = ready.clone();
            serve::spawn_server(listener, move |req| health_response(req.method(), req.uri().path(), &ready))?;
        }
        if let Some(listener) = serve::bind("--metrics-bind-address", &args.metrics_bind_address)? {
            serve::spawn_metrics(listener, install_metrics()?)?;
        }

        let spec = args.source.spec(None);
        let mut kinds = vec![Kind::Service, Kind::EndpointSlice, Kind::Namespace];
        if options.pods == PodMode::Verified {
            kinds.push(Kind::Pod);
        }
        let interest = Interest { kinds: kinds.into_iter().collect(), node: None };
        let mut feed = tokio::select! {
            feed = Feed::open(&spec, &interest, true) => feed.context("reading the cluster state")?,
            () = signalled(&mut sigterm, &mut sigint) => return Ok(Vec::new()),
        };
        let mut data = ZoneData::build(feed.store(), &options);
        let shared = Arc::new(ArcSwap::from_pointee(data.clone()));
        let forwarder = Forwarder::new(upstreams.clone(), args.forward_config());
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let mut threads = Vec::with_capacity(workers);
        for (index, sockets) in bind_workers(&args.listen, workers)?.into_iter().enumerate() {
            let handler = Handler::new(zones.clone(), shared.clone(), forwarder.worker());
            let stopping = stopping.clone();
            let thread = std::thread::Builder::new().name(format!("dns-{index}"));
            threads.push(thread.spawn(move || serve_worker(sockets, handler, tcp_limits, stopping))?);
        }
        ready.store(true, Ordering::Relaxed);
        tracing::info!(listen = ?args.listen, workers, ?upstreams, source = feed.describe(), "serving DNS");
        // Set by the first signal when there is a lameduck period: the time to stop.
        let mut lameduck_ends: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                changes = feed.changed() => {
                    data.apply(feed.store(), &changes, &options);
                    shared.store(Arc::new(data.clone()));
                    tracing::debug!(services = changes.services.len(), "zone updated");
                }
                () = signalled(&mut sigterm, &mut sigint) => {
                    if lameduck_ends.is_some() || args.lameduck.is_zero() {
                        break;
                    }
                    tracing::info!(lameduck = %args.lameduck, "signalled: answering on for the lameduck period, then exiting");
                    lameduck_ends = Some(tokio::time::Instant::now() + *args.lameduck);
                }
                () = tokio::time::sleep_until(lameduck_ends.unwrap_or_else(tokio::time::Instant::now)),
                    if lameduck_ends.is_some() => break,
            }
        }
        stop.send_replace(true);
        anyhow::Ok(threads)
    })?;
    for thread in threads {
        // A worker that failed has ended the process already.
        let _ = thread.join();
    }
    Ok(())
}

/// The next SIGTERM or SIGINT.
async fn signalled(sigterm: &mut Signal, sigint: &mut Signal) {
    tokio::select! {
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {}
    }
}

/// One worker's sockets: a UDP socket and a TCP listener per `--listen` address.
type WorkerSockets = (Vec<std::net::UdpSocket>, Vec<std::net::TcpListener>);

/// The sockets of `count` workers on every `--listen` address (`SO_REUSEPORT`); a port 0 is
/// chosen once, for UDP and TCP alike.
fn bind_workers(listen: &[SocketAddr], count: usize) -> anyhow::Result<Vec<WorkerSockets>> {
    let mut workers: Vec<WorkerSockets> = (0..count).map(|_| Default::default()).collect();
    for &addr in listen {
        let udp = serve::reuseport_sockets(addr, socket2::Type::DGRAM, count)
            .with_context(|| format!("--listen: cannot bind UDP {addr}"))?;
        let bound = udp[0].local_addr()?.as_socket().unwrap_or(addr);
        let tcp = serve::reuseport_sockets(bound, socket2::Type::STREAM, count)
            .with_context(|| format!("--listen: cannot bind TCP {bound}"))?;
        for ((worker, udp), tcp) in workers.iter_mut().zip(udp).zip(tcp) {
            tcp.listen(1024)?;
            worker.0.push(udp.into());
            worker.1.push(tcp.into());
        }
    }
    Ok(workers)
}

/// One worker thread: serves DNS on its sockets until `stopping` turns true, then stops
/// (answers being sent are finished).
fn serve_worker(
    (udp, tcp): WorkerSockets,
    handler: Handler,
    limits: TcpLimits,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    serve::run_worker("dns worker", async move {
        let serving = server::serve_on(udp, tcp, handler, limits)?;
        // An error means the sender is gone: the process is ending anyway.
        let _ = stopping.wait_for(|stop| *stop).await;
        serving.shutdown().await
    });
}

/// The bound on each worker's TCP connections: `--max-tcp-connections`, within the descriptors
/// RLIMIT_NOFILE (raised first, [`raise_nofile_limit`]) leaves after those the process keeps for
/// its listeners, upstream sockets and health and metrics servers ([`tcp::Reserve`]).
fn tcp_limits(args: &DnsArgs, workers: usize, upstreams: usize) -> TcpLimits {
    let nofile = raise_nofile_limit();
    let http_servers = [&args.health_bind_address, &args.metrics_bind_address].iter().filter(|a| !a.is_empty()).count();
    let reserve = tcp::Reserve {
        workers,
        listen: args.listen.len(),
        upstreams,
        http_connections: http_servers * serve::MAX_CONNECTIONS,
    };
    let per_worker = reserve.max_connections_per_worker(args.max_tcp_connections as usize, nofile);
    tracing::info!(per_worker, workers, nofile, reserved = reserve.descriptors(), "TCP connections bounded");
    TcpLimits::new(per_worker)
}

/// The soft RLIMIT_NOFILE, raised to the hard limit first, as Go programs (CoreDNS among them)
/// start; unbounded when it cannot be read.
fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(err) => {
                tracing::warn!("raising the open files limit from {soft} to {hard}: {err}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(err) => {
            tracing::warn!(
                "reading the open files limit: {err}; TCP connections bounded by --max-tcp-connections only"
            );
            u64::MAX
        }
    }
}

/// The zones of `--zone`, `--fallthrough` and the record options.
fn zones(args: &DnsArgs) -> anyhow::Result<Zones> {
    let mut cluster = Vec::new();
    let mut reverse = Vec::new();
    for zone in &args.zone {
        let name = zone_name("--zone", zone)?;
        if name.iter().next_back().is_some_and(|l| l.eq_ignore_ascii_case(b"arpa")) {
            reverse.push(name);
        } else {
            cluster.push(name);
        }
    }
    if cluster.is_empty() {
        bail!("--zone: at least one zone must be a cluster domain (e.g. cluster.local)");
    }
    let fallthrough = if args.no_fallthrough {
        Vec::new()
    } else {
        args.fallthrough.iter().map(|z| zone_name("--fallthrough", z)).collect::<anyhow::Result<_>>()?
    };
    let pods = match args.pods.as_str() {
        "disabled" => PodMode::Disabled,
        "insecure" => PodMode::Insecure,
        "verified" => PodMode::Verified,
        other => bail!("--pods: {other:?} is not one of disabled, insecure, verified"),
    };
    Ok(Zones {
        cluster,
        reverse,
        fallthrough,
        ttl: args.ttl,
        pods,
        ignore_empty_service: args.ignore_empty_service,
        servers: own_addresses(&args.listen),
    })
}

/// This server's addresses, for `ns.dns.<zone>`: those of `--listen`, and for a wildcard one
/// (`0.0.0.0`; `::` also takes IPv6) the host's addresses of that family, but for loopback and
/// link-local ones unless there are no others (as CoreDNS, which answers with the addresses it is
/// bound to).
fn own_addresses(listen: &[SocketAddr]) -> Vec<IpAddr> {
    let mut own: Vec<IpAddr> = listen.iter().map(SocketAddr::ip).filter(|ip| !ip.is_unspecified()).collect();
    let any_v6 = listen.iter().any(|addr| addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    if any_v6 || listen.iter().any(|addr| addr.ip().is_unspecified()) {
        let host: Vec<IpAddr> = match nix::ifaddrs::getifaddrs() {
            Ok(interfaces) => interfaces
                .filter_map(|interface| interface.address)
                .filter_map(|a| {
                    a.as_sockaddr_in()
                        .map(|s| IpAddr::V4(s.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|s| s.ip().into()))
                })
                .filter(|ip| ip.is_ipv4() || any_v6)
                .collect(),
            Err(err) => {
                tracing::warn!("listing this host's addresses: {err}; ns.dns answers with none");
                Vec::new()
            }
        };
        let local = |ip: &IpAddr| ip.is_loopback() || matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
        let (local, routable): (Vec<IpAddr>, Vec<IpAddr>) = host.into_iter().partition(local);
        own.extend(if routable.is_empty() { local } else { routable });
    }
    own.sort();
    own.dedup();
    own
}

/// `zone` as a lowercase, fully qualified name.
fn zone_name(flag: &str, zone: &str) -> anyhow::Result<Name> {
    let fqdn = format!("{}.", zone.trim_end_matches('.'));
    Ok(Name::from_ascii(&fqdn).with_context(|| format!("{flag}: {zone:?} is not a domain name"))?.to_lowercase())
}

/// `--upstream` (IP or IP:PORT, port 53 by default), else the nameservers of resolv.conf.
fn upstreams(given: &[String]) -> anyhow::Result<Vec<SocketAddr>> {
    if given.is_empty() {
        let found = forward::upstreams_from_resolv_conf(RESOLV_CONF.as_ref())?;
        if found.is_empty() {
            tracing::warn!("no nameserver in {RESOLV_CONF}: names outside the cluster zones will be SERVFAIL");
        }
        return Ok(found);
    }
    given
        .iter()
        .map(|upstream| {
            upstream
                .parse::<SocketAddr>()
                .or_else(|_| upstream.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| anyhow::anyhow!("--upstream: {upstream:?} is not an IP or IP:PORT"))
        })
        .collect()
}

/// `/health` (200 while the process serves) and `/ready` (200 once the cluster state is loaded
/// and DNS is served, else 503), as CoreDNS's health and ready plugins.
fn health_response(
    method: &Method,
    path: &str,
    ready: &AtomicBool,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let text = "text/plain; charset=utf-8";
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/health") => serve::respond(StatusCode::OK, text, "OK".into()),
        (&Method::GET | &Method::HEAD, "/ready") if ready.load(Ordering::Relaxed) => {
            serve::respond(StatusCode::OK, text, "OK".into())
        }
        (&Method::GET | &Method::HEAD, "/ready") => {
            serve::respond(StatusCode::SERVICE_UNAVAILABLE, text, "the cluster state is not loaded yet".into())
        }
        _ => serve::not_found(),
    }
}

/// Installs the Prometheus recorder (latency buckets 50 µs doubling to about 1.6 s) and
/// describes the DNS metrics.
fn install_metrics() -> anyhow::Result<metrics_exporter_prometheus::PrometheusHandle> {
    let handle = serve::install_recorder(&serve::doubling_buckets(0.000_05, 16))?;
    describe_counter!(server::REQUESTS_TOTAL, "DNS requests by transport (proto) and question type");
    describe_counter!(server::RESPONSES_TOTAL, "DNS responses by response code");
    describe_histogram!(server::REQUEST_DURATION_SECONDS, Unit::Seconds, "Time to answer, by source (zone, upstream)");
    describe_counter!(forward::CACHE_HITS_TOTAL, "Forwarded questions answered from the cache");
    describe_counter!(forward::CACHE_MISSES_TOTAL, "Forwarded questions not in the cache");
    describe_gauge!(forward::CACHE_SIZE_BYTES, Unit::Bytes, "Bytes the cache holds, as of its last insertion");
    describe_gauge!(forward::CACHE_ENTRIES, "Entries the cache holds, as of its last insertion");
    describe_counter!(forward::FORWARD_REQUESTS_TOTAL, "Questions sent upstream, by upstream and outcome");
    describe_counter!(
        forward::MAX_CONCURRENT_REJECTS_TOTAL,
        "Questions answered SERVFAIL at once because --max-concurrent were waiting on the upstreams"
    );
    describe_gauge!(tcp::TCP_CONNECTIONS, "Client TCP connections open");
    describe_counter!(
        tcp::TCP_CONNECTIONS_SHED_TOTAL,
        "TCP connections closed or not taken for lack of room (--max-tcp-connections or descriptors), by reason"
    );
    describe_histogram!(forward::FORWARD_DURATION_SECONDS, Unit::Seconds, "Time to get an answer from upstream");
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use clap::Parser;
    use roadkeeper_dns::forward::ForwardConfig;

    use super::own_addresses;
    use crate::cli::{Cli, Command, DnsArgs};

    fn dns_args(flags: &[&str]) -> DnsArgs {
        match Cli::try_parse_from(["roadkeeper", "dns"].iter().chain(flags)).unwrap().command {
            Command::Dns(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flags_set_the_forwarder_bounds() {
        assert_eq!(format!("{:?}", dns_args(&[]).forward_config()), format!("{:?}", ForwardConfig::default()));
        let config = dns_args(&["--max-concurrent", "50", "--cache-max-bytes", "4096"]).forward_config();
        assert_eq!((config.max_concurrent, config.cache_max_bytes), (50, 4096));
        for bad in ["0", "65536"] {
            let error = Cli::try_parse_from(["roadkeeper", "dns", "--max-concurrent", bad]).unwrap_err().to_string();
            assert!(error.contains("--max-concurrent"), "{error}");
        }
    }

    #[test]
    fn max_tcp_connections_is_a_positive_count() {
        assert_eq!(dns_args(&[]).max_tcp_connections, 4096);
        assert_eq!(dns_args(&["--max-tcp-connections", "8"]).max_tcp_connections, 8);
        let error = Cli::try_parse_from(["roadkeeper", "dns", "--max-tcp-connections", "0"]).unwrap_err().to_string();
        assert!(error.contains("--max-tcp-connections"), "{error}");
    }

    #[test]
    fn own_addresses_are_the_listen_addresses_or_the_hosts_for_a_wildcard() {
        let listen = ["127.0.0.1:53".parse().unwrap(), "[fd00::53]:53".parse().unwrap()];
        let expected: [IpAddr; 2] = ["127.0.0.1".parse().unwrap(), "fd00::53".parse().unwrap()];
        assert_eq!(own_addresses(&listen), expected);
        let host = own_addresses(&["0.0.0.0:53".parse().unwrap()]);
        assert!(!host.is_empty() && host.iter().all(IpAddr::is_ipv4), "{host:?}");
    }
}
