//! HTTP/1.1 over plain sockets for the front-door tests (`ingress`, `gateway`): a backend that
//! echoes what it received, a client that reads one response, and the manifests of Services with
//! hand-written EndpointSlices and of TLS Secrets.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use roadkeeper_netlab::Netns;

/// How long a client waits for a connection or a response: generous, the machine is shared.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The request headers that [`backend`] echoes in its body.
pub const ECHOED: [&str; 5] = ["host", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-real-ip"];

/// A front door's test bench (`ingress`, `gateway`): a network namespace whose loopback holds the
/// backends' addresses 10.244.0.1-3 (endpoint addresses may not be loopback ones, as the API
/// server refuses them) and an empty manifest folder, with room beside it for logs. Field order is
/// drop order: the namespace (killing what runs in it) goes before the folder.
pub struct Bench {
    pub ns: Netns,
    pub dir: tempfile::TempDir,
}

impl Bench {
    /// A namespace `<prefix>-<pid>-<n>` and its folder; nothing running yet.
    pub fn new(prefix: &str) -> Bench {
        let bench = Bench { ns: Netns::new(prefix).expect("netns"), dir: tempfile::tempdir().expect("tempdir") };
        for host in 1..=3 {
            bench.ns.ip(["addr", "add", &format!("10.244.0.{host}/32"), "dev", "lo"]).expect("backend address");
        }
        std::fs::create_dir(bench.manifests()).expect("manifest folder");
        bench
    }

    /// The watched folder (files beside it, such as the log, are not watched).
    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Writes (or replaces) a manifest atomically, so that the watcher never reads half a file.
    pub fn write(&self, file: &str, yaml: &str) {
        let tmp = self.dir.path().join(format!("{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.manifests().join(file)).expect("rename manifest");
    }

    /// Deletes a manifest.
    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests().join(file)).expect("remove manifest");
    }
}

/// One response as a client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    /// The name of the [`backend`] that answered (the body's first word), or `"<status>"` for an
    /// answer of the proxy itself, so that both read alike in a table.
    pub fn served_by(&self) -> String {
        match self.status {
            200 => self.body.split_whitespace().next().unwrap_or_default().to_owned(),
            status => status.to_string(),
        }
    }

    /// The value of request header `name` as the [`backend`] received it (every line of it,
    /// joined by `" | "` when it came more than once).
    pub fn echoed(&self, name: &str) -> Option<String> {
        let values: Vec<&str> =
            self.body.lines().skip(1).filter_map(|line| line.strip_prefix(name)?.strip_prefix(": ")).collect();
        (!values.is_empty()).then(|| values.join(" | "))
    }
}

/// An HTTP/1.1 backend on `listener`, a thread per connection, keep-alive: answers every request
/// with `<name> <target>` on the first line, then `<header>: <value>` for each [`ECHOED`] header
/// it received, in the order of [`ECHOED`]; a target under `/slow` after one second.
pub fn backend(listener: TcpListener, name: &'static str) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                while let Ok(Some(head)) = read_head(&mut reader) {
                    let target = head[0].split_whitespace().nth(1).unwrap_or_default();
                    if target.starts_with("/slow") {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    let fields: Vec<(String, &str)> = head[1..]
                        .iter()
                        .filter_map(|line| line.split_once(':'))
                        .map(|(key, value)| (key.trim().to_ascii_lowercase(), value.trim()))
                        .collect();
                    let mut body = format!("{name} {target}\n");
                    for echoed in ECHOED {
                        for (_, value) in fields.iter().filter(|(key, _)| key == echoed) {
                            body.push_str(&format!("{echoed}: {value}\n"));
                        }
                    }
                    let length = fields.iter().find(|(key, _)| key == "content-length");
                    let mut request_body = vec![0; length.and_then(|(_, n)| n.parse().ok()).unwrap_or(0)];
                    let response = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                    if reader.read_exact(&mut request_body).is_err()
                        || reader.get_mut().write_all(response.as_bytes()).is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
}

/// Reads a message head (request or status line, then header lines) up to its empty line;
/// `None` at a clean end of the stream before it.
pub fn read_head(reader: &mut impl BufRead) -> io::Result<Option<Vec<String>>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return match lines.is_empty() {
                true => Ok(None),
                false => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the head ends early")),
            };
        }
        let line = line.trim_end_matches(['\r', '\n']);
        match (line.is_empty(), lines.is_empty()) {
            (true, true) => continue, // empty lines before a message are ignored (RFC 9112 §2.2)
            (true, false) => return Ok(Some(lines)),
            (false, _) => {}
        }
        lines.push(line.to_owned());
    }
}

/// Reads one HTTP/1.1 response (body by Content-Length, chunked, or up to the end).
pub fn read_response(reader: &mut impl BufRead) -> io::Result<Reply> {
    let head = read_head(reader)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no response"))?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {head:?}"));
    let status = head[0].split_whitespace().nth(1).and_then(|code| code.parse().ok()).ok_or_else(|| bad("status"))?;
    let field = |name: &str| {
        head[1..].iter().filter_map(|line| line.split_once(':')).find(|(key, _)| key.trim().eq_ignore_ascii_case(name))
    };
    let mut body = Vec::new();
    if let Some((_, length)) = field("content-length") {
        body.resize(length.trim().parse().map_err(|_| bad("content-length"))?, 0);
        reader.read_exact(&mut body)?;
    } else if field("transfer-encoding").is_some_and(|(_, coding)| coding.trim().eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad("chunk size"))?;
            if size == 0 {
                read_head(reader)?; // trailers
                break;
            }
            let start = body.len();
            body.resize(start + size + 2, 0); // the chunk and its CRLF
            reader.read_exact(&mut body[start..])?;
            body.truncate(start + size);
        }
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(Reply { status, body: String::from_utf8_lossy(&body).into_owned() })
}

/// The head of `GET path` with `Host: host`, extra header lines and `Connection: connection`.
pub fn request_head(host: &str, path: &str, headers: &[&str], connection: &str) -> String {
    let headers: String = headers.iter().map(|line| format!("{line}\r\n")).collect();
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: {connection}\r\n\r\n")
}

/// Sends `head` to `to` on a new connection (from `from`, if given) and reads the response, from
/// the calling thread's namespace.
pub fn exchange(to: SocketAddr, from: Option<IpAddr>, head: &str) -> io::Result<Reply> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    if let Some(from) = from {
        socket.bind(&SocketAddr::new(from, 0).into())?;
    }
    socket.connect_timeout(&to.into(), PATIENCE)?;
    let mut stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.write_all(head.as_bytes())?;
    read_response(&mut BufReader::new(stream))
}

/// A headless Service `name` (port 80 named `http`) with an EndpointSlice of target port `port`:
/// the addresses `ready`, and `unready` with `conditions.ready: false`.
pub fn service(name: &str, port: u16, ready: &[&str], unready: &[&str]) -> String {
    let endpoint = |address: &&str, ready: bool| format!("{{addresses: [{address}], conditions: {{ready: {ready}}}}}");
    let endpoints: Vec<String> =
        ready.iter().map(|a| endpoint(a, true)).chain(unready.iter().map(|a| endpoint(a, false))).collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{clusterIP: None, ports: [{{name: http, port: 80}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints: [{}]\n",
        endpoints.join(", ")
    )
}

/// A Service `name` with one ready endpoint, 10.244.0.1:`port`.
pub fn local_service(name: &str, port: u16) -> String {
    service(name, port, &["10.244.0.1"], &[])
}

/// A TLS Secret `<host>-tls` for `host` and the CA that signed it (PEM).
pub fn tls_secret(host: &str) -> (String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Distinct names: a leaf whose issuer equals its subject looks self-signed to clients.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "roadkeeper test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, host);
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).expect("cert");
    let b64 = |pem: String| data_encoding::BASE64.encode(pem.as_bytes());
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {host}-tls, namespace: default}}\ntype: kubernetes.io/tls\n\
         data: {{tls.crt: {}, tls.key: {}}}\n",
        b64(cert.pem()),
        b64(key.serialize_pem())
    );
    (secret, ca.pem())
}
