//! `roadkeeper gateway` end to end: the real binary in its own network namespace reading a
//! manifest folder of Gateway API objects, real HTTP backends, a plain-socket client and curl.
//! The pool of Gateway addresses is made local on the namespace's loopback, as deploy/gateway.yaml
//! does on a node.
//!
//! - two Gateways on port 80, each on its own address, route the same path differently;
//! - a route added or changed is served within a second, without a restart;
//! - HTTPRoute matches and filters on the wire: a header match, a redirect, request header
//!   edits, a path rewrite, weights, and 500 for a backend that does not exist;
//! - an HTTPS listener with the certificate of a `kubernetes.io/tls` Secret, by SNI;
//! - an address held by one tenant's Gateway is refused to another's that asks for it, across a
//!   restart, until its holder is deleted.

mod common;

use std::time::Duration;

use common::web::{Bench, Reply, backend, exchange, request_head, service, tls_secret};
use common::{binary, eventually};
use roadkeeper_netlab::Process;

/// The Gateways' addresses (`--address-pool`), local inside each test's namespace.
const POOL: &str = "192.168.235.0/24";
/// The first Gateway's address (the oldest gets the lowest), and the second's.
const FIRST: &str = "192.168.235.1";
const SECOND: &str = "192.168.235.2";
/// Where it serves `/metrics` (up once the listeners are).
const METRICS: &str = "127.0.0.1:10254";
/// How long a change may take to show (the binary promises about a second).
const SETTLE: Duration = Duration::from_secs(10);

/// One `roadkeeper gateway` in its own [`Bench`], reading its manifest folder.
struct Lab(Bench);

impl std::ops::Deref for Lab {
    type Target = Bench;
    fn deref(&self) -> &Bench {
        &self.0
    }
}

impl Lab {
    /// A [`Bench`] with the pool local on its loopback and the GatewayClass in its folder.
    fn new(prefix: &str) -> Lab {
        let lab = Lab(Bench::new(prefix));
        lab.ns.ip(["route", "add", "local", POOL, "dev", "lo"]).expect("local pool");
        lab.write(
            "class.yaml",
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: roadkeeper}\n\
             spec: {controllerName: roadkeeper.dev/gateway}\n",
        );
        lab
    }

    /// Starts `roadkeeper gateway` (killed with the namespace) and waits for its metrics server,
    /// which opens once the state is loaded and the listeners are up.
    fn start(&self) -> Process {
        let args = [
            "env".to_owned(),
            "RUST_LOG=warn,roadkeeper=info".to_owned(),
            binary().display().to_string(),
            "gateway".into(),
            "--manifests".into(),
            self.manifests().display().to_string(),
            "--address-pool".into(),
            POOL.into(),
            "--metrics-bind-address".into(),
            METRICS.into(),
        ];
        let process = self.ns.spawn_logged(&args, &self.dir.path().join("gateway.log")).expect("spawn");
        let head = request_head(METRICS, "/metrics", &[], "close");
        let up = eventually(Duration::from_secs(30), || {
            self.ns.run(|| exchange(METRICS.parse().unwrap(), None, &head)).is_ok()
        });
        assert!(up, "roadkeeper gateway does not serve metrics; log:\n{}", self.log());
        process
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// Starts a [`backend`] `name` on 10.244.0.`host`:`port` with a Service `name` in front.
    fn backend(&self, name: &'static str, host: u8, port: u16) {
        self.backend_in("default", name, host, port);
    }

    /// [`backend`](Self::backend) with its Service in `namespace`.
    fn backend_in(&self, namespace: &str, name: &'static str, host: u8, port: u16) {
        let address = format!("10.244.0.{host}");
        let listener = self.ns.run(|| std::net::TcpListener::bind((address.as_str(), port))).expect("bind backend");
        backend(listener, name);
        let yaml =
            service(name, port, &[&address], &[]).replace("namespace: default", &format!("namespace: {namespace}"));
        self.write(&format!("svc-{namespace}-{name}.yaml"), &yaml);
    }

    /// `GET path` with `Host: host` and `headers` to `address`:80.
    fn get(&self, address: &str, host: &str, path: &str, headers: &[&str]) -> Reply {
        let head = request_head(host, path, headers, "close");
        let to = format!("{address}:80").parse().unwrap();
        self.ns
            .run(|| exchange(to, None, &head))
            .unwrap_or_else(|err| panic!("GET {host}{path}: {err}; log:\n{}", self.log()))
    }

    /// Waits until `GET path` on `address` is served by `expected` (a backend name or a status).
    fn until(&self, address: &str, host: &str, path: &str, expected: &str) {
        let served = eventually(SETTLE, || self.get(address, host, path, &[]).served_by() == expected);
        let last = self.get(address, host, path, &[]);
        assert!(
            served,
            "GET {host}{path} at {address}: {} {}, not {expected}; log:\n{}",
            last.status,
            last.body,
            self.log()
        );
    }
}

/// A Gateway `name` with one HTTP listener on port 80 taking routes from every namespace.
fn gateway(name: &str, created: &str) -> String {
    gateway_in("default", name, created, "")
}

/// [`gateway`] in `namespace`, with `more` (YAML lines) appended: its `spec.addresses`, its status.
fn gateway_in(namespace: &str, name: &str, created: &str, more: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
         metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: '{created}'}}\n\
         spec:\n  gatewayClassName: roadkeeper\n  listeners: [{{name: http, port: 80, protocol: HTTP, \
         allowedRoutes: {{namespaces: {{from: All}}}}}}]\n{more}"
    )
}

/// An HTTPRoute `name` attached to Gateway `parent`, with `rules` in YAML flow style.
fn route(name: &str, parent: &str, rules: &str) -> String {
    route_in("default", name, parent, rules)
}

/// [`route`] in `namespace` (its parent too).
fn route_in(namespace: &str, name: &str, parent: &str, rules: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec: {{parentRefs: [{{name: {parent}}}], rules: {rules}}}\n"
    )
}

/// Two Gateways on port 80 each on their own address route `/` differently; a route added and
/// then changed is served within a second, without a restart.
#[test]
fn gateways_are_told_apart_by_address_and_follow_route_changes() {
    let lab = Lab::new("rk-gw-basic");
    lab.backend("web-a", 1, 8081);
    lab.backend("web-b", 2, 8082);
    lab.write("gw-one.yaml", &gateway("one", "2024-01-01T00:00:00Z"));
    lab.write("gw-two.yaml", &gateway("two", "2024-02-01T00:00:00Z"));
    lab.write("route-one.yaml", &route("to-a", "one", "[{backendRefs: [{name: web-a, port: 80}]}]"));
    let _gateway = lab.start();
    lab.until(FIRST, "example.com", "/", "web-a");
    assert_eq!(lab.get(SECOND, "example.com", "/", &[]).served_by(), "404", "the other Gateway has no route");
    lab.write("route-two.yaml", &route("to-b", "two", "[{backendRefs: [{name: web-b, port: 80}]}]"));
    lab.until(SECOND, "example.com", "/", "web-b");
    assert_eq!(lab.get(FIRST, "example.com", "/", &[]).served_by(), "web-a");
    lab.write("route-one.yaml", &route("to-a", "one", "[{backendRefs: [{name: web-b, port: 80}]}]"));
    lab.until(FIRST, "example.com", "/", "web-b");
    let log = lab.log();
    assert!(log.contains("Gateway default/one") && log.contains("192.168.235.1"), "the status it would write:\n{log}");
}

/// Matches and filters on the wire.
#[test]
fn matches_and_filters_reach_the_backends() {
    let lab = Lab::new("rk-gw-filters");
    lab.backend("web-a", 1, 8081);
    lab.backend("web-b", 2, 8082);
    lab.write("gw.yaml", &gateway("gw", "2024-01-01T00:00:00Z"));
    let rules = "[\
        {matches: [{headers: [{name: version, value: two}]}], backendRefs: [{name: web-b, port: 80}]},\
        {matches: [{path: {type: PathPrefix, value: /old}}], filters: [{type: RequestRedirect, \
          requestRedirect: {hostname: new.example, statusCode: 301}}]},\
        {matches: [{path: {type: PathPrefix, value: /edit}}], filters: [{type: RequestHeaderModifier, \
          requestHeaderModifier: {set: [{name: X-Forwarded-Host, value: set.example}]}}], backendRefs: [{name: web-a, port: 80}]},\
        {matches: [{path: {type: PathPrefix, value: /api}}], filters: [{type: URLRewrite, \
          urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}], backendRefs: [{name: web-a, port: 80}]},\
        {matches: [{path: {type: PathPrefix, value: /missing}}], backendRefs: [{name: nothing, port: 80}]},\
        {matches: [{path: {type: PathPrefix, value: /split}}], backendRefs: [{name: web-a, port: 80, weight: 3}, {name: web-b, port: 80, weight: 1}]},\
        {backendRefs: [{name: web-a, port: 80}]}]";
    lab.write("route.yaml", &route("r", "gw", rules));
    let _gateway = lab.start();
    lab.until(FIRST, "example.com", "/", "web-a");
    assert_eq!(lab.get(FIRST, "example.com", "/", &["Version: two"]).served_by(), "web-b");
    let redirect = lab.get(FIRST, "example.com", "/old/page?x=1", &[]);
    assert_eq!(redirect.status, 301);
    let edited = lab.get(FIRST, "example.com", "/edit", &[]);
    assert_eq!(edited.echoed("x-forwarded-host").as_deref(), Some("example.com"), "ours wins over a filter's");
    let rewritten = lab.get(FIRST, "example.com", "/api/users?id=7", &[]);
    assert_eq!(rewritten.body.lines().next(), Some("web-a /v2/users?id=7"));
    assert_eq!(lab.get(FIRST, "example.com", "/missing", &[]).status, 500);
    let split: Vec<String> = (0..40).map(|_| lab.get(FIRST, "example.com", "/split", &[]).served_by()).collect();
    let a = split.iter().filter(|s| *s == "web-a").count();
    assert!(
        (28..=32).contains(&a) && split.iter().all(|s| s == "web-a" || s == "web-b"),
        "3:1 over 40 requests in a row: {split:?}"
    );
}

/// An HTTPS listener serves the certificate of its Secret by SNI.
#[test]
fn https_listeners_terminate_tls_with_their_secret() {
    let lab = Lab::new("rk-gw-tls");
    lab.backend("web-a", 1, 8081);
    let (secret, ca) = tls_secret("secure.example");
    lab.write("secret.yaml", &secret);
    lab.write(
        "gw.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: tls, namespace: default}\n\
         spec: {gatewayClassName: roadkeeper, listeners: [{name: https, port: 443, protocol: HTTPS, \
         hostname: secure.example, tls: {certificateRefs: [{name: secure.example-tls}]}}]}\n",
    );
    lab.write("route.yaml", &route("r", "tls", "[{backendRefs: [{name: web-a, port: 80}]}]"));
    let _gateway = lab.start();
    let ca_file = lab.dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let curl = || {
        let resolve = format!("secure.example:443:{FIRST}");
        let ca = ca_file.display().to_string();
        let args =
            ["curl", "-sS", "--max-time", "5", "--cacert", &ca, "--resolve", &resolve, "https://secure.example/hello"];
        lab.ns
            .exec(args)
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_else(|e| format!("{e:#}"))
    };
    let served = eventually(SETTLE, || curl().starts_with("web-a /hello"));
    assert!(served, "curl: {}; log:\n{}", curl(), lab.log());
}

/// Tenant B's Gateway asks (`spec.addresses`) for the address tenant A's Gateway holds: A keeps
/// it and keeps serving its route there; B gets no address and its status says `Programmed:
/// False, AddressNotUsable`; so again after a restart (A's status, the memory, naming the
/// address); once A's Gateway is deleted, B gets the address.
#[test]
fn an_address_held_by_one_tenants_gateway_is_refused_to_another() {
    let lab = Lab::new("rk-gw-held");
    lab.backend_in("tenant-a", "web-a", 1, 8081);
    lab.backend_in("tenant-b", "web-b", 2, 8082);
    lab.write("gw-a.yaml", &gateway_in("tenant-a", "web", "2024-01-01T00:00:00Z", ""));
    lab.write("route-a.yaml", &route_in("tenant-a", "web", "web", "[{backendRefs: [{name: web-a, port: 80}]}]"));
    let gateway = lab.start();
    lab.until(FIRST, "example.com", "/", "web-a");

    let asks = format!("  addresses: [{{type: IPAddress, value: {FIRST}}}]\n");
    lab.write("route-b.yaml", &route_in("tenant-b", "web", "web", "[{backendRefs: [{name: web-b, port: 80}]}]"));
    lab.write("gw-b.yaml", &gateway_in("tenant-b", "web", "2024-02-01T00:00:00Z", &asks));
    // The status it would write (logged with --manifests), from `since` bytes of the log on.
    let statuses = |since: usize, gateway: &str| -> Vec<String> {
        let log = lab.log();
        let prefix = format!("Gateway {gateway}: ");
        let lines = log.get(since..).unwrap_or_default().lines();
        lines.filter_map(|line| Some(line.split_once(&prefix)?.1.to_owned())).collect()
    };
    let refused = |since: usize| {
        statuses(since, "tenant-b/web").last().is_some_and(|status| {
            status.contains("\"reason\":\"AddressNotUsable\"") && status.contains("\"addresses\":[]")
        })
    };
    let settled = eventually(SETTLE, || refused(0));
    assert!(settled, "tenant-b/web not refused; log:\n{}", lab.log());
    for _ in 0..20 {
        assert_eq!(lab.get(FIRST, "example.com", "/", &[]).served_by(), "web-a", "log:\n{}", lab.log());
    }
    let a = statuses(0, "tenant-a/web");
    assert!(a.iter().all(|status| status.contains(FIRST) && !status.contains(SECOND)), "A keeps {FIRST}: {a:?}");

    // A restart, A's status naming its address as the API server would give it back.
    gateway.terminate(SETTLE).expect("SIGTERM");
    let held = format!("status:\n  addresses: [{{type: IPAddress, value: {FIRST}}}]\n");
    lab.write("gw-a.yaml", &gateway_in("tenant-a", "web", "2024-01-01T00:00:00Z", &held));
    let since = lab.log().len();
    let _gateway = lab.start();
    lab.until(FIRST, "example.com", "/", "web-a");
    assert!(eventually(SETTLE, || refused(since)), "tenant-b/web not refused after a restart; log:\n{}", lab.log());
    assert_eq!(lab.get(FIRST, "example.com", "/", &[]).served_by(), "web-a");

    // The holder deleted: B gets the address.
    lab.remove("gw-a.yaml");
    lab.until(FIRST, "example.com", "/", "web-b");
}
