//! The dummy interface `kube-ipvs0` over rtnetlink, as upstream's IPVS proxier keeps it: a link
//! of kind `dummy`, left down, holding every Service address as a /32 or /128 (the kernel adds
//! their `local` routes whatever the link's state, so IPVS sees the packets at `LOCAL_IN`).
//!
//! Our own encoding on the shared framing, as nf_tables, ctnetlink and IPVS: five requests of a
//! header and two or three attributes each, pinned down by tests, where `netlink-packet-route`
//! would bring a message model of every rtnetlink object and its dependencies. Numbers are
//! copied from `linux/rtnetlink.h`, `linux/if_link.h` and `linux/if_addr.h` under their C names.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::exchange::{Conn, IpvsError};
use crate::netlink_socket::{self as nl, Malformed, NETLINK_ROUTE, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `IFA_F_NODAD`: an IPv6 address usable at once, without duplicate address detection.
const IFA_F_NODAD: u8 = 0x02;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;
/// `struct ifaddrmsg`.
const IFADDRMSG_LEN: usize = 8;
/// The link kind this module makes and accepts.
const DUMMY: &str = "dummy";

/// A dummy interface of the calling thread's network namespace, found or made by
/// [`ensure`](DummyInterface::ensure).
#[derive(Debug)]
pub struct DummyInterface {
    conn: Conn,
    name: String,
    index: u32,
}

impl DummyInterface {
    /// Finds the dummy interface `name`, or creates it (down, as upstream leaves it); an
    /// existing link of that name of another kind is an error ([`IpvsError::NotDummy`]).
    pub fn ensure(name: &str) -> Result<DummyInterface, crate::Error> {
        let mut conn = Conn::open(NETLINK_ROUTE, &format!("interface {name}"))?;
        // Twice at most: another program may create it between our look and our create.
        for _ in 0..2 {
            if let Some((index, kind)) = find_link(&mut conn, name)? {
                if kind != DUMMY {
                    return Err(IpvsError::NotDummy { name: name.into(), kind }.into());
                }
                return Ok(DummyInterface { conn, name: name.into(), index });
            }
            let what = format!("RTM_NEWLINK {name} type dummy");
            let seq = conn.next_seq(1);
            let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
            match conn.acked(&link_request(RTM_NEWLINK, flags, seq, name, Some(DUMMY)), seq, 1, &what)?[..] {
                [0 | libc::EEXIST] => {}
                [errno, ..] => return Err(IpvsError::Refused { what, errno }.into()),
                [] => unreachable!("one request, one answer"),
            }
        }
        Err(IpvsError::Malformed { what: format!("RTM_GETLINK {name}"), why: "created, but not found".into() }.into())
    }

    /// Deletes the link `name` (of any kind: the caller names its own); false when there was
    /// none.
    pub fn delete(name: &str) -> Result<bool, crate::Error> {
        let what = format!("RTM_DELLINK {name}");
        let mut conn = Conn::open(NETLINK_ROUTE, &what)?;
        let seq = conn.next_seq(1);
        match conn.acked(&link_request(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, seq, name, None), seq, 1, &what)?[..] {
            [0] => Ok(true),
            [libc::ENODEV] => Ok(false),
            [errno, ..] => Err(IpvsError::Refused { what, errno }.into()),
            [] => unreachable!("one request, one answer"),
        }
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds `ip` as a /32 or /128 (already there: done).
    pub fn add_address(&mut self, ip: IpAddr) -> Result<(), crate::Error> {
        self.change_address(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, ip, &[libc::EEXIST])
    }

    /// Removes `ip` (not there: done).
    pub fn del_address(&mut self, ip: IpAddr) -> Result<(), crate::Error> {
        self.change_address(RTM_DELADDR, 0, ip, &[libc::EADDRNOTAVAIL, libc::ENOENT])
    }

    /// The addresses of the interface, both families.
    pub fn addresses(&mut self) -> Result<BTreeSet<IpAddr>, crate::Error> {
        let what = format!("RTM_GETADDR dev {}", self.name);
        let seq = self.conn.next_seq(1);
        let replies = self.conn.request(&addr_dump(seq), seq, &what)?;
        let replies = replies.map_err(|errno| IpvsError::Refused { what: what.clone(), errno })?;
        let mut out = BTreeSet::new();
        for reply in replies {
            match parse_addr(&reply) {
                Ok(Some((index, ip))) if index == self.index => {
                    out.insert(ip);
                }
                Ok(_) => {}
                Err(e) => return Err(IpvsError::Malformed { what, why: e.0 }.into()),
            }
        }
        Ok(out)
    }

    fn change_address(&mut self, ty: u16, flags: u16, ip: IpAddr, done: &[i32]) -> Result<(), crate::Error> {
        let verb = if ty == RTM_NEWADDR { "RTM_NEWADDR" } else { "RTM_DELADDR" };
        let what = format!("{verb} {ip}/{} dev {}", prefix_len(ip), self.name);
        let seq = self.conn.next_seq(1);
        let request = addr_request(ty, NLM_F_REQUEST | NLM_F_ACK | flags, seq, self.index, ip);
        match self.conn.acked(&request, seq, 1, &what)?[..] {
            [errno] if errno == 0 || done.contains(&errno) => Ok(()),
            [errno, ..] => Err(IpvsError::Refused { what, errno }.into()),
            [] => unreachable!("one request, one answer"),
        }
    }
}

/// The index and kind (empty: none) of the link `name`, or `None` when there is none.
fn find_link(conn: &mut Conn, name: &str) -> Result<Option<(u32, String)>, IpvsError> {
    let what = format!("RTM_GETLINK {name}");
    let seq = conn.next_seq(1);
    let replies =
        match conn.request(&link_request(RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK, seq, name, None), seq, &what)? {
            Ok(replies) => replies,
            Err(libc::ENODEV) => return Ok(None),
            Err(errno) => return Err(IpvsError::Refused { what, errno }),
        };
    let reply = replies
        .first()
        .ok_or_else(|| IpvsError::Malformed { what: what.clone(), why: "no link in the answer".into() })?;
    parse_link(reply).map(Some).map_err(|e| IpvsError::Malformed { what, why: e.0 })
}

// ---- messages (pure) ------------------------------------------------------------------------

/// A link request naming the link `name`, with link kind `kind` (for a new link).
fn link_request(ty: u16, flags: u16, seq: u32, name: &str, kind: Option<&str>) -> Vec<u8> {
    let mut b = Vec::new();
    let start = nl::begin_nlmsg(&mut b, ty, flags, seq);
    b.extend_from_slice(&[0; IFINFOMSG_LEN]); // AF_UNSPEC, any type, index 0 (by name), no flags
    nl::attr(&mut b, IFLA_IFNAME, &nul_terminated(name));
    if let Some(kind) = kind {
        let info = nl::begin_nest(&mut b, IFLA_LINKINFO);
        nl::attr(&mut b, IFLA_INFO_KIND, kind.as_bytes());
        nl::end_nest(&mut b, info);
    }
    nl::end_msg(&mut b, start);
    b
}

/// An address request for `ip` as a host address (/32, /128; IPv6 without duplicate address
/// detection) on link `index`.
fn addr_request(ty: u16, flags: u16, seq: u32, index: u32, ip: IpAddr) -> Vec<u8> {
    let mut b = Vec::new();
    let start = nl::begin_nlmsg(&mut b, ty, flags, seq);
    let (family, ifa_flags, octets) = match ip {
        IpAddr::V4(v4) => (AF_INET, 0, v4.octets().to_vec()),
        IpAddr::V6(v6) => (AF_INET6, IFA_F_NODAD, v6.octets().to_vec()),
    };
    b.extend_from_slice(&[family, prefix_len(ip), ifa_flags, 0]); // scope: universe, as upstream
    b.extend_from_slice(&index.to_ne_bytes());
    nl::attr(&mut b, IFA_LOCAL, &octets);
    nl::attr(&mut b, IFA_ADDRESS, &octets);
    nl::end_msg(&mut b, start);
    b
}

/// The dump of every address of every link, both families.
fn addr_dump(seq: u32) -> Vec<u8> {
    let mut b = Vec::new();
    let start = nl::begin_nlmsg(&mut b, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq);
    b.extend_from_slice(&[AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0]);
    nl::end_msg(&mut b, start);
    b
}

/// The index and link kind (empty when it has none: a physical device) of a `RTM_NEWLINK`
/// answer (ifinfomsg and attributes).
pub(crate) fn parse_link(payload: &[u8]) -> Result<(u32, String), Malformed> {
    let index = payload.get(4..8).ok_or_else(|| Malformed(format!("link message of {} bytes", payload.len())))?;
    let index = u32::from_ne_bytes(index.try_into().expect("4 bytes"));
    let mut kind = String::new();
    for attr in nl::attributes(payload.get(IFINFOMSG_LEN..).unwrap_or_default()) {
        let (ty, value) = attr?;
        if ty == IFLA_LINKINFO {
            for info in nl::attributes(value) {
                let (ty, value) = info?;
                if ty == IFLA_INFO_KIND {
                    kind = String::from_utf8_lossy(value.split(|&c| c == 0).next().unwrap_or_default()).into_owned();
                }
            }
        }
    }
    Ok((index, kind))
}

/// The link index and address of a `RTM_NEWADDR` answer (ifaddrmsg and attributes); `None`
/// for another family or an answer without an address.
pub(crate) fn parse_addr(payload: &[u8]) -> Result<Option<(u32, IpAddr)>, Malformed> {
    let header =
        payload.get(..IFADDRMSG_LEN).ok_or_else(|| Malformed(format!("address message of {} bytes", payload.len())))?;
    let (family, index) = (header[0], u32::from_ne_bytes(header[4..8].try_into().expect("4 bytes")));
    let (mut local, mut address) = (None, None);
    for attr in nl::attributes(&payload[IFADDRMSG_LEN..]) {
        let (ty, value) = attr?;
        let ip = match (family, value.len()) {
            (AF_INET, 4) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(value).expect("4 bytes"))),
            (AF_INET6, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(value).expect("16 bytes"))),
            (AF_INET | AF_INET6, n) if ty == IFA_LOCAL || ty == IFA_ADDRESS => {
                return Err(Malformed(format!("an address of {n} bytes in family {family}")));
            }
            _ => continue,
        };
        match ty {
            IFA_LOCAL => local = Some(ip),
            IFA_ADDRESS => address = Some(ip),
            _ => {}
        }
    }
    // IFA_LOCAL is the interface's own address (IFA_ADDRESS the peer's on point-to-point links).
    Ok(local.or(address).map(|ip| (index, ip)))
}

fn prefix_len(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        nl::attr(&mut b, ty, payload);
        b
    }

    /// (type, flags, seq, payload) of one message, its length checked.
    fn split(bytes: &[u8]) -> (u16, u16, u32, Vec<u8>) {
        let mut messages = nl::messages(bytes);
        let m = messages.next().unwrap().unwrap();
        assert!(messages.next().is_none(), "one message");
        (m.ty, m.flags, m.seq, m.payload.to_vec())
    }

    #[test]
    fn a_new_dummy_link_is_named_with_its_kind_nested() {
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        let bytes = link_request(RTM_NEWLINK, flags, 7, "kube-ipvs0", Some("dummy"));
        let (ty, got_flags, seq, payload) = split(&bytes);
        assert_eq!((ty, got_flags, seq), (RTM_NEWLINK, 0x605, 7));
        let mut linkinfo = attr(IFLA_INFO_KIND, b"dummy");
        linkinfo = [((4 + linkinfo.len()) as u16).to_ne_bytes(), (IFLA_LINKINFO | nl::NLA_F_NESTED).to_ne_bytes()]
            .concat()
            .into_iter()
            .chain(linkinfo)
            .collect();
        assert_eq!(payload, [vec![0; IFINFOMSG_LEN], attr(IFLA_IFNAME, b"kube-ipvs0\0"), linkinfo].concat());
        // A lookup or delete names the link only.
        let (ty, _, _, payload) = split(&link_request(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, 8, "kube-ipvs0", None));
        assert_eq!((ty, payload), (RTM_DELLINK, [vec![0; IFINFOMSG_LEN], attr(IFLA_IFNAME, b"kube-ipvs0\0")].concat()));
    }

    #[test]
    fn host_addresses_are_32_and_128_and_ipv6_skips_dad() {
        let (ty, flags, _, payload) =
            split(&addr_request(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK, 1, 9, "10.96.0.10".parse().unwrap()));
        assert_eq!((ty, flags), (RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK));
        let v4 = [10, 96, 0, 10];
        assert_eq!(
            payload,
            [vec![AF_INET, 32, 0, 0, 9, 0, 0, 0], attr(IFA_LOCAL, &v4), attr(IFA_ADDRESS, &v4)].concat()
        );
        let ip6: Ipv6Addr = "fd00::10".parse().unwrap();
        let (_, _, _, payload) = split(&addr_request(RTM_DELADDR, NLM_F_REQUEST, 2, 9, IpAddr::V6(ip6)));
        assert_eq!(&payload[..4], [AF_INET6, 128, IFA_F_NODAD, 0]);
        assert_eq!(&payload[8..], [attr(IFA_LOCAL, &ip6.octets()), attr(IFA_ADDRESS, &ip6.octets())].concat());
        let (ty, flags, _, payload) = split(&addr_dump(3));
        assert_eq!((ty, flags, payload), (RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, vec![0u8; 8]));
    }

    fn link_answer(index: u32, kind: Option<&str>) -> Vec<u8> {
        let mut b = vec![0, 0, 1, 0];
        b.extend_from_slice(&index.to_ne_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend(attr(IFLA_IFNAME, b"kube-ipvs0\0"));
        if let Some(kind) = kind {
            let info = attr(IFLA_INFO_KIND, &nul_terminated(kind));
            b.extend(attr(IFLA_LINKINFO | nl::NLA_F_NESTED, &info));
        }
        b
    }

    fn addr_answer(family: u8, index: u32, address: &[u8], local: Option<&[u8]>) -> Vec<u8> {
        let mut b = vec![family, 32, 0x80, 0];
        b.extend_from_slice(&index.to_ne_bytes());
        b.extend(attr(IFA_ADDRESS, address));
        if let Some(local) = local {
            b.extend(attr(IFA_LOCAL, local));
        }
        b.extend(attr(3, b"kube-ipvs0\0")); // IFA_LABEL
        b
    }

    #[test]
    fn links_and_addresses_are_parsed() {
        assert_eq!(parse_link(&link_answer(12, Some("dummy"))).unwrap(), (12, "dummy".into()));
        assert_eq!(parse_link(&link_answer(3, None)).unwrap(), (3, String::new()));
        let v4 = addr_answer(AF_INET, 12, &[10, 0, 0, 2], Some(&[10, 96, 0, 10]));
        assert_eq!(parse_addr(&v4).unwrap(), Some((12, "10.96.0.10".parse().unwrap())), "IFA_LOCAL wins");
        let ip6: Ipv6Addr = "fd00::10".parse().unwrap();
        let v6 = addr_answer(AF_INET6, 12, &ip6.octets(), None);
        assert_eq!(parse_addr(&v6).unwrap(), Some((12, IpAddr::V6(ip6))));
        assert_eq!(parse_addr(&addr_answer(17, 12, &[1, 2], None)).unwrap(), None, "another family");
        assert!(parse_addr(&addr_answer(AF_INET, 12, &[10, 0, 0], None)).is_err(), "a 3-byte IPv4 address");
    }

    #[test]
    fn truncated_answers_are_errors_never_panics() {
        for whole in [link_answer(12, Some("dummy")), addr_answer(AF_INET6, 12, &[0; 16], None)] {
            for cut in 0..whole.len() {
                let _ = parse_link(&whole[..cut]);
                let _ = parse_addr(&whole[..cut]);
            }
            for at in 0..whole.len() {
                let mut bad = whole.clone();
                bad[at] ^= 0xff;
                let _ = parse_link(&bad);
                let _ = parse_addr(&bad);
            }
        }
        assert!(parse_link(&[0; 7]).is_err());
        assert!(parse_addr(&[0; 7]).is_err());
        // An attribute that claims more than the message holds.
        let mut bad = link_answer(12, Some("dummy"));
        bad[IFINFOMSG_LEN] = 0xff;
        assert!(parse_link(&bad).is_err());
    }
}
