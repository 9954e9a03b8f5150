//! `roadkeeper lab`: the hello example on real namespaces. Builds a node with three echo pods
//! and a client, runs `roadkeeper proxy --once` in the node, sends requests from the client to
//! the Service's ClusterIP and shows which pod answered and the rules that sent it there.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use roadkeeper_netlab::{Lab, ProbeResult, echo, manifests, probe};

use crate::cli::LabArgs;

/// The example Service, also at examples/hello/service.yaml.
const HELLO_SERVICE: &str = include_str!("../../../examples/hello/service.yaml");
/// The lab node's name.
const NODE: &str = "node-a";

/// Runs the example and tears everything down afterwards.
pub fn run(args: LabArgs) -> anyhow::Result<()> {
    let lab = Lab::new("rk-lab").context("creating the lab namespaces (needs root)")?;
    let client = lab.add_pod("client")?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("node.yaml"), manifests::node(NODE, "zone-a"))?;
    let service = match &args.service {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => HELLO_SERVICE.to_string(),
    };
    std::fs::write(dir.path().join("service.yaml"), service)?;
    let mut pods = Vec::new();
    for name in ["hello-a", "hello-b", "hello-c"] {
        let pod = lab.add_pod(name)?;
        let listen = [
            SocketAddr::new(IpAddr::V4(pod.ipv4), manifests::ECHO_PORT),
            SocketAddr::new(IpAddr::V6(pod.ipv6), manifests::ECHO_PORT),
        ];
        let server = pod.ns.run(|| echo::serve(&listen, name))?;
        std::fs::write(
            dir.path().join(format!("pod-{name}.yaml")),
            manifests::pod(&pod, "app: hello", NODE, manifests::PodState::Ready),
        )?;
        println!("pod {name:8} {} {}", pod.ipv4, pod.ipv6);
        pods.push((server, pod));
    }
    println!("client       {} {}", client.ipv4, client.ipv6);

    let exe: PathBuf = std::env::current_exe()?;
    let manifests_dir = dir.path().display().to_string();
    let proxy = [
        exe.display().to_string().as_str(),
        "proxy",
        "--once",
        "--manifests",
        &manifests_dir,
        "--hostname-override",
        NODE,
        "--cluster-cidr",
        "10.244.0.0/16,fd00:244::/48",
    ]
    .map(String::from);
    println!("\n$ ip netns exec {} {}", lab.node().name(), proxy.join(" "));
    let out = lab.node().exec(&proxy)?;
    if !out.status.success() {
        bail!("roadkeeper proxy failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }

    for target in &args.target {
        println!("\n{} requests from the client to {target}:", args.requests);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..args.requests {
            let answer = match client.ns.run(|| probe::tcp(*target, Duration::from_secs(1))) {
                ProbeResult::Reply(reply) => {
                    format!(
                        "{} answered (reached at {}, saw the client as {})",
                        reply.name,
                        reply.local,
                        reply.peer.ip()
                    )
                }
                other => format!("{other:?}"),
            };
            *counts.entry(answer).or_default() += 1;
        }
        for (answer, n) in counts {
            println!("  {n:3} x {answer}");
        }
    }

    println!("\n$ nft list ruleset | grep default/hello   # in the node");
    let rules = lab.node().exec(["nft", "list", "ruleset"])?;
    for line in String::from_utf8_lossy(&rules.stdout).lines().filter(|l| l.contains("default/hello")) {
        println!("{}", line.trim());
    }
    if args.keep {
        println!(
            "\nThe lab stays up until you press Enter: try `ip netns exec {} nft list ruleset`.",
            lab.node().name()
        );
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
    }
    Ok(())
}
