//! Chain-name hashing, exactly as upstream kube-proxy names its chains.
//!
//! Both backends name per-service and per-endpoint objects with a prefix of the standard base32
//! encoding of a SHA-256 digest, so that names are short, stable and identical to upstream's.

use data_encoding::BASE32;
use sha2::{Digest, Sha256};

/// The first `len` characters of `base32(sha256(input))`.
fn base32_sha256_prefix(input: &str, len: usize) -> String {
    let digest = Sha256::digest(input.as_bytes());
    let mut encoded = BASE32.encode(&digest);
    encoded.truncate(len);
    encoded
}

/// nftables-mode hash: 8 characters of `base32(sha256(name))`, used as `service-<H>-<name>`.
pub fn nft_hash(name: &str) -> String {
    base32_sha256_prefix(name, 8)
}

/// iptables-mode hash: 16 characters of `base32(sha256(servicePortName + protocol [+ endpoint]))`,
/// used as `KUBE-SVC-<H>`, `KUBE-SEP-<H>` and friends.
pub fn iptables_hash(service_port_name: &str, protocol: &str, endpoint: Option<&str>) -> String {
    let mut input = format!("{service_port_name}{protocol}");
    if let Some(endpoint) = endpoint {
        input.push_str(endpoint);
    }
    base32_sha256_prefix(&input, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_hash_matches_upstream_vectors() {
        assert_eq!(nft_hash("ns1/svc1/tcp/p80"), "ULMVA6XW");
        assert_eq!(nft_hash("ns1/svc1/tcp/p80__10.180.0.1/80"), "5OJB2KTY");
        assert_eq!(nft_hash("kube-system/kube-dns/udp/dns"), "FY5PMXPG");
    }

    #[test]
    fn iptables_hash_matches_upstream_vectors() {
        assert_eq!(iptables_hash("ns1/svc1:p80", "tcp", None), "XPGD46QRK7WJZT7O");
        assert_eq!(iptables_hash("ns1/svc1:p80", "tcp", Some("10.180.0.1:80")), "SXIVWICOYRO3J4NJ");
        assert_eq!(iptables_hash("default/kubernetes:https", "tcp", None), "NPX46M4PTMTKRN6Y");
        assert_eq!(iptables_hash("kube-system/kube-dns:dns", "udp", None), "TCOU7JCQXEZGVUNU");
    }
}
