//! eBPF mode as its maps hold it after a full sync (the node's [`EbpfPlan`] laid out by
//! [`Layout::sync`], as `roadkeeper rules --proxy-mode ebpf` prints it), and how a new
//! connection goes through its programs. Where the address is translated is the station:
//!
//! - **The socket** ([`Entry::Host`], [`Entry::LocalPod`]: a process of the node's cgroup): at
//!   `connect()` (TCP) or `sendmsg()` (UDP) the cgroup program looks the destination up among
//!   the internal frontends and changes the address the socket uses; no packet is NATed, and the
//!   source is never masqueraded. A port of a ClusterIP that no Service port serves, and a
//!   frontend without endpoints, fail the call (ECONNREFUSED; EHOSTUNREACH under a Local policy
//!   without a local endpoint).
//! - **The node's NIC** ([`Entry::Received`]): `rk_from_outside` at tc ingress looks up the
//!   external frontend (a ClusterIP falls back to its internal one unless that is balanced by
//!   Maglev), checks the source ranges, picks a backend (the client's affinity entry, else its
//!   Maglev share or a random slot), rewrites the destination and marks the packet; the fixed
//!   table `inet roadkeeper-ebpf` masquerades marked packets on their way out and rejects those
//!   marked for a frontend without endpoints.
//!
//! Not modelled: established flows (`RK_FLOWS`; the trace is of a connection's first packet),
//! which flow hash Maglev computes (each backend is a landing with its share of the table),
//! interfaces without the tc programs (`--bpf-devices`), IPv6 sockets reaching IPv4 frontends by
//! mapped addresses, and fragments or IPv6 extension headers (which pass untranslated).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use roadkeeper_ebpf_common::names;

use super::{
    Branch, Delivery, Effect, Entry, Environment, Error, Masquerade, Packet, Path, RuleRef, Step, Trace, Verdict,
};
use crate::ebpf::maps::{BackendId, Layout, Maps, Master};
use crate::ebpf::netfilter::{self, MASQUERADE_CHAIN, MASQUERADE_MARK, REJECT_CHAINS, REJECT_MARK};
use crate::ebpf::plan::{ANY_PORT, EbpfPlan, Empty, FrontendKey, Scope, Selection};
use crate::ebpf::show::master_summary;
use crate::nft::rule::HookPoint;
use crate::plan::NodePlan;
use crate::table::{IpFamily, Protocol};

/// How the BPF programs are named in traces (their "table").
pub const BPF: &str = "BPF";
/// The program on the node's interfaces that translates traffic from outside.
pub const FROM_OUTSIDE: &str = "rk_from_outside";

/// eBPF mode's kernel side after a full sync: the maps the programs read.
#[derive(Debug, Clone)]
pub struct Tables {
    maps: Maps,
}

/// The entry of [`Environment::affinity`] saying the packet's source (its network namespace, for
/// the socket programs) is held by `frontend`'s session affinity to `backend` in slot `slot`: the
/// programs keep a client only while its slot still names its backend.
pub fn affinity_entry(frontend: &FrontendKey, backend: SocketAddr, slot: usize) -> String {
    let map = match frontend.scope {
        Scope::Internal => names::AFFINITY,
        Scope::External => names::AFFINITY_EXTERNAL,
    };
    format!("{map} {frontend} -> {backend} (slot {slot})")
}

/// The table rules live in, as traces name it.
fn table() -> String {
    format!("inet {}", netfilter::TABLE)
}

/// A decision of program `program`, as a verdict's "rule".
fn decision(program: &str, what: String) -> RuleRef {
    RuleRef { table: BPF.into(), chain: program.into(), rule: what }
}

/// A map lookup step.
fn lookup(map: &str, key: String, found: Option<String>) -> Step {
    Step::Lookup { map: map.into(), key, found, chance: None, effects: Vec::new() }
}

/// How one path of a trace ends, with its own steps (after the ones every path shares).
struct Ending {
    probability: f64,
    steps: Vec<Step>,
    verdict: Verdict,
    dnat: Option<SocketAddr>,
    masquerade: Option<Masquerade>,
    affinity: Vec<String>,
}

impl Ending {
    /// Delivered to `destination` (unchanged, or translated when `dnat`).
    fn delivered(mut steps: Vec<Step>, destination: SocketAddr, dnat: bool, env: &Environment) -> Ending {
        let delivery = if env.is_local(destination.ip()) { Delivery::Local } else { Delivery::Forwarded };
        steps.push(Step::Route { to: delivery, destination });
        Ending {
            probability: 1.0,
            steps,
            verdict: Verdict::Accepted { delivery },
            dnat: dnat.then_some(destination),
            masquerade: None,
            affinity: Vec::new(),
        }
    }

    /// Ended by a verdict other than delivery.
    fn stopped(steps: Vec<Step>, verdict: Verdict) -> Ending {
        Ending { probability: 1.0, steps, verdict, dnat: None, masquerade: None, affinity: Vec::new() }
    }
}

/// The trace of `packet` from the steps every path shares and the ways it ends.
fn assemble(packet: &Packet, shared: Vec<Step>, endings: Vec<Ending>) -> Trace {
    let cut = shared.len();
    let paths = endings
        .into_iter()
        .enumerate()
        .map(|(index, ending)| {
            let (branch, steps) = if index == 0 {
                (None, shared.iter().cloned().chain(ending.steps).collect())
            } else {
                (Some(Branch { path: 0, step: cut }), ending.steps)
            };
            Path {
                probability: ending.probability,
                branch,
                steps,
                verdict: ending.verdict,
                dnat: ending.dnat,
                masquerade: ending.masquerade,
                affinity: ending.affinity,
            }
        })
        .collect();
    Trace { backend: "ebpf", packet: packet.clone(), paths }
}

impl Tables {
    /// The maps a full sync of `plan` writes (a Service the maps cannot hold is left out, as the
    /// proxy leaves it).
    pub fn of(plan: &NodePlan) -> Tables {
        let ebpf = EbpfPlan::new(&plan.cfg, &plan.node, plan.ports.ports.values().flatten());
        let mut layout = Layout::adopt(Maps::default());
        layout.sync(&ebpf, &plan.cfg.ebpf.limits);
        Tables { maps: layout.maps().clone() }
    }

    /// The maps, as `roadkeeper rules --proxy-mode ebpf` lists them.
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    /// Every way `packet` can go through the programs.
    pub fn trace(&self, packet: &Packet, env: &Environment) -> Result<Trace, Error> {
        if IpFamily::of(&packet.source) != IpFamily::of(&packet.destination.ip()) {
            return Err(Error::MixedFamilies { from: packet.source, to: packet.destination });
        }
        let (shared, endings) = match packet.entry {
            Entry::Host | Entry::LocalPod => self.socket(packet, env),
            Entry::Received => self.at_the_nic(packet, env),
        };
        Ok(assemble(packet, shared, endings))
    }

    /// The affinity entries that hold a source to `endpoint` (of every frontend sending there).
    pub fn affinity_sets(&self, protocol: Protocol, endpoint: SocketAddr) -> BTreeSet<String> {
        self.maps
            .services
            .keys()
            .filter(|key| key.slot == 0 && key.frontend.protocol == protocol)
            .filter(|key| self.maps.master(&key.frontend).is_some_and(|m| m.affinity > 0))
            .flat_map(|key| {
                self.backends(&key.frontend)
                    .filter(|(_, _, address)| *address == endpoint)
                    .map(|(slot, _, address)| affinity_entry(&key.frontend, address, slot))
            })
            .collect()
    }

    /// `frontend`'s backends: slot, identifier, address.
    fn backends(&self, frontend: &FrontendKey) -> impl Iterator<Item = (usize, BackendId, SocketAddr)> + '_ {
        self.maps
            .slots(frontend)
            .into_iter()
            .enumerate()
            .filter_map(|(index, id)| self.maps.backends.get(&id).map(|address| (index + 1, id, *address)))
    }

    /// Looks `frontend`'s master entry up, recording the step.
    fn master(&self, steps: &mut Vec<Step>, frontend: &FrontendKey) -> Option<Master> {
        let master = self.maps.master(frontend).copied();
        let found = master.map(|m| master_summary(frontend, &m));
        steps.push(lookup(names::SERVICES, format!("{frontend} slot 0"), found));
        master
    }

    /// A `connect()` or `sendmsg()` of a process in the node's cgroup.
    fn socket(&self, packet: &Packet, env: &Environment) -> (Vec<Step>, Vec<Ending>) {
        let call = if packet.protocol == Protocol::Udp { "sendmsg" } else { "connect" };
        let version = if packet.destination.is_ipv4() { 4 } else { 6 };
        let program = format!("rk_{call}{version}");
        let mut steps = vec![Step::Program {
            program: program.clone(),
            attach: format!(
                "cgroup {call}{version} of the node's cgroup: the socket's destination is translated at {call}(), before any packet"
            ),
        }];
        let key = FrontendKey {
            address: packet.destination.ip(),
            port: packet.destination.port(),
            protocol: packet.protocol,
            scope: Scope::Internal,
        };
        let refused = |steps: Vec<Step>, what: String, errno: &str| {
            let verdict =
                Verdict::Rejected { by: decision(&program, what), with: format!("{call}() fails with {errno}") };
            vec![Ending::stopped(steps, verdict)]
        };
        let Some(master) = self.master(&mut steps, &key) else {
            let other_ports = FrontendKey { port: ANY_PORT, ..key };
            if self.master(&mut steps, &other_ports).is_some() {
                let what = format!("{other_ports}: no Service port serves {}", key.port);
                return (steps, refused(Vec::new(), what, "ECONNREFUSED"));
            }
            return (steps, vec![Ending::delivered(Vec::new(), packet.destination, false, env)]);
        };
        if master.count == 0 {
            let (errno, why) = match master.empty {
                Empty::Reject => ("ECONNREFUSED", "no endpoints"),
                Empty::Drop => ("EHOSTUNREACH", "no endpoint on this node (traffic policy Local)"),
            };
            return (steps, refused(Vec::new(), format!("{key}: {why}"), errno));
        }
        let endings = self.choose(&mut steps, &key, &master, packet, env, &program);
        (steps, endings)
    }

    /// A packet received on one of the node's interfaces (tc ingress).
    fn at_the_nic(&self, packet: &Packet, env: &Environment) -> (Vec<Step>, Vec<Ending>) {
        let mut steps = vec![Step::Program {
            program: FROM_OUTSIDE.into(),
            attach:
                "tc ingress of the node's interfaces (--bpf-devices): the packet's destination is rewritten at the NIC"
                    .into(),
        }];
        steps.push(lookup(names::FLOWS, format!("{} -> {}", packet.source, packet.destination), None));
        let external = FrontendKey {
            address: packet.destination.ip(),
            port: packet.destination.port(),
            protocol: packet.protocol,
            scope: Scope::External,
        };
        let internal = FrontendKey { scope: Scope::Internal, ..external };
        let found = match self.master(&mut steps, &external) {
            Some(master) => Some((external, master)),
            // A ClusterIP reached from outside: its socket entry, unless Maglev balances it.
            None => {
                self.master(&mut steps, &internal).filter(|m| m.selection != Selection::Maglev).map(|m| (internal, m))
            }
        };
        let Some((key, master)) = found else {
            let other_ports = FrontendKey { port: ANY_PORT, ..internal };
            if self.master(&mut steps, &other_ports).is_some() {
                return (steps, vec![self.rejected_by_table(packet, env, other_ports)]);
            }
            return (steps, vec![Ending::delivered(Vec::new(), packet.destination, false, env)]);
        };
        if master.source_ranges {
            let range = self
                .maps
                .source_ranges
                .iter()
                .find(|(id, net)| *id == master.id && net.contains(&packet.source))
                .map(|(_, net)| net.to_string());
            let admitted = range.is_some();
            steps.push(lookup(names::SOURCE_RANGES, format!("frontend {} source {}", master.id, packet.source), range));
            if !admitted {
                let by = decision(FROM_OUTSIDE, format!("{key}: source not in its loadBalancerSourceRanges"));
                return (steps, vec![Ending::stopped(Vec::new(), Verdict::Dropped { by })]);
            }
        }
        if master.count == 0 {
            if master.empty == Empty::Drop {
                let by = decision(FROM_OUTSIDE, format!("{key}: no endpoint on this node (traffic policy Local)"));
                return (steps, vec![Ending::stopped(Vec::new(), Verdict::Dropped { by })]);
            }
            return (steps, vec![self.rejected_by_table(packet, env, key)]);
        }
        let endings = self.choose(&mut steps, &key, &master, packet, env, FROM_OUTSIDE);
        (steps, endings)
    }

    /// Marked for rejection by the program (`frontend` has nothing to send it to); the table's
    /// filter chain of the packet's path answers the sender.
    fn rejected_by_table(&self, packet: &Packet, env: &Environment, frontend: FrontendKey) -> Ending {
        let local = env.is_local(packet.destination.ip());
        let delivery = if local { Delivery::Local } else { Delivery::Forwarded };
        let (chain, _) = REJECT_CHAINS[usize::from(!local)];
        let hook = if local { HookPoint::Input } else { HookPoint::Forward };
        let [tcp, other] = netfilter::reject_rules();
        let (index, rule, with) = match (packet.protocol, packet.destination.is_ipv4()) {
            (Protocol::Tcp, _) => (0, tcp, "tcp reset"),
            (_, true) => (1, other, "icmp port-unreachable"),
            (_, false) => (1, other, "icmpv6 port-unreachable"),
        };
        let steps = vec![
            Step::Lookup {
                map: names::SERVICES.into(),
                key: format!("{frontend}"),
                found: Some("no backend: to be rejected".into()),
                chance: None,
                effects: vec![Effect::Mark { mark: REJECT_MARK }],
            },
            Step::Route { to: delivery, destination: packet.destination },
            Step::Hook { hook },
            Step::Rule {
                table: table(),
                chain: chain.into(),
                index,
                rule: rule.clone(),
                matched: true,
                element: None,
                chance: None,
                effects: vec![Effect::Reject { with: with.into() }],
            },
        ];
        let by = RuleRef { table: table(), chain: chain.into(), rule };
        Ending::stopped(steps, Verdict::Rejected { by, with: with.into() })
    }

    /// The backends a new connection to `key` (master entry `master`) may land on, one ending
    /// each: the one the client's affinity entry names, else each Maglev share or random slot
    /// (the affinity lookup joins the shared `steps`).
    fn choose(
        &self,
        steps: &mut Vec<Step>,
        key: &FrontendKey,
        master: &Master,
        packet: &Packet,
        env: &Environment,
        program: &str,
    ) -> Vec<Ending> {
        let backends: Vec<(usize, BackendId, SocketAddr)> = self.backends(key).collect();
        // (probability, the lookup that picked the backend, its slot, the backend).
        let mut picks: Vec<(f64, Step, usize, BackendId, SocketAddr)> = Vec::new();
        if master.affinity > 0 {
            let (map, client) = match key.scope {
                Scope::Internal => (names::AFFINITY, "the client's network namespace".to_owned()),
                Scope::External => (names::AFFINITY_EXTERNAL, packet.source.to_string()),
            };
            let held =
                backends.iter().find(|(slot, _, address)| env.affinity.contains(&affinity_entry(key, *address, *slot)));
            let found = held.map(|(slot, id, _)| format!("backend {id} (slot {slot}), within {}s", master.affinity));
            steps.push(lookup(map, format!("{client}, frontend {}", master.id), found));
            if let Some((slot, id, address)) = held {
                let step = lookup(names::BACKENDS, id.to_string(), Some(address.to_string()));
                picks.push((1.0, step, *slot, *id, *address));
            }
        }
        if picks.is_empty() {
            let slots = |picks: &mut Vec<_>| {
                let chance = 1.0 / backends.len() as f64;
                for (slot, id, address) in &backends {
                    let step = Step::Lookup {
                        map: names::SERVICES.into(),
                        key: format!("{key} slot {slot}"),
                        found: Some(format!("backend {id}")),
                        chance: Some(chance),
                        effects: Vec::new(),
                    };
                    picks.push((chance, step, *slot, *id, *address));
                }
            };
            match (master.selection, self.maps.maglev.get(&master.id)) {
                // Affinity picks a random slot, ahead of Maglev.
                (Selection::Maglev, Some(table)) if master.affinity == 0 && !table.is_empty() => {
                    let mut shares: BTreeMap<BackendId, usize> = BTreeMap::new();
                    for id in table {
                        *shares.entry(*id).or_default() += 1;
                    }
                    for (id, share) in shares {
                        let Some(address) = self.maps.backends.get(&id) else { continue };
                        let chance = share as f64 / table.len() as f64;
                        let step = Step::Lookup {
                            map: names::MAGLEV.into(),
                            key: format!("frontend {}, the flow's hash % {}", master.id, table.len()),
                            found: Some(format!("backend {id} ({share} of {} slots)", table.len())),
                            chance: Some(chance),
                            effects: Vec::new(),
                        };
                        // (Maglev is never used with affinity: the slot is only for the record.)
                        let slot = backends.iter().find(|(_, of, _)| *of == id).map_or(0, |(slot, _, _)| *slot);
                        picks.push((chance, step, slot, id, *address));
                    }
                }
                _ => slots(&mut picks),
            }
        }
        if picks.is_empty() {
            // Slots the loader has not written: the programs treat the frontend as empty.
            let by = decision(program, format!("{key}: no backend slot written"));
            return vec![Ending::stopped(Vec::new(), Verdict::Dropped { by })];
        }
        picks
            .into_iter()
            .map(|(probability, pick, slot, id, address)| {
                let mut effects = vec![match packet.entry {
                    Entry::Received => Effect::Dnat { to: address },
                    Entry::Host | Entry::LocalPod => Effect::Connect { to: address },
                }];
                let remembered = (master.affinity > 0).then(|| affinity_entry(key, address, slot));
                effects.extend(remembered.clone().map(|set| Effect::Affinity { set }));
                // The socket programs' clients are on the node: never masqueraded.
                let masquerade = master.masquerade && packet.entry == Entry::Received;
                if masquerade {
                    effects.push(Effect::Mark { mark: MASQUERADE_MARK });
                }
                let translate = Step::Lookup {
                    map: names::BACKENDS.into(),
                    key: id.to_string(),
                    found: Some(address.to_string()),
                    chance: None,
                    effects,
                };
                let mut ending = Ending::delivered(vec![pick, translate], address, true, env);
                ending.probability = probability;
                ending.affinity = remembered.into_iter().collect();
                if masquerade && ending.verdict == (Verdict::Accepted { delivery: Delivery::Forwarded }) {
                    let rule = netfilter::masquerade_rule();
                    ending.steps.push(Step::Hook { hook: HookPoint::Postrouting });
                    ending.steps.push(Step::Rule {
                        table: table(),
                        chain: MASQUERADE_CHAIN.into(),
                        index: 0,
                        rule: rule.clone(),
                        matched: true,
                        element: None,
                        chance: None,
                        effects: vec![Effect::Masquerade],
                    });
                    let why = format!("{key} masquerades: mark {MASQUERADE_MARK:#x}");
                    ending.masquerade = Some(Masquerade {
                        marked_by: vec![decision(program, why)],
                        by: RuleRef { table: table(), chain: MASQUERADE_CHAIN.into(), rule },
                    });
                }
                ending
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyMode;
    use crate::trace::lab::{From, Lab, NODE, PodState, at, cluster_ip, external_host, node_ip, node_port};

    fn web(extra: &str) -> Lab {
        let mut lab = Lab::new();
        lab.pod("web-a", "app: web", NODE, PodState::Ready);
        lab.pod("web-b", "app: web", "node-b", PodState::Ready);
        lab.service("web", 7, extra);
        lab
    }

    /// The programs and maps of path `index`, in order: `program`, `MAP[key]`.
    fn stations(trace: &Trace, index: usize) -> Vec<String> {
        trace
            .steps(index)
            .into_iter()
            .filter_map(|step| match step {
                Step::Program { program, .. } => Some(program.clone()),
                Step::Lookup { map, found, .. } => {
                    Some(format!("{map}{}", if found.is_some() { "" } else { " (none)" }))
                }
                Step::Rule { chain, .. } => Some(chain.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_pods_connection_is_translated_at_its_socket_and_an_outside_packet_at_the_nic() {
        let lab = web("type: NodePort");
        let family = crate::table::IpFamily::V4;
        let trace = lab.trace(ProxyMode::Ebpf, From::Pod(0), at(cluster_ip(family, 7)), Protocol::Tcp);
        assert_eq!(trace.backend, "ebpf");
        assert_eq!(trace.paths.len(), 2);
        for index in 0..2 {
            assert_eq!(stations(&trace, index), ["rk_connect4", "RK_SERVICES", "RK_SERVICES", "RK_BACKENDS"]);
            assert!((trace.paths[index].probability - 0.5).abs() < 1e-9);
            assert!(trace.paths[index].masquerade.is_none());
        }
        let udp = lab.trace(ProxyMode::Ebpf, From::Host, at(cluster_ip(family, 7)), Protocol::Udp);
        assert_eq!(stations(&udp, 0)[0], "rk_sendmsg4");

        let node_port = std::net::SocketAddr::new(node_ip(family), node_port(7));
        let trace = lab.trace(ProxyMode::Ebpf, From::External, node_port, Protocol::Tcp);
        assert_eq!(
            stations(&trace, 0),
            ["rk_from_outside", "RK_FLOWS (none)", "RK_SERVICES", "RK_MAGLEV", "RK_BACKENDS", "nat-postrouting"]
        );
        let total: f64 = trace.paths.iter().map(|p| p.probability).sum();
        assert!((total - 1.0).abs() < 1e-9 && trace.paths.len() == 2, "Maglev shares of both pods");
        let masquerade = trace.paths[0].masquerade.as_ref().expect("masqueraded");
        assert_eq!(masquerade.by.rule, netfilter::masquerade_rule());
        assert_eq!(masquerade.marked_by[0].chain, FROM_OUTSIDE);
        assert_eq!(trace.paths[1].branch, Some(Branch { path: 0, step: 3 }), "the choice is where paths part");
    }

    #[test]
    fn outside_traffic_without_a_backend_is_marked_and_rejected_by_the_table_and_ranges_drop() {
        let mut lab = Lab::new();
        lab.service("web", 7, "type: NodePort");
        let family = crate::table::IpFamily::V6;
        let node_port = std::net::SocketAddr::new(node_ip(family), node_port(7));
        let trace = lab.trace(ProxyMode::Ebpf, From::External, node_port, Protocol::Udp);
        let Verdict::Rejected { by, with } = &trace.paths[0].verdict else { panic!("{trace:?}") };
        assert_eq!((by.chain.as_str(), with.as_str()), ("filter-input", "icmpv6 port-unreachable"));
        assert_eq!(by.rule, netfilter::reject_rules()[1]);

        let mut lab = web("");
        lab.write(
            "apiVersion: v1\nkind: Service\nmetadata: {name: lb, namespace: default}\nspec: {type: LoadBalancer, selector: {app: web}, ports: [{port: 80, targetPort: 8080}], loadBalancerSourceRanges: [198.51.100.0/24]}\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.50}]}}\n",
        );
        let packet = Packet {
            entry: Entry::Received,
            source: external_host(crate::table::IpFamily::V4),
            destination: "203.0.113.50:80".parse().unwrap(),
            protocol: Protocol::Tcp,
        };
        let ruleset = lab.ruleset(ProxyMode::Ebpf);
        let trace = ruleset.trace(&packet, &lab.environment(BTreeSet::new())).unwrap();
        let Verdict::Dropped { by } = &trace.paths[0].verdict else { panic!("{trace:?}") };
        assert!(by.rule.ends_with("source not in its loadBalancerSourceRanges"), "{by:?}");
        let admitted = Packet { source: "198.51.100.7".parse().unwrap(), ..packet };
        let trace = ruleset.trace(&admitted, &lab.environment(BTreeSet::new())).unwrap();
        assert!(trace.paths.iter().all(|p| p.dnat.is_some()), "{trace:?}");
    }
}
