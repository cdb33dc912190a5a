//! The shape of a crate's source, read from `src/` as text: which module imports which, and how
//! long each function is. The shape tests of every crate use it to keep each crate in one
//! reading order (modules import downwards only, folders too) and its functions short.
//!
//! References are `crate::a::b` paths, `super::` paths and a folder module's `child::` paths in
//! code (comments and doc links are not imports; nor is code under `#[cfg(test)]`, whose tests may
//! drive a module through the ones above it). Functions are counted from their `fn` line to
//! their closing brace; code under `#[cfg(test)]` is not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

/// Module name → the modules it refers to; the crate root (`""`) is left out, since it declares
/// every module and is nobody's dependency.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; `src/lib.rs` and `src/main.rs` are the
/// crate root, `""`.
pub fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

/// Every `.rs` file under `dir`, in a stable order.
pub fn rust_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    collect(dir, &mut out)?;
    out.sort();
    Ok(out)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The code of a file without line comments (doc comments included) and with the text of its
/// string and char literals blanked (line breaks kept): a `//` inside a string (`"https://…"`)
/// cuts no line short, and a brace in one (`'{'`, `"{"`) opens no block.
pub fn code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let end = match chars[i] {
            '/' if chars.get(i + 1) == Some(&'/') => {
                i = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n);
                continue;
            }
            '"' => string_end(&chars, i + 1, None),
            'r' if may_open_raw(&chars, i) => {
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                match chars.get(i + 1 + hashes) {
                    Some('"') => string_end(&chars, i + 2 + hashes, Some(hashes)),
                    _ => i + 1,
                }
            }
            '\'' => char_end(&chars, i),
            _ => i + 1,
        };
        if end > i + 1 || matches!(chars[i], '"' | '\'') {
            out.extend(chars[i..end].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push(chars[i]);
        }
        i = end;
    }
    out
}

/// Whether the `r` at `at` may open a raw string: no identifier goes on before it (but `b`).
fn may_open_raw(chars: &[char], at: usize) -> bool {
    let ident = |n: Option<usize>| n.and_then(|n| chars.get(n)).is_some_and(|c| c.is_alphanumeric() || *c == '_');
    let before = at.checked_sub(1);
    !ident(before) || (before.map(|b| chars[b]) == Some('b') && !ident(before.and_then(|b| b.checked_sub(1))))
}

/// Just past the end of the string literal whose text starts at `from`: its closing quote, and
/// the `raw` string's `#`s after it (a raw string has no escapes).
fn string_end(chars: &[char], from: usize, raw: Option<usize>) -> usize {
    let hashes = raw.unwrap_or(0);
    let mut i = from;
    while i < chars.len() {
        match chars[i] {
            '\\' if raw.is_none() => i += 2,
            '"' if chars[i + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes => {
                return i + 1 + hashes;
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// Just past the end of the char literal starting at `at`; a lifetime (`'a`) ends at its quote.
fn char_end(chars: &[char], at: usize) -> usize {
    match chars.get(at + 1) {
        Some('\\') => chars.iter().skip(at + 3).position(|&c| c == '\'').map_or(chars.len(), |n| at + n + 4),
        Some(_) if chars.get(at + 2) == Some(&'\'') => at + 3,
        _ => at + 1,
    }
}

/// The longest module in `modules` that `segments` starts with.
fn resolve(modules: &BTreeSet<String>, segments: &[&str]) -> Option<String> {
    (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| modules.contains(m))
}

/// Every path after `prefix` in `code`, as its segments; a `{a, b}` group gives one per item.
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
        if let Some(group) = tail.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            for item in group.split(',') {
                let segs: Vec<&str> = item.trim().split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
                if !segs.is_empty() {
                    out.push(segs);
                }
            }
            continue;
        }
        let segments: Vec<&str> = tail
            .split("::")
            .map(|s| s.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or(""))
            .take_while(|s| !s.is_empty())
            .collect();
        if !segments.is_empty() {
            out.push(segments);
        }
    }
    out
}

/// The import graph of the crate whose sources are under `src`.
pub fn graph(src: &Path) -> io::Result<Graph> {
    let files = rust_files(src)?;
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges = Graph::new();
    for file in &files {
        let me = module_of(src, file);
        let text = production(&code(&std::fs::read_to_string(file)?));
        let targets = references(&modules, &me, &text);
        edges.entry(me).or_default().extend(targets);
    }
    edges.remove("");
    for targets in edges.values_mut() {
        targets.remove("");
    }
    Ok(edges)
}

/// `code` without the items under `#[cfg(test)]`: a unit test may drive its module through the
/// modules above it (a claim seen through a whole decision), which is no import of the module.
fn production(code: &str) -> String {
    let lines: Vec<&str> = code.lines().collect();
    let mut kept = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_start().starts_with("#[cfg(test)]") {
            i = end_of_item(&lines, i + 1) + 1;
            continue;
        }
        kept.push(lines[i]);
        i += 1;
    }
    kept.join("\n")
}

/// The modules that module `me`, whose code is `text`, refers to.
fn references(modules: &BTreeSet<String>, me: &str, text: &str) -> BTreeSet<String> {
    let parent: Vec<&str> = if me.is_empty() { Vec::new() } else { me.split("::").collect() };
    let up = &parent[..parent.len().saturating_sub(1)];
    let mut targets = BTreeSet::new();
    for segs in paths_after(text, "crate::") {
        targets.extend(resolve(modules, &segs));
    }
    for segs in paths_after(text, "super::") {
        let mut base: Vec<&str> = up.to_vec();
        base.extend(segs);
        targets.insert(resolve(modules, &base).unwrap_or_else(|| up.join("::")));
    }
    // A module's own children, named relatively (`judge::Verdict`, `use judge::…`).
    let children =
        modules.iter().filter(|m| m.rsplit_once("::").map_or(me.is_empty() && !m.is_empty(), |(p, _)| p == me));
    for child in children {
        let name = child.rsplit("::").next().unwrap_or(child);
        if !paths_after(text, &format!("{name}::")).is_empty() {
            targets.insert(child.clone());
        }
    }
    targets.remove(me);
    targets
}

/// A cycle in `edges`, as the modules along it (first = last), if there is one.
pub fn find_cycle(edges: &Graph) -> Option<Vec<String>> {
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(node, edges, &mut done, &mut stack) {
            return Some(cycle);
        }
    }
    None
}

fn visit(node: &str, edges: &Graph, done: &mut BTreeSet<String>, stack: &mut Vec<String>) -> Option<Vec<String>> {
    if done.contains(node) {
        return None;
    }
    if let Some(from) = stack.iter().position(|n| n == node) {
        let mut cycle = stack[from..].to_vec();
        cycle.push(node.to_string());
        return Some(cycle);
    }
    stack.push(node.to_string());
    for next in edges.get(node).into_iter().flatten() {
        if let Some(cycle) = visit(next, edges, done, stack) {
            return Some(cycle);
        }
    }
    stack.pop();
    done.insert(node.to_string());
    None
}

/// Every cycle `find_cycle` can find after breaking each found one at its last edge: a list a
/// failing test can print whole, rather than one cycle per run.
pub fn all_cycles(edges: &Graph) -> Vec<Vec<String>> {
    let mut edges = edges.clone();
    let mut out = Vec::new();
    while let Some(cycle) = find_cycle(&edges) {
        let (from, to) = (&cycle[cycle.len() - 2], &cycle[cycle.len() - 1]);
        if let Some(targets) = edges.get_mut(from) {
            targets.remove(to);
        }
        out.push(cycle);
    }
    out
}

/// `edges` with each folder as one module (`index::checks` → `index`): no cycle hides in a child.
pub fn folders(edges: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_string();
    let mut out = Graph::new();
    for (from, targets) in edges {
        let from = top(from);
        let targets: BTreeSet<String> = targets.iter().map(|t| top(t)).filter(|t| *t != from).collect();
        out.entry(from).or_default().extend(targets);
    }
    out
}

/// One function and its length in lines, `fn` line to closing brace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// `path/to/file.rs:line name`, where a reader finds it.
    pub place: String,
    /// Lines from the `fn` line to the closing brace, both included.
    pub lines: usize,
}

/// Every function with a body under `src`, outside `#[cfg(test)]` items, longest first.
pub fn functions(src: &Path) -> io::Result<Vec<Function>> {
    let mut out = Vec::new();
    for file in rust_files(src)? {
        let text = code(&std::fs::read_to_string(&file)?);
        let shown = file.strip_prefix(src).unwrap_or(&file).display().to_string();
        out.extend(
            functions_in(&text)
                .into_iter()
                .map(|(line, name, lines)| Function { place: format!("{shown}:{line} {name}"), lines }),
        );
    }
    out.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.place.cmp(&b.place)));
    Ok(out)
}

/// The functions under `src` longer than `limit` lines, as "N lines: place", longest first,
/// leaving out those `allowed` accepts: what the shape tests of every crate report.
pub fn longer_than(src: &Path, limit: usize, allowed: impl Fn(&Function) -> bool) -> io::Result<Vec<String>> {
    Ok(functions(src)?
        .into_iter()
        .filter(|f| f.lines > limit && !allowed(f))
        .map(|f| format!("{} lines: {}", f.lines, f.place))
        .collect())
}

/// Every way the crate under `src` breaks the house rules every crate keeps, for one test per
/// crate: fewer than `min_modules` modules found (the reader missed the crate), an import cycle,
/// one with each folder counted as one module, a function over 80 lines, a type name declared
/// twice. Empty when it keeps them all.
pub fn house_rules(src: &Path, min_modules: usize) -> io::Result<Vec<String>> {
    let edges = graph(src)?;
    let mut broken = Vec::new();
    if edges.len() < min_modules {
        broken.push(format!("found only {} modules: {:?}", edges.len(), edges.keys().collect::<Vec<_>>()));
    }
    let cycles = |g: &Graph| all_cycles(g).into_iter().map(|c| c.join(" -> ")).collect::<Vec<_>>();
    broken.extend(cycles(&edges).into_iter().map(|c| format!("import cycle: {c}")));
    broken.extend(cycles(&folders(&edges)).into_iter().map(|c| format!("import cycle between folders: {c}")));
    broken.extend(
        longer_than(src, 80, |_| false)?.into_iter().map(|f| format!("over 80 lines, split it into named phases: {f}")),
    );
    broken.extend(
        repeated_type_names(src)?
            .into_iter()
            .map(|t| format!("type name declared twice, name each for what it holds: {t}")),
    );
    Ok(broken)
}

/// The type names (structs, enums, traits, unions and free type aliases; not associated types
/// nor anything under `#[cfg(test)]`) declared more than once under `src`, each with where:
/// one name per meaning, so a reader never has to ask which `Context` a line means.
pub fn repeated_type_names(src: &Path) -> io::Result<Vec<String>> {
    let mut places: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in rust_files(src)? {
        let text = production(&code(&std::fs::read_to_string(&file)?));
        let shown = file.strip_prefix(src).unwrap_or(&file).display().to_string();
        for (n, line) in text.lines().enumerate() {
            if let Some(name) = declared_type(line) {
                places.entry(name).or_default().push(format!("{shown}:{}", n + 1));
            }
        }
    }
    Ok(places
        .into_iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect())
}

/// The type a line declares, if any: `struct`, `enum`, `trait` or `union` at any depth (a type
/// inside a function is a type too), a `type` alias only at the top level or `pub` (an
/// indented private `type X = …;` is an impl's associated type).
fn declared_type(line: &str) -> Option<String> {
    let trimmed = line.trim_start();
    let indented = trimmed.len() < line.len();
    let after_vis = match trimmed.strip_prefix("pub") {
        Some(rest) if rest.starts_with(' ') => (false, rest.trim_start()),
        Some(rest) if rest.starts_with('(') => (false, rest.split_once(')').map_or("", |(_, r)| r).trim_start()),
        _ => (true, trimmed),
    };
    let (private, rest) = after_vis;
    let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
    let keyword = ["struct ", "enum ", "trait ", "union ", "type "].into_iter().find(|k| rest.starts_with(k))?;
    if keyword == "type " && private && indented {
        return None;
    }
    let name: String = rest[keyword.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// `(first line, name, length)` of every function with a body in `code`, skipping items under
/// `#[cfg(test)]` (`code` has its literals blanked, so a brace in one counts for nothing).
fn functions_in(code: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            i = end_of_item(&lines, i + 1) + 1;
            continue;
        }
        if let Some(name) = fn_name(trimmed) {
            let end = end_of_item(&lines, i);
            if has_body(&lines[i..=end.min(lines.len() - 1)]) {
                out.push((i + 1, name, end + 1 - i));
            }
        }
        i += 1;
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let at = line.find("fn ")?;
    let head = &line[..at];
    let words_ok = head.split_whitespace().all(|w| {
        matches!(w, "pub" | "async" | "const" | "unsafe" | "extern" | "default")
            || w.starts_with("pub(")
            || w.starts_with('"')
    });
    if !words_ok {
        return None;
    }
    let name: String = line[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// The line where the item starting at `start` ends: its braces balance again, or a `;` ends a
/// declaration without a body.
fn end_of_item(lines: &[&str], start: usize) -> usize {
    let mut depth = 0i64;
    let mut opened = false;
    for (n, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened && depth == 0 => return n,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return n;
        }
    }
    lines.len().saturating_sub(1)
}

fn has_body(lines: &[&str]) -> bool {
    lines.iter().any(|l| l.contains('{'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_is_found_and_named() {
        let mut edges = Graph::new();
        edges.entry("holders".into()).or_default().insert("peers".into());
        edges.entry("peers".into()).or_default().insert("machine".into());
        edges.entry("machine".into()).or_default().insert("holders".into());
        edges.entry("plan".into()).or_default();
        let cycle = find_cycle(&edges).expect("a cycle");
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 4, "{cycle:?}");
        assert_eq!(all_cycles(&edges).len(), 1);
        edges.get_mut("machine").expect("machine").clear();
        assert_eq!(find_cycle(&edges), None);
    }

    #[test]
    fn references_follow_crate_super_and_children() {
        let modules: BTreeSet<String> = ["a", "a::b", "a::c", "d"].into_iter().map(String::from).collect();
        let text = code("use super::c::X; // crate::d is a comment\nfn f() { crate::d::g(); }");
        let r = references(&modules, "a::b", &text);
        assert_eq!(r, ["a::c", "d"].into_iter().map(String::from).collect());
        let r = references(&modules, "a", "use b::Y; use crate::{d, a::c};");
        assert_eq!(r, ["a::b", "a::c", "d"].into_iter().map(String::from).collect());
    }

    #[test]
    fn a_test_module_imports_nothing_for_its_module() {
        let modules: BTreeSet<String> = ["a", "d"].into_iter().map(String::from).collect();
        let text = production("use crate::d::X;\n#[cfg(test)]\nmod tests {\n    use crate::a::Y;\n}\nfn f() {}");
        assert_eq!(references(&modules, "b", &text), ["d"].into_iter().map(String::from).collect());
    }

    #[test]
    fn function_lengths_skip_tests_and_declarations() {
        let text = "pub fn one() {\n    x();\n}\n\nfn decl();\n\n#[cfg(test)]\nmod tests {\n    fn long() {\n\n\n\n    }\n}\nasync fn two(a: u8)\n    -> u8 {\n    a\n}\n";
        let found = functions_in(text);
        assert_eq!(found, vec![(1, "one".to_string(), 3), (15, "two".to_string(), 4)]);
    }

    #[test]
    fn a_url_in_a_string_is_no_comment() {
        let text = "fn f() { g(\"http://x/{}\", '\"', r#\"a\"//\"#, '\\'', 'a'); } // }\nfn h<'a>() {\n}";
        let lines: Vec<String> =
            code(text).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(lines, ["fn f() { g( , , , , ); }", "fn h< a>() {", "}"], "literals blanked, the comment gone");
        assert_eq!(functions_in(&code(text)), vec![(1, "f".to_string(), 1), (2, "h".to_string(), 2)]);
    }

    #[test]
    fn a_brace_in_a_char_or_string_literal_opens_no_block() {
        let text = "fn f(t: &str) -> bool {\n    t.starts_with('{') || t == \"{\" || b'{' == 0\n}\nfn g() {\n}\n";
        assert_eq!(functions_in(&code(text)), vec![(1, "f".to_string(), 3), (4, "g".to_string(), 2)]);
    }

    #[test]
    fn a_folder_counts_as_one_module() {
        let mut edges = Graph::new();
        edges.entry("index".into()).or_default().insert("index::checks".into());
        edges.entry("index::checks".into()).or_default().extend(["medik8s::upstream".into(), "writes".into()]);
        edges.entry("medik8s".into()).or_default().insert("medik8s::upstream".into());
        edges.entry("medik8s::upstream".into()).or_default();
        edges.entry("writes".into()).or_default();
        let mut want = Graph::new();
        want.entry("index".into()).or_default().extend(["medik8s".into(), "writes".into()]);
        want.entry("medik8s".into()).or_default();
        want.entry("writes".into()).or_default();
        assert_eq!(folders(&edges), want);
        assert_eq!(find_cycle(&edges), None);
        edges.get_mut("medik8s").expect("medik8s").insert("index".into());
        assert_eq!(find_cycle(&edges), None, "module by module, the two folders only meet through a child");
        assert!(find_cycle(&folders(&edges)).is_some(), "index -> medik8s -> index");
    }

    #[test]
    fn a_type_is_what_a_struct_enum_trait_or_free_alias_declares() {
        let cases = [
            ("struct A {", Some("A")),
            ("pub(crate) enum B<'a> {", Some("B")),
            ("    struct Inner;", Some("Inner")),
            ("pub trait C: Send {", Some("C")),
            ("type D = u8;", Some("D")),
            ("    pub type E<'c> = (&'c str, u8);", Some("E")),
            ("    type Scope = ClusterResourceScope;", None),
            ("fn struct_like() {}", None),
            ("let structure = 1;", None),
        ];
        for (line, want) in cases {
            assert_eq!(declared_type(line).as_deref(), want, "{line}");
        }
    }

    #[test]
    fn the_house_rules_name_each_break() {
        let dir = std::env::temp_dir().join(format!("house-rules-{}", std::process::id()));
        let src = dir.join("src");
        std::fs::create_dir_all(&src).expect("dir");
        std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").expect("lib");
        std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").expect("a");
        std::fs::write(src.join("b.rs"), "use crate::a::A;\npub struct A;\npub struct B;\n").expect("b");
        let broken = house_rules(&src, 5).expect("read");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(broken.len(), 4, "{broken:#?}");
        assert!(broken[0].starts_with("found only 2 modules"), "{broken:#?}");
        assert_eq!(broken[1], "import cycle: a -> b -> a");
        assert_eq!(broken[2], "import cycle between folders: a -> b -> a");
        assert!(
            broken[3].starts_with("type name declared twice") && broken[3].contains("A: a.rs:2, b.rs:2"),
            "{broken:#?}"
        );
    }
}
