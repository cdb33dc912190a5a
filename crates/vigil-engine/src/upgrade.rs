//! The cluster upgrade pause (the NodeHealthCheck article): while the cluster is being upgraded
//! or downgraded, Nodes reboot one after another for their new configuration and look unhealthy
//! on the way, so no new remediation starts until the upgrade is over. The signals are the
//! NodeHealthCheck operator's, read, as it reads them, only on OpenShift (where `ClusterVersion`
//! is served):
//! - any OpenShift `ClusterVersion` with `Progressing=True`;
//! - any Node to be remediated whose `machineconfiguration.openshift.io/currentConfig` and
//!   `desiredConfig` differ (a desired config set and not reached yet: how a hosted control
//!   plane's upgrade shows).
//!
//! Elsewhere a Node's machine-config annotations are nobody's upgrade (a Node moved from an
//! OpenShift cluster may keep them): read there, they would postpone every remediation for good.
//!
//! Where the `ClusterVersion`s cannot be read (the watch has not listed, or failed), the operator
//! goes on as if not upgrading; Vigil postpones instead and says why (docs/DECISIONS.md).
//! Remediations already in flight go on: recoveries are cleaned up, timeouts are written and
//! Leases renewed; what waits is every new remediation object, a next escalation step included.

use crate::lookup::Observed;
use jiff::Timestamp;
use vigil_api::reason::Reason;
use vigil_api::views::{ClusterVersionView, NodeView};
use vigil_api::well_known::{CURRENT_MACHINE_CONFIG_ANNOTATION, DESIRED_MACHINE_CONFIG_ANNOTATION};

/// Why new remediations wait for the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Postponement {
    /// [`Reason::ClusterUpgrading`] or [`Reason::UpgradeStateUnknown`].
    pub reason: Reason,
    /// The signal that said so, for a person.
    pub message: String,
    /// How many leading bytes of `message` name the cause (which ClusterVersion and version, or
    /// which Node and configs): a new cause is news, while the rest (the ClusterVersion's own
    /// progress message) moves all through an upgrade and is not.
    pub cause_len: usize,
    /// Since when the signal says so, when it tells.
    pub since: Option<Timestamp>,
}

impl Postponement {
    /// The part of the message that names the cause.
    pub fn cause(&self) -> &str {
        self.message.get(..self.cause_len).unwrap_or(&self.message)
    }
}

/// Whether the cluster is being upgraded, from its `ClusterVersion`s and the Nodes about to be
/// remediated; `None` when nothing says so.
pub fn cluster_upgrade<'n>(
    versions: Observed<'_, &[&ClusterVersionView]>,
    to_remediate: impl IntoIterator<Item = &'n NodeView>,
) -> Option<Postponement> {
    if let Observed::NotServed = versions {
        return None;
    }
    if let Observed::Known(list) = versions
        && let Some(cv) = list.iter().find(|cv| cv.is_progressing())
    {
        let progressing = cv.progressing.as_ref();
        let target = cv.desired_version.as_deref().map_or_else(String::new, |v| format!(" to {v}"));
        let said = progressing
            .and_then(|c| c.message.as_deref())
            .filter(|m| !m.is_empty())
            .map_or_else(String::new, |m| format!(": {}", m.chars().take(200).collect::<String>()));
        let cause = format!(
            "Postponing potential remediations because of ongoing cluster upgrade: ClusterVersion {} is Progressing=True{target}",
            cv.meta.name
        );
        return Some(Postponement {
            reason: Reason::ClusterUpgrading,
            cause_len: cause.len(),
            message: cause + &said,
            since: progressing.and_then(|c| c.last_transition_time),
        });
    }
    for node in to_remediate {
        let desired = node.annotation(DESIRED_MACHINE_CONFIG_ANNOTATION).filter(|d| !d.is_empty());
        if let Some(desired) = desired
            && node.annotation(CURRENT_MACHINE_CONFIG_ANNOTATION) != Some(desired)
        {
            let current = node.annotation(CURRENT_MACHINE_CONFIG_ANNOTATION).unwrap_or("none");
            let message = format!(
                "Postponing potential remediations because of ongoing cluster upgrade: Node {} moves from machine config {current} to {desired}",
                node.name
            );
            return Some(Postponement {
                reason: Reason::ClusterUpgrading,
                cause_len: message.len(),
                message,
                since: None,
            });
        }
    }
    match versions {
        Observed::Unknown(why) => {
            let cause = "Postponing potential remediations: whether the cluster is being upgraded cannot be read";
            Some(Postponement {
                reason: Reason::UpgradeStateUnknown,
                cause_len: cause.len(),
                message: format!("{cause} ({why}); Vigil waits rather than remediate on top of an upgrade"),
                since: None,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cv(progressing: &str) -> ClusterVersionView {
        ClusterVersionView::read(&json!({
            "metadata": {"name": "version"},
            "status": {"desired": {"version": "4.19.1"}, "conditions": [
                {"type": "Progressing", "status": progressing, "lastTransitionTime": "2030-01-01T00:00:00Z",
                 "message": "Working towards 4.19.1: 412 of 903 done"}]}
        }))
        .expect("named")
    }

    fn node(current: Option<&str>, desired: Option<&str>) -> NodeView {
        let mut n = NodeView { name: "n1".into(), ..Default::default() };
        if let Some(c) = current {
            n.annotations.insert(CURRENT_MACHINE_CONFIG_ANNOTATION.into(), c.into());
        }
        if let Some(d) = desired {
            n.annotations.insert(DESIRED_MACHINE_CONFIG_ANNOTATION.into(), d.into());
        }
        n
    }

    #[test]
    fn the_operators_two_signals_and_an_unknown_state() {
        let (busy, idle) = (cv("True"), cv("False"));
        let steady = node(Some("rendered-a"), Some("rendered-a"));
        let moving = node(Some("rendered-a"), Some("rendered-b"));
        let fresh = node(None, Some("rendered-b"));
        let unset = node(Some("rendered-a"), Some(""));
        let none: &[&ClusterVersionView] = &[];
        // (ClusterVersions, Nodes) -> reason
        type Row<'a> = (Observed<'a, &'a [&'a ClusterVersionView]>, Vec<&'a NodeView>, Option<Reason>);
        let table: [Row<'_>; 12] = [
            (Observed::NotServed, vec![&steady], None),
            (Observed::Known(none), vec![&steady], None),
            (Observed::Known(&[&idle]), vec![&steady], None),
            (Observed::Known(&[&idle, &busy]), vec![&steady], Some(Reason::ClusterUpgrading)),
            (Observed::Known(&[&idle]), vec![&steady, &moving], Some(Reason::ClusterUpgrading)),
            (Observed::Known(none), vec![&fresh], Some(Reason::ClusterUpgrading)),
            (Observed::Known(&[&idle]), vec![&unset], None),
            // Not OpenShift: a Node's machine-config annotations are nobody's upgrade.
            (Observed::NotServed, vec![&steady, &moving], None),
            (Observed::NotServed, vec![&fresh], None),
            (Observed::NotServed, vec![&unset], None),
            (Observed::Unknown("not listed yet"), vec![&steady], Some(Reason::UpgradeStateUnknown)),
            (Observed::Unknown("not listed yet"), vec![&moving], Some(Reason::ClusterUpgrading)),
        ];
        for (i, (versions, nodes, want)) in table.into_iter().enumerate() {
            assert_eq!(cluster_upgrade(versions, nodes).map(|p| p.reason), want, "row {i}");
        }
        let p = cluster_upgrade(Observed::Known(&[&busy]), []).expect("upgrading");
        assert!(
            p.message.ends_with(
                "ClusterVersion version is Progressing=True to 4.19.1: Working towards 4.19.1: 412 of 903 done"
            ),
            "{}",
            p.message
        );
        assert_eq!(p.since, Some("2030-01-01T00:00:00Z".parse().expect("ts")));
    }
}
