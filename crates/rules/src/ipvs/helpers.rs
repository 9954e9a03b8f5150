//! The netfilter rules IPVS mode needs beside IPVS, as data: the elements of the named sets of
//! table `roadkeeper-ipvs` (one per family; see the module documentation of [`crate::ipvs`] for
//! why nftables) and the fixed chains that match them, printed as an `nft -f` script.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

use super::plan::{FrontendKind, RealServer, VirtualKey};
use crate::config::ProxyConfig;
use crate::nft::objects::family_keyword;
use crate::table::{IpFamily, Protocol, ServicePort};

/// Name of the helper table in each family.
pub const TABLE: &str = "roadkeeper-ipvs";

/// What the helper rules match, upstream's ipsets in nftables sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelperRules {
    /// The mark that flags a connection for masquerading (`--masquerade-bit`'s).
    pub masquerade_mark: u32,
    /// Masquerade every connection to a ClusterIP (`--masquerade-all`).
    pub masquerade_all: bool,
    /// Pod CIDRs: connections to a ClusterIP from outside them are masqueraded.
    pub cluster_cidrs: Vec<IpNet>,
    /// Forwarded packets conntrack calls INVALID are dropped (`KUBE-FORWARD`'s first rule), unless
    /// the node's TCP tracking is liberal, as kube-proxy's iptables and IPVS modes.
    pub drop_invalid: bool,
    /// ClusterIP frontends (`KUBE-CLUSTER-IP`).
    pub cluster_ips: BTreeSet<VirtualKey>,
    /// External frontends (NodePort, externalIP, LB IP) of `externalTrafficPolicy: Cluster`
    /// ports: masqueraded, as upstream's `KUBE-NODE-PORT-*`, `KUBE-EXTERNAL-IP` and
    /// `KUBE-LOAD-BALANCER` sets without their `-LOCAL` counterparts.
    pub masquerade_external: BTreeSet<VirtualKey>,
    /// Endpoints, masqueraded when they reach themselves through a Service (`KUBE-LOOP-BACK`).
    pub hairpin: BTreeSet<(RealServer, Protocol)>,
    /// Frontends of ports without any endpoint: new connections rejected.
    pub no_endpoints: BTreeSet<VirtualKey>,
    /// Frontends whose Local traffic policy finds no endpoint on this node: dropped.
    pub no_local_endpoints: BTreeSet<VirtualKey>,
    /// Load-balancer frontends with `loadBalancerSourceRanges`, and the sources they accept
    /// (`KUBE-LOAD-BALANCER-FW`, `KUBE-LOAD-BALANCER-SOURCE-CIDR`); other sources are dropped.
    pub firewall: BTreeMap<VirtualKey, Vec<IpNet>>,
    /// External frontends of `externalTrafficPolicy: Local` ports, with the ClusterIP and port
    /// they stand for: traffic from pods and from the node itself is sent there (to every
    /// endpoint) instead, as the other modes short-circuit it to the Cluster set.
    pub short_circuit: BTreeMap<VirtualKey, (IpAddr, u16)>,
    /// The addresses on `kube-ipvs0`.
    pub ipvs_addresses: BTreeSet<IpAddr>,
    /// Every virtual server: a new connection to a `kube-ipvs0` address on another port is
    /// rejected (`KUBE-IPVS-FILTER`; replies to the node's own connections through a Service
    /// come back to that address on the client's port, and pass).
    pub virtual_servers: BTreeSet<VirtualKey>,
}

impl HelperRules {
    /// Empty sets under `cfg`'s masquerading settings.
    pub fn new(cfg: &ProxyConfig) -> HelperRules {
        HelperRules {
            masquerade_mark: cfg.masquerade_mark(),
            masquerade_all: cfg.masquerade_all,
            cluster_cidrs: cfg.cluster_cidrs.clone(),
            drop_invalid: !cfg.conntrack.tcp_be_liberal,
            ..HelperRules::default()
        }
    }

    /// Adds one virtual server of `port`: `no_real_servers` when its traffic has no endpoint.
    pub(super) fn add_frontend(
        &mut self,
        port: &ServicePort,
        kind: FrontendKind,
        frontend: VirtualKey,
        no_real_servers: bool,
    ) {
        if kind == FrontendKind::ClusterIp {
            self.cluster_ips.insert(frontend);
        } else if !port.external_policy_local {
            self.masquerade_external.insert(frontend);
        } else if let Some(cluster_ip) = port.cluster_ip {
            self.short_circuit.insert(frontend, (cluster_ip, port.port));
        }
        if no_real_servers {
            // As the other modes: no endpoint at all is a reject, none on this node a drop.
            let set =
                if port.cluster_endpoints.is_empty() { &mut self.no_endpoints } else { &mut self.no_local_endpoints };
            set.insert(frontend);
        }
        if kind == FrontendKind::LoadBalancer && !port.source_ranges.is_empty() {
            self.firewall.insert(frontend, port.source_ranges.clone());
        }
    }

    /// Adds the endpoints of `port` to the hairpin set.
    pub(super) fn add_endpoints(&mut self, port: &ServicePort) {
        let endpoints = port.cluster_endpoints.iter().chain(&port.local_endpoints);
        self.hairpin.extend(endpoints.map(|e| (RealServer::from(e), port.name.protocol)));
    }

    /// Every element of the sets, both families.
    pub fn elements(&self) -> BTreeSet<HelperElement> {
        use HelperElement as E;
        let mut out = BTreeSet::new();
        out.extend(self.cluster_ips.iter().map(|k| E::ClusterIp(*k)));
        out.extend(self.masquerade_external.iter().map(|k| E::MasqueradeExternal(*k)));
        out.extend(self.hairpin.iter().map(|(r, p)| E::Hairpin(*r, *p)));
        out.extend(self.no_endpoints.iter().map(|k| E::NoEndpoints(*k)));
        out.extend(self.no_local_endpoints.iter().map(|k| E::NoLocalEndpoints(*k)));
        out.extend(self.firewall.keys().map(|k| E::Firewall(*k)));
        out.extend(self.firewall.iter().flat_map(|(k, ranges)| ranges.iter().map(|r| E::FirewallAllow(*k, r.trunc()))));
        out.extend(self.short_circuit.iter().map(|(k, (ip, port))| E::ShortCircuit(*k, *ip, *port)));
        out.extend(self.short_circuit.keys().map(|k| E::ShortCircuitFrontend(*k)));
        out.extend(self.ipvs_addresses.iter().map(|a| E::IpvsAddress(*a)));
        out.extend(self.virtual_servers.iter().map(|k| E::VirtualServer(*k)));
        out
    }

    /// The `nft -f` script that creates the table of `family` with its sets' elements.
    pub fn script(&self, family: IpFamily) -> String {
        self.script_with(family, &self.elements())
    }

    /// The `nft -f` script that creates the table of `family` holding `elements` (those of
    /// `family`), under these rules' masquerading settings.
    pub fn script_with(&self, family: IpFamily, elements: &BTreeSet<HelperElement>) -> String {
        let ip = family_keyword(family);
        let addr = match family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        };
        let frontend_type = format!("{addr} . inet_proto . inet_service");
        let mut by_set: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for element in elements.iter().filter(|e| e.family() == family) {
            by_set.entry(element.set()).or_default().push(element.text());
        }
        let mark = self.masquerade_mark;
        let pods: Vec<String> = self
            .cluster_cidrs
            .iter()
            .filter(|c| IpFamily::of(&c.addr()) == family)
            .map(|c| c.trunc().to_string())
            .collect();

        let mut out = format!("table {ip} {TABLE} {{\n");
        let with_addr = format!("{frontend_type} . {addr}");
        for set in HelperElement::SETS {
            let short_circuit = format!("{frontend_type} : {addr} . inet_service");
            let (kind, ty, flags) = match set {
                "hairpin" => ("set", with_addr.as_str(), ""),
                "firewall-allow" => ("set", with_addr.as_str(), " flags interval;"),
                "short-circuit" => ("map", short_circuit.as_str(), ""),
                "ipvs-addresses" => ("set", addr, ""),
                _ => ("set", frontend_type.as_str(), ""),
            };
            let _ = write!(out, "\t{kind} {set} {{ type {ty};{flags}");
            if let Some(elements) = by_set.get(set) {
                let _ = write!(out, " elements = {{ {} }};", elements.join(", "));
            }
            out.push_str(" }\n");
        }
        let key = format!("{ip} daddr . meta l4proto . th dport");
        // A TCP client gets a reset (an IPv6 one would retry its SYN after an ICMPv6 error),
        // others ICMP port unreachable.
        let reject = |condition: &str| {
            format!("\t\t{condition} meta l4proto tcp reject with tcp reset\n\t\t{condition} reject\n")
        };
        let filter = |name: &str, hook: &str, priority: &str, no_local: &str| {
            format!(
                "\tchain {name} {{\n\t\ttype filter hook {hook} priority {priority}; policy accept;\n{}{no_local}\
                 \t\t{key} @firewall {key} . {ip} saddr != @firewall-allow drop\n{}\t}}\n",
                reject(&format!("ct state new {key} @no-endpoints")),
                reject(&format!("ct state new {ip} daddr @ipvs-addresses {key} != @virtual-servers")),
            )
        };
        // IPVS takes new connections at LOCAL_IN (priority 98) and, from local clients, at
        // LOCAL_OUT (priority -99): the filters run before it. The node's own traffic to a Local
        // policy's external frontend is short-circuited (nat-output), never dropped for want of
        // a local endpoint.
        let no_local = format!("\t\tct state new {key} @no-local-endpoints drop\n");
        out.push_str(&filter("filter-input", "input", "filter", &no_local));
        out.push_str(&filter("filter-output", "output", "-150", ""));
        if self.drop_invalid {
            // A packet conntrack cannot place (say, a retransmission outside the window) would
            // otherwise reach the pod un-NATed, and its reset kill the connection (upstream's
            // issue 74839).
            out.push_str(
                "\tchain filter-forward {\n\t\ttype filter hook forward priority filter; policy accept;\n\
                 \t\tct state invalid drop\n\t}\n",
            );
        }
        // Pods' and the node's traffic to a Local policy's external frontend goes to its
        // ClusterIP, that is to every endpoint (the node's masqueraded, as upstream's); the
        // mark-for-masquerade jump comes first, as the DNAT ends the chain.
        let protocols = "meta l4proto { tcp, udp, sctp }";
        let dnat = format!("dnat to {key} map @short-circuit");
        let pods_short_circuit = if pods.is_empty() {
            String::new()
        } else {
            format!("\t\t{ip} saddr {{ {} }} {protocols} {dnat}\n", pods.join(", "))
        };
        let cluster_ip_masq = match (self.masquerade_all, pods.is_empty()) {
            (true, _) => format!("\t\t{key} @cluster-ips meta mark set meta mark | {mark:#x}\n"),
            (false, false) => {
                format!(
                    "\t\t{ip} saddr != {{ {} }} {key} @cluster-ips meta mark set meta mark | {mark:#x}\n",
                    pods.join(", ")
                )
            }
            (false, true) => String::new(),
        };
        let _ = write!(
            out,
            "\tchain mark-for-masquerade {{\n{cluster_ip_masq}\
             \t\t{key} @masquerade-external meta mark set meta mark | {mark:#x}\n\t}}\n\
             \tchain nat-prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\
             \t\tjump mark-for-masquerade\n{pods_short_circuit}\t}}\n\
             \tchain nat-output {{\n\t\ttype nat hook output priority -100; policy accept;\n\
             \t\tjump mark-for-masquerade\n\
             \t\t{protocols} {key} @short-circuit-frontends meta mark set meta mark | {mark:#x} {dnat}\n\t}}\n\
             \tchain nat-postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tmeta mark & {mark:#x} == {mark:#x} meta mark set meta mark ^ {mark:#x} masquerade fully-random\n\
             \t\t{ip} saddr . meta l4proto . th dport . {ip} daddr @hairpin masquerade fully-random\n\t}}\n}}\n"
        );
        out
    }
}

/// One element of a set (or map) of the helper table: what a partial sync adds or deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HelperElement {
    /// `cluster-ips`: a ClusterIP frontend.
    ClusterIp(VirtualKey),
    /// `masquerade-external`: an external frontend of a Cluster traffic policy.
    MasqueradeExternal(VirtualKey),
    /// `hairpin`: an endpoint that reaches itself through a Service is masqueraded.
    Hairpin(RealServer, Protocol),
    /// `no-endpoints`: rejected.
    NoEndpoints(VirtualKey),
    /// `no-local-endpoints`: dropped.
    NoLocalEndpoints(VirtualKey),
    /// `firewall`: a load-balancer frontend with source ranges.
    Firewall(VirtualKey),
    /// `firewall-allow`: a source range it accepts.
    FirewallAllow(VirtualKey, IpNet),
    /// `short-circuit`: an external frontend of a Local policy, and the ClusterIP and port its
    /// pods' and node's traffic goes to.
    ShortCircuit(VirtualKey, IpAddr, u16),
    /// `short-circuit-frontends`: the keys of `short-circuit`, as a set (a map cannot be
    /// matched as a set before Linux 6.x: 6.1 refuses it).
    ShortCircuitFrontend(VirtualKey),
    /// `ipvs-addresses`: an address of `kube-ipvs0`.
    IpvsAddress(IpAddr),
    /// `virtual-servers`: a virtual server (new connections to other ports of its address are
    /// rejected).
    VirtualServer(VirtualKey),
}

impl HelperElement {
    /// The sets (and the one map) of the helper table, in the order the script declares them.
    pub const SETS: [&'static str; 11] = [
        "cluster-ips",
        "masquerade-external",
        "hairpin",
        "no-endpoints",
        "no-local-endpoints",
        "firewall",
        "firewall-allow",
        "short-circuit",
        "short-circuit-frontends",
        "ipvs-addresses",
        "virtual-servers",
    ];

    /// The set it belongs to.
    pub fn set(&self) -> &'static str {
        self.placed().0
    }

    /// The family of the table that holds it.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.placed().1)
    }

    /// Its set, and the address that decides its family.
    fn placed(&self) -> (&'static str, IpAddr) {
        use HelperElement as E;
        match self {
            E::ClusterIp(k) => ("cluster-ips", k.address),
            E::MasqueradeExternal(k) => ("masquerade-external", k.address),
            E::Hairpin(real, _) => ("hairpin", real.address),
            E::NoEndpoints(k) => ("no-endpoints", k.address),
            E::NoLocalEndpoints(k) => ("no-local-endpoints", k.address),
            E::Firewall(k) => ("firewall", k.address),
            E::FirewallAllow(k, _) => ("firewall-allow", k.address),
            E::ShortCircuit(k, ..) => ("short-circuit", k.address),
            E::ShortCircuitFrontend(k) => ("short-circuit-frontends", k.address),
            E::IpvsAddress(address) => ("ipvs-addresses", *address),
            E::VirtualServer(k) => ("virtual-servers", k.address),
        }
    }

    /// What its key (and data) hold: the one place that sorts the variants by shape, for the
    /// text here and the bytes of the netlink path.
    pub fn shape(&self) -> ElementShape<'_> {
        use HelperElement as E;
        match self {
            E::ClusterIp(k)
            | E::MasqueradeExternal(k)
            | E::NoEndpoints(k)
            | E::NoLocalEndpoints(k)
            | E::Firewall(k)
            | E::ShortCircuitFrontend(k)
            | E::VirtualServer(k) => ElementShape::Frontend(k),
            E::FirewallAllow(k, range) => ElementShape::FrontendSource(k, range),
            E::ShortCircuit(k, ip, port) => ElementShape::FrontendTo(k, *ip, *port),
            E::Hairpin(real, protocol) => ElementShape::Hairpin(real, *protocol),
            E::IpvsAddress(address) => ElementShape::Address(*address),
        }
    }

    /// The element as nft writes it: `10.96.0.10 . tcp . 80`.
    pub fn text(&self) -> String {
        match self.shape() {
            ElementShape::Frontend(k) => frontend(k),
            ElementShape::FrontendSource(k, range) => format!("{} . {range}", frontend(k)),
            ElementShape::FrontendTo(k, ip, port) => format!("{} : {ip} . {port}", frontend(k)),
            ElementShape::Hairpin(r, p) => format!("{} . {} . {} . {}", r.address, p.as_str(), r.port, r.address),
            ElementShape::Address(address) => address.to_string(),
        }
    }
}

/// What a [`HelperElement`]'s key and data hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementShape<'a> {
    /// `address . protocol . port`.
    Frontend(&'a VirtualKey),
    /// `address . protocol . port . source range` (an interval).
    FrontendSource(&'a VirtualKey, &'a IpNet),
    /// `address . protocol . port : address . port` (a map element).
    FrontendTo(&'a VirtualKey, IpAddr, u16),
    /// `endpoint . protocol . port . endpoint`.
    Hairpin(&'a RealServer, Protocol),
    /// An address.
    Address(IpAddr),
}

/// The `nft -f` script of a partial sync: `removed` elements deleted from their sets, then
/// `added` ones added (empty when both are).
pub fn element_script(added: &[HelperElement], removed: &[HelperElement]) -> String {
    let mut out = String::new();
    for (verb, elements) in [("delete", removed), ("add", added)] {
        let mut by_set: BTreeMap<(IpFamily, &str), Vec<String>> = BTreeMap::new();
        for element in elements {
            by_set.entry((element.family(), element.set())).or_default().push(element.text());
        }
        for ((family, set), texts) in by_set {
            let _ = writeln!(out, "{verb} element {} {TABLE} {set} {{ {} }}", family_keyword(family), texts.join(", "));
        }
    }
    out
}

/// A frontend as an element: `10.96.0.10 . tcp . 80`.
fn frontend(key: &VirtualKey) -> String {
    format!("{} . {} . {}", key.address, key.protocol.as_str(), key.port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipvs::plan::IpvsPlan;
    use crate::ipvs::plan::tests::{ep, ipvs_cfg, node, port};

    #[test]
    fn reject_without_endpoints_drop_without_local_ones() {
        let empty = port("empty", "10.96.0.1", vec![]);
        let mut local = port("local", "10.96.0.2", vec![ep("10.244.0.11", 8080, false)]);
        local.node_port = Some(30080);
        local.external_policy_local = true;
        let served = port("served", "10.96.0.3", vec![ep("10.244.0.12", 8080, false)]);
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&empty, &local, &served]);
        let strings = |keys: &BTreeSet<VirtualKey>| keys.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(strings(&plan.helpers.no_endpoints), ["10.96.0.1:80"]);
        assert_eq!(strings(&plan.helpers.no_local_endpoints), ["10.0.0.2:30080", "192.168.77.2:30080"]);
        assert_eq!(strings(&plan.helpers.cluster_ips), ["10.96.0.1:80", "10.96.0.2:80", "10.96.0.3:80"]);
        assert!(plan.helpers.masquerade_external.is_empty(), "Local policy: the client's address is kept");
        let hairpin: Vec<String> = plan.helpers.hairpin.iter().map(|(r, p)| format!("{r}/{}", p.as_str())).collect();
        assert_eq!(hairpin, ["10.244.0.11:8080/tcp", "10.244.0.12:8080/tcp"]);
        assert_eq!(plan.helpers.virtual_servers.len(), 5);
    }

    #[test]
    fn forwarded_invalid_packets_are_dropped_unless_tcp_tracking_is_liberal() {
        let p = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let mut cfg = ipvs_cfg();
        let script = IpvsPlan::new(&cfg, &node(), [&p]).helpers.script(IpFamily::V4);
        let forward = script.split("chain filter-forward {").nth(1).expect(&script);
        assert!(forward.starts_with(
            "\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tct state invalid drop\n\t}"
        ));
        cfg.conntrack.tcp_be_liberal = true;
        let script = IpvsPlan::new(&cfg, &node(), [&p]).helpers.script(IpFamily::V4);
        assert!(!script.contains("invalid"), "{script}");
    }

    #[test]
    fn source_ranges_firewall_the_load_balancer_ips_only() {
        let mut p = port("lb", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        p.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
        p.external_ips = vec!["203.0.113.7".parse().unwrap()];
        p.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&p]);
        let firewalled: Vec<String> = plan.helpers.firewall.keys().map(ToString::to_string).collect();
        assert_eq!(firewalled, ["203.0.113.9:80"]);
        let masq: Vec<String> = plan.helpers.masquerade_external.iter().map(ToString::to_string).collect();
        assert_eq!(masq, ["203.0.113.7:80", "203.0.113.9:80"]);
        let script = plan.helpers.script(IpFamily::V4);
        assert!(
            script.contains("set firewall-allow { type ipv4_addr . inet_proto . inet_service . ipv4_addr; flags interval; elements = { 203.0.113.9 . tcp . 80 . 198.51.100.0/24 }; }"),
            "{script}"
        );
    }

    #[test]
    fn the_script_of_each_family_holds_its_own_elements() {
        let v4 = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let v6 = port("a", "fd00:96::10", vec![]);
        let mut cfg = ipvs_cfg();
        cfg.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap(), "fd00:244::/48".parse().unwrap()];
        let plan = IpvsPlan::new(&cfg, &node(), [&v4, &v6]);
        let script = plan.helpers.script(IpFamily::V4);
        for line in [
            "table ip roadkeeper-ipvs {",
            "\tset cluster-ips { type ipv4_addr . inet_proto . inet_service; elements = { 10.96.0.10 . tcp . 80 }; }",
            "\tset hairpin { type ipv4_addr . inet_proto . inet_service . ipv4_addr; elements = { 10.244.0.11 . tcp . 8080 . 10.244.0.11 }; }",
            "\tset no-endpoints { type ipv4_addr . inet_proto . inet_service; }",
            "\tset ipvs-addresses { type ipv4_addr; elements = { 10.96.0.10 }; }",
            "\t\tip saddr != { 10.244.0.0/16 } ip daddr . meta l4proto . th dport @cluster-ips meta mark set meta mark | 0x4000",
            "\t\tct state new ip daddr . meta l4proto . th dport @no-endpoints reject",
            "\t\tct state new ip daddr @ipvs-addresses ip daddr . meta l4proto . th dport != @virtual-servers reject",
            "\t\tmeta mark & 0x4000 == 0x4000 meta mark set meta mark ^ 0x4000 masquerade fully-random",
        ] {
            assert!(script.lines().any(|l| l == line), "{line:?} not in\n{script}");
        }
        let script6 = plan.helpers.script(IpFamily::V6);
        assert!(script6.contains("set no-endpoints { type ipv6_addr . inet_proto . inet_service; elements = { fd00:96::10 . tcp . 80 }; }"), "{script6}");
        assert!(script6.contains("ip6 saddr != { fd00:244::/48 }"), "{script6}");
        assert!(!script6.contains("10.96.0.10"), "{script6}");
        cfg.masquerade_all = true;
        let all = IpvsPlan::new(&cfg, &node(), [&v4]).helpers.script(IpFamily::V4);
        assert!(all.contains("\t\tip daddr . meta l4proto . th dport @cluster-ips meta mark set"), "{all}");
    }

    #[test]
    fn a_partial_sync_deletes_then_adds_elements_per_family_and_set() {
        let v4 = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let v6 = port("a", "fd00:96::10", vec![]);
        let plan = IpvsPlan::new(&ipvs_cfg(), &node(), [&v4, &v6]);
        let elements: Vec<HelperElement> = plan.helpers.elements().into_iter().collect();
        let (added, removed): (Vec<HelperElement>, Vec<HelperElement>) =
            elements.iter().partition(|e| e.family() == IpFamily::V4);
        let script = element_script(&added, &removed);
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(
            lines,
            [
                "delete element ip6 roadkeeper-ipvs cluster-ips { fd00:96::10 . tcp . 80 }",
                "delete element ip6 roadkeeper-ipvs ipvs-addresses { fd00:96::10 }",
                "delete element ip6 roadkeeper-ipvs no-endpoints { fd00:96::10 . tcp . 80 }",
                "delete element ip6 roadkeeper-ipvs virtual-servers { fd00:96::10 . tcp . 80 }",
                "add element ip roadkeeper-ipvs cluster-ips { 10.96.0.10 . tcp . 80 }",
                "add element ip roadkeeper-ipvs hairpin { 10.244.0.11 . tcp . 8080 . 10.244.0.11 }",
                "add element ip roadkeeper-ipvs ipvs-addresses { 10.96.0.10 }",
                "add element ip roadkeeper-ipvs virtual-servers { 10.96.0.10 . tcp . 80 }",
            ]
        );
        assert!(element_script(&[], &[]).is_empty());
    }

    #[test]
    fn pods_and_the_node_reach_a_local_policys_external_frontends_through_the_cluster_ip() {
        let mut p = port("local", "10.96.0.2", vec![ep("10.244.0.11", 8080, false)]);
        p.node_port = Some(30080);
        p.external_policy_local = true;
        let mut cfg = ipvs_cfg();
        cfg.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        let plan = IpvsPlan::new(&cfg, &node(), [&p]);
        let targets: Vec<String> =
            plan.helpers.short_circuit.iter().map(|(k, (ip, port))| format!("{k} {ip}:{port}")).collect();
        assert_eq!(targets, ["10.0.0.2:30080 10.96.0.2:80", "192.168.77.2:30080 10.96.0.2:80"]);
        let script = plan.helpers.script(IpFamily::V4);
        for line in [
            "\tmap short-circuit { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; elements = { 10.0.0.2 . tcp . 30080 : 10.96.0.2 . 80, 192.168.77.2 . tcp . 30080 : 10.96.0.2 . 80 }; }",
            "\t\tip saddr { 10.244.0.0/16 } meta l4proto { tcp, udp, sctp } dnat to ip daddr . meta l4proto . th dport map @short-circuit",
            "\t\tmeta l4proto { tcp, udp, sctp } ip daddr . meta l4proto . th dport @short-circuit-frontends meta mark set meta mark | 0x4000 dnat to ip daddr . meta l4proto . th dport map @short-circuit",
            "\t\tct state new ip daddr . meta l4proto . th dport @no-endpoints meta l4proto tcp reject with tcp reset",
        ] {
            assert!(script.lines().any(|l| l == line), "{line:?} not in\n{script}");
        }
        let output = script.split("chain filter-output").nth(1).unwrap().split("chain ").next().unwrap();
        assert!(!output.contains("no-local-endpoints"), "the node's own traffic is short-circuited: {output}");
    }
}
