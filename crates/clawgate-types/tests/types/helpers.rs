//! Small helpers shared by the test modules.

use clawgate_types::{WireError, from_json, to_json};
use serde::{Serialize, de::DeserializeOwned};

/// Encodes with the crate's `to_json` and decodes the text back with `from_json`.
pub(crate) fn wire_round_trip<T: Serialize + DeserializeOwned>(value: &T) -> T {
    let text = to_json(value).unwrap();
    from_json(&text).unwrap()
}

/// The crate's encoding of a value, parsed back into a generic JSON tree.
pub(crate) fn wire_value<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::from_str(&to_json(value).unwrap()).unwrap()
}

/// Decodes `text` as `T`, expecting `WireError::Invalid`; returns its message.
pub(crate) fn expect_invalid<T: DeserializeOwned + std::fmt::Debug>(text: &str) -> String {
    match from_json::<T>(text) {
        Err(WireError::Invalid { message, .. }) => message,
        other => panic!("expected WireError::Invalid for {text:?}, got {other:?}"),
    }
}

/// Decodes `text` as `T`, expecting `WireError::Malformed`; returns its message.
pub(crate) fn expect_malformed<T: DeserializeOwned + std::fmt::Debug>(text: &str) -> String {
    match from_json::<T>(text) {
        Err(WireError::Malformed { message, .. }) => message,
        other => panic!("expected WireError::Malformed for {text:?}, got {other:?}"),
    }
}
