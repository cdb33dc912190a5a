//! The status block of Vigil's own features (dry-run, back-off, failure domains, the stale-signal
//! guard, pacing, remediation per rule, voluntary disruptions, flapping, expressions), built once
//! for both kinds: each decision hands over what the features found and gets the block its
//! status carries (`vigil_api::shared::FeatureStatus`, flattened into both statuses). Dry-run's
//! list is filled afterwards by [`crate::dry_run`], which needs the finished plan.

use crate::stale::Stale;
use vigil_api::failure_domains::FailureDomainStatus;
use vigil_api::shared::{
    BackedOffPool, ChosenRemediation, DisruptionCount, ExpressionMatch, FeatureStatus, FlappingTarget, QueuedTarget,
    RemediationRecord, UnevaluatedExpression,
};

/// What the features found in one decision.
pub(crate) struct Found<'a> {
    /// The back-off's history and backed-off pools ([`crate::backoff::Ledger::finish`]).
    pub(crate) backoff: (Vec<RemediationRecord>, Vec<BackedOffPool>),
    /// The failure-domain status list (empty without `spec.failureDomains`).
    pub(crate) failure_domains: Vec<FailureDomainStatus>,
    /// The targets with a matching condition set aside as stale, by name.
    pub(crate) stale: &'a [(String, Stale)],
    /// With remediation per condition: each unhealthy target's chosen remediation, by name.
    pub(crate) chosen: Vec<ChosenRemediation>,
    /// The targets waiting for a remediation slot (the listed ones) and how many wait
    /// ([`crate::pacing::PacingReport`]).
    pub(crate) queue: (Vec<QueuedTarget>, i32),
    /// With `voluntaryDisruptions: Count`: the targets each signal took out of the budget.
    pub(crate) disruptions: Vec<DisruptionCount>,
    /// With `spec.flapping`: each target's episodes ([`crate::flapping`]).
    pub(crate) flapping: Vec<FlappingTarget>,
    /// With `spec.unhealthyExpressions`: the expressions' clock and the targets one could not be
    /// evaluated for ([`crate::expressions`]).
    pub(crate) expressions: (Vec<ExpressionMatch>, Vec<UnevaluatedExpression>),
}

/// The feature block of a status.
pub(crate) fn status(found: Found<'_>) -> FeatureStatus {
    let (remediation_history, backed_off_pools) = found.backoff;
    let (queued, queued_count) = found.queue;
    FeatureStatus {
        would_remediate: Vec::new(),
        remediation_history,
        backed_off_pools,
        failure_domains: found.failure_domains,
        stale_target_count: i32::try_from(found.stale.len()).unwrap_or(i32::MAX),
        stale_targets: crate::stale::listed(found.stale),
        chosen_remediations: crate::chosen::listed(found.chosen),
        queued,
        queued_count,
        disruptions: found.disruptions,
        flapping: found.flapping,
        expression_matches: found.expressions.0,
        unevaluated_expressions: found.expressions.1,
    }
}
