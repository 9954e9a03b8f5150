//! Heads and chunks as the fast path writes them, into a buffer of its connection.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::StatusCode;
use hyper::header::{self, HeaderMap, HeaderName};

use super::parse::has_token;
use hyper::http::request::Parts;

/// The end of a chunked body, without trailer fields.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// How the body of a response to a client is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// As its header fields say: no body, or their `Content-Length`.
    AsFields,
    /// `Content-Length` of this many bytes, added.
    Length(usize),
    /// Chunked, `Transfer-Encoding` added.
    Chunked,
}

/// Writes the head of a request to an endpoint: `parts`' method, origin-form target, HTTP/1.1
/// and fields.
pub fn request_head(parts: &Parts, out: &mut Vec<u8>) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |target| target.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in map_fields(&parts.headers) {
        field(name, value, out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Hop-by-hop fields (RFC 9110 §7.6.1 and their common non-standard relatives), which a proxy
/// does not pass on, besides `Connection`, `Upgrade` (which upgrades keep) and those that
/// `Connection` names.
pub const HOP_BY_HOP: [HeaderName; 7] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The end-to-end fields of a message: `fields` without the hop-by-hop ones, `Connection` and
/// `Upgrade` included.
pub fn end_to_end<'a, I>(fields: I) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone
where
    I: Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    let connection = fields.clone().filter(|(name, _)| name.eq_ignore_ascii_case(b"connection"));
    fields.filter(move |(name, _)| {
        let is = |hop: &HeaderName| name.eq_ignore_ascii_case(hop.as_str().as_bytes());
        let named = connection.clone().any(|(_, value)| has_token(value, name));
        !(is(&header::CONNECTION) || is(&header::UPGRADE) || HOP_BY_HOP.iter().any(is) || named)
    })
}

/// The fields of a header map as names and values.
pub fn map_fields(headers: &HeaderMap) -> impl Iterator<Item = (&[u8], &[u8])> {
    headers.iter().map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()))
}

/// Writes the head of a response to a client: the status line with `reason` (the canonical one
/// if empty), `fields`, a `Date` if they have none, the framing fields of `body`, and
/// `Connection: close` if `close`.
pub fn response_head<'a>(
    status: StatusCode,
    reason: &[u8],
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    body: Body,
    close: bool,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    let reason = if reason.is_empty() { status.canonical_reason().unwrap_or("").as_bytes() } else { reason };
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for (name, value) in fields {
        dated |= name.eq_ignore_ascii_case(b"date");
        field(name, value, out);
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        date(out);
        out.extend_from_slice(b"\r\n");
    }
    match body {
        Body::AsFields => {}
        Body::Length(length) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Body::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes `data` as one chunk (nothing if it is empty, which would end the body).
pub fn chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - data.len().leading_zeros()).div_ceil(4);
    out.extend((0..digits).rev().map(|i| HEX[(data.len() >> (4 * i)) & 15]));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Writes one field, its name in lowercase (as hyper writes them, and HTTP/2 requires).
fn field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.extend(name.iter().map(u8::to_ascii_lowercase));
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes the current time as an HTTP date, formatted once a second per thread.
fn date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    CACHED.with_borrow_mut(|(cached, text)| {
        if *cached != second {
            *text = httpdate::fmt_http_date(now);
            *cached = second;
        }
        out.extend_from_slice(text.as_bytes());
    });
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
