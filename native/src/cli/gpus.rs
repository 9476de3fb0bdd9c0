//! `inspect --gpus`: the GPUs each GPU backend would see. The WebGPU adapters (in the order the
//! WebGPU backend prefers them, with the features and limits it depends on), then the Vulkan
//! devices (driver, subgroup sizes, limits, and which specializations the Vulkan backend uses
//! on each, with the one it would pick marked).
//!
//! A machine without Vulkan (no loader, no driver, no device) is an answer, printed with the
//! reason, and exits 0; a Vulkan call that fails is an error (exit 1).

use std::io::Write;

use tinyllm::backend::vulkan::{self, DeviceInfo, Instance};

/// The Vulkan side: the instance's version and the devices, or why there are none.
enum Vulkan {
    Devices { api: String, devices: Vec<DeviceInfo> },
    Absent(String),
}

fn vulkan_devices() -> anyhow::Result<Vulkan> {
    let listed = Instance::new().and_then(|i| Ok((i.api_version().to_string(), i.devices()?)));
    match listed {
        Ok((api, devices)) => Ok(Vulkan::Devices { api, devices }),
        Err(e) if e.is_absent() => Ok(Vulkan::Absent(e.to_string())),
        Err(e) => Err(anyhow::anyhow!("Vulkan: {e}")),
    }
}

pub fn print(json: bool) -> anyhow::Result<()> {
    let adapters = tinyllm::backend::webgpu::list_adapters();
    let vk = vulkan_devices()?;
    let mut o = std::io::stdout().lock();
    if json {
        let list: Vec<serde_json::Value> = adapters
            .iter()
            .map(|a| {
                serde_json::json!({
                    "name": a.name,
                    "backend": a.backend,
                    "device_type": a.device_type,
                    "driver": a.driver,
                    "features": a.features,
                    "limits": a.limits.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        let vulkan = match &vk {
            Vulkan::Devices { api, devices } => {
                let picked = vulkan::pick(devices, None).ok();
                let list = devices
                    .iter()
                    .map(|d| device_json(d, picked == Some(d.index)))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                serde_json::json!({"available": true, "api_version": api, "devices": list})
            }
            Vulkan::Absent(why) => serde_json::json!({"available": false, "reason": why, "devices": []}),
        };
        serde_json::to_writer(&mut o, &serde_json::json!({ "adapters": list, "vulkan": vulkan }))?;
        writeln!(o)?;
        return Ok(());
    }
    writeln!(o, "WebGPU adapters")?;
    if adapters.is_empty() {
        writeln!(
            o,
            "  none (on Linux install a Vulkan driver, e.g. apt-get install mesa-vulkan-drivers)"
        )?;
    }
    for (i, a) in adapters.iter().enumerate() {
        write!(o, "[{i}] {a}")?;
    }
    writeln!(o)?;
    match &vk {
        Vulkan::Absent(why) => writeln!(o, "Vulkan devices\n  none: {why}")?,
        Vulkan::Devices { api, devices } if devices.is_empty() => writeln!(
            o,
            "Vulkan devices (instance API {api})\n  none: the Vulkan drivers report no devices"
        )?,
        Vulkan::Devices { api, devices } => {
            writeln!(o, "Vulkan devices (instance API {api})")?;
            let picked = vulkan::pick(devices, None).ok();
            for d in devices {
                device_text(&mut o, d, picked == Some(d.index))?;
            }
        }
    }
    Ok(())
}

fn device_json(d: &DeviceInfo, picked: bool) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(d)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("specializations".into(), serde_json::to_value(d.specializations())?);
        m.insert("unusable".into(), serde_json::json!(d.unusable()));
        m.insert("default".into(), serde_json::json!(picked));
    }
    Ok(v)
}

fn device_text(o: &mut impl Write, d: &DeviceInfo, picked: bool) -> std::io::Result<()> {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mark = if picked { "  (the Vulkan backend's default)" } else { "" };
    writeln!(o, "[{}] {}{mark}", d.index, d.name)?;
    if let Some(why) = d.unusable() {
        writeln!(o, "  cannot run the backend: {why}")?;
    }
    writeln!(o, "  type                   {}", d.device_type)?;
    writeln!(
        o,
        "  vendor                 {} (0x{:04x}), device 0x{:04x}",
        d.vendor, d.vendor_id, d.device_id
    )?;
    match &d.driver {
        Some(dr) => writeln!(o, "  driver                 {} ({})", dr.name, dr.info)?,
        None => writeln!(o, "  driver                 unknown (no VK_KHR_driver_properties)")?,
    }
    writeln!(o, "  api version            {}", d.api_version)?;
    match d.compute_queue_family {
        Some(f) => writeln!(
            o,
            "  compute queue          family {f}, timestamps {}",
            if d.timestamp_valid_bits == 0 {
                "none".to_string()
            } else {
                format!(
                    "{} bits, {} ns per tick",
                    d.timestamp_valid_bits, d.limits.timestamp_period_ns
                )
            }
        )?,
        None => writeln!(o, "  compute queue          none")?,
    }
    writeln!(o, "  device-local memory    {:.0} MiB", mib(d.device_local_bytes))?;
    let g = &d.subgroups;
    writeln!(
        o,
        "  subgroup size          {} (range {}..{})",
        g.size, g.min_size, g.max_size
    )?;
    writeln!(
        o,
        "  subgroup operations    {}",
        if g.compute_operations.is_empty() {
            "none in compute".to_string()
        } else {
            g.compute_operations.join(" ")
        }
    )?;
    let l = &d.limits;
    writeln!(
        o,
        "  workgroups             at most {}x{}x{}, {} invocations, {} KiB shared memory",
        l.max_workgroup_size[0],
        l.max_workgroup_size[1],
        l.max_workgroup_size[2],
        l.max_workgroup_invocations,
        l.max_shared_memory_bytes / 1024
    )?;
    writeln!(
        o,
        "  storage binding        at most {:.0} MiB",
        mib(u64::from(l.max_storage_buffer_range))
    )?;
    let s = d.specializations();
    let size = if s.subgroup_size.required {
        format!("{} (required)", s.subgroup_size.size)
    } else {
        format!("{} (the device's default, not required)", s.subgroup_size.size)
    };
    writeln!(o, "  kernels' subgroup size {size}")?;
    writeln!(o, "  specializations")?;
    writeln!(o, "    subgroup operations    {}", s.subgroup_operations)?;
    writeln!(o, "    subgroup size control  {}", s.subgroup_size_control)?;
    writeln!(o, "    integer dot product    {}", s.integer_dot_product)?;
    match s.cooperative_matrix_size {
        Some(t) => writeln!(o, "    cooperative matrix     used ({t}x{t}x{t} f16, f32 sums)")?,
        None => writeln!(o, "    cooperative matrix     {}", s.cooperative_matrix)?,
    }
    for shape in &d.cooperative_matrix.shapes {
        writeln!(o, "      {shape}")?;
    }
    writeln!(o, "    shader float16         {}", s.shader_float16)?;
    writeln!(o, "    16-bit storage         {}", s.storage_16bit)?;
    Ok(())
}
