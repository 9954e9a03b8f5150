//! The state of a lab, as its controller records it in the lab directory: the public API other
//! commands (such as a packet tracer) use to find a lab and enter its hosts.
//!
//! A lab directory holds:
//!
//! | path | what |
//! |---|---|
//! | `state.json` | [`State`]: hosts, pods, processes, allocations (rewritten atomically) |
//! | `config.json` | what `lab up` asked for ([`Config`]) |
//! | `cluster/` | the generated cluster state every component reads with `--manifests` |
//! | `controller.sock` | requests to the lab controller |
//! | `lab.lock` | held (flock) by the running controller |
//! | `logs/` | the controller's and each node proxy's log |
//! | `pods/<uid>/` | per pod: `resolv.conf`, volumes, each container's spec and log |
//!
//! ```no_run
//! use roadkeeper_lab::state::{LabDir, State};
//! let lab = LabDir::resolve(None);
//! let state = State::load(&lab)?;
//! let node = state.host("node-1")?;
//! let target = state.target("node-1", None, None)?;
//! let status = target.command(["iptables-save", "-t", "nat"])?.status();
//! # Ok::<(), roadkeeper_lab::Error>(())
//! ```

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sched::{CloneFlags, setns};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The default lab directory.
pub const DEFAULT_DIR: &str = "/run/roadkeeper/lab";
/// The environment variable naming the lab directory (overridden by `--lab-dir`).
pub const DIR_ENV: &str = "ROADKEEPER_LAB_DIR";
/// The environment variable every process of a lab carries, with the lab's id: how `lab down`
/// finds processes even when the state file is gone.
pub const ID_ENV: &str = "ROADKEEPER_LAB_ID";

/// A lab directory (which need not exist yet).
#[derive(Clone, Debug)]
pub struct LabDir(PathBuf);

impl LabDir {
    /// `flag`, else `$ROADKEEPER_LAB_DIR`, else [`DEFAULT_DIR`], made absolute.
    pub fn resolve(flag: Option<&Path>) -> Self {
        let dir = flag.map(Path::to_owned).or_else(|| std::env::var_os(DIR_ENV).map(PathBuf::from));
        let dir = dir.unwrap_or_else(|| DEFAULT_DIR.into());
        Self(std::path::absolute(&dir).unwrap_or(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The lab's id: a hash of the directory's path, so that labs in different directories
    /// never share a namespace name.
    pub fn id(&self) -> String {
        format!("{:08x}", fnv1a(self.0.as_os_str().as_encoded_bytes()))
    }

    /// The prefix of every namespace of this lab: `rkl-<id>-`.
    pub fn prefix(&self) -> String {
        format!("rkl-{}-", self.id())
    }

    /// `state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.0.join("state.json")
    }

    /// `config.json`.
    pub fn config_file(&self) -> PathBuf {
        self.0.join("config.json")
    }

    /// The generated cluster state folder, `cluster/`.
    pub fn cluster_dir(&self) -> PathBuf {
        self.0.join("cluster")
    }

    /// The controller's socket.
    pub fn socket(&self) -> PathBuf {
        self.0.join("controller.sock")
    }

    /// The controller's lock file.
    pub fn lock_file(&self) -> PathBuf {
        self.0.join("lab.lock")
    }

    /// The logs folder.
    pub fn logs_dir(&self) -> PathBuf {
        self.0.join("logs")
    }

    /// The folder of the pod with this uid.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.0.join("pods").join(uid)
    }
}

/// What `lab up` asked for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Config {
    /// The watched manifest folder (canonical).
    pub manifests: PathBuf,
    /// Number of nodes.
    pub nodes: u8,
    /// `nftables` or `iptables`.
    pub proxy_mode: String,
    /// The roadkeeper binary every process of the lab runs.
    pub binary: PathBuf,
}

impl Config {
    /// The flags every node's `roadkeeper proxy` runs with (besides its name and where it reads
    /// the cluster), as `roadkeeper trace` plans the nodes too.
    pub fn proxy_flags(&self) -> Vec<String> {
        let cidr = roadkeeper_netlab::cluster::CLUSTER_CIDR.to_string();
        ["--proxy-mode", self.proxy_mode.as_str(), "--cluster-cidr", cidr.as_str()].map(String::from).to_vec()
    }
}

/// How far the lab got.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Being built.
    Starting,
    /// Built, every pod and component running.
    Ready,
    /// Building failed; the message says why.
    Failed(String),
    /// Not built: the manifests hold objects the lab refuses ([`State::problems`] names them).
    Refused,
}

/// A lab as its controller records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    /// The lab's id ([`LabDir::id`]).
    pub id: String,
    /// The prefix of every namespace of the lab.
    pub prefix: String,
    /// What `lab up` asked for.
    pub config: Config,
    /// How far the lab got.
    pub phase: Phase,
    /// The lab controller.
    pub controller: Option<ProcessRef>,
    /// Router, nodes, client and internet host.
    pub hosts: Vec<Host>,
    /// Every pod the lab runs, the lab's own (DNS, ingress) included.
    pub pods: Vec<Pod>,
    /// Problems found in the manifest folder, as of the last reading.
    pub problems: Vec<String>,
    /// Addresses and ports handed out to Services.
    pub allocations: crate::alloc::Allocations,
    /// When objects without a `creationTimestamp` were first seen (`Kind ns/name` → RFC 3339).
    pub first_seen: BTreeMap<String, String>,
    /// The number the next pod gets (for names of its namespace and veth).
    pub next_serial: u32,
    /// Deployments scaled by `lab scale` (`namespace/name`), which the lab runs with these
    /// replicas instead of their manifest's.
    #[serde(default)]
    pub scaled: BTreeMap<String, crate::scale::Scaled>,
}

/// What a host is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The router whose bridge joins the nodes.
    Router,
    /// A Kubernetes node.
    Node,
    /// The client outside the cluster.
    Client,
    /// The internet host beyond the router.
    Internet,
}

/// A host of the lab: a network namespace.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Host {
    /// `router`, `node-1`, ..., `client`, `internet`.
    pub name: String,
    /// What it is.
    pub role: Role,
    /// Its network namespace (`ip netns` name).
    pub netns: String,
    /// Its address.
    pub address: Ipv4Addr,
    /// For a node: its pod range.
    pub pod_cidr: Option<ipnet::Ipv4Net>,
    /// Processes running there (a node's proxy, the internet host's web server).
    pub processes: Vec<ProcessRef>,
}

/// A pod: a network namespace on a node, one process per container.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Pod {
    /// Namespace of the Pod object.
    pub namespace: String,
    /// Name of the Pod object.
    pub name: String,
    /// The Pod's uid (its folder in the lab directory).
    pub uid: String,
    /// The lab's number for it (order of creation; names its namespace and veth).
    pub serial: u32,
    /// The node it runs on (a host name).
    pub node: String,
    /// The pod's address.
    pub ip: Ipv4Addr,
    /// Its network namespace.
    pub netns: String,
    /// The node's side of its link.
    pub veth: String,
    /// The Pod's labels (changed by `lab label`).
    pub labels: BTreeMap<String, String>,
    /// For a pod from the manifest folder: its labels there when last read (an edit there
    /// replaces `labels`).
    pub manifest_labels: Option<BTreeMap<String, String>>,
    /// The Deployment owning it and its template hash, if any.
    pub owner: Option<Owner>,
    /// The Pod's spec (from the Deployment's template or the manifest).
    pub spec: roadkeeper_cluster::k8s_openapi::api::core::v1::PodSpec,
    /// The Pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// When it was created (RFC 3339).
    pub created: String,
    /// Whether every container runs and answers on its TCP ports.
    pub ready: bool,
    /// When it last became ready or unready (RFC 3339).
    pub ready_since: String,
    /// Being deleted.
    pub terminating: bool,
    /// Its containers, in spec order.
    pub containers: Vec<Container>,
    /// What went wrong when it was last started or waited for (`lab status` shows them).
    #[serde(default)]
    pub problems: Vec<String>,
}

/// The Deployment that owns a pod.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    /// The Deployment's name (same namespace as the pod).
    pub deployment: String,
    /// The `pod-template-hash` of the ReplicaSet the pod belongs to.
    pub template_hash: String,
}

/// A container: a process in the pod's network namespace, with mounts of its own.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Container {
    /// The container's name.
    pub name: String,
    /// Its process, while it runs.
    pub process: Option<ProcessRef>,
    /// How often it was restarted.
    pub restarts: u32,
    /// When it last exited (RFC 3339), if it did.
    pub last_exit: Option<String>,
}

/// A process of the lab, identified by pid and start time (so that a reused pid is not taken
/// for it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessRef {
    /// What runs (`proxy`, `dns`, a container's name...).
    pub name: String,
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// Its log file.
    pub log: PathBuf,
}

impl ProcessRef {
    /// The running process `pid`, named `name`, logging to `log`; `None` when it is gone.
    pub fn of(name: &str, pid: u32, log: &Path) -> Option<Self> {
        Some(Self { name: name.to_owned(), pid, start_time: start_time(pid)?, log: log.to_owned() })
    }

    /// Whether the process still runs (and is the same one).
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }
}

/// Start time of process `pid` in clock ticks since boot; `None` when there is no such process
/// (or it is a zombie).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields count from its end.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.first() != Some(&"Z")).then(|| fields.get(19)?.parse().ok()).flatten()
}

/// Where a command of `lab exec` (or another tool) runs.
#[derive(Clone, Debug)]
pub enum Target<'a> {
    /// A host: its network namespace.
    Host {
        /// The host.
        host: &'a Host,
        /// Its cgroup, for a node in eBPF mode.
        cgroup: Option<PathBuf>,
    },
    /// A pod's container: the network, mount and UTS namespaces of its process.
    Container {
        /// The pod.
        pod: &'a Pod,
        /// The container.
        container: &'a Container,
        /// Its node's cgroup, in eBPF mode.
        cgroup: Option<PathBuf>,
    },
}

impl State {
    /// Reads the lab's state file.
    pub fn load(lab: &LabDir) -> Result<Self> {
        let path = lab.state_file();
        let text = match std::fs::read(&path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!(
                    "no lab in {} (start one with `roadkeeper lab up`)",
                    lab.path().display()
                )));
            }
            read => read.map_err(Error::io(&path))?,
        };
        serde_json::from_slice(&text).map_err(|err| Error::Invalid(format!("{}: {err}", path.display())))
    }

    /// Writes the state file atomically (a temporary file renamed over it).
    pub fn save(&self, lab: &LabDir) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(|err| Error::Invalid(err.to_string()))?;
        crate::files::write_atomically(&lab.state_file(), &text)
    }

    /// In eBPF mode, node `node`'s cgroup: the one its pods' processes are in.
    pub fn node_cgroup(&self, node: &str) -> Option<PathBuf> {
        (self.config.proxy_mode == "ebpf").then(|| crate::node_cgroups::cgroup(&self.id, node).ok()).flatten()
    }

    /// The nodes, node-1 first.
    pub fn nodes(&self) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(|host| host.role == Role::Node)
    }

    /// The host `name` (`router`, `node-N`, `client`, `internet`).
    pub fn host(&self, name: &str) -> Result<&Host> {
        self.hosts.iter().find(|host| host.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.hosts.iter().map(|host| host.name.as_str()).collect();
            Error::NotFound(format!("no host {name:?} in the lab (hosts: {})", names.join(", ")))
        })
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Result<&Pod> {
        self.pods
            .iter()
            .find(|pod| pod.namespace == namespace && pod.name == name)
            .ok_or_else(|| Error::NotFound(format!("pods \"{name}\" not found in namespace {namespace}")))
    }

    /// Where `name` is: a host, else a pod of `namespace` (default `default`) and its container
    /// (default: the first).
    pub fn target(&self, name: &str, namespace: Option<&str>, container: Option<&str>) -> Result<Target<'_>> {
        if let Ok(host) = self.host(name) {
            let cgroup = (host.role == Role::Node).then(|| self.node_cgroup(&host.name)).flatten();
            return Ok(Target::Host { host, cgroup });
        }
        let pod = self.pod(namespace.unwrap_or("default"), name)?;
        let found = match container {
            Some(wanted) => pod.containers.iter().find(|c| c.name == wanted),
            None => pod.containers.first(),
        };
        let container = found.ok_or_else(|| {
            Error::NotFound(format!("container {:?} not found in pod {}", container.unwrap_or_default(), pod.name))
        })?;
        Ok(Target::Container { pod, container, cgroup: self.node_cgroup(&pod.node) })
    }
}

impl Target<'_> {
    /// The namespace files to enter, network first.
    fn namespaces(&self) -> Result<Vec<(PathBuf, CloneFlags)>> {
        match self {
            Target::Host { host, .. } => {
                Ok(vec![(roadkeeper_netlab::netns::path_of(&host.netns), CloneFlags::CLONE_NEWNET)])
            }
            Target::Container { pod, container, .. } => {
                let process = container.process.as_ref().filter(|p| p.alive()).ok_or_else(|| {
                    Error::NotFound(format!("container {} of pod {} is not running", container.name, pod.name))
                })?;
                let ns = |kind: &str| PathBuf::from(format!("/proc/{}/ns/{kind}", process.pid));
                Ok(vec![
                    (ns("net"), CloneFlags::CLONE_NEWNET),
                    (ns("uts"), CloneFlags::CLONE_NEWUTS),
                    (ns("mnt"), CloneFlags::CLONE_NEWNS),
                ])
            }
        }
    }

    /// `argv` as a command that runs in the target's namespaces (entered between fork and
    /// exec), and in eBPF mode in its node's cgroup.
    pub fn command<I, S>(&self, argv: I) -> Result<Command>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut argv = argv.into_iter();
        let program = argv.next().ok_or_else(|| Error::Invalid("no command given".into()))?;
        let files = self
            .namespaces()?
            .into_iter()
            .map(|(path, kind)| Ok((File::open(&path).map_err(Error::io(&path))?, kind)))
            .collect::<Result<Vec<_>>>()?;
        let cgroup = match self {
            Target::Host { cgroup, .. } | Target::Container { cgroup, .. } => cgroup.as_deref(),
        };
        let joiner = cgroup.map(crate::node_cgroups::joiner).transpose()?;
        let mut command = Command::new(program);
        command.args(argv);
        // SAFETY: setns and write are async-signal-safe; the files were opened before the fork.
        unsafe {
            command.pre_exec(move || {
                for (file, kind) in &files {
                    setns(file, *kind)?;
                }
                if let Some(joiner) = &joiner {
                    crate::node_cgroups::join(joiner)?;
                }
                Ok(())
            });
        }
        Ok(command)
    }

    /// The network namespace file, for running code in the target's network (a thread that
    /// `setns`es into it).
    pub fn netns_path(&self) -> Result<PathBuf> {
        Ok(self.namespaces()?.swap_remove(0).0)
    }
}

/// 32-bit FNV-1a.
pub(crate) fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, &b| (hash ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_dirs_have_their_own_prefix() {
        let a = LabDir::resolve(Some(Path::new("/tmp/lab-a")));
        let b = LabDir::resolve(Some(Path::new("/tmp/lab-b")));
        assert_ne!(a.prefix(), b.prefix());
        assert!(a.prefix().starts_with("rkl-") && a.prefix().len() == 13, "{}", a.prefix());
        assert_eq!(a.cluster_dir(), Path::new("/tmp/lab-a/cluster"));
    }

    #[test]
    fn start_times_tell_processes_apart() {
        let me = ProcessRef::of("test", std::process::id(), Path::new("/dev/null")).unwrap();
        assert!(me.alive());
        assert!(!ProcessRef { start_time: me.start_time + 1, ..me.clone() }.alive());
        assert_eq!(start_time(u32::MAX), None);
    }
}
