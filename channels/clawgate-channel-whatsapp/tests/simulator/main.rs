//! The Cloud API simulator on its own.
