//! The node's service table: a pure function from one Service, its EndpointSlices, this node and
//! the proxy config to the service ports this node must proxy, with their frontends and the
//! endpoint sets each kind of traffic may use.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use roadkeeper_cluster::NamespacedName;
use roadkeeper_cluster::k8s_openapi::api::core::v1::{Service, ServicePort as K8sServicePort};
use roadkeeper_cluster::k8s_openapi::api::discovery::v1::EndpointSlice;
use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::{NodePortAddresses, ProxyConfig, ProxyMode};

/// Label that hands a Service to another proxy implementation.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label of headless Services' EndpointSlices; kube-proxy ignores every Service and slice that
/// carries it (as one of [`SERVICE_PROXY_NAME_LABEL`]), whatever its ClusterIP.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

/// IPv4 or IPv6: one proxier (one nftables table) per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() { IpFamily::V4 } else { IpFamily::V6 }
    }

    /// The family's unspecified address (`0.0.0.0`, `::`).
    pub fn unspecified(self) -> IpAddr {
        match self {
            IpFamily::V4 => IpAddr::from([0u8; 4]),
            IpFamily::V6 => IpAddr::from([0u8; 16]),
        }
    }

    /// Parses Kubernetes' `IPv4` / `IPv6` spelling.
    fn from_k8s(s: &str) -> Option<IpFamily> {
        match s {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }
}

/// Transport protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Parses the Kubernetes spelling; absent means TCP.
    pub fn from_k8s(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower-case name, as nft and upstream chain names spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// `namespace/name:port` of one service port, plus its protocol.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// The port's name (empty for a single unnamed port).
    pub port: String,
    /// The port's protocol.
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    /// Upstream's `ServicePortName.String()`: `ns/name` or `ns/name:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.service)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// What this node knows about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    /// The node name, compared with endpoints' `nodeName`.
    pub name: String,
    /// Primary node IPs (one per family at most): the default NodePort addresses.
    pub primary_ips: Vec<IpAddr>,
    /// Every address configured on the host: NodePort candidates under `--nodeport-addresses`.
    pub local_addresses: Vec<IpAddr>,
    /// The node's `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
}

impl NodeInfo {
    /// The addresses that accept NodePort traffic for one family.
    pub fn nodeport_ips(&self, family: IpFamily, cfg: &ProxyConfig) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = match &cfg.nodeport_addresses {
            // iptables and IPVS modes' default: every local address.
            NodePortAddresses::Unset if matches!(cfg.mode, ProxyMode::Iptables | ProxyMode::Ipvs) => {
                self.local_addresses.clone()
            }
            NodePortAddresses::Unset | NodePortAddresses::Primary => self.primary_ips.clone(),
            NodePortAddresses::Cidrs(cidrs) => {
                self.local_addresses.iter().filter(|ip| cidrs.iter().any(|c| c.contains(*ip))).copied().collect()
            }
        };
        ips.retain(|ip| IpFamily::of(ip) == family);
        ips.sort();
        ips.dedup();
        ips
    }
}

/// One backend of a service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// Pod (or other backend) IP.
    pub ip: IpAddr,
    /// Target port.
    pub port: u16,
    /// Runs on this node.
    pub is_local: bool,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// One port of one Service in one IP family, as this node must proxy it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// `ns/name:port` and protocol.
    pub name: ServicePortName,
    /// Which table this entry belongs to.
    pub family: IpFamily,
    /// The service port number.
    pub port: u16,
    /// The ClusterIP of this family, if any.
    pub cluster_ip: Option<IpAddr>,
    /// NodePort number, if the Service has one and the node has NodePort addresses in this family.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family (empty: no firewall).
    pub source_ranges: Vec<IpNet>,
    /// `sessionAffinity: ClientIP` timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// `externalTrafficPolicy: Local` (only meaningful with external frontends).
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort` for `externalTrafficPolicy: Local` LoadBalancers.
    pub health_check_node_port: Option<u16>,
    /// Endpoints for Cluster-policy traffic (topology-filtered, terminating fallback applied).
    pub cluster_endpoints: Vec<Endpoint>,
    /// Endpoints on this node for Local-policy traffic (terminating fallback applied).
    pub local_endpoints: Vec<Endpoint>,
    /// `local_endpoints` is the terminating fallback: none of this node's endpoints is ready.
    /// Traffic still goes to them, but the health check reports no local endpoint, as
    /// kube-proxy's (a load balancer then stops sending new connections here).
    pub local_endpoints_terminating: bool,
}

impl ServicePort {
    /// True if the port has NodePort, externalIP or load-balancer frontends.
    pub fn has_external_frontends(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Endpoints that ClusterIP traffic goes to.
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        if self.internal_policy_local { &self.local_endpoints } else { &self.cluster_endpoints }
    }

    /// Endpoints that external (NodePort / external IP / LB) traffic goes to.
    pub fn external_endpoints(&self) -> &[Endpoint] {
        if self.external_policy_local { &self.local_endpoints } else { &self.cluster_endpoints }
    }

    /// Whether (internal, external) traffic is dropped because its policy is Local and this node
    /// has none of the port's endpoints (kube-proxy's `no_local_endpoints_total` cases).
    pub fn lacks_local_endpoints(&self) -> (bool, bool) {
        let lacking = self.local_endpoints.is_empty() && !self.cluster_endpoints.is_empty();
        let external = self.external_policy_local && self.has_external_frontends();
        (lacking && self.internal_policy_local, lacking && external)
    }
}

#[cfg(any(test, feature = "test-fixtures"))]
impl ServicePort {
    /// A test fixture: the unnamed `protocol` port `port` of `service` on `cluster_ip` (whose
    /// family it takes), sending to `endpoints`, with no other frontends, Cluster traffic
    /// policies and no affinity. Tests change the fields they need.
    pub fn for_test(
        service: NamespacedName,
        protocol: Protocol,
        cluster_ip: IpAddr,
        port: u16,
        endpoints: Vec<Endpoint>,
    ) -> ServicePort {
        ServicePort {
            name: ServicePortName { service, port: String::new(), protocol },
            family: IpFamily::of(&cluster_ip),
            port,
            cluster_ip: Some(cluster_ip),
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            affinity_timeout: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            cluster_endpoints: endpoints,
            local_endpoints: Vec::new(),
            local_endpoints_terminating: false,
        }
    }
}

/// Why a Service produced no service ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// `clusterIP: None`.
    Headless,
    /// `type: ExternalName`.
    ExternalName,
    /// Labelled for another proxy, or `service.kubernetes.io/headless`.
    OtherProxy,
}

/// True for an object kube-proxy's informers never see: labelled [`SERVICE_PROXY_NAME_LABEL`] or
/// [`HEADLESS_LABEL`] (their selector is `!service-proxy-name,!headless`, for Services,
/// EndpointSlices and ServiceCIDRs alike).
pub fn ignored_by_kube_proxy(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL) || l.contains_key(HEADLESS_LABEL))
}

/// Computes the service ports of one Service for this node, for both IP families.
pub fn service_ports(
    key: &NamespacedName,
    svc: &Service,
    slices: &[std::sync::Arc<EndpointSlice>],
    node: &NodeInfo,
    cfg: &ProxyConfig,
) -> Result<Vec<ServicePort>, Skip> {
    let Some(spec) = svc.spec.as_ref() else { return Ok(Vec::new()) };
    if ignored_by_kube_proxy(&svc.metadata) {
        return Err(Skip::OtherProxy);
    }
    if spec.type_.as_deref() == Some("ExternalName") {
        return Err(Skip::ExternalName);
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        return Err(Skip::Headless);
    }
    let cluster_ips: Vec<IpAddr> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().filter_map(|s| s.parse().ok()).collect(),
        _ => spec.cluster_ip.iter().filter_map(|s| s.parse().ok()).collect(),
    };
    let mut families: Vec<IpFamily> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| IpFamily::from_k8s(f))
        .chain(cluster_ips.iter().map(IpFamily::of))
        .collect();
    if families.is_empty() {
        families.push(IpFamily::V4);
    }
    families.sort();
    families.dedup();

    let parse_ips = |list: Option<&Vec<String>>| -> Vec<IpAddr> {
        list.into_iter().flatten().filter_map(|s| s.parse().ok()).collect()
    };
    let external_ips = parse_ips(spec.external_ips.as_ref());
    let lb_ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    let source_ranges: Vec<IpNet> =
        spec.load_balancer_source_ranges.iter().flatten().filter_map(|s| s.trim().parse().ok()).collect();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let has_node_ports = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let external_policy_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");

    let mut out = Vec::new();
    for family in families {
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            let mut v: Vec<IpAddr> = ips.iter().filter(|ip| IpFamily::of(ip) == family).copied().collect();
            v.sort();
            v.dedup();
            v
        };
        let has_nodeport_ips = !node.nodeport_ips(family, cfg).is_empty();
        for port in spec.ports.iter().flatten() {
            let Some(protocol) = Protocol::from_k8s(port.protocol.as_deref()) else { continue };
            let Ok(port_number) = u16::try_from(port.port) else { continue };
            let name = ServicePortName { service: key.clone(), port: port.name.clone().unwrap_or_default(), protocol };
            let endpoints = collect_endpoints(port, protocol, family, slices, node);
            let mut sp = ServicePort {
                name,
                family,
                port: port_number,
                cluster_ip: cluster_ips.iter().find(|ip| IpFamily::of(ip) == family).copied(),
                node_port: port
                    .node_port
                    .filter(|_| has_node_ports && has_nodeport_ips)
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p != 0),
                external_ips: of_family(&external_ips),
                load_balancer_ips: of_family(&lb_ips),
                source_ranges: source_ranges.iter().filter(|r| IpFamily::of(&r.addr()) == family).copied().collect(),
                affinity_timeout,
                external_policy_local: false,
                internal_policy_local,
                health_check_node_port: None,
                cluster_endpoints: Vec::new(),
                local_endpoints: Vec::new(),
                local_endpoints_terminating: false,
            };
            sp.external_policy_local = external_policy_local && sp.has_external_frontends();
            sp.health_check_node_port =
                spec.health_check_node_port.filter(|_| sp.external_policy_local).and_then(|p| u16::try_from(p).ok());
            (sp.cluster_endpoints, sp.local_endpoints, sp.local_endpoints_terminating) = categorize(&endpoints, node);
            out.push(sp);
        }
    }
    Ok(out)
}

/// An endpoint as read from a slice, before categorization.
#[derive(Debug, Clone)]
struct RawEndpoint {
    endpoint: Endpoint,
    ready: bool,
    serving: bool,
    terminating: bool,
    for_nodes: Option<BTreeSet<String>>,
    for_zones: Option<BTreeSet<String>>,
}

/// Reads the endpoints of one service port (matched by port name and protocol) of one family
/// from the Service's slices, de-duplicated by `ip:port`.
fn collect_endpoints(
    port: &K8sServicePort,
    protocol: Protocol,
    family: IpFamily,
    slices: &[std::sync::Arc<EndpointSlice>],
    node: &NodeInfo,
) -> Vec<RawEndpoint> {
    let want_type = match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    };
    let port_name = port.name.as_deref().unwrap_or("");
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for slice in slices {
        if slice.address_type != want_type || ignored_by_kube_proxy(&slice.metadata) {
            continue;
        }
        let Some(target_port) = slice.ports.iter().flatten().find_map(|p| {
            let same_name = p.name.as_deref().unwrap_or("") == port_name;
            let same_proto = Protocol::from_k8s(p.protocol.as_deref()) == Some(protocol);
            (same_name && same_proto).then_some(p.port).flatten()
        }) else {
            continue;
        };
        let Ok(target_port) = u16::try_from(target_port) else { continue };
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else { continue };
            if IpFamily::of(&ip) != family || !seen.insert((ip, target_port)) {
                continue;
            }
            let cond = ep.conditions.clone().unwrap_or_default();
            let ready = cond.ready.unwrap_or(true);
            let hints = ep.hints.as_ref();
            out.push(RawEndpoint {
                endpoint: Endpoint {
                    ip,
                    port: target_port,
                    is_local: ep.node_name.as_deref() == Some(node.name.as_str()) && !node.name.is_empty(),
                },
                ready,
                serving: cond.serving.unwrap_or(ready),
                terminating: cond.terminating.unwrap_or(false),
                for_nodes: hints.and_then(|h| h.for_nodes.as_ref()).map(|v| v.iter().map(|n| n.name.clone()).collect()),
                for_zones: hints.and_then(|h| h.for_zones.as_ref()).map(|v| v.iter().map(|z| z.name.clone()).collect()),
            });
        }
    }
    out.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    out
}

/// Splits endpoints into the Cluster set (topology hints applied) and the Local set, each with
/// the terminating fallback of KEP-1669 applied independently; and whether the Local set is that
/// fallback.
fn categorize(endpoints: &[RawEndpoint], node: &NodeInfo) -> (Vec<Endpoint>, Vec<Endpoint>, bool) {
    let ready: Vec<&RawEndpoint> = endpoints.iter().filter(|e| e.ready).collect();
    let cluster = if ready.is_empty() {
        serving_terminating(endpoints.iter())
    } else {
        topology_filter(&ready, node).into_iter().map(|e| e.endpoint.clone()).collect()
    };
    let local_ready: Vec<Endpoint> = ready.iter().filter(|e| e.endpoint.is_local).map(|e| e.endpoint.clone()).collect();
    if local_ready.is_empty() {
        let local = serving_terminating(endpoints.iter().filter(|e| e.endpoint.is_local));
        let fallback = !local.is_empty();
        (cluster, local, fallback)
    } else {
        (cluster, local_ready, false)
    }
}

/// The serving-and-terminating endpoints (the fallback when none is ready).
fn serving_terminating<'a>(endpoints: impl Iterator<Item = &'a RawEndpoint>) -> Vec<Endpoint> {
    endpoints.filter(|e| e.serving && e.terminating).map(|e| e.endpoint.clone()).collect()
}

/// Topology-aware routing from EndpointSlice hints: PreferSameNode, then PreferSameZone, else all.
fn topology_filter<'a>(ready: &[&'a RawEndpoint], node: &NodeInfo) -> Vec<&'a RawEndpoint> {
    let all_have = |f: fn(&RawEndpoint) -> bool| ready.iter().all(|e| f(e));
    if all_have(|e| e.for_nodes.is_some()) {
        let mine: Vec<_> =
            ready.iter().filter(|e| e.for_nodes.as_ref().is_some_and(|n| n.contains(&node.name))).copied().collect();
        if !mine.is_empty() {
            return mine;
        }
    }
    if let Some(zone) = &node.zone
        && all_have(|e| e.for_zones.is_some())
    {
        let mine: Vec<_> =
            ready.iter().filter(|e| e.for_zones.as_ref().is_some_and(|z| z.contains(zone))).copied().collect();
        if !mine.is_empty() {
            return mine;
        }
    }
    ready.to_vec()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn svc(yaml: &str) -> Service {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn slice(yaml: &str) -> Arc<EndpointSlice> {
        Arc::new(serde_saphyr::from_str(yaml).unwrap())
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            primary_ips: vec!["192.168.77.2".parse().unwrap(), "fd00:77::2".parse().unwrap()],
            local_addresses: vec!["192.168.77.2".parse().unwrap(), "127.0.0.1".parse().unwrap()],
            zone: Some("zone-a".into()),
        }
    }

    fn key() -> NamespacedName {
        NamespacedName::new("default", "hello")
    }

    const HELLO: &str = "metadata: {name: hello, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80, targetPort: 8080}]\n";

    fn endpoints_slice(eps: &str) -> Arc<EndpointSlice> {
        slice(&format!(
            "metadata: {{name: hello-1, namespace: default, labels: {{kubernetes.io/service-name: hello}}}}\n\
             addressType: IPv4\nports: [{{port: 8080, protocol: TCP}}]\nendpoints:\n{eps}"
        ))
    }

    fn ips(eps: &[Endpoint]) -> Vec<String> {
        eps.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn lacking_local_endpoints_per_policy() {
        let endpoint = Endpoint { ip: "10.244.1.5".parse().unwrap(), port: 80, is_local: false };
        let service = NamespacedName::new("ns", "a");
        let mut port = ServicePort::for_test(service, Protocol::Tcp, "10.96.0.1".parse().unwrap(), 80, vec![endpoint]);
        assert_eq!(port.lacks_local_endpoints(), (false, false));
        port.internal_policy_local = true;
        port.external_policy_local = true;
        assert_eq!(port.lacks_local_endpoints(), (true, false), "no external frontend");
        port.node_port = Some(30080);
        assert_eq!(port.lacks_local_endpoints(), (true, true));
        port.local_endpoints = port.cluster_endpoints.clone();
        assert_eq!(port.lacks_local_endpoints(), (false, false));
        port.cluster_endpoints.clear();
        port.local_endpoints.clear();
        assert_eq!(port.lacks_local_endpoints(), (false, false), "no endpoints at all is another case");
    }

    #[test]
    fn cluster_ip_service_with_ready_endpoints() {
        let s = endpoints_slice(
            "- {addresses: [10.244.0.11], nodeName: node-a}\n- {addresses: [10.244.0.12], nodeName: node-b, conditions: {ready: false}}\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[s], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ports.len(), 1);
        let p = &ports[0];
        assert_eq!(p.name.to_string(), "default/hello");
        assert_eq!(p.cluster_ip, Some("10.96.0.10".parse().unwrap()));
        assert_eq!(ips(&p.cluster_endpoints), ["10.244.0.11:8080"]);
        assert_eq!(ips(&p.local_endpoints), ["10.244.0.11:8080"]);
        assert!(p.node_port.is_none());
    }

    #[test]
    fn terminating_fallback_applies_per_set() {
        let s = endpoints_slice(
            "- {addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}\n\
             - {addresses: [10.244.0.12], nodeName: node-b, conditions: {ready: false, serving: false, terminating: true}}\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[s], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ips(&ports[0].cluster_endpoints), ["10.244.0.11:8080"]);
        assert_eq!(ips(&ports[0].local_endpoints), ["10.244.0.11:8080"]);
        assert!(ports[0].local_endpoints_terminating, "the local set is the fallback");
    }

    #[test]
    fn local_set_falls_back_independently() {
        let s = endpoints_slice(
            "- {addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}\n\
             - {addresses: [10.244.0.12], nodeName: node-b}\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[s], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ips(&ports[0].cluster_endpoints), ["10.244.0.12:8080"]);
        assert_eq!(ips(&ports[0].local_endpoints), ["10.244.0.11:8080"]);
        assert!(ports[0].local_endpoints_terminating);
        let ready = endpoints_slice("- {addresses: [10.244.0.11], nodeName: node-a}\n");
        let ports = service_ports(&key(), &svc(HELLO), &[ready], &node(), &ProxyConfig::default()).unwrap();
        assert!(!ports[0].local_endpoints_terminating, "a ready local endpoint");
    }

    #[test]
    fn topology_hints_prefer_node_then_zone() {
        let s = endpoints_slice(
            "- {addresses: [10.244.0.11], nodeName: node-b, hints: {forZones: [{name: zone-a}], forNodes: [{name: node-a}]}}\n\
             - {addresses: [10.244.0.12], nodeName: node-c, hints: {forZones: [{name: zone-b}], forNodes: [{name: node-c}]}}\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[s], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ips(&ports[0].cluster_endpoints), ["10.244.0.11:8080"]);
        let zone_only = endpoints_slice(
            "- {addresses: [10.244.0.11], hints: {forZones: [{name: zone-b}]}}\n\
             - {addresses: [10.244.0.12], hints: {forZones: [{name: zone-a}]}}\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[zone_only], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ips(&ports[0].cluster_endpoints), ["10.244.0.12:8080"]);
        let partial = endpoints_slice(
            "- {addresses: [10.244.0.11], hints: {forZones: [{name: zone-b}]}}\n- {addresses: [10.244.0.12]}\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[partial], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ports[0].cluster_endpoints.len(), 2, "hints ignored unless every endpoint has them");
    }

    #[test]
    fn skipped_services() {
        let cfg = ProxyConfig::default();
        let headless = svc("metadata: {name: h}\nspec: {clusterIP: None, ports: [{port: 80}]}\n");
        assert_eq!(service_ports(&key(), &headless, &[], &node(), &cfg), Err(Skip::Headless));
        let ext = svc("metadata: {name: e}\nspec: {type: ExternalName, externalName: example.com}\n");
        assert_eq!(service_ports(&key(), &ext, &[], &node(), &cfg), Err(Skip::ExternalName));
        let other = svc(
            "metadata: {name: o, labels: {service.kubernetes.io/service-proxy-name: foo}}\nspec: {clusterIP: 10.96.0.1}\n",
        );
        assert_eq!(service_ports(&key(), &other, &[], &node(), &cfg), Err(Skip::OtherProxy));
        // kube-proxy's informers select `!service.kubernetes.io/headless` too: a Service carrying
        // the label is left alone, ClusterIP or not.
        let labelled = svc(
            "metadata: {name: l, labels: {service.kubernetes.io/headless: \"\"}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
        );
        assert_eq!(service_ports(&key(), &labelled, &[], &node(), &cfg), Err(Skip::OtherProxy));
    }

    #[test]
    fn slices_labelled_for_no_proxy_are_ignored() {
        let ready = "- {addresses: [10.244.0.11]}\n";
        for label in [HEADLESS_LABEL, SERVICE_PROXY_NAME_LABEL] {
            let labelled = slice(&format!(
                "metadata: {{name: hello-2, namespace: default, labels: {{kubernetes.io/service-name: hello, {label}: x}}}}\n\
                 addressType: IPv4\nports: [{{port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: [10.244.0.12]}}]\n"
            ));
            let ports = service_ports(
                &key(),
                &svc(HELLO),
                &[endpoints_slice(ready), labelled],
                &node(),
                &ProxyConfig::default(),
            )
            .unwrap();
            assert_eq!(ips(&ports[0].cluster_endpoints), ["10.244.0.11:8080"], "{label}");
        }
    }

    #[test]
    fn dual_stack_load_balancer_with_everything() {
        let s = svc("metadata: {name: hello, namespace: default}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.0.10, fd00:96::10]
  ipFamilies: [IPv4, IPv6]
  externalIPs: [203.0.113.7, 2001:db8::7]
  externalTrafficPolicy: Local
  healthCheckNodePort: 30999
  loadBalancerSourceRanges: [198.51.100.0/24, 2001:db8:1::/64]
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, nodePort: 30080, protocol: UDP}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.9}]}}
");
        let ports = service_ports(&key(), &s, &[], &node(), &ProxyConfig::default()).unwrap();
        assert_eq!(ports.len(), 2);
        let (v4, v6) = (&ports[0], &ports[1]);
        assert_eq!((v4.family, v6.family), (IpFamily::V4, IpFamily::V6));
        assert_eq!(v4.name.to_string(), "default/hello:http");
        assert_eq!(v4.name.protocol, Protocol::Udp);
        assert_eq!(v4.node_port, Some(30080));
        assert_eq!(v4.external_ips, ["203.0.113.7".parse::<IpAddr>().unwrap()]);
        assert_eq!(v4.load_balancer_ips.len(), 1);
        assert!(v6.load_balancer_ips.is_empty());
        assert_eq!(v6.source_ranges, ["2001:db8:1::/64".parse::<IpNet>().unwrap()]);
        assert_eq!(v4.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert!(v4.external_policy_local);
        assert_eq!(v4.health_check_node_port, Some(30999));
    }

    #[test]
    fn nodeport_addresses_restrict_the_node_ips() {
        let mut cfg = ProxyConfig::default();
        assert_eq!(node().nodeport_ips(IpFamily::V4, &cfg), ["192.168.77.2".parse::<IpAddr>().unwrap()]);
        cfg.nodeport_addresses = NodePortAddresses::Cidrs(vec!["127.0.0.0/8".parse().unwrap()]);
        assert_eq!(node().nodeport_ips(IpFamily::V4, &cfg), ["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert!(node().nodeport_ips(IpFamily::V6, &cfg).is_empty());
    }

    #[test]
    fn slices_of_other_ports_or_families_are_ignored() {
        let other_port = slice(
            "metadata: {name: x, labels: {kubernetes.io/service-name: hello}}\naddressType: IPv4\n\
             ports: [{name: metrics, port: 9090}]\nendpoints: [{addresses: [10.244.0.11]}]\n",
        );
        let v6 = slice(
            "metadata: {name: y, labels: {kubernetes.io/service-name: hello}}\naddressType: IPv6\n\
             ports: [{port: 8080}]\nendpoints: [{addresses: [\"fd00:244::11\"]}]\n",
        );
        let ports = service_ports(&key(), &svc(HELLO), &[other_port, v6], &node(), &ProxyConfig::default()).unwrap();
        assert!(ports[0].cluster_endpoints.is_empty());
    }
}
