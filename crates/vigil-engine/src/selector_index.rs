//! Many label selectors indexed by one label value each requires, so an object's labels find the
//! few selectors that may select it instead of matching every one (a namespace may hold a
//! thousand MachineHealthChecks, one per workload cluster, each selecting its cluster's Machines).

use std::collections::HashMap;
use vigil_api::selector::Selector;

/// A fast hasher with a per-process random seed: the keys stored are the labels the checks'
/// selectors require (the checks' authors'); an object's labels, which anyone who can label a
/// Machine writes, are only looked up, so they cannot crowd the table. Every Machine of every
/// decision is looked up here once per label: the standard SipHash was a tenth of a large check's
/// decision.
type Fast = foldhash::fast::RandomState;

/// Items (checks, ranks) by a label value their selector requires.
#[derive(Debug, Clone)]
pub struct SelectorIndex<K> {
    /// Items by label key, then value: each item under the one of its selector's required
    /// `key = value` labels that the fewest items share, in the order the items were given.
    by_label: HashMap<String, HashMap<String, Vec<K>, Fast>, Fast>,
    /// Items whose selector requires no single label value (a candidate for every object), in
    /// the order given.
    unindexed: Vec<K>,
}

impl<K> Default for SelectorIndex<K> {
    fn default() -> Self {
        SelectorIndex { by_label: HashMap::default(), unindexed: Vec::new() }
    }
}

impl<K> SelectorIndex<K> {
    /// Indexes `items`, each with its selector; `None` for an item that must be looked at for
    /// every object (one whose selector is not known).
    pub fn build<'s>(items: impl IntoIterator<Item = (K, Option<&'s Selector>)>) -> Self {
        let items: Vec<(K, Option<&'s Selector>)> = items.into_iter().collect();
        let mut shared: HashMap<(&str, &str), usize> = HashMap::new();
        for (_, selector) in &items {
            for label in selector.iter().flat_map(|s| s.required_labels()) {
                *shared.entry(label).or_default() += 1;
            }
        }
        let mut index = SelectorIndex::default();
        for (item, selector) in items {
            let rarest = selector.and_then(|s| s.required_labels().min_by_key(|l| shared.get(l).copied().unwrap_or(0)));
            match rarest {
                Some((k, v)) => {
                    index.by_label.entry(k.to_string()).or_default().entry(v.to_string()).or_default().push(item)
                }
                None => index.unindexed.push(item),
            }
        }
        index
    }

    /// The items that may select an object with label `key = value` (and that no other label of
    /// it finds).
    pub fn under(&self, key: &str, value: &str) -> &[K] {
        self.by_label.get(key).and_then(|v| v.get(value)).map(Vec::as_slice).unwrap_or_default()
    }

    /// Every label key items are indexed under, with the lists under each of its values.
    pub fn keys(&self) -> impl Iterator<Item = (&str, impl Iterator<Item = &[K]>)> {
        self.by_label.iter().map(|(k, values)| (k.as_str(), values.values().map(Vec::as_slice)))
    }

    /// Whether no item is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_label.is_empty() && self.unindexed.is_empty()
    }

    /// The items that may select any object.
    pub fn unindexed(&self) -> &[K] {
        &self.unindexed
    }

    /// Every item that may select an object with `labels` (a superset of those that do; each
    /// once, when the object has each label key once).
    pub fn candidates<'a>(
        &'a self,
        labels: impl Iterator<Item = (&'a str, &'a str)> + 'a,
    ) -> impl Iterator<Item = &'a K> {
        let indexed = (!self.by_label.is_empty()).then_some(labels).into_iter().flatten();
        self.unindexed.iter().chain(indexed.flat_map(|(k, v)| self.under(k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use vigil_api::node_view::Labels;

    fn selector(v: serde_json::Value) -> Selector {
        let s: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(v).expect("selector");
        Selector::compile(&s).expect("valid")
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::of(Some(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()))
    }

    /// Whatever the selectors, the candidates of an object include every item that selects it.
    #[test]
    fn the_candidates_hold_every_selecting_item() {
        let selectors = [
            selector(serde_json::json!({"matchLabels": {"cluster": "a", "pool": "workers"}})),
            selector(serde_json::json!({"matchLabels": {"cluster": "b", "pool": "workers"}})),
            selector(serde_json::json!({"matchLabels": {"pool": "workers"}})),
            selector(
                serde_json::json!({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["workers", "infra"]}]}),
            ),
            selector(serde_json::json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]})),
            selector(serde_json::json!({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]})),
        ];
        let items = selectors.iter().enumerate().map(|(i, s)| (i, Some(s))).chain([(6, None)]);
        let index = SelectorIndex::build(items);
        let objects = [
            labels(&[("cluster", "a"), ("pool", "workers")]),
            labels(&[("cluster", "b"), ("pool", "infra"), ("gpu", "")]),
            labels(&[("pool", "workers")]),
            labels(&[]),
        ];
        for object in &objects {
            let found: Vec<usize> = index.candidates(object.iter()).copied().collect();
            let mut unique = found.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), found.len(), "each candidate once: {found:?}");
            for (i, s) in selectors.iter().enumerate() {
                if object.selected_by(s) {
                    assert!(found.contains(&i), "selector {i} selects {object:?} but is not a candidate: {found:?}");
                }
            }
            assert!(found.contains(&6), "an item without a selector is a candidate for every object");
        }
        // The rarest label indexes a selector: cluster=a is required by one selector, pool=workers
        // by three, so selector 0 is under cluster=a only.
        assert_eq!(index.under("cluster", "a"), [0]);
        assert!(index.under("pool", "workers").iter().all(|i| *i == 2), "{:?}", index.under("pool", "workers"));
    }
}
