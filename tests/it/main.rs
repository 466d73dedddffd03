//! Integration tests: one target, areas as modules (real processes, files and sockets).

mod util;

mod accounts;
mod agent_hooks;
mod agent_ops;
mod cli;
mod client;
mod completions;
mod concurrency;
mod contrib;
mod core;
mod dashboard;
#[cfg(feature = "fleet")]
mod dead_api;
mod decisions;
mod docs;
mod dropin;
mod dylib;
mod exec;
mod first_hour;
#[cfg(feature = "fleet")]
mod fleet;
#[cfg(feature = "fleet")]
mod fleet_held;
#[cfg(feature = "fleet")]
mod fleet_killed;
#[cfg(feature = "fleet")]
mod fleet_owed;
#[cfg(feature = "fleet")]
mod fleet_pause;
#[cfg(feature = "fleet")]
mod fleet_repeats;
#[cfg(feature = "fleet")]
mod fleet_restart;
#[cfg(feature = "fleet")]
mod fleet_roll;
#[cfg(feature = "fleet")]
mod fleet_tp;
mod fuzz;
mod gateway;
mod handover;
mod hardening;
mod hostile;
mod hostile_api;
mod hostile_boundary;
mod http;
mod lease;
mod lifecycle;
mod loss;
mod modules;
#[cfg(feature = "fleet")]
mod nemesis;
mod notices;
mod openapi;
mod packages;
mod priority;
mod python;
mod real_gateway;
mod reload;
mod sandbox;
mod script_runner;
mod service;
mod stall;
mod trust;
mod trust_holds;
mod trust_round2;
mod webhook;
mod wheel;
mod zygote;
