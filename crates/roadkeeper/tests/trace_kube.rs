//! `roadkeeper trace --kubeconfig FILE URL --from-node NODE` against a real control plane
//! (kube-apiserver and kube-controller-manager built from tests/k8s): the road computed from what
//! the API server holds, in both proxy modes, by an identity that may only list and watch.

mod common;

use std::process::Command;
use std::time::Duration;

use common::apiserver::ControlPlane;
use common::{NODE, binary, eventually};
use serde_json::Value;

/// A node with an address, a Service `web` with ClusterIP 10.96.0.60 in front of Pod `web-0`
/// (port 8080) on it, Service `empty` selecting nothing, and the Ingress controller's Service
/// (10.96.0.62, Pod `ingress-0`) with an Ingress routing host web.example.com to `web`.
fn manifests() -> String {
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
  clusterIP: 10.96.0.60
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: empty}}
spec:
  clusterIP: 10.96.0.61
  selector: {{app: nothing}}
  ports: [{{port: 80}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: web-0, labels: {{app: web}}}}
spec:
  nodeName: {NODE}
  containers: [{{name: web, image: registry.invalid/web}}]
---
apiVersion: v1
kind: Service
metadata: {{name: roadkeeper-ingress, namespace: kube-system}}
spec:
  clusterIP: 10.96.0.62
  selector: {{app: ingress}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: ingress-0, namespace: kube-system, labels: {{app: ingress}}}}
spec:
  nodeName: {NODE}
  containers: [{{name: ingress, image: registry.invalid/ingress}}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: roadkeeper}}
spec: {{controller: roadkeeper.dev/ingress}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: web}}
spec:
  ingressClassName: roadkeeper
  rules:
  - host: web.example.com
    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}
"#
    )
}

/// What a kubelet would report: the node's address, and `web-0` running and ready.
const NODE_STATUS: &str = r#"{"status":{"addresses":[{"type":"InternalIP","address":"192.168.77.2"}]}}"#;
const POD_STATUS: &str = r#"{"status":{"podIP":"10.244.0.10","podIPs":[{"ip":"10.244.0.10"}],"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#;
const INGRESS_POD_STATUS: &str = r#"{"status":{"podIP":"10.244.0.11","podIPs":[{"ip":"10.244.0.11"}],"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#;

/// A kubeconfig of ServiceAccount `default/tracer`, which may only list and watch what the
/// trace reads.
fn reader_kubeconfig(cp: &ControlPlane) -> std::path::PathBuf {
    cp.kubectl(&[
        "create",
        "clusterrole",
        "tracer",
        "--verb=list,watch",
        "--resource=services,endpointslices.discovery.k8s.io,nodes,servicecidrs.networking.k8s.io,pods,namespaces,ingresses.networking.k8s.io,ingressclasses.networking.k8s.io",
    ]);
    cp.kubectl(&["create", "serviceaccount", "tracer"]);
    cp.kubectl(&["create", "clusterrolebinding", "tracer", "--clusterrole=tracer", "--serviceaccount=default:tracer"]);
    let token = cp.kubectl(&["create", "token", "tracer"]);
    cp.kubeconfig_with_token(token.trim())
}

fn trace(kubeconfig: &std::path::Path, url: &str, mode: &str, output: &str) -> (bool, String) {
    trace_with(kubeconfig, url, mode, output, &[])
}

/// [`trace`] with more arguments.
fn trace_with(kubeconfig: &std::path::Path, url: &str, mode: &str, output: &str, more: &[&str]) -> (bool, String) {
    let out = Command::new(binary())
        .args([
            "trace",
            url,
            "--from-node",
            NODE,
            "--proxy-mode",
            mode,
            "--cluster-cidr",
            "10.244.0.0/16",
            "-o",
            output,
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(more)
        .output()
        .unwrap();
    assert!(out.status.success(), "trace {url} ({mode}): {}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every object a trace reads, one `kind/namespace/name=resourceVersion` line each. (Recursive
/// descent, `{..resourceVersion}`, walks the List's own maps in no fixed order.)
fn resource_versions(cp: &ControlPlane) -> String {
    let each = r#"jsonpath={range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}={.metadata.resourceVersion}{"\n"}{end}"#;
    cp.kubectl(&["get", "services,endpointslices,pods,nodes", "-A", "-o", each])
}

#[test]
fn traces_a_real_cluster_read_only_in_both_modes() {
    let cp = ControlPlane::start(None);
    cp.kubectl_stdin(&["apply", "-f", "-"], &manifests());
    cp.kubectl(&["patch", "node", NODE, "--subresource=status", "--type=merge", "-p", NODE_STATUS]);
    cp.kubectl(&["patch", "pod", "web-0", "--subresource=status", "--type=merge", "-p", POD_STATUS]);
    let ingress_pod = ["-n", "kube-system", "patch", "pod", "ingress-0", "--subresource=status", "--type=merge"];
    cp.kubectl(&[&ingress_pod[..], &["-p", INGRESS_POD_STATUS]].concat());
    let sliced = |service: &str, ip: &str| {
        let selector = format!("kubernetes.io/service-name={service}");
        cp.kubectl(&["get", "endpointslices", "-A", "-l", &selector, "-o", "json"]).contains(ip)
    };
    let published = || sliced("web", "10.244.0.10") && sliced("roadkeeper-ingress", "10.244.0.11");
    assert!(eventually(Duration::from_secs(30), published), "no EndpointSlice for web\n{}", cp.logs());
    let kubeconfig = reader_kubeconfig(&cp);
    let before = resource_versions(&cp);
    assert!(before.contains("Service/default/web="), "{before}");

    for mode in ["nftables", "iptables"] {
        let (ok, json) = trace(&kubeconfig, "http://10.96.0.60/", mode, "json");
        assert!(ok, "{mode}: {json}");
        let road: Value = serde_json::from_str(&json).unwrap();
        let leg = &road["road"]["legs"][0];
        assert_eq!(leg["node"], NODE);
        assert_eq!(leg["entry"], "host");
        assert_eq!(leg["rules"]["backend"], mode);
        assert_eq!(leg["service"]["service"], "default/web");
        assert_eq!(leg["service"]["endpoints"][0]["pod"], "default/web-0");
        let landings = leg["landings"].as_array().unwrap();
        assert_eq!(landings.len(), 1, "{json}");
        assert_eq!(landings[0]["dnat"], "10.244.0.10:8080");
        assert_eq!(landings[0]["pod"], "default/web-0");
        assert!(road.get("answer").is_none(), "outside the lab nothing is sent");

        let (ok, text) = trace(&kubeconfig, "http://10.96.0.61/", mode, "text");
        assert!(ok, "{text}");
        assert!(text.contains(&format!("node proxy  {mode} rules of {NODE}")), "{text}");
        assert!(text.contains("no endpoints in its EndpointSlices") && text.contains("rejected"), "{text}");

        // A host-based Ingress rule, by the controller's address and a Host header.
        let host = ["-H", "Host: web.example.com"];
        let (ok, json) = trace_with(&kubeconfig, "http://10.96.0.62/", mode, "json", &host);
        assert!(ok, "{json}");
        let road: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(road["road"]["ingress"]["rule"], "default/web spec.rules[0].http.paths[0]", "{json}");
        assert_eq!(road["road"]["legs"][1]["landings"][0]["pod"], "default/web-0", "{json}");
    }
    // A name, resolved by this machine's resolver.
    let (ok, json) = trace(&kubeconfig, "http://localhost/", "nftables", "json");
    assert!(ok, "{json}");
    let road: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(road["road"]["dns"]["resolver"], "this machine's resolver", "{json}");
    assert_eq!(road["road"]["dns"]["address"], "127.0.0.1", "{json}");
    let (ok, text) = trace(&kubeconfig, "http://10.96.0.60/", "nftables", "text");
    assert!(ok);
    let (ok, err) = {
        let out = Command::new(binary())
            .args(["trace", "http://10.96.0.60/", "--from-node", "node-z", "--kubeconfig"])
            .arg(&kubeconfig)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert!(!ok && err.contains(&format!("--from-node node-z: no such Node (nodes: {NODE})")), "{err}\n{text}");
    let after = resource_versions(&cp);
    assert_eq!(before, after, "the trace changed the cluster");
}
