//! The lab's error type.

use std::path::PathBuf;

/// What went wrong in a lab command or the lab controller.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A file or folder could not be used. (The I/O error is in the message, not a source: lab
    /// errors travel as text, in the state file and the controller's answers.)
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
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
    /// Building or changing the lab's namespaces, links or processes failed (its whole chain in
    /// the message, so not a source as well).
    #[error("{0:#}")]
    Host(anyhow::Error),
}

impl From<anyhow::Error> for Error {
    fn from(error: anyhow::Error) -> Self {
        Self::Host(error)
    }
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |error| Self::Io { path, error }
    }
}

/// Results of the lab.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// What `roadkeeper` prints of `err`: it and its sources, as anyhow's `{:#}` chains them.
    fn printed(err: Error) -> String {
        format!("{:#}", anyhow::Error::from(err))
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = Error::io("/etc/passwd/state.json")(std::io::Error::from_raw_os_error(20));
        let text = printed(io);
        assert_eq!(text.matches("Not a directory").count(), 1, "{text}");
        assert!(text.starts_with("/etc/passwd/state.json: Not a directory"), "{text}");
        let host = Error::from(anyhow::anyhow!("no such device").context("moving veth0 into lab-node-1"));
        let text = printed(host);
        assert_eq!(text, "moving veth0 into lab-node-1: no such device");
    }
}
