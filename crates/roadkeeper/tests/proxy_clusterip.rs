//! ClusterIP Services with real packets, per backend.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use common::*;

per_backend!(
    pod_to_cluster_ip_reaches_every_pod_unmasqueraded_in_both_families,
    host_to_cluster_ip_is_masqueraded,
    ipv4_only_and_ipv6_only_services_live_side_by_side,
    sctp_service_ports_are_programmed,
    services_labelled_headless_are_left_alone_and_follow_the_label,
);

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

fn pod_to_cluster_ip_reaches_every_pod_unmasqueraded_in_both_families(backend: Backend) {
    let mut c = Cluster::new("rk-cip", backend);
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
        assert_eq!(peer, c.client_ip(Family::of(vip)), "pod traffic keeps its source address");
    }
}

fn host_to_cluster_ip_is_masqueraded(backend: Backend) {
    let mut c = Cluster::new("rk-host", backend);
    hello(&mut c);
    c.proxy_once(&[]);
    let (_, peer) = answers(c.lab.node(), Proto::Tcp, "10.96.0.10:80".parse().unwrap(), 3);
    assert_eq!(peer, "10.244.0.1".parse::<IpAddr>().unwrap(), "host traffic leaves via the bridge address");
}

/// A single-family Service `name` with ClusterIP `ip`, selecting `app: hello`, port 80/TCP.
fn single_family(name: &str, ip: IpAddr) -> String {
    let family = Family::of(ip);
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: \"{ip}\", ipFamilies: [{}], \
         selector: {{app: hello}}, ports: [{{port: 80, targetPort: {ECHO_PORT}}}]}}\n",
        family.k8s()
    )
}

fn ipv4_only_and_ipv6_only_services_live_side_by_side(backend: Backend) {
    let mut c = Cluster::new("rk-1fam", backend);
    c.add_pod("hello-a", "app: hello", NODE);
    let (v4, v6) = (Family::V4.cluster_ip(30), Family::V6.cluster_ip(31));
    c.write("v4.yaml", &single_family("only-v4", v4));
    c.write("v6.yaml", &single_family("only-v6", v6));
    c.proxy_once(&[]);
    for vip in [v4, v6] {
        answers(&c.client.ns, Proto::Tcp, at(vip), 3);
    }
    let table = |family: Family, name: &str| {
        String::from_utf8_lossy(&c.nft(&["list", "table", family.nft(), name]).stdout).into_owned()
    };
    let rules = |family: Family| match backend {
        Backend::Nftables => table(family, "roadkeeper"),
        Backend::Iptables => c.node_output(&[if family == Family::V4 { "iptables-save" } else { "ip6tables-save" }]),
        // The helper table of each family holds its own family's frontends (no Service names).
        Backend::Ipvs => table(family, "roadkeeper-ipvs"),
        // One listing of both families' frontends: an IPv6 one starts with `[`.
        Backend::Ebpf => {
            let v6 = family == Family::V6;
            let ours = |l: &&str| if v6 { l.starts_with('[') } else { l.starts_with(|c: char| c.is_ascii_digit()) };
            c.kernel_rules().lines().filter(ours).collect::<Vec<_>>().join("\n")
        }
    };
    let (only_v4, only_v6) = match backend {
        Backend::Ipvs => (format!("{v4} . tcp . 80"), format!("{v6} . tcp . 80")),
        Backend::Ebpf => (format!("{v4}:80/tcp"), format!("[{v6}]:80/tcp")),
        _ => ("default/only-v4".to_string(), "default/only-v6".to_string()),
    };
    let (ip, ip6) = (rules(Family::V4), rules(Family::V6));
    assert!(ip.contains(&only_v4) && !ip.contains(&only_v6), "{ip}");
    assert!(ip6.contains(&only_v6) && !ip6.contains(&only_v4), "{ip6}");
}

fn sctp_service_ports_are_programmed(backend: Backend) {
    let mut c = Cluster::new("rk-sctp", backend);
    c.add_pod("hello-a", "app: hello", NODE);
    c.write(
        "sctp.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: assoc}\nspec: {clusterIP: 10.96.0.70, selector: {app: hello}, \
         ports: [{port: 9999, targetPort: 8080, protocol: SCTP}]}\n",
    );
    c.proxy_once(&[]);
    // The lab has no SCTP sockets to probe with, so check the dispatch and DNAT rules instead.
    let pod = c.pod_ip(0, Family::V4);
    let (dispatch, dnat) = match backend {
        Backend::Nftables => (
            "10.96.0.70 . sctp . 9999".to_string(),
            format!("10.96.0.70 . sctp . 9999 . 0 comment \"default/assoc\" : {pod} . 8080"),
        ),
        Backend::Iptables => (
            "-d 10.96.0.70/32 -p sctp -m comment --comment \"default/assoc cluster IP\" -m sctp --dport 9999"
                .to_string(),
            format!("-p sctp -m comment --comment \"default/assoc\" -m sctp -j DNAT --to-destination {pod}:8080"),
        ),
        Backend::Ipvs => ("SCTP 10.96.0.70:9999 rr".to_string(), format!("  -> {pod}:8080")),
        Backend::Ebpf => ("10.96.0.70:9999/sctp".to_string(), format!("{pod}:8080 (")),
    };
    let rules = c.kernel_rules();
    assert!(rules.contains(&dispatch), "no `{dispatch}` in:\n{rules}");
    assert!(rules.contains(&dnat), "no `{dnat}` in:\n{rules}");
}

/// nftables only: `rules` prints an nft script there (for iptables, `iptables-restore` input).
#[test]
fn the_script_printed_by_rules_is_what_the_proxy_applies() {
    let mut c = Cluster::new("rk-rules", Backend::Nftables);
    hello(&mut c);
    let args = c.proxy_args_for("rules", &[]);
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(c.ruleset().trim().is_empty(), "`rules` touches nothing");
    let script = c.scratch_file("rules.nft", &String::from_utf8_lossy(&out.stdout));
    let applied = c.nft(&["-f", &script]);
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    let by_hand = c.ruleset();
    let (names, _) = answers(&c.client.ns, Proto::Tcp, "10.96.0.10:80".parse().unwrap(), 30);
    assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), 3, "{names:?}");
    c.roadkeeper(&["cleanup"]);
    c.proxy_once(&[]);
    assert_eq!(c.ruleset(), by_hand, "the proxy programs exactly what `rules` prints");
}

/// The label kube-proxy's informers select against.
const HEADLESS: &str = "service.kubernetes.io/headless: \"\"";

/// Whether a TCP probe from the client to `target` gets an answer.
fn answered(c: &Cluster, target: SocketAddr) -> bool {
    matches!(probe(&c.client.ns, Proto::Tcp, target), roadkeeper_netlab::ProbeResult::Reply(_))
}

/// As kube-proxy's informers (`!service.kubernetes.io/headless`), a Service labelled
/// `service.kubernetes.io/headless` is not proxied even with a ClusterIP; adding and removing the
/// label on a live Service turns its ClusterIP off and on, while one labelled from the start stays
/// off (upstream's e2e "should implement service.kubernetes.io/headless").
fn services_labelled_headless_are_left_alone_and_follow_the_label(backend: Backend) {
    let mut c = Cluster::new("rk-hdls", backend);
    c.add_pod("toggled-a", "app: toggled", NODE);
    c.add_pod("always-a", "app: always", NODE);
    c.write("always.yaml", &with_labels(&service_manifest("always", 46, ""), HEADLESS));
    let toggled = |labels: &str| with_labels(&service_manifest("toggled", 45, ""), labels);
    c.write("toggled.yaml", &toggled(HEADLESS));
    c.start_fast_proxy();
    let (toggled_ips, always_ips) = (FAMILIES.map(|f| at(f.cluster_ip(45))), FAMILIES.map(|f| at(f.cluster_ip(46))));
    let off = |c: &Cluster| toggled_ips.iter().chain(&always_ips).all(|&t| !answered(c, t));
    assert!(off(&c), "a Service labelled headless answered; proxy log:\n{}", c.proxy_log());

    c.write("toggled.yaml", &toggled("app: toggled"));
    let on = eventually(settle(), || toggled_ips.iter().all(|&t| answered(&c, t)));
    assert!(on, "the label went, the Service stayed off; proxy log:\n{}", c.proxy_log());
    assert!(always_ips.iter().all(|&t| !answered(&c, t)), "the Service labelled from the start answered");

    c.write("toggled.yaml", &toggled(HEADLESS));
    assert!(
        eventually(settle(), || off(&c)),
        "the label came back, the Service stayed on; proxy log:\n{}",
        c.proxy_log()
    );
}
