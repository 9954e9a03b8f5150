//! `roadkeeper gateway` fed by a real Kubernetes control plane (built from tests/k8s, in a network
//! namespace) with the Gateway API v1.6.3 CRDs, as the ServiceAccount of deploy/gateway.yaml with
//! only its RBAC: it serves an HTTPRoute on its Gateway's address, and writes the status of the
//! GatewayClass, the Gateway and the route through the `status` subresource, once (no write loop).

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use common::apiserver::ControlPlane;
use common::web::{backend, exchange, request_head, service};
use common::{binary, eventually};
use roadkeeper_netlab::{Netns, Process};
use serde_json::Value;

/// Where the backend listens: an address an EndpointSlice may hold (not loopback).
const BACKEND_IP: &str = "10.244.0.10";
const BACKEND_PORT: u16 = 8081;
/// The Gateways' pool, local inside the namespace, and the first Gateway's address.
const POOL: &str = "192.168.235.0/24";
const ADDRESS: &str = "192.168.235.1";
/// How long a change in the API server may take to show.
const API_SETTLE: Duration = Duration::from_secs(20);

/// The documents of deploy/gateway.yaml of the given kinds.
fn deployed(kinds: &[&str]) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/gateway.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/gateway.yaml");
    let documents = text.split("\n---").filter(|d| kinds.iter().any(|k| d.contains(&format!("\nkind: {k}\n"))));
    documents.collect::<Vec<_>>().join("\n---\n")
}

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

/// Starts `roadkeeper gateway` in `ns` as the user of `kubeconfig`, logging to `log`, and waits
/// until it serves.
fn start(ns: &Netns, kubeconfig: &Path, log: &Path) -> Process {
    let args = [
        binary().display().to_string(),
        "gateway".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--address-pool".into(),
        POOL.into(),
        "--metrics-bind-address".into(),
        String::new(),
        "-v".into(),
    ];
    let process = ns.spawn_logged(args, log).expect("spawn roadkeeper gateway");
    let serving = eventually(API_SETTLE, || std::fs::read_to_string(log).unwrap_or_default().contains("serving"));
    assert!(serving, "roadkeeper gateway does not serve; log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    process
}

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
    let ns = Netns::new("rk-gwkube").expect("netns");
    ns.ip(["addr", "add", &format!("{BACKEND_IP}/32"), "dev", "lo"]).expect("backend address");
    ns.ip(["route", "add", "local", POOL, "dev", "lo"]).expect("local pool");
    backend(ns.run(|| TcpListener::bind((BACKEND_IP, BACKEND_PORT)).expect("bind backend")), "web");
    let api = ControlPlane::start(Some(ns.name()));
    api.install_gateway_api_crds(
        "sigs.k8s.io/gateway-api@v1.6.3",
        &["gatewayclasses", "gateways", "httproutes", "referencegrants", "grpcroutes"],
    );

    // The identity of deploy/gateway.yaml: a token of its ServiceAccount, as the kubelet mounts it.
    api.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployed(&["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "GatewayClass"]),
    );
    let token = api.kubectl(&["-n", "kube-system", "create", "token", "roadkeeper-gateway"]);
    let kubeconfig = api.kubeconfig_with_token(token.trim());
    api.kubectl_stdin(&["apply", "-f", "-"], &service("web", BACKEND_PORT, &[BACKEND_IP], &[]));
    api.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("gateway.log");
    let _gateway = start(&ns, &kubeconfig, &log);
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
