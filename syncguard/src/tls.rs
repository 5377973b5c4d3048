//! What the TLS features share: finding the rustls error behind a failed connection, so
//! that the backends can say "certificate rejected" instead of "server unreachable".

use std::error::Error;
use std::io;
use std::sync::Arc;

/// The rustls error that `error` or one of its sources is or wraps.
pub(crate) fn rustls_error<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = unwrap(error) {
            return Some(tls);
        }
        next = error.source();
    }
    None
}

/// `error` itself as a rustls error, looking through the wrappers the drivers use: TLS
/// streams report a failed handshake as an I/O error carrying the rustls error (which
/// [`io::Error::source`] skips), and redis-rs hands its I/O error out as an `Arc`.
fn unwrap<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    if let Some(shared) = error.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
        return unwrap(&**shared);
    }
    let inner = error.downcast_ref::<io::Error>()?.get_ref()?;
    unwrap(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_rustls_error_inside_the_wrappers() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = || io::Error::new(io::ErrorKind::InvalidData, tls.clone());
        assert_eq!(rustls_error(&tls), Some(&tls));
        assert_eq!(rustls_error(&io()), Some(&tls));
        let shared: Arc<dyn Error + Send + Sync> = Arc::new(io());
        assert_eq!(rustls_error(&shared), Some(&tls));
        let plain = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(rustls_error(&plain), None);
    }
}
