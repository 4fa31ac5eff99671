//! Tools beside the proxy: the simulated GPU worker, the demo fleet and the NVML agent.

pub mod agent;
pub mod demo;
pub mod sim;
