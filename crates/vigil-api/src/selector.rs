//! Label selectors compiled once at validation, so the engine's per-target match is a few map
//! look-ups and never fails.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// A validated label selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One `key op values` requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// The label equals one of the values.
    In(String, Vec<String>),
    /// The label is absent or equals none of the values.
    NotIn(String, Vec<String>),
    /// The label is present.
    Exists(String),
    /// The label is absent.
    DoesNotExist(String),
}

/// One problem found in a selector: a path relative to the selector and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorProblem {
    /// Path below the selector, e.g. `matchExpressions[0].operator`.
    pub path: String,
    /// The offending value, rendered.
    pub value: String,
    /// What is wrong.
    pub message: String,
}

impl Selector {
    /// Compiles a selector; an empty one is refused because it would select everything.
    pub fn compile(sel: &LabelSelector) -> Result<Self, Vec<SelectorProblem>> {
        let mut problems = Vec::new();
        let mut requirements = Vec::new();
        if let Some(labels) = &sel.match_labels {
            for (k, v) in labels {
                if let Err(message) = check_label_key(k) {
                    problems.push(SelectorProblem { path: "matchLabels".into(), value: k.clone(), message });
                }
                if let Err(message) = check_label_value(v) {
                    problems.push(SelectorProblem { path: format!("matchLabels.{k}"), value: v.clone(), message });
                }
                requirements.push(Requirement::In(k.clone(), vec![v.clone()]));
            }
        }
        for (i, expr) in sel.match_expressions.iter().flatten().enumerate() {
            let values = expr.values.clone().unwrap_or_default();
            let path = format!("matchExpressions[{i}]");
            match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => problems.push(SelectorProblem {
                    path: format!("{path}.values"),
                    value: "[]".into(),
                    message: format!("must not be empty for operator {}", expr.operator),
                }),
                "Exists" | "DoesNotExist" if !values.is_empty() => problems.push(SelectorProblem {
                    path: format!("{path}.values"),
                    value: format!("{values:?}"),
                    message: format!("must be empty for operator {}", expr.operator),
                }),
                "In" => requirements.push(Requirement::In(expr.key.clone(), values)),
                "NotIn" => requirements.push(Requirement::NotIn(expr.key.clone(), values)),
                "Exists" => requirements.push(Requirement::Exists(expr.key.clone())),
                "DoesNotExist" => requirements.push(Requirement::DoesNotExist(expr.key.clone())),
                other => problems.push(SelectorProblem {
                    path: format!("{path}.operator"),
                    value: other.to_string(),
                    message: "must be one of In, NotIn, Exists, DoesNotExist".into(),
                }),
            }
            if expr.key.is_empty() {
                problems.push(SelectorProblem {
                    path: format!("{path}.key"),
                    value: String::new(),
                    message: "must not be empty".into(),
                });
            } else if let Err(message) = check_label_key(&expr.key) {
                problems.push(SelectorProblem { path: format!("{path}.key"), value: expr.key.clone(), message });
            }
            for (j, v) in expr.values.iter().flatten().enumerate() {
                if let Err(message) = check_label_value(v) {
                    problems.push(SelectorProblem { path: format!("{path}.values[{j}]"), value: v.clone(), message });
                }
            }
        }
        if problems.is_empty() && requirements.is_empty() {
            problems.push(SelectorProblem {
                path: String::new(),
                value: "{}".into(),
                message: "must not be empty: an empty selector would select every object".into(),
            });
        }
        if problems.is_empty() { Ok(Selector { requirements }) } else { Err(problems) }
    }

    /// Selects objects having exactly these labels (the label a check adds, e.g. the cluster name).
    pub fn with_label(mut self, key: &str, value: &str) -> Self {
        self.requirements.push(Requirement::In(key.to_string(), vec![value.to_string()]));
        self
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.matches_with(|k| labels.and_then(|l| l.get(k)).map(String::as_str))
    }

    /// The labels (key, value) every object it selects carries: its requirements of one value
    /// (`matchLabels`, `In` with one value). An index of checks by one of these finds every check
    /// that can select an object by the object's own labels.
    pub fn required_labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.requirements.iter().filter_map(|r| match r {
            Requirement::In(k, vs) if vs.len() == 1 => Some((k.as_str(), vs[0].as_str())),
            _ => None,
        })
    }

    /// Whether an object whose label `key` is `get(key)` is selected (for label stores other
    /// than a map, such as [`crate::node_view::Labels`]).
    pub fn matches_with<'l>(&self, get: impl Fn(&str) -> Option<&'l str>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| vs.iter().all(|x| x != v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// What a label key must look like, said once for every message that refuses one.
pub const LABEL_KEY_RULE: &str = "must be a label key: an optional DNS subdomain prefix and '/', then a name of \
     1 to 63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit";
/// What a label value must look like.
pub const LABEL_VALUE_RULE: &str = "must be a label value: empty, or 1 to 63 letters, digits, '-', '_' or '.' \
     starting and ending with a letter or digit";

/// Kubernetes' label name (the part of a key after `/`, and a non-empty value): the API server
/// refuses any other, so a selector using one could never match.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= 63
        && edge(b[0])
        && edge(b[b.len() - 1])
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain (a label key's prefix): dot-separated lowercase labels, at most 253.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty()
                && edge(b[0])
                && edge(b[b.len() - 1])
                && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

/// Checks a label key (`[prefix/]name`), as the API server does for labels.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(key),
    };
    if ok { Ok(()) } else { Err(LABEL_KEY_RULE.to_string()) }
}

/// Checks a label value (empty is allowed), as the API server does for labels.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) { Ok(()) } else { Err(LABEL_VALUE_RULE.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() { None } else { Some(values.iter().map(|s| s.to_string()).collect()) },
        }
    }

    #[test]
    fn matches_labels_and_expressions() {
        let sel = Selector::compile(&LabelSelector {
            match_labels: Some(labels(&[("pool", "a")])),
            match_expressions: Some(vec![
                expr("zone", "In", &["z1", "z2"]),
                expr("gpu", "DoesNotExist", &[]),
                expr("tier", "NotIn", &["db"]),
                expr("os", "Exists", &[]),
            ]),
        })
        .expect("valid");
        let table: &[(&[(&str, &str)], bool)] = &[
            (&[("pool", "a"), ("zone", "z1"), ("os", "l")], true),
            (&[("pool", "a"), ("zone", "z3"), ("os", "l")], false),
            (&[("pool", "b"), ("zone", "z1"), ("os", "l")], false),
            (&[("pool", "a"), ("zone", "z1"), ("os", "l"), ("gpu", "x")], false),
            (&[("pool", "a"), ("zone", "z1"), ("os", "l"), ("tier", "db")], false),
            (&[("pool", "a"), ("zone", "z1"), ("os", "l"), ("tier", "web")], true),
            (&[("pool", "a"), ("zone", "z1")], false),
        ];
        for (l, want) in table {
            assert_eq!(sel.matches(Some(&labels(l))), *want, "{l:?}");
        }
        assert!(!sel.matches(None));
    }

    #[test]
    fn refuses_empty_and_malformed_selectors() {
        let empty = Selector::compile(&LabelSelector::default()).expect_err("empty");
        assert!(empty[0].message.contains("must not be empty"));
        let bad = Selector::compile(&LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                expr("a", "Equals", &["x"]),
                expr("b", "In", &[]),
                expr("c", "Exists", &["x"]),
            ]),
        })
        .expect_err("bad");
        let paths: Vec<_> = bad.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["matchExpressions[0].operator", "matchExpressions[1].values", "matchExpressions[2].values"]);
        assert_eq!(bad[0].value, "Equals");
    }

    #[test]
    fn label_keys_and_values_follow_kubernetes_syntax() {
        let keys_ok = ["pool", "cluster.x-k8s.io/cluster-name", "a", "A_b.c-d", "x.y/Z9", &"k".repeat(63)];
        for k in keys_ok {
            assert_eq!(check_label_key(k), Ok(()), "{k}");
        }
        let long_name = "k".repeat(64);
        let keys_bad = ["", "-pool", "pool-", "a/b/c", "/name", "Prefix.io/name", "a..b/name", "pool name", &long_name];
        for k in keys_bad {
            assert!(check_label_key(k).is_err(), "{k:?} must be refused");
        }
        for v in ["", "a", "workers-1", "v1.2_3"] {
            assert_eq!(check_label_value(v), Ok(()), "{v}");
        }
        for v in ["-a", "a b", "a/b", &"v".repeat(64)] {
            assert!(check_label_value(v).is_err(), "{v:?} must be refused");
        }

        let bad = Selector::compile(&LabelSelector {
            match_labels: Some(labels(&[("bad key", "ok"), ("pool", "not ok")])),
            match_expressions: Some(vec![expr("zone/", "In", &["z1", "z 2"])]),
        })
        .expect_err("bad syntax");
        let got: Vec<(&str, &str)> = bad.iter().map(|p| (p.path.as_str(), p.value.as_str())).collect();
        assert_eq!(
            got,
            [
                ("matchLabels", "bad key"),
                ("matchLabels.pool", "not ok"),
                ("matchExpressions[0].key", "zone/"),
                ("matchExpressions[0].values[1]", "z 2"),
            ]
        );
        assert_eq!(bad[0].message, LABEL_KEY_RULE);
        assert_eq!(bad[1].message, LABEL_VALUE_RULE);
    }
}
