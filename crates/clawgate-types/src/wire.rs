//! Decoding and encoding of the JSON wire format with typed errors.

use serde::{Serialize, de::DeserializeOwned};

/// A wire payload could not be decoded (or, rarely, encoded).
///
/// Carries what was being decoded and serde's description, which names the field and the
/// offending value (for example an unknown enum variant), so callers can log an actionable line.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The text is not JSON at all, or is truncated.
    #[error("malformed JSON for {type_name} at line {line}, column {column}: {message}")]
    Malformed {
        /// The type being decoded.
        type_name: &'static str,
        /// Line of the error in the text.
        line: usize,
        /// Column of the error in the text.
        column: usize,
        /// serde's description of the error.
        message: String,
    },
    /// The JSON is well formed but does not match the shape (missing field, unknown variant…).
    #[error("invalid {type_name}: {message} (line {line}, column {column})")]
    Invalid {
        /// The type being decoded.
        type_name: &'static str,
        /// Line of the error in the text.
        line: usize,
        /// Column of the error in the text.
        column: usize,
        /// serde's description, naming the field and value.
        message: String,
    },
    /// A value could not be encoded: a map with non-string keys, or nesting deeper than
    /// [`MAX_JSON_DEPTH`] (text that could not be decoded again).
    #[error("cannot encode {type_name}: {message}")]
    Encode {
        /// The type being encoded.
        type_name: &'static str,
        /// serde's description of the error.
        message: String,
    },
}

fn short_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

fn classify<T>(error: serde_json::Error) -> WireError {
    let type_name = short_name::<T>();
    let (line, column, message) = (error.line(), error.column(), error.to_string());
    match error.classify() {
        serde_json::error::Category::Data => WireError::Invalid {
            type_name,
            line,
            column,
            message,
        },
        _ => WireError::Malformed {
            type_name,
            line,
            column,
            message,
        },
    }
}

/// Decodes a wire value from JSON text.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, WireError> {
    serde_json::from_str(text).map_err(classify::<T>)
}

/// Decodes a wire value from an already parsed JSON value.
pub fn from_json_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, WireError> {
    // A tree has no depth limit; text does. What decodes here is encoded later and must decode
    // from that text again, so a tree the text decoder would refuse is refused here too.
    if value_depth(&value) > MAX_JSON_DEPTH {
        return Err(WireError::Invalid {
            type_name: short_name::<T>(),
            line: 0,
            column: 0,
            message: too_deep(),
        });
    }
    serde_json::from_value(value).map_err(classify::<T>)
}

/// Encodes a wire value as compact JSON text.
pub fn to_json<T: Serialize>(value: &T) -> Result<String, WireError> {
    let text = serde_json::to_string(value).map_err(|e| WireError::Encode {
        type_name: short_name::<T>(),
        message: e.to_string(),
    })?;
    // Text nested deeper than `from_json` reads would be written and never read back.
    if text_depth(text.as_bytes()) > MAX_JSON_DEPTH {
        return Err(WireError::Encode {
            type_name: short_name::<T>(),
            message: too_deep(),
        });
    }
    Ok(text)
}

/// The deepest nesting of arrays and objects the wire carries: the most `from_json` reads
/// (serde_json's recursion limit), so everything `to_json` writes can be decoded again.
pub const MAX_JSON_DEPTH: usize = 127;

fn too_deep() -> String {
    format!("arrays and objects nested deeper than {MAX_JSON_DEPTH} levels")
}

/// The nesting of arrays and objects of a tree (a scalar is 0), without recursion.
fn value_depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((node, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match node {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// The nesting of arrays and objects of JSON text (brackets inside strings do not count).
fn text_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in text {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}
