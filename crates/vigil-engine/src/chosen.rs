//! Remediation per condition: the rule that started a target's incident, and so the remediation
//! the target gets, kept until the target is healthy again — the same for both kinds.
//!
//! When several rules match at once, the first in spec order wins (a MachineHealthCheck reads its
//! Machine condition rules before its Node condition rules, as its verdict does). Once chosen, a
//! rule is kept for the incident even when another rule starts matching or the first stops:
//! switching would start a second remediation on a target that already has one, or report one
//! remediation while another runs. The choice is recorded where it survives a restart:
//! - on every remediation object made for the incident (the [`RULE_ANNOTATION`] annotation), which
//!   exists as long as the remediation does, so neither a restart nor a lost status write can
//!   switch a remediation that started;
//! - in the check's status (`status.chosenRemediations`), which also covers an incident whose
//!   remediation has not started yet (the short-circuit holds it, say).
//!
//! A record names its rule by place and what it matches ([`RuleRef::label`]: the condition, or the
//! expression's source); when the spec was edited so that no rule has that place and match any
//! more, the rule is chosen anew.

use crate::plan::{Notice, NoticeKind};
use crate::target::Target;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::reason::Reason;
use vigil_api::shared::ChosenRemediation;
use vigil_api::validate::RuleRef;

pub use vigil_api::well_known::RULE_ANNOTATION;

/// How many targets `status.chosenRemediations` lists (by name), so the status stays writable in a
/// storm; a target beyond it has its choice on its remediation object once remediation starts.
pub const LISTED_CHOSEN: usize = 1000;

/// The rule (and so the remediation) one target's incident uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The rule, as an index into the rules in spec order; `None` when no condition rule made the
    /// target unhealthy (a MachineHealthCheck's `nodeStartupTimeout`, say): the check's own.
    pub rule: Option<usize>,
    /// How status, events and objects name it ([`RuleRef::label`], or the verdict's reason).
    pub label: String,
}

/// The incident's choice: the first recorded label (`recorded`, strongest first) that still names
/// a rule of `rules` (or one of the `fixed` verdict reasons no rule makes), else the current
/// verdict's rule (`now`, an index into `rules`) or, without one, its reason `now_reason`.
pub fn choose<'r>(
    recorded: &[Option<&str>],
    rules: impl Iterator<Item = RuleRef<'r>> + Clone,
    fixed: &[Reason],
    now: Option<usize>,
    now_reason: &str,
) -> Choice {
    for label in recorded.iter().flatten() {
        if let Some(i) = rules.clone().position(|r| r.label() == *label) {
            return Choice { rule: Some(i), label: label.to_string() };
        }
        if fixed.iter().any(|f| f.as_str() == *label) {
            return Choice { rule: None, label: label.to_string() };
        }
    }
    match now.and_then(|i| rules.clone().nth(i)) {
        Some(rule) => Choice { rule: now, label: rule.label() },
        None => Choice { rule: None, label: now_reason.to_string() },
    }
}

/// The previous status' entry of target `name` (Vigil writes the list sorted by name).
pub fn previous<'p>(list: &'p [ChosenRemediation], name: &str) -> Option<&'p ChosenRemediation> {
    match list.binary_search_by(|e| e.name.as_str().cmp(name)) {
        Ok(i) => Some(&list[i]),
        Err(_) => list.iter().find(|e| e.name == name),
    }
}

/// Target `name`'s status entry for `choice` with `remediation` (as [`vigil_api::validate::describe_remediation`]
/// words it), and the `RemediationChosen` notice when the choice is news (`what` names the target
/// for a person, `target` as notices do).
pub fn record(
    name: &str,
    target: Target,
    what: &str,
    choice: &Choice,
    remediation: String,
    previous: Option<&ChosenRemediation>,
    now: Timestamp,
) -> (ChosenRemediation, Option<Notice>) {
    let same = previous.filter(|p| p.rule == choice.label);
    let notice = same.is_none().then(|| Notice {
        kind: NoticeKind::RemediationChosen,
        target: Some(target),
        reason: Reason::RemediationChosen,
        message: format!(
            "{what}: rule {} started this incident; it is remediated by {remediation} until it is healthy again",
            choice.label
        ),
    });
    let since = same.map_or(Time(now), |p| p.since.clone());
    (ChosenRemediation { name: name.to_string(), rule: choice.label.clone(), remediation, since }, notice)
}

/// The entry of target `name` whose incident goes on without a verdict that chooses (pending,
/// recovering): the previous one, else one rebuilt from its object's `annotated` rule when that
/// still names one of `rules` (`remediation` words that rule's remediation), so a lost status
/// is reported again; nothing is told.
pub fn kept<'r>(
    name: &str,
    previous: Option<&ChosenRemediation>,
    annotated: Option<&str>,
    mut rules: impl Iterator<Item = RuleRef<'r>>,
    remediation: impl FnOnce(usize) -> String,
    now: Timestamp,
) -> Option<ChosenRemediation> {
    if let Some(p) = previous {
        return Some(p.clone());
    }
    let label = annotated?;
    let i = rules.position(|r| r.label() == label)?;
    Some(ChosenRemediation {
        name: name.to_string(),
        rule: label.to_string(),
        remediation: remediation(i),
        since: Time(now),
    })
}

/// The status list: the first [`LISTED_CHOSEN`] entries by name.
pub fn listed(mut entries: Vec<ChosenRemediation>) -> Vec<ChosenRemediation> {
    if !entries.is_sorted_by(|a, b| a.name <= b.name) {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
    }
    entries.truncate(LISTED_CHOSEN);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;
    use vigil_api::validate::ConditionRule;

    fn rule(path: &str, type_: &str) -> ConditionRule {
        ConditionRule {
            type_: type_.into(),
            status: "True".into(),
            timeout: SignedDuration::from_secs(60),
            path: path.into(),
            ..ConditionRule::default()
        }
    }

    #[test]
    fn a_record_wins_while_it_names_a_rule_of_the_spec_and_else_the_verdict_decides() {
        let rules = [rule("spec.unhealthyConditions[0]", "A"), rule("spec.unhealthyConditions[1]", "B")];
        let fixed = [Reason::NodeStartupTimeout];
        let b = "spec.unhealthyConditions[1] B=True";
        // (recorded labels, the verdict's rule, expected rule and label)
        type Row<'a> = (&'a [Option<&'a str>], Option<usize>, Option<usize>, &'a str);
        let cases: [Row<'_>; 6] = [
            (&[None, None], Some(0), Some(0), "spec.unhealthyConditions[0] A=True"),
            (&[Some(b), None], Some(0), Some(1), b),
            (&[None, Some(b)], Some(0), Some(1), b),
            // a rule moved by an edit (same place, other condition) is not the recorded one
            (&[Some("spec.unhealthyConditions[1] C=True")], Some(0), Some(0), "spec.unhealthyConditions[0] A=True"),
            (&[Some("NodeStartupTimeout")], Some(1), None, "NodeStartupTimeout"),
            (&[None], None, None, "NodeDeleted"),
        ];
        for (recorded, now, rule, label) in cases {
            let got = choose(recorded, rules.iter().map(RuleRef::Condition), &fixed, now, "NodeDeleted");
            assert_eq!(got, Choice { rule, label: label.to_string() }, "{recorded:?} {now:?}");
        }
    }

    #[test]
    fn a_choice_is_news_once_and_keeps_its_start() {
        let choice = Choice { rule: Some(1), label: "spec.unhealthyConditions[1] B=True".into() };
        let t0: Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let t1: Timestamp = "2030-01-01T00:05:00Z".parse().expect("time");
        let (first, notice) = record("n1", Target::local_node("n1"), "Node n1", &choice, "owner".into(), None, t0);
        assert_eq!(notice.map(|n| n.kind), Some(NoticeKind::RemediationChosen));
        let (again, notice) =
            record("n1", Target::local_node("n1"), "Node n1", &choice, "owner".into(), Some(&first), t1);
        assert!(notice.is_none());
        assert_eq!(again.since, Time(t0));
    }
}
