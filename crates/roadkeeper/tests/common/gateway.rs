//! `roadkeeper gateway` against the test control plane, for `gateway_kube` and the propagation
//! benchmark: a network namespace with a backend and the Gateways' pool local, the Gateway API
//! CRDs, the identity of deploy/gateway.yaml, and the gateway started as that identity.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use roadkeeper_netlab::{Netns, Process};

use super::apiserver::ControlPlane;
use super::web::{backend, service};
use super::{binary, eventually};

/// Where the backend listens: an address an EndpointSlice may hold (not loopback).
pub const BACKEND_IP: &str = "10.244.0.10";
pub const BACKEND_PORT: u16 = 8081;
/// The Gateways' pool, local inside the namespace, and the first Gateway's address.
pub const POOL: &str = "192.168.235.0/24";
pub const ADDRESS: &str = "192.168.235.1";
/// How long a change in the API server may take to show.
pub const API_SETTLE: Duration = Duration::from_secs(20);

/// A namespace named `name` with backend `web` (a headless Service of that name in `default`,
/// its EndpointSlice written by hand) and a control plane holding the Gateway API v1.6.3 CRDs and
/// the ServiceAccount, RBAC and GatewayClass of deploy/gateway.yaml; returns a kubeconfig with a
/// token of that ServiceAccount, as the kubelet would mount it.
pub fn cluster(name: &str) -> (Netns, ControlPlane, PathBuf) {
    let ns = Netns::new(name).expect("netns");
    ns.ip(["addr", "add", &format!("{BACKEND_IP}/32"), "dev", "lo"]).expect("backend address");
    ns.ip(["route", "add", "local", POOL, "dev", "lo"]).expect("local pool");
    backend(ns.run(|| TcpListener::bind((BACKEND_IP, BACKEND_PORT)).expect("bind backend")), "web");
    let api = ControlPlane::start(Some(ns.name()));
    api.install_gateway_api_crds(
        "sigs.k8s.io/gateway-api@v1.6.3",
        &["gatewayclasses", "gateways", "httproutes", "referencegrants", "grpcroutes"],
    );
    api.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployed(&["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "GatewayClass"]),
    );
    let token = api.kubectl(&["-n", "kube-system", "create", "token", "roadkeeper-gateway"]);
    let kubeconfig = api.kubeconfig_with_token(token.trim());
    api.kubectl_stdin(&["apply", "-f", "-"], &service("web", BACKEND_PORT, &[BACKEND_IP], &[]));
    (ns, api, kubeconfig)
}

/// The documents of deploy/gateway.yaml of the given kinds.
fn deployed(kinds: &[&str]) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/gateway.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/gateway.yaml");
    let documents = text.split("\n---").filter(|d| kinds.iter().any(|k| d.contains(&format!("\nkind: {k}\n"))));
    documents.collect::<Vec<_>>().join("\n---\n")
}

/// Starts `roadkeeper gateway` in `ns` as the user of `kubeconfig` (with `extra` arguments),
/// logging to `log`, and waits until it serves.
pub fn start(ns: &Netns, kubeconfig: &Path, log: &Path, extra: &[&str]) -> Process {
    let mut args = vec![
        binary().display().to_string(),
        "gateway".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--address-pool".into(),
        POOL.into(),
        "--metrics-bind-address".into(),
        String::new(),
    ];
    args.extend(extra.iter().map(|arg| arg.to_string()));
    let process = ns.spawn_logged(args, log).expect("spawn roadkeeper gateway");
    let serving = eventually(API_SETTLE, || std::fs::read_to_string(log).unwrap_or_default().contains("serving"));
    assert!(serving, "roadkeeper gateway does not serve; log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    process
}
