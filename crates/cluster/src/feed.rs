//! [`Feed`]: the one interface components read cluster state through, whichever source feeds
//! it (a folder of manifests or a Kubernetes API server).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::api_source::ApiSource;
use crate::object::Kind;
use crate::read::{Reader, read_manifest};
use crate::source::manifest_path;
use crate::{Changes, Error, ManifestError, ManifestSource, NodePortRange, Store, Watcher, watch};

/// How long file events are collected before a reload.
const WATCH_DEBOUNCE: Duration = Duration::from_millis(200);
/// How often the wait for the first list from the API server is logged.
const WAIT_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Where cluster state comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceSpec {
    /// A folder of manifests (see [`ManifestSource`]).
    Manifests(ManifestFolder),
    /// A Kubernetes API server, configured from this kubeconfig file, or when `None` as kube-proxy
    /// does: `KUBECONFIG` or `~/.kube/config`, else the in-cluster service account.
    Kubernetes(Option<PathBuf>),
}

/// A folder of manifests, and what the API server would check that a folder cannot.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestFolder {
    /// The folder.
    pub dir: PathBuf,
    /// The range a Service's NodePorts must be in (kube-apiserver's `--service-node-port-range`).
    /// An API server's objects are not checked against it: the API server checked its own.
    pub node_ports: NodePortRange,
}

/// What a component reads: the kinds, and the node it runs on (from an API server, only this
/// Node is watched).
#[derive(Clone, Debug, Default)]
pub struct Interest {
    /// The kinds read. A manifest folder provides every kind regardless.
    pub kinds: BTreeSet<Kind>,
    /// This node's name.
    pub node: Option<String>,
}

/// Cluster state and its changes, from either source.
#[derive(Debug)]
pub struct Feed {
    source: Source,
}

#[derive(Debug)]
enum Source {
    /// Files are read on the reader's thread, never on the caller's.
    Manifests {
        source: ManifestSource,
        reader: Reader,
        _watcher: Option<Watcher>,
    },
    Api(ApiSource),
}

impl Feed {
    /// Opens the source and returns once its state is complete: the folder is read, or every
    /// kind has been listed from the API server (retrying with backoff meanwhile). With `follow`,
    /// [`Feed::changed`] then reports changes; without, it never returns. Problems in objects are
    /// logged, naming the object and field, and never fail the feed. Runs inside a tokio runtime.
    pub async fn open(spec: &SourceSpec, interest: &Interest, follow: bool) -> Result<Self, Error> {
        let source = match spec {
            SourceSpec::Manifests(ManifestFolder { dir, node_ports }) => {
                let (mut source, paths, errors) = ManifestSource::open(dir, *node_ports)?;
                log(&errors);
                let node_ports = *node_ports;
                let mut reader = Reader::start(move |path: &std::path::Path| read_manifest(path, node_ports));
                // Watch before reading, so that no edit between the read and the watch goes unseen.
                let requests = reader.requests().clone();
                let root = source.dir().to_owned();
                let on_change =
                    move |paths: Vec<PathBuf>| requests.send(paths.iter().filter_map(|p| manifest_path(&root, p)));
                let watcher = follow.then(|| watch(dir, WATCH_DEBOUNCE, on_change)).transpose()?;
                // Complete once every file found has been read (edits may come in between).
                let mut unread: BTreeSet<PathBuf> = paths.iter().cloned().collect();
                reader.requests().send(paths);
                while !unread.is_empty() {
                    let Some(reads) = reader.reads.recv().await else { break };
                    for read in &reads {
                        unread.remove(&read.path);
                    }
                    log(&source.apply(reads).1);
                }
                Source::Manifests { source, reader, _watcher: watcher }
            }
            SourceSpec::Kubernetes(kubeconfig) => {
                let mut source = ApiSource::connect(kubeconfig.as_deref(), interest).await?;
                while !source.synced() {
                    if tokio::time::timeout(WAIT_LOG_PERIOD, source.next()).await.is_err() {
                        let kinds: Vec<&str> = source.unsynced().map(Kind::as_str).collect();
                        tracing::warn!(server = source.server(), "still waiting for the first list of {kinds:?}");
                    }
                }
                Source::Api(source)
            }
        };
        Ok(Self { source })
    }

    /// The current objects.
    pub fn store(&self) -> &Store {
        match &self.source {
            Source::Manifests { source, .. } => source.store(),
            Source::Api(source) => source.store(),
        }
    }

    /// Waits for the next change and returns what it changed (possibly nothing, e.g. after an
    /// edit that only touched unused fields). Cancel-safe.
    pub async fn changed(&mut self) -> Changes {
        match &mut self.source {
            Source::Manifests { source, reader, .. } => match reader.reads.recv().await {
                Some(reads) => {
                    let (changes, errors) = source.apply(reads);
                    log(&errors);
                    changes
                }
                None => std::future::pending().await,
            },
            Source::Api(source) => source.next().await,
        }
    }

    /// Where the state comes from, for logs: the folder or the API server's URL.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Manifests { source, .. } => format!("manifests in {}", source.dir().display()),
            Source::Api(source) => format!("API server {}", source.server()),
        }
    }
}

fn log(errors: &[ManifestError]) {
    for error in errors {
        tracing::error!("{error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manifest_feed_reports_file_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let service = |port: u16| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: a}}\nspec: {{ports: [{{port: {port}}}]}}\n")
        };
        std::fs::write(tmp.path().join("a.yaml"), service(80)).unwrap();
        let spec =
            SourceSpec::Manifests(ManifestFolder { dir: tmp.path().to_owned(), node_ports: NodePortRange::DEFAULT });
        let mut feed = Feed::open(&spec, &Interest::default(), true).await.unwrap();
        assert_eq!(feed.store().services().count(), 1);
        assert!(feed.describe().starts_with("manifests in /"));
        std::fs::write(tmp.path().join("b.yaml"), service(81).replace("name: a", "name: b")).unwrap();
        let changes = tokio::time::timeout(Duration::from_secs(5), feed.changed()).await.unwrap();
        assert_eq!(changes.services.len(), 1);
        assert_eq!(feed.store().services().count(), 2);
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_an_error_naming_it() {
        let spec = SourceSpec::Kubernetes(Some("/nonexistent/kubeconfig".into()));
        let err = Feed::open(&spec, &Interest::default(), true).await.unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    }
}
