//! `roadkeeper bench`: measures full-sync and one-endpoint-change times of the nftables backend
//! at several cluster sizes, in one run, in a scratch network namespace.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::Context;
use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::k8s_openapi::api::discovery::v1::EndpointSlice;
use roadkeeper_cluster::{NamespacedName, Object, Store};
use roadkeeper_netlab::Netns;
use roadkeeper_proxy::config::ProxyConfig;
use roadkeeper_proxy::nft::apply::{NftBinary, NftRunner};
use roadkeeper_proxy::nft::transaction;
use roadkeeper_proxy::nft::proxier::NftProxier;
use roadkeeper_proxy::proxier::Proxier;
use roadkeeper_proxy::table::NodeInfo;

use crate::cli::BenchArgs;

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

/// Peak RSS of a real `roadkeeper proxy --once` over the same cluster written as manifests, in
/// its own scratch namespace: the figure an operator sees (YAML parsing included).
fn proxy_peak_rss_mib(services: usize, endpoints: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let mut yaml = String::new();
    for i in 0..services {
        yaml.push_str(&serde_saphyr::to_string(&service(i))?);
        yaml.push_str("---\n");
        yaml.push_str(&serde_saphyr::to_string(&slice(i, endpoints, 0))?);
        yaml.push_str("---\n");
    }
    std::fs::write(dir.path().join("cluster.yaml"), yaml)?;
    let ns = Netns::new("rk-bench-rss")?;
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(&exe)
        .args(["proxy", "--once", "--hostname-override", "node-0", "--manifests"])
        .arg(dir.path())
        .output()?;
    anyhow::ensure!(out.status.success(), "roadkeeper proxy --once failed: {}", String::from_utf8_lossy(&out.stderr));
    // The largest waited-for child so far: sizes are measured in increasing order.
    // SAFETY: getrusage only writes into the struct we pass, which is valid when zeroed.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    Ok(usage.ru_maxrss as f64 / 1024.0)
}

/// One size: full syncs into an empty namespace, then partial syncs of one changed endpoint.
fn measure(services: usize, endpoints: usize, runs: usize) -> anyhow::Result<String> {
    let ns = Netns::new("rk-bench").context("creating a scratch network namespace")?;
    ns.run(|| -> anyhow::Result<String> {
        let cfg = ProxyConfig { hostname: "node-0".into(), cluster_cidrs: vec!["10.128.0.0/9".parse()?], ..ProxyConfig::default() };
        let node = NodeInfo { name: "node-0".into(), primary_ips: vec!["192.168.0.2".parse()?], ..NodeInfo::default() };
        let base = store(services, endpoints, None);
        let mut full = Vec::new();
        let mut proxier = None;
        for _ in 0..runs {
            NftBinary.apply(&transaction::cleanup())?;
            let mut p = NftProxier::new(cfg.clone(), node.clone(), NftBinary);
            let start = Instant::now();
            p.sync(&base, &BTreeSet::new())?;
            full.push(start.elapsed());
            proxier = Some(p);
        }
        let mut proxier = proxier.expect("runs >= 1");
        let key = NamespacedName::new("bench", format!("svc-{}", services / 2));
        let changed = BTreeSet::from([key]);
        let mut partial = Vec::new();
        let mut own = Vec::new();
        for generation in 1..=runs as u32 {
            let next = store(services, endpoints, Some((services / 2, generation)));
            let start = Instant::now();
            let report = proxier.sync(&next, &changed)?;
            partial.push(start.elapsed());
            own.push(report.duration.saturating_sub(report.kernel));
            anyhow::ensure!(!report.full && report.services_changed == 1, "expected a partial sync of one Service");
        }
        Ok(format!(
            "| {services} | {endpoints} | {} | {} | {} | {:.0} MiB |",
            ms(median(full)),
            ms(median(partial)),
            us(median(own)),
            proxy_peak_rss_mib(services, endpoints)?
        ))
    })
}

/// Runs the benchmark for every requested size and prints a Markdown table.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    println!("nftables backend, median of {} runs each, one run of `roadkeeper bench`", args.runs);
    println!("| services | endpoints each | full sync | one endpoint change | of which roadkeeper (rest: kernel) | proxy --once peak RSS |");
    println!("|---|---|---|---|---|---|");
    for services in &args.services {
        println!("{}", measure(*services, args.endpoints, args.runs)?);
    }
    Ok(())
}
