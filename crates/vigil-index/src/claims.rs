//! Who holds which target, read from the indexes: each check's claims (its remediation
//! objects, its Machines' conditions, its status' requests in flight), and the holders a
//! decision is made against. The rules of the assembly are the engine's
//! ([`vigil_engine::assemble`]); this module only finds the objects, scoped to the confirmed
//! targets while confirming (the controller reads the targets again before it remediates).

use crate::index::{Candidate, Index, WorkloadCluster};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::{MachineView, RemediationView};
use vigil_engine::assemble::{self, ClaimSource, Fresh};
use vigil_engine::concerns::group_of;
use vigil_engine::cross_shard;
use vigil_engine::holders::{Claim, Holders};
use vigil_engine::lookup::Lookup;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};

/// Reads a template's remediation objects of one namespace by name, from the index.
pub(crate) struct RemediationIndex<'a>(pub(crate) Option<&'a BTreeMap<String, Arc<RemediationView>>>);

/// For each of a MachineHealthCheck's templates ([`MhcPolicy::templates`], its own and its
/// rules'), its remediation kind's objects in `namespace`, by name (empty while not watched).
pub(crate) fn mhc_remediation_indexes<'i>(
    idx: &'i Index,
    namespace: &str,
    policy: &MhcPolicy,
) -> Vec<RemediationIndex<'i>> {
    policy
        .templates()
        .into_iter()
        .map(|t| {
            let objects = idx.objects.get(&(group_of(&t.api_version).to_string(), t.remediation_kind().to_string()));
            RemediationIndex(objects.and_then(|c| c.remediations.get(namespace)))
        })
        .collect()
}

/// The engine's view of remediation indexes: one lookup each.
pub(crate) fn as_lookups<'a>(indexes: &'a [RemediationIndex<'a>]) -> Vec<&'a dyn Lookup<RemediationView>> {
    indexes.iter().map(|r| r as &dyn Lookup<RemediationView>).collect()
}

impl Lookup<RemediationView> for RemediationIndex<'_> {
    fn lookup(&self, key: &str) -> Option<&RemediationView> {
        self.0.and_then(|m| m.get(key)).map(|a| a.as_ref())
    }
}

/// The cluster key the engine uses for an MHC's Nodes ([`assemble::node_cluster`]): local when
/// the workload cluster is the cluster Vigil runs in.
pub fn node_cluster(idx: &Index, namespace: &str, cluster: &str) -> String {
    let local = idx.hosting.is_self_hosted(&WorkloadCluster::new(namespace, cluster));
    assemble::node_cluster(namespace, cluster, local)
}

/// Who holds which of `candidates` (the targets `key`'s decision may ask about: its own, from
/// the very lists the decision reads) and of `fresh`: with one shard, only the targets another
/// check claims are looked at, and `key`'s own claims derived now only about those (a target no
/// other check claims has no other holder), so a decision costs what its own targets cost, not
/// what every check holds. The other checks' claims are as cached after their last decision;
/// with `fresh`, their claims about those targets derived now instead ([`assemble::holders`]).
/// With more than one shard, every claim is looked at, and a target `key` selects that checks of
/// different shards select too is left to the first of them ([`cross_shard`]).
pub(crate) fn holders_for<'c>(
    idx: &Index,
    key: &CheckRef,
    candidates: impl IntoIterator<Item = Candidate<'c>>,
    fresh: Option<&BTreeSet<Target>>,
) -> Holders {
    if idx.sharding.count > 1 {
        return sharded_holders_for(idx, key, fresh);
    }
    let mut contested: BTreeSet<Target> =
        candidates.into_iter().filter(|t| idx.claims.claimed_by_other(*t, key)).map(Candidate::to_target).collect();
    contested.extend(fresh.into_iter().flatten().cloned());
    if contested.is_empty() {
        return Holders::none();
    }
    let scope = Scope::of(idx, &contested);
    let own = claims_within(idx, key, Some(&scope)).unwrap_or_default();
    let cached = contested.iter().flat_map(|t| idx.claims.about(t));
    let rederived = fresh.map(|about| rederive(idx, key, about));
    assemble::holders(Some(key), own, cached, rederived.as_ref())
}

/// The other checks' claims about `about`, derived now (only checks that can hold one of them,
/// [`may_hold`]).
fn rederive<'a>(idx: &Index, key: &CheckRef, about: &'a BTreeSet<Target>) -> Fresh<'a> {
    let scope = Scope::of(idx, about);
    let mut rederived = Fresh::about(about);
    for other in may_hold(idx, &scope).into_iter().filter(|o| o != key) {
        if let Some(claims) = claims_within(idx, &other, Some(&scope)) {
            rederived.insert(other, claims);
        }
    }
    rederived
}

/// The checks whose claims about the scope's targets a confirming decision derives now: every
/// NodeHealthCheck (its claims are its objects, whatever it selects), the MachineHealthChecks
/// that select one of the scope's Machines (a Machine check claims only its own targets) or that
/// the namespace's ranking leaves out (being deleted, unreadable or invalid), and every check
/// whose cached claims name one of the targets (those must give way to what holds now). Any other
/// check has no claim about them, cached or derived, so deriving it could change no holder; and
/// the cost follows the confirmed targets, not the number of checks.
fn may_hold(idx: &Index, scope: &Scope<'_>) -> BTreeSet<CheckRef> {
    let mut checks: BTreeSet<CheckRef> = idx.nhcs.keys().map(|name| CheckRef::Node { name: name.clone() }).collect();
    checks.extend(scope.about.iter().flat_map(|t| idx.claims.about(t)).map(|c| c.check.clone()));
    for namespace in scope.machines.keys() {
        let peers = idx.mhc_peers(namespace);
        for machine in scope.machines_of(idx, namespace) {
            checks.extend(peers.selecting(machine).into_iter().cloned());
        }
        checks.extend(idx.unranked_mhcs(namespace));
    }
    checks
}

/// [`holders_for`] with shards: `key`'s claims all derived now and every other check's cached,
/// since the cross-shard rule leaves a target to another check only when nobody holds it.
fn sharded_holders_for(idx: &Index, key: &CheckRef, fresh: Option<&BTreeSet<Target>>) -> Holders {
    let own = claims_within(idx, key, None).unwrap_or_default();
    let selections = selections(idx, key);
    let elsewhere = other_shards_claims(idx, key, &selections);
    let cached = idx.claims.iter().flat_map(|(_, c)| c).chain(elsewhere.iter().flat_map(|(_, c)| c));
    let rederived = fresh.map(|about| rederive(idx, key, about));
    let holders = assemble::holders(Some(key), own, cached, rederived.as_ref());
    cross_shard::leave_to_first(holders, idx.sharding.count, &selections)
}

/// With shards: the claims of the checks of other shards about the targets they select with
/// `key`, derived now. A check's claims are cached only by the replica that decides it, so
/// without these a replica would learn that another shard's check holds a shared target only
/// while confirming a remediation of it, and a decision that stops before (at the Node's Lease
/// that check took) would say it waits for the Lease, never for the check, and would not be
/// told when that check lets go.
fn other_shards_claims(
    idx: &Index,
    key: &CheckRef,
    selections: &BTreeMap<Target, cross_shard::Selecting>,
) -> Vec<(CheckRef, Vec<Claim>)> {
    let mine = idx.shard_of(key);
    let mut shared = BTreeSet::new();
    let mut others = BTreeSet::new();
    for (target, selecting) in selections {
        for (check, shard) in selecting {
            if check != key && Some(*shard) != mine {
                shared.insert(target.clone());
                others.insert(check);
            }
        }
    }
    if shared.is_empty() {
        return Vec::new();
    }
    let scope = Scope::of(idx, &shared);
    others.into_iter().filter_map(|o| Some((o.clone(), claims_within(idx, o, Some(&scope))?))).collect()
}

/// The targets check `key` selects, each with every check selecting it and that check's shard
/// (read from specs and labels only, so every replica finds the same). An invalid check selects
/// nothing (it never remediates); a check being deleted still selects (another replica may not
/// have seen the deletion yet).
fn selections(idx: &Index, key: &CheckRef) -> BTreeMap<Target, cross_shard::Selecting> {
    let mine = selected_by(idx, key, None);
    if mine.is_empty() {
        return BTreeMap::new();
    }
    let mut out: BTreeMap<Target, cross_shard::Selecting> = BTreeMap::new();
    for check in idx.all_checks() {
        let Some(shard) = idx.shard_of(&check) else { continue };
        for target in selected_by(idx, &check, Some(&mine)) {
            out.entry(target).or_default().push((check.clone(), shard));
        }
    }
    out
}

/// The targets `check` selects (within `among` when given): a NodeHealthCheck's Nodes of the
/// local cluster its selector matches, a MachineHealthCheck's target Machines as their Nodes.
fn selected_by(idx: &Index, check: &CheckRef, among: Option<&BTreeSet<Target>>) -> BTreeSet<Target> {
    let within = |t: &Target| among.is_none_or(|a| a.contains(t));
    match check {
        CheckRef::Node { name } => {
            let (Some(Ok(policy)), Some(cache)) = (idx.nhc_policy(name), idx.nodes.get(LOCAL_CLUSTER)) else {
                return BTreeSet::new();
            };
            let matches = |node: &vigil_api::views::NodeView| node.labels.selected_by(&policy.selector);
            match among {
                Some(a) => assemble::local_nodes(a)
                    .into_iter()
                    .filter(|n| cache.nodes.get(*n).is_some_and(|node| matches(node)))
                    .map(Target::local_node)
                    .collect(),
                // The Nodes the index keeps for the check's decisions (selected or control plane).
                None => idx
                    .nhc_decision_nodes(name, std::iter::empty())
                    .into_iter()
                    .filter(|node| matches(node))
                    .map(|node| Target::local_node(&node.name))
                    .collect(),
            }
        }
        CheckRef::Machine { namespace: ns, name: n } => {
            let Some(Ok(policy)) = idx.mhc_policy_of(&(ns.clone(), n.clone())) else { return BTreeSet::new() };
            let cluster = selecting_cluster(idx, ns, &policy.cluster_name);
            if among.is_some_and(|a| !assemble::mhc_can_hold(a, ns, &cluster)) {
                return BTreeSet::new();
            }
            idx.mhc_machines(ns, n).into_iter().map(|m| Target::of_machine(&cluster, m)).filter(within).collect()
        }
    }
}

/// The cluster key of a MachineHealthCheck's Nodes for the cross-shard rule: as
/// [`node_cluster`] when this replica connected to the workload cluster (it knows whether the
/// cluster is self-hosted), the local cluster otherwise. A replica connects only to its own
/// shards' clusters; the replica holding the check may know the cluster is self-hosted, and
/// then the check meets the NodeHealthChecks on the same Node there. Counting an unknown
/// cluster as self-hosted keeps every replica's starter the same whenever it truly is (the
/// MachineHealthCheck, first in order); when it is not, a local Node whose name a Machine of
/// that cluster also references waits for a check that will not start on it (a stall, reported
/// as held), never a second remediation.
fn selecting_cluster(idx: &Index, namespace: &str, cluster: &str) -> String {
    if idx.hosting.is_known(&WorkloadCluster::new(namespace, cluster)) {
        node_cluster(idx, namespace, cluster)
    } else {
        LOCAL_CLUSTER.to_string()
    }
}

/// What a confirming decision derives claims about: its targets, and the Machines that can
/// stand for one of them (the Machine itself, or any Machine referencing a Node of the set), so
/// that a MachineHealthCheck looks at these instead of every Machine of its namespace.
struct Scope<'a> {
    about: &'a BTreeSet<Target>,
    machines: BTreeMap<String, BTreeSet<String>>,
}

impl<'a> Scope<'a> {
    /// The scope of `about`: one lookup per Node name and cluster with Machines (not a pass over
    /// every Machine: a confirmation's cost must not grow with the fleet).
    fn of(idx: &Index, about: &'a BTreeSet<Target>) -> Self {
        let mut machines: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut node_names = BTreeSet::new();
        for t in about {
            match t {
                Target::Machine { namespace, name } => {
                    machines.entry(namespace.clone()).or_default().insert(name.clone());
                }
                Target::Node { name, .. } => {
                    node_names.insert(name.as_str());
                }
            }
        }
        // A check's cluster key for a Machine's Node is its own (or the local cluster when
        // self-hosted), not the Machine's label: match on the Node name in every cluster.
        for node in &node_names {
            for (ns, m) in idx.machines_by_node.of_any_cluster(node) {
                machines.entry(ns.clone()).or_default().insert(m.clone());
            }
        }
        Scope { about, machines }
    }

    fn machines_of<'i>(&self, idx: &'i Index, namespace: &str) -> Vec<&'i MachineView> {
        let (Some(names), Some(all)) = (self.machines.get(namespace), idx.machines.get(namespace)) else {
            return Vec::new();
        };
        names.iter().filter_map(|n| all.get(n)).map(|e| e.view.as_ref()).collect()
    }
}

/// The targets check `key` is remediating, derived from the indexes (its remediation objects,
/// its Machines' conditions, its status' requests in flight).
pub fn claims_of(idx: &Index, key: &CheckRef) -> Vec<Claim> {
    claims_within(idx, key, None).unwrap_or_default()
}

/// [`claims_of`], or within `scope` only its claims about the scope's targets (looking only at
/// the scope's Machines and remediation objects naming its Nodes); `None` when the check cannot
/// hold any target of the scope (another namespace or cluster).
fn claims_within(idx: &Index, key: &CheckRef, scope: Option<&Scope<'_>>) -> Option<Vec<Claim>> {
    let claims = match key {
        CheckRef::Machine { namespace: ns, name: n } => mhc_claims_within(idx, ns, n, scope)?,
        CheckRef::Node { name: n } => nhc_claims_within(idx, n, scope)?,
    };
    Some(match scope {
        Some(s) => claims.into_iter().filter(|c| s.about.contains(&c.target)).collect(),
        None => claims,
    })
}

fn mhc_claims_within(idx: &Index, ns: &str, n: &str, scope: Option<&Scope<'_>>) -> Option<Vec<Claim>> {
    let Some((key, check)) = idx.mhcs.get_key_value(&(ns.to_string(), n.to_string())) else { return Some(Vec::new()) };
    let Some(Ok(policy)) = idx.mhc_policy_of(key) else { return Some(Vec::new()) };
    let node_cluster = node_cluster(idx, ns, &policy.cluster_name);
    let machines: Vec<&MachineView> = match scope {
        // Claims are only ever on the check's targets, which the index keeps.
        None => idx.mhc_machines(ns, n),
        Some(s) if !assemble::mhc_can_hold(s.about, ns, &node_cluster) => return None,
        Some(s) => s.machines_of(idx, ns),
    };
    let indexes = mhc_remediation_indexes(idx, ns, policy);
    let remediations = as_lookups(&indexes);
    let peers = idx.mhc_peers(&key.0);
    Some(assemble::claims(ClaimSource::Machine {
        check,
        policy,
        peers: &peers,
        node_cluster: &node_cluster,
        machines: &machines,
        remediations: &remediations,
    }))
}

fn nhc_claims_within(idx: &Index, n: &str, scope: Option<&Scope<'_>>) -> Option<Vec<Claim>> {
    let Some(check) = idx.nhcs.get(n) else { return Some(Vec::new()) };
    let Some(Ok(policy)) = idx.nhc_policy(n) else { return Some(Vec::new()) };
    let local: Option<BTreeSet<&str>> = scope.map(|s| assemble::local_nodes(s.about));
    if local.as_ref().is_some_and(BTreeSet::is_empty) {
        return None;
    }
    let names_a_scoped_node = |v: &RemediationView| {
        local.as_ref().is_none_or(|l| {
            v.meta.annotations.get(vigil_api::well_known::NODE_NAME_ANNOTATION).is_some_and(|n| l.contains(n.as_str()))
        })
    };
    let mut seen = BTreeSet::new();
    let mut views: Vec<&RemediationView> = Vec::new();
    for step in policy.all_steps() {
        let t = &step.template;
        let gk = (group_of(&t.api_version).to_string(), t.remediation_kind().to_string());
        if seen.insert((gk.clone(), t.namespace.clone()))
            && let Some(m) = idx.objects.get(&gk).and_then(|c| c.remediations.get(&t.namespace))
        {
            views.extend(m.values().map(|a| a.as_ref()).filter(|v| names_a_scoped_node(v)));
        }
    }
    Some(assemble::claims(ClaimSource::Node { check, remediations: &views }))
}

/// Confirming decisions derive other checks' claims only about the confirmed targets: that must
/// lose nothing a full derivation would find about them.
#[cfg(test)]
mod scoped_claims {
    use super::*;
    use crate::gather::{Job, job, job_with_fresh_holders};
    use crate::sources::SourceState;
    use jiff::Timestamp;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::Value;
    use serde_json::json;
    use vigil_api::MachineHealthCheck;
    use vigil_api::views::NodeView;
    use vigil_api::well_known::NODE_NAME_ANNOTATION;
    use vigil_engine::Action;
    use vigil_engine::target::LOCAL_CLUSTER;

    const SNR: &str = "self-node-remediation.medik8s.io/v1alpha1";
    const FAR: &str = "fence-agents-remediation.medik8s.io/v1alpha1";

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn nhc(name: &str, api_version: &str, kind: &str) -> vigil_api::NodeHealthCheck {
        serde_json::from_value(json!({
            "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1", "generation": 1},
            "spec": {"selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
                     "minHealthy": "51%",
                     "remediationTemplate": {"apiVersion": api_version, "kind": kind, "name": "t", "namespace": "medik8s"}}
        }))
        .expect("NodeHealthCheck")
    }

    fn node(name: &str, ready: &str) -> Node {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "r",
                "lastHeartbeatTime": "2030-01-01T00:00:00Z", "lastTransitionTime": "2029-12-01T00:00:00Z"}]}
        }))
        .expect("Node")
    }

    fn synced_kind(idx: &mut Index, api_version: &str, kind: &str) {
        let group = group_of(api_version);
        for (k, is_template) in [(format!("{kind}Template"), true), (kind.to_string(), false)] {
            let gk = (group.to_string(), k.clone());
            if is_template {
                let t = json!({"apiVersion": api_version, "kind": k, "metadata": {"name": "t", "namespace": "medik8s"},
                               "spec": {"template": {"spec": {}}}});
                idx.put_object(&gk, true, Some(&t), None);
            }
            idx.objects.entry(gk).or_default().state = SourceState::Synced;
        }
    }

    /// Three workers, w-2 `Ready=False` for a month; NodeHealthChecks `reboot` (SelfNode-) and
    /// `fence` (FenceAgentsRemediation), `fence` remediating w-2 already (its object exists),
    /// while the cached claims, from before that object was seen, say nobody holds anything.
    fn two_nhcs() -> Index {
        let mut idx = Index::default();
        idx.sources.nhcs = SourceState::Synced;
        // The surroundings read: no node Lease held, no maintenance, upgrade or Machine API kind served.
        idx.around.leases.state = SourceState::Synced;
        idx.around.maintenances.served = Some(false);
        idx.around.cluster_versions.served = Some(false);
        idx.around.openshift_machines.served = Some(false);
        idx.put_nhc(Some(nhc("reboot", SNR, "SelfNodeRemediationTemplate")), None);
        idx.put_nhc(Some(nhc("fence", FAR, "FenceAgentsRemediationTemplate")), None);
        for (n, ready) in [("w-1", "True"), ("w-2", "False"), ("w-3", "True")] {
            idx.put_node(LOCAL_CLUSTER, Some(NodeView::from(&node(n, ready))), None, at("2030-01-01T00:00:00Z"));
        }
        idx.nodes.entry(LOCAL_CLUSTER.to_string()).or_default().state = SourceState::Synced;
        synced_kind(&mut idx, SNR, "SelfNodeRemediation");
        synced_kind(&mut idx, FAR, "FenceAgentsRemediation");
        let object = json!({"apiVersion": FAR, "kind": "FenceAgentsRemediation",
            "metadata": {"name": "w-2", "namespace": "medik8s", "creationTimestamp": "2029-12-31T23:00:00Z",
                         "annotations": {NODE_NAME_ANNOTATION: "w-2"},
                         "ownerReferences": [{"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
                                              "name": "fence", "uid": "uid-fence"}]}});
        idx.put_object(
            &("fence-agents-remediation.medik8s.io".into(), "FenceAgentsRemediation".into()),
            false,
            Some(&object),
            None,
        );
        idx.claims.clear();
        idx
    }

    fn placed(ns: &str, name: &str, cluster: &str, node: Option<&str>) -> Value {
        let status = node.map_or(json!({}), |n| json!({"nodeRef": {"name": n}}));
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "metadata": {"name": name, "namespace": ns, "resourceVersion": "1",
                            "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
               "spec": {"clusterName": cluster}, "status": status})
    }

    fn scoped(idx: &Index, about: &BTreeSet<Target>) -> BTreeMap<String, BTreeSet<String>> {
        Scope::of(idx, about).machines
    }

    /// A confirmation about a Node finds every Machine naming that Node, in every cluster, by
    /// lookups; the clusters it looks in follow the Machines as they come, move and go.
    #[test]
    fn the_scope_finds_a_nodes_machines_in_every_cluster_as_they_move() {
        let mut idx = Index::default();
        idx.put_machine(Some(&placed("a", "m1", "c1", Some("n1"))), None);
        idx.put_machine(Some(&placed("b", "m2", "c2", Some("n1"))), None);
        idx.put_machine(Some(&placed("a", "m3", "c1", Some("n2"))), None);
        idx.put_machine(Some(&placed("a", "m4", "c1", None)), None);
        let n1 = BTreeSet::from([Target::Node { cluster: LOCAL_CLUSTER.into(), name: "n1".into() }]);
        let both = BTreeMap::from([
            ("a".to_string(), BTreeSet::from(["m1".to_string()])),
            ("b".to_string(), BTreeSet::from(["m2".to_string()])),
        ]);
        assert_eq!(scoped(&idx, &n1), both);
        assert_eq!(idx.machines_by_node.clusters(), &BTreeMap::from([("a/c1".into(), 2), ("b/c2".into(), 1)]));
        // m2 moves to n3; m1 is deleted: n1 has no Machine left, and c2 keeps one key (n3).
        let mut moved = placed("b", "m2", "c2", Some("n3"));
        moved["metadata"]["resourceVersion"] = json!("2");
        idx.put_machine(Some(&moved), None);
        idx.put_machine(None, Some(("a".into(), "m1".into())));
        assert!(scoped(&idx, &n1).is_empty());
        assert_eq!(idx.machines_by_node.clusters(), &BTreeMap::from([("a/c1".into(), 1), ("b/c2".into(), 1)]));
        let n3 = BTreeSet::from([Target::Node { cluster: "b/c2".into(), name: "n3".into() }]);
        assert_eq!(scoped(&idx, &n3), BTreeMap::from([("b".to_string(), BTreeSet::from(["m2".to_string()]))]));
        // A Machine target is in its own scope whatever its Node.
        let m4 = BTreeSet::from([Target::Machine { namespace: "a".into(), name: "m4".into() }]);
        assert_eq!(scoped(&idx, &m4), BTreeMap::from([("a".to_string(), BTreeSet::from(["m4".to_string()]))]));
        for (ns, m) in [("a", "m3"), ("a", "m4"), ("b", "m2")] {
            idx.put_machine(None, Some((ns.into(), m.into())));
        }
        assert!(idx.machines_by_node.clusters().is_empty() && idx.machines_by_node.is_empty());
        idx.put_machine(Some(&placed("a", "m5", "c1", Some("n1"))), None);
        idx.clear_machines();
        assert!(idx.machines_by_node.is_empty(), "a relist starts from nothing");
    }

    fn creates_for(job: &Job) -> Vec<String> {
        job.plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateRemediation { target, .. } => Some(target.key()),
                _ => None,
            })
            .collect()
    }

    fn about(nodes: &[&str]) -> BTreeSet<Target> {
        nodes.iter().map(|n| Target::local_node(n)).collect()
    }

    #[test]
    fn another_checks_fresh_claim_on_a_confirmed_target_blocks_it_whatever_the_cache_says() {
        let idx = two_nhcs();
        let now = at("2030-01-01T00:00:10Z");
        let reboot = CheckRef::Node { name: "reboot".into() };
        let cached = job(&idx, &reboot, now).expect("decided");
        assert_eq!(creates_for(&cached), ["w-2"], "the cached claims say nobody holds w-2");
        let fresh = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-2"])).expect("decided");
        assert_eq!(creates_for(&fresh), Vec::<String>::new(), "fence's object holds w-2");
        assert!(fresh.plan.held_elsewhere.iter().any(|h| h.target.key() == "w-2"), "{:?}", fresh.plan.held_elsewhere);
    }

    #[test]
    fn a_remediation_outside_what_was_confirmed_is_left_out_and_decided_again() {
        let idx = two_nhcs();
        let now = at("2030-01-01T00:00:10Z");
        let reboot = CheckRef::Node { name: "reboot".into() };
        // Confirmed about w-1 only: w-2 is decided on cached claims, which miss fence's hold.
        let mut fresh = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-1"])).expect("decided");
        assert_eq!(creates_for(&fresh), ["w-2"]);
        fresh.keep_confirmed(&[Target::local_node("w-1")].into());
        assert_eq!(creates_for(&fresh), Vec::<String>::new());
        assert!(fresh.again, "the check is decided again");
    }

    fn machine(name: &str, node: &str, owner_remediated: bool) -> Value {
        let conditions = if owner_remediated {
            json!([{"type": "HealthCheckSucceeded", "status": "False", "reason": "r", "message": "", "lastTransitionTime": "2029-12-31T22:00:00Z"},
                   {"type": "OwnerRemediated", "status": "False", "reason": "r", "message": "", "lastTransitionTime": "2029-12-31T22:00:00Z"}])
        } else {
            json!([])
        };
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "metadata": {"name": name, "namespace": "default", "resourceVersion": "1",
                            "labels": {"cluster.x-k8s.io/cluster-name": "prod", "pool": "workers"}},
               "spec": {"clusterName": "prod"},
               "status": {"nodeRef": {"name": node}, "conditions": conditions}})
    }

    /// [`two_nhcs`] without fence's object, plus a self-hosted cluster `default/prod` whose
    /// MachineHealthCheck asked the owner to remediate the Machine of w-2 (the same target), a
    /// check of another cluster, and 50 healthy Machines.
    fn self_hosted() -> Index {
        let mut idx = two_nhcs();
        idx.put_object(
            &("fence-agents-remediation.medik8s.io".into(), "FenceAgentsRemediation".into()),
            false,
            None,
            Some(("medik8s".into(), "w-2".into())),
        );
        idx.hosting.connected(&WorkloadCluster::new("default", "prod"), true);
        for (ns, name, cluster) in [("default", "workers", "prod"), ("other", "elsewhere", "far")] {
            let mhc: MachineHealthCheck = serde_json::from_value(json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": "1", "generation": 1},
                "spec": {"clusterName": cluster, "selector": {"matchLabels": {"pool": "workers"}},
                         "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "8m"}]}
            }))
            .expect("MachineHealthCheck");
            idx.put_mhc(Some(mhc), None);
        }
        idx.put_machine(Some(&machine("m-2", "w-2", true)), None);
        for i in 0..50 {
            idx.put_machine(Some(&machine(&format!("m-x{i}"), &format!("x{i}"), false)), None);
        }
        idx.claims.clear();
        idx
    }

    #[test]
    fn a_self_hosted_machine_claim_on_a_confirmed_node_is_found_without_walking_the_namespace() {
        let idx = self_hosted();
        let now = at("2030-01-01T00:00:10Z");
        let reboot = CheckRef::Node { name: "reboot".into() };
        assert_eq!(creates_for(&job(&idx, &reboot, now).expect("decided")), ["w-2"]);
        let fresh = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-2"])).expect("decided");
        assert_eq!(creates_for(&fresh), Vec::<String>::new(), "the Machine of w-2 is held by the MHC");
        // Scoped derivation equals the full one restricted to the scope, for every check, and
        // a check that cannot select a target of the scope is not derived at all.
        for targets in [about(&["w-2"]), about(&["w-1", "w-2"]), about(&["x3"])] {
            let scope = Scope::of(&idx, &targets);
            for key in idx.all_checks() {
                let full: Vec<Claim> =
                    claims_of(&idx, &key).into_iter().filter(|c| targets.contains(&c.target)).collect();
                match claims_within(&idx, &key, Some(&scope)) {
                    Some(scoped) => assert_eq!(scoped, full, "{key:?} about {targets:?}"),
                    None => assert!(full.is_empty(), "{key:?} skipped but claims {full:?}"),
                }
            }
            assert!(scope.machines.get("default").is_some_and(|m| m.len() <= 2), "{:?}", scope.machines);
        }
        let other = CheckRef::Machine { namespace: "other".into(), name: "elsewhere".into() };
        assert!(claims_within(&idx, &other, Some(&Scope::of(&idx, &about(&["w-2"])))).is_none());
        assert!(
            !claims_of(&idx, &CheckRef::Machine { namespace: "default".into(), name: "workers".into() }).is_empty()
        );
    }

    /// Every check's claims derived now, as [`holders_for`] derived them before it looked only at
    /// contested targets: the reference it must agree with.
    fn holders_from_every_claim(idx: &Index, key: &CheckRef, fresh: Option<&BTreeSet<Target>>) -> Holders {
        let cached = idx.claims.iter().flat_map(|(_, c)| c);
        let rederived = fresh.map(|about| rederive_every_check(idx, key, about));
        assemble::holders(Some(key), claims_of(idx, key), cached, rederived.as_ref())
    }

    /// [`rederive`] as it was before it asked [`may_hold`]: every other check derived again.
    fn rederive_every_check<'a>(idx: &Index, key: &CheckRef, about: &'a BTreeSet<Target>) -> Fresh<'a> {
        let scope = Scope::of(idx, about);
        let mut rederived = Fresh::about(about);
        for other in idx.all_checks().into_iter().filter(|o| o != key) {
            if let Some(claims) = claims_within(idx, &other, Some(&scope)) {
                rederived.insert(other, claims);
            }
        }
        rederived
    }

    /// [`self_hosted`] with more checks of `default/prod` in the namespace: one selecting other
    /// Machines, one being deleted and one invalid (both selecting the pool), and one whose
    /// cached claim on w-2 is from before its selector moved away.
    fn crowded() -> Index {
        let mut idx = self_hosted();
        let check = |name: &str, pool: &str| -> Value {
            json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                "metadata": {"name": name, "namespace": "default", "resourceVersion": "1", "generation": 1},
                "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": pool}},
                         "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "8m"}]}
            })
        };
        let put = |idx: &mut Index, check: Value| {
            idx.put_mhc(Some(serde_json::from_value::<MachineHealthCheck>(check).expect("MachineHealthCheck")), None);
        };
        put(&mut idx, check("gpu", "gpu"));
        let mut deleting = check("deleting", "workers");
        deleting["metadata"]["deletionTimestamp"] = json!("2029-12-31T00:00:00Z");
        deleting["metadata"]["finalizers"] = json!(["f"]);
        put(&mut idx, deleting);
        let mut invalid = check("invalid", "workers");
        invalid["spec"]["maxUnhealthy"] = json!("-5%");
        put(&mut idx, invalid);
        let key = ("default".to_string(), "invalid".to_string());
        assert!(idx.mhc_policy_of(&key).is_some_and(|p| p.is_err()), "a negative maxUnhealthy is refused");
        put(&mut idx, check("moved", "elsewhere"));
        let moved = CheckRef::Machine { namespace: "default".into(), name: "moved".into() };
        idx.claims.set(&moved, vec![Claim { target: Target::local_node("w-2"), check: moved.clone(), since: None }]);
        idx
    }

    /// A confirmation derives only the checks that can hold one of its targets, and finds the
    /// same holder of every target as when every check is derived again.
    #[test]
    fn a_confirmation_derives_only_the_checks_that_can_hold_its_targets() {
        let idx = crowded();
        let named = |name: &str| CheckRef::Machine { namespace: "default".into(), name: name.into() };
        let derived = may_hold(&idx, &Scope::of(&idx, &about(&["w-2"])));
        for name in ["workers", "deleting", "invalid", "moved"] {
            assert!(derived.contains(&named(name)), "{name} can hold w-2: {derived:?}");
        }
        for node in ["reboot", "fence"] {
            assert!(derived.contains(&CheckRef::Node { name: node.into() }), "{node}: {derived:?}");
        }
        assert!(!derived.contains(&named("gpu")), "gpu selects no Machine of w-2: {derived:?}");
        let elsewhere = CheckRef::Machine { namespace: "other".into(), name: "elsewhere".into() };
        assert!(!derived.contains(&elsewhere), "{derived:?}");
        let targets: Vec<Target> = ["w-1", "w-2", "x3"].into_iter().map(Target::local_node).collect();
        for key in idx.all_checks() {
            for fresh in [about(&["w-2"]), about(&["w-1", "w-2"]), about(&["x3"])] {
                let asked = targets.iter().map(|t| Candidate::new(true, LOCAL_CLUSTER, t.name()));
                let scoped = holders_for(&idx, &key, asked, Some(&fresh));
                let full = holders_from_every_claim(&idx, &key, Some(&fresh));
                for t in &targets {
                    let other = |h: &Holders| h.holder(t).filter(|h| h.check != key).cloned();
                    assert_eq!(other(&scoped), other(&full), "{key} about {t} with fresh {fresh:?}");
                }
            }
        }
    }

    /// A decision looks only at the targets another check claims: for every target it can ask
    /// about, it finds the same holder as from every check's claims, with and without fresh
    /// claims, whether the cache is current or from before an object was seen.
    #[test]
    fn the_holder_of_each_candidate_is_the_one_every_claim_gives() {
        let mut idx = self_hosted();
        // fence's object on w-2 again: the MachineHealthCheck and fence both claim it.
        let object = json!({"apiVersion": FAR, "kind": "FenceAgentsRemediation",
            "metadata": {"name": "w-2", "namespace": "medik8s", "creationTimestamp": "2029-12-31T23:30:00Z",
                         "annotations": {NODE_NAME_ANNOTATION: "w-2"},
                         "ownerReferences": [{"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
                                              "name": "fence", "uid": "uid-fence"}]}});
        let far = ("fence-agents-remediation.medik8s.io".to_string(), "FenceAgentsRemediation".to_string());
        let mut candidates: Vec<Target> = ["w-1", "w-2", "w-3", "x3"].into_iter().map(Target::local_node).collect();
        candidates.extend(["m-2", "m-x3"].map(|m| Target::Machine { namespace: "default".into(), name: m.into() }));
        let names: Vec<(bool, &str, &str)> = candidates
            .iter()
            .map(|t| match t {
                Target::Node { cluster, name } => (true, cluster.as_str(), name.as_str()),
                Target::Machine { namespace, name } => (false, namespace.as_str(), name.as_str()),
            })
            .collect();
        let checks = idx.all_checks();
        for stage in ["nothing cached", "all cached", "fence's object after the cache"] {
            match stage {
                "all cached" => {
                    for key in &checks {
                        crate::decision::cache_claims(&mut idx, key);
                    }
                    let reboot = CheckRef::Node { name: "reboot".into() };
                    assert!(idx.claims.claimed_by_other(Candidate::local_node("w-2"), &reboot), "{stage}");
                }
                _ if stage.starts_with("fence") => {
                    idx.put_object(&far, false, Some(&object), None);
                }
                _ => {}
            }
            for key in &checks {
                for fresh in [None, Some(about(&["w-2"])), Some(about(&["w-1", "w-3"]))] {
                    let asked = names.iter().map(|&(node, scope, name)| Candidate::new(node, scope, name));
                    let scoped = holders_for(&idx, key, asked, fresh.as_ref());
                    let full = holders_from_every_claim(&idx, key, fresh.as_ref());
                    for t in &candidates {
                        let other = |h: &Holders| h.holder(t).filter(|h| h.check != *key).cloned();
                        assert_eq!(other(&scoped), other(&full), "{stage}: {key} about {t} with fresh {fresh:?}");
                    }
                }
            }
        }
    }

    /// The smallest shard count above 1 at which `a` and `b` are (`apart`) or are not in
    /// different shards.
    fn shards_where(a: &str, b: &str, apart: bool) -> u32 {
        use vigil_engine::shard::shard_of;
        (2..64).find(|n| (shard_of(a, *n) != shard_of(b, *n)) == apart).expect("some shard count")
    }

    #[test]
    fn checks_in_different_shards_leave_a_target_both_select_to_the_first() {
        let mut idx = self_hosted();
        // Only the NodeHealthChecks: nobody holds w-2 (the MachineHealthCheck's request is gone).
        idx.mhcs.clear();
        let now = at("2030-01-01T00:00:10Z");
        let (reboot, fence) = (CheckRef::Node { name: "reboot".into() }, CheckRef::Node { name: "fence".into() });
        let cases = [
            (
                "different shards: fence, first by name, starts; reboot waits",
                shards_where("fence", "reboot", true),
                false,
            ),
            ("same shard: first come", shards_where("fence", "reboot", false), true),
            ("one shard", 1, true),
        ];
        for (what, shards, reboot_starts) in cases {
            idx.sharding.count = shards;
            assert_eq!(creates_for(&job(&idx, &fence, now).expect("decided")), ["w-2"], "{what}");
            let plan = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-2"])).expect("decided");
            let want: &[&str] = if reboot_starts { &["w-2"] } else { &[] };
            assert_eq!(creates_for(&plan), want, "{what}");
            let told: Vec<&CheckRef> = plan.plan.held_elsewhere.iter().map(|h| &h.holder).collect();
            assert_eq!(told.is_empty(), reboot_starts, "{what}: {told:?}");
        }
    }

    /// With shards, the first decision of a check finds that a check of another shard holds a
    /// target both select, not only a confirming read: this replica never decides that check,
    /// so it has no cached claims of it.
    #[test]
    fn a_check_of_another_shard_holding_a_shared_target_is_found_without_cached_claims() {
        let mut idx = two_nhcs();
        // First in order, so the cross-shard rule alone would leave w-2 to it.
        idx.put_nhc(Some(nhc("a-reboot", SNR, "SelfNodeRemediationTemplate")), None);
        idx.claims.clear();
        idx.sharding.count = shards_where("a-reboot", "fence", true);
        let now = at("2030-01-01T00:00:10Z");
        let plan = job(&idx, &CheckRef::Node { name: "a-reboot".into() }, now).expect("decided");
        assert_eq!(creates_for(&plan), Vec::<String>::new(), "fence's object holds w-2");
        let told: Vec<&CheckRef> = plan.plan.held_elsewhere.iter().map(|h| &h.holder).collect();
        assert_eq!(told, [&CheckRef::Node { name: "fence".into() }]);
    }

    #[test]
    fn the_checks_selecting_a_target_are_read_from_specs_and_labels() {
        let mut idx = self_hosted();
        idx.sharding.count = 6;
        let reboot = CheckRef::Node { name: "reboot".into() };
        let workers = CheckRef::Machine { namespace: "default".into(), name: "workers".into() };
        let fence = CheckRef::Node { name: "fence".into() };
        let found = selections(&idx, &reboot);
        let names = |t: &str| -> Vec<CheckRef> {
            let mut v: Vec<CheckRef> =
                found.get(&Target::local_node(t)).into_iter().flatten().map(|(c, _)| c.clone()).collect();
            v.sort();
            v
        };
        // The self-hosted MachineHealthCheck selects w-2 through Machine m-2; the one of cluster
        // `other/far` selects nothing here.
        assert_eq!(names("w-2"), [workers.clone(), fence.clone(), reboot.clone()]);
        assert_eq!(names("w-1"), [fence.clone(), reboot.clone()]);
        assert_eq!(found.len(), 3, "{found:?}");
        for (check, shard) in found.values().flatten() {
            assert_eq!(Some(*shard), idx.shard_of(check), "{check}");
        }
        // A Machine check's own selection: its Machines' Nodes, the others selecting them too.
        assert_eq!(selections(&idx, &workers).keys().collect::<Vec<_>>().first(), Some(&&Target::local_node("w-2")));
    }

    #[test]
    fn a_workload_cluster_this_replica_did_not_connect_to_counts_as_self_hosted_for_the_cross_shard_rule() {
        let mut idx = self_hosted();
        idx.sharding.count = 6;
        let reboot = CheckRef::Node { name: "reboot".into() };
        let workers = CheckRef::Machine { namespace: "default".into(), name: "workers".into() };
        let selecting_w2 = |idx: &Index| -> bool {
            selections(idx, &reboot)
                .get(&Target::local_node("w-2"))
                .is_some_and(|s| s.iter().any(|(c, _)| *c == workers))
        };
        // Another replica holds the MachineHealthCheck's shard: this one never connected to
        // default/prod, so it cannot know the cluster is self-hosted. The check still meets the
        // NodeHealthChecks on w-2 (and, first in order, is the one to start on it), as the
        // replica that connected finds.
        let prod = WorkloadCluster::new("default", "prod");
        idx.hosting.forget(&prod);
        assert!(!idx.hosting.is_known(&prod));
        assert!(selecting_w2(&idx), "unknown hosting counts as self-hosted");
        // Connected and self-hosted: the same.
        idx.hosting.connected(&prod, true);
        assert!(selecting_w2(&idx));
        // Connected and not self-hosted: its Machines' Nodes are another cluster's.
        idx.hosting.connected(&prod, false);
        assert!(!selecting_w2(&idx), "a remote cluster's Node w-2 is not the local w-2");
    }
}
