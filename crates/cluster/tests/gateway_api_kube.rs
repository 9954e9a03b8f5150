//! The Gateway API kinds from a real kube-apiserver (the control plane of roadkeeper's
//! end-to-end tests, built by `tests/k8s/build.sh`): a feed opens while their CRDs are not
//! installed, and their objects arrive through [`Feed::changed`] once they are.

#[allow(dead_code)] // the harness of roadkeeper's tests; this test uses part of it
#[path = "../../roadkeeper/tests/common/apiserver.rs"]
mod apiserver;

use std::time::Duration;

use apiserver::ControlPlane;
use roadkeeper_cluster::{Changes, Feed, Interest, Kind, NamespacedName, SourceSpec};

/// The release whose standard-channel CRDs are installed, as in `src/gateway_api/generate.sh`.
const GATEWAY_API: &str = "sigs.k8s.io/gateway-api@v1.6.3";
/// The CRDs of the kinds the feed reads, by plural.
const CRDS: [&str; 5] = ["gatewayclasses", "gateways", "httproutes", "referencegrants", "grpcroutes"];
/// How long the feed may take: a watcher retries a kind that is not served with a backoff of up
/// to 30 s.
const WITHIN: Duration = Duration::from_secs(120);

const OBJECTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: roadkeeper}
spec: {controllerName: roadkeeper.dev/gateway}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web}
spec:
  gatewayClassName: roadkeeper
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{name: web}]
  hostnames: [web.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /app}}]
    backendRefs: [{name: web, port: 8080}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_objects_arrive_once_their_crds_are_installed() {
    let cp = ControlPlane::start(None);
    let spec = SourceSpec::Kubernetes(Some(cp.admin_kubeconfig().to_owned()));
    let kinds =
        [Kind::Service, Kind::GatewayClass, Kind::Gateway, Kind::HttpRoute, Kind::ReferenceGrant, Kind::GrpcRoute];
    let interest = Interest { kinds: kinds.into(), node: None };
    let opened = tokio::time::timeout(WITHIN, Feed::open(&spec, &interest, true)).await;
    let mut feed = opened.expect("the feed waits for kinds that are not served").expect("the feed opens");
    assert!(feed.store().service(&NamespacedName::new("default", "kubernetes")).is_some(), "Services are listed");
    assert_eq!((feed.store().gateway_classes().count(), feed.store().gateways().count()), (0, 0));

    cp.install_gateway_api_crds(GATEWAY_API, &CRDS);
    cp.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);
    let changes = changes_until(&mut feed, |c| {
        !c.gateway_classes.is_empty() && !c.gateways.is_empty() && !c.http_routes.is_empty()
    })
    .await;
    let web = NamespacedName::new("default", "web");
    assert_eq!(changes.gateway_classes, ["roadkeeper".to_owned()].into());
    assert_eq!((&changes.gateways, &changes.http_routes), (&[web.clone()].into(), &[web.clone()].into()));
    assert!(changes.reference_grants.is_empty() && changes.grpc_routes.is_empty());

    let store = feed.store();
    let class = store.gateway_class("roadkeeper").expect("the GatewayClass");
    assert_eq!(class.spec.controller_name, "roadkeeper.dev/gateway");
    let gateway = store.gateway(&web).expect("the Gateway");
    assert_eq!((gateway.spec.listeners[0].name.as_str(), gateway.spec.listeners[0].port), ("http", 80));
    let route = store.http_route(&web).expect("the HTTPRoute");
    let rule = &route.spec.rules.as_ref().expect("rules")[0];
    let backend = &rule.backend_refs.as_ref().expect("backendRefs")[0];
    assert_eq!((backend.name.as_str(), backend.port), ("web", Some(8080)));
    // The API server applied the CRD's defaults.
    let parent = &route.spec.parent_refs.as_ref().expect("parentRefs")[0];
    assert_eq!(parent.kind.as_deref(), Some("Gateway"));

    cp.kubectl(&["delete", "httproute", "web"]);
    let changes = changes_until(&mut feed, |c| !c.http_routes.is_empty()).await;
    assert_eq!(changes.http_routes, [web.clone()].into());
    assert!(feed.store().http_route(&web).is_none() && feed.store().gateway(&web).is_some());
}

/// The changes the feed reports, merged, until `done` holds for them; panics after [`WITHIN`].
async fn changes_until(feed: &mut Feed, done: impl Fn(&Changes) -> bool) -> Changes {
    let mut changes = Changes::default();
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !done(&changes) {
        match tokio::time::timeout_at(deadline, feed.changed()).await {
            Ok(more) => changes.merge(more),
            Err(_) => panic!("after {WITHIN:?} the feed reported only {changes:?}"),
        }
    }
    changes
}
