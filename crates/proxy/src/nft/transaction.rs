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

/// The ops that move the kernel from `old` to `new` for some Services: only chains whose rules
/// differ are flushed and rewritten, only changed elements are deleted or added. Empty when
/// nothing differs.
pub fn partial_sync(old: &Objects, new: &Objects) -> Vec<Op> {
    let mut ops = Vec::new();
    for ((family, name), set) in &new.sets {
        if !old.sets.contains_key(&(*family, name.clone())) {
            ops.push(Op::AddSet { family: *family, name: name.clone(), set: set.clone() });
        }
    }
    let mut rewritten = Vec::new();
    for (key @ (family, name), rules) in &new.chains {
        match old.chains.get(key) {
            None => {
                ops.push(Op::AddChain { family: *family, name: name.clone() });
                rewritten.push((name, rules));
            }
            Some(old_rules) if old_rules != rules => {
                ops.push(Op::FlushChain { family: *family, name: name.clone() });
                rewritten.push((name, rules));
            }
            Some(_) => {}
        }
    }
    for (name, rules) in rewritten {
        ops.extend(rules.iter().map(|rule| add_rule(name, rule)));
    }
    for (key @ (family, container, elem_key), value) in &old.elements {
        if new.elements.get(key) != Some(value) {
            ops.push(Op::DeleteElement { family: *family, container: *container, key: elem_key.clone() });
        }
    }
    for (key @ (family, container, elem_key), value) in &new.elements {
        if old.elements.get(key) != Some(value) {
            ops.push(add_element(*family, *container, elem_key, value));
        }
    }
    let removed: Vec<_> = old.chains.keys().filter(|k| !new.chains.contains_key(*k)).collect();
    for (family, name) in &removed {
        ops.push(Op::FlushChain { family: *family, name: name.clone() });
    }
    for (family, name) in &removed {
        ops.push(Op::DeleteChain { family: *family, name: name.clone() });
    }
    for (family, name) in old.sets.keys() {
        if !new.sets.contains_key(&(*family, name.clone())) {
            ops.push(Op::DeleteSet { family: *family, name: name.clone() });
        }
    }
    ops
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
        let ops = script(&partial_sync(&old, &new));
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
        let ops = script(&partial_sync(&old, &new));
        assert!(ops.contains("delete element ip roadkeeper service-ips { 10.96.0.1 . tcp . 80 }"), "{ops}");
        assert!(ops.contains("add element ip roadkeeper no-endpoint-services { 10.96.0.1 . tcp . 80 comment \"default/a:http\" : goto reject-chain }"), "{ops}");
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
