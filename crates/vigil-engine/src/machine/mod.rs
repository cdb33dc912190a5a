//! MachineHealthCheck rules (Cluster API semantics; the seeds' proposal and book page, and
//! upstream's `needsRemediation`). Deliberate differences from upstream, each tested:
//! one existing remediation object never stops the others; a missing template still marks the
//! Machine unhealthy and says why; healthy Machines under a template get `HealthCheckSucceeded=True`;
//! timers are kept while the short-circuit blocks; a percentage is never an error; and the next
//! wake-up is the exact instant a verdict can change (no 1 s padding, no rate limit).

mod budget;
mod decide;
mod input;
mod judge;
mod own_clock;
mod remediate;
mod status;

pub use crate::target::is_target;
pub use budget::remediation_budget;
pub use decide::{decide, decide_among, decide_among_peers};
pub use input::{MhcInput, NodeSource};
pub use judge::{Verdict, evaluate, stale_node_condition};
pub use remediate::remediation_object;
pub use status::refuse;
