//! The `hermes-hooks` binary: everything lives in the library's `cli` module.

/// mimalloc instead of the C library's allocator: the service allocates and frees small
/// objects on one runtime thread and another (an event's JSON, its queue entry, a broker
/// message), which glibc's per-thread arenas handle poorly; the fleet worker spent about a
/// quarter of its CPU in malloc and free (BENCHMARKS.md, issue 21). Hook code loaded into the
/// process (a dylib handler) keeps using its own allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(hermes_hooks::cli::main());
}
