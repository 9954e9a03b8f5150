//! Connected UDP sockets that eBPF mode's socket programs sent to an endpoint that no longer
//! serves their frontend, destroyed over sock_diag (`SOCK_DESTROY`, the kernel's `udp_abort`):
//! the application's next call fails with ECONNABORTED and a new socket is translated anew,
//! where it would otherwise send into the void. The other modes delete the conntrack entry of
//! such a flow; here the socket itself holds the endpoint.
//!
//! Which sockets: only those whose cookie `RK_SOCKET_REV` records with that endpoint (the caller
//! computes the cookies), so a socket connected to a pod's address directly is never touched.
//! Where: every network namespace of a process below the node's cgroup (`--cgroup-root`: its
//! pods and host processes) and every `ip netns` one (`/run/netns`, where CNI plugins and the
//! tests name pods' namespaces); cookies are unique on the machine, so a namespace of another
//! node holds none of ours.
//!
//! sock_diag by hand, over this crate's netlink framing ([`crate::netlink_socket`]), as its
//! other netlink clients: no well-kept crate sends `SOCK_DESTROY`. Numbers from
//! `linux/sock_diag.h` and `linux/inet_diag.h`.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::netlink_socket::{self as nl, Malformed, NetlinkSocket};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
/// A connected UDP socket's state (`TCP_ESTABLISHED`).
const ESTABLISHED: u32 = 1;
const IPPROTO_UDP: u8 = 17;
/// `struct inet_diag_sockid`: ports, addresses, interface, cookie.
const SOCKID_LEN: usize = 48;
/// Where the cookie sits in it (two native-order u32, low half first).
const COOKIE_AT: usize = 40;
/// `struct inet_diag_msg`: family, state, timer, retransmits, the id, then five u32.
const DIAG_MSG_LEN: usize = 4 + SOCKID_LEN + 20;
/// Most namespaces one cleanup visits, and most sockets one dump returns.
const MAX_NAMESPACES: usize = 4096;
const MAX_SOCKETS: usize = 1 << 20;
/// Most cgroups and processes read while looking for namespaces.
const MAX_CGROUPS: usize = 65536;
const MAX_PIDS: usize = 1 << 20;
const RECV_TIMEOUT_MS: i32 = 5000;
const RECV_BUF_LEN: usize = 64 * 1024;

static SEQ: AtomicU32 = AtomicU32::new(1);

// ---- messages (pure) ------------------------------------------------------------------------

/// A socket of a dump: its family and id, as the kernel gave them (a destroy request names it
/// with the same id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiagSocket {
    /// `AF_INET` or `AF_INET6`.
    pub(crate) family: u8,
    /// `struct inet_diag_sockid`, bytes as the kernel wrote them.
    pub(crate) id: [u8; SOCKID_LEN],
}

impl DiagSocket {
    /// The socket's cookie (what `bpf_get_socket_cookie` gives).
    pub(crate) fn cookie(&self) -> u64 {
        let half = |at: usize| u64::from(u32::from_ne_bytes(self.id[at..at + 4].try_into().expect("4 bytes")));
        half(COOKIE_AT) | half(COOKIE_AT + 4) << 32
    }
}

/// A sock_diag request for UDP sockets of `family` in the connected state: a dump
/// (`SOCK_DIAG_BY_FAMILY`, id zero) or the destruction of the socket `id` names.
pub(crate) fn request(ty: u16, flags: u16, seq: u32, family: u8, id: &[u8; SOCKID_LEN]) -> Vec<u8> {
    let mut b = Vec::with_capacity(nl::NLMSG_HDRLEN + 8 + SOCKID_LEN);
    let start = nl::begin_nlmsg(&mut b, ty, flags, seq);
    b.extend_from_slice(&[family, IPPROTO_UDP, 0, 0]);
    b.extend_from_slice(&(1u32 << ESTABLISHED).to_ne_bytes());
    b.extend_from_slice(id);
    nl::end_msg(&mut b, start);
    b
}

/// The socket of one dump message (its attributes, if any, are not read).
pub(crate) fn parse(payload: &[u8]) -> Result<DiagSocket, Malformed> {
    let msg = payload
        .get(..DIAG_MSG_LEN)
        .ok_or_else(|| Malformed(format!("inet_diag_msg of {} bytes, not {DIAG_MSG_LEN}", payload.len())))?;
    let family = msg[0];
    if ![libc::AF_INET as u8, libc::AF_INET6 as u8].contains(&family) {
        return Err(Malformed(format!("inet_diag_msg of family {family}")));
    }
    Ok(DiagSocket { family, id: msg[4..4 + SOCKID_LEN].try_into().expect("the id's length") })
}

/// What one datagram of a dump holds: its sockets, and whether it ends the dump (an error code
/// for a failed one).
pub(crate) fn dump_part(datagram: &[u8], seq: u32) -> Result<(Vec<DiagSocket>, Option<i32>), Malformed> {
    let mut sockets = Vec::new();
    for message in nl::messages(datagram) {
        let message = message?;
        if message.seq != seq {
            continue;
        }
        match message.ty {
            nl::NLMSG_DONE | nl::NLMSG_ERROR => return Ok((sockets, Some(nl::errno_of(message.payload)?))),
            SOCK_DIAG_BY_FAMILY => sockets.push(parse(message.payload)?),
            _ => {}
        }
    }
    Ok((sockets, None))
}

/// Every parser of this module on any bytes, for the fuzz target `sock_diag_answers`: no panic.
#[cfg(any(test, feature = "fuzzing"))]
pub fn parse_all(data: &[u8]) {
    let _ = parse(data);
    let _ = dump_part(data, 1).map(|(sockets, _)| sockets.iter().map(DiagSocket::cookie).fold(0, u64::wrapping_add));
}

// ---- the kernel (thin) ----------------------------------------------------------------------

/// A failure in one namespace: logged, and the others are still visited.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {why}")]
struct Failed {
    what: &'static str,
    why: String,
}

/// Destroys the connected UDP sockets whose cookie is in `stale`, in every namespace of a
/// process below `cgroup` and every `ip netns` one; the number destroyed. A namespace that fails
/// (gone meanwhile, a kernel without `CONFIG_INET_DIAG_DESTROY`) is logged and skipped.
pub fn destroy(cgroup: &Path, stale: &HashSet<u64>) -> u64 {
    if stale.is_empty() {
        return 0;
    }
    let mut destroyed = 0;
    for namespace in namespaces(cgroup) {
        let outcome = std::thread::scope(|scope| scope.spawn(|| destroy_in(&namespace, stale)).join());
        match outcome {
            Ok(Ok(n)) => destroyed += n,
            Ok(Err(err)) => tracing::warn!(namespace = %namespace.display(), "stale UDP sockets: {err}"),
            Err(_) => tracing::warn!(namespace = %namespace.display(), "stale UDP sockets: the thread panicked"),
        }
    }
    destroyed
}

/// In a thread of its own: enters `namespace` and destroys the stale sockets there.
fn destroy_in(namespace: &Path, stale: &HashSet<u64>) -> Result<u64, Failed> {
    let file = File::open(namespace).map_err(|err| Failed { what: "open", why: err.to_string() })?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|err| Failed { what: "setns", why: err.to_string() })?;
    let socket =
        NetlinkSocket::open(NETLINK_SOCK_DIAG).map_err(|err| Failed { what: "sock_diag", why: err.to_string() })?;
    let mut destroyed = 0;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        for found in dump(&socket, family)?.into_iter().filter(|s| stale.contains(&s.cookie())) {
            destroyed += u64::from(destroy_one(&socket, &found)?);
        }
    }
    Ok(destroyed)
}

/// One datagram from the kernel.
fn receive<'b>(socket: &NetlinkSocket, buf: &'b mut [u8]) -> Result<&'b [u8], Failed> {
    let failed = |why: String| Failed { what: "recv", why };
    match socket.recv(buf, RECV_TIMEOUT_MS).map_err(|err| failed(err.to_string()))? {
        Some(n) if n > buf.len() => Err(failed(format!("datagram of {n} bytes truncated"))),
        Some(n) => Ok(&buf[..n]),
        None => Err(failed("no answer from the kernel".into())),
    }
}

/// The connected UDP sockets of `family` in the calling thread's namespace.
fn dump(socket: &NetlinkSocket, family: u8) -> Result<Vec<DiagSocket>, Failed> {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let flags = nl::NLM_F_REQUEST | nl::NLM_F_DUMP;
    socket
        .send(&request(SOCK_DIAG_BY_FAMILY, flags, seq, family, &[0; SOCKID_LEN]))
        .map_err(|err| Failed { what: "send", why: err.to_string() })?;
    let mut buf = vec![0u8; RECV_BUF_LEN];
    let mut sockets = Vec::new();
    loop {
        let datagram = receive(socket, &mut buf)?;
        let (found, end) = dump_part(datagram, seq).map_err(|err| Failed { what: "dump", why: err.to_string() })?;
        sockets.extend(found);
        match end {
            Some(0) => return Ok(sockets),
            Some(errno) => {
                return Err(Failed { what: "dump", why: std::io::Error::from_raw_os_error(errno).to_string() });
            }
            None if sockets.len() > MAX_SOCKETS => {
                return Err(Failed { what: "dump", why: format!("more than {MAX_SOCKETS} sockets") });
            }
            None => {}
        }
    }
}

/// Destroys one socket; false when it was gone already.
fn destroy_one(socket: &NetlinkSocket, found: &DiagSocket) -> Result<bool, Failed> {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let flags = nl::NLM_F_REQUEST | nl::NLM_F_ACK;
    socket
        .send(&request(SOCK_DESTROY, flags, seq, found.family, &found.id))
        .map_err(|err| Failed { what: "send", why: err.to_string() })?;
    let mut buf = vec![0u8; 4096];
    loop {
        let datagram = receive(socket, &mut buf)?;
        let (_, end) = dump_part(datagram, seq).map_err(|err| Failed { what: "destroy", why: err.to_string() })?;
        match end {
            Some(0) => return Ok(true),
            Some(libc::ENOENT) => return Ok(false),
            Some(errno) => {
                let why = std::io::Error::from_raw_os_error(errno).to_string();
                return Err(Failed { what: "SOCK_DESTROY", why });
            }
            None => {}
        }
    }
}

/// One namespace file per network namespace (by its inode) of the processes below `cgroup` and
/// of `/run/netns`, bounded.
fn namespaces(cgroup: &Path) -> Vec<PathBuf> {
    let mut seen = BTreeSet::new();
    let mut files = Vec::new();
    let named = fs::read_dir("/run/netns").into_iter().flatten().flatten().map(|entry| entry.path());
    let of_processes = pids_below(cgroup).into_iter().map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net")));
    for file in named.chain(of_processes) {
        if files.len() >= MAX_NAMESPACES {
            tracing::warn!("stale UDP sockets: more than {MAX_NAMESPACES} network namespaces, the rest left");
            break;
        }
        if let Ok(meta) = fs::metadata(&file)
            && seen.insert((meta.dev(), meta.ino()))
        {
            files.push(file);
        }
    }
    files
}

/// The processes (and threads: a threaded cgroup lists no process) below `cgroup`, bounded.
fn pids_below(cgroup: &Path) -> BTreeSet<u32> {
    let mut pids = BTreeSet::new();
    let mut pending = VecDeque::from([cgroup.to_path_buf()]);
    let mut visited = 0;
    while let Some(dir) = pending.pop_front() {
        visited += 1;
        if visited > MAX_CGROUPS || pids.len() > MAX_PIDS {
            break;
        }
        for list in ["cgroup.procs", "cgroup.threads"] {
            let text = fs::read_to_string(dir.join(list)).unwrap_or_default();
            pids.extend(text.lines().filter_map(|line| line.trim().parse::<u32>().ok()));
        }
        let children = fs::read_dir(&dir).into_iter().flatten().flatten();
        pending.extend(children.filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump message as the kernel writes it: nlmsghdr, inet_diag_msg (and no attributes).
    fn answer(seq: u32, family: u8, cookie: u64) -> Vec<u8> {
        let mut b = Vec::new();
        let start = nl::begin_nlmsg(&mut b, SOCK_DIAG_BY_FAMILY, 2, seq);
        let mut msg = [0u8; DIAG_MSG_LEN];
        msg[0] = family;
        msg[1] = ESTABLISHED as u8;
        msg[4 + COOKIE_AT..4 + COOKIE_AT + 4].copy_from_slice(&(cookie as u32).to_ne_bytes());
        msg[4 + COOKIE_AT + 4..4 + COOKIE_AT + 8].copy_from_slice(&((cookie >> 32) as u32).to_ne_bytes());
        b.extend_from_slice(&msg);
        nl::end_msg(&mut b, start);
        b
    }

    #[test]
    fn a_dump_gives_each_sockets_cookie_and_ends_at_done() {
        let mut datagram = answer(7, libc::AF_INET as u8, 0x1234_5678_9abc_def0);
        datagram.extend(answer(6, libc::AF_INET as u8, 1));
        datagram.extend(answer(7, libc::AF_INET6 as u8, 42));
        let (sockets, end) = dump_part(&datagram, 7).unwrap();
        let cookies: Vec<u64> = sockets.iter().map(DiagSocket::cookie).collect();
        assert_eq!((cookies, end), (vec![0x1234_5678_9abc_def0, 42], None), "another request's answer is skipped");
        let mut done = Vec::new();
        let start = nl::begin_nlmsg(&mut done, nl::NLMSG_DONE, 2, 7);
        done.extend_from_slice(&0i32.to_ne_bytes());
        nl::end_msg(&mut done, start);
        assert_eq!(dump_part(&done, 7).unwrap(), (Vec::new(), Some(0)));
    }

    #[test]
    fn a_destroy_request_names_the_socket_by_the_id_the_dump_gave() {
        let found = parse(&answer(1, libc::AF_INET6 as u8, 99)[nl::NLMSG_HDRLEN..]).unwrap();
        let request = request(SOCK_DESTROY, nl::NLM_F_REQUEST | nl::NLM_F_ACK, 5, found.family, &found.id);
        let message = nl::messages(&request).next().unwrap().unwrap();
        assert_eq!((message.ty, message.seq, message.payload.len()), (SOCK_DESTROY, 5, 8 + SOCKID_LEN));
        assert_eq!(&message.payload[..2], &[libc::AF_INET6 as u8, IPPROTO_UDP]);
        assert_eq!(u32::from_ne_bytes(message.payload[4..8].try_into().unwrap()), 1 << ESTABLISHED);
        assert_eq!(&message.payload[8..], &found.id[..]);
    }

    #[test]
    fn short_or_foreign_messages_are_refused_and_nothing_panics() {
        assert!(parse(&[2; 10]).is_err());
        let mut msg = answer(1, 99, 5);
        assert!(dump_part(&msg, 1).is_err(), "family 99");
        msg.truncate(30);
        assert!(dump_part(&msg, 1).is_err());
        for len in 0..80 {
            parse_all(&answer(3, libc::AF_INET as u8, 7)[..len]);
        }
    }
}
