//! Integration tests: one target, areas as modules (real processes, files and sockets).

mod util;

mod cli;
mod client;
mod core;
mod dylib;
mod exec;
mod hardening;
mod http;
mod lifecycle;
mod modules;
mod notices;
mod python;
mod reload;
mod service;
mod trust;
mod webhook;
