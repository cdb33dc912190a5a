//! What every write shares, whichever module sends it: its error and that error's stable
//! category (metrics and logs count by it), its deadline, its field manager and the shape of a
//! patch guarded by a `resourceVersion`. The bottom of the write path: it imports nothing of
//! the controller.

use kube::api::PatchParams;
use serde_json::{Value, json};

/// Field manager of every write.
pub const FIELD_MANAGER: &str = "vigil";

/// How many verdict-only Machine writes run at once across every check. Each write in flight
/// holds an HTTP/1.1 connection, and the client keeps every connection it opened (buffers,
/// TLS state): 16 workers each writing 32 verdicts at once opened ~540 connections during a
/// 10 000-Machine cold start and kept them. The API server absorbs ~250 writes/s
/// there, which 64 in flight already keep it busy with. Remediating writes never wait for one.
pub const VERDICT_WRITES_IN_FLIGHT: usize = 64;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The API server refused or could not be reached.
    #[error("{what}: {source}")]
    Api {
        /// The write.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The kind of an object could not be resolved.
    #[error("{0}")]
    Discovery(String),
    /// No answer in time (the write may or may not have been made).
    #[error("{0}: no answer in time")]
    Timeout(String),
    /// This replica does not lead (or its right to write ran out): nothing was sent.
    #[error("{0}: not sent, this replica does not hold the lease")]
    NotLeader(String),
    /// Too little of the right to write (or of the write's time) was left when a request of it
    /// was to go out (the writer says how little): nothing more was sent; decided again later.
    #[error("{0}: not sent, the right to write was about to end")]
    RightEnding(String),
    /// Not sent: the Node's previous remediation step is not confirmed given up (its
    /// `nhc-timed-out` annotation failed), and two steps must never be live at once.
    #[error("{0}: not sent, the previous step's timed-out annotation is not confirmed")]
    Unconfirmed(String),
}

impl WriteError {
    /// Every [`WriteError::category`], so the metrics can serve each at 0 before its first error
    /// (a counter that appears at 1 loses that first error in `rate()`).
    pub const CATEGORIES: [&'static str; 8] =
        ["conflict", "forbidden", "refused", "unreachable", "discovery", "timeout", "not_leader", "unconfirmed"];

    /// A stable category for metrics and events.
    pub fn category(&self) -> &'static str {
        match self {
            WriteError::Api { source: kube::Error::Api(s), .. } if s.code == 409 => "conflict",
            WriteError::Api { source: kube::Error::Api(s), .. } if s.code == 403 => "forbidden",
            WriteError::Api { source: kube::Error::Api(_), .. } => "refused",
            WriteError::Api { .. } => "unreachable",
            WriteError::Discovery(_) => "discovery",
            WriteError::Timeout(_) => "timeout",
            WriteError::NotLeader(_) | WriteError::RightEnding(_) => "not_leader",
            WriteError::Unconfirmed(_) => "unconfirmed",
        }
    }

    /// Whether the API server refused the write because the object changed since it was read
    /// (the object is then read again, and the check decided again on it).
    pub fn is_conflict(&self) -> bool {
        self.category() == "conflict"
    }
}

/// How long one write may take before it counts as failed, when the right to write lasts longer
/// (or always: no election).
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Wraps an API error with the write it failed.
pub fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> WriteError {
    let what = what.into();
    move |source| WriteError::Api { what, source }
}

/// Whether `e` is the API server's answer `code`.
pub fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// A merge patch that the API server carries out only while the object is at `resource_version`
/// (none: unconditionally, for an object that did not come from an API server).
pub fn at_version(mut patch: Value, resource_version: Option<&str>) -> Value {
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    patch
}

/// Every patch Vigil sends names its field manager.
pub fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }
}
