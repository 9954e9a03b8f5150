//! `iptables-restore` input in exactly the grammar our planner writes, parsed: table sections,
//! chain declarations, `-A`/`-I` rules with the matches and targets of
//! [`crate::iptables::plan`], `-X`, `COMMIT`, comments. A rule renders back to the text it was
//! parsed from (`Display`), which the tests and the fuzz target (`crates/rules/fuzz`) check.

use std::fmt;
use std::net::SocketAddr;

use ipnet::IpNet;

use crate::table::Protocol;

/// A condition of a rule, as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Match {
    /// `[!] -s NET`.
    Source {
        /// `!`.
        negated: bool,
        /// The prefix.
        net: IpNet,
    },
    /// `[!] -d NET`.
    Destination {
        /// `!`.
        negated: bool,
        /// The prefix.
        net: IpNet,
    },
    /// `-p PROTO`.
    Protocol(Protocol),
    /// `-m comment --comment "TEXT"`.
    Comment(String),
    /// `-m PROTO [--dport N]`.
    Port {
        /// The protocol module.
        protocol: Protocol,
        /// The destination port, if matched.
        dport: Option<u16>,
    },
    /// `-m statistic --mode random --probability P`.
    Random {
        /// The probability, in 0..=1.
        probability: f64,
    },
    /// `-m recent --rcheck [--seconds N] [--reap] --name NAME`.
    RecentCheck {
        /// `--seconds`.
        seconds: Option<u32>,
        /// `--reap`.
        reap: bool,
        /// The list.
        name: String,
    },
    /// `-m recent --set --name NAME`.
    RecentSet {
        /// The list.
        name: String,
    },
    /// `-m addrtype --src-type LOCAL` / `--dst-type LOCAL`.
    LocalAddress {
        /// The source (else the destination).
        source: bool,
    },
    /// `-m mark [!] --mark VALUE/MASK`.
    Mark {
        /// `!`.
        negated: bool,
        /// The value.
        value: u32,
        /// The mask.
        mask: u32,
    },
    /// `-m conntrack [!] --ctstate STATE,...`.
    CtState {
        /// `!`.
        negated: bool,
        /// The states.
        states: Vec<CtState>,
    },
}

/// A connection-tracking state of `--ctstate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtState {
    /// `NEW`.
    New,
    /// `ESTABLISHED`.
    Established,
    /// `RELATED`.
    Related,
    /// `INVALID`.
    Invalid,
    /// `DNAT` (the destination was rewritten).
    Dnat,
    /// `SNAT` (the source was rewritten).
    Snat,
}

impl CtState {
    const ALL: [(CtState, &'static str); 6] = [
        (CtState::New, "NEW"),
        (CtState::Established, "ESTABLISHED"),
        (CtState::Related, "RELATED"),
        (CtState::Invalid, "INVALID"),
        (CtState::Dnat, "DNAT"),
        (CtState::Snat, "SNAT"),
    ];

    fn name(self) -> &'static str {
        CtState::ALL.iter().find(|(s, _)| *s == self).map(|(_, n)| *n).expect("every state has a name")
    }
}

/// What a rule does when it matches, as written after `-j`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A user chain.
    Chain(String),
    /// `RETURN`.
    Return,
    /// `ACCEPT`.
    Accept,
    /// `DROP`.
    Drop,
    /// `REJECT [--reject-with tcp-reset]`.
    Reject {
        /// With a TCP reset (else ICMP port unreachable).
        tcp_reset: bool,
    },
    /// `DNAT --to-destination IP:PORT`.
    Dnat(SocketAddr),
    /// `MARK --or-mark VALUE`.
    MarkOr(u32),
    /// `MARK --xor-mark VALUE`.
    MarkXor(u32),
    /// `MASQUERADE --random-fully`.
    Masquerade,
}

/// A rule's matches and target (none: the rule only counts, or carries a comment).
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Conditions, in the order written.
    pub matches: Vec<Match>,
    /// The target.
    pub target: Option<Target>,
}

/// One line of restore input.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// `*TABLE`.
    Table(String),
    /// `:CHAIN - [0:0]`: creates a user chain, or flushes it.
    Chain(String),
    /// `-A CHAIN RULE`.
    Append(String, Rule),
    /// `-I CHAIN RULE` (at the top).
    Insert(String, Rule),
    /// `-X CHAIN`.
    Delete(String),
    /// `COMMIT`.
    Commit,
}

/// Splits a line into words; a word in double quotes may hold spaces (and loses its quotes).
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let (word, tail) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"').ok_or("unterminated quote")?;
            let tail = &quoted[end + 1..];
            if !tail.is_empty() && !tail.starts_with(char::is_whitespace) {
                return Err("text after a closing quote".into());
            }
            (&quoted[..end], tail)
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            if rest[..end].contains('"') {
                return Err("a quote inside a word".into());
            }
            (&rest[..end], &rest[end..])
        };
        words.push(word.to_string());
        rest = tail.trim_start();
    }
    Ok(words)
}

/// A chain name as our planner writes them.
fn chain_name(word: &str) -> Result<String, String> {
    let valid = !word.is_empty()
        && word.len() <= 28
        && !word.starts_with('-')
        && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if valid { Ok(word.to_string()) } else { Err(format!("bad chain name {word:?}")) }
}

fn protocol(word: &str) -> Result<Protocol, String> {
    match word {
        "tcp" => Ok(Protocol::Tcp),
        "udp" => Ok(Protocol::Udp),
        "sctp" => Ok(Protocol::Sctp),
        _ => Err(format!("unknown protocol {word:?}")),
    }
}

/// `0x4000` (as our planner writes marks) or decimal.
fn number(word: &str) -> Result<u32, String> {
    match word.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => word.parse(),
    }
    .map_err(|_| format!("bad number {word:?}"))
}

/// The words of a rule, consumed in order.
struct Words<'a> {
    words: &'a [String],
    at: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let word = self.words.get(self.at)?;
        self.at += 1;
        Some(word)
    }

    fn value(&mut self, option: &str) -> Result<&'a str, String> {
        self.next().ok_or_else(|| format!("{option} needs a value"))
    }

    fn peek(&self) -> Option<&'a str> {
        self.words.get(self.at).map(String::as_str)
    }

    /// Takes `word` if it comes next.
    fn take(&mut self, word: &str) -> bool {
        let here = self.peek() == Some(word);
        self.at += usize::from(here);
        here
    }

    fn expect(&mut self, word: &str) -> Result<(), String> {
        if self.take(word) { Ok(()) } else { Err(format!("expected {word}")) }
    }

    /// `!` before the next option.
    fn negation(&mut self) -> bool {
        self.take("!")
    }
}

/// The options of `-m MODULE`.
fn module(name: &str, words: &mut Words) -> Result<Match, String> {
    Ok(match name {
        "comment" => {
            words.expect("--comment")?;
            Match::Comment(words.value("--comment")?.to_string())
        }
        "tcp" | "udp" | "sctp" => {
            let protocol = protocol(name)?;
            let dport = if words.take("--dport") {
                let value = words.value("--dport")?;
                Some(value.parse().map_err(|_| format!("bad port {value:?}"))?)
            } else {
                None
            };
            Match::Port { protocol, dport }
        }
        "statistic" => {
            words.expect("--mode")?;
            words.expect("random")?;
            words.expect("--probability")?;
            let value = words.value("--probability")?;
            let probability: f64 = value.parse().map_err(|_| format!("bad probability {value:?}"))?;
            if !(0.0..=1.0).contains(&probability) {
                return Err(format!("probability {value} is not in 0..1"));
            }
            Match::Random { probability }
        }
        "recent" => {
            if words.take("--set") {
                words.expect("--name")?;
                return Ok(Match::RecentSet { name: chain_name(words.value("--name")?)? });
            }
            words.expect("--rcheck")?;
            let seconds = if words.take("--seconds") { Some(number(words.value("--seconds")?)?) } else { None };
            let reap = words.take("--reap");
            words.expect("--name")?;
            Match::RecentCheck { seconds, reap, name: chain_name(words.value("--name")?)? }
        }
        "addrtype" => {
            let source = if words.take("--src-type") {
                true
            } else {
                words.expect("--dst-type")?;
                false
            };
            words.expect("LOCAL")?;
            Match::LocalAddress { source }
        }
        "mark" => {
            let negated = words.negation();
            words.expect("--mark")?;
            let value = words.value("--mark")?;
            let (bits, mask) = value.split_once('/').ok_or_else(|| format!("bad mark {value:?}"))?;
            Match::Mark { negated, value: number(bits)?, mask: number(mask)? }
        }
        "conntrack" => {
            let negated = words.negation();
            words.expect("--ctstate")?;
            let value = words.value("--ctstate")?;
            let states = value
                .split(',')
                .map(|s| {
                    CtState::ALL.iter().find(|(_, n)| *n == s).map(|(st, _)| *st).ok_or(format!("bad state {s:?}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Match::CtState { negated, states }
        }
        _ => return Err(format!("unknown match module {name:?}")),
    })
}

/// The target after `-j`, with its options.
fn target(name: &str, words: &mut Words) -> Result<Target, String> {
    Ok(match name {
        "RETURN" => Target::Return,
        "ACCEPT" => Target::Accept,
        "DROP" => Target::Drop,
        "REJECT" => {
            let tcp_reset = words.take("--reject-with");
            if tcp_reset {
                words.expect("tcp-reset")?;
            }
            Target::Reject { tcp_reset }
        }
        "DNAT" => {
            words.expect("--to-destination")?;
            let value = words.value("--to-destination")?;
            Target::Dnat(value.parse().map_err(|_| format!("bad destination {value:?}"))?)
        }
        "MARK" => {
            if words.take("--or-mark") {
                Target::MarkOr(number(words.value("--or-mark")?)?)
            } else {
                words.expect("--xor-mark")?;
                Target::MarkXor(number(words.value("--xor-mark")?)?)
            }
        }
        "MASQUERADE" => {
            words.expect("--random-fully")?;
            Target::Masquerade
        }
        _ => Target::Chain(chain_name(name)?),
    })
}

/// The words of a rule after its chain.
fn rule(words: &[String]) -> Result<Rule, String> {
    let mut words = Words { words, at: 0 };
    let mut matches = Vec::new();
    let mut target_found = None;
    while let Some(word) = words.next() {
        if target_found.is_some() {
            return Err(format!("{word:?} after the target"));
        }
        let negated = word == "!";
        let option = if negated { words.value("!")? } else { word };
        let net = |words: &mut Words| -> Result<IpNet, String> {
            let value = words.value(option)?;
            value.parse().map_err(|_| format!("bad prefix {value:?}"))
        };
        match option {
            "-s" => matches.push(Match::Source { negated, net: net(&mut words)? }),
            "-d" => matches.push(Match::Destination { negated, net: net(&mut words)? }),
            _ if negated => return Err(format!("! before {option:?}")),
            "-p" => matches.push(Match::Protocol(protocol(words.value("-p")?)?)),
            "-m" => {
                let name = words.value("-m")?;
                matches.push(module(name, &mut words)?);
            }
            "-j" => {
                let name = words.value("-j")?;
                target_found = Some(target(name, &mut words)?);
            }
            _ => return Err(format!("unknown option {option:?}")),
        }
    }
    Ok(Rule { matches, target: target_found })
}

/// One line; `None` for a blank or comment line.
pub fn line(text: &str) -> Result<Option<Line>, String> {
    let text = text.trim_end();
    if text.trim_start().is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    if let Some(table) = text.strip_prefix('*') {
        return match table {
            "filter" | "nat" | "mangle" => Ok(Some(Line::Table(table.to_string()))),
            _ => Err(format!("unknown table {table:?}")),
        };
    }
    if text == "COMMIT" {
        return Ok(Some(Line::Commit));
    }
    if let Some(declaration) = text.strip_prefix(':') {
        let words = words(declaration)?;
        let [name, policy, counters] = &words[..] else { return Err("expected :CHAIN - [0:0]".into()) };
        if policy != "-" || counters != "[0:0]" {
            return Err("expected :CHAIN - [0:0]".into());
        }
        return Ok(Some(Line::Chain(chain_name(name)?)));
    }
    let words = words(text)?;
    let (command, chain, rest) = match &words[..] {
        [command, chain, rest @ ..] => (command.as_str(), chain_name(chain)?, rest),
        _ => return Err("expected a command and a chain".into()),
    };
    match command {
        "-A" => Ok(Some(Line::Append(chain, rule(rest)?))),
        "-I" => Ok(Some(Line::Insert(chain, rule(rest)?))),
        "-X" if rest.is_empty() => Ok(Some(Line::Delete(chain))),
        _ => Err(format!("unknown command {command:?}")),
    }
}

impl fmt::Display for Match {
    /// As our planner writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let not = |negated: bool| if negated { "! " } else { "" };
        match self {
            Match::Source { negated, net } => write!(f, "{}-s {net}", not(*negated)),
            Match::Destination { negated, net } => write!(f, "{}-d {net}", not(*negated)),
            Match::Protocol(protocol) => write!(f, "-p {}", protocol.as_str()),
            Match::Comment(text) => write!(f, "-m comment --comment \"{text}\""),
            Match::Port { protocol, dport: Some(port) } => write!(f, "-m {} --dport {port}", protocol.as_str()),
            Match::Port { protocol, dport: None } => write!(f, "-m {}", protocol.as_str()),
            Match::Random { probability } => write!(f, "-m statistic --mode random --probability {probability:.10}"),
            Match::RecentCheck { seconds, reap, name } => {
                write!(f, "-m recent --rcheck")?;
                if let Some(seconds) = seconds {
                    write!(f, " --seconds {seconds}")?;
                }
                if *reap {
                    write!(f, " --reap")?;
                }
                write!(f, " --name {name}")
            }
            Match::RecentSet { name } => write!(f, "-m recent --set --name {name}"),
            Match::LocalAddress { source: true } => write!(f, "-m addrtype --src-type LOCAL"),
            Match::LocalAddress { source: false } => write!(f, "-m addrtype --dst-type LOCAL"),
            Match::Mark { negated, value, mask } => write!(f, "-m mark {}--mark {value:#x}/{mask:#x}", not(*negated)),
            Match::CtState { negated, states } => {
                let states: Vec<&str> = states.iter().map(|s| s.name()).collect();
                write!(f, "-m conntrack {}--ctstate {}", not(*negated), states.join(","))
            }
        }
    }
}

impl fmt::Display for Target {
    /// As our planner writes it, after `-j `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Chain(chain) => write!(f, "{chain}"),
            Target::Return => write!(f, "RETURN"),
            Target::Accept => write!(f, "ACCEPT"),
            Target::Drop => write!(f, "DROP"),
            Target::Reject { tcp_reset: true } => write!(f, "REJECT --reject-with tcp-reset"),
            Target::Reject { tcp_reset: false } => write!(f, "REJECT"),
            Target::Dnat(to) => write!(f, "DNAT --to-destination {to}"),
            Target::MarkOr(value) => write!(f, "MARK --or-mark {value:#x}"),
            Target::MarkXor(value) => write!(f, "MARK --xor-mark {value:#x}"),
            Target::Masquerade => write!(f, "MASQUERADE --random-fully"),
        }
    }
}

impl fmt::Display for Rule {
    /// The rule's words after its chain, as our planner writes them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words: Vec<String> = self.matches.iter().map(ToString::to_string).collect();
        if let Some(target) = &self.target {
            words.push(format!("-j {target}"));
        }
        write!(f, "{}", words.join(" "))
    }
}

/// ` RULE`, or nothing for a rule without words.
pub(super) fn spaced(rule: &Rule) -> String {
    if rule.matches.is_empty() && rule.target.is_none() { String::new() } else { format!(" {rule}") }
}

impl fmt::Display for Line {
    /// The line as our planner writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Table(table) => write!(f, "*{table}"),
            Line::Chain(chain) => write!(f, ":{chain} - [0:0]"),
            Line::Append(chain, rule) => write!(f, "-A {chain}{}", spaced(rule)),
            Line::Insert(chain, rule) => write!(f, "-I {chain}{}", spaced(rule)),
            Line::Delete(chain) => write!(f, "-X {chain}"),
            Line::Commit => write!(f, "COMMIT"),
        }
    }
}
