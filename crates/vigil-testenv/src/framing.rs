//! A loopback HTTP proxy in front of one in-memory workload API server that writes each watch
//! event on one line.
//!
//! Why: Cluster API's in-memory provider serves workload API servers whose watch responses are
//! indented JSON, one event spread over many lines. A real kube-apiserver writes one event per
//! line; client-go frames events by JSON value and accepts both, kube-rs (Vigil's client) frames
//! them by line and fails on the first line of an indented event, so every watch would end at
//! once and be listed again. The proxy re-frames watch responses (each event compacted onto one
//! line) and passes everything else through, so Vigil and Cluster API's controllers see what a
//! real API server sends. It speaks plain HTTP/1.1 on loopback, one request per connection
//! (`Connection: close`), and reaches the provider with the cluster's own credentials.
//!
//! It can also break that one workload cluster the way a real API server breaks ([`Mode`]): hang
//! (connections stay open, nothing is answered, streams stop) or refuse (every connection is
//! closed at once), so a test can check that the other clusters are not delayed.

use std::net::SocketAddr;

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use kube::Client;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::{Mode, Result};
use tokio::sync::watch;

/// Largest request body accepted (a patch or a create; tests send small ones).
const MAX_BODY: usize = 16 << 20;

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct WatchFramingProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl WatchFramingProxy {
    /// Listens on a free loopback port and forwards to the cluster `upstream` reaches.
    pub async fn start(upstream: Client) -> Result<WatchFramingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind the framing proxy")?;
        let addr = listener.local_addr().context("the framing proxy has no address")?;
        let (mode, modes) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let modes = modes.clone();
                tokio::spawn(async move {
                    // A failed exchange only closes that connection; the client retries.
                    let _ = serve(conn, upstream, modes).await;
                });
            }
        });
        Ok(WatchFramingProxy { addr, mode, task })
    }

    /// Passes, hangs ([`Mode::Partition`]) or refuses ([`Mode::Down`]) from now on, also on the
    /// connections already open.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The URL to put in a kubeconfig (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for WatchFramingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits while the mode is [`Mode::Partition`]; `false` when the connection must be dropped
/// ([`Mode::Down`], or the proxy is gone).
async fn passing(modes: &mut watch::Receiver<Mode>) -> bool {
    match modes.wait_for(|m| *m != Mode::Partition).await {
        Ok(m) => *m == Mode::Pass,
        Err(_) => false,
    }
}

/// One request, one response, then the connection is closed.
async fn serve(conn: TcpStream, upstream: Client, mut modes: watch::Receiver<Mode>) -> Result<()> {
    if !passing(&mut modes).await {
        return Ok(());
    }
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    read.read_line(&mut line).await?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else { return Ok(()) };
    let (method, target) = (method.to_string(), target.to_string());
    let mut builder = http::Request::builder().method(method.as_str()).uri(target.as_str());
    let mut length = 0usize;
    loop {
        line.clear();
        if read.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else { continue };
        let (name, value) = (name.trim(), value.trim());
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().unwrap_or(0),
            "transfer-encoding" => {
                write.write_all(b"HTTP/1.1 501 Not Implemented\r\nConnection: close\r\n\r\n").await?;
                return Ok(());
            }
            "host" | "connection" | "keep-alive" | "upgrade" | "proxy-connection" => {}
            _ => builder = builder.header(name, value),
        }
    }
    if length > MAX_BODY {
        write.write_all(b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\n\r\n").await?;
        return Ok(());
    }
    let mut body = vec![0u8; length];
    read.read_exact(&mut body).await?;
    let request = builder.body(kube::client::Body::from(body)).context("bad request")?;
    let response = match upstream.send(request).await {
        Ok(r) => r,
        Err(e) => {
            let text = format!("framing proxy: upstream failed: {e}");
            let head = format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                text.len()
            );
            write.write_all(head.as_bytes()).await?;
            write.write_all(text.as_bytes()).await?;
            return Ok(());
        }
    };
    let (head, mut body) = response.into_parts();
    let mut out = format!("HTTP/1.1 {}\r\n", head.status);
    for (name, value) in &head.headers {
        if matches!(name.as_str(), "content-length" | "transfer-encoding" | "connection" | "keep-alive") {
            continue;
        }
        out.push_str(&format!("{}: {}\r\n", name, value.to_str().unwrap_or("")));
    }
    out.push_str("Connection: close\r\n\r\n");
    write.write_all(out.as_bytes()).await?;
    let is_watch =
        target.split_once('?').is_some_and(|(_, q)| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            changed = modes.changed() => {
                if changed.is_err() || !passing(&mut modes).await {
                    return Ok(());
                }
                continue;
            }
        };
        let Some(frame) = frame else { break };
        let Ok(data) = frame?.into_data() else { continue };
        if !is_watch {
            write.write_all(&data).await?;
            continue;
        }
        pending.extend_from_slice(&data);
        let consumed = {
            let mut events = serde_json::Deserializer::from_slice(&pending).into_iter::<Value>();
            let mut lines = Vec::new();
            for event in events.by_ref() {
                match event {
                    Ok(v) => {
                        lines.extend_from_slice(serde_json::to_string(&v)?.as_bytes());
                        lines.push(b'\n');
                    }
                    Err(e) if e.is_eof() => break,
                    Err(e) => return Err(e.into()),
                }
            }
            write.write_all(&lines).await?;
            events.byte_offset()
        };
        pending.drain(..consumed);
        write.flush().await?;
    }
    write.shutdown().await?;
    Ok(())
}
