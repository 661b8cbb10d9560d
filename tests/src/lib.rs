//! End-to-end tests live in `tests/tests/`; they start the real `comas` binaries.
