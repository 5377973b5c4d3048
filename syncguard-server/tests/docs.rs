//! The documentation page over real HTTP: Swagger UI loads only what this server serves
//! (nothing from a CDN), and what it serves is the vendored Swagger UI, unmodified.

mod support;

use std::path::Path;

use http::StatusCode;
use sha2::{Digest, Sha256};
use support::TestServer;

/// The `src` and `href` attribute values of an HTML page.
fn references(page: &str) -> Vec<String> {
    let mut found = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        let mut rest = page;
        while let Some(start) = rest.find(attribute) {
            rest = &rest[start + attribute.len()..];
            let end = rest.find('"').expect("a closing quote");
            found.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    found
}

fn vendored(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/swagger-ui");
    std::fs::read(path.join(name)).unwrap()
}

#[tokio::test]
async fn swagger_ui_loads_only_same_origin_assets_which_are_served() {
    let server = TestServer::memory().await;
    for page_path in ["/", "/index.html"] {
        let page = server.get(page_path).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            !page.text.contains("://") && !page.text.contains("//unpkg"),
            "{page_path} names no other origin: {}",
            page.text
        );
        assert!(
            page.text.contains("validatorUrl: null"),
            "Swagger UI's online validator stays off"
        );
        let references = references(&page.text);
        assert_eq!(
            references.len(),
            2,
            "a script and a style sheet: {references:?}"
        );
        for reference in references {
            assert!(
                reference.starts_with('/') && !reference.starts_with("//"),
                "same origin: {reference}"
            );
            let asset = server.get(&reference).await;
            assert_eq!(asset.status, StatusCode::OK, "{reference}");
            let file = reference.rsplit('/').next().unwrap();
            assert_eq!(
                asset.text.as_bytes(),
                vendored(file),
                "{reference} is the vendored {file}"
            );
            let content_type = if file.ends_with(".js") {
                "text/javascript; charset=utf-8"
            } else {
                "text/css; charset=utf-8"
            };
            assert_eq!(asset.headers["content-type"], content_type, "{reference}");
            assert_eq!(
                asset.headers["cache-control"], "public, max-age=31536000, immutable",
                "{reference}"
            );
            assert_eq!(asset.headers["x-content-type-options"], "nosniff");
        }
    }
}

#[test]
fn vendored_swagger_ui_matches_its_recorded_checksums() {
    let source = String::from_utf8(vendored("SOURCE.md")).unwrap();
    let mut checked = 0;
    for line in source.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].split('`').nth(1).unwrap();
        let recorded = cells[2].trim_matches('`');
        let actual: String = Sha256::digest(vendored(name))
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(actual, recorded, "{name} is as SOURCE.md records it");
        checked += 1;
    }
    assert_eq!(checked, 5, "every vendored file is recorded");
}
