//! The API server's format checks for names, labels, port names and addresses
//! (`k8s.io/apimachinery/pkg/util/validation`, `ValidateEndpointIP`), as pure functions: `Ok`, or
//! why the value is refused.

use std::net::IpAddr;

/// Longest DNS-1123 / DNS-1035 label, and label name or value.
const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain.
const SUBDOMAIN_MAX: usize = 253;
/// Longest IANA service name (port name).
const PORT_NAME_MAX: usize = 15;

/// A check's verdict: why the value is refused.
pub(crate) type Check = Result<(), String>;

fn too_long(max: usize) -> String {
    format!("must be no more than {max} characters")
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` of any length.
fn label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// A lowercase RFC 1123 label: namespaces, Service port names, endpoint hostnames.
pub(crate) fn dns1123_label(s: &str) -> Check {
    if s.len() > LABEL_MAX {
        return Err(too_long(LABEL_MAX));
    }
    if !label_chars(s) {
        return Err("must be a lowercase RFC 1123 label: lowercase letters, digits and '-', starting and ending \
                    with a letter or digit"
            .into());
    }
    Ok(())
}

/// An RFC 1035 label: Service names (a DNS-1123 label that starts with a letter).
pub(crate) fn dns1035_label(s: &str) -> Check {
    if s.len() > LABEL_MAX {
        return Err(too_long(LABEL_MAX));
    }
    if !label_chars(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        return Err("must be an RFC 1035 label: lowercase letters, digits and '-', starting with a letter and \
                    ending with a letter or digit"
            .into());
    }
    Ok(())
}

/// A lowercase RFC 1123 subdomain: most object names, node names, host names.
pub(crate) fn dns1123_subdomain(s: &str) -> Check {
    if s.len() > SUBDOMAIN_MAX {
        return Err(too_long(SUBDOMAIN_MAX));
    }
    if !s.split('.').all(label_chars) {
        return Err("must be a lowercase RFC 1123 subdomain: dot-separated labels of lowercase letters, digits and \
                    '-', each starting and ending with a letter or digit"
            .into());
    }
    Ok(())
}

/// `*.` followed by a DNS-1123 subdomain: wildcard Ingress hosts.
pub(crate) fn wildcard_subdomain(s: &str) -> Check {
    match s.strip_prefix("*.") {
        Some(rest) if s.len() <= SUBDOMAIN_MAX && dns1123_subdomain(rest).is_ok() => Ok(()),
        _ => Err("must be '*.' followed by a lowercase RFC 1123 subdomain".into()),
    }
}

/// A domain-prefixed path of at most `max` characters (`example.com/ingress`): IngressClass and
/// GatewayClass controllers.
pub(crate) fn domain_prefixed_path(s: &str, max: usize) -> Check {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    let valid = s.len() <= max
        && s.split_once('/').is_some_and(|(domain, path)| {
            dns1123_subdomain(domain).is_ok() && !path.is_empty() && path.chars().all(path_char)
        });
    if valid { Ok(()) } else { Err("must be a domain-prefixed path".into()) }
}

/// An IANA service name: container port names, named target ports, Ingress backend port names.
pub(crate) fn port_name(s: &str) -> Check {
    if s.len() > PORT_NAME_MAX {
        return Err(too_long(PORT_NAME_MAX));
    }
    let b = s.as_bytes();
    if b.is_empty() || !b.iter().all(|&c| is_lower_alnum(c) || c == b'-') {
        return Err("must contain only lowercase letters, digits and '-'".into());
    }
    if !b.iter().any(u8::is_ascii_lowercase) {
        return Err("must contain at least one letter (a-z)".into());
    }
    if s.contains("--") {
        return Err("must not contain consecutive hyphens".into());
    }
    if b[0] == b'-' || b[b.len() - 1] == b'-' {
        return Err("must not begin or end with a hyphen".into());
    }
    Ok(())
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?` within 63 characters, non-empty unless
/// `empty_ok`: label values (empty allowed) and the name part of qualified names.
fn label_name(s: &str, empty_ok: bool) -> Check {
    if s.len() > LABEL_MAX {
        return Err(too_long(LABEL_MAX));
    }
    let b = s.as_bytes();
    if b.is_empty() {
        return if empty_ok { Ok(()) } else { Err("must not be empty".into()) };
    }
    let alnum = |c: &u8| c.is_ascii_alphanumeric();
    if !alnum(&b[0]) || !alnum(&b[b.len() - 1]) || !b.iter().all(|c| alnum(c) || matches!(c, b'-' | b'_' | b'.')) {
        return Err(
            "must consist of letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into()
        );
    }
    Ok(())
}

/// A label value: empty, or a label name (`Err`: why not, as the API server words it).
pub fn label_value(s: &str) -> Result<(), String> {
    label_name(s, true)
}

/// A qualified name (label and annotation keys): `[prefix/]name`, the prefix a DNS-1123
/// subdomain (`Err`: why not, as the API server words it).
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must not be empty".into());
        }
        dns1123_subdomain(prefix).map_err(|e| format!("prefix part {e}"))?;
    }
    label_name(name, false).map_err(|e| format!("name part {e}"))
}

/// An address that may receive Service traffic (`ValidateEndpointIP`): endpoint addresses and
/// externalIPs; also ClusterIPs, which the API server only allocates from service ranges.
pub(crate) fn endpoint_ip(ip: &IpAddr) -> Check {
    let (unspecified, loopback, link_local, link_local_multicast) = match ip {
        IpAddr::V4(a) => (a.is_unspecified(), a.is_loopback(), a.is_link_local(), a.octets()[..3] == [224, 0, 0]),
        IpAddr::V6(a) => {
            let s = a.segments();
            (a.is_unspecified(), a.is_loopback(), s[0] & 0xffc0 == 0xfe80, s[0] & 0xff0f == 0xff02)
        }
    };
    let reason = if unspecified {
        "may not be unspecified (0.0.0.0, ::)"
    } else if loopback {
        "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    } else if link_local {
        "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    } else if link_local_multicast {
        "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
    } else {
        return Ok(());
    };
    Err(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        for ok in ["a", "web-1", "0a", &"a".repeat(63)] {
            assert_eq!(dns1123_label(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a\nb", &"a".repeat(64)] {
            assert!(dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1035_label("web").is_ok() && dns1035_label("1web").is_err());
        assert!(dns1123_subdomain("a.b-c.d").is_ok());
        for bad in ["a..b", ".a", "a.", "a/b", "a b", &format!("{}.a", "a".repeat(253))] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
        assert!(wildcard_subdomain("*.example.com").is_ok());
        assert!(wildcard_subdomain("*example.com").is_err() && wildcard_subdomain("a.*.com").is_err());
        assert_eq!(domain_prefixed_path("roadkeeper.dev/gateway", 253), Ok(()));
        for bad in ["roadkeeper", "roadkeeper.dev/", "Roadkeeper.dev/x", "a.dev/x y", "a.dev/xx"] {
            assert!(domain_prefixed_path(bad, 7).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn port_names_are_iana_service_names() {
        for ok in ["http", "h2c", "a-b", "web-metrics-01"] {
            assert_eq!(port_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "80", "-http", "http-", "a--b", "HTTP", "http_x", "sixteen-chars-xx", "a\nb"] {
            assert!(port_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        for ok in ["", "a", "A.b_c-1", &"x".repeat(63)] {
            assert_eq!(label_value(ok), Ok(()), "{ok:?}");
        }
        for bad in ["-a", "a-", "a b", "a\"b", "a\n", &"x".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
        for ok in ["app", "kubernetes.io/service-name", "a.b/C_d"] {
            assert_eq!(qualified_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "/a", "a/", "A_/x", "a/b/c", "a b"] {
            assert!(qualified_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn addresses_that_cannot_receive_service_traffic() {
        for bad in ["0.0.0.0", "127.0.0.1", "169.254.1.1", "224.0.0.251", "::", "::1", "fe80::1", "ff02::fb"] {
            assert!(endpoint_ip(&bad.parse().unwrap()).is_err(), "{bad}");
        }
        for ok in ["10.244.0.5", "192.168.1.1", "fd00::1", "2001:db8::1", "224.0.1.1", "ff05::1"] {
            assert_eq!(endpoint_ip(&ok.parse().unwrap()), Ok(()), "{ok}");
        }
    }
}
