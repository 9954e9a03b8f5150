//! What the data plane serves for the Gateways (immutable, shared by every worker): by local
//! address the Gateway, by port its listeners, by host the listener and, among the routes
//! attached to it, the rules in order of precedence. Implements [`Router`] and [`Listeners`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hyper::StatusCode;
use hyper::header::{self, HeaderName, HeaderValue};

use super::cors::{Cors, Outcome};
use super::filters::{PathModifier, Redirect};
use super::hostname::HostMap;
use super::matching::{Match, Precedence};
use crate::decision::{Actions, Decision, Forward, Listener, Listeners, Request};
use crate::{Router, Target};

/// The Gateways' routes, as served.
#[derive(Clone, Debug, Default)]
pub struct ServeTable {
    /// Each Gateway address and what its ports serve.
    pub(crate) addresses: HashMap<IpAddr, Arc<HashMap<u16, Port>>>,
}

/// One port of one Gateway address.
#[derive(Clone, Debug, Default)]
pub(crate) struct Port {
    /// TLS (HTTPS listeners, certificates by SNI), else plain HTTP.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// The listeners on the port, by hostname.
    pub listeners: HostMap<Arc<Rules>>,
}

/// The rules of the routes attached to one listener, by the route hostname they serve; each list
/// ordered by precedence.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rules {
    pub by_host: HostMap<Arc<[Entry]>>,
}

/// One match of one rule.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Where it stands among the entries of its listener and hostname.
    pub precedence: Precedence,
    pub matched: Match,
    pub action: Arc<Action>,
}

/// What a rule does with the requests it matches.
#[derive(Debug)]
pub(crate) struct Action {
    /// The route, `namespace/name`, for logs and metrics.
    pub route: Arc<str>,
    pub kind: ActionKind,
    /// The rule's CORS policy: answers preflights, and adds its fields to cross-origin responses.
    pub cors: Option<Cors>,
}

/// A rule's answer: a redirect, or backends.
#[derive(Debug)]
pub(crate) enum ActionKind {
    Redirect(Redirect),
    Forward(Backends),
}

/// The backends of a rule, by weight, and the URL rewrite applied to what they get.
#[derive(Debug, Default)]
pub(crate) struct Backends {
    /// Each backend with the end of its share of the cumulative weight.
    pub choices: Vec<(u64, Choice)>,
    /// The host the backends get (`URLRewrite.hostname`).
    pub host: Option<HeaderValue>,
    /// The path the backends get (`URLRewrite.path`).
    pub path: Option<PathModifier>,
    /// Requests seen, spread over the weights.
    pub next: AtomicU64,
}

/// One weighted backend.
#[derive(Clone, Debug)]
pub(crate) enum Choice {
    /// A backend that cannot be used (missing, refused, not a Service): its share answers 500.
    Invalid,
    /// A Service.
    Service { target: Arc<Target>, actions: Option<Arc<Actions>> },
}

impl Backends {
    /// The backend for the next request: a Weyl sequence over the cumulative weights (the
    /// counter times the golden ratio, modulo 1), so that any run of requests is spread as the
    /// weights say without a lock.
    fn pick(&self) -> Option<&Choice> {
        let total = self.choices.last()?.0;
        if total == 0 {
            return None;
        }
        let spread = self.next.fetch_add(1, Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let point = ((u128::from(spread) * u128::from(total)) >> 64) as u64;
        self.choices.iter().find(|(end, _)| point < *end).map(|(_, choice)| choice)
    }
}

impl ServeTable {
    /// Every port some Gateway address serves (with repeats).
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.addresses.values().flat_map(|ports| ports.keys().copied())
    }

    /// The rules that serve `host` on `local`: the most specific listener's, then the most
    /// specific route hostname's.
    fn rules(&self, local: SocketAddr, host: &str) -> Option<&[Entry]> {
        let port = self.addresses.get(&local.ip().to_canonical())?.get(&local.port())?;
        port.listeners.get(host)?.by_host.get(host).map(|entries| &entries[..])
    }
}

impl Router for ServeTable {
    fn route(&self, request: &Request<'_>) -> Option<Decision> {
        let entry = self.rules(request.local, request.host)?.iter().find(|entry| entry.matched.matches(request))?;
        let action = &entry.action;
        let respond = |status, headers| Decision::Respond { route: action.route.clone(), status, headers };
        let cors = match action.cors.as_ref().map(|cors| cors.decide(request)) {
            None | Some(Outcome::Pass) => Vec::new(),
            Some(Outcome::Preflight(fields)) => return Some(respond(StatusCode::NO_CONTENT, fields)),
            Some(Outcome::Actual(fields)) => fields,
        };
        Some(match &action.kind {
            ActionKind::Redirect(redirect) => {
                let location = redirect.location(request, &entry.matched.path);
                respond(redirect.status, location.map(|l| (header::LOCATION, l)).into_iter().chain(cors).collect())
            }
            ActionKind::Forward(backends) => match backends.pick() {
                None | Some(Choice::Invalid) => respond(StatusCode::INTERNAL_SERVER_ERROR, cors),
                Some(Choice::Service { target, actions }) => Decision::Forward(Forward {
                    target: target.clone(),
                    path: backends.path.as_ref().map(|path| path.apply(request.path, &entry.matched.path)),
                    host: backends.host.clone(),
                    actions: with_response_fields(actions, cors),
                }),
            },
        })
    }
}

/// `actions` with `fields` set on the response too (a copy, made only when there are fields).
fn with_response_fields(
    actions: &Option<Arc<Actions>>,
    fields: Vec<(HeaderName, HeaderValue)>,
) -> Option<Arc<Actions>> {
    if fields.is_empty() {
        return actions.clone();
    }
    let mut copy = actions.as_deref().cloned().unwrap_or_default();
    copy.response_headers.set.extend(fields);
    Some(Arc::new(copy))
}

impl Listeners for ServeTable {
    fn listener(&self, local: SocketAddr) -> Option<Listener> {
        let port = self.addresses.get(&local.ip().to_canonical())?.get(&local.port())?;
        Some(match &port.tls {
            Some(config) => Listener::Https(config.clone()),
            None => Listener::Http,
        })
    }
}

#[cfg(test)]
mod tests {
    use hyper::Method;
    use hyper::header::HeaderMap;
    use roadkeeper_cluster::NamespacedName;

    use super::super::hostname::Hostname;
    use super::super::matching::PathMatch;
    use super::*;

    fn target(service: &str) -> Arc<Target> {
        let endpoints = Arc::new(["10.244.0.5:8080".parse().unwrap()]);
        Arc::new(Target {
            ingress: NamespacedName::new("ns", "route"),
            service: NamespacedName::new("ns", service),
            endpoints,
        })
    }

    fn forward(choices: Vec<(u64, Choice)>) -> Arc<Action> {
        let kind = ActionKind::Forward(Backends { choices, ..Backends::default() });
        Arc::new(Action { route: "ns/route".into(), kind, cors: None })
    }

    fn service(name: &str) -> Choice {
        Choice::Service { target: target(name), actions: None }
    }

    fn entry(matched: Match, action: Arc<Action>) -> Entry {
        let precedence = Precedence::of(&matched, (None, NamespacedName::new("ns", "route")), 0, 0);
        Entry { precedence, matched, action }
    }

    fn table(listener: Hostname, route: Hostname, entries: Vec<Entry>) -> ServeTable {
        let mut rules = Rules::default();
        *rules.by_host.entry(&route) = entries.into();
        let mut port = Port::default();
        *port.listeners.entry(&listener) = Arc::new(rules);
        let ports = HashMap::from([(80, port)]);
        ServeTable { addresses: HashMap::from([("192.168.235.1".parse().unwrap(), Arc::new(ports))]) }
    }

    fn route(table: &ServeTable, local: &str, host: &str, path: &str) -> Option<Decision> {
        let headers = HeaderMap::new();
        let request = Request {
            local: local.parse().unwrap(),
            tls: false,
            host,
            path,
            query: None,
            method: &Method::GET,
            headers: &headers,
        };
        table.route(&request)
    }

    fn service_of(decision: Option<Decision>) -> Option<String> {
        match decision? {
            Decision::Forward(forward) => Some(forward.target.service.name.clone()),
            Decision::Respond { status, .. } => Some(status.as_str().to_owned()),
        }
    }

    #[test]
    fn requests_find_their_gateway_listener_and_rule() {
        let entries = vec![
            entry(
                Match { path: PathMatch::Exact("/exact".into()), ..Match::default() },
                forward(vec![(1, service("exact"))]),
            ),
            entry(Match::default(), forward(vec![(1, service("rest"))])),
        ];
        let table = table(Hostname::parse(Some("*.example.com")), Hostname::Any, entries);
        let at = |local, host, path| service_of(route(&table, local, host, path));
        assert_eq!(at("192.168.235.1:80", "a.example.com", "/exact").as_deref(), Some("exact"));
        assert_eq!(at("192.168.235.1:80", "a.example.com", "/exact/no").as_deref(), Some("rest"));
        assert_eq!(at("192.168.235.1:80", "example.com", "/"), None, "no listener for the host");
        assert_eq!(at("192.168.235.1:8080", "a.example.com", "/"), None, "no listener on the port");
        assert_eq!(at("192.168.235.2:80", "a.example.com", "/"), None, "another address");
        assert!(matches!(table.listener("192.168.235.1:80".parse().unwrap()), Some(Listener::Http)));
        assert!(table.listener("192.168.235.1:81".parse().unwrap()).is_none());
        assert!(table.listener("[::ffff:192.168.235.1]:80".parse().unwrap()).is_some(), "a mapped address is the same");
    }

    #[test]
    fn weights_spread_requests_and_invalid_backends_answer_500() {
        let choices = vec![(70, service("a")), (90, service("b")), (90, service("zero")), (100, Choice::Invalid)];
        let entries = vec![entry(Match::default(), forward(choices))];
        let weighted = table(Hostname::Any, Hostname::Any, entries);
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..1000 {
            *counts.entry(service_of(route(&weighted, "192.168.235.1:80", "x", "/")).unwrap()).or_insert(0i32) += 1;
        }
        let counts: Vec<_> = counts.into_iter().collect();
        // Any 1,000 requests in a row: within a few of 700, 200 and 100.
        assert_eq!(counts.len(), 3, "{counts:?}");
        for ((name, count), (expected_name, expected)) in counts.iter().zip([("500", 100), ("a", 700), ("b", 200)]) {
            assert_eq!(name, expected_name);
            assert!((count - expected).abs() <= 5, "{counts:?}");
        }
        let none = table(Hostname::Any, Hostname::Any, vec![entry(Match::default(), forward(vec![]))]);
        assert_eq!(service_of(route(&none, "192.168.235.1:80", "x", "/")).as_deref(), Some("500"), "no backends");
    }
}
