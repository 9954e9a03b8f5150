//! Derives EndpointSlices from Pods for Services with a selector, the way the
//! kube-controller-manager EndpointSlice controller does.
//!
//! Slices are named `<service>-<ipv4|ipv6>-<hash>-<n>`: `hash` is an FNV-1a hash (8 hex digits)
//! of the resolved port set, `n` counts chunks of at most [`MAX_ENDPOINTS`] endpoints, which are
//! ordered by Pod name.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::validate::SERVICE_NAME_LABEL;

/// Most endpoints put in one slice.
const MAX_ENDPOINTS: usize = 100;
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const CONTROLLER: &str = "endpointslice-controller.k8s.io";

/// Endpoints sharing an address family and port set (keyed by family and [`port_key`]).
type Group = (Vec<EndpointPort>, Vec<Endpoint>);

/// Whether `service` has a Pod selector that matches `labels`.
pub(crate) fn selects(service: &Service, labels: Option<&BTreeMap<String, String>>) -> bool {
    selector(service).is_some_and(|selector| selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)))
}

/// The slices for `service` given candidate `pods` (any order; non-matching ones are skipped) and
/// a lookup of a Node's zone. Empty when the Service has no selector or is ExternalName.
pub(crate) fn derive<'a>(
    service: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
    zone_of: impl Fn(&str) -> Option<String>,
) -> Vec<EndpointSlice> {
    let Some(spec) = service.spec.as_ref().filter(|_| selector(service).is_some()) else {
        return Vec::new();
    };
    let mut pods: Vec<&Pod> =
        pods.into_iter().filter(|p| selects(service, p.metadata.labels.as_ref()) && !finished(p)).collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let families = families(spec);
    let mut groups: BTreeMap<(&str, String), Group> = BTreeMap::new();
    for pod in pods {
        let ports = resolve_ports(spec.ports.as_deref().unwrap_or_default(), pod);
        for &family in &families {
            let Some(ip) = pod_ip(pod, family) else {
                continue;
            };
            let group = groups.entry((family, port_key(&ports))).or_insert_with(|| (ports.clone(), Vec::new()));
            group.1.push(endpoint(spec, pod, ip, &zone_of));
        }
    }

    let name = service.metadata.name.as_deref().unwrap_or_default();
    let mut slices: Vec<EndpointSlice> = groups
        .into_iter()
        .flat_map(|((family, key), (ports, endpoints))| {
            let prefix = format!("{name}-{}-{:08x}", family.to_ascii_lowercase(), fnv1a(&key));
            endpoints
                .chunks(MAX_ENDPOINTS)
                .enumerate()
                .map(|(n, chunk)| EndpointSlice {
                    metadata: ObjectMeta {
                        name: Some(format!("{prefix}-{n}")),
                        namespace: service.metadata.namespace.clone(),
                        labels: Some(BTreeMap::from([
                            (SERVICE_NAME_LABEL.to_owned(), name.to_owned()),
                            (MANAGED_BY_LABEL.to_owned(), CONTROLLER.to_owned()),
                        ])),
                        ..ObjectMeta::default()
                    },
                    address_type: family.to_owned(),
                    endpoints: chunk.to_vec(),
                    ports: Some(ports.clone()),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    slices
}

/// The non-empty selector of a Service that is not ExternalName.
fn selector(service: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// `spec.ipFamilies`, else the family of `spec.clusterIP`, else IPv4.
fn families(spec: &ServiceSpec) -> Vec<&'static str> {
    let listed: Vec<&'static str> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| ["IPv4", "IPv6"].into_iter().find(|&known| known == f))
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    let cluster_ip = spec.cluster_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok());
    vec![family_of(cluster_ip.unwrap_or(IpAddr::from([0, 0, 0, 0])))]
}

fn family_of(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// The Pod's IP of `family`, from `status.podIPs` or else `status.podIP`. An address the API
/// server refuses in an EndpointSlice (loopback, link-local, ...) is none: the controller's
/// slice would be refused.
fn pod_ip<'a>(pod: &'a Pod, family: &str) -> Option<&'a str> {
    let status = pod.status.as_ref()?;
    let listed: Vec<&str> = status.pod_ips.iter().flatten().map(|p| p.ip.as_str()).collect();
    let ips = if listed.is_empty() { status.pod_ip.as_deref().into_iter().collect() } else { listed };
    ips.into_iter().find(|ip| {
        ip.parse::<IpAddr>().is_ok_and(|ip| family_of(ip) == family && crate::formats::endpoint_ip(&ip).is_ok())
    })
}

/// Endpoint ports for every Service port the Pod can serve (named target ports it lacks are left out).
fn resolve_ports(ports: &[ServicePort], pod: &Pod) -> Vec<EndpointPort> {
    ports
        .iter()
        .filter_map(|sp| {
            let protocol = sp.protocol.as_deref().unwrap_or("TCP");
            let port = match &sp.target_port {
                None => sp.port,
                Some(IntOrString::Int(n)) => *n,
                Some(IntOrString::String(name)) => container_port(pod, name, protocol)?,
            };
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(protocol.to_owned()),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

fn container_port(pod: &Pod, name: &str, protocol: &str) -> Option<i32> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
        .map(|p| p.container_port)
}

fn port_key(ports: &[EndpointPort]) -> String {
    let parts: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{}",
                p.name.as_deref().unwrap_or_default(),
                p.protocol.as_deref().unwrap_or_default(),
                p.port.unwrap_or_default()
            )
        })
        .collect();
    parts.join(",")
}

/// 32-bit FNV-1a: a small stable hash for slice names.
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

fn endpoint(spec: &ServiceSpec, pod: &Pod, ip: &str, zone_of: &impl Fn(&str) -> Option<String>) -> Endpoint {
    let pod_ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let publish = spec.publish_not_ready_addresses == Some(true);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let serving = publish || pod_ready;
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    Endpoint {
        addresses: vec![ip.to_owned()],
        conditions: Some(EndpointConditions {
            // As upstream: never ready while terminating, unless publishNotReadyAddresses.
            ready: Some(publish || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        zone: node_name.as_deref().and_then(zone_of),
        node_name,
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn service(spec: Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"}, "spec": spec})).unwrap()
    }

    fn pod(name: &str, labels: Value, ips: &[&str], ready: bool) -> Pod {
        let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]},
            "status": {"phase": "Running", "podIPs": pod_ips,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    fn web() -> Service {
        service(json!({"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}))
    }

    fn zone(node: &str) -> Option<String> {
        (node == "n1").then(|| "z1".to_owned())
    }

    fn addresses(slice: &EndpointSlice) -> Vec<&str> {
        slice.endpoints.iter().map(|e| e.addresses[0].as_str()).collect()
    }

    #[test]
    fn selects_matching_running_pods_sorted_by_name() {
        let mut done = pod("d", json!({"app": "web"}), &["10.0.0.4"], true);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let pods = [
            pod("b", json!({"app": "web", "x": "y"}), &["10.0.0.2"], true),
            pod("a", json!({"app": "web"}), &["10.0.0.1"], true),
            pod("c", json!({"app": "other"}), &["10.0.0.3"], true),
            pod("noip", json!({"app": "web"}), &[], true),
            done,
        ];
        let slices = derive(&web(), &pods, zone);
        assert_eq!(slices.len(), 1);
        let s = &slices[0];
        assert_eq!(s.address_type, "IPv4");
        assert!(s.metadata.name.as_deref().unwrap().starts_with("web-ipv4-"));
        assert!(s.metadata.name.as_deref().unwrap().ends_with("-0"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("ns"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "web");
        assert_eq!(labels[MANAGED_BY_LABEL], CONTROLLER);
        assert_eq!(addresses(s), ["10.0.0.1", "10.0.0.2"]);
        let ep = &s.endpoints[0];
        assert_eq!(ep.node_name.as_deref(), Some("n1"));
        assert_eq!(ep.zone.as_deref(), Some("z1"));
        assert_eq!(ep.target_ref.as_ref().unwrap().name.as_deref(), Some("a"));
        assert_eq!(
            ep.conditions,
            Some(EndpointConditions { ready: Some(true), serving: Some(true), terminating: Some(false) })
        );
        let port = &s.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.port, port.protocol.as_deref()),
            (Some("http"), Some(8080), Some("TCP"))
        );
    }

    #[test]
    fn no_slices_without_selector_or_for_external_name() {
        let pods = [pod("a", json!({"app": "web"}), &["10.0.0.1"], true)];
        assert!(derive(&service(json!({"selector": {}})), &pods, zone).is_empty());
        let external = service(json!({"type": "ExternalName", "selector": {"app": "web"}}));
        assert!(derive(&external, &pods, zone).is_empty());
        assert!(!selects(&external, pods[0].metadata.labels.as_ref()));
        assert!(selects(&web(), pods[0].metadata.labels.as_ref()));
        assert!(!selects(&web(), None));
    }

    #[test]
    fn named_target_ports_split_slices_by_port_set() {
        let svc = service(json!({"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
            {"name": "plain", "port": 9000}]}));
        let mut bare = pod("z", json!({"app": "web"}), &["10.0.0.9"], true);
        bare.spec.as_mut().unwrap().containers[0].ports = None;
        let pods = [pod("a", json!({"app": "web"}), &["10.0.0.1"], true), bare];
        let slices = derive(&svc, &pods, zone);
        assert_eq!(slices.len(), 2);
        let by_ports: BTreeMap<Vec<i32>, Vec<&str>> = slices
            .iter()
            .map(|s| (s.ports.iter().flatten().map(|p| p.port.unwrap()).collect(), addresses(s)))
            .collect();
        assert_eq!(by_ports[&vec![8080, 5353, 9000]], ["10.0.0.1"]);
        assert_eq!(by_ports[&vec![9000]], ["10.0.0.9"]);
    }

    #[test]
    fn more_than_100_endpoints_make_two_slices() {
        let pods: Vec<Pod> = (0..150)
            .map(|i| pod(&format!("p{i:03}"), json!({"app": "web"}), &[&format!("10.0.{}.{}", i / 250, i % 250)], true))
            .collect();
        let slices = derive(&web(), &pods, zone);
        assert_eq!(slices.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>(), [100, 50]);
        assert!(slices[0].metadata.name.as_deref().unwrap().ends_with("-0"));
        assert!(slices[1].metadata.name.as_deref().unwrap().ends_with("-1"));
        assert_eq!(slices[1].endpoints[0].target_ref.as_ref().unwrap().name.as_deref(), Some("p100"));
    }

    #[test]
    fn terminating_and_not_ready() {
        let mut term = pod("t", json!({"app": "web"}), &["10.0.0.1"], true);
        term.metadata.deletion_timestamp = serde_json::from_value(json!("2025-01-01T00:00:00Z")).unwrap();
        let pods = [term, pod("u", json!({"app": "web"}), &["10.0.0.2"], false)];
        let conditions: Vec<_> =
            derive(&web(), &pods, zone)[0].endpoints.iter().map(|e| e.conditions.clone().unwrap()).collect();
        assert_eq!(
            conditions,
            [
                EndpointConditions { ready: Some(false), serving: Some(true), terminating: Some(true) },
                EndpointConditions { ready: Some(false), serving: Some(false), terminating: Some(false) },
            ]
        );
        let mut publish = web();
        publish.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let ready: Vec<_> =
            derive(&publish, &pods, zone)[0].endpoints.iter().map(|e| e.conditions.as_ref().unwrap().ready).collect();
        assert_eq!(ready, [Some(true), Some(true)]);
    }

    #[test]
    fn dual_stack_and_family_defaults() {
        let pods = [
            pod("a", json!({"app": "web"}), &["10.0.0.1", "fd00::1"], true),
            pod("b", json!({"app": "web"}), &["fd00::2"], true),
        ];
        let mut svc = web();
        svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        let slices = derive(&svc, &pods, zone);
        let got: Vec<(&str, Vec<&str>)> = slices.iter().map(|s| (s.address_type.as_str(), addresses(s))).collect();
        assert_eq!(got, [("IPv4", vec!["10.0.0.1"]), ("IPv6", vec!["fd00::1", "fd00::2"])]);

        let mut v6 = web();
        v6.spec.as_mut().unwrap().cluster_ip = Some("fd00::10".into());
        assert_eq!(derive(&v6, &pods, zone)[0].address_type, "IPv6");
        let mut single = pod("c", json!({"app": "web"}), &[], true);
        single.status.as_mut().unwrap().pod_ip = Some("10.0.0.3".into());
        assert_eq!(addresses(&derive(&web(), &[single], zone)[0]), ["10.0.0.3"]);
    }
}
