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
    assert!(std::fs::read_to_string(lab.manifests.join("hello.yaml")).unwrap().contains("  replicas: 5\n"));
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
    std::fs::write(
        lab.manifests.join("bad.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: broken}\nspec:\n  replicas: -1\n  selector: {matchLabels: {app: a}}\n  \
         template: {metadata: {labels: {app: b}}, spec: {containers: [{name: c}]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: far}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}\n",
    )
    .unwrap();
    lab.up("nftables", "1");
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
