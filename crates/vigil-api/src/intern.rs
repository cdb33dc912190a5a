//! One shared copy of the strings that repeat across thousands of cached objects (condition
//! types, statuses and reasons, label keys): 10 000 Nodes carry the same handful of condition
//! types and the same dozen label keys, and one `Arc<str>` each is 16 bytes instead of a heap
//! string. The table is bounded, so strings written by tenants (any reason, any label key)
//! cannot grow it without limit: when it is full, entries no cached object uses any more are
//! dropped, and if it is still full a string is simply not shared.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

/// Most distinct strings the process-wide table holds.
const CAPACITY: usize = 4096;

/// A bounded table of shared strings.
struct Interner {
    set: Mutex<HashSet<Arc<str>>>,
    capacity: usize,
}

impl Interner {
    fn new(capacity: usize) -> Self {
        Interner { set: Mutex::new(HashSet::new()), capacity }
    }

    fn intern(&self, s: &str) -> Arc<str> {
        // A poisoned lock only means another thread panicked while holding it; the set is intact.
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = set.get(s) {
            return shared.clone();
        }
        if set.len() >= self.capacity {
            // Only the table holds these: no cached object shares them any more.
            set.retain(|e| Arc::strong_count(e) > 1);
        }
        let fresh: Arc<str> = Arc::from(s);
        if set.len() < self.capacity {
            set.insert(fresh.clone());
        }
        fresh
    }
}

/// The shared copy of `s` (a fresh one when the table is full of strings still in use).
pub fn intern(s: &str) -> Arc<str> {
    static TABLE: OnceLock<Interner> = OnceLock::new();
    TABLE.get_or_init(|| Interner::new(CAPACITY)).intern(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_share_one_copy() {
        let a = intern("KubeletReady");
        let b = intern(&String::from("KubeletReady"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "KubeletReady");
        assert!(!Arc::ptr_eq(&a, &intern("KubeletNotReady")));
    }

    #[test]
    fn a_full_table_drops_unused_entries_and_still_answers() {
        let table = Interner::new(2);
        let (a, b) = (table.intern("a"), table.intern("b"));
        // Full of strings in use: a new one comes back equal, just not shared.
        let c = table.intern("c");
        assert_eq!(&*c, "c");
        assert!(!Arc::ptr_eq(&c, &table.intern("c")));
        assert!(Arc::ptr_eq(&a, &table.intern("a")));
        // `b` is no longer used by anyone: the next miss makes room, and `d` is shared.
        drop(b);
        let d = table.intern("d");
        assert!(Arc::ptr_eq(&d, &table.intern("d")));
        assert!(Arc::ptr_eq(&a, &table.intern("a")), "an entry in use is kept");
    }
}
