//! Replays of fuzzer inputs: every committed corpus file of every target (so a corpus
//! input that once found a defect keeps being checked by `cargo test`). A crash input
//! the fuzzers find gets its own test here, next to its fix (none so far; the one
//! defect found, by the SSE chunking property, is tested in `upstream/sse.rs`).

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 5] = [
    ("wire", super::wire::fuzz),
    ("sse", super::sse::fuzz),
    ("line_framing", super::framing::fuzz),
    ("jwt", super::auth::fuzz),
    ("config", super::config::fuzz),
];

#[test]
fn committed_corpora_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut replayed = 0;
    for (name, fuzz) in TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        for entry in dir {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            fuzz(&data);
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} corpus inputs");
}
