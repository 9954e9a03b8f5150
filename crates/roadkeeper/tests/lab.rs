//! End-to-end tests of `roadkeeper lab` through the real binary (need root): the road of
//! examples/hello walked with real packets in both proxy modes, scaling and relabelling as the
//! tutorial does, the manifest folder watched, bad input, and `lab down` leaving nothing behind
//! after a normal run and after `kill -9`. Every test has a lab directory (and so namespaces) of
//! its own and removes its lab even when it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::eventually;
use roadkeeper_lab::state::LabDir;

/// A lab in a temporary directory, removed (`lab down`) on drop.
struct TestLab {
    dir: LabDir,
    manifests: PathBuf,
    _tmp: tempfile::TempDir,
}

impl TestLab {
    /// A lab directory and a copy of examples/hello to run (scaling edits the copy).
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let manifests = tmp.path().join("hello");
        std::fs::create_dir(&manifests).unwrap();
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello");
        for entry in std::fs::read_dir(example).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), manifests.join(entry.file_name())).unwrap();
        }
        TestLab { dir: LabDir::resolve(Some(&tmp.path().join("lab"))), manifests, _tmp: tmp }
    }

    /// A lab directory and a manifest folder of these files (name, text) to run.
    fn with_files(files: &[(&str, &str)]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let manifests = tmp.path().join("app");
        std::fs::create_dir(&manifests).unwrap();
        for (name, text) in files {
            std::fs::write(manifests.join(name), text).unwrap();
        }
        TestLab { dir: LabDir::resolve(Some(&tmp.path().join("lab"))), manifests, _tmp: tmp }
    }

    /// `roadkeeper lab --lab-dir DIR args...`.
    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_roadkeeper"));
        command.arg("lab").arg("--lab-dir").arg(self.dir.path()).args(args);
        command.output().unwrap()
    }

    /// Like [`run`](Self::run), which must succeed; its standard output.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "lab {args:?} failed: {}\n{text}", String::from_utf8_lossy(&output.stderr));
        text
    }

    fn up(&self, mode: &str, nodes: &str) -> String {
        self.ok(&["up", self.manifests.to_str().unwrap(), "--proxy-mode", mode, "--nodes", nodes])
    }

    /// The names of the pods `lab get pods -l SELECTOR` lists.
    fn pods(&self, selector: &str) -> Vec<String> {
        let table = self.ok(&["get", "pods", "-l", selector]);
        table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
    }

    /// A column of a pod of `lab get pods -o wide`.
    fn pod_column(&self, pod: &str, column: usize) -> String {
        let table = self.ok(&["get", "pods", "-o", "wide"]);
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("{pod} ")))
            .unwrap_or_else(|| panic!("{pod} not in\n{table}"));
        row.split_whitespace().nth(column).unwrap().to_owned()
    }

    /// The addresses of the endpoints of Service hello (from the state the components read).
    fn hello_endpoints(&self) -> Vec<String> {
        let (source, _) = roadkeeper_cluster::ManifestSource::load(&self.dir.cluster_dir()).unwrap();
        let slices = source.store().slices_for(&roadkeeper_cluster::NamespacedName::new("default", "hello"));
        slices.iter().flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone())).collect()
    }

    /// `iptables-save -t nat | grep -c default/hello` in a node.
    fn hello_nat_rules(&self, node: &str) -> usize {
        self.ok(&["exec", node, "--", "iptables-save", "-t", "nat"])
            .lines()
            .filter(|l| l.contains("default/hello"))
            .count()
    }

    /// Asserts that `iptables-save -t nat | grep -c default/hello` is `count` in both nodes: at
    /// once, as `lab scale` returns only when every node's proxy has synced the change.
    fn assert_nat_rules(&self, count: usize) {
        assert_eq!([self.hello_nat_rules("node-1"), self.hello_nat_rules("node-2")], [count, count]);
    }

    /// The load-balancer address of the ingress controller.
    fn ingress_ip(&self) -> String {
        let services = self.ok(&["get", "services", "-n", "kube-system"]);
        let row = services.lines().find(|l| l.starts_with("roadkeeper-ingress ")).unwrap();
        row.split_whitespace().nth(3).unwrap().to_owned()
    }

    /// Which pod answers each of `n` requests from the client through the ingress.
    fn answers_through_ingress(&self, n: usize) -> Vec<String> {
        let url = format!("http://{}/hello", self.ingress_ip());
        (0..n)
            .map(|_| {
                self.ok(&["exec", "client", "--", "curl", "-s", "-o", "/dev/null", "-w", "%header{x-pod-name}", &url])
            })
            .collect()
    }

    /// What a lab down must have removed: namespaces, processes, mounts, the directory.
    fn assert_nothing_left(&self) {
        let (prefix, id) = (self.dir.prefix(), self.dir.id());
        let netns = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
        assert!(!netns.lines().any(|l| l.starts_with(&prefix)), "namespaces left:\n{netns}");
        let processes = roadkeeper_lab::process::marked(&id);
        assert!(processes.is_empty(), "processes left: {processes:?}");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let dir = self.dir.path().display().to_string();
        assert!(!mounts.lines().any(|l| l.contains(&prefix) || l.contains(&dir)), "mounts left:\n{mounts}");
        // eBPF mode's node cgroups.
        if let Ok(cgroup) = roadkeeper_lab::node_cgroups::cgroup(&id, "node-1") {
            assert!(!cgroup.parent().unwrap().exists(), "{} left", cgroup.display());
        }
        assert!(!self.dir.path().exists(), "{dir} left");
    }

    /// `roadkeeper trace URL --lab-dir DIR -o json args...`: its JSON, and whether it succeeded.
    fn trace(&self, url: &str, args: &[&str]) -> serde_json::Value {
        let output = Command::new(env!("CARGO_BIN_EXE_roadkeeper"))
            .args(["trace", url, "--lab-dir"])
            .arg(self.dir.path())
            .args(["-o", "json"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "trace {url} {args:?}: {}\n{text}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_str(&text).unwrap_or_else(|err| panic!("{err}: {text}"))
    }

    /// The controller's pid, from the state file.
    fn controller_pid(&self) -> u32 {
        roadkeeper_lab::state::State::load(&self.dir).unwrap().controller.unwrap().pid
    }
}

impl Drop for TestLab {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
    }
}

/// Services the tutorial lacks, for the traces: one with `externalTrafficPolicy: Local` and one
/// whose selector matches no pod; and a UDP echo Deployment without volumes behind a UDP Service.
const TRACED_SERVICES: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web-local}\n\
    spec: {type: LoadBalancer, externalTrafficPolicy: Local, selector: {app: hello}, ports: [{port: 80}]}\n---\n\
    apiVersion: v1\nkind: Service\nmetadata: {name: nobody}\nspec: {selector: {app: nobody}, ports: [{port: 80}]}\n---\n\
    apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo}\nspec:\n  selector: {matchLabels: {app: echo}}\n  \
    template:\n    metadata: {labels: {app: echo}}\n    spec: {containers: [{name: echo, image: busybox, \
    ports: [{containerPort: 9000, protocol: UDP}]}]}\n---\n\
    apiVersion: v1\nkind: Service\nmetadata: {name: echo}\n\
    spec: {selector: {app: echo}, ports: [{port: 53, targetPort: 9000, protocol: UDP}]}\n";

/// The landings of leg `leg` of a trace: (fate, DNAT target, pod, pod's node, masqueraded).
fn landings(trace: &serde_json::Value, leg: usize) -> Vec<(String, String, String, String, bool)> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
    trace["road"]["legs"][leg]["landings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (text(&l["fate"]), text(&l["dnat"]), text(&l["pod"]), text(&l["pod_node"]), !l["masquerade"].is_null())
        })
        .collect()
}

/// The landing a trace followed in leg `leg`.
fn followed(trace: &serde_json::Value, leg: usize) -> (String, String, String, String, bool) {
    let index = trace["road"]["legs"][leg]["followed"].as_u64().expect("a followed landing") as usize;
    landings(trace, leg).swap_remove(index)
}

/// `roadkeeper trace` against the lab: each kind of frontend, a name, both policies, a Service
/// without endpoints; the real answer always one the trace predicted.
fn trace_the_road(lab: &TestLab, pod: &str) {
    let agrees = |t: &serde_json::Value| assert_eq!(t["answer"]["agrees"], true, "{t:#}");
    let frontend = |t: &serde_json::Value| t["road"]["legs"][0]["service"]["frontend"].as_str().unwrap().to_owned();
    let answered = |t: &serde_json::Value| format!("default/{}", t["answer"]["pod"].as_str().unwrap());

    // The visitor through the LoadBalancer address: the Ingress rule, then the backend pod.
    let lb = lab.ingress_ip();
    let t = lab.trace(&format!("http://{lb}/hello"), &[]);
    agrees(&t);
    assert_eq!(t["answer"]["status"], 200);
    assert_eq!(frontend(&t), format!("LoadBalancer {lb}:80"));
    assert_eq!(t["road"]["ingress"]["rule"], "default/hello spec.rules[0].http.paths[0]");
    assert!(followed(&t, 0).2.starts_with("kube-system/roadkeeper-ingress-"), "{t:#}");
    assert_eq!(followed(&t, 1).2, answered(&t), "the backend leg lands on the pod that answered");

    // A NodePort of node-1, from the client.
    let services = lab.ok(&["get", "services", "-n", "kube-system"]);
    let ports = services
        .lines()
        .find(|l| l.starts_with("roadkeeper-ingress "))
        .unwrap()
        .split_whitespace()
        .nth(4)
        .unwrap()
        .to_owned();
    let node_port = ports.split(',').next().unwrap().split(':').nth(1).unwrap().trim_end_matches("/TCP").to_owned();
    let t = lab.trace(&format!("http://192.168.77.11:{node_port}/hello"), &[]);
    agrees(&t);
    assert_eq!(t["road"]["legs"][0]["node"], "node-1");
    assert_eq!(frontend(&t), format!("NodePort 192.168.77.11:{node_port}"));

    // A ClusterIP from a pod, and the Service's name through the cluster DNS.
    let services = lab.ok(&["get", "services"]);
    let cluster_ip =
        services.lines().find(|l| l.starts_with("hello ")).unwrap().split_whitespace().nth(2).unwrap().to_owned();
    let t = lab.trace(&format!("http://{cluster_ip}/"), &["--from", pod]);
    agrees(&t);
    assert_eq!(frontend(&t), format!("ClusterIP {cluster_ip}:80"));
    assert_eq!(landings(&t, 0).len(), 3, "{t:#}");
    assert!(landings(&t, 0).iter().any(|l| l.2 == answered(&t)));
    let t = lab.trace("http://hello.default.svc.cluster.local/", &["--from", pod]);
    agrees(&t);
    assert_eq!(t["road"]["dns"]["address"], cluster_ip.as_str());

    // externalTrafficPolicy: Local: only the entry node's own pods, the client's address kept.
    let local_ip =
        services.lines().find(|l| l.starts_with("web-local ")).unwrap().split_whitespace().nth(3).unwrap().to_owned();
    let t = lab.trace(&format!("http://{local_ip}/"), &[]);
    agrees(&t);
    assert_eq!(t["road"]["legs"][0]["service"]["policy"], "externalTrafficPolicy: Local");
    let node = t["road"]["legs"][0]["node"].as_str().unwrap().to_owned();
    assert!(landings(&t, 0).iter().all(|l| l.3 == node && !l.4), "{t:#}");
    assert!(t["answer"]["seen_source"].as_str().unwrap().starts_with("198.51.100.10:"), "{t:#}");

    // To the internet: no rule of ours, the pod network's masquerading to the node's address.
    let t = lab.trace("http://203.0.113.10/", &["--from", pod]);
    assert_eq!((&t["answer"]["status"], &t["answer"]["host"]), (&200.into(), &"internet".into()), "{t:#}");
    assert_eq!(
        landings(&t, 0).iter().map(|l| (l.0.as_str(), l.1.as_str(), l.4)).collect::<Vec<_>>(),
        [("delivered", "", false)]
    );
    let node_ip = ["192.168.77.11", "192.168.77.12"][usize::from(t["road"]["legs"][0]["node"] == "node-2")];
    assert!(
        t["answer"]["note"].as_str().unwrap().contains(&format!("masqueraded to {node_ip} by the lab's pod network")),
        "{t:#}"
    );

    // A Service without endpoints: rejected by the rules, refused for real (curl: could not
    // connect, at once).
    let t = lab.trace("http://nobody/", &["--from", pod]);
    assert!(landings(&t, 0).iter().all(|l| l.0 == "rejected"), "{t:#}");
    assert!(t["answer"]["status"].is_null() && t["answer"]["error"].as_str().unwrap().contains("curl: (7)"), "{t:#}");
}

/// The whole tutorial in one proxy mode.
fn walk_the_road(mode: &str) {
    let lab = TestLab::new();
    std::fs::write(lab.manifests.join("traced.yaml"), TRACED_SERVICES).unwrap();
    let up = lab.up(mode, "2");
    for station in ["visitor", "Ingress", "Service", "node proxy", "node ", "pod ", "container", "DNS", "SNAT"] {
        assert!(up.contains(&format!("  {station}")), "station {station} missing from:\n{up}");
    }
    if mode == "ebpf" {
        for station in ["at the node's NIC (tc program rk_from_outside)", "at its socket, once, at connect()"] {
            assert!(up.contains(station), "{station:?} missing from:\n{up}");
        }
        // Only the nodes' pods are translated: their processes are in their node's cgroup.
        let cgroup = |node: &str| lab.dir.path().join("bpf").join(node);
        assert!(cgroup("node-1").exists() && cgroup("node-2").exists());
        let procs = std::fs::read_to_string(
            roadkeeper_lab::node_cgroups::cgroup(&lab.dir.id(), "node-1").unwrap().join("cgroup.procs"),
        )
        .unwrap();
        assert!(procs.lines().count() >= 1, "node-1's pods are in its cgroup: {procs:?}");
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert!(!own.contains("roadkeeper-lab-"), "the test process is not: {own}");
    }
    let hello = lab.pods("app=hello");
    assert_eq!(hello.len(), 3, "{hello:?}");

    // The visitor: the client's request to the ingress answers from one of the pods, with
    // the page the pods serve.
    let page =
        lab.ok(&["exec", "client", "--", "curl", "-s", "-D", "-", &format!("http://{}/hello", lab.ingress_ip())]);
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("Hello from the road's end"), "{page}");
    let answered = page.lines().find_map(|l| l.strip_prefix("x-pod-name: ")).unwrap().trim().to_owned();
    assert!(hello.contains(&answered), "{answered} is not one of {hello:?}");

    // From a pod: the Service's name resolves through the lab's DNS, and it answers.
    let pod = &hello[0];
    let services = lab.ok(&["get", "services"]);
    let cluster_ip =
        services.lines().find(|l| l.starts_with("hello ")).unwrap().split_whitespace().nth(2).unwrap().to_owned();
    let resolved = lab.ok(&["exec", pod, "--", "getent", "hosts", "hello.default.svc.cluster.local"]);
    assert_eq!(resolved.split_whitespace().next(), Some(cluster_ip.as_str()), "{resolved}");
    let by_name = lab.ok(&[
        "exec",
        pod,
        "--",
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %header{x-pod-name}",
        "http://hello/",
    ]);
    assert!(by_name.starts_with("200 hello-"), "{by_name}");
    // A UDP Service by name: the echo pod answers with its name.
    let echo =
        lab.ok(&["exec", pod, "--", "bash", "-c", "exec 3<>/dev/udp/echo/53; echo hi >&3; timeout 2 head -c 30 <&3"]);
    assert!(echo.starts_with("echo-"), "{echo:?}");
    // The container's files, in the pod only.
    assert_eq!(
        lab.ok(&["exec", pod, "--", "ls", "/usr/share/nginx/html"]).split_whitespace().collect::<Vec<_>>(),
        ["hello", "index.html"]
    );
    assert_eq!(lab.ok(&["exec", pod, "--", "hostname"]).trim(), pod);

    trace_the_road(&lab, pod);

    // SNAT: the internet host sees the pod's node, not the pod.
    let node = lab.pod_column(pod, 6);
    let node_ip = lab
        .ok(&["get", "nodes", "-o", "wide"])
        .lines()
        .find(|l| l.starts_with(&format!("{node} ")))
        .unwrap()
        .split_whitespace()
        .nth(5)
        .unwrap()
        .to_owned();
    let seen = lab.ok(&["exec", pod, "--", "curl", "-s", "http://203.0.113.10/"]);
    assert!(seen.contains(&format!(" from {node_ip}:")), "{seen} (pod on {node} at {node_ip})");

    // Scale 3 -> 5 -> 3: five endpoints, and in iptables mode 11 -> 17 -> 11 rules per node.
    if mode == "iptables" {
        lab.assert_nat_rules(11);
    }
    assert_eq!(lab.ok(&["scale", "deployment/hello", "--replicas=5"]).trim(), "deployment.apps/hello scaled");
    // As kubectl scale: the live state changes, the manifest does not.
    assert!(std::fs::read_to_string(lab.manifests.join("hello.yaml")).unwrap().contains("  replicas: 3\n"));
    assert_eq!(lab.hello_endpoints().len(), 5);
    assert!(lab.ok(&["get", "endpointslices"]).contains(" + 2 more..."));
    if mode == "iptables" {
        lab.assert_nat_rules(17);
    }
    lab.ok(&["scale", "deployment/hello", "--replicas=3"]);
    assert_eq!(lab.pods("app=hello").len(), 3);
    if mode == "iptables" {
        lab.assert_nat_rules(11);
    }

    // The relabelled pod leaves the EndpointSlice and gets no more traffic; the Deployment
    // replaces it.
    let relabelled = lab.pods("app=hello")[0].clone();
    let ip = lab.pod_column(&relabelled, 5);
    assert_eq!(
        lab.ok(&["label", "pod", &relabelled, "app=removed", "--overwrite"]).trim(),
        format!("pod/{relabelled} labeled")
    );
    assert_eq!(lab.pods("app=removed"), std::slice::from_ref(&relabelled));
    let labels = lab.ok(&["get", "pods", "--show-labels"]);
    let row = labels.lines().find(|l| l.starts_with(&format!("{relabelled} "))).unwrap();
    assert!(row.ends_with(" app=removed,pod-template-hash=877f6878"), "{labels}");
    assert!(!lab.hello_endpoints().contains(&ip));
    assert_eq!(lab.hello_endpoints().len(), 3);
    let answers = lab.answers_through_ingress(12);
    assert!(!answers.contains(&relabelled), "{relabelled} still answers: {answers:?}");
    // The trace agrees: the relabelled pod is no endpoint, no path lands on it.
    let t = lab.trace(&format!("http://{}/hello", lab.ingress_ip()), &[]);
    assert_eq!(t["answer"]["agrees"], true, "{t:#}");
    assert!(
        !t["road"]["ingress"]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().starts_with(&format!("{ip}:")))
    );
    let t = lab.trace("http://hello/", &["--from", &relabelled]);
    assert!(!landings(&t, 0).iter().any(|l| l.2 == format!("default/{relabelled}")), "{t:#}");
    assert_eq!(landings(&t, 0).len(), 3);
    let refused = lab.run(&["label", "pod", &relabelled, "app=again"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("already has a value (removed), and --overwrite is false")
    );

    // The folder stays watched: an edit of replicas changes the lab within two seconds.
    let file = lab.manifests.join("hello.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("replicas: 3", "replicas: 2")).unwrap();
    assert!(eventually(Duration::from_secs(2), || lab.pods("app=hello").len() == 2), "{:?}", lab.pods("app=hello"));
    // And an edit of the pod template's labels rolls the pods within two seconds.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("        app: hello\n", "        app: hello\n        tier: web\n")).unwrap();
    assert!(eventually(Duration::from_secs(2), || lab.pods("tier=web").len() == 2), "{:?}", lab.pods("tier=web"));

    let down = lab.ok(&["down"]);
    assert!(down.starts_with("Removed "), "{down}");
    lab.assert_nothing_left();
}

#[test]
fn the_road_walked_in_iptables_mode() {
    walk_the_road("iptables");
}

#[test]
fn the_road_walked_in_nftables_mode() {
    walk_the_road("nftables");
}

/// eBPF mode: the same tutorial, each node's socket programs on a cgroup of its own that its
/// pods' processes (and `lab exec` into them) join, the walk naming where addresses are
/// translated; nothing left after `lab down` (cgroups and bpffs mounts included).
#[test]
fn the_road_walked_in_ebpf_mode() {
    walk_the_road("ebpf");
}

#[test]
fn down_after_kill_9_of_the_controller_or_of_lab_up_leaves_nothing() {
    let lab = TestLab::new();
    lab.up("nftables", "1");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(lab.controller_pid() as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    // SIGKILL takes effect asynchronously: status sees it within a moment.
    let dead = || lab.ok(&["status"]).contains("controller     not running");
    assert!(eventually(Duration::from_secs(2), dead), "{}", lab.ok(&["status"]));
    lab.ok(&["down"]);
    lab.assert_nothing_left();

    // lab up killed while it builds (its controller goes on building): down still finds all.
    let mut up = Command::new(env!("CARGO_BIN_EXE_roadkeeper"))
        .arg("lab")
        .arg("--lab-dir")
        .arg(lab.dir.path())
        .args(["up", lab.manifests.to_str().unwrap(), "--nodes", "2"])
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || !roadkeeper_netlab::netns::names_with_prefix(&lab.dir.prefix())
        .unwrap()
        .is_empty()));
    up.kill().unwrap();
    up.wait().unwrap();
    lab.ok(&["down"]);
    lab.assert_nothing_left();
}

#[test]
fn bad_manifests_are_named_and_never_break_a_running_lab() {
    let lab = TestLab::new();
    // (`lab up` refuses a folder holding them: added once the lab runs.)
    lab.up("nftables", "1");
    std::fs::write(
        lab.manifests.join("bad.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: broken}\nspec:\n  replicas: -1\n  selector: {matchLabels: {app: a}}\n  \
         template: {metadata: {labels: {app: b}}, spec: {containers: [{name: c}]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: far}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}\n",
    )
    .unwrap();
    let named = || lab.ok(&["status"]).contains("bad.yaml: Service default/far: spec.clusterIP:");
    assert!(eventually(Duration::from_secs(5), named), "{}", lab.ok(&["status"]));
    let status = lab.ok(&["status"]);
    assert!(
        status.contains("bad.yaml: Deployment default/broken: spec.replicas: -1 must be greater than or equal to 0"),
        "{status}"
    );
    assert!(
        status.contains("Service default/far: spec.clusterIP: 10.0.0.1 is not in the lab's service range 10.96.0.0/12"),
        "{status}"
    );

    // A broken edit of the running app keeps its last good version: its pods stay.
    let file = lab.manifests.join("hello.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("replicas: 3", "replicas: three")).unwrap();
    assert!(eventually(Duration::from_secs(5), || lab
        .ok(&["status"])
        .contains("hello.yaml: Deployment default/hello")));
    assert_eq!(lab.pods("app=hello").len(), 3);
    assert!(lab.answers_through_ingress(1)[0].starts_with("hello-"));
    std::fs::write(&file, text.replace("replicas: 3", "replicas: 1")).unwrap();
    assert!(eventually(Duration::from_secs(3), || lab.pods("app=hello").len() == 1));
    assert!(!lab.ok(&["status"]).contains("hello.yaml: Deployment"));
}

/// What a manifest must not reach: a document root outside the pod's volumes (`/etc`), and a
/// container of image `roadkeeper` running `lab exec` (a shell in the client that writes outside
/// the lab) or `cleanup`. A document root inside a volume (not the default one) still serves.
fn confined_manifests(lab_dir: &Path, outside: &Path) -> String {
    let escape = format!("echo escaped > {}", outside.display());
    let exec = serde_json::json!([
        "roadkeeper",
        "lab",
        "--lab-dir",
        lab_dir.display().to_string(),
        "exec",
        "client",
        "--",
        "sh",
        "-c",
        escape
    ]);
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: peek}}\nspec:\n  selector: {{matchLabels: {{app: peek}}}}\n  \
         template:\n    metadata: {{labels: {{app: peek}}, annotations: {{lab.roadkeeper.dev/document-root: /etc}}}}\n    \
         spec: {{containers: [{{name: web, image: nginx, ports: [{{containerPort: 80}}]}}]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: peek}}\nspec: {{type: LoadBalancer, selector: {{app: peek}}, ports: [{{port: 80}}]}}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: site}}\ndata: {{index.html: inside the volume}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: site, labels: {{app: site}}, annotations: {{lab.roadkeeper.dev/document-root: /srv/site/sub}}}}\n\
         spec:\n  volumes: [{{name: html, configMap: {{name: site, items: [{{key: index.html, path: sub/index.html}}]}}}}]\n  \
         containers: [{{name: web, image: nginx, ports: [{{containerPort: 80}}], volumeMounts: [{{name: html, mountPath: /srv/site}}]}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: site}}\nspec: {{type: LoadBalancer, selector: {{app: site}}, ports: [{{port: 80}}]}}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: escape}}\nspec:\n  selector: {{matchLabels: {{app: escape}}}}\n  \
         template:\n    metadata: {{labels: {{app: escape}}}}\n    spec: {{containers: [{{name: c, image: roadkeeper, command: {exec}}}]}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: cleaner}}\nspec: {{containers: [{{name: c, image: 'ghcr.io/x/roadkeeper:1', args: [-v, cleanup]}}]}}\n"
    )
}

#[test]
fn a_manifest_does_not_reach_the_host() {
    let lab = TestLab::new();
    let outside = lab._tmp.path().join("escaped");
    std::fs::write(lab.manifests.join("confined.yaml"), confined_manifests(lab.dir.path(), &outside)).unwrap();
    lab.up("nftables", "1");
    let services = lab.ok(&["get", "services"]);
    let address =
        |name: &str| services.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap().split_whitespace().nth(3);
    let get = |name: &str, path: &str| {
        let url = format!("http://{}{path}", address(name).unwrap());
        lab.ok(&["exec", "client", "--", "curl", "-s", "-w", "\n%{http_code}", &url])
    };

    // Nothing was written outside the lab, and the document root /etc is no folder of the
    // pod's: nothing of the host is served; the problem names file, object and field.
    let shadow = get("peek", "/shadow");
    assert!(
        !outside.exists() && shadow.ends_with("\n404") && !shadow.contains("root:"),
        "written outside the lab: {}; /etc/shadow served: {shadow}",
        outside.exists()
    );
    for path in ["/passwd", "/hostname", "/"] {
        assert!(get("peek", path).ends_with("\n404"), "{path}");
    }
    let status = lab.ok(&["status"]);
    assert!(
        status.contains(
            "confined.yaml: Deployment default/peek: spec.template.metadata.annotations[lab.roadkeeper.dev/document-root]: \
             \"/etc\" is not inside a volume mounted in container web"
        ),
        "{status}"
    );
    // A document root inside the pod's volume serves it.
    assert_eq!(get("site", "/"), "inside the volume\n200");

    // Image roadkeeper runs only the components a pod runs: not `lab exec`, not `cleanup`.
    assert!(
        status.contains(
            "confined.yaml: Deployment default/escape: spec.template.spec.containers[0].command: \
             \"lab\" is not run in a lab container"
        ),
        "{status}"
    );
    assert!(
        status.contains(
            "confined.yaml: Pod default/cleaner: spec.containers[0].args: \"cleanup\" is not run in a lab container"
        ),
        "{status}"
    );
    assert!(status.contains("Pod default/cleaner: cannot start: container c: \"cleanup\""), "{status}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(!outside.exists(), "a container wrote {}", outside.display());
}

/// A folder of an app whose manifests are broken: a Service with a bad port, a Deployment with a
/// field Kubernetes does not know, a document that is not YAML, and a StatefulSet (not run by
/// the lab, a notice only); its Ingress routes to the broken Service.
const BROKEN: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replica: 2\n  \
    selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    \
    spec: {containers: [{name: web, image: nginx, ports: [{containerPort: 80}]}]}\n---\n\
    apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}, ports: [{port: 70000, targetPort: 80}]}\n---\n\
    apiVersion: v1\nkind: ConfigMap\nmetadata: {name: [unclosed\n---\n\
    apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\nspec:\n  rules:\n  - http:\n      paths:\n      \
    - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}\n---\n\
    apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec: {selector: {matchLabels: {app: db}}, \
    serviceName: db, template: {metadata: {labels: {app: db}}, spec: {containers: [{name: db, image: postgres}]}}}\n";

#[test]
fn lab_up_with_broken_manifests_fails_at_once_naming_each_problem() {
    let lab = TestLab::with_files(&[("web.yaml", BROKEN)]);
    let started = std::time::Instant::now();
    let output = lab.run(&["up", lab.manifests.to_str().unwrap(), "--nodes", "1"]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "lab up succeeded: {}", String::from_utf8_lossy(&output.stdout));
    assert!(took < Duration::from_secs(10), "lab up took {took:?} to fail:\n{stderr}");
    let file = lab.manifests.join("web.yaml").canonicalize().unwrap().display().to_string();
    for problem in [
        format!("{file}: Deployment default/web: spec.replica: unknown field"),
        format!("{file}: Service default/web: spec.ports[0].port: "),
        format!("{file}: document 3: invalid YAML"),
        format!("{file}: StatefulSet default/db: kind StatefulSet is not run by the lab"),
    ] {
        assert!(stderr.contains(&problem), "{problem:?} missing from:\n{stderr}");
    }
    assert!(!stderr.contains("503"), "{stderr}");
    // Nothing was left behind, and `lab down` has nothing to do.
    lab.assert_nothing_left();
    lab.ok(&["down"]);
}

/// `lab up --proxy-mode ipvs` on a kernel without IPVS (as this machine's) is refused at once,
/// saying why and which modes work, and leaves nothing; where the kernel has IPVS the lab comes
/// up in that mode and walks the road (`tests/vm/run.sh --exec` runs it on Debian 12's kernel).
#[test]
fn lab_up_in_ipvs_mode_runs_where_the_kernel_has_ipvs_and_is_refused_clearly_elsewhere() {
    let lab = TestLab::new();
    let output = lab.run(&["up", lab.manifests.to_str().unwrap(), "--nodes", "1", "--proxy-mode", "ipvs"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if std::path::Path::new("/proc/net/ip_vs").exists() {
        assert!(output.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("proxy mode ipvs"), "{stdout}");
        lab.ok(&["down"]);
        return;
    }
    assert!(!output.status.success(), "lab up succeeded without IPVS: {stdout}");
    for part in ["--proxy-mode ipvs needs a kernel with IPVS", "--proxy-mode nftables"] {
        assert!(stderr.contains(part), "{part:?} missing from:\n{stderr}");
    }
    lab.assert_nothing_left();
}

/// An app with names of its own (Deployment `shop`, Service `storefront` on port 8080, Ingress
/// path `/store`) and a StatefulSet the lab does not run.
const SHOP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shop-site}\ndata: {index.html: the shop}\n---\n\
    apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: shop}\nspec:\n  replicas: 1\n  \
    selector: {matchLabels: {app: shop}}\n  template:\n    metadata: {labels: {app: shop}}\n    \
    spec:\n      containers: [{name: web, image: nginx, ports: [{containerPort: 80}], \
    volumeMounts: [{name: site, mountPath: /usr/share/nginx/html}]}]\n      \
    volumes: [{name: site, configMap: {name: shop-site, items: [{key: index.html, path: store/index.html}]}}]\n\
    ---\napiVersion: v1\nkind: Service\nmetadata: {name: storefront}\n\
    spec: {selector: {app: shop}, ports: [{port: 8080, targetPort: 80}]}\n---\n\
    apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop}\nspec:\n  rules:\n  - http:\n      paths:\n      \
    - {path: /store, pathType: Prefix, backend: {service: {name: storefront, port: {number: 8080}}}}\n---\n\
    apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec: {selector: {matchLabels: {app: db}}, \
    serviceName: db, template: {metadata: {labels: {app: db}}, spec: {containers: [{name: db, image: postgres}]}}}\n";

#[test]
fn a_folder_of_other_names_gets_its_own_hints_and_scale_and_label_act_as_kubectl() {
    let lab = TestLab::with_files(&[("shop.yaml", SHOP)]);
    let up = lab.up("nftables", "1");
    let file = lab.manifests.join("shop.yaml").canonicalize().unwrap();
    let file_text = file.display().to_string();
    // The kind the lab does not run is named, and the lab runs the rest.
    let notice = format!("{file_text}: StatefulSet default/db: kind StatefulSet is not run by the lab");
    assert!(up.contains(&notice), "{up}");
    assert!(lab.ok(&["status"]).contains(&notice));
    // The hints name what the folder holds.
    let lb = lab.ingress_ip();
    for hint in [
        format!("roadkeeper lab exec client -- curl -si http://{lb}/store"),
        "roadkeeper lab scale deployment/shop --replicas=5".to_owned(),
        "grep default/storefront".to_owned(),
        format!("roadkeeper trace http://{lb}/store"),
        "roadkeeper lab exec shop-".to_owned(),
        "-- ls /usr/share/nginx/html".to_owned(),
    ] {
        assert!(up.contains(&hint), "hint {hint:?} missing from:\n{up}");
    }
    assert!(!up.contains("hello"), "{up}");

    // Scaling changes the lab, not the user's file; an edit of replicas there still wins.
    let before = std::fs::read(&file).unwrap();
    assert_eq!(lab.ok(&["scale", "deployment/shop", "--replicas=3"]).trim(), "deployment.apps/shop scaled");
    assert_eq!(lab.pods("app=shop").len(), 3);
    assert_eq!(std::fs::read(&file).unwrap(), before, "lab scale wrote into {file_text}");
    std::fs::write(&file, String::from_utf8(before).unwrap().replace("replicas: 1", "replicas: 2")).unwrap();
    assert!(eventually(Duration::from_secs(3), || lab.pods("app=shop").len() == 2), "{:?}", lab.pods("app=shop"));

    // Labels kubectl refuses are refused, naming the key or value; the pod stays listed.
    let pod = lab.pods("app=shop")[0].clone();
    let long = "x".repeat(64);
    let long_prefix = format!("{}/k=v", ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(63)].join("."));
    for (change, says) in [
        ("Bad_Key!=x", "\"Bad_Key!\""),
        ("a b=c", "\"a b\""),
        (&format!("app={long}") as &str, "invalid label value: \"app=xxxx"),
        (&format!("{long}=v"), "must be no more than 63 characters"),
        (&long_prefix, "prefix part must be no more than 253 characters"),
        ("Bad.Prefix/k=v", "\"Bad.Prefix/k\""),
        ("a=b=c", "invalid label spec: a=b=c"),
    ] {
        let output = lab.run(&["label", "pod", &pod, change, "--overwrite"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(says), "label {change}: {stderr:?} lacks {says:?}");
        assert_eq!(lab.pods("app=shop").len(), 2, "after label {change}");
    }
    assert_eq!(lab.ok(&["label", "pod", &pod, "example.com/tier=web"]).trim(), format!("pod/{pod} labeled"));
    assert_eq!(lab.pods("example.com/tier=web"), [pod]);
    let status = lab.ok(&["status"]);
    assert!(!status.contains("metadata.labels"), "{status}");
}

/// A Deployment `web` serving one file, its Service, and an Ingress routing the host
/// web.example.com to it.
const HOST_INGRESS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-html}\ndata: {index.html: web}\n---\n\
    apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  \
    template:\n    metadata: {labels: {app: web}}\n    spec:\n      volumes: [{name: html, configMap: {name: web-html}}]\n      \
    containers: [{name: nginx, image: nginx, ports: [{containerPort: 80}], \
    volumeMounts: [{name: html, mountPath: /usr/share/nginx/html}]}]\n---\n\
    apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}, ports: [{port: 80}]}\n---\n\
    apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\nspec:\n  ingressClassName: roadkeeper\n  \
    rules: [{host: web.example.com, http: {paths: [{path: /, pathType: Prefix, \
    backend: {service: {name: web, port: {number: 80}}}}]}}]\n";

/// A lab of `manifests` only (not the tutorial's), its `lab up` run: the lab and that output.
fn lab_of(manifests: &str) -> (TestLab, Output) {
    let lab = TestLab::new();
    std::fs::remove_file(lab.manifests.join("hello.yaml")).unwrap();
    std::fs::write(lab.manifests.join("web.yaml"), manifests).unwrap();
    let up = lab.run(&["up", lab.manifests.to_str().unwrap(), "--nodes", "1"]);
    (lab, up)
}

/// `roadkeeper ARGS`: success, standard output, standard error.
fn roadkeeper(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_roadkeeper")).args(args).output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn lab_up_does_not_call_a_road_ending_in_a_404_working() {
    let missing = "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: missing}\nspec:\n  \
        ingressClassName: roadkeeper\n  rules: [{http: {paths: [{path: /missing, pathType: Prefix, \
        backend: {service: {name: web, port: {number: 80}}}}]}}]\n";
    let (_lab, up) = lab_of(&format!("{HOST_INGRESS}{missing}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&up.stdout), String::from_utf8_lossy(&up.stderr));
    assert!(!up.status.success(), "lab up claims the road works:\n{stdout}");
    assert!(stdout.contains("The road, walked just now (it does not work"), "{stdout}");
    // The host's rule serves; the path no file answers is named with its status.
    assert!(stdout.contains("-H 'Host: web.example.com' http://192.168.77.200/ -> 200 from pod web-"), "{stdout}");
    assert!(stdout.contains("http://192.168.77.200/missing -> 404 from pod web-"), "{stdout}");
    assert!(stdout.contains("container     nginx answered /missing with 404"), "{stdout}");
    assert!(!stdout.contains("answered /missing from its files"), "{stdout}");
    assert!(stdout.contains("FAILED: pod web-"), "{stdout}");
    assert!(
        stderr.contains("the road does not work: container: pod web-")
            && stderr.contains("answered /missing, the path of Ingress default/missing's rule, with 404")
            && stderr.contains("The lab stays up"),
        "{stderr}"
    );
}

#[test]
fn trace_follows_a_host_based_ingress_by_its_name_or_a_host_header() {
    let (lab, up) = lab_of(HOST_INGRESS);
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let lb = lab.ingress_ip();
    let routed = |t: &serde_json::Value| {
        assert_eq!(t["road"]["ingress"]["host"], "web.example.com", "{t}");
        assert_eq!(t["road"]["ingress"]["rule"], "default/web spec.rules[0].http.paths[0]", "{t}");
        assert_eq!(t["answer"]["status"], 200, "{t}");
        assert!(t["answer"]["pod"].as_str().unwrap().starts_with("web-"), "{t}");
        assert_eq!(t["answer"]["agrees"], true, "{t}");
    };
    // By name: the Ingress's host resolves to its address, as a user's DNS would.
    for from in ["client", "node-1"] {
        let t = lab.trace("http://web.example.com/", &["--from", from]);
        routed(&t);
        assert_eq!(t["road"]["dns"]["address"], lb.as_str(), "{t}");
        assert!(t["road"]["dns"]["resolver"].as_str().unwrap().contains("Ingress default/web"), "{t}");
        let resolve = format!("--resolve web.example.com:80:{lb} http://web.example.com/");
        assert!(t["answer"]["command"].as_str().unwrap().ends_with(&resolve), "{t}");
    }
    // By address with the Host header, as curl takes it; without it, no rule matches.
    let url = format!("http://{lb}/");
    for flag in ["-H", "--header"] {
        let t = lab.trace(&url, &[flag, "Host: WEB.example.com:80"]);
        routed(&t);
        assert!(t["road"]["dns"].is_null(), "{t}");
        assert_eq!(t["answer"]["command"], format!("curl -sk -H 'Host: WEB.example.com:80' {url}"), "{t}");
    }
    let t = lab.trace(&url, &[]);
    assert!(t["road"]["ingress"]["failure"].as_str().unwrap().contains("404"), "{t}");
    assert_eq!(t["answer"]["status"], 404, "{t}");
    let lab_dir = lab.dir.path().to_str().unwrap();
    let (ok, _, err) = roadkeeper(&["trace", "--lab-dir", lab_dir, "-H", "Host web.example.com", &url]);
    assert!(!ok && err.contains("-H \"Host web.example.com\": not NAME: VALUE"), "{err}");

    // Outside the lab (--from-node, here over the lab's cluster state): this machine's resolver
    // resolves a name, a Host header routes by the address, an unknown node is named.
    let cluster = lab.dir.cluster_dir();
    let cluster = cluster.to_str().unwrap();
    let (ok, out, err) =
        roadkeeper(&["trace", "--from-node", "node-1", "--manifests", cluster, "-o", "json", "http://localhost/"]);
    assert!(ok, "{err}");
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&t["road"]["dns"]["resolver"], &t["road"]["dns"]["address"]),
        (&"this machine's resolver".into(), &"127.0.0.1".into())
    );
    let args =
        ["trace", "--from-node", "node-1", "--manifests", cluster, "-o", "json", "-H", "Host: web.example.com", &url];
    let (ok, out, err) = roadkeeper(&args);
    assert!(ok, "{err}");
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["road"]["ingress"]["rule"], "default/web spec.rules[0].http.paths[0]", "{t}");
    let (ok, _, err) = roadkeeper(&["trace", "--from-node", "node-9", "--manifests", cluster, &url]);
    assert!(!ok && err.contains("--from-node node-9: no such Node (nodes: node-1)"), "{err}");
    let (ok, _, err) =
        roadkeeper(&["trace", "--from-node", "node-9", "--manifests", lab.manifests.to_str().unwrap(), &url]);
    assert!(!ok && err.contains("--from-node node-9: no such Node: the cluster has no Node objects"), "{err}");
}
