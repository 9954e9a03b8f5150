//! Plans one Service's share of the nftables ruleset: its chains and the elements it adds to the
//! shared dispatch maps. Pure: the same inputs always give the same objects.

use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::{Container, Objects, Selection, Value};
use super::rule::{Action, AffinityKey, ElementKey, Match, Rule, Verdict};
use crate::hash::nft_hash;
use crate::table::{Endpoint, ServicePort};
use crate::text;

/// What the planner needs to know beyond the service ports themselves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanContext {
    /// Pod CIDRs of this family: the local-traffic detector.
    pub cluster_cidrs: Vec<IpNet>,
    /// Node IPs (a node IP inside loadBalancerSourceRanges lets LB IPs through as sources).
    pub node_ips: Vec<IpAddr>,
}

/// Names of the per-service-port chains, as upstream spells them.
struct ChainNames {
    base: String,
    cluster: String,
    local: String,
    external: String,
    firewall: String,
}

impl ChainNames {
    /// Upstream's names, hashed from the exact base; the readable tail is made an nft identifier
    /// (see [`text::identifier`]) whatever the Service and port are called.
    fn new(sp: &ServicePort) -> ChainNames {
        let base = format!("{}/{}/{}", sp.name.service, sp.name.protocol.as_str(), sp.name.port);
        let hash = nft_hash(&base);
        let name = |kind: &str| text::identifier(&format!("{kind}-{hash}-"), &base);
        ChainNames {
            cluster: name("service"),
            local: name("local"),
            external: name("external"),
            firewall: name("firewall"),
            base,
        }
    }

    /// `endpoint-<H>-ns/svc/proto/port__IP/port`; IPv6 colons become dots (nft identifiers).
    fn endpoint(&self, ep: &Endpoint) -> String {
        let ip = ep.ip.to_string().replace(':', ".");
        let base = format!("{}__{ip}/{}", self.base, ep.port);
        text::identifier(&format!("endpoint-{}-", nft_hash(&base)), &base)
    }
}

/// Plans the objects of every port of one Service (both families).
pub fn plan_service(ports: &[ServicePort], ctx: &PlanContext) -> Objects {
    let mut objects = Objects::default();
    for sp in ports {
        plan_port(sp, ctx, &mut objects);
    }
    objects
}

/// Plans one service port in one family.
///
/// Most ports are data only: elements of the shared sets and maps, which the layout's fixed
/// rules look up (`frontend . index -> endpoint` maps, the endpoint-count sets, the
/// masquerading classes, reject and drop sets). A change of their endpoints or a new Service adds
/// no rule and no jump, so the kernel never re-validates the table for it: its cost does not
/// grow with the number of Services. Ports with session affinity keep chains of their own
/// (upstream's layout: a chain per endpoint, which records the client in the shared affinity
/// set), reached through the `service-ips` and `service-nodeports` verdict maps.
fn plan_port(sp: &ServicePort, ctx: &PlanContext, out: &mut Objects) {
    let fam = sp.family;
    let comment = sp.name.to_string();
    let proto = sp.name.protocol;
    let addr_key = |addr: &IpAddr| ElementKey::AddrProtoPort(*addr, proto, sp.port);
    let has_endpoints = !sp.cluster_endpoints.is_empty();

    if let Some(cluster_ip) = sp.cluster_ip {
        out.element(fam, Container::ClusterIps, ElementKey::Addr(cluster_ip), None, &sp.name.service.to_string());
        if sp.internal_endpoints().is_empty() {
            let container = if has_endpoints { Container::DropServices } else { Container::RejectServices };
            out.element(fam, container, addr_key(&cluster_ip), None, &comment);
        }
    }
    // External frontends without endpoints for them: rejected when the Service has none at all,
    // dropped when it has some but none here (policy Local).
    if sp.external_endpoints().is_empty() {
        let (services, node_ports) = if has_endpoints {
            (Container::DropServices, Container::DropNodePorts)
        } else {
            (Container::RejectServices, Container::RejectNodePorts)
        };
        for addr in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
            out.element(fam, services, addr_key(addr), None, &comment);
        }
        if let Some(node_port) = sp.node_port {
            out.element(fam, node_ports, ElementKey::ProtoPort(proto, node_port), None, &comment);
        }
    }
    // Hairpin: an endpoint reaching itself through the Service is masqueraded.
    for ep in sp.cluster_endpoints.iter().chain(&sp.local_endpoints) {
        out.element(fam, Container::Hairpin, ElementKey::AddrPair(ep.ip, ep.ip), None, "");
    }
    firewall(sp, ctx, out);
    if sp.affinity_timeout.is_some() {
        plan_chains(sp, ctx, out);
    } else {
        plan_data(sp, out);
    }
}

/// The elements that list `endpoints` for a frontend in `selection`'s map and count set.
fn endpoint_list(
    sp: &ServicePort,
    selection: Selection,
    frontend: Frontend,
    endpoints: &[Endpoint],
    out: &mut Objects,
) {
    if endpoints.is_empty() {
        return;
    }
    let comment = sp.name.to_string();
    let proto = sp.name.protocol;
    for (i, ep) in endpoints.iter().enumerate() {
        let key = match frontend {
            Frontend::Address(addr) => ElementKey::AddrProtoPortIndex(addr, proto, sp.port, i as u32),
            Frontend::NodePort(port) => ElementKey::ProtoPortIndex(proto, port, i as u32),
        };
        out.element(sp.family, Container::Endpoints(selection), key, Some(Value::Endpoint(ep.ip, ep.port)), &comment);
    }
    let key = match frontend {
        Frontend::Address(addr) => ElementKey::AddrProtoPort(addr, proto, sp.port),
        Frontend::NodePort(port) => ElementKey::ProtoPort(proto, port),
    };
    out.element(sp.family, Container::Count(selection, endpoints.len() as u32), key, None, &comment);
}

/// A frontend of a service port: an address (with the port's own port) or a NodePort.
#[derive(Clone, Copy)]
enum Frontend {
    Address(IpAddr),
    NodePort(u16),
}

/// The data path of a port without session affinity.
fn plan_data(sp: &ServicePort, out: &mut Objects) {
    let fam = sp.family;
    let comment = sp.name.to_string();
    let proto = sp.name.protocol;
    if let Some(cluster_ip) = sp.cluster_ip {
        endpoint_list(sp, Selection::Service, Frontend::Address(cluster_ip), sp.internal_endpoints(), out);
    }
    if sp.cluster_endpoints.is_empty() {
        return;
    }
    let addresses: Vec<Frontend> =
        sp.external_ips.iter().chain(&sp.load_balancer_ips).map(|a| Frontend::Address(*a)).collect();
    let node_port = sp.node_port.map(Frontend::NodePort);
    for frontend in addresses.iter().copied().chain(node_port) {
        let (by_address, key) = match frontend {
            Frontend::Address(addr) => (true, ElementKey::AddrProtoPort(addr, proto, sp.port)),
            Frontend::NodePort(port) => (false, ElementKey::ProtoPort(proto, port)),
        };
        let (own, cluster) = if by_address {
            (Selection::Service, Selection::ServiceCluster)
        } else {
            (Selection::NodePort, Selection::NodePortCluster)
        };
        if sp.external_policy_local {
            // Pods and the host reach the Cluster list; the rest the Local one, if any.
            let class = if by_address { Container::LocalServices } else { Container::LocalNodePorts };
            out.element(fam, class, key, None, &comment);
            endpoint_list(sp, cluster, frontend, &sp.cluster_endpoints, out);
            endpoint_list(sp, own, frontend, &sp.local_endpoints, out);
        } else {
            let class = if by_address { Container::ExternalServices } else { Container::ExternalNodePorts };
            out.element(fam, class, key, None, &comment);
            endpoint_list(sp, own, frontend, &sp.cluster_endpoints, out);
        }
    }
}

/// The source-range firewall of load-balancer IPs (NodePorts are not filtered).
fn firewall(sp: &ServicePort, ctx: &PlanContext, out: &mut Objects) {
    if sp.source_ranges.is_empty() || sp.load_balancer_ips.is_empty() {
        return;
    }
    let fam = sp.family;
    let comment = sp.name.to_string();
    let names = ChainNames::new(sp);
    let when = |m: Match, action: Action| Rule::when(fam, vec![m], action, &comment);
    let mut rules: Vec<Rule> = sp.source_ranges.iter().map(|r| when(Match::SaddrIn(*r), Action::Return)).collect();
    let node_in_range = ctx.node_ips.iter().any(|n| sp.source_ranges.iter().any(|r| r.contains(n)));
    if node_in_range {
        rules.extend(sp.load_balancer_ips.iter().map(|lb| when(Match::SaddrIs(*lb), Action::Return)));
    }
    rules.push(Rule::always(fam, Action::Drop, &comment));
    out.chain(fam, names.firewall.clone(), rules);
    for lb in &sp.load_balancer_ips {
        out.element(
            fam,
            Container::FirewallIps,
            ElementKey::AddrProtoPort(*lb, sp.name.protocol, sp.port),
            Some(Value::Verdict(Verdict::Jump(names.firewall.clone()))),
            &comment,
        );
    }
}

/// The chain path of a port with session affinity: upstream's layout of a chain per endpoint
/// set and per endpoint; the endpoint chains record the client in the shared affinity set.
fn plan_chains(sp: &ServicePort, ctx: &PlanContext, out: &mut Objects) {
    let fam = sp.family;
    let names = ChainNames::new(sp);
    let comment = sp.name.to_string();
    let always = |action: Action| Rule::always(fam, action, &comment);
    let when = |m: Match, action: Action| Rule::when(fam, vec![m], action, &comment);
    let proto = sp.name.protocol;
    let port_key = |addr: &IpAddr| ElementKey::AddrProtoPort(*addr, proto, sp.port);
    let goto = |chain: &str| Some(Value::Verdict(Verdict::Goto(chain.to_string())));

    // Endpoint chains (for every endpoint either set may use).
    let mut all_eps: Vec<&Endpoint> = sp.cluster_endpoints.iter().chain(&sp.local_endpoints).collect();
    all_eps.sort();
    all_eps.dedup();
    for ep in &all_eps {
        let mut rules = Vec::new();
        if let Some(timeout_secs) = sp.affinity_timeout {
            rules.push(always(Action::UpdateAffinity { key: affinity_key(sp, ep), timeout_secs }));
        }
        rules.push(always(Action::Dnat { protocol: proto, ip: ep.ip, port: ep.port }));
        out.chain(fam, names.endpoint(ep), rules);
    }

    // The Cluster endpoint set (service-...) and the Local one (local-...). Traffic to the
    // ClusterIP is masqueraded by the layout (`ip daddr @cluster-ips`), for every Service.
    if !sp.cluster_endpoints.is_empty() {
        out.chain(fam, names.cluster.clone(), selection_rules(sp, &names, &sp.cluster_endpoints));
    }
    let uses_local = sp.internal_policy_local || sp.external_policy_local;
    if uses_local && !sp.local_endpoints.is_empty() {
        out.chain(fam, names.local.clone(), selection_rules(sp, &names, &sp.local_endpoints));
    }

    if let Some(cluster_ip) = sp.cluster_ip
        && !sp.internal_endpoints().is_empty()
    {
        let target = if sp.internal_policy_local { &names.local } else { &names.cluster };
        out.element(fam, Container::ServiceIps, port_key(&cluster_ip), goto(target), &comment);
    }

    // External frontends: NodePort, externalIPs, load-balancer IPs. As upstream: with any
    // endpoint at all, external frontends go to the external chain, which short-circuits pod and
    // host traffic to the Cluster set even when the Local set is empty; whatever falls through
    // (external traffic without a local endpoint) is not DNATed and is dropped by @drop-services
    // / @drop-nodeports.
    if !sp.has_external_frontends() || sp.cluster_endpoints.is_empty() {
        return;
    }
    let mut rules = if sp.external_policy_local {
        let mut rules: Vec<Rule> = ctx
            .cluster_cidrs
            .iter()
            .map(|cidr| when(Match::SaddrIn(*cidr), Action::Goto(names.cluster.clone())))
            .collect();
        rules.push(when(Match::FibSaddrLocal, Action::Jump("mark-for-masquerade".into())));
        rules.push(when(Match::FibSaddrLocal, Action::Goto(names.cluster.clone())));
        rules
    } else {
        vec![always(Action::Jump("mark-for-masquerade".into()))]
    };
    if !sp.external_endpoints().is_empty() {
        let policy_chain = if sp.external_policy_local { &names.local } else { &names.cluster };
        rules.push(always(Action::Goto(policy_chain.clone())));
    }
    out.chain(fam, names.external.clone(), rules);
    for addr in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
        out.element(fam, Container::ServiceIps, port_key(addr), goto(&names.external), &comment);
    }
    if let Some(node_port) = sp.node_port {
        let key = ElementKey::ProtoPort(proto, node_port);
        out.element(fam, Container::ServiceNodePorts, key, goto(&names.external), &comment);
    }
}

/// The affinity entry of endpoint `ep` of port `sp` (see [`AffinityKey`]).
fn affinity_key(sp: &ServicePort, ep: &Endpoint) -> AffinityKey {
    AffinityKey {
        endpoint: ep.ip,
        endpoint_port: ep.port,
        service: sp.cluster_ip.unwrap_or(sp.family.unspecified()),
        service_port: sp.port,
    }
}

/// The rules of an endpoint-set chain: affinity lookups, then a uniform random pick among `eps`.
///
/// The pick is a ladder, as iptables' statistic rules: endpoint i of n is taken with probability
/// 1/(n-i), the last unconditionally.
fn selection_rules(sp: &ServicePort, names: &ChainNames, eps: &[Endpoint]) -> Vec<Rule> {
    let comment = sp.name.to_string();
    let mut rules = Vec::new();
    if sp.affinity_timeout.is_some() {
        for ep in eps {
            let m = Match::Affinity(affinity_key(sp, ep));
            rules.push(Rule::when(sp.family, vec![m], Action::Goto(names.endpoint(ep)), &comment));
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let matches = if i + 1 == n { Vec::new() } else { vec![Match::Random { modulus: (n - i) as u32, value: 0 }] };
        rules.push(Rule::when(sp.family, matches, Action::Goto(names.endpoint(ep)), &comment));
    }
    rules
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;

    use super::*;
    use crate::table::{IpFamily, Protocol};

    /// An `externalTrafficPolicy: Local` port with an externalIP and a NodePort, whose endpoints
    /// (if any) run on other nodes.
    fn local_policy_port(endpoints: Vec<Endpoint>) -> ServicePort {
        let web = NamespacedName::new("default", "web");
        ServicePort {
            node_port: Some(30080),
            external_ips: vec!["203.0.113.7".parse().unwrap()],
            external_policy_local: true,
            ..ServicePort::for_test(web, Protocol::Tcp, "10.96.0.80".parse().unwrap(), 80, endpoints)
        }
    }

    fn plan(sp: ServicePort) -> Objects {
        let ctx = PlanContext { cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()], ..PlanContext::default() };
        plan_service(&[sp], &ctx)
    }

    /// Whether the element `key` is in `container` (v4), and what it maps to.
    fn value(objects: &Objects, container: Container, key: &str) -> Option<String> {
        objects
            .elements
            .iter()
            .find(|((fam, c, k), _)| *fam == IpFamily::V4 && *c == container && k.to_string() == key)
            .map(|(_, v)| v.value.as_ref().map(ToString::to_string).unwrap_or_default())
    }

    fn endpoint(ip: &str, is_local: bool) -> Endpoint {
        Endpoint { ip: ip.parse().unwrap(), port: 8080, is_local }
    }

    #[test]
    fn a_service_without_affinity_is_data_only() {
        let mut sp = local_policy_port(vec![endpoint("10.244.0.11", true), endpoint("10.244.0.12", false)]);
        sp.external_policy_local = false;
        let objects = plan(sp);
        assert!(objects.chains.is_empty(), "{objects:?}");
        let endpoints = Container::Endpoints(Selection::Service);
        assert_eq!(value(&objects, endpoints, "10.96.0.80 . tcp . 80 . 0").as_deref(), Some("10.244.0.11 . 8080"));
        assert_eq!(value(&objects, endpoints, "10.96.0.80 . tcp . 80 . 1").as_deref(), Some("10.244.0.12 . 8080"));
        assert_eq!(
            value(&objects, Container::Count(Selection::Service, 2), "10.96.0.80 . tcp . 80").as_deref(),
            Some("")
        );
        assert_eq!(value(&objects, endpoints, "203.0.113.7 . tcp . 80 . 1").as_deref(), Some("10.244.0.12 . 8080"));
        assert!(value(&objects, Container::ExternalServices, "203.0.113.7 . tcp . 80").is_some());
        let node_ports = Container::Endpoints(Selection::NodePort);
        assert_eq!(value(&objects, node_ports, "tcp . 30080 . 0").as_deref(), Some("10.244.0.11 . 8080"));
        assert!(value(&objects, Container::Count(Selection::NodePort, 2), "tcp . 30080").is_some());
        assert!(value(&objects, Container::ExternalNodePorts, "tcp . 30080").is_some());
        assert!(value(&objects, Container::Hairpin, "10.244.0.12 . 10.244.0.12").is_some());
        assert!(
            !objects.elements.keys().any(|(_, c, _)| matches!(c, Container::ServiceIps | Container::ServiceNodePorts))
        );
    }

    #[test]
    fn affinity_services_keep_chains_of_their_own() {
        let mut sp = local_policy_port(vec![endpoint("10.244.0.11", true)]);
        sp.external_policy_local = false;
        sp.affinity_timeout = Some(60);
        let objects = plan(sp);
        let service = format!("service-{}-default/web/tcp/", nft_hash("default/web/tcp/"));
        assert_eq!(value(&objects, Container::ServiceIps, "10.96.0.80 . tcp . 80"), Some(format!("goto {service}")));
        // The endpoint chain records the client; the endpoint-set chain looks it up first.
        let rules = |prefix: &str| -> Vec<String> {
            let (_, rules) = objects.chains.iter().find(|((_, name), _)| name.starts_with(prefix)).unwrap();
            rules.iter().map(|r| r.to_string()).collect()
        };
        let key = "10.244.0.11 . 8080 . 10.96.0.80 . 80";
        assert_eq!(
            rules("endpoint-")[0],
            format!("update @affinity {{ ip saddr . {key} timeout 1m }} comment \"default/web\"")
        );
        assert!(rules("service-")[0].starts_with(&format!("ip saddr . {key} @affinity goto endpoint-")));
        assert!(!objects.elements.keys().any(|(_, c, _)| matches!(c, Container::Endpoints(_) | Container::Count(..))));
        assert!(value(&objects, Container::Hairpin, "10.244.0.11 . 10.244.0.11").is_some());
    }

    #[test]
    fn local_policy_without_local_endpoints_short_circuits_pods_and_drops_the_rest() {
        let objects = plan(local_policy_port(vec![endpoint("10.244.0.11", false)]));
        assert!(value(&objects, Container::LocalServices, "203.0.113.7 . tcp . 80").is_some());
        assert!(value(&objects, Container::LocalNodePorts, "tcp . 30080").is_some());
        assert!(value(&objects, Container::DropServices, "203.0.113.7 . tcp . 80").is_some());
        assert!(value(&objects, Container::DropNodePorts, "tcp . 30080").is_some());
        // Pods and the host get the Cluster list; nothing is in the (empty) Local one.
        let cluster = Container::Endpoints(Selection::ServiceCluster);
        assert_eq!(value(&objects, cluster, "203.0.113.7 . tcp . 80 . 0").as_deref(), Some("10.244.0.11 . 8080"));
        let node_port_cluster = Container::Endpoints(Selection::NodePortCluster);
        assert_eq!(value(&objects, node_port_cluster, "tcp . 30080 . 0").as_deref(), Some("10.244.0.11 . 8080"));
        assert!(value(&objects, Container::Endpoints(Selection::Service), "203.0.113.7 . tcp . 80 . 0").is_none());
        assert!(value(&objects, Container::Endpoints(Selection::NodePort), "tcp . 30080 . 0").is_none());
        // The ClusterIP keeps the Cluster list (internal policy Cluster).
        let own = Container::Endpoints(Selection::Service);
        assert_eq!(value(&objects, own, "10.96.0.80 . tcp . 80 . 0").as_deref(), Some("10.244.0.11 . 8080"));
    }

    #[test]
    fn external_frontends_without_any_endpoint_reject() {
        let objects = plan(local_policy_port(Vec::new()));
        assert!(value(&objects, Container::RejectServices, "203.0.113.7 . tcp . 80").is_some());
        assert!(value(&objects, Container::RejectServices, "10.96.0.80 . tcp . 80").is_some());
        assert!(value(&objects, Container::RejectNodePorts, "tcp . 30080").is_some());
        assert!(value(&objects, Container::LocalServices, "203.0.113.7 . tcp . 80").is_none());
        assert!(!objects.elements.keys().any(|(_, c, _)| matches!(c, Container::Endpoints(_) | Container::Count(..))));
    }

    #[test]
    fn internal_policy_local_without_local_endpoints_drops_cluster_ip_traffic() {
        let mut sp = local_policy_port(vec![endpoint("10.244.0.11", false)]);
        sp.external_policy_local = false;
        sp.internal_policy_local = true;
        let objects = plan(sp);
        assert!(value(&objects, Container::DropServices, "10.96.0.80 . tcp . 80").is_some());
        assert!(value(&objects, Container::Endpoints(Selection::Service), "10.96.0.80 . tcp . 80 . 0").is_none());
        let external = Container::Endpoints(Selection::Service);
        assert_eq!(value(&objects, external, "203.0.113.7 . tcp . 80 . 0").as_deref(), Some("10.244.0.11 . 8080"));
    }
}
