//! What each workload cluster's connection found, in one record per cluster: whether it is the
//! cluster Vigil runs in (self-hosted), and whether its Nodes are read through the management
//! cluster's Node cache. Before, the same `"namespace/name"` string keyed three sets that every
//! caller kept in step by hand.

pub use crate::sources::WorkloadCluster;
use std::collections::BTreeMap;

/// What one connection found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Found {
    self_hosted: bool,
    shares_local_nodes: bool,
}

/// What the connections found, by workload cluster. A cluster is absent until its connection
/// tells (with `--shards`, a replica connects only to its shards' clusters).
#[derive(Debug, Default)]
pub struct Hosting {
    found: BTreeMap<WorkloadCluster, Found>,
}

impl Hosting {
    /// `cluster`'s connection told whether it is self-hosted; its Nodes are not shared (yet).
    pub fn connected(&mut self, cluster: &WorkloadCluster, self_hosted: bool) {
        self.found.insert(cluster.clone(), Found { self_hosted, shares_local_nodes: false });
    }

    /// The connected, self-hosted `cluster` reads its Nodes through the management cluster's
    /// cache from now on (its credentials may list Nodes). Ignored for a cluster not connected.
    pub fn share_local_nodes(&mut self, cluster: &WorkloadCluster) {
        if let Some(f) = self.found.get_mut(cluster).filter(|f| f.self_hosted) {
            f.shares_local_nodes = true;
        }
    }

    /// `cluster`'s connection is down: its Nodes are no longer read through the shared cache
    /// (what it told of its hosting stays until it connects again).
    pub fn stop_sharing(&mut self, cluster: &WorkloadCluster) {
        if let Some(f) = self.found.get_mut(cluster) {
            f.shares_local_nodes = false;
        }
    }

    /// Forgets everything about `cluster` (its shard was let go).
    pub fn forget(&mut self, cluster: &WorkloadCluster) {
        self.found.remove(cluster);
    }

    /// Whether `cluster`'s connection found it to be the cluster Vigil runs in.
    pub fn is_self_hosted(&self, cluster: &WorkloadCluster) -> bool {
        self.found.get(cluster).is_some_and(|f| f.self_hosted)
    }

    /// Whether `cluster`'s connection has told whether it is self-hosted.
    pub fn is_known(&self, cluster: &WorkloadCluster) -> bool {
        self.found.contains_key(cluster)
    }

    /// Whether `cluster` reads its Nodes through the management cluster's cache.
    pub fn shares_local_nodes(&self, cluster: &WorkloadCluster) -> bool {
        self.found.get(cluster).is_some_and(|f| f.shares_local_nodes)
    }

    /// The clusters reading their Nodes through the management cluster's cache.
    pub fn sharing(&self) -> impl Iterator<Item = &WorkloadCluster> {
        self.found.iter().filter(|(_, f)| f.shares_local_nodes).map(|(c, _)| c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_shares_the_local_nodes_only_while_connected_and_self_hosted() {
        let (prod, edge) = (WorkloadCluster::new("default", "prod"), WorkloadCluster::new("default", "edge"));
        let mut h = Hosting::default();
        assert!(!h.is_known(&prod) && !h.is_self_hosted(&prod));
        h.share_local_nodes(&prod);
        assert!(!h.shares_local_nodes(&prod), "not connected: nothing to share");
        h.connected(&prod, true);
        h.connected(&edge, false);
        h.share_local_nodes(&prod);
        h.share_local_nodes(&edge);
        assert!(h.shares_local_nodes(&prod) && !h.shares_local_nodes(&edge), "only a self-hosted cluster shares");
        assert_eq!(h.sharing().collect::<Vec<_>>(), vec![&prod]);
        h.stop_sharing(&prod);
        assert!(!h.shares_local_nodes(&prod) && h.is_self_hosted(&prod) && h.is_known(&prod));
        h.forget(&prod);
        assert!(!h.is_known(&prod) && h.is_known(&edge));
    }

    #[test]
    fn a_key_names_a_workload_cluster_and_the_local_key_none() {
        let prod = WorkloadCluster::new("default", "prod");
        assert_eq!(WorkloadCluster::from_key(&prod.key()), Some(prod.clone()));
        assert_eq!(prod.to_string(), "default/prod");
        assert_eq!(WorkloadCluster::from_key(vigil_engine::target::LOCAL_CLUSTER), None);
        assert_eq!(WorkloadCluster::from_key("/prod"), None);
    }
}
