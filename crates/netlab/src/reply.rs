//! The echo server's one-line reply: `<name> local=<ip:port> peer=<ip:port>\n`.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use anyhow::{Context, Error, Result, bail};

/// What an echo server saw of a connection or datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The echo server's name (identifies the backend).
    pub name: String,
    /// The address the connection/datagram arrived at.
    pub local: SocketAddr,
    /// The client's address as seen by the server.
    pub peer: SocketAddr,
}

impl fmt::Display for Reply {
    /// Formats the wire line, including the trailing newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} local={} peer={}", self.name, self.local, self.peer)
    }
}

impl FromStr for Reply {
    type Err = Error;

    /// Parses a wire line (trailing newline optional).
    fn from_str(line: &str) -> Result<Self> {
        let parse = || -> Result<Reply> {
            let [name, local, peer] = line.split_whitespace().collect::<Vec<_>>()[..] else {
                bail!("expected 3 fields");
            };
            let field = |text: &str, key: &str| -> Result<SocketAddr> {
                let value = text
                    .strip_prefix(key)
                    .and_then(|rest| rest.strip_prefix('='))
                    .with_context(|| format!("expected {key}=<ip:port>"))?;
                value.parse().with_context(|| format!("bad {key} address"))
            };
            Ok(Reply { name: name.to_owned(), local: field(local, "local")?, peer: field(peer, "peer")? })
        };
        parse().with_context(|| format!("malformed echo reply {line:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let reply = Reply {
            name: "backend-1".into(),
            local: "[fd00:244::10]:80".parse().unwrap(),
            peer: "10.244.0.11:40000".parse().unwrap(),
        };
        assert_eq!(reply.to_string().parse::<Reply>().unwrap(), reply);
    }

    #[test]
    fn rejects_garbage() {
        assert!("hello".parse::<Reply>().is_err());
        assert!("a local=1.2.3.4:5 peer=x".parse::<Reply>().is_err());
    }
}
