//! The lab's processes: started in a network namespace, marked with the lab's id, found again
//! by that mark or by the namespace they run in, and stopped.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::state::{ID_ENV, ProcessRef};
use crate::{Error, Result};

/// Starts `argv` (stdin null, output appended to `log`), in network namespace `netns` when
/// given, in cgroup `cgroup` when given (eBPF mode: its node's), in a session of its own when
/// `detach`; marked with lab id `id`.
pub fn spawn<S: AsRef<OsStr>>(
    argv: &[S],
    netns: Option<&str>,
    cgroup: Option<&Path>,
    log: &Path,
    id: &str,
    detach: bool,
) -> Result<(Child, ProcessRef)> {
    let (program, args) = argv.split_first().ok_or_else(|| Error::Invalid("empty command".into()))?;
    if let Some(parent) = log.parent() {
        fs::create_dir_all(parent).map_err(Error::io(parent))?;
    }
    let output = fs::OpenOptions::new().create(true).append(true).open(log).map_err(Error::io(log))?;
    let mut command = Command::new(program);
    command.args(args).env(ID_ENV, id).stdin(Stdio::null());
    command.stdout(output.try_clone().map_err(Error::io(log))?).stderr(output);
    let netns_file = match netns {
        Some(name) => {
            let path = roadkeeper_netlab::netns::path_of(name);
            Some(File::open(&path).map_err(Error::io(&path))?)
        }
        None => None,
    };
    let joiner = cgroup.map(crate::node_cgroups::joiner).transpose()?;
    // SAFETY: setns, write and setsid are async-signal-safe; the files were opened before the
    // fork.
    unsafe {
        command.pre_exec(move || {
            if let Some(file) = &netns_file {
                setns(file, CloneFlags::CLONE_NEWNET)?;
            }
            if let Some(joiner) = &joiner {
                crate::node_cgroups::join(joiner)?;
            }
            if detach {
                nix::unistd::setsid()?;
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|err| Error::Invalid(format!("cannot start {}: {err}", program.as_ref().to_string_lossy())))?;
    let name = Path::new(program).file_name().unwrap_or_default().to_string_lossy().into_owned();
    let process = ProcessRef::of(&name, child.id(), log)
        .ok_or_else(|| Error::Invalid(format!("{name} exited at once; see {}", log.display())))?;
    Ok((child, process))
}

/// The pids of processes carrying lab id `id` in their environment.
pub fn marked(id: &str) -> BTreeSet<u32> {
    let mark = format!("{ID_ENV}={id}");
    pids()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == mark.as_bytes()))
        })
        .collect()
}

/// The pids of processes whose network namespace is one of `namespaces` (`ip netns` names).
pub fn in_namespaces(namespaces: &[String]) -> BTreeSet<u32> {
    let inodes: BTreeSet<u64> = namespaces
        .iter()
        .filter_map(|name| fs::metadata(roadkeeper_netlab::netns::path_of(name)).ok().map(|m| m.ino()))
        .collect();
    if inodes.is_empty() {
        return BTreeSet::new();
    }
    pids().filter(|pid| fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| inodes.contains(&m.ino()))).collect()
}

fn pids() -> impl Iterator<Item = u32> {
    let entries = fs::read_dir("/proc").into_iter().flatten().flatten();
    let me = std::process::id();
    entries.filter_map(|entry| entry.file_name().to_str()?.parse().ok()).filter(move |&pid| pid != me)
}

/// Sends `signal` to `pid`, ignoring a process already gone.
pub fn signal(pid: u32, signal: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), signal);
}

/// SIGTERM to the process, SIGKILL if it still runs after `grace`; reaps `child` when given.
pub fn stop(process: &ProcessRef, child: Option<&mut Child>, grace: Duration) {
    if process.alive() {
        signal(process.pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while process.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if process.alive() {
            signal(process.pid, Signal::SIGKILL);
        }
    }
    if let Some(child) = child {
        let _ = child.wait();
    }
}

/// SIGKILLs every pid and waits (at most `within`) until they are gone; the ones left.
pub fn kill_all(pids: &BTreeSet<u32>, within: Duration) -> BTreeSet<u32> {
    for &pid in pids {
        signal(pid, Signal::SIGKILL);
    }
    let deadline = Instant::now() + within;
    loop {
        let left: BTreeSet<u32> = pids.iter().copied().filter(|&pid| crate::state::start_time(pid).is_some()).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
