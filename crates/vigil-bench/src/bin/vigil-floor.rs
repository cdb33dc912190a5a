//! The floor of the benchmark: the least a correct MachineHealthCheck controller must do, so a
//! run can tell "the cores are the limit" from "Vigil does too much". One list and watch of
//! Nodes and of Machines, one exact timer per unhealthy Node, and at expiry one write: the two
//! remediation conditions on the Machine (`HealthCheckSucceeded=False`, `OwnerRemediated=False`).
//! Nothing else: no confirming read, no check status, no Event, no rate limit, no short-circuit,
//! no Leases. It is not a controller anyone should run: it trusts its watch cache blindly.
//!
//! Its policy is the bench fleet's: a Node whose `Ready` is `False` or `Unknown` for
//! `--timeout-secs` makes its Machine unhealthy. It prints `vigil-floor: synced` on stderr once
//! both lists are read, which the benchmark takes as the end of its cold start. With
//! `--healthy-verdicts` it first writes `HealthCheckSucceeded=True` on every Machine whose Node
//! is healthy and which has no such condition yet (what Vigil and Cluster API write at their
//! cold start), one JSON patch each, so a comparison can tell those writes from the rest.

use anyhow::{Context as _, Result};
use clap::Parser;
use futures::StreamExt as _;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "vigil-floor", about = "The least a MachineHealthCheck controller must do (a benchmark contender)")]
struct FloorArgs {
    /// The API server to act on.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The namespace of the Machines.
    #[arg(long, default_value = "bench")]
    namespace: String,
    /// The Machines to check (a label selector).
    #[arg(long, default_value = "cluster.x-k8s.io/cluster-name=fleet")]
    selector: String,
    /// How long a Node's Ready may be False or Unknown before its Machine is remediated.
    #[arg(long)]
    timeout_secs: u64,
    /// Most writes in flight at once (a connection bound, not a rate limit).
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Write the healthy verdict on every healthy Machine lacking one before saying synced.
    #[arg(long)]
    healthy_verdicts: bool,
}

/// What the two watches have shown, and the timers they set.
#[derive(Default)]
struct World {
    /// Node name → since when its Ready is False or Unknown.
    unhealthy_since: HashMap<String, Timestamp>,
    /// Node name → its Machine's name.
    machine_of: HashMap<String, String>,
    /// Machines already asked to be remediated (seen with `OwnerRemediated`, or written).
    remediated: HashSet<String>,
    /// Machine name → its Node's name, for those without a `HealthCheckSucceeded` condition.
    without_verdict: HashMap<String, String>,
    /// Machine name → the place of its `HealthCheckSucceeded` condition in `status.conditions`.
    verdict_at: HashMap<String, usize>,
    /// Pending expiries, soonest first, and each Machine's own.
    timers: BTreeSet<(Timestamp, String)>,
    timer_of: HashMap<String, Timestamp>,
    /// `--timeout-secs`.
    timeout: SignedDuration,
}

impl World {
    fn node(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else { return };
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        let since = ready
            .filter(|c| c.status != "True")
            .map(|c| c.last_transition_time.as_ref().map_or(Timestamp::UNIX_EPOCH, |t| t.0));
        match since {
            Some(since) => self.unhealthy_since.insert(name.clone(), since),
            None => self.unhealthy_since.remove(&name),
        };
        if let Some(machine) = self.machine_of.get(&name).cloned() {
            self.schedule(&machine, Some(&name));
        }
    }

    fn machine(&mut self, machine: &DynamicObject) {
        let Some(name) = machine.metadata.name.clone() else { return };
        let conditions = machine.data.pointer("/status/conditions").and_then(Value::as_array);
        if conditions.is_some_and(|c| c.iter().any(|c| c["type"] == "OwnerRemediated")) {
            self.remediated.insert(name.clone());
        }
        let node = machine.data.pointer("/status/nodeRef/name").and_then(Value::as_str).map(str::to_string);
        if let Some(node) = &node {
            self.machine_of.insert(node.clone(), name.clone());
        }
        let verdict = conditions.and_then(|c| c.iter().position(|c| c["type"] == "HealthCheckSucceeded"));
        match verdict {
            Some(at) => self.verdict_at.insert(name.clone(), at),
            None => self.verdict_at.remove(&name),
        };
        match (&node, verdict.is_some()) {
            (Some(node), false) => self.without_verdict.insert(name.clone(), node.clone()),
            _ => self.without_verdict.remove(&name),
        };
        self.schedule(&name, node.as_deref());
    }

    /// Sets the Machine's one timer from its Node's state (none when healthy or done).
    fn schedule(&mut self, machine: &str, node: Option<&str>) {
        if let Some(old) = self.timer_of.remove(machine) {
            self.timers.remove(&(old, machine.to_string()));
        }
        let since = node.and_then(|n| self.unhealthy_since.get(n));
        if let (Some(since), false) = (since, self.remediated.contains(machine)) {
            let at = *since + self.timeout;
            self.timers.insert((at, machine.to_string()));
            self.timer_of.insert(machine.to_string(), at);
        }
    }

    /// The Machines with a Node, healthy now, and no verdict yet; taken, so each is written once.
    fn take_healthy_without_verdict(&mut self) -> Vec<String> {
        let unhealthy = &self.unhealthy_since;
        let mut out: Vec<String> = self
            .without_verdict
            .iter()
            .filter(|(_, node)| !unhealthy.contains_key(*node))
            .map(|(machine, _)| machine.clone())
            .collect();
        out.sort();
        for machine in &out {
            self.without_verdict.remove(machine);
        }
        out
    }

    /// The Machines whose timer ran out by `now`, marked remediated.
    fn expired(&mut self, now: Timestamp) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((at, machine)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            self.timer_of.remove(&machine);
            if self.remediated.insert(machine.clone()) {
                out.push(machine);
            }
        }
        out
    }
}

/// One condition appended to a Machine's `status.conditions`, as a JSON patch operation.
fn condition_op(type_: &str, status: &str, reason: &str, now: Timestamp) -> Value {
    json!({"op": "add", "path": "/status/conditions/-", "value": {
        "type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": now.to_string()}})
}

/// The one write: both conditions in the Machine's `status.conditions`, appended, or the
/// verdict replaced where the watch last saw it (`verdict_at`, tested first: a Machine that
/// changed since is not written).
fn remediation_patch(now: Timestamp, verdict_at: Option<usize>) -> Patch<Value> {
    let mut unhealthy = condition_op("HealthCheckSucceeded", "False", "UnhealthyNode", now);
    let mut ops = Vec::new();
    if let Some(at) = verdict_at {
        let path = format!("/status/conditions/{at}");
        ops.push(json!({"op": "test", "path": format!("{path}/type"), "value": "HealthCheckSucceeded"}));
        unhealthy["op"] = json!("replace");
        unhealthy["path"] = json!(path);
    }
    ops.push(unhealthy);
    ops.push(condition_op("OwnerRemediated", "False", "WaitingForRemediation", now));
    json_patch_of(Value::Array(ops))
}

/// With `--healthy-verdicts`, the cold start's write: `HealthCheckSucceeded=True` appended.
fn healthy_patch(now: Timestamp) -> Patch<Value> {
    json_patch_of(json!([condition_op("HealthCheckSucceeded", "True", "HealthCheckSucceeded", now)]))
}

/// Operations built here as JSON, as the typed patch the client sends (empty, a no-op, should
/// they ever fail to read back).
fn json_patch_of(ops: Value) -> Patch<Value> {
    Patch::Json(serde_json::from_value(ops).unwrap_or_else(|_| json_patch::Patch(Vec::new())))
}

/// The healthy verdicts of every Machine that lacks one, each write a task of `verdicts`.
fn send_healthy_verdicts(
    world: &mut World,
    machines: &Api<DynamicObject>,
    permits: &Arc<tokio::sync::Semaphore>,
    verdicts: &mut tokio::task::JoinSet<()>,
) {
    let now = Timestamp::now();
    for machine in world.take_healthy_without_verdict() {
        let (api, permits) = (machines.clone(), permits.clone());
        verdicts.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let written = api.patch_status(&machine, &PatchParams::default(), &healthy_patch(now)).await;
            if let Err(e) = written {
                eprintln!("vigil-floor: {machine}: {e}");
            }
        });
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = FloorArgs::parse();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&args.kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("cannot read {}", args.kubeconfig.display()))?;
    let client = kube::Client::try_from(config)?;
    let machines_ar = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"));
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), &args.namespace, &machines_ar);
    let node_stream =
        watcher::watcher(Api::<Node>::all(client), watcher::Config::default().page_size(500)).default_backoff();
    let machine_stream =
        watcher::watcher(machines.clone(), watcher::Config::default().labels(&args.selector).page_size(500))
            .default_backoff();
    let (mut node_stream, mut machine_stream) = (std::pin::pin!(node_stream), std::pin::pin!(machine_stream));
    let timeout = SignedDuration::from_secs(i64::try_from(args.timeout_secs).context("--timeout-secs is too large")?);
    let mut world = World { timeout, ..World::default() };
    let permits = Arc::new(tokio::sync::Semaphore::new(args.in_flight.max(1)));
    let (mut nodes_synced, mut machines_synced, mut said) = (false, false, false);
    let mut verdicts = tokio::task::JoinSet::new();
    let mut verdicts_sent = !args.healthy_verdicts;
    loop {
        let synced = nodes_synced && machines_synced;
        if synced && !verdicts_sent {
            send_healthy_verdicts(&mut world, &machines, &permits, &mut verdicts);
            verdicts_sent = true;
        }
        if synced && verdicts_sent && verdicts.is_empty() && !said {
            eprintln!("vigil-floor: synced");
            said = true;
        }
        let next = world.timers.first().map(|(at, _)| *at).filter(|_| synced);
        // A deadline already past sleeps for nothing.
        let sleep = next.map_or(std::time::Duration::from_secs(3600), |at| {
            std::time::Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or_default()
        });
        tokio::select! {
            event = node_stream.next() => match event {
                Some(Ok(Event::Apply(n) | Event::InitApply(n))) => world.node(&n),
                Some(Ok(Event::InitDone)) => nodes_synced = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => eprintln!("vigil-floor: node watch: {e}"),
                None => anyhow::bail!("the node watch ended"),
            },
            event = machine_stream.next() => match event {
                Some(Ok(Event::Apply(m) | Event::InitApply(m))) => world.machine(&m),
                Some(Ok(Event::InitDone)) => machines_synced = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => eprintln!("vigil-floor: machine watch: {e}"),
                None => anyhow::bail!("the machine watch ended"),
            },
            Some(_) = verdicts.join_next(), if !verdicts.is_empty() => {}
            () = tokio::time::sleep(sleep), if next.is_some() => {
                let now = Timestamp::now();
                for machine in world.expired(now) {
                    let (api, permits) = (machines.clone(), permits.clone());
                    let patch = remediation_patch(now, world.verdict_at.get(&machine).copied());
                    tokio::spawn(async move {
                        let _permit = permits.acquire_owned().await;
                        let written = api.patch_status(&machine, &PatchParams::default(), &patch).await;
                        if let Err(e) = written {
                            eprintln!("vigil-floor: {machine}: {e}");
                        }
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, status: &str, since: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": {"conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": since}]}}))
        .expect("a Node")
    }

    fn machine(name: &str, node: &str, remediated: bool) -> DynamicObject {
        let mut conditions = vec![json!({"type": "Ready", "status": "True"})];
        if remediated {
            conditions.push(json!({"type": "OwnerRemediated", "status": "False"}));
        }
        serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name}, "status": {"nodeRef": {"name": node}, "conditions": conditions}}))
        .expect("a Machine")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a time")
    }

    #[test]
    fn a_machine_expires_once_at_its_nodes_time_plus_the_timeout_and_not_when_healthy_again() {
        let mut w = World { timeout: SignedDuration::from_secs(60), ..World::default() };
        w.machine(&machine("m1", "n1", false));
        w.machine(&machine("m2", "n2", false));
        w.machine(&machine("m3", "n3", true));
        w.node(&node("n1", "False", "2030-01-01T00:00:00Z"));
        w.node(&node("n2", "Unknown", "2030-01-01T00:00:30Z"));
        w.node(&node("n3", "False", "2030-01-01T00:00:00Z"));
        assert!(w.expired(at("2030-01-01T00:00:59Z")).is_empty(), "never before the timeout");
        assert_eq!(w.expired(at("2030-01-01T00:01:00Z")), ["m1"]);
        w.node(&node("n2", "True", "2030-01-01T00:01:00Z"));
        assert!(w.expired(at("2030-01-01T00:10:00Z")).is_empty(), "m2 recovered, m3 was remediated already");
        w.node(&node("n1", "False", "2030-01-01T00:02:00Z"));
        assert!(w.expired(at("2030-01-01T00:10:00Z")).is_empty(), "m1 is written once");
    }

    #[test]
    fn only_healthy_machines_without_a_verdict_get_one_and_each_once() {
        let mut w = World { timeout: SignedDuration::from_secs(60), ..World::default() };
        let mut judged = machine("m4", "n4", false);
        judged.data["status"]["conditions"]
            .as_array_mut()
            .expect("conditions")
            .push(json!({"type": "HealthCheckSucceeded", "status": "True"}));
        for m in [machine("m1", "n1", false), machine("m2", "n2", false), judged] {
            w.machine(&m);
        }
        w.node(&node("n1", "True", "2030-01-01T00:00:00Z"));
        w.node(&node("n2", "False", "2030-01-01T00:00:00Z"));
        assert_eq!(w.take_healthy_without_verdict(), ["m1"], "n2 is unhealthy, m4 has a verdict");
        assert!(w.take_healthy_without_verdict().is_empty(), "m1 is written once");
    }
}
