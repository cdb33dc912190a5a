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
use vigil_index::index::{GroupKind, Index, Source, WorkloadCluster};
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
        let local = Source::Nodes(LOCAL_CLUSTER.to_string());
        for source in [Source::Mhcs, Source::Nhcs, Source::Machines, Source::Clusters, Source::Leases, local] {
            *index.state_mut(&source) = SourceState::Synced;
        }
        index.set_lease_namespace(lease_namespace.to_string());
        index.surrounding_mut(Around::maintenances).listed_served(false);
        index.surrounding_mut(Around::cluster_versions).listed_served(false);
        index.surrounding_mut(Around::openshift_machines).listed_served(false);
        for cluster in &workload {
            *index.state_mut(&Source::Nodes(cluster.clone())) = SourceState::Synced;
            if let Some(w) = WorkloadCluster::from_key(cluster) {
                index.connected(&w, false);
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
            (LEASE_GROUP, "Lease") if key.namespace == self.index.around().lease_namespace() => {
                self.index.put_lease(key.name.clone(), object.and_then(LeaseView::read))
            }
            (MAINTENANCE_GROUP, "NodeMaintenance") => {
                self.surrounding(Around::maintenances, key, object.and_then(MaintenanceView::read))
            }
            (CLUSTER_VERSION_GROUP, "ClusterVersion") => {
                self.surrounding(Around::cluster_versions, key, object.and_then(ClusterVersionView::read))
            }
            (OPENSHIFT_MACHINE_GROUP, "Machine") => {
                self.surrounding(Around::openshift_machines, key, object.and_then(OpenShiftMachineView::read))
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
        let kept = self.index.surrounding_mut(slot);
        let any = !kept.items().is_empty();
        kept.listed_served(any);
        concerned
    }

    /// A cluster a MachineHealthCheck names is connected as the controller's connection would
    /// find it: a cluster of the scenario's `workloadClusters` is a cluster of its own, any other
    /// is the management cluster, whose Nodes it reads through the shared cache.
    fn connect(&mut self, cluster: &WorkloadCluster) {
        let key = cluster.key();
        if self.workload.contains(&key) || self.index.hosting().is_known(cluster) {
            return;
        }
        self.index.connected(cluster, true);
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
            *self.index.state_mut(&Source::Kind(gk)) = SourceState::Synced;
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
