//! Each check's claims as of its last decision, kept by check and by target name: a decision
//! looks up the claims on its own targets instead of gathering every check's claims (during a
//! wave, hundreds) into a new table each time, and asks about a target without building it.

use std::collections::HashMap;
use vigil_api::views::MachineView;
use vigil_engine::holders::Claim;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};

/// A target a decision may ask about, borrowed from what the decision reads (see
/// [`Target`]: a Node of a cluster, or a Machine of a namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    node: bool,
    /// The Node's cluster, or the Machine's namespace.
    scope: &'a str,
    name: &'a str,
}

impl<'a> Candidate<'a> {
    /// What a Machine stands for ([`Target::of_machine`]).
    pub fn of_machine(node_cluster: &'a str, machine: &'a MachineView) -> Self {
        match &machine.node_name {
            Some(node) => Candidate { node: true, scope: node_cluster, name: node },
            None => Candidate { node: false, scope: &machine.meta.namespace, name: &machine.meta.name },
        }
    }

    /// A Node of cluster `scope` (`node`) or a Machine of namespace `scope`.
    pub fn new(node: bool, scope: &'a str, name: &'a str) -> Self {
        Candidate { node, scope, name }
    }

    /// A Node of the local cluster ([`Target::local_node`]).
    pub fn local_node(name: &'a str) -> Self {
        Candidate { node: true, scope: LOCAL_CLUSTER, name }
    }

    /// Whether `target` is this one.
    pub fn is(&self, target: &Target) -> bool {
        match target {
            Target::Node { cluster, name } => self.node && cluster == self.scope && name == self.name,
            Target::Machine { namespace, name } => !self.node && namespace == self.scope && name == self.name,
        }
    }

    /// The target itself.
    pub fn to_target(self) -> Target {
        match self.node {
            true => Target::Node { cluster: self.scope.to_string(), name: self.name.to_string() },
            false => Target::Machine { namespace: self.scope.to_string(), name: self.name.to_string() },
        }
    }
}

/// The claims of every check, by check and by the name of the target they are about.
#[derive(Debug, Default, Clone)]
pub struct ClaimCache {
    by_check: HashMap<CheckRef, Vec<Claim>>,
    /// The same claims by [`Target::name`] (a few targets of different clusters or kinds may
    /// share one). Every decision asks here about each of its targets: foldhash, randomly
    /// seeded per process, rather than SipHash.
    by_name: HashMap<String, Vec<Claim>, foldhash::fast::RandomState>,
}

impl ClaimCache {
    /// `check`'s claims as of its last decision.
    pub fn get(&self, check: &CheckRef) -> Option<&Vec<Claim>> {
        self.by_check.get(check)
    }

    /// Every check's claims.
    pub fn iter(&self) -> impl Iterator<Item = (&CheckRef, &Vec<Claim>)> {
        self.by_check.iter()
    }

    /// How many checks claim something.
    pub fn len(&self) -> usize {
        self.by_check.len()
    }

    /// Whether no check claims anything.
    pub fn is_empty(&self) -> bool {
        self.by_check.is_empty()
    }

    /// Replaces `check`'s claims (none: forgets the check).
    pub fn set(&mut self, check: &CheckRef, claims: Vec<Claim>) {
        for old in self.by_check.remove(check).into_iter().flatten() {
            if let Some(named) = self.by_name.get_mut(old.target.name()) {
                named.retain(|c| c.check != *check);
                if named.is_empty() {
                    self.by_name.remove(old.target.name());
                }
            }
        }
        if claims.is_empty() {
            return;
        }
        for claim in &claims {
            self.by_name.entry(claim.target.name().to_string()).or_default().push(claim.clone());
        }
        self.by_check.insert(check.clone(), claims);
    }

    /// Forgets every claim.
    pub fn clear(&mut self) {
        self.by_check.clear();
        self.by_name.clear();
    }

    /// Whether a check other than `me` claims `target`.
    pub fn claimed_by_other(&self, target: Candidate<'_>, me: &CheckRef) -> bool {
        self.by_name
            .get(target.name)
            .is_some_and(|claims| claims.iter().any(|c| c.check != *me && target.is(&c.target)))
    }

    /// Every check's claims about `target`.
    pub fn about<'a>(&'a self, target: &'a Target) -> impl Iterator<Item = &'a Claim> + 'a {
        self.by_name.get(target.name()).into_iter().flatten().filter(move |c| c.target == *target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(target: &str, check: &str) -> Claim {
        Claim { target: Target::local_node(target), check: CheckRef::Node { name: check.into() }, since: None }
    }

    #[test]
    fn the_by_name_view_follows_every_replacement() {
        let (a, b) = (CheckRef::Node { name: "a".into() }, CheckRef::Node { name: "b".into() });
        let mut cache = ClaimCache::default();
        cache.set(&a, vec![claim("n1", "a"), claim("n1", "a"), claim("n2", "a")]);
        cache.set(&b, vec![claim("n2", "b")]);
        let (n1, n2) = (Target::local_node("n1"), Target::local_node("n2"));
        let (c1, c2) = (Candidate::local_node("n1"), Candidate::local_node("n2"));
        assert_eq!(cache.about(&n1).count(), 2, "both of a's claims on n1");
        assert!(cache.claimed_by_other(c2, &a) && cache.claimed_by_other(c2, &b));
        assert!(!cache.claimed_by_other(c1, &a), "only a claims n1");
        // The same name in another cluster or as a Machine is another target.
        let remote = Target::Node { cluster: "ns/c".into(), name: "n2".into() };
        let machine = Target::Machine { namespace: "ns".into(), name: "n2".into() };
        cache.set(&b, vec![Claim { target: remote.clone(), ..claim("n2", "b") }]);
        assert!(!cache.claimed_by_other(c2, &a), "b claims n2 of ns/c, not the local n2");
        assert_eq!(cache.about(&remote).count(), 1);
        assert_eq!(cache.about(&machine).count(), 0);
        cache.set(&a, vec![claim("n2", "a")]);
        assert_eq!(cache.about(&n1).count(), 0, "a let go of n1");
        cache.set(&b, Vec::new());
        assert!(cache.claimed_by_other(c2, &b) && !cache.claimed_by_other(c2, &a), "a alone claims n2");
        assert_eq!(cache.about(&n2).count(), 1);
        assert!(cache.get(&b).is_none());
        assert_eq!(cache.by_name.len(), 1, "{:?}", cache.by_name);
        cache.clear();
        assert_eq!(cache.iter().count(), 0);
    }

    #[test]
    fn a_candidate_is_the_target_it_stands_for() {
        let m = |node: Option<&str>| {
            let status = node.map_or(serde_json::json!({}), |n| serde_json::json!({"nodeRef": {"name": n}}));
            MachineView::read(&serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m", "namespace": "ns"}, "spec": {"clusterName": "c"}, "status": status}))
            .expect("Machine")
        };
        for machine in [m(Some("n")), m(None)] {
            let candidate = Candidate::of_machine("ns/c", &machine);
            let target = Target::of_machine("ns/c", &machine);
            assert!(candidate.is(&target));
            assert_eq!(candidate.to_target(), target);
        }
        assert_eq!(Candidate::local_node("n").to_target(), Target::local_node("n"));
        assert!(!Candidate::local_node("n").is(&Target::Machine { namespace: LOCAL_CLUSTER.into(), name: "n".into() }));
    }
}
