//! Debounced, recursive watching of the manifest folder.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, EventKind};
use notify::{EventHandler, RecommendedWatcher, RecursiveMode, WatcherKind};
use notify_debouncer_mini::{DebounceEventResult, DebouncedEventKind, Debouncer, new_debouncer_opt};

use crate::Error;
use crate::source::is_manifest;

/// Guard returned by [`watch`]; watching stops when it is dropped.
pub struct Watcher {
    _debouncer: Debouncer<ChangeWatcher>,
}

/// The platform watcher without "file opened" events: on Linux, notify reports every open, so
/// each reload (which reads the changed files) would otherwise trigger the next one, forever.
struct ChangeWatcher(RecommendedWatcher);

impl notify::Watcher for ChangeWatcher {
    fn new<F: EventHandler>(mut handler: F, config: notify::Config) -> notify::Result<Self> {
        let filtered = move |event: notify::Result<notify::Event>| {
            if !matches!(&event, Ok(e) if is_open(&e.kind)) {
                handler.handle_event(event);
            }
        };
        RecommendedWatcher::new(filtered, config).map(ChangeWatcher)
    }

    fn watch(&mut self, path: &Path, recursive_mode: RecursiveMode) -> notify::Result<()> {
        self.0.watch(path, recursive_mode)
    }

    fn unwatch(&mut self, path: &Path) -> notify::Result<()> {
        self.0.unwatch(path)
    }

    fn kind() -> WatcherKind {
        RecommendedWatcher::kind()
    }
}

/// An event that only says a file was opened (read or written later, or not at all).
fn is_open(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(AccessKind::Open(_)))
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watcher")
    }
}

/// Watches `dir` recursively and calls `on_change` with the manifest files (see
/// [`crate::ManifestSource`]) that were added, changed or deleted, at most once per `debounce`
/// period. Paths are absolute, sorted and unique; pass them to [`crate::ManifestSource::reload`].
pub fn watch(
    dir: &Path,
    debounce: Duration,
    mut on_change: impl FnMut(Vec<PathBuf>) + Send + 'static,
) -> Result<Watcher, Error> {
    let watch_error = |error| Error::Watch { path: dir.to_owned(), error };
    let root = std::fs::canonicalize(dir).map_err(|error| Error::Io { path: dir.to_owned(), error })?;
    let filter_root = root.clone();
    let handler = move |result: DebounceEventResult| match result {
        Ok(events) => {
            // `AnyContinuous` reports a path still being written, which is reported again as
            // `Any` once quiet: reloading on both would read it twice.
            let mut paths: Vec<PathBuf> = events
                .into_iter()
                .filter(|e| e.kind == DebouncedEventKind::Any)
                .map(|e| e.path)
                .filter(|p| is_manifest(&filter_root, p))
                .collect();
            paths.sort();
            paths.dedup();
            if !paths.is_empty() {
                on_change(paths);
            }
        }
        Err(e) => tracing::warn!(dir = %filter_root.display(), error = %e, "watching manifests"),
    };
    let config = notify_debouncer_mini::Config::default().with_timeout(debounce);
    let mut debouncer = new_debouncer_opt::<_, ChangeWatcher>(config, handler).map_err(watch_error)?;
    debouncer.watcher().watch(&root, RecursiveMode::Recursive).map_err(watch_error)?;
    Ok(Watcher { _debouncer: debouncer })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn reports_written_and_deleted_manifests() {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let _watcher = watch(tmp.path(), Duration::from_millis(100), move |paths| tx.send(paths).unwrap()).unwrap();
        let path = std::fs::canonicalize(tmp.path()).unwrap().join("a.yaml");
        std::fs::write(tmp.path().join("ignored.txt"), "x").unwrap();
        std::fs::write(&path, "kind: x\n").unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), std::slice::from_ref(&path));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), [path]);
    }

    #[test]
    fn reading_a_manifest_is_not_a_change() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.yaml");
        std::fs::write(&path, "kind: x\n").unwrap();
        let (tx, rx) = mpsc::channel();
        let _watcher = watch(tmp.path(), Duration::from_millis(50), move |paths| tx.send(paths).unwrap()).unwrap();
        std::fs::read_to_string(&path).unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a reload reading its files would trigger itself"
        );
    }
}
