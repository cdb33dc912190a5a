//! The scenario's owner and heartbeat models, played live as the simulator plays them (the
//! owner's rules are the simulator's own, `vigil_simulator::owner`).
//!
//! The owner (MachineSet-like) replaces a Machine whose `HealthCheckSucceeded` and
//! `OwnerRemediated` are both `False` once `replaceAfter` has passed since it was asked (not
//! while its Cluster or the Machine is paused): the Machine and its Node go, a Machine named
//! `<base>-r<n>` comes, and its Node joins Ready `nodeReadyAfter` later. A heartbeat model renews
//! its condition's `lastHeartbeatTime` on the Nodes it covers every `every`, from `from` until
//! `until`.

use anyhow::{Context as _, Result};
use jiff::Timestamp;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vigil_simulator::Scenario;
use vigil_simulator::owner;
use vigil_simulator::store::api_time;
use vigil_testenv::TestEnv;

/// What the live owner knows: when each Machine was asked for, and which Nodes are to join.
#[derive(Default)]
pub struct Owner {
    /// Machines asked for (`namespace/name`) and since when.
    asked: BTreeMap<String, Instant>,
    /// Replacement Machines (`namespace/name`, apiVersion) and when their Nodes join.
    joining: Vec<(String, String, Instant)>,
    /// Replacements made so far (their names' suffix).
    made: u64,
}

impl Owner {
    /// One look at the Machines of `env` (their Nodes in `nodes`).
    pub async fn look(&mut self, env: &TestEnv, nodes: &TestEnv, scenario: &Scenario) -> Result<()> {
        let Some(model) = scenario.models.owner else { return Ok(()) };
        let replace_after = Duration::try_from(model.replace_after)?;
        let machines = machine_api_versions(scenario);
        for api_version in &machines {
            for machine in env.list_json(api_version, "Machine", None, "").await? {
                let key = key_of(&machine);
                if !owner::asked(&machine) {
                    self.asked.remove(&key);
                    continue;
                }
                let since = *self.asked.entry(key.clone()).or_insert_with(Instant::now);
                if since.elapsed() < replace_after {
                    continue;
                }
                if paused(env, &machine).await? {
                    // Asked again once the pause is lifted, as the simulator's owner looks again.
                    self.asked.insert(key, Instant::now());
                    continue;
                }
                self.asked.remove(&key);
                self.replace(env, nodes, &machine).await?;
                let ready_at = Instant::now() + Duration::try_from(model.node_ready_after)?;
                let new_key = format!("{}/{}", namespace_of(&machine), self.replacement_name(&machine));
                self.joining.push((new_key, api_version.clone(), ready_at));
            }
        }
        self.join(env, nodes).await
    }

    fn replacement_name(&self, machine: &Value) -> String {
        owner::replacement_name(machine["metadata"]["name"].as_str().unwrap_or_default(), self.made)
    }

    /// The Machine and its Node go; a new Machine with its labels and spec comes.
    async fn replace(&mut self, env: &TestEnv, nodes: &TestEnv, old: &Value) -> Result<()> {
        self.made += 1;
        let (namespace, name) = (namespace_of(old), old["metadata"]["name"].as_str().unwrap_or_default());
        let api_version = old["apiVersion"].as_str().unwrap_or_default();
        env.delete(api_version, "Machine", Some(namespace), name).await?;
        if let Some(node) = old.pointer("/status/nodeRef/name").and_then(Value::as_str) {
            nodes.delete("v1", "Node", None, node).await?;
        }
        env.apply(owner::replacement(old, &self.replacement_name(old), namespace)).await?;
        Ok(())
    }

    /// The Nodes whose time has come join, Ready, and their Machines point at them.
    async fn join(&mut self, env: &TestEnv, nodes: &TestEnv) -> Result<()> {
        let now = Instant::now();
        let (due, waiting): (Vec<_>, Vec<_>) = self.joining.drain(..).partition(|(_, _, at)| *at <= now);
        self.joining = waiting;
        for (key, api_version, _) in due {
            let (namespace, name) = key.split_once('/').context("a Machine's namespace/name")?;
            let node = owner::joined_node(name, &api_time(Timestamp::now()));
            nodes.apply(node.clone()).await?;
            nodes.apply_status(node).await?;
            let node_ref = owner::node_ref(&api_version, name);
            env.apply_status(json!({"apiVersion": api_version, "kind": "Machine",
                "metadata": {"name": name, "namespace": namespace}, "status": {"nodeRef": node_ref}}))
                .await?;
        }
        Ok(())
    }
}

/// The apiVersions the scenario writes Machines in.
fn machine_api_versions(scenario: &Scenario) -> Vec<String> {
    let mut out: Vec<String> = scenario
        .objects
        .iter()
        .filter(|o| o["kind"] == "Machine")
        .filter_map(|o| o["apiVersion"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn namespace_of(o: &Value) -> &str {
    o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default")
}

fn key_of(o: &Value) -> String {
    format!("{}/{}", namespace_of(o), o["metadata"]["name"].as_str().unwrap_or_default())
}

/// Cluster API's controllers leave the Machine alone ([`owner::paused`]); its Cluster is read live.
async fn paused(env: &TestEnv, machine: &Value) -> Result<bool> {
    let cluster = owner::cluster_name(machine);
    let clusters = match cluster {
        "" => Vec::new(),
        _ => {
            env.list_json(
                machine["apiVersion"].as_str().unwrap_or_default(),
                "Cluster",
                Some(namespace_of(machine)),
                "",
            )
            .await?
        }
    };
    Ok(owner::paused(machine, clusters.iter().find(|c| c["metadata"]["name"] == cluster)))
}

/// The heartbeat models' next renewals.
pub struct Heartbeats {
    next: Vec<Option<Duration>>,
}

impl Heartbeats {
    /// Each model's first heartbeat, at its `from`.
    pub fn new(scenario: &Scenario) -> Result<Heartbeats> {
        let next = scenario
            .models
            .heartbeats
            .iter()
            .map(|h| Ok(h.until.is_none_or(|u| h.from < u).then(|| Duration::try_from(h.from)).transpose()?))
            .collect::<Result<_>>()?;
        Ok(Heartbeats { next })
    }

    /// Renews what is due `elapsed` after the start, in `env` or `nodes` (a workload cluster).
    pub async fn beat(&mut self, env: &TestEnv, nodes: &TestEnv, scenario: &Scenario, elapsed: Duration) -> Result<()> {
        for (h, next) in scenario.models.heartbeats.iter().zip(self.next.iter_mut()) {
            let Some(due) = *next else { continue };
            if elapsed < due {
                continue;
            }
            let there = if h.cluster.is_some() { nodes } else { env };
            renew(there, &h.type_, &h.node_selector).await?;
            let after = due + Duration::try_from(h.every)?;
            let stops = h.until.map(Duration::try_from).transpose()?;
            *next = stops.is_none_or(|u| after < u).then_some(after);
        }
        Ok(())
    }
}

/// Renews `lastHeartbeatTime` of condition `type_` on every Node with `selector`'s labels that
/// carries it; nothing else changes.
async fn renew(env: &TestEnv, type_: &str, selector: &BTreeMap<String, String>) -> Result<()> {
    let labels = selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let now = Timestamp::now().to_string();
    for mut node in env.list_json("v1", "Node", None, &labels).await? {
        let Some(list) = node.pointer_mut("/status/conditions").and_then(Value::as_array_mut) else { continue };
        let Some(c) = list.iter_mut().find(|c| c["type"] == type_) else { continue };
        c["lastHeartbeatTime"] = json!(now);
        let conditions = list.clone();
        env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node["metadata"]["name"]},
                                "status": {"conditions": conditions}}))
            .await?;
    }
    Ok(())
}
