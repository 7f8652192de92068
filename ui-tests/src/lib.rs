//! trybuild cases live in tests/.
