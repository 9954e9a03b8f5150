//! The HTTPRoute filters that rewrite a request's URL: `RequestRedirect` (the `Location` it
//! answers with) and `URLRewrite` (the path and host it forwards).

use hyper::StatusCode;
use hyper::header::HeaderValue;

use super::matching::PathMatch;
use crate::decision::Request;

/// How a filter replaces the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathModifier {
    /// `ReplaceFullPath`: this path.
    Full(String),
    /// `ReplacePrefixMatch`: the part the rule's `PathPrefix` matched becomes this.
    Prefix(String),
}

impl PathModifier {
    /// The path `path` becomes, when the rule matched it with `matched`. A prefix replacement
    /// keeps what followed the prefix (`/foo` → `/bar` turns `/foo/x` into `/bar/x`, and with `/`
    /// into `/x`); after an `Exact` match it replaces the whole path.
    pub fn apply(&self, path: &str, matched: &PathMatch) -> String {
        match (self, matched) {
            (Self::Full(full), _) => full.clone(),
            (Self::Prefix(replacement), PathMatch::Prefix(prefix)) => {
                let rest = path.get(prefix.len()..).unwrap_or_default();
                let joined = format!("{}{rest}", replacement.trim_end_matches('/'));
                if joined.is_empty() { "/".to_owned() } else { joined }
            }
            (Self::Prefix(replacement), PathMatch::Exact(_)) => replacement.clone(),
        }
    }
}

/// A `RequestRedirect` filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https`; the request's when `None`.
    pub scheme: Option<String>,
    /// The request's host when `None`.
    pub hostname: Option<String>,
    /// The port; when `None`, the scheme's well-known port if the filter names a scheme, else the
    /// listener's port.
    pub port: Option<u16>,
    /// The path; the request's when `None`.
    pub path: Option<PathModifier>,
    /// 301, 302 (the default), 303, 307 or 308.
    pub status: StatusCode,
}

impl Redirect {
    /// The `Location` for `request`, which the rule matched with `matched`. The port is left out
    /// when it is the scheme's well-known one; the query is kept.
    pub fn location(&self, request: &Request<'_>, matched: &PathMatch) -> Option<HeaderValue> {
        let scheme = self.scheme.as_deref().unwrap_or(if request.tls { "https" } else { "http" });
        let port = match (self.port, &self.scheme) {
            (Some(port), _) => port,
            (None, Some(scheme)) => well_known_port(scheme).unwrap_or(request.local.port()),
            (None, None) => request.local.port(),
        };
        let host = self.hostname.as_deref().unwrap_or(request.host);
        let mut location = format!("{scheme}://");
        if host.contains(':') {
            location.push_str(&format!("[{host}]"));
        } else {
            location.push_str(host);
        }
        if well_known_port(scheme) != Some(port) {
            location.push_str(&format!(":{port}"));
        }
        match &self.path {
            Some(modifier) => location.push_str(&modifier.apply(request.path, matched)),
            None => location.push_str(request.path),
        }
        if let Some(query) = request.query {
            location.push('?');
            location.push_str(query);
        }
        HeaderValue::try_from(location).ok()
    }
}

fn well_known_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use hyper::Method;
    use hyper::header::HeaderMap;

    use super::*;

    #[test]
    fn prefix_replacement_keeps_the_rest() {
        let prefix = PathMatch::prefix("/prefix/one");
        let to = |replacement: &str, path: &str| PathModifier::Prefix(replacement.into()).apply(path, &prefix);
        assert_eq!(to("/one", "/prefix/one/two"), "/one/two");
        assert_eq!(to("/one", "/prefix/one"), "/one");
        assert_eq!(to("/one/", "/prefix/one/two"), "/one/two");
        assert_eq!(to("/", "/prefix/one/two"), "/two");
        assert_eq!(to("/", "/prefix/one"), "/");
        assert_eq!(to("/", "/prefix/one/"), "/");
        let root = PathMatch::prefix("/");
        assert_eq!(PathModifier::Prefix("/api".into()).apply("/x/y", &root), "/api/x/y");
        assert_eq!(PathModifier::Full("/full".into()).apply("/prefix/one/two", &prefix), "/full");
        let exact = PathMatch::Exact("/a".into());
        assert_eq!(PathModifier::Prefix("/b".into()).apply("/a", &exact), "/b");
    }

    #[test]
    fn locations_follow_the_port_and_scheme_rules() {
        let headers = HeaderMap::new();
        let at = |local: &str, tls: bool, query: Option<&'static str>| Request {
            local: local.parse().unwrap(),
            tls,
            host: "example.org",
            path: "/a/b",
            query,
            method: &Method::GET,
            headers: &headers,
        };
        let any = PathMatch::prefix("/");
        let redirect = |scheme: Option<&str>, hostname: Option<&str>, port: Option<u16>| Redirect {
            scheme: scheme.map(Into::into),
            hostname: hostname.map(Into::into),
            port,
            path: None,
            status: StatusCode::FOUND,
        };
        let location =
            |r: Redirect, request: Request<'_>| r.location(&request, &any).unwrap().to_str().unwrap().to_owned();
        let plain = at("10.0.0.1:80", false, Some("x=1"));
        assert_eq!(location(redirect(None, Some("other.example"), None), plain), "http://other.example/a/b?x=1");
        assert_eq!(location(redirect(Some("https"), None, None), plain), "https://example.org/a/b?x=1");
        assert_eq!(location(redirect(Some("https"), None, Some(8443)), plain), "https://example.org:8443/a/b?x=1");
        assert_eq!(location(redirect(None, None, Some(443)), plain), "http://example.org:443/a/b?x=1");
        let odd_port = at("10.0.0.1:8080", false, None);
        assert_eq!(
            location(redirect(None, None, None), odd_port),
            "http://example.org:8080/a/b",
            "the listener's port"
        );
        assert_eq!(
            location(redirect(Some("http"), None, None), odd_port),
            "http://example.org/a/b",
            "the scheme's port"
        );
        let tls = at("10.0.0.1:443", true, None);
        assert_eq!(location(redirect(None, None, None), tls), "https://example.org/a/b");
        assert_eq!(location(redirect(Some("http"), None, None), tls), "http://example.org/a/b");
        let with_path = Redirect { path: Some(PathModifier::Full("/new".into())), ..redirect(None, None, None) };
        assert_eq!(location(with_path, plain), "http://example.org/new?x=1");
    }
}
