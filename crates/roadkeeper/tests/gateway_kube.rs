//! `roadkeeper gateway` fed by a real Kubernetes control plane (built from tests/k8s, in a network
//! namespace) with the Gateway API v1.6.3 CRDs, as the ServiceAccount of deploy/gateway.yaml with
//! only its RBAC: it serves an HTTPRoute on its Gateway's address, and writes the status of the
//! GatewayClass, the Gateway and the route through the `status` subresource, once (no write loop);
//! the address its Gateway holds is refused to another tenant's Gateway that asks for it, and
//! stays held across a restart (the status is the memory).

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
    get_in(api, "default", kind, name)
}

/// [`get`] in `namespace`.
fn get_in(api: &ControlPlane, namespace: &str, kind: &str, name: &str) -> Value {
    serde_json::from_str(&api.kubectl(&["-n", namespace, "get", kind, name, "-o", "json"])).expect("JSON")
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

/// Tenant B's namespace and its Gateway asking for [`ADDRESS`].
fn tenant_b() -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: tenant-b}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: tenant-b}}\n\
         spec:\n  gatewayClassName: roadkeeper\n  addresses: [{{type: IPAddress, value: {ADDRESS}}}]\n\
         \x20 listeners: [{{name: http, port: 80, protocol: HTTP}}]\n"
    )
}

#[test]
fn an_address_held_is_refused_to_another_tenant_and_stays_held_across_a_restart() {
    let (ns, api, kubeconfig) = cluster("rk-gwheld");
    api.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("gateway.log");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let gateway = start(&ns, &kubeconfig, &log, &[]);
    let head = request_head("any.example", "/app/x", &[], "close");
    let to = format!("{ADDRESS}:80").parse().unwrap();
    let served_by_web = || ns.run(|| exchange(to, None, &head)).is_ok_and(|r| r.served_by() == "web");
    let status = |namespace: &str| {
        let gateway = get_in(&api, namespace, "gateway", "web");
        (gateway["status"]["addresses"].clone(), conditions(&gateway["status"]["conditions"]))
    };
    let holds = || {
        let (addresses, conditions) = status("default");
        addresses == serde_json::json!([{"type": "IPAddress", "value": ADDRESS}])
            && conditions == ["Accepted=True/Accepted", "Programmed=True/Programmed"]
    };
    let refused = || {
        let (addresses, conditions) = status("tenant-b");
        addresses.as_array().is_none_or(Vec::is_empty)
            && conditions == ["Accepted=True/Accepted", "Programmed=False/AddressNotUsable"]
    };
    assert!(eventually(API_SETTLE, || served_by_web() && holds()), "{:?}; log:\n{}", status("default"), read_log());

    // Tenant B asks for the address tenant A's Gateway holds: refused, A keeps it.
    api.kubectl_stdin(&["apply", "-f", "-"], &tenant_b());
    let settled = eventually(API_SETTLE, refused);
    assert!(settled, "tenant-b: {:?}; log:\n{}", status("tenant-b"), read_log());
    assert!(holds() && served_by_web(), "tenant A: {:?}; log:\n{}", status("default"), read_log());

    // Across a restart, the statuses are the memory: the same again, and nothing rewritten.
    gateway.terminate(API_SETTLE).expect("SIGTERM");
    let versions = || {
        [("default", "gateway/web"), ("tenant-b", "gateway/web")].map(|(namespace, object)| {
            api.kubectl(&["-n", namespace, "get", object, "-o", "jsonpath={.metadata.resourceVersion}"])
        })
    };
    let before = versions();
    let restarted = dir.path().join("restarted.log");
    let _gateway = start(&ns, &kubeconfig, &restarted, &[]);
    let read_log = || std::fs::read_to_string(&restarted).unwrap_or_default();
    assert!(eventually(API_SETTLE, served_by_web), "log:\n{}", read_log());
    std::thread::sleep(Duration::from_secs(3));
    assert!(holds() && refused(), "{:?} {:?}; log:\n{}", status("default"), status("tenant-b"), read_log());
    assert_eq!(versions(), before, "statuses unchanged by the restart");
}
