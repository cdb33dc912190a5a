//! The last gates a new remediation object passes, after the budget and Vigil's own features:
//! the cluster upgrade pause ([`crate::upgrade`]), planned maintenance ([`crate::maintenance`])
//! and the Node's Lease ([`crate::node_lease`]); and the care of the Leases this check holds
//! (renewed while a remediation runs, given up when overdue, released when nothing needs them).

use super::input::NhcInput;
use crate::lookup::Observed;
use crate::maintenance::{self, MaintenanceStanding as Maintenance};
use crate::node_lease::{self, LeaseScope, LeaseStanding};
use crate::plan::ONE_NS;
use crate::plan::{Action, Earliest, LeaseWrite, ObjectRef};
use crate::upgrade::Postponement;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use vigil_api::node_health_check::NodeWait;
use vigil_api::reason::Reason;
use vigil_api::views::{LeaseView, MaintenanceView, NodeView, OpenShiftMachineView};
use vigil_api::well_known::{OPENSHIFT_MACHINE_ANNOTATION, OPENSHIFT_MACHINE_API_VERSION};

/// What the gates read for one decision.
pub(super) struct Gates<'a> {
    /// The whole cluster waits (an upgrade, or its state unknown).
    pub(super) upgrade: Option<Postponement>,
    maintenances: Observed<'a, &'a [&'a MaintenanceView]>,
    /// The grace after maintenance; `None`: the check does not look for maintenance.
    grace: Option<SignedDuration>,
    me: String,
    namespace: &'a str,
    /// The lease namespace's Leases by name.
    leases: BTreeMap<&'a str, &'a LeaseView>,
    /// OpenShift Machines, the owners of their Nodes' remediation objects.
    machines: Observed<'a, &'a [&'a OpenShiftMachineView]>,
    now: Timestamp,
}

/// Why a Node's new remediation waits, and until when it may end by itself.
pub(super) struct Wait {
    pub(super) reason: Reason,
    pub(super) message: String,
    pub(super) until: Option<Timestamp>,
}

impl Wait {
    /// The status entry's `waiting`, keeping `since` while the reason stays.
    pub(super) fn entry(self, before: Option<&NodeWait>, now: Timestamp) -> NodeWait {
        let since = before.filter(|b| self.reason == b.reason).map_or(Time(now), |b| b.since.clone());
        NodeWait { reason: self.reason.to_string(), message: self.message, since, until: self.until.map(Time) }
    }
}

impl<'a> Gates<'a> {
    /// The gates of `input`'s decision; `upgrade` is what [`crate::upgrade::cluster_upgrade`] said.
    pub(super) fn new(input: &NhcInput<'a>, check_name: &str, upgrade: Option<Postponement>, now: Timestamp) -> Self {
        let around = input.around;
        Gates {
            upgrade,
            maintenances: around.maintenances,
            grace: input.policy.maintenance_grace,
            me: node_lease::holder_of(check_name),
            namespace: around.lease_namespace,
            leases: around.leases.iter().map(|l| (l.meta.name.as_str(), *l)).collect(),
            machines: around.machines,
            now,
        }
    }

    /// The owner reference of `node`'s OpenShift Machine for an object made in `namespace`, as
    /// medik8s adds it: only where the Machine API is served, the Node names its Machine
    /// (`machine.openshift.io/machine: <namespace>/<name>`) and the Machine is in the object's
    /// namespace (an owner must be). `Err` when that Machine cannot be read (not listed yet, or
    /// not there): medik8s makes no object then, and neither does Vigil.
    pub(super) fn machine_owner(&self, node: &NodeView, namespace: &str) -> Result<Option<Value>, Wait> {
        let machines = match self.machines {
            Observed::NotServed => return Ok(None),
            served => served,
        };
        let Some((ns, name)) = node.annotation(OPENSHIFT_MACHINE_ANNOTATION).and_then(|m| m.split_once('/')) else {
            return Ok(None);
        };
        if ns.is_empty() || ns != namespace {
            return Ok(None);
        }
        let unknown = |why: String| Wait {
            reason: Reason::NodeMachineUnknown,
            message: format!(
                "Not remediating node {}: its Machine {ns}/{name} (annotation {OPENSHIFT_MACHINE_ANNOTATION}), the owner of its remediation object, {why}",
                node.name
            ),
            until: None,
        };
        let list = match machines {
            Observed::Known(list) => list,
            Observed::Unknown(why) => return Err(unknown(format!("cannot be read: {why}"))),
            Observed::NotServed => return Ok(None),
        };
        let found = list.iter().find(|m| m.meta.namespace == ns && m.meta.name == name);
        match found.and_then(|m| m.meta.uid.as_deref()) {
            Some(uid) => Ok(Some(json!({
                "apiVersion": OPENSHIFT_MACHINE_API_VERSION,
                "kind": "Machine",
                "name": name,
                "uid": uid,
                "controller": false,
            }))),
            None => Err(unknown("does not exist".into())),
        }
    }

    fn scope(&self) -> LeaseScope<'_> {
        LeaseScope { namespace: self.namespace, me: &self.me }
    }

    fn lease_of(&self, node: &str) -> Option<&'a LeaseView> {
        self.leases.get(node_lease::lease_name(node).as_str()).copied()
    }

    /// Where `node` stands with planned maintenance (always [`Maintenance::Clear`] when the check
    /// does not look for it); `before` is its previous status entry's wait. Offers the grace's end.
    pub(super) fn maintenance(&self, node: &NodeView, before: Option<&NodeWait>, wake: &mut Earliest) -> Maintenance {
        let Some(grace) = self.grace else { return Maintenance::Clear };
        let signal = maintenance::under_maintenance(node, self.maintenances);
        let before = before.map(|b| (b.reason.as_str(), b.since.0, b.until.as_ref().map(|t| t.0)));
        let standing = maintenance::standing(signal, before, grace, self.now);
        if let Maintenance::Grace { until, .. } = &standing {
            wake.offer(*until);
        }
        standing
    }

    /// Whether a new remediation object for `node`, for a step of `current` length, may be
    /// created now: `Ok` with the Lease write it needs first (none while this check holds the
    /// Lease long enough), or the wait when another holder has it. Offers its end.
    pub(super) fn lease(
        &self,
        node: &NodeView,
        current: SignedDuration,
        wake: &mut Earliest,
    ) -> Result<Option<LeaseWrite>, Wait> {
        let lease = self.lease_of(&node.name);
        match node_lease::standing(lease, &self.me, self.now) {
            LeaseStanding::Theirs { holder, until } => {
                if let Some(t) = until.and_then(|u| u.checked_add(ONE_NS).ok()) {
                    wake.offer(t);
                }
                let name = node_lease::lease_name(&node.name);
                let till =
                    until.map_or_else(|| "for as long as it cannot be read".to_string(), |u| format!("until {u}"));
                Err(Wait {
                    reason: Reason::NodeLeaseHeld,
                    message: format!(
                        "Skipped remediation of node {}, because node lease is already taken: Lease {}/{name} is held by {holder} {till}",
                        node.name, self.namespace
                    ),
                    until,
                })
            }
            LeaseStanding::Mine { expires: Some(e), .. }
                if self.now.checked_add(current).is_ok_and(|need| e >= need) =>
            {
                Ok(None)
            }
            LeaseStanding::Mine { lease, .. } => {
                Ok(Some(node_lease::take(self.scope(), node, Some(lease), current, self.now)))
            }
            LeaseStanding::Free(lease) => Ok(Some(node_lease::take(self.scope(), node, lease, current, self.now))),
        }
    }

    /// The care of the Lease of a Node whose remediation (a step of `current` length, after
    /// steps of `previous` together) runs: renewed (for the step plus a buffer) a buffer before
    /// it runs out; `Overdue` when held past [`node_lease::overdue_at`]. Nothing for a Lease that is not
    /// this check's (upstream neither takes one back nor fights over it).
    pub(super) fn tend(
        &self,
        node: Option<&NodeView>,
        name: &str,
        current: SignedDuration,
        previous: SignedDuration,
        wake: &mut Earliest,
    ) -> Tend {
        let LeaseStanding::Mine { lease, .. } = node_lease::standing(self.lease_of(name), &self.me, self.now) else {
            return Tend::Nothing;
        };
        if let Some(overdue) = node_lease::overdue_at(lease, current, previous) {
            if overdue < self.now {
                return Tend::Overdue(release(lease, name));
            }
            wake.offer(overdue.checked_add(ONE_NS).unwrap_or(overdue));
        }
        match (node_lease::renew_at(lease), node) {
            (Some(at), _) if at > self.now => {
                wake.offer(at.checked_add(ONE_NS).unwrap_or(at));
                Tend::Nothing
            }
            (_, Some(node)) => Tend::Renew(node_lease::take(self.scope(), node, Some(lease), current, self.now)),
            // The Node is gone: its Lease goes with it (owner reference), nothing to renew.
            (_, None) => Tend::Nothing,
        }
    }

    /// The release of every Lease this check holds for a Node not in `keep` (no remediation
    /// object of this check left, none requested).
    pub(super) fn releases(&self, keep: &dyn Fn(&str) -> bool) -> Vec<Action> {
        self.leases
            .values()
            .filter(|l| l.holder.as_deref() == Some(self.me.as_str()))
            .filter_map(|l| {
                let node = l
                    .meta
                    .owners
                    .iter()
                    .find(|o| o.kind == "Node")
                    .map(|o| o.name.clone())
                    .or_else(|| l.meta.name.strip_prefix("node-").map(str::to_string))?;
                (!keep(&node)).then(|| release(l, &node))
            })
            .collect()
    }
}

/// What the care of a held Lease asks for.
pub(super) enum Tend {
    Nothing,
    Renew(LeaseWrite),
    /// Held past its overdue instant: released (this action), and the step is given up.
    Overdue(Action),
}

/// The delete of a Lease this check holds, made only against the version decided on.
fn release(lease: &LeaseView, node: &str) -> Action {
    Action::DeleteLease {
        lease: ObjectRef {
            api_version: "coordination.k8s.io/v1".into(),
            kind: "Lease".into(),
            namespace: lease.meta.namespace.clone(),
            name: lease.meta.name.clone(),
        },
        uid: lease.meta.uid.clone(),
        resource_version: lease.resource_version.clone(),
        node: node.to_string(),
    }
}

/// The wait of a Node under planned maintenance, `None` when it is clear.
pub(super) fn maintenance_wait(node: &str, standing: &Maintenance) -> Option<Wait> {
    let (message, until) = match standing {
        Maintenance::Clear => return None,
        Maintenance::Ongoing(why) => (format!("Not remediating node {node}: {why}"), None),
        Maintenance::Unknown(why) => (format!("Not remediating node {node}: {why}"), None),
        Maintenance::Grace { since, until } => (
            format!(
                "Not remediating node {node}: its planned maintenance ended at {since}; it is left to come back until {until}"
            ),
            Some(*until),
        ),
    };
    Some(Wait { reason: standing.reason()?, message, until })
}
