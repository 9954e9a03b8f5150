//! A Gateway's listeners, checked: the protocols and route kinds we serve, TLS certificates
//! (across namespaces only with a ReferenceGrant), conflicts between listeners of one port, and
//! the conditions each listener's status gets.

use std::collections::BTreeMap;
use std::sync::Arc;

use roadkeeper_cluster::gateway_api::gateways::{Gateway, GatewayListeners};
use roadkeeper_cluster::{NamespacedName, Store};
use tokio_rustls::rustls::sign::CertifiedKey;

use super::conditions::Condition;
use super::hostname::Hostname;
use super::refs::{self, GROUP, Side};
use super::text;

/// Which namespaces may attach routes to a listener.
#[derive(Clone, Debug, PartialEq)]
pub enum From {
    /// The Gateway's own.
    Same,
    /// Every namespace.
    All,
    /// Namespaces whose labels match.
    Selector(roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector),
}

/// One listener, checked.
#[derive(Clone, Debug)]
pub struct Listener {
    pub name: String,
    pub port: u16,
    pub hostname: Hostname,
    /// HTTPS (TLS terminated here), else HTTP.
    pub tls: bool,
    /// The certificates of an HTTPS listener, first the default one.
    pub certificates: Vec<Arc<CertifiedKey>>,
    pub from: From,
    /// The route kinds it takes (`HTTPRoute`), for `status.listeners[].supportedKinds`.
    pub kinds: Vec<&'static str>,
    /// Whether routes may attach: accepted and not in conflict.
    pub attachable: bool,
    /// Whether it is served: attachable, with its certificates if HTTPS.
    pub served: bool,
    /// Its status conditions.
    pub conditions: Vec<Condition>,
}

impl Listener {
    /// Whether a route of kind `kind` in `namespace` may attach.
    pub fn allows(&self, store: &Store, gateway_namespace: &str, kind: &str, namespace: &str) -> bool {
        self.kinds.contains(&kind)
            && match &self.from {
                From::Same => namespace == gateway_namespace,
                From::All => true,
                From::Selector(selector) => store
                    .namespace(namespace)
                    .and_then(|ns| ns.metadata.labels.as_ref())
                    .is_some_and(|labels| roadkeeper_cluster::selector_matches(selector, labels)),
            }
    }
}

/// The listeners of `gateway` (named `key`), checked.
pub fn check(store: &Store, key: &NamespacedName, gateway: &Gateway) -> Vec<Listener> {
    let mut listeners: Vec<Listener> = gateway.spec.listeners.iter().map(|l| check_one(store, key, l)).collect();
    mark_conflicts(&mut listeners);
    for listener in &mut listeners {
        let holds = |kind: &str| listener.conditions.iter().any(|c| c.kind == kind && c.status);
        listener.attachable = holds("Accepted") && !holds("Conflicted");
        listener.served = listener.attachable && (!listener.tls || !listener.certificates.is_empty());
        let programmed = if listener.served {
            Condition::yes("Programmed", "Programmed", "serving")
        } else {
            Condition::no("Programmed", "Invalid", "not served: see the other conditions")
        };
        listener.conditions.push(programmed);
    }
    listeners
}

fn check_one(store: &Store, key: &NamespacedName, spec: &GatewayListeners) -> Listener {
    let protocol = spec.protocol.as_str();
    let mut listener = Listener {
        name: spec.name.clone(),
        port: u16::try_from(spec.port).unwrap_or_default(),
        hostname: Hostname::parse(spec.hostname.as_deref()),
        tls: protocol == "HTTPS",
        certificates: Vec::new(),
        from: From::Same,
        kinds: Vec::new(),
        attachable: false,
        served: false,
        conditions: Vec::new(),
    };
    if protocol != "HTTP" && protocol != "HTTPS" {
        let message = format!("protocol {protocol} is not supported (HTTP and HTTPS are)");
        listener.conditions.push(Condition::no("Accepted", "UnsupportedProtocol", message));
        listener.conditions.push(Condition::yes("ResolvedRefs", "ResolvedRefs", ""));
        return listener;
    }
    if listener.port == 0 {
        listener.conditions.push(Condition::no(
            "Accepted",
            "PortUnavailable",
            format!("port {} is not usable", spec.port),
        ));
    } else {
        listener.conditions.push(Condition::yes("Accepted", "Accepted", "listener accepted"));
    }
    let mut refs_problem: Option<(&'static str, String)> = None;
    // Route kinds: written, else the protocol's default.
    let allowed = spec.allowed_routes.as_ref();
    match allowed.and_then(|a| a.kinds.as_ref()) {
        None => listener.kinds.push("HTTPRoute"),
        Some(kinds) => {
            for kind in kinds {
                let group = kind.group.as_deref().unwrap_or(GROUP);
                if group == GROUP && kind.kind == "HTTPRoute" {
                    if !listener.kinds.contains(&"HTTPRoute") {
                        listener.kinds.push("HTTPRoute");
                    }
                } else {
                    refs_problem =
                        Some(("InvalidRouteKinds", format!("route kind {}.{group} is not supported", kind.kind)));
                }
            }
        }
    }
    listener.from = match allowed.and_then(|a| a.namespaces.as_ref()) {
        None => From::Same,
        Some(namespaces) => match namespaces.from.as_ref().map(text).as_deref() {
            Some("All") => From::All,
            Some("Selector") => {
                let selector = namespaces.selector.as_ref().and_then(|s| serde_json::to_value(s).ok());
                match selector.and_then(|s| serde_json::from_value(s).ok()) {
                    Some(selector) => From::Selector(selector),
                    None => {
                        refs_problem =
                            Some(("InvalidRouteKinds", "allowedRoutes.namespaces: a Selector needs a selector".into()));
                        From::Same
                    }
                }
            }
            _ => From::Same,
        },
    };
    if listener.tls
        && let Err((reason, message)) = certificates(store, key, spec, &mut listener.certificates)
    {
        // A listener serves all its certificates or none.
        listener.certificates.clear();
        refs_problem.get_or_insert((reason, message));
    }
    listener.conditions.push(match refs_problem {
        None => Condition::yes("ResolvedRefs", "ResolvedRefs", "references resolved"),
        Some((reason, message)) => Condition::no("ResolvedRefs", reason, message),
    });
    listener
}

/// Loads the certificates of HTTPS listener `spec` into `out`.
fn certificates(
    store: &Store,
    gateway: &NamespacedName,
    spec: &GatewayListeners,
    out: &mut Vec<Arc<CertifiedKey>>,
) -> Result<(), (&'static str, String)> {
    let tls = spec.tls.as_ref().ok_or(("InvalidCertificateRef", "an HTTPS listener needs tls".to_owned()))?;
    if tls.mode.as_ref().map(text).is_some_and(|mode| mode != "Terminate") {
        return Err(("InvalidCertificateRef", "only tls.mode Terminate is supported on HTTPS".into()));
    }
    let refs = tls.certificate_refs.as_deref().unwrap_or_default();
    if refs.is_empty() {
        return Err(("InvalidCertificateRef", "no certificateRefs".into()));
    }
    for reference in refs {
        let (group, kind) =
            (reference.group.as_deref().unwrap_or_default(), reference.kind.as_deref().unwrap_or("Secret"));
        if !group.is_empty() || kind != "Secret" {
            return Err(("InvalidCertificateRef", format!("certificateRefs: {kind} is not a Secret")));
        }
        let namespace = reference.namespace.as_deref().unwrap_or(&gateway.namespace);
        let secret = NamespacedName::new(namespace, reference.name.as_str());
        let from = Side { group: GROUP, kind: "Gateway", namespace: &gateway.namespace };
        if !refs::permitted(store, from, Side { group: "", kind: "Secret", namespace }, &reference.name) {
            return Err(("RefNotPermitted", format!("Secret {secret}: no ReferenceGrant allows it")));
        }
        out.push(refs::certificate(store, &secret).map_err(|message| ("InvalidCertificateRef", message))?);
    }
    Ok(())
}

/// Listeners of one port must agree on the protocol and differ in hostname; those that do not
/// are `Conflicted` (all of them: none is served).
fn mark_conflicts(listeners: &mut [Listener]) {
    let mut by_port: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (index, listener) in listeners.iter().enumerate() {
        by_port.entry(listener.port).or_default().push(index);
    }
    let mut conflicts = vec![None; listeners.len()];
    for indexes in by_port.values() {
        for &i in indexes {
            for &j in indexes.iter().filter(|&&j| j != i) {
                let (a, b) = (&listeners[i], &listeners[j]);
                if a.tls != b.tls {
                    conflicts[i] = Some(("ProtocolConflict", format!("port {} has HTTP and HTTPS listeners", a.port)));
                } else if a.hostname == b.hostname && conflicts[i].is_none() {
                    let message = format!("listener {} has the same port and hostname {}", b.name, b.hostname);
                    conflicts[i] = Some(("HostnameConflict", message));
                }
            }
        }
    }
    for (listener, conflict) in listeners.iter_mut().zip(conflicts) {
        listener.conditions.push(match conflict {
            None => Condition::no("Conflicted", "NoConflicts", "no conflicts"),
            Some((reason, message)) => Condition::yes("Conflicted", reason, message),
        });
    }
}
