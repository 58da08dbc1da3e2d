//! Which browser origins may call the API through gRPC-Web besides the
//! server's own (whose console needs no setting), and which host names a
//! server without tokens answers to besides loopback ones.

/// Any origin (`--cors-origin '*'`): tokens travel in a header, never in a
/// cookie, so a foreign page can only use a token it already has.
pub const ANY_ORIGIN: &str = "*";

/// `origin` as browsers send it in `Origin` (`scheme://host[:port]`, the
/// default port left out, lowercase), or why it is not one.
pub fn normalize_origin(origin: &str) -> Result<String, String> {
    let origin = origin.trim();
    if origin == ANY_ORIGIN {
        return Ok(origin.to_string());
    }
    let url = url::Url::parse(origin).map_err(|e| format!("CORS origin {origin:?}: {e}"))?;
    let bare = url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none()
        && url.path() == "/";
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || !bare {
        return Err(format!(
            "CORS origin {origin:?} must be scheme://host[:port] (http or https, no path), \
             e.g. https://console.example.com, or * for any"
        ));
    }
    Ok(url.origin().ascii_serialization())
}

/// A host name as a single-user server compares it with `Host`
/// (lowercase, no trailing dot), or why it is not one.
pub fn normalize_host(host: &str) -> Result<String, String> {
    let name = host.trim().trim_end_matches('.').to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.']);
    if !valid {
        return Err(format!(
            "allowed host {host:?} must be a host name without scheme or port, e.g. devbox.internal"
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_normalized_as_browsers_send_them() {
        assert_eq!(
            normalize_origin("HTTPS://Console.Example.com:443").unwrap(),
            "https://console.example.com"
        );
        assert_eq!(normalize_origin("http://127.0.0.1:5173/").unwrap(), "http://127.0.0.1:5173");
        assert_eq!(normalize_origin("*").unwrap(), "*");
        for bad in ["console.example.com", "ftp://x", "https://x/path", "https://u@x", "https://x?q"] {
            assert!(normalize_origin(bad).is_err(), "{bad}");
        }
    }
}
