//! Nodes as the health-check rules read them, and nothing else: the caches of the controller and
//! the simulator hold one per Node, so its size is paid 10 000 times. A kubelet's Node object is
//! kilobytes (images, addresses, capacity, managed fields, condition messages); the rules read
//! its name, uid, labels, a few annotations, whether it is cordoned, the maintenance and removal taints, whether
//! it is being deleted and its conditions' type, status, reason and two times. Condition strings
//! and label keys are shared ([`crate::intern`]).

use crate::intern::intern;
use crate::selector::Selector;
use crate::well_known::{
    CLUSTER_AUTOSCALER_DELETE_TAINT, CURRENT_MACHINE_CONFIG_ANNOTATION, DESIRED_MACHINE_CONFIG_ANNOTATION,
    KARPENTER_DISRUPTED_TAINT, KARPENTER_DISRUPTION_TAINT_V1BETA1, KURED_REBOOT_IN_PROGRESS_ANNOTATION,
    MANUALLY_CONFIRMED_HEALTHY_ANNOTATION, MEDIK8S_DRAIN_TAINT, OPENSHIFT_MACHINE_ANNOTATION,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde::Deserialize as _;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The Node annotations a rule reads; the others are not kept.
pub const NODE_ANNOTATIONS_READ: [&str; 5] = [
    MANUALLY_CONFIRMED_HEALTHY_ANNOTATION,
    KURED_REBOOT_IN_PROGRESS_ANNOTATION,
    CURRENT_MACHINE_CONFIG_ANNOTATION,
    DESIRED_MACHINE_CONFIG_ANNOTATION,
    OPENSHIFT_MACHINE_ANNOTATION,
];

/// The Node taints (by key) a rule reads; the others are not kept.
pub const NODE_TAINTS_READ: [&str; 4] = [
    MEDIK8S_DRAIN_TAINT,
    CLUSTER_AUTOSCALER_DELETE_TAINT,
    KARPENTER_DISRUPTED_TAINT,
    KARPENTER_DISRUPTION_TAINT_V1BETA1,
];

/// An object's labels, sorted by key, with shared keys (the same dozen keys on every Node).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Labels(Box<[(Arc<str>, Box<str>)]>);

impl Labels {
    /// The labels of a map (sorted already, keys unique).
    pub fn of(map: Option<&BTreeMap<String, String>>) -> Labels {
        Labels(map.into_iter().flatten().map(|(k, v)| (intern(k), Box::from(v.as_str()))).collect())
    }

    /// The value of `key`. Walks the entries comparing lengths first: label keys of the right
    /// length are rare, so most comparisons touch no string bytes.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k.len() == key.len() && **k == *key).map(|(_, v)| &**v)
    }

    /// How many labels there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The entries, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `selector` selects an object with these labels.
    pub fn selected_by(&self, selector: &Selector) -> bool {
        selector.matches_with(|k| self.get(k))
    }
}

/// One Node condition as the rules read it (the message is not kept: no rule, status or event
/// quotes a Node condition's message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConditionView {
    /// Condition type (shared).
    pub type_: Arc<str>,
    /// `True`, `False`, `Unknown` (shared; other spellings are kept and match no rule).
    pub status: Arc<str>,
    /// Machine-readable reason (shared), which reason-aware rules read.
    pub reason: Option<Arc<str>>,
    /// When the status last changed; `None` when missing or unreadable (no decision then).
    pub last_transition_time: Option<Timestamp>,
    /// When the reporter last confirmed the condition (the stale-signal guard reads it).
    pub last_heartbeat_time: Option<Timestamp>,
}

impl NodeConditionView {
    /// A condition, its strings shared.
    pub fn new(
        type_: &str,
        status: &str,
        reason: Option<&str>,
        last_transition_time: Option<Timestamp>,
        last_heartbeat_time: Option<Timestamp>,
    ) -> Self {
        NodeConditionView {
            type_: intern(type_),
            status: intern(status),
            reason: reason.map(intern),
            last_transition_time,
            last_heartbeat_time,
        }
    }
}

/// A Node as the NodeHealthCheck and MachineHealthCheck rules read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    /// `metadata.name` (empty when the object has none).
    pub name: String,
    /// `metadata.uid`, which an owner reference to the Node (a node Lease's) must carry.
    pub uid: Option<Box<str>>,
    /// `metadata.labels`.
    pub labels: Labels,
    /// The annotations of [`NODE_ANNOTATIONS_READ`] the Node has.
    pub annotations: BTreeMap<String, String>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.unschedulable`: cordoned (a drain starts with it).
    pub unschedulable: bool,
    /// The keys of the Node's taints among [`NODE_TAINTS_READ`].
    pub taints: Box<[Arc<str>]>,
    /// `status.conditions`, in the Node's order.
    pub conditions: Box<[NodeConditionView]>,
}

impl NodeView {
    /// A view of the parts the rules read; `annotations` are filtered to [`NODE_ANNOTATIONS_READ`].
    pub fn new(
        name: String,
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
        deleting: bool,
        conditions: Vec<NodeConditionView>,
    ) -> Self {
        let annotations = annotations
            .into_iter()
            .flatten()
            .filter(|(k, _)| NODE_ANNOTATIONS_READ.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        NodeView {
            name,
            uid: None,
            labels: Labels::of(labels),
            annotations,
            deleting,
            unschedulable: false,
            taints: Box::default(),
            conditions: conditions.into(),
        }
    }

    /// The view with what the Node's spec and uid say: cordoned or not, and the taint keys of
    /// [`NODE_TAINTS_READ`] among `taint_keys` (the others are not kept).
    pub fn with_spec<'k>(
        mut self,
        uid: Option<&str>,
        unschedulable: bool,
        taint_keys: impl IntoIterator<Item = &'k str>,
    ) -> Self {
        self.uid = uid.filter(|u| !u.is_empty()).map(Box::from);
        self.unschedulable = unschedulable;
        self.taints = taint_keys.into_iter().filter(|k| NODE_TAINTS_READ.contains(k)).map(intern).collect();
        self
    }

    /// Whether the Node has a taint of `key`, which must be one of [`NODE_TAINTS_READ`].
    pub fn has_taint(&self, key: &str) -> bool {
        debug_assert!(NODE_TAINTS_READ.contains(&key), "taint {key} is not kept on a NodeView");
        self.taints.iter().any(|t| &**t == key)
    }

    /// The value of annotation `key`, which must be one of [`NODE_ANNOTATIONS_READ`].
    pub fn annotation(&self, key: &str) -> Option<&str> {
        debug_assert!(NODE_ANNOTATIONS_READ.contains(&key), "annotation {key} is not kept on a NodeView");
        self.annotations.get(key).map(String::as_str)
    }

    /// Reads a Node's JSON as decoded into a k8s-openapi Node (`None` when it does not decode,
    /// e.g. a time outside the range that type holds). Decoded from the borrowed JSON: a copy of
    /// the whole object per read was most of a 10 000-Node check's reads.
    pub fn read(v: &serde_json::Value) -> Option<NodeView> {
        Node::deserialize(v).ok().map(|n| NodeView::from(&n))
    }

    /// Whether the Node carries annotation `key`, which must be one of [`NODE_ANNOTATIONS_READ`]
    /// (the others are not kept, so asking for one would always say no).
    pub fn has_annotation(&self, key: &str) -> bool {
        debug_assert!(NODE_ANNOTATIONS_READ.contains(&key), "annotation {key} is not kept on a NodeView");
        self.annotations.contains_key(key)
    }
}

/// Keeps of a Node's JSON the parts [`NodeView::read`] reads (name, uid, creation and deletion
/// times, labels, the annotations of [`NODE_ANNOTATIONS_READ`], `spec.unschedulable`,
/// `spec.taints`, and each condition's type, status, reason and two times) and drops the rest:
/// `vigil check` holds every Node of the management and workload clusters, and a kubelet's
/// condition messages, annotations and addresses were half of each.
pub fn retain_read(node: &mut serde_json::Value) {
    let Some(object) = node.as_object_mut() else { return };
    object.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "spec" | "status"));
    if let Some(meta) = object.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
        meta.retain(|k, _| {
            matches!(k.as_str(), "name" | "uid" | "labels" | "annotations" | "creationTimestamp" | "deletionTimestamp")
        });
        if let Some(annotations) = meta.get_mut("annotations").and_then(serde_json::Value::as_object_mut) {
            annotations.retain(|k, _| NODE_ANNOTATIONS_READ.contains(&k.as_str()));
        }
    }
    if let Some(spec) = object.get_mut("spec").and_then(serde_json::Value::as_object_mut) {
        spec.retain(|k, _| k == "unschedulable" || k == "taints");
    }
    if let Some(status) = object.get_mut("status").and_then(serde_json::Value::as_object_mut) {
        status.retain(|k, _| k == "conditions");
        let conditions = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut);
        for condition in conditions.into_iter().flatten().filter_map(serde_json::Value::as_object_mut) {
            condition.retain(|k, _| {
                matches!(k.as_str(), "type" | "status" | "reason" | "lastTransitionTime" | "lastHeartbeatTime")
            });
        }
    }
}

impl From<&Node> for NodeView {
    /// The view of a decoded k8s-openapi Node (the simulator's objects and tests' fixtures).
    fn from(node: &Node) -> Self {
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or(&[])
            .iter()
            .map(|c| {
                NodeConditionView::new(
                    &c.type_,
                    &c.status,
                    c.reason.as_deref(),
                    c.last_transition_time.as_ref().map(|t| t.0),
                    c.last_heartbeat_time.as_ref().map(|t| t.0),
                )
            })
            .collect();
        let m = &node.metadata;
        let spec = node.spec.as_ref();
        NodeView::new(
            m.name.clone().unwrap_or_default(),
            m.labels.as_ref(),
            m.annotations.as_ref(),
            m.deletion_timestamp.is_some(),
            conditions,
        )
        .with_spec(
            m.uid.as_deref(),
            spec.and_then(|s| s.unschedulable).unwrap_or(false),
            spec.and_then(|s| s.taints.as_deref()).unwrap_or(&[]).iter().map(|t| t.key.as_str()),
        )
    }
}

impl From<Node> for NodeView {
    /// As [`From<&Node>`].
    fn from(node: Node) -> Self {
        NodeView::from(&node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_kubelet_node_keeps_what_the_rules_read() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u", "deletionTimestamp": "2030-01-01T00:00:00Z",
                         "labels": {"zone": "a", "kubernetes.io/hostname": "n1"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         MANUALLY_CONFIRMED_HEALTHY_ANNOTATION: "yes"}},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                       "message": "PLEG is not healthy",
                                       "lastHeartbeatTime": "2030-01-01T00:00:10Z",
                                       "lastTransitionTime": "2030-01-01T00:00:00Z"},
                                      {"type": "DiskPressure", "status": "Unknown"}]}
        }))
        .expect("a Node");
        let v = NodeView::from(&node);
        assert_eq!(v.name, "n1");
        assert!(v.deleting);
        assert_eq!(v.labels.get("zone"), Some("a"));
        assert_eq!(v.labels.get("zon"), None);
        assert_eq!(v.labels.get("kubernetes.io/hostnamX"), None, "a key of the same length is another key");
        assert_eq!(v.labels.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["kubernetes.io/hostname", "zone"]);
        assert!(v.has_annotation(MANUALLY_CONFIRMED_HEALTHY_ANNOTATION));
        assert_eq!(v.annotations.len(), 1, "annotations no rule reads are not kept");
        assert_eq!(v.uid.as_deref(), Some("u"));
        assert!(!v.unschedulable && v.taints.is_empty());
        let c = &v.conditions[0];
        assert_eq!((&*c.type_, &*c.status, c.reason.as_deref()), ("Ready", "False", Some("KubeletNotReady")));
        assert_eq!(c.last_transition_time, Some("2030-01-01T00:00:00Z".parse().expect("ts")));
        assert_eq!(c.last_heartbeat_time, Some("2030-01-01T00:00:10Z".parse().expect("ts")));
        let d = &v.conditions[1];
        assert_eq!((&*d.type_, d.reason.as_ref(), d.last_transition_time), ("DiskPressure", None, None));
        // Two Nodes share their condition strings and label keys.
        let w = NodeView::from(&node);
        assert!(Arc::ptr_eq(&v.conditions[0].type_, &w.conditions[0].type_));
        assert!(Arc::ptr_eq(&v.labels.0[0].0, &w.labels.0[0].0));
    }

    #[test]
    fn a_drained_node_keeps_its_cordon_and_maintenance_taint_only() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "annotations": {KURED_REBOOT_IN_PROGRESS_ANNOTATION: "2030-01-01T00:00:00Z"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": MEDIK8S_DRAIN_TAINT, "effect": "NoSchedule"}]}
        }))
        .expect("a Node");
        let v = NodeView::from(&node);
        assert!(v.unschedulable);
        assert!(v.has_taint(MEDIK8S_DRAIN_TAINT));
        assert_eq!(v.taints.len(), 1, "taints no rule reads are not kept");
        assert_eq!(v.annotation(KURED_REBOOT_IN_PROGRESS_ANNOTATION), Some("2030-01-01T00:00:00Z"));
        assert_eq!(v.uid, None);
    }

    #[test]
    fn labels_select_as_a_map_does() {
        let sel = Selector::compile(
            &serde_json::from_value(json!({"matchLabels": {"zone": "a"},
            "matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}))
            .expect("selector"),
        )
        .expect("valid");
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        for pairs in [vec![("zone", "a")], vec![("zone", "b")], vec![("zone", "a"), ("gpu", "")], vec![]] {
            let m = map(&pairs);
            assert_eq!(Labels::of(Some(&m)).selected_by(&sel), sel.matches(Some(&m)), "{pairs:?}");
        }
        assert!(Labels::of(None).is_empty());
    }

    /// What [`retain_read`] keeps reads as the whole Node does, and the rest is gone.
    #[test]
    fn a_node_retained_for_reading_reads_as_the_whole_node() {
        let full = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u", "creationTimestamp": "2029-12-01T00:00:00Z",
                         "deletionTimestamp": "2030-01-01T00:00:00Z", "finalizers": ["f"],
                         "labels": {"zone": "a"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", MANUALLY_CONFIRMED_HEALTHY_ANNOTATION: "yes",
                                         KURED_REBOOT_IN_PROGRESS_ANNOTATION: "2030-01-01T00:00:00Z",
                                         CURRENT_MACHINE_CONFIG_ANNOTATION: "c", DESIRED_MACHINE_CONFIG_ANNOTATION: "d",
                                         OPENSHIFT_MACHINE_ANNOTATION: "ns/m"}},
            "spec": {"unschedulable": true, "providerID": "aws:///i-1", "podCIDR": "10.0.0.0/24",
                     "taints": [{"key": MEDIK8S_DRAIN_TAINT, "effect": "NoSchedule"},
                                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": "2030-01-01T00:00:00Z"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "images": [{"names": ["x"]}],
                       "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                       "message": "PLEG is not healthy",
                                       "lastHeartbeatTime": "2030-01-01T00:00:10Z",
                                       "lastTransitionTime": "2030-01-01T00:00:00Z"},
                                      {"type": "DiskPressure", "status": "Unknown"}]}
        });
        let mut kept = full.clone();
        retain_read(&mut kept);
        let whole = NodeView::read(&full).expect("a Node");
        assert_eq!(NodeView::read(&kept), Some(whole.clone()));
        assert_eq!(whole.annotations.len(), 5, "every annotation a rule reads is kept");
        assert!(whole.deleting && whole.unschedulable && whole.has_taint(MEDIK8S_DRAIN_TAINT) && whole.uid.is_some());
        assert_eq!(kept["spec"].as_object().map(|s| s.len()), Some(2), "{kept}");
        assert_eq!(kept["status"].as_object().map(|s| s.len()), Some(1), "{kept}");
        assert_eq!(kept.pointer("/status/conditions/0/message"), None);
        assert_eq!(kept.pointer("/metadata/annotations/node.alpha.kubernetes.io~1ttl"), None);
        assert_eq!(kept.pointer("/metadata/finalizers"), None);
        assert_eq!(kept.pointer("/spec/taints/1/timeAdded"), full.pointer("/spec/taints/1/timeAdded"));
        // Nothing to keep of what is not an object.
        let mut not_a_node = serde_json::json!("n1");
        retain_read(&mut not_a_node);
        assert_eq!(not_a_node, "n1");
    }
}
