//! The text format: prints and parses a whole [`crate::Graph`].
