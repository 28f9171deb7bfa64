//! The one shape every bench reports in ([`BenchReport`] of [`Row`]s), and
//! its two renderings: a text table for the terminal and Markdown for
//! `BENCHMARKS.md`.

use std::fmt::Write as _;

/// One measured figure next to its same-run baseline.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    /// What was measured.
    pub label: String,
    /// Our figure (NaN: not measured; see the note).
    pub value: f64,
    /// Unit of `value` and `baseline`.
    pub unit: String,
    /// The baseline's figure for the same thing, measured in the same run.
    pub baseline: Option<f64>,
    /// The bench's ratio for this row (what it divides by what is the
    /// report's [`BenchReport::ratio`]).
    pub ratio: Option<f64>,
    /// Anything else the row says (throughput, a transcript check, why the
    /// baseline is absent).
    pub note: String,
}

impl Row {
    /// A row without a baseline.
    pub(crate) fn new(label: impl Into<String>, value: f64, unit: impl Into<String>) -> Self {
        Row {
            label: label.into(),
            value,
            unit: unit.into(),
            baseline: None,
            ratio: None,
            note: String::new(),
        }
    }

    /// With the baseline's figure.
    pub(crate) fn baseline(mut self, v: f64) -> Self {
        self.baseline = Some(v);
        self
    }

    /// With a ratio.
    pub(crate) fn ratio(mut self, r: f64) -> Self {
        self.ratio = Some(r);
        self
    }

    /// With a note.
    pub(crate) fn note(mut self, n: impl Into<String>) -> Self {
        self.note = n.into();
        self
    }
}

/// A peer environment a bench compares with that is not on this machine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MissingPeer {
    /// What it is ("Piper on onnxruntime (venv)").
    pub what: String,
    /// Where the bench looked.
    pub looked_at: String,
    /// The command that creates it.
    pub create: String,
}

/// What a bench run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BenchReport {
    /// First line: what ran, on what.
    pub title: String,
    /// Lines under the title (thread count, input, the machine's ceiling).
    pub context: Vec<String>,
    /// Header of the baseline column: what the baseline is.
    pub baseline: String,
    /// Header of the ratio column: what it divides by what.
    pub ratio: String,
    /// The figures.
    pub rows: Vec<Row>,
    /// Lines after the table (legend, transcripts, an op profile).
    pub notes: Vec<String>,
    /// Peer environments that were absent (their rows have no baseline).
    pub missing: Vec<MissingPeer>,
    /// The memory bandwidth ceiling measured in this run, GB/s (the ops
    /// bench's probe; `bench all` puts it in the machine section).
    pub bandwidth_gbs: Option<f64>,
}

impl BenchReport {
    /// A report with a title and the two column headers.
    pub(crate) fn new(
        title: impl Into<String>,
        baseline: impl Into<String>,
        ratio: impl Into<String>,
    ) -> Self {
        BenchReport {
            title: title.into(),
            baseline: baseline.into(),
            ratio: ratio.into(),
            ..Default::default()
        }
    }

    /// Record an absent peer: a note row for `label` saying so, with the
    /// command that creates it.
    pub(crate) fn peer_missing(&mut self, label: &str, peer: MissingPeer) {
        self.rows.push(Row::new(label, f64::NAN, "").note(format!(
            "baseline absent: {} not found at {}; create it with `{}`",
            peer.what, peer.looked_at, peer.create
        )));
        self.missing.push(peer);
    }

    /// The cells of every row, formatted (label, value, baseline, ratio, note).
    fn cells(&self) -> Vec<[String; 5]> {
        self.rows
            .iter()
            .map(|r| {
                let with_unit = |v: f64| {
                    if v.is_nan() {
                        "-".to_string()
                    } else if r.unit.is_empty() {
                        fmt_value(v)
                    } else {
                        format!("{} {}", fmt_value(v), r.unit)
                    }
                };
                [
                    r.label.clone(),
                    with_unit(r.value),
                    r.baseline.map_or_else(|| "-".into(), with_unit),
                    r.ratio
                        .filter(|x| x.is_finite())
                        .map_or_else(|| "-".into(), |x| format!("{x:.2}x")),
                    r.note.clone(),
                ]
            })
            .collect()
    }

    fn headers(&self) -> [String; 5] {
        let paren = |name: &str, what: &str| {
            if what.is_empty() {
                name.to_string()
            } else {
                format!("{name} ({what})")
            }
        };
        [
            "measured".into(),
            "ours".into(),
            paren("baseline", &self.baseline),
            paren("ratio", &self.ratio),
            "note".into(),
        ]
    }

    /// A text table: title, context, the rows (numbers right-aligned), notes.
    pub(crate) fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.title);
        for c in &self.context {
            let _ = writeln!(s, "{c}");
        }
        s.push('\n');
        let head = self.headers();
        let cells = self.cells();
        let mut width = head.clone().map(|h| h.chars().count());
        for row in &cells {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |s: &mut String, r: &[String; 5]| {
            let pad = |c: &str, w: usize| " ".repeat(w.saturating_sub(c.chars().count()));
            let mut l = format!("{}{}", r[0], pad(&r[0], width[0]));
            for (c, &w) in r[1..4].iter().zip(&width[1..4]) {
                let _ = write!(l, "  {}{c}", pad(c, w));
            }
            let _ = write!(l, "  {}", r[4]);
            let _ = writeln!(s, "{}", l.trim_end());
        };
        line(&mut s, &head);
        for r in &cells {
            line(&mut s, r);
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "{n}");
            }
        }
        s
    }

    /// The same as Markdown: context as a list, a table, notes as a list
    /// (multi-line notes, such as an op profile, as code blocks).
    pub(crate) fn render_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}\n", md_escape(&self.title));
        for c in &self.context {
            let _ = writeln!(s, "- {}", md_escape(c));
        }
        if !self.context.is_empty() {
            s.push('\n');
        }
        let head = self.headers();
        let _ = writeln!(
            s,
            "| {} |",
            head.iter()
                .map(|h| md_cell(h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        s.push_str("|---|--:|--:|--:|---|\n");
        for r in self.cells() {
            let _ = writeln!(
                s,
                "| {} |",
                r.iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                if n.contains('\n') {
                    let _ = writeln!(s, "```text\n{}\n```", n.trim_end());
                } else {
                    let _ = writeln!(s, "- {}", md_escape(n));
                }
            }
        }
        s
    }
}

/// A number with about four significant digits (no exponent).
pub(super) fn fmt_value(v: f64) -> String {
    let a = v.abs();
    let decimals = if a >= 1000.0 || a == 0.0 {
        0
    } else if a >= 100.0 {
        1
    } else if a >= 10.0 {
        2
    } else if a >= 1.0 {
        3
    } else {
        // 0.0123 -> 4 decimals: three significant digits below 1.
        (3 - a.log10().floor() as i32 - 1).clamp(3, 9) as usize
    };
    format!("{v:.decimals$}")
}

/// A table cell: pipes escaped, no line breaks.
fn md_cell(c: &str) -> String {
    c.replace('|', "\\|").replace('\n', " ")
}

/// Text outside a table: characters Markdown would read as markup, escaped.
fn md_escape(c: &str) -> String {
    let mut out = String::with_capacity(c.len());
    let mut in_code = false;
    for ch in c.chars() {
        if ch == '`' {
            in_code = !in_code;
        }
        if !in_code && matches!(ch, '*' | '_' | '<' | '>' | '[' | ']') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BenchReport {
        let mut r = BenchReport::new("demo bench", "candle", "candle / ours");
        r.context.push("2 threads".into());
        r.rows.push(
            Row::new("gemm 512", 1.5, "ms")
                .baseline(3.0)
                .ratio(2.0)
                .note("179.0 GFLOP/s"),
        );
        r.rows.push(Row::new("a | b", 12345.678, "msgs/s"));
        r.peer_missing(
            "vs onnxruntime",
            MissingPeer {
                what: "the Piper venv".into(),
                looked_at: "/x/piper-venv".into(),
                create: "scripts/peer_envs.sh piper".into(),
            },
        );
        r.notes.push("ratio = candle time / our time".into());
        r.notes.push("op profile:\nlinear 70%\nsilu 3%".into());
        r
    }

    #[test]
    fn numbers_keep_about_four_significant_digits() {
        assert_eq!(fmt_value(12345.678), "12346");
        assert_eq!(fmt_value(123.45), "123.5");
        assert_eq!(fmt_value(12.346), "12.35");
        assert_eq!(fmt_value(1.23456), "1.235");
        assert_eq!(fmt_value(0.123456), "0.123");
        assert_eq!(fmt_value(0.0123456), "0.0123");
        assert_eq!(fmt_value(0.0), "0");
        assert_eq!(fmt_value(-2.5), "-2.500");
    }

    #[test]
    fn the_text_table_aligns_columns_and_shows_ratios() {
        let t = sample().render_text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "demo bench");
        assert_eq!(lines[1], "2 threads");
        let head = lines[3];
        assert!(head.starts_with("measured"), "{t}");
        assert!(head.contains("baseline (candle)"), "{t}");
        assert!(head.contains("ratio (candle / ours)"), "{t}");
        let gemm = lines[4];
        assert!(gemm.starts_with("gemm 512"), "{t}");
        assert!(gemm.contains("1.500 ms"), "{t}");
        assert!(gemm.contains("3.000 ms"), "{t}");
        assert!(gemm.contains("2.00x"), "{t}");
        assert!(gemm.ends_with("179.0 GFLOP/s"), "{t}");
        // Right-aligned numbers: the value column ends at the same place.
        let end = |l: &str, cell: &str| l.find(cell).expect(cell) + cell.len();
        assert_eq!(end(gemm, "1.500 ms"), end(lines[5], "12346 msgs/s"), "{t}");
        assert_eq!(end(head, "ours"), end(gemm, "1.500 ms"), "{t}");
        // No baseline, no ratio: dashes.
        assert!(lines[5].contains(" - "), "{t}");
        let missing = lines[6];
        assert!(missing.contains("baseline absent"), "{t}");
        assert!(missing.contains("`scripts/peer_envs.sh piper`"), "{t}");
        assert!(t.contains("\nratio = candle time / our time\n"), "{t}");
        assert!(t.ends_with("silu 3%\n"), "{t}");
    }

    #[test]
    fn markdown_is_a_table_with_escaped_cells() {
        let m = sample().render_markdown();
        assert!(m.starts_with("demo bench\n\n- 2 threads\n\n"), "{m}");
        assert!(
            m.contains(
                "| measured | ours | baseline (candle) | ratio (candle / ours) | note |\n|---|--:|--:|--:|---|\n"
            ),
            "{m}"
        );
        assert!(
            m.contains("| gemm 512 | 1.500 ms | 3.000 ms | 2.00x | 179.0 GFLOP/s |\n"),
            "{m}"
        );
        assert!(m.contains("| a \\| b | 12346 msgs/s | - | - |  |\n"), "{m}");
        assert!(m.contains("- ratio = candle time / our time\n"), "{m}");
        assert!(
            m.contains("```text\nop profile:\nlinear 70%\nsilu 3%\n```\n"),
            "{m}"
        );
        // Every table line has the same number of columns.
        for l in m.lines().filter(|l| l.starts_with('|')) {
            let cols = l.replace("\\|", "").matches('|').count();
            assert_eq!(cols, 6, "{l}");
        }
    }

    #[test]
    fn markdown_escapes_markup_outside_code() {
        assert_eq!(md_escape("a_b `c_d` *e*"), "a\\_b `c_d` \\*e\\*");
    }
}
