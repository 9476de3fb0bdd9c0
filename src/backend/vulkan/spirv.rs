//! The kernel variants as SPIR-V: the same WGSL the WebGPU backend runs ([`super::super::gpu::kernels`]),
//! compiled by naga at build time (`build/spirv.rs`) and embedded here, with what a pipeline
//! needs to know about each module (its entry points with their workgroup sizes, its resource
//! bindings) so the device layer never parses a shader at run time.

/// A resource a kernel binds, as its WGSL declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindingKind {
    /// `var<storage, read>`
    StorageRead,
    /// `var<storage, read_write>`
    Storage,
    /// `var<uniform>`
    Uniform,
    /// A sampled texture read with `textureLoad` (texture-held weights).
    SampledImage,
    /// A storage texture.
    StorageImage,
    Sampler,
}

/// `@group(group) @binding(binding)`, which the SPIR-V keeps as its descriptor set and binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Binding {
    pub group: u32,
    pub binding: u32,
    pub kind: BindingKind,
}

/// A compute entry point of a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    pub name: &'static str,
    pub workgroup_size: [u32; 3],
    /// The module's bindings this entry point uses, sorted (what its pipeline layout holds).
    pub bindings: &'static [Binding],
}

/// One kernel variant compiled to SPIR-V.
#[derive(Debug, Clone, Copy)]
pub struct SpirvKernel {
    /// The variant's name, as in [`crate::backend::gpu::kernels::VARIANTS`].
    pub name: &'static str,
    /// The module, little-endian 32-bit words (`include_bytes!`, so byte-aligned: see
    /// [`SpirvKernel::words`]).
    pub spirv: &'static [u8],
    pub entries: &'static [EntryPoint],
    /// Every binding of the module, sorted by (group, binding).
    pub bindings: &'static [Binding],
}

include!(concat!(env!("OUT_DIR"), "/spirv_variants.rs"));

/// The SPIR-V of the variant `name` (a [`crate::backend::gpu::kernels::Kernel::variant`]).
pub fn kernel(name: &str) -> Option<&'static SpirvKernel> {
    SPIRV.binary_search_by(|k| k.name.cmp(name)).ok().map(|i| &SPIRV[i])
}

/// The first word of every SPIR-V module.
pub const MAGIC: u32 = 0x0723_0203;

impl SpirvKernel {
    /// The module as 32-bit words, as `vkCreateShaderModule` takes it; `None` when the bytes
    /// are not a SPIR-V module (a length that is not whole words, a wrong magic number).
    pub fn words(&self) -> Option<Vec<u32>> {
        if !self.spirv.len().is_multiple_of(4) || self.spirv.len() < 20 {
            return None;
        }
        let words: Vec<u32> = self
            .spirv
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (words[0] == MAGIC).then_some(words)
    }

    /// The entry point named `name`.
    pub fn entry(&self, name: &str) -> Option<&'static EntryPoint> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Whether the module uses subgroup operations or ids (then a pipeline may require a
    /// subgroup size). Read from the variant's name, which the composer gives every subgroup
    /// variant; the cooperative-matrix kernels share work out by subgroup.
    pub fn uses_subgroups(&self) -> bool {
        self.name.contains("_subgroup") || self.uses_cooperative_matrix()
    }

    /// Whether the module multiplies cooperative matrices (needs `cooperativeMatrix`, the
    /// Vulkan memory model, f16, and whole subgroups).
    pub fn uses_cooperative_matrix(&self) -> bool {
        self.name.starts_with("matmul_coop")
    }

    /// Whether the module does arithmetic in f16 (needs shaderFloat16 and 16-bit storage).
    pub fn uses_f16(&self) -> bool {
        self.name.contains("_f16") || self.uses_cooperative_matrix()
    }

    /// Whether the module uses packed integer dot products (`OpSDot`: needs
    /// `shaderIntegerDotProduct`).
    pub fn uses_integer_dot(&self) -> bool {
        self.name.starts_with("matmul_dot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_every_module_has_words_and_an_entry() {
        assert!(SPIRV.windows(2).all(|w| w[0].name < w[1].name));
        for k in SPIRV {
            let words = k.words().unwrap_or_else(|| panic!("{}: not SPIR-V", k.name));
            // Header: magic, version 1.3, generator, bound, schema 0.
            assert_eq!(words[1], 0x0001_0300, "{}", k.name);
            assert!(words[3] > 0 && words[4] == 0, "{}", k.name);
            assert!(!k.entries.is_empty(), "{}", k.name);
            assert!(!k.bindings.is_empty(), "{}", k.name);
        }
        assert!(kernel("add").is_some());
        assert!(kernel("no_such_kernel").is_none());
    }
}
