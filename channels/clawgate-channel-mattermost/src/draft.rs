//! The draft post's body: the reply so far, under its progress and tool lines grouped.
//!
//! A preview unit may carry `progress` (an array of labels, oldest first: "searching",
//! "tool: read_file"...) beside its `text`. Consecutive repeats collapse into one line with a
//! count, so a tool called ten times in a row is one line, and the lines are shown as a quote
//! block above the text. The final never carries them: finalizing in place replaces the whole
//! body with the final text.

use serde_json::Value;

/// The body of a draft post for `text` with `progress` lines (grouped).
pub fn render_draft(text: &str, progress: &[String]) -> String {
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for label in progress.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        match groups.last_mut() {
            Some((last, count)) if *last == label => *count += 1,
            _ => groups.push((label, 1)),
        }
    }
    let mut body = String::new();
    for (label, count) in &groups {
        body.push_str("> ");
        body.push_str(label);
        if *count > 1 {
            body.push_str(&format!(" ×{count}"));
        }
        body.push('\n');
    }
    if !groups.is_empty() && !text.is_empty() {
        body.push('\n');
    }
    body.push_str(text);
    body
}

/// The progress labels of a unit's payload.
pub(crate) fn progress_of(payload: &Value) -> Vec<String> {
    payload
        .get("progress")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().or_else(|| v.get("label")?.as_str()))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_tool_lines_collapse_and_sit_above_the_text() {
        let lines: Vec<String> = [
            "tool: search",
            "tool: search",
            "tool: read_file",
            "tool: search",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            render_draft("Half an answer", &lines),
            "> tool: search ×2\n> tool: read_file\n> tool: search\n\nHalf an answer"
        );
        assert_eq!(render_draft("plain", &[]), "plain");
        assert_eq!(render_draft("", &["thinking".into()]), "> thinking\n");
    }

    #[test]
    fn labels_come_as_strings_or_objects() {
        let payload = serde_json::json!({ "progress": ["a", { "label": "b" }, 3] });
        assert_eq!(progress_of(&payload), vec!["a".to_owned(), "b".to_owned()]);
    }
}
