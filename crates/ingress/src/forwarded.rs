//! Which client a request comes from when proxies in front of us say so: `X-Forwarded-For` is
//! believed only from `--trusted-proxy-cidrs` (ingress-nginx's `use-forwarded-headers` with
//! `proxy-real-ip-cidr`), and the client is then found as nginx's `real_ip_recursive` finds it.

use std::net::IpAddr;

use ipnet::IpNet;

/// Whether `peer` is one of `trusted`.
pub fn is_trusted(peer: IpAddr, trusted: &[IpNet]) -> bool {
    let peer = peer.to_canonical();
    trusted.iter().any(|net| net.contains(&peer))
}

/// The client of an `X-Forwarded-For` chain (`a, b, c`, the last one our peer): the last address
/// that is not `trusted`, or the first one when all are; `None` when an address on the way does
/// not parse (then the peer is the client, as nginx decides).
pub fn real_client(chain: &[u8], trusted: &[IpNet]) -> Option<IpAddr> {
    let chain = std::str::from_utf8(chain).ok()?;
    let mut client = None;
    for entry in chain.rsplit(',') {
        let address: IpAddr = entry.trim().parse().ok()?;
        client = Some(address);
        if !is_trusted(address, trusted) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(cidrs: &[&str]) -> Vec<IpNet> {
        cidrs.iter().map(|cidr| cidr.parse().unwrap()).collect()
    }

    #[test]
    fn forwarded_real_client_is_the_last_untrusted_address() {
        let trusted = nets(&["10.0.0.0/8", "127.0.0.9/32", "fd00::/8"]);
        for (chain, client) in [
            ("203.0.113.7, 127.0.0.9", Some("203.0.113.7")),
            ("198.51.100.1, 10.1.2.3, 127.0.0.9", Some("198.51.100.1")),
            ("192.0.2.1, 198.51.100.1, 10.1.2.3, 127.0.0.9", Some("198.51.100.1")),
            ("10.0.0.1,10.0.0.2,127.0.0.9", Some("10.0.0.1")),
            ("2001:db8::1, fd00::2", Some("2001:db8::1")),
            ("127.0.0.9", Some("127.0.0.9")),
            ("garbage, 203.0.113.7, 127.0.0.9", Some("203.0.113.7")),
            ("203.0.113.7, garbage, 127.0.0.9", None),
            ("203.0.113.7:80, 127.0.0.9", None),
            ("", None),
        ] {
            let expected = client.map(|ip| ip.parse::<IpAddr>().unwrap());
            assert_eq!(real_client(chain.as_bytes(), &trusted), expected, "{chain}");
        }
    }

    #[test]
    fn forwarded_trust_takes_ipv4_mapped_peers_as_ipv4() {
        let trusted = nets(&["127.0.0.0/8"]);
        assert!(is_trusted("::ffff:127.0.0.9".parse().unwrap(), &trusted));
        assert!(!is_trusted("192.0.2.1".parse().unwrap(), &trusted));
        assert!(!is_trusted("127.0.0.1".parse().unwrap(), &[]));
    }
}
