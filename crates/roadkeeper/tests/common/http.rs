//! Plain HTTP/1.0 requests from inside a lab namespace, and reading Prometheus text.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use roadkeeper_netlab::Netns;

use super::Cluster;

/// Sends `GET path` over HTTP/1.0 to `addr` from inside the node; returns status code and body.
pub fn get(c: &Cluster, addr: &str, path: &str) -> (u16, String) {
    get_in(c.lab.node(), addr, path)
}

/// Sends `GET path` over HTTP/1.0 to `addr` from inside `ns`; returns status code and body.
pub fn get_in(ns: &Netns, addr: &str, path: &str) -> (u16, String) {
    let addr: SocketAddr = addr.parse().expect("address");
    let raw = ns.run(|| http_get(addr, path));
    let (code, _, body) = parse_response(&raw);
    (code, body)
}

/// `GET path` over HTTP/1.0 to `addr` from the calling thread's namespace: the raw response.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    try_http_get(addr, path).unwrap_or_else(|err| panic!("GET {path} from {addr}: {err}"))
}

pub fn try_http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    Ok(raw)
}

/// Status code, head (status line and headers) and body of a raw HTTP response.
pub fn parse_response(raw: &str) -> (u16, String, String) {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP response: {raw:?}"));
    let code =
        head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status line: {head:?}"));
    (code, head.to_string(), body.to_string())
}

/// The value of header `name` (case-insensitive) in a response head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The value of the sample line `name value` in Prometheus text, if there is one.
pub fn try_sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The value of the sample line `name value` in Prometheus text.
pub fn sample(metrics: &str, name: &str) -> f64 {
    try_sample(metrics, name).unwrap_or_else(|| panic!("no sample {name} in:\n{metrics}"))
}
