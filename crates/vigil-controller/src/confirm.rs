//! Confirm before acting. A plan decided from the watch caches may be stale: a partition holds a
//! watch open without delivering anything, and a write sent into it arrives when it heals. So a
//! remediating write (a Machine marked unhealthy or for its owner's remediation, a remediation
//! object) is sent only after
//! 1. its target is claimed by this check for the moment (another check deciding on the same
//!    target waits: one check remediates a target at a time),
//! 2. the target is read again from the API server — a quorum read of that Machine and its Node,
//!    or of that Node — within [`CONFIRM_TIMEOUT`], and what was read is put into the indexes,
//! 3. the check is decided again on the indexes with what was read, at the current time, and
//!    the new plan still asks for it (the sources it reads must be live: a plan decided while one
//!    is not is a refusal without writes).
//!
//! Remediation is rare; one read per remediated target is cheap. Cluster API's and medik8s'
//! controllers write what they decided from their caches (see docs/DECISIONS.md).

use crate::Context;
use crate::index::{CheckKey, MANAGEMENT, machine_cluster};
use crate::reconcile::{self, Job};
use crate::wire::WireNode;
use jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;
use vigil_api::views::MachineView;
use vigil_api::well_known::{HEALTH_CHECK_SUCCEEDED, OWNER_REMEDIATED};
use vigil_engine::Action;
use vigil_engine::holders;

/// How long one confirming read may take.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// What a remediating action needs read again.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// A Machine (namespace, name, apiVersion) and the Node it references.
    Machine(String, String, String),
    /// A Node of the management cluster.
    Node(String),
}

impl Target {
    /// The key under which the target is claimed: the engine's [`holders::Target`], so that a
    /// MachineHealthCheck and a NodeHealthCheck on one self-hosted Node claim the same key.
    pub fn claim_key(&self, idx: &crate::index::Index) -> String {
        match self {
            Target::Node(n) => holders::Target::local_node(n).to_string(),
            Target::Machine(ns, n, _) => {
                let Some(entry) = idx.machines.get(ns).and_then(|m| m.get(n)) else {
                    return holders::Target::Machine { namespace: ns.clone(), name: n.clone() }.to_string();
                };
                let workload = machine_cluster(&entry.view);
                let node_cluster =
                    if idx.self_hosted.contains(&workload) { holders::LOCAL_CLUSTER.to_string() } else { workload };
                holders::Target::of_machine(&node_cluster, &entry.view).to_string()
            }
        }
    }
}

/// Whether an action remediates (asks for a target to be repaired), and its target if so.
pub fn remediating_target(key: &CheckKey, action: &Action, job: &Job) -> Option<Target> {
    match (key, action) {
        (CheckKey::Machine(..), Action::SetMachineConditions { machine, conditions, .. }) => {
            let remediates = conditions.iter().any(|(c, _)| {
                c.status == "False" && (c.type_ == HEALTH_CHECK_SUCCEEDED || c.type_ == OWNER_REMEDIATED)
            });
            remediates
                .then(|| Target::Machine(machine.namespace.clone(), machine.name.clone(), machine.api_version.clone()))
        }
        (CheckKey::Machine(ns, _), Action::CreateRemediation { target, .. }) => {
            let (namespace, name) = target.split_once('/').unwrap_or((ns.as_str(), target.as_str()));
            let api_version = job
                .machines
                .get(&format!("{namespace}/{name}"))
                .and_then(|v| v.get("apiVersion").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_default();
            Some(Target::Machine(namespace.to_string(), name.to_string(), api_version))
        }
        (CheckKey::Node(_), Action::CreateRemediation { target, .. }) => Some(Target::Node(target.clone())),
        _ => None,
    }
}

/// The outcome of confirming a job.
pub enum Confirmed {
    /// Apply this job (its remediating actions confirmed); release these claims afterwards.
    Go(Box<Job>, BTreeSet<String>),
    /// The check no longer exists.
    Gone,
}

fn targets_of(job: &Job) -> BTreeSet<Target> {
    job.actions.iter().filter_map(|a| remediating_target(&job.key, a, job)).collect()
}

/// Confirms `job`'s remediating actions (see the module documentation). Actions whose target
/// could not be claimed or read are left out, and the job says to decide the check again.
pub async fn confirm(ctx: &Arc<Context>, job: Job) -> Confirmed {
    let targets = targets_of(&job);
    if targets.is_empty() {
        return Confirmed::Go(Box::new(job), BTreeSet::new());
    }
    let key = job.key.clone();
    let keyed: Vec<(Target, String)> = {
        let idx = ctx.read_index();
        targets.iter().map(|t| (t.clone(), t.claim_key(&idx))).collect()
    };
    let keys: BTreeSet<String> = keyed.iter().map(|(_, k)| k.clone()).collect();
    let held_elsewhere = ctx.claim(&key, &keys);
    let claimed: BTreeSet<String> = keys.difference(&held_elsewhere).cloned().collect();
    let key_ref = &key;
    let reads = keyed.iter().filter(|(_, k)| claimed.contains(k)).map(|(t, k)| async move {
        let key = key_ref;
        match tokio::time::timeout(CONFIRM_TIMEOUT, refresh(ctx, t)).await {
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
    });
    let confirmed: BTreeSet<Target> = futures::future::join_all(reads).await.into_iter().flatten().collect();
    let fresh = {
        let idx = ctx.read_index();
        reconcile::job_with_fresh_holders(&idx, &key, Timestamp::now())
    };
    let Some(mut fresh) = fresh else {
        ctx.release(&key, &claimed);
        return Confirmed::Gone;
    };
    let mut left_out: Vec<Action> = Vec::new();
    let mut kept = Vec::with_capacity(fresh.actions.len());
    for action in std::mem::take(&mut fresh.actions) {
        match remediating_target(&key, &action, &fresh) {
            Some(t) if !confirmed.contains(&t) => left_out.push(action),
            _ => kept.push(action),
        }
    }
    fresh.actions = kept;
    let sent = targets_of(&fresh).len();
    ctx.metrics.confirmations(targets.len(), sent);
    if !left_out.is_empty() {
        fresh.again = true;
        fresh.leave_out(&left_out);
    }
    if sent < targets.len() {
        info!(
            check = %key,
            decided = targets.len(),
            confirmed = sent,
            "remediations decided from the caches were not all confirmed by a fresh read; only confirmed ones are sent"
        );
    }
    Confirmed::Go(Box::new(fresh), claimed)
}

/// Reads a target again from the API server and puts what was read into the indexes.
async fn refresh(ctx: &Arc<Context>, target: &Target) -> Result<(), String> {
    match target {
        Target::Node(name) => refresh_node(ctx, MANAGEMENT, ctx.client.clone(), name).await,
        Target::Machine(namespace, name, api_version) => {
            let api_version = if api_version.is_empty() { "cluster.x-k8s.io/v1beta2" } else { api_version };
            let ar = ctx.resource(api_version, "Machine").await.map_err(|e| e.to_string())?;
            let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &ar);
            let machine = api.get_opt(name).await.map_err(|e| format!("get Machine {namespace}/{name}: {e}"))?;
            let Some(machine) = machine else {
                ctx.write_index().put_machine_entry(None, Some((namespace.clone(), name.clone())));
                return Ok(());
            };
            let raw = serde_json::to_value(&machine).map_err(|e| e.to_string())?;
            let view = MachineView::read(&raw);
            ctx.write_index().put_machine(Some(&raw), None);
            let Some(view) = view else { return Ok(()) };
            let Some(node) = view.node_name.clone() else { return Ok(()) };
            let cluster = machine_cluster(&view);
            let client = ctx.lock_workload_clients().get(&cluster).cloned();
            let client = client.ok_or_else(|| format!("workload cluster {cluster} is not connected"))?;
            refresh_node(ctx, &cluster, client, &node).await
        }
    }
}

async fn refresh_node(ctx: &Arc<Context>, cluster: &str, client: kube::Client, name: &str) -> Result<(), String> {
    let node = Api::<WireNode>::all(client).get_opt(name).await.map_err(|e| format!("get Node {name}: {e}"))?;
    let mut idx = ctx.write_index();
    match node {
        Some(n) => {
            let (slim, _) = crate::wire::slim(&n);
            idx.put_node(cluster, Some(slim), None, jiff::Timestamp::now());
        }
        None => {
            idx.put_node(cluster, None, Some(name.to_string()), jiff::Timestamp::now());
        }
    }
    Ok(())
}
