//! The engine's modules import downwards only: shared vocabulary at the bottom, features above
//! it, the two decisions on top. This test reads `src/` and fails on any import cycle between
//! modules (a module reaching a module that reaches it back), naming the cycle, so the engine
//! keeps an order in which it can be read and each feature tested without the decisions.
//!
//! References are `crate::a::b` paths, `super::` paths and a folder module's `child::` paths in
//! code (comments and doc links are not imports).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; `src/lib.rs` is the crate root, `""`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments (line comments, including doc comments).
fn code(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The longest module in `modules` that `path` (segments) starts with.
fn resolve(modules: &BTreeSet<String>, segments: &[&str]) -> Option<String> {
    (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| modules.contains(m))
}

/// Every `prefix` path in `code`, as its segments.
fn paths_after<'c>(code: &'c str, prefix: &str) -> Vec<Vec<&'c str>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i + prefix.len()..];
        rest = tail;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let segments: Vec<&str> = tail
            .split("::")
            .map(|s| s.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or(""))
            .take_while(|s| !s.is_empty())
            .collect();
        // `crate::{a, b}` style groups name several modules.
        if let Some(group) = tail.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            for item in group.split(',') {
                let segs: Vec<&str> = item.trim().split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
                if !segs.is_empty() {
                    out.push(segs);
                }
            }
        } else if !segments.is_empty() {
            out.push(segments);
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let me = module_of(&src, file);
        let text = code(&std::fs::read_to_string(file).expect("read a source file"));
        let parent: Vec<&str> = if me.is_empty() { Vec::new() } else { me.split("::").collect() };
        let mut targets = BTreeSet::new();
        for segs in paths_after(&text, "crate::") {
            targets.extend(resolve(&modules, &segs));
        }
        for segs in paths_after(&text, "super::") {
            let mut base: Vec<&str> = parent[..parent.len().saturating_sub(1)].to_vec();
            base.extend(segs);
            targets
                .extend(resolve(&modules, &base).or_else(|| Some(parent[..parent.len().saturating_sub(1)].join("::"))));
        }
        // A module's own children, named relatively (`judge::Verdict`, `use judge::…`).
        for child in
            modules.iter().filter(|m| m.rsplit_once("::").map_or(me.is_empty() && !m.is_empty(), |(p, _)| p == me))
        {
            let name = child.rsplit("::").next().unwrap_or(child);
            if !paths_after(&text, &format!("{name}::")).is_empty() {
                targets.insert(child.clone());
            }
        }
        targets.remove(&me);
        edges.entry(me).or_default().extend(targets);
    }
    // The crate root declares every module; it is nobody's dependency and everybody's parent.
    edges.remove("");
    for targets in edges.values_mut() {
        targets.remove("");
    }
    edges
}

/// A cycle in `edges`, as the modules along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, edges, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_engine_modules_import_downwards_only() {
    let edges = graph();
    assert!(edges.len() > 10, "found the engine's modules: {:?}", edges.keys().collect::<Vec<_>>());
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle between engine modules: {}", cycle.join(" -> "));
    }
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
fn the_cycle_finder_finds_a_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("holders".into()).or_default().insert("peers".into());
    edges.entry("peers".into()).or_default().insert("machine".into());
    edges.entry("machine".into()).or_default().insert("holders".into());
    edges.entry("plan".into()).or_default();
    let cycle = find_cycle(&edges).expect("a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{cycle:?}");
    edges.get_mut("machine").expect("machine").clear();
    assert_eq!(find_cycle(&edges), None);
}
