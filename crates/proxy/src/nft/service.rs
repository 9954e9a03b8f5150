//! Plans one Service's share of the nftables ruleset: its chains, affinity sets and the elements
//! it adds to the shared dispatch maps. Pure: the same inputs always give the same objects.

use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::{Container, Objects, OwnedSet, family_keyword};
use super::slots::{BLOCK_SIZE, SlotAllocator};
use crate::hash::nft_hash;
use crate::table::{Endpoint, IpFamily, ServicePort};

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
    fn new(sp: &ServicePort) -> ChainNames {
        let base = format!("{}/{}/{}", sp.name.service, sp.name.protocol.as_str(), sp.name.port);
        let suffix = format!("{}-{base}", nft_hash(&base));
        ChainNames {
            cluster: format!("service-{suffix}"),
            local: format!("local-{suffix}"),
            external: format!("external-{suffix}"),
            firewall: format!("firewall-{suffix}"),
            base,
        }
    }

    /// `endpoint-<H>-ns/svc/proto/port__IP/port`; IPv6 colons become dots (nft identifiers).
    fn endpoint(&self, ep: &Endpoint) -> String {
        let ip = ep.ip.to_string().replace(':', ".");
        let base = format!("{}__{ip}/{}", self.base, ep.port);
        format!("endpoint-{}-{base}", nft_hash(&base))
    }

    /// The affinity set of an endpoint; the timeout is part of the hash so a changed timeout
    /// yields a new set rather than an in-place redefinition.
    fn affinity(&self, ep: &Endpoint, timeout: u32) -> String {
        let ip = ep.ip.to_string().replace(':', ".");
        let base = format!("{}__{ip}/{}", self.base, ep.port);
        format!("affinity-{}", nft_hash(&format!("{base}/{timeout}")))
    }
}

/// Formats an address for an nft `dnat to` statement.
fn dnat_target(ep: &Endpoint) -> String {
    match ep.ip {
        IpAddr::V4(ip) => format!("{ip}:{}", ep.port),
        IpAddr::V6(ip) => format!("[{ip}]:{}", ep.port),
    }
}

/// Plans the objects of every port of one Service (both families).
pub fn plan_service(ports: &[ServicePort], ctx: &PlanContext, slots: &mut SlotAllocator) -> Objects {
    let mut objects = Objects::default();
    for sp in ports {
        plan_port(sp, ctx, slots, &mut objects);
    }
    objects
}

/// Plans one service port in one family.
fn plan_port(sp: &ServicePort, ctx: &PlanContext, slots: &mut SlotAllocator, out: &mut Objects) {
    let fam = sp.family;
    let ip = family_keyword(fam);
    let names = ChainNames::new(sp);
    let comment = sp.name.to_string();
    let c = |rule: String| format!("{rule} comment \"{comment}\"");
    let proto = sp.name.protocol.as_str();
    let port_key = |addr: &IpAddr| format!("{addr} . {proto} . {}", sp.port);

    // Endpoint chains (for every endpoint either set may use).
    let mut all_eps: Vec<&Endpoint> = sp.cluster_endpoints.iter().chain(&sp.local_endpoints).collect();
    all_eps.sort();
    all_eps.dedup();
    for ep in &all_eps {
        let mut rules = vec![c(format!("{ip} saddr {} jump mark-for-masquerade", ep.ip))];
        if let Some(timeout) = sp.affinity_timeout {
            let set = names.affinity(ep, timeout);
            let addr = if fam == IpFamily::V4 { "ipv4_addr" } else { "ipv6_addr" };
            out.sets.insert(
                (fam, set.clone()),
                OwnedSet { declaration: format!("type {addr} ; flags dynamic,timeout ; timeout {timeout}s ; comment \"{comment}\" ;") },
            );
            rules.push(c(format!("update @{set} {{ {ip} saddr }}")));
        }
        rules.push(c(format!("meta l4proto {proto} dnat to {}", dnat_target(ep))));
        out.chain(fam, names.endpoint(ep), rules);
    }

    // The Cluster endpoint set (service-...) and the Local one (local-...).
    if !sp.cluster_endpoints.is_empty() {
        let mut rules = Vec::new();
        if ctx.masquerade_all {
            rules.push(c("jump mark-for-masquerade".into()));
        } else if !ctx.cluster_cidrs.is_empty() {
            rules.push(c("jump mark-if-not-pod-traffic".into()));
        }
        rules.extend(selection_rules(sp, &names, &names.cluster, &sp.cluster_endpoints, slots, out));
        out.chain(fam, names.cluster.clone(), rules);
    }
    let uses_local = sp.internal_policy_local || sp.external_policy_local;
    if uses_local && !sp.local_endpoints.is_empty() {
        let rules = selection_rules(sp, &names, &names.local, &sp.local_endpoints, slots, out);
        out.chain(fam, names.local.clone(), rules);
    }

    // ClusterIP frontend.
    if let Some(cluster_ip) = sp.cluster_ip {
        out.element(fam, Container::ClusterIps, cluster_ip.to_string(), String::new(), &sp.name.service.to_string());
        let target = if sp.internal_policy_local { &names.local } else { &names.cluster };
        if !sp.internal_endpoints().is_empty() {
            out.element(fam, Container::ServiceIps, port_key(&cluster_ip), format!("goto {target}"), &comment);
        } else {
            let verdict = if sp.cluster_endpoints.is_empty() { "goto reject-chain" } else { "drop" };
            out.element(fam, Container::NoEndpointServices, port_key(&cluster_ip), verdict.into(), &comment);
        }
    }

    // External frontends: NodePort, externalIPs, load-balancer IPs.
    if !sp.has_external_frontends() {
        return;
    }
    let external_ok = !sp.external_endpoints().is_empty();
    if external_ok {
        let rules = if sp.external_policy_local {
            let mut rules: Vec<String> = ctx
                .cluster_cidrs
                .iter()
                .map(|cidr| c(format!("{ip} saddr {cidr} goto {}", names.cluster)))
                .collect();
            rules.push(c("fib saddr type local jump mark-for-masquerade".into()));
            rules.push(c(format!("fib saddr type local goto {}", names.cluster)));
            rules.push(c(format!("goto {}", names.local)));
            rules
        } else {
            vec![c("jump mark-for-masquerade".into()), c(format!("goto {}", names.cluster))]
        };
        out.chain(fam, names.external.clone(), rules);
    }
    let no_endpoint_verdict = if sp.cluster_endpoints.is_empty() { "goto reject-chain" } else { "drop" };
    let frontend_ips = sp.external_ips.iter().chain(&sp.load_balancer_ips);
    for addr in frontend_ips {
        if external_ok {
            out.element(fam, Container::ServiceIps, port_key(addr), format!("goto {}", names.external), &comment);
        } else {
            out.element(fam, Container::NoEndpointServices, port_key(addr), no_endpoint_verdict.into(), &comment);
        }
    }
    if let Some(node_port) = sp.node_port {
        let key = format!("{proto} . {node_port}");
        if external_ok {
            out.element(fam, Container::ServiceNodePorts, key, format!("goto {}", names.external), &comment);
        } else {
            out.element(fam, Container::NoEndpointNodePorts, key, no_endpoint_verdict.into(), &comment);
        }
    }

    // loadBalancerSourceRanges: only LB-IP traffic is filtered, NodePorts are not.
    if !sp.source_ranges.is_empty() && !sp.load_balancer_ips.is_empty() {
        let mut rules: Vec<String> =
            sp.source_ranges.iter().map(|r| c(format!("{ip} saddr {r} return"))).collect();
        let node_in_range = ctx.node_ips.iter().any(|n| sp.source_ranges.iter().any(|r| r.contains(n)));
        if node_in_range {
            rules.extend(sp.load_balancer_ips.iter().map(|lb| c(format!("{ip} saddr {lb} return"))));
        }
        rules.push(c("drop".into()));
        out.chain(fam, names.firewall.clone(), rules);
        for lb in &sp.load_balancer_ips {
            out.element(fam, Container::FirewallIps, port_key(lb), format!("jump {}", names.firewall), &comment);
        }
    }
}

/// The rules of an endpoint-set chain: affinity lookups, then a random pick among `eps`.
fn selection_rules(
    sp: &ServicePort,
    names: &ChainNames,
    chain: &str,
    eps: &[Endpoint],
    slots: &mut SlotAllocator,
    out: &mut Objects,
) -> Vec<String> {
    let fam = sp.family;
    let ip = family_keyword(fam);
    let comment = sp.name.to_string();
    let mut rules = Vec::new();
    if let Some(timeout) = sp.affinity_timeout {
        for ep in eps {
            rules.push(format!(
                "{ip} saddr @{} goto {} comment \"{comment}\"",
                names.affinity(ep, timeout),
                names.endpoint(ep)
            ));
        }
    }
    let eps = if eps.len() > BLOCK_SIZE {
        tracing::warn!(service = %comment, endpoints = eps.len(), "only the first {BLOCK_SIZE} endpoints are used");
        &eps[..BLOCK_SIZE]
    } else {
        eps
    };
    if let [only] = eps {
        rules.push(format!("goto {} comment \"{comment}\"", names.endpoint(only)));
        return rules;
    }
    let start = slots.block_start(fam, chain);
    rules.push(format!(
        "numgen random mod {} offset {start} vmap @endpoint-select comment \"{comment}\"",
        eps.len()
    ));
    for (i, ep) in eps.iter().enumerate() {
        out.element(fam, Container::EndpointSelect, (start + i as u32).to_string(), format!("goto {}", names.endpoint(ep)), &comment);
    }
    rules
}
