//! What is checked and by whom: the identities every module shares (a check, a target, the
//! local cluster) and the few predicates that say what a target is. The bottom of the engine:
//! it imports nothing of the crate.

use serde::Serialize;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::NodeView;
use vigil_api::views::{MachineView, Meta, RemediationView};
use vigil_api::well_known::{
    CONTROL_PLANE_NODE_LABELS, NODE_NAME_ANNOTATION, PAUSED_ANNOTATION, SKIP_REMEDIATION_ANNOTATION,
};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};

/// The cluster key of Nodes of the cluster Vigil runs in (where NodeHealthChecks look, and where
/// a self-hosted MachineHealthCheck's Nodes are).
pub const LOCAL_CLUSTER: &str = "";

/// A health check, named the way events and messages name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum CheckRef {
    /// A MachineHealthCheck.
    Machine {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A NodeHealthCheck (cluster-scoped).
    Node {
        /// Its name.
        name: String,
    },
}

impl CheckRef {
    /// The identity of a MachineHealthCheck (namespace `default` when unset, as the API server does).
    pub fn of_mhc(check: &MachineHealthCheck) -> Self {
        CheckRef::Machine {
            namespace: check.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: check.metadata.name.clone().unwrap_or_default(),
        }
    }

    /// The identity of a NodeHealthCheck.
    pub fn of_nhc(check: &NodeHealthCheck) -> Self {
        CheckRef::Node { name: check.metadata.name.clone().unwrap_or_default() }
    }
}

impl std::fmt::Display for CheckRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckRef::Machine { namespace, name } => write!(f, "MachineHealthCheck/{namespace}/{name}"),
            CheckRef::Node { name } => write!(f, "NodeHealthCheck/{name}"),
        }
    }
}

/// What is remediated, as every check sees it: a Node of a cluster, or a Machine that has no
/// Node yet (only MachineHealthChecks of its namespace can select it). Plans name the target of
/// a MachineHealthCheck's writes and notices by its Machine ([`Target::machine`]) whether or not
/// it has a Node: that Machine is what is written and read again.
///
/// It serializes as its [`Target::key`], the form plans and the simulator's output have always
/// carried.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// A Node.
    Node {
        /// [`LOCAL_CLUSTER`] or the workload cluster's `namespace/clusterName`.
        cluster: String,
        /// The Node's name.
        name: String,
    },
    /// A Machine without a Node reference (in plans: any Machine, see [`Target`]).
    Machine {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

impl Target {
    /// A Node of the cluster Vigil runs in (what a NodeHealthCheck remediates).
    pub fn local_node(name: &str) -> Self {
        Target::Node { cluster: LOCAL_CLUSTER.into(), name: name.into() }
    }

    /// What a Machine stands for: its Node in `node_cluster` when it references one, else itself.
    pub fn of_machine(node_cluster: &str, machine: &MachineView) -> Self {
        match &machine.node_name {
            Some(node) => Target::Node { cluster: node_cluster.into(), name: node.clone() },
            None => Target::machine(machine),
        }
    }

    /// The Machine itself, Node or not: what a MachineHealthCheck's plan names as the target of
    /// its writes and notices.
    pub fn machine(machine: &MachineView) -> Self {
        Target::Machine { namespace: machine.meta.namespace.clone(), name: machine.meta.name.clone() }
    }

    /// The target's name without namespace or cluster (what a person looks for in a list).
    pub fn name(&self) -> &str {
        match self {
            Target::Node { name, .. } | Target::Machine { name, .. } => name,
        }
    }

    /// The target as plans, notices and the simulator's output write it: `namespace/name` for a
    /// Machine (as [`Meta::key`] writes it), the name for a Node of the local cluster,
    /// `cluster/name` for a workload cluster's (which plans never name: a MachineHealthCheck
    /// names its Machines).
    pub fn key(&self) -> String {
        match self {
            Target::Machine { namespace, name } if !namespace.is_empty() => format!("{namespace}/{name}"),
            Target::Machine { name, .. } => name.clone(),
            Target::Node { cluster, name } if cluster.is_empty() => name.clone(),
            Target::Node { cluster, name } => format!("{cluster}/{name}"),
        }
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.key())
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Node { cluster, name } if cluster.is_empty() => write!(f, "node {name}"),
            Target::Node { cluster, name } => write!(f, "node {name} of cluster {cluster}"),
            Target::Machine { namespace, name } => write!(f, "Machine {namespace}/{name}"),
        }
    }
}

/// Whether a Machine is a target: selected, and not opted out by annotation.
pub fn is_target(policy: &MhcPolicy, machine: &MachineView) -> bool {
    machine.meta.labels.selected_by(&policy.selector)
        && !machine.meta.annotations.contains_key(PAUSED_ANNOTATION)
        && !machine.meta.annotations.contains_key(SKIP_REMEDIATION_ANNOTATION)
}

/// Whether `object` is the remediation object Vigil made for `machine` (so it may delete it).
pub fn made_for(object: &RemediationView, machine: &MachineView) -> bool {
    object.meta.owners.iter().any(|o| {
        o.kind == "Machine"
            && o.name == machine.meta.name
            && (o.uid.is_empty() || machine.meta.uid.as_deref().is_none_or(|u| u == o.uid))
    })
}

/// Whether two strings are equal, looking at their (inline) lengths before their (heap) bytes:
/// with 100 000 Nodes most comparisons fail on the length and touch no cold memory.
pub(crate) fn same_str(a: &str, b: &str) -> bool {
    a.len() == b.len() && a == b
}

/// `map[key]`, walking the entries with [`same_str`] (label and annotation maps are small).
pub(crate) fn entry<'m>(map: &'m std::collections::BTreeMap<String, String>, key: &str) -> Option<&'m str> {
    map.iter().find(|(k, _)| same_str(k, key)).map(|(_, v)| v.as_str())
}

/// Whether a Node carries a control-plane role label.
pub fn is_control_plane(node: &NodeView) -> bool {
    // Walks the keys instead of searching the map: a search compares the bytes of every key it
    // passes, while label keys of the right length are rare.
    node.labels.iter().any(|(k, _)| CONTROL_PLANE_NODE_LABELS.iter().any(|c| same_str(k, c)))
}

/// The Node a medik8s remediation object is for: its node-name annotation, else its name.
pub fn remediation_node_name(object: &Meta) -> &str {
    object.annotations.get(NODE_NAME_ANNOTATION).map_or(object.name.as_str(), String::as_str)
}
