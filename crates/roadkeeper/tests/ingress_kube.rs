//! `roadkeeper ingress` fed by a real Kubernetes control plane (etcd, kube-apiserver and
//! kube-controller-manager built from tests/k8s, in a network namespace), as the ServiceAccount of
//! deploy/ingress.yaml with only its RBAC: it routes a request to a backend and publishes its
//! addresses in `status.loadBalancer` of the Ingresses of its class, leaves other classes alone,
//! rewrites nothing that is already right (no write loop, none at a restart), and clears the
//! status of an Ingress that leaves its class.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use common::apiserver::ControlPlane;
use common::http::{parse_response, try_http_get};
use common::{binary, eventually};
use roadkeeper_netlab::{Netns, Process};
use serde_json::{Value, json};

/// Where the backend listens: an address an EndpointSlice may hold (not loopback).
const BACKEND_IP: &str = "10.244.0.10";
const BACKEND_PORT: u16 = 8081;
/// Where `roadkeeper ingress` serves HTTP.
const HTTP: &str = "127.0.0.1:8080";
/// How long a change in the API server may take to show.
const API_SETTLE: Duration = Duration::from_secs(10);

/// The documents of deploy/ingress.yaml of the given kinds.
fn deployed(kinds: &[&str]) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/ingress.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/ingress.yaml");
    let documents = text.split("\n---").filter(|d| kinds.iter().any(|k| d.contains(&format!("\nkind: {k}\n"))));
    documents.collect::<Vec<_>>().join("\n---\n")
}

/// Answers every HTTP request with `web <path>`.
fn backend(listener: TcpListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let (mut line, mut path) = (String::new(), String::new());
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if path.is_empty() {
                    path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
                }
                line.clear();
            }
            let body = format!("web {path}");
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            let _ = reader.get_mut().write_all((head + &body).as_bytes());
        }
    });
}

/// The selector-less Service `web` with its EndpointSlice pointing at the backend.
fn web_service() -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\n\
         spec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: {BACKEND_PORT}, protocol: TCP}}]\n\
         endpoints: [{{addresses: [{BACKEND_IP}]}}]\n"
    )
}

/// Ingress `name` of class `class` sending everything to Service `web`.
fn ingress(name: &str, class: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{ingressClassName: {class}, rules: [{{http: {{paths: [{{path: /, pathType: Prefix, \
         backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}}}]}}\n"
    )
}

/// Status code and body of `GET path` through `roadkeeper ingress`, from inside `ns`.
fn get(ns: &Netns, path: &str) -> Option<(u16, String)> {
    let raw = ns.run(|| try_http_get(HTTP.parse().expect("address"), path)).ok()?;
    let (code, _, body) = parse_response(&raw);
    Some((code, body))
}

/// `.status.loadBalancer.ingress` of Ingress `name` (`null` when absent).
fn status(api: &ControlPlane, name: &str) -> Value {
    let text = api.kubectl(&["get", "ingress", name, "-o", "jsonpath={.status.loadBalancer.ingress}"]);
    if text.trim().is_empty() { Value::Null } else { serde_json::from_str(&text).expect("status JSON") }
}

fn resource_version(api: &ControlPlane, name: &str) -> String {
    api.kubectl(&["get", "ingress", name, "-o", "jsonpath={.metadata.resourceVersion}"])
}

/// `--publish-status-address` with two fixed addresses, an IP and a DNS name.
const PUBLISH_OURS: [&str; 2] = ["--publish-status-address", "192.0.2.10,lb.example.com"];

/// Starts `roadkeeper ingress` in `ns` as the user of `kubeconfig`, publishing as `publish`
/// says, logging to `log`, and waits until it serves.
fn start(ns: &Netns, kubeconfig: &Path, log: &Path, publish: [&str; 2]) -> Process {
    let _ = std::fs::remove_file(log);
    let args = [
        binary().display().to_string(),
        "ingress".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--http".into(),
        HTTP.into(),
        "--https".into(),
        String::new(),
        publish[0].into(),
        publish[1].into(),
        "--metrics-bind-address".into(),
        String::new(),
        "-v".into(),
    ];
    let process = ns.spawn_logged(args, log).expect("spawn roadkeeper ingress");
    let serving = eventually(API_SETTLE, || std::fs::read_to_string(log).unwrap_or_default().contains("serving"));
    assert!(serving, "roadkeeper ingress does not serve; log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    process
}

#[test]
fn publishes_the_status_of_its_ingresses_with_only_the_deployed_rbac() {
    let ns = Netns::new("rk-ingkube").expect("netns");
    // On the loopback device, but not a loopback address: the API server takes it.
    ns.ip(["addr", "add", &format!("{BACKEND_IP}/32"), "dev", "lo"]).expect("backend address");
    backend(ns.run(|| TcpListener::bind((BACKEND_IP, BACKEND_PORT)).expect("bind backend")));
    let api = ControlPlane::start(Some(ns.name()));

    // The identity of deploy/ingress.yaml: a token of its ServiceAccount, as the kubelet mounts it.
    let identity = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "IngressClass"];
    api.kubectl_stdin(&["apply", "-f", "-"], &deployed(&identity));
    let token = api.kubectl(&["-n", "kube-system", "create", "token", "roadkeeper-ingress"]);
    let kubeconfig = api.kubeconfig_with_token(token.trim());
    let rules = api.kubectl(&["auth", "can-i", "--list", "--as=system:serviceaccount:kube-system:roadkeeper-ingress"]);
    let granted: BTreeMap<&str, &str> = rules
        .lines()
        .skip(1)
        .filter_map(|line| Some((line.split_whitespace().next()?, line.rsplit_once(" [")?.1)))
        .filter(|(resource, _)| !resource.starts_with('[') && !resource.starts_with("selfsubject"))
        .collect();
    let expected = BTreeMap::from([
        ("ingresses.networking.k8s.io", "list watch]"),
        ("ingresses.networking.k8s.io/status", "patch]"),
        ("ingressclasses.networking.k8s.io", "list watch]"),
        ("services", "list watch]"),
        ("secrets", "list watch]"),
        ("endpointslices.discovery.k8s.io", "list watch]"),
    ]);
    assert_eq!(granted, expected, "{rules}");

    api.kubectl_stdin(&["apply", "-f", "-"], &web_service());
    api.kubectl_stdin(&["apply", "-f", "-"], &(ingress("web", "roadkeeper") + "---\n" + &ingress("theirs", "nginx")));
    let scratch = tempfile::tempdir().expect("tempdir");
    let log_path = scratch.path().join("ingress.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let process = start(&ns, &kubeconfig, &log_path, PUBLISH_OURS);

    let ours = json!([{"ip": "192.0.2.10"}, {"hostname": "lb.example.com"}]);
    let published = eventually(API_SETTLE, || status(&api, "web") == ours);
    assert!(published, "status of web: {}; log:\n{}", status(&api, "web"), log());
    assert_eq!(status(&api, "theirs"), Value::Null, "an Ingress of another class got a status");
    let reached = eventually(API_SETTLE, || get(&ns, "/hello") == Some((200, "web /hello".into())));
    assert!(reached, "no route to the backend: {:?}; log:\n{}", get(&ns, "/hello"), log());

    // Our write comes back as a change and asks for no other; a restart rewrites nothing.
    let version = resource_version(&api, "web");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(resource_version(&api, "web"), version, "the status keeps being written; log:\n{}", log());
    process.terminate(Duration::from_secs(5)).expect("stop roadkeeper ingress");
    let _process = start(&ns, &kubeconfig, &log_path, PUBLISH_OURS);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(resource_version(&api, "web"), version, "a restart rewrote the status; log:\n{}", log());

    // Leaving our class clears it.
    api.kubectl(&["patch", "ingress", "web", "--type=merge", "-p", r#"{"spec":{"ingressClassName":"nginx"}}"#]);
    let cleared =
        eventually(API_SETTLE, || matches!(status(&api, "web"), Value::Null) || status(&api, "web") == json!([]));
    assert!(cleared, "status of web after leaving our class: {}; log:\n{}", status(&api, "web"), log());
    assert_eq!(status(&api, "theirs"), Value::Null);
    assert!(!log().contains("forbidden"), "the deployed ClusterRole is not enough:\n{}", log());
}

#[test]
fn publishes_the_addresses_of_its_service_as_they_change() {
    let ns = Netns::new("rk-ingpub").expect("netns");
    let api = ControlPlane::start(Some(ns.name()));
    let identity = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "IngressClass"];
    api.kubectl_stdin(&["apply", "-f", "-"], &deployed(&identity));
    let token = api.kubectl(&["-n", "kube-system", "create", "token", "roadkeeper-ingress"]);
    let kubeconfig = api.kubeconfig_with_token(token.trim());
    let front = "apiVersion: v1\nkind: Service\nmetadata: {name: front, namespace: kube-system}\n\
                 spec: {type: LoadBalancer, selector: {app: front}, ports: [{port: 80}]}\n";
    api.kubectl_stdin(&["apply", "-f", "-"], front);
    api.kubectl_stdin(&["apply", "-f", "-"], &(web_service() + "---\n" + &ingress("web", "roadkeeper")));
    let scratch = tempfile::tempdir().expect("tempdir");
    let log_path = scratch.path().join("ingress.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let _process = start(&ns, &kubeconfig, &log_path, ["--publish-service", "kube-system/front"]);

    // Pending: no address to publish.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(status(&api, "web"), Value::Null, "log:\n{}", log());
    // The load balancer gives the Service an address, then another: the Ingress follows.
    for entries in [json!([{"ip": "192.0.2.20"}]), json!([{"ip": "192.0.2.21"}, {"hostname": "lb.example.com"}])] {
        let patch = json!({"status": {"loadBalancer": {"ingress": entries}}}).to_string();
        api.kubectl(&[
            "-n",
            "kube-system",
            "patch",
            "service",
            "front",
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ]);
        let followed = eventually(API_SETTLE, || status(&api, "web") == entries);
        assert!(followed, "status of web: {}, wanted {entries}; log:\n{}", status(&api, "web"), log());
    }
    assert!(!log().contains("forbidden"), "the deployed ClusterRole is not enough:\n{}", log());
}
