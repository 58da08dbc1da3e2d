//! The `sandhold` binary's allocator: mimalloc, not glibc's. A stream
//! allocates and frees small buffers at every step (a line, a chunk, a
//! row, a frame); on the durable stream mimalloc spends a fifth less user
//! CPU on them and the run peaks lower (docs/benchmarks.md).

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// `mi_option_arena_eager_commit` and `mi_option_purge_delay` in the
/// bundled mimalloc's `mimalloc.h` (v3): the sys crate names neither.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
const PURGE_DELAY: mi_option_t = 15;

/// Arenas committed as they are used, and memory a burst freed given back
/// at once rather than after a second: with mimalloc's defaults the same
/// stream peaks at twice the resident memory (170 MB against 73 MB, and
/// glibc's 90 MB). Call before the first allocation: the first arena is
/// made by it (`main.rs` calls this from `.init_array`).
pub fn tune() {
    // SAFETY: option setters, called before any other thread runs.
    unsafe {
        mi_option_set(ARENA_EAGER_COMMIT, 0);
        mi_option_set(PURGE_DELAY, 0);
    }
}

#[cfg(test)]
mod tests {
    use libmimalloc_sys::mi_option_get;

    use super::*;

    /// The slots are the options meant: each holds its documented default
    /// until set (a sys crate with another numbering fails here), then the
    /// value set.
    #[test]
    fn the_options_set_are_the_ones_named() {
        // SAFETY: option reads and writes; this test's process does not use
        // mimalloc as its allocator, so nothing else reads them.
        unsafe {
            assert_eq!(mi_option_get(ARENA_EAGER_COMMIT), 2, "arena_eager_commit's default");
            assert_eq!(mi_option_get(PURGE_DELAY), 1000, "purge_delay's default (v3)");
            tune();
            assert_eq!(mi_option_get(ARENA_EAGER_COMMIT), 0);
            assert_eq!(mi_option_get(PURGE_DELAY), 0);
        }
    }
}
