//! What a (re)load changed.

use std::collections::BTreeSet;

use crate::NamespacedName;

/// Result of a (re)load: which Services must be re-planned, plus node/CIDR change flags.
///
/// A Service is listed when the Service itself or any of its EndpointSlices (hand-written or
/// derived from Pods) changed.
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Changes {
    /// Services whose object or EndpointSlices changed (including removals).
    pub services: BTreeSet<NamespacedName>,
    /// Names of Nodes that were added, changed or removed.
    pub nodes: BTreeSet<String>,
    /// Whether any ServiceCIDR was added, changed or removed.
    pub service_cidrs: bool,
}

impl Changes {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.nodes.is_empty() && !self.service_cidrs
    }

    /// Adds everything in `other` to `self`.
    pub fn merge(&mut self, other: Changes) {
        self.services.extend(other.services);
        self.nodes.extend(other.nodes);
        self.service_cidrs |= other.service_cidrs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_unions_and_is_empty() {
        let mut a = Changes::default();
        assert!(a.is_empty());
        let mut b = Changes::default();
        b.services.insert(NamespacedName::new("default", "hello"));
        b.nodes.insert("n1".into());
        a.merge(b.clone());
        a.merge(Changes { service_cidrs: true, ..Changes::default() });
        assert!(!a.is_empty());
        assert_eq!(a.services, b.services);
        assert_eq!(a.nodes, b.nodes);
        assert!(a.service_cidrs);
    }
}
