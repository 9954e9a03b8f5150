//! [`Lab`]: a Kubernetes node namespace with a pod bridge, pods, and an
//! external host, all in fresh namespaces (the root namespace is untouched).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{Context, Result, bail};
use ipnet::IpNet;

use crate::addressing::*;
use crate::netns::Netns;

/// The node's pod bridge.
pub const BRIDGE: &str = "cbr0";
/// The pod bridge's MAC address (`0a:58` and the gateway's IPv4 address, as the CNI bridge
/// plugin once derived it). Set, not inherited: a bridge whose address was never set takes the
/// lowest MAC of its ports, so a pod joining with a lower one would change the gateway's MAC
/// under every other pod until their neighbour entries expire (kubenet pins cbr0's address for
/// the same reason). With br_netfilter, their frames to the old MAC are bridged, not delivered
/// to the node: IPVS mode, which rewrites packets on local input, never sees them.
fn bridge_mac() -> String {
    let [a, b, c, d] = POD_GATEWAY_V4.octets();
    format!("0a:58:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// The node's uplink towards the external host (also the external host's interface name).
pub const UPLINK: &str = "eth0";
/// Node-side pod veths are named `<POD_VETH_PREFIX><n>`.
pub const POD_VETH_PREFIX: &str = "veth";
/// A pod's own interface name.
const POD_INTERFACE: &str = "eth0";

/// Sysctls for every lab namespace: IPv6 addresses usable at once (no duplicate
/// address detection) and no ICMP rate limit, so probes are refused reliably.
const HOST_SYSCTLS: [(&str, &str); 4] = [
    ("net.ipv6.conf.all.accept_dad", "0"),
    ("net.ipv6.conf.default.accept_dad", "0"),
    ("net.ipv4.icmp_ratelimit", "0"),
    ("net.ipv6.icmp.ratelimit", "0"),
];

/// Sysctls a Kubernetes node needs to route pod and service traffic.
const NODE_SYSCTLS: [(&str, &str); 4] = [
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv6.conf.all.forwarding", "1"),
    ("net.ipv6.conf.default.forwarding", "1"),
    ("net.ipv4.conf.all.route_localnet", "1"),
];

/// A node namespace (where the proxy runs, "the host"), its pods and an
/// external host; see [`crate::addressing`] for the address plan.
/// Dropping it deletes the node and external namespaces.
pub struct Lab {
    prefix: String,
    node: Netns,
    external: Netns,
    pods_added: AtomicU8,
}

/// A pod: a namespace attached to the node's bridge, with default routes via the node.
pub struct Pod {
    /// Name given to [`Lab::add_pod`].
    pub name: String,
    /// The pod's network namespace; dropping the pod deletes it.
    pub ns: Netns,
    /// Pod IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Pod IPv6 address (same host digits as IPv4: fd00:244::10 for 10.244.0.10).
    pub ipv6: Ipv6Addr,
}

impl Lab {
    /// Builds the node and external host; namespace names start with `prefix`.
    pub fn new(prefix: &str) -> Result<Self> {
        let lab = Lab {
            prefix: prefix.to_owned(),
            node: Netns::new(&format!("{prefix}-node"))?,
            external: Netns::new(&format!("{prefix}-ext"))?,
            pods_added: AtomicU8::new(0),
        };
        lab.build().with_context(|| format!("cannot build lab {prefix}"))?;
        Ok(lab)
    }

    /// The node namespace: processes here are host-network processes.
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// The external host's namespace, on the node's uplink; it routes the
    /// service and external-IP ranges to the node.
    pub fn external(&self) -> &Netns {
        &self.external
    }

    /// Adds a pod on the node's bridge. Pods are owned by the caller.
    pub fn add_pod(&self, name: &str) -> Result<Pod> {
        let index = self.pods_added.fetch_add(1, Ordering::Relaxed);
        let Some(host) = FIRST_POD_HOST.checked_add(index).filter(|&host| host < u8::MAX) else {
            bail!("lab {} is out of pod addresses", self.prefix);
        };
        let pod = Pod {
            name: name.to_owned(),
            ns: Netns::new(&format!("{}-{name}", self.prefix))?,
            ipv4: Ipv4Addr::from(POD_CIDR_V4.network().to_bits() + u32::from(host)),
            ipv6: Ipv6Addr::from(POD_CIDR_V6.network().to_bits() + mirrored_host(host)),
        };
        let veth = format!("{POD_VETH_PREFIX}{index}");
        sysctls(&pod.ns, &HOST_SYSCTLS)?;
        ip_all(
            &self.node,
            &[
                format!("link add {veth} type veth peer name {POD_INTERFACE} netns {}", pod.ns.name()),
                format!("link set {veth} master {BRIDGE}"),
                format!("link set {veth} type bridge_slave hairpin on"),
                format!("link set {veth} up"),
            ],
        )?;
        ip_all(
            &pod.ns,
            &[
                format!("addr add {}/{} dev {POD_INTERFACE}", pod.ipv4, POD_CIDR_V4.prefix_len()),
                format!("addr add {}/{} dev {POD_INTERFACE} nodad", pod.ipv6, POD_CIDR_V6.prefix_len()),
                format!("link set {POD_INTERFACE} up"),
                format!("-4 route add default via {POD_GATEWAY_V4}"),
                format!("-6 route add default via {POD_GATEWAY_V6}"),
            ],
        )
        .with_context(|| format!("cannot set up pod {name}"))?;
        Ok(pod)
    }

    /// Adds another address (with prefix length) to the node's uplink.
    pub fn add_node_address(&self, address: IpNet) -> Result<()> {
        self.node.ip(["addr", "add", &address.to_string(), "dev", UPLINK, "nodad"])?;
        Ok(())
    }

    /// Wires node, bridge and external host together.
    fn build(&self) -> Result<()> {
        sysctls(&self.node, &HOST_SYSCTLS)?;
        sysctls(&self.node, &NODE_SYSCTLS)?;
        sysctls(&self.external, &HOST_SYSCTLS)?;
        ip_all(
            &self.node,
            &[
                format!("link add {UPLINK} type veth peer name {UPLINK} netns {}", self.external.name()),
                format!("addr add {NODE_IPV4}/{} dev {UPLINK}", UPLINK_CIDR_V4.prefix_len()),
                format!("addr add {NODE_IPV6}/{} dev {UPLINK} nodad", UPLINK_CIDR_V6.prefix_len()),
                format!("link set {UPLINK} up"),
                format!("link add {BRIDGE} address {} type bridge", bridge_mac()),
                format!("addr add {POD_GATEWAY_V4}/{} dev {BRIDGE}", POD_CIDR_V4.prefix_len()),
                format!("addr add {POD_GATEWAY_V6}/{} dev {BRIDGE} nodad", POD_CIDR_V6.prefix_len()),
                format!("link set {BRIDGE} up"),
                format!("-4 route add default via {EXTERNAL_HOST_IPV4}"),
                format!("-6 route add default via {EXTERNAL_HOST_IPV6}"),
            ],
        )?;
        let mut external = vec![
            format!("addr add {EXTERNAL_HOST_IPV4}/{} dev {UPLINK}", UPLINK_CIDR_V4.prefix_len()),
            format!("addr add {EXTERNAL_HOST_IPV6}/{} dev {UPLINK} nodad", UPLINK_CIDR_V6.prefix_len()),
            format!("link set {UPLINK} up"),
        ];
        let node_routed: [(IpNet, IpAddr); 6] = [
            (CLUSTER_CIDR_V4.into(), NODE_IPV4.into()),
            (SERVICE_CIDR_V4.into(), NODE_IPV4.into()),
            (EXTERNAL_IP_CIDR_V4.into(), NODE_IPV4.into()),
            (CLUSTER_CIDR_V6.into(), NODE_IPV6.into()),
            (SERVICE_CIDR_V6.into(), NODE_IPV6.into()),
            (EXTERNAL_IP_CIDR_V6.into(), NODE_IPV6.into()),
        ];
        external.extend(node_routed.iter().map(|(cidr, via)| format!("route add {cidr} via {via}")));
        ip_all(&self.external, &external)
    }
}

/// The IPv6 host part written with the same digits as the IPv4 one
/// (10.244.0.10 pairs with fd00:244::10).
fn mirrored_host(host: u8) -> u128 {
    let host = u128::from(host);
    ((host / 100) << 8) | ((host / 10 % 10) << 4) | (host % 10)
}

/// Applies `settings` as sysctls in `ns`.
fn sysctls(ns: &Netns, settings: &[(&str, &str)]) -> Result<()> {
    settings.iter().try_for_each(|(key, value)| ns.sysctl(key, value))
}

/// Runs each whitespace-separated `ip` command in `ns`, stopping at the first failure.
fn ip_all(ns: &Netns, commands: &[String]) -> Result<()> {
    commands.iter().try_for_each(|command| ns.ip(command.split_whitespace()).map(drop))
}
