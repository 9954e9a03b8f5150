//! eBPF mode's socket programs: a Service frontend is translated to one of its backends once per
//! socket, at `connect()` (and at `sendmsg()` for unconnected UDP), in the cgroup the programs
//! are attached to; `recvmsg()` and `getpeername()` put the frontend back where the application
//! would see the backend. The maps are laid out by `roadkeeper_rules::ebpf::maps` and written by
//! the loader; their wire types are `roadkeeper_ebpf_common`. The programs on the node's
//! interfaces, for external traffic, are [`interfaces`].
#![no_std]
#![no_main]

mod interfaces;

use aya_ebpf::bindings::bpf_sock_addr;
use aya_ebpf::helpers::generated::{
    bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_set_retval,
};
use aya_ebpf::macros::{cgroup_sock_addr, map};
use aya_ebpf::maps::{HashMap, LruHashMap};
use aya_ebpf::programs::SockAddrContext;
use roadkeeper_ebpf_common::{
    ANY_PORT, Address, AffinityKey, AffinityValue, Backend, FLAG_EMPTY_DROP, SCOPE_INTERNAL, ServiceKey, ServiceValue,
    SocketRevKey, sizes, v4_mapped,
};

/// Frontends' master entries and backend slots (sized by the loader: `--ebpf-map-services`).
#[map(name = "RK_SERVICES")]
static SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(65536, 0);

/// Backend identifiers (sized by the loader: `--ebpf-map-backends`).
#[map(name = "RK_BACKENDS")]
static BACKENDS: HashMap<u32, Backend> = HashMap::pinned(65536, 0);

/// Frontend identifiers -> frontend addresses.
#[map(name = "RK_REV_NAT")]
static REV_NAT: HashMap<u16, Address> = HashMap::pinned(65536, 0);

/// Session affinity: the backend a client namespace was sent to, and when.
#[map(name = "RK_AFFINITY")]
static AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(sizes::AFFINITY, 0);

/// Translated sockets: what `recvmsg()` / `getpeername()` put back.
#[map(name = "RK_SOCKET_REV")]
static SOCKET_REV: LruHashMap<SocketRevKey, Address> = LruHashMap::pinned(sizes::SOCKET_REV, 0);

/// Let the call go on.
const ALLOW: i32 = 1;
/// Fail the call (with the error set by `bpf_set_retval`).
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;
const EHOSTUNREACH: i32 = 113;
const NANOS: u64 = 1_000_000_000;

/// The destination an application gave, read from the context.
fn destination<const V6: bool>(ctx: &SockAddrContext) -> ([u8; 16], u16) {
    // SAFETY: the kernel hands a valid context; each field is read as the 4-byte word the
    // verifier allows.
    // Volatile, one field at a time, and V6 a constant: the verifier allows only loads at a
    // constant offset from the context pointer itself.
    let sa: *const bpf_sock_addr = ctx.sock_addr;
    let ip = if V6 {
        // SAFETY: as above.
        let w = unsafe {
            [
                core::ptr::read_volatile(&(*sa).user_ip6[0]),
                core::ptr::read_volatile(&(*sa).user_ip6[1]),
                core::ptr::read_volatile(&(*sa).user_ip6[2]),
                core::ptr::read_volatile(&(*sa).user_ip6[3]),
            ]
        };
        let mut ip = [0u8; 16];
        let mut i = 0;
        while i < 4 {
            let b = w[i].to_ne_bytes();
            ip[i * 4] = b[0];
            ip[i * 4 + 1] = b[1];
            ip[i * 4 + 2] = b[2];
            ip[i * 4 + 3] = b[3];
            i += 1;
        }
        ip
    } else {
        // SAFETY: as above.
        v4_mapped(unsafe { core::ptr::read_volatile(&(*sa).user_ip4) }.to_ne_bytes())
    };
    // SAFETY: as above.
    (ip, unsafe { core::ptr::read_volatile(&(*sa).user_port) } as u16)
}

/// Writes a destination back into the context (as the application will see it used).
fn set_destination<const V6: bool>(ctx: &SockAddrContext, to: &Address) {
    // SAFETY: as in `destination`; the fields written are the writable 4-byte words.
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    let ip = &to.ip;
    let word = |i: usize| u32::from_ne_bytes([ip[i], ip[i + 1], ip[i + 2], ip[i + 3]]);
    // SAFETY: as above.
    unsafe {
        if V6 {
            core::ptr::write_volatile(&mut (*sa).user_ip6[0], word(0));
            core::ptr::write_volatile(&mut (*sa).user_ip6[1], word(4));
            core::ptr::write_volatile(&mut (*sa).user_ip6[2], word(8));
            core::ptr::write_volatile(&mut (*sa).user_ip6[3], word(12));
        } else {
            core::ptr::write_volatile(&mut (*sa).user_ip4, word(12));
        }
        core::ptr::write_volatile(&mut (*sa).user_port, u32::from(to.port));
    }
}

/// The socket's protocol (`IPPROTO_*`).
fn protocol(ctx: &SockAddrContext) -> u8 {
    // SAFETY: as in `destination`.
    unsafe { core::ptr::read_volatile(&(*ctx.sock_addr).protocol) as u8 }
}

/// Fails the call with `errno`.
fn reject(errno: i32) -> i32 {
    // SAFETY: a helper of cgroup programs (kernel 5.18+), given a negative errno.
    unsafe { bpf_set_retval(-errno) };
    REJECT
}

/// Whether a client keeps the backend its affinity entry `held` names, for the frontend of
/// master entry `master` (at `key`): the entry is within the timeout and its slot, one of the
/// frontend's, still names that backend (a backend that left the slots loses its clients).
/// Socket and interface programs alike.
#[inline(always)]
fn still_held(held: &AffinityValue, key: &ServiceKey, master: &ServiceValue, now: u64) -> bool {
    let fresh = now.saturating_sub(held.last_used_ns) <= u64::from(master.affinity_timeout) * NANOS;
    let slot = ServiceKey { slot: held.slot, ..*key };
    fresh
        && held.slot >= 1
        && held.slot <= master.count
        // SAFETY: read by copy.
        && unsafe { SERVICES.get(slot) }.is_some_and(|v| v.backend_id == held.backend_id)
}

/// Translates a frontend to a backend (`connect()` / `sendmsg()`): the forward half of socket
/// load balancing. Anything that is not an internal-scope frontend is left alone.
fn translate<const V6: bool>(ctx: &SockAddrContext) -> i32 {
    let (ip, port) = destination::<V6>(ctx);
    // An IPv6 socket may reach an IPv4 frontend by its mapped address; an IPv4 one never has
    // an IPv6 destination.
    let mut key = ServiceKey { ip, port, protocol: protocol(ctx), scope: SCOPE_INTERNAL, slot: 0, pad: 0 };
    // SAFETY: map values are only read here, by copy.
    let Some(master) = (unsafe { SERVICES.get(key) }).copied() else {
        // Another port of a ClusterIP: refused.
        key.port = ANY_PORT;
        // SAFETY: read by pointer, for its presence.
        return if unsafe { SERVICES.get(key) }.is_some() { reject(ECONNREFUSED) } else { ALLOW };
    };
    if master.count == 0 {
        return reject(if master.flags & FLAG_EMPTY_DROP != 0 { EHOSTUNREACH } else { ECONNREFUSED });
    }
    // SAFETY: helpers of sock_addr programs.
    let (now, netns) = unsafe { (bpf_ktime_get_ns(), bpf_get_netns_cookie(ctx.sock_addr.cast())) };
    let affinity_key = AffinityKey { netns_cookie: netns, frontend_id: master.frontend_id, pad: [0; 3] };
    let chosen = if master.affinity_timeout > 0 {
        // SAFETY: read by copy.
        unsafe { AFFINITY.get(affinity_key) }
            .copied()
            .filter(|held| still_held(held, &key, &master, now))
            .map(|held| (held.backend_id, held.slot))
    } else {
        None
    };
    let (backend_id, slot) = match chosen {
        Some(found) => found,
        None => {
            // SAFETY: a helper of every program type.
            let random = unsafe { bpf_get_prandom_u32() };
            key.slot = 1 + (random % u32::from(master.count)) as u16;
            // SAFETY: read by copy.
            match unsafe { SERVICES.get(key) } {
                Some(value) => (value.backend_id, key.slot),
                // A slot the loader has not written yet cannot happen (slots before the master
                // entry that counts them); should it, the frontend is treated as empty.
                None => return reject(ECONNREFUSED),
            }
        }
    };
    // SAFETY: read by copy.
    let Some(backend) = (unsafe { BACKENDS.get(backend_id) }).copied() else { return reject(ECONNREFUSED) };
    if !V6 && !roadkeeper_ebpf_common::is_v4_mapped(&backend.ip) {
        return reject(EHOSTUNREACH);
    }
    if master.affinity_timeout > 0 {
        let value = AffinityValue { backend_id, slot, pad: 0, last_used_ns: now };
        let _ = AFFINITY.insert(affinity_key, value, 0);
    }
    // SAFETY: a helper of sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let frontend = Address { ip, port, pad: 0 };
    let _ = SOCKET_REV.insert(SocketRevKey { cookie, backend, pad: 0 }, frontend, 0);
    set_destination::<V6>(ctx, &backend);
    ALLOW
}

/// Puts a translated socket's frontend back (`recvmsg()` source, `getpeername()` peer): the
/// reverse half.
fn untranslate<const V6: bool>(ctx: &SockAddrContext) -> i32 {
    let (ip, port) = destination::<V6>(ctx);
    // SAFETY: a helper of sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let key = SocketRevKey { cookie, backend: Address { ip, port, pad: 0 }, pad: 0 };
    // SAFETY: read by copy.
    if let Some(frontend) = unsafe { SOCKET_REV.get(key) }.copied() {
        set_destination::<V6>(ctx, &frontend);
    }
    ALLOW
}

#[cgroup_sock_addr(connect4)]
pub fn rk_connect4(ctx: SockAddrContext) -> i32 {
    translate::<false>(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn rk_connect6(ctx: SockAddrContext) -> i32 {
    translate::<true>(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn rk_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate::<false>(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn rk_sendmsg6(ctx: SockAddrContext) -> i32 {
    translate::<true>(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn rk_recvmsg4(ctx: SockAddrContext) -> i32 {
    untranslate::<false>(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn rk_recvmsg6(ctx: SockAddrContext) -> i32 {
    untranslate::<true>(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn rk_getpeername4(ctx: SockAddrContext) -> i32 {
    untranslate::<false>(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn rk_getpeername6(ctx: SockAddrContext) -> i32 {
    untranslate::<true>(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The programs' license: GPL-compatible, as the helpers they call require.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
