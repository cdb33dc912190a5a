//! NodeHealthCheck rules (medik8s semantics), as one pure function: [`decide`].
//!
//! The decision is made in two passes over the Nodes and the check's remediation objects, both
//! sorted by Node name (so the plan never depends on input or hash order):
//!
//! 1. judge every selected Node from its conditions and count the healthy ones (a Node whose
//!    remediation objects are still around is not healthy yet), which gives the threshold and
//!    storm-cooldown state;
//! 2. for every Node that is selected or still has objects, decide what to create, annotate
//!    and delete, and what its `status.unhealthyNodes` entry says.
//!
//! Notices are derived by comparing with the previous status only, so deciding twice on the same
//! input tells the operator nothing new the second time.
//!
//! Deliberate choices beyond medik8s (each also explained where it is made):
//! - counts stay true while paused;
//! - a status record without a `uid` for an object that is not seen yet is a creation requested
//!   by an earlier plan ("in flight"): it is completed (created again under the same name,
//!   idempotent) whatever the threshold, pause or control-plane rule says now, because the
//!   decision was already taken;
//! - no object gets a server-generated name: where upstream uses `generateName`
//!   (`multiple-templates-support`), the name is computed ([`several_per_node_name`]), so a create
//!   that is repeated or lands late is refused while the object exists (a `generateName` request
//!   recorded by an earlier version is still awaited until its step's timeout passed);
//! - the check is `Disabled` while any step's template is missing or invalid, so the operator
//!   learns it before a Node needs it, but steps whose templates are usable keep working;
//! - `NoDecision` for a Node whose matching condition has no `lastTransitionTime` is told when
//!   the status changes (no status field can remember such Nodes);
//! - escalation moves an already-remediated Node along even while the threshold blocks or a pause
//!   is requested;
//! - objects of Nodes that still exist but are no longer selected are removed like those of
//!   deleted Nodes: nothing else would ever clean them up.

mod budget;
mod decide;
mod gates;
mod input;
mod judge;
mod objects;
mod remediate;
mod status;
mod templates;

pub use crate::partial::forget_requests;
pub use budget::threshold_met;
pub use decide::{decide, decide_among};
pub use input::{Around, NhcInput, needs_node};
pub use judge::unhealthy_because;
pub use remediate::request::several_per_node_name;
pub use status::{refuse, wait};
