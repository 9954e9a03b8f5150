//! The NodePort range, as kube-apiserver's `--service-node-port-range`: the ports a Service may
//! take as `nodePort` or `healthCheckNodePort`. An API server refuses others; a manifest folder
//! has no API server, so the manifest source applies the range itself.

use std::fmt;
use std::str::FromStr;

/// An inclusive range of ports (`30000-32767` by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePortRange {
    first: u16,
    last: u16,
}

impl NodePortRange {
    /// kube-apiserver's default, `30000-32767`.
    pub const DEFAULT: NodePortRange = NodePortRange { first: 30000, last: 32767 };

    /// The lowest port of the range.
    pub const fn first(self) -> u16 {
        self.first
    }

    /// The highest port of the range.
    pub const fn last(self) -> u16 {
        self.last
    }

    /// Whether `port` is in the range.
    pub fn contains(self, port: i32) -> bool {
        (i32::from(self.first)..=i32::from(self.last)).contains(&port)
    }
}

impl Default for NodePortRange {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for NodePortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Why a `--service-node-port-range` value was refused.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
#[error("{value:?}: {reason} (expected MIN-MAX, BASE+OFFSET or PORT, e.g. 30000-32767)")]
pub struct NodePortRangeError {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for NodePortRange {
    type Err = NodePortRangeError;

    /// Parses `MIN-MAX`, `BASE+OFFSET` (the range `BASE` to `BASE+OFFSET`) or one `PORT`, both ends
    /// included, as `utilnet.ParsePortRange` does; an empty range is refused.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let error = |reason| NodePortRangeError { value: value.to_owned(), reason };
        let number = |text: &str| text.parse::<u32>().map_err(|_| error("not a port number"));
        let trimmed = value.trim();
        let (first, last) = match (trimmed.split_once('-'), trimmed.split_once('+')) {
            (Some(_), Some(_)) => return Err(error("holds both '-' and '+'")),
            (Some((first, last)), None) => (number(first)?, number(last)?),
            (None, Some((base, offset))) => {
                let base = number(base)?;
                (base, base.saturating_add(number(offset)?))
            }
            (None, None) if trimmed.is_empty() => return Err(error("is empty")),
            (None, None) => (number(trimmed)?, number(trimmed)?),
        };
        if last > 65535 {
            return Err(error("the port range cannot be greater than 65535"));
        }
        if last < first {
            return Err(error("the end port cannot be less than the start port"));
        }
        if first == 0 {
            return Err(error("port 0 cannot be a NodePort"));
        }
        Ok(NodePortRange { first: first as u16, last: last as u16 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_api_servers_notations() {
        let range = |first, last| Ok(NodePortRange { first, last });
        assert_eq!("30000-32767".parse(), range(30000, 32767));
        assert_eq!(" 30000+2767 ".parse(), range(30000, 32767));
        assert_eq!("8080".parse(), range(8080, 8080));
        assert_eq!(NodePortRange::default().to_string(), "30000-32767");
        for (value, reason) in [
            ("", "is empty"),
            ("30000-", "not a port number"),
            ("-1", "not a port number"),
            ("a-b", "not a port number"),
            ("1-2+3", "holds both '-' and '+'"),
            ("30000-70000", "the port range cannot be greater than 65535"),
            ("65535+1", "the port range cannot be greater than 65535"),
            ("32767-30000", "the end port cannot be less than the start port"),
            ("0-10", "port 0 cannot be a NodePort"),
        ] {
            let err = value.parse::<NodePortRange>().unwrap_err();
            assert_eq!(err.reason, reason, "{value:?}");
        }
        let message = "1-2+3".parse::<NodePortRange>().unwrap_err().to_string();
        assert_eq!(
            message,
            "\"1-2+3\": holds both '-' and '+' (expected MIN-MAX, BASE+OFFSET or PORT, e.g. 30000-32767)"
        );
    }

    #[test]
    fn contains_both_ends_only() {
        let range = NodePortRange::DEFAULT;
        assert!(range.contains(30000) && range.contains(32767));
        assert!(!range.contains(29999) && !range.contains(32768) && !range.contains(22) && !range.contains(-30000));
    }
}
