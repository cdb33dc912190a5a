//! What a simulation reports: one record per thing that happened, rendered as a readable
//! timeline or as JSON lines (`--output json`), closed by the final status of every check.

use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Seconds since the scenario's start (millisecond precision).
    pub t: f64,
    /// What happened (`Unhealthy`, `RemediationCreated`, … — docs/scenario.md "Output").
    pub event: String,
    /// `MachineHealthCheck/<ns>/<name>` or `NodeHealthCheck/<name>`; null for scenario and model
    /// events.
    pub check: Option<String>,
    /// `<ns>/<name>` for Machines, `<name>` for Nodes; null when the event is about the check.
    pub target: Option<String>,
    /// Event-specific fields (reason, message, kind, namespace, name, …).
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// Seconds since start, rounded to the millisecond.
pub fn seconds(nanos: i128) -> f64 {
    let millis = (nanos as f64 / 1e6).round();
    millis / 1e3
}

/// The JSON-lines form: one event per line, then the `Final` line.
pub fn json_lines(events: &[Event], final_statuses: &BTreeMap<String, Value>, end_t: f64) -> String {
    let mut out = String::new();
    for e in events {
        out.push_str(&serde_json::to_string(e).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&json!({"t": end_t, "event": "Final", "checks": final_statuses}).to_string());
    out.push('\n');
    out
}

fn clock(t: f64) -> String {
    let total_ms = (t * 1000.0).round() as i64;
    let (h, rem) = (total_ms / 3_600_000, total_ms % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    let (s, ms) = (rem / 1000, rem % 1000);
    if ms == 0 { format!("+{h:02}:{m:02}:{s:02}    ") } else { format!("+{h:02}:{m:02}:{s:02}.{ms:03}") }
}

/// The readable form.
pub fn text(name: &str, events: &[Event], final_statuses: &BTreeMap<String, Value>) -> String {
    text_styled(name, events, final_statuses, false)
}

/// ANSI colour of an event name: red for what needs attention, yellow for what Vigil does,
/// green for recoveries, none for the rest.
fn colour_of(event: &str) -> Option<&'static str> {
    match event {
        "MachineMarkedUnhealthy"
        | "DetectedUnhealthy"
        | "Flapping"
        | "RemediationRestricted"
        | "NoTemplateLeft"
        | "RemediationSkipped"
        | "RemediationTimedOut"
        | "NoDecision"
        | "RemediationFailed"
        | "FailureDomainShortCircuit"
        | "WriteFailed"
        | "StaleCondition" => Some("31"),
        "RemediationRequested" | "RemediationCreated" | "RemediationRemoved" | "MachineReplaced" => Some("33"),
        "MachineHealthy"
        | "NodeHealthy"
        | "RemediationAllowed"
        | "NodeRecovered"
        | "NodeJoined"
        | "Resumed"
        | "FailureDomainResumed" => Some("32"),
        _ => None,
    }
}

fn paint(text: &str, code: Option<&str>, colour: bool) -> String {
    match code {
        Some(code) if colour => format!("\x1b[{code}m{text}\x1b[0m"),
        _ => text.to_string(),
    }
}

/// One line per check: how many targets were found unhealthy, remediations requested or
/// created, short-circuits, and recoveries over the run.
fn summary(events: &[Event], final_statuses: &BTreeMap<String, Value>) -> String {
    let mut out = String::from("summary:\n");
    for check in final_statuses.keys() {
        let count = |kinds: &[&str]| {
            events.iter().filter(|e| e.check.as_deref() == Some(check) && kinds.contains(&e.event.as_str())).count()
        };
        out.push_str(&format!(
            "  {check}: {} unhealthy, {} remediations, {} short-circuits, {} healthy again\n",
            // a flapping target is found unhealthy by its flaps
            count(&["MachineMarkedUnhealthy", "DetectedUnhealthy", "Flapping"]),
            count(&["RemediationRequested", "RemediationCreated"]),
            count(&["RemediationRestricted"]),
            count(&["MachineHealthy", "NodeHealthy"]),
        ));
    }
    out
}

/// The readable form, with ANSI colours when `colour` (stdout is a terminal, no `NO_COLOR`).
pub fn text_styled(name: &str, events: &[Event], final_statuses: &BTreeMap<String, Value>, colour: bool) -> String {
    let mut out = format!("scenario {name}\n");
    for e in events {
        let who = match (&e.check, &e.target) {
            (Some(c), Some(t)) => format!("{c} {t}"),
            (Some(c), None) => c.clone(),
            (None, Some(t)) => t.clone(),
            (None, None) => String::new(),
        };
        let event = paint(&format!("{:<20}", e.event), colour_of(&e.event), colour);
        out.push_str(&format!("{}  {event} {who}  {}\n", clock(e.t), event_text(e)));
    }
    out.push_str("final status:\n");
    for (check, status) in final_statuses {
        out.push_str(&status_line(check, status));
    }
    out.push_str(&summary(events, final_statuses));
    out
}

/// What an event line says after who it is about: the object, the condition set, the
/// replacement, or the reason and message.
fn event_text(e: &Event) -> String {
    let detail = |k: &str| e.details.get(k).and_then(Value::as_str).unwrap_or("");
    match e.event.as_str() {
        "RemediationCreated" | "RemediationRemoved" | "Applied" | "Deleted" | "RemediationFailed" => {
            let ns = detail("namespace");
            let obj = if ns.is_empty() { detail("name").to_string() } else { format!("{ns}/{}", detail("name")) };
            format!("{} {obj}", detail("kind"))
        }
        "NodeConditionSet" => format!("{}={} {}", detail("type"), detail("status"), detail("reason")),
        "MachineReplaced" => format!("replaced by {}", detail("replacement")),
        _ => {
            let reason = detail("reason");
            let message = detail("message");
            match (reason.is_empty(), message.is_empty()) {
                (true, true) => String::new(),
                (false, true) => reason.to_string(),
                (true, false) => message.to_string(),
                (false, false) => format!("{reason}: {message}"),
            }
        }
    }
}

/// One check's final status line: its counts and conditions, then what the optional features
/// report ([`feature_text`]).
fn status_line(check: &str, status: &Value) -> String {
    let s = |k: &str| status.get(k).map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    let conditions: Vec<String> = status
        .get("conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| format!("{}={}", c["type"].as_str().unwrap_or(""), c["status"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    let would = feature_text(status);
    if check.starts_with("MachineHealthCheck/") {
        format!(
            "  {check}: expected {} healthy {} remediationsAllowed {} [{}]{would}\n",
            s("expectedMachines"),
            s("currentHealthy"),
            s("remediationsAllowed"),
            conditions.join(" ")
        )
    } else {
        let unhealthy = status.get("unhealthyNodes").and_then(Value::as_array).map_or(0, Vec::len);
        format!(
            "  {check}: phase {} observed {} healthy {} unhealthy {unhealthy} [{}]{would}\n",
            s("phase").trim_matches('"'),
            s("observedNodes"),
            s("healthyNodes"),
            conditions.join(" ")
        )
    }
}

/// What a status' optional features say: a check in dry-run, what it would remediate and since
/// when; each failure domain's counts and which are paused; how many targets have a condition
/// set aside as stale, and the first names.
fn feature_text(status: &Value) -> String {
    let would: String = status
        .get("wouldRemediate")
        .and_then(Value::as_array)
        .map(|ws| {
            ws.iter()
                .map(|w| {
                    let text = |k: &str| w[k].as_str().unwrap_or("");
                    format!(" wouldRemediate {} ({}) since {}", text("name"), text("action"), text("since"))
                })
                .collect()
        })
        .unwrap_or_default();
    let domains: String = status
        .get("failureDomains")
        .and_then(Value::as_array)
        .map(|ds| {
            ds.iter()
                .map(|d| {
                    format!(
                        " domain {} {}/{} unhealthy allowed {}{}",
                        d["name"].as_str().unwrap_or(""),
                        d["unhealthy"],
                        d["targets"],
                        d["allowed"],
                        if d["paused"].as_bool() == Some(true) { " paused" } else { "" }
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let would = format!("{would}{domains}");
    let stale_count = status.get("staleTargetCount").and_then(Value::as_i64).unwrap_or(0);
    if stale_count == 0 {
        return would;
    }
    let names: Vec<&str> = status
        .get("staleTargets")
        .and_then(Value::as_array)
        .map(|ts| ts.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    format!("{would} staleTargets {stale_count} ({})", names.join(" "))
}

/// Every object of the store as multi-document YAML (`--dump`), workload-cluster objects
/// marked with a `# cluster: <namespace>/<name>` comment.
pub fn dump_yaml(store: &crate::store::Store) -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::new();
    for (key, object) in store.all() {
        out.push_str("---\n");
        if !key.cluster.is_empty() {
            out.push_str(&format!("# cluster: {}\n", key.cluster));
        }
        out.push_str(&serde_saphyr::to_string(&*object)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_marks_event_names_only_when_asked() {
        let events = vec![
            Event {
                t: 1.0,
                event: "DetectedUnhealthy".into(),
                check: Some("c".into()),
                target: Some("n1".into()),
                details: Map::new(),
            },
            Event {
                t: 2.0,
                event: "NodeHealthy".into(),
                check: Some("c".into()),
                target: Some("n1".into()),
                details: Map::new(),
            },
            Event { t: 3.0, event: "Applied".into(), check: None, target: Some("n1".into()), details: Map::new() },
        ];
        let statuses = BTreeMap::from([("c".to_string(), json!({}))]);
        let coloured = text_styled("s", &events, &statuses, true);
        assert!(coloured.contains("\x1b[31mDetectedUnhealthy"), "{coloured}");
        assert!(coloured.contains("\x1b[32mNodeHealthy"), "{coloured}");
        assert!(!coloured.contains("\x1b[0m  Applied") && coloured.contains("  Applied "), "{coloured}");
        assert!(!text_styled("s", &events, &statuses, false).contains('\x1b'));
        assert!(coloured.ends_with("summary:\n  c: 1 unhealthy, 0 remediations, 0 short-circuits, 1 healthy again\n"));
    }
}
