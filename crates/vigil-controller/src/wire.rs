//! Nodes as they come off the wire: only the fields a rule reads, with every timestamp kept as
//! text until it is read. A Node's conditions are written by whatever runs on that Node (the
//! kubelet, a detector, a tenant), and the API server accepts timestamps that no Rust time type
//! holds (`9999-12-31T23:59:59Z`). Decoding such a Node as a `k8s_openapi` Node fails, and with
//! it the whole list page; here it spoils only the condition that carries it, which the engine
//! then reads as "cannot be judged" — never as unhealthy. Cluster API objects are decoded whole
//! but for their managed fields ([`WireObject`]).

use k8s_openapi::ClusterResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use kube::api::DynamicObject;
use kube::core::{ApiResource, DynamicResourceScope};
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use vigil_api::views::{NodeConditionView, NodeView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};

/// A Node reduced while it is decoded (spec, images, addresses, managed fields are skipped
/// without being built).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawNode")]
pub struct WireNode {
    /// What the watch and the rules read of the metadata.
    pub metadata: ObjectMeta,
    /// The conditions, timestamps as text.
    pub conditions: Vec<RawCondition>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// The keys of `spec.taints`.
    pub taint_keys: Vec<String>,
}

#[derive(Deserialize)]
struct RawNode {
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: Option<RawSpec>,
    #[serde(default)]
    status: Option<RawStatus>,
}

#[derive(Deserialize, Default)]
struct RawSpec {
    #[serde(default)]
    unschedulable: Option<bool>,
    #[serde(default)]
    taints: Option<Vec<RawTaint>>,
}

#[derive(Deserialize, Default)]
struct RawTaint {
    #[serde(default)]
    key: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
struct RawStatus {
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
}

/// One condition as sent.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RawCondition {
    /// Condition type.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// When the status last changed, as sent.
    #[serde(default)]
    pub last_transition_time: Option<String>,
    /// When the reporter last confirmed the condition, as sent (the stale-signal guard reads it).
    #[serde(default)]
    pub last_heartbeat_time: Option<String>,
}

impl From<RawNode> for WireNode {
    fn from(raw: RawNode) -> Self {
        let m = raw.metadata;
        // deletionTimestamp is set by the API server itself; a value it wrote is always readable.
        let deletion_timestamp = m.deletion_timestamp.as_deref().and_then(|t| t.parse().ok()).map(Time);
        WireNode {
            metadata: ObjectMeta {
                name: m.name,
                uid: m.uid,
                resource_version: m.resource_version,
                labels: m.labels,
                annotations: m.annotations,
                deletion_timestamp,
                ..Default::default()
            },
            conditions: raw.status.and_then(|s| s.conditions).unwrap_or_default(),
            unschedulable: raw.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            taint_keys: raw.spec.and_then(|s| s.taints).unwrap_or_default().into_iter().map(|t| t.key).collect(),
        }
    }
}

impl Resource for WireNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A Cluster API object (a Machine, a Cluster) as the watches decode it: its JSON whole except
/// `metadata.managedFields`, which is skipped without being built. Nothing reads managed fields,
/// and on objects written by server-side apply they are often most of the object: every replica
/// decodes every Machine of every list page, so what it skips is memory no replica holds.
#[derive(Debug, Clone)]
pub struct WireObject {
    /// What the watch reads of the metadata: name, namespace, resourceVersion, uid.
    pub metadata: ObjectMeta,
    /// The object as sent, without its managed fields.
    pub raw: Value,
}

/// An object's metadata with `managedFields` skipped while it is decoded.
struct LeanMeta(Map<String, Value>);

impl<'de> Deserialize<'de> for LeanMeta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = LeanMeta;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("object metadata")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LeanMeta, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "managedFields" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        out.insert(key, map.next_value::<Value>()?);
                    }
                }
                Ok(LeanMeta(out))
            }
        }
        d.deserialize_map(Fields)
    }
}

impl<'de> Deserialize<'de> for WireObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = WireObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireObject, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = if key == "metadata" {
                        Value::Object(map.next_value::<LeanMeta>()?.0)
                    } else {
                        map.next_value::<Value>()?
                    };
                    out.insert(key, value);
                }
                let text = |field: &str| {
                    out.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).map(str::to_string)
                };
                let metadata = ObjectMeta {
                    name: text("name"),
                    namespace: text("namespace"),
                    resource_version: text("resourceVersion"),
                    uid: text("uid"),
                    ..Default::default()
                };
                Ok(WireObject { metadata, raw: Value::Object(out) })
            }
        }
        d.deserialize_map(Object)
    }
}

impl From<DynamicObject> for WireObject {
    /// An object read whole (a read after a conflict) as the watch would have decoded it.
    fn from(o: DynamicObject) -> Self {
        let mut raw = serde_json::to_value(&o).unwrap_or(Value::Null);
        if let Some(meta) = raw.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        let m = o.metadata;
        let metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            uid: m.uid,
            ..Default::default()
        };
        WireObject { metadata, raw }
    }
}

impl Resource for WireObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A condition field that could not be read, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The Node's name.
    pub node: String,
    /// Where, e.g. `status.conditions[Ready].lastTransitionTime`.
    pub field: String,
    /// The value as sent.
    pub value: String,
    /// What the rules make of the condition then.
    pub effect: &'static str,
}

/// An unreadable `lastTransitionTime`: the condition cannot be timed.
const NO_TRANSITION: &str = "the condition is treated as unknown (never as unhealthy)";
/// An unreadable `lastHeartbeatTime`: the reporter cannot be shown alive.
const NO_HEARTBEAT: &str =
    "a rule with maxConditionAge treats the condition as stale (never as unhealthy); other rules do not read it";

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Node {}: {}: invalid value {:?}: not a time Vigil can read; {}",
            self.node, self.field, self.value, self.effect
        )
    }
}

/// The Node the rules read (the index's form), and the fields that could not be read.
pub fn slim(node: &WireNode) -> (NodeView, Vec<Unreadable>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut problems = Vec::new();
    let conditions = node
        .conditions
        .iter()
        .map(|c| {
            let mut time = |text: Option<&str>, field: &str, effect: &'static str| {
                text.and_then(|t| match t.parse() {
                    Ok(ts) => Some(ts),
                    Err(_) => {
                        problems.push(Unreadable {
                            node: name.clone(),
                            field: format!("status.conditions[{}].{field}", c.type_),
                            value: t.chars().take(64).collect(),
                            effect,
                        });
                        None
                    }
                })
            };
            let last_transition_time = time(c.last_transition_time.as_deref(), "lastTransitionTime", NO_TRANSITION);
            let last_heartbeat_time = time(c.last_heartbeat_time.as_deref(), "lastHeartbeatTime", NO_HEARTBEAT);
            NodeConditionView::new(&c.type_, &c.status, c.reason.as_deref(), last_transition_time, last_heartbeat_time)
        })
        .collect();
    let m = &node.metadata;
    let slim =
        NodeView::new(name, m.labels.as_ref(), m.annotations.as_ref(), m.deletion_timestamp.is_some(), conditions)
            .with_spec(m.uid.as_deref(), node.unschedulable, node.taint_keys.iter().map(String::as_str));
    (slim, problems)
}

/// Reads a health check leniently: a spec that does not parse still yields an object (with an
/// empty spec) and the error, so its status can say what is wrong ([`vigil_index::lenient`]).
/// Read from the object as decoded ([`WireObject`]: no managed fields), its strings moved.
pub fn read_mhc(o: WireObject) -> (MachineHealthCheck, Option<String>) {
    vigil_index::lenient::read_mhc(o.raw)
}

/// [`read_mhc`] for a NodeHealthCheck.
pub fn read_nhc(o: WireObject) -> (NodeHealthCheck, Option<String>) {
    vigil_index::lenient::read_nhc(o.raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ltt: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"},
                            "managedFields": [{"manager": "kubelet", "time": "2026-01-01T00:00:00Z"}]},
               "spec": {"podCIDR": "10.0.0.0/24"},
               "status": {"images": [{"names": ["x"], "sizeBytes": 1}],
                          "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown",
                                          "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                          "lastTransitionTime": ltt}]}})
    }

    #[test]
    fn a_list_with_an_extreme_timestamp_is_read_and_only_that_condition_is_unknown() {
        let list: Vec<WireNode> =
            serde_json::from_value(json!([node("2026-01-01T00:00:00Z"), node("9999-12-31T23:59:59Z")]))
                .expect("the whole list decodes");
        let (good, p) = slim(&list[0]);
        assert!(p.is_empty());
        let c = &good.conditions[0];
        assert_eq!((&*c.type_, &*c.status), ("Ready", "False"));
        assert!(c.last_transition_time.is_some());
        assert_eq!(
            c.last_heartbeat_time.as_ref().map(|t| t.to_string()).as_deref(),
            Some("2026-01-01T00:00:00Z"),
            "the heartbeat is kept for the stale-signal guard"
        );
        let (bad, p) = slim(&list[1]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].field, "status.conditions[Ready].lastTransitionTime");
        assert!(p[0].to_string().contains("9999-12-31T23:59:59Z"), "{}", p[0]);
        let c = &bad.conditions[0];
        assert!(c.last_transition_time.is_none(), "read as unknown, not as a time");
        assert_eq!(list[1].metadata.resource_version.as_deref(), Some("7"), "the watch can resume");
        assert!(list[1].metadata.managed_fields.is_none(), "what no rule reads is not kept");
    }

    /// The watch's form keeps what the rules read: labels, the annotation a rule reads (and no
    /// other), deletion, the reason; not the condition message.
    #[test]
    fn the_view_keeps_what_the_rules_read_and_nothing_else() {
        let confirmed = vigil_api::well_known::MANUALLY_CONFIRMED_HEALTHY_ANNOTATION;
        let v = json!({"metadata": {"name": "n5", "labels": {"zone": "a"}, "deletionTimestamp": "2026-01-01T00:00:00Z",
                                    "annotations": {confirmed: "", "node.alpha.kubernetes.io/ttl": "0"}},
                       "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                  "message": "kubelet is posting ready status"}]}});
        let (view, p) = slim(&serde_json::from_value::<WireNode>(v).expect("decodes"));
        assert!(p.is_empty());
        assert_eq!((view.name.as_str(), view.labels.get("zone"), view.deleting), ("n5", Some("a"), true));
        assert!(view.has_annotation(confirmed));
        assert_eq!(view.annotations.len(), 1, "an annotation no rule reads is not kept");
        assert_eq!(view.conditions[0].reason.as_deref(), Some("KubeletReady"));
        let (view, _) =
            slim(&serde_json::from_value::<WireNode>(json!({"metadata": {"name": "n6"}})).expect("decodes"));
        assert!(!view.deleting && view.labels.is_empty() && view.annotations.is_empty());
    }

    /// A Cluster API object keeps everything but its managed fields, in a list page as sent.
    #[test]
    fn a_cluster_api_object_is_kept_whole_but_for_its_managed_fields() {
        let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "ns", "resourceVersion": "42", "uid": "u1",
                         "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                         "managedFields": [{"manager": "capi", "fieldsV1": {"f:spec": {"f:clusterName": {}}}}],
                         "ownerReferences": [{"kind": "MachineSet", "name": "ms", "uid": "u2", "apiVersion": "v"}]},
            "spec": {"clusterName": "c1"},
            "status": {"nodeRef": {"name": "n1"}, "conditions": [{"type": "Ready", "status": "True"}]}});
        let page = format!(r#"{{"items": [{machine}], "metadata": {{"resourceVersion": "43"}}}}"#);
        let list: kube::core::ObjectList<WireObject> = serde_json::from_str(&page).expect("the page decodes");
        let o = &list.items[0];
        let mut expected = machine.clone();
        expected["metadata"].as_object_mut().expect("metadata").remove("managedFields");
        assert_eq!(o.raw, expected, "everything but the managed fields is kept as sent");
        assert_eq!(
            (o.metadata.name.as_deref(), o.metadata.namespace.as_deref(), o.metadata.resource_version.as_deref()),
            (Some("m1"), Some("ns"), Some("42")),
            "the watch can key the object and resume from it"
        );
        assert_eq!(o.metadata.uid.as_deref(), Some("u1"));
        let bare: WireObject = serde_json::from_value(json!({"kind": "Cluster"})).expect("no metadata");
        assert!(bare.metadata.name.is_none() && bare.raw["kind"] == "Cluster");
        assert!(serde_json::from_value::<WireObject>(json!(["not", "an", "object"])).is_err());
    }

    #[test]
    fn garbage_timestamps_and_missing_fields_do_not_fail_the_decode() {
        let v = json!({"metadata": {"name": "n2"}, "status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "lastTransitionTime": "yesterday"},
            {"type": "DiskPressure"}]}});
        let n: WireNode = serde_json::from_value(v).expect("decodes");
        let (_, p) = slim(&n);
        assert_eq!(p.len(), 1);
        // A garbage heartbeat spoils only its own field: the transition time is still read.
        let v = json!({"metadata": {"name": "n4"}, "status": {"conditions": [
            {"type": "KernelDeadlock", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
             "lastHeartbeatTime": "9999-12-31T23:59:59Z"}]}});
        let n: WireNode = serde_json::from_value(v).expect("decodes");
        let (slimmed, p) = slim(&n);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].field, "status.conditions[KernelDeadlock].lastHeartbeatTime");
        assert!(p[0].to_string().contains("stale"), "{}", p[0]);
        let c = &slimmed.conditions[0];
        assert!(c.last_heartbeat_time.is_none() && c.last_transition_time.is_some());
        let n: WireNode = serde_json::from_value(json!({"metadata": {"name": "n3"}})).expect("no status");
        assert!(slim(&n).0.conditions.is_empty());
    }
}
