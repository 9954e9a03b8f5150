//! The nftables objects roadkeeper owns, as plain data: chains with their rules, named sets and
//! elements of the shared maps. Both the full ruleset and each Service's share are an [`Objects`].

use std::collections::BTreeMap;

use super::rule::{AffinitySet, ElementKey, Rule, Verdict};
use crate::table::IpFamily;

/// The nftables family keyword of a table (`ip` / `ip6`).
pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// Name of roadkeeper's table in each family.
pub const TABLE: &str = "roadkeeper";

/// The comment of roadkeeper's tables.
pub const TABLE_COMMENT: &str = "rules for roadkeeper";

/// A set or map shared by all Services; Services contribute elements to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Container {
    /// `daddr . l4proto . dport : verdict` — the O(1) service dispatch.
    ServiceIps,
    /// `l4proto . dport : verdict` — NodePort dispatch.
    ServiceNodePorts,
    /// `daddr . l4proto . dport : verdict` — REJECT/DROP for frontends without endpoints.
    NoEndpointServices,
    /// `l4proto . dport : verdict` — REJECT/DROP for NodePorts without endpoints.
    NoEndpointNodePorts,
    /// `daddr . l4proto . dport : verdict` — source-range firewall of load-balancer IPs.
    FirewallIps,
    /// Set of allocated ClusterIPs (unused ports are rejected).
    ClusterIps,
    /// Set of this node's addresses that accept NodePort traffic (filled by the layout).
    NodePortIps,
    /// Interval set of the ServiceCIDR ranges (filled by the layout).
    ServiceCidrs,
}

impl Container {
    /// Every shared container, in declaration order: Services' elements, then the node sets.
    pub const ALL: [Container; 8] = [
        Container::ServiceIps,
        Container::ServiceNodePorts,
        Container::NoEndpointServices,
        Container::NoEndpointNodePorts,
        Container::FirewallIps,
        Container::ClusterIps,
        Container::NodePortIps,
        Container::ServiceCidrs,
    ];

    /// The set/map name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Container::ServiceIps => "service-ips",
            Container::ServiceNodePorts => "service-nodeports",
            Container::NoEndpointServices => "no-endpoint-services",
            Container::NoEndpointNodePorts => "no-endpoint-nodeports",
            Container::FirewallIps => "firewall-ips",
            Container::ClusterIps => "cluster-ips",
            Container::NodePortIps => "nodeport-ips",
            Container::ServiceCidrs => "service-cidrs",
        }
    }

    /// `map` or `set`.
    pub fn keyword(self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }

    /// True for the verdict maps, false for the address sets.
    pub fn is_map(self) -> bool {
        !matches!(self, Container::ClusterIps | Container::NodePortIps | Container::ServiceCidrs)
    }

    /// The declaration's comment.
    pub fn comment(self) -> &'static str {
        match self {
            Container::ServiceIps => "ClusterIP, ExternalIP and LoadBalancer IP traffic",
            Container::ServiceNodePorts => "NodePort traffic",
            Container::NoEndpointServices => "vmap to drop or reject packets to services with no endpoints",
            Container::NoEndpointNodePorts => "vmap to drop or reject packets to service nodeports with no endpoints",
            Container::FirewallIps => "destinations that are subject to LoadBalancerSourceRanges",
            Container::ClusterIps => "Active ClusterIPs",
            Container::NodePortIps => "IPs that accept NodePort traffic",
            Container::ServiceCidrs => "ServiceCIDR ranges",
        }
    }

    /// True when the key is `daddr . l4proto . dport` (else `l4proto . dport`, or an address
    /// for the sets).
    pub fn keyed_by_address_and_port(self) -> bool {
        matches!(self, Container::ServiceIps | Container::NoEndpointServices | Container::FirewallIps)
    }

    /// The declaration body for a family.
    pub fn declaration(self, family: IpFamily) -> String {
        let addr = match family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        };
        let ty = match self {
            _ if self.keyed_by_address_and_port() => format!("type {addr} . inet_proto . inet_service : verdict"),
            Container::ServiceNodePorts | Container::NoEndpointNodePorts => {
                "type inet_proto . inet_service : verdict".into()
            }
            Container::ServiceCidrs => format!("type {addr} ; flags interval ; auto-merge"),
            _ => format!("type {addr}"),
        };
        format!("{ty} ; comment \"{}\" ;", self.comment())
    }
}

/// The value side of an element of a shared container, with its owner's comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementValue {
    /// The verdict, for maps; `None` for set elements.
    pub verdict: Option<Verdict>,
    /// `namespace/name[:port]` of the owner.
    pub comment: String,
}

/// Chains, owned sets and shared-container elements, keyed by family and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    /// Regular chains and their rules.
    pub chains: BTreeMap<(IpFamily, String), Vec<Rule>>,
    /// Session-affinity sets owned by this group of objects.
    pub sets: BTreeMap<(IpFamily, String), AffinitySet>,
    /// Elements of shared containers, keyed by (family, container, key).
    pub elements: BTreeMap<(IpFamily, Container, ElementKey), ElementValue>,
}

impl Objects {
    /// Adds a chain with its rules.
    pub fn chain(&mut self, family: IpFamily, name: String, rules: Vec<Rule>) {
        self.chains.insert((family, name), rules);
    }

    /// Adds an element to a shared container.
    pub fn element(
        &mut self,
        family: IpFamily,
        container: Container,
        key: ElementKey,
        verdict: Option<Verdict>,
        comment: &str,
    ) {
        self.elements.insert((family, container, key), ElementValue { verdict, comment: comment.to_string() });
    }

    /// Moves everything of `other` into `self`.
    pub fn extend(&mut self, other: Objects) {
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
        self.elements.extend(other.elements);
    }

    /// True when there is nothing.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.sets.is_empty() && self.elements.is_empty()
    }
}
