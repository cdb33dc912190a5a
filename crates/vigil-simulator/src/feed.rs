//! The scenario's store as the controller's watches would deliver it, into the one read side both
//! adapters decide from ([`vigil_index`]): each change is put into the same index `vigil run`
//! keeps, and the index says which checks it concerns. What a check needs watched (a template
//! kind, a workload cluster's Nodes) is "listed" from the store when a decision first asks for
//! it, as the controller starts a watch; the store is always complete, so every source is synced.

use crate::store::{Key, Store};
use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use vigil_api::GROUP;
use vigil_api::views::{ClusterVersionView, LeaseView, MaintenanceView, NodeView, OpenShiftMachineView};
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER};
use vigil_index::around::{Around, Kept};
use vigil_index::index::{GroupKind, Index, WorkloadCluster};
use vigil_index::lenient;
use vigil_index::sources::{Need, SourceState};

/// API group of Cluster API's Machines and Clusters.
pub(crate) const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// API group of node Leases.
const LEASE_GROUP: &str = "coordination.k8s.io";
/// API group of medik8s' `NodeMaintenance`.
const MAINTENANCE_GROUP: &str = "nodemaintenance.medik8s.io";
/// API group of OpenShift's `ClusterVersion`.
const CLUSTER_VERSION_GROUP: &str = "config.openshift.io";
/// API group of OpenShift's Machine API `Machine` (owner of its Node's remediation objects).
const OPENSHIFT_MACHINE_GROUP: &str = "machine.openshift.io";

/// The read side as the simulator fills it: the controller's index, and which kinds it watches.
pub(crate) struct Feed {
    /// The same index `vigil run` keeps.
    pub(crate) index: Index,
    /// The kinds a check asked for, each with whether its objects are templates.
    watched: BTreeMap<GroupKind, bool>,
    /// The clusters the scenario defines Nodes for; any other cluster a check names is the
    /// management cluster itself (docs/scenario.md).
    workload: BTreeSet<String>,
}

impl Feed {
    /// An index with every fixed source listed: the scenario is all there is.
    pub(crate) fn new(lease_namespace: &str, workload: BTreeSet<String>) -> Feed {
        let mut index = Index::default();
        for state in
            [&mut index.sources.mhcs, &mut index.sources.nhcs, &mut index.sources.machines, &mut index.sources.clusters]
        {
            *state = SourceState::Synced;
        }
        index.nodes.entry(LOCAL_CLUSTER.to_string()).or_default().state = SourceState::Synced;
        index.around.lease_namespace = lease_namespace.to_string();
        index.around.leases.state = SourceState::Synced;
        for kept in [&mut index.around.maintenances.state, &mut index.around.cluster_versions.state] {
            *kept = SourceState::Synced;
        }
        index.around.openshift_machines.state = SourceState::Synced;
        index.around.maintenances.served = Some(false);
        index.around.cluster_versions.served = Some(false);
        index.around.openshift_machines.served = Some(false);
        for cluster in &workload {
            index.nodes.entry(cluster.clone()).or_default().state = SourceState::Synced;
            if let Some(w) = WorkloadCluster::from_key(cluster) {
                index.hosting.connected(&w, false);
            }
        }
        Feed { index, watched: BTreeMap::new(), workload }
    }

    /// Puts the store's version of the object under `key` (none: it is gone) into the index;
    /// returns the checks the change concerns.
    pub(crate) fn put(&mut self, store: &Store, key: &Key, now: Timestamp) -> BTreeSet<CheckRef> {
        let object = store.get(key);
        let named = || Some((key.namespace.clone(), key.name.clone()));
        if key.group.is_empty() && key.kind == "Node" {
            return self.index.put_node(&key.cluster, object.and_then(NodeView::read), Some(key.name.clone()), now);
        }
        if key.cluster != LOCAL_CLUSTER {
            return BTreeSet::new();
        }
        match (key.group.as_str(), key.kind.as_str()) {
            (CAPI_GROUP, "Machine") => self.index.put_machine(object, named()),
            (CAPI_GROUP, "Cluster") => self.index.put_cluster(object, named()),
            (GROUP, "MachineHealthCheck") => {
                let read = object.map(|o| lenient::read_mhc(o.clone()));
                if let Some((check, _)) = &read {
                    self.connect(&WorkloadCluster::new(&key.namespace, &check.spec.cluster_name));
                }
                self.index.put_mhc_read(read, named())
            }
            (GROUP, "NodeHealthCheck") => {
                self.index.put_nhc_read(object.map(|o| lenient::read_nhc(o.clone())), Some(key.name.clone()))
            }
            (LEASE_GROUP, "Lease") if key.namespace == self.index.around.lease_namespace => {
                self.index.put_lease(key.name.clone(), object.and_then(LeaseView::read))
            }
            (MAINTENANCE_GROUP, "NodeMaintenance") => {
                self.surrounding(|a| &mut a.maintenances, key, object.and_then(MaintenanceView::read))
            }
            (CLUSTER_VERSION_GROUP, "ClusterVersion") => {
                self.surrounding(|a| &mut a.cluster_versions, key, object.and_then(ClusterVersionView::read))
            }
            (OPENSHIFT_MACHINE_GROUP, "Machine") => {
                self.surrounding(|a| &mut a.openshift_machines, key, object.and_then(OpenShiftMachineView::read))
            }
            (group, kind) => {
                let gk = (group.to_string(), kind.to_string());
                match self.watched.get(&gk) {
                    Some(template) => self.index.put_object(&gk, *template, object, named()),
                    None => BTreeSet::new(),
                }
            }
        }
    }

    /// One of the kinds around the Nodes: served while the scenario has any object of it (a kind
    /// with none counts as not served, as on a cluster without its CRD).
    fn surrounding<V>(
        &mut self,
        slot: fn(&mut Around) -> &mut Kept<V>,
        key: &Key,
        view: Option<V>,
    ) -> BTreeSet<CheckRef> {
        let name = if key.namespace.is_empty() { key.name.clone() } else { key.object_name() };
        let concerned = self.index.put_surrounding(slot, name, view);
        let kept = slot(&mut self.index.around);
        kept.served = Some(!kept.items.is_empty());
        concerned
    }

    /// A cluster a MachineHealthCheck names is connected as the controller's connection would
    /// find it: a cluster of the scenario's `workloadClusters` is a cluster of its own, any other
    /// is the management cluster, whose Nodes it reads through the shared cache.
    fn connect(&mut self, cluster: &WorkloadCluster) {
        let key = cluster.key();
        if self.workload.contains(&key) || self.index.hosting.is_known(cluster) {
            return;
        }
        self.index.hosting.connected(cluster, true);
        self.index.share_local_nodes(cluster);
    }

    /// Starts what a decision needs watched: a kind's objects are listed from the store into the
    /// index. Returns whether anything was new (the check is then decided again on it, as the
    /// controller decides a check again once the list it waited for is in).
    pub(crate) fn watch(&mut self, store: &Store, needs: &BTreeSet<Need>, now: Timestamp) -> bool {
        let mut new = false;
        for need in needs {
            let Need::Kind { group, kind, template, .. } = need else { continue };
            let gk = (group.clone(), kind.clone());
            if self.watched.contains_key(&gk) {
                continue;
            }
            self.watched.insert(gk.clone(), *template);
            let keys: Vec<Key> = store.list(LOCAL_CLUSTER, group, kind, None).map(|(k, _)| k.clone()).collect();
            for key in &keys {
                self.put(store, key, now);
            }
            self.index.objects.entry(gk).or_default().state = SourceState::Synced;
            new = true;
        }
        new
    }
}

/// Where a health check is stored.
pub(crate) fn check_key(id: &CheckRef) -> Key {
    let (kind, namespace, name) = match id {
        CheckRef::Machine { namespace, name } => ("MachineHealthCheck", namespace.clone(), name.clone()),
        CheckRef::Node { name } => ("NodeHealthCheck", String::new(), name.clone()),
    };
    Key { cluster: LOCAL_CLUSTER.into(), group: GROUP.into(), kind: kind.into(), namespace, name }
}
