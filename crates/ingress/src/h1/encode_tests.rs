use hyper::header::{HOST, HeaderValue};
use hyper::{Method, Request};

use super::*;

#[test]
fn chunks_carry_their_length_in_hex() {
    let mut out = Vec::new();
    chunk(b"", &mut out);
    assert!(out.is_empty());
    chunk(&[b'x'; 26], &mut out);
    chunk(b"a", &mut out);
    assert_eq!(out, [&b"1a\r\n"[..], &[b'x'; 26], b"\r\n1\r\na\r\n"].concat());
}

#[test]
fn heads_are_written_with_their_fields() {
    let mut parts = Request::new(()).into_parts().0;
    parts.method = Method::DELETE;
    parts.uri = "/a?b".parse().unwrap();
    parts.headers.insert(HOST, HeaderValue::from_static("a.example"));
    let mut out = Vec::new();
    request_head(&parts, &mut out);
    assert_eq!(out, b"DELETE /a?b HTTP/1.1\r\nhost: a.example\r\n\r\n");

    let fields = [(&b"Date"[..], &b"then"[..]), (b"X-A", b"1")];
    out.clear();
    response_head(StatusCode::OK, b"Fine", fields.into_iter(), Body::Chunked, true, &mut out);
    let head = "HTTP/1.1 200 Fine\r\ndate: then\r\nx-a: 1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    assert_eq!(String::from_utf8(out.clone()).unwrap(), head);
    out.clear();
    response_head(StatusCode::NOT_FOUND, b"", std::iter::empty(), Body::Length(3), false, &mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("HTTP/1.1 404 Not Found\r\ndate: ") && text.ends_with(" GMT\r\ncontent-length: 3\r\n\r\n"),
        "{text}"
    );
}

#[test]
fn hop_by_hop_fields_stay_behind() {
    let fields = [
        (&b"Content-Type"[..], &b"text/plain"[..]),
        (b"Connection", b"keep-alive, X-Secret"),
        (b"Keep-Alive", b"timeout=5"),
        (b"x-secret", b"1"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Proxy-Authenticate", b"Basic"),
        (b"Upgrade", b"h2c"),
        (b"X-Kept", b"2"),
    ];
    let kept: Vec<_> = end_to_end(fields.into_iter()).map(|(name, _)| name).collect();
    assert_eq!(kept, [&b"Content-Type"[..], b"X-Kept"]);
}
