//! Prints a crate's import cycles (module by module, then folder by folder) and its longest functions:
//! `cargo run -p vigil-module-graph --example shape -- crates/vigil-controller/src [limit]`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let src = PathBuf::from(args.next().unwrap_or_else(|| "src".into()));
    let limit: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(80);
    let graph = vigil_module_graph::graph(&src)?;
    for cycle in vigil_module_graph::all_cycles(&graph) {
        println!("cycle: {}", cycle.join(" -> "));
    }
    for cycle in vigil_module_graph::all_cycles(&vigil_module_graph::folders(&graph)) {
        println!("folder cycle: {}", cycle.join(" -> "));
    }
    for f in vigil_module_graph::functions(&src)?.into_iter().filter(|f| f.lines > limit) {
        println!("{:>4} lines  {}", f.lines, f.place);
    }
    Ok(())
}
