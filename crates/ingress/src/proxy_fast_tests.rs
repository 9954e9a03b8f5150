//! The HTTP/1 fast path over real sockets: scripted raw backends for the framings and failures
//! of endpoint responses, raw clients for pipelining, hand-over, slow heads and `Connection:
//! close`; and the general path's bare endpoint connections (`proxy::wire_body`) under HTTP/2
//! clients, with the same backends.

use super::*;

/// A backend that answers every request head with `answer`, then closes the connection if
/// `close` (without saying so); returns its address and its count of accepted connections.
async fn scripted(answer: &'static [u8], close: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let (listener, addr) = listen().await;
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Relaxed);
            tokio::spawn(async move {
                let mut head = Vec::new();
                while let Ok(byte) = tcp.read_u8().await {
                    head.push(byte);
                    if head.ends_with(b"\r\n\r\n") {
                        head.clear();
                        if tcp.write_all(answer).await.is_err() || close {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// A proxy routing `a.example` to `endpoint`.
async fn proxy_to(endpoint: SocketAddr) -> SocketAddr {
    start(vec![("a.example", "/", target("svc", &[endpoint]))], ProxyConfig::default()).await
}

/// A hyper HTTP/1.1 client connection to `proxy`.
async fn client(proxy: SocketAddr) -> http1::SendRequest<Full<Bytes>> {
    let (sender, connection) = http1::handshake(TokioIo::new(TcpStream::connect(proxy).await.unwrap())).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends `request` on `sender`; returns the status, header fields and body.
async fn on(
    sender: &mut http1::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (StatusCode, HeaderMap, String) {
    sender.ready().await.unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request)).await;
    let (parts, body) = response.expect("answered within 10 s").unwrap().into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn fast_path_rechunks_chunked_bodies_without_extensions_or_trailers() {
    let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\r\n\
        5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    let (endpoint, accepted) = scripted(answer, false).await;
    let proxy = proxy_to(endpoint).await;
    let mut sender = client(proxy).await;
    for _ in 0..3 {
        let (status, headers, body) = on(&mut sender, get("a.example", "/")).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "hello world"));
        assert_eq!(headers["transfer-encoding"], "chunked");
        assert!(!headers.contains_key("x-hop") && !headers.contains_key("x-trailer"), "{headers:?}");
    }
    assert_eq!(accepted.load(Relaxed), 1, "the endpoint connection is reused");

    let (head, mut tcp) = raw(proxy, b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n").await;
    assert!(head.to_ascii_lowercase().contains("transfer-encoding: chunked\r\n"), "{head}");
    let mut body = vec![0; b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".len()];
    tcp.read_exact(&mut body).await.unwrap();
    assert_eq!(body, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
}

#[tokio::test]
async fn fast_path_frames_bodies_that_end_with_the_connection() {
    let (endpoint, accepted) = scripted(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nuntil the end", true).await;
    let proxy = proxy_to(endpoint).await;
    let mut sender = client(proxy).await;
    for _ in 0..2 {
        let (status, headers, body) = on(&mut sender, get("a.example", "/")).await;
        assert_eq!((status, body.as_str(), headers["x-a"].as_bytes()), (StatusCode::OK, "until the end", &b"1"[..]));
    }
    assert_eq!(accepted.load(Relaxed), 2, "such a connection is not reused");
}

#[tokio::test]
async fn fast_path_skips_interim_responses_and_sends_no_body_to_head() {
    let answer = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let proxy = proxy_to(scripted(answer, false).await.0).await;
    assert_eq!(fetch(proxy, get("a.example", "/")).await, (StatusCode::OK, "ok".to_owned()));

    let (endpoint, accepted) = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", false).await;
    let proxy = proxy_to(endpoint).await;
    let mut sender = client(proxy).await;
    for _ in 0..2 {
        let head = Request::head("/").header("host", "a.example").body(Full::default()).unwrap();
        let (status, headers, body) = on(&mut sender, head).await;
        assert_eq!((status, headers["content-length"].as_bytes(), body.as_str()), (StatusCode::OK, &b"1000"[..], ""));
    }
    assert_eq!(accepted.load(Relaxed), 1);
}

#[tokio::test]
async fn fast_path_answers_502_to_ambiguous_framing_and_drops_the_connection() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
        b"not http at all\r\n\r\n",
    ] {
        let (endpoint, accepted) = scripted(answer, false).await;
        let proxy = proxy_to(endpoint).await;
        for _ in 0..2 {
            let (status, _) = fetch(proxy, get("a.example", "/")).await;
            assert_eq!(status, StatusCode::BAD_GATEWAY, "{}", String::from_utf8_lossy(answer));
        }
        assert_eq!(accepted.load(Relaxed), 2, "{}", String::from_utf8_lossy(answer));
    }
    // A body that breaks its chunked coding after the head was passed on: the client connection
    // is cut, not ended as if the body were whole.
    let proxy =
        proxy_to(scripted(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n", false).await.0)
            .await;
    let (head, mut tcp) = raw(proxy, b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert_eq!(rest, b"5\r\nhello\r\n", "no last chunk");
}

#[tokio::test]
async fn fast_path_answers_pipelined_requests_in_order() {
    let proxy = proxy_to(backend("a").await).await;
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    let requests: Vec<u8> =
        (0..3).flat_map(|i| format!("GET /{i} HTTP/1.1\r\nHost: a.example\r\n\r\n").into_bytes()).collect();
    tcp.write_all(&requests).await.unwrap();
    for i in 0..3 {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tcp.read_u8().await.unwrap());
        }
        let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
        let length = head.split("content-length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
        let mut body = vec![0; length];
        tcp.read_exact(&mut body).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["path"], format!("/{i}"));
    }
}

#[tokio::test]
async fn fast_path_hands_the_connection_over_at_a_request_it_does_not_take() {
    let proxy = proxy_to(backend("a").await).await;
    let mut sender = client(proxy).await;
    let (status, _, body) = on(&mut sender, get("a.example", "/first")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let post = Request::post("/body").header("host", "a.example").body(Full::from("hello")).unwrap();
    let (status, _, body) = on(&mut sender, post).await;
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()["body"].clone()), (StatusCode::OK, json!(5)));
    let (status, _, _) = on(&mut sender, get("a.example", "/after")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn fast_path_closes_a_connection_whose_head_trickles_in() {
    let config = ProxyConfig { client_header_timeout: Duration::from_millis(300), ..ProxyConfig::default() };
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], config).await;
    // A first request, so that only the head watchdog can close the connection.
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n").await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tcp.read_u8().await.unwrap());
    }
    let started = Instant::now();
    let trickle = async {
        tcp.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").await?;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tcp.write_all(b"a").await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), io::Error>(())
    };
    let closed = tokio::time::timeout(Duration::from_secs(5), trickle).await;
    assert!(closed.expect("closed within 5 s").is_err());
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
}

#[tokio::test]
async fn fast_path_replaces_reused_connections_the_endpoint_closed() {
    // The endpoint closes every connection after its answer, without saying so.
    let (endpoint, accepted) = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true).await;
    let proxy = proxy_to(endpoint).await;
    let mut sender = client(proxy).await;
    let empty_post = || Request::post("/").header("host", "a.example").body(Full::default()).unwrap();
    for request in [get("a.example", "/"), get("a.example", "/"), empty_post(), empty_post()] {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (status, _, body) = on(&mut sender, request).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }
    assert_eq!(accepted.load(Relaxed), 4);
}

#[tokio::test]
async fn fast_path_closes_when_the_client_asks() {
    let proxy = proxy_to(backend("a").await).await;
    let (head, mut tcp) = raw(proxy, b"GET / HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200 ") && head.contains("connection: close\r\n"), "{head}");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert!(!rest.is_empty());
}

#[tokio::test]
async fn fast_path_times_each_response_anew_on_one_connection() {
    let slow = slow(Duration::from_millis(300)).await;
    let patient = Actions { backend_timeout: Some(Duration::from_secs(5)), ..Actions::default() };
    let routes = vec![
        ("a.example", "/patient", forward_with(target("svc", &[slow]), patient)),
        ("a.example", "/", Decision::Forward(Forward::to(Arc::new(target("svc", &[slow]))))),
    ];
    let config = ProxyConfig { response_timeout: Duration::from_millis(100), ..ProxyConfig::default() };
    let mut sender = client(start_router(Decide::new(routes), config).await).await;
    // A deadline later than the last one, then an earlier one, then a later one again.
    for (path, answer) in
        [("/patient", StatusCode::OK), ("/", StatusCode::GATEWAY_TIMEOUT), ("/patient", StatusCode::OK)]
    {
        let started = Instant::now();
        let (status, _, body) = on(&mut sender, get("a.example", path)).await;
        assert_eq!(status, answer, "{path}: {body}");
        assert!(started.elapsed() < Duration::from_secs(2), "{path}: {:?}", started.elapsed());
    }
}

/// An HTTP/2 client connection (prior knowledge) to `proxy`.
async fn h2_client(proxy: SocketAddr) -> http2::SendRequest<Full<Bytes>> {
    let io = TokioIo::new(TcpStream::connect(proxy).await.unwrap());
    let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends `request` on an HTTP/2 `sender`; returns the status, header fields and body, or the
/// error that reset the stream.
async fn try_h2(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, HeaderMap, Bytes), hyper::Error> {
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request));
    let (parts, body) = response.await.expect("answered within 10 s")?.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(10), body.collect()).await.expect("body within 10 s")?;
    Ok((parts.status, parts.headers, body.to_bytes()))
}

/// [`try_h2`] for a stream that is not reset.
async fn on_h2(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (StatusCode, HeaderMap, Bytes) {
    try_h2(sender, request).await.expect("stream not reset")
}

fn h2_request(method: Method, path: &str) -> Request<Full<Bytes>> {
    Request::builder().method(method).uri(format!("http://a.example{path}")).body(Full::default()).unwrap()
}

#[tokio::test]
async fn http2_requests_without_a_body_take_bare_connections_in_every_framing() {
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\r\n\
        5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    let interim =
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world";
    for (answer, reused) in [(&chunked[..], true), (interim, true), (b"HTTP/1.1 200 OK\r\n\r\nhello world", false)] {
        let (endpoint, accepted) = scripted(answer, !reused).await;
        let mut sender = h2_client(proxy_to(endpoint).await).await;
        for _ in 0..3 {
            let (status, headers, body) = on_h2(&mut sender, h2_request(Method::GET, "/")).await;
            assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello world"[..]));
            assert!(!headers.contains_key("x-hop") && !headers.contains_key("x-trailer"), "{headers:?}");
        }
        let expected = if reused { 1 } else { 3 };
        assert_eq!(accepted.load(Relaxed), expected, "{}", String::from_utf8_lossy(answer));
    }

    // HEAD: no body, the endpoint's length, the connection reused.
    let (endpoint, accepted) = scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", false).await;
    let mut sender = h2_client(proxy_to(endpoint).await).await;
    for _ in 0..2 {
        let (status, headers, body) = on_h2(&mut sender, h2_request(Method::HEAD, "/")).await;
        assert_eq!((status, headers["content-length"].as_bytes(), &body[..]), (StatusCode::OK, &b"1000"[..], &b""[..]));
    }
    assert_eq!(accepted.load(Relaxed), 1);
}

#[tokio::test]
async fn http2_bodies_from_bare_connections_stream_whole() {
    // Several reads from the endpoint: a length of 1 MiB, and as many bytes in 4 KiB chunks.
    let data = vec![b'x'; 1 << 20];
    let mut answers = vec![format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", data.len()).into_bytes()];
    answers[0].extend_from_slice(&data);
    let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in data.chunks(4096) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    answers.push(chunked);
    for answer in answers {
        let (endpoint, accepted) = scripted(answer.leak(), false).await;
        let mut sender = h2_client(proxy_to(endpoint).await).await;
        for _ in 0..2 {
            let (status, _, body) = on_h2(&mut sender, h2_request(Method::GET, "/")).await;
            assert_eq!((status, body.len()), (StatusCode::OK, data.len()));
        }
        assert_eq!(accepted.load(Relaxed), 1);
    }
}

#[tokio::test]
async fn http2_answers_502_to_ambiguous_framing_and_resets_a_broken_body() {
    let (endpoint, accepted) =
        scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false).await;
    let mut sender = h2_client(proxy_to(endpoint).await).await;
    for _ in 0..2 {
        assert_eq!(on_h2(&mut sender, h2_request(Method::GET, "/")).await.0, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(accepted.load(Relaxed), 2);

    for answer in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
    ] {
        let (endpoint, accepted) = scripted(answer, true).await;
        let mut sender = h2_client(proxy_to(endpoint).await).await;
        for _ in 0..2 {
            let reset = try_h2(&mut sender, h2_request(Method::GET, "/")).await;
            assert!(reset.is_err(), "the stream is reset, not ended: {reset:?}");
        }
        assert_eq!(accepted.load(Relaxed), 2);
    }
}

#[tokio::test]
async fn http2_requests_on_bare_connections_get_the_forwarded_fields_and_the_edits() {
    let actions = Actions {
        request_headers: edits(&[("x-added", "1")], &[], &[]),
        response_headers: edits(&[("x-served-by", "roadkeeper")], &[], &["x-backend"]),
        ..Actions::default()
    };
    let routes = vec![("a.example", "/", forward_with(target("svc", &[backend("a").await]), actions))];
    let mut sender = h2_client(start_router(Decide::new(routes), ProxyConfig::default()).await).await;
    let mut request = h2_request(Method::GET, "/path?q=1");
    request.headers_mut().insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
    request.headers_mut().insert("te", HeaderValue::from_static("trailers"));
    let (status, headers, body) = on_h2(&mut sender, request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-served-by"], "roadkeeper");
    assert!(!headers.contains_key("x-backend"), "{headers:?}");
    let reply: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((reply["method"].as_str(), reply["path"].as_str()), (Some("GET"), Some("/path?q=1")));
    let seen = &reply["headers"];
    assert_eq!(seen["host"], "a.example", "the authority becomes Host");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1", "an untrusted client's own is replaced");
    assert_eq!((seen["x-forwarded-proto"].as_str(), seen["x-added"].as_str()), (Some("http"), Some("1")));
    assert!(seen.get("te").is_none(), "{seen}");
}
