//! One HTTPRoute compiled: its matches (with their precedence), what each rule does (filters,
//! weighted backends), and the problems its status reports.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, StatusCode};
use roadkeeper_cluster::gateway_api::httproutes::{
    HTTPRoute, HTTPRouteRules, HTTPRouteRulesBackendRefsFilters, HTTPRouteRulesFilters, HTTPRouteRulesMatches,
};
use roadkeeper_cluster::{NamespacedName, Store};

use super::cors::Cors;
use super::filters::{PathModifier, Redirect};
use super::matching::{Match, PathMatch, Precedence, RouteAge};
use super::refs::{self, BackendError, BackendRef};
use super::table::{Action, ActionKind, Backends, Choice, Entry};
use super::text;
use crate::Target;
use crate::decision::{Actions, HeaderEdits};

/// A compiled HTTPRoute: every match of every rule, and what its status must say.
#[derive(Clone, Debug)]
pub struct CompiledRoute {
    /// Each match with its precedence, in the order of the spec.
    pub(crate) entries: Vec<Entry>,
    /// The first backend reference that could not be resolved (`ResolvedRefs: False`).
    pub unresolved: Option<BackendError>,
    /// Why the route cannot be served as written (`Accepted: False, UnsupportedValue`).
    pub unsupported: Option<String>,
}

/// Compiles route `key`.
pub fn compile(store: &Store, key: &NamespacedName, route: &HTTPRoute) -> CompiledRoute {
    let age: RouteAge = (route.metadata.creation_timestamp.clone(), key.clone());
    let name: Arc<str> = key.to_string().into();
    let mut compiled = CompiledRoute { entries: Vec::new(), unresolved: None, unsupported: None };
    let default_rules = [HTTPRouteRules::default()];
    let rules = route.spec.rules.as_deref().filter(|rules| !rules.is_empty()).unwrap_or(&default_rules);
    for (index, rule) in rules.iter().enumerate() {
        let field = format!("spec.rules[{index}]");
        match compile_rule(store, key, &name, rule, &field, &mut compiled.unresolved) {
            Ok((matches, action)) => {
                for (m, matched) in matches.into_iter().enumerate() {
                    let precedence = Precedence::of(&matched, age.clone(), index, m);
                    compiled.entries.push(Entry { precedence, matched, action: action.clone() });
                }
            }
            Err(why) => {
                compiled.unsupported.get_or_insert(why);
            }
        }
    }
    if compiled.unsupported.is_some() {
        compiled.entries.clear();
    }
    compiled
}

/// The Services route `key` names as backends or mirrors (whatever the kind written, so that a
/// change to any of them compiles the route again).
pub fn services(key: &NamespacedName, route: &HTTPRoute) -> BTreeSet<NamespacedName> {
    let named = |namespace: &Option<String>, name: &str| {
        NamespacedName::new(namespace.as_deref().unwrap_or(&key.namespace), name)
    };
    let mut services = BTreeSet::new();
    for rule in route.spec.rules.iter().flatten() {
        let mirrors = rule.filters.iter().flatten().filter_map(|f| f.request_mirror.as_ref());
        services.extend(mirrors.map(|m| named(&m.backend_ref.namespace, &m.backend_ref.name)));
        for backend in rule.backend_refs.iter().flatten() {
            services.insert(named(&backend.namespace, &backend.name));
            let mirrors = backend.filters.iter().flatten().filter_map(|f| f.request_mirror.as_ref());
            services.extend(mirrors.map(|m| named(&m.backend_ref.namespace, &m.backend_ref.name)));
        }
    }
    services
}

/// One rule: its matches and its action, or what in it is unsupported (naming the field).
fn compile_rule(
    store: &Store,
    key: &NamespacedName,
    name: &Arc<str>,
    rule: &HTTPRouteRules,
    field: &str,
    unresolved: &mut Option<BackendError>,
) -> Result<(Vec<Match>, Arc<Action>), String> {
    let matches = match rule.matches.as_deref() {
        None | Some([]) => vec![Match::default()],
        Some(matches) => matches
            .iter()
            .enumerate()
            .map(|(i, m)| compile_match(m, &format!("{field}.matches[{i}]")))
            .collect::<Result<_, _>>()?,
    };
    let mut actions = Actions::default();
    let mut own = RuleOnly::default();
    for (i, filter) in rule.filters.iter().flatten().enumerate() {
        let at = format!("{field}.filters[{i}]");
        apply_filter(store, key, filter, &at, &mut actions, &mut own, unresolved)?;
    }
    let RuleOnly { redirect, rewrite, cors } = own;
    if let Some(timeouts) = &rule.timeouts {
        actions.request_timeout = duration(timeouts.request.as_deref(), &format!("{field}.timeouts.request"))?;
        actions.backend_timeout =
            duration(timeouts.backend_request.as_deref(), &format!("{field}.timeouts.backendRequest"))?;
    }
    let kind = match redirect {
        Some(redirect) => ActionKind::Redirect(redirect),
        None => {
            let rule_actions = (actions != Actions::default()).then(|| Arc::new(actions.clone()));
            let mut backends = Backends { host: rewrite.0, path: rewrite.1, ..Backends::default() };
            let mut total = 0u64;
            for (i, backend) in rule.backend_refs.iter().flatten().enumerate() {
                let weight = u64::try_from(backend.weight.unwrap_or(1)).unwrap_or_default();
                let reference = BackendRef {
                    group: backend.group.as_deref(),
                    kind: backend.kind.as_deref(),
                    namespace: backend.namespace.as_deref(),
                    name: &backend.name,
                    port: backend.port,
                };
                let choice = match refs::resolve_backend(store, key, &reference) {
                    Ok((service, endpoints)) => {
                        let target = Arc::new(Target { ingress: key.clone(), service, endpoints });
                        let own = backend_actions(
                            store,
                            key,
                            backend.filters.as_deref(),
                            &actions,
                            &format!("{field}.backendRefs[{i}]"),
                            unresolved,
                        )?;
                        Choice::Service { target, actions: own.or_else(|| rule_actions.clone()) }
                    }
                    Err(error) => {
                        unresolved.get_or_insert(error);
                        Choice::Invalid
                    }
                };
                if weight > 0 {
                    total += weight;
                    backends.choices.push((total, choice));
                }
            }
            ActionKind::Forward(backends)
        }
    };
    Ok((matches, Arc::new(Action { route: name.clone(), kind, cors })))
}

/// The actions of a backend with filters of its own: the rule's, then its own header edits.
fn backend_actions(
    store: &Store,
    key: &NamespacedName,
    filters: Option<&[HTTPRouteRulesBackendRefsFilters]>,
    rule: &Actions,
    field: &str,
    unresolved: &mut Option<BackendError>,
) -> Result<Option<Arc<Actions>>, String> {
    let Some(filters) = filters.filter(|f| !f.is_empty()) else { return Ok(None) };
    let mut actions = rule.clone();
    for (i, filter) in filters.iter().enumerate() {
        let at = format!("{field}.filters[{i}]");
        // The same filters as a rule's: go through the rule filter's type.
        let value = serde_json::to_value(filter).map_err(|err| format!("{at}: {err}"))?;
        let filter: HTTPRouteRulesFilters = serde_json::from_value(value).map_err(|err| format!("{at}: {err}"))?;
        let mut own = RuleOnly::default();
        apply_filter(store, key, &filter, &at, &mut actions, &mut own, unresolved)?;
        if own != RuleOnly::default() {
            return Err(format!("{at}: RequestRedirect, URLRewrite and CORS are supported on rules only"));
        }
    }
    Ok(Some(Arc::new(actions)))
}

/// What only a rule's filters (not a backend's) may set: a redirect, a URL rewrite (host and
/// path) and a CORS policy.
#[derive(Debug, Default, PartialEq)]
struct RuleOnly {
    redirect: Option<Redirect>,
    rewrite: (Option<HeaderValue>, Option<PathModifier>),
    cors: Option<Cors>,
}

/// Applies one filter to what the rule does: to `actions`, or to what only a rule may set.
fn apply_filter(
    store: &Store,
    key: &NamespacedName,
    filter: &HTTPRouteRulesFilters,
    at: &str,
    actions: &mut Actions,
    own: &mut RuleOnly,
    unresolved: &mut Option<BackendError>,
) -> Result<(), String> {
    let RuleOnly { redirect, rewrite, cors } = own;
    match text(&filter.r#type).as_str() {
        "RequestHeaderModifier" => {
            let modifier =
                filter.request_header_modifier.as_ref().ok_or(format!("{at}: requestHeaderModifier missing"))?;
            header_edits(
                &mut actions.request_headers,
                &modifier.set,
                &modifier.add,
                &modifier.remove,
                &format!("{at}.requestHeaderModifier"),
            )
        }
        "ResponseHeaderModifier" => {
            let modifier =
                filter.response_header_modifier.as_ref().ok_or(format!("{at}: responseHeaderModifier missing"))?;
            header_edits(
                &mut actions.response_headers,
                &modifier.set,
                &modifier.add,
                &modifier.remove,
                &format!("{at}.responseHeaderModifier"),
            )
        }
        "RequestRedirect" => {
            let spec = filter.request_redirect.as_ref().ok_or(format!("{at}: requestRedirect missing"))?;
            let status = spec.status_code.unwrap_or(302);
            let status = u16::try_from(status)
                .ok()
                .and_then(|code| StatusCode::from_u16(code).ok())
                .filter(|code| [301, 302, 303, 307, 308].contains(&code.as_u16()))
                .ok_or(format!("{at}.requestRedirect.statusCode: {status} is not a redirect status"))?;
            let port = spec
                .port
                .map(|port| u16::try_from(port).map_err(|_| format!("{at}.requestRedirect.port: {port}")))
                .transpose()?;
            let path = path_modifier(
                spec.path
                    .as_ref()
                    .map(|p| (text(&p.r#type), p.replace_full_path.as_deref(), p.replace_prefix_match.as_deref())),
                &format!("{at}.requestRedirect.path"),
            )?;
            *redirect = Some(Redirect {
                scheme: spec.scheme.as_ref().map(text),
                hostname: spec.hostname.clone(),
                port,
                path,
                status,
            });
            Ok(())
        }
        "URLRewrite" => {
            let spec = filter.url_rewrite.as_ref().ok_or(format!("{at}: urlRewrite missing"))?;
            if let Some(hostname) = &spec.hostname {
                rewrite.0 = Some(
                    HeaderValue::try_from(hostname.as_str())
                        .map_err(|_| format!("{at}.urlRewrite.hostname: invalid"))?,
                );
            }
            rewrite.1 = path_modifier(
                spec.path
                    .as_ref()
                    .map(|p| (text(&p.r#type), p.replace_full_path.as_deref(), p.replace_prefix_match.as_deref())),
                &format!("{at}.urlRewrite.path"),
            )?;
            Ok(())
        }
        "CORS" => {
            let spec = filter.cors.as_ref().ok_or(format!("{at}: cors missing"))?;
            *cors = Some(Cors::compile(spec, &format!("{at}.cors"))?);
            Ok(())
        }
        "RequestMirror" => {
            let spec = filter.request_mirror.as_ref().ok_or(format!("{at}: requestMirror missing"))?;
            let backend = &spec.backend_ref;
            let reference = BackendRef {
                group: backend.group.as_deref(),
                kind: backend.kind.as_deref(),
                namespace: backend.namespace.as_deref(),
                name: &backend.name,
                port: backend.port,
            };
            match refs::resolve_backend(store, key, &reference) {
                Ok((service, endpoints)) => {
                    actions.mirrors.push(Arc::new(Target { ingress: key.clone(), service, endpoints }))
                }
                Err(error) => {
                    unresolved.get_or_insert(error);
                }
            }
            Ok(())
        }
        other => Err(format!("{at}.type: {other} is not supported")),
    }
}

/// A header modifier's `set`, `add` and `remove`, checked, appended to `edits`.
fn header_edits<S: NamedValue, A: NamedValue>(
    edits: &mut HeaderEdits,
    set: &Option<Vec<S>>,
    add: &Option<Vec<A>>,
    remove: &Option<Vec<String>>,
    at: &str,
) -> Result<(), String> {
    let pair = |n: &dyn NamedValue, field: &str| -> Result<(HeaderName, HeaderValue), String> {
        let name =
            HeaderName::try_from(n.name()).map_err(|_| format!("{at}.{field}: {:?} is not a header name", n.name()))?;
        let value = HeaderValue::try_from(n.value()).map_err(|_| format!("{at}.{field}: invalid value for {name}"))?;
        Ok((name, value))
    };
    for n in set.iter().flatten() {
        edits.set.push(pair(n, "set")?);
    }
    for n in add.iter().flatten() {
        edits.add.push(pair(n, "add")?);
    }
    for name in remove.iter().flatten() {
        edits.remove.push(
            HeaderName::try_from(name.as_str()).map_err(|_| format!("{at}.remove: {name:?} is not a header name"))?,
        );
    }
    Ok(())
}

/// A `name` + `value` pair of a header modifier (the generated types differ per filter).
pub trait NamedValue {
    fn name(&self) -> &str;
    fn value(&self) -> &str;
}

macro_rules! named_value {
    ($($type:path),*) => {$(
        impl NamedValue for $type {
            fn name(&self) -> &str {
                &self.name
            }
            fn value(&self) -> &str {
                &self.value
            }
        }
    )*};
}
named_value!(
    roadkeeper_cluster::gateway_api::httproutes::HTTPRouteRulesFiltersRequestHeaderModifierSet,
    roadkeeper_cluster::gateway_api::httproutes::HTTPRouteRulesFiltersRequestHeaderModifierAdd,
    roadkeeper_cluster::gateway_api::httproutes::HTTPRouteRulesFiltersResponseHeaderModifierSet,
    roadkeeper_cluster::gateway_api::httproutes::HTTPRouteRulesFiltersResponseHeaderModifierAdd
);

/// A path modifier of a redirect or rewrite: (type, replaceFullPath, replacePrefixMatch).
fn path_modifier(spec: Option<(String, Option<&str>, Option<&str>)>, at: &str) -> Result<Option<PathModifier>, String> {
    let Some((kind, full, prefix)) = spec else { return Ok(None) };
    match (kind.as_str(), full, prefix) {
        ("ReplaceFullPath", Some(full), _) => Ok(Some(PathModifier::Full(full.to_owned()))),
        ("ReplacePrefixMatch", _, Some(prefix)) => Ok(Some(PathModifier::Prefix(prefix.to_owned()))),
        _ => Err(format!("{at}: type {kind} without its value")),
    }
}

/// One `HTTPRouteMatch`.
fn compile_match(spec: &HTTPRouteRulesMatches, at: &str) -> Result<Match, String> {
    let mut matched = Match::default();
    if let Some(path) = &spec.path {
        let value = path.value.as_deref().unwrap_or("/");
        if !value.starts_with('/') {
            return Err(format!("{at}.path.value: {value:?} does not start with /"));
        }
        matched.path = match path.r#type.as_ref().map(text).as_deref() {
            None | Some("PathPrefix") => PathMatch::prefix(value),
            Some("Exact") => PathMatch::Exact(value.to_owned()),
            Some(other) => return Err(format!("{at}.path.type: {other} is not supported")),
        };
    }
    if let Some(method) = &spec.method {
        let method = text(method);
        matched.method = Some(Method::from_bytes(method.as_bytes()).map_err(|_| format!("{at}.method: {method:?}"))?);
    }
    for (i, header) in spec.headers.iter().flatten().enumerate() {
        if header.r#type.as_ref().map(text).is_some_and(|kind| kind != "Exact") {
            return Err(format!("{at}.headers[{i}].type: only Exact is supported"));
        }
        let name =
            HeaderName::try_from(header.name.as_str()).map_err(|_| format!("{at}.headers[{i}].name: invalid"))?;
        // Only the first match of a name counts.
        if !matched.headers.iter().any(|(n, _)| *n == name) {
            matched.headers.push((name, header.value.clone()));
        }
    }
    for (i, query) in spec.query_params.iter().flatten().enumerate() {
        if query.r#type.as_ref().map(text).is_some_and(|kind| kind != "Exact") {
            return Err(format!("{at}.queryParams[{i}].type: only Exact is supported"));
        }
        if !matched.query.iter().any(|(n, _)| *n == query.name) {
            matched.query.push((query.name.clone(), query.value.clone()));
        }
    }
    Ok(matched)
}

/// A Gateway API duration (`1h30m`, `500ms`; GEP-2257); zero is none.
fn duration(written: Option<&str>, at: &str) -> Result<Option<Duration>, String> {
    let Some(written) = written else { return Ok(None) };
    let parsed = super::duration::parse(written)
        .ok_or_else(|| format!("{at}: {written:?} is not a duration like 10s or 1h30m"))?;
    Ok((!parsed.is_zero()).then_some(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let d = |s| duration(Some(s), "t");
        assert_eq!(d("10s"), Ok(Some(Duration::from_secs(10))));
        assert_eq!(d("1h30m"), Ok(Some(Duration::from_secs(5400))));
        assert_eq!(d("500ms"), Ok(Some(Duration::from_millis(500))));
        assert_eq!(d("1s500ms"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(d("0s"), Ok(None));
        assert_eq!(duration(None, "t"), Ok(None));
        for bad in ["", "10", "s", "1x", "1.5s", "-1s", "100000s", "99999999999999999999h"] {
            assert!(d(bad).unwrap_err().contains("is not a duration"), "{bad}");
        }
    }
}
