//! The controller reads in one order, like the engine (docs/ARCHITECTURE.md, "The controller's
//! floors"): the write vocabulary, wire types, sources and metrics at the bottom; the scheduler
//! and the lease state above them (the index, who holds which target and gathering are the
//! shared read side, `vigil-index`); the writer, the one way out to the API server; the shared
//! context; the watches that fill the index; then confirm → apply;
//! the run loop above them; leadership, shards and start-up on top (the crate root). This test fails on any import
//! cycle between its modules, naming it, on a floor that reaches above itself, on a write sent
//! from outside the writer, and on a function longer than a screen.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn graph() -> vigil_module_graph::Graph {
    vigil_module_graph::graph(&src()).expect("read src/")
}

#[test]
fn the_controller_modules_import_downwards_only() {
    let edges = graph();
    assert!(edges.len() > 15, "found the controller's modules: {:?}", edges.keys().collect::<Vec<_>>());
    let cycles: Vec<String> = vigil_module_graph::all_cycles(&edges).iter().map(|c| c.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles between controller modules:\n{}", cycles.join("\n"));
}

/// A folder is one module to the rest of the controller: none is reached back through a child,
/// and no folder spans two floors.
#[test]
fn the_controller_folders_import_downwards_only() {
    let edges = vigil_module_graph::folders(&graph());
    let cycles: Vec<String> = vigil_module_graph::all_cycles(&edges).iter().map(|c| c.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles between controller folders:\n{}", cycles.join("\n"));
}

/// Each floor and the modules it may import (besides its own floor's and the ones below).
const FLOORS: [(&str, &[&str]); 7] = [
    ("bottom", &["wire", "writes", "fenced", "clock", "sources", "metrics"]),
    ("state", &["scheduler", "leader", "guards"]),
    ("write", &["events", "writer"]),
    ("context", &["context", "http"]),
    ("feeds", &["watch", "surroundings", "workload"]),
    ("decide and write", &["gather", "confirm", "medik8s", "apply"]),
    ("run", &["run_loop"]),
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|(_, modules)| modules.contains(&module))
}

#[test]
fn every_module_sits_on_a_floor_and_imports_nothing_above_it() {
    let edges = graph();
    for module in edges.keys() {
        assert!(floor_of(module).is_some(), "{module} is on no floor: place it in FLOORS and in docs/ARCHITECTURE.md");
    }
    let mut up = Vec::new();
    for (module, imports) in &edges {
        let Some(floor) = floor_of(module) else { continue };
        for import in imports {
            if let Some(above) = floor_of(import).filter(|f| *f > floor) {
                up.push(format!("{module} ({}) imports {import} ({})", FLOORS[floor].0, FLOORS[above].0));
            }
        }
    }
    assert!(up.is_empty(), "imports that run up a floor:\n{}", up.join("\n"));
}

#[test]
fn the_bottom_imports_nothing_of_the_controller_but_the_bottom() {
    let edges = graph();
    for bottom in ["wire", "writes", "fenced", "clock"] {
        let reached: Vec<&String> = edges.get(bottom).into_iter().flatten().collect();
        assert!(reached.is_empty(), "{bottom} imports {reached:?}: the vocabulary must stand on its own");
    }
}

/// The writer answers and keeps nothing of the cluster: it reaches the write vocabulary, the wire
/// form its answers are decoded in, the Event series, the metrics and the rights to write, never
/// the index nor anything that decides.
#[test]
fn the_writer_reaches_only_what_a_write_needs() {
    let edges = graph();
    let needs = ["writes", "wire", "fenced", "events", "metrics", "leader"];
    let reached: Vec<&String> =
        edges.get("writer").into_iter().flatten().filter(|m| !needs.contains(&m.as_str())).collect();
    assert!(reached.is_empty(), "writer imports {reached:?}: its callers put its answers into the index");
}

/// Every write is a `Writer` method: the requests that write (`fenced`) are the writer's alone.
#[test]
fn only_the_writer_sends_writes() {
    let edges = graph();
    assert!(edges.get("writer").is_some_and(|i| i.contains("fenced")), "the writer sends through fenced");
    let senders: Vec<&String> = edges
        .iter()
        .filter(|(m, imports)| m.as_str() != "writer" && imports.contains("fenced"))
        .map(|(m, _)| m)
        .collect();
    assert!(senders.is_empty(), "{senders:?} send writes themselves: make them Writer methods (src/writer.rs)");
}

/// The one function allowed past a screen: the flat list of every metric's registration, one
/// statement per metric, which reads best as one list.
const LONG_BY_DESIGN: [&str; 1] = ["metrics.rs"];

#[test]
fn no_function_is_longer_than_a_screen() {
    let long = vigil_module_graph::longer_than(&src(), 80, |f| {
        LONG_BY_DESIGN.iter().any(|file| f.place.starts_with(file) && f.place.ends_with(" default"))
    })
    .expect("read src/");
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
