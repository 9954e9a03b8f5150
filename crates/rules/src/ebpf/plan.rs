//! What eBPF mode should do with each frontend, planned from the service table: which endpoints
//! a new connection may land on, how one is chosen, and what happens when there is none. The
//! kernel-side layout of it (identifiers, slots, Maglev tables) is [`super::maps`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::config::ProxyConfig;
use crate::table::{Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName};

/// Where a connection to a frontend comes from, which decides the program that translates it and
/// the endpoints it may use (Cilium's lookup scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// From the node itself, its pods or host processes: translated at `connect()` / `sendmsg()`
    /// by the socket programs. ClusterIPs use the internal traffic policy; the node's own
    /// NodePorts, externalIPs and LB IPs go to every endpoint of the cluster (kube-proxy's
    /// short-circuit of local traffic to external frontends).
    Internal,
    /// From outside the node, at its interfaces' tc programs: NodePorts, externalIPs and LB IPs
    /// with the external traffic policy.
    External,
}

/// The port of a ClusterIP's catch-all frontends: what no Service port serves there is refused.
pub const ANY_PORT: u16 = 0;
/// The protocols a ClusterIP has a catch-all entry of (its `services` entries besides its ports').
pub const CATCH_ALL_PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// A frontend as the BPF programs look it up: destination, port, protocol and scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontendKey {
    /// The Service address (ClusterIP, node address, externalIP, LB IP).
    pub address: IpAddr,
    /// The Service port or NodePort.
    pub port: u16,
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// Which programs look it up.
    pub scope: Scope,
}

impl fmt::Display for FrontendKey {
    /// `10.96.0.10:80/tcp` (`[fd00::10]:80/tcp`; `10.96.0.10:*/tcp` for every other port),
    /// with ` (external)` for the external scope.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port == ANY_PORT {
            let address = SocketAddr::new(self.address, 0).to_string();
            write!(f, "{}*/{}", address.trim_end_matches('0'), self.protocol.as_str())?;
        } else {
            write!(f, "{}/{}", SocketAddr::new(self.address, self.port), self.protocol.as_str())?;
        }
        if self.scope == Scope::External { f.write_str(" (external)") } else { Ok(()) }
    }
}

/// An endpoint as the programs translate to it: its address and port (its protocol is the
/// frontend's).
pub type BackendAddress = SocketAddr;

/// How a new connection picks one of a frontend's backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Selection {
    /// At random, every backend alike (the other modes' probabilities).
    Random,
    /// By the flow's hash in the frontend's Maglev table, so that every node picks the same
    /// backend for a flow (external traffic with `externalTrafficPolicy: Cluster`).
    Maglev,
}

/// What a connection to a frontend without a backend gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Empty {
    /// Refused: `connect()` fails with ECONNREFUSED, a packet is answered with a TCP reset or an
    /// ICMP port unreachable (the Service has no endpoints at all; upstream's REJECT).
    Reject,
    /// Dropped: the traffic policy is Local and this node has none of the Service's endpoints.
    Drop,
}

/// One frontend's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    /// The Service port it belongs to.
    pub service: ServicePortName,
    /// The endpoints a new connection may land on, sorted.
    pub backends: Vec<BackendAddress>,
    /// How one is chosen.
    pub selection: Selection,
    /// What happens when `backends` is empty.
    pub empty: Empty,
    /// `sessionAffinity: ClientIP`: seconds a client keeps its backend.
    pub affinity: Option<u32>,
    /// `loadBalancerSourceRanges` (external scope of LB IPs; empty: every source).
    pub source_ranges: Vec<IpNet>,
    /// Whether translated traffic is masqueraded: external traffic under the Cluster policy (the
    /// reply must come back through this node), and a ClusterIP reached from outside the node
    /// (the interface programs fall back to its internal entry) when upstream would masquerade
    /// it. Never the socket programs' own connections: their clients are on the node and see
    /// their own address come back.
    pub masquerade: bool,
}

/// A node's whole eBPF plan: every frontend of every scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EbpfPlan {
    /// Frontends by their lookup key.
    pub frontends: BTreeMap<FrontendKey, Frontend>,
}

impl EbpfPlan {
    /// Plans `ports` (frontend claims applied) for `node` under `cfg`. Deterministic: the same
    /// ports in any order give the same plan; a frontend two ports claim keeps the first by name.
    pub fn new<'a>(cfg: &ProxyConfig, node: &NodeInfo, ports: impl IntoIterator<Item = &'a ServicePort>) -> EbpfPlan {
        let mut ports: Vec<&ServicePort> = ports.into_iter().collect();
        ports.sort_by(|a, b| (&a.name, a.family).cmp(&(&b.name, b.family)));
        let mut plan = EbpfPlan::default();
        // Off-cluster traffic to a ClusterIP is masqueraded when a cluster CIDR tells pods apart,
        // and always with --masquerade-all (upstream's rule).
        let masquerade_off_cluster = cfg.masquerade_all || !cfg.cluster_cidrs.is_empty();
        for port in ports {
            let nodeport_ips = node.nodeport_ips(port.family, cfg);
            plan.add_port(port, &nodeport_ips, masquerade_off_cluster);
        }
        plan
    }

    /// Adds the frontends of one service port, both scopes.
    fn add_port(&mut self, port: &ServicePort, nodeport_ips: &[IpAddr], masquerade_off_cluster: bool) {
        let protocol = port.name.protocol;
        let key = |address: IpAddr, number: u16, scope: Scope| FrontendKey { address, port: number, protocol, scope };
        let (internal_lacks_local, external_lacks_local) = port.lacks_local_endpoints();
        let empty = |lacks_local: bool| if lacks_local { Empty::Drop } else { Empty::Reject };
        let frontend = |endpoints: &[Endpoint], selection, empty, source_ranges: &[IpNet], masquerade| {
            let mut backends: Vec<BackendAddress> = endpoints.iter().map(|e| SocketAddr::new(e.ip, e.port)).collect();
            backends.sort();
            backends.dedup();
            Frontend {
                service: port.name.clone(),
                backends,
                selection,
                empty,
                affinity: port.affinity_timeout,
                source_ranges: source_ranges.to_vec(),
                masquerade,
            }
        };
        let mut planned: Vec<(FrontendKey, Frontend)> = Vec::new();
        if let Some(ip) = port.cluster_ip {
            let endpoints = port.internal_endpoints();
            let internal =
                frontend(endpoints, Selection::Random, empty(internal_lacks_local), &[], masquerade_off_cluster);
            planned.push((key(ip, port.port, Scope::Internal), internal));
            // Every other port of the ClusterIP, in every protocol: refused, as upstream rejects
            // what no Service port of a ClusterIP serves. (No identifier: nothing is translated.)
            for protocol in CATCH_ALL_PROTOCOLS {
                let other_ports = FrontendKey { address: ip, port: ANY_PORT, protocol, scope: Scope::Internal };
                planned.push((other_ports, frontend(&[], Selection::Random, Empty::Reject, &[], false)));
            }
        }
        let mut external: Vec<(IpAddr, u16, &[IpNet])> = Vec::new();
        if let Some(node_port) = port.node_port {
            external.extend(nodeport_ips.iter().map(|ip| (*ip, node_port, &[][..])));
        }
        external.extend(port.external_ips.iter().map(|ip| (*ip, port.port, &[][..])));
        external.extend(port.load_balancer_ips.iter().map(|ip| (*ip, port.port, &port.source_ranges[..])));
        let (selection, masquerade) =
            if port.external_policy_local { (Selection::Random, false) } else { (Selection::Maglev, true) };
        for (ip, number, ranges) in external {
            let from_node = frontend(&port.cluster_endpoints, Selection::Random, empty(false), &[], false);
            planned.push((key(ip, number, Scope::Internal), from_node));
            let from_outside =
                frontend(port.external_endpoints(), selection, empty(external_lacks_local), ranges, masquerade);
            planned.push((key(ip, number, Scope::External), from_outside));
        }
        for (key, frontend) in planned {
            self.frontends.entry(key).or_insert(frontend);
        }
    }

    /// The frontends of one family.
    pub fn of_family(&self, family: IpFamily) -> impl Iterator<Item = (&FrontendKey, &Frontend)> {
        self.frontends.iter().filter(move |(key, _)| IpFamily::of(&key.address) == family)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::ProxyMode;

    pub(crate) use crate::ipvs::plan::tests::port;

    /// An endpoint on port 8080.
    pub(crate) fn ep(ip: &str, is_local: bool) -> Endpoint {
        crate::ipvs::plan::tests::ep(ip, 8080, is_local)
    }

    pub(crate) fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            primary_ips: vec!["192.168.77.2".parse().unwrap(), "fd00:77::2".parse().unwrap()],
            local_addresses: ["192.168.77.2", "127.0.0.1", "fd00:77::2"].map(|a| a.parse().unwrap()).to_vec(),
            zone: None,
        }
    }

    pub(crate) fn cfg() -> ProxyConfig {
        ProxyConfig { mode: ProxyMode::Nftables, ..ProxyConfig::default() }
    }

    fn show(plan: &EbpfPlan) -> Vec<String> {
        let show = |f: &Frontend| {
            let backends: Vec<String> = f.backends.iter().map(ToString::to_string).collect();
            format!("{:?} {:?} masq={} [{}]", f.selection, f.empty, f.masquerade, backends.join(" "))
        };
        // Catch-alls aside: `a_cluster_ip_is_one_internal_frontend_with_its_endpoints` has them.
        plan.frontends.iter().filter(|(k, _)| k.port != ANY_PORT).map(|(k, f)| format!("{k}: {}", show(f))).collect()
    }

    #[test]
    fn a_cluster_ip_is_one_internal_frontend_with_its_endpoints() {
        let p = port("a", "10.96.0.10", vec![ep("10.244.1.12", false), ep("10.244.0.11", true)]);
        let plan = EbpfPlan::new(&cfg(), &node(), [&p]);
        assert_eq!(show(&plan), ["10.96.0.10:80/tcp: Random Reject masq=false [10.244.0.11:8080 10.244.1.12:8080]"]);
        let catch_alls: Vec<String> = plan
            .frontends
            .iter()
            .filter(|(k, _)| k.port == ANY_PORT)
            .map(|(k, f)| format!("{k} {:?} {:?}", f.backends, f.empty))
            .collect();
        assert_eq!(
            catch_alls,
            ["10.96.0.10:*/tcp [] Reject", "10.96.0.10:*/udp [] Reject", "10.96.0.10:*/sctp [] Reject"],
            "every other port and protocol of the ClusterIP is refused"
        );
        let with_cidr = ProxyConfig { cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()], ..cfg() };
        assert_eq!(
            show(&EbpfPlan::new(&with_cidr, &node(), [&p])),
            ["10.96.0.10:80/tcp: Random Reject masq=true [10.244.0.11:8080 10.244.1.12:8080]"],
            "a cluster CIDR tells pods apart: reached from outside, the ClusterIP is masqueraded"
        );
    }

    #[test]
    fn external_frontends_have_both_scopes_and_the_external_policy_decides_the_outside_one() {
        let mut p = port("a", "10.96.0.10", vec![ep("10.244.0.11", true), ep("10.244.1.12", false)]);
        p.local_endpoints = vec![ep("10.244.0.11", true)];
        p.node_port = Some(30080);
        p.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
        p.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
        let cluster = EbpfPlan::new(&cfg(), &node(), [&p]);
        let all = "[10.244.0.11:8080 10.244.1.12:8080]";
        assert_eq!(
            show(&cluster),
            [
                format!("10.96.0.10:80/tcp: Random Reject masq=false {all}"),
                format!("192.168.77.2:30080/tcp: Random Reject masq=false {all}"),
                format!("192.168.77.2:30080/tcp (external): Maglev Reject masq=true {all}"),
                format!("203.0.113.9:80/tcp: Random Reject masq=false {all}"),
                format!("203.0.113.9:80/tcp (external): Maglev Reject masq=true {all}"),
            ],
            "NodePorts on the primary address only (nftables mode's default)"
        );
        let lb = FrontendKey {
            address: "203.0.113.9".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            scope: Scope::External,
        };
        assert_eq!(cluster.frontends[&lb].source_ranges, p.source_ranges);
        assert!(cluster.frontends.iter().filter(|(k, _)| *k != &lb).all(|(_, f)| f.source_ranges.is_empty()));

        p.external_policy_local = true;
        let local = EbpfPlan::new(&cfg(), &node(), [&p]);
        let external: Vec<String> = show(&local).into_iter().filter(|l| l.contains("external")).collect();
        assert_eq!(
            external,
            [
                "192.168.77.2:30080/tcp (external): Random Reject masq=false [10.244.0.11:8080]",
                "203.0.113.9:80/tcp (external): Random Reject masq=false [10.244.0.11:8080]",
            ],
            "Local: this node's endpoints, the client's address kept"
        );
        assert!(show(&local).iter().filter(|l| !l.contains("external")).all(|l| l.contains(all)), "from the node");
    }

    #[test]
    fn local_policies_without_local_endpoints_drop_and_no_endpoints_reject() {
        let mut p = port("a", "10.96.0.10", vec![ep("10.244.1.12", false)]);
        p.internal_policy_local = true;
        p.external_policy_local = true;
        p.node_port = Some(30080);
        let plan = EbpfPlan::new(&cfg(), &node(), [&p]);
        assert_eq!(
            show(&plan),
            [
                "10.96.0.10:80/tcp: Random Drop masq=false []",
                "192.168.77.2:30080/tcp: Random Reject masq=false [10.244.1.12:8080]",
                "192.168.77.2:30080/tcp (external): Random Drop masq=false []",
            ]
        );
        let none = port("b", "10.96.0.11", vec![]);
        let plan = EbpfPlan::new(&cfg(), &node(), [&none]);
        assert_eq!(show(&plan), ["10.96.0.11:80/tcp: Random Reject masq=false []"]);
    }

    #[test]
    fn dual_stack_ports_plan_per_family_in_any_order_and_the_first_claimant_keeps_a_frontend() {
        let v4 = port("a", "10.96.0.10", vec![ep("10.244.0.11", true)]);
        let mut v6 = port("a", "fd00:96::10", vec![ep("fd00:244::11", true)]);
        v6.node_port = Some(30080);
        let plan = EbpfPlan::new(&cfg(), &node(), [&v6, &v4]);
        assert_eq!(plan, EbpfPlan::new(&cfg(), &node(), [&v4, &v6]), "deterministic");
        let v6_keys: Vec<String> =
            plan.of_family(IpFamily::V6).filter(|(k, _)| k.port != ANY_PORT).map(|(k, _)| k.to_string()).collect();
        assert_eq!(v6_keys, ["[fd00:77::2]:30080/tcp", "[fd00:77::2]:30080/tcp (external)", "[fd00:96::10]:80/tcp"]);

        let mut other = port("b", "10.96.0.10", vec![ep("10.244.0.99", true)]);
        other.port = 80;
        let plan = EbpfPlan::new(&cfg(), &node(), [&other, &v4]);
        let served: Vec<&Frontend> =
            plan.frontends.iter().filter(|(k, _)| k.port != ANY_PORT).map(|(_, f)| f).collect();
        assert_eq!((served.len(), served[0].service.service.name.as_str()), (1, "a"));
    }
}
