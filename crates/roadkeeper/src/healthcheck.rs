//! kube-proxy's per-Service health-check servers: every Service with `externalTrafficPolicy:
//! Local` and a `healthCheckNodePort` gets a server on that port (all addresses) telling load
//! balancers whether this node has local endpoints for it. Which ports and counts is worked out
//! by [`health_check_services`] (pure); [`HealthCheckServers`] reconciles running servers with
//! it after each sync.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hyper::StatusCode;
use roadkeeper_cluster::NamespacedName;
use roadkeeper_rules::table::ServicePort;
use socket2::{Domain, Socket, Type};
use tokio::task::AbortHandle;

use crate::serve::{self, SharedHealth};

/// Health-check node port → the Service it reports on and its number of local endpoints.
pub type HealthCheckMap = BTreeMap<u16, (NamespacedName, usize)>;

/// The health-check node ports of `table` with their Service and its local endpoint count:
/// distinct ready endpoint IPs over all the Service's ports, per IP family, the larger family's count
/// (upstream's per-family proxiers each report their own count to the one server; a dual-stack
/// pod counts once). Should two Services claim one port (the API server forbids it), the first in
/// name order wins.
pub fn health_check_services(table: &BTreeMap<NamespacedName, Vec<ServicePort>>) -> HealthCheckMap {
    let mut map = HealthCheckMap::new();
    for (name, ports) in table {
        let hc_ports: BTreeSet<u16> =
            ports.iter().filter(|sp| sp.external_policy_local).filter_map(|sp| sp.health_check_node_port).collect();
        if hc_ports.is_empty() {
            continue;
        }
        // Ready ones only: endpoints kept as the terminating fallback still get traffic, but a
        // load balancer must stop sending new connections to this node.
        let ready = ports.iter().filter(|sp| !sp.local_endpoints_terminating);
        let local: BTreeSet<IpAddr> = ready.flat_map(|sp| sp.local_endpoints.iter().map(|e| e.ip)).collect();
        let count = local.iter().filter(|ip| ip.is_ipv4()).count().max(local.iter().filter(|ip| ip.is_ipv6()).count());
        for port in hc_ports {
            map.entry(port).or_insert_with(|| (name.clone(), count));
        }
    }
    map
}

/// The running health-check servers, one per port, and the map their handlers read.
pub struct HealthCheckServers {
    shared: Arc<Mutex<HealthCheckMap>>,
    health: SharedHealth,
    running: BTreeMap<u16, AbortHandle>,
}

impl HealthCheckServers {
    /// No server yet; handlers report `health` as `serviceProxyHealthy`.
    pub fn new(health: SharedHealth) -> Self {
        HealthCheckServers { shared: Arc::default(), health, running: BTreeMap::new() }
    }

    /// Brings the servers in line with `table` (must run on the tokio runtime): updates the
    /// counts, stops servers of ports no longer wanted, starts (or retries) the missing ones. A
    /// port that cannot be bound is logged and retried at the next call.
    pub fn reconcile(&mut self, table: &BTreeMap<NamespacedName, Vec<ServicePort>>) {
        let wanted = health_check_services(table);
        *self.shared.lock().unwrap_or_else(|p| p.into_inner()) = wanted.clone();
        self.running.retain(|port, handle| {
            let keep = wanted.contains_key(port);
            if !keep {
                handle.abort();
                tracing::info!(port, "stopped health-check server");
            }
            keep
        });
        for (port, (service, _)) in &wanted {
            if self.running.contains_key(port) {
                continue;
            }
            match self.start(*port) {
                Ok(handle) => {
                    tracing::info!(%service, port, "started health-check server");
                    self.running.insert(*port, handle);
                }
                Err(err) => {
                    tracing::error!(%service, port, "health-check server of {service} on port {port}: {err:#}; retrying at the next sync")
                }
            }
        }
    }

    fn start(&self, port: u16) -> anyhow::Result<AbortHandle> {
        let listener = bind_all(port)?;
        let (shared, health) = (self.shared.clone(), self.health.clone());
        serve::spawn_server(listener, move |_req| {
            let entry = shared.lock().unwrap_or_else(|p| p.into_inner()).get(&port).cloned();
            let healthy = health.lock().unwrap_or_else(|p| p.into_inner()).healthy(Instant::now());
            match entry {
                Some((service, count)) => response(&service, count, healthy),
                None => serve::respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", String::new()),
            }
        })
    }
}

/// kube-proxy's answer: 200 when the Service has local endpoints and the proxier is healthy,
/// else 503; JSON body and the endpoint weight header.
fn response(
    service: &NamespacedName,
    count: usize,
    healthy: bool,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let status = if count > 0 && healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = serde_json::json!({
        "service": {"namespace": service.namespace, "name": service.name},
        "localEndpoints": count,
        "serviceProxyHealthy": healthy,
    });
    let mut response = serve::respond(status, "application/json", body.to_string());
    let headers = response.headers_mut();
    headers.insert("X-Content-Type-Options", hyper::header::HeaderValue::from_static("nosniff"));
    headers.insert("X-Load-Balancing-Endpoint-Weight", count.into());
    response
}

/// Listens on `port` on every address: one dual-stack `[::]` socket, or `0.0.0.0` when the host
/// has no IPv6.
fn bind_all(port: u16) -> anyhow::Result<TcpListener> {
    let listener = match Socket::new(Domain::IPV6, Type::STREAM, None) {
        Ok(socket) => {
            socket.set_only_v6(false)?;
            socket.set_reuse_address(true)?;
            socket.bind(&SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port).into())?;
            socket.listen(1024)?;
            TcpListener::from(socket)
        }
        Err(_) => TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?,
    };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_rules::table::{Endpoint, IpFamily, Protocol, ServicePortName};

    fn ep(ip: &str, is_local: bool) -> Endpoint {
        Endpoint { ip: ip.parse().unwrap(), port: 8080, is_local }
    }

    fn port(
        service: &NamespacedName,
        name: &str,
        protocol: Protocol,
        hc: Option<u16>,
        local: Vec<Endpoint>,
    ) -> ServicePort {
        ServicePort {
            name: ServicePortName { service: service.clone(), port: name.into(), protocol },
            family: local.first().map_or(IpFamily::V4, |e| IpFamily::of(&e.ip)),
            port: 80,
            cluster_ip: Some("10.96.0.1".parse().unwrap()),
            node_port: Some(30080),
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            affinity_timeout: None,
            external_policy_local: hc.is_some(),
            internal_policy_local: false,
            health_check_node_port: hc,
            cluster_endpoints: local.clone(),
            local_endpoints: local,
            local_endpoints_terminating: false,
        }
    }

    #[test]
    fn terminating_local_endpoints_count_as_none() {
        let web = NamespacedName::new("default", "web");
        let mut terminating = port(&web, "http", Protocol::Tcp, Some(32000), vec![ep("10.244.0.11", true)]);
        terminating.local_endpoints_terminating = true;
        let table = BTreeMap::from([(web.clone(), vec![terminating])]);
        assert_eq!(health_check_services(&table), HealthCheckMap::from([(32000, (web, 0))]));
    }

    #[test]
    fn counts_distinct_local_endpoint_ips_of_the_larger_family_per_health_check_port() {
        let web = NamespacedName::new("default", "web");
        let other = NamespacedName::new("default", "other");
        let plain = NamespacedName::new("kube-system", "plain");
        let eps = vec![ep("10.244.0.11", true), ep("10.244.0.12", true)];
        let table = BTreeMap::from([
            (
                web.clone(),
                vec![
                    port(&web, "http", Protocol::Tcp, Some(32000), eps.clone()),
                    port(&web, "dns", Protocol::Udp, Some(32000), eps),
                    // The IPv6 side of the same two dual-stack pods, one not ready yet.
                    port(&web, "v6", Protocol::Tcp, Some(32000), vec![ep("fd00:244::11", true)]),
                ],
            ),
            (other.clone(), vec![port(&other, "", Protocol::Tcp, Some(32001), Vec::new())]),
            (plain.clone(), vec![port(&plain, "", Protocol::Tcp, None, vec![ep("10.244.0.13", true)])]),
        ]);
        let map = health_check_services(&table);
        assert_eq!(map, HealthCheckMap::from([(32000, (web, 2)), (32001, (other, 0))]));
    }

    #[test]
    fn a_port_claimed_twice_goes_to_the_first_service() {
        let a = NamespacedName::new("default", "a");
        let b = NamespacedName::new("default", "b");
        let table = BTreeMap::from([
            (b.clone(), vec![port(&b, "", Protocol::Tcp, Some(32000), vec![ep("10.244.0.11", true)])]),
            (a.clone(), vec![port(&a, "", Protocol::Tcp, Some(32000), Vec::new())]),
        ]);
        assert_eq!(health_check_services(&table), HealthCheckMap::from([(32000, (a, 0))]));
        assert!(health_check_services(&BTreeMap::new()).is_empty());
    }
}
