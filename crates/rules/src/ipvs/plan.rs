//! What the kernel holds in IPVS mode, planned from the service table: the addresses of
//! `kube-ipvs0`, the virtual servers with their real servers, and the helper rules.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::helpers::HelperRules;
use crate::Error;
use crate::config::ProxyConfig;
use crate::table::{Endpoint, IpFamily, NodeInfo, Protocol, ServicePort, ServicePortName};

/// The dummy interface that holds every Service address, as upstream names it.
pub const DUMMY_INTERFACE: &str = "kube-ipvs0";

/// An IPVS scheduler (`--ipvs-scheduler`, `ipvs.scheduler`): how a virtual server picks a real
/// server for a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Scheduler {
    /// `rr`: round robin (the default).
    #[default]
    RoundRobin,
    /// `wrr`: weighted round robin.
    WeightedRoundRobin,
    /// `lc`: least connections.
    LeastConnection,
    /// `wlc`: weighted least connections.
    WeightedLeastConnection,
    /// `lblc`: locality-based least connections.
    LocalityLeastConnection,
    /// `lblcr`: locality-based least connections with replication.
    LocalityLeastConnectionReplicated,
    /// `sh`: source hashing.
    SourceHashing,
    /// `dh`: destination hashing.
    DestinationHashing,
    /// `sed`: shortest expected delay.
    ShortestExpectedDelay,
    /// `nq`: never queue.
    NeverQueue,
    /// `mh`: maglev hashing.
    MaglevHashing,
}

impl Scheduler {
    /// Every scheduler, in the order `--help` lists them.
    pub const ALL: [Scheduler; 11] = [
        Scheduler::RoundRobin,
        Scheduler::WeightedRoundRobin,
        Scheduler::LeastConnection,
        Scheduler::WeightedLeastConnection,
        Scheduler::LocalityLeastConnection,
        Scheduler::LocalityLeastConnectionReplicated,
        Scheduler::SourceHashing,
        Scheduler::DestinationHashing,
        Scheduler::ShortestExpectedDelay,
        Scheduler::NeverQueue,
        Scheduler::MaglevHashing,
    ];

    /// The kernel's name of the scheduler (also its module's: `ip_vs_<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheduler::RoundRobin => "rr",
            Scheduler::WeightedRoundRobin => "wrr",
            Scheduler::LeastConnection => "lc",
            Scheduler::WeightedLeastConnection => "wlc",
            Scheduler::LocalityLeastConnection => "lblc",
            Scheduler::LocalityLeastConnectionReplicated => "lblcr",
            Scheduler::SourceHashing => "sh",
            Scheduler::DestinationHashing => "dh",
            Scheduler::ShortestExpectedDelay => "sed",
            Scheduler::NeverQueue => "nq",
            Scheduler::MaglevHashing => "mh",
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scheduler {
    type Err = Error;
    /// The kernel's name; empty is the default (`rr`), as kube-proxy.
    fn from_str(s: &str) -> Result<Scheduler, Error> {
        if s.is_empty() {
            return Ok(Scheduler::default());
        }
        Scheduler::ALL.into_iter().find(|sched| sched.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Scheduler::ALL.iter().map(|s| s.as_str()).collect();
            Error::Config(format!("ipvs.scheduler: unknown scheduler {s:?} (known: {})", names.join(", ")))
        })
    }
}

/// A virtual server's identity in the kernel: protocol, address and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualKey {
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// The frontend address.
    pub address: IpAddr,
    /// The frontend port.
    pub port: u16,
}

impl VirtualKey {
    /// The address's family.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.address)
    }
}

impl fmt::Display for VirtualKey {
    /// `10.96.0.10:80` or `[fd00::10]:80`, as `ipvsadm -Ln` writes a service address.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_address_port(f, self.address, self.port)
    }
}

/// A real server (an endpoint) of a virtual server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RealServer {
    /// The endpoint's address.
    pub address: IpAddr,
    /// The endpoint's port.
    pub port: u16,
}

impl From<&Endpoint> for RealServer {
    fn from(endpoint: &Endpoint) -> RealServer {
        RealServer { address: endpoint.ip, port: endpoint.port }
    }
}

impl fmt::Display for RealServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_address_port(f, self.address, self.port)
    }
}

/// `ip:port`, with brackets around an IPv6 address.
fn write_address_port(f: &mut fmt::Formatter<'_>, address: IpAddr, port: u16) -> fmt::Result {
    match address {
        IpAddr::V4(ip) => write!(f, "{ip}:{port}"),
        IpAddr::V6(ip) => write!(f, "[{ip}]:{port}"),
    }
}

/// Which frontend of a Service port a virtual server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    /// The ClusterIP: internal traffic (`internalTrafficPolicy`).
    ClusterIp,
    /// A NodePort on one node address: external traffic (`externalTrafficPolicy`).
    NodePort,
    /// An externalIP: external traffic.
    ExternalIp,
    /// A load-balancer ingress IP: external traffic.
    LoadBalancer,
}

/// Real-server weight of an endpoint that receives new connections (upstream's).
pub const WEIGHT: u32 = 1;

/// One virtual server: where a frontend's new connections go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    /// The Service port it belongs to.
    pub service: ServicePortName,
    /// Which frontend it is.
    pub kind: FrontendKind,
    /// How it picks a real server.
    pub scheduler: Scheduler,
    /// Session affinity as IPVS persistence: seconds a client sticks to its real server.
    pub persistence: Option<u32>,
    /// Real servers with their weights: [`WEIGHT`] for the endpoints the traffic policy selects;
    /// 0 for one being drained (no new connections: graceful termination, see
    /// [`IpvsTable::diff`]).
    pub real_servers: BTreeMap<RealServer, u32>,
}

impl VirtualServer {
    /// A virtual server read back from the kernel: the kernel knows no Service or frontend kind
    /// (an empty Service name, `ClusterIp`); what a diff compares, scheduler, persistence and
    /// real servers, is the kernel's.
    pub fn found(
        key: &VirtualKey,
        scheduler: Scheduler,
        persistence: Option<u32>,
        real_servers: BTreeMap<RealServer, u32>,
    ) -> VirtualServer {
        let service = ServicePortName {
            service: roadkeeper_cluster::NamespacedName::new("", ""),
            port: String::new(),
            protocol: key.protocol,
        };
        VirtualServer { service, kind: FrontendKind::ClusterIp, scheduler, persistence, real_servers }
    }

    /// True when the kernel must update the service itself (not its real servers) to go from
    /// `self` to `other`.
    pub fn attributes_differ(&self, other: &VirtualServer) -> bool {
        (self.scheduler, self.persistence) != (other.scheduler, other.persistence)
    }
}

/// What IPVS and `kube-ipvs0` hold: the kernel side of IPVS mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsTable {
    /// The addresses bound to [`DUMMY_INTERFACE`] (ClusterIPs, externalIPs, LB IPs).
    pub addresses: BTreeSet<IpAddr>,
    /// Every virtual server, by its kernel identity.
    pub virtual_servers: BTreeMap<VirtualKey, VirtualServer>,
}

/// A node's whole IPVS plan: the IPVS table and the helper rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsPlan {
    /// Addresses, virtual servers and real servers.
    pub table: IpvsTable,
    /// The netfilter rules IPVS needs beside it.
    pub helpers: HelperRules,
}

impl IpvsPlan {
    /// Plans `ports` (every service port of the node, frontend claims applied) for `node` under
    /// `cfg`. Deterministic: the same ports in any order give the same plan.
    pub fn new<'a>(cfg: &ProxyConfig, node: &NodeInfo, ports: impl IntoIterator<Item = &'a ServicePort>) -> IpvsPlan {
        let mut ports: Vec<&ServicePort> = ports.into_iter().collect();
        ports.sort_by(|a, b| (&a.name, a.family).cmp(&(&b.name, b.family)));
        let mut plan = IpvsPlan { table: IpvsTable::default(), helpers: HelperRules::new(cfg) };
        for port in &ports {
            let addresses = port.cluster_ip.iter().chain(&port.external_ips).chain(&port.load_balancer_ips);
            plan.table.addresses.extend(addresses);
        }
        let nodeport_ips: Vec<IpAddr> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .flat_map(|family| node.nodeport_ips(family, cfg))
            .filter(|ip| nodeport_capable(ip) && !plan.table.addresses.contains(ip))
            .collect();
        for port in ports {
            plan.add_port(port, &nodeport_ips, cfg);
        }
        plan.helpers.ipvs_addresses = plan.table.addresses.clone();
        plan.helpers.virtual_servers = plan.table.virtual_servers.keys().copied().collect();
        plan
    }

    /// Adds the virtual servers of one service port and its share of the helper rules.
    fn add_port(&mut self, port: &ServicePort, nodeport_ips: &[IpAddr], cfg: &ProxyConfig) {
        let protocol = port.name.protocol;
        let key = |address: IpAddr, port: u16| VirtualKey { protocol, address, port };
        let mut frontends: Vec<(FrontendKind, VirtualKey)> = Vec::new();
        frontends.extend(port.cluster_ip.map(|ip| (FrontendKind::ClusterIp, key(ip, port.port))));
        if let Some(node_port) = port.node_port {
            let of_family = nodeport_ips.iter().filter(|ip| IpFamily::of(ip) == port.family);
            frontends.extend(of_family.map(|ip| (FrontendKind::NodePort, key(*ip, node_port))));
        }
        frontends.extend(port.external_ips.iter().map(|ip| (FrontendKind::ExternalIp, key(*ip, port.port))));
        frontends.extend(port.load_balancer_ips.iter().map(|ip| (FrontendKind::LoadBalancer, key(*ip, port.port))));
        for (kind, frontend) in frontends {
            let endpoints =
                if kind == FrontendKind::ClusterIp { port.internal_endpoints() } else { port.external_endpoints() };
            let server = VirtualServer {
                service: port.name.clone(),
                kind,
                scheduler: cfg.ipvs.scheduler,
                persistence: port.affinity_timeout,
                real_servers: endpoints.iter().map(|e| (RealServer::from(e), WEIGHT)).collect(),
            };
            // Claims give each frontend one owner; a NodePort that is also an externalIP of
            // another Service keeps the first planned.
            if let std::collections::btree_map::Entry::Vacant(entry) = self.table.virtual_servers.entry(frontend) {
                self.helpers.add_frontend(port, kind, frontend, endpoints.is_empty());
                entry.insert(server);
            }
        }
        self.helpers.add_endpoints(port);
    }
}

/// True for an address IPVS can serve a NodePort on: not loopback (IPVS does not see traffic to
/// 127.0.0.1 leave the host's routing as iptables' `route_localnet` does) and not IPv6
/// link-local (a virtual server has no interface scope).
fn nodeport_capable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => !ip.is_loopback(),
        IpAddr::V6(ip) => !ip.is_loopback() && !ip.is_unicast_link_local(),
    }
}

/// The virtual servers found in the kernel that a full sync of `plan` deletes: those not planned,
/// except those inside `exclude_cidrs` (`--ipvs-exclude-cidrs`: other programs' virtual servers).
pub fn stale_virtual_servers<'a>(
    plan: &IpvsTable,
    found: impl IntoIterator<Item = &'a VirtualKey>,
    exclude_cidrs: &[IpNet],
) -> Vec<&'a VirtualKey> {
    let ours = |key: &VirtualKey| !exclude_cidrs.iter().any(|c| c.contains(&key.address));
    found.into_iter().filter(|key| !plan.virtual_servers.contains_key(key) && ours(key)).collect()
}

/// The virtual servers `roadkeeper cleanup` deletes among those `found` in the kernel: IPVS
/// mode's, and no other program's. Those on an address of `kube-ipvs0` (`dummy_addresses`:
/// ClusterIPs, externalIPs, LB IPs), and NodePorts: those on another address of the node
/// (`node_addresses`) with a port in `node_ports` (`--service-node-port-range`'s default unless
/// told).
pub fn cleanup_virtual_servers<'a>(
    found: impl IntoIterator<Item = &'a VirtualKey>,
    dummy_addresses: &BTreeSet<IpAddr>,
    node_addresses: &[IpAddr],
    node_ports: roadkeeper_cluster::NodePortRange,
) -> Vec<&'a VirtualKey> {
    let node_port = |key: &VirtualKey| node_addresses.contains(&key.address) && node_ports.contains(key.port.into());
    found.into_iter().filter(|key| dummy_addresses.contains(&key.address) || node_port(key)).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use roadkeeper_cluster::NamespacedName;

    use super::*;
    use crate::config::NodePortAddresses;

    pub(crate) fn ep(ip: &str, port: u16, is_local: bool) -> Endpoint {
        Endpoint { ip: ip.parse().unwrap(), port, is_local }
    }

    pub(crate) fn port(name: &str, cluster_ip: &str, endpoints: Vec<Endpoint>) -> ServicePort {
        let service = NamespacedName::new("default", name);
        ServicePort::for_test(service, Protocol::Tcp, cluster_ip.parse().unwrap(), 80, endpoints)
    }

    pub(crate) fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            primary_ips: vec!["192.168.77.2".parse().unwrap()],
            local_addresses: ["192.168.77.2", "10.0.0.2", "127.0.0.1", "fe80::1", "fd00:77::2"]
                .map(|a| a.parse().unwrap())
                .to_vec(),
            zone: None,
        }
    }

    pub(crate) fn ipvs_cfg() -> ProxyConfig {
        ProxyConfig { mode: crate::config::ProxyMode::Ipvs, ..ProxyConfig::default() }
    }

    fn key(address: &str, port: u16) -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: address.parse().unwrap(), port }
    }

    fn reals(server: &VirtualServer) -> Vec<String> {
        server.real_servers.iter().map(|(r, w)| format!("{r} {w}")).collect()
    }

    #[test]
    fn cluster_ip_service_is_one_virtual_server_with_its_endpoints() {
        let p = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false), ep("10.244.1.12", 8080, true)]);
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&p]);
        assert_eq!(plan.table.addresses, BTreeSet::from(["10.96.0.10".parse().unwrap()]));
        assert_eq!(plan.table.virtual_servers.keys().copied().collect::<Vec<_>>(), [key("10.96.0.10", 80)]);
        let server = &plan.table.virtual_servers[&key("10.96.0.10", 80)];
        assert_eq!(
            (server.kind, server.scheduler, server.persistence),
            (FrontendKind::ClusterIp, Scheduler::RoundRobin, None)
        );
        assert_eq!(reals(server), ["10.244.0.11:8080 1", "10.244.1.12:8080 1"]);
    }

    #[test]
    fn every_frontend_is_a_virtual_server_and_policies_pick_the_real_servers() {
        let mut p = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false), ep("10.244.1.12", 8080, true)]);
        p.local_endpoints = vec![ep("10.244.1.12", 8080, true)];
        p.node_port = Some(30080);
        p.external_ips = vec!["203.0.113.7".parse().unwrap()];
        p.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
        p.external_policy_local = true;
        p.affinity_timeout = Some(600);
        let mut cfg = ipvs_cfg();
        cfg.ipvs.scheduler = Scheduler::SourceHashing;
        let plan = IpvsPlan::new(&cfg, &node(), [&p]);
        let addresses: Vec<String> = plan.table.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(addresses, ["10.96.0.10", "203.0.113.7", "203.0.113.9"], "NodePort addresses stay off kube-ipvs0");
        let servers: Vec<(String, FrontendKind, Vec<String>)> =
            plan.table.virtual_servers.iter().map(|(k, s)| (k.to_string(), s.kind, reals(s))).collect();
        let (all, local) = (
            vec!["10.244.0.11:8080 1".to_string(), "10.244.1.12:8080 1".into()],
            vec!["10.244.1.12:8080 1".to_string()],
        );
        assert_eq!(
            servers,
            [
                ("10.0.0.2:30080".to_string(), FrontendKind::NodePort, local.clone()),
                ("10.96.0.10:80".into(), FrontendKind::ClusterIp, all),
                ("192.168.77.2:30080".into(), FrontendKind::NodePort, local.clone()),
                ("203.0.113.7:80".into(), FrontendKind::ExternalIp, local.clone()),
                ("203.0.113.9:80".into(), FrontendKind::LoadBalancer, local),
            ],
            "NodePorts on every local address but loopback (IPVS mode's default), none on IPv6 for an IPv4 port"
        );
        assert!(plan.table.virtual_servers.values().all(|s| s.scheduler == Scheduler::SourceHashing));
        assert!(plan.table.virtual_servers.values().all(|s| s.persistence == Some(600)));
    }

    #[test]
    fn internal_traffic_policy_local_narrows_the_cluster_ip() {
        let mut p = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false), ep("10.244.1.12", 8080, true)]);
        p.local_endpoints = vec![ep("10.244.1.12", 8080, true)];
        p.internal_policy_local = true;
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&p]);
        assert_eq!(reals(&plan.table.virtual_servers[&key("10.96.0.10", 80)]), ["10.244.1.12:8080 1"]);
    }

    #[test]
    fn nodeport_addresses_select_the_nodeport_virtual_servers() {
        let mut p = port("a", "10.96.0.10", vec![]);
        p.node_port = Some(30080);
        let mut cfg = ipvs_cfg();
        cfg.nodeport_addresses = NodePortAddresses::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        let plan = IpvsPlan::new(&cfg, &node(), [&p]);
        let keys: Vec<String> = plan.table.virtual_servers.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["10.0.0.2:30080", "10.96.0.10:80"]);
        cfg.nodeport_addresses = NodePortAddresses::Primary;
        let plan = IpvsPlan::new(&cfg, &node(), [&p]);
        let keys: Vec<String> = plan.table.virtual_servers.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["10.96.0.10:80", "192.168.77.2:30080"]);
    }

    #[test]
    fn dual_stack_ports_are_planned_per_family_in_any_order() {
        let v4 = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let mut v6 = port("a", "fd00:96::10", vec![ep("fd00:244::11", 8080, false)]);
        v6.node_port = Some(30080);
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&v6, &v4]);
        assert_eq!(plan, IpvsPlan::new(&ipvs_cfg(), &node(), [&v4, &v6]), "deterministic");
        let keys: Vec<String> = plan.table.virtual_servers.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["10.96.0.10:80", "[fd00:77::2]:30080", "[fd00:96::10]:80"], "no NodePort on fe80::1");
        assert_eq!(reals(&plan.table.virtual_servers[&key("fd00:96::10", 80)]), ["[fd00:244::11]:8080 1"]);
    }

    #[test]
    fn stale_virtual_servers_spare_the_excluded_cidrs() {
        let p = port("a", "10.96.0.10", vec![]);
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&p]);
        let found = [key("10.96.0.10", 80), key("10.96.0.11", 80), key("172.16.0.5", 80)];
        let exclude = ["172.16.0.0/12".parse().unwrap()];
        let stale = stale_virtual_servers(&plan.table, &found, &exclude);
        assert_eq!(stale, [&key("10.96.0.11", 80)]);
    }

    #[test]
    fn cleanup_takes_service_addresses_and_node_ports_only() {
        let found =
            [key("10.96.0.10", 80), key("192.168.77.2", 30080), key("192.168.77.2", 8080), key("172.16.0.5", 80)];
        let dummy = BTreeSet::from(["10.96.0.10".parse().unwrap()]);
        let node = ["192.168.77.2".parse().unwrap()];
        let ours = cleanup_virtual_servers(&found, &dummy, &node, roadkeeper_cluster::NodePortRange::DEFAULT);
        assert_eq!(ours, [&key("10.96.0.10", 80), &key("192.168.77.2", 30080)]);
    }

    #[test]
    fn schedulers_parse_by_kernel_name() {
        assert_eq!("".parse::<Scheduler>().unwrap(), Scheduler::RoundRobin);
        for scheduler in Scheduler::ALL {
            assert_eq!(scheduler.as_str().parse::<Scheduler>().unwrap(), scheduler);
        }
        let err = "fastest".parse::<Scheduler>().unwrap_err().to_string();
        assert!(err.contains("ipvs.scheduler") && err.contains("\"fastest\""), "{err}");
    }
}
