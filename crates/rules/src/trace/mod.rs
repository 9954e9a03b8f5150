//! The road one packet takes through our rules, computed: a model of how the kernel evaluates
//! the tables roadkeeper writes, fed with exactly what a sync sends ([`nft::Tables`] applies
//! nftables [`Op`](crate::nft::rule::Op)s, [`iptables::Tables`] applies `iptables-restore` input,
//! [`ipvs::Tables`] the IPVS table and the `nft -f` scripts of IPVS mode's helper tables,
//! [`ebpf::Tables`] the BPF maps of eBPF mode, whose programs it follows instead of rules).
//!
//! A [`Packet`] is the first packet of a new connection (or UDP flow) entering the node's
//! netfilter path ([`Entry`]); the [`Environment`] says which addresses are the node's own and
//! which affinity entries hold its source. [`Ruleset::trace`] walks the hooks of its path, the
//! base chains of each hook by priority, every rule in order (`jump`, `goto`, `return`, verdict
//! maps, sets, marks, NAT), and follows every outcome of the random endpoint choices: the
//! [`Trace`] lists each [`Path`] with its probability, every step, the verdict, the DNAT target
//! and why the source is masqueraded.
//!
//! Not modelled: conntrack beyond the first packet (established flows keep the NAT of their first
//! packet whatever the rules say now, replies are un-NATed), routing beyond "to a local address or
//! not" (no routes, interfaces or reverse-path checks; the masquerade address is the outgoing
//! interface's, which the trace does not know), the node's sockets, and rules of other tables
//! than ours.

pub mod ebpf;
mod engine;
pub mod iptables;
pub mod ipvs;
pub mod nft;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::config::ProxyMode;
use crate::nft::rule::HookPoint;
use crate::plan::NodePlan;
use crate::table::Protocol;

/// Why a trace could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A line of `iptables-restore` input is outside the grammar our planner writes.
    #[error("line {line}: {message}: {text:?}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong with it.
        message: String,
    },
    /// The kernel would refuse this change of our tables (as nft or iptables-restore would).
    #[error("{change}: {message}")]
    Refused {
        /// The op or restore line.
        change: String,
        /// Why.
        message: String,
    },
    /// A rule jumps to a chain that does not exist.
    #[error("{table}: rule of chain {from} jumps to {chain}, which does not exist")]
    NoSuchChain {
        /// The table.
        table: String,
        /// The chain of the rule.
        from: String,
        /// The missing chain.
        chain: String,
    },
    /// A rule looks up a set or map that does not exist.
    #[error("{table}: no set or map {set}")]
    NoSuchSet {
        /// The table.
        table: String,
        /// The missing set.
        set: String,
    },
    /// The packet's source and destination are of different families.
    #[error("source {from} and destination {to} are of different families")]
    MixedFamilies {
        /// The source.
        from: IpAddr,
        /// The destination.
        to: SocketAddr,
    },
    /// Jumps nested deeper than [`MAX_DEPTH`]: a loop (the kernel refuses those at load).
    #[error("jumps nest deeper than {MAX_DEPTH} chains at chain {chain} (a loop?)")]
    TooDeep {
        /// The chain jumped to.
        chain: String,
    },
    /// More than [`MAX_RULES`] rule evaluations over all paths: a `goto` loop, or a ruleset far
    /// larger than any we write.
    #[error("more than {MAX_RULES} rules evaluated (a goto loop?)")]
    TooLong,
}

/// Deepest nesting of jumps a trace follows.
pub const MAX_DEPTH: usize = 32;
/// Most rule evaluations one trace makes, over all its paths.
pub const MAX_RULES: usize = 1_000_000;

/// Where a packet enters the node's netfilter path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// Received on an interface (from a pod on this node, another node, an outside host):
    /// prerouting, then input (to a local address) or forward and postrouting.
    Received,
    /// Sent by a process of the node itself (host network): output and postrouting, then, to a
    /// local address, prerouting (whose nat chains it skips) and input.
    Host,
    /// Sent by a pod of this node: received on its bridge, as [`Entry::Received`]; in eBPF mode
    /// translated at the pod's socket, as [`Entry::Host`].
    LocalPod,
}

impl Entry {
    /// How the packet enters netfilter: a local pod's packet is received like any other.
    pub fn netfilter(self) -> Entry {
        match self {
            Entry::LocalPod => Entry::Received,
            entry => entry,
        }
    }
}

/// The first packet of a new connection or UDP flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Packet {
    /// How it enters.
    pub entry: Entry,
    /// Its source address.
    pub source: IpAddr,
    /// Where it is sent.
    pub destination: SocketAddr,
    /// Its transport protocol.
    pub protocol: Protocol,
}

/// What the packet's fate depends on besides our rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Environment {
    /// The node's own addresses (`fib ... type local`, `addrtype LOCAL`, and whether the
    /// destination is delivered locally); loopback addresses always are.
    pub local_addresses: Vec<IpAddr>,
    /// Affinity entries (nftables), recent lists (iptables) or persistence templates (IPVS)
    /// already holding the packet's source ([`Ruleset::affinity_sets`] names those of an endpoint).
    pub affinity: BTreeSet<String>,
}

impl Environment {
    /// True when `ip` is one of the node's addresses or loopback.
    pub fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local_addresses.contains(&ip)
    }
}

/// A rule, where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleRef {
    /// The table (`ip roadkeeper`, `nat`, ...).
    pub table: String,
    /// The chain.
    pub chain: String,
    /// The rule as `nft list` or `iptables-save` shows it.
    pub rule: String,
}

/// What a matching rule does, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    /// Sets the packet mark to this value.
    Mark {
        /// The new mark.
        mark: u32,
    },
    /// Records the source in an affinity entry (nftables) or recent list (iptables).
    Affinity {
        /// The entry (`affinity <endpoint> . <port> . <ClusterIP> . <port>`) or list.
        set: String,
    },
    /// Rewrites the destination and accepts (in this base chain).
    Dnat {
        /// The new destination.
        to: SocketAddr,
    },
    /// Changes the destination a socket connects or sends to (eBPF mode's socket programs):
    /// its packets leave addressed to it, none is NATed.
    Connect {
        /// The new destination.
        to: SocketAddr,
    },
    /// Masquerades the source (SNAT to the outgoing interface's address) and accepts.
    Masquerade,
    /// Calls a chain.
    Jump {
        /// The chain.
        chain: String,
    },
    /// Continues in a chain without coming back.
    Goto {
        /// The chain.
        chain: String,
    },
    /// Back to the calling chain (the base chain's policy at the top).
    Return,
    /// Accepts (in this base chain: the next one of the hook follows).
    Accept,
    /// Drops the packet.
    Drop,
    /// Drops the packet and answers the sender.
    Reject {
        /// How (`tcp reset`, `icmp port-unreachable`, ...).
        with: String,
    },
}

/// How a chain is entered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "via", rename_all = "snake_case")]
pub enum Via {
    /// As a base chain of the hook: its type, hook and priority.
    Hook {
        /// `type nat hook prerouting priority dstnat`, `nat PREROUTING priority -100`, ...
        hook: String,
    },
    /// By a `jump` (nftables) or `-j CHAIN` (iptables).
    Jump,
    /// By a `goto`.
    Goto,
}

/// How the packet leaves a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Leave {
    /// By `return` (or the end of a regular chain) to the chain that called it.
    Return,
    /// At the end of a base chain, or by `return` from it: its policy, accept.
    Policy,
}

/// Where the packet goes after the routing decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// To a local address: the node's own sockets.
    Local,
    /// Out of the node (to a pod, another node, the network).
    Forwarded,
}

/// One thing that happens to the packet.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// The packet reaches a netfilter hook.
    Hook {
        /// The hook.
        hook: HookPoint,
    },
    /// A chain is entered.
    Enter {
        /// The table.
        table: String,
        /// The chain.
        chain: String,
        /// How.
        #[serde(flatten)]
        via: Via,
    },
    /// A nat chain is passed over: its connection's NAT of that kind is already set up.
    SkipNat {
        /// The table.
        table: String,
        /// The chain.
        chain: String,
    },
    /// A rule is evaluated.
    Rule {
        /// The table.
        table: String,
        /// The chain.
        chain: String,
        /// The rule's position in the chain, from 0.
        index: usize,
        /// The rule as `nft list` or `iptables-save` shows it.
        rule: String,
        /// Whether it matched.
        matched: bool,
        /// The set or map element the rule's lookup found.
        #[serde(skip_serializing_if = "Option::is_none")]
        element: Option<String>,
        /// The probability of its random match holding (`numgen random`, `-m statistic`).
        #[serde(skip_serializing_if = "Option::is_none")]
        chance: Option<f64>,
        /// What it did (nothing when it did not match).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        effects: Vec<Effect>,
    },
    /// A chain is left.
    Leave {
        /// The table.
        table: String,
        /// The chain.
        chain: String,
        /// How.
        how: Leave,
    },
    /// A BPF program runs (eBPF mode): at a socket call or on a packet.
    Program {
        /// Its name.
        program: String,
        /// Where it is attached, and what it does there.
        attach: String,
    },
    /// A BPF program looks a key up in a map (eBPF mode).
    Lookup {
        /// The map.
        map: String,
        /// The key, readably.
        key: String,
        /// What it found (`None`: no entry).
        found: Option<String>,
        /// The probability of this entry being the one read (a random slot, a Maglev share).
        #[serde(skip_serializing_if = "Option::is_none")]
        chance: Option<f64>,
        /// What the program does with it.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        effects: Vec<Effect>,
    },
    /// The routing decision: after prerouting, or a host packet's after postrouting.
    Route {
        /// Where the packet goes.
        to: Delivery,
        /// The destination it is routed by.
        destination: SocketAddr,
    },
}

/// Where a path leaves the path it branches from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Branch {
    /// The path branched from.
    pub path: usize,
    /// How many of its steps this path shares (its own steps follow them).
    pub step: usize,
}

/// How a path ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Through all our rules.
    Accepted {
        /// Where it goes.
        delivery: Delivery,
    },
    /// Dropped.
    Dropped {
        /// By this rule (a `drop` statement or a verdict map's `drop`).
        by: RuleRef,
    },
    /// Dropped with an answer to the sender.
    Rejected {
        /// By this rule.
        by: RuleRef,
        /// How.
        with: String,
    },
}

/// Why a packet is masqueraded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Masquerade {
    /// The rules that led to the mark being set, from the base chain down to the one setting it.
    pub marked_by: Vec<RuleRef>,
    /// The rule that masqueraded it.
    pub by: RuleRef,
}

/// One way the packet can go.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Path {
    /// Its probability (the product of the random choices it took).
    pub probability: f64,
    /// The path it branches from, at a random choice; `None` for the first path.
    pub branch: Option<Branch>,
    /// Its own steps (after those it shares, see [`Trace::steps`]).
    pub steps: Vec<Step>,
    /// How it ends.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Where its destination was rewritten to.
    pub dnat: Option<SocketAddr>,
    /// Whether and why its source is masqueraded.
    pub masquerade: Option<Masquerade>,
    /// The affinity entries or recent lists its source is added to.
    pub affinity: Vec<String>,
}

/// A path's end, without the steps: what the packet meets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "fate", rename_all = "snake_case")]
pub enum Fate {
    /// Delivered.
    Delivered {
        /// Where.
        delivery: Delivery,
        /// To this address if it was DNATed.
        dnat: Option<SocketAddr>,
        /// With its source masqueraded.
        masqueraded: bool,
    },
    /// Dropped.
    Dropped,
    /// Rejected.
    Rejected,
}

impl Path {
    /// How the path ends.
    pub fn fate(&self) -> Fate {
        match self.verdict {
            Verdict::Accepted { delivery } => {
                Fate::Delivered { delivery, dnat: self.dnat, masqueraded: self.masquerade.is_some() }
            }
            Verdict::Dropped { .. } => Fate::Dropped,
            Verdict::Rejected { .. } => Fate::Rejected,
        }
    }
}

/// Every way one packet can go through our rules.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    /// `nftables`, `iptables`, `ipvs` or `ebpf`.
    pub backend: &'static str,
    /// The packet.
    pub packet: Packet,
    /// Its paths, one per outcome of the random choices on its way (their probabilities add up
    /// to 1); a path that branches from another shares that one's first steps.
    pub paths: Vec<Path>,
}

impl Trace {
    /// Every step of path `index`, the shared ones first.
    pub fn steps(&self, index: usize) -> Vec<&Step> {
        let mut pieces = Vec::new();
        let (mut at, mut cut) = (index, usize::MAX);
        loop {
            let path = &self.paths[at];
            pieces.push(&path.steps[..cut.min(path.steps.len())]);
            let Some(branch) = path.branch else { break };
            (at, cut) = (branch.path, branch.step);
        }
        pieces.into_iter().rev().flatten().collect()
    }

    /// The distinct fates of the packet with their probabilities, most likely first.
    pub fn fates(&self) -> Vec<(Fate, f64)> {
        let mut fates: std::collections::BTreeMap<Fate, f64> = std::collections::BTreeMap::new();
        for path in &self.paths {
            *fates.entry(path.fate()).or_default() += path.probability;
        }
        let mut fates: Vec<(Fate, f64)> = fates.into_iter().collect();
        fates.sort_by(|a, b| b.1.total_cmp(&a.1));
        fates
    }
}

/// A node's rules as the kernel holds them, in one backend.
#[derive(Debug, Clone)]
pub enum Ruleset {
    /// Our nftables tables.
    Nftables(nft::Tables),
    /// Our iptables chains.
    Iptables(iptables::Tables),
    /// IPVS mode: the IPVS table and the helper tables.
    Ipvs(ipvs::Tables),
    /// eBPF mode: the programs' maps.
    Ebpf(ebpf::Tables),
}

impl Ruleset {
    /// The rules a full sync of `plan` programs, in the backend of its config's mode.
    pub fn of(plan: &NodePlan) -> Result<Ruleset, Error> {
        Ok(match plan.cfg.mode {
            ProxyMode::Nftables => Ruleset::Nftables(nft::Tables::of(&plan.nftables())?),
            ProxyMode::Iptables => Ruleset::Iptables(iptables::Tables::of(&plan.iptables())?),
            ProxyMode::Ipvs => Ruleset::Ipvs(ipvs::Tables::of(&plan.ipvs())?),
            ProxyMode::Ebpf => Ruleset::Ebpf(ebpf::Tables::of(plan)),
        })
    }

    /// Every way `packet` can go through these rules.
    pub fn trace(&self, packet: &Packet, env: &Environment) -> Result<Trace, Error> {
        match self {
            Ruleset::Nftables(tables) => tables.trace(packet, env),
            Ruleset::Iptables(tables) => tables.trace(packet, env),
            Ruleset::Ipvs(tables) => tables.trace(packet, env),
            Ruleset::Ebpf(tables) => tables.trace(packet, env),
        }
    }

    /// The affinity entries (nftables), recent lists (iptables), persistence templates (IPVS,
    /// [`ipvs::persistence_entry`]) or affinity map entries (eBPF, [`ebpf::affinity_entry`]) that the rules DNATing `protocol`
    /// to `endpoint` add sources to: what [`Environment::affinity`] holds for a source pinned to
    /// that endpoint (of every Service port sending there).
    pub fn affinity_sets(&self, protocol: Protocol, endpoint: SocketAddr) -> BTreeSet<String> {
        match self {
            Ruleset::Nftables(tables) => tables.affinity_sets(protocol, endpoint),
            Ruleset::Iptables(tables) => tables.affinity_sets(protocol, endpoint),
            Ruleset::Ipvs(tables) => tables.affinity_sets(protocol, endpoint),
            Ruleset::Ebpf(tables) => tables.affinity_sets(protocol, endpoint),
        }
    }
}

/// What the fuzz checks assert of the tables an input left: each of `probes` (entry, source,
/// destination), TCP and UDP, traces to paths whose probabilities add up to 1, each with steps,
/// or to the bounded-loop error; any other error is a panic.
pub(crate) fn check_probes(
    probes: &[(Entry, &str, &str)],
    trace: impl Fn(&Packet, &Environment) -> Result<Trace, Error>,
) {
    let env = Environment { local_addresses: vec!["192.168.77.2".parse().expect("address")], ..Environment::default() };
    for &(entry, source, destination) in probes {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let packet = Packet {
                entry,
                source: source.parse().expect("address"),
                destination: destination.parse().expect("address"),
                protocol,
            };
            match trace(&packet, &env) {
                Ok(trace) => {
                    let total: f64 = trace.paths.iter().map(|p| p.probability).sum();
                    assert!((total - 1.0).abs() < 1e-6, "{packet:?}: probabilities add up to {total}");
                    for index in 0..trace.paths.len() {
                        assert!(!trace.steps(index).is_empty(), "{packet:?}: path {index} has no steps");
                    }
                }
                Err(Error::TooDeep { .. } | Error::TooLong) => {}
                Err(error) => panic!("{packet:?}: {error}"),
            }
        }
    }
}

#[cfg(test)]
mod flow_tests;
#[cfg(test)]
mod lab;
