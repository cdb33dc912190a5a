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
use std::time::{Duration, Instant};

use either::Either;
use kube::Client;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{Request, Resource, Status};
use serde::Serialize;
use serde::de::DeserializeOwned;

tokio::task_local! {
    /// When the right to write of the write being made ends (see [`within`]).
    static DEADLINE: Instant;
}

/// The API server's longest request timeout: a longer `?timeout=` is cut to it anyway.
const SERVER_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// Runs one write with `limit` (what is left of the right to write, or less): the client gives
/// up on it after `limit` (`None`), and every request it sends meanwhile carries the time left
/// as its `?timeout=`.
pub(crate) async fn within<T>(limit: Duration, write: impl Future<Output = T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    DEADLINE.scope(deadline, tokio::time::timeout(limit, write)).await.ok()
}

/// The `?timeout=` a request sent now carries: the time left of the current write's limit, in
/// whole milliseconds (at least one), at most [`SERVER_TIMEOUT_MAX`]; none outside [`within`].
fn server_timeout() -> Option<Duration> {
    let left = DEADLINE.try_with(|d| d.saturating_duration_since(Instant::now())).ok()?;
    Some(left.min(SERVER_TIMEOUT_MAX).max(Duration::from_millis(1)))
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
    client.request::<T>(with_timeout(request, server_timeout())).await
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
    client.request_status::<T>(with_timeout(request, server_timeout())).await
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
        assert_eq!(server_timeout(), None, "outside a write");
        let inside = within(Duration::from_millis(800), async { server_timeout() }).await.flatten();
        assert!(
            inside.is_some_and(|t| t <= Duration::from_millis(800) && t > Duration::from_millis(500)),
            "{inside:?}"
        );
        let long = within(Duration::from_secs(600), async { server_timeout() }).await.flatten();
        assert_eq!(long, Some(SERVER_TIMEOUT_MAX));
        let late = within(Duration::from_millis(10), tokio::time::sleep(Duration::from_millis(200))).await;
        assert!(late.is_none(), "the client gives up at the limit");
    }
}
