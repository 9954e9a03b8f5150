//! `roadkeeper gateway`: writing the status of our GatewayClasses, Gateways and HTTPRoutes
//! (thin). What to write is decided by `roadkeeper_ingress::gateway::status` (pure) against the
//! status the store holds; writes go to the `status` subresource from a background task, so that
//! route updates never wait on the API. With `--manifests` they are logged instead.

use std::fmt;

use roadkeeper_cluster::gateway_api::gatewayclasses::GatewayClass;
use roadkeeper_cluster::gateway_api::gateways::Gateway;
use roadkeeper_cluster::gateway_api::httproutes::HTTPRoute;
use roadkeeper_cluster::kube::api::{Api, Patch, PatchParams};
use roadkeeper_cluster::kube::{self, Client};
use roadkeeper_cluster::{NamespacedName, SourceSpec, Store};
use roadkeeper_ingress::gateway::status::RouteStatus;
use roadkeeper_ingress::gateway::status::{class_patch, gateway_patch, route_patch};
use roadkeeper_ingress::gateway::{Statuses, Touched};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::status_writer;

/// The conformance features we claim on our GatewayClasses (`status.supportedFeatures`): the
/// GATEWAY-HTTP profile's core features and the extended ones whose tests pass
/// (`tests/node/gateway-conformance.sh`, report in `docs/gateway-conformance-report.yaml`).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "ReferenceGrant",
    "GatewayHTTPListenerIsolation",
    "GatewayPort8080",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
];

/// An object whose status we write.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Object {
    Class(String),
    Gateway(NamespacedName),
    Route(NamespacedName),
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Class(name) => write!(f, "GatewayClass {name}"),
            Self::Gateway(key) => write!(f, "Gateway {key}"),
            Self::Route(key) => write!(f, "HTTPRoute {key}"),
        }
    }
}

/// Keeps the statuses of our objects equal to what the compiled state says.
pub struct StatusPublisher {
    controller: String,
    /// The writer task's queue; `None` when the cluster state comes from manifests (log only).
    writes: Option<mpsc::UnboundedSender<(Object, Value)>>,
}

impl StatusPublisher {
    /// A publisher to the cluster of `spec`: with an API server, connects a client as the
    /// [`Feed`](roadkeeper_cluster::Feed) of `spec` does and starts the writer task on the
    /// current tokio runtime.
    pub async fn start(controller: &str, spec: &SourceSpec) -> anyhow::Result<Self> {
        let writes = match spec {
            SourceSpec::Manifests(_) => None,
            SourceSpec::Kubernetes(kubeconfig) => {
                let client = roadkeeper_cluster::client(kubeconfig.as_deref()).await?;
                let (writes, queue) = mpsc::unbounded_channel();
                tokio::spawn(status_writer::run("status", queue, move |object, patch| {
                    write(client.clone(), object, patch)
                }));
                Some(writes)
            }
        };
        Ok(Self { controller: controller.to_owned(), writes })
    }

    /// Publishes what `statuses` says of the `touched` objects, where the store's status
    /// differs: HTTPRoutes no longer attached to a Gateway of ours lose the parent entries we wrote.
    pub fn publish(&self, store: &Store, statuses: &Statuses, touched: &Touched) {
        let now = roadkeeper_cluster::k8s_openapi::jiff::Timestamp::now()
            .round(jiff_seconds())
            .unwrap_or_default()
            .to_string();
        for name in &touched.classes {
            let (Some(generation), Some(class)) = (statuses.classes.get(name), store.gateway_class(name)) else {
                continue;
            };
            if let Some(patch) = class_patch(*generation, status_of(&class.status).as_ref(), SUPPORTED_FEATURES, &now) {
                self.send(Object::Class(name.clone()), patch);
            }
        }
        for key in &touched.gateways {
            let (Some(status), Some(gateway)) = (statuses.gateways.get(key), store.gateway(key)) else { continue };
            if let Some(patch) = gateway_patch(status, status_of(&gateway.status).as_ref(), &now) {
                self.send(Object::Gateway(key.clone()), patch);
            }
        }
        let detached = RouteStatus::default();
        for key in &touched.routes {
            let Some(route) = store.http_route(key) else { continue };
            let status = statuses.routes.get(key).unwrap_or(&detached);
            if let Some(patch) = route_patch(status, &self.controller, status_of(&route.status).as_ref(), &now) {
                self.send(Object::Route(key.clone()), patch);
            }
        }
    }

    fn send(&self, object: Object, patch: Value) {
        let Some(writes) = &self.writes else {
            tracing::info!("{object}: {patch} (not written: the cluster state comes from --manifests)");
            return;
        };
        if let Err(lost) = writes.send((object, patch)) {
            tracing::error!("{}: the status writer has stopped; status not written", (lost.0).0);
        }
    }
}

/// Whole seconds, as `metav1.Time` is written.
fn jiff_seconds() -> roadkeeper_cluster::k8s_openapi::jiff::Unit {
    roadkeeper_cluster::k8s_openapi::jiff::Unit::Second
}

/// An object's `status` as JSON.
fn status_of<T: Serialize>(status: &Option<T>) -> Option<Value> {
    status.as_ref().and_then(|status| serde_json::to_value(status).ok())
}

/// A merge patch of `object`'s status through the `status` subresource.
async fn write(client: Client, object: Object, patch: Value) -> Result<(), kube::Error> {
    let params = PatchParams::default();
    let patch = Patch::Merge(&patch);
    match &object {
        Object::Class(name) => Api::<GatewayClass>::all(client).patch_status(name, &params, &patch).await.map(drop),
        Object::Gateway(key) => {
            Api::<Gateway>::namespaced(client, &key.namespace).patch_status(&key.name, &params, &patch).await.map(drop)
        }
        Object::Route(key) => Api::<HTTPRoute>::namespaced(client, &key.namespace)
            .patch_status(&key.name, &params, &patch)
            .await
            .map(drop),
    }
}
