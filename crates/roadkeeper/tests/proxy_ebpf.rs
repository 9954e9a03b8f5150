//! eBPF mode end to end (root; the binary's default feature `ebpf`): `roadkeeper proxy
//! --proxy-mode ebpf` attaches its socket programs to the lab node's own cgroup (never the
//! machine's), and the node's pods and host reach Services with real sockets, translated once per
//! connection at `connect()` / `sendmsg()` with no NAT on the way.
#![cfg(feature = "ebpf")]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use common::*;
use roadkeeper_netlab::{Netns, ProbeResult};

/// Three pods behind Service `hello` (ClusterIPs [`Family::cluster_ip`]`(10)`, port 80 over TCP
/// and UDP).
fn hello(c: &mut Cluster) {
    for name in ["hello-a", "hello-b", "hello-c"] {
        c.add_pod(name, "app: hello", NODE);
    }
    c.write("hello.yaml", &service_manifest("hello", 10, ""));
}

/// The distinct pods that answered `n` probes of `target` from `ns`.
fn reached(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> BTreeSet<String> {
    answers(ns, proto, target, n).0.into_iter().collect()
}

#[test]
fn pods_reach_every_endpoint_of_a_cluster_ip_with_their_own_address_in_both_families() {
    let mut c = Cluster::new("rk-bpf-cip", Backend::Ebpf);
    hello(&mut c);
    c.proxy_once(&[]);
    for family in FAMILIES {
        for proto in PROTOS {
            let vip = at(family.cluster_ip(10));
            let (names, peer) = answers(&c.client.ns, proto, vip, 40);
            let distinct: BTreeSet<_> = names.iter().collect();
            assert_eq!(distinct.len(), 3, "{proto:?} {vip}: random over every endpoint, got {names:?}");
            assert_eq!(peer, c.client_ip(family), "{proto:?} {vip}: no NAT: the pod's own address");
        }
    }
}

#[test]
fn the_node_reaches_a_cluster_ip_from_its_bridge_address_by_routing_not_masquerade() {
    let mut c = Cluster::new("rk-bpf-host", Backend::Ebpf);
    hello(&mut c);
    c.proxy_once(&[]);
    for family in FAMILIES {
        let (_, peer) = answers(c.lab.node(), Proto::Tcp, at(family.cluster_ip(10)), 3);
        assert_eq!(peer, family.bridge_ip(), "the socket was connected to the pod: its route's source address");
    }
}

#[test]
fn a_service_without_endpoints_refuses_at_connect() {
    let c = Cluster::new("rk-bpf-empty", Backend::Ebpf);
    c.write("empty.yaml", &service_manifest("empty", 20, ""));
    c.proxy_once(&[]);
    let cases: Vec<(Proto, SocketAddr)> =
        FAMILIES.into_iter().flat_map(|family| PROTOS.map(|proto| (proto, at(family.cluster_ip(20))))).collect();
    assert_outcome(&c.client.ns, &cases, &ProbeResult::Refused);
}

#[test]
fn a_pod_outside_the_node_cgroup_is_not_translated() {
    let mut c = Cluster::new("rk-bpf-outside", Backend::Ebpf);
    hello(&mut c);
    c.proxy_once(&[]);
    // A pod of the lab that is not placed in the node's cgroup: its connections are its own.
    let stranger = c.lab.add_pod("stranger").expect("pod");
    let got = stranger.ns.run(|| roadkeeper_netlab::probe::tcp(at(Family::V4.cluster_ip(10)), probe_timeout()));
    assert!(!matches!(got, ProbeResult::Reply(_)), "untranslated, nothing answers at the ClusterIP: {got:?}");
    assert_eq!(reached(&c.client.ns, Proto::Tcp, at(Family::V4.cluster_ip(10)), 20).len(), 3, "the node's pods are");
}

#[test]
fn endpoint_changes_reach_the_maps_while_the_proxy_runs() {
    let mut c = Cluster::new("rk-bpf-watch", Backend::Ebpf);
    hello(&mut c);
    c.start_fast_proxy();
    let vip = at(Family::V4.cluster_ip(10));
    assert_eq!(reached(&c.client.ns, Proto::Tcp, vip, 30).len(), 3);
    // hello-c leaves the Service (relabelled), then a fourth pod joins.
    c.update_pod(2, "app: removed", NODE, PodState::Ready);
    let left = eventually(settle(), || !reached(&c.client.ns, Proto::Tcp, vip, 20).contains("hello-c"));
    assert!(left, "hello-c still answers:\n{}", c.proxy_log());
    c.add_pod("hello-d", "app: hello", NODE);
    let want: BTreeSet<String> = ["hello-a", "hello-b", "hello-d"].map(String::from).into();
    let joined = eventually(settle(), || reached(&c.client.ns, Proto::Tcp, vip, 30) == want);
    assert!(joined, "not {want:?}:\n{}", c.proxy_log());
}

#[test]
fn a_restarted_proxy_adopts_the_maps_and_cleanup_removes_them() {
    let mut c = Cluster::new("rk-bpf-restart", Backend::Ebpf);
    hello(&mut c);
    c.proxy_once(&[]);
    let vip = at(Family::V6.cluster_ip(10));
    // A connection made before the restart keeps working through it.
    let before = c.client.ns.run(|| std::net::TcpStream::connect_timeout(&vip, probe_timeout())).expect("connected");
    c.proxy_once(&[]);
    assert!(c.programmed());
    assert_eq!(reached(&c.client.ns, Proto::Udp, vip, 30).len(), 3, "the adopted maps still hold every endpoint");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&before), &mut line).expect("the echo line");
    assert!(line.starts_with("hello-"), "{line}");
    assert_eq!(before.peer_addr().expect("peer"), vip, "getpeername() names the ClusterIP");

    let bpf_root = c.node_cgroup.as_ref().expect("cgroup").bpf_root();
    let out = c.roadkeeper(&["cleanup", "--bpf-root", &bpf_root.display().to_string()]);
    assert!(out.status.success(), "cleanup: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!bpf_root.join("roadkeeper").exists(), "every pin is gone");
    let got = probe(&c.client.ns, Proto::Tcp, at(Family::V4.cluster_ip(10)));
    assert!(!matches!(got, ProbeResult::Reply(_)), "the programs are detached: {got:?}");
}

#[test]
fn rules_prints_the_maps_as_a_load_balancer_list() {
    let mut c = Cluster::new("rk-bpf-rules", Backend::Ebpf);
    hello(&mut c);
    let args = c.proxy_args_for("rules", &[]);
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8_lossy(&out.stdout);
    let frontend = format!("{}:80/tcp", Family::V4.cluster_ip(10));
    assert!(listing.contains(&frontend), "no {frontend} in:\n{listing}");
    assert!(listing.contains("3 backends"), "{listing}");
    for i in 0..3 {
        let backend = format!("{}:{ECHO_PORT}", c.pod_ip(i, Family::V4));
        assert!(listing.contains(&backend), "no {backend} in:\n{listing}");
    }
    assert!(!c.ebpf_links().exists(), "rules touches nothing");
}

#[test]
fn a_cgroup_root_that_is_not_a_cgroup_is_refused_with_its_name() {
    let c = Cluster::new("rk-bpf-bad", Backend::Ebpf);
    let not_a_cgroup = c.scratch.path().display().to_string();
    let mut args = c.proxy_args_for("proxy", &["--once"]);
    let at = args.iter().position(|a| a == "--cgroup-root").expect("the flag") + 1;
    args[at] = not_a_cgroup.clone();
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("--cgroup-root {not_a_cgroup} is not one")), "{stderr}");
    assert!(!c.ebpf_links().exists(), "nothing was attached");
}

#[test]
fn a_pod_reaches_a_node_port_of_its_own_node_through_its_socket() {
    let mut c = Cluster::new("rk-bpf-np", Backend::Ebpf);
    for name in ["web-a", "web-b"] {
        c.add_pod(name, "app: web", NODE);
    }
    c.write("web.yaml", &service_manifest("web", 30, "type: NodePort"));
    c.proxy_once(&[]);
    for family in FAMILIES {
        let target = SocketAddr::new(family.node_ip(), node_port(30));
        let (names, peer) = answers(&c.client.ns, Proto::Tcp, target, 30);
        let distinct: BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), 2, "{target}: every endpoint, got {names:?}");
        assert_eq!(peer, c.client_ip(family), "{target}: translated at the socket, not masqueraded");
    }
}

#[test]
fn a_bpf_root_that_is_not_a_bpffs_is_refused_before_anything_is_made_there() {
    let c = Cluster::new("rk-bpf-badfs", Backend::Ebpf);
    let not_bpffs = c.scratch.path().display().to_string();
    let mut args = c.proxy_args_for("proxy", &["--once"]);
    let at = args.iter().position(|a| a == "--bpf-root").expect("the flag") + 1;
    args[at] = not_bpffs.clone();
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("--bpf-root {not_bpffs} is not one")), "{stderr}");
    assert!(!c.scratch.path().join("roadkeeper").exists(), "no pin directory was made outside a bpffs");
}

#[test]
fn external_traffic_is_translated_at_the_uplink_and_cleanup_detaches_the_programs_there() {
    let mut c = Cluster::new("rk-bpf-tc", Backend::Ebpf);
    for name in ["web-a", "web-b"] {
        c.add_pod(name, "app: web", NODE);
    }
    c.write("web.yaml", &service_manifest("web", 30, "type: NodePort"));
    c.proxy_once(&[]);
    let filters = |hook: &str| c.node_output(&["tc", "filter", "show", "dev", "eth0", hook]);
    assert!(filters("ingress").contains("rk_from_outside"), "{}", filters("ingress"));
    assert!(filters("egress").contains("rk_to_outside"), "{}", filters("egress"));
    assert!(c.nft(&["list", "table", "inet", "roadkeeper-ebpf"]).status.success(), "the masquerade table");
    let listing = c.kernel_rules();
    let frontend = format!("{}:{}/tcp (external)", Family::V4.node_ip(), node_port(30));
    let line = listing.lines().find(|l| l.starts_with(&frontend)).unwrap_or_else(|| panic!("{listing}"));
    assert!(line.contains("2 backends") && line.contains("maglev") && line.contains("masquerade"), "{line}");
    for family in FAMILIES {
        let target = SocketAddr::new(family.node_ip(), node_port(30));
        for proto in PROTOS {
            let (names, peer) = answers(c.lab.external(), proto, target, 20);
            assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), 2, "{proto:?} {target}: {names:?}");
            assert_eq!(peer, family.bridge_ip(), "{proto:?} {target}: masqueraded (Cluster policy)");
        }
    }
    // Restarted with the same devices: the filters are replaced in place, not added beside.
    c.proxy_once(&[]);
    assert_eq!(filters("ingress").matches("handle 0x524b").count(), 1, "{}", filters("ingress"));

    let bpf_root = c.node_cgroup.as_ref().expect("cgroup").bpf_root();
    let out = c.roadkeeper(&["cleanup", "--bpf-root", &bpf_root.display().to_string()]);
    assert!(out.status.success(), "cleanup: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!filters("ingress").contains("rk_from") && !filters("egress").contains("rk_to"), "filters left");
    assert!(!c.nft(&["list", "table", "inet", "roadkeeper-ebpf"]).status.success(), "the table is gone");
    let got = probe(c.lab.external(), Proto::Tcp, SocketAddr::new(Family::V4.node_ip(), node_port(30)));
    assert!(!matches!(got, ProbeResult::Reply(_)), "nothing translates any more: {got:?}");
}

#[test]
fn a_bad_or_missing_device_is_refused_with_its_name() {
    let c = Cluster::new("rk-bpf-dev", Backend::Ebpf);
    for (devices, says) in [("eth0,../x", "\"../x\" is not an interface name"), ("nosuch0", "interface nosuch0")] {
        let out = c.roadkeeper(
            &c.proxy_args_for("proxy", &["--once", "--bpf-devices", devices])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{devices}: accepted");
        assert!(stderr.contains("--bpf-devices") && stderr.contains(says), "{devices}: {stderr}");
    }
}

/// A Service port the maps cannot hold (here: three endpoints behind a NodePort balanced by a
/// 251-slot Maglev table, which holds two) is refused by name, by `proxy --once`, `rules` and the
/// watching proxy's metric alike, and every other Service is written and answers.
#[test]
fn a_service_the_maps_cannot_hold_is_refused_by_name_and_the_others_are_served() {
    let mut c = Cluster::new("rk-bpf-full", Backend::Ebpf);
    for name in ["big-a", "big-b", "big-c"] {
        c.add_pod(name, "app: big", NODE);
    }
    c.add_pod("small-a", "app: small", NODE);
    c.write("big.yaml", &service_manifest("big", 40, "type: NodePort"));
    c.write("small.yaml", &service_manifest("small", 41, ""));
    let tiny = ["--bpf-lb-maglev-table-size", "251"];

    let out = c.try_proxy_once(&tiny);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "proxy --once succeeded:\n{stderr}");
    assert!(stderr.contains("default/big") && stderr.contains("Maglev"), "{stderr}");
    assert!(!stderr.contains("default/small"), "{stderr}");
    for family in FAMILIES {
        for proto in PROTOS {
            let small = at(family.cluster_ip(41));
            assert_eq!(reached(&c.client.ns, proto, small, 5), BTreeSet::from(["small-a".to_string()]), "{proto:?}");
        }
    }

    let args = c.proxy_args_for("rules", &tiny);
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && stderr.contains("default/big"), "rules:\n{stderr}");
    assert!(stdout.contains(&format!("{}:80/tcp", Family::V4.cluster_ip(41))), "small is listed:\n{stdout}");

    c.start_proxy(&tiny);
    let refused = || {
        common::http::sample(
            &common::http::get(&c, "127.0.0.1:10249", "/metrics").1,
            "roadkeeper_sync_proxy_rules_refused_services",
        )
    };
    // Both ports of big (TCP and UDP) belong to one Service.
    assert!(eventually(settle(), || refused() == 1.0), "refused: {}\n{}", refused(), c.proxy_log());
}

/// A UDP client from outside kept on one flow (a fixed source port) to a NodePort moves to a
/// remaining endpoint within one sync once its endpoint leaves the Service, even while another
/// Service still uses that endpoint (its backend entry stays): the sync deletes the flow the
/// interface programs held, as the other modes delete the conntrack entry.
#[test]
fn an_external_udp_flow_leaves_an_endpoint_that_left_its_service_but_serves_another() {
    let mut c = Cluster::new("rk-bpf-flow", Backend::Ebpf);
    let pods = [c.add_pod("web-a", "app: web, tier: web", NODE), c.add_pod("web-b", "app: web, tier: web", NODE)];
    c.write("web.yaml", &service_manifest("web", 60, "type: NodePort"));
    c.write("tier.yaml", &service_manifest("tier", 61, "").replace("selector: {app: tier}", "selector: {tier: web}"));
    c.start_fast_proxy();
    let answer = |family: Family| {
        let source = SocketAddr::new(family.external_host_ip(), 20060);
        let target = SocketAddr::new(family.node_ip(), node_port(60));
        match c.lab.external().run(|| roadkeeper_netlab::probe::udp_from_port(source, target, probe_timeout())) {
            ProbeResult::Reply(reply) => Some(reply.name),
            _ => None,
        }
    };
    let held = answer(Family::V4).expect("the NodePort answers");
    assert!((0..5).all(|_| answer(Family::V4).as_deref() == Some(held.as_str())), "one flow, one endpoint");
    let (moved, other) = if held == "web-a" { (pods[0], "web-b") } else { (pods[1], "web-a") };

    // The held pod leaves web but stays in tier: its echo server still answers.
    c.update_pod(moved, "app: gone, tier: web", NODE, PodState::Ready);
    let left = eventually(settle(), || answer(Family::V4).as_deref() == Some(other));
    assert!(left, "the flow stayed on {held}, which no longer serves web; proxy log:\n{}", c.proxy_log());
    assert!(c.proxy_log().contains("conntrack_deleted=1"), "{}", c.proxy_log());
    let tier = reached(&c.client.ns, Proto::Tcp, at(Family::V4.cluster_ip(61)), 20);
    assert_eq!(tier.len(), 2, "tier keeps both pods: {tier:?}");
}

/// A pod's UDP socket connected to a ClusterIP (translated once, at `connect()`) whose endpoint
/// leaves the Service is destroyed within one sync: its next call fails (ECONNABORTED, or
/// EDESTADDRREQ once the kernel has disconnected it), as the other modes delete the conntrack
/// entry, and a new socket reaches the endpoint that serves. A socket connected to that pod's
/// own address, which no program translated, is left alone.
#[test]
fn a_pods_connected_udp_socket_on_an_endpoint_that_left_is_aborted_and_a_new_one_moves_on() {
    let mut c = Cluster::new("rk-bpf-udpsock", Backend::Ebpf);
    let pods = [c.add_pod("web-a", "app: web", NODE), c.add_pod("web-b", "app: web", NODE)];
    c.write("web.yaml", &service_manifest("web", 63, ""));
    c.start_fast_proxy();
    let connect = |to: SocketAddr| {
        c.client.ns.run(move || {
            let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
            socket.connect(to).expect("connect");
            socket.set_read_timeout(Some(probe_timeout())).expect("a timeout");
            socket
        })
    };
    let ask = |socket: &std::net::UdpSocket| -> std::io::Result<String> {
        socket.send(b"probe\n")?;
        let mut buf = [0; 512];
        let n = socket.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).split_whitespace().next().unwrap_or_default().to_owned())
    };
    let service = connect(at(Family::V4.cluster_ip(63)));
    let held = ask(&service).expect("the ClusterIP answers");
    assert!((0..5).all(|_| ask(&service).ok().as_deref() == Some(held.as_str())), "one socket, one endpoint");
    let (moved, other) = if held == "web-a" { (pods[0], "web-b") } else { (pods[1], "web-a") };
    let direct = connect(SocketAddr::new(c.pod_ip(moved, Family::V4), 8080));
    assert_eq!(ask(&direct).expect("the pod answers"), held);

    // The held pod leaves the Service; its echo server still answers.
    c.update_pod(moved, "app: gone", NODE, PodState::Ready);
    let aborted = |result: std::io::Result<String>| {
        use nix::errno::Errno;
        let failed = [Errno::ECONNABORTED, Errno::EDESTADDRREQ].map(|errno| Some(errno as i32));
        matches!(result, Err(err) if failed.contains(&err.raw_os_error()))
    };
    let gone = eventually(settle(), || aborted(ask(&service)));
    assert!(gone, "the socket stayed on {held}, which no longer serves web; proxy log:\n{}", c.proxy_log());
    assert_eq!(ask(&connect(at(Family::V4.cluster_ip(63)))).expect("a new socket"), other);
    assert_eq!(ask(&direct).expect("the direct socket still works"), held);
    assert!(c.proxy_log().contains("conntrack_deleted=1"), "{}", c.proxy_log());
}

/// An IPv4 datagram to the NodePort from the external host's port `source_port`, built by hand:
/// `options` words of IP options (NOPs), a UDP header and `payload`, cut to `keep` bytes of UDP
/// (header included), with the fragment field `fragment` (flags and offset). The kernel fills
/// in the IP header's length and checksum (`IP_HDRINCL`); the UDP checksum is 0 (none).
fn crafted(source_port: u16, options: usize, keep: usize, fragment: u16, payload: &[u8]) -> Vec<u8> {
    let (source, destination) = (Family::V4.external_host_ip(), Family::V4.node_ip());
    let (std::net::IpAddr::V4(source), std::net::IpAddr::V4(destination)) = (source, destination) else {
        unreachable!("IPv4 addresses")
    };
    let mut ip = vec![0x40 | (5 + options as u8), 0, 0, 0, 0x12, 0x34];
    ip.extend_from_slice(&fragment.to_be_bytes());
    ip.extend_from_slice(&[64, 17, 0, 0]);
    ip.extend_from_slice(&source.octets());
    ip.extend_from_slice(&destination.octets());
    ip.extend(std::iter::repeat_n(1u8, 4 * options));
    let mut udp = Vec::new();
    udp.extend_from_slice(&source_port.to_be_bytes());
    udp.extend_from_slice(&node_port(64).to_be_bytes());
    udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    udp.truncate(keep);
    ip.extend(udp);
    ip
}

/// Hostile and unusual packets at the interface programs, sent raw from outside: an IPv4
/// header with options is translated (the UDP header found past them) and answered by the pod;
/// a datagram cut inside its UDP header, and a fragment, pass untranslated (the kernel drops the
/// one, and no pod answers the other: fragments are not translated, as the README says); the
/// NodePort keeps serving both families and protocols afterwards.
#[test]
fn odd_packets_from_outside_are_translated_only_when_whole_and_the_node_port_keeps_serving() {
    let mut c = Cluster::new("rk-bpf-odd", Backend::Ebpf);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", 64, "type: NodePort"));
    c.proxy_once(&[]);
    let node_ip = Family::V4.node_ip();
    // Each case: its packet, and the port the external host listens for an answer on.
    let send_and_listen = |port: u16, packet: Vec<u8>| -> Option<String> {
        c.lab.external().run(move || {
            let listener = std::net::UdpSocket::bind((Family::V4.external_host_ip(), port)).expect("a listener");
            listener.set_read_timeout(Some(probe_timeout())).expect("a timeout");
            let raw = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(255.into()))
                .expect("a raw socket");
            raw.send_to(&packet, &SocketAddr::new(node_ip, 0).into()).expect("sent");
            let mut buf = [0; 512];
            let n = listener.recv(&mut buf).ok()?;
            Some(String::from_utf8_lossy(&buf[..n]).split_whitespace().next().unwrap_or_default().to_owned())
        })
    };
    assert_eq!(send_and_listen(40001, crafted(40001, 2, 64, 0, b"probe\n")).as_deref(), Some("web-a"), "options");
    assert_eq!(send_and_listen(40002, crafted(40002, 0, 4, 0, b"")), None, "cut inside the UDP header");
    let more_fragments = 0x2000;
    assert_eq!(send_and_listen(40003, crafted(40003, 0, 64, more_fragments, b"probe\n")), None, "a fragment");
    for family in FAMILIES {
        for proto in PROTOS {
            let target = SocketAddr::new(family.node_ip(), node_port(64));
            assert_eq!(reached(c.lab.external(), proto, target, 3).len(), 1, "{proto:?} {target} still served");
        }
    }
}
