//! The compiler against small clusters modelled on the conformance suite's: attachment and its
//! status reasons, listener checks, hostname intersection, match precedence, filters, weights.

use std::sync::Arc;

use hyper::Method;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use roadkeeper_cluster::{NamespacedName, Object, Store};
use serde_json::{Value, json};

use super::*;
use crate::Router;
use crate::decision::{Decision, Listeners, Request};

const POOL: &str = "192.168.235.0/24";

fn parsed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    let kind = value["kind"].clone();
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn object(value: Value) -> Object {
    let kind = value["kind"].as_str().unwrap().to_owned();
    match kind.as_str() {
        "Service" => Object::Service(Arc::new(parsed(value))),
        "EndpointSlice" => Object::EndpointSlice(Arc::new(parsed(value))),
        "Namespace" => Object::Namespace(Arc::new(parsed(value))),
        "Secret" => Object::Secret(Arc::new(parsed(value))),
        "GatewayClass" => Object::GatewayClass(Arc::new(parsed(value))),
        "Gateway" => Object::Gateway(Arc::new(parsed(value))),
        "HTTPRoute" => Object::HttpRoute(Arc::new(parsed(value))),
        "ReferenceGrant" => Object::ReferenceGrant(Arc::new(parsed(value))),
        other => panic!("{other}"),
    }
}

fn class() -> Object {
    object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "roadkeeper", "generation": 1}, "spec": {"controllerName": DEFAULT_CONTROLLER}}))
}

fn gateway(name: &str, listeners: Value) -> Object {
    object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": "infra", "generation": 2},
        "spec": {"gatewayClassName": "roadkeeper", "listeners": listeners}}))
}

fn http(name: &str, hostname: Option<&str>) -> Value {
    let mut listener =
        json!({"name": name, "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}});
    if let Some(hostname) = hostname {
        listener["hostname"] = hostname.into();
    }
    listener
}

/// An HTTPRoute in `namespace` created in `year`.
fn route_in(namespace: &str, name: &str, year: u32, spec: Value) -> Object {
    object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "generation": 3, "creationTimestamp": format!("{year}-01-01T00:00:00Z")},
        "spec": spec}))
}

fn route(name: &str, spec: Value) -> Object {
    route_in("infra", name, 2020, spec)
}

fn parent(gateway: &str) -> Value {
    json!([{"name": gateway}])
}

fn to(service: &str) -> Value {
    json!([{"name": service, "port": 8080}])
}

/// A Service with one endpoint (10.244.0.N:3000).
fn service(namespace: &str, name: &str, n: u8) -> Vec<Object> {
    vec![
        object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 3000}]}})),
        object(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": namespace, "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 3000}],
            "endpoints": [{"addresses": [format!("10.244.0.{n}")]}]})),
    ]
}

fn backends() -> Vec<Object> {
    [service("infra", "v1", 1), service("infra", "v2", 2), service("infra", "v3", 3), service("web", "web", 4)].concat()
}

fn compiled(objects: Vec<Object>) -> GatewayTable {
    let config = GatewayConfig { controller: DEFAULT_CONTROLLER.into(), pool: POOL.parse().unwrap() };
    GatewayTable::build(&Store::from_objects(objects), &config)
}

fn address(compiled: &GatewayTable, gateway: &str) -> std::net::IpAddr {
    compiled.statuses.gateways[&NamespacedName::new("infra", gateway)].addresses[0]
}

/// What a GET answers: the backend Service's name, a status code, or `404`.
fn get(compiled: &GatewayTable, gateway: &str, host: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(HeaderName::try_from(*name).unwrap(), HeaderValue::try_from(*value).unwrap());
    }
    let local = std::net::SocketAddr::new(address(compiled, gateway), 80);
    let (path, query) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
    let request = Request { local, tls: false, host, path, query, method: &Method::GET, headers: &map };
    match compiled.serve.route(&request) {
        None => "404".into(),
        Some(Decision::Forward(forward)) => forward.target.service.name.clone(),
        Some(Decision::Respond { status, headers, .. }) => {
            let location = headers.iter().find(|(name, _)| name == hyper::header::LOCATION);
            format!("{} {}", status.as_u16(), location.map(|(_, l)| l.to_str().unwrap()).unwrap_or_default())
                .trim_end()
                .to_owned()
        }
    }
}

/// `type=status/reason` of each condition.
fn conditions(conditions: &[conditions::Condition]) -> Vec<String> {
    conditions.iter().map(|c| format!("{}={}/{}", c.kind, if c.status { "True" } else { "False" }, c.reason)).collect()
}

fn route_conditions(compiled: &GatewayTable, route: &str) -> Vec<Vec<String>> {
    let status = &compiled.statuses.routes[&NamespacedName::new("infra", route)];
    status.parents.iter().map(|p| conditions(&p.conditions)).collect()
}

#[test]
fn a_simple_route_is_served_on_its_gateways_address_and_accepted() {
    let mut objects = vec![
        class(),
        gateway("same", json!([http("http", None)])),
        route("r", json!({"parentRefs": parent("same"), "rules": [{"backendRefs": to("v1")}]})),
    ];
    objects.extend(backends());
    let c = compiled(objects);
    assert_eq!(get(&c, "same", "anything", "/x", &[]), "v1");
    let gw = &c.statuses.gateways[&NamespacedName::new("infra", "same")];
    assert_eq!(gw.addresses, ["192.168.235.1".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(conditions(&gw.conditions), ["Accepted=True/Accepted", "Programmed=True/Programmed"]);
    assert_eq!(gw.listeners[0].attached, 1);
    assert_eq!(
        conditions(&gw.listeners[0].conditions),
        [
            "Accepted=True/Accepted",
            "ResolvedRefs=True/ResolvedRefs",
            "Conflicted=False/NoConflicts",
            "Programmed=True/Programmed"
        ]
    );
    assert_eq!(route_conditions(&c, "r"), [["Accepted=True/Accepted", "ResolvedRefs=True/ResolvedRefs"]]);
    let parent = &c.statuses.routes[&NamespacedName::new("infra", "r")].parents[0].parent_ref;
    assert_eq!(
        parent,
        &json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "infra", "name": "same"})
    );
    assert_eq!(c.statuses.classes.get("roadkeeper"), Some(&Some(1)));
}

#[test]
fn routes_that_cannot_attach_say_why() {
    let same_only = json!([{"name": "http", "port": 80, "protocol": "HTTP"}]);
    let objects = vec![
        class(),
        gateway("same", same_only),
        gateway("named", json!([http("web", Some("web.example"))])),
        route_in(
            "web",
            "other-namespace",
            2020,
            json!({"parentRefs": [{"name": "same", "namespace": "infra"}], "rules": [{"backendRefs": to("web")}]}),
        ),
        route("no-section", json!({"parentRefs": [{"name": "same", "sectionName": "http1", "port": 80}]})),
        route("no-host", json!({"parentRefs": parent("named"), "hostnames": ["other.example"]})),
        route(
            "bad-filter",
            json!({"parentRefs": parent("same"), "rules": [{"filters": [{"type": "ExtensionRef", "extensionRef": {"group": "x", "kind": "Y", "name": "z"}}]}]}),
        ),
    ];
    let c = compiled([objects, backends()].concat());
    let web = &c.statuses.routes[&NamespacedName::new("web", "other-namespace")];
    assert_eq!(
        conditions(&web.parents[0].conditions),
        ["Accepted=False/NotAllowedByListeners", "ResolvedRefs=True/ResolvedRefs"]
    );
    assert_eq!(route_conditions(&c, "no-section")[0][0], "Accepted=False/NoMatchingParent");
    assert_eq!(route_conditions(&c, "no-host")[0][0], "Accepted=False/NoMatchingListenerHostname");
    assert_eq!(route_conditions(&c, "bad-filter")[0][0], "Accepted=False/UnsupportedValue");
    assert_eq!(c.statuses.gateways[&NamespacedName::new("infra", "same")].listeners[0].attached, 0);
    assert_eq!(get(&c, "same", "x", "/", &[]), "404");
}

#[test]
fn invalid_listeners_are_reported_and_the_gateway_stays_programmed() {
    let listeners = json!([http("http", None), {"name": "invalid", "port": 1111, "protocol": "INVALID"}]);
    let kinds = json!([{"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"kinds": [{"kind": "InvalidRoute"}, {"kind": "HTTPRoute"}]}}]);
    let only_invalid = json!([{"name": "invalid", "port": 1111, "protocol": "INVALID"}]);
    let c =
        compiled(vec![class(), gateway("mixed", listeners), gateway("kinds", kinds), gateway("none", only_invalid)]);
    let status = |name: &str| c.statuses.gateways[&NamespacedName::new("infra", name)].clone();
    let mixed = status("mixed");
    assert_eq!(conditions(&mixed.conditions), ["Accepted=True/ListenersNotValid", "Programmed=True/Programmed"]);
    assert_eq!(mixed.listeners[1].kinds, Vec::<&str>::new());
    assert_eq!(conditions(&mixed.listeners[1].conditions)[0], "Accepted=False/UnsupportedProtocol");
    let kinds = status("kinds");
    assert_eq!(kinds.listeners[0].kinds, ["HTTPRoute"]);
    assert!(conditions(&kinds.listeners[0].conditions).contains(&"ResolvedRefs=False/InvalidRouteKinds".to_owned()));
    assert_eq!(conditions(&status("none").conditions)[0], "Accepted=False/ListenersNotValid");
}

#[test]
fn certificates_need_a_valid_secret_and_a_grant_across_namespaces() {
    let cert = rcgen::generate_simple_self_signed(vec!["example.org".into()]).unwrap();
    let secret = |namespace: &str, name: &str, crt: &[u8], key: &[u8]| {
        use roadkeeper_cluster::k8s_openapi::ByteString;
        use roadkeeper_cluster::k8s_openapi::api::core::v1::Secret;
        let data = [("tls.crt", crt), ("tls.key", key)].map(|(k, v)| (k.to_owned(), ByteString(v.to_vec())));
        let mut secret =
            Secret { type_: Some("kubernetes.io/tls".into()), data: Some(data.into()), ..Secret::default() };
        secret.metadata.name = Some(name.into());
        secret.metadata.namespace = Some(namespace.into());
        Object::Secret(Arc::new(secret))
    };
    let (crt, key) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let https = |name: &str, reference: Value| {
        gateway(
            name,
            json!([{"name": "https", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [reference]}}]),
        )
    };
    let grant = |name: &str, to_name: Option<&str>| {
        let mut to = json!({"group": "", "kind": "Secret"});
        if let Some(n) = to_name {
            to["name"] = n.into();
        }
        object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
            "metadata": {"name": name, "namespace": "web"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "infra"}], "to": [to]}}))
    };
    let objects = vec![
        class(),
        secret("infra", "good", crt.as_bytes(), key.as_bytes()),
        secret("infra", "malformed", b"Hello world\n", b"Hello world\n"),
        secret("web", "granted", crt.as_bytes(), key.as_bytes()),
        secret("web", "refused", crt.as_bytes(), key.as_bytes()),
        grant("only-granted", Some("granted")),
        https("good", json!({"name": "good"})),
        https("missing", json!({"name": "nonexistent"})),
        https("malformed", json!({"name": "malformed"})),
        https("wrong-kind", json!({"group": "", "kind": "WrongKind", "name": "good"})),
        https("wrong-group", json!({"group": "wrong.group.io", "kind": "Secret", "name": "good"})),
        https("granted", json!({"name": "granted", "namespace": "web"})),
        https("refused", json!({"name": "refused", "namespace": "web"})),
    ];
    let c = compiled(objects);
    let refs = |name: &str| {
        let listener = &c.statuses.gateways[&NamespacedName::new("infra", name)].listeners[0];
        conditions(&listener.conditions)
            .into_iter()
            .filter(|c| c.starts_with("ResolvedRefs") || c.starts_with("Programmed"))
            .collect::<Vec<_>>()
    };
    assert_eq!(refs("good"), ["ResolvedRefs=True/ResolvedRefs", "Programmed=True/Programmed"]);
    assert_eq!(refs("granted"), ["ResolvedRefs=True/ResolvedRefs", "Programmed=True/Programmed"]);
    for name in ["missing", "malformed", "wrong-kind", "wrong-group"] {
        assert_eq!(refs(name), ["ResolvedRefs=False/InvalidCertificateRef", "Programmed=False/Invalid"], "{name}");
    }
    assert_eq!(refs("refused"), ["ResolvedRefs=False/RefNotPermitted", "Programmed=False/Invalid"]);
    let gateway = &c.statuses.gateways[&NamespacedName::new("infra", "refused")];
    assert_eq!(
        conditions(&gateway.conditions),
        ["Accepted=True/Accepted", "Programmed=True/Programmed"],
        "still ready"
    );
    let good = address(&c, "good");
    assert!(matches!(
        c.serve.listener(std::net::SocketAddr::new(good, 443)),
        Some(crate::decision::Listener::Https(_))
    ));
    assert!(c.serve.listener(std::net::SocketAddr::new(address(&c, "missing"), 443)).is_none(), "not served");
}

#[test]
fn hostnames_of_listeners_and_routes_intersect() {
    let listeners = json!([
        http("l1", Some("very.specific.com")),
        http("l2", Some("*.wildcard.io")),
        http("l3", Some("*.anotherwildcard.io"))
    ]);
    let objects = vec![
        class(),
        gateway("gw", listeners),
        route(
            "s1",
            json!({"parentRefs": parent("gw"), "hostnames": ["non.matching.com", "*.nonmatchingwildcard.io", "very.specific.com"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s1"}}], "backendRefs": to("v1")}]}),
        ),
        route(
            "s2",
            json!({"parentRefs": parent("gw"), "hostnames": ["non.matching.com", "wildcard.io", "foo.wildcard.io", "bar.wildcard.io", "foo.bar.wildcard.io"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s2"}}], "backendRefs": to("v2")}]}),
        ),
        route(
            "s3",
            json!({"parentRefs": parent("gw"), "hostnames": ["non.matching.com", "*.specific.com"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s3"}}], "backendRefs": to("v3")}]}),
        ),
        route(
            "s4",
            json!({"parentRefs": parent("gw"), "hostnames": ["*.anotherwildcard.io"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s4"}}], "backendRefs": to("v1")}]}),
        ),
        route(
            "s5",
            json!({"parentRefs": parent("gw"), "hostnames": ["specific.but.wrong.com", "wildcard.io"], "rules": [{"backendRefs": to("v2")}]}),
        ),
    ];
    let c = compiled([objects, backends()].concat());
    let at = |host: &str, path: &str| get(&c, "gw", host, path, &[]);
    assert_eq!(at("very.specific.com", "/s1"), "v1");
    for host in ["foo.wildcard.io", "bar.wildcard.io", "foo.bar.wildcard.io"] {
        assert_eq!(at(host, "/s2"), "v2", "{host}");
    }
    assert_eq!(at("very.specific.com", "/s3"), "v3");
    for host in ["foo.anotherwildcard.io", "bar.anotherwildcard.io", "foo.bar.anotherwildcard.io"] {
        assert_eq!(at(host, "/s4"), "v1", "{host}");
    }
    for (host, path) in [
        ("non.matching.com", "/s1"),
        ("foo.nonmatchingwildcard.io", "/s1"),
        ("foo.wildcard.io", "/s1"),
        ("foo.wildcard.io", "/s3"),
        ("very.specific.com", "/s2"),
        ("wildcard.io", "/s2"),
        ("foo.specific.com", "/s3"),
        ("anotherwildcard.io", "/s4"),
        ("specific.but.wrong.com", "/s5"),
    ] {
        assert_eq!(at(host, path), "404", "{host}{path}");
    }
    assert_eq!(route_conditions(&c, "s5")[0][0], "Accepted=False/NoMatchingListenerHostname");
    let attached: Vec<i32> =
        c.statuses.gateways[&NamespacedName::new("infra", "gw")].listeners.iter().map(|l| l.attached).collect();
    assert_eq!(attached, [2, 1, 1]);
}

#[test]
fn the_most_specific_listener_takes_the_request() {
    let listeners = json!([
        http("listener-1", Some("bar.com")),
        http("listener-2", Some("foo.bar.com")),
        http("listener-3", Some("*.bar.com")),
        http("listener-4", Some("*.foo.com"))
    ]);
    let section = |s: &str| json!({"name": "gw", "sectionName": s});
    let objects = vec![
        class(),
        gateway("gw", listeners),
        route("backend-v1", json!({"parentRefs": [section("listener-1")], "rules": [{"backendRefs": to("v1")}]})),
        route("backend-v2", json!({"parentRefs": [section("listener-2")], "rules": [{"backendRefs": to("v2")}]})),
        route(
            "backend-v3",
            json!({"parentRefs": [section("listener-3"), section("listener-4")], "rules": [{"backendRefs": to("v3")}]}),
        ),
    ];
    let c = compiled([objects, backends()].concat());
    let at = |host: &str| get(&c, "gw", host, "/", &[]);
    assert_eq!((at("bar.com"), at("foo.bar.com")), ("v1".into(), "v2".into()));
    for host in ["baz.bar.com", "boo.bar.com", "multiple.prefixes.bar.com", "multiple.prefixes.foo.com"] {
        assert_eq!(at(host), "v3", "{host}");
    }
    assert_eq!((at("foo.com"), at("no.matching.host")), ("404".into(), "404".into()));
    assert_eq!(route_conditions(&c, "backend-v3").len(), 2, "a parent status per parent reference");
}

#[test]
fn matches_follow_precedence_across_rules_and_routes() {
    let h = |name: &str, value: &str| json!({"name": name, "value": value});
    let header_rules = json!([
        {"matches": [{"headers": [h("version", "one")]}], "backendRefs": to("v1")},
        {"matches": [{"headers": [h("version", "two")]}], "backendRefs": to("v2")},
        {"matches": [{"headers": [h("version", "two"), h("color", "orange")]}], "backendRefs": to("v1")},
        {"matches": [{"headers": [h("color", "blue")]}, {"headers": [h("color", "green")]}], "backendRefs": to("v1")},
        {"matches": [{"headers": [h("color", "red")]}, {"headers": [h("color", "yellow")]}], "backendRefs": to("v2")},
    ]);
    let exact = |p: &str| json!({"path": {"type": "Exact", "value": p}});
    let prefix = |p: &str| json!({"path": {"type": "PathPrefix", "value": p}});
    let order = json!([
        {"matches": [exact("/match")], "backendRefs": to("v1")},
        {"matches": [exact("/match/exact")], "backendRefs": to("v2")},
        {"matches": [exact("/match/exact/one")], "backendRefs": to("v3")},
        {"matches": [prefix("/match/")], "backendRefs": to("v3")},
        {"matches": [prefix("/match/prefix/")], "backendRefs": to("v1")},
        {"matches": [prefix("/match/prefix/one")], "backendRefs": to("v2")},
    ]);
    let objects = vec![
        class(),
        gateway("headers", json!([http("http", None)])),
        gateway("order", json!([http("http", None)])),
        gateway("across", json!([http("http", None)])),
        route("header-matching", json!({"parentRefs": parent("headers"), "rules": header_rules})),
        route("path-order", json!({"parentRefs": parent("order"), "rules": order})),
        // The newer route's header match beats the older route's prefix /.
        route_in(
            "infra",
            "part1",
            2020,
            json!({"parentRefs": parent("across"), "hostnames": ["example.com", "example.net"],
            "rules": [{"matches": [prefix("/"), {"headers": [h("version", "one")]}], "backendRefs": to("v1")}]}),
        ),
        route_in(
            "infra",
            "part2",
            2021,
            json!({"parentRefs": parent("across"), "hostnames": ["example.com"],
            "rules": [{"matches": [prefix("/v2"), {"headers": [h("version", "two")]}], "backendRefs": to("v2")}]}),
        ),
    ];
    let c = compiled([objects, backends()].concat());
    let headers = |hs: &[(&str, &str)]| get(&c, "headers", "x", "/", hs);
    assert_eq!(headers(&[("Version", "one")]), "v1");
    assert_eq!(headers(&[("Version", "two")]), "v2");
    assert_eq!(headers(&[("Version", "two"), ("Color", "orange")]), "v1", "more headers win");
    assert_eq!(headers(&[("Version", "two"), ("Color", "blue")]), "v2", "a tie goes to the first rule");
    assert_eq!(headers(&[("Color", "orange")]), "404");
    assert_eq!(headers(&[("Color", "green")]), "v1");
    assert_eq!(headers(&[("Color", "yellow")]), "v2");
    let order = |path: &str| get(&c, "order", "x", path, &[]);
    let expected = [
        ("/match/exact/one", "v3"),
        ("/match/exact", "v2"),
        ("/match", "v1"),
        ("/match/prefix/one/any", "v2"),
        ("/match/prefix/any", "v1"),
        ("/match/any", "v3"),
    ];
    for (path, service) in expected {
        assert_eq!(order(path), service, "{path}");
    }
    let across = |host: &str, path: &str, hs: &[(&str, &str)]| get(&c, "across", host, path, hs);
    assert_eq!(across("example.com", "/", &[]), "v1");
    assert_eq!(across("example.com", "/v2", &[]), "v2");
    assert_eq!(across("example.net", "/v2", &[]), "v1");
    assert_eq!(across("example.com", "/v2/example", &[]), "v2");
    assert_eq!(across("example.com", "/", &[("Version", "two")]), "v2");
    assert_eq!(across("example.com", "/v2example", &[]), "v1");
}

#[test]
fn unusable_backends_answer_500_and_say_why() {
    let grant = object(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
        "metadata": {"name": "g", "namespace": "web"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "infra"}],
                 "to": [{"group": "", "kind": "Service", "name": "web"}]}}));
    let rule = |path: &str, backends: Value| json!({"matches": [{"path": {"type": "PathPrefix", "value": path}}], "backendRefs": backends});
    let objects = vec![
        class(),
        gateway("gw", json!([http("http", None)])),
        route(
            "kind",
            json!({"parentRefs": parent("gw"), "rules": [rule("/kind", json!([{"group": "unknownkind.example.com", "kind": "NonExistent", "name": "v1", "port": 8080}]))]}),
        ),
        route("missing", json!({"parentRefs": parent("gw"), "rules": [rule("/missing", to("nonexistent"))]})),
        route(
            "cross",
            json!({"parentRefs": parent("gw"), "rules": [rule("/cross", json!([{"name": "web", "namespace": "web", "port": 8080}]))]}),
        ),
        route(
            "none",
            json!({"parentRefs": parent("gw"), "rules": [{"matches": [{"path": {"type": "Exact", "value": "/omitted"}}]},
            {"matches": [{"path": {"type": "Exact", "value": "/empty"}}], "backendRefs": []}]}),
        ),
    ];
    let c = compiled([objects.clone(), backends()].concat());
    assert_eq!(get(&c, "gw", "x", "/kind", &[]), "500");
    assert_eq!(get(&c, "gw", "x", "/missing", &[]), "500");
    assert_eq!(get(&c, "gw", "x", "/cross", &[]), "500");
    assert_eq!(get(&c, "gw", "x", "/omitted", &[]), "500");
    assert_eq!(get(&c, "gw", "x", "/empty", &[]), "500");
    assert_eq!(route_conditions(&c, "kind")[0], ["Accepted=True/Accepted", "ResolvedRefs=False/InvalidKind"]);
    assert_eq!(route_conditions(&c, "missing")[0][1], "ResolvedRefs=False/BackendNotFound");
    assert_eq!(route_conditions(&c, "cross")[0][1], "ResolvedRefs=False/RefNotPermitted");
    assert_eq!(route_conditions(&c, "none")[0][1], "ResolvedRefs=True/ResolvedRefs", "no backends is not unresolved");
    let granted = compiled([objects, backends(), vec![grant]].concat());
    assert_eq!(get(&granted, "gw", "x", "/cross", &[]), "web");
    assert_eq!(route_conditions(&granted, "cross")[0][1], "ResolvedRefs=True/ResolvedRefs");
}

#[test]
fn redirects_and_weights() {
    let redirect = |path: &str, filter: Value| json!({"matches": [{"path": {"type": "PathPrefix", "value": path}}], "filters": [{"type": "RequestRedirect", "requestRedirect": filter}]});
    let weighted = json!([{"name": "v1", "port": 8080, "weight": 70}, {"name": "v2", "port": 8080, "weight": 30}, {"name": "v3", "port": 8080, "weight": 0}]);
    let objects = vec![
        class(),
        gateway("gw", json!([http("http", None)])),
        route(
            "redirect",
            json!({"parentRefs": parent("gw"), "rules": [
                redirect("/hostname-redirect", json!({"hostname": "example.org"})),
                redirect("/host-and-status", json!({"hostname": "example.org", "statusCode": 301})),
                {"backendRefs": weighted},
            ]}),
        ),
    ];
    let c = compiled([objects, backends()].concat());
    assert_eq!(get(&c, "gw", "x", "/hostname-redirect?a=b", &[]), "302 http://example.org/hostname-redirect?a=b");
    assert_eq!(get(&c, "gw", "x", "/host-and-status", &[]), "301 http://example.org/host-and-status");
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..500 {
        *seen.entry(get(&c, "gw", "x", "/", &[])).or_insert(0) += 1;
    }
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["v1", "v2"], "weight 0 gets nothing");
    assert!((seen["v1"] - 350i32).abs() <= 5, "{seen:?}");
}

/// What `table` serves, in a stable order: by address, port, listener and route hostname, the
/// entries (match, precedence and action; not the weighted-pick counters, which requests move).
fn served(table: &GatewayTable) -> Vec<String> {
    let mut lines = Vec::new();
    for (ip, ports) in &table.serve.addresses {
        for (port, served) in ports.iter() {
            for (listener, rules) in served.listeners.sorted() {
                for (hostname, entries) in rules.by_host.sorted() {
                    let entries = format!("{entries:?}");
                    let mut parts = entries.split("next: ");
                    let mut line = format!("{ip}:{port} {listener} {hostname} tls={} ", served.tls.is_some());
                    line.push_str(parts.next().unwrap_or_default());
                    for part in parts {
                        line.push_str(part.trim_start_matches(|c: char| c.is_ascii_digit()));
                    }
                    lines.push(line);
                }
            }
        }
    }
    lines.sort();
    lines
}

fn changes(f: impl FnOnce(&mut roadkeeper_cluster::Changes)) -> roadkeeper_cluster::Changes {
    let mut changes = roadkeeper_cluster::Changes::default();
    f(&mut changes);
    changes
}

fn nn(name: &str) -> NamespacedName {
    NamespacedName::new("infra", name)
}

#[test]
fn incremental_apply_equals_a_fresh_build_and_touches_only_what_changed() {
    let config = GatewayConfig { controller: DEFAULT_CONTROLLER.into(), pool: POOL.parse().unwrap() };
    let prefix = |path: &str, service: &str| json!({"matches": [{"path": {"type": "PathPrefix", "value": path}}], "backendRefs": to(service)});
    let hosted = |name: &str, year: u32, host: &str, rules: Value| {
        route_in("infra", name, year, json!({"parentRefs": parent("gw"), "hostnames": [host], "rules": rules}))
    };
    let gw = gateway("gw", json!([http("http", None)]));
    let other = gateway("other", json!([http("http", Some("other.example"))]));
    let r1 = hosted("r1", 2020, "a.example", json!([prefix("/", "v1")]));
    let r2 = route("r2", json!({"parentRefs": parent("gw"), "rules": [prefix("/", "v2")]}));
    let o1 = route("o1", json!({"parentRefs": parent("other"), "rules": [prefix("/", "v1")]}));
    let base = [vec![class(), gw.clone(), other.clone(), r1.clone(), r2.clone(), o1], backends()].concat();
    let mut table = GatewayTable::build(&Store::from_objects(base.clone()), &config);
    let other_address = address(&table, "other");
    let other_ports = table.serve.addresses[&other_address].clone();

    // Each step: the objects after it, and the changes that led there.
    let r3 = hosted("r3", 2021, "a.example", json!([prefix("/x", "v3")]));
    let r1_moved = hosted("r1", 2020, "a.example", json!([prefix("/", "v2")]));
    let slice_v3 = service("infra", "v3", 9);
    let mut gw_with_status: Value = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "infra", "generation": 2},
        "spec": {"gatewayClassName": "roadkeeper", "listeners": [http("http", None)]},
        "status": {"addresses": [{"type": "IPAddress", "value": address(&table, "gw").to_string()}]}});
    let gw_status = object(gw_with_status.clone());
    gw_with_status["spec"]["listeners"] = json!([http("http", None), http("named", Some("b.example"))]);
    gw_with_status["spec"]["listeners"][1]["port"] = 8080.into();
    let gw_two_listeners = object(gw_with_status);
    let without = |objects: &[Object], name: &str| -> Vec<Object> {
        objects
            .iter()
            .filter(|o| !matches!(o, Object::HttpRoute(r) if r.metadata.name.as_deref() == Some(name)))
            .cloned()
            .collect()
    };
    let replace = |objects: &[Object], old: &str, new: &Object| -> Vec<Object> {
        let mut out = without(objects, old);
        out.push(new.clone());
        out
    };
    let step1 = [base.clone(), vec![r3.clone()]].concat();
    let step2 = replace(&step1, "r1", &r1_moved);
    let step3 = without(&step2, "r2");
    let step4: Vec<Object> = step3
        .iter()
        .filter(|o| !matches!(o, Object::EndpointSlice(s) if s.metadata.name.as_deref() == Some("v3-1")))
        .cloned()
        .chain([slice_v3[1].clone()])
        .collect();
    let gateway_replaced = |objects: &[Object], new: &Object| -> Vec<Object> {
        let kept =
            objects.iter().filter(|o| !matches!(o, Object::Gateway(g) if g.metadata.name.as_deref() == Some("gw")));
        kept.cloned().chain([new.clone()]).collect()
    };
    let step5 = gateway_replaced(&step4, &gw_status);
    let step6 = gateway_replaced(&step5, &gw_two_listeners);
    let steps = [
        (step1, changes(|c| c.http_routes = [nn("r3")].into()), Some(([nn("gw")], vec![nn("r3")]))),
        (step2, changes(|c| c.http_routes = [nn("r1")].into()), Some(([nn("gw")], vec![nn("r1")]))),
        (step3, changes(|c| c.http_routes = [nn("r2")].into()), Some(([nn("gw")], vec![nn("r2")]))),
        (step4, changes(|c| c.services = [nn("v3")].into()), None),
        (step5, changes(|c| c.gateways = [nn("gw")].into()), None),
        (step6, changes(|c| c.gateways = [nn("gw")].into()), None),
    ];
    for (index, (objects, changes, expected)) in steps.into_iter().enumerate() {
        let store = Store::from_objects(objects);
        let touched = table.apply(&store, &changes);
        let fresh = GatewayTable::build(&store, &config);
        assert_eq!(served(&table), served(&fresh), "step {}", index + 1);
        assert_eq!(table.statuses, fresh.statuses, "step {}", index + 1);
        if let Some((gateways, routes)) = expected {
            assert_eq!(touched.gateways, gateways.into(), "step {}", index + 1);
            assert_eq!(touched.routes, routes.into_iter().collect(), "step {}", index + 1);
            assert!(
                Arc::ptr_eq(&table.serve.addresses[&other_address], &other_ports),
                "step {}: other Gateway rebuilt",
                index + 1
            );
        }
        match index + 1 {
            1 => assert_eq!(get(&table, "gw", "a.example", "/x/y", &[]), "v3"),
            2 => assert_eq!(get(&table, "gw", "a.example", "/", &[]), "v2"),
            3 => assert_eq!(get(&table, "gw", "b.example", "/", &[]), "404", "r2 gone"),
            4 => assert_eq!(touched.routes, [nn("r3")].into(), "only the route naming v3"),
            5 => assert_eq!(
                touched,
                Touched { gateways: [nn("gw")].into(), ..Touched::default() },
                "a status write: no rebuild"
            ),
            _ => assert_eq!(touched.routes.len(), 3, "a Gateway's spec: every route"),
        }
    }
}

#[test]
fn cors_preflights_are_answered_and_cross_origin_responses_get_the_fields() {
    let cors = json!({"type": "CORS", "cors": {"allowOrigins": ["https://*.bar.com"], "allowMethods": ["PUT"], "allowCredentials": true}});
    let objects = vec![
        class(),
        gateway("gw", json!([http("http", None)])),
        route("cors", json!({"parentRefs": parent("gw"), "rules": [{"filters": [cors], "backendRefs": to("v1")}]})),
        route(
            "backend-cors",
            json!({"parentRefs": parent("gw"), "hostnames": ["refused.example"], "rules": [{"backendRefs": [{"name": "v1", "port": 8080, "filters": [
                {"type": "CORS", "cors": {"allowOrigins": ["*"]}}]}]}]}),
        ),
    ];
    let c = compiled([objects, backends()].concat());
    let decide = |method: Method, headers: &[(&str, &str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(HeaderName::try_from(*name).unwrap(), HeaderValue::try_from(*value).unwrap());
        }
        let local = std::net::SocketAddr::new(address(&c, "gw"), 80);
        let request = Request { local, tls: false, host: "x", path: "/", query: None, method: &method, headers: &map };
        c.serve.route(&request).unwrap()
    };
    let origin = ("origin", "https://www.bar.com");
    match decide(Method::OPTIONS, &[origin, ("access-control-request-method", "PUT")]) {
        Decision::Respond { status, headers, .. } => {
            assert_eq!(status, hyper::StatusCode::NO_CONTENT);
            let names: Vec<&str> = headers.iter().map(|(name, _)| name.as_str()).collect();
            assert!(names.contains(&"access-control-allow-methods"), "{names:?}");
        }
        other => panic!("a preflight is answered by the gateway: {other:?}"),
    }
    match decide(Method::GET, &[origin]) {
        Decision::Forward(forward) => {
            let set = &forward.actions.expect("response fields").response_headers.set;
            assert!(
                set.iter().any(|(name, value)| name == "access-control-allow-origin" && value == "https://www.bar.com")
            );
        }
        other => panic!("a cross-origin GET is forwarded: {other:?}"),
    }
    match decide(Method::GET, &[("origin", "https://bar.com")]) {
        Decision::Forward(forward) => assert!(forward.actions.is_none(), "no fields for a refused origin"),
        other => panic!("{other:?}"),
    }
    assert_eq!(route_conditions(&c, "cors")[0][0], "Accepted=True/Accepted");
    assert_eq!(route_conditions(&c, "backend-cors")[0][0], "Accepted=False/UnsupportedValue", "CORS on a backend");
}

/// A Gateway `namespace/name` created in `year`, asking for `requested` in `spec.addresses` and
/// whose status names `held`, when given.
fn tenant_gateway(namespace: &str, name: &str, year: u32, requested: Option<&str>, held: Option<&str>) -> Object {
    let mut value = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "generation": 1,
            "creationTimestamp": format!("{year}-01-01T00:00:00Z")},
        "spec": {"gatewayClassName": "roadkeeper", "listeners": [http("http", None)]}});
    if let Some(ip) = requested {
        value["spec"]["addresses"] = json!([{"type": "IPAddress", "value": ip}]);
    }
    if let Some(ip) = held {
        value["status"] = json!({"addresses": [{"type": "IPAddress", "value": ip}]});
    }
    object(value)
}

/// The addresses and conditions of Gateway `namespace/name`.
fn gateway_status(table: &GatewayTable, namespace: &str, name: &str) -> (Vec<String>, Vec<String>) {
    let status = &table.statuses.gateways[&NamespacedName::new(namespace, name)];
    (status.addresses.iter().map(ToString::to_string).collect(), conditions(&status.conditions))
}

const REFUSED: [&str; 2] = ["Accepted=True/Accepted", "Programmed=False/AddressNotUsable"];
const PROGRAMMED: [&str; 2] = ["Accepted=True/Accepted", "Programmed=True/Programmed"];

#[test]
fn an_address_held_in_status_is_refused_to_another_gateway_that_asks_for_it() {
    // Tenant A's Gateway holds .1 (its status says so, as after a restart); tenant B asks for .1:
    // B is refused and gets no other address, A keeps .1, whatever their ages.
    for (a_year, b_year) in [(2020, 2021), (2021, 2020)] {
        let a = tenant_gateway("tenant-a", "web", a_year, None, Some("192.168.235.1"));
        let b = tenant_gateway("tenant-b", "web", b_year, Some("192.168.235.1"), None);
        let table = compiled(vec![class(), a, b]);
        assert_eq!(
            gateway_status(&table, "tenant-a", "web"),
            (vec!["192.168.235.1".into()], PROGRAMMED.map(String::from).into())
        );
        assert_eq!(gateway_status(&table, "tenant-b", "web"), (vec![], REFUSED.map(String::from).into()));
        let served: Vec<String> = table.serve.addresses.keys().map(ToString::to_string).collect();
        assert_eq!(served, ["192.168.235.1"], "only A is served");
    }
    // Two statuses naming one address (a stale write): the oldest keeps it.
    let old = tenant_gateway("tenant-b", "old", 2019, None, Some("192.168.235.1"));
    let young = tenant_gateway("tenant-a", "young", 2020, None, Some("192.168.235.1"));
    let table = compiled(vec![class(), young, old]);
    assert_eq!(gateway_status(&table, "tenant-b", "old").0, ["192.168.235.1"]);
    assert_eq!(gateway_status(&table, "tenant-a", "young").0, ["192.168.235.2"]);
}

#[test]
fn an_address_given_is_kept_while_its_holder_lives_and_follows_its_own_request() {
    let config = GatewayConfig { controller: DEFAULT_CONTROLLER.into(), pool: POOL.parse().unwrap() };
    let a = tenant_gateway("tenant-a", "web", 2020, None, None);
    let b_asks = |ip: &str| tenant_gateway("tenant-b", "web", 2021, Some(ip), None);
    let gateways = |keys: &[(&str, &str)]| {
        changes(|c| c.gateways = keys.iter().map(|(ns, name)| NamespacedName::new(*ns, *name)).collect())
    };
    // A gets .1 before its status is written; B then asks for .1: A keeps it, B is refused.
    let mut table = GatewayTable::build(&Store::from_objects(vec![class(), a.clone()]), &config);
    assert_eq!(gateway_status(&table, "tenant-a", "web").0, ["192.168.235.1"]);
    let both = Store::from_objects(vec![class(), a.clone(), b_asks("192.168.235.1")]);
    table.apply(&both, &gateways(&[("tenant-b", "web")]));
    assert_eq!(gateway_status(&table, "tenant-a", "web").0, ["192.168.235.1"]);
    assert_eq!(gateway_status(&table, "tenant-b", "web"), (vec![], REFUSED.map(String::from).into()));
    // A rebuild for another reason (a route and a ReferenceGrant) keeps it so.
    let route_b =
        route_in("tenant-b", "r", 2021, json!({"parentRefs": parent("web"), "rules": [{"backendRefs": to("v1")}]}));
    let with_route = Store::from_objects(vec![class(), a.clone(), b_asks("192.168.235.1"), route_b]);
    let (route, grant) = (NamespacedName::new("tenant-b", "r"), NamespacedName::new("tenant-b", "grant"));
    table.apply(&with_route, &changes(|c| (c.http_routes, c.reference_grants) = ([route].into(), [grant].into())));
    assert_eq!(gateway_status(&table, "tenant-a", "web").0, ["192.168.235.1"]);
    assert_eq!(gateway_status(&table, "tenant-b", "web").1, REFUSED);
    // The holder deleted: B gets the address on the next compile.
    let without_a = Store::from_objects(vec![class(), b_asks("192.168.235.1")]);
    table.apply(&without_a, &gateways(&[("tenant-a", "web")]));
    assert_eq!(
        gateway_status(&table, "tenant-b", "web"),
        (vec!["192.168.235.1".into()], PROGRAMMED.map(String::from).into())
    );
    // A comes back: it gets a free address, B keeps .1.
    let a_again = Store::from_objects(vec![class(), a.clone(), b_asks("192.168.235.1")]);
    table.apply(&a_again, &gateways(&[("tenant-a", "web")]));
    assert_eq!(gateway_status(&table, "tenant-a", "web").0, ["192.168.235.2"]);
    assert_eq!(gateway_status(&table, "tenant-b", "web").0, ["192.168.235.1"]);
    // B's own request changes to a free address: it moves there and .1 is free again; A asking
    // for .1 now gets it.
    let b_moves = Store::from_objects(vec![class(), a.clone(), b_asks("192.168.235.9")]);
    table.apply(&b_moves, &gateways(&[("tenant-b", "web")]));
    assert_eq!(gateway_status(&table, "tenant-b", "web").0, ["192.168.235.9"]);
    let a_asks = tenant_gateway("tenant-a", "web", 2020, Some("192.168.235.1"), None);
    let a_moves = Store::from_objects(vec![class(), a_asks, b_asks("192.168.235.9")]);
    table.apply(&a_moves, &gateways(&[("tenant-a", "web")]));
    assert_eq!(gateway_status(&table, "tenant-a", "web").0, ["192.168.235.1"]);
    // B asks for A's address: refused, with no other address; its old one is released.
    let b_asks_a = Store::from_objects(vec![
        class(),
        tenant_gateway("tenant-a", "web", 2020, Some("192.168.235.1"), None),
        b_asks("192.168.235.1"),
    ]);
    table.apply(&b_asks_a, &gateways(&[("tenant-b", "web")]));
    assert_eq!(gateway_status(&table, "tenant-a", "web").0, ["192.168.235.1"]);
    assert_eq!(gateway_status(&table, "tenant-b", "web"), (vec![], REFUSED.map(String::from).into()));
    assert!(!table.serve.addresses.contains_key(&"192.168.235.9".parse().unwrap()), "released");
}
