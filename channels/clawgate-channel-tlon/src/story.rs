//! Tlon's message content, a "story": a list of verses, each `{"inline": [...]}` or
//! `{"block": {...}}`. Inlines are strings or one-key objects (`bold`, `italics`, `strike`,
//! `inline-code`, `code`, `blockquote`, `link`, `ship`, `break`, `tag`). This channel renders
//! plain text as one inline verse, a `{"break": null}` between lines, and reads any story back
//! as text (mentions as `~ship`, links as their text or URL, blocks as what they show).

use serde_json::{Value, json};

/// The story of `text`: one inline verse, lines separated by breaks.
pub fn from_text(text: &str) -> Value {
    let mut inlines = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            inlines.push(json!({ "break": null }));
        }
        if !line.is_empty() {
            inlines.push(Value::String(line.to_owned()));
        }
    }
    json!([{ "inline": inlines }])
}

/// The visible text of a story (`None` when it is not a story at all).
pub fn to_text(story: &Value) -> Option<String> {
    let verses = story.as_array()?;
    let mut out = String::new();
    for verse in verses {
        if let Some(inlines) = verse.get("inline").and_then(Value::as_array) {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            for inline in inlines {
                inline_text(inline, &mut out);
            }
        } else if let Some(block) = verse.get("block") {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            block_text(block, &mut out);
        } else {
            return None;
        }
    }
    Some(out)
}

/// The ships a story mentions (`{"ship": "~zod"}` inlines), anywhere in it.
pub fn mentions(story: &Value) -> Vec<String> {
    let mut found = Vec::new();
    collect_mentions(story, &mut found);
    found
}

fn collect_mentions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| collect_mentions(v, found)),
        Value::Object(map) => {
            if let Some(ship) = map.get("ship").and_then(Value::as_str) {
                found.push(crate::aura::ship(ship));
            }
            map.values().for_each(|v| collect_mentions(v, found));
        }
        _ => {}
    }
}

fn inline_text(inline: &Value, out: &mut String) {
    match inline {
        Value::String(s) => out.push_str(s),
        Value::Object(map) => {
            if map.contains_key("break") {
                out.push('\n');
            } else if let Some(ship) = map.get("ship").and_then(Value::as_str) {
                out.push_str(&crate::aura::ship(ship));
            } else if let Some(link) = map.get("link") {
                let content = link.get("content").and_then(Value::as_str);
                let href = link.get("href").and_then(Value::as_str);
                out.push_str(
                    content
                        .filter(|c| !c.is_empty())
                        .or(href)
                        .unwrap_or_default(),
                );
            } else if let Some(code) = map
                .get("inline-code")
                .or_else(|| map.get("code"))
                .or_else(|| map.get("tag"))
                .and_then(Value::as_str)
            {
                out.push_str(code);
            } else {
                // bold / italics / strike / blockquote: a list of inlines.
                for nested in map.values() {
                    match nested {
                        Value::Array(items) => items.iter().for_each(|i| inline_text(i, out)),
                        other => inline_text(other, out),
                    }
                }
            }
        }
        _ => {}
    }
}

fn block_text(block: &Value, out: &mut String) {
    if let Some(code) = block.get("code") {
        out.push_str(code.get("code").and_then(Value::as_str).unwrap_or_default());
    } else if let Some(header) = block.get("header") {
        for inline in header
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            inline_text(inline, out);
        }
    } else if let Some(image) = block.get("image") {
        out.push_str(image.get("src").and_then(Value::as_str).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_through_a_story() {
        for text in ["hello", "two\nlines", "trailing\n", "", "a\n\nb"] {
            let story = from_text(text);
            assert_eq!(to_text(&story).as_deref(), Some(text), "{story}");
        }
        assert_eq!(
            from_text("a\nb"),
            json!([{ "inline": ["a", { "break": null }, "b"] }])
        );
    }

    #[test]
    fn rich_stories_read_as_their_text_and_mentions() {
        let story = json!([
            { "inline": [{ "ship": "~zod" }, " hi ", { "bold": ["there"] },
                         { "link": { "href": "https://x.test", "content": "" } }] },
            { "block": { "code": { "code": "let x = 1;", "lang": "rust" } } }
        ]);
        assert_eq!(
            to_text(&story).as_deref(),
            Some("~zod hi therehttps://x.test\nlet x = 1;")
        );
        assert_eq!(mentions(&story), vec!["~zod".to_owned()]);
        assert_eq!(to_text(&json!({ "inline": [] })), None, "not a list");
        assert_eq!(to_text(&json!([{ "verse": 1 }])), None, "not a verse");
    }
}
