//! The backend-agnostic conformance suite on the shared 3-primary, 3-replica cluster.

syncguard::conformance_tests!(async { crate::cluster_backend().await });
