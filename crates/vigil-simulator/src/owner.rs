//! The scenario's owner model (a MachineSet-like owner), as pure rules: which Machine it replaces,
//! when it waits, and what it makes. The simulator plays it on its store; the twin test plays the
//! same rules on a live API server, so both worlds replace the same Machines alike.

use serde_json::{Value, json};
use vigil_api::conditions::{ConditionStatus, find};
use vigil_api::views::MachineView;
use vigil_api::well_known::{
    CLUSTER_NAME_LABEL, HEALTH_CHECK_SUCCEEDED, OWNER_REMEDIATED, PAUSED_ANNOTATION, REMEDIATE_MACHINE_ANNOTATION,
};

/// Whether Vigil asked the owner to replace `machine`: its `HealthCheckSucceeded` and
/// `OwnerRemediated` are both `False`, as Cluster API's MachineSet requires (a Machine that
/// recovered first is left alone).
pub fn asked(machine: &Value) -> bool {
    MachineView::read(machine).is_some_and(|m| {
        let is_false = |t: &str| find(&m.conditions, t).is_some_and(|c| c.status == ConditionStatus::False);
        is_false(HEALTH_CHECK_SUCCEEDED) && is_false(OWNER_REMEDIATED)
    })
}

/// The Cluster a Machine belongs to (its cluster-name label), `""` when it names none.
pub fn cluster_name(machine: &Value) -> &str {
    machine["metadata"]["labels"][CLUSTER_NAME_LABEL].as_str().unwrap_or("")
}

/// Whether Cluster API's controllers leave `machine` alone for now: it or its Cluster carries the
/// paused annotation, or the Cluster has `spec.paused`. The owner acts once the pause is lifted.
pub fn paused(machine: &Value, cluster: Option<&Value>) -> bool {
    let annotated = |o: &Value| o["metadata"]["annotations"].get(PAUSED_ANNOTATION).is_some();
    annotated(machine) || cluster.is_some_and(|c| c["spec"]["paused"].as_bool() == Some(true) || annotated(c))
}

/// The name of the `seq`-th replacement of Machine `name`: `<base>-r<seq>`, where a name that is
/// itself a replacement's keeps its base, so a twice-replaced Machine is still found by its base.
pub fn replacement_name(name: &str, seq: u64) -> String {
    let base = name
        .rsplit_once("-r")
        .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map_or(name, |(b, _)| b);
    format!("{base}-r{seq}")
}

/// The replacement of `old`, named `name`: its apiVersion, namespace, labels (but the remediation
/// request) and spec; no status, no Node yet.
pub fn replacement(old: &Value, name: &str, namespace: &str) -> Value {
    let mut labels = old["metadata"]["labels"].clone();
    if let Some(map) = labels.as_object_mut() {
        map.remove(REMEDIATE_MACHINE_ANNOTATION);
    }
    let labels = if labels.is_object() { labels } else { json!({}) };
    let mut fresh = json!({"apiVersion": old["apiVersion"], "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": labels}});
    if let Some(spec) = old.get("spec") {
        fresh["spec"] = spec.clone();
    }
    fresh
}

/// A Node that joined just now, Ready, stamped `now` (RFC 3339).
pub fn joined_node(name: &str, now: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
}

/// The `status.nodeRef` a Machine of `api_version` gets for Node `name` (v1beta1 carries the
/// Node's apiVersion and kind, v1beta2 its name only).
pub fn node_ref(api_version: &str, name: &str) -> Value {
    if api_version.ends_with("v1beta1") {
        json!({"apiVersion": "v1", "kind": "Node", "name": name})
    } else {
        json!({"name": name})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(conditions: Value) -> Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns", "labels": {CLUSTER_NAME_LABEL: "c", REMEDIATE_MACHINE_ANNOTATION: ""}},
            "spec": {"clusterName": "c"}, "status": {"conditions": conditions}})
    }

    #[test]
    fn the_owner_replaces_only_a_machine_both_conditions_ask_for() {
        let cond = |t: &str, s: &str| json!({"type": t, "status": s, "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let both = machine(json!([cond(HEALTH_CHECK_SUCCEEDED, "False"), cond(OWNER_REMEDIATED, "False")]));
        assert!(asked(&both));
        let recovered = machine(json!([cond(HEALTH_CHECK_SUCCEEDED, "True"), cond(OWNER_REMEDIATED, "False")]));
        assert!(!asked(&recovered));
        assert!(!asked(&machine(json!([cond(HEALTH_CHECK_SUCCEEDED, "False")]))));
    }

    #[test]
    fn a_pause_on_the_machine_or_its_cluster_holds_the_owner() {
        let m = machine(json!([]));
        assert_eq!(cluster_name(&m), "c");
        assert!(!paused(&m, None));
        assert!(!paused(&m, Some(&json!({"spec": {"paused": false}}))));
        assert!(paused(&m, Some(&json!({"spec": {"paused": true}}))));
        assert!(paused(&m, Some(&json!({"metadata": {"annotations": {PAUSED_ANNOTATION: ""}}}))));
        let mut annotated = m.clone();
        annotated["metadata"]["annotations"] = json!({PAUSED_ANNOTATION: ""});
        assert!(paused(&annotated, None));
    }

    #[test]
    fn a_replacement_keeps_its_base_name_labels_and_spec() {
        assert_eq!(replacement_name("w-a3", 1), "w-a3-r1");
        assert_eq!(replacement_name("w-a3-r1", 4), "w-a3-r4");
        assert_eq!(replacement_name("w-r", 2), "w-r-r2");
        let fresh = replacement(&machine(json!([])), "m-r1", "ns");
        assert_eq!(fresh["metadata"]["labels"], json!({CLUSTER_NAME_LABEL: "c"}));
        assert_eq!(fresh["spec"], json!({"clusterName": "c"}));
        assert!(fresh.get("status").is_none());
        assert_eq!(node_ref("cluster.x-k8s.io/v1beta1", "n")["kind"], "Node");
        assert_eq!(node_ref("cluster.x-k8s.io/v1beta2", "n"), json!({"name": "n"}));
    }
}
