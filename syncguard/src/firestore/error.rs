//! `firestore` crate errors → [`LockError`], as the reference's Firestore specification maps
//! the gRPC status codes.
//!
//! The message says what happened in our words (with the gRPC status code) and what to do;
//! the driver's error is only the [`source`](std::error::Error::source), unwrapped from the
//! `firestore` crate's [`FirestoreError`] (whose text and source repeat the error inside it),
//! so that a reporter that walks the chain prints the driver's text once.

use std::io;
use std::net::SocketAddr;

use firestore::errors::{FirestoreError, FirestoreSystemError};

use crate::error::{BoxError, LockError};

/// Maps an error of the `firestore` crate, keeping the error inside it as the source (see
/// [`driver_error`]).
pub(super) fn map_error(error: FirestoreError) -> LockError {
    let mapped = match &error {
        FirestoreError::DatabaseError(db) => classify_code(&db.public.code),
        FirestoreError::NetworkError(_) => LockError::service_unavailable(
            "the connection to Firestore failed; retry later and check the network",
        ),
        FirestoreError::SystemError(system) => classify_setup(system),
        FirestoreError::InvalidParametersError(_) => {
            LockError::invalid_argument("Firestore rejected a parameter of the request")
        }
        FirestoreError::DataNotFoundError(_) => LockError::invalid_argument(
            "Firestore found no such resource: is the project or database id right?",
        ),
        FirestoreError::DataConflictError(_) => {
            LockError::internal("unexpected conflict reported by Firestore")
        }
        FirestoreError::SerializeError(_) | FirestoreError::DeserializeError(_) => {
            LockError::internal(
                "a Firestore lock or fence document does not have the expected shape; another \
                 program writes to the lock collections, use collections of your own",
            )
        }
        FirestoreError::ErrorInTransaction(_) => {
            LockError::internal("unexpected error inside a Firestore transaction")
        }
        FirestoreError::CacheError(_) => LockError::internal("unexpected Firestore cache error"),
    };
    mapped.with_source(driver_error(error))
}

/// The error to keep as the source: the one inside the `firestore` crate's wrapper, whose
/// text and source both repeat it. A connection that failed while the client was built is
/// kept as the operating system's error when gcloud-sdk's text names one (see
/// [`ConnectFailure`]).
pub(super) fn driver_error(error: FirestoreError) -> BoxError {
    match error {
        FirestoreError::SystemError(system) => {
            match ConnectFailure::parse(&system.public.code).and_then(|failure| failure.os_error) {
                Some(os_error) => Box::new(os_error),
                None => Box::new(system),
            }
        }
        FirestoreError::DatabaseError(inner) => Box::new(inner),
        FirestoreError::DataConflictError(inner) => Box::new(inner),
        FirestoreError::DataNotFoundError(inner) => Box::new(inner),
        FirestoreError::InvalidParametersError(inner) => Box::new(inner),
        FirestoreError::SerializeError(inner) | FirestoreError::DeserializeError(inner) => {
            Box::new(inner)
        }
        FirestoreError::NetworkError(inner) => Box::new(inner),
        FirestoreError::CacheError(inner) => Box::new(inner),
        // The transaction's text is its source's behind a prefix.
        FirestoreError::ErrorInTransaction(inner) => {
            match inner.source.downcast::<FirestoreError>() {
                Ok(nested) => driver_error(*nested),
                Err(other) => other,
            }
        }
    }
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
/// or one of its own connection codes. The status (with the server's message) is the source.
fn classify_code(code: &str) -> LockError {
    match code {
        "Unavailable" | "Internal" | "Aborted" | "Cancelled" | "CONNECTION_CLOSED"
        | "CONNECTION_ERROR" => LockError::service_unavailable(format!(
            "Firestore is unavailable or dropped the request (gRPC {code}); retry later"
        )),
        "DeadlineExceeded" | "CONNECTION_TIMEOUT" => LockError::network_timeout(format!(
            "Firestore did not answer in time (gRPC {code}); the operation may or may not have \
             been applied"
        )),
        "PermissionDenied" | "Unauthenticated" => LockError::auth_failed(format!(
            "Firestore refused the request (gRPC {code}); check the credentials and that the \
             account may read and write the lock collections"
        )),
        "InvalidArgument" | "FailedPrecondition" => {
            LockError::invalid_argument(format!("Firestore rejected the request (gRPC {code})"))
        }
        "ResourceExhausted" => LockError::rate_limited(format!(
            "Firestore is throttling this client (gRPC {code}); lower the request rate or raise \
             the quota"
        )),
        _ => LockError::internal(format!("unexpected Firestore error (gRPC {code})")),
    }
}

/// Classifies an error raised while the client was built: a failed connection (to the
/// emulator, or to the service), an invalid endpoint, or missing or unusable credentials.
fn classify_setup(system: &FirestoreSystemError) -> LockError {
    let code = system.public.code.as_str();
    if let Some(failure) = ConnectFailure::parse(code) {
        return failure.error();
    }
    if code.starts_with("GrpcStatus(")
        || code.starts_with("UrlError(")
        || code.starts_with("InvalidApiUrl(")
    {
        return LockError::invalid_argument(
            "the Firestore endpoint is not a valid URL; check FIRESTORE_EMULATOR_HOST \
             (host:port of the emulator)",
        );
    }
    if code.starts_with("Credentials(") && code.contains("is_transient: true") {
        return LockError::service_unavailable(
            "could not get a token for Firestore from the credentials' token endpoint; retry \
             later",
        );
    }
    LockError::auth_failed(
        "the Firestore client found no usable credentials; check the Application Default \
         Credentials (GOOGLE_APPLICATION_CREDENTIALS), or set FIRESTORE_EMULATOR_HOST for the \
         emulator",
    )
}

/// A connection that failed while the client was built. gcloud-sdk keeps only the `Debug`
/// text of tonic's transport error, as the code of a `SystemError`:
/// `GrpcStatus(tonic::transport::Error(Transport, ConnectError(ConnectError("tcp connect
/// error", 127.0.0.1:8080, Os { code: 111, kind: ConnectionRefused, message: "Connection
/// refused" }))))`; the address and the operating system's error are read back from it.
struct ConnectFailure {
    address: Option<SocketAddr>,
    os_error: Option<io::Error>,
}

impl ConnectFailure {
    fn parse(code: &str) -> Option<Self> {
        let rest = code.strip_prefix("GrpcStatus(tonic::transport::Error(Transport")?;
        let address = rest
            .split_once("connect error\", ")
            .and_then(|(_, after)| after.split([',', ')']).next())
            .and_then(|address| address.parse().ok());
        let os_error = rest
            .split_once("Os { code: ")
            .and_then(|(_, after)| after.split_once(','))
            .and_then(|(number, _)| number.parse().ok())
            .map(io::Error::from_raw_os_error);
        Some(Self { address, os_error })
    }

    /// In our words; the operating system's error, when known, is the source.
    fn error(&self) -> LockError {
        let at = self
            .address
            .map(|address| format!(" at {address}"))
            .unwrap_or_default();
        match self.os_error.as_ref().map(io::Error::kind) {
            Some(io::ErrorKind::ConnectionRefused) => LockError::service_unavailable(format!(
                "Firestore{at} refused the connection: is the server (or the emulator named by \
                 FIRESTORE_EMULATOR_HOST) running, and is this its address?"
            )),
            Some(io::ErrorKind::TimedOut) => {
                LockError::network_timeout(format!("connecting to Firestore{at} timed out"))
            }
            _ => LockError::service_unavailable(format!(
                "could not connect to Firestore{at}; retry later, and check the network and \
                 FIRESTORE_EMULATOR_HOST if the emulator is meant"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
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

    /// `error`'s message and every source's, as anyhow's `{:#}` prints them.
    fn chain(error: &LockError) -> String {
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn the_driver_text_appears_once_in_the_chain() {
        let unavailable = FirestoreError::from(Status::new(Code::Unavailable, "driver text"));
        let error = map_error(unavailable);
        assert_eq!(error.code(), ErrorCode::ServiceUnavailable);
        let text = chain(&error);
        assert_eq!(text.matches("driver text").count(), 1, "{text}");

        // A transaction's error is its source behind a prefix: the source is kept, once.
        let denied = FirestoreError::from(Status::new(Code::PermissionDenied, "driver text"));
        let in_transaction =
            FirestoreError::ErrorInTransaction(firestore::errors::FirestoreErrorInTransaction {
                transaction_id: vec![1, 2, 3],
                source: Box::new(denied),
            });
        let error = map_error(in_transaction);
        let text = chain(&error);
        assert_eq!(text.matches("driver text").count(), 1, "{text}");
    }

    #[test]
    fn connection_failures_are_read_back_from_gcloud_sdk_text() {
        let refused = "GrpcStatus(tonic::transport::Error(Transport, ConnectError(ConnectError(\
                       \"tcp connect error\", 127.0.0.1:8080, Os { code: 111, kind: \
                       ConnectionRefused, message: \"Connection refused\" }))))";
        let failure = ConnectFailure::parse(refused).unwrap();
        assert_eq!(
            failure.address,
            Some(SocketAddr::from(([127, 0, 0, 1], 8080)))
        );
        assert_eq!(
            failure.os_error.as_ref().and_then(io::Error::raw_os_error),
            Some(111)
        );

        let unresolved = "GrpcStatus(tonic::transport::Error(Transport, ConnectError(\
                          ConnectError(\"dns error\", Custom { kind: Uncategorized, error: \
                          \"failed to lookup address information\" }))))";
        let failure = ConnectFailure::parse(unresolved).unwrap();
        assert_eq!(failure.address, None);
        assert!(failure.os_error.is_none());
        assert_eq!(failure.error().code(), ErrorCode::ServiceUnavailable);

        let v6 = "GrpcStatus(tonic::transport::Error(Transport, ConnectError(ConnectError(\
                  \"tcp connect error\", [::1]:8080)))";
        let failure = ConnectFailure::parse(v6).unwrap();
        assert_eq!(failure.address, Some("[::1]:8080".parse().unwrap()));

        assert!(ConnectFailure::parse("CredentialsBuild(Error { .. })").is_none());
        let invalid = FirestoreError::SystemError(FirestoreSystemError {
            public: firestore::errors::FirestoreErrorPublicGenericDetails {
                code: "GrpcStatus(tonic::transport::Error(InvalidUri))".into(),
            },
            message: "GCloud system error: Tonic/gRPC error: invalid URI".into(),
        });
        assert_eq!(map_error(invalid).code(), ErrorCode::InvalidArgument);
    }

    /// What the client builder reports for an endpoint at a closed port: a connection
    /// failure, retryable, in our words; the operating system's error once, as the source.
    #[tokio::test]
    async fn a_refused_connection_is_unavailable_and_printed_once() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let options = firestore::FirestoreDbOptions::new("syncguard-refused".into())
            .with_firebase_api_url(format!("http://127.0.0.1:{port}"));
        let Err(refused) = firestore::FirestoreDb::with_options(options).await else {
            panic!("nothing listens on port {port}");
        };
        let error = map_error(refused);
        assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
        assert!(error.is_retryable());
        assert!(
            error.to_string().contains(&format!("127.0.0.1:{port}")),
            "{error}"
        );
        assert!(!error.to_string().contains("os error"), "{error}");
        let text = chain(&error);
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        let source = std::error::Error::source(&error).expect("the driver error is kept");
        assert_eq!(
            source.downcast_ref::<io::Error>().map(io::Error::kind),
            Some(io::ErrorKind::ConnectionRefused)
        );
    }
}
