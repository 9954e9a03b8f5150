//! What `roadkeeper trace` follows: an `http://` or `https://` URL, and the `Host` header given
//! with `-H` (curl's form), which the Ingress routes by instead of the URL's host.

use std::net::IpAddr;

use roadkeeper_ingress::host::route_name;
use serde::Serialize;

use crate::Error;

/// A request to follow, from its URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Request {
    /// The URL as given.
    pub url: String,
    /// `http` or `https`.
    pub scheme: String,
    /// The host as written (lowercase, IPv6 without brackets): the `Host` header's name.
    pub host: String,
    /// The host as an address, when it is one (no DNS lookup then).
    pub address: Option<IpAddr>,
    /// The port (80 or 443 unless given).
    pub port: u16,
    /// The path and query (`/` when empty).
    pub path: String,
    /// The `Host` header given with `-H`, as given; `None`: the URL's host.
    pub host_header: Option<String>,
    /// The host the Ingress routes by: the `Host` header's name (lowercase, without its port),
    /// else the URL's host.
    pub routed_host: String,
}

impl Request {
    /// Parses `url` (`http://host[:port]/path`, `https://...`; a bare `host/path` is `http`).
    pub fn parse(url: &str) -> Result<Request, Error> {
        let fail = |message: &str| Error::Url { url: url.to_owned(), message: message.to_owned() };
        let full = if url.contains("://") { url.to_owned() } else { format!("http://{url}") };
        let uri: http::Uri = full.parse().map_err(|err: http::uri::InvalidUri| fail(&err.to_string()))?;
        let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(fail("only http:// and https:// are traced")),
        };
        let authority = uri.authority().ok_or_else(|| fail("no host"))?;
        if authority.as_str().contains('@') {
            return Err(fail("user information is not traced"));
        }
        let raw = authority.host();
        let host = match raw.strip_prefix('[') {
            Some(inner) => inner
                .strip_suffix(']')
                .filter(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
                .ok_or_else(|| fail("a host in brackets must be an IPv6 address"))?,
            None if raw.contains(['[', ']', ':']) => return Err(fail("brackets or a colon in the host")),
            None => raw,
        }
        .to_ascii_lowercase();
        if host.is_empty() {
            return Err(fail("no host"));
        }
        // What follows the host: nothing, or `:PORT` (`Authority::port_u16` is silent about a
        // port that is no number).
        let after_host = &authority.as_str()[raw.len()..];
        let port = match after_host.strip_prefix(':') {
            None if after_host.is_empty() => default_port,
            Some(text) => match text.parse::<u16>() {
                Ok(port) if port != 0 => port,
                _ => return Err(fail("the port must be a number from 1 to 65535")),
            },
            None => return Err(fail("no host")),
        };
        let mut path = if uri.path().is_empty() { "/".to_owned() } else { uri.path().to_owned() };
        if let Some(query) = uri.query() {
            path = format!("{path}?{query}");
        }
        let routed_host = host.clone();
        Ok(Request {
            url: url.to_owned(),
            address: host.parse().ok(),
            scheme,
            host,
            port,
            path,
            host_header: None,
            routed_host,
        })
    }

    /// The request with the headers of `-H`/`--header` (`NAME: VALUE`, as curl takes them).
    /// Only `Host` is taken, once: no station of the road matches on other headers (the Ingress
    /// routes by host and path). A value that is no `host[:port]` is refused, as the Ingress
    /// controller refuses it.
    pub fn with_headers(mut self, headers: &[String]) -> Result<Request, Error> {
        for header in headers {
            let fail = |message: &str| Error::Header { header: header.clone(), message: message.to_owned() };
            let (name, value) = header.split_once(':').ok_or_else(|| fail("not NAME: VALUE"))?;
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
                return Err(fail("not NAME: VALUE (the name is no header name)"));
            }
            if !name.eq_ignore_ascii_case("host") {
                return Err(fail(
                    "only the Host header is traced (the Ingress routes by host and path; no station matches \
                     other headers)",
                ));
            }
            if self.host_header.is_some() {
                return Err(fail("a second Host header (a request has one)"));
            }
            let value = value.trim_matches([' ', '\t']);
            if value.is_empty() {
                return Err(fail("an empty Host"));
            }
            let routed = route_name(value).map_err(|err| fail(&err.to_string()))?;
            self.routed_host = routed.into_owned();
            self.host_header = Some(value.to_owned());
        }
        Ok(self)
    }

    /// The path without its query, as the Ingress routes it.
    pub fn route_path(&self) -> &str {
        self.path.split('?').next().unwrap_or("/")
    }
}

/// The fuzz target's checks (`fuzz/`): no panic, and a parsed request is well formed (a known
/// scheme, a lowercase host without brackets, a port, a path from `/`) and parses again, from
/// its parts, to the same request.
pub fn check(data: &[u8]) {
    let Ok(url) = std::str::from_utf8(data) else { return };
    let Ok(request) = Request::parse(url) else { return };
    assert!(request.scheme == "http" || request.scheme == "https", "{request:?}");
    assert!(!request.host.is_empty() && !request.host.contains(['[', ']', '/', '@']), "{request:?}");
    assert_eq!(request.host, request.host.to_ascii_lowercase());
    assert!(request.port != 0 && request.path.starts_with('/'), "{request:?}");
    assert_eq!(request.address, request.host.parse().ok());
    assert_eq!((&request.routed_host, &request.host_header), (&request.host, &None));
    let host = if request.host.contains(':') { format!("[{}]", request.host) } else { request.host.clone() };
    let again = Request::parse(&format!("{}://{host}:{}{}", request.scheme, request.port, request.path))
        .unwrap_or_else(|err| panic!("{request:?} does not parse again: {err}"));
    assert_eq!(
        (&again.scheme, &again.host, again.port, &again.path),
        (&request.scheme, &request.host, request.port, &request.path)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_seeds_pass_the_checks() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/url");
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            assert!(std::panic::catch_unwind(|| check(&bytes)).is_ok(), "seed {} fails", path.display());
            seeds += 1;
        }
        assert!(seeds >= 10, "{seeds} seeds in {}", dir.display());
    }

    #[test]
    fn urls_give_host_port_and_path() {
        let r = Request::parse("http://Hello.Default.svc.cluster.local/a/b?x=1").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str(), r.address),
            ("hello.default.svc.cluster.local", 80, "/a/b?x=1", None)
        );
        assert_eq!(r.route_path(), "/a/b");
        let r = Request::parse("https://[fd00::1]:8443").unwrap();
        assert_eq!((r.host.as_str(), r.port, r.path.as_str()), ("fd00::1", 8443, "/"));
        assert_eq!(r.address, Some("fd00::1".parse().unwrap()));
        let r = Request::parse("10.96.0.100/hello").unwrap();
        assert_eq!((r.scheme.as_str(), r.port, r.path.as_str()), ("http", 80, "/hello"));
    }

    #[test]
    fn a_host_header_routes_the_request_and_keeps_the_address() {
        let headers = ["host:  Web.Example.com:8080 ".to_owned()];
        let r = Request::parse("http://192.168.77.200/a").unwrap().with_headers(&headers).unwrap();
        assert_eq!(r.address, Some("192.168.77.200".parse().unwrap()));
        assert_eq!((r.host.as_str(), r.port), ("192.168.77.200", 80));
        assert_eq!(r.host_header.as_deref(), Some("Web.Example.com:8080"));
        assert_eq!(r.routed_host, "web.example.com");
        let r = Request::parse("http://hello/").unwrap().with_headers(&[]).unwrap();
        assert_eq!((r.routed_host.as_str(), r.host_header), ("hello", None));
    }

    #[test]
    fn malformed_or_other_headers_are_refused_by_name() {
        for (headers, message) in [
            (&["Host web.example.com"][..], "-H \"Host web.example.com\": not NAME: VALUE"),
            (&[": web"], "-H \": web\": not NAME: VALUE"),
            (&["Ho st: web"], "the name is no header name"),
            (&["Host:"], "-H \"Host:\": an empty Host"),
            (&["Host: \t "], "an empty Host"),
            (&["Host: a b"], "-H \"Host: a b\": malformed host \"a b\""),
            (&["Host: web\r\nX-Evil: 1"], "malformed host"),
            (&["Host: web:http"], "malformed host"),
            (&["Host: a..b"], "malformed host"),
            (&["Host: a", "host: b"], "-H \"host: b\": a second Host header"),
            (&["X-Forwarded-For: 1.2.3.4"], "only the Host header is traced"),
            (&["Accept: */*"], "-H \"Accept: */*\": only the Host header"),
        ] {
            let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
            let err = Request::parse("http://10.0.0.1/").unwrap().with_headers(&headers).unwrap_err().to_string();
            assert!(err.contains(message), "{headers:?}: {err}");
        }
    }

    #[test]
    fn other_schemes_and_broken_urls_are_refused_by_name() {
        for (url, message) in [
            ("ftp://a/", "only http:// and https://"),
            ("http://", "URL \"http://\""),
            ("http://u:p@a/", "user information"),
            ("http://a:0/", "port must be a number"),
            ("ttp:o?Hhttps", "port must be a number"),
            ("http://a b/", "URL \"http://a b/\""),
            ("htt[fd00::1]:8443/a", "brackets or a colon in the host"),
            ("http://[fd00::zz]/", "must be an IPv6 address"),
        ] {
            let err = Request::parse(url).unwrap_err().to_string();
            assert!(err.contains(message), "{url}: {err}");
        }
    }
}
