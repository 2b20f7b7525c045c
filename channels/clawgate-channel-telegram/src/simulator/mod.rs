//! A Bot API server on loopback that behaves like Telegram's.
