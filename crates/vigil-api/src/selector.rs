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
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| vs.iter().all(|x| x != v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
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
}
