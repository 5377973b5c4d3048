//! What an election refuses, checked without I/O.

use std::time::Duration;

use syncguard::MemoryBackend;
use syncguard::leader::Election;

use crate::backends::WithoutHolders;

#[test]
fn names_identities_settings_and_backends_are_checked() {
    let backend = MemoryBackend::new();
    let refused = |builder: syncguard::leader::ElectionBuilder, what: &str| {
        let error = builder.build().expect_err(what);
        assert_eq!(
            error.code(),
            syncguard::ErrorCode::InvalidArgument,
            "{what}"
        );
        error.to_string()
    };
    let message = refused(Election::builder(&backend, ""), "an empty name");
    assert!(message.contains("election name is empty"), "{message}");
    let message = refused(
        Election::builder(&backend, &"n".repeat(510)),
        "a name too long for a key",
    );
    assert!(message.contains("leader:<name>"), "{message}");
    refused(Election::builder(&backend, "a\0b"), "a NUL in the name");
    refused(
        Election::builder(&backend, "x").identity(""),
        "an empty identity",
    );
    refused(
        Election::builder(&backend, "x").identity("line\nbreak"),
        "a control character",
    );
    refused(
        Election::builder(&backend, "x").identity("i".repeat(257)),
        "a long identity",
    );
    refused(
        Election::builder(&backend, "x").ttl(Duration::ZERO),
        "a zero ttl",
    );
    refused(
        Election::builder(&backend, "x").observe_every(Duration::ZERO),
        "a zero observe_every",
    );
    let message = refused(
        Election::builder(&WithoutHolders(backend.clone()), "x"),
        "a backend without holders",
    );
    assert!(message.contains("holders"), "{message}");

    let election = Election::builder(&backend, "Cafe\u{301}")
        .identity("i".repeat(256))
        .build()
        .unwrap();
    assert_eq!(election.key(), "leader:Caf\u{e9}", "NFC-normalized");
    assert_eq!(election.name(), "Cafe\u{301}");
    assert_eq!(election.ttl(), syncguard::leader::DEFAULT_LEADER_TTL);
    assert_eq!(election.observe_every(), election.ttl() / 4);
}
