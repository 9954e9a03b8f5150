//! Named network namespaces (`ip netns`) that clean up after themselves.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;

use anyhow::{Context, Result};
use nix::sched::{CloneFlags, setns};

use crate::cgroup::NodeCgroup;
use crate::cmd;

/// Where `ip netns` keeps its namespace handles.
const NETNS_DIR: &str = "/var/run/netns";

/// Makes namespace names unique within this process.
static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// A named network namespace, deleted (after killing its spawned processes) on drop, unless it
/// was [`open`](Netns::open)ed or [`disown`](Netns::disown)ed: then it outlives this handle.
pub struct Netns {
    name: String,
    children: Mutex<Vec<Process>>,
    owned: bool,
    /// The node cgroup [`run`](Netns::run)'s threads enter (eBPF mode's tests).
    cgroup: Mutex<Option<Arc<NodeCgroup>>>,
}

/// A process started by [`Netns::spawn`]; it is killed when its namespace is dropped.
#[derive(Clone)]
pub struct Process(Arc<Mutex<Child>>);

impl Netns {
    /// Creates namespace `<prefix>-<pid>-<n>` with its loopback up.
    pub fn new(prefix: &str) -> Result<Self> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Self::create(&format!("{prefix}-{}-{id}", std::process::id()))
    }

    /// Creates namespace `name` (exactly) with its loopback up.
    pub fn create(name: &str) -> Result<Self> {
        cmd::output(Command::new("ip").args(["netns", "add", name]))?;
        let netns = Netns { name: name.to_owned(), children: Mutex::default(), owned: true, cgroup: Mutex::default() };
        netns.ip(["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// A handle on the existing namespace `name`, which dropping it leaves alone.
    pub fn open(name: &str) -> Self {
        Netns { name: name.to_owned(), children: Mutex::default(), owned: false, cgroup: Mutex::default() }
    }

    /// Lets the namespace outlive this handle: dropping it no longer deletes it.
    pub fn disown(mut self) -> Self {
        self.owned = false;
        self
    }

    /// The namespace name as known to `ip netns`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace handle file, `/var/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        path_of(&self.name)
    }

    /// Runs `ip -n <name> args...` (iproute2 configuration of this namespace).
    pub fn ip<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::output(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Runs the `ip` commands (one per line, as `ip -batch` reads them) in this namespace, in one
    /// `ip` process; the first failing one stops it, with its error.
    pub fn ip_batch(&self, commands: &[String]) -> Result<()> {
        let mut command = Command::new("ip");
        command.arg("-n").arg(&self.name).args(["-batch", "-"]);
        cmd::output_with_input(&mut command, &(commands.join("\n") + "\n")).map(drop)
    }

    /// Runs `args` inside the namespace to completion with `input` on its standard input.
    pub fn exec_with_input<I, S>(&self, args: I, input: &str) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::output_with_input(&mut self.command(args), input)
    }

    /// Runs `args` inside the namespace to completion; failure carries stderr.
    pub fn exec<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::output(&mut self.command(args))
    }

    /// Starts `args` inside the namespace (stdin null, stdout/stderr inherited).
    pub fn spawn<I, S>(&self, args: I) -> Result<Process>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.start(self.command(args))
    }

    /// Like [`spawn`](Self::spawn), but stdout and stderr are appended to the file at `log`.
    pub fn spawn_logged<I, S>(&self, args: I, log: &Path) -> Result<Process>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let mut command = self.command(args);
        command.stdout(file.try_clone()?).stderr(file);
        self.start(command)
    }

    /// Starts `command` with stdin null and records it for killing on drop.
    fn start(&self, mut command: Command) -> Result<Process> {
        let child = command.stdin(Stdio::null()).spawn().with_context(|| format!("cannot start {command:?}"))?;
        let process = Process(Arc::new(Mutex::new(child)));
        lock(&self.children).push(process.clone());
        Ok(process)
    }

    /// Runs `f` on a fresh thread that has entered this namespace (and the node cgroup it was
    /// [placed in](Self::place_in), if any), so sockets it creates live here. Panics (on the
    /// caller's thread) if `f` panics or the namespace cannot be entered.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
        let cgroup = lock(&self.cgroup).clone();
        thread::scope(|scope| {
            let worker = scope.spawn(|| {
                enter(&path).unwrap_or_else(|err| panic!("{err:#}"));
                if let Some(cgroup) = &cgroup {
                    cgroup.enter().unwrap_or_else(|err| panic!("{err:#}"));
                }
                f()
            });
            worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// From now on, [`run`](Self::run)'s threads also enter `cgroup`: the namespace is a pod or
    /// host of the node that cgroup stands for (eBPF mode translates its connections).
    pub fn place_in(&self, cgroup: Arc<NodeCgroup>) {
        *lock(&self.cgroup) = Some(cgroup);
    }

    /// Sets sysctl `key` (dotted, e.g. `net.ipv4.ip_forward`) in this namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        self.run(|| fs::write(&path, value))
            .with_context(|| format!("cannot set sysctl {key}={value} in netns {}", self.name))
    }

    /// `ip netns exec <name> args...`, not yet started.
    fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).args(args);
        command
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        for process in lock(&self.children).drain(..) {
            if let Err(err) = process.kill() {
                tracing::warn!(netns = %self.name, "{err:#}");
            }
        }
        if let Err(err) = delete(&self.name) {
            tracing::warn!("{err:#}");
        }
    }
}

/// Deletes namespace `name` (`ip netns del`).
pub fn delete(name: &str) -> Result<()> {
    cmd::output(Command::new("ip").args(["netns", "del", name])).map(drop)
}

/// The names of the namespaces `ip netns` knows that start with `prefix`, sorted.
pub fn names_with_prefix(prefix: &str) -> Result<Vec<String>> {
    let entries = match fs::read_dir(NETNS_DIR) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        entries => entries.with_context(|| format!("cannot list {NETNS_DIR}"))?,
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry.with_context(|| format!("cannot list {NETNS_DIR}"))?.file_name();
        if let Some(name) = name.to_str().filter(|name| name.starts_with(prefix)) {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

impl Process {
    /// The OS process id.
    pub fn id(&self) -> u32 {
        lock(&self.0).id()
    }

    /// Returns the exit status if the process has exited, without waiting.
    pub fn try_wait(&self) -> Result<Option<ExitStatus>> {
        lock(&self.0).try_wait().context("cannot poll child process")
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit; its exit status.
    pub fn terminate(&self, within: std::time::Duration) -> Result<ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).context("cannot send SIGTERM")?;
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("process {} still running {within:?} after SIGTERM", self.id());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Kills the process (if still running) and reaps it.
    pub fn kill(&self) -> Result<()> {
        let mut child = lock(&self.0);
        child.kill().with_context(|| format!("cannot kill process {}", child.id()))?;
        child.wait().context("cannot reap killed process")?;
        Ok(())
    }
}

/// The handle file of namespace `name`, `/var/run/netns/<name>`.
pub fn path_of(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Moves the calling thread into the network namespace at `path`.
fn enter(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    setns(&file, CloneFlags::CLONE_NEWNET).with_context(|| format!("cannot enter netns {}", path.display()))
}

/// Locks `mutex`, ignoring poisoning (cleanup must work after a panic).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
