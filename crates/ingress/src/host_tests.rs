use super::*;

fn host<'a>(authority: Option<&'a str>, fields: &[&'a str], http11: bool) -> Result<(&'a str, String), HostError> {
    let host = request_host(authority, fields.iter().map(|field| field.as_bytes()), http11)?;
    Ok((host.value, host.name.into_owned()))
}

#[test]
fn host_route_name_strips_the_port_and_lowercases() {
    for (value, name) in [
        ("example.com", "example.com"),
        ("Example.COM:8080", "example.com"),
        ("a.example.", "a.example"),
        ("a.example.:80", "a.example"),
        ("a.example:", "a.example"),
        ("a.example:00080", "a.example"),
        ("a.example:65535", "a.example"),
        ("[::1]:8443", "[::1]"),
        ("[::1]", "[::1]"),
        ("[::FFFF:127.0.0.1]", "[::ffff:127.0.0.1]"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("under_score.example", "under_score.example"),
        ("", ""),
    ] {
        assert_eq!(route_name(value).as_deref(), Ok(name), "{value}");
    }
    assert!(matches!(route_name("a.example:80"), Ok(Cow::Borrowed(_))), "no allocation without uppercase");
}

#[test]
fn host_malformed() {
    for value in [
        "a.example:abc",
        "a.example:65536",
        "a.example:123456",
        "a.example:-1",
        "a.example:80:90",
        "a.example: 80",
        ":80",
        "a..example",
        "a.example/x",
        "a.example\\x",
        "user@a.example",
        "a example",
        "a.example?",
        "a.example#",
        "[::1",
        "[::1]x",
        "[::1]:x",
        "[]",
        "[a.example]",
        "[::1%25eth0]",
        "é.example",
    ] {
        assert_eq!(route_name(value), Err(HostError::Malformed(value.into())), "{value}");
    }
}

#[test]
fn host_authority_over_the_host_field() {
    assert_eq!(host(Some("a.example:8080"), &["b.example"], true), Ok(("a.example:8080", "a.example".into())));
    assert_eq!(host(Some("A.example"), &[], true), Ok(("A.example", "a.example".into())));
    assert_eq!(host(None, &["B.example:80"], true), Ok(("B.example:80", "b.example".into())));
    assert_eq!(host(None, &[], false), Ok(("", String::new())), "HTTP/1.0 and HTTP/2 may have none");
    assert_eq!(host(None, &[""], true), Ok(("", String::new())), "empty is allowed");
}

#[test]
fn host_refusals() {
    assert_eq!(host(None, &[], true), Err(HostError::Missing));
    assert_eq!(host(None, &["a.example", "a.example"], true), Err(HostError::Several));
    assert_eq!(host(Some("a.example"), &["a.example", "b.example"], false), Err(HostError::Several));
    let bad_port = Err(HostError::Malformed("a.example:x".into()));
    assert_eq!(host(None, &["a.example:x"], true), bad_port);
    assert_eq!(host(Some("a.example"), &["a.example:x"], true), bad_port, "checked even when overridden");
    assert_eq!(host(Some("a.example:x"), &[], false), bad_port);
    assert_eq!(host(Some("u@a.example"), &[], false), Err(HostError::Malformed("u@a.example".into())));
    let latin1 = request_host(None, std::iter::once(&b"caf\xe9"[..]), true);
    assert_eq!(latin1, Err(HostError::Malformed("caf\u{FFFD}".into())));
}

#[test]
fn host_every_seed_of_the_fuzz_corpus_passes_the_checks() {
    crate::check_fuzz_corpus("host", check);
}
