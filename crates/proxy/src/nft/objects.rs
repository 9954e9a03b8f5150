//! The nftables objects roadkeeper owns, as plain data: chains with their rules, named sets and
//! elements of the shared maps. Both the full ruleset and each Service's share are an [`Objects`].

use std::collections::BTreeMap;

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
    /// `numgen : verdict` — endpoint choice, one block of keys per endpoint set.
    EndpointSelect,
    /// Set of allocated ClusterIPs (unused ports are rejected).
    ClusterIps,
}

impl Container {
    /// Every shared container, in declaration order.
    pub const ALL: [Container; 7] = [
        Container::ServiceIps,
        Container::ServiceNodePorts,
        Container::NoEndpointServices,
        Container::NoEndpointNodePorts,
        Container::FirewallIps,
        Container::EndpointSelect,
        Container::ClusterIps,
    ];

    /// The set/map name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Container::ServiceIps => "service-ips",
            Container::ServiceNodePorts => "service-nodeports",
            Container::NoEndpointServices => "no-endpoint-services",
            Container::NoEndpointNodePorts => "no-endpoint-nodeports",
            Container::FirewallIps => "firewall-ips",
            Container::EndpointSelect => "endpoint-select",
            Container::ClusterIps => "cluster-ips",
        }
    }

    /// `map` or `set`.
    pub fn keyword(self) -> &'static str {
        if self == Container::ClusterIps { "set" } else { "map" }
    }

    /// The declaration body for a family.
    pub fn declaration(self, family: IpFamily) -> String {
        let addr = match family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        };
        let (ty, comment) = match self {
            Container::ServiceIps => (format!("type {addr} . inet_proto . inet_service : verdict"), "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
            Container::ServiceNodePorts => ("type inet_proto . inet_service : verdict".into(), "NodePort traffic"),
            Container::NoEndpointServices => (format!("type {addr} . inet_proto . inet_service : verdict"), "vmap to drop or reject packets to services with no endpoints"),
            Container::NoEndpointNodePorts => ("type inet_proto . inet_service : verdict".into(), "vmap to drop or reject packets to service nodeports with no endpoints"),
            Container::FirewallIps => (format!("type {addr} . inet_proto . inet_service : verdict"), "destinations that are subject to LoadBalancerSourceRanges"),
            Container::EndpointSelect => ("typeof numgen random mod 1 : verdict".into(), "random endpoint choice: one block of keys per endpoint set"),
            Container::ClusterIps => (format!("type {addr}"), "Active ClusterIPs"),
        };
        format!("{ty} ; comment \"{comment}\" ;")
    }
}

/// One element of a shared container: its key and, for maps, its value, plus a comment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    /// The key as nft syntax (`10.96.0.10 . tcp . 80`).
    pub key: String,
    /// The verdict or data (`goto service-...`); empty for set elements.
    pub value: String,
    /// `namespace/name[:port]` of the owner.
    pub comment: String,
}

impl Element {
    /// The element as written inside `{ ... }` of `add element`.
    pub fn to_nft(&self) -> String {
        let mut s = format!("{} comment \"{}\"", self.key, self.comment);
        if !self.value.is_empty() {
            s.push_str(" : ");
            s.push_str(&self.value);
        }
        s
    }
}

/// A named set owned by one Service (session-affinity sets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedSet {
    /// Its declaration body.
    pub declaration: String,
}

/// Chains, owned sets and shared-container elements, keyed by family and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    /// Regular chains and their rules.
    pub chains: BTreeMap<(IpFamily, String), Vec<String>>,
    /// Named sets owned by this group of objects.
    pub sets: BTreeMap<(IpFamily, String), OwnedSet>,
    /// Elements of shared containers, keyed by (family, container, key).
    pub elements: BTreeMap<(IpFamily, Container, String), Element>,
}

impl Objects {
    /// Adds a chain with its rules.
    pub fn chain(&mut self, family: IpFamily, name: String, rules: Vec<String>) {
        self.chains.insert((family, name), rules);
    }

    /// Adds an element to a shared container.
    pub fn element(&mut self, family: IpFamily, container: Container, key: String, value: String, comment: &str) {
        let element = Element { key: key.clone(), value, comment: comment.to_string() };
        self.elements.insert((family, container, key), element);
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
