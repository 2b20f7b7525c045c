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
    /// A value could not be encoded (only possible for maps with non-string keys).
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
    serde_json::from_value(value).map_err(classify::<T>)
}

/// Encodes a wire value as compact JSON text.
pub fn to_json<T: Serialize>(value: &T) -> Result<String, WireError> {
    serde_json::to_string(value).map_err(|e| WireError::Encode {
        type_name: short_name::<T>(),
        message: e.to_string(),
    })
}
