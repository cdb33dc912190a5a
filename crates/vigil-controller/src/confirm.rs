//! Confirm before acting. A plan decided from the watch caches may be stale: a partition holds a
//! watch open without delivering anything, and a write sent into it arrives when it heals. So a
//! remediating write (a Machine marked unhealthy or for its owner's remediation, a remediation
//! object) is sent only after
//! 1. its target is locked by this check for the moment (another check deciding on the same
//!    target waits: one check remediates a target at a time),
//! 2. the target is read again from the API server — a quorum read of that Machine and its Node,
//!    or of that Node; a plan's targets are read together, [`CONFIRM_READS`] at a time, all
//!    within [`CONFIRM_TIMEOUT`] — and what was read is put into the indexes. A Machine whose
//!    remediating writes all test the `resourceVersion` the decision read is not read (its Node
//!    is): the API server refuses such a write whole if the Machine moved on, which proves more
//!    than a read a moment before it ([`write_tests_version`]),
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
use vigil_engine::target::{CheckRef, Target};
use vigil_index::decision::{confirmed_job, lock_target, targets_of, write_tests_version};
use vigil_index::gather::Job;
use vigil_index::sources::{ClusterRef, WorkloadCluster};

/// How long the confirming reads of one plan may take together.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// How many confirming reads of one plan run at once (a wave may put hundreds in one plan).
pub const CONFIRM_READS: usize = 16;

/// The outcome of confirming a job.
pub enum Confirmed {
    /// Apply this job (its remediating actions confirmed); unlock these targets afterwards.
    Go(Box<Job>, BTreeSet<Target>),
    /// The check no longer exists.
    Gone,
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
    let locked_elsewhere = ctx.confirming.lock(&key, &keys);
    let locked: BTreeSet<Target> = keys.difference(&locked_elsewhere).cloned().collect();
    let to_read: Vec<&(Target, Target)> = keyed.iter().filter(|(_, k)| locked.contains(k)).collect();
    let version_tested: BTreeSet<Target> =
        to_read.iter().map(|(t, _)| t).filter(|t| write_tests_version(&job, t)).cloned().collect();
    let read_started = std::time::Instant::now();
    let confirmed = read_all(ctx, &key, &to_read, &version_tested).await;
    let read_took = read_started.elapsed();
    let fresh = confirmed_job(&ctx.read_index(), &key, ctx.clock.now(), &keyed, &confirmed, &version_tested);
    tracing::debug!(
        check = %key,
        targets = to_read.len(),
        read_us = read_took.as_micros() as u64,
        redecide_us = read_started.elapsed().saturating_sub(read_took).as_micros() as u64,
        "confirmed"
    );
    let Some(fresh) = fresh else {
        ctx.confirming.unlock(&key, &locked);
        return Confirmed::Gone;
    };
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
/// first; returns those read. Of a Machine in `version_tested` only its Node is read.
async fn read_all(
    ctx: &Arc<Context>,
    key: &CheckRef,
    targets: &[&(Target, Target)],
    version_tested: &BTreeSet<Target>,
) -> BTreeSet<Target> {
    let deadline = tokio::time::Instant::now() + CONFIRM_TIMEOUT;
    // Collected first: a stream over a borrowing iterator is not `Send` for the worker task.
    let reads: Vec<_> = targets.iter().map(|(t, k)| async move {
        let node_only = version_tested.contains(t);
        match tokio::time::timeout_at(deadline, refresh(ctx, t, node_only)).await {
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

/// Reads a target again from the API server and puts what was read into the indexes; with
/// `node_only`, of a Machine only the Node its cached view names (the write tests the Machine).
async fn refresh(ctx: &Arc<Context>, target: &Target, node_only: bool) -> Result<(), String> {
    match target {
        Target::Node { cluster, name } => {
            let cluster = ClusterRef::from_key(cluster).ok_or_else(|| format!("no cluster is named {cluster:?}"))?;
            let client = ctx.client_of(&cluster).ok_or_else(|| format!("{cluster} is not connected"))?;
            let node = fetch_node(client, name).await?;
            store_node(ctx, &cluster, name, node);
            Ok(())
        }
        Target::Machine { namespace, name } if node_only => refresh_node_of(ctx, namespace, name).await,
        Target::Machine { namespace, name } => refresh_machine(ctx, namespace, name).await,
    }
}

/// Reads again the Node the cached view of a Machine names, if it names one.
async fn refresh_node_of(ctx: &Arc<Context>, namespace: &str, name: &str) -> Result<(), String> {
    let Some((cluster, node, client)) = node_of(ctx, namespace, name)? else { return Ok(()) };
    let read = fetch_node(client, &node).await?;
    store_node(ctx, &cluster, &node, read);
    Ok(())
}

/// The `apiVersion` to read a Machine in: the one its cached view was written in, else Cluster
/// API's current one.
fn cached_api_version(ctx: &Context, namespace: &str, name: &str) -> String {
    let idx = ctx.read_index();
    let cached = idx.machine(namespace, name).map(|e| e.view.meta.api_version.as_str());
    cached.filter(|v| !v.is_empty()).unwrap_or("cluster.x-k8s.io/v1beta2").to_string()
}

/// Reads a Machine again and, at the same time, the Node its cached view names (one round trip,
/// not two: a wave's confirmations wait on the API server, which is busiest then). When the fresh
/// Machine names another Node or workload cluster, that Node is read after it.
async fn refresh_machine(ctx: &Arc<Context>, namespace: &str, name: &str) -> Result<(), String> {
    let api_version = cached_api_version(ctx, namespace, name);
    let ar = ctx.writer.resource(&api_version, "Machine").await.map_err(|e| e.to_string())?;
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &ar);
    // Read beside the Machine when it can be; else after it, from what the fresh Machine names.
    let cached = node_of(ctx, namespace, name).ok().flatten();
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
    let cluster = node_cluster(&view)?;
    let node_read = match early {
        Some((c, n, read)) if c == cluster && n == node => read?,
        _ => {
            let client = ctx.client_of(&cluster).ok_or_else(|| format!("{cluster} is not connected"))?;
            fetch_node(client, &node).await?
        }
    };
    store_node(ctx, &cluster, &node, node_read);
    Ok(())
}

/// The workload cluster, Node and client the cached view of a Machine names (`None`: it names no
/// Node); an error when the Machine is not cached, names no cluster, or its cluster is not
/// connected.
fn node_of(
    ctx: &Arc<Context>,
    namespace: &str,
    name: &str,
) -> Result<Option<(ClusterRef, String, kube::Client)>, String> {
    let (cluster, node) = {
        let idx = ctx.read_index();
        let entry = idx.machine(namespace, name).ok_or_else(|| format!("Machine {namespace}/{name} is not cached"))?;
        let Some(node) = entry.view.node_name.clone() else { return Ok(None) };
        (node_cluster(&entry.view)?, node)
    };
    let client = ctx.client_of(&cluster).ok_or_else(|| format!("{cluster} is not connected"))?;
    Ok(Some((cluster, node, client)))
}

/// The workload cluster a Machine's Node lives in, by its cluster-name label.
fn node_cluster(view: &MachineView) -> Result<ClusterRef, String> {
    let workload = WorkloadCluster::of_machine(view);
    workload.map(ClusterRef::Workload).ok_or_else(|| format!("Machine {} names no cluster", view.meta.name))
}

async fn fetch_node(client: kube::Client, name: &str) -> Result<Option<WireNode>, String> {
    Api::<WireNode>::all(client).get_opt(name).await.map_err(|e| format!("get Node {name}: {e}"))
}

/// Puts a Node read again (or its absence) into the indexes.
fn store_node(ctx: &Arc<Context>, cluster: &ClusterRef, name: &str, node: Option<WireNode>) {
    let cluster = &cluster.key();
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
