//! MachineHealthCheck: Cluster API's health check for the Machines of one cluster, with the
//! `cluster.x-k8s.io/v1beta1` field names so upstream manifests carry over.

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
#[schemars(transform = crate::crd::mhc_spec)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckSpec {
    /// Name of the Cluster whose Machines are checked.
    #[schemars(transform = crate::crd::cluster_name)]
    pub cluster_name: String,
    /// Machines to check; must not be empty.
    #[schemars(transform = crate::crd::label_selector)]
    pub selector: LabelSelector,
    /// Node conditions that make a Machine unhealthy once held for their timeout (ORed).
    #[schemars(transform = crate::crd::condition_list)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// Machine conditions that make a Machine unhealthy once held for their timeout (ORed).
    #[schemars(transform = crate::crd::machine_condition_list)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_machine_conditions: Vec<UnhealthyCondition>,
    /// How long a Machine may go without a Node (default 10m; `0` disables; else at least 30s).
    #[schemars(transform = crate::crd::node_startup_timeout)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_startup_timeout: Option<String>,
    /// Remediation stops when more than this many (or this percentage of) targets are unhealthy.
    #[schemars(transform = crate::crd::mhc_threshold)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<IntOrString>,
    /// Remediation is allowed only while the unhealthy count is within `[min-max]`; wins over
    /// `maxUnhealthy`.
    #[schemars(transform = crate::crd::unhealthy_range)]
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
    #[schemars(transform = crate::crd::mhc_backoff)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<RemediationBackoff>,
    /// Failure-domain budgets: a separate unhealthy budget per domain (a zone, a rack), so an
    /// outage in one domain pauses remediation there only. Off when absent (upstream has no
    /// such field).
    #[schemars(transform = crate::crd::mhc_failure_domains)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<crate::failure_domains::FailureDomains>,
    /// Pacing: at most this many remediations in flight at once (a count, or `N%` of the
    /// check's targets, rounded down, at least 1); the other unhealthy Machines wait in
    /// `status.queued`, the longest-unhealthy first, so a wave or a lifted short-circuit does not
    /// replace every Machine in the same second. Off when absent (upstream has no such field).
    #[schemars(transform = crate::crd::max_in_flight)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<IntOrString>,
}

/// `spec.backoff`: how many remediations one pool may start within a window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationBackoff {
    /// Most remediations started in one pool within `window` (1 to 100); the next one waits.
    #[schemars(transform = crate::crd::max_remediations)]
    pub max_remediations: i32,
    /// How far back remediations count, a Go duration greater than zero, e.g. `30m`.
    #[schemars(transform = crate::crd::backoff_window)]
    pub window: String,
    /// NodeHealthCheck only (required there): the Node label whose value names a Node's pool,
    /// e.g. `karpenter.sh/nodepool`; a Node without it is a pool of its own.
    #[schemars(transform = crate::crd::pool_label)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_label: Option<String>,
}

/// One remediation a check with `spec.backoff` started: kept in status so that the back-off
/// survives a restart of the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationRecord {
    /// The pool, e.g. `MachineDeployment/md-0` or `karpenter.sh/nodepool=default`.
    pub pool: String,
    /// The target: Machine name or Node name.
    pub target: String,
    /// When the remediation started.
    pub started: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// Made in dry-run (it would have started): never holds back a check that is not in dry-run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// A pool whose remediation is backed off now.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackedOffPool {
    /// The pool.
    pub pool: String,
    /// Remediations started in the pool within the window.
    pub started: i32,
    /// When the next remediation may start in the pool.
    pub resumes_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// Unhealthy targets waiting for the back-off, sorted (at most 10 named).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
    /// How many targets wait, named or not.
    pub waiting_count: i32,
    /// The pool waits because the history is full (200 records within the window), not because
    /// of its own `maxRemediations`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history_full: bool,
}

/// An unhealthy target waiting for a remediation slot (`spec.maxInFlight`), and its place.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedTarget {
    /// The target: Machine name (MachineHealthCheck) or Node name (NodeHealthCheck).
    pub name: String,
    /// When it became unhealthy (the queue's order: the longest-unhealthy goes next).
    pub unhealthy_since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// Its place in the queue, 1 for the next to start.
    pub position: i32,
}

/// A target a check in dry-run would have remediated, and since when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WouldRemediate {
    /// The target: Machine name (MachineHealthCheck) or Node name (NodeHealthCheck).
    pub name: String,
    /// What would have been done, e.g. `OwnerRemediated=False` or `create SelfNodeRemediation`.
    pub action: String,
    /// When the check first would have remediated it (continuously since then).
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// A condition and how long it must hold before the target counts as unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct UnhealthyCondition {
    /// Condition type, e.g. `Ready`.
    #[schemars(transform = crate::crd::condition_type)]
    #[serde(rename = "type")]
    pub type_: String,
    /// Condition status: `True`, `False` or `Unknown`.
    #[schemars(transform = crate::crd::condition_status)]
    pub status: String,
    /// Go duration, e.g. `300s`.
    #[schemars(transform = crate::crd::non_negative_duration)]
    pub timeout: String,
    /// Stale-signal guard (Node conditions only, not `Ready`): a matching condition whose
    /// `lastHeartbeatTime` is older than this (Go duration, at least `1m`) is set aside as stale,
    /// so a dead detector's last word never remediates. Off when absent (upstream has no such field).
    #[schemars(transform = crate::crd::max_condition_age)]
    #[serde(default, rename = "maxConditionAge", skip_serializing_if = "Option::is_none")]
    pub max_condition_age: Option<String>,
    /// Reason-aware rule: the condition matches only when its `reason` is one of these (so a
    /// detector's "disk failing" is told from its "disk full"). Absent: any reason; an empty list
    /// is refused. Off when absent (upstream has no such field).
    #[schemars(transform = crate::crd::condition_reasons)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
    /// Remediation per condition: the targets this rule made unhealthy get an external
    /// remediation object from this template (in the check's namespace) instead of the check's
    /// default (its own `remediationTemplate`, else the owner). Off when absent (upstream has no
    /// such field).
    #[serde(default, rename = "remediationTemplate", skip_serializing_if = "Option::is_none")]
    pub remediation_template: Option<TemplateReference>,
}

/// A target whose matching Node condition was set aside because its reporter stopped
/// heartbeating (`maxConditionAge`), so an operator sees which detector went quiet where.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaleTarget {
    /// The target: Machine name (MachineHealthCheck) or Node name (NodeHealthCheck).
    pub name: String,
    /// The stale condition, `Type=Status`.
    pub condition: String,
    /// Its last heartbeat; absent when it has none or an unreadable one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// Reference to a remediation template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateReference {
    /// apiVersion of the template, e.g. `infrastructure.cluster.x-k8s.io/v1beta1`.
    #[schemars(transform = crate::crd::template_api_version)]
    pub api_version: String,
    /// Kind of the template; must end in `Template`.
    #[schemars(transform = crate::crd::template_kind)]
    pub kind: String,
    /// Name of the template.
    #[schemars(transform = crate::crd::template_name)]
    pub name: String,
    /// Namespace of the template (NodeHealthCheck only; a MachineHealthCheck uses its own).
    #[schemars(transform = crate::crd::template_namespace)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
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
    #[schemars(transform = crate::crd::status_conditions)]
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

/// The status fields of Vigil's own features, one block flattened into both kinds' statuses so
/// each is declared, documented and built once (the generated CRDs show them as plain fields).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureStatus {
    /// With `spec.dryRun`: the targets that would be remediated now, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_remediate: Vec<WouldRemediate>,
    /// With `spec.backoff`: the remediations started within the window, oldest first (at most
    /// `maxRemediations` per pool and 200 in all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remediation_history: Vec<RemediationRecord>,
    /// With `spec.backoff`: the pools where remediation waits for the window now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backed_off_pools: Vec<BackedOffPool>,
    /// With `spec.failureDomains`: each domain's counts and whether it is paused (at most
    /// 100 domains, paused ones first; see `FailureDomainsHealthy` for the full story).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<crate::failure_domains::FailureDomainStatus>,
    /// How many targets have a matching Node condition set aside as stale (`maxConditionAge`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stale_target_count: i32,
    /// The first of those targets by name (at most 50), with the stale condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_targets: Vec<StaleTarget>,
    /// With `spec.maxInFlight`: the targets waiting for a remediation slot, next first (at most
    /// 100 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<QueuedTarget>,
    /// With `spec.maxInFlight`: how many targets wait for a remediation slot, listed or not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued_count: i32,
    /// With a rule that names its own remediation: each unhealthy target's incident, the rule
    /// that started it and the remediation it gets until it is healthy again, sorted by name
    /// (at most 1000).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen_remediations: Vec<ChosenRemediation>,
}

/// The remediation one unhealthy target gets for its incident and the rule that chose it, so an
/// operator sees why a Node is rebooted rather than replaced (remediation per condition).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChosenRemediation {
    /// The target: Machine name (MachineHealthCheck) or Node name (NodeHealthCheck).
    pub name: String,
    /// The rule that started the incident, by place and condition, e.g.
    /// `spec.unhealthyConditions[1] KernelDeadlock=True` (or the verdict's reason, e.g.
    /// `NodeStartupTimeout`, when no condition rule made the target unhealthy).
    pub rule: String,
    /// The remediation, by where it is written and what it names, e.g.
    /// `spec.unhealthyConditions[1].remediationTemplate (RebootTemplate ns/reboot)` or `owner`.
    pub remediation: String,
    /// When the rule was chosen (the incident's start).
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// For `skip_serializing_if`: a zero count is left out, as an absent list.
pub(crate) fn is_zero(n: &i32) -> bool {
    *n == 0
}
