//! Writing the lab's files: atomically, and the generated cluster-state folder as a whole.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Writes `contents` to `path` through a hidden temporary file renamed over it, so that readers
/// (and the components watching the folder, which skip hidden files) never see half a file.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(Error::io(parent))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temporary = parent.join(format!(".{name}.tmp"));
    fs::write(&temporary, contents).map_err(Error::io(&temporary))?;
    fs::rename(&temporary, path).map_err(Error::io(path))
}

/// A folder whose files are rewritten as a whole: [`Tree::sync`] writes the files whose
/// contents changed and deletes the ones that went, and says whether anything changed.
#[derive(Debug)]
pub struct Tree {
    root: PathBuf,
    written: BTreeMap<PathBuf, Vec<u8>>,
}

impl Tree {
    /// An empty folder `root` (emptied if it exists).
    pub fn create(root: &Path) -> Result<Self> {
        if root.exists() {
            fs::remove_dir_all(root).map_err(Error::io(root))?;
        }
        fs::create_dir_all(root).map_err(Error::io(root))?;
        Ok(Self { root: root.to_owned(), written: BTreeMap::new() })
    }

    /// Makes the folder hold exactly `files` (paths relative to the root).
    pub fn sync(&mut self, files: BTreeMap<PathBuf, Vec<u8>>) -> Result<bool> {
        let mut changed = false;
        for path in self.written.keys().filter(|path| !files.contains_key(*path)) {
            let full = self.root.join(path);
            fs::remove_file(&full).map_err(Error::io(&full))?;
            changed = true;
        }
        for (path, contents) in &files {
            if self.written.get(path) != Some(contents) {
                write_atomically(&self.root.join(path), contents)?;
                changed = true;
            }
        }
        self.written = files;
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_writes_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let mut tree = Tree::create(&dir.path().join("t")).unwrap();
        let files = |entries: &[(&str, &str)]| {
            entries.iter().map(|(p, c)| (PathBuf::from(p), c.as_bytes().to_vec())).collect::<BTreeMap<_, _>>()
        };
        assert!(tree.sync(files(&[("a/x.json", "1"), ("b.json", "2")])).unwrap());
        assert!(!tree.sync(files(&[("a/x.json", "1"), ("b.json", "2")])).unwrap());
        assert!(tree.sync(files(&[("a/x.json", "3")])).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("t/a/x.json")).unwrap(), "3");
        assert!(!dir.path().join("t/b.json").exists());
        let names: Vec<_> = fs::read_dir(dir.path().join("t/a")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["x.json"]);
    }
}
