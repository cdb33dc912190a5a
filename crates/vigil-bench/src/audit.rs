//! The controller's requests, as the API server's audit log records them (only the audited
//! user's requests are logged: see `vigil_testenv::AUDITED_USER`).

use anyhow::{Context as _, Result};
use jiff::Timestamp;
use serde::Deserialize;
use std::collections::HashSet;
use std::path::Path;

/// One request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// Resource (`machines`, `nodes`, `events`…), empty for non-resource URLs.
    pub resource: String,
    /// Subresource (`status`) or empty.
    pub subresource: String,
    /// When the API server received it.
    pub at: Timestamp,
}

impl Request {
    /// Whether it changes state.
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    request_received_timestamp: Timestamp,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
}

/// Reads the audit log: one [`Request`] per audit ID (a watch logs a stage when it starts and
/// another when it ends; a request is counted once), in log order.
pub fn read(path: &Path) -> Result<Vec<Request>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the audit log {}", path.display()))?;
    parse(&text).with_context(|| path.display().to_string())
}

fn parse(text: &str) -> Result<Vec<Request>> {
    let mut ids = HashSet::new();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let e: Event = serde_json::from_str(line).with_context(|| format!("audit line {}", n + 1))?;
        if !ids.insert(e.audit_id) {
            continue;
        }
        let (resource, subresource) = e.object_ref.map(|r| (r.resource, r.subresource)).unwrap_or_default();
        out.push(Request { verb: e.verb, resource, subresource, at: e.request_received_timestamp });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_per_audit_id() {
        let log = r#"{"kind":"Event","level":"Metadata","auditID":"a","stage":"ResponseStarted","verb":"watch","objectRef":{"resource":"nodes","apiVersion":"v1"},"requestReceivedTimestamp":"2026-11-21T10:00:00.123456Z"}
{"kind":"Event","level":"Metadata","auditID":"b","stage":"ResponseComplete","verb":"patch","objectRef":{"resource":"machines","namespace":"bench","name":"m","apiGroup":"cluster.x-k8s.io","subresource":"status"},"requestReceivedTimestamp":"2026-11-21T10:00:01Z"}
{"kind":"Event","level":"Metadata","auditID":"a","stage":"ResponseComplete","verb":"watch","objectRef":{"resource":"nodes","apiVersion":"v1"},"requestReceivedTimestamp":"2026-11-21T10:00:00.123456Z"}
{"kind":"Event","level":"Metadata","auditID":"c","stage":"ResponseComplete","verb":"get","requestReceivedTimestamp":"2026-11-21T10:00:02Z"}
"#;
        let requests = parse(log).expect("parse");
        assert_eq!(requests.len(), 3);
        assert_eq!((requests[0].verb.as_str(), requests[0].resource.as_str()), ("watch", "nodes"));
        assert!(requests[1].is_write() && requests[1].subresource == "status");
        assert_eq!(requests[2].resource, "", "a non-resource URL (discovery)");
        assert!(parse("{not json").is_err());
    }
}
