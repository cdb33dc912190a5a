//! What the simulator reads from its store again and again, kept while the objects it was read
//! from are unchanged ([`Store::version_of`]): the Machines of a namespace, the management
//! cluster's Nodes, the parsed and validated checks, the remediation objects and each check's
//! claims. A 10 000-Node fleet otherwise had every decision and every Node change parse every
//! check and thousands of objects again. Nothing here decides: a view is the same value the
//! store would give, read once per change instead of once per use.

use crate::store::{Key, Store};
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;
use vigil_api::validate::{self, MhcPolicy, NhcPolicy};
use vigil_api::views::{MachineView, NodeView, RemediationView};
use vigil_api::{GROUP, MachineHealthCheck, NodeHealthCheck};
use vigil_engine::holders::Claim;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER};

/// API group of Cluster API's Machines and Clusters.
pub(crate) const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// A view and the store version it was read at.
type At<T> = (u64, Rc<T>);

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
    by_name: HashMap<String, (String, Option<Rc<MachineView>>)>,
}

/// The kept views.
#[derive(Default)]
pub(crate) struct Views {
    machines: HashMap<String, Option<MachineList>>,
    nodes: Option<At<Vec<NodeView>>>,
    machine_namespaces: Option<At<HashMap<String, BTreeSet<String>>>>,
    remediation_objects: Option<At<Vec<RemediationView>>>,
    mhcs: HashMap<Key, Parsed<MachineHealthCheck, MhcPolicy>>,
    nhcs: HashMap<Key, Parsed<NodeHealthCheck, NhcPolicy>>,
    claims: HashMap<CheckRef, (ClaimsAt, Rc<Vec<Claim>>)>,
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

fn resource_version(store: &Store, key: &Key) -> Option<String> {
    store.get(key)?.pointer("/metadata/resourceVersion")?.as_str().map(str::to_string)
}

/// Whether an object of the management cluster in `group` may be a remediation object (what
/// every NodeHealthCheck's claims are read from).
pub(crate) fn may_remediate(cluster: &str, group: &str) -> bool {
    cluster == LOCAL_CLUSTER && !group.is_empty() && group != GROUP && group != CAPI_GROUP
}

impl Views {
    /// Machines of a namespace of the management cluster. Only the Machines written since the
    /// last reading are read again (a Machine keeps its resource version while unchanged): an
    /// outage writes Machines one at a time, and reading all 10 000 for each write dominated it.
    pub(crate) fn machines(&mut self, store: &Store, namespace: &str) -> Rc<Vec<Rc<MachineView>>> {
        let version = store.list_version(LOCAL_CLUSTER, CAPI_GROUP, "Machine", Some(namespace));
        let slot = self.machines.entry(namespace.to_string()).or_default();
        if let Some(kept) = slot.as_ref().filter(|kept| kept.at == version) {
            return kept.views.clone();
        }
        let previous = slot.take().map(|kept| kept.by_name).unwrap_or_default();
        let mut by_name = HashMap::new();
        let mut views = Vec::new();
        for (key, object) in store.list(LOCAL_CLUSTER, CAPI_GROUP, "Machine", Some(namespace)) {
            let rv = object.pointer("/metadata/resourceVersion").and_then(serde_json::Value::as_str).unwrap_or("");
            let view = match previous.get(&key.name) {
                Some((at, view)) if at == rv => view.clone(),
                _ => MachineView::read(object).map(Rc::new),
            };
            views.extend(view.clone());
            by_name.insert(key.name.clone(), (rv.to_string(), view));
        }
        let views = Rc::new(views);
        *slot = Some(MachineList { at: version, views: views.clone(), by_name });
        views
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
        let rv = resource_version(store, key)?;
        if let Some((at, parsed)) = self.mhcs.get(key)
            && *at == rv
        {
            return parsed.clone();
        }
        let parsed = serde_json::from_value::<MachineHealthCheck>(store.get(key)?.clone())
            .ok()
            .and_then(|c| validate::machine_health_check(&c).ok().map(|p| Rc::new((c, p))));
        self.mhcs.insert(key.clone(), (rv, parsed.clone()));
        parsed
    }

    /// The NodeHealthCheck under `key`, parsed and validated (`None`: gone or invalid).
    pub(crate) fn nhc(&mut self, store: &Store, key: &Key) -> Option<Rc<(NodeHealthCheck, NhcPolicy)>> {
        let rv = resource_version(store, key)?;
        if let Some((at, parsed)) = self.nhcs.get(key)
            && *at == rv
        {
            return parsed.clone();
        }
        let parsed = serde_json::from_value::<NodeHealthCheck>(store.get(key)?.clone())
            .ok()
            .and_then(|c| validate::node_health_check(&c).ok().map(|p| Rc::new((c, p))));
        self.nhcs.insert(key.clone(), (rv, parsed.clone()));
        parsed
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
