//! The planner's map entries ([`roadkeeper_rules::ebpf`]) as the bytes the BPF programs read
//! ([`roadkeeper_ebpf_common`]), and back: what the loader writes, and what it reads back to
//! adopt after a restart. Pure: unit-tested without a kernel.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;
use roadkeeper_ebpf_common::{
    Address, FLAG_EMPTY_DROP, FLAG_MAGLEV, FLAG_MASQUERADE, FLAG_SOURCE_RANGES, FLOW_REPLY, FlowKey, FlowValue,
    SCOPE_EXTERNAL, SCOPE_INTERNAL, ServiceKey, ServiceValue, SourceRangeKey,
};
use roadkeeper_rules::conntrack::{Flow, Tuple, proto_number};
use roadkeeper_rules::ebpf::{Empty, FrontendId, FrontendKey, Master, Scope, Selection, SlotKey, SlotValue};
use roadkeeper_rules::table::Protocol;

/// An address and port as the maps hold it.
pub fn address(ip: IpAddr, port: u16) -> Address {
    let ip = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    Address { ip: ip.octets(), port: port.to_be(), pad: 0 }
}

/// The address and port a map entry holds.
pub fn socket_addr(address: &Address) -> SocketAddr {
    let ip = Ipv6Addr::from(address.ip);
    let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
    SocketAddr::new(ip, u16::from_be(address.port))
}

/// The `services` key of a slot.
pub fn service_key(key: &SlotKey) -> ServiceKey {
    let frontend = &key.frontend;
    let Address { ip, port, .. } = address(frontend.address, frontend.port);
    let scope = match frontend.scope {
        Scope::Internal => SCOPE_INTERNAL,
        Scope::External => SCOPE_EXTERNAL,
    };
    ServiceKey { ip, port, protocol: proto_number(frontend.protocol), scope, slot: key.slot, pad: 0 }
}

/// The `services` value of a slot.
pub fn service_value(value: &SlotValue) -> ServiceValue {
    match value {
        SlotValue::Backend(id) => ServiceValue { backend_id: *id, ..ServiceValue::default() },
        SlotValue::Master(master) => {
            let flag = |on: bool, bit: u8| if on { bit } else { 0 };
            ServiceValue {
                backend_id: 0,
                affinity_timeout: master.affinity,
                count: master.count,
                frontend_id: master.id,
                flags: flag(master.selection == Selection::Maglev, FLAG_MAGLEV)
                    | flag(master.empty == Empty::Drop, FLAG_EMPTY_DROP)
                    | flag(master.source_ranges, FLAG_SOURCE_RANGES)
                    | flag(master.masquerade, FLAG_MASQUERADE),
                pad: [0; 3],
            }
        }
    }
}

/// A `services` entry read back from the kernel, or `None` for one that is not ours to
/// understand (an unknown protocol or scope: left for the sweep to delete).
pub fn slot(key: &ServiceKey, value: &ServiceValue) -> Option<(SlotKey, SlotValue)> {
    let protocol =
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp].into_iter().find(|p| proto_number(*p) == key.protocol)?;
    let scope = match key.scope {
        SCOPE_INTERNAL => Scope::Internal,
        SCOPE_EXTERNAL => Scope::External,
        _ => return None,
    };
    let at = socket_addr(&Address { ip: key.ip, port: key.port, pad: 0 });
    let frontend = FrontendKey { address: at.ip(), port: at.port(), protocol, scope };
    let slot_value = if key.slot == 0 {
        let has = |bit: u8| value.flags & bit != 0;
        SlotValue::Master(Master {
            id: value.frontend_id,
            count: value.count,
            selection: if has(FLAG_MAGLEV) { Selection::Maglev } else { Selection::Random },
            empty: if has(FLAG_EMPTY_DROP) { Empty::Drop } else { Empty::Reject },
            affinity: value.affinity_timeout,
            source_ranges: has(FLAG_SOURCE_RANGES),
            masquerade: has(FLAG_MASQUERADE),
        })
    } else {
        SlotValue::Backend(value.backend_id)
    };
    Some((SlotKey { frontend, slot: key.slot }, slot_value))
}

/// The LPM trie key of frontend `id`'s source range `net`: 32 bits of identifier and padding,
/// then the range's bits (an IPv4 range IPv4-mapped: 96 more).
pub fn source_range_key(id: FrontendId, net: &IpNet) -> (u32, SourceRangeKey) {
    let (ip, bits) = match net {
        IpNet::V4(v4) => (v4.network().to_ipv6_mapped().octets(), 96 + u32::from(v4.prefix_len())),
        IpNet::V6(v6) => (v6.network().octets(), u32::from(v6.prefix_len())),
    };
    (32 + bits, SourceRangeKey { frontend_id: id.to_be_bytes(), pad: [0; 2], ip })
}

/// A source range read back, or `None` for a key that is not ours to understand.
pub fn source_range(bits: u32, data: &SourceRangeKey) -> Option<(FrontendId, IpNet)> {
    let ip = Ipv6Addr::from(data.ip);
    let bits = u8::try_from(bits.checked_sub(32)?).ok()?;
    let net = match ip.to_ipv4_mapped() {
        Some(v4) if bits >= 96 => IpNet::V4(ipnet::Ipv4Net::new(v4, bits - 96).ok()?),
        _ => IpNet::V6(ipnet::Ipv6Net::new(ip, bits).ok()?),
    };
    Some((u16::from_be_bytes(data.frontend_id), net))
}

/// A forward flow of the interface programs as conntrack would show it: the client's tuple to
/// the frontend, and the reply from the backend it was translated to.
pub fn flow(key: &FlowKey, value: &FlowValue) -> Flow {
    let (client, frontend, backend) = (socket_addr(&key.source), socket_addr(&key.destination), socket_addr(&value.to));
    let tuple = |from: SocketAddr, to: SocketAddr| Tuple {
        src: from.ip(),
        dst: to.ip(),
        protocol: key.protocol,
        src_port: from.port(),
        dst_port: to.port(),
    };
    Flow { orig: tuple(client, frontend), reply: tuple(backend, client), zone: 0, id: None }
}

/// The reply entry the programs record beside a forward flow: from its backend to its client.
pub fn reply_key(forward: &FlowKey, value: &FlowValue) -> FlowKey {
    FlowKey { source: value.to, destination: forward.source, direction: FLOW_REPLY, ..*forward }
}

#[cfg(test)]
mod tests {
    use roadkeeper_ebpf_common::FLOW_FORWARD;

    use super::*;

    #[test]
    fn a_forward_flow_reads_as_conntrack_would_show_it_and_names_its_reply() {
        let (client, frontend, backend): (SocketAddr, SocketAddr, SocketAddr) = (
            "198.51.100.9:20053".parse().unwrap(),
            "192.168.77.2:30053".parse().unwrap(),
            "10.244.0.5:8080".parse().unwrap(),
        );
        let key = FlowKey {
            source: address(client.ip(), client.port()),
            destination: address(frontend.ip(), frontend.port()),
            protocol: 17,
            direction: FLOW_FORWARD,
            pad: 0,
        };
        let value = FlowValue { to: address(backend.ip(), backend.port()), backend_id: 4, mark: 0 };
        let flow = flow(&key, &value);
        assert_eq!(
            (flow.orig.src, flow.orig.src_port, flow.orig.dst, flow.orig.dst_port),
            (client.ip(), 20053, frontend.ip(), 30053)
        );
        assert_eq!((flow.reply.src, flow.reply.src_port, flow.reply.dst), (backend.ip(), 8080, client.ip()));
        assert_eq!(flow.orig.protocol, 17);
        let reply = reply_key(&key, &value);
        assert_eq!((socket_addr(&reply.source), socket_addr(&reply.destination)), (backend, client));
        assert_eq!((reply.direction, reply.protocol), (FLOW_REPLY, 17));
    }

    #[test]
    fn source_ranges_read_back_as_they_were_written() {
        for net in ["198.51.100.0/24", "0.0.0.0/0", "2001:db8::/32", "203.0.113.7/32"] {
            let net: IpNet = net.parse().unwrap();
            let (bits, key) = source_range_key(9, &net);
            assert_eq!(source_range(bits, &key), Some((9, net)));
        }
        assert_eq!(source_range_key(1, &"10.0.0.0/8".parse().unwrap()).0, 32 + 96 + 8);
        assert_eq!(source_range(16, &SourceRangeKey::default()), None, "shorter than the identifier");
    }

    fn frontend(address: &str, scope: Scope) -> FrontendKey {
        FrontendKey { address: address.parse().unwrap(), port: 53, protocol: Protocol::Udp, scope }
    }

    #[test]
    fn addresses_are_mapped_and_ports_in_network_order() {
        let a = address("10.96.0.10".parse().unwrap(), 80);
        assert_eq!(&a.ip[10..], &[0xff, 0xff, 10, 96, 0, 10]);
        assert_eq!(a.port.to_ne_bytes(), [0, 80]);
        for at in ["10.96.0.10:80", "[fd00:96::10]:443"] {
            let at: SocketAddr = at.parse().unwrap();
            assert_eq!(socket_addr(&address(at.ip(), at.port())), at);
        }
    }

    #[test]
    fn slots_read_back_as_they_were_written() {
        let master = Master {
            id: 7,
            count: 3,
            selection: Selection::Maglev,
            empty: Empty::Drop,
            affinity: 10800,
            source_ranges: true,
            masquerade: false,
        };
        for (key, value) in [
            (SlotKey { frontend: frontend("10.96.0.53", Scope::Internal), slot: 0 }, SlotValue::Master(master)),
            (SlotKey { frontend: frontend("fd00:96::53", Scope::External), slot: 2 }, SlotValue::Backend(41)),
        ] {
            let (k, v) = (service_key(&key), service_value(&value));
            assert_eq!(slot(&k, &v), Some((key, value)));
        }
    }

    #[test]
    fn entries_that_are_not_ours_are_not_understood() {
        let key = service_key(&SlotKey { frontend: frontend("10.96.0.53", Scope::Internal), slot: 1 });
        assert_eq!(slot(&ServiceKey { protocol: 1, ..key }, &ServiceValue::default()), None);
        assert_eq!(slot(&ServiceKey { scope: 9, ..key }, &ServiceValue::default()), None);
    }
}
