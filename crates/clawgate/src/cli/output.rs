//! Printing: wire JSON or aligned tables, and a closed pipe ends quietly.

use std::io::Write as _;

use serde::Serialize;

use super::CliResult;

// ---------------------------------------------------------------------------------------------
// Output

/// `text` made harmless for a terminal: every control character (ESC, BEL, CR, line breaks,
/// DEL, the C1 set) is shown escaped (`\u{1b}`, `\r`, `\n`), so what a chat participant wrote
/// can neither move the cursor nor rewrite the operator's screen, and a line stays one line.
/// The JSON output is exact instead (its encoding escapes them).
pub(crate) fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|ch| {
            if ch.is_control() {
                ch.escape_default().collect::<String>()
            } else {
                ch.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Writes to stdout; a closed pipe (`| head`) ends quietly instead of panicking.
pub(crate) fn print(text: &str) -> CliResult<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other?),
    }
}

pub(crate) fn pretty(value: &impl Serialize) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

pub(crate) fn compact(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The wire spelling of a unit enum value (`unknown_after_send`).
pub(crate) fn wire(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

/// A view printed as its wire JSON or as a table.
pub(crate) trait Render: Serialize {
    fn table(&self) -> String;
}

pub(crate) fn emit(view: &impl Render, json: bool) -> CliResult<()> {
    if json {
        print(&format!("{}\n", pretty(view)))
    } else {
        print(&view.table())
    }
}

pub(crate) fn opt_time(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_owned(), fmt_time)
}

pub(crate) fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

pub(crate) fn more_note(more: bool) -> &'static str {
    if more {
        "… more match: raise --limit (at most 1000) or narrow the filter\n"
    } else {
        ""
    }
}

/// An aligned text table: columns padded to their widest cell, two spaces apart.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose first row is `header`.
    pub fn new(header: &[&str]) -> Table {
        let mut table = Table::default();
        table.row(header.iter().copied());
        table
    }

    /// A table without a header (key / value pairs).
    pub fn plain() -> Table {
        Table::default()
    }

    /// Adds a row; line breaks and tabs in cells become spaces (a row stays one line), and any
    /// other control character is shown escaped (as `terminal_safe` does): a cell cannot drive the
    /// terminal.
    pub fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let cells = cells
            .into_iter()
            .map(|c| {
                let spaced: String = c
                    .as_ref()
                    .chars()
                    .map(|ch| {
                        if matches!(ch, '\n' | '\r' | '\t') {
                            ' '
                        } else {
                            ch
                        }
                    })
                    .collect();
                terminal_safe(&spaced).into_owned()
            })
            .collect();
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (n, cell) in row.iter().enumerate() {
                widths[n] = widths[n].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (n, cell) in row.iter().enumerate() {
                if n > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let pad = widths[n] - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of milliseconds since the epoch.
pub fn fmt_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_keeps_rows_on_one_line() {
        let mut t = Table::new(&["ID", "STATUS", "TEXT"]);
        t.row(["a", "failed", "hello\nworld"]);
        t.row(["long-id", "unknown_after_send", ""]);
        assert_eq!(
            t.render(),
            "ID       STATUS              TEXT\n\
             a        failed              hello world\n\
             long-id  unknown_after_send\n"
        );
    }

    #[test]
    fn control_characters_are_shown_escaped_never_sent_to_the_terminal() {
        let hostile = "ok\u{1b}[2J\u{1b}]0;title\u{7}\rback\ttab\u{7f}\u{9b}31m";
        let safe = super::terminal_safe(hostile);
        assert!(!safe.chars().any(char::is_control), "{safe}");
        assert_eq!(
            safe,
            "ok\\u{1b}[2J\\u{1b}]0;title\\u{7}\\rback\\ttab\\u{7f}\\u{9b}31m"
        );
        assert_eq!(
            super::terminal_safe("plain text, ünïcode"),
            "plain text, ünïcode"
        );
        let mut t = Table::new(&["TEXT"]);
        t.row([hostile]);
        let rendered = t.render();
        assert_eq!(rendered.lines().count(), 2, "one line per row: {rendered}");
        assert_eq!(
            rendered.chars().filter(|c| c.is_control()).count(),
            2,
            "only the line ends: {rendered:?}"
        );
    }

    #[test]
    fn table_counts_characters_not_bytes() {
        let mut t = Table::plain();
        t.row(["héllo", "x"]);
        t.row(["ab", "y"]);
        assert_eq!(t.render(), "héllo  x\nab     y\n");
        assert_eq!(Table::plain().render(), "");
    }

    #[test]
    fn times_are_utc_civil_dates() {
        let cases = [
            (0, "1970-01-01 00:00:00"),
            (951_782_400_000, "2000-02-29 00:00:00"),
            (1_700_000_000_999, "2023-11-14 22:13:20"),
            (-1_000, "1969-12-31 23:59:59"),
        ];
        for (ms, text) in cases {
            assert_eq!(fmt_time(ms), text, "{ms}");
        }
    }
}
