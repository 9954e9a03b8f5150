//! Gateway addresses: each Gateway of ours gets one address of the pool (`--address-pool`).
//! An address once given is held by its Gateway for as long as it exists and still wants it (asks
//! for no address, or for that one): held are the addresses this process gave on its last compile,
//! then those the Gateways' statuses name (the memory across restarts; when two statuses name one,
//! the oldest Gateway's). A Gateway asking in `spec.addresses` for an address another holds is
//! refused (it gets no address rather than another one); one asking for a free address gets it;
//! the others get the lowest free one, oldest first.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
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
    /// The address asked for is held by another Gateway (`Programmed: False, AddressNotUsable`).
    Taken(IpAddr),
    /// The pool has no free address (`Programmed: False, AddressNotAssigned`).
    Exhausted,
}

/// Assigns addresses of `pool` to the Gateways `claims`, given oldest first; `given` is what
/// the last allocation of this process gave (empty on the first).
pub fn allocate(
    pool: &IpNet,
    claims: &[(NamespacedName, Claim)],
    given: &BTreeMap<NamespacedName, IpAddr>,
) -> BTreeMap<NamespacedName, Result<IpAddr, Refused>> {
    // What each asks for: `None` any address, `Some` that one.
    let wants: Vec<Result<Option<IpAddr>, Refused>> =
        claims.iter().map(|(_, claim)| wanted(pool, &claim.requested)).collect();
    let keeps = |index: usize, ip: &IpAddr| {
        usable(pool, ip) && matches!(wants[index], Ok(wanted) if wanted.is_none_or(|wanted| wanted == *ip))
    };
    // Each address held, by the index of its holder.
    let mut holders: BTreeMap<IpAddr, usize> = BTreeMap::new();
    let mut holds: Vec<Option<IpAddr>> = vec![None; claims.len()];
    for (index, (name, _)) in claims.iter().enumerate() {
        if let Some(ip) = given.get(name).filter(|ip| keeps(index, ip) && !holders.contains_key(ip)) {
            holders.insert(*ip, index);
            holds[index] = Some(*ip);
        }
    }
    for (index, (_, claim)) in claims.iter().enumerate() {
        let mut current = claim.current.iter().filter_map(|value| value.parse::<IpAddr>().ok());
        let held = holds[index].is_none().then(|| current.find(|ip| keeps(index, ip) && !holders.contains_key(ip)));
        if let Some(ip) = held.flatten() {
            holders.insert(ip, index);
            holds[index] = Some(ip);
        }
    }
    let mut assigned = BTreeMap::new();
    // Requests: the address if no other Gateway holds it.
    for (index, (name, _)) in claims.iter().enumerate() {
        let outcome = match &wants[index] {
            Ok(None) => continue,
            Err(refused) => Err(refused.clone()),
            Ok(Some(ip)) => match holders.entry(*ip) {
                Entry::Vacant(free) => {
                    free.insert(index);
                    Ok(*ip)
                }
                Entry::Occupied(holder) if *holder.get() == index => Ok(*ip),
                Entry::Occupied(_) => Err(Refused::Taken(*ip)),
            },
        };
        assigned.insert(name.clone(), outcome);
    }
    // The others: the address held, else the lowest free one.
    let mut free = pool.hosts().filter(|ip| usable(pool, ip));
    for (index, (name, _)) in claims.iter().enumerate().filter(|(index, _)| wants[*index] == Ok(None)) {
        let outcome = match holds[index] {
            Some(ip) => Ok(ip),
            None => free
                .by_ref()
                .find(|ip| !holders.contains_key(ip))
                .inspect(|ip| {
                    holders.insert(*ip, index);
                })
                .ok_or(Refused::Exhausted),
        };
        assigned.insert(name.clone(), outcome);
    }
    assigned
}

/// What `requested` asks for: no address in particular (`None`), or one address of `pool`.
fn wanted(pool: &IpNet, requested: &[String]) -> Result<Option<IpAddr>, Refused> {
    let value = match requested {
        [] => return Ok(None),
        [value] => value,
        _ => {
            return Err(Refused::Unsupported(format!(
                "{} addresses asked for; one Gateway has one address",
                requested.len()
            )));
        }
    };
    match value.parse::<IpAddr>() {
        Ok(ip) if usable(pool, &ip) => Ok(Some(ip)),
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
    fn held_addresses_then_requests_then_the_lowest_free_one() {
        let pool: IpNet = "192.168.235.0/29".parse().unwrap();
        let claims = [
            (name("old"), claim(&[], &[])),
            (name("held"), claim(&[], &["192.168.235.1"])),
            (name("asks"), claim(&["192.168.235.2"], &[])),
            (name("new"), claim(&[], &["10.0.0.1"])),
        ];
        let got = allocate(&pool, &claims, &BTreeMap::new());
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
        let got = allocate(&pool, &claims, &BTreeMap::new());
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
            allocate(&single, &[(name("a"), Claim::default())], &BTreeMap::new())[&name("a")],
            Ok("192.168.235.7".parse().unwrap())
        );
    }

    fn ip(s: &str) -> Result<IpAddr, Refused> {
        Ok(s.parse().unwrap())
    }

    #[test]
    fn a_held_address_is_refused_to_any_other_gateway_that_asks_for_it() {
        let pool: IpNet = "192.168.235.0/29".parse().unwrap();
        let none = BTreeMap::new();
        // Held in status by a younger Gateway: the older one asking for it is refused, with no
        // other address.
        let claims = [(name("old"), claim(&["192.168.235.1"], &[])), (name("holder"), claim(&[], &["192.168.235.1"]))];
        let got = allocate(&pool, &claims, &none);
        assert_eq!(got[&name("holder")], ip("192.168.235.1"));
        assert_eq!(got[&name("old")], Err(Refused::Taken("192.168.235.1".parse().unwrap())));
        // Given by this process (its status not written yet) is held just the same, and before
        // what a stale status says.
        let given = BTreeMap::from([(name("holder"), "192.168.235.1".parse().unwrap())]);
        let claims = [
            (name("stale"), claim(&[], &["192.168.235.1"])),
            (name("holder"), claim(&[], &[])),
            (name("asks"), claim(&["192.168.235.1"], &[])),
        ];
        let got = allocate(&pool, &claims, &given);
        assert_eq!(got[&name("holder")], ip("192.168.235.1"));
        assert_eq!(got[&name("stale")], ip("192.168.235.2"));
        assert_eq!(got[&name("asks")], Err(Refused::Taken("192.168.235.1".parse().unwrap())));
        // Two statuses naming one address: the oldest keeps it.
        let claims = [(name("a"), claim(&[], &["192.168.235.3"])), (name("b"), claim(&[], &["192.168.235.3"]))];
        let got = allocate(&pool, &claims, &none);
        assert_eq!((&got[&name("a")], &got[&name("b")]), (&ip("192.168.235.3"), &ip("192.168.235.1")));
        // Asking for the address it holds keeps it.
        let claims = [(name("a"), claim(&[], &[])), (name("b"), claim(&["192.168.235.1"], &["192.168.235.1"]))];
        assert_eq!(allocate(&pool, &claims, &none)[&name("b")], ip("192.168.235.1"));
    }

    #[test]
    fn a_gateway_asking_for_another_address_releases_the_one_it_held() {
        let pool: IpNet = "192.168.235.0/29".parse().unwrap();
        let given = BTreeMap::from([(name("mover"), "192.168.235.1".parse().unwrap())]);
        // Asks for a free address: gets it; its old one is free for the next.
        let claims = [(name("mover"), claim(&["192.168.235.5"], &["192.168.235.1"])), (name("next"), claim(&[], &[]))];
        let got = allocate(&pool, &claims, &given);
        assert_eq!((&got[&name("mover")], &got[&name("next")]), (&ip("192.168.235.5"), &ip("192.168.235.1")));
        // Asks for a held one, or for nonsense: no address at all, and the old one is released.
        for (request, refused) in [
            ("192.168.235.2", Refused::Taken("192.168.235.2".parse().unwrap())),
            ("10.0.0.1", Refused::Unsupported("10.0.0.1 is not an address of the pool 192.168.235.0/29".into())),
        ] {
            let claims = [
                (name("holder"), claim(&[], &["192.168.235.2"])),
                (name("mover"), claim(&[request], &["192.168.235.1"])),
                (name("next"), claim(&[], &[])),
            ];
            let got = allocate(&pool, &claims, &given);
            assert_eq!(got[&name("mover")], Err(refused));
            assert_eq!(got[&name("next")], ip("192.168.235.1"));
        }
    }
}
