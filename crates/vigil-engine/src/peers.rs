//! A Machine's health-check conditions are written by one MachineHealthCheck only.
//!
//! When several valid MachineHealthChecks select the same Machine (Cluster API calls this
//! unsupported, and its checks then overwrite each other's `HealthCheckSucceeded` forever), the
//! **owner** of the Machine's conditions is the selecting check created first (then the smaller
//! name), a check that acts always before one in dry-run. The others still evaluate the Machine (their status counts it) but write no condition
//! on it and do not remediate it; each says so with the condition
//! [`SELECTED_BY_ANOTHER_CHECK`] naming the owner and the Machines, and a notice when that changes.
//!
//! The order depends on the checks alone (creation time, identity), never on what they wrote, so
//! deciding the checks in any order settles. Usage: the adapter collects the valid checks of the
//! Machine's namespace ([`MhcPeer::of`]), builds [`MhcPeers::new`] and passes it to
//! [`crate::machine::decide_among_peers`] and [`crate::holders::mhc_claims_among`].

use crate::target::{CheckRef, is_target};
use jiff::Timestamp;
use std::collections::HashMap;
use vigil_api::MachineHealthCheck;
use vigil_api::reason::Reason;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::MachineView;

/// Condition on a check some of whose Machines another check owns.
pub const SELECTED_BY_ANOTHER_CHECK: &str = "MachinesSelectedByAnotherCheck";
/// Reason of [`SELECTED_BY_ANOTHER_CHECK`]`=True` and of its notice.
pub const REASON_OVERLAP: &str = Reason::OverlappingMachineHealthChecks.as_str();
/// Reason of [`SELECTED_BY_ANOTHER_CHECK`]`=False` (once it has been True).
pub const REASON_NO_OVERLAP: &str = Reason::NoOverlap.as_str();
/// At most this many Machines are named per owner in the condition's message.
pub const NAMED_MACHINES: usize = 10;

/// One valid MachineHealthCheck, as the ownership rule ranks it.
#[derive(Debug, Clone)]
pub struct MhcPeer<'a> {
    /// Its identity.
    pub check: CheckRef,
    /// `metadata.creationTimestamp` (`None` ranks last).
    pub created: Option<Timestamp>,
    /// Its validated spec (the selector is what matters).
    pub policy: &'a MhcPolicy,
}

impl<'a> MhcPeer<'a> {
    /// The peer of a check with its validated policy.
    pub fn of(check: &MachineHealthCheck, policy: &'a MhcPolicy) -> Self {
        MhcPeer {
            check: CheckRef::of_mhc(check),
            created: check.metadata.creation_timestamp.as_ref().map(|t| t.0),
            policy,
        }
    }
}

/// The valid MachineHealthChecks that may select the same Machines, ranked.
#[derive(Debug, Clone, Default)]
pub struct MhcPeers<'a> {
    ranked: Vec<MhcPeer<'a>>,
    /// Ranks ordered by their check's identity, to find a check's rank by binary search.
    by_check: Vec<usize>,
    /// Ranks (ascending) of the checks whose selector requires label `key = value`, each under
    /// the one of its required labels that the fewest checks share.
    by_label: HashMap<(&'a str, &'a str), Vec<usize>>,
    /// Ranks (ascending) of the checks whose selector requires no label value (looked at for
    /// every Machine).
    unindexed: Vec<usize>,
}

impl<'a> MhcPeers<'a> {
    /// No other check (each check owns the conditions of all its Machines).
    pub fn none() -> Self {
        Self::default()
    }

    /// Ranks the checks: checks that act before checks in dry-run (a shadow policy must never
    /// silence the live one it is tried next to), then created first, then by identity. Pass
    /// every valid MachineHealthCheck of the namespace (more does no harm: a check of another
    /// namespace selects none of its Machines).
    pub fn new(peers: impl IntoIterator<Item = MhcPeer<'a>>) -> Self {
        let mut ranked: Vec<MhcPeer<'a>> = peers.into_iter().collect();
        // Compared by reference (no key is cloned): a namespace of a hundred checks is ranked
        // for every decision and every claim derivation.
        let key = |p: &MhcPeer<'a>| (p.policy.dry_run, p.created.is_none(), p.created);
        ranked.sort_by(|a, b| key(a).cmp(&key(b)).then_with(|| a.check.cmp(&b.check)));
        ranked.dedup_by(|a, b| a.check == b.check);
        let mut by_check: Vec<usize> = (0..ranked.len()).collect();
        by_check.sort_by(|a, b| ranked[*a].check.cmp(&ranked[*b].check));
        // Each check is indexed under its rarest required label, so a Machine's lookups meet
        // few checks that then do not select it.
        let mut shared: HashMap<(&'a str, &'a str), usize> = HashMap::new();
        for peer in &ranked {
            for label in peer.policy.selector.required_labels() {
                *shared.entry(label).or_default() += 1;
            }
        }
        let mut by_label: HashMap<(&'a str, &'a str), Vec<usize>> = HashMap::new();
        let mut unindexed = Vec::new();
        for (rank, peer) in ranked.iter().enumerate() {
            match peer.policy.selector.required_labels().min_by_key(|l| shared.get(l).copied().unwrap_or(0)) {
                Some(label) => by_label.entry(label).or_default().push(rank),
                None => unindexed.push(rank),
            }
        }
        MhcPeers { ranked, by_check, by_label, unindexed }
    }

    /// The check that writes `machine`'s conditions, when that is not `me`: the first-ranked check
    /// that selects it, looking only at checks ranked before `me` (so the oldest check pays
    /// nothing). `None` when `me` owns it (or `me` is not among the peers and nobody selects it).
    /// Only the checks indexed under one of the Machine's labels, and those requiring none, are
    /// looked at: a check that selects the Machine requires only labels it carries.
    pub fn owner_other_than(&self, me: &CheckRef, machine: &MachineView) -> Option<&CheckRef> {
        let mine = self.rank_of(me).unwrap_or(self.ranked.len());
        let selects = |rank: usize| {
            let peer = &self.ranked[rank];
            let same_namespace =
                matches!(&peer.check, CheckRef::Machine { namespace, .. } if *namespace == machine.meta.namespace);
            same_namespace && is_target(peer.policy, machine)
        };
        let first_selecting =
            |ranks: &[usize], below: usize| ranks.iter().copied().take_while(|r| *r < below).find(|r| selects(*r));
        let mut owner = first_selecting(&self.unindexed, mine);
        if !self.by_label.is_empty() {
            for label in machine.meta.labels.iter() {
                if let Some(ranks) = self.by_label.get(&label)
                    && let Some(rank) = first_selecting(ranks, owner.unwrap_or(mine))
                {
                    owner = Some(rank);
                }
            }
        }
        owner.map(|rank| &self.ranked[rank].check)
    }

    /// `check`'s rank, if it is among the peers.
    fn rank_of(&self, check: &CheckRef) -> Option<usize> {
        self.by_check.binary_search_by(|r| self.ranked[*r].check.cmp(check)).ok().map(|i| self.by_check[i])
    }
}
