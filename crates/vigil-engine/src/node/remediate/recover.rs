//! Deleting the objects of Nodes that recovered (once the healthy delay allows) and of Nodes
//! that are gone or no longer selected.

use super::Pass;
use crate::node::objects::{Owned, object_ref};
use crate::plan::{Action, ONE_NS, Seen, after};
use crate::target::Target;
use jiff::Timestamp;
use vigil_api::conditions;
use vigil_api::node_health_check::UnhealthyNode;
use vigil_api::validate::HealthyDelay;
use vigil_api::views::NodeView;
use vigil_api::well_known::{MANUALLY_CONFIRMED_HEALTHY_ANNOTATION, PERMANENT_NODE_DELETION_EXPECTED, SUCCEEDED};

impl Pass<'_> {
    /// A selected Node that matches no rule but still has objects: remove them once the
    /// healthy delay allows. Returns `(conditionsHealthyTimestamp, healthyDelayed)`.
    pub(super) fn recover(
        &mut self,
        node: &NodeView,
        objs: &[Owned<'_>],
        prev: Option<&UnhealthyNode>,
    ) -> (Timestamp, bool) {
        let since = prev.and_then(|p| p.conditions_healthy_timestamp.as_ref()).map_or(self.cx.now, |t| t.0);
        let release = match self.cx.policy.healthy_delay {
            HealthyDelay::After(d) if d.is_zero() => true,
            HealthyDelay::After(d) => match after(since, d) {
                Some(end) if end < self.cx.now => true,
                Some(end) => {
                    if let Some(t) = after(end, ONE_NS) {
                        self.out.wake_at(t);
                    }
                    false
                }
                None => false,
            },
            HealthyDelay::UntilConfirmed => node.has_annotation(MANUALLY_CONFIRMED_HEALTHY_ANNOTATION),
        };
        if release {
            self.delete_all(objs, false);
        }
        (since, !release)
    }

    /// Deletes the objects that are not being deleted yet; with `spare_permanent`, keeps those
    /// whose remediator is deleting the Node on purpose and still working.
    pub(super) fn delete_all(&mut self, objs: &[Owned<'_>], spare_permanent: bool) {
        for o in objs.iter().filter(|o| !o.view.meta.deleting) {
            let c = &o.view.conditions;
            if spare_permanent
                && conditions::is_true(c, PERMANENT_NODE_DELETION_EXPECTED)
                && !conditions::is_true(c, SUCCEEDED)
            {
                continue;
            }
            self.out.act(Action::DeleteRemediation {
                object: object_ref(o.view),
                target: Target::local_node(o.node),
                seen: Seen::of(&o.view.meta),
            });
        }
    }
}
