//! How the adapters that fill the index reach it besides `put_*`: what they may read of it, the
//! state each watched source reports ([`Source`]), a complete list replacing what a source held,
//! and what a workload cluster's connection found. The index's fields stay its own: every change
//! goes through a method here or a `put_*`, each of which returns or says the checks concerned.

use super::{ClaimCache, GroupKind, Index, MachineEntry, NodeCache, ObjectCache, WorkloadCluster};
use crate::around::{Around, Kept};
use crate::sources::Source;
use crate::sources::SourceState;
use crate::upstream::Upstream;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use vigil_api::views::{LeaseView, NodeView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER};

/// Reads.
impl Index {
    /// `vigil run --dry-run`: every check is decided in dry-run.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// The MachineHealthCheck `namespace/name`, as last stored.
    pub fn mhc(&self, namespace: &str, name: &str) -> Option<&Arc<MachineHealthCheck>> {
        self.mhcs.get(&(namespace.to_string(), name.to_string()))
    }

    /// The NodeHealthCheck `name`, as last stored.
    pub fn nhc(&self, name: &str) -> Option<&Arc<NodeHealthCheck>> {
        self.nhcs.get(name)
    }

    /// The Machine `namespace/name`, as last stored.
    pub fn machine(&self, namespace: &str, name: &str) -> Option<&MachineEntry> {
        self.machines.get(namespace).and_then(|m| m.get(name))
    }

    /// Whether the Cluster `cluster` is stored.
    pub fn has_cluster(&self, cluster: &WorkloadCluster) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// The Nodes of `cluster` as stored, with whether they can be trusted.
    pub fn node_cache(&self, cluster: &str) -> Option<&NodeCache> {
        self.nodes.get(cluster)
    }

    /// The objects of a template or remediation kind.
    pub fn object_cache(&self, gk: &GroupKind) -> Option<&ObjectCache> {
        self.objects.get(gk)
    }

    /// The state `source` last reported (`None`: it never did).
    pub fn state(&self, source: &Source) -> Option<&SourceState> {
        match source {
            Source::Mhcs => Some(&self.sources.mhcs),
            Source::Nhcs => Some(&self.sources.nhcs),
            Source::Machines => Some(&self.sources.machines),
            Source::Clusters => Some(&self.sources.clusters),
            Source::Nodes(cluster) => self.nodes.get(cluster).map(|c| &c.state),
            Source::Kind(gk) => self.objects.get(gk).map(|c| &c.state),
            Source::Leases => Some(&self.around.leases.state),
            Source::Medik8s => self.medik8s.as_ref().map(|u| &u.state),
        }
    }

    /// What a NodeHealthCheck reads around its Nodes.
    pub fn around(&self) -> &Around {
        &self.around
    }

    /// What each workload cluster's connection found.
    pub fn hosting(&self) -> &super::Hosting {
        &self.hosting
    }

    /// medik8s' NodeHealthChecks as read (`None`: `--serve-medik8s` is off).
    pub fn medik8s(&self) -> Option<&Upstream> {
        self.medik8s.as_ref()
    }

    /// Each check's claims as of its last decision.
    pub fn claims(&self) -> &ClaimCache {
        &self.claims
    }
}

/// What the adapters set.
impl Index {
    /// `vigil run --dry-run` on or off.
    pub fn set_dry_run(&mut self, dry_run: bool) {
        self.dry_run = dry_run;
    }

    /// Where the node Leases live.
    pub fn set_lease_namespace(&mut self, namespace: String) {
        self.around.lease_namespace = namespace;
    }

    /// The state `source` reports, to set: a source reported for the first time starts empty.
    pub fn state_mut(&mut self, source: &Source) -> &mut SourceState {
        match source {
            Source::Mhcs => &mut self.sources.mhcs,
            Source::Nhcs => &mut self.sources.nhcs,
            Source::Machines => &mut self.sources.machines,
            Source::Clusters => &mut self.sources.clusters,
            Source::Nodes(cluster) => &mut self.nodes.entry(cluster.clone()).or_default().state,
            Source::Kind(gk) => &mut self.objects.entry(gk.clone()).or_default().state,
            Source::Leases => &mut self.around.leases.state,
            Source::Medik8s => &mut self.medik8s.get_or_insert_with(Upstream::default).state,
        }
    }

    /// Cluster API cannot be read (`why`); returns the checks to tell, the first time only.
    pub fn capi_failed(&mut self, why: &str) -> Option<Vec<CheckRef>> {
        let failed = SourceState::Failed(why.to_string());
        let first = self.sources.machines != failed;
        self.sources.machines = failed.clone();
        self.sources.clusters = failed;
        first.then(|| self.all_mhcs())
    }

    /// One of the optional kinds around the Nodes, to report whether it is served, its state, or
    /// a complete list of it (every NodeHealthCheck reads them: see [`Index::put_surrounding`]).
    pub fn surrounding_mut<V>(&mut self, slot: fn(&mut Around) -> &mut Kept<V>) -> &mut Kept<V> {
        slot(&mut self.around)
    }

    /// Puts the API server's answer about a node Lease Vigil wrote (`None`: it is gone).
    pub fn remember_lease(&mut self, name: &str, lease: Option<&Value>) {
        self.around.put_lease(name, lease);
    }

    /// A complete list of the lease namespace's Leases.
    pub fn replace_leases(&mut self, leases: impl IntoIterator<Item = LeaseView>) {
        self.around.leases.items = leases.into_iter().map(|l| (l.meta.name.clone(), Arc::new(l))).collect();
    }

    /// Starts serving medik8s' NodeHealthChecks (`--serve-medik8s`).
    pub fn serve_medik8s(&mut self) {
        self.medik8s.get_or_insert_with(Upstream::default);
    }

    /// Records why medik8s' checks are not decided (`None`: they are) and puts them into or
    /// takes them out of the decisions; `None` when that did not change in kind (or the mode is
    /// off), else the checks to decide again.
    pub fn stop_medik8s(&mut self, stop: Option<crate::upstream::Stop>) -> Option<BTreeSet<CheckRef>> {
        let up = self.medik8s.as_mut()?;
        let same = match (&up.stop, &stop) {
            (Some(a), Some(b)) => a.same_kind(b),
            (None, None) => true,
            _ => false,
        };
        if same {
            return None;
        }
        up.stop = stop;
        Some(self.sync_all_medik8s())
    }
}

/// Complete lists, replacing what a source held.
impl Index {
    /// Every Cluster, after a complete list (the held shards' Clusters are listed then).
    pub fn replace_clusters(&mut self, list: Vec<Value>) {
        self.clusters.clear();
        for v in list {
            self.put_cluster(Some(&v), None);
        }
        self.sharding.clusters_listed = self.sharding.held.clone().unwrap_or_default();
    }

    /// Every Machine, after a complete list: every held shard's Machines, and every other one
    /// referencing a local Node, are in the cache now.
    pub fn replace_machines(&mut self, list: Vec<Option<MachineEntry>>) {
        self.clear_machines();
        for entry in list {
            self.put_machine_entry(entry, None);
        }
        self.sharding.machines_listed = self.sharding.held.clone().unwrap_or_default();
        self.sharding.rule_machines_pending = false;
    }

    /// Every Node of `cluster`, after a complete list. With shards, other shards' Machines are
    /// kept by the local Nodes they reference, so a new list of them is asked for.
    pub fn replace_nodes(&mut self, cluster: &str, list: Vec<NodeView>) {
        let cache = self.nodes.entry(cluster.to_string()).or_default();
        cache.nodes = list.into_iter().filter(|n| !n.name.is_empty()).map(|n| (n.name.clone(), Arc::new(n))).collect();
        if cluster == LOCAL_CLUSTER {
            self.renew_nhc_nodes();
            if self.sharding.held.is_some() {
                self.sharding.rule_machines_pending = true;
                self.sharding.capi_relist_asked = true;
            }
        }
    }

    /// Whether a new list of Cluster API's objects was asked for since the last call.
    pub fn take_capi_relist(&mut self) -> bool {
        std::mem::take(&mut self.sharding.capi_relist_asked)
    }

    /// Every object of a template or remediation kind, after a complete list.
    pub fn replace_objects(&mut self, gk: &GroupKind, template: bool, list: Vec<Value>) {
        let cache = self.objects.entry(gk.clone()).or_default();
        cache.remediations.clear();
        cache.templates.clear();
        for v in list {
            self.put_object(gk, template, Some(&v), None);
        }
    }
}

/// What a workload cluster's connection found.
impl Index {
    /// `cluster`'s connection told whether it is self-hosted.
    pub fn connected(&mut self, cluster: &WorkloadCluster, self_hosted: bool) {
        self.hosting.connected(cluster, self_hosted);
    }

    /// `cluster`'s Nodes cannot be read (`why`): its own cache is emptied and untrusted, and it
    /// no longer reads the shared one; returns its checks to tell, the first time only.
    pub fn nodes_unreachable(&mut self, cluster: &WorkloadCluster, why: &str) -> Option<Vec<CheckRef>> {
        self.hosting.stop_sharing(cluster);
        let failed = SourceState::Failed(why.to_string());
        let cache = self.nodes.entry(cluster.key()).or_default();
        let changed = cache.state != failed;
        cache.state = failed;
        cache.nodes.clear();
        changed.then(|| self.all_mhcs())
    }

    /// Forgets everything about `cluster` (its shard was let go); returns the checks to decide.
    pub fn forget_cluster(&mut self, cluster: &WorkloadCluster) -> Vec<CheckRef> {
        self.nodes.remove(&cluster.key());
        self.hosting.forget(cluster);
        self.all_mhcs()
    }

    /// The uid of check `key`, for the Events about it.
    pub fn uid_of(&self, key: &CheckRef) -> Option<String> {
        match key {
            CheckRef::Machine { namespace, name } => self.mhc(namespace, name).and_then(|c| c.metadata.uid.clone()),
            CheckRef::Node { name } => self.nhc(name).and_then(|c| c.metadata.uid.clone()),
        }
    }
}
