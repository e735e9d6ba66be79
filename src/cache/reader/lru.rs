//! A least-recently-used map bounded by a total cost (bytes, or a count when every cost is 1).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

pub(crate) struct Lru<K, V> {
    items: HashMap<K, Item<V>>,
    /// Last-use tick -> key: the first entry is the least recently used.
    order: BTreeMap<u64, K>,
    tick: u64,
    used: usize,
    budget: usize,
}

struct Item<V> {
    value: V,
    cost: usize,
    tick: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    pub(crate) fn new(budget: usize) -> Self {
        Lru {
            items: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            used: 0,
            budget,
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The value for `key`, marked as just used.
    pub(crate) fn get(&mut self, key: &K) -> Option<V> {
        let tick = self.next_tick();
        let item = self.items.get_mut(key)?;
        self.order.remove(&item.tick);
        item.tick = tick;
        self.order.insert(tick, key.clone());
        Some(item.value.clone())
    }

    /// Keep `value` unless it alone is over the budget; evicts the least recently used items
    /// until the total fits.
    pub(crate) fn insert(&mut self, key: K, value: V, cost: usize) {
        self.remove(&key);
        if cost > self.budget {
            return;
        }
        while self.used + cost > self.budget {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some(item) = self.items.remove(&old) {
                self.used -= item.cost;
            }
        }
        let tick = self.next_tick();
        self.order.insert(tick, key.clone());
        self.items.insert(key, Item { value, cost, tick });
        self.used += cost;
    }

    pub(crate) fn remove(&mut self, key: &K) {
        if let Some(item) = self.items.remove(key) {
            self.order.remove(&item.tick);
            self.used -= item.cost;
        }
    }

    /// Drop every item whose key fails `keep`.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let gone: Vec<K> = self.items.keys().filter(|k| !keep(k)).cloned().collect();
        for k in gone {
            self.remove(&k);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let mut l = Lru::new(10);
        l.insert("a", 1, 4);
        l.insert("b", 2, 4);
        assert_eq!(l.get(&"a"), Some(1));
        l.insert("c", 3, 4);
        assert_eq!(l.get(&"b"), None, "b was least recently used");
        assert_eq!(l.get(&"a"), Some(1));
        assert_eq!(l.get(&"c"), Some(3));
        assert_eq!(l.used(), 8);
        l.insert("huge", 9, 11);
        assert_eq!(l.get(&"huge"), None);
        assert_eq!(l.len(), 2);
        l.insert("a", 5, 2);
        assert_eq!((l.get(&"a"), l.used()), (Some(5), 6));
        l.retain(|k| *k != "c");
        assert_eq!((l.len(), l.used()), (1, 2));
    }
}
