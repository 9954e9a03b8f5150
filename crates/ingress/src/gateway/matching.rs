//! HTTPRoute matches (path, method, header, query parameter) and the precedence between them
//! (`HTTPRouteRule.matches` in the Gateway API): an `Exact` path first, then the longest
//! `PathPrefix`, then a method match, then the most header matches, then the most query
//! parameter matches; ties go to the oldest route, then the route first by `namespace/name`,
//! then to the rule and match written first.

use std::cmp::Reverse;

use hyper::Method;
use hyper::header::{HeaderMap, HeaderName};
use roadkeeper_cluster::NamespacedName;
use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::decision::Request;

/// How a match tests the path (normalised, case-sensitive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    /// The whole path.
    Exact(String),
    /// The path, or the path followed by `/...`: element by element, so `/foo` covers `/foo`,
    /// `/foo/` and `/foo/bar`, not `/foobar`. Held without trailing slashes (`/` is empty).
    Prefix(String),
}

impl PathMatch {
    /// A `PathPrefix` as written (`/foo/` is `/foo`).
    pub fn prefix(written: &str) -> Self {
        Self::Prefix(written.trim_end_matches('/').to_owned())
    }

    /// Whether `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(exact) => path == exact,
            Self::Prefix(prefix) => {
                path.strip_prefix(prefix.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
        }
    }
}

/// One `HTTPRouteMatch`: every test must pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The path test (`PathPrefix /` when not written).
    pub path: PathMatch,
    /// The method, if tested.
    pub method: Option<Method>,
    /// Header fields (name compared case-insensitively) and the exact value one of them must have.
    pub headers: Vec<(HeaderName, String)>,
    /// Query parameters (name exact) and the exact value their first occurrence must have,
    /// percent-decoded.
    pub query: Vec<(String, String)>,
}

impl Default for Match {
    fn default() -> Self {
        Self { path: PathMatch::Prefix(String::new()), method: None, headers: Vec::new(), query: Vec::new() }
    }
}

impl Match {
    /// Whether `request` passes every test.
    pub fn matches(&self, request: &Request<'_>) -> bool {
        self.path.matches(request.path)
            && self.method.as_ref().is_none_or(|method| method == request.method)
            && self.headers.iter().all(|(name, value)| header_is(request.headers, name, value))
            && self.query.iter().all(|(name, value)| query_value(request.query, name).as_deref() == Some(value))
    }
}

fn header_is(headers: &HeaderMap, name: &HeaderName, value: &str) -> bool {
    headers.get_all(name).iter().any(|field| field.as_bytes() == value.as_bytes())
}

/// The first value of query parameter `name`, percent-decoded (`+` is a space).
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes()).find(|(key, _)| key == name).map(|(_, value)| value.into_owned())
}

/// Where a route stands among the routes of a listener when their matches tie: older first
/// (a route without a creation time counts as oldest), then by `namespace/name`.
pub type RouteAge = (Option<Time>, NamespacedName);

/// The precedence of one match of one rule of one route: ordered so that the first of a sorted
/// list is the one that wins.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Precedence {
    /// `Exact` paths first (false sorts first).
    not_exact: bool,
    /// Then the longest path.
    path_length: Reverse<usize>,
    /// Then a method match.
    no_method: bool,
    /// Then the most header matches.
    headers: Reverse<usize>,
    /// Then the most query parameter matches.
    query: Reverse<usize>,
    /// Then the oldest route, by name.
    route: RouteAge,
    /// Then the rule, then the match, as written.
    rule: usize,
    index: usize,
}

impl Precedence {
    /// The precedence of `matched`, match `index` of rule `rule` of the route of age `route`.
    pub fn of(matched: &Match, route: RouteAge, rule: usize, index: usize) -> Self {
        let (not_exact, length) = match &matched.path {
            PathMatch::Exact(path) => (false, path.len()),
            PathMatch::Prefix(prefix) => (true, prefix.len()),
        };
        Self {
            not_exact,
            path_length: Reverse(length),
            no_method: matched.method.is_none(),
            headers: Reverse(matched.headers.len()),
            query: Reverse(matched.query.len()),
            route,
            rule,
            index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(path: &'a str, query: Option<&'a str>, method: &'a Method, headers: &'a HeaderMap) -> Request<'a> {
        Request {
            local: "127.0.0.1:80".parse().unwrap(),
            tls: false,
            host: "example.com",
            path,
            query,
            method,
            headers,
        }
    }

    #[test]
    fn prefixes_match_element_by_element() {
        let prefix = PathMatch::prefix("/foo/");
        assert_eq!(prefix, PathMatch::Prefix("/foo".into()));
        assert!(prefix.matches("/foo") && prefix.matches("/foo/") && prefix.matches("/foo/bar"));
        assert!(!prefix.matches("/foobar") && !prefix.matches("/fo") && !prefix.matches("/"));
        let root = PathMatch::prefix("/");
        assert!(root.matches("/") && root.matches("/anything"));
        let exact = PathMatch::Exact("/foo".into());
        assert!(exact.matches("/foo") && !exact.matches("/foo/") && !exact.matches("/foo/bar"));
    }

    #[test]
    fn every_test_of_a_match_must_pass() {
        let mut headers = HeaderMap::new();
        headers.append("version", "one".parse().unwrap());
        headers.append("version", "two".parse().unwrap());
        headers.insert("color", "Blue".parse().unwrap());
        let m = Match {
            path: PathMatch::prefix("/api"),
            method: Some(Method::POST),
            headers: vec![(HeaderName::from_static("version"), "two".into())],
            query: vec![("animal".into(), "blue whale".into())],
        };
        let q = Some("animal=blue+whale&animal=dolphin");
        assert!(m.matches(&request("/api/x", q, &Method::POST, &headers)));
        assert!(!m.matches(&request("/api/x", q, &Method::GET, &headers)), "method");
        assert!(!m.matches(&request("/apix", q, &Method::POST, &headers)), "path");
        assert!(!m.matches(&request("/api", Some("animal=dolphin&animal=blue%20whale"), &Method::POST, &headers)));
        assert!(m.matches(&request("/api", Some("animal=blue%20whale"), &Method::POST, &headers)));
        assert!(!m.matches(&request("/api", None, &Method::POST, &headers)), "query");
        let case = Match { headers: vec![(HeaderName::from_static("color"), "blue".into())], ..Match::default() };
        assert!(!case.matches(&request("/", None, &Method::GET, &headers)), "values are case-sensitive");
        assert!(Match::default().matches(&request("/whatever", None, &Method::DELETE, &HeaderMap::new())));
    }

    #[test]
    fn precedence_follows_the_spec_order() {
        let age = |name: &str| (None, NamespacedName::new("ns", name));
        let exact = Match { path: PathMatch::Exact("/a".into()), ..Match::default() };
        let long = Match { path: PathMatch::prefix("/a/b"), ..Match::default() };
        let short = Match { path: PathMatch::prefix("/a"), ..Match::default() };
        let method = Match { method: Some(Method::GET), ..short.clone() };
        let header = Match { headers: vec![(HeaderName::from_static("x"), "1".into())], ..method.clone() };
        let query = Match { query: vec![("q".into(), "1".into())], ..header.clone() };
        let mut ranked = [
            Precedence::of(&short, age("b"), 1, 0),
            Precedence::of(&short, age("b"), 0, 1),
            Precedence::of(&short, age("a"), 5, 0),
            Precedence::of(&header, age("z"), 0, 0),
            Precedence::of(&method, age("z"), 0, 0),
            Precedence::of(&query, age("z"), 0, 0),
            Precedence::of(&long, age("z"), 0, 0),
            Precedence::of(&exact, age("z"), 0, 0),
        ];
        ranked.sort();
        let order: Vec<_> =
            ranked.iter().map(|p| (p.route.1.name.as_str(), p.rule, p.index, p.path_length.0)).collect();
        assert_eq!(
            order,
            [
                ("z", 0, 0, 2),
                ("z", 0, 0, 4),
                ("z", 0, 0, 2),
                ("z", 0, 0, 2),
                ("z", 0, 0, 2),
                ("a", 5, 0, 2),
                ("b", 0, 1, 2),
                ("b", 1, 0, 2)
            ]
        );
        assert!(!ranked[0].not_exact, "exact first");
        assert!(ranked[1].not_exact && ranked[1].path_length.0 == 4, "then the longest prefix");
        assert_eq!(ranked[2].query.0, 1, "query beats no query at equal headers");
        assert_eq!(ranked[3].headers.0, 1);
        assert!(!ranked[4].no_method);
        let at = |second| Some(Time(roadkeeper_cluster::k8s_openapi::jiff::Timestamp::from_second(second).unwrap()));
        let older = Precedence::of(&short, (at(1), NamespacedName::new("ns", "z")), 0, 0);
        let newer = Precedence::of(&short, (at(2), NamespacedName::new("ns", "a")), 0, 0);
        assert!(older < newer, "the older route wins whatever its name");
        assert!(Precedence::of(&short, age("z"), 0, 0) < older, "no creation time counts as oldest");
    }
}
