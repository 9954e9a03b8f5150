//! Turns desired objects into transactions (`Op` lists): a full sync that rewrites everything we
//! own, and a partial sync that touches only what differs between two versions of some Services'
//! objects. Both are sent as one netlink batch; [`script`] renders them for `nft -f`.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::layout::Layout;
use super::objects::{Container, ElementValue, Objects, TABLE, family_keyword};
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
    Op::AddElement { family, container, key: key.clone(), value: value.verdict.clone(), comment: value.comment.clone() }
}

/// The op that appends one rule.
fn add_rule(chain: &str, rule: &Rule) -> Op {
    Op::AddRule { chain: chain.to_string(), rule: rule.clone() }
}

/// Renders ops as an `nft -f` script.
pub fn script(ops: &[Op]) -> String {
    ops.iter().map(|op| format!("{op}\n")).collect()
}

/// The fixed layout of both tables as ops (see [`Layout::ops`]): the first part of a full sync.
pub fn layout_ops(layouts: &[Layout]) -> Vec<Op> {
    layouts.iter().flat_map(Layout::ops).collect()
}

/// A full sync as one transaction: the layout of both tables (shared maps emptied), every
/// Service's chains, affinity sets (their contents kept) and map elements, and the deletion of
/// whatever stale chains and sets `existing` lists. Applied atomically, traffic never sees a
/// half-built table.
pub fn full_sync<'a>(
    layouts: &[Layout],
    services: impl Iterator<Item = &'a Objects> + Clone,
    existing: &Existing,
) -> Vec<Op> {
    let mut ops = layout_ops(layouts);
    let mut wanted_chains: BTreeSet<(IpFamily, String)> = BTreeSet::new();
    let mut wanted_sets: BTreeSet<(IpFamily, String)> = BTreeSet::new();
    for layout in layouts {
        let family = layout.family;
        wanted_sets.extend(Container::ALL.iter().map(|c| (family, c.name().to_string())));
        let layout_chains =
            layout.helper_chains().into_iter().map(|c| c.name).chain(layout.base_chains().into_iter().map(|c| c.name));
        wanted_chains.extend(layout_chains.map(|name| (family, name.to_string())));
    }
    for ((family, name), set) in services.clone().flat_map(|o| &o.sets) {
        ops.push(Op::AddSet { family: *family, name: name.clone(), set: set.clone() });
        wanted_sets.insert((*family, name.clone()));
    }
    for (family, name) in services.clone().flat_map(|o| o.chains.keys()) {
        ops.push(Op::AddChain { family: *family, name: name.clone() });
        ops.push(Op::FlushChain { family: *family, name: name.clone() });
        wanted_chains.insert((*family, name.clone()));
    }
    for ((_, name), rules) in services.clone().flat_map(|o| &o.chains) {
        ops.extend(rules.iter().map(|rule| add_rule(name, rule)));
    }
    for ((family, container, key), value) in services.flat_map(|o| &o.elements) {
        ops.push(add_element(*family, *container, key, value));
    }
    let stale_chains: Vec<_> = existing.chains.difference(&wanted_chains).collect();
    for (family, name) in &stale_chains {
        ops.push(Op::FlushChain { family: *family, name: name.clone() });
    }
    for (family, name) in &stale_chains {
        ops.push(Op::DeleteChain { family: *family, name: name.clone() });
    }
    for (family, name) in existing.sets.difference(&wanted_sets) {
        ops.push(Op::DeleteSet { family: *family, name: name.clone() });
    }
    ops
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
pub fn partial_sync(old: &Objects, new: &Objects) -> PartialOps {
    let mut out = PartialOps::default();
    let build = &mut out.phases[PartialOps::BUILD];
    for ((family, name), set) in &new.sets {
        if !old.sets.contains_key(&(*family, name.clone())) {
            build.push(Op::AddSet { family: *family, name: name.clone(), set: set.clone() });
        }
    }
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
    for (key @ (family, container, elem_key), value) in &old.elements {
        if new.elements.get(key) != Some(value) {
            let op = Op::DeleteElement { family: *family, container: *container, key: elem_key.clone() };
            out.phases[PartialOps::UNLINK].push(op);
        }
    }
    for (key @ (family, container, elem_key), value) in &new.elements {
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
    for (family, name) in old.sets.keys() {
        if !new.sets.contains_key(&(*family, name.clone())) {
            tear_down.push(Op::DeleteSet { family: *family, name: name.clone() });
        }
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

    fn plan(sp: ServicePort) -> Objects {
        plan_service(&[sp], &PlanContext::default())
    }

    #[test]
    fn an_unchanged_service_needs_no_ops() {
        let a = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]));
        assert!(partial_sync(&a, &a).is_empty());
    }

    #[test]
    fn replacing_one_endpoint_touches_only_that_services_chains() {
        let old = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]));
        let new = plan(port("a", "10.96.0.1", &["10.244.0.1", "10.244.0.3"]));
        let ops = script(&partial_sync(&old, &new).ops());
        let lines: Vec<&str> = ops.lines().collect();
        assert!(lines.iter().all(|l| l.contains("default/a")), "{ops}");
        assert!(!ops.contains("element"), "map elements did not change: {ops}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("add chain")).count(), 1, "{ops}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("delete chain")).count(), 1, "{ops}");
        assert!(lines[0].starts_with("add chain") && lines.last().unwrap().starts_with("delete chain"), "{ops}");
    }

    #[test]
    fn losing_all_endpoints_moves_the_cluster_ip_to_reject() {
        let old = plan(port("a", "10.96.0.1", &["10.244.0.1"]));
        let new = plan(port("a", "10.96.0.1", &[]));
        let ops = script(&partial_sync(&old, &new).ops());
        assert!(ops.contains("delete element ip roadkeeper service-ips { 10.96.0.1 . tcp . 80 }"), "{ops}");
        assert!(ops.contains("add element ip roadkeeper no-endpoint-services { 10.96.0.1 . tcp . 80 comment \"default/a:http\" : goto reject-chain }"), "{ops}");
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
        let shared = "{ 203.0.113.7 . tcp . 80";
        let deleted = ops.find(&format!("delete element ip roadkeeper service-ips {shared}")).expect(&ops);
        let added = ops.find(&format!("add element ip roadkeeper service-ips {shared}")).expect(&ops);
        assert!(deleted < added, "{ops}");
    }

    #[test]
    fn full_sync_deletes_only_stale_objects() {
        let objects = plan(port("a", "10.96.0.1", &["10.244.0.1"]));
        let mut existing = Existing::default();
        existing.chains.insert((IpFamily::V4, "service-OLD-default/gone/tcp/".into()));
        existing.chains.insert((IpFamily::V4, "services".into()));
        existing.sets.insert((IpFamily::V4, "affinity-OLD".into()));
        let layouts = [Layout {
            family: IpFamily::V4,
            cluster_cidrs: Vec::new(),
            masquerade_mark: 0x4000,
            nodeport_ips: Vec::new(),
            nodeport_all_local: false,
            service_cidrs: Vec::new(),
        }];
        let script = script(&full_sync(&layouts, std::iter::once(&objects), &existing));
        assert!(script.contains("delete chain ip roadkeeper service-OLD-default/gone/tcp/"));
        assert!(script.contains("delete set ip roadkeeper affinity-OLD"));
        assert!(!script.contains("delete chain ip roadkeeper services"));
        assert!(script.contains("add element ip roadkeeper cluster-ips { 10.96.0.1 comment \"default/a\" }"));
    }
}
