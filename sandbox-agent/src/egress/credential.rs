//! Brokered credentials: a secret whose placeholder a process may send, put
//! in place of the placeholder only in its header of requests to its hosts.
//! The substitution the model broker does for its routes is the same one
//! ([`is_filled`], [`fill`]); a credential adds where it may go and how it
//! is sent, and the refusal of its placeholder anywhere else: another
//! header, the URL, another host, a request body.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::Uri;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use serde::{Deserialize, Serialize};
use shared::error::Error;
use shared::hosts::HostPattern;
use shared::proto::agent::v1::EgressCredential;

/// One credential, as configured (names and placeholders only, never a
/// value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    pub secret_name: String,
    pub placeholder: String,
    /// Host patterns (validated).
    pub hosts: Vec<String>,
    /// The header (lowercase), unused with `basic`.
    pub header: String,
    /// The header's value with `{}` for the secret.
    pub format: String,
    pub basic: bool,
    pub username: String,
}

/// Where a placeholder stood that it may not, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misplaced {
    pub secret_name: String,
    pub place: String,
}

impl std::fmt::Display for Misplaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the placeholder of the credential {} in {}", self.secret_name, self.place)
    }
}

/// Why a request's credentials could not be put in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindError {
    Misplaced(Misplaced),
    /// The agent holds no value of the secret (restarted since it was
    /// handed over).
    Missing(String),
    /// The value cannot stand in a header.
    Unusable(String),
}

/// The shortest placeholder a credential gets.
const PLACEHOLDER_PREFIX: &str = "sandhold-credential-";

/// A new placeholder for a credential.
pub fn placeholder() -> String {
    format!("{PLACEHOLDER_PREFIX}{:032x}", rand::random::<u128>())
}

/// `format` with `value` for its `{}`.
pub fn fill(format: &str, value: &str) -> String {
    format.replacen("{}", value, 1)
}

/// Whether `value` is exactly `format` filled with `placeholder`.
pub fn is_filled(format: &str, value: &[u8], placeholder: &str) -> bool {
    let Some((before, after)) = format.split_once("{}") else { return false };
    value.len() == before.len() + placeholder.len() + after.len()
        && value.starts_with(before.as_bytes())
        && value.ends_with(after.as_bytes())
        && &value[before.len()..value.len() - after.len()] == placeholder.as_bytes()
}

/// Validate one credential from the wire, with its `placeholder`.
pub fn credential(index: usize, c: &EgressCredential, placeholder: String) -> Result<Credential, Error> {
    let field = |name: &str| format!("credentials[{index}].{name}");
    if !shared::secret::valid_env_name(&c.secret_name) {
        return Err(Error::invalid_field(field("secret_name"), "not a valid variable name"));
    }
    if c.hosts.is_empty() {
        return Err(Error::invalid_field(field("hosts"), "at least one host"));
    }
    for (i, h) in c.hosts.iter().enumerate() {
        HostPattern::parse(h).map_err(|why| Error::invalid_field(format!("{}[{i}]", field("hosts")), why))?;
    }
    let header =
        if c.header.is_empty() { "authorization".to_string() } else { c.header.to_ascii_lowercase() };
    HeaderName::from_bytes(header.as_bytes())
        .map_err(|_| Error::invalid_field(field("header"), format!("{:?} is not a header name", c.header)))?;
    let format = match (c.format.as_str(), header.as_str()) {
        ("", "authorization") => "Bearer {}".to_string(),
        ("", _) => "{}".to_string(),
        (f, _) => f.to_string(),
    };
    if c.basic && !c.format.is_empty() {
        return Err(Error::invalid_field(field("format"), "not with basic (it is `Basic <user:secret>`)"));
    }
    if format.matches("{}").count() != 1 || HeaderValue::from_str(&fill(&format, "x")).is_err() {
        return Err(Error::invalid_field(field("format"), "a header value with one `{}` for the secret"));
    }
    if c.username.contains(':') || c.username.chars().any(char::is_control) {
        return Err(Error::invalid_field(field("username"), "no `:` or control characters"));
    }
    Ok(Credential {
        secret_name: c.secret_name.clone(),
        placeholder,
        hosts: c.hosts.clone(),
        header,
        format,
        basic: c.basic,
        username: c.username.clone(),
    })
}

impl Credential {
    /// Whether it may be sent to `host:port`.
    pub fn bound_to(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().filter_map(|h| HostPattern::parse(h).ok()).any(|p| p.matches(host, port))
    }

    /// The `user:password` of a `Basic` header value whose password is this
    /// credential's placeholder: the user.
    fn basic_user(&self, value: &[u8]) -> Option<String> {
        let decoded = decode_basic(value)?;
        let (user, password) = decoded.split_once(':')?;
        (password == self.placeholder).then(|| user.to_string())
    }
}

/// The decoded `user:password` of a `Basic ...` value.
fn decode_basic(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    let (scheme, rest) = text.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    String::from_utf8(bytes).ok()
}

/// Whether any placeholder of `credentials` is in `bytes`; whose.
pub fn find_in<'a>(bytes: &[u8], credentials: &'a [Credential]) -> Option<&'a Credential> {
    credentials.iter().find(|c| memchr::memmem::find(bytes, c.placeholder.as_bytes()).is_some())
}

/// Put the values of the credentials bound to `host:port` into the
/// request's `headers`, in place of their placeholders; `value` gives a
/// secret's value. A placeholder anywhere else (the URL, another header,
/// the wrong shape, a credential not bound here) refuses the request, and
/// nothing is changed then.
pub fn bind(
    headers: &mut HeaderMap,
    uri: &Uri,
    (host, port): (&str, u16),
    credentials: &[Credential],
    value: impl Fn(&str) -> Option<shared::secret::Secret>,
) -> Result<(), BindError> {
    let misplaced = |c: &Credential, place: String| {
        BindError::Misplaced(Misplaced { secret_name: c.secret_name.clone(), place })
    };
    if let Some(c) = find_in(uri.to_string().as_bytes(), credentials) {
        return Err(misplaced(c, "the URL".into()));
    }
    // (header, index of its value, credential, the basic user) to fill.
    let mut fills: Vec<(HeaderName, usize, &Credential, Option<String>)> = Vec::new();
    for name in headers.keys() {
        for (i, v) in headers.get_all(name).iter().enumerate() {
            let basic = decode_basic(v.as_bytes());
            for c in credentials {
                let raw = memchr::memmem::find(v.as_bytes(), c.placeholder.as_bytes()).is_some();
                let hidden = basic.as_deref().is_some_and(|b| b.contains(c.placeholder.as_str()));
                if !raw && !hidden {
                    continue;
                }
                if !c.bound_to(host, port) {
                    return Err(misplaced(c, format!("the header {name} of a request to {host}:{port}")));
                }
                let fits = if c.basic {
                    (name == header::AUTHORIZATION).then(|| c.basic_user(v.as_bytes())).flatten().map(Some)
                } else {
                    (name.as_str() == c.header && is_filled(&c.format, v.as_bytes(), &c.placeholder))
                        .then_some(None)
                };
                match fits {
                    Some(user) => fills.push((name.clone(), i, c, user)),
                    None => return Err(misplaced(c, format!("the header {name}"))),
                }
            }
        }
    }
    for (name, i, c, user) in fills {
        let secret = value(&c.secret_name).ok_or_else(|| BindError::Missing(c.secret_name.clone()))?;
        let text = match user {
            Some(user) => {
                let user = if c.username.is_empty() { user } else { c.username.clone() };
                let pair = format!("{user}:{}", secret.expose());
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
            }
            None => fill(&c.format, secret.expose()),
        };
        let mut filled =
            HeaderValue::from_str(&text).map_err(|_| BindError::Unusable(c.secret_name.clone()))?;
        filled.set_sensitive(true);
        if let header::Entry::Occupied(mut entry) = headers.entry(&name)
            && let Some(slot) = entry.iter_mut().nth(i)
        {
            *slot = filled;
        }
    }
    Ok(())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body that ends with an error, before they are sent, where
/// the bytes of a placeholder would pass: the bytes that could begin one
/// are held back until the next piece shows they do not.
pub struct Scanned<B> {
    inner: B,
    placeholders: Vec<(String, String)>,
    held: BytesMut,
    trailers: Option<HeaderMap>,
    ended: bool,
    on_found: Option<Box<dyn FnOnce(Misplaced) + Send + Sync>>,
}

impl<B> Scanned<B> {
    /// `inner` scanned for `credentials`' placeholders; `on_found` is told
    /// of the first found.
    pub fn new(
        inner: B,
        credentials: &[Credential],
        on_found: impl FnOnce(Misplaced) + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner,
            placeholders: credentials
                .iter()
                .map(|c| (c.placeholder.clone(), c.secret_name.clone()))
                .collect(),
            held: BytesMut::new(),
            trailers: None,
            ended: false,
            on_found: Some(Box::new(on_found)),
        }
    }

    fn longest(&self) -> usize {
        self.placeholders.iter().map(|(p, _)| p.len()).max().unwrap_or(0)
    }
}

impl<B> Body for Scanned<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                if !this.held.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split().freeze()))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => {
                    this.ended = true;
                    continue;
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                Some(Ok(frame)) => frame,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    this.trailers = frame.into_trailers().ok();
                    continue;
                }
            };
            this.held.extend_from_slice(&data);
            if let Some((_, secret_name)) = this
                .placeholders
                .iter()
                .find(|(p, _)| memchr::memmem::find(&this.held, p.as_bytes()).is_some())
            {
                let found = Misplaced { secret_name: secret_name.clone(), place: "a request body".into() };
                this.held.clear();
                this.ended = true;
                if let Some(tell) = this.on_found.take() {
                    tell(found.clone());
                }
                return Poll::Ready(Some(Err(found.to_string().into())));
            }
            let keep = this.longest().saturating_sub(1).min(this.held.len());
            let out = this.held.split_to(this.held.len() - keep);
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.held.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    const P: &str = "sandhold-credential-0123456789abcdef";

    fn token(bearer: bool) -> Credential {
        Credential {
            secret_name: "GH_TOKEN".into(),
            placeholder: P.into(),
            hosts: vec!["github.com".into(), "api.github.com".into()],
            header: "authorization".into(),
            format: "Bearer {}".into(),
            basic: !bearer,
            username: if bearer { String::new() } else { "x-access-token".into() },
        }
    }

    fn value(name: &str) -> Option<shared::secret::Secret> {
        (name == "GH_TOKEN").then(|| shared::secret::Secret::new("ghp_real".to_string()))
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn basic(pair: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
    }

    #[test]
    fn the_value_goes_only_into_its_header_of_requests_to_its_hosts() {
        let uri: Uri = "/repos/acme/x".parse().unwrap();
        let mut h = headers(&[("authorization", &format!("Bearer {P}")), ("accept", "*/*")]);
        bind(&mut h, &uri, ("api.github.com", 443), &[token(true)], value).unwrap();
        assert_eq!(h["authorization"], "Bearer ghp_real");
        assert!(h["authorization"].is_sensitive());
        let mut h = headers(&[("authorization", &basic(&format!("git:{P}")))]);
        bind(&mut h, &uri, ("github.com", 443), &[token(false)], value).unwrap();
        assert_eq!(h["authorization"], basic("x-access-token:ghp_real").as_str());
        // No placeholder: nothing to do.
        let mut h = headers(&[("authorization", "Bearer other")]);
        bind(&mut h, &uri, ("example.org", 443), &[token(true)], value).unwrap();
        assert_eq!(h["authorization"], "Bearer other");
    }

    #[test]
    fn a_placeholder_anywhere_else_is_refused() {
        let bearer = format!("Bearer {P}");
        let wrapped = basic(&format!("u:{P}"));
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], (&'a str, u16));
        let cases: [Case<'_>; 6] = [
            // Another host.
            ("/", &[("authorization", &bearer)], ("evil.example", 443)),
            // Another port.
            ("/", &[("authorization", &bearer)], ("github.com", 8443)),
            // Another header.
            ("/", &[("x-echo", P)], ("github.com", 443)),
            // The wrong shape in its header.
            ("/", &[("authorization", &format!("token {P}"))], ("github.com", 443)),
            // Base64 in a Basic header, for a bearer credential.
            ("/", &[("authorization", &wrapped)], ("github.com", 443)),
            // The URL.
            ("/search?q=sandhold-credential-0123456789abcdef", &[], ("github.com", 443)),
        ];
        for (uri, pairs, to) in cases {
            let mut h = headers(pairs);
            let before = h.clone();
            let err = bind(&mut h, &uri.parse().unwrap(), to, &[token(true)], value).unwrap_err();
            assert!(matches!(err, BindError::Misplaced(_)), "{uri} {pairs:?}: {err:?}");
            assert_eq!(h, before, "nothing changed");
        }
        let mut h = headers(&[("authorization", &bearer)]);
        let missing = bind(&mut h, &"/".parse().unwrap(), ("github.com", 443), &[token(true)], |_| None);
        assert_eq!(missing, Err(BindError::Missing("GH_TOKEN".into())));
    }

    #[tokio::test]
    async fn a_body_carrying_a_placeholder_ends_before_it_is_sent() {
        let pieces = ["abc sandhold-cred", "ential-0123456789", "abcdef tail"];
        let stream = futures::stream::iter(
            pieces.iter().map(|p| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(*p)))),
        );
        let found = std::sync::Arc::new(std::sync::Mutex::new(None));
        let tell = found.clone();
        let mut body = Scanned::new(http_body_util::StreamBody::new(stream), &[token(true)], move |m| {
            *tell.lock().unwrap() = Some(m)
        });
        let mut passed = Vec::new();
        let mut failed = false;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => passed.extend_from_slice(&f.into_data().unwrap()),
                Err(_) => failed = true,
            }
        }
        assert!(failed);
        assert!(memchr::memmem::find(&passed, b"sandhold-credential-").is_none(), "{passed:?}");
        assert_eq!(found.lock().unwrap().as_ref().unwrap().place, "a request body");
        // A clean body passes whole.
        let clean = futures::stream::iter(
            ["one ", "two"].iter().map(|p| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(*p)))),
        );
        let body = Scanned::new(http_body_util::StreamBody::new(clean), &[token(true)], |_| {});
        assert_eq!(body.collect().await.unwrap().to_bytes(), "one two");
    }
}
