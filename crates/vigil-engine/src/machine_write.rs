//! How Vigil's Machine conditions are stored in each Cluster API form. A `v1beta2` Machine keeps
//! `metav1.Condition`s in `status.conditions` and the legacy ones in
//! `status.deprecated.v1beta1.conditions`; a `v1beta1` Machine keeps legacy ones in
//! `status.conditions` and new ones in `status.v1beta2.conditions`. Cluster API controllers of
//! either generation read the form they know, so both are written.
//!
//! The result is a JSON merge patch for the status subresource carrying the object's
//! `resourceVersion`, so a concurrent writer makes the patch fail with a conflict instead of
//! being overwritten. The simulator applies the same patch to its in-memory objects.

use jiff::Timestamp;
use serde_json::{Map, Value, json};
use vigil_api::conditions::{ConditionStatus, DesiredCondition};
use vigil_api::reason::Reason;
use vigil_api::views::CapiVersion;
use vigil_api::well_known::{EXTERNALLY_REMEDIATED, HEALTH_CHECK_SUCCEEDED, OWNER_REMEDIATED};

/// The legacy (`v1beta1`) type and reason for a condition Vigil writes, or `None` when upstream
/// writes no legacy counterpart (e.g. `ExternallyRemediated=False/WaitingForRemediation`).
pub fn legacy_form(c: &DesiredCondition) -> Option<(&'static str, &'static str)> {
    // v1beta1 spells some reasons differently; these legacy words exist only here.
    let legacy = |r: &Reason| -> &'static str {
        match r {
            Reason::NodeDeleted => "NodeNotFound",
            Reason::HasRemediateAnnotation => "HasRemediateMachineAnnotation",
            Reason::UnhealthyNode => Reason::UnhealthyNode.as_str(),
            Reason::UnhealthyMachine => Reason::UnhealthyMachine.as_str(),
            Reason::NodeStartupTimeout => Reason::NodeStartupTimeout.as_str(),
            Reason::MachineHasFailure => Reason::MachineHasFailure.as_str(),
            Reason::WaitingForRemediation => Reason::WaitingForRemediation.as_str(),
            _ => "",
        }
    };
    match (c.type_.as_str(), &c.reason) {
        (HEALTH_CHECK_SUCCEEDED, r) => {
            Some((HEALTH_CHECK_SUCCEEDED, if c.status == ConditionStatus::True { "" } else { legacy(r) }))
        }
        (OWNER_REMEDIATED, r) => Some((OWNER_REMEDIATED, legacy(r))),
        (EXTERNALLY_REMEDIATED, Reason::RemediationTemplateNotFound) => {
            Some(("ExternalRemediationTemplateAvailable", "ExternalRemediationTemplateNotFound"))
        }
        (EXTERNALLY_REMEDIATED, Reason::RemediationRequestCreationFailed) => {
            Some(("ExternalRemediationRequestAvailable", "ExternalRemediationRequestCreationFailed"))
        }
        _ => None,
    }
}

fn metav1_condition(c: &DesiredCondition, at: Timestamp, observed_generation: Option<i64>) -> Value {
    let mut v = json!({
        "type": c.type_, "status": c.status.as_str(), "reason": c.reason.as_str(), "message": c.message,
        "lastTransitionTime": at.to_string(),
    });
    if let Some(g) = observed_generation {
        v["observedGeneration"] = json!(g);
    }
    v
}

fn legacy_condition(type_: &str, reason: &str, c: &DesiredCondition, at: Timestamp) -> Value {
    let mut v = json!({"type": type_, "status": c.status.as_str(), "lastTransitionTime": at.to_string()});
    if c.status != ConditionStatus::True {
        v["severity"] = json!("Warning");
        v["reason"] = json!(reason);
        if !c.message.is_empty() {
            v["message"] = json!(c.message);
        }
    }
    v
}

/// Replaces (or adds) conditions by type in a conditions array, keeping the others as they are.
fn merge_into(list: Option<&Value>, updates: &[(String, Value)]) -> Value {
    let mut out: Vec<Value> = list.and_then(Value::as_array).cloned().unwrap_or_default();
    for (type_, condition) in updates {
        match out.iter_mut().find(|c| c.get("type").and_then(Value::as_str) == Some(type_)) {
            Some(slot) => *slot = condition.clone(),
            None => out.push(condition.clone()),
        }
    }
    Value::Array(out)
}

/// The merge patch that sets `conditions` on `machine` (its current JSON) in both forms.
pub fn machine_status_patch(
    machine: &Value,
    version: CapiVersion,
    conditions: &[(DesiredCondition, Timestamp)],
) -> Value {
    let generation = machine.pointer("/metadata/generation").and_then(Value::as_i64);
    let new_form: Vec<(String, Value)> =
        conditions.iter().map(|(c, at)| (c.type_.clone(), metav1_condition(c, *at, generation))).collect();
    let legacy: Vec<(String, Value)> = conditions
        .iter()
        .filter_map(|(c, at)| legacy_form(c).map(|(t, r)| (t.to_string(), legacy_condition(t, r, c, *at))))
        .collect();
    let (new_path, legacy_path) = match version {
        CapiVersion::V1Beta2 => ("/status/conditions", "/status/deprecated/v1beta1/conditions"),
        CapiVersion::V1Beta1 => ("/status/v1beta2/conditions", "/status/conditions"),
    };
    let mut patch = json!({"status": {}});
    set_path(&mut patch, new_path, merge_into(machine.pointer(new_path), &new_form));
    if !legacy.is_empty() {
        set_path(&mut patch, legacy_path, merge_into(machine.pointer(legacy_path), &legacy));
    }
    if let Some(rv) = machine.pointer("/metadata/resourceVersion") {
        patch["metadata"] = json!({"resourceVersion": rv});
    }
    patch
}

fn set_path(root: &mut Value, pointer: &str, value: Value) {
    let mut cur = root;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        if i + 1 == parts.len() {
            map.insert((*part).to_string(), value);
            return;
        }
        cur = map.entry((*part).to_string()).or_insert_with(|| Value::Object(Map::new()));
    }
}

/// Applies a JSON merge patch (RFC 7386) to `target`: what the API server does with a
/// `merge-patch+json` request, used by the simulator so both apply the very same patch.
pub fn apply_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else { return };
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
        } else {
            apply_merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Timestamp {
        "2030-01-01T00:05:00Z".parse().expect("ts")
    }

    fn unhealthy() -> Vec<(DesiredCondition, Timestamp)> {
        vec![
            (
                DesiredCondition::false_(
                    "HealthCheckSucceeded",
                    Reason::NodeDeleted,
                    "Health check failed: Node n1 has been deleted",
                ),
                at(),
            ),
            (
                DesiredCondition::false_("OwnerRemediated", Reason::WaitingForRemediation, "Waiting for remediation"),
                at(),
            ),
        ]
    }

    #[test]
    fn v1beta2_machine_gets_new_and_deprecated_forms() {
        let machine = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m1", "resourceVersion": "42", "generation": 3},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2030-01-01T00:00:00Z"}]}
        });
        let patch = machine_status_patch(&machine, CapiVersion::V1Beta2, &unhealthy());
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let new = patch["status"]["conditions"].as_array().expect("array");
        assert_eq!(new.len(), 3, "keeps Ready and adds two");
        assert_eq!(new[1]["reason"], "NodeDeleted");
        assert_eq!(new[1]["observedGeneration"], 3);
        let legacy = patch["status"]["deprecated"]["v1beta1"]["conditions"].as_array().expect("array");
        assert_eq!(legacy[0]["reason"], "NodeNotFound");
        assert_eq!(legacy[0]["severity"], "Warning");
        let mut applied = machine.clone();
        apply_merge_patch(&mut applied, &patch);
        assert_eq!(applied["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(applied["status"]["deprecated"]["v1beta1"]["conditions"][1]["type"], "OwnerRemediated");
    }

    #[test]
    fn v1beta1_machine_keeps_legacy_in_conditions() {
        let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m1"}});
        let patch = machine_status_patch(&machine, CapiVersion::V1Beta1, &unhealthy());
        assert_eq!(patch["status"]["conditions"][0]["reason"], "NodeNotFound");
        assert_eq!(patch["status"]["v1beta2"]["conditions"][0]["reason"], "NodeDeleted");
        assert!(patch.get("metadata").is_none());
    }

    #[test]
    fn healthy_legacy_condition_has_no_reason_or_severity() {
        let c = vec![(DesiredCondition::true_("HealthCheckSucceeded", Reason::HealthCheckSucceeded, ""), at())];
        let patch = machine_status_patch(&json!({}), CapiVersion::V1Beta1, &c);
        let legacy = &patch["status"]["conditions"][0];
        assert_eq!(legacy["status"], "True");
        assert!(legacy.get("severity").is_none() && legacy.get("reason").is_none());
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"a": {"b": 1, "c": 2}, "d": [1, 2]});
        apply_merge_patch(&mut target, &json!({"a": {"b": null, "e": 3}, "d": [3]}));
        assert_eq!(target, json!({"a": {"c": 2, "e": 3}, "d": [3]}));
    }
}
