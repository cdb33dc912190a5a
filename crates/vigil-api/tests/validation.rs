//! Every admission rule of MachineHealthCheck and NodeHealthCheck, one table row each, read the
//! way users write them (JSON/YAML through `manifest`), plus the policies valid specs become.

use jiff::SignedDuration;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use vigil_api::manifest::{self, HealthCheck};
use vigil_api::threshold::{IntOrPercent, UnhealthyRange};
use vigil_api::validate::{
    self, ConditionRule, FieldError, HealthyDelay, MhcPolicy, MhcShortCircuit, NhcPolicy, NhcThreshold,
    ValidationErrors,
};
use vigil_api::well_known::CLUSTER_NAME_LABEL;

fn base_mhc() -> Value {
    json!({
        "apiVersion": "vigil.dev/v1alpha1",
        "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": "team-a"},
        "spec": {
            "clusterName": "prod",
            "selector": {"matchLabels": {"pool": "workers"}},
            "unhealthyConditions": [
                {"type": "Ready", "status": "False", "timeout": "300s"},
                {"type": "Ready", "status": "Unknown", "timeout": "300s"}
            ],
            "maxUnhealthy": "40%"
        }
    })
}

fn base_nhc() -> Value {
    json!({
        "apiVersion": "vigil.dev/v1alpha1",
        "kind": "NodeHealthCheck",
        "metadata": {"name": "workers"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
            "minHealthy": "51%",
            "remediationTemplate": {
                "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediationTemplate",
                "name": "snr",
                "namespace": "medik8s"
            }
        }
    })
}

fn template(kind: &str, name: &str) -> Value {
    json!({"apiVersion": "remediation.example.dev/v1", "kind": kind, "name": name, "namespace": "medik8s"})
}

fn escalations() -> Value {
    json!([
        {"remediationTemplate": template("RebootTemplate", "reboot"), "order": 5, "timeout": "10m"},
        {"remediationTemplate": template("PowerCycleTemplate", "ipmi"), "order": 1, "timeout": "5m"},
        {"remediationTemplate": template("ReprovisionTemplate", "metal"), "order": 3, "timeout": "1h"}
    ])
}

/// `base` with the field at JSON pointer `pointer` set to `value`, or removed when `None`.
fn edit(mut base: Value, pointer: &str, value: Option<Value>) -> Value {
    let (parent, last) = pointer.rsplit_once('/').expect("pointer has a parent");
    let slot = base.pointer_mut(parent).unwrap_or_else(|| panic!("no {parent} in base"));
    match (slot, value) {
        (Value::Object(map), Some(v)) => {
            map.insert(last.to_string(), v);
        }
        (Value::Object(map), None) => {
            map.remove(last);
        }
        (Value::Array(list), Some(v)) => list[last.parse::<usize>().expect("index")] = v,
        (other, _) => panic!("cannot edit {pointer} in {other}"),
    }
    base
}

fn edits(base: Value, changes: &[(&str, Option<Value>)]) -> Value {
    changes.iter().cloned().fold(base, |v, (pointer, value)| edit(v, pointer, value))
}

fn read(v: &Value) -> HealthCheck {
    manifest::health_check_from_value(v).unwrap_or_else(|e| panic!("does not read: {e}"))
}

fn mhc_policy(v: &Value) -> Result<MhcPolicy, ValidationErrors> {
    match read(v) {
        HealthCheck::Machine(m) => validate::machine_health_check(&m),
        HealthCheck::Node(_) => panic!("expected a MachineHealthCheck"),
    }
}

fn nhc_policy(v: &Value) -> Result<NhcPolicy, ValidationErrors> {
    match read(v) {
        HealthCheck::Node(n) => validate::node_health_check(&n),
        HealthCheck::Machine(_) => panic!("expected a NodeHealthCheck"),
    }
}

fn errors_of(v: &Value) -> Vec<FieldError> {
    let result = match read(v) {
        HealthCheck::Machine(m) => validate::machine_health_check(&m).map(|_| ()),
        HealthCheck::Node(n) => validate::node_health_check(&n).map(|_| ()),
    };
    result.map_or_else(|e| e.errors, |()| Vec::new())
}

fn secs(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

struct Case {
    name: &'static str,
    object: Value,
    path: &'static str,
    value: &'static str,
    message: &'static str,
}

fn case(
    name: &'static str,
    base: Value,
    changes: &[(&str, Option<Value>)],
    path: &'static str,
    value: &'static str,
    message: &'static str,
) -> Case {
    Case { name, object: edits(base, changes), path, value, message }
}

fn set(pointer: &str, v: Value) -> (&str, Option<Value>) {
    (pointer, Some(v))
}

fn unset(pointer: &str) -> (&str, Option<Value>) {
    (pointer, None)
}

// Over 80 lines on purpose: one table row per admission rule and a ten-line loop; split up,
// the rules would no longer read as one list to compare with `validate`.
#[test]
fn every_admission_rule_refuses_with_path_value_and_reason() {
    let mhc = base_mhc;
    let nhc = base_nhc;
    let cases = [
        // thresholds
        case(
            "percent above 100",
            mhc(),
            &[set("/spec/maxUnhealthy", json!("120%"))],
            "spec.maxUnhealthy",
            "120%",
            "must be a percentage between 0% and 100%",
        ),
        case(
            "negative percent",
            mhc(),
            &[set("/spec/maxUnhealthy", json!("-5%"))],
            "spec.maxUnhealthy",
            "-5%",
            "must not be negative",
        ),
        case(
            "word percent",
            mhc(),
            &[set("/spec/maxUnhealthy", json!("forty%"))],
            "spec.maxUnhealthy",
            "forty%",
            "must be a whole number or a percentage",
        ),
        case(
            "negative count",
            mhc(),
            &[set("/spec/maxUnhealthy", json!(-1))],
            "spec.maxUnhealthy",
            "-1",
            "must not be negative",
        ),
        case(
            "MHC string count without %: Cluster API reads a string as a percentage only",
            mhc(),
            &[set("/spec/maxUnhealthy", json!("10"))],
            "spec.maxUnhealthy",
            "10",
            "a string must be a percentage such as 40%; write a count as a number (maxUnhealthy: 10, not \"10\")",
        ),
        case(
            "MHC selector for another cluster",
            mhc(),
            &[set(
                "/spec/selector/matchLabels",
                json!({"pool": "workers", "cluster.x-k8s.io/cluster-name": "staging"}),
            )],
            "spec.selector.matchLabels.cluster.x-k8s.io/cluster-name",
            "staging",
            "must equal spec.clusterName \"prod\": the check only looks at that cluster's Machines",
        ),
        case(
            "label key that is not label syntax",
            mhc(),
            &[set("/spec/selector/matchLabels", json!({"node pool": "workers"}))],
            "spec.selector.matchLabels",
            "node pool",
            "must be a label key",
        ),
        case(
            "label value that is not label syntax",
            mhc(),
            &[set("/spec/selector/matchLabels", json!({"pool": "workers/a"}))],
            "spec.selector.matchLabels.pool",
            "workers/a",
            "must be a label value",
        ),
        case(
            "expression key that is not label syntax",
            nhc(),
            &[set("/spec/selector/matchExpressions/0/key", json!("-worker"))],
            "spec.selector.matchExpressions[0].key",
            "-worker",
            "must be a label key",
        ),
        case(
            "NHC maxUnhealthy with a MachineDeletionRemediation template",
            nhc(),
            &[
                unset("/spec/minHealthy"),
                set("/spec/maxUnhealthy", json!(1)),
                set("/spec/remediationTemplate", template("MachineDeletionRemediationTemplate", "delete")),
            ],
            "spec.maxUnhealthy",
            "1",
            "cannot be combined with a MachineDeletionRemediationTemplate (spec.remediationTemplate); use minHealthy",
        ),
        case(
            "NHC maxUnhealthy with a MachineDeletionRemediation escalation step",
            nhc(),
            &[
                unset("/spec/minHealthy"),
                set("/spec/maxUnhealthy", json!("20%")),
                unset("/spec/remediationTemplate"),
                set(
                    "/spec/escalatingRemediations",
                    json!([
                        {"remediationTemplate": template("RebootTemplate", "reboot"), "order": 1, "timeout": "5m"},
                        {"remediationTemplate": template("MachineDeletionRemediationTemplate", "delete"), "order": 2, "timeout": "10m"}
                    ]),
                ),
            ],
            "spec.maxUnhealthy",
            "20%",
            "cannot be combined with a MachineDeletionRemediationTemplate (spec.escalatingRemediations[1].remediationTemplate); use minHealthy",
        ),
        case(
            "NHC percent above 100",
            nhc(),
            &[set("/spec/minHealthy", json!("101%"))],
            "spec.minHealthy",
            "101%",
            "between 0% and 100%",
        ),
        case(
            "NHC negative count",
            nhc(),
            &[unset("/spec/minHealthy"), set("/spec/maxUnhealthy", json!(-2))],
            "spec.maxUnhealthy",
            "-2",
            "must not be negative",
        ),
        // unhealthyRange
        case(
            "range without brackets",
            mhc(),
            &[set("/spec/unhealthyRange", json!("1-3"))],
            "spec.unhealthyRange",
            "1-3",
            "must have the form [min-max]",
        ),
        case(
            "range of letters",
            mhc(),
            &[set("/spec/unhealthyRange", json!("[a-b]"))],
            "spec.unhealthyRange",
            "[a-b]",
            "must have the form [min-max]",
        ),
        case(
            "inverted range",
            mhc(),
            &[set("/spec/unhealthyRange", json!("[3-1]"))],
            "spec.unhealthyRange",
            "[3-1]",
            "is inverted: the minimum 3 is greater than the maximum 1",
        ),
        // selectors
        case(
            "empty MHC selector",
            mhc(),
            &[set("/spec/selector", json!({}))],
            "spec.selector",
            "{}",
            "must not be empty",
        ),
        case(
            "empty NHC selector",
            nhc(),
            &[set("/spec/selector", json!({"matchLabels": {}}))],
            "spec.selector",
            "{}",
            "must not be empty",
        ),
        case(
            "bad selector operator",
            mhc(),
            &[set(
                "/spec/selector",
                json!({"matchExpressions": [{"key": "pool", "operator": "Equals", "values": ["a"]}]}),
            )],
            "spec.selector.matchExpressions[0].operator",
            "Equals",
            "must be one of In, NotIn, Exists, DoesNotExist",
        ),
        case(
            "NHC bad selector operator",
            nhc(),
            &[set("/spec/selector/matchExpressions/0/operator", json!("exists"))],
            "spec.selector.matchExpressions[0].operator",
            "exists",
            "must be one of In, NotIn, Exists, DoesNotExist",
        ),
        // nodeStartupTimeout
        case(
            "startup timeout 1s",
            mhc(),
            &[set("/spec/nodeStartupTimeout", json!("1s"))],
            "spec.nodeStartupTimeout",
            "1s",
            "must be 0 (disabled) or at least 30s",
        ),
        case(
            "startup timeout 15s",
            mhc(),
            &[set("/spec/nodeStartupTimeout", json!("15s"))],
            "spec.nodeStartupTimeout",
            "15s",
            "must be 0 (disabled) or at least 30s",
        ),
        case(
            "startup timeout 29s",
            mhc(),
            &[set("/spec/nodeStartupTimeout", json!("29s"))],
            "spec.nodeStartupTimeout",
            "29s",
            "must be 0 (disabled) or at least 30s",
        ),
        case(
            "startup timeout 29.9s",
            mhc(),
            &[set("/spec/nodeStartupTimeout", json!("29.9s"))],
            "spec.nodeStartupTimeout",
            "29.9s",
            "at least 30s",
        ),
        // durations
        case(
            "negative startup timeout",
            mhc(),
            &[set("/spec/nodeStartupTimeout", json!("-1m"))],
            "spec.nodeStartupTimeout",
            "-1m",
            "must not be negative",
        ),
        case(
            "negative condition timeout",
            mhc(),
            &[set("/spec/unhealthyConditions/1/timeout", json!("-5s"))],
            "spec.unhealthyConditions[1].timeout",
            "-5s",
            "must not be negative",
        ),
        case(
            "negative machine condition timeout",
            mhc(),
            &[set(
                "/spec/unhealthyMachineConditions",
                json!([{"type": "Healthy", "status": "False", "timeout": "-1h"}]),
            )],
            "spec.unhealthyMachineConditions[0].timeout",
            "-1h",
            "must not be negative",
        ),
        case(
            "a machine condition the check itself writes",
            mhc(),
            &[set(
                "/spec/unhealthyMachineConditions",
                json!([{"type": "HealthCheckSucceeded", "status": "False", "timeout": "1m"}]),
            )],
            "spec.unhealthyMachineConditions[0].type",
            "HealthCheckSucceeded",
            "must not be one of Ready, Available, HealthCheckSucceeded, OwnerRemediated, ExternallyRemediated: they summarise the Machine or are written by the health check itself",
        ),
        case(
            "negative NHC duration",
            nhc(),
            &[set("/spec/unhealthyConditions", json!([{"type": "Ready", "status": "False", "duration": "-300s"}]))],
            "spec.unhealthyConditions[0].duration",
            "-300s",
            "must not be negative",
        ),
        case(
            "negative storm cooldown",
            nhc(),
            &[set("/spec/stormCooldownDuration", json!("-1m"))],
            "spec.stormCooldownDuration",
            "-1m",
            "must not be negative",
        ),
        case(
            "duration in words",
            mhc(),
            &[set("/spec/nodeStartupTimeout", json!("5 minutes"))],
            "spec.nodeStartupTimeout",
            "5 minutes",
            "is not a duration",
        ),
        case(
            "duration without unit",
            mhc(),
            &[set("/spec/unhealthyConditions/0/timeout", json!("300"))],
            "spec.unhealthyConditions[0].timeout",
            "300",
            "has a number without a unit; write e.g. 300s",
        ),
        case(
            "NHC duration without unit",
            nhc(),
            &[set("/spec/unhealthyConditions", json!([{"type": "Ready", "status": "False", "duration": "300"}]))],
            "spec.unhealthyConditions[0].duration",
            "300",
            "without a unit",
        ),
        case(
            "malformed healthyDelay",
            nhc(),
            &[set("/spec/healthyDelay", json!("1 day"))],
            "spec.healthyDelay",
            "1 day",
            "is not a duration",
        ),
        // conditions
        case(
            "condition status",
            mhc(),
            &[set("/spec/unhealthyConditions/0/status", json!("Maybe"))],
            "spec.unhealthyConditions[0].status",
            "Maybe",
            "must be one of True, False, Unknown",
        ),
        case(
            "condition status lowercase",
            nhc(),
            &[set("/spec/unhealthyConditions", json!([{"type": "Ready", "status": "false", "duration": "5m"}]))],
            "spec.unhealthyConditions[0].status",
            "false",
            "must be one of True, False, Unknown",
        ),
        case(
            "empty condition type",
            mhc(),
            &[set("/spec/unhealthyConditions/1/type", json!(""))],
            "spec.unhealthyConditions[1].type",
            "",
            "must not be empty",
        ),
        case(
            "blank NHC condition type",
            nhc(),
            &[set("/spec/unhealthyConditions", json!([{"type": " ", "status": "False", "duration": "5m"}]))],
            "spec.unhealthyConditions[0].type",
            " ",
            "must not be empty",
        ),
        case(
            "empty clusterName",
            mhc(),
            &[set("/spec/clusterName", json!(""))],
            "spec.clusterName",
            "",
            "must not be empty",
        ),
        // MHC remediation template
        case(
            "MHC template kind",
            mhc(),
            &[set(
                "/spec/remediationTemplate",
                json!({"apiVersion": "infra.example.dev/v1", "kind": "Metal3Remediation", "name": "t"}),
            )],
            "spec.remediationTemplate.kind",
            "Metal3Remediation",
            "must name a template kind ending in Template",
        ),
        case(
            "MHC template kind is only Template",
            mhc(),
            &[set(
                "/spec/remediationTemplate",
                json!({"apiVersion": "infra.example.dev/v1", "kind": "Template", "name": "t"}),
            )],
            "spec.remediationTemplate.kind",
            "Template",
            "ending in Template",
        ),
        case(
            "MHC template namespace",
            mhc(),
            &[set(
                "/spec/remediationTemplate",
                json!({"apiVersion": "infra.example.dev/v1", "kind": "Metal3RemediationTemplate", "name": "t", "namespace": "other"}),
            )],
            "spec.remediationTemplate.namespace",
            "other",
            "must be the health check's own namespace \"team-a\"",
        ),
        case(
            "MHC template apiVersion without group",
            mhc(),
            &[set(
                "/spec/remediationTemplate",
                json!({"apiVersion": "v1", "kind": "Metal3RemediationTemplate", "name": "t"}),
            )],
            "spec.remediationTemplate.apiVersion",
            "v1",
            "must be group/version",
        ),
        case(
            "MHC template without name",
            mhc(),
            &[set(
                "/spec/remediationTemplate",
                json!({"apiVersion": "infra.example.dev/v1", "kind": "Metal3RemediationTemplate", "name": ""}),
            )],
            "spec.remediationTemplate.name",
            "",
            "must not be empty",
        ),
        // NHC threshold
        case(
            "minHealthy and maxUnhealthy",
            nhc(),
            &[set("/spec/maxUnhealthy", json!(2))],
            "spec.minHealthy",
            "51%",
            "only one of minHealthy and maxUnhealthy may be set (maxUnhealthy is \"2\")",
        ),
        case(
            "neither minHealthy nor maxUnhealthy",
            nhc(),
            &[unset("/spec/minHealthy")],
            "spec.minHealthy",
            "",
            "one of minHealthy and maxUnhealthy must be set",
        ),
        // NHC remediators
        case(
            "template and escalations",
            nhc(),
            &[set("/spec/escalatingRemediations", escalations())],
            "spec.remediationTemplate",
            "",
            "only one of remediationTemplate and escalatingRemediations may be set",
        ),
        case(
            "no remediator",
            nhc(),
            &[unset("/spec/remediationTemplate")],
            "spec.remediationTemplate",
            "",
            "one of remediationTemplate and escalatingRemediations must be set",
        ),
        case(
            "duplicate orders",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                set("/spec/escalatingRemediations/2/order", json!(5)),
            ],
            "spec.escalatingRemediations[2].order",
            "5",
            "must be unique: spec.escalatingRemediations[0] has the same order",
        ),
        case(
            "negative order",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                set("/spec/escalatingRemediations/1/order", json!(-1)),
            ],
            "spec.escalatingRemediations[1].order",
            "-1",
            "must not be negative",
        ),
        case(
            "escalation timeout under 1m",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                set("/spec/escalatingRemediations/1/timeout", json!("59s")),
            ],
            "spec.escalatingRemediations[1].timeout",
            "59s",
            "must be at least 1m",
        ),
        case(
            "escalation timeout zero",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                set("/spec/escalatingRemediations/0/timeout", json!("0")),
            ],
            "spec.escalatingRemediations[0].timeout",
            "0",
            "must be at least 1m",
        ),
        case(
            "negative escalation timeout",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                set("/spec/escalatingRemediations/0/timeout", json!("-10m")),
            ],
            "spec.escalatingRemediations[0].timeout",
            "-10m",
            "must not be negative",
        ),
        case(
            "duplicate escalation templates",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                set("/spec/escalatingRemediations/2/remediationTemplate", template("RebootTemplate", "reboot")),
            ],
            "spec.escalatingRemediations[2].remediationTemplate",
            "RebootTemplate medik8s/reboot",
            "must be unique: spec.escalatingRemediations[0] uses the same template",
        ),
        case(
            "template without namespace",
            nhc(),
            &[unset("/spec/remediationTemplate/namespace")],
            "spec.remediationTemplate.namespace",
            "",
            "must not be empty: a NodeHealthCheck is cluster-scoped",
        ),
        case(
            "escalation template without namespace",
            nhc(),
            &[
                unset("/spec/remediationTemplate"),
                set("/spec/escalatingRemediations", escalations()),
                unset("/spec/escalatingRemediations/1/remediationTemplate/namespace"),
            ],
            "spec.escalatingRemediations[1].remediationTemplate.namespace",
            "",
            "must not be empty",
        ),
        case(
            "NHC template kind",
            nhc(),
            &[set("/spec/remediationTemplate/kind", json!("SelfNodeRemediation"))],
            "spec.remediationTemplate.kind",
            "SelfNodeRemediation",
            "ending in Template",
        ),
        // pause
        case(
            "empty pause request",
            nhc(),
            &[set("/spec/pauseRequests", json!(["upgrade by alice", ""]))],
            "spec.pauseRequests[1]",
            "",
            "must not be empty: say who paused the check and why",
        ),
    ];

    let mut failures = Vec::new();
    for c in &cases {
        let errors = errors_of(&c.object);
        let ok =
            matches!(errors.as_slice(), [e] if e.path == c.path && e.value == c.value && e.message.contains(c.message));
        if !ok {
            failures.push(format!(
                "{}: want one error {} = {:?} containing {:?}, got {:?}",
                c.name, c.path, c.value, c.message, errors
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn node_startup_timeout_bounds_default_and_disable() {
    let with = |t: Option<&str>| {
        let v = match t {
            Some(t) => edit(base_mhc(), "/spec/nodeStartupTimeout", Some(json!(t))),
            None => base_mhc(),
        };
        mhc_policy(&v).map(|p| p.node_startup_timeout)
    };
    assert_eq!(with(None), Ok(Some(secs(600))), "default 10m");
    assert_eq!(with(Some("30s")), Ok(Some(secs(30))));
    assert_eq!(with(Some("0.5m")), Ok(Some(secs(30))));
    assert_eq!(with(Some("1h")), Ok(Some(secs(3600))));
    assert_eq!(with(Some("0")), Ok(None), "0 disables");
    assert_eq!(with(Some("0s")), Ok(None), "0s disables too");
    for refused in ["1s", "15s", "29s", "29999ms"] {
        assert!(with(Some(refused)).is_err(), "{refused} must be refused");
    }
}

#[test]
fn negative_healthy_delay_waits_for_confirmation() {
    let delay = |d: &str| nhc_policy(&edit(base_nhc(), "/spec/healthyDelay", Some(json!(d)))).map(|p| p.healthy_delay);
    assert_eq!(delay("-1s"), Ok(HealthyDelay::UntilConfirmed));
    assert_eq!(
        delay("-1"),
        Err(ValidationErrors {
            object: "NodeHealthCheck/workers".into(),
            errors: vec![FieldError {
                path: "spec.healthyDelay".into(),
                value: "-1".into(),
                message: "has a number without a unit; write e.g. 300s".into()
            }],
        })
    );
    assert_eq!(delay("0"), Ok(HealthyDelay::After(SignedDuration::ZERO)));
    assert_eq!(delay("90s"), Ok(HealthyDelay::After(secs(90))));
    assert_eq!(
        nhc_policy(&base_nhc()).map(|p| p.healthy_delay),
        Ok(HealthyDelay::After(SignedDuration::ZERO)),
        "default: at once"
    );
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn valid_mhc_becomes_its_policy() {
    let v = edits(
        base_mhc(),
        &[
            set(
                "/spec/unhealthyMachineConditions",
                json!([{"type": "Healthy", "status": "False", "timeout": "1m30s"}]),
            ),
            set(
                "/spec/remediationTemplate",
                json!({"apiVersion": "infra.example.dev/v1", "kind": "Metal3RemediationTemplate", "name": "metal"}),
            ),
        ],
    );
    let p = mhc_policy(&v).expect("valid");
    assert_eq!(p.cluster_name, "prod");
    assert!(p.selector.matches(Some(&labels(&[("pool", "workers"), (CLUSTER_NAME_LABEL, "prod")]))));
    assert!(!p.selector.matches(Some(&labels(&[("pool", "workers")]))), "the cluster-name label is required");
    assert!(!p.selector.matches(Some(&labels(&[("pool", "workers"), (CLUSTER_NAME_LABEL, "staging")]))));
    let rule = |path: &str, t: &str, s: &str, d: SignedDuration| ConditionRule {
        type_: t.into(),
        status: s.into(),
        timeout: d,
        path: path.into(),
        ..ConditionRule::default()
    };
    assert_eq!(
        p.node_conditions,
        [
            rule("spec.unhealthyConditions[0]", "Ready", "False", secs(300)),
            rule("spec.unhealthyConditions[1]", "Ready", "Unknown", secs(300))
        ]
    );
    assert_eq!(p.machine_conditions, [rule("spec.unhealthyMachineConditions[0]", "Healthy", "False", secs(90))]);
    assert_eq!(p.node_startup_timeout, Some(secs(600)));
    assert_eq!(p.short_circuit, MhcShortCircuit::MaxUnhealthy(IntOrPercent::Percent(40)));
    let t = p.remediation_template.expect("template");
    assert_eq!(
        (t.namespace.as_str(), t.remediation_kind()),
        ("team-a", "Metal3Remediation"),
        "the MHC's own namespace"
    );

    let ranged = mhc_policy(&edit(base_mhc(), "/spec/unhealthyRange", Some(json!("[1-3]")))).expect("valid");
    assert_eq!(
        ranged.short_circuit,
        MhcShortCircuit::Range(UnhealthyRange { min: 1, max: 3 }),
        "the range wins over maxUnhealthy"
    );
    let unlimited = mhc_policy(&edit(base_mhc(), "/spec/maxUnhealthy", None)).expect("valid");
    assert_eq!(unlimited.short_circuit, MhcShortCircuit::MaxUnhealthy(IntOrPercent::Percent(100)));
    let counted = mhc_policy(&edit(base_mhc(), "/spec/maxUnhealthy", Some(json!(2)))).expect("valid");
    assert_eq!(counted.short_circuit, MhcShortCircuit::MaxUnhealthy(IntOrPercent::Count(2)));
}

#[test]
fn valid_nhc_becomes_its_policy() {
    let p = nhc_policy(&base_nhc()).expect("valid");
    let rule = |i: usize, s: &str| ConditionRule {
        type_: "Ready".into(),
        status: s.into(),
        timeout: secs(300),
        path: format!("spec.unhealthyConditions[{i}]"),
        ..ConditionRule::default()
    };
    assert_eq!(
        p.conditions,
        [rule(0, "False"), rule(1, "Unknown")],
        "medik8s' default when unhealthyConditions is omitted"
    );
    assert_eq!(p.threshold, NhcThreshold::MinHealthy(IntOrPercent::Percent(51)));
    assert!(!p.escalating);
    let [step] = p.steps.as_slice() else { panic!("one step: {:?}", p.steps) };
    assert_eq!((step.order, step.timeout), (0, None));
    assert_eq!(
        (step.template.namespace.as_str(), step.template.remediation_kind()),
        ("medik8s", "SelfNodeRemediation")
    );
    assert!(p.selector.matches(Some(&labels(&[("node-role.kubernetes.io/worker", "")]))));
    assert!(!p.selector.matches(Some(&labels(&[("node-role.kubernetes.io/control-plane", "")]))));
    assert_eq!(p.storm_cooldown, SignedDuration::ZERO);

    let escalating = edits(
        base_nhc(),
        &[
            unset("/spec/remediationTemplate"),
            unset("/spec/minHealthy"),
            set("/spec/maxUnhealthy", json!("2")),
            set("/spec/escalatingRemediations", escalations()),
            set("/spec/pauseRequests", json!(["upgrade by alice"])),
            set("/spec/stormCooldownDuration", json!("2m")),
        ],
    );
    let p = nhc_policy(&escalating).expect("valid");
    assert!(p.escalating);
    assert_eq!(p.threshold, NhcThreshold::MaxUnhealthy(IntOrPercent::Count(2)));
    let steps: Vec<_> = p.steps.iter().map(|s| (s.order, s.template.name.as_str(), s.timeout)).collect();
    assert_eq!(
        steps,
        [(1, "ipmi", Some(secs(300))), (3, "metal", Some(secs(3600))), (5, "reboot", Some(secs(600)))],
        "sorted by order"
    );
    assert_eq!(p.pause_requests, ["upgrade by alice"]);
    assert_eq!(p.storm_cooldown, secs(120));
}

#[test]
fn every_error_of_an_object_is_reported() {
    let bad_mhc = edits(
        base_mhc(),
        &[
            set("/spec/selector", json!({})),
            set("/spec/unhealthyConditions/0/status", json!("Maybe")),
            set("/spec/unhealthyConditions/1/timeout", json!("5 minutes")),
            set("/spec/nodeStartupTimeout", json!("15s")),
            set("/spec/maxUnhealthy", json!("120%")),
            set("/spec/unhealthyRange", json!("[3-1]")),
        ],
    );
    let err = mhc_policy(&bad_mhc).expect_err("invalid");
    assert_eq!(err.object, "MachineHealthCheck/team-a/workers");
    let found: Vec<_> = err.errors.iter().map(|e| (e.path.as_str(), e.value.as_str())).collect();
    assert_eq!(
        found,
        [
            ("spec.selector", "{}"),
            ("spec.unhealthyConditions[0].status", "Maybe"),
            ("spec.unhealthyConditions[1].timeout", "5 minutes"),
            ("spec.nodeStartupTimeout", "15s"),
            ("spec.maxUnhealthy", "120%"),
            ("spec.unhealthyRange", "[3-1]"),
        ]
    );
    assert!(
        err.to_string().starts_with(
            "MachineHealthCheck/team-a/workers is invalid: spec.selector: invalid value \"{}\": must not be empty"
        ),
        "{err}"
    );

    let bad_nhc = edits(
        base_nhc(),
        &[
            set("/spec/maxUnhealthy", json!("10%")),
            unset("/spec/remediationTemplate"),
            set("/spec/escalatingRemediations", escalations()),
            set("/spec/escalatingRemediations/0/order", json!(1)),
            set("/spec/escalatingRemediations/2/timeout", json!("30s")),
            set("/spec/pauseRequests", json!([""])),
            set("/spec/stormCooldownDuration", json!("soon")),
        ],
    );
    let err = nhc_policy(&bad_nhc).expect_err("invalid");
    let found: Vec<_> = err.errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        found,
        [
            "spec.minHealthy",
            "spec.escalatingRemediations[1].order",
            "spec.escalatingRemediations[2].timeout",
            "spec.pauseRequests[0]",
            "spec.stormCooldownDuration",
        ]
    );
}

/// A MachineHealthCheck for worker nodes and one for KubeadmControlPlane Machines, written as the
/// Cluster API book's "Configure a MachineHealthCheck" page shows them (`cluster.x-k8s.io/v1beta1`).
const CAPI_BOOK_MHCS: &str = r#"
apiVersion: cluster.x-k8s.io/v1beta1
kind: MachineHealthCheck
metadata:
  name: capi-quickstart-node-unhealthy-5m
spec:
  # clusterName is required to associate this MachineHealthCheck with a particular cluster
  clusterName: capi-quickstart
  # (Optional) maxUnhealthy prevents further remediation if the cluster is already partially unhealthy
  maxUnhealthy: 40%
  # (Optional) nodeStartupTimeout: defaults to 10 minutes; 0 disables it
  nodeStartupTimeout: 10m
  # selector is used to determine which Machines should be health checked
  selector:
    matchLabels:
      nodepool: nodepool-0
  unhealthyConditions:
  - type: Ready
    status: Unknown
    timeout: 300s
  - type: Ready
    status: "False"
    timeout: 300s
---
apiVersion: cluster.x-k8s.io/v1beta1
kind: MachineHealthCheck
metadata:
  name: capi-quickstart-kcp-unhealthy-5m
spec:
  clusterName: capi-quickstart
  maxUnhealthy: 100%
  selector:
    matchLabels:
      cluster.x-k8s.io/control-plane: ""
  unhealthyConditions:
    - type: Ready
      status: Unknown
      timeout: 300s
    - type: Ready
      status: "False"
      timeout: 300s
"#;

/// The NodeHealthCheck the medik8s operator creates by default, as the Node Health Check
/// Operator article shows it (`remediation.medik8s.io/v1alpha1`).
const MEDIK8S_DEFAULT_NHC: &str = r#"
apiVersion: remediation.medik8s.io/v1alpha1
kind: NodeHealthCheck
metadata:
  name: nhc-worker-default
spec:
  # mandatory
  remediationTemplate:
    kind: PoisonPillRemediationTemplate
    apiVersion: medik8s.io/v1alpha1
    name: poison-pill-default-template
    namespace: poison-pill
  selector:
    matchExpressions:
      - key: node-role.kubernetes.io/worker
        operator: Exists
  minHealthy: "51%"
  unhealthyConditions:
  - type: Ready
    status: "False"
    duration: 300s
  - type: Ready
    status: Unknown
    duration: 300s
  pauseRequests: []
"#;

#[test]
fn upstream_book_mhcs_read_and_validate() {
    let docs = manifest::parse_documents(CAPI_BOOK_MHCS).expect("YAML");
    assert_eq!(docs.len(), 2);
    let policies: Vec<(String, MhcPolicy)> = docs
        .iter()
        .map(|d| match read(d) {
            HealthCheck::Machine(m) => {
                assert_eq!(m.metadata.namespace, None);
                let id = HealthCheck::Machine(m.clone()).object_id();
                (id, validate::machine_health_check(&m).expect("valid"))
            }
            HealthCheck::Node(_) => panic!("an MHC"),
        })
        .collect();
    let (id, workers) = &policies[0];
    assert_eq!(id, "MachineHealthCheck/default/capi-quickstart-node-unhealthy-5m");
    assert_eq!(workers.cluster_name, "capi-quickstart");
    assert_eq!(workers.short_circuit, MhcShortCircuit::MaxUnhealthy(IntOrPercent::Percent(40)));
    assert_eq!(workers.node_startup_timeout, Some(secs(600)));
    assert_eq!(workers.node_conditions.iter().map(|c| c.status.as_str()).collect::<Vec<_>>(), ["Unknown", "False"]);
    assert!(
        workers.selector.matches(Some(&labels(&[("nodepool", "nodepool-0"), (CLUSTER_NAME_LABEL, "capi-quickstart")])))
    );
    let (_, control_plane) = &policies[1];
    assert_eq!(control_plane.short_circuit, MhcShortCircuit::MaxUnhealthy(IntOrPercent::Percent(100)));
    assert!(
        control_plane
            .selector
            .matches(Some(&labels(&[("cluster.x-k8s.io/control-plane", ""), (CLUSTER_NAME_LABEL, "capi-quickstart")])))
    );
    assert!(
        !control_plane
            .selector
            .matches(Some(&labels(&[("nodepool", "nodepool-0"), (CLUSTER_NAME_LABEL, "capi-quickstart")])))
    );
}

#[test]
fn upstream_medik8s_nhc_reads_and_validates() {
    let docs = manifest::parse_documents(MEDIK8S_DEFAULT_NHC).expect("YAML");
    let [doc] = docs.as_slice() else { panic!("one document") };
    let p = nhc_policy(doc).expect("valid");
    assert_eq!(p.threshold, NhcThreshold::MinHealthy(IntOrPercent::Percent(51)));
    assert_eq!(p.conditions.len(), 2);
    assert!(p.pause_requests.is_empty());
    let [step] = p.steps.as_slice() else { panic!("one step") };
    assert_eq!(step.template.to_string(), "PoisonPillRemediationTemplate poison-pill/poison-pill-default-template");
    assert_eq!(step.template.api_version, "medik8s.io/v1alpha1");
    assert!(p.selector.matches(Some(&labels(&[("node-role.kubernetes.io/worker", "")]))));
}

#[test]
fn unquoted_yaml_scalars_that_are_not_strings_are_shape_errors() {
    // `status: False` is a YAML boolean and `nodeStartupTimeout: 0` a number; the API server
    // refuses both for string fields, and so does Vigil, saying where and what to do.
    let text = "apiVersion: cluster.x-k8s.io/v1beta1\nkind: MachineHealthCheck\nmetadata: {name: m}\nspec:\n  clusterName: c\n  selector: {matchLabels: {a: b}}\n  nodeStartupTimeout: 0\n";
    let docs = manifest::parse_documents(text).expect("YAML");
    let err = manifest::health_check_from_value(&docs[0]).expect_err("0 is a number");
    assert_eq!(
        err.to_string(),
        "MachineHealthCheck/default/m: spec.nodeStartupTimeout: invalid type: integer `0`, expected a string (quote the value in YAML, e.g. \"0\" or \"False\")"
    );
}

#[test]
fn unknown_spec_fields_are_refused_so_a_typo_never_leaves_a_default_in_force() {
    use vigil_api::manifest::{ManifestError, health_check_from_value};
    let typo = serde_json::json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": "default"},
        "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": "w"}}, "maxUnhealty": "120%"}
    });
    let err = health_check_from_value(&typo).expect_err("a typo is refused");
    assert!(matches!(&err, ManifestError::Shape { path, .. } if path == "spec.maxUnhealty"), "{err}");
    assert!(err.to_string().contains("unknown field"), "{err}");

    // Upstream ObjectReference extras on a template reference are tolerated; other extras are not.
    let upstream = serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": "default", "uid": "abc", "resourceVersion": "7"},
        "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": "w"}},
                 "remediationTemplate": {"apiVersion": "x.io/v1", "kind": "XTemplate", "name": "t", "uid": "u", "resourceVersion": "1"}}
    });
    assert!(health_check_from_value(&upstream).is_ok());
    let mut bad = upstream.clone();
    bad["spec"]["remediationTemplate"]["nmae"] = serde_json::json!("t2");
    let err = health_check_from_value(&bad).expect_err("typo in a template reference");
    assert!(matches!(&err, ManifestError::Shape { path, .. } if path == "spec.remediationTemplate.nmae"), "{err}");
}

#[test]
fn dry_run_is_off_by_default_opt_in_on_both_kinds_and_must_be_a_boolean() {
    use vigil_api::manifest::ManifestError;
    assert!(!mhc_policy(&base_mhc()).expect("valid").dry_run, "an upstream-shaped manifest keeps its meaning");
    assert!(!nhc_policy(&base_nhc()).expect("valid").dry_run);
    assert!(mhc_policy(&edit(base_mhc(), "/spec/dryRun", Some(json!(true)))).expect("valid").dry_run);
    assert!(nhc_policy(&edit(base_nhc(), "/spec/dryRun", Some(json!(true)))).expect("valid").dry_run);
    for base in [base_mhc(), base_nhc()] {
        let bad = edit(base, "/spec/dryRun", Some(json!("yes")));
        let err = manifest::health_check_from_value(&bad).expect_err("a string is not a boolean");
        assert!(matches!(&err, ManifestError::Shape { path, .. } if path == "spec.dryRun"), "{err}");
    }
}

// Over 80 lines on purpose: mostly a table of refused `spec.backoff` fields, one row each.
#[test]
fn backoff_is_off_by_default_and_each_field_is_checked_naming_it() {
    use vigil_api::validate::BackoffPolicy;
    assert_eq!(mhc_policy(&base_mhc()).expect("valid").backoff, None, "an upstream-shaped manifest keeps its meaning");
    assert_eq!(nhc_policy(&base_nhc()).expect("valid").backoff, None);
    let on = mhc_policy(&edit(base_mhc(), "/spec/backoff", Some(json!({"maxRemediations": 2, "window": "30m"}))));
    assert_eq!(
        on.expect("valid").backoff,
        Some(BackoffPolicy { max_remediations: 2, window: secs(1800), pool_label: None })
    );
    let pool = json!({"maxRemediations": 1, "window": "1h", "poolLabel": "karpenter.sh/nodepool"});
    assert_eq!(
        nhc_policy(&edit(base_nhc(), "/spec/backoff", Some(pool))).expect("valid").backoff,
        Some(BackoffPolicy {
            max_remediations: 1,
            window: secs(3600),
            pool_label: Some("karpenter.sh/nodepool".into())
        })
    );
    // (base, backoff, path, value, words of the message)
    let cases = [
        (
            base_mhc(),
            json!({"maxRemediations": 0, "window": "30m"}),
            "spec.backoff.maxRemediations",
            "0",
            "between 1 and 100",
        ),
        (
            base_mhc(),
            json!({"maxRemediations": 101, "window": "30m"}),
            "spec.backoff.maxRemediations",
            "101",
            "between 1 and 100",
        ),
        (
            base_mhc(),
            json!({"maxRemediations": -3, "window": "30m"}),
            "spec.backoff.maxRemediations",
            "-3",
            "between 1 and 100",
        ),
        (base_mhc(), json!({"maxRemediations": 2, "window": "0s"}), "spec.backoff.window", "0s", "greater than zero"),
        (base_mhc(), json!({"maxRemediations": 2, "window": "-1m"}), "spec.backoff.window", "-1m", "greater than zero"),
        (base_mhc(), json!({"maxRemediations": 2, "window": "30 minutes"}), "spec.backoff.window", "30 minutes", ""),
        (
            base_mhc(),
            json!({"maxRemediations": 2, "window": "30m", "poolLabel": "pool"}),
            "spec.backoff.poolLabel",
            "pool",
            "must not be set on a MachineHealthCheck",
        ),
        (
            base_nhc(),
            json!({"maxRemediations": 2, "window": "30m"}),
            "spec.backoff.poolLabel",
            "",
            "must be set on a NodeHealthCheck",
        ),
        (
            base_nhc(),
            json!({"maxRemediations": 2, "window": "30m", "poolLabel": "-pool"}),
            "spec.backoff.poolLabel",
            "-pool",
            "must be a label key",
        ),
        (
            base_nhc(),
            json!({"maxRemediations": 0, "window": "30m", "poolLabel": "p"}),
            "spec.backoff.maxRemediations",
            "0",
            "between",
        ),
    ];
    for (base, backoff, path, value, words) in cases {
        let object = edit(base, "/spec/backoff", Some(backoff.clone()));
        let errors = errors_of(&object);
        assert!(
            errors.iter().any(|e| e.path == path && e.value == value && e.message.contains(words)),
            "{backoff}: want {path} {value:?} {words:?}, got {errors:?}"
        );
    }
    for (base, kind) in [(base_mhc(), "MachineHealthCheck"), (base_nhc(), "NodeHealthCheck")] {
        let missing = edit(base, "/spec/backoff", Some(json!({"window": "30m"})));
        let err = manifest::health_check_from_value(&missing).expect_err("maxRemediations is required");
        assert!(err.to_string().contains("maxRemediations"), "{kind}: {err}");
    }
}

/// `spec.maxInFlight` on both kinds: absent by default (upstream manifests keep their meaning);
/// a count or a percentage (a string is a percentage only, as Kubernetes reads `maxUnavailable`);
/// `0`, `0%`, negative, over 100% and garbage refused, each naming the field and the value.
#[test]
fn max_in_flight_is_off_by_default_a_positive_count_or_percentage_and_refused_naming_field_and_value() {
    assert_eq!(mhc_policy(&base_mhc()).expect("valid").max_in_flight, None, "upstream manifests keep their meaning");
    assert_eq!(nhc_policy(&base_nhc()).expect("valid").max_in_flight, None);
    for (value, want) in [
        (json!(2), IntOrPercent::Count(2)),
        (json!("25%"), IntOrPercent::Percent(25)),
        (json!("100%"), IntOrPercent::Percent(100)),
        (json!(1), IntOrPercent::Count(1)),
    ] {
        let mhc = edit(base_mhc(), "/spec/maxInFlight", Some(value.clone()));
        assert_eq!(mhc_policy(&mhc).expect("valid").max_in_flight, Some(want), "{value}");
        let nhc = edit(base_nhc(), "/spec/maxInFlight", Some(value.clone()));
        assert_eq!(nhc_policy(&nhc).expect("valid").max_in_flight, Some(want), "{value}");
    }
    // (value, its rendering in the error, words of the message)
    let cases = [
        (json!(0), "0", "at least 1"),
        (json!("0%"), "0%", "at least 1"),
        (json!(-1), "-1", "must not be negative"),
        (json!("-5%"), "-5%", "must not be negative"),
        (json!("101%"), "101%", "between 0% and 100%"),
        (json!("2"), "2", "a string must be a percentage such as 40%; write a count as a number (maxInFlight: 2"),
        (json!("two"), "two", "a string must be a percentage"),
        (json!("many%"), "many%", "a whole number or a percentage"),
    ];
    for base in [base_mhc(), base_nhc()] {
        for (value, rendered, words) in &cases {
            let errors = errors_of(&edit(base.clone(), "/spec/maxInFlight", Some(value.clone())));
            assert!(
                errors
                    .iter()
                    .any(|e| e.path == "spec.maxInFlight" && e.value == *rendered && e.message.contains(words)),
                "{value}: want spec.maxInFlight {rendered:?} {words:?}, got {errors:?}"
            );
            assert_eq!(errors.len(), 1, "{value}: one error, not a cascade: {errors:?}");
        }
    }
}

/// `spec.voluntaryDisruptions` on both kinds: off by default (upstream manifests keep their
/// meaning), `Count` turns it on, `Ignore` keeps it off, anything else is refused naming the
/// field and the value, and no policy comes of it (so nothing is remediated).
#[test]
fn voluntary_disruptions_are_off_by_default_and_refused_naming_field_and_value() {
    assert!(!mhc_policy(&base_mhc()).expect("valid").count_disruptions, "upstream manifests keep their meaning");
    assert!(!nhc_policy(&base_nhc()).expect("valid").count_disruptions);
    for (value, want) in [("Count", true), ("Ignore", false)] {
        let mhc = edit(base_mhc(), "/spec/voluntaryDisruptions", Some(json!(value)));
        assert_eq!(mhc_policy(&mhc).expect("valid").count_disruptions, want, "{value}");
        let nhc = edit(base_nhc(), "/spec/voluntaryDisruptions", Some(json!(value)));
        assert_eq!(nhc_policy(&nhc).expect("valid").count_disruptions, want, "{value}");
    }
    for base in [base_mhc(), base_nhc()] {
        for value in ["count", "Always", ""] {
            let check = edit(base.clone(), "/spec/voluntaryDisruptions", Some(json!(value)));
            let errors = errors_of(&check);
            assert_eq!(errors.len(), 1, "{value}: one error: {errors:?}");
            assert_eq!((errors[0].path.as_str(), errors[0].value.as_str()), ("spec.voluntaryDisruptions", value));
            assert!(errors[0].message.contains("must be one of Ignore, Count"), "{errors:?}");
            assert!(
                value.is_empty() || errors[0].to_string().contains(&format!("{value:?}")),
                "the value is quoted: {}",
                errors[0]
            );
        }
    }
}

// Over 80 lines on purpose: mostly a table of refused `spec.failureDomains` fields, one row each.
#[test]
fn failure_domains_are_off_by_default_and_validated_like_the_checks_thresholds() {
    use vigil_api::validate::{DomainKey, FailureDomainPolicy};
    assert_eq!(mhc_policy(&base_mhc()).expect("valid").failure_domains, None, "upstream manifests keep their meaning");
    assert_eq!(nhc_policy(&base_nhc()).expect("valid").failure_domains, None);
    let zone = "topology.kubernetes.io/zone";
    let fd = |v: Value| Some(v);
    assert_eq!(
        nhc_policy(&edit(base_nhc(), "/spec/failureDomains", fd(json!({"key": zone, "maxUnhealthy": "30%"}))))
            .expect("valid")
            .failure_domains,
        Some(FailureDomainPolicy {
            key: DomainKey::NodeLabel(zone.into()),
            max_unhealthy: IntOrPercent::Percent(30),
            min_allowed: 1
        }),
        "minAllowed defaults to 1"
    );
    assert_eq!(
        mhc_policy(&edit(
            base_mhc(),
            "/spec/failureDomains",
            fd(json!({"key": "spec.failureDomain", "maxUnhealthy": 2, "minAllowed": 0}))
        ))
        .expect("valid")
        .failure_domains,
        Some(FailureDomainPolicy {
            key: DomainKey::MachineField,
            max_unhealthy: IntOrPercent::Count(2),
            min_allowed: 0
        })
    );
    // (base, failureDomains, refused field, value as reported, words of the message)
    let cases = [
        (
            base_nhc(),
            json!({"key": "spec.failureDomain", "maxUnhealthy": 1}),
            "spec.failureDomains.key",
            "spec.failureDomain",
            "is a Machine field",
        ),
        (
            base_nhc(),
            json!({"key": "zone a", "maxUnhealthy": 1}),
            "spec.failureDomains.key",
            "zone a",
            "must be a label key",
        ),
        (
            base_mhc(),
            json!({"key": "-zone", "maxUnhealthy": 1}),
            "spec.failureDomains.key",
            "-zone",
            "must be a label key",
        ),
        (base_nhc(), json!({"key": "", "maxUnhealthy": 1}), "spec.failureDomains.key", "", "must not be empty"),
        (
            base_mhc(),
            json!({"key": zone, "maxUnhealthy": "10"}),
            "spec.failureDomains.maxUnhealthy",
            "10",
            "must be a percentage such as 40%",
        ),
        (
            base_nhc(),
            json!({"key": zone, "maxUnhealthy": "120%"}),
            "spec.failureDomains.maxUnhealthy",
            "120%",
            "between 0% and 100%",
        ),
        (
            base_nhc(),
            json!({"key": zone, "maxUnhealthy": -1}),
            "spec.failureDomains.maxUnhealthy",
            "-1",
            "must not be negative",
        ),
        (
            base_mhc(),
            json!({"key": zone, "maxUnhealthy": 1, "minAllowed": -1}),
            "spec.failureDomains.minAllowed",
            "-1",
            "must not be negative",
        ),
    ];
    for (base, domains, path, value, words) in cases {
        let spec = edit(base, "/spec/failureDomains", Some(domains.clone()));
        let errors = errors_of(&spec);
        assert!(
            errors.iter().any(|e| e.path == path && e.value == value && e.message.contains(words)),
            "{domains}: {errors:?}"
        );
    }
    // A NodeHealthCheck reads a count written as a string, as its own maxUnhealthy.
    assert!(
        nhc_policy(&edit(base_nhc(), "/spec/failureDomains", fd(json!({"key": zone, "maxUnhealthy": "2"})))).is_ok()
    );
    // An unknown field inside failureDomains is a typo, refused like any other.
    let typo = edit(base_nhc(), "/spec/failureDomains", fd(json!({"key": zone, "maxUnhealthy": 1, "minAlowed": 2})));
    let err = manifest::health_check_from_value(&typo).expect_err("typo");
    assert!(err.to_string().contains("spec.failureDomains.minAlowed"), "{err}");
}

// Over 80 lines on purpose: mostly a table of refused `maxConditionAge` uses, one row each.
#[test]
fn max_condition_age_is_opt_in_at_least_a_minute_and_only_on_node_conditions_other_than_ready() {
    let detector =
        |age: Value| json!([{"type": "KernelDeadlock", "status": "True", "timeout": "5m", "maxConditionAge": age}]);
    // Off by default on both kinds: upstream manifests keep their meaning.
    assert!(mhc_policy(&base_mhc()).expect("valid").node_conditions.iter().all(|r| r.max_age.is_none()));
    assert!(nhc_policy(&base_nhc()).expect("valid").conditions.iter().all(|r| r.max_age.is_none()));
    let mhc = mhc_policy(&edit(base_mhc(), "/spec/unhealthyConditions", Some(detector(json!("10m"))))).expect("valid");
    assert_eq!(mhc.node_conditions[0].max_age, Some(secs(600)));
    let nhc = nhc_policy(&edit(
        base_nhc(),
        "/spec/unhealthyConditions",
        Some(json!([{"type": "KernelDeadlock", "status": "True", "duration": "5m", "maxConditionAge": "1m"}])),
    ))
    .expect("valid: exactly the minimum");
    assert_eq!(nhc.conditions[0].max_age, Some(secs(60)));

    let ready = "must not be set on a Ready rule: the node lifecycle controller";
    let short = "must be at least 1m";
    let machine = "must not be set on a Machine condition rule: Machine conditions carry no heartbeat";
    let cases = [
        (
            edit(base_mhc(), "/spec/unhealthyConditions", Some(detector(json!("59s")))),
            "spec.unhealthyConditions[0].maxConditionAge",
            "59s",
            short,
        ),
        (
            edit(base_mhc(), "/spec/unhealthyConditions", Some(detector(json!("0")))),
            "spec.unhealthyConditions[0].maxConditionAge",
            "0",
            short,
        ),
        (
            edit(base_mhc(), "/spec/unhealthyConditions", Some(detector(json!("-10m")))),
            "spec.unhealthyConditions[0].maxConditionAge",
            "-10m",
            short,
        ),
        (
            edit(base_mhc(), "/spec/unhealthyConditions", Some(detector(json!("ten minutes")))),
            "spec.unhealthyConditions[0].maxConditionAge",
            "ten minutes",
            "not a duration",
        ),
        (
            edit(
                base_mhc(),
                "/spec/unhealthyConditions/1",
                Some(json!({"type": "Ready", "status": "Unknown", "timeout": "5m", "maxConditionAge": "10m"})),
            ),
            "spec.unhealthyConditions[1].maxConditionAge",
            "10m",
            ready,
        ),
        (
            edit(
                base_mhc(),
                "/spec/unhealthyMachineConditions",
                Some(json!([{"type": "NodeHealthy", "status": "False", "timeout": "5m", "maxConditionAge": "10m"}])),
            ),
            "spec.unhealthyMachineConditions[0].maxConditionAge",
            "10m",
            machine,
        ),
        (
            edit(
                base_nhc(),
                "/spec/unhealthyConditions",
                Some(json!([{"type": "Ready", "status": "False", "duration": "5m", "maxConditionAge": "10m"}])),
            ),
            "spec.unhealthyConditions[0].maxConditionAge",
            "10m",
            ready,
        ),
        (
            edit(
                base_nhc(),
                "/spec/unhealthyConditions",
                Some(json!([{"type": "KernelDeadlock", "status": "True", "duration": "5m", "maxConditionAge": "30s"}])),
            ),
            "spec.unhealthyConditions[0].maxConditionAge",
            "30s",
            short,
        ),
    ];
    for (object, path, value, message) in cases {
        let errors = errors_of(&object);
        assert!(
            matches!(errors.as_slice(), [e] if e.path == path && e.value == value && e.message.contains(message)),
            "want {path} = {value:?} ({message}), got {errors:?}"
        );
    }
}

// Over 80 lines on purpose: a table of refused `reasons`, one row each, and the policies the
// valid ones become.
/// The bounds the CRD puts on a rule's `reasons` (`maxItems` 32, `maxLength` 256) are the
/// validator's too, so `vigil validate` and `vigil simulate` refuse what the API server refuses.
#[test]
fn reasons_are_bounded_as_the_crd_bounds_them() {
    let rule = |reasons: Vec<String>| json!([{"type": "KernelDeadlock", "status": "True", "duration": "5m", "reasons": reasons}]);
    let names = |n: usize| (0..n).map(|i| format!("Reason{i}")).collect::<Vec<_>>();
    assert!(nhc_policy(&edit(base_nhc(), "/spec/unhealthyConditions", Some(rule(names(32))))).is_ok());
    let errors = errors_of(&edit(base_nhc(), "/spec/unhealthyConditions", Some(rule(names(33)))));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.unhealthyConditions[0].reasons");
    assert_eq!(errors[0].value, "33 reasons");
    assert_eq!(errors[0].message, "must list at most 32 reasons");

    assert!(nhc_policy(&edit(base_nhc(), "/spec/unhealthyConditions", Some(rule(vec!["R".repeat(256)])))).is_ok());
    let long = "R".repeat(257);
    let errors = errors_of(&edit(base_nhc(), "/spec/unhealthyConditions", Some(rule(vec!["Ok".into(), long]))));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.unhealthyConditions[0].reasons[1]");
    assert!(errors[0].value.ends_with("(257 characters)"), "{}", errors[0].value);
    assert_eq!(errors[0].message, "must be at most 256 characters");
    // A MachineHealthCheck's rules have the same bounds.
    let mhc_rule = json!([{"type": "KernelDeadlock", "status": "True", "timeout": "5m", "reasons": names(40)}]);
    let errors = errors_of(&edit(base_mhc(), "/spec/unhealthyConditions", Some(mhc_rule)));
    assert_eq!(errors.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["spec.unhealthyConditions[0].reasons"]);
}

/// `plannedMaintenance`: on with a 10m grace by default, off when `enabled: false` (and for a
/// medik8s manifest, which has no such rule), a grace from 0 to 24h.
#[test]
fn planned_maintenance_is_on_by_default_and_its_grace_is_bounded() {
    let policy = nhc_policy(&base_nhc()).expect("valid");
    assert_eq!(policy.maintenance_grace, Some(SignedDuration::from_mins(10)));
    let off =
        nhc_policy(&edit(base_nhc(), "/spec/plannedMaintenance", Some(json!({"enabled": false})))).expect("valid");
    assert_eq!(off.maintenance_grace, None);
    let short = nhc_policy(&edit(base_nhc(), "/spec/plannedMaintenance", Some(json!({"grace": "0s"})))).expect("valid");
    assert_eq!(short.maintenance_grace, Some(SignedDuration::ZERO));
    let upstream = edit(base_nhc(), "/apiVersion", Some(json!("remediation.medik8s.io/v1alpha1")));
    assert_eq!(nhc_policy(&upstream).expect("valid").maintenance_grace, None, "upstream has no such rule");
    let upstream_on = edit(upstream, "/spec/plannedMaintenance", Some(json!({"grace": "5m"})));
    assert_eq!(nhc_policy(&upstream_on).expect("valid").maintenance_grace, Some(SignedDuration::from_mins(5)));
    for (grace, message) in [
        ("25h", "must be at most 24h: a longer grace hides a Node that did not come back"),
        ("-1m", "must not be negative"),
        ("soon", "is not a duration"),
    ] {
        let errors = errors_of(&edit(base_nhc(), "/spec/plannedMaintenance", Some(json!({"grace": grace}))));
        assert_eq!(errors.len(), 1, "{grace}: {errors:?}");
        assert_eq!((errors[0].path.as_str(), errors[0].value.as_str()), ("spec.plannedMaintenance.grace", grace));
        assert!(errors[0].message.starts_with(message), "{grace}: {}", errors[0].message);
    }
}

#[test]
fn reasons_are_opt_in_never_empty_or_repeated_and_match_only_what_they_list() {
    let mhc_rule =
        |reasons: Value| json!([{"type": "KernelDeadlock", "status": "True", "timeout": "5m", "reasons": reasons}]);
    let nhc_rule =
        |reasons: Value| json!([{"type": "KernelDeadlock", "status": "True", "duration": "5m", "reasons": reasons}]);
    // Off by default on both kinds: upstream manifests keep their meaning (any reason matches).
    assert!(
        mhc_policy(&base_mhc())
            .expect("valid")
            .rules()
            .all(|r| matches!(r, vigil_api::validate::RuleRef::Condition(c) if c.reasons.is_none()))
    );
    assert!(nhc_policy(&base_nhc()).expect("valid").conditions.iter().all(|r| r.reasons.is_none()));
    let listed = json!(["KernelHasDeadlock", "DockerHung"]);
    let mhc =
        mhc_policy(&edit(base_mhc(), "/spec/unhealthyConditions", Some(mhc_rule(listed.clone())))).expect("valid");
    let rule = &mhc.node_conditions[0];
    assert_eq!(rule.reasons.as_deref(), Some(&["KernelHasDeadlock".to_string(), "DockerHung".to_string()][..]));
    // (type, status, reason) -> matches
    let table = [
        (("KernelDeadlock", "True", Some("KernelHasDeadlock")), true),
        (("KernelDeadlock", "True", Some("DockerHung")), true),
        (("KernelDeadlock", "True", Some("kernelhasdeadlock")), false),
        (("KernelDeadlock", "True", Some("DiskFull")), false),
        (("KernelDeadlock", "True", None), false),
        (("KernelDeadlock", "False", Some("KernelHasDeadlock")), false),
        (("Ready", "True", Some("KernelHasDeadlock")), false),
    ];
    for ((t, s, reason), want) in table {
        assert_eq!(rule.matches(t, s, reason), want, "{t}={s} reason {reason:?}");
    }
    let any = &mhc_policy(&base_mhc()).expect("valid").node_conditions[0];
    assert!(any.matches("Ready", "False", None) && any.matches("Ready", "False", Some("Anything")));
    let nhc = nhc_policy(&edit(base_nhc(), "/spec/unhealthyConditions", Some(nhc_rule(listed)))).expect("valid");
    assert_eq!(nhc.conditions[0].reasons.as_ref().map(Vec::len), Some(2));
    let machine = mhc_policy(&edit(
        base_mhc(),
        "/spec/unhealthyMachineConditions",
        Some(json!([{"type": "NodeHealthy", "status": "False", "timeout": "5m", "reasons": ["NodeNotFound"]}])),
    ))
    .expect("valid on a Machine condition rule too");
    assert_eq!(machine.machine_conditions[0].reasons.as_deref(), Some(&["NodeNotFound".to_string()][..]));

    let empty = "must not be empty: leave reasons out";
    let cases = [
        (
            edit(base_mhc(), "/spec/unhealthyConditions", Some(mhc_rule(json!([])))),
            "spec.unhealthyConditions[0].reasons",
            "",
            empty,
        ),
        (
            edit(base_nhc(), "/spec/unhealthyConditions", Some(nhc_rule(json!([])))),
            "spec.unhealthyConditions[0].reasons",
            "",
            empty,
        ),
        (
            edit(
                base_mhc(),
                "/spec/unhealthyMachineConditions",
                Some(json!([{"type": "NodeHealthy", "status": "False", "timeout": "5m", "reasons": []}])),
            ),
            "spec.unhealthyMachineConditions[0].reasons",
            "",
            empty,
        ),
        (
            edit(
                base_mhc(),
                "/spec/unhealthyConditions",
                Some(mhc_rule(json!(["DiskFull", "DiskFailing", "DiskFull"]))),
            ),
            "spec.unhealthyConditions[0].reasons[2]",
            "DiskFull",
            "must be unique: the same reason is listed twice (spec.unhealthyConditions[0].reasons[0])",
        ),
        (
            edit(base_nhc(), "/spec/unhealthyConditions", Some(nhc_rule(json!(["DiskFull", " "])))),
            "spec.unhealthyConditions[0].reasons[1]",
            " ",
            "must not be empty: name a condition reason",
        ),
    ];
    for (object, path, value, message) in cases {
        let errors = errors_of(&object);
        assert!(
            matches!(errors.as_slice(), [e] if e.path == path && e.value == value && e.message.contains(message)),
            "want {path} = {value:?} ({message}), got {errors:?}"
        );
    }
    // A list that is not a list of strings is a shape error naming the field.
    let err = manifest::health_check_from_value(&edit(
        base_nhc(),
        "/spec/unhealthyConditions",
        Some(nhc_rule(json!("DiskFull"))),
    ))
    .expect_err("a string is not a list");
    assert!(err.to_string().contains("spec.unhealthyConditions[0].reasons"), "{err}");
}

// Over 80 lines on purpose: a table of refused per-rule remediations, one row each, and the
// policies the valid ones become.
#[test]
fn a_rules_own_remediation_is_opt_in_and_validated_as_the_checks_own() {
    let snr = template("SelfNodeRemediationTemplate", "reboot");
    let mdr = template("MachineDeletionRemediationTemplate", "replace");
    let nhc_rules = |rule: Value| {
        edit(
            base_nhc(),
            "/spec/unhealthyConditions",
            Some(json!([{"type": "Ready", "status": "False", "duration": "5m"}, rule])),
        )
    };
    // Off by default: every rule uses the check's own remediation.
    let p = nhc_policy(&base_nhc()).expect("valid");
    assert!(!p.per_rule_remediation());
    assert_eq!(p.all_steps().count(), 1);
    assert!(!mhc_policy(&base_mhc()).expect("valid").per_rule_remediation());

    // NodeHealthCheck: a rule's own template, or its own escalation (ordered, as the check's).
    let disk = json!({"type": "DiskFailing", "status": "True", "duration": "1m", "escalatingRemediations": [
        {"remediationTemplate": mdr, "order": 2, "timeout": "30m"},
        {"remediationTemplate": snr, "order": 1, "timeout": "5m"}]});
    let p = nhc_policy(&nhc_rules(disk)).expect("valid");
    assert!(p.per_rule_remediation());
    let all: Vec<&str> = p.all_steps().map(|s| s.template.name.as_str()).collect();
    assert_eq!(all, ["snr", "reboot", "replace"], "the check's own step first, then the rule's, lowest order first");
    let ladder = p.ladder(Some(1));
    assert_eq!((ladder.offset, ladder.steps.len()), (1, 2));
    assert_eq!(ladder.field, "spec.unhealthyConditions[1].escalatingRemediations");
    assert_eq!(
        ladder.describe(),
        "spec.unhealthyConditions[1].escalatingRemediations (SelfNodeRemediationTemplate medik8s/reboot, then MachineDeletionRemediationTemplate medik8s/replace)"
    );
    assert_eq!((p.ladder(Some(0)).offset, p.ladder(Some(0)).field.as_str()), (0, "spec.remediationTemplate"));
    assert_eq!(p.ladder(None).steps, &p.steps[..]);

    // MachineHealthCheck: a rule's own template (external), in the check's namespace.
    let metal = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3RemediationTemplate", "name": "reprovision"});
    let mhc = mhc_policy(&edit(
        base_mhc(),
        "/spec/unhealthyConditions/1",
        Some(json!({"type": "Ready", "status": "Unknown", "timeout": "300s", "remediationTemplate": metal})),
    ))
    .expect("valid");
    assert_eq!(
        mhc.templates().iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        ["Metal3RemediationTemplate team-a/reprovision"]
    );
    assert_eq!(mhc.remediation_of(Some(0)).1, "owner");
    assert_eq!(
        mhc.remediation_of(Some(1)).1,
        "spec.unhealthyConditions[1].remediationTemplate (Metal3RemediationTemplate team-a/reprovision)"
    );
    assert_eq!(mhc.remediation_of(None).1, "owner", "a verdict no rule makes gets the check's own");

    let both = "only one of remediationTemplate and escalatingRemediations may be set on a rule";
    let cases = [
        (
            nhc_rules(json!({"type": "DiskFailing", "status": "True", "duration": "1m", "remediationTemplate": snr,
                "escalatingRemediations": [{"remediationTemplate": mdr, "order": 1, "timeout": "5m"}]})),
            "spec.unhealthyConditions[1].remediationTemplate",
            "",
            both,
        ),
        (
            nhc_rules(json!({"type": "DiskFailing", "status": "True", "duration": "1m",
                "remediationTemplate": {"apiVersion": "a.io/v1", "kind": "RebootTemplate", "name": "r"}})),
            "spec.unhealthyConditions[1].remediationTemplate.namespace",
            "",
            "must not be empty: a NodeHealthCheck is cluster-scoped",
        ),
        (
            nhc_rules(json!({"type": "DiskFailing", "status": "True", "duration": "1m", "escalatingRemediations": [
                {"remediationTemplate": snr, "order": 1, "timeout": "5m"},
                {"remediationTemplate": mdr, "order": 1, "timeout": "5m"}]})),
            "spec.unhealthyConditions[1].escalatingRemediations[1].order",
            "1",
            "must be unique: spec.unhealthyConditions[1].escalatingRemediations[0] has the same order",
        ),
        (
            nhc_rules(json!({"type": "DiskFailing", "status": "True", "duration": "1m", "escalatingRemediations": [
                {"remediationTemplate": snr, "order": 1, "timeout": "30s"}]})),
            "spec.unhealthyConditions[1].escalatingRemediations[0].timeout",
            "30s",
            "must be at least 1m",
        ),
        (
            nhc_rules(json!({"type": "DiskFailing", "status": "True", "duration": "1m",
                "remediationTemplate": template("Reboot", "r")})),
            "spec.unhealthyConditions[1].remediationTemplate.kind",
            "Reboot",
            "must name a template kind ending in Template",
        ),
        (
            edits(
                nhc_rules(
                    json!({"type": "DiskFailing", "status": "True", "duration": "1m", "remediationTemplate": mdr}),
                ),
                &[unset("/spec/minHealthy"), set("/spec/maxUnhealthy", json!(1))],
            ),
            "spec.maxUnhealthy",
            "1",
            "cannot be combined with a MachineDeletionRemediationTemplate (spec.unhealthyConditions[1].remediationTemplate)",
        ),
        (
            edit(
                base_mhc(),
                "/spec/unhealthyConditions/0",
                Some(json!({"type": "Ready", "status": "False", "timeout": "300s",
                    "remediationTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3RemediationTemplate", "name": "r", "namespace": "other"}})),
            ),
            "spec.unhealthyConditions[0].remediationTemplate.namespace",
            "other",
            "must be the health check's own namespace \"team-a\"",
        ),
        (
            edit(
                base_mhc(),
                "/spec/unhealthyMachineConditions",
                Some(json!([{"type": "NodeHealthy", "status": "False", "timeout": "5m",
                    "remediationTemplate": {"apiVersion": "v1", "kind": "Metal3RemediationTemplate", "name": "r"}}])),
            ),
            "spec.unhealthyMachineConditions[0].remediationTemplate.apiVersion",
            "v1",
            "must be group/version",
        ),
    ];
    for (object, path, value, message) in cases {
        let errors = errors_of(&object);
        assert!(
            matches!(errors.as_slice(), [e] if e.path == path && e.value == value && e.message.contains(message)),
            "want {path} = {value:?} ({message}), got {errors:?}"
        );
    }
    // A MachineHealthCheck rule cannot escalate: the field is unknown there, refused by name.
    let escalating = edit(
        base_mhc(),
        "/spec/unhealthyConditions/0",
        Some(json!({"type": "Ready", "status": "False", "timeout": "300s", "escalatingRemediations": []})),
    );
    let err = manifest::health_check_from_value(&escalating).expect_err("unknown field");
    assert!(err.to_string().contains("spec.unhealthyConditions.0.escalatingRemediations: unknown field"), "{err}");
}

/// `spec.flapping` (NodeHealthCheck): off when absent (upstream manifests keep their meaning);
/// `episodes` from 2 to 20, `window` a Go duration from 1m to 24h and not shorter than the
/// longest rule duration; each refusal names the field and the value, and no policy comes of it.
#[test]
fn flapping_is_off_by_default_and_refused_naming_field_and_value() {
    assert_eq!(nhc_policy(&base_nhc()).expect("valid").flapping, None, "upstream manifests keep their meaning");
    let on = edit(base_nhc(), "/spec/flapping", Some(json!({"episodes": 3, "window": "1h"})));
    let f = nhc_policy(&on).expect("valid").flapping.expect("on");
    assert_eq!((f.episodes, f.window), (3, secs(3600)));
    for (episodes, window) in [(2, "5m"), (20, "24h")] {
        let ok = edit(base_nhc(), "/spec/flapping", Some(json!({"episodes": episodes, "window": window})));
        assert!(nhc_policy(&ok).is_ok(), "{episodes} {window}");
    }
    let rows = [
        (json!({"episodes": 1, "window": "1h"}), "spec.flapping.episodes", "1", "at least 2 and at most 20"),
        (json!({"episodes": 21, "window": "1h"}), "spec.flapping.episodes", "21", "at least 2 and at most 20"),
        (json!({"episodes": 3, "window": "soon"}), "spec.flapping.window", "soon", "duration"),
        (json!({"episodes": 3, "window": "30s"}), "spec.flapping.window", "30s", "at least 1m and at most 24h"),
        (json!({"episodes": 3, "window": "25h"}), "spec.flapping.window", "25h", "at least 1m and at most 24h"),
        (
            json!({"episodes": 3, "window": "4m"}),
            "spec.flapping.window",
            "4m",
            "not be shorter than the longest rule duration (the longest is 5m0s)",
        ),
    ];
    for (flapping, path, value, words) in rows {
        let check = edit(base_nhc(), "/spec/flapping", Some(flapping.clone()));
        let errors = errors_of(&check);
        assert_eq!(errors.len(), 1, "{flapping}: one error: {errors:?}");
        assert_eq!((errors[0].path.as_str(), errors[0].value.as_str()), (path, value), "{flapping}");
        assert!(errors[0].message.contains(words), "{flapping}: {errors:?}");
        assert!(errors[0].to_string().contains(&format!("{value:?}")), "the value is quoted: {}", errors[0]);
    }
    let long_rule = edits(
        base_nhc(),
        &[
            ("/spec/unhealthyConditions", Some(json!([{"type": "Ready", "status": "False", "duration": "2h"}]))),
            ("/spec/flapping", Some(json!({"episodes": 3, "window": "1h"}))),
        ],
    );
    let errors = errors_of(&long_rule);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].message.contains("(the longest is 2h0m0s)"), "{errors:?}");
}

/// `spec.unhealthyExpressions` (NodeHealthCheck): none by default; each expression is compiled
/// with the policy and each duration parsed as a condition rule's; a refusal names the field
/// (`spec.unhealthyExpressions[i].expression` or `.duration`) and the value, and no policy comes
/// of it (an invalid policy remediates nothing).
#[test]
fn expressions_are_compiled_with_the_policy_and_refused_naming_field_and_value() {
    assert!(nhc_policy(&base_nhc()).expect("valid").expressions.is_empty(), "none by default");
    let good = json!([{"expression": "node.unschedulable", "duration": "5m"}]);
    let on = edit(base_nhc(), "/spec/unhealthyExpressions", Some(good));
    let rules = nhc_policy(&on).expect("valid").expressions;
    assert_eq!(rules.len(), 1);
    assert_eq!((rules[0].expression.source(), rules[0].duration), ("node.unschedulable", secs(300)));
    assert_eq!(rules[0].path, "spec.unhealthyExpressions[0]");
    let costly = "node.taints.all(t, node.labels.exists(k, k == t.key))";
    let rows = [
        ("node.labels[", "5m", "spec.unhealthyExpressions[1].expression", "node.labels[", "does not compile"),
        (costly, "5m", "spec.unhealthyExpressions[1].expression", costly, "over the limit of 100000"),
        ("pod.ready", "5m", "spec.unhealthyExpressions[1].expression", "pod.ready", "unknown variable \"pod\""),
        ("node.unschedulable", "soon", "spec.unhealthyExpressions[1].duration", "soon", "duration"),
        ("node.unschedulable", "-1m", "spec.unhealthyExpressions[1].duration", "-1m", "must not be negative"),
    ];
    for (expression, duration, path, value, words) in rows {
        let list = json!([
            {"expression": "node.unschedulable", "duration": "5m"},
            {"expression": expression, "duration": duration},
        ]);
        let check = edit(base_nhc(), "/spec/unhealthyExpressions", Some(list));
        let errors = errors_of(&check);
        assert_eq!(errors.len(), 1, "{expression} {duration}: one error: {errors:?}");
        assert_eq!((errors[0].path.as_str(), errors[0].value.as_str()), (path, value), "{expression}");
        assert!(errors[0].message.contains(words), "{expression}: {errors:?}");
        assert!(!errors[0].message.contains(path), "the path is said once: {}", errors[0]);
        assert!(errors[0].to_string().contains(&format!("{value:?}")), "the value is quoted: {}", errors[0]);
    }
    let many: Vec<Value> = (0..17).map(|_| json!({"expression": "node.unschedulable", "duration": "1m"})).collect();
    let errors = errors_of(&edit(base_nhc(), "/spec/unhealthyExpressions", Some(Value::Array(many))));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.unhealthyExpressions");
    assert!(errors[0].message.contains("at most 16"), "{errors:?}");
}

/// A MachineHealthCheck's `spec.unhealthyExpressions` (over `node` and `machine`, each with a
/// `timeout` and at most an own `remediationTemplate`) and `spec.flapping`: the same rules as a
/// NodeHealthCheck's, each refusal naming the field and the value; the flapping window covers
/// every rule's timeout, expressions included. A NodeHealthCheck's expression may not read
/// `machine` (its targets have none) and its window covers its expressions' durations too.
#[test]
fn a_machine_health_checks_expressions_and_flapping_are_checked_as_a_node_health_checks() {
    let good = json!([{"expression": "machine.phase == 'Failed' || node.unschedulable", "timeout": "5m"}]);
    let on = edit(base_mhc(), "/spec/unhealthyExpressions", Some(good));
    let policy = mhc_policy(&on).expect("valid");
    assert_eq!(policy.expressions.len(), 1);
    assert_eq!(policy.expressions[0].path, "spec.unhealthyExpressions[0]");
    assert_eq!(policy.expression_rule(0), policy.machine_conditions.len() + policy.node_conditions.len());
    assert_eq!(mhc_policy(&base_mhc()).expect("valid").flapping, None, "off by default");
    let rows = [
        (
            "/spec/unhealthyExpressions",
            json!([{"expression": "machine.labels[", "timeout": "5m"}]),
            "spec.unhealthyExpressions[0].expression",
            "machine.labels[",
            "does not compile",
        ),
        (
            "/spec/unhealthyExpressions",
            json!([{"expression": "node.unschedulable", "timeout": "soon"}]),
            "spec.unhealthyExpressions[0].timeout",
            "soon",
            "duration",
        ),
        (
            "/spec/unhealthyExpressions",
            json!([{"expression": "node.unschedulable", "timeout": "1m",
                    "remediationTemplate": {"apiVersion": "x.io/v1", "kind": "Reboot", "name": "r"}}]),
            "spec.unhealthyExpressions[0].remediationTemplate.kind",
            "Reboot",
            "ending in Template",
        ),
        ("/spec/flapping", json!({"episodes": 1, "window": "1h"}), "spec.flapping.episodes", "1", "at least 2"),
        ("/spec/flapping", json!({"episodes": 3, "window": "4m"}), "spec.flapping.window", "4m", "the longest is"),
    ];
    for (pointer, value, path, shown, words) in rows {
        let errors = errors_of(&edit(base_mhc(), pointer, Some(value.clone())));
        assert_eq!(errors.len(), 1, "{value}: one error: {errors:?}");
        assert_eq!((errors[0].path.as_str(), errors[0].value.as_str()), (path, shown), "{value}");
        assert!(errors[0].message.contains(words), "{value}: {errors:?}");
    }
    // the window covers an expression's timeout
    let long_expression = edits(
        base_mhc(),
        &[
            ("/spec/unhealthyExpressions", Some(json!([{"expression": "node.unschedulable", "timeout": "2h"}]))),
            ("/spec/flapping", Some(json!({"episodes": 3, "window": "1h"}))),
        ],
    );
    let errors = errors_of(&long_expression);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].message.contains("(the longest is 2h0m0s)"), "{errors:?}");
    let long_nhc = edits(
        base_nhc(),
        &[
            ("/spec/unhealthyExpressions", Some(json!([{"expression": "node.unschedulable", "duration": "2h"}]))),
            ("/spec/flapping", Some(json!({"episodes": 3, "window": "1h"}))),
        ],
    );
    assert!(errors_of(&long_nhc)[0].message.contains("(the longest is 2h0m0s)"));
    let reads_machine = json!([{"expression": "machine.phase == 'Failed'", "duration": "1m"}]);
    let errors = errors_of(&edit(base_nhc(), "/spec/unhealthyExpressions", Some(reads_machine)));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.unhealthyExpressions[0].expression");
    assert!(errors[0].message.contains("reads `machine`"), "{errors:?}");
}
