//! [`IpvsKernel`] and [`DummyInterface`] against a live kernel with IPVS and the dummy driver,
//! each test in fresh network namespaces (needs root, `ip` and `ipvsadm`). This machine's
//! kernel has neither, so they are ignored here and run in a VM: `tests/vm/run.sh --backend
//! ipvs` runs them (`--include-ignored ipvs::`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use roadkeeper_cluster::NamespacedName;
use roadkeeper_netlab::{Lab, Netns};
use roadkeeper_rules::ipvs::{FrontendKind, IpvsOp, RealServer, Scheduler, VirtualKey, VirtualServer};
use roadkeeper_rules::table::{Protocol, ServicePortName};

use super::dummy::DummyInterface;
use super::exchange::IpvsError;
use super::kernel::{IpvsKernel, KernelDest, KernelService};

fn key(address: &str, port: u16) -> VirtualKey {
    VirtualKey { protocol: Protocol::Tcp, address: address.parse().unwrap(), port }
}

fn real(address: &str, port: u16) -> RealServer {
    RealServer { address: address.parse().unwrap(), port }
}

fn server(scheduler: Scheduler, persistence: Option<u32>) -> VirtualServer {
    let service =
        ServicePortName { service: NamespacedName::new("ns", "svc"), port: String::new(), protocol: Protocol::Tcp };
    VirtualServer { service, kind: FrontendKind::ClusterIp, scheduler, persistence, real_servers: Default::default() }
}

/// (real server, weight) of each destination, sorted.
fn weights(dests: Vec<KernelDest>) -> Vec<(RealServer, u32)> {
    let mut out: Vec<_> = dests.into_iter().map(|d| (d.real, d.weight)).collect();
    out.sort();
    out
}

fn ipvsadm(ns: &Netns, args: &[&str]) -> String {
    String::from_utf8(ns.exec([&["ipvsadm"], args].concat()).expect("ipvsadm").stdout).unwrap()
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn the_ipvs_family_is_resolved_and_the_table_starts_empty() {
    let ns = Netns::new("rk-ipvs-open").expect("netns");
    let services = ns.run(|| IpvsKernel::open().expect("open").services().expect("services"));
    assert_eq!(services, []);
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn services_and_destinations_are_added_listed_edited_and_deleted_in_both_families() {
    let ns = Netns::new("rk-ipvs-ops").expect("netns");
    for (vip, a, b) in [("10.96.0.10", "10.244.0.5", "10.244.0.6"), ("fd00:96::10", "fd00:244::5", "fd00:244::6")] {
        let (vs, a, b) = (key(vip, 80), real(a, 8080), real(b, 8080));
        ns.run(|| {
            let mut ipvs = IpvsKernel::open().expect("open");
            let add = [
                IpvsOp::AddService(vs, server(Scheduler::RoundRobin, None)),
                IpvsOp::AddDest(vs, a, 1),
                IpvsOp::AddDest(vs, b, 2),
            ];
            ipvs.apply(&add).expect("add");
            let listed = KernelService { key: vs, scheduler: "rr".into(), persistence: None };
            assert_eq!(ipvs.services().unwrap(), [listed]);
            assert_eq!(weights(ipvs.dests(&vs).unwrap()), [(a, 1), (b, 2)]);

            ipvs.apply(&[IpvsOp::EditDest(vs, a, 0)]).expect("drain");
            assert_eq!(weights(ipvs.dests(&vs).unwrap()), [(a, 0), (b, 2)]);
            ipvs.apply(&[IpvsOp::DelDest(vs, a)]).expect("delete dest");
            assert_eq!(weights(ipvs.dests(&vs).unwrap()), [(b, 2)]);

            ipvs.apply(&[IpvsOp::EditService(vs, server(Scheduler::WeightedRoundRobin, Some(600)))]).expect("edit");
            let listed = KernelService { key: vs, scheduler: "wrr".into(), persistence: Some(600) };
            assert_eq!(ipvs.services().unwrap(), [listed]);

            ipvs.apply(&[IpvsOp::DelService(vs)]).expect("delete service");
            assert_eq!(ipvs.services().unwrap(), []);
            assert_eq!(ipvs.dests(&vs).unwrap(), [], "the destinations of an absent service");
        });
    }
    // What ipvsadm shows of a table we made: the same objects.
    let vs = key("10.96.0.11", 443);
    ns.run(|| {
        let ops = [
            IpvsOp::AddService(vs, server(Scheduler::SourceHashing, None)),
            IpvsOp::AddDest(vs, real("10.244.0.7", 8443), 3),
        ];
        IpvsKernel::open().unwrap().apply(&ops).unwrap()
    });
    let listing = ipvsadm(&ns, &["-Ln"]);
    assert!(listing.contains("TCP  10.96.0.11:443 sh"), "{listing}");
    let dest = listing.lines().find(|l| l.contains("-> 10.244.0.7:8443")).unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(dest.split_whitespace().skip(2).take(2).collect::<Vec<_>>(), ["Masq", "3"], "{listing}");
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn adding_twice_and_deleting_absent_objects_succeed_and_other_errors_are_named() {
    let ns = Netns::new("rk-ipvs-idem").expect("netns");
    let (vs, a, b) = (key("10.96.0.10", 80), real("10.244.0.5", 8080), real("10.244.0.6", 8080));
    ns.run(|| {
        let mut ipvs = IpvsKernel::open().expect("open");
        let add = [IpvsOp::AddService(vs, server(Scheduler::RoundRobin, None)), IpvsOp::AddDest(vs, a, 1)];
        ipvs.apply(&add).expect("add");
        // What the kernel itself answers for duplicates and absent objects.
        let raw = ipvs
            .raw_errnos(&[
                add[0].clone(),
                add[1].clone(),
                IpvsOp::DelDest(vs, b),
                IpvsOp::DelService(key("10.96.0.99", 80)),
            ])
            .unwrap();
        assert_eq!(
            raw,
            [libc::EEXIST, libc::EEXIST, libc::ENOENT, libc::ESRCH],
            "NEW_SERVICE, NEW_DEST, DEL_DEST, DEL_SERVICE"
        );
        let raw = ipvs.raw_errnos(&[IpvsOp::DelDest(key("10.96.0.99", 80), a)]).unwrap();
        assert_eq!(raw, [libc::ESRCH], "DEL_DEST of an absent service");

        ipvs.apply(&add).expect("adding again is done");
        // Adding again with other settings sets them.
        ipvs.apply(&[IpvsOp::AddService(vs, server(Scheduler::LeastConnection, Some(30))), IpvsOp::AddDest(vs, a, 5)])
            .expect("adding over what exists");
        let listed = KernelService { key: vs, scheduler: "lc".into(), persistence: Some(30) };
        assert_eq!(ipvs.services().unwrap(), [listed]);
        assert_eq!(weights(ipvs.dests(&vs).unwrap()), [(a, 5)]);

        ipvs.apply(&[IpvsOp::DelDest(vs, b)]).expect("deleting an absent destination is done");
        ipvs.apply(&[IpvsOp::DelService(vs), IpvsOp::DelService(vs), IpvsOp::DelDest(vs, a)]).expect("deleting twice");
        assert_eq!(ipvs.services().unwrap(), []);

        // Editing what does not exist is an error naming the operation and the errno.
        let error = ipvs.apply(&[IpvsOp::EditDest(vs, a, 1)]).unwrap_err();
        assert!(matches!(error, crate::Error::Ipvs(IpvsError::Refused { errno: libc::ESRCH, .. })), "{error}");
        assert_eq!(
            error.to_string(),
            "IPVS_CMD_SET_DEST TCP 10.96.0.10:80 -> 10.244.0.5:8080 weight 1: No such process (ESRCH)"
        );
    });
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn a_thousand_services_go_in_few_datagrams_and_list_back() {
    let ns = Netns::new("rk-ipvs-many").expect("netns");
    let keys: Vec<VirtualKey> = (0..1500u16)
        .map(|i| VirtualKey { protocol: Protocol::Udp, address: "10.96.0.10".parse().unwrap(), port: 1000 + i })
        .collect();
    ns.run(|| {
        let mut ipvs = IpvsKernel::open().expect("open");
        let ops: Vec<IpvsOp> = keys
            .iter()
            .flat_map(|k| {
                [
                    IpvsOp::AddService(*k, server(Scheduler::RoundRobin, None)),
                    IpvsOp::AddDest(*k, real("10.244.0.5", 53), 1),
                ]
            })
            .collect();
        ipvs.apply(&ops).expect("add");
        let listed: BTreeSet<VirtualKey> = ipvs.services().unwrap().into_iter().map(|s| s.key).collect();
        assert_eq!(listed, keys.iter().copied().collect());
        ipvs.apply(&keys.iter().map(|k| IpvsOp::DelService(*k)).collect::<Vec<_>>()).expect("delete");
        assert_eq!(ipvs.services().unwrap(), []);
    });
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn timeouts_are_set() {
    let ns = Netns::new("rk-ipvs-timeouts").expect("netns");
    ns.run(|| {
        let mut ipvs = IpvsKernel::open().expect("open");
        let s = Duration::from_secs;
        ipvs.set_timeouts(s(900), s(120), s(300)).expect("set");
        ipvs.set_timeouts(Duration::ZERO, Duration::ZERO, Duration::ZERO).expect("nothing to set");
        ipvs.set_timeouts(s(901), Duration::ZERO, Duration::ZERO).expect("one of three");
    });
    let shown = ipvsadm(&ns, &["-L", "--timeout"]);
    assert!(shown.contains("Timeout (tcp tcpfin udp): 901 120 300"), "{shown}");
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn the_dummy_interface_is_made_once_holds_both_families_and_is_deleted() {
    let ns = Netns::new("rk-ipvs-dummy").expect("netns");
    let (v4, v6): (IpAddr, IpAddr) = ("10.96.0.10".parse().unwrap(), "fd00:96::10".parse().unwrap());
    ns.run(|| {
        let mut dummy = DummyInterface::ensure("kube-ipvs0").expect("create");
        let mut again = DummyInterface::ensure("kube-ipvs0").expect("find");
        for ip in [v4, v6, v4, v6] {
            dummy.add_address(ip).expect("add (twice: done)");
        }
        assert_eq!(again.addresses().unwrap(), BTreeSet::from([v4, v6]));
    });
    let link = String::from_utf8(ns.ip(["-d", "link", "show", "kube-ipvs0"]).unwrap().stdout).unwrap();
    assert!(link.contains("dummy") && link.contains("state DOWN"), "{link}");
    // Down, its addresses are local all the same: the kernel delivers their packets to IPVS.
    for ip in [v4, v6] {
        let route = String::from_utf8(ns.ip(["route", "get", &ip.to_string()]).unwrap().stdout).unwrap();
        assert!(route.starts_with("local "), "{route}");
    }
    ns.run(|| {
        let mut dummy = DummyInterface::ensure("kube-ipvs0").expect("find");
        dummy.del_address(v4).expect("delete");
        dummy.del_address(v4).expect("delete again: done");
        assert_eq!(dummy.addresses().unwrap(), BTreeSet::from([v6]));
        assert!(DummyInterface::delete("kube-ipvs0").expect("delete link"));
        assert!(!DummyInterface::delete("kube-ipvs0").expect("delete absent link"));
    });
    assert!(ns.ip(["link", "show", "kube-ipvs0"]).is_err(), "the link is gone");
    // A link of the name that is not a dummy is not taken over.
    ns.ip(["link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "rk-peer"]).unwrap();
    let error = ns.run(|| DummyInterface::ensure("kube-ipvs0").unwrap_err());
    assert!(matches!(&error, crate::Error::Ipvs(IpvsError::NotDummy { kind, .. }) if kind == "veth"), "{error}");
}

#[test]
#[ignore = "needs a kernel with IPVS and dummy: tests/vm/run.sh --backend ipvs"]
fn a_connection_to_a_virtual_server_on_the_down_dummy_reaches_the_pod_and_is_counted() {
    let lab = Lab::new("rk-ipvs-conn").expect("lab");
    let pod = lab.add_pod("a").expect("pod");
    for (vip, pod_ip) in [
        ("10.96.0.10".parse::<IpAddr>().unwrap(), IpAddr::V4(pod.ipv4)),
        ("fd00:96::10".parse().unwrap(), IpAddr::V6(pod.ipv6)),
    ] {
        let vs = VirtualKey { protocol: Protocol::Tcp, address: vip, port: 80 };
        let rs = RealServer { address: pod_ip, port: 8080 };
        lab.node().run(|| {
            DummyInterface::ensure("kube-ipvs0").unwrap().add_address(vip).unwrap();
            let ops = [IpvsOp::AddService(vs, server(Scheduler::RoundRobin, None)), IpvsOp::AddDest(vs, rs, 1)];
            IpvsKernel::open().unwrap().apply(&ops).unwrap();
        });
        let listener = pod.ns.run(|| TcpListener::bind(SocketAddr::new(pod_ip, 8080)).expect("listen"));
        let greeter = std::thread::spawn(move || {
            let (mut stream, peer) = listener.accept().expect("accept");
            writeln!(stream, "hello {peer}").unwrap();
            let mut line = String::new();
            // Held open until the client closes.
            BufReader::new(&stream).read_line(&mut line).unwrap();
        });
        let client = lab.external().run(|| {
            TcpStream::connect_timeout(&SocketAddr::new(vip, 80), Duration::from_secs(5))
                .expect("connect to the virtual server")
        });
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = String::new();
        BufReader::new(&client).read_line(&mut line).expect("the pod's greeting");
        assert!(line.starts_with("hello "), "{line:?}");
        let dests = lab.node().run(|| IpvsKernel::open().unwrap().dests(&vs).unwrap());
        assert_eq!(dests.len(), 1);
        assert_eq!((dests[0].real, dests[0].active_connections), (rs, 1), "{dests:?}");
        drop(client);
        greeter.join().unwrap();
    }
}

/// Runs everywhere (root): this machine's kernel has no IPVS, the VM's has.
#[test]
fn open_resolves_ipvs_or_says_the_kernel_has_none() {
    let ns = Netns::new("rk-ipvs-avail").expect("netns");
    let opened = ns.run(IpvsKernel::open);
    // Looked at after the lookup, which may have loaded the module.
    let has_ipvs = std::path::Path::new("/sys/module/ip_vs").exists();
    match opened {
        Ok(_) => assert!(has_ipvs, "IPVS opened without an ip_vs module"),
        Err(crate::Error::Ipvs(IpvsError::Unavailable)) => {
            assert!(!has_ipvs, "ip_vs is there but its family was not found");
            let message = crate::Error::Ipvs(IpvsError::Unavailable).to_string();
            assert!(message.starts_with("IPVS is not available in this kernel"), "{message}");
        }
        Err(other) => panic!("neither IPVS nor its absence: {other}"),
    }
}
