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
    /// A header given with `-H` is not one the road follows, or is malformed.
    #[error("-H {header:?}: {message}")]
    Header {
        /// The header as given.
        header: String,
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
    /// The tracer could not model the node's rules (its error is the source, printed once by a
    /// chain).
    #[error("tracing the rules of node {node}")]
    Trace {
        /// The node.
        node: String,
        /// The tracer's error.
        #[source]
        source: roadkeeper_rules::trace::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `err` and its sources, joined as `{:#}` of anyhow prints them (what `roadkeeper` prints).
    fn chain(err: &dyn std::error::Error) -> String {
        let mut text = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn a_trace_error_prints_its_cause_once() {
        let err = Error::Trace { node: "node-1".into(), source: roadkeeper_rules::trace::Error::TooLong };
        let text = chain(&err);
        assert_eq!(text.matches("rules evaluated").count(), 1, "{text}");
        assert!(text.starts_with("tracing the rules of node node-1: more than "), "{text}");
    }
}
