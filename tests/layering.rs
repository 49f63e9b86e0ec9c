//! The module layering of `src/` (ARCHITECTURE.md): which top-level module may name
//! which. Read from the source text: every `crate::X` path (including `use crate::{X,
//! …}` groups) in a file under `src/<M>.rs` or `src/<M>/` is an edge M → X. The test fails
//! on an edge the table below does not allow, and on any cycle between top-level
//! modules, so a layer can only ever depend on the layers below it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may name. Bottom up: `protocol` and
/// `config`; then `store`, `auth`, `upstream`; `limits`; the engine `tasks`; the HTTP
/// `front`. `metrics` and `logsink` are leaves anyone may call; `demo` (the bundled
/// legacy server) stands apart and shares only the protocol types. `tls` (rustls
/// configurations) is a leaf beside them that records metrics.
const ALLOWED: &[(&str, &[&str])] = &[
    ("protocol", &[]),
    ("config", &["protocol"]),
    ("metrics", &[]),
    ("logsink", &[]),
    ("tls", &["metrics"]),
    ("store", &["protocol", "config", "metrics", "tls"]),
    ("auth", &["protocol", "config", "metrics", "tls"]),
    (
        "upstream",
        &["protocol", "config", "metrics", "auth", "tls"],
    ),
    (
        "limits",
        &["protocol", "config", "metrics", "auth", "store"],
    ),
    (
        "tasks",
        &[
            "protocol", "config", "metrics", "auth", "store", "upstream", "limits",
        ],
    ),
    (
        "front",
        &[
            "protocol", "config", "metrics", "auth", "store", "upstream", "limits", "tasks", "tls",
        ],
    ),
    ("demo", &["protocol"]),
    // `taskgate edge` (feature `edge`): beside `front`, in front of the replicas; it
    // reads its config, records its metrics, and checks methods and task ids, nothing
    // more.
    ("edge", &["protocol", "config", "metrics", "tasks", "tls"]),
    // Test-only harnesses over the untrusted-input surfaces: a top layer beside
    // `main`, since they drive `front` from above.
    (
        "fuzzing",
        &[
            "protocol", "config", "metrics", "auth", "store", "upstream", "limits", "tasks",
            "front",
        ],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None` for `lib.rs` and `main.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// Without line comments (doc comments may mention any module).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Every top-level module named by a `crate::` path in `code`.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // `crate::{a::b, c, d::{e, f}}`: the first identifier of each top-level item.
            let mut depth = 0usize;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident_at(&group[j..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let id = ident_at(after);
            if !id.is_empty() {
                out.insert(id);
            }
        }
        rest = after;
    }
    out
}

fn edges() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in files {
        let Some(module) = module_of(&src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let from = edges.entry(module.clone()).or_default();
        for to in named_modules(&code_of(&text)) {
            if to != module {
                from.entry(to).or_insert_with(|| f.display().to_string());
            }
        }
    }
    edges
}

#[test]
fn modules_name_only_the_layers_below_them() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (from, tos) in edges() {
        let Some(ok) = allowed.get(from.as_str()) else {
            wrong.push(format!("{from}: a top-level module missing from ALLOWED"));
            continue;
        };
        for (to, file) in tos {
            if !ok.contains(&to.as_str()) {
                wrong.push(format!("{from} -> {to} (in {file})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn nothing_below_front_names_front() {
    for (from, tos) in edges() {
        if from != "front" && from != "fuzzing" {
            assert!(
                !tos.contains_key("front"),
                "{from} names crate::front (in {})",
                tos["front"]
            );
        }
    }
}

#[test]
fn top_level_modules_form_no_cycle() {
    let edges = edges();
    // Depth-first search; a node met again while still on the stack closes a cycle.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeMap<String, String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for to in edges.get(n).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(to, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(cycle) = visit(n, &edges, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

/// Which sibling files of `src/demo/` each file names (`super::X` or `crate::demo::X`),
/// test modules aside (their `super::` is the file itself).
fn demo_file_edges() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/demo");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let names: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.file_stem()?.to_str().map(str::to_string))
        .filter(|n| n != "mod")
        .collect();
    let mut out = BTreeMap::new();
    for f in &files {
        let Some(name) = f.file_stem().and_then(|n| n.to_str()) else {
            continue;
        };
        if name == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let code = code_of(&text);
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        let mut named = BTreeSet::new();
        for prefix in ["super::", "crate::demo::"] {
            let rewritten = code.replace(prefix, "crate::");
            named.extend(
                named_modules(&rewritten)
                    .into_iter()
                    .filter(|n| names.contains(n)),
            );
        }
        named.remove(name);
        out.insert(name.to_string(), named);
    }
    out
}

#[test]
fn the_demo_files_import_one_way() {
    let edges = demo_file_edges();
    assert!(
        edges.get("server").is_some_and(|s| s.contains("tools")),
        "the scan finds server -> tools: {edges:?}"
    );
    for (from, tos) in &edges {
        for to in tos {
            assert!(
                !edges.get(to).is_some_and(|back| back.contains(from)),
                "demo/{from}.rs and demo/{to}.rs import each other"
            );
        }
    }
}

#[test]
fn the_scanner_reads_groups_and_ignores_comments() {
    let code = code_of(
        "use crate::{auth::Principal, store::{A, B}, protocol};\n// crate::front\nlet x = crate::metrics::f();",
    );
    let got: Vec<String> = named_modules(&code).into_iter().collect();
    assert_eq!(got, ["auth", "metrics", "protocol", "store"]);
}
