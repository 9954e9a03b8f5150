//! This node's identity: its name, addresses and zone, from its Node object or, failing that,
//! from the host's interfaces.

use std::net::IpAddr;

use roadkeeper_cluster::Store;

use roadkeeper_rules::ipvs::plan::DUMMY_INTERFACE;
use roadkeeper_rules::table::{IpFamily, NodeInfo};

/// Label carrying the node's zone (topology hints).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Builds [`NodeInfo`] for `name`: primary IPs are the Node object's first InternalIP of each
/// family (else ExternalIP), else the host's first global address of each family.
pub fn node_info(name: &str, store: &Store, host_addresses: &[IpAddr]) -> NodeInfo {
    let node = store.node(name);
    let mut node_ips: Vec<IpAddr> = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        let addresses = node.and_then(|n| n.status.as_ref()?.addresses.as_ref());
        for address in addresses.into_iter().flatten().filter(|a| a.type_ == wanted) {
            if let Ok(ip) = address.address.parse::<IpAddr>()
                && !node_ips.iter().any(|have| IpFamily::of(have) == IpFamily::of(&ip))
            {
                node_ips.push(ip);
            }
        }
    }
    if node_ips.is_empty() {
        for ip in host_addresses.iter().filter(|ip| is_global(ip)) {
            if !node_ips.iter().any(|have| IpFamily::of(have) == IpFamily::of(ip)) {
                node_ips.push(*ip);
            }
        }
    }
    node_ips.sort();
    NodeInfo {
        name: name.to_string(),
        primary_ips: node_ips,
        local_addresses: host_addresses.to_vec(),
        zone: node.and_then(|n| n.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned()),
    }
}

/// Taint the cluster autoscaler puts on a node it is about to delete.
const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// kube-proxy's node eligibility for `/healthz`: false while the Node is being deleted (it has a
/// deletion timestamp or the cluster autoscaler's deletion taint), so that load balancers drain
/// it first. A node without a Node object is eligible.
pub fn node_eligible(name: &str, store: &Store) -> bool {
    let Some(node) = store.node(name) else { return true };
    let tainted = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    node.metadata.deletion_timestamp.is_none() && !tainted.into_iter().flatten().any(|t| t.key == TO_BE_DELETED_TAINT)
}

/// Neither loopback, link-local nor unspecified.
fn is_global(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local() && !v6.is_unspecified(),
    }
}

/// Every address configured on the host's interfaces, in interface order, but those of IPVS
/// mode's `kube-ipvs0` (Service addresses, never the node's: as upstream, NodePorts are not
/// served on them).
pub fn host_addresses() -> Vec<IpAddr> {
    addresses_where(|interface| interface != DUMMY_INTERFACE)
}

/// The addresses of one interface (none when it does not exist).
pub fn interface_addresses(name: &str) -> Vec<IpAddr> {
    addresses_where(|interface| interface == name)
}

/// The addresses of the interfaces whose name passes `keep`, in interface order.
fn addresses_where(keep: impl Fn(&str) -> bool) -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    addrs
        .filter(|ifa| keep(&ifa.interface_name))
        .filter_map(|ifa| {
            let addr = ifa.address?;
            if let Some(v4) = addr.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// The host name (default node name, as kube-proxy's).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_cluster::Object;

    fn store(node: serde_json::Value) -> Store {
        Store::from_objects([Object::Node(std::sync::Arc::new(serde_json::from_value(node).unwrap()))])
    }

    #[test]
    fn a_node_being_deleted_is_not_eligible() {
        let healthy = store(serde_json::json!({"metadata": {"name": "n1"}}));
        assert!(node_eligible("n1", &healthy));
        assert!(node_eligible("unknown", &healthy));
        let deleting =
            store(serde_json::json!({"metadata": {"name": "n1", "deletionTimestamp": "2026-11-30T10:00:00Z"}}));
        assert!(!node_eligible("n1", &deleting));
        let tainted = store(serde_json::json!({"metadata": {"name": "n1"},
            "spec": {"taints": [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]}}));
        assert!(!node_eligible("n1", &tainted));
    }

    #[test]
    fn the_addresses_of_kube_ipvs0_are_services_not_the_nodes() {
        // Needs root. A veth of that name stands in for the dummy interface (this host's kernel
        // has no dummy driver): only the name counts.
        let ns = roadkeeper_netlab::Netns::new("rk-ipvs0").unwrap();
        ns.ip_batch(&[
            "link add kube-ipvs0 type veth peer name peer0".into(),
            "addr add 10.96.0.10/32 dev kube-ipvs0".into(),
            "addr add 192.168.5.2/24 dev peer0".into(),
        ])
        .unwrap();
        let (host, ipvs0) = ns.run(|| (host_addresses(), interface_addresses(DUMMY_INTERFACE)));
        let ten: IpAddr = "10.96.0.10".parse().unwrap();
        assert!(!host.contains(&ten) && host.contains(&"192.168.5.2".parse().unwrap()), "{host:?}");
        assert_eq!(ipvs0, [ten]);
    }
}
