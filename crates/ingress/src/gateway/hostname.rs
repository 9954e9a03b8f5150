//! Gateway API hostnames: exact names and `*.` wildcards (a suffix match over one or more
//! labels: `*.example.com` covers `a.example.com` and `a.b.example.com`, not `example.com`), their
//! intersection between a listener and a route, and a map that finds the most specific entry for
//! a request's host without allocating.

use std::fmt;

use imbl::HashMap;

/// A hostname of a listener or a route, lowercase.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hostname {
    /// Every host (no hostname given).
    Any,
    /// One host.
    Exact(String),
    /// Every host ending in this suffix, which starts with the dot (`.example.com`).
    Wildcard(String),
}

impl Hostname {
    /// The hostname as written (`None`: any); compared lowercase.
    pub fn parse(written: Option<&str>) -> Self {
        match written.map(str::to_ascii_lowercase) {
            None => Self::Any,
            Some(name) if name.is_empty() => Self::Any,
            Some(name) => match name.strip_prefix('*') {
                Some(suffix) if suffix.starts_with('.') => Self::Wildcard(suffix.to_owned()),
                _ => Self::Exact(name),
            },
        }
    }

    /// Whether `host` (lowercase, without port) is covered.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(name) => name == host,
            Self::Wildcard(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_str()),
        }
    }

    /// The hosts both cover, as one hostname: the more specific of the two when one covers the
    /// other, else `None`.
    pub fn intersect(&self, other: &Self) -> Option<Self> {
        match (self, other) {
            (Self::Any, other) | (other, Self::Any) => Some(other.clone()),
            (Self::Exact(a), Self::Exact(b)) => (a == b).then(|| self.clone()),
            (Self::Exact(name), wildcard @ Self::Wildcard(_)) | (wildcard @ Self::Wildcard(_), Self::Exact(name)) => {
                wildcard.matches(name).then(|| Self::Exact(name.clone()))
            }
            (Self::Wildcard(a), Self::Wildcard(b)) => {
                if a.ends_with(b.as_str()) {
                    Some(self.clone())
                } else if b.ends_with(a.as_str()) {
                    Some(other.clone())
                } else {
                    None
                }
            }
        }
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Exact(name) => f.write_str(name),
            Self::Wildcard(suffix) => write!(f, "*{suffix}"),
        }
    }
}

/// Values keyed by hostname; [`get`](Self::get) finds the most specific one covering a host:
/// the exact name, else the longest wildcard suffix, else the entry for any host. Persistent:
/// a clone is O(1) and shares what the copies do not change.
#[derive(Clone, Debug)]
pub struct HostMap<T: Clone> {
    exact: HashMap<String, T>,
    wildcard: HashMap<String, T>,
    any: Option<T>,
}

impl<T: Clone> Default for HostMap<T> {
    fn default() -> Self {
        Self { exact: HashMap::new(), wildcard: HashMap::new(), any: None }
    }
}

impl<T: Clone> HostMap<T> {
    /// The entry for `hostname`, created with `T::default()` when absent.
    pub fn entry(&mut self, hostname: &Hostname) -> &mut T
    where
        T: Default,
    {
        match hostname {
            Hostname::Any => self.any.get_or_insert_with(T::default),
            Hostname::Exact(name) => self.exact.entry(name.clone()).or_default(),
            Hostname::Wildcard(suffix) => self.wildcard.entry(suffix.clone()).or_default(),
        }
    }

    /// Sets the entry for `hostname`.
    pub fn insert(&mut self, hostname: &Hostname, value: T) {
        match hostname {
            Hostname::Any => self.any = Some(value),
            Hostname::Exact(name) => {
                self.exact.insert(name.clone(), value);
            }
            Hostname::Wildcard(suffix) => {
                self.wildcard.insert(suffix.clone(), value);
            }
        }
    }

    /// Removes the entry for `hostname`.
    pub fn remove(&mut self, hostname: &Hostname) {
        match hostname {
            Hostname::Any => self.any = None,
            Hostname::Exact(name) => {
                self.exact.remove(name);
            }
            Hostname::Wildcard(suffix) => {
                self.wildcard.remove(suffix);
            }
        }
    }

    /// Every entry, by hostname (for tests comparing maps).
    #[cfg(test)]
    pub fn sorted(&self) -> Vec<(Hostname, &T)> {
        let exact = self.exact.iter().map(|(name, value)| (Hostname::Exact(name.clone()), value));
        let wildcard = self.wildcard.iter().map(|(suffix, value)| (Hostname::Wildcard(suffix.clone()), value));
        let mut all: Vec<_> = exact.chain(wildcard).chain(self.any.as_ref().map(|v| (Hostname::Any, v))).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The most specific entry covering `host` (lowercase, without port).
    pub fn get(&self, host: &str) -> Option<&T> {
        if let Some(value) = self.exact.get(host) {
            return Some(value);
        }
        // Suffixes from the longest: ".b.example.com", ".example.com", ".com".
        let suffixes = host.char_indices().filter(|&(i, c)| c == '.' && i > 0).map(|(i, _)| &host[i..]);
        suffixes.filter_map(|suffix| self.wildcard.get(suffix)).next().or(self.any.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(written: &str) -> Hostname {
        Hostname::parse(Some(written))
    }

    #[test]
    fn parsing_and_matching() {
        assert_eq!(Hostname::parse(None), Hostname::Any);
        assert_eq!(h("Foo.Example.com"), Hostname::Exact("foo.example.com".into()));
        assert_eq!(h("*.example.com"), Hostname::Wildcard(".example.com".into()));
        assert!(h("*.example.com").matches("a.example.com"));
        assert!(h("*.example.com").matches("a.b.example.com"), "a wildcard covers several labels");
        assert!(!h("*.example.com").matches("example.com"));
        assert!(!h("*.example.com").matches("aexample.com"));
        assert!(h("foo.example.com").matches("foo.example.com"));
        assert!(!h("foo.example.com").matches("bar.example.com"));
        assert!(Hostname::Any.matches("anything"));
        assert_eq!(h("*.example.com").to_string(), "*.example.com");
    }

    #[test]
    fn intersections_keep_the_more_specific_side() {
        let cases = [
            (None, Some("a.example.com"), Some("a.example.com")),
            (Some("*.example.com"), None, Some("*.example.com")),
            (Some("*.example.com"), Some("a.example.com"), Some("a.example.com")),
            (Some("a.example.com"), Some("*.example.com"), Some("a.example.com")),
            (Some("*.example.com"), Some("*.a.example.com"), Some("*.a.example.com")),
            (Some("*.a.example.com"), Some("*.example.com"), Some("*.a.example.com")),
            (Some("*.example.com"), Some("example.com"), None),
            (Some("*.example.com"), Some("*.example.net"), None),
            (Some("a.example.com"), Some("b.example.com"), None),
        ];
        for (listener, route, expected) in cases {
            let got = Hostname::parse(listener).intersect(&Hostname::parse(route));
            assert_eq!(got, expected.map(h), "{listener:?} x {route:?}");
        }
        assert_eq!(Hostname::Any.intersect(&Hostname::Any), Some(Hostname::Any));
    }

    #[test]
    fn the_most_specific_entry_wins() {
        let mut map = HostMap::default();
        *map.entry(&Hostname::Any) = "any";
        *map.entry(&h("*.example.com")) = "wide";
        *map.entry(&h("*.b.example.com")) = "narrow";
        *map.entry(&h("a.b.example.com")) = "exact";
        assert_eq!(map.get("a.b.example.com"), Some(&"exact"));
        assert_eq!(map.get("c.b.example.com"), Some(&"narrow"));
        assert_eq!(map.get("x.y.b.example.com"), Some(&"narrow"));
        assert_eq!(map.get("c.example.com"), Some(&"wide"));
        assert_eq!(map.get("example.com"), Some(&"any"));
        assert_eq!(map.get(""), Some(&"any"));
        map.remove(&h("a.b.example.com"));
        map.remove(&h("*.b.example.com"));
        assert_eq!(map.get("a.b.example.com"), Some(&"wide"), "removed entries no longer match");
        map.remove(&Hostname::Any);
        assert_eq!(map.get("example.com"), None);
        let mut without_any: HostMap<&str> = HostMap::default();
        *without_any.entry(&h("*.example.com")) = "wide";
        assert_eq!(without_any.get("example.com"), None);
        assert_eq!(without_any.get(".example.com"), None, "a suffix alone is not a host");
    }
}
