//! The kernel's IPVS table over generic netlink: [`IpvsKernel`] resolves the `IPVS` family,
//! applies planned [`IpvsOp`]s (many requests per datagram, each acknowledged) and lists the
//! virtual servers and destinations the kernel holds. Parsing the listings is pure
//! (`parse_service`, `parse_dest`); encoding is [`super::message`]'s.
//!
//! Idempotent by design, so that a restart can apply a plan over what the last run left:
//! adding a service or destination that exists (`EEXIST`) sets it to the planned settings
//! instead, and deleting one that is gone (`ESRCH`: no such service, `ENOENT`: no such
//! destination) is done.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use roadkeeper_rules::ipvs::{IpvsOp, RealServer, VirtualKey};
use roadkeeper_rules::table::Protocol;

use super::exchange::{Conn, IpvsError, MAX_BATCH_BYTES, MAX_BATCH_MESSAGES};
use super::message::{self, *};
use crate::netlink_socket::{self as nl, GENL_HDRLEN, Malformed, NETLINK_GENERIC};

/// A virtual server as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelService {
    /// Protocol, address, port.
    pub key: VirtualKey,
    /// The scheduler's name (`rr`, `wrr`...).
    pub scheduler: String,
    /// The persistence timeout in seconds when the service is persistent (session affinity).
    pub persistence: Option<u32>,
}

/// A destination (real server) as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelDest {
    /// Address and port.
    pub real: RealServer,
    /// Its weight (0: drained, no new connections).
    pub weight: u32,
    /// Established connections (`ActiveConn` of `ipvsadm -Ln`).
    pub active_connections: u32,
    /// Connections in other states (`InActConn`).
    pub inactive_connections: u32,
}

/// The kernel's IPVS table, over a generic-netlink socket of the calling thread's network
/// namespace.
#[derive(Debug)]
pub struct IpvsKernel {
    conn: Conn,
    family: u16,
}

impl IpvsKernel {
    /// Opens the socket and resolves the `IPVS` family; [`IpvsError::Unavailable`] when the
    /// kernel does not know it (no `ip_vs` module loaded or built in).
    pub fn open() -> Result<IpvsKernel, crate::Error> {
        let what = "CTRL_CMD_GETFAMILY IPVS";
        let mut conn = Conn::open(NETLINK_GENERIC, what)?;
        let seq = conn.next_seq(1);
        let replies = match conn.request(&message::get_family(seq), seq, what)? {
            Ok(replies) => replies,
            Err(libc::ENOENT) => return Err(IpvsError::Unavailable.into()),
            Err(errno) => return Err(IpvsError::Refused { what: what.into(), errno }.into()),
        };
        let family = replies.iter().find_map(|reply| parse_family_id(reply).transpose()).transpose();
        let family = family.map_err(|e| IpvsError::Malformed { what: what.into(), why: e.0 })?;
        let family = family.ok_or_else(|| IpvsError::Malformed { what: what.into(), why: "no family id".into() })?;
        Ok(IpvsKernel { conn, family })
    }

    /// Applies the IPVS operations of `ops` (the address changes, for `kube-ipvs0`, are
    /// skipped), in order, many per datagram. Stops after the first datagram with a failed
    /// operation and names the first one: the operations before it (and the others of its
    /// datagram) were applied.
    pub fn apply(&mut self, ops: &[IpvsOp]) -> Result<(), crate::Error> {
        let mut follow_ups = Vec::new();
        let (mut datagram, mut batch, mut first) = (Vec::new(), Vec::new(), 0);
        for op in ops {
            let seq = self.conn.next_seq(1);
            let Some(request) = message::encode(op, self.family, seq) else { continue };
            if batch.len() == MAX_BATCH_MESSAGES || datagram.len() + request.len() > MAX_BATCH_BYTES {
                self.send_batch(&datagram, first, &batch, &mut follow_ups)?;
                (datagram, batch) = (Vec::new(), Vec::new());
            }
            if batch.is_empty() {
                first = seq;
            }
            datagram.extend_from_slice(&request);
            batch.push(op);
        }
        if !batch.is_empty() {
            self.send_batch(&datagram, first, &batch, &mut follow_ups)?;
        }
        // Objects that existed: set to the planned settings (edits, which have no follow-ups).
        if !follow_ups.is_empty() {
            self.apply(&follow_ups)?;
        }
        Ok(())
    }

    fn send_batch(
        &mut self,
        datagram: &[u8],
        first: u32,
        batch: &[&IpvsOp],
        follow_ups: &mut Vec<IpvsOp>,
    ) -> Result<(), crate::Error> {
        let what = format!("{} IPVS operations from {}", batch.len(), message::describe(batch[0]));
        let errnos = self.conn.acked(datagram, first, batch.len(), &what)?;
        for (op, errno) in batch.iter().zip(errnos) {
            match settle(op, errno) {
                Ok(follow_up) => follow_ups.extend(follow_up),
                Err(errno) => return Err(IpvsError::Refused { what: message::describe(op), errno }.into()),
            }
        }
        Ok(())
    }

    /// Every virtual server of the kernel's table, except fwmark services and those of a
    /// protocol IPVS mode does not use (other programs').
    pub fn services(&mut self) -> Result<Vec<KernelService>, crate::Error> {
        let what = "IPVS_CMD_GET_SERVICE";
        let seq = self.conn.next_seq(1);
        let replies = self.dump(&message::get_services(self.family, seq), seq, what)?;
        let services: Result<Vec<Option<KernelService>>, Malformed> =
            replies.iter().map(|r| parse_service(r)).collect();
        Ok(services.map_err(|e| IpvsError::Malformed { what: what.into(), why: e.0 })?.into_iter().flatten().collect())
    }

    /// The destinations of the virtual server `key` (none when it does not exist).
    pub fn dests(&mut self, key: &VirtualKey) -> Result<Vec<KernelDest>, crate::Error> {
        let what = format!("IPVS_CMD_GET_DEST {} {key}", key.protocol.as_str().to_uppercase());
        let seq = self.conn.next_seq(1);
        let replies = self.dump(&message::get_dests(self.family, seq, key), seq, &what)?;
        let af = message::af(key.address);
        let dests: Result<Vec<KernelDest>, Malformed> = replies.iter().map(|r| parse_dest(r, af)).collect();
        Ok(dests.map_err(|e| IpvsError::Malformed { what, why: e.0 })?)
    }

    /// Sets the connection timeouts of TCP, TCP after FIN and UDP (a zero one is left as it is;
    /// nothing is sent when all are zero).
    pub fn set_timeouts(&mut self, tcp: Duration, tcp_fin: Duration, udp: Duration) -> Result<(), crate::Error> {
        let seq = self.conn.next_seq(1);
        let Some(request) = message::set_timeouts(self.family, seq, tcp, tcp_fin, udp) else { return Ok(()) };
        let what = format!("IPVS_CMD_SET_CONFIG timeouts tcp {tcp:?} tcpfin {tcp_fin:?} udp {udp:?}");
        match self.conn.acked(&request, seq, 1, &what)?[..] {
            [0] => Ok(()),
            [errno] => Err(IpvsError::Refused { what, errno }.into()),
            _ => unreachable!("one request, one answer"),
        }
    }

    /// The kernel's own errno for each of `ops` (IPVS ones only), before [`settle`] reads it.
    #[cfg(test)]
    pub(crate) fn raw_errnos(&mut self, ops: &[IpvsOp]) -> Result<Vec<i32>, crate::Error> {
        let first = self.conn.next_seq(ops.len());
        let datagram: Vec<u8> = (0..ops.len())
            .flat_map(|i| message::encode(&ops[i], self.family, first.wrapping_add(i as u32)).expect("an IPVS op"))
            .collect();
        Ok(self.conn.acked(&datagram, first, ops.len(), "raw IPVS operations")?)
    }

    fn dump(&mut self, request: &[u8], seq: u32, what: &str) -> Result<Vec<Vec<u8>>, IpvsError> {
        self.conn.request(request, seq, what)?.map_err(|errno| IpvsError::Refused { what: what.into(), errno })
    }
}

// ---- answers (pure) -------------------------------------------------------------------------

/// What the kernel's `errno` means for `op`: done (`Ok(None)`), done but the object existed
/// already, so its settings follow as an edit (`Ok(Some(edit))`), or failed (`Err(errno)`).
fn settle(op: &IpvsOp, errno: i32) -> Result<Option<IpvsOp>, i32> {
    match (op, errno) {
        (_, 0) => Ok(None),
        (IpvsOp::AddService(key, server), libc::EEXIST) => Ok(Some(IpvsOp::EditService(*key, server.clone()))),
        (IpvsOp::AddDest(key, real, weight), libc::EEXIST) => Ok(Some(IpvsOp::EditDest(*key, *real, *weight))),
        (IpvsOp::DelService(_) | IpvsOp::DelDest(..), libc::ESRCH | libc::ENOENT) => Ok(None),
        (_, errno) => Err(errno),
    }
}

/// The family id of a `CTRL_CMD_NEWFAMILY` answer (genlmsghdr and attributes), if it has one.
pub(crate) fn parse_family_id(payload: &[u8]) -> Result<Option<u16>, Malformed> {
    for attr in nl::attributes(genl_attrs(payload)?) {
        let (ty, value) = attr?;
        if ty == message::CTRL_ATTR_FAMILY_ID {
            return Ok(Some(u16::from_ne_bytes(fixed(value, "CTRL_ATTR_FAMILY_ID")?)));
        }
    }
    Ok(None)
}

/// A service of an `IPVS_CMD_GET_SERVICE` dump (genlmsghdr and attributes); `None` for a fwmark
/// service or an unknown protocol or address family.
pub(crate) fn parse_service(payload: &[u8]) -> Result<Option<KernelService>, Malformed> {
    let nest = nested(payload, IPVS_CMD_ATTR_SERVICE, "IPVS_CMD_ATTR_SERVICE")?;
    let (mut af, mut protocol, mut address, mut port) = (None, None, None, None);
    let (mut scheduler, mut flags, mut timeout) = (None, 0, 0);
    for attr in nl::attributes(nest) {
        let (ty, value) = attr?;
        match ty {
            IPVS_SVC_ATTR_AF => af = Some(u16::from_ne_bytes(fixed(value, "IPVS_SVC_ATTR_AF")?)),
            IPVS_SVC_ATTR_PROTOCOL => protocol = Some(u16::from_ne_bytes(fixed(value, "IPVS_SVC_ATTR_PROTOCOL")?)),
            IPVS_SVC_ATTR_ADDR => address = Some(value),
            IPVS_SVC_ATTR_PORT => port = Some(u16::from_be_bytes(fixed(value, "IPVS_SVC_ATTR_PORT")?)),
            IPVS_SVC_ATTR_SCHED_NAME => scheduler = Some(c_string(value)),
            IPVS_SVC_ATTR_FLAGS => {
                let [a, b, c, d, ..] = *value else { return Err(length("IPVS_SVC_ATTR_FLAGS", value)) };
                flags = u32::from_ne_bytes([a, b, c, d]);
            }
            IPVS_SVC_ATTR_TIMEOUT => timeout = u32::from_ne_bytes(fixed(value, "IPVS_SVC_ATTR_TIMEOUT")?),
            _ => {}
        }
    }
    // A fwmark service has no protocol, address or port.
    let (Some(af), Some(protocol), Some(address), Some(port)) = (af, protocol, address, port) else { return Ok(None) };
    let Some(protocol) = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| u16::from(message::ip_proto(*p)) == protocol)
    else {
        return Ok(None);
    };
    let Some(address) = inet_addr(af, address, "IPVS_SVC_ATTR_ADDR")? else { return Ok(None) };
    let persistence = (flags & IP_VS_SVC_F_PERSISTENT != 0).then_some(timeout);
    let scheduler = scheduler.ok_or_else(|| Malformed("a service without IPVS_SVC_ATTR_SCHED_NAME".into()))?;
    Ok(Some(KernelService { key: VirtualKey { protocol, address, port }, scheduler, persistence }))
}

/// A destination of an `IPVS_CMD_GET_DEST` dump (genlmsghdr and attributes) of a service of
/// address family `service_af` (a destination's own family attribute, when present, wins).
pub(crate) fn parse_dest(payload: &[u8], service_af: u16) -> Result<KernelDest, Malformed> {
    let nest = nested(payload, IPVS_CMD_ATTR_DEST, "IPVS_CMD_ATTR_DEST")?;
    let (mut af, mut address, mut port, mut weight) = (service_af, None, None, None);
    let (mut active, mut inactive) = (None, None);
    let u32_of = |value: &[u8], name| fixed(value, name).map(u32::from_ne_bytes);
    for attr in nl::attributes(nest) {
        let (ty, value) = attr?;
        match ty {
            IPVS_DEST_ATTR_ADDR_FAMILY => af = u16::from_ne_bytes(fixed(value, "IPVS_DEST_ATTR_ADDR_FAMILY")?),
            IPVS_DEST_ATTR_ADDR => address = Some(value),
            IPVS_DEST_ATTR_PORT => port = Some(u16::from_be_bytes(fixed(value, "IPVS_DEST_ATTR_PORT")?)),
            IPVS_DEST_ATTR_WEIGHT => weight = Some(u32_of(value, "IPVS_DEST_ATTR_WEIGHT")?),
            IPVS_DEST_ATTR_ACTIVE_CONNS => active = Some(u32_of(value, "IPVS_DEST_ATTR_ACTIVE_CONNS")?),
            IPVS_DEST_ATTR_INACT_CONNS => inactive = Some(u32_of(value, "IPVS_DEST_ATTR_INACT_CONNS")?),
            _ => {}
        }
    }
    let missing = |name: &str| Malformed(format!("a destination without {name}"));
    let address = address.ok_or_else(|| missing("IPVS_DEST_ATTR_ADDR"))?;
    let address = inet_addr(af, address, "IPVS_DEST_ATTR_ADDR")?
        .ok_or_else(|| Malformed(format!("a destination of unknown address family {af}")))?;
    Ok(KernelDest {
        real: RealServer { address, port: port.ok_or_else(|| missing("IPVS_DEST_ATTR_PORT"))? },
        weight: weight.ok_or_else(|| missing("IPVS_DEST_ATTR_WEIGHT"))?,
        active_connections: active.ok_or_else(|| missing("IPVS_DEST_ATTR_ACTIVE_CONNS"))?,
        inactive_connections: inactive.ok_or_else(|| missing("IPVS_DEST_ATTR_INACT_CONNS"))?,
    })
}

/// The attributes after a generic-netlink message's genlmsghdr.
fn genl_attrs(payload: &[u8]) -> Result<&[u8], Malformed> {
    payload.get(GENL_HDRLEN..).ok_or_else(|| Malformed(format!("generic netlink message of {} bytes", payload.len())))
}

/// The payload of the top-level nested attribute `ty` of a generic-netlink message.
fn nested<'a>(payload: &'a [u8], ty: u16, name: &str) -> Result<&'a [u8], Malformed> {
    for attr in nl::attributes(genl_attrs(payload)?) {
        let (found, value) = attr?;
        if found == ty {
            return Ok(value);
        }
    }
    Err(Malformed(format!("an answer without {name}")))
}

/// A fixed-size attribute value.
fn fixed<const N: usize>(value: &[u8], name: &str) -> Result<[u8; N], Malformed> {
    value.try_into().map_err(|_| length(name, value))
}

fn length(name: &str, value: &[u8]) -> Malformed {
    Malformed(format!("{name} of {} bytes", value.len()))
}

/// A `union nf_inet_addr` of family `af`; `None` for another family.
fn inet_addr(af: u16, value: &[u8], name: &str) -> Result<Option<IpAddr>, Malformed> {
    Ok(match af {
        AF_INET => {
            let octets: [u8; 4] = value.get(..4).and_then(|v| v.try_into().ok()).ok_or_else(|| length(name, value))?;
            Some(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(fixed::<16>(value, name)?))),
        _ => None,
    })
}

/// A NUL-terminated string attribute (lossy).
fn c_string(value: &[u8]) -> String {
    String::from_utf8_lossy(value.split(|&c| c == 0).next().unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;
    use roadkeeper_rules::ipvs::{FrontendKind, Scheduler, VirtualServer};
    use roadkeeper_rules::table::ServicePortName;

    use super::*;

    fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        nl::attr(&mut b, ty, payload);
        b
    }

    /// A genlmsghdr and one nested attribute `ty` holding `inner`.
    fn genl(cmd: u8, ty: u16, inner: &[u8]) -> Vec<u8> {
        let mut b = vec![cmd, 1, 0, 0];
        let nest = nl::begin_nest(&mut b, ty);
        b.extend_from_slice(inner);
        nl::end_nest(&mut b, nest);
        b
    }

    fn addr16(ip: IpAddr) -> [u8; 16] {
        let mut out = [0; 16];
        match ip {
            IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out = v6.octets(),
        }
        out
    }

    /// A service as the kernel dumps it (stats and netmask included).
    fn service(af: u16, protocol: u16, ip: &str, port: u16, flags: u32, timeout: u32) -> Vec<u8> {
        let ip: IpAddr = ip.parse().unwrap();
        let flags = [flags.to_ne_bytes(), u32::MAX.to_ne_bytes()].concat();
        let stats = attr(1, &7u32.to_ne_bytes());
        let inner = [
            attr(IPVS_SVC_ATTR_AF, &af.to_ne_bytes()),
            attr(IPVS_SVC_ATTR_PROTOCOL, &protocol.to_ne_bytes()),
            attr(IPVS_SVC_ATTR_ADDR, &addr16(ip)),
            attr(IPVS_SVC_ATTR_PORT, &port.to_be_bytes()),
            attr(IPVS_SVC_ATTR_SCHED_NAME, b"rr\0"),
            attr(IPVS_SVC_ATTR_FLAGS, &flags),
            attr(IPVS_SVC_ATTR_TIMEOUT, &timeout.to_ne_bytes()),
            attr(9, &u32::MAX.to_ne_bytes()),
            attr(10 | nl::NLA_F_NESTED, &stats),
        ]
        .concat();
        genl(1, IPVS_CMD_ATTR_SERVICE, &inner)
    }

    fn dest(ip: &str, weight: u32, active: u32, inactive: u32, with_family: bool) -> Vec<u8> {
        let ip: IpAddr = ip.parse().unwrap();
        let mut inner = [
            attr(IPVS_DEST_ATTR_ADDR, &addr16(ip)),
            attr(IPVS_DEST_ATTR_PORT, &8080u16.to_be_bytes()),
            attr(3, &0u32.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_WEIGHT, &weight.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_ACTIVE_CONNS, &active.to_ne_bytes()),
            attr(IPVS_DEST_ATTR_INACT_CONNS, &inactive.to_ne_bytes()),
            attr(9, &0u32.to_ne_bytes()),
        ]
        .concat();
        if with_family {
            inner.extend(attr(IPVS_DEST_ATTR_ADDR_FAMILY, &message::af(ip).to_ne_bytes()));
        }
        genl(5, IPVS_CMD_ATTR_DEST, &inner)
    }

    fn key(ip: &str) -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: ip.parse().unwrap(), port: 80 }
    }

    #[test]
    fn services_are_parsed_with_scheduler_and_persistence() {
        let plain = parse_service(&service(AF_INET, 6, "10.96.0.10", 80, 0, 0)).unwrap().unwrap();
        assert_eq!(plain, KernelService { key: key("10.96.0.10"), scheduler: "rr".into(), persistence: None });
        let sticky = parse_service(&service(AF_INET6, 17, "fd00::10", 53, IP_VS_SVC_F_PERSISTENT, 10800)).unwrap();
        let expected = VirtualKey { protocol: Protocol::Udp, address: "fd00::10".parse().unwrap(), port: 53 };
        assert_eq!(sticky, Some(KernelService { key: expected, scheduler: "rr".into(), persistence: Some(10800) }));
    }

    #[test]
    fn fwmark_and_unknown_protocol_services_are_skipped() {
        assert_eq!(parse_service(&service(AF_INET, 50, "10.96.0.10", 80, 0, 0)).unwrap(), None, "ESP");
        assert_eq!(parse_service(&service(7, 6, "10.96.0.10", 80, 0, 0)).unwrap(), None, "unknown family");
        let fwmark = [
            attr(IPVS_SVC_ATTR_AF, &AF_INET.to_ne_bytes()),
            attr(5, &1u32.to_ne_bytes()),
            attr(IPVS_SVC_ATTR_SCHED_NAME, b"rr\0"),
        ]
        .concat();
        assert_eq!(parse_service(&genl(1, IPVS_CMD_ATTR_SERVICE, &fwmark)).unwrap(), None);
    }

    #[test]
    fn dests_are_parsed_with_weights_and_connections() {
        let parsed = parse_dest(&dest("10.244.0.5", 0, 3, 4, true), AF_INET).unwrap();
        let real = RealServer { address: "10.244.0.5".parse().unwrap(), port: 8080 };
        assert_eq!(parsed, KernelDest { real, weight: 0, active_connections: 3, inactive_connections: 4 });
        // Without its own family attribute (old kernels), the service's family holds.
        let parsed = parse_dest(&dest("fd00::5", 1, 0, 0, false), AF_INET6).unwrap();
        assert_eq!(parsed.real.address, "fd00::5".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn the_family_id_is_read_from_the_controller_answer() {
        let payload =
            [vec![1, 2, 0, 0], attr(2, b"IPVS\0"), attr(message::CTRL_ATTR_FAMILY_ID, &0x2cu16.to_ne_bytes())].concat();
        assert_eq!(parse_family_id(&payload).unwrap(), Some(0x2c));
        assert_eq!(parse_family_id(&[1, 2, 0, 0]).unwrap(), None);
        assert!(parse_family_id(&[1, 2]).is_err());
    }

    #[test]
    fn every_truncation_of_an_answer_is_an_error_or_a_skip_never_a_panic() {
        for whole in [service(AF_INET6, 6, "fd00::10", 80, 1, 5), dest("10.244.0.5", 1, 0, 0, true)] {
            for cut in 0..whole.len() {
                let part = &whole[..cut];
                let _ = parse_service(part);
                assert!(parse_dest(part, AF_INET).is_err(), "a destination cut at {cut} bytes must be an error");
            }
            // Corrupted lengths: every byte set to 0xff in turn.
            for at in 0..whole.len() {
                let mut bad = whole.clone();
                bad[at] = 0xff;
                let _ = parse_service(&bad);
                let _ = parse_dest(&bad, AF_INET);
            }
        }
        let mut short_port = service(AF_INET, 6, "10.96.0.10", 80, 0, 0);
        // The port attribute's length field (after genlmsghdr, nest header, AF, PROTOCOL, ADDR).
        let at = 4 + 4 + 8 + 8 + 20;
        assert_eq!(u16::from_ne_bytes([short_port[at + 2], short_port[at + 3]]), IPVS_SVC_ATTR_PORT);
        short_port[at..at + 2].copy_from_slice(&5u16.to_ne_bytes());
        assert!(parse_service(&short_port).is_err(), "a 1-byte port");
    }

    fn server() -> VirtualServer {
        let service =
            ServicePortName { service: NamespacedName::new("ns", "a"), port: String::new(), protocol: Protocol::Tcp };
        let (kind, scheduler) = (FrontendKind::ClusterIp, Scheduler::RoundRobin);
        VirtualServer { service, kind, scheduler, persistence: None, real_servers: Default::default() }
    }

    #[test]
    fn existing_objects_are_edited_and_absent_ones_count_as_deleted() {
        let (vs, rs) = (key("10.96.0.10"), RealServer { address: "10.244.0.5".parse().unwrap(), port: 8080 });
        let add = IpvsOp::AddService(vs, server());
        assert_eq!(settle(&add, 0), Ok(None));
        assert_eq!(settle(&add, libc::EEXIST), Ok(Some(IpvsOp::EditService(vs, server()))));
        assert_eq!(settle(&IpvsOp::AddDest(vs, rs, 3), libc::EEXIST), Ok(Some(IpvsOp::EditDest(vs, rs, 3))));
        assert_eq!(settle(&IpvsOp::DelService(vs), libc::ESRCH), Ok(None));
        assert_eq!(settle(&IpvsOp::DelDest(vs, rs), libc::ENOENT), Ok(None));
        assert_eq!(settle(&IpvsOp::DelDest(vs, rs), libc::ESRCH), Ok(None), "its service is gone");
        assert_eq!(settle(&IpvsOp::EditDest(vs, rs, 1), libc::ENOENT), Err(libc::ENOENT));
        assert_eq!(settle(&IpvsOp::AddDest(vs, rs, 1), libc::ESRCH), Err(libc::ESRCH), "no such service");
        assert_eq!(settle(&add, libc::EINVAL), Err(libc::EINVAL));
    }

    #[test]
    fn a_refusal_names_the_command_and_both_ends() {
        let (vs, rs) = (key("10.96.0.10"), RealServer { address: "10.244.0.5".parse().unwrap(), port: 8080 });
        let error = IpvsError::Refused { what: message::describe(&IpvsOp::AddDest(vs, rs, 1)), errno: libc::EINVAL };
        assert_eq!(
            error.to_string(),
            "IPVS_CMD_NEW_DEST TCP 10.96.0.10:80 -> 10.244.0.5:8080 weight 1: Invalid argument (EINVAL)"
        );
    }
}
