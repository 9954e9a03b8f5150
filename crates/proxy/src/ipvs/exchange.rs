//! Requests and their answers over the generic-netlink (IPVS) and rtnetlink (`kube-ipvs0`)
//! sockets of IPVS mode, and its typed errors. The reading of answers is pure (`Acks`,
//! `Dump`: bounded, a malformed answer is an error); `Conn` is the thin socket part.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::netlink_socket::{self as nl, Malformed, NLMSG_DONE, NLMSG_ERROR, NetlinkSocket, SocketError};

/// `NLM_F_DUMP_INTR`: the dumped objects changed while the dump ran.
const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NETLINK_CAP_ACK`: error answers echo only the request's header.
const NETLINK_CAP_ACK: i32 = 10;
/// How long the kernel may take to answer (it answers IPVS and rtnetlink requests within the
/// send; the bound only ends a wait that would otherwise never end).
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);
/// One receive: room for the largest dump part the kernel sends (its parts are at most 32 KiB).
const RECV_BUF_LEN: usize = 64 * 1024;
/// The socket's receive buffer: the acks of one datagram of requests ([`MAX_BATCH_MESSAGES`]
/// small skbs) fit.
const RCVBUF: i32 = 4 * 1024 * 1024;
/// At most this many requests in one datagram.
pub(crate) const MAX_BATCH_MESSAGES: usize = 1024;
/// At most this many bytes of requests in one datagram.
pub(crate) const MAX_BATCH_BYTES: usize = 256 * 1024;
/// At most this many objects in one dump (far more than any node holds).
const MAX_DUMP_MESSAGES: usize = 1 << 20;
/// A dump the kernel interrupted (its objects changed meanwhile) is retried this many times.
const DUMP_TRIES: usize = 3;

/// Why IPVS mode could not program or read the kernel.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    /// The kernel has no `IPVS` generic-netlink family.
    #[error(
        "IPVS is not available in this kernel (no generic netlink family \"IPVS\": the ip_vs module is \
         neither loaded nor built in); --proxy-mode nftables and iptables work without it"
    )]
    Unavailable,
    /// The kernel refused a request (`what` names it and its objects).
    #[error("{what}: {}", errno_text(*errno))]
    Refused {
        /// The request and its objects.
        what: String,
        /// The errno (positive).
        errno: i32,
    },
    /// A socket call failed (`what`: the request it served).
    #[error("{what}: netlink {call}: {error}")]
    Socket {
        /// The request.
        what: String,
        /// The call (`socket`, `bind`, `send`, `poll`, `recv`).
        call: &'static str,
        /// The OS error (in the message, so not a source as well: printed once).
        error: io::Error,
    },
    /// The kernel's answer did not parse.
    #[error("{what}: malformed answer from the kernel: {why}")]
    Malformed {
        /// The request.
        what: String,
        /// What was wrong.
        why: String,
    },
    /// The kernel did not answer in time.
    #[error("{what}: no answer from the kernel within {}s", ANSWER_DEADLINE.as_secs())]
    NoAnswer {
        /// The request.
        what: String,
    },
    /// `kube-ipvs0` (or the name given) exists but is not a dummy interface.
    #[error("interface {name} exists but is a {kind:?} link, not a dummy: IPVS mode will not take it over")]
    NotDummy {
        /// The interface.
        name: String,
        /// Its link kind (empty for a physical device).
        kind: String,
    },
}

/// `File exists (EEXIST)`: the errno's text and C name.
pub(crate) fn errno_text(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    let text = text.rfind(" (os error ").map_or(text.as_str(), |i| &text[..i]).to_string();
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EAGAIN => "EAGAIN",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ENOBUFS => "ENOBUFS",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ERANGE => "ERANGE",
        _ => return format!("{text} (errno {errno})"),
    };
    format!("{text} ({name})")
}

// ---- answers (pure) -------------------------------------------------------------------------

/// The acks of a datagram of acknowledged requests with sequence numbers `first..first + count`.
#[derive(Debug)]
pub(crate) struct Acks {
    first: u32,
    count: usize,
    /// Errno (0: done) by request index.
    errnos: BTreeMap<usize, i32>,
}

impl Acks {
    pub(crate) fn new(first: u32, count: usize) -> Acks {
        Acks { first, count, errnos: BTreeMap::new() }
    }

    /// Reads the answers of one received datagram (answers to other sequence numbers, and
    /// non-error messages such as a GET's reply, are skipped).
    pub(crate) fn feed(&mut self, datagram: &[u8]) -> Result<(), Malformed> {
        for message in nl::messages(datagram) {
            let message = message?;
            let index = message.seq.wrapping_sub(self.first) as usize;
            if message.ty == NLMSG_ERROR && index < self.count {
                self.errnos.insert(index, nl::errno_of(message.payload)?);
            }
        }
        Ok(())
    }

    /// True once every request is answered.
    pub(crate) fn complete(&self) -> bool {
        self.errnos.len() == self.count
    }

    /// The errno of each request, in order (only when [`complete`](Self::complete)).
    pub(crate) fn errnos(self) -> Vec<i32> {
        self.errnos.into_values().collect()
    }
}

/// What one request (a dump, or a GET/NEW answered with replies and then an ack) answered: the
/// payloads (after the nlmsghdr) of its replies, until `NLMSG_DONE` or the ack.
#[derive(Debug)]
pub(crate) struct Dump {
    seq: u32,
    /// The replies' payloads.
    pub replies: Vec<Vec<u8>>,
    /// The kernel flagged the dump as interrupted.
    pub interrupted: bool,
    /// `Some(errno)` once ended (0: success).
    pub end: Option<i32>,
}

impl Dump {
    pub(crate) fn new(seq: u32) -> Dump {
        Dump { seq, replies: Vec::new(), interrupted: false, end: None }
    }

    /// Reads one received datagram; answers to other sequence numbers are skipped, and so is
    /// anything after the end.
    pub(crate) fn feed(&mut self, datagram: &[u8]) -> Result<(), Malformed> {
        for message in nl::messages(datagram) {
            let message = message?;
            if message.seq != self.seq || self.end.is_some() {
                continue;
            }
            self.interrupted |= message.flags & NLM_F_DUMP_INTR != 0;
            match message.ty {
                NLMSG_DONE | NLMSG_ERROR => self.end = Some(nl::errno_of(message.payload)?),
                _ if self.replies.len() >= MAX_DUMP_MESSAGES => {
                    return Err(Malformed(format!("more than {MAX_DUMP_MESSAGES} objects")));
                }
                _ => self.replies.push(message.payload.to_vec()),
            }
        }
        Ok(())
    }
}

// ---- the socket (thin) ----------------------------------------------------------------------

/// A netlink socket of IPVS mode and its next sequence number.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: NetlinkSocket,
    seq: u32,
    buf: Vec<u8>,
}

impl Conn {
    /// Opens a socket of `protocol` (`what`: for errors).
    pub(crate) fn open(protocol: i32, what: &str) -> Result<Conn, IpvsError> {
        let sock = NetlinkSocket::open(protocol).map_err(|e| socket_error(what, e))?;
        sock.set_int_opt(libc::SOL_NETLINK, NETLINK_CAP_ACK, 1);
        if !sock.set_int_opt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF) {
            sock.set_int_opt(libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF);
        }
        // Any start works on a private socket; a varying one keeps traces of runs apart.
        let seq = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.subsec_nanos());
        Ok(Conn { sock, seq, buf: vec![0; RECV_BUF_LEN] })
    }

    /// Reserves `count` sequence numbers; the first.
    pub(crate) fn next_seq(&mut self, count: usize) -> u32 {
        let first = self.seq;
        self.seq = self.seq.wrapping_add(count as u32);
        first
    }

    /// Sends `datagram`, requests with sequence numbers `first..first + count` each asking for an
    /// ack, and returns each one's errno (0: done).
    pub(crate) fn acked(
        &mut self,
        datagram: &[u8],
        first: u32,
        count: usize,
        what: &str,
    ) -> Result<Vec<i32>, IpvsError> {
        self.send(datagram, what)?;
        let mut acks = Acks::new(first, count);
        let deadline = Instant::now() + ANSWER_DEADLINE;
        while !acks.complete() {
            let n = self.recv(deadline, what)?;
            acks.feed(&self.buf[..n]).map_err(|e| malformed(what, e))?;
        }
        Ok(acks.errnos())
    }

    /// Sends one request (a dump, or one that replies and then acks) with sequence number `seq`
    /// and returns its replies' payloads, or the kernel's errno. An interrupted dump is asked
    /// again, a few times.
    pub(crate) fn request(
        &mut self,
        message: &[u8],
        seq: u32,
        what: &str,
    ) -> Result<Result<Vec<Vec<u8>>, i32>, IpvsError> {
        for _ in 0..DUMP_TRIES {
            self.send(message, what)?;
            let mut dump = Dump::new(seq);
            let deadline = Instant::now() + ANSWER_DEADLINE;
            while dump.end.is_none() {
                let n = self.recv(deadline, what)?;
                dump.feed(&self.buf[..n]).map_err(|e| malformed(what, e))?;
            }
            match dump.end {
                Some(0) if dump.interrupted => continue,
                Some(0) => return Ok(Ok(dump.replies)),
                errno => return Ok(Err(errno.unwrap_or_default())),
            }
        }
        Err(IpvsError::Malformed { what: what.into(), why: format!("the dump was interrupted {DUMP_TRIES} times") })
    }

    fn send(&self, datagram: &[u8], what: &str) -> Result<(), IpvsError> {
        self.sock.send(datagram).map_err(|e| socket_error(what, e))
    }

    /// One datagram into the buffer before `deadline`; its length.
    fn recv(&mut self, deadline: Instant, what: &str) -> Result<usize, IpvsError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout_ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        match self.sock.recv(&mut self.buf, timeout_ms).map_err(|e| socket_error(what, e))? {
            None => Err(IpvsError::NoAnswer { what: what.into() }),
            Some(n) if n > self.buf.len() => Err(malformed(
                what,
                Malformed(format!("an answer of {n} bytes overran the {RECV_BUF_LEN}-byte buffer")),
            )),
            Some(n) => Ok(n),
        }
    }
}

fn socket_error(what: &str, e: SocketError) -> IpvsError {
    IpvsError::Socket { what: what.into(), call: e.call, error: e.err }
}

fn malformed(what: &str, e: Malformed) -> IpvsError {
    IpvsError::Malformed { what: what.into(), why: e.0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One netlink message: header (type, flags, seq) and payload.
    pub(crate) fn message(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        let start = nl::begin_nlmsg(&mut b, ty, flags, seq);
        b.extend_from_slice(payload);
        nl::end_msg(&mut b, start);
        b
    }

    /// An `NLMSG_ERROR` answer to `seq` with `errno` (capped: the request's header only).
    pub(crate) fn ack(seq: u32, errno: i32) -> Vec<u8> {
        let mut payload = (-errno).to_ne_bytes().to_vec();
        payload.extend_from_slice(&message(0x25, 0, seq, &[])); // the echoed request header
        message(NLMSG_ERROR, 0x100, seq, &payload)
    }

    #[test]
    fn acks_are_matched_to_their_requests_and_others_skipped() {
        let mut acks = Acks::new(100, 3);
        acks.feed(&[ack(101, libc::EEXIST), ack(7, libc::EINVAL)].concat()).unwrap();
        assert!(!acks.complete());
        acks.feed(&ack(100, 0)).unwrap();
        acks.feed(&[message(0x25, 0, 102, b"reply"), ack(102, 0)].concat()).unwrap();
        assert!(acks.complete());
        assert_eq!(acks.errnos(), [0, libc::EEXIST, 0]);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut acks = Acks::new(u32::MAX, 2);
        acks.feed(&[ack(u32::MAX, 0), ack(0, libc::ENOENT)].concat()).unwrap();
        assert_eq!(acks.errnos(), [0, libc::ENOENT]);
    }

    #[test]
    fn truncated_or_overlong_answers_are_errors_not_panics() {
        let good = ack(1, 0);
        for cut in 1..good.len() {
            let mut acks = Acks::new(1, 1);
            let outcome = acks.feed(&good[..cut]);
            assert!(outcome.is_err(), "a message cut at {cut} bytes must be an error");
        }
        // A length field larger than the datagram, and one shorter than a header.
        let mut long = good.clone();
        long[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(Acks::new(1, 1).feed(&long).is_err());
        let mut short = good.clone();
        short[0..4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(Acks::new(1, 1).feed(&short).is_err());
        // An error message too short for its code (2 bytes and padding).
        let mut two = message(NLMSG_ERROR, 0, 1, &[0, 0]);
        two[0..4].copy_from_slice(&18u32.to_ne_bytes());
        assert!(Acks::new(1, 1).feed(&two).is_err());
    }

    #[test]
    fn a_dump_collects_replies_until_done_and_flags_interruption() {
        let mut dump = Dump::new(5);
        dump.feed(&[message(0x25, 2, 5, b"one\0"), message(0x25, 2, 4, b"other")].concat()).unwrap();
        assert_eq!(dump.end, None);
        dump.feed(
            &[message(0x25, 2 | NLM_F_DUMP_INTR, 5, b"two\0"), message(NLMSG_DONE, 2, 5, &0i32.to_ne_bytes())].concat(),
        )
        .unwrap();
        assert_eq!(dump.end, Some(0));
        assert!(dump.interrupted);
        assert_eq!(dump.replies, [b"one\0".to_vec(), b"two\0".to_vec()]);
        // Anything after the end is ignored.
        dump.feed(&message(0x25, 2, 5, b"late")).unwrap();
        assert_eq!(dump.replies.len(), 2);
    }

    #[test]
    fn a_refused_request_ends_with_its_errno() {
        let mut dump = Dump::new(9);
        dump.feed(&ack(9, libc::ENOENT)).unwrap();
        assert_eq!(dump.end, Some(libc::ENOENT));
        let mut dump = Dump::new(9);
        dump.feed(&message(NLMSG_DONE, 2, 9, &(-libc::EINVAL).to_ne_bytes())).unwrap();
        assert_eq!(dump.end, Some(libc::EINVAL));
        assert!(Dump::new(9).feed(&message(NLMSG_DONE, 2, 9, &[])).is_err(), "DONE without its code");
    }

    #[test]
    fn errnos_are_named() {
        assert_eq!(errno_text(libc::EEXIST), "File exists (EEXIST)");
        assert_eq!(errno_text(libc::ESRCH), "No such process (ESRCH)");
        assert!(errno_text(4095).ends_with("(errno 4095)"), "{}", errno_text(4095));
    }
}
