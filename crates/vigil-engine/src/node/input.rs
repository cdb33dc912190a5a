//! What a NodeHealthCheck decision observes: the check, its policy, the Nodes it needs, the
//! templates of its steps and the remediation objects of their kinds.

use crate::target::is_control_plane;
use vigil_api::NodeHealthCheck;
use vigil_api::validate::NhcPolicy;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};

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
}

/// Whether a decision of the check with `policy` reads `node`: the check selects it, or it is a
/// control-plane Node (at most one of those is remediated at a time, whoever selects it). Other
/// Nodes only matter through the remediation objects that name them
/// ([`crate::concerns::remediation_node_name`]).
pub fn needs_node(policy: &NhcPolicy, node: &NodeView) -> bool {
    is_control_plane(node) || node.labels.selected_by(&policy.selector)
}
