//! End-to-end tests across the syncguard crates live in `tests/`. This library holds no code:
//! it compiles and runs the Rust blocks of the README as doctests, so that what a new user
//! copies first builds against the code as it is. (`syncguard-server/README.md` shows no Rust.)

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct Readme;
