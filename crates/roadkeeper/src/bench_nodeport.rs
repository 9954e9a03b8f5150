//! `roadkeeper bench nodeport`: packets per second through a NodePort from outside the node, each
//! mode side by side in one run. Three scratch namespaces: a sender, the node (the proxier of
//! the mode, programmed in-process by a full sync of a cluster of `--services` Services, one of
//! them the NodePort under test), and one pod behind it. The sender's threads blast small UDP
//! datagrams over several flows at the node's NodePort as fast as they can; the node translates
//! each packet to the pod (nftables, iptables: DNAT by conntrack after the first packet of a
//! flow; eBPF: the tc program at the node's interface), masquerades it (`externalTrafficPolicy:
//! Cluster`) and forwards it; the pod answers each flow once, so that its connection tracking
//! entry is established. The rate is what the pod's interface received per second. On veth
//! the sender's CPU also carries the node's work (a veth transmit runs the receiver's path), so
//! a cheaper path shows as more packets per second for the same CPUs.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use roadkeeper_cluster::k8s_openapi::api::core::v1::{Node, Service};
use roadkeeper_cluster::k8s_openapi::api::discovery::v1::EndpointSlice;
use roadkeeper_cluster::{Object, Store};
use roadkeeper_netlab::Netns;
use roadkeeper_netlab::cgroup::NodeCgroup;
use roadkeeper_rules::config::{ProxyConfig, ProxyMode};
use roadkeeper_rules::table::NodeInfo;

use crate::cli::NodePortBenchArgs;
use crate::proxy_cmd::kernel_proxier;

const SENDER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 10);
const NODE_PORT: u16 = 30080;
const POD_PORT: u16 = 9000;
/// Flows (source ports) each sender thread sends over, in turn.
const FLOWS_PER_SENDER: usize = 16;
/// Bytes of UDP payload per packet.
const PAYLOAD: usize = 18;

/// One mode's measurement.
struct Rate {
    /// Packets the pod's interface received per second.
    received: f64,
    /// Packets the senders handed to the kernel per second.
    sent: f64,
}

/// The cluster: Service 0 is the NodePort under test with the pod as its one endpoint (its
/// external traffic policy Local when `local`, else Cluster); the others are ClusterIP Services
/// with an endpoint each elsewhere (rules the node holds for them).
fn cluster(services: usize, local: bool) -> anyhow::Result<Store> {
    let policy = if local { "Local" } else { "Cluster" };
    let node: Node = serde_saphyr::from_str(&format!(
        "metadata: {{name: node-0}}\nstatus: {{addresses: [{{type: InternalIP, address: {NODE_IP}}}]}}\n"
    ))?;
    let mut objects = vec![Object::Node(node.into())];
    for i in 0..services {
        let spec = if i == 0 {
            format!(
                "type: NodePort, externalTrafficPolicy: {policy}, clusterIP: 10.96.0.1, \
                 ports: [{{port: 80, targetPort: {POD_PORT}, protocol: UDP, nodePort: {NODE_PORT}}}]"
            )
        } else {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i as u32);
            format!("clusterIP: {ip}, ports: [{{port: 80, targetPort: {POD_PORT}, protocol: UDP}}]")
        };
        let endpoint = if i == 0 { POD_IP } else { Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 245, 0, 0)) + i as u32) };
        let service: Service =
            serde_saphyr::from_str(&format!("metadata: {{name: svc-{i}, namespace: bench}}\nspec: {{{spec}}}\n"))?;
        let slice: EndpointSlice = serde_saphyr::from_str(&format!(
            "metadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\n\
             addressType: IPv4\nports: [{{port: {POD_PORT}, protocol: UDP}}]\n\
             endpoints: [{{addresses: [{endpoint}], nodeName: node-0}}]\n"
        ))?;
        objects.extend([Object::Service(service.into()), Object::EndpointSlice(slice.into())]);
    }
    Ok(Store::from_objects(objects))
}

/// The three namespaces, wired: sender --- node --- pod.
struct Hosts {
    sender: Netns,
    node: Netns,
    pod: Netns,
    /// eBPF mode's cgroup and bpffs of the node.
    cgroup: Option<Arc<NodeCgroup>>,
}

impl Hosts {
    fn new(ebpf: bool) -> anyhow::Result<Hosts> {
        let (sender, node, pod) = (Netns::new("rk-np-tx")?, Netns::new("rk-np-node")?, Netns::new("rk-np-pod")?);
        let link = |ns: &Netns, name: &str, peer: &Netns, peer_name: &str| -> anyhow::Result<()> {
            ns.exec(["ip", "link", "add", name, "type", "veth", "peer", "name", peer_name, "netns", peer.name()])?;
            Ok(())
        };
        link(&sender, "tx0", &node, "up0")?;
        link(&node, "pod0", &pod, "eth0")?;
        let cmds: [(&Netns, &[&str]); 11] = [
            (&sender, &["ip", "addr", "add", &format!("{SENDER_IP}/24"), "dev", "tx0"]),
            (&sender, &["ip", "link", "set", "tx0", "up"]),
            (&node, &["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "up0"]),
            (&node, &["ip", "link", "set", "up0", "up"]),
            (&node, &["ip", "addr", "add", &format!("{POD_GATEWAY}/24"), "dev", "pod0"]),
            (&node, &["ip", "link", "set", "pod0", "up"]),
            (&node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]),
            (&pod, &["ip", "addr", "add", &format!("{POD_IP}/24"), "dev", "eth0"]),
            (&pod, &["ip", "link", "set", "eth0", "up"]),
            (&pod, &["ip", "route", "add", "default", "via", &POD_GATEWAY.to_string()]),
            (&node, &["sysctl", "-qw", "net.netfilter.nf_conntrack_max=1048576"]),
        ];
        for (ns, args) in cmds {
            ns.exec(args).with_context(|| format!("in {}: {}", ns.name(), args.join(" ")))?;
        }
        let cgroup = match ebpf {
            true => {
                let cgroup = Arc::new(NodeCgroup::new(node.name()).context("the node's cgroup")?);
                node.place_in(cgroup.clone());
                Some(cgroup)
            }
            false => None,
        };
        Ok(Hosts { sender, node, pod, cgroup })
    }

    /// Packets the pod's interface has received (read by a process of the namespace: `/sys`
    /// shows the interfaces of the namespace that mounted it).
    fn received(&self) -> anyhow::Result<u64> {
        let out = self.pod.exec(["cat", "/sys/class/net/eth0/statistics/rx_packets"])?;
        Ok(String::from_utf8(out.stdout)?.trim().parse()?)
    }
}

/// Sends from `threads` threads for `seconds` (after a second of warm-up) and reads what the pod
/// received.
fn blast(hosts: &Hosts, threads: usize, seconds: u32) -> anyhow::Result<Rate> {
    let stop = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let target = SocketAddr::from((NODE_IP, NODE_PORT));
    let (before, after, window) = std::thread::scope(|scope| -> anyhow::Result<(u64, u64, (u64, Duration))> {
        for _ in 0..threads {
            scope.spawn(|| {
                hosts.sender.run(|| -> anyhow::Result<()> {
                    let sockets: Vec<UdpSocket> = (0..FLOWS_PER_SENDER)
                        .map(|_| {
                            let socket = UdpSocket::bind((SENDER_IP, 0))?;
                            socket.connect(target)?;
                            Ok(socket)
                        })
                        .collect::<anyhow::Result<_>>()?;
                    let payload = [0u8; PAYLOAD];
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for socket in &sockets {
                            // A full queue drops, as a NIC would: count only what left.
                            n += u64::from(socket.send(&payload).is_ok());
                        }
                        if n >= 4096 {
                            sent.fetch_add(n, Ordering::Relaxed);
                            n = 0;
                        }
                    }
                    sent.fetch_add(n, Ordering::Relaxed);
                    Ok(())
                })
            });
        }
        let result = (|| {
            std::thread::sleep(Duration::from_secs(1));
            let (before, sent_before, start) = (hosts.received()?, sent.load(Ordering::Relaxed), Instant::now());
            std::thread::sleep(Duration::from_secs(u64::from(seconds)));
            let (after, sent_after, took) = (hosts.received()?, sent.load(Ordering::Relaxed), start.elapsed());
            Ok((before, after, (sent_after - sent_before, took)))
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })?;
    let (sent, took) = window;
    Ok(Rate { received: (after - before) as f64 / took.as_secs_f64(), sent: sent as f64 / took.as_secs_f64() })
}

/// Programs a fresh node in `mode` and measures.
fn measure(mode: ProxyMode, args: &NodePortBenchArgs, store: &Store) -> anyhow::Result<Rate> {
    let hosts = Hosts::new(mode == ProxyMode::Ebpf)?;
    let mut cfg = ProxyConfig {
        hostname: "node-0".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse()?],
        mode,
        ..ProxyConfig::default()
    };
    if let Some(cgroup) = &hosts.cgroup {
        cfg.ebpf.cgroup_root = Some(cgroup.path().to_path_buf());
        cfg.ebpf.bpf_root = cgroup.bpf_root();
    }
    let node = NodeInfo {
        name: "node-0".into(),
        primary_ips: vec![NODE_IP.into()],
        local_addresses: vec![NODE_IP.into(), POD_GATEWAY.into()],
        ..NodeInfo::default()
    };
    let _proxier = hosts.node.run(|| -> anyhow::Result<_> {
        let mut proxier = kernel_proxier(&cfg, node, store)?;
        let report = proxier.sync(store, &Default::default())?;
        anyhow::ensure!(report.refused.is_empty(), "the sync refused {:?}", report.refused.first());
        Ok(proxier)
    })?;
    // The pod answers the first datagram of each flow, so that conntrack sees both directions
    // (a UDP flow whose packets all go one way stays new, and each of its packets meets the
    // rules for new connections), then reads no more: a full queue drops the rest, after the
    // interface counted them.
    let sink = hosts.pod.run(|| UdpSocket::bind((POD_IP, POD_PORT)))?;
    sink.set_read_timeout(Some(Duration::from_secs(2)))?;
    let flows = args.senders * FLOWS_PER_SENDER;
    let answering = std::thread::spawn(move || {
        let (mut seen, mut buf) = (std::collections::HashSet::new(), [0u8; 64]);
        while seen.len() < flows {
            let Ok((_, peer)) = sink.recv_from(&mut buf) else { break };
            if seen.insert(peer) {
                let _ = sink.send_to(b"ok", peer);
            }
        }
        (sink, seen.len())
    });
    let rate = blast(&hosts, args.senders, args.seconds)?;
    let (_sink, answered) = answering.join().map_err(|_| anyhow::anyhow!("the pod's thread panicked"))?;
    anyhow::ensure!(answered == flows, "the pod saw {answered} of {flows} flows in {mode} mode");
    anyhow::ensure!(rate.received > 0.0, "no packet reached the pod through the NodePort in {mode} mode");
    Ok(rate)
}

/// Runs the benchmark for every requested mode and prints a Markdown table, each mode's rate as
/// a ratio to the first mode's.
pub fn run(args: NodePortBenchArgs) -> anyhow::Result<()> {
    let modes: Vec<ProxyMode> = args.proxy_mode.iter().map(|m| m.parse()).collect::<Result<_, _>>()?;
    anyhow::ensure!(!modes.is_empty(), "--proxy-mode: no mode");
    anyhow::ensure!(!modes.contains(&ProxyMode::Ipvs), "--proxy-mode: ipvs is not measured here");
    let store = cluster(args.services, args.local)?;
    let policy = match args.local {
        true => "externalTrafficPolicy Local: translated, the client's address kept",
        false => "externalTrafficPolicy Cluster: translated and masqueraded",
    };
    let mut table = format!(
        "{} Services, UDP datagrams of {PAYLOAD} bytes from {} sender threads over {} flows each to a NodePort \
         ({policy}), {} s per mode, measured in one run of `roadkeeper bench nodeport`\n\n\
         | mode | received by the pod | sent | ratio to {} |\n|---|---|---|---|\n",
        args.services, args.senders, FLOWS_PER_SENDER, args.seconds, modes[0]
    );
    print!("{table}");
    let mut first = None;
    for mode in &modes {
        let rate = measure(*mode, &args, &store).with_context(|| format!("{mode} mode"))?;
        let base = *first.get_or_insert(rate.received);
        let line = format!("| {mode} | {:.0}/s | {:.0}/s | {:.2} |\n", rate.received, rate.sent, rate.received / base);
        print!("{line}");
        table.push_str(&line);
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)?;
        let mut text = String::new();
        let _ = write!(text, "{table}");
        std::fs::write(out.join("nodeport.md"), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_valid_and_its_node_port_leads_to_the_pod() {
        let store = cluster(3, false).unwrap();
        assert_eq!(store.services().count(), 3);
        let cfg = ProxyConfig { hostname: "node-0".into(), mode: ProxyMode::Ebpf, ..ProxyConfig::default() };
        let node = NodeInfo { name: "node-0".into(), primary_ips: vec![NODE_IP.into()], ..NodeInfo::default() };
        let plan = roadkeeper_rules::plan::NodePlan::new(&store, &cfg, &node, &[]);
        let ruleset = roadkeeper_rules::trace::Ruleset::of(&plan).unwrap();
        let packet = roadkeeper_rules::trace::Packet {
            entry: roadkeeper_rules::trace::Entry::Received,
            source: SENDER_IP.into(),
            destination: SocketAddr::from((NODE_IP, NODE_PORT)),
            protocol: roadkeeper_rules::table::Protocol::Udp,
        };
        let trace = ruleset.trace(&packet, &Default::default()).unwrap();
        assert_eq!(trace.paths.len(), 1);
        assert_eq!(trace.paths[0].dnat, Some(SocketAddr::from((POD_IP, POD_PORT))));
    }
}
