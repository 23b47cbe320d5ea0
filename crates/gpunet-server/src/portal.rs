//! The web portal: static assets compiled into the binary and served at `/` and `/portal/…`. The page talks to the
//! `/v1` API with the token the user logs in with; nothing is fetched from anywhere else.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../portal/index.html");
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", "text/javascript; charset=utf-8", include_str!("../portal/app.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../portal/style.css")),
    ("favicon.svg", "image/svg+xml", include_str!("../portal/favicon.svg")),
];

/// Scripts, styles and connections only from this server.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn page(content_type: &str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the portal's page.
pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// `GET /portal/{file}`: a script, style sheet or icon of the portal.
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, ct, body)) => page(ct, body),
        None => (StatusCode::NOT_FOUND, "no such portal asset").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_assets_that_are_embedded() {
        for src in INDEX.split("/portal/").skip(1) {
            let name = src.split('"').next().unwrap_or_default();
            assert!(ASSETS.iter().any(|(n, _, _)| *n == name), "index.html refers to missing asset {name}");
        }
        // The only absolute URL allowed is the SVG namespace name, which is never fetched.
        for (name, body) in ASSETS.iter().map(|(n, _, b)| (*n, *b)).chain([("index.html", INDEX)]) {
            for scheme in ["http://", "https://"] {
                for (at, _) in body.match_indices(scheme) {
                    assert!(
                        body[at..].starts_with("http://www.w3.org/2000/svg"),
                        "{name} refers to an external URL at byte {at}"
                    );
                }
            }
        }
    }
}
