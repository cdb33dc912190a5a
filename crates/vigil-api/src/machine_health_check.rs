//! MachineHealthCheck: Cluster API's health check for the Machines of one cluster, with the
//! `cluster.x-k8s.io/v1beta1` field names so upstream manifests carry over.

use crate::shared::{FeatureSpec, FeatureStatus, RemediationBackoff, TemplateReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired health criteria and remediation limits for the Machines of one cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "vigil.dev",
    version = "v1alpha1",
    kind = "MachineHealthCheck",
    doc = "Checks the Machines of one Cluster API cluster and asks for the unhealthy ones to be remediated.",
    namespaced,
    status = "MachineHealthCheckStatus",
    shortname = "mhc",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Expected","type":"integer","jsonPath":".status.expectedMachines"}"#,
    printcolumn = r#"{"name":"Healthy","type":"integer","jsonPath":".status.currentHealthy"}"#,
    printcolumn = r#"{"name":"Allowed","type":"integer","jsonPath":".status.remediationsAllowed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = crate::schema::mhc_spec)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckSpec {
    /// Name of the Cluster whose Machines are checked.
    #[schemars(transform = crate::schema::cluster_name)]
    pub cluster_name: String,
    /// Machines to check; must not be empty.
    #[schemars(transform = crate::schema::label_selector)]
    pub selector: LabelSelector,
    /// Node conditions that make a Machine unhealthy once held for their timeout (ORed).
    #[schemars(transform = crate::schema::condition_list)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// Machine conditions that make a Machine unhealthy once held for their timeout (ORed).
    #[schemars(transform = crate::schema::machine_condition_list)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_machine_conditions: Vec<UnhealthyCondition>,
    /// How long a Machine may go without a Node (default 10m; `0` disables; else at least 30s).
    #[schemars(transform = crate::schema::node_startup_timeout)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_startup_timeout: Option<String>,
    /// Remediation stops when more than this many (or this percentage of) targets are unhealthy.
    #[schemars(transform = crate::schema::mhc_threshold)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<IntOrString>,
    /// Remediation is allowed only while the unhealthy count is within `[min-max]`; wins over
    /// `maxUnhealthy`.
    #[schemars(transform = crate::schema::unhealthy_range)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_range: Option<String>,
    /// A template for external remediation objects, in the check's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
    /// Shadow mode: evaluate and report what would be remediated (`status.wouldRemediate`,
    /// `WouldRemediate` events) without marking, creating or deleting anything, so a new policy
    /// can be watched before it is trusted. Off by default (upstream has no such field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Remediation back-off: stops remediating a pool (the Machines of one MachineDeployment,
    /// else of one controlling owner) once `maxRemediations` were started in it within `window`,
    /// since more remediation will not fix a bad image or config. Off by default.
    #[schemars(transform = crate::schema::mhc_backoff)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<RemediationBackoff>,
    /// Failure-domain budgets: a separate unhealthy budget per domain (a zone, a rack), so an
    /// outage in one domain pauses remediation there only. Off when absent (upstream has no
    /// such field).
    #[schemars(transform = crate::schema::mhc_failure_domains)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<crate::failure_domains::FailureDomains>,
    /// Pacing: at most this many remediations in flight at once (a count, or `N%` of the
    /// check's targets, rounded down, at least 1); the other unhealthy Machines wait in
    /// `status.queued`, the longest-unhealthy first, so a wave or a lifted short-circuit does not
    /// replace every Machine in the same second. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::max_in_flight)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<IntOrString>,
    /// Voluntary disruptions in the budget: with `Count`, Machines taken down on purpose (being
    /// deleted, tainted for removal by the cluster autoscaler or Karpenter, cordoned for a kured
    /// reboot or for node maintenance) count as unavailable in `maxUnhealthy` / `unhealthyRange`, the failure-domain
    /// budgets and `maxInFlight`, so remediation and a rollout or a scale-down together never take
    /// down more than the budget. `Ignore` (the default) counts health alone, as upstream.
    #[schemars(transform = crate::schema::voluntary_disruptions)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voluntary_disruptions: Option<String>,
    /// Flapping targets: a Machine whose rules match and clear again `episodes` times within
    /// `window` counts as unhealthy (reason `Flapping`), though no episode lasted a rule's
    /// `timeout`. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::flapping)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flapping: Option<crate::shared::Flapping>,
    /// CEL expressions over each target's Node (`node.labels`, `node.annotations`, `node.taints`,
    /// `node.unschedulable`, `node.conditions`) and its Machine (`machine.labels`,
    /// `machine.annotations`, `machine.phase`, `machine.deleting`): a Machine with a Node for
    /// which one holds for its `timeout` is unhealthy (ORed with the condition rules). None by
    /// default (upstream has no such field).
    #[schemars(transform = crate::schema::expression_list)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_expressions: Vec<MachineUnhealthyExpression>,
}

/// A CEL expression over a Machine and its Node, and how long it must hold before the Machine
/// counts as unhealthy, for what no single condition says.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineUnhealthyExpression {
    /// A CEL expression over `node` and `machine` that is true when the Machine is unhealthy;
    /// refused when it does not compile, reads anything else, or may cost too much.
    #[schemars(transform = crate::schema::expression)]
    pub expression: String,
    /// How long the expression must hold, on Vigil's own clock (`status.expressionMatches`).
    #[schemars(transform = crate::schema::non_negative_duration)]
    pub timeout: String,
    /// The expression's own remediation: the Machines it made unhealthy get an external
    /// remediation object from this template (in the check's namespace) instead of the check's
    /// default (its own `remediationTemplate`, else the owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
}

/// A condition and how long it must hold before the target counts as unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct UnhealthyCondition {
    /// Condition type, e.g. `Ready`.
    #[schemars(transform = crate::schema::condition_type)]
    #[serde(rename = "type")]
    pub type_: String,
    /// Condition status: `True`, `False` or `Unknown`.
    #[schemars(transform = crate::schema::condition_status)]
    pub status: String,
    /// Go duration, e.g. `300s`.
    #[schemars(transform = crate::schema::non_negative_duration)]
    pub timeout: String,
    /// Stale-signal guard (Node conditions only, not `Ready`): a matching condition whose
    /// `lastHeartbeatTime` is older than this (Go duration, at least `1m`) is set aside as stale,
    /// so a dead detector's last word never remediates. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::max_condition_age)]
    #[serde(default, rename = "maxConditionAge", skip_serializing_if = "Option::is_none")]
    pub max_condition_age: Option<String>,
    /// Reason-aware rule: the condition matches only when its `reason` is one of these (so a
    /// detector's "disk failing" is told from its "disk full"). Absent: any reason; an empty list
    /// is refused. Off when absent (upstream has no such field).
    #[schemars(transform = crate::schema::condition_reasons)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
    /// Remediation per condition: the targets this rule made unhealthy get an external
    /// remediation object from this template (in the check's namespace) instead of the check's
    /// default (its own `remediationTemplate`, else the owner). Off when absent (upstream has no
    /// such field).
    #[serde(default, rename = "remediationTemplate", skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
}

/// What the check observed, as the API shows it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckStatus {
    /// Number of Machines this check targets.
    #[serde(default)]
    pub expected_machines: i32,
    /// Number of targets that are healthy now.
    #[serde(default)]
    pub current_healthy: i32,
    /// How many more Machines may be remediated before the short-circuit trips.
    #[serde(default)]
    pub remediations_allowed: i32,
    /// Names of the targeted Machines, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// `RemediationAllowed` and `Paused`.
    #[schemars(transform = crate::schema::status_conditions)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What Vigil's own features report (dry-run, back-off, failure domains, stale signals),
    /// the same on both kinds.
    #[serde(flatten)]
    pub features: FeatureStatus,
}

impl MachineHealthCheckSpec {
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
