//! Packet-flow tests without root: every behaviour of the end-to-end suite
//! (`crates/roadkeeper/tests/proxy_*.rs`), in every backend ([`BACKENDS`]: nftables, iptables,
//! IPVS and eBPF) and both families, answered by the tracer over the rules (eBPF mode: the maps)
//! a full sync programs. Each test names the end-to-end test it mirrors.
//!
//! eBPF mode translates the node's own connections at the socket ([`uses_sockets`]): where that
//! legitimately differs from the packet-level modes, a test asserts eBPF mode's outcome, as the
//! end-to-end suite does (no masquerading of the node's and its pods' connections, `connect()`
//! failing with EHOSTUNREACH where the others drop).
//!
//! Cases that do not apply to IPVS and eBPF mode, and why:
//! - `unallocated_addresses_of_a_service_cidr_are_dropped`: neither plans anything for the
//!   unallocated addresses of a ServiceCIDR (nor does upstream's IPVS proxier): such a packet is
//!   routed on unchanged, which the test checks for them instead;
//! - `a_path_shows_every_chain_and_rule_in_order_with_the_map_element_that_matched`: it checks
//!   the nftables and iptables listings of one path (IPVS mode's steps are checked in
//!   `trace::ipvs::tests`).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::lab::*;
use super::{Delivery, Fate, Path, Verdict};
use crate::config::{NodePortAddresses, ProxyMode};
use crate::table::{IpFamily, Protocol};

/// Whether `mode` translates the node's own connections (its pods' and host processes') at the
/// socket: no NAT of their packets, so nothing to masquerade.
fn uses_sockets(mode: ProxyMode) -> bool {
    mode == ProxyMode::Ebpf
}

/// Every backend, family and protocol.
fn each(mut case: impl FnMut(ProxyMode, IpFamily, Protocol)) {
    for mode in BACKENDS {
        for family in FAMILIES {
            for protocol in PROTOCOLS {
                case(mode, family, protocol);
            }
        }
    }
}

/// `web-a`, `web-b`, ... as `app: web` pods on this node.
fn web_pods(lab: &mut Lab, names: &[&str]) {
    for name in names {
        lab.pod(name, "app: web", NODE, PodState::Ready);
    }
}

// proxy_clusterip.rs

/// `hello` of proxy_clusterip.rs: three pods, port 80/TCP `http` and 53/UDP `dns`.
fn hello() -> Lab {
    let mut lab = Lab::new();
    for name in ["hello-a", "hello-b", "hello-c"] {
        lab.pod(name, "app: hello", NODE, PodState::Ready);
    }
    lab.write(
        "apiVersion: v1\nkind: Service\nmetadata: {name: hello, namespace: default}\nspec:\n  clusterIPs: [10.96.0.10, \"fd00:96::10\"]\n  ipFamilies: [IPv4, IPv6]\n  selector: {app: hello}\n  ports:\n  - {name: http, port: 80, targetPort: http}\n  - {name: dns, port: 53, targetPort: 8080, protocol: UDP}\n",
    );
    lab
}

#[test]
fn pod_to_cluster_ip_reaches_every_pod_unmasqueraded_in_both_families() {
    let lab = hello();
    for mode in BACKENDS {
        for family in FAMILIES {
            for (protocol, port) in [(Protocol::Tcp, 80), (Protocol::Udp, 53)] {
                let to = SocketAddr::new(cluster_ip(family, 10), port);
                let trace = lab.trace(mode, From::Pod(0), to, protocol);
                assert_eq!(lab.reaches(&trace), (names(&["hello-a", "hello-b", "hello-c"]), false), "{mode:?} {to}");
                for (_, probability) in trace.fates() {
                    assert!((probability - 1.0 / 3.0).abs() < 1e-9, "{mode:?} {to}: uniform: {probability}");
                }
            }
        }
    }
}

#[test]
fn host_to_cluster_ip_is_masqueraded() {
    let lab = hello();
    for mode in BACKENDS {
        let trace = lab.trace(mode, From::Host, "10.96.0.10:80".parse().unwrap(), Protocol::Tcp);
        if uses_sockets(mode) {
            assert!(!lab.reaches(&trace).1, "{mode:?}: the socket leaves with the node's own address");
            continue;
        }
        assert!(lab.reaches(&trace).1, "{mode:?}");
        let masquerade = trace.paths[0].masquerade.as_ref().unwrap();
        let why: Vec<&str> = masquerade.marked_by.iter().map(|r| r.rule.as_str()).collect();
        let expected = match mode {
            ProxyMode::Nftables => "ip daddr @cluster-ips jump mark-if-not-pod-traffic",
            ProxyMode::Iptables => "! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp",
            ProxyMode::Ipvs => {
                "ip saddr != { 10.244.0.0/16 } ip daddr . meta l4proto . th dport @cluster-ips meta mark set"
            }
            ProxyMode::Ebpf => unreachable!("BACKENDS has the traced modes"),
        };
        assert!(why.iter().any(|r| r.contains(expected)), "{mode:?}: {why:?}");
    }
}

#[test]
fn ipv4_only_and_ipv6_only_services_live_side_by_side() {
    let mut lab = Lab::new();
    lab.pod("hello-a", "app: hello", NODE, PodState::Ready);
    for (name, ip, family) in [("only-v4", "10.96.0.30", "IPv4"), ("only-v6", "fd00:96::31", "IPv6")] {
        lab.write(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: \"{ip}\", ipFamilies: [{family}], selector: {{app: hello}}, ports: [{{port: 80, targetPort: 8080}}]}}\n"
        ));
    }
    for mode in BACKENDS {
        for to in [at(cluster_ip(IpFamily::V4, 30)), at(cluster_ip(IpFamily::V6, 31))] {
            let trace = lab.trace(mode, From::Pod(0), to, Protocol::Tcp);
            assert_eq!(lab.reaches(&trace).0, names(&["hello-a"]), "{mode:?} {to}");
        }
        // Neither Service has the other family: its address there is nobody's.
        for to in [at(cluster_ip(IpFamily::V6, 30)), at(cluster_ip(IpFamily::V4, 31))] {
            let trace = lab.trace(mode, From::Pod(0), to, Protocol::Tcp);
            let fate = Fate::Delivered { delivery: Delivery::Forwarded, dnat: None, masqueraded: false };
            assert_eq!(only_fate(&trace), fate, "{mode:?} {to}");
        }
    }
}

#[test]
fn sctp_service_ports_are_programmed() {
    let mut lab = Lab::new();
    let pod = lab.pod("hello-a", "app: hello", NODE, PodState::Ready);
    lab.write("apiVersion: v1\nkind: Service\nmetadata: {name: assoc, namespace: default}\nspec: {clusterIP: 10.96.0.70, selector: {app: hello}, ports: [{port: 9999, targetPort: 8080, protocol: SCTP}]}\n");
    for mode in BACKENDS {
        let trace = lab.trace(mode, From::Pod(0), "10.96.0.70:9999".parse().unwrap(), Protocol::Sctp);
        assert_eq!(trace.paths[0].dnat, Some(SocketAddr::new(lab.pod_ip(pod, IpFamily::V4), ECHO)), "{mode:?}");
    }
}

// proxy_external.rs

/// Service number of `web` in proxy_external.rs, its externalIP and load-balancer IP hosts.
const WEB: u8 = 80;
const EXTERNAL_IP: u8 = 7;
const LB_IP: u8 = 9;

/// proxy_external.rs's `load_balancer(extra)`: a LoadBalancer `web` with externalIPs and
/// load-balancer ingress IPs.
fn load_balancer(lab: &mut Lab, extra: &str) {
    let (v4, v6) = (IpFamily::V4, IpFamily::V6);
    let spec = format!(
        "type: LoadBalancer, externalIPs: [{}, \"{}\"], {extra}",
        external_ip(v4, EXTERNAL_IP),
        external_ip(v6, EXTERNAL_IP)
    );
    let status = format!(
        "status: {{loadBalancer: {{ingress: [{{ip: {}}}, {{ip: \"{}\"}}]}}}}\n",
        external_ip(v4, LB_IP),
        external_ip(v6, LB_IP)
    );
    lab.write(&(service_yaml("web", WEB, &format!("selector: {{app: web}}, {spec}")) + &status));
}

/// The NodePort, externalIP and load-balancer IP of `web`.
fn external_frontends(family: IpFamily) -> [SocketAddr; 3] {
    [
        SocketAddr::new(node_ip(family), node_port(WEB)),
        at(external_ip(family, EXTERNAL_IP)),
        at(external_ip(family, LB_IP)),
    ]
}

fn local_and_remote_pods(lab: &mut Lab) {
    lab.pod("web-local", "app: web", NODE, PodState::Ready);
    lab.pod("web-remote", "app: web", "node-b", PodState::Ready);
}

#[test]
fn node_port_from_outside_reaches_every_pod_masqueraded() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a", "web-b"]);
    lab.service("web", WEB, "type: NodePort");
    each(|mode, family, protocol| {
        let to = SocketAddr::new(node_ip(family), node_port(WEB));
        let trace = lab.trace(mode, From::External, to, protocol);
        assert_eq!(lab.reaches(&trace), (names(&["web-a", "web-b"]), true), "{mode:?} {protocol:?} {to}");
    });
}

#[test]
fn external_and_load_balancer_ips_from_outside_reach_the_service_masqueraded() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    load_balancer(&mut lab, "");
    each(|mode, family, protocol| {
        for to in [at(external_ip(family, EXTERNAL_IP)), at(external_ip(family, LB_IP))] {
            let trace = lab.trace(mode, From::External, to, protocol);
            assert_eq!(lab.reaches(&trace), (names(&["web-a"]), true), "{mode:?} {protocol:?} {to}");
        }
    });
}

#[test]
fn external_traffic_to_a_local_policy_service_reaches_only_local_endpoints_and_keeps_the_client_ip() {
    let mut lab = Lab::new();
    local_and_remote_pods(&mut lab);
    load_balancer(&mut lab, "externalTrafficPolicy: Local");
    each(|mode, family, protocol| {
        for to in external_frontends(family) {
            let trace = lab.trace(mode, From::External, to, protocol);
            assert_eq!(lab.reaches(&trace), (names(&["web-local"]), false), "{mode:?} {protocol:?} {to}");
        }
    });
}

#[test]
fn pod_traffic_to_external_frontends_of_a_local_policy_service_reaches_every_endpoint() {
    let mut lab = Lab::new();
    local_and_remote_pods(&mut lab);
    load_balancer(&mut lab, "externalTrafficPolicy: Local");
    each(|mode, family, protocol| {
        for to in external_frontends(family) {
            let trace = lab.trace(mode, From::Pod(0), to, protocol);
            assert_eq!(lab.reaches(&trace).0, names(&["web-local", "web-remote"]), "{mode:?} {protocol:?} {to}");
        }
    });
}

#[test]
fn external_traffic_to_a_local_policy_service_without_local_endpoints_is_dropped_but_pods_and_host_are_served() {
    let mut lab = Lab::new();
    lab.pod("web-remote", "app: web", "node-b", PodState::Ready);
    load_balancer(&mut lab, "externalTrafficPolicy: Local");
    each(|mode, family, protocol| {
        for to in external_frontends(family) {
            let trace = lab.trace(mode, From::External, to, protocol);
            assert_eq!(only_fate(&trace), Fate::Dropped, "{mode:?} {protocol:?} {to}");
        }
        let mut targets = external_frontends(family).to_vec();
        targets.push(at(cluster_ip(family, WEB)));
        for to in targets {
            for from in [From::Pod(0), From::Host] {
                let trace = lab.trace(mode, from, to, protocol);
                assert_eq!(lab.reaches(&trace).0, names(&["web-remote"]), "{mode:?} {protocol:?} {to} {from:?}");
            }
        }
    });
}

#[test]
fn load_balancer_source_ranges_drop_other_sources_but_not_the_node_port() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    load_balancer(&mut lab, "loadBalancerSourceRanges: [198.51.100.0/24, \"2001:db8:1::/64\"]");
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::External, at(external_ip(family, LB_IP)), protocol);
        assert_eq!(only_fate(&trace), Fate::Dropped, "{mode:?} {protocol:?}");
        for to in [SocketAddr::new(node_ip(family), node_port(WEB)), at(external_ip(family, EXTERNAL_IP))] {
            let trace = lab.trace(mode, From::External, to, protocol);
            assert_eq!(lab.reaches(&trace).0, names(&["web-a"]), "{mode:?} {protocol:?} {to}");
        }
    });
}

#[test]
fn load_balancer_source_ranges_admit_listed_sources() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    load_balancer(&mut lab, "loadBalancerSourceRanges: [192.168.77.0/24, \"fd00:77::/64\"]");
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::External, at(external_ip(family, LB_IP)), protocol);
        assert_eq!(lab.reaches(&trace).0, names(&["web-a"]), "{mode:?} {protocol:?}");
    });
}

#[test]
fn node_ports_listen_on_the_modes_default_addresses_and_on_every_address_with_0_0_0_0_slash_0() {
    let mut lab = Lab::new();
    lab.extra_addresses = vec!["192.168.77.3".parse().unwrap(), "fd00:77::3".parse().unwrap()];
    web_pods(&mut lab, &["web-a"]);
    lab.service("web", WEB, "type: NodePort");
    let second = |family| match family {
        IpFamily::V4 => SocketAddr::new("192.168.77.3".parse().unwrap(), node_port(WEB)),
        IpFamily::V6 => SocketAddr::new("fd00:77::3".parse().unwrap(), node_port(WEB)),
    };
    let served =
        |lab: &Lab, mode, to| lab.trace(mode, From::External, to, Protocol::Tcp).paths.iter().all(|p| p.dnat.is_some());
    for mode in BACKENDS {
        for family in FAMILIES {
            assert!(served(&lab, mode, SocketAddr::new(node_ip(family), node_port(WEB))));
            // As kube-proxy: nftables mode defaults to the primary IPs, iptables and IPVS modes to
            // every address (eBPF mode reads the nftables section: the primary IPs).
            let every_address = !matches!(mode, ProxyMode::Nftables | ProxyMode::Ebpf);
            assert_eq!(served(&lab, mode, second(family)), every_address, "{mode:?} {family:?}");
        }
    }
    lab.cfg.nodeport_addresses = NodePortAddresses::Primary;
    for mode in BACKENDS {
        for family in FAMILIES {
            assert!(!served(&lab, mode, second(family)), "{mode:?} {family:?}: `primary`");
        }
    }
    lab.cfg.nodeport_addresses = NodePortAddresses::Cidrs(vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()]);
    for mode in BACKENDS {
        for family in FAMILIES {
            for to in [SocketAddr::new(node_ip(family), node_port(WEB)), second(family)] {
                let trace = lab.trace(mode, From::External, to, Protocol::Tcp);
                assert_eq!(lab.reaches(&trace).0, names(&["web-a"]), "{mode:?} {to}");
            }
        }
    }
}

#[test]
fn node_ports_answer_on_localhost_only_in_iptables_mode_while_localhost_nodeports_is_on() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    lab.service("web", WEB, "type: NodePort");
    let localhost = SocketAddr::new("127.0.0.1".parse().unwrap(), node_port(WEB));
    for mode in BACKENDS {
        let trace = lab.trace(mode, From::Host, localhost, Protocol::Tcp);
        let served = trace.paths.iter().all(|p| p.dnat.is_some());
        assert_eq!(served, mode == ProxyMode::Iptables, "{mode:?}");
    }
    lab.cfg.localhost_nodeports = false;
    let trace = lab.trace(ProxyMode::Iptables, From::Host, localhost, Protocol::Tcp);
    assert!(trace.paths.iter().all(|p| p.dnat.is_none()), "--iptables-localhost-nodeports=false");
}

#[test]
fn masquerade_all_keeps_the_source_of_pods_reaching_a_local_policy_service_by_external_frontends() {
    let mut lab = Lab::new();
    lab.pod("web-local", "app: web", NODE, PodState::Ready);
    load_balancer(&mut lab, "externalTrafficPolicy: Local");
    lab.cfg.masquerade_all = true;
    let cidrs = lab.cfg.cluster_cidrs.clone();
    for cluster_cidrs in [cidrs, Vec::new()] {
        lab.cfg.cluster_cidrs = cluster_cidrs;
        each(|mode, family, protocol| {
            for to in external_frontends(family) {
                let trace = lab.trace(mode, From::Pod(0), to, protocol);
                assert!(!lab.reaches(&trace).1, "{mode:?} {protocol:?} {to}: source kept");
            }
            let trace = lab.trace(mode, From::Pod(0), at(cluster_ip(family, WEB)), protocol);
            assert_eq!(lab.reaches(&trace).1, !uses_sockets(mode), "{mode:?} {protocol:?}: ClusterIP masqueraded");
        });
    }
}

// proxy_policies.rs

/// Service number of proxy_policies.rs.
const SVC: u8 = 60;

#[test]
fn client_ip_affinity_sticks_to_one_pod_and_plain_services_spread() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a", "web-b", "web-c"]);
    lab.service("web", SVC, "sessionAffinity: ClientIP");
    each(|mode, family, protocol| {
        let ruleset = lab.ruleset(mode);
        let packet = lab.packet(From::Pod(0), at(cluster_ip(family, SVC)), protocol);
        let first = ruleset.trace(&packet, &lab.environment(BTreeSet::new())).unwrap();
        assert_eq!(lab.reaches(&first).0.len(), 3, "{mode:?} {protocol:?}: a first packet may go anywhere");
        // Every path records its source for its endpoint; a later packet goes there.
        for path in &first.paths {
            let endpoint = path.dnat.unwrap();
            let sets = ruleset.affinity_sets(protocol, endpoint);
            assert_eq!(path.affinity.iter().cloned().collect::<BTreeSet<_>>(), sets, "{mode:?} {endpoint}");
            let later = ruleset.trace(&packet, &lab.environment(sets)).unwrap();
            assert_eq!(later.paths.len(), 1, "{mode:?} {endpoint}: no random choice");
            assert_eq!(later.paths[0].dnat, Some(endpoint), "{mode:?}: affinity keeps the pod");
        }
    });
    let mut plain = Lab::new();
    web_pods(&mut plain, &["web-a", "web-b", "web-c"]);
    plain.service("web", SVC, "");
    each(|mode, family, protocol| {
        let trace = plain.trace(mode, From::Pod(0), at(cluster_ip(family, SVC)), protocol);
        assert_eq!(plain.reaches(&trace).0.len(), 3, "{mode:?} {protocol:?}: spread without affinity");
        assert!(trace.paths.iter().all(|p| p.affinity.is_empty()));
    });
}

#[test]
fn hairpin_traffic_reaches_the_pod_itself_masqueraded() {
    let mut lab = Lab::new();
    let only = lab.pod("web-a", "app: web", NODE, PodState::Ready);
    lab.service("web", SVC, "");
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::Pod(only), at(cluster_ip(family, SVC)), protocol);
        let masqueraded = !uses_sockets(mode);
        assert_eq!(lab.reaches(&trace), (names(&["web-a"]), masqueraded), "{mode:?} {protocol:?}");
    });
}

#[test]
fn masquerade_all_masquerades_pod_traffic_to_cluster_ips() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    lab.service("web", SVC, "");
    lab.cfg.masquerade_all = true;
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::Pod(0), at(cluster_ip(family, SVC)), protocol);
        assert_eq!(lab.reaches(&trace).1, !uses_sockets(mode), "{mode:?} {protocol:?}");
    });
}

#[test]
fn off_cluster_traffic_to_the_cluster_ip_of_an_internal_local_policy_service_is_masqueraded() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    lab.service("web", SVC, "internalTrafficPolicy: Local");
    let cidrs = lab.cfg.cluster_cidrs.clone();
    for (cluster_cidrs, masquerade_all) in
        [(cidrs.clone(), false), (Vec::new(), false), (cidrs, true), (Vec::new(), true)]
    {
        let off_cluster_masqueraded = !cluster_cidrs.is_empty() || masquerade_all;
        lab.cfg.cluster_cidrs = cluster_cidrs;
        lab.cfg.masquerade_all = masquerade_all;
        each(|mode, family, protocol| {
            let at_socket = uses_sockets(mode);
            for (from, masqueraded) in [
                (From::External, off_cluster_masqueraded),
                (From::Host, off_cluster_masqueraded && !at_socket),
                (From::Pod(0), masquerade_all && !at_socket),
            ] {
                let trace = lab.trace(mode, from, at(cluster_ip(family, SVC)), protocol);
                let case = format!("{mode:?} {protocol:?} {family:?} from {from:?}, masquerade-all {masquerade_all}");
                assert_eq!(lab.reaches(&trace), (names(&["web-a"]), masqueraded), "{case}");
            }
        });
    }
}

// proxy_endpoints.rs

/// Service number of `web` in proxy_endpoints.rs.
const EP: u8 = 50;

/// The pods ClusterIP traffic from the client reaches, checked in every backend, family and
/// protocol.
fn assert_cluster_ip_reaches(lab: &Lab, expected: &[&str]) {
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::Pod(0), at(cluster_ip(family, EP)), protocol);
        assert_eq!(lab.reaches(&trace).0, names(expected), "{mode:?} {family:?} {protocol:?}");
    });
}

/// The selectorless `web` with one hand-written slice per family, an endpoint per pod (but the
/// client) on this node with `extra(i)` fields.
fn hand_written_web(lab: &mut Lab, extra: impl Fn(usize) -> &'static str) {
    lab.write(&service_yaml("web", EP, ""));
    for family in FAMILIES {
        let endpoints: Vec<String> = (1..=lab.pod_count() - 1)
            .map(|i| format!("{{addresses: [\"{}\"], nodeName: {NODE}, {}}}", lab.pod_ip(i, family), extra(i)))
            .collect();
        lab.slice("web", family, &endpoints);
    }
}

#[test]
fn internal_traffic_policy_local_reaches_only_local_endpoints() {
    let mut lab = Lab::new();
    local_and_remote_pods(&mut lab);
    lab.service("web", EP, "internalTrafficPolicy: Local");
    assert_cluster_ip_reaches(&lab, &["web-local"]);
}

#[test]
fn internal_traffic_policy_local_without_local_endpoints_drops() {
    let mut lab = Lab::new();
    lab.pod("web-remote", "app: web", "node-b", PodState::Ready);
    lab.service("web", EP, "internalTrafficPolicy: Local");
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::Pod(0), at(cluster_ip(family, EP)), protocol);
        if uses_sockets(mode) {
            assert_eq!(only_fate(&trace), Fate::Rejected, "{family:?} {protocol:?}: the call fails at once");
            let Verdict::Rejected { with, .. } = &trace.paths[0].verdict else { unreachable!() };
            assert!(with.ends_with("fails with EHOSTUNREACH"), "{with}");
            return;
        }
        assert_eq!(only_fate(&trace), Fate::Dropped, "{mode:?} {family:?} {protocol:?}");
    });
}

#[test]
fn service_without_endpoints_rejects_pods_host_and_outside() {
    let mut lab = Lab::new();
    lab.pod("other", "app: other", NODE, PodState::Ready);
    lab.service("web", EP, "type: NodePort");
    each(|mode, family, protocol| {
        let cluster_ip = at(cluster_ip(family, EP));
        let node_port = SocketAddr::new(node_ip(family), node_port(EP));
        for (from, to) in [
            (From::Pod(0), cluster_ip),
            (From::Pod(0), node_port),
            (From::Host, cluster_ip),
            (From::Host, node_port),
            (From::External, node_port),
        ] {
            let trace = lab.trace(mode, from, to, protocol);
            assert_eq!(only_fate(&trace), Fate::Rejected, "{mode:?} {protocol:?} {from:?} {to}");
            let Verdict::Rejected { with, .. } = &trace.paths[0].verdict else { unreachable!() };
            if uses_sockets(mode) && from != From::External {
                assert!(with.ends_with("fails with ECONNREFUSED"), "{with}");
                continue;
            }
            assert_eq!(with.contains("tcp"), protocol == Protocol::Tcp, "{mode:?}: {with}");
        }
    });
}

#[test]
fn unused_port_of_a_cluster_ip_is_rejected() {
    let mut lab = Lab::new();
    web_pods(&mut lab, &["web-a"]);
    lab.service("web", EP, "");
    each(|mode, family, protocol| {
        let unused = SocketAddr::new(cluster_ip(family, EP), PORT + 1);
        let trace = lab.trace(mode, From::Pod(0), unused, protocol);
        assert_eq!(only_fate(&trace), Fate::Rejected, "{mode:?} {family:?} {protocol:?}");
    });
}

#[test]
fn terminating_pods_serve_only_when_no_pod_is_ready() {
    let mut lab = Lab::new();
    lab.pod("web-a", "app: web", NODE, PodState::Ready);
    lab.pod("web-b", "app: web", NODE, PodState::Terminating);
    lab.service("web", EP, "");
    assert_cluster_ip_reaches(&lab, &["web-a"]);

    let mut all_terminating = Lab::new();
    all_terminating.pod("web-a", "app: web", NODE, PodState::Terminating);
    all_terminating.pod("web-b", "app: web", NODE, PodState::Terminating);
    all_terminating.service("web", EP, "");
    assert_cluster_ip_reaches(&all_terminating, &["web-a", "web-b"]);
}

#[test]
fn hand_written_slice_with_serving_terminating_endpoints_is_used() {
    let mut lab = Lab::new();
    lab.pod("web-a", "app: none", NODE, PodState::Ready);
    lab.pod("web-b", "app: none", NODE, PodState::Ready);
    hand_written_web(&mut lab, |_| "conditions: {ready: false, serving: true, terminating: true}");
    assert_cluster_ip_reaches(&lab, &["web-a", "web-b"]);
}

#[test]
fn topology_hints_for_this_zone_restrict_the_endpoints() {
    let mut lab = Lab::new();
    for name in ["web-a", "web-b", "web-c"] {
        lab.pod(name, "app: none", NODE, PodState::Ready);
    }
    hand_written_web(&mut lab, |i| {
        if i == 2 { "hints: {forZones: [{name: zone-b}]}" } else { "hints: {forZones: [{name: zone-a}]}" }
    });
    assert_cluster_ip_reaches(&lab, &["web-a", "web-c"]);
}

// proxy_watch.rs and proxy_conflicts.rs

#[test]
fn unallocated_addresses_of_a_service_cidr_are_dropped() {
    let mut lab = Lab::new();
    lab.write("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/12, \"fd00:96::/108\"]}\n");
    each(|mode, family, protocol| {
        let trace = lab.trace(mode, From::Pod(0), at(cluster_ip(family, 40)), protocol);
        if matches!(mode, ProxyMode::Ipvs | ProxyMode::Ebpf) {
            let routed = Fate::Delivered { delivery: Delivery::Forwarded, dnat: None, masqueraded: false };
            assert_eq!(only_fate(&trace), routed, "{family:?} {protocol:?}: not applicable, see the module doc");
            return;
        }
        assert_eq!(only_fate(&trace), Fate::Dropped, "{mode:?} {family:?} {protocol:?}");
        let Verdict::Dropped { by } = &trace.paths[0].verdict else { unreachable!() };
        assert!(by.rule.contains("unallocated ClusterIPs"), "{mode:?}: {by:?}");
    });
}

#[test]
fn a_contested_frontend_goes_to_the_oldest_service() {
    let mut lab = Lab::new();
    for name in ["old", "new", "thief"] {
        lab.pod(&format!("{name}-a"), &format!("app: {name}"), NODE, PodState::Ready);
    }
    let service = |name: &str, n: u8, created: &str, external: [String; 2]| {
        let extra = format!("selector: {{app: {name}}}, externalIPs: [{}, \"{}\"]", external[0], external[1]);
        service_yaml(name, n, &extra)
            .replace("namespace: default}", &format!("namespace: default, creationTimestamp: '{created}'}}"))
    };
    let shared = FAMILIES.map(|f| external_ip(f, EXTERNAL_IP).to_string());
    lab.write(&service("old", 81, "2026-01-01T00:00:00Z", shared.clone()));
    lab.write(&service("new", 82, "2026-02-01T00:00:00Z", shared));
    lab.write(&service("thief", 83, "2026-03-01T00:00:00Z", FAMILIES.map(|f| cluster_ip(f, 81).to_string())));
    each(|mode, family, protocol| {
        for (to, pod) in [
            (at(external_ip(family, EXTERNAL_IP)), "old-a"),
            (at(cluster_ip(family, 81)), "old-a"),
            (at(cluster_ip(family, 82)), "new-a"),
            (at(cluster_ip(family, 83)), "thief-a"),
        ] {
            let trace = lab.trace(mode, From::Pod(0), to, protocol);
            assert_eq!(lab.reaches(&trace).0, names(&[pod]), "{mode:?} {protocol:?} {to}");
        }
    });
}

/// The first path of a trace from the client to hello's ClusterIP, for the checks below.
fn first_path(mode: ProxyMode) -> Path {
    let lab = hello();
    lab.trace(mode, From::Pod(0), "10.96.0.10:80".parse().unwrap(), Protocol::Tcp).paths.remove(0)
}

#[test]
fn a_path_shows_every_chain_and_rule_in_order_with_the_map_element_that_matched() {
    let path = first_path(ProxyMode::Nftables);
    let elements: Vec<String> = path
        .steps
        .iter()
        .filter_map(|s| match s {
            super::Step::Rule { element: Some(e), .. } => Some(e.clone()),
            _ => None,
        })
        .collect();
    // The ClusterIP's set element, then the endpoint the picker found (the first path picks 0).
    assert_eq!(elements[0], "10.96.0.10 comment \"default/hello\"", "{elements:?}");
    assert!(
        elements[1].starts_with("10.96.0.10 . tcp . 80 . 0 comment \"default/hello:http\" : 10.244."),
        "{elements:?}"
    );
    assert!(matches!(path.verdict, Verdict::Accepted { delivery: Delivery::Forwarded }));
}
