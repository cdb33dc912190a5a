//! The small pieces of shared state the controller's tasks keep beside the index, each behind
//! its own lock and changed only through its methods: which targets a confirmation holds right
//! now, what was already told once, how many applies of a check failed in a row, and the clients
//! of the connected workload clusters. [`crate::context::Context`] holds one of each.

use kube::Client;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use vigil_engine::target::{CheckRef, Target};
use vigil_index::index::WorkloadCluster;
use vigil_index::sources::ClusterRef;

/// Locks a poisoned mutex anyway: every value behind these locks stays whole between calls.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Targets whose remediation is being confirmed and written, with the check doing it: a second
/// check deciding on the same target at the same moment waits for the first. A confirmation
/// lock, not a holder's claim: it lasts from the confirming read to the write.
#[derive(Default)]
pub struct TargetLocks(Mutex<HashMap<Target, CheckRef>>);

impl TargetLocks {
    /// Locks `targets` for `key`; returns the ones another check's confirmation holds right now
    /// (left out).
    pub fn lock(&self, key: &CheckRef, targets: &BTreeSet<Target>) -> BTreeSet<Target> {
        let mut locks = lock(&self.0);
        let mut refused = BTreeSet::new();
        for t in targets {
            match locks.get(t) {
                Some(holder) if holder != key => {
                    refused.insert(t.clone());
                }
                _ => {
                    locks.insert(t.clone(), key.clone());
                }
            }
        }
        refused
    }

    /// Unlocks what `key` locked of `targets`.
    pub fn unlock(&self, key: &CheckRef, targets: &BTreeSet<Target>) {
        let mut locks = lock(&self.0);
        for t in targets {
            if locks.get(t) == Some(key) {
                locks.remove(t);
            }
        }
    }
}

/// What was already told, so each thing is told once (an unreadable Node field: its cluster,
/// Node and field).
pub struct ToldOnce<T>(Mutex<HashSet<T>>);

impl<T> Default for ToldOnce<T> {
    fn default() -> Self {
        ToldOnce(Mutex::new(HashSet::new()))
    }
}

impl<T: Eq + Hash> ToldOnce<T> {
    /// Whether `what` is told for the first time (and remembers it).
    pub fn first(&self, what: T) -> bool {
        lock(&self.0).insert(what)
    }
}

/// An unreadable Node field: its cluster, Node and field.
pub type UnreadableField = (ClusterRef, String, String);

/// Failed applies in a row per check: the retry delay grows with them.
#[derive(Default)]
pub struct Failures(Mutex<HashMap<CheckRef, u32>>);

impl Failures {
    /// One more failure of `key`'s apply; how many in a row now.
    pub fn failed(&self, key: &CheckRef) -> u32 {
        let mut f = lock(&self.0);
        let n = f.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// `key`'s apply succeeded: the count starts again.
    pub fn succeeded(&self, key: &CheckRef) {
        lock(&self.0).remove(key);
    }
}

/// Clients of the connected workload clusters, for confirming reads.
#[derive(Default)]
pub struct WorkloadClients(Mutex<HashMap<WorkloadCluster, Client>>);

impl WorkloadClients {
    /// `cluster`'s client, when connected.
    pub fn get(&self, cluster: &WorkloadCluster) -> Option<Client> {
        lock(&self.0).get(cluster).cloned()
    }

    /// `cluster` connected through `client`.
    pub fn connected(&self, cluster: WorkloadCluster, client: Client) {
        lock(&self.0).insert(cluster, client);
    }

    /// `cluster` is no longer connected.
    pub fn gone(&self, cluster: &WorkloadCluster) {
        lock(&self.0).remove(cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_locked_by_one_check_is_refused_to_another_until_unlocked() {
        let locks = TargetLocks::default();
        let (a, b) = (CheckRef::Node { name: "a".into() }, CheckRef::Node { name: "b".into() });
        let n1 = BTreeSet::from([Target::local_node("n1")]);
        assert!(locks.lock(&a, &n1).is_empty());
        assert!(locks.lock(&a, &n1).is_empty(), "the same check again");
        assert_eq!(locks.lock(&b, &n1), n1);
        locks.unlock(&b, &n1);
        assert_eq!(locks.lock(&b, &n1), n1, "only the holder unlocks");
        locks.unlock(&a, &n1);
        assert!(locks.lock(&b, &n1).is_empty());
    }

    #[test]
    fn failures_count_in_a_row_and_start_again_after_a_success() {
        let f = Failures::default();
        let a = CheckRef::Node { name: "a".into() };
        assert_eq!((f.failed(&a), f.failed(&a)), (1, 2));
        f.succeeded(&a);
        assert_eq!(f.failed(&a), 1);
    }

    #[test]
    fn a_thing_is_told_the_first_time_only() {
        let told = ToldOnce::default();
        assert!(told.first(("n1", "field")));
        assert!(!told.first(("n1", "field")));
        assert!(told.first(("n2", "field")));
    }
}
