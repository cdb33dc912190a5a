//! Small readings the NodeHealthCheck phases share: phases, a Node's name, labels and annotations
//! read without allocating, flags, notices.

use crate::plan::{Notice, NoticeKind};
use crate::target::{Target, same_str};
use jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use vigil_api::reason::Reason;
use vigil_api::validate::ConditionRule;
use vigil_api::views::NodeView;

/// Phase while a step's template is missing or invalid.
pub(super) const PHASE_DISABLED: &str = "Disabled";

/// Phase while pause requests are present.
pub(super) const PHASE_PAUSED: &str = "Paused";

/// Kind of the owner reference that marks the check's own remediation objects.
pub(super) const OWNER_KIND: &str = "NodeHealthCheck";

/// The smallest step of time: a verdict due at `deadline` changes at `deadline + 1ns`.
pub(super) const ONE_NS: SignedDuration = SignedDuration::from_nanos(1);

/// `t + d`, or `None` beyond the representable range (that instant never comes).
pub(super) fn after(t: Timestamp, d: SignedDuration) -> Option<Timestamp> {
    t.checked_add(d).ok()
}

pub(super) fn node_name(node: &NodeView) -> &str {
    node.name.as_str()
}

/// `map[key]`, walking the entries with [`same_str`] (label and annotation maps are small).
pub(super) fn entry<'m>(map: &'m BTreeMap<String, String>, key: &str) -> Option<&'m str> {
    map.iter().find(|(k, _)| same_str(k, key)).map(|(_, v)| v.as_str())
}

pub(super) fn has_label_value(node: &NodeView, key: &str, value: &str) -> bool {
    node.labels.get(key).is_some_and(|v| v == value)
}

/// A handful of flags, without allocating for the usual few.
#[derive(Default)]
pub(super) struct Flags {
    pub(super) small: u64,
    pub(super) large: Vec<bool>,
}

impl Flags {
    pub(super) fn get(&self, i: usize) -> bool {
        match i.checked_sub(64) {
            None => self.small >> i & 1 == 1,
            Some(j) => self.large.get(j).copied().unwrap_or(false),
        }
    }

    pub(super) fn set(&mut self, i: usize) {
        match i.checked_sub(64) {
            None => self.small |= 1 << i,
            Some(j) => {
                if self.large.len() <= j {
                    self.large.resize(j + 1, false);
                }
                self.large[j] = true;
            }
        }
    }
}

pub(super) fn has_annotation(node: &NodeView, key: &str) -> bool {
    node.has_annotation(key)
}

pub(super) fn notice(kind: NoticeKind, target: &str, reason: Reason, message: String) -> Notice {
    Notice { kind, target: Some(Target::local_node(target)), reason, message }
}

pub(super) fn rule_text(rule: &ConditionRule) -> String {
    format!("{}={}", rule.type_, rule.status)
}

pub(super) fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
