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

use crate::selector_index::SelectorIndex;
use crate::target::{CheckRef, is_target};
use jiff::Timestamp;
use std::borrow::Cow;
use std::sync::Arc;
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

/// The ranking of a set of valid MachineHealthChecks, without their policies: an adapter keeps
/// it while the checks do not change ([`KeptPeers`]), so a decision does not rank its whole
/// namespace again (with a thousand checks in one namespace, ranking was most of the work of
/// each Machine update).
#[derive(Debug, Clone, Default)]
pub struct PeerOrder {
    /// By rank: the check's identity.
    checks: Vec<CheckRef>,
    /// By rank: where the check was in the list it was ranked from.
    source: Vec<usize>,
    /// Ranks ordered by their check's identity, to find a check's rank by binary search.
    by_check: Vec<usize>,
    /// Ranks (ascending) by a label value the check's selector requires.
    selectors: SelectorIndex<usize>,
    /// The label keys of `selectors`, each with the first rank indexed under it, by that rank:
    /// a Machine's owner is looked for under these keys (few in a namespace) rather than under
    /// each of its labels, and not at all under a key whose first check ranks after the bound.
    keys: Vec<(String, usize)>,
}

impl PeerOrder {
    /// Ranks the checks: checks that act before checks in dry-run (a shadow policy must never
    /// silence the live one it is tried next to), then created first, then by identity. A check
    /// listed twice is ranked once.
    pub fn rank(peers: &[MhcPeer<'_>]) -> Self {
        let key = |p: &MhcPeer<'_>| (p.policy.dry_run, p.created.is_none(), p.created);
        let mut source: Vec<usize> = (0..peers.len()).collect();
        source.sort_by(|a, b| {
            let (a, b) = (&peers[*a], &peers[*b]);
            key(a).cmp(&key(b)).then_with(|| a.check.cmp(&b.check))
        });
        source.dedup_by(|a, b| peers[*a].check == peers[*b].check);
        let checks: Vec<CheckRef> = source.iter().map(|i| peers[*i].check.clone()).collect();
        let mut by_check: Vec<usize> = (0..checks.len()).collect();
        by_check.sort_by(|a, b| checks[*a].cmp(&checks[*b]));
        // Built in rank order, so each list of ranks is ascending.
        let selectors =
            SelectorIndex::build(source.iter().enumerate().map(|(rank, i)| (rank, Some(&peers[*i].policy.selector))));
        let mut keys: Vec<(String, usize)> = selectors
            .keys()
            .filter_map(|(key, mut lists)| {
                let first = lists.try_fold(usize::MAX, |first, ranks| Some(first.min(*ranks.first()?)));
                first.map(|first| (key.to_string(), first))
            })
            .collect();
        keys.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        PeerOrder { checks, source, by_check, selectors, keys }
    }

    /// `check`'s rank, if it is among the peers.
    fn rank_of(&self, check: &CheckRef) -> Option<usize> {
        self.by_check.binary_search_by(|r| self.checks[*r].cmp(check)).ok().map(|i| self.by_check[i])
    }
}

/// A namespace's ranking kept by an adapter with the policies it ranked, shared with the store
/// of checks: built when one of the namespace's checks changes, read by every decision.
#[derive(Debug, Clone, Default)]
pub struct KeptPeers {
    order: PeerOrder,
    /// By rank.
    policies: Vec<Arc<MhcPolicy>>,
}

impl KeptPeers {
    /// Ranks `checks` (every valid MachineHealthCheck of the namespace, with its policy).
    pub fn rank<'c>(checks: impl IntoIterator<Item = (&'c MachineHealthCheck, Arc<MhcPolicy>)>) -> Self {
        let (checks, shared): (Vec<&MachineHealthCheck>, Vec<Arc<MhcPolicy>>) = checks.into_iter().unzip();
        let peers: Vec<MhcPeer<'_>> = checks.iter().zip(&shared).map(|(c, p)| MhcPeer::of(c, p)).collect();
        let order = PeerOrder::rank(&peers);
        let policies = order.source.iter().map(|i| Arc::clone(&shared[*i])).collect();
        KeptPeers { order, policies }
    }

    /// How many checks are ranked.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Whether no check is ranked.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The ranking as decisions read it.
    pub fn peers(&self) -> MhcPeers<'_> {
        MhcPeers { order: Cow::Borrowed(&self.order), policies: Policies::Shared(&self.policies) }
    }
}

/// The policies of ranked checks, by rank.
#[derive(Debug, Clone)]
enum Policies<'a> {
    Borrowed(Vec<&'a MhcPolicy>),
    Shared(&'a [Arc<MhcPolicy>]),
}

impl Policies<'_> {
    fn get(&self, rank: usize) -> &MhcPolicy {
        match self {
            Policies::Borrowed(p) => p[rank],
            Policies::Shared(p) => &p[rank],
        }
    }
}

/// The valid MachineHealthChecks that may select the same Machines, ranked.
#[derive(Debug, Clone)]
pub struct MhcPeers<'a> {
    order: Cow<'a, PeerOrder>,
    policies: Policies<'a>,
}

impl Default for MhcPeers<'_> {
    fn default() -> Self {
        MhcPeers { order: Cow::Owned(PeerOrder::default()), policies: Policies::Borrowed(Vec::new()) }
    }
}

impl<'a> MhcPeers<'a> {
    /// No other check (each check owns the conditions of all its Machines).
    pub fn none() -> Self {
        Self::default()
    }

    /// Ranks the checks ([`PeerOrder::rank`]). Pass every valid MachineHealthCheck of the
    /// namespace (more does no harm: a check of another namespace selects none of its
    /// Machines). An adapter deciding many times between changes of the checks keeps
    /// [`KeptPeers`] instead.
    pub fn new(peers: impl IntoIterator<Item = MhcPeer<'a>>) -> Self {
        let peers: Vec<MhcPeer<'a>> = peers.into_iter().collect();
        let order = PeerOrder::rank(&peers);
        let policies = order.source.iter().map(|i| peers[*i].policy).collect();
        MhcPeers { order: Cow::Owned(order), policies: Policies::Borrowed(policies) }
    }

    /// The check that writes `machine`'s conditions, when that is not `me`
    /// ([`Owners::other_than_me`]). A decision asking for each of its Machines takes
    /// [`MhcPeers::owners_for`] once instead.
    pub fn owner_other_than(&self, me: &CheckRef, machine: &MachineView) -> Option<&CheckRef> {
        self.owners_for(me).other_than_me(machine)
    }

    /// Every ranked check that selects `machine`, in rank order: the checks that can claim it
    /// (a claim is on a check's own target). Only the checks indexed under one of its labels, and
    /// those requiring none, are looked at, so the cost follows the Machine's labels, not the
    /// number of checks.
    pub fn selecting(&self, machine: &MachineView) -> Vec<&CheckRef> {
        let order = self.order.as_ref();
        let mut ranks: Vec<usize> = order
            .selectors
            .candidates(machine.meta.labels.iter())
            .copied()
            .filter(|r| self.selects(*r, machine))
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.into_iter().map(|r| &order.checks[r]).collect()
    }

    /// Whether the check of `rank` selects `machine` (a check selects only its own namespace's).
    fn selects(&self, rank: usize, machine: &MachineView) -> bool {
        let same_namespace = matches!(&self.order.checks[rank], CheckRef::Machine { namespace, .. } if *namespace == machine.meta.namespace);
        same_namespace && is_target(self.policies.get(rank), machine)
    }

    /// The owner lookups of check `me`, its rank found once.
    pub fn owners_for(&self, me: &CheckRef) -> Owners<'_, 'a> {
        let order = self.order.as_ref();
        Owners { peers: self, mine: order.rank_of(me).unwrap_or(order.checks.len()) }
    }
}

/// One check's view of the ranking: who owns each of the Machines it evaluates.
#[derive(Debug, Clone, Copy)]
pub struct Owners<'p, 'a> {
    peers: &'p MhcPeers<'a>,
    /// The check's rank (the number of peers when it is not among them).
    mine: usize,
}

impl<'p> Owners<'p, '_> {
    /// The check that writes `machine`'s conditions, when that is not this one: the first-ranked
    /// check that selects it, looking only at checks ranked before this one (so the oldest check
    /// pays nothing). `None` when this check owns it (or is not among the peers and nobody
    /// selects it). Only the checks indexed under one of the Machine's labels, and those requiring
    /// none, are looked at: a check that selects the Machine requires only labels it carries.
    pub fn other_than_me(&self, machine: &MachineView) -> Option<&'p CheckRef> {
        let (peers, mine) = (self.peers, self.mine);
        if mine == 0 {
            // No check ranks before the first: it owns every Machine it selects.
            return None;
        }
        let order = peers.order.as_ref();
        let selects = |rank: usize| peers.selects(rank, machine);
        let first_selecting =
            |ranks: &[usize], below: usize| ranks.iter().copied().take_while(|r| *r < below).find(|r| selects(*r));
        let mut owner = first_selecting(order.selectors.unindexed(), mine);
        let labels = &machine.meta.labels;
        // The same lists either way: those under the Machine's value of each indexed key.
        if order.keys.len() <= labels.len() {
            for (key, first) in &order.keys {
                let below = owner.unwrap_or(mine);
                if *first >= below {
                    break; // keys are by first rank: no later one has a rank below either
                }
                let Some(value) = labels.get(key) else { continue };
                owner = first_selecting(order.selectors.under(key, value), below).or(owner);
            }
        } else {
            for (key, value) in labels.iter() {
                owner = first_selecting(order.selectors.under(key, value), owner.unwrap_or(mine)).or(owner);
            }
        }
        owner.map(|rank| &order.checks[rank])
    }
}
