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
        MhcPeers { ranked }
    }

    /// The check that writes `machine`'s conditions, when that is not `me`: the first-ranked check
    /// that selects it, looking only at checks ranked before `me` (so the oldest check pays
    /// nothing). `None` when `me` owns it (or `me` is not among the peers and nobody selects it).
    pub fn owner_other_than(&self, me: &CheckRef, machine: &MachineView) -> Option<&CheckRef> {
        for peer in &self.ranked {
            if peer.check == *me {
                return None;
            }
            let same_namespace =
                matches!(&peer.check, CheckRef::Machine { namespace, .. } if *namespace == machine.meta.namespace);
            if same_namespace && is_target(peer.policy, machine) {
                return Some(&peer.check);
            }
        }
        None
    }
}
