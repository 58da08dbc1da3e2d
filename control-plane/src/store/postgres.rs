//! The postgres backend (being built; the contract in `super` is final).

use super::{Error, Result, Stores};

pub(super) async fn open(_database_url: &str) -> Result<Stores> {
    Err(Error::Unavailable("the postgres store backend is not built yet".into()))
}
