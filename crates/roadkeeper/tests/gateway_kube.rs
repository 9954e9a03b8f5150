//! `roadkeeper gateway` fed by a real Kubernetes control plane (built from tests/k8s, in a network
//! namespace) with the Gateway API v1.6.3 CRDs, as the ServiceAccount of deploy/gateway.yaml with
//! only its RBAC: it serves an HTTPRoute on its Gateway's address, and writes the status of the
//! GatewayClass, the Gateway and the route through the `status` subresource, once (no write loop).

mod common;

use std::time::Duration;

use common::apiserver::ControlPlane;
use common::eventually;
use common::gateway::{ADDRESS, API_SETTLE, cluster, start};
use common::web::{exchange, request_head};
use serde_json::Value;

const OBJECTS: &str = "
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: default}
spec:
  gatewayClassName: roadkeeper
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: default}
spec:
  parentRefs: [{name: web}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /app}}]
    backendRefs: [{name: web, port: 80}]
";

/// `kubectl get KIND NAME -o json`.
fn get(api: &ControlPlane, kind: &str, name: &str) -> Value {
    serde_json::from_str(&api.kubectl(&["get", kind, name, "-o", "json"])).expect("JSON")
}

/// `type=status/reason` of each condition of `conditions`.
fn conditions(conditions: &Value) -> Vec<String> {
    let list = conditions.as_array().map(Vec::as_slice).unwrap_or_default();
    list.iter()
        .map(|c| {
            format!(
                "{}={}/{}",
                c["type"].as_str().unwrap(),
                c["status"].as_str().unwrap(),
                c["reason"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn serves_its_routes_and_writes_their_status_with_only_the_deployed_rbac() {
    let (ns, api, kubeconfig) = cluster("rk-gwkube");
    api.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("gateway.log");
    let _gateway = start(&ns, &kubeconfig, &log, &["-v"]);
    let head = request_head("any.example", "/app/x", &[], "close");
    let to = format!("{ADDRESS}:80").parse().unwrap();
    let served = eventually(API_SETTLE, || ns.run(|| exchange(to, None, &head)).is_ok_and(|r| r.served_by() == "web"));
    assert!(
        served,
        "GET /app/x at {ADDRESS} not served by web; log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    let written = || {
        let class = get(&api, "gatewayclass", "roadkeeper");
        let gateway = get(&api, "gateway", "web");
        let route = get(&api, "httproute", "web");
        let addresses = gateway["status"]["addresses"].clone();
        (
            conditions(&class["status"]["conditions"]),
            addresses,
            conditions(&gateway["status"]["conditions"]),
            route["status"]["parents"].clone(),
        )
    };
    let settled = eventually(API_SETTLE, || {
        let (class, addresses, gateway, parents) = written();
        class.contains(&"Accepted=True/Accepted".to_owned())
            && addresses == serde_json::json!([{"type": "IPAddress", "value": ADDRESS}])
            && gateway == ["Accepted=True/Accepted", "Programmed=True/Programmed"]
            && conditions(&parents[0]["conditions"]) == ["Accepted=True/Accepted", "ResolvedRefs=True/ResolvedRefs"]
            && parents[0]["controllerName"] == "roadkeeper.dev/gateway"
    });
    assert!(settled, "status: {:?}; log:\n{}", written(), std::fs::read_to_string(&log).unwrap_or_default());
    let gateway = get(&api, "gateway", "web");
    assert_eq!(gateway["status"]["listeners"][0]["attachedRoutes"], 1);
    let generation = &gateway["metadata"]["generation"];
    assert_eq!(&gateway["status"]["conditions"][0]["observedGeneration"], generation);

    // Written once: our own writes coming back ask for no other.
    let versions = || {
        ["gatewayclass/roadkeeper", "gateway/web", "httproute/web"]
            .map(|object| api.kubectl(&["get", object, "-o", "jsonpath={.metadata.resourceVersion}"]))
    };
    let before = versions();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(versions(), before, "no write loop");
}
