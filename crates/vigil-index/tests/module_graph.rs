//! The read side reads in one order: the sources' words, the surroundings, medik8s' checks and
//! lenient reading at the bottom; the index (its stores in their own modules) above them; who
//! holds which target above the index; gathering a decision above them; a check's whole turn
//! (decide, confirm, cache its claims) on top. This test fails on any
//! import cycle between its modules (and between its folders, each counted as one module), on a
//! floor that reaches above itself, on two types of one name, and on a function longer than a
//! screen.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_read_side_keeps_the_house_rules() {
    let broken = vigil_module_graph::house_rules(&src(), 5).expect("read src/");
    assert!(broken.is_empty(), "the read side breaks the house rules:\n{}", broken.join("\n"));
}

/// Each floor and the modules it may import (besides its own floor's and the ones below).
const FLOORS: [(&str, &[&str]); 5] = [
    ("words", &["sources", "around", "upstream", "lenient"]),
    ("stores", &["index::checks", "index::hosting", "index::by_node", "index::claim_cache", "index", "index::fill"]),
    ("holders", &["claims"]),
    ("gather", &["gather"]),
    ("turn", &["decision"]),
];

#[test]
fn every_module_sits_on_a_floor_and_imports_nothing_above_it() {
    let edges = vigil_module_graph::graph(&src()).expect("read src/");
    let floor_of = |m: &str| FLOORS.iter().position(|(_, modules)| modules.contains(&m));
    let mut up = Vec::new();
    for (module, imports) in &edges {
        let Some(floor) = floor_of(module) else {
            up.push(format!("{module} is on no floor: place it in FLOORS and in docs/ARCHITECTURE.md"));
            continue;
        };
        for import in imports {
            if let Some(above) = floor_of(import).filter(|f| *f > floor) {
                up.push(format!("{module} ({}) imports {import} ({})", FLOORS[floor].0, FLOORS[above].0));
            }
        }
    }
    assert!(up.is_empty(), "imports that run up a floor:\n{}", up.join("\n"));
}
