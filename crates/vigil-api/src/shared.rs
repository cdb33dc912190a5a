//! The types both health-check kinds share: remediation templates, the back-off spec and the
//! status of Vigil's own features (flattened into both statuses), declared once so the two
//! kinds cannot drift apart.

use crate::failure_domains::FailureDomains;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.backoff`: how many remediations one pool may start within a window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationBackoff {
    /// Most remediations started in one pool within `window` (1 to 100); the next one waits.
    #[schemars(transform = crate::schema::max_remediations)]
    pub max_remediations: i32,
    /// How far back remediations count, a Go duration greater than zero, e.g. `30m`.
    #[schemars(transform = crate::schema::backoff_window)]
    pub window: String,
    /// NodeHealthCheck only (required there): the Node label whose value names a Node's pool,
    /// e.g. `karpenter.sh/nodepool`; a Node without it is a pool of its own.
    #[schemars(transform = crate::schema::pool_label)]
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
    pub started: Time,
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
    pub resumes_at: Time,
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
    pub unhealthy_since: Time,
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
    pub since: Time,
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
    pub last_heartbeat_time: Option<Time>,
}

/// Reference to a remediation template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateReference {
    /// apiVersion of the template, e.g. `infrastructure.cluster.x-k8s.io/v1beta1`.
    #[schemars(transform = crate::schema::template_api_version)]
    pub api_version: String,
    /// Kind of the template; must end in `Template`.
    #[schemars(transform = crate::schema::template_kind)]
    pub kind: String,
    /// Name of the template.
    #[schemars(transform = crate::schema::template_name)]
    pub name: String,
    /// Namespace of the template (NodeHealthCheck only; a MachineHealthCheck uses its own).
    #[schemars(transform = crate::schema::template_namespace)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
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
    /// With `spec.voluntaryDisruptions: Count`: how many targets each disruption signal took out
    /// of the budget (a target counts once, under its first signal), by signal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disruptions: Vec<DisruptionCount>,
    /// With `spec.flapping`: each target's episodes on Vigil's own clock, by name (at most 1000
    /// targets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flapping: Vec<FlappingTarget>,
    /// With `spec.unhealthyExpressions`: since when Vigil has seen each expression hold for each
    /// target (its own clock: an expression has no `lastTransitionTime`), at most 1000 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expression_matches: Vec<ExpressionMatch>,
    /// With `spec.unhealthyExpressions`: the targets an expression could not be evaluated for,
    /// and why (no decision is made for them by it; they are not counted healthy), at most 1000.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unevaluated_expressions: Vec<UnevaluatedExpression>,
}

/// An expression that could not be evaluated for a target, so the status says why the target
/// has no verdict.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnevaluatedExpression {
    /// The target: a Node name (NodeHealthCheck) or a Machine name (MachineHealthCheck).
    pub name: String,
    /// Which expression: its index in `spec.unhealthyExpressions`.
    pub expression: i32,
    /// Why, as the evaluator said it.
    pub message: String,
}

/// Since when Vigil has seen one expression hold for one target, so a restart or another replica
/// keeps the same clock.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExpressionMatch {
    /// The target: a Node name (NodeHealthCheck) or a Machine name (MachineHealthCheck).
    pub name: String,
    /// Which expression: its index in `spec.unhealthyExpressions`.
    pub expression: i32,
    /// When a decision first saw it hold (whole seconds, rounded down).
    pub since: Time,
}

/// `spec.flapping`: a target whose conditions match and clear again `episodes` times within
/// `window` counts as unhealthy, however short each episode was.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Flapping {
    /// How many episodes within `window` make a target flapping (2 to 20).
    pub episodes: i32,
    /// How far back episodes count, a Go duration from 1m to 24h, not shorter than the longest
    /// rule `duration`.
    #[schemars(transform = crate::schema::flapping_window)]
    pub window: String,
}

/// One target's episodes on Vigil's own clock (`status.flapping`), so a restart or another
/// replica counts the same flaps.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlappingTarget {
    /// The target: a Node name (NodeHealthCheck) or a Machine name (MachineHealthCheck).
    pub name: String,
    /// Its episodes, oldest first: those that ended within the window and the open one.
    pub episodes: Vec<FlapEpisode>,
}

/// One episode: from when Vigil first saw a rule match the target to when it first saw none
/// match (absent while it goes on).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlapEpisode {
    /// When Vigil first saw a rule match.
    pub start: Time,
    /// When Vigil first saw no rule match again; absent while the episode goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Time>,
}

/// How many of a check's targets one voluntary-disruption signal took out of the budget, so an
/// operator sees why remediation waits while every target looks healthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionCount {
    /// The signal: `Deleting`, `ClusterAutoscaler`, `Karpenter`, `Kured` or `NodeMaintenance`.
    pub signal: String,
    /// How many targets it took out of the budget.
    pub targets: i32,
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
    pub since: Time,
}

/// For `skip_serializing_if`: a zero count is left out, as an absent list.
pub(crate) fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The spec fields of Vigil's own features (`dryRun`, `backoff`, `failureDomains`,
/// `maxInFlight`, `voluntaryDisruptions`), as either kind writes them, so one validator reads both.
///
/// The fields are declared in each spec rather than in one `#[serde(flatten)]` struct: a
/// flattened struct hides unknown fields from the typo check of
/// [`crate::manifest::health_check_from_value`] (serde-ignored cannot see into it), and a typo
/// there would silently leave a feature off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeatureSpec<'a> {
    /// `dryRun`.
    pub dry_run: bool,
    /// `backoff`.
    pub backoff: Option<&'a RemediationBackoff>,
    /// `failureDomains`.
    pub failure_domains: Option<&'a FailureDomains>,
    /// `maxInFlight`.
    pub max_in_flight: Option<&'a IntOrString>,
    /// `voluntaryDisruptions`.
    pub voluntary_disruptions: Option<&'a str>,
}
