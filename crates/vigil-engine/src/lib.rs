//! Vigil's decision engine: `decide(observed state, policy, now) -> plan`.
//!
//! No I/O, no clock reads, no async: the controller and the simulator gather state, call
//! [`machine::decide`] or [`node::decide`], and apply the returned plan. Every health rule lives
//! here, once. A plan carries the exact instant its verdicts can next change
//! ([`plan::Plan::next_wake`]) so callers wake exactly then instead of polling.

pub mod assemble;
pub mod backoff;
pub mod chosen;
pub mod concerns;
pub mod cross_shard;
pub(crate) mod decision;
pub mod disruptions;
pub mod domains;
pub mod dry_run;
pub mod expiry;
pub mod expressions;
pub(crate) mod features;
pub mod flapping;
pub mod holders;
pub mod lookup;
pub mod machine;
pub mod machine_write;
pub mod maintenance;
pub mod node;
pub mod node_lease;
pub mod pacing;
pub mod partial;
pub mod peers;
pub mod plan;
pub mod selector_index;
pub mod shard;
pub mod stale;
pub mod target;
pub mod upgrade;

pub use lookup::Lookup;
pub use plan::{Action, Notice, NoticeKind, ObjectRef, Plan, Seen};
