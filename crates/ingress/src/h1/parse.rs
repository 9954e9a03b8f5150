//! Request and response heads of the HTTP/1 fast path, parsed by `httparse` (hyper's own
//! parser) and then judged: which requests the fast path may take, and how a response's body is
//! framed (RFC 9112 §6.3). Everything doubtful goes to the general path (requests) or is refused
//! (responses: 502), never guessed: that is the defence against request and response smuggling.

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::PathAndQuery;
use hyper::{Method, Request, StatusCode, Uri, Version};
use std::ops::Range;

/// Header fields the fast path parses at most: hyper's limit; a request with more goes to the
/// general path, which answers 431 (or takes them, if the configured limit is higher).
pub const MAX_FIELDS: usize = 100;

/// What the bytes received so far on a client connection hold.
#[derive(Debug)]
// Returned once per request and taken apart at once: boxing would cost an allocation.
#[allow(clippy::large_enum_variant)]
pub enum RequestHead {
    /// Not a complete head yet.
    Partial,
    /// A request the general path must take: anything the fast path does not handle (a body,
    /// an upgrade, `Expect`, HTTP/1.0, HTTP/2, an absolute or asterisk target, an extension
    /// method, too many fields) or does not understand (it answers the errors).
    General,
    /// A plain request without a body, `len` bytes long.
    Fast(FastRequest),
}

/// A request the fast path takes.
#[derive(Debug)]
pub struct FastRequest {
    /// Method, origin-form URI, HTTP/1.1 and the header fields as received.
    pub parts: Parts,
    /// Length of the head in bytes: where the next request starts.
    pub len: usize,
    /// The client asked to close the connection after this request (`Connection: close`).
    pub close: bool,
}

/// Parses the request head at the start of `buf`.
pub fn request(buf: &[u8]) -> RequestHead {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut parsed = httparse::Request::new(&mut fields);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return RequestHead::Partial,
        Err(_) => return RequestHead::General,
    };
    match fast_request(&parsed, len) {
        Some(request) => RequestHead::Fast(request),
        None => RequestHead::General,
    }
}

/// The parsed request as the fast path takes it, if it does.
fn fast_request(parsed: &httparse::Request<'_, '_>, len: usize) -> Option<FastRequest> {
    if parsed.version != Some(1) {
        return None;
    }
    let method = match parsed.method? {
        "GET" => Method::GET,
        "HEAD" => Method::HEAD,
        "POST" => Method::POST,
        "PUT" => Method::PUT,
        "DELETE" => Method::DELETE,
        "OPTIONS" => Method::OPTIONS,
        "PATCH" => Method::PATCH,
        _ => return None,
    };
    let target = parsed.path?;
    if !target.starts_with('/') {
        return None;
    }
    let uri = Uri::from(PathAndQuery::try_from(target).ok()?);
    // Room for the fields the proxy adds (X-Forwarded-*, X-Real-IP) without growing.
    let mut headers = HeaderMap::with_capacity(parsed.headers.len() + 6);
    let mut close = false;
    for field in &*parsed.headers {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(field.value).ok()?;
        match name {
            // A body, or the wish for one, is the general path's.
            header::TRANSFER_ENCODING | header::EXPECT | header::UPGRADE => return None,
            header::CONTENT_LENGTH if value != "0" => return None,
            header::CONNECTION => close |= has_token(value.as_bytes(), b"close"),
            _ => {}
        }
        headers.append(name, value);
    }
    let (mut parts, ()) = Request::new(()).into_parts();
    (parts.method, parts.uri, parts.version, parts.headers) = (method, uri, Version::HTTP_11, headers);
    Some(FastRequest { parts, len, close })
}

/// Whether a comma-separated field value lists `token` (ASCII case-insensitive).
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// Largest response head the fast path buffers: hyper's client limit.
pub const MAX_RESPONSE_HEAD: usize = 8192 + 4096 * 100;

/// What the bytes received so far on an endpoint connection hold.
#[derive(Debug)]
pub enum ResponseHead {
    /// Not a complete head yet.
    Partial,
    /// An interim (1xx) response `len` bytes long, to be skipped.
    Interim(usize),
    /// A final response.
    Final(FinalResponse),
}

/// A final response head from an endpoint, as positions in the bytes it was parsed from: its
/// fields are passed on as received (but for hop-by-hop ones), without a header map, unless a
/// route edits them.
#[derive(Debug)]
pub struct FinalResponse {
    pub status: StatusCode,
    /// The reason phrase.
    pub reason: Range<usize>,
    /// The header fields: name and value.
    pub fields: Vec<(Range<usize>, Range<usize>)>,
    /// Length of the head in bytes: where the body starts.
    pub len: usize,
    pub body: Framing,
    /// The endpoint may take another request on this connection afterwards.
    pub reusable: bool,
}

impl FinalResponse {
    /// The header fields in `head`, the bytes this was parsed from, as names and values.
    pub fn fields<'a>(&'a self, head: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone + 'a {
        self.fields.iter().map(move |(name, value)| (&head[name.clone()], &head[value.clone()]))
    }

    /// The header fields in `head` as a map (for a route's edits).
    pub fn header_map(&self, head: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(self.fields.len());
        for (name, value) in self.fields(head) {
            // httparse checked both: names are tokens, values have no control characters.
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
                headers.append(name, value);
            }
        }
        headers
    }
}

/// How a response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (a response to HEAD, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the endpoint closes the connection.
    UntilClose,
}

/// Why a response head was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadResponse {
    #[error("malformed response head: {0}")]
    Malformed(httparse::Error),
    #[error("response head larger than {MAX_RESPONSE_HEAD} bytes or with more than {MAX_FIELDS} fields")]
    TooLarge,
    #[error("invalid status code")]
    Status,
    #[error("101 Switching Protocols to a request that asked for no upgrade")]
    UnaskedSwitch,
    #[error("both Transfer-Encoding and Content-Length")]
    LengthAndEncoding,
    #[error("a transfer coding other than chunked alone")]
    Encoding,
    #[error("invalid or conflicting Content-Length")]
    Length,
}

/// Length of "HTTP/1.1 200 ", where a reason phrase starts.
const STATUS_PREFIX: usize = 13;

/// Parses the response head at the start of `buf`, the answer to a request with `method`.
pub fn response(buf: &[u8], method: &Method) -> Result<ResponseHead, BadResponse> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut parsed = httparse::Response::new(&mut fields);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_RESPONSE_HEAD => return Err(BadResponse::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(ResponseHead::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(BadResponse::TooLarge),
        Err(err) => return Err(BadResponse::Malformed(err)),
    };
    let status = StatusCode::from_u16(parsed.code.ok_or(BadResponse::Status)?).map_err(|_| BadResponse::Status)?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(BadResponse::UnaskedSwitch);
    }
    if status.is_informational() {
        return Ok(ResponseHead::Interim(len));
    }
    let base = buf.as_ptr() as usize;
    let at = |part: &[u8]| {
        let start = part.as_ptr() as usize - base;
        start..start + part.len()
    };
    let fields: Vec<_> = parsed.headers.iter().map(|field| (at(field.name.as_bytes()), at(field.value))).collect();
    let named = |name: &'static str| {
        parsed.headers.iter().filter(move |field| field.name.eq_ignore_ascii_case(name)).map(|field| field.value)
    };
    let body = framing(status, method, named("transfer-encoding"), named("content-length"))?;
    let close = named("connection").any(|value| has_token(value, b"close"));
    // A 204 may carry no framing fields (RFC 9110 §8.6, RFC 9112 §6.1): one that does says a
    // body will follow, which would be the next request's answer.
    let stray_body = status == StatusCode::NO_CONTENT
        && (named("transfer-encoding").next().is_some() || named("content-length").any(|value| value != b"0"));
    let reusable = parsed.version == Some(1) && !close && body != Framing::UntilClose && !stray_body;
    // From the status line, not httparse's reason, which is empty when it is not UTF-8 (obs-text
    // is valid): after "HTTP/1.x NNN ", up to the line's end.
    let line = buf.iter().position(|&b| b == b'\n').map_or(0, |end| end - usize::from(buf[..end].ends_with(b"\r")));
    let reason = if line > STATUS_PREFIX { STATUS_PREFIX..line } else { 0..0 };
    Ok(ResponseHead::Final(FinalResponse { status, reason, fields, len, body, reusable }))
}

/// How the body of a final response with `status` and `headers` to a `method` request is
/// framed (RFC 9112 §6.3), refusing what a smuggler would send: both `Transfer-Encoding` and
/// `Content-Length`, codings other than `chunked` alone, and unequal or invalid lengths.
fn framing<'a>(
    status: StatusCode,
    method: &Method,
    mut encodings: impl Iterator<Item = &'a [u8]>,
    mut lengths: impl Iterator<Item = &'a [u8]>,
) -> Result<Framing, BadResponse> {
    if method == Method::HEAD || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Empty);
    }
    match (encodings.next(), lengths.next()) {
        (Some(_), Some(_)) => Err(BadResponse::LengthAndEncoding),
        (Some(encoding), None)
            if encodings.next().is_none() && encoding.trim_ascii().eq_ignore_ascii_case(b"chunked") =>
        {
            Ok(Framing::Chunked)
        }
        (Some(_), None) => Err(BadResponse::Encoding),
        (None, Some(first)) => {
            let length = content_length(first)?;
            if lengths.any(|other| content_length(other) != Ok(length)) {
                return Err(BadResponse::Length);
            }
            Ok(Framing::Length(length))
        }
        (None, None) => Ok(Framing::UntilClose),
    }
}

/// A `Content-Length` value: 1 to 19 decimal digits, nothing else.
fn content_length(digits: &[u8]) -> Result<u64, BadResponse> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BadResponse::Length);
    }
    digits.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0'))).ok_or(BadResponse::Length)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
