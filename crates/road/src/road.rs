//! The road itself: DNS, then one leg per node the request crosses (the rules traced, where the
//! packet lands), with the Ingress station between the controller's Service and the backend.

use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RData, RecordType};
use roadkeeper_cluster::NamespacedName;
use roadkeeper_dns::answer::{Outcome, Zones};
use roadkeeper_dns::zone::{PodMode, ZoneData, ZoneOptions};
use roadkeeper_ingress::routes::RouteTable;
use roadkeeper_rules::plan::{NodePlan, service_cidrs};
use roadkeeper_rules::table::{IpFamily, Protocol, ServicePort};
use roadkeeper_rules::trace::ebpf::FROM_OUTSIDE;
use roadkeeper_rules::trace::{Entry, Environment, Fate, Packet, Ruleset, Trace, Verdict};
use serde::Serialize;

use crate::world::{Node, Origin, World};
use crate::{Error, Request};

/// Where a request (or one leg of it) starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Place {
    /// A pod (`namespace/name`), a node or an outside host.
    pub name: String,
    /// Its address.
    pub address: IpAddr,
    /// The node it is on (pods), or is (nodes).
    pub node: Option<String>,
}

/// How the name resolved where the request starts: the cluster DNS as a pod's resolver asks it,
/// else the shell's resolver, else (the lab) the address of the Ingress whose rules name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DnsStation {
    /// The name as given.
    pub name: String,
    /// Who answered, in words.
    pub resolver: String,
    /// Each name asked (search path first, as `ndots:5` does) with its answer.
    pub asked: Vec<(String, String)>,
    /// The address it resolved to.
    pub address: IpAddr,
}

/// One endpoint of the Service, and whether this node's rules send the packet there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointView {
    /// The EndpointSlice.
    pub slice: String,
    /// The endpoint's address.
    pub address: IpAddr,
    /// The pod behind it (`namespace/name`).
    pub pod: Option<String>,
    /// Its node.
    pub node: Option<String>,
    /// `conditions.ready` (absent counts as true).
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// In the endpoint set this frontend uses on this node (traffic policy, topology and
    /// terminating fallback applied).
    pub eligible: bool,
    /// Why not, when it is not.
    pub ineligible: Option<String>,
}

/// The Service and port the destination is a frontend of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceStation {
    /// `namespace/name`.
    pub service: String,
    /// The port's name (empty when unnamed).
    pub port_name: String,
    /// The port and protocol, `80/TCP`.
    pub port: String,
    /// Which frontend: `ClusterIP`, `NodePort`, `LoadBalancer` or `externalIP`, with its address.
    pub frontend: String,
    /// The traffic policy this frontend follows (`internalTrafficPolicy: Cluster`, ...).
    pub policy: String,
    /// Every endpoint of the Service's EndpointSlices for this port's family.
    pub endpoints: Vec<EndpointView>,
}

/// One way the packet can end, with what it lands on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Landing {
    /// The path of the trace.
    pub path: usize,
    /// Its probability.
    pub probability: f64,
    /// `delivered`, `dropped` or `rejected`.
    pub fate: &'static str,
    /// What happens, in words.
    pub outcome: String,
    /// Where the destination is rewritten to.
    pub dnat: Option<SocketAddr>,
    /// The pod the packet lands on (`namespace/name`).
    pub pod: Option<String>,
    /// The pod's node.
    pub pod_node: Option<String>,
    /// Why the source is masqueraded (the rules that marked it and the one that masqueraded
    /// it); `None`: it keeps its source address.
    pub masquerade: Option<String>,
}

/// A trace of the node's rules, and which backend wrote them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Traced {
    /// `nftables` or `iptables`.
    pub backend: &'static str,
    /// Every path of the packet through the rules.
    pub trace: Trace,
}

/// One leg: a packet from a place to a destination, through the rules of one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leg {
    /// Where the packet comes from.
    pub from: Place,
    /// The node whose rules it passes.
    pub node: String,
    /// Why that node (the pod's node, the node itself, the node the network delivers it to).
    pub node_reason: String,
    /// How it enters that node's netfilter path.
    pub entry: Entry,
    /// Where it is sent.
    pub destination: SocketAddr,
    /// The Service the destination is a frontend of.
    pub service: Option<ServiceStation>,
    /// The rules.
    pub rules: Traced,
    /// Every way it ends.
    pub landings: Vec<Landing>,
    /// The landing the road follows (the one observed, else the most likely delivered one).
    pub followed: Option<usize>,
}

/// The Ingress station: the controller's route table asked for the request's host and path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IngressStation {
    /// The controller's pod that received the request.
    pub controller: String,
    /// The host routed by (the Host header's name).
    pub host: String,
    /// The path routed.
    pub path: String,
    /// The host keys tried, each with the number of paths the table has for it.
    pub tried: Vec<(String, usize)>,
    /// The Ingress rule (or default backend) that served it: `namespace/name spec.rules[0]...`.
    pub rule: Option<String>,
    /// The backend Service and port.
    pub backend: Option<String>,
    /// The endpoints the controller picks from.
    pub endpoints: Vec<SocketAddr>,
    /// Why nothing served the request (404), or why no endpoint did (503).
    pub failure: Option<String>,
}

/// The whole road of a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Road {
    /// The request.
    pub request: Request,
    /// Where it starts.
    pub from: Place,
    /// The DNS answer, for a name.
    pub dns: Option<DnsStation>,
    /// The legs, one per node the request's packets pass (two through the Ingress).
    pub legs: Vec<Leg>,
    /// The Ingress station, between the legs.
    pub ingress: Option<IngressStation>,
}

/// What the shell saw of the real request, to follow the road it took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The node the first packet entered (from its conntrack entry).
    pub entry_node: Option<String>,
    /// Where the first leg's packet was DNATed to (from its conntrack entry).
    pub dnat: Option<SocketAddr>,
    /// The address of the pod that answered.
    pub backend: Option<IpAddr>,
    /// The address the shell's resolver gave the URL's name, for a request that does not start
    /// in a pod (outside the lab: this machine's resolver).
    pub resolved: Option<IpAddr>,
}

/// The road `request` takes from `origin` in `world`.
pub fn road(world: &World, origin: &Origin, request: &Request, observed: &Observed) -> Result<Road, Error> {
    let (from, namespace) = place_of(world, origin)?;
    let (dns, address) = match request.address {
        Some(address) => (None, address),
        None => {
            let family = IpFamily::of(&from.address);
            let dns = match namespace {
                Some(namespace) => resolve(world, &namespace, &request.host, family)?,
                None => resolve_outside(world, &from, &request.host, family, observed)?,
            };
            (Some(dns.clone()), dns.address)
        }
    };
    let destination = SocketAddr::new(address, request.port);
    let (node, reason, entry) = entry_node(world, origin, &from, address, observed)?;
    let first = leg(world, node, reason, entry, from.clone(), destination, observed.dnat)?;
    let mut road = Road { request: request.clone(), from, dns, legs: vec![first], ingress: None };
    if let Some((controller, controller_ip, controller_node)) = reached_ingress(world, &road.legs[0]) {
        let (station, backend) = ingress_station(world, request, controller, observed.backend);
        road.ingress = Some(station);
        if let (Some(backend), Some(node)) = (backend, controller_node.as_deref().and_then(|n| world.node(n))) {
            let from = Place {
                name: road.ingress.as_ref().map(|s| s.controller.clone()).unwrap_or_default(),
                address: controller_ip,
                node: controller_node.clone(),
            };
            let reason = "the controller's pod runs here".to_owned();
            road.legs.push(leg(world, node, reason, Entry::LocalPod, from, backend, None)?);
        }
    }
    Ok(road)
}

/// Where `origin` is, and the namespace whose search path it resolves names with (pods only).
fn place_of(world: &World, origin: &Origin) -> Result<(Place, Option<String>), Error> {
    match origin {
        Origin::Pod(key) => {
            let pod = world.store.pod(key).ok_or_else(|| Error::Origin(format!("pod {key}: not in the cluster")))?;
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
                .ok_or_else(|| Error::Origin(format!("pod {key}: status.podIP: none yet")))?;
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            Ok((Place { name: key.to_string(), address: ip, node }, Some(key.namespace.clone())))
        }
        Origin::Node(name) => {
            let node = world.node(name).ok_or_else(|| Error::Origin(format!("node {name}: not in the cluster")))?;
            let address =
                node.info.primary_ips.first().copied().ok_or_else(|| {
                    Error::Origin(format!("node {name}: status.addresses: no InternalIP or ExternalIP"))
                })?;
            Ok((Place { name: name.clone(), address, node: Some(name.clone()) }, None))
        }
        Origin::Outside { name, address } => Ok((Place { name: name.clone(), address: *address, node: None }, None)),
    }
}

/// The names a pod's resolver asks for `name` (`search <ns>.svc.<domain> svc.<domain> <domain>`,
/// `ndots:5`), in order.
pub(crate) fn search_names(name: &str, namespace: &str, domain: &str) -> Vec<String> {
    if let Some(absolute) = name.strip_suffix('.') {
        return vec![absolute.to_owned()];
    }
    let searched = [format!("{namespace}.svc.{domain}"), format!("svc.{domain}"), domain.to_owned()]
        .map(|suffix| format!("{name}.{suffix}"));
    let mut names: Vec<String> = searched.into();
    if name.matches('.').count() >= 5 {
        names.insert(0, name.to_owned());
    } else {
        names.push(name.to_owned());
    }
    names
}

/// Asks the cluster zone for `name` as a pod of `namespace` would.
fn resolve(world: &World, namespace: &str, name: &str, family: IpFamily) -> Result<DnsStation, Error> {
    let domain = world.cluster_domain.trim_end_matches('.');
    let zone = Name::from_ascii(format!("{domain}."))
        .map_err(|err| Error::Unresolved(format!("cluster domain {domain:?}: {err}")))?;
    let zones = Zones {
        cluster: vec![zone],
        reverse: Vec::new(),
        fallthrough: Vec::new(),
        ttl: 5,
        pods: PodMode::Disabled,
        ignore_empty_service: false,
        servers: Vec::new(),
    };
    let data = ZoneData::build(world.store, &ZoneOptions::default());
    let qtype = match family {
        IpFamily::V4 => RecordType::A,
        IpFamily::V6 => RecordType::AAAA,
    };
    let mut asked = Vec::new();
    for candidate in search_names(name, namespace, domain) {
        let Ok(fqdn) = Name::from_ascii(format!("{candidate}.")) else {
            asked.push((candidate, "not a valid name".to_owned()));
            continue;
        };
        match zones.answer(&data, &fqdn, qtype) {
            Outcome::Forward => {
                asked.push((candidate, "outside the cluster zone: forwarded upstream".to_owned()));
            }
            Outcome::Answer(answer) => {
                let address = answer.answers.iter().find_map(|record| match &record.data {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                });
                match address {
                    Some(address) => {
                        asked.push((candidate, format!("{qtype} {address}")));
                        let resolver = "the cluster DNS, as the pod's resolver asks it".to_owned();
                        return Ok(DnsStation { name: name.to_owned(), resolver, asked, address });
                    }
                    None if answer.rcode == ResponseCode::NXDomain => asked.push((candidate, "NXDOMAIN".to_owned())),
                    None => asked.push((candidate, format!("NOERROR, no {qtype} record"))),
                }
            }
        }
    }
    let tried: Vec<String> = asked.iter().map(|(n, a)| format!("{n}: {a}")).collect();
    Err(Error::Unresolved(format!("{name} does not resolve in the cluster: {}", tried.join("; "))))
}

/// A name asked where no cluster DNS answers (a host outside the cluster, a node): the address
/// the shell's resolver gave, else, when the world says so (the lab), the address of the Ingress
/// whose rules name the host, as the DNS record a user makes for it would answer.
fn resolve_outside(
    world: &World,
    from: &Place,
    name: &str,
    family: IpFamily,
    observed: &Observed,
) -> Result<DnsStation, Error> {
    let record = |address: &IpAddr| if address.is_ipv4() { "A" } else { "AAAA" };
    if let Some(address) = observed.resolved {
        let asked = vec![(name.to_owned(), format!("{} {address}", record(&address)))];
        let resolver = "this machine's resolver".to_owned();
        return Ok(DnsStation { name: name.to_owned(), resolver, asked, address });
    }
    let hint = format!(
        "trace an address (the Ingress's with -H 'Host: {name}', a NodePort's, a load-balancer address) or \
         start from a pod"
    );
    if !world.ingress_dns {
        return Err(Error::Unresolved(format!(
            "{} resolves names with its own resolver, not the cluster DNS: {hint}",
            from.name
        )));
    }
    let (ingress, address) = ingress_address(world, name, family).ok_or_else(|| {
        Error::Unresolved(format!(
            "{name}: no Ingress with an address has a rule for this host, and {} resolves other names with \
             its own resolver, not the cluster DNS: {hint}",
            from.name
        ))
    })?;
    let asked = vec![(name.to_owned(), format!("Ingress {ingress}: status.loadBalancer {address}"))];
    let resolver = format!("the address of Ingress {ingress}, as a DNS record for its host would answer");
    Ok(DnsStation { name: name.to_owned(), resolver, asked, address })
}

/// The first Ingress with an address of `family` whose rules name `host` (exactly, else by a
/// wildcard `*.` covering its first label), and that address.
fn ingress_address(world: &World, host: &str, family: IpFamily) -> Option<(NamespacedName, IpAddr)> {
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    let wildcard = name.find('.').map(|dot| format!("*{}", &name[dot..]));
    let named = |wanted: &str| {
        world.store.ingresses().find_map(|(key, ingress)| {
            let rules = ingress.spec.as_ref()?.rules.as_ref()?;
            rules.iter().any(|rule| rule.host.as_deref() == Some(wanted)).then_some(())?;
            let addresses = ingress.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?;
            let address = addresses
                .iter()
                .filter_map(|a| a.ip.as_deref()?.parse::<IpAddr>().ok())
                .find(|a| IpFamily::of(a) == family)?;
            Some((key.clone(), address))
        })
    };
    named(&name).or_else(|| wildcard.as_deref().and_then(named))
}

/// The node whose rules the first packet passes, why, and how it enters.
fn entry_node<'w>(
    world: &'w World,
    origin: &Origin,
    from: &Place,
    destination: IpAddr,
    observed: &Observed,
) -> Result<(&'w Node, String, Entry), Error> {
    let named = |name: &str| world.node(name).ok_or_else(|| Error::NoNode(format!("node {name}: not traced")));
    match origin {
        Origin::Pod(_) => {
            let name =
                from.node.as_deref().ok_or_else(|| Error::NoNode(format!("pod {}: spec.nodeName: none", from.name)))?;
            Ok((named(name)?, "the pod runs here".to_owned(), Entry::LocalPod))
        }
        Origin::Node(name) => Ok((named(name)?, "the request starts here".to_owned(), Entry::Host)),
        Origin::Outside { .. } => {
            if let Some(name) = &observed.entry_node {
                return Ok((
                    named(name)?,
                    "the network delivered it here (its conntrack entry is here)".to_owned(),
                    Entry::Received,
                ));
            }
            if let Some(node) = world.nodes.iter().find(|n| n.info.local_addresses.contains(&destination)) {
                return Ok((node, format!("{destination} is its address"), Entry::Received));
            }
            let node = world.nodes.first().ok_or_else(|| Error::NoNode("no node to trace".into()))?;
            Ok((
                node,
                format!("the network may deliver {destination} to any node; traced at the first"),
                Entry::Received,
            ))
        }
    }
}

/// The service port `destination` is a frontend of on `node`, and which frontend.
fn frontend<'p>(
    plan: &'p NodePlan,
    node: &Node,
    destination: SocketAddr,
) -> Option<(&'p NamespacedName, &'p ServicePort, String, bool)> {
    let (ip, port) = (destination.ip(), destination.port());
    plan.ports.ports.iter().find_map(|(key, ports)| {
        ports.iter().filter(|sp| sp.name.protocol == Protocol::Tcp).find_map(|sp| {
            let kind = if sp.cluster_ip == Some(ip) && sp.port == port {
                ("ClusterIP", false)
            } else if sp.load_balancer_ips.contains(&ip) && sp.port == port {
                ("LoadBalancer", true)
            } else if sp.external_ips.contains(&ip) && sp.port == port {
                ("externalIP", true)
            } else if sp.node_port == Some(port) && node.info.nodeport_ips(sp.family, &node.cfg).contains(&ip) {
                ("NodePort", true)
            } else {
                return None;
            };
            Some((key, sp, format!("{} {destination}", kind.0), kind.1))
        })
    })
}

/// The Service station of `sp` on node `node`.
fn service_station(
    world: &World,
    node: &str,
    key: &NamespacedName,
    sp: &ServicePort,
    frontend: String,
    external: bool,
) -> ServiceStation {
    let (local, policy) = if external {
        (sp.external_policy_local, "externalTrafficPolicy")
    } else {
        (sp.internal_policy_local, "internalTrafficPolicy")
    };
    let eligible = if external { sp.external_endpoints() } else { sp.internal_endpoints() };
    let mut endpoints = Vec::new();
    for slice in world.store.slices_for(key) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        for endpoint in &slice.endpoints {
            let conditions = endpoint.conditions.as_ref();
            for address in endpoint.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                if IpFamily::of(&address) != sp.family {
                    continue;
                }
                let pod = endpoint.target_ref.as_ref().filter(|r| r.kind.as_deref() == Some("Pod")).map(|r| {
                    format!("{}/{}", r.namespace.as_deref().unwrap_or(&key.namespace), r.name.as_deref().unwrap_or(""))
                });
                let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
                let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
                let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
                let is_eligible = eligible.iter().any(|e| e.ip == address);
                let on_node = endpoint.node_name.as_deref() == Some(node);
                let ineligible = (!is_eligible).then(|| {
                    if !serving {
                        "not serving".to_owned()
                    } else if local && !on_node {
                        format!("on another node, and the {policy} is Local")
                    } else if terminating {
                        "terminating, and other endpoints are ready".to_owned()
                    } else if endpoint.hints.is_some() {
                        "its topology hints are for other zones".to_owned()
                    } else {
                        "its EndpointSlice has no port for this Service port".to_owned()
                    }
                });
                endpoints.push(EndpointView {
                    slice: name.clone(),
                    address,
                    pod,
                    node: endpoint.node_name.clone(),
                    ready,
                    serving,
                    terminating,
                    eligible: is_eligible,
                    ineligible,
                });
            }
        }
    }
    ServiceStation {
        service: key.to_string(),
        port_name: sp.name.port.clone(),
        port: format!("{}/{}", sp.port, sp.name.protocol.as_str().to_ascii_uppercase()),
        frontend,
        policy: format!("{policy}: {}", if local { "Local" } else { "Cluster" }),
        endpoints,
    }
}

/// One leg through `node`'s rules.
fn leg(
    world: &World,
    node: &Node,
    node_reason: String,
    entry: Entry,
    from: Place,
    destination: SocketAddr,
    observed_dnat: Option<SocketAddr>,
) -> Result<Leg, Error> {
    let plan = NodePlan::new(world.store, &node.cfg, &node.info, &service_cidrs(world.store));
    let service = frontend(&plan, node, destination)
        .map(|(key, sp, kind, external)| service_station(world, &node.info.name, key, sp, kind, external));
    let failed = |source| Error::Trace { node: node.info.name.clone(), source };
    let ruleset = Ruleset::of(&plan).map_err(failed)?;
    let packet = Packet { entry, source: from.address, destination, protocol: Protocol::Tcp };
    let env = Environment { local_addresses: node.info.local_addresses.clone(), ..Environment::default() };
    let trace = ruleset.trace(&packet, &env).map_err(failed)?;
    let landings: Vec<Landing> =
        trace.paths.iter().enumerate().map(|(index, path)| landing(world, &trace, index, path)).collect();
    let delivered = |l: &&Landing| l.fate == "delivered";
    let followed = observed_dnat
        .and_then(|dnat| landings.iter().find(|l| l.dnat == Some(dnat)))
        .or_else(|| landings.iter().filter(delivered).max_by(|a, b| a.probability.total_cmp(&b.probability)))
        .map(|l| l.path);
    let rules = Traced { backend: trace.backend, trace };
    Ok(Leg { from, node: node.info.name.clone(), node_reason, entry, destination, service, rules, landings, followed })
}

/// How path `index` of `trace` ends, in words; in eBPF mode with the station that translated the
/// address (the socket, or the node's NIC).
fn landing(world: &World, trace: &Trace, index: usize, path: &roadkeeper_rules::trace::Path) -> Landing {
    let program = trace.steps(index).into_iter().find_map(|step| match step {
        roadkeeper_rules::trace::Step::Program { program, .. } => Some(program.as_str()),
        _ => None,
    });
    let masquerade = path.masquerade.as_ref().map(|m| {
        let rule = |r: &roadkeeper_rules::trace::RuleRef| format!("[{} {}] {}", r.table, r.chain, r.rule);
        let by = rule(&m.by);
        // The rule that set the mark, and the one that sent the packet there (the reason).
        match m.marked_by.as_slice() {
            [] => format!("by {by}"),
            [mark] => format!("marked by {}; masqueraded by {by}", rule(mark)),
            [.., reason, mark] => format!("marked by {} after {}; masqueraded by {by}", rule(mark), rule(reason)),
        }
    });
    let (fate, outcome) = match (&path.verdict, path.fate()) {
        (Verdict::Dropped { by }, _) => ("dropped", format!("dropped by {} {}: {}", by.table, by.chain, by.rule)),
        (Verdict::Rejected { by, with }, _) => {
            ("rejected", format!("rejected ({with}) by {} {}: {}", by.table, by.chain, by.rule))
        }
        (Verdict::Accepted { .. }, Fate::Delivered { delivery, .. }) => {
            let to = match delivery {
                roadkeeper_rules::trace::Delivery::Local => "to the node itself",
                roadkeeper_rules::trace::Delivery::Forwarded => "forwarded",
            };
            let what = match (path.dnat, program) {
                (Some(dnat), Some(FROM_OUTSIDE)) => format!("DNAT to {dnat} at the node's NIC by {FROM_OUTSIDE}, {to}"),
                (Some(dnat), Some(program)) => {
                    format!("translated to {dnat} at the socket by {program} (no packet is NATed), {to}")
                }
                (Some(dnat), None) => format!("DNAT to {dnat}, {to}"),
                (None, _) => format!("accepted unchanged, {to}"),
            };
            ("delivered", what)
        }
        (Verdict::Accepted { .. }, _) => ("delivered", "accepted".to_owned()),
    };
    let lands_on = path.dnat.map(|d| d.ip()).or(match path.verdict {
        Verdict::Accepted { .. } => Some(path_destination(path)),
        _ => None,
    });
    let (pod, pod_node) = match lands_on.and_then(|ip| world.pod_at(ip)) {
        Some((key, node)) => (Some(key.to_string()), node),
        None => (None, None),
    };
    Landing { path: index, probability: path.probability, fate, outcome, dnat: path.dnat, pod, pod_node, masquerade }
}

/// The destination a path routes by (after any DNAT), from its route step.
fn path_destination(path: &roadkeeper_rules::trace::Path) -> IpAddr {
    path.steps
        .iter()
        .rev()
        .find_map(|step| match step {
            roadkeeper_rules::trace::Step::Route { destination, .. } => Some(destination.ip()),
            _ => None,
        })
        .unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

/// The Ingress controller's pod the first leg's followed landing reaches, if it does: through the
/// controller's Service.
fn reached_ingress(world: &World, leg: &Leg) -> Option<(String, IpAddr, Option<String>)> {
    let service = leg.service.as_ref()?;
    if service.service != world.ingress_service.to_string() {
        return None;
    }
    let landing = &leg.landings[leg.followed?];
    let dnat = landing.dnat?;
    Some((landing.pod.clone().unwrap_or_else(|| dnat.to_string()), dnat.ip(), landing.pod_node.clone()))
}

/// The Ingress station, and the backend endpoint the controller connects to (`preferred` when it
/// is one of them, else the first).
fn ingress_station(
    world: &World,
    request: &Request,
    controller: String,
    preferred: Option<IpAddr>,
) -> (IngressStation, Option<SocketAddr>) {
    let (table, _) = RouteTable::build(world.store, &world.ingress_class);
    let path = request.route_path().to_owned();
    let explained = table.explain(&request.routed_host, &path);
    let mut station = IngressStation {
        controller,
        host: request.routed_host.clone(),
        path,
        tried: explained.tried,
        rule: None,
        backend: None,
        endpoints: Vec::new(),
        failure: None,
    };
    let Some(matched) = explained.matched else {
        station.failure = Some("no rule and no default backend matches: 404".into());
        return (station, None);
    };
    station.rule = Some(format!("{} {}", matched.ingress, matched.field));
    let port = matched.port.map(|p| format!(" port {p}")).unwrap_or_default();
    station.backend = Some(format!("Service {}{port}", matched.service));
    station.endpoints = matched.endpoints.clone();
    if matched.endpoints.is_empty() {
        station.failure = Some(format!("Service {} has no ready endpoint: 503", matched.service));
    }
    let backend = matched.endpoints.iter().find(|e| Some(e.ip()) == preferred).or(matched.endpoints.first()).copied();
    (station, backend)
}
