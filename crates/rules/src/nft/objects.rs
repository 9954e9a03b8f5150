//! The nftables objects roadkeeper owns, as plain data: chains with their rules, named sets and
//! elements of the shared sets and maps. Both the full ruleset and each Service's share are an
//! [`Objects`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::rule::{AFFINITY, ElementKey, Rule, Verdict};
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

/// Which endpoint list a lookup selects from: a frontend's own list (the Service's internal
/// endpoints for a ClusterIP, its external ones for the others), or, for frontends of an
/// `externalTrafficPolicy: Local` Service, the Cluster list that pods and the host are sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Selection {
    /// ClusterIP, externalIP and load-balancer frontends, keyed `daddr . l4proto . dport`.
    Service,
    /// NodePorts, keyed `l4proto . dport`.
    NodePort,
    /// The Cluster list of `externalTrafficPolicy: Local` externalIP and load-balancer frontends.
    ServiceCluster,
    /// The Cluster list of `externalTrafficPolicy: Local` NodePorts.
    NodePortCluster,
}

impl Selection {
    /// Every selection, in the order of the layout.
    pub const ALL: [Selection; 4] =
        [Selection::Service, Selection::NodePort, Selection::ServiceCluster, Selection::NodePortCluster];

    /// The stem of the names: the map `<stem>s`, the count sets `<stem>s-<n>`, the chain
    /// `select-<stem>`.
    fn stem(self) -> &'static str {
        match self {
            Selection::Service => "service-endpoint",
            Selection::NodePort => "nodeport-endpoint",
            Selection::ServiceCluster => "service-cluster-endpoint",
            Selection::NodePortCluster => "nodeport-cluster-endpoint",
        }
    }

    /// True when frontends are keyed by address, protocol and port (else protocol and port).
    pub fn by_address(self) -> bool {
        matches!(self, Selection::Service | Selection::ServiceCluster)
    }

    /// The chain whose rules pick an endpoint, one rule per endpoint count in use.
    pub fn chain(self) -> String {
        format!("select-{}", self.stem())
    }
}

/// A set or map shared by all Services; Services contribute elements to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Container {
    /// `daddr . l4proto . dport : verdict`: frontends of session-affinity Services, dispatched
    /// to their chains.
    ServiceIps,
    /// `l4proto . dport : verdict`: NodePorts of session-affinity Services.
    ServiceNodePorts,
    /// `daddr . l4proto . dport : verdict`: source-range firewall of load-balancer IPs.
    FirewallIps,
    /// Set of allocated ClusterIPs (unused ports are rejected, traffic to them masqueraded unless
    /// it comes from a pod).
    ClusterIps,
    /// Set of this node's addresses that accept NodePort traffic (filled by the layout).
    NodePortIps,
    /// Interval set of the ServiceCIDR ranges (filled by the layout).
    ServiceCidrs,
    /// `daddr . l4proto . dport`: frontends without any endpoint, rejected.
    RejectServices,
    /// `daddr . l4proto . dport`: frontends without a usable endpoint (traffic policy Local),
    /// dropped.
    DropServices,
    /// `l4proto . dport`: NodePorts without any endpoint, rejected.
    RejectNodePorts,
    /// `l4proto . dport`: NodePorts without a local endpoint (traffic policy Local), dropped.
    DropNodePorts,
    /// `daddr . l4proto . dport`: externalIP and load-balancer frontends of
    /// `externalTrafficPolicy: Cluster` Services (their traffic is masqueraded).
    ExternalServices,
    /// `l4proto . dport`: NodePorts of `externalTrafficPolicy: Cluster` Services.
    ExternalNodePorts,
    /// `daddr . l4proto . dport`: externalIP and load-balancer frontends of
    /// `externalTrafficPolicy: Local` Services.
    LocalServices,
    /// `l4proto . dport`: NodePorts of `externalTrafficPolicy: Local` Services.
    LocalNodePorts,
    /// `frontend . index : endpoint address . port`: the endpoint lists.
    Endpoints(Selection),
    /// The frontends whose list in [`Container::Endpoints`] has this many endpoints.
    Count(Selection, u32),
    /// `address . address` for every endpoint address: a DNATed packet from an endpoint to
    /// itself (hairpin) is masqueraded. Shared by every Service with that endpoint address.
    Hairpin,
    /// `client . endpoint . port . ClusterIP . port`, with timeouts: which endpoint each client of
    /// a session-affinity Service port was last sent to. Filled from the packet path (the
    /// endpoint chains' `update`), looked up by the endpoint-set chains; never flushed by a sync.
    /// One set rather than one per endpoint: the kernel finds a set by walking the table's list
    /// of sets by name, so thousands of sets made each full sync quadratic.
    Affinity,
}

impl Container {
    /// The shared containers of the layout, in declaration order (the count sets come and go
    /// with the endpoint counts in use).
    pub const FIXED: [Container; 20] = [
        Container::ServiceIps,
        Container::ServiceNodePorts,
        Container::FirewallIps,
        Container::ClusterIps,
        Container::NodePortIps,
        Container::ServiceCidrs,
        Container::RejectServices,
        Container::DropServices,
        Container::RejectNodePorts,
        Container::DropNodePorts,
        Container::ExternalServices,
        Container::ExternalNodePorts,
        Container::LocalServices,
        Container::LocalNodePorts,
        Container::Endpoints(Selection::Service),
        Container::Endpoints(Selection::NodePort),
        Container::Endpoints(Selection::ServiceCluster),
        Container::Endpoints(Selection::NodePortCluster),
        Container::Hairpin,
        Container::Affinity,
    ];

    /// At most this many affinity entries per family: a bound on what clients can make the
    /// kernel hold (upstream's per-endpoint sets hold 65,535 each). When it is full, new clients
    /// are still served, without affinity until entries expire.
    pub const AFFINITY_SIZE: u32 = 524_288;

    /// The set/map name in the table.
    pub fn name(self) -> String {
        match self {
            Container::ServiceIps => "service-ips".into(),
            Container::ServiceNodePorts => "service-nodeports".into(),
            Container::FirewallIps => "firewall-ips".into(),
            Container::ClusterIps => "cluster-ips".into(),
            Container::NodePortIps => "nodeport-ips".into(),
            Container::ServiceCidrs => "service-cidrs".into(),
            Container::RejectServices => "reject-services".into(),
            Container::DropServices => "drop-services".into(),
            Container::RejectNodePorts => "reject-nodeports".into(),
            Container::DropNodePorts => "drop-nodeports".into(),
            Container::ExternalServices => "external-services".into(),
            Container::ExternalNodePorts => "external-nodeports".into(),
            Container::LocalServices => "local-policy-services".into(),
            Container::LocalNodePorts => "local-policy-nodeports".into(),
            Container::Endpoints(selection) => format!("{}s", selection.stem()),
            Container::Count(selection, n) => format!("{}s-{n}", selection.stem()),
            Container::Hairpin => "hairpin".into(),
            Container::Affinity => AFFINITY.into(),
        }
    }

    /// `map` or `set`.
    pub fn keyword(self) -> &'static str {
        if self.data() == DataKind::None { "set" } else { "map" }
    }

    /// What the container's keys are.
    pub fn key(self) -> KeyKind {
        match self {
            Container::ClusterIps | Container::NodePortIps => KeyKind::Addr,
            Container::ServiceCidrs => KeyKind::AddrRange,
            Container::ServiceIps
            | Container::FirewallIps
            | Container::RejectServices
            | Container::DropServices
            | Container::ExternalServices
            | Container::LocalServices => KeyKind::AddrProtoPort,
            Container::ServiceNodePorts
            | Container::RejectNodePorts
            | Container::DropNodePorts
            | Container::ExternalNodePorts
            | Container::LocalNodePorts => KeyKind::ProtoPort,
            Container::Count(selection, _) if selection.by_address() => KeyKind::AddrProtoPort,
            Container::Count(..) => KeyKind::ProtoPort,
            Container::Endpoints(selection) if selection.by_address() => KeyKind::AddrProtoPortIndex,
            Container::Endpoints(_) => KeyKind::ProtoPortIndex,
            Container::Hairpin => KeyKind::AddrPair,
            Container::Affinity => KeyKind::Affinity,
        }
    }

    /// What the container's elements map to.
    pub fn data(self) -> DataKind {
        match self {
            Container::ServiceIps | Container::ServiceNodePorts | Container::FirewallIps => DataKind::Verdict,
            Container::Endpoints(_) => DataKind::Endpoint,
            _ => DataKind::None,
        }
    }

    /// The declaration's comment.
    pub fn comment(self) -> String {
        match self {
            Container::ServiceIps => "ClusterIP, ExternalIP and LoadBalancer IP traffic".into(),
            Container::ServiceNodePorts => "NodePort traffic".into(),
            Container::FirewallIps => "destinations that are subject to LoadBalancerSourceRanges".into(),
            Container::ClusterIps => "Active ClusterIPs".into(),
            Container::NodePortIps => "IPs that accept NodePort traffic".into(),
            Container::ServiceCidrs => "ServiceCIDR ranges".into(),
            Container::RejectServices => "services with no endpoints: rejected".into(),
            Container::DropServices => "services with no usable endpoint (traffic policy Local): dropped".into(),
            Container::RejectNodePorts => "nodeports with no endpoints: rejected".into(),
            Container::DropNodePorts => "nodeports with no local endpoint (traffic policy Local): dropped".into(),
            Container::ExternalServices => "external IPs of externalTrafficPolicy Cluster services".into(),
            Container::ExternalNodePorts => "nodeports of externalTrafficPolicy Cluster services".into(),
            Container::LocalServices => "external IPs of externalTrafficPolicy Local services".into(),
            Container::LocalNodePorts => "nodeports of externalTrafficPolicy Local services".into(),
            Container::Endpoints(Selection::Service) => "endpoints of each service frontend, by index".into(),
            Container::Endpoints(Selection::NodePort) => "endpoints of each nodeport, by index".into(),
            Container::Endpoints(Selection::ServiceCluster) => {
                "cluster endpoints of externalTrafficPolicy Local frontends, by index".into()
            }
            Container::Endpoints(Selection::NodePortCluster) => {
                "cluster endpoints of externalTrafficPolicy Local nodeports, by index".into()
            }
            Container::Count(selection, n) => {
                format!("frontends with {n} entries in {}", Container::Endpoints(selection).name())
            }
            Container::Hairpin => "endpoint addresses: traffic from an endpoint to itself is masqueraded".into(),
            Container::Affinity => "session affinity: the endpoint each client was last sent to".into(),
        }
    }

    /// The declaration body for a family, in nft syntax.
    pub fn declaration(self, family: IpFamily) -> String {
        let (addr, ip) = match family {
            IpFamily::V4 => ("ipv4_addr", "ip"),
            IpFamily::V6 => ("ipv6_addr", "ip6"),
        };
        let ty = match (self.key(), self.data()) {
            (KeyKind::AddrProtoPort, DataKind::Verdict) => format!("type {addr} . inet_proto . inet_service : verdict"),
            (KeyKind::ProtoPort, DataKind::Verdict) => "type inet_proto . inet_service : verdict".into(),
            (KeyKind::AddrProtoPort, _) => format!("type {addr} . inet_proto . inet_service"),
            (KeyKind::ProtoPort, _) => "type inet_proto . inet_service".into(),
            (KeyKind::AddrProtoPortIndex, _) => {
                format!("typeof {ip} daddr . meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport")
            }
            (KeyKind::ProtoPortIndex, _) => {
                format!("typeof meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport")
            }
            (KeyKind::AddrPair, _) => format!("type {addr} . {addr}"),
            (KeyKind::Affinity, _) => format!(
                "type {addr} . {addr} . inet_service . {addr} . inet_service ; flags dynamic,timeout ; size {}",
                Self::AFFINITY_SIZE
            ),
            (KeyKind::AddrRange, _) => format!("type {addr} ; flags interval ; auto-merge"),
            (KeyKind::Addr, _) => format!("type {addr}"),
        };
        format!("{ty} ; comment \"{}\" ;", self.comment())
    }
}

/// The keys of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// An address.
    Addr,
    /// An interval of addresses.
    AddrRange,
    /// `address . protocol . port`.
    AddrProtoPort,
    /// `protocol . port`.
    ProtoPort,
    /// `address . protocol . port . index`.
    AddrProtoPortIndex,
    /// `protocol . port . index`.
    ProtoPortIndex,
    /// `address . address`.
    AddrPair,
    /// `address . address . port . address . port` (session affinity).
    Affinity,
}

/// What the elements of a container map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// Nothing: a set.
    None,
    /// A verdict: a verdict map.
    Verdict,
    /// An endpoint address and port: a data map.
    Endpoint,
}

/// What an element of a map maps to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    /// A verdict (verdict maps).
    Verdict(Verdict),
    /// An endpoint (the endpoint maps).
    Endpoint(IpAddr, u16),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Verdict(verdict) => write!(f, "{verdict}"),
            Value::Endpoint(addr, port) => write!(f, "{addr} . {port}"),
        }
    }
}

/// The value side of an element of a shared container, with its owner's comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementValue {
    /// What it maps to, for maps; `None` for set elements.
    pub value: Option<Value>,
    /// `namespace/name[:port]` of the owner.
    pub comment: String,
}

/// Chains and shared-container elements, keyed by family and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    /// Regular chains and their rules.
    pub chains: BTreeMap<(IpFamily, String), Vec<Rule>>,
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
        value: Option<Value>,
        comment: &str,
    ) {
        self.elements.insert((family, container, key), ElementValue { value, comment: comment.to_string() });
    }

    /// Moves everything of `other` into `self`.
    pub fn extend(&mut self, other: Objects) {
        self.chains.extend(other.chains);
        self.elements.extend(other.elements);
    }

    /// True when there is nothing.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.elements.is_empty()
    }
}
