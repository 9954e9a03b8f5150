//! The current objects, indexed for the planners, and incremental updates that track
//! [`Changes`] and keep Pod-derived EndpointSlices up to date.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, ServiceCIDR};

use crate::endpointslices::{derive, selects};
use crate::gateway_api::gatewayclasses::GatewayClass;
use crate::gateway_api::gateways::Gateway;
use crate::gateway_api::grpcroutes::GRPCRoute;
use crate::gateway_api::httproutes::HTTPRoute;
use crate::gateway_api::referencegrants::ReferenceGrant;
use crate::index::{self, Index};
use crate::object::{Kind, ObjectKey};
use crate::validate::SERVICE_NAME_LABEL;
use crate::{Changes, NamespacedName, Object};

const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The current objects: a read-only view used by planners.
#[derive(Debug)]
pub struct Store {
    services: BTreeMap<NamespacedName, Arc<Service>>,
    /// Hand-written EndpointSlices.
    slices: BTreeMap<NamespacedName, Arc<EndpointSlice>>,
    /// Service -> names of its hand-written slices (same namespace).
    slices_by_service: Index<NamespacedName, String>,
    /// Service -> slices derived from Pods; absent when there are none.
    derived: BTreeMap<NamespacedName, Vec<Arc<EndpointSlice>>>,
    pods: BTreeMap<NamespacedName, Arc<Pod>>,
    pods_by_node: Index<String, NamespacedName>,
    nodes: BTreeMap<String, Arc<Node>>,
    service_cidrs: BTreeMap<String, Arc<ServiceCIDR>>,
    namespaces: BTreeMap<String, Arc<Namespace>>,
    ingresses: BTreeMap<NamespacedName, Arc<Ingress>>,
    ingress_classes: BTreeMap<String, Arc<IngressClass>>,
    secrets: BTreeMap<NamespacedName, Arc<Secret>>,
    deployments: BTreeMap<NamespacedName, Arc<Deployment>>,
    config_maps: BTreeMap<NamespacedName, Arc<ConfigMap>>,
    gateway_classes: BTreeMap<String, Arc<GatewayClass>>,
    gateways: BTreeMap<NamespacedName, Arc<Gateway>>,
    http_routes: BTreeMap<NamespacedName, Arc<HTTPRoute>>,
    reference_grants: BTreeMap<NamespacedName, Arc<ReferenceGrant>>,
    grpc_routes: BTreeMap<NamespacedName, Arc<GRPCRoute>>,
    /// Whether EndpointSlices are derived from Pods (a manifest folder has no controller to make
    /// them; an API server has).
    derive_slices: bool,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            slices_by_service: Index::new(),
            derived: BTreeMap::new(),
            pods: BTreeMap::new(),
            pods_by_node: Index::new(),
            nodes: BTreeMap::new(),
            service_cidrs: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            ingresses: BTreeMap::new(),
            ingress_classes: BTreeMap::new(),
            secrets: BTreeMap::new(),
            deployments: BTreeMap::new(),
            config_maps: BTreeMap::new(),
            gateway_classes: BTreeMap::new(),
            gateways: BTreeMap::new(),
            http_routes: BTreeMap::new(),
            reference_grants: BTreeMap::new(),
            grpc_routes: BTreeMap::new(),
            derive_slices: true,
        }
    }
}

/// Effects of a batch of updates, completed by [`Store::finish`].
#[derive(Default)]
pub(crate) struct Batch {
    changes: Changes,
    /// Services whose derived slices must be recomputed.
    recompute: BTreeSet<NamespacedName>,
}

impl Store {
    /// A store holding `objects` (a later object replaces an earlier one with the same identity),
    /// with derived EndpointSlices computed. Handy for tests of planners.
    pub fn from_objects(objects: impl IntoIterator<Item = Object>) -> Self {
        let mut store = Self::default();
        let mut batch = Batch::default();
        for object in objects {
            store.set(&object.key(), Some(&object), &mut batch);
        }
        store.finish(batch);
        store
    }

    /// All Services, ordered by namespace and name.
    pub fn services(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<Service>)> {
        self.services.iter()
    }

    /// One Service.
    pub fn service(&self, key: &NamespacedName) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// The Service's hand-written slices (labelled `kubernetes.io/service-name=<name>` in its
    /// namespace) plus those derived from Pods, sorted by slice name.
    pub fn slices_for(&self, key: &NamespacedName) -> Vec<Arc<EndpointSlice>> {
        let hand_written =
            self.slices_by_service.get(key).into_iter().flatten().filter_map(|name| {
                self.slices.get(&NamespacedName::new(key.namespace.as_str(), name.as_str())).cloned()
            });
        let derived = self.derived.get(key).into_iter().flatten().cloned();
        let mut slices: Vec<_> = hand_written.chain(derived).collect();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        slices
    }

    /// A store that never derives EndpointSlices from Pods: for sources whose slices come from
    /// the real controller.
    pub(crate) fn without_derived_slices() -> Self {
        Self { derive_slices: false, ..Self::default() }
    }

    /// All Pods, ordered by namespace and name.
    pub fn pods(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<Pod>)> {
        self.pods.iter()
    }

    /// Names of all Namespaces.
    pub fn namespaces(&self) -> impl Iterator<Item = &String> {
        self.namespaces.keys()
    }

    /// One Pod.
    pub fn pod(&self, key: &NamespacedName) -> Option<&Arc<Pod>> {
        self.pods.get(key)
    }

    /// The Pods of `namespace`, ordered by name.
    pub fn pods_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = (&'a NamespacedName, &'a Arc<Pod>)> {
        in_namespace(&self.pods, namespace)
    }

    /// All Ingresses, ordered by namespace and name.
    pub fn ingresses(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<Ingress>)> {
        self.ingresses.iter()
    }

    /// One Ingress.
    pub fn ingress(&self, key: &NamespacedName) -> Option<&Arc<Ingress>> {
        self.ingresses.get(key)
    }

    /// All IngressClasses, ordered by name.
    pub fn ingress_classes(&self) -> impl Iterator<Item = &Arc<IngressClass>> {
        self.ingress_classes.values()
    }

    /// All GatewayClasses, ordered by name.
    pub fn gateway_classes(&self) -> impl Iterator<Item = &Arc<GatewayClass>> {
        self.gateway_classes.values()
    }

    /// One GatewayClass.
    pub fn gateway_class(&self, name: &str) -> Option<&Arc<GatewayClass>> {
        self.gateway_classes.get(name)
    }

    /// All Gateways, ordered by namespace and name.
    pub fn gateways(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<Gateway>)> {
        self.gateways.iter()
    }

    /// One Gateway.
    pub fn gateway(&self, key: &NamespacedName) -> Option<&Arc<Gateway>> {
        self.gateways.get(key)
    }

    /// All HTTPRoutes, ordered by namespace and name.
    pub fn http_routes(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<HTTPRoute>)> {
        self.http_routes.iter()
    }

    /// One HTTPRoute.
    pub fn http_route(&self, key: &NamespacedName) -> Option<&Arc<HTTPRoute>> {
        self.http_routes.get(key)
    }

    /// All ReferenceGrants, ordered by namespace and name.
    pub fn reference_grants(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<ReferenceGrant>)> {
        self.reference_grants.iter()
    }

    /// The ReferenceGrants of `namespace` (those that let other namespaces refer to its
    /// objects), ordered by name.
    pub fn reference_grants_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a NamespacedName, &'a Arc<ReferenceGrant>)> {
        in_namespace(&self.reference_grants, namespace)
    }

    /// One ReferenceGrant.
    pub fn reference_grant(&self, key: &NamespacedName) -> Option<&Arc<ReferenceGrant>> {
        self.reference_grants.get(key)
    }

    /// All GRPCRoutes, ordered by namespace and name.
    pub fn grpc_routes(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<GRPCRoute>)> {
        self.grpc_routes.iter()
    }

    /// One GRPCRoute.
    pub fn grpc_route(&self, key: &NamespacedName) -> Option<&Arc<GRPCRoute>> {
        self.grpc_routes.get(key)
    }

    /// One Secret.
    pub fn secret(&self, key: &NamespacedName) -> Option<&Arc<Secret>> {
        self.secrets.get(key)
    }

    /// One Namespace.
    pub fn namespace(&self, name: &str) -> Option<&Arc<Namespace>> {
        self.namespaces.get(name)
    }

    /// Whether Namespace `name` exists.
    pub fn has_namespace(&self, name: &str) -> bool {
        self.namespaces.contains_key(name)
    }

    /// One Node.
    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.get(name)
    }

    /// All Nodes, ordered by name.
    pub fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.values()
    }

    /// All Deployments, ordered by namespace and name.
    pub fn deployments(&self) -> impl Iterator<Item = (&NamespacedName, &Arc<Deployment>)> {
        self.deployments.iter()
    }

    /// The hand-written EndpointSlices (not those derived from Pods), ordered by namespace and
    /// name.
    pub fn endpoint_slices(&self) -> impl Iterator<Item = &Arc<EndpointSlice>> {
        self.slices.values()
    }

    /// All Secrets, ordered by namespace and name.
    pub fn secrets(&self) -> impl Iterator<Item = &Arc<Secret>> {
        self.secrets.values()
    }

    /// One ConfigMap.
    pub fn config_map(&self, key: &NamespacedName) -> Option<&Arc<ConfigMap>> {
        self.config_maps.get(key)
    }

    /// All ServiceCIDRs, ordered by name.
    pub fn service_cidrs(&self) -> impl Iterator<Item = &Arc<ServiceCIDR>> {
        self.service_cidrs.values()
    }

    /// The object `key`, if present (hand-written objects only, not derived slices).
    pub(crate) fn get(&self, key: &ObjectKey) -> Option<Object> {
        let name = &key.name;
        Some(match key.kind {
            Kind::Service => Object::Service(self.services.get(name)?.clone()),
            Kind::EndpointSlice => Object::EndpointSlice(self.slices.get(name)?.clone()),
            Kind::Pod => Object::Pod(self.pods.get(name)?.clone()),
            Kind::Node => Object::Node(self.nodes.get(&name.name)?.clone()),
            Kind::ServiceCidr => Object::ServiceCidr(self.service_cidrs.get(&name.name)?.clone()),
            Kind::Namespace => Object::Namespace(self.namespaces.get(&name.name)?.clone()),
            Kind::Ingress => Object::Ingress(self.ingresses.get(name)?.clone()),
            Kind::IngressClass => Object::IngressClass(self.ingress_classes.get(&name.name)?.clone()),
            Kind::Secret => Object::Secret(self.secrets.get(name)?.clone()),
            Kind::Deployment => Object::Deployment(self.deployments.get(name)?.clone()),
            Kind::ConfigMap => Object::ConfigMap(self.config_maps.get(name)?.clone()),
            Kind::GatewayClass => Object::GatewayClass(self.gateway_classes.get(&name.name)?.clone()),
            Kind::Gateway => Object::Gateway(self.gateways.get(name)?.clone()),
            Kind::HttpRoute => Object::HttpRoute(self.http_routes.get(name)?.clone()),
            Kind::ReferenceGrant => Object::ReferenceGrant(self.reference_grants.get(name)?.clone()),
            Kind::GrpcRoute => Object::GrpcRoute(self.grpc_routes.get(name)?.clone()),
        })
    }

    /// The identities of every object of `kind` (hand-written objects only).
    pub(crate) fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        let cluster_scoped = |name: &String| NamespacedName::new("", name.as_str());
        let names: Vec<NamespacedName> = match kind {
            Kind::Service => self.services.keys().cloned().collect(),
            Kind::EndpointSlice => self.slices.keys().cloned().collect(),
            Kind::Pod => self.pods.keys().cloned().collect(),
            Kind::Node => self.nodes.keys().map(cluster_scoped).collect(),
            Kind::ServiceCidr => self.service_cidrs.keys().map(cluster_scoped).collect(),
            Kind::Namespace => self.namespaces.keys().map(cluster_scoped).collect(),
            Kind::Ingress => self.ingresses.keys().cloned().collect(),
            Kind::IngressClass => self.ingress_classes.keys().map(cluster_scoped).collect(),
            Kind::Secret => self.secrets.keys().cloned().collect(),
            Kind::Deployment => self.deployments.keys().cloned().collect(),
            Kind::ConfigMap => self.config_maps.keys().cloned().collect(),
            Kind::GatewayClass => self.gateway_classes.keys().map(cluster_scoped).collect(),
            Kind::Gateway => self.gateways.keys().cloned().collect(),
            Kind::HttpRoute => self.http_routes.keys().cloned().collect(),
            Kind::ReferenceGrant => self.reference_grants.keys().cloned().collect(),
            Kind::GrpcRoute => self.grpc_routes.keys().cloned().collect(),
        };
        names.into_iter().map(|name| ObjectKey { kind, name }).collect()
    }

    /// Sets (`Some`) or removes (`None`) the object `key`, recording the effects in `batch`.
    pub(crate) fn set(&mut self, key: &ObjectKey, object: Option<&Object>, batch: &mut Batch) {
        let name = &key.name;
        match (key.kind, object) {
            (_, Some(Object::Service(s))) => self.set_service(name, Some(s), batch),
            (_, Some(Object::EndpointSlice(s))) => self.set_slice(name, Some(s), batch),
            (_, Some(Object::Pod(p))) => self.set_pod(name, Some(p), batch),
            (_, Some(Object::Node(n))) => self.set_node(&name.name, Some(n), batch),
            (_, Some(Object::ServiceCidr(c))) => self.set_service_cidr(&name.name, Some(c), batch),
            (_, Some(Object::Namespace(n))) => self.set_namespace(&name.name, Some(n), batch),
            (_, Some(Object::Ingress(i))) => {
                set_keyed(&mut self.ingresses, name, Some(i), &mut batch.changes.ingresses)
            }
            (_, Some(Object::IngressClass(c))) => {
                set_keyed(&mut self.ingress_classes, &name.name, Some(c), &mut batch.changes.ingress_classes)
            }
            (_, Some(Object::Secret(s))) => set_keyed(&mut self.secrets, name, Some(s), &mut batch.changes.secrets),
            (_, Some(Object::Deployment(d))) => {
                set_keyed(&mut self.deployments, name, Some(d), &mut batch.changes.deployments)
            }
            (_, Some(Object::ConfigMap(c))) => {
                set_keyed(&mut self.config_maps, name, Some(c), &mut batch.changes.config_maps)
            }
            (_, Some(Object::GatewayClass(c))) => {
                set_keyed(&mut self.gateway_classes, &name.name, Some(c), &mut batch.changes.gateway_classes)
            }
            (_, Some(Object::Gateway(g))) => set_keyed(&mut self.gateways, name, Some(g), &mut batch.changes.gateways),
            (_, Some(Object::HttpRoute(r))) => {
                set_keyed(&mut self.http_routes, name, Some(r), &mut batch.changes.http_routes)
            }
            (_, Some(Object::ReferenceGrant(g))) => {
                set_keyed(&mut self.reference_grants, name, Some(g), &mut batch.changes.reference_grants)
            }
            (_, Some(Object::GrpcRoute(r))) => {
                set_keyed(&mut self.grpc_routes, name, Some(r), &mut batch.changes.grpc_routes)
            }
            (Kind::Service, None) => self.set_service(name, None, batch),
            (Kind::EndpointSlice, None) => self.set_slice(name, None, batch),
            (Kind::Pod, None) => self.set_pod(name, None, batch),
            (Kind::Node, None) => self.set_node(&name.name, None, batch),
            (Kind::ServiceCidr, None) => self.set_service_cidr(&name.name, None, batch),
            (Kind::Namespace, None) => self.set_namespace(&name.name, None, batch),
            (Kind::Ingress, None) => set_keyed(&mut self.ingresses, name, None, &mut batch.changes.ingresses),
            (Kind::IngressClass, None) => {
                set_keyed(&mut self.ingress_classes, &name.name, None, &mut batch.changes.ingress_classes)
            }
            (Kind::Secret, None) => set_keyed(&mut self.secrets, name, None, &mut batch.changes.secrets),
            (Kind::Deployment, None) => set_keyed(&mut self.deployments, name, None, &mut batch.changes.deployments),
            (Kind::ConfigMap, None) => set_keyed(&mut self.config_maps, name, None, &mut batch.changes.config_maps),
            (Kind::GatewayClass, None) => {
                set_keyed(&mut self.gateway_classes, &name.name, None, &mut batch.changes.gateway_classes)
            }
            (Kind::Gateway, None) => set_keyed(&mut self.gateways, name, None, &mut batch.changes.gateways),
            (Kind::HttpRoute, None) => set_keyed(&mut self.http_routes, name, None, &mut batch.changes.http_routes),
            (Kind::ReferenceGrant, None) => {
                set_keyed(&mut self.reference_grants, name, None, &mut batch.changes.reference_grants)
            }
            (Kind::GrpcRoute, None) => set_keyed(&mut self.grpc_routes, name, None, &mut batch.changes.grpc_routes),
        }
    }

    /// Recomputes derived slices where needed and returns everything the batch changed.
    pub(crate) fn finish(&mut self, batch: Batch) -> Changes {
        let Batch { mut changes, recompute } = batch;
        if !self.derive_slices {
            return changes;
        }
        for key in recompute {
            let new: Vec<EndpointSlice> = match self.services.get(&key) {
                Some(service) => derive(service, in_namespace(&self.pods, &key.namespace).map(|(_, p)| &**p), |node| {
                    self.nodes.get(node)?.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned()
                }),
                None => Vec::new(),
            };
            let old = self.derived.get(&key).map(Vec::as_slice).unwrap_or_default();
            if old.iter().map(|s| &**s).eq(new.iter()) {
                continue;
            }
            changes.services.insert(key.clone());
            changes.endpoint_updates += 1;
            if new.is_empty() {
                self.derived.remove(&key);
            } else {
                self.derived.insert(key, new.into_iter().map(Arc::new).collect());
            }
        }
        changes
    }

    fn set_service(&mut self, key: &NamespacedName, new: Option<&Arc<Service>>, batch: &mut Batch) {
        if replace(&mut self.services, key, new).is_some() {
            batch.changes.services.insert(key.clone());
            batch.changes.service_updates += 1;
            batch.recompute.insert(key.clone());
        }
    }

    fn set_slice(&mut self, key: &NamespacedName, new: Option<&Arc<EndpointSlice>>, batch: &mut Batch) {
        let Some(old) = replace(&mut self.slices, key, new) else {
            return;
        };
        batch.changes.endpoint_updates += 1;
        batch.changes.trigger_times.extend(new.and_then(|s| trigger_time(s)));
        if let Some(service) = old.as_deref().and_then(|s| owning_service(key, s)) {
            index::remove(&mut self.slices_by_service, &service, &key.name);
            batch.changes.services.insert(service);
        }
        if let Some(service) = new.and_then(|s| owning_service(key, s)) {
            index::insert(&mut self.slices_by_service, service.clone(), key.name.clone());
            batch.changes.services.insert(service);
        }
    }

    fn set_pod(&mut self, key: &NamespacedName, new: Option<&Arc<Pod>>, batch: &mut Batch) {
        let Some(old) = replace(&mut self.pods, key, new) else {
            return;
        };
        batch.changes.pods.insert(key.clone());
        let node_of = |pod: &Pod| pod.spec.as_ref()?.node_name.clone();
        if let Some(node) = old.as_deref().and_then(node_of) {
            index::remove(&mut self.pods_by_node, &node, key);
        }
        if let Some(node) = new.and_then(|pod| node_of(pod)) {
            index::insert(&mut self.pods_by_node, node, key.clone());
        }
        for pod in old.as_deref().into_iter().chain(new.map(|p| &**p)) {
            self.recompute_selecting(pod, batch);
        }
    }

    fn set_node(&mut self, name: &str, new: Option<&Arc<Node>>, batch: &mut Batch) {
        if replace(&mut self.nodes, &name.to_owned(), new).is_none() {
            return;
        }
        batch.changes.nodes.insert(name.to_owned());
        // Zones of endpoints on this node may change.
        for pod in self.pods_by_node.get(name).into_iter().flatten().filter_map(|p| self.pods.get(p)) {
            self.recompute_selecting(pod, batch);
        }
    }

    fn set_namespace(&mut self, name: &str, new: Option<&Arc<Namespace>>, batch: &mut Batch) {
        if replace(&mut self.namespaces, &name.to_owned(), new).is_some() {
            batch.changes.namespaces.insert(name.to_owned());
        }
    }

    fn set_service_cidr(&mut self, name: &str, new: Option<&Arc<ServiceCIDR>>, batch: &mut Batch) {
        if replace(&mut self.service_cidrs, &name.to_owned(), new).is_some() {
            batch.changes.service_cidrs = true;
        }
    }

    /// Marks every Service in the Pod's namespace that selects it for recomputation.
    fn recompute_selecting(&self, pod: &Pod, batch: &mut Batch) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let labels = pod.metadata.labels.as_ref();
        let selecting = in_namespace(&self.services, namespace).filter(|(_, s)| selects(s, labels));
        batch.recompute.extend(selecting.map(|(k, _)| k.clone()));
    }
}

/// Sets or removes `map[key]`, noting `key` in `changed` if that changed anything.
fn set_keyed<K: Ord + Clone, T: PartialEq>(
    map: &mut BTreeMap<K, Arc<T>>,
    key: &K,
    new: Option<&Arc<T>>,
    changed: &mut BTreeSet<K>,
) {
    if replace(map, key, new).is_some() {
        changed.insert(key.clone());
    }
}

/// Replaces `map[key]` with `new` unless equal; returns the previous value if anything changed.
fn replace<K: Ord + Clone, T: PartialEq>(
    map: &mut BTreeMap<K, Arc<T>>,
    key: &K,
    new: Option<&Arc<T>>,
) -> Option<Option<Arc<T>>> {
    if map.get(key).map(|v| &**v) == new.map(|v| &**v) {
        return None;
    }
    Some(match new {
        Some(v) => map.insert(key.clone(), Arc::clone(v)),
        None => map.remove(key),
    })
}

/// Entries of `map` in `namespace`.
fn in_namespace<'a, T>(
    map: &'a BTreeMap<NamespacedName, T>,
    namespace: &'a str,
) -> impl Iterator<Item = (&'a NamespacedName, &'a T)> {
    map.range(NamespacedName::new(namespace, "")..).take_while(move |(k, _)| k.namespace == namespace)
}

/// When the change behind this version of the slice happened, if the slice says so (the
/// endpointslice controller sets it, as RFC 3339 in UTC).
fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let value = slice.metadata.annotations.as_ref()?.get(TRIGGER_TIME_ANNOTATION)?;
    humantime::parse_rfc3339(value).ok()
}

/// The Service named by a slice's `kubernetes.io/service-name` label.
fn owning_service(slice_key: &NamespacedName, slice: &EndpointSlice) -> Option<NamespacedName> {
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(NamespacedName::new(slice_key.namespace.as_str(), service.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn object(value: Value) -> Object {
        let kind = value["kind"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "Service" => Object::Service(serde_json::from_value(value).unwrap()),
            "EndpointSlice" => Object::EndpointSlice(serde_json::from_value(value).unwrap()),
            "Pod" => Object::Pod(serde_json::from_value(value).unwrap()),
            "Node" => Object::Node(serde_json::from_value(value).unwrap()),
            "Namespace" => Object::Namespace(serde_json::from_value(value).unwrap()),
            "Ingress" => Object::Ingress(serde_json::from_value(value).unwrap()),
            "IngressClass" => Object::IngressClass(serde_json::from_value(value).unwrap()),
            "Secret" => Object::Secret(serde_json::from_value(value).unwrap()),
            "GatewayClass" => Object::GatewayClass(serde_json::from_value(value).unwrap()),
            "Gateway" => Object::Gateway(serde_json::from_value(value).unwrap()),
            "HTTPRoute" => Object::HttpRoute(serde_json::from_value(value).unwrap()),
            "ReferenceGrant" => Object::ReferenceGrant(serde_json::from_value(value).unwrap()),
            "GRPCRoute" => Object::GrpcRoute(serde_json::from_value(value).unwrap()),
            _ => Object::ServiceCidr(serde_json::from_value(value).unwrap()),
        }
    }

    fn service(name: &str, app: &str) -> Object {
        object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80}]}}))
    }

    fn pod(name: &str, app: &str, node: &str) -> Object {
        object(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": []}, "status": {"podIP": "10.0.0.1"}}),
        )
    }

    fn node(name: &str, zone: &str) -> Object {
        object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {ZONE_LABEL: zone}}}))
    }

    fn slice(name: &str, service: &str) -> Object {
        object(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "ns", "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4", "endpoints": []}))
    }

    fn apply(store: &mut Store, updates: Vec<(Object, bool)>) -> Changes {
        let mut batch = Batch::default();
        for (object, present) in &updates {
            store.set(&object.key(), present.then_some(object), &mut batch);
        }
        store.finish(batch)
    }

    fn nn(name: &str) -> NamespacedName {
        NamespacedName::new("ns", name)
    }

    fn services(names: &[&str]) -> BTreeSet<NamespacedName> {
        names.iter().map(|n| nn(n)).collect()
    }

    #[test]
    fn pod_changes_recompute_only_selecting_services() {
        let mut store = Store::from_objects([service("a", "a"), service("b", "b"), pod("p", "a", "n1")]);
        assert_eq!(store.slices_for(&nn("a")).len(), 1);
        assert!(store.slices_for(&nn("b")).is_empty());

        let changes = apply(&mut store, vec![(pod("p", "b", "n1"), true)]);
        assert_eq!(changes.services, services(&["a", "b"]));
        assert!(store.slices_for(&nn("a")).is_empty());
        assert_eq!(store.slices_for(&nn("b")).len(), 1);

        // Re-applying an identical pod changes nothing; a changed annotation changes no slice.
        assert!(apply(&mut store, vec![(pod("p", "b", "n1"), true)]).is_empty());
        let Object::Pod(mut annotated) = pod("p", "b", "n1") else { unreachable!() };
        Arc::make_mut(&mut annotated).metadata.annotations = Some([("x".to_owned(), "y".to_owned())].into());
        let changes = apply(&mut store, vec![(Object::Pod(annotated.clone()), true)]);
        assert_eq!((changes.services.len(), changes.pods.len()), (0, 1));

        let changes = apply(&mut store, vec![(Object::Pod(annotated), false)]);
        assert_eq!(changes.services, services(&["b"]));
        assert!(store.slices_for(&nn("b")).is_empty());
    }

    #[test]
    fn without_derivation_pods_are_kept_but_make_no_slices() {
        let mut store = Store::without_derived_slices();
        let changes = apply(&mut store, vec![(service("a", "a"), true), (pod("p", "a", "n1"), true)]);
        assert_eq!(changes.pods, [nn("p")].into());
        assert!(store.slices_for(&nn("a")).is_empty());
        assert_eq!(store.pods_in("ns").count(), 1);
        assert!(store.pod(&nn("p")).is_some());
    }

    #[test]
    fn namespaces_are_tracked() {
        let ns = object(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
        let mut store = Store::default();
        assert_eq!(apply(&mut store, vec![(ns.clone(), true)]).namespaces, ["team".to_owned()].into());
        assert!(store.has_namespace("team"));
        apply(&mut store, vec![(ns, false)]);
        assert!(!store.has_namespace("team"));
    }

    #[test]
    fn ingresses_classes_and_secrets_are_tracked() {
        let ingress = object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "ns"}, "spec": {}}));
        let class = object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "roadkeeper"}, "spec": {"controller": "roadkeeper.dev/ingress"}}));
        let secret =
            object(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls", "namespace": "ns"},
            "type": "kubernetes.io/tls"}));
        let mut store = Store::default();
        let changes = apply(&mut store, vec![(ingress.clone(), true), (class, true), (secret, true)]);
        assert_eq!(changes.ingresses, [nn("web")].into());
        assert_eq!(changes.ingress_classes, ["roadkeeper".to_owned()].into());
        assert_eq!(changes.secrets, [nn("tls")].into());
        assert!(store.ingress(&nn("web")).is_some() && store.secret(&nn("tls")).is_some());
        assert_eq!((store.ingresses().count(), store.ingress_classes().count()), (1, 1));
        assert_eq!(apply(&mut store, vec![(ingress, false)]).ingresses, [nn("web")].into());
        assert_eq!(store.ingresses().count(), 0);
    }

    /// A Gateway API object of `kind` named `name` (in `ns` unless a GatewayClass).
    fn gateway_api(kind: &str, name: &str, spec: Value) -> Object {
        let namespace = if kind == "GatewayClass" { None } else { Some("ns") };
        object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}))
    }

    #[test]
    fn gateway_api_objects_are_tracked() {
        let class = gateway_api("GatewayClass", "roadkeeper", json!({"controllerName": "roadkeeper.dev/gateway"}));
        let gateway = gateway_api(
            "Gateway",
            "web",
            json!({"gatewayClassName": "roadkeeper",
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}),
        );
        let route = |port: u16| {
            gateway_api("HTTPRoute", "web", json!({"rules": [{"backendRefs": [{"name": "web", "port": port}]}]}))
        };
        let grant = gateway_api(
            "ReferenceGrant",
            "from-team",
            json!({
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "team"}],
            "to": [{"group": "", "kind": "Service"}]}),
        );
        let grpc =
            gateway_api("GRPCRoute", "api", json!({"rules": [{"backendRefs": [{"name": "api", "port": 9000}]}]}));
        let mut store = Store::default();
        let all = vec![(class.clone(), true), (gateway.clone(), true), (route(80), true), (grant, true), (grpc, true)];
        let changes = apply(&mut store, all);
        let expected = Changes {
            gateway_classes: ["roadkeeper".to_owned()].into(),
            gateways: [nn("web")].into(),
            http_routes: [nn("web")].into(),
            reference_grants: [nn("from-team")].into(),
            grpc_routes: [nn("api")].into(),
            ..Changes::default()
        };
        assert_eq!(changes, expected);
        assert!(store.gateway_class("roadkeeper").is_some() && store.gateway(&nn("web")).is_some());
        assert!(store.reference_grant(&nn("from-team")).is_some() && store.grpc_route(&nn("api")).is_some());
        let counts = |s: &Store| {
            [s.gateway_classes().count(), s.gateways().count(), s.http_routes().count(), s.grpc_routes().count()]
        };
        assert_eq!(counts(&store), [1; 4]);
        assert_eq!((store.reference_grants().count(), store.reference_grants_in("ns").count()), (1, 1));
        assert_eq!(store.reference_grants_in("team").count(), 0);
        // What a relist goes through.
        assert_eq!(store.keys(Kind::GatewayClass), [class.key()]);
        assert_eq!(store.get(&gateway.key()), Some(gateway));

        assert!(apply(&mut store, vec![(route(80), true)]).is_empty());
        let changes = apply(&mut store, vec![(route(81), true)]);
        assert_eq!(changes, Changes { http_routes: [nn("web")].into(), ..Changes::default() });
        let port = |s: &Store| {
            s.http_route(&nn("web")).unwrap().spec.rules.as_ref().unwrap()[0].backend_refs.as_ref().unwrap()[0].port
        };
        assert_eq!(port(&store), Some(81));

        let changes = apply(&mut store, vec![(route(81), false), (class, false)]);
        let expected = Changes {
            gateway_classes: ["roadkeeper".to_owned()].into(),
            http_routes: [nn("web")].into(),
            ..Changes::default()
        };
        assert_eq!(changes, expected);
        assert!(store.http_route(&nn("web")).is_none() && store.gateway_class("roadkeeper").is_none());
        assert_eq!(counts(&store), [0, 1, 0, 1]);
    }

    #[test]
    fn service_changes_and_removal() {
        let mut store = Store::from_objects([pod("p", "a", "n1")]);
        let changes = apply(&mut store, vec![(service("a", "a"), true)]);
        assert_eq!(changes.services, services(&["a"]));
        assert_eq!(store.services().count(), 1);
        assert!(store.service(&nn("a")).is_some());
        assert_eq!(store.slices_for(&nn("a")).len(), 1);
        let changes = apply(&mut store, vec![(service("a", "a"), false)]);
        assert_eq!(changes.services, services(&["a"]));
        assert!(store.slices_for(&nn("a")).is_empty());
        assert!(store.derived.is_empty());
    }

    #[test]
    fn hand_written_slices_report_old_and_new_service() {
        let mut store = Store::from_objects([slice("s1", "a"), slice("s0", "a")]);
        let names: Vec<_> = store.slices_for(&nn("a")).iter().map(|s| s.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["s0", "s1"]);
        let changes = apply(&mut store, vec![(slice("s1", "b"), true)]);
        assert_eq!(changes.services, services(&["a", "b"]));
        assert_eq!(store.slices_for(&nn("a")).len(), 1);
        assert_eq!(store.slices_for(&nn("b")).len(), 1);
        let changes = apply(&mut store, vec![(slice("s0", "a"), false)]);
        assert_eq!(changes.services, services(&["a"]));
        assert_eq!((changes.endpoint_updates, changes.service_updates), (1, 0));
        assert!(!store.slices_by_service.contains_key(&nn("a")));
    }

    #[test]
    fn slice_trigger_times_are_reported() {
        let Object::EndpointSlice(mut s) = slice("s", "a") else { unreachable!() };
        let annotations = [(TRIGGER_TIME_ANNOTATION.to_owned(), "2026-11-30T10:00:00.5Z".to_owned())];
        Arc::make_mut(&mut s).metadata.annotations = Some(annotations.into());
        let changes = apply(&mut Store::default(), vec![(Object::EndpointSlice(s), true), (service("a", "x"), true)]);
        let expected = humantime::parse_rfc3339("2026-11-30T10:00:00.500Z").unwrap();
        assert_eq!(changes.trigger_times, [expected]);
        assert_eq!((changes.endpoint_updates, changes.service_updates), (1, 1));
    }

    #[test]
    fn node_zone_change_updates_derived_slices() {
        let mut store = Store::from_objects([service("a", "a"), pod("p", "a", "n1"), node("n1", "z1")]);
        let zone = |store: &Store| store.slices_for(&nn("a"))[0].endpoints[0].zone.clone();
        assert_eq!(zone(&store).as_deref(), Some("z1"));
        let changes = apply(&mut store, vec![(node("n1", "z2"), true)]);
        assert_eq!(changes.nodes, ["n1".to_owned()].into());
        assert_eq!(changes.services, services(&["a"]));
        assert_eq!(zone(&store).as_deref(), Some("z2"));
        assert!(store.node("n1").is_some());
        let changes = apply(&mut store, vec![(node("n2", "z1"), true)]);
        assert!(changes.services.is_empty());
    }

    #[test]
    fn service_cidrs_set_the_flag() {
        let cidr = object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": "c"}, "spec": {"cidrs": ["10.96.0.0/12"]}}));
        let mut store = Store::default();
        let changes = apply(&mut store, vec![(cidr.clone(), true)]);
        assert_eq!(changes, Changes { service_cidrs: true, ..Changes::default() });
        assert_eq!(store.service_cidrs().count(), 1);
        assert!(apply(&mut store, vec![(cidr, false)]).service_cidrs);
        assert_eq!(store.service_cidrs().count(), 0);
    }
}
