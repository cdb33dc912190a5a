//! The documentation a newcomer walks: the book under docs/ builds with mdBook, and no link in
//! the built book or in README.md points at a page, file or anchor that is not there.
//!
//! mdBook comes from `VIGIL_MDBOOK` or scripts/mdbook.sh (installed from crates.io, cached).

use anyhow::{Context, Result, bail, ensure};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The mdbook binary: `VIGIL_MDBOOK`, else what scripts/mdbook.sh installs (once, cached).
fn mdbook() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("VIGIL_MDBOOK") {
        return Ok(PathBuf::from(path));
    }
    let out = Command::new(repo_root().join("scripts/mdbook.sh")).output().context("running scripts/mdbook.sh")?;
    ensure!(out.status.success(), "scripts/mdbook.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// A directory under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!("vigil-book-{}-{name}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the book whose `book.toml` is in `book` into `out`; mdBook's warnings fail the build.
fn build(book: &Path, out: &Path) -> Result<()> {
    let run =
        Command::new(mdbook()?).arg("build").arg(book).arg("--dest-dir").arg(out).output().context("running mdbook")?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    ensure!(run.status.success(), "mdbook build {} failed:\n{stderr}", book.display());
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    ensure!(warnings.is_empty(), "mdbook build {} warned:\n{}", book.display(), warnings.join("\n"));
    Ok(())
}

/// Every `.html` file under `dir`, by path relative to it.
fn html_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "html") {
                found.push(path.strip_prefix(dir)?.to_path_buf());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The values of `attr="…"` in an HTML text, entity-decoded.
fn attribute_values(html: &str, attr: &str) -> Vec<String> {
    let needle = format!(" {attr}=\"");
    html.match_indices(needle.as_str())
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| decode(&rest[..end]))
        })
        .collect()
}

/// HTML entities and percent escapes, as a browser reads an href or id.
fn decode(raw: &str) -> String {
    let text = raw
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) =
                (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_external(link: &str) -> bool {
    link.starts_with("//")
        || link.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
}

/// `path` joined onto `base` without touching the file system; `None` when it climbs above it.
fn join_inside(base: &Path, path: &str) -> Option<PathBuf> {
    let mut parts: Vec<Component> = base.components().collect();
    for c in Path::new(path).components() {
        match c {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            Component::RootDir => parts.clear(),
            other => parts.push(other),
        }
    }
    Some(parts.iter().collect())
}

/// The broken links of a built site: each as `page: link (what is missing)`.
fn check_site(site: &Path) -> Result<Vec<String>> {
    let pages = html_files(site)?;
    let mut ids: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut texts = Vec::new();
    for page in &pages {
        let html = std::fs::read_to_string(site.join(page))?;
        ids.insert(page.clone(), attribute_values(&html, "id").into_iter().collect());
        texts.push((page, html));
    }
    let mut broken = Vec::new();
    for (page, html) in &texts {
        let dir = page.parent().unwrap_or(Path::new(""));
        for link in attribute_values(html, "href").into_iter().chain(attribute_values(html, "src")) {
            if is_external(&link) || link.is_empty() {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let path = path.split('?').next().unwrap_or_default();
            let target = if path.is_empty() {
                Some(page.to_path_buf())
            } else if path.starts_with('/') {
                join_inside(Path::new(""), path.trim_start_matches('/'))
            } else {
                join_inside(dir, path)
            };
            let Some(mut target) = target else {
                broken.push(format!("{}: {link} (outside the book)", page.display()));
                continue;
            };
            if path.ends_with('/') || site.join(&target).is_dir() {
                target.push("index.html");
            }
            if !site.join(&target).is_file() {
                broken.push(format!("{}: {link} (no file {})", page.display(), target.display()));
            } else if !fragment.is_empty() && ids.get(&target).is_some_and(|ids| !ids.contains(fragment)) {
                broken.push(format!("{}: {link} (no anchor #{fragment} in {})", page.display(), target.display()));
            }
        }
    }
    Ok(broken)
}

/// The markdown links of a text outside code blocks and code spans, with their line numbers.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            links.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    links
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn github_slug(heading: &str) -> String {
    let text: String = heading.chars().filter(|c| *c != '`').collect();
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The broken links of the README's `text`: files that do not exist, anchors of its own
/// headings, and anchors of book pages (`docs/x.md#a`, checked against the built `x.html`).
fn check_readme(text: &str, root: &Path, site: &Path) -> Result<Vec<String>> {
    let mut own = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            own.insert(github_slug(line.trim_start_matches('#')));
        }
    }
    let mut broken = Vec::new();
    for (line, link) in markdown_links(text) {
        if is_external(&link) {
            continue;
        }
        let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
        let what = if path.is_empty() {
            (!own.contains(fragment)).then(|| format!("no heading for #{fragment}"))
        } else if !root.join(path).exists() {
            Some(format!("no file {path}"))
        } else if fragment.is_empty() {
            None
        } else if let Some(page) = path.strip_prefix("docs/").and_then(|p| p.strip_suffix(".md")) {
            let html = std::fs::read_to_string(site.join(format!("{page}.html")))
                .with_context(|| format!("README.md:{line}: {path} is not a page of the book"))?;
            (!attribute_values(&html, "id").iter().any(|id| id == fragment))
                .then(|| format!("no anchor #{fragment} in the book's {page}.html"))
        } else {
            bail!("README.md:{line}: {link}: an anchor into a file outside the book is not checked; link the book page")
        };
        if let Some(what) = what {
            broken.push(format!("README.md:{line}: {link} ({what})"));
        }
    }
    Ok(broken)
}

#[test]
fn the_book_builds_and_no_link_of_it_or_of_the_readme_is_broken() -> Result<()> {
    let root = repo_root();
    let out = TempDir::new("site")?;
    build(&root.join("docs"), &out.0)?;
    let pages = html_files(&out.0)?;
    for page in ["index.html", "api.html", "PERFORMANCE.html", "performance-history.html", "DECISIONS.html"] {
        ensure!(pages.contains(&PathBuf::from(page)), "the book has no {page}: {pages:?}");
    }
    let mut broken = check_site(&out.0)?;
    broken.extend(check_readme(&std::fs::read_to_string(root.join("README.md"))?, &root, &out.0)?);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    Ok(())
}

/// The check above can fail: a copy of the book with a link to a missing page, one to a missing
/// anchor of an existing page, and one to a missing anchor of its own page, gives exactly those;
/// so does a README with the same three.
#[test]
fn a_broken_page_link_or_anchor_in_the_book_is_found() -> Result<()> {
    let root = repo_root();
    let copy = TempDir::new("broken-src")?;
    let out = TempDir::new("broken-site")?;
    for entry in std::fs::read_dir(root.join("docs"))? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(&path, copy.0.join(path.file_name().context("a file name")?))?;
        }
    }
    let page = copy.0.join("introduction.md");
    let mut text = std::fs::read_to_string(&page)?;
    text.push_str("\n[gone](no-such-page.md), [no anchor](api.md#no-such-field), [nor here](#nowhere)\n");
    std::fs::write(&page, text)?;
    build(&copy.0, &out.0)?;
    let readme = "[ok](docs/api.md#the-api-vigildevv1alpha1) [ok](#a-heading) [ok](Cargo.toml)\n\
                  # A heading\n[gone](docs/nothing.md) [no anchor](docs/api.md#no-such-field) [nor](#nowhere)\n";
    assert_eq!(
        check_readme(readme, &root, &out.0)?,
        [
            "README.md:3: docs/nothing.md (no file docs/nothing.md)",
            "README.md:3: docs/api.md#no-such-field (no anchor #no-such-field in the book's api.html)",
            "README.md:3: #nowhere (no heading for #nowhere)",
        ]
    );
    let broken = check_site(&out.0)?;
    assert_eq!(
        broken,
        [
            "index.html: no-such-page.html (no file no-such-page.html)",
            "index.html: api.html#no-such-field (no anchor #no-such-field in api.html)",
            "index.html: #nowhere (no anchor #nowhere in index.html)",
            "introduction.html: no-such-page.html (no file no-such-page.html)",
            "introduction.html: api.html#no-such-field (no anchor #no-such-field in api.html)",
            "introduction.html: #nowhere (no anchor #nowhere in introduction.html)",
            "print.html: no-such-page.html (no file no-such-page.html)",
            "print.html: #no-such-field (no anchor #no-such-field in print.html)",
            "print.html: #nowhere (no anchor #nowhere in print.html)",
        ],
        "the planted links, and nothing else"
    );
    Ok(())
}

#[test]
fn readme_links_are_read_outside_code_and_headings_slugged_as_github_does() {
    let text = "See [a](docs/api.md#x) and `[not](a-link.md)`.\n```\n[nor](this.md)\n```\n[b](#the-api-in-brief)\n";
    assert_eq!(markdown_links(text), [(1, "docs/api.md#x".to_string()), (5, "#the-api-in-brief".to_string())]);
    assert_eq!(github_slug(" Many workload clusters (`--clusters N`)"), "many-workload-clusters---clusters-n");
    assert_eq!(
        github_slug(" Proven against Cluster API's own controllers"),
        "proven-against-cluster-apis-own-controllers"
    );
}
