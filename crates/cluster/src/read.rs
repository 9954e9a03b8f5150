//! Reading manifest files as untrusted input, and the reader thread that does it off the sync
//! loop.
//!
//! A file in a watched folder may be anything: a FIFO (whose read blocks until a writer comes), a
//! device or a symlink to one (`/dev/zero` reads forever), or just huge. [`read_manifest`] opens
//! non-blocking, checks what it opened is a regular file, reads at most [`MAX_MANIFEST_BYTES`]
//! and parses it. [`Reader`] runs that on its own thread for every changed path (coalesced),
//! retrying reads that failed for a passing reason (out of file descriptors or memory) with
//! backoff, so a file event never stalls the component reading the cluster state.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::parse::{Entry, parse_file};
use crate::{ManifestError, NodePortRange};

/// Largest manifest file read; a larger one is reported and its previous objects are kept.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// First wait before a read that failed for a passing reason is tried again; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// What reading one manifest file gave.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The file is gone: its objects go too.
    Gone,
    /// The file's documents.
    Parsed(Vec<Entry>),
    /// The file cannot be used (not a regular file, too large, not UTF-8, an I/O error): its
    /// previous objects stay.
    Unusable(ManifestError),
    /// Reading failed for a passing reason (EMFILE, ENOMEM, ...): its previous objects stay and it
    /// is read again later.
    Retry(ManifestError),
}

/// One file's read.
#[derive(Debug)]
pub(crate) struct FileRead {
    /// The file.
    pub path: PathBuf,
    /// What reading it gave.
    pub outcome: Outcome,
}

/// Errors that pass: out of descriptors or memory, interrupted, would block.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR)
    ) || e.kind() == io::ErrorKind::OutOfMemory
}

/// Opens `path` without blocking (a FIFO without writer, a terminal) and returns the file only if
/// what was opened is a regular file.
fn open_regular(path: &Path) -> io::Result<Result<File, &'static str>> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if file.metadata()?.is_file() {
        Ok(Ok(file))
    } else {
        Ok(Err("not a regular file (a FIFO, a device, a socket or a symlink to one); skipped"))
    }
}

/// Reads and parses one manifest file (see the module documentation); a Service's NodePorts must
/// be in `node_ports`.
pub(crate) fn read_manifest(path: &Path, node_ports: NodePortRange) -> FileRead {
    let outcome = match read_text(path) {
        Ok(Some(text)) => Outcome::Parsed(parse_file(path, &text, node_ports)),
        Ok(None) => Outcome::Gone,
        Err(outcome) => outcome,
    };
    FileRead { path: path.to_owned(), outcome }
}

/// The file's text; `None` when it does not exist.
fn read_text(path: &Path) -> Result<Option<String>, Outcome> {
    let io_error = |e: io::Error| {
        let error = ManifestError::file(path, e.to_string());
        if is_transient(&e) { Outcome::Retry(error) } else { Outcome::Unusable(error) }
    };
    let file = match open_regular(path) {
        Ok(Ok(file)) => file,
        Ok(Err(why)) => return Err(Outcome::Unusable(ManifestError::file(path, why))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes).map_err(io_error)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        let message =
            format!("larger than the limit of {} MiB for one manifest file; skipped", MAX_MANIFEST_BYTES >> 20);
        return Err(Outcome::Unusable(ManifestError::file(path, message)));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| Outcome::Unusable(ManifestError::file(path, format!("not UTF-8 text: {e}"))))
}

/// Paths waiting to be read, shared by whoever reports changes and the reader thread.
#[derive(Debug, Default)]
struct Pending {
    paths: BTreeSet<PathBuf>,
    closed: bool,
}

/// Where changed paths are handed to the reader: a set (so its size is bounded by the files in
/// the folder, however often they change) and a condition variable.
#[derive(Debug, Clone, Default)]
pub(crate) struct Requests(Arc<(Mutex<Pending>, Condvar)>);

impl Requests {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.0.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Asks for `paths` to be read.
    pub(crate) fn send(&self, paths: impl IntoIterator<Item = PathBuf>) {
        self.lock().paths.extend(paths);
        self.0.1.notify_one();
    }

    /// Stops the reader.
    fn close(&self) {
        self.lock().closed = true;
        self.0.1.notify_one();
    }

    /// Waits until paths are asked for or `deadline` passes; takes them (none at the deadline),
    /// or `None` once closed.
    fn take(&self, deadline: Option<Instant>) -> Option<BTreeSet<PathBuf>> {
        let mut pending = self.lock();
        loop {
            if pending.closed {
                return None;
            }
            if !pending.paths.is_empty() {
                return Some(std::mem::take(&mut pending.paths));
            }
            let wait = match deadline {
                Some(at) => at.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if deadline.is_some() && wait.is_zero() {
                return Some(BTreeSet::new());
            }
            pending = self.0.1.wait_timeout(pending, wait).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
    }
}

/// The reader thread: reads the paths asked for with `read`, sends each batch of reads, and reads
/// again later what failed for a passing reason. Stops when dropped.
#[derive(Debug)]
pub(crate) struct Reader {
    requests: Requests,
    /// Batches of reads, one at a time (the thread waits while one is not taken).
    pub reads: mpsc::Receiver<Vec<FileRead>>,
}

impl Reader {
    /// Starts the thread.
    pub(crate) fn start(read: impl Fn(&Path) -> FileRead + Send + 'static) -> Reader {
        let requests = Requests::default();
        let (tx, reads) = mpsc::channel(1);
        let thread_requests = requests.clone();
        std::thread::Builder::new()
            .name("manifest-reader".into())
            .spawn(move || read_loop(&thread_requests, &tx, read))
            .expect("spawning the manifest reader thread");
        Reader { requests, reads }
    }

    /// Where to ask for reads.
    pub(crate) fn requests(&self) -> &Requests {
        &self.requests
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.requests.close();
    }
}

fn read_loop(requests: &Requests, tx: &mpsc::Sender<Vec<FileRead>>, read: impl Fn(&Path) -> FileRead) {
    // Paths to read again, with when and the wait after that.
    let mut retries: BTreeMap<PathBuf, (Instant, Duration)> = BTreeMap::new();
    loop {
        let next_retry = retries.values().map(|(at, _)| *at).min();
        let Some(mut paths) = requests.take(next_retry) else { return };
        let now = Instant::now();
        let due: Vec<PathBuf> = retries.iter().filter(|(_, (at, _))| *at <= now).map(|(p, _)| p.clone()).collect();
        paths.extend(due);
        if paths.is_empty() {
            continue;
        }
        let mut batch = Vec::with_capacity(paths.len());
        for path in paths {
            let file = read(&path);
            if let Outcome::Retry(error) = &file.outcome {
                let wait = retries.get(&path).map_or(RETRY_FIRST, |(_, wait)| (*wait * 2).min(RETRY_MAX));
                tracing::warn!("{error}; reading it again in {wait:?}");
                retries.insert(path, (Instant::now() + wait, wait));
            } else {
                retries.remove(&path);
            }
            batch.push(file);
        }
        if tx.blocking_send(batch).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn unusable(file: &FileRead) -> String {
        match &file.outcome {
            Outcome::Unusable(e) => e.message.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fifos_devices_and_huge_files_are_skipped_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo.yaml");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let zero = tmp.path().join("zero.yaml");
        symlink("/dev/zero", &zero).unwrap();
        let to_fifo = tmp.path().join("to-fifo.yaml");
        symlink(&fifo, &to_fifo).unwrap();
        for path in [&fifo, &zero, &to_fifo] {
            assert!(
                unusable(&read_manifest(path, NodePortRange::DEFAULT)).starts_with("not a regular file"),
                "{}",
                path.display()
            );
        }
        let huge = tmp.path().join("huge.yaml");
        File::create(&huge).unwrap().set_len(MAX_MANIFEST_BYTES + 1).unwrap();
        assert!(unusable(&read_manifest(&huge, NodePortRange::DEFAULT)).starts_with("larger than the limit of 64 MiB"));
        assert!(matches!(read_manifest(&tmp.path().join("gone.yaml"), NodePortRange::DEFAULT).outcome, Outcome::Gone));
        let good = tmp.path().join("good.yaml");
        std::fs::write(&good, "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n").unwrap();
        assert!(
            matches!(&read_manifest(&good, NodePortRange::DEFAULT).outcome, Outcome::Parsed(entries) if entries.len() == 1)
        );
    }

    static ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

    /// Fails twice with EMFILE, then reads the file.
    fn flaky(path: &Path) -> FileRead {
        if ATTEMPTS.fetch_add(1, Ordering::SeqCst) < 2 {
            let error = ManifestError::file(path, io::Error::from_raw_os_error(libc::EMFILE).to_string());
            return FileRead { path: path.to_owned(), outcome: Outcome::Retry(error) };
        }
        read_manifest(path, NodePortRange::DEFAULT)
    }

    #[tokio::test]
    async fn a_read_that_failed_for_a_passing_reason_is_retried() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.yaml");
        std::fs::write(&path, "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n").unwrap();
        let mut reader = Reader::start(flaky);
        reader.requests().send([path.clone()]);
        let mut outcomes = Vec::new();
        while !matches!(outcomes.last(), Some(Outcome::Parsed(_))) {
            let batch = tokio::time::timeout(Duration::from_secs(5), reader.reads.recv()).await.unwrap().unwrap();
            outcomes.extend(batch.into_iter().map(|f| f.outcome));
        }
        assert!(matches!(outcomes[..], [Outcome::Retry(_), Outcome::Retry(_), Outcome::Parsed(_)]), "{outcomes:?}");
    }
}
