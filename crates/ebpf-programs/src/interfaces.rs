//! eBPF mode's programs on the node's interfaces (tc ingress and egress): external traffic to a
//! NodePort, externalIP or LoadBalancer IP is translated to a backend on its way in (Maglev or
//! random, session affinity, source ranges, drop or reject without a backend) and its replies back to the
//! frontend on their way out. Masquerading and rejecting are asked of the node's fixed netfilter
//! table (`roadkeeper-ebpf`) with `skb->mark` bits.
// Keys passed by reference: a copy is stack, and the verifier allows 512 bytes per call chain.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::bindings::{BPF_F_MARK_MANGLED_0, BPF_F_NO_PREALLOC, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT};
use aya_ebpf::cty::c_long;
use aya_ebpf::helpers::generated::{bpf_csum_diff, bpf_get_prandom_u32, bpf_ktime_get_ns};
use aya_ebpf::macros::{classifier, map};
use aya_ebpf::maps::lpm_trie::Key;
use aya_ebpf::maps::{HashMap, LpmTrie, LruHashMap};
use aya_ebpf::programs::TcContext;
use roadkeeper_ebpf_common::{
    ANY_PORT, Address, AffinityValue, ExternalAffinityKey, FLAG_EMPTY_DROP, FLAG_MAGLEV, FLAG_MASQUERADE, FLAG_SOURCE_RANGES, FLOW_FORWARD, FLOW_REPLY,
    FlowKey, FlowValue, MAGLEV_CHUNK, MARK_MASQUERADE, MARK_REJECT, MaglevChunk, MaglevKey, SCOPE_EXTERNAL,
    SCOPE_INTERNAL, ServiceKey, ServiceValue, SourceRangeKey, is_v4_mapped, sizes, v4_mapped,
};

use crate::{BACKENDS, SERVICES, still_held};

/// Maglev tables, in chunks (written by the loader; only written chunks take memory).
#[map(name = "RK_MAGLEV")]
static MAGLEV: HashMap<MaglevKey, MaglevChunk> = HashMap::pinned(sizes::MAGLEV_CHUNKS, BPF_F_NO_PREALLOC);

/// `loadBalancerSourceRanges` of the frontends that have them.
#[map(name = "RK_SOURCE_RANGES")]
static SOURCE_RANGES: LpmTrie<SourceRangeKey, u8> = LpmTrie::pinned(sizes::SOURCE_RANGES, 0);

/// Translated flows: forward (client -> frontend: the backend) and reply (backend -> client:
/// the frontend) entries.
#[map(name = "RK_FLOWS")]
static FLOWS: LruHashMap<FlowKey, FlowValue> = LruHashMap::pinned(sizes::FLOWS, 0);

/// Session affinity of external traffic: the backend a client address was sent to, and when.
#[map(name = "RK_AFFINITY_EXT")]
static AFFINITY_EXT: LruHashMap<ExternalAffinityKey, AffinityValue> = LruHashMap::pinned(sizes::AFFINITY, 0);

/// Slots of every Maglev table (`--bpf-lb-maglev-table-size`), set by the loader.
#[unsafe(no_mangle)]
static RK_MAGLEV_SIZE: u32 = 16381;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// A TCP or UDP packet's addresses, as the maps hold them (IPv4 mapped, ports network order).
struct Packet {
    v6: bool,
    /// Offset of the TCP or UDP header.
    l4: usize,
    protocol: u8,
    source: Address,
    destination: Address,
}

impl Packet {
    /// The packet's addresses, or `None` for anything but unfragmented TCP and UDP over IPv4 and
    /// IPv6 without extension headers (which pass untouched).
    #[inline(never)]
    fn parse(ctx: &TcContext) -> Option<Packet> {
        let ethertype = u16::from_be(ctx.load::<u16>(12).ok()?);
        let (v6, l4, protocol, source, destination) = if ethertype == ETH_P_IP {
            let version_ihl = ctx.load::<u8>(ETH_HLEN).ok()?;
            let ihl = usize::from(version_ihl & 0x0f) * 4;
            let fragment = u16::from_be(ctx.load::<u16>(ETH_HLEN + 6).ok()?);
            if version_ihl >> 4 != 4 || ihl < 20 || fragment & 0x3fff != 0 {
                return None;
            }
            let protocol = ctx.load::<u8>(ETH_HLEN + 9).ok()?;
            let source = v4_mapped(ctx.load::<[u8; 4]>(ETH_HLEN + 12).ok()?);
            let destination = v4_mapped(ctx.load::<[u8; 4]>(ETH_HLEN + 16).ok()?);
            (false, ETH_HLEN + ihl, protocol, source, destination)
        } else if ethertype == ETH_P_IPV6 {
            let protocol = ctx.load::<u8>(ETH_HLEN + 6).ok()?;
            let source = ctx.load::<[u8; 16]>(ETH_HLEN + 8).ok()?;
            let destination = ctx.load::<[u8; 16]>(ETH_HLEN + 24).ok()?;
            (true, ETH_HLEN + 40, protocol, source, destination)
        } else {
            return None;
        };
        if protocol != IPPROTO_TCP && protocol != IPPROTO_UDP {
            return None;
        }
        let (source_port, destination_port) = (ctx.load::<u16>(l4).ok()?, ctx.load::<u16>(l4 + 2).ok()?);
        Some(Packet {
            v6,
            l4,
            protocol,
            source: Address { ip: source, port: source_port, pad: 0 },
            destination: Address { ip: destination, port: destination_port, pad: 0 },
        })
    }

    /// The flow key of this packet in `direction`.
    fn flow(&self, direction: u8) -> FlowKey {
        FlowKey { source: self.source, destination: self.destination, protocol: self.protocol, direction, pad: 0 }
    }

    /// A hash of the 5-tuple, the same on every node (Maglev's flow hash).
    fn hash(&self) -> u32 {
        let mut hash: u32 = 0x811c_9dc5;
        let mut mix = |word: u32| {
            hash ^= word;
            hash = hash.wrapping_mul(0x0100_0193);
            hash ^= hash >> 15;
        };
        let mut i = 0;
        while i < 16 {
            mix(u32::from_ne_bytes([
                self.source.ip[i],
                self.source.ip[i + 1],
                self.source.ip[i + 2],
                self.source.ip[i + 3],
            ]));
            mix(u32::from_ne_bytes([
                self.destination.ip[i],
                self.destination.ip[i + 1],
                self.destination.ip[i + 2],
                self.destination.ip[i + 3],
            ]));
            i += 4;
        }
        mix((u32::from(self.source.port) << 16) | u32::from(self.destination.port));
        mix(u32::from(self.protocol));
        hash
    }

    /// Rewrites the destination (`destination`) or the source to `to`, with the checksums.
    #[inline(never)]
    fn rewrite(&self, ctx: &TcContext, to: &Address, destination: bool) -> Result<(), c_long> {
        let (old, port_at) = if destination { (&self.destination, self.l4 + 2) } else { (&self.source, self.l4) };
        let checksum_at = self.l4 + if self.protocol == IPPROTO_TCP { 16 } else { 6 };
        // A UDP datagram over IPv4 without a checksum keeps none.
        let mangled = if self.protocol == IPPROTO_UDP && !self.v6 { u64::from(BPF_F_MARK_MANGLED_0) } else { 0 };
        ctx.l4_csum_replace(checksum_at, u64::from(old.port), u64::from(to.port), 2 | mangled)?;
        ctx.store(port_at, &to.port, 0)?;
        if self.v6 {
            let ip_at = ETH_HLEN + if destination { 24 } else { 8 };
            let (mut from, mut into) = (old.ip, to.ip);
            // SAFETY: both buffers are 16 bytes on the stack, as the sizes say.
            let diff = unsafe { bpf_csum_diff(from.as_mut_ptr().cast(), 16, into.as_mut_ptr().cast(), 16, 0) };
            ctx.l4_csum_replace(checksum_at, 0, diff as u64, u64::from(BPF_F_PSEUDO_HDR) | mangled)?;
            ctx.store(ip_at, &to.ip, 0)?;
        } else {
            let ip_at = ETH_HLEN + if destination { 16 } else { 12 };
            let word = |ip: &[u8; 16]| u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]);
            let (from, into) = (u64::from(word(&old.ip)), u64::from(word(&to.ip)));
            ctx.l4_csum_replace(checksum_at, from, into, u64::from(BPF_F_PSEUDO_HDR) | 4 | mangled)?;
            ctx.l3_csum_replace(ETH_HLEN + 10, from, into, 4)?;
            ctx.store(ip_at, &[to.ip[12], to.ip[13], to.ip[14], to.ip[15]], 0)?;
        }
        Ok(())
    }
}

/// Whether `source` is in one of frontend `id`'s source ranges.
fn admitted(id: u16, source: &[u8; 16]) -> bool {
    let key = Key::new(32 + 128, SourceRangeKey { frontend_id: id.to_be_bytes(), pad: [0; 2], ip: *source });
    SOURCE_RANGES.get(key).is_some()
}

/// The backend identifier in slot `hash % size` of frontend `id`'s Maglev table.
fn maglev(id: u16, hash: u32) -> Option<u32> {
    // SAFETY: a global the loader sets before loading, read as it is.
    let size = unsafe { core::ptr::read_volatile(&RK_MAGLEV_SIZE) };
    if size == 0 {
        return None;
    }
    let slot = hash % size;
    let key = MaglevKey { frontend_id: id, chunk: (slot / MAGLEV_CHUNK as u32) as u16 };
    // SAFETY: read by copy of one element, its index masked below the chunk's length.
    let chunk = unsafe { MAGLEV.get(key) }?;
    Some(chunk[(slot as usize) & (MAGLEV_CHUNK - 1)])
}

/// What becomes of a packet on its way in.
enum Verdict {
    /// Untouched (not to an external frontend, or to be rejected by the netfilter table).
    Pass,
    /// Dropped (a source outside the ranges; a Local policy without a local endpoint).
    Drop,
    /// A new flow, translated to the backend (its identifier) with these mark bits.
    New(Address, u32, u32),
    /// A new flow to a frontend with session affinity (its master entry's key and value): its
    /// backend is the client's ([`affine`], called from the top level for the verifier's stack
    /// limit).
    Affine(ServiceKey, ServiceValue),
}

/// External traffic on its way in: a new flow to an external frontend is sent to a backend
/// chosen now (a flow that has one keeps it: [`held`]). (Out of line, as are the flow's record and the rewrite
/// beside it: the verifier counts the stacks of a call chain together, 512 bytes at most.)
#[inline(never)]
fn from_outside(ctx: &TcContext, packet: &Packet) -> Verdict {
    let mut key = ServiceKey {
        ip: packet.destination.ip,
        port: packet.destination.port,
        protocol: packet.protocol,
        scope: SCOPE_EXTERNAL,
        slot: 0,
        pad: 0,
    };
    // SAFETY: map values are only read here, by copy.
    let master = match unsafe { SERVICES.get(&key) }.copied() {
        Some(master) => master,
        None => {
            // A ClusterIP reached from outside (a router that sends the Service CIDR here): its
            // socket entry, masqueraded where upstream masquerades off-cluster traffic (the
            // entry's flag); another port of it is refused.
            key.scope = SCOPE_INTERNAL;
            // SAFETY: as above.
            match unsafe { SERVICES.get(&key) }.copied() {
                Some(master) if master.flags & FLAG_MAGLEV == 0 => master,
                _ => {
                    key.port = ANY_PORT;
                    // SAFETY: read by pointer, for its presence.
                    if unsafe { SERVICES.get(&key) }.is_some() {
                        ctx.set_mark(MARK_REJECT);
                    }
                    return Verdict::Pass;
                }
            }
        }
    };
    if master.flags & FLAG_SOURCE_RANGES != 0 && !admitted(master.frontend_id, &packet.source.ip) {
        return Verdict::Drop;
    }
    if master.count == 0 {
        if master.flags & FLAG_EMPTY_DROP != 0 {
            return Verdict::Drop;
        }
        ctx.set_mark(MARK_REJECT);
        return Verdict::Pass;
    }
    if master.affinity_timeout > 0 {
        return Verdict::Affine(key, master);
    }
    let backend_id = if master.flags & FLAG_MAGLEV != 0 {
        maglev(master.frontend_id, packet.hash())
    } else {
        // SAFETY: a helper of every program type.
        let slot = 1 + (unsafe { bpf_get_prandom_u32() } % u32::from(master.count)) as u16;
        let mut slot_key = key;
        slot_key.slot = slot;
        // SAFETY: read by copy.
        unsafe { SERVICES.get(&slot_key) }.map(|value| value.backend_id)
    };
    // A table or slot the loader has not written yet cannot happen (they come before the master
    // entry); should it, the packet passes untranslated.
    let Some(backend_id) = backend_id else { return Verdict::Pass };
    translated(packet, &master, backend_id)
}

/// A new flow to backend `backend_id` of the frontend `master` heads.
#[inline(always)]
fn translated(packet: &Packet, master: &ServiceValue, backend_id: u32) -> Verdict {
    // SAFETY: read by copy.
    let Some(backend) = unsafe { BACKENDS.get(backend_id) }.copied() else { return Verdict::Pass };
    if packet.v6 == is_v4_mapped(&backend.ip) {
        return Verdict::Drop;
    }
    let mark = if master.flags & FLAG_MASQUERADE != 0 { MARK_MASQUERADE } else { 0 };
    Verdict::New(backend, backend_id, mark)
}

/// `sessionAffinity: ClientIP`: the backend a client address keeps (per node, as in the other
/// modes): the one it was last sent to within the timeout while that slot still names it, else
/// one at random, remembered. (It takes precedence over Maglev, as in Cilium.)
#[inline(never)]
fn affine(key: &ServiceKey, master: &ServiceValue, client: &[u8; 16]) -> Option<u32> {
    // SAFETY: a helper of every program type.
    let now = unsafe { bpf_ktime_get_ns() };
    let affinity_key = ExternalAffinityKey { frontend_id: master.frontend_id, pad: 0, ip: *client };
    // SAFETY: read by copy.
    let chosen = unsafe { AFFINITY_EXT.get(&affinity_key) }
        .copied()
        .filter(|held| still_held(held, key, master, now))
        .map(|held| (held.backend_id, held.slot));
    let (backend_id, slot) = match chosen {
        Some(found) => found,
        None => {
            let mut slot_key = *key;
            // SAFETY: a helper of every program type.
            // (A checked remainder: a panic path would leave the program without an exit.)
            slot_key.slot = 1 + unsafe { bpf_get_prandom_u32() }.checked_rem(u32::from(master.count))? as u16;
            // SAFETY: read by copy.
            (unsafe { SERVICES.get(&slot_key) }?.backend_id, slot_key.slot)
        }
    };
    let _ = AFFINITY_EXT.insert(&affinity_key, &AffinityValue { backend_id, slot, pad: 0, last_used_ns: now }, 0);
    Some(backend_id)
}

/// The backend (and mark bits) of the packet's flow, while that backend is still there.
#[inline(never)]
fn held(packet: &Packet) -> Option<(Address, u32)> {
    // SAFETY: read by pointer, then by copy.
    let held = unsafe { FLOWS.get(&packet.flow(FLOW_FORWARD)) }?;
    // SAFETY: as above.
    unsafe { BACKENDS.get(held.backend_id) }.is_some_and(|now| *now == held.to).then_some((held.to, held.mark))
}

/// Records a new flow: its forward packets' backend, and its replies' frontend.
#[inline(never)]
fn remember(packet: &Packet, backend: &Address, backend_id: u32, mark: u32) {
    let _ = FLOWS.insert(&packet.flow(FLOW_FORWARD), &FlowValue { to: *backend, backend_id, mark }, 0);
    let mut reply = packet.flow(FLOW_REPLY);
    (reply.source, reply.destination) = (*backend, packet.source);
    let _ = FLOWS.insert(&reply, &FlowValue { to: packet.destination, backend_id, mark }, 0);
}

#[classifier]
pub fn rk_from_outside(ctx: TcContext) -> i32 {
    let Some(packet) = Packet::parse(&ctx) else { return TC_ACT_OK };
    let (to, mark) = match held(&packet) {
        Some(held) => held,
        None => {
            let verdict = match from_outside(&ctx, &packet) {
                Verdict::Affine(key, master) => match affine(&key, &master, &packet.source.ip) {
                    Some(backend_id) => translated(&packet, &master, backend_id),
                    None => Verdict::Pass,
                },
                verdict => verdict,
            };
            match verdict {
                Verdict::New(to, backend_id, mark) => {
                    remember(&packet, &to, backend_id, mark);
                    (to, mark)
                }
                Verdict::Drop => return TC_ACT_SHOT,
                Verdict::Pass | Verdict::Affine(..) => return TC_ACT_OK,
            }
        }
    };
    if mark != 0 {
        ctx.set_mark(mark);
    }
    // A packet that cannot be rewritten is dropped: it would go on half-translated.
    if packet.rewrite(&ctx, &to, true).is_ok() { TC_ACT_OK } else { TC_ACT_SHOT }
}

/// External traffic on its way out: a backend's reply to a translated flow's client leaves
/// from the frontend.
#[classifier]
pub fn rk_to_outside(ctx: TcContext) -> i32 {
    let Some(packet) = Packet::parse(&ctx) else { return TC_ACT_OK };
    // SAFETY: read by copy.
    let Some(flow) = (unsafe { FLOWS.get(&packet.flow(FLOW_REPLY)) }).copied() else { return TC_ACT_OK };
    if packet.rewrite(&ctx, &flow.to, false).is_ok() { TC_ACT_OK } else { TC_ACT_SHOT }
}
