//! Debounced, recursive watching of the manifest folder.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};

use crate::Error;
use crate::source::is_manifest;

/// Guard returned by [`watch`]; watching stops when it is dropped.
pub struct Watcher {
    _debouncer: Debouncer<RecommendedWatcher>,
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
    let watch_error = |source| Error::Watch {
        path: dir.to_owned(),
        source,
    };
    let root = std::fs::canonicalize(dir).map_err(|source| Error::Io {
        path: dir.to_owned(),
        source,
    })?;
    let filter_root = root.clone();
    let mut debouncer = new_debouncer(debounce, move |result: DebounceEventResult| match result {
        Ok(events) => {
            let mut paths: Vec<PathBuf> = events
                .into_iter()
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
    })
    .map_err(watch_error)?;
    debouncer
        .watcher()
        .watch(&root, RecursiveMode::Recursive)
        .map_err(watch_error)?;
    Ok(Watcher {
        _debouncer: debouncer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn reports_written_and_deleted_manifests() {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let _watcher = watch(tmp.path(), Duration::from_millis(100), move |paths| {
            tx.send(paths).unwrap()
        })
        .unwrap();
        let path = std::fs::canonicalize(tmp.path()).unwrap().join("a.yaml");
        std::fs::write(tmp.path().join("ignored.txt"), "x").unwrap();
        std::fs::write(&path, "kind: x\n").unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(2)).unwrap(),
            std::slice::from_ref(&path)
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), [path]);
    }
}
