//! GPU readings straight from NVML (`libnvidia-ml.so.1`) for a proxy or agent beside the GPUs.
//!
//! NVML is initialised once per process, lazily; when the library or driver is missing every
//! read returns [`TelemetryError::NvmlUnavailable`] at once. Calls block: run them off the
//! async runtime (`tokio::task::spawn_blocking`).

use std::sync::OnceLock;

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{GpuReading, GpuSelector, TelemetryError};

/// One GPU as NVML describes it: the reading plus what the agent's labels need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceReading {
    /// The figures read.
    pub reading: GpuReading,
    /// Product name, e.g. `NVIDIA H200`.
    pub model_name: Option<String>,
    /// PCI bus id, e.g. `00000000:31:00.0`.
    pub pci_bus_id: Option<String>,
}

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

/// The process-wide NVML handle, initialised on first use; the error says why it is missing.
pub fn handle() -> Result<&'static Nvml, TelemetryError> {
    NVML.get_or_init(|| Nvml::init().map_err(|e| unavailable_reason(&e)))
        .as_ref()
        .map_err(|reason| TelemetryError::NvmlUnavailable(reason.clone()))
}

/// Reads the selected GPUs (empty = every GPU on the host).
pub fn read_gpus(gpus: &[GpuSelector]) -> Result<Vec<GpuReading>, TelemetryError> {
    Ok(read_devices(gpus)?.into_iter().map(|d| d.reading).collect())
}

/// Like [`read_gpus`], with each GPU's name and PCI bus id.
pub fn read_devices(gpus: &[GpuSelector]) -> Result<Vec<DeviceReading>, TelemetryError> {
    let nvml = handle()?;
    let selectors: Vec<GpuSelector> = if gpus.is_empty() {
        let count = nvml.device_count().map_err(call_error)?;
        (0..count).map(GpuSelector::Index).collect()
    } else {
        gpus.to_vec()
    };
    selectors
        .iter()
        .map(|selector| {
            let device = match selector {
                GpuSelector::Index(i) => nvml.device_by_index(*i),
                GpuSelector::Uuid(u) => nvml.device_by_uuid(u.as_str()),
            }
            .map_err(|e| match e {
                NvmlError::InvalidArg | NvmlError::NotFound => {
                    TelemetryError::GpuNotFound(selector.to_string())
                }
                other => call_error(other),
            })?;
            read_device(&device)
        })
        .collect()
}

/// Reads one device; a figure the board does not support stays `None`.
fn read_device(device: &Device<'_>) -> Result<DeviceReading, TelemetryError> {
    let memory = optional(device.memory_info())?;
    let reading = GpuReading {
        index: optional(device.index())?,
        uuid: optional(device.uuid())?,
        utilization: optional(device.utilization_rates())?
            .map(|u| (f64::from(u.gpu) / 100.0).min(1.0)),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        temperature_celsius: optional(device.temperature(TemperatureSensor::Gpu))?.map(f64::from),
        power_watts: optional(device.power_usage())?.map(|mw| f64::from(mw) / 1000.0),
    };
    Ok(DeviceReading {
        reading,
        model_name: optional(device.name())?,
        pci_bus_id: optional(device.pci_info())?.map(|p| p.bus_id),
    })
}

/// A lost GPU fails the read; any other per-figure error leaves that figure unknown.
fn optional<T>(result: Result<T, NvmlError>) -> Result<Option<T>, TelemetryError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e @ (NvmlError::GpuLost | NvmlError::Uninitialized | NvmlError::DriverNotLoaded)) => {
            Err(call_error(e))
        }
        Err(_) => Ok(None),
    }
}

fn call_error(e: NvmlError) -> TelemetryError {
    match e {
        NvmlError::DriverNotLoaded | NvmlError::NoPermission | NvmlError::LibraryNotFound => {
            TelemetryError::NvmlUnavailable(unavailable_reason(&e))
        }
        other => TelemetryError::Nvml(other.to_string()),
    }
}

/// One readable line saying why NVML cannot be used.
fn unavailable_reason(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => {
            format!("cannot load the NVIDIA driver library ({inner}); no NVIDIA GPU or driver on this host?")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to query the GPUs".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_every_read_is_a_clear_error_not_a_number() {
        // This test machine has no NVIDIA driver; on a GPU host it checks the readings instead.
        match read_gpus(&[]) {
            Err(TelemetryError::NvmlUnavailable(reason)) => {
                assert!(!reason.is_empty());
                // Cheap the second time: the failed init is remembered.
                let again = read_gpus(&[GpuSelector::Index(0)]);
                assert_eq!(again, Err(TelemetryError::NvmlUnavailable(reason)));
            }
            Err(other) => panic!("unexpected NVML error: {other}"),
            Ok(gpus) => {
                for g in gpus {
                    assert!(g.index.is_some() && g.uuid.is_some());
                    assert!(g.utilization.is_none_or(|u| (0.0..=1.0).contains(&u)));
                    assert!(g.memory_fraction().is_none_or(|f| (0.0..=1.0).contains(&f)));
                }
            }
        }
    }
}
