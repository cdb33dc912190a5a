//! Voluntary disruptions in the budget (`spec.voluntaryDisruptions: Count`): a target being taken
//! down on purpose counts as unavailable in `maxUnhealthy` / `unhealthyRange` / `minHealthy`, in
//! the failure-domain budgets and in `maxInFlight`, as a target that is not healthy does, so
//! remediation together with a rollout, a scale-down, a consolidation or a reboot wave never takes
//! down more than the budget allows. The signals, in the order a target is counted under
//! (docs/features.md names them for operators):
//! - `Deleting`: the Machine or its Node has a `deletionTimestamp` (a MachineDeployment rollout,
//!   a MachineSet scale-down, a Node being removed);
//! - `ClusterAutoscaler`: the Node has the cluster autoscaler's `ToBeDeletedByClusterAutoscaler`
//!   taint (it is draining the Node to delete it);
//! - `Karpenter`: the Node has Karpenter's `karpenter.sh/disrupted` taint (v1), or
//!   `karpenter.sh/disruption` (v1beta1);
//! - `Kured`: the Node is cordoned with kured's `weave.works/kured-reboot-in-progress` annotation;
//! - `NodeMaintenance`: a medik8s `NodeMaintenance` names the Node (NodeHealthCheck only: it is
//!   read from the cluster the check runs in), or the Node is cordoned with the node maintenance
//!   operator's `medik8s.io/drain` taint.
//!
//! A target counts once, under its first signal; a target already not healthy is not counted
//! again. A cordon alone is no signal: `kubectl cordon` says nothing of why.

use vigil_api::shared::DisruptionCount;
use vigil_api::views::{MachineView, NodeView};
use vigil_api::well_known::{
    CLUSTER_AUTOSCALER_DELETE_TAINT, KARPENTER_DISRUPTED_TAINT, KARPENTER_DISRUPTION_TAINT_V1BETA1,
    KURED_REBOOT_IN_PROGRESS_ANNOTATION, MEDIK8S_DRAIN_TAINT,
};

/// Why a target is being taken down on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    /// The Machine or the Node is being deleted.
    Deleting,
    /// The cluster autoscaler is removing the Node.
    ClusterAutoscaler,
    /// Karpenter is disrupting the Node.
    Karpenter,
    /// kured is rebooting the Node.
    Kured,
    /// The Node is under node maintenance.
    NodeMaintenance,
}

/// Every signal, in the order a target is counted under.
const SIGNALS: [Signal; 5] =
    [Signal::Deleting, Signal::ClusterAutoscaler, Signal::Karpenter, Signal::Kured, Signal::NodeMaintenance];

impl Signal {
    /// The name status and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Deleting => "Deleting",
            Signal::ClusterAutoscaler => "ClusterAutoscaler",
            Signal::Karpenter => "Karpenter",
            Signal::Kured => "Kured",
            Signal::NodeMaintenance => "NodeMaintenance",
        }
    }
}

/// The signal a Node carries; `maintained`: whether a `NodeMaintenance` names it.
pub fn of_node(node: &NodeView, maintained: bool) -> Option<Signal> {
    if node.deleting {
        Some(Signal::Deleting)
    } else if node.has_taint(CLUSTER_AUTOSCALER_DELETE_TAINT) {
        Some(Signal::ClusterAutoscaler)
    } else if node.has_taint(KARPENTER_DISRUPTED_TAINT) || node.has_taint(KARPENTER_DISRUPTION_TAINT_V1BETA1) {
        Some(Signal::Karpenter)
    } else if node.unschedulable && node.annotation(KURED_REBOOT_IN_PROGRESS_ANNOTATION).is_some() {
        Some(Signal::Kured)
    } else if maintained || (node.unschedulable && node.has_taint(MEDIK8S_DRAIN_TAINT)) {
        Some(Signal::NodeMaintenance)
    } else {
        None
    }
}

/// The signal a Machine carries: its own deletion first, then its Node's.
pub fn of_machine(machine: &MachineView, node: Option<&NodeView>) -> Option<Signal> {
    if machine.meta.deleting { Some(Signal::Deleting) } else { node.and_then(|n| of_node(n, false)) }
}

/// How many targets each signal took out of one decision's budget.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Disrupted {
    counts: [u32; SIGNALS.len()],
}

impl Disrupted {
    /// Counts one target taken out of the budget by `signal`.
    pub fn add(&mut self, signal: Signal) {
        if let Some(i) = SIGNALS.iter().position(|s| *s == signal) {
            self.counts[i] = self.counts[i].saturating_add(1);
        }
    }

    /// How many targets in all.
    pub fn total(&self) -> usize {
        self.counts.iter().map(|c| *c as usize).sum()
    }

    /// `status.disruptions`: each signal that took a target, in signal order.
    pub fn status(&self) -> Vec<DisruptionCount> {
        SIGNALS
            .iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| DisruptionCount {
                signal: s.name().to_string(),
                targets: i32::try_from(n).unwrap_or(i32::MAX),
            })
            .collect()
    }

    /// What a budget message adds: `; 3 taken down on purpose (ClusterAutoscaler 2, Kured 1)`,
    /// or nothing when no target was.
    pub fn phrase(&self) -> String {
        if self.total() == 0 {
            return String::new();
        }
        let each: Vec<String> = self.status().iter().map(|d| format!("{} {}", d.signal, d.targets)).collect();
        format!("; {} taken down on purpose ({})", self.total(), each.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(taints: &[&str], unschedulable: bool, annotations: &[(&str, &str)]) -> NodeView {
        let annotations = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        NodeView::new("n".into(), None, Some(&annotations), false, Vec::new()).with_spec(
            None,
            unschedulable,
            taints.iter().copied(),
        )
    }

    #[test]
    fn each_signal_is_read_from_what_its_tool_writes() {
        let kured = [(KURED_REBOOT_IN_PROGRESS_ANNOTATION, "2026-12-03T00:00:00Z")];
        let table: Vec<(&str, NodeView, bool, Option<Signal>)> = vec![
            ("nothing", node(&[], false, &[]), false, None),
            ("a cordon alone", node(&[], true, &[]), false, None),
            ("being deleted", NodeView { deleting: true, ..node(&[], false, &[]) }, false, Some(Signal::Deleting)),
            (
                "the autoscaler's taint",
                node(&[CLUSTER_AUTOSCALER_DELETE_TAINT], false, &[]),
                false,
                Some(Signal::ClusterAutoscaler),
            ),
            ("Karpenter v1", node(&[KARPENTER_DISRUPTED_TAINT], false, &[]), false, Some(Signal::Karpenter)),
            (
                "Karpenter v1beta1",
                node(&[KARPENTER_DISRUPTION_TAINT_V1BETA1], false, &[]),
                false,
                Some(Signal::Karpenter),
            ),
            ("kured, cordoned", node(&[], true, &kured), false, Some(Signal::Kured)),
            ("kured's annotation without a cordon", node(&[], false, &kured), false, None),
            ("a NodeMaintenance", node(&[], false, &[]), true, Some(Signal::NodeMaintenance)),
            (
                "the drain taint, cordoned",
                node(&[MEDIK8S_DRAIN_TAINT], true, &[]),
                false,
                Some(Signal::NodeMaintenance),
            ),
            ("the drain taint without a cordon", node(&[MEDIK8S_DRAIN_TAINT], false, &[]), false, None),
            (
                "the first signal wins",
                node(&[CLUSTER_AUTOSCALER_DELETE_TAINT, KARPENTER_DISRUPTED_TAINT], true, &kured),
                true,
                Some(Signal::ClusterAutoscaler),
            ),
        ];
        for (what, n, maintained, want) in table {
            assert_eq!(of_node(&n, maintained), want, "{what}");
        }
    }

    #[test]
    fn a_machine_being_deleted_counts_before_its_node() {
        let mut machine = MachineView::read(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "default"},
            "spec": {"clusterName": "prod"}
        }))
        .expect("a Machine reads");
        let tainted = node(&[KARPENTER_DISRUPTED_TAINT], false, &[]);
        assert_eq!(of_machine(&machine, Some(&tainted)), Some(Signal::Karpenter));
        assert_eq!(of_machine(&machine, None), None);
        machine.meta.deleting = true;
        assert_eq!(of_machine(&machine, Some(&tainted)), Some(Signal::Deleting));
    }

    #[test]
    fn the_tally_reports_each_signal_that_took_a_target() {
        let mut tally = Disrupted::default();
        assert_eq!(tally.phrase(), "");
        assert!(tally.status().is_empty());
        tally.add(Signal::Kured);
        tally.add(Signal::ClusterAutoscaler);
        tally.add(Signal::ClusterAutoscaler);
        assert_eq!(tally.total(), 3);
        assert_eq!(tally.phrase(), "; 3 taken down on purpose (ClusterAutoscaler 2, Kured 1)");
        let status = tally.status();
        assert_eq!(status.len(), 2);
        assert_eq!((status[0].signal.as_str(), status[0].targets), ("ClusterAutoscaler", 2));
    }
}
