//! The cross-check with aiogram 3.
