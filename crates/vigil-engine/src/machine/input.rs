//! What a MachineHealthCheck decision observes: the check, its policy, its Cluster, Machines,
//! Nodes, template and remediation objects, borrowed from whichever adapter gathered them.

use crate::lookup::Lookup;
use k8s_openapi::api::core::v1::Node;
use vigil_api::MachineHealthCheck;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::{ClusterView, MachineView, RemediationView, TemplateView};

/// Where the Nodes of the check's cluster are read from.
#[derive(Clone, Copy)]
pub enum NodeSource<'a> {
    /// The cluster answered: its Nodes by name.
    Reachable(&'a dyn Lookup<Node>),
    /// The cluster could not be reached (why, for the operator); no verdict is made.
    Unreachable(&'a str),
}

/// Everything a MachineHealthCheck decision looks at.
pub struct MhcInput<'a> {
    /// The check (metadata, current status).
    pub check: &'a MachineHealthCheck,
    /// Its validated spec.
    pub policy: &'a MhcPolicy,
    /// The Cluster named by `clusterName`, if found.
    pub cluster: Option<&'a ClusterView>,
    /// Machines in the check's namespace; the engine applies the selector. Sorted by name is
    /// fastest (the engine then only checks the order instead of sorting).
    pub machines: &'a [&'a MachineView],
    /// The Nodes of the workload cluster.
    pub nodes: NodeSource<'a>,
    /// The remediation template, when the policy names one and it was found.
    pub template: Option<&'a TemplateView>,
    /// Remediation objects of the template's remediation kind in the check's namespace, by name.
    pub remediations: &'a dyn Lookup<RemediationView>,
}
