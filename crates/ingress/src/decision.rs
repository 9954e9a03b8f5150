//! What the proxy asks a router ([`Request`]) and what a router answers ([`Decision`]): the
//! interface between the route tables (Ingress, Gateway API) and the data plane.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode};

use crate::Target;

/// A request as a router sees it: where it arrived, its checked host and normalised path, and
/// the rest of its head.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The address and port the client connected to (a Gateway's address and a listener's port;
    /// an IPv4-mapped IPv6 address is given as IPv4).
    pub local: SocketAddr,
    /// Whether the connection is TLS (`https`), else plain (`http`).
    pub tls: bool,
    /// The host, lowercase and without its port ([`crate::host::request_host`]).
    pub host: &'a str,
    /// The path, decoded and normalised by [`crate::path::normalize`], without the query.
    pub path: &'a str,
    /// The query as received, without its `?`.
    pub query: Option<&'a str>,
    /// The method.
    pub method: &'a Method,
    /// The header fields as received (without `Host`).
    pub headers: &'a HeaderMap,
}

/// What a router decided for a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Forward to an endpoint of `target`.
    Forward(Forward),
    /// Answer without forwarding: a redirect (with its `Location`), a CORS preflight's answer or
    /// an error status (500 for a rule whose backends cannot be used, as the Gateway API asks).
    Respond {
        /// The route that decided it, for logs and metrics.
        route: Arc<str>,
        /// The status code.
        status: StatusCode,
        /// Header fields of the answer (`Location`, `Access-Control-*`).
        headers: Vec<(HeaderName, HeaderValue)>,
    },
}

/// A forwarded request: the backend, and what changes on the way.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    /// The backend Service and its ready endpoints.
    pub target: Arc<Target>,
    /// The path sent to the endpoint instead of the request's (a URL rewrite); the query is kept.
    /// Decoded, as [`Request::path`]: the proxy percent-encodes what a path cannot carry as it is
    /// (`%`, `?`, `#`, spaces, non-ASCII, ...).
    pub path: Option<String>,
    /// The `Host` sent to the endpoint instead of the request's (a URL rewrite).
    pub host: Option<HeaderValue>,
    /// Header edits, mirrors and timeouts of the matched rule and backend; `None`: none.
    pub actions: Option<Arc<Actions>>,
}

impl Forward {
    /// Forwarding to `target` unchanged.
    pub fn to(target: Arc<Target>) -> Self {
        Self { target, path: None, host: None, actions: None }
    }
}

/// What a rule does to a request besides choosing its backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Actions {
    /// Edits of the request's header fields, before it is forwarded.
    pub request_headers: HeaderEdits,
    /// Edits of the response's header fields, before it is returned.
    pub response_headers: HeaderEdits,
    /// Backends that get a copy of the request (headers only, body empty); their answers are
    /// dropped.
    pub mirrors: Vec<Arc<Target>>,
    /// Time from the request head to the response head, forwarding included; then 504.
    pub request_timeout: Option<Duration>,
    /// Time one endpoint has to answer (replaces the proxy's response timeout); then 504.
    pub backend_timeout: Option<Duration>,
}

/// Header edits in the order the Gateway API applies them: `set` replaces every field of the
/// name, `add` appends a field (the same as a comma-joined value), `remove` drops the name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeaderEdits {
    /// Fields replaced (or added when absent).
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Values appended.
    pub add: Vec<(HeaderName, HeaderValue)>,
    /// Fields removed.
    pub remove: Vec<HeaderName>,
}

impl HeaderEdits {
    /// True when there is nothing to edit.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    /// Applies the edits to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

/// What a listener address serves: plain HTTP, or HTTPS with the certificates chosen by SNI.
#[derive(Clone, Debug)]
pub enum Listener {
    /// Plain HTTP/1.1 (and HTTP/2 with prior knowledge).
    Http,
    /// TLS, then HTTP/1.1 or HTTP/2 by ALPN; the configuration resolves certificates by SNI.
    Https(Arc<tokio_rustls::rustls::ServerConfig>),
}

/// Which of a shared port's addresses serve what: a Gateway's listeners live on its own address,
/// so one socket bound to the wildcard address serves many Gateways.
pub trait Listeners: Send + Sync + 'static {
    /// What connections to `local` get; `None` closes them at once.
    fn listener(&self, local: SocketAddr) -> Option<Listener>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_edits_set_then_add_then_remove() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.insert("x-b", HeaderValue::from_static("b"));
        headers.insert("x-gone", HeaderValue::from_static("g"));
        headers.append("x-d", HeaderValue::from_static("1"));
        headers.append("x-d", HeaderValue::from_static("2"));
        let value = |v: &'static str| HeaderValue::from_static(v);
        let name = |n: &'static str| HeaderName::from_static(n);
        let edits = HeaderEdits {
            set: vec![(name("x-a"), value("set")), (name("x-new"), value("n"))],
            add: vec![(name("x-b"), value("more")), (name("x-c"), value("c")), (name("x-d"), value("3"))],
            remove: vec![name("x-gone")],
        };
        assert!(!edits.is_empty());
        edits.apply(&mut headers);
        let all = |n: &str| headers.get_all(n).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>();
        assert_eq!(all("x-a"), ["set"]);
        assert_eq!(all("x-new"), ["n"]);
        assert_eq!(all("x-b"), ["b", "more"]);
        assert_eq!(all("x-c"), ["c"]);
        assert_eq!(all("x-d"), ["1", "2", "3"], "every field of the name kept");
        assert!(all("x-gone").is_empty());
        assert!(HeaderEdits::default().is_empty());
    }
}
