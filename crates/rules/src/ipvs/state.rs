//! What IPVS mode plans for the whole node, kept Service by Service so that a change to one
//! Service costs O(that Service): each Service's own [`IpvsPlan`], and who holds each virtual
//! server, address and helper-set element (several Services may hold the same: an externalIP of
//! two Services, an endpoint both select).
//!
//! [`IpvsState::set`] replaces one Service's plan and says what it touched; the applier diffs
//! only that ([`IpvsTable::diff_scoped`]) and adds or deletes only those helper elements.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use roadkeeper_cluster::NamespacedName;

use super::helpers::HelperElement;
use super::plan::{IpvsPlan, IpvsTable, VirtualKey, VirtualServer};

/// Every Service's IPVS plan, and the node-wide view of them.
#[derive(Debug, Clone, Default)]
pub struct IpvsState {
    /// Each Service's own plan.
    plans: BTreeMap<NamespacedName, IpvsPlan>,
    /// The Services planning each virtual server, oldest first: the first one's is programmed
    /// (frontend claims give ClusterIP frontends one owner; a NodePort that is also another
    /// Service's externalIP is planned by both).
    holders: BTreeMap<VirtualKey, Vec<NamespacedName>>,
    /// How many Services bind each address to `kube-ipvs0`.
    addresses: BTreeMap<IpAddr, usize>,
    /// How many Services hold each helper-set element.
    elements: BTreeMap<HelperElement, usize>,
}

/// What one [`IpvsState::set`] touched: the virtual servers and addresses to diff, the helper
/// elements that appeared or went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// Virtual servers the Service planned before or plans now.
    pub servers: BTreeSet<VirtualKey>,
    /// Addresses the Service bound before or binds now.
    pub addresses: BTreeSet<IpAddr>,
    /// Elements no Service held before.
    pub added: Vec<HelperElement>,
    /// Elements no Service holds any more.
    pub removed: Vec<HelperElement>,
}

impl Touched {
    /// Adds what `other` touched (elements that came and went again cancel out).
    pub fn merge(&mut self, other: Touched) {
        self.servers.extend(other.servers);
        self.addresses.extend(other.addresses);
        for element in other.added {
            match self.removed.iter().position(|e| *e == element) {
                Some(i) => {
                    self.removed.swap_remove(i);
                }
                None => self.added.push(element),
            }
        }
        for element in other.removed {
            match self.added.iter().position(|e| *e == element) {
                Some(i) => {
                    self.added.swap_remove(i);
                }
                None => self.removed.push(element),
            }
        }
    }
}

impl IpvsState {
    /// Replaces the plan of Service `key` (an empty plan removes it); what changed node-wide.
    pub fn set(&mut self, key: &NamespacedName, plan: IpvsPlan) -> Touched {
        let old = self.plans.remove(key).unwrap_or_default();
        let mut touched = Touched::default();
        for vk in old.table.virtual_servers.keys() {
            touched.servers.insert(*vk);
            if let Some(holders) = self.holders.get_mut(vk) {
                holders.retain(|h| h != key);
                if holders.is_empty() {
                    self.holders.remove(vk);
                }
            }
        }
        for vk in plan.table.virtual_servers.keys() {
            touched.servers.insert(*vk);
            self.holders.entry(*vk).or_default().push(key.clone());
        }
        for address in &old.table.addresses {
            touched.addresses.insert(*address);
            release(&mut self.addresses, address);
        }
        for address in &plan.table.addresses {
            touched.addresses.insert(*address);
            *self.addresses.entry(*address).or_default() += 1;
        }
        let (before, after) = (old.helpers.elements(), plan.helpers.elements());
        for element in before.difference(&after) {
            if release(&mut self.elements, element) {
                touched.removed.push(*element);
            }
        }
        for element in after.difference(&before) {
            let count = self.elements.entry(*element).or_default();
            *count += 1;
            if *count == 1 {
                touched.added.push(*element);
            }
        }
        if !plan.table.virtual_servers.is_empty() || !plan.table.addresses.is_empty() {
            self.plans.insert(key.clone(), plan);
        }
        touched
    }

    /// The virtual server planned at `key`: the oldest holder's.
    pub fn server(&self, key: &VirtualKey) -> Option<&VirtualServer> {
        let holder = self.holders.get(key)?.first()?;
        self.plans.get(holder)?.table.virtual_servers.get(key)
    }

    /// True when some Service binds `address` to `kube-ipvs0`.
    pub fn binds(&self, address: &IpAddr) -> bool {
        self.addresses.contains_key(address)
    }

    /// The whole planned table (a full sync's target).
    pub fn table(&self) -> IpvsTable {
        IpvsTable {
            addresses: self.addresses.keys().copied().collect(),
            virtual_servers: self.holders.keys().filter_map(|k| Some((*k, self.server(k)?.clone()))).collect(),
        }
    }

    /// Every helper-set element some Service holds.
    pub fn elements(&self) -> BTreeSet<HelperElement> {
        self.elements.keys().copied().collect()
    }

    /// What `touched` asks the kernel to do to IPVS and `kube-ipvs0`, from `applied`.
    pub fn diff(&self, applied: &IpvsTable, touched: &Touched) -> Vec<super::IpvsOp> {
        applied.diff_scoped(
            touched.servers.iter().map(|k| (*k, self.server(k))),
            touched.addresses.iter().map(|a| (*a, self.binds(a))),
        )
    }
}

/// Takes one holder off `key`'s count; true when none is left (the key is gone).
fn release<K: Ord>(counts: &mut BTreeMap<K, usize>, key: &K) -> bool {
    match counts.get_mut(key) {
        Some(count) if *count > 1 => {
            *count -= 1;
            false
        }
        Some(_) => {
            counts.remove(key);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipvs::IpvsOp;
    use crate::ipvs::plan::tests::{ep, ipvs_cfg, node, port};
    use crate::ipvs::plan::{RealServer, WEIGHT};
    use crate::table::{Protocol, ServicePort};

    fn name(n: &str) -> NamespacedName {
        NamespacedName::new("default", n)
    }

    fn plan(ports: &[&ServicePort]) -> IpvsPlan {
        IpvsPlan::new(&ipvs_cfg(), &node(), ports.iter().copied())
    }

    fn key(address: &str, port: u16) -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: address.parse().unwrap(), port }
    }

    #[test]
    fn services_planned_one_by_one_make_the_whole_nodes_plan() {
        let a = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let mut b = port("b", "10.96.0.11", vec![ep("10.244.0.11", 8080, false), ep("10.244.0.12", 8080, false)]);
        b.node_port = Some(30080);
        let mut state = IpvsState::default();
        state.set(&name("a"), plan(&[&a]));
        state.set(&name("b"), plan(&[&b]));
        let whole = plan(&[&a, &b]);
        assert_eq!(state.table(), whole.table);
        assert_eq!(state.elements(), whole.helpers.elements());
    }

    #[test]
    fn one_endpoint_change_touches_only_its_service() {
        let a = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let b = port("b", "10.96.0.11", vec![ep("10.244.0.12", 8080, false)]);
        let mut state = IpvsState::default();
        state.set(&name("a"), plan(&[&a]));
        state.set(&name("b"), plan(&[&b]));
        let applied = state.table();
        let b2 = port("b", "10.96.0.11", vec![ep("10.244.0.12", 8080, false), ep("10.244.0.13", 8080, false)]);
        let touched = state.set(&name("b"), plan(&[&b2]));
        assert_eq!(touched.servers, BTreeSet::from([key("10.96.0.11", 80)]));
        let real = RealServer { address: "10.244.0.13".parse().unwrap(), port: 8080 };
        assert_eq!(state.diff(&applied, &touched), [IpvsOp::AddDest(key("10.96.0.11", 80), real, WEIGHT)]);
        let texts: Vec<String> = touched.added.iter().map(HelperElement::text).collect();
        assert_eq!(texts, ["10.244.0.13 . tcp . 8080 . 10.244.0.13"], "its hairpin element");
        assert!(touched.removed.is_empty());
    }

    #[test]
    fn shared_addresses_and_elements_stay_while_one_service_holds_them() {
        let mut a = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        a.external_ips = vec!["203.0.113.7".parse().unwrap()];
        let mut b = port("b", "10.96.0.11", vec![ep("10.244.0.11", 8080, false)]);
        b.external_ips = vec!["203.0.113.7".parse().unwrap()];
        b.port = 81;
        let mut state = IpvsState::default();
        state.set(&name("a"), plan(&[&a]));
        state.set(&name("b"), plan(&[&b]));
        let applied = state.table();
        let touched = state.set(&name("a"), IpvsPlan::default());
        let ops = state.diff(&applied, &touched);
        assert_eq!(
            ops,
            [
                IpvsOp::DelService(key("10.96.0.10", 80)),
                IpvsOp::DelService(key("203.0.113.7", 80)),
                IpvsOp::UnbindAddress("10.96.0.10".parse().unwrap())
            ],
            "203.0.113.7 stays bound: b holds it"
        );
        let removed: BTreeSet<String> = touched.removed.iter().map(|e| format!("{} {}", e.set(), e.text())).collect();
        assert!(!removed.iter().any(|e| e.starts_with("hairpin")), "b still holds the endpoint: {removed:?}");
        assert!(removed.contains("ipvs-addresses 10.96.0.10") && !removed.contains("ipvs-addresses 203.0.113.7"));
    }

    #[test]
    fn the_oldest_holder_of_a_virtual_server_keeps_it() {
        let old = port("old", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let mut young = port("young", "10.96.0.11", vec![ep("10.244.0.12", 8080, false)]);
        young.external_ips = vec!["10.96.0.10".parse().unwrap()];
        let mut state = IpvsState::default();
        state.set(&name("old"), plan(&[&old]));
        state.set(&name("young"), plan(&[&young]));
        assert_eq!(state.server(&key("10.96.0.10", 80)).unwrap().service.service, name("old"));
        let applied = state.table();
        let touched = state.set(&name("old"), IpvsPlan::default());
        assert_eq!(state.server(&key("10.96.0.10", 80)).unwrap().service.service, name("young"));
        let ops = state.diff(&applied, &touched);
        let reals: Vec<&IpvsOp> =
            ops.iter().filter(|op| matches!(op, IpvsOp::AddDest(..) | IpvsOp::EditDest(..))).collect();
        assert_eq!(reals.len(), 2, "young's endpoint added, old's drained: {ops:?}");
    }

    #[test]
    fn touched_sets_merge_and_cancel() {
        let a = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false)]);
        let mut state = IpvsState::default();
        let mut touched = state.set(&name("a"), plan(&[&a]));
        touched.merge(state.set(&name("a"), IpvsPlan::default()));
        assert!(touched.added.is_empty() && touched.removed.is_empty(), "{touched:?}");
        assert_eq!(touched.servers.len(), 1);
    }
}
