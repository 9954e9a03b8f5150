//! Turns desired objects into transactions of `Op`s: a full sync that rewrites everything we own
//! (streamed op by op, [`stream_full_sync`]), and a partial sync that touches only what differs
//! between two versions of some Services' objects. Both are sent as one netlink batch; [`script`]
//! renders them for `nft -f`.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::layout::{Layout, count_rule};
use super::objects::{Container, ElementValue, Objects, Selection, TABLE, family_keyword};
use super::rule::{ElementKey, Op, Rule};
use crate::table::IpFamily;

/// Names found in the kernel before a full sync (so that stale ones can be deleted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    /// Regular and base chains present in our tables.
    pub chains: BTreeSet<(IpFamily, String)>,
    /// Named sets and maps present in our tables.
    pub sets: BTreeSet<(IpFamily, String)>,
}

/// The op that adds one element.
fn add_element(family: IpFamily, container: Container, key: &ElementKey, value: &ElementValue) -> Op {
    Op::AddElement { family, container, key: key.clone(), value: value.value.clone(), comment: value.comment.clone() }
}

/// An element's identity: family, container, key.
type ElementId = (IpFamily, Container, ElementKey);

/// What Services share in the tables: the endpoint-count sets and their picker rules (one per
/// count in use, with how many frontends have it), and the elements several Services may hold
/// ([`Container::Hairpin`]), with how many hold each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shared {
    counts: BTreeMap<(IpFamily, Selection, u32), usize>,
    holders: BTreeMap<ElementId, usize>,
}

/// A change of [`Shared`]: how many members each count set and how many holders each shared
/// element gains (or loses), as [`Shared::partial`] computes it; [`Shared::apply`] it once its ops
/// are applied. Costs O(the Services changed), whatever the size of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SharedChange {
    counts: BTreeMap<(IpFamily, Selection, u32), isize>,
    holders: BTreeMap<ElementId, isize>,
}

impl SharedChange {
    /// Adds `objects`' count-set members and shared elements (`by` = 1), or takes them away
    /// (`by` = -1).
    fn hold(&mut self, objects: &Objects, by: isize) {
        for (family, container, key) in objects.elements.keys() {
            match container {
                Container::Count(selection, n) => *self.counts.entry((*family, *selection, *n)).or_default() += by,
                Container::Hairpin => *self.holders.entry((*family, *container, key.clone())).or_default() += by,
                _ => {}
            }
        }
    }
}

/// `map[key]` after adding `delta` (entries at 0 are absent).
fn shifted<K: Ord>(map: &BTreeMap<K, usize>, key: &K, delta: isize) -> usize {
    map.get(key).copied().unwrap_or(0).saturating_add_signed(delta)
}

/// Adds `delta` to `map[key]`, removing it at 0.
fn shift<K: Ord>(map: &mut BTreeMap<K, usize>, key: K, delta: isize) {
    let value = shifted(map, &key, delta);
    if value == 0 {
        map.remove(&key);
    } else {
        map.insert(key, value);
    }
}

impl Shared {
    /// Records a change whose ops were applied.
    pub fn apply(&mut self, change: SharedChange) {
        for (key, delta) in change.counts {
            shift(&mut self.counts, key, delta);
        }
        for (id, delta) in change.holders {
            shift(&mut self.holders, id, delta);
        }
    }

    /// The count sets in use.
    fn count_sets(&self) -> impl Iterator<Item = (IpFamily, Selection, u32)> + '_ {
        self.counts.keys().copied()
    }

    /// The ops a partial sync of `changes` (each Service's applied and new objects) needs beyond
    /// the Services' own ([`partial_sync`]), and the change to record once they are applied:
    /// count sets that come into use or go out of it (the picker chain of their selection
    /// rewritten, a handful of rules), shared elements gaining their first holder or losing
    /// their last.
    pub fn partial(&self, changes: &[(&Objects, &Objects)]) -> (PartialOps, SharedChange) {
        let mut change = SharedChange::default();
        for (old, new) in changes {
            change.hold(old, -1);
            change.hold(new, 1);
        }
        let mut out = PartialOps::default();
        let in_use = |key: &(IpFamily, Selection, u32)| {
            shifted(&self.counts, key, change.counts.get(key).copied().unwrap_or(0)) > 0
        };
        let mut pickers = BTreeSet::new();
        for key @ &(family, selection, n) in change.counts.keys() {
            match (self.counts.contains_key(key), in_use(key)) {
                (false, true) => out.phases[PartialOps::BUILD]
                    .push(Op::AddContainer { family, container: Container::Count(selection, n) }),
                (true, false) => out.phases[PartialOps::TEAR_DOWN]
                    .push(Op::DeleteSet { family, name: Container::Count(selection, n).name() }),
                _ => continue,
            }
            pickers.insert((family, selection));
        }
        for (family, selection) in pickers {
            let counts: BTreeSet<u32> = self
                .count_sets()
                .chain(change.counts.keys().copied())
                .filter(|key| key.0 == family && key.1 == selection && in_use(key))
                .map(|(_, _, n)| n)
                .collect();
            out.phases[PartialOps::BUILD].push(Op::FlushChain { family, name: selection.chain() });
            out.phases[PartialOps::BUILD].extend(
                counts
                    .into_iter()
                    .map(|n| Op::AddRule { chain: selection.chain(), rule: count_rule(family, selection, n) }),
            );
        }
        for (id, delta) in &change.holders {
            let (family, container, key) = id;
            match (self.holders.contains_key(id), shifted(&self.holders, id, *delta) > 0) {
                (true, false) => out.phases[PartialOps::UNLINK].push(Op::DeleteElement {
                    family: *family,
                    container: *container,
                    key: key.clone(),
                }),
                (false, true) => {
                    let value =
                        changes.iter().find_map(|(_, new)| new.elements.get(id)).expect("a new holder holds it");
                    out.phases[PartialOps::LINK].push(add_element(*family, *container, key, value));
                }
                _ => {}
            }
        }
        (out, change)
    }
}

/// A count set and its picker rule.
fn count_set_ops(family: IpFamily, selection: Selection, n: u32) -> [Op; 2] {
    [
        Op::AddContainer { family, container: Container::Count(selection, n) },
        Op::AddRule { chain: selection.chain(), rule: count_rule(family, selection, n) },
    ]
}

/// The op that appends one rule.
fn add_rule(chain: &str, rule: &Rule) -> Op {
    Op::AddRule { chain: chain.to_string(), rule: rule.clone() }
}

/// Renders ops as an `nft -f` script.
pub fn script(ops: &[Op]) -> String {
    ops.iter().map(|op| format!("{op}\n")).collect()
}

/// A full sync as one transaction: the layout of both tables (shared maps emptied, but for the
/// affinity set), every Service's chains and map elements, and the deletion of whatever stale
/// chains and sets `existing` lists. Applied atomically, traffic never sees a
/// half-built table. Also what the Services share once it is applied.
///
/// The ops go to `emit` one at a time, each Service's after the count sets it is the first to
/// use, as its own chains (added and emptied), rules and elements: a caller that encodes them as
/// they come and builds each Service's objects only when `services` yields them holds no other
/// copy of the plan than its encoding.
pub fn stream_full_sync(
    layouts: &[Layout],
    services: impl IntoIterator<Item = impl Borrow<Objects>>,
    existing: &Existing,
    emit: &mut dyn FnMut(&Op),
) -> Shared {
    layouts.iter().flat_map(Layout::ops).for_each(|op| emit(&op));
    // What `existing` holds and nothing wanted names, once every Service went by.
    let mut stale_chains = existing.chains.clone();
    let mut stale_sets = existing.sets.clone();
    for layout in layouts {
        let family = layout.family;
        let layout_chains = layout
            .helper_chains()
            .into_iter()
            .map(|c| c.name)
            .chain(layout.base_chains().into_iter().map(|c| c.name.to_string()));
        for name in layout_chains {
            stale_chains.remove(&(family, name));
        }
        for container in Container::FIXED {
            stale_sets.remove(&(family, container.name()));
        }
    }
    let mut change = SharedChange::default();
    for objects in services {
        let objects = objects.borrow();
        // The count sets in use, emptied (an existing one keeps elements otherwise), and their
        // rules: before the first Service whose elements they hold.
        let new_counts: BTreeSet<(IpFamily, Selection, u32)> = objects
            .elements
            .keys()
            .filter_map(|(family, container, _)| match container {
                Container::Count(selection, n) => Some((*family, *selection, *n)),
                _ => None,
            })
            .filter(|count| !change.counts.contains_key(count))
            .collect();
        for (family, selection, n) in new_counts {
            let [add, rule] = count_set_ops(family, selection, n);
            emit(&add);
            emit(&Op::FlushSet { family, container: Container::Count(selection, n) });
            emit(&rule);
            stale_sets.remove(&(family, Container::Count(selection, n).name()));
        }
        for (family, name) in objects.chains.keys() {
            emit(&Op::AddChain { family: *family, name: name.clone() });
            emit(&Op::FlushChain { family: *family, name: name.clone() });
            stale_chains.remove(&(*family, name.clone()));
        }
        for ((_, name), rules) in &objects.chains {
            rules.iter().for_each(|rule| emit(&add_rule(name, rule)));
        }
        for (id @ (family, container, key), value) in &objects.elements {
            // A shared element goes in once, whichever Services hold it.
            if *container != Container::Hairpin || !change.holders.contains_key(id) {
                emit(&add_element(*family, *container, key, value));
            }
        }
        change.hold(objects, 1);
    }
    for (family, name) in &stale_chains {
        emit(&Op::FlushChain { family: *family, name: name.clone() });
    }
    for (family, name) in stale_chains {
        emit(&Op::DeleteChain { family, name });
    }
    for (family, name) in stale_sets {
        emit(&Op::DeleteSet { family, name });
    }
    let mut shared = Shared::default();
    shared.apply(change);
    shared
}

/// [`stream_full_sync`] collected: the ops of a full sync, and what the Services share.
pub fn full_sync(
    layouts: &[Layout],
    services: impl IntoIterator<Item = impl Borrow<Objects>>,
    existing: &Existing,
) -> (Vec<Op>, Shared) {
    let mut ops = Vec::new();
    let shared = stream_full_sync(layouts, services, existing, &mut |op| ops.push(op.clone()));
    (ops, shared)
}

/// The ops of one Service's partial sync, in the phases by which several Services' ops are
/// merged into one transaction ([`join_partial`]): objects built (sets, chains, rules), map
/// elements removed, map elements added, objects torn down. A map element one Service gives up
/// and another takes over (a frontend changing owner) must go before it comes back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartialOps {
    phases: [Vec<Op>; 4],
}

impl PartialOps {
    const BUILD: usize = 0;
    const UNLINK: usize = 1;
    const LINK: usize = 2;
    const TEAR_DOWN: usize = 3;

    /// True when nothing differs.
    pub fn is_empty(&self) -> bool {
        self.phases.iter().all(Vec::is_empty)
    }

    /// This Service's ops alone, in order.
    pub fn ops(&self) -> Vec<Op> {
        join_partial(std::iter::once(self))
    }
}

/// Several Services' partial syncs as one transaction, phase by phase.
pub fn join_partial<'a>(parts: impl Iterator<Item = &'a PartialOps> + Clone) -> Vec<Op> {
    (0..4).flat_map(|phase| parts.clone().flat_map(move |p| p.phases[phase].iter().cloned())).collect()
}

/// What moves the kernel from `old` to `new` for one Service: only chains whose rules differ are
/// flushed and rewritten, only changed elements are deleted or added. Empty when nothing differs.
/// Shared elements and count sets are [`Shared::partial`]'s.
pub fn partial_sync(old: &Objects, new: &Objects) -> PartialOps {
    let mut out = PartialOps::default();
    let build = &mut out.phases[PartialOps::BUILD];
    let mut rewritten = Vec::new();
    for (key @ (family, name), rules) in &new.chains {
        match old.chains.get(key) {
            None => {
                build.push(Op::AddChain { family: *family, name: name.clone() });
                rewritten.push((name, rules));
            }
            Some(old_rules) if old_rules != rules => {
                build.push(Op::FlushChain { family: *family, name: name.clone() });
                rewritten.push((name, rules));
            }
            Some(_) => {}
        }
    }
    for (name, rules) in rewritten {
        build.extend(rules.iter().map(|rule| add_rule(name, rule)));
    }
    let own = |container: &Container| *container != Container::Hairpin;
    for (key @ (family, container, elem_key), value) in old.elements.iter().filter(|((_, c, _), _)| own(c)) {
        if new.elements.get(key) != Some(value) {
            let op = Op::DeleteElement { family: *family, container: *container, key: elem_key.clone() };
            out.phases[PartialOps::UNLINK].push(op);
        }
    }
    for (key @ (family, container, elem_key), value) in new.elements.iter().filter(|((_, c, _), _)| own(c)) {
        if old.elements.get(key) != Some(value) {
            out.phases[PartialOps::LINK].push(add_element(*family, *container, elem_key, value));
        }
    }
    let tear_down = &mut out.phases[PartialOps::TEAR_DOWN];
    let removed: Vec<_> = old.chains.keys().filter(|k| !new.chains.contains_key(*k)).collect();
    for (family, name) in &removed {
        tear_down.push(Op::FlushChain { family: *family, name: name.clone() });
    }
    for (family, name) in &removed {
        tear_down.push(Op::DeleteChain { family: *family, name: name.clone() });
    }
    out
}

/// Script that removes everything roadkeeper installed (both tables), and nothing else.
pub fn cleanup() -> String {
    let mut out = String::new();
    for fam in [IpFamily::V4, IpFamily::V6] {
        let table = format!("{} {TABLE}", family_keyword(fam));
        let _ = writeln!(out, "add table {table}");
        let _ = writeln!(out, "delete table {table}");
    }
    out
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;

    use super::*;
    use crate::nft::service::{PlanContext, plan_service};
    use crate::table::{Endpoint, Protocol, ServicePort};

    fn port(name: &str, ip: &str, endpoints: &[&str]) -> ServicePort {
        let endpoints =
            endpoints.iter().map(|e| Endpoint { ip: e.parse().unwrap(), port: 8080, is_local: true }).collect();
        let mut sp = ServicePort::for_test(
            NamespacedName::new("default", name),
            Protocol::Tcp,
            ip.parse().unwrap(),
            80,
            endpoints,
        );
        sp.name.port = "http".into();
        sp
    }

    /// What a full sync of one Service's objects leaves shared.
    fn shared_of(objects: &Objects) -> Shared {
        full_sync(&[], [objects], &Existing::default()).1
    }

    fn plan(sp: ServicePort) -> Objects {
        plan_service(&[sp], &PlanContext::default())
    }

    #[test]
    fn an_unchanged_service_needs_no_ops() {
        let a = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]));
        assert!(partial_sync(&a, &a).is_empty());
    }

    #[test]
    fn replacing_one_endpoint_touches_only_that_endpoints_element_and_adds_no_rule() {
        let old = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]));
        let new = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.3"]));
        let ops = script(&partial_sync(&old, &new).ops());
        assert_eq!(
            ops,
            "delete element ip roadkeeper service-endpoints { 10.96.0.1 . tcp . 80 . 1 }\n\
             add element ip roadkeeper service-endpoints { 10.96.0.1 . tcp . 80 . 1 comment \"default/a:http\" : 10.244.0.3 . 8080 }\n"
        );
        // The hairpin pairs are shared: their changes come from `Shared`.
        let mut state = shared_of(&old);
        let (shared, change) = state.partial(&[(&old, &new)]);
        assert_eq!(
            script(&shared.ops()),
            "delete element ip roadkeeper hairpin { 10.244.0.2 . 10.244.0.2 }\n\
             add element ip roadkeeper hairpin { 10.244.0.3 . 10.244.0.3 }\n"
        );
        state.apply(change);
        assert_eq!(state, shared_of(&new));
    }

    #[test]
    fn a_new_endpoint_count_brings_its_set_and_rule_once() {
        let two = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]));
        let three = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2", "10.244.0.3"]));
        let other_three = plan(port("b", "10.96.0.2", &["10.244.0.1", "10.244.0.2", "10.244.0.3"]));
        let mut shared = shared_of(&two);
        let (ops, change) = shared.partial(&[(&two, &three)]);
        shared.apply(change);
        let ops = script(&ops.ops());
        assert!(
            ops.starts_with("add set ip roadkeeper service-endpoints-3 { type ipv4_addr . inet_proto . inet_service ;"),
            "{ops}"
        );
        assert!(ops.contains("add rule ip roadkeeper select-service-endpoint ip daddr . meta l4proto . th dport @service-endpoints-3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @service-endpoints\n"), "{ops}");
        // The picker chain is rewritten without the count that went out of use, whose set goes.
        assert!(ops.contains("flush chain ip roadkeeper select-service-endpoint\n"), "{ops}");
        assert!(!ops.contains("@service-endpoints-2 "), "{ops}");
        assert!(ops.ends_with("delete set ip roadkeeper service-endpoints-2\n"), "{ops}");
        // The Service's own ops move its frontend from the count set of 2 to that of 3.
        let own = script(&partial_sync(&two, &three).ops());
        assert!(own.contains("delete element ip roadkeeper service-endpoints-2 { 10.96.0.1 . tcp . 80 }"), "{own}");
        assert!(
            own.contains(
                "add element ip roadkeeper service-endpoints-3 { 10.96.0.1 . tcp . 80 comment \"default/a:http\" }"
            ),
            "{own}"
        );
        // A second Service with 3 endpoints adds no set, and shares the hairpin pairs.
        let (ops, _) = shared.partial(&[(&Objects::default(), &other_three)]);
        assert!(ops.is_empty(), "{}", script(&ops.ops()));
    }

    #[test]
    fn losing_all_endpoints_moves_the_cluster_ip_to_reject() {
        let old = plan(port("a", "10.96.0.1", &["10.244.0.1"]));
        let new = plan(port("a", "10.96.0.1", &[]));
        let ops = script(&partial_sync(&old, &new).ops());
        assert!(ops.contains("delete element ip roadkeeper service-endpoints { 10.96.0.1 . tcp . 80 . 0 }"), "{ops}");
        assert!(ops.contains("delete element ip roadkeeper service-endpoints-1 { 10.96.0.1 . tcp . 80 }"), "{ops}");
        assert!(
            ops.contains(
                "add element ip roadkeeper reject-services { 10.96.0.1 . tcp . 80 comment \"default/a:http\" }"
            ),
            "{ops}"
        );
    }

    #[test]
    fn an_element_changing_owner_is_removed_before_it_is_added() {
        let mut giver = port("a", "10.96.0.1", &["10.244.0.1"]);
        giver.external_ips = vec!["203.0.113.7".parse().unwrap()];
        let taker_before = port("b", "10.96.0.2", &["10.244.0.2"]);
        let mut taker_after = taker_before.clone();
        taker_after.external_ips = giver.external_ips.clone();
        let b = partial_sync(&plan(taker_before), &plan(taker_after));
        let a = partial_sync(&plan(giver), &Objects::default());
        let ops = script(&join_partial([&b, &a].into_iter()));
        let shared = "{ 203.0.113.7 . tcp . 80 . 0";
        let deleted = ops.find(&format!("delete element ip roadkeeper service-endpoints {shared}")).expect(&ops);
        let added = ops.find(&format!("add element ip roadkeeper service-endpoints {shared}")).expect(&ops);
        assert!(deleted < added, "{ops}");
    }

    #[test]
    fn a_full_sync_emits_each_services_ops_before_building_the_next() {
        let services = [
            plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2"])),
            plan(port("b", "10.96.0.2", &["10.244.0.1", "10.244.0.2"])),
        ];
        // Each op, with how many Services had been built when it came.
        let built = std::cell::Cell::new(0);
        let mut emitted: Vec<(String, usize)> = Vec::new();
        let shared = stream_full_sync(
            &[],
            services.iter().inspect(|_| built.set(built.get() + 1)),
            &Existing::default(),
            &mut |op| emitted.push((op.to_string(), built.get())),
        );
        let when = |text: &str| -> Vec<usize> {
            emitted.iter().filter(|(op, _)| op.starts_with(text)).map(|(_, n)| *n).collect()
        };
        assert_eq!(when("add element ip roadkeeper cluster-ips { 10.96.0.1 "), [1]);
        assert_eq!(when("add element ip roadkeeper cluster-ips { 10.96.0.2 "), [2]);
        // The count set of two endpoints and the hairpin pairs both hold go in once, with `a`.
        assert_eq!(when("add set ip roadkeeper service-endpoints-2 "), [1]);
        assert_eq!(when("add element ip roadkeeper hairpin { 10.244.0.1 . 10.244.0.1 }"), [1]);
        let (collected, same) = full_sync(&[], services.iter(), &Existing::default());
        assert_eq!(
            collected.iter().map(|op| op.to_string()).collect::<Vec<_>>(),
            emitted.into_iter().map(|(op, _)| op).collect::<Vec<_>>()
        );
        assert_eq!(shared, same);
    }

    #[test]
    fn full_sync_deletes_only_stale_objects() {
        let objects = plan(port("a", "10.96.0.1", &["10.244.0.1"]));
        let mut existing = Existing::default();
        existing.chains.insert((IpFamily::V4, "service-OLD-default/gone/tcp/".into()));
        existing.chains.insert((IpFamily::V4, "services".into()));
        existing.sets.insert((IpFamily::V4, "affinity-OLD".into()));
        existing.sets.insert((IpFamily::V4, "affinity".into()));
        let layouts = [Layout {
            family: IpFamily::V4,
            cluster_cidrs: Vec::new(),
            masquerade_mark: 0x4000,
            masquerade_all: false,
            nodeport_ips: Vec::new(),
            nodeport_all_local: false,
            service_cidrs: Vec::new(),
        }];
        let script = script(&full_sync(&layouts, std::iter::once(&objects), &existing).0);
        assert!(script.contains("delete chain ip roadkeeper service-OLD-default/gone/tcp/"));
        assert!(script.contains("delete set ip roadkeeper affinity-OLD"));
        assert!(!script.contains("delete set ip roadkeeper affinity\n"));
        assert!(!script.contains("delete chain ip roadkeeper services"));
        assert!(script.contains("add element ip roadkeeper cluster-ips { 10.96.0.1 comment \"default/a\" }"));
        assert!(script.contains("add set ip roadkeeper service-endpoints-1 "), "{script}");
        assert!(script.contains("flush set ip roadkeeper service-endpoints-1\n"), "{script}");
        // The affinity entries the packet path made outlive a full sync (as upstream's sets do);
        // per-endpoint sets of an older roadkeeper are stale and go.
        assert!(script.contains("add set ip roadkeeper affinity { "), "{script}");
        assert!(!script.contains("flush set ip roadkeeper affinity\n"), "{script}");
        assert!(script.contains("flush map ip roadkeeper service-ips\n"), "{script}");
    }
}
