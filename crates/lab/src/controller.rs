//! The lab controller: the background process `lab up` starts (`roadkeeper lab controller`,
//! in a session of its own, logging to `logs/controller.log`). It builds the hosts, runs the
//! pods and the components, keeps the generated cluster state in line with the watched
//! manifest folder, restarts processes that exit, and answers the other lab commands over
//! `controller.sock` (one JSON line each way). It holds `lab.lock` while it runs; `lab down`
//! stops it and removes everything.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant, SystemTime};

use roadkeeper_cluster::{ManifestError, ManifestSource, NamespacedName, Object, Watcher};
use roadkeeper_netlab::{Netns, cluster};
use serde::{Deserialize, Serialize};

use crate::files::Tree;
use crate::render::{Inputs, NodeInfo};
use crate::replicas::Wanted;
use crate::state::{Config, Host, LabDir, Phase, Pod, ProcessRef, Role, State};
use crate::{Error, Result, alloc, confine, container, kinds, labels, process, render, replicas, scale, system};

/// Time a deleted pod keeps serving its connections (as Terminating) before it is stopped.
const GRACE: Duration = Duration::from_secs(1);
/// Time a process has to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a new pod has to answer on its TCP ports.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How often processes are checked.
const TICK: Duration = Duration::from_millis(500);
/// Largest request a command may send.
const MAX_REQUEST: u64 = 64 << 10;
/// The web server of the internet host listens here.
pub const INTERNET_PORT: u16 = 80;
/// The address every node's proxy serves its metrics on (in the node).
const PROXY_METRICS: &str = "127.0.0.1:10249";

/// A request of a lab command.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Change a pod's labels, as `kubectl label pod` does.
    Label {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
        /// The labels set and removed.
        changes: labels::Changes,
        /// Whether existing labels may change.
        overwrite: bool,
    },
    /// Run a Deployment with these replicas (not its manifest's), as `kubectl scale` does.
    Scale {
        /// The Deployment's namespace.
        namespace: String,
        /// The Deployment's name.
        name: String,
        /// The replicas.
        replicas: i32,
    },
}

/// What the controller answers: a message for the user, or why it refused.
pub type Response = std::result::Result<String, String>;

/// Sends `request` to the lab's controller and waits for its answer.
pub fn ask(lab: &LabDir, request: &Request) -> Result<String> {
    let unreachable = |err: std::io::Error| {
        Error::Controller(format!(
            "the lab controller of {} does not answer ({err}); is the lab up?",
            lab.path().display()
        ))
    };
    let mut stream = UnixStream::connect(lab.socket()).map_err(unreachable)?;
    stream.set_read_timeout(Some(Duration::from_secs(120))).map_err(unreachable)?;
    let mut line = serde_json::to_vec(request).map_err(|err| Error::Invalid(err.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(unreachable)?;
    let mut answer = String::new();
    BufReader::new(stream.take(MAX_REQUEST)).read_line(&mut answer).map_err(unreachable)?;
    let response: Response = serde_json::from_str(&answer)
        .map_err(|err| Error::Controller(format!("bad answer from the lab controller: {err}")))?;
    response.map_err(Error::Controller)
}

enum Event {
    Files(Vec<PathBuf>),
    Request(Request, SyncSender<Response>),
}

/// `roadkeeper lab controller`: runs the lab in `lab` until killed.
pub fn run(lab: LabDir) -> Result<()> {
    let lock_path = lab.lock_file();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(Error::io(&lock_path))?;
    nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, err)| {
            Error::Controller(format!("another lab controller runs in {} ({err})", lab.path().display()))
        })
        .and_then(|lock| {
            let config_path = lab.config_file();
            let text = std::fs::read(&config_path).map_err(Error::io(&config_path))?;
            let config: Config = serde_json::from_slice(&text)
                .map_err(|err| Error::Invalid(format!("{}: {err}", config_path.display())))?;
            let mut controller = Controller::start(lab.clone(), config)?;
            let result = controller.serve();
            drop(lock);
            result
        })
}

struct Controller {
    lab: LabDir,
    state: State,
    source: ManifestSource,
    /// Problems of the manifest folder, by file.
    problems: BTreeMap<PathBuf, Vec<String>>,
    /// Problems found while reconciling, as of the last pass.
    reconcile_problems: Vec<String>,
    system: Vec<Object>,
    tree: Tree,
    /// Child processes by their pid (reaped when they exit).
    children: BTreeMap<u32, Child>,
    node_info: NodeInfo,
    events: Receiver<Event>,
    sender: SyncSender<Event>,
    _watcher: Option<Watcher>,
    /// When the generated state last changed.
    last_write: SystemTime,
}

impl Controller {
    fn start(lab: LabDir, config: Config) -> Result<Self> {
        let now = now();
        let me = ProcessRef::of("controller", std::process::id(), &lab.logs_dir().join("controller.log"));
        let state = State {
            id: lab.id(),
            prefix: lab.prefix(),
            config: config.clone(),
            phase: Phase::Starting,
            controller: me,
            hosts: Vec::new(),
            pods: Vec::new(),
            problems: Vec::new(),
            allocations: Default::default(),
            first_seen: BTreeMap::new(),
            next_serial: 0,
            scaled: BTreeMap::new(),
        };
        state.save(&lab)?;
        let (sender, events) = mpsc::sync_channel(64);
        let (source, errors) =
            ManifestSource::load(&config.manifests).map_err(|err| Error::Invalid(err.to_string()))?;
        let mut controller = Controller {
            tree: Tree::create(&lab.cluster_dir())?,
            source,
            lab,
            state,
            problems: BTreeMap::new(),
            reconcile_problems: Vec::new(),
            system: Vec::new(),
            children: BTreeMap::new(),
            node_info: node_info(),
            events,
            sender,
            _watcher: None,
            last_write: SystemTime::UNIX_EPOCH,
        };
        controller.record_problems(&[], errors);
        controller.system = system::objects(&controller.lab.cluster_dir(), cluster::INTERNET_IP);
        let refused = controller.refused_objects();
        if !refused.is_empty() {
            // Nothing is built from a folder the lab refuses part of: `lab up` names the
            // problems and fails at once.
            let (_, _, others) = controller.wanted();
            controller.state.problems = refused.into_iter().chain(others).collect();
            controller.state.phase = Phase::Refused;
            controller.state.save(&controller.lab)?;
            return Err(Error::Invalid(format!(
                "the manifests hold objects the lab refuses:\n  {}",
                controller.state.problems.join("\n  ")
            )));
        }
        if let Err(err) = controller.build() {
            controller.state.phase = Phase::Failed(err.to_string());
            controller.state.save(&controller.lab)?;
            return Err(err);
        }
        tracing::info!(took = ?now.elapsed().unwrap_or_default(), "lab ready");
        Ok(controller)
    }

    /// Builds the hosts, starts the pods and components, and waits for the proxies' first sync.
    fn build(&mut self) -> Result<()> {
        let prefix = self.state.prefix.clone();
        let config = self.state.config.clone();
        let names = cluster::Hosts {
            router: format!("{prefix}router"),
            nodes: (1..=config.nodes).map(|n| format!("{prefix}node-{n}")).collect(),
            client: format!("{prefix}client"),
            internet: format!("{prefix}internet"),
        };
        let host = |name: &str, role, netns: &str, address, pod_cidr| Host {
            name: name.to_owned(),
            role,
            netns: netns.to_owned(),
            address,
            pod_cidr,
            processes: Vec::new(),
        };
        self.state.hosts.push(host("router", Role::Router, &names.router, cluster::ROUTER_IP, None));
        for (n, netns) in (1..).zip(&names.nodes) {
            self.state.hosts.push(host(
                &format!("node-{n}"),
                Role::Node,
                netns,
                cluster::node_ip(n),
                Some(cluster::pod_cidr(n)),
            ));
        }
        self.state.hosts.push(host("client", Role::Client, &names.client, cluster::CLIENT_IP, None));
        self.state.hosts.push(host("internet", Role::Internet, &names.internet, cluster::INTERNET_IP, None));
        let created = now_text();
        let nodes: Vec<String> = self.state.nodes().map(|node| node.name.clone()).collect();
        for node in nodes {
            let key = render::first_seen_key("Node", &NamespacedName::new("", node.as_str()));
            self.state.first_seen.insert(key, created.clone());
        }
        self.state.save(&self.lab)?;
        cluster::build(&names)?;
        if config.proxy_mode == "ebpf" {
            let nodes: Vec<String> = self.state.nodes().map(|node| node.name.clone()).collect();
            crate::node_cgroups::set_up(&self.lab, nodes.iter().map(String::as_str))?;
        }

        let binary = config.binary.display().to_string();
        let internet = [binary.as_str(), "lab", "serve", "--name", "internet", "--tcp", &INTERNET_PORT.to_string()];
        self.start_host_process("internet", &internet)?;
        let sender = self.sender.clone();
        let watcher = roadkeeper_cluster::watch(&config.manifests, Duration::from_millis(200), move |paths| {
            let _ = sender.try_send(Event::Files(paths));
        })
        .map_err(|err| Error::Invalid(err.to_string()))?;
        self._watcher = Some(watcher);
        self.reconcile()?;
        let nodes: Vec<String> = self.state.nodes().map(|node| node.name.clone()).collect();
        for node in &nodes {
            let argv = self.proxy_argv(node);
            self.start_host_process(node, &argv.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        self.wait_for_first_syncs(Duration::from_secs(30))?;
        self.state.phase = Phase::Ready;
        self.state.save(&self.lab)
    }

    fn proxy_argv(&self, node: &str) -> Vec<String> {
        let config = &self.state.config;
        [
            config.binary.display().to_string().as_str(),
            "-v",
            "proxy",
            "--manifests",
            &self.lab.cluster_dir().display().to_string(),
            "--hostname-override",
            node,
            "--metrics-bind-address",
            PROXY_METRICS,
        ]
        .map(String::from)
        .into_iter()
        .chain(config.proxy_flags())
        .chain(self.ebpf_flags(node))
        .collect()
    }

    /// In eBPF mode, where node `node`'s programs attach and pin: its own cgroup and bpffs.
    fn ebpf_flags(&self, node: &str) -> Vec<String> {
        let Some(cgroup) = self.state.node_cgroup(node) else { return Vec::new() };
        let bpf_root = crate::node_cgroups::bpf_root(&self.lab, node);
        vec!["--cgroup-root".into(), cgroup.display().to_string(), "--bpf-root".into(), bpf_root.display().to_string()]
    }

    /// Starts `argv` in host `name`'s network, recorded as one of its processes.
    fn start_host_process(&mut self, name: &str, argv: &[&str]) -> Result<()> {
        let netns = self.state.host(name)?.netns.clone();
        let what = if argv.contains(&"proxy") { "proxy" } else { "web" };
        let log = self.lab.logs_dir().join(format!("{what}-{name}.log"));
        let (child, mut process) = process::spawn(argv, Some(&netns), None, &log, &self.state.id, false)?;
        process.name = what.to_owned();
        self.children.insert(child.id(), child);
        let host = self.state.hosts.iter_mut().find(|h| h.name == name).ok_or_else(|| Error::NotFound(name.into()))?;
        host.processes.retain(|p| p.log != log);
        host.processes.push(process);
        Ok(())
    }

    /// Serves requests and file changes, and supervises processes, until killed.
    fn serve(&mut self) -> Result<()> {
        let listener = UnixListener::bind(self.lab.socket()).map_err(Error::io(self.lab.socket()))?;
        let sender = self.sender.clone();
        std::thread::spawn(move || accept(&listener, &sender));
        loop {
            match self.events.recv_timeout(TICK) {
                Ok(Event::Files(mut paths)) => {
                    // Coalesce what else already waits.
                    while let Ok(Event::Files(more)) = self.events.try_recv() {
                        paths.extend(more);
                    }
                    let (_, errors) = self.source.reload(&paths);
                    self.record_problems(&paths, errors);
                    self.logged(Self::reconcile);
                }
                Ok(Event::Request(request, reply)) => {
                    let response = self.handle(request).map_err(|err| err.to_string());
                    let _ = reply.send(response);
                }
                Err(RecvTimeoutError::Timeout) => self.logged(Self::supervise),
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }

    fn logged(&mut self, step: fn(&mut Self) -> Result<()>) {
        if let Err(err) = step(self) {
            tracing::error!("{err}");
        }
    }

    fn handle(&mut self, request: Request) -> Result<String> {
        let before = self.last_write;
        let message = match request {
            Request::Label { namespace, name, changes, overwrite } => {
                labels::check(&name, &changes)?;
                let pod =
                    self.state.pods.iter_mut().find(|p| p.namespace == namespace && p.name == name && !p.terminating);
                let pod =
                    pod.ok_or_else(|| Error::NotFound(format!("pods \"{name}\" not found in namespace {namespace}")))?;
                let labelled =
                    if labels::apply(&mut pod.labels, &changes, overwrite)? { "labeled" } else { "not labeled" };
                let message = format!("pod/{name} {labelled}");
                self.reconcile()?;
                message
            }
            Request::Scale { namespace, name, replicas } => {
                if replicas < 0 {
                    return Err(Error::Invalid("--replicas must be 0 or more".into()));
                }
                let key = format!("{namespace}/{name}");
                let (deployments, _, _) = self.wanted();
                let deployment = deployments.iter().find(|d| scale::key(d) == key).ok_or_else(|| {
                    Error::NotFound(format!("deployments.apps \"{name}\" not found in namespace {namespace}"))
                })?;
                let scaled = scale::scaled(deployment, replicas);
                self.state.scaled.insert(key, scaled);
                self.reconcile()?;
                format!("deployment.apps/{name} scaled")
            }
        };
        if self.last_write != before {
            self.wait_for_proxies(self.last_write);
        }
        Ok(message)
    }

    fn record_problems(&mut self, paths: &[PathBuf], errors: Vec<ManifestError>) {
        let root = self.source.dir().to_owned();
        if paths.is_empty() {
            self.problems.clear();
        }
        for path in paths {
            self.problems.remove(path);
            if let Ok(canonical) = path.canonicalize() {
                self.problems.remove(&canonical);
            }
        }
        for error in errors {
            tracing::warn!("{error}");
            let file = if error.file.is_absolute() { error.file.clone() } else { root.join(&error.file) };
            self.problems.entry(file).or_default().push(error.to_string());
        }
    }

    /// The objects wanted: the manifests' and the lab's own (which win over a manifest's of the
    /// same identity, named in a problem); what the lab refuses of the manifests' pods and pod
    /// templates is named in a problem too (file, object and field).
    fn wanted(
        &self,
    ) -> (
        Vec<Arc<roadkeeper_cluster::k8s_openapi::api::apps::v1::Deployment>>,
        Vec<roadkeeper_cluster::k8s_openapi::api::core::v1::Service>,
        Vec<String>,
    ) {
        let store = self.source.store();
        let mut problems = Vec::new();
        let mut system_deployments = Vec::new();
        let mut system_services = Vec::new();
        for object in &self.system {
            match object {
                Object::Deployment(d) => system_deployments.push(d.clone()),
                Object::Service(s) => system_services.push(s.clone()),
                _ => {}
            }
        }
        let identity = |meta: &roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
        };
        let reserved_deployments: BTreeSet<_> = system_deployments.iter().map(|d| identity(&d.metadata)).collect();
        let reserved_services: BTreeSet<_> = system_services.iter().map(|s| identity(&s.metadata)).collect();
        let mut deployments = system_deployments;
        for (key, deployment) in store.deployments() {
            if reserved_deployments.contains(&identity(&deployment.metadata)) {
                problems.push(format!("Deployment {key}: the lab runs its own; ignored"));
            } else {
                problems.extend(self.refused(&Object::Deployment(deployment.clone()), &format!("Deployment {key}")));
                deployments.push(deployment.clone());
            }
        }
        for (key, pod) in store.pods() {
            problems.extend(self.refused(&Object::Pod(pod.clone()), &format!("Pod {key}")));
        }
        let mut services: Vec<_> = system_services.iter().map(|s| (**s).clone()).collect();
        for (key, service) in store.services() {
            if reserved_services.contains(&identity(&service.metadata)) {
                problems.push(format!("Service {key}: the lab runs its own; ignored"));
            } else {
                services.push((**service).clone());
            }
        }
        problems.extend(kinds::not_run(&self.source));
        let problems = problems.into_iter().map(|p| self.located(p)).collect();
        (deployments, services, problems)
    }

    /// What of the manifests the lab refuses to run, as the API server would refuse it: objects
    /// that are not valid (or not readable), and Services asking for addresses or ports the lab
    /// cannot give.
    fn refused_objects(&self) -> Vec<String> {
        let (_, services, _) = self.wanted();
        let allocated = alloc::allocate(&Default::default(), &services.iter().collect::<Vec<_>>());
        let services = allocated.problems.into_iter().map(|p| self.located(p));
        self.problems.values().flatten().cloned().chain(services).collect()
    }

    /// `problem` with the manifest file in front when it names an object of the manifests
    /// (`Service ns/name: ...`) without it.
    fn located(&self, problem: String) -> String {
        let store = self.source.store();
        let object = problem.split_once(": ").and_then(|(object, _)| {
            let (kind, key) = object.split_once(' ')?;
            let (namespace, name) = key.split_once('/')?;
            let key = NamespacedName::new(namespace, name);
            match kind {
                "Service" => store.service(&key).cloned().map(Object::Service),
                "Deployment" => {
                    store.deployments().find(|(k, _)| **k == key).map(|(_, d)| Object::Deployment(d.clone()))
                }
                "Pod" => store.pods().find(|(k, _)| **k == key).map(|(_, p)| Object::Pod(p.clone())),
                _ => None,
            }
        });
        match object.and_then(|o| self.source.file_of(&o)) {
            Some(file) => format!("{}: {problem}", file.display()),
            None => problem,
        }
    }

    /// What the lab refuses of a manifest's Pod or Deployment (`name`: its kind and key), as a
    /// manifest error reads: file, object, field and why.
    fn refused(&self, object: &Object, name: &str) -> Vec<String> {
        let file = self.source.file_of(object).unwrap_or(self.source.dir()).display();
        let problems = confine::problems(object).into_iter();
        problems.map(|(field, why)| format!("{file}: {name}: {field}: {why}")).collect()
    }

    /// Makes pods, allocations and the generated state match the manifests.
    fn reconcile(&mut self) -> Result<()> {
        for _pass in 0..3 {
            let (deployments, services, mut problems) = self.wanted();
            let allocated = alloc::allocate(&self.state.allocations, &services.iter().collect::<Vec<_>>());
            self.state.allocations = allocated.allocations;
            problems.extend(allocated.problems.into_iter().map(|p| self.located(p)));
            // `lab scale`'s replicas, until the manifest's change.
            scale::prune(&mut self.state.scaled, deployments.iter().map(|d| &**d));
            let deployments: Vec<_> = deployments.iter().map(|d| scale::apply(d, &self.state.scaled)).collect();
            let store = self.source.store();
            let wanted =
                Wanted { deployments: deployments.iter().collect(), pods: store.pods().map(|(_, p)| p).collect() };
            let now = now_text();
            let nodes: Vec<Host> = self.state.nodes().cloned().collect();
            let changes = replicas::reconcile(&wanted, &self.state.pods, &nodes, self.state.next_serial, &now);
            problems.extend(changes.problems.iter().map(|p| self.located(p.clone())));
            let mut done = changes.create.is_empty() && changes.delete.is_empty();
            for update in changes.update {
                if let Some(pod) =
                    self.state.pods.iter_mut().find(|p| p.namespace == update.namespace && p.name == update.name)
                {
                    *pod = update;
                }
            }
            if let Some(last) = changes.create.iter().map(|p| p.serial).max() {
                self.state.next_serial = last + 1;
            }
            let created = self.create_pods(changes.create);
            self.wait_ready(&created);
            self.publish(&allocated.services, &problems)?;
            if !changes.delete.is_empty() {
                self.delete_pods(&changes.delete)?;
                self.publish(&allocated.services, &problems)?;
                done = false;
            }
            self.reconcile_problems = problems;
            if done {
                break;
            }
        }
        Ok(())
    }

    /// Writes the generated state (and the state file) for these Services.
    fn publish(
        &mut self,
        services: &[roadkeeper_cluster::k8s_openapi::api::core::v1::Service],
        problems: &[String],
    ) -> Result<()> {
        let classes: Vec<_> = self
            .system
            .iter()
            .filter_map(|o| if let Object::IngressClass(c) = o { Some(c.clone()) } else { None })
            .collect();
        let keys = render::first_seen_keys(services, self.source.store(), &classes);
        let now = now_text();
        self.state.first_seen.retain(|key, _| keys.contains(key) || key.starts_with("Node "));
        for key in keys {
            self.state.first_seen.entry(key).or_insert_with(|| now.clone());
        }
        let unready =
            self.state.pods.iter().filter(|pod| !pod.ready && !pod.terminating && !pod.netns.is_empty()).map(|pod| {
                format!(
                    "Pod {}/{}: not ready: a container exited or does not answer on its TCP ports (logs in {})",
                    pod.namespace,
                    pod.name,
                    self.lab.pod_dir(&pod.uid).display()
                )
            });
        let pods: Vec<String> =
            self.state.pods.iter().flat_map(|pod| pod.problems.iter().cloned()).chain(unready).collect();
        self.state.problems = self.problems.values().flatten().chain(problems).cloned().chain(pods).collect();
        let files = render::render(&Inputs {
            state: &self.state,
            services,
            manifests: self.source.store(),
            ingress_classes: &classes,
            node_info: &self.node_info,
        });
        if self.tree.sync(files)? {
            self.last_write = SystemTime::now();
        }
        self.state.save(&self.lab)
    }

    /// Starts each new pod; the ones started (what went wrong is in each pod's `problems`).
    fn create_pods(&mut self, pods: Vec<Pod>) -> Vec<(String, String)> {
        let mut started = Vec::new();
        for mut pod in pods {
            pod.netns = format!("{}pod-{}", self.state.prefix, pod.serial);
            let key = (pod.namespace.clone(), pod.name.clone());
            let mut problems = Vec::new();
            let started_pod = self.start_pod(&mut pod, &mut problems);
            pod.problems = problems;
            match started_pod {
                Ok(()) => started.push(key),
                Err(err) => {
                    let problem = format!("Pod {}/{}: cannot start: {err}", pod.namespace, pod.name);
                    tracing::warn!("{problem}");
                    pod.problems.push(problem);
                    if let Err(err) = roadkeeper_netlab::netns::delete(&pod.netns) {
                        tracing::debug!("{err:#}");
                    }
                    pod.netns.clear();
                }
            }
            // Recorded even when it failed, so that its address stays taken and it is retried
            // only by deleting it.
            self.state.pods.push(pod);
        }
        started
    }

    fn start_pod(&mut self, pod: &mut Pod, problems: &mut Vec<String>) -> Result<()> {
        let node = self.state.host(&pod.node)?;
        let n = node
            .name
            .strip_prefix("node-")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Error::NotFound(pod.node.clone()))?;
        cluster::add_pod(&node.netns, n, &pod.netns, &pod.veth, pod.ip)?;
        let (specs, volume_problems) =
            container::prepare(&self.lab, &self.state.config.binary, pod, self.source.store())?;
        problems.extend(volume_problems);
        let cgroup = self.state.node_cgroup(&pod.node);
        for (container, spec) in pod.containers.iter_mut().zip(specs) {
            let process = self.start_container(pod.uid.as_str(), &container.name, &spec, cgroup.as_deref())?;
            container.process = Some(process);
        }
        Ok(())
    }

    /// Starts a container's runner, in `cgroup` when given (its node's, in eBPF mode).
    fn start_container(&mut self, uid: &str, name: &str, spec: &Path, cgroup: Option<&Path>) -> Result<ProcessRef> {
        let binary = self.state.config.binary.display().to_string();
        let argv = [binary.as_str(), "lab", "container", &spec.display().to_string()];
        let log = self.lab.pod_dir(uid).join(format!("{name}.log"));
        let (child, mut process) = process::spawn(&argv, None, cgroup, &log, &self.state.id, false)?;
        process.name = name.to_owned();
        self.children.insert(child.id(), child);
        Ok(process)
    }

    /// Waits until the pods answer on their containers' TCP ports; marks them ready.
    fn wait_ready(&mut self, pods: &[(String, String)]) {
        let deadline = Instant::now() + READY_TIMEOUT;
        for (namespace, name) in pods {
            let Some(pod) = self.state.pods.iter_mut().find(|p| &p.namespace == namespace && &p.name == name) else {
                continue;
            };
            let ports: Vec<u16> = pod
                .spec
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
                .filter_map(|p| u16::try_from(p.container_port).ok())
                .collect();
            let ready = answers(&pod.netns, pod.ip, &ports, deadline);
            let alive = pod.containers.iter().all(|c| c.process.as_ref().is_some_and(ProcessRef::alive));
            pod.ready = ready && alive;
            pod.ready_since = now_text();
        }
    }

    /// Deletes pods as Kubernetes does: Terminating first (no new connections), then stopped
    /// after the grace period, their namespaces and files removed.
    fn delete_pods(&mut self, keys: &[(String, String)]) -> Result<()> {
        let doomed = |p: &Pod| keys.iter().any(|(ns, name)| &p.namespace == ns && &p.name == name);
        for pod in self.state.pods.iter_mut().filter(|p| doomed(p)) {
            pod.terminating = true;
            pod.ready = false;
            pod.ready_since = now_text();
        }
        let (deployments, services, problems) = self.wanted();
        let _ = deployments;
        let allocated = alloc::allocate(&self.state.allocations, &services.iter().collect::<Vec<_>>());
        self.publish(&allocated.services, &problems)?;
        std::thread::sleep(GRACE);
        let (gone, kept): (Vec<Pod>, Vec<Pod>) =
            std::mem::take(&mut self.state.pods).into_iter().partition(|p| doomed(p));
        self.state.pods = kept;
        for pod in gone {
            for process in pod.containers.iter().filter_map(|c| c.process.as_ref()) {
                process::stop(process, self.children.get_mut(&process.pid), STOP_TIMEOUT);
                self.children.remove(&process.pid);
            }
            if !pod.netns.is_empty() {
                roadkeeper_netlab::netns::delete(&pod.netns)?;
            }
            let dir = self.lab.pod_dir(&pod.uid);
            if let Err(err) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("{}: {err}", dir.display());
            }
        }
        Ok(())
    }

    /// Restarts processes that exited (containers: their pod unready meanwhile; proxies).
    fn supervise(&mut self) -> Result<()> {
        let exited: BTreeSet<u32> =
            self.children.iter_mut().filter_map(|(&pid, child)| child.try_wait().ok().flatten().map(|_| pid)).collect();
        if exited.is_empty() {
            return Ok(());
        }
        self.children.retain(|pid, _| !exited.contains(pid));
        let mut restart = Vec::new();
        for pod in &mut self.state.pods {
            for container in &mut pod.containers {
                if container.process.as_ref().is_some_and(|p| exited.contains(&p.pid)) {
                    tracing::warn!(pod = pod.name, container = container.name, "container exited; restarting it");
                    container.process = None;
                    container.restarts += 1;
                    container.last_exit = Some(now_text());
                    pod.ready = false;
                    pod.ready_since = now_text();
                    restart.push((pod.uid.clone(), container.name.clone()));
                }
            }
        }
        let hosts: Vec<(String, Vec<String>)> = self
            .state
            .hosts
            .iter()
            .filter(|h| h.processes.iter().any(|p| exited.contains(&p.pid)))
            .map(|h| {
                (
                    h.name.clone(),
                    h.processes
                        .iter()
                        .filter(|p| exited.contains(&p.pid))
                        .map(|p| p.log.display().to_string())
                        .collect(),
                )
            })
            .collect();
        let (_, services, problems) = self.wanted();
        let allocated = alloc::allocate(&self.state.allocations, &services.iter().collect::<Vec<_>>());
        self.publish(&allocated.services, &problems)?;
        std::thread::sleep(TICK);
        for (name, logs) in hosts {
            tracing::warn!(host = name, ?logs, "a process of the host exited; restarting it");
            let argv = if name == "internet" {
                let binary = self.state.config.binary.display().to_string();
                vec![
                    binary,
                    "lab".into(),
                    "serve".into(),
                    "--name".into(),
                    "internet".into(),
                    "--tcp".into(),
                    INTERNET_PORT.to_string(),
                ]
            } else {
                self.proxy_argv(&name)
            };
            self.start_host_process(&name, &argv.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        let mut restarted = Vec::new();
        for (uid, name) in restart {
            let spec = self.lab.pod_dir(&uid).join(format!("{name}.json"));
            let cgroup = self.state.pods.iter().find(|p| p.uid == uid).and_then(|p| self.state.node_cgroup(&p.node));
            let process = self.start_container(&uid, &name, &spec, cgroup.as_deref())?;
            if let Some(pod) = self.state.pods.iter_mut().find(|p| p.uid == uid) {
                if let Some(container) = pod.containers.iter_mut().find(|c| c.name == name) {
                    container.process = Some(process);
                }
                restarted.push((pod.namespace.clone(), pod.name.clone()));
            }
        }
        self.wait_ready(&restarted);
        let problems = self.reconcile_problems.clone();
        self.publish(&allocated.services, &problems)
    }

    /// Waits until every node's proxy has applied a change of the generated state made at
    /// `since`. The folder's events reach a proxy after a 200 ms debounce, so a sync ending later
    /// than that has read it; a sync that ended earlier may not have, but then the next one
    /// follows within the proxy's 1 s `minSyncPeriod` — so 1.5 s after the change, whatever the
    /// proxy last did includes it.
    fn wait_for_proxies(&self, since: SystemTime) {
        // The proxy has seen changes since the write (queued after it) and synced after the last
        // changes it saw; bounded, for a write that changed nothing a proxy reads.
        let settled = since + Duration::from_secs(3);
        let synced = |times: Option<SyncTimes>| times.is_some_and(|t| t.queued >= since && t.synced >= t.queued);
        for node in self.state.nodes() {
            let netns = Netns::open(&node.netns);
            while SystemTime::now() < settled && !synced(netns.run(sync_times)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Waits until every node's proxy has made its first sync.
    fn wait_for_first_syncs(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        for node in self.state.nodes() {
            let netns = Netns::open(&node.netns);
            while netns.run(sync_times).is_none() {
                if Instant::now() > deadline {
                    return Err(Error::Controller(format!(
                        "the proxy of {} did not sync within {within:?}",
                        node.name
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

/// Accepts command connections one at a time and hands their requests to the main loop.
fn accept(listener: &UnixListener, sender: &SyncSender<Event>) {
    for stream in listener.incoming().flatten() {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        if BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line).is_err() {
            continue;
        }
        let response = match serde_json::from_str::<Request>(&line) {
            Ok(request) => {
                let (reply, answer) = mpsc::sync_channel(1);
                if sender.send(Event::Request(request, reply)).is_err() {
                    return;
                }
                answer.recv().unwrap_or_else(|_| Err("the lab controller stopped".into()))
            }
            Err(err) => Err(format!("bad request: {err}")),
        };
        let mut text = serde_json::to_vec(&response).unwrap_or_default();
        text.push(b'\n');
        let _ = (&stream).write_all(&text);
    }
}

/// Whether the pod answers on every TCP port before `deadline` (tried from inside it).
fn answers(netns: &str, ip: Ipv4Addr, ports: &[u16], deadline: Instant) -> bool {
    Netns::open(netns).run(|| {
        ports.iter().all(|&port| {
            loop {
                if TcpStream::connect_timeout(&SocketAddr::from((ip, port)), Duration::from_millis(200)).is_ok() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    })
}

/// The time of the proxy's last sync, from its metrics (in the node's network).
/// When the node's proxy (its metrics, in the current namespace) last synced and last had
/// changes queued; `None` before its first sync.
struct SyncTimes {
    synced: SystemTime,
    queued: SystemTime,
}

fn sync_times() -> Option<SyncTimes> {
    let address: SocketAddr = PROXY_METRICS.parse().ok()?;
    let response = roadkeeper_netlab::web::get(address, "localhost", "/metrics", Duration::from_secs(1)).ok()?;
    let gauge = |name: &str| {
        let line = response.body.lines().find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ')))?;
        let seconds: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds.max(0.0)))
    };
    let synced = gauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds").filter(|t| *t > SystemTime::UNIX_EPOCH)?;
    let queued = gauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds").unwrap_or(SystemTime::UNIX_EPOCH);
    Some(SyncTimes { synced, queued })
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// Now, as RFC 3339 in whole seconds (as the API server writes times).
pub(crate) fn now_text() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// What the nodes report of their system: this machine's.
fn node_info() -> NodeInfo {
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let os_image = release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    let uname = nix::sys::utsname::uname().ok();
    let kernel = uname.as_ref().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    NodeInfo { os_image, kernel, architecture: architecture.into() }
}
