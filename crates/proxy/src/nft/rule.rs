//! Typed form of the per-Service nftables objects: rules, map elements and affinity sets.
//!
//! The planner builds these; they render to nft syntax (for `nft -f`, `roadkeeper rules` and
//! logs) through `Display`, and to netlink messages through [`super::netlink`], which is how
//! partial syncs reach the kernel without `nft` listing the whole ruleset first.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::objects::family_keyword;
use crate::table::{IpFamily, Protocol};

/// A condition of a rule. All conditions of a rule must hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Match {
    /// `ip saddr 10.244.0.11` (family from the rule).
    SaddrIs(IpAddr),
    /// `ip saddr 10.244.0.0/16`.
    SaddrIn(IpNet),
    /// `ip saddr @<set>`: the source is in a named set.
    SaddrInSet(String),
    /// `fib saddr type local`: the source address is local to this host.
    FibSaddrLocal,
    /// `numgen random mod <modulus> <value>`: true with probability 1/modulus (value is 0).
    Random {
        /// The modulus.
        modulus: u32,
        /// The value compared with (always 0 here).
        value: u32,
    },
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
    /// `update @<set> { ip saddr }`: add/refresh the source address in a dynamic set.
    UpdateSaddr(String),
    /// `meta l4proto <proto> dnat to <ip>:<port>`.
    Dnat {
        /// Transport protocol (a DNAT with a port needs one).
        protocol: Protocol,
        /// Endpoint address.
        ip: IpAddr,
        /// Endpoint port.
        port: u16,
    },
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
    /// `namespace/name[:port]`.
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
                Match::SaddrIn(net) if net.prefix_len() == net.max_prefix_len() => write!(f, "{ip} saddr {} ", net.addr())?,
                Match::SaddrIn(net) => write!(f, "{ip} saddr {} ", net.trunc())?,
                Match::SaddrInSet(set) => write!(f, "{ip} saddr @{set} ")?,
                Match::FibSaddrLocal => write!(f, "fib saddr type local ")?,
                Match::Random { modulus, value } => write!(f, "numgen random mod {modulus} {value} ")?,
            }
        }
        match &self.action {
            Action::Jump(chain) => write!(f, "jump {chain}")?,
            Action::Goto(chain) => write!(f, "goto {chain}")?,
            Action::Return => write!(f, "return")?,
            Action::Drop => write!(f, "drop")?,
            Action::UpdateSaddr(set) => write!(f, "update @{set} {{ {ip} saddr }}")?,
            Action::Dnat { protocol, ip: IpAddr::V4(addr), port } => {
                write!(f, "meta l4proto {} dnat to {addr}:{port}", protocol.as_str())?
            }
            Action::Dnat { protocol, ip: IpAddr::V6(addr), port } => {
                write!(f, "meta l4proto {} dnat to [{addr}]:{port}", protocol.as_str())?
            }
        }
        write!(f, " comment \"{}\"", self.comment)
    }
}

/// The key of an element of a shared set or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElementKey {
    /// `daddr . l4proto . dport` (service-ips, no-endpoint-services, firewall-ips).
    AddrProtoPort(IpAddr, Protocol, u16),
    /// `l4proto . dport` (service-nodeports, no-endpoint-nodeports).
    ProtoPort(Protocol, u16),
    /// An address (cluster-ips).
    Addr(IpAddr),
}

impl fmt::Display for ElementKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElementKey::AddrProtoPort(addr, proto, port) => write!(f, "{addr} . {} . {port}", proto.as_str()),
            ElementKey::ProtoPort(proto, port) => write!(f, "{} . {port}", proto.as_str()),
            ElementKey::Addr(addr) => write!(f, "{addr}"),
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

/// A session-affinity set: source addresses with a timeout, filled from the packet path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinitySet {
    /// Seconds an entry lives after its last update.
    pub timeout_secs: u32,
    /// `namespace/name[:port]`.
    pub comment: String,
}

impl AffinitySet {
    /// The declaration body for a family.
    pub fn declaration(&self, family: IpFamily) -> String {
        let addr = match family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        };
        format!(
            "type {addr} ; flags dynamic,timeout ; timeout {}s ; comment \"{}\" ;",
            self.timeout_secs, self.comment
        )
    }
}

/// One step of a partial-sync transaction on per-Service objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `add set <family> roadkeeper <name> { <affinity declaration> }`.
    AddSet {
        /// Table family.
        family: IpFamily,
        /// Set name.
        name: String,
        /// Its definition.
        set: AffinitySet,
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
        /// The verdict, for maps.
        value: Option<Verdict>,
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
    /// `flush map|set <family> roadkeeper <container>`: removes every element of a shared map.
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
            Op::AddSet { family, name, set } => write!(f, "add set {} {name} {{ {} }}", t(family), set.declaration(*family)),
            Op::AddChain { family, name } => write!(f, "add chain {} {name}", t(family)),
            Op::FlushChain { family, name } => write!(f, "flush chain {} {name}", t(family)),
            Op::AddRule { chain, rule } => write!(f, "add rule {} {chain} {rule}", t(&rule.family)),
            Op::DeleteElement { family, container, key } => {
                write!(f, "delete element {} {} {{ {key} }}", t(family), container.name())
            }
            Op::AddElement { family, container, key, value, comment } => {
                write!(f, "add element {} {} {{ {key} comment \"{comment}\"", t(family), container.name())?;
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
