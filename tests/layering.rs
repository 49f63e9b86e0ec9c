//! The module layering of `src/` (ARCHITECTURE.md): which top-level module may name
//! which. Read from the source text: every `crate::X` path (including `use crate::{X,
//! …}` groups) in a file under `src/<M>.rs` or `src/<M>/` is an edge M → X. The test fails
//! on an edge the table below does not allow, and on any cycle between top-level
//! modules, so a layer can only ever depend on the layers below it.
//!
//! Inside a top-level module the files import one way too: every `crate::…`,
//! `super::…` and `self::…` path, and a bare path that starts with a child module, is
//! an edge from its file to the file of the longest module the path names, and the
//! files of one module may form no cycle (`the_files_of_a_module_form_no_cycle`).

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
    // OpenTelemetry traces: the exporter (over the TLS client), its config, the
    // `_meta` carrier and its counters; named by every layer that opens a span.
    ("telemetry", &["protocol", "config", "metrics", "tls"]),
    ("store", &["protocol", "config", "metrics", "tls"]),
    ("auth", &["protocol", "config", "metrics", "tls"]),
    (
        "upstream",
        &["protocol", "config", "metrics", "auth", "tls", "telemetry"],
    ),
    (
        "limits",
        &["protocol", "config", "metrics", "auth", "store"],
    ),
    (
        "tasks",
        &[
            "protocol",
            "config",
            "metrics",
            "auth",
            "store",
            "upstream",
            "limits",
            "telemetry",
        ],
    ),
    (
        "front",
        &[
            "protocol",
            "config",
            "metrics",
            "auth",
            "store",
            "upstream",
            "limits",
            "tasks",
            "tls",
            "telemetry",
        ],
    ),
    ("demo", &["protocol"]),
    // `taskgate admin`: a client of the operator API over HTTP; it names the task
    // statuses it prints, and the TLS client configuration.
    ("admin_client", &["store", "tls"]),
    // `taskgate edge` (feature `edge`): beside `front`, in front of the replicas; it
    // reads its config, records its metrics, and checks methods and task ids, nothing
    // more.
    (
        "edge",
        &["protocol", "config", "metrics", "tasks", "tls", "telemetry"],
    ),
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

/// Without comments (doc comments may mention any module), and with the text of string
/// and character literals blanked: a `//` inside a URL is no comment, a path inside a
/// string names nothing, and a brace inside one must not upset the brace matching of
/// [`without_test_modules`]. Line breaks are kept.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(c) = at(i) {
        match (c, at(i + 1)) {
            ('/', Some('/')) => {
                while at(i).is_some_and(|c| c != '\n') {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                // Block comments nest.
                let mut depth = 0usize;
                while let Some(c) = at(i) {
                    match (c, at(i + 1)) {
                        ('/', Some('*')) => {
                            depth += 1;
                            i += 2;
                        }
                        ('*', Some('/')) => {
                            depth -= 1;
                            i += 2;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {
                            if c == '\n' {
                                out.push('\n');
                            }
                            i += 1;
                        }
                    }
                }
            }
            ('"', _) => {
                let raw = raw_string_hashes(&out);
                out.push('"');
                i += 1;
                while let Some(c) = at(i) {
                    match (c, raw) {
                        ('\\', None) => {
                            if at(i + 1) == Some('\n') {
                                out.push('\n');
                            }
                            i += 2;
                        }
                        ('"', None) => {
                            out.push('"');
                            i += 1;
                            break;
                        }
                        ('"', Some(n)) if (1..=n).all(|k| at(i + k) == Some('#')) => {
                            out.push('"');
                            out.extend(std::iter::repeat_n('#', n));
                            i += 1 + n;
                            break;
                        }
                        _ => {
                            if c == '\n' {
                                out.push('\n');
                            }
                            i += 1;
                        }
                    }
                }
            }
            // A character literal (`'x'`, `'\''`, `'\u{7b}'`); otherwise a lifetime.
            ('\'', Some('\\')) => {
                i += 3;
                while at(i).is_some_and(|c| c != '\'') {
                    i += 1;
                }
                out.push_str("' '");
                i += 1;
            }
            ('\'', _) if at(i + 2) == Some('\'') => {
                out.push_str("' '");
                i += 3;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// When `before` (the code up to a `"`) ends in a raw string's opening (`r`, `br` or
/// `cr` and some `#`), the number of `#`.
fn raw_string_hashes(before: &str) -> Option<usize> {
    let rest = before.trim_end_matches('#');
    let hashes = before.len() - rest.len();
    let rest = rest.strip_suffix('r')?;
    let rest = rest
        .strip_suffix('b')
        .or_else(|| rest.strip_suffix('c'))
        .unwrap_or(rest);
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    (!rest.ends_with(ident_char)).then_some(hashes)
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

// File-level cycles: the files of one top-level module import one way too.

/// Every `.rs` file of `src/` as its module path (`src/<a>/<b>.rs` and
/// `src/<a>/<b>/mod.rs` are `a::b`), its path and its text; `lib.rs` and `main.rs`, the
/// crate root, are left out.
fn source_files() -> Vec<(String, PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&src).ok()?.with_extension("");
            let mut parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
            if parts.last() == Some(&"mod") {
                parts.pop();
            }
            if parts == ["lib"] || parts == ["main"] {
                return None;
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            Some((parts.join("::"), f, text))
        })
        .collect()
}

/// `code` without its test-only `mod …` items (`mod tests;` or `mod tests { … }`, under
/// `#[cfg(test)]` or `#[cfg(all(test, …))]`): inside a test module `super::` is the
/// file itself, and tests may reach anywhere.
fn without_test_modules(code: &str) -> String {
    const ATTRS: [&str; 2] = ["#[cfg(test)]", "#[cfg(all(test,"];
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = ATTRS.iter().filter_map(|a| rest.find(a)).min() {
        // The attribute ends at its closing bracket.
        let Some(close) = rest[i..].find(']') else {
            break;
        };
        let end = i + close + 1;
        let after = &rest[end..];
        match test_module_len(after) {
            Some(n) => {
                out.push_str(&rest[..i]);
                rest = &after[n..];
            }
            None => {
                out.push_str(&rest[..end]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The length of the module item `s` starts with (after blanks and further
/// attributes), if it starts with one.
fn test_module_len(s: &str) -> Option<usize> {
    let mut t = s.trim_start();
    while t.starts_with("#[") {
        t = t[t.find(']')? + 1..].trim_start();
    }
    if let Some(r) = t.strip_prefix("pub") {
        t = r.trim_start();
        if let Some(r) = t.strip_prefix('(') {
            t = r[r.find(')')? + 1..].trim_start();
        }
    }
    t = t.strip_prefix("mod")?;
    if !t.starts_with(char::is_whitespace) {
        return None;
    }
    t = t.trim_start();
    let name = ident_at(t);
    if name.is_empty() {
        return None;
    }
    t = t[name.len()..].trim_start();
    let head = s.len() - t.len();
    if t.starts_with(';') {
        return Some(head + 1);
    }
    if !t.starts_with('{') {
        return None;
    }
    let mut depth = 0usize;
    for (j, c) in t.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(head + j + 1);
                }
            }
            _ => {}
        }
    }
    // Unbalanced: the test module runs to the end of the file.
    Some(s.len())
}

/// One path written in code, split into its segments (`super::x::{A, y::B}` is two:
/// `super::x::A` and `super::x::y::B`), and whether it is re-exported (`pub use` or
/// `pub(…) use`).
struct WrittenPath {
    segments: Vec<String>,
    reexport: bool,
}

/// Every path of `code` that starts with an identifier followed by `::`: `crate::…`,
/// `super::…`, `self::…` and bare ones (which name a module only when they start with a
/// child module of the file; the caller decides). `use` groups are expanded.
fn written_paths(code: &str) -> Vec<WrittenPath> {
    let bytes = code.as_bytes();
    let continues = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':' || b == b'.';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let starts = (b.is_ascii_alphabetic() || b == b'_') && (i == 0 || !continues(bytes[i - 1]));
        if !starts {
            i += 1;
            continue;
        }
        let id = ident_at(&code[i..]);
        if !code[i + id.len()..].starts_with("::") {
            i += id.len();
            continue;
        }
        let mut paths = Vec::new();
        let len = use_tree(&code[i..], &[], &mut paths);
        let reexport = is_reexport(statement_head(code, i));
        out.extend(
            paths
                .into_iter()
                .map(|segments| WrittenPath { segments, reexport }),
        );
        i += len.max(id.len());
    }
    out
}

/// Parses the path or use tree `s` starts with, adding each full path (with `prefix`
/// in front) to `out`; returns the length parsed.
fn use_tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let blanks = |s: &str| s.len() - s.trim_start().len();
    let mut segments = prefix.to_vec();
    let mut pos = 0;
    loop {
        pos += blanks(&s[pos..]);
        if s[pos..].starts_with('{') {
            pos += 1;
            loop {
                pos += use_tree(&s[pos..], &segments, out);
                pos += blanks(&s[pos..]);
                match s[pos..].chars().next() {
                    Some(',') => pos += 1,
                    Some('}') => return pos + 1,
                    _ => return pos,
                }
            }
        }
        let id = ident_at(&s[pos..]);
        if id.is_empty() {
            // `*`, a generic argument, the end: the path so far.
            break;
        }
        pos += id.len();
        segments.push(id);
        if s[pos..].starts_with("::") {
            pos += 2;
        } else {
            break;
        }
    }
    if segments.len() > prefix.len() {
        out.push(segments);
    }
    pos
}

/// The code of the statement `code[..at]` is in, up to `at`.
fn statement_head(code: &str, at: usize) -> &str {
    let start = code[..at].rfind([';', '{', '}']).map_or(0, |j| j + 1);
    &code[start..at]
}

/// Whether a statement that begins `head` is a re-export: `pub use` or `pub(…) use`.
fn is_reexport(head: &str) -> bool {
    let Some(h) = head.trim_end().strip_suffix("use") else {
        return false;
    };
    if !h.ends_with(char::is_whitespace) {
        return false;
    }
    let mut h = h.trim_end();
    if let Some(inner) = h.strip_suffix(')') {
        let Some(open) = inner.rfind('(') else {
            return false;
        };
        h = inner[..open].trim_end();
    }
    h.strip_suffix("pub")
        .is_some_and(|before| !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

/// The module of `modules` that `path`, written in module `at`, names: the longest
/// prefix of it that is a module. A bare path names one only when it starts with a
/// child module of `at`.
fn resolve(at: &str, path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let mut module: Vec<&str> = at.split("::").filter(|s| !s.is_empty()).collect();
    let (first, rest) = path.split_first()?;
    let rest = match first.as_str() {
        "crate" => {
            module.clear();
            rest
        }
        "self" => rest,
        "super" => {
            module.pop()?;
            rest
        }
        _ => path,
    };
    let mut found = module.join("::");
    for segment in rest {
        match segment.as_str() {
            "super" => {
                module.pop()?;
                found = module.join("::");
            }
            "self" => {}
            s => {
                module.push(s);
                let candidate = module.join("::");
                if !modules.contains(&candidate) {
                    break;
                }
                found = candidate;
            }
        }
    }
    // A bare path that does not start with a child module is another crate or an item.
    if !matches!(first.as_str(), "crate" | "self" | "super") && found == at {
        return None;
    }
    Some(found)
}

/// File → file imports: for each module (one file), the modules its code names, each
/// with the first path that names it. Re-exports of a file's own children (a façade's
/// `pub use child::…`) are not imports; nor is the crate root, nor the file itself.
fn file_edges(files: &[(&str, &str)]) -> BTreeMap<String, BTreeMap<String, String>> {
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.to_string()).collect();
    let mut edges = BTreeMap::new();
    for (at, text) in files {
        let named: &mut BTreeMap<String, String> = edges.entry(at.to_string()).or_default();
        let inside = format!("{at}::");
        for path in written_paths(&without_test_modules(&code_of(text))) {
            let Some(to) = resolve(at, &path.segments, &modules) else {
                continue;
            };
            if to.is_empty() || to == *at || (path.reexport && to.starts_with(&inside)) {
                continue;
            }
            named.entry(to).or_insert_with(|| path.segments.join("::"));
        }
    }
    edges
}

fn top_module(m: &str) -> &str {
    m.split("::").next().unwrap_or(m)
}

/// The cycles of the file graph, counting only imports that stay inside one top-level
/// module (those between top-level modules are the layering's): each strongly
/// connected component of more than one file, sorted (Tarjan's algorithm).
fn file_cycles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        next: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn lower(&mut self, v: &str, to: usize) {
            if let Some(low) = self.low.get_mut(v) {
                *low = (*low).min(to);
            }
        }

        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.next.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    self.lower(v, self.low[w]);
                } else if self.on_stack.contains(w) {
                    self.lower(v, self.index[w]);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let next = edges
        .iter()
        .map(|(from, tos)| {
            let inside = tos
                .keys()
                .map(String::as_str)
                .filter(|to| top_module(to) == top_module(from))
                .collect();
            (from.as_str(), inside)
        })
        .collect();
    let mut t = Tarjan {
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

#[test]
fn the_files_of_a_module_form_no_cycle() {
    let files = source_files();
    let texts: Vec<(&str, &str)> = files
        .iter()
        .map(|(m, _, text)| (m.as_str(), text.as_str()))
        .collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let paths: BTreeMap<&str, String> = files
        .iter()
        .map(|(m, f, _)| {
            let rel = f.strip_prefix(root).unwrap_or(f);
            (m.as_str(), rel.display().to_string())
        })
        .collect();
    let edges = file_edges(&texts);
    // A scan that finds nothing would pass everything: it must see a `super::` path
    // and a bare child path of a `mod.rs`.
    for (from, to) in [
        ("upstream::registry", "upstream::stdio"),
        ("store::postgres", "store::postgres::tls"),
    ] {
        assert!(
            edges.get(from).is_some_and(|t| t.contains_key(to)),
            "the scan finds {from} -> {to}: {:?}",
            edges.get(from)
        );
    }
    let cycles = file_cycles(&edges);
    let mut wrong = Vec::new();
    for cycle in &cycles {
        let top = top_module(&cycle[0]);
        let mut lines = vec![format!("files of `{top}` that import each other:")];
        for from in cycle {
            for (to, written) in &edges[from] {
                if cycle.contains(to) {
                    lines.push(format!("  {} -> {to} ({written})", paths[from.as_str()]));
                }
            }
        }
        wrong.push(lines.join("\n"));
    }
    assert!(
        wrong.is_empty(),
        "file-level import cycles (ARCHITECTURE.md \"Layers\"):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_file_scanner_reads_paths_groups_children_and_reexports() {
    let files = [
        (
            "m",
            "mod a;\nmod b;\nmod c;\npub use a::Thing;\npub(crate) use self::b::{Other, More};\n\
             use self::c::X; // crate::n\nfn f() { b::g(); let s = \"super::n::Q\"; }\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::n;\n}\n",
        ),
        (
            "m::a",
            "use super::{\n    b::{self, Y},\n    Z,\n};\nuse crate::n::deep::W;\n\
             const C: char = '{';\nfn f<'x>(s: &'x str) -> &'x str { s }\n\
             const R: &str = r#\"crate::m::c\"#;\n",
        ),
        (
            "m::b",
            "pub(super) fn g() {}\n/* crate::n */\n#[cfg(test)]\n#[allow(dead_code)]\n\
             pub(crate) mod tests {\n    use crate::m::c;\n}\nuse std::collections::HashMap;\n",
        ),
        (
            "m::c",
            "fn h() {\n    let url = \"http://h/\"; super::super::n::f();\n    self::inner();\n    \
             Vec::<u8>::new();\n}\nfn inner() {}\n\
             #[cfg(all(test, feature = \"x\"))]\nmod gated {\n    use crate::m::a;\n}\n",
        ),
        ("n", "pub mod deep;\n"),
        ("n::deep", "pub use crate::m::c::X;\n"),
    ];
    let edges = file_edges(&files);
    let named = |m: &str| -> Vec<&str> { edges[m].keys().map(String::as_str).collect() };
    assert_eq!(named("m"), ["m::b", "m::c"]);
    assert_eq!(named("m::a"), ["m", "m::b", "n::deep"]);
    assert_eq!(named("m::b"), Vec::<&str>::new());
    assert_eq!(named("m::c"), ["n"]);
    assert_eq!(named("n"), Vec::<&str>::new());
    // Re-exporting what is not a child of the file is an import.
    assert_eq!(named("n::deep"), ["m::c"]);
    assert_eq!(edges["m"]["m::b"], "b::g");
    assert!(file_cycles(&edges).is_empty(), "{:?}", file_cycles(&edges));

    // A cycle inside `x`; `y` <-> `x::q` crosses top-level modules and is the
    // layering's business, not this check's.
    let files = [
        ("x", "mod p;\nmod q;\nuse p::P;\n"),
        ("x::p", "use super::q::Q;\n"),
        ("x::q", "use crate::x::p::P;\nuse crate::y::Y;\n"),
        ("y", "use crate::x::q::Q;\n"),
    ];
    assert_eq!(file_cycles(&file_edges(&files)), [["x::p", "x::q"]]);
}

/// Issue 27's first part: the wire names of the methods the gateway serves are spelled
/// in one table (`src/protocol/method.rs`); everything else names a `Method`. Test
/// modules and files, the mock upstream, the demo upstream and the fuzzing corpus
/// (which speak the wire on purpose) are not counted.
#[test]
fn served_method_names_are_spelled_once() {
    let table = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/protocol/method.rs"),
    )
    .unwrap_or_default();
    let names: Vec<String> = table
        .split("spec(")
        .skip(1)
        .filter(|s| s.trim_start().starts_with("Method::"))
        .filter_map(|s| s.split('"').nth(1).map(str::to_string))
        .collect();
    assert!(
        names.len() >= 10 && names.iter().any(|n| n == "tasks/get"),
        "the method table was not found: {names:?}"
    );
    let mut spelled = Vec::new();
    for (module, path, text) in source_files() {
        let exempt = module == "protocol::method"
            || module.starts_with("demo")
            || module.starts_with("fuzzing")
            || module.contains("test")
            || module.ends_with("mock_server");
        if exempt {
            continue;
        }
        let code: String = without_test_modules(&text)
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for n in &names {
            if code.contains(&format!("\"{n}\"")) {
                spelled.push(format!("{} spells \"{n}\"", path.display()));
            }
        }
    }
    assert!(
        spelled.is_empty(),
        "name the Method instead:\n{}",
        spelled.join("\n")
    );
}

/// The ad-hoc JSON lookups (`.get("literal")` outside `src/protocol` and `src/demo`,
/// counted by `scripts/count-lookups.sh`, the one definition) stay at or under their
/// ceiling: a wire shape is parsed into a type where it enters, not read key by key
/// wherever it is used (ARCHITECTURE.md "One request path for both eras").
#[test]
fn ad_hoc_json_lookups_stay_under_their_ceiling() {
    const CEILING: usize = 10;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/count-lookups.sh"))
        .arg("-v")
        .output()
        .expect("bash runs scripts/count-lookups.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "count-lookups.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total: usize = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("the last line is the total");
    assert!(
        total <= CEILING,
        "{total} ad-hoc JSON lookups, over the ceiling of {CEILING}; parse the shape \
         into a type in src/protocol instead:\n{text}"
    );
}

/// Which era a request speaks is decided in one file, `src/front/era.rs`: only it
/// defines the markers' tests and puts an `Era` into a request's extensions
/// (ARCHITECTURE.md "One request path for both eras").
#[test]
fn the_era_is_decided_in_one_file() {
    let deciders = [
        "fn modern_by_header",
        "fn legacy_post",
        "fn serves_bodiless",
        "insert(Era::",
        "insert(era)",
    ];
    let mut found_in_era = 0;
    let mut elsewhere = Vec::new();
    for (module, path, text) in source_files() {
        let code = without_test_modules(&text);
        for d in deciders {
            if !code.contains(d) {
                continue;
            }
            if module == "front::era" {
                found_in_era += 1;
            } else {
                elsewhere.push(format!("{} has `{d}`", path.display()));
            }
        }
    }
    assert!(
        found_in_era >= 3,
        "src/front/era.rs was not found or lost its markers"
    );
    assert!(
        elsewhere.is_empty(),
        "the era is decided outside src/front/era.rs:\n{}",
        elsewhere.join("\n")
    );
}

/// The front reaches the engine through its public surface only: the items
/// `src/tasks/mod.rs` defines or re-exports, never one of its files' modules
/// (`crate::tasks::call::…`), so the engine's files can change without the front
/// noticing (ARCHITECTURE.md "One engine entry for a tool call").
#[test]
fn the_front_names_only_the_engines_surface() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut engine_files = BTreeSet::new();
    if let Ok(dir) = std::fs::read_dir(src.join("tasks")) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let module = name.strip_suffix(".rs").unwrap_or(&name).to_string();
            if module != "mod" {
                engine_files.insert(module);
            }
        }
    }
    assert!(
        engine_files.contains("call") && engine_files.contains("repo"),
        "the engine's files were not found: {engine_files:?}"
    );
    let mut named = Vec::new();
    let mut seen_engine = false;
    for (module, path, text) in source_files() {
        if !module.starts_with("front") || module.contains("test") {
            continue;
        }
        let code = code_of(&without_test_modules(&text));
        for (at, _) in code.match_indices("crate::tasks::") {
            seen_engine = true;
            let rest = &code[at + "crate::tasks::".len()..];
            let idents: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                inner
                    .split(',')
                    .map(|p| ident_at(p.trim()))
                    .filter(|p| !p.is_empty())
                    .collect()
            } else {
                vec![ident_at(rest)]
            };
            for ident in idents {
                if engine_files.contains(&ident) {
                    named.push(format!("{} names crate::tasks::{ident}", path.display()));
                }
            }
        }
    }
    assert!(seen_engine, "the scan found no path into the engine");
    assert!(
        named.is_empty(),
        "name the item tasks/mod.rs re-exports instead:\n{}",
        named.join("\n")
    );
}
