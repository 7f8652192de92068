//! The cases are in `tests/ui/<topic>/{pass,fail}/`; `tests/ui.rs` runs them.
