//! Traffic from outside the cluster, with real packets from the external host in both families:
//! NodePorts, externalIPs, load-balancer IPs, `externalTrafficPolicy: Local` and
//! `loadBalancerSourceRanges`.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use common::*;
use roadkeeper_netlab::{ProbeResult, echo};

per_backend!(
    node_port_from_outside_reaches_every_pod_masqueraded,
    client_ip_affinity_holds_for_node_port_traffic_from_outside,
    external_and_load_balancer_ips_from_outside_reach_the_service_masqueraded,
    external_traffic_to_a_local_policy_service_reaches_only_local_endpoints_and_keeps_the_client_ip,
    pod_traffic_to_external_frontends_of_a_local_policy_service_reaches_every_endpoint,
    external_traffic_to_a_local_policy_service_without_local_endpoints_is_dropped_but_pods_and_host_are_served,
    load_balancer_source_ranges_drop_other_sources_but_not_the_node_port,
    load_balancer_source_ranges_admit_listed_sources,
    node_ports_listen_on_the_modes_default_addresses_and_on_every_address_with_0_0_0_0_slash_0,
    node_ports_answer_on_localhost_only_in_iptables_mode_while_localhost_nodeports_is_on,
    masquerade_all_keeps_the_source_of_pods_reaching_a_local_policy_service_by_external_frontends,
    node_ports_outside_the_range_and_broken_documents_are_refused_and_the_rest_of_the_file_is_served,
);

/// Service number of `web`: ClusterIPs 10.96.0.80 / fd00:96::80, nodePort 30080.
const WEB: u8 = 80;
/// Host number of `web`'s externalIPs (203.0.113.7 / 2001:db8::7).
const EXTERNAL_IP: u8 = 7;
/// Host number of `web`'s load-balancer ingress IPs (203.0.113.9 / 2001:db8::9).
const LB_IP: u8 = 9;

/// A LoadBalancer Service `web` with externalIPs, load-balancer ingress IPs and `extra` spec
/// entries (YAML flow style, may be empty).
fn load_balancer(extra: &str) -> String {
    let (v4, v6) = (Family::V4, Family::V6);
    let mut spec = format!(
        "type: LoadBalancer, externalIPs: [{}, \"{}\"]",
        v4.external_ip(EXTERNAL_IP),
        v6.external_ip(EXTERNAL_IP)
    );
    if !extra.is_empty() {
        spec = format!("{spec}, {extra}");
    }
    format!(
        "{}status: {{loadBalancer: {{ingress: [{{ip: {}}}, {{ip: \"{}\"}}]}}}}\n",
        service_manifest("web", WEB, &spec),
        v4.external_ip(LB_IP),
        v6.external_ip(LB_IP)
    )
}

/// The NodePort, externalIP and load-balancer IP of `web` in `family`.
fn external_frontends(family: Family) -> [SocketAddr; 3] {
    [node_port_address(family), at(family.external_ip(EXTERNAL_IP)), at(family.external_ip(LB_IP))]
}

fn node_port_address(family: Family) -> SocketAddr {
    SocketAddr::new(family.node_ip(), node_port(WEB))
}

/// `web-local` on this node and `web-remote` on another one.
fn local_and_remote_pods(c: &mut Cluster) {
    c.add_pod("web-local", "app: web", NODE);
    c.add_pod("web-remote", "app: web", "node-b");
}

/// `sessionAffinity: ClientIP` holds for traffic from outside: every new connection (and UDP
/// flow) of one outside client to the NodePort reaches one pod, in each family and protocol.
fn client_ip_affinity_holds_for_node_port_traffic_from_outside(backend: Backend) {
    let mut c = Cluster::new("rk-npaff", backend);
    for name in ["web-a", "web-b", "web-c"] {
        c.add_pod(name, "app: web", NODE);
    }
    c.write("web.yaml", &service_manifest("web", WEB, "type: NodePort, sessionAffinity: ClientIP"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = node_port_address(family);
            let got: BTreeSet<String> = answers(c.lab.external(), proto, target, 20).0.into_iter().collect();
            assert_eq!(got.len(), 1, "{proto:?} {target}: affinity keeps the outside client on one pod, got {got:?}");
        }
    }
}

fn node_port_from_outside_reaches_every_pod_masqueraded(backend: Backend) {
    let mut c = Cluster::new("rk-np", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.add_pod("web-b", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, "type: NodePort"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let target = node_port_address(family);
            let (got, peer) = answers(c.lab.external(), proto, target, 20);
            assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), names(&["web-a", "web-b"]), "{proto:?} {target}");
            assert_eq!(peer, family.bridge_ip(), "{proto:?} {target}: Cluster policy masquerades external traffic");
        }
    }
}

fn external_and_load_balancer_ips_from_outside_reach_the_service_masqueraded(backend: Backend) {
    let mut c = Cluster::new("rk-eip", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &load_balancer(""));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            for target in [at(family.external_ip(EXTERNAL_IP)), at(family.external_ip(LB_IP))] {
                let (_, peer) = answers(c.lab.external(), proto, target, 3);
                assert_eq!(peer, family.bridge_ip(), "{proto:?} {target}");
            }
        }
    }
}

fn external_traffic_to_a_local_policy_service_reaches_only_local_endpoints_and_keeps_the_client_ip(backend: Backend) {
    let mut c = Cluster::new("rk-etpl", backend);
    local_and_remote_pods(&mut c);
    c.write("web.yaml", &load_balancer("externalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            for target in external_frontends(family) {
                let (got, peer) = answers(c.lab.external(), proto, target, 10);
                assert!(got.iter().all(|n| n == "web-local"), "{proto:?} {target}: {got:?}");
                assert_eq!(peer, family.external_host_ip(), "{proto:?} {target}: client IP kept");
            }
        }
    }
}

fn pod_traffic_to_external_frontends_of_a_local_policy_service_reaches_every_endpoint(backend: Backend) {
    let mut c = Cluster::new("rk-etps", backend);
    local_and_remote_pods(&mut c);
    c.write("web.yaml", &load_balancer("externalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            for target in external_frontends(family) {
                let got = reached(&c.client.ns, proto, target, 30);
                assert_eq!(
                    got,
                    names(&["web-local", "web-remote"]),
                    "{proto:?} {target}: short-circuited to the Cluster set"
                );
            }
        }
    }
}

fn external_traffic_to_a_local_policy_service_without_local_endpoints_is_dropped_but_pods_and_host_are_served(
    backend: Backend,
) {
    let mut c = Cluster::new("rk-etpd", backend);
    c.add_pod("web-remote", "app: web", "node-b");
    c.write("web.yaml", &load_balancer("externalTrafficPolicy: Local"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        assert_outcome(c.lab.external(), &cases(&external_frontends(family)), &ProbeResult::Timeout);
        for proto in PROTOS {
            let mut targets = external_frontends(family).to_vec();
            targets.push(at(family.cluster_ip(WEB)));
            for target in targets {
                for ns in [&c.client.ns, c.lab.node()] {
                    let (got, _) = answers(ns, proto, target, 3);
                    assert!(
                        got.iter().all(|n| n == "web-remote"),
                        "{proto:?} {target}: pod and host traffic still served: {got:?}"
                    );
                }
            }
        }
    }
}

fn load_balancer_source_ranges_drop_other_sources_but_not_the_node_port(backend: Backend) {
    let mut c = Cluster::new("rk-lbsr", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &load_balancer("loadBalancerSourceRanges: [198.51.100.0/24, \"2001:db8:1::/64\"]"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        assert_outcome(c.lab.external(), &cases(&[at(family.external_ip(LB_IP))]), &ProbeResult::Timeout);
        for proto in PROTOS {
            for target in [node_port_address(family), at(family.external_ip(EXTERNAL_IP))] {
                answers(c.lab.external(), proto, target, 2);
            }
        }
    }
}

fn load_balancer_source_ranges_admit_listed_sources(backend: Backend) {
    let mut c = Cluster::new("rk-lbok", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &load_balancer("loadBalancerSourceRanges: [192.168.77.0/24, \"fd00:77::/64\"]"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            answers(c.lab.external(), proto, at(family.external_ip(LB_IP)), 3);
        }
    }
}

/// A second node address on the uplink (192.168.77.3 / fd00:77::3), reachable from the
/// external host.
fn second_node_address(family: Family) -> SocketAddr {
    let ip: std::net::IpAddr = match family {
        Family::V4 => "192.168.77.3".parse().unwrap(),
        Family::V6 => "fd00:77::3".parse().unwrap(),
    };
    SocketAddr::new(ip, node_port(WEB))
}

fn node_ports_listen_on_the_modes_default_addresses_and_on_every_address_with_0_0_0_0_slash_0(backend: Backend) {
    let mut c = Cluster::new("rk-npa", backend);
    c.lab.add_node_address("192.168.77.3/24".parse().unwrap()).unwrap();
    c.lab.add_node_address("fd00:77::3/64".parse().unwrap()).unwrap();
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, "type: NodePort"));
    c.proxy_once(&[]);
    // As kube-proxy: nftables mode defaults to the primary IPs, iptables and IPVS modes to every
    // address; eBPF mode reads the nftables section and defaults as nftables mode does.
    let second_by_default = !matches!(backend, Backend::Nftables | Backend::Ebpf);
    for family in FAMILIES {
        assert!(matches!(probe(c.lab.external(), Proto::Tcp, node_port_address(family)), ProbeResult::Reply(_)));
        let other = probe(c.lab.external(), Proto::Tcp, second_node_address(family));
        assert_eq!(
            matches!(other, ProbeResult::Reply(_)),
            second_by_default,
            "{family:?}: second node address answered {other:?}"
        );
    }
    c.proxy_once(&["--nodeport-addresses", "primary"]);
    for family in FAMILIES {
        let other = probe(c.lab.external(), Proto::Tcp, second_node_address(family));
        assert!(
            !matches!(other, ProbeResult::Reply(_)),
            "{family:?}: `primary` excludes the second address, got {other:?}"
        );
    }
    c.proxy_once(&["--nodeport-addresses", "0.0.0.0/0,::/0"]);
    for family in FAMILIES {
        for target in [node_port_address(family), second_node_address(family)] {
            let (got, _) = answers(c.lab.external(), Proto::Tcp, target, 3);
            assert!(got.iter().all(|n| n == "web-a"), "{target}: {got:?}");
        }
    }
}

fn node_ports_answer_on_localhost_only_in_iptables_mode_while_localhost_nodeports_is_on(backend: Backend) {
    let mut c = Cluster::new("rk-nplo", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, "type: NodePort"));
    let localhost: SocketAddr = SocketAddr::new("127.0.0.1".parse().unwrap(), node_port(WEB));
    c.proxy_once(&[]);
    let answered = matches!(probe(c.lab.node(), Proto::Tcp, localhost), ProbeResult::Reply(_));
    // As kube-proxy: iptables mode accepts NodePorts on 127.0.0.1 by default, nftables never.
    assert_eq!(answered, backend == Backend::Iptables, "{localhost} from the host");
    if backend == Backend::Iptables {
        c.roadkeeper(&["cleanup"]);
        c.proxy_once(&["--iptables-localhost-nodeports=false"]);
        let off = probe(c.lab.node(), Proto::Tcp, localhost);
        assert!(!matches!(off, ProbeResult::Reply(_)), "--iptables-localhost-nodeports=false: {off:?}");
    }
}

/// `--masquerade-all` masquerades traffic to the ClusterIP (upstream keys it on the destination),
/// not every packet passing the Service's chains: a pod reaching an `externalTrafficPolicy: Local`
/// Service by NodePort, externalIP or load-balancer IP keeps its source, with or without a cluster
/// CIDR (with one, that traffic is short-circuited to the Cluster set).
fn masquerade_all_keeps_the_source_of_pods_reaching_a_local_policy_service_by_external_frontends(backend: Backend) {
    let mut c = Cluster::new("rk-masqx", backend);
    c.add_pod("web-local", "app: web", NODE);
    c.write("web.yaml", &load_balancer("externalTrafficPolicy: Local"));
    for cidr in [Some(LAB_CLUSTER_CIDR), None] {
        c.cluster_cidr = cidr;
        c.proxy_once(&["--masquerade-all"]);
        for family in FAMILIES {
            for proto in PROTOS {
                for target in external_frontends(family) {
                    let (_, peer) = answers(&c.client.ns, proto, target, 2);
                    assert_eq!(peer, c.client_ip(family), "{proto:?} {target}, --cluster-cidr {cidr:?}: source kept");
                }
                let target = at(family.cluster_ip(WEB));
                let (_, peer) = answers(&c.client.ns, proto, target, 2);
                let source = if backend.nats_local_clients() { family.bridge_ip() } else { c.client_ip(family) };
                assert_eq!(
                    peer, source,
                    "{proto:?} {target}, --cluster-cidr {cidr:?}: ClusterIP masqueraded (not NATed in eBPF mode)"
                );
            }
        }
    }
}

/// One file of three documents: a Service asking for the node's SSH port and the proxy's own
/// health port as NodePorts, a document that is not YAML, and a good NodePort Service. The first
/// is refused (file, object, field), the second reported (file, document, line), the third served
/// from outside; listeners on the node's ports 22 and 10256 still answer from outside, not
/// DNATed. `--service-node-port-range` moves the range.
fn node_ports_outside_the_range_and_broken_documents_are_refused_and_the_rest_of_the_file_is_served(backend: Backend) {
    let mut c = Cluster::new("rk-nprng", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.add_pod("grab-a", "app: grab", NODE);
    let node_ports = [22, 10256];
    let listen: Vec<SocketAddr> =
        FAMILIES.iter().flat_map(|f| node_ports.map(|port| SocketAddr::new(f.node_ip(), port))).collect();
    let _node_listener = c.lab.node().run(|| echo::serve(&listen, "node-itself")).expect("node listener");
    let grab = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: grab, namespace: default}}\n\
         spec:\n  type: NodePort\n  selector: {{app: grab}}\n  clusterIP: {v4}\n  clusterIPs: [{v4}, \"{v6}\"]\n  \
         ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n  ports:\n  \
         - {{name: ssh, port: 22, targetPort: {ECHO_PORT}, nodePort: 22}}\n  \
         - {{name: healthz, port: 10256, targetPort: {ECHO_PORT}, nodePort: 10256}}\n",
        v4 = Family::V4.cluster_ip(WEB + 1),
        v6 = Family::V6.cluster_ip(WEB + 1),
    );
    let broken = "apiVersion: v1\nkind: Service\nmetadata: {name: [\n";
    c.write("services.yaml", &format!("{grab}---\n{broken}---\n{}", service_manifest("web", WEB, "type: NodePort")));
    let out = c.try_proxy_once(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for family in FAMILIES {
        let (got, _) = answers(c.lab.external(), Proto::Tcp, node_port_address(family), 3);
        assert!(got.iter().all(|n| n == "web-a"), "{family:?}: {got:?}");
        for port in node_ports {
            let target = SocketAddr::new(family.node_ip(), port);
            let (got, _) = answers(c.lab.external(), Proto::Tcp, target, 2);
            assert!(got.iter().all(|n| n == "node-itself"), "{target} was taken over: {got:?}");
        }
    }
    for report in [
        "services.yaml: Service default/grab: spec.ports[0].nodePort: 22 is not in the NodePort range 30000-32767",
        "services.yaml: Service default/grab: spec.ports[1].nodePort: 10256 is not in the NodePort range 30000-32767",
        "services.yaml: document 2: invalid YAML: line 17 column 18: unclosed bracket '['",
    ] {
        assert!(stderr.contains(report), "expected {report:?} in:\n{stderr}");
    }
    let rules = |range: &str| {
        let dir = c.manifests.path().display().to_string();
        let args = ["rules", "--manifests", &dir, "--hostname-override", NODE, "--service-node-port-range", range];
        let out = c.roadkeeper(&args);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(!rules("1-32767").contains("NodePort range"), "a wider range admits port 22 and 10256");
    let narrow = rules("10000+100");
    assert!(
        narrow.contains("Service default/web: spec.ports[0].nodePort: 30080 is not in the NodePort range 10000-10100"),
        "{narrow}"
    );
    // An API server checks its own range: the flag is refused with one.
    let out = c.roadkeeper(&["rules", "--kubeconfig", "/nonexistent", "--service-node-port-range", "1-2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot be used with '--service-node-port-range"), "{stderr}");
}

/// IPVS mode's helper tables, as `roadkeeper rules --proxy-mode ipvs` prints them, load into
/// this kernel's nf_tables in both families, every set and the short-circuit map filled (IPVS
/// itself is tried in the VM: the `ipvs::` cases).
#[test]
fn ipvs_helper_tables_printed_by_rules_load_into_nftables() {
    let mut c = Cluster::new("rk-ipvsnft", Backend::Ipvs);
    local_and_remote_pods(&mut c);
    let ranges = format!("{}/32", c.client_ip(Family::V4));
    let extra = format!("externalTrafficPolicy: Local, loadBalancerSourceRanges: [{ranges}, \"fd00::/8\"]");
    c.write("web.yaml", &load_balancer(&extra));
    c.write("empty.yaml", &selectorless_service_manifest("empty", WEB + 1));
    let args = c.proxy_args_for("rules", &[]);
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let script = &printed[printed.find("table ip ").expect("the helper tables")..];
    let loaded = c.lab.node().exec_with_input(["nft", "-f", "-"], script).expect("run nft");
    assert!(loaded.status.success(), "{}\n{script}", String::from_utf8_lossy(&loaded.stderr));
    for family in FAMILIES {
        let table =
            String::from_utf8_lossy(&c.nft(&["list", "table", family.nft(), "roadkeeper-ipvs"]).stdout).into_owned();
        let node_port = format!("{} . tcp . {} : {} . 80", family.node_ip(), node_port(WEB), family.cluster_ip(WEB));
        assert!(table.contains(&node_port), "{family:?}: no short-circuit of the NodePort in\n{table}");
        let empty = format!("{} . tcp . 80", family.cluster_ip(WEB + 1));
        let no_endpoints =
            table.split("set no-endpoints").nth(1).unwrap_or_default().split('}').next().unwrap_or_default();
        assert!(no_endpoints.contains(&empty), "{family:?}: `empty` not rejected in\n{table}");
    }
}
