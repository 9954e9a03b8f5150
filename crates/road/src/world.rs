//! What a road is computed from: the cluster state, each node's identity and proxy flags, and
//! where the request starts.

use std::net::IpAddr;

use roadkeeper_cluster::{NamespacedName, Store};
use roadkeeper_ingress::routes::ClassConfig;
use roadkeeper_rules::config::ProxyConfig;
use roadkeeper_rules::table::NodeInfo;

/// A node and the flags its `roadkeeper proxy` runs with.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its identity, as the proxy works it out (name, primary and local addresses, zone).
    pub info: NodeInfo,
    /// Its proxy's configuration (backend, cluster CIDR, masquerade flags, ...).
    pub cfg: ProxyConfig,
}

/// Where a request starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A pod (its packets are received by its node; it resolves names through the cluster DNS
    /// with the usual search path).
    Pod(NamespacedName),
    /// A node's own network (its packets are sent by a host process).
    Node(String),
    /// A host outside the cluster at `address` (its packets are received by a node).
    Outside {
        /// Its name (`client`, `internet`).
        name: String,
        /// Its address.
        address: IpAddr,
    },
}

/// Everything a road is computed from.
#[derive(Debug, Clone)]
pub struct World<'a> {
    /// The cluster state: Services, EndpointSlices, Pods, Nodes, Ingresses, IngressClasses.
    pub store: &'a Store,
    /// The nodes whose rules can be traced.
    pub nodes: Vec<Node>,
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
    /// The Service in front of the Ingress controller (`kube-system/roadkeeper-ingress`).
    pub ingress_service: NamespacedName,
    /// The Ingress controller's class.
    pub ingress_class: ClassConfig,
    /// Whether hosts outside the cluster and nodes resolve the hosts of Ingress rules to the
    /// Ingress's address (the lab, standing in for the DNS records a user makes for them).
    pub ingress_dns: bool,
}

impl World<'_> {
    /// The node `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|node| node.info.name == name)
    }

    /// The pod with address `ip`, and its node.
    pub fn pod_at(&self, ip: IpAddr) -> Option<(NamespacedName, Option<String>)> {
        self.store.pods().find_map(|(key, pod)| {
            let status = pod.status.as_ref()?;
            let mut ips = status.pod_ip.iter().chain(status.pod_ips.iter().flatten().map(|p| &p.ip));
            ips.any(|a| a.parse() == Ok(ip)).then(|| (key.clone(), pod.spec.as_ref().and_then(|s| s.node_name.clone())))
        })
    }
}
