//! The lab's error type.

use std::path::PathBuf;

/// What went wrong in a lab command or the lab controller.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A file or folder could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// There is no lab (or no such host, pod or object in it).
    #[error("{0}")]
    NotFound(String),
    /// The command was asked something it cannot do.
    #[error("{0}")]
    Invalid(String),
    /// The lab controller refused a request or could not be reached.
    #[error("{0}")]
    Controller(String),
    /// Building or changing the lab's namespaces, links or processes failed.
    #[error("{0:#}")]
    Host(#[from] anyhow::Error),
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Results of the lab.
pub type Result<T, E = Error> = std::result::Result<T, E>;
