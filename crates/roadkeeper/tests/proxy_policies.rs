//! Per-Service and per-node policies on ClusterIP traffic, with real packets in both families:
//! session affinity, hairpin traffic, `--masquerade-all` and the masquerading of off-cluster
//! traffic to `internalTrafficPolicy: Local` Services.

mod common;

use std::net::SocketAddr;

use common::*;

per_backend!(
    client_ip_affinity_sticks_to_one_pod_and_plain_services_spread,
    a_client_held_by_affinity_moves_to_one_other_pod_when_its_pod_leaves,
    hairpin_traffic_reaches_the_pod_itself_masqueraded,
    masquerade_all_masquerades_pod_traffic_to_cluster_ips,
    off_cluster_traffic_to_the_cluster_ip_of_an_internal_local_policy_service_is_masqueraded,
);

/// Service number of the Services here: ClusterIPs 10.96.0.60 / fd00:96::60.
const SVC: u8 = 60;

fn client_ip_affinity_sticks_to_one_pod_and_plain_services_spread(backend: Backend) {
    let mut c = Cluster::new("rk-aff", backend);
    for name in ["web-a", "web-b", "web-c"] {
        c.add_pod(name, "app: web", NODE);
    }
    c.write("web.yaml", &service_manifest("web", SVC, "sessionAffinity: ClientIP"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(SVC));
            let got = reached(&c.client.ns, proto, target, 20);
            assert_eq!(got.len(), 1, "{proto:?} {target}: affinity keeps one pod, got {got:?}");
        }
    }

    c.write("web.yaml", &service_manifest("web", SVC, ""));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(SVC));
            assert_eq!(
                reached(&c.client.ns, proto, target, 30).len(),
                3,
                "{proto:?} {target}: spread without affinity"
            );
        }
    }
}

/// A client held to a pod by `sessionAffinity: ClientIP` (a pod through the ClusterIP; in eBPF
/// mode the socket programs' entry, and an outside host through the NodePort, the interface
/// programs' one) moves on when that pod leaves the Service, and sticks to the one it lands on.
fn a_client_held_by_affinity_moves_to_one_other_pod_when_its_pod_leaves(backend: Backend) {
    let mut c = Cluster::new("rk-affgo", backend);
    let pods: Vec<usize> = ["web-a", "web-b", "web-c"].iter().map(|name| c.add_pod(name, "app: web", NODE)).collect();
    c.write("web.yaml", &service_manifest("web", SVC, "type: NodePort, sessionAffinity: ClientIP"));
    c.proxy_once(&[]);
    let clients = |family: Family| {
        [
            (&c.client.ns, at(family.cluster_ip(SVC))),
            (c.lab.external(), SocketAddr::new(family.node_ip(), node_port(SVC))),
        ]
    };
    let held_by = |family: Family, proto: Proto| -> Vec<String> {
        clients(family)
            .iter()
            .map(|(ns, target)| {
                let got = reached(ns, proto, *target, 10);
                assert_eq!(got.len(), 1, "{proto:?} {target}: affinity keeps one pod, got {got:?}");
                got.into_iter().next().expect("one pod")
            })
            .collect()
    };
    for family in FAMILIES {
        for proto in PROTOS {
            held_by(family, proto);
        }
    }
    // The pod holding the first client leaves the Service (its echo server still answers).
    let gone = held_by(Family::V4, Proto::Tcp)[0].clone();
    let index = ["web-a", "web-b", "web-c"].iter().position(|name| *name == gone).expect("one of the pods");
    c.update_pod(pods[index], "app: gone", NODE, PodState::Ready);
    c.proxy_once(&[]);
    // Every client (each still sticking to one pod) now lands elsewhere.
    for family in FAMILIES {
        for proto in PROTOS {
            let now = held_by(family, proto);
            assert!(
                !now.contains(&gone),
                "{family:?} {proto:?}: a client is still held by {gone}, which left: {now:?}"
            );
        }
    }
}

fn hairpin_traffic_reaches_the_pod_itself_masqueraded(backend: Backend) {
    let mut c = Cluster::new("rk-hair", backend);
    let only = c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", SVC, ""));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(SVC));
            let (got, peer) = answers(&c.pods[only].pod.ns, proto, target, 3);
            assert!(got.iter().all(|n| n == "web-a"), "{proto:?} {target}: {got:?}");
            // eBPF mode: the pod connects to itself, its own address as the source.
            let source = if backend.nats_local_clients() { family.bridge_ip() } else { c.pod_ip(only, family) };
            assert_eq!(peer, source, "{proto:?} {target}: hairpin traffic is masqueraded (not NATed in eBPF mode)");
        }
    }
}

fn masquerade_all_masquerades_pod_traffic_to_cluster_ips(backend: Backend) {
    let mut c = Cluster::new("rk-masq", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", SVC, ""));
    c.proxy_once(&["--masquerade-all"]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(SVC));
            let (_, peer) = answers(&c.client.ns, proto, target, 3);
            // eBPF mode: nothing to masquerade, the connection goes to the endpoint itself.
            let source = if backend.nats_local_clients() { family.bridge_ip() } else { c.client_ip(family) };
            assert_eq!(peer, source, "{proto:?} {target}");
        }
    }
}

/// As upstream, the "ClusterIP traffic not from a pod: masquerade" rule sits in the chain that
/// ClusterIP traffic enters, which for `internalTrafficPolicy: Local` is the Local one: traffic from
/// outside the cluster and from the node itself is masqueraded when a cluster CIDR tells pods apart
/// (and always with `--masquerade-all`), pod traffic only with `--masquerade-all`.
fn off_cluster_traffic_to_the_cluster_ip_of_an_internal_local_policy_service_is_masqueraded(backend: Backend) {
    let mut c = Cluster::new("rk-itpm", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", SVC, "internalTrafficPolicy: Local"));
    for (cidr, masquerade_all) in
        [(Some(LAB_CLUSTER_CIDR), false), (None, false), (Some(LAB_CLUSTER_CIDR), true), (None, true)]
    {
        c.cluster_cidr = cidr;
        c.proxy_once(if masquerade_all { &["--masquerade-all"] } else { &[] });
        let off_cluster_masqueraded = cidr.is_some() || masquerade_all;
        for family in FAMILIES {
            for proto in PROTOS {
                let target = at(family.cluster_ip(SVC));
                let case = format!("{proto:?} {target}, --cluster-cidr {cidr:?}, masquerade-all {masquerade_all}");
                // eBPF mode translates the node's and the pods' connections at connect(): the node
                // reaches the pod from its bridge address, a pod from its own.
                let nat = backend.nats_local_clients();
                for (from, ns, masqueraded) in [
                    ("outside", c.lab.external(), off_cluster_masqueraded),
                    ("the node", c.lab.node(), off_cluster_masqueraded || !nat),
                    ("a pod", &c.client.ns, masquerade_all && nat),
                ] {
                    let (got, peer) = answers(ns, proto, target, 2);
                    assert!(got.iter().all(|n| n == "web-a"), "{case}: from {from}: {got:?}");
                    assert_eq!(peer == family.bridge_ip(), masqueraded, "{case}: from {from}, the pod saw {peer}");
                }
            }
        }
    }
}
