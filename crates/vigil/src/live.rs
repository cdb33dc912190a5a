//! Reads the live cluster once, with get and list requests only, into the objects of a scenario:
//! what `vigil check` evaluates and `vigil snapshot` writes. Nothing here can write.
//!
//! It reads what the controller reads: Vigil's health checks, Cluster API Clusters and Machines
//! (the version the API server prefers), Nodes, the templates the checks name and the
//! remediation objects made from them, and each MachineHealthCheck's workload cluster through
//! its `<clusterName>-kubeconfig` Secret. Secrets themselves are never part of the result.

use anyhow::{Context, Result};
use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, discovery};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use vigil_api::api_version::ApiVersion;
use vigil_api::manifest::{HealthCheck, health_check_from_value};
use vigil_api::validate::{self, TemplateRef};

/// Page size of list requests, so a 10 000-Node cluster is read in pieces.
const PAGE: u32 = 500;
/// Workload clusters read at once.
const WORKLOAD_READS: usize = 4;
/// The annotation `kubectl apply` keeps a copy of the whole object in; noise in a scenario.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What was read: the objects of the management cluster, the Nodes of each workload cluster
/// reached, and why the others could not be reached. All but the health checks are kept as their
/// compact JSON text: as trees, a 10 000-Node fleet's objects took 450 MiB, as text a sixth.
#[derive(Debug, Default)]
pub struct Fleet {
    /// The health checks, whole (they name what else is read, and `vigil check` sets candidates
    /// in their place).
    pub checks: Vec<Value>,
    /// Clusters, Machines, Nodes, templates, remediation objects and what is read around Nodes.
    pub objects: Vec<Box<RawValue>>,
    /// Nodes of each workload cluster, keyed `namespace/clusterName`.
    pub workload_clusters: BTreeMap<String, Vec<Box<RawValue>>>,
    /// Workload clusters that could not be read, keyed `namespace/clusterName`, with why.
    pub unreachable: BTreeMap<String, String>,
    /// Things left out, for stderr (a kind not served, a template not found…).
    pub notes: Vec<String>,
    /// Where the medik8s node Leases were read (`LEASE_NAMESPACE`, else `medik8s-leases`).
    pub lease_namespace: String,
}

/// A client from a kubeconfig file, or `KUBECONFIG`, `~/.kube/config`, or in-cluster.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("unusable kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("no kubeconfig and not running in a cluster")?,
    };
    kube::Client::try_from(config).context("cannot build a Kubernetes client")
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// One page of a list, read straight into JSON: only the items and where the next page starts.
#[derive(serde::Deserialize)]
struct Page {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default)]
    items: Vec<Value>,
}

/// The part of a list's metadata a paged read needs.
#[derive(serde::Deserialize, Default)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

/// Lists every object of a resource (all namespaces, or one), page by page, each with its
/// apiVersion and kind set (list items may omit them) and cleaned for a scenario, handing each to
/// `each`. The pages are read as JSON directly: a typed object read and written back as JSON
/// cost as much as the read.
async fn list_each(
    client: &Client,
    ar: &ApiResource,
    namespace: Option<&str>,
    purpose: Purpose,
    mut each: impl FnMut(Value) -> Result<(), kube::Error>,
) -> Result<(), kube::Error> {
    let request = kube::core::Request::new(<DynamicObject as kube::Resource>::url_path(ar, namespace));
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page: Page = client.request(request.list(&params).map_err(kube::Error::BuildRequest)?).await?;
        for mut item in page.items {
            item["apiVersion"] = json!(ar.api_version);
            item["kind"] = json!(ar.kind);
            each(clean(item, purpose))?;
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

/// [`list_each`] into trees: for the health checks, a few objects read whole.
async fn list(
    client: &Client,
    ar: &ApiResource,
    namespace: Option<&str>,
    purpose: Purpose,
) -> Result<Vec<Value>, kube::Error> {
    let mut out = Vec::new();
    list_each(client, ar, namespace, purpose, |item| {
        out.push(item);
        Ok(())
    })
    .await?;
    Ok(out)
}

/// [`list_each`] into compact JSON text: each page's trees are let go before the next is read.
async fn list_packed(
    client: &Client,
    ar: &ApiResource,
    namespace: Option<&str>,
    purpose: Purpose,
) -> Result<Vec<Box<RawValue>>, kube::Error> {
    let mut out = Vec::new();
    list_each(client, ar, namespace, purpose, |item| {
        out.push(pack(&item)?);
        Ok(())
    })
    .await?;
    Ok(out)
}

/// An object as its compact JSON text.
fn pack(object: &Value) -> Result<Box<RawValue>, kube::Error> {
    serde_json::value::to_raw_value(object).map_err(kube::Error::SerdeError)
}

/// Drops what the API server keeps for itself (managed fields, resource versions) and, for
/// Nodes, everything of the status but the conditions (images, addresses, capacity): the
/// rules read labels, annotations and conditions only, and a 10 000-Node snapshot stays small.
/// A check keeps of a Node only what the rules read ([`vigil_api::node_view::retain_read`]).
pub(crate) fn clean(mut v: Value, purpose: Purpose) -> Value {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["managedFields", "resourceVersion", "selfLink", "generation"] {
            meta.remove(field);
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(LAST_APPLIED);
            if annotations.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    if v["kind"] == "Node" && v["apiVersion"] == "v1" {
        // The conditions are moved out, not copied: 20 000 Nodes are cleaned for a check.
        if let Some(o) = v.as_object_mut() {
            match o.get_mut("status").and_then(|s| s.get_mut("conditions")).map(Value::take) {
                Some(conditions) => {
                    o.insert(
                        "status".into(),
                        Value::Object([("conditions".to_string(), conditions)].into_iter().collect()),
                    );
                }
                None => {
                    o.remove("status");
                }
            }
        }
        if purpose == Purpose::Check {
            vigil_api::node_view::retain_read(&mut v);
        }
    }
    v
}

/// Cluster API's Clusters and Machines in the version the API server prefers, with what was
/// left out (`None`: Cluster API is not served).
async fn read_capi(client: &Client, namespace: Option<&str>, purpose: Purpose) -> Result<Option<CapiRead>> {
    let group = match discovery::group(client, "cluster.x-k8s.io").await {
        Ok(group) => group,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(e).context("cannot discover Cluster API (cluster.x-k8s.io)"),
    };
    let mut notes = Vec::new();
    let mut read_kind = async |kind: &str| -> Result<Vec<Box<RawValue>>> {
        match group.recommended_kind(kind) {
            Some((ar, _)) => {
                list_packed(client, &ar, namespace, purpose).await.with_context(|| format!("cannot list {kind}s"))
            }
            None => {
                notes.push(format!("cluster.x-k8s.io serves no {kind}: none read"));
                Ok(Vec::new())
            }
        }
    };
    let clusters = read_kind("Cluster").await?;
    let machines = read_kind("Machine").await?;
    Ok(Some((clusters, machines, notes)))
}

/// Clusters, Machines, and what was left out.
type CapiRead = (Vec<Box<RawValue>>, Vec<Box<RawValue>>, Vec<String>);

/// Whether an error says the API server does not serve what was asked (a group discovery does
/// not list, a kind or resource it does not have, or a 404): that is "not served", not a failure.
fn not_found(e: &kube::Error) -> bool {
    use kube::error::DiscoveryError;
    match e {
        kube::Error::Api(s) => s.code == 404,
        kube::Error::Discovery(d) => matches!(
            d,
            DiscoveryError::MissingApiGroup(_)
                | DiscoveryError::MissingKind(_)
                | DiscoveryError::MissingResource(_)
                | DiscoveryError::EmptyApiGroup(_)
        ),
        _ => false,
    }
}

/// What a read is for: a snapshot keeps everything a later simulation may use; a check reads
/// what its verdicts read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `vigil snapshot`: every kind read, the management cluster's Nodes too.
    Snapshot,
    /// `vigil check`: the management cluster's Nodes only when a NodeHealthCheck reads them
    /// (a MachineHealthCheck reads its workload cluster's Nodes; on a fleet without
    /// NodeHealthChecks they were a third of what was read and held).
    Check,
}

/// What the health checks name: their templates, their workload clusters, and whether any is a
/// NodeHealthCheck (which reads the management cluster's Nodes).
#[derive(Default)]
struct Named {
    templates: BTreeSet<TemplateRef>,
    workload: BTreeSet<(String, String)>,
    node_checks: bool,
}

impl Named {
    fn of<'a>(checks: impl Iterator<Item = &'a Value>) -> Named {
        let mut named = Named::default();
        for check in checks {
            match health_check_from_value(check) {
                Ok(HealthCheck::Machine(m)) => {
                    if let Ok(policy) = validate::machine_health_check(&m) {
                        let ns = m.metadata.namespace.clone().unwrap_or_default();
                        named.workload.insert((ns, policy.cluster_name.clone()));
                        named.templates.extend(policy.templates().into_iter().cloned());
                    }
                }
                Ok(HealthCheck::Node(n)) => {
                    named.node_checks = true;
                    if let Ok(policy) = validate::node_health_check(&n) {
                        named.templates.extend(policy.all_steps().map(|s| s.template.clone()));
                    }
                }
                Err(_) => {}
            }
        }
        named
    }
}

/// Reads the fleet. `namespace` limits the MachineHealthChecks, Clusters and Machines read;
/// NodeHealthChecks and Nodes are cluster-wide. The templates and workload clusters of
/// `candidates` (checks not applied yet) are read too; they are not added.
pub async fn read(client: &Client, namespace: Option<&str>, candidates: &[Value], purpose: Purpose) -> Result<Fleet> {
    let mut fleet = Fleet::default();
    let mhc = resource(vigil_api::GROUP, "v1alpha1", "MachineHealthCheck", "machinehealthchecks");
    let nhc = resource(vigil_api::GROUP, "v1alpha1", "NodeHealthCheck", "nodehealthchecks");
    // The checks first (a few objects): they name the workload clusters and templates to read.
    let (mhcs, nhcs) = tokio::try_join!(
        async {
            list(client, &mhc, namespace, purpose).await.with_context(|| {
                "cannot list MachineHealthChecks (vigil.dev/v1alpha1); are Vigil's CRDs installed (kubectl apply -f deploy/crds/)?"
            })
        },
        async { list(client, &nhc, None, purpose).await.context("cannot list NodeHealthChecks (vigil.dev/v1alpha1)") },
    )?;
    let named = Named::of(mhcs.iter().chain(&nhcs).chain(candidates));
    let management_nodes = purpose == Purpose::Snapshot || named.node_checks;
    // The rest is independent, and the Machines and each cluster's Nodes are most of the time at
    // 10 000 targets: all of it is read at once (a list is no more consistent with the next one
    // read after it).
    let (capi, nodes, workload, templates, around) = tokio::try_join!(
        read_capi(client, namespace, purpose),
        async {
            match management_nodes {
                true => {
                    let nodes = resource("", "v1", "Node", "nodes");
                    list_packed(client, &nodes, None, purpose).await.context("cannot list Nodes")
                }
                false => Ok(Vec::new()),
            }
        },
        async { Ok(read_workload(client, named.workload, purpose, management_nodes).await) },
        read_templates(client, &named.templates, purpose),
        read_around(client, purpose),
    )?;
    let (clusters, machines) = match capi {
        Some((clusters, machines, notes)) => {
            fleet.notes.extend(notes);
            (clusters, machines)
        }
        None => {
            if !mhcs.is_empty() {
                fleet.notes.push("Cluster API (cluster.x-k8s.io) is not served: no Clusters or Machines read".into());
            }
            (Vec::new(), Vec::new())
        }
    };
    for (key, read) in workload {
        match read {
            Ok(Some(nodes)) => {
                fleet.workload_clusters.insert(key, nodes);
            }
            // Self-hosted: its Nodes are the management cluster's, read once.
            Ok(None) => {}
            Err(why) => {
                fleet.unreachable.insert(key, why);
            }
        }
    }
    let (template_objects, remediations, notes) = templates;
    fleet.notes.extend(notes);
    let (around, notes, lease_namespace) = around;
    fleet.notes.extend(notes);
    fleet.lease_namespace = lease_namespace;
    fleet.checks = [mhcs, nhcs].concat();
    fleet.objects = [clusters, machines, nodes, template_objects, remediations, around].concat();
    Ok(fleet)
}

/// The Nodes of each workload cluster (keyed `namespace/clusterName`), or why it could not be
/// read. Each is its own API server: they are read a few at a time. For a check that reads the
/// management cluster's Nodes anyway (`management_nodes`), a self-hosted workload cluster whose
/// own credentials may list Nodes is not read again (`None`): the management cluster's Nodes
/// serve it, as in the controller. A snapshot keeps each cluster's Nodes apart.
async fn read_workload(
    client: &Client,
    clusters: BTreeSet<(String, String)>,
    purpose: Purpose,
    management_nodes: bool,
) -> Vec<(String, Result<Option<Vec<Box<RawValue>>>, String>)> {
    let node = resource("", "v1", "Node", "nodes");
    futures::stream::iter(clusters)
        .map(|(ns, cluster)| {
            let node = &node;
            async move {
                let key = format!("{ns}/{cluster}");
                let secret = format!("{cluster}-kubeconfig");
                let read = match vigil_controller::workload::connect(client, &ns, &secret).await {
                    Ok(workload_client)
                        if purpose == Purpose::Check
                            && management_nodes
                            && vigil_controller::workload::shares_management_nodes(client, &workload_client).await =>
                    {
                        Ok(None)
                    }
                    Ok(workload_client) => list_packed(&workload_client, node, None, purpose)
                        .await
                        .map(Some)
                        .map_err(|e| format!("cannot list its Nodes: {e}")),
                    Err(why) => Err(why),
                };
                (key, read)
            }
        })
        .buffer_unordered(WORKLOAD_READS)
        .collect()
        .await
}

/// The templates the checks name, the remediation objects of their kinds, and what was left out.
type TemplatesRead = (Vec<Box<RawValue>>, Vec<Box<RawValue>>, Vec<String>);

/// Reads the templates and the remediation objects made from them (of the templates' kinds, in
/// the templates' namespaces).
async fn read_templates(client: &Client, templates: &BTreeSet<TemplateRef>, purpose: Purpose) -> Result<TemplatesRead> {
    let mut notes = Vec::new();
    let mut template_objects = Vec::new();
    let mut remediation_kinds: BTreeSet<(String, String, String)> = BTreeSet::new();
    for t in templates {
        let ApiVersion { group, version } = ApiVersion::parse(&t.api_version);
        match discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, &t.kind)).await {
            Ok((ar, _)) => {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &t.namespace, &ar);
                match api.get_opt(&t.name).await.with_context(|| format!("cannot read {t}"))? {
                    Some(o) => {
                        let mut v = serde_json::to_value(o)?;
                        v["apiVersion"] = json!(ar.api_version);
                        v["kind"] = json!(ar.kind);
                        template_objects.push(pack(&clean(v, purpose))?);
                    }
                    None => notes.push(format!("{t} not found")),
                }
            }
            Err(e) => notes.push(format!("{} {} is not served ({e}): {t} not read", t.api_version, t.kind)),
        }
        remediation_kinds.insert((t.api_version.clone(), t.remediation_kind().to_string(), t.namespace.clone()));
    }
    let mut remediations = Vec::new();
    for (api_version, kind, ns) in &remediation_kinds {
        let ApiVersion { group, version } = ApiVersion::parse(api_version);
        match discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await {
            Ok((ar, _)) => remediations.extend(
                list_packed(client, &ar, Some(ns), purpose)
                    .await
                    .with_context(|| format!("cannot list {kind} in {ns}"))?,
            ),
            Err(e) => notes.push(format!("{api_version} {kind} is not served ({e}): none read")),
        }
    }
    Ok((template_objects, remediations, notes))
}

/// What was read around the Nodes, what was left out, and the Lease namespace read.
type AroundRead = (Vec<Box<RawValue>>, Vec<String>, String);

/// What NodeHealthChecks read around their Nodes: the medik8s node Leases, and where served,
/// NodeMaintenances, OpenShift ClusterVersions and OpenShift Machines (their Nodes' remediation
/// objects' owners). A Lease list that fails is said (what
/// `vigil check` tells would then ignore who else holds a Node).
async fn read_around(client: &Client, purpose: Purpose) -> Result<AroundRead> {
    let lease_namespace = vigil_controller::surroundings::default_lease_namespace();
    let mut notes = Vec::new();
    let leases = resource("coordination.k8s.io", "v1", "Lease", "leases");
    let mut out = match list_packed(client, &leases, Some(&lease_namespace), purpose).await {
        Ok(list) => list,
        Err(e) => {
            notes.push(format!(
                "cannot list the node Leases in {lease_namespace} ({e}): what is said below ignores who else holds a Node"
            ));
            Vec::new()
        }
    };
    for (group, version, kind) in [
        ("nodemaintenance.medik8s.io", "v1beta1", "NodeMaintenance"),
        ("config.openshift.io", "v1", "ClusterVersion"),
        ("machine.openshift.io", "v1beta1", "Machine"),
    ] {
        // Not served: there are none (the engine reads it so).
        if let Ok((ar, _)) = discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await {
            out.extend(list_packed(client, &ar, None, purpose).await.with_context(|| format!("cannot list {kind}s"))?);
        }
    }
    Ok((out, notes, lease_namespace))
}

#[cfg(test)]
impl Fleet {
    /// A fleet of these management-cluster objects, health checks set apart as a read does.
    pub(crate) fn of(objects: Vec<Value>) -> Fleet {
        let (checks, rest): (Vec<Value>, Vec<Value>) =
            objects.into_iter().partition(|o| o["kind"] == "MachineHealthCheck" || o["kind"] == "NodeHealthCheck");
        Fleet { checks, objects: packed(rest), ..Fleet::default() }
    }
}

/// `objects` as a read keeps them.
#[cfg(test)]
pub(crate) fn packed(objects: Vec<Value>) -> Vec<Box<RawValue>> {
    objects.iter().map(|o| serde_json::value::to_raw_value(o).expect("JSON")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_keeps_what_the_rules_read_and_drops_server_bookkeeping() {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "7", "managedFields": [{}], "labels": {"zone": "b"},
                         "annotations": {LAST_APPLIED: "{}"}},
            "status": {"images": [{"names": ["x"]}], "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            clean(node.clone(), Purpose::Snapshot),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "b"}},
                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
        let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "annotations": {"a": "b"}}, "status": {"nodeRef": {"name": "n1"}}});
        let bare = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}, "status": {"images": []}});
        assert_eq!(
            clean(bare, Purpose::Snapshot),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}}),
            "a Node without conditions keeps no status"
        );
        assert_eq!(clean(machine.clone(), Purpose::Snapshot), machine, "only Nodes lose status fields");
        assert_eq!(clean(machine.clone(), Purpose::Check), machine, "only Nodes lose fields");
    }

    /// A check keeps of a Node what the rules read: it reads as the whole Node, with less held.
    #[test]
    fn clean_for_a_check_keeps_what_the_rules_read_of_a_node() {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u", "labels": {"zone": "b"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         vigil_api::well_known::MANUALLY_CONFIRMED_HEALTHY_ANNOTATION: "yes"}},
            "spec": {"providerID": "aws:///i-1", "unschedulable": true,
                     "taints": [{"key": vigil_api::well_known::MEDIK8S_DRAIN_TAINT, "effect": "NoSchedule"}]},
            "status": {"images": [{"names": ["x"]}], "conditions": [
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "PLEG is not healthy",
                 "lastTransitionTime": "2030-01-01T00:00:00Z", "lastHeartbeatTime": "2030-01-01T00:00:10Z"}]}});
        let snapshot = clean(node.clone(), Purpose::Snapshot);
        let check = clean(node.clone(), Purpose::Check);
        let read = vigil_api::views::NodeView::read;
        assert!(read(&node).is_some_and(|v| v.unschedulable && v.annotations.len() == 1 && !v.conditions.is_empty()));
        assert_eq!(read(&check), read(&node));
        assert_eq!(read(&snapshot), read(&node));
        assert_eq!(check.pointer("/spec/providerID"), None);
        assert_eq!(check.pointer("/status/conditions/0/message"), None);
        assert_eq!(
            snapshot.pointer("/status/conditions/0/message"),
            node.pointer("/status/conditions/0/message"),
            "a snapshot keeps the messages"
        );
    }

    #[test]
    fn a_group_or_kind_the_api_server_does_not_serve_is_not_found() {
        use kube::error::DiscoveryError;
        let missing = kube::Error::Discovery(DiscoveryError::MissingApiGroup("cluster.x-k8s.io".into()));
        assert!(not_found(&missing));
        assert!(not_found(&kube::Error::Discovery(DiscoveryError::MissingKind("Machine".into()))));
        let gone = kube::Error::Api(Box::new(kube::core::Status { code: 404, ..Default::default() }));
        assert!(not_found(&gone));
        let refused = kube::Error::Api(Box::new(kube::core::Status { code: 403, ..Default::default() }));
        assert!(!not_found(&refused), "a refusal is an error, not an absence");
    }
}
