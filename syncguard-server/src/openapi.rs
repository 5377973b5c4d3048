//! The API description and LSC's static pages: `GET /openapi.yaml` (OpenAPI 3.0, written from
//! LockServiceCentral's specification, with the `Fencing-Token` header and this server's
//! extra answers), `GET /` and `/index.html` (a Swagger UI page loading it, as LSC has) and
//! `GET /robots.txt` (`Disallow: /`).
//!
//! Swagger UI's script and style sheet are built into the binary (`assets/swagger-ui/`, see
//! its `SOURCE.md`) and served under `/swagger-ui/<version>/`: the page loads nothing from
//! elsewhere, so it works offline and no third party can swap what it runs. Browsers may
//! keep them for a year, as the version in their URLs changes with their content.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The OpenAPI description of the API, as `GET /openapi.yaml` serves it.
pub const OPENAPI_YAML: &str = include_str!("openapi.yaml");

const INDEX_HTML: &str = include_str!("index.html");

const ROBOTS_TXT: &str = "User-agent: *\nDisallow: /\n";

/// A file of Swagger UI, as the page asks for it.
#[derive(Clone, Copy)]
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// What `index.html` loads, at the paths it names.
const SWAGGER_UI_ASSETS: [Asset; 2] = [
    Asset {
        path: "/swagger-ui/5.31.0/swagger-ui-bundle.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../assets/swagger-ui/swagger-ui-bundle.js"),
    },
    Asset {
        path: "/swagger-ui/5.31.0/swagger-ui.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../assets/swagger-ui/swagger-ui.css"),
    },
];

/// A year: an asset's URL changes with its content.
const ASSET_CACHE_CONTROL: &str = "public, max-age=31536000, immutable";

/// The documentation routes.
pub(crate) fn doc_routes() -> Router {
    let mut routes = Router::new();
    for asset in SWAGGER_UI_ASSETS {
        routes = routes.route(asset.path, get(move || async move { asset.response() }));
    }
    routes
        .route(
            "/openapi.yaml",
            get(|| async { ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML) }),
        )
        .route("/", get(index))
        .route("/index.html", get(index))
        .route(
            "/robots.txt",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    ROBOTS_TXT,
                )
            }),
        )
}

async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        INDEX_HTML,
    )
}

impl Asset {
    fn response(self) -> Response {
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(self.content_type),
                ),
                (
                    header::CACHE_CONTROL,
                    HeaderValue::from_static(ASSET_CACHE_CONTROL),
                ),
                (
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                ),
            ],
            self.body,
        )
            .into_response()
    }
}
