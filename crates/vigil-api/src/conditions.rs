//! Conditions as Vigil reads them from any object (legacy Cluster API conditions and
//! `metav1.Condition` share these fields) and the one rule for writing them: the transition time
//! moves only when the status changes.

use crate::intern::intern;
use crate::reason::Reason;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;
use std::sync::Arc;

/// A condition read from an object, whatever its API form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedCondition {
    /// Condition type (shared, [`crate::intern`]).
    pub type_: Arc<str>,
    /// `True`, `False` or `Unknown` (shared).
    pub status: Arc<str>,
    /// Machine-readable reason (shared).
    pub reason: Option<Arc<str>>,
    /// Human-readable message.
    pub message: Option<String>,
    /// When the status last changed.
    pub last_transition_time: Option<Timestamp>,
}

/// The condition of `type_` in `list`, if any.
pub fn find<'a>(list: &'a [ObservedCondition], type_: &str) -> Option<&'a ObservedCondition> {
    list.iter().find(|c| *c.type_ == *type_)
}

/// Whether `list` has `type_` with status `True`.
pub fn is_true(list: &[ObservedCondition], type_: &str) -> bool {
    find(list, type_).is_some_and(|c| *c.status == ConditionStatus::True)
}

/// Reads a `conditions` array; entries that cannot be read are reported with their path.
pub fn read_list(value: Option<&Value>, path: &str) -> (Vec<ObservedCondition>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let Some(value) = value else { return (out, problems) };
    let Some(items) = value.as_array() else {
        problems.push(format!("{path}: expected a list of conditions"));
        return (out, problems);
    };
    // Cached views keep these lists: exactly as long as the conditions read.
    out.reserve_exact(items.len());
    for (i, item) in items.iter().enumerate() {
        let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
        let (Some(type_), Some(status)) = (text("type"), text("status")) else {
            problems.push(format!("{path}[{i}]: a condition needs type and status"));
            continue;
        };
        let last_transition_time = match item.get("lastTransitionTime") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => match s.parse::<Timestamp>() {
                Ok(t) => Some(t),
                Err(_) => {
                    problems.push(format!("{path}[{i}].lastTransitionTime: invalid value {s:?}: not an RFC 3339 time"));
                    continue;
                }
            },
            Some(other) => {
                problems.push(format!("{path}[{i}].lastTransitionTime: invalid value {other}: not an RFC 3339 time"));
                continue;
            }
        };
        out.push(ObservedCondition {
            type_: intern(&type_),
            status: intern(&status),
            reason: text("reason").map(|r| intern(&r)),
            message: text("message"),
            last_transition_time,
        });
    }
    (out, problems)
}

/// A condition's status: code compares against this type, never against a spelling, so a typo
/// (`"true"`, `"Flase"`) cannot silently never match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl ConditionStatus {
    /// The API spelling, the one place it is written.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// The status an API object spells `s`; `None` for anything else (which matches no status).
    pub fn parse(s: &str) -> Option<Self> {
        [ConditionStatus::True, ConditionStatus::False, ConditionStatus::Unknown].into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<ConditionStatus> for str {
    fn eq(&self, other: &ConditionStatus) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<ConditionStatus> for Arc<str> {
    fn eq(&self, other: &ConditionStatus) -> bool {
        **self == *other.as_str()
    }
}

impl PartialEq<ConditionStatus> for &str {
    fn eq(&self, other: &ConditionStatus) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<ConditionStatus> for String {
    fn eq(&self, other: &ConditionStatus) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<str> for ConditionStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ConditionStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ConditionStatus {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

/// A condition Vigil wants an object to carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type.
    pub type_: String,
    /// Its status.
    pub status: ConditionStatus,
    /// Machine-readable reason.
    pub reason: Reason,
    /// Human-readable message.
    pub message: String,
}

/// `HealthCheckSucceeded=True` as Vigil writes it on a healthy Machine: what a Machine that
/// needs no write already says ([`crate::views::MachineView::says_healthy`]).
pub fn health_check_succeeded() -> DesiredCondition {
    DesiredCondition::true_(crate::well_known::HEALTH_CHECK_SUCCEEDED, Reason::HealthCheckSucceeded, "")
}

impl DesiredCondition {
    /// A condition with status `True`.
    pub fn true_(type_: &str, reason: Reason, message: impl Into<String>) -> Self {
        Self { type_: type_.into(), status: ConditionStatus::True, reason, message: message.into() }
    }

    /// A condition with status `False`.
    pub fn false_(type_: &str, reason: Reason, message: impl Into<String>) -> Self {
        Self { type_: type_.into(), status: ConditionStatus::False, reason, message: message.into() }
    }

    /// Whether `current` already says the same (so nothing needs writing).
    pub fn is_satisfied_by(&self, current: Option<&ObservedCondition>) -> bool {
        current.is_some_and(|c| {
            c.status == self.status
                && c.reason.as_deref().unwrap_or("") == self.reason.as_str()
                && c.message.as_deref().unwrap_or("") == self.message
        })
    }

    /// The transition time to write: kept while the status is unchanged, else `now`.
    pub fn transition_time(&self, current: Option<&ObservedCondition>, now: Timestamp) -> Timestamp {
        match current {
            Some(c) if c.status == self.status => c.last_transition_time.unwrap_or(now),
            _ => now,
        }
    }
}

/// Sets `desired` in a `metav1.Condition` list (Vigil's own status), keeping the transition time
/// while the status is unchanged and the list sorted by type.
pub fn set_condition(
    list: &mut Vec<Condition>,
    desired: &DesiredCondition,
    now: Timestamp,
    observed_generation: Option<i64>,
) {
    let current = list.iter().position(|c| c.type_ == desired.type_);
    let last_transition_time = match current {
        Some(i) if list[i].status == desired.status => list[i].last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: desired.type_.clone(),
        status: desired.status.as_str().to_string(),
        reason: desired.reason.as_str().to_string(),
        message: desired.message.clone(),
        last_transition_time,
        observed_generation,
    };
    match current {
        Some(i) => list[i] = condition,
        None => {
            list.push(condition);
            list.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
    }
}

/// Removes the condition of `type_` from a `metav1.Condition` list.
pub fn remove_condition(list: &mut Vec<Condition>, type_: &str) {
    list.retain(|c| c.type_ != type_);
}

/// The condition of `type_` in a `metav1.Condition` list.
pub fn get_condition<'a>(list: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    list.iter().find(|c| *c.type_ == *type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let mut list = Vec::new();
        let t0 = ts("2030-01-01T00:00:00Z");
        let t1 = ts("2030-01-01T00:05:00Z");
        set_condition(&mut list, &DesiredCondition::false_("Paused", Reason::NotPaused, "a"), t0, None);
        set_condition(&mut list, &DesiredCondition::false_("Paused", Reason::NotPaused, "b"), t1, None);
        assert_eq!(list[0].last_transition_time, Time(t0));
        assert_eq!(list[0].message, "b");
        set_condition(&mut list, &DesiredCondition::true_("Paused", Reason::Paused, "c"), t1, None);
        assert_eq!(list[0].last_transition_time, Time(t1));
    }

    #[test]
    fn reads_conditions_and_reports_bad_ones() {
        let v = serde_json::json!([
            {"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z"},
            {"type": "Bad", "status": "True", "lastTransitionTime": "yesterday"},
            {"status": "True"}
        ]);
        let (list, problems) = read_list(Some(&v), "status.conditions");
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, Some(ts("2030-01-01T00:00:00Z")));
        assert_eq!(
            problems,
            [
                "status.conditions[1].lastTransitionTime: invalid value \"yesterday\": not an RFC 3339 time",
                "status.conditions[2]: a condition needs type and status",
            ]
        );
    }
}
