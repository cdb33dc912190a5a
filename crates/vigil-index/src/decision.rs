//! One check's turn, as both adapters take it: decide on the cached claims ([`gather::job`]); for
//! a plan that remediates, decide again with the other checks' claims about its confirmed targets
//! derived anew and keep only the remediations of confirmed targets ([`confirmed_job`]); pace
//! the verdicts; and once the plan is applied, cache what the check now holds and say which other
//! checks must decide again ([`cache_claims`]). The controller confirms a target by reading it
//! again from the API server between the two decisions; the simulator's store is the truth, so
//! every target it decides on is confirmed.

use crate::claims;
use crate::gather::{self, Job};
use crate::index::{Index, WorkloadCluster, machine_cluster};
use jiff::Timestamp;
use std::collections::BTreeSet;
use vigil_engine::Action;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};

/// How many Machine verdicts one decision of a check writes besides its remediations. A cold
/// start's first decision of a 2 000-target check would otherwise hold the check for 2 000
/// writes, and a Machine whose timeout ran out meanwhile would wait for all of them
/// (docs/DECISIONS.md, "Verdicts paced, remediations first").
pub const VERDICTS_PER_RUN: usize = 100;

/// The targets a plan remediates ([`Action::remediates`]).
pub fn targets_of(job: &Job) -> BTreeSet<Target> {
    job.plan.actions.iter().filter_map(Action::remediates).collect()
}

/// The key under which a target the plan remediates is locked: the target as the indexes stand
/// for it now (a Machine is its Node when it references one, and a fresh read may change which),
/// so that a MachineHealthCheck and a NodeHealthCheck on one self-hosted Node lock the same key.
pub fn lock_target(idx: &Index, target: &Target) -> Target {
    let Target::Machine { namespace, name } = target else { return target.clone() };
    let Some(entry) = idx.machines.get(namespace).and_then(|m| m.get(name)) else { return target.clone() };
    let self_hosted = WorkloadCluster::of_machine(&entry.view).is_some_and(|w| idx.hosting.is_self_hosted(&w));
    let node_cluster = if self_hosted { LOCAL_CLUSTER.to_string() } else { machine_cluster(&entry.view) };
    Target::of_machine(&node_cluster, &entry.view)
}

/// What the confirming decision derives other checks' claims about: the confirmed targets, as
/// locked before the reads (`keyed`: each target with its lock key) and as they stand after (a
/// Machine's Node may have changed).
fn about(idx: &Index, keyed: &[(Target, Target)], confirmed: &BTreeSet<Target>) -> BTreeSet<Target> {
    keyed
        .iter()
        .filter(|(t, _)| confirmed.contains(t))
        .flat_map(|(t, before)| [before.clone(), lock_target(idx, t)])
        .collect()
}

/// The check `key` decided again for its `confirmed` targets (each of `keyed`, a target with its
/// lock key, that was read again): the others' claims about them derived now, and only the
/// remediations of confirmed targets kept (the job then says to decide the check again if any
/// was left out). `None` when the check is gone.
///
/// `version_tested`: the confirmed Machine targets whose Machine was not read again because the
/// plan's write proves it current ([`write_tests_version`]); a remediation of one of them is kept
/// only if the new plan's write still does.
pub fn confirmed_job(
    idx: &Index,
    key: &CheckRef,
    now: Timestamp,
    keyed: &[(Target, Target)],
    confirmed: &BTreeSet<Target>,
    version_tested: &BTreeSet<Target>,
) -> Option<Job> {
    let about = about(idx, keyed, confirmed);
    let mut fresh = gather::job_with_fresh_holders(idx, key, now, &about)?;
    fresh.keep_confirmed(confirmed);
    let untested: Vec<&Target> = version_tested.iter().filter(|t| !write_tests_version(&fresh, t)).collect();
    if !untested.is_empty() {
        let kept: BTreeSet<Target> = confirmed.iter().filter(|t| !untested.contains(t)).cloned().collect();
        fresh.keep_confirmed(&kept);
    }
    Some(fresh)
}

/// Whether the plan's own writes prove that a Machine target is as the decision read it, so that
/// reading the Machine again to confirm the remediation adds nothing: every remediating action
/// about it is a condition write sent as a JSON patch that first tests the `resourceVersion` the
/// decision read (`WriteBasis::json_patch`), which the API server refuses whole, changing
/// nothing, once the Machine has moved on. A remediation object to create, a Machine the plan
/// holds no cached entry for, or a write the basis cannot express as that patch (the writer
/// would read the Machine and merge-patch it) needs the read. Its Node is read in every case.
pub fn write_tests_version(job: &Job, target: &Target) -> bool {
    let Target::Machine { .. } = target else { return false };
    let Some(entry) = job.machines.get(target) else { return false };
    let mut remediating = job.plan.actions.iter().filter(|a| a.remediates().as_ref() == Some(target)).peekable();
    remediating.peek().is_some()
        && remediating.all(|action| match action {
            Action::SetMachineConditions { version, conditions, .. } => {
                entry.basis.json_patch(*version, entry.resource_version.as_deref(), conditions).is_some()
            }
            _ => false,
        })
}

/// Puts a plan's remediating actions first and keeps at most `limit` of its verdict-only Machine
/// writes; the check is decided again at once for the rest (the engine plans each Machine's
/// missing verdict again, so nothing is lost). Only the Machines' own conditions wait: the
/// status, notices and every other action are the plan's.
pub fn pace_verdicts(job: &mut Job, limit: usize) {
    let mut first = Vec::new();
    let mut rest = Vec::new();
    let mut verdicts = 0usize;
    for action in std::mem::take(&mut job.plan.actions) {
        if action.remediates().is_some() {
            first.push(action);
            continue;
        }
        if matches!(action, Action::SetMachineConditions { .. }) {
            verdicts += 1;
            if verdicts > limit {
                job.again = true;
                continue;
            }
        }
        rest.push(action);
    }
    first.append(&mut rest);
    job.plan.actions = first;
}

/// Caches what `key` now remediates, for the others' decisions, and returns the checks that must
/// decide again: the other NodeHealthChecks deciding on a Node it newly holds (one that decided
/// while this check was writing saw the Node's Lease, taken first, but not yet this claim, and
/// said it waits for the Lease rather than for this check), and when it let a target go, the
/// checks waiting for another check.
pub fn cache_claims(idx: &mut Index, key: &CheckRef) -> BTreeSet<CheckRef> {
    let claims = claims::claims_of(idx, key);
    let before: BTreeSet<&Target> = idx.claims.get(key).into_iter().flatten().map(|c| &c.target).collect();
    let released = before.iter().any(|t| !claims.iter().any(|c| &c.target == *t));
    let mut wake: BTreeSet<CheckRef> = match released {
        true => idx.waiting_checks().filter(|c| c != key).collect(),
        false => BTreeSet::new(),
    };
    let newly_held: Vec<String> = claims
        .iter()
        .filter(|c| !before.contains(&c.target))
        .filter_map(|c| match &c.target {
            Target::Node { cluster, name } if cluster == LOCAL_CLUSTER => Some(name.clone()),
            _ => None,
        })
        .collect();
    idx.claims.set(key, claims);
    if !newly_held.is_empty() {
        wake.extend(idx.nhcs_deciding_on(&newly_held, key));
    }
    wake
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use vigil_api::conditions::DesiredCondition;
    use vigil_api::reason::Reason;
    use vigil_api::views::CapiVersion;
    use vigil_api::well_known::HEALTH_CHECK_SUCCEEDED;
    use vigil_engine::plan::{ObjectRef, Plan};
    use vigil_engine::target::CheckRef;

    fn set(name: &str, healthy: bool) -> Action {
        let t: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let condition = if healthy {
            DesiredCondition::true_(HEALTH_CHECK_SUCCEEDED, Reason::HealthCheckSucceeded, "")
        } else {
            DesiredCondition::false_(HEALTH_CHECK_SUCCEEDED, Reason::UnhealthyNode, "")
        };
        Action::SetMachineConditions {
            machine: ObjectRef {
                api_version: "cluster.x-k8s.io/v1beta2".into(),
                kind: "Machine".into(),
                namespace: "ns".into(),
                name: name.into(),
            },
            version: CapiVersion::V1Beta2,
            conditions: vec![(condition, t)],
        }
    }

    fn job(actions: Vec<Action>) -> Job {
        Job {
            key: CheckRef::Machine { namespace: "ns".into(), name: "workers".into() },
            plan: Plan {
                status: crate::gather::CheckStatus::Machine(Default::default()),
                actions,
                notices: vec![],
                next_wake: None,
                held_elsewhere: vec![],
                short_circuited: false,
                remediating: 0,
            },
            current: None,
            machines: HashMap::new(),
            needs: BTreeSet::new(),
            uid: None,
            resource_version: None,
            expiries: HashMap::new(),
            again: false,
        }
    }

    fn names(job: &Job) -> Vec<&str> {
        job.plan.actions.iter().map(Action::target_name).collect()
    }

    /// A cold start's first decision of a large check (every Machine's first verdict) must not
    /// hold back the Machine whose timeout ran out: its remediation goes first, the verdicts go a
    /// limited number per decision, and the check is decided again for the rest.
    #[test]
    fn remediations_go_first_and_verdicts_are_paced() {
        let mut actions: Vec<Action> = (0..250).map(|i| set(&format!("h{i:03}"), true)).collect();
        actions.insert(180, set("sick", false));
        let mut j = job(actions);
        pace_verdicts(&mut j, 100);
        assert_eq!(names(&j)[0], "sick", "the remediation is sent first");
        assert_eq!(j.plan.actions.len(), 101, "the remediation and 100 verdicts");
        assert_eq!(names(&j)[1..4], ["h000", "h001", "h002"], "the verdicts keep their order");
        assert!(j.again, "decided again for the 150 left");

        // Within the limit nothing is left out and the check is not decided again for it.
        let mut small = job((0..100).map(|i| set(&format!("h{i:03}"), true)).chain([set("sick", false)]).collect());
        pace_verdicts(&mut small, 100);
        assert_eq!(small.plan.actions.len(), 101);
        assert_eq!(names(&small)[0], "sick");
        assert!(!small.again);

        // Remediations are never paced, however many.
        let mut wave = job((0..300).map(|i| set(&format!("s{i:03}"), false)).collect());
        pace_verdicts(&mut wave, 100);
        assert_eq!(wave.plan.actions.len(), 300);
        assert!(!wave.again);
    }

    /// A Machine is confirmed by its own write only when every remediating action about it is a
    /// condition write that tests the `resourceVersion` the decision read; anything else reads it.
    #[test]
    fn only_a_write_that_tests_the_version_read_confirms_its_machine() {
        let sick = set("sick", false);
        let target = sick.remediates().expect("a remediating write");
        let entry = |rv: Option<&str>| {
            let mut raw = serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "sick", "namespace": "ns"}, "spec": {"clusterName": "c"}});
            if let Some(rv) = rv {
                raw["metadata"]["resourceVersion"] = rv.into();
            }
            crate::index::machine_entry(&raw).expect("a Machine entry")
        };
        let with = |actions: Vec<Action>, rv: Option<&str>| {
            let mut j = job(actions);
            j.machines.insert(target.clone(), entry(rv));
            j
        };
        assert!(write_tests_version(&with(vec![sick.clone()], Some("7")), &target));
        // No resourceVersion to test: the writer would read and merge-patch.
        assert!(!write_tests_version(&with(vec![sick.clone()], None), &target));
        // No cached entry for it.
        assert!(!write_tests_version(&job(vec![sick.clone()]), &target));
        // A verdict is not a remediation: nothing about the target to prove.
        assert!(!write_tests_version(&with(vec![set("sick", true)], Some("7")), &target));
        // A remediation object about it needs the read, even beside a tested write.
        let create = Action::CreateRemediation {
            object: serde_json::json!({"kind": "Metal3Remediation"}),
            target: target.clone(),
            lease: None,
            after: vec![],
        };
        assert!(!write_tests_version(&with(vec![sick, create], Some("7")), &target));
        // A Node target is always read.
        let node = Target::Node { cluster: LOCAL_CLUSTER.into(), name: "n".into() };
        assert!(!write_tests_version(&with(vec![], Some("7")), &node));
    }
}
