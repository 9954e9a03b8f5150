//! Stale UDP conntrack entries: a client that keeps one UDP flow to a Service (same source port)
//! moves to a remaining endpoint within one sync once its endpoint is removed, with either backend.
//! kube-proxy's conntrack settings (`--conntrack-*`, `conntrack:`): the node's netfilter sysctls
//! after a run, and iptables mode's DROP of INVALID packets unless TCP tracking is liberal.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use roadkeeper_netlab::{ProbeResult, probe};

per_backend!(
    a_udp_flow_pinned_to_a_removed_endpoint_moves_to_a_remaining_one_within_one_sync,
    conntrack_sysctls_follow_kube_proxys_defaults_file_and_flags,
    an_out_of_window_segment_from_an_endpoint_never_reaches_the_client_un_natted,
);

/// Service number of `dns`: ClusterIPs 10.96.0.53 / fd00:96::53.
const DNS: u8 = 53;
/// The client's fixed UDP source port: every datagram belongs to one conntrack flow. Below the
/// ephemeral range, so that no other socket of the client pod can hold it.
const CLIENT_PORT: u16 = 20053;

/// The pod that answers one datagram from the client's fixed port in `family`.
fn answer(c: &Cluster, family: Family) -> Option<String> {
    let source = SocketAddr::new(c.client_ip(family), CLIENT_PORT);
    let target = at(family.cluster_ip(DNS));
    match c.client.ns.run(|| probe::udp_from_port(source, target, probe_timeout())) {
        ProbeResult::Reply(reply) => Some(reply.name),
        _ => None,
    }
}

fn a_udp_flow_pinned_to_a_removed_endpoint_moves_to_a_remaining_one_within_one_sync(backend: Backend) {
    let mut c = Cluster::new("rk-ct", backend);
    c.add_pod("dns-a", "app: dns", NODE);
    let b = c.add_pod("dns-b", "app: dns", NODE);
    c.update_pod(b, "app: dns", NODE, PodState::NotReady);
    c.write("dns.yaml", &service_manifest("dns", DNS, ""));
    c.start_fast_proxy();
    for family in FAMILIES {
        assert_eq!(answer(&c, family).as_deref(), Some("dns-a"), "{family:?}: only dns-a is ready");
    }

    // dns-b becomes ready: the flows stay on dns-a, which still serves (nothing stale). In eBPF
    // mode no conntrack flow pins the 5-tuple: each socket's send picks an endpoint anew.
    c.update_pod(b, "app: dns", NODE, PodState::Ready);
    std::thread::sleep(Duration::from_secs(1));
    for family in FAMILIES {
        for _ in 0..5 {
            let got = answer(&c, family);
            if backend.nats_local_clients() {
                assert_eq!(got.as_deref(), Some("dns-a"), "{family:?}: a serving endpoint keeps its flow");
            } else {
                assert!(matches!(got.as_deref(), Some("dns-a" | "dns-b")), "{family:?}: a serving endpoint: {got:?}");
            }
        }
    }

    // dns-a goes away (its echo server keeps answering, so only the conntrack entry could still
    // send datagrams there): the same flows reach dns-b within one sync.
    c.remove("pod-dns-a.yaml");
    for family in FAMILIES {
        let moved = eventually(settle(), || answer(&c, family).as_deref() == Some("dns-b"));
        assert!(moved, "{family:?}: the flow stayed on the removed endpoint; proxy log:\n{}", c.proxy_log());
    }
    // The sync's line is logged after its deletions: the flow may move before it is written.
    // (In IPVS mode the kernel ends the flows of a deleted real server itself, conntrack entry
    // included: `expire_nodest_conn`.)
    // (In eBPF mode there is no conntrack flow to delete: the next send picks anew.)
    if !matches!(backend, Backend::Ipvs | Backend::Ebpf) {
        let logged = |log: &str| log.contains("conntrack_deleted=1") || log.contains("conntrack_deleted=2");
        assert!(eventually(settle(), || logged(&c.proxy_log())), "no deletion logged:\n{}", c.proxy_log());
    }
}

/// The node's `net.netfilter.nf_conntrack_<name>`.
fn sysctl(c: &Cluster, name: &str) -> String {
    c.node_output(&["cat", &format!("/proc/sys/net/netfilter/nf_conntrack_{name}")]).trim().to_string()
}

/// The node's per-namespace conntrack timeouts and liberal flag, in a fixed order.
fn conntrack_sysctls(c: &Cluster) -> [String; 5] {
    ["tcp_timeout_close_wait", "tcp_timeout_established", "udp_timeout", "udp_timeout_stream", "tcp_be_liberal"]
        .map(|name| sysctl(c, name))
}

/// True when iptables mode's `KUBE-FORWARD` drops packets conntrack calls INVALID (in both
/// families).
fn drops_invalid(c: &Cluster) -> bool {
    let rule = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP";
    let (v4, v6) =
        (c.node_output(&["iptables-save", "-t", "filter"]), c.node_output(&["ip6tables-save", "-t", "filter"]));
    assert_eq!(v4.contains(rule), v6.contains(rule), "{v4}\n{v6}");
    v4.contains(rule)
}

/// As kube-proxy: without flags the node gets kube-proxy's defaults (CLOSE_WAIT 1 h, ESTABLISHED
/// 24 h; UDP timeouts and liberal tracking left as they are); the config file's `conntrack:`
/// section sets them and flags win over it; `0` leaves a timeout as it is. `nf_conntrack_max`,
/// read-only outside the initial network namespace, is left with a warning. In iptables mode
/// packets in conntrack state INVALID are dropped unless the node's TCP tracking is liberal.
fn conntrack_sysctls_follow_kube_proxys_defaults_file_and_flags(backend: Backend) {
    let c = Cluster::new("rk-ctsys", backend);
    c.write("dns.yaml", &service_manifest("dns", DNS, ""));
    // The kernel's own values in a fresh namespace: strict tracking, no value kube-proxy sets.
    let [_, established, ..] = conntrack_sysctls(&c);
    assert_eq!(sysctl(&c, "tcp_be_liberal"), "0");
    assert!(!["3600", "7200"].contains(&sysctl(&c, "tcp_timeout_close_wait").as_str()));

    // `--init-only` (a privileged init container's run) writes the settings and programs nothing;
    // one the node refuses (here the node-wide limit) fails it.
    let init_only = |extra: &[&str]| {
        let mut args = c.proxy_args_for("proxy", extra);
        args.push("--init-only".into());
        c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // (ESTABLISHED left alone: the kernel's value is checked below.)
    let out = init_only(&[
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-close-wait=2h",
        "--conntrack-tcp-timeout-established=0s",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sysctl(&c, "tcp_timeout_close_wait"), "7200");
    assert!(!c.kernel_rules().contains("default/dns"), "--init-only programs no rule:\n{}", c.kernel_rules());
    let out = init_only(&["--conntrack-tcp-timeout-established=0s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("nf_conntrack_max"), "{stderr}");

    let out = c.try_proxy_once(&[
        "--conntrack-tcp-timeout-close-wait=2h",
        "--conntrack-tcp-timeout-established=0s",
        "--conntrack-udp-timeout=45s",
        "--conntrack-udp-timeout-stream=3m0s",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(conntrack_sysctls(&c), ["7200", established.as_str(), "45", "180", "0"], "{stderr}");
    assert!(stderr.contains("nf_conntrack_max"), "the read-only limit is not mentioned: {stderr}");
    if backend == Backend::Iptables {
        assert!(drops_invalid(&c), "strict TCP tracking: INVALID packets are dropped");
    }

    c.proxy_once(&[]);
    assert_eq!(conntrack_sysctls(&c), ["3600", "86400", "45", "180", "0"], "kube-proxy's defaults");

    let file = c.scratch_file(
        "conntrack.yaml",
        "kind: KubeProxyConfiguration\nconntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 30m, tcpBeLiberal: true, udpTimeout: 1m}\n",
    );
    c.proxy_once(&["--config", &file]);
    assert_eq!(conntrack_sysctls(&c), ["1800", "86400", "60", "180", "1"], "the file's conntrack section");
    if backend == Backend::Iptables {
        assert!(!drops_invalid(&c), "liberal TCP tracking: INVALID packets are not dropped");
    }
    c.proxy_once(&["--config", &file, "--conntrack-tcp-timeout-close-wait", "40m"]);
    assert_eq!(sysctl(&c, "tcp_timeout_close_wait"), "2400", "the flag wins over the file");
    // Liberal tracking set by someone else counts too (kube-proxy reads the kernel's value).
    c.proxy_once(&[]);
    if backend == Backend::Iptables {
        assert!(!drops_invalid(&c), "the node's TCP tracking is liberal: INVALID packets are not dropped");
    }

    for (args, named) in [
        (["--conntrack-tcp-timeout-close-wait", "soon"], "--conntrack-tcp-timeout-close-wait"),
        (["--conntrack-max-per-core", "-1"], "--conntrack-max-per-core"),
    ] {
        let out = c.try_proxy_once(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(named), "{args:?}: {stderr}");
    }
    let bad = c.scratch_file("bad.yaml", "conntrack: {udpTimeout: often}\n");
    let out = c.try_proxy_once(&["--config", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("conntrack.udpTimeout"), "{stderr}");
}

/// A TCP segment seen by a raw socket (IPv4).
#[derive(Debug)]
struct Segment {
    source: SocketAddr,
    destination_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: Vec<u8>,
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

/// Parses an IPv4 packet carrying TCP, as a raw socket hands it over.
fn segment(packet: &[u8]) -> Option<Segment> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let source_ip = std::net::Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let tcp = packet.get(ihl..)?;
    let word = |i: usize| u32::from_be_bytes([tcp[i], tcp[i + 1], tcp[i + 2], tcp[i + 3]]);
    let offset = usize::from(tcp.get(12)? >> 4) * 4;
    Some(Segment {
        source: SocketAddr::new(source_ip.into(), u16::from_be_bytes([tcp[0], tcp[1]])),
        destination_port: u16::from_be_bytes([tcp[2], tcp[3]]),
        seq: word(4),
        ack: word(8),
        flags: tcp[13],
        payload: tcp.get(offset..)?.to_vec(),
    })
}

/// A TCP segment (header and payload) from `from` to `to` with its checksum, as upstream's
/// regression-issue-74839 server writes it.
fn encode(from: SocketAddr, to: SocketAddr, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20 + payload.len());
    tcp.extend(from.port().to_be_bytes());
    tcp.extend(to.port().to_be_bytes());
    tcp.extend(seq.to_be_bytes());
    tcp.extend(ack.to_be_bytes());
    tcp.extend([5 << 4, flags]);
    tcp.extend(64240u16.to_be_bytes());
    tcp.extend([0, 0, 0, 0]);
    tcp.extend(payload);
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.ip(), to.ip()) else { panic!("IPv4 only") };
    let mut pseudo = Vec::new();
    pseudo.extend(src.octets());
    pseudo.extend(dst.octets());
    pseudo.extend([0, 6]);
    pseudo.extend(u16::try_from(tcp.len()).unwrap().to_be_bytes());
    pseudo.extend(&tcp);
    if pseudo.len() % 2 == 1 {
        pseudo.push(0);
    }
    let mut sum: u32 = pseudo.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    tcp
}

/// A raw socket receiving a copy of every TCP packet for the calling thread's namespace.
fn tcp_tap() -> socket2::Socket {
    let tap = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::TCP))
        .expect("raw TCP socket");
    tap.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    tap
}

/// The next TCP segment the tap saw, if one comes within its timeout.
fn next_segment(tap: &socket2::Socket) -> Option<Segment> {
    let mut buffer = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
    let n = tap.recv(&mut buffer).ok()?;
    // SAFETY: recv initialised the first n bytes.
    let bytes: Vec<u8> = buffer[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
    segment(&bytes)
}

/// Upstream's e2e "proxy implementation should not be vulnerable to the invalid conntrack state
/// bug" (regression-issue-74839), in the lab: a client holds a TCP connection to a ClusterIP and
/// the endpoint injects two segments outside its window: upstream's, 100000 bytes behind it, and
/// one 2^30 bytes ahead of it, which conntrack calls INVALID unless TCP tracking is liberal (6.x
/// kernels let the one behind pass as part of the connection). Un-NATed, a segment would reach
/// the client from the pod's own address and the client would reset the connection. With liberal
/// tracking (`--conntrack-tcp-be-liberal`, kube-proxy's answer in both modes) both arrive
/// translated, from the ClusterIP; in iptables mode with strict tracking the INVALID one is
/// dropped (`KUBE-FORWARD`'s DROP of INVALID).
fn an_out_of_window_segment_from_an_endpoint_never_reaches_the_client_un_natted(backend: Backend) {
    let mut c = Cluster::new("rk-boom", backend);
    let pod = c.add_pod("boom-a", "app: boom", NODE);
    c.write("boom.yaml", &service_manifest("boom", 74, ""));
    let service = at(Family::V4.cluster_ip(74));
    let pod_address = SocketAddr::new(c.pod_ip(pod, Family::V4), ECHO_PORT);
    let mut runs: Vec<(&[&str], bool)> = vec![(&["--conntrack-tcp-be-liberal"], true)];
    if backend == Backend::Iptables {
        runs.insert(0, (&[], false));
    }
    let (behind, ahead): (&[u8], &[u8]) = (b"boom!!!", b"ahead!!");
    for (flags, liberal) in runs {
        c.proxy_once(flags);
        let (tap, connection, syn_ack) = c.client.ns.run(|| {
            let tap = tcp_tap();
            let connection = std::net::TcpStream::connect_timeout(&service, Duration::from_secs(2)).expect("connect");
            let port = connection.local_addr().expect("local address").port();
            let syn_ack = std::iter::from_fn(|| Some(next_segment(&tap)))
                .take(20)
                .flatten()
                .find(|s| s.destination_port == port && s.flags & (SYN | ACK) == SYN | ACK)
                .expect("the SYN-ACK, seen by the tap");
            (tap, connection, syn_ack)
        });
        if !backend.nats_local_clients() {
            // eBPF mode: connect() went to the endpoint itself and nothing is NATed per packet,
            // so nothing can leak un-NATed; only getpeername() names the ClusterIP.
            assert_eq!(syn_ack.source, pod_address, "the handshake answers from the endpoint");
            assert_eq!(connection.peer_addr().expect("peer"), service, "getpeername() says the ClusterIP");
            continue;
        }
        assert_eq!(syn_ack.source, service, "the handshake answers from the ClusterIP");
        let client = connection.local_addr().expect("local address");
        // As regression-issue-74839: our next byte acknowledged, the sequence number 100000 bytes
        // behind the endpoint's next one; then one far ahead of it.
        let next = syn_ack.seq.wrapping_add(1);
        let segments = [
            encode(pod_address, client, next.wrapping_sub(100_000), syn_ack.ack, PSH | ACK, behind),
            encode(pod_address, client, next.wrapping_add(1 << 30), syn_ack.ack, PSH | ACK, ahead),
        ];
        c.pods[pod].pod.ns.run(|| {
            let raw = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::TCP))
                .expect("raw TCP socket");
            for segment in &segments {
                raw.send_to(segment, &SocketAddr::new(client.ip(), 0).into()).expect("inject a segment");
            }
        });
        let seen: Vec<Segment> = c.client.ns.run(|| {
            std::iter::from_fn(|| next_segment(&tap)).filter(|s| s.destination_port == client.port()).collect()
        });
        let from = |payload: &[u8]| -> Vec<SocketAddr> {
            seen.iter().filter(|s| s.payload == payload).map(|s| s.source).collect()
        };
        let context = format!("{backend:?}, liberal {liberal}: the client saw {seen:?}");
        assert!(!from(behind).contains(&pod_address) && !from(ahead).contains(&pod_address), "un-NATed: {context}");
        if liberal {
            assert_eq!((from(behind), from(ahead)), (vec![service], vec![service]), "translated: {context}");
        } else {
            assert_eq!(from(ahead), [], "the INVALID segment is dropped: {context}");
        }
        drop(connection);
    }
}

/// `proxy --init-only --proxy-mode ipvs` (the privileged init container of an IPVS-mode
/// DaemonSet): where the kernel has IPVS it loads the modules and writes IPVS's settings (strict
/// ARP with `--ipvs-strict-arp`) in the node; where it has none (this machine) it fails at
/// once saying so. `tests/vm/run.sh` runs it on a kernel with IPVS.
#[test]
fn init_only_in_ipvs_mode_loads_ipvs_and_writes_its_settings_or_says_the_kernel_has_none() {
    let c = Cluster::new("rk-ipvsinit", Backend::Ipvs);
    let mut args = c.proxy_args_for("proxy", &["--init-only", "--ipvs-strict-arp", "--conntrack-max-per-core=0"]);
    args.retain(|a| !a.is_empty());
    let out = c.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !std::path::Path::new("/proc/net/ip_vs").exists() {
        assert!(!out.status.success(), "--init-only succeeded without IPVS");
        assert!(stderr.contains("IPVS is not available in this kernel"), "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let read = |path: &str| c.node_output(&["cat", path]).trim().to_string();
    for (path, value) in [
        ("/proc/sys/net/ipv4/vs/conntrack", "1"),
        ("/proc/sys/net/ipv4/vs/expire_nodest_conn", "1"),
        ("/proc/sys/net/ipv4/vs/expire_quiescent_template", "1"),
        ("/proc/sys/net/ipv4/conf/all/arp_ignore", "1"),
        ("/proc/sys/net/ipv4/conf/all/arp_announce", "2"),
    ] {
        assert_eq!(read(path), value, "{path}\n{stderr}");
    }
}
