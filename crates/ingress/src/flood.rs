//! A bound on the HTTP/2 control frames a client sends (SETTINGS, PING, WINDOW_UPDATE, PRIORITY,
//! RST_STREAM, empty DATA and CONTINUATION, and unknown types), which cost the server work but
//! carry no request: h2 keeps their memory bounded (one SETTINGS ack and one PING ack pending,
//! no read while they are), not their rate.
//!
//! [`FrameBudget`] reads the frame headers of what a client sends, as bytes pass, without
//! buffering: a connection that starts with the HTTP/2 preface gets [`BURST`] control frames,
//! one more for each request (HEADERS), one per [`CREDIT_PER_WRITTEN`] bytes sent to it (window
//! updates follow the data a client receives) and [`PER_SECOND`] a second, up to [`BURST`];
//! one control frame more than that is a flood.

use std::time::Instant;

/// Control frames a connection may send at once, and at most saved up.
pub const BURST: u32 = 1000;
/// Control frames a connection earns each second.
pub const PER_SECOND: u32 = 10;
/// Bytes sent to the client that earn one control frame.
pub const CREDIT_PER_WRITTEN: usize = 1024;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 1;

/// A client sent more control frames than its budget.
#[derive(Debug, thiserror::Error)]
#[error("HTTP/2 control frame flood")]
pub struct Flood;

/// Where the reader is in a connection's byte stream.
enum Position {
    /// This many bytes of the preface matched so far.
    Preface(usize),
    /// Inside a frame header: the bytes read so far, and how many.
    Header([u8; 9], usize),
    /// Inside a frame payload: bytes left.
    Payload(u32),
    /// Not HTTP/2: nothing to count.
    Off,
}

/// The control-frame budget of one client connection.
pub struct FrameBudget {
    position: Position,
    credit: u32,
    /// Bytes written that have not earned a frame yet.
    written: usize,
    /// When the time-based credit was last added: the connection's start, at first.
    since: Instant,
}

impl FrameBudget {
    /// The budget of a connection that starts now.
    pub fn new() -> Self {
        Self { position: Position::Preface(0), credit: BURST, written: 0, since: Instant::now() }
    }

    /// Counts the frames that `bytes`, the next bytes the client sent, start or end.
    pub fn read(&mut self, mut bytes: &[u8]) -> Result<(), Flood> {
        while !bytes.is_empty() {
            match &mut self.position {
                Position::Off => return Ok(()),
                Position::Preface(matched) => {
                    let n = (PREFACE.len() - *matched).min(bytes.len());
                    if bytes[..n] != PREFACE[*matched..*matched + n] {
                        self.position = Position::Off;
                        return Ok(());
                    }
                    *matched += n;
                    bytes = &bytes[n..];
                    if *matched == PREFACE.len() {
                        self.position = Position::Header([0; 9], 0);
                    }
                }
                Position::Header(header, have) => {
                    let n = (9 - *have).min(bytes.len());
                    header[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have == 9 {
                        let header = *header;
                        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
                        self.frame(header[3], header[4], length)?;
                        self.position =
                            if length == 0 { Position::Header([0; 9], 0) } else { Position::Payload(length) };
                    }
                }
                Position::Payload(left) => {
                    let n = (*left as usize).min(bytes.len());
                    *left -= n as u32;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.position = Position::Header([0; 9], 0);
                    }
                }
            }
        }
        Ok(())
    }

    /// Earns credit for `n` bytes sent to the client.
    pub fn wrote(&mut self, n: usize) {
        if matches!(self.position, Position::Off) {
            return;
        }
        self.written += n;
        let earned = self.written / CREDIT_PER_WRITTEN;
        self.written %= CREDIT_PER_WRITTEN;
        self.earn(u32::try_from(earned).unwrap_or(u32::MAX));
    }

    fn frame(&mut self, kind: u8, flags: u8, length: u32) -> Result<(), Flood> {
        let control = match kind {
            HEADERS => {
                self.earn(1);
                false
            }
            DATA => length == 0 && flags & END_STREAM == 0,
            CONTINUATION => length == 0,
            _ => true,
        };
        if !control {
            return Ok(());
        }
        if self.credit == 0 {
            // The clock is read only when the credit runs out.
            let now = Instant::now();
            let seconds = now.duration_since(self.since).as_secs();
            if seconds == 0 {
                return Err(Flood);
            }
            self.since = now;
            self.earn(u32::try_from(seconds.saturating_mul(PER_SECOND.into())).unwrap_or(u32::MAX));
        }
        self.credit -= 1;
        Ok(())
    }

    fn earn(&mut self, frames: u32) {
        self.credit = self.credit.saturating_add(frames).min(BURST);
    }
}

impl Default for FrameBudget {
    fn default() -> Self {
        Self::new()
    }
}

/// What the fuzz target (`fuzz/fuzz_targets/frames.rs`) checks for any input: no panic, fed in
/// one piece or byte by byte, with the same verdict.
pub fn check(input: &[u8]) {
    let whole = FrameBudget::new().read(input).is_ok();
    let mut budget = FrameBudget::new();
    let bytewise = input.iter().all(|byte| budget.read(std::slice::from_ref(byte)).is_ok());
    assert_eq!(whole, bytewise, "{input:?}");
}

#[cfg(test)]
#[path = "flood_tests.rs"]
mod tests;
