//! The proxy over real sockets on 127.0.0.1: a fixture router, small hyper backends, raw TCP and
//! hyper clients, rustls with certificates from rcgen.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1, http2};
use hyper::header::{CONNECTION, UPGRADE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use roadkeeper_cluster::NamespacedName;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::*;
use crate::decision::Actions;

/// Routes by exact host and path prefix; the first match wins.
struct Fixture(Vec<(&'static str, &'static str, Target)>);

impl Router for Fixture {
    fn route(&self, request: &decision::Request<'_>) -> Option<Decision> {
        let matches = |(host, prefix, _): &&(_, &str, _)| *host == request.host && request.path.starts_with(prefix);
        let (_, _, target) = self.0.iter().find(matches)?;
        Some(Decision::Forward(Forward::to(Arc::new(target.clone()))))
    }
}

fn target(service: &str, endpoints: &[SocketAddr]) -> Target {
    Target {
        ingress: NamespacedName::new("default", "web"),
        service: NamespacedName::new("default", service),
        endpoints: endpoints.into(),
    }
}

async fn listen() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// An address where nothing listens.
async fn dead() -> SocketAddr {
    listen().await.1
}

/// A backend that accepts connections and never answers.
async fn silent() -> SocketAddr {
    let (listener, addr) = listen().await;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok(connection) = listener.accept().await {
            held.push(connection);
        }
    });
    addr
}

/// An HTTP/1.1 backend that answers with JSON: its name, the method, the target, the request
/// headers and the body length (after reading the whole body), and its name in `X-Backend`. An
/// `Upgrade` request gets `101`, then every byte echoed.
async fn backend(name: &'static str) -> SocketAddr {
    let (listener, addr) = listen().await;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let service = service_fn(move |request| echo(name, request));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).with_upgrades(),
            );
        }
    });
    addr
}

async fn echo(name: &str, mut request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if request.headers().contains_key(UPGRADE) {
        let upgraded = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded.await.unwrap()));
            tokio::io::copy(&mut reader, &mut writer).await
        });
        let response = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        return Ok(response.header(UPGRADE, "echo").header(CONNECTION, "upgrade").body(Full::default()).unwrap());
    }
    // Fields of one name joined by commas.
    let value =
        |name| request.headers().get_all(name).iter().map(|v| v.to_str().unwrap()).collect::<Vec<_>>().join(",");
    let headers: serde_json::Map<String, Value> =
        request.headers().keys().map(|name| (name.to_string(), json!(value(name)))).collect();
    let (method, path) = (request.method().to_string(), request.uri().to_string());
    let body = request.into_body().collect().await?.to_bytes();
    let reply = json!({"backend": name, "method": method, "path": path, "headers": headers, "body": body.len()});
    let mut response = Response::new(Full::new(Bytes::from(reply.to_string())));
    response.headers_mut().insert("x-backend", HeaderValue::from_str(name).unwrap());
    Ok(response)
}

/// Serves `routes` with [`serve_http`]; returns the proxy's address.
async fn start(routes: Vec<(&'static str, &'static str, Target)>, config: ProxyConfig) -> SocketAddr {
    let (listener, addr) = listen().await;
    tokio::spawn(serve_http(Proxy::new(Arc::new(Fixture(routes)), config), listener, std::future::pending()));
    addr
}

fn get(host: &str, path: &str) -> Request<Full<Bytes>> {
    Request::get(path).header("host", host).body(Full::default()).unwrap()
}

/// Sends one request on a new HTTP/1.1 (or HTTP/2) connection over `io`; returns the status,
/// the body as text and the response's version.
async fn send<IO>(io: IO, http2: bool, request: Request<Full<Bytes>>) -> (StatusCode, String, Version)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let response = if http2 {
        let (mut sender, connection) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    } else {
        let (mut sender, connection) = http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    };
    let (status, version) = (response.status(), response.version());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap(), version)
}

/// [`send`] over plain HTTP/1.1.
async fn fetch(proxy: SocketAddr, request: Request<Full<Bytes>>) -> (StatusCode, String) {
    let (status, body, _) = send(TcpStream::connect(proxy).await.unwrap(), false, request).await;
    (status, body)
}

/// The JSON of a `200` from [`backend`].
async fn fetch_ok(proxy: SocketAddr, request: Request<Full<Bytes>>) -> Value {
    let (status, body) = fetch(proxy, request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Writes `request` on a new connection and reads the response head; returns it and the stream.
async fn raw(proxy: SocketAddr, request: &[u8]) -> (String, TcpStream) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    // The proxy may answer and close before reading everything: a failed write is fine.
    let _ = tcp.write_all(request).await;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tcp.read_u8().await.unwrap();
        head.push(byte);
    }
    (String::from_utf8(head).unwrap(), tcp)
}

#[tokio::test]
async fn proxy_routes_by_host_and_path_and_answers_404() {
    let (a, b) = (backend("a").await, backend("b").await);
    let routes = vec![("a.example", "/", target("svc-a", &[a])), ("b.example", "/b", target("svc-b", &[b]))];
    let proxy = start(routes, ProxyConfig::default()).await;

    let reply = fetch_ok(proxy, get("a.example", "/x?q=1")).await;
    assert_eq!((reply["backend"].as_str(), reply["method"].as_str()), (Some("a"), Some("GET")));
    assert_eq!(reply["path"], "/x?q=1");
    let reply = fetch_ok(proxy, get("B.Example:8080", "/b/c")).await;
    assert_eq!(reply["backend"], "b");
    assert_eq!(reply["headers"]["host"], "B.Example:8080");

    let (status, body) = fetch(proxy, get("b.example", "/a")).await;
    assert_eq!((status, body.as_str()), (StatusCode::NOT_FOUND, "no route for this host and path\n"));
    let (status, _) = fetch(proxy, get("c.example", "/")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn proxy_answers_503_without_endpoints() {
    let proxy = start(vec![("a.example", "/", target("empty", &[]))], ProxyConfig::default()).await;
    let (status, body) = fetch(proxy, get("a.example", "/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "no ready endpoints for default/empty\n"));
}

#[tokio::test]
async fn proxy_balances_round_robin() {
    let (a, b) = (backend("a").await, backend("b").await);
    let proxy = start(vec![("a.example", "/", target("svc", &[a, b]))], ProxyConfig::default()).await;
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(fetch_ok(proxy, get("a.example", "/")).await["backend"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, ["a", "b", "a", "b", "a", "b"]);
}

#[tokio::test]
async fn proxy_retries_connect_failures_and_ejects_the_dead_endpoint() {
    let (dead, alive) = (dead().await, backend("alive").await);
    let router = Arc::new(Fixture(vec![("a.example", "/", target("svc", &[dead, alive]))]));
    let proxy = Proxy::new(router, ProxyConfig::default());
    let (listener, addr) = listen().await;
    tokio::spawn(serve_http(proxy.clone(), listener, std::future::pending()));

    // Round robin sends every other request to `dead`: each is retried on `alive`.
    for _ in 0..12 {
        assert_eq!(fetch_ok(addr, get("a.example", "/")).await["backend"], "alive");
    }
    // Three failures ejected it; the three later turns skipped it.
    let failing = proxy.health.failing.load();
    assert_eq!(failing[&dead].count.load(Relaxed), 3);
    assert_eq!(proxy.health.pick(&[dead, alive], 0, None), Some(1));
}

#[test]
fn proxy_health_ejects_for_a_while_and_forgets_on_success() {
    let config = ProxyConfig { eject_for: Duration::from_millis(50), ..ProxyConfig::default() };
    let health = Health::new(&config);
    let endpoints: [SocketAddr; 2] = ["127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()];
    for _ in 0..2 {
        health.failed(endpoints[0]);
    }
    assert_eq!(health.pick(&endpoints, 0, None), Some(0), "two failures do not eject");
    health.failed(endpoints[0]);
    assert_eq!(health.pick(&endpoints, 0, None), Some(1));
    assert_eq!(health.pick(&endpoints, 1, Some(1)), Some(0), "all others ejected: try it anyway");
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(health.pick(&endpoints, 0, None), Some(0), "ejection expired");
    health.failed(endpoints[0]);
    assert_eq!(health.pick(&endpoints, 0, None), Some(1), "one more failure ejects it again");
    health.succeeded(endpoints[0]);
    assert!(health.failing.load().is_empty());
}

#[tokio::test]
async fn proxy_answers_502_when_every_endpoint_refuses() {
    let (one, two) = (dead().await, dead().await);
    let proxy = start(vec![("a.example", "/", target("svc", &[one, two]))], ProxyConfig::default()).await;
    let (status, body) = fetch(proxy, get("a.example", "/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_GATEWAY, "upstream connect error\n"));
}

#[tokio::test]
async fn proxy_answers_504_when_the_endpoint_does_not_answer() {
    let config = ProxyConfig { response_timeout: Duration::from_millis(300), ..ProxyConfig::default() };
    let proxy = start(vec![("a.example", "/", target("svc", &[silent().await]))], config).await;
    let (status, body) = fetch(proxy, get("a.example", "/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream response timeout\n"));
}

#[tokio::test]
async fn proxy_sets_forwarded_headers_and_drops_hop_by_hop_ones() {
    let a = backend("a").await;
    let request = || {
        Request::get("/")
            .header("host", "A.example:8080")
            .header("x-forwarded-for", "203.0.113.7")
            .header("x-forwarded-proto", "https")
            .header("connection", "x-hop")
            .header("x-hop", "1")
            .header("keep-alive", "timeout=5")
            .header("te", "trailers")
            .body(Full::default())
            .unwrap()
    };
    let proxy = start(vec![("a.example", "/", target("svc", &[a]))], ProxyConfig::default()).await;
    let headers = fetch_ok(proxy, request()).await["headers"].take();
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "the client's own value is replaced");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-forwarded-host"], "A.example:8080");
    assert_eq!(headers["x-real-ip"], "127.0.0.1");
    assert_eq!(headers["host"], "A.example:8080");
    for hop in ["connection", "x-hop", "keep-alive", "te"] {
        assert!(headers.get(hop).is_none(), "{hop} forwarded: {headers}");
    }

    // From a trusted proxy, its claims stand.
    let config = ProxyConfig { trusted_proxies: vec!["127.0.0.0/8".parse().unwrap()], ..ProxyConfig::default() };
    let proxy = start(vec![("a.example", "/", target("svc", &[a]))], config).await;
    let headers = fetch_ok(proxy, request()).await["headers"].take();
    assert_eq!(headers["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(headers["x-real-ip"], "203.0.113.7");
    assert_eq!(headers["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn proxy_tunnels_upgrades() {
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], ProxyConfig::default()).await;
    let request = b"GET /ws HTTP/1.1\r\nHost: a.example\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
    let (head, mut tcp) = raw(proxy, request).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(head.to_ascii_lowercase().contains("upgrade: echo\r\n"), "{head}");
    for message in [&b"ping"[..], b"pong!"] {
        tcp.write_all(message).await.unwrap();
        let mut echoed = vec![0; message.len()];
        tcp.read_exact(&mut echoed).await.unwrap();
        assert_eq!(echoed, message);
    }
}

#[tokio::test]
async fn proxy_closes_idle_connections_and_tunnels() {
    let config = ProxyConfig { idle_timeout: Duration::from_millis(200), ..ProxyConfig::default() };
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], config).await;
    let closed = |mut tcp: TcpStream| async move {
        let read = tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut [0; 1])).await;
        assert_eq!(read.expect("closed within 2 s").unwrap(), 0);
    };
    closed(TcpStream::connect(proxy).await.unwrap()).await;

    let request = b"GET /ws HTTP/1.1\r\nHost: a.example\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n";
    let (head, tcp) = raw(proxy, request).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    closed(tcp).await;
}

#[tokio::test]
async fn proxy_limits_the_request_body() {
    let config = ProxyConfig { max_request_body: Some(1024), ..ProxyConfig::default() };
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], config).await;
    let post = |size: usize| Request::post("/").header("host", "a.example").body(Full::from(vec![b'x'; size])).unwrap();

    assert_eq!(fetch_ok(proxy, post(1024)).await["body"], 1024);
    let (status, body) = fetch(proxy, post(1025)).await;
    assert_eq!((status, body.as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"));

    // Without Content-Length: cut off while streaming.
    let mut chunked = b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        chunked.extend_from_slice(b"200\r\n");
        chunked.extend_from_slice(&[b'x'; 0x200]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (head, _) = raw(proxy, &chunked).await;
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
}

#[tokio::test]
async fn proxy_answers_431_for_too_many_headers() {
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], ProxyConfig::default()).await;
    let mut request = get("a.example", "/");
    for i in 0..150 {
        request.headers_mut().insert(HeaderName::try_from(format!("x-h{i}")).unwrap(), HeaderValue::from_static("1"));
    }
    let (http1, _) = fetch(proxy, request.clone()).await;
    assert_eq!(http1, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    // HTTP/2 with prior knowledge: our own check.
    *request.uri_mut() = "http://a.example/".parse().unwrap();
    request.headers_mut().remove("host");
    let (http2, body, _) = send(TcpStream::connect(proxy).await.unwrap(), true, request).await;
    assert_eq!(
        (http2, body.as_str()),
        (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "too many request header fields\n")
    );
}

/// A test CA and certificates it signs, with their subject (CN) set to their host.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "roadkeeper test CA");
        Self { ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    /// A certificate for `host`: its DER, and the `(host, tls.crt, tls.key)` entry for it.
    fn issue(&self, host: &str) -> (CertificateDer<'static>, (String, Vec<u8>, Vec<u8>)) {
        let mut params = CertificateParams::new(vec![host.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, host);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.der().clone(), (host.to_owned(), cert.pem().into_bytes(), key.serialize_pem().into_bytes()))
    }

    /// A client trusting the CA, offering `alpn`.
    fn client(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

/// Serves `routes` with [`serve_https`] and `certificates`; returns the proxy's address.
async fn start_tls(routes: Vec<(&'static str, &'static str, Target)>, certificates: Arc<Certificates>) -> SocketAddr {
    let (listener, addr) = listen().await;
    let proxy = Proxy::new(Arc::new(Fixture(routes)), ProxyConfig::default());
    tokio::spawn(serve_https(proxy, listener, certificates, std::future::pending()));
    addr
}

async fn handshake(client: &TlsConnector, proxy: SocketAddr, sni: &str) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(proxy).await?;
    client.connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp).await
}

fn presented(tls: &TlsStream<TcpStream>) -> &CertificateDer<'static> {
    &tls.get_ref().1.peer_certificates().unwrap()[0]
}

#[tokio::test]
async fn tls_picks_the_certificate_by_sni() {
    let pki = Pki::new();
    let (a_der, a_entry) = pki.issue("a.example");
    let (b_der, b_entry) = pki.issue("*.b.example");
    let certificates = Arc::new(Certificates::new());
    assert_eq!(certificates.update(vec![a_entry, b_entry]), Vec::<String>::new());
    let routes = vec![("a.example", "/", target("svc", &[backend("a").await]))];
    let proxy = start_tls(routes, certificates).await;
    let client = pki.client(&[b"http/1.1"]);

    let tls = handshake(&client, proxy, "a.example").await.unwrap();
    assert_eq!(presented(&tls), &a_der);
    let (status, body, _) = send(tls, false, get("a.example", "/")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["headers"]["x-forwarded-proto"], "https");

    let tls = handshake(&client, proxy, "x.b.example").await.unwrap();
    assert_eq!(presented(&tls), &b_der);
    for unknown in ["c.example", "y.x.b.example", "b.example"] {
        assert!(handshake(&client, proxy, unknown).await.is_err(), "{unknown}");
    }
}

#[tokio::test]
async fn tls_serves_http2_by_alpn() {
    let pki = Pki::new();
    let (_, entry) = pki.issue("a.example");
    let certificates = Arc::new(Certificates::new());
    certificates.update(vec![entry]);
    let proxy = start_tls(vec![("a.example", "/", target("svc", &[backend("a").await]))], certificates).await;

    let tls = handshake(&pki.client(&[b"h2", b"http/1.1"]), proxy, "a.example").await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let request = Request::get("https://a.example/h2?x").body(Full::default()).unwrap();
    let (status, body, version) = send(tls, true, request).await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_2));
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["path"], "/h2?x");
    assert_eq!(reply["headers"]["host"], "a.example");
    assert_eq!(reply["headers"]["x-forwarded-host"], "a.example");
}

#[tokio::test]
async fn tls_update_swaps_certificates_for_new_handshakes() {
    let pki = Pki::new();
    let (old_der, old_entry) = pki.issue("a.example");
    let (new_der, new_entry) = pki.issue("a.example");
    let certificates = Arc::new(Certificates::new());
    certificates.update(vec![old_entry]);
    let proxy = start_tls(vec![("a.example", "/", target("svc", &[backend("a").await]))], certificates.clone()).await;
    let client = pki.client(&[b"http/1.1"]);

    let before = handshake(&client, proxy, "a.example").await.unwrap();
    assert_eq!(presented(&before), &old_der);
    certificates.update(vec![new_entry]);
    let after = handshake(&client, proxy, "a.example").await.unwrap();
    assert_eq!(presented(&after), &new_der);
    // The connection made before the swap still works.
    assert_eq!(send(before, false, get("a.example", "/")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn proxy_stops_accepting_then_finishes_requests_in_flight() {
    // A backend that answers after 300 ms.
    let (listener, backend) = listen().await;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let service = service_fn(|_request| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"late"))))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service));
        }
    });
    let proxy =
        Proxy::new(Arc::new(Fixture(vec![("a.example", "/", target("svc", &[backend]))])), ProxyConfig::default());
    let (listener, addr) = listen().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_http(proxy, listener, async move { stopped.await.unwrap_or(()) }));

    let in_flight = tokio::spawn(fetch(addr, get("a.example", "/")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
    assert!(!server.is_finished(), "a request is still in flight");
    assert_eq!(in_flight.await.unwrap(), (StatusCode::OK, "late".to_owned()));
    tokio::time::timeout(Duration::from_secs(2), server).await.expect("drained").unwrap();
}

#[tokio::test]
async fn proxy_streams_large_bodies_both_ways_and_reuses_the_connection() {
    // A backend that counts its connections and answers with a body of the size asked for in the
    // path, after reading the whole request body.
    let (listener, backend) = listen().await;
    let connections = Arc::new(AtomicUsize::new(0));
    let accepted = connections.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            accepted.fetch_add(1, Relaxed);
            let service = service_fn(|request: Request<Incoming>| async move {
                let size: usize = request.uri().path()[1..].parse().unwrap();
                let received = request.into_body().collect().await.unwrap().to_bytes().len();
                let mut body = vec![b'y'; size];
                body[..8].copy_from_slice(&(received as u64).to_be_bytes());
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service));
        }
    });
    let proxy = start(vec![("a.example", "/", target("svc", &[backend]))], ProxyConfig::default()).await;
    let mut client: http1::SendRequest<Full<Bytes>> = {
        let (sender, connection) =
            http1::handshake(TokioIo::new(TcpStream::connect(proxy).await.unwrap())).await.unwrap();
        tokio::spawn(connection);
        sender
    };
    for (up, down) in [(3 << 20, 8 << 20), (0, 5 << 20), (1 << 20, 16)] {
        let request = Request::post(format!("/{down}")).header("host", "a.example").body(Full::from(vec![b'x'; up]));
        let response = client.send_request(request.unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), down);
        assert_eq!(u64::from_be_bytes(body[..8].try_into().unwrap()), up as u64, "request body received");
    }
    assert_eq!(connections.load(Relaxed), 1, "one backend connection, reused");
}

#[tokio::test]
async fn proxy_routes_and_forwards_the_normalised_path() {
    let routes = vec![("a.example", "/b", target("svc-b", &[backend("b").await]))];
    let proxy = start(routes, ProxyConfig::default()).await;
    for (path, forwarded) in [("/b/c", "/b/c"), ("/a/../b", "/b"), ("/a/%2e%2E/b/x%3F?q=/../", "/b/x%3F?q=/../")] {
        assert_eq!(fetch_ok(proxy, get("a.example", path)).await["path"], forwarded, "HTTP/1.1 {path}");
        let request = Request::get(format!("http://a.example{path}")).body(Full::default()).unwrap();
        let (status, body, _) = send(TcpStream::connect(proxy).await.unwrap(), true, request).await;
        assert_eq!(status, StatusCode::OK, "HTTP/2 {path}: {body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["path"], forwarded, "HTTP/2 {path}");
    }
    for (path, status) in [("/b/../a", StatusCode::NOT_FOUND), ("/b/../..", StatusCode::BAD_REQUEST)] {
        assert_eq!(fetch(proxy, get("a.example", path)).await.0, status, "{path}");
    }
}

#[tokio::test]
async fn proxy_answers_405_to_connect_and_trace() {
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], ProxyConfig::default()).await;
    for request in [
        &b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n"[..],
        b"TRACE / HTTP/1.1\r\nHost: a.example\r\n\r\n",
    ] {
        let (head, _) = raw(proxy, request).await;
        assert!(head.starts_with("HTTP/1.1 405 "), "{head}");
        assert!(head.to_ascii_lowercase().contains("allow: get, head, post"), "{head}");
    }
}

#[tokio::test]
async fn proxy_closes_connections_that_send_no_request() {
    let config = ProxyConfig { client_header_timeout: Duration::from_millis(200), ..ProxyConfig::default() };
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], config).await;
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut [0; 1])).await;
    assert_eq!(read.expect("closed before the idle timeout").unwrap(), 0);
}

/// What a [`Decide`] router was asked.
#[derive(Clone, Debug)]
struct Seen {
    local: SocketAddr,
    tls: bool,
    host: String,
    path: String,
    query: Option<String>,
    method: Method,
    headers: HeaderMap,
}

/// Decides by exact host and path prefix (the first match wins) and records every request.
struct Decide {
    routes: Vec<(&'static str, &'static str, Decision)>,
    seen: std::sync::Mutex<Vec<Seen>>,
}

impl Decide {
    fn new(routes: Vec<(&'static str, &'static str, Decision)>) -> Arc<Self> {
        Arc::new(Self { routes, seen: Default::default() })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Router for Decide {
    fn route(&self, request: &decision::Request<'_>) -> Option<Decision> {
        self.seen.lock().unwrap().push(Seen {
            local: request.local,
            tls: request.tls,
            host: request.host.to_owned(),
            path: request.path.to_owned(),
            query: request.query.map(str::to_owned),
            method: request.method.clone(),
            headers: request.headers.clone(),
        });
        let matches = |(host, prefix, _): &&(_, &str, _)| *host == request.host && request.path.starts_with(prefix);
        self.routes.iter().find(matches).map(|(_, _, decision)| decision.clone())
    }
}

/// Serves `router` with [`serve_http`]; returns the proxy's address.
async fn start_router(router: Arc<Decide>, config: ProxyConfig) -> SocketAddr {
    let (listener, addr) = listen().await;
    tokio::spawn(serve_http(Proxy::new(router, config), listener, std::future::pending()));
    addr
}

/// Forwarding to `target` with `actions`.
fn forward_with(target: Target, actions: Actions) -> Decision {
    Decision::Forward(Forward { actions: Some(Arc::new(actions)), ..Forward::to(Arc::new(target)) })
}

fn edits(
    set: &[(&'static str, &'static str)],
    add: &[(&'static str, &'static str)],
    remove: &[&'static str],
) -> HeaderEdits {
    let pairs = |pairs: &[(&'static str, &'static str)]| {
        pairs.iter().map(|&(name, value)| (HeaderName::from_static(name), HeaderValue::from_static(value))).collect()
    };
    HeaderEdits {
        set: pairs(set),
        add: pairs(add),
        remove: remove.iter().map(|&name| HeaderName::from_static(name)).collect(),
    }
}

/// Sends one request on a new HTTP/1.1 connection; returns the status, the header fields and
/// the body as text.
async fn exchange(proxy: SocketAddr, request: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, String) {
    let (mut sender, connection) =
        http1::handshake(TokioIo::new(TcpStream::connect(proxy).await.unwrap())).await.unwrap();
    tokio::spawn(connection);
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request)).await;
    let (parts, body) = response.expect("answered within 10 s").unwrap().into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(body.to_vec()).unwrap())
}

/// A backend that answers `after` each request head.
async fn slow(after: Duration) -> SocketAddr {
    let (listener, addr) = listen().await;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let service = service_fn(move |_request| async move {
                tokio::time::sleep(after).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"slow"))))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service));
        }
    });
    addr
}

/// A backend that answers as [`backend`] does and also sends each answer's JSON to the receiver.
async fn recorder(name: &'static str) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let (listener, addr) = listen().await;
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let sender = sender.clone();
            let service = service_fn(move |request| {
                let sender = sender.clone();
                async move {
                    let response = echo(name, request).await?;
                    let (parts, body) = response.into_parts();
                    let body = body.collect().await.unwrap().to_bytes();
                    let _ = sender.send(serde_json::from_slice::<Value>(&body).unwrap());
                    Ok::<_, hyper::Error>(Response::from_parts(parts, Full::new(body)))
                }
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service));
        }
    });
    (addr, receiver)
}

/// A backend that accepts connections, counts them and never answers.
async fn counting_silent() -> (SocketAddr, Arc<AtomicUsize>) {
    let (listener, addr) = listen().await;
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok(connection) = listener.accept().await {
            counted.fetch_add(1, Relaxed);
            held.push(connection);
        }
    });
    (addr, count)
}

#[tokio::test]
async fn router_sees_the_local_address_and_the_checked_request() {
    let router = Decide::new(vec![]);
    let proxy = start_router(router.clone(), ProxyConfig::default()).await;
    let request = Request::post("/a/./b%2Fc/../d?x=%2F&y").header("host", "A.Example:8080").header("x-one", "1");
    let (status, _, _) = exchange(proxy, request.body(Full::default()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no decision is 404");
    let seen = router.seen().pop().unwrap();
    assert_eq!((seen.local, seen.tls), (proxy, false));
    assert_eq!(
        (seen.host.as_str(), seen.path.as_str(), seen.query.as_deref()),
        ("a.example", "/a/b/d", Some("x=%2F&y"))
    );
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.headers.get("x-one").unwrap(), "1");
    assert!(!seen.headers.contains_key(header::HOST), "the host is `host`");
}

#[tokio::test]
async fn respond_redirects_and_answers_errors_itself() {
    let redirect = Decision::Respond {
        route: "default/redirect".into(),
        status: StatusCode::FOUND,
        headers: vec![(header::LOCATION, HeaderValue::from_static("https://b.example/new?q=1"))],
    };
    let broken = Decision::Respond {
        route: "default/broken".into(),
        status: StatusCode::INTERNAL_SERVER_ERROR,
        headers: Vec::new(),
    };
    let preflight = Decision::Respond {
        route: "default/cors".into(),
        status: StatusCode::NO_CONTENT,
        headers: vec![
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("https://c.example")),
            (header::VARY, HeaderValue::from_static("Origin")),
        ],
    };
    let proxy = start_router(
        Decide::new(vec![("a.example", "/old", redirect), ("a.example", "/", broken), ("c.example", "/", preflight)]),
        ProxyConfig::default(),
    )
    .await;

    let (status, headers, body) = exchange(proxy, get("a.example", "/old/x")).await;
    assert_eq!((status, body.as_str()), (StatusCode::FOUND, "found\n"));
    assert_eq!(headers[header::LOCATION], "https://b.example/new?q=1");
    let (status, headers, body) = exchange(proxy, get("a.example", "/x")).await;
    assert_eq!((status, body.as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "internal server error\n"));
    assert!(!headers.contains_key(header::LOCATION));
    let (status, headers, body) = exchange(proxy, get("c.example", "/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::NO_CONTENT, ""), "204: no body");
    assert_eq!(headers[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://c.example");
    assert_eq!(headers[header::VARY], "Origin");
}

#[tokio::test]
async fn forward_edits_the_request_headers_before_setting_the_forwarded_ones() {
    let actions = Actions {
        request_headers: edits(
            &[("x-set", "new"), ("x-real-ip", "198.51.100.1"), ("content-length", "99")],
            &[("x-add", "2"), ("x-added", "a")],
            &["x-remove"],
        ),
        ..Actions::default()
    };
    let routes = vec![("a.example", "/", forward_with(target("svc", &[backend("a").await]), actions))];
    let proxy = start_router(Decide::new(routes), ProxyConfig::default()).await;
    let request = Request::post("/")
        .header("host", "a.example")
        .header("x-set", "old")
        .header("x-add", "1")
        .header("x-remove", "gone")
        .header("x-kept", "k")
        .body(Full::from(&b"body"[..]))
        .unwrap();
    let (status, _, body) = exchange(proxy, request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    let headers = &reply["headers"];
    assert_eq!(
        (&headers["x-set"], &headers["x-add"], &headers["x-added"]),
        (&json!("new"), &json!("1,2"), &json!("a"))
    );
    assert!(headers.get("x-remove").is_none(), "{headers}");
    assert_eq!(headers["x-kept"], "k");
    assert_eq!(headers["x-real-ip"], "127.0.0.1", "ours, set after the edits");
    assert_eq!((&headers["content-length"], &reply["body"]), (&json!("4"), &json!(4)), "the framing is kept");
}

#[tokio::test]
async fn forward_edits_the_response_headers() {
    let actions = Actions {
        response_headers: edits(
            &[("x-served-by", "roadkeeper"), ("content-length", "1")],
            &[("x-served-by", "again")],
            &["x-backend"],
        ),
        ..Actions::default()
    };
    let routes = vec![("a.example", "/", forward_with(target("svc", &[backend("a").await]), actions))];
    let proxy = start_router(Decide::new(routes), ProxyConfig::default()).await;
    let (status, headers, body) = exchange(proxy, get("a.example", "/")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.get_all("x-served-by").iter().collect::<Vec<_>>(), ["roadkeeper", "again"]);
    assert!(!headers.contains_key("x-backend"), "{headers:?}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["backend"], "a", "the whole body, whatever the edits say");

    // Without actions, the backend's fields come through.
    let proxy = start(vec![("a.example", "/", target("svc", &[backend("a").await]))], ProxyConfig::default()).await;
    let (_, headers, _) = exchange(proxy, get("a.example", "/")).await;
    assert_eq!(headers["x-backend"], "a");
    assert!(!headers.contains_key("x-served-by"));
}

#[tokio::test]
async fn forward_rewrites_the_path_and_host_and_keeps_the_query() {
    let a = backend("a").await;
    let rewrite = |path: &str, host: Option<&'static str>| {
        Decision::Forward(Forward {
            path: Some(path.to_owned()),
            host: host.map(HeaderValue::from_static),
            ..Forward::to(Arc::new(target("svc", &[a])))
        })
    };
    let routes = vec![
        ("a.example", "/old", rewrite("/new/p a?%", Some("b.example"))),
        ("a.example", "/path-only", rewrite("/plain", None)),
        ("a.example", "/", Decision::Forward(Forward::to(Arc::new(target("svc", &[a]))))),
    ];
    let proxy = start_router(Decide::new(routes), ProxyConfig::default()).await;

    let reply = fetch_ok(proxy, get("a.example:8080", "/old/x?q=1&r=%2F")).await;
    assert_eq!(reply["path"], "/new/p%20a%3F%25?q=1&r=%2F", "the decoded path encoded, the query as received");
    assert_eq!(reply["headers"]["host"], "b.example");
    assert_eq!(reply["headers"]["x-forwarded-host"], "a.example:8080", "the client's host");
    let reply = fetch_ok(proxy, get("a.example", "/path-only")).await;
    assert_eq!((&reply["path"], &reply["headers"]["host"]), (&json!("/plain"), &json!("a.example")));
    let reply = fetch_ok(proxy, get("a.example", "/a%2e/../other?x")).await;
    assert_eq!(reply["path"], "/other?x", "without a rewrite, the normalised path as received");
}

#[tokio::test]
async fn request_and_backend_timeouts_answer_504() {
    let (silent, slow) = (silent().await, slow(Duration::from_millis(400)).await);
    let timeouts = |request: Option<u64>, backend: Option<u64>| Actions {
        request_timeout: request.map(Duration::from_millis),
        backend_timeout: backend.map(Duration::from_millis),
        ..Actions::default()
    };
    let routes = vec![
        ("a.example", "/request", forward_with(target("svc", &[silent]), timeouts(Some(300), Some(5_000)))),
        ("a.example", "/backend", forward_with(target("svc", &[silent]), timeouts(Some(5_000), Some(300)))),
        ("a.example", "/patient", forward_with(target("svc", &[slow]), timeouts(None, Some(5_000)))),
        ("a.example", "/", Decision::Forward(Forward::to(Arc::new(target("svc", &[slow]))))),
    ];
    // The proxy's own response timeout would answer every one of them at 60 s, and the slow
    // backend's at 100 ms.
    let config = ProxyConfig { response_timeout: Duration::from_millis(100), ..ProxyConfig::default() };
    let proxy = start_router(Decide::new(routes), config).await;
    let timed = |path: &'static str| async move {
        let started = Instant::now();
        let (status, _, body) = exchange(proxy, get("a.example", path)).await;
        (status, body, started.elapsed())
    };

    let (status, body, elapsed) = timed("/request").await;
    assert_eq!((status, body.as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream request timeout\n"));
    assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3), "{elapsed:?}");
    let (status, body, elapsed) = timed("/backend").await;
    assert_eq!((status, body.as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream response timeout\n"));
    assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3), "{elapsed:?}");
    let (status, body, _) = timed("/patient").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow"), "the backend timeout replaces the response timeout");
    let (status, body, _) = timed("/").await;
    assert_eq!((status, body.as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream response timeout\n"));
}

#[tokio::test]
async fn request_timeout_covers_retries() {
    // The first endpoint is busy (one connection, held by a request that never ends), the second
    // silent: waiting for the first (connect timeout) then for the second outlasts the request
    // timeout, though each alone stays within its own limit.
    let (busy, silent) = (silent().await, silent().await);
    let config = ProxyConfig {
        connect_timeout: Duration::from_millis(300),
        max_upstream_connections: 1,
        ..ProxyConfig::default()
    };
    let actions = Actions {
        request_timeout: Some(Duration::from_millis(500)),
        backend_timeout: Some(Duration::from_millis(400)),
        ..Actions::default()
    };
    let routes = vec![
        ("a.example", "/hold", Decision::Forward(Forward::to(Arc::new(target("hold", &[busy]))))),
        ("a.example", "/", forward_with(target("svc", &[busy, silent]), actions)),
    ];
    let proxy = start_router(Decide::new(routes), config).await;
    tokio::spawn(exchange(proxy, get("a.example", "/hold")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (status, _, body) = exchange(proxy, get("a.example", "/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream request timeout\n"));
    // Per attempt, it would have been the second attempt's backend timeout, at 700 ms.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[tokio::test]
async fn mirrors_get_the_head_and_the_client_the_first_answer() {
    let (a, mirror) = (backend("a").await, recorder("mirror").await);
    let (mirror, mut mirrored) = mirror;
    let actions = Actions {
        request_headers: edits(&[("x-edited", "yes")], &[], &[]),
        mirrors: vec![Arc::new(target("mirror", &[mirror]))],
        ..Actions::default()
    };
    let routes = vec![("a.example", "/", forward_with(target("svc", &[a]), actions))];
    let proxy = start_router(Decide::new(routes), ProxyConfig::default()).await;
    let request = Request::post("/m?q=1").header("host", "a.example").body(Full::from(&b"0123456789"[..])).unwrap();
    let (status, _, body) = exchange(proxy, request).await;
    assert_eq!(status, StatusCode::OK);
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((&reply["backend"], &reply["body"]), (&json!("a"), &json!(10)));

    let copy = tokio::time::timeout(Duration::from_secs(5), mirrored.recv()).await.expect("mirrored").unwrap();
    assert_eq!((&copy["method"], &copy["path"], &copy["body"]), (&json!("POST"), &json!("/m?q=1"), &json!(0)));
    assert_eq!(copy["headers"]["x-edited"], "yes", "the head as forwarded");
    assert_eq!(copy["headers"]["host"], "a.example");
    assert_eq!(copy["headers"]["x-forwarded-for"], "127.0.0.1");
    assert!(copy["headers"].get("content-length").is_none_or(|length| length == "0"), "{copy}");
}

#[tokio::test]
async fn mirrors_beyond_the_bound_are_dropped_and_never_delay_the_request() {
    let (mirror, connections) = counting_silent().await;
    let actions = Actions { mirrors: vec![Arc::new(target("mirror", &[mirror]))], ..Actions::default() };
    let routes = vec![("a.example", "/", forward_with(target("svc", &[backend("a").await]), actions))];
    let config = ProxyConfig { max_mirrors_in_flight: 2, ..ProxyConfig::default() };
    let proxy = start_router(Decide::new(routes), config).await;
    let mut client: http1::SendRequest<Full<Bytes>> = {
        let (sender, connection) =
            http1::handshake(TokioIo::new(TcpStream::connect(proxy).await.unwrap())).await.unwrap();
        tokio::spawn(connection);
        sender
    };
    for _ in 0..4 {
        // Each mirror waits for an answer that never comes (60 s): the first two hold the slots.
        let response = tokio::time::timeout(Duration::from_secs(2), client.send_request(get("a.example", "/"))).await;
        assert_eq!(response.expect("not delayed by its mirror").unwrap().status(), StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(connections.load(Relaxed), 2, "two mirrors in flight, two dropped");
}

/// What a fixed set of local addresses serve.
struct Addresses(Vec<(IpAddr, Listener)>);

impl Listeners for Addresses {
    fn listener(&self, local: SocketAddr) -> Option<Listener> {
        self.0.iter().find(|(ip, _)| *ip == local.ip()).map(|(_, listener)| listener.clone())
    }
}

#[tokio::test]
async fn serve_listeners_chooses_by_local_address() {
    let pki = Pki::new();
    let certificates = Arc::new(Certificates::new());
    certificates.update(vec![pki.issue("a.example").1, pki.issue("b.example").1]);
    let listeners = Addresses(vec![
        ("127.0.0.1".parse().unwrap(), Listener::Http),
        ("127.0.0.3".parse().unwrap(), Listener::Https(crate::tls::server_config(certificates))),
    ]);
    let a = backend("a").await;
    let routes = vec![
        ("a.example", "/", Decision::Forward(Forward::to(Arc::new(target("svc", &[a]))))),
        ("b.example", "/", Decision::Forward(Forward::to(Arc::new(target("svc-b", &[a]))))),
    ];
    let router = Decide::new(routes);
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let proxy = Proxy::new(router.clone(), ProxyConfig::default());
    tokio::spawn(serve_listeners(proxy, listener, Arc::new(listeners), std::future::pending()));
    let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), port);

    // Plain HTTP on 127.0.0.1.
    let reply = fetch_ok(at("127.0.0.1"), get("a.example", "/")).await;
    assert_eq!((&reply["backend"], &reply["headers"]["x-forwarded-proto"]), (&json!("a"), &json!("http")));
    let seen = router.seen().pop().unwrap();
    assert_eq!((seen.local, seen.tls), (at("127.0.0.1"), false));

    // Nothing on 127.0.0.2: closed at once.
    let mut tcp = TcpStream::connect(at("127.0.0.2")).await.unwrap();
    let _ = tcp.write_all(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n").await;
    let read = tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut [0; 1])).await.expect("closed within 2 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

    // HTTPS on 127.0.0.3, HTTP/2 by ALPN; no 421 for another host with a certificate of its own.
    let tls = handshake(&pki.client(&[b"h2", b"http/1.1"]), at("127.0.0.3"), "a.example").await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let request = Request::get("https://b.example/x").body(Full::default()).unwrap();
    let (status, body, version) = send(tls, true, request).await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_2), "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["headers"]["x-forwarded-proto"], "https");
    let seen = router.seen().pop().unwrap();
    assert_eq!((seen.local, seen.tls, seen.host.as_str()), (at("127.0.0.3"), true, "b.example"));

    // HTTP/1.1 over TLS too.
    let tls = handshake(&pki.client(&[b"http/1.1"]), at("127.0.0.3"), "a.example").await.unwrap();
    assert_eq!(send(tls, false, get("a.example", "/")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn serve_https_tells_the_router_it_is_tls() {
    let pki = Pki::new();
    let certificates = Arc::new(Certificates::new());
    certificates.update(vec![pki.issue("a.example").1]);
    let router = Decide::new(vec![(
        "a.example",
        "/",
        Decision::Forward(Forward::to(Arc::new(target("svc", &[backend("a").await])))),
    )]);
    let (listener, addr) = listen().await;
    tokio::spawn(serve_https(
        Proxy::new(router.clone(), ProxyConfig::default()),
        listener,
        certificates,
        std::future::pending(),
    ));
    let tls = handshake(&pki.client(&[b"http/1.1"]), addr, "a.example").await.unwrap();
    assert_eq!(send(tls, false, get("a.example", "/")).await.0, StatusCode::OK);
    let seen = router.seen().pop().unwrap();
    assert_eq!((seen.local, seen.tls), (addr, true));
}

#[path = "proxy_fast_tests.rs"]
mod fast;
