//! The fixed part of each table: hooked base chains, helper chains and node-level sets. It only
//! changes with the node or the config, and is rewritten by full syncs only.

use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::family_keyword;
use crate::table::IpFamily;

/// Inputs of the fixed layout of one family's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The table's family.
    pub family: IpFamily,
    /// Pod CIDRs of this family (traffic from them is "local" and not masqueraded).
    pub cluster_cidrs: Vec<IpNet>,
    /// The masquerade mark value (`0x4000`).
    pub masquerade_mark: u32,
    /// Addresses that accept NodePort traffic.
    pub nodeport_ips: Vec<IpAddr>,
    /// NodePorts on every local address (`--nodeport-addresses 0.0.0.0/0`): matched with
    /// `fib daddr type local` rather than `@nodeport-ips`; loopback stays excluded.
    pub nodeport_all_local: bool,
    /// Service CIDRs (from ServiceCIDR objects): unallocated addresses in them are dropped.
    pub service_cidrs: Vec<IpNet>,
}

/// A hooked base chain: name, hook declaration and rules.
pub struct BaseChain {
    /// Chain name.
    pub name: &'static str,
    /// `type ... hook ... priority ...`.
    pub hook: &'static str,
    /// Its rules.
    pub rules: Vec<String>,
}

/// A regular helper chain of the layout.
pub struct HelperChain {
    /// Chain name.
    pub name: &'static str,
    /// Its rules.
    pub rules: Vec<String>,
}

/// A node-level named set of the layout.
pub struct NodeSet {
    /// Set name.
    pub name: &'static str,
    /// Declaration body.
    pub declaration: String,
    /// Elements, as nft syntax.
    pub elements: Vec<String>,
}

impl Layout {
    /// The hooked base chains.
    pub fn base_chains(&self) -> Vec<BaseChain> {
        let new = |target: &str| format!("ct state new jump {target}");
        vec![
            BaseChain {
                name: "filter-prerouting",
                hook: "type filter hook prerouting priority -110 ;",
                rules: vec![new("firewall-check")],
            },
            BaseChain {
                name: "filter-input",
                hook: "type filter hook input priority -110 ;",
                rules: vec![new("nodeport-endpoints-check"), new("service-endpoints-check")],
            },
            BaseChain {
                name: "filter-forward",
                hook: "type filter hook forward priority -110 ;",
                rules: vec![new("service-endpoints-check"), new("cluster-ips-check")],
            },
            BaseChain {
                name: "filter-output",
                hook: "type filter hook output priority -110 ;",
                rules: vec![new("firewall-check")],
            },
            // Host traffic is checked after DNAT, so that what the external chains short-circuit
            // to the Cluster set (eTP=Local without local endpoints) is not dropped. NodePorts need
            // no check here: undNATed traffic to a node IP goes through filter-input.
            BaseChain {
                name: "filter-output-post-dnat",
                hook: "type filter hook output priority -90 ;",
                rules: vec![new("service-endpoints-check"), new("cluster-ips-check")],
            },
            BaseChain { name: "nat-prerouting", hook: "type nat hook prerouting priority dstnat ;", rules: vec!["jump services".into()] },
            BaseChain { name: "nat-output", hook: "type nat hook output priority -100 ;", rules: vec!["jump services".into()] },
            BaseChain { name: "nat-postrouting", hook: "type nat hook postrouting priority srcnat ;", rules: vec!["jump masquerading".into()] },
        ]
    }

    /// The regular chains the base chains and the service chains jump to.
    pub fn helper_chains(&self) -> Vec<HelperChain> {
        let ip = family_keyword(self.family);
        let mark = self.masquerade_mark;
        let mut not_pod = Vec::new();
        for cidr in &self.cluster_cidrs {
            not_pod.push(format!("{ip} saddr {cidr} return comment \"pod traffic is not masqueraded\""));
        }
        not_pod.push("jump mark-for-masquerade".into());
        let mut cluster_ips_check = vec![format!(
            "{ip} daddr @cluster-ips goto reject-chain comment \"Reject traffic to invalid ports of ClusterIPs\""
        )];
        if !self.service_cidrs.is_empty() {
            cluster_ips_check.push(format!(
                "{ip} daddr @service-cidrs drop comment \"Drop traffic to unallocated ClusterIPs\""
            ));
        }
        vec![
            HelperChain { name: "services", rules: vec![
                format!("{ip} daddr . meta l4proto . th dport vmap @service-ips"),
                format!("{} meta l4proto . th dport vmap @service-nodeports", self.nodeport_match()),
            ] },
            HelperChain { name: "firewall-check", rules: vec![format!("{ip} daddr . meta l4proto . th dport vmap @firewall-ips")] },
            HelperChain { name: "service-endpoints-check", rules: vec![format!("{ip} daddr . meta l4proto . th dport vmap @no-endpoint-services")] },
            HelperChain { name: "nodeport-endpoints-check", rules: vec![format!("{} meta l4proto . th dport vmap @no-endpoint-nodeports", self.nodeport_match())] },
            HelperChain { name: "cluster-ips-check", rules: cluster_ips_check },
            // A TCP reset fails connections at once in both families (Linux retries a SYN that
            // got an ICMPv6 port-unreachable, so IPv6 clients would hang ~1 s per attempt).
            HelperChain { name: "reject-chain", rules: vec![
                "meta l4proto tcp reject with tcp reset comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"".into(),
                "reject comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"".into(),
            ] },
            HelperChain { name: "mark-for-masquerade", rules: vec![format!("meta mark set meta mark | {mark:#x}")] },
            HelperChain { name: "mark-if-not-pod-traffic", rules: not_pod },
            HelperChain { name: "masquerading", rules: vec![
                format!("meta mark & {mark:#x} == 0 return"),
                format!("meta mark set meta mark ^ {mark:#x}"),
                "masquerade fully-random".into(),
            ] },
        ]
    }

    /// The condition selecting NodePort traffic by destination.
    fn nodeport_match(&self) -> String {
        match (self.nodeport_all_local, self.family) {
            (true, IpFamily::V4) => "fib daddr type local ip daddr != 127.0.0.0/8".into(),
            (true, IpFamily::V6) => "fib daddr type local ip6 daddr != ::1".into(),
            (false, family) => format!("{} daddr @nodeport-ips", family_keyword(family)),
        }
    }

    /// The node-level sets.
    pub fn node_sets(&self) -> Vec<NodeSet> {
        let addr = match self.family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        };
        vec![
            NodeSet {
                name: "nodeport-ips",
                declaration: format!("type {addr} ; comment \"IPs that accept NodePort traffic\" ;"),
                elements: self.nodeport_ips.iter().map(ToString::to_string).collect(),
            },
            NodeSet {
                name: "service-cidrs",
                declaration: format!("type {addr} ; flags interval ; auto-merge ; comment \"ServiceCIDR ranges\" ;"),
                elements: self.service_cidrs.iter().map(ToString::to_string).collect(),
            },
        ]
    }
}
