//! The chunked transfer coding of endpoint responses (RFC 9112 §7.1), decoded as bytes pass so
//! that the fast path knows where a body ends and sends its clients chunks of its own framing:
//! extensions and trailer fields are read and dropped, never passed on. Strict where a lenient
//! reading could end a body elsewhere than the endpoint meant (bare LF, junk after the size,
//! sizes beyond 64 bits), and bounded (size lines and the trailer section).
//!
//! Written by hand: hyper's decoder is private to hyper, and httparse only parses the size line.

/// Longest chunk-size line (size and extensions) and longest trailer section, in bytes.
pub const MAX_LINE: usize = 4096;

/// Why a chunked body was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadChunk {
    #[error("invalid chunk size line")]
    Size,
    #[error("chunk size line or trailer section too long")]
    TooLong,
    #[error("chunk data not followed by CRLF")]
    DataEnd,
    #[error("invalid trailer section")]
    Trailer,
}

/// Where the decoder is.
#[derive(Clone, Copy, Debug)]
enum State {
    /// In the hex digits of a chunk size: the value so far and how many digits.
    Size(u64, u8),
    /// After the size: whitespace, then `;` and extensions, up to CR; `true` once `;` came.
    Extension(u64, bool),
    /// After the CR of a size line: LF, then data of the size (0: the trailer section).
    SizeLf(u64),
    /// Bytes of chunk data left.
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line.
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// After the CR of a trailer line; `true` if the line was empty (the end).
    TrailerLf(bool),
    Done,
}

/// Decodes one chunked body.
#[derive(Debug)]
pub struct Dechunker {
    state: State,
    /// Bytes of the current size line, or of the trailer section so far.
    line: usize,
}

impl Default for Dechunker {
    fn default() -> Self {
        Self { state: State::Size(0, 0), line: 0 }
    }
}

impl Dechunker {
    /// Reads the next bytes of the body, giving each run of chunk data to `data`; returns how many
    /// bytes of `input` the body took if it ended in them, `None` if it needs more.
    pub fn feed<'a>(&mut self, input: &'a [u8], mut data: impl FnMut(&'a [u8])) -> Result<Option<usize>, BadChunk> {
        let mut at = 0;
        while at < input.len() {
            if let State::Data(left) = self.state {
                let run = usize::try_from(left).unwrap_or(usize::MAX).min(input.len() - at);
                data(&input[at..at + run]);
                at += run;
                let left = left - run as u64;
                self.state = if left == 0 { State::DataCr } else { State::Data(left) };
                continue;
            }
            let byte = input[at];
            at += 1;
            self.state = self.step(byte)?;
            if let State::Done = self.state {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// The state after one byte outside chunk data.
    fn step(&mut self, byte: u8) -> Result<State, BadChunk> {
        let visible = matches!(byte, b'\t' | b' '..=b'~' | 0x80..);
        let next = match (self.state, byte) {
            (State::Size(value, digits), _) if byte.is_ascii_hexdigit() => {
                if digits == 16 {
                    return Err(BadChunk::Size);
                }
                let digit = (byte as char).to_digit(16).expect("a hex digit");
                State::Size(value << 4 | u64::from(digit), digits + 1)
            }
            (State::Size(_, 0), _) => return Err(BadChunk::Size),
            (State::Size(value, _), b'\r') | (State::Extension(value, _), b'\r') => State::SizeLf(value),
            (State::Size(value, _), b' ' | b'\t') | (State::Extension(value, false), b' ' | b'\t') => {
                State::Extension(value, false)
            }
            (State::Size(value, _) | State::Extension(value, _), b';') => State::Extension(value, true),
            (State::Extension(value, true), _) if visible => State::Extension(value, true),
            (State::SizeLf(0), b'\n') => State::TrailerStart,
            (State::SizeLf(size), b'\n') => State::Data(size),
            (State::DataCr, b'\r') => State::DataLf,
            (State::DataLf, b'\n') => State::Size(0, 0),
            (State::DataCr | State::DataLf, _) => return Err(BadChunk::DataEnd),
            (State::TrailerStart, b'\r') => State::TrailerLf(true),
            (State::Trailer, b'\r') => State::TrailerLf(false),
            (State::TrailerStart | State::Trailer, _) if visible => State::Trailer,
            (State::TrailerLf(true), b'\n') => State::Done,
            (State::TrailerLf(false), b'\n') => State::TrailerStart,
            (State::TrailerStart | State::Trailer | State::TrailerLf(_), _) => return Err(BadChunk::Trailer),
            (State::Size(..) | State::Extension(..) | State::SizeLf(_), _) => return Err(BadChunk::Size),
            (State::Data(_) | State::Done, _) => unreachable!("data is read in runs, and nothing after the end"),
        };
        // Size lines are bounded one by one, the trailer section as a whole.
        self.line = match next {
            State::Data(_) | State::Size(0, 0) => 0,
            _ => self.line + 1,
        };
        if self.line > MAX_LINE {
            return Err(BadChunk::TooLong);
        }
        Ok(next)
    }
}

#[cfg(test)]
#[path = "chunked_tests.rs"]
mod tests;
