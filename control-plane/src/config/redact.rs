//! Passwords out of URLs, before a URL is printed or logged.

use url::{Position, Url};

const REDACTED: &str = "[redacted]";

/// `scheme://user:password@host/...` with the password replaced by
/// `[redacted]`; also the `password=` query parameter. URLs without
/// credentials come back unchanged; a string that does not parse as a URL
/// comes back as `[redacted]` (it may hold a password we cannot locate).
pub fn redact_url(raw: &str) -> String {
    let Ok(url) = Url::parse(raw) else {
        return REDACTED.to_string();
    };
    let user = &url[Position::BeforeUsername..Position::AfterUsername];
    let userinfo = match url.password() {
        Some(_) => Some(format!("{user}:{REDACTED}@")),
        // A lone userinfo is a password for Redis-style URLs
        // (`redis://secret@host`) and a user elsewhere; hide it.
        None if !user.is_empty() && url.scheme().starts_with("redis") => Some(format!("{REDACTED}@")),
        None => None,
    };
    let query = url.query().filter(|q| q.split('&').any(is_password)).map(|q| {
        q.split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if is_password(kv) => format!("{k}={REDACTED}"),
                _ => kv.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&")
    });
    if userinfo.is_none() && query.is_none() {
        // Nothing to hide: the caller's spelling, not the parser's.
        return raw.to_string();
    }
    let userinfo = match userinfo {
        Some(u) => u,
        None if user.is_empty() => String::new(),
        None => format!("{user}@"),
    };
    let query = match query {
        Some(q) => format!("?{q}"),
        None => url[Position::AfterPath..Position::AfterQuery].to_string(),
    };
    format!(
        "{}{userinfo}{}{query}{}",
        &url[..Position::BeforeUsername],
        &url[Position::BeforeHost..Position::AfterPath],
        &url[Position::AfterQuery..],
    )
}

/// A `password=...` query pair (the key compared decoded, in any case).
fn is_password(pair: &str) -> bool {
    pair.contains('=')
        && url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .is_some_and(|(k, _)| k.eq_ignore_ascii_case("password"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact_url("postgres://u:hunter2@db:5432/x"), "postgres://u:[redacted]@db:5432/x");
        assert_eq!(redact_url("redis://:hunter2@127.0.0.1:6379/0"), "redis://:[redacted]@127.0.0.1:6379/0");
        assert_eq!(redact_url("redis://hunter2@127.0.0.1:6379"), "redis://[redacted]@127.0.0.1:6379");
        assert_eq!(
            redact_url("postgres://db/x?user=u&password=hunter2"),
            "postgres://db/x?user=u&password=[redacted]"
        );
        assert_eq!(redact_url("sqlite:///tmp/a@b/sandhold.db"), "sqlite:///tmp/a@b/sandhold.db");
        assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn both_places_at_once_and_fragments_survive() {
        assert_eq!(
            redact_url("postgresql://u:p1@h/db?PassWord=p2&sslmode=require#frag"),
            "postgresql://u:[redacted]@h/db?PassWord=[redacted]&sslmode=require#frag"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://u:p@[bad"), "[redacted]");
    }
}
