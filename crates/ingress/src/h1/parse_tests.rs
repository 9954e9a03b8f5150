use super::*;

fn fast(head: &str) -> FastRequest {
    match request(head.as_bytes()) {
        RequestHead::Fast(request) => request,
        other => panic!("{head:?}: {other:?}"),
    }
}

fn general(head: &str) -> bool {
    matches!(request(head.as_bytes()), RequestHead::General)
}

#[test]
fn plain_requests_without_a_body_take_the_fast_path() {
    let head = "GET /a?b=c HTTP/1.1\r\nHost: a.example\r\nX-One: 1\r\nX-One: 2\r\n\r\nGET /next";
    let taken = fast(head);
    assert_eq!(taken.len, head.find("GET /next").unwrap());
    assert_eq!((taken.parts.method.as_str(), taken.parts.uri.to_string()), ("GET", "/a?b=c".to_owned()));
    assert_eq!(taken.parts.headers.get_all("x-one").iter().count(), 2);
    assert!(!taken.close);
    assert!(fast("DELETE / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Close\r\n\r\n").close);
    assert!(!fast("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n").close);
    assert!(matches!(request(b"GET / HTTP/1.1\r\nHost: a\r\n"), RequestHead::Partial));
}

#[test]
fn anything_unusual_goes_to_the_general_path() {
    for head in [
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nHost: a\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
        "CONNECT a.example:443 HTTP/1.1\r\nHost: a\r\n\r\n",
        "TRACE / HTTP/1.1\r\nHost: a\r\n\r\n",
        "PURGE / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        "GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        assert!(general(head), "{head:?}");
    }
    let many: String = (0..=MAX_FIELDS).map(|i| format!("X-{i}: v\r\n")).collect();
    assert!(general(&format!("GET / HTTP/1.1\r\n{many}\r\n")));
}

fn final_response(head: &str, method: &Method) -> Result<FinalResponse, BadResponse> {
    match response(head.as_bytes(), method)? {
        ResponseHead::Final(response) => Ok(response),
        other => panic!("{head:?}: {other:?}"),
    }
}

fn framed(head: &str) -> Result<Framing, BadResponse> {
    final_response(head, &Method::GET).map(|response| response.body)
}

#[test]
fn responses_are_framed_as_rfc_9112_says() {
    assert_eq!(framed("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n"), Ok(Framing::Length(12)));
    assert_eq!(framed("HTTP/1.1 200 OK\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n"), Ok(Framing::Length(3)));
    assert_eq!(framed("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"), Ok(Framing::Chunked));
    assert_eq!(framed("HTTP/1.1 200 OK\r\n\r\n"), Ok(Framing::UntilClose));
    assert_eq!(framed("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n"), Ok(Framing::Empty));
    assert_eq!(framed("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"), Ok(Framing::Empty));
    let head = final_response("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", &Method::HEAD).unwrap();
    assert_eq!(head.body, Framing::Empty);
}

#[test]
fn ambiguous_response_framing_is_refused() {
    for (head, err) in [
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", BadResponse::LengthAndEncoding),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", BadResponse::Encoding),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", BadResponse::Encoding),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", BadResponse::Length),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", BadResponse::Length),
        ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", BadResponse::Length),
        ("HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n", BadResponse::Length),
        ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", BadResponse::Length),
        ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", BadResponse::UnaskedSwitch),
        ("HTTP/1.1 099 Odd\r\n\r\n", BadResponse::Status),
    ] {
        assert_eq!(framed(head).unwrap_err(), err, "{head:?}");
    }
    assert!(matches!(framed("HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n"), Err(BadResponse::Malformed(_))));
    let huge = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_RESPONSE_HEAD));
    assert_eq!(response(huge.as_bytes(), &Method::GET).unwrap_err(), BadResponse::TooLarge);
}

#[test]
fn interim_responses_are_skipped_and_reuse_is_known() {
    let head = "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n";
    assert!(matches!(response(head.as_bytes(), &Method::GET), Ok(ResponseHead::Interim(40))));
    let reused = |head: &str| final_response(head, &Method::GET).unwrap().reusable;
    assert!(reused("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
    assert!(!reused("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: Close\r\n\r\n"));
    assert!(!reused("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"));
    assert!(!reused("HTTP/1.1 200 OK\r\n\r\n"));
    // A 204 has no body; one announcing a body anyway will send it, after the response.
    assert!(reused("HTTP/1.1 204 No Content\r\n\r\n"));
    assert!(reused("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"));
    assert!(!reused("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"));
    assert!(!reused("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n"));
    assert!(reused("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"));
    let response = final_response("HTTP/1.1 200 Fine\r\nA: 1\r\nB: 2\r\n\r\n", &Method::GET).unwrap();
    let buf = b"HTTP/1.1 200 Fine\r\nA: 1\r\nB: 2\r\n\r\n";
    assert_eq!(&buf[response.reason.clone()], b"Fine");
    let fields: Vec<_> = response.fields(buf).collect();
    assert_eq!(fields, [(&b"A"[..], &b"1"[..]), (b"B", b"2")]);
    assert_eq!(response.header_map(buf)["b"], "2");
}
