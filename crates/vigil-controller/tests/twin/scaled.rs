//! A scenario made to run in real time: its clock `k` times faster, and its start moved.
//!
//! The files in `examples/` tell stories of minutes; the twin test replays them against a real
//! API server in seconds. [`faster`] divides every time of a scenario by `k`: its duration, the
//! offsets of its timeline, its models' delays, every duration written in its objects (a check's
//! timeouts) and every `…Seconds` count (a Lease's duration), and maps every timestamp written in
//! them onto the new start at the same pace. The result is a scenario of its own, run by both
//! worlds alike: what the twin test compares is the two runs, not the run with the file's story.
//! Two things stay as the file's story does not say: a time the API refuses below a minimum
//! (`nodeStartupTimeout` under 30s, an escalation step's timeout or a
//! `maxConditionAge` under 1m) is raised to it, and the engine's own defaults are not
//! scaled.

use anyhow::{Context as _, Result};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value};
use vigil_simulator::Scenario;
use vigil_simulator::scenario::{Change, RemediatorOutcome};

/// Durations the API refuses below a minimum, by the end of their path (field names joined by
/// dots, list positions left out), and that minimum.
const MINIMUMS: [(&str, SignedDuration); 3] = [
    ("nodeStartupTimeout", SignedDuration::from_secs(30)),
    ("maxConditionAge", SignedDuration::from_secs(60)),
    ("escalatingRemediations.timeout", SignedDuration::from_secs(60)),
];

/// `scenario` with its clock `k` times faster, starting at `start`.
pub fn faster(mut scenario: Scenario, k: i32, start: Timestamp) -> Result<Scenario> {
    let pace = Pace { k, from: scenario.start, to: start };
    scenario.start = start;
    scenario.duration /= k;
    for object in scenario.objects.iter_mut().chain(scenario.workload_clusters.values_mut().flatten()) {
        // Each world stamps a created object itself: the API server with its own clock.
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("creationTimestamp");
        }
        pace.rewrite(object, "")?;
    }
    for step in &mut scenario.timeline {
        step.at /= k;
        if let Change::Apply(object) = &mut step.change {
            pace.rewrite(object, "")?;
        }
    }
    let models = &mut scenario.models;
    if let Some(owner) = &mut models.owner {
        owner.replace_after /= k;
        owner.node_ready_after /= k;
    }
    for r in &mut models.remediators {
        r.outcome = match r.outcome {
            RemediatorOutcome::Recovers(d) => RemediatorOutcome::Recovers(d / k),
            RemediatorOutcome::Fails(d) => RemediatorOutcome::Fails(d / k),
        };
        r.holds_deletion = r.holds_deletion.map(|d| d / k);
    }
    for h in &mut models.heartbeats {
        h.every /= k;
        h.from /= k;
        h.until = h.until.map(|d| d / k);
    }
    Ok(scenario)
}

/// `scenario` with its timeline, its heartbeats and its end `by` later: the simulator's twin of
/// a live run whose timeline began `by` after the objects were written.
pub fn delayed(mut scenario: Scenario, by: SignedDuration) -> Scenario {
    scenario.duration += by;
    for step in &mut scenario.timeline {
        step.at += by;
    }
    for h in &mut scenario.models.heartbeats {
        h.from += by;
        h.until = h.until.map(|u| u + by);
    }
    scenario
}

/// How times map from the file's clock onto the faster one.
struct Pace {
    k: i32,
    from: Timestamp,
    to: Timestamp,
}

impl Pace {
    /// Rewrites every time inside `value`, held at `path`.
    fn rewrite(&self, value: &mut Value, path: &str) -> Result<()> {
        match value {
            Value::Object(map) => self.rewrite_map(map, path),
            Value::Array(items) => items.iter_mut().try_for_each(|v| self.rewrite(v, path)),
            Value::String(text) => {
                if let Some(new) = self.time(text, path)? {
                    *text = new;
                }
                Ok(())
            }
            Value::Number(n) if path.ends_with("Seconds") => {
                let seconds = n.as_i64().context("a count of seconds")?;
                *value = Value::from((seconds / i64::from(self.k)).max(1));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn rewrite_map(&self, map: &mut Map<String, Value>, path: &str) -> Result<()> {
        for (key, v) in map.iter_mut() {
            self.rewrite(v, &format!("{path}.{key}"))?;
        }
        Ok(())
    }

    /// The faster twin of a timestamp or a Go duration; `None` for any other text.
    fn time(&self, text: &str, path: &str) -> Result<Option<String>> {
        if let Ok(at) = text.parse::<Timestamp>() {
            // In the file's precision: whole seconds, as the API server keeps most times, or
            // microseconds (a Lease's `MicroTime`, which must be written so).
            let since = at.duration_since(self.from) / self.k;
            let mapped = self.to.checked_add(since)?;
            let text = if text.contains('.') {
                mapped.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
            } else {
                Timestamp::from_second(mapped.as_second())?.to_string()
            };
            return Ok(Some(text));
        }
        let looks_like_duration = text.starts_with(|c: char| c.is_ascii_digit())
            && text.ends_with(|c: char| c.is_ascii_alphabetic())
            && text != "0";
        let Some(d) = looks_like_duration.then(|| vigil_api::duration::parse_go_duration(text).ok()).flatten() else {
            return Ok(None);
        };
        let minimum = MINIMUMS.iter().find(|(end, _)| path.ends_with(&format!(".{end}"))).map(|(_, m)| *m);
        let scaled = (d / self.k).max(minimum.unwrap_or(SignedDuration::ZERO));
        Ok(Some(format!("{}ms", scaled.as_millis())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORY: &str = r#"
name: story
start: "2030-01-01T00:00:00Z"
duration: 30m
objects:
  - apiVersion: vigil.dev/v1alpha1
    kind: MachineHealthCheck
    metadata: {name: workers, namespace: default}
    spec:
      clusterName: prod
      selector: {matchLabels: {pool: workers}}
      nodeStartupTimeout: 5m
      unhealthyConditions:
        - {type: Ready, status: "False", timeout: 300s}
  - apiVersion: v1
    kind: Node
    metadata: {name: w-1, creationTimestamp: "2029-12-01T00:00:00Z"}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: "2029-12-31T23:59:00Z", lastTransitionTime: "2029-12-01T00:00:00Z"}
timeline:
  - at: 4m
    apply:
      apiVersion: coordination.k8s.io/v1
      kind: Lease
      metadata: {name: node-w-1, namespace: medik8s-leases}
      spec: {holderIdentity: node-maintenance, leaseDurationSeconds: 3600, renewTime: "2030-01-01T00:04:00.000000Z"}
models:
  owner: {replaceAfter: 2m, nodeReadyAfter: 5m}
  heartbeats:
    - {type: Ready, every: 1m, until: 20m}
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3m, holdsDeletion: 1m}
"#;

    #[test]
    fn every_time_of_a_story_runs_sixty_times_faster_from_the_new_start() -> Result<()> {
        let start: Timestamp = "2026-06-01T12:00:00Z".parse()?;
        let s = faster(Scenario::parse(STORY)?, 60, start)?;
        assert_eq!((s.start, s.duration), (start, SignedDuration::from_secs(30)));
        let check = &s.objects[0]["spec"];
        assert_eq!(check["unhealthyConditions"][0]["timeout"], "5000ms");
        assert_eq!(check["nodeStartupTimeout"], "30000ms", "raised to the API's minimum");
        let node = &s.objects[1];
        assert!(node["metadata"].get("creationTimestamp").is_none(), "each world stamps its own");
        let ready = &node["status"]["conditions"][0];
        assert_eq!(ready["lastHeartbeatTime"], "2026-06-01T11:59:59Z", "a minute before, a second before");
        assert_eq!(ready["lastTransitionTime"], "2026-05-31T23:36:00Z", "31 days before, 12.4 hours before");
        assert_eq!(s.timeline[0].at, SignedDuration::from_secs(4));
        let Change::Apply(lease) = &s.timeline[0].change else { panic!("an apply") };
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 60);
        assert_eq!(lease["spec"]["renewTime"], "2026-06-01T12:00:04.000000Z", "a MicroTime stays one");
        assert_eq!(lease["spec"]["holderIdentity"], "node-maintenance", "other text stays");
        let owner = s.models.owner.context("the owner")?;
        assert_eq!(
            (owner.replace_after, owner.node_ready_after),
            (SignedDuration::from_secs(2), SignedDuration::from_secs(5))
        );
        let r = &s.models.remediators[0];
        assert_eq!(r.outcome, RemediatorOutcome::Recovers(SignedDuration::from_secs(3)));
        assert_eq!(r.holds_deletion, Some(SignedDuration::from_secs(1)));
        let h = &s.models.heartbeats[0];
        assert_eq!((h.every, h.until), (SignedDuration::from_secs(1), Some(SignedDuration::from_secs(20))));
        Ok(())
    }

    #[test]
    fn a_delayed_twin_moves_the_timeline_and_the_end_but_not_the_objects() -> Result<()> {
        let s = Scenario::parse(STORY)?;
        let d = delayed(s.clone(), SignedDuration::from_secs(7));
        assert_eq!(d.duration, s.duration + SignedDuration::from_secs(7));
        assert_eq!(d.timeline[0].at, SignedDuration::from_secs(4 * 60 + 7));
        assert_eq!(d.models.heartbeats[0].until, Some(SignedDuration::from_secs(20 * 60 + 7)));
        assert_eq!(d.objects, s.objects);
        Ok(())
    }
}
