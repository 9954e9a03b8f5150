//! Per-Service and per-node policies on ClusterIP traffic, with real packets in both families:
//! session affinity, hairpin traffic, `--masquerade-all` and the masquerading of off-cluster
//! traffic to `internalTrafficPolicy: Local` Services.

mod common;

use common::*;

per_backend!(
    client_ip_affinity_sticks_to_one_pod_and_plain_services_spread,
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
