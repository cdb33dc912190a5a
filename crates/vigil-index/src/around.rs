//! What the index keeps of a NodeHealthCheck's surroundings: the node Leases and the optional
//! kinds, each with whether it is served and whether its watch has listed. State only, below the
//! index; the controller's watches fill it, the simulator from its scenario.

use crate::sources::SourceState;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_api::views::{ClusterVersionView, LeaseView, MaintenanceView, OpenShiftMachineView};
use vigil_api::well_known::{DEFAULT_LEASE_NAMESPACE, LEASE_NAMESPACE_ENV};
use vigil_engine::lookup::Observed;

/// The lease namespace a controller uses unless told: `LEASE_NAMESPACE`, as medik8s' operators
/// read it, else `medik8s-leases`.
pub fn default_lease_namespace() -> String {
    std::env::var(LEASE_NAMESPACE_ENV).ok().filter(|n| !n.is_empty()).unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.into())
}

/// Objects of one kind the index keeps by name, and whether they can be trusted.
#[derive(Debug)]
pub struct Kept<V> {
    /// Whether the API server serves the kind (`None`: discovery has not answered yet).
    pub(crate) served: Option<bool>,
    /// Whether the watch has listed.
    pub(crate) state: SourceState,
    /// The objects by name.
    pub(crate) items: BTreeMap<String, Arc<V>>,
}

impl<V> Default for Kept<V> {
    fn default() -> Self {
        Kept { served: None, state: SourceState::Syncing, items: BTreeMap::new() }
    }
}

impl<V> Kept<V> {
    /// Whether the API server serves the kind (`None`: discovery has not answered yet).
    pub fn served(&self) -> Option<bool> {
        self.served
    }

    /// The objects by name.
    pub fn items(&self) -> &BTreeMap<String, Arc<V>> {
        &self.items
    }

    /// Discovery's answer (`None`: it could not be asked): a kind no longer served is emptied
    /// and listed anew once served again. Returns whether its being served changed.
    pub fn discovered(&mut self, answer: Option<bool>) -> bool {
        let before = self.served;
        if answer.is_some() {
            self.served = answer;
        }
        if answer == Some(false) {
            self.items.clear();
            self.state = SourceState::Syncing;
        }
        before != self.served
    }

    /// Served or not, as a store that holds every object there is says (the simulator's: a kind
    /// with no object counts as not served); listed either way.
    pub fn listed_served(&mut self, served: bool) {
        self.served = Some(served);
        self.state = SourceState::Synced;
    }

    /// A complete list of the kind's objects, by name.
    pub fn replace(&mut self, items: impl IntoIterator<Item = (String, V)>) {
        self.items = items.into_iter().map(|(n, v)| (n, Arc::new(v))).collect();
    }

    /// Whether its watch has listed, to set.
    pub fn state_mut(&mut self) -> &mut SourceState {
        &mut self.state
    }

    /// What a decision may read: none when not served, the objects once listed, else unknown
    /// (with why, for the operator).
    pub fn observed<'a>(&self, what: &str, list: &'a [&'a V], why: &'a mut String) -> Observed<'a, &'a [&'a V]> {
        match (self.served, &self.state) {
            (Some(false), _) => Observed::NotServed,
            (Some(true), SourceState::Synced) => Observed::Known(list),
            (None, _) => {
                *why = format!("discovery has not said yet whether {what} are served");
                Observed::Unknown(why)
            }
            (Some(true), SourceState::Syncing) => {
                *why = format!("waiting for the first complete list of {what}");
                Observed::Unknown(why)
            }
            (Some(true), SourceState::Failed(e)) => {
                *why = format!("the watch of {what} failed ({e})");
                Observed::Unknown(why)
            }
        }
    }

    /// The objects, as a decision borrows them.
    pub fn refs(&self) -> Vec<&V> {
        self.items.values().map(Arc::as_ref).collect()
    }

    /// Keeps `item` under `name`, or forgets the name (`None`: the object is gone).
    pub fn put(&mut self, name: String, item: Option<V>) {
        match item {
            Some(v) => self.items.insert(name, Arc::new(v)),
            None => self.items.remove(&name),
        };
    }
}

/// Everything of this module the index keeps.
#[derive(Debug)]
pub struct Around {
    /// Where the node Leases live.
    pub(crate) lease_namespace: String,
    /// The lease namespace's Leases (always served).
    pub(crate) leases: Kept<LeaseView>,
    /// `NodeMaintenance`s.
    pub(crate) maintenances: Kept<MaintenanceView>,
    /// `ClusterVersion`s.
    pub(crate) cluster_versions: Kept<ClusterVersionView>,
    /// OpenShift Machine API `Machine`s (by `namespace/name`).
    pub(crate) openshift_machines: Kept<OpenShiftMachineView>,
}

impl Default for Around {
    fn default() -> Self {
        Around {
            lease_namespace: default_lease_namespace(),
            leases: Kept { served: Some(true), ..Kept::default() },
            maintenances: Kept::default(),
            cluster_versions: Kept::default(),
            openshift_machines: Kept::default(),
        }
    }
}

impl Around {
    /// Where the node Leases live.
    pub fn lease_namespace(&self) -> &str {
        &self.lease_namespace
    }

    /// medik8s `NodeMaintenance`s ([`crate::index::Index::surrounding_mut`]).
    pub fn maintenances(&mut self) -> &mut Kept<MaintenanceView> {
        &mut self.maintenances
    }

    /// OpenShift `ClusterVersion`s.
    pub fn cluster_versions(&mut self) -> &mut Kept<ClusterVersionView> {
        &mut self.cluster_versions
    }

    /// OpenShift Machine API `Machine`s.
    pub fn openshift_machines(&mut self) -> &mut Kept<OpenShiftMachineView> {
        &mut self.openshift_machines
    }

    /// Puts the API server's answer about a Lease (`None`: it is gone) into the index.
    pub fn put_lease(&mut self, name: &str, lease: Option<&Value>) {
        self.leases.put(name.to_string(), lease.and_then(LeaseView::read));
    }
}
