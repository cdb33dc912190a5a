//! The API crate reads in one order: words and bounds at the bottom (`well_known`, `admission`,
//! `duration`, `threshold`, `selector`), the schema rules above them, the resource types above
//! those, then the validator and the manifest reader, and the CRD generation on top. This test
//! fails on any import cycle between its modules, naming it, and on a function longer than a
//! screen.

use std::path::Path;

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_api_modules_import_downwards_only() {
    let graph = vigil_module_graph::graph(&src()).expect("read src/");
    assert!(graph.len() > 10, "found the API's modules: {:?}", graph.keys().collect::<Vec<_>>());
    let cycles = vigil_module_graph::all_cycles(&graph);
    let shown: Vec<String> = cycles.iter().map(|c| c.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles between API modules:\n{}", shown.join("\n"));
}

/// A folder is one module to the rest of the API: none is reached back through a child.
#[test]
fn the_api_folders_import_downwards_only() {
    let graph = vigil_module_graph::folders(&vigil_module_graph::graph(&src()).expect("read src/"));
    let shown: Vec<String> = vigil_module_graph::all_cycles(&graph).iter().map(|c| c.join(" -> ")).collect();
    assert!(shown.is_empty(), "import cycles between API folders:\n{}", shown.join("\n"));
}

#[test]
fn the_bottom_imports_nothing_above_it() {
    let graph = vigil_module_graph::graph(&src()).expect("read src/");
    for bottom in ["well_known", "admission", "api_version", "duration", "intern"] {
        let reached: Vec<&String> = graph.get(bottom).into_iter().flatten().collect();
        assert!(reached.is_empty(), "{bottom} imports {reached:?}: the vocabulary must stand on its own");
    }
    for types in ["machine_health_check", "node_health_check", "shared"] {
        let up: Vec<&String> = graph
            .get(types)
            .into_iter()
            .flatten()
            .filter(|m| ["validate", "manifest", "crd"].contains(&m.as_str()))
            .collect();
        assert!(up.is_empty(), "{types} imports {up:?}: the types sit below the validator and the CRDs");
    }
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
