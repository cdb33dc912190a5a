//! Remediation back-off (`spec.backoff`): when the targets of one pool keep failing after
//! remediation (a bad image, a bad config), more remediation will not help. A pool that started
//! `maxRemediations` remediations within `window` starts no more until the oldest of them leaves
//! the window; its unhealthy targets wait, still counted unhealthy. The history of starts lives in
//! the check's status (`status.remediationHistory`), so the back-off survives a restart; it keeps
//! only what can still matter. Done in the engine so the simulator and the controller back off
//! the same way.
//!
//! A remediation counts when it starts: a Machine marked for its owner's remediation or given an
//! external remediation object; a Node's first remediation object of an incident (escalation steps
//! do not count again). The check-wide short-circuit (`maxUnhealthy` / `minHealthy`) is applied
//! first; the back-off then holds back single pools.

use crate::plan::{Earliest, Notice, NoticeKind};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use std::collections::BTreeMap;
use vigil_api::conditions::{DesiredCondition, get_condition};
use vigil_api::duration::format_go_duration;
use vigil_api::reason::Reason;
use vigil_api::shared::{BackedOffPool, RemediationRecord};
use vigil_api::validate::BackoffPolicy;
use vigil_api::views::MachineView;
use vigil_api::views::NodeView;
use vigil_api::well_known::DEPLOYMENT_NAME_LABEL;

/// Most records the history keeps in all. When it is full, no remediation starts in a pool
/// until a record leaves the window: a record dropped to make room could let a pool remediate
/// more than it may, so the history never drops one that still counts.
pub const HISTORY_CAP: usize = 200;
/// Type of the check condition that says which pools are backed off.
pub const CONDITION: &str = "RemediationBackoff";
/// Most targets named per pool in the status, and most pools or records named in a message.
const NAMED: usize = 10;

/// The pool of a Machine: its MachineDeployment (the `cluster.x-k8s.io/deployment-name` label),
/// else its controlling owner (a MachineSet, a KubeadmControlPlane, …), else the Machine itself.
pub fn machine_pool(machine: &MachineView) -> String {
    if let Some(deployment) = machine.meta.labels.get(DEPLOYMENT_NAME_LABEL).filter(|d| !d.is_empty()) {
        return format!("MachineDeployment/{deployment}");
    }
    match machine.meta.owners.iter().find(|o| o.controller && !o.kind.is_empty() && !o.name.is_empty()) {
        Some(owner) => format!("{}/{}", owner.kind, owner.name),
        None => format!("Machine/{}", machine.meta.name),
    }
}

/// The pool of a Node: `label=value` for the value of the pool label, else the Node itself.
pub fn node_pool(node: &NodeView, label: &str) -> String {
    match node.labels.get(label) {
        Some(value) => format!("{label}={value}"),
        None => format!("Node/{}", node.name),
    }
}

/// `t` rounded up to a whole second: status times are written in whole seconds, and a start
/// written earlier than it happened would leave the window early (more remediation, the unsafe
/// direction); written later, it only holds the pool back up to a second longer.
fn ceil_second(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() > 0 { Timestamp::from_second(t.as_second() + 1).unwrap_or(t) } else { t }
}

/// What the back-off says about starting a remediation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Start it, and [`Ledger::record`] it once it is started.
    Start,
    /// Start it; it was already counted (the same start, asked for again).
    Repeat,
    /// Do not start it: the pool is backed off.
    Wait,
}

/// A backed-off pool as the decision finds it.
struct PoolWait {
    resumes_at: Timestamp,
    started: usize,
    /// The history is full (not the pool's own limit).
    full: bool,
    targets: Vec<String>,
}

/// The history of one decision: the previous status' records still inside the window, the
/// starts of this decision, and the pools that had to wait.
pub(crate) struct Ledger<'p> {
    policy: Option<&'p BackoffPolicy>,
    dry_run: bool,
    now: Timestamp,
    history: Vec<RemediationRecord>,
    waiting: BTreeMap<String, PoolWait>,
}

impl<'p> Ledger<'p> {
    /// Reads the previous history: records inside `(now - window, …]` only, at most
    /// `maxRemediations` per pool (older ones never decide anything) and [`HISTORY_CAP`] in all,
    /// the newest kept (the engine never writes more, so only an edited status loses records
    /// here). A check not in dry-run ignores the records its dry-run made.
    pub(crate) fn new(
        policy: Option<&'p BackoffPolicy>,
        dry_run: bool,
        previous: &[RemediationRecord],
        now: Timestamp,
    ) -> Self {
        let mut history = Vec::new();
        if let Some(p) = policy {
            let from = now.checked_sub(p.window).unwrap_or(Timestamp::MIN);
            let mut kept: Vec<&RemediationRecord> =
                previous.iter().filter(|r| r.started.0 > from && (dry_run || !r.dry_run)).collect();
            kept.sort_by(|a, b| {
                b.started.0.cmp(&a.started.0).then_with(|| (&a.pool, &a.target).cmp(&(&b.pool, &b.target)))
            });
            let mut per_pool: BTreeMap<&str, u32> = BTreeMap::new();
            for r in kept {
                let n = per_pool.entry(r.pool.as_str()).or_default();
                if *n < p.max_remediations && history.len() < HISTORY_CAP {
                    *n += 1;
                    history.push(r.clone());
                }
            }
        }
        Ledger { policy, dry_run, now, history, waiting: BTreeMap::new() }
    }

    /// Whether `target` has a record inside the window.
    pub(crate) fn recorded(&self, target: &str) -> bool {
        self.history.iter().any(|r| r.target == target)
    }

    /// Whether a remediation of `target` in `pool` may start now; `repeat` says the caller knows
    /// it was already counted. A pool that may not start is remembered as backed off, with the
    /// instant it resumes: when its `maxRemediations`-th newest start leaves the window.
    pub(crate) fn gate(&mut self, pool: &str, target: &str, repeat: bool) -> Gate {
        let Some(policy) = self.policy else { return Gate::Start };
        if repeat {
            return Gate::Repeat;
        }
        let mut starts: Vec<Timestamp> = self.history.iter().filter(|r| r.pool == pool).map(|r| r.started.0).collect();
        starts.sort_unstable();
        let max = policy.max_remediations as usize;
        let oldest = if starts.len() >= max {
            Some((starts[starts.len() - max], false))
        } else if self.history.len() >= HISTORY_CAP {
            self.history.iter().map(|r| r.started.0).min().map(|t| (t, true))
        } else {
            None
        };
        let Some((oldest, full)) = oldest else { return Gate::Start };
        let resumes_at = oldest.checked_add(policy.window).unwrap_or(Timestamp::MAX);
        let w = self.waiting.entry(pool.to_string()).or_insert(PoolWait {
            resumes_at,
            started: starts.len(),
            full,
            targets: Vec::new(),
        });
        w.targets.push(target.to_string());
        Gate::Wait
    }

    /// Records a remediation that started now (after [`Gate::Start`]).
    pub(crate) fn record(&mut self, pool: &str, target: &str) {
        if self.policy.is_some() {
            self.history.push(RemediationRecord {
                pool: pool.to_string(),
                target: target.to_string(),
                started: Time(ceil_second(self.now)),
                dry_run: self.dry_run,
            });
        }
    }

    /// The history to keep (oldest first) and the backed-off pools (by name), offering the
    /// instant each pool resumes.
    pub(crate) fn finish(mut self, wake: &mut Earliest) -> (Vec<RemediationRecord>, Vec<BackedOffPool>) {
        self.history.sort_by(|a, b| (a.started.0, &a.pool, &a.target).cmp(&(b.started.0, &b.pool, &b.target)));
        let pools = self
            .waiting
            .into_iter()
            .map(|(pool, mut w)| {
                wake.offer(w.resumes_at);
                w.targets.sort();
                w.targets.dedup();
                let waiting_count = i32::try_from(w.targets.len()).unwrap_or(i32::MAX);
                w.targets.truncate(NAMED);
                BackedOffPool {
                    pool,
                    started: i32::try_from(w.started).unwrap_or(i32::MAX),
                    resumes_at: Time(w.resumes_at),
                    waiting: w.targets,
                    waiting_count,
                    history_full: w.full,
                }
            })
            .collect();
        (self.history, pools)
    }
}

/// One pool in words: its starts within the window (named, oldest first), who waits, and when it
/// resumes.
fn describe(pool: &BackedOffPool, history: &[RemediationRecord], policy: Option<&BackoffPolicy>) -> String {
    let window = policy.map_or_else(String::new, |p| format_go_duration(p.window));
    let max = policy.map_or(0, |p| p.max_remediations);
    let starts: Vec<&RemediationRecord> = history.iter().filter(|r| r.pool == pool.pool).collect();
    let mut named: Vec<String> =
        starts.iter().take(NAMED).map(|r| format!("{} at {}", r.target, r.started.0)).collect();
    if starts.len() > NAMED {
        named.push(format!("and {} more", starts.len() - NAMED));
    }
    let why = if pool.history_full {
        format!("the remediation history is full ({HISTORY_CAP} remediations within {window})")
    } else {
        format!("{} remediation(s) started within {window} (maxRemediations {max})", pool.started)
    };
    let mut waiting = pool.waiting.join(", ");
    if pool.waiting_count as usize > pool.waiting.len() {
        waiting.push_str(&format!(" and {} more", pool.waiting_count as usize - pool.waiting.len()));
    }
    format!(
        "pool {}: {why}: {}; waiting: {waiting}; remediation resumes at {}",
        pool.pool,
        if named.is_empty() { "none recorded".to_string() } else { named.join(", ") },
        pool.resumes_at.0
    )
}

/// The `RemediationBackoff` condition (True naming the backed-off pools; False once none is, if
/// it was ever set) and the notices of pools that backed off or resumed since the previous status.
pub(crate) fn report(
    previous_pools: &[BackedOffPool],
    previous_conditions: &[Condition],
    pools: &[BackedOffPool],
    history: &[RemediationRecord],
    policy: Option<&BackoffPolicy>,
) -> (Option<DesiredCondition>, Vec<Notice>) {
    let mut notices = Vec::new();
    for p in pools.iter().filter(|p| !previous_pools.iter().any(|q| q.pool == p.pool)) {
        notices.push(Notice {
            kind: NoticeKind::RemediationBackoff,
            target: None,
            reason: Reason::RemediationBackoff,
            message: format!("Remediation backed off in {}", describe(p, history, policy)),
        });
    }
    for p in previous_pools.iter().filter(|p| !pools.iter().any(|q| q.pool == p.pool)) {
        notices.push(Notice {
            kind: NoticeKind::RemediationBackoffEnded,
            target: None,
            reason: Reason::RemediationBackoffEnded,
            message: format!("Remediation of pool {} is no longer backed off: no target of it waits any more", p.pool),
        });
    }
    let condition = if pools.is_empty() {
        get_condition(previous_conditions, CONDITION)
            .map(|_| DesiredCondition::false_(CONDITION, Reason::NoPoolBackedOff, "No pool is backed off"))
    } else {
        let mut parts: Vec<String> = pools.iter().take(NAMED).map(|p| describe(p, history, policy)).collect();
        if pools.len() > NAMED {
            parts.push(format!("and {} more pools", pools.len() - NAMED));
        }
        Some(DesiredCondition::true_(
            CONDITION,
            Reason::RemediationBackoff,
            format!("Remediation backed off in {}", parts.join("; ")),
        ))
    };
    (condition, notices)
}
