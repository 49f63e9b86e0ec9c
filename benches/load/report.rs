//! The Markdown report.

use std::fmt::Write as _;

use super::harness::Stats;

pub(super) struct Report {
    pub(super) md: String,
}

pub(super) fn ms(us: f64) -> String {
    if us.is_nan() {
        "–".into()
    } else {
        format!("{:.3}", us / 1000.0)
    }
}

impl Report {
    pub(super) fn section(&mut self, title: &str, header: &[&str]) {
        let _ = write!(self.md, "\n### {title}\n\n| {} |\n|", header.join(" | "));
        for _ in header {
            self.md.push_str(" --- |");
        }
        self.md.push('\n');
        eprintln!("== {title}");
    }
    pub(super) fn row(&mut self, cells: &[String]) {
        let line = format!("| {} |\n", cells.join(" | "));
        eprint!("{line}");
        self.md.push_str(&line);
    }
    pub(super) fn note(&mut self, text: &str) {
        let _ = writeln!(self.md, "\n{text}");
        eprintln!("{text}");
    }
}

pub(super) fn err_note(s: &Stats) -> String {
    match (&s.first_error, s.errors + s.refused) {
        (Some(e), n) if n > 0 => format!(" (first: {})", e.replace('|', "/").replace('\n', " ")),
        _ => String::new(),
    }
}
