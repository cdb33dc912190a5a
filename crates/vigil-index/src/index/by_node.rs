//! Machines by the Node they reference: what finds the Machines of a Node (the checks a Node
//! change concerns, the scope of a confirming read) without walking every Machine. Two maps
//! kept in step: the Machines of each (cluster, Node), and how many Nodes each cluster has
//! there, so that a Node name can be looked up in every cluster at once.

use std::collections::{BTreeMap, HashMap};

/// A Machine's namespace and name.
pub type MachineKey = (String, String);

/// The Machines referencing each Node, by the Node's cluster key and name.
#[derive(Debug, Default)]
pub struct MachinesByNode {
    /// Each Node's Machines, sorted and without duplicates. Nearly every Node has one Machine:
    /// a `Vec` of one is 48 bytes where a `BTreeSet`'s first leaf is 540 (5 MiB at 10 000).
    machines: HashMap<(String, String), Vec<MachineKey>>,
    /// The clusters of `machines`' keys, each with how many Nodes it has there.
    clusters: BTreeMap<String, usize>,
}

impl MachinesByNode {
    /// Machine `machine` references Node `node` of `cluster`.
    pub fn add(&mut self, cluster: &str, node: &str, machine: &MachineKey) {
        let list = match self.machines.entry((cluster.to_string(), node.to_string())) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                *self.clusters.entry(cluster.to_string()).or_default() += 1;
                e.insert(Vec::new())
            }
        };
        if let Err(at) = list.binary_search(machine) {
            list.reserve_exact(1);
            list.insert(at, machine.clone());
        }
    }

    /// Machine `machine` no longer references Node `node` of `cluster`.
    pub fn remove(&mut self, cluster: &str, node: &str, machine: &MachineKey) {
        let key = (cluster.to_string(), node.to_string());
        let Some(list) = self.machines.get_mut(&key) else { return };
        if let Ok(at) = list.binary_search(machine) {
            list.remove(at);
        }
        if !list.is_empty() {
            return;
        }
        self.machines.remove(&key);
        if let Some(count) = self.clusters.get_mut(cluster) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.clusters.remove(cluster);
            }
        }
    }

    /// Forgets every Machine (a complete list follows).
    pub fn clear(&mut self) {
        self.machines.clear();
        self.clusters.clear();
    }

    /// The Machines referencing Node `node` of `cluster`, sorted.
    pub fn of(&self, cluster: &str, node: &str) -> &[MachineKey] {
        self.machines.get(&(cluster.to_string(), node.to_string())).map_or(&[], Vec::as_slice)
    }

    /// The Machines referencing a Node named `node` in any cluster.
    pub fn of_any_cluster<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a MachineKey> + 'a {
        self.clusters.keys().flat_map(move |cluster| self.of(cluster, node))
    }

    /// Each cluster with how many of its Nodes are referenced (for tests and gauges).
    pub fn clusters(&self) -> &BTreeMap<String, usize> {
        &self.clusters
    }

    /// Whether no Machine references a Node.
    pub fn is_empty(&self) -> bool {
        self.machines.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str) -> MachineKey {
        ("ns".to_string(), name.to_string())
    }

    #[test]
    fn the_two_maps_move_together() {
        let mut by = MachinesByNode::default();
        by.add("a/c1", "n1", &m("m2"));
        by.add("a/c1", "n1", &m("m1"));
        by.add("a/c1", "n1", &m("m1"));
        by.add("b/c2", "n1", &m("m3"));
        assert_eq!(by.of("a/c1", "n1"), [m("m1"), m("m2")], "sorted, no duplicate");
        assert_eq!(by.of_any_cluster("n1").cloned().collect::<Vec<_>>(), [m("m1"), m("m2"), m("m3")]);
        assert_eq!(by.clusters(), &BTreeMap::from([("a/c1".into(), 1), ("b/c2".into(), 1)]));
        by.remove("a/c1", "n1", &m("m1"));
        assert_eq!(by.clusters().get("a/c1"), Some(&1), "n1 still has m2");
        by.remove("a/c1", "n1", &m("m2"));
        by.remove("a/c1", "n9", &m("m2"));
        assert_eq!(by.clusters(), &BTreeMap::from([("b/c2".into(), 1)]));
        by.clear();
        assert!(by.is_empty() && by.clusters().is_empty());
    }
}
