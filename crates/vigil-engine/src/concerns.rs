//! Which health checks an object change concerns. The controller maps watch events with these
//! and the simulator wakes checks with them, so both wake exactly the same checks. A predicate
//! may say yes too often (a wasted, idempotent decision) but must never miss a check whose
//! verdict the change can alter.

pub use crate::target::remediation_node_name;
use crate::target::{is_control_plane, is_target};
use jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use vigil_api::validate::{ConditionRule, MhcPolicy, NhcPolicy};
use vigil_api::views::{LeaseView, MachineView, MaintenanceView, Meta};
use vigil_api::views::{NodeConditionView, NodeView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};

fn namespace_of(check: &MachineHealthCheck) -> &str {
    check.metadata.namespace.as_deref().unwrap_or("default")
}

/// A Machine concerns an MHC when it is (or was, per the last status) one of its targets.
pub fn mhc_concerns_machine(check: &MachineHealthCheck, policy: &MhcPolicy, machine: &MachineView) -> bool {
    machine.meta.namespace == namespace_of(check)
        && (is_target(policy, machine)
            || check.status.as_ref().is_some_and(|s| s.targets.binary_search(&machine.meta.name).is_ok()))
}

/// A Cluster concerns the MHCs that name it.
pub fn mhc_concerns_cluster(check: &MachineHealthCheck, policy: &MhcPolicy, cluster: &Meta) -> bool {
    cluster.namespace == namespace_of(check) && cluster.name == policy.cluster_name
}

/// A remediation object or template concerns an MHC when it is of its templates' kinds (its
/// own and its rules') in its namespace.
pub fn mhc_concerns_remediation_object(check: &MachineHealthCheck, policy: &MhcPolicy, object: &Meta) -> bool {
    object.namespace == namespace_of(check)
        && policy.templates().iter().any(|t| {
            group_of(&object.api_version) == group_of(&t.api_version)
                && (object.kind == t.remediation_kind() || (object.kind == t.kind && object.name == t.name))
        })
}

/// A Node concerns an NHC when it is selected or still listed in its status.
pub fn nhc_concerns_node(check: &NodeHealthCheck, policy: &NhcPolicy, node: &NodeView) -> bool {
    let name = node.name.as_str();
    node.labels.selected_by(&policy.selector)
        || check.status.as_ref().is_some_and(|s| s.unhealthy_nodes.iter().any(|u| u.name == name))
}

/// A template concerns the NHCs that use it (as their own or a rule's). A remediation object concerns the NHC that owns
/// it, and, when it is for a control-plane Node (or a Node not known, `node` = `None`), every
/// NHC using its kind: it may hold the one-control-plane-node lock. Another check's object for
/// a worker Node concerns only the NHCs that list that Node in their status (one that waits on
/// the other check's node Lease learns that the other check holds the Node, and says so).
pub fn nhc_concerns_remediation_object(
    check: &NodeHealthCheck,
    policy: &NhcPolicy,
    object: &Meta,
    node: Option<&NodeView>,
) -> bool {
    let name = check.metadata.name.as_deref().unwrap_or("");
    let owned = object.owners.iter().any(|o| o.kind == "NodeHealthCheck" && o.name == name);
    let may_lock = node.is_none_or(is_control_plane);
    let listed = node.is_some_and(|n| lists(check, &n.name));
    policy.all_steps().any(|s| {
        let t = &s.template;
        group_of(&object.api_version) == group_of(&t.api_version)
            && object.namespace == t.namespace
            && ((object.kind == t.remediation_kind() && (owned || may_lock))
                || (object.kind == t.kind && object.name == t.name))
    }) || (listed && !owned)
}

/// The Node a medik8s node Lease is for: its owner Node, else its name without `node-`.
pub fn lease_node(lease: &LeaseView) -> Option<&str> {
    lease
        .meta
        .owners
        .iter()
        .find(|o| o.kind == "Node")
        .map(|o| o.name.as_str())
        .or_else(|| lease.meta.name.strip_prefix("node-"))
}

/// Whether an NHC lists `node` in its status (an unhealthy Node it decides on).
fn lists(check: &NodeHealthCheck, node: &str) -> bool {
    check.status.as_ref().is_some_and(|s| s.unhealthy_nodes.iter().any(|u| u.name == node))
}

/// A node Lease concerns the NHC that holds it, and the NHCs listing its Node (they may wait for
/// it, or for its end). A Lease of a Node no check lists changes no decision: it is read when a
/// check is about to remediate.
pub fn nhc_concerns_node_lease(check: &NodeHealthCheck, lease: &LeaseView) -> bool {
    let name = check.metadata.name.as_deref().unwrap_or("");
    lease.holder.as_deref() == Some(crate::node_lease::holder_of(name).as_str())
        || lease_node(lease).is_some_and(|n| lists(check, n))
}

/// A `NodeMaintenance` concerns the NHCs listing its Node.
pub fn nhc_concerns_maintenance(check: &NodeHealthCheck, maintenance: &MaintenanceView) -> bool {
    maintenance.node_name.as_deref().is_some_and(|n| lists(check, n))
}

/// Whether a Node update can change any verdict: heartbeats (`lastHeartbeatTime`) and status
/// fields no rule reads (images, addresses, capacity) never cause work. A condition's reason is
/// read (a rule may list `reasons`): a reason that changes without a status change, which keeps
/// the transition time, still matters.
pub fn node_change_matters(old: &NodeView, new: &NodeView) -> bool {
    if old.labels != new.labels
        || old.annotations != new.annotations
        || old.deleting != new.deleting
        || old.unschedulable != new.unschedulable
        || old.taints != new.taints
    {
        return true;
    }
    let read = |c: &NodeConditionView| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.last_transition_time);
    !old.conditions.iter().map(read).eq(new.conditions.iter().map(read))
}

/// The `maxConditionAge`s of the checks' guarded rules, by condition type: what a heartbeat is
/// measured against (see [`heartbeat_revives`]). Adapters build it when the checks change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardedAges(BTreeMap<String, Vec<SignedDuration>>);

impl GuardedAges {
    /// The ages of every guarded rule among `rules`.
    pub fn of<'r>(rules: impl IntoIterator<Item = &'r ConditionRule>) -> Self {
        let mut ages: BTreeMap<String, Vec<SignedDuration>> = BTreeMap::new();
        for rule in rules {
            if let Some(age) = rule.max_age {
                let list = ages.entry(rule.type_.clone()).or_default();
                if !list.contains(&age) {
                    list.push(age);
                }
            }
        }
        GuardedAges(ages)
    }

    /// Whether no check guards any rule (heartbeats then never matter).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether a Node update that [`node_change_matters`] calls a heartbeat can still change a
/// verdict at `now`: it brings a condition some check guards with `maxConditionAge` back from
/// stale (the old heartbeat too old or missing, the new one fresh). A fresh heartbeat replacing
/// a fresh one changes nothing: the plan already wakes when the condition would turn stale, and
/// then reads the newer heartbeat. So a fleet's heartbeats still cause no work.
pub fn heartbeat_revives(old: &NodeView, new: &NodeView, ages: &GuardedAges, now: Timestamp) -> bool {
    if ages.is_empty() {
        return false;
    }
    let (before, after) = (&old.conditions, &new.conditions);
    let heartbeat = |c: Option<&NodeConditionView>| c.and_then(|c| c.last_heartbeat_time.as_ref()).copied();
    // Fresh: `heartbeat + age` is not before `now` (a sum beyond time's range is fresh for ever).
    let fresh =
        |h: Option<Timestamp>, age: SignedDuration| h.is_some_and(|h| h.checked_add(age).map_or(true, |d| d >= now));
    after.iter().any(|c| {
        let Some(list) = ages.0.get(&*c.type_) else { return false };
        let was = heartbeat(before.iter().find(|o| o.type_ == c.type_));
        let is = heartbeat(Some(c));
        list.iter().any(|age| !fresh(was, *age) && fresh(is, *age))
    })
}

pub use vigil_api::api_version::group_of;

#[cfg(test)]
mod tests {
    use super::*;

    fn node(status: &str, heartbeat: &str, transition: &str) -> NodeView {
        let ts = |s: &str| Some(s.parse().expect("ts"));
        let ready = NodeConditionView::new("Ready", status, None, ts(transition), ts(heartbeat));
        NodeView { conditions: vec![ready].into(), ..Default::default() }
    }

    #[test]
    fn heartbeats_alone_do_not_matter() {
        let a = node("True", "2030-01-01T00:00:00Z", "2029-12-31T00:00:00Z");
        let b = node("True", "2030-01-01T00:00:10Z", "2029-12-31T00:00:00Z");
        assert!(!node_change_matters(&a, &b));
        let c = node("False", "2030-01-01T00:00:20Z", "2030-01-01T00:00:20Z");
        assert!(node_change_matters(&b, &c));
        // A reason-aware rule reads the reason: a new reason matters, even with the transition
        // time kept (the status did not change).
        let mut d = c.clone();
        d.conditions[0].reason = Some("KubeletNotReady".into());
        assert!(node_change_matters(&c, &d));
        // Deletion starting, a label and the annotation a rule reads all matter.
        let mut deleting = a.clone();
        deleting.deleting = true;
        assert!(node_change_matters(&a, &deleting), "deletion starting");
        let mut labelled = a.clone();
        labelled.labels = vigil_api::views::Labels::of(Some(&BTreeMap::from([("zone".into(), "a".into())])));
        assert!(node_change_matters(&a, &labelled), "a label");
        let mut confirmed = a.clone();
        confirmed
            .annotations
            .insert(vigil_api::well_known::MANUALLY_CONFIRMED_HEALTHY_ANNOTATION.into(), String::new());
        assert!(node_change_matters(&a, &confirmed), "the confirmed-healthy annotation");
    }

    fn guarded(type_: &str, age_secs: i64) -> GuardedAges {
        GuardedAges::of(&[ConditionRule {
            type_: type_.into(),
            status: "True".into(),
            timeout: SignedDuration::from_secs(60),
            max_age: Some(SignedDuration::from_secs(age_secs)),
            ..ConditionRule::default()
        }])
    }

    #[test]
    fn a_heartbeat_matters_only_when_it_revives_a_guarded_stale_condition() {
        let now: Timestamp = "2030-01-01T01:00:00Z".parse().expect("ts");
        let ltt = "2030-01-01T00:00:00Z";
        let stale = node("True", "2030-01-01T00:40:00Z", ltt); // 20m old
        let fresh = node("True", "2030-01-01T00:59:00Z", ltt);
        let fresher = node("True", "2030-01-01T00:59:30Z", ltt);
        let ages = guarded("Ready", 600); // 10m (the types are what matters here)
        assert!(heartbeat_revives(&stale, &fresh, &ages, now), "stale -> fresh");
        assert!(!heartbeat_revives(&fresh, &fresher, &ages, now), "fresh -> fresh: the planned wake-up reads it");
        assert!(!heartbeat_revives(&stale, &stale, &ages, now));
        assert!(!heartbeat_revives(&stale, &fresh, &GuardedAges::default(), now), "no guarded rule: no work");
        assert!(!heartbeat_revives(&stale, &fresh, &guarded("KernelDeadlock", 600), now), "another type");
        assert!(!heartbeat_revives(&stale, &fresh, &guarded("Ready", 1500), now), "20m old is fresh under 25m");
        // Exactly at the age is still fresh (strictly older is stale).
        let edge = node("True", "2030-01-01T00:50:00Z", ltt);
        assert!(!heartbeat_revives(&edge, &fresh, &ages, now));
        let mut none = stale.clone();
        none.conditions[0].last_heartbeat_time = None;
        assert!(heartbeat_revives(&none, &fresh, &ages, now), "no heartbeat counts as stale");
    }

    #[test]
    fn groups() {
        assert_eq!(group_of("v1"), "");
        assert_eq!(group_of("cluster.x-k8s.io/v1beta2"), "cluster.x-k8s.io");
    }
}
