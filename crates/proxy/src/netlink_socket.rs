//! The raw netlink socket of every kernel client: `NETLINK_NETFILTER` for nf_tables
//! ([`crate::nft::netlink`]) and ctnetlink ([`crate::conntrack`]), `NETLINK_GENERIC` for IPVS
//! ([`crate::ipvs::kernel`]), `NETLINK_ROUTE` for `kube-ipvs0` ([`crate::ipvs::dummy`]); and the
//! message framing they share: the nlmsghdr, the nfgenmsg or genlmsghdr header after it (an
//! rtnetlink client writes its own), TLV attributes, and a bounded parser of answers. Each
//! protocol's messages, and how it reads the answers, stay in its own module.
//!
//! Numbers are copied from `linux/netlink.h`, `linux/netfilter/nfnetlink.h` and
//! `linux/genetlink.h` under their C names.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub(crate) const NETLINK_ROUTE: i32 = 0;
pub(crate) const NETLINK_NETFILTER: i32 = 12;
pub(crate) const NETLINK_GENERIC: i32 = 16;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLM_F_REQUEST: u16 = 1;
pub(crate) const NLM_F_ACK: u16 = 4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLA_F_NESTED: u16 = 0x8000;
pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLA_HDRLEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NFNETLINK_V0: u8 = 0;

// ---- framing (pure) -------------------------------------------------------------------------

/// Starts a message with its nlmsghdr only (the protocol's own header follows); returns its
/// offset for [`end_msg`].
pub(crate) fn begin_nlmsg(b: &mut Vec<u8>, ty: u16, flags: u16, seq: u32) -> usize {
    let start = b.len();
    b.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, patched by end_msg
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel
    start
}

/// Starts a netfilter message with its nlmsghdr and nfgenmsg; returns its offset for
/// [`end_msg`].
pub(crate) fn begin_msg(b: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
    let start = begin_nlmsg(b, ty, flags, seq);
    b.push(family);
    b.push(NFNETLINK_V0);
    b.extend_from_slice(&res_id.to_be_bytes());
    start
}

/// Starts a generic-netlink message of family `family_id` with its nlmsghdr and genlmsghdr
/// (`cmd`, `version`); returns its offset for [`end_msg`].
pub(crate) fn begin_genl(b: &mut Vec<u8>, family_id: u16, flags: u16, seq: u32, cmd: u8, version: u8) -> usize {
    let start = begin_nlmsg(b, family_id, flags, seq);
    b.extend_from_slice(&[cmd, version, 0, 0]);
    start
}

/// Pads the message begun at `start` to 4 bytes and fills in its length.
pub(crate) fn end_msg(b: &mut Vec<u8>, start: usize) {
    pad(b);
    let len = (b.len() - start) as u32;
    b[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// Appends one attribute (header, payload, padding to 4 bytes).
pub(crate) fn attr(b: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    b.extend_from_slice(&((NLA_HDRLEN + payload.len()) as u16).to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(payload);
    pad(b);
}

/// Starts a nested attribute `ty`; returns its offset for [`end_nest`].
pub(crate) fn begin_nest(b: &mut Vec<u8>, ty: u16) -> usize {
    let start = b.len();
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    start
}

/// Fills in the length of the nested attribute begun at `start`.
pub(crate) fn end_nest(b: &mut [u8], start: usize) {
    let len = (b.len() - start) as u16;
    b[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn pad(b: &mut Vec<u8>) {
    b.resize(b.len().next_multiple_of(4), 0);
}

// ---- answers (pure, bounded) ----------------------------------------------------------------

/// Bytes of a generic-netlink header (genlmsghdr) after the nlmsghdr.
pub(crate) const GENL_HDRLEN: usize = 4;

/// Netlink bytes that do not parse: a length that overruns its buffer or is shorter than a
/// header. Parsing stops there (never reads past the buffer, never loops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One netlink message of a datagram: its header fields and payload (after the nlmsghdr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// The messages of one datagram, in order; a malformed one is the last item.
pub(crate) fn messages(mut b: &[u8]) -> impl Iterator<Item = Result<Message<'_>, Malformed>> {
    std::iter::from_fn(move || {
        if b.is_empty() {
            return None;
        }
        let whole = b.len();
        let len = b.get(..4).map_or(0, |h| u32::from_ne_bytes(h.try_into().expect("4 bytes")) as usize);
        if b.len() < NLMSG_HDRLEN || len < NLMSG_HDRLEN || len > b.len() {
            b = &[];
            return Some(Err(Malformed(format!("netlink message of length {len} in {whole} bytes"))));
        }
        let message = Message {
            ty: u16::from_ne_bytes([b[4], b[5]]),
            flags: u16::from_ne_bytes([b[6], b[7]]),
            seq: u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes")),
            payload: &b[NLMSG_HDRLEN..len],
        };
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some(Ok(message))
    })
}

/// The attributes (type without the nested/byte-order flags, payload) of a run of attributes;
/// a malformed one is the last item.
pub(crate) fn attributes(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), Malformed>> {
    std::iter::from_fn(move || {
        if b.is_empty() {
            return None;
        }
        let len = if b.len() < NLA_HDRLEN { 0 } else { usize::from(u16::from_ne_bytes([b[0], b[1]])) };
        if len < NLA_HDRLEN || len > b.len() {
            let whole = b.len();
            b = &[];
            return Some(Err(Malformed(format!("attribute of length {len} in {whole} bytes"))));
        }
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        let payload = &b[NLA_HDRLEN..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some(Ok((ty, payload)))
    })
}

/// The errno (positive; 0 for an ack) of an `NLMSG_ERROR` or `NLMSG_DONE` payload.
pub(crate) fn errno_of(payload: &[u8]) -> Result<i32, Malformed> {
    let code = payload.get(..4).ok_or_else(|| Malformed(format!("error code in {} bytes", payload.len())))?;
    Ok(-i32::from_ne_bytes(code.try_into().expect("4 bytes")))
}

// ---- the socket (thin) ----------------------------------------------------------------------

/// A failed socket call: which one (`socket`, `bind`, `send`, `poll`, `recv`) and why.
#[derive(Debug)]
pub(crate) struct SocketError {
    /// The call that failed.
    pub call: &'static str,
    /// The OS error (or what was wrong with the result).
    pub err: io::Error,
}

impl SocketError {
    fn last(call: &'static str) -> SocketError {
        SocketError { call, err: io::Error::last_os_error() }
    }
}

impl fmt::Display for SocketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.call, self.err)
    }
}

/// A netlink socket of one protocol (`NETLINK_NETFILTER`, `NETLINK_GENERIC`, `NETLINK_ROUTE`) in
/// the calling thread's network namespace, bound to a port id the kernel picks, talking to the
/// kernel.
#[derive(Debug)]
pub(crate) struct NetlinkSocket(OwnedFd);

impl NetlinkSocket {
    /// Opens and binds a socket of `protocol`.
    pub(crate) fn open(protocol: i32) -> Result<NetlinkSocket, SocketError> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if fd < 0 {
            return Err(SocketError::last("socket"));
        }
        // SAFETY: fd is a freshly created descriptor that nothing else owns.
        let socket = NetlinkSocket(unsafe { OwnedFd::from_raw_fd(fd) });
        let addr = kernel_addr();
        // SAFETY: valid fd and sockaddr_nl of the given length.
        let rc = unsafe {
            libc::bind(fd, (&addr as *const libc::sockaddr_nl).cast(), std::mem::size_of::<libc::sockaddr_nl>() as u32)
        };
        if rc < 0 {
            return Err(SocketError::last("bind"));
        }
        Ok(socket)
    }

    /// Sets an integer socket option; false when the kernel refused it.
    pub(crate) fn set_int_opt(&self, level: i32, name: i32, value: i32) -> bool {
        // SAFETY: `value` outlives the call and the length matches its type.
        unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                level,
                name,
                (&value as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            ) == 0
        }
    }

    /// Sends one datagram to the kernel (retrying on EINTR); a short write is an error.
    pub(crate) fn send(&self, data: &[u8]) -> Result<(), SocketError> {
        self.send_parts(&[data])
    }

    /// Sends `parts`, in order, as one datagram (one iovec each, at most `UIO_MAXIOV`); a short
    /// write is an error.
    pub(crate) fn send_parts(&self, parts: &[&[u8]]) -> Result<(), SocketError> {
        let mut addr = kernel_addr();
        let mut iov: Vec<libc::iovec> =
            parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr().cast_mut().cast(), iov_len: p.len() }).collect();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        // SAFETY: a zeroed msghdr is valid; its pointers are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut addr as *mut libc::sockaddr_nl).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        loop {
            // SAFETY: msg points at addr and at iovecs over `parts`, all alive for the call; the
            // kernel only reads them.
            let n = unsafe { libc::sendmsg(self.0.as_raw_fd(), &msg, 0) };
            if n >= 0 {
                if n as usize != len {
                    let err = io::Error::other(format!("short write ({n} of {len} bytes)"));
                    return Err(SocketError { call: "send", err });
                }
                return Ok(());
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return Err(SocketError::last("send"));
            }
        }
    }

    /// Receives one datagram into `buf`, waiting at most `timeout_ms`; `None` when nothing came.
    /// The length returned is the datagram's own (`MSG_TRUNC`): more than `buf.len()` when it did
    /// not fit.
    pub(crate) fn recv(&self, buf: &mut [u8], timeout_ms: i32) -> Result<Option<usize>, SocketError> {
        let mut pfd = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        loop {
            // SAFETY: pfd is one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if rc < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(SocketError::last("poll"));
            }
            if rc == 0 {
                return Ok(None);
            }
            // SAFETY: buf is valid for writes of its length.
            let n = unsafe {
                libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_TRUNC)
            };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => continue,
                _ => return Err(SocketError { call: "recv", err }),
            }
        }
    }
}

/// The kernel's address (port id 0); bound, it lets the kernel pick ours.
fn kernel_addr() -> libc::sockaddr_nl {
    // SAFETY: a zeroed sockaddr_nl is valid.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr
}
