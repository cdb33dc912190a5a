//! The check-wide short-circuit (`maxUnhealthy`, `unhealthyRange`) and the pause rule: whether
//! remediation may start at all.

use super::input::MhcInput;
use vigil_api::threshold::Rounding;
use vigil_api::validate::MhcShortCircuit;
use vigil_api::well_known::*;

/// Whether remediation is allowed with `unhealthy` of `total` targets not healthy, and how many
/// more remediations the budget leaves (rule 3: `unhealthyRange` wins; a percentage rounds down).
pub fn remediation_budget(
    short_circuit: MhcShortCircuit,
    total: usize,
    unhealthy: usize,
) -> (bool, u64, (&'static str, String)) {
    let unhealthy = unhealthy as u64;
    match short_circuit {
        MhcShortCircuit::Range(range) => {
            let allowed = range.contains(unhealthy);
            let left = if allowed { u64::from(range.max) - unhealthy } else { 0 };
            // upstream's wording, for a count below the range as for one above it
            (allowed, left, ("does not fall within the range", format!("unhealthyRange: {range}")))
        }
        MhcShortCircuit::MaxUnhealthy(max) => {
            let limit = max.scaled(total, Rounding::Down);
            let allowed = unhealthy <= limit;
            (allowed, limit.saturating_sub(unhealthy), ("exceeds maxUnhealthy", format!("maxUnhealthy: {max}")))
        }
    }
}

pub(super) fn check_paused(input: &MhcInput<'_>) -> bool {
    input.check.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
        || input.cluster.is_some_and(|c| c.paused)
}
