//! Tower middleware for [`syncguard`]: run requests that share a key one at a time across
//! every replica.
//!
//! This crate will hold `LockLayer`; it exports nothing yet. Inside a handler, use
//! [`syncguard::with_lock`] meanwhile.
