//! The simulator's object store: what an API server keeps, reduced to what the scenario needs —
//! objects by cluster, group, kind, namespace and name, with uids, resource versions and
//! generations, all deterministic so a run is reproducible. (No `generateName`: nothing Vigil
//! makes has a server-generated name.)

use jiff::Timestamp;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::BTreeMap;
use vigil_engine::concerns::group_of;
use vigil_engine::machine_write::apply_merge_patch;
use vigil_engine::target::LOCAL_CLUSTER as LOCAL_CLUSTER_KEY;

/// A time as the API server keeps a `metav1.Time` (creation and deletion times, conditions'
/// times): whole seconds, the rest dropped. Timed on a faster clock, two changes within one
/// second are then as alike in the simulator as they are in a cluster.
pub fn api_time(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

/// Where an object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// [`vigil_engine::target::LOCAL_CLUSTER`] or a workload cluster's `namespace/clusterName`.
    pub cluster: String,
    /// API group (`""` for core).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace (`""` for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Key {
    /// The key of `object` in `cluster`.
    pub fn of(cluster: &str, object: &Value) -> Key {
        let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        Key {
            cluster: cluster.to_string(),
            group: group_of(&text("/apiVersion")).to_string(),
            kind: text("/kind"),
            namespace: text("/metadata/namespace"),
            name: text("/metadata/name"),
        }
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn object_name(&self) -> String {
        if self.namespace.is_empty() { self.name.clone() } else { format!("{}/{}", self.namespace, self.name) }
    }
}

/// The in-memory objects.
#[derive(Debug, Default, Clone)]
pub struct Store {
    objects: BTreeMap<Key, Stored>,
    counter: u64,
}

/// Deeper than this an object stays a tree: JSON text is read back with serde_json's nesting
/// limit (128), and a tree built from YAML has none.
const MAX_PACKED_DEPTH: usize = 100;

/// One object: a tree, or (once the simulator's index has read it) its compact JSON text, read
/// back into a tree the first time it is asked for whole. At 10 000 Nodes and Machines the trees of objects
/// nothing reads were most of `vigil check`'s memory; their text is a sixth of it.
#[derive(Debug, Clone)]
enum Stored {
    Tree(Value),
    Packed { text: Box<RawValue>, tree: OnceCell<Value> },
}

impl Stored {
    fn tree(&self) -> &Value {
        match self {
            Stored::Tree(v) => v,
            Stored::Packed { text, tree } => tree.get_or_init(|| read_back(text)),
        }
    }

    fn into_tree(self) -> Value {
        match self {
            Stored::Tree(v) => v,
            Stored::Packed { text, tree } => tree.into_inner().unwrap_or_else(|| read_back(&text)),
        }
    }
}

/// The tree of a packed object. The text was written by serde_json from a tree no deeper than
/// [`MAX_PACKED_DEPTH`], so it reads back; were it ever not to, the object reads as `null`,
/// which no rule takes for a target.
fn read_back(text: &RawValue) -> Value {
    serde_json::from_str(text.get()).unwrap_or(Value::Null)
}

/// How deeply `v` nests (a scalar is 0).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A create that found the name taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlreadyExists(pub Key);

impl Store {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Creates or replaces an object whole, as `kubectl apply` of a full manifest would; keeps the
    /// uid and creation time of the object it replaces and bumps the generation when the spec
    /// changes.
    pub fn apply(&mut self, cluster: &str, mut object: Value, now: Timestamp) -> Key {
        let key = Key::of(cluster, &object);
        let rv = self.next();
        let previous = self.objects.get(&key).map(Stored::tree);
        let meta = &mut object["metadata"];
        let keep = |field: &str| previous.and_then(|p| p.pointer(&format!("/metadata/{field}")).cloned());
        if meta.get("uid").is_none() {
            meta["uid"] = keep("uid").unwrap_or_else(|| json!(format!("uid-{rv}")));
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = keep("creationTimestamp").unwrap_or_else(|| json!(api_time(now)));
        }
        let generation = match previous {
            Some(p) if p.get("spec") == object.get("spec") => {
                p.pointer("/metadata/generation").cloned().unwrap_or(json!(1))
            }
            Some(p) => json!(p.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0) + 1),
            None => json!(1),
        };
        object["metadata"]["generation"] = generation;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(key.clone(), Stored::Tree(object));
        key
    }

    /// An object to change in place: a packed one becomes a tree again.
    fn object_mut(&mut self, key: &Key) -> Option<&mut Value> {
        let stored = self.objects.get_mut(key)?;
        if let Stored::Packed { text, tree } = stored {
            let object = tree.take().unwrap_or_else(|| read_back(text));
            *stored = Stored::Tree(object);
        }
        match stored {
            Stored::Tree(object) => Some(object),
            Stored::Packed { .. } => None,
        }
    }

    /// Keeps an object as its compact JSON text until it is read or changed (a packed one lets go
    /// of the tree it was read into): for what the simulator holds once its index has read it,
    /// most of which no decision reads again whole.
    pub fn pack(&mut self, key: &Key) {
        let Some(stored) = self.objects.get_mut(key) else { return };
        let object = match stored {
            Stored::Packed { tree, .. } => {
                tree.take();
                return;
            }
            Stored::Tree(object) => object,
        };
        if depth(object) > MAX_PACKED_DEPTH {
            return;
        }
        if let Ok(text) = serde_json::value::to_raw_value(object) {
            *stored = Stored::Packed { text, tree: OnceCell::new() };
        }
    }

    /// Creates an object, refused when one of that name exists (as the API server answers 409).
    pub fn create(&mut self, cluster: &str, object: Value, now: Timestamp) -> Result<Key, AlreadyExists> {
        let key = Key::of(cluster, &object);
        if self.objects.contains_key(&key) {
            return Err(AlreadyExists(key));
        }
        Ok(self.apply(cluster, object, now))
    }

    /// Removes an object.
    pub fn delete(&mut self, key: &Key) -> Option<Value> {
        self.objects.remove(key).map(Stored::into_tree)
    }

    /// Deletes an object as the API server does: one with finalizers stays, with
    /// `deletionTimestamp`, until its last finalizer is removed ([`Store::remove_finalizer`]).
    /// Returns the object as it was, and whether it is gone.
    pub fn request_delete(&mut self, key: &Key, now: Timestamp) -> Option<(Value, bool)> {
        let before = self.objects.get(key)?.tree().clone();
        let held = before.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if !held {
            self.objects.remove(key);
            return Some((before, true));
        }
        if before.pointer("/metadata/deletionTimestamp").is_none() {
            let rv = self.next();
            if let Some(object) = self.object_mut(key) {
                object["metadata"]["deletionTimestamp"] = json!(api_time(now));
                object["metadata"]["resourceVersion"] = json!(rv.to_string());
            }
        }
        Some((before, false))
    }

    /// Removes `finalizer` from an object; one being deleted goes once none is left. Returns the
    /// object as it was, and whether it is gone.
    pub fn remove_finalizer(&mut self, key: &Key, finalizer: &str) -> Option<(Value, bool)> {
        let before = self.objects.get(key)?.tree().clone();
        let rv = self.next();
        let object = self.object_mut(key)?;
        if let Some(list) = object.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
            list.retain(|f| f.as_str() != Some(finalizer));
        }
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let left = object.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        let deleting = object.pointer("/metadata/deletionTimestamp").is_some();
        if deleting && !left {
            self.objects.remove(key);
        }
        Some((before, deleting && !left))
    }

    /// Replaces an object only if it is still at `resource_version` (an update's precondition).
    pub fn replace_at(&mut self, object: Value, resource_version: &str, now: Timestamp) -> Result<Key, String> {
        let key = Key::of(LOCAL_CLUSTER_KEY, &object);
        match self.get(&key).and_then(|o| o.pointer("/metadata/resourceVersion")).and_then(Value::as_str) {
            Some(rv) if rv == resource_version => Ok(self.apply(LOCAL_CLUSTER_KEY, object, now)),
            Some(_) => Err(format!("conflict on {} {}", key.kind, key.object_name())),
            None => Err(format!("{} {} not found", key.kind, key.object_name())),
        }
    }

    /// An object, read back for this use only when packed: for a caller passing over many
    /// objects once (a report), which [`Store::get`] would leave all read back.
    pub fn read(&self, key: &Key) -> Option<Cow<'_, Value>> {
        Some(match self.objects.get(key)? {
            Stored::Tree(object) => Cow::Borrowed(object),
            Stored::Packed { tree, text } => match tree.get() {
                Some(object) => Cow::Borrowed(object),
                None => Cow::Owned(read_back(text)),
            },
        })
    }

    /// Whether an object is stored (without reading a packed one back).
    pub fn contains(&self, key: &Key) -> bool {
        self.objects.contains_key(key)
    }

    /// The object under `key` (a packed one is read back and kept until it next changes).
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key).map(Stored::tree)
    }

    /// Applies a JSON merge patch, bumping the resource version; refuses a stale
    /// `metadata.resourceVersion` like the API server does.
    pub fn patch(&mut self, key: &Key, patch: &Value) -> Result<(), String> {
        let rv = self.next();
        let Some(object) = self.object_mut(key) else {
            return Err(format!("{} {} not found", key.kind, key.object_name()));
        };
        if let Some(expected) = patch.pointer("/metadata/resourceVersion")
            && object.pointer("/metadata/resourceVersion") != Some(expected)
        {
            return Err(format!("conflict on {} {}", key.kind, key.object_name()));
        }
        apply_merge_patch(object, patch);
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        Ok(())
    }

    /// Replaces an object's status.
    pub fn set_status(&mut self, key: &Key, status: Value) {
        let rv = self.next();
        if let Some(object) = self.object_mut(key) {
            object["status"] = status;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
        }
    }

    /// Objects of a kind in a cluster (and namespace, when given), in key order.
    pub fn list<'a>(
        &'a self,
        cluster: &'a str,
        group: &'a str,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        // Keys sort by cluster, group, kind, namespace, name: the objects asked for are one run
        // of the map, found in O(log n) (a scan of every object made loading a fleet quadratic).
        let start = Key {
            cluster: cluster.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
            namespace: namespace.unwrap_or("").to_string(),
            name: String::new(),
        };
        self.objects
            .range(start..)
            .take_while(move |(k, _)| {
                k.cluster == cluster
                    && k.group == group
                    && k.kind == kind
                    && namespace.is_none_or(|ns| k.namespace == ns)
            })
            .map(|(k, o)| (k, o.tree()))
    }

    /// Every object, in key order, read back one at a time (for a dump of the whole store).
    pub fn all(&self) -> impl Iterator<Item = (&Key, Cow<'_, Value>)> {
        self.objects.keys().filter_map(|k| Some((k, self.read(k)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::target::LOCAL_CLUSTER;

    fn now() -> Timestamp {
        "2030-01-01T00:00:00Z".parse().expect("ts")
    }

    #[test]
    fn list_returns_exactly_the_objects_of_a_cluster_kind_and_namespace() {
        let mut s = Store::default();
        let objects = [
            ("", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})),
            ("", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})),
            ("ns/prod", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}})),
            ("", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}})),
            (
                "",
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m1", "namespace": "a"}}),
            ),
            (
                "",
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m2", "namespace": "b"}}),
            ),
            (
                "",
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "metadata": {"name": "s", "namespace": "a"}}),
            ),
            ("", json!({"apiVersion": "x.io/v1", "kind": "Machine", "metadata": {"name": "other", "namespace": "a"}})),
        ];
        for (cluster, o) in objects {
            s.apply(cluster, o, now());
        }
        let names = |cluster: &str, group: &str, kind: &str, ns: Option<&str>| -> Vec<String> {
            s.list(cluster, group, kind, ns).map(|(k, _)| k.name.clone()).collect()
        };
        assert_eq!(names(LOCAL_CLUSTER, "", "Node", None), ["n1", "n2"]);
        assert_eq!(names("ns/prod", "", "Node", None), ["w1"]);
        assert_eq!(names(LOCAL_CLUSTER, "cluster.x-k8s.io", "Machine", None), ["m1", "m2"]);
        assert_eq!(names(LOCAL_CLUSTER, "cluster.x-k8s.io", "Machine", Some("a")), ["m1"]);
        assert_eq!(names(LOCAL_CLUSTER, "cluster.x-k8s.io", "Machine", Some("c")), Vec::<String>::new());
        assert_eq!(names(LOCAL_CLUSTER, "x.io", "Machine", None), ["other"]);
    }

    #[test]
    fn apply_keeps_identity_and_bumps_generation_on_spec_change() {
        let mut s = Store::default();
        let k = s.apply(
            LOCAL_CLUSTER,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {"a": 1}}),
            now(),
        );
        let uid = s.get(&k).expect("stored")["metadata"]["uid"].clone();
        s.apply(
            LOCAL_CLUSTER,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {"a": 2}}),
            now(),
        );
        let o = s.get(&k).expect("stored");
        assert_eq!(o["metadata"]["uid"], uid);
        assert_eq!(o["metadata"]["generation"], 2);
    }

    #[test]
    fn create_refuses_duplicates() {
        let mut s = Store::default();
        let o = json!({"apiVersion": "x.io/v1", "kind": "R", "metadata": {"name": "a", "namespace": "ns"}});
        assert!(s.create(LOCAL_CLUSTER, o.clone(), now()).is_ok());
        assert!(s.create(LOCAL_CLUSTER, o, now()).is_err());
    }

    #[test]
    fn list_returns_exactly_the_kind_and_namespace_asked_for() {
        let mut s = Store::default();
        for (cluster, api, kind, ns, name) in [
            (LOCAL_CLUSTER, "cluster.x-k8s.io/v1beta2", "Machine", "a", "m1"),
            (LOCAL_CLUSTER, "cluster.x-k8s.io/v1beta2", "Machine", "b", "m2"),
            (LOCAL_CLUSTER, "cluster.x-k8s.io/v1beta2", "MachineSet", "a", "s1"),
            (LOCAL_CLUSTER, "cluster.x-k8s.io/v1beta2", "Cluster", "a", "c1"),
            ("a/c1", "cluster.x-k8s.io/v1beta2", "Machine", "a", "m3"),
        ] {
            s.apply(
                cluster,
                json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns}}),
                now(),
            );
        }
        let names = |ns: Option<&str>| {
            s.list(LOCAL_CLUSTER, "cluster.x-k8s.io", "Machine", ns).map(|(k, _)| k.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(None), ["m1", "m2"]);
        assert_eq!(names(Some("a")), ["m1"]);
        assert_eq!(names(Some("b")), ["m2"]);
        assert!(names(Some("c")).is_empty());
    }

    #[test]
    fn finalizers_hold_a_deleted_object_until_the_last_goes() {
        let mut store = Store::default();
        let object = json!({"apiVersion": "x.io/v1", "kind": "R", "metadata": {"name": "r", "namespace": "ns",
                            "finalizers": ["a", "b"]}});
        let key = store.apply(LOCAL_CLUSTER, object, now());
        let (_, gone) = store.request_delete(&key, now()).expect("there");
        assert!(!gone);
        assert!(store.get(&key).and_then(|o| o.pointer("/metadata/deletionTimestamp")).is_some());
        assert_eq!(store.remove_finalizer(&key, "a").map(|(_, g)| g), Some(false));
        assert_eq!(store.remove_finalizer(&key, "b").map(|(_, g)| g), Some(true));
        assert!(store.get(&key).is_none());
        let plain =
            store.apply(LOCAL_CLUSTER, json!({"apiVersion": "x.io/v1", "kind": "R", "metadata": {"name": "p"}}), now());
        assert_eq!(store.request_delete(&plain, now()).map(|(_, g)| g), Some(true));
    }

    #[test]
    fn a_replace_is_made_only_against_the_version_read() {
        let mut store = Store::default();
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "node-n1", "namespace": "l"}});
        let key = store.apply(LOCAL_CLUSTER, lease.clone(), now());
        let rv = store
            .get(&key)
            .and_then(|o| o.pointer("/metadata/resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .expect("rv");
        assert!(store.replace_at(lease.clone(), "0", now()).is_err(), "a stale version is refused");
        assert!(store.replace_at(lease.clone(), &rv, now()).is_ok());
        assert!(store.replace_at(lease, &rv, now()).is_err(), "the version moved");
    }

    #[test]
    fn stale_patch_conflicts() {
        let mut s = Store::default();
        let k = s.apply(LOCAL_CLUSTER, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}), now());
        assert!(s.patch(&k, &json!({"metadata": {"resourceVersion": "0"}, "status": {}})).is_err());
        let rv = s.get(&k).expect("stored")["metadata"]["resourceVersion"].clone();
        assert!(s.patch(&k, &json!({"metadata": {"resourceVersion": rv}, "status": {"x": 1}})).is_ok());
    }

    /// A packed object reads, lists, changes and deletes as the tree it was: packing is only
    /// how it is held.
    #[test]
    fn a_packed_object_behaves_as_its_tree() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z"}]}});
        let (mut plain, mut packed) = (Store::default(), Store::default());
        let k = plain.apply(LOCAL_CLUSTER, node.clone(), now());
        packed.apply(LOCAL_CLUSTER, node, now());
        packed.pack(&k);
        assert!(matches!(packed.objects[&k], Stored::Packed { .. }));
        assert_eq!(packed.get(&k), plain.get(&k));
        assert_eq!(packed.list(LOCAL_CLUSTER, "", "Node", None).count(), 1);
        let patch = json!({"metadata": {"labels": {"zone": "b"}}});
        plain.patch(&k, &patch).expect("patch");
        packed.pack(&k);
        packed.patch(&k, &patch).expect("patch of a packed object");
        assert_eq!(packed.get(&k), plain.get(&k));
        assert_eq!(packed.get(&k).and_then(|n| n.pointer("/metadata/labels/zone")), Some(&json!("b")));
        packed.pack(&k);
        assert_eq!(packed.delete(&k), plain.delete(&k));
        assert_eq!(packed.get(&k), None);
    }

    /// An object nested deeper than JSON text reads back stays a tree.
    #[test]
    fn a_deep_object_is_not_packed() {
        let mut deep = json!("leaf");
        for _ in 0..200 {
            deep = json!({"d": deep});
        }
        let mut s = Store::default();
        let k = s.apply(
            LOCAL_CLUSTER,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": deep}),
            now(),
        );
        s.pack(&k);
        assert!(matches!(s.objects[&k], Stored::Tree(_)));
        assert!(s.get(&k).is_some_and(|o| o.get("data").is_some()));
    }
}
