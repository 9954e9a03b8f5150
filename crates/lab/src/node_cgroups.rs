//! eBPF mode in the lab: each node's socket programs attach to a cgroup v2 of that node's own
//! (`roadkeeper-lab-<id>/<node>` below the machine's cgroup v2 hierarchy), which the processes of
//! its pods join, as do `lab exec` into them and the walk's requests from them; no other process
//! of the machine is translated. Each node pins its maps and links in a bpffs of its own
//! (`<lab>/bpf/<node>`). `lab down` removes both.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};

use crate::state::LabDir;
use crate::{Error, Result};

/// Where a machine mounts its cgroup v2 hierarchy: unified first, then hybrid (as the proxy looks).
const HIERARCHIES: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// The machine's cgroup v2 hierarchy.
pub fn hierarchy() -> Result<PathBuf> {
    HIERARCHIES
        .iter()
        .map(PathBuf::from)
        .find(|path| statfs(path).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC))
        .ok_or_else(|| {
            Error::Invalid(format!(
                "--proxy-mode ebpf: no cgroup v2 hierarchy at {} (mount one: mount -t cgroup2 none \
                 /sys/fs/cgroup/unified)",
                HIERARCHIES.join(" or ")
            ))
        })
}

/// The cgroup of the lab of id `id`, parent of its nodes'.
fn lab_cgroup(id: &str) -> Result<PathBuf> {
    Ok(hierarchy()?.join(format!("roadkeeper-lab-{id}")))
}

/// Node `node`'s cgroup (`--cgroup-root` of its proxy) in the lab of id `id`.
pub fn cgroup(id: &str, node: &str) -> Result<PathBuf> {
    Ok(lab_cgroup(id)?.join(node))
}

/// Node `node`'s bpffs (`--bpf-root` of its proxy).
pub fn bpf_root(lab: &LabDir, node: &str) -> PathBuf {
    lab.path().join("bpf").join(node)
}

/// Creates every node's cgroup and mounts its bpffs.
pub fn set_up<'a>(lab: &LabDir, nodes: impl IntoIterator<Item = &'a str>) -> Result<()> {
    for node in nodes {
        let dir = cgroup(&lab.id(), node)?;
        fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        let bpf = bpf_root(lab, node);
        fs::create_dir_all(&bpf).map_err(Error::io(&bpf))?;
        mount(Some("bpf"), &bpf, Some("bpf"), MsFlags::empty(), None::<&str>)
            .map_err(|err| Error::Invalid(format!("mounting a bpffs at {}: {err}", bpf.display())))?;
    }
    Ok(())
}

/// Unmounts whatever is mounted below the lab's directory (its nodes' bpffs), deepest first, so
/// that removing the directory never reaches into a mounted filesystem; then removes the nodes'
/// cgroups (their processes are gone). Nothing there: nothing done.
pub fn tear_down(lab: &LabDir) -> Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(Error::io("/proc/self/mountinfo"))?;
    let mut below: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(lab.path()) && point != lab.path())
        .collect();
    below.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    for point in below {
        umount2(&point, MntFlags::MNT_DETACH)
            .map_err(|err| Error::Invalid(format!("unmounting {}: {err}", point.display())))?;
    }
    let Ok(parent) = lab_cgroup(&lab.id()) else { return Ok(()) };
    let Ok(nodes) = fs::read_dir(&parent) else { return Ok(()) };
    for node in nodes.flatten().filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir())) {
        fs::remove_dir(node.path()).map_err(Error::io(node.path()))?;
    }
    fs::remove_dir(&parent).map_err(Error::io(&parent))
}

/// A handle that moves a child process into `cgroup` between fork and exec ([`join`]): opened
/// before the fork.
pub fn joiner(cgroup: &Path) -> Result<File> {
    let procs = cgroup.join("cgroup.procs");
    OpenOptions::new().write(true).open(&procs).map_err(Error::io(&procs))
}

/// Moves the calling process into the cgroup of `joiner` (writing 0 names the writer itself):
/// async-signal-safe, for `pre_exec`.
pub fn join(joiner: &File) -> std::io::Result<()> {
    nix::unistd::write(joiner, b"0")?;
    Ok(())
}

/// Runs `f` with this process in `cgroup` (sockets `f` creates are that node's), then moves it
/// back where it was.
pub fn within<T>(cgroup: &Path, f: impl FnOnce() -> T) -> Result<T> {
    let own = fs::read_to_string("/proc/self/cgroup").map_err(Error::io("/proc/self/cgroup"))?;
    let back = own
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or_else(|| Error::Invalid("this process is in no cgroup v2".into()))?;
    let back = hierarchy()?.join(back.trim_start_matches('/'));
    let back = joiner(&back)?;
    join(&joiner(cgroup)?).map_err(Error::io(cgroup))?;
    let result = f();
    join(&back).map_err(Error::io(cgroup))?;
    Ok(result)
}
