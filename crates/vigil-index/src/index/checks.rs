//! The health checks of one kind as the index keeps them: each object with what was read and
//! validated from it when it was stored and what the index derives from it for decisions, under
//! one version ordering for both kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_api::{MachineHealthCheck, NodeHealthCheck};

/// A health-check object: what the version ordering and the change test read of it.
pub trait CheckObject {
    /// Its metadata (resourceVersion, generation, annotations, deletion).
    fn meta(&self) -> &ObjectMeta;
    /// Whether its status differs from `other`'s.
    fn status_differs(&self, other: &Self) -> bool;
}

impl CheckObject for MachineHealthCheck {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn status_differs(&self, other: &Self) -> bool {
        self.status != other.status
    }
}

impl CheckObject for NodeHealthCheck {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn status_differs(&self, other: &Self) -> bool {
        self.status != other.status
    }
}

/// One check: the object, why its spec could not be read (it is then kept with an empty spec,
/// so that its status can say why), its spec validated when it was stored (decisions and claims
/// read it instead of validating again), and what the index keeps derived from it (`D`: its
/// target Machines, or the Nodes its decisions need), renewed when its spec changes.
#[derive(Debug)]
pub struct CheckEntry<C, P, D> {
    /// The object as last stored.
    pub object: Arc<C>,
    /// Why its spec could not be read, if it could not.
    pub read_error: Option<String>,
    /// Its spec validated: the policy, or the error a decision reports.
    pub policy: Result<Arc<P>, String>,
    /// What the index derives from it and keeps up to date as other objects change.
    pub derived: D,
}

/// What storing one version of a check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The index already held this version or a newer one: nothing changed.
    Stale,
    /// Stored. `changed`: anything but its status changed (or it is new or gone), so its
    /// decisions change; `status_moved`: only its status changed, to one the controller did not
    /// last write; `renew`: its derived state is to be worked out again.
    Kept {
        /// Anything but the status changed.
        changed: bool,
        /// Only the status changed.
        status_moved: bool,
        /// The derived state must be worked out again (new check, or its spec changed).
        renew: bool,
    },
}

/// The checks of one kind by key.
#[derive(Debug)]
pub struct Checks<K, C, P, D> {
    entries: BTreeMap<K, CheckEntry<C, P, D>>,
}

impl<K, C, P, D> Default for Checks<K, C, P, D> {
    fn default() -> Self {
        Checks { entries: BTreeMap::new() }
    }
}

impl<K: Ord + Clone, C: CheckObject, P, D: Default> Checks<K, C, P, D> {
    /// The check stored under `key`.
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&Arc<C>>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key).map(|e| &e.object)
    }

    /// The check and its key as the index holds it (no key is built by the caller).
    pub fn get_key_value<Q: Ord + ?Sized>(&self, key: &Q) -> Option<(&K, &Arc<C>)>
    where
        K: Borrow<Q>,
    {
        self.entries.get_key_value(key).map(|(k, e)| (k, &e.object))
    }

    /// Everything the index keeps of the check under `key`.
    pub fn entry<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&CheckEntry<C, P, D>>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key)
    }

    /// The check's spec as validated when it was stored: its policy, or the error.
    pub fn policy<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&Result<Arc<P>, String>>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key).map(|e| &e.policy)
    }

    /// Why the check's spec could not be read, if it could not.
    pub fn read_error<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&str>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key).and_then(|e| e.read_error.as_deref())
    }

    /// Whether a check is stored under `key`.
    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.entries.contains_key(key)
    }

    /// Every check, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &Arc<C>)> {
        self.entries.iter().map(|(k, e)| (k, &e.object))
    }

    /// Every check with all the index keeps of it, by key.
    pub fn entries(&self) -> impl Iterator<Item = (&K, &CheckEntry<C, P, D>)> {
        self.entries.iter()
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    /// How many checks are stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every check's derived state, to keep up to date as the objects it derives from change.
    pub(crate) fn derived_mut(&mut self) -> impl Iterator<Item = (&K, &P, &mut D)> {
        self.entries.iter_mut().filter_map(|(k, e)| Some((k, e.policy.as_deref().ok()?, &mut e.derived)))
    }

    /// One check's derived state, with its policy when valid.
    pub(crate) fn derived_of(&mut self, key: &K) -> Option<(Option<&P>, &mut D)> {
        self.entries.get_mut(key).map(|e| (e.policy.as_deref().ok(), &mut e.derived))
    }

    /// Stores `object` under `key` unless the index holds that version or a newer one; its spec
    /// is validated by `validate`. The derived state is kept (`renew` says when it is stale).
    pub(crate) fn put(
        &mut self,
        key: K,
        object: C,
        read_error: Option<String>,
        validate: impl FnOnce(&C) -> Result<P, String>,
    ) -> Stored {
        let held = self.entries.get(&key).map(|e| e.object.as_ref());
        if let Some(held) = held
            && not_newer(object.meta().resource_version.as_deref(), held.meta().resource_version.as_deref())
        {
            return Stored::Stale;
        }
        let changed = needs_decision(Some(object.meta()), held.map(CheckObject::meta));
        let status_moved = !changed && held.is_some_and(|h| h.status_differs(&object));
        let policy = validate(&object).map(Arc::new);
        let kept = self.entries.remove(&key).map(|e| e.derived);
        let renew = changed || kept.is_none();
        let derived = kept.unwrap_or_default();
        self.entries.insert(key, CheckEntry { object: Arc::new(object), read_error, policy, derived });
        Stored::Kept { changed, status_moved, renew }
    }

    /// Forgets the check under `key`; whether it was stored.
    pub(crate) fn remove(&mut self, key: &K) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Forgets every check.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Keeps only the checks whose key `keep` accepts.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }
}

impl<C: CheckObject, P, D: Default> Checks<(String, String), C, P, D> {
    /// The checks of one namespace, by key.
    pub fn in_namespace<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a (String, String), &'a CheckEntry<C, P, D>)> + 'a {
        self.entries.range((namespace.to_string(), String::new())..).take_while(move |((ns, _), _)| ns == namespace)
    }
}

/// Whether `incoming` is a version of an object that the index already holds (`stored`) or
/// one older than it. The controller puts the API server's answer to its own writes into the
/// index at once (so the next decision does not repeat them); the watch then delivers the
/// same version, or, after a conflict retry, versions older than the one already held. An
/// etcd-backed API server numbers versions with its store's increasing revision; when either
/// version is not a number, the incoming object is taken as is.
pub fn not_newer(incoming: Option<&str>, stored: Option<&str>) -> bool {
    match (incoming.and_then(|v| v.parse::<u64>().ok()), stored.and_then(|v| v.parse::<u64>().ok())) {
        (Some(i), Some(s)) => i <= s,
        _ => false,
    }
}

/// Whether a health check's update can change its decision: anything but its status. A status
/// that moved still gets a decision of that check alone (`Stored::Kept::status_moved`): the
/// answer to our own write is stored when it is made, so its echo is "not newer" and never gets
/// here, and a status that does get here is one the controller did not last write — another
/// writer's, or one of ours that a relist (from before the write) had replaced with an older
/// version. Without that decision the stored status would stay wrong until something else
/// changed.
fn needs_decision(new: Option<&ObjectMeta>, old: Option<&ObjectMeta>) -> bool {
    match (new, old) {
        (Some(new), Some(old)) => {
            new.generation != old.generation
                || new.annotations != old.annotations
                || new.deletion_timestamp != old.deletion_timestamp
        }
        _ => true,
    }
}
