//! IPVS mode as the kernel holds it after a full sync, and how a packet goes through it: the
//! helper tables (`ip/ip6 roadkeeper-ipvs`, applied from the very `nft -f` scripts the proxy
//! sends, see `script`) evaluated as nf_tables does, and the IPVS stage where the kernel hooks
//! it: `LOCAL_IN` at priority 99 for packets to a local address (after the filter chains and the
//! nat prerouting ones; a scheduled packet is then sent on through `LOCAL_OUT` and
//! `POSTROUTING`), `LOCAL_OUT` at priority -98 for the host's own packets (after the nat output
//! chain at -100). Every address of `kube-ipvs0` is local.
//!
//! The IPVS stage takes the first packet of a connection whose protocol, destination address
//! and port are a virtual server's, and NATs it to one of its real servers of weight > 0 (none:
//! IPVS drops it). Which one:
//! - `rr`, `wrr`, `lc`, `wlc`, `sed`, `nq`, `lblc`, `lblcr`, `mh`, `dh`: each one, with
//!   probability weight / sum of weights. The tracer knows no connection counts nor the history
//!   of earlier connections, so the connection-counting and locality schedulers are modelled as
//!   "any of them", as round robin is over many connections (their step says so); `mh` keeps
//!   one client on one real server, `dh` every client of the virtual server, which one the
//!   tracer does not compute (their step says so too);
//! - `sh` (source hashing): one of them, always the same for one client address; which one
//!   depends on the kernel's 256-bucket table, whose order is the order real servers were added
//!   to the service, so the tracer does not claim one: its step says so, and each real server is
//!   a possible landing with its share of the buckets (weight / sum);
//! - with persistence (ClientIP session affinity), a client whose template the [`Environment`]
//!   names ([`persistence_entry`]) lands on that real server, if it still has weight; others as
//!   the scheduler picks, creating the template.

mod script;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::engine::{self, BaseChain, Evaluation, Model, Outcome, PacketState};
use super::{Effect, Environment, Error, Packet, Trace};
use crate::ipvs::{IpvsPlan, IpvsTable, RealServer, Scheduler, VirtualKey};
use crate::nft::rule::HookPoint;
use crate::table::{IpFamily, Protocol};

/// How the IPVS stage is named in traces (its "table").
pub const IPVS: &str = "IPVS";

/// IPVS mode's rules: the helper tables and the IPVS table.
#[derive(Debug, Clone)]
pub struct Tables {
    helpers: script::Tables,
    ipvs: IpvsTable,
    /// The IPVS stage's one rule.
    stage: [script::Rule; 1],
}

/// The entry of [`Environment::affinity`] saying the packet's source holds a persistence
/// template of virtual server `key` for real server `real`.
pub fn persistence_entry(key: &VirtualKey, real: &RealServer) -> String {
    format!("persistence {} {key} -> {real}", key.protocol.as_str().to_ascii_uppercase())
}

/// The virtual server as `ipvsadm -Ln` heads it: `TCP  10.96.0.10:80 rr persistent 10800`.
fn virtual_server_text(key: &VirtualKey, scheduler: Scheduler, persistence: Option<u32>) -> String {
    let mut text = format!("{} {key} {scheduler}", key.protocol.as_str().to_ascii_uppercase());
    if let Some(timeout) = persistence {
        text.push_str(&format!(" persistent {timeout}"));
    }
    text
}

/// What the trace says of a scheduler's choice beyond "each with its share of the weights".
fn scheduler_note(scheduler: Scheduler) -> Option<&'static str> {
    use Scheduler as S;
    Some(match scheduler {
        S::RoundRobin | S::WeightedRoundRobin => return None,
        S::SourceHashing => {
            "source hashing: this client always lands on the same one of these; which one depends on the kernel's \
             bucket table and is not computed"
        }
        S::MaglevHashing => {
            "maglev hashing of the source: this client always lands on the same one of these; which one is not \
             computed"
        }
        S::DestinationHashing => {
            "destination hashing: every client of this virtual server lands on the same one of these; which one \
             is not computed"
        }
        S::LeastConnection
        | S::WeightedLeastConnection
        | S::LocalityLeastConnection
        | S::LocalityLeastConnectionReplicated
        | S::ShortestExpectedDelay
        | S::NeverQueue => "picked by connection counts, which the tracer does not know: any of these",
    })
}

/// What the fuzz target (`crates/rules/fuzz`, target `ipvs_script`) checks for any input: no
/// panic; applied as a helper script over an empty IPVS table, or over one planned Service's
/// helper tables, it is taken whole or refused with an error, and what it leaves traces a few
/// packets to paths whose probabilities add up to 1, or to a bounded error.
pub fn check(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else { return };
    let mut tables =
        Tables { helpers: script::Tables::default(), ipvs: Default::default(), stage: [script::Rule::VirtualServer] };
    if tables.apply_helpers(text).is_err() {
        return;
    }
    super::check_probes(
        &[
            (super::Entry::Received, "10.244.0.10", "10.96.0.10:80"),
            (super::Entry::Received, "192.168.77.1", "192.168.77.2:30080"),
            (super::Entry::Host, "192.168.77.2", "10.96.0.10:80"),
        ],
        |packet, env| tables.trace(packet, env),
    );
}

impl Tables {
    /// What a full sync of `plan` leaves: the helper script of each family applied to empty
    /// tables, and the IPVS table.
    pub fn of(plan: &IpvsPlan) -> Result<Tables, Error> {
        let mut tables = Tables {
            helpers: script::Tables::default(),
            ipvs: plan.table.clone(),
            stage: [script::Rule::VirtualServer],
        };
        for family in [IpFamily::V4, IpFamily::V6] {
            tables.apply_helpers(&plan.helpers.script(family))?;
        }
        Ok(tables)
    }

    /// Applies an `nft -f` script to the helper tables: all of it, or (refused, or outside the
    /// grammar the proxy writes) none of it.
    pub fn apply_helpers(&mut self, script: &str) -> Result<(), Error> {
        self.helpers.apply(script)
    }

    /// Every way `packet` can go through these rules (the addresses of `kube-ipvs0` are local).
    pub fn trace(&self, packet: &Packet, env: &Environment) -> Result<Trace, Error> {
        let mut env = env.clone();
        env.local_addresses.extend(self.ipvs.addresses.iter().copied());
        engine::trace(self, packet, &env)
    }

    /// The persistence templates ([`persistence_entry`]) of the virtual servers of `protocol`
    /// that have `endpoint` as a real server.
    pub fn affinity_sets(&self, protocol: Protocol, endpoint: SocketAddr) -> BTreeSet<String> {
        let real = RealServer { address: endpoint.ip(), port: endpoint.port() };
        self.ipvs
            .virtual_servers
            .iter()
            .filter(|(key, server)| {
                key.protocol == protocol && server.persistence.is_some() && server.real_servers.contains_key(&real)
            })
            .map(|(key, _)| persistence_entry(key, &real))
            .collect()
    }

    /// What the IPVS stage does to `packet`.
    fn schedule(&self, packet: &PacketState, env: &Environment, random: Option<Outcome>) -> Evaluation {
        let destination = packet.destination;
        let key = VirtualKey { protocol: packet.protocol, address: destination.ip(), port: destination.port() };
        // Virtual servers are on local addresses: a packet IPVS sent on to a real server (not
        // local) is not scheduled again, as the kernel skips the packets it made itself.
        let Some(server) = self.ipvs.virtual_servers.get(&key).filter(|_| env.is_local(destination.ip())) else {
            return Evaluation::NoMatch;
        };
        let mut element = virtual_server_text(&key, server.scheduler, server.persistence);
        let live: Vec<(&RealServer, u32)> =
            server.real_servers.iter().filter(|(_, weight)| **weight > 0).map(|(r, w)| (r, *w)).collect();
        if live.is_empty() {
            element.push_str(", no real server of weight > 0");
            return Evaluation::Match { element: Some(element), effects: vec![Effect::Drop] };
        }
        let pinned = server
            .persistence
            .and_then(|_| live.iter().position(|(real, _)| env.affinity.contains(&persistence_entry(&key, real))));
        let chosen = match (pinned, random) {
            (Some(index), _) => {
                element.push_str(", this client's persistence template");
                index
            }
            (None, _) if live.len() == 1 => 0,
            (None, Some(Outcome::Pick(index))) => index as usize,
            (None, _) => return Evaluation::Weighted(live.iter().map(|(_, w)| f64::from(*w)).collect()),
        };
        if let (None, Some(note)) = (pinned, scheduler_note(server.scheduler)) {
            element.push_str(", ");
            element.push_str(note);
        }
        let (real, _) = live[chosen];
        let mut effects = Vec::new();
        if server.persistence.is_some() {
            effects.push(Effect::Affinity { set: persistence_entry(&key, real) });
        }
        effects.push(Effect::Dnat { to: SocketAddr::new(real.address, real.port) });
        Evaluation::Match { element: Some(element), effects }
    }
}

impl Model for Tables {
    type Rule = script::Rule;
    const BACKEND: &'static str = "ipvs";

    fn base_chains(&self, family: IpFamily, hook: HookPoint) -> Vec<BaseChain> {
        let mut bases = self.helpers.base_chains(family, hook);
        let stage = match hook {
            HookPoint::Input => Some(("LOCAL_IN", 99)),
            HookPoint::Output => Some(("LOCAL_OUT", -98)),
            _ => None,
        };
        if let Some((chain, priority)) = stage {
            let hook = format!("ip_vs hook {} priority {priority}", format!("{hook:?}").to_lowercase());
            bases.push((priority, BaseChain { table: IPVS.into(), chain: chain.into(), hook, nat: false }));
        }
        bases.sort_by(|a, b| (a.0, &a.1.table, &a.1.chain).cmp(&(b.0, &b.1.table, &b.1.chain)));
        bases.into_iter().map(|(_, base)| base).collect()
    }

    fn rules(&self, _family: IpFamily, table: &str, chain: &str) -> Option<&[script::Rule]> {
        if table == IPVS {
            return Some(&self.stage);
        }
        self.helpers.rules(table, chain)
    }

    fn text(&self, _chain: &str, rule: &script::Rule) -> String {
        rule.text().to_string()
    }

    fn evaluate(
        &self,
        table: &str,
        rule: &script::Rule,
        packet: &PacketState,
        env: &Environment,
        random: Option<Outcome>,
    ) -> Result<Evaluation, Error> {
        match rule {
            script::Rule::VirtualServer => Ok(self.schedule(packet, env, random)),
            script::Rule::Nft(_) => self.helpers.evaluate(table, rule, packet),
        }
    }
}

#[cfg(test)]
mod tests;
