//! No serde attribute in `src/` buffers a value through serde's internal `Content`:
//! `flatten`, internally tagged (`tag = …`), adjacently tagged (`content = …`) and
//! `untagged` enums do, and that buffering loses the number text `arbitrary_precision`
//! keeps (`1.10` arrives as `1.1`). The gateway passes client and upstream values
//! through byte for byte (docs/design.md, introduction: payload fidelity), and almost
//! every type of it can hold one, so none of these is used anywhere: a request's params
//! are picked by its method (`src/protocol/params.rs`), a relay's payload by its kind
//! column (`src/tasks/replica.rs`).
//!
//! Std only, read from the source text like tests/layering.rs.

use std::path::{Path, PathBuf};

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

/// The serde options that buffer through `Content`.
const BUFFERING: [&str; 4] = ["flatten", "untagged", "tag", "content"];

/// The buffering options named in the `serde(…)` attributes of `code`, with their
/// line numbers. Line comments are skipped; an attribute is read up to its closing
/// parenthesis, across lines.
fn buffering_options(code: &str) -> Vec<(usize, String)> {
    let mut text = String::new();
    let mut line_of = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        text.push_str(line);
        text.push('\n');
        line_of.extend(std::iter::repeat_n(n + 1, line.len() + 1));
    }
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("serde(") {
        let start = from + i;
        from = start + "serde(".len();
        // `serde(` as a whole word: not `de_serde(` or `with_serde(`.
        if text[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut depth = 1;
        let mut end = from;
        for (j, c) in text[from..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = from + j;
                break;
            }
        }
        for option in text[from..end].split(',') {
            let key = option.split('=').next().unwrap_or("").trim();
            if BUFFERING.contains(&key) {
                found.push((line_of.get(start).copied().unwrap_or(0), key.to_string()));
            }
        }
    }
    found
}

#[test]
fn no_serde_attribute_buffers_values() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 20, "no sources under {}", root.display());
    let mut bad = Vec::new();
    for f in files {
        let code = std::fs::read_to_string(&f).unwrap_or_default();
        for (line, option) in buffering_options(&code) {
            bad.push(format!("{}:{line}: serde({option})", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "serde options that lose number text:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_scanner_finds_each_option_and_ignores_comments() {
    let code = r#"
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
enum A { X }
#[serde(untagged)]
enum B { X }
struct C {
    #[serde(default, flatten)]
    rest: Map<String, Value>,
}
#[serde(
    tag = "t",
    content = "c"
)]
enum D { X }
// #[serde(flatten)]
#[serde(rename = "flatten", deny_unknown_fields)]
struct E;
fn f() { de_serde(flatten) }
"#;
    let found: Vec<(usize, &str)> = buffering_options(code)
        .iter()
        .map(|(l, o)| (*l, o.as_str()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(l, o)| {
            (
                l,
                BUFFERING.iter().find(|b| **b == o).copied().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![
            (3, "tag"),
            (5, "untagged"),
            (8, "flatten"),
            (11, "tag"),
            (11, "content"),
        ]
    );
}
