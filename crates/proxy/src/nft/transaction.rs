//! Turns desired objects into `nft -f` scripts: a full sync that rewrites everything we own, and a
//! partial sync that touches only what differs between two versions of some Services' objects.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::layout::Layout;
use super::objects::{Container, Objects, TABLE, family_keyword};
use crate::table::IpFamily;

/// Names found in the kernel before a full sync (so that stale ones can be deleted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    /// Regular and base chains present in our tables.
    pub chains: BTreeSet<(IpFamily, String)>,
    /// Named sets and maps present in our tables.
    pub sets: BTreeSet<(IpFamily, String)>,
}

/// Prefix of every command on one family's table (`ip roadkeeper`).
fn table(family: IpFamily) -> String {
    format!("{} {TABLE}", family_keyword(family))
}

fn add_rules(out: &mut String, family: IpFamily, chain: &str, rules: &[String]) {
    for rule in rules {
        let _ = writeln!(out, "add rule {} {chain} {rule}", table(family));
    }
}

fn add_elements<'a>(out: &mut String, objects: impl IntoIterator<Item = (&'a (IpFamily, Container, String), &'a super::objects::Element)>) {
    for ((family, container, _), element) in objects {
        let _ = writeln!(
            out,
            "add element {} {} {{ {} }}",
            table(*family),
            container.name(),
            element.to_nft()
        );
    }
}

/// The complete script for a full sync: creates or refreshes every object we own, replaces all
/// rules and shared-map elements, keeps affinity sets' contents, deletes whatever stale chains
/// and sets `existing` lists. Applied as one atomic transaction.
pub fn full_sync(layouts: &[Layout], services: &Objects, existing: &Existing) -> String {
    let mut out = String::new();
    let mut wanted_chains: BTreeSet<(IpFamily, String)> = BTreeSet::new();
    let mut wanted_sets: BTreeSet<(IpFamily, String)> = BTreeSet::new();
    for layout in layouts {
        let fam = layout.family;
        let t = table(fam);
        let _ = writeln!(out, "add table {t} {{ comment \"rules for roadkeeper\" ; }}");
        for container in Container::ALL {
            let _ = writeln!(out, "add {} {t} {} {{ {} }}", container.keyword(), container.name(), container.declaration(fam));
            let _ = writeln!(out, "flush {} {t} {}", container.keyword(), container.name());
            wanted_sets.insert((fam, container.name().to_string()));
        }
        for set in layout.node_sets() {
            let _ = writeln!(out, "add set {t} {} {{ {} }}", set.name, set.declaration);
            let _ = writeln!(out, "flush set {t} {}", set.name);
            if !set.elements.is_empty() {
                let _ = writeln!(out, "add element {t} {} {{ {} }}", set.name, set.elements.join(", "));
            }
            wanted_sets.insert((fam, set.name.to_string()));
        }
        for chain in layout.helper_chains() {
            let _ = writeln!(out, "add chain {t} {}", chain.name);
            let _ = writeln!(out, "flush chain {t} {}", chain.name);
            wanted_chains.insert((fam, chain.name.to_string()));
        }
        for chain in layout.helper_chains() {
            add_rules(&mut out, fam, chain.name, &chain.rules);
        }
        for chain in layout.base_chains() {
            let _ = writeln!(out, "add chain {t} {} {{ {} }}", chain.name, chain.hook);
            let _ = writeln!(out, "flush chain {t} {}", chain.name);
            add_rules(&mut out, fam, chain.name, &chain.rules);
            wanted_chains.insert((fam, chain.name.to_string()));
        }
    }
    for ((fam, name), set) in &services.sets {
        let _ = writeln!(out, "add set {} {name} {{ {} }}", table(*fam), set.declaration);
        wanted_sets.insert((*fam, name.clone()));
    }
    for (fam, name) in services.chains.keys() {
        let _ = writeln!(out, "add chain {} {name}", table(*fam));
        let _ = writeln!(out, "flush chain {} {name}", table(*fam));
        wanted_chains.insert((*fam, name.clone()));
    }
    for ((fam, name), rules) in &services.chains {
        add_rules(&mut out, *fam, name, rules);
    }
    add_elements(&mut out, &services.elements);
    let stale_chains: Vec<_> = existing.chains.difference(&wanted_chains).collect();
    for (fam, name) in &stale_chains {
        let _ = writeln!(out, "flush chain {} {name}", table(*fam));
    }
    for (fam, name) in &stale_chains {
        let _ = writeln!(out, "delete chain {} {name}", table(*fam));
    }
    for (fam, name) in existing.sets.difference(&wanted_sets) {
        let _ = writeln!(out, "delete set {} {name}", table(*fam));
    }
    out
}

/// The script that moves the kernel from `old` to `new` for some Services: only chains whose
/// rules differ are flushed and rewritten, only changed elements are deleted or added.
/// Returns an empty string when nothing differs.
pub fn partial_sync(old: &Objects, new: &Objects) -> String {
    let mut out = String::new();
    for ((fam, name), set) in &new.sets {
        if !old.sets.contains_key(&(*fam, name.clone())) {
            let _ = writeln!(out, "add set {} {name} {{ {} }}", table(*fam), set.declaration);
        }
    }
    let mut rewritten = Vec::new();
    for (key @ (fam, name), rules) in &new.chains {
        match old.chains.get(key) {
            None => {
                let _ = writeln!(out, "add chain {} {name}", table(*fam));
                rewritten.push((key, rules));
            }
            Some(old_rules) if old_rules != rules => {
                let _ = writeln!(out, "flush chain {} {name}", table(*fam));
                rewritten.push((key, rules));
            }
            Some(_) => {}
        }
    }
    for ((fam, name), rules) in rewritten {
        add_rules(&mut out, *fam, name, rules);
    }
    for (key @ (fam, container, elem_key), element) in &old.elements {
        if new.elements.get(key) != Some(element) {
            let _ = writeln!(out, "delete element {} {} {{ {elem_key} }}", table(*fam), container.name());
        }
    }
    add_elements(&mut out, new.elements.iter().filter(|(k, e)| old.elements.get(*k) != Some(*e)));
    let removed: Vec<_> = old.chains.keys().filter(|k| !new.chains.contains_key(*k)).collect();
    for (fam, name) in &removed {
        let _ = writeln!(out, "flush chain {} {name}", table(*fam));
    }
    for (fam, name) in &removed {
        let _ = writeln!(out, "delete chain {} {name}", table(*fam));
    }
    for (fam, name) in old.sets.keys() {
        if !new.sets.contains_key(&(*fam, name.clone())) {
            let _ = writeln!(out, "delete set {} {name}", table(*fam));
        }
    }
    out
}

/// Script that removes everything roadkeeper installed (both tables), and nothing else.
pub fn cleanup() -> String {
    let mut out = String::new();
    for fam in [IpFamily::V4, IpFamily::V6] {
        let _ = writeln!(out, "add table {}", table(fam));
        let _ = writeln!(out, "delete table {}", table(fam));
    }
    out
}
