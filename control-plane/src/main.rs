//! `sandhold`: the control plane server and its command-line client.
//! Everything lives in the library; see `control_plane::cli`.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(target_os = "linux")]
extern "C" fn tune_allocator() {
    control_plane::allocator::tune();
}

/// Before `main` and before the first allocation (see [`control_plane::allocator::tune`]).
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

fn main() -> std::process::ExitCode {
    control_plane::cli::main()
}
