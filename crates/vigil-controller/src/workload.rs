//! Connections to workload clusters through the kubeconfig Secrets Cluster API keeps
//! (`<cluster>-kubeconfig`, key `value`).
//!
//! Such a Secret is written by whoever can write Secrets in the Cluster's namespace: a tenant.
//! Its kubeconfig is hostile input. Only inline credentials are used (a token, a client
//! certificate and key as data, CA data); anything that would make Vigil run a program or read a
//! file of its own machine (`exec`, `auth-provider`, `tokenFile`, `client-certificate`,
//! `client-key`, `certificate-authority`) is refused before anything else is done, and so is a
//! proxy. The Secret is read only while the Cluster it belongs to exists in the check's namespace.

use crate::context::Context;
use crate::sources::SourceState;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{AuthInfo, Cluster, Context as KubeContext, KubeConfigOptions, Kubeconfig, NamedAuthInfo};
use kube::config::{NamedCluster, NamedContext};
use kube::{Client, Config};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use vigil_index::index::{Source, WorkloadCluster};
use vigil_index::sources::ClusterRef;

/// How often a connected cluster's Secret is looked at again (rotated credentials).
const SECRET_RECHECK: Duration = Duration::from_secs(30);
/// How often a check whose Cluster does not exist looks again.
const CLUSTER_RECHECK: Duration = Duration::from_secs(2);

/// The kubeconfig in `text` reduced to one cluster and one user with inline credentials only,
/// or why it is refused (naming the field). `secret` names the Secret in messages.
pub fn sanitize(text: &str, secret: &str) -> Result<Kubeconfig, String> {
    let kc = Kubeconfig::from_yaml(text).map_err(|e| format!("Secret {secret}: value is not a kubeconfig: {e}"))?;
    let (context_name, context) = current_context(&kc, secret)?;
    let cluster = inline_cluster(&kc, secret, &context_name, context)?;
    let user = inline_user(&kc, secret, &context_name, context)?;
    Ok(only(cluster, user))
}

/// Why a field naming a file, a program or a proxy is refused.
fn refused(secret: &str, field: String, value: &str) -> String {
    format!(
        "Secret {secret}: {field}: invalid value {value:?}: refused: a workload cluster's kubeconfig may only \
         carry inline credentials (token, client-certificate-data, client-key-data, certificate-authority-data); \
         Vigil never runs a program or reads a file named by it"
    )
}

/// The context a kubeconfig uses: `current-context`, or its only context.
fn current_context<'k>(kc: &'k Kubeconfig, secret: &str) -> Result<(String, &'k KubeContext), String> {
    let context_name = match (&kc.current_context, kc.contexts.as_slice()) {
        (Some(c), _) if !c.is_empty() => c.clone(),
        (_, [only]) => only.name.clone(),
        _ => return Err(format!("Secret {secret}: current-context is not set and there is not exactly one context")),
    };
    let context =
        kc.contexts.iter().find(|c| c.name == context_name).and_then(|c| c.context.as_ref()).ok_or_else(|| {
            format!("Secret {secret}: current-context: invalid value {context_name:?}: no such context")
        })?;
    Ok((context_name, context))
}

/// The context's cluster with only inline fields (no CA file, no proxy), its server set.
fn inline_cluster(kc: &Kubeconfig, secret: &str, context_name: &str, context: &KubeContext) -> Result<Cluster, String> {
    let (ci, cluster) = kc
        .clusters
        .iter()
        .enumerate()
        .find(|(_, c)| c.name == context.cluster)
        .and_then(|(i, c)| c.cluster.as_ref().map(|x| (i, x)))
        .ok_or_else(|| {
            format!(
                "Secret {secret}: contexts[{context_name}].cluster: invalid value {:?}: no such cluster",
                context.cluster
            )
        })?;
    if let Some(file) = &cluster.certificate_authority {
        return Err(refused(secret, format!("clusters[{ci}].cluster.certificate-authority"), file));
    }
    if let Some(proxy) = &cluster.proxy_url {
        return Err(refused(secret, format!("clusters[{ci}].cluster.proxy-url"), proxy));
    }
    let server = cluster
        .server
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("Secret {secret}: clusters[{ci}].cluster.server must be set"))?;
    Ok(Cluster {
        server: Some(server),
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
        certificate_authority: None,
        certificate_authority_data: cluster.certificate_authority_data.clone(),
        proxy_url: None,
        disable_compression: cluster.disable_compression,
        tls_server_name: cluster.tls_server_name.clone(),
        ..Cluster::default()
    })
}

/// The context's user with inline credentials only (no exec, auth provider or files).
fn inline_user(kc: &Kubeconfig, secret: &str, context_name: &str, context: &KubeContext) -> Result<AuthInfo, String> {
    let user_name = context.user.clone().unwrap_or_default();
    let (ui, user) = kc
        .auth_infos
        .iter()
        .enumerate()
        .find(|(_, u)| u.name == user_name)
        .and_then(|(i, u)| u.auth_info.as_ref().map(|x| (i, x)))
        .ok_or_else(|| {
            format!("Secret {secret}: contexts[{context_name}].user: invalid value {user_name:?}: no such user")
        })?;
    let at = |f: &str| format!("users[{ui}].user.{f}");
    if let Some(exec) = &user.exec {
        return Err(refused(secret, at("exec"), exec.command.as_deref().unwrap_or("")));
    }
    if let Some(p) = &user.auth_provider {
        return Err(refused(secret, at("auth-provider"), &p.name));
    }
    if let Some(f) = &user.token_file {
        return Err(refused(secret, at("tokenFile"), f));
    }
    if let Some(f) = &user.client_certificate {
        return Err(refused(secret, at("client-certificate"), f));
    }
    if let Some(f) = &user.client_key {
        return Err(refused(secret, at("client-key"), f));
    }
    Ok(AuthInfo {
        username: user.username.clone(),
        password: user.password.clone(),
        token: user.token.clone(),
        client_certificate_data: user.client_certificate_data.clone(),
        client_key_data: user.client_key_data.clone(),
        ..AuthInfo::default()
    })
}

/// A kubeconfig of one cluster, one user and the context joining them.
fn only(cluster: Cluster, user: AuthInfo) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster { name: "workload".into(), cluster: Some(cluster), ..NamedCluster::default() }],
        auth_infos: vec![NamedAuthInfo { name: "workload".into(), auth_info: Some(user), ..NamedAuthInfo::default() }],
        contexts: vec![NamedContext {
            name: "workload".into(),
            context: Some(KubeContext {
                cluster: "workload".into(),
                user: Some("workload".into()),
                ..KubeContext::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some("workload".into()),
        ..Kubeconfig::default()
    }
}

/// A client for a workload cluster from its kubeconfig Secret (inline credentials only).
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
    let kubeconfig = sanitize(text, &format!("{namespace}/{name}"))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("Secret {namespace}/{name}: unusable kubeconfig: {e}"))?;
    Client::try_from(config).map_err(|e| format!("Secret {namespace}/{name}: {e}"))
}

/// Whether two clients reach the same cluster: the `kube-system` Namespace's uid is unique per
/// cluster. When either cannot be read, they count as different (the MHC's and NHCs' targets are
/// then not matched across kinds; each kind still remediates a target once).
async fn same_cluster(a: &Client, b: &Client) -> bool {
    async fn uid(c: &Client) -> Option<String> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
        tokio::time::timeout(Duration::from_secs(10), api.get_opt("kube-system"))
            .await
            .ok()?
            .ok()
            .flatten()
            .and_then(|n| n.metadata.uid)
    }
    match (uid(a).await, uid(b).await) {
        (Some(x), Some(y)) => x == y,
        _ => false,
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

/// Marks the workload cluster's Nodes untrusted for `why`; wakes its checks the first time.
fn mark_unreachable(ctx: &Context, cluster: &WorkloadCluster, why: &str) {
    let dirty = { ctx.write_index().nodes_unreachable(cluster, why) };
    ctx.workload_clients.gone(cluster);
    if let Some(dirty) = dirty {
        warn!(%cluster, %why, "workload cluster not connected");
        ctx.scheduler.mark(dirty);
    }
}

/// Whether a self-hosted workload cluster's Nodes may be read from the management cluster's:
/// `workload` reaches the cluster `management` does and its own credentials may list Nodes, so a
/// tenant learns nothing its kubeconfig could not read.
pub async fn shares_management_nodes(management: &Client, workload: &Client) -> bool {
    same_cluster(management, workload).await && can_list_nodes(workload).await
}

/// Whether `client` (a workload cluster's own credentials) may list Nodes.
async fn can_list_nodes(client: &Client) -> bool {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let first = kube::api::ListParams::default().limit(1);
    matches!(tokio::time::timeout(Duration::from_secs(10), api.list_metadata(&first)).await, Ok(Ok(_)))
}

/// Marks self-hosted workload cluster `cluster` as read through the management cluster's Node
/// cache ([`vigil_index::index::Index::node_source`]); wakes its checks.
fn share_local_nodes(ctx: &Context, cluster: &WorkloadCluster) {
    let dirty = ctx.write_index().share_local_nodes(cluster);
    ctx.scheduler.mark(dirty);
}

/// Whether the Cluster of `cluster` exists (`None` while Clusters are not listed).
fn cluster_exists(ctx: &Context, cluster: &WorkloadCluster) -> Option<bool> {
    let idx = ctx.read_index();
    (idx.state(&Source::Clusters) == Some(&SourceState::Synced)).then(|| idx.has_cluster(cluster))
}

/// The right to write the checks of workload cluster `cluster` in sharded mode (its shard's;
/// `None`: one shard, the connection is kept whoever leads).
fn shard_right<'c>(ctx: &'c Context, cluster: &WorkloadCluster) -> Option<&'c crate::leader::Leadership> {
    let shards = ctx.writer.shards()?;
    Some(shards.right(Some(vigil_engine::shard::shard_of(&cluster.key(), shards.count()))))
}

/// Whether the connection is still wanted: one shard, or this replica holds the cluster's shard.
fn wanted(ctx: &Context, cluster: &WorkloadCluster) -> bool {
    shard_right(ctx, cluster).is_none_or(|r| r.is_leader())
}

/// Waits `period`; false as soon as the connection is no longer wanted (the shard given back or
/// lost), checked when its right changes and at the end.
async fn wait_wanted(ctx: &Context, cluster: &WorkloadCluster, period: Duration) -> bool {
    let Some(right) = shard_right(ctx, cluster) else {
        tokio::time::sleep(period).await;
        return true;
    };
    let mut changes = right.subscribe();
    let end = tokio::time::Instant::now() + period;
    loop {
        if !right.is_leader() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(end) => return right.is_leader(),
            changed = changes.changed() => if changed.is_err() { tokio::time::sleep_until(end).await },
        }
    }
}

/// Forgets workload cluster `cluster` when this replica no longer holds its shard: its client,
/// Node cache, what its connection told (self-hosted or not), its source and metrics; its checks
/// are woken, so a replica that holds the shard again connects anew.
async fn let_go(ctx: &Context, cluster: &WorkloadCluster) {
    let dirty = ctx.write_index().forget_cluster(cluster);
    ctx.workload_clients.gone(cluster);
    let source = format!("Nodes of workload cluster {cluster}");
    ctx.sources.remove(&source);
    ctx.metrics.forget_source(&source);
    ctx.metrics.workload_connected(&cluster.key(), false);
    ctx.started.lock().await.remove(&crate::sources::Need::WorkloadCluster(cluster.clone()));
    info!(%cluster, "workload cluster let go: its shard is not held here");
    ctx.scheduler.mark(dirty);
}

/// Keeps a Node watch on a workload cluster. While its Cluster does not exist, its Secret is not
/// read; while the Secret is missing or refused or the cluster cannot be reached, its Nodes are
/// untrusted and its checks make no decision. Connecting is retried with a growing delay
/// (1 s to 60 s); a changed Secret (rotated credentials) or a deleted Cluster ends the watch.
/// With `--shards`, the connection lives only while this replica holds the cluster's shard
/// ([`let_go`] when it gives the shard back or loses it).
pub async fn keep_connected(ctx: Arc<Context>, cluster: WorkloadCluster) {
    stay_connected(&ctx, &cluster).await;
    let_go(&ctx, &cluster).await;
}

/// [`keep_connected`]'s loop; returns when the connection is no longer wanted.
async fn stay_connected(ctx: &Arc<Context>, cluster: &WorkloadCluster) {
    let namespace = cluster.namespace();
    let secret_name = format!("{}-kubeconfig", cluster.name());
    let mut delay = Duration::from_secs(1);
    loop {
        if !wanted(ctx, cluster) {
            return;
        }
        match cluster_exists(ctx, cluster) {
            Some(true) => {}
            Some(false) => {
                let why = format!("Cluster {cluster} does not exist; its Secret {namespace}/{secret_name} is not read");
                mark_unreachable(ctx, cluster, &why);
                if !wait_wanted(ctx, cluster, CLUSTER_RECHECK).await {
                    return;
                }
                continue;
            }
            None => {
                if !wait_wanted(ctx, cluster, CLUSTER_RECHECK).await {
                    return;
                }
                continue;
            }
        }
        let client = match connect(&ctx.client, namespace, &secret_name).await {
            Ok(c) => c,
            Err(why) => {
                mark_unreachable(ctx, cluster, &why);
                if !wait_wanted(ctx, cluster, delay).await {
                    return;
                }
                delay = (delay * 2).min(Duration::from_secs(60));
                continue;
            }
        };
        let handle = watch_nodes(ctx, cluster, client).await;
        delay = Duration::from_secs(1);
        let connected_with = secret_version(&ctx.client, namespace, &secret_name).await;
        let still_wanted = loop {
            if !wait_wanted(ctx, cluster, SECRET_RECHECK).await {
                break false;
            }
            if handle.as_ref().is_some_and(|h| h.is_finished())
                || cluster_exists(ctx, cluster) == Some(false)
                || secret_version(&ctx.client, namespace, &secret_name).await != connected_with
            {
                break true;
            }
        };
        if let Some(handle) = handle {
            handle.abort();
        }
        if !still_wanted {
            return;
        }
        ctx.sources.remove(&format!("Nodes of workload cluster {cluster}"));
        mark_unreachable(ctx, cluster, "the workload cluster's Secret or Cluster changed; connecting again");
    }
}

/// Starts reading a connected workload cluster's Nodes: through the management cluster's cache
/// when it is self-hosted and its credentials may list Nodes (`None` returned), through a Node
/// watch of its own otherwise.
async fn watch_nodes(
    ctx: &Arc<Context>,
    cluster: &WorkloadCluster,
    client: Client,
) -> Option<tokio::task::JoinHandle<()>> {
    let same = same_cluster(&ctx.client, &client).await;
    // Self-hosted: the management cluster's Node cache serves the workload cluster too (one
    // list and one watch of every Node instead of two), but only when the Secret's own
    // credentials may list Nodes, so a tenant learns nothing its kubeconfig could not read.
    let shared = same && can_list_nodes(&client).await;
    info!(%cluster, self_hosted = same, shared_node_cache = shared, "workload cluster connected");
    ctx.write_index().connected(cluster, same);
    ctx.metrics.workload_connected(&cluster.key(), true);
    ctx.workload_clients.connected(cluster.clone(), client.clone());
    if shared {
        share_local_nodes(ctx, cluster);
        None
    } else {
        Some(crate::watch::start_nodes(ctx, ClusterRef::Workload(cluster.clone()), client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str, cluster_extra: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\n\
             clusters:\n- name: k\n  cluster:\n    server: https://10.1.2.3:6443\n{cluster_extra}\
             users:\n- name: u\n  user:\n{user}"
        )
    }

    #[test]
    fn inline_credentials_are_kept() {
        let text = kubeconfig(
            "    token: abc\n    client-certificate-data: Y2VydA==\n    client-key-data: a2V5\n",
            "    certificate-authority-data: Y2E=\n",
        );
        let kc = sanitize(&text, "ns/prod-kubeconfig").expect("inline credentials are fine");
        let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.token.is_some() && user.client_key_data.is_some() && user.client_certificate_data.is_some());
        let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.1.2.3:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Y2E="));
    }

    #[test]
    fn anything_that_runs_or_reads_a_local_thing_is_refused_naming_the_field() {
        let cases = [
            (
                kubeconfig(
                    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/steal\n",
                    "",
                ),
                "users[0].user.exec",
                "/bin/steal",
            ),
            (
                kubeconfig("    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n", ""),
                "users[0].user.tokenFile",
                "/var/run/secrets/kubernetes.io/serviceaccount/token",
            ),
            (kubeconfig("    auth-provider:\n      name: gcp\n", ""), "users[0].user.auth-provider", "gcp"),
            (kubeconfig("    client-certificate: /etc/x.crt\n", ""), "users[0].user.client-certificate", "/etc/x.crt"),
            (kubeconfig("    client-key: /etc/x.key\n", ""), "users[0].user.client-key", "/etc/x.key"),
            (
                kubeconfig("    token: t\n", "    certificate-authority: /etc/ca.crt\n"),
                "clusters[0].cluster.certificate-authority",
                "/etc/ca.crt",
            ),
            (
                kubeconfig("    token: t\n", "    proxy-url: http://evil:3128\n"),
                "clusters[0].cluster.proxy-url",
                "http://evil:3128",
            ),
        ];
        for (text, field, value) in cases {
            let err = sanitize(&text, "ns/prod-kubeconfig").expect_err(field);
            assert!(err.contains(field) && err.contains(value) && err.contains("ns/prod-kubeconfig"), "{err}");
        }
    }

    #[test]
    fn a_malformed_kubeconfig_is_refused_with_a_reason() {
        assert!(sanitize("not: [yaml", "s").is_err());
        let no_user = kubeconfig("    token: t\n", "").replace("user: u}", "user: nobody}");
        assert!(sanitize(&no_user, "s").expect_err("no such user").contains("nobody"));
        let no_server = kubeconfig("    token: t\n", "").replace("server: https://10.1.2.3:6443", "server: ''");
        assert!(sanitize(&no_server, "s").expect_err("no server").contains("server"));
    }
}
