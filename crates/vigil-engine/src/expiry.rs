//! When a target's unhealthy condition ran past its timeout: the instant the verdict became due,
//! which the controller's detection-latency metric measures from. The same matching as the
//! decisions: a condition matches a rule by type, status and any `reasons`, and a stale one (its rule sets
//! `maxConditionAge` and its reporter went quiet, see [`crate::stale`]) matches nothing.

use crate::stale::{Freshness, freshness};
use jiff::Timestamp;
use vigil_api::validate::ConditionRule;
use vigil_api::views::{NodeConditionView, NodeView};

/// When a Node's matching unhealthy condition ran past its timeout (the earliest such instant at
/// or before `now`): `None` when none did (the verdict came from something else, e.g. a deleted
/// Node or `nodeStartupTimeout`, or the only match is stale).
pub fn expiry(rules: &[ConditionRule], node: &NodeView, now: Timestamp) -> Option<Timestamp> {
    let conditions = &node.conditions[..];
    conditions
        .iter()
        .filter(|c| !matches!(freshness(c, rules, now), Freshness::Stale(_)))
        .flat_map(|c| rules.iter().filter_map(move |r| ran_out(c, r)))
        .filter(|d| *d <= now)
        .min()
}

/// When `c` ran past `rule`'s timeout, if it matches the rule and has a transition time.
fn ran_out(c: &NodeConditionView, rule: &ConditionRule) -> Option<Timestamp> {
    if !crate::stale::matches(c, rule) {
        return None;
    }
    c.last_transition_time.and_then(|t| t.checked_add(rule.timeout).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    /// Type, status, last transition, last heartbeat.
    type Cond<'a> = (&'a str, &'a str, Option<Timestamp>, Option<Timestamp>);

    fn node(conditions: &[Cond<'_>]) -> NodeView {
        let conditions = conditions.iter().map(|(t, s, at, beat)| NodeConditionView::new(t, s, None, *at, *beat));
        NodeView { conditions: conditions.collect(), ..Default::default() }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    #[test]
    fn expiry_is_when_the_first_matching_timeout_ran_out() {
        let now = at("2030-01-01T00:10:00Z");
        let rule = |t: &str, s: &str, secs, max_age: Option<i64>| ConditionRule {
            type_: t.into(),
            status: s.into(),
            timeout: SignedDuration::from_secs(secs),
            max_age: max_age.map(SignedDuration::from_secs),
            ..ConditionRule::default()
        };
        let rules = [
            rule("Ready", "False", 300, None),
            rule("Ready", "Unknown", 60, None),
            rule("DiskPressure", "True", 30, None),
            rule("MemoryPressure", "True", 30, Some(120)),
        ];
        let since = Some(at("2030-01-01T00:02:00Z"));
        let cases: [(Vec<Cond<'_>>, Option<Timestamp>); 7] = [
            (vec![("Ready", "False", since, None)], Some(at("2030-01-01T00:07:00Z"))),
            (vec![("Ready", "Unknown", since, None)], Some(at("2030-01-01T00:03:00Z"))),
            (
                vec![("Ready", "False", since, None), ("DiskPressure", "True", since, None)],
                Some(at("2030-01-01T00:02:30Z")),
            ),
            (vec![("Ready", "False", Some(at("2030-01-01T00:09:00Z")), None)], None),
            (vec![("Ready", "False", None, None), ("Ready", "True", since, None)], None),
            // A guarded condition whose reporter still beats counts ...
            (
                vec![("MemoryPressure", "True", since, Some(at("2030-01-01T00:09:00Z")))],
                Some(at("2030-01-01T00:02:30Z")),
            ),
            // ... a stale one matches nothing, as the decisions judge it.
            (
                vec![
                    ("Ready", "False", since, None),
                    ("MemoryPressure", "True", since, Some(at("2030-01-01T00:05:00Z"))),
                ],
                Some(at("2030-01-01T00:07:00Z")),
            ),
        ];
        for (conditions, want) in cases {
            assert_eq!(expiry(&rules, &node(&conditions), now), want, "{conditions:?}");
        }
        // A reason-aware rule: only a condition with a listed reason ran out.
        let disk = ConditionRule { reasons: Some(vec!["DiskFailing".into()]), ..rule("DiskProblem", "True", 30, None) };
        let with_reason = |reason: &str| {
            let mut n = node(&[("DiskProblem", "True", since, None)]);
            n.conditions[0].reason = Some(reason.into());
            n
        };
        let rules = [disk];
        assert_eq!(expiry(&rules, &with_reason("DiskFailing"), now), Some(at("2030-01-01T00:02:30Z")));
        assert_eq!(expiry(&rules, &with_reason("DiskFull"), now), None, "an unlisted reason matches nothing");
    }
}
