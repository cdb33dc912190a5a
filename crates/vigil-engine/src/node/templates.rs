//! Whether each step's template can be used, and the `Disabled` condition that says why not.

use super::input::NhcInput;
use serde_json::Value;
use vigil_api::conditions::{DesiredCondition, get_condition};
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::views::TemplateView;
use vigil_api::well_known::DISABLED;

/// Whether a step's template can be used to make remediation objects.
#[derive(Clone, Copy)]
pub(super) enum Usable<'a> {
    /// Found, with the `spec` to copy into objects.
    Yes(&'a TemplateView, &'a Value),
    /// Not found.
    Missing,
    /// Found but without `spec.template` / `spec.template.spec`.
    Invalid(&'static str),
}

pub(super) fn usable<'a>(templates: &[Option<&'a TemplateView>], i: usize) -> Usable<'a> {
    match templates.get(i).copied().flatten() {
        None => Usable::Missing,
        Some(view) => match view.template.as_ref() {
            None => Usable::Invalid("has no spec.template"),
            Some(t) => match t.get("spec") {
                Some(spec) if spec.is_object() => Usable::Yes(view, spec),
                _ => Usable::Invalid("has no spec.template.spec"),
            },
        },
    }
}

/// The templates of the steps, and the `Disabled` condition they make.
pub(super) struct Templates<'a> {
    pub(super) usable: Vec<Usable<'a>>,
    pub(super) disabled: Option<(Reason, String)>,
    pub(super) disabled_condition: DesiredCondition,
    pub(super) disabled_changed: bool,
}

/// Templates: the check is Disabled while any step's template is missing or invalid, its own or
/// a rule's (`templates` follows [`vigil_api::validate::NhcPolicy::all_steps`]; a template used
/// twice is said once).
pub(super) fn template_state<'a>(input: &NhcInput<'a>, prev: &NodeHealthCheckStatus) -> Templates<'a> {
    let policy = input.policy;
    let templates: Vec<Usable<'_>> = (0..policy.all_steps().count()).map(|i| usable(input.templates, i)).collect();
    let mut missing: Vec<String> = Vec::new();
    let mut invalid: Vec<String> = Vec::new();
    for (step, state) in policy.all_steps().zip(&templates) {
        let (list, text) = match state {
            Usable::Yes(..) => continue,
            Usable::Missing => (&mut missing, format!("remediation template {} not found", step.template)),
            Usable::Invalid(why) => (&mut invalid, format!("remediation template {} {why}", step.template)),
        };
        if !list.contains(&text) {
            list.push(text);
        }
    }
    let disabled = if missing.is_empty() && invalid.is_empty() {
        None
    } else {
        let reason =
            if missing.is_empty() { Reason::RemediationTemplateInvalid } else { Reason::RemediationTemplateNotFound };
        missing.extend(invalid);
        Some((reason, missing.join("; ")))
    };
    let disabled_condition = match &disabled {
        Some((reason, message)) => DesiredCondition::true_(DISABLED, reason.clone(), message.clone()),
        None => {
            DesiredCondition::false_(DISABLED, Reason::Enabled, "All remediation templates were found and are valid")
        }
    };
    let disabled_changed = get_condition(&prev.conditions, DISABLED).is_none_or(|c| {
        c.status != disabled_condition.status
            || c.reason != disabled_condition.reason
            || c.message != disabled_condition.message
    });

    Templates { usable: templates, disabled, disabled_condition, disabled_changed }
}
