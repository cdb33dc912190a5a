//! The controller's in-memory indexes, fed by watches: slim views of every object a decision
//! reads, keyed the way decisions look them up (Machines by namespace and name, sorted; Nodes
//! by workload cluster and name; Machines by the Node they reference). Watch handlers update
//! them and return the checks the change concerns; decisions read them under a short lock.

mod by_node;
mod checks;
mod claim_cache;
mod fill;
mod hosting;

pub use by_node::{MachineKey, MachinesByNode};
pub use checks::{CheckEntry, CheckObject, Checks, Stored, not_newer};
pub use claim_cache::{Candidate, ClaimCache};
pub use hosting::{Hosting, WorkloadCluster};

use crate::around::Around;
use crate::sources::SourceState;
use crate::upstream::{Entry, Upstream};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use vigil_api::validate::{MhcPolicy, NhcApi, NhcPolicy};
use vigil_api::views::{ClusterView, MachineView, Meta, NodeView, RemediationView, TemplateView};
use vigil_api::well_known::CLUSTER_NAME_LABEL;
use vigil_api::{MachineHealthCheck, NodeHealthCheck, validate};
use vigil_engine::concerns;
use vigil_engine::machine_write::WriteBasis;
use vigil_engine::peers::{KeptPeers, MhcPeers};
use vigil_engine::selector_index::SelectorIndex;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER};

pub use crate::sources::{ClusterKey, GroupKind, Source};

/// Nodes of one cluster.
#[derive(Debug, Default)]
pub struct NodeCache {
    /// Nodes by name, reduced to what the rules read (a decision looks up the Node of each of
    /// its Machines here: foldhash, randomly seeded per process, rather than SipHash).
    pub(crate) nodes: HashMap<String, Arc<NodeView>, foldhash::fast::RandomState>,
    /// Whether they can be trusted.
    pub(crate) state: SourceState,
}

/// A Machine as decisions and writes need it.
#[derive(Debug, Clone)]
pub struct MachineEntry {
    /// The parsed view.
    pub view: Arc<MachineView>,
    /// Where the Machine's condition lists stood (`WriteBasis::json_patch`): a verdict-only
    /// write is not preceded by a read, and this, with `resource_version`, is what it is built
    /// from. It replaces the ~1 KiB of JSON text the entry kept before.
    pub basis: WriteBasis,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

/// Objects of one dynamic kind (a remediation template kind or a remediation kind).
#[derive(Debug, Default)]
pub struct ObjectCache {
    /// Remediation views by namespace, then name.
    pub(crate) remediations: BTreeMap<String, BTreeMap<String, Arc<RemediationView>>>,
    /// Template views by namespace, then name (only for template kinds).
    pub(crate) templates: BTreeMap<String, BTreeMap<String, Arc<TemplateView>>>,
    /// Whether they can be trusted.
    pub(crate) state: SourceState,
}

/// MachineHealthChecks by (namespace, name), each with its target Machines by name (those
/// `vigil_engine::target::is_target` selects, kept as Machines change: a decision reads its own
/// Machines instead of matching its selector against every Machine of the namespace; none while
/// its spec is invalid).
pub type MhcChecks = Checks<(String, String), MachineHealthCheck, MhcPolicy, MhcTargets>;

/// A stored MachineHealthCheck's policy when the check is among its namespace's ranked peers:
/// not being deleted, readable and valid.
fn ranked(e: &CheckEntry<MachineHealthCheck, MhcPolicy, MhcTargets>) -> Option<&Arc<MhcPolicy>> {
    let live = e.object.metadata.deletion_timestamp.is_none() && e.read_error.is_none();
    e.policy.as_ref().ok().filter(|_| live)
}

/// A MachineHealthCheck's target Machines by name, each as the Machine index holds it now (the
/// same view, replaced with it), so that a decision reads them without a lookup per Machine.
pub type MhcTargets = BTreeMap<String, Arc<MachineView>>;

/// NodeHealthChecks by name, each with the management cluster's Nodes its decisions need.
pub type NhcChecks = Checks<String, NodeHealthCheck, NhcPolicy, NhcNodes>;

/// Sharded mode (`vigil run --shards N`): the shard count, which shards this replica holds and
/// what its caches wait for.
#[derive(Debug, Default)]
pub struct Sharding {
    /// `vigil run --shards N` (0 and 1: one shard): with more, a target selected by checks of
    /// different shards is left to the first of them (`vigil_engine::cross_shard`).
    pub(crate) count: u32,
    /// The shards whose Machines and Clusters the caches keep (`None`: every
    /// shard). A Machine of another shard is kept only when it references a Node of the local
    /// cluster: the cross-shard rule reads which checks select a local Node
    /// (`claims::selections`), and another shard's MachineHealthCheck selects one through it.
    pub(crate) held: Option<BTreeSet<u32>>,
    /// Held shards whose Machines were in the last complete list (a shard taken
    /// since waits for the next list: its checks decide nothing until then).
    pub(crate) machines_listed: BTreeSet<u32>,
    /// Held shards whose Clusters were in the last complete list.
    pub(crate) clusters_listed: BTreeSet<u32>,
    /// A Machine list was asked for because the local Nodes changed (a Machine of
    /// another shard referencing a new local Node may have been left out); until it arrives,
    /// NodeHealthChecks decide nothing (the cross-shard rule would miss that Machine).
    pub(crate) rule_machines_pending: bool,
    /// A new Machine list is to be asked for (taken by the Node watch).
    pub(crate) capi_relist_asked: bool,
}

/// Whether each source every decision reads can be trusted.
#[derive(Debug, Default)]
pub struct FixedSources {
    /// The MachineHealthCheck watch.
    pub(crate) mhcs: SourceState,
    /// The NodeHealthCheck watch.
    pub(crate) nhcs: SourceState,
    /// The Machine watch (Failed when Cluster API is not installed).
    pub(crate) machines: SourceState,
    /// The Cluster watch.
    pub(crate) clusters: SourceState,
}

/// Every index.
#[derive(Debug, Default)]
pub struct Index {
    /// `vigil run --dry-run`: every check is decided in dry-run, whatever its spec says.
    pub(crate) dry_run: bool,
    /// `vigil run --shards N`: the shards and what the caches wait for.
    pub(crate) sharding: Sharding,
    /// Whether each fixed source can be trusted.
    pub(crate) sources: FixedSources,
    /// MachineHealthChecks by (namespace, name), each validated when stored (decisions and
    /// claims read the policy instead of validating every check of the namespace again: the
    /// 10 000-Machine wave spent 44% of its CPU doing that). Written through
    /// [`Index::put_mhc`] only.
    pub(crate) mhcs: MhcChecks,
    /// NodeHealthChecks by name: Vigil's, and with `--serve-medik8s` the medik8s ones served
    /// in place (one name, one check: see the controller's `medik8s` module). Written through
    /// [`Index::put_nhc`] and the medik8s synchronisation only.
    pub(crate) nhcs: NhcChecks,
    /// `vigil run --serve-medik8s`: medik8s' NodeHealthChecks as read, and which of them `nhcs`
    /// holds (`None`: the mode is off).
    pub(crate) medik8s: Option<Upstream>,
    /// Machines by namespace, then name (sorted, as the engine prefers).
    pub(crate) machines: BTreeMap<String, BTreeMap<String, MachineEntry>>,
    /// Cluster API Clusters.
    pub(crate) clusters: BTreeMap<WorkloadCluster, Arc<ClusterView>>,
    /// Nodes by cluster.
    pub(crate) nodes: BTreeMap<ClusterKey, NodeCache>,
    /// Machines (namespace, name) by (cluster, Node name) from their nodeRef.
    pub(crate) machines_by_node: MachinesByNode,
    /// Templates and remediation objects by group and kind.
    pub(crate) objects: BTreeMap<GroupKind, ObjectCache>,
    /// Each check's claims on targets as of its last decision (who remediates what).
    pub(crate) claims: ClaimCache,
    /// What each workload cluster's connection found: self-hosted or not (unknown until it
    /// connects; with `--shards`, the cross-shard rule counts an unknown cluster as possibly
    /// self-hosted), and whether its Nodes are read from the management cluster's cache (see
    /// [`Index::node_source`]).
    pub(crate) hosting: Hosting,
    /// Every check's `maxConditionAge`s by condition type, built when first needed after the
    /// checks changed (`None`: to be rebuilt); a heartbeat is measured against them.
    guarded_ages: Option<vigil_engine::concerns::GuardedAges>,
    /// What each namespace's MachineHealthChecks are ranked and indexed as, made when first read
    /// after one of them changed (the first list of a thousand checks ranks them once, not once
    /// per check).
    mhc_namespaces: HashMap<String, NamespaceChecks>,
    /// The MachineHealthChecks (by name) whose status lists Machine (namespace, name) as a
    /// target: such a Machine concerns them even when they no longer select it.
    listed_targets: HashMap<(String, String), Vec<String>>,
    /// Node Leases, planned maintenance and cluster versions (NodeHealthCheck decisions).
    pub(crate) around: Around,
}

/// A namespace's MachineHealthChecks as decisions and Machine updates read them, each part made
/// when first needed after the checks changed.
#[derive(Debug, Default)]
pub struct NamespaceChecks {
    /// The valid checks ranked with their policies (who may own a Machine's conditions:
    /// `vigil_engine::peers`): every decision and every claim derivation of the namespace reads
    /// the same one.
    peers: OnceLock<KeptPeers>,
    /// Every check (by name) indexed by a label value its selector requires (one without a valid
    /// selector is a candidate for every Machine): a Machine update looks at the few checks that
    /// may select it, not at every check of its namespace.
    selectors: OnceLock<SelectorIndex<String>>,
}

/// The management cluster's Nodes one valid NodeHealthCheck's decisions need
/// (`vigil_engine::node::needs_node`), kept as Nodes and the check change: a decision then reads
/// a few dozen Nodes instead of walking (and sorting) every Node.
#[derive(Debug, Default)]
pub struct NhcNodes {
    /// The Nodes `needs_node` keeps, by name.
    names: BTreeSet<String>,
}

/// The Machines a MachineHealthCheck's status lists as its targets.
fn listed_targets(check: Option<&MachineHealthCheck>) -> &[String] {
    check.and_then(|c| c.status.as_ref()).map_or(&[], |s| s.targets.as_slice())
}

/// The cluster key of a Machine's Nodes.
pub fn machine_cluster(view: &MachineView) -> ClusterKey {
    let cluster = view.meta.labels.get(CLUSTER_NAME_LABEL).unwrap_or("");
    format!("{}/{cluster}", view.meta.namespace)
}

/// A Machine's index entry (`None` when it cannot be read as a Machine).
pub fn machine_entry(raw: &Value) -> Option<MachineEntry> {
    let view = MachineView::read(raw)?;
    Some(MachineEntry {
        basis: WriteBasis::read(raw, view.version),
        resource_version: resource_version(raw).map(str::to_string),
        view: Arc::new(view),
    })
}

impl NhcNodes {
    /// The Nodes a check with `policy` needs among those of `cache`.
    fn of(policy: &NhcPolicy, cache: Option<&NodeCache>) -> NhcNodes {
        let mut entry = NhcNodes::default();
        for (name, node) in cache.into_iter().flat_map(|c| &c.nodes) {
            entry.place(policy, name, Some(node));
        }
        entry
    }

    /// Puts Node `name` (now `node`, `None` when gone) in or out of the set.
    fn place(&mut self, policy: &NhcPolicy, name: &str, node: Option<&NodeView>) {
        if node.is_some_and(|n| vigil_engine::node::needs_node(policy, n)) {
            if !self.names.contains(name) {
                self.names.insert(name.to_string());
            }
        } else {
            self.names.remove(name);
        }
    }
}

impl Index {
    /// The management cluster's Nodes a decision of NodeHealthCheck `check` needs, sorted by
    /// name: those `vigil_engine::node::needs_node` keeps, those `named` (by remediation
    /// objects or the check's status); every Node when the check's spec is invalid.
    pub fn nhc_decision_nodes<'a>(
        &'a self,
        check: &str,
        named: impl IntoIterator<Item = &'a str>,
    ) -> Vec<&'a NodeView> {
        let Some(cache) = self.nodes.get(LOCAL_CLUSTER) else { return Vec::new() };
        let Some(names) = self.nhcs.entry(check).filter(|e| e.policy.is_ok()).map(|e| &e.derived.names) else {
            let mut all: Vec<&NodeView> = cache.nodes.values().map(|n| n.as_ref()).collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            return all;
        };
        let mut wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        wanted.extend(named);
        wanted.into_iter().filter_map(|n| cache.nodes.get(n)).map(|n| n.as_ref()).collect()
    }

    /// Forgets every NodeHealthCheck of Vigil's (a complete list of them follows); the medik8s
    /// ones served in place stay.
    pub fn clear_nhcs(&mut self) {
        let kept = self.medik8s.as_mut().map(|u| {
            u.vigil.clear();
            u.served.clone()
        });
        match kept {
            None => self.nhcs.clear(),
            Some(kept) => self.nhcs.retain(|n| kept.contains(n)),
        }
        self.guarded_ages = None;
    }

    /// Works out again which Nodes each NodeHealthCheck needs (after a complete list of the
    /// management cluster's Nodes replaced the cache).
    pub fn renew_nhc_nodes(&mut self) {
        let cache = self.nodes.get(LOCAL_CLUSTER);
        for (_, policy, nodes) in self.nhcs.derived_mut() {
            *nodes = NhcNodes::of(policy, cache);
        }
    }

    /// An empty index for a controller running `shards` shards; `sharded`: it keeps the Cluster
    /// API objects of the shards it holds only ([`Sharding::held`]).
    pub fn with_shards(shards: u32, sharded: bool) -> Self {
        Index {
            sharding: Sharding { count: shards, held: sharded.then(BTreeSet::new), ..Sharding::default() },
            ..Index::default()
        }
    }

    /// The shard of a check among [`Sharding::count`] (a MachineHealthCheck by its workload
    /// cluster, a NodeHealthCheck by its name); `None` for a MachineHealthCheck not stored.
    pub fn shard_of(&self, key: &CheckRef) -> Option<u32> {
        let shard_key = match key {
            CheckRef::Machine { namespace, name } => {
                let cluster = &self.mhcs.get(&(namespace.clone(), name.clone()))?.spec.cluster_name;
                vigil_engine::shard::machine_check_key(namespace, cluster)
            }
            CheckRef::Node { name } => name.clone(),
        };
        Some(vigil_engine::shard::shard_of(&shard_key, self.sharding.count))
    }

    /// Whether the caches keep the Cluster API objects of workload cluster `key`
    /// (`namespace/clusterName`): always with one shard, else when its shard is held.
    pub fn keeps_cluster(&self, key: &str) -> bool {
        self.sharding.held.as_ref().is_none_or(|h| h.contains(&vigil_engine::shard::shard_of(key, self.sharding.count)))
    }

    /// Whether the caches keep Machine `view`: its cluster's shard is held, or it references a
    /// Node of the local cluster (what the cross-shard rule needs of other shards' Machines).
    pub fn keeps_machine(&self, view: &MachineView) -> bool {
        self.keeps_cluster(&machine_cluster(view))
            || view
                .node_name
                .as_ref()
                .is_some_and(|n| self.nodes.get(LOCAL_CLUSTER).is_some_and(|c| c.nodes.contains_key(n)))
    }

    /// Why no decision may be made now in sharded mode: the rule for checks in different shards
    /// reads other shards' Machines on local Nodes, and they have not been listed yet, or the
    /// local Nodes changed since the last list (`None`: it may; also when Cluster API cannot be
    /// watched, as there are then no Machines to read).
    pub fn rule_unlisted(&self) -> Option<String> {
        self.sharding.held.as_ref()?;
        match self.sources.machines {
            SourceState::Syncing => Some(
                "waiting for the first complete list of Machines: the rule for checks in different shards reads them"
                    .to_string(),
            ),
            SourceState::Synced if self.sharding.rule_machines_pending => Some(
                "waiting for a complete list of Machines: a Node of this cluster appeared, and the Machines of other \
                 shards referencing it are read by the rule for checks in different shards"
                    .to_string(),
            ),
            _ => None,
        }
    }

    /// Why the Machines and Clusters of workload cluster `key` cannot be trusted yet (its shard
    /// was taken since the last complete lists); `None`: they can.
    pub fn capi_unlisted(&self, key: &str) -> Option<String> {
        self.sharding.held.as_ref()?;
        let shard = vigil_engine::shard::shard_of(key, self.sharding.count);
        (!self.sharding.machines_listed.contains(&shard) || !self.sharding.clusters_listed.contains(&shard)).then(
            || {
                format!(
                    "waiting for a complete list of the Machines and Clusters of shard {shard}, taken by this replica"
                )
            },
        )
    }

    /// Shard `shard` is held from now on: its Machines and Clusters are kept from the next
    /// complete lists on (the caller asks for them).
    pub fn take_shard(&mut self, shard: u32) {
        self.sharding.held.get_or_insert_with(BTreeSet::new).insert(shard);
        self.sharding.machines_listed.remove(&shard);
        self.sharding.clusters_listed.remove(&shard);
    }

    /// Shard `shard` is no longer held: its Machines (but those referencing a local Node) and
    /// Clusters are forgotten.
    pub fn let_go_shard(&mut self, shard: u32) {
        let Some(held) = self.sharding.held.as_mut() else { return };
        held.remove(&shard);
        self.sharding.machines_listed.remove(&shard);
        self.sharding.clusters_listed.remove(&shard);
        let gone: Vec<(String, String)> = self
            .machines
            .values()
            .flat_map(|ms| ms.values())
            .filter(|e| !self.keeps_machine(&e.view))
            .map(|e| (e.view.meta.namespace.clone(), e.view.meta.name.clone()))
            .collect();
        for key in gone {
            self.put_machine_entry(None, Some(key));
        }
        let shards = self.sharding.count;
        if let Some(held) = &self.sharding.held {
            self.clusters.retain(|cluster, _| held.contains(&vigil_engine::shard::shard_of(&cluster.key(), shards)));
        }
    }

    /// Every check.
    pub fn all_checks(&self) -> Vec<CheckRef> {
        let m = self.mhcs.keys().map(|(ns, n)| CheckRef::Machine { namespace: ns.clone(), name: n.clone() });
        let n = self.nhcs.keys().map(|n| CheckRef::Node { name: n.clone() });
        m.chain(n).collect()
    }

    /// Every MachineHealthCheck.
    pub fn all_mhcs(&self) -> Vec<CheckRef> {
        self.mhcs.keys().map(|(ns, n)| CheckRef::Machine { namespace: ns.clone(), name: n.clone() }).collect()
    }

    /// Checks waiting for another check to let go of a target: any remediation object or
    /// Machine change may be that, so they look again on each.
    pub fn waiting_checks(&self) -> impl Iterator<Item = CheckRef> + '_ {
        let m = self
            .mhcs
            .iter()
            .filter(|(_, c)| c.status.as_ref().is_some_and(|s| vigil_engine::holders::is_waiting(&s.conditions)))
            .map(|((ns, n), _)| CheckRef::Machine { namespace: ns.clone(), name: n.clone() });
        let n = self
            .nhcs
            .iter()
            .filter(|(_, c)| c.status.as_ref().is_some_and(|s| vigil_engine::holders::is_waiting(&s.conditions)))
            .map(|(n, _)| CheckRef::Node { name: n.clone() });
        m.chain(n)
    }

    /// The NodeHealthChecks but `except` that select one of the local `nodes` or list it in
    /// their status.
    pub fn nhcs_deciding_on(&self, nodes: &[String], except: &CheckRef) -> Vec<CheckRef> {
        let cache = self.nodes.get(LOCAL_CLUSTER);
        self.nhcs
            .iter()
            .filter(|(name, _)| !matches!(except, CheckRef::Node { name: n } if n == *name))
            .filter(|(name, check)| {
                let listed =
                    check.status.as_ref().is_some_and(|s| s.unhealthy_nodes.iter().any(|u| nodes.contains(&u.name)));
                let selected = match (self.nhc_policy(name), cache) {
                    (Some(Ok(policy)), Some(cache)) => nodes.iter().any(|n| {
                        cache.nodes.get(n.as_str()).is_some_and(|node| node.labels.selected_by(&policy.selector))
                    }),
                    _ => false,
                };
                listed || selected
            })
            .map(|(name, _)| CheckRef::Node { name: name.clone() })
            .collect()
    }

    /// Every NodeHealthCheck.
    pub fn all_nhcs(&self) -> Vec<CheckRef> {
        self.nhcs.keys().map(|n| CheckRef::Node { name: n.clone() }).collect()
    }

    /// Stores (or removes) a Machine; returns the checks it concerns, before or after.
    pub fn put_machine(&mut self, raw: Option<&Value>, removed: Option<(String, String)>) -> BTreeSet<CheckRef> {
        self.put_machine_entry(raw.and_then(machine_entry), removed)
    }

    /// As [`Index::put_machine`] with the entry already built (outside the index lock).
    pub fn put_machine_entry(
        &mut self,
        new: Option<MachineEntry>,
        removed: Option<(String, String)>,
    ) -> BTreeSet<CheckRef> {
        let key = match (&new, removed) {
            (Some(e), _) => (e.view.meta.namespace.clone(), e.view.meta.name.clone()),
            (None, Some(k)) => k,
            (None, None) => return BTreeSet::new(),
        };
        // Another shard's Machine the cross-shard rule does not need is not kept (and one kept
        // before, e.g. while it referenced a local Node, is forgotten).
        let new = new.filter(|e| self.keeps_machine(&e.view));
        if let Some(new) = &new
            && let Some(held) = self.machines.get(&key.0).and_then(|ms| ms.get(&key.1))
            && not_newer(new.resource_version.as_deref(), held.resource_version.as_deref())
        {
            return BTreeSet::new();
        }
        let old = match &new {
            Some(e) => self.machines.entry(key.0.clone()).or_default().insert(key.1.clone(), e.clone()),
            None => self.machines.get_mut(&key.0).and_then(|m| m.remove(&key.1)),
        };
        if let Some(old) = &old
            && let Some(node) = &old.view.node_name
        {
            self.machines_by_node.remove(&machine_cluster(&old.view), node, &key);
        }
        if let Some(new) = &new
            && let Some(node) = &new.view.node_name
        {
            self.machines_by_node.add(&machine_cluster(&new.view), node, &key);
        }
        self.place_machine(&key, old.as_ref().map(|e| e.view.as_ref()), new.as_ref().map(|e| &e.view));
        let mut out: BTreeSet<CheckRef> = self.waiting_checks().collect();
        for view in old.iter().map(|e| &e.view).chain(new.iter().map(|e| &e.view)) {
            out.extend(self.mhcs_concerned_by_machine(view));
        }
        out
    }

    /// The checks `view` concerns ([`concerns::mhc_concerns_machine`]): among those that may
    /// select it, the ones that do, and those whose status lists it.
    fn mhcs_concerned_by_machine(&self, view: &MachineView) -> Vec<CheckRef> {
        let namespace = &view.meta.namespace;
        let check = |name: &String| CheckRef::Machine { namespace: namespace.clone(), name: name.clone() };
        let mut out: Vec<CheckRef> = self
            .mhc_candidates(namespace, view)
            .filter(|name| {
                self.mhcs.entry(&(namespace.clone(), (*name).clone())).is_some_and(|e| match &e.policy {
                    Ok(p) => concerns::mhc_concerns_machine(&e.object, p, view),
                    // An invalid check is only refused: nothing but its own object concerns it.
                    Err(_) => false,
                })
            })
            .map(check)
            .collect();
        if let Some(listing) = self.listed_targets.get(&(namespace.clone(), view.meta.name.clone())) {
            let valid = |name: &&String| {
                self.mhcs.entry(&(namespace.clone(), (*name).clone())).is_some_and(|e| e.policy.is_ok())
            };
            out.extend(listing.iter().filter(valid).map(check));
        }
        out
    }

    /// The checks of `namespace` that may select `view` (a superset of those that do).
    fn mhc_candidates<'a>(&'a self, namespace: &str, view: &'a MachineView) -> impl Iterator<Item = &'a String> {
        let selectors = self.mhc_namespaces.get(namespace).map(|n| {
            n.selectors.get_or_init(|| {
                SelectorIndex::build(
                    self.mhcs
                        .in_namespace(namespace)
                        .map(|((_, name), e)| (name.clone(), e.policy.as_ref().ok().map(|p| &p.selector))),
                )
            })
        });
        selectors.into_iter().flat_map(|index| index.candidates(view.meta.labels.iter()))
    }

    /// Puts Machine `key` (now `new`, `None` when gone; `old` as held before) in or out of the
    /// targets of each check that may select either: a check that selects neither has it in
    /// none.
    fn place_machine(&mut self, key: &(String, String), old: Option<&MachineView>, new: Option<&Arc<MachineView>>) {
        let (namespace, machine) = key;
        let candidates: BTreeSet<String> = old
            .into_iter()
            .chain(new.map(Arc::as_ref))
            .flat_map(|view| self.mhc_candidates(namespace, view))
            .cloned()
            .collect();
        for name in candidates {
            let Some((policy, targets)) = self.mhcs.derived_of(&(namespace.clone(), name)) else { continue };
            let selected = match (policy, new) {
                (Some(policy), Some(view)) => vigil_engine::target::is_target(policy, view),
                _ => false,
            };
            match new.filter(|_| selected) {
                Some(view) => match targets.get_mut(machine) {
                    Some(kept) => *kept = Arc::clone(view),
                    None => {
                        targets.insert(machine.clone(), Arc::clone(view));
                    }
                },
                None => {
                    targets.remove(machine);
                }
            }
        }
    }

    /// Works out check `key`'s targets again over its namespace's Machines (after its spec
    /// changed); a check without a valid policy has none.
    fn renew_mhc_targets(&mut self, key: &(String, String)) {
        let targets = match self.mhcs.policy(key) {
            Some(Ok(policy)) => self
                .machines
                .get(&key.0)
                .into_iter()
                .flat_map(|ms| ms.iter())
                .filter(|(_, e)| vigil_engine::target::is_target(policy, &e.view))
                .map(|(name, e)| (name.clone(), Arc::clone(&e.view)))
                .collect(),
            _ => MhcTargets::new(),
        };
        if let Some((_, kept)) = self.mhcs.derived_of(key) {
            *kept = targets;
        }
    }

    /// Has `namespace`'s checks ranked and indexed again when next read (one of them changed).
    fn mhc_namespace_changed(&mut self, namespace: &str) {
        if self.mhcs.in_namespace(namespace).next().is_none() {
            self.mhc_namespaces.remove(namespace);
        } else {
            self.mhc_namespaces.insert(namespace.to_string(), NamespaceChecks::default());
        }
    }

    /// Check `key`'s status listed the Machines `was` and now lists `is`.
    fn relist_targets(&mut self, key: &(String, String), was: &[String], is: &[String]) {
        let (namespace, check) = key;
        for machine in was {
            let at = (namespace.clone(), machine.clone());
            if let Some(checks) = self.listed_targets.get_mut(&at) {
                checks.retain(|c| c != check);
                if checks.is_empty() {
                    self.listed_targets.remove(&at);
                }
            }
        }
        for machine in is {
            let checks = self.listed_targets.entry((namespace.clone(), machine.clone())).or_default();
            if let Err(i) = checks.binary_search(check) {
                checks.insert(i, check.clone());
            }
        }
    }

    /// The valid MachineHealthChecks of `namespace` ranked with their policies, as validated
    /// when the index stored them.
    pub fn mhc_peers(&self, namespace: &str) -> MhcPeers<'_> {
        let Some(kept) = self.mhc_namespaces.get(namespace) else { return MhcPeers::none() };
        let ranked = kept.peers.get_or_init(|| {
            KeptPeers::rank(
                self.mhcs
                    .in_namespace(namespace)
                    .filter_map(|(_, e)| Some((e.object.as_ref(), Arc::clone(ranked(e)?)))),
            )
        });
        ranked.peers()
    }

    /// The MachineHealthChecks of `namespace` that [`Self::mhc_peers`] leaves out (being
    /// deleted, unreadable or invalid): whatever they select, they are not found by their
    /// selectors, so a confirming decision looks at their claims by name.
    pub fn unranked_mhcs<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = CheckRef> + 'a {
        self.mhcs
            .in_namespace(namespace)
            .filter(|(_, e)| ranked(e).is_none())
            .map(|((ns, n), _)| CheckRef::Machine { namespace: ns.clone(), name: n.clone() })
    }

    /// The entry held for Machine `raw` when the index holds it at its resourceVersion exactly:
    /// the same version is the same object, so the watch's echo of a write whose answer was
    /// stored (or a list of what is already held) is not read again.
    pub fn machine_at(&self, raw: &Value) -> Option<MachineEntry> {
        let meta = |field: &str| raw.get("metadata")?.get(field)?.as_str();
        let held = self.machines.get(meta("namespace")?)?.get(meta("name")?)?;
        let version = meta("resourceVersion").filter(|v| !v.is_empty())?;
        (held.resource_version.as_deref() == Some(version)).then(|| held.clone())
    }

    /// How many Machines the cache holds.
    pub fn machine_count(&self) -> usize {
        self.machines.values().map(BTreeMap::len).sum()
    }

    /// Forgets every Machine (a complete list of them follows): each check's targets empty.
    pub fn clear_machines(&mut self) {
        self.machines.clear();
        self.machines_by_node.clear();
        for (_, _, targets) in self.mhcs.derived_mut() {
            targets.clear();
        }
    }

    /// MachineHealthCheck `namespace/name`'s targets, sorted by name (none when its spec is
    /// invalid or it is not stored): exactly the Machines `vigil_engine::target::is_target`
    /// selects among the namespace's.
    pub fn mhc_machines(&self, namespace: &str, name: &str) -> Vec<&MachineView> {
        let Some(entry) = self.mhcs.entry(&(namespace.to_string(), name.to_string())) else { return Vec::new() };
        entry.derived.values().map(Arc::as_ref).collect()
    }

    /// Stores (or removes) a Cluster; returns the checks it concerns.
    pub fn put_cluster(&mut self, raw: Option<&Value>, removed: Option<(String, String)>) -> BTreeSet<CheckRef> {
        let view = raw.and_then(ClusterView::read);
        let key = match (&view, removed) {
            (Some(v), _) => WorkloadCluster::new(&v.meta.namespace, &v.meta.name),
            (None, Some((namespace, name))) => WorkloadCluster::new(&namespace, &name),
            (None, None) => return BTreeSet::new(),
        };
        // Another shard's Cluster is not kept.
        let view = view.filter(|_| self.keeps_cluster(&key.key()));
        let meta = Meta { namespace: key.namespace().to_string(), name: key.name().to_string(), ..Default::default() };
        match view {
            Some(v) => self.clusters.insert(key, Arc::new(v)),
            None => self.clusters.remove(&key),
        };
        self.mhcs
            .entries()
            .filter(|(_, e)| match &e.policy {
                Ok(p) => concerns::mhc_concerns_cluster(&e.object, p, &meta),
                // An invalid check is only refused: nothing but its own object concerns it.
                Err(_) => false,
            })
            .map(|((ns, n), _)| CheckRef::Machine { namespace: ns.clone(), name: n.clone() })
            .collect()
    }

    /// Stores (or removes) a Node of `cluster`, as the rules read it; returns the
    /// checks whose verdict the change can alter at `now` (none for a heartbeat, unless it
    /// brings a condition a check guards with `maxConditionAge` back from stale).
    pub fn put_node(
        &mut self,
        cluster: &str,
        slim: Option<NodeView>,
        removed: Option<String>,
        now: jiff::Timestamp,
    ) -> BTreeSet<CheckRef> {
        let Some(name) = slim.as_ref().map(|n| n.name.clone()).filter(|n| !n.is_empty()).or(removed) else {
            return BTreeSet::new();
        };
        let cache = self.nodes.entry(cluster.to_string()).or_default();
        let mut gone = None;
        let stored = match slim {
            Some(n) => {
                let new = Arc::new(n);
                let old = cache.nodes.insert(name.clone(), new.clone());
                if old.is_none() && cluster == LOCAL_CLUSTER && self.sharding.held.is_some() {
                    // Another shard's Machine referencing this Node was not kept until now.
                    self.sharding.rule_machines_pending = true;
                    self.sharding.capi_relist_asked = true;
                }
                if let Some(old) = old
                    && !concerns::node_change_matters(&old, &new)
                    && !concerns::heartbeat_revives(&old, &new, self.guarded_ages(), now)
                {
                    return BTreeSet::new();
                }
                Some(new)
            }
            None => {
                gone = cache.nodes.remove(&name);
                None
            }
        };
        if cluster == LOCAL_CLUSTER {
            for (_, policy, nodes) in self.nhcs.derived_mut() {
                nodes.place(policy, &name, stored.as_deref());
            }
        }
        let mut checks = self.checks_for_node(cluster, &name);
        if let Some(gone) = gone.filter(|_| cluster == LOCAL_CLUSTER) {
            // A selected Node that is gone changes its checks' counts (the threshold) even when
            // no status lists it.
            checks.extend(self.nhcs_selecting(&gone));
        }
        checks
    }

    /// The NodeHealthChecks with a valid policy that select `node`.
    fn nhcs_selecting(&self, node: &NodeView) -> Vec<CheckRef> {
        self.nhcs
            .entries()
            .filter(|(_, entry)| {
                entry.policy.as_ref().is_ok_and(|p| concerns::nhc_concerns_node(&entry.object, p, node))
            })
            .map(|(n, _)| CheckRef::Node { name: n.clone() })
            .collect()
    }

    /// Every valid check's `maxConditionAge`s (rebuilt after the checks changed).
    fn guarded_ages(&mut self) -> &vigil_engine::concerns::GuardedAges {
        let (mhcs, nhcs) = (&self.mhcs, &self.nhcs);
        self.guarded_ages.get_or_insert_with(|| {
            // Both kinds: the policies validated when they were stored.
            let mhc = mhcs
                .entries()
                .filter_map(|(_, e)| e.policy.as_ref().ok())
                .flat_map(|p| p.node_conditions.iter().cloned());
            let nhc =
                nhcs.entries().filter_map(|(_, e)| e.policy.as_ref().ok()).flat_map(|p| p.conditions.iter().cloned());
            let rules: Vec<vigil_api::validate::ConditionRule> = mhc.chain(nhc).collect();
            vigil_engine::concerns::GuardedAges::of(&rules)
        })
    }

    /// Where workload cluster `workload`'s Nodes are read: the management cluster's cache when
    /// the workload cluster is the management cluster and its connection shares that cache,
    /// else its own cache (which, while not connected, is not synced: its checks decide nothing).
    pub fn node_source<'a>(&self, workload: &'a str) -> &'a str {
        let connected = self.nodes.get(workload).is_some_and(|c| c.state == SourceState::Synced);
        let shared = || WorkloadCluster::from_key(workload).is_some_and(|w| self.hosting.shares_local_nodes(&w));
        if connected && shared() { LOCAL_CLUSTER } else { workload }
    }

    /// The checks that look at Node `name` of `cluster`.
    pub fn checks_for_node(&self, cluster: &str, name: &str) -> BTreeSet<CheckRef> {
        let mut out = BTreeSet::new();
        // The management cluster's Nodes also stand for self-hosted workload clusters' Nodes.
        let shared: Vec<String> = if cluster == LOCAL_CLUSTER {
            self.hosting.sharing().map(WorkloadCluster::key).filter(|w| self.node_source(w) == LOCAL_CLUSTER).collect()
        } else {
            Vec::new()
        };
        for source in std::iter::once(cluster).chain(shared.iter().map(String::as_str)) {
            for (ns, m) in self.machines_by_node.of(source, name) {
                if let Some(entry) = self.machines.get(ns).and_then(|ms| ms.get(m)) {
                    out.extend(self.mhcs_concerned_by_machine(&entry.view));
                }
            }
        }
        if cluster == LOCAL_CLUSTER {
            let node = self.nodes.get(LOCAL_CLUSTER).and_then(|c| c.nodes.get(name));
            for (n, entry) in self.nhcs.entries() {
                let check = &entry.object;
                let hit = match (entry.policy.as_ref().ok(), node) {
                    (Some(p), Some(node)) => concerns::nhc_concerns_node(check, p, node),
                    // A deleted Node: the checks that listed it, or every check if unknown.
                    (Some(_), None) => {
                        check.status.as_ref().is_none_or(|s| s.unhealthy_nodes.iter().any(|u| u.name == name))
                    }
                    // An invalid check is only refused: nothing but its own object concerns it.
                    (None, _) => false,
                };
                if hit {
                    out.insert(CheckRef::Node { name: n.clone() });
                }
            }
        }
        out
    }

    /// Stores (or removes) a template or remediation object; returns the checks it concerns.
    pub fn put_object(
        &mut self,
        gk: &GroupKind,
        is_template: bool,
        raw: Option<&Value>,
        removed: Option<(String, String)>,
    ) -> BTreeSet<CheckRef> {
        let cache = self.objects.entry(gk.clone()).or_default();
        let meta = match raw {
            Some(v) => {
                let Some(view) = RemediationView::read(v) else { return BTreeSet::new() };
                let (ns, name) = (view.meta.namespace.clone(), view.meta.name.clone());
                if is_template && let Some(t) = TemplateView::read(v) {
                    cache.templates.entry(ns.clone()).or_default().insert(name.clone(), Arc::new(t));
                }
                let meta = view.meta.clone();
                cache.remediations.entry(ns).or_default().insert(name, Arc::new(view));
                meta
            }
            None => {
                let Some((ns, name)) = removed else { return BTreeSet::new() };
                let old = cache.remediations.get_mut(&ns).and_then(|m| m.remove(&name));
                cache.templates.get_mut(&ns).and_then(|m| m.remove(&name));
                match old {
                    Some(o) => o.meta.clone(),
                    None => Meta {
                        namespace: ns,
                        name,
                        kind: gk.1.clone(),
                        api_version: format!("{}/v", gk.0),
                        ..Default::default()
                    },
                }
            }
        };
        self.checks_for_object(&meta)
    }

    /// The checks a template or remediation object concerns.
    pub fn checks_for_object(&self, meta: &Meta) -> BTreeSet<CheckRef> {
        let mut out: BTreeSet<CheckRef> = self.waiting_checks().collect();
        for ((ns, n), e) in self.mhcs.entries() {
            let concerned = match &e.policy {
                Ok(p) => concerns::mhc_concerns_remediation_object(&e.object, p, meta),
                // An invalid check is only refused: nothing but its own object concerns it.
                Err(_) => false,
            };
            if concerned {
                out.insert(CheckRef::Machine { namespace: ns.clone(), name: n.clone() });
            }
        }
        let node = self
            .nodes
            .get(LOCAL_CLUSTER)
            .and_then(|c| c.nodes.get(vigil_engine::target::remediation_node_name(meta)))
            .map(|n| n.as_ref());
        for (n, e) in self.nhcs.entries() {
            let concerned = match &e.policy {
                Ok(p) => concerns::nhc_concerns_remediation_object(&e.object, p, meta, node),
                // An invalid check is only refused: nothing but its own object concerns it.
                Err(_) => false,
            };
            if concerned {
                out.insert(CheckRef::Node { name: n.clone() });
            }
        }
        out
    }

    /// A MachineHealthCheck's spec as validated when it was stored: its policy, or the error.
    pub fn mhc_policy(&self, namespace: &str, name: &str) -> Option<&Result<Arc<MhcPolicy>, String>> {
        self.mhcs.policy(&(namespace.to_string(), name.to_string()))
    }

    /// [`Index::mhc_policy`] by the check's key as the index holds it (no key is built).
    pub fn mhc_policy_of(&self, key: &(String, String)) -> Option<&Result<Arc<MhcPolicy>, String>> {
        self.mhcs.policy(key)
    }

    /// A NodeHealthCheck's spec as validated when it was stored: its policy, or the error.
    pub fn nhc_policy(&self, name: &str) -> Option<&Result<Arc<NhcPolicy>, String>> {
        self.nhcs.policy(name)
    }

    /// Forgets every MachineHealthCheck (before a complete list replaces them).
    pub fn clear_mhcs(&mut self) {
        self.mhcs.clear();
        self.mhc_namespaces.clear();
        self.listed_targets.clear();
        self.guarded_ages = None;
    }

    /// Stores (or removes) a MachineHealthCheck; a change of anything but its status concerns it.
    pub fn put_mhc(
        &mut self,
        check: Option<MachineHealthCheck>,
        removed: Option<(String, String)>,
    ) -> BTreeSet<CheckRef> {
        self.put_mhc_read(check.map(|c| (c, None)), removed)
    }

    /// [`Index::put_mhc`] of a check as read from the API server, with why its spec could not be
    /// read when it could not (it is stored with an empty spec, and its status says why).
    pub fn put_mhc_read(
        &mut self,
        read: Option<(MachineHealthCheck, Option<String>)>,
        removed: Option<(String, String)>,
    ) -> BTreeSet<CheckRef> {
        let key = match (&read, removed) {
            (Some((c, _)), _) => {
                (c.metadata.namespace.clone().unwrap_or_default(), c.metadata.name.clone().unwrap_or_default())
            }
            (None, Some(k)) => k,
            (None, None) => return BTreeSet::new(),
        };
        // The status' targets, when they change (the Machines that concern the check by it).
        let (was, is) =
            (listed_targets(self.mhcs.get(&key).map(Arc::as_ref)), listed_targets(read.as_ref().map(|(c, _)| c)));
        let listing = (was != is).then(|| (was.to_vec(), is.to_vec()));
        let stored = match read {
            Some((check, error)) => self
                .mhcs
                .put(key.clone(), check, error, |c| validate::machine_health_check(c).map_err(|e| e.to_string())),
            None => {
                self.mhcs.remove(&key);
                Stored::Kept { changed: true, status_moved: false, renew: false }
            }
        };
        let Stored::Kept { changed, status_moved, renew } = stored else { return BTreeSet::new() };
        if let Some((was, is)) = listing {
            self.relist_targets(&key, &was, &is);
        }
        if renew {
            self.renew_mhc_targets(&key);
        }
        // The ranking and the guarded ages read specs, identities and deletion, never a status.
        if changed || renew {
            self.guarded_ages = None;
            self.mhc_namespace_changed(&key.0);
        }
        if status_moved {
            return BTreeSet::from([CheckRef::Machine { namespace: key.0, name: key.1 }]);
        }
        if !changed {
            return BTreeSet::new();
        }
        // Another check of the namespace may now own (or no longer own) Machines' conditions
        // (vigil_engine::peers): every check of the namespace decides again.
        let mut out: BTreeSet<CheckRef> = self
            .mhcs
            .in_namespace(&key.0)
            .map(|((ns, n), _)| CheckRef::Machine { namespace: ns.clone(), name: n.clone() })
            .collect();
        out.insert(CheckRef::Machine { namespace: key.0, name: key.1 });
        out
    }

    /// Stores (or removes) one of Vigil's NodeHealthChecks; a change of anything but its status
    /// concerns it. With `--serve-medik8s`, it takes the place of a medik8s check of its name,
    /// and gives it back when it goes.
    pub fn put_nhc(&mut self, check: Option<NodeHealthCheck>, removed: Option<String>) -> BTreeSet<CheckRef> {
        self.put_nhc_read(check.map(|c| (c, None)), removed)
    }

    /// [`Index::put_nhc`] of a check as read from the API server, with why its spec could not be
    /// read when it could not (it is stored with an empty spec, and its status says why).
    pub fn put_nhc_read(
        &mut self,
        read: Option<(NodeHealthCheck, Option<String>)>,
        removed: Option<String>,
    ) -> BTreeSet<CheckRef> {
        let Some(up) = self.medik8s.as_mut() else { return self.store_nhc(read, removed, NhcApi::Vigil) };
        let name = match (&read, &removed) {
            (Some((c, _)), _) => c.metadata.name.clone().unwrap_or_default(),
            (None, Some(k)) => k.clone(),
            (None, None) => return BTreeSet::new(),
        };
        if read.is_some() {
            // The medik8s check leaves first, so the two are never taken for versions of one object.
            up.vigil.insert(name.clone());
            let mut dirty = self.sync_medik8s(&name);
            dirty.extend(self.store_nhc(read, removed, NhcApi::Vigil));
            return dirty;
        }
        if !up.vigil.remove(&name) {
            // Not one of Vigil's (what `nhcs` holds under this name, if anything, is medik8s').
            return BTreeSet::new();
        }
        let mut dirty = self.store_nhc(None, removed, NhcApi::Vigil);
        dirty.extend(self.sync_medik8s(&name));
        dirty
    }

    /// Stores (or removes) a NodeHealthCheck served from `api` (with why its spec could not be
    /// read, if it could not); a change of anything but its status concerns it.
    pub(crate) fn store_nhc(
        &mut self,
        read: Option<(NodeHealthCheck, Option<String>)>,
        removed: Option<String>,
        api: NhcApi,
    ) -> BTreeSet<CheckRef> {
        let key = match (&read, removed) {
            (Some((c, _)), _) => c.metadata.name.clone().unwrap_or_default(),
            (None, Some(k)) => k,
            (None, None) => return BTreeSet::new(),
        };
        let stored = match read {
            Some((check, error)) => self.nhcs.put(key.clone(), check, error, |c| {
                validate::node_health_check(c).map(|p| NhcPolicy { api, ..p }).map_err(|e| e.to_string())
            }),
            None => {
                self.nhcs.remove(&key);
                Stored::Kept { changed: true, status_moved: false, renew: false }
            }
        };
        let Stored::Kept { changed, status_moved, renew } = stored else { return BTreeSet::new() };
        if renew {
            let cache = self.nodes.get(LOCAL_CLUSTER);
            if let Some((policy, nodes)) = self.nhcs.derived_of(&key) {
                *nodes = policy.map(|p| NhcNodes::of(p, cache)).unwrap_or_default();
            }
        }
        self.guarded_ages = None;
        if changed || status_moved { BTreeSet::from([CheckRef::Node { name: key }]) } else { BTreeSet::new() }
    }
}

/// What a NodeHealthCheck reads around its Nodes, and the workload clusters' connections.
impl Index {
    /// Stores (or forgets) a node Lease of the lease namespace; returns the NodeHealthChecks it
    /// concerns ([`concerns::nhc_concerns_node_lease`]): its holder's, and those listing its Node.
    pub fn put_lease(&mut self, name: String, new: Option<vigil_api::views::LeaseView>) -> BTreeSet<CheckRef> {
        let old = self.around.leases.items.get(&name).cloned();
        let concerned = self
            .nhcs
            .iter()
            .filter(|(_, check)| {
                old.as_deref().into_iter().chain(new.as_ref()).any(|l| concerns::nhc_concerns_node_lease(check, l))
            })
            .map(|(name, _)| CheckRef::Node { name: name.clone() })
            .collect();
        self.around.leases.put(name, new);
        concerned
    }

    /// Stores (or forgets) one of the optional kinds around the Nodes (`slot`: maintenances,
    /// cluster versions, OpenShift Machines); every NodeHealthCheck reads them.
    pub fn put_surrounding<V>(
        &mut self,
        slot: fn(&mut Around) -> &mut crate::around::Kept<V>,
        name: String,
        new: Option<V>,
    ) -> BTreeSet<CheckRef> {
        slot(&mut self.around).put(name, new);
        self.all_nhcs().into_iter().collect()
    }

    /// Self-hosted workload cluster `cluster` reads its Nodes through the management cluster's
    /// cache from now on ([`Index::node_source`]); returns the checks to decide again.
    pub fn share_local_nodes(&mut self, cluster: &WorkloadCluster) -> Vec<CheckRef> {
        let cache = self.nodes.entry(cluster.key()).or_default();
        cache.nodes.clear();
        cache.state = SourceState::Synced;
        self.hosting.share_local_nodes(cluster);
        self.all_mhcs()
    }
}

/// medik8s' own NodeHealthChecks (`vigil run --serve-medik8s`): which of them `Index::nhcs`
/// holds, served when it exists, no `vigil.dev` check has its name and the operator is not running.
impl Index {
    /// Puts medik8s' check `name` into `Index::nhcs`, or takes it out, as [`Upstream`] now says:
    /// served when it exists, no `vigil.dev` check has its name and the operator is not running.
    /// Returns the checks that must be decided again.
    pub fn sync_medik8s(&mut self, name: &str) -> BTreeSet<CheckRef> {
        let Some(up) = self.medik8s.as_mut() else { return BTreeSet::new() };
        let serve = up.checks.get(name).filter(|_| up.serves(name)).cloned();
        match serve {
            Some(entry) => {
                up.served.insert(name.to_string());
                self.store_nhc(Some((entry.check, entry.error)), None, NhcApi::Medik8s)
            }
            None if up.served.remove(name) => self.store_nhc(None, Some(name.to_string()), NhcApi::Medik8s),
            None => BTreeSet::new(),
        }
    }

    /// [`Index::sync_medik8s`] for every medik8s check.
    pub fn sync_all_medik8s(&mut self) -> BTreeSet<CheckRef> {
        let Some(up) = self.medik8s.as_ref() else { return BTreeSet::new() };
        let names: BTreeSet<String> = up.checks.keys().chain(up.served.iter()).cloned().collect();
        names.iter().flat_map(|n| self.sync_medik8s(n)).collect()
    }

    /// Stores one medik8s check as read (unless the index holds a newer version of it).
    pub fn put_medik8s(&mut self, entry: Entry) -> BTreeSet<CheckRef> {
        let Some(up) = self.medik8s.as_mut() else { return BTreeSet::new() };
        let name = entry.check.metadata.name.clone().unwrap_or_default();
        let held = up.checks.get(&name).and_then(|e| e.check.metadata.resource_version.as_deref());
        if not_newer(entry.check.metadata.resource_version.as_deref(), held) {
            return BTreeSet::new();
        }
        up.checks.insert(name.clone(), entry);
        self.sync_medik8s(&name)
    }

    /// Forgets one medik8s check.
    pub fn remove_medik8s(&mut self, name: &str) -> BTreeSet<CheckRef> {
        let Some(up) = self.medik8s.as_mut() else { return BTreeSet::new() };
        up.checks.remove(name);
        self.sync_medik8s(name)
    }

    /// Replaces every medik8s check (a complete list).
    pub fn replace_medik8s(&mut self, list: Vec<Entry>) -> BTreeSet<CheckRef> {
        let Some(up) = self.medik8s.as_mut() else { return BTreeSet::new() };
        up.checks = list.into_iter().map(|e| (e.check.metadata.name.clone().unwrap_or_default(), e)).collect();
        self.sync_all_medik8s()
    }
}

fn resource_version(raw: &Value) -> Option<&str> {
    raw.pointer("/metadata/resourceVersion").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(rv: &str, healthy: Option<&str>) -> Value {
        let conditions = match healthy {
            Some(s) => json!([{"type": "HealthCheckSucceeded", "status": s, "reason": "r", "message": "",
                               "lastTransitionTime": "2026-11-21T10:00:00Z"}]),
            None => json!([]),
        };
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "metadata": {"name": "m1", "namespace": "ns", "resourceVersion": rv,
                            "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
               "spec": {"clusterName": "c"},
               "status": {"nodeRef": {"name": "n1"}, "conditions": conditions}})
    }

    fn held_version(idx: &Index) -> Option<String> {
        let entry = idx.machines.get("ns").and_then(|m| m.get("m1"))?;
        entry.resource_version.clone()
    }

    fn node(name: &str, labels: Value) -> NodeView {
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
                                          "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
            .expect("node");
        NodeView::from(node)
    }

    fn names<'a>(nodes: &[&'a NodeView]) -> Vec<&'a str> {
        nodes.iter().map(|n| n.name.as_str()).collect()
    }

    /// A Machine of workload cluster `cluster` in `ns` referencing Node `node`.
    fn machine_of(name: &str, cluster: &str, node: &str) -> Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                            "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
               "spec": {"clusterName": cluster}, "status": {"nodeRef": {"name": node}}})
    }

    /// Sharded: the held shards' Machines and Clusters are kept, another shard's Machine only
    /// while it references a local Node (the cross-shard rule reads it); a shard taken is not
    /// trusted until listed; a shard let go is forgotten; a new local Node holds every decision
    /// until Machines are listed again.
    #[test]
    fn a_sharded_index_keeps_what_its_shards_and_the_cross_shard_rule_need() {
        use vigil_engine::shard::{machine_check_key, shard_of};
        let shards = 6;
        let shard = |c: &str| shard_of(&machine_check_key("ns", c), shards);
        let (mine, other) =
            ("c0", (1..50).map(|i| format!("c{i}")).find(|c| shard(c) != shard("c0")).expect("a cluster"));
        let now = jiff::Timestamp::UNIX_EPOCH;
        let mut idx = Index::with_shards(shards, true);
        idx.put_node(LOCAL_CLUSTER, Some(node("local-1", json!({}))), None, now);
        idx.take_shard(shard(mine));
        assert!(idx.capi_unlisted("ns/c0").is_some(), "taken, not listed yet");
        idx.put_machine(Some(&machine_of("m-mine", mine, "x1")), None);
        idx.put_machine(Some(&machine_of("m-other", &other, "x2")), None);
        idx.put_machine(Some(&machine_of("m-other-local", &other, "local-1")), None);
        let kept = |idx: &Index| -> Vec<String> {
            idx.machines.get("ns").into_iter().flat_map(|m| m.keys().cloned()).collect()
        };
        assert_eq!(kept(&idx), ["m-mine", "m-other-local"]);
        let cluster = |name: &str| {
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                                          "metadata": {"name": name, "namespace": "ns"}})
        };
        idx.put_cluster(Some(&cluster(mine)), None);
        idx.put_cluster(Some(&cluster(&other)), None);
        assert_eq!(idx.clusters.keys().map(WorkloadCluster::name).collect::<Vec<_>>(), [mine]);
        // The lists arrive (what the watches' Replace sets).
        idx.sharding.machines_listed = idx.sharding.held.clone().unwrap_or_default();
        idx.sharding.clusters_listed = idx.sharding.held.clone().unwrap_or_default();
        idx.sharding.rule_machines_pending = false;
        assert_eq!(idx.capi_unlisted("ns/c0"), None);
        assert!(idx.capi_unlisted(&format!("ns/{other}")).is_some(), "not held");
        // A Machine that stops referencing a local Node is forgotten.
        idx.put_machine(
            Some(&machine_of("m-other-local", &other, "x3"))
                .map(|m| {
                    let mut m = m.clone();
                    m["metadata"]["resourceVersion"] = json!("2");
                    m
                })
                .as_ref(),
            None,
        );
        assert_eq!(kept(&idx), ["m-mine"]);
        // Let go: the shard's Machines and Clusters are forgotten.
        idx.let_go_shard(shard(mine));
        assert!(kept(&idx).is_empty() && idx.clusters.is_empty());
        assert!(idx.capi_unlisted("ns/c0").is_some());
        // Machines never listed: no decision; a new local Node: none until they are listed again.
        assert!(idx.rule_unlisted().is_some(), "Machines not listed yet");
        idx.sources.machines = SourceState::Synced;
        assert_eq!(idx.rule_unlisted(), None);
        idx.put_node(LOCAL_CLUSTER, Some(node("local-2", json!({}))), None, now);
        assert!(idx.rule_unlisted().is_some() && idx.sharding.capi_relist_asked);
        // One shard: everything is kept, nothing waits.
        let mut one = Index::with_shards(1, false);
        one.put_machine(Some(&machine_of("m-other", &other, "x2")), None);
        assert_eq!(kept(&one), ["m-other"]);
        assert_eq!((one.capi_unlisted("ns/c0"), one.rule_unlisted()), (None, None));
    }

    /// A check's policy is validated when it is stored, kept through status-only updates,
    /// validated again when its spec changes, and forgotten with it.
    #[test]
    fn a_checks_policy_is_validated_when_stored() {
        let check = |generation: i64, rv: &str, max_unhealthy: &str| -> MachineHealthCheck {
            serde_json::from_value(json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                "metadata": {"name": "c", "namespace": "ns", "generation": generation, "resourceVersion": rv},
                "spec": {"clusterName": "k", "selector": {"matchLabels": {"a": "b"}}, "maxUnhealthy": max_unhealthy,
                         "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]}
            }))
            .expect("a MachineHealthCheck")
        };
        let mut idx = Index::default();
        idx.put_mhc(Some(check(1, "1", "40%")), None);
        let first = idx.mhc_policy("ns", "c").cloned().expect("stored").expect("valid");
        assert_eq!(first.cluster_name, "k");
        idx.put_mhc(Some(check(2, "2", "120%")), None);
        let error = idx.mhc_policy("ns", "c").cloned().expect("stored").expect_err("invalid now");
        assert!(error.contains("spec.maxUnhealthy") && error.contains("120%"), "{error}");
        idx.put_mhc(Some(check(3, "3", "40%")), None);
        assert!(idx.mhc_policy("ns", "c").is_some_and(|p| p.is_ok()), "valid again");
        idx.put_mhc(None, Some(("ns".into(), "c".into())));
        assert!(idx.mhc_policy("ns", "c").is_none(), "forgotten with the check");
    }

    /// The stall a relist could cause: our status write lands while the check's watch lists
    /// again, the list (from before the write) puts the older status back, and the write's own
    /// watch event then arrives as a status-only change. That event must get a decision of the
    /// check (which writes the status it decides), while the echo of a write the index holds
    /// gets none.
    #[test]
    fn a_status_the_controller_did_not_last_write_gets_a_decision_and_its_own_echo_does_not() {
        let check = |rv: &str, allowed: &str| -> MachineHealthCheck {
            serde_json::from_value(json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                "metadata": {"name": "c", "namespace": "ns", "generation": 1, "resourceVersion": rv},
                "spec": {"clusterName": "k", "selector": {"matchLabels": {"a": "b"}},
                         "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]},
                "status": {"conditions": [{"type": "RemediationAllowed", "status": allowed, "reason": "r",
                                           "lastTransitionTime": "2026-11-24T10:00:00Z"}]}
            }))
            .expect("a MachineHealthCheck")
        };
        let me = CheckRef::Machine { namespace: "ns".into(), name: "c".into() };
        let mut idx = Index::default();
        assert_eq!(idx.put_mhc(Some(check("10", "True")), None), BTreeSet::from([me.clone()]), "a new check");
        // Our write's answer goes in at once (apply ignores what it returns); its echo is not newer.
        idx.put_mhc(Some(check("12", "False")), None);
        assert!(idx.put_mhc(Some(check("12", "False")), None).is_empty(), "the echo of our own write");
        // A relist from before the write puts the older status back...
        idx.clear_mhcs();
        idx.put_mhc(Some(check("10", "True")), None);
        // ...and the write's event is then a status-only change: that check alone decides again.
        assert_eq!(idx.put_mhc(Some(check("12", "False")), None), BTreeSet::from([me]));
        // A newer version with the same status (another field of metadata) asks for nothing.
        assert!(idx.put_mhc(Some(check("13", "False")), None).is_empty());

        let nhc = |rv: &str, phase: &str| -> NodeHealthCheck {
            serde_json::from_value(json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
                "metadata": {"name": "n", "generation": 1, "resourceVersion": rv},
                "spec": {"selector": {"matchLabels": {"a": "b"}}, "minHealthy": 1, "remediationTemplate":
                         {"apiVersion": "x.io/v1", "kind": "RebootTemplate", "name": "t", "namespace": "ns"}},
                "status": {"phase": phase}
            }))
            .expect("a NodeHealthCheck")
        };
        let me = CheckRef::Node { name: "n".into() };
        idx.put_nhc(Some(nhc("20", "Enabled")), None);
        idx.put_nhc(Some(nhc("22", "Remediating")), None);
        assert!(idx.put_nhc(Some(nhc("22", "Remediating")), None).is_empty(), "the echo of our own write");
        idx.clear_nhcs();
        idx.put_nhc(Some(nhc("20", "Enabled")), None);
        assert_eq!(idx.put_nhc(Some(nhc("22", "Remediating")), None), BTreeSet::from([me]));
    }

    #[test]
    fn a_node_health_check_decision_gets_the_nodes_it_needs_as_labels_change() {
        let mut idx = Index::default();
        let now = jiff::Timestamp::UNIX_EPOCH;
        let nodes = [
            node("w2", json!({"role": "worker"})),
            node("w1", json!({"role": "worker"})),
            node("db", json!({"role": "db"})),
            node("cp", json!({"node-role.kubernetes.io/control-plane": ""})),
        ];
        for n in &nodes {
            idx.put_node(LOCAL_CLUSTER, Some(n.clone()), None, now);
        }
        let check: NodeHealthCheck = serde_json::from_value(json!({
            "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1, "remediationTemplate":
                     {"apiVersion": "x.io/v1", "kind": "RebootTemplate", "name": "t", "namespace": "ns"}},
            // decided before, with no Node listed
            "status": {"phase": "Enabled", "observedNodes": 3, "healthyNodes": 3}}))
        .expect("check");
        validate::node_health_check(&check).expect("a valid check");
        idx.put_nhc(Some(check), None);
        // Selected, control-plane, and what an object names; sorted; never the others.
        assert_eq!(names(&idx.nhc_decision_nodes("workers", [])), ["cp", "w1", "w2"]);
        assert_eq!(names(&idx.nhc_decision_nodes("workers", ["db", "gone"])), ["cp", "db", "w1", "w2"]);
        // A label change moves a Node in or out; a deleted Node leaves.
        idx.put_node(LOCAL_CLUSTER, Some(node("db", json!({"role": "worker"}))), None, now);
        idx.put_node(LOCAL_CLUSTER, Some(node("w1", json!({"role": "spare"}))), None, now);
        let woken = idx.put_node(LOCAL_CLUSTER, None, Some("w2".into()), now);
        assert_eq!(names(&idx.nhc_decision_nodes("workers", [])), ["cp", "db"]);
        // A selected Node gone changes the check's counts though no status lists it: it wakes
        // the check; a Node it never selected does not.
        assert_eq!(woken, BTreeSet::from([CheckRef::Node { name: "workers".into() }]));
        idx.put_node(LOCAL_CLUSTER, Some(node("spare", json!({"role": "spare"}))), None, now);
        assert!(idx.put_node(LOCAL_CLUSTER, None, Some("spare".into()), now).is_empty());
        // A complete list replaces everything.
        idx.nodes.entry(LOCAL_CLUSTER.to_string()).or_default().nodes =
            [node("w9", json!({"role": "worker"}))].into_iter().map(|n| ("w9".to_string(), Arc::new(n))).collect();
        idx.renew_nhc_nodes();
        assert_eq!(names(&idx.nhc_decision_nodes("workers", [])), ["w9"]);
    }

    /// One step of the target-set property: a Machine stored (with its group label and
    /// whether it carries the skip annotation) or removed, a check's selector changed (groups
    /// 0–2: one group; 3: groups 0 or 1; 4: an invalid, empty selector), a check's status
    /// listing Machines as its targets, or a complete list of Machines.
    #[derive(Debug, Clone)]
    enum Step {
        Machine { name: u8, group: u8, skip: bool },
        Gone { name: u8 },
        Check { name: u8, group: u8 },
        Listed { name: u8, machines: Vec<u8> },
        Relist,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0u8..12, 0u8..3, any::<bool>()).prop_map(|(name, group, skip)| Step::Machine { name, group, skip }),
            2 => (0u8..12).prop_map(|name| Step::Gone { name }),
            2 => (0u8..3, 0u8..5).prop_map(|(name, group)| Step::Check { name, group }),
            2 => (0u8..3, proptest::collection::vec(0u8..12, 0..4)).prop_map(|(name, machines)| Step::Listed { name, machines }),
            1 => Just(Step::Relist),
        ]
    }

    fn grouped_machine(name: u8, group: u8, skip: bool, rv: u64) -> MachineEntry {
        let annotations = if skip { json!({"cluster.x-k8s.io/skip-remediation": ""}) } else { json!({}) };
        machine_entry(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": format!("m{name:02}"), "namespace": "ns", "resourceVersion": rv.to_string(),
                         "labels": {"group": format!("g{group}"), CLUSTER_NAME_LABEL: "c"},
                         "annotations": annotations},
            "spec": {"clusterName": "c"}}))
        .expect("a Machine")
    }

    fn grouped_check(name: u8, group: u8, rv: u64) -> MachineHealthCheck {
        listing_check(name, group, rv, rv, &[])
    }

    /// Check `c<name>` at `generation` whose status lists Machines `listed`.
    fn listing_check(name: u8, group: u8, generation: u64, rv: u64, listed: &[u8]) -> MachineHealthCheck {
        let selector = match group {
            0..3 => json!({"matchLabels": {"group": format!("g{group}")}}),
            3 => json!({"matchExpressions": [{"key": "group", "operator": "In", "values": ["g0", "g1"]}]}),
            _ => json!({}),
        };
        let mut targets: Vec<String> = listed.iter().map(|m| format!("m{m:02}")).collect();
        targets.sort();
        targets.dedup();
        serde_json::from_value(json!({
            "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
            "metadata": {"name": format!("c{name}"), "namespace": "ns", "generation": generation, "resourceVersion": rv.to_string()},
            "spec": {"clusterName": "c", "selector": selector,
                     "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]},
            "status": {"targets": targets}
        }))
        .expect("a MachineHealthCheck")
    }

    /// The checks a Machine change concerns, found by walking every check of its namespace.
    fn concerned_by_walking(idx: &Index, views: &[&MachineView]) -> BTreeSet<CheckRef> {
        let mut out: BTreeSet<CheckRef> = idx.waiting_checks().collect();
        for ((ns, name), e) in idx.mhcs.entries() {
            let concerned = views.iter().any(|v| match &e.policy {
                Ok(p) => concerns::mhc_concerns_machine(&e.object, p, v),
                Err(_) => false,
            });
            if concerned {
                out.insert(CheckRef::Machine { namespace: ns.clone(), name: name.clone() });
            }
        }
        out
    }

    #[test]
    fn a_checks_targets_follow_labels_annotations_and_its_selector() {
        let mut idx = Index::default();
        let kept =
            |idx: &Index| -> Vec<String> { idx.mhc_machines("ns", "c0").iter().map(|m| m.meta.name.clone()).collect() };
        idx.put_machine_entry(Some(grouped_machine(1, 1, false, 2)), None);
        idx.put_machine_entry(Some(grouped_machine(2, 2, false, 3)), None);
        idx.put_mhc(Some(grouped_check(0, 1, 4)), None);
        assert_eq!(kept(&idx), ["m01"], "selected when the check is stored");
        idx.put_machine_entry(Some(grouped_machine(2, 1, false, 5)), None);
        assert_eq!(kept(&idx), ["m01", "m02"], "a label change moves a Machine in");
        idx.put_machine_entry(Some(grouped_machine(1, 1, true, 6)), None);
        assert_eq!(kept(&idx), ["m02"], "skip-remediation takes it out");
        idx.put_mhc(Some(grouped_check(0, 2, 7)), None);
        assert!(kept(&idx).is_empty(), "a new selector selects again");
        idx.put_machine_entry(Some(grouped_machine(3, 2, false, 8)), None);
        idx.put_machine_entry(None, Some(("ns".into(), "m03".into())));
        assert!(kept(&idx).is_empty(), "a deleted Machine leaves");
    }

    #[test]
    fn a_machine_is_read_again_only_at_a_version_the_index_does_not_hold() {
        let mut idx = Index::default();
        idx.put_mhc(Some(grouped_check(0, 1, 1)), None);
        idx.put_machine_entry(Some(grouped_machine(1, 1, false, 5)), None);
        let object = |namespace: &str, name: &str, version: Option<&str>| {
            let mut meta = json!({"name": name, "namespace": namespace});
            if let Some(v) = version {
                meta["resourceVersion"] = json!(v);
            }
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": meta})
        };
        let held = idx.machine_at(&object("ns", "m01", Some("5"))).expect("the version held");
        assert_eq!(held.view.meta.name, "m01");
        for (namespace, name, version) in [
            ("ns", "m01", Some("4")),
            ("ns", "m01", Some("6")),
            ("ns", "m01", None),
            ("ns", "m01", Some("")),
            ("ns", "m02", Some("5")),
            ("other", "m01", Some("5")),
        ] {
            let raw = object(namespace, name, version);
            assert!(idx.machine_at(&raw).is_none(), "{namespace}/{name} at {version:?}");
        }
        assert!(idx.machine_at(&json!({"kind": "Machine"})).is_none(), "no metadata, nothing held");
        // What the watch passes on for its echo changes nothing and concerns no check.
        assert!(idx.put_machine_entry(Some(held), None).is_empty(), "the echo of the version held");
        assert_eq!(idx.mhc_machines("ns", "c0").len(), 1);
        // A newer version (the Machine moved to another group) is read and stored.
        assert!(idx.machine_at(&object("ns", "m01", Some("7"))).is_none());
        let concerned = idx.put_machine_entry(Some(grouped_machine(1, 2, false, 7)), None);
        assert!(concerned.contains(&CheckRef::Machine { namespace: "ns".into(), name: "c0".into() }));
        assert!(idx.mhc_machines("ns", "c0").is_empty(), "the new version's labels count");
    }

    proptest::proptest! {
        /// Whatever Machines and checks do, in any order, each check's kept targets are exactly
        /// what matching its selector against every Machine of the namespace gives, and a
        /// Machine change concerns exactly the checks a walk over every check finds (those
        /// that select it before or after, or list it in their status; an invalid check none).
        #[test]
        fn each_checks_kept_targets_are_what_its_selector_selects(steps in proptest::collection::vec(step(), 1..60)) {
            let mut idx = Index::default();
            let mut rv = 1;
            let mut specs: BTreeMap<u8, (u8, u64)> = BTreeMap::new();
            for s in steps {
                rv += 1;
                let held = |idx: &Index, name: u8| {
                    idx.machines.get("ns").and_then(|m| m.get(&format!("m{name:02}"))).map(|e| Arc::clone(&e.view))
                };
                match s {
                    Step::Machine { name, group, skip } => {
                        let old = held(&idx, name);
                        let new = grouped_machine(name, group, skip, rv);
                        let views: Vec<&MachineView> = old.iter().map(Arc::as_ref).chain([new.view.as_ref()]).collect();
                        let expected = concerned_by_walking(&idx, &views);
                        let new_view = Arc::clone(&new.view);
                        let concerned = idx.put_machine_entry(Some(new), None);
                        let expected_after = concerned_by_walking(&idx, &[new_view.as_ref()]);
                        proptest::prop_assert_eq!(&concerned, &expected.union(&expected_after).cloned().collect(), "m{:02}", name);
                    }
                    Step::Gone { name } => {
                        let old = held(&idx, name);
                        let expected = match &old {
                            Some(v) => concerned_by_walking(&idx, &[v.as_ref()]),
                            None => idx.waiting_checks().collect(),
                        };
                        let concerned = idx.put_machine_entry(None, Some(("ns".into(), format!("m{name:02}"))));
                        proptest::prop_assert_eq!(concerned, expected, "m{:02} gone", name);
                    }
                    Step::Check { name, group } => {
                        specs.insert(name, (group, rv));
                        idx.put_mhc(Some(grouped_check(name, group, rv)), None);
                    }
                    Step::Listed { name, machines } => {
                        let (group, generation) = *specs.entry(name).or_insert((0, rv));
                        idx.put_mhc(Some(listing_check(name, group, generation, rv, &machines)), None);
                    }
                    Step::Relist => {
                        let all: Vec<MachineEntry> = idx.machines.values().flat_map(|m| m.values().cloned()).collect();
                        idx.clear_machines();
                        for e in all {
                            idx.put_machine_entry(Some(e), None);
                        }
                    }
                }
                for (ns, name) in idx.mhcs.keys() {
                    let policy = idx.mhc_policy(ns, name).cloned().expect("stored").ok();
                    let expected: Vec<&MachineView> = idx.machines.get(ns).into_iter().flat_map(|m| m.values())
                        .filter(|e| policy.as_ref().is_some_and(|p| vigil_engine::target::is_target(p, &e.view)))
                        .map(|e| e.view.as_ref()).collect();
                    let kept = idx.mhc_machines(ns, name);
                    let names = |views: &[&MachineView]| -> Vec<String> { views.iter().map(|m| m.meta.name.clone()).collect() };
                    proptest::prop_assert_eq!(names(&kept), names(&expected), "check {}", name);
                    // Each kept Machine is the one the Machine index holds now, not an older one.
                    for (k, e) in kept.iter().zip(&expected) {
                        proptest::prop_assert!(std::ptr::eq(*k, *e), "check {} keeps an old m {}", name, k.meta.name);
                    }
                }
            }
        }
    }

    /// A self-hosted workload cluster whose connection shares the management cluster's Node
    /// cache is read from it, and a management Node's change concerns its Machines' checks;
    /// once its connection is lost (not synced), its checks read the unsynced entry again, so
    /// they decide nothing.
    #[test]
    fn a_shared_node_cache_serves_a_self_hosted_cluster_only_while_it_is_connected() {
        let mut idx = Index::default();
        let now = jiff::Timestamp::UNIX_EPOCH;
        idx.put_node(LOCAL_CLUSTER, Some(node("n1", json!({}))), None, now);
        let mut m = machine("5", Some("True"));
        m["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": "c", "group": "g0"});
        idx.put_machine(Some(&m), None);
        idx.put_mhc(Some(grouped_check(0, 0, 6)), None);
        assert_eq!(idx.node_source("ns/c"), "ns/c", "not connected");
        assert!(idx.checks_for_node(LOCAL_CLUSTER, "n1").is_empty(), "a management Node is not the workload's yet");
        let c = WorkloadCluster::new("ns", "c");
        idx.hosting.connected(&c, true);
        idx.hosting.share_local_nodes(&c);
        idx.nodes.entry("ns/c".into()).or_default().state = SourceState::Synced;
        assert_eq!(idx.node_source("ns/c"), LOCAL_CLUSTER);
        assert_eq!(
            idx.checks_for_node(LOCAL_CLUSTER, "n1"),
            BTreeSet::from([CheckRef::Machine { namespace: "ns".into(), name: "c0".into() }])
        );
        idx.nodes.entry("ns/c".into()).or_default().state = SourceState::Failed("the Secret changed".into());
        assert_eq!(idx.node_source("ns/c"), "ns/c", "lost: its own (unsynced) entry again");
    }

    #[test]
    fn versions_compare_as_numbers_and_anything_else_is_taken() {
        assert!(not_newer(Some("9"), Some("10")), "9 is older than 10 (not a string comparison)");
        assert!(not_newer(Some("10"), Some("10")));
        assert!(!not_newer(Some("11"), Some("10")));
        assert!(!not_newer(Some("abc"), Some("10")), "an opaque version is taken as is");
        assert!(!not_newer(Some("10"), None));
        assert!(!not_newer(None, Some("10")));
    }

    #[test]
    fn our_own_write_is_not_undone_by_an_older_watch_event() {
        let mut idx = Index::default();
        idx.put_machine(Some(&machine("100", None)), None);
        // The answer to our patch goes in at once...
        idx.put_machine(Some(&machine("105", Some("True"))), None);
        // ...and a watch event from before it (conflict retry: an intermediate version) is ignored.
        assert!(idx.put_machine(Some(&machine("103", None)), None).is_empty());
        assert_eq!(held_version(&idx).as_deref(), Some("105"));
        // The same version again changes nothing; a newer one is taken.
        idx.put_machine(Some(&machine("105", Some("True"))), None);
        idx.put_machine(Some(&machine("107", Some("False"))), None);
        assert_eq!(held_version(&idx).as_deref(), Some("107"));
        // A deletion is always taken.
        idx.put_machine(None, Some(("ns".into(), "m1".into())));
        assert_eq!(held_version(&idx), None);
        assert!(idx.machines_by_node.is_empty());
    }
}
