//! What NodeHealthCheck decisions read beyond Nodes and remediation objects: the node Leases of
//! the lease namespace (medik8s' `node-<name>`, taken before a Node is remediated), medik8s
//! `NodeMaintenance`s, OpenShift `ClusterVersion`s and OpenShift Machine API `Machine`s (the owners
//! of their Nodes' remediation objects). The last three are read only where the API server
//! serves them: discovery is asked again every [`DISCOVERY_PERIOD`], so a kind installed
//! (or removed) later is noticed, and a kind not served counts as "none", a fact, while a served
//! kind not listed yet counts as unknown (the engine then starts nothing new).

pub use vigil_index::around::{Around, Kept, default_lease_namespace};

use crate::context::Context;
use crate::watch::{Op, feed};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use vigil_api::views::{ClusterVersionView, LeaseView, MaintenanceView, OpenShiftMachineView};
use vigil_engine::target::CheckRef;
use vigil_index::index::{Index, Source};

/// How often discovery is asked whether an optional kind is served.
pub const DISCOVERY_PERIOD: Duration = Duration::from_secs(60);

/// An optional kind: its group, version and kind, and what it is called in messages.
struct OptionalKind {
    gvk: GroupVersionKind,
    what: &'static str,
}

/// Starts the watch of the lease namespace's Leases (after making sure the namespace exists,
/// as medik8s' lease manager does) and the discovery loops of the optional kinds.
pub async fn start(ctx: &Arc<Context>) {
    let namespace = ctx.read_index().around().lease_namespace().to_string();
    tokio::spawn(keep_namespace(ctx.clone(), namespace.clone()));
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &namespace);
    let stream = crate::sources::relisting(api, kube::runtime::watcher::Config::default(), ctx.epoch());
    tokio::spawn(feed(
        ctx.clone(),
        format!("Leases in {namespace}"),
        true,
        stream,
        |l: Lease| serde_json::to_value(&l).ok().and_then(|v| LeaseView::read(&v)),
        |idx: &mut Index, op| {
            let (name, new) = match op {
                Op::Upsert(Some(l)) => (l.meta.name.clone(), Some(l)),
                Op::Upsert(None) => return BTreeSet::new(),
                Op::Remove(l) => (l.metadata.name.unwrap_or_default(), None),
                Op::Replace(list) => {
                    idx.replace_leases(list.into_iter().flatten());
                    return BTreeSet::new();
                }
            };
            idx.put_lease(name, new)
        },
        |idx| idx.state_mut(&Source::Leases),
        Index::all_nhcs,
    ));
    let maintenance = OptionalKind {
        gvk: GroupVersionKind::gvk("nodemaintenance.medik8s.io", "v1beta1", "NodeMaintenance"),
        what: "NodeMaintenances",
    };
    tokio::spawn(optional(ctx.clone(), maintenance, Around::maintenances, MaintenanceView::read));
    let versions = OptionalKind {
        gvk: GroupVersionKind::gvk("config.openshift.io", "v1", "ClusterVersion"),
        what: "ClusterVersions",
    };
    tokio::spawn(optional(ctx.clone(), versions, Around::cluster_versions, ClusterVersionView::read));
    let machines = OptionalKind {
        gvk: GroupVersionKind::gvk("machine.openshift.io", "v1beta1", "Machine"),
        what: "OpenShift Machines",
    };
    tokio::spawn(optional(ctx.clone(), machines, Around::openshift_machines, OpenShiftMachineView::read));
}

/// Makes sure the lease namespace exists, asking again (1 s, doubling up to a minute) until it
/// does: started while the API server cannot be reached, the controller would otherwise never
/// create it, and no Node Lease (so no NodeHealthCheck remediation) could ever be taken.
async fn keep_namespace(ctx: Arc<Context>, namespace: String) {
    let mut pause = Duration::from_secs(1);
    while !ensure_namespace(&ctx, &namespace).await {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

/// Creates the lease namespace when it does not exist; whether it exists now. When it cannot
/// be created (no right to), the Lease writes fail and no remediation starts: the log says why.
async fn ensure_namespace(ctx: &Context, namespace: &str) -> bool {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    match api.get_opt(namespace).await {
        Ok(Some(_)) => true,
        Ok(None) => {
            let ns: Namespace = match serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})) {
                Ok(ns) => ns,
                Err(_) => return false,
            };
            match ctx.writer.create_namespace(&ns).await {
                Ok(true) => {
                    info!(%namespace, "created the lease namespace");
                    true
                }
                Ok(false) => true,
                Err(e) => {
                    warn!(%namespace, error = %e, "cannot create the lease namespace; no Node Lease can be taken, so no NodeHealthCheck remediation starts");
                    false
                }
            }
        }
        Err(e) => {
            warn!(%namespace, error = %e, "cannot read the lease namespace; asked again");
            false
        }
    }
}

/// Whether the API server serves `gvk`: `Some(false)` when it says it does not, `None` when it
/// cannot be asked.
async fn served(client: &kube::Client, gvk: &GroupVersionKind) -> Option<bool> {
    match kube::discovery::pinned_kind(client, gvk).await {
        Ok(_) => Some(true),
        Err(kube::Error::Discovery(_)) => Some(false),
        Err(kube::Error::Api(s)) if s.code == 404 => Some(false),
        Err(_) => None,
    }
}

/// Watches an optional kind while it is served: discovery every [`DISCOVERY_PERIOD`] starts the
/// watch when the kind appears and stops it (the objects forgotten) when it goes.
async fn optional<V: Send + Sync + 'static>(
    ctx: Arc<Context>,
    kind: OptionalKind,
    around: fn(&mut Around) -> &mut Kept<V>,
    read: fn(&Value) -> Option<V>,
) {
    let mut watching: Option<tokio::task::JoinHandle<()>> = None;
    // While discovery cannot answer, the NodeHealthChecks wait on it: asked again soon (1 s,
    // doubling up to the period), not a whole period later.
    let mut unanswered = Duration::from_secs(1);
    loop {
        let answer = served(&ctx.client, &kind.gvk).await;
        let changed = {
            let mut idx = ctx.write_index();
            idx.surrounding_mut(around).discovered(answer)
        };
        match (answer, &watching) {
            (Some(true), None) => {
                info!(kind = %kind.gvk.kind, "served: watching it");
                let ar = ApiResource::from_gvk(&kind.gvk);
                let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &ar);
                let stream = crate::sources::relisting(api, kube::runtime::watcher::Config::default(), ctx.epoch());
                watching = Some(tokio::spawn(feed(
                    ctx.clone(),
                    kind.what.to_string(),
                    false,
                    stream,
                    move |o: DynamicObject| {
                        serde_json::to_value(&o).ok().and_then(|v| read(&v)).map(|v| (name_of(&o), v))
                    },
                    move |idx: &mut Index, op| match op {
                        Op::Upsert(Some((name, v))) => idx.put_surrounding(around, name, Some(v)),
                        Op::Upsert(None) => BTreeSet::new(),
                        Op::Remove(o) => idx.put_surrounding(around, name_of(&o), None),
                        Op::Replace(list) => {
                            idx.surrounding_mut(around).replace(list.into_iter().flatten());
                            idx.all_nhcs().into_iter().collect::<BTreeSet<CheckRef>>()
                        }
                    },
                    move |idx| idx.surrounding_mut(around).state_mut(),
                    Index::all_nhcs,
                )));
            }
            (Some(false), Some(handle)) => {
                info!(kind = %kind.gvk.kind, "no longer served");
                handle.abort();
                watching = None;
            }
            _ => {}
        }
        if changed {
            let dirty = ctx.read_index().all_nhcs();
            ctx.scheduler.mark(dirty);
        }
        let pause = match answer {
            Some(_) => {
                unanswered = Duration::from_secs(1);
                DISCOVERY_PERIOD
            }
            None => {
                let pause = unanswered;
                unanswered = (unanswered * 2).min(DISCOVERY_PERIOD);
                pause
            }
        };
        tokio::time::sleep(pause).await;
    }
}

fn name_of(o: &DynamicObject) -> String {
    let m = &o.metadata;
    match &m.namespace {
        Some(ns) => format!("{ns}/{}", m.name.as_deref().unwrap_or("")),
        None => m.name.clone().unwrap_or_default(),
    }
}
