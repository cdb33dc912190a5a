//! Evaluation: true, false, and unknown on anything else.

use std::collections::BTreeMap;

use vigil_expr::{Bindings, Condition, Expression, MachineFacts, NodeFacts, Outcome, Taint};

fn condition(status: &str) -> Condition {
    Condition { status: status.into(), reason: "KubeletNotReady".into(), message: "container runtime is down".into() }
}

fn node() -> NodeFacts {
    NodeFacts {
        name: "worker-1".into(),
        labels: BTreeMap::from([
            ("storage-migration".into(), "".into()),
            ("nvidia.com/gpu.present".into(), "true".into()),
        ]),
        annotations: BTreeMap::from([("a".into(), "b".into())]),
        taints: vec![Taint { key: "x".into(), value: "".into(), effect: "NoSchedule".into() }],
        unschedulable: false,
        conditions: BTreeMap::from([
            ("Ready".into(), condition("False")),
            ("NetworkUnavailable".into(), condition("True")),
        ]),
    }
}

fn machine() -> MachineFacts {
    MachineFacts { name: "m-1".into(), phase: "Running".into(), deleting: true, ..MachineFacts::default() }
}

fn eval(source: &str, bindings: &Bindings) -> Outcome {
    match Expression::compile("f", source) {
        Ok(expr) => expr.evaluate(bindings),
        Err(e) => panic!("{source:?} was refused: {e}"),
    }
}

#[test]
fn evaluations() {
    let plain = Bindings::node(node());
    let bare = Bindings::node(NodeFacts::default());
    let with_machine = Bindings::node_and_machine(node(), machine());
    let gpu = "'nvidia.com/gpu.present' in node.labels ? node.labels['nvidia.com/gpu.present'] == 'true' : false";
    let cases: Vec<(&str, &Bindings, Outcome)> = vec![
        (
            "node.conditions.Ready.status == 'False' && node.conditions.NetworkUnavailable.status == 'True'",
            &plain,
            Outcome::True,
        ),
        ("'storage-migration' in node.labels", &plain, Outcome::True),
        ("'storage-migration' in node.labels", &bare, Outcome::False),
        ("node.taints.exists(t, t.key == 'x')", &plain, Outcome::True),
        ("node.taints.exists(t, t.key == 'x')", &bare, Outcome::False),
        ("node.taints.all(t, t.effect == 'NoSchedule')", &plain, Outcome::True),
        (gpu, &plain, Outcome::True),
        (gpu, &bare, Outcome::False),
        ("node.unschedulable", &plain, Outcome::False),
        ("node.name == 'worker-1'", &plain, Outcome::True),
        ("has(node.conditions.Ready)", &plain, Outcome::True),
        ("has(node.conditions.MemoryPressure)", &plain, Outcome::False),
        ("node.conditions.Ready.reason.startsWith('Kubelet')", &plain, Outcome::True),
        ("size(node.labels) == 2", &plain, Outcome::True),
        ("node.taints.map(t, t.key).filter(k, k == 'x').size() == 1", &plain, Outcome::True),
        ("machine.deleting && machine.phase == 'Running'", &with_machine, Outcome::True),
    ];
    for (source, bindings, expected) in cases {
        assert_eq!(eval(source, bindings), expected, "{source}");
    }
}

#[test]
fn run_time_errors_are_unknown() {
    let plain = Bindings::node(node());
    let bare = Bindings::node(NodeFacts::default());
    for (source, bindings) in [
        // a missing key
        ("node.conditions.Ready.status == 'False'", &bare),
        ("node.labels['absent'] == 'x'", &plain),
        // an error that `||` cannot absorb
        ("node.labels['absent'] == 'x' || false", &plain),
        // arithmetic
        ("1 / (size(node.taints) - 1) == 0", &plain),
        ("9223372036854775807 + size(node.taints) > 0", &plain),
        ("int(node.name) > 0", &plain),
        // a machine the target does not have
        ("machine.deleting", &plain),
    ] {
        match eval(source, bindings) {
            Outcome::Unknown(why) => assert!(!why.is_empty(), "{source}"),
            other => panic!("{source}: {other:?}, wanted unknown"),
        }
    }
}

#[test]
fn a_non_bool_result_is_unknown() {
    // the checker cannot type what an index of a map of maps returns, so this compiles
    let expr = Expression::compile("f", "[{'a': 1}][0]['a']");
    match expr.map(|e| e.evaluate(&Bindings::node(node()))) {
        Ok(Outcome::Unknown(why)) => assert!(why.contains("not a bool"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_target_over_the_size_bound_is_unknown_for_an_iterating_expression() {
    let mut big = node();
    for i in 0..300 {
        big.labels.insert(format!("l{i}"), "v".into());
    }
    let big = Bindings::node(big);
    assert!(matches!(eval("node.labels.exists(k, k == 'l7')", &big), Outcome::Unknown(_)));
    assert_eq!(eval("'l7' in node.labels", &big), Outcome::True);
}

#[test]
fn the_deepest_accepted_expression_evaluates_on_a_small_stack() {
    // 20 additions (the parser leaves them left-nested): near the tree-depth bound, evaluated on
    // a thread of 1 MiB, half a Tokio worker's default, so that evaluation's own recursion
    // leaves a margin.
    let source = format!("size(node.taints){} == 21", " + 1".repeat(20));
    let outcome = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || eval(&source, &Bindings::node(node())))
        .map(|h| h.join());
    assert!(matches!(outcome, Ok(Ok(Outcome::True))), "{outcome:?}");
}

/// Only the fields an expression reads are bound for a target: whatever it reads, and however
/// (`has`, a comprehension whose variable is also called `node`, several fields at once), it
/// sees what it would see with every field bound.
#[test]
fn an_expression_sees_every_field_it_reads() {
    let plain = Bindings::node(node());
    let cases: Vec<(&str, Outcome)> = vec![
        ("node.labels.exists(node, node == 'storage-migration')", Outcome::True),
        ("node.taints.exists(node, node.key == 'x') && node.name == 'worker-1'", Outcome::True),
        ("has(node.annotations.a) && !node.unschedulable", Outcome::True),
        ("node.conditions.Ready.reason == 'KubeletNotReady' && 'a' in node.annotations", Outcome::True),
        ("[node.name, node.name].all(n, n == 'worker-1')", Outcome::True),
        ("node.labels.all(k, k in node.labels) && size(node.conditions) == 2", Outcome::True),
    ];
    for (source, want) in cases {
        assert_eq!(eval(source, &plain), want, "{source}");
    }
}
