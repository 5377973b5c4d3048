//! The API description and LSC's static pages: `GET /openapi.yaml` (OpenAPI 3.0, written from
//! LockServiceCentral's specification, with the `Fencing-Token` header and this server's
//! extra answers), `GET /` and `/index.html` (a Swagger UI page loading it, as LSC has) and
//! `GET /robots.txt` (`Disallow: /`).

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// The OpenAPI description of the API, as `GET /openapi.yaml` serves it.
pub const OPENAPI_YAML: &str = include_str!("openapi.yaml");

const INDEX_HTML: &str = include_str!("index.html");

const ROBOTS_TXT: &str = "User-agent: *\nDisallow: /\n";

/// The documentation routes.
pub(crate) fn doc_routes() -> Router {
    Router::new()
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
