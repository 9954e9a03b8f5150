//! End-to-end tests with real namespaces and packets (need root).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::Duration;

use roadkeeper_netlab::addressing::*;
use roadkeeper_netlab::topology::{BRIDGE, POD_VETH_PREFIX};
use roadkeeper_netlab::{EchoServer, Lab, Netns, Pod, ProbeResult, echo, probe};

const TIMEOUT: Duration = Duration::from_secs(2);
const PORT: u16 = 8080;

/// Starts an echo server named `name` inside `ns`.
fn echo_in(ns: &Netns, name: &str, listen: &[SocketAddr]) -> EchoServer {
    ns.run(|| echo::serve(listen, name)).unwrap()
}

/// Both of a pod's addresses on [`PORT`].
fn pod_addrs(pod: &Pod) -> [SocketAddr; 2] {
    [SocketAddr::new(pod.ipv4.into(), PORT), SocketAddr::new(pod.ipv6.into(), PORT)]
}

/// Probes `target` over TCP and UDP from `from`; both must reach echo server
/// `name` at `target` and show the client as `peer`.
fn assert_echo(from: &Netns, target: SocketAddr, name: &str, peer: IpAddr) {
    let results = from.run(|| [probe::tcp(target, TIMEOUT), probe::udp(target, TIMEOUT)]);
    for (proto, result) in ["tcp", "udp"].into_iter().zip(results) {
        let reply = result.into_reply().unwrap_or_else(|err| panic!("{proto} {target} from {}: {err}", from.name()));
        assert_eq!(reply.name, name, "{proto} {target}");
        assert_eq!(reply.local, target, "{proto} {target}");
        assert_eq!(reply.peer.ip(), peer, "{proto} {target}");
    }
}

/// Both TCP and UDP probes from `from` to `target` end as `expected`.
fn assert_probes(from: &Netns, target: SocketAddr, expected: &ProbeResult, timeout: Duration) {
    let results = from.run(|| [probe::tcp(target, timeout), probe::udp(target, timeout)]);
    assert_eq!(results, [expected.clone(), expected.clone()], "{target}");
}

/// Output of `ip netns list`.
fn netns_list() -> String {
    String::from_utf8(std::process::Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap()
}

#[test]
fn echo_and_probe_within_a_pod() {
    let lab = Lab::new("t-local").unwrap();
    let pod = lab.add_pod("a").unwrap();
    let _echo = echo_in(&pod.ns, "a", &pod_addrs(&pod));
    assert_echo(&pod.ns, pod_addrs(&pod)[0], "a", pod.ipv4.into());
    assert_echo(&pod.ns, pod_addrs(&pod)[1], "a", pod.ipv6.into());
}

#[test]
fn pods_reach_each_other_the_node_and_the_external_host() {
    let lab = Lab::new("t-reach").unwrap();
    let a = lab.add_pod("a").unwrap();
    let b = lab.add_pod("b").unwrap();
    assert_eq!(a.ipv4, Ipv4Addr::new(10, 244, 0, 10));
    assert_eq!(b.ipv6, "fd00:244::11".parse::<Ipv6Addr>().unwrap());
    let _echo_b = echo_in(&b.ns, "b", &pod_addrs(&b));
    let ext = [SocketAddr::new(EXTERNAL_HOST_IPV4.into(), PORT), SocketAddr::new(EXTERNAL_HOST_IPV6.into(), PORT)];
    let _echo_ext = echo_in(lab.external(), "ext", &ext);
    let node = [SocketAddr::new(NODE_IPV4.into(), PORT), SocketAddr::new(NODE_IPV6.into(), PORT)];
    let _echo_node = echo_in(lab.node(), "node", &node);

    for (family, (to_b, (to_ext, to_node))) in pod_addrs(&b).into_iter().zip(ext.into_iter().zip(node)).enumerate() {
        let a_ip: IpAddr = [IpAddr::from(a.ipv4), a.ipv6.into()][family];
        assert_echo(&a.ns, to_b, "b", a_ip);
        assert_echo(&a.ns, to_ext, "ext", a_ip);
        assert_echo(&a.ns, to_node, "node", a_ip);
        assert_echo(lab.external(), to_b, "b", to_ext.ip());
    }
}

#[test]
fn refused_and_timeout_are_distinguished() {
    let lab = Lab::new("t-refuse").unwrap();
    let a = lab.add_pod("a").unwrap();
    let b = lab.add_pod("b").unwrap();
    for target in pod_addrs(&b) {
        assert_probes(&a.ns, target, &ProbeResult::Refused, TIMEOUT);
    }
    for nft in ["add table inet t", "add chain inet t c { type filter hook input priority 0; policy drop; }"] {
        b.ns.exec(["nft", nft]).unwrap();
    }
    for target in pod_addrs(&b) {
        assert_probes(&a.ns, target, &ProbeResult::Timeout, Duration::from_millis(300));
    }
}

#[test]
fn wildcard_udp_reports_the_real_destination() {
    let lab = Lab::new("t-wild").unwrap();
    let a = lab.add_pod("a").unwrap();
    let b = lab.add_pod("b").unwrap();
    let wildcard =
        [SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT), SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), PORT)];
    let _echo = echo_in(&b.ns, "b", &wildcard);
    assert_echo(&a.ns, pod_addrs(&b)[0], "b", a.ipv4.into());
    assert_echo(&a.ns, pod_addrs(&b)[1], "b", a.ipv6.into());
    let loopback = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), PORT);
    assert_echo(&b.ns, loopback, "b", Ipv4Addr::LOCALHOST.into());
}

#[test]
fn extra_node_address_is_reachable_from_outside() {
    let lab = Lab::new("t-addr").unwrap();
    lab.add_node_address("192.168.77.3/24".parse().unwrap()).unwrap();
    let target = "192.168.77.3:80".parse().unwrap();
    let _echo = echo_in(lab.node(), "node", &[target]);
    assert_echo(lab.external(), target, "node", EXTERNAL_HOST_IPV4.into());
}

#[test]
fn exec_and_sysctl_work_in_the_namespace() {
    let lab = Lab::new("t-exec").unwrap();
    let forwarding = lab.node().exec(["cat", "/proc/sys/net/ipv4/ip_forward"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&forwarding.stdout).trim(), "1");
    let err = lab.node().exec(["ip", "link", "show", "nonexistent0"]).unwrap_err();
    assert!(format!("{err:#}").contains("nonexistent0"), "{err:#}");
}

#[test]
fn dropping_a_lab_removes_namespaces_and_kills_processes() {
    let lab = Lab::new("t-drop").unwrap();
    let pod = lab.add_pod("a").unwrap();
    let process = lab.node().spawn(["sleep", "600"]).unwrap();
    let pid = process.id();
    let names = [lab.node().name().to_owned(), lab.external().name().to_owned(), pod.ns.name().to_owned()];
    assert!(names.iter().all(|name| netns_list().contains(name.as_str())));
    drop(pod);
    drop(lab);
    let list = netns_list();
    assert!(names.iter().all(|name| !list.contains(name.as_str())), "{list}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    assert!(process.try_wait().unwrap().is_some());
}

#[test]
fn a_panicking_test_still_cleans_up() {
    let mut names = Vec::new();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let lab = Lab::new("t-panic").unwrap();
        let pod = lab.add_pod("a").unwrap();
        names = vec![lab.node().name().to_owned(), lab.external().name().to_owned(), pod.ns.name().to_owned()];
        panic!("test failure");
    }));
    assert!(outcome.is_err());
    assert_eq!(names.len(), 3);
    let list = netns_list();
    assert!(names.iter().all(|name| !list.contains(name.as_str())), "{list}");
}

/// The node's pod bridge in the node namespace: its MAC address.
fn bridge_mac(lab: &Lab) -> String {
    let out = lab.node().ip(["-br", "link", "show", BRIDGE]).unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    line.split_whitespace().nth(2).expect("ip -br link: name state address").to_owned()
}

/// A Linux bridge whose address was never set takes the lowest MAC of its ports, so a pod
/// joining with a lower one would change the gateway's MAC under every other pod: their frames
/// to the old one are then bridged instead of routed, which IPVS mode (DNAT in LOCAL_IN, not
/// PREROUTING) cannot catch. The lab's bridge keeps one address, as kubenet's cbr0 does.
#[test]
fn a_pod_joining_with_the_lowest_mac_leaves_the_gateway_mac_alone() {
    let lab = Lab::new("t-brmac").unwrap();
    let _a = lab.add_pod("a").unwrap();
    let before = bridge_mac(&lab);
    let _b = lab.add_pod("b").unwrap();
    // The node's side of b's veth (the second pod's) gets the lowest unicast MAC there is.
    lab.node().ip(["link", "set", &format!("{POD_VETH_PREFIX}1"), "address", "00:00:00:00:00:01"]).unwrap();
    assert_eq!(bridge_mac(&lab), before, "the bridge's MAC changed when pod b joined");
}
