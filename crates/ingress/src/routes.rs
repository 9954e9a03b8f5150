//! The route table (pure): the Ingresses of our class, compiled into an immutable snapshot that
//! answers "which endpoints serve this host and path".
//!
//! Semantics are Ingress v1's (`shared/reference/ingress.md`), plus these choices:
//!
//! - **Paths**: `Exact` is the whole path, case-sensitive. `Prefix` matches element by element on
//!   `/`, its trailing slash ignored (`/foo/bar` matches `/foo/bar` and `/foo/bar/baz`, not
//!   `/foo/barbaz`; `/` matches everything). `ImplementationSpecific` is `Prefix`, so `Prefix` and
//!   `ImplementationSpecific` with the same path are the same route. The longest path wins (a
//!   `Prefix` path counted without its trailing slash); on equal length `Exact` beats `Prefix`.
//! - **Hosts**: exact, or `*.foo.com` covering exactly one label (`bar.foo.com`, not `foo.com`
//!   nor `baz.bar.foo.com`); rules without a host serve every host. Rule hosts are compared
//!   lowercase; the caller passes the request's host lowercase and without its port
//!   ([`Router::route`]).
//! - **Fall-through**: the exact host's paths are tried first, then the wildcard host's, then
//!   those of rules without a host, then the default backend; `None` (404) when nothing matches.
//!   So a request for a known host whose paths do not match still reaches a host-less rule.
//!   ingress-nginx does not do that: there each host is a server whose unmatched paths go to a
//!   default backend (the host's first Ingress's `spec.defaultBackend`, else the global one), and
//!   host-less rules only serve hosts that no rule names. We follow the Ingress API's wording
//!   instead: a rule without a host matches every host, and the default backend serves "requests
//!   that don't match any rule".
//! - **Merging**: the rules of all our Ingresses for the same host are merged (as ingress-nginx
//!   users expect); for the same host, path and type the oldest Ingress wins
//!   (`metadata.creationTimestamp`, then namespace/name; a missing timestamp counts as oldest).
//!   The oldest Ingress with a `spec.defaultBackend` provides the default backend; for TLS, the
//!   oldest Ingress naming a host provides its Secret.
//! - **Backends**: `service.name` with `service.port.number` or `.name`, resolved to the ready
//!   endpoints (`conditions.ready` unset or true) of the Service's TCP port, at the port of the
//!   same name in each EndpointSlice, both address families. A missing Service or port gives a
//!   target without endpoints (503) and a warning; `resource` backends and malformed paths are
//!   skipped with a warning.
//! - **Our Ingresses**: see [`ClassConfig`].
//!
//! Updates cost O(changed objects): a changed Ingress is recompiled and the hosts it touches are
//! merged again; a changed Service refreshes only the endpoints of the backends that name it; a
//! changed IngressClass (rare) rebuilds everything. The maps are persistent (`imbl`), so cloning
//! a table to publish it is O(1).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use imbl::{HashMap, OrdMap, OrdSet};
use roadkeeper_cluster::k8s_openapi::api::networking::v1::{
    HTTPIngressPath, Ingress, IngressBackend, ServiceBackendPort,
};
use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use roadkeeper_cluster::{Changes, NamespacedName, Store};

use crate::decision::{Decision, Forward, Request};
use crate::{Router, Target};

const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Which Ingresses are ours. An Ingress is ours when its `spec.ingressClassName` names an
/// IngressClass whose `spec.controller` is [`controller`](Self::controller) (or, when no
/// IngressClass of that name exists, when it equals [`name`](Self::name)); else when its legacy
/// `kubernetes.io/ingress.class` annotation equals `name`; else, naming no class at all, when one
/// of our IngressClasses is annotated `ingressclass.kubernetes.io/is-default-class: "true"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassConfig {
    /// Our IngressClass name (default `roadkeeper`).
    pub name: String,
    /// Our controller name (default `roadkeeper.dev/ingress`).
    pub controller: String,
}

impl Default for ClassConfig {
    fn default() -> Self {
        Self { name: "roadkeeper".into(), controller: "roadkeeper.dev/ingress".into() }
    }
}

/// Creation time, then name: the order in which Ingresses win conflicts, oldest first.
type Age = (Option<Time>, NamespacedName);

/// A Service port as a backend names it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PortRef {
    Number(i32),
    Name(String),
}

impl fmt::Display for PortRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(number) => write!(f, "{number}"),
            Self::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// A backend: its resolved target, and what is needed to resolve it again.
#[derive(Clone, Debug, PartialEq)]
struct Backend {
    target: Arc<Target>,
    port: PortRef,
    /// Where it is written (`spec.rules[0].http.paths[1].backend`), for warnings.
    field: String,
}

/// One path of a host.
#[derive(Clone, Debug, PartialEq)]
struct Route {
    /// The path; for `Prefix` without trailing slashes (so `/` is empty).
    path: String,
    exact: bool,
    backend: Backend,
}

/// One Ingress we serve.
#[derive(Clone, Debug, PartialEq)]
struct Compiled {
    age: Age,
    /// Routes per host key (see [`RouteTable`]), in the order of the spec.
    hosts: BTreeMap<String, Vec<Route>>,
    default: Option<Backend>,
    /// `spec.tls[]` as (lowercase host, Secret).
    tls: Vec<(String, NamespacedName)>,
}

/// Host keys to merge again and whether the default backend may have changed, after an update.
#[derive(Default)]
struct Dirty {
    hosts: BTreeSet<String>,
    default: bool,
}

/// An immutable snapshot of the routes of our Ingresses; see the [module](self) for the rules.
/// Clone it (O(1)) and [`apply`](Self::apply) changes to the clone to make the next snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteTable {
    /// The Ingresses we serve.
    ingresses: OrdMap<NamespacedName, Arc<Compiled>>,
    /// Merged routes per host key, most specific path first. Host keys: the lowercase host,
    /// `.foo.com` for `*.foo.com` (a suffix of the hosts it covers, so lookups need no
    /// allocation), and the empty string for rules without a host.
    routes: HashMap<String, Arc<[Route]>>,
    /// The Ingresses with routes for each host key.
    by_host: HashMap<String, OrdSet<Age>>,
    /// The Ingresses with a default backend.
    defaults: OrdSet<Age>,
    /// The default backend in force: the oldest of `defaults`.
    default: Option<Arc<Target>>,
    /// The Ingresses whose backends name each Service.
    by_service: HashMap<NamespacedName, OrdSet<NamespacedName>>,
}

impl RouteTable {
    /// The table of every Ingress of `store` that is ours, and warnings about what could not be
    /// served as written (each names the Ingress and the field).
    pub fn build(store: &Store, class: &ClassConfig) -> (Self, Vec<String>) {
        let mut table = Self::default();
        let ingresses = store.ingresses().map(|(key, _)| key.clone()).collect();
        let warnings = table.update(store, &ingresses, &BTreeSet::new(), class);
        (table, warnings)
    }

    /// Applies `changes` (read from `store`): changed Ingresses are recompiled, changed Services
    /// (or their EndpointSlices) refresh the backends that name them, a changed IngressClass
    /// rebuilds the table. Returns warnings about what was recompiled or refreshed.
    pub fn apply(&mut self, store: &Store, changes: &Changes, class: &ClassConfig) -> Vec<String> {
        if !changes.ingress_classes.is_empty() {
            let (table, warnings) = Self::build(store, class);
            *self = table;
            return warnings;
        }
        self.update(store, &changes.ingresses, &changes.services, class)
    }

    /// `(host, Secret)` for every host of `spec.tls[]` of our Ingresses (`*.foo.com` as written),
    /// the oldest Ingress winning per host, ordered by host.
    pub fn tls_hosts(&self) -> Vec<(String, NamespacedName)> {
        let mut by_age: Vec<&Compiled> = self.ingresses.values().map(|c| &**c).collect();
        by_age.sort_by(|a, b| a.age.cmp(&b.age));
        let mut hosts = BTreeMap::new();
        for (host, secret) in by_age.into_iter().flat_map(|c| &c.tls) {
            hosts.entry(host).or_insert(secret);
        }
        hosts.into_iter().map(|(host, secret)| (host.clone(), secret.clone())).collect()
    }

    /// The Ingresses we serve (whose `status.loadBalancer` is ours to write), ordered by name.
    pub fn ingresses(&self) -> Vec<NamespacedName> {
        self.ingresses.keys().cloned().collect()
    }

    /// Whether we serve Ingress `key` (so its `status.loadBalancer` is ours to write).
    pub fn serves(&self, key: &NamespacedName) -> bool {
        self.ingresses.contains_key(key)
    }

    /// Recompiles the Ingresses `ingresses` and refreshes the backends naming `services`.
    fn update(
        &mut self,
        store: &Store,
        ingresses: &BTreeSet<NamespacedName>,
        services: &BTreeSet<NamespacedName>,
        class: &ClassConfig,
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut dirty = Dirty::default();
        let ownership = Ownership::new(store, class);
        for key in ingresses {
            let ours = store.ingress(key).filter(|ingress| ownership.claims(ingress));
            let compiled = ours.map(|ingress| Arc::new(compile(store, key, ingress, &mut warnings)));
            self.set_ingress(key, compiled, &mut dirty);
        }
        for service in services {
            let users = self.by_service.get(service).cloned().unwrap_or_default();
            for key in users.iter().filter(|key| !ingresses.contains(*key)) {
                let compiled = self.ingresses.get_mut(key).expect("indexed Ingresses exist");
                Arc::make_mut(compiled).refresh(store, service, &mut warnings, &mut dirty);
            }
        }
        self.merge(dirty);
        warnings
    }

    /// Replaces Ingress `key`'s compiled form (`None`: not served).
    fn set_ingress(&mut self, key: &NamespacedName, new: Option<Arc<Compiled>>, dirty: &mut Dirty) {
        if let Some(old) = self.ingresses.remove(key) {
            self.index(key, &old, false, dirty);
        }
        if let Some(new) = new {
            self.index(key, &new, true, dirty);
            self.ingresses.insert(key.clone(), new);
        }
    }

    /// Adds (`add`) or removes an Ingress in the indexes, noting what must be merged again.
    fn index(&mut self, key: &NamespacedName, compiled: &Compiled, add: bool, dirty: &mut Dirty) {
        for host in compiled.hosts.keys() {
            toggle(&mut self.by_host, host.clone(), compiled.age.clone(), add);
            dirty.hosts.insert(host.clone());
        }
        if compiled.default.is_some() {
            if add {
                self.defaults.insert(compiled.age.clone());
            } else {
                self.defaults.remove(&compiled.age);
            }
            dirty.default = true;
        }
        for service in compiled.backends().map(|b| &b.target.service).collect::<BTreeSet<_>>() {
            toggle(&mut self.by_service, service.clone(), key.clone(), add);
        }
    }

    /// Merges the routes of the dirty hosts again, and picks the default backend if needed.
    fn merge(&mut self, dirty: Dirty) {
        for host in dirty.hosts {
            let ages = self.by_host.get(&host).into_iter().flatten();
            let mut routes: Vec<Route> = ages.flat_map(|(_, key)| &self.ingresses[key].hosts[&host]).cloned().collect();
            // Stable: among identical paths the oldest Ingress's comes first, and stays.
            routes.sort_by(|a, b| a.rank().cmp(&b.rank()));
            routes.dedup_by(|later, first| later.rank() == first.rank());
            if routes.is_empty() {
                self.routes.remove(&host);
            } else {
                self.routes.insert(host, routes.into());
            }
        }
        if dirty.default {
            let oldest = self.defaults.get_min().map(|(_, key)| &self.ingresses[key]);
            self.default = oldest.and_then(|c| Some(c.default.as_ref()?.target.clone()));
        }
    }
}

impl Router for RouteTable {
    /// Forwards to [`RouteTable::target`] of the request's host and path, unchanged (Ingress
    /// rules neither rewrite, redirect nor edit headers).
    fn route(&self, request: &Request<'_>) -> Option<Decision> {
        self.target(request.host, request.path).map(|target| Decision::Forward(Forward::to(target)))
    }
}

/// How the route table answered one request, for `roadkeeper trace`.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteExplanation {
    /// The host keys tried, in order (`a.example`, `*.example`, `*` for rules without a host),
    /// each with the number of paths the table has for it.
    pub tried: Vec<(String, usize)>,
    /// What served the request; `None`: nothing (404).
    pub matched: Option<RouteMatch>,
}

/// The rule (or default backend) that served a request.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteMatch {
    /// The Ingress it belongs to.
    pub ingress: NamespacedName,
    /// Where it is written: `spec.rules[0].http.paths[1]`, or `spec.defaultBackend`.
    pub field: String,
    /// The host key it was found under, as in [`RouteExplanation::tried`] (none for the default
    /// backend).
    pub host: Option<String>,
    /// The path and its type (`Exact` or `Prefix`; none for the default backend).
    pub path: Option<(String, &'static str)>,
    /// The backend Service, its port as the backend names it, and its ready endpoints.
    pub service: NamespacedName,
    /// The port as written (`80`, or `"http"`); none for the default backend.
    pub port: Option<String>,
    /// The endpoints a request would be sent to.
    pub endpoints: Vec<SocketAddr>,
}

impl RouteTable {
    /// The target for `host` and `path`: tries the routes of the exact host, then of the wildcard
    /// covering its first label, then of rules without a host, then the default backend. `host`
    /// must be lowercase, without port (and without a trailing dot); `path` (normalised by the
    /// proxy) is compared as given, case-sensitive. What [`Router::route`] answers.
    pub fn target(&self, host: &str, path: &str) -> Option<Arc<Target>> {
        match self.find(host, path) {
            Some((_, route)) => Some(route.backend.target.clone()),
            None => self.default.clone(),
        }
    }

    /// The host keys [`RouteTable::target`] tries for `host`, in order.
    fn host_keys(host: &str) -> impl Iterator<Item = &str> {
        let exact = (!host.is_empty() && !host.starts_with('.')).then_some(host);
        let wildcard = host.find('.').filter(|&dot| dot > 0).map(|dot| &host[dot..]);
        [exact, wildcard, Some("")].into_iter().flatten()
    }

    /// The first route matching `path` under the host keys of `host`, with its key.
    fn find<'a, 'h>(&'a self, host: &'h str, path: &str) -> Option<(&'h str, &'a Route)> {
        Self::host_keys(host)
            .filter_map(|key| Some((key, self.routes.get(key)?)))
            .find_map(|(key, routes)| routes.iter().find(|route| route.matches(path)).map(|route| (key, route)))
    }

    /// How [`RouteTable::target`] answers `host` and `path` (same arguments), step by step.
    pub fn explain(&self, host: &str, path: &str) -> RouteExplanation {
        let shown = |key: &str| match key {
            "" => "*".to_string(),
            wildcard if wildcard.starts_with('.') => format!("*{wildcard}"),
            exact => exact.to_string(),
        };
        let tried =
            Self::host_keys(host).map(|key| (shown(key), self.routes.get(key).map_or(0, |r| r.len()))).collect();
        let matched = match self.find(host, path) {
            Some((key, route)) => Some(RouteMatch {
                ingress: route.backend.target.ingress.clone(),
                field: route.backend.field.trim_end_matches(".backend").to_string(),
                host: Some(shown(key)),
                path: Some(match (route.exact, route.path.as_str()) {
                    (true, path) => (path.to_string(), "Exact"),
                    // Prefix paths are kept without their trailing slash: `/` is empty.
                    (false, "") => ("/".to_string(), "Prefix"),
                    (false, path) => (path.to_string(), "Prefix"),
                }),
                service: route.backend.target.service.clone(),
                port: Some(route.backend.port.to_string()),
                endpoints: route.backend.target.endpoints.to_vec(),
            }),
            None => self.default.as_ref().map(|target| RouteMatch {
                ingress: target.ingress.clone(),
                field: "spec.defaultBackend".into(),
                host: None,
                path: None,
                service: target.service.clone(),
                port: None,
                endpoints: target.endpoints.to_vec(),
            }),
        };
        RouteExplanation { tried, matched }
    }
}

impl Route {
    /// A route for `spec` (written at `field`), or `None` (with a warning) if it cannot be served.
    fn new(
        store: &Store,
        ingress: &NamespacedName,
        field: &str,
        spec: &HTTPIngressPath,
        warnings: &mut Vec<String>,
    ) -> Option<Self> {
        let exact = match spec.path_type.as_str() {
            "Exact" => true,
            "Prefix" | "ImplementationSpecific" => false,
            other => {
                warn(warnings, ingress, format_args!("{field}.pathType"), format_args!("unknown path type {other:?}"));
                return None;
            }
        };
        let path = spec.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
        if !path.starts_with('/') {
            warn(warnings, ingress, format_args!("{field}.path"), format_args!("{path:?} does not start with /"));
            return None;
        }
        let path = if exact { path } else { path.trim_end_matches('/') };
        let backend = Backend::new(store, ingress, format!("{field}.backend"), &spec.backend, warnings)?;
        Some(Self { path: path.to_owned(), exact, backend })
    }

    /// Whether the request path `path` matches.
    fn matches(&self, path: &str) -> bool {
        if self.exact {
            return path == self.path;
        }
        path.strip_prefix(self.path.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Precedence: longer paths first, then `Exact`; equal ranks are the same route.
    fn rank(&self) -> (Reverse<usize>, bool, &str) {
        (Reverse(self.path.len()), !self.exact, &self.path)
    }
}

impl Backend {
    /// The backend `spec` (written at `field`), resolved, or `None` (with a warning) if it is not
    /// a Service backend with a port.
    fn new(
        store: &Store,
        ingress: &NamespacedName,
        field: String,
        spec: &IngressBackend,
        warnings: &mut Vec<String>,
    ) -> Option<Self> {
        let Some(service) = &spec.service else {
            warn(warnings, ingress, &field, "only Service backends are supported");
            return None;
        };
        let port = match &service.port {
            Some(ServiceBackendPort { number: Some(number), .. }) => PortRef::Number(*number),
            Some(ServiceBackendPort { name: Some(name), .. }) => PortRef::Name(name.clone()),
            _ => {
                warn(warnings, ingress, format_args!("{field}.service.port"), "needs a number or a name");
                return None;
            }
        };
        let service = NamespacedName::new(ingress.namespace.as_str(), service.name.as_str());
        let target = Arc::new(Target { ingress: ingress.clone(), service, endpoints: Arc::new([]) });
        let mut backend = Self { target, port, field };
        backend.resolve(store, warnings);
        Some(backend)
    }

    /// Reads the target's endpoints from `store` again.
    fn resolve(&mut self, store: &Store, warnings: &mut Vec<String>) {
        Arc::make_mut(&mut self.target).endpoints = match endpoints(store, &self.target.service, &self.port) {
            Ok(endpoints) => endpoints,
            Err((subfield, message)) => {
                warn(warnings, &self.target.ingress, format_args!("{}{subfield}", self.field), message);
                Arc::new([])
            }
        };
    }
}

impl Compiled {
    /// Every backend, paths first.
    fn backends(&self) -> impl Iterator<Item = &Backend> {
        self.hosts.values().flatten().map(|route| &route.backend).chain(&self.default)
    }

    /// Resolves the backends naming `service` again.
    fn refresh(&mut self, store: &Store, service: &NamespacedName, warnings: &mut Vec<String>, dirty: &mut Dirty) {
        for (host, routes) in &mut self.hosts {
            for route in routes.iter_mut().filter(|route| route.backend.target.service == *service) {
                route.backend.resolve(store, warnings);
                dirty.hosts.insert(host.clone());
            }
        }
        if let Some(backend) = self.default.as_mut().filter(|b| b.target.service == *service) {
            backend.resolve(store, warnings);
            dirty.default = true;
        }
    }
}

/// Compiles Ingress `key`, which is ours.
fn compile(store: &Store, key: &NamespacedName, ingress: &Ingress, warnings: &mut Vec<String>) -> Compiled {
    let age = (ingress.metadata.creation_timestamp.clone(), key.clone());
    let mut compiled = Compiled { age, hosts: BTreeMap::new(), default: None, tls: Vec::new() };
    let Some(spec) = &ingress.spec else { return compiled };
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        let host = host_key(rule.host.as_deref().unwrap_or_default());
        for (j, path) in rule.http.iter().flat_map(|http| &http.paths).enumerate() {
            if let Some(route) = Route::new(store, key, &format!("spec.rules[{i}].http.paths[{j}]"), path, warnings) {
                compiled.hosts.entry(host.clone()).or_default().push(route);
            }
        }
    }
    compiled.default = spec
        .default_backend
        .as_ref()
        .and_then(|backend| Backend::new(store, key, "spec.defaultBackend".into(), backend, warnings));
    for (i, tls) in spec.tls.iter().flatten().enumerate() {
        let Some(secret) = &tls.secret_name else {
            warn(warnings, key, format_args!("spec.tls[{i}].secretName"), "missing: its hosts get no certificate");
            continue;
        };
        let secret = NamespacedName::new(key.namespace.as_str(), secret.as_str());
        compiled.tls.extend(tls.hosts.iter().flatten().map(|host| (host.to_ascii_lowercase(), secret.clone())));
    }
    compiled
}

/// The key of a rule's host in [`RouteTable`]'s maps.
fn host_key(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    match host.strip_prefix('*') {
        Some(suffix) if suffix.starts_with('.') => suffix.to_owned(),
        _ => host,
    }
}

/// The ready endpoints of `service`'s TCP port `port`, sorted; or the field at fault (relative
/// to the backend) and why there are none.
pub(crate) fn endpoints(
    store: &Store,
    key: &NamespacedName,
    port: &PortRef,
) -> Result<Arc<[SocketAddr]>, (&'static str, String)> {
    let service = store.service(key).ok_or_else(|| (".service.name", format!("Service {key} does not exist")))?;
    let ports = service.spec.as_ref().and_then(|spec| spec.ports.as_ref()).into_iter().flatten();
    let service_port = ports
        .filter(|p| is_tcp(p.protocol.as_deref()))
        .find(|p| match port {
            PortRef::Number(number) => p.port == *number,
            PortRef::Name(name) => p.name.as_ref() == Some(name),
        })
        .ok_or_else(|| (".service.port", format!("Service {key} has no TCP port {port}")))?;
    let name = service_port.name.as_deref().unwrap_or_default();
    let mut addresses = Vec::new();
    for slice in store.slices_for(key) {
        let slice_port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == name && is_tcp(p.protocol.as_deref()));
        let Some(number) = slice_port.and_then(|p| u16::try_from(p.port?).ok()) else { continue };
        let ready = slice.endpoints.iter().filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false));
        let ips = ready.flat_map(|e| &e.addresses).filter_map(|address| address.parse::<IpAddr>().ok());
        addresses.extend(ips.map(|ip| SocketAddr::new(ip, number)));
    }
    addresses.sort_unstable();
    addresses.dedup();
    Ok(addresses.into())
}

fn is_tcp(protocol: Option<&str>) -> bool {
    protocol.is_none_or(|p| p == "TCP")
}

/// Which Ingresses are ours, given the IngressClasses of the store ([`ClassConfig`]).
struct Ownership<'a> {
    config: &'a ClassConfig,
    /// Every IngressClass by name: whether its controller is ours.
    classes: BTreeMap<&'a str, bool>,
    /// Whether one of our IngressClasses is the default class.
    default: bool,
}

impl<'a> Ownership<'a> {
    fn new(store: &'a Store, config: &'a ClassConfig) -> Self {
        let mut classes = BTreeMap::new();
        let mut default = false;
        for class in store.ingress_classes() {
            let ours = class.spec.as_ref().and_then(|spec| spec.controller.as_ref()) == Some(&config.controller);
            default |= ours && annotation(&class.metadata, DEFAULT_CLASS_ANNOTATION) == Some("true");
            classes.insert(class.metadata.name.as_deref().unwrap_or_default(), ours);
        }
        Self { config, classes, default }
    }

    fn claims(&self, ingress: &Ingress) -> bool {
        if let Some(name) = ingress.spec.as_ref().and_then(|spec| spec.ingress_class_name.as_deref()) {
            return self.classes.get(name).copied().unwrap_or(name == self.config.name);
        }
        match annotation(&ingress.metadata, LEGACY_CLASS_ANNOTATION) {
            Some(name) => name == self.config.name,
            None => self.default,
        }
    }
}

fn annotation<'a>(metadata: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Inserts `value` into (`add`) or removes it from the set at `map[key]`, dropping empty sets.
fn toggle<K: Hash + Eq + Clone, V: Ord + Clone>(map: &mut HashMap<K, OrdSet<V>>, key: K, value: V, add: bool) {
    let mut set = map.remove(&key).unwrap_or_default();
    if add {
        set.insert(value);
    } else {
        set.remove(&value);
    }
    if !set.is_empty() {
        map.insert(key, set);
    }
}

fn warn(warnings: &mut Vec<String>, ingress: &NamespacedName, field: impl fmt::Display, message: impl fmt::Display) {
    warnings.push(format!("Ingress {ingress}: {field}: {message}"));
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
