//! What the simulator reads from its store again and again, kept while the objects it was read
//! from are unchanged ([`Store::version_of`]): the Machines of a namespace, the management
//! cluster's Nodes, the parsed and validated checks, the remediation objects and each check's
//! claims, and what a NodeHealthCheck decision reads around its Nodes (Leases, NodeMaintenances,
//! ClusterVersions, OpenShift Machines). A 10 000-Node fleet otherwise had every decision and every Node change parse every
//! check and thousands of objects again. Nothing here decides: a view is the same value the
//! store would give, read once per change instead of once per use.

use crate::store::{Key, Store};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use vigil_api::validate::{self, MhcPolicy, NhcPolicy};
use vigil_api::views::{
    ClusterVersionView, LeaseView, MachineView, MaintenanceView, NodeView, OpenShiftMachineView, RemediationView,
};
use vigil_api::{GROUP, MachineHealthCheck, NodeHealthCheck};
use vigil_engine::concerns::GuardedAges;
use vigil_engine::holders::Claim;
use vigil_engine::peers::KeptPeers;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER};

/// API group of Cluster API's Machines and Clusters.
pub(crate) const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// API group of node Leases.
pub(crate) const LEASE_GROUP: &str = "coordination.k8s.io";
/// API group of medik8s' `NodeMaintenance`.
pub(crate) const MAINTENANCE_GROUP: &str = "nodemaintenance.medik8s.io";
/// API group of OpenShift's `ClusterVersion`.
pub(crate) const CLUSTER_VERSION_GROUP: &str = "config.openshift.io";
/// API group of OpenShift's Machine API `Machine` (owner of its Node's remediation objects).
pub(crate) const OPENSHIFT_MACHINE_GROUP: &str = "machine.openshift.io";

/// A view and the store version it was read at.
type At<T> = (u64, Rc<T>);

/// A (group, kind, namespace) of the management cluster.
type KindIn = (String, String, String);

/// A check parsed and validated, by the resource version it was read at (`None`: it does not
/// parse or is invalid).
type Parsed<C, P> = (String, Option<Rc<(C, P)>>);

/// What a check's claims were computed from: two store versions (see [`Views::claims`]).
pub(crate) type ClaimsAt = (u64, u64);

/// The Machines of a namespace as last read: at which store version, and each Machine's
/// resource version then with what it reads as (`None`: not a Machine the engine can read).
struct MachineList {
    at: u64,
    views: Rc<Vec<Rc<MachineView>>>,
    /// By name (the order of the store's keys within a namespace): each Machine's resource
    /// version when read and what it read as.
    by_name: MachinesByName,
    /// Moves when a Machine came, went, or changed its labels or annotations (what selects
    /// a check's targets), not when only its status did.
    selection_version: u64,
}

/// A namespace's valid MachineHealthChecks as last read: at which store version, the checks,
/// and the version of what claims read of them (moved only when a check's metadata or spec
/// changed, not by a status write: each decision writes its check's status).
struct PeerList {
    at: u64,
    checks: Rc<Vec<Rc<(MachineHealthCheck, MhcPolicy)>>>,
    spec_version: u64,
    /// Their ranking, made when first asked for at this spec version.
    ranked: Option<Rc<KeptPeers>>,
}

/// The valid MachineHealthChecks of a namespace and the version of their specs (see [`PeerList`]).
pub(crate) type Peers = (Rc<Vec<Rc<(MachineHealthCheck, MhcPolicy)>>>, u64);

/// Machines by name, each with its resource version when read and what it read as (`None`: not
/// a Machine the engine can read).
type MachinesByName = BTreeMap<String, (String, Option<Rc<MachineView>>)>;

/// What a check's targets were selected at: its namespace's spec version and its Machines'
/// selection version.
type SelectedAt = (u64, u64);

/// A health check as kept: what it is called and what it parses to.
pub(crate) struct KeptCheck {
    /// The check.
    pub(crate) id: CheckRef,
    /// It parsed and validated (`None`: it does not parse or is invalid).
    pub(crate) parsed: Option<ParsedCheck>,
}

/// A valid check of either kind with its policy.
pub(crate) enum ParsedCheck {
    /// A MachineHealthCheck.
    Machine(Rc<(MachineHealthCheck, MhcPolicy)>),
    /// A NodeHealthCheck.
    Node(Rc<(NodeHealthCheck, NhcPolicy)>),
}

/// Every health check as last read, at which store version of the checks, and their
/// `maxConditionAge`s once asked for.
struct CheckList {
    at: u64,
    checks: Rc<Vec<KeptCheck>>,
    ages: Option<Rc<GuardedAges>>,
}

/// The kept views.
#[derive(Default)]
pub(crate) struct Views {
    machines: HashMap<String, Option<MachineList>>,
    checks: Option<CheckList>,
    peers: HashMap<String, PeerList>,
    /// Moves whenever any namespace's checks' specs change ([`PeerList::spec_version`]).
    spec_changes: u64,
    /// Moves whenever any namespace's Machines' selection changes ([`MachineList::selection_version`]).
    selection_changes: u64,
    /// Each MachineHealthCheck's targets by name, at the (spec, selection) versions selected at.
    targets: HashMap<Key, (SelectedAt, Rc<Vec<String>>)>,
    nodes: Option<At<Vec<NodeView>>>,
    machine_namespaces: Option<At<HashMap<String, BTreeSet<String>>>>,
    remediation_objects: Option<At<Vec<RemediationView>>>,
    mhcs: HashMap<Key, Parsed<MachineHealthCheck, MhcPolicy>>,
    nhcs: HashMap<Key, Parsed<NodeHealthCheck, NhcPolicy>>,
    claims: HashMap<CheckRef, (ClaimsAt, Rc<Vec<Claim>>)>,
    /// The remediation objects of a (group, kind, namespace), what a NodeHealthCheck's steps read.
    remediations: HashMap<KindIn, Option<At<Vec<RemediationView>>>>,
    /// The Leases of a namespace.
    leases: HashMap<String, Option<At<Vec<LeaseView>>>>,
    /// Every NodeMaintenance.
    maintenances: Option<At<Vec<MaintenanceView>>>,
    /// Every ClusterVersion.
    cluster_versions: Option<At<Vec<ClusterVersionView>>>,
    /// Every OpenShift Machine.
    openshift_machines: Option<At<Vec<OpenShiftMachineView>>>,
}

/// Whether two readings of a check differ at most in status and in the metadata a write moves
/// (resource version, managed fields).
fn same_but_status(a: &MachineHealthCheck, b: &MachineHealthCheck) -> bool {
    let bare = |c: &MachineHealthCheck| {
        let mut meta = c.metadata.clone();
        meta.resource_version = None;
        meta.managed_fields = None;
        meta
    };
    a.spec == b.spec && bare(a) == bare(b)
}

/// Whether a Machine read again is selected as before (labels and annotations unchanged).
fn same_selection(before: Option<&MachineView>, after: Option<&MachineView>) -> bool {
    match (before, after) {
        (Some(a), Some(b)) => a.meta.labels == b.meta.labels && a.meta.annotations == b.meta.annotations,
        (None, None) => true,
        _ => false,
    }
}

/// `kept` if it was read at `version`, else `read()` kept at `version`.
fn current<T>(kept: &mut Option<At<T>>, version: u64, read: impl FnOnce() -> T) -> Rc<T> {
    match kept {
        Some((at, value)) if *at == version => value.clone(),
        _ => {
            let value = Rc::new(read());
            *kept = Some((version, value.clone()));
            value
        }
    }
}

/// The objects of the management cluster [`Store::list`] gives for `group`, `kind` and
/// `namespace`, each as `read` reads it (left out when it does not read), kept in `kept` until
/// one of them changes.
fn listed<T>(
    kept: &mut Option<At<Vec<T>>>,
    store: &Store,
    (group, kind, namespace): (&str, &str, Option<&str>),
    read: impl Fn(&serde_json::Value) -> Option<T>,
) -> Rc<Vec<T>> {
    let version = store.list_version(LOCAL_CLUSTER, group, kind, namespace);
    current(kept, version, || store.list(LOCAL_CLUSTER, group, kind, namespace).filter_map(|(_, v)| read(v)).collect())
}

/// A check parsed and validated, or the message its status reports when it is not: one reading
/// for the kept checks and for a decision that must say why.
pub(crate) fn parse_valid<C: serde::de::DeserializeOwned, P, E: std::fmt::Display>(
    object: serde_json::Value,
    validate: impl FnOnce(&C) -> Result<P, E>,
) -> Result<(C, P), String> {
    let check = serde_json::from_value::<C>(object).map_err(|e| e.to_string())?;
    let policy = validate(&check).map_err(|e| e.to_string())?;
    Ok((check, policy))
}

/// An object's `metadata.resourceVersion` (read field by field: a JSON pointer allocates each
/// of its segments, and this is read for every Machine after each Machine write).
fn rv_of(object: &serde_json::Value) -> Option<&str> {
    object.get("metadata")?.get("resourceVersion")?.as_str()
}

/// Where a health check is stored.
pub(crate) fn check_key(id: &CheckRef) -> Key {
    match id {
        CheckRef::Machine { namespace, name } => Key {
            cluster: LOCAL_CLUSTER.into(),
            group: GROUP.into(),
            kind: "MachineHealthCheck".into(),
            namespace: namespace.clone(),
            name: name.clone(),
        },
        CheckRef::Node { name } => Key {
            cluster: LOCAL_CLUSTER.into(),
            group: GROUP.into(),
            kind: "NodeHealthCheck".into(),
            namespace: String::new(),
            name: name.clone(),
        },
    }
}

/// Every health check in the store with where it is stored: MachineHealthChecks, then
/// NodeHealthChecks, each in key order (the order checks are decided and reported in).
pub(crate) fn check_refs(store: &Store) -> impl Iterator<Item = (&Key, CheckRef)> {
    let mhcs = store
        .list(LOCAL_CLUSTER, GROUP, "MachineHealthCheck", None)
        .map(|(k, _)| (k, CheckRef::Machine { namespace: k.namespace.clone(), name: k.name.clone() }));
    let nhcs = store
        .list(LOCAL_CLUSTER, GROUP, "NodeHealthCheck", None)
        .map(|(k, _)| (k, CheckRef::Node { name: k.name.clone() }));
    mhcs.chain(nhcs)
}

/// Whether `kind` (of [`GROUP`]) is a health check's.
fn is_check_kind(kind: &str) -> bool {
    kind == "MachineHealthCheck" || kind == "NodeHealthCheck"
}

/// Whether an object of the management cluster in `group` may be a remediation object (what
/// every NodeHealthCheck's claims are read from).
pub(crate) fn may_remediate(cluster: &str, group: &str) -> bool {
    cluster == LOCAL_CLUSTER && !group.is_empty() && group != GROUP && group != CAPI_GROUP
}

impl Views {
    /// Machines of a namespace of the management cluster. Only the Machines written since the
    /// last reading are read again ([`Store::changed_since`]): an outage writes Machines one at a
    /// time, and reading (or even comparing) all 10 000 for each write dominated it.
    pub(crate) fn machines(&mut self, store: &Store, namespace: &str) -> Rc<Vec<Rc<MachineView>>> {
        let version = store.list_version(LOCAL_CLUSTER, CAPI_GROUP, "Machine", Some(namespace));
        let slot = self.machines.entry(namespace.to_string()).or_default();
        if let Some(kept) = slot.as_ref().filter(|kept| kept.at == version) {
            return kept.views.clone();
        }
        let (by_name, kept_selection) = match slot.take() {
            Some(kept) => {
                let (by_name, reselect) = machines_changed(store, namespace, kept.at, kept.by_name);
                (by_name, Some(kept.selection_version).filter(|_| !reselect))
            }
            None => (machines_read(store, namespace), None),
        };
        let selection_version = kept_selection.unwrap_or_else(|| {
            self.selection_changes += 1;
            self.selection_changes
        });
        let views = Rc::new(by_name.values().filter_map(|(_, view)| view.clone()).collect::<Vec<_>>());
        *self.machines.entry(namespace.to_string()).or_default() =
            Some(MachineList { at: version, views: views.clone(), by_name, selection_version });
        views
    }

    /// The target Machines of the MachineHealthCheck under `check` (of `namespace`, with
    /// `policy`), in key order: selected again only when a check's spec or a Machine's labels or
    /// annotations changed, not on each Machine status write.
    pub(crate) fn mhc_targets(
        &mut self,
        store: &Store,
        namespace: &str,
        check: &Key,
        policy: &MhcPolicy,
    ) -> Vec<Rc<MachineView>> {
        let machines = self.machines(store, namespace);
        let spec_version = self.mhc_peers(store, namespace).1;
        let Some(Some(list)) = self.machines.get(namespace) else { return Vec::new() };
        let version = (spec_version, list.selection_version);
        if let Some((at, names)) = self.targets.get(check)
            && *at == version
        {
            return names.iter().filter_map(|n| list.by_name.get(n).and_then(|(_, v)| v.clone())).collect();
        }
        let targets: Vec<Rc<MachineView>> =
            machines.iter().filter(|m| vigil_engine::target::is_target(policy, m)).cloned().collect();
        let names = targets.iter().map(|m| m.meta.name.clone()).collect();
        self.targets.insert(check.clone(), (version, Rc::new(names)));
        targets
    }

    /// The management cluster's Nodes.
    pub(crate) fn nodes(&mut self, store: &Store) -> Rc<Vec<NodeView>> {
        let version = store.list_version(LOCAL_CLUSTER, "", "Node", None);
        current(&mut self.nodes, version, || {
            store.list(LOCAL_CLUSTER, "", "Node", None).filter_map(|(_, v)| NodeView::read(v)).collect()
        })
    }

    /// The namespaces with a Machine of the Node `node` (by `status.nodeRef`).
    pub(crate) fn machine_namespaces(&mut self, store: &Store, node: &str) -> BTreeSet<String> {
        let version = store.list_version(LOCAL_CLUSTER, CAPI_GROUP, "Machine", None);
        let by_node = current(&mut self.machine_namespaces, version, || {
            let mut by_node: HashMap<String, BTreeSet<String>> = HashMap::new();
            for (k, m) in store.list(LOCAL_CLUSTER, CAPI_GROUP, "Machine", None) {
                let node = m.pointer("/status/nodeRef/name").and_then(serde_json::Value::as_str).unwrap_or("");
                by_node.entry(node.to_string()).or_default().insert(k.namespace.clone());
            }
            by_node
        });
        by_node.get(node).cloned().unwrap_or_default()
    }

    /// Every object of the management cluster that may be a remediation object.
    pub(crate) fn remediation_objects(&mut self, store: &Store) -> Rc<Vec<RemediationView>> {
        let version = store.version_of(|c, g, _, _| may_remediate(c, g));
        current(&mut self.remediation_objects, version, || {
            store
                .all()
                .filter(|(k, _)| may_remediate(&k.cluster, &k.group))
                .filter_map(|(_, v)| RemediationView::read(v))
                .collect()
        })
    }

    /// The MachineHealthCheck under `key`, parsed and validated (`None`: gone or invalid).
    pub(crate) fn mhc(&mut self, store: &Store, key: &Key) -> Option<Rc<(MachineHealthCheck, MhcPolicy)>> {
        let rv = rv_of(store.get(key)?)?;
        if let Some((at, parsed)) = self.mhcs.get(key)
            && *at == rv
        {
            return parsed.clone();
        }
        let parsed = parse_valid(store.get(key)?.clone(), validate::machine_health_check).ok().map(Rc::new);
        self.mhcs.insert(key.clone(), (rv.to_string(), parsed.clone()));
        parsed
    }

    /// The valid MachineHealthChecks of `namespace`, in key order, with the version of their
    /// metadata and specs. Each is parsed again only when it changed; a status write moves the
    /// list's store version but not its spec version, so what is derived from the specs alone
    /// (the checks' claims) is kept across the decisions' status writes.
    pub(crate) fn mhc_peers(&mut self, store: &Store, namespace: &str) -> Peers {
        let version = store.list_version(LOCAL_CLUSTER, GROUP, "MachineHealthCheck", Some(namespace));
        if let Some(kept) = self.peers.get(namespace).filter(|kept| kept.at == version) {
            return (kept.checks.clone(), kept.spec_version);
        }
        let keys: Vec<Key> = store
            .list(LOCAL_CLUSTER, GROUP, "MachineHealthCheck", Some(namespace))
            .map(|(key, _)| key.clone())
            .collect();
        let checks: Vec<Rc<(MachineHealthCheck, MhcPolicy)>> =
            keys.iter().filter_map(|key| self.mhc(store, key)).collect();
        let unchanged = self.peers.get(namespace).is_some_and(|kept| {
            kept.checks.len() == checks.len()
                && kept.checks.iter().zip(&checks).all(|(a, b)| same_but_status(&a.0, &b.0))
        });
        let spec_version = match self.peers.get(namespace) {
            Some(kept) if unchanged => kept.spec_version,
            _ => {
                self.spec_changes += 1;
                self.spec_changes
            }
        };
        let checks = Rc::new(checks);
        let ranked = self.peers.get(namespace).filter(|_| unchanged).and_then(|kept| kept.ranked.clone());
        self.peers
            .insert(namespace.to_string(), PeerList { at: version, checks: checks.clone(), spec_version, ranked });
        (checks, spec_version)
    }

    /// The valid MachineHealthChecks of `namespace` ranked ([`vigil_engine::peers`]), ranked
    /// again only when a check's metadata or spec changed.
    pub(crate) fn mhc_ranking(&mut self, store: &Store, namespace: &str) -> Rc<KeptPeers> {
        let (checks, _) = self.mhc_peers(store, namespace);
        if let Some(ranked) = self.peers.get(namespace).and_then(|kept| kept.ranked.clone()) {
            return ranked;
        }
        let ranked = Rc::new(KeptPeers::rank(checks.iter().map(|c| (&c.0, Arc::new(c.1.clone())))));
        if let Some(kept) = self.peers.get_mut(namespace) {
            kept.ranked = Some(Rc::clone(&ranked));
        }
        ranked
    }

    /// The NodeHealthCheck under `key`, parsed and validated (`None`: gone or invalid).
    pub(crate) fn nhc(&mut self, store: &Store, key: &Key) -> Option<Rc<(NodeHealthCheck, NhcPolicy)>> {
        let rv = rv_of(store.get(key)?)?;
        if let Some((at, parsed)) = self.nhcs.get(key)
            && *at == rv
        {
            return parsed.clone();
        }
        let parsed = parse_valid(store.get(key)?.clone(), validate::node_health_check).ok().map(Rc::new);
        self.nhcs.insert(key.clone(), (rv.to_string(), parsed.clone()));
        parsed
    }

    /// Every health check, MachineHealthChecks then NodeHealthChecks, each in key order, parsed:
    /// walked for every change, so read again only when a check changed.
    pub(crate) fn checks(&mut self, store: &Store) -> Rc<Vec<KeptCheck>> {
        let version = store.version_of(|c, g, k, _| c == LOCAL_CLUSTER && g == GROUP && is_check_kind(k));
        if let Some(kept) = self.checks.as_ref().filter(|kept| kept.at == version) {
            return kept.checks.clone();
        }
        let mut checks = Vec::new();
        for (key, id) in check_refs(store) {
            let parsed = match id {
                CheckRef::Machine { .. } => self.mhc(store, key).map(ParsedCheck::Machine),
                CheckRef::Node { .. } => self.nhc(store, key).map(ParsedCheck::Node),
            };
            checks.push(KeptCheck { id, parsed });
        }
        let checks = Rc::new(checks);
        self.checks = Some(CheckList { at: version, checks: checks.clone(), ages: None });
        checks
    }

    /// Every valid check's `maxConditionAge`s, what a heartbeat is measured against (the
    /// controller keeps the same, built when its checks change).
    pub(crate) fn guarded_ages(&mut self, store: &Store) -> Rc<GuardedAges> {
        let checks = self.checks(store);
        if let Some(ages) = self.checks.as_ref().and_then(|kept| kept.ages.clone()) {
            return ages;
        }
        let rules = checks.iter().flat_map(|c| match &c.parsed {
            Some(ParsedCheck::Machine(parsed)) => parsed.1.node_conditions.iter(),
            Some(ParsedCheck::Node(parsed)) => parsed.1.conditions.iter(),
            None => [].iter(),
        });
        let ages = Rc::new(GuardedAges::of(rules));
        if let Some(kept) = self.checks.as_mut() {
            kept.ages = Some(ages.clone());
        }
        ages
    }

    /// The remediation objects of `kind` (of `group`) in `namespace`, in key order: read for every
    /// NodeHealthCheck decision, for each of its steps.
    pub(crate) fn remediations(
        &mut self,
        store: &Store,
        group: &str,
        kind: &str,
        namespace: &str,
    ) -> Rc<Vec<RemediationView>> {
        let slot = self.remediations.entry((group.to_string(), kind.to_string(), namespace.to_string())).or_default();
        listed(slot, store, (group, kind, Some(namespace)), RemediationView::read)
    }

    /// The Leases of `namespace`, in key order: read for every NodeHealthCheck decision.
    pub(crate) fn leases(&mut self, store: &Store, namespace: &str) -> Rc<Vec<LeaseView>> {
        let slot = self.leases.entry(namespace.to_string()).or_default();
        listed(slot, store, (LEASE_GROUP, "Lease", Some(namespace)), LeaseView::read)
    }

    /// Every NodeMaintenance, in key order: read for every NodeHealthCheck decision.
    pub(crate) fn maintenances(&mut self, store: &Store) -> Rc<Vec<MaintenanceView>> {
        listed(&mut self.maintenances, store, (MAINTENANCE_GROUP, "NodeMaintenance", None), MaintenanceView::read)
    }

    /// Every ClusterVersion, in key order: read for every NodeHealthCheck decision.
    pub(crate) fn cluster_versions(&mut self, store: &Store) -> Rc<Vec<ClusterVersionView>> {
        let scope = (CLUSTER_VERSION_GROUP, "ClusterVersion", None);
        listed(&mut self.cluster_versions, store, scope, ClusterVersionView::read)
    }

    /// Every OpenShift Machine, in key order: read for every NodeHealthCheck decision.
    pub(crate) fn openshift_machines(&mut self, store: &Store) -> Rc<Vec<OpenShiftMachineView>> {
        let scope = (OPENSHIFT_MACHINE_GROUP, "Machine", None);
        listed(&mut self.openshift_machines, store, scope, OpenShiftMachineView::read)
    }

    /// A check's claims as last computed, if computed at `version`.
    pub(crate) fn claims(&self, check: &CheckRef, version: ClaimsAt) -> Option<Rc<Vec<Claim>>> {
        self.claims.get(check).filter(|(at, _)| *at == version).map(|(_, c)| c.clone())
    }

    /// Keeps a check's claims computed at `version`.
    pub(crate) fn keep_claims(&mut self, check: CheckRef, version: ClaimsAt, claims: Rc<Vec<Claim>>) {
        self.claims.insert(check, (version, claims));
    }
}

/// Every Machine of `namespace` by name, with its resource version and what it reads as.
fn machines_read(store: &Store, namespace: &str) -> MachinesByName {
    store
        .list(LOCAL_CLUSTER, CAPI_GROUP, "Machine", Some(namespace))
        .map(|(key, object)| {
            (key.name.clone(), (rv_of(object).unwrap_or("").to_string(), MachineView::read(object).map(Rc::new)))
        })
        .collect()
}

/// `by_name`, read at store version `at`, brought up to date by reading again only the Machines
/// of `namespace` changed since; and whether what selects targets moved (a Machine came, went,
/// or changed its labels or annotations).
fn machines_changed(store: &Store, namespace: &str, at: u64, mut by_name: MachinesByName) -> (MachinesByName, bool) {
    let changed: BTreeSet<&str> = store.changed_since(LOCAL_CLUSTER, CAPI_GROUP, "Machine", namespace, at).collect();
    let mut reselect = false;
    for name in changed {
        let key = Key {
            cluster: LOCAL_CLUSTER.to_string(),
            group: CAPI_GROUP.to_string(),
            kind: "Machine".to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let Some(object) = store.get(&key) else {
            reselect |= by_name.remove(name).is_some();
            continue;
        };
        let rv = rv_of(object).unwrap_or("");
        match by_name.get_mut(name) {
            Some((kept_rv, _)) if kept_rv == rv => {}
            Some((kept_rv, view)) => {
                let fresh = MachineView::read(object).map(Rc::new);
                reselect |= !same_selection(view.as_deref(), fresh.as_deref());
                rv.clone_into(kept_rv);
                *view = fresh;
            }
            None => {
                by_name.insert(name.to_string(), (rv.to_string(), MachineView::read(object).map(Rc::new)));
                reselect = true;
            }
        }
    }
    (by_name, reselect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> jiff::Timestamp {
        "2030-01-01T00:00:00Z".parse().expect("a time")
    }

    fn machine(name: &str, pool: &str) -> serde_json::Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "labels": {"pool": pool, "cluster.x-k8s.io/cluster-name": "prod"}},
            "spec": {"clusterName": "prod"}, "status": {"nodeRef": {"name": name}}})
    }

    fn check(pool: &str) -> serde_json::Value {
        json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "MachineHealthCheck",
            "metadata": {"name": "workers", "namespace": "ns"},
            "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": pool}},
                "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "300s"}]}})
    }

    fn object(
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        spec: serde_json::Value,
    ) -> serde_json::Value {
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace}, "spec": spec})
    }

    fn lease(namespace: &str, holder: &str) -> serde_json::Value {
        object("coordination.k8s.io/v1", "Lease", namespace, "node-n1", json!({"holderIdentity": holder}))
    }

    fn targets(views: &mut Views, store: &Store, key: &Key) -> Vec<String> {
        let parsed = views.mhc(store, key).expect("a valid check");
        views.mhc_targets(store, "ns", key, &parsed.1).iter().map(|m| m.meta.name.clone()).collect()
    }

    fn selection(views: &Views) -> u64 {
        views.machines.get("ns").and_then(Option::as_ref).map(|list| list.selection_version).expect("read")
    }

    fn names(views: &mut Views, store: &Store) -> Vec<String> {
        views.machines(store, "ns").iter().map(|m| m.meta.name.clone()).collect()
    }

    #[test]
    fn machines_are_read_again_only_when_written_and_the_selection_moves_with_labels_and_membership() {
        let mut store = Store::default();
        let m1 = store.apply(LOCAL_CLUSTER, machine("m1", "a"), now());
        store.apply(LOCAL_CLUSTER, machine("m3", "a"), now());
        let mut views = Views::default();
        assert_eq!(names(&mut views, &store), ["m1", "m3"]);
        let first = selection(&views);
        let m3_before = views.machines(&store, "ns")[1].clone();
        store.set_status(&m1, json!({"nodeRef": {"name": "other"}}));
        let machines = views.machines(&store, "ns");
        assert_eq!(machines[0].node_name.as_deref(), Some("other"), "a status write is read again");
        assert!(Rc::ptr_eq(&machines[1], &m3_before), "an unchanged Machine is not read again");
        assert_eq!(selection(&views), first, "a status write selects nothing new");
        store.apply(LOCAL_CLUSTER, machine("m1", "b"), now());
        assert_eq!(names(&mut views, &store), ["m1", "m3"]);
        let relabelled = selection(&views);
        assert_ne!(relabelled, first, "a relabelled Machine moves the selection");
        store.apply(LOCAL_CLUSTER, machine("m2", "a"), now());
        assert_eq!(names(&mut views, &store), ["m1", "m2", "m3"], "a new Machine comes in name order");
        let added = selection(&views);
        assert_ne!(added, relabelled, "a new Machine moves the selection");
        store.delete(&m1);
        assert_eq!(names(&mut views, &store), ["m2", "m3"], "a deleted Machine is gone");
        assert_ne!(selection(&views), added, "a deleted Machine moves the selection");
        let m4 = store.apply(LOCAL_CLUSTER, machine("m4", "a"), now());
        store.delete(&m4);
        store.delete(&Key::of(LOCAL_CLUSTER, &machine("m3", "a")));
        store.apply(LOCAL_CLUSTER, machine("m0", "a"), now());
        assert_eq!(names(&mut views, &store), ["m0", "m2"], "Machines before, between and after the kept ones");
    }

    #[test]
    fn the_kept_checks_follow_the_store_and_each_parses_once() {
        let mut store = Store::default();
        let key = store.apply(LOCAL_CLUSTER, check("a"), now());
        let mut views = Views::default();
        let first = views.checks(&store);
        assert_eq!(first.len(), 1);
        assert!(Rc::ptr_eq(&first, &views.checks(&store)), "kept while no check changed");
        store.apply(LOCAL_CLUSTER, machine("m1", "a"), now());
        assert!(Rc::ptr_eq(&first, &views.checks(&store)), "a Machine write leaves the checks as read");
        store.set_status(&key, json!({"currentHealthy": 1}));
        let after = views.checks(&store);
        let healthy = |c: &KeptCheck| match &c.parsed {
            Some(ParsedCheck::Machine(p)) => p.0.status.as_ref().map(|s| s.current_healthy),
            _ => None,
        };
        assert_eq!(healthy(&after[0]), Some(1), "a status write is read again");
        store.delete(&key);
        assert!(views.checks(&store).is_empty(), "a deleted check is gone");
    }

    #[test]
    fn a_check_status_write_keeps_the_spec_version_and_a_spec_change_moves_it() {
        let mut store = Store::default();
        let key = store.apply(LOCAL_CLUSTER, check("a"), now());
        let mut views = Views::default();
        let (_, first) = views.mhc_peers(&store, "ns");
        store.set_status(&key, json!({"currentHealthy": 1}));
        let (checks, after_status) = views.mhc_peers(&store, "ns");
        assert_eq!(first, after_status, "a status write leaves what claims read unchanged");
        assert_eq!(checks.len(), 1);
        store.apply(LOCAL_CLUSTER, check("b"), now());
        let (_, after_spec) = views.mhc_peers(&store, "ns");
        assert_ne!(first, after_spec, "a changed selector is a change to what claims read");
    }

    #[test]
    fn targets_follow_relabelled_added_and_removed_machines_but_not_status_writes() {
        let mut store = Store::default();
        let key = store.apply(LOCAL_CLUSTER, check("a"), now());
        store.apply(LOCAL_CLUSTER, machine("m1", "a"), now());
        let m2 = store.apply(LOCAL_CLUSTER, machine("m2", "b"), now());
        let mut views = Views::default();
        assert_eq!(targets(&mut views, &store, &key), ["m1"]);
        store.apply(LOCAL_CLUSTER, machine("m2", "a"), now());
        assert_eq!(targets(&mut views, &store, &key), ["m1", "m2"], "a relabelled Machine is selected");
        store.apply(LOCAL_CLUSTER, machine("m3", "a"), now());
        assert_eq!(targets(&mut views, &store, &key), ["m1", "m2", "m3"], "a new Machine is selected");
        store.delete(&m2);
        assert_eq!(targets(&mut views, &store, &key), ["m1", "m3"], "a deleted Machine is no target");
        let m1 = Key::of(LOCAL_CLUSTER, &machine("m1", "a"));
        store.set_status(&m1, json!({"nodeRef": {"name": "other"}}));
        let read = views.mhc(&store, &key).expect("a valid check");
        let now_read = views.mhc_targets(&store, "ns", &key, &read.1);
        assert_eq!(now_read[0].node_name.as_deref(), Some("other"), "a target is the Machine as it is now");
        store.apply(LOCAL_CLUSTER, check("b"), now());
        assert_eq!(targets(&mut views, &store, &key), Vec::<String>::new(), "a changed selector selects again");
    }

    #[test]
    fn the_leases_of_a_namespace_are_read_again_after_a_lease_write_there_and_not_otherwise() {
        let mut store = Store::default();
        let key = store.apply(LOCAL_CLUSTER, lease("leases", "a"), now());
        let mut views = Views::default();
        let first = views.leases(&store, "leases");
        assert_eq!(first[0].holder.as_deref(), Some("a"));
        assert!(Rc::ptr_eq(&first, &views.leases(&store, "leases")), "kept while no Lease changed");
        store.apply(LOCAL_CLUSTER, machine("m1", "a"), now());
        store.apply(LOCAL_CLUSTER, lease("elsewhere", "x"), now());
        assert!(
            Rc::ptr_eq(&first, &views.leases(&store, "leases")),
            "a write to another kind or another namespace's Lease leaves them as read"
        );
        assert_eq!(views.leases(&store, "elsewhere")[0].holder.as_deref(), Some("x"), "each namespace is its own");
        store.apply(LOCAL_CLUSTER, lease("leases", "b"), now());
        assert_eq!(views.leases(&store, "leases")[0].holder.as_deref(), Some("b"), "a Lease write is read again");
        store.delete(&key);
        assert!(views.leases(&store, "leases").is_empty(), "a deleted Lease is gone");
    }

    #[test]
    fn remediation_objects_of_a_kind_and_namespace_are_read_again_after_a_write_to_them_and_not_otherwise() {
        let api = "self-node-remediation.medik8s.io/v1alpha1";
        let group = "self-node-remediation.medik8s.io";
        let remediation = |kind: &str, namespace: &str, name: &str| object(api, kind, namespace, name, json!({}));
        let mut store = Store::default();
        store.apply(LOCAL_CLUSTER, remediation("SelfNodeRemediation", "r", "n1"), now());
        let mut views = Views::default();
        let read = |views: &mut Views, store: &Store| views.remediations(store, group, "SelfNodeRemediation", "r");
        let first = read(&mut views, &store);
        assert_eq!(first.len(), 1);
        assert!(Rc::ptr_eq(&first, &read(&mut views, &store)), "kept while none changed");
        store.apply(LOCAL_CLUSTER, remediation("SelfNodeRemediation", "other", "n1"), now());
        store.apply(LOCAL_CLUSTER, remediation("SelfNodeRemediationTemplate", "r", "t"), now());
        store.apply(LOCAL_CLUSTER, lease("r", "a"), now());
        assert!(
            Rc::ptr_eq(&first, &read(&mut views, &store)),
            "a write to another namespace, kind or group leaves them as read"
        );
        assert_eq!(views.remediations(&store, group, "SelfNodeRemediation", "other").len(), 1);
        let n2 = store.apply(LOCAL_CLUSTER, remediation("SelfNodeRemediation", "r", "n2"), now());
        let names: Vec<String> = read(&mut views, &store).iter().map(|r| r.meta.name.clone()).collect();
        assert_eq!(names, ["n1", "n2"], "a new one is read, in key order");
        store.set_status(&n2, json!({"conditions": [{"type": "Succeeded", "status": "True"}]}));
        assert_eq!(read(&mut views, &store)[1].conditions.len(), 1, "a status write is read again");
        store.delete(&n2);
        assert_eq!(read(&mut views, &store).len(), 1, "a deleted one is gone");
    }

    #[test]
    fn maintenances_cluster_versions_and_openshift_machines_are_each_read_again_only_after_a_write_to_their_kind() {
        let mut store = Store::default();
        let maintenance = |node: &str| {
            object("nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance", "", "m", json!({"nodeName": node}))
        };
        let version = |v: &str| {
            let mut o = object("config.openshift.io/v1", "ClusterVersion", "", "version", json!({}));
            o["status"] = json!({"desired": {"version": v}});
            o
        };
        let openshift_machine =
            |name: &str| object("machine.openshift.io/v1beta1", "Machine", "openshift-machine-api", name, json!({}));
        store.apply(LOCAL_CLUSTER, maintenance("n1"), now());
        store.apply(LOCAL_CLUSTER, version("4.1"), now());
        store.apply(LOCAL_CLUSTER, openshift_machine("a"), now());
        let mut views = Views::default();
        let maintenances = views.maintenances(&store);
        let versions = views.cluster_versions(&store);
        let machines = views.openshift_machines(&store);
        assert_eq!(maintenances[0].node_name.as_deref(), Some("n1"));
        assert_eq!(versions[0].desired_version.as_deref(), Some("4.1"));
        assert_eq!(machines.len(), 1);
        store.apply(LOCAL_CLUSTER, machine("m1", "a"), now());
        store.apply(LOCAL_CLUSTER, lease("leases", "a"), now());
        assert!(Rc::ptr_eq(&maintenances, &views.maintenances(&store)), "kept while no NodeMaintenance changed");
        assert!(Rc::ptr_eq(&versions, &views.cluster_versions(&store)), "kept while no ClusterVersion changed");
        assert!(
            Rc::ptr_eq(&machines, &views.openshift_machines(&store)),
            "a Cluster API Machine is not an OpenShift Machine"
        );
        store.apply(LOCAL_CLUSTER, maintenance("n2"), now());
        assert_eq!(
            views.maintenances(&store)[0].node_name.as_deref(),
            Some("n2"),
            "a NodeMaintenance write is read again"
        );
        assert!(Rc::ptr_eq(&versions, &views.cluster_versions(&store)), "and moves no other kind");
        assert!(Rc::ptr_eq(&machines, &views.openshift_machines(&store)));
        store.apply(LOCAL_CLUSTER, version("4.2"), now());
        assert_eq!(
            views.cluster_versions(&store)[0].desired_version.as_deref(),
            Some("4.2"),
            "a ClusterVersion write is read again"
        );
        assert!(Rc::ptr_eq(&machines, &views.openshift_machines(&store)));
        store.apply(LOCAL_CLUSTER, openshift_machine("b"), now());
        assert_eq!(views.openshift_machines(&store).len(), 2, "an OpenShift Machine write is read again");
    }
}
