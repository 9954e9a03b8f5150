//! Per-Service and per-node policies on ClusterIP traffic, with real packets in both families:
//! session affinity, hairpin traffic and `--masquerade-all`.

mod common;

use common::*;

/// Service number of the Services here: ClusterIPs 10.96.0.60 / fd00:96::60.
const SVC: u8 = 60;

#[test]
fn client_ip_affinity_sticks_to_one_pod_and_plain_services_spread() {
    let mut c = Cluster::new("rk-aff");
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
            assert_eq!(reached(&c.client.ns, proto, target, 30).len(), 3, "{proto:?} {target}: spread without affinity");
        }
    }
}

#[test]
fn hairpin_traffic_reaches_the_pod_itself_masqueraded() {
    let mut c = Cluster::new("rk-hair");
    let only = c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", SVC, ""));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(SVC));
            let (got, peer) = answers(&c.pods[only].pod.ns, proto, target, 3);
            assert!(got.iter().all(|n| n == "web-a"), "{proto:?} {target}: {got:?}");
            assert_eq!(peer, family.bridge_ip(), "{proto:?} {target}: hairpin traffic is masqueraded");
        }
    }
}

#[test]
fn masquerade_all_masquerades_pod_traffic_to_cluster_ips() {
    let mut c = Cluster::new("rk-masq");
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", SVC, ""));
    c.proxy_once(&["--masquerade-all"]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.cluster_ip(SVC));
            let (_, peer) = answers(&c.client.ns, proto, target, 3);
            assert_eq!(peer, family.bridge_ip(), "{proto:?} {target}");
        }
    }
}
