//! Fixture builders shared by the engine's integration tests: Cluster API Machines and Clusters
//! (either API form) as JSON and views, Nodes with conditions, health checks validated into
//! policies, remediation templates and objects, and small helpers to read plans.
//!
//! Everything here is deterministic: times are fixed instants around [`T0`], never the clock.
//! The builders know nothing of a particular test; the [`MhcWorld`] at the end bundles them for
//! MachineHealthCheck decisions, and a NodeHealthCheck world can sit next to it.

#![allow(dead_code)]

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use vigil_api::MachineHealthCheck;
use vigil_api::conditions::DesiredCondition;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::validate::{self, MhcPolicy};
use vigil_api::views::{CapiVersion, ClusterView, MachineView, NodeView, RemediationView, TemplateView};
use vigil_api::well_known::{CLUSTER_NAME_LABEL, CONTROL_PLANE_MACHINE_LABEL};
use vigil_engine::Lookup;
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::machine_write::{apply_merge_patch, machine_status_patch};
use vigil_engine::plan::{Action, NoticeKind, Plan};

// ----------------------------------------------------------------------------------------------
// Time
// ----------------------------------------------------------------------------------------------

/// The fixed origin of every test timeline.
pub const T0_TEXT: &str = "2030-01-01T00:00:00Z";

/// Parses an RFC 3339 instant.
pub fn ts(text: &str) -> Timestamp {
    text.parse().expect("RFC 3339 timestamp")
}

/// [`T0_TEXT`] as an instant.
pub fn t0() -> Timestamp {
    ts(T0_TEXT)
}

/// `T0 + secs` seconds (negative goes back).
pub fn at(secs: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(secs)).expect("in range")
}

/// `t + nanos` nanoseconds.
pub fn plus_ns(t: Timestamp, nanos: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_nanos(nanos)).expect("in range")
}

// ----------------------------------------------------------------------------------------------
// Cluster API objects
// ----------------------------------------------------------------------------------------------

/// Namespace the fixtures live in.
pub const NS: &str = "ns";
/// Cluster the fixtures belong to.
pub const CLUSTER: &str = "c1";
/// The label the default selector matches (`pool=workers`).
pub const POOL_LABEL: &str = "pool";
/// Its value.
pub const POOL: &str = "workers";

/// `apiVersion` of a Cluster API form.
pub fn capi_api_version(version: CapiVersion) -> &'static str {
    match version {
        CapiVersion::V1Beta1 => "cluster.x-k8s.io/v1beta1",
        CapiVersion::V1Beta2 => "cluster.x-k8s.io/v1beta2",
    }
}

/// A condition as written in JSON, in either form (the fields both share).
pub fn condition_json(type_: &str, status: &str, since: Timestamp) -> Value {
    json!({"type": type_, "status": status, "reason": "Test", "message": "", "lastTransitionTime": since.to_string()})
}

/// A Cluster API Machine under construction; defaults: `v1beta2`, namespace [`NS`], labels
/// `pool=workers` and the cluster-name label of [`CLUSTER`], uid `uid-<name>`, created at `T0`,
/// no Node.
#[derive(Debug, Clone)]
pub struct MachineJson {
    version: CapiVersion,
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    created: Option<Timestamp>,
    deleting: bool,
    node: Option<String>,
    failure_reason: Option<String>,
    failure_message: Option<String>,
    conditions: Vec<Value>,
    v1beta2_conditions: Vec<Value>,
    extra_status: Vec<(String, Value)>,
}

/// A Machine named `name` with the defaults of [`MachineJson`].
pub fn machine(name: &str) -> MachineJson {
    MachineJson {
        version: CapiVersion::V1Beta2,
        name: name.into(),
        namespace: NS.into(),
        labels: [(POOL_LABEL.to_string(), POOL.to_string()), (CLUSTER_NAME_LABEL.to_string(), CLUSTER.to_string())]
            .into(),
        annotations: BTreeMap::new(),
        created: Some(t0()),
        deleting: false,
        node: None,
        failure_reason: None,
        failure_message: None,
        conditions: Vec::new(),
        v1beta2_conditions: Vec::new(),
        extra_status: Vec::new(),
    }
}

impl MachineJson {
    /// Written in this API form.
    pub fn version(mut self, version: CapiVersion) -> Self {
        self.version = version;
        self
    }

    /// Written as `cluster.x-k8s.io/v1beta1`.
    pub fn v1beta1(self) -> Self {
        self.version(CapiVersion::V1Beta1)
    }

    /// In another namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Adds (or replaces) a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Removes a label.
    pub fn without_label(mut self, key: &str) -> Self {
        self.labels.remove(key);
        self
    }

    /// Marks it a control-plane Machine.
    pub fn control_plane(self) -> Self {
        self.label(CONTROL_PLANE_MACHINE_LABEL, "")
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Sets the creation time (`None`: no `creationTimestamp`).
    pub fn created(mut self, at: Option<Timestamp>) -> Self {
        self.created = at;
        self
    }

    /// Sets `metadata.deletionTimestamp`.
    pub fn deleting(mut self) -> Self {
        self.deleting = true;
        self
    }

    /// Sets `status.nodeRef.name`.
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.into());
        self
    }

    /// Sets the failure fields where this API form keeps them (`v1beta1`: `status.failure*`,
    /// `v1beta2`: `status.deprecated.v1beta1.failure*`).
    pub fn failure(mut self, reason: Option<&str>, message: Option<&str>) -> Self {
        self.failure_reason = reason.map(str::to_string);
        self.failure_message = message.map(str::to_string);
        self
    }

    /// Adds a condition to `status.conditions` (the form's primary list).
    pub fn condition(mut self, type_: &str, status: &str, since: Timestamp) -> Self {
        self.conditions.push(condition_json(type_, status, since));
        self
    }

    /// Adds a `metav1.Condition` where this form keeps them: `status.conditions` of a `v1beta2`
    /// Machine, `status.v1beta2.conditions` of a `v1beta1` one.
    pub fn new_condition(mut self, type_: &str, status: &str, since: Timestamp) -> Self {
        let c = condition_json(type_, status, since);
        match self.version {
            CapiVersion::V1Beta1 => self.v1beta2_conditions.push(c),
            CapiVersion::V1Beta2 => self.conditions.push(c),
        }
        self
    }

    /// Adds a condition with `reason` to `status.conditions` (reason-aware rules).
    pub fn condition_with_reason(mut self, type_: &str, status: &str, reason: &str, since: Timestamp) -> Self {
        let mut c = condition_json(type_, status, since);
        c["reason"] = json!(reason);
        self.conditions.push(c);
        self
    }

    /// Adds a raw condition entry to `status.conditions`.
    pub fn raw_condition(mut self, condition: Value) -> Self {
        self.conditions.push(condition);
        self
    }

    /// Sets any other `status` field (e.g. a malformed one).
    pub fn status_field(mut self, key: &str, value: Value) -> Self {
        self.extra_status.push((key.into(), value));
        self
    }

    /// The Machine as the API server would return it.
    pub fn json(&self) -> Value {
        let mut metadata = json!({
            "name": self.name,
            "namespace": self.namespace,
            "uid": format!("uid-{}", self.name),
            "resourceVersion": "1",
            "generation": 1,
            "labels": self.labels,
        });
        if !self.annotations.is_empty() {
            metadata["annotations"] = json!(self.annotations);
        }
        if let Some(created) = self.created {
            metadata["creationTimestamp"] = json!(created.to_string());
        }
        if self.deleting {
            metadata["deletionTimestamp"] = json!(t0().to_string());
        }
        let mut status = json!({});
        if let Some(node) = &self.node {
            status["nodeRef"] = json!({"kind": "Node", "name": node});
        }
        if !self.conditions.is_empty() {
            status["conditions"] = json!(self.conditions);
        }
        if !self.v1beta2_conditions.is_empty() {
            status["v1beta2"] = json!({"conditions": self.v1beta2_conditions});
        }
        let failure_at = match self.version {
            CapiVersion::V1Beta1 => "",
            CapiVersion::V1Beta2 => "/deprecated/v1beta1",
        };
        for (field, value) in [("failureReason", &self.failure_reason), ("failureMessage", &self.failure_message)] {
            if let Some(value) = value {
                set_pointer(&mut status, &format!("{failure_at}/{field}"), json!(value));
            }
        }
        for (key, value) in &self.extra_status {
            status[key] = value.clone();
        }
        json!({
            "apiVersion": capi_api_version(self.version),
            "kind": "Machine",
            "metadata": metadata,
            "spec": {"clusterName": CLUSTER},
            "status": status,
        })
    }

    /// The Machine as the engine reads it.
    pub fn view(&self) -> MachineView {
        MachineView::read(&self.json()).expect("a named Machine")
    }
}

/// Sets `value` at a JSON pointer, creating the objects on the way.
pub fn set_pointer(root: &mut Value, pointer: &str, value: Value) {
    let mut cur = root;
    for part in pointer.trim_start_matches('/').split('/') {
        if !cur.is_object() {
            *cur = json!({});
        }
        cur = cur.as_object_mut().expect("an object").entry(part.to_string()).or_insert(Value::Null);
    }
    *cur = value;
}

/// A Cluster API Cluster under construction; defaults: `v1beta2`, named [`CLUSTER`] in [`NS`],
/// control plane initialized and infrastructure ready, both since `T0`.
#[derive(Debug, Clone)]
pub struct ClusterJson {
    version: CapiVersion,
    name: String,
    paused: bool,
    /// `None`: not initialized.
    control_plane_initialized: Option<Timestamp>,
    /// `None`: not ready.
    infrastructure_ready: Option<Timestamp>,
}

/// The default Cluster of [`ClusterJson`].
pub fn cluster() -> ClusterJson {
    ClusterJson {
        version: CapiVersion::V1Beta2,
        name: CLUSTER.into(),
        paused: false,
        control_plane_initialized: Some(t0()),
        infrastructure_ready: Some(t0()),
    }
}

impl ClusterJson {
    /// Written in this API form.
    pub fn version(mut self, version: CapiVersion) -> Self {
        self.version = version;
        self
    }

    /// Sets `spec.paused`.
    pub fn paused(mut self) -> Self {
        self.paused = true;
        self
    }

    /// When the control plane was initialized (`None`: not yet).
    pub fn control_plane_initialized(mut self, at: Option<Timestamp>) -> Self {
        self.control_plane_initialized = at;
        self
    }

    /// When the infrastructure became ready (`None`: not yet).
    pub fn infrastructure_ready(mut self, at: Option<Timestamp>) -> Self {
        self.infrastructure_ready = at;
        self
    }

    /// The Cluster as the API server would return it (conditions `ControlPlaneInitialized` and
    /// `InfrastructureReady`, plus the form's own flags).
    pub fn json(&self) -> Value {
        let condition = |type_: &str, at: Option<Timestamp>| match at {
            Some(at) => condition_json(type_, "True", at),
            None => condition_json(type_, "False", t0()),
        };
        let conditions = json!([
            condition("ControlPlaneInitialized", self.control_plane_initialized),
            condition("InfrastructureReady", self.infrastructure_ready),
        ]);
        let status = match self.version {
            CapiVersion::V1Beta1 => json!({
                "infrastructureReady": self.infrastructure_ready.is_some(),
                "conditions": conditions,
            }),
            CapiVersion::V1Beta2 => json!({
                "initialization": {
                    "controlPlaneInitialized": self.control_plane_initialized.is_some(),
                    "infrastructureProvisioned": self.infrastructure_ready.is_some(),
                },
                "conditions": conditions,
            }),
        };
        json!({
            "apiVersion": capi_api_version(self.version),
            "kind": "Cluster",
            "metadata": {"name": self.name, "namespace": NS, "uid": format!("uid-{}", self.name)},
            "spec": {"paused": self.paused},
            "status": status,
        })
    }

    /// The Cluster as the engine reads it.
    pub fn view(&self) -> ClusterView {
        ClusterView::read(&self.json()).expect("a named Cluster")
    }
}

// ----------------------------------------------------------------------------------------------
// Nodes
// ----------------------------------------------------------------------------------------------

/// A Node under construction.
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    conditions: Vec<NodeCondition>,
    taints: Vec<String>,
    unschedulable: bool,
    deleting: bool,
}

/// A Node named `name` with no labels and no conditions.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder {
        name: name.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        conditions: Vec::new(),
        taints: Vec::new(),
        unschedulable: false,
        deleting: false,
    }
}

impl NodeBuilder {
    /// Adds a condition that last changed at `since` (`None`: no transition time).
    pub fn condition_at(mut self, type_: &str, status: &str, since: Option<Timestamp>) -> Self {
        self.conditions.push(NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: since.map(Time),
            last_heartbeat_time: since.map(Time),
            reason: Some("Test".into()),
            message: None,
        });
        self
    }

    /// Adds a condition that last changed at `since`.
    pub fn condition(self, type_: &str, status: &str, since: Timestamp) -> Self {
        self.condition_at(type_, status, Some(since))
    }

    /// Takes the reason off the last condition added.
    pub fn without_reason(mut self) -> Self {
        if let Some(c) = self.conditions.last_mut() {
            c.reason = None;
        }
        self
    }

    /// Adds a condition with `reason` that last changed at `since` (reason-aware rules).
    pub fn condition_with_reason(mut self, type_: &str, status: &str, reason: &str, since: Timestamp) -> Self {
        self = self.condition(type_, status, since);
        if let Some(c) = self.conditions.last_mut() {
            c.reason = Some(reason.into());
        }
        self
    }

    /// `Ready` with `status` since `since`.
    pub fn ready(self, status: &str, since: Timestamp) -> Self {
        self.condition("Ready", status, since)
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Adds a `NoSchedule` taint of `key`.
    pub fn taint(mut self, key: &str) -> Self {
        self.taints.push(key.into());
        self
    }

    /// Cordons the Node (`spec.unschedulable`).
    pub fn cordoned(mut self) -> Self {
        self.unschedulable = true;
        self
    }

    /// Starts the Node's deletion (`metadata.deletionTimestamp`).
    pub fn deleting(mut self) -> Self {
        self.deleting = true;
        self
    }

    /// The Node, as the engine reads it.
    pub fn build(&self) -> NodeView {
        NodeView::from(self.build_k8s())
    }

    /// The Node as the API serves it (for converting the way adapters do).
    pub fn build_k8s(&self) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                uid: Some(format!("uid-{}", self.name)),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                creation_timestamp: Some(Time(t0())),
                deletion_timestamp: self.deleting.then(|| Time(t0())),
                ..ObjectMeta::default()
            },
            spec: (self.unschedulable || !self.taints.is_empty()).then(|| NodeSpec {
                unschedulable: self.unschedulable.then_some(true),
                taints: Some(
                    self.taints
                        .iter()
                        .map(|k| Taint { key: k.clone(), effect: "NoSchedule".into(), ..Taint::default() })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus { conditions: Some(self.conditions.clone()), ..NodeStatus::default() }),
        }
    }
}

/// Nodes by name: the `Lookup<NodeView>` the engine takes.
pub fn node_map(nodes: impl IntoIterator<Item = NodeView>) -> HashMap<String, NodeView> {
    nodes.into_iter().map(|n| (n.name.clone(), n)).collect()
}

// ----------------------------------------------------------------------------------------------
// Remediation templates and objects
// ----------------------------------------------------------------------------------------------

/// apiVersion of the fixture remediation kinds.
pub const REMEDIATION_API_VERSION: &str = "remediation.example.io/v1alpha1";
/// Kind of the fixture remediation template.
pub const TEMPLATE_KIND: &str = "TestRemediationTemplate";
/// Kind of the objects made from it.
pub const REMEDIATION_KIND: &str = "TestRemediation";
/// Name of the fixture template.
pub const TEMPLATE_NAME: &str = "reboot";

/// The spec every fixture remediation object gets from the default template.
pub fn remediation_spec() -> Value {
    json!({"strategy": "Reboot", "timeout": "5m"})
}

/// A remediation template as JSON; `spec_template` is its `spec.template` (`None`: missing).
pub fn template_json(namespace: &str, spec_template: Option<Value>) -> Value {
    let mut v = json!({
        "apiVersion": REMEDIATION_API_VERSION,
        "kind": TEMPLATE_KIND,
        "metadata": {"name": TEMPLATE_NAME, "namespace": namespace, "uid": "uid-template"},
        "spec": {},
    });
    if let Some(t) = spec_template {
        v["spec"]["template"] = t;
    }
    v
}

/// The default template (`spec.template.spec` = [`remediation_spec`]) as the engine reads it.
pub fn template(namespace: &str) -> TemplateView {
    TemplateView::read(&template_json(namespace, Some(json!({"spec": remediation_spec()})))).expect("a named template")
}

/// A template without `spec.template`.
pub fn template_without_body(namespace: &str) -> TemplateView {
    TemplateView::read(&template_json(namespace, None)).expect("a named template")
}

/// A remediation object owned by `owner_kind/owner_name` (uid `uid-<owner_name>`).
pub fn remediation_json(namespace: &str, name: &str, owner_kind: &str, owner_name: &str) -> Value {
    json!({
        "apiVersion": REMEDIATION_API_VERSION,
        "kind": REMEDIATION_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": format!("uid-remediation-{name}"),
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": owner_kind, "name": owner_name, "uid": format!("uid-{owner_name}")}],
        },
        "spec": remediation_spec(),
    })
}

/// Per-template object maps as the engine takes them: one lookup each.
pub fn lookups<'a>(maps: &'a [HashMap<String, &'a RemediationView>]) -> Vec<&'a dyn Lookup<RemediationView>> {
    maps.iter().map(|m| m as &dyn Lookup<RemediationView>).collect()
}

/// Remediation objects by name: the `Lookup<RemediationView>` the engine takes.
pub fn remediation_map(objects: impl IntoIterator<Item = Value>) -> HashMap<String, RemediationView> {
    objects
        .into_iter()
        .map(|o| {
            let view = RemediationView::read(&o).expect("a named remediation object");
            (view.meta.name.clone(), view)
        })
        .collect()
}

// ----------------------------------------------------------------------------------------------
// MachineHealthCheck
// ----------------------------------------------------------------------------------------------

/// The default MachineHealthCheck spec: cluster [`CLUSTER`], selector `pool=workers`, `Ready`
/// `False` or `Unknown` for 300s, default `nodeStartupTimeout` (10m) and `maxUnhealthy` (100%).
pub fn mhc_spec() -> Value {
    json!({
        "clusterName": CLUSTER,
        "selector": {"matchLabels": {POOL_LABEL: POOL}},
        "unhealthyConditions": [
            {"type": "Ready", "status": "False", "timeout": "300s"},
            {"type": "Ready", "status": "Unknown", "timeout": "300s"},
        ],
    })
}

/// The `spec.remediationTemplate` naming the fixture template.
pub fn template_ref_json() -> Value {
    json!({"apiVersion": REMEDIATION_API_VERSION, "kind": TEMPLATE_KIND, "name": TEMPLATE_NAME})
}

/// A MachineHealthCheck named `mhc` in [`NS`] from a spec, with optional annotations and status.
pub fn mhc(spec: Value, annotations: &[(&str, &str)], status: Option<&MachineHealthCheckStatus>) -> MachineHealthCheck {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let mut v = json!({
        "apiVersion": vigil_api::API_VERSION,
        "kind": "MachineHealthCheck",
        "metadata": {"name": "mhc", "namespace": NS, "uid": "uid-mhc", "generation": 1},
        "spec": spec,
    });
    if !annotations.is_empty() {
        v["metadata"]["annotations"] = json!(annotations);
    }
    if let Some(status) = status {
        v["status"] = serde_json::to_value(status).expect("status serializes");
    }
    serde_json::from_value(v).expect("a MachineHealthCheck")
}

/// The validated policy of a check (panics on an invalid spec: fixtures are valid).
pub fn mhc_policy(check: &MachineHealthCheck) -> MhcPolicy {
    validate::machine_health_check(check).expect("a valid MachineHealthCheck")
}

/// Everything one MachineHealthCheck decision looks at, owned, so a test can decide, apply the
/// plan the way the controller would, and decide again.
#[derive(Debug, Clone)]
pub struct MhcWorld {
    /// The check's spec.
    pub spec: Value,
    /// The check's annotations.
    pub annotations: Vec<(String, String)>,
    /// The check's status (what the last plan wrote).
    pub status: Option<MachineHealthCheckStatus>,
    /// The Cluster (`None`: not found).
    pub cluster: Option<Value>,
    /// Machines in the check's namespace, as JSON.
    pub machines: Vec<Value>,
    /// The workload cluster's Nodes.
    pub nodes: HashMap<String, NodeView>,
    /// `Some(why)`: the workload cluster cannot be reached.
    pub unreachable: Option<String>,
    /// The remediation template as found (`None`: not found or not named).
    pub template: Option<TemplateView>,
    /// Other templates found (a rule's own, with remediation per condition).
    pub other_templates: Vec<TemplateView>,
    /// Remediation objects in the check's namespace (of any kind), by name.
    pub remediations: HashMap<String, RemediationView>,
}

impl MhcWorld {
    /// A world with the default spec and Cluster and nothing else.
    pub fn new() -> Self {
        Self {
            spec: mhc_spec(),
            annotations: Vec::new(),
            status: None,
            cluster: Some(cluster().json()),
            machines: Vec::new(),
            nodes: HashMap::new(),
            unreachable: None,
            template: None,
            other_templates: Vec::new(),
            remediations: HashMap::new(),
        }
    }

    /// Sets a field of the spec.
    pub fn spec(mut self, key: &str, value: Value) -> Self {
        self.spec[key] = value;
        self
    }

    /// Names the fixture template in the spec and makes it found.
    pub fn with_template(self) -> Self {
        let mut w = self.spec("remediationTemplate", template_ref_json());
        w.template = Some(template(NS));
        w
    }

    /// Annotates the check.
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// Replaces the Cluster (`None`: not found).
    pub fn cluster(mut self, cluster: Option<ClusterJson>) -> Self {
        self.cluster = cluster.map(|c| c.json());
        self
    }

    /// Adds a Machine.
    pub fn machine(mut self, m: MachineJson) -> Self {
        self.machines.push(m.json());
        self
    }

    /// Adds a Node.
    pub fn node(mut self, n: NodeBuilder) -> Self {
        let n = n.build();
        self.nodes.insert(n.name.clone(), n);
        self
    }

    /// Adds a Machine with a Node of the same name whose `Ready` is `status` since `since`.
    pub fn machine_with_node(self, m: MachineJson, ready: &str, since: Timestamp) -> Self {
        let name = m.name.clone();
        self.machine(m.node(&name)).node(node(&name).ready(ready, since))
    }

    /// Adds a remediation object.
    pub fn remediation(mut self, object: Value) -> Self {
        self.remediations.extend(remediation_map([object]));
        self
    }

    /// The check object.
    pub fn check(&self) -> MachineHealthCheck {
        let annotations: Vec<(&str, &str)> = self.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        mhc(self.spec.clone(), &annotations, self.status.as_ref())
    }

    /// The Machines as the engine reads them.
    pub fn machine_views(&self) -> Vec<MachineView> {
        self.machines.iter().map(|m| MachineView::read(m).expect("a named Machine")).collect()
    }

    /// Decides at `now`.
    pub fn decide(&self, now: Timestamp) -> Plan<MachineHealthCheckStatus> {
        self.with_input(|input| machine::decide(input, now))
    }

    /// Decides at `now` among other checks: `holders` hold targets, the Nodes are of `node_cluster`.
    pub fn decide_among(
        &self,
        holders: &vigil_engine::holders::Holders,
        node_cluster: &str,
        now: Timestamp,
    ) -> Plan<MachineHealthCheckStatus> {
        self.with_input(|input| machine::decide_among(input, holders, node_cluster, now))
    }

    /// Calls `decide` with the engine's input for this world.
    fn with_input<R>(&self, decide: impl FnOnce(&MhcInput) -> R) -> R {
        let check = self.check();
        let policy = mhc_policy(&check);
        let cluster = self.cluster.as_ref().map(|c| ClusterView::read(c).expect("a named Cluster"));
        let views = self.machine_views();
        let refs: Vec<&MachineView> = views.iter().collect();
        let nodes = match &self.unreachable {
            Some(why) => NodeSource::Unreachable(why),
            None => NodeSource::Reachable(&self.nodes),
        };
        let (templates, maps) = self.sources(&policy);
        let remediations = lookups(&maps);
        let input = MhcInput {
            check: &check,
            policy: &policy,
            cluster: cluster.as_ref(),
            machines: &refs,
            machines_selected: false,
            nodes,
            templates: &templates,
            remediations: &remediations,
        };
        decide(&input)
    }

    /// What the engine reads for `policy`'s templates (its own and its rules'), in
    /// `MhcPolicy::templates` order: each template as found (by kind and name), and the objects
    /// of its remediation kind by name.
    #[allow(clippy::type_complexity)]
    pub fn sources(&self, policy: &MhcPolicy) -> (Vec<Option<&TemplateView>>, Vec<HashMap<String, &RemediationView>>) {
        policy
            .templates()
            .into_iter()
            .map(|t| {
                let found = self
                    .template
                    .iter()
                    .chain(&self.other_templates)
                    .find(|v| v.meta.kind == t.kind && v.meta.name == t.name);
                let objects = self
                    .remediations
                    .iter()
                    .filter(|(_, o)| o.meta.kind == t.remediation_kind())
                    .map(|(name, o)| (name.clone(), o))
                    .collect();
                (found, objects)
            })
            .unzip()
    }

    /// Applies a plan as the controller would: the status is written, Machine conditions are
    /// patched with the very merge patch the controller sends, remediation objects are created
    /// and deleted.
    pub fn apply(&mut self, plan: &Plan<MachineHealthCheckStatus>) {
        self.status = Some(plan.status.clone());
        for action in &plan.actions {
            match action {
                Action::SetMachineConditions { machine, version, conditions } => {
                    let target = self
                        .machines
                        .iter_mut()
                        .find(|m| m.pointer("/metadata/name").and_then(Value::as_str) == Some(&machine.name))
                        .expect("the plan writes to a known Machine");
                    let patch = machine_status_patch(target, *version, conditions);
                    apply_merge_patch(target, &patch);
                }
                Action::CreateRemediation { object, .. } => {
                    self.remediations.extend(remediation_map([object.clone()]));
                }
                Action::DeleteRemediation { object, .. } => {
                    self.remediations.remove(&object.name);
                }
                Action::AnnotateRemediation { .. } | Action::WriteLease(_) | Action::DeleteLease { .. } => {
                    panic!("a MachineHealthCheck never annotates nor takes a Node's Lease: {action:?}")
                }
            }
        }
    }

    /// Changes a Machine's JSON in place.
    pub fn edit_machine(&mut self, name: &str, edit: impl FnOnce(&mut Value)) {
        let m = self
            .machines
            .iter_mut()
            .find(|m| m.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
            .expect("a known Machine");
        edit(m);
    }
}

impl Default for MhcWorld {
    fn default() -> Self {
        Self::new()
    }
}

// ----------------------------------------------------------------------------------------------
// Reading plans
// ----------------------------------------------------------------------------------------------

/// Machines asked to be remediated by their owner (`OwnerRemediated=False`), by name.
pub fn owner_asked<S>(plan: &Plan<S>) -> Vec<String> {
    machine_writes(plan)
        .into_iter()
        .filter(|(_, cs)| cs.iter().any(|(t, s, _)| t == "OwnerRemediated" && s == "False"))
        .map(|(m, _)| m)
        .collect()
}

/// Conditions written per Machine name, as `(type, status, reason)`, sorted.
pub fn machine_writes<S>(plan: &Plan<S>) -> BTreeMap<String, Vec<(String, String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    for action in &plan.actions {
        if let Action::SetMachineConditions { machine, conditions, .. } = action {
            let list = out.entry(machine.name.clone()).or_default();
            list.extend(conditions.iter().map(|(c, _)| (c.type_.clone(), c.status.to_string(), c.reason.to_string())));
            list.sort();
        }
    }
    out
}

/// The condition of `type_` a plan writes on Machine `name`, with its transition time.
pub fn written<'p, S>(plan: &'p Plan<S>, name: &str, type_: &str) -> Option<&'p (DesiredCondition, Timestamp)> {
    plan.actions.iter().find_map(|a| match a {
        Action::SetMachineConditions { machine, conditions, .. } if machine.name == name => {
            conditions.iter().find(|(c, _)| c.type_ == type_)
        }
        _ => None,
    })
}

/// The manifests a plan creates.
pub fn creates<S>(plan: &Plan<S>) -> Vec<&Value> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, .. } => Some(object),
            _ => None,
        })
        .collect()
}

/// Names of the objects a plan creates, sorted.
pub fn created_names<S>(plan: &Plan<S>) -> Vec<String> {
    let mut names: Vec<String> = creates(plan)
        .iter()
        .map(|o| o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string())
        .collect();
    names.sort();
    names
}

/// Names of the objects a plan deletes, sorted.
pub fn deleted_names<S>(plan: &Plan<S>) -> Vec<String> {
    let mut names: Vec<String> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteRemediation { object, .. } => Some(object.name.clone()),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

/// A plan's notices as `(kind, target, reason)`, in order.
pub fn notices<S>(plan: &Plan<S>) -> Vec<(NoticeKind, Option<String>, String)> {
    plan.notices.iter().map(|n| (n.kind, n.target_key(), n.reason.to_string())).collect()
}

/// The check condition of `type_` in a status's conditions.
pub fn check_condition<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `namespace/name` of a fixture Machine.
pub fn key(name: &str) -> String {
    format!("{NS}/{name}")
}

// ----------------------------------------------------------------------------------------------
// NodeHealthCheck decisions from a stored status
// ----------------------------------------------------------------------------------------------

/// The namespace of the SelfNodeRemediationTemplate `snr` [`decide_nhc_from`] offers.
pub const NHC_SNR_NS: &str = "medik8s";

/// One decision of NodeHealthCheck `nhc` (`spec`, at `generation`) with `status` (its JSON text,
/// as the API server stores it) at `now`, the template `snr` in [`NHC_SNR_NS`] offered: each call
/// reads the previous status back as a restarted controller would.
pub fn decide_nhc_from(
    spec: &Value,
    generation: i64,
    status: Option<&str>,
    nodes: &[NodeView],
    now: Timestamp,
) -> Plan<vigil_api::node_health_check::NodeHealthCheckStatus> {
    let mut check = json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": generation},
        "spec": spec,
    });
    if let Some(text) = status {
        check["status"] = serde_json::from_str(text).expect("status JSON");
    }
    let check: vigil_api::NodeHealthCheck = serde_json::from_value(check).expect("check");
    let policy = validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let template = TemplateView::read(&json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": NHC_SNR_NS},
        "spec": {"template": {"spec": {}}}
    }))
    .expect("template");
    let input = vigil_engine::node::NhcInput {
        check: &check,
        policy: &policy,
        nodes: &refs,
        templates: &[Some(&template)],
        remediations: &[],
        around: vigil_engine::node::Around::default(),
    };
    vigil_engine::node::decide(&input, now)
}

// ----------------------------------------------------------------------------------------------
// Flapping timelines
// ----------------------------------------------------------------------------------------------

/// Episodes of a target, `(start minute, minutes long)`, such that no `n` of them start within
/// an hour, each shorter than a 5-minute rule and than the gap to the next: a flapping check
/// with `episodes: n, window: 1h` must never remediate for them.
pub fn sparse_timeline(n: usize) -> impl proptest::strategy::Strategy<Value = Vec<(i64, i64)>> {
    use proptest::strategy::Strategy as _;
    proptest::collection::vec((4i64..70, 1i64..5), 0..10).prop_map(move |gaps| {
        let mut starts: Vec<i64> = Vec::new();
        let mut t = 0;
        let mut out = Vec::new();
        for (gap, len) in gaps {
            t += gap;
            if starts.len() + 1 >= n {
                t = t.max(starts[starts.len() + 1 - n] + 61);
            }
            starts.push(t);
            out.push((t, len.min(gap - 1).max(1)));
        }
        out
    })
}
