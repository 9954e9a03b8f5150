//! Maglev consistent hashing (Eisenbud et al., NSDI 2016), as Cilium balances external traffic:
//! a lookup table of `M` slots (M prime) filled with backends so that every node given the same
//! backends builds the same table (a flow lands on the same endpoint whichever node it enters),
//! each backend holds about `M / N` slots, and a backend joining or leaving moves few slots
//! besides its own.
//!
//! Each backend's preference list is a permutation of the slots: `offset + j * skip (mod M)`,
//! with `offset` and `skip` from a SHA-256 of the backend's name (stable across nodes, versions
//! and architectures, unlike std's hashers); backends take turns claiming their next free
//! preferred slot until the table is full.

use sha2::{Digest, Sha256};

/// Cilium's default table size (`--bpf-lb-maglev-table-size`): prime, ~100 slots a backend at
/// 160 backends.
pub const DEFAULT_TABLE_SIZE: u32 = 16381;

/// The table sizes Cilium accepts: primes, each more than 100 times the backends it serves well.
pub const TABLE_SIZES: [u32; 9] = [251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521];

/// Builds the Maglev table of `size` slots (a prime; see [`TABLE_SIZES`]) for `backends`, named
/// by `name` (e.g. `10.244.1.5:8080`): each slot holds an index into `backends`. The result
/// depends on the set of names, not their order. Empty when there are no backends.
pub fn table<T>(backends: &[T], size: u32, name: impl Fn(&T) -> String) -> Vec<usize> {
    if backends.is_empty() {
        return Vec::new();
    }
    let m = u64::from(size);
    // Sorted by name so that the turn order, hence the table, is the same on every node.
    let mut named: Vec<(String, usize)> = backends.iter().enumerate().map(|(i, b)| (name(b), i)).collect();
    named.sort();
    let prefs: Vec<(u64, u64, usize)> = named
        .iter()
        .map(|(name, index)| {
            let digest = Sha256::digest(name.as_bytes());
            let word = |at: usize| u64::from_le_bytes(digest[at..at + 8].try_into().expect("8 bytes of 32"));
            (word(0) % m, word(8) % (m - 1) + 1, *index)
        })
        .collect();
    let mut slots: Vec<Option<usize>> = vec![None; size as usize];
    let mut next = vec![0u64; prefs.len()];
    let mut filled = 0usize;
    // Every round gives each backend one slot; a permutation visits every slot, so a backend
    // always finds a free one while any is left: the loop ends after `size` claims.
    'fill: loop {
        for (b, &(offset, skip, index)) in prefs.iter().enumerate() {
            let slot = loop {
                let candidate = (offset + next[b] * skip) % m;
                next[b] += 1;
                if slots[candidate as usize].is_none() {
                    break candidate as usize;
                }
            };
            slots[slot] = Some(index);
            filled += 1;
            if filled == slots.len() {
                break 'fill;
            }
        }
    }
    slots.into_iter().map(|s| s.expect("every slot filled")).collect()
}

/// True for a usable table size (one of [`TABLE_SIZES`]).
pub fn is_table_size(size: u32) -> bool {
    TABLE_SIZES.contains(&size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.244.{}.{}:8080", i / 250, i % 250 + 1)).collect()
    }

    fn by_name(backends: &[String], size: u32) -> Vec<String> {
        table(backends, size, |b| b.clone()).into_iter().map(|i| backends[i].clone()).collect()
    }

    #[test]
    fn every_backend_gets_an_even_share_of_the_slots() {
        let backends = names(10);
        let slots = by_name(&backends, 1021);
        assert_eq!(slots.len(), 1021);
        for b in &backends {
            let share = slots.iter().filter(|s| *s == b).count();
            assert!((101..=103).contains(&share), "{b}: {share} of 1021 slots");
        }
    }

    #[test]
    fn the_table_depends_on_the_backends_not_their_order() {
        let backends = names(7);
        let mut reversed = backends.clone();
        reversed.reverse();
        assert_eq!(by_name(&backends, 251), by_name(&reversed, 251));
    }

    #[test]
    fn a_backend_leaving_moves_little_besides_its_own_slots() {
        let backends = names(100);
        let before = by_name(&backends, DEFAULT_TABLE_SIZE);
        let gone = &backends[37];
        let fewer: Vec<String> = backends.iter().filter(|b| *b != gone).cloned().collect();
        let after = by_name(&fewer, DEFAULT_TABLE_SIZE);
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a && *b != gone).count();
        // Maglev's bound: a few percent of the table beyond the leaving backend's own share.
        assert!(moved * 100 < DEFAULT_TABLE_SIZE as usize * 3, "{moved} of {DEFAULT_TABLE_SIZE} slots moved");
        assert!(after.iter().all(|a| a != gone));
    }

    #[test]
    fn one_backend_takes_every_slot_and_none_gives_an_empty_table() {
        assert_eq!(by_name(&names(1), 251), vec![names(1)[0].clone(); 251]);
        assert!(table::<String>(&[], 251, |b| b.clone()).is_empty());
    }

    #[test]
    fn only_the_listed_primes_are_table_sizes() {
        assert!(TABLE_SIZES.iter().all(|&m| (2..m).take_while(|d| d * d <= m).all(|d| m % d != 0)), "primes");
        assert!(is_table_size(DEFAULT_TABLE_SIZE) && !is_table_size(16384));
    }
}
