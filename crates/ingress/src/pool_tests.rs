//! The pool against raw TCP backends whose framing and connection handling each test chooses,
//! counting the connections they accept.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// How a test backend answers and treats its connections.
#[derive(Clone, Copy)]
enum Backend {
    /// `Content-Length` body, connection kept.
    Length,
    /// Chunked body, connection kept.
    Chunked,
    /// `Connection: close`, then closes.
    Close,
    /// Keeps the connection, but closes it silently 50 ms after each answer (a keep-alive
    /// timeout shorter than the proxy's).
    ShortKeepAlive,
}

/// A backend answering `ok` to every request; returns its address and its count of accepted
/// connections, and of connections that ended.
async fn backend(kind: Backend) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let counts = (accepted.clone(), ended.clone());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            counts.0.fetch_add(1, SeqCst);
            let ended = counts.1.clone();
            tokio::spawn(async move {
                let (mut head, mut answered) = (Vec::new(), false);
                let mut buf = [0; 4096];
                loop {
                    let read = tokio::time::timeout(Duration::from_millis(50), tcp.read(&mut buf));
                    let n = match read.await {
                        Ok(Ok(n)) if n > 0 => n,
                        Err(_) if matches!(kind, Backend::ShortKeepAlive) && answered && head.is_empty() => break,
                        Err(_) => continue,
                        _ => break,
                    };
                    head.extend_from_slice(&buf[..n]);
                    if !head.ends_with(b"\r\n\r\n") {
                        continue;
                    }
                    (head, answered) = (Vec::new(), true);
                    let response: &[u8] = match kind {
                        Backend::Length | Backend::ShortKeepAlive => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                        Backend::Chunked => {
                            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                        }
                        Backend::Close => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    };
                    if tcp.write_all(response).await.is_err() || matches!(kind, Backend::Close) {
                        break;
                    }
                }
                ended.fetch_add(1, SeqCst);
            });
        }
    });
    (addr, accepted, ended)
}

fn request() -> Request<Empty<Bytes>> {
    Request::builder().uri("/").header("host", "backend").body(Empty::new()).unwrap()
}

/// Sends one request and reads the whole body.
async fn get(pool: &Arc<Pool<SendRequest<Empty<Bytes>>>>, endpoint: SocketAddr) -> String {
    let Ok(response) = pool.send(endpoint, request()).await else { panic!("request to {endpoint} failed") };
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

fn pool(idle_timeout: Duration) -> Arc<Pool<SendRequest<Empty<Bytes>>>> {
    Pool::new(Duration::from_secs(1), idle_timeout, 512)
}

#[tokio::test]
async fn pool_reuses_one_connection_for_length_and_chunked_bodies() {
    for kind in [Backend::Length, Backend::Chunked] {
        let (addr, accepted, _) = backend(kind).await;
        let pool = pool(Duration::from_secs(60));
        for _ in 0..20 {
            assert_eq!(get(&pool, addr).await, "ok");
        }
        assert_eq!(accepted.load(SeqCst), 1);
    }
}

#[tokio::test]
async fn pool_opens_as_many_connections_as_requests_in_flight() {
    let (addr, accepted, _) = backend(Backend::Length).await;
    let pool = pool(Duration::from_secs(60));
    let (first, second) = (pool.send(addr, request()).await, pool.send(addr, request()).await);
    assert_eq!(accepted.load(SeqCst), 2, "the first body is unread: its connection is busy");
    drop((first, second));
    assert_eq!(get(&pool, addr).await, "ok");
    assert_eq!(accepted.load(SeqCst), 3, "an unread body closes its connection instead of reusing it");
}

#[tokio::test]
async fn pool_does_not_reuse_closed_connections() {
    let (addr, accepted, _) = backend(Backend::Close).await;
    let pool = pool(Duration::from_secs(60));
    for _ in 0..5 {
        assert_eq!(get(&pool, addr).await, "ok");
    }
    assert_eq!(accepted.load(SeqCst), 5);
}

#[tokio::test]
async fn pool_survives_endpoints_closing_idle_connections() {
    let (addr, accepted, _) = backend(Backend::ShortKeepAlive).await;
    let pool = pool(Duration::from_secs(60));
    for _ in 0..3 {
        assert_eq!(get(&pool, addr).await, "ok");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(accepted.load(SeqCst), 3, "each request after the backend's keep-alive timeout reconnects");
}

#[tokio::test]
async fn pool_closes_connections_idle_for_the_idle_timeout() {
    let (addr, accepted, ended) = backend(Backend::Length).await;
    let pool = pool(Duration::from_millis(100));
    assert_eq!(get(&pool, addr).await, "ok");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!((accepted.load(SeqCst), ended.load(SeqCst)), (1, 1), "the reaper closed the idle connection");
}

#[tokio::test]
async fn pool_reports_refused_connections() {
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let pool = pool(Duration::from_secs(60));
    assert!(matches!(pool.send(addr, request()).await, Err(SendError::Connect(_))));
}

#[tokio::test]
async fn pool_bounds_the_connections_of_an_endpoint_and_queues_requests_for_them() {
    let (addr, accepted, _) = backend(Backend::Length).await;
    let pool: Arc<Pool<SendRequest<Empty<Bytes>>>> = Pool::new(Duration::from_secs(5), Duration::from_secs(60), 2);
    let (first, second) = (pool.send(addr, request()).await, pool.send(addr, request()).await);
    let (first, second) = (first.ok().unwrap(), second.ok().unwrap());
    assert_eq!(accepted.load(SeqCst), 2);
    // Both connections are busy until their bodies are read: the next requests wait.
    let waiting = [tokio::spawn(get_owned(pool.clone(), addr)), tokio::spawn(get_owned(pool.clone(), addr))];
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(waiting.iter().all(|request| !request.is_finished()), "queued");
    drop(first.into_body().collect().await.unwrap()); // back to the pool: one request goes on it
    drop(second); // unread: closed, which makes room for a new connection
    for request in waiting {
        assert_eq!(request.await.unwrap(), "ok");
    }
    assert_eq!(accepted.load(SeqCst), 3, "one reused, one new in place of the closed one");
}

#[tokio::test]
async fn pool_answers_busy_when_no_connection_comes_back_within_the_connect_timeout() {
    let (addr, _, _) = backend(Backend::Length).await;
    let pool: Arc<Pool<SendRequest<Empty<Bytes>>>> = Pool::new(Duration::from_millis(200), Duration::from_secs(60), 1);
    let busy = pool.send(addr, request()).await.ok().unwrap();
    assert!(matches!(pool.send(addr, request()).await, Err(SendError::Busy(_))));
    drop(busy);
    assert_eq!(get(&pool, addr).await, "ok", "room again once it closed");
}

#[tokio::test]
async fn pool_forgets_endpoints_without_connections() {
    let (addr, _, _) = backend(Backend::Close).await;
    let pool = pool(Duration::from_millis(50));
    assert_eq!(get(&pool, addr).await, "ok");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(pool.endpoints.lock().unwrap().is_empty());
}

async fn get_owned(pool: Arc<Pool<SendRequest<Empty<Bytes>>>>, endpoint: SocketAddr) -> String {
    get(&pool, endpoint).await
}
