//! `firestore` crate errors → [`LockError`], as the reference's Firestore specification maps
//! the gRPC status codes.

use firestore::errors::FirestoreError;

use crate::LockError;

/// Maps an error of the `firestore` crate, keeping it as the source.
pub(super) fn map_error(error: FirestoreError) -> LockError {
    let mapped = match &error {
        FirestoreError::DatabaseError(db) => classify_code(&db.public.code, &db.details),
        FirestoreError::NetworkError(network) => {
            LockError::service_unavailable(format!("cannot reach Firestore: {}", network.message))
        }
        FirestoreError::SystemError(system) => {
            // Raised while building the client, mostly when credentials cannot be found or used.
            LockError::auth_failed(format!(
                "Firestore client setup failed ({}): {}; check the Application Default \
                 Credentials (GOOGLE_APPLICATION_CREDENTIALS) or set FIRESTORE_EMULATOR_HOST \
                 for the emulator",
                system.public.code, system.message
            ))
        }
        FirestoreError::InvalidParametersError(invalid) => {
            LockError::invalid_argument(format!("Firestore rejected a parameter: {invalid}"))
        }
        FirestoreError::DataNotFoundError(not_found) => LockError::invalid_argument(format!(
            "Firestore found no such resource (is the project or database id right?): {}",
            not_found.data_detail_message
        )),
        FirestoreError::DataConflictError(conflict) => LockError::internal(format!(
            "unexpected Firestore conflict: {}",
            conflict.details
        )),
        FirestoreError::SerializeError(_) | FirestoreError::DeserializeError(_) => {
            LockError::internal(format!(
                "a Firestore lock or fence document does not have the expected shape: {error}"
            ))
        }
        FirestoreError::ErrorInTransaction(_) | FirestoreError::CacheError(_) => {
            LockError::internal(format!("unexpected Firestore error: {error}"))
        }
    };
    mapped.with_source(error)
}

/// Whether Firestore aborted the transaction because of a conflicting one.
pub(super) fn is_aborted(error: &FirestoreError) -> bool {
    matches!(error, FirestoreError::DatabaseError(db) if db.public.code == "Aborted")
}

/// Whether a commit failed because a document changed since it was read: a failed
/// precondition (update time, or existence), or an aborted transaction.
pub(super) fn is_conflict(error: &FirestoreError) -> bool {
    match error {
        FirestoreError::DatabaseError(db) => {
            matches!(db.public.code.as_str(), "Aborted" | "FailedPrecondition")
        }
        FirestoreError::DataConflictError(_) | FirestoreError::DataNotFoundError(_) => true,
        _ => false,
    }
}

/// Classifies a gRPC status code as the `firestore` crate spells it (`tonic::Code`'s `Debug`),
/// or one of its own connection codes.
fn classify_code(code: &str, details: &str) -> LockError {
    match code {
        "Unavailable" | "Internal" | "Aborted" | "Cancelled" | "CONNECTION_CLOSED"
        | "CONNECTION_ERROR" => {
            LockError::service_unavailable(format!("Firestore {code}: {details}"))
        }
        "DeadlineExceeded" | "CONNECTION_TIMEOUT" => {
            LockError::network_timeout(format!("Firestore {code}: {details}"))
        }
        "PermissionDenied" | "Unauthenticated" => LockError::auth_failed(format!(
            "Firestore {code}: {details}; check the credentials and that the account may read \
             and write the lock collections"
        )),
        "InvalidArgument" | "FailedPrecondition" => {
            LockError::invalid_argument(format!("Firestore {code}: {details}"))
        }
        "ResourceExhausted" => LockError::rate_limited(format!(
            "Firestore {code}: {details}; lower the request rate or raise the quota"
        )),
        _ => LockError::internal(format!("Firestore {code}: {details}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use firestore::gcloud_sdk::tonic::{Code, Status};

    #[test]
    fn status_codes_map_as_the_reference_says() {
        let cases = [
            (Code::Unavailable, ErrorCode::ServiceUnavailable),
            (Code::Internal, ErrorCode::ServiceUnavailable),
            (Code::Aborted, ErrorCode::ServiceUnavailable),
            (Code::DeadlineExceeded, ErrorCode::NetworkTimeout),
            (Code::PermissionDenied, ErrorCode::AuthFailed),
            (Code::Unauthenticated, ErrorCode::AuthFailed),
            (Code::InvalidArgument, ErrorCode::InvalidArgument),
            (Code::FailedPrecondition, ErrorCode::InvalidArgument),
            (Code::ResourceExhausted, ErrorCode::RateLimited),
            (Code::DataLoss, ErrorCode::Internal),
        ];
        for (code, expected) in cases {
            let error = FirestoreError::from(Status::new(code, "test"));
            assert_eq!(is_aborted(&error), code == Code::Aborted, "{code:?}");
            let mapped = map_error(error);
            assert_eq!(mapped.code(), expected, "{code:?}: {mapped}");
            assert!(std::error::Error::source(&mapped).is_some());
        }
    }
}
