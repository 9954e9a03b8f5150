//! A node's own cgroup and bpffs for eBPF mode in tests: its socket programs attach to the node's
//! cgroup, never to the machine's, so no other process on the machine connects differently.
//!
//! The lab's pods are threads of the test process (see [`Netns::run`](crate::Netns::run)), so a
//! node's cgroup is a *threaded* cgroup v2: once per process, the process moves to a domain of
//! its own, `rk-test-<pid>` at the hierarchy's root, and each [`NodeCgroup`] is a threaded child
//! of it that a probe thread [enters](NodeCgroup::enter). Both filesystems are mounted in a
//! temporary directory (not under `/sys`, which `ip netns exec` replaces with the namespace's own
//! sysfs), and unmounted on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// Prefix of the per-process domains at the hierarchy's root.
const DOMAIN_PREFIX: &str = "rk-test-";
/// How long a node cgroup's removal waits for the threads that entered it to exit.
const REMOVAL_PATIENCE: Duration = Duration::from_secs(5);

/// One node's cgroup (threaded, below this process's domain) and bpffs, removed on drop.
pub struct NodeCgroup {
    /// The mounts: `cgroup` (a cgroup2 mount of the machine's hierarchy) and `bpf`.
    dir: tempfile::TempDir,
    /// The node's cgroup below `dir/cgroup`.
    path: PathBuf,
}

impl NodeCgroup {
    /// Mounts the hierarchy and a fresh bpffs, and creates cgroup `name` for this node.
    pub fn new(name: &str) -> Result<NodeCgroup> {
        let dir = tempfile::Builder::new().prefix("rk-cgroup-").tempdir().context("temporary directory")?;
        let (cgroup, bpf) = (dir.path().join("cgroup"), dir.path().join("bpf"));
        for (fs_type, at) in [("cgroup2", &cgroup), ("bpf", &bpf)] {
            fs::create_dir(at).with_context(|| format!("creating {}", at.display()))?;
            mount(Some(fs_type), at.as_path(), Some(fs_type), MsFlags::empty(), None::<&str>)
                .with_context(|| format!("mount -t {fs_type} {}", at.display()))?;
        }
        // From here on, drop unmounts whatever fails below.
        let mut node = NodeCgroup { path: PathBuf::new(), dir };
        let domain = process_domain(&cgroup)?;
        node.path = cgroup.join(domain).join(name);
        fs::create_dir(&node.path).with_context(|| format!("creating cgroup {}", node.path.display()))?;
        fs::write(node.path.join("cgroup.type"), "threaded")
            .with_context(|| format!("making {} threaded", node.path.display()))?;
        Ok(node)
    }

    /// The node's cgroup directory (`--cgroup-root`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bpffs mount (`--bpf-root`).
    pub fn bpf_root(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    /// Moves the calling thread into the node's cgroup: the sockets it creates from now on are
    /// the node's. Use it on a thread that ends soon, such as [`Netns::run`](crate::Netns::run)'s.
    pub fn enter(&self) -> Result<()> {
        let tid = nix::unistd::gettid();
        fs::write(self.path.join("cgroup.threads"), tid.to_string())
            .with_context(|| format!("moving thread {tid} into {}", self.path.display()))
    }
}

impl Drop for NodeCgroup {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            // A thread that entered may still be exiting.
            let deadline = Instant::now() + REMOVAL_PATIENCE;
            while fs::remove_dir(&self.path).is_err() && self.path.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for sub in ["cgroup", "bpf"] {
            let _ = umount2(&self.dir.path().join(sub), MntFlags::MNT_DETACH);
        }
    }
}

/// This process's domain below the hierarchy mounted at `root` (`rk-test-<pid>`), made and
/// entered by the first caller; domains of processes that are gone are removed first.
fn process_domain(root: &Path) -> Result<String> {
    static DOMAIN: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    DOMAIN
        .get_or_init(|| make_process_domain(root).map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(|err| anyhow!(err))
}

fn make_process_domain(root: &Path) -> Result<String> {
    sweep_stale_domains(root);
    let name = format!("{DOMAIN_PREFIX}{}", std::process::id());
    let domain = root.join(&name);
    fs::create_dir_all(&domain).with_context(|| format!("creating cgroup {}", domain.display()))?;
    fs::write(domain.join("cgroup.procs"), std::process::id().to_string())
        .with_context(|| format!("moving this process into {}", domain.display()))?;
    Ok(name)
}

/// Removes the (empty) domains, and their node cgroups, of test processes that have exited.
fn sweep_stale_domains(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(DOMAIN_PREFIX) else { continue };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        if let Ok(children) = fs::read_dir(entry.path()) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                let _ = fs::remove_dir(child.path());
            }
        }
        let _ = fs::remove_dir(entry.path());
    }
}
