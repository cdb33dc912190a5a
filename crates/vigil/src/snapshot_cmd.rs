//! `vigil snapshot`: the live fleet as a scenario file (format v1) with an empty timeline, so an
//! operator can add "at 5m, these Nodes go Unknown" and simulate the outage on the real fleet.

use crate::live::Fleet;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The scenario as written, fields in the order of docs/scenario.md.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Out<'a> {
    name: &'a str,
    start: String,
    duration: &'a str,
    objects: &'a [Value],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    workload_clusters: &'a BTreeMap<String, Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_namespace: Option<&'a str>,
    timeline: [Value; 0],
}

/// Renders the fleet as a scenario starting at `now` (to the second) and lasting `duration`.
pub fn scenario_yaml(fleet: &Fleet, now: Timestamp, duration: &str) -> Result<String, serde_saphyr::SerializeError> {
    let start = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let out = Out {
        name: "snapshot",
        start: start.to_string(),
        duration,
        objects: &fleet.objects,
        workload_clusters: &fleet.workload_clusters,
        lease_namespace: Some(fleet.lease_namespace.as_str())
            .filter(|ns| *ns != vigil_api::well_known::DEFAULT_LEASE_NAMESPACE && !ns.is_empty()),
        timeline: [],
    };
    let header = format!(
        "# Written by `vigil snapshot` at {start}: the live health checks, Clusters, Machines, Nodes,\n\
         # templates, remediation objects, node Leases, maintenance and cluster versions (Secrets left out). Add timeline entries, e.g.\n\
         #   - at: 5m\n\
         #     setNodeCondition: {{nodeSelector: {{topology.kubernetes.io/zone: b}}, type: Ready, status: Unknown}}\n\
         # then run `vigil simulate` on this file.\n"
    );
    Ok(header + &serde_saphyr::to_string(&out)?)
}
