//! The engine's modules import downwards only: shared vocabulary at the bottom, features above
//! it, the two decisions on top. This test reads `src/` and fails on any import cycle between
//! modules (a module reaching a module that reaches it back), naming the cycle, so the engine
//! keeps an order in which it can be read and each feature tested without the decisions.
//!
//! References are `crate::a::b` paths, `super::` paths and a folder module's `child::` paths in
//! code (comments and doc links are not imports).

use std::path::Path;

fn graph() -> vigil_module_graph::Graph {
    vigil_module_graph::graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).expect("read src/")
}

#[test]
fn the_engine_modules_import_downwards_only() {
    let edges = graph();
    assert!(edges.len() > 10, "found the engine's modules: {:?}", edges.keys().collect::<Vec<_>>());
    let cycles: Vec<String> = vigil_module_graph::all_cycles(&edges).iter().map(|c| c.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles between engine modules:\n{}", cycles.join("\n"));
}

/// A folder is one module to the rest of the engine: none is reached back through a child.
#[test]
fn the_engine_folders_import_downwards_only() {
    let edges = vigil_module_graph::folders(&graph());
    let cycles: Vec<String> = vigil_module_graph::all_cycles(&edges).iter().map(|c| c.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles between engine folders:\n{}", cycles.join("\n"));
}

#[test]
fn the_vocabulary_at_the_bottom_imports_no_feature() {
    let edges = graph();
    for bottom in ["lookup", "target", "plan"] {
        let reached: Vec<&String> = edges.get(bottom).into_iter().flatten().filter(|m| *m != "target").collect();
        assert!(reached.is_empty(), "{bottom} imports {reached:?}: the vocabulary must stand on its own");
    }
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long = vigil_module_graph::longer_than(&src, 80, |_| false).expect("read src/");
    assert!(long.is_empty(), "functions over 80 lines (split them into named phases):\n{}", long.join("\n"));
}

/// One name per meaning: no two types of the crate share a name.
#[test]
fn no_two_types_share_a_name() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let repeated = vigil_module_graph::repeated_type_names(&src).expect("read src/");
    assert!(
        repeated.is_empty(),
        "type names declared more than once (name each for what it holds):\n{}",
        repeated.join("\n")
    );
}
