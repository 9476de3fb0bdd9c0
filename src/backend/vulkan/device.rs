//! The Vulkan devices of this machine and the one the backend runs on.
//!
//! [`Instance`] opens the Vulkan loader at run time and describes every physical device as a
//! plain [`DeviceInfo`] (what `inspect --gpus` prints, and what every decision below is made
//! from); [`DeviceInfo::specializations`] decides, as a pure function of that description, which
//! of the optional paths the backend would use on the device (a required subgroup size,
//! integer dot products, cooperative matrices, f16), each with its fallback; [`pick`] chooses a
//! device; [`Device`] is the logical device with its compute queue and exactly those features
//! enabled, destroyed on drop. Keeping the description plain data lets the rules be unit-tested
//! over made-up devices (an AMD wave64 card, an NVIDIA one) that no test machine has.

use std::ffi::{c_char, CStr};
use std::fmt;

use ash::vk;
use serde::Serialize;

use crate::backend::gpu::kernels;
use crate::backend::vulkan::error::VulkanError;

/// PCI vendor ids (and Khronos' ids for vendors without one) of the vendors named in reports.
pub const VENDOR_AMD: u32 = 0x1002;
pub const VENDOR_NVIDIA: u32 = 0x10de;
pub const VENDOR_INTEL: u32 = 0x8086;
pub const VENDOR_APPLE: u32 = 0x106b;
pub const VENDOR_ARM: u32 = 0x13b5;
pub const VENDOR_QUALCOMM: u32 = 0x5143;
/// `VK_VENDOR_ID_MESA`: Mesa's software devices (lavapipe/llvmpipe).
pub const VENDOR_MESA: u32 = 0x10005;

/// The highest Vulkan version the backend asks for; it needs 1.1 (subgroups, `*2` queries).
const API_WANTED: u32 = vk::API_VERSION_1_3;
const API_NEEDED: u32 = vk::API_VERSION_1_1;

/// The name of a vendor id, for reports.
pub fn vendor_name(id: u32) -> &'static str {
    match id {
        VENDOR_AMD => "AMD",
        VENDOR_NVIDIA => "NVIDIA",
        VENDOR_INTEL => "Intel",
        VENDOR_APPLE => "Apple",
        VENDOR_ARM => "ARM",
        VENDOR_QUALCOMM => "Qualcomm",
        VENDOR_MESA => "Mesa (software)",
        _ => "unknown",
    }
}

/// `VkPhysicalDeviceType`, in the order [`pick`] prefers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceType {
    Discrete,
    Integrated,
    Virtual,
    Cpu,
    Other,
}

impl DeviceType {
    fn from_vk(t: vk::PhysicalDeviceType) -> Self {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => Self::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => Self::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => Self::Virtual,
            vk::PhysicalDeviceType::CPU => Self::Cpu,
            _ => Self::Other,
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Discrete => "discrete GPU",
            Self::Integrated => "integrated GPU",
            Self::Virtual => "virtual GPU",
            Self::Cpu => "CPU",
            Self::Other => "other",
        })
    }
}

/// A Vulkan version (`VK_MAKE_API_VERSION` without the variant); serialized as "1.3.230".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl ApiVersion {
    pub fn from_vk(v: u32) -> Self {
        Self {
            major: vk::api_version_major(v),
            minor: vk::api_version_minor(v),
            patch: vk::api_version_patch(v),
        }
    }

    /// At least `major.minor`.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl Serialize for ApiVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `VkPhysicalDeviceDriverProperties`: which driver runs the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Driver {
    /// e.g. `llvmpipe`, `radv`, `NVIDIA`.
    pub name: String,
    /// e.g. `Mesa 22.3.6 (LLVM 15.0.6)`.
    pub info: String,
}

/// Subgroups (waves, warps, SIMD lanes): sizes and what compute shaders may do with them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subgroups {
    /// The size a pipeline gets when it requires none.
    pub size: u32,
    /// The range a pipeline may require (`size..=size` without subgroup size control).
    pub min_size: u32,
    pub max_size: u32,
    /// Subgroup operations the compute stage supports (`basic`, `arithmetic`, ...).
    pub compute_operations: Vec<&'static str>,
    /// `subgroupSizeControl` (VK_EXT_subgroup_size_control or Vulkan 1.3).
    pub size_control: bool,
    /// `computeFullSubgroups`: compute pipelines may require full subgroups.
    pub compute_full_subgroups: bool,
    /// `requiredSubgroupSizeStages` includes compute.
    pub required_size_in_compute: bool,
    /// `maxComputeWorkgroupSubgroups` (0 without subgroup size control).
    pub max_compute_workgroup_subgroups: u32,
}

/// VK_KHR_shader_integer_dot_product (core in 1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct IntegerDot {
    /// The `shaderIntegerDotProduct` feature.
    pub supported: bool,
    /// `integerDotProduct4x8BitPackedSignedAccelerated`: the i8 x 4 dot product is an
    /// instruction, not an emulation.
    pub packed_4x8_signed_accelerated: bool,
}

/// One shape and type combination VK_KHR_cooperative_matrix offers (`VkCooperativeMatrixPropertiesKHR`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatrixShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a: &'static str,
    pub b: &'static str,
    pub c: &'static str,
    pub result: &'static str,
    pub saturating: bool,
    pub scope: &'static str,
}

impl fmt::Display for MatrixShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}x{} {}*{}+{}->{}",
            self.m, self.n, self.k, self.a, self.b, self.c, self.result
        )?;
        if self.scope != "subgroup" {
            write!(f, " ({})", self.scope)?;
        }
        Ok(())
    }
}

/// VK_KHR_cooperative_matrix.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct CooperativeMatrix {
    /// The `cooperativeMatrix` feature.
    pub supported: bool,
    /// The `vulkanMemoryModel` feature (Vulkan 1.2 or VK_KHR_vulkan_memory_model), which
    /// SPIR-V's cooperative matrices are declared with.
    pub vulkan_memory_model: bool,
    pub shapes: Vec<MatrixShape>,
}

impl CooperativeMatrix {
    /// The largest size the `matmul_coop` kernels come in ([`kernels::COOP_SIZES`]) of which
    /// the device has f16 x f16 + f32 -> f32 square subgroup matrices, if any.
    pub fn kernel_size(&self) -> Option<u32> {
        kernels::COOP_SIZES
            .into_iter()
            .map(u32::from)
            .filter(|&t| {
                self.shapes.iter().any(|m| {
                    (m.m, m.n, m.k) == (t, t, t)
                        && m.scope == "subgroup"
                        && (m.a, m.b, m.c, m.result) == ("f16", "f16", "f32", "f32")
                })
            })
            .max()
    }
}

/// f16 in shaders and in buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Float16 {
    /// `shaderFloat16`: f16 arithmetic.
    pub shader_float16: bool,
    /// `storageBuffer16BitAccess`: 16-bit values in storage buffers.
    pub storage_buffer_16bit: bool,
    /// `uniformAndStorageBuffer16BitAccess`: and in uniform buffers.
    pub uniform_16bit: bool,
}

/// The limits the kernels and their dispatch plans depend on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    pub max_workgroup_size: [u32; 3],
    pub max_workgroup_invocations: u32,
    pub max_workgroup_count: [u32; 3],
    pub max_shared_memory_bytes: u32,
    pub max_storage_buffer_range: u32,
    /// `maxImageDimension2D` (texture-held weights' rows per part).
    pub max_image_dimension_2d: u32,
    pub max_push_constants_bytes: u32,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period_ns: f32,
}

/// Device extensions that matter where the device's Vulkan version does not include them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Extensions {
    pub subgroup_size_control: bool,
    pub integer_dot_product: bool,
    pub cooperative_matrix: bool,
    pub vulkan_memory_model: bool,
    pub shader_float16_int8: bool,
    pub storage_16bit: bool,
    pub driver_properties: bool,
}

/// Everything the backend wants to know about a physical device, as plain data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceInfo {
    /// The position in the driver's enumeration: what `--device N` (and [`pick`]) take.
    pub index: usize,
    pub name: String,
    pub vendor_id: u32,
    pub vendor: &'static str,
    pub device_id: u32,
    /// The driver's version number, as it encodes it.
    pub driver_version: u32,
    /// `pipelineCacheUUID`: pipeline cache data from a device and driver with another UUID
    /// is of no use here (the on-disk cache is keyed by it).
    pub pipeline_cache_uuid: [u8; 16],
    pub device_type: DeviceType,
    /// The device's own Vulkan version (the backend uses at most 1.3).
    pub api_version: ApiVersion,
    /// `None` where the device has neither Vulkan 1.2 nor VK_KHR_driver_properties.
    pub driver: Option<Driver>,
    /// The queue family the backend submits to: a compute family, a compute-only one first.
    pub compute_queue_family: Option<u32>,
    /// Valid bits of that family's timestamps (0: no timestamps).
    pub timestamp_valid_bits: u32,
    /// The largest device-local memory heap.
    pub device_local_bytes: u64,
    pub subgroups: Subgroups,
    pub integer_dot: IntegerDot,
    pub cooperative_matrix: CooperativeMatrix,
    pub float16: Float16,
    pub limits: Limits,
    pub extensions: Extensions,
}

/// Whether the backend uses an optional path on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum Use {
    Used,
    /// The device has it, and the backend leaves it off (why).
    NotUsed(&'static str),
    NotAvailable,
}

impl Use {
    pub fn is_used(self) -> bool {
        self == Use::Used
    }
}

impl fmt::Display for Use {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Use::Used => f.write_str("used"),
            Use::NotUsed(why) => write!(f, "not used ({why})"),
            Use::NotAvailable => f.write_str("not available"),
        }
    }
}

/// The subgroup size the kernels run at on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SubgroupChoice {
    pub size: u32,
    /// Pipelines require `size` (VkPipelineShaderStageRequiredSubgroupSizeCreateInfo);
    /// otherwise the device picks, and `size` is its default.
    pub required: bool,
}

/// The optional paths the backend takes on a device, each with its fallback: the plain
/// kernels, which every Vulkan 1.1 device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Specializations {
    pub subgroup_size: SubgroupChoice,
    /// Subgroup operations in compute (the `_subgroup` kernel variants; else workgroup-memory
    /// reductions).
    pub subgroup_operations: Use,
    /// A required subgroup size (VK_EXT_subgroup_size_control).
    pub subgroup_size_control: Use,
    /// `dot4I8Packed` (VK_KHR_shader_integer_dot_product).
    pub integer_dot_product: Use,
    /// VK_KHR_cooperative_matrix: the `matmul_coop` kernels.
    pub cooperative_matrix: Use,
    /// The size of their matrices where they are used (16 or 8).
    pub cooperative_matrix_size: Option<u32>,
    /// f16 arithmetic (the `_f16` kernel variants).
    pub shader_float16: Use,
    /// 16-bit storage buffer access, which the f16 kernels need with f16 arithmetic.
    pub storage_16bit: Use,
}

/// The subgroup operations the `_subgroup` kernels use (those wgpu asks for its subgroup feature).
const SUBGROUP_OPS_NEEDED: [&str; 6] = ["basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative"];

/// The subgroup size the backend runs its kernels at: 64 on AMD devices that can run wave64
/// (GCN runs nothing else; RDNA runs 32 or 64, and 64 halves the reductions of a 256-wide
/// workgroup), 32 wherever the device allows requiring it (NVIDIA's warp, Intel's widest
/// SIMD), else whatever the device runs by default. A size can only be required with
/// subgroup size control for compute.
pub fn preferred_subgroup_size(info: &DeviceInfo) -> SubgroupChoice {
    let s = &info.subgroups;
    let can_require = s.size_control && s.required_size_in_compute;
    let fits = |n: u32| s.min_size <= n && n <= s.max_size;
    if can_require {
        if info.vendor_id == VENDOR_AMD && fits(64) {
            return SubgroupChoice {
                size: 64,
                required: true,
            };
        }
        if fits(32) {
            return SubgroupChoice {
                size: 32,
                required: true,
            };
        }
    }
    SubgroupChoice {
        size: s.size,
        required: false,
    }
}

impl DeviceInfo {
    /// Why the backend cannot run on this device, if it cannot.
    pub fn unusable(&self) -> Option<String> {
        if !self.api_version.at_least(1, 1) {
            return Some(format!("Vulkan {} (1.1 is needed)", self.api_version));
        }
        if self.compute_queue_family.is_none() {
            return Some("no compute queue".into());
        }
        None
    }

    /// Which optional paths the backend uses here; see [`Specializations`].
    pub fn specializations(&self) -> Specializations {
        let s = &self.subgroups;
        let subgroup_size = preferred_subgroup_size(self);
        let subgroup_operations = if s.compute_operations.is_empty() {
            Use::NotAvailable
        } else if SUBGROUP_OPS_NEEDED.iter().all(|op| s.compute_operations.contains(op)) {
            Use::Used
        } else {
            Use::NotUsed("the compute stage lacks some of the operations the kernels use")
        };
        let subgroup_size_control = if !s.size_control {
            Use::NotAvailable
        } else if !s.required_size_in_compute {
            Use::NotUsed("compute pipelines cannot require a size")
        } else if subgroup_size.required {
            Use::Used
        } else if s.min_size == s.max_size {
            Use::NotUsed("the device has one subgroup size")
        } else {
            Use::NotUsed("neither 32 nor 64 is in the device's range")
        };
        let integer_dot_product = match self.integer_dot {
            IntegerDot { supported: false, .. } => Use::NotAvailable,
            IntegerDot {
                packed_4x8_signed_accelerated: false,
                ..
            } => Use::NotUsed("4x8-bit packed signed dot products are not accelerated"),
            _ => Use::Used,
        };
        let f = self.float16;
        let coop = &self.cooperative_matrix;
        let coop_size = coop.kernel_size();
        // The kernel's workgroup of 64 splits into whole subgroups, whatever size they run at.
        let sizes_fit = [subgroup_size.size, s.min_size, s.max_size]
            .iter()
            .all(|&n| n > 0 && 64 % n == 0);
        let cooperative_matrix = if !coop.supported {
            Use::NotAvailable
        } else if coop_size.is_none() {
            Use::NotUsed("no 16x16x16 or 8x8x8 f16*f16+f32 subgroup shape")
        } else if !coop.vulkan_memory_model {
            Use::NotUsed("the kernels need the Vulkan memory model")
        } else if !(f.shader_float16 && f.storage_buffer_16bit && f.uniform_16bit) {
            Use::NotUsed("the kernels need f16 arithmetic and 16-bit storage")
        } else if !s.compute_operations.contains(&"basic") {
            Use::NotUsed("the kernels need subgroup ids in compute")
        } else if !sizes_fit {
            Use::NotUsed("the subgroup size does not divide the kernels' workgroup of 64")
        } else {
            Use::Used
        };
        let cooperative_matrix_size = coop_size.filter(|_| cooperative_matrix.is_used());
        let storage16 = f.storage_buffer_16bit && f.uniform_16bit;
        let shader_float16 = match (f.shader_float16, storage16) {
            (false, _) => Use::NotAvailable,
            (true, false) => Use::NotUsed("the f16 kernels also need 16-bit storage buffers"),
            (true, true) => Use::Used,
        };
        let storage_16bit = match (storage16, f.shader_float16) {
            (false, _) => Use::NotAvailable,
            (true, false) => Use::NotUsed("the f16 kernels also need shaderFloat16"),
            (true, true) => Use::Used,
        };
        Specializations {
            subgroup_size,
            subgroup_operations,
            subgroup_size_control,
            integer_dot_product,
            cooperative_matrix,
            cooperative_matrix_size,
            shader_float16,
            storage_16bit,
        }
    }
}

/// The device [`Device::open`] would take: the one at `index`, or the first of the most
/// preferred type (discrete > integrated > virtual > CPU > other) the backend can run on.
pub fn pick(devices: &[DeviceInfo], index: Option<usize>) -> Result<usize, String> {
    if let Some(i) = index {
        let d = devices.iter().find(|d| d.index == i).ok_or_else(|| {
            format!(
                "no Vulkan device {i} ({} device{})",
                devices.len(),
                if devices.len() == 1 { "" } else { "s" }
            )
        })?;
        return match d.unusable() {
            Some(why) => Err(format!("Vulkan device {i} ({}) cannot run the backend: {why}", d.name)),
            None => Ok(i),
        };
    }
    devices
        .iter()
        .filter(|d| d.unusable().is_none())
        .min_by_key(|d| (d.device_type, d.index))
        .map(|d| d.index)
        .ok_or_else(|| match devices.len() {
            0 => "no Vulkan devices".to_string(),
            n => format!("none of the {n} Vulkan devices can run the backend"),
        })
}

/// The Vulkan loader and an instance, destroyed on drop.
pub struct Instance {
    /// Destroyed by `Drop for Instance`, before `entry` unloads the loader.
    raw: ash::Instance,
    /// The version the instance was created with (min of the loader's and 1.3).
    api_version: u32,
    entry: ash::Entry,
}

impl Instance {
    /// Load the Vulkan loader (`libvulkan.so.1`, `vulkan-1.dll`, `libvulkan.dylib`) and create an
    /// instance. No loader, or a loader without drivers, is [`VulkanError::NoLoader`] /
    /// [`VulkanError::NoDriver`]; anything else is a failure.
    pub fn new() -> Result<Self, VulkanError> {
        // SAFETY: loading the system's Vulkan loader runs its initializers; the loader is a
        // well-known library meant to be opened this way, and `entry` keeps it loaded for as long
        // as any handle made from it exists (it is the last field of `Instance`).
        let entry = unsafe { ash::Entry::load() }.map_err(|e| VulkanError::NoLoader(e.to_string()))?;
        // SAFETY: a global command with no handles; the loader is loaded.
        let loader_version = match unsafe { entry.try_enumerate_instance_version() } {
            Ok(v) => v.unwrap_or(vk::API_VERSION_1_0),
            Err(e) => return Err(VulkanError::failed("vkEnumerateInstanceVersion", e)),
        };
        if loader_version < API_NEEDED {
            return Err(VulkanError::NoDriver(format!(
                "the Vulkan loader is version {} (1.1 is needed)",
                ApiVersion::from_vk(loader_version)
            )));
        }
        let api_version = loader_version.min(API_WANTED);
        // SAFETY: a global command with no handles; the loader is loaded.
        let instance_exts = unsafe { entry.enumerate_instance_extension_properties(None) }
            .map_err(|e| VulkanError::failed("vkEnumerateInstanceExtensionProperties", e))?;
        // Portability drivers (MoltenVK) are listed only to instances that ask for them.
        let portability = instance_exts
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::khr::portability_enumeration::NAME));
        let mut ext_names: Vec<*const c_char> = Vec::new();
        let mut flags = vk::InstanceCreateFlags::empty();
        if portability {
            ext_names.push(ash::khr::portability_enumeration::NAME.as_ptr());
            flags |= vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR;
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"tinyllm")
            .engine_name(c"tinyllm")
            .api_version(api_version);
        let info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_extension_names(&ext_names)
            .flags(flags);
        // SAFETY: `info` and everything it points to (app info, extension names: 'static C
        // strings) live across the call; the extension was listed by the loader.
        let raw = match unsafe { entry.create_instance(&info, None) } {
            Ok(raw) => raw,
            Err(vk::Result::ERROR_INCOMPATIBLE_DRIVER) => {
                return Err(VulkanError::NoDriver("the Vulkan loader found no driver".into()))
            }
            Err(e) => return Err(VulkanError::failed("vkCreateInstance", e)),
        };
        Ok(Self {
            raw,
            api_version,
            entry,
        })
    }

    /// The instance's Vulkan version.
    pub fn api_version(&self) -> ApiVersion {
        ApiVersion::from_vk(self.api_version)
    }

    pub fn raw(&self) -> &ash::Instance {
        &self.raw
    }

    pub fn entry(&self) -> &ash::Entry {
        &self.entry
    }

    /// Every physical device, described.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, VulkanError> {
        Ok(self.physical_devices()?.into_iter().map(|(_, d)| d).collect())
    }

    fn physical_devices(&self) -> Result<Vec<(vk::PhysicalDevice, DeviceInfo)>, VulkanError> {
        // SAFETY: `self.raw` is a live instance.
        let handles = unsafe { self.raw.enumerate_physical_devices() }
            .map_err(|e| VulkanError::failed("vkEnumeratePhysicalDevices", e))?;
        handles
            .into_iter()
            .enumerate()
            .map(|(i, pd)| Ok((pd, self.describe(i, pd)?)))
            .collect()
    }

    /// Query one physical device. Each extension struct is chained only where the device has
    /// its extension or the Vulkan version that made it core.
    fn describe(&self, index: usize, pd: vk::PhysicalDevice) -> Result<DeviceInfo, VulkanError> {
        let inst = &self.raw;
        // SAFETY (every call in this function and the queries it makes): `pd` was enumerated
        // from the live instance `inst`; each output struct is a local that outlives the call.
        let props = unsafe { inst.get_physical_device_properties(pd) };
        let api = ApiVersion::from_vk(props.api_version.min(self.api_version));
        let ext = self.extensions(pd)?;
        let q = self.query_features(pd, api, &ext);
        let shapes = if q.cooperative_matrix {
            self.cooperative_matrix_shapes(pd)
        } else {
            Vec::new()
        };
        let families = unsafe { inst.get_physical_device_queue_family_properties(pd) };
        let family = compute_queue_family(&families);
        let memory = unsafe { inst.get_physical_device_memory_properties(pd) };
        Ok(DeviceInfo {
            index,
            name: c_string(props.device_name_as_c_str()),
            vendor_id: props.vendor_id,
            vendor: vendor_name(props.vendor_id),
            device_id: props.device_id,
            driver_version: props.driver_version,
            pipeline_cache_uuid: props.pipeline_cache_uuid,
            device_type: DeviceType::from_vk(props.device_type),
            api_version: ApiVersion::from_vk(props.api_version),
            driver: q.driver,
            compute_queue_family: family.and_then(|f| u32::try_from(f).ok()),
            timestamp_valid_bits: family.map_or(0, |f| families[f].timestamp_valid_bits),
            device_local_bytes: device_local_bytes(&memory),
            subgroups: q.subgroups,
            integer_dot: q.integer_dot,
            cooperative_matrix: CooperativeMatrix {
                supported: q.cooperative_matrix,
                vulkan_memory_model: q.vulkan_memory_model,
                shapes,
            },
            float16: q.float16,
            limits: Limits::from_vk(&props.limits),
            extensions: ext,
        })
    }

    /// The device extensions the backend looks for, as the device lists them.
    fn extensions(&self, pd: vk::PhysicalDevice) -> Result<Extensions, VulkanError> {
        // SAFETY: `pd` was enumerated from the live instance.
        let ext_props = unsafe { self.raw.enumerate_device_extension_properties(pd) }
            .map_err(|e| VulkanError::failed("vkEnumerateDeviceExtensionProperties", e))?;
        let has = |name: &CStr| ext_props.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
        Ok(Extensions {
            subgroup_size_control: has(ash::ext::subgroup_size_control::NAME),
            integer_dot_product: has(ash::khr::shader_integer_dot_product::NAME),
            cooperative_matrix: has(ash::khr::cooperative_matrix::NAME),
            vulkan_memory_model: has(ash::khr::vulkan_memory_model::NAME),
            shader_float16_int8: has(ash::khr::shader_float16_int8::NAME),
            storage_16bit: has(ash::khr::_16bit_storage::NAME),
            driver_properties: has(ash::khr::driver_properties::NAME),
        })
    }

    /// The properties and features behind `vkGetPhysicalDevice{Properties,Features}2`, each
    /// struct chained only where the device's API version or extensions (`ext`) have it.
    fn query_features(&self, pd: vk::PhysicalDevice, api: ApiVersion, ext: &Extensions) -> Queried {
        let v11 = api.at_least(1, 1);
        let with_driver = api.at_least(1, 2) || ext.driver_properties;
        let with_size_control = api.at_least(1, 3) || ext.subgroup_size_control;
        let with_int_dot = api.at_least(1, 3) || ext.integer_dot_product;
        let with_f16 = api.at_least(1, 2) || ext.shader_float16_int8;
        let with_storage16 = v11 || ext.storage_16bit;
        let with_memory_model = api.at_least(1, 2) || ext.vulkan_memory_model;

        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut size_control = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut int_dot = vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
        let mut size_control_f = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
        let mut int_dot_f = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        let mut coop_f = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut memory_model_f = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
        let mut f16_f = vk::PhysicalDeviceShaderFloat16Int8Features::default();
        let mut storage16_f = vk::PhysicalDevice16BitStorageFeatures::default();
        if v11 {
            let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
            if with_driver {
                p2 = p2.push_next(&mut driver);
            }
            if with_size_control {
                p2 = p2.push_next(&mut size_control);
            }
            if with_int_dot {
                p2 = p2.push_next(&mut int_dot);
            }
            // SAFETY: `pd` is the live instance's; every chained struct is one the device
            // supports (checked against `api` and `ext` above) and outlives the call.
            unsafe { self.raw.get_physical_device_properties2(pd, &mut p2) };
            let mut f2 = vk::PhysicalDeviceFeatures2::default();
            if with_size_control {
                f2 = f2.push_next(&mut size_control_f);
            }
            if with_int_dot {
                f2 = f2.push_next(&mut int_dot_f);
            }
            if ext.cooperative_matrix {
                f2 = f2.push_next(&mut coop_f);
            }
            if with_memory_model {
                f2 = f2.push_next(&mut memory_model_f);
            }
            if with_f16 {
                f2 = f2.push_next(&mut f16_f);
            }
            if with_storage16 {
                f2 = f2.push_next(&mut storage16_f);
            }
            // SAFETY: as for the properties.
            unsafe { self.raw.get_physical_device_features2(pd, &mut f2) };
        }
        let controlled = with_size_control.then_some((&size_control, &size_control_f));
        Queried {
            driver: with_driver.then(|| Driver {
                name: c_string(driver.driver_name_as_c_str()),
                info: c_string(driver.driver_info_as_c_str()),
            }),
            subgroups: Subgroups::from_vk(v11.then_some(&subgroup), controlled),
            integer_dot: IntegerDot {
                supported: int_dot_f.shader_integer_dot_product == vk::TRUE,
                packed_4x8_signed_accelerated: int_dot.integer_dot_product4x8_bit_packed_signed_accelerated == vk::TRUE,
            },
            cooperative_matrix: coop_f.cooperative_matrix == vk::TRUE,
            vulkan_memory_model: memory_model_f.vulkan_memory_model == vk::TRUE,
            float16: Float16 {
                shader_float16: f16_f.shader_float16 == vk::TRUE,
                storage_buffer_16bit: storage16_f.storage_buffer16_bit_access == vk::TRUE,
                uniform_16bit: storage16_f.uniform_and_storage_buffer16_bit_access == vk::TRUE,
            },
        }
    }

    /// The cooperative-matrix shapes the device lists (empty where the query fails: that
    /// only hides them from the report; the feature stays known).
    fn cooperative_matrix_shapes(&self, pd: vk::PhysicalDevice) -> Vec<MatrixShape> {
        let coop = ash::khr::cooperative_matrix::Instance::new(&self.entry, &self.raw);
        // SAFETY: `pd` is the live instance's, which has the extension's entry points loaded.
        unsafe { coop.get_physical_device_cooperative_matrix_properties(pd) }
            .unwrap_or_default()
            .iter()
            .map(|p| MatrixShape {
                m: p.m_size,
                n: p.n_size,
                k: p.k_size,
                a: component(p.a_type),
                b: component(p.b_type),
                c: component(p.c_type),
                result: component(p.result_type),
                saturating: p.saturating_accumulation == vk::TRUE,
                scope: scope(p.scope),
            })
            .collect()
    }
}

/// What [`Instance::query_features`] found, as plain data.
struct Queried {
    driver: Option<Driver>,
    subgroups: Subgroups,
    integer_dot: IntegerDot,
    cooperative_matrix: bool,
    vulkan_memory_model: bool,
    float16: Float16,
}

/// A driver-filled C string (empty where it is not valid UTF-8-terminated text).
fn c_string(r: Result<&CStr, std::ffi::FromBytesUntilNulError>) -> String {
    r.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The queue family compute work goes to: a compute-only one where there is one (AMD's async
/// compute queues), else any with compute.
fn compute_queue_family(families: &[vk::QueueFamilyProperties]) -> Option<usize> {
    let compute = |f: &vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0;
    families
        .iter()
        .position(|f| compute(f) && !f.queue_flags.contains(vk::QueueFlags::GRAPHICS))
        .or_else(|| families.iter().position(compute))
}

/// The largest device-local heap, in bytes.
fn device_local_bytes(memory: &vk::PhysicalDeviceMemoryProperties) -> u64 {
    memory
        .memory_heaps_as_slice()
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
        .unwrap_or(0)
}

impl Subgroups {
    /// From the subgroup properties (`None`: a Vulkan 1.0 device, which reports none) and the
    /// size-control properties and features where the device has them.
    fn from_vk(
        subgroup: Option<&vk::PhysicalDeviceSubgroupProperties<'_>>,
        control: Option<(
            &vk::PhysicalDeviceSubgroupSizeControlProperties<'_>,
            &vk::PhysicalDeviceSubgroupSizeControlFeatures<'_>,
        )>,
    ) -> Self {
        let compute_operations = match subgroup {
            Some(s) if s.supported_stages.contains(vk::ShaderStageFlags::COMPUTE) => {
                subgroup_operations(s.supported_operations)
            }
            _ => Vec::new(),
        };
        // Without size control the device runs one size (a 1.0 device reports none: 1).
        let size = subgroup.map_or(1, |s| s.subgroup_size.max(1));
        let features = control.map(|(_, f)| f);
        let controlled = control.map(|(p, _)| p).filter(|p| p.min_subgroup_size > 0);
        Subgroups {
            size,
            min_size: controlled.map_or(size, |p| p.min_subgroup_size),
            max_size: controlled.map_or(size, |p| p.max_subgroup_size),
            compute_operations,
            size_control: features.is_some_and(|f| f.subgroup_size_control == vk::TRUE),
            compute_full_subgroups: features.is_some_and(|f| f.compute_full_subgroups == vk::TRUE),
            required_size_in_compute: controlled
                .is_some_and(|p| p.required_subgroup_size_stages.contains(vk::ShaderStageFlags::COMPUTE)),
            max_compute_workgroup_subgroups: controlled.map_or(0, |p| p.max_compute_workgroup_subgroups),
        }
    }
}

impl Limits {
    fn from_vk(l: &vk::PhysicalDeviceLimits) -> Self {
        Limits {
            max_workgroup_size: l.max_compute_work_group_size,
            max_workgroup_invocations: l.max_compute_work_group_invocations,
            max_workgroup_count: l.max_compute_work_group_count,
            max_shared_memory_bytes: l.max_compute_shared_memory_size,
            max_storage_buffer_range: l.max_storage_buffer_range,
            max_image_dimension_2d: l.max_image_dimension2_d,
            max_push_constants_bytes: l.max_push_constants_size,
            timestamp_period_ns: l.timestamp_period,
        }
    }
}
impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every object made from the instance is gone: a `Device` owns its `Instance`
        // and destroys its logical device first.
        unsafe { self.raw.destroy_instance(None) };
    }
}

fn subgroup_operations(ops: vk::SubgroupFeatureFlags) -> Vec<&'static str> {
    use vk::SubgroupFeatureFlags as F;
    [
        (F::BASIC, "basic"),
        (F::VOTE, "vote"),
        (F::ARITHMETIC, "arithmetic"),
        (F::BALLOT, "ballot"),
        (F::SHUFFLE, "shuffle"),
        (F::SHUFFLE_RELATIVE, "shuffle_relative"),
        (F::CLUSTERED, "clustered"),
        (F::QUAD, "quad"),
    ]
    .into_iter()
    .filter(|(f, _)| ops.contains(*f))
    .map(|(_, n)| n)
    .collect()
}

fn component(t: vk::ComponentTypeKHR) -> &'static str {
    use vk::ComponentTypeKHR as C;
    match t {
        C::FLOAT16 => "f16",
        C::FLOAT32 => "f32",
        C::FLOAT64 => "f64",
        C::SINT8 => "s8",
        C::SINT16 => "s16",
        C::SINT32 => "s32",
        C::SINT64 => "s64",
        C::UINT8 => "u8",
        C::UINT16 => "u16",
        C::UINT32 => "u32",
        C::UINT64 => "u64",
        _ => "other",
    }
}

fn scope(s: vk::ScopeKHR) -> &'static str {
    match s {
        vk::ScopeKHR::SUBGROUP => "subgroup",
        vk::ScopeKHR::WORKGROUP => "workgroup",
        vk::ScopeKHR::DEVICE => "device",
        vk::ScopeKHR::QUEUE_FAMILY => "queue family",
        _ => "other",
    }
}

/// What [`Device::open`] enabled: the [`Specializations`] the device accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Enabled {
    pub subgroup_size_control: bool,
    pub compute_full_subgroups: bool,
    pub integer_dot_product: bool,
    pub cooperative_matrix: bool,
    /// shaderFloat16 with 16-bit storage buffers.
    pub float16: bool,
}

impl Enabled {
    /// Subgroup size control is enabled wherever compute has it, even when the kernels'
    /// size is the default (it costs nothing, and lets a pipeline require a size anyway).
    fn from(s: &Specializations, info: &DeviceInfo) -> Self {
        let g = &info.subgroups;
        let size_control = g.size_control && g.required_size_in_compute;
        Self {
            subgroup_size_control: size_control,
            compute_full_subgroups: size_control && g.compute_full_subgroups,
            integer_dot_product: s.integer_dot_product.is_used(),
            cooperative_matrix: s.cooperative_matrix.is_used(),
            float16: s.shader_float16.is_used(),
        }
    }
}

/// A logical device with one compute queue, on the device [`pick`] chose, with the features of
/// its [`Specializations`] enabled (and `robustBufferAccess`, on which the SPIR-V's buffer
/// accesses rely: see `build/spirv.rs`). Destroyed on drop, before its instance.
pub struct Device {
    raw: ash::Device,
    queue: vk::Queue,
    physical: vk::PhysicalDevice,
    info: DeviceInfo,
    specializations: Specializations,
    enabled: Enabled,
    // Last: dropped after `Drop for Device` has destroyed the logical device.
    instance: Instance,
}

impl Device {
    /// Open the device at `index` (as enumerated), or the one [`pick`] prefers.
    pub fn open(index: Option<usize>) -> Result<Self, VulkanError> {
        Self::open_with(index, false)
    }

    /// [`Device::open`], enabling packed integer dot products wherever the device has them, even
    /// where they are not accelerated (so the integer-dot kernels can be tested there).
    pub fn open_with(index: Option<usize>, integer_dot_anyway: bool) -> Result<Self, VulkanError> {
        let instance = Instance::new()?;
        let mut devices = instance.physical_devices()?;
        let infos: Vec<DeviceInfo> = devices.iter().map(|(_, d)| d.clone()).collect();
        let chosen = pick(&infos, index).map_err(|why| {
            if infos.is_empty() {
                VulkanError::NoDriver(why)
            } else {
                VulkanError::NoDevice(why)
            }
        })?;
        let (physical, info) = devices.swap_remove(chosen);
        let mut specializations = info.specializations();
        if integer_dot_anyway && info.integer_dot.supported {
            specializations.integer_dot_product = Use::Used;
        }
        let wanted = Enabled::from(&specializations, &info);
        let (raw, enabled) = match create_device(&instance, physical, &info, wanted) {
            Ok(raw) => (raw, wanted),
            // A driver that lists a feature and then refuses it: the plain kernels.
            Err(vk::Result::ERROR_FEATURE_NOT_PRESENT | vk::Result::ERROR_EXTENSION_NOT_PRESENT)
                if wanted != Enabled::default() =>
            {
                let raw = create_device(&instance, physical, &info, Enabled::default())
                    .map_err(|e| VulkanError::failed("vkCreateDevice", e))?;
                let refused = Use::NotUsed("the driver refused it at device creation");
                for u in [
                    &mut specializations.subgroup_size_control,
                    &mut specializations.integer_dot_product,
                    &mut specializations.cooperative_matrix,
                    &mut specializations.shader_float16,
                    &mut specializations.storage_16bit,
                ] {
                    if u.is_used() {
                        *u = refused;
                    }
                }
                specializations.cooperative_matrix_size = None;
                specializations.subgroup_size.required = false;
                specializations.subgroup_size.size = info.subgroups.size;
                (raw, Enabled::default())
            }
            Err(e) => return Err(VulkanError::failed("vkCreateDevice", e)),
        };
        let family = info.compute_queue_family.unwrap_or(0);
        // SAFETY: the device was created with one queue in `family`.
        let queue = unsafe { raw.get_device_queue(family, 0) };
        Ok(Self {
            raw,
            queue,
            physical,
            info,
            specializations,
            enabled,
            instance,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// What the backend uses on this device (after any fallback at creation).
    pub fn specializations(&self) -> &Specializations {
        &self.specializations
    }

    pub fn enabled(&self) -> Enabled {
        self.enabled
    }

    pub fn raw(&self) -> &ash::Device {
        &self.raw
    }

    pub fn physical(&self) -> vk::PhysicalDevice {
        self.physical
    }

    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The compute queue. Submissions to it must be externally synchronized (one submitter).
    pub fn queue(&self) -> vk::Queue {
        self.queue
    }

    pub fn queue_family(&self) -> u32 {
        self.info.compute_queue_family.unwrap_or(0)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the device is live; objects made from it (pipelines, ...) borrow the `Device`
        // and are gone; waiting for idle first means no work still uses it.
        unsafe {
            let _ = self.raw.device_wait_idle();
            self.raw.destroy_device(None);
        }
    }
}

/// vkCreateDevice with one compute queue and the features of `want`.
fn create_device(
    instance: &Instance,
    pd: vk::PhysicalDevice,
    info: &DeviceInfo,
    want: Enabled,
) -> Result<ash::Device, vk::Result> {
    let api = info.api_version.min(instance.api_version());
    let family = info.compute_queue_family.ok_or(vk::Result::ERROR_FEATURE_NOT_PRESENT)?;
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let mut exts: Vec<*const c_char> = Vec::new();
    let mut need = |core: bool, present: bool, name: &'static CStr| {
        if !core && present {
            exts.push(name.as_ptr());
        }
    };
    let e = &info.extensions;
    if want.subgroup_size_control {
        need(
            api.at_least(1, 3),
            e.subgroup_size_control,
            ash::ext::subgroup_size_control::NAME,
        );
    }
    if want.integer_dot_product {
        need(
            api.at_least(1, 3),
            e.integer_dot_product,
            ash::khr::shader_integer_dot_product::NAME,
        );
    }
    if want.cooperative_matrix {
        need(false, e.cooperative_matrix, ash::khr::cooperative_matrix::NAME);
        need(
            api.at_least(1, 2),
            e.vulkan_memory_model,
            ash::khr::vulkan_memory_model::NAME,
        );
    }
    if want.float16 {
        need(
            api.at_least(1, 2),
            e.shader_float16_int8,
            ash::khr::shader_float16_int8::NAME,
        );
        need(api.at_least(1, 1), e.storage_16bit, ash::khr::_16bit_storage::NAME);
    }
    // robustBufferAccess: every Vulkan device supports it.
    let base = vk::PhysicalDeviceFeatures::default().robust_buffer_access(true);
    let mut size_control = vk::PhysicalDeviceSubgroupSizeControlFeatures::default()
        .subgroup_size_control(true)
        .compute_full_subgroups(want.compute_full_subgroups);
    let mut int_dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default().shader_integer_dot_product(true);
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let mut memory_model = vk::PhysicalDeviceVulkanMemoryModelFeatures::default().vulkan_memory_model(true);
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default().shader_float16(true);
    let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default()
        .storage_buffer16_bit_access(true)
        .uniform_and_storage_buffer16_bit_access(true);
    let mut create = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&exts)
        .enabled_features(&base);
    if want.subgroup_size_control {
        create = create.push_next(&mut size_control);
    }
    if want.integer_dot_product {
        create = create.push_next(&mut int_dot);
    }
    if want.cooperative_matrix {
        create = create.push_next(&mut coop).push_next(&mut memory_model);
    }
    if want.float16 {
        create = create.push_next(&mut f16).push_next(&mut storage16);
    }
    // SAFETY: `pd` comes from the live `instance`; `create` and everything it points to
    // (queue infos, priorities, extension names: 'static C strings, feature structs) live
    // across the call; each chained feature was reported supported and its extension
    // listed (or core at `api`).
    unsafe { instance.raw.create_device(pd, &create, None) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up device: `vendor`, subgroup sizes `size` within `min..=max`, size control for
    /// compute when `min < max`.
    fn fake(index: usize, vendor: u32, ty: DeviceType, size: u32, min: u32, max: u32) -> DeviceInfo {
        DeviceInfo {
            index,
            name: format!("fake {index}"),
            vendor_id: vendor,
            vendor: vendor_name(vendor),
            device_id: 0,
            driver_version: 0,
            pipeline_cache_uuid: [0; 16],
            device_type: ty,
            api_version: ApiVersion {
                major: 1,
                minor: 3,
                patch: 0,
            },
            driver: None,
            compute_queue_family: Some(0),
            timestamp_valid_bits: 64,
            device_local_bytes: 1 << 30,
            subgroups: Subgroups {
                size,
                min_size: min,
                max_size: max,
                compute_operations: SUBGROUP_OPS_NEEDED.to_vec(),
                size_control: true,
                compute_full_subgroups: true,
                required_size_in_compute: true,
                max_compute_workgroup_subgroups: 32,
            },
            integer_dot: IntegerDot::default(),
            cooperative_matrix: CooperativeMatrix::default(),
            float16: Float16::default(),
            limits: Limits {
                max_workgroup_size: [1024, 1024, 64],
                max_workgroup_invocations: 1024,
                max_workgroup_count: [65535; 3],
                max_shared_memory_bytes: 32768,
                max_storage_buffer_range: u32::MAX,
                max_image_dimension_2d: 16384,
                max_push_constants_bytes: 128,
                timestamp_period_ns: 1.0,
            },
            extensions: Extensions::default(),
        }
    }

    fn choice(size: u32, required: bool) -> SubgroupChoice {
        SubgroupChoice { size, required }
    }

    #[test]
    fn amd_runs_wave64_where_it_can() {
        // RDNA: 32 by default, 64 on request.
        let rdna = fake(0, VENDOR_AMD, DeviceType::Discrete, 32, 32, 64);
        assert_eq!(preferred_subgroup_size(&rdna), choice(64, true));
        assert_eq!(rdna.specializations().subgroup_size_control, Use::Used);
        // GCN: 64 only.
        assert_eq!(
            preferred_subgroup_size(&fake(0, VENDOR_AMD, DeviceType::Discrete, 64, 64, 64)),
            choice(64, true)
        );
        // An AMD device that cannot go to 64 falls to 32.
        assert_eq!(
            preferred_subgroup_size(&fake(0, VENDOR_AMD, DeviceType::Integrated, 32, 32, 32)),
            choice(32, true)
        );
    }

    #[test]
    fn others_run_32_where_the_range_allows() {
        // NVIDIA's warp.
        assert_eq!(
            preferred_subgroup_size(&fake(0, VENDOR_NVIDIA, DeviceType::Discrete, 32, 32, 32)),
            choice(32, true)
        );
        // Intel: SIMD8..32.
        assert_eq!(
            preferred_subgroup_size(&fake(0, VENDOR_INTEL, DeviceType::Integrated, 16, 8, 32)),
            choice(32, true)
        );
        // A 64-wide non-AMD range still takes 32.
        assert_eq!(
            preferred_subgroup_size(&fake(0, VENDOR_ARM, DeviceType::Integrated, 16, 4, 64)),
            choice(32, true)
        );
    }

    #[test]
    fn otherwise_the_default_size_unrequired() {
        // lavapipe with AVX2: 8 lanes, nothing else.
        let lvp = fake(0, VENDOR_MESA, DeviceType::Cpu, 8, 8, 8);
        assert_eq!(preferred_subgroup_size(&lvp), choice(8, false));
        assert_eq!(
            lvp.specializations().subgroup_size_control,
            Use::NotUsed("the device has one subgroup size")
        );
        // 4..16: 32 is out of range.
        let narrow = fake(0, VENDOR_QUALCOMM, DeviceType::Integrated, 16, 4, 16);
        assert_eq!(preferred_subgroup_size(&narrow), choice(16, false));
        assert!(matches!(
            narrow.specializations().subgroup_size_control,
            Use::NotUsed(_)
        ));
        // No size control at all, or not for compute: the default, even on AMD.
        let mut amd = fake(0, VENDOR_AMD, DeviceType::Discrete, 64, 32, 64);
        amd.subgroups.required_size_in_compute = false;
        assert_eq!(preferred_subgroup_size(&amd), choice(64, false));
        amd.subgroups.size_control = false;
        assert_eq!(preferred_subgroup_size(&amd), choice(64, false));
        assert_eq!(amd.specializations().subgroup_size_control, Use::NotAvailable);
    }

    #[test]
    fn specializations_need_what_their_kernels_need() {
        let mut d = fake(0, VENDOR_NVIDIA, DeviceType::Discrete, 32, 32, 32);
        let s = d.specializations();
        assert_eq!(s.integer_dot_product, Use::NotAvailable);
        assert_eq!(s.cooperative_matrix, Use::NotAvailable);
        assert_eq!(s.shader_float16, Use::NotAvailable);
        assert_eq!(s.storage_16bit, Use::NotAvailable);
        assert_eq!(s.subgroup_operations, Use::Used);
        d.integer_dot.supported = true;
        assert!(matches!(d.specializations().integer_dot_product, Use::NotUsed(_)));
        d.integer_dot.packed_4x8_signed_accelerated = true;
        assert_eq!(d.specializations().integer_dot_product, Use::Used);
        d.float16.shader_float16 = true;
        assert!(matches!(d.specializations().shader_float16, Use::NotUsed(_)));
        d.float16.storage_buffer_16bit = true;
        d.float16.uniform_16bit = true;
        assert_eq!(d.specializations().shader_float16, Use::Used);
        assert_eq!(d.specializations().storage_16bit, Use::Used);
        d.cooperative_matrix.supported = true;
        assert!(matches!(d.specializations().cooperative_matrix, Use::NotUsed(_)));
        d.cooperative_matrix.shapes.push(MatrixShape {
            m: 16,
            n: 16,
            k: 16,
            a: "f16",
            b: "f16",
            c: "f32",
            result: "f32",
            saturating: false,
            scope: "subgroup",
        });
        // Also 8x8x8 (lavapipe's), s8 and f16 accumulators are of no use to the kernels.
        assert!(matches!(d.specializations().cooperative_matrix, Use::NotUsed(_)));
        d.cooperative_matrix.vulkan_memory_model = true;
        assert_eq!(d.specializations().cooperative_matrix, Use::Used);
        assert_eq!(d.specializations().cooperative_matrix_size, Some(16));
        let only = |shape: MatrixShape| CooperativeMatrix {
            supported: true,
            vulkan_memory_model: true,
            shapes: vec![shape],
        };
        let base = d.cooperative_matrix.shapes[0].clone();
        let lvp = MatrixShape {
            m: 8,
            n: 8,
            k: 8,
            ..base.clone()
        };
        assert_eq!(only(lvp).kernel_size(), Some(8));
        assert_eq!(
            only(MatrixShape {
                c: "f16",
                result: "f16",
                ..base.clone()
            })
            .kernel_size(),
            None
        );
        assert_eq!(
            only(MatrixShape {
                a: "s8",
                b: "s8",
                ..base.clone()
            })
            .kernel_size(),
            None
        );
        assert_eq!(
            only(MatrixShape {
                m: 16,
                n: 8,
                k: 16,
                ..base.clone()
            })
            .kernel_size(),
            None
        );
        // A subgroup size that does not divide the workgroup (none seen in practice).
        let mut odd = d.clone();
        odd.subgroups.size = 48;
        odd.subgroups.max_size = 48;
        assert!(matches!(odd.specializations().cooperative_matrix, Use::NotUsed(_)));
        assert_eq!(odd.specializations().cooperative_matrix_size, None);
        d.subgroups.compute_operations = vec!["basic"];
        assert!(matches!(d.specializations().subgroup_operations, Use::NotUsed(_)));
        d.subgroups.compute_operations.clear();
        assert_eq!(d.specializations().subgroup_operations, Use::NotAvailable);
    }

    #[test]
    fn pick_prefers_discrete_then_integrated_then_virtual_then_cpu() {
        let cpu = fake(0, VENDOR_MESA, DeviceType::Cpu, 8, 8, 8);
        let igpu = fake(1, VENDOR_INTEL, DeviceType::Integrated, 16, 8, 32);
        let dgpu = fake(2, VENDOR_AMD, DeviceType::Discrete, 64, 32, 64);
        let vgpu = fake(3, VENDOR_NVIDIA, DeviceType::Virtual, 32, 32, 32);
        let all = [cpu.clone(), igpu.clone(), dgpu.clone(), vgpu.clone()];
        assert_eq!(pick(&all, None), Ok(2));
        assert_eq!(pick(&[cpu.clone(), igpu.clone(), vgpu.clone()], None), Ok(1));
        assert_eq!(pick(&[cpu.clone(), vgpu.clone()], None), Ok(3));
        assert_eq!(pick(std::slice::from_ref(&cpu), None), Ok(0));
        // By index, whatever its type.
        assert_eq!(pick(&all, Some(0)), Ok(0));
        assert!(pick(&all, Some(9)).unwrap_err().contains("no Vulkan device 9"));
        assert_eq!(pick(&[], None), Err("no Vulkan devices".to_string()));
    }

    #[test]
    fn pick_skips_devices_the_backend_cannot_run_on() {
        let mut old = fake(0, VENDOR_AMD, DeviceType::Discrete, 64, 64, 64);
        old.api_version.minor = 0;
        let mut no_compute = fake(1, VENDOR_NVIDIA, DeviceType::Discrete, 32, 32, 32);
        no_compute.compute_queue_family = None;
        let cpu = fake(2, VENDOR_MESA, DeviceType::Cpu, 8, 8, 8);
        assert_eq!(pick(&[old.clone(), no_compute.clone(), cpu], None), Ok(2));
        let err = pick(&[old.clone(), no_compute.clone()], None).unwrap_err();
        assert!(err.contains("none of the 2"), "{err}");
        let err = pick(&[old], Some(0)).unwrap_err();
        assert!(err.contains("1.1 is needed"), "{err}");
    }
}
