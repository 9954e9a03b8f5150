//! Client probes: one TCP connection or UDP exchange with an echo server,
//! classified as reply, refused or timeout. Run them inside a namespace with
//! [`Netns::run`](crate::Netns::run).

use std::io::{self, BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use socket2::{Domain, Socket, Type};

use crate::reply::Reply;

/// Smallest read timeout used once the probe deadline has passed (zero is invalid).
const MIN_READ_TIMEOUT: Duration = Duration::from_millis(1);

/// How a probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// The echo server answered.
    Reply(Reply),
    /// Actively rejected: TCP RST or ICMP unreachable (port, host or network).
    Refused,
    /// No answer within the timeout (e.g. packets dropped).
    Timeout,
    /// Anything else, such as a malformed reply or a local socket error.
    Error(String),
}

impl ProbeResult {
    /// The reply, or an error saying what happened instead.
    pub fn into_reply(self) -> Result<Reply> {
        match self {
            ProbeResult::Reply(reply) => Ok(reply),
            other => Err(anyhow!("expected an echo reply, got {other:?}")),
        }
    }
}

/// Connects over TCP to `target` and reads the echo line.
pub fn tcp(target: SocketAddr, timeout: Duration) -> ProbeResult {
    tcp_probe(None, target, timeout)
}

/// Like [`tcp`], from source address `source`.
pub fn tcp_from(source: IpAddr, target: SocketAddr, timeout: Duration) -> ProbeResult {
    tcp_probe(Some(SocketAddr::new(source, 0)), target, timeout)
}

/// Sends one datagram from a connected UDP socket to `target` and reads the echo line.
pub fn udp(target: SocketAddr, timeout: Duration) -> ProbeResult {
    udp_probe(None, target, timeout)
}

/// Like [`udp`], from source address `source`.
pub fn udp_from(source: IpAddr, target: SocketAddr, timeout: Duration) -> ProbeResult {
    udp_probe(Some(SocketAddr::new(source, 0)), target, timeout)
}

/// Like [`udp`], from a fixed source address and port: a long-lived client whose datagrams all
/// belong to one conntrack flow.
pub fn udp_from_port(source: SocketAddr, target: SocketAddr, timeout: Duration) -> ProbeResult {
    udp_probe(Some(source), target, timeout)
}

fn tcp_probe(source: Option<SocketAddr>, target: SocketAddr, timeout: Duration) -> ProbeResult {
    let deadline = Instant::now() + timeout;
    classify(|| {
        let socket = socket(source, target, Type::STREAM)?;
        socket.connect_timeout(&target.into(), timeout)?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        socket.set_read_timeout(Some(remaining.max(MIN_READ_TIMEOUT)))?;
        let mut line = String::new();
        BufReader::new(TcpStream::from(socket)).read_line(&mut line)?;
        Ok(line)
    })
}

fn udp_probe(source: Option<SocketAddr>, target: SocketAddr, timeout: Duration) -> ProbeResult {
    classify(|| {
        let socket = socket(source, target, Type::DGRAM)?;
        // Connected, so ICMP errors are reported on this socket.
        socket.connect(&target.into())?;
        socket.set_read_timeout(Some(timeout.max(MIN_READ_TIMEOUT)))?;
        let socket = UdpSocket::from(socket);
        socket.send(b"probe\n")?;
        let mut buf = [0; 4096];
        let len = socket.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
    })
}

/// How long a bind to a fixed source port is retried while the port is still held.
const BIND_PATIENCE: Duration = Duration::from_secs(2);

/// A socket for talking to `target`, bound to `source` if given.
///
/// A fixed source port is retried for up to [`BIND_PATIENCE`] while it is in use: the previous
/// probe's socket, closed by this process, can live on for a moment in a child that another
/// thread is spawning (fork copies every descriptor; close-on-exec only drops it at exec), and
/// under load that moment made a repeated probe fail with `EADDRINUSE`.
fn socket(source: Option<SocketAddr>, target: SocketAddr, ty: Type) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(target), ty, None)?;
    let Some(source) = source else { return Ok(socket) };
    let deadline = Instant::now() + BIND_PATIENCE;
    loop {
        match socket.bind(&source.into()) {
            Err(err) if err.kind() == io::ErrorKind::AddrInUse && source.port() != 0 && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            result => return result.map(|()| socket),
        }
    }
}

/// Runs an exchange and maps its outcome (reply line or socket error) to a result.
fn classify(exchange: impl FnOnce() -> io::Result<String>) -> ProbeResult {
    match exchange() {
        Ok(line) => match line.parse() {
            Ok(reply) => ProbeResult::Reply(reply),
            Err(err) => ProbeResult::Error(format!("{err:#}")),
        },
        Err(err) => match err.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                ProbeResult::Refused
            }
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ProbeResult::Timeout,
            _ => ProbeResult::Error(err.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::echo;

    /// A probe from a fixed port that a closing socket still holds for a moment (as a child
    /// being spawned by another thread holds its copy) waits for the port instead of failing.
    #[test]
    fn a_fixed_source_port_held_for_a_moment_is_waited_for() {
        let server = echo::serve(&["127.0.0.1:0".parse().unwrap()], "echo").expect("echo server");
        let target = server.local_addrs()[0];
        let holder = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let source = holder.local_addr().expect("address");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(holder);
        });
        let result = udp_from_port(source, target, Duration::from_secs(2));
        release.join().unwrap();
        let reply = result.into_reply().expect("the probe waits for the port");
        assert_eq!((reply.name.as_str(), reply.peer), ("echo", source));
    }
}
