//! The conformance suite and guard behaviour on the in-memory backend.

use syncguard::MemoryBackend;

syncguard::conformance_tests!(async { MemoryBackend::new() });
