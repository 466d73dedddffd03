//! Integration tests: one target, areas as modules (real processes, files and sockets).

mod util;

mod cli;
mod client;
mod concurrency;
mod core;
mod dylib;
mod exec;
mod http;
mod lifecycle;
mod modules;
mod notices;
mod python;
mod reload;
mod service;
mod trust;
mod webhook;
mod zygote;
