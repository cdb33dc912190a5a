//! `vigil snapshot`: the live fleet as a scenario file (format v1) with an empty timeline, so an
//! operator can add "at 5m, these Nodes go Unknown" and simulate the outage on the real fleet.

use crate::live::Fleet;
use jiff::Timestamp;
use serde::ser::{Error as _, SerializeMap as _, SerializeSeq as _};
use serde::{Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// The scenario as written, fields in the order of docs/scenario.md.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Out<'a> {
    name: &'a str,
    start: String,
    duration: &'a str,
    objects: Objects<'a>,
    #[serde(skip_serializing_if = "Clusters::is_empty")]
    workload_clusters: Clusters<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_namespace: Option<&'a str>,
    timeline: [Value; 0],
}

/// How the objects kept as JSON text are written: as they are (JSON), or read back into trees one
/// at a time (any other format: a `RawValue` is JSON's own).
#[derive(Clone, Copy, PartialEq)]
enum Text {
    AsIs,
    ReadBack,
}

/// One packed object, written in `mode`.
struct Packed<'a>(&'a RawValue, Text);

impl Serialize for Packed<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.1 {
            Text::AsIs => self.0.serialize(serializer),
            Text::ReadBack => {
                serde_json::from_str::<Value>(self.0.get()).map_err(S::Error::custom)?.serialize(serializer)
            }
        }
    }
}

/// The health checks, then every other object of the management cluster.
struct Objects<'a>(&'a [Value], &'a [Box<RawValue>], Text);

impl Serialize for Objects<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len() + self.1.len()))?;
        for check in self.0 {
            seq.serialize_element(check)?;
        }
        for object in self.1 {
            seq.serialize_element(&Packed(object, self.2))?;
        }
        seq.end()
    }
}

/// The Nodes of each workload cluster.
struct Clusters<'a>(&'a BTreeMap<String, Vec<Box<RawValue>>>, Text);

impl Clusters<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Clusters<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (cluster, nodes) in self.0 {
            map.serialize_entry(cluster, &Objects(&[], nodes, self.1))?;
        }
        map.end()
    }
}

/// The scenario of the fleet, starting at `now` (to the second) and lasting `duration`.
fn scenario<'a>(fleet: &'a Fleet, start: Timestamp, duration: &'a str, text: Text) -> Out<'a> {
    Out {
        name: "snapshot",
        start: start.to_string(),
        duration,
        objects: Objects(&fleet.checks, &fleet.objects, text),
        workload_clusters: Clusters(&fleet.workload_clusters, text),
        lease_namespace: Some(fleet.lease_namespace.as_str())
            .filter(|ns| *ns != vigil_api::well_known::DEFAULT_LEASE_NAMESPACE && !ns.is_empty()),
        timeline: [],
    }
}

/// The snapshot's start: `now` to the second, as written in both formats.
fn start_of(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// Renders the fleet as a scenario starting at `now` (to the second) and lasting `duration`.
pub fn scenario_yaml(fleet: &Fleet, now: Timestamp, duration: &str) -> Result<String, serde_saphyr::SerializeError> {
    let start = start_of(now);
    let header = format!(
        "# Written by `vigil snapshot` at {start}: the live health checks, Clusters, Machines, Nodes,\n\
         # templates, remediation objects, node Leases, maintenance and cluster versions (Secrets left out). Add timeline entries, e.g.\n\
         #   - at: 5m\n\
         #     setNodeCondition: {{nodeSelector: {{topology.kubernetes.io/zone: b}}, type: Ready, status: Unknown}}\n\
         # then run `vigil simulate` on this file.\n"
    );
    Ok(header + &serde_saphyr::to_string(&scenario(fleet, start, duration, Text::ReadBack))?)
}

/// The same scenario as compact JSON on one line, which `vigil simulate` reads many times faster
/// than YAML. JSON has no comments: the time the YAML header gives is the `start` field.
pub fn scenario_json(fleet: &Fleet, now: Timestamp, duration: &str) -> Result<String, serde_json::Error> {
    Ok(serde_json::to_string(&scenario(fleet, start_of(now), duration, Text::AsIs))? + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use vigil_simulator::Scenario;

    fn fleet() -> Fleet {
        let node = |name: &str, zone: &str| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
                "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2029-12-01T00:00:00Z"}]}})
        };
        let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": "m-1", "namespace": "prod", "labels": {"cluster.x-k8s.io/cluster-name": "c1", "note": "a: \"b\" # c"}},
            "spec": {"clusterName": "c1"}, "status": {"nodeRef": {"name": "w-1"}}});
        Fleet {
            checks: Vec::new(),
            objects: crate::live::packed(vec![node("mgmt-1", "a"), machine]),
            workload_clusters: BTreeMap::from([(
                "prod/c1".to_string(),
                crate::live::packed(vec![node("w-1", "b"), node("w-2", "ü")]),
            )]),
            unreachable: BTreeMap::new(),
            notes: Vec::new(),
            lease_namespace: "node-leases".into(),
        }
    }

    #[test]
    fn the_json_snapshot_reads_as_the_same_scenario_as_the_yaml_one() {
        let (fleet, now) = (fleet(), "2030-01-02T03:04:05.678Z".parse().expect("time"));
        let yaml = scenario_yaml(&fleet, now, "45m").expect("yaml");
        let json = scenario_json(&fleet, now, "45m").expect("json");
        assert!(json.ends_with("}\n") && json.lines().count() == 1, "compact, one line: {json}");
        let (from_yaml, from_json) =
            (Scenario::parse(&yaml).expect("yaml reads"), Scenario::parse(&json).expect("json reads"));
        assert_eq!(format!("{from_json:?}"), format!("{from_yaml:?}"));
        assert_eq!(from_json.start.to_string(), "2030-01-02T03:04:05Z");
        assert_eq!((from_json.objects.len(), from_json.workload_clusters["prod/c1"].len()), (2, 2));
        assert_eq!(from_json.lease_namespace, "node-leases");
    }
}
