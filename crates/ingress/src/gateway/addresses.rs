//! Gateway addresses: each Gateway of ours gets one address of the pool (`--address-pool`), the
//! one it asks for in `spec.addresses` if it asks, else the one its status already names (so an
//! address survives restarts), else the lowest free one. Oldest Gateways choose first.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use roadkeeper_cluster::NamespacedName;

/// What one Gateway brings to the allocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claim {
    /// The `IPAddress` values of `spec.addresses`, as written.
    pub requested: Vec<String>,
    /// The addresses in `status.addresses`.
    pub current: Vec<String>,
}

/// Why a Gateway has no address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `spec.addresses` names something that is not an IP address of the pool
    /// (`Accepted: False, UnsupportedAddress`).
    Unsupported(String),
    /// The address asked for is another Gateway's (`Programmed: False, AddressNotUsable`).
    Taken(IpAddr),
    /// The pool has no free address (`Programmed: False, AddressNotAssigned`).
    Exhausted,
}

/// Assigns addresses of `pool` to the Gateways `claims`, given oldest first.
pub fn allocate(pool: &IpNet, claims: &[(NamespacedName, Claim)]) -> BTreeMap<NamespacedName, Result<IpAddr, Refused>> {
    let mut taken = BTreeSet::new();
    let mut assigned = BTreeMap::new();
    // Requests first, then addresses already held, then the rest.
    for (name, claim) in claims.iter().filter(|(_, claim)| !claim.requested.is_empty()) {
        let outcome = requested(pool, &claim.requested)
            .and_then(|ip| if taken.insert(ip) { Ok(ip) } else { Err(Refused::Taken(ip)) });
        assigned.insert(name.clone(), outcome);
    }
    for (name, claim) in claims {
        if assigned.contains_key(name) {
            continue;
        }
        let held = claim
            .current
            .iter()
            .filter_map(|value| value.parse().ok())
            .find(|ip| usable(pool, ip) && !taken.contains(ip));
        if let Some(ip) = held {
            taken.insert(ip);
            assigned.insert(name.clone(), Ok(ip));
        }
    }
    let mut free = pool.hosts().filter(|ip| usable(pool, ip));
    for (name, _) in claims {
        if assigned.contains_key(name) {
            continue;
        }
        let next = free.by_ref().find(|ip| !taken.contains(ip)).ok_or(Refused::Exhausted);
        if let Ok(ip) = next {
            taken.insert(ip);
        }
        assigned.insert(name.clone(), next);
    }
    assigned
}

/// The one address of `requested`, if it is an address of `pool`.
fn requested(pool: &IpNet, requested: &[String]) -> Result<IpAddr, Refused> {
    let [value] = requested else {
        return Err(Refused::Unsupported(format!(
            "{} addresses asked for; one Gateway has one address",
            requested.len()
        )));
    };
    match value.parse::<IpAddr>() {
        Ok(ip) if usable(pool, &ip) => Ok(ip),
        Ok(ip) => Err(Refused::Unsupported(format!("{ip} is not an address of the pool {pool}"))),
        Err(_) => Err(Refused::Unsupported(format!("{value:?} is not an IP address"))),
    }
}

/// Whether `ip` is an address of `pool` a Gateway may have (not its network or broadcast
/// address, for IPv4 pools larger than two addresses).
fn usable(pool: &IpNet, ip: &IpAddr) -> bool {
    let ends = match pool {
        IpNet::V4(net) if net.prefix_len() < 31 => [IpAddr::V4(net.network()), IpAddr::V4(net.broadcast())],
        _ => return pool.contains(ip),
    };
    pool.contains(ip) && !ends.contains(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(requested: &[&str], current: &[&str]) -> Claim {
        Claim {
            requested: requested.iter().map(|s| s.to_string()).collect(),
            current: current.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn name(n: &str) -> NamespacedName {
        NamespacedName::new("ns", n)
    }

    #[test]
    fn requests_then_held_addresses_then_the_lowest_free_one() {
        let pool: IpNet = "192.168.235.0/29".parse().unwrap();
        let claims = [
            (name("old"), claim(&[], &[])),
            (name("held"), claim(&[], &["192.168.235.1"])),
            (name("asks"), claim(&["192.168.235.2"], &[])),
            (name("new"), claim(&[], &["10.0.0.1"])),
        ];
        let got = allocate(&pool, &claims);
        let ip = |s: &str| Ok(s.parse::<IpAddr>().unwrap());
        assert_eq!(got[&name("asks")], ip("192.168.235.2"));
        assert_eq!(got[&name("held")], ip("192.168.235.1"));
        assert_eq!(got[&name("old")], ip("192.168.235.3"));
        assert_eq!(got[&name("new")], ip("192.168.235.4"), "an address outside the pool is not kept");
    }

    #[test]
    fn refusals_say_why() {
        let pool: IpNet = "192.168.235.0/30".parse().unwrap();
        let claims = [
            (name("a"), claim(&["192.168.235.1"], &[])),
            (name("b"), claim(&["192.168.235.1"], &[])),
            (name("c"), claim(&["192.168.235.3"], &[])),
            (name("d"), claim(&["nonsense"], &[])),
            (name("e"), claim(&[], &[])),
            (name("f"), claim(&[], &[])),
        ];
        let got = allocate(&pool, &claims);
        assert_eq!(got[&name("a")], Ok("192.168.235.1".parse().unwrap()));
        assert_eq!(got[&name("b")], Err(Refused::Taken("192.168.235.1".parse().unwrap())));
        assert!(
            matches!(&got[&name("c")], Err(Refused::Unsupported(m)) if m.contains("not an address of the pool")),
            "broadcast"
        );
        assert!(matches!(&got[&name("d")], Err(Refused::Unsupported(m)) if m.contains("not an IP address")));
        assert_eq!(got[&name("e")], Ok("192.168.235.2".parse().unwrap()));
        assert_eq!(got[&name("f")], Err(Refused::Exhausted));
        let single: IpNet = "192.168.235.7/32".parse().unwrap();
        assert_eq!(
            allocate(&single, &[(name("a"), Claim::default())])[&name("a")],
            Ok("192.168.235.7".parse().unwrap())
        );
    }
}
