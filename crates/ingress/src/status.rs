//! Which Ingresses must carry which `status.loadBalancer` (pure): the addresses this controller
//! serves from, on every Ingress of our class, as ingress-nginx publishes them.
//!
//! [`StatusPlanner`] compares the status each Ingress carries (as watched, so our own writes
//! come back to it) with the one it should carry, and asks for a write only where they differ:
//! a restart rewrites nothing that is already right, and a write coming back as a change asks
//! for nothing more. Class membership is the [`RouteTable`]'s (see
//! [`ClassConfig`](crate::routes::ClassConfig)):
//!
//! - an Ingress we serve gets our addresses (fixed, or those of the Service clients reach this
//!   controller through: [`service_addresses`], as ingress-nginx's `--publish-service`);
//! - an Ingress we served since the planner started and no longer serve (its class changed, our
//!   default class stopped being default, ...) is cleared, but only while it carries exactly our
//!   addresses: once another controller wrote its own, it is left alone;
//! - any other Ingress is never touched, even one carrying our addresses (another controller
//!   may publish the same ones). So an Ingress that left our class while no planner was running
//!   keeps our addresses until someone else writes its status.
//!
//! A change costs O(changed Ingresses · log n); a changed IngressClass (rare) looks at them all.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use roadkeeper_cluster::{Changes, NamespacedName, Store};

use crate::routes::RouteTable;

/// One entry of `status.loadBalancer.ingress`: an address clients reach this controller at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// An IP address (the entry's `ip`).
    Ip(IpAddr),
    /// A DNS name (the entry's `hostname`).
    Hostname(String),
}

impl FromStr for Address {
    type Err = String;

    /// An IP address, else a DNS name as the API server accepts it (RFC 1123: lowercase letters,
    /// digits, `-` and `.`, labels of 1 to 63 characters, at most 253 in all) that does not look
    /// like a mistyped IPv4 address (all labels numeric).
    fn from_str(text: &str) -> Result<Self, String> {
        if let Ok(ip) = text.parse() {
            return Ok(Self::Ip(ip));
        }
        let label_ok = |label: &str| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        let numeric = text.split('.').all(|label| label.bytes().all(|b| b.is_ascii_digit()));
        if text.len() <= 253 && text.split('.').all(label_ok) && !numeric {
            Ok(Self::Hostname(text.to_owned()))
        } else {
            Err(format!("{text:?} is neither an IP address nor a DNS name (lowercase letters, digits, '-' and '.')"))
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => ip.fmt(f),
            Self::Hostname(name) => f.write_str(name),
        }
    }
}

impl Address {
    /// As an entry of `status.loadBalancer.ingress`.
    fn entry(&self) -> IngressLoadBalancerIngress {
        match self {
            Self::Ip(ip) => IngressLoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() },
            Self::Hostname(name) => IngressLoadBalancerIngress { hostname: Some(name.clone()), ..Default::default() },
        }
    }
}

/// The addresses clients reach Service `service` at, as ingress-nginx's `--publish-service` takes
/// them: those its load balancer published (`status.loadBalancer.ingress`, IPs and host names),
/// else its `externalIPs`; none while neither exists (a LoadBalancer still pending). Entries that
/// are not valid addresses are left out.
pub fn service_addresses(service: &Service) -> Vec<Address> {
    let balancer = service.status.as_ref().and_then(|status| status.load_balancer.as_ref());
    let published: Vec<Address> = balancer
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|entry| match (&entry.ip, &entry.hostname) {
            (Some(ip), _) => ip.parse().ok().map(Address::Ip),
            (None, Some(name)) => name.parse().ok(),
            (None, None) => None,
        })
        .collect();
    if !published.is_empty() {
        return published;
    }
    let external = service.spec.as_ref().and_then(|spec| spec.external_ips.as_ref());
    external.into_iter().flatten().filter_map(|ip| ip.parse().ok().map(Address::Ip)).collect()
}

/// A status write: Ingress `ingress` must carry `addresses` in `status.loadBalancer.ingress`, in
/// this order (none: cleared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusUpdate {
    /// The Ingress.
    pub ingress: NamespacedName,
    /// What its `status.loadBalancer.ingress` must hold.
    pub addresses: Vec<Address>,
}

impl StatusUpdate {
    /// `addresses` as the entries of `status.loadBalancer.ingress`.
    pub fn entries(&self) -> Vec<IngressLoadBalancerIngress> {
        self.addresses.iter().map(Address::entry).collect()
    }
}

/// Decides the status writes that keep our Ingresses' `status.loadBalancer` equal to our
/// addresses; see the [module](self) for the rules.
#[derive(Clone, Debug)]
pub struct StatusPlanner {
    addresses: Vec<Address>,
    /// `addresses` as status entries, to compare with what Ingresses carry.
    entries: Vec<IngressLoadBalancerIngress>,
    /// Ingresses we served since this planner started and have not cleared since: the only
    /// ones ever cleared. One that leaves our class stays here until cleared or deleted, so that
    /// a write of ours still on its way when it left is cleared when it lands.
    claimed: BTreeSet<NamespacedName>,
}

impl StatusPlanner {
    /// A planner publishing `addresses` (none: our Ingresses carry an empty status).
    pub fn new(addresses: Vec<Address>) -> Self {
        let entries = addresses.iter().map(Address::entry).collect();
        Self { addresses, entries, claimed: BTreeSet::new() }
    }

    /// Publishes `addresses` from now on; whether they differ from the previous ones (then
    /// [`plan_all`](Self::plan_all) gives the writes). An Ingress we no longer serve is cleared
    /// only while it carries the addresses of the moment it is planned.
    pub fn set_addresses(&mut self, addresses: Vec<Address>) -> bool {
        if addresses == self.addresses {
            return false;
        }
        self.entries = addresses.iter().map(Address::entry).collect();
        self.addresses = addresses;
        true
    }

    /// The addresses published.
    pub fn addresses(&self) -> &[Address] {
        &self.addresses
    }

    /// The writes for every Ingress of `store`, given the Ingresses `table` serves: for the first
    /// table, and whenever class membership may have changed.
    pub fn plan_all(&mut self, store: &Store, table: &RouteTable) -> Vec<StatusUpdate> {
        let keys: BTreeSet<NamespacedName> =
            store.ingresses().map(|(key, _)| key.clone()).chain(self.claimed.iter().cloned()).collect();
        keys.iter().filter_map(|key| self.plan_one(store, table, key)).collect()
    }

    /// The writes after `changes` (read from `store`) were applied to `table`: only the changed
    /// Ingresses, or all of them when an IngressClass changed.
    pub fn plan(&mut self, store: &Store, table: &RouteTable, changes: &Changes) -> Vec<StatusUpdate> {
        if !changes.ingress_classes.is_empty() {
            return self.plan_all(store, table);
        }
        changes.ingresses.iter().filter_map(|key| self.plan_one(store, table, key)).collect()
    }

    /// The write Ingress `key` needs, if any.
    fn plan_one(&mut self, store: &Store, table: &RouteTable, key: &NamespacedName) -> Option<StatusUpdate> {
        let Some(ingress) = store.ingress(key) else {
            self.claimed.remove(key);
            return None;
        };
        let carries_ours = load_balancer(ingress) == self.entries.as_slice();
        if table.serves(key) {
            self.claimed.insert(key.clone());
            return (!carries_ours).then(|| StatusUpdate { ingress: key.clone(), addresses: self.addresses.clone() });
        }
        if carries_ours && self.claimed.remove(key) && !self.entries.is_empty() {
            return Some(StatusUpdate { ingress: key.clone(), addresses: Vec::new() });
        }
        None
    }
}

/// The entries of the Ingress's `status.loadBalancer.ingress` (none when absent).
fn load_balancer(ingress: &Ingress) -> &[IngressLoadBalancerIngress] {
    let status = ingress.status.as_ref().and_then(|status| status.load_balancer.as_ref());
    status.and_then(|lb| lb.ingress.as_deref()).unwrap_or_default()
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
