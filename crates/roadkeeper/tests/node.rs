//! roadkeeper on real nodes: `tests/node/up.sh --nodes 2` brings up etcd, the control plane,
//! and two nodes (a containerd and a kubelet each) in network namespaces of their own, and
//! deploys `deploy/` unchanged (the proxy DaemonSet in place of kube-proxy, the cluster DNS in
//! place of CoreDNS, the Ingress controller). These tests then walk the README's tutorial with
//! kubectl against it, in both proxy modes, and take it down with `tests/node/down.sh`, checking
//! that nothing is left. Another starts from CoreDNS as kubeadm installs it (`up.sh --dns
//! coredns`) and replaces it as docs/replacing-coredns.md says, running the page's code blocks.
//!
//! One node at a time on a machine: the tests take turns.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use common::eventually;

/// One node per machine (its namespaces, cgroups and the API server's port are fixed).
static NODE: Mutex<()> = Mutex::new(());

/// The node's network namespace, as `tests/node/lib.sh` names it.
const NODE_NETNS: &str = "rkn-node";
/// The host outside the node.
const OUT_NETNS: &str = "rkn-out";
/// The first node's address.
const NODE_IP: &str = "192.168.234.10";
/// The address the test gives the Ingress controller's LoadBalancer Service.
const LB_IP: &str = "192.168.235.10";

fn node_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/node").join(name)
}

fn text(output: &[u8]) -> String {
    String::from_utf8_lossy(output).into_owned()
}

/// A node brought up by `up.sh`; dropping it runs `down.sh`.
struct Node {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Node {
    fn up(mode: &str) -> Node {
        Node::up_with(&["--proxy-mode", mode, "--nodes", "2"])
    }

    /// `up.sh` with these arguments.
    fn up_with(args: &[&str]) -> Node {
        // The test binary's own roadkeeper goes into the image, so the node runs this build.
        let out = Command::new(node_script("up.sh"))
            .args(args)
            .env("ROADKEEPER_BINARY", env!("CARGO_BIN_EXE_roadkeeper"))
            .output()
            .expect("cannot run tests/node/up.sh");
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "up.sh {args:?} failed:\n{}\n{stdout}", text(&out.stderr));
        let kubeconfig = PathBuf::from(stdout.lines().last().expect("up.sh printed nothing"));
        let kubectl = kubeconfig.with_file_name("kubectl");
        assert!(kubeconfig.is_file() && kubectl.is_file(), "{stdout}");
        Node { kubectl, kubeconfig }
    }

    fn try_kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl).arg("--kubeconfig").arg(&self.kubeconfig).args(args).output().unwrap()
    }

    /// kubectl as the admin, from the machine (through the forwarded API server); its stdout.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = self.try_kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}{}", text(&out.stderr), text(&out.stdout));
        text(&out.stdout)
    }

    /// Runs a command in the node's network namespace (where the kubelet and the proxy are).
    fn in_node(&self, command: &str) -> String {
        in_netns(NODE_NETNS, command)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let out = Command::new(node_script("down.sh")).output().expect("cannot run tests/node/down.sh");
        if !out.status.success() && !std::thread::panicking() {
            panic!("down.sh failed: {}", text(&out.stderr));
        }
    }
}

fn in_netns(netns: &str, command: &str) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["--", "sh", "-c", command])
        .output()
        .unwrap();
    assert!(out.status.success(), "in {netns}: {command}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// What must be left behind: no namespace, cgroup, mount, state folder or process of the node.
fn leftovers() -> Vec<String> {
    let mut left = Vec::new();
    let netns = text(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout);
    left.extend(netns.lines().filter(|l| l.starts_with("rkn-")).map(|l| format!("netns {l}")));
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let cgroup = hierarchy.path().join("roadkeeper-node");
        if cgroup.exists() {
            left.push(format!("cgroup {}", cgroup.display()));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    // The node's, and those of the image builds (buildah's working containers).
    let ours = |line: &&str| line.contains("/roadkeeper-node/") || line.contains("/roadkeeper/node-images/");
    left.extend(mounts.lines().filter(ours).map(|l| format!("mount {l}")));
    if Path::new("/var/tmp/roadkeeper-node").exists() {
        left.push("/var/tmp/roadkeeper-node".into());
    }
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|&b| b == 0).any(|var| var == b"ROADKEEPER_NODE_DAEMON=1") {
            left.push(format!("process {}", entry.file_name().to_string_lossy()));
        }
    }
    left
}

/// Kills every daemon of the node with SIGKILL (the control plane, containerd, the kubelets),
/// as a crash would: the containers and their shims go on running, for `down.sh` to find.
fn crash(node: &Node) {
    let logs = node.kubeconfig.parent().unwrap().parent().unwrap().join("logs");
    for entry in std::fs::read_dir(&logs).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "pid") {
            let pid = std::fs::read_to_string(entry.path()).unwrap();
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
    }
    let shims = text(&Command::new("pgrep").arg("containerd-shim").output().unwrap().stdout);
    assert!(!shims.trim().is_empty(), "the containers' shims outlive the daemons");
}

/// The tutorial, step by step, as the README gives it for a real cluster; then `down.sh`, in
/// iptables mode after a crash of every daemon.
fn walk_the_tutorial(mode: &str) {
    let _one = NODE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let node = Node::up(mode);

    // The node and our components, as deployed from deploy/ (up.sh waited for their rollouts).
    let nodes = node.kubectl(&["get", "nodes", "-o", "wide"]);
    assert!(nodes.contains(" Ready ") && nodes.contains("v1.34.4") && nodes.contains("containerd://"), "{nodes}");
    assert_eq!(nodes.lines().filter(|l| l.contains(" Ready ")).count(), 2, "{nodes}");
    let proxies = node.kubectl(&["get", "pods", "-n", "kube-system", "-l", "k8s-app=roadkeeper", "-o", "wide"]);
    let running = |table: &str| table.lines().filter(|l| l.contains("1/1") && l.contains("Running")).count();
    assert_eq!(running(&proxies), 2, "one proxy per node:\n{proxies}");
    let dns = node.kubectl(&["get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns", "-o", "wide"]);
    assert_eq!(running(&dns), 2, "{dns}");
    let all = node.kubectl(&["get", "pods", "-A"]);
    assert!(!all.contains("kube-proxy") && !all.contains("coredns"), "{all}");

    // The app.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello");
    node.kubectl(&["apply", "-f", example.to_str().unwrap()]);
    node.kubectl(&["rollout", "status", "deployment/hello", "--timeout=120s"]);

    // No cloud gives the Ingress controller's LoadBalancer an address here: play its part, as
    // a cloud controller writes the Service's status, and route that address from the outside
    // host to a node with a controller pod (its traffic policy is Local, as a cloud's health
    // checks would find).
    let patch = format!(r#"{{"status":{{"loadBalancer":{{"ingress":[{{"ip":"{LB_IP}"}}]}}}}}}"#);
    node.kubectl(&[
        "patch",
        "svc",
        "-n",
        "kube-system",
        "roadkeeper-ingress",
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
    let hosts = node.kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "app.kubernetes.io/name=roadkeeper-ingress",
        "-o",
        "jsonpath={.items[0].status.hostIP}",
    ]);
    in_netns(OUT_NETNS, &format!("ip route replace {LB_IP}/32 via {hosts}"));
    let published = eventually(Duration::from_secs(20), || node.kubectl(&["get", "ingress", "hello"]).contains(LB_IP));
    let ingress = node.kubectl(&["get", "ingress", "hello"]);
    assert!(published && ingress.contains("roadkeeper"), "the Ingress carries the load balancer's address:\n{ingress}");
    let service = node.kubectl(&["get", "svc", "hello"]);
    let cluster_ip = node.kubectl(&["get", "svc", "hello", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(service.contains(&cluster_ip) && service.contains("80/TCP"), "{service}");
    let pod_ips = || {
        let ips = node.kubectl(&["get", "pods", "-l", "app=hello", "-o", "jsonpath={.items[*].status.podIP}"]);
        ips.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
    };
    // The EndpointSlice controller may list the last pod a moment after the pod has its address.
    let slices = || node.kubectl(&["get", "endpointslices", "-l", "kubernetes.io/service-name=hello"]);
    let listed = eventually(Duration::from_secs(20), || {
        let slices = slices();
        pod_ips().iter().all(|ip| slices.contains(ip.as_str()))
    });
    assert!(listed, "{}", slices());

    // The rules the proxy wrote, in the node's network namespace.
    let rule_lines = || match mode {
        "iptables" => node.in_node("iptables-save -t nat | grep -c default/hello || true"),
        _ => node.in_node("nft list table ip roadkeeper | grep -c default/hello || true"),
    };
    // The proxy syncs at most every second: the slices above may be ahead of the rules.
    let count = || -> usize { rule_lines().trim().parse().unwrap() };
    if mode == "iptables" {
        let three = eventually(Duration::from_secs(10), || count() == 11);
        assert!(three, "iptables-save -t nat | grep default/hello, 3 endpoints: {} lines", count());
    } else {
        assert!(eventually(Duration::from_secs(10), || count() > 0), "nft: no rule names default/hello");
    }
    let before = count();

    // From a pod: the ClusterIP, and the name through the cluster DNS.
    let pods = node.kubectl(&["get", "pods", "-l", "app=hello", "-o", "wide"]);
    assert_eq!(running(&pods), 3, "{pods}");
    let listing = node.kubectl(&["exec", "deploy/hello", "--", "ls", "/usr/share/nginx/html"]);
    assert_eq!(listing.split_whitespace().collect::<Vec<_>>(), ["hello", "index.html"], "{listing}");
    let resolved = node.kubectl(&["exec", "deploy/hello", "--", "getent", "hosts", "hello"]);
    assert!(resolved.starts_with(&format!("{cluster_ip} ")) && resolved.contains("hello.default.svc.cluster.local"));
    let fetch = "exec 3<>/dev/tcp/hello/80; printf 'GET /hello/ HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3";
    let page = node.kubectl(&["exec", "deploy/hello", "--", "bash", "-c", fetch]);
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("Hello from the road's end"), "{page}");

    // From outside the nodes, through the Ingress controller's Service: its load balancer
    // address, and its NodePort.
    // `/hello/`: nginx answers `/hello`, a folder, with a redirect there.
    let page = in_netns(OUT_NETNS, &format!("curl -s -m 5 -w '\\n%{{http_code}}' http://{LB_IP}/hello/"));
    assert!(page.contains("Hello from the road's end") && page.ends_with("200"), "http://{LB_IP}/hello/: {page}");
    let node_port = node.kubectl(&[
        "get",
        "svc",
        "-n",
        "kube-system",
        "roadkeeper-ingress",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    let url = format!("http://{NODE_IP}:{node_port}/hello/");
    let answer = in_netns(OUT_NETNS, &format!("curl -s -m 5 -w '\\n%{{http_code}}' {url}"));
    assert!(answer.contains("Hello from the road's end") && answer.ends_with("200"), "{url}: {answer}");

    // Scale: five endpoints, and (iptables) 6 more rule lines, 3 per endpoint less the shared ones.
    node.kubectl(&["scale", "deployment", "hello", "--replicas=5"]);
    node.kubectl(&["rollout", "status", "deployment/hello", "--timeout=120s"]);
    let five = eventually(Duration::from_secs(20), || {
        let slices = node.kubectl(&["get", "endpointslices", "-l", "kubernetes.io/service-name=hello", "-o", "json"]);
        let ips = pod_ips();
        ips.len() == 5 && ips.iter().all(|ip| slices.contains(ip.as_str()))
    });
    assert!(five, "five endpoints");
    let ruleset = || match mode {
        "iptables" => node.in_node("iptables-save -t nat"),
        _ => node.in_node("nft list table ip roadkeeper"),
    };
    let scaled = eventually(Duration::from_secs(10), || {
        let lines: usize = rule_lines().trim().parse().unwrap();
        let rules = ruleset();
        // iptables: `--to-destination IP:80`; nftables: the endpoint map's `... : IP . 80`.
        let target = |ip: &String| if mode == "iptables" { format!("{ip}:80") } else { format!(": {ip} . 80") };
        let all = pod_ips().iter().all(|ip| rules.contains(&target(ip)));
        all && if mode == "iptables" { lines == 17 } else { lines > before }
    });
    assert!(scaled, "rule lines for default/hello after scaling to 5: {}\n{}", rule_lines(), ruleset());
    // Every one of the five, on either node, gets requests to the ClusterIP from the first node
    // (nginx logs each one). 60 requests leave one of five out with odds of 5 * 0.8^60, 7 in a
    // million; a second round covers a sync still under way.
    let names = node.kubectl(&["get", "pods", "-l", "app=hello", "-o", "jsonpath={.items[*].metadata.name}"]);
    let unreached = || {
        node.in_node(&format!("for i in $(seq 60); do curl -s -m 5 -o /dev/null http://{cluster_ip}/; done"));
        let served = |pod: &&str| node.kubectl(&["logs", pod]).contains("GET / HTTP/1.1\" 200");
        names.split_whitespace().filter(|pod| !served(pod)).map(str::to_owned).collect::<Vec<_>>()
    };
    let missed = unreached();
    if !missed.is_empty() {
        let missed = unreached();
        let where_ = node.kubectl(&["get", "pods", "-l", "app=hello", "-o", "wide"]);
        assert!(missed.is_empty(), "{missed:?} got none of 120 requests:\n{where_}\n{}", ruleset());
    }

    // roadkeeper trace, read-only against this cluster: the road from the node to the five pods.
    let out = Command::new(env!("CARGO_BIN_EXE_roadkeeper"))
        .args(["trace", &format!("http://{cluster_ip}/"), "--from-node", "roadkeeper-node", "--proxy-mode", mode])
        .args(["-o", "json", "--kubeconfig"])
        .arg(&node.kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "trace: {}", text(&out.stderr));
    let road: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let landings = road["road"]["legs"][0]["landings"].as_array().cloned().unwrap_or_default();
    let mut landed: Vec<String> = landings
        .iter()
        .map(|l| l["dnat"].as_str().and_then(|d| d.rsplit_once(':')).map_or(String::new(), |(ip, _)| ip.to_owned()))
        .collect();
    let mut ips = pod_ips();
    landed.sort();
    ips.sort();
    assert_eq!(landed, ips, "trace's landings vs the pods");

    if mode == "iptables" {
        crash(&node);
    }
    drop(node);
    assert_eq!(leftovers(), Vec::<String>::new(), "down.sh left these behind");
}

#[test]
fn the_tutorial_on_a_real_node_in_nftables_mode() {
    walk_the_tutorial("nftables");
}

#[test]
fn the_tutorial_on_a_real_node_in_iptables_mode() {
    walk_the_tutorial("iptables");
}

/// The code block of `docs/replacing-coredns.md` whose info string is `sh tested:<step>`, without
/// the list item's indentation.
fn documented_step(step: &str) -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/replacing-coredns.md");
    let doc = std::fs::read_to_string(&doc).expect("docs/replacing-coredns.md");
    let fence = format!("```sh tested:{step}");
    let mut lines = doc.lines().skip_while(|line| line.trim() != fence);
    let indent = lines.next().map(|line| line.len() - line.trim_start().len());
    let indent = indent.unwrap_or_else(|| panic!("docs/replacing-coredns.md has no block `{fence}`"));
    let block: Vec<&str> =
        lines.take_while(|line| line.trim() != "```").map(|line| line.get(indent..).unwrap_or("")).collect();
    assert!(!block.is_empty(), "the block `{fence}` is empty");
    block.join("\n")
}

/// Runs a step of docs/replacing-coredns.md as an operator would: bash from the repository's root,
/// the node's kubectl first on PATH and its admin kubeconfig; its output.
fn run_documented_step(node: &Node, step: &str) -> String {
    let script = documented_step(step);
    let bin = node.kubectl.parent().expect("kubectl's folder");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .env("PATH", path)
        .env("KUBECONFIG", &node.kubeconfig)
        .output()
        .expect("bash");
    let output = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "step {step} of docs/replacing-coredns.md:\n{script}\n{output}");
    output
}

/// A pod resolving cluster names in a loop: a Service by its short name (through the search
/// path: NXDOMAIN first, then the answer), another by its full name (four NXDOMAINs first) and a
/// ClusterIP's PTR, counting lookups that succeed and fail in `/tmp/counts` and logging each
/// failure. One try per query, 2 s each (`attempts:1`): a query lost or refused is a failed lookup,
/// not a retry.
const RESOLVER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: resolver, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  dnsConfig:
    options: [{name: attempts, value: "1"}, {name: timeout, value: "2"}]
  containers:
    - name: resolver
      image: docker.io/library/nginx:1.27
      command:
        - bash
        - -c
        - |
          ok=0 failed=0
          lookup() {
            if getent "$@" >/dev/null; then ok=$((ok + 1)); else failed=$((failed + 1)); echo "FAILED $(date +%T.%N) getent $*"; fi
          }
          while true; do
            lookup ahostsv4 kubernetes.default
            lookup ahostsv4 kube-dns.kube-system.svc.cluster.local
            lookup hosts 10.96.0.1
            echo "$ok $failed" >/tmp/counts.new && mv /tmp/counts.new /tmp/counts
            sleep 0.05
          done
"#;

/// The sum of the samples of `metric` in a Prometheus text exposition.
fn metric_sum(exposition: &str, metric: &str) -> f64 {
    let samples = exposition.lines().filter(|line| line.starts_with(metric) && !line.starts_with('#'));
    samples.filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// docs/replacing-coredns.md on a real node: CoreDNS as kubeadm installs it, replaced by
/// roadkeeper dns and restored, step by step as the page says (its code blocks, run as written),
/// while a pod resolves in a loop: no lookup fails, and each server answers while it is alone.
#[test]
fn coredns_is_replaced_and_restored_without_a_failed_lookup() {
    let _one = NODE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let node = Node::up_with(&["--proxy-mode", "nftables", "--nodes", "1", "--dns", "coredns"]);
    let system_pods = |selector: &str| {
        let names = node.kubectl(&["get", "pods", "-n", "kube-system", "-l", selector, "-o", "name"]);
        names.lines().count()
    };
    let (coredns, ours) =
        ("k8s-app=kube-dns,app.kubernetes.io/name!=roadkeeper-dns", "app.kubernetes.io/name=roadkeeper-dns");
    assert_eq!((system_pods(coredns), system_pods(ours)), (2, 0), "CoreDNS alone to begin with");
    let service = || node.kubectl(&["get", "svc", "-n", "kube-system", "kube-dns", "-o", "jsonpath={.spec}"]);
    let kubeadms_service = service();

    let manifest = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(manifest.path(), RESOLVER).unwrap();
    node.kubectl(&["apply", "-f", manifest.path().to_str().unwrap()]);
    node.kubectl(&["wait", "--for=condition=Ready", "pod/resolver", "--timeout=120s"]);
    let counts = || -> (u64, u64) {
        let out = node.try_kubectl(&["exec", "resolver", "--", "cat", "/tmp/counts"]);
        let counts = text(&out.stdout);
        let mut numbers = counts.split_whitespace().map(|n| n.parse().unwrap_or(0));
        (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
    };
    // Lookups answered by a server while it is the only one.
    let answered_alone = |who: &str| {
        let (from, _) = counts();
        let answered = eventually(Duration::from_secs(60), || counts().0 >= from + 60);
        assert!(answered, "{who} alone: lookups {:?} (ok, failed), from {from}", counts());
    };
    answered_alone("CoreDNS");

    // 1. roadkeeper dns beside CoreDNS: four ready endpoints behind kube-dns.
    eprintln!("{}", run_documented_step(&node, "alongside"));
    let ready_endpoints = || {
        let jsonpath = r#"jsonpath={range .items[*].endpoints[*]}{.conditions.ready}{"\n"}{end}"#;
        let slices = node.kubectl(&[
            "get",
            "endpointslices",
            "-n",
            "kube-system",
            "-l",
            "kubernetes.io/service-name=kube-dns",
            "-o",
            jsonpath,
        ]);
        slices.lines().filter(|ready| *ready == "true").count()
    };
    assert!(eventually(Duration::from_secs(30), || ready_endpoints() == 4), "{} ready endpoints", ready_endpoints());
    let check = run_documented_step(&node, "check");
    assert!(check.contains("roadkeeper-dns-") && check.contains("coredns-"), "{check}");
    std::thread::sleep(Duration::from_secs(5));

    // 2. CoreDNS scaled away: roadkeeper dns alone answers, and counts it.
    run_documented_step(&node, "retire");
    assert_eq!((system_pods(coredns), system_pods(ours)), (0, 2));
    let requests = |selector: &str, metric: &str| -> f64 {
        let ips = node.kubectl(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            selector,
            "-o",
            "jsonpath={.items[*].status.podIP}",
        ]);
        let scrape = |ip: &str| node.in_node(&format!("curl -s -m 5 http://{ip}:9153/metrics"));
        ips.split_whitespace().map(|ip| metric_sum(&scrape(ip), metric)).sum()
    };
    let before = requests(ours, "roadkeeper_dns_requests_total");
    answered_alone("roadkeeper dns");
    let after = requests(ours, "roadkeeper_dns_requests_total");
    assert!(after >= before + 60.0, "roadkeeper dns's requests went from {before} to {after}");

    // 3. The rollback: CoreDNS back, roadkeeper dns gone, kube-dns as kubeadm made it.
    run_documented_step(&node, "rollback");
    assert_eq!((system_pods(coredns), system_pods(ours)), (2, 0));
    answered_alone("CoreDNS, back");
    assert!(requests(coredns, "coredns_dns_requests_total") >= 60.0, "CoreDNS's requests");

    let (ok, failed) = counts();
    let failures: Vec<String> =
        node.kubectl(&["logs", "resolver"]).lines().filter(|l| l.starts_with("FAILED")).map(str::to_owned).collect();
    assert_eq!((failed, failures.len()), (0, 0), "{ok} lookups succeeded, these failed:\n{}", failures.join("\n"));
    let routing = |spec: &str| {
        let spec: serde_json::Value = serde_json::from_str(spec).unwrap();
        (spec["selector"].clone(), spec["ports"].clone(), spec["clusterIP"].clone())
    };
    assert_eq!(routing(&service()), routing(&kubeadms_service), "the kube-dns Service's selector, ports and address");
    eprintln!("{ok} lookups, none failed");
    drop(node);
    assert_eq!(leftovers(), Vec::<String>::new(), "down.sh left these behind");
}
