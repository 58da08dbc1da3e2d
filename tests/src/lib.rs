//! Helpers for end-to-end tests: start the real binaries in a temp dir on
//! random sockets, keep their logs for failures.
