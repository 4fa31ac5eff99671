//! gpulb: a reverse-proxy load balancer for GPU inference fleets.
pub mod admin;
pub mod backend;
pub mod balance;
pub mod classify;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod headers;
pub mod proxy;
pub mod registry;
pub mod server;
pub mod sim;
