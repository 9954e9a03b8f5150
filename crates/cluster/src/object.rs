//! The supported object kinds and their identities.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, ServiceCIDR};

use crate::NamespacedName;
use crate::gateway_api::gatewayclasses::GatewayClass;
use crate::gateway_api::gateways::Gateway;
use crate::gateway_api::grpcroutes::GRPCRoute;
use crate::gateway_api::httproutes::HTTPRoute;
use crate::gateway_api::referencegrants::ReferenceGrant;

/// One supported Kubernetes object. Shared (`Arc`) so that the source's per-file bookkeeping and
/// the store hold one copy between them.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// `v1 Service`.
    Service(Arc<Service>),
    /// `discovery.k8s.io/v1 EndpointSlice`.
    EndpointSlice(Arc<EndpointSlice>),
    /// `v1 Pod`.
    Pod(Arc<Pod>),
    /// `v1 Node`.
    Node(Arc<Node>),
    /// `networking.k8s.io/v1 ServiceCIDR`.
    ServiceCidr(Arc<ServiceCIDR>),
    /// `v1 Namespace`.
    Namespace(Arc<Namespace>),
    /// `networking.k8s.io/v1 Ingress`.
    Ingress(Arc<Ingress>),
    /// `networking.k8s.io/v1 IngressClass`.
    IngressClass(Arc<IngressClass>),
    /// `v1 Secret`.
    Secret(Arc<Secret>),
    /// `apps/v1 Deployment` (read by the lab, which runs its pods).
    Deployment(Arc<Deployment>),
    /// `v1 ConfigMap` (read by the lab, which mounts them as files).
    ConfigMap(Arc<ConfigMap>),
    /// `gateway.networking.k8s.io/v1 GatewayClass`.
    GatewayClass(Arc<GatewayClass>),
    /// `gateway.networking.k8s.io/v1 Gateway`.
    Gateway(Arc<Gateway>),
    /// `gateway.networking.k8s.io/v1 HTTPRoute`.
    HttpRoute(Arc<HTTPRoute>),
    /// `gateway.networking.k8s.io/v1 ReferenceGrant`.
    ReferenceGrant(Arc<ReferenceGrant>),
    /// `gateway.networking.k8s.io/v1 GRPCRoute`.
    GrpcRoute(Arc<GRPCRoute>),
}

/// The `apiVersion` of the Gateway API kinds read.
const GATEWAY_API_V1: &str = "gateway.networking.k8s.io/v1";

/// kubectl's annotation holding a copy of the whole object as last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what the API server and kubectl add to an object that nothing here reads and that
/// costs memory at scale: the field-ownership records (`metadata.managedFields`; an
/// EndpointSlice's name every endpoint again) and kubectl's `last-applied-configuration`
/// annotation (a JSON copy of the object). Done to every object on arrival, from the API server
/// or from manifests.
pub(crate) fn slim<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

impl Object {
    /// The object's identity; namespaced kinds without a namespace are in `default`.
    pub(crate) fn key(&self) -> ObjectKey {
        let (kind, metadata) = match self {
            Self::Service(o) => (Kind::Service, &o.metadata),
            Self::EndpointSlice(o) => (Kind::EndpointSlice, &o.metadata),
            Self::Pod(o) => (Kind::Pod, &o.metadata),
            Self::Node(o) => (Kind::Node, &o.metadata),
            Self::ServiceCidr(o) => (Kind::ServiceCidr, &o.metadata),
            Self::Namespace(o) => (Kind::Namespace, &o.metadata),
            Self::Ingress(o) => (Kind::Ingress, &o.metadata),
            Self::IngressClass(o) => (Kind::IngressClass, &o.metadata),
            Self::Secret(o) => (Kind::Secret, &o.metadata),
            Self::Deployment(o) => (Kind::Deployment, &o.metadata),
            Self::ConfigMap(o) => (Kind::ConfigMap, &o.metadata),
            Self::GatewayClass(o) => (Kind::GatewayClass, &o.metadata),
            Self::Gateway(o) => (Kind::Gateway, &o.metadata),
            Self::HttpRoute(o) => (Kind::HttpRoute, &o.metadata),
            Self::ReferenceGrant(o) => (Kind::ReferenceGrant, &o.metadata),
            Self::GrpcRoute(o) => (Kind::GrpcRoute, &o.metadata),
        };
        let namespace = match &metadata.namespace {
            _ if !kind.namespaced() => "",
            Some(ns) => ns,
            None => "default",
        };
        let name = metadata.name.as_deref().unwrap_or_default();
        ObjectKey { kind, name: NamespacedName::new(namespace, name) }
    }
}

macro_rules! object_from {
    ($($variant:ident($type:ty)),*) => {$(
        impl From<Arc<$type>> for Object {
            fn from(object: Arc<$type>) -> Self {
                Self::$variant(object)
            }
        }
    )*};
}
object_from!(
    Service(Service),
    EndpointSlice(EndpointSlice),
    Pod(Pod),
    Node(Node),
    ServiceCidr(ServiceCIDR),
    Namespace(Namespace),
    Ingress(Ingress),
    IngressClass(IngressClass),
    Secret(Secret),
    Deployment(Deployment),
    ConfigMap(ConfigMap),
    GatewayClass(GatewayClass),
    Gateway(Gateway),
    HttpRoute(HTTPRoute),
    ReferenceGrant(ReferenceGrant),
    GrpcRoute(GRPCRoute)
);

/// The kind of an [`Object`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1 Service`.
    Service,
    /// `discovery.k8s.io/v1 EndpointSlice`.
    EndpointSlice,
    /// `v1 Pod`.
    Pod,
    /// `v1 Node`.
    Node,
    /// `networking.k8s.io/v1 ServiceCIDR`.
    ServiceCidr,
    /// `v1 Namespace`.
    Namespace,
    /// `networking.k8s.io/v1 Ingress`.
    Ingress,
    /// `networking.k8s.io/v1 IngressClass`.
    IngressClass,
    /// `v1 Secret`.
    Secret,
    /// `apps/v1 Deployment`.
    Deployment,
    /// `v1 ConfigMap`.
    ConfigMap,
    /// `gateway.networking.k8s.io/v1 GatewayClass`.
    GatewayClass,
    /// `gateway.networking.k8s.io/v1 Gateway`.
    Gateway,
    /// `gateway.networking.k8s.io/v1 HTTPRoute`.
    HttpRoute,
    /// `gateway.networking.k8s.io/v1 ReferenceGrant`.
    ReferenceGrant,
    /// `gateway.networking.k8s.io/v1 GRPCRoute`.
    GrpcRoute,
}

impl Kind {
    /// The kind for an `apiVersion` and `kind` pair, if supported.
    pub(crate) fn from_type(api_version: &str, kind: &str) -> Option<Self> {
        Some(match (api_version, kind) {
            ("v1", "Service") => Self::Service,
            ("discovery.k8s.io/v1", "EndpointSlice") => Self::EndpointSlice,
            ("v1", "Pod") => Self::Pod,
            ("v1", "Node") => Self::Node,
            ("networking.k8s.io/v1", "ServiceCIDR") => Self::ServiceCidr,
            ("v1", "Namespace") => Self::Namespace,
            ("networking.k8s.io/v1", "Ingress") => Self::Ingress,
            ("networking.k8s.io/v1", "IngressClass") => Self::IngressClass,
            ("v1", "Secret") => Self::Secret,
            ("apps/v1", "Deployment") => Self::Deployment,
            ("v1", "ConfigMap") => Self::ConfigMap,
            (GATEWAY_API_V1, "GatewayClass") => Self::GatewayClass,
            (GATEWAY_API_V1, "Gateway") => Self::Gateway,
            (GATEWAY_API_V1, "HTTPRoute") => Self::HttpRoute,
            (GATEWAY_API_V1, "ReferenceGrant") => Self::ReferenceGrant,
            (GATEWAY_API_V1, "GRPCRoute") => Self::GrpcRoute,
            _ => return None,
        })
    }

    /// Whether objects of this kind live in a namespace.
    pub(crate) fn namespaced(self) -> bool {
        !matches!(self, Self::Node | Self::ServiceCidr | Self::Namespace | Self::IngressClass | Self::GatewayClass)
    }

    /// The kind's name, as in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Pod => "Pod",
            Self::Node => "Node",
            Self::ServiceCidr => "ServiceCIDR",
            Self::Namespace => "Namespace",
            Self::Ingress => "Ingress",
            Self::IngressClass => "IngressClass",
            Self::Secret => "Secret",
            Self::Deployment => "Deployment",
            Self::ConfigMap => "ConfigMap",
            Self::GatewayClass => "GatewayClass",
            Self::Gateway => "Gateway",
            Self::HttpRoute => "HTTPRoute",
            Self::ReferenceGrant => "ReferenceGrant",
            Self::GrpcRoute => "GRPCRoute",
        }
    }
}

/// Identity of an object: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectKey {
    pub kind: Kind,
    pub name: NamespacedName,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind.namespaced() {
            write!(f, "{} {}", self.kind.as_str(), self.name)
        } else {
            write!(f, "{} {}", self.kind.as_str(), self.name.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slimming_drops_managed_fields_and_the_last_applied_copy_only() {
        let mut svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web", "namespace": "default",
                "annotations": {LAST_APPLIED: "{\"kind\":\"Service\"}", "service.kubernetes.io/topology-mode": "Auto"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {"f:ports": {}}}}],
            },
            "spec": {"clusterIP": "10.96.0.1"},
        }))
        .unwrap();
        slim(&mut svc);
        assert_eq!(svc.metadata.managed_fields, None);
        let annotations = svc.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["service.kubernetes.io/topology-mode"]);
        assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.1"));
        let mut only_last_applied: Service =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "a", "annotations": {LAST_APPLIED: "{}"}}}))
                .unwrap();
        slim(&mut only_last_applied);
        assert_eq!(only_last_applied.metadata.annotations, None);
    }

    #[test]
    fn kinds_and_keys() {
        assert_eq!(Kind::from_type("v1", "Service"), Some(Kind::Service));
        assert_eq!(Kind::from_type("discovery.k8s.io/v1beta1", "EndpointSlice"), None);
        assert_eq!(Kind::from_type("networking.k8s.io/v1", "ServiceCIDR"), Some(Kind::ServiceCidr));
        let svc = ObjectKey { kind: Kind::Service, name: NamespacedName::new("default", "hello") };
        assert_eq!(svc.to_string(), "Service default/hello");
        let node = ObjectKey { kind: Kind::Node, name: NamespacedName::new("", "n1") };
        assert_eq!(node.to_string(), "Node n1");
        let mut service = Service::default();
        service.metadata.name = Some("hello".into());
        assert_eq!(Object::Service(service.into()).key(), svc);
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.namespace = Some("x".into());
        assert_eq!(Object::Node(n.into()).key(), node);
    }

    #[test]
    fn gateway_api_kinds_and_keys() {
        let kinds = [
            ("GatewayClass", Kind::GatewayClass, false),
            ("Gateway", Kind::Gateway, true),
            ("HTTPRoute", Kind::HttpRoute, true),
            ("ReferenceGrant", Kind::ReferenceGrant, true),
            ("GRPCRoute", Kind::GrpcRoute, true),
        ];
        for (name, kind, namespaced) in kinds {
            assert_eq!(Kind::from_type("gateway.networking.k8s.io/v1", name), Some(kind));
            assert_eq!(Kind::from_type("gateway.networking.k8s.io/v1beta1", name), None);
            assert_eq!((kind.as_str(), kind.namespaced()), (name, namespaced));
        }
        let mut route = HTTPRoute::default();
        route.metadata.name = Some("web".into());
        let key = Object::HttpRoute(route.into()).key();
        assert_eq!(key.to_string(), "HTTPRoute default/web");
        let mut class = GatewayClass::default();
        class.metadata.name = Some("roadkeeper".into());
        class.metadata.namespace = Some("x".into());
        assert_eq!(Object::GatewayClass(class.into()).key().to_string(), "GatewayClass roadkeeper");
    }
}
