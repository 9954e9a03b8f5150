//! Per-object validation of the fields the proxy relies on.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::Object;

/// Label naming the Service an EndpointSlice belongs to.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A problem with one field of an object (`field` is `None` when no path is known).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldError {
    pub field: Option<String>,
    pub message: String,
}

/// Returns every field error of `object`; empty when it is valid.
pub(crate) fn validate(object: &Object) -> Vec<FieldError> {
    let mut v = Errors::default();
    match object {
        Object::Service(s) => service(&mut v, s),
        Object::EndpointSlice(s) => endpoint_slice(&mut v, s),
        Object::Pod(p) => pod(&mut v, p),
        Object::Node(n) => node(&mut v, n),
        Object::ServiceCidr(c) => service_cidr(&mut v, c),
        Object::Namespace(_) | Object::Ingress(_) | Object::IngressClass(_) | Object::Secret(_) => {}
    }
    v.0
}

const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];

fn service(v: &mut Errors, svc: &Service) {
    let Some(spec) = &svc.spec else { return };
    if let Some(t) = &spec.type_ {
        v.one_of("spec.type", t, &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]);
    }
    if let Some(ip) = &spec.cluster_ip {
        v.cluster_ip("spec.clusterIP", ip);
    }
    for (i, ip) in spec.cluster_ips.iter().flatten().enumerate() {
        v.cluster_ip(&format!("spec.clusterIPs[{i}]"), ip);
    }
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        v.ip(&format!("spec.externalIPs[{i}]"), ip);
    }
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty()) {
        v.ip("spec.loadBalancerIP", ip);
    }
    for (i, range) in spec.load_balancer_source_ranges.iter().flatten().enumerate() {
        v.cidr(&format!("spec.loadBalancerSourceRanges[{i}]"), range);
    }
    for (i, family) in spec.ip_families.iter().flatten().enumerate() {
        v.one_of(&format!("spec.ipFamilies[{i}]"), family, &["IPv4", "IPv6"]);
    }
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        v.port(&format!("{at}.port"), port.port);
        if let Some(n) = port.node_port.filter(|&n| n != 0) {
            v.port(&format!("{at}.nodePort"), n);
        }
        match &port.target_port {
            Some(IntOrString::Int(n)) => v.port(&format!("{at}.targetPort"), *n),
            Some(IntOrString::String(s)) if s.is_empty() => {
                v.push(&format!("{at}.targetPort"), "must be a port number or a non-empty name".into())
            }
            _ => {}
        }
        if let Some(p) = &port.protocol {
            v.one_of(&format!("{at}.protocol"), p, PROTOCOLS);
        }
        let name = port.name.as_deref().unwrap_or_default();
        if ports.len() > 1 && !names.insert(name) {
            v.push(&format!("{at}.name"), format!("duplicate port name {name:?}"));
        }
    }
    if let Some(a) = &spec.session_affinity {
        v.one_of("spec.sessionAffinity", a, &["None", "ClientIP"]);
    }
    let timeout = spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref()?.timeout_seconds);
    if let Some(t) = timeout.filter(|t| !(1..=86400).contains(t)) {
        v.push("spec.sessionAffinityConfig.clientIP.timeoutSeconds", format!("{t} is out of range 1-86400"));
    }
    if let Some(p) = &spec.external_traffic_policy {
        v.one_of("spec.externalTrafficPolicy", p, TRAFFIC_POLICIES);
    }
    if let Some(p) = &spec.internal_traffic_policy {
        v.one_of("spec.internalTrafficPolicy", p, TRAFFIC_POLICIES);
    }
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()?.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        if let Some(ip) = &ing.ip {
            v.ip(&format!("status.loadBalancer.ingress[{i}].ip"), ip);
        }
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
            let valid = match family {
                "IPv4" => addr.parse::<Ipv4Addr>().is_ok(),
                "IPv6" => addr.parse::<Ipv6Addr>().is_ok(),
                _ => !addr.is_empty(),
            };
            if !valid {
                v.push(&format!("endpoints[{i}].addresses[{j}]"), format!("{addr:?} is not a valid {family} address"));
            }
        }
    }
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        if let Some(n) = port.port {
            v.port(&format!("ports[{i}].port"), n);
        }
        if let Some(p) = &port.protocol {
            v.one_of(&format!("ports[{i}].protocol"), p, PROTOCOLS);
        }
    }
}

fn pod(v: &mut Errors, pod: &Pod) {
    let Some(status) = &pod.status else { return };
    if let Some(ip) = &status.pod_ip {
        v.ip("status.podIP", ip);
    }
    for (i, ip) in status.pod_ips.iter().flatten().enumerate() {
        v.ip(&format!("status.podIPs[{i}].ip"), &ip.ip);
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

    /// A cluster IP: an IP, `None` (headless) or empty (unallocated).
    fn cluster_ip(&mut self, field: &str, value: &str) {
        if !matches!(value, "None" | "") {
            self.ip(field, value);
        }
    }

    fn cidr(&mut self, field: &str, value: &str) {
        if value.trim().parse::<IpNet>().is_err() {
            self.push(field, format!("{value:?} is not a valid CIDR"));
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
        validate(&object).into_iter().map(|e| format!("{}: {}", e.field.unwrap_or_default(), e.message)).collect()
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
                "spec.ports[1].targetPort: must be a port number or a non-empty name",
                "spec.ports[1].protocol: \"ICMP\" is not one of TCP, UDP, SCTP",
                "spec.ports[1].name: duplicate port name \"a\"",
            ]
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
}
