//! The `lab` commands: `up`, `down`, `status`, `get`, `scale`, `label` and `exec` (thin: they
//! start or ask the controller, read the state, or enter a host).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use roadkeeper_cluster::ManifestSource;

use crate::controller::{Request, ask};
use crate::state::{Config, LabDir, Phase, State};
use crate::table::{self, Options, Resource};
use crate::{Error, Result, checks, process, scale};

/// How long `lab up` waits for the controller to build the lab.
const BUILD_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `lab up` lets the walk take once the lab is built.
const WALK_TIMEOUT: Duration = Duration::from_secs(30);

/// What `lab up` is asked for.
#[derive(Clone, Debug)]
pub struct Up {
    /// The manifest folder.
    pub manifests: PathBuf,
    /// Number of nodes (1-50).
    pub nodes: u8,
    /// `nftables` or `iptables`.
    pub proxy_mode: String,
}

/// `lab up`: starts the controller, waits until the lab is built and answers, prints it.
pub fn up(lab: &LabDir, up: &Up) -> Result<()> {
    let started = Instant::now();
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Invalid("the lab needs root (it creates network namespaces)".into()));
    }
    if !(1..=roadkeeper_netlab::cluster::MAX_NODES).contains(&up.nodes) {
        return Err(Error::Invalid(format!("--nodes must be 1 to {}", roadkeeper_netlab::cluster::MAX_NODES)));
    }
    if !["nftables", "iptables"].contains(&up.proxy_mode.as_str()) {
        return Err(Error::Invalid(format!("--proxy-mode must be nftables or iptables, not {:?}", up.proxy_mode)));
    }
    let tools: &[&str] = if up.proxy_mode == "iptables" {
        &["ip", "nft", "iptables-restore", "getent"]
    } else {
        &["ip", "nft", "getent"]
    };
    for tool in tools {
        if which(tool).is_none() {
            return Err(Error::Invalid(format!(
                "the lab needs `{tool}` (Debian: apt-get install iproute2 nftables iptables libc-bin)"
            )));
        }
    }
    let manifests = up.manifests.canonicalize().map_err(Error::io(&up.manifests))?;
    if let Ok(state) = State::load(lab)
        && state.controller.as_ref().is_some_and(|c| c.alive())
    {
        return Err(Error::Invalid(format!(
            "a lab is already up in {} (roadkeeper lab down first)",
            lab.path().display()
        )));
    }
    if lab.path().exists() || !roadkeeper_netlab::netns::names_with_prefix(&lab.prefix())?.is_empty() {
        println!("Cleaning up what a lab left in {}", lab.path().display());
        down(lab)?;
    }
    std::fs::create_dir_all(lab.logs_dir()).map_err(Error::io(lab.logs_dir()))?;
    let binary = std::env::current_exe().map_err(Error::io("/proc/self/exe"))?;
    let config = Config { manifests, nodes: up.nodes, proxy_mode: up.proxy_mode.clone(), binary: binary.clone() };
    let text = serde_json::to_vec_pretty(&config).map_err(|err| Error::Invalid(err.to_string()))?;
    crate::files::write_atomically(&lab.config_file(), &text)?;
    let log = lab.logs_dir().join("controller.log");
    let argv = [
        binary.display().to_string(),
        "-v".into(),
        "lab".into(),
        "--lab-dir".into(),
        lab.path().display().to_string(),
        "controller".into(),
    ];
    let (_child, controller) = process::spawn(&argv, None, &log, &lab.id(), true)?;
    let state = loop {
        match State::load(lab) {
            Ok(state) if state.phase == Phase::Ready => break state,
            Ok(State { phase: Phase::Failed(why), .. }) => return Err(failed(lab, &why)),
            _ if !controller.alive() => return Err(failed(lab, "the lab controller exited")),
            _ if started.elapsed() > BUILD_TIMEOUT => return Err(failed(lab, "the lab was not built in time")),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let stations = checks::walk(lab, &state, WALK_TIMEOUT).map_err(|err| {
        Error::Controller(format!("{err}\nThe lab stays up to look around (`roadkeeper lab status`, logs in {}); `roadkeeper lab down` removes it.", lab.logs_dir().display()))
    })?;
    print!("{}", summary(lab, &State::load(lab)?, &stations, started.elapsed()));
    Ok(())
}

/// The error of a lab that could not be built, with the end of the controller's log; the lab
/// is removed.
fn failed(lab: &LabDir, why: &str) -> Error {
    let log = std::fs::read_to_string(lab.logs_dir().join("controller.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
    let removed = match down(lab) {
        Ok(_) => "removed what it had built".to_owned(),
        Err(err) => format!("removing it failed too: {err}"),
    };
    Error::Controller(format!("the lab could not be built: {why}\n{}\n({removed})", tail.join("\n")))
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|p| p.is_file())
}

/// What `lab up` prints: what was built, the walk, and what to try.
fn summary(lab: &LabDir, state: &State, stations: &[crate::checks::Station], took: Duration) -> String {
    let mut out = String::new();
    let nodes = state.nodes().count();
    let _ = writeln!(
        out,
        "The lab is up ({:.1} s): {nodes} node(s), proxy mode {}, manifests {} (watched), lab directory {}\n",
        took.as_secs_f64(),
        state.config.proxy_mode,
        state.config.manifests.display(),
        lab.path().display()
    );
    let _ = writeln!(out, "Hosts (network namespaces {}*):", state.prefix);
    for host in &state.hosts {
        let what = match host.role {
            crate::state::Role::Router => {
                "the network joining the nodes (a bridge), routes to the client and the internet host".to_owned()
            }
            crate::state::Role::Node => format!(
                "roadkeeper proxy ({}); pods {}",
                state.config.proxy_mode,
                host.pod_cidr.map(|c| c.to_string()).unwrap_or_default()
            ),
            crate::state::Role::Client => "a host outside the cluster".to_owned(),
            crate::state::Role::Internet => "the internet: a web server on port 80 that says who asked".to_owned(),
        };
        let _ = writeln!(out, "  {:<10} {:<15} {what}", host.name, host.address.to_string());
    }
    if let Ok(store) = ManifestSource::load(&lab.cluster_dir()).map(|(source, _)| source) {
        let options = Options {
            namespace: None,
            wide: true,
            selector: Default::default(),
            show_labels: false,
            now: SystemTime::now(),
        };
        for (title, resource) in [("Pods", Resource::Pods), ("Services", Resource::Services)] {
            if let Some(table) = table::table(store.store(), resource, &options) {
                let _ = writeln!(
                    out,
                    "\n{title} (roadkeeper lab get {} -A -o wide):",
                    if resource == Resource::Pods { "pods" } else { "services" }
                );
                out.push_str(&indent(&table));
            }
        }
    }
    let _ = writeln!(out, "\nThe road, walked just now:");
    for station in stations {
        let _ = writeln!(out, "  {:<13} {}", station.name, station.seen);
    }
    let pod = checks::example_pod(state).map_or("POD", |p| p.name.as_str());
    let lb = state
        .allocations
        .lb_ips
        .get(&format!("{}/{}", crate::system::NAMESPACE, crate::system::INGRESS_SERVICE))
        .map_or("LB-IP".to_owned(), |ip| ip.to_string());
    let tries = [
        ("kubectl get pods -o wide", "roadkeeper lab get pods -o wide".to_owned()),
        ("kubectl get endpointslices", "roadkeeper lab get endpointslices".to_owned()),
        ("curl http://your-domain/hello", format!("roadkeeper lab exec client -- curl -si http://{lb}/hello")),
        (
            "kubectl exec POD -- ls /usr/share/nginx/html",
            format!("roadkeeper lab exec {pod} -- ls /usr/share/nginx/html"),
        ),
        (
            "kubectl scale deployment/hello --replicas=5",
            "roadkeeper lab scale deployment/hello --replicas=5".to_owned(),
        ),
        (
            "kubectl label pod POD app=removed --overwrite",
            format!("roadkeeper lab label pod {pod} app=removed --overwrite"),
        ),
        ("iptables-save -t nat | grep default/hello", rules_command(&state.config.proxy_mode)),
        ("(follow one request down the road)", "roadkeeper trace http://192.168.77.200/hello".to_owned()),
    ];
    let _ = writeln!(out, "\nTry (the tutorial's command, then the lab's):");
    for (tutorial, lab_command) in tries {
        let _ = writeln!(out, "  {tutorial:<46} {lab_command}");
    }
    let _ = writeln!(out, "  {:<46} roadkeeper lab down", "(remove everything)");
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}\n")).collect()
}

/// What `lab down` removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Processes killed.
    pub processes: usize,
    /// Network namespaces deleted.
    pub namespaces: usize,
    /// Whether the lab directory was removed.
    pub directory: bool,
}

/// `lab down`: stops the controller and every process of the lab, deletes its namespaces (found
/// by their prefix) and its directory, also when the state file is gone or stale.
pub fn down(lab: &LabDir) -> Result<Removed> {
    let mut removed = Removed::default();
    if let Ok(state) = State::load(lab)
        && let Some(controller) = state.controller.filter(|c| c.alive())
    {
        process::stop(&controller, None, Duration::from_secs(2));
        removed.processes += 1;
    }
    // Every marked process first (the controller among them, if the state did not name it),
    // twice: none can start another namespace or process after that.
    for _ in 0..2 {
        let marked = process::marked(&lab.id());
        removed.processes += marked.len();
        let left = process::kill_all(&marked, Duration::from_secs(5));
        if !left.is_empty() {
            return Err(Error::Controller(format!("processes {left:?} of the lab do not die")));
        }
    }
    // Then whatever else runs in the lab's namespaces (started there by hand).
    let namespaces = roadkeeper_netlab::netns::names_with_prefix(&lab.prefix())?;
    let strays = process::in_namespaces(&namespaces);
    removed.processes += strays.len();
    let left = process::kill_all(&strays, Duration::from_secs(5));
    if !left.is_empty() {
        return Err(Error::Controller(format!("processes {left:?} in the lab's namespaces do not die")));
    }
    for name in &namespaces {
        roadkeeper_netlab::netns::delete(name)?;
        removed.namespaces += 1;
    }
    let path = lab.path();
    let ours = ["config.json", "state.json", "lab.lock", "logs", "cluster"].iter().any(|f| path.join(f).exists());
    if ours {
        std::fs::remove_dir_all(path).map_err(Error::io(path))?;
        removed.directory = true;
        if path == Path::new(crate::state::DEFAULT_DIR)
            && let Some(parent) = path.parent()
        {
            // The parent goes only if the lab made it and left it empty.
            let _ = std::fs::remove_dir(parent);
        }
    } else if path.exists() && std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none()) {
        std::fs::remove_dir(path).map_err(Error::io(path))?;
        removed.directory = true;
    }
    Ok(removed)
}

/// `lab status`: the lab's phase, hosts, pods and problems.
pub fn status(lab: &LabDir) -> Result<String> {
    let state = State::load(lab)?;
    let mut out = String::new();
    let controller = match &state.controller {
        Some(c) if c.alive() => format!("running (pid {})", c.pid),
        Some(c) => format!("not running (was pid {}); `roadkeeper lab down` cleans up", c.pid),
        None => "unknown".into(),
    };
    let phase = match &state.phase {
        Phase::Starting => "starting".to_owned(),
        Phase::Ready => "ready".to_owned(),
        Phase::Failed(why) => format!("failed: {why}"),
    };
    let _ = writeln!(
        out,
        "lab directory  {}\nphase          {phase}\ncontroller     {controller}\nmanifests      {} (watched)\nproxy mode     {}",
        lab.path().display(),
        state.config.manifests.display(),
        state.config.proxy_mode
    );
    let mut hosts = vec![["HOST", "ADDRESS", "NETNS", "PROCESSES"].map(String::from).to_vec()];
    for host in &state.hosts {
        let processes: Vec<String> = host
            .processes
            .iter()
            .map(|p| format!("{} {}{}", p.name, p.pid, if p.alive() { "" } else { " (exited)" }))
            .collect();
        hosts.push(vec![host.name.clone(), host.address.to_string(), host.netns.clone(), processes.join(", ")]);
    }
    let _ = write!(out, "\n{}", crate::table::align(hosts));
    let mut pods = vec![["POD", "NODE", "IP", "NETNS", "READY"].map(String::from).to_vec()];
    for pod in &state.pods {
        let ready = if pod.terminating {
            "terminating"
        } else if pod.ready {
            "yes"
        } else {
            "no"
        };
        let netns = if pod.netns.is_empty() { "<none>" } else { &pod.netns };
        pods.push(vec![
            format!("{}/{}", pod.namespace, pod.name),
            pod.node.clone(),
            pod.ip.to_string(),
            netns.to_owned(),
            ready.to_owned(),
        ]);
    }
    let _ = write!(out, "\n{}", crate::table::align(pods));
    if !state.problems.is_empty() {
        let _ = writeln!(out, "\nProblems:");
        for problem in &state.problems {
            let _ = writeln!(out, "  {problem}");
        }
    }
    let _ = writeln!(
        out,
        "\nLogs: {} (controller, proxies), {}/<uid>/<container>.log (pods)",
        lab.logs_dir().display(),
        lab.path().join("pods").display()
    );
    Ok(out)
}

/// `lab get`: a table as `kubectl get` prints it, or kubectl's "No resources found".
pub fn get(lab: &LabDir, resource: Resource, options: &Options) -> Result<std::result::Result<String, String>> {
    State::load(lab)?;
    let (source, _) = ManifestSource::load(&lab.cluster_dir()).map_err(|err| Error::Invalid(err.to_string()))?;
    Ok(table::table(source.store(), resource, options)
        .ok_or_else(|| table::nothing_found(resource, options.namespace.as_deref())))
}

/// `lab scale deployment/NAME --replicas=N`: writes the replicas into the manifest defining the
/// Deployment, then waits until the lab (and every node's proxy) follows.
pub fn scale(lab: &LabDir, target: &str, namespace: &str, replicas: i32) -> Result<String> {
    let name = ["deployment/", "deployments/", "deploy/", "deployment.apps/"]
        .iter()
        .find_map(|prefix| target.strip_prefix(prefix))
        .ok_or_else(|| Error::Invalid(format!("cannot scale {target:?}: the lab scales deployment/NAME")))?;
    if replicas < 0 {
        return Err(Error::Invalid("--replicas must be 0 or more".into()));
    }
    let state = State::load(lab)?;
    let mut files = Vec::new();
    manifest_files(&state.config.manifests, &mut files, 0)?;
    for file in files {
        let text = match read_small(&file) {
            Some(text) => text,
            None => continue,
        };
        let json = file.extension().is_some_and(|e| e == "json");
        let edited = scale::set_replicas(&text, json, namespace, name, replicas)
            .map_err(|err| Error::Invalid(format!("{}: {err}", file.display())))?;
        if let Some(edited) = edited {
            if edited != text {
                crate::files::write_atomically(&file, edited.as_bytes())?;
            }
            ask(lab, &Request::Reconcile(vec![file]))?;
            return Ok(format!("deployment.apps/{name} scaled"));
        }
    }
    Err(Error::NotFound(format!(
        "deployments.apps \"{name}\" not found in namespace {namespace} (no manifest in {} defines it)",
        state.config.manifests.display()
    )))
}

/// The visible manifest files below `dir` (as the manifest reader finds them), at most 16
/// folders deep.
fn manifest_files(dir: &Path, files: &mut Vec<PathBuf>, depth: usize) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(Error::io(dir))?.flatten().collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type().map_err(Error::io(&path))?;
        if kind.is_dir() && depth < 16 {
            manifest_files(&path, files, depth + 1)?;
        } else if kind.is_file()
            && path.extension().is_some_and(|e| ["yaml", "yml", "json"].contains(&e.to_string_lossy().as_ref()))
        {
            files.push(path);
        }
    }
    Ok(())
}

/// A regular file's text if it has at most [`roadkeeper_cluster::MAX_MANIFEST_BYTES`].
fn read_small(path: &Path) -> Option<String> {
    let metadata = std::fs::metadata(path).ok()?;
    (metadata.is_file() && metadata.len() <= roadkeeper_cluster::MAX_MANIFEST_BYTES)
        .then(|| std::fs::read_to_string(path).ok())
        .flatten()
}

/// `lab label pod NAME KEY=VALUE... [KEY-...]`.
pub fn label(lab: &LabDir, namespace: &str, name: &str, changes: &[String], overwrite: bool) -> Result<String> {
    let (mut set, mut remove) = (BTreeMap::new(), Vec::new());
    for change in changes {
        match change.split_once('=') {
            Some((key, value)) if !key.is_empty() => drop(set.insert(key.to_owned(), value.to_owned())),
            None if change.ends_with('-') && change.len() > 1 => remove.push(change.trim_end_matches('-').to_owned()),
            _ => return Err(Error::Invalid(format!("invalid label change {change:?}: KEY=VALUE or KEY-"))),
        }
    }
    ask(lab, &Request::Label { namespace: namespace.into(), name: name.into(), set, remove, overwrite })
}

/// `lab exec NAME -- CMD...`: replaces this process by `argv` run in the host or container.
pub fn exec(
    lab: &LabDir,
    name: &str,
    namespace: Option<&str>,
    container: Option<&str>,
    argv: &[String],
) -> Result<std::convert::Infallible> {
    use std::os::unix::process::CommandExt;
    let state = State::load(lab)?;
    let mut command = state.target(name, namespace, container)?.command(argv)?;
    let err = command.exec();
    Err(Error::Invalid(format!("cannot run {}: {err}", argv.first().map_or("", String::as_str))))
}

/// The command that shows a node's rules for `default/hello` in `mode`.
fn rules_command(mode: &str) -> String {
    match mode {
        "iptables" => "roadkeeper lab exec node-1 -- iptables-save -t nat | grep default/hello".to_owned(),
        _ => "roadkeeper lab exec node-1 -- nft list ruleset | grep default/hello".to_owned(),
    }
}
