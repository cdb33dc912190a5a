//! Escalating a Node's remediation: judging its latest step (failed, timed out, or holding the
//! Node's Lease past its overdue instant), giving up on it, and requesting the next step.

use super::{Incident, Pass};
use crate::node::gates::Tend;
use crate::node::objects::{Book, Owned, object_ref, step_of};
use crate::node_lease;
use crate::plan::{Action, Notice, NoticeKind, ONE_NS, Seen, after};
use crate::target::{Target, entry};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::conditions::{self, ConditionStatus};
use vigil_api::duration::format_go_duration;
use vigil_api::reason::Reason;
use vigil_api::validate::Ladder;
use vigil_api::views::{NodeView, RemediationView};
use vigil_api::well_known::{NHC_TIMED_OUT_ANNOTATION, SUCCEEDED};

/// Why a remediation step is given up.
#[derive(Debug, Clone, Copy)]
enum GaveUp {
    /// Its object reports `Succeeded=False`.
    Failed,
    /// Its timeout passed.
    TimedOut,
    /// The Node's Lease was held past its overdue instant (three step durations and the earlier
    /// steps' after it was taken): this long.
    LeaseOverdue(jiff::SignedDuration),
}

impl Pass<'_> {
    /// A selected, unhealthy, not excluded Node with objects: give up on its latest step when
    /// it timed out or failed and go on with the next one.
    ///
    /// This runs whatever the threshold, storm cooldown or pause requests say: it only moves an
    /// already-remediated Node along (medik8s does the same), and stopping half-way would leave
    /// a Node with a remediator that has already given up.
    pub(super) fn escalate(
        &mut self,
        name: &str,
        node: &NodeView,
        objs: &[Owned<'_>],
        book: &mut Book<'_>,
        incident: &Incident<'_>,
    ) {
        let steps = incident.ladder.steps;
        let step_of_obj: Vec<Option<usize>> = objs.iter().map(|o| step_of(o.view, o.template, steps)).collect();
        let Some(latest) = step_of_obj.iter().flatten().copied().max() else {
            return;
        };
        let Some(k) = (0..objs.len()).position(|k| step_of_obj[k] == Some(latest) && !objs[k].view.meta.deleting)
        else {
            return; // the latest step's objects are being deleted: wait until they are gone
        };
        let view = objs[k].view;
        let annotated = entry(&view.meta.annotations, NHC_TIMED_OUT_ANNOTATION).is_some();
        let next = latest + 1;
        let mut gave_up_now = false;
        if !annotated {
            if let Some(Time(at)) = book.records[k].timed_out.clone() {
                // An earlier plan gave up but the annotation did not make it: written again
                // (never on an object that reports Succeeded=True, as when giving up).
                if !conditions::is_true(&view.conditions, SUCCEEDED) {
                    self.out.act(Action::AnnotateRemediation {
                        object: object_ref(view),
                        target: Target::local_node(name),
                        key: NHC_TIMED_OUT_ANNOTATION.into(),
                        value: at.to_string(),
                        seen: Seen::of(&view.meta),
                    });
                }
            } else {
                let started = book.records[k].started.0;
                let Some(why) = self.judge_step(name, node, (view, started), latest, &incident.ladder) else {
                    return;
                };
                gave_up_now = true;
                book.records[k].timed_out = Some(Time(self.cx.now));
                self.give_up(name, view, latest, why, &incident.ladder);
            }
        }
        if next >= steps.len() {
            if gave_up_now || !book.prev_timed_out.get(k) {
                self.out.tell(Notice::about_node(
                    NoticeKind::NoTemplateLeft,
                    name,
                    Reason::NoTemplateLeft,
                    format!(
                        "Every remediation step for node {name} timed out or failed ({} step(s)); no remediation template left to try",
                        steps.len()
                    ),
                ));
            }
            return;
        }
        // The next step is a new remediation: it waits for an upgrade, planned maintenance and
        // another holder's Lease as a first step does.
        if self.gates.upgrade.is_some() || self.waiting.now.is_some() {
            return;
        }
        let Some(lease) = self.lease_for(name, node, &incident.ladder, next) else { return };
        let requested = self.request(node, next, book, incident, lease);
        let told = gave_up_now || self.setting.disabled_changed;
        self.tell_skipped(name, requested, |_| told);
    }

    /// Whether step `latest` of `node`'s remediation, whose object `view` was requested at
    /// `started`, is given up now: `Succeeded=False` at once, its timeout passed, or the Node's
    /// Lease held past its overdue instant (released). Otherwise the Lease is renewed when due and
    /// the decision wakes at the step's timeout.
    fn judge_step(
        &mut self,
        name: &str,
        node: &NodeView,
        (view, started): (&RemediationView, Timestamp),
        latest: usize,
        ladder: &Ladder<'_>,
    ) -> Option<GaveUp> {
        let step = ladder.steps.get(latest)?;
        let failed = conditions::find(&view.conditions, SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
        let deadline = step.timeout.and_then(|d| after(started, d));
        let timed_out = deadline.is_some_and(|d| d < self.cx.now);
        // The Node's Lease, while the step runs: renewed, or given up as overdue.
        let (current, previous) = node_lease::step_durations(ladder, latest);
        let tend = match failed || timed_out {
            true => Tend::Nothing,
            false => self.gates.tend(Some(node), name, current, previous, self.out.wake()),
        };
        match (failed, timed_out, tend) {
            (true, _, _) => Some(GaveUp::Failed),
            (_, true, _) => Some(GaveUp::TimedOut),
            (_, _, Tend::Overdue(release)) => {
                self.out.act(release);
                Some(GaveUp::LeaseOverdue(current.checked_mul(3).unwrap_or(current) + previous))
            }
            (_, _, tend) => {
                if let Tend::Renew(lease) = tend {
                    self.out.act(Action::WriteLease(lease));
                }
                if let Some(t) = deadline.and_then(|d| after(d, ONE_NS)) {
                    self.out.wake_at(t);
                }
                None
            }
        }
    }

    /// Gives up on step `latest` of Node `name` (its object `view` failed or timed out): the
    /// `nhc-timed-out` annotation, and a notice saying what comes next.
    fn give_up(&mut self, name: &str, view: &RemediationView, latest: usize, why: GaveUp, ladder: &Ladder<'_>) {
        let Some(step) = ladder.steps.get(latest) else {
            return;
        };
        // An object that reports Succeeded=True is never annotated as timed out (medik8s).
        if !conditions::is_true(&view.conditions, SUCCEEDED) {
            self.out.act(Action::AnnotateRemediation {
                object: object_ref(view),
                target: Target::local_node(name),
                key: NHC_TIMED_OUT_ANNOTATION.into(),
                value: self.cx.now.to_string(),
                seen: Seen::of(&view.meta),
            });
        }
        let what = match why {
            GaveUp::Failed => "reported Succeeded=False".to_string(),
            GaveUp::TimedOut => {
                format!("did not succeed within {}", format_go_duration(step.timeout.unwrap_or_default()))
            }
            GaveUp::LeaseOverdue(span) => format!(
                "held the Node's Lease past its overdue time ({} after it was taken); the Lease is released",
                format_go_duration(span)
            ),
        };
        let then = if latest + 1 < ladder.steps.len() {
            format!("escalating to {}", Self::step_label(ladder, latest + 1))
        } else {
            "no remediation template left".to_string()
        };
        self.out.tell(Notice::about_node(
            NoticeKind::RemediationTimedOut,
            name,
            match why {
                GaveUp::Failed => Reason::RemediationFailed,
                GaveUp::TimedOut => Reason::RemediationTimedOut,
                GaveUp::LeaseOverdue(_) => Reason::NodeLeaseOverdue,
            },
            format!(
                "{} {}/{} for node {name} (template {}) {what}; {then}",
                view.meta.kind, view.meta.namespace, view.meta.name, step.template.name
            ),
        ));
    }
}
