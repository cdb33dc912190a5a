//! How long a write may take, and the requests that make one. Fencing stops a replica from
//! *starting* a write once its right to write has ended; a write started just before may still
//! *arrive* later (a stalled connection, a partition that heals). So every write is bounded
//! twice by what is left of the right when it starts: the client gives up on it then, and each
//! request asks the API server to give up by then too (`?timeout=`, which the API server honours
//! on every request that is not a watch or a proxy). Neither bounds how long a request spends on
//! the network before it reaches the API server: that is what the writes' own guards are for
//! (a `resourceVersion` to match, delete preconditions, names that make a repeated create a
//! conflict; docs/DECISIONS.md, "Writes that land late").

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use either::Either;
use kube::Client;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{Request, Resource, Status};
use serde::Serialize;
use serde::de::DeserializeOwned;

tokio::task_local! {
    /// The limit of the write being made (see [`within`]).
    static LIMIT: Limit;
}

/// The API server's longest request timeout: a longer `?timeout=` is cut to it anyway.
const SERVER_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// The least time a request is sent with: a write with less left of its limit (the right to
/// write, or the write timeout) is not sent, and its check is decided again later. An API server
/// write takes a round trip and a commit; one sent with a few milliseconds left (it had waited
/// on a read stuck in a partition) is refused by the API server's own timeout at best, and is
/// the write most likely to land after the right moved on.
pub const MIN_LEFT: Duration = Duration::from_millis(250);

/// When the current write's limit ends, and whether a request of it was held back for having
/// less than [`MIN_LEFT`] left.
struct Limit {
    deadline: Instant,
    held_back: Arc<AtomicBool>,
}

/// Why a write bounded by [`within`] did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// No answer within the limit (the write may or may not have been made).
    TimedOut,
    /// A request of it would have gone out with less than [`MIN_LEFT`] left: it was not sent.
    TooLittleLeft,
}

/// A request not sent for having less than [`MIN_LEFT`] of its write's limit left.
#[derive(Debug, thiserror::Error)]
#[error("not sent: {0:?} left of the write's limit, less than the {MIN_LEFT:?} a request needs")]
struct HeldBack(Duration);

/// Runs one write with `limit` (what is left of the right to write, or less): the client gives
/// up on it after `limit`, every request it sends meanwhile carries the time left as its
/// `?timeout=`, and no request goes out with less than [`MIN_LEFT`] left (nor does the write
/// start with less).
pub(crate) async fn within<T>(limit: Duration, write: impl Future<Output = T>) -> Result<T, Cut> {
    if limit < MIN_LEFT {
        return Err(Cut::TooLittleLeft);
    }
    let held_back = Arc::new(AtomicBool::new(false));
    let scope = Limit { deadline: Instant::now() + limit, held_back: held_back.clone() };
    let done = LIMIT.scope(scope, tokio::time::timeout(limit, write)).await;
    match done {
        _ if held_back.load(Ordering::Relaxed) => Err(Cut::TooLittleLeft),
        Ok(out) => Ok(out),
        Err(_) => Err(Cut::TimedOut),
    }
}

/// The `?timeout=` a request sent now carries: the time left of the current write's limit, in
/// whole milliseconds, at most [`SERVER_TIMEOUT_MAX`]; none outside [`within`]. With less than
/// [`MIN_LEFT`] left the request must not be sent (and the write is marked held back).
fn server_timeout() -> Result<Option<Duration>, HeldBack> {
    let Ok((left, held_back)) =
        LIMIT.try_with(|l| (l.deadline.saturating_duration_since(Instant::now()), l.held_back.clone()))
    else {
        return Ok(None);
    };
    if left < MIN_LEFT {
        held_back.store(true, Ordering::Relaxed);
        return Err(HeldBack(left));
    }
    Ok(Some(left.min(SERVER_TIMEOUT_MAX)))
}

/// `request` with the `timeout` query parameter added (a Go duration, in milliseconds).
fn with_timeout(mut request: http::Request<Vec<u8>>, timeout: Option<Duration>) -> http::Request<Vec<u8>> {
    let Some(timeout) = timeout else { return request };
    let uri = request.uri().to_string();
    let joint = match uri.contains('?') {
        true if uri.ends_with('?') || uri.ends_with('&') => "",
        true => "&",
        false => "?",
    };
    if let Ok(with) = format!("{uri}{joint}timeout={}ms", timeout.as_millis()).parse() {
        *request.uri_mut() = with;
    }
    request
}

/// The request builder for kind `K` (of dynamic type `dt`) in `namespace` (empty: cluster-scoped).
pub(crate) fn requests<K: Resource>(dt: &K::DynamicType, namespace: &str) -> Request {
    Request::new(K::url_path(dt, (!namespace.is_empty()).then_some(namespace)))
}

async fn send<T: DeserializeOwned>(
    client: &Client,
    built: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<T, kube::Error> {
    let request = built.map_err(kube::Error::BuildRequest)?;
    let timeout = server_timeout().map_err(|e| kube::Error::Service(Box::new(e)))?;
    client.request::<T>(with_timeout(request, timeout)).await
}

/// Creates `object` (bounded: see the module documentation).
pub(crate) async fn create<T: Serialize + DeserializeOwned>(
    client: &Client,
    requests: &Request,
    pp: &PostParams,
    object: &T,
) -> Result<T, kube::Error> {
    let data = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    send(client, requests.create(pp, data)).await
}

/// Replaces `name` with `object`, whose `metadata.resourceVersion` the API server checks.
pub(crate) async fn replace<T: Serialize + DeserializeOwned>(
    client: &Client,
    requests: &Request,
    name: &str,
    pp: &PostParams,
    object: &T,
) -> Result<T, kube::Error> {
    let data = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    send(client, requests.replace(name, pp, data)).await
}

/// Patches `name` (with `subresource`, e.g. `status`, when given).
pub(crate) async fn patch<T: DeserializeOwned, P: Serialize>(
    client: &Client,
    requests: &Request,
    name: &str,
    subresource: Option<&str>,
    pp: &PatchParams,
    patch: &Patch<P>,
) -> Result<T, kube::Error> {
    let built = match subresource {
        Some(sub) => requests.patch_subresource(sub, name, pp, patch),
        None => requests.patch(name, pp, patch),
    };
    send(client, built).await
}

/// Deletes `name` (its preconditions in `dp`): the object while finalizers hold it, else a
/// status.
pub(crate) async fn delete<T: DeserializeOwned>(
    client: &Client,
    requests: &Request,
    name: &str,
    dp: &DeleteParams,
) -> Result<Either<T, Status>, kube::Error> {
    let request = requests.delete(name, dp).map_err(kube::Error::BuildRequest)?;
    let timeout = server_timeout().map_err(|e| kube::Error::Service(Box::new(e)))?;
    client.request_status::<T>(with_timeout(request, timeout)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri_of(path: &str, timeout: Option<Duration>) -> String {
        let request = http::Request::post(path).body(Vec::new()).expect("request");
        with_timeout(request, timeout).uri().to_string()
    }

    #[test]
    fn the_timeout_joins_the_query_as_a_go_duration() {
        let t = Some(Duration::from_millis(2500));
        assert_eq!(uri_of("/api/v1/nodes?", t), "/api/v1/nodes?timeout=2500ms");
        assert_eq!(uri_of("/api/v1/nodes?fieldManager=vigil", t), "/api/v1/nodes?fieldManager=vigil&timeout=2500ms");
        assert_eq!(uri_of("/api/v1/nodes", t), "/api/v1/nodes?timeout=2500ms");
        assert_eq!(uri_of("/api/v1/nodes?", None), "/api/v1/nodes?", "no limit: no parameter");
    }

    #[tokio::test]
    async fn a_write_asks_the_api_server_for_what_is_left_of_its_limit() {
        assert!(matches!(server_timeout(), Ok(None)), "outside a write");
        let inside = within(Duration::from_millis(800), async { server_timeout().ok().flatten() }).await;
        assert!(
            inside.is_ok_and(|t| t.is_some_and(|t| t <= Duration::from_millis(800) && t > Duration::from_millis(500))),
            "{inside:?}"
        );
        let long = within(Duration::from_secs(600), async { server_timeout().ok().flatten() }).await;
        assert_eq!(long, Ok(Some(SERVER_TIMEOUT_MAX)));
        let late = within(Duration::from_millis(300), tokio::time::sleep(Duration::from_millis(400))).await;
        assert_eq!(late, Err(Cut::TimedOut), "the client gives up at the limit");
    }

    #[tokio::test]
    async fn a_request_with_too_little_of_its_limit_left_is_not_sent() {
        // A write that waited (on a read stuck in a partition) until less than the minimum was
        // left: its request is held back, and the write says so rather than that it failed.
        let sent = std::sync::atomic::AtomicBool::new(false);
        let write = async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let timeout = server_timeout()?;
            sent.store(true, Ordering::Relaxed);
            Ok::<_, HeldBack>(timeout)
        };
        assert_eq!(within(Duration::from_millis(800), write).await.map(|r| r.is_ok()), Err(Cut::TooLittleLeft));
        assert!(!sent.load(Ordering::Relaxed), "nothing went out");
        // A write that starts with less than the minimum does not start.
        let started = std::sync::atomic::AtomicBool::new(false);
        let quick = async { started.store(true, Ordering::Relaxed) };
        assert_eq!(within(MIN_LEFT - Duration::from_millis(1), quick).await, Err(Cut::TooLittleLeft));
        assert!(!started.load(Ordering::Relaxed));
        // With more than the minimum left it goes out.
        assert_eq!(within(MIN_LEFT + Duration::from_millis(50), async { server_timeout().is_ok() }).await, Ok(true));
    }
}
