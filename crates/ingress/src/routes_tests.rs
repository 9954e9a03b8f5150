//! Every routing rule of the module documentation, against small clusters.

use std::sync::Arc;

use roadkeeper_cluster::{Changes, NamespacedName, Object, Store};
use serde_json::{Value, json};

use super::*;

fn object(value: Value) -> Object {
    match value["kind"].as_str().unwrap() {
        "Service" => Object::Service(Arc::new(serde_json::from_value(value).unwrap())),
        "EndpointSlice" => Object::EndpointSlice(Arc::new(serde_json::from_value(value).unwrap())),
        "Ingress" => Object::Ingress(Arc::new(serde_json::from_value(value).unwrap())),
        _ => Object::IngressClass(Arc::new(serde_json::from_value(value).unwrap())),
    }
}

fn nn(name: &str) -> NamespacedName {
    NamespacedName::new("ns", name)
}

fn class(name: &str, controller: &str, default: bool) -> Object {
    let annotations = if default { json!({DEFAULT_CLASS_ANNOTATION: "true"}) } else { json!({}) };
    object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": name, "annotations": annotations}, "spec": {"controller": controller}}))
}

fn our_class() -> Object {
    class("roadkeeper", "roadkeeper.dev/ingress", false)
}

/// An Ingress in `ns` created on January 1st of `year`, with `metadata` merged in.
fn ingress_meta(name: &str, year: u32, metadata: Value, spec: Value) -> Object {
    let mut meta = json!({"name": name, "namespace": "ns", "creationTimestamp": format!("{year}-01-01T00:00:00Z")});
    meta.as_object_mut().unwrap().extend(metadata.as_object().unwrap().clone());
    object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": spec}))
}

/// An Ingress of class `roadkeeper` (unless `spec` names one).
fn ingress(name: &str, year: u32, mut spec: Value) -> Object {
    spec.as_object_mut().unwrap().entry("ingressClassName").or_insert("roadkeeper".into());
    ingress_meta(name, year, json!({}), spec)
}

fn backend(service: &str, port: Value) -> Value {
    json!({"service": {"name": service, "port": port}})
}

/// A path to `service` port 80.
fn path(path: &str, kind: &str, service: &str) -> Value {
    json!({"path": path, "pathType": kind, "backend": backend(service, json!({"number": 80}))})
}

/// A rule for `host` (none when empty).
fn rule(host: &str, paths: Vec<Value>) -> Value {
    let mut rule = json!({"http": {"paths": paths}});
    if !host.is_empty() {
        rule["host"] = host.into();
    }
    rule
}

fn service(name: &str, ports: Value) -> Object {
    object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "ns"},
        "spec": {"ports": ports}}))
}

fn slice(name: &str, service: &str, family: &str, ports: Value, endpoints: Value) -> Object {
    object(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
        "addressType": family, "ports": ports, "endpoints": endpoints}))
}

fn table(objects: Vec<Object>) -> RouteTable {
    RouteTable::build(&Store::from_objects(objects), &ClassConfig::default()).0
}

/// The backend Service's name for a request.
fn to(table: &RouteTable, host: &str, path: &str) -> Option<String> {
    table.target(host, path).map(|target| target.service.name.clone())
}

fn endpoints(target: &Target) -> Vec<String> {
    target.endpoints.iter().map(ToString::to_string).collect()
}

#[test]
fn exact_prefix_and_implementation_specific_paths() {
    let table = table(vec![
        our_class(),
        ingress(
            "web",
            2024,
            json!({"rules": [rule("a.com", vec![
                path("/foo", "Exact", "exact-foo"),
                path("/foo", "Prefix", "prefix-foo"),
                path("/foo/bar", "Prefix", "prefix-foo-bar"),
                path("/docs/", "Prefix", "docs"),
                path("/impl", "ImplementationSpecific", "impl"),
                path("/Case", "Exact", "case"),
                path("/", "Prefix", "root"),
            ])]}),
        ),
    ]);
    let cases = [
        ("/foo", "exact-foo"), // Exact beats Prefix on equal length
        ("/foo/", "prefix-foo"),
        ("/foo/bar", "prefix-foo-bar"), // the longest match
        ("/foo/bar/", "prefix-foo-bar"),
        ("/foo/bar/baz", "prefix-foo-bar"),
        ("/foo/barbaz", "prefix-foo"), // element-wise: /foo/bar does not match
        ("/foobar", "root"),
        ("/docs", "docs"), // the path's trailing slash is ignored
        ("/docs/x", "docs"),
        ("/docsx", "root"),
        ("/impl/x", "impl"), // ImplementationSpecific is Prefix
        ("/implx", "root"),
        ("/Case", "case"),
        ("/case", "root"), // case-sensitive
        ("/case/x", "root"),
        ("/", "root"),
        ("/anything/else", "root"),
    ];
    for (request, expected) in cases {
        assert_eq!(to(&table, "a.com", request).as_deref(), Some(expected), "{request}");
    }
}

#[test]
fn exact_wildcard_and_catch_all_hosts_fall_through() {
    let table = table(vec![
        our_class(),
        ingress(
            "web",
            2024,
            json!({"rules": [
                rule("foo.com", vec![path("/app", "Prefix", "exact-host")]),
                rule("*.foo.com", vec![path("/", "Prefix", "wildcard")]),
                rule("*.bar.com", vec![path("/api", "Prefix", "bar-wildcard")]),
                rule("Mixed.Example.COM", vec![path("/", "Prefix", "mixed")]),
                rule("", vec![path("/", "Prefix", "any")]),
            ]}),
        ),
    ]);
    let cases = [
        ("foo.com", "/app", "exact-host"),
        ("foo.com", "/other", "any"), // the apex is not covered by *.foo.com
        ("bar.foo.com", "/app", "wildcard"),
        ("baz.bar.foo.com", "/", "any"), // a wildcard covers one label
        ("x.bar.com", "/api/v1", "bar-wildcard"),
        ("x.bar.com", "/other", "any"), // no path of the wildcard host matches: on to the catch-all
        ("other.org", "/", "any"),
        ("", "/", "any"),
        (".foo.com", "/", "any"),            // an empty first label is no label
        ("mixed.example.com", "/", "mixed"), // rule hosts are lowercased
        // The caller lowercases the request's host and strips its port: the table does not.
        ("FOO.COM", "/app", "any"),
        ("foo.com:80", "/app", "any"),
    ];
    for (host, request, expected) in cases {
        assert_eq!(to(&table, host, request).as_deref(), Some(expected), "{host}{request}");
    }
}

#[test]
fn default_backend_and_not_found() {
    let rules = json!([rule("a.com", vec![path("/x", "Prefix", "x")])]);
    let without = table(vec![our_class(), ingress("web", 2024, json!({"rules": rules.clone()}))]);
    assert_eq!(to(&without, "a.com", "/x"), Some("x".into()));
    assert_eq!(without.target("a.com", "/y"), None);
    assert_eq!(without.target("b.com", "/"), None);

    let default = |service: &str| json!({"defaultBackend": backend(service, json!({"number": 80}))});
    let with = table(vec![
        our_class(),
        ingress("web", 2024, json!({"rules": rules})),
        ingress("newer", 2025, default("newer-default")),
        ingress("older", 2023, default("older-default")),
    ]);
    let target = with.target("a.com", "/y").unwrap();
    assert_eq!((&target.ingress, &target.service), (&nn("older"), &nn("older-default")));
    assert_eq!(to(&with, "b.com", "/"), Some("older-default".into()));
    assert_eq!(to(&with, "a.com", "/x"), Some("x".into()));
}

fn cluster() -> Vec<Object> {
    vec![
        our_class(),
        service("web", json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}])),
        slice(
            "web-4",
            "web",
            "IPv4",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9091}]),
            json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true}}]),
        ),
        slice("web-4b", "web", "IPv4", json!([{"name": "http", "port": 8080}]), json!([{"addresses": ["10.0.0.1"]}])),
        slice("web-6", "web", "IPv6", json!([{"name": "http", "port": 8080}]), json!([{"addresses": ["fd00::1"]}])),
        service("api", json!([{"port": 8000}])),
        slice("api-4", "api", "IPv4", json!([{"port": 9000}]), json!([{"addresses": ["10.0.1.1"]}])),
        service("dns", json!([{"name": "udp", "port": 53, "protocol": "UDP"}, {"name": "tcp", "port": 53}])),
        slice(
            "dns-4",
            "dns",
            "IPv4",
            json!([{"name": "udp", "port": 5353, "protocol": "UDP"}, {"name": "tcp", "port": 5354}]),
            json!([{"addresses": ["10.0.2.1"]}]),
        ),
    ]
}

fn port_path(path: &str, service: &str, port: Value) -> Value {
    json!({"path": path, "pathType": "Prefix", "backend": backend(service, port)})
}

#[test]
fn backends_resolve_to_ready_endpoints_of_the_slice_port() {
    let mut objects = cluster();
    objects.push(ingress(
        "web",
        2024,
        json!({"rules": [rule("a.com", vec![
            port_path("/by-name", "web", json!({"name": "http"})),
            port_path("/by-number", "web", json!({"number": 80})),
            port_path("/metrics", "web", json!({"name": "metrics"})),
            port_path("/api", "api", json!({"number": 8000})),
            port_path("/dns", "dns", json!({"number": 53})),
            port_path("/no-service", "nope", json!({"number": 80})),
            port_path("/no-port-name", "api", json!({"name": "grpc"})),
            port_path("/no-port-number", "web", json!({"number": 81})),
            port_path("/no-port", "web", json!({})),
            json!({"path": "/bucket", "pathType": "Prefix",
                "backend": {"resource": {"apiGroup": "k8s.example.com", "kind": "Bucket", "name": "b"}}}),
            port_path("relative", "web", json!({"number": 80})),
            json!({"path": "/regex", "pathType": "Regex", "backend": backend("web", json!({"number": 80}))}),
        ])]}),
    ));
    let (table, warnings) = RouteTable::build(&Store::from_objects(objects), &ClassConfig::default());
    let at = |path: &str| endpoints(&table.target("a.com", path).unwrap());
    let web = ["10.0.0.1:8080", "10.0.0.2:8080", "[fd00::1]:8080"];
    assert_eq!(at("/by-name"), web);
    assert_eq!(at("/by-number"), web);
    assert_eq!(at("/metrics"), ["10.0.0.1:9091", "10.0.0.2:9091"]);
    assert_eq!(at("/api"), ["10.0.1.1:9000"]);
    assert_eq!(at("/dns"), ["10.0.2.1:5354"]);
    for missing in ["/no-service", "/no-port-name", "/no-port-number"] {
        assert_eq!(at(missing), Vec::<String>::new(), "{missing}");
    }
    for skipped in ["/no-port", "/bucket", "/regex"] {
        assert_eq!(table.target("a.com", skipped), None, "{skipped}");
    }
    let field = |j: usize| format!("Ingress ns/web: spec.rules[0].http.paths[{j}]");
    assert_eq!(
        warnings,
        [
            format!("{}.backend.service.name: Service ns/nope does not exist", field(5)),
            format!("{}.backend.service.port: Service ns/api has no TCP port \"grpc\"", field(6)),
            format!("{}.backend.service.port: Service ns/web has no TCP port 81", field(7)),
            format!("{}.backend.service.port: needs a number or a name", field(8)),
            format!("{}.backend: only Service backends are supported", field(9)),
            format!("{}.path: \"relative\" does not start with /", field(10)),
            format!("{}.pathType: unknown path type \"Regex\"", field(11)),
        ]
    );
}

/// The names of the Ingresses a table serves.
fn served(objects: Vec<Object>, config: &ClassConfig) -> Vec<String> {
    let (table, _) = RouteTable::build(&Store::from_objects(objects), config);
    table.ingresses().into_iter().map(|key| key.name).collect()
}

#[test]
fn ingress_classes_decide_which_ingresses_are_ours() {
    let spec = |class: Option<&str>| {
        let mut spec = json!({"rules": [rule("a.com", vec![path("/", "Prefix", "web")])]});
        if let Some(class) = class {
            spec["ingressClassName"] = class.into();
        }
        spec
    };
    let legacy = |value: &str| json!({"annotations": {LEGACY_CLASS_ANNOTATION: value}});
    let ingresses = || {
        vec![
            ingress_meta("by-name", 2024, json!({}), spec(Some("roadkeeper"))),
            ingress_meta("by-other-name", 2024, json!({}), spec(Some("edge"))),
            ingress_meta("other-class", 2024, json!({}), spec(Some("nginx"))),
            ingress_meta("unknown-class", 2024, json!({}), spec(Some("unknown"))),
            ingress_meta("no-class", 2024, json!({}), spec(None)),
            ingress_meta("legacy", 2024, legacy("roadkeeper"), spec(None)),
            ingress_meta("legacy-other", 2024, legacy("nginx"), spec(None)),
        ]
    };
    let with = |classes: Vec<Object>| classes.into_iter().chain(ingresses()).collect::<Vec<_>>();
    let config = ClassConfig::default();
    let nginx = class("nginx", "k8s.io/ingress-nginx", true);
    let edge = |default: bool| class("edge", "roadkeeper.dev/ingress", default);

    // Our classes by controller; "nginx" is the default class, so no-class is not ours.
    assert_eq!(
        served(with(vec![our_class(), edge(false), nginx.clone()]), &config),
        ["by-name", "by-other-name", "legacy"]
    );
    // One of ours is the default class: Ingresses naming none are ours.
    assert_eq!(
        served(with(vec![our_class(), edge(true), nginx.clone()]), &config),
        ["by-name", "by-other-name", "legacy", "no-class"]
    );
    // Without IngressClass objects, a class name equal to ours is accepted.
    assert_eq!(served(with(vec![]), &config), ["by-name", "legacy"]);
    // An IngressClass of our name but another controller is not ours.
    assert_eq!(served(with(vec![class("roadkeeper", "example.com/other", false)]), &config), ["legacy"]);
    // Both names are configurable.
    let custom = ClassConfig { name: "edge".into(), controller: "example.com/edge".into() };
    let custom_class = class("nginx", "example.com/edge", false);
    assert_eq!(served(with(vec![custom_class]), &custom), ["by-other-name", "other-class"]);

    // Ingresses of other classes are ignored entirely: routes, default backend and TLS.
    let table = table(vec![
        our_class(),
        ingress(
            "theirs",
            2020,
            json!({"ingressClassName": "nginx", "rules": [rule("b.com", vec![path("/", "Prefix", "b")])],
                "defaultBackend": backend("b", json!({"number": 80})),
                "tls": [{"hosts": ["b.com"], "secretName": "b"}]}),
        ),
    ]);
    assert_eq!((table.target("b.com", "/"), table.tls_hosts(), table.ingresses()), (None, vec![], vec![]));
}

#[test]
fn rules_of_several_ingresses_merge_and_the_oldest_wins() {
    let table = table(vec![
        our_class(),
        ingress(
            "new",
            2025,
            json!({"rules": [rule("a.com", vec![
                path("/shared/", "Prefix", "new-shared"), // the same Prefix path as /shared
                path("/old", "ImplementationSpecific", "new-old"), // the same as Prefix /old
                path("/shared", "Exact", "new-exact"),
                path("/new", "Prefix", "new"),
            ])]}),
        ),
        ingress(
            "old",
            2024,
            json!({"rules": [rule("a.com", vec![
                path("/shared", "Prefix", "old-shared"),
                path("/old", "Prefix", "old"),
            ])]}),
        ),
        // Same age: the name decides.
        ingress("b-same", 2023, json!({"rules": [rule("c.com", vec![path("/", "Prefix", "b")])]})),
        ingress("a-same", 2023, json!({"rules": [rule("c.com", vec![path("/", "Prefix", "a")])]})),
    ]);
    let target = table.target("a.com", "/shared/x").unwrap();
    assert_eq!((&target.ingress, target.service.name.as_str()), (&nn("old"), "old-shared"));
    assert_eq!(to(&table, "a.com", "/shared").as_deref(), Some("new-exact"));
    assert_eq!(to(&table, "a.com", "/old").as_deref(), Some("old"));
    let target = table.target("a.com", "/new/x").unwrap();
    assert_eq!((&target.ingress, target.service.name.as_str()), (&nn("new"), "new"));
    assert_eq!(to(&table, "c.com", "/").as_deref(), Some("a"));
    assert_eq!(table.ingresses(), [nn("a-same"), nn("b-same"), nn("new"), nn("old")]);
}

#[test]
fn tls_hosts_oldest_ingress_wins_per_host() {
    let (table, warnings) = RouteTable::build(
        &Store::from_objects([
            our_class(),
            ingress("new", 2025, json!({"tls": [{"hosts": ["a.com", "c.com"], "secretName": "new-cert"}]})),
            ingress(
                "old",
                2024,
                json!({"tls": [{"hosts": ["A.com", "*.b.com"], "secretName": "old-cert"}, {"hosts": ["d.com"]}]}),
            ),
        ]),
        &ClassConfig::default(),
    );
    assert_eq!(
        table.tls_hosts(),
        [("*.b.com".into(), nn("old-cert")), ("a.com".into(), nn("old-cert")), ("c.com".into(), nn("new-cert"))]
    );
    assert_eq!(warnings, ["Ingress ns/old: spec.tls[1].secretName: missing: its hosts get no certificate"]);
}

/// Applies the change from `before` to `after` (naming what changed) and checks that the result
/// equals a fresh build of `after`, and that the old snapshot did not change.
fn apply_matches_build(before: &[Object], after: &[Object], changes: Changes) -> (RouteTable, RouteTable) {
    let config = ClassConfig::default();
    let old = RouteTable::build(&Store::from_objects(before.to_vec()), &config).0;
    let mut new = old.clone();
    let store = Store::from_objects(after.to_vec());
    new.apply(&store, &changes, &config);
    assert_eq!(new, RouteTable::build(&store, &config).0);
    assert_eq!(old, RouteTable::build(&Store::from_objects(before.to_vec()), &config).0);
    (old, new)
}

fn ingress_changes(names: &[&str]) -> Changes {
    Changes { ingresses: names.iter().map(|n| nn(n)).collect(), ..Changes::default() }
}

#[test]
fn incremental_apply_equals_a_fresh_build() {
    let web = |year: u32, paths: Vec<Value>| {
        ingress("web", year, json!({"rules": [rule("a.com", paths)], "tls": [{"hosts": ["a.com"], "secretName": "c"}]}))
    };
    let base = cluster();
    let with = |extra: Vec<Object>| base.iter().cloned().chain(extra).collect::<Vec<_>>();
    let web_one = web(2024, vec![port_path("/", "web", json!({"name": "http"}))]);
    let one = with(vec![web_one.clone()]);

    // Added.
    let (_, table) = apply_matches_build(&base, &one, ingress_changes(&["web"]));
    assert_eq!(endpoints(&table.target("a.com", "/").unwrap()), ["10.0.0.1:8080", "10.0.0.2:8080", "[fd00::1]:8080"]);
    // Changed: another path, another host, a default backend.
    let changed = with(vec![ingress(
        "web",
        2024,
        json!({"rules": [rule("b.com", vec![port_path("/api", "api", json!({"number": 8000}))])],
            "defaultBackend": backend("web", json!({"name": "http"}))}),
    )]);
    let (old, table) = apply_matches_build(&one, &changed, ingress_changes(&["web"]));
    assert_eq!((to(&old, "b.com", "/api"), to(&table, "a.com", "/")), (None, Some("web".into())));
    assert_eq!(to(&table, "b.com", "/api"), Some("api".into()));
    assert!(table.tls_hosts().is_empty());
    // Merged with a second Ingress, then one of them deleted.
    let api =
        ingress("api", 2023, json!({"rules": [rule("a.com", vec![port_path("/", "api", json!({"number": 8000}))])]}));
    let two = with(vec![web_one, api]);
    let (_, table) = apply_matches_build(&one, &two, ingress_changes(&["api"]));
    assert_eq!(to(&table, "a.com", "/"), Some("api".into()));
    let (_, table) = apply_matches_build(&two, &one, ingress_changes(&["api"]));
    assert_eq!(to(&table, "a.com", "/"), Some("web".into()));
    // Deleted, and an Ingress of another class changed.
    let mut other = base.clone();
    other.push(ingress("theirs", 2024, json!({"ingressClassName": "nginx", "rules": [rule("", vec![])]})));
    let (_, table) = apply_matches_build(&one, &other, ingress_changes(&["web", "theirs"]));
    assert_eq!(table, RouteTable::default());
    // A class change: the default class makes an Ingress without a class ours.
    let no_class =
        ingress_meta("plain", 2024, json!({}), json!({"rules": [rule("", vec![path("/", "Prefix", "web")])]}));
    let mut before = base.clone();
    before.push(no_class.clone());
    let mut after = with(vec![no_class, class("roadkeeper", "roadkeeper.dev/ingress", true)]);
    let changes = Changes { ingress_classes: ["roadkeeper".into()].into(), ..Changes::default() };
    let (old, table) = apply_matches_build(&before, &after, changes.clone());
    assert_eq!((old.ingresses(), table.ingresses()), (vec![], vec![nn("plain")]));
    after.retain(|o| !matches!(o, Object::IngressClass(_)));
    apply_matches_build(&before, &after, changes);
}

#[test]
fn a_service_change_refreshes_only_its_backends() {
    let web_and_api = |api_endpoints: Value| {
        let mut objects = cluster();
        objects.retain(|o| !matches!(o, Object::EndpointSlice(s) if s.metadata.name.as_deref() == Some("api-4")));
        objects.push(slice("api-4", "api", "IPv4", json!([{"port": 9000}]), api_endpoints));
        objects.push(ingress(
            "web",
            2024,
            json!({"rules": [rule("a.com", vec![
                port_path("/web", "web", json!({"name": "http"})),
                port_path("/api", "api", json!({"number": 8000})),
                port_path("/later", "later", json!({"number": 80})),
            ])], "defaultBackend": backend("api", json!({"number": 8000}))}),
        ));
        objects
    };
    let before = web_and_api(json!([{"addresses": ["10.0.1.1"]}]));
    let after = web_and_api(json!([{"addresses": ["10.0.1.1"]}, {"addresses": ["10.0.1.2"]}]));
    let changes = Changes { services: [nn("api")].into(), ..Changes::default() };
    let (old, new) = apply_matches_build(&before, &after, changes);
    let at = |table: &RouteTable, path: &str| table.target("a.com", path).unwrap();
    assert_eq!(endpoints(&at(&new, "/api")), ["10.0.1.1:9000", "10.0.1.2:9000"]);
    assert_eq!(endpoints(&at(&new, "/nothing")), ["10.0.1.1:9000", "10.0.1.2:9000"]);
    assert_eq!(endpoints(&at(&old, "/api")), ["10.0.1.1:9000"]);
    // The backends of other Services keep their endpoint lists (the same allocation).
    assert!(Arc::ptr_eq(&at(&old, "/web").endpoints, &at(&new, "/web").endpoints));

    // A Service that appears later fills the backends that named it.
    let mut later = after.clone();
    later.push(service("later", json!([{"port": 80}])));
    later.push(slice("later-4", "later", "IPv4", json!([{"port": 80}]), json!([{"addresses": ["10.0.3.1"]}])));
    let changes = Changes { services: [nn("later")].into(), ..Changes::default() };
    let (_, table) = apply_matches_build(&after, &later, changes.clone());
    assert_eq!(endpoints(&at(&table, "/later")), ["10.0.3.1:80"]);
    // And one that goes empties them, with a warning.
    let config = ClassConfig::default();
    let mut table = RouteTable::build(&Store::from_objects(later), &config).0;
    let warnings = table.apply(&Store::from_objects(after), &changes, &config);
    assert_eq!(endpoints(&at(&table, "/later")), Vec::<String>::new());
    assert_eq!(
        warnings,
        ["Ingress ns/web: spec.rules[0].http.paths[2].backend.service.name: Service ns/later does not exist"]
    );
}

#[test]
fn explain_names_the_host_keys_tried_and_the_rule_that_served() {
    let t = table(vec![
        our_class(),
        ingress(
            "a",
            2020,
            json!({"rules": [rule("a.example", vec![path("/api", "Exact", "api")]),
            rule("*.example", vec![path("/", "Prefix", "wild")])]}),
        ),
        ingress("fallback", 2021, json!({"defaultBackend": backend("default", json!({"number": 80}))})),
    ]);
    let exact = t.explain("a.example", "/api");
    assert_eq!(exact.tried, [("a.example".to_string(), 1), ("*.example".to_string(), 1), ("*".to_string(), 0)]);
    let matched = exact.matched.unwrap();
    assert_eq!((matched.ingress, matched.field.as_str()), (nn("a"), "spec.rules[0].http.paths[0]"));
    assert_eq!((matched.host.as_deref(), matched.path), (Some("a.example"), Some(("/api".to_string(), "Exact"))));
    assert_eq!((matched.service, matched.port.as_deref()), (nn("api"), Some("80")));

    let wild = t.explain("a.example", "/other").matched.unwrap();
    assert_eq!((wild.host.as_deref(), wild.path), (Some("*.example"), Some(("/".to_string(), "Prefix"))));
    let default = t.explain("b.test", "/").matched.unwrap();
    assert_eq!((default.field.as_str(), default.service, default.host), ("spec.defaultBackend", nn("default"), None));
    assert_eq!(table(vec![our_class()]).explain("b.test", "/").matched, None);
}

#[test]
fn router_forwards_to_the_target_unchanged() {
    let table = table(vec![
        our_class(),
        ingress("web", 2024, json!({"rules": [rule("a.com", vec![path("/", "Prefix", "root")])]})),
    ]);
    let headers = hyper::HeaderMap::new();
    let request = |host| Request {
        local: "10.0.0.1:80".parse().unwrap(),
        tls: false,
        host,
        path: "/x",
        query: Some("q=1"),
        method: &hyper::Method::GET,
        headers: &headers,
    };
    let target = table.target("a.com", "/x").unwrap();
    assert_eq!(Router::route(&table, &request("a.com")), Some(Decision::Forward(Forward::to(target))));
    assert_eq!(Router::route(&table, &request("b.com")), None);
}
