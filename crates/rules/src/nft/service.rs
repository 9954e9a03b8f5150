//! Plans one Service's share of the nftables ruleset: its chains, affinity sets and the elements
//! it adds to the shared dispatch maps. Pure: the same inputs always give the same objects.

use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::{Container, Objects};
use super::rule::{Action, AffinitySet, ElementKey, Match, Rule, Verdict};
use crate::hash::nft_hash;
use crate::table::{Endpoint, ServicePort};
use crate::text;

/// What the planner needs to know beyond the service ports themselves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanContext {
    /// Pod CIDRs of this family: the local-traffic detector.
    pub cluster_cidrs: Vec<IpNet>,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
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

    /// The affinity set of an endpoint; the timeout is part of the hash so a changed timeout
    /// yields a new set rather than an in-place redefinition.
    fn affinity(&self, ep: &Endpoint, timeout: u32) -> String {
        let ip = ep.ip.to_string().replace(':', ".");
        let base = format!("{}__{ip}/{}", self.base, ep.port);
        format!("affinity-{}", nft_hash(&format!("{base}/{timeout}")))
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
fn plan_port(sp: &ServicePort, ctx: &PlanContext, out: &mut Objects) {
    let fam = sp.family;
    let names = ChainNames::new(sp);
    let comment = sp.name.to_string();
    let always = |action: Action| Rule::always(fam, action, &comment);
    let when = |m: Match, action: Action| Rule::when(fam, vec![m], action, &comment);
    let proto = sp.name.protocol;
    let port_key = |addr: &IpAddr| ElementKey::AddrProtoPort(*addr, proto, sp.port);
    let goto = |chain: &str| Some(Verdict::Goto(chain.to_string()));

    // Endpoint chains (for every endpoint either set may use).
    let mut all_eps: Vec<&Endpoint> = sp.cluster_endpoints.iter().chain(&sp.local_endpoints).collect();
    all_eps.sort();
    all_eps.dedup();
    for ep in &all_eps {
        let mut rules = vec![when(Match::SaddrIs(ep.ip), Action::Jump("mark-for-masquerade".into()))];
        if let Some(timeout) = sp.affinity_timeout {
            let set = names.affinity(ep, timeout);
            out.sets.insert((fam, set.clone()), AffinitySet { timeout_secs: timeout, comment: comment.clone() });
            rules.push(always(Action::UpdateSaddr(set)));
        }
        rules.push(always(Action::Dnat { protocol: proto, ip: ep.ip, port: ep.port }));
        out.chain(fam, names.endpoint(ep), rules);
    }

    // The Cluster endpoint set (service-...) and the Local one (local-...). As upstream, the chain
    // that ClusterIP traffic enters (the internal-traffic chain) first masquerades traffic to the
    // ClusterIP: all of it with --masquerade-all, else what does not come from a pod. Keyed on the
    // destination, so that external traffic short-circuited to these chains keeps its source.
    let masquerade_cluster_ip = sp.cluster_ip.and_then(|ip| {
        let helper = if ctx.masquerade_all {
            "mark-for-masquerade"
        } else if !ctx.cluster_cidrs.is_empty() {
            "mark-if-not-pod-traffic"
        } else {
            return None;
        };
        Some(when(Match::DaddrIs(ip), Action::Jump(helper.into())))
    });
    let endpoint_set = |internal: bool, eps: &[Endpoint]| {
        let mut rules: Vec<Rule> = masquerade_cluster_ip.iter().filter(|_| internal).cloned().collect();
        rules.extend(selection_rules(sp, &names, eps));
        rules
    };
    if !sp.cluster_endpoints.is_empty() {
        out.chain(fam, names.cluster.clone(), endpoint_set(!sp.internal_policy_local, &sp.cluster_endpoints));
    }
    let uses_local = sp.internal_policy_local || sp.external_policy_local;
    if uses_local && !sp.local_endpoints.is_empty() {
        out.chain(fam, names.local.clone(), endpoint_set(sp.internal_policy_local, &sp.local_endpoints));
    }

    // ClusterIP frontend.
    if let Some(cluster_ip) = sp.cluster_ip {
        out.element(fam, Container::ClusterIps, ElementKey::Addr(cluster_ip), None, &sp.name.service.to_string());
        let target = if sp.internal_policy_local { &names.local } else { &names.cluster };
        if !sp.internal_endpoints().is_empty() {
            out.element(fam, Container::ServiceIps, port_key(&cluster_ip), goto(target), &comment);
        } else {
            let verdict = if sp.cluster_endpoints.is_empty() { goto("reject-chain") } else { Some(Verdict::Drop) };
            out.element(fam, Container::NoEndpointServices, port_key(&cluster_ip), verdict, &comment);
        }
    }

    // External frontends: NodePort, externalIPs, load-balancer IPs.
    if !sp.has_external_frontends() {
        return;
    }
    // As upstream: with any endpoint at all, external frontends go to the external chain, which
    // short-circuits pod and host traffic to the Cluster set even when the Local set is empty;
    // whatever falls through (external traffic without a local endpoint) is not DNATed and is
    // dropped by @no-endpoint-services / @no-endpoint-nodeports.
    let has_endpoints = !sp.cluster_endpoints.is_empty();
    let external_ok = !sp.external_endpoints().is_empty();
    if has_endpoints {
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
        if external_ok {
            let policy_chain = if sp.external_policy_local { &names.local } else { &names.cluster };
            rules.push(always(Action::Goto(policy_chain.clone())));
        }
        out.chain(fam, names.external.clone(), rules);
    }
    let no_endpoint_verdict = if has_endpoints { Some(Verdict::Drop) } else { goto("reject-chain") };
    let frontend_ips = sp.external_ips.iter().chain(&sp.load_balancer_ips);
    for addr in frontend_ips {
        if has_endpoints {
            out.element(fam, Container::ServiceIps, port_key(addr), goto(&names.external), &comment);
        }
        if !external_ok {
            out.element(fam, Container::NoEndpointServices, port_key(addr), no_endpoint_verdict.clone(), &comment);
        }
    }
    if let Some(node_port) = sp.node_port {
        let key = ElementKey::ProtoPort(proto, node_port);
        if has_endpoints {
            out.element(fam, Container::ServiceNodePorts, key.clone(), goto(&names.external), &comment);
        }
        if !external_ok {
            out.element(fam, Container::NoEndpointNodePorts, key, no_endpoint_verdict.clone(), &comment);
        }
    }

    // loadBalancerSourceRanges: only LB-IP traffic is filtered, NodePorts are not.
    if !sp.source_ranges.is_empty() && !sp.load_balancer_ips.is_empty() {
        let mut rules: Vec<Rule> = sp.source_ranges.iter().map(|r| when(Match::SaddrIn(*r), Action::Return)).collect();
        let node_in_range = ctx.node_ips.iter().any(|n| sp.source_ranges.iter().any(|r| r.contains(n)));
        if node_in_range {
            rules.extend(sp.load_balancer_ips.iter().map(|lb| when(Match::SaddrIs(*lb), Action::Return)));
        }
        rules.push(always(Action::Drop));
        out.chain(fam, names.firewall.clone(), rules);
        for lb in &sp.load_balancer_ips {
            out.element(
                fam,
                Container::FirewallIps,
                port_key(lb),
                Some(Verdict::Jump(names.firewall.clone())),
                &comment,
            );
        }
    }
}

/// The rules of an endpoint-set chain: affinity lookups, then a uniform random pick among `eps`.
///
/// The pick is a ladder, as iptables' statistic rules: endpoint i of n is taken with probability
/// 1/(n-i), the last unconditionally. It needs no set at all: a per-Service anonymous map would
/// grow the kernel's per-table set list (kubernetes#139513), and one shared map referenced from
/// every Service chain makes the kernel's transaction validation walk that map once per
/// reference (quadratic; measured 4 s per commit at 2,000 Services).
fn selection_rules(sp: &ServicePort, names: &ChainNames, eps: &[Endpoint]) -> Vec<Rule> {
    let comment = sp.name.to_string();
    let mut rules = Vec::new();
    if let Some(timeout) = sp.affinity_timeout {
        for ep in eps {
            let m = Match::SaddrInSet(names.affinity(ep, timeout));
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

    fn value(objects: &Objects, container: Container, key: &str) -> Option<String> {
        objects
            .elements
            .iter()
            .find(|((fam, c, k), _)| *fam == IpFamily::V4 && *c == container && k.to_string() == key)
            .map(|(_, v)| v.verdict.as_ref().map(ToString::to_string).unwrap_or_default())
    }

    #[test]
    fn local_policy_without_local_endpoints_short_circuits_pods_and_drops_the_rest() {
        let remote = Endpoint { ip: "10.244.0.11".parse().unwrap(), port: 8080, is_local: false };
        let objects = plan(local_policy_port(vec![remote]));
        let external = &format!("external-{}-default/web/tcp/", nft_hash("default/web/tcp/"));
        assert_eq!(value(&objects, Container::ServiceIps, "203.0.113.7 . tcp . 80"), Some(format!("goto {external}")));
        assert_eq!(value(&objects, Container::ServiceNodePorts, "tcp . 30080"), Some(format!("goto {external}")));
        assert_eq!(value(&objects, Container::NoEndpointServices, "203.0.113.7 . tcp . 80").as_deref(), Some("drop"));
        assert_eq!(value(&objects, Container::NoEndpointNodePorts, "tcp . 30080").as_deref(), Some("drop"));
        let rules: Vec<String> =
            objects.chains[&(IpFamily::V4, external.to_string())].iter().map(ToString::to_string).collect();
        assert!(rules[0].starts_with("ip saddr 10.244.0.0/16 goto service-"), "{rules:?}");
        assert!(!rules.iter().any(|r| r.contains("local-")), "nothing falls through to the empty Local set: {rules:?}");
    }

    fn chain_rules(objects: &Objects, prefix: &str) -> Vec<String> {
        let (_, rules) = objects.chains.iter().find(|((_, name), _)| name.starts_with(prefix)).expect(prefix);
        rules.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_internal_traffic_chain_masquerades_cluster_ip_traffic_not_from_pods() {
        let local = Endpoint { ip: "10.244.0.11".parse().unwrap(), port: 8080, is_local: true };
        let mut sp = local_policy_port(vec![local.clone()]);
        sp.local_endpoints = vec![local];
        sp.external_policy_local = false;
        sp.internal_policy_local = true;
        let objects = plan(sp.clone());
        let masquerade = "ip daddr 10.96.0.80 jump mark-if-not-pod-traffic comment \"default/web\"";
        assert_eq!(chain_rules(&objects, "local-")[0], masquerade);
        assert!(!chain_rules(&objects, "service-").iter().any(|r| r.contains("mark-if-not-pod")));

        sp.internal_policy_local = false;
        let objects = plan(sp.clone());
        assert_eq!(chain_rules(&objects, "service-")[0], masquerade);

        let ctx = PlanContext { masquerade_all: true, ..PlanContext::default() };
        let objects = plan_service(&[sp.clone()], &ctx);
        let rules = chain_rules(&objects, "service-");
        assert_eq!(rules[0], "ip daddr 10.96.0.80 jump mark-for-masquerade comment \"default/web\"");
        assert_eq!(rules.iter().filter(|r| r.contains("mark-for-masquerade")).count(), 1, "{rules:?}");

        let objects = plan_service(&[sp], &PlanContext::default());
        assert!(!chain_rules(&objects, "service-").iter().any(|r| r.contains("mark-")), "no detector, no masquerade");
    }

    #[test]
    fn external_frontends_without_any_endpoint_reject() {
        let objects = plan(local_policy_port(Vec::new()));
        assert_eq!(value(&objects, Container::ServiceIps, "203.0.113.7 . tcp . 80"), None);
        assert_eq!(
            value(&objects, Container::NoEndpointServices, "203.0.113.7 . tcp . 80").as_deref(),
            Some("goto reject-chain")
        );
        assert_eq!(
            value(&objects, Container::NoEndpointNodePorts, "tcp . 30080").as_deref(),
            Some("goto reject-chain")
        );
        assert!(!objects.chains.keys().any(|(_, name)| name.starts_with("external-")));
    }
}
