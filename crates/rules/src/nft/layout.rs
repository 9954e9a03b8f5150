//! The fixed part of each table: hooked base chains, helper chains, the shared sets and maps and
//! the node-level sets, as typed objects. It only changes with the node or the config, and is
//! rewritten by full syncs only (in the same transaction as every Service's objects).

use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::{Container, Selection};
use super::rule::{Action, ChainType, ElementKey, Hook, HookPoint, LookupKey, Match, Op, Rule};
use crate::table::{IpFamily, Protocol};

/// Inputs of the fixed layout of one family's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The table's family.
    pub family: IpFamily,
    /// Pod CIDRs of this family (traffic from them is "local" and not masqueraded).
    pub cluster_cidrs: Vec<IpNet>,
    /// The masquerade mark value (`0x4000`).
    pub masquerade_mark: u32,
    /// Masquerade all traffic to ClusterIPs (`--masquerade-all`), not only what does not come
    /// from a pod.
    pub masquerade_all: bool,
    /// Addresses that accept NodePort traffic.
    pub nodeport_ips: Vec<IpAddr>,
    /// NodePorts on every local address (`--nodeport-addresses 0.0.0.0/0`): matched with
    /// `fib daddr type local` rather than `@nodeport-ips`; loopback stays excluded.
    pub nodeport_all_local: bool,
    /// Service CIDRs (from ServiceCIDR objects): unallocated addresses in them are dropped.
    pub service_cidrs: Vec<IpNet>,
}

/// A hooked base chain: name, hook and rules.
pub struct BaseChain {
    /// Chain name.
    pub name: &'static str,
    /// `type ... hook ... priority ...`.
    pub hook: Hook,
    /// Its rules.
    pub rules: Vec<Rule>,
}

/// A regular helper chain of the layout.
pub struct HelperChain {
    /// Chain name.
    pub name: String,
    /// Its rules.
    pub rules: Vec<Rule>,
}

/// A node-level set of the layout and its elements.
pub struct NodeSet {
    /// The set.
    pub container: Container,
    /// Its elements.
    pub elements: Vec<ElementKey>,
}

impl Layout {
    fn rule(&self, matches: Vec<Match>, action: Action) -> Rule {
        Rule::when(self.family, matches, action, "")
    }

    /// The hooked base chains.
    pub fn base_chains(&self) -> Vec<BaseChain> {
        let new = |target: &str| self.rule(vec![Match::CtStateNew], Action::Jump(target.into()));
        let jump = |target: &str| self.rule(Vec::new(), Action::Jump(target.into()));
        let filter = |point, priority| Hook { chain_type: ChainType::Filter, point, priority };
        let nat = |point, priority| Hook { chain_type: ChainType::Nat, point, priority };
        vec![
            BaseChain {
                name: "filter-prerouting",
                hook: filter(HookPoint::Prerouting, -110),
                rules: vec![new("firewall-check")],
            },
            BaseChain {
                name: "filter-input",
                hook: filter(HookPoint::Input, -110),
                rules: vec![new("nodeport-endpoints-check"), new("service-endpoints-check")],
            },
            BaseChain {
                name: "filter-forward",
                hook: filter(HookPoint::Forward, -110),
                rules: vec![new("service-endpoints-check"), new("cluster-ips-check")],
            },
            BaseChain {
                name: "filter-output",
                hook: filter(HookPoint::Output, -110),
                rules: vec![new("firewall-check")],
            },
            // Host traffic is checked after DNAT, so that what the external chains short-circuit
            // to the Cluster set (eTP=Local without local endpoints) is not dropped. NodePorts need
            // no check here: undNATed traffic to a node IP goes through filter-input.
            BaseChain {
                name: "filter-output-post-dnat",
                hook: filter(HookPoint::Output, -90),
                rules: vec![new("service-endpoints-check"), new("cluster-ips-check")],
            },
            BaseChain { name: "nat-prerouting", hook: nat(HookPoint::Prerouting, -100), rules: vec![jump("services")] },
            BaseChain { name: "nat-output", hook: nat(HookPoint::Output, -100), rules: vec![jump("services")] },
            BaseChain {
                name: "nat-postrouting",
                hook: nat(HookPoint::Postrouting, 100),
                rules: vec![jump("masquerading")],
            },
        ]
    }

    /// The regular chains the base chains and the service chains jump to.
    pub fn helper_chains(&self) -> Vec<HelperChain> {
        let fam = self.family;
        let mark = self.masquerade_mark;
        let vmap = |key, map: Container| Action::Vmap { key, map: map.name() };
        let by_address = |action| self.rule(Vec::new(), action);
        let by_node_port = |action| self.rule(self.nodeport_match(), action);
        let in_set = |key, container: Container| Match::InSet { key, set: container.name() };
        let address_in = |container| in_set(LookupKey::DaddrProtoPort, container);
        let node_port_in = |container| {
            let mut matches = self.nodeport_match();
            matches.push(in_set(LookupKey::ProtoPort, container));
            matches
        };
        let jump = |chain: &str| Action::Jump(chain.into());
        let goto = |chain: String| Action::Goto(chain);
        let mut not_pod = Vec::new();
        for cidr in &self.cluster_cidrs {
            not_pod.push(Rule::when(
                fam,
                vec![Match::SaddrIn(*cidr)],
                Action::Return,
                "pod traffic is not masqueraded",
            ));
        }
        not_pod.push(self.rule(Vec::new(), jump("mark-for-masquerade")));
        let mut cluster_ips_check = vec![Rule::when(
            fam,
            vec![Match::DaddrInSet(Container::ClusterIps.name())],
            Action::Goto("reject-chain".into()),
            "Reject traffic to invalid ports of ClusterIPs",
        )];
        if !self.service_cidrs.is_empty() {
            cluster_ips_check.push(Rule::when(
                fam,
                vec![Match::DaddrInSet(Container::ServiceCidrs.name())],
                Action::Drop,
                "Drop traffic to unallocated ClusterIPs",
            ));
        }
        // Traffic to a ClusterIP: all of it masqueraded with --masquerade-all, else what does not
        // come from a pod (none without a pod CIDR to tell).
        let mut services = Vec::new();
        let cluster_ips = || vec![Match::DaddrInSet(Container::ClusterIps.name())];
        if self.masquerade_all {
            services.push(self.rule(cluster_ips(), jump("mark-for-masquerade")));
        } else if !self.cluster_cidrs.is_empty() {
            services.push(self.rule(cluster_ips(), jump("mark-if-not-pod-traffic")));
        }
        services.extend([
            by_address(vmap(LookupKey::DaddrProtoPort, Container::ServiceIps)),
            by_node_port(vmap(LookupKey::ProtoPort, Container::ServiceNodePorts)),
            self.rule(vec![address_in(Container::ExternalServices)], jump("mark-for-masquerade")),
            self.rule(node_port_in(Container::ExternalNodePorts), jump("mark-for-masquerade")),
            self.rule(vec![address_in(Container::LocalServices)], jump("service-local-policy")),
            self.rule(node_port_in(Container::LocalNodePorts), jump("nodeport-local-policy")),
            self.rule(Vec::new(), jump(&Selection::Service.chain())),
            self.rule(self.nodeport_match(), jump(&Selection::NodePort.chain())),
        ]);
        // externalTrafficPolicy: Local: pods and the host go to the Cluster list (the host
        // masqueraded); the rest returns to the Local list.
        let local_policy = |cluster: Selection| {
            let mut rules: Vec<Rule> = self
                .cluster_cidrs
                .iter()
                .map(|cidr| self.rule(vec![Match::SaddrIn(*cidr)], goto(cluster.chain())))
                .collect();
            rules.push(self.rule(vec![Match::FibSaddrLocal], jump("mark-for-masquerade")));
            rules.push(self.rule(vec![Match::FibSaddrLocal], goto(cluster.chain())));
            rules
        };
        let reject_note = "helper for @reject-services / @reject-nodeports";
        let mut chains = vec![
            HelperChain { name: "services".into(), rules: services },
            HelperChain { name: "service-local-policy".into(), rules: local_policy(Selection::ServiceCluster) },
            HelperChain { name: "nodeport-local-policy".into(), rules: local_policy(Selection::NodePortCluster) },
            HelperChain {
                name: "firewall-check".into(),
                rules: vec![by_address(vmap(LookupKey::DaddrProtoPort, Container::FirewallIps))],
            },
            HelperChain {
                name: "service-endpoints-check".into(),
                rules: vec![
                    self.rule(vec![address_in(Container::RejectServices)], goto("reject-chain".into())),
                    self.rule(vec![address_in(Container::DropServices)], Action::Drop),
                ],
            },
            HelperChain {
                name: "nodeport-endpoints-check".into(),
                rules: vec![
                    self.rule(node_port_in(Container::RejectNodePorts), goto("reject-chain".into())),
                    self.rule(node_port_in(Container::DropNodePorts), Action::Drop),
                ],
            },
            HelperChain { name: "cluster-ips-check".into(), rules: cluster_ips_check },
            // A TCP reset fails connections at once in both families (Linux retries a SYN that
            // got an ICMPv6 port-unreachable, so IPv6 clients would hang ~1 s per attempt).
            HelperChain {
                name: "reject-chain".into(),
                rules: vec![
                    Rule::when(fam, vec![Match::L4Proto(Protocol::Tcp)], Action::RejectTcpReset, reject_note),
                    Rule::always(fam, Action::Reject, reject_note),
                ],
            },
            HelperChain {
                name: "mark-for-masquerade".into(),
                rules: vec![self.rule(Vec::new(), Action::MarkOr(mark))],
            },
            HelperChain { name: "mark-if-not-pod-traffic".into(), rules: not_pod },
            HelperChain {
                name: "masquerading".into(),
                rules: vec![
                    Rule::when(
                        fam,
                        vec![Match::CtStatusDnat, Match::PairInSet(Container::Hairpin.name())],
                        jump("mark-for-masquerade"),
                        "hairpin: an endpoint reaching itself through a service",
                    ),
                    self.rule(vec![Match::MarkUnset(mark)], Action::Return),
                    self.rule(Vec::new(), Action::MarkXor(mark)),
                    self.rule(Vec::new(), Action::MasqueradeFullyRandom),
                ],
            },
        ];
        // The endpoint pickers: one rule per endpoint count in use, added with the counts
        // ([`count_rule`]).
        chains.extend(Selection::ALL.iter().map(|s| HelperChain { name: s.chain(), rules: Vec::new() }));
        chains
    }

    /// The conditions selecting NodePort traffic by destination.
    fn nodeport_match(&self) -> Vec<Match> {
        if self.nodeport_all_local {
            let loopback: IpNet = match self.family {
                IpFamily::V4 => "127.0.0.0/8".parse().expect("valid prefix"),
                IpFamily::V6 => "::1/128".parse().expect("valid prefix"),
            };
            vec![Match::FibDaddrLocal, Match::DaddrNotIn(loopback)]
        } else {
            vec![Match::DaddrInSet(Container::NodePortIps.name())]
        }
    }

    /// The node-level sets.
    pub fn node_sets(&self) -> Vec<NodeSet> {
        vec![
            NodeSet {
                container: Container::NodePortIps,
                elements: self.nodeport_ips.iter().map(|ip| ElementKey::Addr(*ip)).collect(),
            },
            NodeSet {
                container: Container::ServiceCidrs,
                elements: merged_ranges(&self.service_cidrs)
                    .into_iter()
                    .map(|(a, b)| ElementKey::Range(a, b))
                    .collect(),
            },
        ]
    }

    /// Every op that (re)writes this family's layout, in an order the kernel accepts within one
    /// transaction: the table, the shared sets and maps (declared and emptied, except the
    /// affinity entries the packet path keeps), the node sets' elements, the helper chains
    /// (emptied, then their rules), then the base chains. Services' elements are added after
    /// these.
    pub fn ops(&self) -> Vec<Op> {
        let family = self.family;
        let mut ops = vec![Op::AddTable { family }];
        ops.extend(Container::FIXED.iter().map(|&container| Op::AddContainer { family, container }));
        let emptied = Container::FIXED.iter().filter(|&&c| c != Container::Affinity);
        ops.extend(emptied.map(|&container| Op::FlushSet { family, container }));
        for set in self.node_sets() {
            ops.extend(set.elements.into_iter().map(|key| Op::AddElement {
                family,
                container: set.container,
                key,
                value: None,
                comment: String::new(),
            }));
        }
        let helpers = self.helper_chains();
        for chain in &helpers {
            ops.push(Op::AddChain { family, name: chain.name.clone() });
            ops.push(Op::FlushChain { family, name: chain.name.clone() });
        }
        for chain in helpers {
            ops.extend(chain.rules.into_iter().map(|rule| Op::AddRule { chain: chain.name.clone(), rule }));
        }
        for chain in self.base_chains() {
            ops.push(Op::AddBaseChain { family, name: chain.name.into(), hook: chain.hook });
            ops.push(Op::FlushChain { family, name: chain.name.into() });
            ops.extend(chain.rules.into_iter().map(|rule| Op::AddRule { chain: chain.name.into(), rule }));
        }
        ops
    }
}

/// The CIDRs as sorted, disjoint, non-adjacent inclusive ranges: what nft's `auto-merge` makes
/// of them (the kernel refuses overlapping intervals, and nft lists adjacent ones merged).
pub fn merged_ranges(cidrs: &[IpNet]) -> Vec<(IpAddr, IpAddr)> {
    let as_int = |ip: IpAddr| match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let mut ranges: Vec<(u128, u128, bool)> =
        cidrs.iter().map(|c| (as_int(c.network()), as_int(c.broadcast()), c.addr().is_ipv4())).collect();
    ranges.sort();
    let mut merged: Vec<(u128, u128, bool)> = Vec::new();
    for (first, last, v4) in ranges {
        match merged.last_mut() {
            Some((_, end, v)) if *v == v4 && first <= end.saturating_add(1) => *end = (*end).max(last),
            _ => merged.push((first, last, v4)),
        }
    }
    let to_ip = |n: u128, v4: bool| {
        if v4 { IpAddr::from(std::net::Ipv4Addr::from(n as u32)) } else { IpAddr::from(std::net::Ipv6Addr::from(n)) }
    };
    merged.into_iter().map(|(a, b, v4)| (to_ip(a, v4), to_ip(b, v4))).collect()
}

/// The rule of `selection`'s picker chain for frontends with `n` endpoints: a frontend in the
/// count set goes to its endpoint number `numgen random mod n`, each with chance 1/n.
pub fn count_rule(family: IpFamily, selection: Selection, n: u32) -> Rule {
    let key = if selection.by_address() { LookupKey::DaddrProtoPort } else { LookupKey::ProtoPort };
    Rule::when(
        family,
        vec![Match::InSet { key, set: Container::Count(selection, n).name() }],
        Action::DnatMap { key, modulus: n, map: Container::Endpoints(selection).name() },
        "",
    )
}
