//! What an expression reads: a Node and, for a MachineHealthCheck, its Machine, as plain data.

use crate::check::NodeFields;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::Value;
use cel::objects::{Key, Map};

/// One taint of a Node, as `node.taints` lists it to an expression.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taint {
    /// The taint's key.
    pub key: String,
    /// The taint's value, empty when it has none.
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// One condition of a Node, as `node.conditions.<type>` shows it to an expression.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The condition's machine-readable reason, empty when it has none.
    pub reason: String,
    /// The condition's human-readable message, empty when it has none.
    pub message: String,
}

/// The Node an expression reads as `node`: plain data, so Vigil's views can fill it cheaply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable`, false when unset.
    pub unschedulable: bool,
    /// `status.conditions`, by type.
    pub conditions: BTreeMap<String, Condition>,
}

/// The Machine an expression reads as `machine`, for a MachineHealthCheck's target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `status.phase`, empty when unset.
    pub phase: String,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// Everything one evaluation reads: the target's Node and, when it has one, its Machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bindings {
    /// The Node, read as `node`.
    pub node: NodeFacts,
    /// The Machine, read as `machine`; `None` for a NodeHealthCheck's target.
    pub machine: Option<MachineFacts>,
}

impl Bindings {
    /// Bindings of a Node alone, as a NodeHealthCheck evaluates them.
    pub fn node(node: NodeFacts) -> Self {
        Self { node, machine: None }
    }

    /// Bindings of a Node and its Machine, as a MachineHealthCheck evaluates them.
    pub fn node_and_machine(node: NodeFacts, machine: MachineFacts) -> Self {
        Self { node, machine: Some(machine) }
    }

    /// The largest list or map among the bindings, which the cost limit's size bound must cover.
    pub(crate) fn largest_collection(&self) -> usize {
        let node = &self.node;
        let mut largest =
            node.labels.len().max(node.annotations.len()).max(node.taints.len()).max(node.conditions.len());
        if let Some(machine) = &self.machine {
            largest = largest.max(machine.labels.len()).max(machine.annotations.len());
        }
        largest
    }
}

fn string(s: &str) -> Value {
    Value::String(Arc::new(s.to_owned()))
}

fn record(fields: Vec<(&str, Value)>) -> Value {
    let map: HashMap<Key, Value> = fields.into_iter().map(|(k, v)| (Key::from(k.to_owned()), v)).collect();
    Value::Map(Map::from(map))
}

fn string_map(m: &BTreeMap<String, String>) -> Value {
    let map: HashMap<Key, Value> = m.iter().map(|(k, v)| (Key::from(k.clone()), string(v))).collect();
    Value::Map(Map::from(map))
}

/// `node` as a CEL value: a map of the fields the checker knows (see `check.rs`), of them only
/// those in `fields` (the expression reads no other: building the rest for every Node was most
/// of an evaluation's cost).
pub(crate) fn node_value(node: &NodeFacts, fields: NodeFields) -> Value {
    let mut record_fields = Vec::with_capacity(NodeFields::NAMES.len());
    for field in NodeFields::NAMES.into_iter().filter(|f| fields.has(f)) {
        let value = match field {
            "name" => string(&node.name),
            "labels" => string_map(&node.labels),
            "annotations" => string_map(&node.annotations),
            "taints" => Value::List(Arc::new(node.taints.iter().map(taint_value).collect())),
            "unschedulable" => Value::Bool(node.unschedulable),
            _ => conditions_value(node),
        };
        record_fields.push((field, value));
    }
    record(record_fields)
}

fn taint_value(t: &Taint) -> Value {
    record(vec![("key", string(&t.key)), ("value", string(&t.value)), ("effect", string(&t.effect))])
}

fn conditions_value(node: &NodeFacts) -> Value {
    let conditions: HashMap<Key, Value> = node
        .conditions
        .iter()
        .map(|(kind, c)| {
            let fields =
                vec![("status", string(&c.status)), ("reason", string(&c.reason)), ("message", string(&c.message))];
            (Key::from(kind.clone()), record(fields))
        })
        .collect();
    Value::Map(Map::from(conditions))
}

/// `machine` as a CEL value: a map of the fields the checker knows (see `check.rs`).
pub(crate) fn machine_value(machine: &MachineFacts) -> Value {
    record(vec![
        ("name", string(&machine.name)),
        ("labels", string_map(&machine.labels)),
        ("annotations", string_map(&machine.annotations)),
        ("phase", string(&machine.phase)),
        ("deleting", Value::Bool(machine.deleting)),
    ])
}
