//! Documentation that cannot drift from the code it describes. Read from the source
//! text, like tests/layering.rs:
//!
//! - every `§N "title"` reference (in any tracked `.rs`, `.md`, `.sh` or `.py` file)
//!   names a section of docs/design.md that exists, and the title is that section's
//!   heading, one of its `###` subheadings or one of its bold paragraph leads
//!   (`**Fail closed.**`); a title may wrap across comment lines;
//! - every repository path named in ARCHITECTURE.md, docs/design.md, README.md, the
//!   other Markdown files or a comment of a `.rs` file exists (or is a generated file
//!   .gitignore names);
//! - every process-global `static` with interior state outside test code is named in
//!   ARCHITECTURE.md "Owned state".

use std::collections::BTreeMap;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Files under `dir` (relative to the crate root) ending in one of `exts`.
fn files(dir: &str, exts: &[&str], out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = format!("{dir}/{name}");
        if e.path().is_dir() {
            // Installed peers, fixtures' data and build output are not ours to check.
            if !matches!(name.as_str(), "target" | "node_modules" | ".peers") {
                files(&rel, exts, out);
            }
        } else if exts.iter().any(|x| name.ends_with(x)) {
            out.push(rel);
        }
    }
}

fn sources() -> Vec<String> {
    let mut out = vec![
        "ARCHITECTURE.md".to_string(),
        "README.md".to_string(),
        "docs/design.md".to_string(),
    ];
    for d in ["src", "tests", "benches", "scripts", "docs"] {
        files(d, &[".rs", ".md", ".sh", ".py"], &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// Line comments' markers and the whitespace around them folded into single spaces, so
/// a title or a path wrapped across comment lines reads as one.
fn unwrapped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let t = line.trim_start();
        let t = ["//!", "///", "//", "#"]
            .iter()
            .find_map(|m| t.strip_prefix(m))
            .unwrap_or(t);
        out.push_str(t.trim());
        out.push(' ');
    }
    out
}

/// docs/design.md's numbered sections and the titles each may be cited by.
fn design_sections() -> BTreeMap<u32, Vec<String>> {
    let mut secs: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut cur: Option<u32> = None;
    for line in read("docs/design.md").lines() {
        if let Some(h) = line.strip_prefix("## ") {
            cur = h.split_once(". ").and_then(|(n, title)| {
                let n: u32 = n.parse().ok()?;
                secs.entry(n).or_default().push(title.trim().to_string());
                Some(n)
            });
            continue;
        }
        let Some(n) = cur else { continue };
        if let Some(h) = line.trim_start_matches('#').strip_prefix(' ')
            && line.starts_with("###")
        {
            secs.entry(n).or_default().push(h.trim().to_string());
        }
        // Bold leads: `**Title.**`, `**Title**:` at the start of a paragraph or item.
        let t = line.trim_start().trim_start_matches("- ");
        if let Some(rest) = t.strip_prefix("**")
            && let Some((lead, _)) = rest.split_once("**")
        {
            secs.entry(n)
                .or_default()
                .push(lead.trim_end_matches(['.', ':']).to_string());
        }
    }
    secs
}

/// `(N, Some(title))` for each `§N "title"`, `(N, None)` for each bare
/// `docs/design.md §N`.
fn section_refs(text: &str) -> Vec<(u32, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('§') {
        let before = &rest[..i];
        rest = &rest[i + '§'.len_utf8()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(n) = digits.parse::<u32>() else {
            continue;
        };
        let after = &rest[digits.len()..];
        if let Some(t) = after.strip_prefix(" \"")
            && let Some((title, _)) = t.split_once('"')
        {
            out.push((
                n,
                Some(title.split_whitespace().collect::<Vec<_>>().join(" ")),
            ));
        } else if before.trim_end().ends_with("design.md") {
            out.push((n, None));
        }
    }
    out
}

#[test]
fn every_design_section_reference_names_a_heading_that_exists() {
    let secs = design_sections();
    assert!(secs.len() > 20, "docs/design.md's sections were not found");
    let mut bad = Vec::new();
    for f in sources() {
        for (n, title) in section_refs(&unwrapped(&read(&f))) {
            match (secs.get(&n), &title) {
                (None, _) => bad.push(format!("{f}: §{n} does not exist")),
                (Some(titles), Some(t)) if !titles.contains(t) => bad.push(format!(
                    "{f}: §{n} \"{t}\" is none of the section's titles {titles:?}"
                )),
                _ => {}
            }
        }
    }
    assert!(bad.is_empty(), "drifted references:\n{}", bad.join("\n"));
}

/// Repository paths in `text`: words starting with one of the tracked top-level
/// directories, without glob or placeholder characters.
fn repo_paths(text: &str) -> Vec<String> {
    const ROOTS: [&str; 7] = [
        "src/",
        "tests/",
        "benches/",
        "scripts/",
        "docs/",
        ".ci/",
        "migrations/",
    ];
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for (i, _) in text.char_indices() {
        // A path starts at a word boundary.
        if i > 0 && is_path_char(bytes[i - 1] as char) {
            continue;
        }
        let Some(r) = ROOTS.iter().find(|r| text[i..].starts_with(*r)) else {
            continue;
        };
        let end = text[i..]
            .find(|c: char| !is_path_char(c))
            .map_or(text.len(), |e| i + e);
        let p = text[i..end].trim_end_matches(['.', '-']);
        let placeholder = text[end..].starts_with(['*', '{', '<']) || p.len() <= r.len();
        if !placeholder {
            out.push(p.to_string());
        }
    }
    out
}

#[test]
fn every_path_the_docs_name_exists() {
    let ignored: Vec<String> = read(".gitignore")
        .lines()
        .map(|l| l.trim_start_matches('/').to_string())
        .collect();
    let mut bad = Vec::new();
    for f in sources() {
        let text = read(&f);
        let prose = if f.ends_with(".md") {
            text
        } else if f.ends_with(".rs") {
            // Comments only: code builds paths of its own (temporary files, fixtures).
            text.lines()
                .map(str::trim_start)
                .filter(|l| l.starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            continue;
        };
        for p in repo_paths(&prose) {
            // Generated files (a benchmark report) are named before they exist.
            let generated = ignored.iter().any(|i| i == &p);
            if !generated && !root().join(&p).exists() {
                bad.push(format!("{f}: {p}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "paths that do not exist:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_process_global_is_named_in_architecture() {
    const INTERIOR: [&str; 7] = [
        "Mutex", "RwLock", "OnceLock", "LazyLock", "Atomic", "Cell", "OnceCell",
    ];
    let arch = read("ARCHITECTURE.md");
    let owned = arch
        .split_once("## Owned state")
        .and_then(|(_, rest)| rest.split("\n## ").next())
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no \"Owned state\" section"));
    let mut rs = Vec::new();
    files("src", &[".rs"], &mut rs);
    let mut bad = Vec::new();
    for f in rs {
        // Test-only code: the fuzzing harnesses and unit-test files.
        if f.starts_with("src/fuzzing/") || f.ends_with("tests.rs") {
            continue;
        }
        let text = read(&f);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // The test modules (`#[cfg(test)]`, or gated on a test feature as well): from
            // the first on, a file is test code.
            let test_attr = line.starts_with("#[cfg(test)]") || line.starts_with("#[cfg(all(test,");
            if test_attr && lines.get(i + 1).is_some_and(|l| l.contains("mod ")) {
                break;
            }
            let t = line.trim_start();
            let t = t
                .strip_prefix("pub(crate) ")
                .or(t.strip_prefix("pub "))
                .unwrap_or(t);
            let Some(decl) = t.strip_prefix("static ") else {
                continue;
            };
            let Some((name, ty)) = decl.split_once(':') else {
                continue;
            };
            let test_only = lines[i.saturating_sub(2)..i]
                .iter()
                .any(|l| l.contains("#[cfg(test)]"));
            if test_only || !INTERIOR.iter().any(|w| ty.contains(w)) {
                continue;
            }
            if !owned.contains(&format!("`{}`", name.trim())) {
                bad.push(format!("{}:{}: static {}", f, i + 1, name.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "process-global state not listed in ARCHITECTURE.md \"Owned state\":\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    // A checker that finds nothing passes everything: make sure each one parses.
    let refs = section_refs("docs/design.md §16 \"Fail closed\" and docs/design.md §3, §2 x");
    assert_eq!(refs, vec![(16, Some("Fail closed".to_string())), (3, None)]);
    let paths = repo_paths("see `src/store/sled/mod.rs`, src/<M>/ and benches/*.rs; tests/x.rs.");
    assert_eq!(paths, vec!["src/store/sled/mod.rs", "tests/x.rs"]);
    assert_eq!(
        unwrapped("//! §16 \"Fail\n//! closed\""),
        "§16 \"Fail closed\" "
    );
    let secs = design_sections();
    assert!(
        secs[&16].iter().any(|t| t == "Fail closed"),
        "{:?}",
        secs[&16]
    );
    assert!(
        secs[&12].iter().any(|t| t == "Order of checks"),
        "{:?}",
        secs[&12]
    );
}
