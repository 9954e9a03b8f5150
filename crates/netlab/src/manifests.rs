//! Kubernetes manifests describing lab hosts: the Node object of the lab node and Pod objects of
//! lab pods, so that a proxy reading a manifest folder sees the lab as a cluster.

use crate::addressing::{NODE_IPV4, NODE_IPV6};
use crate::topology::Pod;

/// Port the lab's echo servers listen on (named `http` for TCP and `dns` for UDP in Pod specs).
pub const ECHO_PORT: u16 = 8080;

/// The Node object for the lab node: fixed InternalIPs (so NodePort addresses are known) and a
/// `topology.kubernetes.io/zone` label.
pub fn node(name: &str, zone: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{topology.kubernetes.io/zone: {zone}}}\n\
         status:\n  addresses:\n  - {{type: InternalIP, address: {NODE_IPV4}}}\n  - {{type: InternalIP, address: \"{NODE_IPV6}\"}}\n"
    )
}

/// How a Pod manifest describes the pod's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Running and Ready.
    Ready,
    /// Running, Ready condition False.
    NotReady,
    /// Being deleted (`metadata.deletionTimestamp` set) while still Ready, i.e. serving.
    Terminating,
}

/// The Pod object of a lab pod: `labels` is the body of a YAML flow map (`app: hello`), the pod
/// runs on `node` and has both its addresses. Its Ready condition changed now, as a kubelet
/// would write it (the endpointslice controller turns that into the slice's trigger time).
pub fn pod(pod: &Pod, labels: &str, node: &str, state: PodState) -> String {
    let ready = if state == PodState::NotReady { "False" } else { "True" };
    let deleting = if state == PodState::Terminating { ", deletionTimestamp: \"2025-01-01T00:00:00Z\"" } else { "" };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{labels}}}{deleting}}}\n\
         spec: {{nodeName: {node}, containers: [{{name: echo, image: roadkeeper, ports: [{{name: http, containerPort: {ECHO_PORT}}}, {{name: dns, containerPort: {ECHO_PORT}, protocol: UDP}}]}}]}}\n\
         status:\n  phase: Running\n  podIP: {v4}\n  podIPs: [{{ip: {v4}}}, {{ip: \"{v6}\"}}]\n  conditions: [{{type: Ready, status: \"{ready}\", lastTransitionTime: \"{now}\"}}]\n",
        name = pod.name,
        v4 = pod.ipv4,
        v6 = pod.ipv6,
        now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
    )
}
