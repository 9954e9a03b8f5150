//! Request paths as routing sees them, as nginx normalises `$uri` before it matches locations:
//! percent-encodings decoded, repeated slashes merged, `.` and `..` segments removed (RFC 3986
//! §5.2.4). A decoded `%2F` separates segments like `/`, so that a backend that decodes it sees
//! no segment that the route table did not.

use std::borrow::Cow;

/// A request path normalised for routing, and the same path as it is forwarded.
#[derive(Debug, PartialEq, Eq)]
pub struct Normalized<'a> {
    /// Decoded and normalised: what the route table matches (bytes that are not UTF-8 after
    /// decoding become U+FFFD here, and only here).
    pub matched: Cow<'a, str>,
    /// `matched` as the endpoint gets it: the segments that remain, each as received (so `%3F`,
    /// `%23`, `%25` and `%2B` keep their meaning), joined by `/`. Decoding it gives `matched`.
    /// Borrowed when it is the received path.
    pub forwarded: Cow<'a, str>,
}

/// Why a request path is refused (400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not origin-form: `*` or an authority-form target.
    #[error("the path does not start with /")]
    NotAbsolute,
    /// A `%` not followed by two hexadecimal digits.
    #[error("invalid percent-encoding at byte {0}")]
    BadEncoding(usize),
    /// `%00`.
    #[error("an encoded NUL at byte {0}")]
    Nul(usize),
    /// More `..` segments than segments before them.
    #[error("the path climbs above the root")]
    AboveRoot,
}

/// Normalises `path` (the URL path, without the query). Allocates only when something changes:
/// a path without `%`, `//` and dot segments is its own normal form.
pub fn normalize(path: &str) -> Result<Normalized<'_>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let dot_segment = |segment: &str| segment == "." || segment == "..";
    if !path.contains('%') && !path.contains("//") && !path.split('/').any(dot_segment) {
        return Ok(Normalized { matched: Cow::Borrowed(path), forwarded: Cow::Borrowed(path) });
    }
    let bytes = path.as_bytes();
    let mut matched: Vec<u8> = Vec::with_capacity(path.len());
    let mut forwarded = String::with_capacity(path.len());
    // Whether the output ends in a slash: after an empty, `.` or `..` last segment.
    let mut trailing;
    let mut at = 1;
    loop {
        // One segment: up to `/`, `%2F` or the end; its decoded bytes go to `matched` after a `/`.
        let (start, decoded_start) = (at, matched.len());
        matched.push(b'/');
        let mut separator = 0;
        while at < bytes.len() {
            match bytes[at] {
                b'/' => {
                    separator = 1;
                    break;
                }
                b'%' => match decode_escape(&bytes[at + 1..]) {
                    None => return Err(PathError::BadEncoding(at)),
                    Some(0) => return Err(PathError::Nul(at)),
                    Some(b'/') => {
                        separator = 3;
                        break;
                    }
                    Some(byte) => {
                        matched.push(byte);
                        at += 3;
                    }
                },
                byte => {
                    matched.push(byte);
                    at += 1;
                }
            }
        }
        let last = at >= bytes.len();
        match &matched[decoded_start + 1..] {
            b"" | b"." => {
                matched.truncate(decoded_start);
                trailing = last;
            }
            b".." => {
                matched.truncate(decoded_start);
                // Segments contain no `/` in either form: the last one starts at the last `/`.
                let parent = forwarded.rfind('/').ok_or(PathError::AboveRoot)?;
                forwarded.truncate(parent);
                matched.truncate(matched.iter().rposition(|&b| b == b'/').expect("as many segments as forwarded"));
                trailing = last;
            }
            _ => {
                forwarded.push('/');
                forwarded.push_str(&path[start..at]);
                trailing = false;
            }
        }
        if last {
            break;
        }
        at += separator;
    }
    if trailing || forwarded.is_empty() {
        matched.push(b'/');
        forwarded.push('/');
    }
    let matched = match String::from_utf8(matched) {
        Ok(matched) => matched,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    };
    let forwarded = if forwarded == path { Cow::Borrowed(path) } else { Cow::Owned(forwarded) };
    Ok(Normalized { matched: Cow::Owned(matched), forwarded })
}

/// The byte of the two hexadecimal digits at the start of `digits`, if they are two.
fn decode_escape(digits: &[u8]) -> Option<u8> {
    let hex = |digit: u8| char::from(digit).to_digit(16);
    match digits {
        [high, low, ..] => Some((hex(*high)? * 16 + hex(*low)?) as u8),
        _ => None,
    }
}

/// What the fuzz target (`fuzz/fuzz_targets/path.rs`) and the corpus test check for any input: no
/// panic, and a normal form that is normal (no empty, `.` or `..` segment), stays as it is when
/// normalised again, and whose forwarded form decodes to its matched form.
pub fn check(input: &[u8]) {
    let Ok(path) = std::str::from_utf8(input) else { return };
    let Ok(normal) = normalize(path) else { return };
    for form in [&normal.matched, &normal.forwarded] {
        assert!(form.starts_with('/'), "{path:?} -> {normal:?}");
        let inner = &form[1..form.len() - usize::from(form.len() > 1 && form.ends_with('/'))];
        assert!(form == "/" || inner.split('/').all(|s| !matches!(s, "" | "." | "..")), "{path:?} -> {normal:?}");
    }
    let again = normalize(&normal.forwarded).expect("a forwarded path is valid");
    assert_eq!(again.matched, normal.matched, "{path:?}: the forwarded form decodes to the matched one");
    assert!(matches!(again.forwarded, Cow::Borrowed(_)), "{path:?}: the forwarded form is normal");
}

#[cfg(test)]
#[path = "path_tests.rs"]
mod tests;
