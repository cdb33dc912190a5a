//! Refusals at compile time: each names the field and the value.

use vigil_expr::{ExprError, Expression, limits};

const FIELD: &str = "spec.unhealthyExpressions[0].expression";

/// A source, words its refusal must contain, and the kind it must be.
type Case<'a> = (&'a str, &'a str, fn(&ExprError) -> bool);

fn refused(source: &str) -> ExprError {
    match Expression::compile(FIELD, source) {
        Ok(_) => panic!("{source:?} compiled, and should not have"),
        Err(e) => e,
    }
}

#[test]
fn refusals_name_the_field_and_the_value() {
    let long = format!("node.unschedulable{}", " || true".repeat(600));
    let deep_parens = format!("{}true{}", "(".repeat(13), ")".repeat(13));
    let deep_lists = format!("{}1{}.size() > 0", "[".repeat(20), "]".repeat(20));
    // `&&` and `||` chains are balanced by the parser; arithmetic is not
    let long_chain = format!("size(node.taints){} > 0", " + 1".repeat(30));
    let nested_iteration = "node.taints.all(t, node.labels.exists(k, k == t.key))";
    let cases: Vec<Case> = vec![
        ("node.labels[", "does not compile", |e| matches!(e, ExprError::Syntax { .. })),
        ("node.unschedulable &&", "does not compile", |e| matches!(e, ExprError::Syntax { .. })),
        ("pod.labels['a'] == 'b'", "unknown variable \"pod\"", |e| matches!(e, ExprError::UnknownVariable { .. })),
        ("matches(node.name, 'a.*')", "unknown function matches/2", |e| matches!(e, ExprError::UnknownFunction { .. })),
        ("node.name.matches('a.*')", "unknown function .matches/1", |e| matches!(e, ExprError::UnknownFunction { .. })),
        ("node.taints.all(t)", "unknown function .all/1", |e| matches!(e, ExprError::UnknownFunction { .. })),
        ("node.lables['a'] == 'b'", "node has no field \"lables\"", |e| matches!(e, ExprError::Type { .. })),
        ("node.name", "evaluates to a string, not a bool", |e| matches!(e, ExprError::Type { .. })),
        ("node.unschedulable && 'yes'", "&& takes a bool, not a string", |e| matches!(e, ExprError::Type { .. })),
        ("node.name < 3", "orders a string against a int", |e| matches!(e, ExprError::Type { .. })),
        ("google.protobuf.Int64Value{value: 1} == 1", "builds a message", |e| matches!(e, ExprError::Type { .. })),
        (&long, "bytes long, over the limit of 4096", |e| matches!(e, ExprError::TooLong { .. })),
        (&deep_parens, "nests too deeply", |e| matches!(e, ExprError::TooDeep { .. })),
        (&deep_lists, "nests too deeply", |e| matches!(e, ExprError::TooDeep { .. })),
        (&long_chain, "parsed tree is over 24 levels deep", |e| matches!(e, ExprError::TooDeep { .. })),
        (nested_iteration, "over the limit of 100000", |e| matches!(e, ExprError::TooCostly { .. })),
    ];
    for (source, says, is_kind) in cases {
        let error = refused(source);
        let message = error.to_string();
        assert!(is_kind(&error), "{source:?}: wrong kind: {error:?}");
        assert_eq!(error.field(), FIELD);
        assert!(message.starts_with(FIELD), "{message}");
        let head: String = source.chars().take(40).collect();
        assert!(
            message.contains(&format!("{head:?}").trim_end_matches('"').to_string()),
            "{source:?}: the message does not show the value: {message}"
        );
        assert!(message.contains(says), "{source:?}: {message:?} lacks {says:?}");
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
}

#[test]
fn the_example_in_the_brief_reads_as_it_should() {
    let message = refused("node.labels[").to_string();
    assert!(
        message.starts_with("spec.unhealthyExpressions[0].expression: \"node.labels[\" does not compile: "),
        "{message}"
    );
}

#[test]
fn a_long_value_is_cut_in_the_message() {
    let long = format!("node.unschedulable{}", " || true".repeat(600));
    let message = refused(&long).to_string();
    assert!(message.len() < 400, "{} bytes: {message}", message.len());
    assert!(message.contains('…'));
}

#[test]
fn accepted_expressions_stay_within_the_limits() {
    for source in [
        "node.conditions.Ready.status == 'False' && node.conditions.NetworkUnavailable.status == 'True'",
        "'storage-migration' in node.labels",
        "node.taints.exists(t, t.key == 'x')",
        "node.taints.exists_one(t, t.effect == 'NoExecute')",
        "node.taints.map(t, t.key).filter(k, k.startsWith('node.kubernetes.io/')).size() > 2",
        "has(node.conditions.Ready) && node.conditions.Ready.reason.contains('Kubelet')",
        "('nvidia.com/gpu.present' in node.labels ? node.labels['nvidia.com/gpu.present'] == 'true' : false) && node.unschedulable",
        "node.taints.all(t, ['a', 'b', 'c'].exists(k, t.key == k))",
        "machine.phase == 'Failed' || machine.deleting",
        "size(node.annotations) > 100 || int(node.labels['x']) > 3",
        "[node.labels, machine.labels].exists(m, 'a' in m)",
    ] {
        let expr = Expression::compile(FIELD, source).unwrap_or_else(|e| panic!("{source:?} was refused: {e}"));
        assert!(expr.estimated_cost() <= limits::MAX_COST);
        assert_eq!(expr.source(), source);
    }
}

#[test]
fn nesting_at_the_bound_compiles() {
    let source = format!("{}true{}", "(".repeat(limits::MAX_NESTING), ")".repeat(limits::MAX_NESTING));
    assert!(Expression::compile(FIELD, &source).is_ok());
    let brackets_in_strings = format!("node.name == '{}'", "(".repeat(100));
    assert!(Expression::compile(FIELD, &brackets_in_strings).is_ok());
}

#[test]
fn cost_grows_with_nested_iteration() {
    let flat =
        Expression::compile(FIELD, "node.taints.exists(t, t.key == 'x')").map(|e| e.estimated_cost()).unwrap_or(0);
    assert!(flat > limits::COLLECTION_SIZE_BOUND, "{flat}");
    assert!(flat < limits::MAX_COST, "{flat}");
}

/// A refusal's reason alone leaves out the field and the value (a validator names both itself),
/// and two expressions of one source are equal, so a policy holding them compares as written.
#[test]
fn a_refusals_reason_leaves_field_and_value_out_and_equal_sources_are_equal() {
    let e = refused("node.labels[");
    assert_eq!(e.value(), "node.labels[");
    assert!(e.reason().starts_with("does not compile: "), "{}", e.reason());
    assert!(!e.reason().contains(FIELD), "{}", e.reason());
    let a = Expression::compile(FIELD, "node.unschedulable").expect("compiles");
    let b = Expression::compile("elsewhere", "node.unschedulable").expect("compiles");
    let c = Expression::compile(FIELD, "!node.unschedulable").expect("compiles");
    assert_eq!(a, b);
    assert_ne!(a, c);
}
