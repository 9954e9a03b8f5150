//! Which endpoints a Service's traffic may use, with real packets in both families:
//! `internalTrafficPolicy: Local`, Services without endpoints, the terminating fallback and
//! topology hints (the last two also through hand-written EndpointSlices).

mod common;

use std::net::SocketAddr;

use common::*;
use roadkeeper_netlab::ProbeResult;

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

#[test]
fn internal_traffic_policy_local_reaches_only_local_endpoints() {
    let mut c = Cluster::new("rk-itpl");
    c.add_pod("web-local", "app: web", NODE);
    c.add_pod("web-remote", "app: web", "node-b");
    c.write("web.yaml", &service_manifest("web", WEB, "internalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-local"]);
}

#[test]
fn internal_traffic_policy_local_without_local_endpoints_drops() {
    let mut c = Cluster::new("rk-itpd");
    c.add_pod("web-remote", "app: web", "node-b");
    c.write("web.yaml", &service_manifest("web", WEB, "internalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        assert_outcome(&c.client.ns, &cases(&[at(family.cluster_ip(WEB))]), &ProbeResult::Timeout);
    }
}

#[test]
fn service_without_endpoints_rejects_pods_host_and_outside() {
    let mut c = Cluster::new("rk-noep");
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

#[test]
fn unused_port_of_a_cluster_ip_is_rejected() {
    let mut c = Cluster::new("rk-port");
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.proxy_once(&[]);
    for family in FAMILIES {
        let unused = SocketAddr::new(family.cluster_ip(WEB), SERVICE_PORT + 1);
        assert_outcome(&c.client.ns, &cases(&[unused]), &ProbeResult::Refused);
    }
}

#[test]
fn terminating_pods_serve_only_when_no_pod_is_ready() {
    let mut c = Cluster::new("rk-term");
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

#[test]
fn hand_written_slice_with_serving_terminating_endpoints_is_used() {
    let mut c = Cluster::new("rk-slterm");
    c.add_pod("web-a", "app: none", NODE);
    c.add_pod("web-b", "app: none", NODE);
    hand_written_web(&c, |_| "conditions: {ready: false, serving: true, terminating: true}");
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-a", "web-b"]);
}

#[test]
fn topology_hints_for_this_zone_restrict_the_endpoints() {
    let mut c = Cluster::new("rk-hints");
    for name in ["web-a", "web-b", "web-c"] {
        c.add_pod(name, "app: none", NODE);
    }
    hand_written_web(&c, |i| if i == 1 { "hints: {forZones: [{name: zone-b}]}" } else { "hints: {forZones: [{name: zone-a}]}" });
    c.proxy_once(&[]);
    assert_cluster_ip_reaches(&c, &["web-a", "web-c"]);
}
