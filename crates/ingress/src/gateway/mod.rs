//! The Gateway API (v1.6, standard channel) on the Ingress data plane (pure): the GatewayClasses
//! whose `controllerName` is ours, their Gateways (an address each from a pool, HTTP and HTTPS
//! listeners), the HTTPRoutes attached to them and the ReferenceGrants that allow references
//! across namespaces, compiled into what the proxy serves ([`ServeTable`]) and what each
//! object's status must say ([`Statuses`]).
//!
//! - [`listeners`]: a Gateway's listeners checked (protocols, route kinds, certificates,
//!   conflicts); [`addresses`]: a Gateway's address from the pool.
//! - [`httproute`]: one HTTPRoute's matches, filters and weighted backends; [`matching`]: match
//!   tests and precedence; [`filters`]: redirects and rewrites; [`hostname`]: hostnames and their
//!   intersection; [`refs`]: ReferenceGrants, backends and certificates.
//! - [`table`]: the serving snapshot: by local address the Gateway, by port and host the listener,
//!   by host the route rules in order of precedence.
//! - [`conditions`] and [`status`]: the status of GatewayClasses, Gateways and HTTPRoutes.

pub mod addresses;
pub mod conditions;
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
use roadkeeper_cluster::gateway_api::gateways::Gateway;
use roadkeeper_cluster::gateway_api::httproutes::HTTPRoute;
use roadkeeper_cluster::{NamespacedName, Store};
use serde::Serialize;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use self::conditions::Condition;
use self::hostname::{HostMap, Hostname};
use self::httproute::CompiledRoute;
use self::listeners::Listener;
use self::refs::GROUP;
pub use self::status::Statuses;
use self::status::{GatewayStatus, ListenerStatus, ParentStatus, RouteStatus};
pub use self::table::ServeTable;
use self::table::{Port, Rules};

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

/// Everything compiled: what to serve and what to write in statuses.
#[derive(Clone, Debug, Default)]
pub struct Compiled {
    /// What the proxy serves.
    pub serve: ServeTable,
    /// What the statuses must say.
    pub statuses: Statuses,
}

/// A Gateway of ours being compiled: its address, its listeners checked, and the rules of the
/// routes attached to each listener.
type Checked = (Option<IpAddr>, Vec<Listener>, Vec<Rules>);

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

/// Compiles the Gateway API objects of `store` that are ours.
pub fn compile(store: &Store, config: &GatewayConfig) -> Compiled {
    let mut out = Compiled::default();
    let ours = |class: &&Arc<GatewayClass>| class.spec.controller_name == config.controller;
    for class in store.gateway_classes().filter(ours) {
        out.statuses.classes.insert(class.metadata.name.clone().unwrap_or_default(), class.metadata.generation);
    }
    let mut checked = check_gateways(store, config, &mut out.statuses);
    let attached = attach_routes(store, &mut checked, &mut out.statuses);
    for (key, gateway) in checked {
        let status = out.statuses.gateways.get_mut(&key).expect("every checked Gateway has a status");
        if let Some((ip, ports)) = assemble(&key, gateway, &attached, status) {
            out.serve.addresses.insert(ip, Arc::new(ports));
        }
    }
    out
}

/// The Gateways of our classes, oldest first, each with its address and listeners checked and
/// its conditions in `statuses`.
fn check_gateways(store: &Store, config: &GatewayConfig, statuses: &mut Statuses) -> BTreeMap<NamespacedName, Checked> {
    let mut gateways: Vec<(&NamespacedName, &Arc<Gateway>)> = store
        .gateways()
        .filter(|(_, gateway)| statuses.classes.contains_key(&gateway.spec.gateway_class_name))
        .collect();
    gateways.sort_by(|a, b| (&a.1.metadata.creation_timestamp, a.0).cmp(&(&b.1.metadata.creation_timestamp, b.0)));
    let claims: Vec<_> = gateways.iter().map(|(key, gateway)| ((*key).clone(), address_claim(gateway))).collect();
    let mut addresses = addresses::allocate(&config.pool, &claims);
    let mut checked = BTreeMap::new();
    for (key, gateway) in gateways {
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
                Condition::no("Programmed", "AddressNotUsable", format!("{ip} is another Gateway's"))
            }
            Some(Err(addresses::Refused::Unsupported(why))) => {
                Condition::no("Programmed", "AddressNotUsable", why.clone())
            }
            Some(Err(addresses::Refused::Exhausted)) | None => {
                Condition::no("Programmed", "AddressNotAssigned", format!("no free address in {}", config.pool))
            }
        };
        let ip = address.and_then(Result::ok);
        statuses.gateways.insert(
            key.clone(),
            GatewayStatus {
                generation: gateway.metadata.generation,
                addresses: ip.into_iter().collect(),
                conditions: vec![accepted, programmed],
                listeners: Vec::new(),
            },
        );
        let rules = vec![Rules::default(); listeners.len()];
        checked.insert(key.clone(), (ip, listeners, rules));
    }
    checked
}

/// Attaches every HTTPRoute to the listeners of its parents that are ours, writing its status
/// in `statuses`; returns how many routes each listener (Gateway, index) took.
fn attach_routes(
    store: &Store,
    checked: &mut BTreeMap<NamespacedName, Checked>,
    statuses: &mut Statuses,
) -> BTreeMap<(NamespacedName, usize), i32> {
    let mut attached = BTreeMap::new();
    for (key, route) in store.http_routes() {
        let compiled = httproute::compile(store, key, route);
        let mut status = RouteStatus { generation: route.metadata.generation, parents: Vec::new() };
        for parent in route.spec.parent_refs.iter().flatten() {
            let (group, kind) = (parent.group.as_deref().unwrap_or(GROUP), parent.kind.as_deref().unwrap_or("Gateway"));
            if group != GROUP || kind != "Gateway" {
                continue;
            }
            let gateway =
                NamespacedName::new(parent.namespace.as_deref().unwrap_or(&key.namespace), parent.name.as_str());
            let Some((_, listeners, rules)) = checked.get_mut(&gateway) else { continue };
            let mut parent_ref = serde_json::json!({"group": GROUP, "kind": "Gateway", "namespace": gateway.namespace, "name": gateway.name});
            if let Some(section) = &parent.section_name {
                parent_ref["sectionName"] = section.as_str().into();
            }
            if let Some(port) = parent.port {
                parent_ref["port"] = port.into();
            }
            let selection = Selection { gateway: &gateway, section: parent.section_name.as_deref(), port: parent.port };
            let accepted = attach(store, key, route, &selection, listeners, rules, &compiled);
            for index in accepted.as_ref().map(Vec::as_slice).unwrap_or_default() {
                *attached.entry((gateway.clone(), *index)).or_default() += 1;
            }
            let conditions = route_conditions(&compiled, accepted.map(|_| ()));
            status.parents.push(ParentStatus { parent_ref, conditions });
        }
        if !status.parents.is_empty() {
            statuses.routes.insert(key.clone(), status);
        }
    }
    attached
}

/// Gateway `key`'s listeners' status (in `status`), and, if it has an address, what it serves
/// there by port: each served listener's rules sorted by precedence, HTTPS with its
/// certificates.
fn assemble(
    key: &NamespacedName,
    (ip, listeners, rules): Checked,
    attached: &BTreeMap<(NamespacedName, usize), i32>,
    status: &mut GatewayStatus,
) -> Option<(IpAddr, HashMap<u16, Port>)> {
    let mut ports: BTreeMap<u16, PortParts> = BTreeMap::new();
    for (index, (listener, mut rules)) in listeners.into_iter().zip(rules).enumerate() {
        status.listeners.push(ListenerStatus {
            name: listener.name.clone(),
            kinds: listener.kinds.clone(),
            attached: attached.get(&(key.clone(), index)).copied().unwrap_or_default(),
            conditions: listener.conditions.clone(),
        });
        if !listener.served {
            continue;
        }
        for entries in rules.by_host.values_mut() {
            entries.sort_by(|a, b| a.precedence.cmp(&b.precedence));
        }
        let port = ports.entry(listener.port).or_default();
        port.1.insert(&listener.hostname, Arc::new(rules));
        if let Some(first) = listener.certificates.first() {
            port.2.insert(&listener.hostname, first.clone());
            port.0.push(first.clone());
        }
    }
    let ports = ports
        .into_iter()
        .map(|(number, (defaults, listeners, certificates))| {
            let tls = defaults.first().map(|default| {
                crate::tls::server_config(Arc::new(Sni { by_host: certificates, default: default.clone() }))
            });
            (number, Port { tls, listeners })
        })
        .collect();
    Some((ip?, ports))
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

/// Attaches `route` to the listeners of Gateway `gateway` that its parent reference selects
/// (by `sectionName` and `port`) and that take it; returns their indexes, or why none does
/// (the `Accepted` reason and message).
fn attach(
    store: &Store,
    key: &NamespacedName,
    route: &HTTPRoute,
    selection: &Selection<'_>,
    listeners: &[Listener],
    rules: &mut [Rules],
    compiled: &CompiledRoute,
) -> Result<Vec<usize>, (&'static str, String)> {
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
    let mut accepted = Vec::new();
    for index in allowed {
        let served: BTreeSet<Hostname> =
            hostnames.iter().filter_map(|h| listeners[index].hostname.intersect(h)).collect();
        if served.is_empty() {
            continue;
        }
        for hostname in &served {
            rules[index].by_host.entry(hostname).extend(compiled.entries.iter().cloned());
        }
        accepted.push(index);
    }
    if accepted.is_empty() {
        return Err(("NoMatchingListenerHostname", "no listener hostname matches the route's hostnames".into()));
    }
    Ok(accepted)
}

/// A route's conditions for one parent.
fn route_conditions(compiled: &CompiledRoute, accepted: Result<(), (&'static str, String)>) -> Vec<Condition> {
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
