//! The backend-agnostic conformance suite, once per connection mode.

mod manager {
    syncguard::conformance_tests!(async { crate::manager_backend().await });
}

mod pool {
    syncguard::conformance_tests!(async { crate::pool_backend().await });
}
