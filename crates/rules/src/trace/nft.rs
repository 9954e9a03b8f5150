//! Our nftables tables as the kernel holds them after the transactions a sync sends, and how
//! nf_tables evaluates them for one packet: base chains by hook and priority, verdict maps, set
//! lookups (address sets, the interval set of service CIDRs, the affinity set), `fib ... type
//! local`, `ct state new`, `numgen random`, marks, DNAT and masquerade.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use super::engine::{self, BaseChain, Evaluation, Model, Outcome, PacketState};
use super::{Effect, Environment, Error, Packet, Trace};
use crate::nft::objects::{Container, DataKind, ElementValue, TABLE, Value, family_keyword};
use crate::nft::rule::{
    Action, AffinityKey, ChainType, ElementKey, Hook, HookPoint, LookupKey, Match, Op, Rule, Verdict,
};
use crate::plan::NftPlan;
use crate::table::{IpFamily, Protocol};

/// A chain: its hook if it is a base chain, and its rules.
#[derive(Debug, Clone, Default, PartialEq)]
struct Chain {
    hook: Option<Hook>,
    rules: Vec<Rule>,
}

/// One family's table.
#[derive(Debug, Clone, Default, PartialEq)]
struct Table {
    chains: BTreeMap<String, Chain>,
    /// The shared sets and maps and their elements.
    containers: BTreeMap<Container, BTreeMap<ElementKey, ElementValue>>,
}

/// Our tables (`ip roadkeeper`, `ip6 roadkeeper`) as the kernel holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tables {
    tables: BTreeMap<IpFamily, Table>,
}

/// The name of a family's table, as listings show it.
fn table_name(family: IpFamily) -> String {
    format!("{} {TABLE}", family_keyword(family))
}

/// A refusal of `op` for `message`.
fn refused(op: &Op, message: &str) -> Error {
    Error::Refused { change: op.to_string(), message: message.to_string() }
}

impl Tables {
    /// What a full sync of `plan` leaves in empty tables.
    pub fn of(plan: &NftPlan) -> Result<Tables, Error> {
        let mut tables = Tables::default();
        tables.apply(&plan.ops())?;
        Ok(tables)
    }

    /// Applies one transaction, as nf_tables does: all of it, or (refused, as the kernel would
    /// refuse it) none of it.
    pub fn apply(&mut self, ops: &[Op]) -> Result<(), Error> {
        let mut next = self.clone();
        for op in ops {
            next.apply_op(op)?;
        }
        *self = next;
        Ok(())
    }

    fn table(&mut self, op: &Op, family: IpFamily) -> Result<&mut Table, Error> {
        self.tables.get_mut(&family).ok_or_else(|| refused(op, "no such table"))
    }

    fn apply_op(&mut self, op: &Op) -> Result<(), Error> {
        fn chain_of<'a>(table: &'a mut Table, name: &str, op: &Op) -> Result<&'a mut Chain, Error> {
            table.chains.get_mut(name).ok_or_else(|| refused(op, "no such chain"))
        }
        match op {
            Op::AddTable { family } => {
                self.tables.entry(*family).or_default();
            }
            Op::AddBaseChain { family, name, hook } => {
                let chain = self.table(op, *family)?.chains.entry(name.clone()).or_default();
                match chain.hook {
                    Some(have) if have != *hook => return Err(refused(op, "the chain has another hook")),
                    _ => chain.hook = Some(*hook),
                }
            }
            Op::AddChain { family, name } => {
                let chain = self.table(op, *family)?.chains.entry(name.clone()).or_default();
                if chain.hook.is_some() {
                    return Err(refused(op, "the chain is a base chain"));
                }
            }
            Op::FlushChain { family, name } => chain_of(self.table(op, *family)?, name, op)?.rules.clear(),
            Op::AddRule { chain, rule } => chain_of(self.table(op, rule.family)?, chain, op)?.rules.push(rule.clone()),
            Op::DeleteChain { family, name } => {
                let table = self.table(op, *family)?;
                if !chain_of(table, name, op)?.rules.is_empty() {
                    return Err(refused(op, "the chain is not empty"));
                }
                table.chains.remove(name);
            }
            Op::AddContainer { family, container } => {
                self.table(op, *family)?.containers.entry(*container).or_default();
            }
            Op::FlushSet { family, container } => {
                let table = self.table(op, *family)?;
                table.containers.get_mut(container).ok_or_else(|| refused(op, "no such set"))?.clear();
            }
            Op::AddElement { family, container, key, value, comment } => {
                let table = self.table(op, *family)?;
                let elements = table.containers.get_mut(container).ok_or_else(|| refused(op, "no such set"))?;
                if (container.data() != DataKind::None) != value.is_some() {
                    return Err(refused(op, "the element does not fit the set's type"));
                }
                let value = ElementValue { value: value.clone(), comment: comment.clone() };
                match elements.get(key) {
                    Some(have) if have.value != value.value => return Err(refused(op, "the element exists")),
                    _ => elements.insert(key.clone(), value),
                };
            }
            Op::DeleteElement { family, container, key } => {
                let table = self.table(op, *family)?;
                let elements = table.containers.get_mut(container).ok_or_else(|| refused(op, "no such set"))?;
                elements.remove(key).ok_or_else(|| refused(op, "no such element"))?;
            }
            Op::DeleteSet { family, name } => {
                let table = self.table(op, *family)?;
                let container = table.containers.keys().find(|c| c.name() == *name).copied();
                let container = container.ok_or_else(|| refused(op, "no such set"))?;
                table.containers.remove(&container);
            }
        }
        Ok(())
    }

    /// Every way `packet` can go through these tables.
    pub fn trace(&self, packet: &Packet, env: &Environment) -> Result<Trace, Error> {
        engine::trace(self, packet, env)
    }

    /// The affinity entries (see [`affinity_entry`]) that the endpoint chains DNATing `protocol`
    /// to `endpoint` update.
    pub fn affinity_sets(&self, protocol: Protocol, endpoint: SocketAddr) -> BTreeSet<String> {
        let mut sets = BTreeSet::new();
        for chain in self.tables.values().flat_map(|t| t.chains.values()) {
            let dnats = chain.rules.iter().any(|r| {
                matches!(r.action, Action::Dnat { protocol: p, ip, port } if p == protocol && SocketAddr::new(ip, port) == endpoint)
            });
            if dnats {
                sets.extend(chain.rules.iter().filter_map(|r| match &r.action {
                    Action::UpdateAffinity { key, .. } => Some(affinity_entry(key)),
                    _ => None,
                }));
            }
        }
        sets
    }

    /// A set lookup of `addr` in `set`: the element found, or `None` when the address is not in
    /// it.
    fn lookup(&self, table: &Table, family: IpFamily, set: &str, addr: IpAddr) -> Lookup {
        let Some(elements) = container(table, set) else {
            return Lookup::NoSet(Error::NoSuchSet { table: table_name(family), set: set.to_string() });
        };
        let found = elements.iter().find(|(key, _)| match key {
            ElementKey::Addr(a) => *a == addr,
            ElementKey::Range(first, last) => in_range(addr, *first, *last),
            _ => false,
        });
        match found {
            Some((key, value)) => Lookup::Found(element_text(key, value)),
            None => Lookup::Missing,
        }
    }

    /// An exact lookup of `wanted` in the container named `set`.
    fn find<'a>(
        &self,
        table: &'a Table,
        family: IpFamily,
        set: &str,
        wanted: &ElementKey,
    ) -> Result<Option<(&'a ElementKey, &'a ElementValue)>, Error> {
        let elements = container(table, set)
            .ok_or_else(|| Error::NoSuchSet { table: table_name(family), set: set.to_string() })?;
        Ok(elements.get_key_value(wanted))
    }
}

/// How an entry of the affinity set is named in [`Environment::affinity`] and
/// [`Effect::Affinity`]: `affinity <endpoint> . <port> . <ClusterIP> . <port>`.
pub fn affinity_entry(key: &AffinityKey) -> String {
    format!("{} {key}", Container::Affinity.name())
}

/// The elements of the shared set or map named `name`.
fn container<'a>(table: &'a Table, name: &str) -> Option<&'a BTreeMap<ElementKey, ElementValue>> {
    table.containers.iter().find(|(c, _)| c.name() == name).map(|(_, elements)| elements)
}

/// The key of the frontend a packet is addressed to, as `key` reads it.
fn frontend_key(key: LookupKey, packet: &PacketState) -> ElementKey {
    let destination = packet.destination;
    match key {
        LookupKey::DaddrProtoPort => ElementKey::AddrProtoPort(destination.ip(), packet.protocol, destination.port()),
        LookupKey::ProtoPort => ElementKey::ProtoPort(packet.protocol, destination.port()),
    }
}

/// What a set lookup found.
enum Lookup {
    /// The key is in the set: the element as listings show it.
    Found(String),
    /// It is not.
    Missing,
    /// There is no such set.
    NoSet(Error),
}

/// True when `addr` lies in `first..=last` (same family).
fn in_range(addr: IpAddr, first: IpAddr, last: IpAddr) -> bool {
    match (addr, first, last) {
        (IpAddr::V4(a), IpAddr::V4(f), IpAddr::V4(l)) => f <= a && a <= l,
        (IpAddr::V6(a), IpAddr::V6(f), IpAddr::V6(l)) => f <= a && a <= l,
        _ => false,
    }
}

/// An element as `nft list` shows it in its set or map.
fn element_text(key: &ElementKey, value: &ElementValue) -> String {
    let mut text = key.to_string();
    if !value.comment.is_empty() {
        text.push_str(&format!(" comment \"{}\"", crate::text::comment(&value.comment)));
    }
    if let Some(value) = &value.value {
        text.push_str(&format!(" : {value}"));
    }
    text
}

/// The flow effect of a verdict-map verdict.
fn verdict_effect(verdict: &Verdict) -> Effect {
    match verdict {
        Verdict::Goto(chain) => Effect::Goto { chain: chain.clone() },
        Verdict::Jump(chain) => Effect::Jump { chain: chain.clone() },
        Verdict::Drop => Effect::Drop,
    }
}

impl Model for Tables {
    type Rule = Rule;
    const BACKEND: &'static str = "nftables";

    fn base_chains(&self, family: IpFamily, hook: HookPoint) -> Vec<BaseChain> {
        let Some(table) = self.tables.get(&family) else { return Vec::new() };
        let mut bases: Vec<(&Hook, &String)> = table
            .chains
            .iter()
            .filter_map(|(name, chain)| Some((chain.hook.as_ref()?, name)))
            .filter(|(h, _)| h.point == hook)
            .collect();
        bases.sort_by_key(|(h, name)| (h.priority, *name));
        bases
            .into_iter()
            .map(|(h, name)| BaseChain {
                table: table_name(family),
                chain: name.clone(),
                hook: h.to_string().trim_end_matches(" ;").to_string(),
                nat: h.chain_type == ChainType::Nat,
            })
            .collect()
    }

    fn rules(&self, family: IpFamily, _table: &str, chain: &str) -> Option<&[Rule]> {
        self.tables.get(&family)?.chains.get(chain).map(|c| c.rules.as_slice())
    }

    fn text(&self, _chain: &str, rule: &Rule) -> String {
        rule.to_string()
    }

    fn evaluate(
        &self,
        _table: &str,
        rule: &Rule,
        packet: &PacketState,
        env: &Environment,
        random: Option<Outcome>,
    ) -> Result<Evaluation, Error> {
        let table = self.tables.get(&packet.family).expect("a rule is in its family's table");
        let mut element = None;
        let mut chance = None;
        for m in &rule.matches {
            let holds = match m {
                Match::SaddrIs(addr) => packet.source == *addr,
                Match::SaddrIn(net) => net.contains(&packet.source),
                Match::DaddrIs(addr) => packet.destination.ip() == *addr,
                Match::DaddrNotIn(net) => !net.contains(&packet.destination.ip()),
                // The affinity set holds what the environment says it holds.
                Match::Affinity(key) => {
                    if !table.containers.contains_key(&Container::Affinity) {
                        let set = Container::Affinity.name();
                        return Err(Error::NoSuchSet { table: table_name(packet.family), set });
                    }
                    env.affinity.contains(&affinity_entry(key))
                }
                Match::DaddrInSet(set) => match self.lookup(table, packet.family, set, packet.destination.ip()) {
                    Lookup::Found(found) => {
                        element = Some(found);
                        true
                    }
                    Lookup::Missing => false,
                    Lookup::NoSet(error) => return Err(error),
                },
                Match::FibSaddrLocal => env.is_local(packet.source),
                Match::FibDaddrLocal => env.is_local(packet.destination.ip()),
                Match::CtStateNew => true,
                Match::L4Proto(protocol) => packet.protocol == *protocol,
                Match::MarkUnset(bits) => packet.mark & bits == 0,
                Match::Random { modulus, value } => {
                    chance = Some(if value < modulus { 1.0 / f64::from(*modulus) } else { 0.0 });
                    true
                }
                Match::InSet { key, set } => match self.find(table, packet.family, set, &frontend_key(*key, packet))? {
                    Some((key, value)) => {
                        element = Some(element_text(key, value));
                        true
                    }
                    None => false,
                },
                Match::PairInSet(set) => {
                    let pair = ElementKey::AddrPair(packet.source, packet.destination.ip());
                    match self.find(table, packet.family, set, &pair)? {
                        Some((key, value)) => {
                            element = Some(element_text(key, value));
                            true
                        }
                        None => false,
                    }
                }
                Match::CtStatusDnat => packet.dnat,
            };
            if !holds {
                return Ok(Evaluation::NoMatch);
            }
        }
        let effects = match &rule.action {
            Action::Jump(chain) => vec![Effect::Jump { chain: chain.clone() }],
            Action::Goto(chain) => vec![Effect::Goto { chain: chain.clone() }],
            Action::Return => vec![Effect::Return],
            Action::Drop => vec![Effect::Drop],
            Action::UpdateAffinity { key, .. } => vec![Effect::Affinity { set: affinity_entry(key) }],
            // `meta l4proto <protocol>` is part of the statement.
            Action::Dnat { protocol, .. } if *protocol != packet.protocol => return Ok(Evaluation::NoMatch),
            Action::Dnat { ip, port, .. } => vec![Effect::Dnat { to: SocketAddr::new(*ip, *port) }],
            Action::Vmap { key, map } => {
                let wanted = match key {
                    LookupKey::DaddrProtoPort => {
                        ElementKey::AddrProtoPort(packet.destination.ip(), packet.protocol, packet.destination.port())
                    }
                    LookupKey::ProtoPort => ElementKey::ProtoPort(packet.protocol, packet.destination.port()),
                };
                let Some((key, value)) = self.find(table, packet.family, map, &wanted)? else {
                    return Ok(Evaluation::NoMatch);
                };
                let Some(Value::Verdict(verdict)) = &value.value else { return Ok(Evaluation::NoMatch) };
                element = Some(element_text(key, value));
                vec![verdict_effect(verdict)]
            }
            Action::DnatMap { key, modulus, map } => {
                let index = match random {
                    Some(Outcome::Pick(index)) => index,
                    _ => return Ok(Evaluation::Pick(*modulus)),
                };
                let wanted = match frontend_key(*key, packet) {
                    ElementKey::AddrProtoPort(addr, protocol, port) => {
                        ElementKey::AddrProtoPortIndex(addr, protocol, port, index)
                    }
                    ElementKey::ProtoPort(protocol, port) => ElementKey::ProtoPortIndex(protocol, port, index),
                    other => other,
                };
                // A failed lookup ends the rule without a verdict.
                let Some((key, value)) = self.find(table, packet.family, map, &wanted)? else {
                    return Ok(Evaluation::NoMatch);
                };
                let Some(Value::Endpoint(ip, port)) = value.value else { return Ok(Evaluation::NoMatch) };
                element = Some(element_text(key, value));
                vec![Effect::Dnat { to: SocketAddr::new(ip, port) }]
            }
            Action::MarkOr(bits) => vec![Effect::Mark { mark: packet.mark | bits }],
            Action::MarkXor(bits) => vec![Effect::Mark { mark: packet.mark ^ bits }],
            Action::MasqueradeFullyRandom => vec![Effect::Masquerade],
            Action::RejectTcpReset if packet.protocol != Protocol::Tcp => return Ok(Evaluation::NoMatch),
            Action::RejectTcpReset => vec![Effect::Reject { with: "tcp reset".into() }],
            Action::Reject => {
                let with = match packet.family {
                    IpFamily::V4 => "icmp port-unreachable",
                    IpFamily::V6 => "icmpv6 port-unreachable",
                };
                vec![Effect::Reject { with: with.into() }]
            }
        };
        match (chance, random) {
            (Some(p), None) => Ok(Evaluation::Chance(p)),
            (Some(_), Some(Outcome::Chance(false))) => Ok(Evaluation::NoMatch),
            _ => Ok(Evaluation::Match { element, effects }),
        }
    }
}
