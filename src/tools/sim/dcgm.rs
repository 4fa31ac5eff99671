//! dcgm-exporter-style GPU telemetry of a simulated worker (`GET /dcgm/metrics`).
//!
//! The simulated GPU has 80 GiB: model weights take a fixed share, the KV cache's share grows
//! with the engine's KV use, and utilization follows running / max_running.

use std::sync::atomic::{AtomicU64, Ordering};

use super::engine::EngineState;
use crate::telemetry::nvml::DeviceReading;
use crate::telemetry::GpuReading;

/// Memory of the simulated GPU, bytes.
pub const GPU_MEMORY_BYTES: u64 = 80 << 30;
/// Share of memory the model weights take.
const WEIGHTS_SHARE: f64 = 0.45;
/// Share of memory reserved for the KV cache (used in proportion to KV use).
const KV_SHARE: f64 = 0.45;
/// Product name reported in the `modelName` label.
const MODEL_NAME: &str = "NVIDIA H100 80GB HBM3 (simulated)";

/// The GPU identity and knobs of one worker.
#[derive(Debug)]
pub(crate) struct SimGpu {
    /// NVML-style index (`gpu` label).
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Slot count the utilization is measured against.
    pub max_running: usize,
    /// Forced used-memory fraction as f64 bits; NaN bits = none.
    memory_override: AtomicU64,
}

impl SimGpu {
    /// A GPU with no memory override.
    pub fn new(index: u32, uuid: String, max_running: usize) -> Self {
        SimGpu {
            index,
            uuid,
            max_running: max_running.max(1),
            memory_override: AtomicU64::new(f64::NAN.to_bits()),
        }
    }

    /// Forces the used-memory fraction (clamped to 0..=1), or returns to the model.
    pub fn set_memory_override(&self, fraction: Option<f64>) {
        let v = fraction
            .filter(|f| !f.is_nan())
            .map_or(f64::NAN, |f| f.clamp(0.0, 1.0));
        self.memory_override.store(v.to_bits(), Ordering::Relaxed);
    }

    fn memory_override(&self) -> Option<f64> {
        let v = f64::from_bits(self.memory_override.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }

    /// The GPU as the engine's state makes it look now.
    pub fn reading(&self, st: &EngineState, kv_budget: usize) -> DeviceReading {
        let running = st.running.load(Ordering::Relaxed) as f64;
        let util = (running / self.max_running as f64).clamp(0.0, 1.0);
        let kv = if kv_budget == 0 {
            0.0
        } else {
            (st.kv_used.load(Ordering::Relaxed) as f64 / kv_budget as f64).clamp(0.0, 1.0)
        };
        let fraction = self
            .memory_override()
            .unwrap_or(WEIGHTS_SHARE + KV_SHARE * kv);
        DeviceReading {
            reading: GpuReading {
                index: Some(self.index),
                uuid: Some(self.uuid.clone()),
                utilization: Some(util),
                memory_used_bytes: Some((GPU_MEMORY_BYTES as f64 * fraction) as u64),
                memory_total_bytes: Some(GPU_MEMORY_BYTES),
                temperature_celsius: Some(30.0 + 45.0 * util),
                power_watts: Some(70.0 + 630.0 * util),
            },
            model_name: Some(MODEL_NAME.to_string()),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + (self.index % 0xE0))),
        }
    }
}

/// Renders the dcgm-exporter page; `Hostname` is the worker's name.
pub(crate) fn render(gpu: &SimGpu, st: &EngineState, kv_budget: usize, worker: &str) -> String {
    crate::tools::agent::render(&[gpu.reading(st, kv_budget)], worker)
}

/// A stable UUID-shaped id derived from the worker name (FNV-1a, twice).
pub(crate) fn uuid_for(name: &str) -> String {
    let fnv = |seed: u64| {
        name.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
        })
    };
    let hi = fnv(0xcbf2_9ce4_8422_2325);
    let lo = fnv(0x84222325_cbf29ce4);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{parse_dcgm, GpuSelector};

    #[test]
    fn page_reads_back_through_the_dcgm_parser() {
        let gpu = SimGpu::new(2, uuid_for("w0"), 4);
        let st = EngineState::default();
        st.running.store(2, Ordering::Relaxed);
        st.kv_used.store(50, Ordering::Relaxed);
        let text = render(&gpu, &st, 100, "w0");
        assert!(text.contains(
            ",device=\"nvidia2\",modelName=\"NVIDIA H100 80GB HBM3 (simulated)\",Hostname=\"w0\"}"
        ));
        let r = parse_dcgm(&text, &[GpuSelector::Uuid(uuid_for("w0"))]).expect("parses");
        let g = &r.gpus[0];
        assert_eq!((g.index, g.utilization), (Some(2), Some(0.5)));
        assert_eq!(g.temperature_celsius, Some(53.0)); // 30 + 45 * 0.5, rounded
        assert_eq!(g.power_watts, Some(385.0));
        assert_eq!(g.memory_total_bytes, Some(GPU_MEMORY_BYTES));
        let f = g.memory_fraction().expect("known");
        assert!((f - 0.675).abs() < 1e-4, "{f}");

        gpu.set_memory_override(Some(0.97));
        let r = parse_dcgm(&render(&gpu, &st, 100, "w0"), &[]).expect("parses");
        let f = r.gpus[0].memory_fraction().expect("known");
        assert!((f - 0.97).abs() < 1e-4, "{f}");
        gpu.set_memory_override(None);
        let r = parse_dcgm(&render(&gpu, &st, 100, "w0"), &[]).expect("parses");
        assert!((r.gpus[0].memory_fraction().expect("known") - 0.675).abs() < 1e-4);
    }

    #[test]
    fn uuids_are_stable_and_distinct() {
        assert_eq!(uuid_for("a"), uuid_for("a"));
        assert_ne!(uuid_for("a"), uuid_for("b"));
        assert_eq!(
            uuid_for("a").len(),
            "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c".len()
        );
    }
}
