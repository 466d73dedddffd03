//! Integration tests: one target, areas as modules (real processes, files and sockets).

mod util;

mod cli;
mod core;
mod exec;
mod http;
mod python;
mod reload;
mod trust;
mod webhook;
