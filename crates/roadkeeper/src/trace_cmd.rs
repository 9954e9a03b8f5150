//! `roadkeeper trace` (thin): gathers the world a road is computed from (a lab's state, or a
//! cluster read once from an API server or a manifest folder), computes the road with
//! [`roadkeeper_road`], and in the lab sends the real request and reads its conntrack entry.
//! Outside the lab a host name is resolved by this machine's resolver.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Parser;
use roadkeeper_cluster::{Feed, Interest, Kind, ManifestSource, NamespacedName};
use roadkeeper_ingress::routes::ClassConfig;
use roadkeeper_lab::state::{LabDir, Role, State};
use roadkeeper_netlab::Netns;
use roadkeeper_proxy::node::node_info;
use roadkeeper_road::{Node, Observed, Origin, Request, Road, World, road, text};
use roadkeeper_rules::conntrack::{Flow, IPPROTO_TCP};
use roadkeeper_rules::table::IpFamily;
use serde::Serialize;

use crate::cli::{RuleArgs, TraceArgs};
use crate::proxy_cmd::{rule_config, runtime};

/// How long the real request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long this machine's resolver may take for the URL's name (outside the lab).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most node names an unknown --from-node's error lists.
const NODES_LISTED: usize = 20;

/// What the real request in the lab met.
#[derive(Debug, Serialize)]
struct Answer {
    /// The command sent, as it would be typed.
    command: String,
    /// The HTTP status (none if the connection failed).
    status: Option<u16>,
    /// Why there is no status (curl's error).
    error: Option<String>,
    /// The pod that answered (`X-Pod-Name`).
    pod: Option<String>,
    /// The host that answered, when it is no pod (the internet host).
    host: Option<String>,
    /// The client address the pod saw (`X-Client-Address`).
    seen_source: Option<String>,
    /// The connection's conntrack entry: the node holding it and the entry.
    conntrack: Option<(String, String)>,
    /// Whether the kernel's DNAT and masquerading are one way the trace predicts (none without
    /// a DNATed conntrack entry).
    agrees: Option<bool>,
    /// What the kernel did that is not our rules' doing.
    note: Option<String>,
}

/// The JSON output.
#[derive(Serialize)]
struct Output<'a> {
    road: &'a Road,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<&'a Answer>,
}

/// `roadkeeper trace`.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let request = Request::parse(&args.url)?.with_headers(&args.headers)?;
    let ingress_service = parse_key(&args.ingress_service).context("--ingress-service")?;
    let class = ClassConfig { name: args.ingress_class.clone(), ..ClassConfig::default() };
    let (road, answer) = match &args.from_node {
        Some(node) => (cluster_road(&args, node, &request, ingress_service, class)?, None),
        None => {
            let (road, answer) = lab_road(&args, &request, ingress_service, class)?;
            (road, Some(answer))
        }
    };
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&Output { road: &road, answer: answer.as_ref() })?);
    } else {
        print!("{}", text::render(&road));
        if let Some(answer) = &answer {
            print!("{}", render_answer(answer));
        }
    }
    if answer.as_ref().and_then(|a| a.agrees) == Some(false) {
        bail!("the kernel's DNAT or masquerading is not one the trace predicts (see conntrack above)");
    }
    Ok(())
}

/// `NAMESPACE/NAME`.
fn parse_key(text: &str) -> anyhow::Result<NamespacedName> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(NamespacedName::new(namespace, name))
        }
        _ => bail!("{text:?} is not NAMESPACE/NAME"),
    }
}

/// The road from node `from` of a cluster read once from `--kubeconfig` or `--manifests`.
fn cluster_road(
    args: &TraceArgs,
    from: &str,
    request: &Request,
    ingress_service: NamespacedName,
    ingress_class: ClassConfig,
) -> anyhow::Result<Road> {
    let cfg = rule_config(&args.rules, Some(from))?;
    let kinds = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::ServiceCidr,
        Kind::Pod,
        Kind::Namespace,
        Kind::Ingress,
        Kind::IngressClass,
    ];
    let interest = Interest { kinds: kinds.into(), node: None };
    let spec = args.source.spec(cfg.kubeconfig.as_deref());
    let feed = runtime()?.block_on(Feed::open(&spec, &interest, false)).context("reading the cluster state")?;
    let store = feed.store();
    let mut names: Vec<String> = store.nodes().filter_map(|n| n.metadata.name.clone()).collect();
    names.sort();
    known_node(from, &names)?;
    let nodes = names
        .iter()
        .map(|name| {
            let mut info = node_info(name, store, &[]);
            info.local_addresses = info.primary_ips.clone();
            Node { info, cfg: roadkeeper_rules::config::ProxyConfig { hostname: name.clone(), ..cfg.clone() } }
        })
        .collect();
    let world = World {
        store,
        nodes,
        cluster_domain: args.cluster_domain.clone(),
        ingress_service,
        ingress_class,
        ingress_dns: false,
    };
    let family = world.node(from).and_then(|n| n.info.primary_ips.first()).map_or(IpFamily::V4, IpFamily::of);
    let resolved = match request.address {
        Some(_) => None,
        None => Some(resolve_here(&request.host, request.port, family)?),
    };
    Ok(road(&world, &Origin::Node(from.to_owned()), request, &Observed { resolved, ..Observed::default() })?)
}

/// `--from-node from` among the cluster's nodes `names` (sorted), or an error naming it and the
/// nodes there are.
fn known_node(from: &str, names: &[String]) -> anyhow::Result<()> {
    if names.iter().any(|n| n == from) {
        return Ok(());
    }
    if names.is_empty() {
        bail!(
            "--from-node {from}: no such Node: the cluster has no Node objects (a manifest folder needs \
             Nodes with status.addresses to trace from one)"
        );
    }
    let mut listed = names.iter().take(NODES_LISTED).map(String::as_str).collect::<Vec<_>>().join(", ");
    if names.len() > NODES_LISTED {
        listed.push_str(&format!(" and {} more", names.len() - NODES_LISTED));
    }
    bail!("--from-node {from}: no such Node (nodes: {listed})")
}

/// `host` resolved by this machine's resolver within [`RESOLVE_TIMEOUT`]: an address of
/// `family` if it has one, else its first. (A lookup that never returns is left to its thread.)
fn resolve_here(host: &str, port: u16, family: IpFamily) -> anyhow::Result<IpAddr> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let name = (host.to_owned(), port);
    std::thread::spawn(move || {
        let _ = sender.send(name.to_socket_addrs().map(|addresses| addresses.map(|a| a.ip()).collect::<Vec<_>>()));
    });
    let addresses = receiver
        .recv_timeout(RESOLVE_TIMEOUT)
        .map_err(|_| anyhow!("{host}: this machine's resolver gave no answer in {} s", RESOLVE_TIMEOUT.as_secs()))?
        .with_context(|| format!("{host}: this machine's resolver"))?;
    let address = addresses.iter().find(|a| IpFamily::of(a) == family).or(addresses.first());
    address.copied().ok_or_else(|| anyhow!("{host}: this machine's resolver gave no address"))
}

/// Parses the lab's proxy flags as `roadkeeper proxy` does.
#[derive(Parser)]
struct LabProxy {
    #[command(flatten)]
    rules: RuleArgs,
}

/// The road in the lab: the real request sent first, its conntrack entry read, then the road
/// computed along the node it entered.
fn lab_road(
    args: &TraceArgs,
    request: &Request,
    ingress_service: NamespacedName,
    ingress_class: ClassConfig,
) -> anyhow::Result<(Road, Answer)> {
    let lab = LabDir::resolve(args.lab_dir.as_deref());
    let state = State::load(&lab)?;
    let (source, _) = ManifestSource::load(&lab.cluster_dir()).context("reading the lab's cluster state")?;
    let store = source.store();
    let flags = std::iter::once("proxy".to_owned()).chain(state.config.proxy_flags());
    let rules = LabProxy::try_parse_from(flags).context("the lab's proxy flags")?.rules;
    let nodes = state
        .nodes()
        .map(|host| {
            let mut addresses = vec![IpAddr::V4(host.address)];
            addresses.extend(host.pod_cidr.and_then(|c| c.hosts().next()).map(IpAddr::V4));
            let info = node_info(&host.name, store, &addresses);
            let cfg = rule_config(&rules, Some(&host.name))?;
            Ok(Node { info, cfg })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let from = args.from.clone().unwrap_or_else(|| "client".to_owned());
    let (origin, target) = match state.host(&from) {
        Ok(host) if host.role == Role::Node => (Origin::Node(host.name.clone()), state.target(&from, None, None)?),
        Ok(host) => {
            let origin = Origin::Outside { name: host.name.clone(), address: IpAddr::V4(host.address) };
            (origin, state.target(&from, None, None)?)
        }
        Err(_) => {
            let (namespace, name) = from.split_once('/').unwrap_or(("default", from.as_str()));
            let target = state.target(name, Some(namespace), None)?;
            (Origin::Pod(NamespacedName::new(namespace, name)), target)
        }
    };
    let world = World {
        store,
        nodes,
        cluster_domain: args.cluster_domain.clone(),
        ingress_service,
        ingress_class,
        ingress_dns: true,
    };
    // Fail on a bad request or origin before sending anything.
    let planned = road(&world, &origin, request, &Observed::default())?;
    // A name resolved outside the cluster DNS (an Ingress's host) is sent to the address the road
    // resolved it to, as the user's DNS would answer; a pod's curl asks the cluster DNS itself.
    let resolved = planned.dns.filter(|_| !matches!(origin, Origin::Pod(_))).map(|dns| dns.address);
    let sent_to = planned.legs.first().map(|leg| leg.destination);

    let (mut answer, local) = send(&target, request, resolved)?;
    let mut observed = Observed::default();
    // Whether the kernel masqueraded the DNATed connection (the reply goes to another address).
    let mut masqueraded = None;
    if let Some(local) = local {
        // The connection has an entry in every node it crossed: the one that NATed it (DNAT
        // first, then masquerading) is where it met the rules; else the first holding it.
        let mut entries = Vec::new();
        for host in state.nodes() {
            let flows =
                Netns::open(&host.netns).run(|| roadkeeper_proxy::conntrack::dump_flows(IpFamily::of(&local.ip())));
            let flows = flows.with_context(|| format!("reading conntrack in {}", host.name))?;
            entries.extend(
                flows
                    .into_iter()
                    .filter(|f| {
                        f.orig.protocol == IPPROTO_TCP && f.orig.src == local.ip() && f.orig.src_port == local.port()
                    })
                    .map(|flow| (host, flow)),
            );
        }
        let original = |f: &Flow| SocketAddr::new(f.orig.dst, f.orig.dst_port);
        let dnat = |f: &Flow| {
            // eBPF mode translates before conntrack sees a packet (at the socket, or at the
            // node's NIC): the entry's original destination is already the endpoint.
            if state.config.proxy_mode == "ebpf" {
                return sent_to.filter(|to| *to != original(f)).map(|_| original(f));
            }
            let target = SocketAddr::new(f.reply.src, f.reply.src_port);
            (target != original(f)).then_some(target)
        };
        entries.sort_by_key(|(_, f)| (dnat(f).is_none(), f.reply.dst == f.orig.src));
        if let Some((host, flow)) = entries.first() {
            observed.entry_node = Some(host.name.clone());
            if let Some(target) = dnat(flow) {
                observed.dnat = Some(target);
                masqueraded = Some(flow.reply.dst != flow.orig.src);
            } else if flow.reply.dst != flow.orig.src {
                answer.note = Some(format!(
                    "the source was masqueraded to {} by the lab's pod network, not by roadkeeper's rules: \
                     pod traffic leaving the cluster's pod range goes out as its node (the rule a CNI plugin installs)",
                    flow.reply.dst
                ));
            }
            answer.conntrack = Some((host.name.clone(), conntrack_line(flow)));
        }
    }
    observed.backend =
        answer.pod.as_deref().and_then(|name| state.pods.iter().find(|p| p.name == name)).map(|p| IpAddr::V4(p.ip));
    if observed.backend.is_none() {
        answer.host = answer.pod.take();
    }
    let road = road(&world, &origin, request, &observed)?;
    // Agreement on the connection the proxy's rules NATed: its DNAT target and whether its
    // source was masqueraded (other connections may meet the lab's own pod masquerading, which
    // is not our rules').
    answer.agrees = observed.dnat.zip(masqueraded).map(|(dnat, masqueraded)| {
        road.legs[0].landings.iter().any(|l| l.dnat == Some(dnat) && l.masquerade.is_some() == masqueraded)
    });
    // eBPF mode: a connection translated at the socket to the pod itself never leaves it (no
    // conntrack entry); the pod that answered must still be one the road translates to.
    if answer.agrees.is_none() && state.config.proxy_mode == "ebpf" {
        let translated: Vec<SocketAddr> =
            road.legs.iter().flat_map(|leg| &leg.landings).filter_map(|l| l.dnat).collect();
        answer.agrees =
            observed.backend.filter(|_| !translated.is_empty()).map(|ip| translated.iter().any(|to| to.ip() == ip));
    }
    Ok((road, answer))
}

/// The options of curl that send `request` (to `resolved` for its name, when given) as given.
fn curl_options(request: &Request, resolved: Option<IpAddr>) -> Vec<String> {
    let mut options = Vec::new();
    if let Some(host) = &request.host_header {
        options.extend(["-H".to_owned(), format!("Host: {host}")]);
    }
    if let Some(address) = resolved {
        let address = if address.is_ipv6() { format!("[{address}]") } else { address.to_string() };
        options.extend(["--resolve".to_owned(), format!("{}:{}:{address}", request.host, request.port)]);
    }
    options
}

/// Sends `request` with curl from `target` (its name resolved to `resolved` when given); the
/// answer and the connection's local address.
fn send(
    target: &roadkeeper_lab::state::Target,
    request: &Request,
    resolved: Option<IpAddr>,
) -> anyhow::Result<(Answer, Option<SocketAddr>)> {
    let timeout = REQUEST_TIMEOUT.as_secs().to_string();
    let format = "%{http_code}\\n%{local_ip}\\n%{local_port}\\n%header{x-pod-name}\\n%header{x-client-address}\\n";
    let options = curl_options(request, resolved);
    let base = ["curl", "-sS", "-k", "-o", "/dev/null", "--max-time", &timeout, "-w", format];
    let argv = base.iter().copied().chain(options.iter().map(String::as_str)).chain([request.url.as_str()]);
    let output = target.command(argv)?.output().context("running curl")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let field = |i: usize| lines.get(i).map(|s| s.trim()).filter(|s| !s.is_empty()).map(str::to_owned);
    let status = field(0).and_then(|s| s.parse().ok()).filter(|&s| s != 0);
    let local = match (field(1), field(2)) {
        (Some(ip), Some(port)) => Some(SocketAddr::new(ip.parse()?, port.parse()?)),
        _ => None,
    };
    let error = (!output.status.success()).then(|| String::from_utf8_lossy(&output.stderr).trim().to_owned());
    let shown: Vec<String> =
        options.iter().map(|o| if o.contains(' ') { format!("'{o}'") } else { o.clone() }).collect();
    let command =
        ["curl -sk".to_owned()].into_iter().chain(shown).chain([request.url.clone()]).collect::<Vec<_>>().join(" ");
    let answer = Answer {
        command,
        status,
        error,
        pod: field(3),
        host: None,
        seen_source: field(4),
        conntrack: None,
        agrees: None,
        note: None,
    };
    Ok((answer, local))
}

/// A conntrack entry as `conntrack -L` prints it (the parts the trace uses).
fn conntrack_line(flow: &Flow) -> String {
    let t = |t: &roadkeeper_rules::conntrack::Tuple| {
        format!("src={} dst={} sport={} dport={}", t.src, t.dst, t.src_port, t.dst_port)
    };
    let mut line = format!("tcp {} {}", t(&flow.orig), t(&flow.reply));
    if (flow.reply.src, flow.reply.src_port) != (flow.orig.dst, flow.orig.dst_port) {
        line.push_str(&format!(" (DNAT to {})", SocketAddr::new(flow.reply.src, flow.reply.src_port)));
    }
    if flow.reply.dst != flow.orig.src {
        line.push_str(&format!(" (source masqueraded to {})", flow.reply.dst));
    }
    line
}

/// The answer as text.
fn render_answer(answer: &Answer) -> String {
    let mut out = format!("container   {}: ", answer.command);
    match (answer.status, &answer.error) {
        (Some(status), _) => out.push_str(&format!("{status}")),
        (None, Some(error)) => out.push_str(&format!("no answer ({error})")),
        (None, None) => out.push_str("no answer"),
    }
    if let Some(pod) = &answer.pod {
        out.push_str(&format!(" from pod {pod}"));
    }
    if let Some(host) = &answer.host {
        out.push_str(&format!(" from host {host}"));
    }
    if let Some(seen) = &answer.seen_source {
        out.push_str(&format!(", which saw the client as {seen}"));
    }
    out.push('\n');
    match &answer.conntrack {
        Some((node, line)) => out.push_str(&format!("conntrack   on {node}: {line}\n")),
        None => out.push_str("conntrack   no entry for the connection on any node\n"),
    }
    match answer.agrees {
        Some(true) => out.push_str("            the kernel's DNAT and masquerading are one way the trace predicts\n"),
        Some(false) => {
            out.push_str("            WARNING: the kernel's DNAT or masquerading is not one the trace predicts\n")
        }
        None => {}
    }
    if let Some(note) = &answer.note {
        out.push_str(&format!("            {note}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_node_is_named_with_the_nodes_there_are() {
        let names = |n: usize| (1..=n).map(|i| format!("node-{i:02}")).collect::<Vec<_>>();
        known_node("node-01", &names(2)).unwrap();
        let err = known_node("worker-9", &names(2)).unwrap_err().to_string();
        assert_eq!(err, "--from-node worker-9: no such Node (nodes: node-01, node-02)");
        let err = known_node("worker-9", &[]).unwrap_err().to_string();
        assert!(err.starts_with("--from-node worker-9: no such Node: the cluster has no Node objects"), "{err}");
        let err = known_node("worker-9", &names(25)).unwrap_err().to_string();
        assert!(err.ends_with("node-19, node-20 and 5 more)"), "{err}");
    }

    #[test]
    fn curl_sends_the_host_header_and_the_resolved_address() {
        let request = Request::parse("http://web.example.com/").unwrap();
        assert_eq!(
            curl_options(&request, Some("192.168.77.200".parse().unwrap())),
            ["--resolve", "web.example.com:80:192.168.77.200"]
        );
        let request =
            Request::parse("http://192.168.77.200/a").unwrap().with_headers(&["Host: web.example.com".into()]).unwrap();
        assert_eq!(curl_options(&request, None), ["-H", "Host: web.example.com"]);
    }

    #[test]
    fn this_machines_resolver_resolves_a_name() {
        assert_eq!(resolve_here("localhost", 80, IpFamily::V4).unwrap(), IpAddr::from([127, 0, 0, 1]));
        let err = resolve_here("no-such-name.invalid", 80, IpFamily::V4).unwrap_err();
        assert!(format!("{err:#}").starts_with("no-such-name.invalid: this machine's resolver"), "{err:#}");
    }

    #[test]
    fn ingress_service_must_be_namespace_and_name() {
        assert_eq!(parse_key("kube-system/ingress").unwrap(), NamespacedName::new("kube-system", "ingress"));
        for bad in ["ingress", "/ingress", "ns/", "a/b/c", ""] {
            assert!(parse_key(bad).unwrap_err().to_string().contains("is not NAMESPACE/NAME"), "{bad}");
        }
    }
}
