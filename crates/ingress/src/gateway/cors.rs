//! The HTTPRoute `CORS` filter (pure): which `Origin`s a rule shares its responses with, and the
//! `Access-Control-*` fields of the answer to a preflight (`OPTIONS` with
//! `Access-Control-Request-Method`, answered by the gateway itself) and of a cross-origin
//! request's response (forwarded). A request from an origin that is not allowed gets no
//! `Access-Control-*` field (its preflight a bare 204), so the browser refuses it.

use hyper::Method;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use roadkeeper_cluster::gateway_api::httproutes::HTTPRouteRulesFiltersCors;

use crate::decision::Request;

/// The preflight cache lifetime when `maxAge` is not given (seconds), as the specification says.
const DEFAULT_MAX_AGE: i32 = 5;

/// A list of the filter (`allowMethods`, `allowHeaders`, `exposeHeaders`): `*`, or names joined
/// for the response field (none when empty).
#[derive(Clone, Debug, PartialEq)]
enum List {
    Any,
    Names(Option<HeaderValue>),
}

/// One allowed origin: `scheme://host:port`, the host possibly starting with `*` (any number of
/// labels, and at least one character, in its place).
#[derive(Clone, Debug, PartialEq)]
struct Origin {
    scheme: String,
    /// The host after the `*` when `wildcard`, else the whole host; lowercase.
    host: String,
    wildcard: bool,
    port: u16,
}

/// A rule's CORS policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Cors {
    /// `None`: every origin (`*`).
    origins: Option<Vec<Origin>>,
    methods: List,
    headers: List,
    expose: List,
    credentials: bool,
    max_age: HeaderValue,
}

/// What the policy does with a request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Not a cross-origin request (no `Origin`): as if there were no policy.
    Pass,
    /// A preflight: answer 204 with these fields (none when the origin is not allowed).
    Preflight(Vec<(HeaderName, HeaderValue)>),
    /// A cross-origin request: forward it, and add these fields to its response (none when the
    /// origin is not allowed).
    Actual(Vec<(HeaderName, HeaderValue)>),
}

impl Cors {
    /// The policy of a `cors` filter at `at`, or what in it cannot be served (naming the field).
    pub fn compile(spec: &HTTPRouteRulesFiltersCors, at: &str) -> Result<Self, String> {
        fn written(list: &Option<Vec<String>>) -> &[String] {
            list.as_deref().unwrap_or_default()
        }
        let origins = written(&spec.allow_origins);
        let origins = if origins.iter().any(|o| o == "*") {
            None
        } else {
            let parsed = origins.iter().enumerate().map(|(i, origin)| {
                Origin::parse(origin).ok_or(format!("{at}.allowOrigins[{i}]: {origin:?} is not scheme://host[:port]"))
            });
            Some(parsed.collect::<Result<_, _>>()?)
        };
        let max_age = spec.max_age.unwrap_or(DEFAULT_MAX_AGE);
        if max_age < 0 {
            return Err(format!("{at}.maxAge: {max_age} is negative"));
        }
        Ok(Self {
            origins,
            methods: List::of(written(&spec.allow_methods), &format!("{at}.allowMethods"))?,
            headers: List::of(written(&spec.allow_headers), &format!("{at}.allowHeaders"))?,
            expose: List::of(written(&spec.expose_headers), &format!("{at}.exposeHeaders"))?,
            credentials: spec.allow_credentials.unwrap_or(false),
            max_age: HeaderValue::from(max_age),
        })
    }

    /// What the policy does with `request`.
    pub fn decide(&self, request: &Request<'_>) -> Outcome {
        let Some(origin) = request.headers.get(header::ORIGIN) else { return Outcome::Pass };
        let preflight =
            *request.method == Method::OPTIONS && request.headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        let mut fields = Vec::new();
        if self.allows(origin) {
            self.common_fields(origin, &mut fields);
            if preflight {
                self.preflight_fields(request.headers, &mut fields);
            }
        }
        if preflight { Outcome::Preflight(fields) } else { Outcome::Actual(fields) }
    }

    fn allows(&self, origin: &HeaderValue) -> bool {
        let Some(origins) = &self.origins else { return true };
        let Some(origin) = origin.to_str().ok().and_then(Origin::parse).filter(|o| !o.wildcard) else {
            return false;
        };
        origins.iter().any(|allowed| allowed.covers(&origin))
    }

    /// The fields of every answer to an allowed origin: the origin (`*` only when every origin
    /// is allowed without credentials), credentials, and the exposed headers.
    fn common_fields(&self, origin: &HeaderValue, fields: &mut Vec<(HeaderName, HeaderValue)>) {
        if self.origins.is_none() && !self.credentials {
            fields.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")));
        } else {
            fields.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone()));
            fields.push((header::VARY, HeaderValue::from_static("Origin")));
        }
        if self.credentials {
            fields.push((header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true")));
        }
        match &self.expose {
            List::Names(Some(names)) => fields.push((header::ACCESS_CONTROL_EXPOSE_HEADERS, names.clone())),
            // With credentials `*` would be a header's name: expose nothing more.
            List::Any if !self.credentials => {
                fields.push((header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("*")));
            }
            _ => {}
        }
    }

    /// The fields only a preflight's answer has: methods and headers (a wildcard with
    /// credentials echoes what the request asks for, as `*` would not be read as a wildcard)
    /// and how long the answer may be cached.
    fn preflight_fields(&self, request: &HeaderMap, fields: &mut Vec<(HeaderName, HeaderValue)>) {
        let lists = [
            (&self.methods, header::ACCESS_CONTROL_ALLOW_METHODS, header::ACCESS_CONTROL_REQUEST_METHOD),
            (&self.headers, header::ACCESS_CONTROL_ALLOW_HEADERS, header::ACCESS_CONTROL_REQUEST_HEADERS),
        ];
        for (list, name, asked) in lists {
            let value = match list {
                List::Names(names) => names.clone(),
                List::Any if self.credentials => request.get(&asked).cloned(),
                List::Any => Some(HeaderValue::from_static("*")),
            };
            fields.extend(value.map(|value| (name, value)));
        }
        fields.push((header::ACCESS_CONTROL_MAX_AGE, self.max_age.clone()));
    }
}

impl List {
    /// The list `names` of field `at`.
    fn of(names: &[String], at: &str) -> Result<Self, String> {
        if names.iter().any(|name| name == "*") {
            return Ok(Self::Any);
        }
        if let Some((i, name)) = names.iter().enumerate().find(|(_, name)| HeaderName::try_from(name.as_str()).is_err())
        {
            return Err(format!("{at}[{i}]: {name:?} is not a token"));
        }
        let joined = names.join(", ");
        Ok(Self::Names((!joined.is_empty()).then(|| HeaderValue::try_from(joined).expect("tokens joined by ', '"))))
    }
}

impl Origin {
    /// `scheme://host[:port]` (the port defaulting to the scheme's), or `None`.
    fn parse(written: &str) -> Option<Self> {
        let (scheme, rest) = written.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        // The port follows the last `:` after an IPv6 literal's `]`, if any.
        let after = rest.rfind(']').map_or(0, |end| end + 1);
        let (host, port) = match rest[after..].find(':') {
            Some(colon) => (&rest[..after + colon], rest[after + colon + 1..].parse().ok().filter(|p| *p > 0)?),
            None => (rest, default_port),
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':');
        let (wildcard, host) = match host.strip_prefix('*') {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        if (host.is_empty() && !wildcard) || !host.chars().all(valid) {
            return None;
        }
        Some(Self { scheme, host: host.to_ascii_lowercase(), wildcard, port })
    }

    /// Whether this allowed origin covers the concrete `origin`.
    fn covers(&self, origin: &Origin) -> bool {
        self.scheme == origin.scheme
            && self.port == origin.port
            && if self.wildcard {
                origin.host.len() > self.host.len() && origin.host.ends_with(&self.host)
            } else {
                origin.host == self.host
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: serde_json::Value) -> Cors {
        Cors::compile(&serde_json::from_value(spec).unwrap(), "cors").unwrap()
    }

    /// The fields of the outcome, as `name: value` lines, or `pass`.
    fn decide(cors: &Cors, method: Method, headers: &[(&str, &str)]) -> (bool, Vec<String>) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(HeaderName::try_from(*name).unwrap(), HeaderValue::try_from(*value).unwrap());
        }
        let request = Request {
            local: "192.168.235.1:80".parse().unwrap(),
            tls: false,
            host: "a.example",
            path: "/",
            query: None,
            method: &method,
            headers: &map,
        };
        let lines = |fields: Vec<(HeaderName, HeaderValue)>| {
            fields.into_iter().map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())).collect()
        };
        match cors.decide(&request) {
            Outcome::Pass => (false, vec!["pass".into()]),
            Outcome::Preflight(fields) => (true, lines(fields)),
            Outcome::Actual(fields) => (false, lines(fields)),
        }
    }

    #[test]
    fn listed_origins_exact_and_wildcard_with_credentials() {
        let cors = policy(serde_json::json!({
            "allowOrigins": ["https://www.foo.com", "https://*.bar.com"], "allowMethods": ["GET", "OPTIONS"],
            "allowHeaders": ["x-header-1", "x-header-2"], "exposeHeaders": ["x-header-3"],
            "allowCredentials": true, "maxAge": 3600}));
        let preflight =
            |origin| decide(&cors, Method::OPTIONS, &[("origin", origin), ("access-control-request-method", "GET")]);
        let (is_preflight, fields) = preflight("https://xpto.www.bar.com");
        assert!(is_preflight);
        assert_eq!(
            fields,
            [
                "access-control-allow-origin: https://xpto.www.bar.com",
                "vary: Origin",
                "access-control-allow-credentials: true",
                "access-control-expose-headers: x-header-3",
                "access-control-allow-methods: GET, OPTIONS",
                "access-control-allow-headers: x-header-1, x-header-2",
                "access-control-max-age: 3600",
            ]
        );
        assert_eq!(preflight("https://www.foo.com:443").1[0], "access-control-allow-origin: https://www.foo.com:443");
        let v6 = policy(serde_json::json!({"allowOrigins": ["http://[fd00::1]", "http://[fd00::2]:8080"]}));
        let v6_origin = |origin| decide(&v6, Method::GET, &[("origin", origin)]).1.len();
        assert_eq!((v6_origin("http://[fd00::1]:80"), v6_origin("http://[fd00::2]:8080")), (2, 2));
        assert_eq!((v6_origin("http://[fd00::1]:8080"), v6_origin("http://[fd00::2]")), (0, 0));
        for refused in
            ["https://foobar.com", "https://bar.com", "http://www.foo.com", "https://www.foo.com:8443", "null"]
        {
            assert_eq!(preflight(refused), (true, vec![]), "{refused}");
        }
        let (is_preflight, fields) = decide(&cors, Method::GET, &[("origin", "https://www.foo.com")]);
        assert!(!is_preflight);
        assert_eq!(fields.len(), 4, "no methods, headers or max age on a response: {fields:?}");
        assert_eq!(decide(&cors, Method::GET, &[]), (false, vec!["pass".to_owned()]), "same origin");
        assert!(
            !decide(&cors, Method::OPTIONS, &[("origin", "https://www.foo.com")]).0,
            "OPTIONS without Access-Control-Request-Method is forwarded"
        );
    }

    #[test]
    fn wildcards_answer_star_without_credentials_and_echo_with_them() {
        let open = policy(serde_json::json!({"allowOrigins": ["*"], "allowMethods": ["*"], "allowHeaders": ["*"]}));
        let asked = [
            ("origin", "https://other.foo.com"),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-a, x-b"),
        ];
        assert_eq!(
            decide(&open, Method::OPTIONS, &asked).1,
            [
                "access-control-allow-origin: *",
                "access-control-allow-methods: *",
                "access-control-allow-headers: *",
                "access-control-max-age: 5"
            ]
        );
        let credentials = policy(serde_json::json!({"allowOrigins": ["*"], "allowMethods": ["*"],
            "allowHeaders": ["*"], "exposeHeaders": ["*"], "allowCredentials": true}));
        assert_eq!(
            decide(&credentials, Method::OPTIONS, &asked).1,
            [
                "access-control-allow-origin: https://other.foo.com",
                "vary: Origin",
                "access-control-allow-credentials: true",
                "access-control-allow-methods: PUT",
                "access-control-allow-headers: x-a, x-b",
                "access-control-max-age: 5"
            ]
        );
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let refused = |spec: serde_json::Value| {
            Cors::compile(&serde_json::from_value(spec).unwrap(), "spec.rules[0].filters[0].cors").unwrap_err()
        };
        assert_eq!(
            refused(serde_json::json!({"allowOrigins": ["ftp://x.example"]})),
            "spec.rules[0].filters[0].cors.allowOrigins[0]: \"ftp://x.example\" is not scheme://host[:port]"
        );
        assert!(refused(serde_json::json!({"allowHeaders": ["bad header"]})).contains("allowHeaders[0]"));
        assert!(refused(serde_json::json!({"allowOrigins": ["https://a.example:0"]})).contains("allowOrigins[0]"));
        assert!(refused(serde_json::json!({"maxAge": -1})).contains("maxAge"));
    }
}
