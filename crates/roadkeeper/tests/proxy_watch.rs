//! The proxy in watch mode follows manifest changes, with real packets in both families: pods
//! joining and leaving a Service, a deleted Service, our table deleted by someone else, and no
//! new connection failing while pods churn and the proxy restarts.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use roadkeeper_netlab::{Netns, ProbeResult};

per_backend!(
    a_new_pod_joins_the_rotation,
    a_deleted_pod_leaves_the_rotation,
    a_relabelled_pod_leaves_the_rotation,
    a_pod_that_turns_not_ready_leaves_the_rotation,
    a_deleted_service_stops_answering,
    a_table_deleted_by_someone_else_is_restored,
    sigterm_stops_the_proxy_cleanly_and_leaves_the_rules_in_place,
    a_node_crossing_a_thousand_endpoints_keeps_following_its_pods,
    no_new_connection_fails_while_pods_go_three_five_three_and_the_proxy_restarts,
);

/// Service number of `web`: ClusterIPs 10.96.0.40 / fd00:96::40.
const WEB: u8 = 40;

/// A watching proxy with Service `web` over pods `web-a` and `web-b`.
fn watched_web(prefix: &str, backend: Backend) -> Cluster {
    let mut c = Cluster::new(prefix, backend);
    c.add_pod("web-a", "app: web", NODE);
    c.add_pod("web-b", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.start_fast_proxy();
    assert!(serves(&c, &["web-a", "web-b"]), "initial rotation");
    c
}

/// Whether ClusterIP traffic from the client, in every family and protocol, reaches exactly the
/// pods `expected` (15 probes each).
fn serves(c: &Cluster, expected: &[&str]) -> bool {
    FAMILIES.iter().all(|family| {
        PROTOS.iter().all(|&proto| reached(&c.client.ns, proto, at(family.cluster_ip(WEB)), 15) == names(expected))
    })
}

/// Waits until `web` serves exactly `expected`, failing with the proxy's log otherwise.
fn settles_on(c: &Cluster, expected: &[&str]) {
    assert!(
        eventually(settle(), || serves(c, expected)),
        "web never served only {expected:?}; proxy log:\n{}",
        c.proxy_log()
    );
}

fn a_new_pod_joins_the_rotation(backend: Backend) {
    let mut c = watched_web("rk-wup", backend);
    c.add_pod("web-c", "app: web", NODE);
    settles_on(&c, &["web-a", "web-b", "web-c"]);
}

fn a_deleted_pod_leaves_the_rotation(backend: Backend) {
    let c = watched_web("rk-wdown", backend);
    c.remove("pod-web-b.yaml");
    settles_on(&c, &["web-a"]);
}

fn a_relabelled_pod_leaves_the_rotation(backend: Backend) {
    let c = watched_web("rk-wlabel", backend);
    c.update_pod(1, "app: removed", NODE, PodState::Ready);
    settles_on(&c, &["web-a"]);
}

fn a_pod_that_turns_not_ready_leaves_the_rotation(backend: Backend) {
    let c = watched_web("rk-wready", backend);
    c.update_pod(1, "app: web", NODE, PodState::NotReady);
    settles_on(&c, &["web-a"]);
}

fn a_deleted_service_stops_answering(backend: Backend) {
    let c = watched_web("rk-wsvc", backend);
    c.write(
        "service-cidr.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\n\
         spec: {cidrs: [10.96.0.0/12, \"fd00:96::/108\"]}\n",
    );
    c.remove("web.yaml");
    let targets: Vec<_> = FAMILIES.iter().map(|f| at(f.cluster_ip(WEB))).collect();
    let gone =
        eventually(settle(), || targets.iter().all(|&t| probe(&c.client.ns, Proto::Tcp, t) == ProbeResult::Timeout));
    assert!(gone, "ClusterIPs still open; proxy log:\n{}", c.proxy_log());
    // Unallocated addresses inside a ServiceCIDR are dropped.
    assert_outcome(&c.client.ns, &cases(&targets), &ProbeResult::Timeout);
}

fn a_table_deleted_by_someone_else_is_restored(backend: Backend) {
    let c = watched_web("rk-wrepair", backend);
    c.wipe_rules();
    // Every family and protocol (eBPF mode attaches its programs one after another).
    let all = cases(&FAMILIES.map(|family| at(family.cluster_ip(WEB))));
    let back = eventually(settle(), || {
        all.iter().all(|&(proto, target)| matches!(probe(&c.client.ns, proto, target), ProbeResult::Reply(_)))
    });
    assert!(back, "table not restored; proxy log:\n{}", c.proxy_log());
    assert!(serves(&c, &["web-a", "web-b"]));
}

fn sigterm_stops_the_proxy_cleanly_and_leaves_the_rules_in_place(backend: Backend) {
    let c = watched_web("rk-term", backend);
    let status = c.proxy().terminate(std::time::Duration::from_secs(5)).expect("proxy stops on SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", c.proxy_log());
    assert!(serves(&c, &["web-a", "web-b"]), "the rules outlive the proxy");
}

/// 120 selector-less IPv4 Services of 10 endpoints each (ClusterIPs 10.96.1.0-10.96.1.119,
/// endpoints that do not exist): 1,200 endpoints, past iptables' large cluster mode threshold.
fn filler() -> String {
    let mut out = String::new();
    for i in 0..120 {
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: filler-{i}, namespace: default}}\n\
             spec: {{clusterIP: 10.96.1.{i}, ports: [{{port: 80}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: filler-{i}-1, namespace: default, labels: {{kubernetes.io/service-name: filler-{i}}}}}\n\
             addressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n"
        ));
        for e in 1..=10 {
            out.push_str(&format!("- {{addresses: [10.250.{i}.{e}]}}\n"));
        }
    }
    out
}

/// Crossing 1,000 endpoints (iptables: large cluster mode, a full sync without the per-Service
/// chains' comments) and coming back, while pods come and go.
fn a_node_crossing_a_thousand_endpoints_keeps_following_its_pods(backend: Backend) {
    let mut c = watched_web("rk-wlarge", backend);
    c.write("filler.yaml", &filler());
    c.add_pod("web-c", "app: web", NODE);
    settles_on(&c, &["web-a", "web-b", "web-c"]);
    if backend.mode() == "iptables" {
        let nat = c.node_output(&["iptables-save", "-t", "nat"]);
        let seps: Vec<&str> = nat.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).collect();
        assert!(seps.len() > 2000 && seps.iter().all(|l| !l.contains("comment")), "{nat}");
    }
    c.remove("pod-web-b.yaml");
    settles_on(&c, &["web-a", "web-c"]);
    c.remove("filler.yaml");
    c.remove("pod-web-c.yaml");
    settles_on(&c, &["web-a"]);
    if backend.mode() == "iptables" {
        let nat = c.node_output(&["iptables-save", "-t", "nat"]);
        let seps: Vec<&str> = nat.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).collect();
        assert!(!seps.is_empty() && seps.iter().all(|l| l.contains("--comment \"default/web")), "{nat}");
    }
}

/// New TCP connections to `web`'s ClusterIPs, both families in turn, one after another from a
/// second handle on the client's namespace (in the client's cgroup, if any) until `stop`: how
/// many were made and what each failed one got instead of an echo.
fn connect_until(c: &Cluster, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    let ns = Netns::open(c.client.ns.name());
    if let Some(cgroup) = &c.node_cgroup {
        ns.place_in(cgroup.clone());
    }
    let targets: Vec<_> = FAMILIES.iter().map(|f| at(f.cluster_ip(WEB))).collect();
    std::thread::spawn(move || {
        ns.run(|| {
            let (mut made, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let target = targets[made % targets.len()];
                match roadkeeper_netlab::probe::tcp(target, probe_timeout()) {
                    ProbeResult::Reply(_) => {}
                    other => failed.push(format!("connection {made} to {target}: {other:?}")),
                }
                made += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            (made, failed)
        })
    })
}

/// Upstream's promise for rolling updates: while a Service grows from 3 to 5 pods, two of them
/// terminate gracefully (Terminating, still serving, then deleted) and the proxy is restarted
/// (SIGTERM, then a new one adopting what the old one left), every new connection is answered.
fn no_new_connection_fails_while_pods_go_three_five_three_and_the_proxy_restarts(backend: Backend) {
    let mut c = watched_web("rk-wchurn", backend);
    c.add_pod("web-c", "app: web", NODE);
    settles_on(&c, &["web-a", "web-b", "web-c"]);
    let stop = Arc::new(AtomicBool::new(false));
    let client = connect_until(&c, stop.clone());

    let d = c.add_pod("web-d", "app: web", NODE);
    let e = c.add_pod("web-e", "app: web", NODE);
    settles_on(&c, &["web-a", "web-b", "web-c", "web-d", "web-e"]);
    for pod in [d, e] {
        c.update_pod(pod, "app: web", NODE, PodState::Terminating);
    }
    settles_on(&c, &["web-a", "web-b", "web-c"]);
    c.remove("pod-web-d.yaml");
    c.remove("pod-web-e.yaml");
    settles_on(&c, &["web-a", "web-b", "web-c"]);

    let status = c.proxy().terminate(std::time::Duration::from_secs(5)).expect("proxy stops on SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", c.proxy_log());
    std::thread::sleep(std::time::Duration::from_millis(500));
    c.start_fast_proxy();
    c.update_pod(0, "app: removed", NODE, PodState::Ready);
    settles_on(&c, &["web-b", "web-c"]);

    stop.store(true, Ordering::Relaxed);
    let (made, failed) = client.join().expect("the client thread");
    assert!(made >= 50, "only {made} connections were made");
    assert!(failed.is_empty(), "{} of {made} new connections failed:\n{}", failed.len(), failed.join("\n"));
}
