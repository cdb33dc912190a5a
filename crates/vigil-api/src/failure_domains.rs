//! Failure-domain budgets (`spec.failureDomains`, opt-in on both check kinds): a separate
//! unhealthy budget per domain (a zone, a rack), so a domain-wide outage pauses remediation in
//! that domain only while single failures elsewhere are still repaired.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most entries of `status.failureDomains`: paused domains first, then the most unhealthy, so
/// a status never grows with the number of domains.
pub const STATUS_MAX_DOMAINS: usize = 100;

/// How targets are grouped into failure domains and how many of each domain may be unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomains {
    /// The Node label whose value names a target's domain, e.g. `topology.kubernetes.io/zone`;
    /// on a MachineHealthCheck also `spec.failureDomain` (the Machine's own field). Targets
    /// without it are in no domain and governed by the check-wide budget only.
    #[schemars(transform = crate::schema::failure_domain_key)]
    pub key: String,
    /// Remediation stops in a domain with more than this many (or this percentage of its)
    /// targets not healthy; rounded as the check's own `maxUnhealthy`.
    #[schemars(transform = crate::schema::threshold)]
    pub max_unhealthy: IntOrString,
    /// A domain may always have this many unhealthy targets remediated, whatever the
    /// percentage says (small domains: one dead Node in a 2-Node zone is not an outage).
    /// Default 1.
    #[schemars(transform = crate::schema::min_allowed)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_allowed: Option<i32>,
}

/// One failure domain as the check last counted it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomainStatus {
    /// The domain: the key's value.
    pub name: String,
    /// Targets of the check in this domain.
    pub targets: i32,
    /// Of those, how many are not healthy.
    pub unhealthy: i32,
    /// How many may be unhealthy before remediation pauses in this domain.
    pub allowed: i32,
    /// True while no new remediation starts in this domain.
    pub paused: bool,
}
