//! `roadkeeper dns` over the wire: the real binary in its own network namespace, asked real
//! UDP and TCP questions. Every record form and negative answer (PTR for every endpoint,
//! ExternalName inside the zone, the server's own name), truncation to whole messages and the
//! TC-bit fallback, forwarding with a cache (byte-bounded, keyed by the CD bit) and a quick
//! SERVFAIL, identical questions asked once, a flood at a silent upstream with the server's
//! descriptors and memory watched, idle TCP clients at the descriptor limit, one worker per CPU,
//! answers following changes, hostile packets, health and metrics, and the API server as the
//! source.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::apiserver::ControlPlane;
use common::http::{get_in, sample, try_sample};
use common::{binary, eventually};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use roadkeeper_netlab::{Netns, Process};

/// Where the server listens inside its namespace.
const DNS: &str = "127.0.0.1:53";
/// A second address of the server's namespace, on its loopback: what a pod's address would be.
const POD_ADDRESS: &str = "10.244.0.53";
const OK: ResponseCode = ResponseCode::NoError;
const NX: ResponseCode = ResponseCode::NXDomain;

/// A DNS server in its own namespace, reading a manifest folder or a control plane running in
/// the same namespace. Drops the process first, then the control plane, then the namespace.
struct DnsServer {
    process: Option<Process>,
    /// What runs the binary: `prlimit` and its options, or nothing.
    launcher: Vec<String>,
    api: Option<ControlPlane>,
    ns: Netns,
    manifests: tempfile::TempDir,
    log: PathBuf,
    _scratch: tempfile::TempDir,
}

impl DnsServer {
    /// Writes `manifests` (file name, YAML) and starts `roadkeeper dns` with `extra` flags.
    fn start(manifests: &[(&str, String)], extra: &[&str]) -> DnsServer {
        Self::start_under(&[], manifests, extra)
    }

    /// As [`DnsServer::start`], the binary run by `launcher` (a command that execs it, e.g.
    /// `prlimit`).
    fn start_under(launcher: &[&str], manifests: &[(&str, String)], extra: &[&str]) -> DnsServer {
        let ns = Netns::new("rk-dns").expect("netns");
        // An address an endpoint may have (not loopback), for tests that listen on it too.
        ns.ip(["addr", "add", &format!("{POD_ADDRESS}/32"), "dev", "lo"]).expect("address");
        let dir = tempfile::tempdir().expect("tempdir");
        for (file, yaml) in manifests {
            std::fs::write(dir.path().join(file), yaml).expect("write manifest");
        }
        let scratch = tempfile::tempdir().expect("tempdir");
        let log = scratch.path().join("dns.log");
        let launcher = launcher.iter().map(|s| s.to_string()).collect();
        let mut server = DnsServer { process: None, launcher, api: None, ns, manifests: dir, log, _scratch: scratch };
        server.spawn(&["--manifests", &server.manifests.path().display().to_string()], extra);
        server
    }

    /// Starts the binary with `source` and `extra` flags and waits until it answers.
    fn spawn(&mut self, source: &[&str], extra: &[&str]) {
        let mut args = self.launcher.clone();
        args.extend([binary().display().to_string(), "dns".into(), "-v".into(), "--listen".into(), DNS.into()]);
        args.extend(source.iter().chain(extra).map(|s| s.to_string()));
        if !extra.contains(&"--upstream") {
            // Nothing listens there: names that reach it are SERVFAIL.
            args.extend(["--upstream".into(), "127.0.0.1:9".into()]);
        }
        self.process = Some(self.ns.spawn_logged(&args, &self.log).expect("spawn roadkeeper dns"));
        let up = eventually(Duration::from_secs(60), || {
            self.try_ask("dns-version.cluster.local.", RecordType::TXT, false).is_some()
        });
        assert!(up, "roadkeeper dns did not answer; log:\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Asks `name` `qtype` over UDP (with EDNS, 1232 bytes) or TCP; `None` on timeout.
    fn try_ask(&self, name: &str, qtype: RecordType, tcp: bool) -> Option<Message> {
        let query = query(name, qtype, Some(1232));
        let raw = self.ns.run(|| if tcp { exchange_tcp(&query) } else { exchange_udp(&query) })?;
        Some(Message::from_vec(&raw).expect("a parsable response"))
    }

    /// Asks as a stub resolver does: up to three tries (a busy machine may delay one past the
    /// second a try waits).
    fn ask(&self, name: &str, qtype: RecordType, tcp: bool) -> Message {
        (0..3)
            .find_map(|_| self.try_ask(name, qtype, tcp))
            .unwrap_or_else(|| panic!("no answer to {name} {qtype}; log:\n{}", self.log()))
    }

    /// Sends raw bytes over UDP and returns the raw response, if any within a second.
    fn raw_udp(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        self.ns.run(|| exchange_udp(bytes))
    }

    fn alive(&self) -> bool {
        self.process.as_ref().expect("running").try_wait().expect("poll").is_none()
    }
}

/// A query message: one question, recursion desired, optionally EDNS with that payload.
fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut message = Message::new(0x4242, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.queries.push(Query::query(Name::from_ascii(name).expect("name"), qtype));
    if let Some(payload) = edns {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        message.edns = Some(e);
    }
    message.to_vec().expect("encode")
}

fn exchange_udp(bytes: &[u8]) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    socket.send_to(bytes, DNS).ok()?;
    let mut buf = vec![0; 65535];
    let n = socket.recv(&mut buf).ok()?;
    Some(buf[..n].to_vec())
}

fn exchange_tcp(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&DNS.parse().expect("addr"), Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut framed = u16::try_from(bytes.len()).expect("size").to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).ok()?;
    let mut length = [0; 2];
    stream.read_exact(&mut length).ok()?;
    let mut response = vec![0; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut response).ok()?;
    Some(response)
}

/// `name TYPE data` of each record.
fn lines(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| format!("{} {} {}", r.name, r.record_type(), r.data)).collect()
}

/// Asserts a negative answer: `rcode`, no answers, the zone's SOA in the authority section.
fn assert_negative(response: &Message, rcode: ResponseCode, zone: &str) {
    assert_eq!(response.metadata.response_code, rcode, "{response}");
    assert!(response.answers.is_empty(), "{response}");
    let soa = response.authorities.first().unwrap_or_else(|| panic!("no SOA: {response}"));
    assert!(matches!(soa.data, RData::SOA(_)) && soa.name.to_string() == zone, "{response}");
}

fn service(name: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {spec}\n")
}

/// A hand-written EndpointSlice of Service `service` (port `pg` 5432).
fn slice(name: &str, service: &str, family: &str, endpoints: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\n\
         addressType: {family}\nports: [{{name: pg, port: 5432, protocol: TCP}}]\nendpoints: {endpoints}\n"
    )
}

/// web (dual-stack ClusterIP with named ports), v4only, db (headless, db-0 in both families, one
/// endpoint without hostname, one not ready), empty (headless without endpoints), ext
/// (ExternalName), a Pod, a Namespace without Services.
fn cluster() -> Vec<(&'static str, String)> {
    vec![
        ("web.yaml", service("web", "{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10, 'fd00:96::10'], ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack, ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]}")),
        ("v4only.yaml", service("v4only", "{clusterIP: 10.96.0.11, ports: [{port: 80}]}")),
        ("db.yaml", service("db", "{clusterIP: None, ports: [{name: pg, port: 5432}]}")),
        ("db-4.yaml", slice("db-4", "db", "IPv4", "[{addresses: [10.244.0.5], hostname: db-0}, {addresses: [10.244.0.6]}, {addresses: [10.244.0.7], conditions: {ready: false}}]")),
        ("db-6.yaml", slice("db-6", "db", "IPv6", "[{addresses: ['fd00:244::5'], hostname: db-0}]")),
        ("empty.yaml", service("empty", "{clusterIP: None}")),
        ("ext.yaml", service("ext", "{type: ExternalName, externalName: example.com}")),
        ("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: default}\nspec: {containers: []}\nstatus: {podIP: 10.244.0.9}\n".into()),
        ("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: quiet}\n".into()),
    ]
}

#[test]
fn every_record_form_and_negative_answer_over_udp_and_tcp() {
    let dns = DnsServer::start(&cluster(), &["--pods", "verified"]);
    for tcp in [false, true] {
        let ask = |name: &str, qtype| dns.ask(name, qtype, tcp);
        let a = ask("web.default.svc.cluster.local.", RecordType::A);
        assert!(a.metadata.authoritative && a.metadata.response_code == OK);
        assert_eq!(lines(&a.answers), ["web.default.svc.cluster.local. A 10.96.0.10"]);
        let aaaa = ask("Web.DEFAULT.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(lines(&aaaa.answers), ["Web.DEFAULT.svc.cluster.local. AAAA fd00:96::10"], "case echoed");
        assert_eq!(aaaa.answers[0].ttl, 5);
        assert_negative(&ask("v4only.default.svc.cluster.local.", RecordType::AAAA), OK, "cluster.local.");
        assert_negative(&ask("nope.default.svc.cluster.local.", RecordType::A), NX, "cluster.local.");
        assert_negative(&ask("web.nope.svc.cluster.local.", RecordType::A), NX, "cluster.local.");
        for nodata in
            ["svc.cluster.local.", "pod.cluster.local.", "default.svc.cluster.local.", "quiet.svc.cluster.local."]
        {
            assert_negative(&ask(nodata, RecordType::A), OK, "cluster.local.");
        }
        assert_eq!(
            lines(&ask("dns-version.cluster.local.", RecordType::TXT).answers),
            ["dns-version.cluster.local. TXT 1.1.0"]
        );

        // Headless: ready endpoints, per-hostname and dashed names; NXDOMAIN without endpoints.
        let db = ask("db.default.svc.cluster.local.", RecordType::A);
        assert_eq!(db.answers.len(), 2, "{db}");
        assert_eq!(
            lines(&ask("db-0.db.default.svc.cluster.local.", RecordType::AAAA).answers),
            ["db-0.db.default.svc.cluster.local. AAAA fd00:244::5"]
        );
        assert_eq!(ask("10-244-0-6.db.default.svc.cluster.local.", RecordType::A).answers.len(), 1);
        assert_negative(&ask("10-244-0-7.db.default.svc.cluster.local.", RecordType::A), NX, "cluster.local.");
        assert_negative(&ask("empty.default.svc.cluster.local.", RecordType::A), NX, "cluster.local.");

        // SRV: ClusterIP and headless forms, with the targets' addresses as additionals.
        let srv = ask("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(
            lines(&srv.answers),
            ["_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."]
        );
        assert_eq!(srv.additionals.iter().filter(|r| r.record_type() != RecordType::OPT).count(), 2);
        let srv = ask("_pg._tcp.db.default.svc.cluster.local.", RecordType::SRV);
        let targets: Vec<String> = srv.answers.iter().map(|r| r.data.to_string()).collect();
        assert_eq!(
            targets,
            [
                "0 33 5432 db-0.db.default.svc.cluster.local.",
                "0 33 5432 10-244-0-6.db.default.svc.cluster.local.",
                "0 33 5432 db-0.db.default.svc.cluster.local."
            ]
        );
        assert_negative(&ask("_nope._tcp.web.default.svc.cluster.local.", RecordType::SRV), NX, "cluster.local.");

        // ExternalName, PTR (service and endpoint, both families), pods (verified).
        assert_eq!(
            lines(&ask("ext.default.svc.cluster.local.", RecordType::A).answers),
            ["ext.default.svc.cluster.local. CNAME example.com."]
        );
        assert_negative(&ask("www.ext.default.svc.cluster.local.", RecordType::A), NX, "cluster.local.");
        assert_eq!(
            lines(&ask("10.0.96.10.in-addr.arpa.", RecordType::PTR).answers),
            ["10.0.96.10.in-addr.arpa. PTR web.default.svc.cluster.local."]
        );
        assert_eq!(
            lines(&ask("5.0.244.10.in-addr.arpa.", RecordType::PTR).answers),
            ["5.0.244.10.in-addr.arpa. PTR db-0.db.default.svc.cluster.local."]
        );
        let v6 = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.";
        assert_eq!(lines(&ask(v6, RecordType::PTR).answers), [format!("{v6} PTR web.default.svc.cluster.local.")]);
        assert_eq!(
            lines(&ask("10-244-0-9.default.pod.cluster.local.", RecordType::A).answers),
            ["10-244-0-9.default.pod.cluster.local. A 10.244.0.9"]
        );
        assert_negative(&ask("10-244-0-8.default.pod.cluster.local.", RecordType::A), NX, "cluster.local.");
    }
    assert!(dns.alive());
}

#[test]
fn large_answers_are_truncated_over_udp_and_whole_over_tcp() {
    let endpoints: Vec<String> =
        (0..200).map(|i| format!("{{addresses: [10.244.{}.{}]}}", i / 250, i % 250 + 1)).collect();
    let mut manifests = vec![("big.yaml", service("big", "{clusterIP: None, ports: [{name: pg, port: 5432}]}"))];
    manifests.push(("big-4.yaml", slice("big-4", "big", "IPv4", &format!("[{}]", endpoints.join(", ")))));
    let dns = DnsServer::start(&manifests, &[]);
    let name = "big.default.svc.cluster.local.";
    // Without EDNS, at most 512 bytes; with EDNS, the payload (capped at 1232); both with TC.
    for edns in [None, Some(4096)] {
        let raw = dns.raw_udp(&query(name, RecordType::A, edns)).expect("an answer");
        let limit = if edns.is_some() { 1232 } else { 512 };
        let response = Message::from_vec(&raw).expect("parsable");
        assert!(
            raw.len() <= limit && response.metadata.truncation,
            "{} bytes, TC {}",
            raw.len(),
            response.metadata.truncation
        );
    }
    let whole = dns.ask(name, RecordType::A, true);
    assert_eq!((whole.answers.len(), whole.metadata.truncation), (200, false));
    // A real client retries over TCP on TC and gets everything.
    let out = dns.ns.exec(["dig", "+short", "@127.0.0.1", name, "A"]).expect("dig");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 200);
}

#[test]
fn names_outside_the_zone_are_forwarded_cached_and_fail_fast() {
    // A stub upstream in the namespace answering example.com A 192.0.2.1 (TTL 60), counting
    // questions, and NXDOMAIN for everything else.
    let mut dns = DnsServer::start(&cluster(), &["--upstream", "127.0.0.1:5300"]);
    let upstream = Upstream::start(&dns.ns, "127.0.0.1:5300", |request| {
        let question = &request.queries[0];
        let ip = "192.0.2.1".parse().expect("ip");
        if question.name().to_lowercase().to_string() == "example.com." && question.query_type() == RecordType::A {
            Some(reply(request, OK, vec![Record::from_rdata(question.name().clone(), 60, RData::A(A(ip)))]))
        } else {
            Some(reply(request, NX, Vec::new()))
        }
    });
    let first = dns.ask("example.com.", RecordType::A, false);
    assert_eq!(
        (first.metadata.response_code, lines(&first.answers)),
        (OK, vec!["example.com. A 192.0.2.1".to_string()])
    );
    assert!(!first.metadata.authoritative && first.metadata.recursion_available);
    let second = dns.ask("EXAMPLE.com.", RecordType::A, true);
    assert_eq!(second.answers.len(), 1);
    assert_eq!(upstream.questions(), 1, "the second answer came from the cache");
    // Reverse names of unknown addresses fall through to the upstream (NXDOMAIN there).
    assert_eq!(dns.ask("4.3.2.1.in-addr.arpa.", RecordType::PTR, false).metadata.response_code, NX);
    assert_eq!(upstream.questions(), 2);
    let (_, metrics) = get_in(&dns.ns, "127.0.0.1:9153", "/metrics");
    assert!(sample(&metrics, "roadkeeper_dns_cache_hits_total") >= 1.0, "{metrics}");

    // With --no-fallthrough they are NXDOMAIN with the reverse zone's SOA; a dead upstream is a
    // quick SERVFAIL.
    dns.process.take().expect("running").terminate(Duration::from_secs(5)).expect("stop");
    let source = ["--manifests".to_string(), dns.manifests.path().display().to_string()];
    dns.spawn(&source.iter().map(String::as_str).collect::<Vec<_>>(), &["--no-fallthrough"]);
    assert_negative(&dns.ask("4.3.2.1.in-addr.arpa.", RecordType::PTR, false), NX, "in-addr.arpa.");
    let started = Instant::now();
    let failed = dns.ask("example.org.", RecordType::A, false);
    assert_eq!(failed.metadata.response_code, ResponseCode::ServFail);
    assert!(started.elapsed() < Duration::from_secs(3), "SERVFAIL took {:?}", started.elapsed());
}

/// What an [`Upstream`] saw: questions, the source ports they came from, the largest EDNS
/// payload they advertised.
#[derive(Default)]
struct Seen {
    questions: usize,
    ports: HashSet<u16>,
    max_payload: u16,
}

/// A UDP upstream resolver in the lab namespace: answers each question with what `respond`
/// returns (`None`: never), after `delay`; stops when dropped.
struct Upstream {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    fn start(ns: &Netns, addr: &str, respond: impl Fn(&Message) -> Option<Message> + Send + 'static) -> Upstream {
        Self::delayed(ns, addr, Duration::ZERO, respond)
    }

    fn delayed(
        ns: &Netns,
        addr: &str,
        delay: Duration,
        respond: impl Fn(&Message) -> Option<Message> + Send + 'static,
    ) -> Upstream {
        let socket = ns.run(|| UdpSocket::bind(addr).expect("upstream bind"));
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let (seen, stop) = (Arc::new(Mutex::new(Seen::default())), Arc::new(AtomicBool::new(false)));
        let (log, stopped) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0; 4096];
            while !stopped.load(Ordering::SeqCst) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else { continue };
                let Ok(request) = Message::from_vec(&buf[..n]) else { continue };
                {
                    let mut seen = log.lock().expect("lock");
                    seen.questions += 1;
                    seen.ports.insert(peer.port());
                    let payload = request.edns.as_ref().map_or(0, |edns| edns.max_payload());
                    seen.max_payload = seen.max_payload.max(payload);
                }
                let Some(response) = respond(&request) else { continue };
                let bytes = response.to_vec().expect("encode");
                let socket = socket.try_clone().expect("clone");
                if delay.is_zero() {
                    let _ = socket.send_to(&bytes, peer);
                } else {
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        let _ = socket.send_to(&bytes, peer);
                    });
                }
            }
        });
        Upstream { seen, stop, thread: Some(thread) }
    }

    fn questions(&self) -> usize {
        self.seen.lock().expect("lock").questions
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A response to `request` with `rcode` and `answers`.
fn reply(request: &Message, rcode: ResponseCode, answers: Vec<Record>) -> Message {
    let mut response = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
    response.metadata.recursion_available = true;
    response.metadata.response_code = rcode;
    response.queries = request.queries.clone();
    response.answers = answers;
    response
}

#[test]
fn answers_follow_changes_within_a_second() {
    let dns = DnsServer::start(&cluster(), &[]);
    let write = |file: &str, yaml: &str| {
        let tmp = dns.manifests.path().join(format!(".{file}"));
        std::fs::write(&tmp, yaml).expect("write");
        std::fs::rename(&tmp, dns.manifests.path().join(file)).expect("rename");
    };
    let started = Instant::now();
    write("new.yaml", &service("new", "{clusterIP: 10.96.0.12, ports: [{port: 80}]}"));
    let answered = eventually(Duration::from_secs(5), || {
        !dns.ask("new.default.svc.cluster.local.", RecordType::A, false).answers.is_empty()
    });
    assert!(
        answered && started.elapsed() < Duration::from_secs(1),
        "took {:?}; log:\n{}",
        started.elapsed(),
        dns.log()
    );

    // An endpoint turning ready joins the headless answer.
    let started = Instant::now();
    write(
        "db-4.yaml",
        &slice(
            "db-4",
            "db",
            "IPv4",
            "[{addresses: [10.244.0.5], hostname: db-0}, {addresses: [10.244.0.6]}, {addresses: [10.244.0.7]}]",
        ),
    );
    let answered = eventually(Duration::from_secs(5), || {
        dns.ask("db.default.svc.cluster.local.", RecordType::A, false).answers.len() == 3
    });
    assert!(answered && started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    std::fs::remove_file(dns.manifests.path().join("new.yaml")).expect("remove");
    let gone = eventually(Duration::from_secs(1), || {
        dns.ask("new.default.svc.cluster.local.", RecordType::A, false).metadata.response_code == NX
    });
    assert!(gone, "a deleted Service still answers");
}

/// SIGTERM with `--lameduck`: the server goes on answering (changes included, and `/ready`) for
/// that long, the time its endpoint takes to leave the Service's rules, then exits; a second
/// signal ends the wait at once.
#[test]
fn after_sigterm_the_lameduck_period_is_served_then_the_server_exits() {
    let lameduck = Duration::from_secs(4);
    let dns = DnsServer::start(&cluster(), &["--lameduck", "4s"]);
    let other = DnsServer::start(&cluster(), &["--lameduck", "60s"]);
    let sigterm = |server: &DnsServer| {
        let pid = nix::unistd::Pid::from_raw(server.process.as_ref().expect("running").id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    };
    sigterm(&dns);
    let signalled = Instant::now();
    std::fs::write(
        dns.manifests.path().join("new.yaml"),
        service("new", "{clusterIP: 10.96.0.12, ports: [{port: 80}]}"),
    )
    .expect("write");
    let mut new_answered = false;
    while signalled.elapsed() < lameduck - Duration::from_millis(1500) {
        let answer = dns.ask("web.default.svc.cluster.local.", RecordType::A, false);
        assert_eq!(answer.answers.len(), 1, "{answer}\nlog:\n{}", dns.log());
        assert_eq!(get_in(&dns.ns, "127.0.0.1:8080", "/ready").0, 200, "{}", dns.log());
        new_answered |= !dns.ask("new.default.svc.cluster.local.", RecordType::A, true).answers.is_empty();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(new_answered, "a change made after SIGTERM is not answered; log:\n{}", dns.log());
    let exited = eventually(lameduck + Duration::from_secs(5), || !dns.alive());
    let after = signalled.elapsed();
    assert!(exited && after >= lameduck, "exited {exited} after {after:?}; log:\n{}", dns.log());
    let status = dns.process.as_ref().expect("spawned").try_wait().expect("poll").expect("exited");
    assert!(status.success(), "{status:?}; log:\n{}", dns.log());
    assert!(dns.log().contains("lameduck"), "{}", dns.log());

    sigterm(&other);
    other.ask("web.default.svc.cluster.local.", RecordType::A, false);
    let again = Instant::now();
    sigterm(&other);
    let exited = eventually(Duration::from_secs(3), || !other.alive());
    assert!(exited, "a second SIGTERM does not end the lameduck period; log:\n{}", other.log());
    assert!(again.elapsed() < Duration::from_secs(3), "{:?}", again.elapsed());
}

#[test]
fn hostile_packets_get_formerr_or_are_dropped_and_the_server_keeps_answering() {
    let dns = DnsServer::start(&cluster(), &[]);
    let valid = query("web.default.svc.cluster.local.", RecordType::A, None);
    let mut two_questions = valid.clone();
    two_questions[5] = 2;
    let mut no_question = valid[..12].to_vec();
    no_question[5] = 1;
    // A name whose first label is a compression pointer to itself.
    let mut looped = valid[..12].to_vec();
    looped.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    let mut long_label = valid[..12].to_vec();
    long_label.push(64);
    long_label.extend(std::iter::repeat_n(b'a', 64));
    long_label.extend_from_slice(&[0, 0, 1, 0, 1]);
    let pointing = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x02, 0, 1, 0, 1].to_vec();
    let mut update = valid.clone();
    update[2] = 5 << 3; // opcode UPDATE
    let cases: Vec<(&str, Vec<u8>, Option<ResponseCode>)> = vec![
        ("empty", Vec::new(), None),
        ("five bytes", valid[..5].to_vec(), None),
        ("qdcount 1, no question", no_question, Some(ResponseCode::FormErr)),
        ("two questions", two_questions, Some(ResponseCode::FormErr)),
        ("compression loop", looped, Some(ResponseCode::FormErr)),
        ("label of 64 bytes", long_label, Some(ResponseCode::FormErr)),
        ("opcode UPDATE", update, Some(ResponseCode::NotImp)),
        // A name pointing into the header (found by the fuzz target): the label "\0", outside
        // the zones, forwarded to a dead upstream.
        ("question pointing into the header", pointing, Some(ResponseCode::ServFail)),
    ];
    for (what, bytes, expected) in cases {
        let got = dns.raw_udp(&bytes).map(|raw| Message::from_vec(&raw).expect("parsable").metadata.response_code);
        assert_eq!(got, expected, "{what}");
    }
    // Random garbage and a huge TCP query: no panic, no stall.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..2000 {
        let len = (state % 600) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        dns.ns.run(|| UdpSocket::bind("127.0.0.1:0").and_then(|s| s.send_to(&bytes, DNS))).expect("send");
    }
    dns.ns.run(|| {
        let mut stream = TcpStream::connect(DNS).expect("connect");
        let mut framed = vec![0xff, 0xff];
        framed.extend(std::iter::repeat_n(0xc0_u8, 65535));
        let _ = stream.write_all(&framed);
    });
    assert!(dns.alive(), "the server died; log:\n{}", dns.log());
    assert_eq!(dns.ask("web.default.svc.cluster.local.", RecordType::A, false).answers.len(), 1);
    assert_eq!(dns.ask("web.default.svc.cluster.local.", RecordType::A, true).answers.len(), 1);
}

#[test]
fn health_ready_and_metrics() {
    let dns = DnsServer::start(&cluster(), &[]);
    dns.ask("web.default.svc.cluster.local.", RecordType::A, false);
    dns.ask("nope.default.svc.cluster.local.", RecordType::AAAA, true);
    assert_eq!(get_in(&dns.ns, "127.0.0.1:8080", "/health").0, 200);
    assert_eq!(get_in(&dns.ns, "127.0.0.1:8080", "/ready").0, 200);
    let (code, metrics) = get_in(&dns.ns, "127.0.0.1:9153", "/metrics");
    assert_eq!(code, 200);
    assert!(sample(&metrics, r#"roadkeeper_dns_requests_total{proto="udp",type="A"}"#) >= 1.0, "{metrics}");
    assert!(sample(&metrics, r#"roadkeeper_dns_requests_total{proto="tcp",type="AAAA"}"#) >= 1.0, "{metrics}");
    assert!(sample(&metrics, r#"roadkeeper_dns_responses_total{rcode="NXDOMAIN"}"#) >= 1.0, "{metrics}");
    assert!(
        metrics.contains("roadkeeper_dns_request_duration_seconds_bucket{source=\"zone\",le=\"0.00005\"}"),
        "{metrics}"
    );
}

#[test]
fn the_api_server_is_a_source_too() {
    let ns = Netns::new("rk-dns-api").expect("netns");
    let api = ControlPlane::start(Some(ns.name()));
    let kubeconfig = api.admin_kubeconfig().display().to_string();
    let scratch = tempfile::tempdir().expect("tempdir");
    let log = scratch.path().join("dns.log");
    let manifests = tempfile::tempdir().expect("tempdir");
    let mut dns =
        DnsServer { process: None, launcher: Vec::new(), api: Some(api), ns, manifests, log, _scratch: scratch };
    let api = dns.api.as_ref().expect("api");
    api.kubectl_stdin(
        &["apply", "-f", "-"],
        &service("web", "{clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}"),
    );
    dns.spawn(&["--kubeconfig", &kubeconfig], &[]);
    let web = dns.ask("web.default.svc.cluster.local.", RecordType::A, false);
    assert_eq!(lines(&web.answers), ["web.default.svc.cluster.local. A 10.96.0.10"]);
    // The API server's own Service, and one created now.
    assert_eq!(dns.ask("kubernetes.default.svc.cluster.local.", RecordType::A, false).answers.len(), 1);
    let api = dns.api.as_ref().expect("api");
    api.kubectl_stdin(&["apply", "-f", "-"], &service("late", "{clusterIP: 10.96.0.13, ports: [{port: 80}]}"));
    let answered = eventually(Duration::from_secs(5), || {
        dns.ask("late.default.svc.cluster.local.", RecordType::A, false).answers.len() == 1
    });
    assert!(answered, "log:\n{}", dns.log());
    // Namespaces come from the API: kube-system has no Service here but exists.
    assert_negative(&dns.ask("kube-system.svc.cluster.local.", RecordType::A, false), OK, "cluster.local.");
    assert_negative(&dns.ask("nope.svc.cluster.local.", RecordType::A, false), NX, "cluster.local.");
}

/// `raw` parsed as one whole DNS message: every byte belongs to a record the header counts (a
/// parser that stops at the counts, as hickory's does, would accept trailing garbage).
fn strict(raw: &[u8]) -> Message {
    let mut decoder = BinDecoder::new(raw);
    let message = Message::read(&mut decoder).unwrap_or_else(|err| panic!("unparsable ({err}): {raw:02x?}"));
    assert!(decoder.is_empty(), "{} bytes after the last record of {message}", decoder.len());
    message
}

/// `ip`'s name under `ip6.arpa.`.
fn reverse_v6(ip: &str) -> String {
    let ip: std::net::Ipv6Addr = ip.parse().expect("IPv6");
    let nibbles: Vec<String> =
        ip.octets().iter().rev().flat_map(|b| [b & 0xf, b >> 4]).map(|n| format!("{n:x}")).collect();
    format!("{}.ip6.arpa.", nibbles.join("."))
}

/// The cluster of [`cluster`] and: endpoints of the ClusterIP Service web (10.244.0.20,
/// fd00:244::20), an IPv6 endpoint of db without hostname (fd00:244::6), ExternalName Services
/// pointing inside the zone (alias to web, dangling to a Service that does not exist).
fn extended_cluster() -> Vec<(&'static str, String)> {
    let mut manifests = cluster();
    manifests.extend([
        ("web-4.yaml", slice("web-4", "web", "IPv4", "[{addresses: [10.244.0.20]}]")),
        ("web-6.yaml", slice("web-6", "web", "IPv6", "[{addresses: ['fd00:244::20']}]")),
        ("db-6b.yaml", slice("db-6b", "db", "IPv6", "[{addresses: ['fd00:244::6']}]")),
        ("alias.yaml", service("alias", "{type: ExternalName, externalName: web.default.svc.cluster.local}")),
        ("dangling.yaml", service("dangling", "{type: ExternalName, externalName: nope.default.svc.cluster.local.}")),
    ]);
    manifests
}

#[test]
fn truncated_udp_answers_are_whole_messages() {
    let endpoints: Vec<String> = (0..200)
        .map(|i| format!("{{addresses: [10.244.{}.{}], hostname: member-{i}}}", i / 250, i % 250 + 1))
        .collect();
    let mut manifests = vec![("big.yaml", service("big", "{clusterIP: None, ports: [{name: pg, port: 5432}]}"))];
    manifests.push(("big-4.yaml", slice("big-4", "big", "IPv4", &format!("[{}]", endpoints.join(", ")))));
    let dns = DnsServer::start(&manifests, &[]);
    let srv = "_pg._tcp.big.default.svc.cluster.local.";
    let cases = [(srv, RecordType::SRV), ("big.default.svc.cluster.local.", RecordType::SRV)];
    for (name, qtype) in cases.into_iter().chain([("big.default.svc.cluster.local.", RecordType::A)]) {
        for edns in [None, Some(512), Some(1232), Some(4096)] {
            let raw = dns.raw_udp(&query(name, qtype, edns)).expect("an answer");
            let response = strict(&raw);
            let limit = edns.map_or(512, |payload| usize::from(payload.min(1232)));
            assert!(raw.len() <= limit, "{name} {qtype} {edns:?}: {} bytes", raw.len());
            assert!(response.metadata.truncation && !response.answers.is_empty(), "{name} {qtype} {edns:?}");
            assert_eq!(response.edns.is_some(), edns.is_some(), "{name} {qtype} {edns:?}: the OPT record");
        }
    }
    // dig without EDNS (+ignore: no retry over TCP) finds nothing malformed.
    let out = dns.ns.exec(["dig", "+noedns", "+ignore", "@127.0.0.1", srv, "SRV"]);
    let out = String::from_utf8_lossy(&out.expect("dig").stdout).into_owned();
    assert!(
        out.contains("flags: qr aa tc rd ra") && !out.contains("malformed") && !out.contains("extra bytes"),
        "{out}"
    );
}

#[test]
fn ptr_for_every_ready_endpoint_in_both_families_and_the_names_they_give_resolve() {
    let dns = DnsServer::start(&extended_cluster(), &["--no-fallthrough"]);
    let cases = [
        ("6.0.244.10.in-addr.arpa.".to_string(), "10-244-0-6.db.default.svc.cluster.local.", "10.244.0.6"),
        (reverse_v6("fd00:244::6"), "fd00-244--6.db.default.svc.cluster.local.", "fd00:244::6"),
        ("20.0.244.10.in-addr.arpa.".to_string(), "10-244-0-20.web.default.svc.cluster.local.", "10.244.0.20"),
        (reverse_v6("fd00:244::20"), "fd00-244--20.web.default.svc.cluster.local.", "fd00:244::20"),
        // Still there: the hostname form.
        ("5.0.244.10.in-addr.arpa.".to_string(), "db-0.db.default.svc.cluster.local.", "10.244.0.5"),
    ];
    for tcp in [false, true] {
        for (reverse, target, ip) in &cases {
            let ptr = dns.ask(reverse, RecordType::PTR, tcp);
            assert_eq!(lines(&ptr.answers), [format!("{reverse} PTR {target}")], "{ptr}");
            let qtype = if ip.contains(':') { RecordType::AAAA } else { RecordType::A };
            let forward = dns.ask(target, qtype, tcp);
            assert_eq!(lines(&forward.answers), [format!("{target} {qtype} {ip}")], "{forward}");
        }
        // The endpoint that is not ready has none.
        assert_negative(&dns.ask("7.0.244.10.in-addr.arpa.", RecordType::PTR, tcp), NX, "in-addr.arpa.");
    }
}

#[test]
fn external_names_inside_the_zone_are_answered_with_the_target_records() {
    let dns = DnsServer::start(&extended_cluster(), &[]);
    for tcp in [false, true] {
        let a = dns.ask("alias.default.svc.cluster.local.", RecordType::A, tcp);
        assert_eq!(
            (a.metadata.response_code, lines(&a.answers)),
            (
                OK,
                vec![
                    "alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local.".to_string(),
                    "web.default.svc.cluster.local. A 10.96.0.10".to_string()
                ]
            )
        );
        let aaaa = dns.ask("Alias.default.svc.cluster.local.", RecordType::AAAA, tcp);
        assert_eq!(
            lines(&aaaa.answers),
            [
                "Alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local.",
                "web.default.svc.cluster.local. AAAA fd00:96::10"
            ]
        );
        // A target that does not exist: the CNAME, and the target's NXDOMAIN with the SOA.
        let dangling = dns.ask("dangling.default.svc.cluster.local.", RecordType::A, tcp);
        assert_eq!(dangling.metadata.response_code, NX, "{dangling}");
        assert_eq!(
            lines(&dangling.answers),
            ["dangling.default.svc.cluster.local. CNAME nope.default.svc.cluster.local."]
        );
        assert!(matches!(dangling.authorities.first().map(|r| &r.data), Some(RData::SOA(_))), "{dangling}");
        // Outside the zone, as before: the CNAME alone, for the client to follow.
        assert_eq!(
            lines(&dns.ask("ext.default.svc.cluster.local.", RecordType::A, tcp).answers),
            ["ext.default.svc.cluster.local. CNAME example.com."]
        );
    }
}

#[test]
fn the_server_name_of_ns_and_soa_resolves_and_insecure_pods_need_their_namespace() {
    let also = format!("{POD_ADDRESS}:53");
    let dns = DnsServer::start(&cluster(), &["--pods", "insecure", "--no-fallthrough", "--listen", &also]);
    let soa_name = |response: &Message| match response.authorities.first().map(|r| &r.data) {
        Some(RData::SOA(soa)) => soa.mname.to_string(),
        _ => panic!("no SOA: {response}"),
    };
    let ns = dns.ask("cluster.local.", RecordType::NS, false);
    let RData::NS(target) = &ns.answers[0].data else { panic!("{ns}") };
    let names = [
        target.0.to_string(),
        soa_name(&dns.ask("nope.cluster.local.", RecordType::A, false)),
        soa_name(&dns.ask("4.3.2.1.in-addr.arpa.", RecordType::PTR, false)),
    ];
    for name in &names {
        let mut got = lines(&dns.ask(name, RecordType::A, false).answers);
        got.sort();
        let want = [format!("{name} A {POD_ADDRESS}"), format!("{name} A 127.0.0.1")];
        assert_eq!(got, want, "{name}: this server's --listen addresses");
    }
    assert_eq!(ns.additionals.iter().filter(|r| r.record_type() == RecordType::A).count(), 2, "glue: {ns}");

    // Once a Service has this server as its endpoint, the name gives that Service's cluster IP.
    std::fs::write(
        dns.manifests.path().join("kube-dns.yaml"),
        format!(
            "{}---\n{}",
            service("kube-dns", "{clusterIP: 10.96.0.53, ports: [{name: dns, port: 53, protocol: UDP}]}"),
            slice("kube-dns-x", "kube-dns", "IPv4", &format!("[{{addresses: [{POD_ADDRESS}]}}]"))
        ),
    )
    .expect("write");
    let found = eventually(Duration::from_secs(5), || {
        lines(&dns.ask(&names[0], RecordType::A, false).answers) == [format!("{} A 10.96.0.53", names[0])]
    });
    assert!(found, "{}", dns.ask(&names[0], RecordType::A, false));

    // --pods insecure answers any address, but only in a namespace that exists.
    for (namespace, rcode) in [("default", OK), ("quiet", OK), ("nope", NX)] {
        let name = format!("10-244-0-9.{namespace}.pod.cluster.local.");
        let response = dns.ask(&name, RecordType::A, false);
        assert_eq!(response.metadata.response_code, rcode, "{response}");
    }
}

/// Sends `bytes` from `sockets` UDP sockets at once (in `dns`'s namespace) and returns the
/// responses that came within three seconds.
fn ask_at_once(dns: &DnsServer, bytes: &[u8], sockets: u16) -> Vec<Message> {
    dns.ns.run(|| {
        let sockets: Vec<UdpSocket> = (0..sockets).map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind")).collect();
        for (id, socket) in sockets.iter().enumerate() {
            let mut query = bytes.to_vec();
            query[..2].copy_from_slice(&(id as u16).to_be_bytes());
            socket.send_to(&query, DNS).expect("send");
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut buf = vec![0; 65535];
        sockets
            .iter()
            .filter_map(|socket| {
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                socket.set_read_timeout(Some(left)).expect("timeout");
                let n = socket.recv(&mut buf).ok()?;
                Some(strict(&buf[..n]))
            })
            .collect()
    })
}

#[test]
fn identical_questions_in_flight_are_asked_upstream_once() {
    let dns = DnsServer::start(&cluster(), &["--upstream", "127.0.0.1:5300"]);
    let upstream = Upstream::delayed(&dns.ns, "127.0.0.1:5300", Duration::from_millis(500), |request| {
        let name = request.queries[0].name().clone();
        Some(reply(request, OK, vec![Record::from_rdata(name, 60, RData::A(A([192, 0, 2, 7].into())))]))
    });
    let responses = ask_at_once(&dns, &query("popular.example.", RecordType::A, None), 20);
    assert_eq!(responses.len(), 20);
    for response in &responses {
        assert_eq!(lines(&response.answers), ["popular.example. A 192.0.2.7"], "{response}");
    }
    assert_eq!(upstream.questions(), 1, "twenty clients, one question upstream");
}

#[test]
fn the_cache_keeps_answers_fetched_with_checking_disabled_apart() {
    // A validating upstream: with CD (checking disabled) it hands out what it could not validate.
    let dns = DnsServer::start(&cluster(), &["--upstream", "127.0.0.1:5300"]);
    let upstream = Upstream::start(&dns.ns, "127.0.0.1:5300", |request| {
        let name = request.queries[0].name().clone();
        let ip = if request.metadata.checking_disabled { [192, 0, 2, 66] } else { [192, 0, 2, 1] };
        Some(reply(request, OK, vec![Record::from_rdata(name, 300, RData::A(A(ip.into())))]))
    });
    let ask = |checking_disabled: bool| {
        let mut bytes = query("signed.example.", RecordType::A, Some(1232));
        if checking_disabled {
            bytes[3] |= 0x10;
        }
        let raw = (0..3).find_map(|_| dns.raw_udp(&bytes)).expect("an answer");
        lines(&strict(&raw).answers)
    };
    assert_eq!(ask(true), ["signed.example. A 192.0.2.66"]);
    assert_eq!(ask(false), ["signed.example. A 192.0.2.1"], "not the answer fetched with CD");
    let (again_disabled, again_checked) = (ask(true), ask(false));
    assert_eq!(again_disabled, ["signed.example. A 192.0.2.66"], "each cached under its own key");
    assert_eq!(again_checked, ["signed.example. A 192.0.2.1"]);
    assert_eq!(upstream.questions(), 2);
}

#[test]
fn the_cache_is_bounded_in_bytes() {
    // Each answer is about 1 KB (four TXT records of 250 bytes); 32 KiB hold a few dozen.
    let dns = DnsServer::start(&cluster(), &["--upstream", "127.0.0.1:5300", "--cache-max-bytes", "32768"]);
    let upstream = Upstream::start(&dns.ns, "127.0.0.1:5300", |request| {
        let name = request.queries[0].name().clone();
        let txt = |i: u8| RData::TXT(TXT::new(vec![format!("{i}{}", "x".repeat(249))]));
        Some(reply(request, OK, (0..4).map(|i| Record::from_rdata(name.clone(), 300, txt(i))).collect()))
    });
    let names: Vec<String> = (0..200).map(|i| format!("big-{i}.example.")).collect();
    for round in 0..2 {
        for name in &names {
            let response = dns.ask(name, RecordType::TXT, false);
            assert_eq!(response.answers.len(), 4, "round {round}: {response}");
        }
    }
    assert!(upstream.questions() >= 300, "{} questions upstream: most answers were not kept", upstream.questions());
    let (_, metrics) = get_in(&dns.ns, "127.0.0.1:9153", "/metrics");
    let size = sample(&metrics, "roadkeeper_dns_cache_size_bytes");
    assert!(size > 0.0 && size <= 32768.0, "{size} bytes cached");
}

/// The highest open file descriptor count and resident set size (bytes) of `pid`, sampled every
/// 20 ms until `done`.
fn sample_usage(pid: u32, done: &AtomicBool) -> (usize, u64) {
    let (mut fds, mut rss) = (0, 0);
    while !done.load(Ordering::SeqCst) {
        fds = fds.max(std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count()));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix(" kB")?.parse::<u64>().ok());
        rss = rss.max(kb.unwrap_or(0) * 1024);
        std::thread::sleep(Duration::from_millis(20));
    }
    (fds, rss)
}

#[test]
fn a_flood_at_a_silent_upstream_stays_bounded_and_the_overflow_is_servfail_at_once() {
    const QUERIES: u16 = 15_000;
    const PER_SECOND: f64 = 5_000.0;
    let dns = DnsServer::start(&cluster(), &["--upstream", "127.0.0.1:5300"]);
    let upstream = Upstream::start(&dns.ns, "127.0.0.1:5300", |_| None);
    let pid = dns.process.as_ref().expect("running").id();
    let sockets: Vec<UdpSocket> = dns.ns.run(|| {
        (0..8)
            .map(|_| {
                let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
                socket.connect(DNS).expect("connect");
                socket.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
                socket
            })
            .collect()
    });
    let started = Instant::now();
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..QUERIES).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || sample_usage(pid, &done))
    };
    // One receiver per socket: (rcode, latency) of every response.
    let receivers: Vec<_> = sockets
        .iter()
        .map(|socket| {
            let (socket, sent_at, done) = (socket.try_clone().expect("clone"), sent_at.clone(), done.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0; 4096];
                while !done.load(Ordering::SeqCst) {
                    let Ok(n) = socket.recv(&mut buf) else { continue };
                    let response = strict(&buf[..n]);
                    let sent = sent_at[usize::from(response.metadata.id)].load(Ordering::SeqCst);
                    let latency = started.elapsed().saturating_sub(Duration::from_nanos(sent));
                    got.push((response.metadata.response_code, latency));
                }
                got
            })
        })
        .collect();
    for i in 0..QUERIES {
        let due = Duration::from_secs_f64(f64::from(i) / PER_SECOND);
        std::thread::sleep(due.saturating_sub(started.elapsed()));
        let mut bytes = query(&format!("q{i}.flood.example."), RecordType::A, Some(4096));
        bytes[..2].copy_from_slice(&i.to_be_bytes());
        sent_at[usize::from(i)].store(started.elapsed().as_nanos() as u64, Ordering::SeqCst);
        let _ = sockets[usize::from(i) % sockets.len()].send(&bytes);
    }
    let flood = started.elapsed();
    // Answered from the zone during the flood's tail, at once.
    let asked = Instant::now();
    assert_eq!(dns.ask("web.default.svc.cluster.local.", RecordType::A, false).answers.len(), 1);
    let zone_latency = asked.elapsed();
    std::thread::sleep(Duration::from_millis(2500));
    done.store(true, Ordering::SeqCst);
    let (fds, rss) = sampler.join().expect("sampler");
    let responses: Vec<(ResponseCode, Duration)> =
        receivers.into_iter().flat_map(|r| r.join().expect("receiver")).collect();
    let fast_servfail = responses
        .iter()
        .filter(|(rcode, latency)| *rcode == ResponseCode::ServFail && *latency < Duration::from_millis(500))
        .count();
    // The server's own account: questions rejected over the bound, and how many forwarded
    // questions it answered within 102.4 ms of reading them (queueing in a busy socket aside).
    let (_, metrics) = get_in(&dns.ns, "127.0.0.1:9153", "/metrics");
    let rejected = try_sample(&metrics, "roadkeeper_dns_forward_max_concurrent_rejects_total").unwrap_or(0.0);
    let bucket = r#"roadkeeper_dns_request_duration_seconds_bucket{source="upstream",le="0.1024"}"#;
    let answered_at_once = try_sample(&metrics, bucket).unwrap_or(0.0);
    let seen = upstream.seen.lock().expect("lock");
    eprintln!(
        "flood: {QUERIES} queries in {flood:?}, {} responses, {fast_servfail} SERVFAIL within 500 ms; server: \
         {rejected} rejected over the bound, {answered_at_once} forwarded questions answered within 102.4 ms, \
         at most {fds} fds and {} MiB RSS; upstream: {} questions from {} ports, EDNS payload {}; zone answer \
         during the flood in {zone_latency:?}",
        responses.len(),
        rss >> 20,
        seen.questions,
        seen.ports.len(),
        seen.max_payload,
    );
    assert!(fds < 200, "{fds} file descriptors");
    assert!(rss < 200 << 20, "{} MiB resident", rss >> 20);
    assert!(rejected >= f64::from(QUERIES) / 4.0 && answered_at_once >= rejected, "{rejected}, {answered_at_once}");
    assert!(fast_servfail >= usize::from(QUERIES) / 5, "{fast_servfail} quick SERVFAIL of {QUERIES}");
    assert!(seen.questions <= usize::from(QUERIES) / 2, "{} questions upstream", seen.questions);
    assert!(seen.ports.len() <= 16, "{} source ports: upstream sockets are reused", seen.ports.len());
    assert!(seen.max_payload <= 1232, "EDNS payload {} asked of the upstream", seen.max_payload);
    drop(seen);
    assert!(dns.alive(), "log:\n{}", dns.log());
}

#[test]
fn idle_tcp_clients_at_the_descriptor_limit_leave_room_for_forwarding_and_new_clients() {
    const FLOOD: usize = 600;
    const NOFILE: usize = 256;
    // 256 descriptors in all (the soft limit of 128 is raised to the hard one at start): far
    // fewer than the idle TCP clients below, which never send a byte.
    let dns = DnsServer::start_under(
        &["prlimit", &format!("--nofile=128:{NOFILE}"), "--"],
        &cluster(),
        &["--upstream", "127.0.0.1:5300"],
    );
    let upstream = Upstream::start(&dns.ns, "127.0.0.1:5300", |request| {
        let name = request.queries[0].name().clone();
        Some(reply(request, OK, vec![Record::from_rdata(name, 60, RData::A(A("192.0.2.1".parse().expect("ip"))))]))
    });
    let pid = dns.process.as_ref().expect("running").id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).expect("open files");
    let nofile = NOFILE.to_string();
    assert_eq!(open_files.split_whitespace().skip(3).take(2).collect::<Vec<_>>(), [&nofile, &nofile], "{open_files}");

    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || sample_usage(pid, &done))
    };
    let flood = common::idle_connections(&dns.ns, DNS.parse().expect("address"), FLOOD);
    assert!(flood.len() >= FLOOD * 9 / 10, "{} idle connections", flood.len());
    // Forwarded names (each asked once: none comes from the cache) and a cluster name over UDP,
    // for longer than an upstream socket lives (10 s): every one is answered.
    let mut failed = Vec::new();
    for i in 0..49 {
        let name = format!("f{i}.example.");
        let forwarded = dns.ask(&name, RecordType::A, false);
        if forwarded.metadata.response_code != OK || forwarded.answers.len() != 1 {
            failed.push(format!("{name} {}", forwarded.metadata.response_code));
        }
        let cluster = dns.ask("web.default.svc.cluster.local.", RecordType::A, false);
        assert_eq!(lines(&cluster.answers), ["web.default.svc.cluster.local. A 10.96.0.10"]);
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(failed.is_empty(), "{} of 49 forwarded names failed: {failed:?}; log:\n{}", failed.len(), dns.log());
    assert!(upstream.questions() >= 49, "{} questions upstream", upstream.questions());
    // A new TCP client is served at once: the oldest idle connections made room for it.
    let asked = Instant::now();
    let tcp = dns.ask("web.default.svc.cluster.local.", RecordType::A, true);
    assert_eq!(lines(&tcp.answers), ["web.default.svc.cluster.local. A 10.96.0.10"]);
    let tcp_latency = asked.elapsed();
    let mut oldest = flood.into_iter().next().expect("a connection");
    oldest.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let closed = matches!(oldest.read(&mut [0; 16]), Ok(0) | Err(_));
    done.store(true, Ordering::SeqCst);
    let (fds, _) = sampler.join().expect("sampler");
    let (_, metrics) = get_in(&dns.ns, "127.0.0.1:9153", "/metrics");
    let shed = |reason: &str| {
        try_sample(&metrics, &format!("roadkeeper_dns_tcp_connections_shed_total{{reason=\"{reason}\"}}"))
            .unwrap_or(0.0)
    };
    let (evicted, refused) = (shed("idle_evicted"), shed("refused"));
    eprintln!(
        "{FLOOD} idle TCP clients at {NOFILE} descriptors: at most {fds} open, {evicted} idle connections \
         evicted, {refused} refused; a new TCP client answered in {tcp_latency:?}"
    );
    // The connections held fit in what the reserve leaves (40 here), evicted ones closed at once.
    assert!(fds < NOFILE / 2, "{fds} descriptors open");
    assert!(closed, "the oldest idle connection is still open");
    assert!(evicted >= (FLOOD - NOFILE) as f64, "{evicted} idle connections evicted:\n{metrics}");
    assert!(dns.alive(), "log:\n{}", dns.log());
}

#[test]
fn one_worker_per_cpu_each_with_its_own_reuseport_sockets() {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let dns = DnsServer::start(&cluster(), &[]);
    let pid = dns.process.as_ref().expect("running").id();
    // Sockets on port 53 (hex 0035) in the server's namespace: UDP, and TCP listening (0A).
    let bound = |table: &str, state: Option<&str>| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).expect("socket table");
        text.lines()
            .skip(1)
            .filter(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields[1].ends_with(":0035") && state.is_none_or(|s| fields[3] == s)
            })
            .count()
    };
    assert_eq!((bound("udp", None), bound("tcp", Some("0A"))), (cpus, cpus), "one UDP and one TCP socket per CPU");

    // Load from 32 client sockets: the kernel spreads them over the workers, each of which works.
    let workers = |pid: u32| -> Vec<(String, u64)> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks");
        let mut found: Vec<(String, u64)> = tasks
            .filter_map(|task| {
                let path = task.ok()?.path();
                let name = std::fs::read_to_string(path.join("comm")).ok()?.trim().to_string();
                let stat = std::fs::read_to_string(path.join("stat")).ok()?;
                let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                let ticks = fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?;
                name.starts_with("dns-").then_some((name, ticks))
            })
            .collect();
        found.sort();
        found
    };
    let before = workers(pid);
    assert_eq!(before.len(), cpus, "worker threads: {before:?}");
    let question = query("web.default.svc.cluster.local.", RecordType::A, None);
    dns.ns.run(|| {
        std::thread::scope(|scope| {
            for _ in 0..32 {
                scope.spawn(|| {
                    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
                    socket.connect(DNS).expect("connect");
                    socket.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
                    let mut buf = [0; 512];
                    for _ in 0..1000 {
                        socket.send(&question).expect("send");
                        let _ = socket.recv(&mut buf);
                    }
                });
            }
        })
    });
    let after = workers(pid);
    for ((name, was), (_, is)) in before.iter().zip(&after) {
        assert!(is > was, "{name} did no work: {before:?} then {after:?}");
    }
}
