//! A candidate's identity: what observers are shown as the leader. The rules it follows, and
//! the default one (`host:pid`).

use crate::error::LockError;

/// The longest identity, in bytes. Escaped for JSON (at most twice as long) inside the
/// holder's object, it stays within [`MAX_HOLDER_BYTES`](crate::backend::MAX_HOLDER_BYTES).
pub const MAX_IDENTITY_BYTES: usize = 256;

/// Checks a candidate's identity: 1 to [`MAX_IDENTITY_BYTES`] bytes, no control characters.
pub(super) fn check_identity(identity: &str) -> Result<(), LockError> {
    if identity.is_empty() {
        return Err(LockError::invalid_argument(
            "the candidate's identity is empty; give 1 to 256 bytes that tell observers who leads (such as `host:pid`)",
        ));
    }
    if identity.len() > MAX_IDENTITY_BYTES {
        return Err(LockError::invalid_argument(format!(
            "the candidate's identity is {} bytes long; at most {MAX_IDENTITY_BYTES} are accepted",
            identity.len()
        )));
    }
    if identity.chars().any(char::is_control) {
        return Err(LockError::invalid_argument(
            "the candidate's identity contains a control character; observers print it, so give printable text",
        ));
    }
    Ok(())
}

/// `host:pid`: the host name from `HOSTNAME` (set in most containers, where it is the pod or
/// container name), else the kernel's (`/proc/sys/kernel/hostname`, `/etc/hostname`), else
/// `COMPUTERNAME` (Windows), else `localhost`; control characters dropped, cut to fit
/// [`MAX_IDENTITY_BYTES`].
pub(super) fn default_identity() -> String {
    let from_env = |name: &str| std::env::var(name).ok();
    let from_file = |path: &str| std::fs::read_to_string(path).ok();
    let host = [
        from_env("HOSTNAME"),
        from_file("/proc/sys/kernel/hostname"),
        from_file("/etc/hostname"),
        from_env("COMPUTERNAME"),
    ]
    .into_iter()
    .flatten()
    .map(|host| host.chars().filter(|c| !c.is_control()).collect::<String>())
    .map(|host| host.trim().to_owned())
    .find(|host| !host.is_empty())
    .unwrap_or_else(|| "localhost".to_owned());
    let pid = format!(":{}", std::process::id());
    let mut room = MAX_IDENTITY_BYTES - pid.len();
    while !host.is_char_boundary(room.min(host.len())) {
        room -= 1;
    }
    format!("{}{pid}", &host[..room.min(host.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_checked() {
        assert!(check_identity("").is_err());
        assert!(check_identity(&"a".repeat(MAX_IDENTITY_BYTES + 1)).is_err());
        assert!(check_identity("tab\there").is_err());
        assert!(check_identity(&"a".repeat(MAX_IDENTITY_BYTES)).is_ok());
    }

    #[test]
    fn the_default_identity_is_host_and_pid_and_valid() {
        let identity = default_identity();
        check_identity(&identity).unwrap();
        assert!(
            identity.ends_with(&format!(":{}", std::process::id())),
            "{identity}"
        );
    }
}
