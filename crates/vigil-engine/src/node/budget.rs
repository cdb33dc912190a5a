//! The check-wide short-circuit: `minHealthy` / `maxUnhealthy` (a percentage rounds up, as
//! medik8s) and the storm cool-down, as the `RemediationAllowed` condition.

use crate::disruptions::Disrupted;
use crate::plan::Earliest;
use crate::plan::after;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{DesiredCondition, get_condition};
use vigil_api::duration::format_go_duration;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::threshold::Rounding;
use vigil_api::validate::{NhcPolicy, NhcThreshold};
use vigil_api::well_known::REMEDIATION_ALLOWED;

/// What the threshold and storm cooldown say.
pub(super) enum Allowance {
    Allowed,
    TooFewHealthy,
    Cooldown { start: Timestamp, end: Option<Timestamp> },
}

pub(super) fn threshold_text(t: NhcThreshold, observed: usize) -> String {
    match t {
        NhcThreshold::MinHealthy(v) => format!("minHealthy {v} (needs {} healthy)", v.scaled(observed, Rounding::Up)),
        NhcThreshold::MaxUnhealthy(v) => {
            format!("maxUnhealthy {v} (allows {} unhealthy)", v.scaled(observed, Rounding::Up))
        }
    }
}

/// Whether `healthy` of `observed` Nodes meet the check's threshold (remediation allowed); public
/// so a picture of a run can draw the threshold with this one rule.
pub fn threshold_met(t: NhcThreshold, observed: usize, healthy: usize) -> bool {
    match t {
        NhcThreshold::MinHealthy(v) => healthy as u64 >= v.scaled(observed, Rounding::Up),
        // medik8s rounds a maxUnhealthy percentage up (75% of 10 allows 8), unlike Cluster API
        NhcThreshold::MaxUnhealthy(v) => (observed - healthy) as u64 <= v.scaled(observed, Rounding::Up),
    }
}

/// Budget: whether the threshold lets remediation start (`RemediationAllowed`), held back by a
/// storm cool-down after it was not met; offers the cool-down's end and returns its start. The
/// healthy Nodes taken down on purpose (`disrupted`, when they count) are not available.
pub(super) fn budget(
    policy: &NhcPolicy,
    prev: &NodeHealthCheckStatus,
    observed: usize,
    (healthy, disrupted): (usize, &Disrupted),
    now: Timestamp,
    wake: &mut Earliest,
) -> (DesiredCondition, Option<Timestamp>) {
    let available = healthy.saturating_sub(disrupted.total());
    let met = threshold_met(policy.threshold, observed, available);
    let leaving = if disrupted.total() > 0 { format!(", leaving {available} available") } else { String::new() };
    let counts = format!(
        "{observed} nodes observed, {healthy} healthy, {} not healthy{}{leaving}; {}",
        observed - healthy,
        disrupted.phrase(),
        threshold_text(policy.threshold, observed)
    );
    let prev_allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED);
    let gate = if !met {
        Allowance::TooFewHealthy
    } else if !policy.storm_cooldown.is_positive() {
        Allowance::Allowed
    } else {
        match &prev.storm_recovery_start_time {
            Some(Time(start)) => match after(*start, policy.storm_cooldown) {
                Some(end) if now >= end => Allowance::Allowed,
                end => Allowance::Cooldown { start: *start, end },
            },
            None if prev_allowed.is_some_and(|c| {
                c.status == ConditionStatus::False
                    && (c.reason == Reason::TooFewHealthy || c.reason == Reason::StormCooldown)
            }) =>
            {
                Allowance::Cooldown { start: now, end: after(now, policy.storm_cooldown) }
            }
            None => Allowance::Allowed,
        }
    };
    match gate {
        Allowance::Allowed => (DesiredCondition::true_(REMEDIATION_ALLOWED, Reason::RemediationAllowed, counts), None),
        Allowance::TooFewHealthy => {
            (DesiredCondition::false_(REMEDIATION_ALLOWED, Reason::TooFewHealthy, counts), None)
        }
        Allowance::Cooldown { start, end } => {
            if let Some(end) = end {
                wake.offer(end);
            }
            let until = end.map_or_else(|| "the end of time".to_string(), |e| e.to_string());
            let message = format!(
                "{counts}; the threshold is met again, but the storm cooldown of {} that started at {start} lasts until {until}",
                format_go_duration(policy.storm_cooldown)
            );
            (DesiredCondition::false_(REMEDIATION_ALLOWED, Reason::StormCooldown, message), Some(start))
        }
    }
}
