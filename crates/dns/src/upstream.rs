//! Exchanges with upstream resolvers: over UDP through one connected socket per upstream, shared
//! by all the questions in flight to it and told apart by message ID (as CoreDNS's `forward`
//! reuses its connections), and over TCP after a truncated answer.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::oneshot;
use tracing::debug;

use crate::wire::MAX_UDP_PAYLOAD;

/// How long one upstream socket takes new questions; then a fresh one (a new source port) takes
/// over and the old one closes once its questions are answered or timed out (CoreDNS's `expire`).
pub(crate) const SOCKET_EXPIRY: Duration = Duration::from_secs(10);
/// Free message IDs tried on a socket before a question fails (65,536 exist per socket).
const ID_TRIES: usize = 16;

/// One worker's UDP sockets to the upstreams, opened on first use on the worker's runtime (whose
/// reactor then drives them): one per upstream, renewed every [`SOCKET_EXPIRY`].
pub(crate) struct Channels {
    slots: Vec<Mutex<Option<Arc<Channel>>>>,
    /// Message IDs are SipHash (keyed at random per process) of a counter: unpredictable off-path.
    id_keys: RandomState,
    id_counter: AtomicU64,
}

/// A connected UDP socket to one upstream and the questions waiting on it, by message ID.
struct Channel {
    socket: Arc<UdpSocket>,
    waiting: Arc<Mutex<HashMap<u16, Waiter>>>,
    opened: Instant,
    /// Set when the channel leaves its slot: its reader ends once nothing more can arrive.
    retired: Arc<AtomicBool>,
}

/// A question sent on a channel: what its response must ask, and where it goes.
struct Waiter {
    queries: Vec<Query>,
    reply: oneshot::Sender<Message>,
}

impl Channels {
    /// No socket yet to any of `upstreams` upstreams.
    pub(crate) fn new(upstreams: usize) -> Self {
        Self {
            slots: (0..upstreams).map(|_| Mutex::new(None)).collect(),
            id_keys: RandomState::new(),
            id_counter: AtomicU64::new(0),
        }
    }

    /// `query` sent to upstream number `index` at `upstream`, and its response: the first datagram
    /// on the channel with a free ID of ours and the same question (others, late or spoofed, are
    /// ignored); retried over TCP with the same upstream when truncated. Cancel-safe: a dropped
    /// exchange frees its ID. `idle` bounds how long the channel's reader waits for datagrams
    /// before it checks whether it was retired.
    pub(crate) async fn exchange(
        &self,
        index: usize,
        upstream: SocketAddr,
        query: &Message,
        idle: Duration,
    ) -> io::Result<Message> {
        let channel = self.channel(index, upstream, idle)?;
        let (sent, mut waiting) = channel.send(query, &self.id_keys, &self.id_counter).await?;
        let response = (&mut waiting.response)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, "the upstream socket failed"))?;
        drop(waiting);
        if !response.metadata.truncation {
            return Ok(response);
        }
        debug!(%upstream, "truncated answer, retrying over TCP");
        let response = exchange_tcp(upstream, &sent).await?;
        if answers(&sent, &response) {
            Ok(response)
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidData, "the TCP response does not answer the query"))
        }
    }

    /// The channel to upstream `index`, opened (and its reader spawned) when there is none, or it
    /// expired or failed.
    fn channel(&self, index: usize, upstream: SocketAddr, idle: Duration) -> io::Result<Arc<Channel>> {
        let mut slot = lock(&self.slots[index]);
        let usable = |c: &&Arc<Channel>| c.opened.elapsed() < SOCKET_EXPIRY && !c.retired.load(Ordering::Relaxed);
        if let Some(channel) = slot.as_ref().filter(usable) {
            return Ok(channel.clone());
        }
        let channel = Arc::new(Channel::open(upstream, idle)?);
        if let Some(old) = slot.replace(channel.clone()) {
            old.retired.store(true, Ordering::Relaxed);
        }
        Ok(channel)
    }
}

impl Drop for Channels {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(channel) = lock(slot).take() {
                channel.retired.store(true, Ordering::Relaxed);
            }
        }
    }
}

impl Channel {
    /// A socket on an ephemeral port connected to `upstream`, with its reader task.
    fn open(upstream: SocketAddr, idle: Duration) -> io::Result<Self> {
        let local =
            if upstream.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
        let socket = std::net::UdpSocket::bind((local, 0))?;
        socket.connect(upstream)?;
        socket.set_nonblocking(true)?;
        let channel = Self {
            socket: Arc::new(UdpSocket::from_std(socket)?),
            waiting: Arc::default(),
            opened: Instant::now(),
            retired: Arc::default(),
        };
        let (socket, waiting, retired) = (channel.socket.clone(), channel.waiting.clone(), channel.retired.clone());
        tokio::spawn(read(socket, waiting, retired, upstream, idle));
        Ok(channel)
    }

    /// Sends `query` under a free ID; the query as sent and where its response will come.
    async fn send(
        self: &Arc<Self>,
        query: &Message,
        keys: &RandomState,
        counter: &AtomicU64,
    ) -> io::Result<(Message, WaitingResponse)> {
        let (reply, response) = oneshot::channel();
        let mut sent = query.clone();
        let id = {
            let mut waiting = lock(&self.waiting);
            let id = (0..ID_TRIES)
                .map(|_| keys.hash_one(counter.fetch_add(1, Ordering::Relaxed)) as u16)
                .find(|id| !waiting.contains_key(id))
                .ok_or_else(|| io::Error::new(io::ErrorKind::WouldBlock, "no free message ID on the socket"))?;
            waiting.insert(id, Waiter { queries: query.queries.clone(), reply });
            id
        };
        let response = WaitingResponse { channel: self.clone(), id, response };
        sent.metadata.id = id;
        self.socket.send(&sent.to_vec().map_err(io::Error::other)?).await?;
        Ok((sent, response))
    }
}

/// The response to one question on a channel; dropping it frees the question's ID.
struct WaitingResponse {
    channel: Arc<Channel>,
    id: u16,
    response: oneshot::Receiver<Message>,
}

impl Drop for WaitingResponse {
    fn drop(&mut self) {
        lock(&self.channel.waiting).remove(&self.id);
    }
}

/// A channel's reader: hands each datagram that answers a waiting question to it, into one
/// buffer as large as the EDNS payload we advertise. A socket error (an ICMP port unreachable,
/// say) fails every question waiting, which then go to the next upstream. Ends when the channel is
/// retired and no question waits, or nothing arrived for `idle` (by then its questions have timed
/// out).
async fn read(
    socket: Arc<UdpSocket>,
    waiting: Arc<Mutex<HashMap<u16, Waiter>>>,
    retired: Arc<AtomicBool>,
    upstream: SocketAddr,
    idle: Duration,
) {
    let mut buffer = vec![0; usize::from(MAX_UDP_PAYLOAD)];
    loop {
        match tokio::time::timeout(idle, socket.recv(&mut buffer)).await {
            Ok(Ok(len)) => {
                let Ok(response) = Message::from_vec(&buffer[..len]) else {
                    debug!(%upstream, "ignoring a datagram that does not parse");
                    continue;
                };
                let mut waiting = lock(&waiting);
                let id = response.metadata.id;
                match waiting.get(&id) {
                    Some(waiter) if answers_queries(&waiter.queries, &response) => {
                        let waiter = waiting.remove(&id).expect("present");
                        let _ = waiter.reply.send(response);
                    }
                    _ => debug!(%upstream, "ignoring a datagram that does not answer a question"),
                }
                if waiting.is_empty() && retired.load(Ordering::Relaxed) {
                    return;
                }
            }
            Ok(Err(error)) => {
                debug!(%upstream, %error, "upstream socket failed");
                lock(&waiting).clear();
                // An ICMP error leaves the socket usable; any other retires it (a fresh one then
                // takes the next question) rather than spin on it.
                if error.kind() != io::ErrorKind::ConnectionRefused {
                    retired.store(true, Ordering::Relaxed);
                    return;
                }
            }
            Err(_) if retired.load(Ordering::Relaxed) => return,
            Err(_) => {}
        }
    }
}

/// Sends `query` over a new TCP connection (2-byte length prefix) and reads one response.
async fn exchange_tcp(upstream: SocketAddr, query: &Message) -> io::Result<Message> {
    let bytes = query.to_vec().map_err(io::Error::other)?;
    let len = u16::try_from(bytes.len()).map_err(io::Error::other)?;
    let mut stream = TcpStream::connect(upstream).await?;
    stream.write_all(&[&len.to_be_bytes(), bytes.as_slice()].concat()).await?;
    let mut buffer = vec![0; usize::from(stream.read_u16().await?)];
    stream.read_exact(&mut buffer).await?;
    Message::from_vec(&buffer).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// Whether `response` is the response to `query`: same ID, a response, the same question.
fn answers(query: &Message, response: &Message) -> bool {
    response.metadata.id == query.metadata.id && answers_queries(&query.queries, response)
}

/// Whether `response` is a response to `queries`.
fn answers_queries(queries: &[Query], response: &Message) -> bool {
    response.metadata.message_type == MessageType::Response && response.queries == queries
}

/// Locks `mutex`, ignoring poisoning (the maps guarded here stay consistent: each change is one
/// call).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
