//! Every record form and negative answer of the specification, against a small cluster.

use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RData, RecordType};
use roadkeeper_cluster::{Changes, NamespacedName, Object, Store};
use serde_json::{Value, json};

use super::*;
use crate::zone::{ZoneData, ZoneOptions};

fn object(value: Value) -> Object {
    match value["kind"].as_str().unwrap() {
        "Service" => Object::Service(Arc::new(serde_json::from_value(value).unwrap())),
        "EndpointSlice" => Object::EndpointSlice(Arc::new(serde_json::from_value(value).unwrap())),
        "Pod" => Object::Pod(Arc::new(serde_json::from_value(value).unwrap())),
        _ => Object::Namespace(Arc::new(serde_json::from_value(value).unwrap())),
    }
}

fn service(name: &str, spec: Value) -> Object {
    object(json!({"kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
}

fn slice(name: &str, service: &str, family: &str, endpoints: Value) -> Object {
    object(json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": family, "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}], "endpoints": endpoints}))
}

/// web (dual-stack ClusterIP, named ports), v4only (one unnamed port, no endpoints), db
/// (headless: db-0 with a hostname in both families, one without, one not ready), empty
/// (headless, no endpoints), ext (ExternalName), Pod p1, Namespace quiet.
fn objects() -> Vec<Object> {
    vec![
        service(
            "web",
            json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
            "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}),
        ),
        slice("web-x", "web", "IPv4", json!([{"addresses": ["10.244.0.20"]}])),
        service("v4only", json!({"clusterIP": "10.96.0.11", "ports": [{"port": 80}]})),
        service("db", json!({"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]})),
        slice(
            "db-4",
            "db",
            "IPv4",
            json!([
            {"addresses": ["10.244.0.5"], "hostname": "db-0", "conditions": {"ready": true}},
            {"addresses": ["10.244.0.6"], "targetRef": {"kind": "Pod", "name": "db-pod-b"}},
            {"addresses": ["10.244.0.7"], "hostname": "db-2", "conditions": {"ready": false}}]),
        ),
        slice("db-6", "db", "IPv6", json!([{"addresses": ["fd00:244::5"], "hostname": "db-0"}])),
        service("empty", json!({"clusterIP": "None"})),
        service("ext", json!({"type": "ExternalName", "externalName": "Example.COM."})),
        object(json!({"kind": "Pod", "metadata": {"name": "p1", "namespace": "default"},
            "status": {"podIP": "10.244.0.9", "podIPs": [{"ip": "10.244.0.9"}]}})),
        object(json!({"kind": "Namespace", "metadata": {"name": "quiet"}})),
    ]
}

fn store() -> Store {
    Store::from_objects(objects())
}

fn zones() -> Zones {
    let name = |n: &str| Name::from_ascii(n).unwrap();
    Zones {
        cluster: vec![name("cluster.local.")],
        reverse: vec![name("in-addr.arpa."), name("ip6.arpa.")],
        fallthrough: vec![name("in-addr.arpa."), name("ip6.arpa.")],
        ttl: 5,
        pods: PodMode::Disabled,
        ignore_empty_service: false,
        servers: vec!["192.0.2.53".parse().unwrap()],
    }
}

fn data(options: &ZoneOptions) -> ZoneData {
    ZoneData::build(&store(), options)
}

fn ask(zones: &Zones, data: &ZoneData, name: &str, qtype: RecordType) -> Answer {
    match zones.answer(data, &Name::from_ascii(name).unwrap(), qtype) {
        Outcome::Answer(answer) => answer,
        Outcome::Forward => panic!("{name} {qtype} was forwarded"),
    }
}

/// The answer's rcode and its records as `name TYPE data` text.
fn text(answer: &Answer) -> (ResponseCode, Vec<String>) {
    let lines = answer.answers.iter().map(|r| format!("{} {} {}", r.name, r.record_type(), r.data)).collect();
    (answer.rcode, lines)
}

fn lookup(name: &str, qtype: RecordType) -> (ResponseCode, Vec<String>) {
    text(&ask(&zones(), &data(&ZoneOptions::default()), name, qtype))
}

fn assert_negative(name: &str, qtype: RecordType, rcode: ResponseCode) {
    let answer = ask(&zones(), &data(&ZoneOptions::default()), name, qtype);
    assert_eq!((answer.rcode, answer.answers.len()), (rcode, 0), "{name} {qtype}");
    let soa = &answer.authority[0];
    assert_eq!(soa.record_type(), RecordType::SOA, "{name}: negative answers carry the SOA");
    let RData::SOA(soa_data) = &soa.data else { unreachable!() };
    assert_eq!(soa_data.mname.to_string(), format!("ns.dns.{}", soa.name));
    assert_eq!(soa_data.minimum, 5);
}

const OK: ResponseCode = ResponseCode::NoError;
const NX: ResponseCode = ResponseCode::NXDomain;

#[test]
fn cluster_ip_services_answer_a_and_aaaa_echoing_the_case() {
    assert_eq!(
        lookup("web.default.svc.cluster.local.", RecordType::A).1,
        ["web.default.svc.cluster.local. A 10.96.0.10"]
    );
    assert_eq!(
        lookup("WEB.Default.svc.Cluster.Local.", RecordType::AAAA).1,
        ["WEB.Default.svc.Cluster.Local. AAAA fd00:96::10"]
    );
    assert_negative("v4only.default.svc.cluster.local.", RecordType::AAAA, OK);
    assert_negative("v4only.default.svc.cluster.local.", RecordType::MX, OK);
    assert_negative("nope.default.svc.cluster.local.", RecordType::A, NX);
    assert_negative("web.nope.svc.cluster.local.", RecordType::A, NX);
    assert_negative("x.y.web.default.svc.cluster.local.", RecordType::A, NX);
}

#[test]
fn structural_names_are_nodata_and_unknown_namespaces_nxdomain() {
    for existing in
        ["svc.cluster.local.", "pod.cluster.local.", "default.svc.cluster.local.", "quiet.svc.cluster.local."]
    {
        assert_negative(existing, RecordType::A, OK);
    }
    assert_negative("nope.svc.cluster.local.", RecordType::A, NX);
    assert_negative("other.cluster.local.", RecordType::A, NX);
    assert_eq!(lookup("dns-version.cluster.local.", RecordType::TXT).1, ["dns-version.cluster.local. TXT 1.1.0"]);
    assert_negative("dns-version.cluster.local.", RecordType::A, OK);
    assert_eq!(lookup("cluster.local.", RecordType::SOA).1.len(), 1);
    assert_eq!(lookup("cluster.local.", RecordType::NS).1, ["cluster.local. NS ns.dns.cluster.local."]);
}

#[test]
fn the_server_name_of_ns_and_soa_answers_with_the_service_in_front_of_this_server_or_its_address() {
    let data = data(&ZoneOptions::default());
    let addresses = |zones: &Zones, name: &str| {
        let [a, aaaa] = [RecordType::A, RecordType::AAAA].map(|t| text(&ask(zones, &data, name, t)).1);
        [a, aaaa].concat()
    };
    let soa = ask(&zones(), &data, "cluster.local.", RecordType::SOA);
    let RData::SOA(soa) = &soa.answers[0].data else { panic!("{soa:?}") };
    assert_eq!(soa.mname.to_string(), "ns.dns.cluster.local.");
    let ns = ask(&zones(), &data, "cluster.local.", RecordType::NS);
    assert_eq!(text(&ns).1, ["cluster.local. NS ns.dns.cluster.local."]);
    assert_eq!(
        ns.additionals.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        ["ns.dns.cluster.local. 5 IN A 192.0.2.53"]
    );
    // No Service has this server as its endpoint: its own address, in every zone.
    assert_eq!(addresses(&zones(), "ns.dns.cluster.local."), ["ns.dns.cluster.local. A 192.0.2.53"]);
    assert_eq!(addresses(&zones(), "NS.dns.in-addr.arpa."), ["NS.dns.in-addr.arpa. A 192.0.2.53"]);
    assert_eq!(
        text(&ask(&zones(), &data, "in-addr.arpa.", RecordType::NS)).1,
        ["in-addr.arpa. NS ns.dns.in-addr.arpa."]
    );
    // This server is an endpoint of web (ClusterIP) or db (headless).
    let behind_web = Zones { servers: vec!["10.244.0.20".parse().unwrap()], ..zones() };
    assert_eq!(
        addresses(&behind_web, "ns.dns.cluster.local."),
        ["ns.dns.cluster.local. A 10.96.0.10", "ns.dns.cluster.local. AAAA fd00:96::10"]
    );
    let behind_db = Zones { servers: vec!["fd00:244::5".parse().unwrap()], ..zones() };
    assert_eq!(addresses(&behind_db, "ns.dns.cluster.local.").len(), 3, "db's three endpoint addresses");
}

#[test]
fn headless_services_answer_ready_endpoints_and_their_names() {
    assert_eq!(
        lookup("db.default.svc.cluster.local.", RecordType::A).1,
        ["db.default.svc.cluster.local. A 10.244.0.5", "db.default.svc.cluster.local. A 10.244.0.6"]
    );
    assert_eq!(lookup("db.default.svc.cluster.local.", RecordType::AAAA).1.len(), 1);
    assert_eq!(
        lookup("db-0.db.default.svc.cluster.local.", RecordType::A).1,
        ["db-0.db.default.svc.cluster.local. A 10.244.0.5"]
    );
    assert_eq!(lookup("db-0.db.default.svc.cluster.local.", RecordType::AAAA).1.len(), 1);
    assert_eq!(lookup("10-244-0-6.db.default.svc.cluster.local.", RecordType::A).1.len(), 1);
    assert_negative("db-2.db.default.svc.cluster.local.", RecordType::A, NX);
    assert_negative("10-244-0-7.db.default.svc.cluster.local.", RecordType::A, NX);
    assert_negative("empty.default.svc.cluster.local.", RecordType::A, NX);
    assert_negative("x.web.default.svc.cluster.local.", RecordType::A, NX);
}

#[test]
fn srv_for_named_ports_in_cluster_ip_and_headless_forms() {
    let answer =
        ask(&zones(), &data(&ZoneOptions::default()), "_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(
        text(&answer).1,
        ["_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."]
    );
    let additionals: Vec<String> = answer.additionals.iter().map(|r| r.data.to_string()).collect();
    assert_eq!(additionals, ["10.96.0.10", "fd00:96::10"]);
    assert_eq!(lookup("_dns._udp.web.default.svc.cluster.local.", RecordType::SRV).1.len(), 1);
    assert_eq!(lookup("web.default.svc.cluster.local.", RecordType::SRV).1.len(), 2, "every port");

    let (rcode, records) = lookup("_pg._tcp.db.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(rcode, OK);
    let targets: Vec<&str> = records.iter().map(|r| r.rsplit(' ').next().unwrap()).collect();
    assert_eq!(
        targets,
        [
            "db-0.db.default.svc.cluster.local.",
            "10-244-0-6.db.default.svc.cluster.local.",
            "db-0.db.default.svc.cluster.local."
        ]
    );
    assert!(records.iter().all(|r| r.contains("SRV 0 33 5432 ")), "{records:?}");

    assert_negative("_nope._tcp.web.default.svc.cluster.local.", RecordType::SRV, NX);
    assert_negative("_http._udp.web.default.svc.cluster.local.", RecordType::SRV, NX);
    assert_negative("_http._tcp.web.default.svc.cluster.local.", RecordType::A, OK);
}

#[test]
fn external_name_is_a_cname_and_nothing_lives_below_it() {
    assert_eq!(
        lookup("ext.default.svc.cluster.local.", RecordType::A).1,
        ["ext.default.svc.cluster.local. CNAME example.com."]
    );
    assert_negative("www.ext.default.svc.cluster.local.", RecordType::A, NX);
    assert_negative("_http._tcp.ext.default.svc.cluster.local.", RecordType::SRV, NX);
}

#[test]
fn ptr_for_service_and_endpoint_addresses_and_fallthrough() {
    assert_eq!(
        lookup("10.0.96.10.in-addr.arpa.", RecordType::PTR).1,
        ["10.0.96.10.in-addr.arpa. PTR web.default.svc.cluster.local."]
    );
    assert_eq!(
        lookup("5.0.244.10.In-Addr.Arpa.", RecordType::PTR).1,
        ["5.0.244.10.In-Addr.Arpa. PTR db-0.db.default.svc.cluster.local."]
    );
    let v6 = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.";
    assert_eq!(lookup(v6, RecordType::PTR).1, [format!("{v6} PTR web.default.svc.cluster.local.")]);
    assert_negative("10.0.96.10.in-addr.arpa.", RecordType::A, OK);
    // Unknown addresses fall through to the upstream resolvers, or are NXDOMAIN without.
    let unknown = Name::from_ascii("1.2.3.4.in-addr.arpa.").unwrap();
    let data = data(&ZoneOptions::default());
    assert_eq!(zones().answer(&data, &unknown, RecordType::PTR), Outcome::Forward);
    let strict = Zones { fallthrough: Vec::new(), ..zones() };
    let Outcome::Answer(answer) = strict.answer(&data, &unknown, RecordType::PTR) else { panic!("forwarded") };
    assert_eq!(answer.rcode, NX);
    assert_eq!(answer.authority[0].name.to_string(), "in-addr.arpa.");
}

/// The snapshot of [`objects`] and `extra`.
fn data_with(extra: Vec<Object>, options: &ZoneOptions) -> ZoneData {
    ZoneData::build(&Store::from_objects(objects().into_iter().chain(extra)), options)
}

#[test]
fn ptr_for_every_ready_endpoint_with_or_without_hostname_and_of_cluster_ip_services() {
    let v6 = slice("db-6b", "db", "IPv6", json!([{"addresses": ["fd00:244::6"]}]));
    let data = data_with(vec![v6], &ZoneOptions::default());
    let reverse_v6 = "6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.4.4.2.0.0.0.d.f.ip6.arpa.";
    let cases = [
        ("6.0.244.10.in-addr.arpa.", "10-244-0-6.db.default.svc.cluster.local.", RecordType::A, "10.244.0.6"),
        (reverse_v6, "fd00-244--6.db.default.svc.cluster.local.", RecordType::AAAA, "fd00:244::6"),
        // web is a ClusterIP Service; its endpoint 10.244.0.20 (slice web-x) has a name too.
        ("20.0.244.10.in-addr.arpa.", "10-244-0-20.web.default.svc.cluster.local.", RecordType::A, "10.244.0.20"),
    ];
    for (reverse, target, qtype, ip) in cases {
        assert_eq!(text(&ask(&zones(), &data, reverse, RecordType::PTR)).1, [format!("{reverse} PTR {target}")]);
        assert_eq!(text(&ask(&zones(), &data, target, qtype)).1, [format!("{target} {qtype} {ip}")], "{target}");
    }
    // A not-ready endpoint has none (the name falls through upstream).
    let not_ready = Name::from_ascii("7.0.244.10.in-addr.arpa.").unwrap();
    assert_eq!(zones().answer(&data, &not_ready, RecordType::PTR), Outcome::Forward);
    assert_negative("10-244-0-21.web.default.svc.cluster.local.", RecordType::A, NX);
    // With endpoint_pod_names, the Pod's name.
    let named = data_with(Vec::new(), &ZoneOptions { endpoint_pod_names: true, ..ZoneOptions::default() });
    assert_eq!(
        text(&ask(&zones(), &named, "6.0.244.10.in-addr.arpa.", RecordType::PTR)).1,
        ["6.0.244.10.in-addr.arpa. PTR db-pod-b.db.default.svc.cluster.local."]
    );
}

#[test]
fn external_names_inside_the_zone_are_followed_to_the_target_records() {
    let alias = |name: &str, target: &str| service(name, json!({"type": "ExternalName", "externalName": target}));
    let data = data_with(
        vec![
            alias("alias", "web.default.svc.cluster.local"),
            alias("chain", "Alias.default.svc.cluster.local."),
            alias("dangling", "nope.default.svc.cluster.local"),
            alias("loop-a", "loop-b.default.svc.cluster.local"),
            alias("loop-b", "loop-a.default.svc.cluster.local"),
            alias("to-self", "self.default.svc.cluster.local"),
            alias("self", "self.default.svc.cluster.local"),
        ],
        &ZoneOptions::default(),
    );
    let answer = |name: &str, qtype| ask(&zones(), &data, name, qtype);
    let cname = "alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local.";
    assert_eq!(
        text(&answer("alias.default.svc.cluster.local.", RecordType::A)),
        (OK, vec![cname.to_string(), "web.default.svc.cluster.local. A 10.96.0.10".to_string()])
    );
    assert_eq!(
        text(&answer("alias.default.svc.cluster.local.", RecordType::AAAA)).1,
        [cname, "web.default.svc.cluster.local. AAAA fd00:96::10"]
    );
    assert_eq!(text(&answer("alias.default.svc.cluster.local.", RecordType::CNAME)).1, [cname], "only the CNAME");
    let srv = answer("alias.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!((srv.answers.len(), srv.additionals.len()), (3, 2), "the CNAME, web's two SRV, their addresses");
    assert_eq!(
        text(&answer("chain.default.svc.cluster.local.", RecordType::A)).1,
        [
            "chain.default.svc.cluster.local. CNAME alias.default.svc.cluster.local.",
            cname,
            "web.default.svc.cluster.local. A 10.96.0.10"
        ]
    );
    // A dangling target: the CNAME and the target's NXDOMAIN, with the SOA.
    let dangling = answer("dangling.default.svc.cluster.local.", RecordType::A);
    assert_eq!(
        text(&dangling),
        (NX, vec!["dangling.default.svc.cluster.local. CNAME nope.default.svc.cluster.local.".to_string()])
    );
    assert_eq!(dangling.authority[0].record_type(), RecordType::SOA);
    // A loop ends where a name repeats.
    assert_eq!(text(&answer("loop-a.default.svc.cluster.local.", RecordType::A)).1.len(), 2);
    assert_eq!(
        text(&answer("to-self.default.svc.cluster.local.", RecordType::A)).1,
        [
            "to-self.default.svc.cluster.local. CNAME self.default.svc.cluster.local.",
            "self.default.svc.cluster.local. CNAME self.default.svc.cluster.local."
        ]
    );
    // Outside the zones, the CNAME alone.
    assert_eq!(
        text(&answer("ext.default.svc.cluster.local.", RecordType::A)).1,
        ["ext.default.svc.cluster.local. CNAME example.com."]
    );
}

#[test]
fn pod_records_by_mode() {
    let name = "10-244-0-9.default.pod.cluster.local.";
    assert_negative(name, RecordType::A, NX);
    let options = ZoneOptions { pods: PodMode::Verified, ..ZoneOptions::default() };
    let verified = Zones { pods: PodMode::Verified, ..zones() };
    let data = data(&options);
    assert_eq!(text(&ask(&verified, &data, name, RecordType::A)).1, [format!("{name} A 10.244.0.9")]);
    assert_eq!(ask(&verified, &data, "10-244-0-8.default.pod.cluster.local.", RecordType::A).rcode, NX);
    assert_eq!(ask(&verified, &data, "10-244-0-9.quiet.pod.cluster.local.", RecordType::A).rcode, NX);
    let insecure = Zones { pods: PodMode::Insecure, ..zones() };
    let answer = ask(&insecure, &data, "fd00-244--8.quiet.pod.cluster.local.", RecordType::AAAA);
    assert_eq!(text(&answer).1, ["fd00-244--8.quiet.pod.cluster.local. AAAA fd00:244::8"]);
    assert_eq!(ask(&insecure, &data, "10-244-0-8.default.pod.cluster.local.", RecordType::A).answers.len(), 1);
    assert_eq!(ask(&insecure, &data, "not-an-ip.default.pod.cluster.local.", RecordType::A).rcode, NX);
    // As CoreDNS: any address, but only in a namespace that exists.
    assert_eq!(ask(&insecure, &data, "10-244-0-8.nope.pod.cluster.local.", RecordType::A).rcode, NX);
}

#[test]
fn options_ignore_empty_service_and_endpoint_pod_names() {
    let ignoring = Zones { ignore_empty_service: true, ..zones() };
    let data_default = data(&ZoneOptions::default());
    assert_eq!(ask(&ignoring, &data_default, "v4only.default.svc.cluster.local.", RecordType::A).rcode, NX);
    assert_eq!(ask(&ignoring, &data_default, "web.default.svc.cluster.local.", RecordType::A).answers.len(), 1);
    let named = data(&ZoneOptions { endpoint_pod_names: true, ..ZoneOptions::default() });
    assert_eq!(ask(&zones(), &named, "db-pod-b.db.default.svc.cluster.local.", RecordType::A).answers.len(), 1);
}

#[test]
fn names_outside_the_zones_are_forwarded() {
    let data = data(&ZoneOptions::default());
    assert_eq!(zones().answer(&data, &Name::from_ascii("example.com.").unwrap(), RecordType::A), Outcome::Forward);
}

#[test]
fn incremental_updates_follow_changes_and_keep_old_snapshots() {
    let options = ZoneOptions::default();
    let before = ZoneData::build(&store(), &options);
    let mut after = before.clone();
    // Service web goes away (its slice stays, as it would for a moment in a cluster).
    let web = |o: &Object| matches!(o, Object::Service(s) if s.metadata.name.as_deref() == Some("web"));
    let store = Store::from_objects(objects().into_iter().filter(|o| !web(o)));
    let changes = Changes { services: [NamespacedName::new("default", "web")].into(), ..Changes::default() };
    after.apply(&store, &changes, &options);
    let zones = zones();
    assert_eq!(ask(&zones, &after, "web.default.svc.cluster.local.", RecordType::A).rcode, NX);
    assert!(after.reverse(&"10.96.0.10".parse().unwrap()).is_empty(), "its PTR went with it");
    assert_eq!(ask(&zones, &before, "web.default.svc.cluster.local.", RecordType::A).answers.len(), 1);
    assert_ne!(before.version(), after.version(), "the SOA serial moves");
    // A snapshot built from scratch agrees with the updated one.
    let rebuilt = ZoneData::build(&store, &options);
    for name in ["db.default.svc.cluster.local.", "10.0.96.10.in-addr.arpa.", "5.0.244.10.in-addr.arpa."] {
        for qtype in [RecordType::A, RecordType::PTR] {
            let name = Name::from_ascii(name).unwrap();
            let (updated, fresh) = (zones.answer(&after, &name, qtype), zones.answer(&rebuilt, &name, qtype));
            assert_eq!(outcome_text(&updated), outcome_text(&fresh), "{name} {qtype}");
        }
    }
}

/// An outcome without the SOA serial (which differs between snapshots by design).
fn outcome_text(outcome: &Outcome) -> Option<(ResponseCode, Vec<String>)> {
    match outcome {
        Outcome::Answer(answer) => Some(text(answer)),
        Outcome::Forward => None,
    }
}
