//! Object identities.

use std::fmt;

/// Namespace and name of a namespaced object; displayed as `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: String,
    /// The object name.
    pub name: String,
}

impl NamespacedName {
    /// Builds a name from its parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_and_orders_by_namespace_first() {
        let a = NamespacedName::new("a", "z");
        let b = NamespacedName::new("b", "a");
        assert_eq!(a.to_string(), "a/z");
        assert!(a < b);
    }
}
