//! The backend-agnostic conformance suite, once per connection mode, and in the cluster layout
//! on one server.

mod manager {
    syncguard::conformance_tests!(async { crate::manager_backend().await });
}

mod pool {
    syncguard::conformance_tests!(async { crate::pool_backend().await });
}

mod cluster_layout {
    syncguard::conformance_tests!(async { crate::cluster_layout_backend().await });
}
