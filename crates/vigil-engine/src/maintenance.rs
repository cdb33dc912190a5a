//! Planned maintenance: a Node an administrator is working on is not remediated while the
//! maintenance lasts, nor for a grace after it ends (`spec.plannedMaintenance`), so a reboot
//! for a kernel update or a drained host powered off is never answered with a reboot, a fence or
//! a delete. The signals adopted (docs/DECISIONS.md says why these):
//! - a medik8s `NodeMaintenance` naming the Node (`spec.nodeName`), whatever its phase: the node
//!   maintenance operator keeps the Node cordoned while it exists;
//! - the Node cordoned (`spec.unschedulable`) with the node maintenance operator's drain taint
//!   `medik8s.io/drain`;
//! - the Node cordoned with kured's `weave.works/kured-reboot-in-progress` annotation (kured with
//!   `--annotate-nodes`), which kured sets before it drains and removes once the Node is back.
//!
//! A cordon alone is not maintenance: `kubectl cordon` says nothing of why, and a Node cordoned
//! by a failing drain would then never be remediated. The node maintenance operator's own node
//! Lease is honoured whatever this rule says ([`crate::node_lease`]).

use crate::lookup::Observed;
use jiff::{SignedDuration, Timestamp};
use vigil_api::reason::Reason;
use vigil_api::views::{MaintenanceView, NodeView};
use vigil_api::well_known::{KURED_REBOOT_IN_PROGRESS_ANNOTATION, MEDIK8S_DRAIN_TAINT};

/// Why a Node counts as under maintenance now, for a person; `Err` when it cannot be told (the
/// `NodeMaintenance` objects cannot be read and the Node itself says nothing).
pub fn under_maintenance(
    node: &NodeView,
    maintenances: Observed<'_, &[&MaintenanceView]>,
) -> Result<Option<String>, String> {
    if let Observed::Known(list) = maintenances
        && let Some(m) = list.iter().find(|m| m.node_name.as_deref() == Some(node.name.as_str()))
    {
        let why = m.reason.as_deref().map_or_else(String::new, |r| format!(" (reason: {r})"));
        return Ok(Some(format!("NodeMaintenance {} puts it in maintenance{why}", m.meta.name)));
    }
    if node.unschedulable && node.has_taint(MEDIK8S_DRAIN_TAINT) {
        return Ok(Some(format!("it is cordoned and drained for maintenance (taint {MEDIK8S_DRAIN_TAINT})")));
    }
    if node.unschedulable
        && let Some(since) = node.annotation(KURED_REBOOT_IN_PROGRESS_ANNOTATION)
    {
        return Ok(Some(format!("kured cordoned it for a reboot ({KURED_REBOOT_IN_PROGRESS_ANNOTATION}: {since})")));
    }
    match maintenances {
        Observed::Unknown(why) => Err(format!("whether it is under maintenance cannot be read: {why}")),
        _ => Ok(None),
    }
}

/// Where a Node stands with planned maintenance at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaintenanceStanding {
    /// Nothing to wait for.
    Clear,
    /// Under maintenance (why); no end known.
    Ongoing(String),
    /// Cannot be told (why): nothing new starts.
    Unknown(String),
    /// The maintenance ended at `since`; the Node is left alone until `until`.
    Grace {
        /// When the end was first seen.
        since: Timestamp,
        /// The end of the grace.
        until: Timestamp,
    },
}

impl MaintenanceStanding {
    /// The status reason of a Node that waits.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            MaintenanceStanding::Clear => None,
            MaintenanceStanding::Ongoing(_) => Some(Reason::NodeUnderMaintenance),
            MaintenanceStanding::Unknown(_) => Some(Reason::MaintenanceUnknown),
            MaintenanceStanding::Grace { .. } => Some(Reason::MaintenanceGrace),
        }
    }
}

/// A Node's standing: under maintenance now, or within `grace` of its end. The end is when a
/// decision first saw the Node out of maintenance after one had seen it in (`before`: the
/// previous status' reason for the Node and since when), so the grace survives a restart.
pub fn standing(
    now_signal: Result<Option<String>, String>,
    before: Option<(&str, Timestamp, Option<Timestamp>)>,
    grace: SignedDuration,
    now: Timestamp,
) -> MaintenanceStanding {
    match now_signal {
        Ok(Some(why)) => MaintenanceStanding::Ongoing(why),
        Err(why) => MaintenanceStanding::Unknown(why),
        Ok(None) => {
            let ended = match before {
                Some((reason, _, _)) if Reason::read(reason) == Reason::NodeUnderMaintenance => Some(now),
                Some((reason, since, _)) if Reason::read(reason) == Reason::MaintenanceGrace => Some(since),
                _ => None,
            };
            match ended.and_then(|since| since.checked_add(grace).ok().map(|until| (since, until))) {
                Some((since, until)) if until > now => MaintenanceStanding::Grace { since, until },
                _ => MaintenanceStanding::Clear,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_api::views::Meta;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn the_signals_of_planned_maintenance() {
        let plain = NodeView { name: "n1".into(), ..Default::default() };
        let cordoned = NodeView { unschedulable: true, ..plain.clone() };
        let drained = cordoned.clone().with_spec(None, true, [MEDIK8S_DRAIN_TAINT]);
        let tainted_only = plain.clone().with_spec(None, false, [MEDIK8S_DRAIN_TAINT]);
        let mut kured = cordoned.clone();
        kured.annotations.insert(KURED_REBOOT_IN_PROGRESS_ANNOTATION.into(), "2030-01-01T00:00:00Z".into());
        let nm = MaintenanceView {
            meta: Meta { name: "nm-1".into(), ..Default::default() },
            node_name: Some("n1".into()),
            reason: Some("NIC replacement".into()),
        };
        let other = MaintenanceView { node_name: Some("n2".into()), ..nm.clone() };
        let none: &[&MaintenanceView] = &[];
        let known = Observed::Known(none);
        // (node, maintenances) -> under maintenance?
        type Row<'a> = (&'a NodeView, Observed<'a, &'a [&'a MaintenanceView]>, Result<bool, ()>);
        let table: [Row<'_>; 8] = [
            (&plain, known, Ok(false)),
            (&cordoned, known, Ok(false)),
            (&drained, known, Ok(true)),
            (&tainted_only, known, Ok(false)),
            (&kured, known, Ok(true)),
            (&plain, Observed::Known(&[&nm]), Ok(true)),
            (&plain, Observed::Known(&[&other]), Ok(false)),
            (&plain, Observed::Unknown("the watch failed"), Err(())),
        ];
        for (i, (node, ms, want)) in table.into_iter().enumerate() {
            let got = under_maintenance(node, ms).map(|s| s.is_some()).map_err(|_| ());
            assert_eq!(got, want, "row {i}");
        }
        assert_eq!(under_maintenance(&drained, Observed::Unknown("x")).map(|s| s.is_some()), Ok(true));
        let why = under_maintenance(&plain, Observed::Known(&[&nm])).expect("known").expect("in maintenance");
        assert_eq!(why, "NodeMaintenance nm-1 puts it in maintenance (reason: NIC replacement)");
    }

    #[test]
    fn the_grace_runs_from_the_first_decision_that_saw_the_end() {
        let now = ts("2030-01-01T01:00:00Z");
        let ten = SignedDuration::from_mins(10);
        let under = Some(("NodeUnderMaintenance", ts("2030-01-01T00:00:00Z"), None));
        assert_eq!(
            standing(Ok(None), under, ten, now),
            MaintenanceStanding::Grace { since: now, until: ts("2030-01-01T01:10:00Z") }
        );
        let grace = Some(("MaintenanceGrace", ts("2030-01-01T00:55:00Z"), None));
        assert_eq!(
            standing(Ok(None), grace, ten, now),
            MaintenanceStanding::Grace { since: ts("2030-01-01T00:55:00Z"), until: ts("2030-01-01T01:05:00Z") }
        );
        let over = Some(("MaintenanceGrace", ts("2030-01-01T00:50:00Z"), None));
        assert_eq!(standing(Ok(None), over, ten, now), MaintenanceStanding::Clear);
        assert_eq!(standing(Ok(None), None, ten, now), MaintenanceStanding::Clear, "never seen in maintenance");
        assert_eq!(standing(Ok(None), under, SignedDuration::ZERO, now), MaintenanceStanding::Clear, "no grace");
        assert_eq!(standing(Ok(Some("x".into())), grace, ten, now), MaintenanceStanding::Ongoing("x".into()));
        assert_eq!(standing(Err("y".into()), None, ten, now), MaintenanceStanding::Unknown("y".into()));
    }
}
