//! The folder-of-manifests source: discovers files, keeps per-file bookkeeping and applies
//! (re)loaded files to the [`Store`] without ever flushing on bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::index::{self, Index};
use crate::object::ObjectKey;
use crate::parse::Entry;
use crate::read::{FileRead, Outcome, read_manifest};
use crate::store::Batch;
use crate::{Changes, Error, ManifestError, NodePortRange, Object, Store};

/// File name extensions read as manifests.
const EXTENSIONS: &[&str] = &["yaml", "yml", "json"];

/// An object of a kind the source does not read (a StatefulSet, a Job...), skipped: what its
/// file says of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    /// The manifest file.
    pub file: PathBuf,
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
    /// Its `metadata.namespace`, if it has one.
    pub namespace: Option<String>,
    /// Its `metadata.name`, if it has one.
    pub name: Option<String>,
}

/// A folder of manifests and the [`Store`] built from it.
///
/// Hidden files and folders (name starting with `.`) are skipped. When the same object is
/// defined more than once, the first definition in load order (sorted path, then document order)
/// wins; if it goes away, the next one takes over.
#[derive(Debug)]
pub struct ManifestSource {
    dir: PathBuf,
    /// The range a Service's NodePorts must be in.
    node_ports: NodePortRange,
    store: Store,
    /// Last good version of every object each file defines.
    files: BTreeMap<PathBuf, BTreeMap<ObjectKey, Object>>,
    /// Files defining each object, in load order.
    claims: Index<ObjectKey, PathBuf>,
    /// The objects of unsupported kinds each file holds, as last read.
    unsupported: BTreeMap<PathBuf, Vec<Unsupported>>,
}

impl ManifestSource {
    /// An empty source for `dir` (canonicalized) and the manifest files below it, to read and
    /// [`apply`](Self::apply), refusing NodePorts outside `node_ports`. Fails only if `dir` itself
    /// cannot be read.
    pub(crate) fn open(
        dir: &Path,
        node_ports: NodePortRange,
    ) -> Result<(Self, Vec<PathBuf>, Vec<ManifestError>), Error> {
        let io_error = |error| Error::Io { path: dir.to_owned(), error };
        let dir = fs::canonicalize(dir).map_err(io_error)?;
        let mut errors = Vec::new();
        let mut paths = Vec::new();
        discover(&dir, &mut paths, &mut errors).map_err(io_error)?;
        let source = Self {
            dir,
            node_ports,
            store: Store::default(),
            files: BTreeMap::new(),
            claims: Index::new(),
            unsupported: BTreeMap::new(),
        };
        Ok((source, paths, errors))
    }

    /// Reads every `*.yaml`, `*.yml` and `*.json` file below `dir` (recursively, in sorted path
    /// order, multi-document YAML allowed), in this thread, with the API server's default NodePort
    /// range. Fails only if `dir` itself cannot be read.
    pub fn load(dir: &Path) -> Result<(Self, Vec<ManifestError>), Error> {
        let (mut source, paths, mut errors) = Self::open(dir, NodePortRange::DEFAULT)?;
        let (_, reload_errors) = source.reload(&paths);
        errors.extend(reload_errors);
        Ok((source, errors))
    }

    /// Re-reads just these paths (added, changed or deleted files; others are ignored), in this
    /// thread, and updates the store. Costs O(changed files + affected services).
    pub fn reload(&mut self, paths: &[PathBuf]) -> (Changes, Vec<ManifestError>) {
        let mut paths: Vec<PathBuf> = paths.iter().filter_map(|p| manifest_path(&self.dir, p)).collect();
        paths.sort();
        paths.dedup();
        self.apply(paths.iter().map(|p| read_manifest(p, self.node_ports)).collect())
    }

    /// Applies what reading some files gave (see [`crate::read`]) to the store. A file that
    /// cannot be used keeps its previous objects.
    pub(crate) fn apply(&mut self, reads: Vec<FileRead>) -> (Changes, Vec<ManifestError>) {
        let mut errors = Vec::new();
        let mut touched = BTreeSet::new();
        for FileRead { path, outcome } in reads {
            let mut unsupported = Vec::new();
            if let Some(objects) = self.objects(&path, outcome, &mut errors, &mut unsupported) {
                if unsupported.is_empty() {
                    self.unsupported.remove(&path);
                } else {
                    self.unsupported.insert(path.clone(), unsupported);
                }
                self.replace_file(path, objects, &mut touched);
            }
        }

        let mut batch = Batch::default();
        for key in &touched {
            let claimants = self.claims.get(key).into_iter().flatten();
            let mut claimants = claimants.filter_map(|path| Some((path, self.files.get(path)?.get(key)?)));
            let winner = claimants.next();
            self.store.set(key, winner.map(|(_, object)| object), &mut batch);
            let Some((first, _)) = winner else { continue };
            for (path, _) in claimants {
                let message = format!("duplicate, already defined in {}; ignored", first.display());
                errors.push(ManifestError { object: Some(key.to_string()), ..ManifestError::file(path, message) });
            }
        }
        (self.store.finish(batch), errors)
    }

    /// The current objects.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The manifest folder (canonicalized).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The objects of kinds the source does not read, by file, as the files were last read.
    pub fn unsupported(&self) -> impl Iterator<Item = &Unsupported> {
        self.unsupported.values().flatten()
    }

    /// The file whose definition of `object` (by kind, namespace and name) is in use.
    pub fn file_of(&self, object: &Object) -> Option<&Path> {
        self.claims.get(&object.key())?.first().map(PathBuf::as_path)
    }

    /// The objects `path` now defines, or `None` if the file cannot be used and its previous
    /// objects must stay. Invalid objects keep their previous version; objects of unsupported
    /// kinds go to `unsupported`.
    fn objects(
        &self,
        path: &Path,
        outcome: Outcome,
        errors: &mut Vec<ManifestError>,
        unsupported: &mut Vec<Unsupported>,
    ) -> Option<BTreeMap<ObjectKey, Object>> {
        let entries = match outcome {
            Outcome::Gone => return Some(BTreeMap::new()),
            Outcome::Parsed(entries) => entries,
            Outcome::Unusable(error) | Outcome::Retry(error) => {
                errors.push(error);
                return None;
            }
        };
        let previous = self.files.get(path);
        let mut objects = BTreeMap::new();
        let mut keep_all_previous = false;
        for entry in entries {
            match entry {
                Entry::Valid(key, _) if objects.contains_key(&key) => {
                    let message = "duplicate, already defined earlier in this file; ignored";
                    errors.push(ManifestError { object: Some(key.to_string()), ..ManifestError::file(path, message) });
                }
                Entry::Valid(key, object) => {
                    objects.insert(key, object);
                }
                Entry::Unsupported(object) => unsupported.push(object),
                Entry::Invalid(key, object_errors) => {
                    errors.extend(object_errors);
                    match key {
                        Some(key) => {
                            if let Some(old) = previous.and_then(|p| p.get(&key)) {
                                objects.entry(key).or_insert_with(|| old.clone());
                            }
                        }
                        // An unidentifiable document may be any previous object: keep them all.
                        None => keep_all_previous = true,
                    }
                }
            }
        }
        if keep_all_previous {
            for (key, old) in previous.into_iter().flatten() {
                objects.entry(key.clone()).or_insert_with(|| old.clone());
            }
        }
        Some(objects)
    }

    /// Records that `path` now defines `objects`, updating claims; adds affected keys to `touched`.
    fn replace_file(&mut self, path: PathBuf, objects: BTreeMap<ObjectKey, Object>, touched: &mut BTreeSet<ObjectKey>) {
        let new_keys: BTreeSet<ObjectKey> = objects.keys().cloned().collect();
        let old = if objects.is_empty() { self.files.remove(&path) } else { self.files.insert(path.clone(), objects) };
        for key in old.into_iter().flat_map(BTreeMap::into_keys) {
            if !new_keys.contains(&key) {
                index::remove(&mut self.claims, &key, &path);
            }
            touched.insert(key);
        }
        for key in new_keys {
            index::insert(&mut self.claims, key.clone(), path.clone());
            touched.insert(key);
        }
    }
}

/// `path` made comparable with discovered paths, if it is a manifest file below `dir`.
pub(crate) fn manifest_path(dir: &Path, path: &Path) -> Option<PathBuf> {
    Some(normalize(path)).filter(|p| is_manifest(dir, p))
}

/// Whether `path` is a manifest file below `dir` (not hidden, with a manifest extension).
pub(crate) fn is_manifest(dir: &Path, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(dir) else {
        return false;
    };
    let visible = relative.components().all(|c| !c.as_os_str().to_string_lossy().starts_with('.'));
    let extension = path.extension().and_then(|e| e.to_str());
    visible && extension.is_some_and(|e| EXTENSIONS.contains(&e))
}

/// Makes `path` comparable with discovered paths: canonical parent folder plus file name (the
/// file itself may be deleted, or a symlink that must not be resolved).
fn normalize(path: &Path) -> PathBuf {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return path.to_owned();
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    fs::canonicalize(parent).map_or_else(|_| path.to_owned(), |p| p.join(name))
}

/// Appends the manifest files below `dir` to `paths`; unreadable subfolders become errors.
fn discover(dir: &Path, paths: &mut Vec<PathBuf>, errors: &mut Vec<ManifestError>) -> io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<io::Result<_>>()?;
    entries.sort_by_key(fs::DirEntry::path);
    for entry in entries {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        // Does not follow symlinks to folders (avoids loops). Anything else with a manifest
        // name is read, and reading tells a FIFO or a device apart (it is reported, not read).
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            if let Err(e) = discover(&path, paths, errors) {
                errors.push(ManifestError::file(&path, e.to_string()));
            }
        } else if !path.is_dir() && path.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e)) {
            paths.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NamespacedName;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn service(name: &str, port: u32) -> String {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{port: {port}}}]}}\n")
    }

    fn port(source: &ManifestSource, name: &str) -> Option<i32> {
        let svc = source.store().service(&NamespacedName::new("default", name))?;
        Some(svc.spec.as_ref()?.ports.as_ref()?[0].port)
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        path
    }

    fn svc_set(names: &[&str]) -> BTreeSet<NamespacedName> {
        names.iter().map(|n| NamespacedName::new("default", *n)).collect()
    }

    #[test]
    fn objects_of_unsupported_kinds_are_listed_until_their_file_drops_them() {
        let tmp = tempfile::tempdir().unwrap();
        let set = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: data}\n";
        let path = write(
            tmp.path(),
            "a.yaml",
            &format!("{}---\n{set}---\nkind: Job\napiVersion: batch/v1\n", service("a", 80)),
        );
        let (mut source, errors) = ManifestSource::load(tmp.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(port(&source, "a"), Some(80));
        let listed: Vec<_> =
            source.unsupported().map(|u| (u.kind.as_str(), u.namespace.as_deref(), u.name.as_deref())).collect();
        assert_eq!(listed, [("StatefulSet", Some("data"), Some("db")), ("Job", None, None)]);
        assert_eq!(source.unsupported().next().unwrap().file, path.canonicalize().unwrap());
        fs::write(&path, service("a", 80)).unwrap();
        source.reload(std::slice::from_ref(&path));
        assert_eq!(source.unsupported().count(), 0);
        fs::write(&path, set).unwrap();
        source.reload(std::slice::from_ref(&path));
        assert_eq!(source.unsupported().count(), 1);
        fs::remove_file(&path).unwrap();
        source.reload(std::slice::from_ref(&path));
        assert_eq!(source.unsupported().count(), 0);
    }

    #[test]
    fn loads_recursively_skipping_hidden_and_other_files() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "a.yaml", &service("a", 80));
        write(tmp.path(), "sub/b.yml", &service("b", 81));
        write(tmp.path(), "sub/c.json", r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c"}}"#);
        write(tmp.path(), "d.txt", &service("d", 82));
        write(tmp.path(), ".hidden/e.yaml", &service("e", 83));
        let (source, errors) = ManifestSource::load(tmp.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<_> = source.store().services().map(|(k, _)| k.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(port(&source, "b"), Some(81));
        assert_eq!(source.dir(), fs::canonicalize(tmp.path()).unwrap());
        assert!(matches!(ManifestSource::load(&tmp.path().join("missing")), Err(Error::Io { .. })));
    }

    #[test]
    fn syntax_error_keeps_the_previous_objects_of_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "a.yaml", &format!("{}---\n{}", service("a", 80), service("b", 81)));
        let (mut source, _) = ManifestSource::load(tmp.path()).unwrap();
        fs::write(&path, "kind: [\n").unwrap();
        let (changes, errors) = source.reload(std::slice::from_ref(&path));
        assert!(changes.is_empty());
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].file, fs::canonicalize(&path).unwrap());
        assert_eq!((port(&source, "a"), port(&source, "b")), (Some(80), Some(81)));
    }

    #[test]
    fn invalid_object_keeps_its_previous_version_and_others_apply() {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "a.yaml", &format!("{}---\n{}", service("a", 80), service("b", 81)));
        let (mut source, _) = ManifestSource::load(tmp.path()).unwrap();
        write(
            tmp.path(),
            "a.yaml",
            &format!("{}---\n{}---\n{}", service("a", 70000), service("b", 91), service("new", 1)),
        );
        let (changes, errors) = source.reload(&[path]);
        assert_eq!(changes.services, svc_set(&["b", "new"]));
        let messages: Vec<String> =
            errors.iter().map(|e| format!("{}: {}", e.object.as_deref().unwrap(), e.message)).collect();
        assert_eq!(messages, ["Service default/a: 70000 is out of range 1-65535"]);
        assert_eq!((port(&source, "a"), port(&source, "b"), port(&source, "new")), (Some(80), Some(91), Some(1)));
    }

    #[test]
    fn unidentifiable_document_keeps_all_previous_objects() {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "a.yaml", &format!("{}---\n{}", service("a", 80), service("b", 81)));
        let (mut source, _) = ManifestSource::load(tmp.path()).unwrap();
        write(
            tmp.path(),
            "a.yaml",
            &format!("{}---\napiVersion: v1\nkind: Service\nmetadata: {{}}\n", service("a", 82)),
        );
        let (changes, errors) = source.reload(&[path]);
        assert_eq!(errors.len(), 1);
        assert_eq!(changes.services, svc_set(&["a"]));
        assert_eq!((port(&source, "a"), port(&source, "b")), (Some(82), Some(81)));
    }

    #[test]
    fn deleting_and_editing_files() {
        let tmp = tempfile::tempdir().unwrap();
        let a = write(tmp.path(), "a.yaml", &format!("{}---\n{}", service("a", 80), service("b", 81)));
        let (mut source, _) = ManifestSource::load(tmp.path()).unwrap();
        write(tmp.path(), "a.yaml", &service("a", 80));
        let (changes, _) = source.reload(std::slice::from_ref(&a));
        assert_eq!(changes.services, svc_set(&["b"]));
        fs::remove_file(&a).unwrap();
        let (changes, errors) = source.reload(&[a, tmp.path().join("ignored.txt")]);
        assert!(errors.is_empty());
        assert_eq!(changes.services, svc_set(&["a"]));
        assert_eq!(source.store().services().count(), 0);
        assert!(source.files.is_empty() && source.claims.is_empty());
    }

    #[test]
    fn duplicates_first_wins_and_the_next_takes_over() {
        let tmp = tempfile::tempdir().unwrap();
        let a = write(tmp.path(), "a.yaml", &service("x", 80));
        write(tmp.path(), "b.yaml", &format!("{}---\n{}", service("x", 81), service("x", 82)));
        let (mut source, errors) = ManifestSource::load(tmp.path()).unwrap();
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let dir = source.dir().to_owned();
        assert_eq!(
            messages,
            [
                format!(
                    "{}: Service default/x: duplicate, already defined earlier in this file; ignored",
                    dir.join("b.yaml").display()
                ),
                format!(
                    "{}: Service default/x: duplicate, already defined in {}; ignored",
                    dir.join("b.yaml").display(),
                    dir.join("a.yaml").display()
                ),
            ]
        );
        assert_eq!(port(&source, "x"), Some(80));
        let x = |source: &ManifestSource| {
            Object::Service(source.store().service(&NamespacedName::new("default", "x")).unwrap().clone())
        };
        assert_eq!(source.file_of(&x(&source)), Some(dir.join("a.yaml").as_path()));
        fs::remove_file(&a).unwrap();
        let (changes, errors) = source.reload(&[a]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(changes.services, svc_set(&["x"]));
        assert_eq!(port(&source, "x"), Some(81));
        assert_eq!(source.file_of(&x(&source)), Some(dir.join("b.yaml").as_path()));
    }

    #[test]
    fn pod_label_change_reports_the_services_and_updates_slices() {
        let tmp = tempfile::tempdir().unwrap();
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n\
                   spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: http}]}\n";
        write(tmp.path(), "svc.yaml", svc);
        let pod = |app: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, labels: {{app: {app}}}}}\n\
                     spec: {{containers: [{{name: c, ports: [{{name: http, containerPort: 8080}}]}}]}}\n\
                     status: {{podIP: 10.0.0.1, conditions: [{{type: Ready, status: 'True'}}]}}\n"
            )
        };
        let pod_path = write(tmp.path(), "pod.yaml", &pod("web"));
        let (mut source, errors) = ManifestSource::load(tmp.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let web = NamespacedName::new("default", "web");
        let slices = source.store().slices_for(&web);
        let ports = slices[0].ports.as_ref().unwrap();
        assert_eq!(ports[0].port, Some(8080));
        let svc = source.store().service(&web).unwrap();
        assert_eq!(
            svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].target_port,
            Some(IntOrString::String("http".into()))
        );

        write(tmp.path(), "pod.yaml", &pod("removed"));
        let (changes, _) = source.reload(std::slice::from_ref(&pod_path));
        let expected =
            Changes { services: svc_set(&["web"]), pods: svc_set(&["p"]), endpoint_updates: 1, ..Changes::default() };
        assert_eq!(changes, expected);
        assert!(source.store().slices_for(&web).is_empty());
        write(tmp.path(), "pod.yaml", &pod("web"));
        assert_eq!(source.reload(&[pod_path]).0.services, svc_set(&["web"]));
        assert_eq!(source.store().slices_for(&web).len(), 1);
    }
}
