//! `vigil run`: the controller against a real cluster.

use anyhow::{Context, Result, anyhow};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Leader election flags: several replicas run, one decides and writes.
#[derive(clap::Args, Debug, Clone)]
pub struct Election {
    /// Take part in leader election on a Lease; only the leader decides and writes, standbys keep
    /// their caches warm. `--leader-elect=false` for a single replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "vigil")]
    pub lease_name: String,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else the kubeconfig's namespace).
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// How long a standby waits after the Lease last changed before taking it over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long after its last renewal the leader may still write: under 11/13 of the lease
    /// duration, so no standby can take over while it may (clock rates may differ by 1/12).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// How often the Lease is renewed or looked at.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// Split the checks into this many shards, one Lease each (`<lease-name>-shard-<i>`); every
    /// replica decides and writes the checks of the shards it holds. 1: one leader decides all.
    #[arg(long, default_value_t = 1, value_parser = parse_shards, allow_negative_numbers = true)]
    pub shards: u32,
}

/// Where the medik8s node Leases live: every NodeHealthCheck takes a Node's Lease there before
/// it remediates the Node, as the node maintenance operator does before it drains one.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeLeases {
    /// Namespace of the medik8s node Leases (`node-<name>`), shared with the node maintenance
    /// operator and other medik8s components [default: $LEASE_NAMESPACE, else medik8s-leases].
    #[arg(long, value_parser = parse_namespace, value_name = "NAMESPACE")]
    pub node_lease_namespace: Option<String>,
}

/// A namespace name: a DNS-1123 label.
fn parse_namespace(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 63
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    match ok {
        true => Ok(text.to_string()),
        false => Err(format!(
            "invalid value {text:?}: a namespace is at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit"
        )),
    }
}

fn parse_shards(text: &str) -> Result<u32, String> {
    let max = vigil_engine::shard::MAX_SHARDS;
    match text.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("invalid value {text:?} for --shards: must be a whole number from 1 to {max}")),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = vigil_api::duration::parse_go_duration(text).map_err(|e| format!("{e}"))?;
    Duration::try_from(d).map_err(|_| format!("invalid value {text:?}: must not be negative"))
}

/// This replica's identity: the Pod name, else the host name and process id.
fn identity() -> String {
    std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

/// Connects (kubeconfig file, `KUBECONFIG`, `~/.kube/config`, or in-cluster) and runs the
/// controller until SIGINT/SIGTERM. `modes`: `--dry-run`, `--serve-medik8s`.
pub fn run(
    kubeconfig: Option<PathBuf>,
    workers: usize,
    metrics_addr: Option<SocketAddr>,
    (dry_run, serve_medik8s): (bool, bool),
    election: Election,
    node_leases: NodeLeases,
) -> Result<bool> {
    let lease_namespace = checked_flags((dry_run, serve_medik8s), &election, node_leases)?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async move {
        let config = kube_config(kubeconfig).await?;
        let namespace = election
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|n| !n.is_empty()))
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
        if serve_medik8s {
            vigil_controller::medik8s::refuse_to_start(&client).await.map_err(|e| anyhow!(e))?;
        }
        let options = vigil_controller::Options {
            workers,
            metrics_addr,
            leader: leader_options(&election, namespace)?,
            dry_run,
            shards: election.shards,
            serve_medik8s,
            lease_namespace,
            ..Default::default()
        };
        vigil_controller::run(client, options, shutdown_signal()).await;
        Ok(true)
    })
}

/// Refuses bad flags before anything connects, naming the flag and its value; returns the
/// namespace of the medik8s node Leases.
fn checked_flags(
    (dry_run, serve_medik8s): (bool, bool),
    election: &Election,
    node_leases: NodeLeases,
) -> Result<String> {
    if dry_run && serve_medik8s {
        return Err(anyhow!(
            "--serve-medik8s cannot be combined with --dry-run: medik8s' NodeHealthCheck status has no field for \
             what Vigil would remediate (to watch before trusting, convert the checks with `vigil convert` and \
             apply them with spec.dryRun: true while the operator still runs)"
        ));
    }
    let lease_namespace = match node_leases.node_lease_namespace {
        Some(ns) => ns,
        None => {
            let ns = vigil_controller::surroundings::default_lease_namespace();
            parse_namespace(&ns).map_err(|e| anyhow!("LEASE_NAMESPACE: {e}"))?
        }
    };
    if election.shards > 1 && !election.leader_elect {
        return Err(anyhow!("--shards {} needs --leader-elect=true: shards are owned through Leases", election.shards));
    }
    if election.leader_elect {
        vigil_controller::leader::check_durations(
            election.lease_duration,
            election.renew_deadline,
            election.retry_period,
        )
        .map_err(|e| anyhow!(e))?;
    }
    Ok(lease_namespace)
}

/// The client configuration: from the kubeconfig file given, else inferred (`KUBECONFIG`,
/// `~/.kube/config`, or in-cluster).
async fn kube_config(kubeconfig: Option<PathBuf>) -> Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("unusable kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("no kubeconfig and not running in a cluster")?,
    })
}

/// The leader election of this replica on a Lease in `namespace`, when `--leader-elect` is on.
fn leader_options(election: &Election, namespace: String) -> Result<Option<vigil_controller::leader::LeaderOptions>> {
    if !election.leader_elect {
        return Ok(None);
    }
    let options = vigil_controller::leader::LeaderOptions {
        lease_name: election.lease_name.clone(),
        namespace,
        identity: identity(),
        lease_duration: election.lease_duration,
        renew_deadline: election.renew_deadline,
        retry_period: election.retry_period,
    };
    options.validate().map_err(|e| anyhow!(e))?;
    Ok(Some(options))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
