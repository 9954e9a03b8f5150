use super::*;

/// `(received, matched, forwarded)`.
const NORMAL_FORMS: &[(&str, &str, &str)] = &[
    // Already normal: borrowed as received, whatever the characters.
    ("/", "/", "/"),
    ("/a/b", "/a/b", "/a/b"),
    ("/a/b/", "/a/b/", "/a/b/"),
    ("/a/b.", "/a/b.", "/a/b."),
    ("/a/.b/..c/...", "/a/.b/..c/...", "/a/.b/..c/..."),
    ("/é/ü", "/é/ü", "/é/ü"),
    // Repeated slashes merge, a trailing one stays.
    ("//", "/", "/"),
    ("//a///b//", "/a/b/", "/a/b/"),
    // Dot segments (RFC 3986 §5.2.4), slashes merged first (as nginx does).
    ("/.", "/", "/"),
    ("/./a", "/a", "/a"),
    ("/a/.", "/a/", "/a/"),
    ("/a/./b", "/a/b", "/a/b"),
    ("/a/..", "/", "/"),
    ("/a/../", "/", "/"),
    ("/a/b/..", "/a/", "/a/"),
    ("/a/b/../c", "/a/c", "/a/c"),
    ("/a/b/../../c/./d/", "/c/d/", "/c/d/"),
    ("/a//../b", "/b", "/b"),
    ("/public/../secret", "/secret", "/secret"),
    // Percent-encodings are decoded for matching, kept as received when forwarded.
    ("/a%20b", "/a b", "/a%20b"),
    ("/%41%62c", "/Abc", "/%41%62c"),
    ("/a%3Fb%23c%25d%2Be", "/a?b#c%d+e", "/a%3Fb%23c%25d%2Be"),
    ("/%25%32%65", "/%2e", "/%25%32%65"),
    ("/caf%C3%A9", "/café", "/caf%C3%A9"),
    ("/%FF", "/\u{FFFD}", "/%FF"),
    // Encoded dots are dot segments, in either case, mixed with plain dots.
    ("/public/%2e%2e/secret", "/secret", "/secret"),
    ("/public/%2E%2e/secret", "/secret", "/secret"),
    ("/public/.%2E/secret", "/secret", "/secret"),
    ("/public/%2e/x", "/public/x", "/public/x"),
    ("/a/%2e%2e", "/", "/"),
    ("/a/%2e", "/a/", "/a/"),
    ("/a%2eb", "/a.b", "/a%2eb"),
    // An encoded slash separates segments in both forms.
    ("/public/a%2Fb", "/public/a/b", "/public/a/b"),
    ("/public/a%2fb", "/public/a/b", "/public/a/b"),
    ("/public%2F..%2Fsecret", "/secret", "/secret"),
    ("/public/..%2Fsecret", "/secret", "/secret"),
    ("/a%2F", "/a/", "/a/"),
    ("/%2F%2Fa", "/a", "/a"),
];

#[test]
fn path_normal_forms() {
    for &(received, matched, forwarded) in NORMAL_FORMS {
        let normal = normalize(received).unwrap_or_else(|err| panic!("{received}: {err}"));
        assert_eq!((&*normal.matched, &*normal.forwarded), (matched, forwarded), "{received}");
        let normal_twice = normalize(&normal.forwarded).unwrap();
        assert_eq!(normal_twice.matched, normal.matched, "{received}: forwarded decodes to matched");
        assert!(matches!(normal_twice.forwarded, Cow::Borrowed(_)), "{received}: forwarded is normal");
    }
}

#[test]
fn path_allocates_only_when_something_changes() {
    for path in ["/", "/a/b/", "/a.b/c..d", "/é"] {
        let normal = normalize(path).unwrap();
        assert!(matches!((normal.matched, normal.forwarded), (Cow::Borrowed(_), Cow::Borrowed(_))), "{path}");
    }
    let decoded = normalize("/a%20b").unwrap();
    assert!(matches!(decoded.forwarded, Cow::Borrowed("/a%20b")), "forwarded as received");
}

#[test]
fn path_errors() {
    for (path, error) in [
        ("", PathError::NotAbsolute),
        ("*", PathError::NotAbsolute),
        ("a/b", PathError::NotAbsolute),
        ("/..", PathError::AboveRoot),
        ("/../a", PathError::AboveRoot),
        ("/a/../..", PathError::AboveRoot),
        ("/a/../../b", PathError::AboveRoot),
        ("/%2e%2e", PathError::AboveRoot),
        ("/a/%2e%2e/%2E%2E/", PathError::AboveRoot),
        ("/a%2F..%2F..", PathError::AboveRoot),
        ("/%zz", PathError::BadEncoding(1)),
        ("/a%", PathError::BadEncoding(2)),
        ("/a%2", PathError::BadEncoding(2)),
        ("/a%2g", PathError::BadEncoding(2)),
        ("/a%%41", PathError::BadEncoding(2)),
        ("/a%00", PathError::Nul(2)),
        ("/%00/..", PathError::Nul(1)),
        ("/a/%2e%2e%00", PathError::Nul(9)),
    ] {
        assert_eq!(normalize(path), Err(error), "{path:?}");
    }
}

#[test]
fn path_every_seed_of_the_fuzz_corpus_passes_the_checks() {
    crate::check_fuzz_corpus("path", check);
}
