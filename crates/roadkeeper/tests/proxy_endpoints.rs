//! Which endpoints a Service's traffic may use, with real packets in both families:
//! `internalTrafficPolicy: Local`, Services without endpoints, the terminating fallback and
//! topology hints (the last two also through hand-written EndpointSlices).

mod common;

use std::net::SocketAddr;

use common::*;
use roadkeeper_netlab::ProbeResult;

per_backend!(
    internal_traffic_policy_local_reaches_only_local_endpoints,
    internal_traffic_policy_local_without_local_endpoints_drops,
    service_without_endpoints_rejects_pods_host_and_outside,
    unused_port_of_a_cluster_ip_is_rejected,
    terminating_pods_serve_only_when_no_pod_is_ready,
    hand_written_slice_with_serving_terminating_endpoints_is_used,
    topology_hints_for_this_zone_restrict_the_endpoints,
);

/// Service number of `web`: ClusterIPs 10.96.0.50 / fd00:96::50.
const WEB: u8 = 50;

/// One endpoint of a hand-written slice: pod `i`'s address in `family` on this node, plus
/// `extra` fields (YAML flow style, e.g. `conditions: {ready: false}`).
fn endpoint(c: &Cluster, i: usize, family: Family, extra: &str) -> String {
    format!("{{addresses: [\"{}\"], nodeName: {NODE}, {extra}}}", c.pod_ip(i, family))
}

/// Writes the selectorless Service `web` and one hand-written slice per family, with an endpoint
/// per pod; `extra(i)` gives the extra fields of pod `i`'s endpoint.
fn hand_written_web(c: &Cluster, extra: impl Fn(usize) -> &'static str) {
    c.write("web.yaml", &selectorless_service_manifest("web", WEB));
    for family in FAMILIES {
        let endpoints: Vec<String> = (0..c.pods.len()).map(|i| endpoint(c, i, family, extra(i))).collect();
        c.write(&format!("web-{}.yaml", family.nft()), &endpoint_slice("web", family, &endpoints));
    }
}

/// Asserts that ClusterIP traffic from the client reaches exactly the pods `expected`.
fn assert_cluster_ip_reaches(c: &Cluster, expected: &[&str]) {
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(WEB));
            assert_eq!(reached(&c.client.ns, proto, target, 20), names(expected), "{proto:?} {target}");
        }
    }
}

fn internal_traffic_policy_local_reaches_only_local_endpoints(backend: Backend) {
    let mut c = Cluster::new("rk-itpl", backend);
    c.add_pod("web-local", "app: web", NODE);
    c.add_pod("web-remote", "app: web", "node-b");
    c.write("web.yaml", &service_manifest("web", WEB, "internalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-local"]);
}

fn internal_traffic_policy_local_without_local_endpoints_drops(backend: Backend) {
    let mut c = Cluster::new("rk-itpd", backend);
    c.add_pod("web-remote", "app: web", "node-b");
    c.write("web.yaml", &service_manifest("web", WEB, "internalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    // eBPF mode fails the client's connect() and send() at once (EHOSTUNREACH) instead of
    // dropping its packets: a socket program has no packet to drop.
    let outcome = if backend.nats_local_clients() { ProbeResult::Timeout } else { ProbeResult::Refused };
    for family in FAMILIES {
        assert_outcome(&c.client.ns, &cases(&[at(family.cluster_ip(WEB))]), &outcome);
    }
}

fn service_without_endpoints_rejects_pods_host_and_outside(backend: Backend) {
    let mut c = Cluster::new("rk-noep", backend);
    c.add_pod("other", "app: other", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, "type: NodePort"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        let cluster_ip = at(family.cluster_ip(WEB));
        let node_port = SocketAddr::new(family.node_ip(), node_port(WEB));
        assert_outcome(&c.client.ns, &cases(&[cluster_ip, node_port]), &ProbeResult::Refused);
        // TCP only from the host: a rejected UDP send fails locally (EPERM) before any reply.
        assert_outcome(c.lab.node(), &[(Proto::Tcp, cluster_ip), (Proto::Tcp, node_port)], &ProbeResult::Refused);
        assert_outcome(c.lab.external(), &cases(&[node_port]), &ProbeResult::Refused);
    }
}

fn unused_port_of_a_cluster_ip_is_rejected(backend: Backend) {
    let mut c = Cluster::new("rk-port", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.proxy_once(&[]);
    for family in FAMILIES {
        let unused = SocketAddr::new(family.cluster_ip(WEB), SERVICE_PORT + 1);
        assert_outcome(&c.client.ns, &cases(&[unused]), &ProbeResult::Refused);
    }
}

fn terminating_pods_serve_only_when_no_pod_is_ready(backend: Backend) {
    let mut c = Cluster::new("rk-term", backend);
    let ready = c.add_pod("web-a", "app: web", NODE);
    let terminating = c.add_pod("web-b", "app: web", NODE);
    c.update_pod(terminating, "app: web", NODE, PodState::Terminating);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-a"]);

    c.update_pod(ready, "app: web", NODE, PodState::Terminating);
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-a", "web-b"]);
}

fn hand_written_slice_with_serving_terminating_endpoints_is_used(backend: Backend) {
    let mut c = Cluster::new("rk-slterm", backend);
    c.add_pod("web-a", "app: none", NODE);
    c.add_pod("web-b", "app: none", NODE);
    hand_written_web(&c, |_| "conditions: {ready: false, serving: true, terminating: true}");
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-a", "web-b"]);
}

fn topology_hints_for_this_zone_restrict_the_endpoints(backend: Backend) {
    let mut c = Cluster::new("rk-hints", backend);
    for name in ["web-a", "web-b", "web-c"] {
        c.add_pod(name, "app: none", NODE);
    }
    hand_written_web(&c, |i| {
        if i == 1 { "hints: {forZones: [{name: zone-b}]}" } else { "hints: {forZones: [{name: zone-a}]}" }
    });
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-a", "web-c"]);
}
