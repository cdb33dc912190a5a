//! A loopback TCP proxy between the code under test and the API server, to break the network
//! the way real networks break: every connection reset at once (a load balancer restarts), the
//! proxy down for a while (new connections reset too), or a partition (connections stay open and
//! nothing passes either way; what was sent arrives after it heals, as TCP retransmits it).
//!
//! Only loopback addresses are used, and each connection's traffic is bounded by what the test
//! itself sends through it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Result;

/// What the proxy does with traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Passes everything.
    Pass,
    /// Holds every connection open and passes nothing (a partition); new connections are held too.
    Partition,
    /// Resets every connection, and every new one at once (the proxy is restarting).
    Down,
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    resets: watch::Sender<u64>,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy").field("addr", &self.addr).field("mode", &*self.mode.borrow()).finish()
    }
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream` (a loopback address).
    pub async fn start(upstream: SocketAddr) -> Result<FaultProxy> {
        anyhow::ensure!(upstream.ip().is_loopback(), "the proxy only forwards to loopback, not {upstream}");
        let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind the proxy")?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let (resets, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicU64::new(0));
        let (mode_rx, resets_rx, count) = (mode.subscribe(), resets.subscribe(), accepted.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                count.fetch_add(1, Ordering::Relaxed);
                if *mode_rx.borrow() == Mode::Down {
                    reset(&client);
                    continue;
                }
                tokio::spawn(pump(client, upstream, mode_rx.clone(), resets_rx.clone()));
            }
        });
        Ok(FaultProxy { addr, mode, resets, accepted, task })
    }

    /// The URL to give the code under test (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Resets every open connection now; new ones are passed.
    pub fn reset_all(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// Resets every connection and every new one until [`FaultProxy::heal`].
    pub fn down(&self) {
        self.mode.send_replace(Mode::Down);
        self.reset_all();
    }

    /// Holds every connection, passing nothing, until [`FaultProxy::heal`].
    pub fn partition(&self) {
        self.mode.send_replace(Mode::Partition);
    }

    /// Passes traffic again (held connections resume where they stopped).
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Pass);
    }

    /// How many connections were accepted so far (to see that a client reconnected).
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.down();
    }
}

/// Closes with RST, as a crashed peer would, rather than an orderly FIN.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

async fn pump(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    mut resets: watch::Receiver<u64>,
) {
    resets.borrow_and_update();
    let mut up = match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)).await {
        Ok(Ok(s)) => s,
        _ => {
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let mut a = vec![0u8; 32 * 1024];
    let mut b = vec![0u8; 32 * 1024];
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Mode::Down => break,
            Mode::Partition => {
                tokio::select! {
                    changed = mode.changed() => if changed.is_err() { break },
                    _ = resets.changed() => break,
                }
                continue;
            }
            Mode::Pass => {}
        }
        tokio::select! {
            r = client.read(&mut a) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => if up.write_all(&a[..n]).await.is_err() { break },
            },
            r = up.read(&mut b) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => if client.write_all(&b[..n]).await.is_err() { break },
            },
            changed = mode.changed() => if changed.is_err() { break },
            _ = resets.changed() => break,
        }
    }
    reset(&client);
    reset(&up);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        match tokio::time::timeout(within, s.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Some(buf.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn passes_holds_resumes_and_resets() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
        assert_eq!(roundtrip(&mut s, Duration::from_secs(5)).await.as_deref(), Some(&b"ping"[..]));

        proxy.partition();
        assert_eq!(roundtrip(&mut s, Duration::from_millis(300)).await, None, "nothing passes in a partition");
        proxy.heal();
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf)).await.expect("in time").expect("read");
        assert_eq!(&buf, b"ping", "what was held arrives after the partition heals");

        proxy.reset_all();
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("in time");
        assert!(matches!(r, Ok(0) | Err(_)), "the connection is gone: {r:?}");

        proxy.down();
        let mut s2 = TcpStream::connect(proxy.addr).await.expect("accepted");
        let r = tokio::time::timeout(Duration::from_secs(5), s2.read(&mut buf)).await.expect("in time");
        assert!(matches!(r, Ok(0) | Err(_)), "a new connection is reset while down: {r:?}");
        proxy.heal();
        let mut s3 = TcpStream::connect(proxy.addr).await.expect("connect");
        assert!(roundtrip(&mut s3, Duration::from_secs(5)).await.is_some(), "passes again after healing");
        assert!(proxy.connections() >= 3);
    }
}
