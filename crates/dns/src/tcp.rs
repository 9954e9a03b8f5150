//! DNS over TCP with a bound on the connections each worker holds. hickory-server's own TCP front
//! end has none: every client, idle or not, holds a file descriptor until its idle timeout, and at
//! the process's descriptor limit the upstream sockets can no longer be opened. Here a worker
//! holds at most [`TcpLimits::max_connections`]: at the bound a new connection takes the place of
//! the one idle the longest, or is closed at once when every one is being answered; above 3/4 of
//! it idle connections are closed sooner; out of descriptors, the one idle the longest is closed.
//! Messages are framed as RFC 1035 §4.2.2 says (a two-byte length) and answered one after the
//! other, as hickory-server does. [`Connections`] decides (pure); [`serve`] runs the sockets.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_server::net::NetError;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::rr::Record;
use hickory_server::server::{RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use metrics::{counter, gauge};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tracing::debug;

use crate::upstream::lock;
use crate::wire;

/// `roadkeeper_dns_tcp_connections`: client TCP connections open, all workers together.
pub const TCP_CONNECTIONS: &str = "roadkeeper_dns_tcp_connections";
/// `roadkeeper_dns_tcp_connections_shed_total{reason}`: TCP connections closed or not taken for
/// lack of room: `idle_evicted` (an idle one closed to make room for a new one or for a
/// descriptor), `refused` (a new one closed at once: every open one was being answered),
/// `no_descriptor` (an accept failed: the process is out of descriptors).
pub const TCP_CONNECTIONS_SHED_TOTAL: &str = "roadkeeper_dns_tcp_connections_shed_total";

/// Descriptors the process keeps for its own use (standard streams, runtimes, the cluster
/// state's watcher, reads and API connections, listeners of the health and metrics servers).
const BASE_RESERVE: usize = 64;
/// Descriptors a worker keeps per upstream: its UDP socket, the one it replaced (still answering
/// its questions), and 8 TCP retries after truncated answers (more compete for what is left).
const UPSTREAM_RESERVE: usize = 10;
/// How long an idle connection stays open: hickory-server's default (and ours until now).
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle connection stays open above 3/4 of the bound: CoreDNS's read timeout.
const PRESSURED_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection is not closed for a descriptor after it came, so that the one a freed
/// descriptor let in is not the next one closed.
const FIRST_REQUEST_TIME: Duration = Duration::from_millis(500);

/// Bounds of one worker's client TCP connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a connection may wait for its next request, and a response take to be written.
    pub idle_timeout: Duration,
    /// The idle timeout once more than 3/4 of `max_connections` are open.
    pub pressured_idle_timeout: Duration,
}

impl TcpLimits {
    /// At most `max_connections`, idle for 10 s (2 s above 3/4 of them).
    pub fn new(max_connections: usize) -> Self {
        Self { max_connections, idle_timeout: IDLE_TIMEOUT, pressured_idle_timeout: PRESSURED_IDLE_TIMEOUT }
    }
}

/// What the process needs descriptors for besides clients' TCP connections.
#[derive(Clone, Copy, Debug)]
pub struct Reserve {
    /// Worker threads.
    pub workers: usize,
    /// `--listen` addresses (a UDP socket and a TCP listener each, per worker).
    pub listen: usize,
    /// Upstream resolvers.
    pub upstreams: usize,
    /// Connections the health and metrics servers may hold together.
    pub http_connections: usize,
}

impl Reserve {
    /// Descriptors kept: [`BASE_RESERVE`], the HTTP servers' connections, and per worker its
    /// sockets and those to the upstreams ([`UPSTREAM_RESERVE`] each).
    pub fn descriptors(&self) -> usize {
        BASE_RESERVE + self.http_connections + self.workers * (2 * self.listen + UPSTREAM_RESERVE * self.upstreams)
    }

    /// The most client TCP connections each worker may hold: `total` (`--max-tcp-connections`)
    /// shared among the workers, within the descriptors `nofile` (RLIMIT_NOFILE) leaves after the
    /// reserve; at least one.
    pub fn max_connections_per_worker(&self, total: usize, nofile: u64) -> usize {
        let workers = self.workers.max(1);
        let free = usize::try_from(nofile).unwrap_or(usize::MAX).saturating_sub(self.descriptors());
        (total.min(free) / workers).max(1)
    }
}

/// One worker's open connections, each with a handle `H` that is dropped when the connection is
/// to close for lack of room: which are idle since when, who is admitted, who makes room, when an
/// idle one times out. Pure: no sockets, the time is given.
pub(crate) struct Connections<H> {
    limits: TcpLimits,
    open: HashMap<u64, Connection<H>>,
    next_id: u64,
}

/// An open connection: idle since when (`None` while a request is being answered).
struct Connection<H> {
    idle_since: Option<Instant>,
    handle: H,
}

/// Whether a new connection is taken.
#[derive(Debug)]
pub(crate) enum Admission<H> {
    /// Taken under `id`, in place of the connection whose handle is `evicted`, if any.
    Admitted { id: u64, evicted: Option<H> },
    /// Not taken: at the bound, every open connection is being answered.
    Refused,
}

impl<H> Connections<H> {
    /// No connection yet, within `limits`.
    pub(crate) fn new(limits: TcpLimits) -> Self {
        Self { limits, open: HashMap::new(), next_id: 0 }
    }

    /// Admits a connection (idle from `now`) with `handle`: below the bound, or at it in place of
    /// the one idle the longest; refused when every open one is busy.
    pub(crate) fn admit(&mut self, handle: H, now: Instant) -> Admission<H> {
        let evicted = if self.open.len() >= self.limits.max_connections {
            match self.evict_oldest_idle(now) {
                Some(evicted) => Some(evicted),
                None => return Admission::Refused,
            }
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(id, Connection { idle_since: Some(now), handle });
        Admission::Admitted { id, evicted }
    }

    /// Removes the connection idle the longest, if it was admitted before `admitted_before`; its
    /// handle.
    pub(crate) fn evict_oldest_idle(&mut self, admitted_before: Instant) -> Option<H> {
        let (&id, _) = self
            .open
            .iter()
            .filter_map(|(id, c)| Some((id, c.idle_since?)))
            .filter(|(_, since)| *since < admitted_before)
            .min_by_key(|(_, since)| *since)?;
        self.open.remove(&id).map(|c| c.handle)
    }

    /// Connection `id` is being answered: not idle, never evicted.
    pub(crate) fn set_busy(&mut self, id: u64) {
        if let Some(connection) = self.open.get_mut(&id) {
            connection.idle_since = None;
        }
    }

    /// Connection `id` waits for its next request from `now`.
    pub(crate) fn set_idle(&mut self, id: u64, now: Instant) {
        if let Some(connection) = self.open.get_mut(&id) {
            connection.idle_since = Some(now);
        }
    }

    /// Connection `id` is closed.
    pub(crate) fn close(&mut self, id: u64) {
        self.open.remove(&id);
    }

    /// For idle connection `id` at `now`: `None` when it is to close (timed out, or no longer
    /// open), else when to check again: its deadline, or sooner as the open connections may
    /// shorten it by then.
    pub(crate) fn idle_check(&self, id: u64, now: Instant) -> Option<Instant> {
        let since = self.open.get(&id)?.idle_since.unwrap_or(now);
        let deadline = since + self.idle_timeout();
        (now < deadline).then(|| deadline.min(now + self.limits.pressured_idle_timeout))
    }

    /// The idle timeout with the connections open now: shorter above 3/4 of the bound.
    fn idle_timeout(&self) -> Duration {
        if self.open.len() * 4 > self.limits.max_connections * 3 {
            self.limits.pressured_idle_timeout
        } else {
            self.limits.idle_timeout
        }
    }
}

/// A worker's connections; each handle's receiver resolves when it is dropped.
type Table = Arc<Mutex<Connections<oneshot::Sender<()>>>>;

/// Serves DNS over TCP on `listeners` (bound and listening) with `handler`, within `limits` for
/// all of them together: one accept task per listener in the returned set, each holding its
/// connections' tasks (ended with it).
pub(crate) fn serve<H: RequestHandler + Clone>(
    listeners: Vec<std::net::TcpListener>,
    handler: H,
    limits: TcpLimits,
) -> io::Result<JoinSet<()>> {
    let table: Table = Arc::new(Mutex::new(Connections::new(limits)));
    let mut tasks = JoinSet::new();
    for listener in listeners {
        listener.set_nonblocking(true)?;
        tasks.spawn(accept(TcpListener::from_std(listener)?, handler.clone(), table.clone(), limits));
    }
    Ok(tasks)
}

/// Takes the connections of `listener` as `table` admits them.
async fn accept<H: RequestHandler + Clone>(listener: TcpListener, handler: H, table: Table, limits: TcpLimits) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) if out_of_descriptors(&error) => {
                counter!(TCP_CONNECTIONS_SHED_TOTAL, "reason" => "no_descriptor").increment(1);
                // Not one that has just come: it gets its first request's time.
                let evicted = lock(&table).evict_oldest_idle(Instant::now() - FIRST_REQUEST_TIME);
                if evicted.is_some() {
                    counter!(TCP_CONNECTIONS_SHED_TOTAL, "reason" => "idle_evicted").increment(1);
                }
                drop(evicted);
                // Time for the evicted connection to close, or for others to end: no spinning.
                let pause = if connections.is_empty() { 100 } else { 10 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
            Err(error) => {
                debug!(%error, "accepting a TCP connection");
                continue;
            }
        };
        let (handle, evicted) = oneshot::channel();
        let admission = lock(&table).admit(handle, Instant::now());
        match admission {
            Admission::Admitted { id, evicted: made_room } => {
                let open = Open::new(id, table.clone());
                connections.spawn(serve_connection(stream, peer, open, evicted, handler.clone(), limits));
                if made_room.is_some() {
                    counter!(TCP_CONNECTIONS_SHED_TOTAL, "reason" => "idle_evicted").increment(1);
                    drop(made_room);
                    // The evicted connection's task closes its socket before the next accept.
                    tokio::task::yield_now().await;
                }
            }
            Admission::Refused => counter!(TCP_CONNECTIONS_SHED_TOTAL, "reason" => "refused").increment(1),
        }
    }
}

/// Whether an accept failed for lack of descriptors (or of memory for one).
fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// An admitted connection: counted open until dropped, then removed from its table.
struct Open {
    id: u64,
    table: Table,
}

impl Open {
    fn new(id: u64, table: Table) -> Self {
        gauge!(TCP_CONNECTIONS).increment(1.0);
        Self { id, table }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        lock(&self.table).close(self.id);
        gauge!(TCP_CONNECTIONS).decrement(1.0);
    }
}

/// Answers the requests on `stream`, one after the other, until the client closes it, it stays
/// idle too long, a response cannot be written within the idle timeout, or it is evicted.
async fn serve_connection<H: RequestHandler>(
    mut stream: TcpStream,
    peer: SocketAddr,
    open: Open,
    mut evicted: oneshot::Receiver<()>,
    handler: H,
    limits: TcpLimits,
) {
    let (mut reader, mut writer) = stream.split();
    loop {
        let read = read_message(&mut reader);
        tokio::pin!(read);
        let message = loop {
            let Some(check) = lock(&open.table).idle_check(open.id, Instant::now()) else { return };
            tokio::select! {
                message = &mut read => break message,
                _ = &mut evicted => return,
                _ = tokio::time::sleep_until(check.into()) => {}
            }
        };
        let Ok(message) = message else { return };
        lock(&open.table).set_busy(open.id);
        if let Some(response) = respond(&handler, message, peer).await {
            let written = tokio::time::timeout(limits.idle_timeout, write_message(&mut writer, &response)).await;
            if !matches!(written, Ok(Ok(()))) {
                return;
            }
        }
        lock(&open.table).set_idle(open.id, Instant::now());
    }
}

/// The next message: a two-byte length, then that many bytes (the buffer grows as they come).
async fn read_message(reader: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let len = reader.read_u16().await?;
    let mut message = Vec::new();
    reader.take(u64::from(len)).read_to_end(&mut message).await?;
    if message.len() < usize::from(len) {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(message)
}

/// Writes `message` after its two-byte length.
async fn write_message(writer: &mut (impl AsyncWrite + Unpin), message: &[u8]) -> io::Result<()> {
    let len = u16::try_from(message.len()).map_err(io::Error::other)?;
    writer.write_all(&[&len.to_be_bytes(), message].concat()).await
}

/// What `handler` sends back to the request `message` from `peer`, as hickory-server's TCP front
/// end handles it (FORMERR for a message with a header only, nothing for one without).
async fn respond<H: RequestHandler>(handler: &H, message: Vec<u8>, peer: SocketAddr) -> Option<Vec<u8>> {
    let request = match wire::read_request(&message, peer, Protocol::Tcp) {
        Ok(request) => request,
        Err(formerr) => return formerr,
    };
    let reply = Reply::default();
    handler.handle_request::<_, TokioTime>(&request, reply.clone()).await;
    lock(&reply.0).take()
}

/// Where the handler's response lands, encoded, for the connection to write.
#[derive(Clone, Default)]
struct Reply(Arc<Mutex<Option<Vec<u8>>>>);

#[async_trait::async_trait]
impl ResponseHandler for Reply {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let (info, bytes) = wire::emit(response, Protocol::Tcp);
        *lock(&self.0) = Some(bytes);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> TcpLimits {
        TcpLimits {
            max_connections: max,
            idle_timeout: Duration::from_secs(10),
            pressured_idle_timeout: Duration::from_secs(2),
        }
    }

    fn admitted(admission: Admission<&'static str>) -> (u64, Option<&'static str>) {
        match admission {
            Admission::Admitted { id, evicted } => (id, evicted),
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn at_the_bound_a_new_connection_takes_the_place_of_the_one_idle_the_longest() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut table = Connections::new(limits(3));
        let (a, _) = admitted(table.admit("a", at(0)));
        let (b, _) = admitted(table.admit("b", at(1)));
        let (c, _) = admitted(table.admit("c", at(2)));
        // a was answered and is idle again since 3: b is now the one idle the longest.
        table.set_busy(a);
        table.set_idle(a, at(3));
        assert_eq!(admitted(table.admit("d", at(4))).1, Some("b"));
        assert_eq!(admitted(table.admit("e", at(4))).1, Some("c"));
        // Busy connections are never evicted; with all busy, new ones are refused.
        let open: Vec<u64> = table.open.keys().copied().collect();
        for id in open {
            table.set_busy(id);
        }
        assert!(matches!(table.admit("f", at(5)), Admission::Refused));
        assert_eq!(table.evict_oldest_idle(at(6)), None);
        // A closed connection frees its place.
        table.close(a);
        assert_eq!(admitted(table.admit("g", at(6))).1, None);
        // Out of descriptors, only connections that came before a given time are evicted.
        assert_eq!(table.evict_oldest_idle(at(6)), None);
        assert_eq!(table.evict_oldest_idle(at(7)), Some("g"));
        let _ = (b, c);
    }

    #[test]
    fn idle_connections_time_out_sooner_above_three_quarters_of_the_bound() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut table = Connections::new(limits(4));
        let (a, _) = admitted(table.admit("a", at(0)));
        // Checked every 2 s at most (the bound may tighten meanwhile), closed after 10 s.
        assert_eq!(table.idle_check(a, at(0)), Some(at(2_000)));
        assert_eq!(table.idle_check(a, at(9_000)), Some(at(10_000)));
        assert_eq!(table.idle_check(a, at(10_000)), None);
        // 3 of 4 open: not yet pressed. 4 of 4: 2 s.
        admitted(table.admit("b", at(0)));
        admitted(table.admit("c", at(0)));
        assert_eq!(table.idle_check(a, at(3_000)), Some(at(5_000)));
        admitted(table.admit("d", at(0)));
        assert_eq!(table.idle_check(a, at(1_000)), Some(at(2_000)));
        assert_eq!(table.idle_check(a, at(2_000)), None);
        // A busy connection is not timed out; a closed one is to close.
        table.set_busy(a);
        assert!(table.idle_check(a, at(60_000)).is_some());
        table.close(a);
        assert_eq!(table.idle_check(a, at(0)), None);
    }

    #[test]
    fn the_connections_fit_in_the_descriptors_left_after_the_reserve() {
        let reserve = Reserve { workers: 2, listen: 1, upstreams: 1, http_connections: 128 };
        // 64 + 128 + 2 · (2 + 10)
        assert_eq!(reserve.descriptors(), 216);
        assert_eq!(reserve.max_connections_per_worker(4096, 1 << 20), 2048, "the flag, shared by the workers");
        assert_eq!(reserve.max_connections_per_worker(4096, 1024), (1024 - 216) / 2, "the descriptors left");
        assert_eq!(reserve.max_connections_per_worker(4096, 100), 1, "never none");
        assert_eq!(reserve.max_connections_per_worker(4096, u64::MAX), 2048);
    }
}
