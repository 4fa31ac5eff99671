//! GPU readings from a dcgm-exporter (or `gpulb agent`) scrape, picked by index or UUID.
//!
//! dcgm-exporter reports utilization in percent and framebuffer memory in MiB, and has no
//! total-memory series by default: total = used + free (+ reserved when present).

use std::collections::BTreeMap;

use super::model_server::usable;
use super::prom_text::{self, Sample, Scrape};
use super::{GpuReading, GpuSelector, Reading, TelemetryError};

/// GPU utilization, percent.
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
/// Framebuffer memory used, MiB.
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Framebuffer memory free, MiB.
pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
/// Framebuffer memory reserved by the driver, MiB.
pub const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
/// GPU temperature, °C.
pub const GPU_TEMP: &str = "DCGM_FI_DEV_GPU_TEMP";
/// Power draw, W.
pub const POWER_USAGE: &str = "DCGM_FI_DEV_POWER_USAGE";

/// The series read, all per GPU.
const FIELDS: [&str; 6] = [
    GPU_UTIL,
    FB_USED,
    FB_FREE,
    FB_RESERVED,
    GPU_TEMP,
    POWER_USAGE,
];
const MIB: f64 = 1024.0 * 1024.0;
/// DCGM marks blank fields with huge integers (about 9.2e18); such values mean "no data".
const BLANK_SENTINEL: f64 = 9.0e18;

/// Parses a dcgm-exporter page; `gpus` picks GPUs (empty = every GPU in the scrape).
pub fn parse_dcgm(text: &str, gpus: &[GpuSelector]) -> Result<Reading, TelemetryError> {
    let scrape = prom_text::parse(text)?;
    select(&scrape, gpus)
}

/// Figures of one GPU collected from the scrape, before units are converted.
#[derive(Default)]
struct Raw {
    uuid: Option<String>,
    util_pct: Option<f64>,
    used_mib: Option<f64>,
    free_mib: Option<f64>,
    reserved_mib: Option<f64>,
    temp: Option<f64>,
    power: Option<f64>,
}

/// The GPUs of a parsed scrape that `gpus` selects, in the order selected (else by index).
pub fn select(scrape: &Scrape, gpus: &[GpuSelector]) -> Result<Reading, TelemetryError> {
    let all = collect(scrape);
    if all.is_empty() {
        return Err(TelemetryError::NoSeries {
            what: "DCGM_FI_DEV_* GPU".to_string(),
        });
    }
    let mut picked = Vec::new();
    if gpus.is_empty() {
        picked.extend(all.iter().map(|(index, raw)| convert(*index, raw)));
    } else {
        for selector in gpus {
            let found = all.iter().find(|(index, raw)| match selector {
                GpuSelector::Index(i) => *index == Some(*i),
                GpuSelector::Uuid(u) => {
                    raw.uuid.as_ref().is_some_and(|x| x.eq_ignore_ascii_case(u))
                }
            });
            let (index, raw) =
                found.ok_or_else(|| TelemetryError::GpuNotFound(selector.to_string()))?;
            picked.push(convert(*index, raw));
        }
    }
    Ok(Reading {
        gpus: picked,
        server: None,
    })
}

/// Groups the DCGM series by GPU (`gpu` label; `UUID`/`uuid`), ordered by index.
fn collect(scrape: &Scrape) -> Vec<(Option<u32>, Raw)> {
    let mut by_gpu: BTreeMap<(Option<u32>, Option<String>), Raw> = BTreeMap::new();
    for sample in &scrape.samples {
        if !FIELDS.contains(&sample.name.as_str()) {
            continue;
        }
        let index = sample.label("gpu").and_then(|g| g.parse::<u32>().ok());
        let uuid = sample.label_ignore_case("uuid").map(str::to_string);
        if index.is_none() && uuid.is_none() {
            continue; // not attributable to a GPU
        }
        let raw = by_gpu.entry((index, uuid.clone())).or_default();
        raw.uuid = uuid;
        let Some(v) = value(sample) else { continue };
        // MIG instances of one GPU each report a share of its memory: add those up;
        // for rates and temperatures the busiest / hottest wins.
        match sample.name.as_str() {
            FB_USED => add(&mut raw.used_mib, v),
            FB_FREE => add(&mut raw.free_mib, v),
            FB_RESERVED => add(&mut raw.reserved_mib, v),
            GPU_UTIL => keep_max(&mut raw.util_pct, v),
            GPU_TEMP => keep_max(&mut raw.temp, v),
            _ => keep_max(&mut raw.power, v),
        }
    }
    by_gpu
        .into_iter()
        .map(|((index, _), raw)| (index, raw))
        .collect()
}

fn add(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

fn keep_max(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.map_or(v, |old| old.max(v)));
}

fn value(sample: &Sample) -> Option<f64> {
    usable(sample.value).filter(|v| *v < BLANK_SENTINEL)
}

fn convert(index: Option<u32>, raw: &Raw) -> GpuReading {
    let bytes = |mib: f64| (mib * MIB).round() as u64;
    let total = match (raw.used_mib, raw.free_mib) {
        (Some(used), Some(free)) => Some(used + free + raw.reserved_mib.unwrap_or(0.0)),
        _ => None,
    };
    GpuReading {
        index,
        uuid: raw.uuid.clone(),
        utilization: raw.util_pct.map(|p| (p / 100.0).min(1.0)),
        memory_used_bytes: raw.used_mib.map(bytes),
        memory_total_bytes: total.map(bytes),
        temperature_celsius: raw.temp,
        power_watts: raw.power,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: &str = "UUID=\"GPU-a\",pci_bus_id=\"00000000:31:00.0\",device=\"nvidia0\",modelName=\"X\",Hostname=\"h\"";

    #[test]
    fn converts_units_and_computes_total() {
        let text = format!(
            "{GPU_UTIL}{{gpu=\"0\",{L}}} 50\n{FB_USED}{{gpu=\"0\",{L}}} 1024\n\
             {FB_FREE}{{gpu=\"0\",{L}}} 3072\n{FB_RESERVED}{{gpu=\"0\",{L}}} 512\n\
             {GPU_TEMP}{{gpu=\"0\",{L}}} 40\n{POWER_USAGE}{{gpu=\"0\",{L}}} 16.365000\n"
        );
        let r = parse_dcgm(&text, &[]).expect("reads");
        let g = &r.gpus[0];
        assert_eq!(g.index, Some(0));
        assert_eq!(g.uuid.as_deref(), Some("GPU-a"));
        assert_eq!(g.utilization, Some(0.5));
        assert_eq!(g.memory_used_bytes, Some(1 << 30));
        assert_eq!(g.memory_total_bytes, Some(4608 << 20));
        assert_eq!(g.temperature_celsius, Some(40.0));
        assert_eq!(g.power_watts, Some(16.365));
        assert_eq!(r.server, None);
    }

    #[test]
    fn blank_sentinel_and_missing_free_mean_unknown() {
        let text = format!(
            "{GPU_TEMP}{{gpu=\"1\",uuid=\"GPU-b\"}} 9223372036854775794\n{FB_USED}{{gpu=\"1\",uuid=\"GPU-b\"}} 10\n"
        );
        let r = parse_dcgm(&text, &[GpuSelector::Uuid("gpu-B".into())]).expect("reads");
        let g = &r.gpus[0];
        assert_eq!((g.index, g.temperature_celsius), (Some(1), None));
        assert_eq!(g.memory_used_bytes, Some(10 << 20));
        assert_eq!(g.memory_total_bytes, None);
        assert_eq!(g.memory_fraction(), None);
    }

    #[test]
    fn selects_by_index_and_uuid_in_order_and_reports_missing() {
        let text = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\"} 10\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-b\"} 20\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"2\",UUID=\"GPU-c\"} 30\n";
        let r = parse_dcgm(
            text,
            &[GpuSelector::Uuid("GPU-c".into()), GpuSelector::Index(0)],
        )
        .expect("reads");
        let util: Vec<_> = r.gpus.iter().map(|g| g.utilization).collect();
        assert_eq!(util, [Some(0.3), Some(0.1)]);
        assert_eq!(parse_dcgm(text, &[]).map(|r| r.gpus.len()), Ok(3));
        assert_eq!(
            parse_dcgm(text, &[GpuSelector::Index(7)]),
            Err(TelemetryError::GpuNotFound("7".into()))
        );
        assert!(matches!(
            parse_dcgm("other_metric 1\n", &[]),
            Err(TelemetryError::NoSeries { .. })
        ));
    }

    #[test]
    fn mig_instances_add_memory_and_take_max_utilization() {
        let text = "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-a\",GPU_I_ID=\"1\"} 100\n\
                    DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-a\",GPU_I_ID=\"2\"} 300\n\
                    DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"GPU-a\",GPU_I_ID=\"1\"} 100\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",GPU_I_ID=\"1\"} 5\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",GPU_I_ID=\"2\"} 70\n";
        let r = parse_dcgm(text, &[]).expect("reads");
        assert_eq!(r.gpus.len(), 1);
        assert_eq!(r.gpus[0].memory_used_bytes, Some(400 << 20));
        assert_eq!(r.gpus[0].memory_total_bytes, Some(500 << 20));
        assert_eq!(r.gpus[0].utilization, Some(0.7));
    }
}
