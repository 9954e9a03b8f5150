//! Smoke tests of the real-control-plane harness ([`common::apiserver`]).

mod common;

use std::net::TcpStream;
use std::time::Duration;

use common::apiserver::ControlPlane;
use common::{NODE, eventually};
use roadkeeper_netlab::Netns;
use serde_json::Value;

/// How long kube-controller-manager may take to react.
const WITHIN: Duration = Duration::from_secs(30);

/// A Service selecting Pod `web-0` on node [`NODE`].
fn web_manifests() -> String {
    format!(
        r#"
apiVersion: v1
kind: Node
metadata: {{name: {NODE}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: web-0, labels: {{app: web}}}}
spec:
  nodeName: {NODE}
  containers: [{{name: web, image: registry.invalid/web}}]
"#
    )
}

/// What a kubelet would report for a running, ready `web-0`.
const READY_STATUS: &str = r#"{"status":{"podIP":"10.244.0.10","podIPs":[{"ip":"10.244.0.10"}],"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#;

#[test]
fn controller_manager_publishes_ready_pod_in_endpoint_slice() {
    let cp = ControlPlane::start(None);
    cp.kubectl_stdin(&["apply", "-f", "-"], &web_manifests());
    cp.kubectl(&["patch", "pod", "web-0", "--subresource=status", "--type=merge", "-p", READY_STATUS]);
    assert!(eventually(WITHIN, || ready_endpoints(&cp, "web") == ["10.244.0.10"]), "no ready endpoint\n{}", cp.logs());
}

#[test]
fn compaction_expires_old_versions_and_restart_keeps_objects() {
    let mut cp = ControlPlane::start(None);
    let old = create_config_map(&cp, "a");
    create_config_map(&cp, "b");
    create_config_map(&cp, "c");
    cp.compact_etcd();
    let watch = format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={old}&timeoutSeconds=10");
    let events = cp.kubectl(&["get", "--raw", &watch]);
    assert!(events.contains(r#""code":410"#), "watch from compacted {old}: {events}");

    cp.stop_apiserver();
    assert!(TcpStream::connect(host_port(&cp)).is_err(), "kube-apiserver still listening");
    cp.start_apiserver();
    let names = cp.kubectl(&["get", "configmaps", "a", "b", "c", "-o", "name"]);
    assert_eq!(names.lines().collect::<Vec<_>>(), ["configmap/a", "configmap/b", "configmap/c"]);
}

#[test]
fn runs_inside_a_network_namespace() {
    let netns = Netns::new("rk-api").expect("cannot create netns");
    let cp = ControlPlane::start(Some(netns.name()));
    assert!(TcpStream::connect(host_port(&cp)).is_err(), "kube-apiserver listens on the host's loopback");

    // A service-account token, issued and verified with the generated signing key.
    let token = cp.kubectl(&["create", "token", "default"]);
    let kubeconfig = cp.kubeconfig_with_token(token.trim());
    let kubeconfig = kubeconfig.to_str().unwrap();
    let whoami =
        cp.kubectl(&["--kubeconfig", kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert_eq!(whoami, "system:serviceaccount:default:default");
}

/// Creates ConfigMap `name` in `default`; its resourceVersion.
fn create_config_map(cp: &ControlPlane, name: &str) -> String {
    cp.kubectl(&["create", "configmap", name, "-o", "jsonpath={.metadata.resourceVersion}"])
}

/// The ready addresses in the EndpointSlices of Service `service`.
fn ready_endpoints(cp: &ControlPlane, service: &str) -> Vec<String> {
    let selector = format!("kubernetes.io/service-name={service}");
    let slices: Value = serde_json::from_str(&cp.kubectl(&["get", "endpointslices", "-l", &selector, "-o", "json"]))
        .expect("kubectl prints JSON");
    let endpoints = slices["items"].as_array().into_iter().flatten().flat_map(|slice| slice["endpoints"].as_array());
    endpoints
        .flatten()
        .filter(|endpoint| endpoint["conditions"]["ready"] == true)
        .flat_map(|endpoint| endpoint["addresses"].as_array().into_iter().flatten())
        .filter_map(|address| address.as_str().map(str::to_owned))
        .collect()
}

/// The API server's `127.0.0.1:<port>`.
fn host_port(cp: &ControlPlane) -> String {
    cp.server_url().trim_start_matches("https://").to_owned()
}
