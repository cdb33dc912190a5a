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
//! HTTP upgrades pass through: KubeadmControlPlane reaches each control-plane Machine's etcd by
//! port-forward (`POST …/pods/etcd-…/portforward` upgraded to SPDY, after a websocket attempt),
//! which the provider serves on the same workload API server. A request that asks for an
//! upgrade is sent upstream with its `Connection: Upgrade` / `Upgrade` headers; when the
//! provider answers `101 Switching Protocols`, the proxy relays that answer and then copies bytes
//! both ways until either side closes. The proxy stays in the path (rather than giving
//! KubeadmControlPlane the provider's address) because every controller reads the same
//! `<cluster>-kubeconfig` Secret, and a second kubeconfig for one controller would test a setup
//! no user has.
//!
//! It can also break that one workload cluster the way a real API server breaks ([`Mode`]): hang
//! (connections stay open, nothing is answered, streams stop) or refuse (every connection is
//! closed at once), so a test can check that the other clusters are not delayed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use kube::Client;
use serde_json::Value;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
};
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
    /// Upgraded connections tunnelled so far.
    upgrades: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl WatchFramingProxy {
    /// Listens on a free loopback port and forwards to the cluster `upstream` reaches.
    pub async fn start(upstream: Client) -> Result<WatchFramingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind the framing proxy")?;
        let addr = listener.local_addr().context("the framing proxy has no address")?;
        let (mode, modes) = watch::channel(Mode::Pass);
        let upgrades = Arc::new(AtomicUsize::new(0));
        let counter = upgrades.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let modes = modes.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    // A failed exchange only closes that connection; the client retries.
                    let _ = serve(conn, upstream, modes, counter).await;
                });
            }
        });
        Ok(WatchFramingProxy { addr, mode, upgrades, task })
    }

    /// Passes, hangs ([`Mode::Partition`]) or refuses ([`Mode::Down`]) from now on, also on the
    /// connections already open.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// How many upgraded connections (port-forwards) were tunnelled, so a test can tell that
    /// what needed one went through the proxy.
    pub fn upgrades(&self) -> usize {
        self.upgrades.load(Ordering::Relaxed)
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

/// One request, one response, then the connection is closed (or, after an upgrade, tunnelled).
async fn serve(
    conn: TcpStream,
    upstream: Client,
    mut modes: watch::Receiver<Mode>,
    upgrades: Arc<AtomicUsize>,
) -> Result<()> {
    if !passing(&mut modes).await {
        return Ok(());
    }
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    let Some(incoming) = read_request(&mut read, &mut write).await? else { return Ok(()) };
    let Some(response) = send_upstream(&upstream, incoming.request, &mut write).await? else { return Ok(()) };
    if incoming.upgrade.is_some() && response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        upgrades.fetch_add(1, Ordering::Relaxed);
        return tunnel(response, read, write, modes).await;
    }
    let (head, body) = response.into_parts();
    write_head(&head, &mut write).await?;
    let is_watch =
        incoming.target.split_once('?').is_some_and(|(_, q)| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    relay_body(body, is_watch, &mut write, modes).await
}

/// A request read from the client, as it goes upstream.
struct Incoming {
    request: http::Request<kube::client::Body>,
    /// The path and query, as the request line named them.
    target: String,
    /// The protocol asked for, when the request asks for an upgrade.
    upgrade: Option<String>,
}

/// Reads the request line, headers and body; `None` when the client closed early or was
/// answered here (a chunked or oversized body).
async fn read_request(
    read: &mut (impl AsyncBufRead + Unpin),
    write: &mut (impl AsyncWrite + Unpin),
) -> Result<Option<Incoming>> {
    let mut line = String::new();
    read.read_line(&mut line).await?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else { return Ok(None) };
    let (method, target) = (method.to_string(), target.to_string());
    let mut builder = http::Request::builder().method(method.as_str()).uri(target.as_str());
    let mut length = 0usize;
    let (mut upgrade, mut connection_upgrade) = (None, false);
    loop {
        line.clear();
        if read.read_line(&mut line).await? == 0 {
            return Ok(None);
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
                return Ok(None);
            }
            "upgrade" => upgrade = Some(value.to_string()),
            "connection" => {
                connection_upgrade |= value.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
            }
            "host" | "keep-alive" | "proxy-connection" => {}
            _ => builder = builder.header(name, value),
        }
    }
    if length > MAX_BODY {
        write.write_all(b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\n\r\n").await?;
        return Ok(None);
    }
    let mut body = vec![0u8; length];
    read.read_exact(&mut body).await?;
    let upgrade = upgrade.filter(|_| connection_upgrade);
    if let Some(protocol) = &upgrade {
        builder = builder.header("connection", "Upgrade").header("upgrade", protocol.as_str());
    }
    let request = builder.body(kube::client::Body::from(body)).context("bad request")?;
    Ok(Some(Incoming { request, target, upgrade }))
}

/// Sends the request upstream; `None` when that failed and the client was answered `502`.
async fn send_upstream(
    upstream: &Client,
    request: http::Request<kube::client::Body>,
    write: &mut (impl AsyncWrite + Unpin),
) -> Result<Option<http::Response<kube::client::Body>>> {
    match upstream.send(request).await {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            let text = format!("framing proxy: upstream failed: {e}");
            let head = format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                text.len()
            );
            write.write_all(head.as_bytes()).await?;
            write.write_all(text.as_bytes()).await?;
            Ok(None)
        }
    }
}

/// Writes the upstream's status and headers, without its framing ones: the body goes out as it
/// comes, on a connection that closes after it.
async fn write_head(head: &http::response::Parts, write: &mut (impl AsyncWrite + Unpin)) -> Result<()> {
    let mut out = format!("HTTP/1.1 {}\r\n", head.status);
    for (name, value) in &head.headers {
        if matches!(name.as_str(), "content-length" | "transfer-encoding" | "connection" | "keep-alive") {
            continue;
        }
        out.push_str(&format!("{}: {}\r\n", name, value.to_str().unwrap_or("")));
    }
    out.push_str("Connection: close\r\n\r\n");
    write.write_all(out.as_bytes()).await?;
    Ok(())
}

/// Copies the upstream body to the client, each watch event on one line, until it ends or the
/// mode drops the connection.
async fn relay_body(
    mut body: kube::client::Body,
    is_watch: bool,
    write: &mut (impl AsyncWrite + Unpin),
    mut modes: watch::Receiver<Mode>,
) -> Result<()> {
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

/// Relays an upstream `101 Switching Protocols` answer, then copies bytes both ways (the
/// client's bytes already read past the request head first) until both sides have closed, or
/// the mode is no longer [`Mode::Pass`] (a broken cluster drops its tunnels).
async fn tunnel(
    response: http::Response<kube::client::Body>,
    mut down_read: impl AsyncRead + Unpin,
    mut down_write: impl AsyncWrite + Unpin,
    mut modes: watch::Receiver<Mode>,
) -> Result<()> {
    let mut out = format!("HTTP/1.1 {}\r\n", response.status());
    for (name, value) in response.headers() {
        out.push_str(&format!("{}: {}\r\n", name, value.to_str().unwrap_or("")));
    }
    out.push_str("\r\n");
    let upgraded = hyper::upgrade::on(response).await.context("the upstream upgrade failed")?;
    down_write.write_all(out.as_bytes()).await?;
    down_write.flush().await?;
    let (mut up_read, mut up_write) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    let to_upstream = async {
        tokio::io::copy(&mut down_read, &mut up_write).await?;
        up_write.shutdown().await
    };
    let to_client = async {
        tokio::io::copy(&mut up_read, &mut down_write).await?;
        down_write.shutdown().await
    };
    tokio::select! {
        copied = async { tokio::try_join!(to_upstream, to_client) } => { copied?; }
        _ = modes.wait_for(|m| *m != Mode::Pass) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that answers an upgrade request (`Connection: Upgrade` with an `Upgrade`
    /// header, as the provider's port-forward handler requires) with `101` and then echoes
    /// every byte, and anything else with `400`; sends the request head it saw.
    async fn echo_upstream() -> (SocketAddr, tokio::sync::oneshot::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (seen, head) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (conn, _) = listener.accept().await.expect("accept");
            let (read, mut write) = conn.into_split();
            let mut read = BufReader::new(read);
            let mut text = String::new();
            loop {
                let mut line = String::new();
                if read.read_line(&mut line).await.expect("read") == 0 || line == "\r\n" {
                    break;
                }
                text.push_str(&line.to_ascii_lowercase());
            }
            let upgrade = text.contains("connection: upgrade") && text.contains("upgrade: spdy/3.1");
            let _ = seen.send(text);
            if !upgrade {
                let _ = write.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno").await;
                return;
            }
            write
                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
                .await
                .expect("101");
            let mut buf = [0u8; 256];
            loop {
                let n = read.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                write.write_all(&buf[..n]).await.expect("echo");
            }
        });
        (addr, head)
    }

    async fn proxy_to(upstream: SocketAddr) -> WatchFramingProxy {
        let url = format!("http://{upstream}").parse().expect("url");
        let client = Client::try_from(kube::Config::new(url)).expect("client");
        WatchFramingProxy::start(client).await.expect("proxy")
    }

    /// The response head (lower-cased) and the reader positioned after it.
    async fn response_head(reader: &mut BufReader<TcpStream>) -> String {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.expect("read") == 0 || line == "\r\n" {
                return head;
            }
            head.push_str(&line.to_ascii_lowercase());
        }
    }

    #[tokio::test]
    async fn a_port_forward_upgrade_is_tunnelled_both_ways() {
        let (upstream, seen) = echo_upstream().await;
        let proxy = proxy_to(upstream).await;
        let mut conn = TcpStream::connect(proxy.addr).await.expect("connect");
        // Bytes right behind the head (a client may send its first frame at once) go through too.
        conn.write_all(
            b"POST /api/v1/namespaces/kube-system/pods/etcd-m1/portforward HTTP/1.1\r\nHost: x\r\n\
              Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\
              Content-Length: 0\r\n\r\nearly",
        )
        .await
        .expect("request");
        let mut reader = BufReader::new(conn);
        let head = response_head(&mut reader).await;
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(head.contains("upgrade: spdy/3.1"), "{head}");
        let request = seen.await.expect("upstream saw the request");
        assert!(request.contains("x-stream-protocol-version: portforward.k8s.io"), "{request}");
        let mut echoed = [0u8; 5];
        reader.read_exact(&mut echoed).await.expect("echo");
        assert_eq!(&echoed, b"early");
        reader.get_mut().write_all(b"ping").await.expect("write");
        let mut pong = [0u8; 4];
        reader.read_exact(&mut pong).await.expect("echo");
        assert_eq!(&pong, b"ping");
        assert_eq!(proxy.upgrades(), 1);
    }

    #[tokio::test]
    async fn an_upgrade_the_upstream_refuses_is_relayed_as_an_answer() {
        let (upstream, _seen) = echo_upstream().await;
        let proxy = proxy_to(upstream).await;
        let mut conn = TcpStream::connect(proxy.addr).await.expect("connect");
        // A websocket attempt, which the provider's port-forward handler refuses (client-go then
        // falls back to SPDY).
        conn.write_all(b"GET /api/v1/namespaces/kube-system/pods/etcd-m1/portforward HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            .await
            .expect("request");
        let mut reader = BufReader::new(conn);
        let head = response_head(&mut reader).await;
        assert!(head.starts_with("http/1.1 400"), "{head}");
        let mut body = String::new();
        reader.read_to_string(&mut body).await.expect("body");
        assert_eq!(body, "no");
        assert_eq!(proxy.upgrades(), 0);
    }
}
