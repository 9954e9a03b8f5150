//! The echo server: answers every TCP connection and UDP datagram with one
//! [`Reply`] line naming itself and the addresses it saw.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use socket2::{Domain, Socket, Type};

use crate::pktinfo;
use crate::reply::Reply;

/// How often idle workers check whether the server was stopped.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A running echo server; dropping it stops its threads and closes its sockets.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
    local_addrs: Vec<SocketAddr>,
}

/// Serves TCP and UDP on each of `listen` (IPv6 sockets are v6-only; port 0
/// picks one free port shared by TCP and UDP), replying as `name`.
/// Wildcard addresses work: UDP replies report and come from the datagram's
/// real destination.
pub fn serve(listen: &[SocketAddr], name: &str) -> Result<EchoServer> {
    ensure!(
        !name.is_empty() && !name.contains(char::is_whitespace),
        "echo server name {name:?} must be one non-empty word"
    );
    let mut server =
        EchoServer { stop: Arc::new(AtomicBool::new(false)), workers: Vec::new(), local_addrs: Vec::new() };
    for &requested in listen {
        let tcp = bind(requested, Type::STREAM)?;
        tcp.listen(128).with_context(|| format!("cannot listen on tcp {requested}"))?;
        let tcp = TcpListener::from(tcp);
        let addr = tcp.local_addr()?;
        let udp = UdpSocket::from(bind(addr, Type::DGRAM)?);
        pktinfo::enable(&udp).with_context(|| format!("cannot enable pktinfo on udp {addr}"))?;

        let tcp_name = name.to_owned();
        server.spawn(format!("echo-tcp-{addr}"), move || {
            let (stream, peer) = tcp.accept()?;
            answer_tcp(stream, peer, &tcp_name)
        })?;
        let udp_name = name.to_owned();
        let mut buf = vec![0; 65536];
        server.spawn(format!("echo-udp-{addr}"), move || {
            let datagram = pktinfo::recv(&udp, &mut buf)?;
            let line = Reply { name: udp_name.clone(), local: datagram.local, peer: datagram.peer };
            pktinfo::reply(&udp, &datagram, line.to_string().as_bytes())
        })?;
        server.local_addrs.push(addr);
    }
    Ok(server)
}

/// Runs an echo server until the process is killed (for `roadkeeper echo`).
pub fn run_forever(listen: &[SocketAddr], name: &str) -> Result<()> {
    let server = serve(listen, name)?;
    tracing::info!(name, addrs = ?server.local_addrs(), "echo server listening");
    loop {
        thread::park();
    }
}

impl EchoServer {
    /// The bound addresses (with real ports when port 0 was requested).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// Starts a worker thread repeating `step` until the server stops.
    fn spawn(&mut self, thread_name: String, mut step: impl FnMut() -> io::Result<()> + Send + 'static) -> Result<()> {
        let stop = Arc::clone(&self.stop);
        let worker = thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match step() {
                        Ok(()) => {}
                        // The socket read timeout expired: just re-check `stop`.
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                        Err(err) => {
                            tracing::warn!(worker = thread_name, "{err}");
                            thread::sleep(POLL_INTERVAL);
                        }
                    }
                }
            })
            .context("cannot start echo worker thread")?;
        self.workers.push(worker);
        Ok(())
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers.drain(..) {
            // A panicked worker has nothing left to clean up.
            let _ = worker.join();
        }
    }
}

/// Creates a socket bound to `addr` whose blocking reads and accepts time out.
fn bind(addr: SocketAddr, ty: Type) -> Result<Socket> {
    let setup = || -> io::Result<Socket> {
        let socket = Socket::new(Domain::for_address(addr), ty, None)?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_read_timeout(Some(POLL_INTERVAL))?;
        socket.bind(&addr.into())?;
        Ok(socket)
    };
    setup().with_context(|| format!("cannot bind {ty:?} socket to {addr}"))
}

/// Writes the reply line and closes, without waiting for client data.
fn answer_tcp(mut stream: TcpStream, peer: SocketAddr, name: &str) -> io::Result<()> {
    let reply = Reply { name: name.to_owned(), local: stream.local_addr()?, peer };
    stream.write_all(reply.to_string().as_bytes())?;
    stream.shutdown(Shutdown::Write)?;
    // Discard data the client already sent, so closing sends FIN rather than RST.
    stream.set_nonblocking(true)?;
    match io::copy(&mut stream, &mut io::sink()) {
        Err(err) if err.kind() != io::ErrorKind::WouldBlock => Err(err),
        _ => Ok(()),
    }
}
