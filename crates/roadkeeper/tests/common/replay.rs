//! The tracer replays the real probes (issue 12: "both must agree"). Whenever a proxy run has
//! programmed the kernel ([`Replay::programmed`]), the harness plans the same cluster state with
//! the same flags in-process (the manifest folder read with `roadkeeper_cluster`, planned with
//! `roadkeeper_rules`, checked to be byte for byte what `roadkeeper rules` prints) and models the
//! rules with the tracer; after every probe that goes through [`super::probe`], [`check`] traces
//! the same packet and asserts the real outcome is one the tracer predicts: a reply from an
//! endpoint a path DNATs to, masqueraded exactly when that path is; refused when every path is
//! rejected; a timeout when every path is dropped. Every backend, both families, TCP and UDP.
//!
//! What is not replayed, and why (counted and printed per cluster, never silently):
//! - a cluster whose state lives in an API server (EndpointSlices come from its controller);
//! - a watching proxy once the manifests changed, or our rules were wiped (the kernel follows
//!   the change at a moment the harness does not know); after a failed run or `cleanup`, or
//!   while a Service is refused (`roadkeeper rules` fails);
//! - probes that do not go through [`super::probe`]: `proxy_conntrack.rs` keeps one UDP flow,
//!   which follows its conntrack entry (established flows are not modelled by the tracer).
//!
//! Not modelled, so only loosely checked: a packet the rules deliver to the node itself without
//! DNAT (the node's sockets answer: refused, as nothing listens there) or let out unchanged (no
//! echo server answers: no reply).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use roadkeeper_cluster::ManifestSource;
use roadkeeper_netlab::{Netns, ProbeResult};
use roadkeeper_rules::config::{NodePortAddresses, ProxyConfig, ProxyMode, parse_cidrs};
use roadkeeper_rules::nft::transaction::script;
use roadkeeper_rules::plan::{NodePlan, service_cidrs};
use roadkeeper_rules::table::{IpFamily, Protocol};
use roadkeeper_rules::trace::{Delivery, Entry, Environment, Fate, Packet, Ruleset, Trace};

use super::{Cluster, Proto};

/// Where probes from a namespace come from.
#[derive(Debug, Clone, Copy)]
pub enum Origin {
    /// A pod (or the client) with its addresses: received by the node on its bridge.
    Pod(IpAddr, IpAddr),
    /// The node itself: sent by a host process, from the address the kernel picks.
    Node,
    /// The external host with its addresses: received on the uplink.
    External(IpAddr, IpAddr),
}

/// The rules of the last proxy run, modelled.
struct Snapshot {
    ruleset: Ruleset,
    env: Environment,
}

/// Whether probes can be replayed now.
enum State {
    /// They can, against this snapshot; `watching` while a proxy follows the manifests.
    Ready { snapshot: Box<Snapshot>, watching: bool },
    /// They cannot, for this reason.
    Not(&'static str),
}

/// One cluster's replay: the rules, the affinity entries real probes left, and counts.
pub struct Replay {
    state: State,
    /// `(source, protocol, entry)` of every affinity entry a replayed probe added.
    pinned: BTreeSet<(IpAddr, Protocol, String)>,
    replayed: usize,
    skipped: BTreeMap<&'static str, usize>,
    label: String,
}

/// A cluster's replay, shared with the registry of its namespaces.
pub type Handle = Arc<Mutex<Replay>>;

/// A namespace's cluster (while its replay lives) and where its probes come from.
type Registered = (Weak<Mutex<Replay>>, Origin);

/// Namespace name -> its cluster's replay and where its probes come from.
static REGISTRY: Mutex<BTreeMap<String, Registered>> = Mutex::new(BTreeMap::new());

/// A replay for a new cluster (nothing programmed yet).
pub fn new(label: &str) -> Handle {
    Arc::new(Mutex::new(Replay {
        state: State::Not("no proxy run yet"),
        pinned: BTreeSet::new(),
        replayed: 0,
        skipped: BTreeMap::new(),
        label: label.to_string(),
    }))
}

/// Makes probes from `ns` replayable against `replay`.
pub fn register(replay: &Handle, ns: &Netns, origin: Origin) {
    REGISTRY.lock().expect("registry").insert(ns.name().to_string(), (Arc::downgrade(replay), origin));
}

fn lock(replay: &Handle) -> std::sync::MutexGuard<'_, Replay> {
    replay.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Replay {
    /// A proxy run with `args` (`proxy ...`) programmed the kernel of `cluster`: model its rules;
    /// `watching` for a proxy that goes on following the manifests.
    pub fn programmed(replay: &Handle, cluster: &Cluster, args: &[String], watching: bool) {
        let state = match snapshot(cluster, args) {
            Ok(snapshot) => State::Ready { snapshot: Box::new(snapshot), watching },
            Err(why) => State::Not(why),
        };
        lock(replay).state = state;
    }

    /// Probes cannot be replayed from now on, for `why`.
    pub fn invalidate(replay: &Handle, why: &'static str) {
        lock(replay).state = State::Not(why);
    }

    /// The manifests changed: a watching proxy follows at a moment nobody knows.
    pub fn manifests_changed(replay: &Handle) {
        let mut replay = lock(replay);
        if matches!(replay.state, State::Ready { watching: true, .. }) {
            replay.state = State::Not("the manifests changed under a watching proxy");
        }
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        let skipped: Vec<String> = self.skipped.iter().map(|(why, n)| format!("{n} ({why})")).collect();
        eprintln!(
            "replay {}: {} probes replayed through the tracer; not replayed: {}",
            self.label,
            self.replayed,
            if skipped.is_empty() { "none".to_string() } else { skipped.join(", ") }
        );
    }
}

/// The flags of `roadkeeper proxy` the harness passes that take a value.
const WITH_VALUE: [&str; 14] = [
    "--manifests",
    "--kubeconfig",
    "--hostname-override",
    "--proxy-mode",
    "--cluster-cidr",
    "--nodeport-addresses",
    "--config",
    "--healthz-bind-address",
    "--metrics-bind-address",
    "--cgroup-root",
    "--bpf-root",
    "--bpf-devices",
    "--bpf-lb-map-max",
    "--bpf-lb-maglev-table-size",
];

/// The proxy's configuration and manifest folder from its arguments, as `roadkeeper proxy`
/// reads them (the config file first, then the flags); `Err` when the state is not in a folder.
/// [`snapshot`] checks the outcome against `roadkeeper rules`.
fn config(args: &[String]) -> Result<(ProxyConfig, PathBuf), &'static str> {
    let mut flags: Vec<(&str, Option<&str>)> = Vec::new();
    let mut words = args.iter().map(String::as_str);
    while let Some(word) = words.next() {
        let (flag, inline) = word.split_once('=').map_or((word, None), |(flag, value)| (flag, Some(value)));
        // Every `--conntrack-*` flag takes a value but the boolean `--conntrack-tcp-be-liberal`.
        let takes_value =
            WITH_VALUE.contains(&flag) || (flag.starts_with("--conntrack-") && flag != "--conntrack-tcp-be-liberal");
        let value = if inline.is_none() && takes_value { words.next() } else { inline };
        flags.push((flag, value));
    }
    let mut cfg = ProxyConfig::default();
    if let Some((_, Some(file))) = flags.iter().find(|(flag, _)| *flag == "--config") {
        let mode_flag = flags.iter().find(|(flag, _)| *flag == "--proxy-mode").and_then(|(_, mode)| *mode);
        let mode_flag = mode_flag.map(|mode| mode.parse::<ProxyMode>().expect("--proxy-mode"));
        cfg.apply_file(std::path::Path::new(file), mode_flag).expect("the config file");
    }
    let mut dir = None;
    for (flag, given) in flags {
        let value = || given.unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag {
            "proxy" | "rules" | "--once" | "-v" | "--config" | "--healthz-bind-address" | "--metrics-bind-address" => {}
            "--kubeconfig" => return Err("the cluster state lives in an API server"),
            // Where eBPF mode's programs attach and pin: no part of what they translate.
            "--cgroup-root" | "--bpf-root" | "--bpf-devices" => {}
            "--bpf-lb-map-max" => cfg.ebpf.set_map_max(value().parse().expect("a number")).expect("--bpf-lb-map-max"),
            "--bpf-lb-maglev-table-size" => {
                cfg.ebpf.set_maglev_table_size(value().parse().expect("a number")).expect("--bpf-lb-maglev-table-size")
            }
            "--manifests" => dir = Some(PathBuf::from(value())),
            "--hostname-override" => cfg.hostname = value().to_string(),
            "--proxy-mode" => cfg.mode = value().parse().expect("--proxy-mode"),
            "--cluster-cidr" => cfg.cluster_cidrs = parse_cidrs(flag, value()).expect("--cluster-cidr"),
            "--masquerade-all" => cfg.masquerade_all = true,
            "--nodeport-addresses" => {
                let items: Vec<String> = value().split(',').map(String::from).collect();
                cfg.nodeport_addresses = NodePortAddresses::parse(&items).expect("--nodeport-addresses");
            }
            "--iptables-localhost-nodeports" => cfg.localhost_nodeports = given != Some("false"),
            "--conntrack-tcp-be-liberal" => cfg.conntrack.tcp_be_liberal = given != Some("false"),
            // The node's conntrack limits and timeouts, no part of the rules.
            _ if flag.starts_with("--conntrack-") => {}
            _ => panic!("replay: flag {flag} is not modelled; teach config() in tests/common/replay.rs"),
        }
    }
    Ok((cfg, dir.expect("--manifests")))
}

/// The rules `args` programmed into `cluster`'s node, modelled; checked against what
/// `roadkeeper rules` prints for the same arguments.
fn snapshot(cluster: &Cluster, args: &[String]) -> Result<Snapshot, &'static str> {
    let (cfg, dir) = config(args)?;
    // Bad manifests are the proxy's to report; the store keeps what is valid, as the proxy's.
    let (source, _errors) = ManifestSource::load(&dir).expect("the manifest folder");
    let store = source.store();
    let addresses = cluster.lab.node().run(roadkeeper_proxy::node::host_addresses);
    let node = roadkeeper_proxy::node::node_info(&cfg.hostname, store, &addresses);
    let plan = NodePlan::new(store, &cfg, &node, &service_cidrs(store));
    let ruleset = Ruleset::of(&plan).expect("the tracer models a full sync");
    let planned = match (&ruleset, cfg.mode) {
        (_, ProxyMode::Nftables) => script(&plan.nftables().ops()),
        (_, ProxyMode::Iptables) => plan
            .iptables()
            .restore_inputs()
            .iter()
            .map(|(family, input)| {
                let tool = if *family == IpFamily::V4 { "iptables-restore" } else { "ip6tables-restore" };
                format!("# {tool} --noflush\n{input}")
            })
            .collect(),
        (_, ProxyMode::Ipvs) => roadkeeper_rules::ipvs::show::rules_listing(&plan.ipvs()),
        (Ruleset::Ebpf(tables), ProxyMode::Ebpf) => roadkeeper_rules::ebpf::show::lb_list(tables.maps()),
        (_, ProxyMode::Ebpf) => unreachable!("eBPF mode's ruleset is its maps"),
    };
    let mut rules_args: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| !matches!(*a, "--once" | "-v")).collect();
    rules_args[0] = "rules";
    let printed = cluster.roadkeeper(&rules_args);
    if !printed.status.success() {
        // A Service the maps cannot hold (eBPF mode's sizes): the proxy keeps what it had, which
        // a full sync's plan does not say.
        return Err("`roadkeeper rules` refused a Service");
    }
    let printed = String::from_utf8_lossy(&printed.stdout);
    if let Some((line, (want, got))) = printed
        .lines()
        .zip(planned.lines())
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .or_else(|| (printed.lines().count() != planned.lines().count()).then_some((0, ("(length)", "(length)"))))
    {
        panic!(
            "replay: the in-process plan differs from `roadkeeper rules {}` at line {}: {want:?} vs {got:?} (the harness's flags or node are not the proxy's)",
            rules_args[1..].join(" "),
            line + 1
        );
    }
    Ok(Snapshot { ruleset, env: Environment { local_addresses: node.local_addresses, ..Environment::default() } })
}

/// The source address the kernel of the calling thread's namespace picks for `target`.
fn chosen_source(target: SocketAddr) -> IpAddr {
    let unspecified: IpAddr = if target.is_ipv4() { "0.0.0.0".parse() } else { "::".parse() }.expect("address");
    let socket = UdpSocket::bind(SocketAddr::new(unspecified, 0)).expect("a UDP socket");
    socket.connect(target).expect("a route to the target");
    socket.local_addr().expect("the socket's address").ip()
}

/// Replays the probe `proto` from `ns` to `target` that ended as `result`, if `ns` belongs to a
/// cluster whose rules are modelled; panics when the tracer disagrees.
pub fn check(ns: &Netns, proto: Proto, target: SocketAddr, result: &ProbeResult) {
    let registered = REGISTRY.lock().expect("registry").get(ns.name()).cloned();
    let Some((replay, origin)) = registered else { return };
    let Some(replay) = replay.upgrade() else { return };
    let mut replay = lock(&replay);
    let snapshot = match &replay.state {
        State::Ready { snapshot, .. } => snapshot,
        State::Not(why) => {
            let why = *why;
            *replay.skipped.entry(why).or_default() += 1;
            return;
        }
    };
    let v4 = target.is_ipv4();
    // eBPF mode translates the node's own connections at the socket: the kernel picks their
    // source for the endpoint (the bridge's address), not for the frontend, and a UDP socket
    // connected to the frontend would itself be translated (or refused): the packet's source is
    // left unspecified, and a reply's checked against the source picked for its endpoint.
    let at_socket = matches!(snapshot.ruleset, Ruleset::Ebpf(_)) && matches!(origin, Origin::Node);
    let (entry, source) = match origin {
        Origin::Pod(a, b) => (Entry::LocalPod, if v4 { a } else { b }),
        Origin::External(a, b) => (Entry::Received, if v4 { a } else { b }),
        Origin::Node if at_socket => (Entry::Host, if v4 { [0u8; 4].into() } else { [0u8; 16].into() }),
        Origin::Node => (Entry::Host, ns.run(|| chosen_source(target))),
    };
    let protocol = match proto {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
    };
    let mut env = snapshot.env.clone();
    env.affinity.extend(
        replay.pinned.iter().filter(|(s, p, _)| *s == source && *p == protocol).map(|(_, _, entry)| entry.clone()),
    );
    let packet = Packet { entry, source, destination: target, protocol };
    let trace = snapshot.ruleset.trace(&packet, &env).expect("a trace");
    let source_for = |to: SocketAddr| if at_socket { ns.run(|| chosen_source(to)) } else { source };
    let pinned = agree(&trace, result, source_for);
    replay.pinned.extend(pinned.into_iter().map(|entry| (source, protocol, entry)));
    replay.replayed += 1;
}

/// Asserts that the real `result` is an outcome `trace` predicts (a reply masqueraded exactly
/// when its path is: its peer is not `source_for` the path's destination); the affinity entries
/// its path adds the source to (kept by name: eBPF mode's name the slot too, which moves).
fn agree(trace: &Trace, result: &ProbeResult, source_for: impl Fn(SocketAddr) -> IpAddr) -> Vec<String> {
    let fates = trace.fates();
    let packet = &trace.packet;
    let all = |wanted: &dyn Fn(&Fate) -> bool| fates.iter().all(|(fate, _)| wanted(fate));
    let unmodified = |fate: &Fate| matches!(fate, Fate::Delivered { dnat: None, .. });
    let disagree = |what: &str| -> ! {
        panic!("replay: {packet:?} ended as {result:?}, but the tracer {what}; it predicted {fates:?}")
    };
    match result {
        ProbeResult::Reply(reply) => {
            let path = trace
                .paths
                .iter()
                .find(|p| p.dnat == Some(reply.local) || (p.dnat.is_none() && reply.local == packet.destination))
                .filter(|p| matches!(p.fate(), Fate::Delivered { .. }))
                .unwrap_or_else(|| disagree(&format!("has no path delivering it to {}", reply.local)));
            let masqueraded = reply.peer.ip() != source_for(path.dnat.unwrap_or(packet.destination));
            if masqueraded != path.masquerade.is_some() {
                disagree(&format!("says masqueraded: {} (the pod saw {})", path.masquerade.is_some(), reply.peer));
            }
            path.affinity.clone()
        }
        ProbeResult::Refused => {
            let local = |f: &Fate| matches!(f, Fate::Delivered { delivery: Delivery::Local, dnat: None, .. });
            if !all(&|f| *f == Fate::Rejected || local(f)) {
                disagree("does not reject it");
            }
            Vec::new()
        }
        ProbeResult::Timeout => {
            if !all(&|f| *f == Fate::Dropped || unmodified(f)) {
                disagree("does not drop it");
            }
            Vec::new()
        }
        ProbeResult::Error(_) => {
            if !all(&|f| matches!(f, Fate::Rejected | Fate::Dropped) || unmodified(f)) {
                disagree("has it reach a pod");
            }
            Vec::new()
        }
    }
}
