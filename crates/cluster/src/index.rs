//! Multi-valued indexes: a key to a set of values, with no empty sets kept.

use std::collections::{BTreeMap, BTreeSet};

/// A key to a non-empty set of values.
pub(crate) type Index<K, V> = BTreeMap<K, BTreeSet<V>>;

/// Adds `value` under `key`.
pub(crate) fn insert<K: Ord, V: Ord>(index: &mut Index<K, V>, key: K, value: V) {
    index.entry(key).or_default().insert(value);
}

/// Removes `value` from under `key`, dropping the key when no value is left.
pub(crate) fn remove<K: Ord, V: Ord>(index: &mut Index<K, V>, key: &K, value: &V) {
    if let Some(values) = index.get_mut(key) {
        values.remove(value);
        if values.is_empty() {
            index.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_empty_keys() {
        let mut index = Index::new();
        insert(&mut index, "k", 1);
        insert(&mut index, "k", 2);
        remove(&mut index, &"k", &1);
        assert_eq!(index["k"], BTreeSet::from([2]));
        remove(&mut index, &"k", &2);
        remove(&mut index, &"missing", &2);
        assert!(index.is_empty());
    }
}
