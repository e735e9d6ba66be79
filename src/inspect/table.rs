//! Aligned text tables and the number formats of the human report.

/// Column alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text starts at the column's left edge.
    Left,
    /// Text ends at the column's right edge (numbers).
    Right,
}

/// A table of text cells under a header.
#[derive(Clone, Debug)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

const GAP: usize = 2;
/// Left-aligned columns are never cut narrower than this when fitting a width.
const MIN_CUT: usize = 8;

fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` cut to `w` characters, with "~" marking the cut.
fn cut(s: &str, w: usize) -> String {
    if width(s) <= w {
        return s.to_string();
    }
    let mut out: String = s.chars().take(w.saturating_sub(1)).collect();
    out.push('~');
    out
}

impl Table {
    /// An empty table with these column headers and alignments.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            header: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row; missing cells are blank, extra cells are dropped.
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Render with columns two spaces apart. When the table is wider than `max_width`, the widest
    /// left-aligned (text) columns are cut first; numbers are never cut.
    pub fn render(&self, max_width: usize) -> String {
        let n = self.header.len();
        let mut widths: Vec<usize> = (0..n)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| width(&r[c]))
                    .chain([width(&self.header[c])])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let total = |w: &[usize]| w.iter().sum::<usize>() + GAP * w.len().saturating_sub(1);
        while total(&widths) > max_width {
            let Some(c) = (0..n)
                .filter(|&c| self.align[c] == Align::Left && widths[c] > MIN_CUT)
                .max_by_key(|&c| (widths[c], std::cmp::Reverse(c)))
            else {
                break;
            };
            let excess = total(&widths) - max_width;
            widths[c] = widths[c].saturating_sub(excess).max(MIN_CUT);
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            let mut s = String::new();
            for c in 0..n {
                let cell = cut(&cells[c], widths[c]);
                let pad = " ".repeat(widths[c] - width(&cell));
                if c > 0 {
                    s.push_str(&" ".repeat(GAP));
                }
                match self.align[c] {
                    Align::Left => {
                        s.push_str(&cell);
                        s.push_str(&pad);
                    }
                    Align::Right => {
                        s.push_str(&pad);
                        s.push_str(&cell);
                    }
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&self.header[..], &mut out);
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        line(&rule[..], &mut out);
        for r in &self.rows {
            line(&r[..], &mut out);
        }
        out
    }
}

/// Word-wrap `text` to `max_width` columns; every line starts with `indent` spaces except the first,
/// which starts with `first` (already written by the caller, counted in its width). Words longer
/// than a line (paths) are kept whole.
pub fn wrap(text: &str, max_width: usize, first: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut col = first;
    let mut line_empty = true;
    for word in text.split_whitespace() {
        let w = width(word);
        if !line_empty && col + 1 + w > max_width {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = indent;
            line_empty = true;
        }
        if !line_empty {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += w;
        line_empty = false;
    }
    out.push('\n');
    out
}

/// "1 case", "3 cases".
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A number with at most four decimals and no trailing zeros: 0.99, 10, 0.7031.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let s = format!("{v:.4}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// An intensity: plain for ordinary magnitudes, scientific for very large or small ones.
pub fn value(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e7).contains(&a) {
        format!("{v:.3e}")
    } else {
        num(v)
    }
}

/// Three spacings as "x x y x z" without spaces: 0.99x0.99x10.
pub fn spacing3(v: &[f64; 3]) -> String {
    format!("{}x{}x{}", num(v[0]), num(v[1]), num(v[2]))
}

/// A shape as 61x50x20.
pub fn shape3(v: &[usize; 3]) -> String {
    format!("{}x{}x{}", v[0], v[1], v[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_fit() {
        let mut t = Table::new(&[("name", Align::Left), ("n", Align::Right)]);
        t.row(vec!["a".into(), "10".into()]);
        t.row(vec!["bbb".into(), "2".into()]);
        assert_eq!(t.render(100), "name   n\n----  --\na     10\nbbb    2\n");
        let mut t = Table::new(&[("text", Align::Left), ("n", Align::Right)]);
        t.row(vec!["x".repeat(40), "1".into()]);
        let s = t.render(20);
        assert!(s.lines().all(|l| l.chars().count() <= 20), "{s}");
        assert!(s.contains('~'));
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(num(0.99), "0.99");
        assert_eq!(num(10.0), "10");
        assert_eq!(num(4.6000000000000005), "4.6");
        assert_eq!(num(-0.00001), "0");
        assert_eq!(value(1.5e9), "1.500e9");
        assert_eq!(spacing3(&[0.7, 0.7, 5.0]), "0.7x0.7x5");
    }

    #[test]
    fn wrapping_keeps_lines_short() {
        assert_eq!(wrap("aa bb cc dd", 8, 3, 2), "aa bb\n  cc dd\n");
        assert_eq!(wrap("x", 8, 0, 2), "x\n");
    }

    #[test]
    fn numbers_wider_than_the_page_do_not_break_the_cut() {
        // The text column can give only part of the excess: it stops at its minimum width.
        let mut t = Table::new(&[("case", Align::Left), ("bytes", Align::Right)]);
        t.row(vec!["a_long_case_name".into(), "9".repeat(40)]);
        let s = t.render(20);
        assert!(s.contains(&"9".repeat(40)), "numbers are never cut: {s}");
        assert!(s.contains("a_long_~"), "{s}");
    }
}
