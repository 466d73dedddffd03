//! Integration tests: one target, areas as modules (real processes, files and sockets).

mod util;

mod core;
