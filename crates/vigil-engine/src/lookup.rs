//! Read access to objects by name, so the engine takes the caller's own indexes (reflector
//! stores, simulator maps) without copying them. The hash maps may use any hasher: the caller
//! picks it (a fast one such as `foldhash` makes a 100 000-target decision measurably faster
//! than the default SipHash, see docs/performance-history.md).

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::Arc;

/// Finds an object by name (or `namespace/name`, as the caller keys it).
pub trait Lookup<T> {
    /// The object under `key`, if present.
    fn lookup(&self, key: &str) -> Option<&T>;
}

impl<T, S: BuildHasher> Lookup<T> for HashMap<String, T, S> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key)
    }
}

impl<T, S: BuildHasher> Lookup<T> for HashMap<String, Arc<T>, S> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key).map(|a| a.as_ref())
    }
}

impl<T> Lookup<T> for BTreeMap<String, T> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key)
    }
}

impl<T, S: BuildHasher> Lookup<T> for HashMap<String, &T, S> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key).copied()
    }
}

/// A lookup that holds nothing.
pub struct Empty;

impl<T> Lookup<T> for Empty {
    fn lookup(&self, _key: &str) -> Option<&T> {
        None
    }
}
