//! The pipeline cache on disk: compiling a kernel's SPIR-V to the device's code is most of a
//! cold start (hundreds of variants), and drivers can hand that work back as opaque data.
//! Kept at `~/.cache/tinyllm/pipelines/` (or `$TINYLLM_PIPELINES`), one file per device and
//! driver, named by vendor, device, driver version and the driver's `pipelineCacheUUID`, so a
//! driver update starts a new file instead of feeding the driver data it cannot use.
//!
//! The file is untrusted input: its header (Vulkan's `VkPipelineCacheHeaderVersionOne`) must
//! name this device and UUID, and it is read only up to [`MAX_CACHE_BYTES`]; anything else is
//! ignored (a cold start, said in [`PipelineCache::loaded`]), never an error. Drivers check
//! the data again themselves. Saving writes a temporary file and renames it, so a crash never
//! leaves half a cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ash::vk;

use super::device::{Device, DeviceInfo};
use crate::backend::vulkan::error::VulkanError;

/// The largest cache file read (a few hundred pipelines take a few MiB).
pub const MAX_CACHE_BYTES: u64 = 256 << 20;

/// Where the cache files live: `$TINYLLM_PIPELINES`, else `~/.cache/tinyllm/pipelines`.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TINYLLM_PIPELINES") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tinyllm/pipelines"))
}

/// The cache file's name for a device: vendor, device, driver version, pipeline cache UUID.
pub fn file_name(info: &DeviceInfo) -> String {
    let uuid: String = info.pipeline_cache_uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{:04x}-{:04x}-{:08x}-{uuid}.bin",
        info.vendor_id, info.device_id, info.driver_version
    )
}

/// Whether `data` starts with a version-one header for this device (Vulkan spec, "Pipeline
/// Cache": header length 32, version 1, vendor ID, device ID, then the 16-byte UUID).
pub fn header_matches(data: &[u8], info: &DeviceInfo) -> bool {
    let word = |i: usize| {
        data.get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    data.len() >= 32
        && word(0) == Some(32)
        && word(1) == Some(1)
        && word(2) == Some(info.vendor_id)
        && word(3) == Some(info.device_id)
        && data[16..32] == info.pipeline_cache_uuid
}

/// A `VkPipelineCache`, seeded from its file where one fits this device.
pub struct PipelineCache {
    device: Arc<Device>,
    raw: vk::PipelineCache,
    path: Option<PathBuf>,
    loaded: usize,
}

impl PipelineCache {
    /// The cache of `device` under `dir` (`None`: in memory only).
    pub fn open(device: &Arc<Device>, dir: Option<&Path>) -> Result<Self, VulkanError> {
        let path = dir.map(|d| d.join(file_name(device.info())));
        let seed = path
            .as_deref()
            .and_then(|p| read_seed(p, device.info()))
            .unwrap_or_default();
        let info = vk::PipelineCacheCreateInfo::default().initial_data(&seed);
        // SAFETY: `info` and `seed` live across the call; a seed whose header does not match
        // was dropped above, and drivers validate the rest.
        let raw = unsafe { device.raw().create_pipeline_cache(&info, None) }
            .map_err(|e| VulkanError::failed("vkCreatePipelineCache", e))?;
        Ok(Self {
            device: Arc::clone(device),
            raw,
            path,
            loaded: seed.len(),
        })
    }

    pub fn raw(&self) -> vk::PipelineCache {
        self.raw
    }

    /// Bytes of cache data read from disk at open (0: a cold start).
    pub fn loaded(&self) -> usize {
        self.loaded
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Write the cache's data to its file (nothing for an in-memory cache); returns the bytes
    /// written.
    pub fn save(&self) -> Result<usize, VulkanError> {
        let Some(path) = &self.path else { return Ok(0) };
        // SAFETY: the cache is live; no pipeline is being created with it (`&self` callers
        // create pipelines through `Pipelines`, which holds `&mut` while it does).
        let data = unsafe { self.device.raw().get_pipeline_cache_data(self.raw) }
            .map_err(|e| VulkanError::failed("vkGetPipelineCacheData", e))?;
        let io = |what: &str, e: std::io::Error| VulkanError::Unsupported {
            kernel: "pipeline cache".into(),
            problem: format!("cannot {what} {}: {e}", path.display()),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", e))?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &data).map_err(|e| io("write", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("rename into", e))?;
        Ok(data.len())
    }
}

/// The file's data if it is there, within [`MAX_CACHE_BYTES`] and made for this device.
fn read_seed(path: &Path, info: &DeviceInfo) -> Option<Vec<u8>> {
    let len = std::fs::metadata(path).ok()?.len();
    if len > MAX_CACHE_BYTES {
        return None;
    }
    let data = std::fs::read(path).ok()?;
    header_matches(&data, info).then_some(data)
}

impl Drop for PipelineCache {
    fn drop(&mut self) {
        // SAFETY: pipelines made with the cache do not need it to live on; null is a no-op.
        unsafe { self.device.raw().destroy_pipeline_cache(self.raw, None) };
    }
}
