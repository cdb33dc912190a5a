//! medik8s' node Leases: before a NodeHealthCheck remediates a Node it takes the Node's
//! `coordination.k8s.io` Lease (`node-<name>` in the lease namespace, holder
//! `NodeHealthCheck-<check>`), and anyone else who works on Nodes takes the same Lease first (the
//! node maintenance operator, as `node-maintenance`, before it drains one). While another holder
//! has it, the Node is not remediated; a Lease held by the check is renewed while its remediation
//! runs, given up as overdue after three step timeouts (plus the earlier steps') from its acquire
//! time, and released when the Node needs nothing any more.
//!
//! The rules are the medik8s/common lease manager's and the NodeHealthCheck operator's, with one
//! deliberate difference: another holder's Lease whose `renewTime` lies in the future counts as
//! held (upstream takes it over), so a clock a little ahead on the other side never hands Vigil a
//! Node an administrator is working on (docs/DECISIONS.md).

use crate::plan::LeaseWrite;
use jiff::{SignedDuration, Timestamp};
use vigil_api::validate::{Ladder, RemediationStep};
use vigil_api::views::{LeaseView, NodeView};

/// How much longer than the current step a Lease is taken for, so it does not run out between
/// two renewals (upstream's `LeaseBuffer`).
pub const LEASE_BUFFER: SignedDuration = SignedDuration::from_mins(1);
/// The step duration of a remediation without escalation (upstream's
/// `DefaultRemediationDuration`): its Lease is given up as overdue after three of them.
pub const DEFAULT_REMEDIATION_DURATION: SignedDuration = SignedDuration::from_mins(10);
/// How many step durations after its acquire time a Lease is overdue (upstream extends a Lease
/// at most twice, plus the first period).
const OVERDUE_STEPS: i32 = 3;

/// The holder identity of a NodeHealthCheck's Leases.
pub fn holder_of(check_name: &str) -> String {
    format!("NodeHealthCheck-{check_name}")
}

/// The name of a Node's Lease (medik8s: the kind and the name, lower-cased).
pub fn lease_name(node: &str) -> String {
    format!("node-{node}").to_lowercase()
}

/// How long step `s` of `ladder` may run (its timeout, else [`DEFAULT_REMEDIATION_DURATION`]),
/// and how long the steps before it could run together: the Lease's period and the offset of
/// its overdue instant.
pub fn step_durations(ladder: &Ladder<'_>, s: usize) -> (SignedDuration, SignedDuration) {
    let current = ladder.steps.get(s).and_then(|st| st.timeout).unwrap_or(DEFAULT_REMEDIATION_DURATION);
    let previous = ladder.steps.iter().take(s).filter_map(|st: &RemediationStep| st.timeout).sum();
    (current, previous)
}

/// Who holds a Node's Lease at an instant, as a holder `me` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStanding<'a> {
    /// Nobody holds it: there is none, it ran out, or it names no holder.
    Free(Option<&'a LeaseView>),
    /// `me` holds it until `expires` (`None`: its period cannot be read, so it must be renewed).
    Mine {
        /// The Lease.
        lease: &'a LeaseView,
        /// When it runs out.
        expires: Option<Timestamp>,
    },
    /// Someone else holds it, until `until` (`None`: for as long as its fields cannot be read).
    Theirs {
        /// Its holder identity.
        holder: String,
        /// When it runs out.
        until: Option<Timestamp>,
    },
}

/// When a Lease runs out: `renewTime + leaseDurationSeconds` (`None` when either is missing).
pub fn expiry(lease: &LeaseView) -> Option<Timestamp> {
    let renew = lease.renew_time?;
    let seconds = lease.duration_seconds?;
    renew.checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// Who holds `lease` at `now`, for holder `me`.
pub fn standing<'a>(lease: Option<&'a LeaseView>, me: &str, now: Timestamp) -> LeaseStanding<'a> {
    let Some(lease) = lease else { return LeaseStanding::Free(None) };
    let holder = lease.holder.as_deref().unwrap_or("");
    if holder == me {
        return LeaseStanding::Mine { lease, expires: expiry(lease) };
    }
    if holder.is_empty() {
        return LeaseStanding::Free(Some(lease));
    }
    if !lease.problems.is_empty() {
        // Half-read: whoever holds it keeps it.
        return LeaseStanding::Theirs { holder: holder.to_string(), until: None };
    }
    match expiry(lease) {
        Some(until) if until >= now => LeaseStanding::Theirs { holder: holder.to_string(), until: Some(until) },
        // No period, or it ran out: nobody holds it (upstream takes such a Lease over).
        _ => LeaseStanding::Free(Some(lease)),
    }
}

/// When a Lease held for step `s` is overdue: three step durations after it was acquired, plus
/// the steps before (`None` without an acquire time).
pub fn overdue_at(lease: &LeaseView, current: SignedDuration, previous: SignedDuration) -> Option<Timestamp> {
    let span = current.checked_mul(OVERDUE_STEPS)?.checked_add(previous)?;
    lease.acquire_time?.checked_add(span).ok()
}

/// When a Lease held while a remediation runs must be renewed: [`LEASE_BUFFER`] before it runs
/// out (`None`: at once). Upstream renews whenever less than a step is left, so every minute;
/// renewing a buffer before the end keeps the Lease held just as surely with one write per
/// step instead of one a minute per remediated Node (docs/DECISIONS.md).
pub fn renew_at(lease: &LeaseView) -> Option<Timestamp> {
    expiry(lease).and_then(|e| e.checked_sub(LEASE_BUFFER).ok())
}

/// Where the Leases live and whose they are, for one check's decision.
#[derive(Debug, Clone, Copy)]
pub struct LeaseScope<'a> {
    /// The lease namespace (`medik8s-leases` unless configured).
    pub namespace: &'a str,
    /// This check's holder identity ([`holder_of`]).
    pub me: &'a str,
}

/// The write that gives `me` the Lease of `node` for `current` (plus [`LEASE_BUFFER`]) from
/// `now`: a new Lease, a free one taken over (a new acquire time, one more transition), or its
/// own renewed (the acquire time kept, as upstream: the overdue instant counts from the first).
pub fn take(
    scope: LeaseScope<'_>,
    node: &NodeView,
    lease: Option<&LeaseView>,
    current: SignedDuration,
    now: Timestamp,
) -> LeaseWrite {
    let now = to_micros(now);
    let duration_seconds = (current + LEASE_BUFFER).as_secs();
    let mine = lease.is_some_and(|l| l.holder.as_deref() == Some(scope.me));
    let (acquire_time, transitions) = match lease {
        None => (now, 0),
        Some(l) if mine => (l.acquire_time.unwrap_or(now), l.transitions.unwrap_or(0)),
        Some(l) => (now, l.transitions.unwrap_or(0).saturating_add(1)),
    };
    LeaseWrite {
        namespace: scope.namespace.to_string(),
        name: lease.map_or_else(|| lease_name(&node.name), |l| l.meta.name.clone()),
        holder: scope.me.to_string(),
        duration_seconds,
        acquire_time,
        renew_time: now,
        transitions,
        node: node.name.clone(),
        node_uid: node.uid.as_deref().map(str::to_string),
        resource_version: lease.and_then(|l| l.resource_version.clone()),
        uid: lease.and_then(|l| l.meta.uid.clone()),
    }
}

/// An instant as a Lease stores it (`MicroTime`): what is written is what is read back.
fn to_micros(t: Timestamp) -> Timestamp {
    let extra = t.subsec_nanosecond().rem_euclid(1_000);
    t.checked_sub(SignedDuration::from_nanos(i64::from(extra))).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_api::views::Meta;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn lease(holder: &str, renew: &str, seconds: i64) -> LeaseView {
        LeaseView {
            meta: Meta { name: "node-n1".into(), ..Default::default() },
            resource_version: Some("7".into()),
            holder: Some(holder.into()),
            duration_seconds: Some(seconds),
            acquire_time: Some(ts("2030-01-01T00:00:00Z")),
            renew_time: Some(ts(renew)),
            transitions: Some(2),
            problems: Vec::new(),
        }
    }

    #[test]
    fn who_holds_a_lease_when() {
        let now = ts("2030-01-01T00:10:00Z");
        let me = "NodeHealthCheck-workers";
        // (holder, renewTime, seconds) -> standing
        let theirs = lease("node-maintenance", "2030-01-01T00:05:00Z", 3600);
        assert_eq!(
            standing(Some(&theirs), me, now),
            LeaseStanding::Theirs { holder: "node-maintenance".into(), until: Some(ts("2030-01-01T01:05:00Z")) }
        );
        let ran_out = lease("node-maintenance", "2030-01-01T00:05:00Z", 60);
        assert_eq!(standing(Some(&ran_out), me, now), LeaseStanding::Free(Some(&ran_out)));
        let ahead = lease("node-maintenance", "2030-01-01T00:10:30Z", 60);
        assert!(
            matches!(standing(Some(&ahead), me, now), LeaseStanding::Theirs { .. }),
            "a renewal ahead of our clock holds"
        );
        let unheld = LeaseView { holder: None, ..theirs.clone() };
        assert_eq!(standing(Some(&unheld), me, now), LeaseStanding::Free(Some(&unheld)));
        let half_read = LeaseView { problems: vec!["spec.renewTime: …".into()], renew_time: None, ..theirs.clone() };
        assert_eq!(
            standing(Some(&half_read), me, now),
            LeaseStanding::Theirs { holder: "node-maintenance".into(), until: None }
        );
        let mine = lease(me, "2030-01-01T00:09:00Z", 660);
        assert_eq!(
            standing(Some(&mine), me, now),
            LeaseStanding::Mine { lease: &mine, expires: Some(ts("2030-01-01T00:20:00Z")) }
        );
        assert_eq!(standing(None, me, now), LeaseStanding::Free(None));
    }

    #[test]
    fn a_lease_is_overdue_after_three_step_durations_and_renewed_a_step_before_it_runs_out() {
        let l = lease("NodeHealthCheck-w", "2030-01-01T00:05:00Z", 360);
        let five = SignedDuration::from_mins(5);
        assert_eq!(overdue_at(&l, five, SignedDuration::ZERO), Some(ts("2030-01-01T00:15:00Z")));
        assert_eq!(overdue_at(&l, five, SignedDuration::from_mins(2)), Some(ts("2030-01-01T00:17:00Z")));
        assert_eq!(renew_at(&l), Some(ts("2030-01-01T00:10:00Z")));
    }

    #[test]
    fn taking_a_lease_keeps_its_own_acquire_time_and_counts_take_overs() {
        let scope = LeaseScope { namespace: "medik8s-leases", me: "NodeHealthCheck-w" };
        let node = NodeView { name: "N1".into(), uid: Some("nu".into()), ..Default::default() };
        let now = ts("2030-01-01T00:10:00.123456789Z");
        let ten = SignedDuration::from_mins(10);
        let new = take(scope, &node, None, ten, now);
        assert_eq!((new.name.as_str(), new.duration_seconds, new.transitions), ("node-n1", 660, 0));
        assert_eq!(
            (new.acquire_time, new.renew_time),
            (ts("2030-01-01T00:10:00.123456Z"), ts("2030-01-01T00:10:00.123456Z"))
        );
        assert_eq!((new.resource_version, new.node_uid.as_deref()), (None, Some("nu")));
        let foreign = lease("node-maintenance", "2030-01-01T00:01:00Z", 60);
        let taken = take(scope, &node, Some(&foreign), ten, now);
        assert_eq!((taken.transitions, taken.resource_version.as_deref()), (3, Some("7")));
        assert_eq!(taken.acquire_time, ts("2030-01-01T00:10:00.123456Z"));
        let own = lease("NodeHealthCheck-w", "2030-01-01T00:09:00Z", 660);
        let renewed = take(scope, &node, Some(&own), ten, now);
        assert_eq!((renewed.acquire_time, renewed.transitions), (ts("2030-01-01T00:00:00Z"), 2));
    }
}
