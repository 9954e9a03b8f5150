//! The host a request is routed on and that its endpoint sees: the authority of an absolute-form
//! target or of HTTP/2's `:authority` when there is one (RFC 9112 §3.2.2, RFC 9113 §8.3.1), else
//! the request's one `Host` field.

use std::borrow::Cow;

/// Why a request's host is refused (400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// More than one `Host` field (RFC 9112 §3.2).
    #[error("more than one Host field")]
    Several,
    /// An HTTP/1.1 request without a `Host` field or an authority (RFC 9112 §3.2).
    #[error("no Host field")]
    Missing,
    /// Not `host[:port]`: a character that no host name has, an empty name before a port, `..`,
    /// an unclosed IPv6 literal, user information, or a port that is not a number up to 65535.
    #[error("malformed host {0:?}")]
    Malformed(String),
}

/// A request's host: the value its endpoint gets as `Host`, and the name it is routed on.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestHost<'a> {
    /// As received: the authority, else the `Host` field (empty when there is neither).
    pub value: &'a str,
    /// For routing: without port and trailing dot, lowercase (an IPv6 literal keeps its
    /// brackets).
    pub name: Cow<'a, str>,
}

/// The host of a request with target authority `authority` and `Host` fields `fields`. Every
/// `Host` field is checked, even one that the authority overrides; `requires_host`: HTTP/1.1,
/// which must name one.
pub fn request_host<'a>(
    authority: Option<&'a str>,
    mut fields: impl Iterator<Item = &'a [u8]>,
    requires_host: bool,
) -> Result<RequestHost<'a>, HostError> {
    let field = fields.next();
    if fields.next().is_some() {
        return Err(HostError::Several);
    }
    let field = field.map(|field| std::str::from_utf8(field).map_err(|_| malformed(field))).transpose()?;
    let field_name = field.map(route_name).transpose()?;
    let (value, name) = match (authority, field, field_name) {
        (Some(authority), _, _) => (authority, route_name(authority)?),
        (None, Some(field), Some(name)) => (field, name),
        (None, _, _) if requires_host => return Err(HostError::Missing),
        (None, _, _) => ("", Cow::Borrowed("")),
    };
    Ok(RequestHost { value, name })
}

/// The name to route `value` (`host[:port]`) on; an empty value is an empty name (RFC 9110 §7.2
/// allows it for a target without authority).
pub fn route_name(value: &str) -> Result<Cow<'_, str>, HostError> {
    let bad = || malformed(value.as_bytes());
    let (name, port) = match value.strip_prefix('[') {
        Some(rest) => {
            let end = rest.find(']').ok_or_else(bad)?;
            let literal = &rest[..end];
            if literal.is_empty() || !literal.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
                return Err(bad());
            }
            match &rest[end + 1..] {
                "" => (&value[..end + 2], None),
                after => (&value[..end + 2], Some(after.strip_prefix(':').ok_or_else(bad)?)),
            }
        }
        None => match value.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (value, None),
        },
    };
    // RFC 3986 §3.2.3: `port = *DIGIT`; more than 65535 names no port.
    if let Some(port) = port
        && (port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u32>().is_ok_and(|p| p > 65535))
    {
        return Err(bad());
    }
    if !name.starts_with('[') {
        // A reg-name (RFC 3986 §3.2.2) of at least one character when a port follows, without
        // the empty label that nginx refuses too.
        let empty = name.is_empty() && port.is_some();
        if empty || name.contains("..") || !name.bytes().all(reg_name_byte) {
            return Err(bad());
        }
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    Ok(match name.bytes().any(|b| b.is_ascii_uppercase()) {
        true => Cow::Owned(name.to_ascii_lowercase()),
        false => Cow::Borrowed(name),
    })
}

/// unreserved / pct-encoded / sub-delims (RFC 3986 §3.2.2).
fn reg_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&byte)
}

fn malformed(value: &[u8]) -> HostError {
    HostError::Malformed(String::from_utf8_lossy(value).into_owned())
}

/// What the fuzz target (`fuzz/fuzz_targets/host.rs`) and the corpus test check for any input:
/// no panic, and a name that is lowercase, has no port and is accepted again as it is.
pub fn check(input: &[u8]) {
    let Ok(host) = request_host(None, std::iter::once(input), true) else { return };
    let name = &*host.name;
    assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{input:?} -> {name:?}");
    assert!(name.starts_with('[') || !name.contains(':'), "{input:?} -> {name:?}");
    assert!(!name.contains(['/', '\\', '@', '?', '#', ' ']), "{input:?} -> {name:?}");
    assert_eq!(route_name(name).as_deref(), Ok(name.trim_end_matches('.')), "{input:?}: stable");
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
