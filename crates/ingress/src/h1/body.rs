//! Where an endpoint's response body ends, whatever its framing ([`Framing`]): the bytes read
//! from the endpoint go in, the body's data and its end come out. Both the fast path (which
//! writes the data to its client at once) and the general path's HTTP/2 responses from bare
//! endpoint connections (`proxy::wire_body`) read bodies through it.

use super::chunked::{BadChunk, Dechunker};
use super::parse::Framing;

/// Decodes one response body.
#[derive(Debug)]
pub enum BodyDecoder {
    /// Bytes of a `Content-Length` body left (0: ended).
    Length(u64),
    Chunked(Dechunker),
    /// Everything until the endpoint closes.
    UntilClose,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty => Self::Length(0),
            Framing::Length(length) => Self::Length(length),
            Framing::Chunked => Self::Chunked(Dechunker::default()),
            Framing::UntilClose => Self::UntilClose,
        }
    }

    /// Reads the next bytes from the endpoint, giving each run of body data to `data`; returns
    /// how many bytes of `input` the body took if it ended in them (a body of no bytes left ends
    /// in any input, taking none), `None` if it needs more.
    pub fn feed<'a>(&mut self, input: &'a [u8], mut data: impl FnMut(&'a [u8])) -> Result<Option<usize>, BadChunk> {
        match self {
            Self::Length(left) => {
                let run = usize::try_from(*left).unwrap_or(usize::MAX).min(input.len());
                if run > 0 {
                    data(&input[..run]);
                }
                *left -= run as u64;
                Ok((*left == 0).then_some(run))
            }
            Self::Chunked(dechunker) => dechunker.feed(input, data),
            Self::UntilClose => {
                if !input.is_empty() {
                    data(input);
                }
                Ok(None)
            }
        }
    }

    /// Whether the endpoint closing the connection ends the body (else it cut it short).
    pub fn ends_at_close(&self) -> bool {
        matches!(self, Self::UntilClose)
    }

    /// Bytes of the body left, when its framing says.
    pub fn left(&self) -> Option<u64> {
        match self {
            Self::Length(left) => Some(*left),
            Self::Chunked(_) | Self::UntilClose => None,
        }
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
