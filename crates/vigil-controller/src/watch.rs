//! Watches that feed the indexes. A source is trusted only between a complete list (`InitDone`)
//! and the next watch error; while it is not, the checks that read it make no decision and say so.
//! Every watch lists again after an error ([`crate::sources::relisting`]).

use crate::context::Context;
use crate::sources;
use crate::sources::SourceState;
use crate::wire::{WireNode, WireObject, read_mhc, read_nhc};
use futures::{Stream, StreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_engine::target::CheckRef;
use vigil_index::index::{Index, Source};
use vigil_index::sources::ClusterRef;

/// What one watch event does to the indexes. Objects arrive already reduced (`R`) to what the
/// index keeps, so a complete list of 10 000 objects is never held in full.
pub enum Op<K, R> {
    /// An object appeared or changed.
    Upsert(R),
    /// An object is gone.
    Remove(K),
    /// A complete list: replaces everything the source held.
    Replace(Vec<R>),
}

/// Runs a watch stream into the indexes until it ends. `reduce` turns each object into what
/// the index keeps (outside the index lock); `update` applies an operation and returns the
/// checks it concerns; `state` selects the source's state; `dependents` lists the checks that
/// read the source (woken when its trust changes). The source is registered under `what` for
/// `/readyz` (when `counts_for_readiness`) and the metrics.
#[allow(clippy::too_many_arguments)]
pub async fn feed<K, R, S>(
    ctx: Arc<Context>,
    what: String,
    counts_for_readiness: bool,
    stream: S,
    reduce: impl Fn(K) -> R + Send,
    update: impl Fn(&mut Index, Op<K, R>) -> BTreeSet<CheckRef> + Send,
    state: impl Fn(&mut Index) -> &mut SourceState + Send,
    dependents: impl Fn(&Index) -> Vec<CheckRef> + Send,
) where
    S: Stream<Item = sources::Item<K>> + Send,
    R: Send,
{
    ctx.sources.register(&what, counts_for_readiness);
    ctx.metrics.source_synced(&what, false);
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Vec<R> = Vec::new();
    while let Some(item) = stream.next().await {
        let item = match item {
            Ok(Event::InitApply(o)) => {
                buffer.push(reduce(o));
                continue;
            }
            Ok(Event::Apply(o)) => Ok(Some(Op::Upsert(reduce(o)))),
            Ok(Event::Delete(o)) => Ok(Some(Op::Remove(o))),
            Ok(Event::Init) => {
                buffer.clear();
                Ok(None)
            }
            Ok(Event::InitDone) => Ok(Some(Op::Replace(std::mem::take(&mut buffer)))),
            Err(e) => Err(e),
        };
        let dirty = {
            let mut idx = ctx.write_index();
            match item {
                Ok(None) => BTreeSet::new(),
                Ok(Some(Op::Replace(list))) => {
                    update(&mut idx, Op::Replace(list));
                    *state(&mut idx) = SourceState::Synced;
                    ctx.sources.synced(&what);
                    ctx.metrics.source_synced(&what, true);
                    info!(source = %what, "synced");
                    dependents(&idx).into_iter().collect()
                }
                Ok(Some(op)) => update(&mut idx, op),
                Err(message) => {
                    // Whatever the error, the watch starts again with a complete list: until
                    // it arrives, nothing is decided from this source.
                    buffer.clear();
                    ctx.sources.failed(&what, &message);
                    ctx.metrics.source_synced(&what, false);
                    ctx.metrics.watch_restart(&what);
                    let slot = state(&mut idx);
                    let changed = !matches!(slot, SourceState::Failed(m) if *m == message);
                    *slot = SourceState::Failed(message.clone());
                    if changed {
                        warn!(source = %what, error = %message, "watch failed; listing again, decisions that need it are suspended");
                        dependents(&idx).into_iter().collect()
                    } else {
                        BTreeSet::new()
                    }
                }
            }
        };
        ctx.metrics.watch_event();
        ctx.scheduler.mark(dirty);
    }
    ctx.sources.remove(&what);
}

/// Objects per list page of every watch but the Cluster API ones (Kubernetes' default).
const PAGE: u32 = 500;

/// Objects per list page of the Cluster API watches. Every replica lists every Machine and
/// Cluster (the cross-shard rule reads other shards' Machines on local Nodes), and a page is
/// held whole while it is decoded: at 500 a page of Clusters and one of Machines were most of
/// a replica's peak heap, and the allocator keeps a peak. Smaller pages cost more requests of
/// the same total size.
const CAPI_PAGE: u32 = 100;

fn watch_config(page: u32) -> watcher::Config {
    watcher::Config::default().page_size(page)
}

fn key_of<K: kube::Resource>(o: &K) -> (String, String) {
    (o.meta().namespace.clone().unwrap_or_default(), o.meta().name.clone().unwrap_or_default())
}

/// A watch of `api` that lists again after any error or lost contact with the API server.
fn watch<K>(ctx: &Context, api: Api<K>) -> impl Stream<Item = sources::Item<K>> + Send + use<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    sources::relisting(api, watch_config(PAGE), ctx.epoch())
}

/// Starts the watches every decision needs: both health-check kinds and the Nodes of the cluster
/// Vigil runs in at once, and Cluster API Machines and Clusters (in the version the API server
/// serves, preferring v1beta2) as soon as discovery answers — it is retried until it does.
pub async fn start_fixed(ctx: &Arc<Context>) {
    let client = ctx.client.clone();
    let mhc_ar = ApiResource::erase::<MachineHealthCheck>(&());
    let nhc_ar = ApiResource::erase::<NodeHealthCheck>(&());
    let mhcs = watch(ctx, Api::<WireObject>::all_with(client.clone(), &mhc_ar));
    tokio::spawn(feed(
        ctx.clone(),
        "MachineHealthChecks".into(),
        true,
        mhcs,
        read_mhc,
        |idx, op| match op {
            Op::Upsert(read) => idx.put_mhc_read(Some(read), None),
            Op::Remove(o) => idx.put_mhc(None, Some(key_of(&o))),
            Op::Replace(list) => {
                idx.clear_mhcs();
                for read in list {
                    idx.put_mhc_read(Some(read), None);
                }
                BTreeSet::new()
            }
        },
        |idx| idx.state_mut(&Source::Mhcs),
        Index::all_mhcs,
    ));
    let nhcs = watch(ctx, Api::<WireObject>::all_with(client.clone(), &nhc_ar));
    tokio::spawn(feed(
        ctx.clone(),
        "NodeHealthChecks".into(),
        true,
        nhcs,
        read_nhc,
        |idx, op| match op {
            Op::Upsert(read) => idx.put_nhc_read(Some(read), None),
            Op::Remove(o) => idx.put_nhc(None, Some(key_of(&o).1)),
            Op::Replace(list) => {
                idx.clear_nhcs();
                for read in list {
                    idx.put_nhc_read(Some(read), None);
                }
                // A medik8s check whose vigil.dev namesake went while the watch was down is served again.
                idx.sync_all_medik8s();
                BTreeSet::new()
            }
        },
        |idx| idx.state_mut(&Source::Nhcs),
        Index::all_nhcs,
    ));
    start_nodes(ctx, ClusterRef::Local, client.clone());
    tokio::spawn(start_cluster_api(ctx.clone()));
}

/// Finds the Cluster API version (retrying with a growing delay while the API server cannot be
/// asked, and slowly while Cluster API is not installed, since it may be installed later), then
/// starts the Machine and Cluster watches.
async fn start_cluster_api(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let mut attempt = 0u32;
    let version = loop {
        match capi_version(&client).await {
            Ok(version) => break version,
            Err(why) => {
                attempt = attempt.saturating_add(1);
                let first = ctx.write_index().capi_failed(&why);
                if let Some(dirty) = first {
                    warn!(%why, "MachineHealthChecks cannot be decided yet; Cluster API discovery is retried");
                    ctx.scheduler.mark(dirty);
                }
                let delay = sources::restart_delay(attempt).max(Duration::from_secs(1));
                tokio::time::sleep(delay.min(Duration::from_secs(30))).await;
            }
        }
    };
    info!(version = %version, "Cluster API found");
    for (kind, is_machine) in [("Machine", true), ("Cluster", false)] {
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", &version, kind));
        // Sharded mode keeps only the held shards' objects: a shard taken lists them again.
        let stream = sources::relisting_also_on(
            Api::<WireObject>::all_with(client.clone(), &ar),
            watch_config(CAPI_PAGE),
            ctx.epoch(),
            Some(ctx.capi_relists()),
        );
        if is_machine {
            let counted = ctx.clone();
            let held = ctx.clone();
            tokio::spawn(feed(
                ctx.clone(),
                "Cluster API Machines".into(),
                true,
                stream,
                move |o: WireObject| held.machine_entry(&o.raw),
                move |idx, op| {
                    let dirty = update_machines(idx, op);
                    counted.metrics.cached_machines(idx.machine_count());
                    dirty
                },
                |idx| idx.state_mut(&Source::Machines),
                // NodeHealthChecks too: in sharded mode they may wait for a Machine list.
                Index::all_checks,
            ));
        } else {
            tokio::spawn(feed(
                ctx.clone(),
                "Cluster API Clusters".into(),
                true,
                stream,
                move |o: WireObject| o.raw,
                move |idx, op| match op {
                    Op::Upsert(v) => idx.put_cluster(Some(&v), None),
                    Op::Remove(o) => idx.put_cluster(None, Some(key_of(&o))),
                    Op::Replace(list) => {
                        idx.replace_clusters(list);
                        BTreeSet::new()
                    }
                },
                |idx| idx.state_mut(&Source::Clusters),
                Index::all_mhcs,
            ));
        }
    }
}

/// Applies one Machine watch operation to the indexes (the other shards' Machines are left out
/// by [`Index::put_machine_entry`]); a complete list marks the held shards' Machines listed.
fn update_machines(
    idx: &mut Index,
    op: Op<WireObject, Option<vigil_index::index::MachineEntry>>,
) -> BTreeSet<CheckRef> {
    match op {
        Op::Upsert(entry) => idx.put_machine_entry(entry, None),
        Op::Remove(o) => idx.put_machine_entry(None, Some(key_of(&o))),
        Op::Replace(list) => {
            idx.replace_machines(list);
            BTreeSet::new()
        }
    }
}

/// The Cluster API version the API server serves for Machines (v1beta2 preferred).
pub async fn capi_version(client: &Client) -> Result<String, String> {
    let group = kube::discovery::group(client, "cluster.x-k8s.io").await.map_err(|e| match &e {
        kube::Error::Discovery(_) => {
            format!("Cluster API is not installed (API group cluster.x-k8s.io not found: {e})")
        }
        _ => format!("cannot ask the API server which Cluster API version it serves: {e}"),
    })?;
    let served: Vec<String> = group.versions().map(str::to_string).collect();
    for preferred in ["v1beta2", "v1beta1"] {
        if served.iter().any(|v| v == preferred) {
            return Ok(preferred.to_string());
        }
    }
    Err(format!("Cluster API serves none of v1beta2, v1beta1 (it serves {served:?})"))
}

/// Watches the Nodes of `cluster` through `client`. Each Node is decoded leniently
/// ([`crate::wire`]): a field no rule can read spoils only its own condition, which is reported
/// once in the log and as an event on the Node.
pub fn start_nodes(ctx: &Arc<Context>, cluster: ClusterRef, client: Client) -> tokio::task::JoinHandle<()> {
    let stream = watch(ctx, Api::<WireNode>::all(client));
    let local = cluster.is_local();
    let report_cluster = cluster.clone();
    let cluster = cluster.key();
    let state_cluster = cluster.clone();
    let reporter = ctx.clone();
    let relister = ctx.clone();
    let clock = ctx.clock.clone();
    tokio::spawn(feed(
        ctx.clone(),
        if local { "Nodes".to_string() } else { format!("Nodes of {report_cluster}") },
        local,
        stream,
        move |n: WireNode| {
            let (slim, problems) = crate::wire::slim(&n);
            for p in problems {
                reporter.report_unreadable(&report_cluster, p);
            }
            slim
        },
        move |idx, op| {
            let dirty = match op {
                Op::Upsert(n) => idx.put_node(&cluster, Some(n), None, clock.now()),
                Op::Remove(n) => idx.put_node(&cluster, None, n.metadata.name.clone(), clock.now()),
                Op::Replace(list) => {
                    idx.replace_nodes(&cluster, list);
                    BTreeSet::new()
                }
            };
            if idx.take_capi_relist() {
                relister.relist_capi();
            }
            dirty
        },
        move |idx| idx.state_mut(&Source::Nodes(state_cluster.clone())),
        move |idx| if local { idx.all_checks() } else { idx.all_mhcs() },
    ))
}

/// Watches the objects of a kind a check needs (a template or remediation kind). A kind that
/// discovery cannot resolve is tried again with a growing delay (its objects count as missing
/// meanwhile, so nothing is created from it).
pub async fn watch_kind(ctx: Arc<Context>, group: String, version: String, kind: String, template: bool) {
    let gvk = GroupVersionKind::gvk(&group, &version, &kind);
    let gk = (group.clone(), kind.clone());
    let mut attempt = 0u32;
    let ar = loop {
        match kube::discovery::pinned_kind(&ctx.client, &gvk).await {
            Ok((ar, _)) => break ar,
            Err(e) => {
                attempt = attempt.saturating_add(1);
                let why = format!("{kind}.{group}/{version} is not served by the API server: {e}");
                let dirty = {
                    let mut idx = ctx.write_index();
                    let state = idx.state_mut(&Source::Kind(gk.clone()));
                    let changed = *state != SourceState::Failed(why.clone());
                    *state = SourceState::Failed(why.clone());
                    changed.then(|| idx.all_checks())
                };
                if let Some(dirty) = dirty {
                    warn!(%why, "discovery failed; retried");
                    ctx.scheduler.mark(dirty);
                }
                tokio::time::sleep(sources::restart_delay(attempt).max(Duration::from_secs(1)) * 2).await;
            }
        }
    };
    let stream = watch(&ctx, Api::<DynamicObject>::all_with(ctx.client.clone(), &ar));
    let (gk_update, gk_state) = (gk.clone(), gk.clone());
    feed(
        ctx.clone(),
        format!("{kind}.{group}"),
        true,
        stream,
        |o: DynamicObject| serde_json::to_value(o).unwrap_or(Value::Null),
        move |idx, op| match op {
            Op::Upsert(v) => idx.put_object(&gk_update, template, Some(&v), None),
            Op::Remove(o) => idx.put_object(&gk_update, template, None, Some(key_of(&o))),
            Op::Replace(list) => {
                idx.replace_objects(&gk_update, template, list);
                BTreeSet::new()
            }
        },
        move |idx| idx.state_mut(&Source::Kind(gk_state.clone())),
        Index::all_checks,
    )
    .await;
}
