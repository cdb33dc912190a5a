//! NodeHealthCheck rules (medik8s semantics). Being written: see the module's final version.

use crate::plan::Plan;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::validate::NhcPolicy;
use vigil_api::views::{RemediationView, TemplateView};

/// Everything a NodeHealthCheck decision looks at.
pub struct NhcInput<'a> {
    /// The check (metadata, current status).
    pub check: &'a NodeHealthCheck,
    /// Its validated spec.
    pub policy: &'a NhcPolicy,
    /// Every Node of the cluster; the engine applies the selector.
    pub nodes: &'a [&'a Node],
    /// The template of each of `policy.steps`, same order; `None` when it was not found.
    pub templates: &'a [Option<&'a TemplateView>],
    /// Remediation objects of the steps' kinds in the templates' namespaces, whoever owns them.
    pub remediations: &'a [&'a RemediationView],
}

/// Decides what a NodeHealthCheck should do now.
pub fn decide(input: &NhcInput<'_>, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    let _ = (input, now);
    todo!("being written")
}
