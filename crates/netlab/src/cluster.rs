//! A multi-node cluster network out of namespaces (the root namespace is untouched): a router
//! namespace whose bridge is the network joining the nodes, N node namespaces, routed pod
//! namespaces on each node (one /24 of pod addresses per node, routed between nodes), a client
//! host outside the cluster and an "internet" host beyond the router.
//!
//! ```text
//!  client 198.51.100.10 ─┐              ┌─ node-1 192.168.77.11 ── pods 10.244.1.0/24
//!                        router (br0 192.168.77.1) ─ node-2 192.168.77.12 ── pods 10.244.2.0/24
//!  internet 203.0.113.10 ┘              └─ ...
//! ```
//!
//! Pods are routed, not bridged (as the `ptp` CNI plugin does): a pod has its address as a /32
//! and a default route via its node's pod gateway (`10.244.<n>.1`, on every pod veth of the
//! node), the node a /32 route to each pod. So every packet between pods, even on one node,
//! crosses the node's IP stack and its netfilter hooks, without `br_netfilter`. Nodes route the
//! other nodes' pod ranges to them; the router knows no pod range, so a pod reaches the client or
//! the internet host only masqueraded to its node's address (the rule every node gets, as a CNI
//! would install it). Load-balancer addresses ([`LB_POOL`]) are routed by the router to every
//! node (ECMP), as a load balancer announcing them would.
//!
//! Namespaces are created under names the caller chooses and outlive this process: the caller
//! deletes them (see [`crate::netns::delete`]). The address plan is the same in every cluster:
//! namespaces keep clusters apart.

use std::net::Ipv4Addr;

use anyhow::{Context, Result, ensure};
use ipnet::Ipv4Net;

use crate::netns::Netns;

/// The network joining the nodes (the router's bridge).
pub const NODE_NETWORK: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 77, 0), 24);
/// The router's address on the node network: the nodes' default gateway.
pub const ROUTER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
/// Every node's pod range lies in this one.
pub const CLUSTER_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 0, 0), 16);
/// ClusterIPs.
pub const SERVICE_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 96, 0, 0), 12);
/// Load-balancer addresses: routed by the router to the nodes.
pub const LB_POOL: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 77, 192), 26);
/// The client's network, behind the router.
pub const CLIENT_NETWORK: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 51, 100, 0), 24);
/// The client host's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The internet host's network, behind the router.
pub const INTERNET_NETWORK: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(203, 0, 113, 0), 24);
/// The internet host's address.
pub const INTERNET_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// Most nodes a cluster may have.
pub const MAX_NODES: u8 = 50;
/// The interface every host and pod has towards its network.
pub const INTERFACE: &str = "eth0";
/// The table holding each node's masquerading of pod traffic leaving the cluster.
pub const NAT_TABLE: &str = "roadkeeper-lab";

/// Node `n`'s address (`n` from 1): 192.168.77.(10+n).
pub fn node_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, 10 + n)
}

/// Node `n`'s pod range: 10.244.n.0/24.
pub fn pod_cidr(n: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(10, 244, n, 0), 24)
}

/// Node `n`'s pod gateway (the node's address on each of its pod links): 10.244.n.1.
pub fn pod_gateway(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, n, 1)
}

/// Namespace names of a cluster's hosts.
#[derive(Clone, Debug)]
pub struct Hosts {
    /// The router, whose bridge joins the nodes.
    pub router: String,
    /// The nodes, node 1 first.
    pub nodes: Vec<String>,
    /// The client host.
    pub client: String,
    /// The internet host.
    pub internet: String,
}

/// Sysctls of every host: no ICMP rate limit (probes are refused reliably) and no reverse-path
/// filter (ECMP and NAT make paths asymmetric).
const HOST_SYSCTLS: [(&str, &str); 3] =
    [("net.ipv4.icmp_ratelimit", "0"), ("net.ipv4.conf.all.rp_filter", "0"), ("net.ipv4.conf.default.rp_filter", "0")];

/// Creates and wires every host (namespaces left in place); fails if one already exists.
pub fn build(hosts: &Hosts) -> Result<()> {
    let count = u8::try_from(hosts.nodes.len()).ok().filter(|n| (1..=MAX_NODES).contains(n));
    let count = count.with_context(|| format!("a cluster has 1 to {MAX_NODES} nodes, not {}", hosts.nodes.len()))?;
    let router = Netns::create(&hosts.router)?.disown();
    sysctls(&router, &HOST_SYSCTLS)?;
    sysctls(&router, &[("net.ipv4.ip_forward", "1"), ("net.ipv4.fib_multipath_hash_policy", "1")])?;
    let mut commands = vec![
        "link add br0 type bridge".to_owned(),
        format!("addr add {ROUTER_IP}/{} dev br0", NODE_NETWORK.prefix_len()),
        "link set br0 up".to_owned(),
    ];
    for (index, name) in hosts.nodes.iter().enumerate() {
        let n = index as u8 + 1;
        let node = Netns::create(name)?.disown();
        sysctls(&node, &HOST_SYSCTLS)?;
        sysctls(&node, &[("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.route_localnet", "1")])?;
        commands.extend([
            format!("link add n{n} type veth peer name {INTERFACE} netns {name}"),
            format!("link set n{n} master br0"),
            format!("link set n{n} up"),
        ]);
        let mut node_commands = vec![
            format!("addr add {}/{} dev {INTERFACE}", node_ip(n), NODE_NETWORK.prefix_len()),
            format!("link set {INTERFACE} up"),
            format!("route add default via {ROUTER_IP}"),
        ];
        let others = (1..=count).filter(|&other| other != n);
        node_commands.extend(others.map(|other| format!("route add {} via {}", pod_cidr(other), node_ip(other))));
        // The node's side is created by the router's batch below.
        router.ip_batch(&commands)?;
        commands.clear();
        node.ip_batch(&node_commands).with_context(|| format!("cannot set up node {name}"))?;
        masquerade_pods(&node)?;
    }
    for (name, network, ip, link) in [
        (&hosts.client, CLIENT_NETWORK, CLIENT_IP, "client0"),
        (&hosts.internet, INTERNET_NETWORK, INTERNET_IP, "inet0"),
    ] {
        let host = Netns::create(name)?.disown();
        sysctls(&host, &HOST_SYSCTLS)?;
        let gateway = network.hosts().next().context("empty network")?;
        commands.extend([
            format!("link add {link} type veth peer name {INTERFACE} netns {name}"),
            format!("addr add {gateway}/{} dev {link}", network.prefix_len()),
            format!("link set {link} up"),
        ]);
        router.ip_batch(&commands)?;
        commands.clear();
        host.ip_batch(&[
            format!("addr add {ip}/{} dev {INTERFACE}", network.prefix_len()),
            format!("link set {INTERFACE} up"),
            format!("route add default via {gateway}"),
        ])?;
    }
    let nexthops: Vec<String> = (1..=count).map(|n| format!("nexthop via {}", node_ip(n))).collect();
    router.ip_batch(&[format!("route add {LB_POOL} {}", nexthops.join(" "))])
}

/// Adds pod namespace `pod` (created here) on node `n` (namespace `node`) with address `ip`,
/// linked to the node by a veth named `veth` on the node's side.
pub fn add_pod(node: &str, n: u8, pod: &str, veth: &str, ip: Ipv4Addr) -> Result<()> {
    ensure!(pod_cidr(n).contains(&ip), "{ip} is not in node {n}'s pod range {}", pod_cidr(n));
    let gateway = pod_gateway(n);
    let pod_ns = Netns::create(pod)?;
    Netns::open(node)
        .ip_batch(&[
            format!("link add {veth} type veth peer name {INTERFACE} netns {pod}"),
            format!("addr add {gateway}/32 dev {veth}"),
            format!("link set {veth} up"),
            format!("route add {ip}/32 dev {veth} src {gateway}"),
        ])
        .with_context(|| format!("cannot link pod {pod} to node {node}"))?;
    pod_ns
        .ip_batch(&[
            format!("addr add {ip}/32 dev {INTERFACE}"),
            format!("link set {INTERFACE} up"),
            format!("route add {gateway} dev {INTERFACE} scope link"),
            format!("route add default via {gateway} dev {INTERFACE}"),
        ])
        .with_context(|| format!("cannot set up pod {pod}"))?;
    pod_ns.disown();
    Ok(())
}

/// Masquerades pod traffic leaving the cluster (to anything outside [`CLUSTER_CIDR`]) to the
/// node's address, in a table of its own ([`NAT_TABLE`]).
fn masquerade_pods(node: &Netns) -> Result<()> {
    let rules = format!(
        "table ip {NAT_TABLE} {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat + 10; policy accept;\n    \
         ip saddr {CLUSTER_CIDR} ip daddr != {CLUSTER_CIDR} oifname \"{INTERFACE}\" masquerade comment \"pods leaving the cluster go as their node\"\n  }}\n}}\n"
    );
    node.exec_with_input(["nft", "-f", "-"], &rules).context("cannot install the pods' masquerading")?;
    Ok(())
}

/// Applies `settings` as sysctls in `ns`.
fn sysctls(ns: &Netns, settings: &[(&str, &str)]) -> Result<()> {
    settings.iter().try_for_each(|(key, value)| ns.sysctl(key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_plan_keeps_ranges_apart() {
        assert_eq!(node_ip(1), Ipv4Addr::new(192, 168, 77, 11));
        assert_eq!(pod_cidr(2).to_string(), "10.244.2.0/24");
        assert_eq!(pod_gateway(2), Ipv4Addr::new(10, 244, 2, 1));
        assert!(NODE_NETWORK.contains(&node_ip(MAX_NODES)) && !LB_POOL.contains(&node_ip(MAX_NODES)));
        assert!(CLUSTER_CIDR.contains(&pod_cidr(MAX_NODES)));
        assert!(!SERVICE_CIDR.contains(&CLUSTER_CIDR.network()) && !CLUSTER_CIDR.contains(&SERVICE_CIDR.network()));
    }
}
