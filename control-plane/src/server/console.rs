//! The web console's files, embedded in the binary at build time: the
//! server needs no Node toolchain and no files beside it. The sources are
//! in `control-plane/console/` (the bundle `console.js` is built from
//! `console/src/` and the TypeScript client by `clients/typescript`'s
//! `npm run build:console`, and checked in).
//!
//! `/assets/<name>` is a file; every other path is the single page, which
//! routes on the address itself (`/runs/<run_id>` shows that run).

use std::sync::OnceLock;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use tonic::body::Body;

struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const INDEX: Asset = Asset {
    path: "/index.html",
    content_type: "text/html; charset=utf-8",
    bytes: include_bytes!("../../console/index.html"),
};

const ASSETS: &[Asset] = &[
    Asset {
        path: "/assets/console.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../console/console.js"),
    },
    Asset {
        path: "/assets/console.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../console/console.css"),
    },
    Asset {
        path: "/assets/favicon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("../../console/favicon.svg"),
    },
];

/// Scripts, styles and calls only from this server; no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The answer to a `GET` or `HEAD` that is not a gRPC call.
pub(super) fn respond<B>(request: &Request<B>) -> Response<Body> {
    let path = request.uri().path();
    let asset = match ASSETS.iter().position(|a| a.path == path) {
        Some(i) => (&ASSETS[i], i + 1),
        None if path.starts_with("/assets/") => return plain(StatusCode::NOT_FOUND, "no such console asset"),
        None => (&INDEX, 0),
    };
    let (asset, index) = asset;
    let etag = etag(index, asset.bytes);
    let unchanged = request.headers().get(IF_NONE_MATCH).is_some_and(|v| v.as_bytes() == etag.as_bytes());
    let body = if unchanged || request.method() == Method::HEAD {
        Body::empty()
    } else {
        Body::new(http_body_util::Full::new(Bytes::from_static(asset.bytes)))
    };
    let mut response = Response::new(body);
    if unchanged {
        *response.status_mut() = StatusCode::NOT_MODIFIED;
    }
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    // Revalidated every time: a new binary serves new files at once.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(ETAG, etag.clone());
    headers.insert("content-security-policy", HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    response
}

/// A strong validator per file, computed once.
fn etag(index: usize, bytes: &[u8]) -> HeaderValue {
    static TAGS: OnceLock<Vec<OnceLock<HeaderValue>>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| (0..=ASSETS.len()).map(|_| OnceLock::new()).collect());
    tags[index]
        .get_or_init(|| {
            let digest = Sha256::digest(bytes);
            HeaderValue::from_str(&format!("\"{}\"", hex::encode(&digest[..12])))
                .expect("hex is a header value")
        })
        .clone()
}

/// A short text answer.
pub(super) fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response =
        Response::new(Body::new(http_body_util::Full::new(bytes::Bytes::from_static(text.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Response<Body> {
        respond(&Request::get(path).body(()).unwrap())
    }

    #[test]
    fn pages_are_the_index_assets_are_files() {
        for path in ["/", "/runs/r-1", "/sandboxes", "/index.html"] {
            let r = get(path);
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(r.headers()[CONTENT_TYPE], "text/html; charset=utf-8", "{path}");
        }
        assert_eq!(get("/assets/console.js").headers()[CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(get("/assets/nope.js").status(), StatusCode::NOT_FOUND);
        let tag = get("/").headers()[ETAG].clone();
        let again = respond(&Request::get("/runs/x").header(IF_NONE_MATCH, tag).body(()).unwrap());
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    }
}
