//! End-to-end tests across the syncguard crates live in `tests/`; this library is empty.
