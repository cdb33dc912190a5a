//! `vigil run`: the controller against a real cluster.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Connects (kubeconfig file, `KUBECONFIG`, `~/.kube/config`, or in-cluster) and runs the
/// controller until SIGINT/SIGTERM.
pub fn run(kubeconfig: Option<PathBuf>, workers: usize, metrics_addr: Option<SocketAddr>) -> Result<bool> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async move {
        let config = match kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(&path)
                    .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .with_context(|| format!("unusable kubeconfig {}", path.display()))?
            }
            None => kube::Config::infer().await.context("no kubeconfig and not running in a cluster")?,
        };
        let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
        let options = vigil_controller::Options { workers, metrics_addr, ..Default::default() };
        vigil_controller::run(client, options, shutdown_signal()).await;
        Ok(true)
    })
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
