//! Entity parsing for `parse_mode` (`HTML`, `MarkdownV2`, legacy `Markdown`): far enough to
//! know the visible text (whose length the 4096/1024 limits count), the entities a client gets
//! back, and to refuse malformed markup as the server does (`can't parse entities: …`).
//! Offsets and lengths of entities are in UTF-16 code units, as the Bot API reports them.

use serde_json::{Value, json};

/// One MessageEntity.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entity {
    pub kind: &'static str,
    pub offset: usize,
    pub length: usize,
    pub url: Option<String>,
    pub language: Option<String>,
    pub custom_emoji_id: Option<String>,
}

impl Entity {
    fn new(kind: &'static str, offset: usize, length: usize) -> Self {
        Entity {
            kind,
            offset,
            length,
            url: None,
            language: None,
            custom_emoji_id: None,
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut value = json!({"type": self.kind, "offset": self.offset, "length": self.length});
        if let Some(url) = &self.url {
            value["url"] = json!(url);
        }
        if let Some(language) = &self.language {
            value["language"] = json!(language);
        }
        if let Some(id) = &self.custom_emoji_id {
            value["custom_emoji_id"] = json!(id);
        }
        value
    }
}

/// Visible text plus its entities.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Formatted {
    pub text: String,
    pub entities: Vec<Entity>,
}

impl Formatted {
    pub(crate) fn entities_json(&self) -> Option<Value> {
        (!self.entities.is_empty())
            .then(|| Value::Array(self.entities.iter().map(Entity::to_json).collect()))
    }

    fn push_char(&mut self, c: char) {
        self.text.push(c);
    }

    fn utf16_len(&self) -> usize {
        self.text.encode_utf16().count()
    }

    /// Leading and trailing whitespace is not part of a message; entities shift and shrink with it.
    fn trimmed(self) -> Formatted {
        let lead = &self.text[..self.text.len() - self.text.trim_start().len()];
        let lead16 = lead.encode_utf16().count();
        let text = self.text.trim().to_owned();
        let total16 = text.encode_utf16().count();
        let entities = self
            .entities
            .into_iter()
            .filter_map(|mut entity| {
                let start = entity.offset.saturating_sub(lead16);
                let end = (entity.offset + entity.length)
                    .saturating_sub(lead16)
                    .min(total16);
                (end > start).then(|| {
                    entity.offset = start;
                    entity.length = end - start;
                    entity
                })
            })
            .collect();
        Formatted { text, entities }
    }
}

/// Parses `text` under `parse_mode` (empty = plain text). `Err` holds the detail that follows
/// `can't parse entities: `.
pub(crate) fn parse(text: &str, parse_mode: &str) -> Result<Formatted, ParseModeError> {
    let formatted = match parse_mode.to_ascii_lowercase().as_str() {
        "" => Formatted {
            text: text.to_owned(),
            entities: Vec::new(),
        },
        "html" => parse_html(text).map_err(ParseModeError::Entities)?,
        "markdownv2" => parse_markdown_v2(text).map_err(ParseModeError::Entities)?,
        "markdown" => parse_markdown(text).map_err(ParseModeError::Entities)?,
        _ => return Err(ParseModeError::UnsupportedMode),
    };
    Ok(formatted.trimmed())
}

/// Why markup was refused.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ParseModeError {
    /// The detail of `can't parse entities: …`.
    Entities(String),
    /// `unsupported parse_mode`.
    UnsupportedMode,
}

struct Open {
    tag: String,
    entity: Entity,
}

fn parse_html(source: &str) -> Result<Formatted, String> {
    let bytes = source.as_bytes();
    let mut out = Formatted::default();
    let mut stack: Vec<Open> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'&' => {
                let (decoded, used) = decode_html_entity(&source[i..]);
                match decoded {
                    Some(c) => out.push_char(c),
                    None => out.push_char('&'),
                }
                i += used;
            }
            b'<' if bytes.get(i + 1) == Some(&b'/') => {
                let begin = i;
                let Some(close) = source[i..].find('>') else {
                    return Err(format!("Unclosed end tag at byte offset {begin}"));
                };
                let name = source[i + 2..i + close].trim().to_ascii_lowercase();
                i += close + 1;
                let Some(open) = stack.pop() else {
                    return Err(format!("Unexpected end tag at byte offset {begin}"));
                };
                if name != open.tag {
                    return Err(format!(
                        "Unmatched end tag at byte offset {begin}, expected \"</{}>\", found \"</{name}>\"",
                        open.tag
                    ));
                }
                let length = out.utf16_len() - open.entity.offset;
                if length > 0 && open.entity.kind != "none" {
                    let mut entity = open.entity;
                    entity.length = length;
                    // <pre><code class="language-x"> is one pre entity with a language.
                    if entity.kind == "code"
                        && let Some(pre) = stack.last_mut()
                        && pre.entity.kind == "pre"
                        && entity.language.is_some()
                    {
                        pre.entity.language = entity.language.take();
                        continue;
                    }
                    out.entities.push(entity);
                }
            }
            b'<' => {
                let begin = i;
                let rest = &source[i + 1..];
                let name_len = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .unwrap_or(rest.len());
                let name = rest[..name_len].to_ascii_lowercase();
                let Some(close) = find_tag_end(&rest[name_len..]) else {
                    return Err(format!("Unclosed start tag at byte offset {begin}"));
                };
                let attributes = parse_attributes(&rest[name_len..name_len + close]);
                i += 1 + name_len + close + 1;
                let offset = out.utf16_len();
                let attr = |key: &str| {
                    attributes
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.clone())
                };
                let mut entity = match name.as_str() {
                    "b" | "strong" => Entity::new("bold", offset, 0),
                    "i" | "em" => Entity::new("italic", offset, 0),
                    "u" | "ins" => Entity::new("underline", offset, 0),
                    "s" | "strike" | "del" => Entity::new("strikethrough", offset, 0),
                    "tg-spoiler" => Entity::new("spoiler", offset, 0),
                    "span" if attr("class").as_deref() == Some("tg-spoiler") => {
                        Entity::new("spoiler", offset, 0)
                    }
                    "a" => match attr("href") {
                        Some(url) if !url.is_empty() => {
                            let mut entity = Entity::new("text_link", offset, 0);
                            entity.url = Some(url);
                            entity
                        }
                        _ => Entity::new("none", offset, 0),
                    },
                    "code" => {
                        let mut entity = Entity::new("code", offset, 0);
                        entity.language = attr("class")
                            .and_then(|class| class.strip_prefix("language-").map(str::to_owned));
                        entity
                    }
                    "pre" => Entity::new("pre", offset, 0),
                    "blockquote" => {
                        let expandable = attributes.iter().any(|(k, _)| k == "expandable");
                        Entity::new(
                            if expandable {
                                "expandable_blockquote"
                            } else {
                                "blockquote"
                            },
                            offset,
                            0,
                        )
                    }
                    "tg-emoji" => {
                        let mut entity = Entity::new("custom_emoji", offset, 0);
                        entity.custom_emoji_id = attr("emoji-id");
                        entity
                    }
                    _ => {
                        return Err(format!(
                            "Unsupported start tag \"{name}\" at byte offset {begin}"
                        ));
                    }
                };
                entity.offset = offset;
                stack.push(Open { tag: name, entity });
            }
            _ => {
                let c = source[i..].chars().next().expect("i is a char boundary");
                out.push_char(c);
                i += c.len_utf8();
            }
        }
    }
    if let Some(open) = stack.pop() {
        return Err(format!(
            "Can't find end tag corresponding to start tag \"{}\"",
            open.tag
        ));
    }
    out.entities
        .sort_by_key(|e| (e.offset, std::cmp::Reverse(e.length)));
    Ok(out)
}

/// The `>` closing a start tag, skipping quoted attribute values.
fn find_tag_end(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    for (index, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '>') => return Some(index),
            _ => {}
        }
    }
    None
}

fn parse_attributes(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let name_len = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let name = rest[..name_len].to_ascii_lowercase();
        rest = rest[name_len..].trim_start();
        let mut value = String::new();
        if let Some(after) = rest.strip_prefix('=') {
            let after = after.trim_start();
            if let Some(q) = after.chars().next().filter(|c| *c == '"' || *c == '\'') {
                let body = &after[1..];
                let end = body.find(q).unwrap_or(body.len());
                value = decode_html_text(&body[..end]);
                rest = body.get(end + 1..).unwrap_or("");
            } else {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                value = decode_html_text(&after[..end]);
                rest = &after[end..];
            }
        }
        if !name.is_empty() {
            out.push((name, value));
        }
        rest = rest.trim_start();
    }
    out
}

fn decode_html_text(s: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < s.len() {
        if s.as_bytes()[i] == b'&' {
            let (decoded, used) = decode_html_entity(&s[i..]);
            out.push(decoded.unwrap_or('&'));
            i += used;
        } else {
            let c = s[i..].chars().next().expect("char boundary");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `&lt;` `&gt;` `&amp;` `&quot;` and numeric references; anything else stays a literal `&`
/// (returns `None` and consumes one byte).
fn decode_html_entity(s: &str) -> (Option<char>, usize) {
    let Some(end) = s[1..].find(';').map(|e| e + 1).filter(|e| *e <= 12) else {
        return (None, 1);
    };
    let name = &s[1..end];
    let decoded = match name {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        _ => {
            if let Some(hex) = name.strip_prefix("#x").or_else(|| name.strip_prefix("#X")) {
                u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)
            } else if let Some(dec) = name.strip_prefix('#') {
                dec.parse::<u32>().ok().and_then(char::from_u32)
            } else {
                None
            }
        }
    };
    match decoded {
        Some(c) => (Some(c), end + 1),
        None => (None, 1),
    }
}

const MARKDOWN_V2_RESERVED: &str = "_*[]()~`>#+-=|{}.!";

fn parse_markdown_v2(source: &str) -> Result<Formatted, String> {
    let chars: Vec<(usize, char)> = source.char_indices().collect();
    let mut out = Formatted::default();
    // (marker, byte offset of the opening marker, entity)
    let mut stack: Vec<(&'static str, usize, Entity)> = Vec::new();
    let mut quote: Option<Entity> = None;
    let mut i = 0;
    let at_line_start = |i: usize| i == 0 || chars[i - 1].1 == '\n';
    while i < chars.len() {
        let (byte, c) = chars[i];
        if at_line_start(i) {
            if c == '>' {
                if quote.is_none() {
                    quote = Some(Entity::new("blockquote", out.utf16_len(), 0));
                }
                i += 1;
                continue;
            } else if let Some(mut entity) = quote.take() {
                // The quote ended with the previous line (its newline is not quoted).
                let end = out.utf16_len().saturating_sub(1);
                entity.length = end.saturating_sub(entity.offset);
                if entity.length > 0 {
                    out.entities.push(entity);
                }
            }
        }
        if c == '\\' {
            if let Some(&(_, next)) = chars.get(i + 1)
                && (next as u32) > 0
                && (next as u32) <= 126
            {
                out.push_char(next);
                i += 2;
                continue;
            }
            out.push_char(c);
            i += 1;
            continue;
        }
        if !MARKDOWN_V2_RESERVED.contains(c) {
            out.push_char(c);
            i += 1;
            continue;
        }
        let next = chars.get(i + 1).map(|(_, c)| *c);
        let top = stack.last().map(|(marker, _, _)| *marker);
        match c {
            '`' => {
                let is_pre = next == Some('`') && chars.get(i + 2).map(|(_, c)| *c) == Some('`');
                let marker_len = if is_pre { 3 } else { 1 };
                let mut j = i + marker_len;
                let mut language = None;
                if is_pre {
                    let line_end = chars[j..]
                        .iter()
                        .position(|(_, c)| *c == '\n' || *c == '`')
                        .map(|p| p + j);
                    if let Some(end) = line_end
                        && chars[end].1 == '\n'
                    {
                        let lang: String = chars[j..end].iter().map(|(_, c)| *c).collect();
                        if !lang.is_empty() {
                            language = Some(lang);
                        }
                        j = end + 1;
                    }
                }
                let offset = out.utf16_len();
                let mut closed = false;
                while j < chars.len() {
                    let cj = chars[j].1;
                    if cj == '\\'
                        && let Some(&(_, escaped)) = chars.get(j + 1)
                        && (escaped == '`' || escaped == '\\')
                    {
                        out.push_char(escaped);
                        j += 2;
                        continue;
                    }
                    if cj == '`'
                        && (!is_pre
                            || (chars.get(j + 1).map(|(_, c)| *c) == Some('`')
                                && chars.get(j + 2).map(|(_, c)| *c) == Some('`')))
                    {
                        closed = true;
                        j += marker_len;
                        break;
                    }
                    out.push_char(cj);
                    j += 1;
                }
                if !closed {
                    let name = if is_pre { "Pre" } else { "Code" };
                    return Err(format!(
                        "Can't find end of {name} entity at byte offset {byte}"
                    ));
                }
                let length = out.utf16_len() - offset;
                if length > 0 {
                    let mut entity =
                        Entity::new(if is_pre { "pre" } else { "code" }, offset, length);
                    entity.language = language;
                    out.entities.push(entity);
                }
                i = j;
                continue;
            }
            '*' | '~' => {
                let (marker, kind) = if c == '*' {
                    ("*", "bold")
                } else {
                    ("~", "strikethrough")
                };
                toggle(&mut stack, &mut out, marker, kind, byte);
                i += 1;
            }
            '|' if next == Some('|') => {
                toggle(&mut stack, &mut out, "||", "spoiler", byte);
                i += 2;
            }
            '_' => {
                if top == Some("__") && next == Some('_') {
                    toggle(&mut stack, &mut out, "__", "underline", byte);
                    i += 2;
                } else if top == Some("_") {
                    toggle(&mut stack, &mut out, "_", "italic", byte);
                    i += 1;
                } else if next == Some('_') {
                    toggle(&mut stack, &mut out, "__", "underline", byte);
                    i += 2;
                } else {
                    toggle(&mut stack, &mut out, "_", "italic", byte);
                    i += 1;
                }
            }
            '[' => {
                stack.push(("[", byte, Entity::new("text_link", out.utf16_len(), 0)));
                i += 1;
            }
            '!' if next == Some('[') => {
                stack.push(("![", byte, Entity::new("custom_emoji", out.utf16_len(), 0)));
                i += 2;
            }
            ']' if matches!(top, Some("[") | Some("![")) => {
                let (marker, _, mut entity) = stack.pop().expect("top exists");
                i += 1;
                let mut url = String::new();
                if chars.get(i).map(|(_, c)| *c) == Some('(') {
                    i += 1;
                    let mut closed = false;
                    while i < chars.len() {
                        let ci = chars[i].1;
                        if ci == '\\'
                            && let Some(&(_, escaped)) = chars.get(i + 1)
                        {
                            url.push(escaped);
                            i += 2;
                            continue;
                        }
                        i += 1;
                        if ci == ')' {
                            closed = true;
                            break;
                        }
                        url.push(ci);
                    }
                    if !closed {
                        return Err(format!("Can't find end of a url at byte offset {byte}"));
                    }
                }
                entity.length = out.utf16_len() - entity.offset;
                if marker == "![" {
                    entity.custom_emoji_id = url
                        .strip_prefix("tg://emoji?id=")
                        .map(str::to_owned)
                        .or(Some(url));
                } else if url.is_empty() {
                    continue;
                } else {
                    entity.url = Some(url);
                }
                if entity.length > 0 {
                    out.entities.push(entity);
                }
            }
            _ => {
                return Err(format!(
                    "Character '{c}' is reserved and must be escaped with the preceding '\\'"
                ));
            }
        }
    }
    if let Some(mut entity) = quote.take() {
        entity.length = out.utf16_len() - entity.offset;
        if entity.length > 0 {
            out.entities.push(entity);
        }
    }
    if let Some((marker, byte, _)) = stack.pop() {
        let name = match marker {
            "*" => "Bold",
            "_" => "Italic",
            "__" => "Underline",
            "~" => "Strikethrough",
            "||" => "Spoiler",
            "![" => "CustomEmoji",
            _ => "TextUrl",
        };
        return Err(format!(
            "Can't find end of {name} entity at byte offset {byte}"
        ));
    }
    out.entities
        .sort_by_key(|e| (e.offset, std::cmp::Reverse(e.length)));
    Ok(out)
}

fn toggle(
    stack: &mut Vec<(&'static str, usize, Entity)>,
    out: &mut Formatted,
    marker: &'static str,
    kind: &'static str,
    byte: usize,
) {
    if let Some(position) = stack.iter().rposition(|(m, _, _)| *m == marker) {
        let (_, _, mut entity) = stack.remove(position);
        entity.length = out.utf16_len() - entity.offset;
        if entity.length > 0 {
            out.entities.push(entity);
        }
    } else {
        stack.push((marker, byte, Entity::new(kind, out.utf16_len(), 0)));
    }
}

/// Legacy Markdown: `*bold*`, `_italic_`, `` `code` ``, ```` ```pre``` ````, `[text](url)`; no
/// nesting, and an entity that never ends is refused.
fn parse_markdown(source: &str) -> Result<Formatted, String> {
    let chars: Vec<(usize, char)> = source.char_indices().collect();
    let mut out = Formatted::default();
    let mut i = 0;
    while i < chars.len() {
        let (byte, c) = chars[i];
        let next = chars.get(i + 1).map(|(_, c)| *c);
        if c == '\\' && matches!(next, Some('_' | '*' | '`' | '[')) {
            out.push_char(next.expect("matched"));
            i += 2;
            continue;
        }
        let (end_marker, kind): (&str, &'static str) = match c {
            '*' => ("*", "bold"),
            '_' => ("_", "italic"),
            '[' => ("]", "text_link"),
            '`' if next == Some('`') && chars.get(i + 2).map(|(_, c)| *c) == Some('`') => {
                ("```", "pre")
            }
            '`' => ("`", "code"),
            _ => {
                out.push_char(c);
                i += 1;
                continue;
            }
        };
        let start = i + if kind == "pre" { 3 } else { 1 };
        let body: String = chars[start..].iter().map(|(_, c)| *c).collect();
        let Some(end) = body.find(end_marker) else {
            return Err(format!(
                "Can't find end of the entity starting at byte offset {byte}"
            ));
        };
        let mut content = body[..end].to_owned();
        let mut consumed = content.chars().count() + end_marker.chars().count();
        let mut entity_kind = kind;
        let mut url = None;
        let mut language = None;
        if kind == "text_link" {
            let after = &body[end + 1..];
            if let Some(rest) = after.strip_prefix('(')
                && let Some(close) = rest.find(')')
            {
                url = Some(rest[..close].to_owned());
                consumed += rest[..close].chars().count() + 2;
            } else {
                entity_kind = "none";
            }
        }
        if kind == "pre"
            && let Some(newline) = content.find('\n')
            && !content[..newline].contains(char::is_whitespace)
            && newline > 0
        {
            language = Some(content[..newline].to_owned());
            content = content[newline + 1..].to_owned();
        }
        let offset = out.utf16_len();
        for ch in content.chars() {
            out.push_char(ch);
        }
        let length = out.utf16_len() - offset;
        if length > 0 && entity_kind != "none" {
            let mut entity = Entity::new(entity_kind, offset, length);
            entity.url = url;
            entity.language = language;
            out.entities.push(entity);
        }
        i = start + consumed;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (case name, source, visible text, entities as (type, offset, length)).
    type Case<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, usize, usize)]);

    fn ok(text: &str, mode: &str) -> Formatted {
        parse(text, mode).unwrap_or_else(|e| panic!("{text:?} under {mode}: {e:?}"))
    }

    #[test]
    fn html_visible_text_and_entities() {
        let cases: &[Case<'_>] = &[
            ("bold", "<b>hi</b> there", "hi there", &[("bold", 0, 2)]),
            ("escapes", "a &lt;b&gt; &amp; &#65;", "a <b> & A", &[]),
            ("unknown entity kept", "a &nope; b", "a &nope; b", &[]),
            (
                "link",
                "<a href=\"https://x.y\">x</a>",
                "x",
                &[("text_link", 0, 1)],
            ),
            ("utf16 offsets", "😀<i>é</i>", "😀é", &[("italic", 2, 1)]),
            ("trimmed", "  <b> x</b>  ", "x", &[("bold", 0, 1)]),
            (
                "pre with language",
                "<pre><code class=\"language-rust\">fn</code></pre>",
                "fn",
                &[("pre", 0, 2)],
            ),
        ];
        for (name, source, text, entities) in cases {
            let formatted = ok(source, "HTML");
            assert_eq!(formatted.text, *text, "{name}");
            let got: Vec<(&str, usize, usize)> = formatted
                .entities
                .iter()
                .map(|e| (e.kind, e.offset, e.length))
                .collect();
            assert_eq!(got, entities.to_vec(), "{name}");
        }
    }

    #[test]
    fn malformed_markup_is_refused() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "html unclosed",
                "<b>x",
                "HTML",
                "Can't find end tag corresponding to start tag \"b\"",
            ),
            (
                "html unknown tag",
                "a <foo>x</foo>",
                "HTML",
                "Unsupported start tag \"foo\" at byte offset 2",
            ),
            (
                "html mismatch",
                "<b><i>x</b></i>",
                "HTML",
                "Unmatched end tag at byte offset 7, expected \"</i>\", found \"</b>\"",
            ),
            (
                "html stray end",
                "x</b>",
                "HTML",
                "Unexpected end tag at byte offset 1",
            ),
            (
                "v2 reserved",
                "Hello.",
                "MarkdownV2",
                "Character '.' is reserved and must be escaped with the preceding '\\'",
            ),
            (
                "v2 unclosed bold",
                "*x",
                "MarkdownV2",
                "Can't find end of Bold entity at byte offset 0",
            ),
            (
                "legacy unclosed",
                "a _b",
                "Markdown",
                "Can't find end of the entity starting at byte offset 2",
            ),
        ];
        for (name, source, mode, detail) in cases {
            assert_eq!(
                parse(source, mode),
                Err(ParseModeError::Entities((*detail).to_owned())),
                "{name}"
            );
        }
    }

    #[test]
    fn markdown_v2_entities() {
        let formatted = ok(
            "*b* _i_ __u__ ~s~ ||p|| `c` [l](http://a\\)b) 1\\.",
            "MarkdownV2",
        );
        assert_eq!(formatted.text, "b i u s p c l 1.");
        let kinds: Vec<&str> = formatted.entities.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                "bold",
                "italic",
                "underline",
                "strikethrough",
                "spoiler",
                "code",
                "text_link"
            ]
        );
        assert_eq!(formatted.entities[6].url.as_deref(), Some("http://a)b"));
    }

    #[test]
    fn markdown_v2_blocks_and_nesting() {
        let cases: &[Case<'_>] = &[
            (
                "pre with language",
                "```rust\nfn main() {}\n```",
                "fn main() {}",
                &[("pre", 0, 12)],
            ),
            (
                "blockquote lines",
                ">quoted\n>more\nplain",
                "quoted\nmore\nplain",
                &[("blockquote", 0, 11)],
            ),
            (
                "nested",
                "*bold _both_*",
                "bold both",
                &[("bold", 0, 9), ("italic", 5, 4)],
            ),
            (
                "custom emoji",
                "![👍](tg://emoji?id=5368324170671202286)",
                "👍",
                &[("custom_emoji", 0, 2)],
            ),
        ];
        for (name, source, text, entities) in cases {
            let formatted = ok(source, "MarkdownV2");
            assert_eq!(formatted.text, *text, "{name}");
            let got: Vec<(&str, usize, usize)> = formatted
                .entities
                .iter()
                .map(|e| (e.kind, e.offset, e.length))
                .collect();
            assert_eq!(got, entities.to_vec(), "{name}");
        }
        let pre = ok("```rust\nx\n```", "MarkdownV2");
        assert_eq!(pre.entities[0].language.as_deref(), Some("rust"));
        let emoji = ok("![👍](tg://emoji?id=42)", "MarkdownV2");
        assert_eq!(emoji.entities[0].custom_emoji_id.as_deref(), Some("42"));
    }

    #[test]
    fn html_blocks_and_spoilers() {
        let formatted = ok(
            "<blockquote expandable>q</blockquote><span class=\"tg-spoiler\">s</span><tg-spoiler>t</tg-spoiler>",
            "HTML",
        );
        let got: Vec<(&str, usize, usize)> = formatted
            .entities
            .iter()
            .map(|e| (e.kind, e.offset, e.length))
            .collect();
        assert_eq!(
            got,
            [
                ("expandable_blockquote", 0, 1),
                ("spoiler", 1, 1),
                ("spoiler", 2, 1)
            ]
        );
        assert_eq!(
            parse("<span class=\"x\">a</span>", "HTML"),
            Err(ParseModeError::Entities(
                "Unsupported start tag \"span\" at byte offset 0".to_owned()
            ))
        );
    }

    #[test]
    fn legacy_markdown_entities() {
        let formatted = ok("*b* _i_ [l](http://x) `c`", "Markdown");
        assert_eq!(formatted.text, "b i l c");
        assert_eq!(formatted.entities.len(), 4);
        assert_eq!(parse("x", "Textile"), Err(ParseModeError::UnsupportedMode));
    }
}
