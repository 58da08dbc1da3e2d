//! Tenant authentication: `authorization: Bearer <token>` -> [`Tenant`].
//!
//! A tower layer in front of every service. Health stays open (load
//! balancers probe it without credentials); everything else needs a token
//! the [`TokenStore`] knows, or gets UNAUTHENTICATED. The tenant goes into
//! the request's extensions, where handlers read it with [`tenant_of`].
//!
//! With no tokens configured the server runs in single-user mode: every
//! caller holding the server's local token ([`local`]) is tenant
//! [`SINGLE_USER_TENANT`]. Loopback is no credential: every user of the
//! machine and every page in their browser can reach it. `server::start`
//! allows single-user mode only on a loopback address.

pub mod local;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use shared::error::{Error as WireError, ErrorCode};
use shared::secret::{Secret, constant_time_eq};
use tonic::body::Body;

use crate::store::{self, Tenant, TokenStore};

/// Why a call was not let in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token store is not open yet.
    #[error("the server is starting: stores are not ready yet")]
    NotReady,
    /// No token, a malformed one, or one no tenant has.
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        match e {
            Error::NotReady => WireError::new(ErrorCode::Unavailable, e.to_string()),
            Error::Unauthenticated(why) => WireError::new(ErrorCode::Unauthenticated, why),
            Error::Store(e) => e.into(),
        }
    }
}

/// The tenant of every caller in single-user mode.
pub const SINGLE_USER_TENANT: &str = "default";

/// Paths served without a tenant's token: the health service, and the node
/// registry (its calls carry the operator's join token, which the registry
/// checks itself).
const PUBLIC_PREFIXES: &[&str] = &["/grpc.health.v1.Health/", "/sandhold.v1.NodeRegistry/"];

/// How long a verified token is trusted without asking the store again: a
/// deleted token stops working within this time.
const CACHE_TTL: Duration = Duration::from_secs(60);
const CACHE_MAX_ENTRIES: usize = 10_000;

/// Resolves bearer tokens to tenants. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<AuthInner>,
}

struct AuthInner {
    single_user: bool,
    /// Single-user mode: the one token every call must carry, set once the
    /// token file is ready (until then calls are UNAVAILABLE).
    local_token: OnceLock<Secret>,
    /// Set once the stores are open; until then authenticated calls are
    /// UNAVAILABLE.
    tokens: OnceLock<Arc<dyn TokenStore>>,
    /// Verified tokens by SHA-256, bucketed by the digest's first 8 bytes.
    /// The full digest is compared in constant time, so the cache adds no
    /// timing signal beyond the bucket of a guess's hash.
    cache: Mutex<HashMap<u64, Vec<CachedToken>>>,
}

struct CachedToken {
    digest: [u8; 32],
    tenant: Tenant,
    verified_at: Instant,
}

impl Authenticator {
    /// `single_user`: a caller with the local token (see
    /// [`Authenticator::set_local_token`]) is tenant [`SINGLE_USER_TENANT`];
    /// otherwise callers are the tenants of the [`TokenStore`]'s tokens.
    pub fn new(single_user: bool) -> Self {
        Self {
            inner: Arc::new(AuthInner {
                single_user,
                local_token: OnceLock::new(),
                tokens: OnceLock::new(),
                cache: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Start answering from `tokens` (once the stores are up).
    pub fn set_token_store(&self, tokens: Arc<dyn TokenStore>) {
        let _ = self.inner.tokens.set(tokens);
    }

    /// Start answering single-user calls that carry `token`.
    pub fn set_local_token(&self, token: Secret) {
        let _ = self.inner.local_token.set(token);
    }

    /// The token of single-user mode, once set.
    pub fn local_token(&self) -> Option<&Secret> {
        self.inner.local_token.get()
    }

    pub fn single_user(&self) -> bool {
        self.inner.single_user
    }

    /// The tenant of a request with these headers.
    pub async fn authenticate(&self, headers: &http::HeaderMap) -> Result<Tenant, Error> {
        let Some(store) = self.inner.tokens.get() else {
            return Err(Error::NotReady);
        };
        if self.inner.single_user {
            let Some(local) = self.inner.local_token.get() else { return Err(Error::NotReady) };
            let token = bearer_token(headers)?;
            return if constant_time_eq(token.as_bytes(), local.expose().as_bytes()) {
                Ok(Tenant::new(SINGLE_USER_TENANT))
            } else {
                Err(Error::Unauthenticated(
                    "wrong token: a server without API tokens takes the one in the `local-token` file of its \
                     data directory (the sandhold CLI reads it by itself)",
                ))
            };
        }
        let token = bearer_token(headers)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(tenant) = self.cached(&digest) {
            return Ok(tenant);
        }
        match store.tenant_for_token(token).await? {
            Some(tenant) => {
                self.remember(digest, tenant.clone());
                Ok(tenant)
            }
            None => Err(Error::Unauthenticated("unknown API token")),
        }
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Tenant> {
        let cache = self.inner.cache.lock().expect("token cache poisoned");
        cache
            .get(&bucket(digest))?
            .iter()
            .find(|c| constant_time_eq(&c.digest, digest) && c.verified_at.elapsed() < CACHE_TTL)
            .map(|c| c.tenant.clone())
    }

    fn remember(&self, digest: [u8; 32], tenant: Tenant) {
        let mut cache = self.inner.cache.lock().expect("token cache poisoned");
        if cache.len() >= CACHE_MAX_ENTRIES {
            cache.clear();
        }
        let entries = cache.entry(bucket(&digest)).or_default();
        entries.retain(|c| c.verified_at.elapsed() < CACHE_TTL && c.digest != digest);
        entries.push(CachedToken { digest, tenant, verified_at: Instant::now() });
    }
}

fn bucket(digest: &[u8; 32]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

fn bearer_token(headers: &http::HeaderMap) -> Result<&str, Error> {
    let value = headers.get(http::header::AUTHORIZATION).ok_or_else(|| {
        Error::Unauthenticated(
            "missing `authorization: Bearer <token>` metadata (a server without API tokens takes the one in \
             the `local-token` file of its data directory)",
        )
    })?;
    let value = value.to_str().map_err(|_| Error::Unauthenticated("malformed authorization metadata"))?;
    let (scheme, token) =
        value.split_once(' ').ok_or_else(|| Error::Unauthenticated("expected `Bearer <token>`"))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(Error::Unauthenticated("expected `Bearer <token>`"));
    }
    Ok(token)
}

/// The tenant the auth layer attached to a request.
pub fn tenant_of<T>(request: &tonic::Request<T>) -> Result<Tenant, tonic::Status> {
    request
        .extensions()
        .get::<Tenant>()
        .cloned()
        .ok_or_else(|| WireError::internal("request reached a handler without a tenant").into())
}

/// Tower layer that authenticates every call but health.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Authenticator,
}

impl AuthLayer {
    pub fn new(auth: Authenticator) -> Self {
        Self { auth }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService { inner, auth: self.auth.clone() }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Authenticator,
}

impl<S> tower::Service<http::Request<Body>> for AuthService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // Use the instance that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        Box::pin(async move {
            let path = request.uri().path();
            if PUBLIC_PREFIXES.iter().any(|p| path.starts_with(p)) {
                return inner.call(request).await;
            }
            match auth.authenticate(request.headers()).await {
                Ok(tenant) => {
                    tracing::debug!(tenant = %tenant, path = request.uri().path(), "authenticated call");
                    request.extensions_mut().insert(tenant);
                    inner.call(request).await
                }
                Err(err) => Ok(tonic::Status::from(WireError::from(err)).into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token(&headers("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(&headers("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            let err = WireError::from(bearer_token(&headers(bad)).unwrap_err());
            assert_eq!(err.code, ErrorCode::Unauthenticated, "{bad}");
        }
        assert_eq!(
            WireError::from(bearer_token(&http::HeaderMap::new()).unwrap_err()).code,
            ErrorCode::Unauthenticated
        );
    }

    #[tokio::test]
    async fn tokens_resolve_through_the_store_and_the_cache() {
        let stores = crate::store::Stores::open("sqlite::memory:").await.unwrap();
        stores.tokens.put_token(&Tenant::new("acme"), "acme-token-1").await.unwrap();
        let auth = Authenticator::new(false);
        assert_eq!(
            WireError::from(auth.authenticate(&headers("Bearer acme-token-1")).await.unwrap_err()).code,
            ErrorCode::Unavailable,
            "no answers before the stores are ready"
        );
        auth.set_token_store(stores.tokens.clone());
        assert_eq!(auth.authenticate(&headers("Bearer acme-token-1")).await.unwrap(), Tenant::new("acme"));
        // Second time from the cache: still the same tenant.
        assert_eq!(auth.authenticate(&headers("Bearer acme-token-1")).await.unwrap(), Tenant::new("acme"));
        let err = WireError::from(auth.authenticate(&headers("Bearer acme-token-2")).await.unwrap_err());
        assert_eq!(err.code, ErrorCode::Unauthenticated);
    }

    #[tokio::test]
    async fn single_user_mode_lets_in_only_the_local_token() {
        let stores = crate::store::Stores::open("sqlite::memory:").await.unwrap();
        let auth = Authenticator::new(true);
        auth.set_token_store(stores.tokens.clone());
        let err = WireError::from(auth.authenticate(&headers("Bearer x")).await.unwrap_err());
        assert_eq!(err.code, ErrorCode::Unavailable, "no answers before the token file is ready");
        auth.set_local_token(Secret::new("local-token-0123456789abcdef0123456789"));
        let tenant = auth.authenticate(&headers("Bearer local-token-0123456789abcdef0123456789")).await;
        assert_eq!(tenant.unwrap(), Tenant::new(SINGLE_USER_TENANT));
        for refused in [headers("Bearer local-token-0123456789abcdef012345678"), http::HeaderMap::new()] {
            let err = WireError::from(auth.authenticate(&refused).await.unwrap_err());
            assert_eq!(err.code, ErrorCode::Unauthenticated, "{refused:?}");
        }
    }
}
