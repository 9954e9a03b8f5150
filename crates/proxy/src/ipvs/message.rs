//! The generic-netlink messages of the kernel's `IPVS` family (`linux/ip_vs.h`), encoded (pure):
//! the family-id lookup, a service or destination command for each planned [`IpvsOp`], and the
//! timeouts of `SET_CONFIG`. Numbers are copied from `linux/ip_vs.h` and `linux/genetlink.h`
//! under their C names.

use std::net::IpAddr;
use std::time::Duration;

use roadkeeper_rules::ipvs::{IpvsOp, RealServer, VirtualKey, VirtualServer};
use roadkeeper_rules::table::Protocol;

use crate::netlink_socket::{self as nl, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

/// The generic-netlink family name of IPVS.
pub const IPVS_GENL_NAME: &str = "IPVS";
const IPVS_GENL_VERSION: u8 = 1;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
pub(crate) const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const IPVS_CMD_NEW_SERVICE: u8 = 1;
const IPVS_CMD_SET_SERVICE: u8 = 2;
const IPVS_CMD_DEL_SERVICE: u8 = 3;
const IPVS_CMD_NEW_DEST: u8 = 5;
const IPVS_CMD_SET_DEST: u8 = 6;
const IPVS_CMD_GET_SERVICE: u8 = 4;
const IPVS_CMD_DEL_DEST: u8 = 7;
const IPVS_CMD_GET_DEST: u8 = 8;
const IPVS_CMD_SET_CONFIG: u8 = 12;

pub(crate) const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub(crate) const IPVS_CMD_ATTR_DEST: u16 = 2;
const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

pub(crate) const IPVS_SVC_ATTR_AF: u16 = 1;
pub(crate) const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
pub(crate) const IPVS_SVC_ATTR_ADDR: u16 = 3;
pub(crate) const IPVS_SVC_ATTR_PORT: u16 = 4;
pub(crate) const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
pub(crate) const IPVS_SVC_ATTR_FLAGS: u16 = 7;
pub(crate) const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
const IPVS_SVC_ATTR_NETMASK: u16 = 9;

pub(crate) const IPVS_DEST_ATTR_ADDR: u16 = 1;
pub(crate) const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
pub(crate) const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
pub(crate) const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
pub(crate) const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
pub(crate) const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`: session affinity.
pub(crate) const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// `IP_VS_CONN_F_MASQ`: NAT forwarding, IPVS mode's only method.
const IP_VS_CONN_F_MASQ: u32 = 0x0;
pub(crate) const AF_INET: u16 = 2;
pub(crate) const AF_INET6: u16 = 10;

/// Starts a request (acknowledged) of the `IPVS` family: nlmsghdr and genlmsghdr.
fn begin(b: &mut Vec<u8>, family_id: u16, cmd: u8, version: u8, seq: u32) -> usize {
    nl::begin_genl(b, family_id, NLM_F_REQUEST | NLM_F_ACK, seq, cmd, version)
}

/// The question that resolves the `IPVS` family's id (`CTRL_CMD_GETFAMILY`); the answer's
/// `CTRL_ATTR_FAMILY_ID` is the `family_id` of the other messages.
pub fn get_family(seq: u32) -> Vec<u8> {
    let mut b = Vec::new();
    let start = begin(&mut b, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, seq);
    nl::attr(&mut b, CTRL_ATTR_FAMILY_NAME, &nul_terminated(IPVS_GENL_NAME));
    nl::end_msg(&mut b, start);
    b
}

/// The dump of every virtual server (`IPVS_CMD_GET_SERVICE`); each answer is an
/// `IPVS_CMD_NEW_SERVICE` message with the service's attributes.
pub fn get_services(family_id: u16, seq: u32) -> Vec<u8> {
    let mut b = Vec::new();
    let start =
        nl::begin_genl(&mut b, family_id, NLM_F_REQUEST | NLM_F_DUMP, seq, IPVS_CMD_GET_SERVICE, IPVS_GENL_VERSION);
    nl::end_msg(&mut b, start);
    b
}

/// The dump of one virtual server's destinations (`IPVS_CMD_GET_DEST`, the service named by its
/// identity); each answer is an `IPVS_CMD_NEW_DEST` message with the destination's attributes.
pub fn get_dests(family_id: u16, seq: u32, key: &VirtualKey) -> Vec<u8> {
    let mut b = Vec::new();
    let start =
        nl::begin_genl(&mut b, family_id, NLM_F_REQUEST | NLM_F_DUMP, seq, IPVS_CMD_GET_DEST, IPVS_GENL_VERSION);
    let nest = nl::begin_nest(&mut b, IPVS_CMD_ATTR_SERVICE);
    service_attrs(&mut b, key, None);
    nl::end_nest(&mut b, nest);
    nl::end_msg(&mut b, start);
    b
}

/// An operation as its command and objects, for errors: `IPVS_CMD_NEW_DEST TCP 10.96.0.10:80 ->
/// 10.244.0.5:8080`.
pub fn describe(op: &IpvsOp) -> String {
    let service = |cmd: &str, key: &VirtualKey| format!("{cmd} {} {key}", key.protocol.as_str().to_uppercase());
    match op {
        IpvsOp::BindAddress(ip) => format!("bind {ip}"),
        IpvsOp::UnbindAddress(ip) => format!("unbind {ip}"),
        IpvsOp::AddService(key, _) => service("IPVS_CMD_NEW_SERVICE", key),
        IpvsOp::EditService(key, _) => service("IPVS_CMD_SET_SERVICE", key),
        IpvsOp::DelService(key) => service("IPVS_CMD_DEL_SERVICE", key),
        IpvsOp::AddDest(key, real, weight) => {
            format!("{} -> {real} weight {weight}", service("IPVS_CMD_NEW_DEST", key))
        }
        IpvsOp::EditDest(key, real, weight) => {
            format!("{} -> {real} weight {weight}", service("IPVS_CMD_SET_DEST", key))
        }
        IpvsOp::DelDest(key, real) => format!("{} -> {real}", service("IPVS_CMD_DEL_DEST", key)),
    }
}

/// A service's identity, and its settings when the command needs them.
type ServiceArgs<'a> = (&'a VirtualKey, Option<&'a VirtualServer>);
/// A destination's identity, and its weight when the command needs it.
type DestArgs<'a> = (&'a RealServer, Option<u32>);

/// The message of one planned operation, or `None` for the address changes of `kube-ipvs0`
/// (rtnetlink's, not IPVS's).
pub fn encode(op: &IpvsOp, family_id: u16, seq: u32) -> Option<Vec<u8>> {
    let mut b = Vec::new();
    // The command, the service (with its settings for NEW and SET) and the destination (with
    // its weight for NEW and SET).
    let (cmd, (key, server), dest): (u8, ServiceArgs, Option<DestArgs>) = match op {
        IpvsOp::BindAddress(_) | IpvsOp::UnbindAddress(_) => return None,
        IpvsOp::AddService(key, server) => (IPVS_CMD_NEW_SERVICE, (key, Some(server)), None),
        IpvsOp::EditService(key, server) => (IPVS_CMD_SET_SERVICE, (key, Some(server)), None),
        IpvsOp::DelService(key) => (IPVS_CMD_DEL_SERVICE, (key, None), None),
        IpvsOp::AddDest(key, real, weight) => (IPVS_CMD_NEW_DEST, (key, None), Some((real, Some(*weight)))),
        IpvsOp::EditDest(key, real, weight) => (IPVS_CMD_SET_DEST, (key, None), Some((real, Some(*weight)))),
        IpvsOp::DelDest(key, real) => (IPVS_CMD_DEL_DEST, (key, None), Some((real, None))),
    };
    let start = begin(&mut b, family_id, cmd, IPVS_GENL_VERSION, seq);
    let nest = nl::begin_nest(&mut b, IPVS_CMD_ATTR_SERVICE);
    service_attrs(&mut b, key, server);
    nl::end_nest(&mut b, nest);
    if let Some((real, weight)) = dest {
        let nest = nl::begin_nest(&mut b, IPVS_CMD_ATTR_DEST);
        dest_attrs(&mut b, real, weight);
        nl::end_nest(&mut b, nest);
    }
    nl::end_msg(&mut b, start);
    Some(b)
}

/// `IPVS_CMD_SET_CONFIG` with the TCP, TCP-FIN and UDP timeouts in seconds (0 leaves one as it
/// is), or `None` when all three are 0.
pub fn set_timeouts(family_id: u16, seq: u32, tcp: Duration, tcp_fin: Duration, udp: Duration) -> Option<Vec<u8>> {
    if [tcp, tcp_fin, udp].iter().all(Duration::is_zero) {
        return None;
    }
    let mut b = Vec::new();
    let start = begin(&mut b, family_id, IPVS_CMD_SET_CONFIG, IPVS_GENL_VERSION, seq);
    for (ty, timeout) in
        [(IPVS_CMD_ATTR_TIMEOUT_TCP, tcp), (IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, tcp_fin), (IPVS_CMD_ATTR_TIMEOUT_UDP, udp)]
    {
        let secs = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX);
        nl::attr(&mut b, ty, &secs.to_ne_bytes());
    }
    nl::end_msg(&mut b, start);
    Some(b)
}

/// A service's identity, and with `server` its settings (what NEW and SET need in full).
fn service_attrs(b: &mut Vec<u8>, key: &VirtualKey, server: Option<&VirtualServer>) {
    nl::attr(b, IPVS_SVC_ATTR_AF, &af(key.address).to_ne_bytes());
    nl::attr(b, IPVS_SVC_ATTR_PROTOCOL, &u16::from(ip_proto(key.protocol)).to_ne_bytes());
    nl::attr(b, IPVS_SVC_ATTR_ADDR, &inet_addr(key.address));
    nl::attr(b, IPVS_SVC_ATTR_PORT, &key.port.to_be_bytes());
    let Some(server) = server else { return };
    nl::attr(b, IPVS_SVC_ATTR_SCHED_NAME, &nul_terminated(server.scheduler.as_str()));
    let flags = if server.persistence.is_some() { IP_VS_SVC_F_PERSISTENT } else { 0 };
    let mut flags_mask = flags.to_ne_bytes().to_vec();
    flags_mask.extend_from_slice(&u32::MAX.to_ne_bytes());
    nl::attr(b, IPVS_SVC_ATTR_FLAGS, &flags_mask);
    nl::attr(b, IPVS_SVC_ATTR_TIMEOUT, &server.persistence.unwrap_or(0).to_ne_bytes());
    // One client address per persistence entry: the whole address (the prefix length for IPv6).
    let netmask: u32 = if key.address.is_ipv4() { u32::MAX } else { 128 };
    nl::attr(b, IPVS_SVC_ATTR_NETMASK, &netmask.to_ne_bytes());
}

/// A destination's identity, and with `weight` its settings (what NEW and SET need in full).
fn dest_attrs(b: &mut Vec<u8>, real: &RealServer, weight: Option<u32>) {
    nl::attr(b, IPVS_DEST_ATTR_ADDR, &inet_addr(real.address));
    nl::attr(b, IPVS_DEST_ATTR_PORT, &real.port.to_be_bytes());
    nl::attr(b, IPVS_DEST_ATTR_ADDR_FAMILY, &af(real.address).to_ne_bytes());
    let Some(weight) = weight else { return };
    nl::attr(b, IPVS_DEST_ATTR_FWD_METHOD, &IP_VS_CONN_F_MASQ.to_ne_bytes());
    nl::attr(b, IPVS_DEST_ATTR_WEIGHT, &weight.to_ne_bytes());
    nl::attr(b, IPVS_DEST_ATTR_U_THRESH, &0u32.to_ne_bytes());
    nl::attr(b, IPVS_DEST_ATTR_L_THRESH, &0u32.to_ne_bytes());
}

pub(crate) fn af(address: IpAddr) -> u16 {
    if address.is_ipv4() { AF_INET } else { AF_INET6 }
}

pub(crate) fn ip_proto(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first 4.
fn inet_addr(address: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match address {
        IpAddr::V4(ip) => out[..4].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out = ip.octets(),
    }
    out
}

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;
    use roadkeeper_rules::ipvs::{FrontendKind, Scheduler};
    use roadkeeper_rules::table::ServicePortName;

    use super::*;

    const FAMILY: u16 = 0x25;

    fn key(address: &str) -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: address.parse().unwrap(), port: 80 }
    }

    fn real(address: &str) -> RealServer {
        RealServer { address: address.parse().unwrap(), port: 8080 }
    }

    fn server(persistence: Option<u32>) -> VirtualServer {
        let service =
            ServicePortName { service: NamespacedName::new("ns", "a"), port: String::new(), protocol: Protocol::Tcp };
        let (kind, scheduler, real_servers) =
            (FrontendKind::ClusterIp, Scheduler::WeightedRoundRobin, Default::default());
        VirtualServer { service, kind, scheduler, persistence, real_servers }
    }

    /// One attribute's bytes: header, payload, padding.
    fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        nl::attr(&mut b, ty, payload);
        b
    }

    /// The attributes (type without flags, payload) of `bytes`, a run of attributes.
    fn attrs(bytes: &[u8]) -> Attributes {
        let mut out = Vec::new();
        let mut rest = bytes;
        while rest.len() >= 4 {
            let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
            let ty = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
            out.push((ty, rest[4..len].to_vec()));
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
        out
    }

    /// Attributes as (type, payload).
    type Attributes = Vec<(u16, Vec<u8>)>;

    /// (nlmsg type, flags, genl cmd, genl version, attributes) of one message, its length checked.
    fn message(bytes: &[u8]) -> (u16, u16, u8, u8, Attributes) {
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize, bytes.len());
        let ty = u16::from_ne_bytes([bytes[4], bytes[5]]);
        let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
        (ty, flags, bytes[16], bytes[17], attrs(&bytes[20..]))
    }

    #[test]
    fn the_family_is_looked_up_by_name() {
        let (ty, flags, cmd, _, attributes) = message(&get_family(7));
        assert_eq!((ty, flags, cmd), (GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, CTRL_CMD_GETFAMILY));
        assert_eq!(attributes, [(CTRL_ATTR_FAMILY_NAME, b"IPVS\0".to_vec())]);
    }

    #[test]
    fn a_new_dest_is_the_service_identity_and_the_full_destination() {
        let op = IpvsOp::AddDest(key("10.96.0.10"), real("10.244.0.11"), 1);
        let bytes = encode(&op, FAMILY, 9).unwrap();
        assert_eq!(u32::from_ne_bytes(bytes[8..12].try_into().unwrap()), 9, "sequence number");
        let (ty, flags, cmd, version, attributes) = message(&bytes);
        assert_eq!((ty, flags, cmd, version), (FAMILY, NLM_F_REQUEST | NLM_F_ACK, IPVS_CMD_NEW_DEST, 1));
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[10, 96, 0, 10]);
        let service = [
            attr(IPVS_SVC_ATTR_AF, &AF_INET.to_ne_bytes()),
            attr(IPVS_SVC_ATTR_PROTOCOL, &6u16.to_ne_bytes()),
            attr(IPVS_SVC_ATTR_ADDR, &addr),
            attr(IPVS_SVC_ATTR_PORT, &[0, 80]),
        ]
        .concat();
        let mut dest_addr = [0u8; 16];
        dest_addr[..4].copy_from_slice(&[10, 244, 0, 11]);
        let dest = [
            attr(IPVS_DEST_ATTR_ADDR, &dest_addr),
            attr(IPVS_DEST_ATTR_PORT, &8080u16.to_be_bytes()),
            attr(IPVS_DEST_ATTR_ADDR_FAMILY, &AF_INET.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_FWD_METHOD, &0u32.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_WEIGHT, &1u32.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_U_THRESH, &0u32.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_L_THRESH, &0u32.to_ne_bytes()),
        ]
        .concat();
        assert_eq!(attributes, [(IPVS_CMD_ATTR_SERVICE, service), (IPVS_CMD_ATTR_DEST, dest)]);
        // Nested attributes carry NLA_F_NESTED.
        assert_eq!(u16::from_ne_bytes([bytes[22], bytes[23]]), IPVS_CMD_ATTR_SERVICE | nl::NLA_F_NESTED);
    }

    #[test]
    fn a_drain_and_a_delete_name_the_destination() {
        let (vs, rs) = (key("10.96.0.10"), real("10.244.0.11"));
        let (_, _, cmd, _, attributes) = message(&encode(&IpvsOp::EditDest(vs, rs, 0), FAMILY, 1).unwrap());
        assert_eq!(cmd, IPVS_CMD_SET_DEST);
        let dest = attrs(&attributes[1].1);
        assert!(dest.contains(&(IPVS_DEST_ATTR_WEIGHT, 0u32.to_ne_bytes().to_vec())), "{dest:?}");
        let (_, _, cmd, _, attributes) = message(&encode(&IpvsOp::DelDest(vs, rs), FAMILY, 2).unwrap());
        assert_eq!(cmd, IPVS_CMD_DEL_DEST);
        let types: Vec<u16> = attrs(&attributes[1].1).iter().map(|(ty, _)| *ty).collect();
        assert_eq!(types, [IPVS_DEST_ATTR_ADDR, IPVS_DEST_ATTR_PORT, IPVS_DEST_ATTR_ADDR_FAMILY]);
        let (_, _, cmd, _, attributes) = message(&encode(&IpvsOp::DelService(vs), FAMILY, 3).unwrap());
        assert_eq!((cmd, attributes.len()), (IPVS_CMD_DEL_SERVICE, 1));
        assert_eq!(attrs(&attributes[0].1).len(), 4, "the identity only");
        assert!(encode(&IpvsOp::BindAddress("10.96.0.10".parse().unwrap()), FAMILY, 4).is_none());
    }

    #[test]
    fn a_new_service_carries_scheduler_persistence_and_netmask() {
        let (_, _, cmd, _, attributes) =
            message(&encode(&IpvsOp::AddService(key("fd00::10"), server(Some(600))), FAMILY, 1).unwrap());
        assert_eq!((cmd, attributes.len()), (IPVS_CMD_NEW_SERVICE, 1));
        let service = attrs(&attributes[0].1);
        let flags = [IP_VS_SVC_F_PERSISTENT.to_ne_bytes(), u32::MAX.to_ne_bytes()].concat();
        assert_eq!(
            service[..],
            [
                (IPVS_SVC_ATTR_AF, AF_INET6.to_ne_bytes().to_vec()),
                (IPVS_SVC_ATTR_PROTOCOL, 6u16.to_ne_bytes().to_vec()),
                (IPVS_SVC_ATTR_ADDR, "fd00::10".parse::<std::net::Ipv6Addr>().unwrap().octets().to_vec()),
                (IPVS_SVC_ATTR_PORT, vec![0, 80]),
                (IPVS_SVC_ATTR_SCHED_NAME, b"wrr\0".to_vec()),
                (IPVS_SVC_ATTR_FLAGS, flags),
                (IPVS_SVC_ATTR_TIMEOUT, 600u32.to_ne_bytes().to_vec()),
                (IPVS_SVC_ATTR_NETMASK, 128u32.to_ne_bytes().to_vec()),
            ]
        );
        let (_, _, cmd, _, attributes) =
            message(&encode(&IpvsOp::EditService(key("10.96.0.10"), server(None)), FAMILY, 1).unwrap());
        assert_eq!(cmd, IPVS_CMD_SET_SERVICE);
        let service = attrs(&attributes[0].1);
        assert!(service.contains(&(IPVS_SVC_ATTR_FLAGS, [0u32.to_ne_bytes(), u32::MAX.to_ne_bytes()].concat())));
        assert!(service.contains(&(IPVS_SVC_ATTR_NETMASK, u32::MAX.to_ne_bytes().to_vec())));
    }

    #[test]
    fn timeouts_are_whole_seconds_and_nothing_when_all_are_left() {
        assert!(set_timeouts(FAMILY, 1, Duration::ZERO, Duration::ZERO, Duration::ZERO).is_none());
        let bytes =
            set_timeouts(FAMILY, 1, Duration::from_secs(900), Duration::from_secs(120), Duration::ZERO).unwrap();
        let (_, _, cmd, _, attributes) = message(&bytes);
        assert_eq!(cmd, IPVS_CMD_SET_CONFIG);
        assert_eq!(
            attributes,
            [
                (IPVS_CMD_ATTR_TIMEOUT_TCP, 900u32.to_ne_bytes().to_vec()),
                (IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, 120u32.to_ne_bytes().to_vec()),
                (IPVS_CMD_ATTR_TIMEOUT_UDP, 0u32.to_ne_bytes().to_vec()),
            ]
        );
    }
}
