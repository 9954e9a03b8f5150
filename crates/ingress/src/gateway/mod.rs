//! The Gateway API (v1.6, standard channel) on the Ingress data plane (pure): the GatewayClasses
//! whose `controllerName` is ours, their Gateways (an address each from a pool, HTTP and HTTPS
//! listeners), the HTTPRoutes attached to them and the ReferenceGrants that allow references
//! across namespaces, compiled into what the proxy serves ([`ServeTable`]) and what each
//! object's status must say ([`Statuses`]), kept up to date change by change ([`GatewayTable`]).
//!
//! - [`listeners`]: a Gateway's listeners checked (protocols, route kinds, certificates,
//!   conflicts); [`addresses`]: a Gateway's address from the pool.
//! - [`httproute`]: one HTTPRoute's matches, filters and weighted backends ([`duration`]: its
//!   timeouts); [`matching`]: match tests and precedence; [`filters`]: redirects and rewrites;
//!   [`cors`]: the CORS filter;
//!   [`hostname`]: hostnames and their intersection; [`refs`]: ReferenceGrants, backends and
//!   certificates.
//! - [`table`]: the serving snapshot: by local address the Gateway, by port and host the listener,
//!   by host the route rules in order of precedence.
//! - [`conditions`] and [`status`]: the status of GatewayClasses, Gateways and HTTPRoutes.

pub mod addresses;
pub mod conditions;
pub mod cors;
pub mod duration;
pub mod filters;
pub mod hostname;
pub mod httproute;
pub mod listeners;
pub mod matching;
pub mod refs;
pub mod status;
pub mod table;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use roadkeeper_cluster::gateway_api::gatewayclasses::GatewayClass;
use roadkeeper_cluster::gateway_api::gateways::{Gateway, GatewaySpec};
use roadkeeper_cluster::gateway_api::httproutes::HTTPRoute;
use roadkeeper_cluster::{Changes, NamespacedName, Store};
use serde::Serialize;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use self::conditions::Condition;
use self::hostname::{HostMap, Hostname};
use self::httproute::CompiledRoute;
use self::listeners::{From, Listener};
use self::refs::GROUP;
pub use self::status::Statuses;
use self::status::{GatewayStatus, ListenerStatus, ParentStatus, RouteStatus};
pub use self::table::ServeTable;
use self::table::{Entry, Port, Rules};

/// The controller name of our GatewayClasses (default `roadkeeper.dev/gateway`).
pub const DEFAULT_CONTROLLER: &str = "roadkeeper.dev/gateway";

/// What we are: our controller name and the addresses we give Gateways.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayConfig {
    /// GatewayClasses with this `spec.controllerName` are ours.
    pub controller: String,
    /// Gateways get addresses from this range.
    pub pool: IpNet,
}

/// The Gateway API objects that are ours, compiled, and kept between changes so that a change
/// costs what it touches (as [`RouteTable`](crate::RouteTable) does for Ingresses): a changed
/// HTTPRoute, or a Service it names, recompiles that route and merges again the rules of the
/// listener hostnames it was or is on; a GatewayClass, a Gateway's spec or address, a
/// ReferenceGrant, a Secret a listener names or (when a listener selects namespaces by label) a
/// Namespace rebuilds everything.
pub struct GatewayTable {
    config: GatewayConfig,
    /// What the proxy serves; clone it (O(Gateways)) for a snapshot.
    serve: ServeTable,
    /// What the statuses must say.
    statuses: Statuses,
    /// The Gateways of our classes.
    gateways: BTreeMap<NamespacedName, CheckedGateway>,
    /// Every HTTPRoute of the store, compiled, with where it is attached.
    routes: HashMap<NamespacedName, AttachedRoute>,
    /// The routes naming each Service (as a backend or a mirror).
    by_service: BTreeMap<NamespacedName, BTreeSet<NamespacedName>>,
}

/// One Gateway of ours: what it was compiled from, its address, its listeners checked and, by
/// listener and route hostname, the routes attached.
struct CheckedGateway {
    spec: GatewaySpec,
    claim: addresses::Claim,
    ip: Option<IpAddr>,
    listeners: Vec<Listener>,
    routes: Vec<BTreeMap<Hostname, BTreeSet<NamespacedName>>>,
}

/// One HTTPRoute: compiled, the Services it names, the listeners that took it (a listener once
/// per parent reference that selected it) and the rules it has entries in.
struct AttachedRoute {
    compiled: CompiledRoute,
    services: BTreeSet<NamespacedName>,
    listeners: Vec<(NamespacedName, usize)>,
    placements: BTreeSet<Bucket>,
}

/// The rules merged together: those of one route hostname on one listener (Gateway, index).
type Bucket = (NamespacedName, usize, Hostname);

/// Why a parent does not accept a route: the `Accepted` condition's reason and message.
type Refusal = (&'static str, String);

/// The objects whose status a change may have changed, for the status writer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Touched {
    /// GatewayClasses, by name.
    pub classes: BTreeSet<String>,
    pub gateways: BTreeSet<NamespacedName>,
    /// HTTPRoutes, attached or not (those no longer attached lose the parents we wrote).
    pub routes: BTreeSet<NamespacedName>,
}

impl Touched {
    /// Every GatewayClass and Gateway of `statuses` and every HTTPRoute of `store`.
    pub fn all(store: &Store, statuses: &Statuses) -> Self {
        Self {
            classes: statuses.classes.keys().cloned().collect(),
            gateways: statuses.gateways.keys().cloned().collect(),
            routes: store.http_routes().map(|(key, _)| key.clone()).collect(),
        }
    }
}

/// One port of a Gateway being assembled: the first certificate of each HTTPS listener, the
/// listeners' rules by hostname, and the certificates by hostname.
type PortParts = (Vec<Arc<CertifiedKey>>, HostMap<Arc<Rules>>, HostMap<Arc<CertifiedKey>>);

/// The string form of a generated enum (its serde name: `PathPrefix`, `GET`, ...).
fn text<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

impl GatewayTable {
    /// Compiles the Gateway API objects of `store` that are ours.
    pub fn build(store: &Store, config: &GatewayConfig) -> Self {
        Self::compile(store, config, &BTreeMap::new())
    }

    /// Compiles as [`build`](Self::build) does, the addresses `given` on the last compile held by
    /// their Gateways (their statuses may not say so yet, or ever, with `--manifests`).
    fn compile(store: &Store, config: &GatewayConfig, given: &BTreeMap<NamespacedName, IpAddr>) -> Self {
        let mut statuses = Statuses::default();
        let ours = |class: &&Arc<GatewayClass>| class.spec.controller_name == config.controller;
        for class in store.gateway_classes().filter(ours) {
            statuses.classes.insert(class.metadata.name.clone().unwrap_or_default(), class.metadata.generation);
        }
        let gateways = check_gateways(store, config, given, &mut statuses);
        let mut serve = ServeTable::default();
        for gateway in gateways.values() {
            if let Some(ip) = gateway.ip {
                serve.addresses.insert(ip, Arc::new(ports(&gateway.listeners)));
            }
        }
        let mut table = Self {
            config: config.clone(),
            serve,
            statuses,
            gateways,
            routes: HashMap::new(),
            by_service: BTreeMap::new(),
        };
        let (mut dirty, mut touched) = (BTreeSet::new(), BTreeSet::new());
        for (key, _) in store.http_routes() {
            table.set_route(store, key, &mut dirty, &mut touched);
        }
        table.merge(dirty);
        table
    }

    /// Applies `changes` (read from `store`); returns the objects whose status may have changed.
    pub fn apply(&mut self, store: &Store, changes: &Changes) -> Touched {
        if self.needs_rebuild(store, changes) {
            let given = self.gateways.iter().filter_map(|(key, gateway)| Some((key.clone(), gateway.ip?))).collect();
            *self = Self::compile(store, &self.config, &given);
            return Touched::all(store, &self.statuses);
        }
        let mut touched = Touched {
            classes: changes
                .gateway_classes
                .iter()
                .filter(|c| self.statuses.classes.contains_key(*c))
                .cloned()
                .collect(),
            gateways: changes.gateways.iter().filter(|g| self.gateways.contains_key(*g)).cloned().collect(),
            routes: changes.http_routes.clone(),
        };
        for service in &changes.services {
            touched.routes.extend(self.by_service.get(service).into_iter().flatten().cloned());
        }
        let mut dirty = BTreeSet::new();
        for key in &touched.routes {
            self.set_route(store, key, &mut dirty, &mut touched.gateways);
        }
        self.merge(dirty);
        touched
    }

    /// What the proxy serves.
    pub fn serve(&self) -> &ServeTable {
        &self.serve
    }

    /// What the statuses of our objects must say.
    pub fn statuses(&self) -> &Statuses {
        &self.statuses
    }

    /// Whether `changes` touch what every route depends on: our GatewayClasses, a Gateway's spec
    /// or address, ReferenceGrants, a listener's Secret or a Namespace a listener selects by label.
    fn needs_rebuild(&self, store: &Store, changes: &Changes) -> bool {
        // Ours now (with its generation) against ours when compiled: a status write changes neither.
        let class_changed = changes.gateway_classes.iter().any(|name| {
            let now = store.gateway_class(name).filter(|class| class.spec.controller_name == self.config.controller);
            now.map(|class| &class.metadata.generation) != self.statuses.classes.get(name)
        });
        let gateway_changed = changes.gateways.iter().any(|key| {
            let now = store.gateway(key).filter(|g| self.statuses.classes.contains_key(&g.spec.gateway_class_name));
            match (now, self.gateways.get(key)) {
                (None, None) => false,
                (Some(now), Some(was)) => {
                    // A status that says the address we gave it (our own write) changes nothing.
                    let claim = address_claim(now);
                    let given: Vec<String> = was.ip.iter().map(IpAddr::to_string).collect();
                    now.spec != was.spec
                        || claim.requested != was.claim.requested
                        || (claim.current != was.claim.current && claim.current != given)
                }
                _ => true,
            }
        });
        let names_secret = |secret: &NamespacedName| {
            self.gateways.iter().any(|(key, gateway)| {
                let refs = gateway.spec.listeners.iter().filter_map(|l| l.tls.as_ref()?.certificate_refs.as_ref());
                refs.flatten().any(|r| {
                    r.name == secret.name && r.namespace.as_deref().unwrap_or(&key.namespace) == secret.namespace
                })
            })
        };
        let selects_namespaces = || {
            let listeners = self.gateways.values().flat_map(|g| &g.listeners);
            listeners.into_iter().any(|l| matches!(l.from, From::Selector(_)))
        };
        class_changed
            || gateway_changed
            || !changes.reference_grants.is_empty()
            || changes.secrets.iter().any(names_secret)
            || (!changes.namespaces.is_empty() && selects_namespaces())
    }

    /// Compiles route `key` again (or drops it, gone from `store`) and attaches it where it
    /// belongs: notes the rules to merge again in `dirty` and the Gateways whose attached-route
    /// counts changed in `gateways`.
    fn set_route(
        &mut self,
        store: &Store,
        key: &NamespacedName,
        dirty: &mut BTreeSet<Bucket>,
        gateways: &mut BTreeSet<NamespacedName>,
    ) {
        if let Some(old) = self.routes.remove(key) {
            for bucket in old.placements {
                if let Some(hosts) = self.gateways.get_mut(&bucket.0).map(|g| &mut g.routes[bucket.1]) {
                    toggle(hosts, bucket.2.clone(), key, false);
                }
                dirty.insert(bucket);
            }
            for (gateway, index) in old.listeners {
                self.count(&gateway, index, -1);
                gateways.insert(gateway);
            }
            for service in old.services {
                toggle(&mut self.by_service, service, key, false);
            }
            self.statuses.routes.remove(key);
        }
        let Some(route) = store.http_route(key) else { return };
        let compiled = httproute::compile(store, key, route);
        let mut attached = AttachedRoute {
            services: httproute::services(key, route),
            compiled,
            listeners: Vec::new(),
            placements: BTreeSet::new(),
        };
        let mut status = RouteStatus { generation: route.metadata.generation, parents: Vec::new() };
        for parent in route.spec.parent_refs.iter().flatten() {
            let (group, kind) = (parent.group.as_deref().unwrap_or(GROUP), parent.kind.as_deref().unwrap_or("Gateway"));
            if group != GROUP || kind != "Gateway" {
                continue;
            }
            let gateway =
                NamespacedName::new(parent.namespace.as_deref().unwrap_or(&key.namespace), parent.name.as_str());
            let Some(checked) = self.gateways.get(&gateway) else { continue };
            let mut parent_ref = serde_json::json!({"group": GROUP, "kind": "Gateway", "namespace": gateway.namespace, "name": gateway.name});
            if let Some(section) = &parent.section_name {
                parent_ref["sectionName"] = section.as_str().into();
            }
            if let Some(port) = parent.port {
                parent_ref["port"] = port.into();
            }
            let selection = Selection { gateway: &gateway, section: parent.section_name.as_deref(), port: parent.port };
            let accepted = attach(store, key, route, &selection, &checked.listeners, &attached.compiled);
            for (index, hostnames) in accepted.iter().flatten() {
                attached.listeners.push((gateway.clone(), *index));
                attached.placements.extend(hostnames.iter().map(|h| (gateway.clone(), *index, h.clone())));
            }
            let conditions = route_conditions(&attached.compiled, accepted.map(|_| ()));
            status.parents.push(ParentStatus { parent_ref, conditions });
        }
        for (gateway, index, hostname) in &attached.placements {
            let hosts = &mut self.gateways.get_mut(gateway).expect("attached to a checked Gateway").routes[*index];
            toggle(hosts, hostname.clone(), key, true);
            dirty.insert((gateway.clone(), *index, hostname.clone()));
        }
        for (gateway, index) in &attached.listeners {
            self.count(gateway, *index, 1);
            gateways.insert(gateway.clone());
        }
        for service in &attached.services {
            toggle(&mut self.by_service, service.clone(), key, true);
        }
        if !status.parents.is_empty() {
            self.statuses.routes.insert(key.clone(), status);
        }
        self.routes.insert(key.clone(), attached);
    }

    /// Adds `delta` to the attached-route count of listener `index` of `gateway`.
    fn count(&mut self, gateway: &NamespacedName, index: usize, delta: i32) {
        if let Some(listener) = self.statuses.gateways.get_mut(gateway).and_then(|s| s.listeners.get_mut(index)) {
            listener.attached += delta;
        }
    }

    /// Merges the rules of each `dirty` bucket again, sorted by precedence, into what is served.
    fn merge(&mut self, dirty: BTreeSet<Bucket>) {
        for (gateway, index, hostname) in dirty {
            let Some(checked) = self.gateways.get(&gateway) else { continue };
            let listener = &checked.listeners[index];
            if !listener.served {
                continue;
            }
            let Some(ports) = checked.ip.and_then(|ip| self.serve.addresses.get_mut(&ip)) else { continue };
            let Some(port) = Arc::make_mut(ports).get_mut(&listener.port) else { continue };
            let keys = checked.routes[index].get(&hostname).into_iter().flatten();
            let mut entries: Vec<Entry> =
                keys.flat_map(|key| self.routes[key].compiled.entries.iter().cloned()).collect();
            entries.sort_by(|a, b| a.precedence.cmp(&b.precedence));
            let rules = Arc::make_mut(port.listeners.entry(&listener.hostname));
            if entries.is_empty() {
                rules.by_host.remove(&hostname);
            } else {
                rules.by_host.insert(&hostname, entries.into());
            }
        }
    }
}

/// Adds (`add`) or removes `key` in the set of `index` in `map`, dropping sets left empty.
fn toggle<K: Ord>(map: &mut BTreeMap<K, BTreeSet<NamespacedName>>, index: K, key: &NamespacedName, add: bool) {
    if add {
        map.entry(index).or_default().insert(key.clone());
    } else if let Some(set) = map.get_mut(&index) {
        set.remove(key);
        if set.is_empty() {
            map.remove(&index);
        }
    }
}

/// The Gateways of our classes, oldest first, each with its address (those `given` before held)
/// and listeners checked and its conditions in `statuses` (no routes attached yet).
fn check_gateways(
    store: &Store,
    config: &GatewayConfig,
    given: &BTreeMap<NamespacedName, IpAddr>,
    statuses: &mut Statuses,
) -> BTreeMap<NamespacedName, CheckedGateway> {
    let mut gateways: Vec<(&NamespacedName, &Arc<Gateway>)> = store
        .gateways()
        .filter(|(_, gateway)| statuses.classes.contains_key(&gateway.spec.gateway_class_name))
        .collect();
    gateways.sort_by(|a, b| (&a.1.metadata.creation_timestamp, a.0).cmp(&(&b.1.metadata.creation_timestamp, b.0)));
    let claims: Vec<_> = gateways.iter().map(|(key, gateway)| ((*key).clone(), address_claim(gateway))).collect();
    let mut addresses = addresses::allocate(&config.pool, &claims, given);
    let mut checked = BTreeMap::new();
    for ((key, gateway), (_, claim)) in gateways.into_iter().zip(claims) {
        let listeners = listeners::check(store, key, gateway);
        let address = addresses.remove(key);
        let valid = listeners.iter().filter(|l| l.attachable).count();
        let accepted = match (&address, valid == listeners.len(), valid > 0) {
            (Some(Err(addresses::Refused::Unsupported(why))), _, _) => {
                Condition::no("Accepted", "UnsupportedAddress", why.clone())
            }
            (_, true, _) => Condition::yes("Accepted", "Accepted", "Gateway accepted"),
            (_, false, true) => Condition::yes("Accepted", "ListenersNotValid", "some listeners are not valid"),
            (_, false, false) => Condition::no("Accepted", "ListenersNotValid", "no listener is valid"),
        };
        let programmed = match &address {
            Some(Ok(ip)) => Condition::yes("Programmed", "Programmed", format!("serving on {ip}")),
            Some(Err(addresses::Refused::Taken(ip))) => {
                Condition::no("Programmed", "AddressNotUsable", format!("{ip} is held by another Gateway"))
            }
            Some(Err(addresses::Refused::Unsupported(why))) => {
                Condition::no("Programmed", "AddressNotUsable", why.clone())
            }
            Some(Err(addresses::Refused::Exhausted)) | None => {
                Condition::no("Programmed", "AddressNotAssigned", format!("no free address in {}", config.pool))
            }
        };
        let ip = address.and_then(Result::ok);
        let listener_statuses = listeners
            .iter()
            .map(|listener| ListenerStatus {
                name: listener.name.clone(),
                kinds: listener.kinds.clone(),
                attached: 0,
                conditions: listener.conditions.clone(),
            })
            .collect();
        statuses.gateways.insert(
            key.clone(),
            GatewayStatus {
                generation: gateway.metadata.generation,
                addresses: ip.into_iter().collect(),
                conditions: vec![accepted, programmed],
                listeners: listener_statuses,
            },
        );
        let routes = vec![BTreeMap::new(); listeners.len()];
        checked.insert(key.clone(), CheckedGateway { spec: gateway.spec.clone(), claim, ip, listeners, routes });
    }
    checked
}

/// What a Gateway with `listeners` serves by port, before routes attach: each served listener
/// with no rules, HTTPS with its certificates.
fn ports(listeners: &[Listener]) -> std::collections::HashMap<u16, Port> {
    let mut ports: BTreeMap<u16, PortParts> = BTreeMap::new();
    for listener in listeners.iter().filter(|listener| listener.served) {
        let port = ports.entry(listener.port).or_default();
        port.1.insert(&listener.hostname, Arc::default());
        if let Some(first) = listener.certificates.first() {
            port.2.insert(&listener.hostname, first.clone());
            port.0.push(first.clone());
        }
    }
    ports
        .into_iter()
        .map(|(number, (defaults, listeners, certificates))| {
            let tls = defaults.first().map(|default| {
                crate::tls::server_config(Arc::new(Sni { by_host: certificates, default: default.clone() }))
            });
            (number, Port { tls, listeners })
        })
        .collect()
}

/// The address a Gateway asks for and the one it has.
fn address_claim(gateway: &Gateway) -> addresses::Claim {
    let requested = gateway.spec.addresses.iter().flatten();
    let current = gateway.status.as_ref().and_then(|s| s.addresses.as_ref()).into_iter().flatten();
    addresses::Claim {
        requested: requested
            .filter(|a| a.r#type.as_deref().is_none_or(|t| t == "IPAddress"))
            .filter_map(|a| a.value.clone())
            .collect(),
        current: current.map(|a| a.value.clone()).collect(),
    }
}

/// What one parent reference selects: a Gateway, and of it the listener named `section` and the
/// listeners on `port`, when given.
#[derive(Clone, Copy)]
struct Selection<'a> {
    gateway: &'a NamespacedName,
    section: Option<&'a str>,
    port: Option<i32>,
}

/// The listeners of Gateway `gateway` that `route`'s parent reference selects (by `sectionName`
/// and `port`) and that take it, each with the route hostnames it serves there; or why none does
/// (the `Accepted` reason and message).
fn attach(
    store: &Store,
    key: &NamespacedName,
    route: &HTTPRoute,
    selection: &Selection<'_>,
    listeners: &[Listener],
    compiled: &CompiledRoute,
) -> Result<Vec<(usize, BTreeSet<Hostname>)>, Refusal> {
    let Selection { gateway, section, port } = *selection;
    if let Some(why) = &compiled.unsupported {
        return Err(("UnsupportedValue", why.clone()));
    }
    let selected: Vec<usize> = (0..listeners.len())
        .filter(|&i| section.is_none_or(|s| listeners[i].name == s))
        .filter(|&i| port.is_none_or(|p| i32::from(listeners[i].port) == p))
        .collect();
    if selected.is_empty() {
        return Err(("NoMatchingParent", format!("Gateway {gateway} has no such listener")));
    }
    let allowed: Vec<usize> = selected
        .into_iter()
        .filter(|&i| {
            listeners[i].attachable && listeners[i].allows(store, &gateway.namespace, "HTTPRoute", &key.namespace)
        })
        .collect();
    if allowed.is_empty() {
        return Err(("NotAllowedByListeners", format!("no listener of Gateway {gateway} allows this route")));
    }
    let hostnames: Vec<Hostname> = match route.spec.hostnames.as_deref() {
        None | Some([]) => vec![Hostname::Any],
        Some(names) => names.iter().map(|n| Hostname::parse(Some(n))).collect(),
    };
    let accepted: Vec<(usize, BTreeSet<Hostname>)> = allowed
        .into_iter()
        .map(|index| (index, hostnames.iter().filter_map(|h| listeners[index].hostname.intersect(h)).collect()))
        .filter(|(_, served): &(usize, BTreeSet<Hostname>)| !served.is_empty())
        .collect();
    if accepted.is_empty() {
        return Err(("NoMatchingListenerHostname", "no listener hostname matches the route's hostnames".into()));
    }
    Ok(accepted)
}

/// A route's conditions for one parent.
fn route_conditions(compiled: &CompiledRoute, accepted: Result<(), Refusal>) -> Vec<Condition> {
    let accepted = match accepted {
        Ok(()) => Condition::yes("Accepted", "Accepted", "route accepted"),
        Err((reason, message)) => Condition::no("Accepted", reason, message),
    };
    let resolved = match &compiled.unresolved {
        None => Condition::yes("ResolvedRefs", "ResolvedRefs", "references resolved"),
        Some(error) => Condition::no("ResolvedRefs", error.reason(), error.message()),
    };
    vec![accepted, resolved]
}

/// The certificates of one HTTPS port: by SNI among its listeners' hostnames, else the first
/// listener's.
#[derive(Debug)]
struct Sni {
    by_host: HostMap<Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl ResolvesServerCert for Sni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name().map(str::to_ascii_lowercase);
        Some(name.and_then(|name| self.by_host.get(&name).cloned()).unwrap_or_else(|| self.default.clone()))
    }
}

#[cfg(test)]
#[path = "compile_tests.rs"]
mod compile_tests;
