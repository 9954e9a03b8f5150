//! Plans the iptables rules of the node, exactly in upstream kube-proxy's layout: the chains,
//! names, comments and rule order of `pkg/proxy/iptables`. Pure: service ports in,
//! `iptables-restore` text out.
//!
//! Each Service's share is a [`FamilyPlan`] per IP family: the rules it adds to the shared
//! top-level chains (rewritten by every sync) and its own `KUBE-SVC-`/`KUBE-SVL-`/`KUBE-EXT-`/
//! `KUBE-FW-`/`KUBE-SEP-` chains (written only when the Service changed, as upstream's partial
//! syncs of KEP-3453). Rules are spelled as `iptables-save` prints them wherever the input form
//! allows, so that a listing reads like the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::hash::iptables_hash;
use crate::table::{Endpoint, IpFamily, Protocol, ServicePort};

/// nat and filter: ClusterIP dispatch (nat) / REJECT of ClusterIPs without endpoints (filter).
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// filter: external frontends without (local) endpoints.
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// nat: NodePort dispatch; filter: health-check NodePorts.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// nat: masquerades marked traffic.
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// nat: sets the masquerade mark.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// filter: accepts marked and established forwarded traffic.
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// filter: drops load-balancer traffic not accepted by `loadBalancerSourceRanges`.
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// filter: blocks remote traffic to 127.0.0.0/8 while localhost NodePorts are on.
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
/// mangle: an empty chain whose disappearance tells that someone flushed the tables.
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";

/// Prefixes of the per-Service nat chains.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

/// True for a per-Service (or per-endpoint) chain name.
pub fn is_service_chain(name: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Where NodePorts are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortDestinations {
    /// Every local address (`-m addrtype --dst-type LOCAL`), the iptables-mode default.
    AllLocal,
    /// These addresses only.
    Ips(Vec<IpAddr>),
}

/// What the planner needs to know beyond the service ports, for one family.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanContext {
    /// The family of the rules (iptables or ip6tables).
    pub family: IpFamily,
    /// The pod CIDR of this family: the local-traffic detector (upstream takes one per family).
    pub cluster_cidr: Option<IpNet>,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
    /// The masquerade mark value (`0x4000`).
    pub masquerade_mark: u32,
    /// Node IPs of this family (a node IP inside loadBalancerSourceRanges admits LB IPs as sources).
    pub node_ips: Vec<IpAddr>,
    /// Where NodePorts are accepted.
    pub nodeports: NodePortDestinations,
    /// `localhostNodePorts`: NodePorts answer on 127.0.0.1 (IPv4 only).
    pub localhost_nodeports: bool,
    /// Service CIDRs of this family (ServiceCIDR objects): new connections to addresses in them
    /// that no rule claimed are dropped, as the nftables mode does.
    pub service_cidrs: Vec<IpNet>,
    /// Upstream's "large cluster mode" ([`is_large_cluster`]): the rules of the `KUBE-SVC-`,
    /// `KUBE-SVL-` and `KUBE-SEP-` chains go without their comments, which are most of a rule's
    /// size in the kernel (xt_comment keeps 256 bytes) and of the restore input.
    pub large_cluster: bool,
    /// `KUBE-FORWARD` drops packets conntrack calls INVALID (they would leave un-NATed): true
    /// unless the node's TCP tracking is liberal (`nf_conntrack_tcp_be_liberal`), as kube-proxy.
    pub drop_invalid: bool,
}

impl Default for PlanContext {
    fn default() -> Self {
        PlanContext {
            family: IpFamily::V4,
            cluster_cidr: None,
            masquerade_all: false,
            masquerade_mark: 0x4000,
            node_ips: Vec::new(),
            nodeports: NodePortDestinations::AllLocal,
            localhost_nodeports: true,
            service_cidrs: Vec::new(),
            large_cluster: false,
            drop_invalid: true,
        }
    }
}

/// Above this many endpoints in the service table, upstream's iptables proxier (and ours) drop
/// the comments of the per-Service chains' rules (`largeClusterEndpointsThreshold`).
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// True when a service table of `endpoints` endpoints ([`endpoint_count`]) is planned in large
/// cluster mode.
pub fn is_large_cluster(endpoints: usize) -> bool {
    endpoints > LARGE_CLUSTER_ENDPOINTS
}

/// The endpoints of some service ports, as large cluster mode counts them: each port's distinct
/// endpoints (cluster-wide and local), the `KUBE-SEP-` chains it may need.
pub fn endpoint_count(ports: &[ServicePort]) -> usize {
    ports
        .iter()
        .map(|sp| {
            let extra = sp.local_endpoints.iter().filter(|ep| !sp.cluster_endpoints.contains(ep)).count();
            sp.cluster_endpoints.len() + extra
        })
        .sum()
}

impl PlanContext {
    /// True when NodePorts answer on IPv4 loopback: needs `route_localnet=1` and the
    /// `KUBE-FIREWALL` martian guard.
    pub fn localhost_nodeports_active(&self) -> bool {
        self.family == IpFamily::V4
            && self.localhost_nodeports
            && match &self.nodeports {
                NodePortDestinations::AllLocal => true,
                NodePortDestinations::Ips(ips) => ips.iter().any(IpAddr::is_loopback),
            }
    }

    fn mark(&self) -> String {
        format!("{:#x}", self.masquerade_mark)
    }

    /// ` -m comment --comment "TEXT"` for a per-Service chain's rule, nothing in large cluster
    /// mode.
    fn chain_comment(&self, text: &str) -> String {
        if self.large_cluster { String::new() } else { format!(" -m comment --comment \"{text}\"") }
    }
}

/// One Service's rules in one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FamilyPlan {
    /// Rules (whole `-A CHAIN ...` lines) this Service adds to the shared nat chains
    /// (`KUBE-SERVICES`, `KUBE-NODEPORTS`).
    pub nat_shared: Vec<String>,
    /// Rules this Service adds to the shared filter chains.
    pub filter_shared: Vec<String>,
    /// The Service's own nat chains and their rules.
    pub chains: BTreeMap<String, Vec<String>>,
}

impl FamilyPlan {
    /// True when the Service has no rules in this family.
    pub fn is_empty(&self) -> bool {
        self.nat_shared.is_empty() && self.filter_shared.is_empty() && self.chains.is_empty()
    }

    fn push(&mut self, chain: &str, rule: String) {
        self.chains.entry(chain.to_string()).or_default().push(rule);
    }
}

/// `KUBE-SVC-<H16>` and friends for a service port.
pub fn service_chain(prefix: &str, sp: &ServicePort) -> String {
    format!("{prefix}-{}", iptables_hash(&sp.name.to_string(), sp.name.protocol.as_str(), None))
}

/// `KUBE-SEP-<H16>` for an endpoint of a service port.
pub fn endpoint_chain(sp: &ServicePort, ep: &Endpoint) -> String {
    let endpoint = ep.to_string();
    format!("KUBE-SEP-{}", iptables_hash(&sp.name.to_string(), sp.name.protocol.as_str(), Some(&endpoint)))
}

/// An address as a host CIDR, as iptables prints it (`10.0.0.1/32`, `fd00::1/128`).
/// Longest object name put in a comment: with the longest text around it, a comment stays within
/// xt_comment's 255 bytes (valid names, `ns/name:port`, are at most 191).
const COMMENT_NAME_MAX: usize = 191;

/// `name` as it may appear inside a quoted `--comment "..."` of restore input (a newline would
/// end the rule and start another): see [`crate::text::quotable`].
fn in_comment(name: &impl std::fmt::Display) -> String {
    crate::text::quotable(&name.to_string(), COMMENT_NAME_MAX).into_owned()
}

fn host(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// A rule's target for traffic without endpoints: REJECT, with a TCP reset for TCP so that
/// clients of both families fail at once.
fn reject(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "REJECT --reject-with tcp-reset",
        _ => "REJECT",
    }
}

/// `%0.10f` of 1/n, as upstream's `probability()`.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// Plans every port of one Service in `ctx.family` (ports of the other family are skipped).
pub fn plan_ports(ports: &[ServicePort], ctx: &PlanContext) -> FamilyPlan {
    let mut plan = FamilyPlan::default();
    let ports: Vec<&ServicePort> = ports.iter().filter(|p| p.family == ctx.family).collect();
    for sp in &ports {
        plan_port(sp, ctx, &mut plan);
    }
    // Beyond upstream (as the nftables mode): other ports of a ClusterIP are rejected at once
    // rather than left to time out. Traffic to the Service's ports was DNATed before the filter
    // table sees it, or met a port rule above.
    let mut cluster_ips: Vec<(&IpAddr, String)> =
        ports.iter().filter_map(|sp| Some((sp.cluster_ip.as_ref()?, in_comment(&sp.name.service)))).collect();
    cluster_ips.dedup();
    for (ip, service) in cluster_ips {
        let comment = format!("-m comment --comment \"{service} has no such port\"");
        plan.filter_shared
            .push(format!("-A {KUBE_SERVICES} -d {} -p tcp {comment} -j REJECT --reject-with tcp-reset", host(ip)));
        plan.filter_shared.push(format!("-A {KUBE_SERVICES} -d {} {comment} -j REJECT", host(ip)));
    }
    plan
}

/// Plans one service port, following upstream's `syncProxyRules` step by step.
fn plan_port(sp: &ServicePort, ctx: &PlanContext, out: &mut FamilyPlan) {
    let name = in_comment(&sp.name);
    let protocol = sp.name.protocol;
    let proto = protocol.as_str();
    let port = sp.port;
    let svc = service_chain("KUBE-SVC", sp);
    let svl = service_chain("KUBE-SVL", sp);
    let ext = service_chain("KUBE-EXT", sp);
    let fw = service_chain("KUBE-FW", sp);

    let has_endpoints = !sp.cluster_endpoints.is_empty();
    let has_internal = !sp.internal_endpoints().is_empty();
    let has_external = !sp.external_endpoints().is_empty();
    let externally_accessible = sp.has_external_frontends();
    let uses_cluster = has_endpoints && (!sp.internal_policy_local || externally_accessible);
    let uses_local = !sp.local_endpoints.is_empty() && (sp.internal_policy_local || sp.external_policy_local);
    let uses_external = has_endpoints && externally_accessible;
    let uses_firewall = has_endpoints && !sp.load_balancer_ips.is_empty() && !sp.source_ranges.is_empty();
    let internal_chain = if sp.internal_policy_local { &svl } else { &svc };
    let external_policy_chain = if sp.external_policy_local { &svl } else { &svc };
    let lb_chain = if uses_firewall { &fw } else { &ext };

    let (internal_target, internal_comment) = if !has_endpoints {
        (reject(protocol), format!("{name} has no endpoints"))
    } else {
        ("DROP", format!("{name} has no local endpoints"))
    };
    let (external_target, external_comment) = (internal_target, internal_comment.clone());
    // `-d IP -p proto -m comment --comment "C" -m proto --dport P`
    let to = |ip: &IpAddr, comment: &str| {
        format!("-d {} -p {proto} -m comment --comment \"{comment}\" -m {proto} --dport {port}", host(ip))
    };

    // ClusterIP.
    if let Some(cluster_ip) = &sp.cluster_ip {
        if has_internal {
            out.nat_shared.push(format!(
                "-A {KUBE_SERVICES} {} -j {internal_chain}",
                to(cluster_ip, &format!("{name} cluster IP"))
            ));
        } else {
            out.filter_shared
                .push(format!("-A {KUBE_SERVICES} {} -j {internal_target}", to(cluster_ip, &internal_comment)));
        }
    }

    // externalIPs.
    for ip in &sp.external_ips {
        if has_endpoints {
            out.nat_shared.push(format!("-A {KUBE_SERVICES} {} -j {ext}", to(ip, &format!("{name} external IP"))));
        }
        if !has_external {
            out.filter_shared
                .push(format!("-A {KUBE_EXTERNAL_SERVICES} {} -j {external_target}", to(ip, &external_comment)));
        }
    }

    // Load-balancer IPs.
    for ip in &sp.load_balancer_ips {
        if has_endpoints {
            out.nat_shared
                .push(format!("-A {KUBE_SERVICES} {} -j {lb_chain}", to(ip, &format!("{name} loadbalancer IP"))));
        }
        if uses_firewall {
            let comment = format!("{name} traffic not accepted by {fw}");
            out.filter_shared.push(format!("-A {KUBE_PROXY_FIREWALL} {} -j DROP", to(ip, &comment)));
        }
    }
    if !has_external {
        for ip in &sp.load_balancer_ips {
            out.filter_shared
                .push(format!("-A {KUBE_EXTERNAL_SERVICES} {} -j {external_target}", to(ip, &external_comment)));
        }
    }

    // NodePort (not subject to loadBalancerSourceRanges).
    if let Some(node_port) = sp.node_port {
        if has_endpoints {
            out.nat_shared.push(format!(
                "-A {KUBE_NODEPORTS} -p {proto} -m comment --comment \"{name}\" -m {proto} --dport {node_port} -j {ext}"
            ));
        }
        if !has_external {
            out.filter_shared.push(format!(
                "-A {KUBE_EXTERNAL_SERVICES} -p {proto} -m comment --comment \"{external_comment}\" -m addrtype --dst-type LOCAL -m {proto} --dport {node_port} -j {external_target}"
            ));
        }
    }

    // Health-check NodePort.
    if let Some(hc) = sp.health_check_node_port {
        out.filter_shared.push(format!(
            "-A {KUBE_NODEPORTS} -p tcp -m comment --comment \"{name} health check node port\" -m tcp --dport {hc} -j ACCEPT"
        ));
    }

    // Internal traffic: masquerade off-cluster (or all) sources.
    if has_internal && let Some(cluster_ip) = &sp.cluster_ip {
        let args = to(cluster_ip, &format!("{name} cluster IP"));
        if ctx.masquerade_all {
            out.push(internal_chain, format!("-A {internal_chain} {args} -j {KUBE_MARK_MASQ}"));
        } else if let Some(cidr) = &ctx.cluster_cidr {
            out.push(internal_chain, format!("-A {internal_chain} ! -s {cidr} {args} -j {KUBE_MARK_MASQ}"));
        }
    }

    // External traffic chain.
    if uses_external {
        out.chains.entry(ext.clone()).or_default();
        if !sp.external_policy_local {
            out.push(&ext, format!(
                "-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j {KUBE_MARK_MASQ}"
            ));
        } else {
            if let Some(cidr) = &ctx.cluster_cidr {
                out.push(&ext, format!(
                    "-A {ext} -s {cidr} -m comment --comment \"pod traffic for {name} external destinations\" -j {svc}"
                ));
            }
            out.push(&ext, format!(
                "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
            ));
            out.push(&ext, format!(
                "-A {ext} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {svc}"
            ));
        }
        if has_external {
            out.push(&ext, format!("-A {ext} -j {external_policy_chain}"));
        }
    }

    // Firewall chain (loadBalancerSourceRanges).
    if uses_firewall {
        let comment = format!("{name} loadbalancer IP");
        for range in &sp.source_ranges {
            out.push(&fw, format!("-A {fw} -s {range} -m comment --comment \"{comment}\" -j {ext}"));
        }
        let node_in_range = ctx.node_ips.iter().any(|n| sp.source_ranges.iter().any(|r| r.contains(n)));
        if node_in_range {
            for lb in &sp.load_balancer_ips {
                out.push(&fw, format!("-A {fw} -s {} -m comment --comment \"{comment}\" -j {ext}", host(lb)));
            }
        }
        out.push(
            &fw,
            format!(
                "-A {fw} -m comment --comment \"other traffic to {name} will be dropped by {KUBE_PROXY_FIREWALL}\""
            ),
        );
    }

    // Endpoint selection.
    if uses_cluster {
        out.chains.entry(svc.clone()).or_default();
        endpoint_rules(sp, ctx, &svc, &sp.cluster_endpoints, out);
    }
    if uses_local {
        out.chains.entry(svl.clone()).or_default();
        endpoint_rules(sp, ctx, &svl, &sp.local_endpoints, out);
    }

    // Endpoint chains.
    let mut reachable: Vec<&Endpoint> = Vec::new();
    if uses_cluster {
        reachable.extend(&sp.cluster_endpoints);
    }
    if uses_local {
        reachable.extend(&sp.local_endpoints);
    }
    reachable.sort();
    reachable.dedup();
    for ep in reachable {
        let sep = endpoint_chain(sp, ep);
        let comment = ctx.chain_comment(&name);
        out.push(&sep, format!("-A {sep} -s {}{comment} -j {KUBE_MARK_MASQ}", host(&ep.ip)));
        let affinity =
            if sp.affinity_timeout.is_some() { format!(" -m recent --set --name {sep}") } else { String::new() };
        out.push(&sep, format!("-A {sep} -p {proto}{comment}{affinity} -m {proto} -j DNAT --to-destination {ep}"));
    }
}

/// Affinity lookups, then the probability ladder: endpoint i of n is taken with probability
/// 1/(n-i), the last one unconditionally.
fn endpoint_rules(sp: &ServicePort, ctx: &PlanContext, chain: &str, eps: &[Endpoint], out: &mut FamilyPlan) {
    let name = in_comment(&sp.name);
    if let Some(timeout) = sp.affinity_timeout {
        for ep in eps {
            let sep = endpoint_chain(sp, ep);
            let comment = ctx.chain_comment(&format!("{name} -> {ep}"));
            out.push(
                chain,
                format!("-A {chain}{comment} -m recent --rcheck --seconds {timeout} --reap --name {sep} -j {sep}"),
            );
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let sep = endpoint_chain(sp, ep);
        let statistic = if i + 1 < n {
            format!(" -m statistic --mode random --probability {}", probability(n - i))
        } else {
            String::new()
        };
        let comment = ctx.chain_comment(&format!("{name} -> {ep}"));
        out.push(chain, format!("-A {chain}{comment}{statistic} -j {sep}"));
    }
}

/// The fixed rules of the filter table.
fn filter_fixed(ctx: &PlanContext) -> (Vec<&'static str>, Vec<String>) {
    let mark = ctx.mark();
    let mut chains = vec![KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL];
    let mut rules: Vec<String> = ctx
        .drop_invalid
        .then(|| format!("-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP"))
        .into_iter()
        .collect();
    rules.extend([
        format!(
            "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
        ),
        format!(
            "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        ),
    ]);
    if ctx.localhost_nodeports_active() {
        chains.push(KUBE_FIREWALL);
        rules.push(format!(
            "-A {KUBE_FIREWALL} ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        ));
    }
    (chains, rules)
}

/// The fixed rules of the nat table (before the Services' rules).
fn nat_fixed(ctx: &PlanContext) -> (Vec<&'static str>, Vec<String>) {
    let mark = ctx.mark();
    let chains = vec![KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ];
    let rules = vec![
        format!("-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"),
        format!("-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}"),
        format!(
            "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
        ),
        mark_masq_rule(ctx),
    ];
    (chains, rules)
}

/// `KUBE-MARK-MASQ`'s one rule.
fn mark_masq_rule(ctx: &PlanContext) -> String {
    format!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {}", ctx.mark())
}

/// A restore input (re)writing `KUBE-MARK-MASQ` whole: what the Services' own chains need to
/// exist before a split full sync writes them ([`crate::iptables::sync::split_full_inputs`]).
pub fn mark_masq_input(ctx: &PlanContext) -> String {
    format!("*nat\n:{KUBE_MARK_MASQ} - [0:0]\n{}\nCOMMIT\n", mark_masq_rule(ctx))
}

/// The last rules of nat `KUBE-SERVICES`: NodePort traffic goes to `KUBE-NODEPORTS`.
fn nodeport_tail(ctx: &PlanContext) -> Vec<String> {
    let comment =
        "-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
    match &ctx.nodeports {
        NodePortDestinations::AllLocal => {
            let exclude = match ctx.family {
                IpFamily::V6 => "! -d ::1/128 ",
                IpFamily::V4 if !ctx.localhost_nodeports => "! -d 127.0.0.0/8 ",
                IpFamily::V4 => "",
            };
            vec![format!("-A {KUBE_SERVICES} {exclude}{comment} -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}")]
        }
        NodePortDestinations::Ips(ips) => ips
            .iter()
            .filter(|ip| IpFamily::of(ip) == ctx.family)
            .filter(|ip| !ip.is_loopback() || (ctx.family == IpFamily::V4 && ctx.localhost_nodeports))
            .map(|ip| format!("-A {KUBE_SERVICES} -d {} {comment} -j {KUBE_NODEPORTS}", host(ip)))
            .collect(),
    }
}

/// What one `iptables-restore --noflush` call of a family writes.
#[derive(Debug, Default)]
pub struct RestoreInput<'a> {
    /// Every Service's plan, in order: their shared rules rebuild the top-level chains.
    pub services: Vec<&'a FamilyPlan>,
    /// The Services whose own chains are (re)written (all of them in a full sync).
    pub written: Vec<&'a FamilyPlan>,
    /// Service chains to flush and delete (`-X`).
    pub deleted: BTreeSet<String>,
    /// Also (re)create the mangle canary chain (full syncs).
    pub canary: bool,
    /// Jumps from builtin chains to insert (those found missing), in the same transaction as
    /// their target chains: traffic never meets a half-built table.
    pub jumps: Vec<Jump>,
    /// The filter table already holds these rules (no Service's share of it changed): it is left
    /// out of the input.
    pub filter_unchanged: bool,
    /// The nat table's top-level chains already hold these rules: only the written and deleted
    /// Service chains are in the input. A one-endpoint change then costs O(that Service) lines.
    pub nat_top_level_unchanged: bool,
}

/// A chain line: declaring an existing user chain flushes it, even with `--noflush`.
fn chain_line(out: &mut String, chain: &str) {
    out.push_str(&format!(":{chain} - [0:0]\n"));
}

/// Renders one family's `iptables-restore --noflush` input (filter, then nat).
pub fn restore_input(ctx: &PlanContext, input: &RestoreInput) -> String {
    let mut out = String::new();
    if input.canary {
        out.push_str("*mangle\n");
        chain_line(&mut out, KUBE_PROXY_CANARY);
        out.push_str("COMMIT\n");
    }

    if !input.filter_unchanged {
        filter_table(ctx, input, &mut out);
    }
    let written_chains: BTreeSet<&String> = input.written.iter().flat_map(|s| s.chains.keys()).collect();
    let deleted: Vec<&String> = input.deleted.iter().filter(|c| !written_chains.contains(c)).collect();
    if input.nat_top_level_unchanged && written_chains.is_empty() && deleted.is_empty() {
        return out;
    }
    out.push_str("*nat\n");
    let (chains, rules) = if input.nat_top_level_unchanged { (Vec::new(), Vec::new()) } else { nat_fixed(ctx) };
    for chain in chains {
        chain_line(&mut out, chain);
    }
    for chain in written_chains.iter().chain(&deleted) {
        chain_line(&mut out, chain);
    }
    let shared: &[&FamilyPlan] = if input.nat_top_level_unchanged { &[] } else { &input.services };
    let service_rules = shared.iter().flat_map(|s| &s.nat_shared);
    let chain_rules = input.written.iter().flat_map(|s| s.chains.values().flatten());
    for rule in rules.iter().chain(service_rules).chain(chain_rules) {
        out.push_str(rule);
        out.push('\n');
    }
    if !input.nat_top_level_unchanged {
        for rule in nodeport_tail(ctx) {
            out.push_str(&rule);
            out.push('\n');
        }
    }
    for chain in deleted {
        out.push_str(&format!("-X {chain}\n"));
    }
    insert_jumps(&mut out, "nat", &input.jumps);
    out.push_str("COMMIT\n");
    out
}

/// The filter table's part of a restore input: its chains rewritten whole.
fn filter_table(ctx: &PlanContext, input: &RestoreInput, out: &mut String) {
    out.push_str("*filter\n");
    let (chains, rules) = filter_fixed(ctx);
    for chain in chains {
        chain_line(out, chain);
    }
    for rule in rules.iter().chain(input.services.iter().flat_map(|s| &s.filter_shared)) {
        out.push_str(rule);
        out.push('\n');
    }
    for cidr in &ctx.service_cidrs {
        out.push_str(&format!(
            "-A {KUBE_SERVICES} -d {cidr} -m comment --comment \"drop traffic to unallocated ClusterIPs\" -j DROP\n"
        ));
    }
    insert_jumps(out, "filter", &input.jumps);
    out.push_str("COMMIT\n");
}

/// `-I CHAIN args` lines for the jumps of `table`, quoting arguments with spaces.
fn insert_jumps(out: &mut String, table: &str, jumps: &[Jump]) {
    for jump in jumps.iter().filter(|j| j.table == table) {
        let args: Vec<String> =
            jump.args.iter().map(|a| if a.contains(' ') { format!("\"{a}\"") } else { a.clone() }).collect();
        out.push_str(&format!("-I {} {}\n", jump.chain, args.join(" ")));
    }
}

/// A jump from a builtin chain to one of ours. Upstream ensures them with `iptables -C` / `-I`
/// before its restore; roadkeeper checks with `-C` and inserts the missing ones within the
/// restore that creates their targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    /// `nat` or `filter`.
    pub table: &'static str,
    /// The builtin chain.
    pub chain: &'static str,
    /// The rule's arguments (after `-I CHAIN`), one argv word each.
    pub args: Vec<String>,
}

/// The jumps upstream installs (`iptablesJumpChains`, plus kubelet's `KUBE-FIREWALL` jumps while
/// localhost NodePorts are on).
pub fn jumps(ctx: &PlanContext) -> Vec<Jump> {
    let new: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];
    let table: [(&'static str, &'static str, &'static str, &str, &[&str]); 12] = [
        ("filter", "INPUT", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals", new),
        ("filter", "FORWARD", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals", new),
        ("filter", "INPUT", KUBE_NODEPORTS, "kubernetes health check service ports", &[]),
        ("filter", "FORWARD", KUBE_SERVICES, "kubernetes service portals", new),
        ("filter", "OUTPUT", KUBE_SERVICES, "kubernetes service portals", new),
        ("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules", &[]),
        ("filter", "INPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", new),
        ("filter", "OUTPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", new),
        ("filter", "FORWARD", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", new),
        ("nat", "OUTPUT", KUBE_SERVICES, "kubernetes service portals", &[]),
        ("nat", "PREROUTING", KUBE_SERVICES, "kubernetes service portals", &[]),
        ("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules", &[]),
    ];
    let mut out: Vec<Jump> = table
        .iter()
        .map(|(table, chain, target, comment, extra)| {
            let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            args.extend(["-m", "comment", "--comment", comment, "-j", target].map(String::from));
            Jump { table, chain, args }
        })
        .collect();
    if ctx.localhost_nodeports_active() {
        for chain in ["INPUT", "OUTPUT"] {
            out.push(Jump { table: "filter", chain, args: vec!["-j".into(), KUBE_FIREWALL.into()] });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;

    use super::*;
    use crate::table::ServicePortName;

    fn ep(last: u8, is_local: bool) -> Endpoint {
        Endpoint { ip: format!("10.244.0.{last}").parse().unwrap(), port: 8080, is_local }
    }

    /// `default/hello`: one unnamed TCP port 80 on ClusterIP 10.96.0.10, `n` ready endpoints.
    fn hello(n: u8) -> ServicePort {
        let endpoints = (1..=n).map(|i| ep(i, false)).collect();
        ServicePort::for_test(
            NamespacedName::new("default", "hello"),
            Protocol::Tcp,
            "10.96.0.10".parse().unwrap(),
            80,
            endpoints,
        )
    }

    fn ctx() -> PlanContext {
        PlanContext {
            cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
            node_ips: vec!["192.168.77.2".parse().unwrap()],
            ..PlanContext::default()
        }
    }

    fn full(plan: &FamilyPlan) -> String {
        let input = RestoreInput { services: vec![plan], written: vec![plan], ..RestoreInput::default() };
        restore_input(&ctx(), &input)
    }

    fn nat(text: &str) -> String {
        text.split("*nat\n").nth(1).unwrap().to_string()
    }

    fn count(text: &str, needle: &str) -> usize {
        text.lines().filter(|l| l.contains(needle)).count()
    }

    #[test]
    fn invalid_packets_are_dropped_unless_tcp_tracking_is_liberal() {
        let rule = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n";
        let plan = plan_ports(&[hello(1)], &ctx());
        let input = RestoreInput { services: vec![&plan], written: vec![&plan], ..RestoreInput::default() };
        assert_eq!(restore_input(&ctx(), &input).matches(rule).count(), 1, "strict tracking: dropped");
        let liberal = PlanContext { drop_invalid: false, ..ctx() };
        assert!(!restore_input(&liberal, &input).contains(rule), "liberal tracking: kept");
    }

    #[test]
    fn hello_has_11_nat_lines_with_3_endpoints_and_17_with_5() {
        assert_eq!(count(&nat(&full(&plan_ports(&[hello(3)], &ctx()))), "default/hello"), 11);
        assert_eq!(count(&nat(&full(&plan_ports(&[hello(5)], &ctx()))), "default/hello"), 17);
    }

    #[test]
    fn chains_are_named_and_ruled_as_upstream() {
        let sp = hello(3);
        let svc = format!("KUBE-SVC-{}", iptables_hash("default/hello", "tcp", None));
        let sep1 = format!("KUBE-SEP-{}", iptables_hash("default/hello", "tcp", Some("10.244.0.1:8080")));
        let plan = plan_ports(&[sp], &ctx());
        assert_eq!(
            plan.nat_shared,
            vec![format!(
                "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/hello cluster IP\" -m tcp --dport 80 -j {svc}"
            )]
        );
        let rules = &plan.chains[&svc];
        assert_eq!(
            rules[0],
            format!(
                "-A {svc} ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment \"default/hello cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
            )
        );
        assert_eq!(
            rules[1],
            format!(
                "-A {svc} -m comment --comment \"default/hello -> 10.244.0.1:8080\" -m statistic --mode random --probability 0.3333333333 -j {sep1}"
            )
        );
        assert!(rules[2].contains("--probability 0.5000000000"), "{}", rules[2]);
        assert!(!rules[3].contains("statistic"), "the last endpoint is unconditional: {}", rules[3]);
        assert_eq!(
            plan.chains[&sep1],
            vec![
                format!("-A {sep1} -s 10.244.0.1/32 -m comment --comment \"default/hello\" -j KUBE-MARK-MASQ"),
                format!(
                    "-A {sep1} -p tcp -m comment --comment \"default/hello\" -m tcp -j DNAT --to-destination 10.244.0.1:8080"
                ),
            ]
        );
        assert_eq!(probability(4), "0.2500000000");
        assert_eq!(probability(7), "0.1428571429");
    }

    #[test]
    fn named_ports_hash_like_upstream_vectors() {
        let mut sp = hello(1);
        sp.name = ServicePortName {
            service: NamespacedName::new("ns1", "svc1"),
            port: "p80".into(),
            protocol: Protocol::Tcp,
        };
        assert_eq!(service_chain("KUBE-SVC", &sp), "KUBE-SVC-XPGD46QRK7WJZT7O");
        let ep = Endpoint { ip: "10.180.0.1".parse().unwrap(), port: 80, is_local: false };
        assert_eq!(endpoint_chain(&sp, &ep), "KUBE-SEP-SXIVWICOYRO3J4NJ");
    }

    #[test]
    fn affinity_checks_recent_lists_before_the_ladder_and_sets_them_in_the_endpoint() {
        let mut sp = hello(2);
        sp.affinity_timeout = Some(10800);
        let svc = service_chain("KUBE-SVC", &sp);
        let sep1 = endpoint_chain(&sp, &sp.cluster_endpoints[0]);
        let plan = plan_ports(&[sp], &ctx());
        let rules = &plan.chains[&svc];
        assert_eq!(rules.len(), 1 + 2 + 2);
        assert_eq!(
            rules[1],
            format!(
                "-A {svc} -m comment --comment \"default/hello -> 10.244.0.1:8080\" -m recent --rcheck --seconds 10800 --reap --name {sep1} -j {sep1}"
            )
        );
        assert!(
            plan.chains[&sep1][1].contains(&format!("-m recent --set --name {sep1} -m tcp -j DNAT")),
            "{:?}",
            plan.chains[&sep1]
        );
    }

    #[test]
    fn no_endpoints_reject_in_filter_and_nothing_in_nat() {
        let mut sp = hello(0);
        sp.node_port = Some(30080);
        sp.external_ips = vec!["203.0.113.7".parse().unwrap()];
        let plan = plan_ports(&[sp], &ctx());
        assert!(plan.nat_shared.is_empty() && plan.chains.is_empty(), "{plan:?}");
        assert_eq!(plan.filter_shared[..3], vec![
            "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/hello has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with tcp-reset".to_string(),
            "-A KUBE-EXTERNAL-SERVICES -d 203.0.113.7/32 -p tcp -m comment --comment \"default/hello has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with tcp-reset".to_string(),
            "-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment \"default/hello has no endpoints\" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT --reject-with tcp-reset".to_string(),
        ]);
    }

    #[test]
    fn internal_local_policy_without_local_endpoints_drops() {
        let mut sp = hello(2);
        sp.internal_policy_local = true;
        let plan = plan_ports(&[sp], &ctx());
        assert!(plan.chains.is_empty() && plan.nat_shared.is_empty());
        assert_eq!(plan.filter_shared.len(), 1 + 2);
        assert!(
            plan.filter_shared[0]
                .ends_with("--comment \"default/hello has no local endpoints\" -m tcp --dport 80 -j DROP"),
            "{:?}",
            plan.filter_shared
        );
    }

    #[test]
    fn external_local_policy_short_circuits_pods_and_host_and_uses_local_endpoints() {
        let mut sp = hello(2);
        sp.node_port = Some(30080);
        sp.external_policy_local = true;
        sp.cluster_endpoints[1].is_local = true;
        sp.local_endpoints = vec![sp.cluster_endpoints[1].clone()];
        let (svc, svl, ext) =
            (service_chain("KUBE-SVC", &sp), service_chain("KUBE-SVL", &sp), service_chain("KUBE-EXT", &sp));
        let plan = plan_ports(&[sp], &ctx());
        assert_eq!(
            plan.chains[&ext],
            vec![
                format!(
                    "-A {ext} -s 10.244.0.0/16 -m comment --comment \"pod traffic for default/hello external destinations\" -j {svc}"
                ),
                format!(
                    "-A {ext} -m comment --comment \"masquerade LOCAL traffic for default/hello external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"
                ),
                format!(
                    "-A {ext} -m comment --comment \"route LOCAL traffic for default/hello external destinations\" -m addrtype --src-type LOCAL -j {svc}"
                ),
                format!("-A {ext} -j {svl}"),
            ]
        );
        assert_eq!(plan.chains[&svl].len(), 1, "one local endpoint: {:?}", plan.chains[&svl]);
        assert!(plan.nat_shared.contains(&format!(
            "-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/hello\" -m tcp --dport 30080 -j {ext}"
        )));
        assert_eq!(plan.filter_shared, vec![
            "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/hello has no such port\" -j REJECT --reject-with tcp-reset".to_string(),
            "-A KUBE-SERVICES -d 10.96.0.10/32 -m comment --comment \"default/hello has no such port\" -j REJECT".to_string(),
        ]);
    }

    #[test]
    fn external_local_policy_without_local_endpoints_drops_what_falls_through() {
        let mut sp = hello(1);
        sp.node_port = Some(30080);
        sp.external_policy_local = true;
        let ext = service_chain("KUBE-EXT", &sp);
        let plan = plan_ports(&[sp], &ctx());
        assert_eq!(plan.chains[&ext].len(), 3, "no fall-through jump: {:?}", plan.chains[&ext]);
        assert!(!plan.chains.keys().any(|c| c.starts_with("KUBE-SVL-")));
        assert_eq!(
            plan.filter_shared[0],
            "-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment \"default/hello has no local endpoints\" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j DROP"
        );
    }

    #[test]
    fn source_ranges_filter_only_load_balancer_ips_and_admit_lb_sources_when_the_node_is_in_range() {
        let mut sp = hello(1);
        sp.node_port = Some(30080);
        sp.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
        sp.source_ranges = vec!["192.168.77.0/24".parse().unwrap()];
        let (ext, fw) = (service_chain("KUBE-EXT", &sp), service_chain("KUBE-FW", &sp));
        let plan = plan_ports(&[sp], &ctx());
        assert!(plan.nat_shared.contains(&format!(
            "-A KUBE-SERVICES -d 203.0.113.9/32 -p tcp -m comment --comment \"default/hello loadbalancer IP\" -m tcp --dport 80 -j {fw}"
        )));
        assert!(
            plan.nat_shared.iter().any(|r| r.starts_with("-A KUBE-NODEPORTS") && r.ends_with(&ext)),
            "NodePort skips the firewall"
        );
        assert_eq!(
            plan.chains[&fw],
            vec![
                format!("-A {fw} -s 192.168.77.0/24 -m comment --comment \"default/hello loadbalancer IP\" -j {ext}"),
                format!("-A {fw} -s 203.0.113.9/32 -m comment --comment \"default/hello loadbalancer IP\" -j {ext}"),
                format!(
                    "-A {fw} -m comment --comment \"other traffic to default/hello will be dropped by KUBE-PROXY-FIREWALL\""
                ),
            ]
        );
        assert_eq!(
            plan.filter_shared[..1],
            vec![format!(
                "-A KUBE-PROXY-FIREWALL -d 203.0.113.9/32 -p tcp -m comment --comment \"default/hello traffic not accepted by {fw}\" -m tcp --dport 80 -j DROP"
            )]
        );
    }

    #[test]
    fn partial_input_rewrites_top_chains_but_only_the_changed_services_chains() {
        let a = plan_ports(&[hello(3)], &ctx());
        let mut other = hello(2);
        other.name.service = NamespacedName::new("default", "other");
        other.cluster_ip = Some("10.96.0.11".parse().unwrap());
        let b = plan_ports(&[other], &ctx());
        let input = RestoreInput {
            services: vec![&a, &b],
            written: vec![&b],
            deleted: BTreeSet::from(["KUBE-SEP-GONE".to_string()]),
            ..RestoreInput::default()
        };
        let text = restore_input(&ctx(), &input);
        // default/hello keeps its chains: only its shared rules are rewritten (nat KUBE-SERVICES,
        // filter KUBE-SERVICES for its unused ports).
        assert_eq!(count(&nat(&text), "default/hello"), 1, "{text}");
        assert_eq!(count(&text, "default/hello"), 3, "{text}");
        assert!(text.contains(":KUBE-SERVICES - [0:0]") && text.contains(":KUBE-NODEPORTS - [0:0]"));
        for chain in b.chains.keys() {
            assert!(text.contains(&format!(":{chain} - [0:0]")));
        }
        for chain in a.chains.keys() {
            assert!(
                !text.contains(&format!(":{chain} ")) && !text.contains(&format!("-A {chain} ")),
                "{chain} is not touched"
            );
        }
        assert!(text.contains(":KUBE-SEP-GONE - [0:0]\n") && text.ends_with("-X KUBE-SEP-GONE\nCOMMIT\n"), "{text}");
        let nat = nat(&text);
        let last_rule = nat.lines().rfind(|l| l.starts_with("-A KUBE-SERVICES")).unwrap();
        assert!(last_rule.contains("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"), "{last_rule}");
    }

    #[test]
    fn unchanged_top_level_chains_are_left_out() {
        let a = plan_ports(&[hello(3)], &ctx());
        let b = plan_ports(&[hello(4)], &ctx());
        let input = RestoreInput {
            services: vec![&b],
            written: vec![&b],
            deleted: BTreeSet::from(["KUBE-SEP-GONE".to_string()]),
            filter_unchanged: true,
            nat_top_level_unchanged: true,
            ..RestoreInput::default()
        };
        let text = restore_input(&ctx(), &input);
        assert!(!text.contains("*filter") && !text.contains("KUBE-SERVICES") && !text.contains("KUBE-NODEPORTS"));
        assert!(!text.contains(":KUBE-MARK-MASQ") && !text.contains(":KUBE-POSTROUTING"), "{text}");
        let lines = b.chains.len() + b.chains.values().map(Vec::len).sum::<usize>() + 2 + 1 + 1;
        assert_eq!(text.lines().count(), lines, "{text}");
        assert!(text.starts_with("*nat\n") && text.ends_with("-X KUBE-SEP-GONE\nCOMMIT\n"), "{text}");
        // Only the filter table unchanged: nat's top level is rewritten, filter left out.
        let input =
            RestoreInput { services: vec![&a], written: vec![&a], filter_unchanged: true, ..RestoreInput::default() };
        let text = restore_input(&ctx(), &input);
        assert!(!text.contains("*filter") && text.contains(":KUBE-SERVICES - [0:0]"), "{text}");
    }

    #[test]
    fn large_cluster_mode_drops_the_service_chains_comments_only() {
        let large = PlanContext { large_cluster: true, ..ctx() };
        let mut sp = hello(3);
        sp.affinity_timeout = Some(10800);
        let (plan, small) = (plan_ports(std::slice::from_ref(&sp), &large), plan_ports(&[sp], &ctx()));
        assert_eq!((plan.nat_shared.clone(), plan.filter_shared.clone()), (small.nat_shared, small.filter_shared));
        assert_eq!(plan.chains.keys().collect::<Vec<_>>(), small.chains.keys().collect::<Vec<_>>());
        let rules: Vec<&String> = plan.chains.values().flatten().collect();
        assert_eq!(rules.len(), 1 + 3 + 3 + 3 * 2);
        // The Service chain's masquerade rule keeps its "cluster IP" comment, as upstream's.
        let (commented, bare): (Vec<&String>, Vec<&String>) = rules.iter().partition(|r| r.contains("comment"));
        assert!(commented.len() == 1 && commented[0].ends_with("-j KUBE-MARK-MASQ"), "{commented:#?}");
        assert_eq!(bare.len(), 12);
        let sep = endpoint_chain(&hello(3), &ep(1, false));
        assert_eq!(
            plan.chains[&sep],
            [
                format!("-A {sep} -s 10.244.0.1/32 -j KUBE-MARK-MASQ"),
                format!("-A {sep} -p tcp -m recent --set --name {sep} -m tcp -j DNAT --to-destination 10.244.0.1:8080"),
            ]
        );
        assert!(!is_large_cluster(LARGE_CLUSTER_ENDPOINTS) && is_large_cluster(LARGE_CLUSTER_ENDPOINTS + 1));
        let mut local = hello(3);
        local.cluster_endpoints[0] = ep(1, true);
        local.local_endpoints = vec![ep(1, true), ep(9, true)];
        assert_eq!(endpoint_count(&[hello(3), local]), 3 + 4);
    }

    #[test]
    fn nodeport_destinations_and_localhost() {
        let mut c = ctx();
        assert!(c.localhost_nodeports_active());
        assert!(jumps(&c).iter().any(|j| j.args.last().unwrap() == KUBE_FIREWALL));
        c.localhost_nodeports = false;
        assert!(nodeport_tail(&c)[0].contains("! -d 127.0.0.0/8 "));
        assert!(!jumps(&c).iter().any(|j| j.args.last().unwrap() == KUBE_FIREWALL));
        c.nodeports = NodePortDestinations::Ips(vec!["192.168.77.2".parse().unwrap(), "127.0.0.1".parse().unwrap()]);
        assert_eq!(nodeport_tail(&c).len(), 1);
        c.family = IpFamily::V6;
        c.nodeports = NodePortDestinations::AllLocal;
        assert!(nodeport_tail(&c)[0].contains("! -d ::1/128 "));
        assert!(!c.localhost_nodeports_active());
    }

    #[test]
    fn ipv6_addresses_are_host_routes_and_bracketed_endpoints() {
        let mut sp = hello(1);
        sp.family = IpFamily::V6;
        sp.cluster_ip = Some("fd00:96::10".parse().unwrap());
        sp.cluster_endpoints = vec![Endpoint { ip: "fd00:244::5".parse().unwrap(), port: 8080, is_local: false }];
        let c = PlanContext { family: IpFamily::V6, ..PlanContext::default() };
        let plan = plan_ports(&[sp.clone()], &c);
        assert!(plan.nat_shared[0].contains("-d fd00:96::10/128 "));
        let sep = endpoint_chain(&sp, &sp.cluster_endpoints[0]);
        assert_eq!(sep, format!("KUBE-SEP-{}", iptables_hash("default/hello", "tcp", Some("[fd00:244::5]:8080"))));
        assert!(plan.chains[&sep][1].ends_with("--to-destination [fd00:244::5]:8080"));
        assert!(plan_ports(&[sp], &ctx()).is_empty(), "other family's ports are skipped");
    }
}
