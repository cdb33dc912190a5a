//! NodeHealthCheck: medik8s' health check for plain Nodes, with the
//! `remediation.medik8s.io/v1alpha1` field names so upstream manifests carry over.

/// The expression records live with the other feature status both kinds share.
pub use crate::shared::{ExpressionMatch, UnevaluatedExpression};
use crate::shared::{FeatureSpec, FeatureStatus, RemediationBackoff, TemplateReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired health criteria, remediators and limits for a set of Nodes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "vigil.dev",
    version = "v1alpha1",
    kind = "NodeHealthCheck",
    doc = "Checks a set of Nodes and asks remediators to repair the unhealthy ones.",
    status = "NodeHealthCheckStatus",
    shortname = "nhc",
    printcolumn = r#"{"name":"Observed","type":"integer","jsonPath":".status.observedNodes"}"#,
    printcolumn = r#"{"name":"Healthy","type":"integer","jsonPath":".status.healthyNodes"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = crate::schema::nhc_spec)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealthCheckSpec {
    /// Nodes to check; must not be empty.
    #[schemars(transform = crate::schema::label_selector)]
    pub selector: LabelSelector,
    /// Node conditions that make a Node unhealthy once held for their duration (ORed).
    #[schemars(transform = crate::schema::nhc_condition_list)]
    #[serde(default = "default_unhealthy_conditions")]
    pub unhealthy_conditions: Vec<NodeUnhealthyCondition>,
    /// Remediation is allowed only while at least this many (or this percentage of) Nodes are
    /// healthy. Exactly one of `minHealthy` / `maxUnhealthy`.
    #[schemars(transform = crate::schema::threshold)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_healthy: Option<IntOrString>,
    /// Remediation is allowed only while at most this many (or this percentage of) Nodes are
    /// not healthy. Exactly one of `minHealthy` / `maxUnhealthy`.
    #[schemars(transform = crate::schema::threshold)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<IntOrString>,
    /// The one remediator to use. Exactly one of this / `escalatingRemediations`.
    #[schemars(transform = crate::schema::nhc_template)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
    /// Remediators to try in `order`, each for at most `timeout`.
    #[schemars(transform = crate::schema::escalating_remediations)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalating_remediations: Vec<EscalatingRemediation>,
    /// While non-empty, no new remediation starts (ongoing ones go on).
    #[schemars(transform = crate::schema::pause_requests)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pause_requests: Vec<String>,
    /// How long a Node must stay healthy before its remediation objects are removed; negative
    /// waits for the `remediation.medik8s.io/manually-confirmed-healthy` Node annotation.
    #[schemars(transform = crate::schema::go_duration)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_delay: Option<String>,
    /// How long remediation stays blocked after the healthy count recovers from a storm.
    #[schemars(transform = crate::schema::non_negative_duration)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_cooldown_duration: Option<String>,
    /// Shadow mode: evaluate and report what would be remediated (`status.wouldRemediate`,
    /// `WouldRemediate` events) without creating or deleting any remediation object, so a new
    /// policy can be watched before it is trusted. Off by default (upstream has no such field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Remediation back-off: stops remediating a pool (the Nodes sharing the value of
    /// `poolLabel`) once `maxRemediations` were started in it within `window`, since more
    /// remediation will not fix a bad image or config. Off by default.
    #[schemars(transform = crate::schema::nhc_backoff)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<RemediationBackoff>,
    /// Failure-domain budgets: a separate unhealthy budget per domain (a zone, a rack), so an
    /// outage in one domain pauses remediation there only. Off when absent (upstream has no
    /// such field). The key must be a Node label.
    #[schemars(transform = crate::schema::nhc_failure_domains)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<crate::failure_domains::FailureDomains>,
    /// Pacing: at most this many remediations in flight at once (a count, or `N%` of the
    /// selected Nodes, rounded down, at least 1); the other unhealthy Nodes wait in
    /// `status.queued`, the longest-unhealthy first, so a wave or a lifted short-circuit does not
    /// remediate every Node in the same second. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::max_in_flight)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<IntOrString>,
    /// Voluntary disruptions in the budget: with `Count`, Nodes taken down on purpose (being
    /// deleted, tainted for removal by the cluster autoscaler or Karpenter, cordoned for a kured
    /// reboot or for node maintenance) count as unavailable in `minHealthy` / `maxUnhealthy`, the failure-domain
    /// budgets and `maxInFlight`, so remediation and a rollout or a scale-down together never take
    /// down more than the budget. `Ignore` (the default) counts health alone, as upstream.
    #[schemars(transform = crate::schema::voluntary_disruptions)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voluntary_disruptions: Option<String>,
    /// Flapping targets: a Node whose rules match and clear again `episodes` times within
    /// `window` counts as unhealthy (reason `Flapping`), though no episode lasted a rule's
    /// `duration`. Off when absent, as upstream.
    #[schemars(transform = crate::schema::flapping)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flapping: Option<crate::shared::Flapping>,
    /// CEL expressions over each selected Node (`node.labels`, `node.annotations`,
    /// `node.taints`, `node.unschedulable`, `node.conditions`): a Node for which one holds for
    /// its `duration` is unhealthy (ORed with `unhealthyConditions`). None by default.
    #[schemars(transform = crate::schema::expression_list)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_expressions: Vec<UnhealthyExpression>,
    /// Planned maintenance: a Node under maintenance (a `NodeMaintenance` names it, or it is
    /// cordoned by a drain that says so: the node maintenance operator's `medik8s.io/drain`
    /// taint, kured's `weave.works/kured-reboot-in-progress` annotation) is not remediated while
    /// the maintenance lasts and for `grace` after it ends, so an administrator's reboot is never
    /// answered with a fence. On unless `enabled: false` (an upstream-group manifest reads as
    /// `enabled: false`: upstream has no such rule beyond the node Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_maintenance: Option<PlannedMaintenance>,
}

/// How a NodeHealthCheck treats Nodes under planned maintenance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMaintenance {
    /// Whether a Node under maintenance is left alone (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How long after the maintenance ends the Node is still left alone, to come back (Go
    /// duration, `0s` to `24h`; default `10m`).
    #[schemars(transform = crate::schema::maintenance_grace)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<String>,
}

/// medik8s' defaults: a Node that is not Ready (False or Unknown) for five minutes.
pub fn default_unhealthy_conditions() -> Vec<NodeUnhealthyCondition> {
    ["False", "Unknown"]
        .into_iter()
        .map(|status| NodeUnhealthyCondition {
            type_: "Ready".into(),
            status: status.into(),
            duration: "300s".into(),
            max_condition_age: None,
            reasons: None,
            remediation_template: None,
            escalating_remediations: Vec::new(),
        })
        .collect()
}

/// A CEL expression over a Node and how long it must hold before the Node counts as unhealthy,
/// for what no single condition says (a label, a taint, several conditions together).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyExpression {
    /// A CEL expression over `node` that is true when the Node is unhealthy; refused when it does
    /// not compile, reads anything but `node`, or may cost too much.
    #[schemars(transform = crate::schema::expression)]
    pub expression: String,
    /// How long the expression must hold, on Vigil's own clock (`status.expressionMatches`).
    #[schemars(transform = crate::schema::non_negative_duration)]
    pub duration: String,
    /// The expression's own remediator for the Nodes it made unhealthy, instead of the check's.
    /// At most one of this / `escalatingRemediations`; neither: the check's own.
    #[schemars(transform = crate::schema::nhc_template)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
    /// The expression's own remediators, tried in `order`, for the Nodes it made unhealthy
    /// (the same rules as the check's own).
    #[schemars(transform = crate::schema::escalating_remediations)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalating_remediations: Vec<EscalatingRemediation>,
}

/// A Node condition and how long it must hold before the Node counts as unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct NodeUnhealthyCondition {
    /// Condition type, e.g. `Ready`.
    #[schemars(transform = crate::schema::condition_type)]
    #[serde(rename = "type")]
    pub type_: String,
    /// Condition status: `True`, `False` or `Unknown`.
    #[schemars(transform = crate::schema::condition_status)]
    pub status: String,
    /// Go duration, e.g. `300s`.
    #[schemars(transform = crate::schema::non_negative_duration)]
    pub duration: String,
    /// Stale-signal guard (not on `Ready`): a matching condition whose `lastHeartbeatTime` is
    /// older than this (Go duration, at least `1m`) is set aside as stale, so a dead detector's
    /// last word never remediates. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::max_condition_age)]
    #[serde(default, rename = "maxConditionAge", skip_serializing_if = "Option::is_none")]
    pub max_condition_age: Option<String>,
    /// Reason-aware rule: the condition matches only when its `reason` is one of these (so a
    /// detector's "disk failing" is told from its "disk full"). Absent: any reason; an empty list
    /// is refused. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::condition_reasons)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
    /// Remediation per condition: the one remediator for the Nodes this rule made unhealthy,
    /// instead of the check's. At most one of this / `escalatingRemediations`; neither: the
    /// check's own. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::nhc_template)]
    #[serde(default, rename = "remediationTemplate", skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
    /// Remediation per condition: remediators to try in `order` for the Nodes this rule made
    /// unhealthy, instead of the check's (the same rules as the check's own).
    #[schemars(transform = crate::schema::escalating_remediations)]
    #[serde(default, rename = "escalatingRemediations", skip_serializing_if = "Vec::is_empty")]
    pub escalating_remediations: Vec<EscalatingRemediation>,
}

/// One step of an escalation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EscalatingRemediation {
    /// The remediator of this step.
    #[schemars(transform = crate::schema::nhc_template)]
    pub remediation_template: TemplateReference,
    /// Position in the escalation; unique, lowest first.
    #[schemars(transform = crate::schema::escalation_order)]
    pub order: i32,
    /// How long this step may take before the next one starts (at least 1m).
    #[schemars(transform = crate::schema::escalation_timeout)]
    pub timeout: String,
}

/// What the check observed, as the API shows it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealthCheckStatus {
    /// Number of Nodes selected.
    #[serde(default)]
    pub observed_nodes: i32,
    /// Number of selected Nodes that are healthy.
    #[serde(default)]
    pub healthy_nodes: i32,
    /// Nodes found unhealthy, with the remediations made for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_nodes: Vec<UnhealthyNode>,
    /// Disabled > Paused > Remediating > Enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why the check is in its phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `Disabled`, `RemediationAllowed`.
    #[schemars(transform = crate::schema::status_conditions)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// When the healthy count recovered from a storm; cleared once `stormCooldownDuration` passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_recovery_start_time: Option<Time>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What Vigil's own features report (dry-run, back-off, failure domains, stale signals),
    /// the same on both kinds.
    #[serde(flatten)]
    pub features: FeatureStatus,
}

/// What an unhealthy Node's remediation waits for, so the status says who or what holds it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeWait {
    /// `NodeLeaseHeld`, `NodeUnderMaintenance`, `MaintenanceGrace`, `MaintenanceUnknown`,
    /// `RemediatorFinishing`.
    pub reason: String,
    /// For a person: who holds the Node (the Lease's holder, the NodeMaintenance, the object
    /// being deleted) and until when.
    pub message: String,
    /// Since when it waits for this.
    pub since: Time,
    /// When the wait ends by itself (a Lease expiring, the end of the grace), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
}

/// A Node found unhealthy and what was done about it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyNode {
    /// Node name.
    pub name: String,
    /// Remediation objects created for the Node, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remediations: Vec<NodeRemediation>,
    /// When the Node was first seen healthy again (start of `healthyDelay`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions_healthy_timestamp: Option<Time>,
    /// True while a healthy Node keeps its remediation objects because of `healthyDelay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_delayed: Option<bool>,
    /// What its remediation waits for (a Lease another holder has, planned maintenance, a
    /// remediator finishing); absent when nothing holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<NodeWait>,
}

/// One remediation object made for a Node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRemediation {
    /// The remediation object.
    pub resource: RemediationReference,
    /// When it was created.
    pub started: Time,
    /// When NHC gave up on it and escalated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<Time>,
    /// Name of the template it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_name: Option<String>,
}

/// Reference to a remediation object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationReference {
    /// apiVersion of the object.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// UID of the object, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl NodeHealthCheckSpec {
    /// Vigil's own feature fields, for the validator both kinds share.
    pub fn features(&self) -> FeatureSpec<'_> {
        FeatureSpec {
            dry_run: self.dry_run,
            backoff: self.backoff.as_ref(),
            failure_domains: self.failure_domains.as_ref(),
            max_in_flight: self.max_in_flight.as_ref(),
            voluntary_disruptions: self.voluntary_disruptions.as_deref(),
        }
    }
}
