//! What the kernel answers to an nf_tables batch or dump, and the typed errors made of it.
//!
//! Pure: parsing `NLMSG_ERROR` datagrams and deciding a batch's outcome, tested over answers
//! captured from the kernel. nfnetlink acks errors that concern the whole batch (no
//! CAP_NET_ADMIN, an unsupported subsystem, a failed commit) against the sequence number of the
//! batch's BEGIN message, errors of one op against that op's, and (recent kernels) the END with
//! 0 once committed.

use std::fmt;
use std::io;

use crate::netlink_socket::{NLMSG_ERROR, NLMSG_HDRLEN};

/// `NLM_F_CAPPED`: the echoed request is only its header.
const NLM_F_CAPPED: u16 = 0x100;
/// `NLM_F_ACK_TLVS`: extended-ack attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: the extended ack's text.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// An errno and the kernel's extended-ack message, as it answered one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    /// The errno (positive).
    pub errno: i32,
    /// The extended ack's text, when the kernel gave one.
    pub message: Option<String>,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&errno_text(self.errno))?;
        match &self.message {
            Some(message) => write!(f, " ({message})"),
            None => Ok(()),
        }
    }
}

/// Why an nf_tables request did not do what it asked.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The kernel refused op `index` of a batch (its nft syntax in `op`): nothing was applied.
    #[error("{error}: {op}")]
    Refused {
        /// The op's position in the batch.
        index: usize,
        /// The op, as nft syntax.
        op: String,
        /// What the kernel said.
        error: KernelError,
    },
    /// The kernel refused the batch as a whole (missing CAP_NET_ADMIN, an unsupported operation,
    /// an error raised at commit): nothing was applied.
    #[error("{error}: the kernel refused the batch of {ops} ops as a whole")]
    Batch {
        /// Ops in the batch.
        ops: usize,
        /// What the kernel said.
        error: KernelError,
    },
    /// Listing `what` failed.
    #[error("{error}: listing {what}")]
    Dump {
        /// What was listed.
        what: &'static str,
        /// What the kernel said.
        error: KernelError,
    },
    /// A socket call failed before anything was sent, or the listing stopped.
    #[error("netlink {call}: {error}")]
    Socket {
        /// The call (`socket`, `bind`, `send`, `poll`, `recv`).
        call: &'static str,
        /// The OS error (in the message, so not a source as well: printed once).
        error: io::Error,
    },
    /// Receiving a batch's answers failed after it was sent: its outcome is unknown.
    #[error("netlink receive: {error} (acknowledgements were lost; the batch outcome is unknown)")]
    AnswersLost {
        /// The OS error (in the message, so not a source as well).
        error: io::Error,
    },
    /// A listing got no answer in time.
    #[error("netlink: no answer from the kernel listing {what}")]
    NoAnswer {
        /// What was listed.
        what: &'static str,
    },
}

impl NetlinkError {
    /// True when the kernel refused the batch because of what it holds (an op, or a check at
    /// commit), so that leaving out the offending Services can help. False for permission,
    /// support, resource and transport failures, which no choice of Services fixes.
    pub fn caused_by_content(&self) -> bool {
        match self {
            NetlinkError::Refused { .. } => true,
            NetlinkError::Batch { error, .. } => !matches!(
                error.errno,
                libc::EPERM
                    | libc::EACCES
                    | libc::EOPNOTSUPP
                    | libc::EPROTONOSUPPORT
                    | libc::EAFNOSUPPORT
                    | libc::ENOMEM
                    | libc::ENOBUFS
                    | libc::EAGAIN
                    | libc::EINTR
                    | libc::ERESTART
            ),
            _ => false,
        }
    }
}

/// One `NLMSG_ERROR` answer: the sequence number it answers, its errno (0 for an ack) and the
/// extended ack's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub seq: u32,
    pub errno: i32,
    pub message: Option<String>,
}

/// The native-endian `u32` at `at`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The native-endian `u16` at `at`.
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// Appends the `NLMSG_ERROR` messages of one datagram to `out` (other types are ignored, and so
/// is a truncated tail).
pub(crate) fn parse_answers(buf: &[u8], out: &mut Vec<Answer>) {
    let mut at = 0;
    while at + NLMSG_HDRLEN <= buf.len() {
        let len = u32_at(buf, at) as usize;
        if len < NLMSG_HDRLEN || at + len > buf.len() {
            break;
        }
        let ty = u16_at(buf, at + 4);
        let flags = u16_at(buf, at + 6);
        let msg = &buf[at..at + len];
        if ty == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN {
            let errno = -(u32_at(msg, NLMSG_HDRLEN) as i32);
            // The echoed request header tells which message this answers.
            let orig = NLMSG_HDRLEN + 4;
            let seq = u32_at(msg, orig + 8);
            let orig_len = u32_at(msg, orig) as usize;
            let mut tlv =
                if flags & NLM_F_CAPPED != 0 { orig + NLMSG_HDRLEN } else { orig + orig_len.max(NLMSG_HDRLEN) };
            tlv = (tlv + 3) & !3;
            let mut message = None;
            if flags & NLM_F_ACK_TLVS != 0 {
                while tlv + 4 <= msg.len() {
                    let alen = u16_at(msg, tlv) as usize;
                    let aty = u16_at(msg, tlv + 2);
                    if alen < 4 || tlv + alen > msg.len() {
                        break;
                    }
                    if aty == NLMSGERR_ATTR_MSG {
                        let text = &msg[tlv + 4..tlv + alen];
                        let text = text.split(|&c| c == 0).next().unwrap_or_default();
                        message = Some(String::from_utf8_lossy(text).into_owned());
                    }
                    tlv += (alen + 3) & !3;
                }
            }
            out.push(Answer { seq, errno, message });
        }
        at += (len + 3) & !3;
    }
}

/// The outcome of the batch of `ops` ops whose BEGIN had sequence number `seq_start` (op `i` has
/// `seq_start + 1 + i`, the END the one after the last op), from every answer the kernel sent;
/// `describe(i)` is op `i` in `nft` syntax. An error against an op refuses that op (the first one
/// wins); an error against BEGIN or END refuses the batch as a whole. Answers to other sequence
/// numbers are ignored.
pub(crate) fn batch_outcome(
    answers: &[Answer],
    seq_start: u32,
    ops: usize,
    describe: &dyn Fn(usize) -> String,
) -> Result<(), NetlinkError> {
    let end_seq = seq_start.wrapping_add(1 + ops as u32);
    let op_index = |seq: u32| -> Option<usize> {
        let i = seq.wrapping_sub(seq_start).wrapping_sub(1) as usize;
        (i < ops).then_some(i)
    };
    let error = |a: &Answer| KernelError { errno: a.errno, message: a.message.clone() };
    let failed = || answers.iter().filter(|a| a.errno != 0);
    if let Some((index, answer)) = failed().filter_map(|a| Some((op_index(a.seq)?, a))).min_by_key(|(i, _)| *i) {
        return Err(NetlinkError::Refused { index, op: describe(index), error: error(answer) });
    }
    if let Some(answer) = failed().find(|a| a.seq == seq_start || a.seq == end_seq) {
        return Err(NetlinkError::Batch { ops, error: error(answer) });
    }
    Ok(())
}

/// The errno's text without std's " (os error N)" suffix.
pub(crate) fn errno_text(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_rules::nft::rule::Op;
    use roadkeeper_rules::table::IpFamily;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn answers(datagrams: &[&str]) -> Vec<Answer> {
        let mut out = Vec::new();
        for d in datagrams {
            parse_answers(&hex(d), &mut out);
        }
        out
    }

    /// `batch_outcome` of a batch of `ops`.
    fn outcome(answers: &[Answer], seq_start: u32, ops: &[Op]) -> Result<(), NetlinkError> {
        batch_outcome(answers, seq_start, ops.len(), &|i| ops[i].to_string())
    }

    fn one_op() -> Vec<Op> {
        vec![Op::AddTable { family: IpFamily::V4 }]
    }

    /// Captured on kernel 6.18 (x86_64) for BEGIN (seq 100), NEWTABLE, END (with NLM_F_ACK) sent
    /// by a root process without CAP_NET_ADMIN: one capped error against BEGIN, nothing else.
    const WITHOUT_CAP_NET_ADMIN: &str = "240000000200000164000000f90c0000ffffffff14000000100001006400000000000000";
    /// The same batch (BEGIN at seq 200) with CAP_NET_ADMIN: the END's ack, errno 0.
    const COMMITTED: &str = "2400000002000001ca0000002c0d0000000000001400000011000500ca00000000000000";

    #[test]
    #[cfg(target_endian = "little")]
    fn an_error_against_begin_refuses_the_whole_batch() {
        let got = answers(&[WITHOUT_CAP_NET_ADMIN]);
        assert_eq!(got, [Answer { seq: 100, errno: libc::EPERM, message: None }]);
        let err = outcome(&got, 100, &one_op()).unwrap_err();
        assert!(matches!(&err, NetlinkError::Batch { ops: 1, error } if error.errno == libc::EPERM), "{err:?}");
        assert_eq!(err.to_string(), "Operation not permitted: the kernel refused the batch of 1 ops as a whole");
        assert!(!err.caused_by_content(), "no choice of Services fixes a missing capability");
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn the_ack_of_end_is_success() {
        let got = answers(&[COMMITTED]);
        assert_eq!(got, [Answer { seq: 202, errno: 0, message: None }]);
        outcome(&got, 200, &one_op()).unwrap();
        outcome(&[], 200, &one_op()).unwrap();
    }

    #[test]
    fn the_first_refused_op_is_named_and_others_are_ignored() {
        let ops = vec![Op::AddTable { family: IpFamily::V4 }, Op::AddTable { family: IpFamily::V6 }];
        let refused = |seq, errno| Answer { seq, errno, message: Some("why".into()) };
        let got = [refused(12, libc::ENOENT), refused(11, libc::EEXIST), refused(99, libc::EINVAL)];
        let err = outcome(&got, 10, &ops).unwrap_err();
        assert!(matches!(&err, NetlinkError::Refused { index: 0, .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("File exists (why): {}", ops[0]));
        assert!(err.caused_by_content());
        // An error at commit (against END) refuses the batch; one for another batch is not ours.
        let err = outcome(&[refused(13, libc::EINVAL)], 10, &ops).unwrap_err();
        assert!(matches!(err, NetlinkError::Batch { .. }) && err.caused_by_content());
        outcome(&[refused(50, libc::EINVAL)], 10, &ops).unwrap();
    }

    #[test]
    fn truncated_datagrams_are_ignored() {
        let mut out = Vec::new();
        parse_answers(&hex(&WITHOUT_CAP_NET_ADMIN[..40]), &mut out);
        parse_answers(&[0xff; 3], &mut out);
        assert!(out.is_empty());
    }
}
