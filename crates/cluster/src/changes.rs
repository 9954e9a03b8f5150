//! What a (re)load changed.

use std::collections::BTreeSet;
use std::time::SystemTime;

use crate::NamespacedName;

/// Result of a (re)load: which Services must be re-planned, plus node/CIDR change flags.
///
/// A Service is listed when the Service itself or any of its EndpointSlices (hand-written or
/// derived from Pods) changed.
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Changes {
    /// Services whose object or EndpointSlices changed (including removals).
    pub services: BTreeSet<NamespacedName>,
    /// Names of Nodes that were added, changed or removed.
    pub nodes: BTreeSet<String>,
    /// Whether any ServiceCIDR was added, changed or removed.
    pub service_cidrs: bool,
    /// Pods added, changed or removed.
    pub pods: BTreeSet<NamespacedName>,
    /// Names of Namespaces added, changed or removed.
    pub namespaces: BTreeSet<String>,
    /// Ingresses added, changed or removed.
    pub ingresses: BTreeSet<NamespacedName>,
    /// Names of IngressClasses added, changed or removed.
    pub ingress_classes: BTreeSet<String>,
    /// Secrets added, changed or removed.
    pub secrets: BTreeSet<NamespacedName>,
    /// Deployments added, changed or removed.
    pub deployments: BTreeSet<NamespacedName>,
    /// ConfigMaps added, changed or removed.
    pub config_maps: BTreeSet<NamespacedName>,
    /// Names of GatewayClasses added, changed or removed.
    pub gateway_classes: BTreeSet<String>,
    /// Gateways added, changed or removed.
    pub gateways: BTreeSet<NamespacedName>,
    /// HTTPRoutes added, changed or removed.
    pub http_routes: BTreeSet<NamespacedName>,
    /// ReferenceGrants added, changed or removed.
    pub reference_grants: BTreeSet<NamespacedName>,
    /// GRPCRoutes added, changed or removed.
    pub grpc_routes: BTreeSet<NamespacedName>,
    /// Service objects added, changed or removed (kube-proxy's "service changes").
    pub service_updates: usize,
    /// EndpointSlices added, changed or removed, derived ones counted once per Service
    /// (kube-proxy's "endpoint changes").
    pub endpoint_updates: usize,
    /// The `endpoints.kubernetes.io/last-change-trigger-time` of each changed EndpointSlice that
    /// has it: when the change that led to it happened, for network programming latency.
    pub trigger_times: Vec<SystemTime>,
}

impl Changes {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.nodes.is_empty()
            && !self.service_cidrs
            && self.pods.is_empty()
            && self.namespaces.is_empty()
            && self.ingresses.is_empty()
            && self.ingress_classes.is_empty()
            && self.secrets.is_empty()
            && self.deployments.is_empty()
            && self.config_maps.is_empty()
            && self.gateway_classes.is_empty()
            && self.gateways.is_empty()
            && self.http_routes.is_empty()
            && self.reference_grants.is_empty()
            && self.grpc_routes.is_empty()
    }

    /// Adds everything in `other` to `self`.
    pub fn merge(&mut self, other: Changes) {
        self.services.extend(other.services);
        self.nodes.extend(other.nodes);
        self.service_cidrs |= other.service_cidrs;
        self.pods.extend(other.pods);
        self.namespaces.extend(other.namespaces);
        self.ingresses.extend(other.ingresses);
        self.ingress_classes.extend(other.ingress_classes);
        self.secrets.extend(other.secrets);
        self.deployments.extend(other.deployments);
        self.config_maps.extend(other.config_maps);
        self.gateway_classes.extend(other.gateway_classes);
        self.gateways.extend(other.gateways);
        self.http_routes.extend(other.http_routes);
        self.reference_grants.extend(other.reference_grants);
        self.grpc_routes.extend(other.grpc_routes);
        self.service_updates += other.service_updates;
        self.endpoint_updates += other.endpoint_updates;
        self.trigger_times.extend(other.trigger_times);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_unions_and_is_empty() {
        let mut a = Changes::default();
        assert!(a.is_empty());
        let mut b = Changes::default();
        b.services.insert(NamespacedName::new("default", "hello"));
        b.nodes.insert("n1".into());
        b.pods.insert(NamespacedName::new("default", "p"));
        b.namespaces.insert("default".into());
        a.merge(b.clone());
        a.merge(Changes { service_cidrs: true, endpoint_updates: 2, ..Changes::default() });
        a.merge(Changes { endpoint_updates: 1, trigger_times: vec![SystemTime::UNIX_EPOCH], ..Changes::default() });
        assert!(!a.is_empty());
        assert_eq!(a.services, b.services);
        assert_eq!(a.nodes, b.nodes);
        assert_eq!((&a.pods, &a.namespaces), (&b.pods, &b.namespaces));
        assert!(a.service_cidrs);
        assert_eq!((a.endpoint_updates, a.trigger_times.len()), (3, 1));
    }

    #[test]
    fn gateway_api_changes_count_and_merge() {
        let web = || [NamespacedName::new("default", "web")].into();
        let each = [
            Changes { gateway_classes: ["roadkeeper".to_owned()].into(), ..Changes::default() },
            Changes { gateways: web(), ..Changes::default() },
            Changes { http_routes: web(), ..Changes::default() },
            Changes { reference_grants: web(), ..Changes::default() },
            Changes { grpc_routes: web(), ..Changes::default() },
        ];
        let mut all = Changes::default();
        for changes in each {
            assert!(!changes.is_empty(), "{changes:?}");
            all.merge(changes);
        }
        assert_eq!(all.gateway_classes, ["roadkeeper".to_owned()].into());
        let merged = [&all.gateways, &all.http_routes, &all.reference_grants, &all.grpc_routes];
        assert_eq!(merged, [&web(); 4]);
    }
}
