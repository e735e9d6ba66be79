//! A least-recently-used map bounded by a total cost (bytes, or a count when every cost is 1):
//! the `lru` crate's list, with the cost accounting on top.

use std::hash::Hash;

use lru::LruCache;

pub(crate) struct Lru<K: Hash + Eq, V> {
    items: LruCache<K, (V, usize)>,
    used: usize,
    budget: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    pub(crate) fn new(budget: usize) -> Self {
        Lru {
            items: LruCache::unbounded(),
            used: 0,
            budget,
        }
    }

    /// The value for `key`, marked as just used.
    pub(crate) fn get(&mut self, key: &K) -> Option<V> {
        self.items.get(key).map(|(v, _)| v.clone())
    }

    /// Keep `value` unless it alone is over the budget; evicts the least recently used items
    /// until the total fits.
    pub(crate) fn insert(&mut self, key: K, value: V, cost: usize) {
        self.remove(&key);
        if cost > self.budget {
            return;
        }
        while self.used + cost > self.budget {
            let Some((_, (_, c))) = self.items.pop_lru() else {
                break;
            };
            self.used -= c;
        }
        self.items.put(key, (value, cost));
        self.used += cost;
    }

    pub(crate) fn remove(&mut self, key: &K) {
        if let Some((_, c)) = self.items.pop(key) {
            self.used -= c;
        }
    }

    /// Drop every item whose key fails `keep`.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let gone: Vec<K> = self
            .items
            .iter()
            .filter(|(k, _)| !keep(k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// Every value, in no particular order (recency is not touched).
    pub(crate) fn for_each_value(&self, mut f: impl FnMut(&V)) {
        self.items.iter().for_each(|(_, (v, _))| f(v));
    }

    /// Values from the least recently used on, while `f` returns true (recency is not touched).
    pub(crate) fn for_each_oldest_first(&self, mut f: impl FnMut(&V) -> bool) {
        for (_, (v, _)) in self.items.iter().rev() {
            if !f(v) {
                break;
            }
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
        let mut order = Vec::new();
        l.for_each_oldest_first(|v| {
            order.push(*v);
            true
        });
        assert_eq!(order, [3, 5], "c, then the just-inserted a");
        let mut first = Vec::new();
        l.for_each_oldest_first(|v| {
            first.push(*v);
            false
        });
        assert_eq!(first, [3]);
        l.retain(|k| *k != "c");
        assert_eq!((l.len(), l.used()), (1, 2));
    }
}
