//! Per-object validation of the fields the proxy, DNS and ingress rely on, as the API server
//! validates them: names, namespaces and labels, port names, addresses, Ingress hosts and paths;
//! the Gateway API kinds as their CRDs do ([`gateway`]).

mod gateway;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, PodSpec, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, ServiceCIDR};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::formats::{self, Check};
use crate::{NodePortRange, Object};

/// Label naming the Service an EndpointSlice belongs to.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A problem with one field of an object (`field` is `None` when no path is known).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldError {
    pub field: Option<String>,
    pub message: String,
}

/// Returns every field error of `object`; empty when it is valid. `node_ports` is the range a
/// Service's NodePorts must be in: a manifest folder's; `None` for objects an API server has
/// already checked against its own range.
pub(crate) fn validate(object: &Object, node_ports: Option<NodePortRange>) -> Vec<FieldError> {
    let mut v = Errors::default();
    match object {
        Object::Service(s) => {
            metadata(&mut v, &s.metadata, formats::dns1035_label, true);
            service(&mut v, s, node_ports);
        }
        Object::EndpointSlice(s) => {
            metadata(&mut v, &s.metadata, formats::dns1123_subdomain, true);
            endpoint_slice(&mut v, s);
        }
        Object::Pod(p) => {
            metadata(&mut v, &p.metadata, formats::dns1123_subdomain, true);
            pod(&mut v, p);
        }
        Object::Node(n) => {
            metadata(&mut v, &n.metadata, formats::dns1123_subdomain, false);
            node(&mut v, n);
        }
        Object::ServiceCidr(c) => {
            metadata(&mut v, &c.metadata, formats::dns1123_subdomain, false);
            service_cidr(&mut v, c);
        }
        Object::Namespace(n) => metadata(&mut v, &n.metadata, formats::dns1123_label, false),
        Object::Ingress(i) => {
            metadata(&mut v, &i.metadata, formats::dns1123_subdomain, true);
            ingress(&mut v, i);
        }
        Object::IngressClass(c) => {
            metadata(&mut v, &c.metadata, formats::dns1123_subdomain, false);
            ingress_class(&mut v, c);
        }
        Object::Secret(s) => metadata(&mut v, &s.metadata, formats::dns1123_subdomain, true),
        Object::Deployment(d) => {
            metadata(&mut v, &d.metadata, formats::dns1123_subdomain, true);
            deployment(&mut v, d);
        }
        Object::ConfigMap(c) => {
            metadata(&mut v, &c.metadata, formats::dns1123_subdomain, true);
            config_map(&mut v, c);
        }
        Object::GatewayClass(c) => {
            metadata(&mut v, &c.metadata, formats::dns1123_subdomain, false);
            gateway::gateway_class(&mut v, c);
        }
        Object::Gateway(g) => {
            metadata(&mut v, &g.metadata, formats::dns1123_subdomain, true);
            gateway::gateway(&mut v, g);
        }
        Object::HttpRoute(r) => {
            metadata(&mut v, &r.metadata, formats::dns1123_subdomain, true);
            gateway::http_route(&mut v, r);
        }
        Object::ReferenceGrant(g) => {
            metadata(&mut v, &g.metadata, formats::dns1123_subdomain, true);
            gateway::reference_grant(&mut v, g);
        }
        Object::GrpcRoute(r) => {
            metadata(&mut v, &r.metadata, formats::dns1123_subdomain, true);
            gateway::grpc_route(&mut v, r);
        }
    }
    v.0
}

/// The object's name (in its kind's format), its namespace (if `namespaced`) and labels.
fn metadata(v: &mut Errors, meta: &ObjectMeta, name_format: fn(&str) -> Check, namespaced: bool) {
    if let Some(name) = &meta.name {
        v.format("metadata.name", name, name_format);
    }
    if namespaced && let Some(namespace) = &meta.namespace {
        v.format("metadata.namespace", namespace, formats::dns1123_label);
    }
    v.labels("metadata.labels", meta.labels.iter().flatten());
}

const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];
const IP_FAMILY_POLICIES: &[&str] = &["SingleStack", "PreferDualStack", "RequireDualStack"];

/// A Service as the API server validates it on creation, before its defaults are filled in
/// (a missing `type` is ClusterIP, `protocol` TCP, `sessionAffinity` None); with `node_ports`,
/// its NodePorts are checked against that range as the API server's allocator does.
fn service(v: &mut Errors, svc: &Service, node_ports: Option<NodePortRange>) {
    let Some(spec) = &svc.spec else { return };
    if let Some(t) = &spec.type_ {
        v.one_of("spec.type", t, &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]);
    }
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    service_type_fields(v, spec, type_);
    if let Some(ip) = &spec.cluster_ip {
        v.cluster_ip("spec.clusterIP", ip);
    }
    for (i, ip) in spec.cluster_ips.iter().flatten().enumerate() {
        v.cluster_ip(&format!("spec.clusterIPs[{i}]"), ip);
    }
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        v.endpoint_ip(&format!("spec.externalIPs[{i}]"), ip);
    }
    if type_ == "ExternalName" {
        match spec.external_name.as_deref().unwrap_or_default() {
            "" => v.push("spec.externalName", "is required".into()),
            name => v.format("spec.externalName", name.strip_suffix('.').unwrap_or(name), formats::dns1123_subdomain),
        }
    }
    v.labels("spec.selector", spec.selector.iter().flatten());
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty()) {
        v.ip("spec.loadBalancerIP", ip);
    }
    let ranges = spec.load_balancer_source_ranges.as_deref().unwrap_or_default();
    v.load_balancer_only("spec.loadBalancerSourceRanges", type_, !ranges.is_empty());
    for (i, range) in ranges.iter().enumerate() {
        v.cidr(&format!("spec.loadBalancerSourceRanges[{i}]"), range);
    }
    let mut families = BTreeSet::new();
    for (i, family) in spec.ip_families.iter().flatten().enumerate() {
        v.one_of(&format!("spec.ipFamilies[{i}]"), family, &["IPv4", "IPv6"]);
        if !families.insert(family) {
            v.push(&format!("spec.ipFamilies[{i}]"), format!("duplicate {family:?}"));
        }
    }
    if type_ != "ExternalName" {
        cluster_ip_families(v, spec);
    }
    v.load_balancer_only("spec.allocateLoadBalancerNodePorts", type_, spec.allocate_load_balancer_node_ports.is_some());
    service_ports(v, spec, type_, node_ports);
    let affinity = spec.session_affinity.as_deref().unwrap_or("None");
    if let Some(a) = &spec.session_affinity {
        v.one_of("spec.sessionAffinity", a, &["None", "ClientIP"]);
    }
    if affinity == "None" && spec.session_affinity_config.is_some() {
        v.push("spec.sessionAffinityConfig", "must not be set when session affinity is None".into());
    }
    let timeout = spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref()?.timeout_seconds);
    if let Some(t) = timeout.filter(|t| !(1..=86400).contains(t)) {
        v.push("spec.sessionAffinityConfig.clientIP.timeoutSeconds", format!("{t} is out of range 1-86400"));
    }
    traffic_policies(v, spec, type_, node_ports);
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()?.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        if let Some(ip) = &ing.ip {
            v.ip(&format!("status.loadBalancer.ingress[{i}].ip"), ip);
        }
    }
}

/// What a Service's type forbids: addresses for ExternalName, headless NodePorts and
/// LoadBalancers.
fn service_type_fields(v: &mut Errors, spec: &ServiceSpec, type_: &str) {
    let cluster_ips = spec.cluster_ips.as_deref().unwrap_or_default();
    match type_ {
        "ExternalName" => {
            let forbidden = "may not be set for ExternalName services";
            if spec.cluster_ip.as_deref().is_some_and(|ip| !ip.is_empty()) {
                v.push("spec.clusterIP", forbidden.into());
            }
            for (field, set) in [
                ("spec.clusterIPs", !cluster_ips.is_empty()),
                ("spec.ipFamilies", spec.ip_families.as_ref().is_some_and(|f| !f.is_empty())),
                ("spec.ipFamilyPolicy", spec.ip_family_policy.is_some()),
            ] {
                if set {
                    v.push(field, forbidden.into());
                }
            }
        }
        "NodePort" | "LoadBalancer" => {
            let headless = match spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty()) {
                Some(ip) => (ip == "None").then_some("spec.clusterIP"),
                None => (cluster_ips.first().map(String::as_str) == Some("None")).then_some("spec.clusterIPs[0]"),
            };
            if let Some(field) = headless {
                v.push(field, format!("may not be 'None' for {type_} services"));
            }
        }
        _ => {}
    }
}

/// `clusterIP`, `clusterIPs`, `ipFamilies` and `ipFamilyPolicy` agree: at most one address per
/// family, in the order of the families, `None` alone.
fn cluster_ip_families(v: &mut Errors, spec: &ServiceSpec) {
    let ips = spec.cluster_ips.as_deref().unwrap_or_default();
    let families = spec.ip_families.as_deref().unwrap_or_default();
    if let Some(policy) = &spec.ip_family_policy {
        v.one_of("spec.ipFamilyPolicy", policy, IP_FAMILY_POLICIES);
    }
    if ips.len() > 2 {
        v.push("spec.clusterIPs", "may only hold up to 2 values".into());
    }
    if ips.len() > 1 && ips.iter().any(|ip| ip == "None") {
        return v.push("spec.clusterIPs", "'None' must be the first and only value".into());
    }
    let valid = |ip: &str| matches!(ip, "None" | "") || ip.parse::<IpAddr>().is_ok();
    if !ips.iter().all(|ip| valid(ip)) || !spec.cluster_ip.as_deref().is_none_or(valid) {
        return; // invalid addresses are reported already
    }
    let parsed: Vec<IpAddr> = ips.iter().filter_map(|ip| ip.parse().ok()).collect();
    if let (Some(ip), Some(first)) = (spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty()), ips.first())
        && ip != first
    {
        v.push("spec.clusterIPs", "first value must match `clusterIP`".into());
    }
    if parsed.len() > 1 && parsed.iter().filter(|ip| ip.is_ipv4()).count() != 1 {
        v.push("spec.clusterIPs", "may specify no more than one IP for each IP family".into());
    }
    for (i, (ip, family)) in parsed.iter().zip(families).enumerate() {
        let expected = match family.as_str() {
            "IPv4" if ip.is_ipv6() => "IPv4",
            "IPv6" if ip.is_ipv4() => "IPv6",
            _ => continue,
        };
        let message = format!("expected an {expected} value as indicated by `ipFamilies[{i}]`");
        v.push(&format!("spec.clusterIPs[{i}]"), message);
    }
    if spec.ip_family_policy.as_deref() == Some("SingleStack") && parsed.len().max(families.len()) > 1 {
        v.push("spec.ipFamilyPolicy", "SingleStack may not have more than one IP family".into());
    }
}

/// Each port (number, NodePort, target, protocol, appProtocol, name), and no two ports alike.
fn service_ports(v: &mut Errors, spec: &ServiceSpec, type_: &str, node_ports: Option<NodePortRange>) {
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    let mut node_port_numbers = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        v.port(&format!("{at}.port"), port.port);
        if let Some(n) = port.node_port.filter(|&n| n != 0) {
            let field = format!("{at}.nodePort");
            v.node_port(&field, n, node_ports.filter(|_| type_ != "ClusterIP"));
            if type_ == "ClusterIP" {
                v.push(&field, "may not be used when `type` is 'ClusterIP'".into());
            }
            if !node_port_numbers.insert((n, protocol)) {
                v.push(&field, format!("duplicate nodePort {n}/{protocol}"));
            }
        }
        match &port.target_port {
            Some(IntOrString::Int(n)) => v.port(&format!("{at}.targetPort"), *n),
            Some(IntOrString::String(s)) if s.is_empty() => {
                v.push(&format!("{at}.targetPort"), "must be a port number or a non-empty name".into())
            }
            Some(IntOrString::String(s)) => v.format(&format!("{at}.targetPort"), s, formats::port_name),
            None => {}
        }
        if let Some(p) = &port.protocol {
            v.one_of(&format!("{at}.protocol"), p, PROTOCOLS);
        }
        if let Some(app) = &port.app_protocol {
            v.format(&format!("{at}.appProtocol"), app, formats::qualified_name);
        }
        match port.name.as_deref().unwrap_or_default() {
            "" if ports.len() > 1 => {
                v.push(&format!("{at}.name"), "is required when a Service has more than one port".into())
            }
            "" => {}
            name => {
                v.format(&format!("{at}.name"), name, formats::dns1123_label);
                if !names.insert(name) {
                    v.push(&format!("{at}.name"), format!("duplicate port name {name:?}"));
                }
            }
        }
        if !numbers.insert((port.port, protocol)) {
            v.push(&at, format!("duplicate port {}/{protocol}", port.port));
        }
    }
}

/// `externalTrafficPolicy` (only for Services reachable from outside), `healthCheckNodePort`
/// (only for `Local` LoadBalancers, in the NodePort range) and `internalTrafficPolicy`.
fn traffic_policies(v: &mut Errors, spec: &ServiceSpec, type_: &str, node_ports: Option<NodePortRange>) {
    let external = matches!(type_, "NodePort" | "LoadBalancer")
        || (type_ == "ClusterIP" && spec.external_ips.as_ref().is_some_and(|ips| !ips.is_empty()));
    if let Some(p) = &spec.external_traffic_policy {
        if !TRAFFIC_POLICIES.contains(&p.as_str()) {
            v.one_of("spec.externalTrafficPolicy", p, TRAFFIC_POLICIES);
        } else if !external {
            v.push("spec.externalTrafficPolicy", "may only be set for externally-accessible services".into());
        }
    }
    if let Some(n) = spec.health_check_node_port.filter(|&n| n != 0) {
        if type_ == "LoadBalancer" && spec.external_traffic_policy.as_deref() == Some("Local") {
            v.node_port("spec.healthCheckNodePort", n, node_ports);
        } else {
            let message = "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'";
            v.push("spec.healthCheckNodePort", message.into());
        }
    }
    if let Some(p) = &spec.internal_traffic_policy {
        v.one_of("spec.internalTrafficPolicy", p, TRAFFIC_POLICIES);
    }
}

fn endpoint_slice(v: &mut Errors, slice: &EndpointSlice) {
    if !slice.metadata.labels.as_ref().is_some_and(|l| l.contains_key(SERVICE_NAME_LABEL)) {
        v.push("metadata.labels", format!("missing label {SERVICE_NAME_LABEL}"));
    }
    let family = slice.address_type.as_str();
    v.one_of("addressType", family, &["IPv4", "IPv6", "FQDN"]);
    for (i, ep) in slice.endpoints.iter().enumerate() {
        for (j, addr) in ep.addresses.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            let parsed: Option<IpAddr> = match family {
                "IPv4" => addr.parse::<Ipv4Addr>().ok().map(IpAddr::from),
                "IPv6" => addr.parse::<Ipv6Addr>().ok().map(IpAddr::from),
                _ => {
                    v.format(&field, addr, formats::dns1123_subdomain);
                    continue;
                }
            };
            match parsed {
                Some(ip) => v.check(&field, addr, formats::endpoint_ip(&ip)),
                None => v.push(&field, format!("{addr:?} is not a valid {family} address")),
            }
        }
        if let Some(hostname) = &ep.hostname {
            v.format(&format!("endpoints[{i}].hostname"), hostname, formats::dns1123_label);
        }
        if let Some(node) = &ep.node_name {
            v.format(&format!("endpoints[{i}].nodeName"), node, formats::dns1123_subdomain);
        }
    }
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            v.format(&format!("ports[{i}].name"), name, formats::dns1123_label);
        }
        if let Some(n) = port.port {
            v.port(&format!("ports[{i}].port"), n);
        }
        if let Some(p) = &port.protocol {
            v.one_of(&format!("ports[{i}].protocol"), p, PROTOCOLS);
        }
    }
}

fn pod(v: &mut Errors, pod: &Pod) {
    if let Some(spec) = &pod.spec {
        pod_spec(v, "spec", spec);
    }
    let Some(status) = &pod.status else { return };
    if let Some(ip) = &status.pod_ip {
        v.ip("status.podIP", ip);
    }
    for (i, ip) in status.pod_ips.iter().flatten().enumerate() {
        v.ip(&format!("status.podIPs[{i}].ip"), &ip.ip);
    }
}

/// A Pod's spec (at `at`: `spec`, or `spec.template.spec` in a Deployment): container names and
/// ports, volumes and what mounts them, host name, subdomain and node name.
fn pod_spec(v: &mut Errors, at: &str, spec: &PodSpec) {
    let volumes: BTreeSet<&str> = spec.volumes.iter().flatten().map(|volume| volume.name.as_str()).collect();
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        v.format(&format!("{at}.volumes[{i}].name"), &volume.name, formats::dns1123_label);
    }
    let mut names = BTreeSet::new();
    for (i, container) in spec.containers.iter().enumerate() {
        let at = format!("{at}.containers[{i}]");
        v.format(&format!("{at}.name"), &container.name, formats::dns1123_label);
        if !names.insert(container.name.as_str()) {
            v.push(&format!("{at}.name"), format!("duplicate container name {:?}", container.name));
        }
        for (j, port) in container.ports.iter().flatten().enumerate() {
            let at = format!("{at}.ports[{j}]");
            if let Some(name) = &port.name {
                v.format(&format!("{at}.name"), name, formats::port_name);
            }
            v.port(&format!("{at}.containerPort"), port.container_port);
            if let Some(p) = &port.protocol {
                v.one_of(&format!("{at}.protocol"), p, PROTOCOLS);
            }
        }
        for (j, mount) in container.volume_mounts.iter().flatten().enumerate() {
            let at = format!("{at}.volumeMounts[{j}]");
            if !volumes.contains(mount.name.as_str()) {
                v.push(&format!("{at}.name"), format!("{:?} names no volume of the pod", mount.name));
            }
            if !mount.mount_path.starts_with('/') {
                v.push(&format!("{at}.mountPath"), format!("{:?} must be an absolute path", mount.mount_path));
            }
            if let Some(sub) = mount.sub_path.as_deref().filter(|sub| !sub.is_empty()) {
                if sub.starts_with('/') {
                    v.push(&format!("{at}.subPath"), format!("{sub:?} must be a relative path"));
                } else if sub.split('/').any(|part| part == "..") {
                    v.push(&format!("{at}.subPath"), format!("{sub:?} must not contain '..'"));
                }
            }
        }
    }
    if let Some(hostname) = &spec.hostname {
        v.format(&format!("{at}.hostname"), hostname, formats::dns1123_label);
    }
    if let Some(subdomain) = &spec.subdomain {
        v.format(&format!("{at}.subdomain"), subdomain, formats::dns1123_label);
    }
    if let Some(node) = &spec.node_name {
        v.format(&format!("{at}.nodeName"), node, formats::dns1123_subdomain);
    }
}

/// Replicas, the selector (not empty, matching the template's labels) and the pod template.
fn deployment(v: &mut Errors, deployment: &Deployment) {
    let Some(spec) = &deployment.spec else {
        return v.push("spec", "is required".into());
    };
    if let Some(replicas) = spec.replicas.filter(|&r| r < 0) {
        v.push("spec.replicas", format!("{replicas} must be greater than or equal to 0"));
    }
    let selector = &spec.selector;
    v.labels("spec.selector.matchLabels", selector.match_labels.iter().flatten());
    for (i, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("spec.selector.matchExpressions[{i}]");
        v.format(&format!("{at}.key"), &requirement.key, formats::qualified_name);
        v.one_of(&format!("{at}.operator"), &requirement.operator, &["In", "NotIn", "Exists", "DoesNotExist"]);
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => v.push(&format!("{at}.values"), "must be non-empty".into()),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                v.push(&format!("{at}.values"), "must be empty for Exists and DoesNotExist".into())
            }
            _ => {}
        }
    }
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    v.labels("spec.template.metadata.labels", labels.iter());
    let empty = selector.match_labels.as_ref().is_none_or(|l| l.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    if empty {
        v.push("spec.selector", "empty selector is invalid for deployment".into());
    } else if !selector_matches(selector, &labels) {
        v.push("spec.template.metadata.labels", "`selector` does not match template `labels`".into());
    }
    match &spec.template.spec {
        Some(pod) => pod_spec(v, "spec.template.spec", pod),
        None => v.push("spec.template.spec", "is required".into()),
    }
}

/// Whether a label selector (matchLabels and matchExpressions) selects `labels`.
pub fn selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(k, value)| labels.get(k) == Some(value));
    by_labels
        && selector.match_expressions.iter().flatten().all(|requirement| {
            let value = labels.get(&requirement.key);
            let values = requirement.values.as_deref().unwrap_or_default();
            match requirement.operator.as_str() {
                "In" => value.is_some_and(|value| values.contains(value)),
                "NotIn" => value.is_none_or(|value| !values.contains(value)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// Keys of `data` and `binaryData`: file names, as the API server allows them.
fn config_map(v: &mut Errors, config_map: &ConfigMap) {
    let keys = config_map.data.iter().flatten().map(|(k, _)| k);
    let binary_keys = config_map.binary_data.iter().flatten().map(|(k, _)| k);
    for key in keys.chain(binary_keys) {
        let valid = (1..=253).contains(&key.len())
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            && key != "."
            && key != "..";
        if !valid {
            v.push(&format!("data[{key:?}]"), "must be a file name of letters, digits, '-', '_' or '.'".into());
        }
    }
}

fn node(v: &mut Errors, node: &Node) {
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    for (i, addr) in addresses.into_iter().flatten().enumerate() {
        if matches!(addr.type_.as_str(), "InternalIP" | "ExternalIP") {
            v.ip(&format!("status.addresses[{i}].address"), &addr.address);
        }
    }
}

fn service_cidr(v: &mut Errors, cidr: &ServiceCIDR) {
    let cidrs = cidr.spec.as_ref().and_then(|s| s.cidrs.as_ref());
    for (i, c) in cidrs.into_iter().flatten().enumerate() {
        v.cidr(&format!("spec.cidrs[{i}]"), c);
    }
}

/// Path sequences and endings the API server refuses in Exact and Prefix Ingress paths.
const INVALID_PATH_SEQUENCES: [&str; 5] = ["//", "/./", "/../", "%2f", "%2F"];
const INVALID_PATH_SUFFIXES: [&str; 2] = ["/..", "/."];

fn ingress(v: &mut Errors, ingress: &Ingress) {
    let Some(spec) = &ingress.spec else { return };
    if let Some(class) = &spec.ingress_class_name {
        v.format("spec.ingressClassName", class, formats::dns1123_subdomain);
    }
    if let Some(backend) = &spec.default_backend {
        ingress_backend(v, "spec.defaultBackend", backend);
    }
    for (i, tls) in spec.tls.iter().flatten().enumerate() {
        for (j, host) in tls.hosts.iter().flatten().enumerate() {
            v.host(&format!("spec.tls[{i}].hosts[{j}]"), host);
        }
        if let Some(secret) = &tls.secret_name {
            v.format(&format!("spec.tls[{i}].secretName"), secret, formats::dns1123_subdomain);
        }
    }
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        if let Some(host) = rule.host.as_deref().filter(|h| !h.is_empty()) {
            v.host(&format!("spec.rules[{i}].host"), host);
        }
        for (j, path) in rule.http.iter().flat_map(|http| &http.paths).enumerate() {
            let at = format!("spec.rules[{i}].http.paths[{j}]");
            let value = path.path.as_deref().unwrap_or_default();
            let field = format!("{at}.path");
            match path.path_type.as_str() {
                "Exact" | "Prefix" => {
                    if !value.starts_with('/') {
                        v.push(&field, format!("{value:?} must be an absolute path"));
                    }
                    for sequence in INVALID_PATH_SEQUENCES.iter().filter(|s| value.contains(*s)) {
                        v.push(&field, format!("{value:?} must not contain '{sequence}'"));
                    }
                    for suffix in INVALID_PATH_SUFFIXES.iter().filter(|s| value.ends_with(*s)) {
                        v.push(&field, format!("{value:?} cannot end with '{suffix}'"));
                    }
                }
                "ImplementationSpecific" if !value.is_empty() && !value.starts_with('/') => {
                    v.push(&field, format!("{value:?} must be an absolute path"));
                }
                "ImplementationSpecific" => {}
                other => v.one_of(&format!("{at}.pathType"), other, &["Exact", "Prefix", "ImplementationSpecific"]),
            }
            ingress_backend(v, &format!("{at}.backend"), &path.backend);
        }
    }
}

fn ingress_backend(v: &mut Errors, at: &str, backend: &k8s_openapi::api::networking::v1::IngressBackend) {
    let Some(service) = &backend.service else { return };
    v.format(&format!("{at}.service.name"), &service.name, formats::dns1035_label);
    let Some(port) = &service.port else { return };
    if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
        v.format(&format!("{at}.service.port.name"), name, formats::port_name);
    }
    if let Some(n) = port.number.filter(|&n| n != 0) {
        v.port(&format!("{at}.service.port.number"), n);
    }
}

fn ingress_class(v: &mut Errors, class: &IngressClass) {
    let controller = class.spec.as_ref().and_then(|s| s.controller.as_deref());
    if let Some(controller) = controller {
        v.check("spec.controller", controller, formats::domain_prefixed_path(controller, 250));
    }
}

/// Collects field errors; one helper per kind of check.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: &str, message: String) {
        self.0.push(FieldError { field: Some(field.to_owned()), message });
    }

    fn ip(&mut self, field: &str, value: &str) {
        if value.parse::<IpAddr>().is_err() {
            self.push(field, format!("{value:?} is not a valid IP address"));
        }
    }

    /// An address that may receive Service traffic (not loopback, link-local, ...).
    fn endpoint_ip(&mut self, field: &str, value: &str) {
        match value.parse::<IpAddr>() {
            Ok(ip) => self.check(field, value, formats::endpoint_ip(&ip)),
            Err(_) => self.push(field, format!("{value:?} is not a valid IP address")),
        }
    }

    /// A cluster IP: an address that may receive Service traffic, `None` (headless) or empty
    /// (unallocated).
    fn cluster_ip(&mut self, field: &str, value: &str) {
        if !matches!(value, "None" | "") {
            self.endpoint_ip(field, value);
        }
    }

    /// `value` checked by `format`.
    fn format(&mut self, field: &str, value: &str, format: fn(&str) -> Check) {
        self.check(field, value, format(value));
    }

    /// The verdict of a check of `value`.
    fn check(&mut self, field: &str, value: &str, verdict: Check) {
        if let Err(why) = verdict {
            self.push(field, format!("{value:?} {why}"));
        }
    }

    /// Label keys (qualified names) and values.
    fn labels<'a>(&mut self, field: &str, labels: impl Iterator<Item = (&'a String, &'a String)>) {
        for (key, value) in labels {
            self.format(&format!("{field}[{key:?}]"), key, formats::qualified_name);
            self.format(&format!("{field}[{key:?}]"), value, formats::label_value);
        }
    }

    /// An Ingress host: a DNS name (a wildcard one with `*.`), not an IP address.
    fn host(&mut self, field: &str, host: &str) {
        if host.parse::<IpAddr>().is_ok() {
            self.push(field, format!("{host:?} must be a DNS name, not an IP address"));
        } else if host.contains('*') {
            self.format(field, host, formats::wildcard_subdomain);
        } else {
            self.format(field, host, formats::dns1123_subdomain);
        }
    }

    fn cidr(&mut self, field: &str, value: &str) {
        if value.trim().parse::<IpNet>().is_err() {
            self.push(field, format!("{value:?} is not a valid CIDR"));
        }
    }

    /// A NodePort: a port number, in `range` when one is given.
    fn node_port(&mut self, field: &str, port: i32, range: Option<NodePortRange>) {
        self.port(field, port);
        if let Some(range) = range.filter(|range| (1..=65535).contains(&port) && !range.contains(port)) {
            self.push(field, format!("{port} is not in the NodePort range {range} (--service-node-port-range)"));
        }
    }

    /// Refuses `field` (when `set`) on a Service whose type is not LoadBalancer.
    fn load_balancer_only(&mut self, field: &str, type_: &str, set: bool) {
        if set && type_ != "LoadBalancer" {
            self.push(field, "may only be used when `type` is 'LoadBalancer'".into());
        }
    }

    fn port(&mut self, field: &str, port: i32) {
        if !(1..=65535).contains(&port) {
            self.push(field, format!("{port} is out of range 1-65535"));
        }
    }

    fn one_of(&mut self, field: &str, value: &str, allowed: &[&str]) {
        if !allowed.contains(&value) {
            self.push(field, format!("{value:?} is not one of {}", allowed.join(", ")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn errors(object: Object) -> Vec<String> {
        validate(&object, None).into_iter().map(|e| format!("{}: {}", e.field.unwrap_or_default(), e.message)).collect()
    }

    fn service(spec: Value, status: Value) -> Object {
        let v =
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": spec, "status": status});
        Object::Service(serde_json::from_value(v).unwrap())
    }

    fn slice(address_type: &str, labels: Value, endpoints: Value, ports: Value) -> Object {
        let v = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "e", "labels": labels}, "addressType": address_type,
            "endpoints": endpoints, "ports": ports});
        Object::EndpointSlice(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn valid_service_has_no_errors() {
        let spec = json!({"type": "LoadBalancer", "clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1", "fd00::1"],
            "externalIPs": ["1.2.3.4"], "loadBalancerIP": "", "loadBalancerSourceRanges": ["10.0.0.0/8"],
            "ipFamilies": ["IPv4", "IPv6"], "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
            "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "a", "port": 80, "targetPort": "http", "nodePort": 30080},
                      {"name": "b", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 0}]});
        let status = json!({"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}, {"hostname": "lb"}]}});
        assert_eq!(errors(service(spec, status)), Vec::<String>::new());
        assert!(errors(service(json!({"clusterIP": "None"}), json!({}))).is_empty());
    }

    #[test]
    fn service_ip_fields() {
        let spec = json!({"clusterIP": "10.0.0.300", "clusterIPs": ["x"], "externalIPs": ["1.2.3"],
            "loadBalancerIP": "lb", "loadBalancerSourceRanges": ["10.0.0.0/33"], "ipFamilies": ["IPv5"]});
        let status = json!({"loadBalancer": {"ingress": [{"ip": "nope"}]}});
        assert_eq!(
            errors(service(spec, status)),
            [
                "spec.clusterIP: \"10.0.0.300\" is not a valid IP address",
                "spec.clusterIPs[0]: \"x\" is not a valid IP address",
                "spec.externalIPs[0]: \"1.2.3\" is not a valid IP address",
                "spec.loadBalancerIP: \"lb\" is not a valid IP address",
                "spec.loadBalancerSourceRanges: may only be used when `type` is 'LoadBalancer'",
                "spec.loadBalancerSourceRanges[0]: \"10.0.0.0/33\" is not a valid CIDR",
                "spec.ipFamilies[0]: \"IPv5\" is not one of IPv4, IPv6",
                "status.loadBalancer.ingress[0].ip: \"nope\" is not a valid IP address",
            ]
        );
    }

    #[test]
    fn service_ports() {
        let spec = json!({"ports": [
            {"name": "a", "port": 70000, "nodePort": 0, "targetPort": 0},
            {"name": "a", "port": 80, "nodePort": 65536, "targetPort": "", "protocol": "ICMP"}]});
        assert_eq!(
            errors(service(spec, json!({}))),
            [
                "spec.ports[0].port: 70000 is out of range 1-65535",
                "spec.ports[0].targetPort: 0 is out of range 1-65535",
                "spec.ports[1].nodePort: 65536 is out of range 1-65535",
                "spec.ports[1].nodePort: may not be used when `type` is 'ClusterIP'",
                "spec.ports[1].targetPort: must be a port number or a non-empty name",
                "spec.ports[1].protocol: \"ICMP\" is not one of TCP, UDP, SCTP",
                "spec.ports[1].name: duplicate port name \"a\"",
            ]
        );
    }

    fn range_errors(spec: Value, node_ports: &str) -> Vec<String> {
        let object = service(spec, json!({}));
        let errors = validate(&object, Some(node_ports.parse().unwrap()));
        errors.into_iter().map(|e| format!("{}: {}", e.field.unwrap_or_default(), e.message)).collect()
    }

    #[test]
    fn node_ports_must_be_in_the_node_port_range() {
        let spec = json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 10256,
            "ports": [{"name": "ssh", "port": 22, "nodePort": 22}, {"name": "a", "port": 80, "nodePort": 30000},
                      {"name": "b", "port": 81, "nodePort": 32767}, {"name": "c", "port": 82, "nodePort": 32768}]});
        assert_eq!(
            range_errors(spec.clone(), "30000-32767"),
            [
                "spec.ports[0].nodePort: 22 is not in the NodePort range 30000-32767 (--service-node-port-range)",
                "spec.ports[3].nodePort: 32768 is not in the NodePort range 30000-32767 (--service-node-port-range)",
                "spec.healthCheckNodePort: 10256 is not in the NodePort range 30000-32767 (--service-node-port-range)",
            ]
        );
        assert_eq!(range_errors(spec.clone(), "22-32767").len(), 1, "a configured range is honoured");
        // An API server's object was checked against the API server's own range.
        assert!(errors(service(spec, json!({}))).is_empty());
    }

    #[test]
    fn fields_only_some_service_types_may_set() {
        let cluster_ip = json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 30001,
            "loadBalancerSourceRanges": ["10.0.0.0/8"], "allocateLoadBalancerNodePorts": true,
            "ports": [{"port": 80, "nodePort": 30080}]});
        assert_eq!(
            errors(service(cluster_ip, json!({}))),
            [
                "spec.loadBalancerSourceRanges: may only be used when `type` is 'LoadBalancer'",
                "spec.allocateLoadBalancerNodePorts: may only be used when `type` is 'LoadBalancer'",
                "spec.ports[0].nodePort: may not be used when `type` is 'ClusterIP'",
                "spec.externalTrafficPolicy: may only be set for externally-accessible services",
                "spec.healthCheckNodePort: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` \
                 is 'Local'",
            ]
        );
        // externalIPs make a ClusterIP Service externally accessible.
        let external = json!({"externalIPs": ["1.2.3.4"], "externalTrafficPolicy": "Local", "ports": [{"port": 80}]});
        assert!(errors(service(external, json!({}))).is_empty());
        let node_port = json!({"type": "NodePort", "clusterIP": "None", "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 30001, "ports": [{"port": 80}]});
        assert_eq!(
            errors(service(node_port, json!({}))),
            [
                "spec.clusterIP: may not be 'None' for NodePort services",
                "spec.healthCheckNodePort: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` \
                 is 'Local'",
            ]
        );
        let external_name = json!({"type": "ExternalName", "clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"});
        assert_eq!(
            errors(service(external_name, json!({}))),
            [
                "spec.clusterIP: may not be set for ExternalName services",
                "spec.clusterIPs: may not be set for ExternalName services",
                "spec.ipFamilies: may not be set for ExternalName services",
                "spec.ipFamilyPolicy: may not be set for ExternalName services",
                "spec.externalName: is required",
            ]
        );
    }

    #[test]
    fn cluster_ips_and_ip_families_agree() {
        let errors_of = |spec: Value| errors(service(spec, json!({})));
        assert_eq!(
            errors_of(json!({"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.2"], "ipFamilies": ["IPv4", "IPv4"],
                "ipFamilyPolicy": "DualStack"})),
            [
                "spec.ipFamilies[1]: duplicate \"IPv4\"",
                "spec.ipFamilyPolicy: \"DualStack\" is not one of SingleStack, PreferDualStack, RequireDualStack",
                "spec.clusterIPs: first value must match `clusterIP`",
            ]
        );
        assert_eq!(
            errors_of(json!({"clusterIPs": ["10.0.0.1", "10.0.0.2", "fd00::1"]})),
            [
                "spec.clusterIPs: may only hold up to 2 values",
                "spec.clusterIPs: may specify no more than one IP for each IP family",
            ]
        );
        assert_eq!(
            errors_of(json!({"clusterIPs": ["None", "fd00::1"]})),
            ["spec.clusterIPs: 'None' must be the first and only value"]
        );
        assert_eq!(
            errors_of(json!({"clusterIPs": ["10.0.0.1", "fd00::1"], "ipFamilies": ["IPv6", "IPv4"]})),
            [
                "spec.clusterIPs[0]: expected an IPv6 value as indicated by `ipFamilies[0]`",
                "spec.clusterIPs[1]: expected an IPv4 value as indicated by `ipFamilies[1]`",
            ]
        );
        assert_eq!(
            errors_of(json!({"clusterIPs": ["10.0.0.1", "fd00::1"], "ipFamilyPolicy": "SingleStack"})),
            ["spec.ipFamilyPolicy: SingleStack may not have more than one IP family"]
        );
        let dual = json!({"clusterIP": "fd00::1", "clusterIPs": ["fd00::1", "10.0.0.1"],
            "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack"});
        assert!(errors_of(dual).is_empty());
    }

    #[test]
    fn port_names_protocols_and_duplicates() {
        let spec = json!({"type": "NodePort", "ports": [
            {"port": 80, "nodePort": 30080},
            {"port": 80, "protocol": "TCP", "nodePort": 30080, "appProtocol": "kubernetes.io/h2c"},
            {"name": "udp", "port": 80, "protocol": "UDP", "nodePort": 30080, "appProtocol": "http 2"}]});
        assert_eq!(
            errors(service(spec, json!({}))),
            [
                "spec.ports[0].name: is required when a Service has more than one port",
                "spec.ports[1].nodePort: duplicate nodePort 30080/TCP",
                "spec.ports[1].name: is required when a Service has more than one port",
                "spec.ports[1]: duplicate port 80/TCP",
                "spec.ports[2].appProtocol: \"http 2\" name part must consist of letters, digits, '-', '_' or '.', \
                 starting and ending with a letter or digit",
            ]
        );
        let affinity = json!({"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}, "ports": [{"port": 80}]});
        assert_eq!(
            errors(service(affinity, json!({}))),
            ["spec.sessionAffinityConfig: must not be set when session affinity is None"]
        );
    }

    #[test]
    fn service_enums_and_timeout() {
        let spec = json!({"type": "Headless", "sessionAffinity": "Sticky",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
            "externalTrafficPolicy": "Node", "internalTrafficPolicy": "local"});
        assert_eq!(
            errors(service(spec, json!({}))),
            [
                "spec.type: \"Headless\" is not one of ClusterIP, NodePort, LoadBalancer, ExternalName",
                "spec.sessionAffinity: \"Sticky\" is not one of None, ClientIP",
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is out of range 1-86400",
                "spec.externalTrafficPolicy: \"Node\" is not one of Cluster, Local",
                "spec.internalTrafficPolicy: \"local\" is not one of Cluster, Local",
            ]
        );
    }

    #[test]
    fn endpoint_slices() {
        let labels = json!({SERVICE_NAME_LABEL: "s"});
        let ok = slice(
            "IPv6",
            labels.clone(),
            json!([{"addresses": ["fd00::1"]}]),
            json!([{"port": 80, "protocol": "UDP"}]),
        );
        assert!(errors(ok).is_empty());
        let bad = slice(
            "IPv4",
            json!({}),
            json!([{"addresses": ["10.0.0.1", "fd00::1"]}]),
            json!([{"port": 0, "protocol": "X"}]),
        );
        assert_eq!(
            errors(bad),
            [
                "metadata.labels: missing label kubernetes.io/service-name",
                "endpoints[0].addresses[1]: \"fd00::1\" is not a valid IPv4 address",
                "ports[0].port: 0 is out of range 1-65535",
                "ports[0].protocol: \"X\" is not one of TCP, UDP, SCTP",
            ]
        );
        assert_eq!(
            errors(slice("IP", labels, json!([]), json!([]))),
            ["addressType: \"IP\" is not one of IPv4, IPv6, FQDN"]
        );
    }

    fn object(kind: &str, value: Value) -> Object {
        let api_version = if kind.starts_with("Ingress") { "networking.k8s.io/v1" } else { "v1" };
        let mut v = json!({"apiVersion": api_version, "kind": kind});
        v.as_object_mut().unwrap().extend(value.as_object().unwrap().clone());
        match kind {
            "Service" => Object::Service(serde_json::from_value(v).unwrap()),
            "Pod" => Object::Pod(serde_json::from_value(v).unwrap()),
            "Namespace" => Object::Namespace(serde_json::from_value(v).unwrap()),
            "Ingress" => Object::Ingress(serde_json::from_value(v).unwrap()),
            "IngressClass" => Object::IngressClass(serde_json::from_value(v).unwrap()),
            _ => unreachable!("{kind}"),
        }
    }

    #[test]
    fn names_namespaces_and_labels_as_the_api_server() {
        let meta = json!({"metadata": {"name": "1web", "namespace": "Prod_1", "labels": {"app\n": "a b", "ok": ""}}});
        assert_eq!(
            errors(object("Service", meta.clone())),
            [
                "metadata.name: \"1web\" must be an RFC 1035 label: lowercase letters, digits and '-', starting \
                 with a letter and ending with a letter or digit",
                "metadata.namespace: \"Prod_1\" must be a lowercase RFC 1123 label: lowercase letters, digits and \
                 '-', starting and ending with a letter or digit",
                "metadata.labels[\"app\\n\"]: \"app\\n\" name part must consist of letters, digits, '-', '_' or \
                 '.', starting and ending with a letter or digit",
                "metadata.labels[\"app\\n\"]: \"a b\" must consist of letters, digits, '-', '_' or '.', starting \
                 and ending with a letter or digit",
            ]
        );
        // A Pod's name is a subdomain (it may start with a digit and hold dots).
        assert!(errors(object("Pod", json!({"metadata": {"name": "1.web-0"}}))).is_empty());
        assert_eq!(errors(object("Namespace", json!({"metadata": {"name": "a.b"}}))).len(), 1);
        let selector = json!({"metadata": {"name": "s"}, "spec": {"selector": {"app": "x\ny"}}});
        assert_eq!(errors(object("Service", selector)).len(), 1);
    }

    #[test]
    fn port_names_and_special_addresses() {
        let spec = json!({"clusterIP": "127.0.0.1", "externalIPs": ["169.254.169.254", "0.0.0.0"],
            "ports": [{"name": "HTTP\n-A INPUT -j DROP", "port": 80, "targetPort": "web_port"}]});
        assert_eq!(
            errors(service(spec, json!({}))),
            [
                "spec.clusterIP: \"127.0.0.1\" may not be in the loopback range (127.0.0.0/8, ::1/128)",
                "spec.externalIPs[0]: \"169.254.169.254\" may not be in the link-local range (169.254.0.0/16, fe80::/10)",
                "spec.externalIPs[1]: \"0.0.0.0\" may not be unspecified (0.0.0.0, ::)",
                "spec.ports[0].targetPort: \"web_port\" must contain only lowercase letters, digits and '-'",
                "spec.ports[0].name: \"HTTP\\n-A INPUT -j DROP\" must be a lowercase RFC 1123 label: lowercase \
                 letters, digits and '-', starting and ending with a letter or digit",
            ]
        );
        let external = json!({"type": "ExternalName", "externalName": "db.example.com."});
        assert!(errors(service(external, json!({}))).is_empty());
        let external = json!({"type": "ExternalName", "externalName": "db example"});
        assert_eq!(errors(service(external, json!({}))).len(), 1);
        let labels = json!({SERVICE_NAME_LABEL: "s"});
        let bad = slice(
            "IPv6",
            labels,
            json!([{"addresses": ["::1"], "hostname": "Web_0", "nodeName": "node a"}]),
            json!([{"name": "Dns", "port": 53}]),
        );
        assert_eq!(
            errors(bad),
            [
                "endpoints[0].addresses[0]: \"::1\" may not be in the loopback range (127.0.0.0/8, ::1/128)",
                "endpoints[0].hostname: \"Web_0\" must be a lowercase RFC 1123 label: lowercase letters, digits and \
                 '-', starting and ending with a letter or digit",
                "endpoints[0].nodeName: \"node a\" must be a lowercase RFC 1123 subdomain: dot-separated labels of \
                 lowercase letters, digits and '-', each starting and ending with a letter or digit",
                "ports[0].name: \"Dns\" must be a lowercase RFC 1123 label: lowercase letters, digits and '-', \
                 starting and ending with a letter or digit",
            ]
        );
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c",
            "ports": [{"name": "http", "containerPort": 80}, {"name": "80", "containerPort": 0}]}]}});
        assert_eq!(
            errors(object("Pod", pod)),
            [
                "spec.containers[0].ports[1].name: \"80\" must contain at least one letter (a-z)",
                "spec.containers[0].ports[1].containerPort: 0 is out of range 1-65535",
            ]
        );
    }

    #[test]
    fn ingress_hosts_paths_and_backends() {
        let backend = |name: &str, port: Value| json!({"service": {"name": name, "port": port}});
        let ingress = json!({"metadata": {"name": "i"}, "spec": {
            "ingressClassName": "roadkeeper",
            "tls": [{"hosts": ["*.example.com", "10.0.0.1"], "secretName": "Cert"}],
            "rules": [{"host": "a.*.com", "http": {"paths": [
                {"path": "/ok", "pathType": "Prefix", "backend": backend("web", json!({"name": "http"}))},
                {"path": "/a/../b", "pathType": "Exact", "backend": backend("Web", json!({"number": 70000}))},
                {"path": "x", "pathType": "ImplementationSpecific", "backend": backend("web", json!({"name": "Http"}))},
                {"path": "/a/.", "pathType": "Regex", "backend": backend("web", json!({"number": 80}))}]}}]}});
        assert_eq!(
            errors(object("Ingress", ingress)),
            [
                "spec.tls[0].hosts[1]: \"10.0.0.1\" must be a DNS name, not an IP address",
                "spec.tls[0].secretName: \"Cert\" must be a lowercase RFC 1123 subdomain: dot-separated labels of \
                 lowercase letters, digits and '-', each starting and ending with a letter or digit",
                "spec.rules[0].host: \"a.*.com\" must be '*.' followed by a lowercase RFC 1123 subdomain",
                "spec.rules[0].http.paths[1].path: \"/a/../b\" must not contain '/../'",
                "spec.rules[0].http.paths[1].backend.service.name: \"Web\" must be an RFC 1035 label: lowercase \
                 letters, digits and '-', starting with a letter and ending with a letter or digit",
                "spec.rules[0].http.paths[1].backend.service.port.number: 70000 is out of range 1-65535",
                "spec.rules[0].http.paths[2].path: \"x\" must be an absolute path",
                "spec.rules[0].http.paths[2].backend.service.port.name: \"Http\" must contain only lowercase letters, \
                 digits and '-'",
                "spec.rules[0].http.paths[3].pathType: \"Regex\" is not one of Exact, Prefix, ImplementationSpecific",
            ]
        );
        let class = json!({"metadata": {"name": "c"}, "spec": {"controller": "roadkeeper"}});
        assert_eq!(errors(object("IngressClass", class)).len(), 1);
        let class = json!({"metadata": {"name": "c"}, "spec": {"controller": "roadkeeper.dev/ingress"}});
        assert!(errors(object("IngressClass", class)).is_empty());
    }

    #[test]
    fn pods_nodes_and_cidrs() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "status": {"podIP": "10.1.0.1.1", "podIPs": [{"ip": "10.1.0.1"}, {"ip": "zz"}]}});
        assert_eq!(
            errors(Object::Pod(serde_json::from_value(pod).unwrap())),
            [
                "status.podIP: \"10.1.0.1.1\" is not a valid IP address",
                "status.podIPs[1].ip: \"zz\" is not a valid IP address",
            ]
        );
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "status": {"addresses": [{"type": "Hostname", "address": "n"}, {"type": "InternalIP", "address": "n"}]}});
        assert_eq!(
            errors(Object::Node(serde_json::from_value(node).unwrap())),
            ["status.addresses[1].address: \"n\" is not a valid IP address",]
        );
        let cidr = json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "c"},
            "spec": {"cidrs": ["10.96.0.0/12", "fd00::/300"]}});
        assert_eq!(
            errors(Object::ServiceCidr(serde_json::from_value(cidr).unwrap())),
            ["spec.cidrs[1]: \"fd00::/300\" is not a valid CIDR",]
        );
    }

    #[test]
    fn deployments_need_a_selector_matching_their_template() {
        let deployment = |spec: Value| {
            let v = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec});
            Object::Deployment(serde_json::from_value(v).unwrap())
        };
        let template = |labels: Value, containers: Value| json!({"metadata": {"labels": labels}, "spec": {"containers": containers}});
        let web = json!([{"name": "web", "ports": [{"containerPort": 80}]}]);
        let good = deployment(json!({"replicas": 3, "selector": {"matchLabels": {"app": "hello"}},
            "template": template(json!({"app": "hello"}), web.clone())}));
        assert!(errors(good).is_empty());
        let bad = deployment(json!({"replicas": -1, "selector": {"matchLabels": {"app": "hello"}},
            "template": template(json!({"app": "other"}), json!([{"name": "Web", "ports": [{"containerPort": 0}],
                "volumeMounts": [{"name": "html", "mountPath": "html"},
                    {"name": "html", "mountPath": "/a", "subPath": "x/../../etc"},
                    {"name": "html", "mountPath": "/b", "subPath": "/etc"}]}]))}));
        assert_eq!(
            errors(bad),
            [
                "spec.replicas: -1 must be greater than or equal to 0",
                "spec.template.metadata.labels: `selector` does not match template `labels`",
                "spec.template.spec.containers[0].name: \"Web\" must be a lowercase RFC 1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
                "spec.template.spec.containers[0].ports[0].containerPort: 0 is out of range 1-65535",
                "spec.template.spec.containers[0].volumeMounts[0].name: \"html\" names no volume of the pod",
                "spec.template.spec.containers[0].volumeMounts[0].mountPath: \"html\" must be an absolute path",
                "spec.template.spec.containers[0].volumeMounts[1].name: \"html\" names no volume of the pod",
                "spec.template.spec.containers[0].volumeMounts[1].subPath: \"x/../../etc\" must not contain '..'",
                "spec.template.spec.containers[0].volumeMounts[2].name: \"html\" names no volume of the pod",
                "spec.template.spec.containers[0].volumeMounts[2].subPath: \"/etc\" must be a relative path",
            ]
        );
        let expressions = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]},
            {"key": "tier", "operator": "DoesNotExist"}]});
        let by_expression =
            deployment(json!({"selector": expressions, "template": template(json!({"app": "b"}), web)}));
        assert!(errors(by_expression).is_empty());
    }

    #[test]
    fn config_map_keys_are_file_names() {
        let v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"index.html": "<p>hi</p>", "../x": "no"}});
        assert_eq!(
            errors(Object::ConfigMap(serde_json::from_value(v).unwrap())),
            ["data[\"../x\"]: must be a file name of letters, digits, '-', '_' or '.'"]
        );
    }
}
