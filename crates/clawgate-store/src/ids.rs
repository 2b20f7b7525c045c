//! The one id generator: UUID v7 text, which sorts by creation time.

/// A fresh, time-ordered unique id.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}
