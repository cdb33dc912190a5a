//! A transport that holds a client's writes and delivers them late, to test what a write does
//! when it lands after its sender lost the right to make it; it can also hold the reads of one
//! object, to test what a late answer makes a client believe ([`WriteHold::hold_reads_of`]).
//!
//! [`WriteHold::client`] wraps a client: reads (GET, and the watches) always pass, so the code
//! under test keeps seeing the cluster and keeps deciding; while held, every write (POST, PUT,
//! PATCH, DELETE) is kept, unsent, in arrival order, and the caller waits as it would on a
//! request lost in the network (its own deadline gives up on it). [`WriteHold::release`] then
//! sends every kept write to the API server, in order, on connections of its own that stay open
//! until the answer comes: the API server carries each one out however long ago its caller gave
//! up. That is the worst case of a request sent into a partition or a stalled connection —
//! carried out when it finally arrives, not cancelled because the client hung up (which a TCP
//! proxy cannot promise: the API server cancels a request whose connection closed, when it
//! notices).
//!
//! Why not a TCP proxy: under TLS a proxy sees neither which bytes are a read and which a write,
//! nor where one request ends. Holding every byte also holds the read a controller makes just
//! before it writes (Vigil reads a target again before remediating it), so nothing would ever be
//! written into the hold; catching a write between that read and the write would be a race on a
//! sub-millisecond window. Holding requests makes the late arrival certain.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request, Response};
use kube::client::Body;
use tokio::sync::oneshot;

/// Which writes are let through while holding: the request's path contains one of these.
type Passing = Vec<String>;

/// The answer to a write, for its caller.
type Answer = Result<Response<Body>, kube::Error>;

/// One write kept while holding.
struct Kept {
    request: Request<Body>,
    kept_at: Instant,
    caller: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Shared {
    /// `Some(passing)` while holding writes.
    holding: Option<Passing>,
    /// While set, reads (GET) of a path ending with this are kept too ([`WriteHold::hold_reads_of`]).
    reads_of: Option<String>,
    kept: Vec<Kept>,
}

/// The switch of a holding transport (see the module documentation).
#[derive(Clone)]
pub struct WriteHold {
    shared: Arc<Mutex<Shared>>,
    upstream: kube::Client,
}

impl std::fmt::Debug for WriteHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteHold").field("kept", &self.kept().len()).finish()
    }
}

/// What became of one write kept and then delivered.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The method.
    pub method: String,
    /// The path and query.
    pub path: String,
    /// How long it was kept.
    pub kept_for: std::time::Duration,
    /// The API server's status code (0: no answer).
    pub code: u16,
    /// The API server's answer, when its caller had given up (the caller reads it otherwise).
    pub answer: String,
    /// Whether the caller was still waiting for it.
    pub caller_waiting: bool,
}

impl Delivered {
    /// Whether the API server carried it out.
    pub fn carried_out(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

impl std::fmt::Display for Delivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answer: String = self.answer.chars().take(160).collect();
        write!(f, "{} {} after {:?} -> {} {answer}", self.method, self.path, self.kept_for, self.code)
    }
}

impl WriteHold {
    /// A client whose requests go through a hold in front of `upstream` (which they then use,
    /// credentials and all), and the hold's switch; it passes everything until [`WriteHold::hold`].
    pub fn client(upstream: kube::Client) -> (kube::Client, WriteHold) {
        let hold = WriteHold { shared: Arc::default(), upstream: upstream.clone() };
        let namespace = upstream.default_namespace().to_string();
        let client = kube::client::ClientBuilder::new(HoldService { hold: hold.clone() }, namespace).build();
        (client, hold)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps every write from now on, except those whose path contains one of `passing`.
    pub fn hold(&self, passing: &[&str]) {
        self.lock().holding = Some(passing.iter().map(|p| p.to_string()).collect());
    }

    /// Keeps, from now on, every read (GET) of a path ending with `suffix` (one object, such as
    /// `/leases/vigil`): the request does not reach the API server until [`WriteHold::release`],
    /// so what it reads is the object as it is then, answered to a caller that has waited since
    /// it sent it, as a request queued in the network or in a busy API server is.
    pub fn hold_reads_of(&self, suffix: &str) {
        self.lock().reads_of = Some(suffix.to_string());
    }

    /// When the request kept longest was kept (none: nothing is kept).
    pub fn oldest_kept(&self) -> Option<Instant> {
        self.lock().kept.first().map(|k| k.kept_at)
    }

    /// The requests kept so far: method and path.
    pub fn kept(&self) -> Vec<(String, String)> {
        self.lock().kept.iter().map(|k| (k.request.method().to_string(), path_of(&k.request))).collect()
    }

    /// Stops holding and delivers every kept request, one after another in the order they were
    /// sent, each waited for; returns what became of them.
    pub async fn release(&self) -> Vec<Delivered> {
        let kept = {
            let mut shared = self.lock();
            shared.holding = None;
            shared.reads_of = None;
            std::mem::take(&mut shared.kept)
        };
        let mut out = Vec::new();
        for k in kept {
            let (method, path) = (k.request.method().to_string(), path_of(&k.request));
            let kept_for = k.kept_at.elapsed();
            let answer = self.upstream.send(k.request).await;
            let caller_waiting = !k.caller.is_closed();
            let code = answer.as_ref().map_or(0, |r| r.status().as_u16());
            let text = match answer {
                Ok(response) if !caller_waiting => match response.into_body().collect_bytes().await {
                    Ok(b) => String::from_utf8_lossy(&b).to_string(),
                    Err(e) => e.to_string(),
                },
                Ok(response) => {
                    let _ = k.caller.send(Ok(response));
                    String::new()
                }
                Err(e) => e.to_string(),
            };
            out.push(Delivered { method, path, kept_for, code, answer: text, caller_waiting });
        }
        out
    }
}

fn path_of<B>(request: &Request<B>) -> String {
    request.uri().path_and_query().map_or_else(String::new, |p| p.to_string())
}

/// Whether a request changes anything (everything but GET, HEAD and OPTIONS).
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

#[derive(Clone)]
struct HoldService {
    hold: WriteHold,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Request<Body>> for HoldService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let upstream = self.hold.upstream.clone();
        let keep = {
            let mut shared = self.hold.lock();
            let path = path_of(&request);
            let write_kept = match &shared.holding {
                Some(passing) => is_write(request.method()) && !passing.iter().any(|p| path.contains(p.as_str())),
                None => false,
            };
            let read_kept = shared
                .reads_of
                .as_deref()
                .is_some_and(|suffix| request.method() == Method::GET && request.uri().path().ends_with(suffix));
            let kept = write_kept || read_kept;
            if kept {
                let (caller, answer) = oneshot::channel();
                shared.kept.push(Kept { request, kept_at: Instant::now(), caller });
                Err(answer)
            } else {
                Ok(request)
            }
        };
        Box::pin(async move {
            match keep {
                Ok(request) => upstream.send(request).await.map_err(|e| Box::new(e) as BoxError),
                Err(answer) => match answer.await {
                    Ok(answer) => answer.map_err(|e| Box::new(e) as BoxError),
                    Err(_) => Err("the hold was dropped".into()),
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_are_kept() {
        assert!(!is_write(&Method::GET));
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_write(&m), "{m}");
        }
    }
}
