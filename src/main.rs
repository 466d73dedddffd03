//! The `hermes-hooks` binary: everything lives in the library's `cli` module.

fn main() {
    std::process::exit(hermes_hooks::cli::main());
}
