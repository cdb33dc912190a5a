//! Hostile input: compile and evaluate return, whatever the source.

use std::collections::BTreeMap;

use proptest::prelude::*;
use vigil_expr::{Bindings, Condition, Expression, MachineFacts, NodeFacts, Taint};

fn bindings() -> Bindings {
    Bindings::node_and_machine(
        NodeFacts {
            name: "n".into(),
            labels: BTreeMap::from([("a".into(), "1".into()), ("b".into(), "".into())]),
            annotations: BTreeMap::new(),
            taints: vec![Taint { key: "a".into(), value: "1".into(), effect: "NoExecute".into() }],
            unschedulable: true,
            conditions: BTreeMap::from([(
                "Ready".into(),
                Condition { status: "Unknown".into(), ..Condition::default() },
            )]),
        },
        MachineFacts::default(),
    )
}

/// Tokens of CEL, so that generated sources often parse and reach the checker and evaluator.
fn token() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "node",
        "machine",
        ".",
        "labels",
        "taints",
        "conditions",
        "Ready",
        "status",
        "name",
        "unschedulable",
        "phase",
        "deleting",
        "annotations",
        "key",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        "?",
        "!",
        "-",
        "+",
        "*",
        "/",
        "%",
        "==",
        "!=",
        "<",
        ">=",
        "&&",
        "||",
        " in ",
        "'a'",
        "\"b\"",
        "1",
        "0",
        "-1",
        "2.5",
        "9223372036854775807",
        "18446744073709551615u",
        "true",
        "false",
        "null",
        "b'x'",
        "size",
        "has",
        "exists",
        "all",
        "exists_one",
        "map",
        "filter",
        "contains",
        "startsWith",
        "int",
        "string",
        "double",
        "uint",
        "t",
        "x",
        "k",
        " ",
        "'''",
        "r'",
        "\\",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn compile_never_panics_on_any_string(source in any::<String>()) {
        let _ = Expression::compile("f", &source);
    }

    #[test]
    fn compile_and_evaluate_never_panic_on_token_soup(
        tokens in prop::collection::vec(token(), 0..40)
    ) {
        let source = tokens.concat();
        if let Ok(expr) = Expression::compile("f", &source) {
            let _ = expr.evaluate(&bindings());
            let _ = expr.evaluate(&Bindings::default());
        }
    }
}
