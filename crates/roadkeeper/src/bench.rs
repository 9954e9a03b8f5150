//! `roadkeeper bench proxy`: measures full-sync and one-endpoint-change times of each backend at several
//! cluster sizes, side by side in one run, each in scratch network namespaces.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::k8s_openapi::api::discovery::v1::EndpointSlice;
use roadkeeper_cluster::{NamespacedName, Object, Store};
use roadkeeper_netlab::Netns;
use roadkeeper_netlab::cgroup::NodeCgroup;
use roadkeeper_rules::config::{BPF_LB_MAP_MAX, ProxyConfig, ProxyMode};
use roadkeeper_rules::ebpf::CATCH_ALL_PROTOCOLS;
use roadkeeper_rules::table::NodeInfo;

use crate::bench_plot::{Series, line_chart};
use crate::cli::BenchArgs;
use crate::proxy_cmd::kernel_proxier;

/// Fails naming the first of `tools` that is not on the PATH, and how to install them (`hint`).
pub(crate) fn require_tools(tools: &[&str], hint: &str) -> anyhow::Result<()> {
    for tool in tools {
        let found = std::process::Command::new("sh").args(["-c", &format!("command -v {tool}")]).output()?;
        anyhow::ensure!(found.status.success(), "{tool} is needed (Debian: {hint})");
    }
    Ok(())
}

/// The i-th synthetic Service: ClusterIP 10.96.x.y port 80, selector-less.
fn service(i: usize) -> Service {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + 1 + i as u32);
    let yaml = format!(
        "metadata: {{name: svc-{i}, namespace: bench}}\nspec: {{clusterIP: {ip}, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n"
    );
    serde_saphyr::from_str(&yaml).expect("synthetic Service")
}

/// The EndpointSlice of Service i with `endpoints` endpoints; `generation` shifts the addresses
/// of the first endpoint so that a new generation is "one endpoint changed".
fn slice(i: usize, endpoints: usize, generation: u32) -> EndpointSlice {
    let mut yaml = format!(
        "metadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n"
    );
    for e in 0..endpoints {
        let base = u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * endpoints + e) as u32;
        let ip = Ipv4Addr::from(if e == 0 { base + (generation << 22) } else { base });
        let _ = writeln!(yaml, "- {{addresses: [{ip}], nodeName: node-{}}}", e % 3);
    }
    serde_saphyr::from_str(&yaml).expect("synthetic EndpointSlice")
}

fn store(services: usize, endpoints: usize, changed: Option<(usize, u32)>) -> Store {
    let objects = (0..services).flat_map(|i| {
        let generation = changed.filter(|(c, _)| *c == i).map_or(0, |(_, g)| g);
        [Object::Service(service(i).into()), Object::EndpointSlice(slice(i, endpoints, generation).into())]
    });
    Store::from_objects(objects)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Peak RSS of a real `roadkeeper proxy --once --proxy-mode <mode>` over the cluster written as
/// manifests in `dir`, in its own scratch namespace: the figure an operator sees (YAML parsing
/// included).
fn proxy_peak_rss_mib(dir: &Path, backend: Backend, map_max: usize) -> anyhow::Result<f64> {
    let scratch = backend.scratch(map_max)?;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", scratch.ns.name()])
        .arg(std::env::current_exe()?)
        .args([
            "proxy",
            "--once",
            "--hostname-override",
            "node-0",
            "--proxy-mode",
            &backend.mode().to_string(),
            "--manifests",
        ])
        .arg(dir)
        .args(scratch.flags())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    // Polls the child's own high-water mark: wait4's ru_maxrss would report this (large) bench
    // process's RSS, which the kernel records when the forked child calls exec.
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0.0f64;
    let status = loop {
        if let Some(kib) = std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .map(|v| v.trim().trim_end_matches("kB").trim().to_string())
            })
            .and_then(|v| v.parse::<f64>().ok())
        {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut errors = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        std::io::Read::read_to_string(&mut stderr, &mut errors)?;
    }
    anyhow::ensure!(status.success(), "roadkeeper proxy --once ({}) failed: {errors}", backend.name());
    Ok(peak_kib / 1024.0)
}

/// A backend as the bench runs it: iptables either with the flavour a fresh host gets (nft on
/// Debian) or with the legacy flavour, chosen the way kube-proxy's detection sees a legacy host
/// (a `KUBE-IPTABLES-HINT` chain made with `iptables-legacy`); IPVS where the kernel has it;
/// eBPF with its programs on a cgroup and bpffs of the bench's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Nftables,
    Iptables,
    IptablesLegacy,
    Ipvs,
    Ebpf,
}

impl std::str::FromStr for Backend {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Backend> {
        match s {
            "nftables" => Ok(Backend::Nftables),
            "iptables" => Ok(Backend::Iptables),
            "iptables-legacy" => Ok(Backend::IptablesLegacy),
            "ipvs" => Ok(Backend::Ipvs),
            "ebpf" => Ok(Backend::Ebpf),
            other => {
                anyhow::bail!(
                    "--proxy-mode: unknown backend {other:?} (nftables, iptables, iptables-legacy, ipvs, ebpf)"
                )
            }
        }
    }
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Nftables => "nftables",
            Backend::Iptables => "iptables",
            Backend::IptablesLegacy => "iptables-legacy",
            Backend::Ipvs => "ipvs",
            Backend::Ebpf => "ebpf",
        }
    }

    fn mode(self) -> ProxyMode {
        match self {
            Backend::Nftables => ProxyMode::Nftables,
            Backend::Iptables | Backend::IptablesLegacy => ProxyMode::Iptables,
            Backend::Ipvs => ProxyMode::Ipvs,
            Backend::Ebpf => ProxyMode::Ebpf,
        }
    }

    /// A fresh scratch host of this backend (eBPF: maps of `map_max` entries).
    fn scratch(self, map_max: usize) -> anyhow::Result<Scratch> {
        let ns = Netns::new("rk-bench").context("creating a scratch network namespace")?;
        if self == Backend::IptablesLegacy {
            ns.exec(["iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])?;
        }
        let mut ebpf = None;
        if self == Backend::Ebpf {
            let cgroup = Arc::new(NodeCgroup::new(ns.name()).context("the bench node's cgroup")?);
            ns.place_in(cgroup.clone());
            ebpf = Some((cgroup, map_max));
        }
        Ok(Scratch { ns, ebpf })
    }
}

/// A scratch host: a namespace and, in eBPF mode, the node cgroup and bpffs the programs attach
/// to and pin in (the namespace's threads run in that cgroup) with the maps' size.
struct Scratch {
    ns: Netns,
    ebpf: Option<(Arc<NodeCgroup>, usize)>,
}

impl Scratch {
    /// `cfg` with eBPF mode pointed at this host.
    fn config(&self, cfg: &ProxyConfig) -> anyhow::Result<ProxyConfig> {
        let mut cfg = cfg.clone();
        if let Some((cgroup, map_max)) = &self.ebpf {
            cfg.ebpf.cgroup_root = Some(cgroup.path().to_path_buf());
            cfg.ebpf.bpf_root = cgroup.bpf_root();
            cfg.ebpf.set_map_max(*map_max)?;
        }
        Ok(cfg)
    }

    /// The same as flags of `proxy`.
    fn flags(&self) -> Vec<String> {
        let Some((cgroup, map_max)) = &self.ebpf else { return Vec::new() };
        vec![
            "--cgroup-root".into(),
            cgroup.path().display().to_string(),
            "--bpf-root".into(),
            cgroup.bpf_root().display().to_string(),
            "--bpf-lb-map-max".into(),
            map_max.to_string(),
        ]
    }
}

/// eBPF mode's map size for a cluster: a master entry, a slot per endpoint and its ClusterIP's
/// catch-alls for every Service (one more Service added by the bench), as a power of two within
/// `--bpf-lb-map-max`'s bounds.
fn map_max(services: usize, endpoints: usize) -> usize {
    let entries = (services + 1) * (endpoints + 1 + CATCH_ALL_PROTOCOLS.len());
    entries.next_power_of_two().clamp(*BPF_LB_MAP_MAX.start(), *BPF_LB_MAP_MAX.end())
}

/// The manifests of a synthetic cluster, for the RSS measurement.
fn write_manifests(dir: &Path, services: usize, endpoints: usize) -> anyhow::Result<()> {
    let mut yaml = String::new();
    for i in 0..services {
        yaml.push_str(&serde_saphyr::to_string(&service(i))?);
        yaml.push_str("---\n");
        yaml.push_str(&serde_saphyr::to_string(&slice(i, endpoints, 0))?);
        yaml.push_str("---\n");
    }
    std::fs::write(dir.join("cluster.yaml"), yaml)?;
    Ok(())
}

/// Timings of one backend at one size.
struct Row {
    full: Duration,
    partial: Vec<Duration>,
    own: Duration,
    added: Vec<Duration>,
    deleted: Vec<Duration>,
    connect: Connects,
}

/// New connections to a ClusterIP through the rules: connect latency and rate.
struct Connects {
    median: Duration,
    p99: Duration,
    max: Duration,
    per_second: f64,
}

/// How many connections [`connect_through_rules`] opens.
const CONNECTIONS: usize = 4000;

/// Opens [`CONNECTIONS`] TCP connections, one after the other, from the proxier's namespace to
/// the ClusterIP of Service 0 (nat output, then DNAT through the rules to one of its
/// `endpoints`, made addresses of the namespace's loopback with a listener on their port), each
/// closed with a reset so that no TIME_WAIT piles up.
fn connect_through_rules(ns: &Netns, endpoints: &[Ipv4Addr]) -> anyhow::Result<Connects> {
    // A route to the ClusterIPs (an interface with the node's address: one end of a veth pair,
    // this kernel having no dummy interfaces), as a node has one.
    ns.exec(["ip", "link", "set", "lo", "up"])?;
    ns.exec(["ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"])?;
    ns.exec(["ip", "link", "set", "node0-peer", "up"])?;
    ns.exec(["ip", "link", "set", "node0", "up"])?;
    ns.exec(["ip", "addr", "add", "192.168.0.2/24", "dev", "node0"])?;
    ns.exec(["ip", "route", "add", "10.96.0.0/12", "dev", "node0"])?;
    for ip in endpoints {
        ns.exec(["ip", "addr", "add", &format!("{ip}/32"), "dev", "lo"])?;
    }
    // The client: an address of the pod CIDR, so that it is not masqueraded (a masqueraded
    // connection from this host to itself would get a loopback source the kernel drops).
    let client = Ipv4Addr::new(10, 255, 255, 254);
    ns.exec(["ip", "addr", "add", &format!("{client}/32"), "dev", "lo"])?;
    let cluster_ip = std::net::SocketAddr::from((Ipv4Addr::new(10, 96, 0, 1), 80));
    ns.run(|| -> anyhow::Result<Connects> {
        let listener = std::net::TcpListener::bind("0.0.0.0:8080")?;
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Accepts as fast as connections come (a full backlog would drop SYNs, and a
            // retransmitted SYN costs a second); a last connection of its own ends it.
            scope.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = listener.accept();
                }
            });
            let result = (|| {
                let mut took = Vec::with_capacity(CONNECTIONS);
                let start = Instant::now();
                for _ in 0..CONNECTIONS {
                    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                    socket.bind(&std::net::SocketAddr::from((client, 0)).into())?;
                    socket.set_linger(Some(Duration::ZERO))?;
                    let before = Instant::now();
                    socket
                        .connect_timeout(&cluster_ip.into(), Duration::from_secs(2))
                        .context("connecting to the ClusterIP through the rules")?;
                    took.push(before.elapsed());
                }
                let per_second = CONNECTIONS as f64 / start.elapsed().as_secs_f64();
                took.sort();
                Ok(Connects {
                    median: took[took.len() / 2],
                    p99: took[took.len() * 99 / 100],
                    max: took[took.len() - 1],
                    per_second,
                })
            })();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = std::net::TcpStream::connect(("127.0.0.1", 8080));
            result
        })
    })
}

/// `median / max` of some timings.
fn median_max(v: &[Duration]) -> String {
    format!("{} / {}", short(median(v.to_vec())), short(v.iter().max().copied().unwrap_or_default()))
}

/// Milliseconds, or microseconds below one.
fn short(d: Duration) -> String {
    if d < Duration::from_millis(1) { us(d) } else { ms(d) }
}

/// Full syncs, each into a fresh namespace, then partial syncs of one changed endpoint, of one
/// new Service and of its deletion.
fn measure(backend: Backend, services: usize, endpoints: usize, runs: usize) -> anyhow::Result<Row> {
    let cfg = ProxyConfig {
        hostname: "node-0".into(),
        cluster_cidrs: vec!["10.128.0.0/9".parse()?],
        mode: backend.mode(),
        ..ProxyConfig::default()
    };
    let node = NodeInfo { name: "node-0".into(), primary_ips: vec!["192.168.0.2".parse()?], ..NodeInfo::default() };
    let base = store(services, endpoints, None);
    let mut full = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let scratch = backend.scratch(map_max(services, endpoints))?;
        let cfg = scratch.config(&cfg)?;
        let (elapsed, proxier) = scratch.ns.run(|| -> anyhow::Result<_> {
            let mut proxier = kernel_proxier(&cfg, node.clone(), &base)?;
            let start = Instant::now();
            let report = proxier.sync(&base, &BTreeSet::new())?;
            let elapsed = start.elapsed();
            anyhow::ensure!(report.refused.is_empty(), "the first sync refused {:?}", report.refused.first());
            Ok((elapsed, proxier))
        })?;
        full.push(elapsed);
        last = Some((scratch, proxier));
    }
    let (scratch, mut proxier) = last.expect("runs >= 1");
    let ns = &scratch.ns;
    let changed = BTreeSet::from([NamespacedName::new("bench", format!("svc-{}", services / 2))]);
    let (mut partial, mut own) = (Vec::new(), Vec::new());
    let mut sync_one = |store: &Store, changed: &BTreeSet<NamespacedName>| -> anyhow::Result<(Duration, Duration)> {
        let report = ns.run(|| proxier.sync(store, changed))?;
        anyhow::ensure!(!report.full && report.services_changed == 1, "expected a partial sync of one Service");
        Ok((report.duration, report.duration.saturating_sub(report.kernel)))
    };
    // Two versions of the cluster, one endpoint of one Service apart, built once and taken in
    // turn: a proxy keeps one store and changes it in place, so a store built anew for each run
    // would measure its cold caches rather than the sync.
    let versions = [1, 2].map(|generation| store(services, endpoints, Some((services / 2, generation))));
    for run in 0..runs {
        let (took, ours) = sync_one(&versions[run % 2], &changed)?;
        partial.push(took);
        own.push(ours);
    }
    // One more Service, then without it again.
    let last = 1 + (runs as u32 + 1) % 2;
    let (with_new, without) = (
        store(services + 1, endpoints, Some((services / 2, last))),
        store(services, endpoints, Some((services / 2, last))),
    );
    let new = BTreeSet::from([NamespacedName::new("bench", format!("svc-{services}"))]);
    let (mut added, mut deleted) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        added.push(sync_one(&with_new, &new)?.0);
        deleted.push(sync_one(&without, &new)?.0);
    }
    // Service 0's endpoints as they are now (it is the changed one when there is one Service).
    let generation = if services / 2 == 0 { last } else { 0 };
    let targets: Vec<Ipv4Addr> = slice(0, endpoints, generation)
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter().filter_map(|a| a.parse().ok()))
        .collect();
    let connect = connect_through_rules(ns, &targets)?;
    Ok(Row { full: median(full), partial, own: median(own), added, deleted, connect })
}

/// Runs the benchmark for every requested backend and size and prints a Markdown table; with
/// `--out`, also writes it and the plots there.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let backends: Vec<Backend> = args.proxy_mode.iter().map(|m| m.parse()).collect::<Result<_, _>>()?;
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    }
    let mut table = format!(
        "median of {} runs each, {} endpoints per Service, measured in one run of `roadkeeper bench proxy`\n\n\
         | Services | backend | full sync | one endpoint change (median / max) | of which roadkeeper (rest: kernel) | \
         new Service (median / max) | deleted Service (median / max) | new connection to a ClusterIP \
         (median / p99 / max, rate) | proxy --once peak RSS |\n|---|---|---|---|---|---|---|---|---|\n",
        args.runs, args.endpoints
    );
    print!("{table}");
    let mut results: Vec<(Backend, usize, Row, f64)> = Vec::new();
    for services in &args.services {
        let manifests = tempfile::tempdir()?;
        write_manifests(manifests.path(), *services, args.endpoints)?;
        for backend in &backends {
            let row = measure(*backend, *services, args.endpoints, args.runs)?;
            let rss = proxy_peak_rss_mib(manifests.path(), *backend, map_max(*services, args.endpoints))?;
            let connect = &row.connect;
            let line = format!(
                "| {services} | {} | {} | {} | {} | {} | {} | {} / {} / {}, {:.0}/s | {rss:.0} MiB |\n",
                backend.name(),
                ms(row.full),
                median_max(&row.partial),
                us(row.own),
                median_max(&row.added),
                median_max(&row.deleted),
                us(connect.median),
                us(connect.p99),
                short(connect.max),
                connect.per_second,
            );
            print!("{line}");
            table.push_str(&line);
            results.push((*backend, *services, row, rss));
        }
    }
    if let Some(out) = &args.out {
        write_results(out, &table, &backends, &results)?;
    }
    Ok(())
}

/// Writes `results.md` and one SVG plot per figure into `out`.
fn write_results(
    out: &Path,
    table: &str,
    backends: &[Backend],
    results: &[(Backend, usize, Row, f64)],
) -> anyhow::Result<()> {
    fn millis(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }
    type Figure = fn(&Row, f64) -> f64;
    let figures: [(&str, &str, &str, Figure); 5] = [
        ("change.svg", "One endpoint change, synced (median)", "ms", |r, _| millis(median(r.partial.clone()))),
        ("new-service.svg", "A new Service, synced (median)", "ms", |r, _| millis(median(r.added.clone()))),
        ("full-sync.svg", "First full sync", "ms", |r, _| millis(r.full)),
        ("connect.svg", "New connection to a ClusterIP (median)", "µs", |r, _| r.connect.median.as_secs_f64() * 1e6),
        ("rss.svg", "proxy --once peak RSS", "MiB", |_, rss| rss),
    ];
    for (file, title, unit, figure) in figures {
        let series: Vec<Series> = backends
            .iter()
            .map(|backend| Series {
                name: backend.name().to_string(),
                points: results
                    .iter()
                    .filter(|(b, ..)| b == backend)
                    .map(|(_, services, row, rss)| (*services as f64, figure(row, *rss)))
                    .collect(),
            })
            .collect();
        let svg = line_chart(title, "Services (10 endpoints each)", unit, &series);
        std::fs::write(out.join(file), svg).with_context(|| format!("writing {}", out.join(file).display()))?;
    }
    let plots: String =
        figures.iter().map(|(file, title, ..)| format!("![{title}]({file})\n")).collect::<Vec<_>>().join("\n");
    std::fs::write(out.join("results.md"), format!("{table}\n{plots}"))
        .with_context(|| format!("writing {}", out.join("results.md").display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use roadkeeper_proxy::ebpf::proxier::{EbpfProxier, FakeMaps};
    use roadkeeper_proxy::proxier::Proxier;

    use super::*;

    /// The maps the bench sizes hold its whole cluster, plus the Service it adds: here 1,488
    /// Services of 10 endpoints, where the power of two just above a master and a slot per
    /// endpoint (16,379 entries) leaves no room for the ClusterIPs' catch-alls.
    #[test]
    fn the_maps_hold_the_benchs_cluster_with_its_catch_alls() {
        let (services, endpoints) = (1488, 10);
        let mut cfg = ProxyConfig { mode: ProxyMode::Ebpf, ..ProxyConfig::default() };
        cfg.ebpf.set_map_max(map_max(services, endpoints)).unwrap();
        let node = NodeInfo { name: "node-0".into(), ..NodeInfo::default() };
        let mut proxier = EbpfProxier::new(cfg, node, FakeMaps::default());
        let report = proxier.sync(&store(services + 1, endpoints, None), &BTreeSet::new()).unwrap();
        assert_eq!(report.refused, Vec::new(), "map size {}", map_max(services, endpoints));
    }
}
