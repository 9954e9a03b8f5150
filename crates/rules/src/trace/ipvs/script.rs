//! IPVS mode's helper tables (`ip/ip6 roadkeeper-ipvs`) as the kernel holds them after the
//! `nft -f` scripts the proxy applies ([`HelperRules::script`](crate::ipvs::HelperRules::script),
//! [`element_script`](crate::ipvs::element_script)): the grammar they are written in, parsed
//! (tables, named sets and maps with their elements, base and regular chains; rules of `ct state`,
//! address, protocol, port and mark comparisons against values, anonymous and named sets;
//! statements setting the mark, DNAT through a map, masquerading, rejecting, dropping, accepting,
//! jumping), and applied whole or refused, as `nft -f` commits a script. A construct outside it
//! is a parse error naming its line, never skipped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::super::engine::{BaseChain, Evaluation, PacketState};
use super::super::{Effect, Error};
use crate::nft::objects::family_keyword;
use crate::nft::rule::HookPoint;
use crate::table::{IpFamily, Protocol};

/// One component of a set element or compared value: an address or prefix, or a word (`tcp`,
/// `80`, `0x4000`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Net(IpNet),
    Word(String),
}

/// A value of the packet a selector reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Ip(IpAddr),
    Word(&'static str),
    Num(u64),
}

/// A concatenation of parts: `10.96.0.10 . tcp . 80`.
type Element = Vec<Part>;

/// The elements of a set (no values) or map (`key : value`).
type Elements = BTreeMap<Element, Option<Element>>;

/// What a selector reads: `ip saddr`, `ip daddr` (or `ip6`), `meta l4proto`, `th dport`,
/// `meta mark`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Selector {
    Saddr,
    Daddr,
    L4proto,
    Dport,
    Mark,
}

/// The right-hand side of a comparison.
#[derive(Debug, Clone, PartialEq)]
enum Rhs {
    /// `@name`.
    Set(String),
    /// `{ a, b }`.
    Anonymous(Vec<Element>),
    /// A value.
    Value(Element),
}

/// A condition of a rule.
#[derive(Debug, Clone, PartialEq)]
enum Condition {
    /// `ct state new,...`: the first packet of a connection is `new`.
    CtState(Vec<String>),
    /// `key [& mask] [==|!=] rhs`.
    Compare { key: Vec<Selector>, mask: Option<u64>, negated: bool, rhs: Rhs },
}

/// A statement of a rule.
#[derive(Debug, Clone, PartialEq)]
enum Statement {
    /// `meta mark set meta mark | bits` (`Some('|')`), `^ bits`, `& bits`, or `meta mark set bits`.
    Mark(Option<char>, u32),
    Masquerade,
    /// `reject` or `reject with ...`.
    Reject(Option<String>),
    Drop,
    Accept,
    Return,
    Jump(String),
    Goto(String),
    /// `dnat to key map @map`: to the `address . port` the map holds for the key (a key it does
    /// not hold ends the rule, as a failed lookup does).
    DnatMap(Vec<Selector>, String),
}

/// A rule of a script.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NftRule {
    conditions: Vec<Condition>,
    statements: Vec<Statement>,
    /// As the script wrote it.
    text: String,
}

/// A rule of a helper chain, or the IPVS stage (which no script writes).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rule {
    /// A rule of a script.
    Nft(NftRule),
    /// IPVS's lookup of the packet's virtual server and its scheduler's choice.
    VirtualServer,
}

impl Rule {
    /// The rule as listings show it.
    pub(super) fn text(&self) -> &str {
        match self {
            Rule::Nft(rule) => &rule.text,
            Rule::VirtualServer => "virtual server lookup (ipvsadm -Ln)",
        }
    }
}

/// Where a base chain hooks in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BaseHook {
    point: HookPoint,
    priority: i32,
    nat: bool,
    /// `type filter hook input priority filter`.
    text: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Chain {
    hook: Option<BaseHook>,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq)]
struct Table {
    family: IpFamily,
    /// Sets and maps, by name.
    sets: BTreeMap<String, Elements>,
    chains: BTreeMap<String, Chain>,
}

/// The helper tables, by name as listings show it (`ip roadkeeper-ipvs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Tables {
    tables: BTreeMap<String, Table>,
}

/// Where the parser is.
enum Block {
    Top,
    Table(String),
    Chain(String, String),
}

fn parse_error(line: usize, text: &str, message: impl Into<String>) -> Error {
    Error::Parse { line, text: text.to_string(), message: message.into() }
}

/// The words of a line, with `{`, `}`, `,` and `;` words of their own.
fn words(line: &str) -> Vec<String> {
    let mut spaced = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if matches!(c, '{' | '}' | ',' | ';') {
            let _ = write!(spaced, " {c} ");
        } else {
            spaced.push(c);
        }
    }
    spaced.split_whitespace().map(str::to_string).collect()
}

fn family_of(word: &str) -> Option<IpFamily> {
    match word {
        "ip" => Some(IpFamily::V4),
        "ip6" => Some(IpFamily::V6),
        _ => None,
    }
}

/// A word as a number (decimal or `0x` hex).
fn number(word: &str) -> Option<u64> {
    match word.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => word.parse().ok(),
    }
}

fn part(word: &str) -> Part {
    if let Ok(net) = word.parse::<IpNet>() {
        return Part::Net(net);
    }
    match word.parse::<IpAddr>() {
        Ok(ip) => Part::Net(IpNet::from(ip)),
        Err(_) => Part::Word(word.to_string()),
    }
}

/// Elements from the words of `{ a . b, c . d }` or `{ a . b : c . d, ... }` (without the braces).
fn elements(words: &[String]) -> Vec<(Element, Option<Element>)> {
    let concatenation = |words: &[String]| -> Element { words.iter().filter(|w| *w != ".").map(|w| part(w)).collect() };
    words
        .split(|w| w == ",")
        .filter(|group| !group.is_empty())
        .map(|group| match group.iter().position(|w| w == ":") {
            Some(at) => (concatenation(&group[..at]), Some(concatenation(&group[at + 1..]))),
            None => (concatenation(group), None),
        })
        .collect()
}

/// The words between the `{` at `words[at]` and its `}`, and the index after the `}`.
fn braced(words: &[String], at: usize) -> Option<(&[String], usize)> {
    if words.get(at).map(String::as_str) != Some("{") {
        return None;
    }
    let close = at + words[at..].iter().position(|w| w == "}")?;
    Some((&words[at + 1..close], close + 1))
}

fn element_text(element: &Element) -> String {
    let parts: Vec<String> = element
        .iter()
        .map(|p| match p {
            Part::Net(net) if net.prefix_len() == net.max_prefix_len() => net.addr().to_string(),
            Part::Net(net) => net.to_string(),
            Part::Word(word) => word.clone(),
        })
        .collect();
    parts.join(" . ")
}

/// The numeric priority of a base chain (`priority filter`, `dstnat`, `-150`, ...).
fn priority(word: &str) -> Option<i32> {
    Some(match word {
        "raw" => -300,
        "mangle" => -150,
        "dstnat" => -100,
        "filter" => 0,
        "security" => 50,
        "srcnat" => 100,
        other => other.parse().ok()?,
    })
}

fn hook_point(word: &str) -> Option<HookPoint> {
    Some(match word {
        "prerouting" => HookPoint::Prerouting,
        "input" => HookPoint::Input,
        "forward" => HookPoint::Forward,
        "output" => HookPoint::Output,
        "postrouting" => HookPoint::Postrouting,
        _ => return None,
    })
}

impl Tables {
    /// Applies one `nft -f` script: all of it, or (refused, or outside the grammar) none of it.
    pub(super) fn apply(&mut self, script: &str) -> Result<(), Error> {
        let mut next = self.clone();
        let mut block = Block::Top;
        for (index, line) in script.lines().enumerate() {
            let number = index + 1;
            let text = line.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let words = words(text);
            block = next.line(block, &words, number, text)?;
        }
        if !matches!(block, Block::Top) {
            return Err(parse_error(script.lines().count(), "", "a block is not closed"));
        }
        *self = next;
        Ok(())
    }

    /// Applies one line in `block`; the block the next line is in.
    fn line(&mut self, block: Block, words: &[String], line: usize, text: &str) -> Result<Block, Error> {
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        let refused = |message: &str| Error::Refused { change: text.to_string(), message: message.to_string() };
        match block {
            Block::Top => match w.as_slice() {
                ["table", family, name, "{"] => Ok(Block::Table(self.ensure(family, name, line, text)?)),
                ["add" | "create", "table", family, name] => {
                    let exists = self.tables.contains_key(&format!("{family} {name}"));
                    if w[0] == "create" && exists {
                        return Err(refused("the table exists"));
                    }
                    self.ensure(family, name, line, text)?;
                    Ok(Block::Top)
                }
                ["delete" | "flush", "table", family, name] => {
                    let key = format!("{family} {name}");
                    let table = self.tables.get_mut(&key).ok_or_else(|| refused("no such table"))?;
                    if w[0] == "delete" {
                        self.tables.remove(&key);
                    } else {
                        table.sets.values_mut().for_each(BTreeMap::clear);
                        table.chains.values_mut().for_each(|c| c.rules.clear());
                    }
                    Ok(Block::Top)
                }
                ["add" | "delete", "element", family, name, set, ..] => {
                    let (inner, end) =
                        braced(words, 5).ok_or_else(|| parse_error(line, text, "expected { elements }"))?;
                    if end != words.len() {
                        return Err(parse_error(line, text, "unexpected words after the elements"));
                    }
                    let table =
                        self.tables.get_mut(&format!("{family} {name}")).ok_or_else(|| refused("no such table"))?;
                    let elements_of = table.sets.get_mut(*set).ok_or_else(|| refused("no such set"))?;
                    for (key, value) in elements(inner) {
                        if w[0] == "delete" {
                            elements_of.remove(&key).ok_or_else(|| refused("no such element"))?;
                        } else if elements_of.get(&key).is_some_and(|have| *have != value) {
                            return Err(refused("the element exists"));
                        } else {
                            elements_of.insert(key, value);
                        }
                    }
                    Ok(Block::Top)
                }
                _ => Err(parse_error(line, text, "expected a table, or an element or table command")),
            },
            Block::Table(table) => match w.as_slice() {
                ["}"] => Ok(Block::Top),
                ["set" | "map", name, "{", .., "}"] => {
                    let inner = &words[3..words.len() - 1];
                    let found = match inner.iter().position(|w| w == "elements") {
                        Some(at) if inner.get(at + 1).map(String::as_str) == Some("=") => {
                            let (list, _) = braced(inner, at + 2)
                                .ok_or_else(|| parse_error(line, text, "expected elements = { ... }"))?;
                            elements(list)
                        }
                        Some(_) => return Err(parse_error(line, text, "expected elements = { ... }")),
                        None => Vec::new(),
                    };
                    let open = self.tables.get_mut(&table).expect("the open table exists");
                    let declared = open.sets.entry(name.to_string()).or_default();
                    for (key, value) in found {
                        declared.insert(key, value);
                    }
                    Ok(Block::Table(table))
                }
                ["chain", name, "{"] => {
                    self.tables
                        .get_mut(&table)
                        .expect("the open table exists")
                        .chains
                        .entry(name.to_string())
                        .or_default();
                    Ok(Block::Chain(table, name.to_string()))
                }
                _ => Err(parse_error(line, text, "expected a set, a chain or }")),
            },
            Block::Chain(table, chain) => {
                let family = self.tables[&table].family;
                let target = self.tables.get_mut(&table).expect("the open table exists");
                let target = target.chains.get_mut(&chain).expect("the open chain exists");
                match w.as_slice() {
                    ["}"] => Ok(Block::Table(table)),
                    ["type", kind, "hook", hook, "priority", prio, ";", rest @ ..] => {
                        let point = hook_point(hook).ok_or_else(|| parse_error(line, text, "unknown hook"))?;
                        let priority = priority(prio).ok_or_else(|| parse_error(line, text, "unknown priority"))?;
                        if !matches!(rest, [] | ["policy", "accept", ";"]) {
                            return Err(parse_error(line, text, "only policy accept is modelled"));
                        }
                        if !matches!(*kind, "filter" | "nat") {
                            return Err(parse_error(line, text, "unknown chain type"));
                        }
                        let hook = BaseHook {
                            point,
                            priority,
                            nat: *kind == "nat",
                            text: format!("type {kind} hook {hook} priority {prio}"),
                        };
                        match &target.hook {
                            Some(have) if *have != hook => Err(refused("the chain has another hook")),
                            _ => {
                                target.hook = Some(hook);
                                Ok(Block::Chain(table, chain))
                            }
                        }
                    }
                    _ => {
                        let (conditions, statements) =
                            parse_rule(words, family).map_err(|message| parse_error(line, text, message))?;
                        target.rules.push(Rule::Nft(NftRule { conditions, statements, text: text.to_string() }));
                        Ok(Block::Chain(table, chain))
                    }
                }
            }
        }
    }

    /// The table `family name`, created if absent; its key.
    fn ensure(&mut self, family: &str, name: &str, line: usize, text: &str) -> Result<String, Error> {
        let family = family_of(family).ok_or_else(|| parse_error(line, text, "the family is ip or ip6"))?;
        let key = format!("{} {name}", family_keyword(family));
        self.tables.entry(key.clone()).or_insert(Table { family, sets: BTreeMap::new(), chains: BTreeMap::new() });
        Ok(key)
    }

    /// The base chains of `family` at `hook`, with their priorities.
    pub(super) fn base_chains(&self, family: IpFamily, hook: HookPoint) -> Vec<(i32, BaseChain)> {
        let mut out = Vec::new();
        for (name, table) in self.tables.iter().filter(|(_, t)| t.family == family) {
            for (chain, c) in &table.chains {
                if let Some(h) = c.hook.as_ref().filter(|h| h.point == hook) {
                    let base =
                        BaseChain { table: name.clone(), chain: chain.clone(), hook: h.text.clone(), nat: h.nat };
                    out.push((h.priority, base));
                }
            }
        }
        out
    }

    /// The rules of a chain.
    pub(super) fn rules(&self, table: &str, chain: &str) -> Option<&[Rule]> {
        self.tables.get(table)?.chains.get(chain).map(|c| c.rules.as_slice())
    }

    /// What `conditions` and `statements` of a rule of `table` do to `packet`.
    pub(super) fn evaluate(&self, table: &str, rule: &Rule, packet: &PacketState) -> Result<Evaluation, Error> {
        let Rule::Nft(NftRule { conditions, statements, .. }) = rule else { return Ok(Evaluation::NoMatch) };
        let sets = &self.tables.get(table).expect("a rule is in its table").sets;
        let mut element = None;
        for condition in conditions {
            let holds = match condition {
                Condition::CtState(states) => states.iter().any(|s| s == "new"),
                Condition::Compare { key, mask, negated, rhs } => {
                    let value: Vec<Value> = key.iter().map(|s| read(*s, *mask, packet)).collect();
                    let found = match rhs {
                        Rhs::Set(name) => {
                            let set = sets
                                .get(name)
                                .ok_or_else(|| Error::NoSuchSet { table: table.to_string(), set: name.clone() })?;
                            set.keys().find(|e| matches(e, &value)).cloned()
                        }
                        Rhs::Anonymous(list) => list.iter().find(|e| matches(e, &value)).cloned(),
                        Rhs::Value(e) => matches(e, &value).then(|| e.clone()),
                    };
                    if let (Some(found), false, Rhs::Set(_)) = (&found, negated, rhs) {
                        element = Some(element_text(found));
                    }
                    found.is_some() != *negated
                }
            };
            if !holds {
                return Ok(Evaluation::NoMatch);
            }
        }
        let mut mark = packet.mark;
        let mut effects = Vec::new();
        for statement in statements {
            effects.push(match statement {
                Statement::Mark(op, bits) => {
                    mark = match op {
                        Some('|') => mark | bits,
                        Some('^') => mark ^ bits,
                        Some(_) => mark & bits,
                        None => *bits,
                    };
                    Effect::Mark { mark }
                }
                Statement::Masquerade => Effect::Masquerade,
                // nft adds the `meta l4proto tcp` a tcp reset needs.
                Statement::Reject(Some(with)) if with == "tcp reset" && packet.protocol != Protocol::Tcp => {
                    return Ok(Evaluation::NoMatch);
                }
                Statement::Reject(with) => {
                    let default = match packet.family {
                        IpFamily::V4 => "icmp port-unreachable",
                        IpFamily::V6 => "icmpv6 port-unreachable",
                    };
                    Effect::Reject { with: with.clone().unwrap_or_else(|| default.to_string()) }
                }
                Statement::Drop => Effect::Drop,
                Statement::Accept => Effect::Accept,
                Statement::Return => Effect::Return,
                Statement::Jump(chain) => Effect::Jump { chain: chain.clone() },
                Statement::Goto(chain) => Effect::Goto { chain: chain.clone() },
                Statement::DnatMap(key, map) => {
                    let value: Vec<Value> = key.iter().map(|s| read(*s, None, packet)).collect();
                    let map_of =
                        sets.get(map).ok_or_else(|| Error::NoSuchSet { table: table.to_string(), set: map.clone() })?;
                    let found = map_of.iter().find(|(k, _)| matches(k, &value));
                    let Some((found, Some(to))) = found else { return Ok(Evaluation::NoMatch) };
                    let to = match to.as_slice() {
                        [Part::Net(net), Part::Word(port)] => {
                            port.parse().ok().map(|port| SocketAddr::new(net.addr(), port))
                        }
                        _ => None,
                    };
                    let Some(to) = to else { return Ok(Evaluation::NoMatch) };
                    element = Some(format!("{} : {to}", element_text(found)));
                    Effect::Dnat { to }
                }
            });
        }
        Ok(Evaluation::Match { element, effects })
    }
}

/// What `selector` reads from `packet` (`mask` applied to the mark).
fn read(selector: Selector, mask: Option<u64>, packet: &PacketState) -> Value {
    match selector {
        Selector::Saddr => Value::Ip(packet.source),
        Selector::Daddr => Value::Ip(packet.destination.ip()),
        Selector::L4proto => Value::Word(packet.protocol.as_str()),
        Selector::Dport => Value::Num(packet.destination.port().into()),
        Selector::Mark => Value::Num(u64::from(packet.mark) & mask.unwrap_or(u64::MAX)),
    }
}

/// True when `element` holds `value`, part by part.
fn matches(element: &Element, value: &[Value]) -> bool {
    element.len() == value.len()
        && element.iter().zip(value).all(|(part, value)| match (part, value) {
            (Part::Net(net), Value::Ip(ip)) => net.contains(ip),
            (Part::Word(word), Value::Word(have)) => word == have,
            (Part::Word(word), Value::Num(have)) => number(word) == Some(*have),
            _ => false,
        })
}

/// The conditions and statements of a rule's words.
fn parse_rule(words: &[String], family: IpFamily) -> Result<(Vec<Condition>, Vec<Statement>), String> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let (mut conditions, mut statements) = (Vec::new(), Vec::new());
    let mut at = 0;
    let num = |word: Option<&&str>| -> Result<u32, String> {
        let word = word.ok_or("expected a number")?;
        number(word).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("{word:?} is no 32-bit number"))
    };
    while at < w.len() {
        match &w[at..] {
            ["ct", "state", states, ..] => {
                conditions.push(Condition::CtState(states.split(',').map(str::to_string).collect()));
                at += 3;
            }
            ["meta", "mark", "set", "meta", "mark", op @ ("|" | "^" | "&"), ..] => {
                let op = op.chars().next();
                statements.push(Statement::Mark(op, num(w.get(at + 6))?));
                at += 7;
            }
            ["meta", "mark", "set", ..] => {
                statements.push(Statement::Mark(None, num(w.get(at + 3))?));
                at += 4;
            }
            ["masquerade", ..] => {
                statements.push(Statement::Masquerade);
                at += 1;
                while matches!(w.get(at), Some(&("fully-random" | "random" | "persistent"))) {
                    at += 1;
                }
            }
            ["reject", "with", rest @ ..] => {
                let with: Vec<&str> = rest.iter().take_while(|w| !is_statement(w)).copied().collect();
                if with.is_empty() {
                    return Err("reject with what?".into());
                }
                at += 2 + with.len();
                statements.push(Statement::Reject(Some(with.join(" "))));
            }
            ["reject", ..] => {
                statements.push(Statement::Reject(None));
                at += 1;
            }
            [verdict @ ("drop" | "accept" | "return"), ..] => {
                statements.push(match *verdict {
                    "drop" => Statement::Drop,
                    "accept" => Statement::Accept,
                    _ => Statement::Return,
                });
                at += 1;
            }
            [verdict @ ("jump" | "goto"), chain, ..] => {
                let chain = chain.to_string();
                statements.push(if *verdict == "jump" { Statement::Jump(chain) } else { Statement::Goto(chain) });
                at += 2;
            }
            ["dnat", "to", ..] => {
                let (key, used) = parse_key(&words[at + 2..], family)?;
                at += 2 + used;
                match w.get(at..at + 2) {
                    Some(["map", map]) if map.starts_with('@') && map.len() > 1 => {
                        statements.push(Statement::DnatMap(key, map[1..].to_string()));
                        at += 2;
                    }
                    _ => return Err("only dnat to <key> map @map is modelled".into()),
                }
            }
            _ if !statements.is_empty() => return Err(format!("a condition after a statement at {:?}", w[at])),
            _ => {
                let (condition, used) = parse_comparison(&words[at..], family)?;
                conditions.push(condition);
                at += used;
            }
        }
    }
    if statements.is_empty() {
        return Err("a rule without a statement".into());
    }
    Ok((conditions, statements))
}

fn is_statement(word: &str) -> bool {
    matches!(word, "drop" | "accept" | "return" | "jump" | "goto" | "masquerade" | "meta" | "counter" | "dnat")
}

/// A concatenation of selectors at the start of `words`, and how many words it takes.
fn parse_key(words: &[String], family: IpFamily) -> Result<(Vec<Selector>, usize), String> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let ip = family_keyword(family);
    let mut key = Vec::new();
    let mut at = 0;
    loop {
        let selector = match (w.get(at), w.get(at + 1)) {
            (Some(&f), Some(&"saddr")) if f == ip => Selector::Saddr,
            (Some(&f), Some(&"daddr")) if f == ip => Selector::Daddr,
            (Some(&"meta"), Some(&"l4proto")) => Selector::L4proto,
            (Some(&"th"), Some(&"dport")) => Selector::Dport,
            (Some(&"meta"), Some(&"mark")) => Selector::Mark,
            _ => return Err(format!("unknown expression at {:?}", w.get(at).copied().unwrap_or(""))),
        };
        key.push(selector);
        at += 2;
        if w.get(at) == Some(&".") {
            at += 1;
        } else {
            return Ok((key, at));
        }
    }
}

/// A comparison `key [& mask] [==|!=] rhs` at the start of `words`, and how many words it takes.
fn parse_comparison(words: &[String], family: IpFamily) -> Result<(Condition, usize), String> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let (key, mut at) = parse_key(words, family)?;
    let mut mask = None;
    if w.get(at) == Some(&"&") {
        mask = Some(w.get(at + 1).and_then(|m| number(m)).ok_or("expected a mask")?);
        at += 2;
    }
    let negated = match w.get(at) {
        Some(&"!=") => {
            at += 1;
            true
        }
        Some(&"==") => {
            at += 1;
            false
        }
        _ => false,
    };
    let rhs = match w.get(at) {
        Some(set) if set.starts_with('@') && set.len() > 1 => {
            at += 1;
            Rhs::Set(set[1..].to_string())
        }
        Some(&"{") => {
            let (inner, end) = braced(words, at).ok_or("an anonymous set is not closed")?;
            at = end;
            let list = elements(inner);
            if list.iter().any(|(_, value)| value.is_some()) {
                return Err("anonymous maps are not modelled".into());
            }
            Rhs::Anonymous(list.into_iter().map(|(key, _)| key).collect())
        }
        Some(_) => {
            let mut parts = Vec::new();
            while let Some(word) = w.get(at) {
                parts.push(part(word));
                at += 1;
                if w.get(at) != Some(&".") {
                    break;
                }
                at += 1;
            }
            Rhs::Value(parts)
        }
        None => return Err("a comparison without a value".into()),
    };
    Ok((Condition::Compare { key, mask, negated, rhs }, at))
}
