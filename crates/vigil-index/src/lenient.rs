//! Health checks read leniently: a check whose spec does not parse is still kept, with an empty
//! spec that selects nothing and the error, so that its status can say what is wrong while
//! nothing is decided from it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize as _;
use serde_json::Value;
use vigil_api::{MachineHealthCheck, MachineHealthCheckSpec, NodeHealthCheck, NodeHealthCheckSpec};

/// The object's metadata, or empty metadata when even that does not parse.
fn metadata(value: &Value) -> ObjectMeta {
    value.get("metadata").and_then(|m| serde_json::from_value(m.clone()).ok()).unwrap_or_default()
}

/// Reads a health check leniently: a spec that does not parse still yields an object (with an
/// empty spec) and the error, so its status can say what is wrong.
pub fn read_mhc(value: Value) -> (MachineHealthCheck, Option<String>) {
    match MachineHealthCheck::deserialize(&value) {
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
            c.status = value.get("status").and_then(|s| serde_json::from_value(s.clone()).ok());
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
    match NodeHealthCheck::deserialize(&value) {
        Ok(c) => (c, None),
        Err(e) => {
            let spec = empty_nhc_spec();
            let mut c = NodeHealthCheck::new("", spec);
            c.metadata = metadata(&value);
            c.status = value.get("status").and_then(|s| serde_json::from_value(s.clone()).ok());
            (c, Some(format!("spec cannot be read: {e}")))
        }
    }
}
