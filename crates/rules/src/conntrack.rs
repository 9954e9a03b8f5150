//! Which UDP/SCTP conntrack entries went stale, as kube-proxy decides it on every sync since 1.32
//! (`pkg/proxy/conntrack/cleanup.go`): the pure part of the cleanup; dumping and deleting entries
//! over ctnetlink is `roadkeeper_proxy::conntrack`.
//!
//! A UDP "connection" is pinned by conntrack to the endpoint its first datagram was DNATed to.
//! When that endpoint goes away and a sync rewrites the DNAT rules, a client that keeps its source
//! port (a resolver talking to a DNS Service) keeps hitting the old entry, and so the dead pod,
//! until the entry times out, which it never does while the client keeps retrying. So after each
//! sync, entries whose original destination is a UDP/SCTP service frontend (ClusterIP, externalIP,
//! load-balancer IP, or a NodePort on one of this node's NodePort addresses) and whose reply
//! source is not a serving endpoint of that service port are deleted. TCP is left alone (a dead
//! backend resets it); so is everything whose original destination is not a service frontend.
//!
//! Differences from upstream: the reply source must match an endpoint's IP *and* port (upstream
//! compares the IP only), so a changed targetPort also unpins flows; a NodePort flow must be
//! addressed to one of the NodePort addresses passed in (upstream matches the port on any
//! address); SCTP is handled like UDP (upstream: UDP only).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use roadkeeper_cluster::NamespacedName;

use crate::table::{IpFamily, Protocol, ServicePort};

// netinet/in.h
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u8 = 6;
/// `IPPROTO_UDP`.
pub const IPPROTO_UDP: u8 = 17;
/// `IPPROTO_SCTP`.
pub const IPPROTO_SCTP: u8 = 132;

/// One direction of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// L4 protocol number (`IPPROTO_*`).
    pub protocol: u8,
    /// Source port (0 for port-less protocols such as ICMP).
    pub src_port: u16,
    /// Destination port (0 for port-less protocols).
    pub dst_port: u16,
}

/// One conntrack entry, as much of it as cleanup needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// `CTA_TUPLE_ORIG`: the tuple as the client sent it (destination = the frontend).
    pub orig: Tuple,
    /// `CTA_TUPLE_REPLY`: the reply direction (source = the endpoint after DNAT).
    pub reply: Tuple,
    /// `CTA_ZONE` (0 when absent).
    pub zone: u16,
    /// `CTA_ID`: sent back on delete so that only this very entry is removed.
    pub id: Option<u32>,
}

/// The conntrack protocol number of a service protocol.
pub fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
    }
}

/// `(frontend ip, frontend port, protocol)` of the UDP/SCTP service frontends → the `(ip, port)`
/// of the endpoints that may answer for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServingMap {
    frontends: HashMap<(IpAddr, u16, u8), HashSet<(IpAddr, u16)>>,
}

impl ServingMap {
    /// Builds the map from the service table. `node_ips` are the addresses that accept NodePort
    /// traffic ([`crate::table::NodeInfo::nodeport_ips`] of every family). TCP ports are left
    /// out. A port's serving endpoints are the union of its cluster and local endpoint sets.
    pub fn new(table: &BTreeMap<NamespacedName, Vec<ServicePort>>, node_ips: &[IpAddr]) -> ServingMap {
        let mut map = ServingMap::default();
        for sp in table.values().flatten() {
            if sp.name.protocol == Protocol::Tcp {
                continue;
            }
            let proto = proto_number(sp.name.protocol);
            let serving: Vec<(IpAddr, u16)> =
                sp.cluster_endpoints.iter().chain(&sp.local_endpoints).map(|e| (e.ip, e.port)).collect();
            let mut frontends: Vec<(IpAddr, u16)> = sp
                .cluster_ip
                .iter()
                .chain(&sp.external_ips)
                .chain(&sp.load_balancer_ips)
                .map(|ip| (*ip, sp.port))
                .collect();
            if let Some(np) = sp.node_port {
                frontends.extend(node_ips.iter().filter(|ip| IpFamily::of(ip) == sp.family).map(|ip| (*ip, np)));
            }
            for (ip, port) in frontends {
                // Two ports sharing a frontend (should not happen): union, i.e. delete less.
                map.frontends.entry((ip, port, proto)).or_default().extend(serving.iter().copied());
            }
        }
        map
    }

    /// True if no UDP/SCTP frontend exists (cleanup has nothing to look at).
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty()
    }

    /// The IP families that have at least one frontend.
    pub fn families(&self) -> BTreeSet<IpFamily> {
        self.frontends.keys().map(|(ip, _, _)| IpFamily::of(ip)).collect()
    }

    /// The endpoints allowed to answer for a frontend, or `None` if it is not a frontend.
    pub fn serving(&self, ip: IpAddr, port: u16, proto: u8) -> Option<&HashSet<(IpAddr, u16)>> {
        self.frontends.get(&(ip, port, proto))
    }

    /// Whether the entry must go: UDP/SCTP, addressed to a service frontend, and answered by
    /// something that is not a serving endpoint of that frontend.
    pub fn is_stale(&self, flow: &Flow) -> bool {
        let (o, r) = (&flow.orig, &flow.reply);
        self.is_stale_endpoint(o.protocol, (o.dst, o.dst_port), (r.src, r.src_port))
    }

    /// Whether traffic of `protocol` sent to `frontend` and translated to `backend` (a flow, or
    /// eBPF mode's connected socket) must stop: UDP/SCTP, `frontend` a Service frontend, and
    /// `backend` no serving endpoint of it.
    pub fn is_stale_endpoint(&self, protocol: u8, frontend: (IpAddr, u16), backend: (IpAddr, u16)) -> bool {
        if protocol != IPPROTO_UDP && protocol != IPPROTO_SCTP {
            return false;
        }
        self.serving(frontend.0, frontend.1, protocol).is_some_and(|serving| !serving.contains(&backend))
    }

    /// The stale entries of `flows`.
    pub fn stale<'a>(&self, flows: &'a [Flow]) -> Vec<&'a Flow> {
        flows.iter().filter(|f| self.is_stale(f)).collect()
    }
}

#[cfg(any(test, feature = "test-fixtures"))]
impl Flow {
    /// A test fixture: a DNATed flow of `proto` from `client` to `front`, answered by `back`
    /// (addresses with ports), zone 0, id 7.
    pub fn dnat_for_test(proto: u8, client: (IpAddr, u16), front: (IpAddr, u16), back: (IpAddr, u16)) -> Flow {
        Flow {
            orig: Tuple { src: client.0, dst: front.0, protocol: proto, src_port: client.1, dst_port: front.1 },
            reply: Tuple { src: back.0, dst: client.0, protocol: proto, src_port: back.1, dst_port: client.1 },
            zone: 0,
            id: Some(7),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Endpoint;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ep(s: &str, port: u16) -> Endpoint {
        Endpoint { ip: ip(s), port, is_local: false }
    }

    fn svc_port(name: &str, protocol: Protocol, cluster_ip: &str, port: u16, endpoints: Vec<Endpoint>) -> ServicePort {
        ServicePort::for_test(NamespacedName::new("ns", name), protocol, ip(cluster_ip), port, endpoints)
    }

    fn table(ports: Vec<ServicePort>) -> BTreeMap<NamespacedName, Vec<ServicePort>> {
        let mut t: BTreeMap<NamespacedName, Vec<ServicePort>> = BTreeMap::new();
        for sp in ports {
            t.entry(sp.name.service.clone()).or_default().push(sp);
        }
        t
    }

    fn flow(proto: u8, client: &str, cport: u16, front: &str, fport: u16, back: &str, bport: u16) -> Flow {
        Flow::dnat_for_test(proto, (ip(client), cport), (ip(front), fport), (ip(back), bport))
    }

    fn dns_table() -> BTreeMap<NamespacedName, Vec<ServicePort>> {
        let mut udp = svc_port("dns", Protocol::Udp, "10.96.0.10", 53, vec![ep("10.1.0.2", 5353)]);
        udp.external_ips = vec![ip("192.0.2.10")];
        udp.load_balancer_ips = vec![ip("198.51.100.10")];
        udp.node_port = Some(30053);
        udp.local_endpoints = vec![ep("10.1.0.3", 5353)];
        let tcp = svc_port("dns", Protocol::Tcp, "10.96.0.10", 53, vec![ep("10.1.0.2", 5353)]);
        let sctp = svc_port("sig", Protocol::Sctp, "10.96.0.20", 3868, vec![ep("10.1.0.5", 3868)]);
        let mut v6 = svc_port("dns6", Protocol::Udp, "fd00:96::10", 53, vec![ep("fd00:1::2", 5353)]);
        v6.node_port = Some(30054);
        table(vec![udp, tcp, sctp, v6])
    }

    const NODE_IPS: [&str; 2] = ["192.168.1.5", "fd00:192::5"];

    fn map() -> ServingMap {
        let node_ips: Vec<IpAddr> = NODE_IPS.iter().map(|s| ip(s)).collect();
        ServingMap::new(&dns_table(), &node_ips)
    }

    #[test]
    fn map_has_every_udp_and_sctp_frontend_and_no_tcp() {
        let m = map();
        let both: HashSet<_> = [(ip("10.1.0.2"), 5353), (ip("10.1.0.3"), 5353)].into();
        for front in ["10.96.0.10", "192.0.2.10", "198.51.100.10"] {
            assert_eq!(m.serving(ip(front), 53, IPPROTO_UDP), Some(&both), "{front}");
        }
        assert_eq!(m.serving(ip("192.168.1.5"), 30053, IPPROTO_UDP), Some(&both));
        // NodePorts only on node IPs of the port's family.
        assert_eq!(m.serving(ip("fd00:192::5"), 30053, IPPROTO_UDP), None);
        assert!(m.serving(ip("fd00:192::5"), 30054, IPPROTO_UDP).is_some());
        assert_eq!(m.serving(ip("192.168.1.5"), 30054, IPPROTO_UDP), None);
        assert_eq!(m.serving(ip("10.96.0.10"), 53, IPPROTO_TCP), None);
        assert!(m.serving(ip("10.96.0.20"), 3868, IPPROTO_SCTP).is_some());
        assert_eq!(m.families(), [IpFamily::V4, IpFamily::V6].into());
    }

    #[test]
    fn udp_flow_to_a_serving_endpoint_stays() {
        let m = map();
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.2", 5353)));
        // Local endpoints serve too.
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.3", 5353)));
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "203.0.113.1", 40000, "192.168.1.5", 30053, "10.1.0.2", 5353)));
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "fd00:2::9", 40000, "fd00:96::10", 53, "fd00:1::2", 5353)));
    }

    #[test]
    fn udp_flow_to_a_gone_endpoint_is_stale_on_every_frontend_kind() {
        let m = map();
        for (front, port) in [("10.96.0.10", 53), ("192.0.2.10", 53), ("198.51.100.10", 53), ("192.168.1.5", 30053)] {
            assert!(m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, front, port, "10.1.0.99", 5353)), "{front}");
        }
        assert!(m.is_stale(&flow(IPPROTO_UDP, "fd00:2::9", 1, "fd00:96::10", 53, "fd00:1::99", 5353)));
        assert!(m.is_stale(&flow(IPPROTO_UDP, "fd00:2::9", 1, "fd00:192::5", 30054, "fd00:1::99", 5353)));
        // Right IP, wrong port (the targetPort changed).
        assert!(m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.2", 53)));
        // Not DNATed at all (reply from the frontend itself).
        assert!(m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.96.0.10", 53)));
    }

    #[test]
    fn sctp_is_cleaned_like_udp() {
        let m = map();
        assert!(m.is_stale(&flow(IPPROTO_SCTP, "10.2.0.9", 5000, "10.96.0.20", 3868, "10.1.0.6", 3868)));
        assert!(!m.is_stale(&flow(IPPROTO_SCTP, "10.2.0.9", 5000, "10.96.0.20", 3868, "10.1.0.5", 3868)));
    }

    #[test]
    fn tcp_and_non_frontend_flows_are_never_stale() {
        let m = map();
        assert!(!m.is_stale(&flow(IPPROTO_TCP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.99", 5353)));
        // Not a frontend: other address, other port, other protocol, NodePort on a non-node IP.
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.1.0.99", 5353, "10.1.0.99", 5353)));
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 54, "10.1.0.99", 54)));
        assert!(!m.is_stale(&flow(IPPROTO_SCTP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.99", 5353)));
        assert!(!m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 40000, "192.168.1.6", 30053, "10.1.0.99", 5353)));
        // ICMP (no ports) to a frontend.
        assert!(!m.is_stale(&flow(1, "10.2.0.9", 0, "10.96.0.10", 0, "10.96.0.10", 0)));
        let flows = [
            flow(IPPROTO_UDP, "10.2.0.9", 1, "10.96.0.10", 53, "10.1.0.99", 5353),
            flow(IPPROTO_UDP, "10.2.0.9", 2, "10.96.0.10", 53, "10.1.0.2", 5353),
            flow(IPPROTO_TCP, "10.2.0.9", 3, "10.96.0.10", 53, "10.1.0.99", 5353),
        ];
        assert_eq!(m.stale(&flows), vec![&flows[0]]);
    }

    #[test]
    fn service_without_endpoints_makes_every_flow_stale() {
        let t = table(vec![svc_port("dns", Protocol::Udp, "10.96.0.10", 53, Vec::new())]);
        let m = ServingMap::new(&t, &[]);
        assert!(m.is_stale(&flow(IPPROTO_UDP, "10.2.0.9", 1, "10.96.0.10", 53, "10.1.0.2", 5353)));
        assert!(ServingMap::new(&table(Vec::new()), &[]).is_empty());
    }
}
