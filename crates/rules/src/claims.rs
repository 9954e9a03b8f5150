//! Who owns each frontend when several Services claim the same one.
//!
//! The API server accepts two Services with the same `externalIPs` address and port, an
//! externalIP:port equal to another Service's ClusterIP:port, and the same for load-balancer
//! ingress IPs (and a folder of manifests accepts anything). Both would program the same map
//! element, which nf_tables refuses for the whole transaction. So every frontend has one owner:
//! the oldest claimant (creation timestamp, then namespace/name); the others are skipped for that
//! frontend only, and the conflict is reported. Pure and incremental: updating one Service costs
//! O(its frontends · log n).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use roadkeeper_cluster::NamespacedName;
use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::table::{IpFamily, Protocol, ServicePort};

/// One thing a packet can be addressed to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Frontend {
    /// A ClusterIP as a whole (the address the `cluster-ips` set and REJECT of unused ports use).
    ClusterIp(IpAddr),
    /// `address . protocol . port`: a ClusterIP, externalIP or load-balancer IP port.
    Address(IpAddr, Protocol, u16),
    /// `protocol . nodePort` in one family.
    NodePort(IpFamily, Protocol, u16),
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Frontend::ClusterIp(ip) => write!(f, "ClusterIP {ip}"),
            Frontend::Address(IpAddr::V4(ip), proto, port) => write!(f, "{ip}:{port}/{}", proto.as_str()),
            Frontend::Address(IpAddr::V6(ip), proto, port) => write!(f, "[{ip}]:{port}/{}", proto.as_str()),
            Frontend::NodePort(family, proto, port) => {
                let family = if *family == IpFamily::V4 { "IPv4" } else { "IPv6" };
                write!(f, "NodePort {port}/{} ({family})", proto.as_str())
            }
        }
    }
}

/// A Service claiming frontends; claimants order oldest first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claimant {
    /// `metadata.creationTimestamp` (absent sorts first, as for Ingresses).
    pub created: Option<Time>,
    /// The Service.
    pub service: NamespacedName,
}

/// A frontend one Service claims and another, older one owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The contested frontend.
    pub frontend: Frontend,
    /// The Service that keeps it.
    pub owner: NamespacedName,
    /// The Service skipped for it.
    pub skipped: NamespacedName,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Service {} claims {}, which Service {} holds (older); skipped for it",
            self.skipped, self.frontend, self.owner
        )
    }
}

/// The frontends every Service claims and who owns each.
#[derive(Debug, Default, Clone)]
pub struct FrontendClaims {
    /// Claimants of each frontend, oldest first (sorted vectors: nearly always one claimant, and
    /// a one-element `BTreeSet` allocates a whole B-tree node, which made these maps 2 KB per
    /// Service).
    by_frontend: BTreeMap<Frontend, Vec<Claimant>>,
    /// Each Service's claimant identity and frontends (sorted, exactly sized).
    by_service: BTreeMap<NamespacedName, (Claimant, Box<[Frontend]>)>,
    /// Claims skipped because an older Service owns the frontend.
    conflicts: usize,
}

impl FrontendClaims {
    /// Replaces the claims of `claimant.service` with `frontends` (empty: it claims nothing any
    /// more) and returns the other Services that gained or lost a frontend because of it: they
    /// must be planned again.
    pub fn update(&mut self, claimant: Claimant, frontends: BTreeSet<Frontend>) -> BTreeSet<NamespacedName> {
        let key = claimant.service.clone();
        let old = self.by_service.remove(&key);
        let touched: BTreeSet<Frontend> = old.iter().flat_map(|(_, f)| f.iter()).chain(&frontends).cloned().collect();
        let owners_before: Vec<Option<NamespacedName>> = touched.iter().map(|f| self.owner(f).cloned()).collect();
        if let Some((old_claimant, old_frontends)) = &old {
            for frontend in old_frontends {
                self.remove_claim(frontend, old_claimant);
            }
        }
        for frontend in &frontends {
            let claimants = self.by_frontend.entry(frontend.clone()).or_default();
            if let Err(at) = claimants.binary_search(&claimant) {
                if !claimants.is_empty() {
                    self.conflicts += 1;
                }
                claimants.insert(at, claimant.clone());
            }
        }
        if !frontends.is_empty() {
            self.by_service.insert(key.clone(), (claimant, frontends.into_iter().collect()));
        }
        let mut affected = BTreeSet::new();
        for (frontend, before) in touched.iter().zip(owners_before) {
            let after = self.owner(frontend).cloned();
            if before != after {
                affected.extend(before.into_iter().chain(after).filter(|s| *s != key));
            }
        }
        affected
    }

    /// Forgets every claim.
    pub fn clear(&mut self) {
        *self = FrontendClaims::default();
    }

    fn remove_claim(&mut self, frontend: &Frontend, claimant: &Claimant) {
        let Some(claimants) = self.by_frontend.get_mut(frontend) else { return };
        if let Ok(at) = claimants.binary_search(claimant) {
            claimants.remove(at);
            if !claimants.is_empty() {
                self.conflicts -= 1;
            }
        }
        if claimants.is_empty() {
            self.by_frontend.remove(frontend);
        }
    }

    /// The Service owning `frontend`, if any claims it.
    pub fn owner(&self, frontend: &Frontend) -> Option<&NamespacedName> {
        self.by_frontend.get(frontend)?.first().map(|c| &c.service)
    }

    /// How many claims are skipped because an older Service owns the frontend.
    pub fn conflicts(&self) -> usize {
        self.conflicts
    }

    /// Removes from `ports` (the service ports of `service`) every frontend another Service owns,
    /// and returns those conflicts.
    pub fn keep_owned(&self, service: &NamespacedName, ports: &mut [ServicePort]) -> Vec<Conflict> {
        let mut conflicts = Vec::new();
        let mut owned = |frontend: Frontend| match self.owner(&frontend) {
            Some(owner) if owner != service => {
                conflicts.push(Conflict { frontend, owner: owner.clone(), skipped: service.clone() });
                false
            }
            _ => true,
        };
        for sp in ports.iter_mut() {
            let (proto, port) = (sp.name.protocol, sp.port);
            if let Some(ip) = sp.cluster_ip
                && !(owned(Frontend::ClusterIp(ip)) & owned(Frontend::Address(ip, proto, port)))
            {
                sp.cluster_ip = None;
            }
            sp.external_ips.retain(|ip| owned(Frontend::Address(*ip, proto, port)));
            sp.load_balancer_ips.retain(|ip| owned(Frontend::Address(*ip, proto, port)));
            if let Some(node_port) = sp.node_port
                && !owned(Frontend::NodePort(sp.family, proto, node_port))
            {
                sp.node_port = None;
            }
        }
        conflicts.dedup();
        conflicts
    }
}

/// The frontends `ports` claim. Within one Service a frontend is used once: an externalIP equal
/// to its own ClusterIP port, or a load-balancer IP equal to one of its externalIPs, is dropped
/// from the later list (ClusterIP, then externalIPs, then load-balancer IPs).
pub fn frontends_of(ports: &mut [ServicePort]) -> BTreeSet<Frontend> {
    let mut claimed = BTreeSet::new();
    for sp in ports.iter_mut() {
        let (proto, port) = (sp.name.protocol, sp.port);
        if let Some(ip) = sp.cluster_ip {
            claimed.insert(Frontend::ClusterIp(ip));
            claimed.insert(Frontend::Address(ip, proto, port));
        }
        sp.external_ips.retain(|ip| claimed.insert(Frontend::Address(*ip, proto, port)));
        sp.load_balancer_ips.retain(|ip| claimed.insert(Frontend::Address(*ip, proto, port)));
        if let Some(node_port) = sp.node_port {
            claimed.insert(Frontend::NodePort(sp.family, proto, node_port));
        }
    }
    claimed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> NamespacedName {
        NamespacedName::new("default", name)
    }

    fn claimant(name: &str, created_secs: Option<i64>) -> Claimant {
        let created =
            created_secs.map(|s| Time(roadkeeper_cluster::k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
        Claimant { created, service: svc(name) }
    }

    /// Port 80/TCP of `name` on ClusterIP `cluster_ip` with `external_ips`.
    fn port(name: &str, cluster_ip: &str, external_ips: &[&str]) -> ServicePort {
        ServicePort {
            external_ips: external_ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            ..ServicePort::for_test(svc(name), Protocol::Tcp, cluster_ip.parse().unwrap(), 80, Vec::new())
        }
    }

    fn claim(claims: &mut FrontendClaims, who: Claimant, mut ports: Vec<ServicePort>) -> BTreeSet<NamespacedName> {
        claims.update(who, frontends_of(&mut ports))
    }

    fn external(ip: &str) -> Frontend {
        Frontend::Address(ip.parse().unwrap(), Protocol::Tcp, 80)
    }

    #[test]
    fn the_oldest_claimant_owns_a_shared_external_ip_and_the_other_keeps_the_rest() {
        let mut claims = FrontendClaims::default();
        let old = claimant("old", Some(100));
        let new = claimant("new", Some(200));
        claim(&mut claims, new.clone(), vec![port("new", "10.96.0.2", &["203.0.113.7", "203.0.113.8"])]);
        let affected = claim(&mut claims, old.clone(), vec![port("old", "10.96.0.1", &["203.0.113.7"])]);
        assert_eq!(affected, BTreeSet::from([svc("new")]), "new lost 203.0.113.7 and must be planned again");
        assert_eq!(claims.owner(&external("203.0.113.7")), Some(&svc("old")));
        assert_eq!(claims.conflicts(), 1);

        let mut ports = vec![port("new", "10.96.0.2", &["203.0.113.7", "203.0.113.8"])];
        let conflicts = claims.keep_owned(&svc("new"), &mut ports);
        assert_eq!(ports[0].external_ips, vec!["203.0.113.8".parse::<IpAddr>().unwrap()]);
        assert_eq!(ports[0].cluster_ip, Some("10.96.0.2".parse().unwrap()), "only the contested frontend goes");
        assert_eq!(conflicts, [Conflict { frontend: external("203.0.113.7"), owner: svc("old"), skipped: svc("new") }]);
        assert_eq!(
            conflicts[0].to_string(),
            "Service default/new claims 203.0.113.7:80/tcp, which Service default/old holds (older); skipped for it"
        );
        let mut ports = vec![port("old", "10.96.0.1", &["203.0.113.7"])];
        assert!(claims.keep_owned(&svc("old"), &mut ports).is_empty());

        // The owner lets go: the other takes over.
        let affected = claim(&mut claims, old, Vec::new());
        assert_eq!(affected, BTreeSet::from([svc("new")]));
        assert_eq!(claims.owner(&external("203.0.113.7")), Some(&svc("new")));
        assert_eq!(claims.conflicts(), 0);
    }

    #[test]
    fn ties_in_age_go_by_namespace_and_name_and_unchanged_owners_affect_nobody() {
        let mut claims = FrontendClaims::default();
        claim(&mut claims, claimant("b", None), vec![port("b", "10.96.0.2", &["10.96.0.1"])]);
        claim(&mut claims, claimant("a", None), vec![port("a", "10.96.0.1", &[])]);
        assert_eq!(claims.owner(&external("10.96.0.1")), Some(&svc("a")), "an externalIP on another's ClusterIP");
        // b changes something unrelated: nobody else needs planning.
        let affected = claim(&mut claims, claimant("b", None), vec![port("b", "10.96.0.2", &["10.96.0.1", "1.2.3.4"])]);
        assert!(affected.is_empty(), "{affected:?}");
        assert_eq!(claims.conflicts(), 1);
    }

    #[test]
    fn a_duplicate_cluster_ip_loses_the_whole_address() {
        let mut claims = FrontendClaims::default();
        claim(&mut claims, claimant("a", Some(1)), vec![port("a", "10.96.0.1", &[])]);
        let mut b = port("b", "10.96.0.1", &[]);
        b.port = 81;
        claim(&mut claims, claimant("b", Some(2)), vec![b.clone()]);
        let mut ports = vec![b];
        let conflicts = claims.keep_owned(&svc("b"), &mut ports);
        assert_eq!(ports[0].cluster_ip, None);
        assert_eq!(conflicts[0].frontend, Frontend::ClusterIp("10.96.0.1".parse().unwrap()));
    }

    #[test]
    fn node_ports_are_claimed_per_family() {
        let mut claims = FrontendClaims::default();
        let with_node_port = |name: &str, ip: &str| ServicePort { node_port: Some(30080), ..port(name, ip, &[]) };
        claim(&mut claims, claimant("a", Some(1)), vec![with_node_port("a", "10.96.0.1")]);
        claim(&mut claims, claimant("b", Some(2)), vec![with_node_port("b", "fd00::2")]);
        assert_eq!(claims.conflicts(), 0);
        claim(&mut claims, claimant("c", Some(3)), vec![with_node_port("c", "10.96.0.3")]);
        let mut ports = vec![with_node_port("c", "10.96.0.3")];
        assert_eq!(claims.keep_owned(&svc("c"), &mut ports).len(), 1);
        assert_eq!(ports[0].node_port, None);
    }

    #[test]
    fn within_one_service_a_frontend_is_used_once() {
        let mut lb = port("a", "10.96.0.1", &["10.96.0.1", "203.0.113.7"]);
        lb.load_balancer_ips = vec!["203.0.113.7".parse().unwrap(), "203.0.113.9".parse().unwrap()];
        let mut ports = vec![lb];
        let frontends = frontends_of(&mut ports);
        assert_eq!(ports[0].external_ips, vec!["203.0.113.7".parse::<IpAddr>().unwrap()]);
        assert_eq!(ports[0].load_balancer_ips, vec!["203.0.113.9".parse::<IpAddr>().unwrap()]);
        assert_eq!(frontends.len(), 4);
    }
}
