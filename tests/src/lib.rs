//! Support for tests that need outside services or the real binaries.
//!
//! Tests that need PostgreSQL, Redis or Docker ask this crate for them. When
//! the service is missing they skip (plain `cargo test` on a laptop), except
//! when `SANDHOLD_REQUIRE_SERVICES=1` (set by `scripts/test`): then a missing
//! service is a failure, so CI can never pass by skipping.

pub mod auth;
pub mod services;
