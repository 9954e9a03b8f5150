//! Why a road could not be computed.

/// Why a road could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not an `http://` or `https://` URL with a host.
    #[error("URL {url:?}: {message}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The origin (`--from`) is not a host or pod of the cluster.
    #[error("--from {0}")]
    Origin(String),
    /// The name does not resolve where the request starts.
    #[error("{0}")]
    Unresolved(String),
    /// No node to trace the packet on.
    #[error("{0}")]
    NoNode(String),
    /// The tracer could not model the node's rules.
    #[error("tracing the rules of node {node}: {source}")]
    Trace {
        /// The node.
        node: String,
        /// The tracer's error.
        #[source]
        source: roadkeeper_rules::trace::Error,
    },
}
