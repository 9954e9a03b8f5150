//! A small HTTP/1.1 server for lab pods and hosts: serves the files below a document root (as
//! a static web server such as nginx does) or, without one, a line naming itself and the client;
//! every response names the server in `X-Pod-Name` and the client address it saw in
//! `X-Client-Address`.
//!
//! GET and HEAD only; a folder is answered with its `index.html` (nginx redirects `/dir` to
//! `/dir/` first; this server answers both). Bounded: at most [`MAX_CONNECTIONS`] connections
//! at once (the rest wait in the kernel's backlog), request heads of at most [`MAX_HEAD`] bytes,
//! request bodies (read and discarded) of at most [`MAX_BODY`], files of at most [`MAX_FILE`],
//! 5 s to send a request head and 30 s per connection.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Largest request head (request line and header fields).
pub const MAX_HEAD: usize = 16 << 10;
/// Largest request body accepted (and discarded).
pub const MAX_BODY: u64 = 1 << 20;
/// Largest file served.
pub const MAX_FILE: u64 = 16 << 20;
/// Time to send a request head (also between requests of a kept-alive connection).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Lifetime of a connection.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// What the server answers with.
#[derive(Clone, Debug)]
pub struct Site {
    /// The name answered in `X-Pod-Name` (a pod's or host's name).
    pub name: String,
    /// The document root; `None`: every GET is answered with a line naming server and client.
    pub root: Option<PathBuf>,
}

/// Serves `site` on every address of `listen` until the process ends.
pub fn run_forever(listen: &[SocketAddr], site: Site) -> Result<()> {
    let listeners = listen
        .iter()
        .map(|addr| TcpListener::bind(addr).with_context(|| format!("cannot listen on tcp {addr}")))
        .collect::<Result<Vec<_>>>()?;
    tracing::info!(name = site.name, root = ?site.root, ?listen, "web server listening");
    let site = Arc::new(site);
    let slots = Arc::new(Slots::default());
    let accepting: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let (site, slots) = (site.clone(), slots.clone());
            thread::spawn(move || accept(listener, &site, &slots))
        })
        .collect();
    for thread in accepting {
        let _ = thread.join();
    }
    Ok(())
}

/// Counts connections in service, so that no more than [`MAX_CONNECTIONS`] are accepted.
#[derive(Default)]
struct Slots {
    taken: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn take(&self) {
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        while *taken >= MAX_CONNECTIONS {
            taken = self.freed.wait(taken).unwrap_or_else(PoisonError::into_inner);
        }
        *taken += 1;
    }

    fn give_back(&self) {
        *self.taken.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        self.freed.notify_one();
    }
}

fn accept(listener: TcpListener, site: &Arc<Site>, slots: &Arc<Slots>) {
    loop {
        slots.take();
        match listener.accept() {
            Ok((stream, peer)) => {
                let (site, slots) = (site.clone(), slots.clone());
                thread::spawn(move || {
                    if let Err(err) = serve_connection(stream, peer, &site) {
                        tracing::debug!(%peer, "{err}");
                    }
                    slots.give_back();
                });
            }
            Err(err) => {
                slots.give_back();
                tracing::warn!("accept: {err}");
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq)]
struct Request {
    method: String,
    /// The path, percent-decoded, without the query.
    path: String,
    body_length: u64,
    keep_alive: bool,
}

fn serve_connection(stream: TcpStream, peer: SocketAddr, site: &Site) -> io::Result<()> {
    let deadline = Instant::now() + CONNECTION_LIFETIME;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let timeout = deadline.saturating_duration_since(Instant::now()).min(HEAD_TIMEOUT);
        if timeout.is_zero() {
            return Ok(());
        }
        reader.get_ref().set_read_timeout(Some(timeout))?;
        let Some(head) = read_head(&mut reader)? else { return Ok(()) };
        let (status, content_type, body, keep_alive) = match parse_head(&head) {
            Ok(request) if request.body_length > MAX_BODY => (413, "text/plain", b"body too large\n".to_vec(), false),
            Ok(request) => {
                io::copy(&mut (&mut reader).take(request.body_length), &mut io::sink())?;
                let (status, content_type, body) = respond(site, &request, peer);
                let body = if request.method == "HEAD" { Vec::new() } else { body };
                (status, content_type, body, request.keep_alive)
            }
            Err(status) => (status, "text/plain", format!("{}\n", reason(status)).into_bytes(), false),
        };
        let mut head = format!("HTTP/1.1 {status} {}\r\nServer: roadkeeper-lab\r\n", reason(status));
        let _ = write!(head, "X-Pod-Name: {}\r\nX-Client-Address: {peer}\r\n", site.name);
        let _ = write!(head, "Content-Type: {content_type}\r\nContent-Length: {}\r\n", body.len());
        head.push_str(if keep_alive { "Connection: keep-alive\r\n\r\n" } else { "Connection: close\r\n\r\n" });
        writer.write_all(head.as_bytes())?;
        writer.write_all(&body)?;
        if !keep_alive {
            return Ok(());
        }
    }
}

/// Reads a request head up to the empty line; `None` when the client closed first.
fn read_head(reader: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut head = String::new();
    loop {
        let read = reader.take((MAX_HEAD - head.len()) as u64 + 1).read_line(&mut head)?;
        if read == 0 {
            return Ok(None);
        }
        if head.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request head too large"));
        }
        if head.ends_with("\r\n\r\n") || head.ends_with("\n\n") || head == "\r\n" {
            return Ok(Some(head));
        }
    }
}

/// The request line and the fields that matter, or the status refusing them.
fn parse_head(head: &str) -> Result<Request, u16> {
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(400);
    };
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(505),
    };
    if !matches!(method, "GET" | "HEAD") {
        return Err(405);
    }
    let (mut body_length, mut keep_alive) = (0, http11);
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(400u16)?;
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => body_length = value.parse().map_err(|_| 400u16)?,
            "transfer-encoding" => return Err(501),
            "connection" if value.eq_ignore_ascii_case("close") => keep_alive = false,
            "connection" if value.eq_ignore_ascii_case("keep-alive") => keep_alive = true,
            _ => {}
        }
    }
    let path = target.split(['?', '#']).next().unwrap_or_default();
    let path = percent_decode(path).filter(|p| p.starts_with('/')).ok_or(400u16)?;
    Ok(Request { method: method.to_owned(), path, body_length, keep_alive })
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.contains('\0'))
}

/// Status, content type and body for a request.
fn respond(site: &Site, request: &Request, peer: SocketAddr) -> (u16, &'static str, Vec<u8>) {
    let Some(root) = &site.root else {
        let line = format!("{} answered {} {} from {peer}\n", site.name, request.method, request.path);
        return (200, "text/plain", line.into_bytes());
    };
    let not_found = || (404, "text/plain", format!("404 Not Found ({})\n", site.name).into_bytes());
    let Some(file) = resolve(root, &request.path) else {
        return not_found();
    };
    match read_file(&file) {
        Ok(body) => (200, content_type(&file), body),
        Err(err) if err.kind() == io::ErrorKind::NotFound => not_found(),
        Err(err) => {
            tracing::warn!(file = %file.display(), "{err}");
            (403, "text/plain", format!("403 Forbidden ({})\n", site.name).into_bytes())
        }
    }
}

/// The file under `root` a path names (a folder's `index.html`); `None` for paths that climb
/// above the root or resolve (through links) outside it.
fn resolve(root: &Path, path: &str) -> Option<PathBuf> {
    let mut file = root.to_owned();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => file.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    if file.is_dir() {
        file.push("index.html");
    }
    let real = file.canonicalize().ok()?;
    real.starts_with(root.canonicalize().ok()?).then_some(real)
}

fn read_file(file: &Path) -> io::Result<Vec<u8>> {
    let handle = std::fs::File::open(file)?;
    let metadata = handle.metadata()?;
    if !metadata.is_file() || metadata.len() > MAX_FILE {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "not a regular file of at most 16 MiB"));
    }
    let mut body = Vec::with_capacity(metadata.len() as usize);
    handle.take(MAX_FILE).read_to_end(&mut body)?;
    Ok(body)
}

fn content_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()).unwrap_or_default() {
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" => "application/javascript",
        "json" => "application/json",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "txt" => "text/plain",
        _ => "application/octet-stream",
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// Most bytes of a response [`get`] reads.
const MAX_RESPONSE: u64 = 1 << 20;

/// A response read by [`get`].
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header fields, names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body (at most 1 MiB, lossily UTF-8).
    pub body: String,
}

impl Response {
    /// The first field `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `GET path` from `address` with `Host: host` over one connection, read to its end; within
/// `timeout` for connecting and for each read.
pub fn get(address: SocketAddr, host: &str, path: &str, timeout: Duration) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: roadkeeper-lab\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.take(MAX_RESPONSE).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, format!("malformed response from {address}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(malformed)?;
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).ok_or_else(malformed)?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Ok(Response { status, headers, body: body.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_parsed_or_refused() {
        let request = parse_head("GET /a%20b/?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n").unwrap();
        assert_eq!(request, Request { method: "GET".into(), path: "/a b/".into(), body_length: 3, keep_alive: true });
        assert!(!parse_head("HEAD / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(!parse_head("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap().keep_alive);
        assert_eq!(parse_head("POST / HTTP/1.1\r\n\r\n"), Err(405));
        assert_eq!(parse_head("GET / HTTP/2\r\n\r\n"), Err(505));
        assert_eq!(parse_head("GET /%zz HTTP/1.1\r\n\r\n"), Err(400));
        assert_eq!(parse_head("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), Err(501));
        assert_eq!(parse_head("GET HTTP/1.1\r\n\r\n"), Err(400));
    }

    #[test]
    fn files_folders_and_escapes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("hello")).unwrap();
        std::fs::write(root.path().join("index.html"), "<p>root</p>").unwrap();
        std::fs::write(root.path().join("hello/index.html"), "<p>hello</p>").unwrap();
        let site = Site { name: "web-1".into(), root: Some(root.path().into()) };
        let peer: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let get = |path: &str| {
            let request = Request { method: "GET".into(), path: path.into(), body_length: 0, keep_alive: true };
            let (status, content_type, body) = respond(&site, &request, peer);
            (status, content_type, String::from_utf8(body).unwrap())
        };
        assert_eq!(get("/"), (200, "text/html", "<p>root</p>".into()));
        assert_eq!(get("/hello"), (200, "text/html", "<p>hello</p>".into()));
        assert_eq!(get("/hello/"), (200, "text/html", "<p>hello</p>".into()));
        assert_eq!(get("/missing").0, 404);
        assert_eq!(get("/../etc/passwd").0, 404);
        let whoami = Site { name: "internet".into(), root: None };
        let request = Request { method: "GET".into(), path: "/".into(), body_length: 0, keep_alive: false };
        assert_eq!(respond(&whoami, &request, peer).2, b"internet answered GET / from 10.0.0.1:5000\n");
    }

    #[test]
    fn served_over_tcp_with_keep_alive() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let site = Arc::new(Site { name: "web-1".into(), root: None });
        std::thread::spawn(move || accept(listener, &site, &Arc::new(Slots::default())));
        let response = get(address, "x", "/hello", Duration::from_secs(2)).unwrap();
        assert_eq!((response.status, response.header("x-pod-name")), (200, Some("web-1")));
        assert!(response.body.starts_with("web-1 answered GET /hello from 127.0.0.1:"), "{}", response.body);
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut both = String::new();
        stream.read_to_string(&mut both).unwrap();
        assert_eq!(both.matches("HTTP/1.1 200 OK").count(), 2, "{both}");
    }
}
