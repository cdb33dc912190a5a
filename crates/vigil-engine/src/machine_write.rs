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
            // Vigil's own verdicts: Cluster API's v1beta1 schema refuses a False condition
            // without a reason, so each is written as itself.
            Reason::ExpressionMatched => Reason::ExpressionMatched.as_str(),
            Reason::Flapping => Reason::Flapping.as_str(),
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

/// The condition types a [`WriteBasis`] records the position of: every type Vigil writes on a
/// Machine, in either form (see [`legacy_form`]). A write of any other type has no basis.
const RECORDED_TYPES: [&str; 5] = [
    HEALTH_CHECK_SUCCEEDED,
    OWNER_REMEDIATED,
    EXTERNALLY_REMEDIATED,
    "ExternalRemediationTemplateAvailable",
    "ExternalRemediationRequestAvailable",
];

/// Where one conditions list of a Machine stood when it was read (24 bytes: one is kept per
/// cached Machine and list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ListShape {
    /// How many leading parts of the list's path exist (the last one as an array, the others
    /// as objects): the full count when the list is there, 0 when even `status` is absent;
    /// [`ListShape::UNREADABLE`] when a position did not fit in `slots`.
    depth: u8,
    /// The index of the first condition of each [`RECORDED_TYPES`] entry in the list.
    slots: [Option<u16>; RECORDED_TYPES.len()],
}

impl ListShape {
    /// A list whose positions could not be recorded: no patch is built from it.
    const UNREADABLE: u8 = u8::MAX;

    fn read(machine: &Value, pointer: &str) -> ListShape {
        let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
        let mut depth = 0u8;
        let mut cur = machine;
        let mut slots = [None; RECORDED_TYPES.len()];
        for (i, part) in parts.iter().enumerate() {
            let Some(next) = cur.get(*part) else { break };
            let last = i + 1 == parts.len();
            if (last && !next.is_array()) || (!last && !next.is_object()) {
                break;
            }
            depth += 1;
            cur = next;
        }
        if usize::from(depth) == parts.len() {
            for (index, c) in cur.as_array().into_iter().flatten().enumerate() {
                let type_ = c.get("type").and_then(Value::as_str);
                if let Some(t) = RECORDED_TYPES.iter().position(|r| Some(*r) == type_)
                    && slots[t].is_none()
                {
                    match u16::try_from(index) {
                        Ok(index) => slots[t] = Some(index),
                        Err(_) => return ListShape { depth: Self::UNREADABLE, slots },
                    }
                }
            }
        }
        ListShape { depth, slots }
    }
}

/// What a condition write needs to know of a Machine besides its view, instead of the
/// Machine's text: its generation and, for both condition lists, whether the list (or which
/// of its parents) exists and where each condition Vigil writes sits. From it
/// [`WriteBasis::json_patch`] builds a JSON patch that tests the `resourceVersion` the
/// decision read and then replaces or appends only Vigil's own conditions at those positions:
/// the test makes the positions safe (any change to the Machine fails the whole patch), and
/// no other writer's condition is part of the patch, so none can be dropped or altered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBasis {
    /// The API form the shapes were read for.
    version: CapiVersion,
    /// `metadata.generation` (the new-form conditions' `observedGeneration`).
    generation: Option<i64>,
    /// The `metav1.Condition` list.
    new_form: ListShape,
    /// The legacy list.
    legacy: ListShape,
}

/// The paths of the new-form and the legacy conditions list of a Machine in `version`.
fn list_paths(version: CapiVersion) -> (&'static str, &'static str) {
    match version {
        CapiVersion::V1Beta2 => ("/status/conditions", "/status/deprecated/v1beta1/conditions"),
        CapiVersion::V1Beta1 => ("/status/v1beta2/conditions", "/status/conditions"),
    }
}

impl WriteBasis {
    /// The basis of `machine` (its JSON as read) written in `version`.
    pub fn read(machine: &Value, version: CapiVersion) -> WriteBasis {
        let (new_path, legacy_path) = list_paths(version);
        WriteBasis {
            version,
            generation: machine.pointer("/metadata/generation").and_then(Value::as_i64),
            new_form: ListShape::read(machine, new_path),
            legacy: ListShape::read(machine, legacy_path),
        }
    }

    /// The JSON patch (RFC 6902, as an array of operations) that sets `conditions` in both
    /// forms on the Machine this basis was read from, at `resource_version`: applied to that
    /// Machine it gives what [`machine_status_patch`] gives. `None` when the basis cannot say
    /// (another API form, a condition type it did not record, or no `resource_version` to
    /// test): the writer then reads the Machine and sends [`machine_status_patch`].
    pub fn json_patch(
        &self,
        version: CapiVersion,
        resource_version: Option<&str>,
        conditions: &[(DesiredCondition, Timestamp)],
    ) -> Option<Value> {
        let resource_version = resource_version?;
        if version != self.version {
            return None;
        }
        let new_form: Vec<(&str, Value)> =
            conditions.iter().map(|(c, at)| (c.type_.as_str(), metav1_condition(c, *at, self.generation))).collect();
        let legacy: Vec<(&str, Value)> = conditions
            .iter()
            .filter_map(|(c, at)| legacy_form(c).map(|(t, r)| (t, legacy_condition(t, r, c, *at))))
            .collect();
        let (new_path, legacy_path) = list_paths(version);
        let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})];
        let mut status_made = false;
        list_ops(&mut ops, new_path, self.new_form, &new_form, &mut status_made)?;
        if !legacy.is_empty() {
            list_ops(&mut ops, legacy_path, self.legacy, &legacy, &mut status_made)?;
        }
        Some(Value::Array(ops))
    }
}

/// The operations that put `updates` into the list at `pointer` of shape `shape`: each
/// condition replaces the one of its type or is appended; a missing list (or parent) is added
/// whole. `status_made`: an earlier operation added `status` (both lists live under it).
fn list_ops(
    ops: &mut Vec<Value>,
    pointer: &str,
    shape: ListShape,
    updates: &[(&str, Value)],
    status_made: &mut bool,
) -> Option<()> {
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    if shape.depth == ListShape::UNREADABLE {
        return None;
    }
    let depth = if *status_made { usize::from(shape.depth).max(1) } else { usize::from(shape.depth) };
    if depth == parts.len() {
        let mut appended: Vec<&str> = Vec::new();
        for (type_, condition) in updates {
            let slot = RECORDED_TYPES.iter().position(|r| r == type_)?;
            let path = match shape.slots[slot] {
                Some(index) => format!("{pointer}/{index}"),
                // Two updates of one type would need the second to replace the first.
                None if appended.contains(type_) => return None,
                None => {
                    appended.push(type_);
                    format!("{pointer}/-")
                }
            };
            let op = if path.ends_with("/-") { "add" } else { "replace" };
            ops.push(json!({"op": op, "path": path, "value": condition}));
        }
        return Some(());
    }
    let owned: Vec<(String, Value)> = updates.iter().map(|(t, c)| (t.to_string(), c.clone())).collect();
    let list = merge_into(None, &owned);
    let value = parts[depth + 1..].iter().rev().fold(list, |inner, part| json!({ *part: inner }));
    let path = format!("/{}", parts[..=depth].join("/"));
    ops.push(json!({"op": "add", "path": path, "value": value}));
    if depth == 0 {
        *status_made = true;
    }
    Some(())
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
    /// Every verdict a MachineHealthCheck writes as `HealthCheckSucceeded=False` has a legacy
    /// reason: Cluster API's `v1beta1` schema refuses a False condition without one, and the
    /// whole Machine write with it.
    #[test]
    fn every_unhealthy_verdict_has_a_legacy_reason() {
        for reason in [
            Reason::NodeDeleted,
            Reason::HasRemediateAnnotation,
            Reason::UnhealthyNode,
            Reason::UnhealthyMachine,
            Reason::NodeStartupTimeout,
            Reason::MachineHasFailure,
            Reason::ExpressionMatched,
            Reason::Flapping,
        ] {
            let c = DesiredCondition::false_(HEALTH_CHECK_SUCCEEDED, reason.clone(), "m");
            let legacy = legacy_form(&c).map(|(_, r)| r);
            assert!(legacy.is_some_and(|r| !r.is_empty()), "{reason:?}: {legacy:?}");
        }
    }

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

    /// Another writer's condition, in whichever list it is put.
    fn theirs(type_: &str) -> Value {
        json!({"type": type_, "status": "True", "reason": "Theirs", "message": "kept as is", "severity": "Info",
               "lastTransitionTime": "2029-01-01T00:00:00Z", "observedGeneration": 1})
    }

    fn mine(type_: &str) -> Value {
        json!({"type": type_, "status": "True", "reason": "Old", "message": "", "lastTransitionTime": "2029-06-01T00:00:00Z"})
    }

    /// Machines of both API forms: status absent, lists absent, a parent of the legacy list
    /// absent, lists with other writers' conditions only, with Vigil's conditions first,
    /// between others and last, and with a `null` list.
    fn shapes() -> Vec<(&'static str, CapiVersion, Value)> {
        let meta = json!({"name": "m1", "namespace": "ns", "resourceVersion": "42", "generation": 7});
        let machine = |api: &str, status: Option<Value>| {
            let mut m =
                json!({"apiVersion": format!("cluster.x-k8s.io/{api}"), "kind": "Machine", "metadata": meta.clone()});
            if let Some(s) = status {
                m["status"] = s;
            }
            m
        };
        let others = |types: &[&str]| Value::Array(types.iter().map(|t| theirs(t)).collect());
        let v2 = CapiVersion::V1Beta2;
        let v1 = CapiVersion::V1Beta1;
        vec![
            ("v1beta2, no status", v2, machine("v1beta2", None)),
            ("v1beta2, empty status", v2, machine("v1beta2", Some(json!({})))),
            (
                "v1beta2, others only, no deprecated",
                v2,
                machine("v1beta2", Some(json!({"conditions": others(&["Ready", "Available"])}))),
            ),
            (
                "v1beta2, deprecated without v1beta1",
                v2,
                machine("v1beta2", Some(json!({"conditions": others(&["Ready"]), "deprecated": {}}))),
            ),
            (
                "v1beta2, v1beta1 without conditions",
                v2,
                machine("v1beta2", Some(json!({"deprecated": {"v1beta1": {"failureReason": "x"}}}))),
            ),
            (
                "v1beta2, Vigil's between others",
                v2,
                machine(
                    "v1beta2",
                    Some(json!({
                        "conditions": [theirs("Ready"), mine(HEALTH_CHECK_SUCCEEDED), theirs("Available"), mine(OWNER_REMEDIATED), theirs("Paused")],
                        "deprecated": {"v1beta1": {"conditions": [mine(OWNER_REMEDIATED), theirs("Ready"), mine(HEALTH_CHECK_SUCCEEDED)]}},
                    })),
                ),
            ),
            (
                "v1beta2, null list",
                v2,
                machine("v1beta2", Some(json!({"conditions": null, "deprecated": {"v1beta1": {"conditions": []}}}))),
            ),
            (
                "v1beta2, one of Vigil's types twice (the first is the one written)",
                v2,
                machine(
                    "v1beta2",
                    Some(
                        json!({"conditions": [mine(HEALTH_CHECK_SUCCEEDED), theirs("Ready"), mine(HEALTH_CHECK_SUCCEEDED)]}),
                    ),
                ),
            ),
            ("v1beta1, no status", v1, machine("v1beta1", None)),
            (
                "v1beta1, legacy only",
                v1,
                machine("v1beta1", Some(json!({"conditions": [theirs("Ready"), mine(HEALTH_CHECK_SUCCEEDED)]}))),
            ),
            (
                "v1beta1, v1beta2 without conditions",
                v1,
                machine("v1beta1", Some(json!({"v1beta2": {}, "phase": "Running"}))),
            ),
            (
                "v1beta1, both lists",
                v1,
                machine(
                    "v1beta1",
                    Some(json!({
                        "conditions": [theirs("Ready"), mine(OWNER_REMEDIATED)],
                        "v1beta2": {"conditions": [mine(HEALTH_CHECK_SUCCEEDED), theirs("Ready"), theirs("Deleting")]},
                    })),
                ),
            ),
        ]
    }

    /// The condition sets Vigil writes: healthy, unhealthy with owner remediation, external
    /// remediation waiting (no legacy form) and its template missing (a legacy type of its own).
    fn writes() -> Vec<Vec<(DesiredCondition, Timestamp)>> {
        vec![
            vec![(DesiredCondition::true_(HEALTH_CHECK_SUCCEEDED, Reason::HealthCheckSucceeded, ""), at())],
            unhealthy(),
            vec![(
                DesiredCondition::false_(
                    EXTERNALLY_REMEDIATED,
                    Reason::WaitingForRemediation,
                    "Waiting for external remediation",
                ),
                at(),
            )],
            vec![
                (DesiredCondition::false_(HEALTH_CHECK_SUCCEEDED, Reason::UnhealthyNode, "Node is unhealthy"), at()),
                (
                    DesiredCondition::false_(EXTERNALLY_REMEDIATED, Reason::RemediationTemplateNotFound, "no template"),
                    at(),
                ),
            ],
        ]
    }

    fn apply_json_patch(machine: &Value, ops: &Value) -> Result<Value, String> {
        let patch: json_patch::Patch = serde_json::from_value(ops.clone()).map_err(|e| e.to_string())?;
        let mut out = machine.clone();
        json_patch::patch(&mut out, &patch).map_err(|e| e.to_string())?;
        Ok(out)
    }

    #[test]
    fn json_patch_writes_what_the_merge_patch_writes() {
        for (name, version, machine) in shapes() {
            let basis = WriteBasis::read(&machine, version);
            for conditions in writes() {
                let ops = basis.json_patch(version, Some("42"), &conditions).expect("a basis for Vigil's conditions");
                let by_json = apply_json_patch(&machine, &ops).unwrap_or_else(|e| panic!("{name}: {e}: {ops}"));
                let mut by_merge = machine.clone();
                apply_merge_patch(&mut by_merge, &machine_status_patch(&machine, version, &conditions));
                assert_eq!(by_json, by_merge, "{name}: {ops}");
            }
        }
    }

    #[test]
    fn json_patch_touches_only_vigils_conditions() {
        for (name, version, machine) in shapes() {
            let ops = WriteBasis::read(&machine, version).json_patch(version, Some("42"), &unhealthy()).expect("basis");
            let after = apply_json_patch(&machine, &ops).expect("applies");
            let (new_path, legacy_path) = list_paths(version);
            for path in [new_path, legacy_path] {
                let others = |m: &Value| -> Vec<Value> {
                    m.pointer(path)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter(|c| c["reason"] == "Theirs")
                        .cloned()
                        .collect()
                };
                assert_eq!(others(&after), others(&machine), "{name}: another writer's conditions at {path}");
            }
            for op in ops.as_array().expect("ops").iter().skip(1) {
                let value = &op["value"];
                assert!(
                    !value.to_string().contains("Theirs"),
                    "{name}: the patch carries another writer's condition: {op}"
                );
            }
        }
    }

    #[test]
    fn json_patch_first_tests_the_resource_version_read() {
        let (_, version, machine) = shapes().swap_remove(5);
        let ops = WriteBasis::read(&machine, version).json_patch(version, Some("42"), &unhealthy()).expect("basis");
        assert_eq!(ops[0], json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"}));
        // The Machine changed since: another writer added a condition before Vigil's (the
        // recorded positions are now wrong) and the version moved on. The patch fails whole.
        let mut changed = machine.clone();
        changed["metadata"]["resourceVersion"] = json!("43");
        changed["status"]["conditions"].as_array_mut().expect("list").insert(0, theirs("Deleting"));
        assert!(apply_json_patch(&changed, &ops).is_err(), "a stale patch must not apply");
        let unchanged = apply_json_patch(&machine, &ops).expect("applies to the version read");
        assert_eq!(unchanged["status"]["conditions"][1]["reason"], "NodeDeleted");
        assert_eq!(unchanged["status"]["conditions"][1]["observedGeneration"], 7);
        assert_eq!(unchanged["status"]["conditions"][0], theirs("Ready"));
    }

    #[test]
    fn json_patch_has_no_basis_without_version_or_for_another_form() {
        let (_, version, machine) = shapes().swap_remove(5);
        let basis = WriteBasis::read(&machine, version);
        assert!(basis.json_patch(version, None, &unhealthy()).is_none(), "nothing to test: the writer reads first");
        assert!(basis.json_patch(CapiVersion::V1Beta1, Some("42"), &unhealthy()).is_none());
        let other = vec![(DesiredCondition::true_("SomethingElse", Reason::HealthCheckSucceeded, ""), at())];
        assert!(basis.json_patch(version, Some("42"), &other).is_none(), "a type whose position was not recorded");
        let (_, v, empty) = shapes().swap_remove(0);
        assert!(
            WriteBasis::read(&empty, v).json_patch(v, Some("42"), &other).is_some(),
            "an absent list is added whole"
        );
    }

    #[test]
    fn a_list_too_long_to_record_has_no_basis() {
        let mut list: Vec<Value> = (0..=usize::from(u16::MAX)).map(|i| theirs(&format!("T{i}"))).collect();
        list.push(mine(HEALTH_CHECK_SUCCEEDED));
        let machine = json!({"metadata": {"resourceVersion": "1"}, "status": {"conditions": list}});
        let basis = WriteBasis::read(&machine, CapiVersion::V1Beta2);
        assert!(
            basis.json_patch(CapiVersion::V1Beta2, Some("1"), &unhealthy()).is_none(),
            "it would append a second one"
        );
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"a": {"b": 1, "c": 2}, "d": [1, 2]});
        apply_merge_patch(&mut target, &json!({"a": {"b": null, "e": 3}, "d": [3]}));
        assert_eq!(target, json!({"a": {"c": 2, "e": 3}, "d": [3]}));
    }
}
