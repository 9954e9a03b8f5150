//! Typed form of every nftables object roadkeeper writes: the fixed layout (table, base chains,
//! shared sets and maps, their rules) and the per-Service rules and map elements.
//!
//! The planners build these; they render to nft syntax (for `nft -f`, `roadkeeper rules` and
//! logs) through `Display`, and to netlink messages through `roadkeeper_proxy::nft::netlink`, which is how
//! every sync reaches the kernel without `nft` listing the whole ruleset first.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::family_keyword;
use crate::table::{IpFamily, Protocol};
use crate::text;

/// A condition of a rule. All conditions of a rule must hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Match {
    /// `ip saddr 10.244.0.11` (family from the rule).
    SaddrIs(IpAddr),
    /// `ip saddr 10.244.0.0/16`.
    SaddrIn(IpNet),
    /// `ip saddr . <key> @affinity`: the client was sent to this endpoint of this Service port
    /// within the affinity timeout.
    Affinity(AffinityKey),
    /// `fib saddr type local`: the source address is local to this host.
    FibSaddrLocal,
    /// `numgen random mod <modulus> <value>`: true with probability 1/modulus (value is 0).
    Random {
        /// The modulus.
        modulus: u32,
        /// The value compared with (always 0 here).
        value: u32,
    },
    /// `ct state new`.
    CtStateNew,
    /// `ip daddr 10.96.0.10` (family from the rule).
    DaddrIs(IpAddr),
    /// `ip daddr @<set>`: the destination is in a named set.
    DaddrInSet(String),
    /// `ip daddr != 127.0.0.0/8`: the destination is outside a prefix.
    DaddrNotIn(IpNet),
    /// `fib daddr type local`: the destination address is local to this host.
    FibDaddrLocal,
    /// `meta l4proto tcp`.
    L4Proto(Protocol),
    /// `meta mark & <bits> == 0`: none of the bits is set.
    MarkUnset(u32),
    /// `ip daddr . meta l4proto . th dport @<set>` (or `meta l4proto . th dport @<set>`): the
    /// frontend is in a named set.
    InSet {
        /// The key looked up.
        key: LookupKey,
        /// The set.
        set: String,
    },
    /// `ip saddr . ip daddr @<set>`.
    PairInSet(String),
    /// `ct status dnat`: the connection's destination was translated.
    CtStatusDnat,
}

/// What a set or map lookup is keyed by (matching the container's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LookupKey {
    /// `ip daddr . meta l4proto . th dport`.
    DaddrProtoPort,
    /// `meta l4proto . th dport`.
    ProtoPort,
}

/// What a rule does when its conditions hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// `jump <chain>`.
    Jump(String),
    /// `goto <chain>`.
    Goto(String),
    /// `return`.
    Return,
    /// `drop`.
    Drop,
    /// `update @affinity { ip saddr . <key> timeout <n>s }`: remembers (or refreshes) that the
    /// client was sent to this endpoint of this Service port.
    UpdateAffinity {
        /// The endpoint and Service port.
        key: AffinityKey,
        /// Seconds the entry lives after its last update (the Service's timeout).
        timeout_secs: u32,
    },
    /// `meta l4proto <proto> dnat to <ip>:<port>`.
    Dnat {
        /// Transport protocol (a DNAT with a port needs one).
        protocol: Protocol,
        /// Endpoint address.
        ip: IpAddr,
        /// Endpoint port.
        port: u16,
    },
    /// `<key> vmap @<map>`: the verdict of the map's element matching the key.
    Vmap {
        /// The key expression.
        key: LookupKey,
        /// The map's name.
        map: String,
    },
    /// `meta mark set meta mark | <bits>`.
    MarkOr(u32),
    /// `meta mark set meta mark ^ <bits>`.
    MarkXor(u32),
    /// `masquerade fully-random`.
    MasqueradeFullyRandom,
    /// `reject with tcp reset`.
    RejectTcpReset,
    /// `reject` (ICMP port unreachable).
    Reject,
    /// `dnat to <key> . numgen random mod <modulus> map @<map>`: one of the first `modulus`
    /// endpoints the map lists for the frontend, each with the same chance.
    DnatMap {
        /// The frontend's key.
        key: LookupKey,
        /// How many endpoints the frontends of this rule have.
        modulus: u32,
        /// The endpoint map.
        map: String,
    },
}

impl LookupKey {
    /// The key expression in nft syntax.
    pub fn text(self, family: IpFamily) -> String {
        match self {
            LookupKey::DaddrProtoPort => format!("{} daddr . meta l4proto . th dport", family_keyword(family)),
            LookupKey::ProtoPort => "meta l4proto . th dport".into(),
        }
    }
}

/// One rule of a per-Service chain, with its `namespace/name[:port]` comment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    /// Family of the table (selects `ip`/`ip6` and address lengths).
    pub family: IpFamily,
    /// Conditions, in order.
    pub matches: Vec<Match>,
    /// The statement.
    pub action: Action,
    /// `namespace/name[:port]`, or a note; empty for none.
    pub comment: String,
}

impl Rule {
    /// A rule with no condition.
    pub fn always(family: IpFamily, action: Action, comment: &str) -> Rule {
        Rule { family, matches: Vec::new(), action, comment: comment.to_string() }
    }

    /// A rule with conditions.
    pub fn when(family: IpFamily, matches: Vec<Match>, action: Action, comment: &str) -> Rule {
        Rule { family, matches, action, comment: comment.to_string() }
    }
}

impl fmt::Display for Rule {
    /// nft syntax of the rule body, as `nft list` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = family_keyword(self.family);
        for m in &self.matches {
            match m {
                Match::SaddrIs(addr) => write!(f, "{ip} saddr {addr} ")?,
                Match::SaddrIn(net) if net.prefix_len() == net.max_prefix_len() => {
                    write!(f, "{ip} saddr {} ", net.addr())?
                }
                Match::SaddrIn(net) => write!(f, "{ip} saddr {} ", net.trunc())?,
                Match::Affinity(key) => write!(f, "{ip} saddr . {key} @{AFFINITY} ")?,
                Match::FibSaddrLocal => write!(f, "fib saddr type local ")?,
                Match::Random { modulus, value } => write!(f, "numgen random mod {modulus} {value} ")?,
                Match::CtStateNew => write!(f, "ct state new ")?,
                Match::DaddrIs(addr) => write!(f, "{ip} daddr {addr} ")?,
                Match::DaddrInSet(set) => write!(f, "{ip} daddr @{set} ")?,
                Match::DaddrNotIn(net) if net.prefix_len() == net.max_prefix_len() => {
                    write!(f, "{ip} daddr != {} ", net.addr())?
                }
                Match::DaddrNotIn(net) => write!(f, "{ip} daddr != {} ", net.trunc())?,
                Match::FibDaddrLocal => write!(f, "fib daddr type local ")?,
                Match::L4Proto(protocol) => write!(f, "meta l4proto {} ", protocol.as_str())?,
                Match::MarkUnset(bits) => write!(f, "meta mark & {bits:#x} == 0 ")?,
                Match::InSet { key, set } => write!(f, "{} @{set} ", key.text(self.family))?,
                Match::PairInSet(set) => write!(f, "{ip} saddr . {ip} daddr @{set} ")?,
                Match::CtStatusDnat => write!(f, "ct status dnat ")?,
            }
        }
        match &self.action {
            Action::Jump(chain) => write!(f, "jump {chain}")?,
            Action::Goto(chain) => write!(f, "goto {chain}")?,
            Action::Return => write!(f, "return")?,
            Action::Drop => write!(f, "drop")?,
            Action::UpdateAffinity { key, timeout_secs } => {
                let timeout = duration(*timeout_secs);
                write!(f, "update @{AFFINITY} {{ {ip} saddr . {key} timeout {timeout} }}")?
            }
            Action::Dnat { protocol, ip: IpAddr::V4(addr), port } => {
                write!(f, "meta l4proto {} dnat to {addr}:{port}", protocol.as_str())?
            }
            Action::Dnat { protocol, ip: IpAddr::V6(addr), port } => {
                write!(f, "meta l4proto {} dnat to [{addr}]:{port}", protocol.as_str())?
            }
            Action::Vmap { key, map } => write!(f, "{} vmap @{map}", key.text(self.family))?,
            Action::DnatMap { key, modulus, map } => {
                write!(f, "dnat {ip} to {} . numgen random mod {modulus} map @{map}", key.text(self.family))?
            }
            Action::MarkOr(bits) => write!(f, "meta mark set meta mark | {bits:#x}")?,
            Action::MarkXor(bits) => write!(f, "meta mark set meta mark ^ {bits:#x}")?,
            Action::MasqueradeFullyRandom => write!(f, "masquerade fully-random")?,
            Action::RejectTcpReset => write!(f, "reject with tcp reset")?,
            Action::Reject => write!(f, "reject")?,
        }
        if !self.comment.is_empty() {
            write!(f, " comment \"{}\"", text::comment(&self.comment))?;
        }
        Ok(())
    }
}

/// The key of an element of a shared set or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElementKey {
    /// `daddr . l4proto . dport` (service-ips, no-endpoint-services, firewall-ips).
    AddrProtoPort(IpAddr, Protocol, u16),
    /// `l4proto . dport` (service-nodeports, no-endpoint-nodeports).
    ProtoPort(Protocol, u16),
    /// An address (cluster-ips, nodeport-ips).
    Addr(IpAddr),
    /// An inclusive range of addresses, in an interval set (service-cidrs).
    Range(IpAddr, IpAddr),
    /// `daddr . l4proto . dport . index` (the endpoint maps of address frontends).
    AddrProtoPortIndex(IpAddr, Protocol, u16, u32),
    /// `l4proto . dport . index` (the endpoint maps of NodePorts).
    ProtoPortIndex(Protocol, u16, u32),
    /// `saddr . daddr` (hairpin).
    AddrPair(IpAddr, IpAddr),
}

/// Whether `first..=last` is exactly one prefix; its length if so.
pub fn range_prefix(first: IpAddr, last: IpAddr) -> Option<u8> {
    let (first, last, bits) = match (first, last) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return None,
    };
    let size = last.checked_sub(first)?.checked_add(1);
    let host_bits = match size {
        None => 128, // the whole IPv6 space
        Some(n) if n.is_power_of_two() => n.trailing_zeros(),
        Some(_) => return None,
    };
    let mask = if host_bits == 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
    (first & mask == 0).then_some((bits - host_bits) as u8)
}

impl fmt::Display for ElementKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElementKey::AddrProtoPort(addr, proto, port) => write!(f, "{addr} . {} . {port}", proto.as_str()),
            ElementKey::ProtoPort(proto, port) => write!(f, "{} . {port}", proto.as_str()),
            ElementKey::Addr(addr) => write!(f, "{addr}"),
            ElementKey::Range(first, last) => match range_prefix(*first, *last) {
                Some(len) => write!(f, "{first}/{len}"),
                None => write!(f, "{first}-{last}"),
            },
            ElementKey::AddrProtoPortIndex(addr, proto, port, index) => {
                write!(f, "{addr} . {} . {port} . {index}", proto.as_str())
            }
            ElementKey::ProtoPortIndex(proto, port, index) => write!(f, "{} . {port} . {index}", proto.as_str()),
            ElementKey::AddrPair(a, b) => write!(f, "{a} . {b}"),
        }
    }
}

/// The value of a verdict-map element.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// `goto <chain>`.
    Goto(String),
    /// `jump <chain>`.
    Jump(String),
    /// `drop`.
    Drop,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Goto(chain) => write!(f, "goto {chain}"),
            Verdict::Jump(chain) => write!(f, "jump {chain}"),
            Verdict::Drop => write!(f, "drop"),
        }
    }
}

/// Seconds as nft lists them: `3h`, `1m30s`, `0s`.
fn duration(secs: u32) -> String {
    let parts = [(secs / 86_400, "d"), (secs / 3_600 % 24, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")];
    let text: String = parts.iter().filter(|(n, _)| *n > 0).map(|(n, unit)| format!("{n}{unit}")).collect();
    if text.is_empty() { "0s".into() } else { text }
}

/// The name of the shared set of session-affinity entries (one per family).
pub const AFFINITY: &str = "affinity";

/// An entry of the shared affinity set, less the client's address: this endpoint of this
/// Service port. The Service port is named by its ClusterIP (the unspecified address without
/// one) and port, not its protocol: two ports that differ only in protocol and send a client to
/// the same endpoint address and port share its entry, which sends it where either would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AffinityKey {
    /// The endpoint's address.
    pub endpoint: IpAddr,
    /// The endpoint's port.
    pub endpoint_port: u16,
    /// The Service port's ClusterIP.
    pub service: IpAddr,
    /// The Service port's port.
    pub service_port: u16,
}

impl fmt::Display for AffinityKey {
    /// `<endpoint> . <port> . <ClusterIP> . <port>`, as nft lists the set's elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} . {} . {} . {}", self.endpoint, self.endpoint_port, self.service, self.service_port)
    }
}

/// The type of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChainType {
    /// `type filter`.
    Filter,
    /// `type nat`.
    Nat,
}

/// A netfilter hook of the ip/ip6 families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HookPoint {
    /// `hook prerouting`.
    Prerouting,
    /// `hook input`.
    Input,
    /// `hook forward`.
    Forward,
    /// `hook output`.
    Output,
    /// `hook postrouting`.
    Postrouting,
}

/// Where a base chain hooks in: `type <type> hook <hook> priority <priority>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hook {
    /// The chain type.
    pub chain_type: ChainType,
    /// The hook.
    pub point: HookPoint,
    /// The priority.
    pub priority: i32,
}

impl fmt::Display for Hook {
    /// `type nat hook prerouting priority dstnat ;`, the names nft uses for standard priorities.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = match self.chain_type {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        };
        let hook = match self.point {
            HookPoint::Prerouting => "prerouting",
            HookPoint::Input => "input",
            HookPoint::Forward => "forward",
            HookPoint::Output => "output",
            HookPoint::Postrouting => "postrouting",
        };
        write!(f, "type {ty} hook {hook} priority ")?;
        match (self.chain_type, self.point, self.priority) {
            (ChainType::Nat, HookPoint::Prerouting, -100) => write!(f, "dstnat")?,
            (ChainType::Nat, HookPoint::Postrouting, 100) => write!(f, "srcnat")?,
            (_, _, priority) => write!(f, "{priority}")?,
        }
        write!(f, " ;")
    }
}

/// One step of a transaction: the layout's table, base chains and shared containers, and the
/// chains, rules, sets and elements of Services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `add table <family> roadkeeper { comment "rules for roadkeeper" ; }`.
    AddTable {
        /// Table family.
        family: IpFamily,
    },
    /// `add chain <family> roadkeeper <name> { type ... hook ... priority ... ; }`.
    AddBaseChain {
        /// Table family.
        family: IpFamily,
        /// Chain name.
        name: String,
        /// Type, hook and priority.
        hook: Hook,
    },
    /// `add map|set <family> roadkeeper <container> { <declaration> }`: a shared container.
    AddContainer {
        /// Table family.
        family: IpFamily,
        /// Which shared set or map.
        container: super::objects::Container,
    },
    /// `add chain <family> roadkeeper <name>` (a regular chain).
    AddChain {
        /// Table family.
        family: IpFamily,
        /// Chain name.
        name: String,
    },
    /// `flush chain <family> roadkeeper <name>`.
    FlushChain {
        /// Table family.
        family: IpFamily,
        /// Chain name.
        name: String,
    },
    /// `add rule <family> roadkeeper <chain> <rule>` (appended).
    AddRule {
        /// Chain name.
        chain: String,
        /// The rule (carries its family).
        rule: Rule,
    },
    /// `delete element <family> roadkeeper <container> { <key> }`.
    DeleteElement {
        /// Table family.
        family: IpFamily,
        /// Which shared set or map.
        container: super::objects::Container,
        /// The element key.
        key: ElementKey,
    },
    /// `add element <family> roadkeeper <container> { <key> comment "<comment>" [: <verdict>] }`.
    AddElement {
        /// Table family.
        family: IpFamily,
        /// Which shared set or map.
        container: super::objects::Container,
        /// The element key.
        key: ElementKey,
        /// What it maps to, for maps.
        value: Option<super::objects::Value>,
        /// `namespace/name[:port]`.
        comment: String,
    },
    /// `delete chain <family> roadkeeper <name>` (after it was flushed).
    DeleteChain {
        /// Table family.
        family: IpFamily,
        /// Chain name.
        name: String,
    },
    /// `flush map|set <family> roadkeeper <container>`: removes every element of a shared set or map.
    FlushSet {
        /// Table family.
        family: IpFamily,
        /// Which shared set or map.
        container: super::objects::Container,
    },
    /// `delete set <family> roadkeeper <name>`.
    DeleteSet {
        /// Table family.
        family: IpFamily,
        /// Set name.
        name: String,
    },
}

impl fmt::Display for Op {
    /// The op as one line of an `nft -f` script.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |family: &IpFamily| format!("{} {}", family_keyword(*family), super::objects::TABLE);
        match self {
            Op::AddTable { family } => {
                write!(f, "add table {} {{ comment \"{}\" ; }}", t(family), super::objects::TABLE_COMMENT)
            }
            Op::AddBaseChain { family, name, hook } => write!(f, "add chain {} {name} {{ {hook} }}", t(family)),
            Op::AddContainer { family, container } => {
                write!(
                    f,
                    "add {} {} {} {{ {} }}",
                    container.keyword(),
                    t(family),
                    container.name(),
                    container.declaration(*family)
                )
            }
            Op::AddChain { family, name } => write!(f, "add chain {} {name}", t(family)),
            Op::FlushChain { family, name } => write!(f, "flush chain {} {name}", t(family)),
            Op::AddRule { chain, rule } => write!(f, "add rule {} {chain} {rule}", t(&rule.family)),
            Op::DeleteElement { family, container, key } => {
                write!(f, "delete element {} {} {{ {key} }}", t(family), container.name())
            }
            Op::AddElement { family, container, key, value, comment } => {
                write!(f, "add element {} {} {{ {key}", t(family), container.name())?;
                if !comment.is_empty() {
                    write!(f, " comment \"{}\"", text::comment(comment))?;
                }
                if let Some(value) = value {
                    write!(f, " : {value}")?;
                }
                write!(f, " }}")
            }
            Op::DeleteChain { family, name } => write!(f, "delete chain {} {name}", t(family)),
            Op::FlushSet { family, container } => {
                write!(f, "flush {} {} {}", container.keyword(), t(family), container.name())
            }
            Op::DeleteSet { family, name } => write!(f, "delete set {} {name}", t(family)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_print_as_nft_lists_them() {
        let cases = [(10_800, "3h"), (60, "1m"), (90, "1m30s"), (86_400 + 1, "1d1s"), (0, "0s")];
        for (secs, want) in cases {
            assert_eq!(duration(secs), want);
        }
    }
}
