//! Hash tables that give their memory back after a burst.
//!
//! A table keyed by conversation or event grows to the largest number held at once (ten
//! thousand conversations arriving together) and keeps that capacity after its entries are
//! removed. The tables below shrink once under a quarter of their capacity is used, to twice
//! what they hold: a shrink follows at least as many removals as the entries it keeps, so its
//! copy is amortized over them.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// Below this capacity a table is not worth shrinking.
const SMALL: usize = 64;

fn sparse(len: usize, capacity: usize) -> bool {
    capacity > SMALL && len.saturating_mul(4) < capacity
}

/// Shrinks `map` once it is mostly empty (see the module).
pub(crate) fn shrink_map<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    if sparse(map.len(), map.capacity()) {
        map.shrink_to(map.len().saturating_mul(2).max(SMALL));
    }
}

/// Shrinks `set` once it is mostly empty (see the module).
pub(crate) fn shrink_set<K: Eq + Hash>(set: &mut HashSet<K>) {
    if sparse(set.len(), set.capacity()) {
        set.shrink_to(set.len().saturating_mul(2).max(SMALL));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_emptied_after_a_burst_shrinks_and_a_busy_one_keeps_its_capacity() {
        let mut map: HashMap<u32, u32> = (0..10_000).map(|n| (n, n)).collect();
        for n in 0..5_000 {
            map.remove(&n);
            shrink_map(&mut map);
        }
        // (Removals leave tombstones that the capacity counts out, so it is not exact.)
        assert!(
            map.capacity() >= 10_000,
            "half full: {} slots",
            map.capacity()
        );
        for n in 5_000..9_990 {
            map.remove(&n);
            shrink_map(&mut map);
        }
        assert!(
            map.capacity() <= 2 * SMALL,
            "ten left: {} slots",
            map.capacity()
        );
        assert_eq!(map.len(), 10);
        assert!((9_990..10_000).all(|n| map.get(&n) == Some(&n)));

        let mut set: HashSet<u32> = (0..10_000).collect();
        for n in 0..9_999 {
            set.remove(&n);
            shrink_set(&mut set);
        }
        assert!(
            set.capacity() <= 2 * SMALL,
            "one left: {} slots",
            set.capacity()
        );
        assert!(set.contains(&9_999));
    }
}
