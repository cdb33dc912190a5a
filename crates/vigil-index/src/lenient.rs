//! Health checks read leniently: a check whose spec does not parse is still kept, with an empty
//! spec that selects nothing and the error, so that its status can say what is wrong while
//! nothing is decided from it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use vigil_api::{MachineHealthCheck, MachineHealthCheckSpec, NodeHealthCheck, NodeHealthCheckSpec};

/// The object's metadata, or empty metadata when even that does not parse.
fn metadata(value: &Value) -> ObjectMeta {
    value.get("metadata").and_then(|m| serde_json::from_value(m.clone()).ok()).unwrap_or_default()
}

/// A check's object read in two parts: its status taken out and read by value (its strings
/// move, none is copied: a large check's `targets` list is thousands of names), the rest (small)
/// read from a borrow, so that a spec that does not parse can still be read leniently. The same
/// as reading the whole object: the error is the spec's (read first) or else the status's, and
/// the status read (when it parses) is returned for the lenient reading either way.
fn split_read<C: serde::de::DeserializeOwned, S: serde::de::DeserializeOwned>(
    mut value: Value,
    with_status: fn(C, Option<S>) -> C,
) -> (Result<C, serde_json::Error>, Value, Option<S>) {
    let status = value.as_object_mut().and_then(|o| o.remove("status")).map(serde_json::from_value::<S>);
    match (C::deserialize(&value), status) {
        (Ok(c), None) => (Ok(with_status(c, None)), value, None),
        (Ok(c), Some(Ok(s))) => (Ok(with_status(c, Some(s))), value, None),
        (Ok(_), Some(Err(e))) => (Err(e), value, None),
        (Err(e), status) => (Err(e), value, status.and_then(Result::ok)),
    }
}

/// Reads a health check leniently: a spec that does not parse still yields an object (with an
/// empty spec) and the error, so its status can say what is wrong.
pub fn read_mhc(value: Value) -> (MachineHealthCheck, Option<String>) {
    let (read, value, status) = split_read(value, |c: MachineHealthCheck, status| MachineHealthCheck { status, ..c });
    match read {
        Ok(c) => (c, None),
        Err(e) => {
            let spec = MachineHealthCheckSpec {
                cluster_name: String::new(),
                selector: Default::default(),
                unhealthy_conditions: Vec::new(),
                unhealthy_machine_conditions: Vec::new(),
                node_startup_timeout: None,
                max_unhealthy: None,
                unhealthy_range: None,
                remediation_template: None,
                dry_run: false,
                backoff: None,
                failure_domains: None,
                max_in_flight: None,
                voluntary_disruptions: None,
                flapping: None,
                unhealthy_expressions: Vec::new(),
            };
            let mut c = MachineHealthCheck::new("", spec);
            c.metadata = metadata(&value);
            c.status = status;
            (c, Some(format!("spec cannot be read: {e}")))
        }
    }
}

/// The spec a NodeHealthCheck whose own spec cannot be read stands on: it selects nothing, so
/// its status can say what is wrong while nothing is decided from it.
pub fn empty_nhc_spec() -> NodeHealthCheckSpec {
    NodeHealthCheckSpec {
        selector: Default::default(),
        unhealthy_conditions: Vec::new(),
        min_healthy: None,
        max_unhealthy: None,
        remediation_template: None,
        escalating_remediations: Vec::new(),
        pause_requests: Vec::new(),
        healthy_delay: None,
        storm_cooldown_duration: None,
        dry_run: false,
        backoff: None,
        failure_domains: None,
        max_in_flight: None,
        voluntary_disruptions: None,
        flapping: None,
        unhealthy_expressions: Vec::new(),
        planned_maintenance: None,
    }
}

/// [`read_mhc`] for a NodeHealthCheck.
pub fn read_nhc(value: Value) -> (NodeHealthCheck, Option<String>) {
    let (read, value, status) = split_read(value, |c: NodeHealthCheck, status| NodeHealthCheck { status, ..c });
    match read {
        Ok(c) => (c, None),
        Err(e) => {
            let spec = empty_nhc_spec();
            let mut c = NodeHealthCheck::new("", spec);
            c.metadata = metadata(&value);
            c.status = status;
            (c, Some(format!("spec cannot be read: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize as _;
    use serde_json::json;

    fn check(spec: Value, status: Value) -> Value {
        json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
               "metadata": {"name": "workers", "namespace": "ns", "resourceVersion": "7"},
               "spec": spec, "status": status})
    }

    fn spec() -> Value {
        json!({"clusterName": "prod", "selector": {"matchLabels": {"pool": "a"}},
               "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m"}]})
    }

    /// A check that parses reads exactly as the whole object does, its status included.
    #[test]
    fn a_readable_check_reads_as_the_whole_object() {
        let v = check(spec(), json!({"targets": ["m1", "m2"], "currentHealthy": 2, "expectedMachines": 2}));
        let json = |c: &MachineHealthCheck| serde_json::to_value(c).expect("json");
        let whole = MachineHealthCheck::deserialize(&v).expect("readable");
        let (read, error) = read_mhc(v.clone());
        assert_eq!((json(&read), error), (json(&whole), None));
        assert_eq!(read.status.map(|s| s.targets.len()), Some(2));
        let bare = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                          "metadata": {"name": "w"}, "spec": spec()});
        assert_eq!(json(&read_mhc(bare.clone()).0), json(&MachineHealthCheck::deserialize(&bare).expect("readable")));
    }

    /// A spec that does not parse keeps the check's metadata and status, with an empty spec and
    /// the error; a status that does not parse is an error too, and no status is kept.
    #[test]
    fn what_does_not_parse_is_told_and_the_rest_kept() {
        let status = json!({"targets": ["m1"], "currentHealthy": 1});
        let (c, error) = read_mhc(check(json!({"clusterName": 7}), status.clone()));
        assert_eq!(c.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(c.status.map(|s| s.targets), Some(vec!["m1".to_string()]));
        assert!(c.spec.cluster_name.is_empty() && c.spec.unhealthy_conditions.is_empty());
        assert!(error.as_deref().is_some_and(|e| e.starts_with("spec cannot be read: invalid type")), "{error:?}");

        let (c, error) = read_mhc(check(spec(), json!({"currentHealthy": "many"})));
        assert!(c.status.is_none() && c.spec.cluster_name.is_empty(), "as the whole object read fails");
        assert!(error.is_some_and(|e| e.contains("invalid type")));

        let (n, error) = read_nhc(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": "n"}, "spec": {"selector": 3}, "status": {"observedNodes": 4}}));
        assert_eq!((n.status.map(|s| s.observed_nodes), error.is_some()), (Some(4), true));
    }
}
