//! Read views of the objects the engine looks at but Vigil does not own: Cluster API Machines and
//! Clusters (`v1beta1` or `v1beta2`), remediation templates and remediation objects. A view is
//! read from the object's JSON once; what cannot be read is kept as a problem, never a panic, so
//! one malformed object cannot stop a check.

use crate::conditions::{ObservedCondition, find, health_check_succeeded, read_list};
pub use crate::node_view::{Labels, NodeConditionView, NodeView};
use crate::well_known::{
    CONTROL_PLANE_INITIALIZED, CONTROL_PLANE_MACHINE_LABEL, EXTERNALLY_REMEDIATED, HEALTH_CHECK_SUCCEEDED,
    INFRASTRUCTURE_READY, OWNER_REMEDIATED, PAUSED_ANNOTATION,
};
use jiff::Timestamp;
use serde_json::Value;
use std::collections::BTreeMap;

/// The Cluster API version an object is written in, which decides where its conditions live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CapiVersion {
    /// `cluster.x-k8s.io/v1beta1`: legacy conditions in `status.conditions`, new ones in
    /// `status.v1beta2.conditions`.
    V1Beta1,
    /// `cluster.x-k8s.io/v1beta2`: `metav1.Condition` in `status.conditions`, legacy ones in
    /// `status.deprecated.v1beta1.conditions`.
    V1Beta2,
}

impl CapiVersion {
    /// The version an `apiVersion` string names, if it is Cluster API's.
    pub fn from_api_version(api_version: &str) -> Option<Self> {
        match api_version {
            "cluster.x-k8s.io/v1beta1" => Some(CapiVersion::V1Beta1),
            "cluster.x-k8s.io/v1beta2" => Some(CapiVersion::V1Beta2),
            _ => None,
        }
    }
}

/// Object metadata common to every view.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, when the object came from an API server.
    pub uid: Option<String>,
    /// `resourceVersion`, when the object came from an API server: a write decided on this
    /// object carries it, so the API server refuses the write once the object changed.
    pub resource_version: Option<String>,
    /// Labels (keys shared, [`crate::intern`]).
    pub labels: Labels,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Creation time.
    pub created: Option<Timestamp>,
    /// Whether deletion has started.
    pub deleting: bool,
    /// Owner references as (kind, name, uid).
    pub owners: Vec<OwnerRef>,
}

/// An owner reference, as much as Vigil needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    /// apiVersion of the owner.
    pub api_version: String,
    /// Kind of the owner.
    pub kind: String,
    /// Name of the owner.
    pub name: String,
    /// UID of the owner.
    pub uid: String,
    /// Whether this is the controlling owner (`controller: true`).
    pub controller: bool,
}

fn str_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
        .unwrap_or_default()
}

/// `v.pointer(path)` for a path of plain field names (no `~` escapes, no list positions) without
/// the allocation serde_json's pointer makes for every step: every object of a fleet is read
/// through here.
fn at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('/').skip(1).try_fold(v, |v, field| v.get(field))
}

fn text(v: &Value, pointer: &str) -> Option<String> {
    at(v, pointer).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string)
}

impl Meta {
    /// Reads metadata; an object without a name cannot be addressed and is refused.
    pub fn read(v: &Value, problems: &mut Vec<String>) -> Option<Meta> {
        let name = text(v, "/metadata/name")?;
        let created = match at(v, "/metadata/creationTimestamp") {
            None | Some(Value::Null) => None,
            Some(t) => match t.as_str().and_then(|s| s.parse::<Timestamp>().ok()) {
                Some(t) => Some(t),
                None => {
                    problems.push(format!("metadata.creationTimestamp: invalid value {t}: not an RFC 3339 time"));
                    None
                }
            },
        };
        let owners = at(v, "/metadata/ownerReferences")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|o| OwnerRef {
                        api_version: text(o, "/apiVersion").unwrap_or_default(),
                        kind: text(o, "/kind").unwrap_or_default(),
                        name: text(o, "/name").unwrap_or_default(),
                        uid: text(o, "/uid").unwrap_or_default(),
                        controller: o.get("controller").and_then(Value::as_bool).unwrap_or(false),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Meta {
            api_version: text(v, "/apiVersion").unwrap_or_default(),
            kind: text(v, "/kind").unwrap_or_default(),
            namespace: text(v, "/metadata/namespace").unwrap_or_default(),
            name,
            uid: text(v, "/metadata/uid"),
            resource_version: text(v, "/metadata/resourceVersion"),
            labels: Labels::of(Some(&str_map(at(v, "/metadata/labels")))),
            annotations: str_map(at(v, "/metadata/annotations")),
            created,
            deleting: at(v, "/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()),
            owners,
        })
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn key(&self) -> String {
        if self.namespace.is_empty() { self.name.clone() } else { format!("{}/{}", self.namespace, self.name) }
    }
}

/// A Cluster API Machine as the MachineHealthCheck rules need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    /// Metadata.
    pub meta: Meta,
    /// The API form it is written in.
    pub version: CapiVersion,
    /// `status.nodeRef.name`.
    pub node_name: Option<String>,
    /// `failureReason: failureMessage`, from either API form.
    pub failure: Option<String>,
    /// `spec.failureDomain` (both API forms), for failure-domain budgets keyed on it.
    pub failure_domain: Option<String>,
    /// Conditions, `metav1.Condition` form first (`status.conditions` of v1beta2,
    /// `status.v1beta2.conditions` of v1beta1), then legacy ones of other types.
    pub conditions: Vec<ObservedCondition>,
    /// Fields that could not be read; a Machine with problems gets no verdict.
    pub problems: Vec<String>,
    /// `status.phase` (what an expression reads as `machine.phase`).
    pub phase: Option<String>,
    /// Whether `conditions` already say [`crate::conditions::health_check_succeeded`], worked
    /// out once when read: every decision asks it of every target, and the answer is otherwise
    /// behind two pointers per Machine.
    says_healthy: bool,
    /// Where Vigil's own conditions are in `conditions` (see [`VigilMarks`]).
    marks: VigilMarks,
}

/// The positions in a Machine's `conditions` of the three conditions Vigil writes
/// (`HealthCheckSucceeded`, `OwnerRemediated`, `ExternallyRemediated`), found once when the
/// Machine is read: every decision and every claim asks for them on every target, and most
/// Machines have only the first, so the others are answered without touching the list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct VigilMarks {
    health_check_succeeded: Option<u32>,
    owner_remediated: Option<u32>,
    externally_remediated: Option<u32>,
}

impl VigilMarks {
    /// Where each is, as [`crate::conditions::find`] finds it (the first of its type).
    fn of(conditions: &[ObservedCondition]) -> Self {
        let at = |type_: &str| conditions.iter().position(|c| *c.type_ == *type_).and_then(|i| u32::try_from(i).ok());
        VigilMarks {
            health_check_succeeded: at(HEALTH_CHECK_SUCCEEDED),
            owner_remediated: at(OWNER_REMEDIATED),
            externally_remediated: at(EXTERNALLY_REMEDIATED),
        }
    }
}

impl MachineView {
    /// Reads a Machine; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<MachineView> {
        let mut problems = Vec::new();
        let meta = Meta::read(v, &mut problems)?;
        let version = match CapiVersion::from_api_version(&meta.api_version) {
            Some(version) => version,
            None => {
                problems.push(format!(
                    "apiVersion: invalid value {:?}: expected cluster.x-k8s.io/v1beta1 or v1beta2",
                    meta.api_version
                ));
                CapiVersion::V1Beta2
            }
        };
        let failure_part = |field: &str| {
            text(v, &format!("/status/{field}")).or_else(|| text(v, &format!("/status/deprecated/v1beta1/{field}")))
        };
        let failure = match (failure_part("failureReason"), failure_part("failureMessage")) {
            (None, None) => None,
            (Some(r), None) => Some(r),
            (None, Some(m)) => Some(m),
            (Some(r), Some(m)) => Some(format!("{r}: {m}")),
        };
        // v1beta2 conditions are authoritative; a v1beta1 Machine keeps them in status.v1beta2 and
        // its legacy ones (no reason when True) in status.conditions, used only for other types.
        let (mut conditions, condition_problems) = match version {
            CapiVersion::V1Beta2 => read_list(at(v, "/status/conditions"), "status.conditions"),
            CapiVersion::V1Beta1 => read_list(at(v, "/status/v1beta2/conditions"), "status.v1beta2.conditions"),
        };
        problems.extend(condition_problems);
        if version == CapiVersion::V1Beta1 {
            let (legacy, legacy_problems) = read_list(at(v, "/status/conditions"), "status.conditions");
            problems.extend(legacy_problems);
            for c in legacy {
                if !conditions.iter().any(|n| n.type_ == c.type_) {
                    conditions.push(c);
                }
            }
        }
        // Kept in every cached Machine: no spare capacity.
        conditions.shrink_to_fit();
        let marks = VigilMarks::of(&conditions);
        let marked = marks.health_check_succeeded.and_then(|i| conditions.get(usize::try_from(i).ok()?));
        let says_healthy = health_check_succeeded().is_satisfied_by(marked);
        Some(MachineView {
            says_healthy,
            marks,
            node_name: text(v, "/status/nodeRef/name"),
            failure_domain: text(v, "/spec/failureDomain"),
            phase: text(v, "/status/phase"),
            meta,
            version,
            failure,
            conditions,
            problems,
        })
    }

    /// Whether the Machine already says `HealthCheckSucceeded=True` exactly as Vigil writes it
    /// on a healthy Machine (so a healthy verdict writes nothing).
    pub fn says_healthy(&self) -> bool {
        self.says_healthy
    }

    /// The Machine's `HealthCheckSucceeded` condition (what [`crate::conditions::find`] finds).
    pub fn health_check_succeeded(&self) -> Option<&ObservedCondition> {
        self.marked(self.marks.health_check_succeeded, HEALTH_CHECK_SUCCEEDED)
    }

    /// The Machine's `OwnerRemediated` condition.
    pub fn owner_remediated(&self) -> Option<&ObservedCondition> {
        self.marked(self.marks.owner_remediated, OWNER_REMEDIATED)
    }

    /// The Machine's `ExternallyRemediated` condition.
    pub fn externally_remediated(&self) -> Option<&ObservedCondition> {
        self.marked(self.marks.externally_remediated, EXTERNALLY_REMEDIATED)
    }

    fn marked(&self, at: Option<u32>, type_: &str) -> Option<&ObservedCondition> {
        let found = at.and_then(|i| self.conditions.get(usize::try_from(i).ok()?));
        debug_assert_eq!(found.map(std::ptr::from_ref), find(&self.conditions, type_).map(std::ptr::from_ref));
        found
    }

    /// Whether this Machine belongs to the control plane.
    pub fn is_control_plane(&self) -> bool {
        self.meta.labels.contains_key(CONTROL_PLANE_MACHINE_LABEL)
    }
}

/// A Cluster API Cluster as the MachineHealthCheck rules need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Metadata.
    pub meta: Meta,
    /// `spec.paused`.
    pub paused: bool,
    /// Whether the control plane has been initialized.
    pub control_plane_initialized: bool,
    /// When it was (the condition's transition time), if known.
    pub control_plane_initialized_at: Option<Timestamp>,
    /// Whether the cluster infrastructure is ready.
    pub infrastructure_ready: bool,
    /// When it became so, if known.
    pub infrastructure_ready_at: Option<Timestamp>,
    /// Fields that could not be read.
    pub problems: Vec<String>,
}

impl ClusterView {
    /// Reads a Cluster; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<ClusterView> {
        let mut problems = Vec::new();
        let meta = Meta::read(v, &mut problems)?;
        let (conditions, condition_problems) = read_list(at(v, "/status/conditions"), "status.conditions");
        problems.extend(condition_problems);
        let flag = |pointer: &str| at(v, pointer).and_then(Value::as_bool).unwrap_or(false);
        let at = |type_: &str| {
            crate::conditions::find(&conditions, type_)
                .filter(|c| c.status == crate::conditions::ConditionStatus::True)
                .map(|c| c.last_transition_time)
        };
        let cp = at(CONTROL_PLANE_INITIALIZED);
        let infra = at(INFRASTRUCTURE_READY);
        Some(ClusterView {
            paused: flag("/spec/paused"),
            control_plane_initialized: cp.is_some() || flag("/status/initialization/controlPlaneInitialized"),
            control_plane_initialized_at: cp.flatten(),
            infrastructure_ready: infra.is_some()
                || flag("/status/initialization/infrastructureProvisioned")
                || flag("/status/infrastructureReady"),
            infrastructure_ready_at: infra.flatten(),
            meta,
            problems,
        })
    }

    /// Whether the Cluster carries the paused annotation (checked in addition to `spec.paused`).
    pub fn has_paused_annotation(&self) -> bool {
        self.meta.annotations.contains_key(PAUSED_ANNOTATION)
    }
}

/// A remediation template: where it is and what objects made from it contain.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateView {
    /// Metadata.
    pub meta: Meta,
    /// `spec.template`, the body of remediation objects; `None` when the template lacks it.
    pub template: Option<Value>,
}

impl TemplateView {
    /// Reads a template; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<TemplateView> {
        let meta = Meta::read(v, &mut Vec::new())?;
        let template = at(v, "/spec/template").filter(|t| t.is_object()).cloned();
        Some(TemplateView { meta, template })
    }
}

/// A remediation object (External Remediation API), as much as the rules need of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemediationView {
    /// Metadata.
    pub meta: Meta,
    /// Conditions (`Succeeded`, `PermanentNodeDeletionExpected`, …).
    pub conditions: Vec<ObservedCondition>,
}

impl RemediationView {
    /// Reads a remediation object; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<RemediationView> {
        let mut problems = Vec::new();
        let meta = Meta::read(v, &mut problems)?;
        let (conditions, _) = read_list(at(v, "/status/conditions"), "status.conditions");
        Some(RemediationView { meta, conditions })
    }
}

/// A coordination Lease as the node-lease rules read it (medik8s' `node-<name>` Leases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Metadata (uid for a delete's precondition, the Node it is owned by).
    pub meta: Meta,
    /// `metadata.resourceVersion`: an update of the Lease is made against it.
    pub resource_version: Option<String>,
    /// `spec.holderIdentity`.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i64>,
    /// `spec.acquireTime`.
    pub acquire_time: Option<Timestamp>,
    /// `spec.renewTime`.
    pub renew_time: Option<Timestamp>,
    /// `spec.leaseTransitions`.
    pub transitions: Option<i64>,
    /// Fields that could not be read (such a Lease counts as held by someone unknown).
    pub problems: Vec<String>,
}

impl LeaseView {
    /// Reads a Lease; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<LeaseView> {
        let mut problems = Vec::new();
        let meta = Meta::read(v, &mut problems)?;
        let mut time = |field: &str| match at(v, &format!("/spec/{field}")) {
            None | Some(Value::Null) => None,
            Some(t) => match t.as_str().and_then(|s| s.parse::<Timestamp>().ok()) {
                Some(t) => Some(t),
                None => {
                    problems.push(format!("spec.{field}: invalid value {t}: not an RFC 3339 time"));
                    None
                }
            },
        };
        let acquire_time = time("acquireTime");
        let renew_time = time("renewTime");
        Some(LeaseView {
            resource_version: text(v, "/metadata/resourceVersion"),
            holder: text(v, "/spec/holderIdentity"),
            duration_seconds: at(v, "/spec/leaseDurationSeconds").and_then(Value::as_i64),
            transitions: at(v, "/spec/leaseTransitions").and_then(Value::as_i64),
            acquire_time,
            renew_time,
            meta,
            problems,
        })
    }
}

/// A medik8s `NodeMaintenance` (`nodemaintenance.medik8s.io`): a Node an administrator is
/// working on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceView {
    /// Metadata.
    pub meta: Meta,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.reason`, for the operator.
    pub reason: Option<String>,
}

impl MaintenanceView {
    /// Reads a NodeMaintenance; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<MaintenanceView> {
        let meta = Meta::read(v, &mut Vec::new())?;
        Some(MaintenanceView { node_name: text(v, "/spec/nodeName"), reason: text(v, "/spec/reason"), meta })
    }
}

/// An OpenShift `ClusterVersion` (`config.openshift.io/v1`) as the upgrade pause reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterVersionView {
    /// Metadata.
    pub meta: Meta,
    /// Its `Progressing` condition, when it has one: the cluster moves to another version while
    /// it is `True`.
    pub progressing: Option<ObservedCondition>,
    /// `status.desired.version`, to name the target in messages.
    pub desired_version: Option<String>,
}

impl ClusterVersionView {
    /// Reads a ClusterVersion; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<ClusterVersionView> {
        let meta = Meta::read(v, &mut Vec::new())?;
        let (conditions, _) = read_list(at(v, "/status/conditions"), "status.conditions");
        let progressing = conditions.into_iter().find(|c| *c.type_ == *crate::well_known::CLUSTER_VERSION_PROGRESSING);
        Some(ClusterVersionView { progressing, desired_version: text(v, "/status/desired/version"), meta })
    }

    /// Whether the cluster is moving to another version (`Progressing=True`).
    pub fn is_progressing(&self) -> bool {
        self.progressing.as_ref().is_some_and(|c| *c.status == crate::conditions::ConditionStatus::True)
    }
}

/// An OpenShift Machine API `Machine` (`machine.openshift.io/v1beta1`): a NodeHealthCheck makes
/// the Node's Machine an owner of its remediation objects, as medik8s does, so they go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenShiftMachineView {
    /// Metadata (namespace, name and uid are what an owner reference needs).
    pub meta: Meta,
}

impl OpenShiftMachineView {
    /// Reads a Machine; `None` only when the object has no name.
    pub fn read(v: &Value) -> Option<OpenShiftMachineView> {
        Some(OpenShiftMachineView { meta: Meta::read(v, &mut Vec::new())? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Machine says healthy only when its `HealthCheckSucceeded` is exactly what Vigil writes
    /// on a healthy Machine; anything else (another reason, a message, `False`, none, the legacy
    /// list of a v1beta1 Machine) gets the condition written.
    #[test]
    fn a_machine_says_healthy_only_with_the_condition_as_written() {
        let machine = |api_version: &str, path: &str, condition: Value| {
            let mut v = json!({"apiVersion": api_version, "kind": "Machine", "metadata": {"name": "m1"}, "status": {}});
            let list = if path == "v1beta2" { &mut v["status"]["v1beta2"] } else { &mut v["status"] };
            *list = json!({"conditions": [condition]});
            MachineView::read(&v).expect("a Machine").says_healthy()
        };
        let c = |status: &str, reason: &str, message: &str| {
            json!({"type": "HealthCheckSucceeded", "status": status, "reason": reason, "message": message,
                   "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let v2 = "cluster.x-k8s.io/v1beta2";
        assert!(machine(v2, "", c("True", "HealthCheckSucceeded", "")));
        assert!(!machine(v2, "", c("True", "HealthCheckSucceeded", "checked by hand")));
        assert!(!machine(v2, "", c("True", "Other", "")));
        assert!(!machine(v2, "", c("False", "HealthCheckSucceeded", "")));
        assert!(!machine(v2, "", json!({"type": "Ready", "status": "True"})));
        assert!(machine("cluster.x-k8s.io/v1beta1", "v1beta2", c("True", "HealthCheckSucceeded", "")));
    }

    /// Vigil's own conditions are found where [`find`] finds them, in either API form (the
    /// v1beta2 list first, then legacy conditions of other types), a repeated type's first one.
    #[test]
    fn vigil_conditions_are_the_ones_find_finds() {
        let c = |type_: &str, status: &str| json!({"type": type_, "status": status, "reason": "R"});
        let v = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m1"},
            "status": {"v1beta2": {"conditions": [c("Ready", "True"), c("OwnerRemediated", "False"),
                                                  c("OwnerRemediated", "True")]},
                       "conditions": [c("OwnerRemediated", "True"), c("ExternallyRemediated", "False"),
                                      c("HealthCheckSucceeded", "False")]}});
        let m = MachineView::read(&v).expect("a Machine");
        let same = |a: Option<&ObservedCondition>, t: &str| {
            assert_eq!(a.map(std::ptr::from_ref), find(&m.conditions, t).map(std::ptr::from_ref), "{t}");
            a.map(|c| c.status.to_string())
        };
        assert_eq!(same(m.owner_remediated(), "OwnerRemediated").as_deref(), Some("False"));
        assert_eq!(same(m.externally_remediated(), "ExternallyRemediated").as_deref(), Some("False"));
        assert_eq!(same(m.health_check_succeeded(), "HealthCheckSucceeded").as_deref(), Some("False"));
        let bare = MachineView::read(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                                             "metadata": {"name": "m2"}}))
        .expect("a Machine");
        assert!(bare.owner_remediated().is_none() && bare.health_check_succeeded().is_none());
    }

    #[test]
    fn a_plain_path_reads_what_serde_jsons_pointer_reads() {
        let v = json!({"metadata": {"name": "m1", "labels": {"a": "b"}, "ownerReferences": [{"kind": "X"}]},
                       "status": {"v1beta2": {"conditions": []}, "flag": null}});
        for path in [
            "",
            "/metadata",
            "/metadata/name",
            "/metadata/labels/a",
            "/metadata/ownerReferences",
            "/status/v1beta2/conditions",
            "/status/flag",
            "/status/missing",
            "/metadata/name/deeper",
            "/nothing",
        ] {
            assert_eq!(at(&v, path), v.pointer(path), "{path:?}");
        }
    }

    #[test]
    fn reads_a_v1beta2_machine_with_deprecated_failure() {
        let m = MachineView::read(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "ns", "labels": {"cluster.x-k8s.io/control-plane": ""},
                         "creationTimestamp": "2030-01-01T00:00:00Z"},
            "status": {"nodeRef": {"name": "n1"},
                       "deprecated": {"v1beta1": {"failureReason": "UpdateError", "failureMessage": "boom"}},
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z", "reason": "Ready"}]}
        }))
        .expect("named");
        assert_eq!(m.version, CapiVersion::V1Beta2);
        assert_eq!(m.node_name.as_deref(), Some("n1"));
        assert_eq!(m.failure.as_deref(), Some("UpdateError: boom"));
        assert!(m.is_control_plane());
        assert!(m.problems.is_empty());
    }

    #[test]
    fn reads_v1beta1_and_v1beta2_clusters_alike() {
        let v1 = ClusterView::read(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": {"name": "c"},
            "spec": {"paused": true},
            "status": {"infrastructureReady": true, "conditions": [
                {"type": "ControlPlaneInitialized", "status": "True", "lastTransitionTime": "2030-01-01T00:01:00Z"}]}
        }))
        .expect("named");
        assert!(v1.paused && v1.control_plane_initialized && v1.infrastructure_ready);
        assert_eq!(v1.control_plane_initialized_at, Some("2030-01-01T00:01:00Z".parse().expect("ts")));
        assert_eq!(v1.infrastructure_ready_at, None);
        let v2 = ClusterView::read(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c"},
            "status": {"initialization": {"controlPlaneInitialized": true, "infrastructureProvisioned": false}}
        }))
        .expect("named");
        assert!(!v2.paused && v2.control_plane_initialized && !v2.infrastructure_ready);
    }

    #[test]
    fn reads_a_medik8s_node_lease() {
        let l = LeaseView::read(&json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-n1", "namespace": "medik8s-leases", "uid": "u1", "resourceVersion": "42",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "nu"}]},
            "spec": {"holderIdentity": "node-maintenance", "leaseDurationSeconds": 3600,
                     "acquireTime": "2030-01-01T00:00:00.000000Z", "renewTime": "2030-01-01T00:10:00.123456Z",
                     "leaseTransitions": 1}
        }))
        .expect("named");
        assert_eq!(l.holder.as_deref(), Some("node-maintenance"));
        assert_eq!(
            (l.duration_seconds, l.transitions, l.resource_version.as_deref()),
            (Some(3600), Some(1), Some("42"))
        );
        assert_eq!(l.renew_time, Some("2030-01-01T00:10:00.123456Z".parse().expect("ts")));
        assert!(l.problems.is_empty());
        let bad =
            LeaseView::read(&json!({"metadata": {"name": "node-n2"}, "spec": {"renewTime": "soon"}})).expect("named");
        assert_eq!(bad.problems, ["spec.renewTime: invalid value \"soon\": not an RFC 3339 time"]);
    }

    #[test]
    fn reads_maintenance_and_cluster_versions() {
        let m =
            MaintenanceView::read(&json!({"metadata": {"name": "nm"}, "spec": {"nodeName": "n1", "reason": "NIC"}}))
                .expect("named");
        assert_eq!((m.node_name.as_deref(), m.reason.as_deref()), (Some("n1"), Some("NIC")));
        let cv = ClusterVersionView::read(&json!({
            "metadata": {"name": "version"},
            "status": {"desired": {"version": "4.18.3"}, "conditions": [
                {"type": "Available", "status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z"},
                {"type": "Progressing", "status": "True", "lastTransitionTime": "2030-01-01T00:05:00Z",
                 "message": "Working towards 4.18.3"}]}
        }))
        .expect("named");
        assert!(cv.is_progressing());
        assert_eq!(cv.desired_version.as_deref(), Some("4.18.3"));
        let idle = ClusterVersionView::read(&json!({"metadata": {"name": "version"}})).expect("named");
        assert!(!idle.is_progressing());
    }

    #[test]
    fn a_malformed_machine_is_read_with_problems_not_refused() {
        let m = MachineView::read(&json!({
            "apiVersion": "example.com/v1", "kind": "Machine",
            "metadata": {"name": "m1", "creationTimestamp": 42},
            "status": {"conditions": "nope"}
        }))
        .expect("named");
        assert_eq!(m.problems.len(), 3, "{:?}", m.problems);
        assert!(MachineView::read(&json!({"metadata": {}})).is_none());
    }
}
