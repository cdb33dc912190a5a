//! Failure-domain budgets (`spec.failureDomains`): a separate unhealthy budget per domain (a
//! zone, a rack). A domain whose not-healthy targets exceed its allowance is *paused*: no new
//! remediation starts for its targets, while remediations already started go on and the other
//! domains continue. The check-wide short-circuit is evaluated first and still stops everything.
//!
//! Both check kinds count here (`Tally`), judge here ([`allowance`], `Budgets`) and report here
//! (`Budgets::report`: `status.failureDomains`, the `FailureDomainsHealthy` condition and the
//! `FailureDomainShortCircuit` / `FailureDomainResumed` notices), so the rule exists once.

use crate::plan::{Notice, NoticeKind};
use std::collections::BTreeMap;
use vigil_api::conditions::DesiredCondition;
use vigil_api::failure_domains::{FailureDomainStatus, STATUS_MAX_DOMAINS};
use vigil_api::reason::Reason;
use vigil_api::threshold::Rounding;
use vigil_api::validate::FailureDomainPolicy;

/// Condition type on the check: True while no domain is paused.
pub const FAILURE_DOMAINS_HEALTHY: &str = "FailureDomainsHealthy";
/// Most paused domains a condition or notice names (the rest are counted).
const NAMED_DOMAINS: usize = 10;

/// How many targets of a domain of `targets` may be unhealthy: the percentage (or count) rounded
/// as the check's own threshold, and never fewer than `minAllowed` (the small-domain rule).
pub fn allowance(policy: &FailureDomainPolicy, targets: usize, rounding: Rounding) -> u64 {
    policy.max_unhealthy.scaled(targets, rounding).max(u64::from(policy.min_allowed))
}

/// Targets and not-healthy targets of one domain.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    targets: u64,
    unhealthy: u64,
}

/// Counts targets per domain while a decision walks them.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    domains: BTreeMap<String, Count>,
    /// Targets in no domain (no label, or a Machine without a Node).
    none: Count,
}

impl Tally {
    /// Counts one target of `domain` (`None`: in no domain).
    pub(crate) fn add(&mut self, domain: Option<&str>, healthy: bool) {
        let count = match domain {
            None => &mut self.none,
            Some(d) => match self.domains.get_mut(d) {
                Some(c) => c,
                None => self.domains.entry(d.to_string()).or_default(),
            },
        };
        count.targets += 1;
        count.unhealthy += u64::from(!healthy);
    }

    /// Each domain's allowance and whether it is paused.
    pub(crate) fn judge(self, policy: &FailureDomainPolicy, rounding: Rounding) -> Budgets {
        let domains = self
            .domains
            .into_iter()
            .map(|(name, c)| {
                let allowed = allowance(policy, usize::try_from(c.targets).unwrap_or(usize::MAX), rounding);
                (name, JudgedDomain { count: c, allowed, paused: c.unhealthy > allowed })
            })
            .collect();
        Budgets { key: policy.key.to_string(), domains, none: self.none }
    }
}

/// One domain's counts and verdict.
#[derive(Debug, Clone, Copy)]
struct JudgedDomain {
    count: Count,
    allowed: u64,
    paused: bool,
}

/// The verdict on every domain of one decision.
#[derive(Debug)]
pub(crate) struct Budgets {
    key: String,
    domains: BTreeMap<String, JudgedDomain>,
    none: Count,
}

/// What a check reports about its domains.
pub(crate) struct DomainReport {
    /// `status.failureDomains`.
    pub status: Vec<FailureDomainStatus>,
    /// `FailureDomainsHealthy`.
    pub condition: DesiredCondition,
    /// Transitions since the previous status.
    pub notices: Vec<Notice>,
}

fn int(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn phrase(name: &str, j: &JudgedDomain) -> String {
    format!("{name}: {} of {} unhealthy, {} allowed", j.count.unhealthy, j.count.targets, j.allowed)
}

/// `a; b; c and N more`.
fn named(phrases: &[String]) -> String {
    let mut text = phrases[..phrases.len().min(NAMED_DOMAINS)].join("; ");
    if phrases.len() > NAMED_DOMAINS {
        text.push_str(&format!("; and {} more", phrases.len() - NAMED_DOMAINS));
    }
    text
}

impl Budgets {
    /// Whether no new remediation may start for a target of `domain` (never for no domain).
    pub(crate) fn is_paused(&self, domain: Option<&str>) -> bool {
        domain.and_then(|d| self.domains.get(d)).is_some_and(|j| j.paused)
    }

    /// The bounded status list: paused domains first, then the most unhealthy, then by name;
    /// at most [`STATUS_MAX_DOMAINS`], sorted by name.
    fn status_list(&self) -> Vec<FailureDomainStatus> {
        let mut all: Vec<(&String, &JudgedDomain)> = self.domains.iter().collect();
        all.sort_by_key(|(name, j)| (!j.paused, std::cmp::Reverse(j.count.unhealthy), *name));
        all.truncate(STATUS_MAX_DOMAINS);
        all.sort_by(|a, b| a.0.cmp(b.0));
        all.into_iter()
            .map(|(name, j)| FailureDomainStatus {
                name: name.clone(),
                targets: int(j.count.targets),
                unhealthy: int(j.count.unhealthy),
                allowed: int(j.allowed),
                paused: j.paused,
            })
            .collect()
    }

    /// The status list, the condition and the notices of the transitions since `previous`
    /// (the previous `status.failureDomains`).
    pub(crate) fn report(&self, previous: &[FailureDomainStatus]) -> DomainReport {
        DomainReport { status: self.status_list(), condition: self.condition(), notices: self.transitions(previous) }
    }

    /// `FailureDomainsHealthy`: False naming each paused domain with its counts; both say how
    /// many domains there are and how many targets are in none.
    fn condition(&self) -> DesiredCondition {
        let paused: Vec<String> =
            self.domains.iter().filter(|(_, j)| j.paused).map(|(name, j)| phrase(name, j)).collect();
        let none = if self.none.targets == 0 {
            String::new()
        } else {
            format!(
                "; {} target(s) in no domain ({} unhealthy) are governed by the check-wide budget only",
                self.none.targets, self.none.unhealthy
            )
        };
        let domains = format!("{} domain(s) by {}", self.domains.len(), self.key);
        if paused.is_empty() {
            DesiredCondition::true_(
                FAILURE_DOMAINS_HEALTHY,
                Reason::WithinBudget,
                format!("Every failure domain is within its budget ({domains}{none})"),
            )
        } else {
            DesiredCondition::false_(
                FAILURE_DOMAINS_HEALTHY,
                Reason::FailureDomainShortCircuit,
                format!(
                    "No new remediation in {} paused failure domain(s): {}; other domains continue ({domains}{none})",
                    paused.len(),
                    named(&paused)
                ),
            )
        }
    }

    /// One `FailureDomainShortCircuit` naming every domain that paused since `previous`, one
    /// `FailureDomainResumed` naming every domain back within its budget (a domain that is gone
    /// is not told).
    fn transitions(&self, previous: &[FailureDomainStatus]) -> Vec<Notice> {
        // A previous list full of paused domains may have left some out: those are not news.
        let full = previous.len() >= STATUS_MAX_DOMAINS && previous.iter().all(|d| d.paused);
        let was_paused = |name: &str| previous.iter().any(|d| d.name == name && d.paused);
        let phrases = |pick: &dyn Fn(&str, &JudgedDomain) -> bool| -> Vec<String> {
            self.domains.iter().filter(|(name, j)| pick(name, j)).map(|(name, j)| phrase(name, j)).collect()
        };
        let newly = phrases(&|name, j| j.paused && !full && !was_paused(name));
        let resumed = phrases(&|name, j| !j.paused && was_paused(name));
        let mut notices = Vec::new();
        if !newly.is_empty() {
            notices.push(Notice {
                kind: NoticeKind::FailureDomainShortCircuit,
                target: None,
                reason: Reason::FailureDomainShortCircuit,
                message: format!(
                    "Remediation paused in failure domain(s) by {}: {}; other domains continue",
                    self.key,
                    named(&newly)
                ),
            });
        }
        if !resumed.is_empty() {
            notices.push(Notice {
                kind: NoticeKind::FailureDomainResumed,
                target: None,
                reason: Reason::FailureDomainResumed,
                message: format!(
                    "Remediation may start again in failure domain(s) by {}: {}",
                    self.key,
                    named(&resumed)
                ),
            });
        }
        notices
    }
}
