//! Stale UDP/SCTP conntrack cleanup over ctnetlink: after each sync, the entries that
//! [`ServingMap::is_stale`] (pure, in `roadkeeper_rules::conntrack`, with the why) picks are
//! dumped and deleted ([`cleanup_stale_flows`], [`dump_flows`], [`delete_flows`]).
//!
//! The ctnetlink messages are hand-encoded (nlmsghdr + nfgenmsg + nested attributes) rather than
//! taken from a crate: `netlink-packet-netfilter` (0.4) has conntrack message types but no socket,
//! dump or ACK handling, which would be hand-written anyway, and it would pull
//! `netlink-packet-core`, `zerocopy` and `derive_more` 0.99 (syn 1) into a crate that has no
//! netlink dependency today; the `conntrack` crate (0.1) has no license. What is needed here is
//! one dump request, one delete request and a tuple parser: about 250 lines with no new
//! dependency. The socket and the message framing are shared with the nf_tables netlink code
//! ([`crate::netlink_socket`]). Numbers are copied from `linux/netlink.h`,
//! `linux/netfilter/nfnetlink.h` and `linux/netfilter/nfnetlink_conntrack.h` under their C names.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use roadkeeper_cluster::NamespacedName;
use roadkeeper_rules::conntrack::{Flow, ServingMap, Tuple};
use roadkeeper_rules::table::{IpFamily, ServicePort};

use crate::Error;
use crate::netlink_socket::{
    self as nl, NLA_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NetlinkSocket,
    attr,
};

// linux/netlink.h
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLA_TYPE_MASK: u16 = 0x3fff;

// linux/netfilter/nfnetlink.h
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const NFGENMSG_LEN: usize = 4;

// linux/netfilter/nfnetlink_conntrack.h: enum cntl_msg_types
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

// enum ctattr_type
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;

// enum ctattr_tuple
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;

// enum ctattr_ip
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;

// enum ctattr_l4proto
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// How long one netlink receive may block before the exchange is abandoned.
const RECV_TIMEOUT_MS: i32 = 10_000;
/// Receive buffer: larger than any single dump skb the kernel builds (≤ 32 KiB + overhead).
const RECV_BUF_LEN: usize = 256 * 1024;

/// Deletes the conntrack entries that pin UDP/SCTP service traffic to endpoints that no longer
/// serve, in the calling thread's network namespace; the number deleted (for
/// `conntrack_reconciler_deleted_entries_total`). Call it after the sync's rules are in the
/// kernel, or the next datagram recreates the entry towards the old endpoint.
pub fn cleanup_stale_flows(
    table: &BTreeMap<NamespacedName, Vec<ServicePort>>,
    node_ips: &[IpAddr],
) -> Result<u64, Error> {
    let map = ServingMap::new(table, node_ips);
    if map.is_empty() {
        return Ok(0);
    }
    let socket = Socket::open()?;
    let mut deleted = 0;
    for family in map.families() {
        let flows = socket.dump(family)?;
        let stale = map.stale(&flows);
        if !stale.is_empty() {
            deleted += socket.delete(&stale)?;
        }
    }
    Ok(deleted)
}

/// Every conntrack entry of one family, in the calling thread's network namespace.
pub fn dump_flows(family: IpFamily) -> Result<Vec<Flow>, Error> {
    Socket::open()?.dump(family)
}

/// Deletes the given entries (matched by original tuple, zone and id); the number actually
/// deleted. Entries already gone are skipped; other per-entry refusals are logged and skipped.
pub fn delete_flows(flows: &[&Flow]) -> Result<u64, Error> {
    Socket::open()?.delete(flows)
}

// ---- encoding / decoding (pure) -------------------------------------------------------------

fn af(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => libc::AF_INET as u8,
        IpFamily::V6 => libc::AF_INET6 as u8,
    }
}

fn ct_msg_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | msg
}

/// Starts a netlink message (header + nfgenmsg); [`finish`] fills in its length.
fn begin(ty: u16, flags: u16, seq: u32, family: u8) -> Vec<u8> {
    let mut b = Vec::with_capacity(128);
    nl::begin_msg(&mut b, ty, flags, seq, family, 0);
    b
}

fn finish(mut b: Vec<u8>) -> Vec<u8> {
    nl::end_msg(&mut b, 0);
    b
}

fn nest(b: &mut Vec<u8>, ty: u16, f: impl FnOnce(&mut Vec<u8>)) {
    let start = nl::begin_nest(b, ty);
    f(b);
    nl::end_nest(b, start);
}

fn encode_tuple(b: &mut Vec<u8>, t: &Tuple) {
    nest(b, CTA_TUPLE_IP, |b| match (t.src, t.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            attr(b, CTA_IP_V4_SRC, &s.octets());
            attr(b, CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            attr(b, CTA_IP_V6_SRC, &v6(s).octets());
            attr(b, CTA_IP_V6_DST, &v6(d).octets());
        }
    });
    nest(b, CTA_TUPLE_PROTO, |b| {
        attr(b, CTA_PROTO_NUM, &[t.protocol]);
        attr(b, CTA_PROTO_SRC_PORT, &t.src_port.to_be_bytes());
        attr(b, CTA_PROTO_DST_PORT, &t.dst_port.to_be_bytes());
    });
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// `IPCTNL_MSG_CT_GET` dump request for one family.
fn encode_dump(family: IpFamily, seq: u32) -> Vec<u8> {
    finish(begin(ct_msg_type(IPCTNL_MSG_CT_GET), NLM_F_REQUEST | NLM_F_DUMP, seq, af(family)))
}

/// `IPCTNL_MSG_CT_DELETE` of one entry by original tuple (+ zone, + id), asking for an ACK.
fn encode_delete(flow: &Flow, seq: u32) -> Vec<u8> {
    let family = af(IpFamily::of(&flow.orig.src));
    let mut b = begin(ct_msg_type(IPCTNL_MSG_CT_DELETE), NLM_F_REQUEST | NLM_F_ACK, seq, family);
    nest(&mut b, CTA_TUPLE_ORIG, |b| encode_tuple(b, &flow.orig));
    if flow.zone != 0 {
        attr(&mut b, CTA_ZONE, &flow.zone.to_be_bytes());
    }
    if let Some(id) = flow.id {
        attr(&mut b, CTA_ID, &id.to_be_bytes());
    }
    finish(b)
}

/// Iterates over netlink attributes: `(type without flags, payload)`. Stops at malformed data.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > b.len() {
            return None;
        }
        let payload = &b[NLA_HDRLEN..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((ty, payload))
    })
}

/// One netlink message: type, flags, seq, payload (after the 16-byte header).
struct NlMsg<'a> {
    ty: u16,
    flags: u16,
    seq: u32,
    payload: &'a [u8],
}

/// Iterates over the netlink messages of one receive. Stops at malformed data.
fn messages(mut b: &[u8]) -> impl Iterator<Item = NlMsg<'_>> {
    std::iter::from_fn(move || {
        if b.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return None;
        }
        let msg = NlMsg {
            ty: u16::from_ne_bytes([b[4], b[5]]),
            flags: u16::from_ne_bytes([b[6], b[7]]),
            seq: u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            payload: &b[NLMSG_HDRLEN..len],
        };
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some(msg)
    })
}

fn be16(p: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(p.get(..2)?.try_into().ok()?))
}

fn parse_tuple(b: &[u8]) -> Option<Tuple> {
    let (mut src, mut dst, mut protocol) = (None, None, None);
    let (mut src_port, mut dst_port) = (0, 0);
    for (ty, p) in attrs(b) {
        match ty {
            CTA_TUPLE_IP => {
                for (ty, p) in attrs(p) {
                    let v4 = || Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(p).ok()?)));
                    let v6 = || Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p).ok()?)));
                    match ty {
                        CTA_IP_V4_SRC => src = v4(),
                        CTA_IP_V4_DST => dst = v4(),
                        CTA_IP_V6_SRC => src = v6(),
                        CTA_IP_V6_DST => dst = v6(),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (ty, p) in attrs(p) {
                    match ty {
                        CTA_PROTO_NUM => protocol = p.first().copied(),
                        CTA_PROTO_SRC_PORT => src_port = be16(p)?,
                        CTA_PROTO_DST_PORT => dst_port = be16(p)?,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple { src: src?, dst: dst?, protocol: protocol?, src_port, dst_port })
}

/// Parses the payload (nfgenmsg + attributes) of an `IPCTNL_MSG_CT_NEW` dump message.
fn parse_flow(payload: &[u8]) -> Option<Flow> {
    let (mut orig, mut reply, mut zone, mut id) = (None, None, 0, None);
    for (ty, p) in attrs(payload.get(NFGENMSG_LEN..)?) {
        match ty {
            CTA_TUPLE_ORIG => orig = parse_tuple(p),
            CTA_TUPLE_REPLY => reply = parse_tuple(p),
            CTA_ZONE => zone = be16(p)?,
            CTA_ID => id = Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?)),
            _ => {}
        }
    }
    Some(Flow { orig: orig?, reply: reply?, zone, id })
}

/// The errno of an `NLMSG_ERROR` payload (0 for an ACK).
fn error_code(payload: &[u8]) -> i32 {
    payload.get(..4).map_or(-libc::EPROTO, |b| i32::from_ne_bytes(b.try_into().unwrap()))
}

// ---- the socket (thin) ----------------------------------------------------------------------

fn error(what: &str, err: impl std::fmt::Display) -> Error {
    Error::Conntrack(format!("{what}: {err}"))
}

fn errno_error(what: &str, errno: i32) -> Error {
    error(what, io::Error::from_raw_os_error(errno))
}

static SEQ: AtomicU32 = AtomicU32::new(1);

fn next_seq() -> u32 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// A `NETLINK_NETFILTER` socket in the calling thread's network namespace.
struct Socket(NetlinkSocket);

impl Socket {
    fn open() -> Result<Socket, Error> {
        NetlinkSocket::open(nl::NETLINK_NETFILTER).map(Socket).map_err(|e| Error::Conntrack(e.to_string()))
    }

    fn send(&self, data: &[u8]) -> Result<(), Error> {
        self.0.send(data).map_err(|e| Error::Conntrack(e.to_string()))
    }

    /// One datagram into `buf`; its length.
    fn recv(&self, buf: &mut [u8]) -> Result<usize, Error> {
        match self.0.recv(buf, RECV_TIMEOUT_MS).map_err(|e| Error::Conntrack(e.to_string()))? {
            Some(n) if n > buf.len() => Err(error("recv", format!("datagram of {n} bytes truncated"))),
            Some(n) => Ok(n),
            None => Err(error("recv", "no answer from the kernel")),
        }
    }

    fn dump(&self, family: IpFamily) -> Result<Vec<Flow>, Error> {
        let seq = next_seq();
        self.send(&encode_dump(family, seq))?;
        let mut buf = vec![0u8; RECV_BUF_LEN];
        let mut flows = Vec::new();
        let mut interrupted = false;
        loop {
            let n = self.recv(&mut buf)?;
            for msg in messages(&buf[..n]) {
                if msg.seq != seq {
                    continue;
                }
                interrupted |= msg.flags & NLM_F_DUMP_INTR != 0;
                match msg.ty {
                    NLMSG_DONE => {
                        let code = error_code(msg.payload);
                        if code < 0 {
                            return Err(errno_error("dump", -code));
                        }
                        if interrupted {
                            // The table changed during the dump; what we saw is still usable, and
                            // anything missed is caught by the next sync.
                            tracing::debug!(?family, "conntrack dump interrupted");
                        }
                        return Ok(flows);
                    }
                    NLMSG_ERROR => {
                        let code = error_code(msg.payload);
                        if code < 0 {
                            return Err(errno_error("dump", -code));
                        }
                    }
                    ty if ty == ct_msg_type(IPCTNL_MSG_CT_NEW) => flows.extend(parse_flow(msg.payload)),
                    _ => {}
                }
            }
        }
    }

    fn delete(&self, flows: &[&Flow]) -> Result<u64, Error> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut deleted = 0;
        for flow in flows {
            let seq = next_seq();
            self.send(&encode_delete(flow, seq))?;
            let code = 'ack: loop {
                let n = self.recv(&mut buf)?;
                for msg in messages(&buf[..n]) {
                    if msg.seq == seq && msg.ty == NLMSG_ERROR {
                        break 'ack error_code(msg.payload);
                    }
                }
            };
            match -code {
                0 => deleted += 1,
                // Gone already (expired, or replaced by a new entry with another id).
                libc::ENOENT => {}
                errno => {
                    tracing::warn!(?flow, "cannot delete conntrack entry: {}", io::Error::from_raw_os_error(errno))
                }
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use roadkeeper_rules::conntrack::{IPPROTO_SCTP, IPPROTO_UDP};

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn flow(proto: u8, client: &str, cport: u16, front: &str, fport: u16, back: &str, bport: u16) -> Flow {
        Flow::dnat_for_test(proto, (ip(client), cport), (ip(front), fport), (ip(back), bport))
    }

    /// Wraps the attributes of a delete request as a dump message payload and parses it back.
    fn round_trip(f: &Flow) -> Flow {
        let msg = encode_delete(f, 9);
        let m = messages(&msg).next().unwrap();
        assert_eq!(m.ty, (1 << 8) | 2);
        assert_eq!(m.flags, NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(m.seq, 9);
        assert_eq!(messages(&msg).count(), 1);
        // Add a reply tuple as a dump message would carry it.
        let mut payload = m.payload.to_vec();
        nest(&mut payload, CTA_TUPLE_REPLY, |b| encode_tuple(b, &f.reply));
        parse_flow(&payload).unwrap()
    }

    #[test]
    fn delete_request_encodes_the_original_tuple() {
        let f = flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.2", 5353);
        let msg = encode_delete(&f, 9);
        #[rustfmt::skip]
        let want_attrs: Vec<u8> = [
            &[52, 0, 1, 0x80][..],                 // CTA_TUPLE_ORIG, nested
            &[20, 0, 1, 0x80],                     //   CTA_TUPLE_IP, nested
            &[8, 0, 1, 0], &[10, 2, 0, 9],         //     CTA_IP_V4_SRC
            &[8, 0, 2, 0], &[10, 96, 0, 10],       //     CTA_IP_V4_DST
            &[28, 0, 2, 0x80],                     //   CTA_TUPLE_PROTO, nested
            &[5, 0, 1, 0], &[17, 0, 0, 0],         //     CTA_PROTO_NUM
            &[6, 0, 2, 0], &[0x9c, 0x40, 0, 0],    //     CTA_PROTO_SRC_PORT 40000
            &[6, 0, 3, 0], &[0, 53, 0, 0],         //     CTA_PROTO_DST_PORT 53
            &[8, 0, 12, 0], &[0, 0, 0, 7],         // CTA_ID
        ].concat();
        assert_eq!(&msg[NLMSG_HDRLEN..NLMSG_HDRLEN + 4], &[libc::AF_INET as u8, 0, 0, 0]);
        assert_eq!(&msg[NLMSG_HDRLEN + 4..], &want_attrs[..]);
        assert_eq!(u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize, msg.len());
    }

    #[test]
    fn flows_round_trip_through_the_wire_format() {
        for f in [
            flow(IPPROTO_UDP, "10.2.0.9", 40000, "10.96.0.10", 53, "10.1.0.2", 5353),
            flow(IPPROTO_SCTP, "fd00:2::9", 5000, "fd00:96::10", 3868, "fd00:1::2", 3868),
            Flow { zone: 3, id: None, ..flow(IPPROTO_UDP, "10.2.0.9", 1, "10.96.0.10", 53, "10.1.0.2", 5353) },
        ] {
            assert_eq!(round_trip(&f), f);
        }
    }

    #[test]
    fn dump_request_and_malformed_input() {
        let msg = encode_dump(IpFamily::V6, 5);
        assert_eq!(msg.len(), NLMSG_HDRLEN + NFGENMSG_LEN);
        let m = messages(&msg).next().unwrap();
        assert_eq!((m.ty, m.flags, m.seq), ((1 << 8) | 1, NLM_F_REQUEST | NLM_F_DUMP, 5));
        assert_eq!(m.payload[0], libc::AF_INET6 as u8);
        // Truncated messages and attributes end iteration instead of panicking.
        assert_eq!(messages(&msg[..msg.len() - 1]).count(), 0);
        let f = flow(IPPROTO_UDP, "10.2.0.9", 1, "10.96.0.10", 53, "10.1.0.2", 5353);
        let del = encode_delete(&f, 1);
        for cut in NLMSG_HDRLEN..del.len() {
            let _ = parse_flow(&del[NLMSG_HDRLEN..cut]);
        }
        assert_eq!(parse_flow(&del[NLMSG_HDRLEN..]), None, "no reply tuple");
    }
}

/// Against a live kernel, in a scratch network namespace: a fake Service DNATed by hand-written
/// nft rules to echo servers on a veth interface (needs root, `nft`, `conntrack`).
#[cfg(test)]
mod kernel_tests {
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;

    use roadkeeper_netlab::{Netns, echo, probe};

    use super::*;
    use roadkeeper_rules::conntrack::IPPROTO_UDP;
    use roadkeeper_rules::table::{Endpoint, Protocol};

    /// Addresses of one family's scenario.
    struct Net {
        family: IpFamily,
        client: IpAddr,
        a: IpAddr,
        b: IpAddr,
        other: IpAddr,
        svc: IpAddr,
        node: IpAddr,
        prefix: u8,
        svc_net: &'static str,
    }

    fn net(family: IpFamily) -> Net {
        let p = |s: &str| -> IpAddr { s.parse().unwrap() };
        match family {
            IpFamily::V4 => Net {
                family,
                client: p("10.0.0.100"),
                a: p("10.0.0.1"),
                b: p("10.0.0.2"),
                other: p("10.0.0.3"),
                svc: p("10.96.0.10"),
                node: p("10.0.0.50"),
                prefix: 24,
                svc_net: "10.96.0.0/16",
            },
            IpFamily::V6 => Net {
                family,
                client: p("fd00::100"),
                a: p("fd00::1"),
                b: p("fd00::2"),
                other: p("fd00::3"),
                svc: p("fd00:96::10"),
                node: p("fd00::50"),
                prefix: 64,
                svc_net: "fd00:96::/64",
            },
        }
    }

    const SVC_PORT: u16 = 53;
    const TARGET_PORT: u16 = 5353;
    const NODE_PORT: u16 = 30053;
    const OTHER_PORT: u16 = 7000;
    // Fixed client ports sit below the ephemeral range (32768-60999), so that no socket bound
    // to port 0 in the namespace (echo servers, other clients) can hold them already.
    const CLIENT_SVC_PORT: u16 = 20053;
    const CLIENT_NODEPORT_PORT: u16 = 20054;
    const CLIENT_OTHER_PORT: u16 = 20055;
    const CLIENT_UNSERVED_PORT: u16 = 20056;

    /// nft's spelling of `ip:port` as a DNAT target.
    fn target(ip: IpAddr, port: u16) -> String {
        match ip {
            IpAddr::V4(v4) => format!("{v4}:{port}"),
            IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        }
    }

    /// What a proxy sync would write: the Service's UDP and TCP ports and its NodePort, all
    /// DNATed to `endpoint` (the one serving endpoint).
    fn install_rules(ns: &Netns, n: &Net, endpoint: IpAddr) {
        let fam = match n.family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        let to = target(endpoint, TARGET_PORT);
        let script = format!(
            "table {fam} svc {{\n\
               chain out {{ type nat hook output priority -100; policy accept; }}\n\
             }}\n\
             flush chain {fam} svc out\n\
             add rule {fam} svc out {fam} daddr {svc} udp dport {SVC_PORT} dnat to {to}\n\
             add rule {fam} svc out {fam} daddr {svc} tcp dport {SVC_PORT} dnat to {to}\n\
             add rule {fam} svc out {fam} daddr {node} udp dport {NODE_PORT} dnat to {to}\n",
            svc = n.svc,
            node = n.node,
        );
        let path = std::env::temp_dir().join(format!("rk-ct-{}-{}.nft", std::process::id(), ns.name()));
        std::fs::write(&path, script).unwrap();
        let result = ns.exec(["nft", "-f", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
        result.expect("nft -f");
    }

    /// One datagram from a fixed client port; the name of the echo server that answered.
    fn ask(ns: &Netns, n: &Net, client_port: u16, to: SocketAddr) -> String {
        let client = n.client;
        ns.run(move || {
            let socket = UdpSocket::bind(SocketAddr::new(client, client_port)).expect("bind client");
            socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            socket.send_to(b"probe\n", to).expect("send");
            let mut buf = [0u8; 512];
            let (len, from) = socket.recv_from(&mut buf).expect("no reply");
            assert_eq!(from, to, "reply must come back from the frontend");
            let line = std::str::from_utf8(&buf[..len]).unwrap();
            line.parse::<roadkeeper_netlab::Reply>().unwrap().name
        })
    }

    fn conntrack_list(ns: &Netns, family: IpFamily) -> String {
        let f = match family {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        };
        let out = ns.exec(["conntrack", "-L", "-f", f]).expect("conntrack -L");
        String::from_utf8(out.stdout).unwrap()
    }

    /// Whether `conntrack -L` lists an entry of `proto` whose original tuple contains `orig`.
    fn listed(list: &str, proto: &str, orig: &str) -> bool {
        list.lines().any(|l| l.starts_with(proto) && l.contains(orig))
    }

    fn service_table(n: &Net, endpoint: IpAddr) -> BTreeMap<NamespacedName, Vec<ServicePort>> {
        let key = NamespacedName { namespace: "kube-system".into(), name: "dns".into() };
        let port = |protocol: Protocol, node_port| {
            let endpoints = vec![Endpoint { ip: endpoint, port: TARGET_PORT, is_local: true }];
            let mut sp = ServicePort::for_test(key.clone(), protocol, n.svc, SVC_PORT, endpoints);
            sp.name.port = protocol.as_str().into();
            ServicePort { node_port, ..sp }
        };
        BTreeMap::from([(key.clone(), vec![port(Protocol::Udp, Some(NODE_PORT)), port(Protocol::Tcp, None)])])
    }

    fn scenario(family: IpFamily) {
        let n = net(family);
        let ns = Netns::new("rk-ct").expect("netns");
        // (No `dummy` module on every kernel: a veth pair with both ends here does the same.)
        ns.ip(["link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1"]).unwrap();
        ns.ip(["link", "set", "dummy0", "up"]).unwrap();
        ns.ip(["link", "set", "dummy1", "up"]).unwrap();
        for ip in [n.client, n.a, n.b, n.other, n.node] {
            let cidr = format!("{ip}/{}", n.prefix);
            let mut args = vec!["addr", "add", cidr.as_str(), "dev", "dummy0"];
            if family == IpFamily::V6 {
                args.push("nodad");
            }
            ns.ip(args).unwrap();
        }
        ns.ip(["route", "add", n.svc_net, "dev", "dummy0"]).unwrap();

        let _servers = ns.run(|| {
            [
                echo::serve(&[SocketAddr::new(n.a, TARGET_PORT)], "a").unwrap(),
                echo::serve(&[SocketAddr::new(n.b, TARGET_PORT)], "b").unwrap(),
                echo::serve(&[SocketAddr::new(n.other, OTHER_PORT)], "other").unwrap(),
            ]
        });
        let svc = SocketAddr::new(n.svc, SVC_PORT);
        let nodeport = SocketAddr::new(n.node, NODE_PORT);
        let other = SocketAddr::new(n.other, OTHER_PORT);

        // The Service's only endpoint is A: every flow is pinned to it.
        install_rules(&ns, &n, n.a);
        assert_eq!(ask(&ns, &n, CLIENT_SVC_PORT, svc), "a");
        assert_eq!(ask(&ns, &n, CLIENT_NODEPORT_PORT, nodeport), "a");
        assert_eq!(ns.run(|| probe::tcp(svc, Duration::from_secs(2))).into_reply().unwrap().name, "a");
        assert_eq!(ask(&ns, &n, CLIENT_OTHER_PORT, other), "other");
        // UDP to the service IP on a port it does not serve: no DNAT, no reply, still tracked.
        ns.run(|| {
            let s = UdpSocket::bind(SocketAddr::new(n.client, CLIENT_UNSERVED_PORT)).unwrap();
            s.send_to(b"x", SocketAddr::new(n.svc, SVC_PORT + 1)).unwrap();
        });

        // A goes away: the sync DNATs to B only. Conntrack keeps the UDP flows on A.
        install_rules(&ns, &n, n.b);
        for _ in 0..3 {
            assert_eq!(ask(&ns, &n, CLIENT_SVC_PORT, svc), "a", "without cleanup the flow stays on A");
            assert_eq!(ask(&ns, &n, CLIENT_NODEPORT_PORT, nodeport), "a");
        }
        // A fresh client port already goes to B.
        assert_eq!(ask(&ns, &n, CLIENT_SVC_PORT + 100, svc), "b");

        let (c, s, o) = (n.client, n.svc, n.other);
        let svc_flow = format!("src={c} dst={s} sport={CLIENT_SVC_PORT} dport={SVC_PORT} ");
        let np_flow = format!("src={c} dst={} sport={CLIENT_NODEPORT_PORT} dport={NODE_PORT} ", n.node);
        let other_flow = format!("src={c} dst={o} sport={CLIENT_OTHER_PORT} dport={OTHER_PORT} ");
        let unserved_flow = format!("src={c} dst={s} sport={CLIENT_UNSERVED_PORT} dport={} ", SVC_PORT + 1);
        let tcp_flow = format!("dst={s} sport=");
        let before = conntrack_list(&ns, family);
        for (proto, flow) in
            [("udp", &svc_flow), ("udp", &np_flow), ("udp", &other_flow), ("udp", &unserved_flow), ("tcp", &tcp_flow)]
        {
            assert!(listed(&before, proto, flow), "{proto} {flow} missing before cleanup:\n{before}");
        }

        // Our own dump sees the same entries.
        let dumped = ns.run(|| dump_flows(family)).expect("dump");
        assert!(dumped.iter().any(|f| f.orig.dst == n.svc
            && f.orig.src_port == CLIENT_SVC_PORT
            && f.reply.src == n.a
            && f.reply.src_port == TARGET_PORT
            && f.orig.protocol == IPPROTO_UDP));
        assert!(dumped.iter().all(|f| IpFamily::of(&f.orig.src) == family));

        let table = service_table(&n, n.b);
        let node_ips = [n.node];
        let deleted = ns.run(|| cleanup_stale_flows(&table, &node_ips)).expect("cleanup");
        assert_eq!(deleted, 2, "the ClusterIP and NodePort flows pinned to A");
        // Deleting them again finds nothing (ENOENT is not an error).
        let pinned: Vec<&Flow> =
            dumped.iter().filter(|f| f.reply.src == n.a && f.orig.protocol == IPPROTO_UDP).collect();
        assert_eq!(pinned.len(), 2);
        assert_eq!(ns.run(|| delete_flows(&pinned)).expect("delete"), 0);

        let after = conntrack_list(&ns, family);
        assert!(!listed(&after, "udp", &svc_flow), "stale ClusterIP flow left:\n{after}");
        assert!(!listed(&after, "udp", &np_flow), "stale NodePort flow left:\n{after}");
        for (proto, flow) in [("udp", &other_flow), ("udp", &unserved_flow), ("tcp", &tcp_flow)] {
            assert!(listed(&after, proto, flow), "{proto} {flow} must be untouched:\n{after}");
        }

        // The same client port now reaches B, and the new flows are not stale.
        assert_eq!(ask(&ns, &n, CLIENT_SVC_PORT, svc), "b");
        assert_eq!(ask(&ns, &n, CLIENT_NODEPORT_PORT, nodeport), "b");
        assert_eq!(ns.run(|| cleanup_stale_flows(&table, &node_ips)).expect("cleanup"), 0);
        assert_eq!(ask(&ns, &n, CLIENT_SVC_PORT, svc), "b");
    }

    #[test]
    fn stale_udp_flows_are_deleted_ipv4() {
        scenario(IpFamily::V4);
    }

    #[test]
    fn stale_udp_flows_are_deleted_ipv6() {
        scenario(IpFamily::V6);
    }
}
