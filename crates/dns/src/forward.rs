//! Forwarding of names outside the cluster zones to upstream resolvers, with a cache: what
//! CoreDNS's `forward` and `cache` plugins do. Bounded: at most `max_concurrent` questions wait on
//! the upstreams (the others get SERVFAIL at once), identical questions in flight are asked once,
//! each worker reuses one socket per upstream ([`crate::upstream`]), and the cache is bounded in
//! bytes.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, Metadata, ResponseCode};
use hickory_proto::rr::{DNSClass, LowerName, RData, RecordType};
use metrics::{counter, gauge, histogram};
use moka::Expiry;
use moka::sync::Cache;
use tokio::sync::OnceCell;
use tokio::time::timeout_at;
use tracing::{debug, warn};

use crate::upstream::{Channels, lock};

/// Counter: queries answered from the cache.
pub const CACHE_HITS_TOTAL: &str = "roadkeeper_dns_cache_hits_total";
/// Counter: queries not in the cache, hence forwarded.
pub const CACHE_MISSES_TOTAL: &str = "roadkeeper_dns_cache_misses_total";
/// Gauge: bytes the cache holds (its entries' weight), as of the last insertion.
pub const CACHE_SIZE_BYTES: &str = "roadkeeper_dns_cache_size_bytes";
/// Gauge: entries the cache holds, as of the last insertion.
pub const CACHE_ENTRIES: &str = "roadkeeper_dns_cache_entries";
/// Counter of upstream attempts, labelled `to` (the upstream address) and `rcode` (the upstream's
/// response code such as `NOERROR` or `NXDOMAIN`, `timeout` when it did not answer in time,
/// `error` when the exchange failed, e.g. ICMP port unreachable or a TCP reset).
pub const FORWARD_REQUESTS_TOTAL: &str = "roadkeeper_dns_forward_requests_total";
/// Histogram: seconds a cache miss took to get its response from the upstreams (failover included).
pub const FORWARD_DURATION_SECONDS: &str = "roadkeeper_dns_forward_duration_seconds";
/// Counter: questions answered SERVFAIL at once because `max_concurrent` were already waiting.
pub const MAX_CONCURRENT_REJECTS_TOTAL: &str = "roadkeeper_dns_forward_max_concurrent_rejects_total";

/// What a cache entry weighs besides its response's bytes and its name: the key, the entry and
/// the cache's own bookkeeping of it, rounded up.
pub const ENTRY_OVERHEAD_BYTES: u32 = 256;

/// Timeouts and bounds.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Bound of one upstream try (UDP and, after a truncated answer, TCP); default 1s.
    pub attempt_timeout: Duration,
    /// Bound of the whole query; SERVFAIL when no upstream answered by then. Default 2s.
    pub total_timeout: Duration,
    /// Most questions waiting on the upstreams at once, identical ones included (CoreDNS's
    /// `max_concurrent`); beyond it SERVFAIL at once. Default 1000.
    pub max_concurrent: usize,
    /// Most bytes the cache holds: each entry weighs its response in wire format, its name and
    /// [`ENTRY_OVERHEAD_BYTES`]. Default 16 MiB.
    pub cache_max_bytes: u64,
    /// Longest time a positive answer is cached; default 1 hour.
    pub max_ttl: Duration,
    /// Longest time an NXDOMAIN or NODATA answer is cached; default 30 minutes.
    pub max_negative_ttl: Duration,
}

impl Default for ForwardConfig {
    /// 1s per try, 2s in all, 1000 questions waiting, 16 MiB of cache, positive answers up to
    /// 1h, negative up to 30min.
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(1),
            total_timeout: Duration::from_secs(2),
            max_concurrent: 1000,
            cache_max_bytes: 16 << 20,
            max_ttl: Duration::from_secs(3600),
            max_negative_ttl: Duration::from_secs(1800),
        }
    }
}

/// Forwards queries to upstream resolvers and caches their responses.
///
/// Upstreams are tried in the order given, the next one only when the previous one failed or did
/// not answer within `attempt_timeout` (CoreDNS picks them at random; in-order failover keeps the
/// resolv.conf semantics). One `Forwarder` serves one runtime (its sockets live there); the
/// handles of [`Forwarder::worker`] share its cache, bound and questions in flight.
pub struct Forwarder {
    shared: Arc<Shared>,
    channels: Channels,
}

/// What the workers' forwarders share.
struct Shared {
    upstreams: Vec<SocketAddr>,
    config: ForwardConfig,
    cache: Cache<CacheKey, Entry>,
    /// Questions being asked upstream, each answered once for all who wait on it.
    in_flight: Mutex<HashMap<CacheKey, Arc<InFlight>>>,
    /// Questions waiting on the upstreams (bounded by `max_concurrent`).
    waiting: AtomicUsize,
}

/// The upstreams' response to a question in flight, once there is one (`None`: none answered).
type InFlight = OnceCell<Option<Arc<Message>>>;

/// What a cached response answers: the question, whether DNSSEC records were asked for (DO) and
/// whether checking was disabled (CD: such an answer may be one a validator would reject).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct CacheKey {
    name: LowerName,
    query_type: RecordType,
    query_class: DNSClass,
    dnssec_ok: bool,
    checking_disabled: bool,
}

/// A cached response, in wire format (what it weighs is what it takes).
#[derive(Clone)]
struct Entry {
    response: Arc<[u8]>,
    inserted: Instant,
    ttl: Duration,
}

/// Expires each cache entry after its own TTL.
struct EntryTtl;

impl Expiry<CacheKey, Entry> for EntryTtl {
    fn expire_after_create(&self, _: &CacheKey, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(entry.ttl)
    }

    fn expire_after_update(&self, _: &CacheKey, entry: &Entry, _: Instant, _: Option<Duration>) -> Option<Duration> {
        Some(entry.ttl)
    }
}

/// A question counted among those waiting on the upstreams, until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A question joined to its entry among those in flight, which it leaves when dropped (answered,
/// or cancelled): the first to leave takes the entry away, so that later questions start anew
/// (and find the cache filled, if the answer may be cached).
struct Joined<'a> {
    map: &'a Mutex<HashMap<CacheKey, Arc<InFlight>>>,
    key: &'a CacheKey,
    cell: Arc<InFlight>,
}

impl<'a> Joined<'a> {
    fn join(map: &'a Mutex<HashMap<CacheKey, Arc<InFlight>>>, key: &'a CacheKey) -> Self {
        let cell = lock(map).entry(key.clone()).or_default().clone();
        Self { map, key, cell }
    }
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let mut map = lock(self.map);
        if map.get(self.key).is_some_and(|current| Arc::ptr_eq(current, &self.cell)) {
            map.remove(self.key);
        }
    }
}

impl Forwarder {
    /// A forwarder to `upstreams` (tried in this order) with an empty cache.
    pub fn new(upstreams: Vec<SocketAddr>, config: ForwardConfig) -> Self {
        let weigh = |key: &CacheKey, entry: &Entry| {
            let bytes = entry.response.len() + key.name.len();
            u32::try_from(bytes).unwrap_or(u32::MAX).saturating_add(ENTRY_OVERHEAD_BYTES)
        };
        let cache = Cache::builder().max_capacity(config.cache_max_bytes).weigher(weigh).expire_after(EntryTtl).build();
        let channels = Channels::new(upstreams.len());
        let shared = Shared { upstreams, config, cache, in_flight: Mutex::default(), waiting: AtomicUsize::new(0) };
        Self { shared: Arc::new(shared), channels }
    }

    /// A forwarder sharing this one's cache, bound and questions in flight, with sockets of its
    /// own: one per worker runtime.
    pub fn worker(&self) -> Self {
        Self { shared: self.shared.clone(), channels: Channels::new(self.shared.upstreams.len()) }
    }

    /// The response to `request` (a parsed query Message with one question): from the cache (TTLs
    /// decremented by the entry's age, request's ID), else from the first upstream that answers
    /// (UDP; retried over TCP with the same upstream when the UDP answer is truncated), shared
    /// with identical questions already in flight; SERVFAIL when no upstream answers within
    /// total_timeout or `max_concurrent` questions already wait, FORMERR when the request does
    /// not hold exactly one question. Never hangs.
    pub async fn forward(&self, request: &Message) -> Message {
        let [question] = request.queries.as_slice() else {
            return error_reply(request, ResponseCode::FormErr);
        };
        let shared = &*self.shared;
        let key = CacheKey {
            name: question.name().into(),
            query_type: question.query_type(),
            query_class: question.query_class(),
            dnssec_ok: request.edns.as_ref().is_some_and(|edns| edns.flags().dnssec_ok),
            checking_disabled: request.metadata.checking_disabled,
        };
        if let Some(entry) = shared.cache.get(&key) {
            counter!(CACHE_HITS_TOTAL).increment(1);
            let age = u32::try_from(entry.inserted.elapsed().as_secs()).unwrap_or(u32::MAX);
            return match Message::from_vec(&entry.response) {
                Ok(response) => reply_to(response, age, request),
                Err(_) => error_reply(request, ResponseCode::ServFail),
            };
        }
        counter!(CACHE_MISSES_TOTAL).increment(1);
        if shared.waiting.fetch_add(1, Ordering::Relaxed) >= shared.config.max_concurrent {
            shared.waiting.fetch_sub(1, Ordering::Relaxed);
            counter!(MAX_CONCURRENT_REJECTS_TOTAL).increment(1);
            return error_reply(request, ResponseCode::ServFail);
        }
        let _waiting = Waiting(&shared.waiting);
        let in_flight = Joined::join(&shared.in_flight, &key);
        let response = in_flight.cell.get_or_init(|| self.fetch(request, key.clone())).await.clone();
        drop(in_flight);
        match response {
            Some(response) => reply_to(Message::clone(&response), 0, request),
            None => error_reply(request, ResponseCode::ServFail),
        }
    }

    /// The upstreams' response to `request`, cached under `key` (before the question stops being
    /// in flight, so that no later one misses both).
    async fn fetch(&self, request: &Message, key: CacheKey) -> Option<Arc<Message>> {
        let started = Instant::now();
        let response = self.ask_upstreams(request).await;
        histogram!(FORWARD_DURATION_SECONDS).record(started.elapsed());
        let response = response?;
        let ttl = cache_ttl(&response, &self.shared.config);
        if !ttl.is_zero() {
            let cache = &self.shared.cache;
            if let Ok(bytes) = response.to_vec() {
                cache.insert(key, Entry { response: bytes.into(), inserted: Instant::now(), ttl });
                cache.run_pending_tasks();
                gauge!(CACHE_SIZE_BYTES).set(cache.weighted_size() as f64);
                gauge!(CACHE_ENTRIES).set(cache.entry_count() as f64);
            }
        }
        Some(Arc::new(response))
    }

    /// The first upstream's response, each upstream given `attempt_timeout`, all `total_timeout`.
    async fn ask_upstreams(&self, request: &Message) -> Option<Message> {
        let config = &self.shared.config;
        let deadline = Instant::now() + config.total_timeout;
        for (index, &upstream) in self.shared.upstreams.iter().enumerate() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let attempt_deadline = (now + config.attempt_timeout).min(deadline);
            let exchange = self.channels.exchange(index, upstream, request, config.total_timeout);
            let outcome = timeout_at(attempt_deadline.into(), exchange).await;
            let rcode = match &outcome {
                Ok(Ok(response)) => format!("{:?}", response.metadata.response_code).to_uppercase(),
                Ok(Err(error)) => {
                    debug!(%upstream, %error, "upstream failed");
                    "error".to_owned()
                }
                Err(_) => {
                    debug!(%upstream, "upstream timed out");
                    "timeout".to_owned()
                }
            };
            counter!(FORWARD_REQUESTS_TOTAL, "to" => upstream.to_string(), "rcode" => rcode).increment(1);
            if let Ok(Ok(response)) = outcome {
                return Some(response);
            }
        }
        None
    }
}

/// `response` (from the upstreams, or the cache `age` seconds ago) as the answer to `request`: its
/// ID and question (the client's spelling), TTLs decremented by `age`, no OPT record when the
/// request had none.
fn reply_to(mut response: Message, age: u32, request: &Message) -> Message {
    response.metadata.id = request.metadata.id;
    response.queries = request.queries.clone();
    if request.edns.is_none() {
        response.edns = None;
    }
    for record in response.answers.iter_mut().chain(&mut response.authorities).chain(&mut response.additionals) {
        record.decrement_ttl(age);
    }
    response
}

/// How long `response` may be cached: the lowest answer TTL for a positive answer, the SOA's
/// TTL or minimum, whichever is lower, for NXDOMAIN and NODATA (RFC 2308); zero (not cached) for
/// other response codes, truncated responses and negative ones without SOA.
fn cache_ttl(response: &Message, config: &ForwardConfig) -> Duration {
    let seconds = |ttl: u32| Duration::from_secs(ttl.into());
    if response.metadata.truncation {
        return Duration::ZERO;
    }
    match response.metadata.response_code {
        ResponseCode::NoError if !response.answers.is_empty() => {
            response.answers.iter().map(|record| seconds(record.ttl)).min().unwrap_or_default().min(config.max_ttl)
        }
        ResponseCode::NoError | ResponseCode::NXDomain => response
            .authorities
            .iter()
            .find_map(|record| match &record.data {
                RData::SOA(soa) => Some(seconds(record.ttl.min(soa.minimum))),
                _ => None,
            })
            .unwrap_or_default()
            .min(config.max_negative_ttl),
        _ => Duration::ZERO,
    }
}

/// A response with `rcode` and the request's ID, flags and question.
fn error_reply(request: &Message, rcode: ResponseCode) -> Message {
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata = Metadata::response_from_request(&request.metadata);
    reply.metadata.response_code = rcode;
    reply.metadata.recursion_available = true;
    reply.queries = request.queries.clone();
    reply.edns = request.edns.as_ref().map(|_| Edns::new());
    reply
}

/// The `nameserver` lines of a resolv.conf (port 53), in order; an error names the file.
/// Unparsable addresses (e.g. with a `%zone`) are skipped with a warning; no nameserver line gives
/// an empty list (glibc would then use 127.0.0.1: the caller decides).
pub fn upstreams_from_resolv_conf(path: &Path) -> io::Result<Vec<SocketAddr>> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", path.display())))?;
    let addresses = text.lines().filter_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            return None;
        }
        let address = words.next()?;
        let parsed = address.parse::<IpAddr>();
        if parsed.is_err() {
            warn!(file = %path.display(), address, "skipping an unparsable nameserver");
        }
        parsed.ok()
    });
    Ok(addresses.map(|ip| SocketAddr::new(ip, 53)).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::net::Ipv4Addr;

    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::rdata::{A, SOA, TXT};
    use hickory_proto::rr::{Name, Record};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, UdpSocket};
    use tokio::time::sleep;

    use super::*;

    /// A stub upstream on 127.0.0.1 that counts the UDP queries it gets and the ports they come
    /// from.
    struct Stub {
        addr: SocketAddr,
        queries: Arc<AtomicUsize>,
        ports: Arc<Mutex<HashSet<u16>>>,
    }

    impl Stub {
        fn queries(&self) -> usize {
            self.queries.load(Ordering::SeqCst)
        }
    }

    /// A stub answering each UDP query with the datagrams `respond` makes (none: silent).
    async fn udp_stub(respond: impl Fn(&Message) -> Vec<Message> + Send + 'static) -> Stub {
        serve_udp(UdpSocket::bind("127.0.0.1:0").await.unwrap(), Duration::ZERO, respond)
    }

    /// A stub answering like [`udp_stub`], `delay` after each query.
    async fn slow_udp_stub(delay: Duration, respond: impl Fn(&Message) -> Vec<Message> + Send + 'static) -> Stub {
        serve_udp(UdpSocket::bind("127.0.0.1:0").await.unwrap(), delay, respond)
    }

    fn serve_udp(
        socket: UdpSocket,
        delay: Duration,
        respond: impl Fn(&Message) -> Vec<Message> + Send + 'static,
    ) -> Stub {
        let stub = Stub { addr: socket.local_addr().unwrap(), queries: Arc::default(), ports: Arc::default() };
        let (queries, ports, socket) = (stub.queries.clone(), stub.ports.clone(), Arc::new(socket));
        tokio::spawn(async move {
            let mut buffer = vec![0; 65535];
            loop {
                let (len, from) = socket.recv_from(&mut buffer).await.unwrap();
                queries.fetch_add(1, Ordering::SeqCst);
                ports.lock().unwrap().insert(from.port());
                let responses = respond(&Message::from_vec(&buffer[..len]).unwrap());
                let socket = socket.clone();
                tokio::spawn(async move {
                    sleep(delay).await;
                    for response in responses {
                        socket.send_to(&response.to_vec().unwrap(), from).await.unwrap();
                    }
                });
            }
        });
        stub
    }

    /// A stub answering over UDP with `udp` and over TCP, on the same port, with `tcp`.
    async fn udp_tcp_stub(
        udp: impl Fn(&Message) -> Vec<Message> + Send + 'static,
        tcp: impl Fn(&Message) -> Message + Send + 'static,
    ) -> Stub {
        let (listener, socket) = loop {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            if let Ok(socket) = UdpSocket::bind(listener.local_addr().unwrap()).await {
                break (listener, socket);
            }
        };
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut buffer = vec![0; usize::from(stream.read_u16().await.unwrap())];
                stream.read_exact(&mut buffer).await.unwrap();
                let response = tcp(&Message::from_vec(&buffer).unwrap()).to_vec().unwrap();
                let len = u16::try_from(response.len()).unwrap().to_be_bytes();
                stream.write_all(&[&len, response.as_slice()].concat()).await.unwrap();
            }
        });
        serve_udp(socket, Duration::ZERO, udp)
    }

    fn config(attempt_ms: u64, total_ms: u64) -> ForwardConfig {
        ForwardConfig {
            attempt_timeout: Duration::from_millis(attempt_ms),
            total_timeout: Duration::from_millis(total_ms),
            ..ForwardConfig::default()
        }
    }

    fn query(name: &str, query_type: RecordType, id: u16) -> Message {
        let mut query = Message::query();
        query.metadata.id = id;
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(Name::from_ascii(name).unwrap(), query_type));
        query
    }

    fn response(query: &Message, rcode: ResponseCode) -> Message {
        let mut response = Message::response(query.metadata.id, OpCode::Query);
        response.metadata.response_code = rcode;
        response.queries = query.queries.clone();
        response
    }

    /// A NOERROR response to `query` with one A record per address.
    fn answer(query: &Message, addresses: &[[u8; 4]], ttl: u32) -> Message {
        let mut response = response(query, ResponseCode::NoError);
        for &address in addresses {
            let data = RData::A(A(address.into()));
            response.add_answer(Record::from_rdata(query.queries[0].name().clone(), ttl, data));
        }
        response
    }

    fn soa(ttl: u32, minimum: u32) -> Record {
        let name = Name::from_ascii("example.com.").unwrap();
        let data = SOA::new(Name::from_ascii("ns.example.com.").unwrap(), name.clone(), 1, 3600, 600, 86400, minimum);
        Record::from_rdata(name, ttl, RData::SOA(data))
    }

    fn addresses(response: &Message) -> Vec<Ipv4Addr> {
        let address = |record: &Record| match record.data {
            RData::A(A(address)) => address,
            ref other => panic!("not an A record: {other:?}"),
        };
        response.answers.iter().map(address).collect()
    }

    #[tokio::test]
    async fn relays_the_answer_with_the_request_id_and_caches_it() {
        let stub = udp_stub(|query| vec![answer(query, &[[192, 0, 2, 1]], 300)]).await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());

        let first = forwarder.forward(&query("www.example.com.", RecordType::A, 0x1234)).await;
        assert_eq!(first.metadata.id, 0x1234);
        assert_eq!(first.metadata.response_code, ResponseCode::NoError);
        assert_eq!(addresses(&first), [Ipv4Addr::new(192, 0, 2, 1)]);
        assert_eq!(first.answers[0].ttl, 300);

        sleep(Duration::from_millis(1100)).await;
        let second = forwarder.forward(&query("WWW.Example.COM.", RecordType::A, 0x4321)).await;
        assert_eq!(stub.queries(), 1, "a cache hit");
        assert_eq!(second.metadata.id, 0x4321);
        assert_eq!(second.queries[0].name().to_string(), "WWW.Example.COM.", "the client's question");
        assert_eq!(addresses(&second), [Ipv4Addr::new(192, 0, 2, 1)]);
        assert!((298..=299).contains(&second.answers[0].ttl), "TTL {}", second.answers[0].ttl);

        forwarder.forward(&query("www.example.com.", RecordType::AAAA, 1)).await;
        assert_eq!(stub.queries(), 2, "another type is another entry");
    }

    #[tokio::test]
    async fn nxdomain_is_relayed_with_its_soa_and_cached_per_rfc_2308() {
        let stub = udp_stub(|query| {
            let mut response = response(query, ResponseCode::NXDomain);
            response.add_authority(soa(600, 30));
            vec![response]
        })
        .await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());
        for id in [1, 2] {
            let reply = forwarder.forward(&query("nope.example.com.", RecordType::A, id)).await;
            assert_eq!((reply.metadata.id, reply.metadata.response_code), (id, ResponseCode::NXDomain));
            assert_eq!(reply.authorities, [soa(600, 30)]);
        }
        assert_eq!(stub.queries(), 1);
        let ttls: Vec<_> = forwarder.shared.cache.iter().map(|(_, entry)| entry.ttl).collect();
        assert_eq!(ttls, [Duration::from_secs(30)]);
    }

    #[tokio::test]
    async fn an_entry_expires_after_its_ttl() {
        let stub = udp_stub(|query| vec![answer(query, &[[192, 0, 2, 1]], 1)]).await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());
        let request = query("short.example.com.", RecordType::A, 1);
        forwarder.forward(&request).await;
        forwarder.forward(&request).await;
        assert_eq!(stub.queries(), 1);
        sleep(Duration::from_millis(1100)).await;
        assert_eq!(forwarder.forward(&request).await.answers[0].ttl, 1, "fresh from the upstream");
        assert_eq!(stub.queries(), 2);
    }

    #[test]
    fn cache_ttl_follows_the_response() {
        let config = ForwardConfig::default();
        let request = query("a.example.com.", RecordType::A, 1);
        let ttl = |response: &Message| cache_ttl(response, &config).as_secs();
        let with_soa = |rcode, soa: Record| {
            let mut response = response(&request, rcode);
            response.add_authority(soa);
            response
        };
        assert_eq!(ttl(&answer(&request, &[[192, 0, 2, 1], [192, 0, 2, 2]], 300)), 300);
        let mut mixed = answer(&request, &[[192, 0, 2, 1], [192, 0, 2, 2]], 300);
        mixed.answers[1].ttl = 100;
        assert_eq!(ttl(&mixed), 100, "the lowest answer TTL");
        assert_eq!(ttl(&answer(&request, &[[192, 0, 2, 1]], 86400)), 3600, "capped by max_ttl");
        assert_eq!(ttl(&answer(&request, &[[192, 0, 2, 1]], 0)), 0);
        assert_eq!(ttl(&with_soa(ResponseCode::NoError, soa(20, 60))), 20, "NODATA: the SOA's TTL is lower");
        assert_eq!(ttl(&with_soa(ResponseCode::NXDomain, soa(600, 30))), 30, "the SOA's minimum is lower");
        assert_eq!(ttl(&with_soa(ResponseCode::NXDomain, soa(86400, 86400))), 1800, "max_negative_ttl");
        assert_eq!(ttl(&response(&request, ResponseCode::NXDomain)), 0, "no SOA: not cached");
        assert_eq!(ttl(&with_soa(ResponseCode::ServFail, soa(600, 30))), 0);
        assert_eq!(ttl(&with_soa(ResponseCode::Refused, soa(600, 30))), 0);
    }

    #[tokio::test]
    async fn a_silent_upstream_fails_over_to_the_next() {
        let silent = udp_stub(|_| vec![]).await;
        let good = udp_stub(|query| vec![answer(query, &[[192, 0, 2, 1]], 300)]).await;
        let forwarder = Forwarder::new(vec![silent.addr, good.addr], config(300, 2000));
        let started = Instant::now();
        let reply = forwarder.forward(&query("www.example.com.", RecordType::A, 7)).await;
        let elapsed = started.elapsed();
        assert_eq!(addresses(&reply), [Ipv4Addr::new(192, 0, 2, 1)]);
        assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(1000), "{elapsed:?}");
        assert_eq!((silent.queries(), good.queries()), (1, 1));
    }

    #[tokio::test]
    async fn silent_upstreams_give_servfail_within_the_total_timeout() {
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(udp_stub(|_| vec![]).await);
        }
        let forwarder = Forwarder::new(silent.iter().map(|stub| stub.addr).collect(), config(200, 500));
        let request = query("www.example.com.", RecordType::A, 9);
        let started = Instant::now();
        let reply = forwarder.forward(&request).await;
        let elapsed = started.elapsed();
        assert_eq!((reply.metadata.id, reply.metadata.response_code), (9, ResponseCode::ServFail));
        assert_eq!(reply.queries, request.queries);
        assert!(elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(900), "{elapsed:?}");
        assert_eq!(silent.iter().map(Stub::queries).collect::<Vec<_>>(), [1, 1, 1], "the third got the last 100ms");
        assert!(forwarder.shared.cache.iter().next().is_none(), "SERVFAIL is not cached");
    }

    #[tokio::test]
    async fn a_truncated_answer_is_retried_over_tcp() {
        let full = [[192, 0, 2, 1], [192, 0, 2, 2], [192, 0, 2, 3]];
        let stub = udp_tcp_stub(
            |query| {
                let mut truncated = response(query, ResponseCode::NoError);
                truncated.metadata.truncation = true;
                vec![truncated]
            },
            move |query| answer(query, &full, 300),
        )
        .await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());
        let reply = forwarder.forward(&query("many.example.com.", RecordType::A, 3)).await;
        assert_eq!(reply.metadata.id, 3);
        assert!(!reply.metadata.truncation);
        assert_eq!(addresses(&reply), full.map(Ipv4Addr::from));
    }

    #[tokio::test]
    async fn responses_with_a_wrong_id_or_question_are_ignored() {
        let stub = udp_stub(|query| {
            let mut wrong_id = answer(query, &[[6, 6, 6, 6]], 300);
            wrong_id.metadata.id = query.metadata.id.wrapping_add(1);
            let mut wrong_question = answer(query, &[[6, 6, 6, 7]], 300);
            wrong_question.queries = vec![Query::query(Name::from_ascii("evil.example.").unwrap(), RecordType::A)];
            vec![wrong_id, wrong_question, answer(query, &[[192, 0, 2, 1]], 300)]
        })
        .await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());
        let reply = forwarder.forward(&query("www.example.com.", RecordType::A, 5)).await;
        assert_eq!(addresses(&reply), [Ipv4Addr::new(192, 0, 2, 1)]);
    }

    /// `request` forwarded by `forwarder` on a task of its own.
    fn spawn_forward(forwarder: &Arc<Forwarder>, request: Message) -> tokio::task::JoinHandle<Message> {
        let forwarder = forwarder.clone();
        tokio::spawn(async move { forwarder.forward(&request).await })
    }

    #[tokio::test]
    async fn questions_beyond_max_concurrent_get_servfail_at_once() {
        let silent = udp_stub(|_| vec![]).await;
        let config = ForwardConfig { max_concurrent: 2, ..config(1000, 2000) };
        let forwarder = Arc::new(Forwarder::new(vec![silent.addr], config));
        let waiting: Vec<_> =
            (0..2).map(|i| spawn_forward(&forwarder, query(&format!("w{i}.example."), RecordType::A, i))).collect();
        while silent.queries() < 2 {
            sleep(Duration::from_millis(5)).await;
        }
        let reply = forwarder.forward(&query("third.example.", RecordType::A, 3)).await;
        assert_eq!((reply.metadata.id, reply.metadata.response_code), (3, ResponseCode::ServFail));
        assert!(waiting.iter().all(|task| !task.is_finished()), "the third did not wait for the first two");
        assert_eq!(silent.queries(), 2, "and was not asked upstream");
        for task in waiting {
            assert_eq!(task.await.unwrap().metadata.response_code, ResponseCode::ServFail);
        }
        assert_eq!(forwarder.forward(&query("later.example.", RecordType::A, 4)).await.metadata.id, 4);
        assert_eq!(silent.queries(), 3, "room again once they are done");
    }

    #[tokio::test]
    async fn identical_questions_in_flight_are_asked_once() {
        let stub = slow_udp_stub(Duration::from_millis(200), |query| vec![answer(query, &[[192, 0, 2, 7]], 0)]).await;
        let forwarder = Arc::new(Forwarder::new(vec![stub.addr], ForwardConfig::default()));
        let names = ["same.example.", "SAME.example.", "Same.Example."];
        let tasks: Vec<_> =
            (0..12).map(|id| spawn_forward(&forwarder, query(names[id % 3], RecordType::A, id as u16))).collect();
        for (id, task) in tasks.into_iter().enumerate() {
            let reply = task.await.unwrap();
            assert_eq!(reply.metadata.id, id as u16);
            assert_eq!(reply.queries[0].name().to_string(), names[id % 3], "each its own spelling");
            assert_eq!(addresses(&reply), [Ipv4Addr::new(192, 0, 2, 7)]);
        }
        assert_eq!(stub.queries(), 1, "one question upstream (TTL 0: not cached)");
        forwarder.forward(&query("same.example.", RecordType::A, 1)).await;
        assert_eq!(stub.queries(), 2, "asked again once answered");
    }

    #[tokio::test]
    async fn a_question_given_up_leaves_nothing_behind() {
        let stub = slow_udp_stub(Duration::from_millis(300), |query| vec![answer(query, &[[192, 0, 2, 7]], 0)]).await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());
        let request = query("slow.example.", RecordType::A, 1);
        assert!(tokio::time::timeout(Duration::from_millis(50), forwarder.forward(&request)).await.is_err());
        assert!(lock(&forwarder.shared.in_flight).is_empty(), "no question in flight");
        assert_eq!(forwarder.shared.waiting.load(Ordering::Relaxed), 0, "none waiting");
        assert_eq!(addresses(&forwarder.forward(&request).await), [Ipv4Addr::new(192, 0, 2, 7)], "asked anew");
    }

    #[tokio::test]
    async fn an_answer_fetched_with_checking_disabled_is_cached_apart() {
        let stub = udp_stub(|query| {
            let address = if query.metadata.checking_disabled { [192, 0, 2, 66] } else { [192, 0, 2, 1] };
            vec![answer(query, &[address], 300)]
        })
        .await;
        let forwarder = Forwarder::new(vec![stub.addr], ForwardConfig::default());
        let mut unchecked = query("signed.example.", RecordType::A, 1);
        unchecked.metadata.checking_disabled = true;
        let checked = query("signed.example.", RecordType::A, 2);
        for _ in 0..2 {
            assert_eq!(addresses(&forwarder.forward(&unchecked).await), [Ipv4Addr::new(192, 0, 2, 66)]);
            assert_eq!(addresses(&forwarder.forward(&checked).await), [Ipv4Addr::new(192, 0, 2, 1)]);
        }
        assert_eq!(stub.queries(), 2, "one entry each");
    }

    #[tokio::test]
    async fn the_cache_is_bounded_in_bytes() {
        // Each response holds 1000 bytes of TXT: 8 KiB of cache keep about seven.
        let stub = udp_stub(|query| {
            let mut response = response(query, ResponseCode::NoError);
            let data = RData::TXT(TXT::new(vec!["x".repeat(250); 4]));
            response.add_answer(Record::from_rdata(query.queries[0].name().clone(), 300, data));
            vec![response]
        })
        .await;
        let config = ForwardConfig { cache_max_bytes: 8192, ..ForwardConfig::default() };
        let forwarder = Forwarder::new(vec![stub.addr], config);
        for i in 0..40 {
            let reply = forwarder.forward(&query(&format!("big-{i}.example."), RecordType::TXT, 1)).await;
            assert_eq!(reply.answers.len(), 1);
        }
        let cache = &forwarder.shared.cache;
        cache.run_pending_tasks();
        assert!(cache.weighted_size() <= 8192, "{} bytes", cache.weighted_size());
        assert!((1..=8).contains(&cache.entry_count()), "{} entries", cache.entry_count());
    }

    #[tokio::test]
    async fn questions_to_an_upstream_share_one_socket_and_a_worker_has_its_own() {
        let stub = slow_udp_stub(Duration::from_millis(50), |query| vec![answer(query, &[[192, 0, 2, 1]], 0)]).await;
        let forwarder = Arc::new(Forwarder::new(vec![stub.addr], ForwardConfig::default()));
        let tasks: Vec<_> =
            (0..50).map(|i| spawn_forward(&forwarder, query(&format!("n{i}.example."), RecordType::A, i))).collect();
        for (id, task) in tasks.into_iter().enumerate() {
            let reply = task.await.unwrap();
            assert_eq!((reply.metadata.id, addresses(&reply).len()), (id as u16, 1));
        }
        assert_eq!((stub.queries(), stub.ports.lock().unwrap().len()), (50, 1), "fifty questions, one source port");
        forwarder.worker().forward(&query("other.example.", RecordType::A, 1)).await;
        assert_eq!(stub.ports.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn an_unreachable_upstream_fails_its_questions_at_once() {
        // A port nobody listens on: the kernel answers ICMP port unreachable.
        let closed = UdpSocket::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let good = udp_stub(|query| vec![answer(query, &[[192, 0, 2, 1]], 300)]).await;
        let forwarder = Forwarder::new(vec![closed, good.addr], config(1000, 2000));
        let started = Instant::now();
        let reply = forwarder.forward(&query("www.example.com.", RecordType::A, 7)).await;
        assert_eq!(addresses(&reply), [Ipv4Addr::new(192, 0, 2, 1)]);
        assert!(started.elapsed() < Duration::from_millis(900), "waited {:?} on the closed port", started.elapsed());
    }

    #[tokio::test]
    async fn a_request_without_one_question_gets_formerr() {
        let forwarder = Forwarder::new(vec![], ForwardConfig::default());
        let mut request = Message::query();
        request.metadata.id = 4;
        let reply = forwarder.forward(&request).await;
        assert_eq!((reply.metadata.id, reply.metadata.response_code), (4, ResponseCode::FormErr));
    }

    #[test]
    fn resolv_conf_nameservers() {
        let path = std::env::temp_dir().join(format!("roadkeeper-dns-resolv-{}.conf", std::process::id()));
        let text = "# nameserver 9.9.9.9\n; nameserver 8.8.8.8\n#nameserver 7.7.7.7\n\
                    search default.svc.cluster.local svc.cluster.local\noptions ndots:5\n\
                    nameserver 1.2.3.4\n  nameserver\t2001:db8::1  # second\nnameserver not-an-address\nnameserver\n";
        std::fs::write(&path, text).unwrap();
        let upstreams = upstreams_from_resolv_conf(&path);
        std::fs::remove_file(&path).unwrap();
        let expected: [SocketAddr; 2] = ["1.2.3.4:53".parse().unwrap(), "[2001:db8::1]:53".parse().unwrap()];
        assert_eq!(upstreams.unwrap(), expected);

        let error = upstreams_from_resolv_conf(&path).unwrap_err();
        assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    }
}
