//! The Gateway API kinds, checked as their CRDs' schemas and rules check them where that is cheap:
//! names, hostnames, ports, protocols, references, paths, header names, list sizes, and filters
//! that set what their type names. CRD defaults are taken as set (a manifest's objects lack them).

use std::collections::BTreeSet;

use serde::Serialize;

use super::{Errors, INVALID_PATH_SEQUENCES, INVALID_PATH_SUFFIXES};
use crate::formats::{self, Check};
use crate::gateway_api::gatewayclasses::GatewayClass;
use crate::gateway_api::gateways::{Gateway, GatewayListeners, GatewayListenersTlsMode};
use crate::gateway_api::grpcroutes::{
    GRPCRoute, GRPCRouteRules, GRPCRouteRulesBackendRefsFilters, GRPCRouteRulesFilters, GRPCRouteRulesMatchesMethod,
    GRPCRouteRulesMatchesMethodType,
};
use crate::gateway_api::httproutes::{
    HTTPRoute, HTTPRouteRules, HTTPRouteRulesBackendRefsFilters, HTTPRouteRulesFilters, HTTPRouteRulesMatches,
    HTTPRouteRulesMatchesPathType,
};
use crate::gateway_api::referencegrants::ReferenceGrant;

/// Longest object name, group, hostname and section name.
const NAME_MAX: usize = 253;
/// Longest kind.
const KIND_MAX: usize = 63;
/// Longest path (match value, replacement).
const PATH_MAX: usize = 1024;
/// Most matches of all the rules of a route together.
const ROUTE_MATCHES_MAX: usize = 128;
/// The `type` of a route filter and the field that holds its settings.
const FILTER_FIELDS: [(&str, &str); 7] = [
    ("RequestHeaderModifier", "requestHeaderModifier"),
    ("ResponseHeaderModifier", "responseHeaderModifier"),
    ("RequestMirror", "requestMirror"),
    ("RequestRedirect", "requestRedirect"),
    ("URLRewrite", "urlRewrite"),
    ("ExtensionRef", "extensionRef"),
    ("CORS", "cors"),
];

/// A [`HeaderModifier`] of a header modifier filter's settings `$m`.
macro_rules! headers {
    ($m:expr) => {
        HeaderModifier {
            add: $m.add.iter().flatten().map(|h| (h.name.as_str(), h.value.as_str())).collect(),
            set: $m.set.iter().flatten().map(|h| (h.name.as_str(), h.value.as_str())).collect(),
            remove: $m.remove.as_deref().unwrap_or_default(),
        }
    };
}

/// A [`Backend`] of a route's backend reference `$b` (of any of the routes' alike types).
macro_rules! backend {
    ($b:expr) => {
        Backend {
            group: $b.group.as_deref(),
            kind: $b.kind.as_deref(),
            name: &$b.name,
            namespace: $b.namespace.as_deref(),
            port: $b.port,
        }
    };
}

/// A [`Mirror`] of a RequestMirror filter's settings `$m`.
macro_rules! mirror {
    ($m:expr) => {
        Mirror {
            backend: backend!($m.backend_ref),
            percent: $m.percent,
            fraction: $m.fraction.as_ref().map(|f| (f.numerator, f.denominator.unwrap_or(100))),
        }
    };
}

pub(super) fn gateway_class(v: &mut Errors, class: &GatewayClass) {
    let spec = &class.spec;
    let controller = &spec.controller_name;
    v.check("spec.controllerName", controller, formats::domain_prefixed_path(controller, NAME_MAX));
    if let Some(description) = spec.description.as_deref().filter(|d| d.chars().count() > 64) {
        v.push("spec.description", format!("{description:?} must be no more than 64 characters"));
    }
    if let Some(p) = &spec.parameters_ref {
        let at = "spec.parametersRef";
        reference(v, at, Some(&p.group), Some(&p.kind), Some(&p.name), p.namespace.as_deref());
    }
}

pub(super) fn gateway(v: &mut Errors, gateway: &Gateway) {
    let spec = &gateway.spec;
    object_name(v, "spec.gatewayClassName", &spec.gateway_class_name);
    items(v, "spec.listeners", spec.listeners.len(), 1, 64);
    let mut names = BTreeSet::new();
    let mut endpoints = BTreeSet::new();
    for (i, l) in spec.listeners.iter().enumerate() {
        let at = format!("spec.listeners[{i}]");
        listener(v, &at, l);
        if !names.insert(&l.name) {
            v.push(&format!("{at}.name"), format!("duplicate listener name {:?}", l.name));
        }
        if !endpoints.insert((l.port, &l.protocol, l.hostname.as_deref())) {
            v.push(&at, "the combination of port, protocol and hostname must be unique".into());
        }
    }
    let addresses = spec.addresses.as_deref().unwrap_or_default();
    items(v, "spec.addresses", addresses.len(), 0, 16);
    for (i, address) in addresses.iter().enumerate() {
        if let (Some("Hostname"), Some(value)) = (address.r#type.as_deref(), &address.value) {
            hostname(v, &format!("spec.addresses[{i}].value"), value);
        }
    }
}

fn listener(v: &mut Errors, at: &str, l: &GatewayListeners) {
    v.format(&format!("{at}.name"), &l.name, formats::dns1123_subdomain);
    v.port(&format!("{at}.port"), l.port);
    v.format(&format!("{at}.protocol"), &l.protocol, protocol);
    if let Some(host) = &l.hostname {
        hostname(v, &format!("{at}.hostname"), host);
    }
    let protocol = l.protocol.as_str();
    if matches!(protocol, "TCP" | "UDP") && l.hostname.as_deref().is_some_and(|h| !h.is_empty()) {
        v.push(&format!("{at}.hostname"), format!("must not be set for protocol {protocol}"));
    }
    let Some(tls) = &l.tls else {
        if protocol == "TLS" {
            v.push(&format!("{at}.tls"), "is required for protocol TLS".into());
        }
        return;
    };
    let terminate = tls.mode != Some(GatewayListenersTlsMode::Passthrough);
    match protocol {
        "HTTP" | "TCP" | "UDP" => v.push(&format!("{at}.tls"), format!("must not be set for protocol {protocol}")),
        "HTTPS" if !terminate => v.push(&format!("{at}.tls.mode"), "must be Terminate for protocol HTTPS".into()),
        _ => {}
    }
    let refs = tls.certificate_refs.as_deref().unwrap_or_default();
    if terminate && refs.is_empty() && tls.options.as_ref().is_none_or(|o| o.is_empty()) {
        v.push(
            &format!("{at}.tls.certificateRefs"),
            "certificateRefs or options are required for mode Terminate".into(),
        );
    }
    items(v, &format!("{at}.tls.certificateRefs"), refs.len(), 0, 64);
    for (i, r) in refs.iter().enumerate() {
        let at = format!("{at}.tls.certificateRefs[{i}]");
        reference(v, &at, r.group.as_deref(), r.kind.as_deref(), Some(&r.name), r.namespace.as_deref());
    }
    let kinds = l.allowed_routes.as_ref().and_then(|a| a.kinds.as_deref()).unwrap_or_default();
    items(v, &format!("{at}.allowedRoutes.kinds"), kinds.len(), 0, 8);
    for (i, k) in kinds.iter().enumerate() {
        reference(v, &format!("{at}.allowedRoutes.kinds[{i}]"), k.group.as_deref(), Some(&k.kind), None, None);
    }
}

pub(super) fn http_route(v: &mut Errors, route: &HTTPRoute) {
    let spec = &route.spec;
    let parents = spec.parent_refs.as_deref().unwrap_or_default();
    items(v, "spec.parentRefs", parents.len(), 0, 32);
    for (i, p) in parents.iter().enumerate() {
        let at = format!("spec.parentRefs[{i}]");
        reference(v, &at, p.group.as_deref(), p.kind.as_deref(), Some(&p.name), p.namespace.as_deref());
        parent_target(v, &at, p.port, p.section_name.as_deref());
    }
    hostnames(v, spec.hostnames.as_deref());
    let rules = spec.rules.as_deref();
    items(v, "spec.rules", rules.map_or(1, <[_]>::len), 1, 16);
    let matches = rules.into_iter().flatten().map(|r| r.matches.as_ref().map_or(1, Vec::len));
    route_matches(v, matches.sum());
    for (i, rule) in rules.into_iter().flatten().enumerate() {
        http_rule(v, &format!("spec.rules[{i}]"), rule);
    }
}

fn http_rule(v: &mut Errors, at: &str, rule: &HTTPRouteRules) {
    if let Some(name) = &rule.name {
        v.format(&format!("{at}.name"), name, formats::dns1123_subdomain);
    }
    let matches = rule.matches.as_deref().unwrap_or_default();
    items(v, &format!("{at}.matches"), matches.len(), 0, 64);
    for (i, m) in matches.iter().enumerate() {
        http_match(v, &format!("{at}.matches[{i}]"), m);
    }
    let filters = rule.filters.as_deref().unwrap_or_default();
    items(v, &format!("{at}.filters"), filters.len(), 0, 16);
    for (i, f) in filters.iter().enumerate() {
        http_rule_filter(v, &format!("{at}.filters[{i}]"), f);
    }
    let backends = rule.backend_refs.as_deref().unwrap_or_default();
    items(v, &format!("{at}.backendRefs"), backends.len(), 0, 16);
    if !backends.is_empty() && filters.iter().any(|f| f.request_redirect.is_some()) {
        v.push(&format!("{at}.filters"), "a RequestRedirect filter may not be used with backendRefs".into());
    }
    for (i, b) in backends.iter().enumerate() {
        let at = format!("{at}.backendRefs[{i}]");
        backend_ref(v, &at, backend!(b), b.weight);
        for (j, f) in b.filters.iter().flatten().enumerate() {
            http_backend_filter(v, &format!("{at}.filters[{j}]"), f);
        }
    }
    // A prefix can only be replaced where the rule matches one prefix (as by default).
    let replaces_prefix = filters.iter().any(http_rule_filter_replaces_prefix)
        || backends.iter().flat_map(|b| b.filters.iter().flatten()).any(http_backend_filter_replaces_prefix);
    let one_prefix = match rule.matches.as_deref() {
        None => true,
        Some([only]) => only
            .path
            .as_ref()
            .is_none_or(|p| p.r#type.as_ref().is_none_or(|t| *t == HTTPRouteRulesMatchesPathType::PathPrefix)),
        _ => false,
    };
    if replaces_prefix && !one_prefix {
        v.push(&format!("{at}.matches"), "ReplacePrefixMatch needs exactly one match, of type PathPrefix".into());
    }
}

fn http_match(v: &mut Errors, at: &str, m: &HTTPRouteRulesMatches) {
    if let Some(path) = &m.path {
        let value = path.value.as_deref().unwrap_or("/");
        let field = format!("{at}.path.value");
        if value.len() > PATH_MAX {
            v.push(&field, format!("must be no more than {PATH_MAX} characters"));
        } else if path.r#type != Some(HTTPRouteRulesMatchesPathType::RegularExpression) {
            v.format(&field, value, match_path);
        }
    }
    for (i, h) in m.headers.iter().flatten().enumerate() {
        header(v, &format!("{at}.headers[{i}]"), &h.name, &h.value, 4096);
    }
    for (i, q) in m.query_params.iter().flatten().enumerate() {
        header(v, &format!("{at}.queryParams[{i}]"), &q.name, &q.value, PATH_MAX);
    }
}

/// `fn $name(v, at, filter: &$type)`, which checks one filter of an HTTPRoute, and
/// `fn $replaces_prefix(&$type)`, whether it replaces the matched prefix: a rule's filters and
/// a backend's are alike but distinct types.
macro_rules! http_filter {
    ($name:ident, $replaces_prefix:ident, $type:ty) => {
        fn $name(v: &mut Errors, at: &str, f: &$type) {
            let set = [
                f.request_header_modifier.is_some(),
                f.response_header_modifier.is_some(),
                f.request_mirror.is_some(),
                f.request_redirect.is_some(),
                f.url_rewrite.is_some(),
                f.extension_ref.is_some(),
                f.cors.is_some(),
            ];
            filter_fields(v, at, &json_name(&f.r#type), set);
            if let Some(m) = &f.request_header_modifier {
                header_modifier(v, &format!("{at}.requestHeaderModifier"), headers!(m));
            }
            if let Some(m) = &f.response_header_modifier {
                header_modifier(v, &format!("{at}.responseHeaderModifier"), headers!(m));
            }
            if let Some(m) = &f.request_mirror {
                mirror(v, &format!("{at}.requestMirror"), mirror!(m));
            }
            if let Some(r) = &f.request_redirect {
                let at = format!("{at}.requestRedirect");
                if let Some(host) = &r.hostname {
                    v.format(&format!("{at}.hostname"), host, formats::dns1123_subdomain);
                }
                if let Some(port) = r.port {
                    v.port(&format!("{at}.port"), port);
                }
                if let Some(p) = &r.path {
                    path_modifier(v, &at, &json_name(&p.r#type), [&p.replace_full_path, &p.replace_prefix_match]);
                }
            }
            if let Some(r) = &f.url_rewrite {
                let at = format!("{at}.urlRewrite");
                if let Some(host) = &r.hostname {
                    v.format(&format!("{at}.hostname"), host, formats::dns1123_subdomain);
                }
                if let Some(p) = &r.path {
                    path_modifier(v, &at, &json_name(&p.r#type), [&p.replace_full_path, &p.replace_prefix_match]);
                }
            }
            if let Some(e) = &f.extension_ref {
                reference(v, &format!("{at}.extensionRef"), Some(&e.group), Some(&e.kind), Some(&e.name), None);
            }
        }

        fn $replaces_prefix(f: &$type) -> bool {
            let redirect = f.request_redirect.as_ref().and_then(|r| r.path.as_ref()).map(|p| json_name(&p.r#type));
            let rewrite = f.url_rewrite.as_ref().and_then(|r| r.path.as_ref()).map(|p| json_name(&p.r#type));
            [redirect, rewrite].into_iter().flatten().any(|t| t == "ReplacePrefixMatch")
        }
    };
}

http_filter!(http_rule_filter, http_rule_filter_replaces_prefix, HTTPRouteRulesFilters);
http_filter!(http_backend_filter, http_backend_filter_replaces_prefix, HTTPRouteRulesBackendRefsFilters);

pub(super) fn grpc_route(v: &mut Errors, route: &GRPCRoute) {
    let spec = &route.spec;
    let parents = spec.parent_refs.as_deref().unwrap_or_default();
    items(v, "spec.parentRefs", parents.len(), 0, 32);
    for (i, p) in parents.iter().enumerate() {
        let at = format!("spec.parentRefs[{i}]");
        reference(v, &at, p.group.as_deref(), p.kind.as_deref(), Some(&p.name), p.namespace.as_deref());
        parent_target(v, &at, p.port, p.section_name.as_deref());
    }
    hostnames(v, spec.hostnames.as_deref());
    let rules = spec.rules.as_deref().unwrap_or_default();
    items(v, "spec.rules", rules.len(), 0, 16);
    route_matches(v, rules.iter().map(|r| r.matches.as_ref().map_or(0, Vec::len)).sum());
    for (i, rule) in rules.iter().enumerate() {
        grpc_rule(v, &format!("spec.rules[{i}]"), rule);
    }
}

fn grpc_rule(v: &mut Errors, at: &str, rule: &GRPCRouteRules) {
    if let Some(name) = &rule.name {
        v.format(&format!("{at}.name"), name, formats::dns1123_subdomain);
    }
    let matches = rule.matches.as_deref().unwrap_or_default();
    items(v, &format!("{at}.matches"), matches.len(), 0, 64);
    for (i, m) in matches.iter().enumerate() {
        let at = format!("{at}.matches[{i}]");
        if let Some(method) = &m.method {
            grpc_method(v, &format!("{at}.method"), method);
        }
        for (j, h) in m.headers.iter().flatten().enumerate() {
            header(v, &format!("{at}.headers[{j}]"), &h.name, &h.value, 4096);
        }
    }
    let filters = rule.filters.as_deref().unwrap_or_default();
    items(v, &format!("{at}.filters"), filters.len(), 0, 16);
    for (i, f) in filters.iter().enumerate() {
        grpc_rule_filter(v, &format!("{at}.filters[{i}]"), f);
    }
    let backends = rule.backend_refs.as_deref().unwrap_or_default();
    items(v, &format!("{at}.backendRefs"), backends.len(), 0, 16);
    for (i, b) in backends.iter().enumerate() {
        let at = format!("{at}.backendRefs[{i}]");
        backend_ref(v, &at, backend!(b), b.weight);
        for (j, f) in b.filters.iter().flatten().enumerate() {
            grpc_backend_filter(v, &format!("{at}.filters[{j}]"), f);
        }
    }
}

/// A gRPC method match: a service or a method, each of valid characters for an exact match.
fn grpc_method(v: &mut Errors, at: &str, m: &GRPCRouteRulesMatchesMethod) {
    if m.service.is_none() && m.method.is_none() {
        v.push(at, "one or both of service and method are required".into());
    }
    // Only exact matches name a service or method; a regular expression may hold anything.
    let exact = m.r#type.as_ref().is_none_or(|t| *t == GRPCRouteRulesMatchesMethodType::Exact);
    for (field, value, format) in
        [("service", &m.service, grpc_service as fn(&str) -> Check), ("method", &m.method, grpc_method_name)]
    {
        let Some(value) = value else { continue };
        let field = format!("{at}.{field}");
        if value.len() > PATH_MAX {
            v.push(&field, format!("must be no more than {PATH_MAX} characters"));
        } else if exact {
            v.format(&field, value, format);
        }
    }
}

/// `fn $name(v, at, filter: &$type)`, which checks one filter of a GRPCRoute.
macro_rules! grpc_filter {
    ($name:ident, $type:ty) => {
        fn $name(v: &mut Errors, at: &str, f: &$type) {
            let set = [
                f.request_header_modifier.is_some(),
                f.response_header_modifier.is_some(),
                f.request_mirror.is_some(),
                false,
                false,
                f.extension_ref.is_some(),
                false,
            ];
            filter_fields(v, at, &json_name(&f.r#type), set);
            if let Some(m) = &f.request_header_modifier {
                header_modifier(v, &format!("{at}.requestHeaderModifier"), headers!(m));
            }
            if let Some(m) = &f.response_header_modifier {
                header_modifier(v, &format!("{at}.responseHeaderModifier"), headers!(m));
            }
            if let Some(m) = &f.request_mirror {
                mirror(v, &format!("{at}.requestMirror"), mirror!(m));
            }
            if let Some(e) = &f.extension_ref {
                reference(v, &format!("{at}.extensionRef"), Some(&e.group), Some(&e.kind), Some(&e.name), None);
            }
        }
    };
}

grpc_filter!(grpc_rule_filter, GRPCRouteRulesFilters);
grpc_filter!(grpc_backend_filter, GRPCRouteRulesBackendRefsFilters);

pub(super) fn reference_grant(v: &mut Errors, grant: &ReferenceGrant) {
    let spec = &grant.spec;
    items(v, "spec.from", spec.from.len(), 1, 16);
    for (i, from) in spec.from.iter().enumerate() {
        let at = format!("spec.from[{i}]");
        reference(v, &at, Some(&from.group), Some(&from.kind), None, Some(&from.namespace));
    }
    items(v, "spec.to", spec.to.len(), 1, 16);
    for (i, to) in spec.to.iter().enumerate() {
        reference(v, &format!("spec.to[{i}]"), Some(&to.group), Some(&to.kind), to.name.as_deref(), None);
    }
}

/// The parts of a reference to another object that are set: an API group (empty for the core
/// group), a kind, an object name and a namespace.
fn reference(
    v: &mut Errors,
    at: &str,
    group: Option<&str>,
    kind: Option<&str>,
    name: Option<&str>,
    namespace: Option<&str>,
) {
    if let Some(group) = group.filter(|g| !g.is_empty()) {
        v.format(&format!("{at}.group"), group, formats::dns1123_subdomain);
    }
    if let Some(kind) = kind {
        v.format(&format!("{at}.kind"), kind, kind_name);
    }
    if let Some(name) = name {
        object_name(v, &format!("{at}.name"), name);
    }
    if let Some(namespace) = namespace {
        v.format(&format!("{at}.namespace"), namespace, formats::dns1123_label);
    }
}

/// A parent reference's port and section (a listener's name).
fn parent_target(v: &mut Errors, at: &str, port: Option<i32>, section: Option<&str>) {
    if let Some(port) = port {
        v.port(&format!("{at}.port"), port);
    }
    if let Some(section) = section {
        v.format(&format!("{at}.sectionName"), section, formats::dns1123_subdomain);
    }
}

/// What a route's backend reference names (its rules' backends and mirrors alike).
struct Backend<'a> {
    group: Option<&'a str>,
    kind: Option<&'a str>,
    name: &'a str,
    namespace: Option<&'a str>,
    port: Option<i32>,
}

/// A backend reference and its weight: the port is required for a Service (the default kind).
fn backend_ref(v: &mut Errors, at: &str, b: Backend<'_>, weight: Option<i32>) {
    reference(v, at, b.group, b.kind, Some(b.name), b.namespace);
    let field = format!("{at}.port");
    match b.port {
        Some(port) => v.port(&field, port),
        None if b.group.unwrap_or_default().is_empty() && b.kind.unwrap_or("Service") == "Service" => {
            v.push(&field, "is required for a Service".into())
        }
        None => {}
    }
    if let Some(weight) = weight.filter(|w| !(0..=1_000_000).contains(w)) {
        v.push(&format!("{at}.weight"), format!("{weight} is out of range 0-1000000"));
    }
}

/// What a RequestMirror filter mirrors, and how much: a percentage or a fraction
/// (numerator, denominator).
struct Mirror<'a> {
    backend: Backend<'a>,
    percent: Option<i32>,
    fraction: Option<(i32, i32)>,
}

fn mirror(v: &mut Errors, at: &str, m: Mirror<'_>) {
    backend_ref(v, &format!("{at}.backendRef"), m.backend, None);
    if let Some(percent) = m.percent.filter(|p| !(0..=100).contains(p)) {
        v.push(&format!("{at}.percent"), format!("{percent} is out of range 0-100"));
    }
    if let Some((numerator, denominator)) = m.fraction {
        if denominator < 1 || !(0..=denominator).contains(&numerator) {
            v.push(&format!("{at}.fraction"), "needs 0 <= numerator <= denominator and 1 <= denominator".into());
        }
        if m.percent.is_some() {
            v.push(at, "only one of percent and fraction may be set".into());
        }
    }
}

fn hostnames(v: &mut Errors, hostnames: Option<&[String]>) {
    let hostnames = hostnames.unwrap_or_default();
    items(v, "spec.hostnames", hostnames.len(), 0, 16);
    for (i, host) in hostnames.iter().enumerate() {
        hostname(v, &format!("spec.hostnames[{i}]"), host);
    }
}

/// A hostname that may start with a wildcard label (`*.example.com`).
fn hostname(v: &mut Errors, field: &str, host: &str) {
    let format = if host.contains('*') { formats::wildcard_subdomain } else { formats::dns1123_subdomain };
    v.format(field, host, format);
}

/// The CRD's bound on the matches of all the rules of a route together.
fn route_matches(v: &mut Errors, count: usize) {
    if count > ROUTE_MATCHES_MAX {
        v.push("spec.rules", format!("{count} matches in all; at most {ROUTE_MATCHES_MAX} are allowed"));
    }
}

/// A header (or query parameter) match: an HTTP token name and a non-empty value.
fn header(v: &mut Errors, at: &str, name: &str, value: &str, value_max: usize) {
    v.format(&format!("{at}.name"), name, header_name);
    if !(1..=value_max).contains(&value.len()) {
        v.push(&format!("{at}.value"), format!("must be 1 to {value_max} characters long"));
    }
}

/// What a header modifier filter adds, sets and removes.
struct HeaderModifier<'a> {
    add: Vec<(&'a str, &'a str)>,
    set: Vec<(&'a str, &'a str)>,
    remove: &'a [String],
}

/// Header names and values of a header modifier; a name at most once in each list.
fn header_modifier(v: &mut Errors, at: &str, m: HeaderModifier<'_>) {
    for (list, headers) in [("add", &m.add), ("set", &m.set)] {
        items(v, &format!("{at}.{list}"), headers.len(), 0, 16);
        let mut names = BTreeSet::new();
        for (i, (name, value)) in headers.iter().enumerate() {
            header(v, &format!("{at}.{list}[{i}]"), name, value, 4096);
            if !names.insert(name) {
                v.push(&format!("{at}.{list}[{i}].name"), format!("duplicate header {name:?}"));
            }
        }
    }
    items(v, &format!("{at}.remove"), m.remove.len(), 0, 16);
    for (i, name) in m.remove.iter().enumerate() {
        v.format(&format!("{at}.remove[{i}]"), name, header_name);
    }
}

/// A filter of type `kind` must set the field that type names, and no other; `set` says which
/// are set, in the order of [`FILTER_FIELDS`].
fn filter_fields(v: &mut Errors, at: &str, kind: &str, set: [bool; FILTER_FIELDS.len()]) {
    for ((filter_type, field), set) in FILTER_FIELDS.into_iter().zip(set) {
        if filter_type == kind && !set {
            v.push(&format!("{at}.{field}"), format!("is required for type {kind}"));
        } else if filter_type != kind && set {
            v.push(&format!("{at}.{field}"), format!("must not be set for type {kind}"));
        }
    }
}

/// A path modifier (of a redirect or rewrite) of type `kind` sets the replacement that type
/// names, and only that one: `[replaceFullPath, replacePrefixMatch]`.
fn path_modifier(v: &mut Errors, at: &str, kind: &str, replacements: [&Option<String>; 2]) {
    let fields = [("ReplaceFullPath", "replaceFullPath"), ("ReplacePrefixMatch", "replacePrefixMatch")];
    for ((path_type, field), value) in fields.into_iter().zip(replacements) {
        let field = format!("{at}.path.{field}");
        match value {
            None if path_type == kind => v.push(&field, format!("is required for type {kind}")),
            Some(_) if path_type != kind => v.push(&field, format!("must not be set for type {kind}")),
            Some(path) if path.len() > PATH_MAX => {
                v.push(&field, format!("must be no more than {PATH_MAX} characters"))
            }
            _ => {}
        }
    }
}

/// Between `min` and `max` items in list `field`.
fn items(v: &mut Errors, field: &str, count: usize, min: usize, max: usize) {
    if !(min..=max).contains(&count) {
        v.push(field, format!("has {count} items; {min} to {max} are allowed"));
    }
}

/// An object's name as a reference holds it: 1 to 253 characters.
fn object_name(v: &mut Errors, field: &str, name: &str) {
    if !(1..=NAME_MAX).contains(&name.len()) {
        v.push(field, format!("{name:?} must be 1 to {NAME_MAX} characters long"));
    }
}

/// A generated enum's value as written in manifests (`URLRewrite`).
fn json_name(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// `^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$` within 63 characters: a kind.
fn kind_name(s: &str) -> Check {
    let b = s.as_bytes();
    let valid = (1..=KIND_MAX).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-');
    if valid { Ok(()) } else { Err("must be a kind: letters, digits and '-', starting with a letter".into()) }
}

/// A listener protocol: `HTTP`-like (letters, digits and inner '-'), or domain-prefixed
/// (`example.com/proto`).
fn protocol(s: &str) -> Check {
    let alnum_dash = |s: &str| {
        let b = s.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    };
    let prefixed = |(domain, name): (&str, &str)| {
        formats::dns1123_subdomain(domain).is_ok()
            && !name.is_empty()
            && name.bytes().all(|c| c.is_ascii_alphanumeric())
    };
    if s.len() <= 255 && (alnum_dash(s) || s.split_once('/').is_some_and(prefixed)) {
        Ok(())
    } else {
        Err("must be a protocol name (letters, digits and '-') or a domain-prefixed one".into())
    }
}

/// An HTTP header name (an RFC 7230 token) of at most 256 characters.
fn header_name(s: &str) -> Check {
    let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    if (1..=256).contains(&s.len()) && s.bytes().all(token) {
        Ok(())
    } else {
        Err("must be an HTTP header name: 1 to 256 letters, digits or !#$%&'*+-.^_`|~".into())
    }
}

/// The path of an Exact or PathPrefix match: absolute, of URL path characters and
/// percent-encodings, without the sequences that normalisation would change.
fn match_path(s: &str) -> Check {
    if !s.starts_with('/') {
        return Err("must be an absolute path".into());
    }
    if let Some(sequence) = INVALID_PATH_SEQUENCES.iter().chain(&["#"]).find(|seq| s.contains(*seq)) {
        return Err(format!("must not contain '{sequence}'"));
    }
    if let Some(suffix) = INVALID_PATH_SUFFIXES.iter().find(|suffix| s.ends_with(*suffix)) {
        return Err(format!("must not end with '{suffix}'"));
    }
    let mut rest = s.as_bytes();
    while let Some((&c, tail)) = rest.split_first() {
        rest = match tail {
            [high, low, after @ ..] if c == b'%' && high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => after,
            _ if c != b'%' && (c.is_ascii_alphanumeric() || b"-/._~!$&'()*+,;=:@".contains(&c)) => tail,
            _ => return Err("must only contain URL path characters and %XX escapes".into()),
        };
    }
    Ok(())
}

/// A gRPC service name for an exact match (`^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`).
fn grpc_service(s: &str) -> Check {
    let name = s.strip_prefix('.').unwrap_or(s);
    if name.split('.').all(|part| grpc_method_name(part).is_ok()) {
        Ok(())
    } else {
        Err("must be a gRPC service name: dot-separated identifiers".into())
    }
}

/// A gRPC method name for an exact match: an identifier (`^[A-Za-z_][A-Za-z_0-9]*$`).
fn grpc_method_name(s: &str) -> Check {
    let b = s.as_bytes();
    let valid = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if valid { Ok(()) } else { Err("must be an identifier: letters, digits and '_', not starting with a digit".into()) }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use crate::Object;
    use crate::validate::validate;

    /// The errors of a `gateway.networking.k8s.io/v1` object of `kind` with `spec`, as
    /// `field: message`.
    fn errors(kind: &str, spec: Value) -> Vec<String> {
        let v = json!({"metadata": {"name": "o", "namespace": "ns"}, "spec": spec});
        let object = match kind {
            "GatewayClass" => Object::GatewayClass(Arc::new(serde_json::from_value(v).unwrap())),
            "Gateway" => Object::Gateway(Arc::new(serde_json::from_value(v).unwrap())),
            "HTTPRoute" => Object::HttpRoute(Arc::new(serde_json::from_value(v).unwrap())),
            "GRPCRoute" => Object::GrpcRoute(Arc::new(serde_json::from_value(v).unwrap())),
            "ReferenceGrant" => Object::ReferenceGrant(Arc::new(serde_json::from_value(v).unwrap())),
            _ => unreachable!("{kind}"),
        };
        validate(&object, None).into_iter().map(|e| format!("{}: {}", e.field.unwrap_or_default(), e.message)).collect()
    }

    #[test]
    fn gateway_classes() {
        assert!(errors("GatewayClass", json!({"controllerName": "roadkeeper.dev/gateway"})).is_empty());
        let bad = json!({"controllerName": "roadkeeper", "description": "x".repeat(65),
            "parametersRef": {"group": "", "kind": "ConfigMap", "name": "", "namespace": "Team"}});
        assert_eq!(
            errors("GatewayClass", bad),
            [
                "spec.controllerName: \"roadkeeper\" must be a domain-prefixed path",
                &format!("spec.description: \"{}\" must be no more than 64 characters", "x".repeat(65)),
                "spec.parametersRef.name: \"\" must be 1 to 253 characters long",
                "spec.parametersRef.namespace: \"Team\" must be a lowercase RFC 1123 label: lowercase letters, digits \
                 and '-', starting and ending with a letter or digit",
            ]
        );
    }

    #[test]
    fn gateway_listeners() {
        let tls = json!({"certificateRefs": [{"name": "cert"}]});
        let good = json!({"gatewayClassName": "roadkeeper", "addresses": [{"type": "Hostname", "value": "lb.example.com"},
            {"value": "10.0.0.1"}], "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"},
            {"name": "https", "port": 443, "protocol": "HTTPS", "tls": tls},
            {"name": "tls", "port": 443, "protocol": "TLS", "hostname": "db.example.com", "tls": {"mode": "Passthrough"}},
            {"name": "tcp", "port": 5432, "protocol": "TCP", "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}},
            {"name": "custom", "port": 8443, "protocol": "example.com/quic"}]});
        assert_eq!(errors("Gateway", good), Vec::<String>::new());
        let bad = json!({"gatewayClassName": "", "addresses": [{"type": "Hostname", "value": "LB"}], "listeners": [
            {"name": "web", "port": 0, "protocol": "HTTP", "hostname": "a.*.com", "tls": tls},
            {"name": "web", "port": 0, "protocol": "HTTP", "hostname": "a.*.com"},
            {"name": "web.1", "port": 443, "protocol": "HTTPS", "tls": {"mode": "Passthrough"}},
            {"name": "tls", "port": 443, "protocol": "TLS"},
            {"name": "udp", "port": 53, "protocol": "UDP", "hostname": "dns.example.com"},
            {"name": "term", "port": 8443, "protocol": "H T T P", "tls": {"certificateRefs": [],
                "mode": "Terminate"}, "allowedRoutes": {"kinds": [{"group": "Gateway", "kind": "1Route"}]}}]});
        assert_eq!(
            errors("Gateway", bad),
            [
                "spec.gatewayClassName: \"\" must be 1 to 253 characters long",
                "spec.listeners[0].port: 0 is out of range 1-65535",
                "spec.listeners[0].hostname: \"a.*.com\" must be '*.' followed by a lowercase RFC 1123 subdomain",
                "spec.listeners[0].tls: must not be set for protocol HTTP",
                "spec.listeners[1].port: 0 is out of range 1-65535",
                "spec.listeners[1].hostname: \"a.*.com\" must be '*.' followed by a lowercase RFC 1123 subdomain",
                "spec.listeners[1].name: duplicate listener name \"web\"",
                "spec.listeners[1]: the combination of port, protocol and hostname must be unique",
                "spec.listeners[2].tls.mode: must be Terminate for protocol HTTPS",
                "spec.listeners[3].tls: is required for protocol TLS",
                "spec.listeners[4].hostname: must not be set for protocol UDP",
                "spec.listeners[5].protocol: \"H T T P\" must be a protocol name (letters, digits and '-') or a \
                 domain-prefixed one",
                "spec.listeners[5].tls.certificateRefs: certificateRefs or options are required for mode Terminate",
                "spec.listeners[5].allowedRoutes.kinds[0].group: \"Gateway\" must be a lowercase RFC 1123 subdomain: \
                 dot-separated labels of lowercase letters, digits and '-', each starting and ending with a letter or \
                 digit",
                "spec.listeners[5].allowedRoutes.kinds[0].kind: \"1Route\" must be a kind: letters, digits and '-', \
                 starting with a letter",
                "spec.addresses[0].value: \"LB\" must be a lowercase RFC 1123 subdomain: dot-separated labels of \
                 lowercase letters, digits and '-', each starting and ending with a letter or digit",
            ]
        );
        let none = json!({"gatewayClassName": "roadkeeper", "listeners": []});
        assert_eq!(errors("Gateway", none), ["spec.listeners: has 0 items; 1 to 64 are allowed"]);
    }

    #[test]
    fn http_route_matches_and_backends() {
        let good = json!({"parentRefs": [{"name": "web", "sectionName": "http", "port": 80}],
            "hostnames": ["*.example.com", "app.example.com"], "rules": [{"name": "r1",
            "matches": [{"path": {"type": "Exact", "value": "/a%20b/c"}, "method": "GET",
                "headers": [{"name": "X-Env", "value": "canary"}], "queryParams": [{"name": "v", "value": "2"}]},
                {"path": {"type": "RegularExpression", "value": "/(a|b)//"}}, {"headers": [{"name": "a", "value": "b"}]}],
            "backendRefs": [{"name": "web", "port": 8080, "weight": 0}, {"kind": "Bucket", "group": "example.com", "name": "b"}],
            "timeouts": {"request": "10s"}}]});
        assert_eq!(errors("HTTPRoute", good), Vec::<String>::new());
        let bad = json!({"parentRefs": [{"name": "", "namespace": "a.b", "sectionName": "Http", "port": 65536}],
            "hostnames": ["10.0.0.1.", "*"], "rules": [{"name": "R",
            "matches": [{"path": {"value": "app"}}, {"path": {"type": "Exact", "value": "/a//b"}},
                {"path": {"type": "PathPrefix", "value": "/a b"}}, {"path": {"value": "/a/.."}},
                {"path": {"value": "/%zz"}}, {"headers": [{"name": "x:y", "value": ""}]}],
            "backendRefs": [{"name": "web"}, {"name": "web", "port": 80, "weight": -1}]}]});
        assert_eq!(
            errors("HTTPRoute", bad),
            [
                "spec.parentRefs[0].name: \"\" must be 1 to 253 characters long",
                "spec.parentRefs[0].namespace: \"a.b\" must be a lowercase RFC 1123 label: lowercase letters, digits \
                 and '-', starting and ending with a letter or digit",
                "spec.parentRefs[0].port: 65536 is out of range 1-65535",
                "spec.parentRefs[0].sectionName: \"Http\" must be a lowercase RFC 1123 subdomain: dot-separated labels \
                 of lowercase letters, digits and '-', each starting and ending with a letter or digit",
                "spec.hostnames[0]: \"10.0.0.1.\" must be a lowercase RFC 1123 subdomain: dot-separated labels of \
                 lowercase letters, digits and '-', each starting and ending with a letter or digit",
                "spec.hostnames[1]: \"*\" must be '*.' followed by a lowercase RFC 1123 subdomain",
                "spec.rules[0].name: \"R\" must be a lowercase RFC 1123 subdomain: dot-separated labels of lowercase \
                 letters, digits and '-', each starting and ending with a letter or digit",
                "spec.rules[0].matches[0].path.value: \"app\" must be an absolute path",
                "spec.rules[0].matches[1].path.value: \"/a//b\" must not contain '//'",
                "spec.rules[0].matches[2].path.value: \"/a b\" must only contain URL path characters and %XX escapes",
                "spec.rules[0].matches[3].path.value: \"/a/..\" must not end with '/..'",
                "spec.rules[0].matches[4].path.value: \"/%zz\" must only contain URL path characters and %XX escapes",
                "spec.rules[0].matches[5].headers[0].name: \"x:y\" must be an HTTP header name: 1 to 256 letters, \
                 digits or !#$%&'*+-.^_`|~",
                "spec.rules[0].matches[5].headers[0].value: must be 1 to 4096 characters long",
                "spec.rules[0].backendRefs[0].port: is required for a Service",
                "spec.rules[0].backendRefs[1].weight: -1 is out of range 0-1000000",
            ]
        );
        assert_eq!(errors("HTTPRoute", json!({"rules": []})), ["spec.rules: has 0 items; 1 to 16 are allowed"]);
        let many = json!({"rules": (0..3).map(|_| json!({"matches": vec![json!({}); 50]})).collect::<Vec<_>>()});
        assert_eq!(errors("HTTPRoute", many), ["spec.rules: 150 matches in all; at most 128 are allowed"]);
    }

    #[test]
    fn http_route_filters() {
        let redirect = json!({"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "port": 443,
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}});
        let headers = json!({"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "x-a", "value": "1"}], "add": [{"name": "x-b", "value": "2"}], "remove": ["x-c"]}});
        let good = json!({"rules": [{"matches": [{"path": {"value": "/old"}}], "filters": [redirect, headers]},
            {"filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "new.example.com",
                "path": {"type": "ReplaceFullPath", "replaceFullPath": "/"}}}],
             "backendRefs": [{"name": "web", "port": 80, "filters": [{"type": "RequestMirror",
                "requestMirror": {"backendRef": {"name": "shadow", "port": 80}, "fraction": {"numerator": 1}}}]}]}]});
        assert_eq!(errors("HTTPRoute", good), Vec::<String>::new());
        let bad = json!({"rules": [
            {"matches": [{"path": {"type": "Exact", "value": "/old"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "*.example.com",
                "path": {"type": "ReplacePrefixMatch", "replaceFullPath": "/x"}}},
                {"type": "RequestHeaderModifier", "responseHeaderModifier": {}},
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "a", "value": "1"},
                    {"name": "a", "value": "2"}], "remove": ["b c"]}}],
             "backendRefs": [{"name": "web", "port": 80, "filters": [{"type": "RequestMirror",
                "requestMirror": {"backendRef": {"name": "shadow"}, "percent": 101, "fraction": {"numerator": 2, "denominator": 1}}}]}]}]});
        assert_eq!(
            errors("HTTPRoute", bad),
            [
                "spec.rules[0].filters[0].requestRedirect.hostname: \"*.example.com\" must be a lowercase RFC 1123 \
                 subdomain: dot-separated labels of lowercase letters, digits and '-', each starting and ending with a \
                 letter or digit",
                "spec.rules[0].filters[0].requestRedirect.path.replaceFullPath: must not be set for type ReplacePrefixMatch",
                "spec.rules[0].filters[0].requestRedirect.path.replacePrefixMatch: is required for type ReplacePrefixMatch",
                "spec.rules[0].filters[1].requestHeaderModifier: is required for type RequestHeaderModifier",
                "spec.rules[0].filters[1].responseHeaderModifier: must not be set for type RequestHeaderModifier",
                "spec.rules[0].filters[2].responseHeaderModifier.set[1].name: duplicate header \"a\"",
                "spec.rules[0].filters[2].responseHeaderModifier.remove[0]: \"b c\" must be an HTTP header name: 1 to \
                 256 letters, digits or !#$%&'*+-.^_`|~",
                "spec.rules[0].filters: a RequestRedirect filter may not be used with backendRefs",
                "spec.rules[0].backendRefs[0].filters[0].requestMirror.backendRef.port: is required for a Service",
                "spec.rules[0].backendRefs[0].filters[0].requestMirror.percent: 101 is out of range 0-100",
                "spec.rules[0].backendRefs[0].filters[0].requestMirror.fraction: needs 0 <= numerator <= denominator \
                 and 1 <= denominator",
                "spec.rules[0].backendRefs[0].filters[0].requestMirror: only one of percent and fraction may be set",
                "spec.rules[0].matches: ReplacePrefixMatch needs exactly one match, of type PathPrefix",
            ]
        );
    }

    #[test]
    fn grpc_routes() {
        let good = json!({"parentRefs": [{"name": "web"}], "hostnames": ["grpc.example.com"], "rules": [{
            "matches": [{"method": {"service": "pkg.Greeter", "method": "SayHello"}},
                {"method": {"type": "RegularExpression", "service": "pkg\\..*"}}, {"headers": [{"name": "x-a", "value": "b"}]}],
            "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-b", "value": "c"}]}}],
            "backendRefs": [{"name": "grpc", "port": 9000}]}]});
        assert_eq!(errors("GRPCRoute", good), Vec::<String>::new());
        let bad = json!({"rules": [{"matches": [{"method": {}}, {"method": {"service": "pkg/Greeter", "method": "1x"}}],
            "filters": [{"type": "ExtensionRef", "requestMirror": {"backendRef": {"name": "m", "port": 1}}}],
            "backendRefs": [{"name": "grpc"}]}]});
        assert_eq!(
            errors("GRPCRoute", bad),
            [
                "spec.rules[0].matches[0].method: one or both of service and method are required",
                "spec.rules[0].matches[1].method.service: \"pkg/Greeter\" must be a gRPC service name: dot-separated \
                 identifiers",
                "spec.rules[0].matches[1].method.method: \"1x\" must be an identifier: letters, digits and '_', not \
                 starting with a digit",
                "spec.rules[0].filters[0].requestMirror: must not be set for type ExtensionRef",
                "spec.rules[0].filters[0].extensionRef: is required for type ExtensionRef",
                "spec.rules[0].backendRefs[0].port: is required for a Service",
            ]
        );
    }

    #[test]
    fn reference_grants() {
        let good = json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "team"}],
            "to": [{"group": "", "kind": "Service", "name": "web"}, {"group": "", "kind": "Secret"}]});
        assert_eq!(errors("ReferenceGrant", good), Vec::<String>::new());
        let bad = json!({"from": [{"group": "", "kind": "HTTP Route", "namespace": ""}], "to": []});
        assert_eq!(
            errors("ReferenceGrant", bad),
            [
                "spec.from[0].kind: \"HTTP Route\" must be a kind: letters, digits and '-', starting with a letter",
                "spec.from[0].namespace: \"\" must be a lowercase RFC 1123 label: lowercase letters, digits and '-', \
                 starting and ending with a letter or digit",
                "spec.to: has 0 items; 1 to 16 are allowed",
            ]
        );
    }
}
