//! Confirm before acting. A plan decided from the watch caches may be stale: a partition holds a
//! watch open without delivering anything, and a write sent into it arrives when it heals. So a
//! remediating write (a Machine marked unhealthy or for its owner's remediation, a remediation
//! object) is sent only after
//! 1. its target is locked by this check for the moment (another check deciding on the same
//!    target waits: one check remediates a target at a time),
//! 2. the target is read again from the API server — a quorum read of that Machine and its Node,
//!    or of that Node; a plan's targets are read together, [`CONFIRM_READS`] at a time, all
//!    within [`CONFIRM_TIMEOUT`] — and what was read is put into the indexes,
//! 3. the check is decided again, once for the whole plan, on the indexes with what was read, at
//!    the current time, with the other checks' claims about the confirmed targets derived anew
//!    (only checks that can select one of them, looking only at the Machines and remediation
//!    objects that can stand for one), and the new plan still asks for it (the sources it reads
//!    must be live: a plan decided while one is not is a refusal without writes). A remediation
//!    the new plan asks for a target that was not confirmed is left out, and the check decided
//!    again: it was decided on cached claims.
//!
//! Remediation is rare; one read per remediated target is cheap. Cluster API's and medik8s'
//! controllers write what they decided from their caches (see docs/DECISIONS.md).

use crate::context::Context;
use crate::wire::WireNode;
use futures::StreamExt as _;
use kube::api::{Api, DynamicObject};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;
use vigil_api::views::MachineView;
use vigil_engine::Action;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};
use vigil_index::gather::{self, Job};
use vigil_index::index::{WorkloadCluster, machine_cluster};

/// How long the confirming reads of one plan may take together.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// How many confirming reads of one plan run at once (a wave may put hundreds in one plan).
pub const CONFIRM_READS: usize = 16;

/// The key under which a target the plan remediates ([`Action::remediates`]) is locked: the
/// target as the indexes stand for it now (a Machine is its Node when it references one, and a
/// fresh read may change which), so that a MachineHealthCheck and a NodeHealthCheck on one
/// self-hosted Node lock the same key.
pub fn lock_target(idx: &vigil_index::index::Index, target: &Target) -> Target {
    let Target::Machine { namespace, name } = target else { return target.clone() };
    let Some(entry) = idx.machines.get(namespace).and_then(|m| m.get(name)) else { return target.clone() };
    let workload = machine_cluster(&entry.view);
    let self_hosted = WorkloadCluster::from_key(&workload).is_some_and(|w| idx.hosting.is_self_hosted(&w));
    let node_cluster = if self_hosted { LOCAL_CLUSTER.to_string() } else { workload };
    Target::of_machine(&node_cluster, &entry.view)
}

/// How many Machine verdicts one decision of a check writes besides its remediations. A cold
/// start's first decision of a 2 000-target check would otherwise hold the check for 2 000
/// writes, and a Machine whose timeout ran out meanwhile would wait for all of them
/// (docs/DECISIONS.md, "Verdicts paced, remediations first").
pub const VERDICTS_PER_RUN: usize = 100;

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

/// The outcome of confirming a job.
pub enum Confirmed {
    /// Apply this job (its remediating actions confirmed); unlock these targets afterwards.
    Go(Box<Job>, BTreeSet<Target>),
    /// The check no longer exists.
    Gone,
}

fn targets_of(job: &Job) -> BTreeSet<Target> {
    job.plan.actions.iter().filter_map(Action::remediates).collect()
}

/// Confirms `job`'s remediating actions (see the module documentation). Actions whose target
/// could not be locked or read are left out, and the job says to decide the check again.
pub async fn confirm(ctx: &Arc<Context>, job: Job) -> Confirmed {
    let targets = targets_of(&job);
    if targets.is_empty() {
        return Confirmed::Go(Box::new(job), BTreeSet::new());
    }
    let key = job.key.clone();
    let keyed: Vec<(Target, Target)> = {
        let idx = ctx.read_index();
        targets.iter().map(|t| (t.clone(), lock_target(&idx, t))).collect()
    };
    let keys: BTreeSet<Target> = keyed.iter().map(|(_, k)| k.clone()).collect();
    let locked_elsewhere = ctx.lock_targets(&key, &keys);
    let locked: BTreeSet<Target> = keys.difference(&locked_elsewhere).cloned().collect();
    let to_read: Vec<&(Target, Target)> = keyed.iter().filter(|(_, k)| locked.contains(k)).collect();
    let read_started = std::time::Instant::now();
    let confirmed = read_all(ctx, &key, &to_read).await;
    let read_took = read_started.elapsed();
    let fresh = {
        let idx = ctx.read_index();
        let about = about(&idx, &keyed, &confirmed);
        gather::job_with_fresh_holders(&idx, &key, ctx.clock.now(), &about)
    };
    tracing::debug!(
        check = %key,
        targets = to_read.len(),
        read_us = read_took.as_micros() as u64,
        redecide_us = read_started.elapsed().saturating_sub(read_took).as_micros() as u64,
        "confirmed"
    );
    let Some(mut fresh) = fresh else {
        ctx.unlock_targets(&key, &locked);
        return Confirmed::Gone;
    };
    fresh.keep_confirmed(&confirmed);
    let sent = targets_of(&fresh).len();
    ctx.metrics.confirmations(targets.len(), sent);
    if sent < targets.len() {
        info!(
            check = %key,
            decided = targets.len(),
            confirmed = sent,
            "remediations decided from the caches were not all confirmed by a fresh read; only confirmed ones are sent"
        );
    }
    Confirmed::Go(Box::new(fresh), locked)
}

/// Reads the targets again, [`CONFIRM_READS`] at a time, all within [`CONFIRM_TIMEOUT`] of the
/// first; returns those read.
async fn read_all(ctx: &Arc<Context>, key: &CheckRef, targets: &[&(Target, Target)]) -> BTreeSet<Target> {
    let deadline = tokio::time::Instant::now() + CONFIRM_TIMEOUT;
    // Collected first: a stream over a borrowing iterator is not `Send` for the worker task.
    let reads: Vec<_> = targets.iter().map(|(t, k)| async move {
        match tokio::time::timeout_at(deadline, refresh(ctx, t)).await {
            Ok(Ok(())) => Some(t.clone()),
            Ok(Err(why)) => {
                info!(check = %key, target = %k, %why, "remediation not confirmed: the target could not be read again");
                None
            }
            Err(_) => {
                info!(check = %key, target = %k, "remediation not confirmed: reading the target again timed out");
                None
            }
        }
    }).collect();
    futures::stream::iter(reads).buffer_unordered(CONFIRM_READS).filter_map(std::future::ready).collect().await
}

/// What the confirming decision derives other checks' claims about: the confirmed targets, as
/// locked before the reads and as they stand after (a Machine's Node may have changed).
fn about(
    idx: &vigil_index::index::Index,
    keyed: &[(Target, Target)],
    confirmed: &BTreeSet<Target>,
) -> BTreeSet<Target> {
    keyed
        .iter()
        .filter(|(t, _)| confirmed.contains(t))
        .flat_map(|(t, before)| [before.clone(), lock_target(idx, t)])
        .collect()
}

/// Reads a target again from the API server and puts what was read into the indexes.
async fn refresh(ctx: &Arc<Context>, target: &Target) -> Result<(), String> {
    match target {
        Target::Node { cluster, name } => {
            let client = if cluster == LOCAL_CLUSTER {
                ctx.client.clone()
            } else {
                let client = ctx.lock_workload_clients().get(cluster).cloned();
                client.ok_or_else(|| format!("workload cluster {cluster} is not connected"))?
            };
            let node = fetch_node(client, name).await?;
            store_node(ctx, cluster, name, node);
            Ok(())
        }
        Target::Machine { namespace, name } => refresh_machine(ctx, namespace, name).await,
    }
}

/// The `apiVersion` to read a Machine in: the one its cached view was written in, else Cluster
/// API's current one.
fn cached_api_version(ctx: &Context, namespace: &str, name: &str) -> String {
    let idx = ctx.read_index();
    let cached = idx.machines.get(namespace).and_then(|m| m.get(name)).map(|e| e.view.meta.api_version.as_str());
    cached.filter(|v| !v.is_empty()).unwrap_or("cluster.x-k8s.io/v1beta2").to_string()
}

/// Reads a Machine again and, at the same time, the Node its cached view names (one round trip,
/// not two: a wave's confirmations wait on the API server, which is busiest then). When the fresh
/// Machine names another Node or workload cluster, that Node is read after it.
async fn refresh_machine(ctx: &Arc<Context>, namespace: &str, name: &str) -> Result<(), String> {
    let api_version = cached_api_version(ctx, namespace, name);
    let ar = ctx.writer.resource(&api_version, "Machine").await.map_err(|e| e.to_string())?;
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &ar);
    let cached = node_of(ctx, namespace, name);
    let read_machine = async { api.get_opt(name).await.map_err(|e| format!("get Machine {namespace}/{name}: {e}")) };
    let (machine, early) = match &cached {
        Some((cluster, node, client)) => {
            let (m, n) = futures::join!(read_machine, fetch_node(client.clone(), node));
            (m?, Some((cluster.clone(), node.clone(), n)))
        }
        None => (read_machine.await?, None),
    };
    let Some(machine) = machine else {
        ctx.write_index().put_machine_entry(None, Some((namespace.to_string(), name.to_string())));
        return Ok(());
    };
    let raw = serde_json::to_value(&machine).map_err(|e| e.to_string())?;
    let view = MachineView::read(&raw);
    ctx.write_index().put_machine(Some(&raw), None);
    let Some(view) = view else { return Ok(()) };
    let Some(node) = view.node_name.clone() else { return Ok(()) };
    let cluster = machine_cluster(&view);
    let node_read = match early {
        Some((c, n, read)) if c == cluster && n == node => read?,
        _ => {
            let client = ctx.lock_workload_clients().get(&cluster).cloned();
            let client = client.ok_or_else(|| format!("workload cluster {cluster} is not connected"))?;
            fetch_node(client, &node).await?
        }
    };
    store_node(ctx, &cluster, &node, node_read);
    Ok(())
}

/// The workload cluster, Node and client the cached view of a Machine names, if connected.
fn node_of(ctx: &Arc<Context>, namespace: &str, name: &str) -> Option<(String, String, kube::Client)> {
    let (cluster, node) = {
        let idx = ctx.read_index();
        let view = &idx.machines.get(namespace)?.get(name)?.view;
        (machine_cluster(view), view.node_name.clone()?)
    };
    let client = ctx.lock_workload_clients().get(&cluster).cloned()?;
    Some((cluster, node, client))
}

async fn fetch_node(client: kube::Client, name: &str) -> Result<Option<WireNode>, String> {
    Api::<WireNode>::all(client).get_opt(name).await.map_err(|e| format!("get Node {name}: {e}"))
}

/// Puts a Node read again (or its absence) into the indexes.
fn store_node(ctx: &Arc<Context>, cluster: &str, name: &str, node: Option<WireNode>) {
    let mut idx = ctx.write_index();
    match node {
        Some(n) => {
            let (slim, _) = crate::wire::slim(&n);
            idx.put_node(cluster, Some(slim), None, ctx.clock.now());
        }
        None => {
            idx.put_node(cluster, None, Some(name.to_string()), ctx.clock.now());
        }
    }
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
                status: gather::CheckStatus::Machine(Default::default()),
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
}
