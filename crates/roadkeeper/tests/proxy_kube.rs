//! The proxy fed by a real Kubernetes control plane (etcd, kube-apiserver and
//! kube-controller-manager built from tests/k8s, running in the lab node), with real packets:
//! objects created with kubectl become rules and go away when deleted, using only the RBAC of
//! deploy/; a relist after `410 Gone` converges to what a fresh start programs; an API server
//! that goes away leaves the rules untouched and is reconnected to.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::http::*;
use common::*;
use roadkeeper_netlab::ProbeResult;

per_backend!(kubectl_objects_become_rules_and_go_away_with_only_the_deployed_rbac);

/// Service number of `web`: ClusterIPs 10.96.0.50 / fd00:96::50 (the API server owns 10.96.0.1).
const WEB: u8 = 50;
/// A second Service, for changes made while the proxy cannot see them.
const OTHER: u8 = 51;
/// How long a change in the API server may take to reach the kernel (controller included),
/// times [`slowdown`] under emulation.
fn api_settle() -> std::time::Duration {
    std::time::Duration::from_secs(20) * slowdown()
}

/// Whether ClusterIP traffic to Service `n` from the client, in every family and protocol,
/// reaches exactly the pods `expected`.
fn serves(c: &Cluster, n: u8, expected: &[&str]) -> bool {
    FAMILIES.iter().all(|family| {
        PROTOS.iter().all(|&proto| reached(&c.client.ns, proto, at(family.cluster_ip(n)), 15) == names(expected))
    })
}

/// Waits until Service `n` serves exactly `expected`, else panics with the proxy's log.
fn wait_serving(c: &Cluster, n: u8, expected: &[&str]) {
    let ok = eventually(api_settle(), || {
        FAMILIES.iter().all(|f| matches!(probe(&c.client.ns, Proto::Tcp, at(f.cluster_ip(n))), ProbeResult::Reply(_)))
            && serves(c, n, expected)
    });
    assert!(ok, "Service {n} does not serve {expected:?}; proxy log:\n{}", c.proxy_log());
}

/// The documents of deploy/roadkeeper.yaml of the given kinds.
fn deployed(kinds: &[&str]) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/roadkeeper.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/roadkeeper.yaml");
    let documents = text.split("\n---").filter(|d| kinds.iter().any(|k| d.contains(&format!("\nkind: {k}\n"))));
    documents.collect::<Vec<_>>().join("\n---\n")
}

/// Runs the proxy as the ServiceAccount of deploy/ (its ClusterRole and binding applied): a
/// token from the TokenRequest API, as the kubelet would mount it.
fn use_deployed_identity(c: &mut Cluster) {
    let api = c.api();
    api.kubectl_stdin(&["apply", "-f", "-"], &deployed(&["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]));
    let token = api.kubectl(&["-n", "kube-system", "create", "token", "roadkeeper"]);
    let kubeconfig = api.kubeconfig_with_token(token.trim());
    // Least privilege, as the API server sees it: list and watch what the proxy reads, nothing
    // else beyond what every authenticated user may do (discovery, self reviews).
    let rules = api.kubectl(&["auth", "can-i", "--list", "--as=system:serviceaccount:kube-system:roadkeeper"]);
    let granted: BTreeMap<&str, &str> = rules
        .lines()
        .skip(1)
        .filter_map(|line| {
            let resource = line.split_whitespace().next().filter(|r| !r.starts_with('['))?;
            Some((resource, line.rsplit_once(" [")?.1))
        })
        .filter(|(resource, _)| !resource.starts_with("selfsubject"))
        .collect();
    let expected = ["services", "endpointslices.discovery.k8s.io", "nodes", "servicecidrs.networking.k8s.io"];
    assert_eq!(granted, expected.into_iter().map(|r| (r, "list watch]")).collect(), "{rules}");
    c.kubeconfig = Some(kubeconfig);
}

fn kubectl_objects_become_rules_and_go_away_with_only_the_deployed_rbac(backend: Backend) {
    let mut c = Cluster::with_api("rk-kube", backend);
    use_deployed_identity(&mut c);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.start_fast_proxy();
    // The EndpointSlices come from kube-controller-manager, with the trigger-time annotation.
    wait_serving(&c, WEB, &["web-a"]);
    let slices = c.api().kubectl(&["get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "yaml"]);
    assert!(slices.contains("endpointslice-controller.k8s.io"), "{slices}");
    // (IPVS names no Service: its virtual server is the ClusterIP; eBPF mode's maps neither:
    // its frontend is.)
    let web = match backend {
        Backend::Ipvs => format!("{}:80", Family::V4.cluster_ip(WEB)),
        Backend::Ebpf => format!("{}:80/tcp", Family::V4.cluster_ip(WEB)),
        _ => "default/web".into(),
    };
    assert!(c.kernel_rules().contains(&web), "{}", c.kernel_rules());

    c.add_pod("web-b", "app: web", NODE);
    wait_serving(&c, WEB, &["web-a", "web-b"]);
    let (_, metrics) = get(&c, "127.0.0.1:10249", "/metrics");
    let programmed = sample(&metrics, "kubeproxy_network_programming_duration_seconds_count");
    assert!(programmed >= 1.0, "no network programming latency observed:\n{metrics}");
    assert!(sample(&metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 1.0, "{metrics}");

    c.remove("web.yaml");
    let gone = eventually(api_settle(), || !c.kernel_rules().contains(&web));
    assert!(gone, "rules of a deleted Service stay; proxy log:\n{}", c.proxy_log());
    for family in FAMILIES {
        let result = probe(&c.client.ns, Proto::Tcp, at(family.cluster_ip(WEB)));
        assert!(!matches!(result, ProbeResult::Reply(_)), "{family:?}: a deleted Service answers: {result:?}");
    }
    let log = c.proxy_log();
    assert!(!log.contains("forbidden"), "the deployed ClusterRole is not enough:\n{log}");
}

/// Through the API server (the informer path of upstream's e2e "should implement
/// service.kubernetes.io/headless"): a Service labelled `service.kubernetes.io/headless` gets no
/// rules though kube-controller-manager gives it EndpointSlices, and gets them once the label is
/// removed with kubectl.
#[test]
fn a_service_labelled_headless_in_the_api_server_is_proxied_only_without_the_label() {
    let mut c = Cluster::with_api("rk-khdl", Backend::Nftables);
    c.add_pod("web-a", "app: web", NODE);
    c.add_pod("other-a", "app: other", NODE);
    let other = |labels: &str| with_labels(&service_manifest("other", OTHER, ""), labels);
    c.write("other.yaml", &other("service.kubernetes.io/headless: \"\""));
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.start_fast_proxy();
    wait_serving(&c, WEB, &["web-a"]);
    let sliced = eventually(api_settle(), || {
        c.api()
            .kubectl(&["get", "endpointslices", "-l", "kubernetes.io/service-name=other", "-o", "name"])
            .contains('/')
    });
    assert!(sliced, "kube-controller-manager made no EndpointSlice for the labelled Service");
    // Several syncs (100 ms apart at least) after the slices came.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(!c.kernel_rules().contains("default/other"), "rules for a Service labelled headless");
    for family in FAMILIES {
        let result = probe(&c.client.ns, Proto::Tcp, at(family.cluster_ip(OTHER)));
        assert!(!matches!(result, ProbeResult::Reply(_)), "{family:?}: a Service labelled headless answers");
    }
    c.write("other.yaml", &other("app: other"));
    wait_serving(&c, OTHER, &["other-a"]);
}

#[test]
fn a_relist_after_410_gone_converges_to_what_a_fresh_start_programs() {
    let mut c = Cluster::with_api("rk-gone", Backend::Nftables);
    c.add_pod("web-a", "app: web", NODE);
    c.add_pod("web-b", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.write("other.yaml", &service_manifest("other", OTHER, ""));
    c.start_fast_proxy();
    wait_serving(&c, WEB, &["web-a", "web-b"]);

    // Freeze the proxy, restart the API server (its watch cache starts over) and change things
    // it will not see as events: a Service and a pod go away, then etcd is compacted. The
    // proxy's watches can then only resume with 410 Gone, and it must relist.
    let pid = c.proxy().id().to_string();
    let signal = |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().expect("kill").success());
    signal("-STOP");
    c.api.as_mut().expect("api").stop_apiserver();
    c.api.as_mut().expect("api").start_apiserver();
    c.remove("other.yaml");
    c.remove("pod-web-b.yaml");
    c.api().compact_etcd();
    signal("-CONT");
    wait_serving(&c, WEB, &["web-a"]);
    let gone = eventually(api_settle(), || !c.kernel_rules().contains("default/other"));
    assert!(gone, "a Service deleted during the outage stays; proxy log:\n{}", c.proxy_log());
    assert!(c.proxy_log().contains("relisted"), "no relist; proxy log:\n{}", c.proxy_log());
    let relisted = c.ruleset();

    // A fresh start on a clean node programs exactly the same.
    c.proxy().terminate(std::time::Duration::from_secs(5)).expect("stop the proxy");
    let out = c.roadkeeper(&["cleanup"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.proxy_once(&[]);
    assert_eq!(relisted, c.ruleset(), "the relisted rules differ from a fresh start's");
}

#[test]
fn rules_stay_while_the_api_server_is_away_and_it_is_reconnected_to() {
    let mut c = Cluster::with_api("rk-away", Backend::Nftables);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.start_fast_proxy();
    wait_serving(&c, WEB, &["web-a"]);
    let before = c.ruleset();

    c.api.as_mut().expect("api").stop_apiserver();
    // Several sync and health-check periods (2 s) pass without the API server.
    std::thread::sleep(std::time::Duration::from_secs(6));
    assert!(c.proxy().try_wait().expect("poll").is_none(), "the proxy exited; log:\n{}", c.proxy_log());
    assert_eq!(before, c.ruleset(), "rules changed while the API server was away");
    assert!(serves(&c, WEB, &["web-a"]), "traffic stopped while the API server was away");

    c.api.as_mut().expect("api").start_apiserver();
    c.add_pod("web-b", "app: web", NODE);
    c.write("other.yaml", &service_manifest("other", OTHER, ""));
    c.add_pod("other-a", "app: other", NODE);
    wait_serving(&c, WEB, &["web-a", "web-b"]);
    wait_serving(&c, OTHER, &["other-a"]);
}
