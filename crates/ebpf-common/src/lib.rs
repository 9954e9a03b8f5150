//! The wire layout of eBPF mode's maps: keys and values as `#[repr(C)]` structs that the BPF
//! programs (`crates/ebpf-programs`, built for `bpfel-unknown-none`) and the loader
//! (`roadkeeper_proxy::ebpf`) share, so that both sides read the same bytes.
//!
//! Addresses are 16 bytes in network order; an IPv4 address is IPv4-mapped (`::ffff:a.b.c.d`),
//! so that an IPv6 socket connecting to a mapped IPv4 ClusterIP finds the IPv4 frontend as it is.
//! Ports are kept as the kernel hands them to the programs: in network byte order.
#![no_std]
#![deny(unsafe_code)]

/// Map names, as the loader finds them in the object and pins them.
pub mod names {
    /// Frontend master entries and backend slots ([`super::ServiceKey`] -> [`super::ServiceValue`]).
    pub const SERVICES: &str = "RK_SERVICES";
    /// Backend identifier -> [`super::Backend`].
    pub const BACKENDS: &str = "RK_BACKENDS";
    /// Frontend identifier -> its address ([`super::Address`]).
    pub const REV_NAT: &str = "RK_REV_NAT";
    /// Session affinity (LRU): [`super::AffinityKey`] -> [`super::AffinityValue`].
    pub const AFFINITY: &str = "RK_AFFINITY";
    /// Reverse translation of sockets (LRU): [`super::SocketRevKey`] -> [`super::Address`].
    pub const SOCKET_REV: &str = "RK_SOCKET_REV";
}

/// Program names (the functions of `crates/ebpf-programs`), with their cgroup attach types.
pub const SOCKET_PROGRAMS: [&str; 8] = [
    "rk_connect4",
    "rk_connect6",
    "rk_sendmsg4",
    "rk_sendmsg6",
    "rk_recvmsg4",
    "rk_recvmsg6",
    "rk_getpeername4",
    "rk_getpeername6",
];

/// Default sizes of the LRU maps the programs fill themselves.
pub mod sizes {
    /// Session affinity entries (client network namespace x frontend).
    pub const AFFINITY: u32 = 65536;
    /// Translated sockets remembered for `recvmsg` / `getpeername`.
    pub const SOCKET_REV: u32 = 262144;
}

/// Lookup scope: translated by the socket programs (traffic that starts on the node).
pub const SCOPE_INTERNAL: u8 = 0;
/// Lookup scope: translated by the programs on the node's interfaces (traffic from outside).
pub const SCOPE_EXTERNAL: u8 = 1;

/// [`ServiceValue::flags`]: balance by the Maglev table instead of at random.
pub const FLAG_MAGLEV: u8 = 1;
/// [`ServiceValue::flags`]: without a backend, drop (the traffic policy is Local and the node
/// has none) instead of refusing.
pub const FLAG_EMPTY_DROP: u8 = 2;
/// [`ServiceValue::flags`]: the frontend has source ranges.
pub const FLAG_SOURCE_RANGES: u8 = 4;
/// [`ServiceValue::flags`]: translated traffic is masqueraded.
pub const FLAG_MASQUERADE: u8 = 8;

/// An address and port: 16 bytes of address (IPv4-mapped for IPv4) and the port in network
/// byte order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Address {
    /// The address, network order.
    pub ip: [u8; 16],
    /// The port, network byte order.
    pub port: u16,
    /// Padding (zero).
    pub pad: u16,
}

/// The 12 bytes that start an IPv4-mapped IPv6 address.
pub const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// `ip` as 16 bytes, IPv4-mapped.
pub const fn v4_mapped(ip: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3]]
}

/// Whether 16 address bytes are an IPv4-mapped address.
pub fn is_v4_mapped(ip: &[u8; 16]) -> bool {
    ip[..12] == V4_MAPPED_PREFIX
}

/// A `services` key: a frontend (address, port, protocol, scope) and a slot (0: master entry).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceKey {
    /// The frontend's address, network order, IPv4-mapped for IPv4.
    pub ip: [u8; 16],
    /// The frontend's port, network byte order.
    pub port: u16,
    /// `IPPROTO_TCP`, `IPPROTO_UDP` or `IPPROTO_SCTP`.
    pub protocol: u8,
    /// [`SCOPE_INTERNAL`] or [`SCOPE_EXTERNAL`].
    pub scope: u8,
    /// 0 for the master entry, `1..=count` for a backend.
    pub slot: u16,
    /// Padding (zero).
    pub pad: u16,
}

/// A `services` value: the master entry's fields (slot 0) or a backend slot's identifier.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceValue {
    /// A slot's backend identifier (0 in the master entry).
    pub backend_id: u32,
    /// The master entry's session affinity timeout in seconds (0: none).
    pub affinity_timeout: u32,
    /// The master entry's number of backend slots.
    pub count: u16,
    /// The frontend's identifier (both kinds of entry).
    pub frontend_id: u16,
    /// `FLAG_*` bits of the master entry.
    pub flags: u8,
    /// Padding (zero).
    pub pad: [u8; 3],
}

/// A `backends` value: where a backend identifier translates to.
pub type Backend = Address;

/// A session affinity key: the client (its network namespace: one per pod, and the host's) and
/// the frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    /// `bpf_get_netns_cookie` of the connecting socket.
    pub netns_cookie: u64,
    /// The frontend's identifier.
    pub frontend_id: u16,
    /// Padding (zero).
    pub pad: [u16; 3],
}

/// A session affinity value: the backend the client was sent to, and when.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AffinityValue {
    /// The backend's identifier.
    pub backend_id: u32,
    /// Its slot, checked on reuse: a backend that left the frontend's slots loses its clients.
    pub slot: u16,
    /// Padding (zero).
    pub pad: u16,
    /// `bpf_ktime_get_ns` of the last connection.
    pub last_used_ns: u64,
}

/// A translated socket: its cookie and the backend it was sent to; the value is the frontend
/// (what `recvmsg` and `getpeername` put back).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SocketRevKey {
    /// `bpf_get_socket_cookie` of the socket.
    pub cookie: u64,
    /// The backend's address and port.
    pub backend: Address,
    /// Padding (zero).
    pub pad: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (of each impl): `#[repr(C)]`, `Copy`, only integer fields and byte arrays, with
    // every padding byte an explicit field, so any bit pattern is a valid value.
    #[allow(unsafe_code)]
    mod impls {
        use crate::{Address, AffinityKey, AffinityValue, ServiceKey, ServiceValue, SocketRevKey};
        unsafe impl aya::Pod for Address {}
        unsafe impl aya::Pod for ServiceKey {}
        unsafe impl aya::Pod for ServiceValue {}
        unsafe impl aya::Pod for AffinityKey {}
        unsafe impl aya::Pod for AffinityValue {}
        unsafe impl aya::Pod for SocketRevKey {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// The sizes the BPF side compiles in: a change here must be a change on both sides.
    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<Address>(), 20);
        assert_eq!(size_of::<ServiceKey>(), 24);
        assert_eq!(size_of::<ServiceValue>(), 16);
        assert_eq!(size_of::<AffinityKey>(), 16);
        assert_eq!(size_of::<AffinityValue>(), 16);
        assert_eq!(size_of::<SocketRevKey>(), 32);
    }

    #[test]
    fn ipv4_addresses_are_mapped() {
        let ip = v4_mapped([10, 96, 0, 10]);
        assert!(is_v4_mapped(&ip));
        assert_eq!(&ip[12..], &[10, 96, 0, 10]);
        assert!(!is_v4_mapped(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
    }
}
