//! What the API server hands out to Services (pure): ClusterIPs from the lab's service range,
//! NodePorts and health-check NodePorts from 30000-32767, and load-balancer addresses from the
//! lab's pool (as a load-balancer controller writes them into `status.loadBalancer`).
//!
//! Allocations are kept from one reading of the manifests to the next, so a Service keeps its
//! addresses while it exists. Explicit requests (`clusterIP`, `nodePort`, `loadBalancerIP`) are
//! honoured when valid and free; a Service asking for something taken or outside the ranges is
//! refused, as the API server refuses it, and named in a problem.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use roadkeeper_cluster::NodePortRange;
use roadkeeper_cluster::k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServiceStatus};
use roadkeeper_netlab::cluster::SERVICE_CIDR;
use serde::{Deserialize, Serialize};

/// ClusterIPs handed out to Services that ask for none start here (the ones below are left to
/// explicit requests, such as kube-dns's 10.96.0.10).
pub const FIRST_DYNAMIC_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 100);
/// NodePorts: the API server's default range, the one every lab component reading the generated
/// manifests checks them against.
pub const NODE_PORTS: RangeInclusive<u16> = NodePortRange::DEFAULT.first()..=NodePortRange::DEFAULT.last();
/// Load-balancer addresses handed out (inside [`roadkeeper_netlab::cluster::LB_POOL`]).
pub const LB_ADDRESSES: RangeInclusive<u8> = 200..=250;

/// Everything handed out, by Service (`namespace/name`) and Service port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Allocations {
    /// ClusterIP per Service.
    pub cluster_ips: BTreeMap<String, Ipv4Addr>,
    /// NodePort per Service port (`namespace/name/port-name/port/protocol`).
    pub node_ports: BTreeMap<String, u16>,
    /// `healthCheckNodePort` per Service.
    pub health_check_ports: BTreeMap<String, u16>,
    /// Load-balancer address per Service.
    pub lb_ips: BTreeMap<String, Ipv4Addr>,
}

/// The Services as the API server would hold them, the allocations, and the Services refused.
#[derive(Debug, Default)]
pub struct Allocated {
    /// The accepted Services, with their allocations written in.
    pub services: Vec<Service>,
    /// What is handed out now.
    pub allocations: Allocations,
    /// Why Services were refused (`Service ns/name: field: message`).
    pub problems: Vec<String>,
}

/// Allocates for `services`, keeping what `previous` gave to Services that still exist and ask
/// for nothing else. New allocations go in the order given, as an API server allocates in the
/// order of creation: the controller gives the lab's own Services first, so that they get the
/// same addresses whatever the manifests hold.
pub fn allocate(previous: &Allocations, services: &[&Service]) -> Allocated {
    let mut taken = Taken::default();
    let mut out = Allocated::default();
    // Explicit requests first, then what each Service had, then new ones: an explicit request
    // never loses to an automatic allocation.
    let mut accepted = Vec::new();
    for service in services {
        match claim_explicit(service, &mut taken) {
            Ok(()) => accepted.push(service),
            Err(problem) => out.problems.push(format!("Service {}: {problem}", key(service))),
        }
    }
    for service in &accepted {
        keep_previous(service, previous, &mut taken);
    }
    for service in accepted {
        out.services.push(fill(service, &mut taken, &mut out.allocations));
    }
    out
}

/// Addresses and ports in use while allocating, with what uses them.
#[derive(Default)]
struct Taken {
    cluster_ips: BTreeMap<Ipv4Addr, String>,
    node_ports: BTreeMap<u16, String>,
    lb_ips: BTreeMap<Ipv4Addr, String>,
    /// What `previous` still gives, by the same keys as [`Allocations`].
    kept: Allocations,
}

fn key(service: &Service) -> String {
    let meta = &service.metadata;
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

fn is_type(service: &Service, types: &[&str]) -> bool {
    types.contains(&service.spec.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP"))
}

fn port_key(service: &Service, port: &roadkeeper_cluster::k8s_openapi::api::core::v1::ServicePort) -> String {
    let name = port.name.as_deref().unwrap_or_default();
    format!("{}/{name}/{}/{}", key(service), port.port, port.protocol.as_deref().unwrap_or("TCP"))
}

/// Checks and takes what the Service asks for explicitly.
fn claim_explicit(service: &Service, taken: &mut Taken) -> Result<(), String> {
    let me = key(service);
    let Some(spec) = &service.spec else { return Ok(()) };
    let families = spec.ip_families.iter().flatten();
    if families.clone().any(|f| f == "IPv6") || spec.ip_family_policy.as_deref() == Some("RequireDualStack") {
        return Err("spec.ipFamilies: the lab's cluster is single-stack IPv4".into());
    }
    let mut claims = Vec::new();
    if !is_type(service, &["ExternalName"]) {
        let requested =
            spec.cluster_ip.as_deref().or(spec.cluster_ips.as_ref().and_then(|ips| ips.first()).map(String::as_str));
        if let Some(text) = requested.filter(|ip| !ip.is_empty() && *ip != "None") {
            let ip: Ipv4Addr = text.parse().map_err(|_| format!("spec.clusterIP: {text} is not an IPv4 address"))?;
            if !SERVICE_CIDR.contains(&ip) {
                return Err(format!("spec.clusterIP: {ip} is not in the lab's service range {SERVICE_CIDR}"));
            }
            if let Some(owner) = taken.cluster_ips.get(&ip) {
                return Err(format!("spec.clusterIP: {ip} is already allocated to Service {owner}"));
            }
            claims.push(Claim::ClusterIp(ip));
        }
    }
    if is_type(service, &["NodePort", "LoadBalancer"]) {
        for (i, port) in spec.ports.iter().flatten().enumerate() {
            let Some(n) = port.node_port.filter(|&n| n != 0) else { continue };
            let n = u16::try_from(n).ok().filter(|n| NODE_PORTS.contains(n)).ok_or_else(|| {
                format!("spec.ports[{i}].nodePort: {n} is not in the range {}-{}", NODE_PORTS.start(), NODE_PORTS.end())
            })?;
            if let Some(owner) = taken.node_ports.get(&n).filter(|owner| **owner != me) {
                return Err(format!("spec.ports[{i}].nodePort: {n} is already allocated to Service {owner}"));
            }
            claims.push(Claim::NodePort(n));
        }
    }
    if is_type(service, &["LoadBalancer"])
        && let Some(text) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty())
    {
        let ip = text
            .parse::<Ipv4Addr>()
            .ok()
            .filter(|ip| in_pool(*ip))
            .ok_or_else(|| format!("spec.loadBalancerIP: {text} is not in the lab's pool {}", pool_text()))?;
        if let Some(owner) = taken.lb_ips.get(&ip) {
            return Err(format!("spec.loadBalancerIP: {ip} is already allocated to Service {owner}"));
        }
        claims.push(Claim::LbIp(ip));
    }
    for claim in claims {
        match claim {
            Claim::ClusterIp(ip) => taken.cluster_ips.insert(ip, me.clone()),
            Claim::NodePort(n) => taken.node_ports.insert(n, me.clone()),
            Claim::LbIp(ip) => taken.lb_ips.insert(ip, me.clone()),
        };
    }
    Ok(())
}

enum Claim {
    ClusterIp(Ipv4Addr),
    NodePort(u16),
    LbIp(Ipv4Addr),
}

/// Keeps the Service's previous allocations that are still free and still wanted.
fn keep_previous(service: &Service, previous: &Allocations, taken: &mut Taken) {
    let me = key(service);
    let spec = service.spec.clone().unwrap_or_default();
    let wants_ip = !is_type(service, &["ExternalName"]) && spec.cluster_ip.as_deref() != Some("None");
    if let Some(&ip) = previous.cluster_ips.get(&me).filter(|_| wants_ip)
        && let Entry::Vacant(free) = taken.cluster_ips.entry(ip)
    {
        free.insert(me.clone());
        taken.kept.cluster_ips.insert(me.clone(), ip);
    }
    if is_type(service, &["NodePort", "LoadBalancer"]) {
        for port in spec.ports.iter().flatten() {
            let port_key = port_key(service, port);
            if let Some(&n) = previous.node_ports.get(&port_key)
                && let Entry::Vacant(free) = taken.node_ports.entry(n)
            {
                free.insert(me.clone());
                taken.kept.node_ports.insert(port_key, n);
            }
        }
        if let Some(&n) = previous.health_check_ports.get(&me)
            && let Entry::Vacant(free) = taken.node_ports.entry(n)
        {
            free.insert(me.clone());
            taken.kept.health_check_ports.insert(me.clone(), n);
        }
    }
    if let Some(&ip) = previous.lb_ips.get(&me).filter(|_| is_type(service, &["LoadBalancer"]))
        && let Entry::Vacant(free) = taken.lb_ips.entry(ip)
    {
        free.insert(me.clone());
        taken.kept.lb_ips.insert(me, ip);
    }
}

/// The Service with everything it needs allocated, recorded in `allocations`.
fn fill(original: &Service, taken: &mut Taken, allocations: &mut Allocations) -> Service {
    let me = key(original);
    let mut service = original.clone();
    if is_type(&service, &["ExternalName"]) {
        return service;
    }
    let spec = service.spec.get_or_insert_with(Default::default);
    spec.ip_families = Some(vec!["IPv4".into()]);
    spec.ip_family_policy.get_or_insert_with(|| "SingleStack".into());
    if spec.cluster_ip.as_deref() != Some("None") {
        let explicit =
            spec.cluster_ip.as_deref().or(spec.cluster_ips.as_ref().and_then(|ips| ips.first()).map(String::as_str));
        let ip = match explicit.filter(|ip| !ip.is_empty()).and_then(|ip| ip.parse::<Ipv4Addr>().ok()) {
            Some(ip) => ip,
            None => taken.kept.cluster_ips.get(&me).copied().unwrap_or_else(|| {
                let ip = (u32::from(FIRST_DYNAMIC_CLUSTER_IP)..u32::from(SERVICE_CIDR.broadcast()))
                    .map(Ipv4Addr::from)
                    .find(|ip| !taken.cluster_ips.contains_key(ip))
                    .unwrap_or(FIRST_DYNAMIC_CLUSTER_IP);
                taken.cluster_ips.insert(ip, me.clone());
                ip
            }),
        };
        allocations.cluster_ips.insert(me.clone(), ip);
        spec.cluster_ip = Some(ip.to_string());
        spec.cluster_ips = Some(vec![ip.to_string()]);
    } else {
        spec.cluster_ips = Some(vec!["None".into()]);
    }
    let node_ports = is_type_spec(spec.type_.as_deref(), &["NodePort", "LoadBalancer"])
        && !(spec.type_.as_deref() == Some("LoadBalancer") && spec.allocate_load_balancer_node_ports == Some(false));
    let free_port = |taken: &mut Taken| {
        let n = NODE_PORTS.clone().find(|n| !taken.node_ports.contains_key(n)).unwrap_or(*NODE_PORTS.start());
        taken.node_ports.insert(n, me.clone());
        n
    };
    if node_ports {
        let keys: Vec<String> = spec.ports.iter().flatten().map(|port| port_key(original, port)).collect();
        for (port, port_key) in spec.ports.iter_mut().flatten().zip(keys) {
            let n = match port.node_port.filter(|&n| n != 0) {
                Some(n) => n as u16,
                None => taken.kept.node_ports.get(&port_key).copied().unwrap_or_else(|| free_port(taken)),
            };
            port.node_port = Some(i32::from(n));
            allocations.node_ports.insert(port_key, n);
        }
    }
    if spec.type_.as_deref() == Some("LoadBalancer") {
        if spec.external_traffic_policy.as_deref() == Some("Local") {
            let n = match spec.health_check_node_port.filter(|&n| n != 0) {
                Some(n) => n as u16,
                None => taken.kept.health_check_ports.get(&me).copied().unwrap_or_else(|| free_port(taken)),
            };
            spec.health_check_node_port = Some(i32::from(n));
            allocations.health_check_ports.insert(me.clone(), n);
        }
        let requested = spec.load_balancer_ip.as_deref().and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let ip = requested.or_else(|| taken.kept.lb_ips.get(&me).copied()).or_else(|| {
            let ip = LB_ADDRESSES.map(|n| Ipv4Addr::new(192, 168, 77, n)).find(|ip| !taken.lb_ips.contains_key(ip))?;
            taken.lb_ips.insert(ip, me.clone());
            Some(ip)
        });
        if let Some(ip) = ip {
            allocations.lb_ips.insert(me.clone(), ip);
            let ingress =
                LoadBalancerIngress { ip: Some(ip.to_string()), ip_mode: Some("VIP".into()), ..Default::default() };
            let status = service.status.get_or_insert_with(ServiceStatus::default);
            status.load_balancer = Some(LoadBalancerStatus { ingress: Some(vec![ingress]) });
        }
    }
    service
}

fn is_type_spec(type_: Option<&str>, types: &[&str]) -> bool {
    types.contains(&type_.unwrap_or("ClusterIP"))
}

fn in_pool(ip: Ipv4Addr) -> bool {
    let [a, b, c, d] = ip.octets();
    [a, b, c] == [192, 168, 77] && LB_ADDRESSES.contains(&d)
}

fn pool_text() -> String {
    format!("192.168.77.{}-192.168.77.{}", LB_ADDRESSES.start(), LB_ADDRESSES.end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})).unwrap()
    }

    fn spec(allocated: &Allocated, name: &str) -> serde_json::Value {
        let service = allocated.services.iter().find(|s| s.metadata.name.as_deref() == Some(name)).unwrap();
        serde_json::to_value(service).unwrap()
    }

    #[test]
    fn cluster_ips_are_handed_out_and_kept() {
        let a = service("a", json!({"ports": [{"port": 80}]}));
        let b = service("b", json!({"clusterIP": "10.96.0.100", "ports": [{"port": 80}]}));
        let first = allocate(&Allocations::default(), &[&a]);
        assert_eq!(first.allocations.cluster_ips["default/a"], FIRST_DYNAMIC_CLUSTER_IP);
        assert_eq!(spec(&first, "a")["spec"]["clusterIPs"], json!(["10.96.0.100"]));
        assert_eq!(spec(&first, "a")["spec"]["ipFamilies"], json!(["IPv4"]));
        // An explicit request wins over an automatic allocation: a moves, b gets what it asked.
        let second = allocate(&first.allocations, &[&a, &b]);
        assert_eq!(second.allocations.cluster_ips["default/b"], Ipv4Addr::new(10, 96, 0, 100));
        assert_eq!(second.allocations.cluster_ips["default/a"], Ipv4Addr::new(10, 96, 0, 101));
        let third = allocate(&second.allocations, &[&a, &b]);
        assert_eq!(third.allocations, second.allocations);
        let headless = service("h", json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        assert_eq!(spec(&allocate(&third.allocations, &[&headless]), "h")["spec"]["clusterIP"], "None");
    }

    #[test]
    fn node_ports_and_load_balancer_addresses() {
        let lb = service(
            "lb",
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}, {"name": "x", "port": 81, "nodePort": 30000}]}),
        );
        let np = service("np", json!({"type": "NodePort", "ports": [{"port": 80}]}));
        let out = allocate(&Allocations::default(), &[&lb, &np]);
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        let lb = spec(&out, "lb");
        assert_eq!(lb["spec"]["ports"][0]["nodePort"], 30001);
        assert_eq!(lb["spec"]["ports"][1]["nodePort"], 30000);
        assert_eq!(lb["spec"]["healthCheckNodePort"], 30002);
        assert_eq!(lb["status"]["loadBalancer"]["ingress"], json!([{"ip": "192.168.77.200", "ipMode": "VIP"}]));
        assert_eq!(spec(&out, "np")["spec"]["ports"][0]["nodePort"], 30003);
        // In the order given, not by name: the first LoadBalancer gets the pool's first address.
        let other = service("a-first-by-name", json!({"type": "LoadBalancer", "ports": [{"port": 80}]}));
        let lb = service("lb", json!({"type": "LoadBalancer", "ports": [{"port": 80}]}));
        let out = allocate(&Allocations::default(), &[&lb, &other]);
        let ip = |name| spec(&out, name)["status"]["loadBalancer"]["ingress"][0]["ip"].clone();
        assert_eq!([ip("lb"), ip("a-first-by-name")], ["192.168.77.200", "192.168.77.201"]);
    }

    #[test]
    fn impossible_requests_are_refused_naming_the_field() {
        let outside = service("outside", json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}));
        let first = service("first", json!({"clusterIP": "10.96.0.50", "ports": [{"port": 80}]}));
        let second = service("second", json!({"clusterIP": "10.96.0.50", "ports": [{"port": 80}]}));
        let v6 = service("v6", json!({"ipFamilies": ["IPv6"], "ports": [{"port": 80}]}));
        let port = service("port", json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}));
        let pool =
            service("pool", json!({"type": "LoadBalancer", "loadBalancerIP": "1.2.3.4", "ports": [{"port": 80}]}));
        let out = allocate(&Allocations::default(), &[&outside, &first, &second, &v6, &port, &pool]);
        assert_eq!(out.services.len(), 1);
        assert_eq!(
            out.problems,
            [
                "Service default/outside: spec.clusterIP: 10.0.0.1 is not in the lab's service range 10.96.0.0/12",
                "Service default/second: spec.clusterIP: 10.96.0.50 is already allocated to Service default/first",
                "Service default/v6: spec.ipFamilies: the lab's cluster is single-stack IPv4",
                "Service default/port: spec.ports[0].nodePort: 80 is not in the range 30000-32767",
                "Service default/pool: spec.loadBalancerIP: 1.2.3.4 is not in the lab's pool 192.168.77.200-192.168.77.250",
            ]
        );
    }
}
