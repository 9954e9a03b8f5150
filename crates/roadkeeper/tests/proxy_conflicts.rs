//! One tenant must never take the node's rules down: Services claiming the same frontend (the
//! same externalIP and port, an externalIP:port equal to another Service's ClusterIP:port), which
//! the API server accepts, leave the frontend to the oldest claimant and everything else working,
//! with real packets in both families.

mod common;

use common::http::{get, sample};
use common::*;

per_backend!(a_contested_frontend_goes_to_the_oldest_service_and_the_rest_of_the_node_keeps_working);

/// Host number of the shared externalIP (203.0.113.7 / 2001:db8::7).
const SHARED: u8 = 7;

/// Service `name` number `n` selecting `app: <name>`, created at `created`, with `extra` spec.
fn service(name: &str, n: u8, created: &str, extra: &str) -> String {
    service_manifest(name, n, extra)
        .replace("namespace: default}", &format!("namespace: default, creationTimestamp: '{created}'}}"))
}

/// `externalIPs: [...]` of the given addresses in both families.
fn external_ips(v4: &str, v6: &str) -> String {
    format!("externalIPs: [{v4}, \"{v6}\"]")
}

/// Waits until the proxy's metrics count `n` frontend conflicts (the gauge is set right after the
/// sync that programmed them).
fn assert_conflicts(c: &Cluster, n: f64) {
    let count = || sample(&get(c, "127.0.0.1:10249", "/metrics").1, "roadkeeper_sync_proxy_rules_frontend_conflicts");
    assert!(eventually(settle(), || count() == n), "{} frontend conflicts, expected {n}\n{}", count(), c.proxy_log());
}

/// True when a probe from the client to `target` is answered by `pod`.
fn answered_by(c: &Cluster, proto: Proto, target: std::net::SocketAddr, pod: &str) -> bool {
    matches!(probe(&c.client.ns, proto, target), roadkeeper_netlab::ProbeResult::Reply(r) if r.name == pod)
}

fn a_contested_frontend_goes_to_the_oldest_service_and_the_rest_of_the_node_keeps_working(backend: Backend) {
    let mut c = Cluster::new("rk-clash", backend);
    for name in ["old", "new", "thief", "bystander"] {
        c.add_pod(&format!("{name}-a"), &format!("app: {name}"), NODE);
    }
    let shared = external_ips(&Family::V4.external_ip(SHARED).to_string(), &Family::V6.external_ip(SHARED).to_string());
    c.write("old.yaml", &service("old", 81, "2026-01-01T00:00:00Z", &shared));
    c.write("new.yaml", &service("new", 82, "2026-02-01T00:00:00Z", &shared));
    // An externalIP:port equal to old's ClusterIP:port.
    let on_old = external_ips(&Family::V4.cluster_ip(81).to_string(), &Family::V6.cluster_ip(81).to_string());
    c.write("thief.yaml", &service("thief", 83, "2026-03-01T00:00:00Z", &on_old));
    c.write("bystander.yaml", &service("bystander", 84, "2026-01-15T00:00:00Z", ""));
    c.start_fast_proxy();

    for family in FAMILIES {
        for proto in PROTOS {
            let expect = [
                (at(family.external_ip(SHARED)), "old-a"),
                (at(family.cluster_ip(81)), "old-a"),
                (at(family.cluster_ip(82)), "new-a"),
                (at(family.cluster_ip(83)), "thief-a"),
                (at(family.cluster_ip(84)), "bystander-a"),
            ];
            for (target, pod) in expect {
                let (got, _) = answers(&c.client.ns, proto, target, 3);
                assert!(got.iter().all(|n| n == pod), "{proto:?} {target}: expected {pod}, got {got:?}");
            }
        }
    }
    let log = c.proxy_log();
    for frontend in ["203.0.113.7:80/tcp", "[2001:db8::7]:80/udp", "10.96.0.81:80/tcp"] {
        assert!(log.contains(frontend), "the conflict over {frontend} is logged:\n{log}");
    }
    assert!(
        log.contains("Service default/new claims 203.0.113.7:80/tcp, which Service default/old holds"),
        "the log names both Services:\n{log}"
    );
    // new: the shared address, 2 ports x 2 families; thief: old's ClusterIP ports, the same.
    assert_conflicts(&c, 8.0);

    // The oldest claimant goes: the next one takes the frontend over, in a partial sync.
    c.remove("old.yaml");
    for family in FAMILIES {
        for proto in PROTOS {
            let target = at(family.external_ip(SHARED));
            let moved = eventually(settle(), || answered_by(&c, proto, target, "new-a"));
            assert!(moved, "{proto:?} {target} moves to new");
            let target = at(family.cluster_ip(81));
            let moved = eventually(settle(), || answered_by(&c, proto, target, "thief-a"));
            assert!(moved, "{proto:?} {target}: thief's externalIP takes over once old is gone");
        }
    }
    assert_conflicts(&c, 0.0);
}
