//! The walk both backends share: the hooks of a packet's path, the base chains of each hook,
//! `jump`/`goto`/`return` over a call stack, NAT once per connection and kind, marks, and a
//! branch at every random match. A backend ([`Model`]) only says which base chains a hook has and
//! what one rule does to a packet.

use std::net::{IpAddr, SocketAddr};

use super::{
    Branch, Delivery, Effect, Entry, Environment, Error, Leave, MAX_DEPTH, MAX_RULES, Masquerade, Packet, Path,
    RuleRef, Step, Trace, Verdict, Via,
};
use crate::nft::rule::HookPoint;
use crate::table::{IpFamily, Protocol};

/// A base chain of a hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BaseChain {
    /// Its table.
    pub table: String,
    /// Its name.
    pub chain: String,
    /// Its type, hook and priority, as listings show them.
    pub hook: String,
    /// A nat chain: consulted only until the connection's NAT of the hook's kind is set up.
    pub nat: bool,
}

/// What evaluating one rule gives.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Evaluation {
    /// A condition does not hold (or a lookup found nothing).
    NoMatch,
    /// Every other condition holds; a random one holds with this probability.
    Chance(f64),
    /// Every condition holds, and the rule picks one of this many outcomes at random (`numgen
    /// random mod n` as a key): evaluate it again with each [`Outcome::Pick`].
    Pick(u32),
    /// Every condition holds, and the rule picks outcome `i` with a chance of weight `i` over the
    /// sum of the weights (IPVS's schedulers): evaluate it again with each [`Outcome::Pick`].
    Weighted(Vec<f64>),
    /// It matched: the element its lookup found, and what it does (a verdict last).
    Match {
        /// The set or map element found.
        element: Option<String>,
        /// Its effects, in order.
        effects: Vec<Effect>,
    },
}

impl Evaluation {
    /// A match without lookup.
    pub(super) fn effects(effects: Vec<Effect>) -> Evaluation {
        Evaluation::Match { element: None, effects }
    }
}

/// The outcome the engine chose for a rule's random part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Whether the random match of an [`Evaluation::Chance`] holds.
    Chance(bool),
    /// The number an [`Evaluation::Pick`] picked, below its modulus.
    Pick(u32),
}

/// The packet as the rules see it at some point of its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PacketState {
    /// Its family.
    pub family: IpFamily,
    /// Its source.
    pub source: IpAddr,
    /// Its destination, DNATed or not.
    pub destination: SocketAddr,
    /// Its protocol.
    pub protocol: Protocol,
    /// Its mark.
    pub mark: u32,
    /// Its destination was DNATed (conntrack state `DNAT`).
    pub dnat: bool,
    /// Its source was masqueraded (conntrack state `SNAT`).
    pub snat: bool,
}

/// One backend's rules, as the engine asks about them.
pub(super) trait Model {
    /// A rule.
    type Rule;
    /// `nftables` or `iptables`.
    const BACKEND: &'static str;
    /// The base chains of `family` at `hook`, in the order the kernel runs them.
    fn base_chains(&self, family: IpFamily, hook: HookPoint) -> Vec<BaseChain>;
    /// The rules of a chain; `None` when there is no such chain.
    fn rules(&self, family: IpFamily, table: &str, chain: &str) -> Option<&[Self::Rule]>;
    /// A rule as listings show it.
    fn text(&self, chain: &str, rule: &Self::Rule) -> String;
    /// What `rule` (of `table`) does to `packet`; `random` is the outcome of its random part,
    /// once the engine has chosen it after an [`Evaluation::Chance`] or [`Evaluation::Pick`].
    fn evaluate(
        &self,
        table: &str,
        rule: &Self::Rule,
        packet: &PacketState,
        env: &Environment,
        random: Option<Outcome>,
    ) -> Result<Evaluation, Error>;
}

/// Every path of `packet` through `model`'s rules.
pub(super) fn trace<M: Model>(model: &M, packet: &Packet, env: &Environment) -> Result<Trace, Error> {
    let family = IpFamily::of(&packet.source);
    if family != IpFamily::of(&packet.destination.ip()) {
        return Err(Error::MixedFamilies { from: packet.source, to: packet.destination });
    }
    let state = PacketState {
        family,
        source: packet.source,
        destination: packet.destination,
        protocol: packet.protocol,
        mark: 0,
        dnat: false,
        snat: false,
    };
    let mut pending = vec![Walker::new(packet.entry.netfilter(), state)];
    let mut paths: Vec<Option<Path>> = vec![None];
    let mut budget = MAX_RULES;
    while let Some(mut walker) = pending.pop() {
        let mut spawned = Vec::new();
        let path = walker.run(model, env, &mut budget, &mut spawned)?;
        paths[walker.id] = Some(path);
        for mut child in spawned.into_iter().rev() {
            child.id = paths.len();
            paths.push(None);
            pending.push(child);
        }
    }
    let paths = paths.into_iter().map(|p| p.expect("every path is walked")).collect();
    Ok(Trace { backend: M::BACKEND, packet: packet.clone(), paths })
}

/// Where the walk is on the packet's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before the first hook.
    Start,
    /// At a hook.
    At(HookPoint),
    /// At a hook again, on a host packet's way back in through loopback.
    Looped(HookPoint),
}

/// A chain being evaluated.
#[derive(Debug, Clone)]
struct Frame {
    table: String,
    chain: String,
    /// The next rule.
    index: usize,
    /// The rules that led here from the base chain.
    trail: Vec<RuleRef>,
}

/// One path being walked.
#[derive(Debug, Clone)]
struct Walker {
    id: usize,
    entry: Entry,
    packet: PacketState,
    probability: f64,
    branch: Option<Branch>,
    stage: Stage,
    bases: Vec<BaseChain>,
    next_base: usize,
    stack: Vec<Frame>,
    /// The outcome chosen for the random part of the rule about to be evaluated, and its chance.
    random: Option<(Outcome, f64)>,
    /// The connection's destination NAT is set up (DNAT, or the null binding of a nat hook).
    nat_dst: bool,
    /// Its source NAT is.
    nat_src: bool,
    /// The rules that last set new mark bits.
    marked_by: Vec<RuleRef>,
    masquerade: Option<Masquerade>,
    dnat: Option<SocketAddr>,
    affinity: Vec<String>,
    steps: Vec<Step>,
}

/// True at the hooks whose nat chains set up destination NAT (the others: source NAT).
fn destination_nat(hook: HookPoint) -> bool {
    matches!(hook, HookPoint::Prerouting | HookPoint::Output)
}

impl Walker {
    fn new(entry: Entry, packet: PacketState) -> Walker {
        Walker {
            id: 0,
            entry,
            packet,
            probability: 1.0,
            branch: None,
            stage: Stage::Start,
            bases: Vec::new(),
            next_base: 0,
            stack: Vec::new(),
            random: None,
            nat_dst: false,
            nat_src: false,
            marked_by: Vec::new(),
            masquerade: None,
            dnat: None,
            affinity: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// The hook the walk is at.
    fn hook(&self) -> Option<HookPoint> {
        match self.stage {
            Stage::Start => None,
            Stage::At(hook) | Stage::Looped(hook) => Some(hook),
        }
    }

    fn nat_done(&self, hook: HookPoint) -> bool {
        if destination_nat(hook) { self.nat_dst } else { self.nat_src }
    }

    /// A copy that takes the other outcome of a random choice from here on, with no steps of
    /// its own yet.
    fn branch(&mut self) -> Walker {
        let steps = std::mem::take(&mut self.steps);
        let mut child = self.clone();
        child.branch = Some(Branch { path: self.id, step: steps.len() });
        self.steps = steps;
        child
    }

    /// Leaves the current hook for the next one of the packet's path (recording the routing
    /// decision where one is made), or says where the packet went when its path is over.
    fn advance(&mut self, env: &Environment) -> Result<HookPoint, Delivery> {
        let local = env.is_local(self.packet.destination.ip());
        let delivery = if local { Delivery::Local } else { Delivery::Forwarded };
        let mut route = || self.steps.push(Step::Route { to: delivery, destination: self.packet.destination });
        let next = match (self.entry, self.stage) {
            (Entry::Received, Stage::Start) => Stage::At(HookPoint::Prerouting),
            (Entry::Host, Stage::Start) => Stage::At(HookPoint::Output),
            (Entry::Received, Stage::At(HookPoint::Prerouting)) => {
                route();
                Stage::At(if local { HookPoint::Input } else { HookPoint::Forward })
            }
            (Entry::Host, Stage::At(HookPoint::Output)) => {
                route();
                Stage::At(HookPoint::Postrouting)
            }
            (_, Stage::At(HookPoint::Forward)) => Stage::At(HookPoint::Postrouting),
            (Entry::Host, Stage::At(HookPoint::Postrouting)) if local => Stage::Looped(HookPoint::Prerouting),
            (_, Stage::Looped(HookPoint::Prerouting)) => Stage::Looped(HookPoint::Input),
            // Rewritten at input to an address that is not local (IPVS at LOCAL_IN): sent on
            // through output and postrouting.
            (Entry::Received, Stage::At(HookPoint::Input)) if !local => {
                route();
                Stage::At(HookPoint::Output)
            }
            (Entry::Received, Stage::At(HookPoint::Output)) => Stage::At(HookPoint::Postrouting),
            (_, Stage::At(HookPoint::Input) | Stage::Looped(HookPoint::Input)) => return Err(Delivery::Local),
            // Postrouting (the other stages do not occur on these paths).
            _ => return Err(Delivery::Forwarded),
        };
        self.stage = next;
        Ok(self.hook().expect("a hook"))
    }

    /// The path, ended by `verdict`.
    fn finish(&mut self, verdict: Verdict) -> Path {
        Path {
            probability: self.probability,
            branch: self.branch,
            steps: std::mem::take(&mut self.steps),
            verdict,
            dnat: self.dnat,
            masquerade: self.masquerade.take(),
            affinity: std::mem::take(&mut self.affinity),
        }
    }

    /// Walks until the path ends, pushing the other outcome of each random choice to `spawned`.
    fn run<M: Model>(
        &mut self,
        model: &M,
        env: &Environment,
        budget: &mut usize,
        spawned: &mut Vec<Walker>,
    ) -> Result<Path, Error> {
        loop {
            if self.stack.is_empty() {
                if let Some(base) = self.bases.get(self.next_base).cloned() {
                    self.next_base += 1;
                    let hook = self.hook().expect("base chains belong to a hook");
                    if base.nat && self.nat_done(hook) {
                        self.steps.push(Step::SkipNat { table: base.table, chain: base.chain });
                        continue;
                    }
                    let via = Via::Hook { hook: base.hook };
                    self.steps.push(Step::Enter { table: base.table.clone(), chain: base.chain.clone(), via });
                    self.stack.push(Frame { table: base.table, chain: base.chain, index: 0, trail: Vec::new() });
                    continue;
                }
                // The hook is over: a nat hook that set nothing up gives the null binding.
                if let Some(hook) = self.hook()
                    && self.bases.iter().any(|b| b.nat)
                {
                    if destination_nat(hook) { self.nat_dst = true } else { self.nat_src = true }
                }
                match self.advance(env) {
                    Ok(hook) => {
                        self.steps.push(Step::Hook { hook });
                        self.bases = model.base_chains(self.packet.family, hook);
                        self.next_base = 0;
                    }
                    Err(delivery) => return Ok(self.finish(Verdict::Accepted { delivery })),
                }
                continue;
            }
            if let Some(verdict) = self.step(model, env, budget, spawned)? {
                return Ok(self.finish(verdict));
            }
        }
    }

    /// Decides a rule's pick of one of `weights.len()` outcomes, each with a chance of its weight
    /// over their sum: this walker takes the first, a branch each other; the rule is then
    /// evaluated again with that outcome.
    fn pick(&mut self, weights: &[f64], budget: &mut usize, spawned: &mut Vec<Walker>) {
        let sum: f64 = weights.iter().sum();
        let chance = |i: usize| if sum > 0.0 { weights[i] / sum } else { 1.0 / weights.len() as f64 };
        for i in 1..weights.len() {
            let mut other = self.branch();
            other.random = Some((Outcome::Pick(i as u32), chance(i)));
            other.probability *= chance(i);
            spawned.push(other);
        }
        self.random = Some((Outcome::Pick(0), chance(0)));
        self.probability *= chance(0);
        *budget += 1;
    }

    /// Evaluates the next rule of the current chain (or leaves the chain at its end); a verdict
    /// when the path ends there.
    fn step<M: Model>(
        &mut self,
        model: &M,
        env: &Environment,
        budget: &mut usize,
        spawned: &mut Vec<Walker>,
    ) -> Result<Option<Verdict>, Error> {
        let family = self.packet.family;
        let frame = self.stack.last().expect("a chain is being evaluated");
        let (table, chain, index) = (frame.table.clone(), frame.chain.clone(), frame.index);
        let rules = model.rules(family, &table, &chain).ok_or_else(|| Error::NoSuchChain {
            table: table.clone(),
            from: chain.clone(),
            chain: chain.clone(),
        })?;
        let Some(rule) = rules.get(index) else {
            self.stack.pop();
            let how = if self.stack.is_empty() { Leave::Policy } else { Leave::Return };
            self.steps.push(Step::Leave { table, chain, how });
            return Ok(None);
        };
        *budget = budget.checked_sub(1).ok_or(Error::TooLong)?;
        let chosen = self.random.take();
        let evaluation = model.evaluate(&table, rule, &self.packet, env, chosen.map(|(outcome, _)| outcome))?;
        let (element, effects) = match evaluation {
            Evaluation::Chance(p) => {
                // Decide the random match, then evaluate the rule again with that outcome.
                if p >= 1.0 || p <= 0.0 {
                    self.random = Some((Outcome::Chance(p >= 1.0), p));
                } else {
                    let mut other = self.branch();
                    other.random = Some((Outcome::Chance(false), 1.0 - p));
                    other.probability *= 1.0 - p;
                    spawned.push(other);
                    self.random = Some((Outcome::Chance(true), p));
                    self.probability *= p;
                }
                *budget += 1;
                return Ok(None);
            }
            Evaluation::Pick(n) => {
                self.pick(&vec![1.0; n.max(1) as usize], budget, spawned);
                return Ok(None);
            }
            Evaluation::Weighted(weights) => {
                self.pick(&weights, budget, spawned);
                return Ok(None);
            }
            Evaluation::NoMatch => (None, None),
            Evaluation::Match { element, effects } => (element, Some(effects)),
        };
        let text = model.text(&chain, rule);
        let this = RuleRef { table: table.clone(), chain: chain.clone(), rule: text.clone() };
        let trail = {
            let frame = self.stack.last_mut().expect("the rule's chain");
            frame.index += 1;
            frame.trail.clone()
        };
        self.steps.push(Step::Rule {
            table: table.clone(),
            chain: chain.clone(),
            index,
            rule: text,
            matched: effects.is_some(),
            element,
            chance: chosen.map(|(_, p)| p),
            effects: effects.clone().unwrap_or_default(),
        });
        for effect in effects.into_iter().flatten() {
            match effect {
                Effect::Mark { mark } => {
                    if mark & !self.packet.mark != 0 {
                        self.marked_by = trail.iter().cloned().chain([this.clone()]).collect();
                    }
                    self.packet.mark = mark;
                }
                Effect::Affinity { set } => self.affinity.push(set),
                // eBPF mode's socket programs': no rule has it.
                Effect::Connect { .. } => {}
                Effect::Dnat { to } => {
                    self.packet.destination = to;
                    self.packet.dnat = true;
                    self.dnat = Some(to);
                    self.nat_dst = true;
                    self.stack.clear();
                }
                Effect::Masquerade => {
                    self.packet.snat = true;
                    self.nat_src = true;
                    let marked_by = std::mem::take(&mut self.marked_by);
                    self.masquerade = Some(Masquerade { marked_by, by: this.clone() });
                    self.stack.clear();
                }
                Effect::Jump { chain: ref target } | Effect::Goto { chain: ref target } => {
                    let goto = matches!(effect, Effect::Goto { .. });
                    let target = target.clone();
                    if model.rules(family, &table, &target).is_none() {
                        return Err(Error::NoSuchChain { table, from: chain, chain: target });
                    }
                    if goto {
                        self.stack.pop();
                    }
                    if self.stack.len() >= MAX_DEPTH {
                        return Err(Error::TooDeep { chain: target });
                    }
                    let trail = trail.iter().cloned().chain([this.clone()]).collect();
                    let via = if goto { Via::Goto } else { Via::Jump };
                    self.steps.push(Step::Enter { table: table.clone(), chain: target.clone(), via });
                    self.stack.push(Frame { table: table.clone(), chain: target, index: 0, trail });
                }
                Effect::Return => {
                    self.stack.pop();
                    let how = if self.stack.is_empty() { Leave::Policy } else { Leave::Return };
                    self.steps.push(Step::Leave { table: table.clone(), chain: chain.clone(), how });
                }
                Effect::Accept => self.stack.clear(),
                Effect::Drop => return Ok(Some(Verdict::Dropped { by: this })),
                Effect::Reject { with } => return Ok(Some(Verdict::Rejected { by: this, with })),
            }
        }
        Ok(None)
    }
}
