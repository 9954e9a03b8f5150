//! Errors: [`Error`] for failures of the source itself, [`ManifestError`] for problems in
//! manifests (reported, never fatal).

use std::fmt;
use std::path::PathBuf;

/// Failure to read the manifest folder or to watch it.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// The manifest folder could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The folder or file that failed.
        path: PathBuf,
        /// The underlying I/O error (in the message, so not a source as well: printed once).
        error: std::io::Error,
    },
    /// The file watcher could not be set up.
    #[error("watching {}: {error}", path.display())]
    Watch {
        /// The watched folder.
        path: PathBuf,
        /// The underlying notify error (in the message, so not a source as well).
        error: notify::Error,
    },
    /// The Kubernetes API client could not be configured.
    #[error("connecting to the Kubernetes API: {0}")]
    Kube(String),
}

impl Error {
    /// A [`Error::Kube`] from any kube-rs error.
    pub(crate) fn kube(error: impl fmt::Display) -> Self {
        Self::Kube(error.to_string())
    }
}

/// One problem in a manifest: names the file, the object (e.g. `Service default/hello`) and the
/// field path (e.g. `spec.ports[0].port`) when known.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub struct ManifestError {
    /// The manifest file.
    pub file: PathBuf,
    /// The document's position in a YAML file (1-based, counting its `---`-separated documents),
    /// when the object it defines is unknown (e.g. it is not valid YAML).
    pub document: Option<usize>,
    /// The object, as `Kind namespace/name` or `Kind name`.
    pub object: Option<String>,
    /// The field path inside the object.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ManifestError {
    /// An error about a whole file.
    pub(crate) fn file(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self { file: file.into(), document: None, object: None, field: None, message: message.into() }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(document) = self.document {
            write!(f, ": document {document}")?;
        }
        for part in [&self.object, &self.field].into_iter().flatten() {
            write!(f, ": {part}")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_omits_missing_parts() {
        let mut e = ManifestError::file("m/a.yaml", "70000 is out of range 1-65535");
        assert_eq!(e.to_string(), "m/a.yaml: 70000 is out of range 1-65535");
        e.object = Some("Service default/hello".into());
        e.field = Some("spec.ports[0].port".into());
        assert_eq!(e.to_string(), "m/a.yaml: Service default/hello: spec.ports[0].port: 70000 is out of range 1-65535");
        let e =
            ManifestError { document: Some(2), ..ManifestError::file("m/a.yaml", "invalid YAML: line 7 column 3: x") };
        assert_eq!(e.to_string(), "m/a.yaml: document 2: invalid YAML: line 7 column 3: x");
    }
}
