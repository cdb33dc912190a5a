//! What a decision may trust of each source the observed state comes from, and what a check
//! needs watched: the words the stores and the adapters that fill them share.

/// Whether a watched source can be trusted right now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SourceState {
    /// Not listed completely yet.
    #[default]
    Syncing,
    /// Listed and watching.
    Synced,
    /// The watch failed; the cache may be stale (why, for the operator).
    Failed(String),
}

/// Something a check needs watched before it can be decided.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Objects of a kind (group, version, kind), e.g. a template kind.
    Kind {
        /// API group.
        group: String,
        /// API version.
        version: String,
        /// Kind.
        kind: String,
        /// Whether objects of this kind are templates (keep `spec.template`).
        template: bool,
    },
    /// The Nodes of a workload cluster.
    WorkloadCluster(WorkloadCluster),
}

/// Where Nodes come from: the management cluster's key (empty) or a workload cluster's
/// `namespace/clusterName`.
pub type ClusterKey = String;

/// Group and kind of a dynamic kind.
pub type GroupKind = (String, String);

/// A source of the index whose state its watch reports: a decision reads only synced sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Vigil's MachineHealthChecks.
    Mhcs,
    /// Vigil's NodeHealthChecks.
    Nhcs,
    /// Cluster API Machines.
    Machines,
    /// Cluster API Clusters.
    Clusters,
    /// The Nodes of a cluster (the management cluster's key, or a workload cluster's).
    Nodes(ClusterKey),
    /// The objects of a template or remediation kind.
    Kind(GroupKind),
    /// The node Leases of the lease namespace.
    Leases,
    /// medik8s' NodeHealthChecks (`--serve-medik8s`).
    Medik8s,
}

/// A Cluster API workload cluster: the Cluster's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadCluster {
    namespace: String,
    name: String,
}

impl WorkloadCluster {
    /// The cluster `name` of namespace `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        WorkloadCluster { namespace: namespace.to_string(), name: name.to_string() }
    }

    /// The cluster a Node-cache or shard key (`namespace/name`) names; `None` for the local
    /// cluster's key and anything else without a namespace.
    pub fn from_key(key: &str) -> Option<Self> {
        let (namespace, name) = key.split_once('/')?;
        (!namespace.is_empty() && !name.is_empty()).then(|| WorkloadCluster::new(namespace, name))
    }

    /// The workload cluster a Machine's Node lives in: its namespace's Cluster named by its
    /// cluster-name label; `None` for a Machine without one.
    pub fn of_machine(view: &vigil_api::views::MachineView) -> Option<Self> {
        let cluster = view.meta.labels.get(vigil_api::well_known::CLUSTER_NAME_LABEL)?;
        (!cluster.is_empty() && !view.meta.namespace.is_empty())
            .then(|| WorkloadCluster::new(&view.meta.namespace, cluster))
    }

    /// Its Cluster's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Its Cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key the engine and the Node caches know it by (`namespace/name`).
    pub fn key(&self) -> String {
        vigil_engine::shard::machine_check_key(&self.namespace, &self.name)
    }
}

/// The cluster a Node lives in, as the controller's clients and watches know it: the one Vigil
/// runs in, or a workload cluster. The engine and the Node caches key it by a string
/// ([`ClusterRef::key`]); this is that key read once, at the edge.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClusterRef {
    /// The cluster Vigil runs in.
    Local,
    /// A Cluster API workload cluster.
    Workload(WorkloadCluster),
}

impl ClusterRef {
    /// The cluster a Node-cache or target key names; `None` for a key that is neither the local
    /// cluster's nor `namespace/name`.
    pub fn from_key(key: &str) -> Option<Self> {
        if key == vigil_engine::target::LOCAL_CLUSTER {
            return Some(ClusterRef::Local);
        }
        WorkloadCluster::from_key(key).map(ClusterRef::Workload)
    }

    /// The key the engine and the Node caches know it by.
    pub fn key(&self) -> ClusterKey {
        match self {
            ClusterRef::Local => vigil_engine::target::LOCAL_CLUSTER.to_string(),
            ClusterRef::Workload(w) => w.key(),
        }
    }

    /// Whether it is the cluster Vigil runs in.
    pub fn is_local(&self) -> bool {
        matches!(self, ClusterRef::Local)
    }
}

impl std::fmt::Display for ClusterRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterRef::Local => f.write_str("the management cluster"),
            ClusterRef::Workload(w) => write!(f, "workload cluster {w}"),
        }
    }
}

impl std::fmt::Display for WorkloadCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_key_reads_as_the_local_cluster_a_workload_cluster_or_nothing() {
        let local = ClusterRef::from_key(vigil_engine::target::LOCAL_CLUSTER);
        assert_eq!(local, Some(ClusterRef::Local));
        let prod = ClusterRef::from_key("default/prod");
        assert_eq!(prod, Some(ClusterRef::Workload(WorkloadCluster::new("default", "prod"))));
        for malformed in ["prod", "/prod", "default/"] {
            assert_eq!(ClusterRef::from_key(malformed), None, "{malformed:?}");
        }
        for cluster in [ClusterRef::Local, ClusterRef::Workload(WorkloadCluster::new("a", "b"))] {
            assert_eq!(ClusterRef::from_key(&cluster.key()), Some(cluster));
        }
    }
}
