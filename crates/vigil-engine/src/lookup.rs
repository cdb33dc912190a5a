//! Read access to objects by name, so the engine takes the caller's own indexes (reflector
//! stores, simulator maps) without copying them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Finds an object by name (or `namespace/name`, as the caller keys it).
pub trait Lookup<T> {
    /// The object under `key`, if present.
    fn lookup(&self, key: &str) -> Option<&T>;
}

impl<T> Lookup<T> for HashMap<String, T> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key)
    }
}

impl<T> Lookup<T> for HashMap<String, Arc<T>> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key).map(|a| a.as_ref())
    }
}

impl<T> Lookup<T> for BTreeMap<String, T> {
    fn lookup(&self, key: &str) -> Option<&T> {
        self.get(key)
    }
}

impl<T> Lookup<T> for HashMap<String, &T> {
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
