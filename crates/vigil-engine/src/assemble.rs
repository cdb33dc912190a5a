//! Who holds which target, assembled the same way by every adapter: the cluster key of a
//! MachineHealthCheck's Nodes, the ranking of a namespace's checks, each check's claims, and the
//! holders a decision is made against (its own claims derived now, the others' as cached or,
//! while confirming, derived now about the confirmed targets). The adapters only find the
//! objects; the controller and the simulator call these, so they cannot assemble differently.

use crate::holders::{self, Claim, Holders};
use crate::lookup::Lookup;
use crate::peers::MhcPeers;
use crate::target::{CheckRef, LOCAL_CLUSTER, Target};
use std::collections::{BTreeMap, BTreeSet};
use vigil_api::validate::MhcPolicy;
use vigil_api::views::{MachineView, RemediationView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};

/// The cluster key of a MachineHealthCheck's Nodes: [`LOCAL_CLUSTER`] when its workload cluster
/// is the cluster Vigil runs in (`local`), so an MHC and an NHC see one Node as one target.
pub fn node_cluster(namespace: &str, cluster_name: &str, local: bool) -> String {
    if local { LOCAL_CLUSTER.to_string() } else { format!("{namespace}/{cluster_name}") }
}

/// What one check's claims are derived from, as the adapter found it.
pub enum ClaimSource<'a> {
    /// A MachineHealthCheck (see [`holders::mhc_claims_among`]).
    Machine {
        /// The check.
        check: &'a MachineHealthCheck,
        /// Its policy.
        policy: &'a MhcPolicy,
        /// The valid checks of its namespace, ranked ([`crate::peers::KeptPeers`]).
        peers: &'a MhcPeers<'a>,
        /// Where its Nodes live ([`node_cluster`]).
        node_cluster: &'a str,
        /// The Machines to look at (all of its namespace, or those a confirmation is about).
        machines: &'a [&'a MachineView],
        /// The remediation objects of each of its templates' kinds in its namespace, by name
        /// (as `MhcInput::remediations`).
        remediations: &'a [&'a dyn Lookup<RemediationView>],
    },
    /// A NodeHealthCheck (see [`holders::nhc_claims`]).
    Node {
        /// The check.
        check: &'a NodeHealthCheck,
        /// Remediation objects of its templates' kinds (anyone's: only its own count).
        remediations: &'a [&'a RemediationView],
    },
}

/// The targets a check is remediating now.
pub fn claims(source: ClaimSource<'_>) -> Vec<Claim> {
    match source {
        ClaimSource::Machine { check, policy, peers, node_cluster, machines, remediations } => {
            holders::mhc_claims_among(check, policy, peers, node_cluster, machines, remediations)
        }
        ClaimSource::Node { check, remediations } => holders::nhc_claims(check, remediations),
    }
}

/// Whether a MachineHealthCheck of `namespace` whose Nodes are in `node_cluster` can hold any of
/// `about`: if not, a confirmation need not derive its claims (its cached ones stand).
pub fn mhc_can_hold(about: &BTreeSet<Target>, namespace: &str, node_cluster: &str) -> bool {
    about.iter().any(|t| match t {
        Target::Node { cluster, .. } => cluster == node_cluster,
        Target::Machine { namespace: ns, .. } => ns == namespace,
    })
}

/// The Nodes of the local cluster among `about` (all a NodeHealthCheck can hold).
pub fn local_nodes(about: &BTreeSet<Target>) -> BTreeSet<&str> {
    about
        .iter()
        .filter_map(|t| match t {
            Target::Node { cluster, name } if cluster == LOCAL_CLUSTER => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// The other checks' claims derived now for a confirming decision: the targets it is about, and
/// for each check that can hold one of them, its claims about them.
pub struct Fresh<'a> {
    /// The targets being confirmed.
    pub about: &'a BTreeSet<Target>,
    /// Each re-derived check's claims about `about` (a check absent here keeps its cached claims).
    pub claims: BTreeMap<CheckRef, Vec<Claim>>,
}

impl<'a> Fresh<'a> {
    /// Nothing re-derived yet about `about`.
    pub fn about(about: &'a BTreeSet<Target>) -> Self {
        Fresh { about, claims: BTreeMap::new() }
    }

    /// Records `check`'s claims derived now (all of them, or those found within the scope): only
    /// those about the confirmed targets are kept.
    pub fn insert(&mut self, check: CheckRef, claims: Vec<Claim>) {
        let about = self.about;
        self.claims.insert(check, claims.into_iter().filter(|c| about.contains(&c.target)).collect());
    }
}

/// Who holds which target for deciding `me`: `own` (its claims derived now), and the other
/// checks' `cached` claims (as after their last decision; `me`'s own among them are ignored);
/// with `fresh`, a re-derived check's claims about the confirmed targets replace its cached ones
/// about them, and its cached claims about anything else stand. A check that was not re-derived
/// keeps every cached claim (when unsure, wait). Without `me`, `own` is every check's claims,
/// derived now. The holder of a target depends only on the claims about it, so an adapter may
/// pass only the claims about the targets it will ask about.
pub fn holders<'c>(
    me: Option<&CheckRef>,
    own: Vec<Claim>,
    cached: impl IntoIterator<Item = &'c Claim>,
    fresh: Option<&Fresh<'_>>,
) -> Holders {
    let mut claims = own;
    let others = cached.into_iter().filter(|c| Some(&c.check) != me);
    let Some(fresh) = fresh else {
        claims.extend(others.cloned());
        return Holders::from_claims(claims);
    };
    claims.extend(fresh.claims.iter().filter(|(k, _)| Some(*k) != me).flat_map(|(_, c)| c.iter().cloned()));
    claims
        .extend(others.filter(|c| !(fresh.claims.contains_key(&c.check) && fresh.about.contains(&c.target))).cloned());
    Holders::from_claims(claims)
}
