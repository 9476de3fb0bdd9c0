//! Finding an adapter and opening a device: which adapters exist (for `inspect --gpus`), which
//! one the backend takes, and the features and limits it checks, each failure a typed error.

use std::fmt;

/// Why no usable device could be opened.
#[derive(Debug, thiserror::Error)]
pub enum WebGpuError {
    #[error(
        "no WebGPU adapter found (on Linux install a Vulkan driver, e.g. Mesa lavapipe: apt-get install mesa-vulkan-drivers)"
    )]
    NoAdapter,
    #[error("adapter index {index} is out of range ({count} adapters; see `inspect --gpus`)")]
    BadAdapterIndex { index: usize, count: usize },
    #[error("adapter '{adapter}' has {limit} = {have}, the backend needs at least {need}")]
    Limit {
        adapter: String,
        limit: &'static str,
        have: u64,
        need: u64,
    },
    #[error("adapter '{adapter}' refused a device: {reason}")]
    RequestDevice { adapter: String, reason: String },
    #[error("kernel {kernel} does not compile on this device: {reason}")]
    Shader { kernel: String, reason: String },
}

/// What `inspect --gpus` shows about one adapter.
#[derive(Debug, Clone)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub features: Vec<String>,
    /// `(name, value)` of the limits the backend depends on.
    pub limits: Vec<(&'static str, u64)>,
}

impl fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} ({}, {}; driver {})",
            self.name, self.backend, self.device_type, self.driver
        )?;
        writeln!(f, "  features: {}", self.features.join(", "))?;
        for (k, v) in &self.limits {
            writeln!(f, "  {k}: {v}")?;
        }
        Ok(())
    }
}

/// The limits the kernels rely on, with the least value each needs.
const REQUIRED: [(&str, u64); 5] = [
    ("max_compute_invocations_per_workgroup", 256),
    ("max_compute_workgroup_size_x", 256),
    ("max_compute_workgroup_storage_size", 8192),
    // Attention binds q, the K and V caches, the output or partials, and the sinks.
    ("max_storage_buffers_per_shader_stage", 5),
    ("max_compute_workgroups_per_dimension", 65535),
];

fn limit_list(l: &wgpu::Limits) -> Vec<(&'static str, u64)> {
    let u = u64::from;
    vec![
        ("max_storage_buffer_binding_size", l.max_storage_buffer_binding_size),
        ("max_buffer_size", l.max_buffer_size),
        (
            "max_compute_invocations_per_workgroup",
            u(l.max_compute_invocations_per_workgroup),
        ),
        ("max_compute_workgroup_size_x", u(l.max_compute_workgroup_size_x)),
        (
            "max_compute_workgroup_storage_size",
            u(l.max_compute_workgroup_storage_size),
        ),
        (
            "max_storage_buffers_per_shader_stage",
            u(l.max_storage_buffers_per_shader_stage),
        ),
        (
            "max_compute_workgroups_per_dimension",
            u(l.max_compute_workgroups_per_dimension),
        ),
        (
            "min_uniform_buffer_offset_alignment",
            u(l.min_uniform_buffer_offset_alignment),
        ),
        (
            "min_storage_buffer_offset_alignment",
            u(l.min_storage_buffer_offset_alignment),
        ),
    ]
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Adapters in preference order: discrete, integrated, virtual, then CPU (lavapipe) ones.
async fn adapters() -> Vec<wgpu::Adapter> {
    let mut list = instance().enumerate_adapters(wgpu::Backends::all()).await;
    list.sort_by_key(|a| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    });
    list
}

fn report(a: &wgpu::Adapter) -> AdapterReport {
    let info = a.get_info();
    let mut features: Vec<String> = a.features().iter_names().map(|(n, _)| n.to_lowercase()).collect();
    features.sort();
    // Browsers often leave the name empty (privacy); the driver string says what runs.
    let driver = format!("{} {}", info.driver, info.driver_info).trim().to_string();
    let name = if info.name.is_empty() {
        format!("{:?} adapter {}", info.backend, driver).trim().to_string()
    } else {
        info.name
    };
    AdapterReport {
        name,
        backend: format!("{:?}", info.backend).to_lowercase(),
        device_type: format!("{:?}", info.device_type),
        driver,
        features,
        limits: limit_list(&a.limits()),
    }
}

/// Every adapter wgpu finds, in the order the backend prefers them (native: blocks).
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters() -> Vec<AdapterReport> {
    pollster::block_on(adapters()).iter().map(report).collect()
}

/// An open device and what the backend needs to know about it.
#[derive(Clone)]
pub struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: AdapterReport,
    pub limits: wgpu::Limits,
    /// Smallest and largest subgroup size of the adapter.
    pub subgroup_sizes: (u32, u32),
}

impl Context {
    /// Open the preferred adapter, or adapter `index` of the list in preference order; without
    /// shader-f16 if `no_f16`.
    pub async fn open(index: Option<usize>, no_f16: bool) -> Result<Self, WebGpuError> {
        let mut list = adapters().await;
        let count = list.len();
        let adapter = match index {
            Some(i) if i >= count => return Err(WebGpuError::BadAdapterIndex { index: i, count }),
            Some(i) => list.swap_remove(i),
            None if count == 0 => return Err(WebGpuError::NoAdapter),
            None => list.swap_remove(0),
        };
        let rep = report(&adapter);
        let info = adapter.get_info();
        let subgroup_sizes = (info.subgroup_min_size, info.subgroup_max_size);
        let have = rep.limits.clone();
        for (limit, need) in REQUIRED {
            let v = have.iter().find(|(k, _)| *k == limit).map_or(0, |(_, v)| *v);
            if v < need {
                return Err(WebGpuError::Limit {
                    adapter: rep.name.clone(),
                    limit,
                    have: v,
                    need,
                });
            }
        }
        // Ask for everything the adapter offers: large weights want the largest bindings.
        let limits = adapter.limits();
        let mut wanted = wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16;
        if no_f16 {
            wanted.remove(wgpu::Features::SHADER_F16);
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("tinyllm"),
                // Subgroup operations let the CPU-adapter matmul share activation loads across lanes.
                required_features: adapter.features() & wanted,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| WebGpuError::RequestDevice {
                adapter: rep.name.clone(),
                reason: e.to_string(),
            })?;
        Ok(Context {
            device,
            queue,
            adapter: rep,
            limits,
            subgroup_sizes,
        })
    }
}
