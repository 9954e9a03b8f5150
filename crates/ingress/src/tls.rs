//! Server certificates chosen by SNI, swapped atomically when the Ingresses' TLS Secrets change.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The certificates of every TLS host, looked up by the client's SNI: the exact host first, then
/// a one-label wildcard (`*.example.com` covers `a.example.com`, not `a.b.example.com` nor
/// `example.com`), then the default certificate (host `*`, as ingress-nginx's
/// `--default-ssl-certificate`), if there is one; without it, a handshake without SNI or for a
/// host without a certificate fails.
///
/// Lookups read an immutable snapshot; [`Certificates::update`] swaps in a new one, so open
/// connections keep their certificate and new handshakes get the new ones.
pub struct Certificates {
    provider: Arc<CryptoProvider>,
    hosts: ArcSwap<Hosts>,
}

/// The host name under which [`Certificates::update`] takes the default certificate (never a
/// client's SNI).
pub const DEFAULT_HOST: &str = "*";

/// One snapshot: exact host names (and [`DEFAULT_HOST`]), and wildcards keyed by the suffix
/// after `*.`.
#[derive(Default)]
struct Hosts {
    exact: HashMap<String, Arc<CertifiedKey>>,
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl Hosts {
    fn get(&self, host: Option<&str>) -> Option<&Arc<CertifiedKey>> {
        host.and_then(|host| self.own(host)).or_else(|| self.exact.get(DEFAULT_HOST))
    }

    /// The certificate of `host` itself (exact, else wildcard), not the default one.
    fn own(&self, host: &str) -> Option<&Arc<CertifiedKey>> {
        let exact = self.exact.get(host).filter(|_| host != DEFAULT_HOST);
        exact.or_else(|| self.wildcard.get(host.split_once('.')?.1))
    }
}

impl Certificates {
    /// No certificates yet: every handshake fails until [`Certificates::update`] adds some.
    pub fn new() -> Self {
        Self {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            hosts: ArcSwap::from_pointee(Hosts::default()),
        }
    }

    /// Replaces the certificates with `entries`: host (or `*.domain`, or `*` for the default),
    /// `tls.crt` PEM (the chain, leaf first) and `tls.key` PEM. Host names are case-insensitive;
    /// the first entry for a host wins. An entry that does not load keeps the host's previous certificate, if it had one,
    /// and yields one error line naming the host. Meant to be called from one task: of two
    /// concurrent updates, the last to finish wins.
    pub fn update(&self, entries: Vec<(String, Vec<u8>, Vec<u8>)>) -> Vec<String> {
        let old = self.hosts.load();
        let mut new = Hosts::default();
        let mut errors = Vec::new();
        for (host, cert, key) in entries {
            let host = host.to_ascii_lowercase();
            let (wildcard, name) = match host.strip_prefix("*.") {
                Some(suffix) => (true, suffix),
                None => (false, host.as_str()),
            };
            if name.is_empty() || (name.contains('*') && name != DEFAULT_HOST) {
                errors.push(format!("{host}: unsupported host name (only exact names and *.domain)"));
                continue;
            }
            let (map, previous) = match wildcard {
                true => (&mut new.wildcard, old.wildcard.get(name)),
                false => (&mut new.exact, old.exact.get(name)),
            };
            if map.contains_key(name) {
                continue;
            }
            let loaded = match self.load(&cert, &key) {
                Ok(certified) => Arc::new(certified),
                Err(err) => {
                    errors.push(format!("{host}: {err}"));
                    let Some(previous) = previous else { continue };
                    previous.clone()
                }
            };
            map.insert(name.to_owned(), loaded);
        }
        self.hosts.store(Arc::new(new));
        errors
    }

    /// Parses a PEM chain and key and checks that the key belongs to the leaf certificate.
    fn load(&self, cert: &[u8], key: &[u8]) -> Result<CertifiedKey, String> {
        load_with(&self.provider, cert, key)
    }

    /// Whether a request for `host` (lowercase) on a connection whose handshake named `sni` went
    /// to the wrong place: `host` has a certificate of its own and the handshake got another
    /// (RFC 9110 §15.5.20, 421). Hosts that share a certificate (a wildcard, several names) may
    /// share connections, as HTTP/2 clients do.
    pub fn misdirected(&self, sni: Option<&str>, host: &str) -> bool {
        let hosts = self.hosts.load();
        hosts.own(host).is_some_and(|own| !hosts.get(sni).is_some_and(|negotiated| Arc::ptr_eq(own, negotiated)))
    }

    /// A server configuration (TLS 1.2 and 1.3, ring) that takes its certificates from `self`
    /// and offers ALPN `h2` and `http/1.1`.
    pub fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
        config_with(self.provider.clone(), self.clone())
    }
}

/// The certificate chain and private key of PEM `cert` and `key` (a `kubernetes.io/tls` Secret's
/// `tls.crt` and `tls.key`), or what is wrong with them.
pub fn certified_key(cert: &[u8], key: &[u8]) -> Result<CertifiedKey, String> {
    load_with(&rustls::crypto::ring::default_provider(), cert, key)
}

fn load_with(provider: &CryptoProvider, cert: &[u8], key: &[u8]) -> Result<CertifiedKey, String> {
    let chain =
        CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>().map_err(|err| format!("tls.crt: {err}"))?;
    if chain.is_empty() {
        return Err("tls.crt: no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|err| format!("tls.key: {err}"))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|err| err.to_string())
}

/// A server configuration as [`Certificates::server_config`] makes (TLS 1.2 and 1.3, ring, no
/// client authentication, ALPN `h2` and `http/1.1`) with the certificates of `resolver`: what a
/// [`crate::decision::Listener::Https`] is meant to carry.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Arc<ServerConfig> {
    config_with(Arc::new(rustls::crypto::ring::default_provider()), resolver)
}

fn config_with(provider: Arc<CryptoProvider>, resolver: Arc<dyn ResolvesServerCert>) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

impl Default for Certificates {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts = self.hosts.load();
        let wildcards = hosts.wildcard.keys().map(|suffix| format!("*.{suffix}"));
        f.debug_set().entries(hosts.exact.keys().cloned().chain(wildcards)).finish()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // rustls hands the SNI over lowercased.
        self.hosts.load().get(hello.server_name()).cloned()
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertifiedKey as Generated, generate_simple_self_signed};

    use super::*;

    fn entry(host: &str) -> (String, Vec<u8>, Vec<u8>) {
        let Generated { cert, signing_key } =
            generate_simple_self_signed(vec![host.trim_start_matches("*.").into()]).unwrap();
        (host.to_owned(), cert.pem().into_bytes(), signing_key.serialize_pem().into_bytes())
    }

    #[test]
    fn tls_update_reports_bad_entries_by_host_and_keeps_their_last_good_certificate() {
        let certificates = Certificates::new();
        assert!(certificates.update(vec![entry("A.example"), entry("*.b.example")]).is_empty());
        let good = certificates.hosts.load().get(Some("a.example")).cloned().unwrap();
        assert!(certificates.hosts.load().get(Some("x.b.example")).is_some());
        assert!(certificates.hosts.load().get(Some("b.example")).is_none());

        let (_, cert, _) = entry("a.example");
        let (_, _, other_key) = entry("a.example");
        let errors = certificates.update(vec![
            ("a.example".into(), cert, other_key),
            ("c.example".into(), b"garbage".to_vec(), b"garbage".to_vec()),
            ("a.*.example".into(), Vec::new(), Vec::new()),
        ]);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("a.example: "), "{errors:?}");
        assert!(errors[1].starts_with("c.example: tls.crt: no certificate"), "{errors:?}");
        assert!(errors[2].starts_with("a.*.example: unsupported host name"), "{errors:?}");
        let hosts = certificates.hosts.load();
        assert!(Arc::ptr_eq(hosts.get(Some("a.example")).unwrap(), &good), "kept the last good one");
        assert!(hosts.get(Some("x.b.example")).is_none(), "left out of the update: removed");
        assert!(hosts.get(Some("c.example")).is_none());
    }

    #[test]
    fn tls_default_certificate_answers_unknown_names_and_handshakes_without_sni() {
        let certificates = Certificates::new();
        assert!(certificates.update(vec![entry("a.example")]).is_empty());
        assert!(certificates.hosts.load().get(Some("other.example")).is_none(), "no default: no certificate");
        assert!(certificates.hosts.load().get(None).is_none());

        assert!(certificates.update(vec![entry("a.example"), entry("*")]).is_empty());
        let hosts = certificates.hosts.load();
        let (own, default) = (hosts.get(Some("a.example")).unwrap(), hosts.exact.get(DEFAULT_HOST).unwrap());
        assert!(!Arc::ptr_eq(own, default), "a host with its own certificate keeps it");
        assert!(Arc::ptr_eq(hosts.get(Some("other.example")).unwrap(), default));
        assert!(Arc::ptr_eq(hosts.get(None).unwrap(), default), "no SNI");
    }

    #[test]
    fn tls_misdirected_when_the_host_has_another_certificate_of_its_own() {
        let certificates = Certificates::new();
        let entries = vec![entry("a.example"), entry("b.example"), entry("*.w.example"), entry("*")];
        assert!(certificates.update(entries).is_empty());
        let misdirected = |sni: Option<&str>, host: &str| certificates.misdirected(sni, host);
        assert!(misdirected(Some("a.example"), "b.example"));
        assert!(misdirected(Some("x.w.example"), "a.example"));
        assert!(misdirected(None, "a.example"), "no SNI: the default certificate was negotiated");
        assert!(misdirected(Some("other.example"), "a.example"));
        assert!(!misdirected(Some("a.example"), "a.example"));
        assert!(!misdirected(Some("x.w.example"), "y.w.example"), "one wildcard certificate");
        assert!(!misdirected(Some("a.example"), "other.example"), "no certificate of its own");
        assert!(!misdirected(Some("a.example"), "*"), "the default certificate is nobody's own");
    }
}
