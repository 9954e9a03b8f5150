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
    /// Session affinity of external traffic (LRU): [`super::ExternalAffinityKey`] ->
    /// [`super::AffinityValue`].
    pub const AFFINITY_EXTERNAL: &str = "RK_AFFINITY_EXT";
    /// Reverse translation of sockets (LRU): [`super::SocketRevKey`] -> [`super::Address`].
    pub const SOCKET_REV: &str = "RK_SOCKET_REV";
    /// Maglev tables in chunks: [`super::MaglevKey`] -> [`super::MaglevChunk`].
    pub const MAGLEV: &str = "RK_MAGLEV";
    /// Source ranges (LPM trie): [`super::SourceRangeKey`] with its prefix length -> 1.
    pub const SOURCE_RANGES: &str = "RK_SOURCE_RANGES";
    /// Translated flows of external traffic (LRU): [`super::FlowKey`] -> [`super::FlowValue`].
    pub const FLOWS: &str = "RK_FLOWS";
    /// The Maglev table size the programs read (a global set at load).
    pub const MAGLEV_SIZE: &str = "RK_MAGLEV_SIZE";
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

/// The programs on the node's interfaces (tc): external traffic's translation on the way in
/// (`ingress`) and its reverse on the way out (`egress`).
pub const INTERFACE_PROGRAMS: [&str; 2] = ["rk_from_outside", "rk_to_outside"];

/// Default sizes of the LRU maps the programs fill themselves.
pub mod sizes {
    /// Session affinity entries (client network namespace x frontend; and client address x
    /// frontend for external traffic).
    pub const AFFINITY: u32 = 65536;
    /// Translated sockets remembered for `recvmsg` / `getpeername`.
    pub const SOCKET_REV: u32 = 262144;
    /// Translated flows of external traffic (each flow has two entries).
    pub const FLOWS: u32 = 262144;
    /// Maglev table chunks (no memory is taken for chunks not written).
    pub const MAGLEV_CHUNKS: u32 = 65536;
    /// Source ranges, as compiled (the loader sizes the map as the planner's limit says).
    pub const SOURCE_RANGES: u32 = 16384;
}

/// `skb->mark` bit the interface programs set on traffic to masquerade (a fixed netfilter rule
/// of the node's table `roadkeeper-ebpf` does it: kube-proxy's default masquerade bit).
pub const MARK_MASQUERADE: u32 = 1 << 14;
/// `skb->mark` bit set on traffic to a frontend without endpoints: the same table rejects it.
pub const MARK_REJECT: u32 = 1 << 15;

/// The port of a ClusterIP's catch-all entries (one per protocol, internal scope, no backends):
/// a connection to a port no Service port serves there is refused.
pub const ANY_PORT: u16 = 0;

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

/// A session affinity key of external traffic: the client's address and the frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExternalAffinityKey {
    /// The frontend's identifier.
    pub frontend_id: u16,
    /// Padding (zero).
    pub pad: u16,
    /// The client's address.
    pub ip: [u8; 16],
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

/// Backend identifiers in one chunk of a Maglev table.
pub const MAGLEV_CHUNK: usize = 1024;

/// A chunk of a Maglev table: slots `chunk * MAGLEV_CHUNK ..`, unused slots 0.
pub type MaglevChunk = [u32; MAGLEV_CHUNK];

/// A `maglev` key: a frontend's identifier and a chunk of its table (a table of the largest size,
/// 65521 slots, is 64 chunks: one map value each, so that the map's values stay small).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MaglevKey {
    /// The frontend's identifier.
    pub frontend_id: u16,
    /// The chunk's index.
    pub chunk: u16,
}

/// A `source_ranges` key (the LPM trie's data): a frontend's identifier and an address; its
/// prefix length counts 32 bits of identifier and padding, then the address's (an IPv4 range
/// is IPv4-mapped: 96 more).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SourceRangeKey {
    /// The frontend's identifier, big-endian (the trie matches bytes from the first).
    pub frontend_id: [u8; 2],
    /// Padding (zero).
    pub pad: [u8; 2],
    /// The range's address (IPv4-mapped for IPv4).
    pub ip: [u8; 16],
}

/// [`FlowKey::direction`]: a packet from the client to the frontend.
pub const FLOW_FORWARD: u8 = 0;
/// [`FlowKey::direction`]: a reply from the backend to the client.
pub const FLOW_REPLY: u8 = 1;

/// A translated flow of external traffic, as a packet shows it: on the way in, client to
/// frontend; on the way out, backend to client.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// The packet's source.
    pub source: Address,
    /// The packet's destination.
    pub destination: Address,
    /// `IPPROTO_*`.
    pub protocol: u8,
    /// [`FLOW_FORWARD`] or [`FLOW_REPLY`].
    pub direction: u8,
    /// Padding (zero).
    pub pad: u16,
}

/// What a flow is translated to: the backend (forward) or the frontend (reply).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowValue {
    /// The address and port the packet is rewritten to.
    pub to: Address,
    /// The backend's identifier (forward: a flow whose backend left is balanced anew).
    pub backend_id: u32,
    /// `skb->mark` bits the flow's forward packets carry ([`MARK_MASQUERADE`]).
    pub mark: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (of each impl): `#[repr(C)]`, `Copy`, only integer fields and byte arrays, with
    // every padding byte an explicit field, so any bit pattern is a valid value.
    #[allow(unsafe_code)]
    mod impls {
        use crate::{
            Address, AffinityKey, AffinityValue, FlowKey, FlowValue, MaglevKey, ServiceKey, ServiceValue, SocketRevKey,
            SourceRangeKey,
        };
        unsafe impl aya::Pod for Address {}
        unsafe impl aya::Pod for ServiceKey {}
        unsafe impl aya::Pod for ServiceValue {}
        unsafe impl aya::Pod for AffinityKey {}
        unsafe impl aya::Pod for AffinityValue {}
        unsafe impl aya::Pod for SocketRevKey {}
        unsafe impl aya::Pod for MaglevKey {}
        unsafe impl aya::Pod for SourceRangeKey {}
        unsafe impl aya::Pod for FlowKey {}
        unsafe impl aya::Pod for FlowValue {}
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
        assert_eq!(size_of::<ExternalAffinityKey>(), 20);
        assert_eq!(size_of::<SocketRevKey>(), 32);
        assert_eq!(size_of::<MaglevKey>(), 4);
        assert_eq!(size_of::<SourceRangeKey>(), 20);
        assert_eq!(size_of::<FlowKey>(), 44);
        assert_eq!(size_of::<FlowValue>(), 28);
    }

    #[test]
    fn ipv4_addresses_are_mapped() {
        let ip = v4_mapped([10, 96, 0, 10]);
        assert!(is_v4_mapped(&ip));
        assert_eq!(&ip[12..], &[10, 96, 0, 10]);
        assert!(!is_v4_mapped(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
    }
}
