//! The controller's HTTP endpoint: `/metrics`, `/livez`, `/readyz`; every other path is 404.
//!
//! `/readyz` fails while a source Vigil decides from (the API server itself, the check, Node,
//! Machine, Cluster and remediation watches; not a tenant's workload cluster) has not been live
//! for longer than its grace period ([`crate::sources::READY_GRACE`] by default): the controller is then doing nothing, on
//! purpose, and an operator's probe should see it.

use crate::context::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;

/// The answer to one request: status line, content type, body.
pub fn respond(ctx: &Context, path: &str) -> (&'static str, &'static str, String) {
    let path = path.split('?').next().unwrap_or(path);
    match path {
        "/metrics" => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", ctx.metrics.render()),
        "/livez" | "/healthz" => {
            // Alive when the indexes can be read: a worker stuck holding the lock would show here.
            drop(ctx.read_index());
            ("200 OK", "text/plain; charset=utf-8", "ok\n".into())
        }
        "/readyz" => {
            let grace = Duration::from_millis(ctx.ready_grace.load(std::sync::atomic::Ordering::Relaxed));
            let not_ready = ctx.sources.not_ready(grace);
            if not_ready.is_empty() {
                ("200 OK", "text/plain; charset=utf-8", "ok\n".into())
            } else {
                let mut body = String::from("not ready: nothing is decided from a source that is not live\n");
                for line in not_ready {
                    body.push_str(&format!("[-] {line}\n"));
                }
                ("503 Service Unavailable", "text/plain; charset=utf-8", body)
            }
        }
        _ => ("404 Not Found", "text/plain; charset=utf-8", "not found\n".into()),
    }
}

/// Serves until the process ends.
pub async fn serve(ctx: Arc<Context>, addr: std::net::SocketAddr) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            warn!(%addr, error = %e, "metrics and health endpoint not served");
            return;
        }
    };
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { continue };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n = match tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.lines().next().and_then(|l| l.split(' ').nth(1)).unwrap_or("/");
            let (status, content_type, body) = respond(&ctx, path);
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}
