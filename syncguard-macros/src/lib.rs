//! Procedural macros for [`syncguard`](https://docs.rs/syncguard).
//!
//! This crate will hold the `#[locked]` attribute, re-exported as `syncguard::locked`; it
//! exports nothing yet. Use `syncguard::with_lock` meanwhile.
