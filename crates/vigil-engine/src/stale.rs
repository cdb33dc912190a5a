//! The stale-signal guard (`maxConditionAge` on a Node condition rule): a condition is trusted
//! only while its reporter is alive. A condition that matches a rule (type, status and any
//! `reasons`) which sets
//! `maxConditionAge`, and whose `lastHeartbeatTime` is strictly older than `now - maxConditionAge`
//! (or missing, or unreadable), is *stale*: it matches no rule at all — neither its own nor an
//! `Unknown` rule of its type — and the target is judged by its other conditions only. A stale
//! condition is reported (`StaleCondition` notices, `status.staleTargets`), never acted on, so a
//! detector that dies does not leave a fleet looking broken nor remediate it. Done in the engine
//! so the simulator and the controller apply the same rule.

use crate::plan::ONE_NS;
use crate::plan::{Notice, NoticeKind};
use crate::target::Target;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::duration::format_go_duration;
use vigil_api::reason::Reason;
use vigil_api::shared::StaleTarget;
use vigil_api::validate::ConditionRule;
use vigil_api::views::NodeConditionView;

/// How many stale targets a status names (the count is always exact).
pub const LISTED_STALE_TARGETS: usize = 50;

/// A matching condition set aside because its reporter went quiet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    /// `Type=Status` of the condition.
    pub condition: String,
    /// Its last heartbeat, if it has a readable one.
    pub heartbeat: Option<Timestamp>,
    /// The `maxConditionAge` it broke (the smallest of the rules it matches).
    pub max_age: SignedDuration,
}

/// How far a condition can be trusted against the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freshness {
    /// No rule it matches sets `maxConditionAge`: the guard does not apply.
    Unguarded,
    /// Fresh; it turns stale at this instant (the plan wakes then).
    FreshUntil(Timestamp),
    /// Stale: it matches no rule.
    Stale(Stale),
}

/// Whether a Node condition matches a rule: type, status and, when the rule lists reasons, its
/// reason ([`ConditionRule::matches`], the one rule of both kinds).
pub(crate) fn matches(c: &NodeConditionView, rule: &ConditionRule) -> bool {
    rule.matches(&c.type_, &c.status, c.reason.as_deref())
}

/// Judges one condition: the smallest `maxConditionAge` among the rules it matches decides (when
/// rules disagree, the strictest wins: unsure means do nothing). Strictly older than the age is
/// stale, as a timeout is "strictly before now".
pub fn freshness(c: &NodeConditionView, rules: &[ConditionRule], now: Timestamp) -> Freshness {
    let Some(max_age) = rules.iter().filter(|r| matches(c, r)).filter_map(|r| r.max_age).min() else {
        return Freshness::Unguarded;
    };
    let heartbeat = c.last_heartbeat_time;
    let deadline = heartbeat.and_then(|h| h.checked_add(max_age).ok());
    match (heartbeat, deadline) {
        (Some(_), Some(d)) if d >= now => Freshness::FreshUntil(d.checked_add(ONE_NS).unwrap_or(Timestamp::MAX)),
        // A heartbeat so far ahead that adding the age overflows is fresh for ever.
        (Some(h), None) if h > now => Freshness::FreshUntil(Timestamp::MAX),
        _ => Freshness::Stale(Stale { condition: format!("{}={}", c.type_, c.status), heartbeat, max_age }),
    }
}

/// The `StaleCondition` notice for a target that has just turned stale.
pub(crate) fn notice(check: &str, target: Target, what: &str, stale: &Stale, now: Timestamp) -> Notice {
    let age = match stale.heartbeat {
        Some(h) => format!(
            "its last heartbeat was at {h} ({} ago)",
            format_go_duration(SignedDuration::from_secs(now.duration_since(h).as_secs()))
        ),
        None => "it has no readable lastHeartbeatTime".to_string(),
    };
    Notice {
        kind: NoticeKind::StaleCondition,
        target: Some(target),
        reason: Reason::StaleCondition,
        message: format!(
            "{check}: condition {} on {what} is stale: {age}, older than maxConditionAge {}; it is treated as unknown (not unhealthy) until its reporter heartbeats again",
            stale.condition,
            format_go_duration(stale.max_age)
        ),
    }
}

/// The status list: the first [`LISTED_STALE_TARGETS`] targets by name (`stale` is sorted).
pub(crate) fn listed(stale: &[(String, Stale)]) -> Vec<StaleTarget> {
    stale
        .iter()
        .take(LISTED_STALE_TARGETS)
        .map(|(name, s)| StaleTarget {
            name: name.clone(),
            condition: s.condition.clone(),
            last_heartbeat_time: s.heartbeat.map(Time),
        })
        .collect()
}

/// Whether the previous status already listed this target as stale with this condition (a
/// notice is told on the transition only; beyond the listed names it is told when a target
/// enters the list).
pub(crate) fn was_listed(previous: &[StaleTarget], name: &str, s: &Stale) -> bool {
    previous.iter().any(|p| p.name == name && p.condition == s.condition)
}

/// Notices for the listed targets that were not listed before.
pub(crate) fn notices(
    check: &str,
    previous: &[StaleTarget],
    stale: &[(String, Stale)],
    key: impl Fn(&str) -> (Target, String),
    now: Timestamp,
) -> Vec<Notice> {
    stale
        .iter()
        .take(LISTED_STALE_TARGETS)
        .filter(|(name, s)| !was_listed(previous, name, s))
        .map(|(name, s)| {
            let (target, what) = key(name);
            notice(check, target, &what, s, now)
        })
        .collect()
}
