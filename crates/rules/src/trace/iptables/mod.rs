//! Our iptables chains as the kernel holds them after the restore inputs a sync sends, and how
//! the kernel's `nat` and `filter` tables evaluate them for one packet: the builtin chains of each
//! hook by table priority, `-j` to our chains, `RETURN`, `-s`/`-d` with `!`, `-p`/`--dport`,
//! `addrtype LOCAL`, `statistic` ladders, `recent` affinity lists, marks, `conntrack` states,
//! DNAT, MASQUERADE, REJECT and DROP.

pub mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use parse::{CtState, Line, Match, Rule, Target};

use super::engine::{self, BaseChain, Evaluation, Model, Outcome, PacketState};
use super::{Effect, Environment, Error, Packet, Trace};
use crate::nft::rule::HookPoint;
use crate::plan::IptablesPlan;
use crate::table::{IpFamily, Protocol};

/// A chain: builtin (of its table) or ours, and its rules.
#[derive(Debug, Clone, Default, PartialEq)]
struct Chain {
    builtin: bool,
    rules: Vec<Rule>,
}

/// One table's chains, by name.
type Table = BTreeMap<String, Chain>;

/// The builtin chains of the tables our restore input writes.
fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        _ => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    }
}

/// The tables a hook runs, in order, with their priorities.
fn hook_tables(hook: HookPoint) -> &'static [(&'static str, i32)] {
    match hook {
        HookPoint::Prerouting => &[("mangle", -150), ("nat", -100)],
        HookPoint::Input => &[("mangle", -150), ("filter", 0), ("nat", 100)],
        HookPoint::Forward => &[("mangle", -150), ("filter", 0)],
        HookPoint::Output => &[("mangle", -150), ("nat", -100), ("filter", 0)],
        HookPoint::Postrouting => &[("mangle", -150), ("nat", 100)],
    }
}

/// The builtin chain of a hook.
fn hook_chain(hook: HookPoint) -> &'static str {
    match hook {
        HookPoint::Prerouting => "PREROUTING",
        HookPoint::Input => "INPUT",
        HookPoint::Forward => "FORWARD",
        HookPoint::Output => "OUTPUT",
        HookPoint::Postrouting => "POSTROUTING",
    }
}

/// Our iptables (IPv4) and ip6tables (IPv6) chains, with the builtin chains' rules, as the kernel
/// holds them on a host where nothing else wrote rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tables {
    families: BTreeMap<IpFamily, BTreeMap<String, Table>>,
}

/// A refusal of restore line `text` for `message`.
fn refused(text: &str, message: impl Into<String>) -> Error {
    Error::Refused { change: text.to_string(), message: message.into() }
}

/// Checks that every rule of `table` jumps to a chain it has.
fn check_targets(name: &str, table: &Table) -> Result<(), Error> {
    for (chain, rules) in table {
        for rule in &rules.rules {
            if let Some(Target::Chain(target)) = &rule.target
                && !table.contains_key(target)
            {
                return Err(Error::NoSuchChain { table: name.to_string(), from: chain.clone(), chain: target.clone() });
            }
        }
    }
    Ok(())
}

impl Tables {
    /// What a full sync of `plan` leaves on a host without our chains.
    pub fn of(plan: &IptablesPlan) -> Result<Tables, Error> {
        let mut tables = Tables::default();
        for (family, input) in plan.restore_inputs() {
            tables.restore(family, &input)?;
        }
        Ok(tables)
    }

    /// Applies one `iptables-restore --noflush` input of `family`, as the tool does: table by
    /// table, each one committed whole at its `COMMIT` (tables committed before a refused line
    /// stay).
    pub fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), Error> {
        let tables = self.families.entry(family).or_default();
        let mut open: Option<(String, Table)> = None;
        for (number, text) in input.lines().enumerate() {
            let parsed = parse::line(text).map_err(|message| Error::Parse {
                line: number + 1,
                text: text.to_string(),
                message,
            })?;
            let Some(line) = parsed else { continue };
            match (line, &mut open) {
                (Line::Table(name), None) => {
                    let mut table = tables.get(&name).cloned().unwrap_or_default();
                    for chain in builtin_chains(&name) {
                        table.entry(chain.to_string()).or_insert(Chain { builtin: true, rules: Vec::new() });
                    }
                    open = Some((name, table));
                }
                (Line::Table(_), Some(_)) => return Err(refused(text, "a table is still open (no COMMIT)")),
                (Line::Commit, Some(_)) => {
                    let (name, table) = open.take().expect("an open table");
                    check_targets(&name, &table)?;
                    tables.insert(name, table);
                }
                (_, None) => return Err(refused(text, "outside a table")),
                (Line::Chain(chain), Some((_, table))) => match table.get_mut(&chain) {
                    Some(have) if have.builtin => return Err(refused(text, "a builtin chain")),
                    Some(have) => have.rules.clear(),
                    None => {
                        table.insert(chain, Chain::default());
                    }
                },
                (Line::Append(chain, rule), Some((_, table))) => {
                    table.get_mut(&chain).ok_or_else(|| refused(text, "no such chain"))?.rules.push(rule);
                }
                (Line::Insert(chain, rule), Some((_, table))) => {
                    table.get_mut(&chain).ok_or_else(|| refused(text, "no such chain"))?.rules.insert(0, rule);
                }
                (Line::Delete(chain), Some((_, table))) => match table.get(&chain) {
                    None => return Err(refused(text, "no such chain")),
                    Some(have) if have.builtin => return Err(refused(text, "a builtin chain")),
                    Some(have) if !have.rules.is_empty() => return Err(refused(text, "the chain is not empty")),
                    Some(_) => {
                        table.remove(&chain);
                    }
                },
            }
        }
        match open {
            Some((name, _)) => Err(refused(&format!("*{name}"), "no COMMIT")),
            None => Ok(()),
        }
    }

    /// Every way `packet` can go through these chains.
    pub fn trace(&self, packet: &Packet, env: &Environment) -> Result<Trace, Error> {
        engine::trace(self, packet, env)
    }

    /// The recent lists that the rules DNATing `protocol` to `endpoint` add sources to.
    pub fn affinity_sets(&self, protocol: Protocol, endpoint: SocketAddr) -> BTreeSet<String> {
        let rules = self.families.values().flat_map(|f| f.values()).flat_map(|t| t.values()).flat_map(|c| &c.rules);
        rules
            .filter(|rule| {
                rule.target == Some(Target::Dnat(endpoint)) && rule.matches.contains(&Match::Protocol(protocol))
            })
            .flat_map(|rule| &rule.matches)
            .filter_map(|m| match m {
                Match::RecentSet { name } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }
}

impl Model for Tables {
    type Rule = Rule;
    const BACKEND: &'static str = "iptables";

    fn base_chains(&self, family: IpFamily, hook: HookPoint) -> Vec<BaseChain> {
        let Some(tables) = self.families.get(&family) else { return Vec::new() };
        let chain = hook_chain(hook);
        hook_tables(hook)
            .iter()
            .filter(|(table, _)| tables.get(*table).and_then(|t| t.get(chain)).is_some_and(|c| !c.rules.is_empty()))
            .map(|(table, priority)| BaseChain {
                table: table.to_string(),
                chain: chain.to_string(),
                hook: format!("{table} {chain} priority {priority}"),
                nat: *table == "nat",
            })
            .collect()
    }

    fn rules(&self, family: IpFamily, table: &str, chain: &str) -> Option<&[Rule]> {
        self.families.get(&family)?.get(table)?.get(chain).map(|c| c.rules.as_slice())
    }

    fn text(&self, chain: &str, rule: &Rule) -> String {
        format!("-A {chain}{}", parse::spaced(rule))
    }

    fn evaluate(
        &self,
        _table: &str,
        rule: &Rule,
        packet: &PacketState,
        env: &Environment,
        random: Option<Outcome>,
    ) -> Result<Evaluation, Error> {
        let mut chance = None;
        let mut effects = Vec::new();
        for m in &rule.matches {
            let holds = match m {
                Match::Source { negated, net } => net.contains(&packet.source) != *negated,
                Match::Destination { negated, net } => net.contains(&packet.destination.ip()) != *negated,
                Match::Protocol(protocol) => packet.protocol == *protocol,
                Match::Comment(_) => true,
                Match::Port { protocol, dport } => {
                    packet.protocol == *protocol && dport.is_none_or(|p| p == packet.destination.port())
                }
                Match::Random { probability } => {
                    chance = Some(*probability);
                    true
                }
                Match::RecentCheck { name, .. } => env.affinity.contains(name),
                Match::RecentSet { name } => {
                    effects.push(Effect::Affinity { set: name.clone() });
                    true
                }
                Match::LocalAddress { source: true } => env.is_local(packet.source),
                Match::LocalAddress { source: false } => env.is_local(packet.destination.ip()),
                Match::Mark { negated, value, mask } => (packet.mark & mask == *value) != *negated,
                Match::CtState { negated, states } => {
                    let held = |state: &CtState| match state {
                        CtState::New => true,
                        CtState::Dnat => packet.dnat,
                        CtState::Snat => packet.snat,
                        CtState::Established | CtState::Related | CtState::Invalid => false,
                    };
                    states.iter().any(held) != *negated
                }
            };
            if !holds {
                return Ok(Evaluation::NoMatch);
            }
        }
        match (chance, random) {
            (Some(p), None) => return Ok(Evaluation::Chance(p)),
            (Some(_), Some(Outcome::Chance(false))) => return Ok(Evaluation::NoMatch),
            _ => {}
        }
        effects.extend(rule.target.as_ref().map(|target| match target {
            Target::Chain(chain) => Effect::Jump { chain: chain.clone() },
            Target::Return => Effect::Return,
            Target::Accept => Effect::Accept,
            Target::Drop => Effect::Drop,
            Target::Reject { tcp_reset: true } => Effect::Reject { with: "tcp-reset".into() },
            Target::Reject { tcp_reset: false } => Effect::Reject {
                with: match packet.family {
                    IpFamily::V4 => "icmp-port-unreachable".into(),
                    IpFamily::V6 => "icmp6-port-unreachable".into(),
                },
            },
            Target::Dnat(to) => Effect::Dnat { to: *to },
            Target::MarkOr(bits) => Effect::Mark { mark: packet.mark | bits },
            Target::MarkXor(bits) => Effect::Mark { mark: packet.mark ^ bits },
            Target::Masquerade => Effect::Masquerade,
        }));
        Ok(Evaluation::effects(effects))
    }
}

/// What the fuzz target (`crates/rules/fuzz`, target `restore`) and the corpus test check for
/// any input: no panic; every line parsed renders back to a line that parses the same; and when
/// the input restores, packets trace through it to paths whose probabilities add up to 1, or to
/// a bounded error (a loop).
pub fn check(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else { return };
    for line in text.lines() {
        if let Ok(Some(parsed)) = parse::line(line) {
            let again = parse::line(&parsed.to_string());
            assert_eq!(again, Ok(Some(parsed)), "{line:?} renders to a line that parses otherwise");
        }
    }
    let mut tables = Tables::default();
    if tables.restore(IpFamily::V4, text).is_err() {
        return;
    }
    super::check_probes(
        &[
            (super::Entry::Received, "10.244.0.10", "10.96.0.10:80"),
            (super::Entry::Received, "192.168.77.1", "192.168.77.2:30080"),
            (super::Entry::Host, "192.168.77.2", "10.96.0.10:80"),
            (super::Entry::Host, "127.0.0.1", "127.0.0.1:30080"),
        ],
        |packet, env| tables.trace(packet, env),
    );
}
