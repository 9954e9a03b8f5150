//! The maps as `cilium bpf lb list` prints its own: one line per `services` entry, the master
//! entry first (the frontend's identifier, how it picks, what it does without a backend), then
//! each slot with the backend it names; then each Maglev table's share per backend.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::maps::{Maps, Master, SlotValue};
use super::plan::{ANY_PORT, Empty, FrontendKey, Scope, Selection};

/// `roadkeeper rules --proxy-mode ebpf`'s listing of `maps`.
pub fn lb_list(maps: &Maps) -> String {
    let mut out = format!("{:<36} {}\n", "SERVICE ADDRESS", "BACKEND ADDRESS (REVNAT_ID) (SLOT)");
    let mut last = None;
    for (key, value) in &maps.services {
        let frontend = if last == Some(key.frontend) { String::new() } else { key.frontend.to_string() };
        last = Some(key.frontend);
        match value {
            SlotValue::Master(_) if key.frontend.port == ANY_PORT => {
                let _ = writeln!(out, "{frontend:<36} refused [socket, no Service port]");
            }
            SlotValue::Master(master) => {
                let _ = writeln!(out, "{frontend:<36} {}", master_summary(&key.frontend, master));
            }
            SlotValue::Backend(id) => {
                let id_of = maps.master(&key.frontend).map_or(0, |m| m.id);
                let backend =
                    maps.backends.get(id).map_or_else(|| format!("backend {id} missing"), ToString::to_string);
                let _ = writeln!(out, "{frontend:<36} {backend} ({id_of}) ({})", key.slot);
            }
        }
    }
    for (id, table) in &maps.maglev {
        let mut shares: BTreeMap<u32, usize> = BTreeMap::new();
        for backend in table {
            *shares.entry(*backend).or_default() += 1;
        }
        let shares: Vec<String> = shares
            .iter()
            .map(|(backend, n)| {
                let address = maps.backends.get(backend).map_or_else(|| format!("#{backend}"), ToString::to_string);
                format!("{address} {n}")
            })
            .collect();
        let _ = writeln!(out, "maglev ({id}): {} slots: {}", table.len(), shares.join(", "));
    }
    for (id, range) in &maps.source_ranges {
        let _ = writeln!(out, "source range ({id}): {range}");
    }
    out
}

/// A master entry as the listing (and the tracer) shows it: `2 backends (1) (0) [socket, random,
/// reject when empty]`: the count, the identifier, slot 0, then how the frontend works.
pub fn master_summary(frontend: &FrontendKey, master: &Master) -> String {
    let mut notes = vec![match frontend.scope {
        Scope::Internal => "socket",
        Scope::External => "tc",
    }];
    notes.push(match master.selection {
        Selection::Random => "random",
        Selection::Maglev => "maglev",
    });
    notes.push(match master.empty {
        Empty::Reject => "reject when empty",
        Empty::Drop => "drop when empty",
    });
    let affinity = format!("affinity {}s", master.affinity);
    if master.affinity > 0 {
        notes.push(&affinity);
    }
    if master.source_ranges {
        notes.push("source ranges");
    }
    if master.masquerade {
        notes.push(match frontend.scope {
            Scope::Internal => "masquerade from outside",
            Scope::External => "masquerade",
        });
    }
    format!("{} backends ({}) (0) [{}]", master.count, master.id, notes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyConfig;
    use crate::ebpf::maps::{Layout, MapLimits};
    use crate::ebpf::plan::EbpfPlan;
    use crate::ebpf::plan::tests::{ep, node, port};

    #[test]
    fn the_listing_shows_each_frontend_its_slots_and_the_maglev_shares() {
        let mut p = port("a", "10.96.0.10", vec![ep("10.244.0.11", true), ep("10.244.1.12", false)]);
        p.affinity_timeout = Some(600);
        p.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
        p.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
        let plan = EbpfPlan::new(&ProxyConfig::default(), &node(), [&p]);
        let mut layout = Layout::adopt(Maps::default());
        let limits = MapLimits { maglev_table_size: 251, ..MapLimits::default() };
        let (_, refused) = layout.sync(&plan, &limits);
        assert!(refused.is_empty());
        let listing = lb_list(layout.maps());
        let expected = "\
SERVICE ADDRESS                      BACKEND ADDRESS (REVNAT_ID) (SLOT)
10.96.0.10:*/tcp                     refused [socket, no Service port]
10.96.0.10:*/udp                     refused [socket, no Service port]
10.96.0.10:*/sctp                    refused [socket, no Service port]
10.96.0.10:80/tcp                    2 backends (1) (0) [socket, random, reject when empty, affinity 600s]
                                     10.244.0.11:8080 (1) (1)
                                     10.244.1.12:8080 (1) (2)
203.0.113.9:80/tcp                   2 backends (2) (0) [socket, random, reject when empty, affinity 600s]
                                     10.244.0.11:8080 (2) (1)
                                     10.244.1.12:8080 (2) (2)
203.0.113.9:80/tcp (external)        2 backends (2) (0) [tc, maglev, reject when empty, affinity 600s, source ranges, masquerade]
                                     10.244.0.11:8080 (2) (1)
                                     10.244.1.12:8080 (2) (2)
";
        assert!(listing.starts_with(expected), "{listing}");
        let maglev = listing.lines().find(|l| l.starts_with("maglev (2): 251 slots: ")).expect(&listing);
        let shares: Vec<usize> = maglev.split(", ").map(|s| s.rsplit(' ').next().unwrap().parse().unwrap()).collect();
        assert_eq!((shares.len(), shares.iter().sum::<usize>()), (2, 251), "{maglev}");
        assert!(listing.ends_with("source range (2): 198.51.100.0/24\n"), "{listing}");
    }
}
