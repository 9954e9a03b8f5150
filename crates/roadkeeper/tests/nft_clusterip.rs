//! ClusterIP Services through the nftables backend, with real packets.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use common::*;

/// A Service `default/hello` with three pods; ClusterIPs in both families.
fn hello(c: &mut Cluster) {
    for name in ["hello-a", "hello-b", "hello-c"] {
        c.add_pod(name, "app: hello", NODE);
    }
    c.write(
        "hello.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: hello}\nspec:\n  clusterIPs: [10.96.0.10, \"fd00:96::10\"]\n  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n  selector: {app: hello}\n  ports:\n  - {name: http, port: 80, targetPort: http}\n  - {name: dns, port: 53, targetPort: 8080, protocol: UDP}\n",
    );
}

#[test]
fn pod_to_cluster_ip_reaches_every_pod_unmasqueraded_in_both_families() {
    let mut c = Cluster::new("rk-cip");
    hello(&mut c);
    c.proxy_once(&[]);
    for (vip, proto, port) in [
        ("10.96.0.10", Proto::Tcp, 80),
        ("fd00:96::10", Proto::Tcp, 80),
        ("10.96.0.10", Proto::Udp, 53),
        ("fd00:96::10", Proto::Udp, 53),
    ] {
        let vip: IpAddr = vip.parse().unwrap();
        let (names, peer) = answers(&c.client.ns, proto, SocketAddr::new(vip, port), 40);
        let distinct: BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), 3, "{proto:?} {vip}: random spread over all endpoints, got {names:?}");
        assert_eq!(peer, c.client_ip(vip), "pod traffic keeps its source address");
    }
}

#[test]
fn host_to_cluster_ip_is_masqueraded() {
    let mut c = Cluster::new("rk-host");
    hello(&mut c);
    c.proxy_once(&[]);
    let (_, peer) = answers(c.lab.node(), Proto::Tcp, "10.96.0.10:80".parse().unwrap(), 3);
    assert_eq!(peer, "10.244.0.1".parse::<IpAddr>().unwrap(), "host traffic leaves via the bridge address");
}
