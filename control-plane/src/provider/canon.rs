//! The canonical encoding a sandbox key is the hash of (see
//! `sandbox::key`). It lives here so that a provider writes its own section
//! of a definition into a key ([`super::Kind::key`]).

use std::collections::BTreeMap;

/// Canonical bytes under construction.
#[derive(Default)]
pub struct Canon(Vec<u8>);

impl Canon {
    pub fn bytes(&mut self, tag: &str, value: &[u8]) -> &mut Self {
        self.raw(tag.as_bytes());
        self.raw(value);
        self
    }

    fn raw(&mut self, value: &[u8]) {
        self.0.extend_from_slice(&(value.len() as u64).to_be_bytes());
        self.0.extend_from_slice(value);
    }

    pub fn str(&mut self, tag: &str, value: &str) -> &mut Self {
        self.bytes(tag, value.as_bytes())
    }

    pub fn num(&mut self, tag: &str, value: impl ToString) -> &mut Self {
        self.str(tag, &value.to_string())
    }

    pub fn absent(&mut self, tag: &str) -> &mut Self {
        self.str(tag, "-")
    }

    pub fn nested(&mut self, tag: &str, inner: Canon) -> &mut Self {
        self.bytes(tag, &inner.0)
    }

    pub fn map<'a>(
        &mut self,
        tag: &str,
        entries: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> &mut Self {
        let sorted: BTreeMap<&String, &String> = entries.into_iter().collect();
        let mut inner = Canon::default();
        inner.num("len", sorted.len());
        for (k, v) in sorted {
            inner.str("k", k).str("v", v);
        }
        self.nested(tag, inner)
    }

    pub fn list<T>(&mut self, tag: &str, items: &[T], each: impl Fn(&T) -> Canon) -> &mut Self {
        let mut inner = Canon::default();
        inner.num("len", items.len());
        for item in items {
            inner.nested("item", each(item));
        }
        self.nested(tag, inner)
    }
}

impl Canon {
    /// The bytes written so far.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}
