//! Stale UDP conntrack entries: a client that keeps one UDP flow to a Service (same source port)
//! moves to a remaining endpoint within one sync once its endpoint is removed, with either backend.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use roadkeeper_netlab::{ProbeResult, probe};

per_backend!(a_udp_flow_pinned_to_a_removed_endpoint_moves_to_a_remaining_one_within_one_sync);

/// Service number of `dns`: ClusterIPs 10.96.0.53 / fd00:96::53.
const DNS: u8 = 53;
/// The client's fixed UDP source port: every datagram belongs to one conntrack flow. Below the
/// ephemeral range, so that no other socket of the client pod can hold it.
const CLIENT_PORT: u16 = 20053;

/// The pod that answers one datagram from the client's fixed port in `family`.
fn answer(c: &Cluster, family: Family) -> Option<String> {
    let source = SocketAddr::new(c.client_ip(family), CLIENT_PORT);
    let target = at(family.cluster_ip(DNS));
    match c.client.ns.run(|| probe::udp_from_port(source, target, Duration::from_millis(500))) {
        ProbeResult::Reply(reply) => Some(reply.name),
        _ => None,
    }
}

fn a_udp_flow_pinned_to_a_removed_endpoint_moves_to_a_remaining_one_within_one_sync(backend: Backend) {
    let mut c = Cluster::new("rk-ct", backend);
    c.add_pod("dns-a", "app: dns", NODE);
    let b = c.add_pod("dns-b", "app: dns", NODE);
    c.update_pod(b, "app: dns", NODE, PodState::NotReady);
    c.write("dns.yaml", &service_manifest("dns", DNS, ""));
    c.start_fast_proxy();
    for family in FAMILIES {
        assert_eq!(answer(&c, family).as_deref(), Some("dns-a"), "{family:?}: only dns-a is ready");
    }

    // dns-b becomes ready: the flows stay on dns-a, which still serves (nothing stale).
    c.update_pod(b, "app: dns", NODE, PodState::Ready);
    std::thread::sleep(Duration::from_secs(1));
    for family in FAMILIES {
        for _ in 0..5 {
            assert_eq!(answer(&c, family).as_deref(), Some("dns-a"), "{family:?}: a serving endpoint keeps its flow");
        }
    }

    // dns-a goes away (its echo server keeps answering, so only the conntrack entry could still
    // send datagrams there): the same flows reach dns-b within one sync.
    c.remove("pod-dns-a.yaml");
    for family in FAMILIES {
        let moved = eventually(SETTLE, || answer(&c, family).as_deref() == Some("dns-b"));
        assert!(moved, "{family:?}: the flow stayed on the removed endpoint; proxy log:\n{}", c.proxy_log());
    }
    // The sync's line is logged after its deletions: the flow may move before it is written.
    let logged = |log: &str| log.contains("conntrack_deleted=1") || log.contains("conntrack_deleted=2");
    assert!(eventually(SETTLE, || logged(&c.proxy_log())), "no deletion logged:\n{}", c.proxy_log());
}
