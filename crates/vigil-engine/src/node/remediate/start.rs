//! Requesting the first step of a Node's remediation, through every rule a new remediation
//! passes: other checks, the check's budget and pause, the cluster upgrade, planned maintenance,
//! failure domains, one control-plane Node at a time, the Node's Lease, the back-off and pacing.

use super::{Incident, Pass, Requested};
use crate::backoff;
use crate::node::judge::node_domain;
use crate::node::objects::Book;
use crate::node::templates::Usable;
use crate::plan::{Notice, NoticeKind};
use crate::target::{Target, is_control_plane};
use jiff::Timestamp;
use vigil_api::reason::Reason;
use vigil_api::views::NodeView;

impl Pass<'_> {
    /// A selected, unhealthy, not excluded Node without objects, unhealthy since `since`: start
    /// the incident's remediation if allowed.
    pub(super) fn start(
        &mut self,
        name: &str,
        node: &NodeView,
        listed_before: bool,
        book: &mut Book<'_>,
        incident: &Incident<'_>,
        since: Timestamp,
    ) {
        let Some(first) = incident.ladder.steps.first() else {
            return;
        };
        let news = !listed_before || self.setting.newly_open;
        if self.held_by_another_check(name) {
            return;
        }
        if book.has_in_flight(first) {
            self.complete_request(name, node, book, incident);
            return;
        }
        if self.starts_nothing_new(node) {
            return;
        }
        if let Usable::Missing | Usable::Invalid(_) =
            self.setting.templates.get(incident.ladder.offset).copied().unwrap_or(Usable::Missing)
        {
            let requested = self.request(node, 0, book, incident, None);
            let told = news || self.setting.disabled_changed;
            self.tell_skipped(name, requested, |_| told);
            return;
        }
        self.start_new(name, node, news, book, incident, since);
    }

    /// One check remediates a Node at a time: a Node another check holds waits (said when the
    /// wait is news), even for a request of an earlier plan (the other check started first).
    fn held_by_another_check(&mut self, name: &str) -> bool {
        let target = Target::local_node(name);
        self.overlap.held_elsewhere(target.clone(), &target, &mut self.out)
    }

    /// Completes an earlier plan's request for the first step. Not a new remediation, but its
    /// object is made only while the Node's Lease can be held.
    fn complete_request(&mut self, name: &str, node: &NodeView, book: &mut Book<'_>, incident: &Incident<'_>) {
        let Some(lease) = self.lease_for(name, node, &incident.ladder, 0) else { return };
        let requested = self.request(node, 0, book, incident, lease);
        let disabled_changed = self.setting.disabled_changed;
        // (the request's record is dropped with an existing foreign object: said once)
        self.tell_skipped(name, requested, |reason| disabled_changed || *reason == Reason::RemediationObjectExists);
    }

    /// Whether no new remediation may start on `node` now: the check paused or short-circuited,
    /// the cluster upgrading, the Node under planned maintenance, or its failure domain paused.
    fn starts_nothing_new(&self, node: &NodeView) -> bool {
        if self.setting.paused || !self.setting.allowed || self.gates.upgrade.is_some() || self.waiting.now.is_some() {
            return true;
        }
        self.setting.domain_label.is_some_and(|key| self.features.domain_paused(node_domain(node, key)))
    }

    /// Starts a new remediation of `name` through its last gates: one control-plane Node at a
    /// time, the Node's Lease (another holder's, the node maintenance operator's, keeps it
    /// waiting), the pool's back-off, then a free pacing slot (else it joins the queue).
    fn start_new(
        &mut self,
        name: &str,
        node: &NodeView,
        news: bool,
        book: &mut Book<'_>,
        incident: &Incident<'_>,
        since: Timestamp,
    ) {
        let cp = is_control_plane(node);
        if cp && self.control_plane_busy(name, news) {
            return;
        }
        let Some(lease) = self.lease_for(name, node, &incident.ladder, 0) else { return };
        let pool = self
            .cx
            .policy
            .backoff
            .as_ref()
            .map_or_else(String::new, |b| backoff::node_pool(node, b.pool_label.as_deref().unwrap_or_default()));
        let repeat = self.cx.policy.dry_run && self.setting.would_before.iter().any(|w| w.name == name);
        let Some(admitted) = self.features.admit(pool, name, repeat, since, false) else { return };
        match self.request(node, 0, book, incident, lease) {
            Requested::Done => {
                self.features.start(admitted);
                if cp {
                    self.control_planes.taken = true;
                }
            }
            skipped @ Requested::Skipped(..) => self.tell_skipped(name, skipped, |_| news),
            Requested::Held => {}
        }
    }

    /// At most one control-plane Node is remediated at a time: whether another one is (told
    /// when it is news).
    fn control_plane_busy(&mut self, name: &str, news: bool) -> bool {
        if !self.control_planes.taken && self.control_planes.busy.iter().all(|n| *n == name) {
            return false;
        }
        if news {
            let message = match self.control_planes.busy.iter().find(|n| **n != name) {
                Some(other) => {
                    format!("Not remediating control-plane node {name}: control-plane node {other} is being remediated")
                }
                None => {
                    format!("Not remediating control-plane node {name}: another control-plane node is being remediated")
                }
            };
            self.out.tell(Notice::about_node(
                NoticeKind::RemediationSkipped,
                name,
                Reason::ControlPlaneRemediationInProgress,
                message,
            ));
        }
        true
    }
}
