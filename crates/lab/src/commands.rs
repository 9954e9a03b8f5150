//! The `lab` commands: `up`, `down`, `status`, `get`, `scale`, `label` and `exec` (thin: they
//! start or ask the controller, read the state, or enter a host).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use roadkeeper_cluster::ManifestSource;

use crate::controller::{Request, ask};
use crate::state::{Config, LabDir, Phase, State};
use crate::table::{self, Options, Resource};
use crate::{Error, Result, checks, hints, labels, process, scale};

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

/// `lab up`: starts the controller, waits until the lab is built and answers, prints it. A
/// folder holding objects the lab refuses (not valid, not readable, asking for addresses it
/// cannot give) builds nothing: the command names them and fails at once, leaving nothing behind.
pub fn up(lab: &LabDir, up: &Up) -> Result<()> {
    let started = Instant::now();
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Invalid("the lab needs root (it creates network namespaces)".into()));
    }
    if !(1..=roadkeeper_netlab::cluster::MAX_NODES).contains(&up.nodes) {
        return Err(Error::Invalid(format!("--nodes must be 1 to {}", roadkeeper_netlab::cluster::MAX_NODES)));
    }
    let tools: &[&str] = match up.proxy_mode.as_str() {
        "nftables" => &["ip", "nft", "getent"],
        "iptables" => &["ip", "nft", "iptables-restore", "getent"],
        "ipvs" => {
            ipvs_available()?;
            &["ip", "nft", "getent", "ipvsadm"]
        }
        "ebpf" => {
            crate::node_cgroups::hierarchy()?;
            &["ip", "nft", "getent"]
        }
        other => {
            return Err(Error::Invalid(format!(
                "--proxy-mode must be nftables, iptables, ipvs or ebpf, not {other:?}"
            )));
        }
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
    let (_child, controller) = process::spawn(&argv, None, None, &log, &lab.id(), true)?;
    let state = loop {
        match State::load(lab) {
            Ok(state) if state.phase == Phase::Ready => break state,
            Ok(State { phase: Phase::Failed(why), .. }) => return Err(failed(lab, &why)),
            Ok(State { phase: Phase::Refused, problems, .. }) => return Err(refused(lab, &problems)),
            _ if !controller.alive() => return Err(failed(lab, "the lab controller exited")),
            _ if started.elapsed() > BUILD_TIMEOUT => return Err(failed(lab, "the lab was not built in time")),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let stations = checks::walk(lab, &state, WALK_TIMEOUT).map_err(|err| {
        let problems = State::load(lab).map(|s| problems_text(&s.problems, true)).unwrap_or_default();
        Error::Controller(format!("{err}\n{problems}{}", stays_up(lab)))
    })?;
    print!("{}", summary(lab, &State::load(lab)?, &stations, started.elapsed()));
    let failed: Vec<String> =
        stations.iter().filter_map(|s| Some(format!("{}: {}", s.name, s.failure.as_ref()?))).collect();
    if !failed.is_empty() {
        return Err(Error::Controller(format!("the road does not work: {}\n{}", failed.join("; "), stays_up(lab))));
    }
    Ok(())
}

/// What a lab whose walk failed leaves: itself, to look around.
fn stays_up(lab: &LabDir) -> String {
    format!(
        "The lab stays up to look around (`roadkeeper lab status`, logs in {}); `roadkeeper lab down` removes it.",
        lab.logs_dir().display()
    )
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

/// The error of a lab whose manifests were refused, naming every problem; the lab is removed.
fn refused(lab: &LabDir, problems: &[String]) -> Error {
    let removed = match down(lab) {
        Ok(_) => "nothing was left behind".to_owned(),
        Err(err) => format!("removing what the controller left failed: {err}"),
    };
    Error::Invalid(format!(
        "the lab was not built: the manifests hold objects the lab refuses, as an API server would.\n{}\
         Fix them and run `roadkeeper lab up` again ({removed}).",
        problems_text(problems, false)
    ))
}

/// `problems` as `lab up` prints them: a header (`note` in it, when the lab runs) and one
/// indented line each; empty when none.
fn problems_text(problems: &[String], runs: bool) -> String {
    if problems.is_empty() {
        return String::new();
    }
    let note = if runs { "; `roadkeeper lab status` lists them while the lab runs" } else { "" };
    let mut out = format!("Problems ({}{note}):\n", problems.len());
    for problem in problems {
        let _ = writeln!(out, "  {problem}");
    }
    out
}

/// For `--proxy-mode ipvs`: loads IPVS and the dummy interface's driver (the nodes' proxies
/// would), and refuses the mode, saying why, when this kernel has no IPVS.
fn ipvs_available() -> Result<(), Error> {
    let loaded = std::process::Command::new("modprobe").args(["-a", "ip_vs", "dummy"]).output();
    // The kernel's IPVS table appears in /proc once IPVS is there (module or built in).
    if std::path::Path::new("/proc/net/ip_vs").exists() {
        return Ok(());
    }
    let why = match loaded {
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(err) => format!("modprobe: {err}"),
    };
    Err(Error::Invalid(format!(
        "--proxy-mode ipvs needs a kernel with IPVS (the ip_vs module), and this one has none ({why}); \
         the lab runs here with --proxy-mode nftables (the default) or iptables"
    )))
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
    let generated = ManifestSource::load(&lab.cluster_dir()).map(|(source, _)| source);
    if let Ok(store) = &generated {
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
    let works = stations.iter().all(|s| s.failure.is_none());
    let _ =
        writeln!(out, "\nThe road, walked just now{}:", if works { "" } else { " (it does not work: FAILED below)" });
    for station in stations {
        let _ = writeln!(out, "  {:<13} {}", station.name, station.seen);
        if let Some(failure) = &station.failure {
            let _ = writeln!(out, "  {:<13} FAILED: {failure}", "");
        }
    }
    if !state.problems.is_empty() {
        let _ = write!(out, "\nThe lab runs the rest. {}", problems_text(&state.problems, true));
    }
    let _ = writeln!(out, "\nTry (the tutorial's command, then the lab's):");
    for (tutorial, lab_command) in
        hints::hints(generated.as_ref().map(|g| g.store()).unwrap_or(&Default::default()), state, lab)
    {
        let _ = writeln!(out, "  {tutorial:<46} {lab_command}");
    }
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
    // eBPF mode's bpffs mounts and node cgroups (before the directory holding the mounts goes).
    crate::node_cgroups::tear_down(lab)?;
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
        Phase::Refused => "refused: the manifests hold objects the lab refuses (below); nothing was built".to_owned(),
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
    let problems: Vec<String> = state.problems.iter().cloned().chain(generated_problems(lab)).collect();
    if !problems.is_empty() {
        let _ = writeln!(out, "\nProblems:");
        for problem in &problems {
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

/// What of the generated cluster state its readers (`lab get`, the proxies, DNS, the Ingress
/// controller) refuse, and so do not see: every object missing from `lab get` is named here.
fn generated_problems(lab: &LabDir) -> Vec<String> {
    match ManifestSource::load(&lab.cluster_dir()) {
        Ok((_, errors)) => errors
            .into_iter()
            .map(|e| format!("the lab's cluster state: {e} (left out of `lab get` and of what every component sees)"))
            .collect(),
        Err(err) => vec![format!("the lab's cluster state cannot be read: {err}")],
    }
}

/// `lab get`: a table as `kubectl get` prints it, or kubectl's "No resources found".
pub fn get(lab: &LabDir, resource: Resource, options: &Options) -> Result<std::result::Result<String, String>> {
    State::load(lab)?;
    let (source, _) = ManifestSource::load(&lab.cluster_dir()).map_err(|err| Error::Invalid(err.to_string()))?;
    Ok(table::table(source.store(), resource, options)
        .ok_or_else(|| table::nothing_found(resource, options.namespace.as_deref())))
}

/// `lab scale deployment/NAME --replicas=N`: runs the Deployment with N replicas, as `kubectl
/// scale` changes the live object: the manifest folder is not written (an edit of `replicas`
/// there wins again); waits until the lab and every node's proxy follow.
pub fn scale(lab: &LabDir, target: &str, namespace: &str, replicas: i32) -> Result<String> {
    let name = scale::deployment_name(target)?;
    if replicas < 0 {
        return Err(Error::Invalid("--replicas must be 0 or more".into()));
    }
    ask(lab, &Request::Scale { namespace: namespace.into(), name: name.into(), replicas })
}

/// `lab label pod NAME KEY=VALUE... [KEY-...]`, checked as kubectl and the API server check it.
pub fn label(lab: &LabDir, namespace: &str, name: &str, changes: &[String], overwrite: bool) -> Result<String> {
    let changes = labels::parse(name, changes)?;
    ask(lab, &Request::Label { namespace: namespace.into(), name: name.into(), changes, overwrite })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_every_object_the_readers_of_the_cluster_state_leave_out() {
        let tmp = tempfile::tempdir().unwrap();
        let lab = LabDir::resolve(Some(tmp.path()));
        let mut state = crate::testing::state(1);
        // A label no reader accepts (however it got there): the pod is left out of `lab get`.
        state.pods.push(crate::testing::pod("web-1", "node-1", [10, 244, 1, 2], &[("Bad_Key!", "x")]));
        state.save(&lab).unwrap();
        let files = crate::render::render(&crate::render::Inputs {
            state: &state,
            services: &[],
            manifests: &Default::default(),
            ingress_classes: &[],
            node_info: &Default::default(),
        });
        let mut tree = crate::files::Tree::create(&lab.cluster_dir()).unwrap();
        tree.sync(files).unwrap();
        let options = Options {
            namespace: None,
            wide: false,
            selector: Default::default(),
            show_labels: false,
            now: SystemTime::now(),
        };
        assert!(get(&lab, Resource::Pods, &options).unwrap().is_err(), "the pod is not listed");
        let status = status(&lab).unwrap();
        let problem =
            status.lines().find(|l| l.contains("the lab's cluster state:")).unwrap_or_else(|| panic!("{status}"));
        assert!(problem.contains("Pod default/web-1: metadata.labels"), "{problem}");
    }
}
