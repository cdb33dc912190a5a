//! Watches that feed the indexes. A source is trusted only between a complete list (`InitDone`)
//! and the next watch error; while it is not, the checks that read it make no decision and say so.

use crate::Context;
use crate::index::{CheckKey, Index, MANAGEMENT, SourceState};
use crate::reconcile::Need;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use vigil_api::{MachineHealthCheck, MachineHealthCheckSpec, NodeHealthCheck, NodeHealthCheckSpec};

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
/// read the source (woken when its trust changes).
pub async fn feed<K, R, S>(
    ctx: Arc<Context>,
    what: String,
    stream: S,
    reduce: impl Fn(K) -> R + Send,
    update: impl Fn(&mut Index, Op<K, R>) -> BTreeSet<CheckKey> + Send,
    state: impl Fn(&mut Index) -> &mut SourceState + Send,
    dependents: impl Fn(&Index) -> Vec<CheckKey> + Send,
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    R: Send,
{
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
                    info!(source = %what, "synced");
                    dependents(&idx).into_iter().collect()
                }
                Ok(Some(op)) => update(&mut idx, op),
                Err(e) => {
                    let message = e.to_string();
                    let slot = state(&mut idx);
                    let changed = !matches!(slot, SourceState::Failed(m) if *m == message);
                    *slot = SourceState::Failed(message.clone());
                    if changed {
                        warn!(source = %what, error = %message, "watch failed; decisions that need it are suspended");
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
}

fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(500)
}

fn key_of(o: &DynamicObject) -> (String, String) {
    (o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone().unwrap_or_default())
}

/// Reads a health check leniently: a spec that does not parse still yields an object (with an
/// empty spec) and the error, so its status can say what is wrong.
pub(crate) fn read_mhc(o: &DynamicObject) -> (MachineHealthCheck, Option<String>) {
    let value = serde_json::to_value(o).unwrap_or(Value::Null);
    match serde_json::from_value::<MachineHealthCheck>(value.clone()) {
        Ok(c) => (c, None),
        Err(e) => {
            let spec = MachineHealthCheckSpec {
                cluster_name: String::new(),
                selector: Default::default(),
                unhealthy_conditions: Vec::new(),
                unhealthy_machine_conditions: Vec::new(),
                node_startup_timeout: None,
                max_unhealthy: None,
                unhealthy_range: None,
                remediation_template: None,
            };
            let mut c = MachineHealthCheck::new(o.metadata.name.as_deref().unwrap_or(""), spec);
            c.metadata = o.metadata.clone();
            c.status = value.get("status").and_then(|s| serde_json::from_value(s.clone()).ok());
            (c, Some(format!("spec cannot be read: {e}")))
        }
    }
}

pub(crate) fn read_nhc(o: &DynamicObject) -> (NodeHealthCheck, Option<String>) {
    let value = serde_json::to_value(o).unwrap_or(Value::Null);
    match serde_json::from_value::<NodeHealthCheck>(value.clone()) {
        Ok(c) => (c, None),
        Err(e) => {
            let spec = NodeHealthCheckSpec {
                selector: Default::default(),
                unhealthy_conditions: Vec::new(),
                min_healthy: None,
                max_unhealthy: None,
                remediation_template: None,
                escalating_remediations: Vec::new(),
                pause_requests: Vec::new(),
                healthy_delay: None,
                storm_cooldown_duration: None,
            };
            let mut c = NodeHealthCheck::new(o.metadata.name.as_deref().unwrap_or(""), spec);
            c.metadata = o.metadata.clone();
            c.status = value.get("status").and_then(|s| serde_json::from_value(s.clone()).ok());
            (c, Some(format!("spec cannot be read: {e}")))
        }
    }
}

/// Starts the watches every decision needs: both health-check kinds, Cluster API Machines and
/// Clusters (in the version the API server serves, preferring v1beta2), and the Nodes of the
/// cluster Vigil runs in.
pub async fn start_fixed(ctx: &Arc<Context>) {
    let client = ctx.client.clone();
    let mhc_ar = ApiResource::erase::<MachineHealthCheck>(&());
    let nhc_ar = ApiResource::erase::<NodeHealthCheck>(&());
    let mhcs =
        watcher::watcher(Api::<DynamicObject>::all_with(client.clone(), &mhc_ar), watch_config()).default_backoff();
    tokio::spawn(feed(
        ctx.clone(),
        "MachineHealthChecks".into(),
        mhcs,
        |o| (key_of(&o), read_mhc(&o)),
        |idx, op| match op {
            Op::Upsert((key, (check, error))) => {
                match error {
                    Some(e) => idx.mhc_errors.insert(key, e),
                    None => idx.mhc_errors.remove(&key),
                };
                idx.put_mhc(Some(check), None)
            }
            Op::Remove(o) => {
                idx.mhc_errors.remove(&key_of(&o));
                idx.put_mhc(None, Some(key_of(&o)))
            }
            Op::Replace(list) => {
                idx.mhcs.clear();
                idx.mhc_errors.clear();
                for (key, (check, error)) in list {
                    if let Some(e) = error {
                        idx.mhc_errors.insert(key, e);
                    }
                    idx.put_mhc(Some(check), None);
                }
                BTreeSet::new()
            }
        },
        |idx| &mut idx.mhc_state,
        Index::all_mhcs,
    ));
    let nhcs =
        watcher::watcher(Api::<DynamicObject>::all_with(client.clone(), &nhc_ar), watch_config()).default_backoff();
    tokio::spawn(feed(
        ctx.clone(),
        "NodeHealthChecks".into(),
        nhcs,
        |o| (key_of(&o).1, read_nhc(&o)),
        |idx, op| match op {
            Op::Upsert((name, (check, error))) => {
                match error {
                    Some(e) => idx.nhc_errors.insert(name, e),
                    None => idx.nhc_errors.remove(&name),
                };
                idx.put_nhc(Some(check), None)
            }
            Op::Remove(o) => {
                idx.nhc_errors.remove(&key_of(&o).1);
                idx.put_nhc(None, Some(key_of(&o).1))
            }
            Op::Replace(list) => {
                idx.nhcs.clear();
                idx.nhc_errors.clear();
                for (name, (check, error)) in list {
                    if let Some(e) = error {
                        idx.nhc_errors.insert(name, e);
                    }
                    idx.put_nhc(Some(check), None);
                }
                BTreeSet::new()
            }
        },
        |idx| &mut idx.nhc_state,
        Index::all_nhcs,
    ));
    start_nodes(ctx, MANAGEMENT.to_string(), client.clone());
    match capi_version(&client).await {
        Ok(version) => {
            info!(version = %version, "Cluster API found");
            for (kind, is_machine) in [("Machine", true), ("Cluster", false)] {
                let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", &version, kind));
                let stream = watcher::watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), watch_config())
                    .default_backoff();
                let value = |o: &DynamicObject| serde_json::to_value(o).unwrap_or(Value::Null);
                if is_machine {
                    tokio::spawn(feed(
                        ctx.clone(),
                        "Cluster API Machines".into(),
                        stream,
                        move |o| crate::index::machine_entry(&value(&o)),
                        move |idx, op| match op {
                            Op::Upsert(entry) => idx.put_machine_entry(entry, None),
                            Op::Remove(o) => idx.put_machine_entry(None, Some(key_of(&o))),
                            Op::Replace(list) => {
                                idx.machines.clear();
                                idx.machines_by_node.clear();
                                for entry in list {
                                    idx.put_machine_entry(entry, None);
                                }
                                BTreeSet::new()
                            }
                        },
                        |idx| &mut idx.machine_state,
                        Index::all_mhcs,
                    ));
                } else {
                    tokio::spawn(feed(
                        ctx.clone(),
                        "Cluster API Clusters".into(),
                        stream,
                        move |o| value(&o),
                        move |idx, op| match op {
                            Op::Upsert(v) => idx.put_cluster(Some(&v), None),
                            Op::Remove(o) => idx.put_cluster(None, Some(key_of(&o))),
                            Op::Replace(list) => {
                                idx.clusters.clear();
                                for v in list {
                                    idx.put_cluster(Some(&v), None);
                                }
                                BTreeSet::new()
                            }
                        },
                        |idx| &mut idx.cluster_state,
                        Index::all_mhcs,
                    ));
                }
            }
        }
        Err(why) => {
            warn!(%why, "MachineHealthChecks cannot be decided");
            let mut idx = ctx.write_index();
            idx.machine_state = SourceState::Failed(why.clone());
            idx.cluster_state = SourceState::Failed(why);
        }
    }
}

/// The Cluster API version the API server serves for Machines (v1beta2 preferred).
pub async fn capi_version(client: &Client) -> Result<String, String> {
    let group = kube::discovery::group(client, "cluster.x-k8s.io")
        .await
        .map_err(|e| format!("Cluster API is not installed (API group cluster.x-k8s.io not found: {e})"))?;
    let served: Vec<String> = group.versions().map(str::to_string).collect();
    for preferred in ["v1beta2", "v1beta1"] {
        if served.iter().any(|v| v == preferred) {
            return Ok(preferred.to_string());
        }
    }
    Err(format!("Cluster API serves none of v1beta2, v1beta1 (it serves {served:?})"))
}

/// Watches the Nodes of `cluster` through `client`.
pub fn start_nodes(ctx: &Arc<Context>, cluster: String, client: Client) -> tokio::task::JoinHandle<()> {
    let stream = watcher::watcher(Api::<Node>::all(client), watch_config()).default_backoff();
    let state_cluster = cluster.clone();
    let dep_cluster = cluster.clone();
    tokio::spawn(feed(
        ctx.clone(),
        if cluster.is_empty() { "Nodes".to_string() } else { format!("Nodes of workload cluster {cluster}") },
        stream,
        |n: Node| crate::index::slim_node(&n),
        move |idx, op| match op {
            Op::Upsert(n) => idx.put_node(&cluster, Some(n), None),
            Op::Remove(n) => idx.put_node(&cluster, None, n.metadata.name.clone()),
            Op::Replace(list) => {
                let cache = idx.nodes.entry(cluster.clone()).or_default();
                cache.nodes =
                    list.into_iter().filter_map(|n| n.metadata.name.clone().map(|name| (name, Arc::new(n)))).collect();
                BTreeSet::new()
            }
        },
        move |idx| &mut idx.nodes.entry(state_cluster.clone()).or_default().state,
        move |idx| if dep_cluster.is_empty() { idx.all_checks() } else { idx.all_mhcs() },
    ))
}

/// Starts what a check needs, once.
pub async fn ensure(ctx: &Arc<Context>, need: Need) {
    if !ctx.started.lock().await.insert(need.clone()) {
        return;
    }
    match need {
        Need::Kind { group, version, kind, template } => {
            let gvk = GroupVersionKind::gvk(&group, &version, &kind);
            let gk = (group.clone(), kind.clone());
            match kube::discovery::pinned_kind(&ctx.client, &gvk).await {
                Ok((ar, _)) => {
                    let stream =
                        watcher::watcher(Api::<DynamicObject>::all_with(ctx.client.clone(), &ar), watch_config())
                            .default_backoff();
                    let (gk_update, gk_state) = (gk.clone(), gk.clone());
                    tokio::spawn(feed(
                        ctx.clone(),
                        format!("{kind}.{group}"),
                        stream,
                        |o: DynamicObject| serde_json::to_value(o).unwrap_or(Value::Null),
                        move |idx, op| match op {
                            Op::Upsert(v) => idx.put_object(&gk_update, template, Some(&v), None),
                            Op::Remove(o) => idx.put_object(&gk_update, template, None, Some(key_of(&o))),
                            Op::Replace(list) => {
                                let cache = idx.objects.entry(gk_update.clone()).or_default();
                                cache.remediations.clear();
                                cache.templates.clear();
                                for v in list {
                                    idx.put_object(&gk_update, template, Some(&v), None);
                                }
                                BTreeSet::new()
                            }
                        },
                        move |idx| &mut idx.objects.entry(gk_state.clone()).or_default().state,
                        Index::all_checks,
                    ));
                }
                Err(e) => {
                    let mut idx = ctx.write_index();
                    idx.objects.entry(gk).or_default().state =
                        SourceState::Failed(format!("{kind}.{group}/{version} is not served by the API server: {e}"));
                    let all = idx.all_checks();
                    drop(idx);
                    ctx.scheduler.mark(all);
                }
            }
        }
        Need::WorkloadCluster(namespace, cluster) => {
            let ctx = ctx.clone();
            tokio::spawn(async move { workload_cluster(ctx, namespace, cluster).await });
        }
    }
}

/// Keeps a Node watch on a workload cluster, connected through the Secret
/// `<cluster>-kubeconfig` (key `value`) as Cluster API stores it. While the Secret is missing or
/// the cluster cannot be reached, its Nodes are marked untrusted and the checks make no decision;
/// the connection is retried with a growing delay (1 s to 60 s) — the only retry loop in Vigil,
/// and it never decides anything.
async fn workload_cluster(ctx: Arc<Context>, namespace: String, cluster: String) {
    let key = format!("{namespace}/{cluster}");
    let secret_name = format!("{cluster}-kubeconfig");
    let mut delay = Duration::from_secs(1);
    loop {
        let client = match connect(&ctx.client, &namespace, &secret_name).await {
            Ok(c) => c,
            Err(why) => {
                let changed = {
                    let mut idx = ctx.write_index();
                    let cache = idx.nodes.entry(key.clone()).or_default();
                    let changed = cache.state != SourceState::Failed(why.clone());
                    cache.state = SourceState::Failed(why.clone());
                    cache.nodes.clear();
                    changed.then(|| idx.all_mhcs())
                };
                if let Some(dirty) = changed {
                    warn!(cluster = %key, %why, "workload cluster unreachable");
                    ctx.scheduler.mark(dirty);
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
                continue;
            }
        };
        delay = Duration::from_secs(1);
        let handle = start_nodes(&ctx, key.clone(), client);
        // The watch retries by itself; a changed Secret (rotated credentials) restarts it.
        let connected_with = secret_version(&ctx.client, &namespace, &secret_name).await;
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            if handle.is_finished() || secret_version(&ctx.client, &namespace, &secret_name).await != connected_with {
                break;
            }
        }
        handle.abort();
    }
}

async fn secret_version(client: &Client, namespace: &str, name: &str) -> Option<String> {
    Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.metadata.resource_version)
}

/// A client for a workload cluster from its kubeconfig Secret.
pub async fn connect(client: &Client, namespace: &str, name: &str) -> Result<Client, String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot read Secret {namespace}/{name}: {e}"))?
        .ok_or_else(|| format!("Secret {namespace}/{name} not found"))?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .ok_or_else(|| format!("Secret {namespace}/{name} has no key \"value\""))?;
    let text = std::str::from_utf8(&value.0).map_err(|_| format!("Secret {namespace}/{name}: value is not UTF-8"))?;
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| format!("Secret {namespace}/{name}: not a kubeconfig: {e}"))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("Secret {namespace}/{name}: unusable kubeconfig: {e}"))?;
    Client::try_from(config).map_err(|e| format!("Secret {namespace}/{name}: {e}"))
}
