//! The simulator reads in one order: its store and the scenario format at the bottom, the kept
//! views of the store above them, the simulation (routing, deciding, applying, the models) on top
//! of those, and the output. This test fails on any import cycle between its modules (and
//! between its folders, each counted as one module), naming it, and on a function longer than a
//! screen.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn graph() -> vigil_module_graph::Graph {
    vigil_module_graph::graph(&src()).expect("read src/")
}

fn cycles(edges: &vigil_module_graph::Graph) -> Vec<String> {
    vigil_module_graph::all_cycles(edges).iter().map(|c| c.join(" -> ")).collect()
}

#[test]
fn the_simulator_modules_import_downwards_only() {
    let edges = graph();
    assert!(edges.len() >= 5, "found the simulator's modules: {:?}", edges.keys().collect::<Vec<_>>());
    let cycles = cycles(&edges);
    assert!(cycles.is_empty(), "import cycles between simulator modules:\n{}", cycles.join("\n"));
}

#[test]
fn the_simulator_folders_import_downwards_only() {
    let cycles = cycles(&vigil_module_graph::folders(&graph()));
    assert!(cycles.is_empty(), "import cycles between simulator folders:\n{}", cycles.join("\n"));
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let long = vigil_module_graph::longer_than(&src(), 80, |_| false).expect("read src/");
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
