//! What a MachineHealthCheck decision observes: the check, its policy, its Cluster, Machines,
//! Nodes, template and remediation objects, borrowed from whichever adapter gathered them.

use crate::lookup::Lookup;
use vigil_api::MachineHealthCheck;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::NodeView;
use vigil_api::views::{ClusterView, MachineView, RemediationView, TemplateView};

/// Where the Nodes of the check's cluster are read from.
#[derive(Clone, Copy)]
pub enum NodeSource<'a> {
    /// The cluster answered: its Nodes by name.
    Reachable(&'a dyn Lookup<NodeView>),
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
    /// Machines in the check's namespace; the engine applies the selector unless
    /// `machines_selected`. Sorted by name is fastest (the engine then only checks the order
    /// instead of sorting).
    pub machines: &'a [&'a MachineView],
    /// Whether `machines` are already exactly the check's targets (those
    /// [`crate::target::is_target`] selects: the controller's index keeps each check's), so the
    /// selector is not matched against every Machine again at each decision.
    pub machines_selected: bool,
    /// The Nodes of the workload cluster.
    pub nodes: NodeSource<'a>,
    /// The templates the policy names ([`MhcPolicy::templates`]: the check's own, then its rules'),
    /// same order; `None` for one that was not found.
    pub templates: &'a [Option<&'a TemplateView>],
    /// For each of [`MhcPolicy::templates`], same order: the remediation objects of its
    /// remediation kind in the check's namespace, by name (templates of one kind may share one).
    pub remediations: &'a [&'a dyn Lookup<RemediationView>],
}

impl<'a> MhcInput<'a> {
    /// Whether `machine`'s remediator is still finishing: a remediation object made for it is
    /// being deleted (a finalizer holds it). Until the object is gone the Machine is not healthy
    /// for the budgets and stays in flight, as a NodeHealthCheck's Node does
    /// (docs/beside-medik8s.md, "Remediators finishing").
    pub(super) fn remediator_finishing(&self, machine: &MachineView) -> bool {
        !self.remediations.is_empty()
            && self.objects_named(machine).iter().any(|o| o.meta.deleting && crate::target::made_for(o, machine))
    }

    /// The remediation objects named after `machine` in the check's remediation kinds, each once
    /// (templates of one kind share their objects).
    pub(super) fn objects_named(&self, machine: &MachineView) -> Vec<&'a RemediationView> {
        let mut found: Vec<&RemediationView> = Vec::new();
        for object in self.remediations.iter().filter_map(|l| l.lookup(&machine.meta.name)) {
            if !found.iter().any(|f| f.meta.kind == object.meta.kind && f.meta.api_version == object.meta.api_version) {
                found.push(object);
            }
        }
        found
    }
}
