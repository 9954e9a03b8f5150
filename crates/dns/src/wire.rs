//! The request path without sockets: the bytes of a request in, the bytes the UDP server sends back
//! out. For the fuzz target (`crates/dns/fuzz`) and tests; [`server`](crate::server) shares its
//! decisions: the response's EDNS ([`response_head`]), which question is answered and how
//! ([`plan`]), and the authoritative response ([`authoritative`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::slice::Iter;
use std::sync::Arc;

use hickory_proto::op::{Edns, Header, HeaderCounts, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{CNAME, NS, PTR};
use hickory_proto::rr::{DNSClass, Name, RData, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder, NameEncoding};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder, Queries};
use roadkeeper_cluster::{Object, Store};
use serde_json::{Value, json};

use crate::answer::{Answer, Outcome, Zones};
use crate::zone::{PodMode, ZoneData, ZoneOptions};

/// Largest UDP payload we accept to send when a client advertises more (RFC 9715's advice).
pub(crate) const MAX_UDP_PAYLOAD: u16 = 1232;

/// The response's EDNS (the client's payload size clamped to 512..=[`MAX_UDP_PAYLOAD`], only when
/// the request has EDNS) and header (recursion available, the rest from the request).
pub(crate) fn response_head(request: &Request) -> (Option<Edns>, Metadata) {
    let edns = request.edns.as_ref().map(|asked| {
        let mut edns = Edns::new();
        edns.set_max_payload(asked.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        edns
    });
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.recursion_available = true;
    (edns, metadata)
}

/// The request's questions, re-encoded, for the response to carry. hickory-server's
/// `from_message_request` echoes the bytes received instead, and a question name compressed with
/// a pointer into the header then points at the *response's* header, whose flags and counts
/// differ: the response would not parse, or name another question (found by the fuzz target;
/// seed `crash-question-pointer-into-header.bin`).
pub(crate) fn echoed_questions(request: &Request) -> Queries {
    let mut bytes = Vec::new();
    let mut encoder = BinEncoder::new(&mut bytes);
    // Uncompressed: pointers would be relative to this buffer, not to the response.
    encoder.set_name_encoding(NameEncoding::Uncompressed);
    let questions = request.queries.queries();
    let encoded = questions.iter().try_for_each(|q| q.original().emit(&mut encoder));
    let count = if encoded.is_ok() { questions.len() } else { 0 };
    Queries::read(&mut BinDecoder::new(&bytes), count)
        .or_else(|_| Queries::read(&mut BinDecoder::new(&[]), 0))
        .expect("no question always decodes")
}

/// The question of `request` and what the zones make of it (other classes than IN are
/// forwarded), or the response code of a request not answered: NOTIMP for an opcode other than
/// QUERY, FORMERR without exactly one question.
pub(crate) fn plan(zones: &Zones, data: &ZoneData, request: &Request) -> Result<(Query, Outcome), ResponseCode> {
    let query = match request.request_info() {
        Ok(info) if request.metadata.op_code == OpCode::Query => info.query.original().clone(),
        Ok(_) => return Err(ResponseCode::NotImp),
        Err(_) => return Err(ResponseCode::FormErr),
    };
    let outcome = if query.query_class() == DNSClass::IN {
        zones.answer(data, query.name(), query.query_type())
    } else {
        Outcome::Forward
    };
    Ok((query, outcome))
}

/// The largest message `request`'s transport carries: over UDP, the response EDNS's payload size
/// (`edns`, from [`response_head`]) or 512 bytes without EDNS; over TCP, 65535 bytes.
pub(crate) fn size_limit(request: &Request, edns: Option<&Edns>) -> u16 {
    match request.protocol() {
        Protocol::Udp => edns.map_or(512, Edns::max_payload),
        _ => u16::MAX,
    }
}

/// A response of [`fitted`]: the sections are slices of the records given.
pub(crate) type Fitted<'q, 'a> =
    MessageResponse<'q, 'a, Iter<'a, Record>, Iter<'a, Record>, std::array::IntoIter<&'a Record, 0>, Iter<'a, Record>>;

/// The response to `questions` with the records of `answers`, `authorities` and `additionals` that
/// fit in `limit` bytes together with the OPT record of `edns`: whole records, the first ones of
/// each section, and the TC bit set when an answer or authority record is left out (additionals
/// left out need no retry over TCP, RFC 2181 §9).
///
/// hickory's encoder, left to cut a message at its size limit itself, leaves the bytes of the
/// record that did not fit after the last whole one: clients reject such a message. So a response
/// that might not fit (by the records' uncompressed sizes) is measured here first, by encoding it
/// without the OPT record into `limit` less its size (the records then encode to the same bytes,
/// compression included, with room for it).
pub(crate) fn fitted<'q, 'a>(
    questions: &'q Queries,
    edns: Option<&'q Edns>,
    mut metadata: Metadata,
    [answers, authorities, additionals]: [&'a [Record]; 3],
    limit: u16,
) -> Fitted<'q, 'a> {
    let mut builder = MessageResponseBuilder::new(questions, None);
    if let Some(edns) = edns {
        builder.edns(edns);
    }
    // Most responses fit even uncompressed: no need to measure them.
    let sections = [answers, authorities, additionals];
    let records = sections.iter().flat_map(|section| section.iter()).map(bound).sum::<Option<usize>>();
    let asked: usize = questions.queries().iter().map(|q| q.original().name().len() + 5).sum();
    // The OPT record: root name, type, class, TTL, length, then each option's code and length.
    let opt = edns.map(|edns| 11 + edns.options().options.iter().map(|(_, o)| 4 + usize::from(o.len())).sum::<usize>());
    if records.is_some_and(|records| 12 + asked + records + opt.unwrap_or(0) <= usize::from(limit)) {
        return builder.build(metadata, answers, authorities, [], additionals);
    }
    let room = u16::try_from(opt.unwrap_or(0)).ok().and_then(|opt| limit.checked_sub(opt));
    let mut scratch = Vec::with_capacity(usize::from(limit.min(4096)));
    let mut encoder = BinEncoder::new(&mut scratch);
    encoder.set_max_size(room.unwrap_or(0));
    let measured = MessageResponseBuilder::new(questions, None)
        .build(metadata, answers, authorities, [], additionals)
        .destructive_emit(&mut encoder);
    // A message that cannot be encoded at all goes whole: hickory answers it with SERVFAIL.
    let counts = measured.map(|info| info.counts()).ok();
    let cut = |section: &'a [Record], count: fn(HeaderCounts) -> u16| {
        &section[..counts.map_or(section.len(), |c| usize::from(count(c)).min(section.len()))]
    };
    let kept = [cut(answers, |c| c.answers), cut(authorities, |c| c.authorities), cut(additionals, |c| c.additionals)];
    metadata.truncation |= kept[0].len() < answers.len() || kept[1].len() < authorities.len();
    builder.build(metadata, kept[0], kept[1], [], kept[2])
}

/// The most bytes `record` takes in wire format (uncompressed); `None` for a type not measured
/// here.
fn bound(record: &Record) -> Option<usize> {
    // A name's labels and their length bytes, and the root label.
    let name = |name: &Name| name.len() + 1;
    let data = match &record.data {
        RData::A(_) => 4,
        RData::AAAA(_) => 16,
        RData::CNAME(CNAME(target)) | RData::NS(NS(target)) | RData::PTR(PTR(target)) => name(target),
        RData::SRV(srv) => 6 + name(&srv.target),
        RData::SOA(soa) => name(&soa.mname) + name(&soa.rname) + 20,
        RData::TXT(txt) => txt.txt_data.iter().map(|s| s.len() + 1).sum(),
        _ => return None,
    };
    // Type, class, TTL and data length.
    Some(name(&record.name) + 10 + data)
}

/// The response carrying a zone's `answer`: authoritative, with its response code, cut to `limit`
/// bytes ([`fitted`]).
pub(crate) fn authoritative<'q, 'a>(
    questions: &'q Queries,
    edns: Option<&'q Edns>,
    mut metadata: Metadata,
    answer: &'a Answer,
    limit: u16,
) -> Fitted<'q, 'a> {
    metadata.authoritative = true;
    metadata.response_code = answer.rcode;
    fitted(questions, edns, metadata, [&answer.answers, &answer.authority, &answer.additionals], limit)
}

/// The source address requests are taken to come from.
const SOURCE: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 5353);

/// The UDP response to the request `bytes`, as the server sends it, or `None` where the server
/// sends nothing (no readable header, or a response). Names outside the zones get SERVFAIL: this
/// path does not forward.
pub fn respond(zones: &Zones, data: &ZoneData, bytes: &[u8]) -> Option<Vec<u8>> {
    let request = match read_request(bytes, SOURCE, Protocol::Udp) {
        Ok(request) => request,
        Err(formerr) => return formerr,
    };
    let (edns, mut metadata) = response_head(&request);
    let questions = echoed_questions(&request);
    let limit = size_limit(&request, edns.as_ref());
    Some(match plan(zones, data, &request) {
        Err(code) => {
            let mut builder = MessageResponseBuilder::new(&questions, None);
            if let Some(edns) = &edns {
                builder.edns(edns);
            }
            encode(builder.error_msg(&request.metadata, code), Protocol::Udp)
        }
        Ok((_, Outcome::Answer(answer))) => {
            encode(authoritative(&questions, edns.as_ref(), metadata, &answer, limit), Protocol::Udp)
        }
        Ok((_, Outcome::Forward)) => {
            metadata.response_code = ResponseCode::ServFail;
            encode(fitted(&questions, edns.as_ref(), metadata, [&[], &[], &[]], limit), Protocol::Udp)
        }
    })
}

/// The request in `bytes`, received from `src` over `protocol`, as hickory-server reads it; else
/// what is sent back: FORMERR (no question, no EDNS) for a request with a header but nothing
/// readable after it, nothing for one without a header or for a response.
pub(crate) fn read_request(bytes: &[u8], src: SocketAddr, protocol: Protocol) -> Result<Request, Option<Vec<u8>>> {
    let header = Header::read(&mut BinDecoder::new(bytes)).map_err(|_| None)?;
    let Ok(request) = Request::from_bytes(bytes.to_vec(), src, protocol) else {
        let queries = Queries::read(&mut BinDecoder::new(&[]), 0).map_err(|_| None)?;
        let formerr = MessageResponseBuilder::new(&queries, None).error_msg(&header.metadata, ResponseCode::FormErr);
        return Err(Some(encode(formerr, protocol)));
    };
    if request.metadata.message_type == MessageType::Response {
        return Err(None);
    }
    Ok(request)
}

/// `message` (already cut to its size, [`fitted`]) in wire format for `protocol` (over UDP at
/// most its EDNS payload size, or 512 bytes); a header-only SERVFAIL when it cannot be encoded.
/// What hickory-server's `ResponseHandle` does.
fn encode<'a>(
    message: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    protocol: Protocol,
) -> Vec<u8> {
    emit(message, protocol).1
}

/// [`encode`], with the header of what was encoded.
pub(crate) fn emit<'a>(
    message: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    protocol: Protocol,
) -> (ResponseInfo, Vec<u8>) {
    let id = message.metadata().id;
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(match protocol {
        Protocol::Udp => message.edns().map_or(512, Edns::max_payload),
        _ => u16::MAX,
    });
    if let Ok(info) = message.destructive_emit(&mut encoder) {
        return (info, bytes);
    }
    bytes.clear();
    let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
    metadata.response_code = ResponseCode::ServFail;
    let header = Header { metadata, counts: HeaderCounts::default() };
    header.emit(&mut BinEncoder::new(&mut bytes)).expect("a header fits");
    (header.into(), bytes)
}

/// [`respond`], checked as the fuzz target checks it: a response parses back whole (no byte after
/// the records its header counts), is one, carries the request's ID and question, and fits in 512 bytes when the request has no EDNS
/// ([`MAX_UDP_PAYLOAD`] in any case). Panics otherwise; returns the parsed response.
#[doc(hidden)]
pub fn respond_checked(zones: &Zones, data: &ZoneData, bytes: &[u8]) -> Option<Message> {
    let response = respond(zones, data, bytes)?;
    let request = Request::from_bytes(bytes.to_vec(), SOURCE, Protocol::Udp).ok();
    let edns = request.as_ref().and_then(|request| request.edns.as_ref());
    let limit = if edns.is_some() { usize::from(MAX_UDP_PAYLOAD) } else { 512 };
    assert!(response.len() <= limit, "{} bytes answer {bytes:02x?} (EDNS: {edns:?})", response.len());
    let mut decoder = BinDecoder::new(&response);
    let parsed = Message::read(&mut decoder)
        .unwrap_or_else(|err| panic!("the response does not parse ({err}): {response:02x?} to {bytes:02x?}"));
    assert!(decoder.is_empty(), "{} bytes after the last record: {response:02x?} to {bytes:02x?}", decoder.len());
    assert_eq!(parsed.metadata.message_type, MessageType::Response);
    assert_eq!(parsed.metadata.id.to_be_bytes(), bytes[..2], "the response's ID");
    if !parsed.queries.is_empty() {
        let asked: Vec<&Query> = request.iter().flat_map(|r| r.queries.queries()).map(|q| q.original()).collect();
        assert_eq!(parsed.queries.iter().collect::<Vec<_>>(), asked, "the response's question");
    }
    Some(parsed)
}

/// The fuzz target's zones and data: `cluster.local` (Pods answered as asked) and the reverse
/// zones, holding in namespace `default` the ClusterIP Service `web` (dual-stack, ports http and
/// dns, endpoint 10.244.0.20), the headless Service `db` (50 ready endpoints `db-0`..`db-49`, 10.244.1.1..50, port pg),
/// the ExternalName Services `ext` (example.com) and `alias` (web, inside the zone) and the Pod
/// `p1`; the server's own address is 127.0.0.1.
#[doc(hidden)]
pub fn fixture() -> (Zones, ZoneData) {
    fn object(value: Value) -> Object {
        match value["kind"].as_str() {
            Some("Service") => Object::Service(Arc::new(serde_json::from_value(value).expect("a Service"))),
            Some("EndpointSlice") => Object::EndpointSlice(Arc::new(serde_json::from_value(value).expect("a slice"))),
            _ => Object::Pod(Arc::new(serde_json::from_value(value).expect("a Pod"))),
        }
    }
    let service = |name: &str, spec: Value| {
        object(json!({"kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
    };
    let endpoints: Vec<Value> = (0..50)
        .map(|i| {
            json!({"addresses": [format!("10.244.1.{}", i + 1)], "hostname": format!("db-{i}"),
            "conditions": {"ready": true}})
        })
        .collect();
    let store = Store::from_objects([
        service(
            "web",
            json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}),
        ),
        object(json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "web-x", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.0.20"]}]})),
        service("db", json!({"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]})),
        object(json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "db-x", "namespace": "default", "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": endpoints})),
        service("ext", json!({"type": "ExternalName", "externalName": "example.com"})),
        service("alias", json!({"type": "ExternalName", "externalName": "web.default.svc.cluster.local"})),
        object(json!({"kind": "Pod", "metadata": {"name": "p1", "namespace": "default"},
            "status": {"podIP": "10.244.0.9", "podIPs": [{"ip": "10.244.0.9"}]}})),
    ]);
    let name = |n: &str| Name::from_ascii(n).expect("a zone name");
    let zones = Zones {
        cluster: vec![name("cluster.local.")],
        reverse: vec![name("in-addr.arpa."), name("ip6.arpa.")],
        fallthrough: Vec::new(),
        ttl: 5,
        pods: PodMode::Insecure,
        ignore_empty_service: false,
        servers: vec![Ipv4Addr::LOCALHOST.into()],
    };
    let data = ZoneData::build(&store, &ZoneOptions { endpoint_pod_names: false, pods: PodMode::Insecure });
    (zones, data)
}

#[cfg(test)]
mod tests {
    use hickory_proto::rr::RecordType;

    use super::*;

    /// A query for `name` of type `qtype`, ID 0x1234, with EDNS of `payload` bytes if given.
    fn query(name: &str, qtype: RecordType, payload: Option<u16>) -> Vec<u8> {
        let mut message = Message::new(0x1234, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.queries.push(Query::query(Name::from_ascii(name).unwrap(), qtype));
        message.edns = payload.map(|payload| {
            let mut edns = Edns::new();
            edns.set_max_payload(payload);
            edns
        });
        message.to_vec().unwrap()
    }

    fn ask(bytes: &[u8]) -> Option<Message> {
        let (zones, data) = fixture();
        respond_checked(&zones, &data, bytes)
    }

    fn rcode(bytes: &[u8]) -> ResponseCode {
        ask(bytes).expect("a response").metadata.response_code
    }

    #[test]
    fn every_seed_of_the_fuzz_corpus_passes_the_checks() {
        let (zones, data) = fixture();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/request");
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let result = std::panic::catch_unwind(|| respond_checked(&zones, &data, &bytes));
            assert!(result.is_ok(), "seed {} fails", path.display());
            seeds += 1;
        }
        assert!(seeds >= 15, "{seeds} seeds in {}", dir.display());
    }

    #[test]
    fn a_zone_answer_is_authoritative_and_recursion_is_available() {
        let response = ask(&query("web.default.svc.cluster.local.", RecordType::A, None)).unwrap();
        assert_eq!(response.metadata.id, 0x1234);
        assert!(response.metadata.authoritative && response.metadata.recursion_available);
        assert_eq!(response.metadata.response_code, ResponseCode::NoError);
        assert_eq!(response.answers.len(), 1);
        assert_eq!(response.answers[0].data.to_string(), "10.96.0.10");
        assert!(response.edns.is_none());
    }

    #[test]
    fn formerr_without_exactly_one_question() {
        let mut none = query("web.default.svc.cluster.local.", RecordType::A, None);
        none.truncate(12);
        none[5] = 0; // QDCOUNT 0
        assert_eq!(rcode(&none), ResponseCode::FormErr);
        let mut message = Message::from_vec(&query("web.default.svc.cluster.local.", RecordType::A, None)).unwrap();
        message.queries.push(message.queries[0].clone());
        let response = ask(&message.to_vec().unwrap()).unwrap();
        assert_eq!(response.metadata.response_code, ResponseCode::FormErr);
        assert!(!response.metadata.authoritative);
        assert_eq!(response.queries.len(), 2, "the questions are echoed");
    }

    #[test]
    fn notimp_for_an_update() {
        let mut message = Message::from_vec(&query("cluster.local.", RecordType::SOA, None)).unwrap();
        message.metadata.op_code = OpCode::Update;
        assert_eq!(rcode(&message.to_vec().unwrap()), ResponseCode::NotImp);
    }

    #[test]
    fn no_response_without_a_header_nor_to_a_response() {
        assert_eq!(ask(&[0x12, 0x34, 0x01, 0x00, 0x00]), None);
        let mut response = query("web.default.svc.cluster.local.", RecordType::A, None);
        response[2] |= 0x80; // QR
        assert_eq!(ask(&response), None);
    }

    #[test]
    fn a_compression_loop_is_a_formerr() {
        // One question whose name is a pointer to itself (offset 12).
        let bytes = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1];
        let response = ask(&bytes).expect("a response");
        assert_eq!(response.metadata.response_code, ResponseCode::FormErr);
        assert!(response.queries.is_empty());
    }

    #[test]
    fn a_question_pointing_into_the_header_is_answered_with_a_re_encoded_question() {
        // QDCOUNT 1, the name a pointer to offset 2: the label "\0" spelt by the flags 01 00 and the
        // QDCOUNT's high byte. Echoed as received, the pointer would land on the response's flags.
        let bytes = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x02, 0, 1, 0, 1];
        let response = respond_checked(&fixture().0, &fixture().1, &bytes).expect("a response");
        assert_eq!(response.queries.len(), 1);
        assert_eq!(response.queries[0].name().to_ascii(), "\\000.");
    }

    #[test]
    fn outside_the_zones_is_servfail_here() {
        let response = ask(&query("example.com.", RecordType::A, Some(1232))).unwrap();
        assert_eq!(response.metadata.response_code, ResponseCode::ServFail);
        assert!(!response.metadata.authoritative && response.metadata.recursion_available);
        assert_eq!(response.edns.unwrap().max_payload(), 1232);
    }

    #[test]
    fn a_cut_keeps_whole_records_and_sets_tc_only_for_answers_left_out() {
        let name = Name::from_ascii("a.example.").unwrap();
        let record = |i: u8, v6: bool| {
            let data = if v6 {
                hickory_proto::rr::RData::AAAA(hickory_proto::rr::rdata::AAAA(
                    [0xfd00, 0, 0, 0, 0, 0, 0, u16::from(i)].into(),
                ))
            } else {
                hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A([192, 0, 2, i].into()))
            };
            Record::from_rdata(name.clone(), 5, data)
        };
        let answers: Vec<Record> = (0..20).map(|i| record(i, false)).collect();
        let additionals: Vec<Record> = (0..40).map(|i| record(i, true)).collect();
        let request = Message::from_vec(&query("a.example.", RecordType::A, None)).unwrap();
        let questions = Queries::read(&mut BinDecoder::new(&request.queries[0].to_bytes().unwrap()), 1).unwrap();
        let metadata = Metadata::response_from_request(&request.metadata);
        for (sections, truncated) in
            [([&answers[..], &[], &additionals], false), ([&additionals[..], &[], &answers], true)]
        {
            let bytes = encode(fitted(&questions, None, metadata, sections, 512), Protocol::Udp);
            assert!(bytes.len() <= 512 && bytes.len() > 512 - 28, "{} bytes", bytes.len());
            let mut decoder = BinDecoder::new(&bytes);
            let response = Message::read(&mut decoder).unwrap();
            assert!(decoder.is_empty(), "{} bytes after the last record", decoder.len());
            assert_eq!(response.metadata.truncation, truncated);
            assert!(response.answers.len() + response.additionals.len() < 60);
        }
    }

    #[test]
    fn the_size_bound_of_a_record_holds_it_uncompressed() {
        let (zones, data) = fixture();
        let mut measured = 0;
        for (name, qtype) in [
            ("web.default.svc.cluster.local.", RecordType::AAAA),
            ("db.default.svc.cluster.local.", RecordType::SRV),
            ("alias.default.svc.cluster.local.", RecordType::A),
            ("10.0.96.10.in-addr.arpa.", RecordType::PTR),
            ("dns-version.cluster.local.", RecordType::TXT),
            ("cluster.local.", RecordType::NS),
            ("nope.default.svc.cluster.local.", RecordType::A),
        ] {
            let Outcome::Answer(answer) = zones.answer(&data, &Name::from_ascii(name).unwrap(), qtype) else {
                panic!("{name} forwarded")
            };
            for record in answer.answers.iter().chain(&answer.authority).chain(&answer.additionals) {
                let mut bytes = Vec::new();
                let mut encoder = BinEncoder::new(&mut bytes);
                encoder.set_name_encoding(NameEncoding::Uncompressed);
                record.emit(&mut encoder).unwrap();
                assert!(bound(record).unwrap() >= bytes.len(), "{record}: {} bytes", bytes.len());
                measured += 1;
            }
        }
        assert!(measured > 50, "{measured} records");
    }

    #[test]
    fn fifty_srv_records_truncate_to_the_size_edns_allows() {
        for (payload, limit) in [(None, 512), (Some(4096), 1232), (Some(100), 512)] {
            let bytes = query("db.default.svc.cluster.local.", RecordType::SRV, payload);
            let response = ask(&bytes).unwrap();
            assert!(response.metadata.truncation, "{payload:?}");
            let size = respond(&fixture().0, &fixture().1, &bytes).unwrap().len();
            assert!(size <= limit && size > limit - 100, "{payload:?}: {size} bytes");
            assert_eq!(response.edns.map(|e| e.max_payload()), payload.map(|p| p.clamp(512, 1232)));
        }
    }
}
