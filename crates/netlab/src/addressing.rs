//! The lab's fixed address plan: one dual-stack Kubernetes node, its pods, and
//! an external host on the node's uplink.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Cluster-wide pod range (IPv4).
pub const CLUSTER_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 0, 0), 16);
/// Cluster-wide pod range (IPv6).
pub const CLUSTER_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 0), 48);
/// This node's pod subnet on the bridge (IPv4).
pub const POD_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 0, 0), 24);
/// This node's pod subnet on the bridge (IPv6).
pub const POD_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 0), 64);
/// The bridge address, pods' default gateway (IPv4).
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The bridge address, pods' default gateway (IPv6).
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 1);
/// Pod number `n` gets host part `FIRST_POD_HOST + n` in the pod subnets.
pub const FIRST_POD_HOST: u8 = 10;

/// ClusterIP range (IPv4).
pub const SERVICE_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 96, 0, 0), 12);
/// ClusterIP range (IPv6).
pub const SERVICE_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0), 108);
/// Range for external and load-balancer IPs, routed to the node by the external host (IPv4).
pub const EXTERNAL_IP_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(203, 0, 113, 0), 24);
/// Range for external and load-balancer IPs, routed to the node by the external host (IPv6).
pub const EXTERNAL_IP_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 64);

/// The node's uplink subnet shared with the external host (IPv4).
pub const UPLINK_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 77, 0), 24);
/// The node's uplink subnet shared with the external host (IPv6).
pub const UPLINK_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 0), 64);
/// The node IP (IPv4).
pub const NODE_IPV4: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
/// The node IP (IPv6).
pub const NODE_IPV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2);
/// The external host's IP (IPv4).
pub const EXTERNAL_HOST_IPV4: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
/// The external host's IP (IPv6).
pub const EXTERNAL_HOST_IPV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);
