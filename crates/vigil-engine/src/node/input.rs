//! What a NodeHealthCheck decision observes: the check, its policy, the Nodes it needs, the
//! templates of its steps and the remediation objects of their kinds.

use crate::lookup::Observed;
use crate::target::is_control_plane;
use vigil_api::NodeHealthCheck;
use vigil_api::validate::NhcPolicy;
use vigil_api::views::{ClusterVersionView, LeaseView, MaintenanceView, NodeView, OpenShiftMachineView};
use vigil_api::views::{RemediationView, TemplateView};
use vigil_api::well_known::DEFAULT_LEASE_NAMESPACE;

/// Everything a NodeHealthCheck decision looks at.
pub struct NhcInput<'a> {
    /// The check (metadata, current status).
    pub check: &'a NodeHealthCheck,
    /// Its validated spec.
    pub policy: &'a NhcPolicy,
    /// The Nodes of the cluster; the engine applies the selector. Every Node is always right;
    /// passing only those [`needs_node`] keeps plus every Node a remediation object names
    /// ([`crate::concerns::remediation_node_name`]) gives the same plan, so an adapter need not hand over the whole
    /// cluster to each check.
    pub nodes: &'a [&'a NodeView],
    /// The template of each of [`NhcPolicy::all_steps`] (the check's own steps, then its rules'),
    /// same order; `None` when it was not found.
    pub templates: &'a [Option<&'a TemplateView>],
    /// Remediation objects of all the steps' kinds in the templates' namespaces, whoever owns them.
    pub remediations: &'a [&'a RemediationView],
    /// What else the decision reads: node Leases, planned maintenance, the cluster's version.
    pub around: Around<'a>,
}

/// What a NodeHealthCheck decision reads beyond its Nodes and remediation objects: who else
/// works on the Nodes (their Leases, planned maintenance) and whether the cluster is being
/// upgraded. [`Around::default`] is a cluster with none of these kinds served and no Lease.
#[derive(Debug, Clone, Copy)]
pub struct Around<'a> {
    /// The Leases of the lease namespace (every one is fine: the decision looks up
    /// `node-<name>`); a Node's remediation starts with its Lease ([`crate::node_lease`]).
    pub leases: &'a [&'a LeaseView],
    /// Where the node Leases live (`medik8s-leases` unless configured).
    pub lease_namespace: &'a str,
    /// medik8s `NodeMaintenance` objects ([`crate::maintenance`]).
    pub maintenances: Observed<'a, &'a [&'a MaintenanceView]>,
    /// OpenShift `ClusterVersion`s ([`crate::upgrade`]).
    pub cluster_versions: Observed<'a, &'a [&'a ClusterVersionView]>,
    /// OpenShift Machine API `Machine`s: a Node's Machine (its `machine.openshift.io/machine`
    /// annotation) owns the Node's remediation objects in its namespace, as medik8s makes them.
    pub machines: Observed<'a, &'a [&'a OpenShiftMachineView]>,
}

impl Default for Around<'_> {
    fn default() -> Self {
        Around {
            leases: &[],
            lease_namespace: DEFAULT_LEASE_NAMESPACE,
            maintenances: Observed::NotServed,
            cluster_versions: Observed::NotServed,
            machines: Observed::NotServed,
        }
    }
}

/// Whether a decision of the check with `policy` reads `node`: the check selects it, or it is a
/// control-plane Node (at most one of those is remediated at a time, whoever selects it). Other
/// Nodes only matter through the remediation objects that name them
/// ([`crate::concerns::remediation_node_name`]).
pub fn needs_node(policy: &NhcPolicy, node: &NodeView) -> bool {
    is_control_plane(node) || node.labels.selected_by(&policy.selector)
}
